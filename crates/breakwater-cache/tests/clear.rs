//! `clear` of a namespace: hard (every entry from before is a miss in
//! every process once it returned, L1 copies and loads in the air
//! included) and soft (every entry turns stale at a moment of its own in
//! the window, in the order it would have expired, and is refreshed once).
//! Two `Cache`s over one store are two processes; on the memory store with
//! paused time and on a private Redis.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use breakwater_cache::{Cache, ClearMode, ErrorKind, Jitter, L1Config, MemoryStore, Served, Store};
use breakwater_cache_testkit::RedisServer;
use tokio::sync::Notify;
use tokio::time::{advance, sleep};

const TTL: Duration = Duration::from_secs(100);

/// The database: each key's value is its version, bumped on writes; how
/// many loads ran.
#[derive(Default)]
struct Db {
    version: AtomicU64,
    loads: AtomicUsize,
}

type Load = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Option<u64>, std::io::Error>> + Send>,
>;

impl Db {
    fn loader(self: &Arc<Self>) -> impl FnOnce() -> Load + Clone + Send + Sync + 'static {
        let db = Arc::clone(self);
        move || {
            Box::pin(async move {
                db.loads.fetch_add(1, Ordering::SeqCst);
                Ok(Some(db.version.load(Ordering::SeqCst)))
            })
        }
    }
}

fn cache(store: impl Store, l1: bool) -> Cache<u64> {
    let builder = Cache::builder()
        .namespace("clear")
        .store(store)
        .ttl(TTL)
        .jitter(Jitter::none())
        .grace(Duration::from_secs(10))
        .max_stale(Duration::from_secs(600));
    let builder = if l1 {
        builder.l1(L1Config::new())
    } else {
        builder
    };
    builder.build().expect("valid settings")
}

#[tokio::test(start_paused = true)]
async fn a_hard_clear_leaves_no_value_from_before_in_any_process() {
    for l1 in [false, true] {
        let store = MemoryStore::new();
        let (a, b) = (cache(store.clone(), l1), cache(store.clone(), l1));
        let db = Arc::new(Db::default());
        for key in 0..20u64 {
            a.get_or_load(key, db.loader()).await.unwrap();
            // B holds them too (in its L1 when it has one).
            b.get_or_load(key, db.loader()).await.unwrap();
        }
        assert_eq!(db.loads.load(Ordering::SeqCst), 20);
        db.version.store(1, Ordering::SeqCst);
        a.clear(ClearMode::Hard).await.unwrap();
        for key in 0..20u64 {
            for cache in [&a, &b] {
                assert_eq!(cache.get(key).await.unwrap(), None, "l1: {l1}");
            }
        }
        for key in 0..20u64 {
            for cache in [&a, &b] {
                let got = cache.get_or_load_with_meta(key, db.loader()).await.unwrap();
                assert_eq!(got.value, Some(1), "l1: {l1} key {key}");
            }
        }
        // One load per key after the clear, fleet-wide.
        assert_eq!(db.loads.load(Ordering::SeqCst), 40, "l1: {l1}");
        // What was written after it stands.
        assert_eq!(b.get(3u64).await.unwrap(), Some(1));
    }
}

#[tokio::test(start_paused = true)]
async fn a_load_in_the_air_across_a_hard_clear_is_not_served_after_it() {
    let store = MemoryStore::new();
    let (a, b) = (cache(store.clone(), true), cache(store.clone(), true));
    let db = Arc::new(Db::default());
    let (started, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let slow = {
        let (started, release) = (Arc::clone(&started), Arc::clone(&release));
        move || async move {
            started.notify_one();
            release.notified().await;
            Ok::<_, std::io::Error>(Some(0u64))
        }
    };
    let load = tokio::spawn({
        let b = b.clone();
        async move { b.get_or_load("k", slow).await }
    });
    started.notified().await;
    db.version.store(1, Ordering::SeqCst);
    a.clear(ClearMode::Hard).await.unwrap();
    release.notify_one();
    // Its caller, which started before, gets it.
    assert_eq!(load.await.unwrap().unwrap(), Some(0));
    // Nobody after the clear does: not from the store, not from L1.
    for cache in [&a, &b] {
        assert_eq!(cache.get("k").await.unwrap(), None);
    }
    for cache in [&a, &b] {
        let got = cache.get_or_load("k", db.loader()).await.unwrap();
        assert_eq!(got, Some(1));
    }
}

#[tokio::test(start_paused = true)]
async fn a_soft_clear_turns_each_entry_stale_at_its_moment_in_the_window() {
    let store = MemoryStore::new();
    let (a, b) = (cache(store.clone(), true), cache(store.clone(), false));
    let db = Arc::new(Db::default());
    // Ten keys written 10 s apart: key k has (5 + 10 k) s of its 100 s
    // left when the clear comes.
    let start = tokio::time::Instant::now();
    for key in 0..10u64 {
        let at = start + Duration::from_secs(5 + 10 * key);
        advance(at.saturating_duration_since(tokio::time::Instant::now())).await;
        a.get_or_load(key, db.loader()).await.unwrap();
    }
    let at = start + TTL;
    advance(at.saturating_duration_since(tokio::time::Instant::now())).await;
    db.version.store(1, Ordering::SeqCst);
    let window = Duration::from_secs(50);
    // The clear is made at once; it returns once every process took it.
    let cleared = tokio::time::Instant::now();
    b.clear(ClearMode::Soft { window }).await.unwrap();
    // Key k turns stale at window × left / ttl = (2.5 + 5 k) s; until then
    // it is a hit everywhere, then served stale while one load refreshes it.
    let until = |at: Duration| async move {
        let now = tokio::time::Instant::now();
        advance((cleared + at).saturating_duration_since(now)).await;
    };
    for k in 0..10u64 {
        let moment = Duration::from_millis(2_500 + 5_000 * k);
        until(moment - Duration::from_millis(100)).await;
        for cache in [&a, &b] {
            let got = cache.get_or_load_with_meta(k, db.loader()).await.unwrap();
            assert_eq!(got.value, Some(0), "key {k} before its moment");
            assert!(
                !matches!(got.served, Served::Stale { .. }),
                "key {k}: {got:?}"
            );
        }
        until(moment + Duration::from_millis(100)).await;
        let loads = db.loads.load(Ordering::SeqCst);
        let got = b.get_or_load_with_meta(k, db.loader()).await.unwrap();
        assert_eq!(got.value, Some(0), "key {k}");
        assert!(
            matches!(got.served, Served::Stale { .. }),
            "key {k}: {got:?}"
        );
        support::until("the refresh", || {
            db.loads.load(Ordering::SeqCst) == loads + 1
        })
        .await;
        sleep(Duration::from_millis(10)).await;
        assert_eq!(a.get(k).await.unwrap(), Some(1), "key {k} refreshed");
        // Each key refreshed once.
        assert_eq!(db.loads.load(Ordering::SeqCst), loads + 1, "key {k}");
    }
    assert_eq!(db.loads.load(Ordering::SeqCst), 20);
}

#[tokio::test]
async fn a_hard_clear_on_redis_is_taken_by_every_process_before_it_returns() {
    let server = RedisServer::start();
    let (a, b) = (
        cache(support::connect(&server).await, true),
        cache(support::connect(&server).await, true),
    );
    let db = Arc::new(Db::default());
    for key in 0..50u64 {
        a.get_or_load(key, db.loader()).await.unwrap();
        b.get_or_load(key, db.loader()).await.unwrap();
    }
    // Both listen (their L1s serve).
    for cache in [&a, &b] {
        assert_eq!(
            cache
                .get_or_load_with_meta(7u64, db.loader())
                .await
                .unwrap()
                .served,
            Served::L1Hit
        );
    }
    db.version.store(1, Ordering::SeqCst);
    a.clear(ClearMode::Hard).await.unwrap();
    // At once, in both: no value from before.
    for key in 0..50u64 {
        assert_eq!(b.get(key).await.unwrap(), None, "key {key}");
        assert_eq!(a.get(key).await.unwrap(), None, "key {key}");
    }
    let record = server.command(&["GET", "bw:clear:c"]).expect("GET");
    assert_eq!(record.split(':').count(), 7, "{record}");
    // Loaded again once each, and served from then on.
    for key in 0..50u64 {
        assert_eq!(b.get_or_load(key, db.loader()).await.unwrap(), Some(1));
        assert_eq!(a.get_or_load(key, db.loader()).await.unwrap(), Some(1));
    }
    assert_eq!(db.loads.load(Ordering::SeqCst), 100);
    // A third process, started after the clear, reads the record.
    let c = cache(support::connect(&server).await, true);
    assert_eq!(c.get(3u64).await.unwrap(), Some(1));
}

/// A clear record lost from the store while no process knows it (every
/// process that did is gone) is adopted, not a miss: a process that reads
/// an entry recorded under it serves it (stale at its own expiry at the
/// latest, as after a soft clear over one TTL) and, after a pause of 1 to
/// 1.5 s, makes an adopting pin that every process takes.
#[tokio::test(start_paused = true)]
async fn a_lost_clear_record_no_process_knows_is_adopted_not_a_miss() {
    let store = MemoryStore::new();
    let db = Arc::new(Db::default());
    {
        let a = cache(store.clone(), false);
        a.clear(ClearMode::Hard).await.unwrap();
        a.get_or_load("k", db.loader()).await.unwrap();
        assert_eq!(a.get("k").await.unwrap(), Some(0));
    }
    assert!(store.delete(b"bw:clear:c").await.unwrap());
    db.version.store(1, Ordering::SeqCst);
    let fresh = cache(store.clone(), false);
    assert_eq!(fresh.get("k").await.unwrap(), Some(0));
    // After one keep-warm period (a process that knew it would have put
    // it back by then) and up to 500 ms more.
    sleep(Duration::from_secs(2)).await;
    let made = store.get(b"bw:clear:c").await.unwrap().expect("a pin");
    // Another process, and writes under the pin: the old entry still
    // served, the new one too, no load.
    let other = cache(store.clone(), false);
    assert_eq!(other.get("k").await.unwrap(), Some(0));
    assert_eq!(other.get_or_load("n", db.loader()).await.unwrap(), Some(1));
    assert_eq!(fresh.get("n").await.unwrap(), Some(1));
    assert_eq!(db.loads.load(Ordering::SeqCst), 2);
    assert_eq!(store.get(b"bw:clear:c").await.unwrap(), Some(made));
}

#[tokio::test]
async fn a_window_over_a_year_is_a_config_error() {
    let a = cache(MemoryStore::new(), false);
    let err = a
        .clear(ClearMode::Soft {
            window: Duration::from_secs(400 * 86_400),
        })
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
}

/// A later soft clear never makes an entry fresher than an earlier one
/// left it: one with no window makes every entry stale, and one over a
/// minute after it (its window over, or still open) leaves them stale.
#[tokio::test(start_paused = true)]
async fn a_later_soft_clear_does_not_make_entries_fresh_again() {
    let store = MemoryStore::new();
    let a = cache(store.clone(), false);
    let db = Arc::new(Db::default());
    let written = |key: u64| {
        let a = a.clone();
        let db = Arc::clone(&db);
        async move {
            let got = a.get_or_load_with_meta(key, db.loader()).await.unwrap();
            !matches!(got.served, Served::Stale { .. })
        }
    };
    for key in 0..2u64 {
        assert!(written(key).await);
    }
    advance(Duration::from_secs(1)).await;
    let soft = |window: u64| ClearMode::Soft {
        window: Duration::from_secs(window),
    };
    // Every entry stale at once; then one spread over 60 s: key 0 stays
    // stale (served stale, while it refreshes).
    a.clear(soft(0)).await.unwrap();
    advance(Duration::from_secs(1)).await;
    a.clear(soft(60)).await.unwrap();
    assert!(
        !written(0).await,
        "key 0 fresh again after the second clear"
    );
    // A first clear over 60 s, another over 100 s 10 s later: the first
    // window's end stands, by 60 s everything from before is stale.
    let b = cache(store.clone(), false);
    b.clear(ClearMode::Hard).await.unwrap();
    for key in 10..40u64 {
        b.get_or_load(key, db.loader()).await.unwrap();
    }
    b.clear(soft(60)).await.unwrap();
    advance(Duration::from_secs(10)).await;
    b.clear(soft(100)).await.unwrap();
    advance(Duration::from_secs(51)).await;
    for key in 10..40u64 {
        let got = b.get_or_load_with_meta(key, db.loader()).await.unwrap();
        assert!(
            matches!(got.served, Served::Stale { .. } | Served::Loaded),
            "key {key}: {got:?}"
        );
    }
}

/// A clear record lost from the store (evicted under `maxmemory`,
/// deleted) is put back as it was by a process that knows it, within a
/// second (its listener reads it every second, which also keeps it warm):
/// nothing is a miss for it, nothing comes back from before a hard clear,
/// and L1 keeps its copies.
#[tokio::test(start_paused = true)]
async fn a_lost_clear_record_is_put_back_by_a_process_that_knew_it() {
    let store = MemoryStore::new();
    let a = cache(store.clone(), true);
    let db = Arc::new(Db::default());
    for key in 0..5u64 {
        a.get_or_load(key, db.loader()).await.unwrap();
    }
    db.version.store(1, Ordering::SeqCst);
    a.clear(ClearMode::Hard).await.unwrap();
    for key in 10..15u64 {
        assert_eq!(a.get_or_load(key, db.loader()).await.unwrap(), Some(1));
    }
    let record = store.get(b"bw:clear:c").await.unwrap().expect("a record");
    assert!(store.delete(b"bw:clear:c").await.unwrap());
    db.version.store(2, Ordering::SeqCst);
    sleep(Duration::from_millis(1_100)).await;
    assert_eq!(
        store.get(b"bw:clear:c").await.unwrap().as_deref(),
        Some(&record[..])
    );
    let loads = db.loads.load(Ordering::SeqCst);
    // A process started since: what was written since the clear is served
    // from the store; nothing from before it.
    let c = cache(store.clone(), false);
    for key in 10..15u64 {
        assert_eq!(c.get_or_load(key, db.loader()).await.unwrap(), Some(1));
        assert_eq!(a.get_or_load(key, db.loader()).await.unwrap(), Some(1));
    }
    assert_eq!(db.loads.load(Ordering::SeqCst), loads);
    for key in [0u64, 3] {
        assert_eq!(
            c.get_or_load(key, db.loader()).await.unwrap(),
            Some(2),
            "key {key}"
        );
    }
}

/// An entry written before any clear records the namespace's generation
/// too (its write made the record): a record lost after a soft clear does
/// not let a later clear, made over no record, judge that entry by a
/// window of its own (it would be fresh past the first clear's end).
#[tokio::test(start_paused = true)]
async fn a_lost_record_does_not_move_an_earlier_soft_clears_end() {
    let store = MemoryStore::new();
    let a = cache(store.clone(), false);
    let db = Arc::new(Db::default());
    a.set(7u64, &0).await.unwrap();
    db.version.store(1, Ordering::SeqCst);
    a.clear(ClearMode::Soft {
        window: Duration::from_millis(100),
    })
    .await
    .unwrap();
    assert!(store.delete(b"bw:clear:c").await.unwrap());
    a.clear(ClearMode::Soft {
        window: Duration::from_secs(600),
    })
    .await
    .unwrap();
    sleep(Duration::from_millis(300)).await;
    let got = a.get_or_load_with_meta(7u64, db.loader()).await.unwrap();
    assert_ne!(got.served, Served::Hit, "{got:?}");
}

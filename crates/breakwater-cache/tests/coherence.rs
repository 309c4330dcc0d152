//! The coherence contract, case by case, on the memory store with paused
//! time (the seeded simulation in `simulation.rs` checks the same contract
//! under random fault schedules): an invalidation or a `set` is never
//! answered by anything that began before it, every load writes through the
//! lease fence, and early refresh runs on L1 hits.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use breakwater_cache::testing::CountingStore;
use breakwater_cache::{Cache, EarlyRefresh, Jitter, L1Config, MemoryStore, Served, Store};
use serde::{Deserialize, Serialize};
use tokio::time::{advance, sleep};

/// The database: one row whose version every write bumps.
#[derive(Debug, Default)]
struct Db {
    version: AtomicU64,
    loads: AtomicUsize,
}

impl Db {
    fn update(&self) -> u64 {
        self.version.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// A loader that reads the version when it starts and answers `delay`
    /// later.
    fn loader(
        self: &Arc<Self>,
        delay: Duration,
    ) -> impl Fn() -> support::VersionFuture + Clone + Send + Sync + 'static {
        let db = Arc::clone(self);
        move || {
            let db = Arc::clone(&db);
            Box::pin(async move {
                db.loads.fetch_add(1, Ordering::SeqCst);
                let version = db.version.load(Ordering::SeqCst);
                sleep(delay).await;
                Ok(Some(version))
            })
        }
    }
}

fn build(store: &CountingStore<MemoryStore>, l1: bool, grace: Duration) -> Cache<u64> {
    let builder = Cache::builder()
        .namespace("coherence")
        .store(store.clone())
        .ttl(Duration::from_secs(10))
        .grace(grace)
        .jitter(Jitter::none())
        .early_refresh(EarlyRefresh::none());
    let builder = if l1 {
        builder.l1(L1Config::new())
    } else {
        builder
    };
    builder.build().unwrap()
}

/// A caller starts a 500 ms load (of version 1); the row is updated and the
/// key invalidated 100 ms in; a caller that starts after `invalidate`
/// returned must get version 2, and so must every later one.
async fn invalidate_during_a_slow_load(l1: bool, grace: bool) {
    let store = CountingStore::new(MemoryStore::new());
    let grace = if grace {
        Duration::from_secs(60)
    } else {
        Duration::ZERO
    };
    let cache = build(&store, l1, grace);
    let db = Arc::new(Db::default());
    db.update();
    let slow = Duration::from_millis(500);
    let first = if grace.is_zero() {
        // A miss: the first caller waits for the load.
        let (cache, loader) = (cache.clone(), db.loader(slow));
        tokio::spawn(async move { cache.get_or_load_with_meta("k", loader).await })
    } else {
        // A stale value inside grace: the caller gets it at once, and the
        // refresh runs in the background.
        cache.set("k", &0).await.unwrap();
        advance(Duration::from_secs(11)).await;
        let (cache, loader) = (cache.clone(), db.loader(slow));
        tokio::spawn(async move { cache.get_or_load_with_meta("k", loader).await })
    };
    sleep(Duration::from_millis(100)).await;
    assert_eq!(
        db.loads.load(Ordering::SeqCst),
        1,
        "the slow load is running"
    );
    let v2 = db.update();
    cache.invalidate("k").await.unwrap();
    let after = cache
        .get_or_load_with_meta("k", db.loader(Duration::from_millis(10)))
        .await
        .unwrap();
    assert_eq!(after.value, Some(v2), "a call after invalidate: {after:?}");
    let first = first.await.unwrap().unwrap();
    assert!(
        first.value < Some(v2),
        "the first caller started before: {first:?}"
    );
    // The old load finished after the invalidation: it is in neither the
    // store nor L1.
    sleep(Duration::from_secs(1)).await;
    for _ in 0..3 {
        let later = cache
            .get_or_load_with_meta("k", db.loader(Duration::ZERO))
            .await
            .unwrap();
        assert_eq!(later.value, Some(v2), "{later:?}");
        assert!(
            matches!(later.served, Served::Hit | Served::L1Hit),
            "{later:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn invalidate_during_a_slow_load_without_l1() {
    invalidate_during_a_slow_load(false, false).await;
}

#[tokio::test(start_paused = true)]
async fn invalidate_during_a_slow_load_with_l1() {
    invalidate_during_a_slow_load(true, false).await;
}

#[tokio::test(start_paused = true)]
async fn invalidate_during_a_grace_refresh_without_l1() {
    invalidate_during_a_slow_load(false, true).await;
}

#[tokio::test(start_paused = true)]
async fn invalidate_during_a_grace_refresh_with_l1() {
    invalidate_during_a_slow_load(true, true).await;
}

/// `set` during a slow load: the new value wins everywhere, and the old
/// load's result is neither written nor kept in L1.
#[tokio::test(start_paused = true)]
async fn set_during_a_slow_load_is_not_overwritten() {
    let store = CountingStore::new(MemoryStore::new());
    let cache = build(&store, true, Duration::ZERO);
    let db = Arc::new(Db::default());
    db.update();
    let first = {
        let (cache, loader) = (cache.clone(), db.loader(Duration::from_millis(500)));
        tokio::spawn(async move { cache.get_or_load("k", loader).await })
    };
    sleep(Duration::from_millis(100)).await;
    let v2 = db.update();
    cache.set("k", &v2).await.unwrap();
    let after = cache
        .get_or_load_with_meta("k", db.loader(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!((after.value, after.served), (Some(v2), Served::Hit));
    assert_eq!(first.await.unwrap().unwrap(), Some(1));
    let other = build(&store, false, Duration::ZERO);
    assert_eq!(
        other.get("k").await.unwrap(),
        Some(v2),
        "the store keeps the set value"
    );
    assert_eq!(cache.get("k").await.unwrap(), Some(v2), "and so does L1");
}

/// A store read whose reply lands after an invalidation (the read itself
/// happened before) neither answers a later caller nor enters L1.
#[tokio::test(start_paused = true)]
async fn a_late_read_reply_does_not_outlive_an_invalidation() {
    let store = CountingStore::new(MemoryStore::new());
    let cache = build(&store, true, Duration::ZERO);
    let writer = build(
        &CountingStore::new(store.clone().into_inner()),
        false,
        Duration::ZERO,
    );
    let db = Arc::new(Db::default());
    db.update();
    writer.set("k", &1).await.unwrap();
    store.reply_late(Duration::from_millis(200));
    let first = {
        let (cache, loader) = (cache.clone(), db.loader(Duration::ZERO));
        tokio::spawn(async move { cache.get_or_load("k", loader).await })
    };
    sleep(Duration::from_millis(50)).await;
    let v2 = db.update();
    cache.invalidate("k").await.unwrap();
    store.reply_late(Duration::ZERO);
    let after = cache
        .get_or_load("k", db.loader(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(after, Some(v2));
    assert_eq!(
        first.await.unwrap().unwrap(),
        Some(1),
        "read before the invalidation"
    );
    sleep(Duration::from_millis(300)).await;
    let later = cache
        .get_or_load_with_meta("k", db.loader(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(later.value, Some(v2), "L1 kept the late reply: {later:?}");
}

/// A lease attempt that ran but whose reply was lost: the direct load is
/// served, not written (no fence can tell whether the attempt ran before or
/// after an invalidation), and the lease the lost reply left behind is
/// released at once rather than blocking the key for its TTL...
#[tokio::test(start_paused = true)]
async fn a_direct_load_after_a_lost_lease_reply_is_served_and_frees_the_lease() {
    let store = CountingStore::new(MemoryStore::new());
    let cache = build(&store, false, Duration::ZERO);
    let db = Arc::new(Db::default());
    db.update();
    store.lose_lease_replies(true);
    let v = cache
        .get_or_load("k", db.loader(Duration::from_millis(100)))
        .await;
    assert_eq!(v.unwrap(), Some(1));
    store.lose_lease_replies(false);
    sleep(Duration::from_millis(10)).await; // the release runs in the background
    assert!(
        !store.lease_held(b"bw:coherence:l:{k}").await.unwrap(),
        "the lease the lost reply left behind was released"
    );
    let started = tokio::time::Instant::now();
    let next = cache
        .get_or_load_with_meta("k", db.loader(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(
        (next.value, next.served),
        (Some(1), Served::Loaded),
        "not written"
    );
    assert!(
        started.elapsed() < Duration::from_millis(10),
        "{:?}",
        started.elapsed()
    );
}

/// ...and an invalidation during that load leaves the key empty: the old
/// value is not resurrected.
#[tokio::test(start_paused = true)]
async fn a_direct_load_is_revoked_by_an_invalidation() {
    let store = CountingStore::new(MemoryStore::new());
    let cache = build(&store, false, Duration::ZERO);
    let db = Arc::new(Db::default());
    db.update();
    store.lose_lease_replies(true);
    let first = {
        let (cache, loader) = (cache.clone(), db.loader(Duration::from_millis(500)));
        tokio::spawn(async move { cache.get_or_load("k", loader).await })
    };
    sleep(Duration::from_millis(100)).await;
    store.lose_lease_replies(false);
    let v2 = db.update();
    cache.invalidate("k").await.unwrap();
    assert_eq!(first.await.unwrap().unwrap(), Some(1));
    sleep(Duration::from_millis(10)).await;
    let other = build(&store, false, Duration::ZERO);
    assert_eq!(
        other.get("k").await.unwrap(),
        None,
        "the old value was resurrected"
    );
    let after = cache
        .get_or_load("k", db.loader(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(after, Some(v2));
}

/// A value the codec cannot encode releases the lease at once: the next
/// caller (another process) loads without waiting for the lease to expire.
#[tokio::test(start_paused = true)]
async fn a_codec_failure_releases_the_lease() {
    #[derive(Debug, Clone, Deserialize)]
    struct Picky(bool);
    impl Serialize for Picky {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            if self.0 {
                s.serialize_bool(true)
            } else {
                Err(serde::ser::Error::custom("refuses to be encoded"))
            }
        }
    }
    let store = MemoryStore::new();
    let build = || {
        Cache::<Picky>::builder()
            .namespace("picky")
            .store(store.clone())
            .build()
            .unwrap()
    };
    let (a, b) = (build(), build());
    let err = a
        .get_or_load("k", || async {
            Ok::<_, std::io::Error>(Some(Picky(false)))
        })
        .await
        .unwrap_err();
    assert!(err.is_codec(), "{err}");
    assert!(
        !store.lease_held(b"bw:picky:l:{k}").await.unwrap(),
        "lease leaked"
    );
    let started = tokio::time::Instant::now();
    let v = b
        .get_or_load("k", || async { Ok::<_, std::io::Error>(Some(Picky(true))) })
        .await
        .unwrap();
    assert!(v.is_some_and(|p| p.0));
    assert!(
        started.elapsed() < Duration::from_millis(10),
        "{:?}",
        started.elapsed()
    );
}

/// With L1 on and no grace, a hot key is refreshed early (XFetch judged on
/// L1 hits), so after the first load no caller waits for a load.
#[tokio::test(start_paused = true)]
async fn early_refresh_runs_on_l1_hits() {
    let store = MemoryStore::new();
    let cache = Cache::<u64>::builder()
        .namespace("hot")
        .store(store.clone())
        .ttl(Duration::from_secs(2))
        .jitter(Jitter::none())
        .l1(L1Config::new())
        .rng_seed(11)
        .build()
        .unwrap();
    let db = Arc::new(Db::default());
    let loader = || db.loader(Duration::from_millis(100));
    let first = cache.get_or_load_with_meta("hot", loader()).await.unwrap();
    assert_eq!(first.served, Served::Loaded);
    let mut waited = 0;
    for _ in 0..1_000 {
        sleep(Duration::from_millis(10)).await;
        let f = cache.get_or_load_with_meta("hot", loader()).await.unwrap();
        waited += usize::from(matches!(f.served, Served::Loaded | Served::Coalesced));
    }
    assert_eq!(waited, 0, "callers waited for a load");
    let loads = db.loads.load(Ordering::SeqCst);
    assert!(
        loads >= 5,
        "the key was refreshed every TTL: {loads} loads in 10 s"
    );
}

/// A transient failure of the store does not lose an invalidation: it is
/// tried again, within its deadline...
#[tokio::test(start_paused = true)]
async fn an_invalidation_is_retried_through_a_transient_failure() {
    let store = CountingStore::new(MemoryStore::new());
    let cache = build(&store, false, Duration::ZERO);
    cache.set("k", &1).await.unwrap();
    store.fail_invalidations(2);
    cache.invalidate("k").await.unwrap();
    assert_eq!(cache.get("k").await.unwrap(), None);
}

/// ...and one that cannot get through says so.
#[tokio::test(start_paused = true)]
async fn an_undelivered_invalidation_says_so_within_its_deadline() {
    let store = CountingStore::new(MemoryStore::new());
    let cache = build(&store, false, Duration::ZERO);
    cache.set("k", &1).await.unwrap();
    store.fail_invalidations(100);
    let started = tokio::time::Instant::now();
    let err = cache.invalidate("k").await.unwrap_err();
    assert!(
        started.elapsed() <= Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert!(err.is_store(), "{err}");
    assert!(
        err.to_string()
            .contains("the invalidation of bw:coherence:v:{k} was not delivered ("),
        "{err}"
    );
}

/// Another process (here a second `Cache` on the same store, L1 off, so
/// nothing reaches the loading one on the bus) invalidates `k` while this
/// one loads it; a call here that starts after `invalidate` returned joins
/// the load still in the air. The load's fenced write is refused: its value
/// goes only to the caller that started before, and the later one reads and
/// loads again.
#[tokio::test(start_paused = true)]
async fn a_load_revoked_by_another_process_answers_no_later_caller() {
    let store = CountingStore::new(MemoryStore::new());
    let here = build(&store, false, Duration::ZERO);
    let there = build(&store, false, Duration::ZERO);
    let db = Arc::new(Db::default());
    db.update();
    let first = {
        let (cache, loader) = (here.clone(), db.loader(Duration::from_millis(500)));
        tokio::spawn(async move { cache.get_or_load_with_meta("k", loader).await })
    };
    sleep(Duration::from_millis(100)).await;
    let v2 = db.update();
    there.invalidate("k").await.unwrap();
    // Starts after the invalidation returned, and finds the old load.
    let later = {
        let (cache, loader) = (here.clone(), db.loader(Duration::from_millis(10)));
        tokio::spawn(async move { cache.get_or_load_with_meta("k", loader).await })
    };
    let first = first.await.unwrap().unwrap();
    let later = later.await.unwrap().unwrap();
    assert_eq!(
        first.value,
        Some(1),
        "the first caller started before: {first:?}"
    );
    assert_eq!(later.value, Some(v2), "a call after invalidate: {later:?}");
    assert_eq!(later.served, Served::Loaded, "{later:?}");
    assert_eq!(db.loads.load(Ordering::SeqCst), 2);
    assert_eq!(there.get("k").await.unwrap(), Some(v2), "the store has v2");
}

/// The same for `get_many`: a key whose batch load was revoked by another
/// process is loaded again for a call that started after the revocation.
#[tokio::test(start_paused = true)]
async fn a_batch_load_revoked_by_another_process_answers_no_later_caller() {
    let store = CountingStore::new(MemoryStore::new());
    let here = build(&store, false, Duration::ZERO);
    let there = build(&store, false, Duration::ZERO);
    let db = Arc::new(Db::default());
    db.update();
    let batch = {
        let db = Arc::clone(&db);
        move |keys: Vec<String>| {
            let db = Arc::clone(&db);
            async move {
                db.loads.fetch_add(1, Ordering::SeqCst);
                let version = db.version.load(Ordering::SeqCst);
                sleep(Duration::from_millis(500)).await;
                Ok::<_, std::io::Error>(
                    keys.into_iter()
                        .map(move |k| (k, version))
                        .collect::<Vec<_>>(),
                )
            }
        }
    };
    let keys = || vec!["a".to_string(), "b".to_string()];
    let first = {
        let (cache, batch) = (here.clone(), batch.clone());
        tokio::spawn(async move { cache.get_many_with_meta(keys(), batch).await })
    };
    sleep(Duration::from_millis(100)).await;
    let v2 = db.update();
    there.invalidate("a").await.unwrap();
    let later = {
        let (cache, batch) = (here.clone(), batch.clone());
        tokio::spawn(async move { cache.get_many_with_meta(keys(), batch).await })
    };
    let first = first.await.unwrap();
    let later = later.await.unwrap();
    assert_eq!(first[0].as_ref().unwrap().value, Some(1), "{first:?}");
    let a = later[0].as_ref().unwrap();
    assert_eq!(
        a.value,
        Some(v2),
        "a, invalidated before the call: {later:?}"
    );
    // b was not invalidated: the old load's value stands for it.
    let b = later[1].as_ref().unwrap();
    assert_eq!(
        (b.value, b.served),
        (Some(1), Served::Coalesced),
        "{later:?}"
    );
}

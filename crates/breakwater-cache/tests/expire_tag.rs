//! `expire_tag` (a soft tag invalidation): every entry carrying the tag
//! goes stale everywhere at once and is served as `Stale` within grace
//! (from the call) while one load refreshes it, stays a fail-safe stand-in
//! within `max_stale`, and no load that began before the call becomes
//! fresh after it; `invalidate_tag` afterwards, or a lost counter, makes
//! it a miss. Two `Cache`s over one store are two processes; on the memory
//! store with paused time and on a private Redis.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use breakwater_cache::{Cache, Jitter, L1Config, MemoryStore, Served, Store};
use breakwater_cache_testkit::RedisServer;
use futures_util::future::join_all;
use tokio::sync::Notify;
use tokio::time::sleep;

/// The database: a price that changes, how many loads ran, whether it is
/// down, and (when `hold` is set) a gate every load waits at after it has
/// read the price.
#[derive(Default)]
struct Db {
    price: AtomicU64,
    loads: AtomicUsize,
    down: AtomicBool,
    hold: AtomicBool,
    started: Notify,
    gate: Notify,
}

type PriceFuture = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Option<u64>, std::io::Error>> + Send>,
>;

impl Db {
    fn loader(self: &Arc<Self>) -> impl FnOnce() -> PriceFuture + Clone + Send + Sync + 'static {
        let db = Arc::clone(self);
        move || {
            Box::pin(async move {
                db.loads.fetch_add(1, Ordering::SeqCst);
                let price = db.price.load(Ordering::SeqCst);
                if db.hold.load(Ordering::SeqCst) {
                    db.started.notify_one();
                    db.gate.notified().await;
                }
                sleep(Duration::from_millis(20)).await;
                if db.down.load(Ordering::SeqCst) {
                    return Err(std::io::Error::other("database down"));
                }
                Ok(Some(price))
            })
        }
    }

    fn loads(&self) -> usize {
        self.loads.load(Ordering::SeqCst)
    }
}

fn cache(store: impl Store, l1: bool, grace: Duration) -> Cache<u64> {
    let builder = Cache::builder()
        .namespace("xtag")
        .store(store)
        .ttl(Duration::from_secs(300))
        .jitter(Jitter::none())
        .grace(grace)
        .max_stale(Duration::from_secs(600));
    let builder = if l1 {
        builder.l1(L1Config::new())
    } else {
        builder
    };
    builder.build().expect("valid settings")
}

/// The counter of tag `shop` in the store.
const COUNTER: &[u8] = b"bw:xtag:t:{shop}";

/// `key`, tagged `shop`, through `cache`, loaded from `db` if needed.
async fn shop(cache: &Cache<u64>, db: &Arc<Db>, key: &str) -> (Option<u64>, Served) {
    let fetched = cache
        .entry(key)
        .tags(["shop"])
        .get_or_load_with_meta(db.loader())
        .await
        .unwrap();
    (fetched.value, fetched.served)
}

fn is_stale(served: Served) -> bool {
    matches!(served, Served::Stale { .. })
}

fn is_hit(served: Served) -> bool {
    matches!(served, Served::Hit | Served::L1Hit)
}

/// `expire_tag` in process `a` while `b` serves too: both (every caller,
/// 50 each) get the old price as `Stale` at once, one load refreshes it
/// fleet-wide, then both have the new one fresh. An untagged key is
/// untouched.
async fn expire_tag_during_traffic(a: Cache<u64>, b: Cache<u64>) {
    let db = Arc::new(Db::default());
    db.price.store(100, Ordering::SeqCst);
    assert_eq!(shop(&a, &db, "p").await, (Some(100), Served::Loaded));
    let (value, served) = shop(&b, &db, "p").await;
    assert!(value == Some(100) && is_hit(served), "{served:?}");
    a.get_or_load("plain", db.loader()).await.unwrap();
    assert_eq!(db.loads(), 2);

    db.price.store(120, Ordering::SeqCst);
    a.expire_tag("shop").await.unwrap();
    // `a` at once; `b` once the bus has reached it.
    let (value, served) = shop(&a, &db, "p").await;
    assert!(value == Some(100) && is_stale(served), "{served:?}");
    sleep(Duration::from_millis(10)).await;
    let calls = (0..50).flat_map(|_| [shop(&a, &db, "p"), shop(&b, &db, "p")]);
    for (value, served) in join_all(calls).await {
        // The refresh may have landed already: then the new price, fresh.
        assert!(
            (value == Some(100) && is_stale(served)) || (value == Some(120) && is_hit(served)),
            "{value:?} {served:?}"
        );
    }
    support::until("the refresh", || db.loads() == 3).await;
    for _ in 0..200 {
        if shop(&a, &db, "p").await.0 == Some(120) && shop(&b, &db, "p").await.0 == Some(120) {
            break;
        }
        sleep(Duration::from_millis(5)).await;
    }
    for cache in [&a, &b] {
        let (value, served) = shop(cache, &db, "p").await;
        assert!(value == Some(120) && is_hit(served), "{value:?} {served:?}");
        let plain = cache
            .get_or_load_with_meta("plain", db.loader())
            .await
            .unwrap();
        assert!(is_hit(plain.served), "{plain:?}");
    }
    sleep(Duration::from_millis(200)).await;
    assert_eq!(db.loads(), 3, "exactly one refresh fleet-wide");
}

#[tokio::test(start_paused = true)]
async fn expire_tag_serves_stale_while_one_load_refreshes_on_the_memory_store() {
    for l1 in [false, true] {
        let store = MemoryStore::new();
        let grace = Duration::from_secs(10);
        expire_tag_during_traffic(cache(store.clone(), l1, grace), cache(store, l1, grace)).await;
    }
}

#[tokio::test]
async fn expire_tag_serves_stale_while_one_load_refreshes_on_redis() {
    let server = RedisServer::start();
    for l1 in [false, true] {
        let (a, b) = (
            support::connect(&server).await,
            support::connect(&server).await,
        );
        let grace = Duration::from_secs(10);
        let (a, b) = (cache(a, l1, grace), cache(b, l1, grace));
        a.invalidate("p").await.unwrap();
        a.invalidate("plain").await.unwrap();
        expire_tag_during_traffic(a, b).await;
    }
}

/// Grace counts from the call: past it (or without grace) the next caller
/// waits for a load, and gets the new price.
#[tokio::test(start_paused = true)]
async fn past_grace_or_without_grace_the_next_read_loads() {
    for (grace, wait) in [
        (Duration::from_secs(10), Duration::from_secs(11)),
        (Duration::ZERO, Duration::ZERO),
    ] {
        let a = cache(MemoryStore::new(), true, grace);
        let db = Arc::new(Db::default());
        db.price.store(100, Ordering::SeqCst);
        shop(&a, &db, "p").await;
        // The entry is old (its grace would have run out long ago had it
        // counted from its load), yet within grace from the call it is
        // served stale.
        sleep(Duration::from_secs(100)).await;
        db.price.store(120, Ordering::SeqCst);
        a.expire_tag("shop").await.unwrap();
        sleep(wait).await;
        assert_eq!(
            shop(&a, &db, "p").await,
            (Some(120), Served::Loaded),
            "grace {grace:?}"
        );
    }
}

/// With the database down, the old value stands in within `max_stale`,
/// in the expiring process and in another, within grace and past it:
/// never an error.
#[tokio::test(start_paused = true)]
async fn with_the_database_down_fail_safe_serves_the_old_value() {
    let store = MemoryStore::new();
    let grace = Duration::from_secs(10);
    let (a, b) = (
        cache(store.clone(), true, grace),
        cache(store.clone(), false, grace),
    );
    let db = Arc::new(Db::default());
    db.price.store(100, Ordering::SeqCst);
    shop(&a, &db, "p").await;
    db.down.store(true, Ordering::SeqCst);
    a.expire_tag("shop").await.unwrap();
    for wait in [0, 20, 60] {
        sleep(Duration::from_secs(wait)).await;
        for cache in [&a, &b] {
            let (value, served) = shop(cache, &db, "p").await;
            assert!(value == Some(100) && is_stale(served), "{served:?}");
        }
    }
}

/// A load that began before `expire_tag` (its loader still running when
/// the call returns) lands stale, never fresh: its callers get its value,
/// the next caller gets it as `Stale` while a new load refreshes it.
async fn a_load_that_began_before_lands_stale(a: Cache<u64>) {
    let db = Arc::new(Db::default());
    db.price.store(100, Ordering::SeqCst);
    db.hold.store(true, Ordering::SeqCst);
    let slow = {
        let (a, db) = (a.clone(), Arc::clone(&db));
        tokio::spawn(async move { shop(&a, &db, "p").await })
    };
    db.started.notified().await;
    db.hold.store(false, Ordering::SeqCst);
    db.price.store(120, Ordering::SeqCst);
    a.expire_tag("shop").await.unwrap();
    db.gate.notify_one();
    assert_eq!(slow.await.unwrap(), (Some(100), Served::Loaded));
    let (value, served) = shop(&a, &db, "p").await;
    assert!(
        value == Some(100) && is_stale(served),
        "{value:?} {served:?}"
    );
    support::until("the refresh", || db.loads() == 2).await;
    for _ in 0..200 {
        if shop(&a, &db, "p").await.0 == Some(120) {
            break;
        }
        sleep(Duration::from_millis(5)).await;
    }
    let (value, served) = shop(&a, &db, "p").await;
    assert!(value == Some(120) && is_hit(served), "{value:?} {served:?}");
}

#[tokio::test(start_paused = true)]
async fn a_load_that_began_before_expire_tag_lands_stale_on_the_memory_store() {
    for l1 in [false, true] {
        a_load_that_began_before_lands_stale(cache(
            MemoryStore::new(),
            l1,
            Duration::from_secs(10),
        ))
        .await;
    }
}

#[tokio::test]
async fn a_load_that_began_before_expire_tag_lands_stale_on_redis() {
    let server = RedisServer::start();
    for l1 in [false, true] {
        let a = cache(support::connect(&server).await, l1, Duration::from_secs(10));
        a.invalidate("p").await.unwrap();
        a.invalidate_tag("shop").await.unwrap();
        a_load_that_began_before_lands_stale(a).await;
    }
}

/// After `expire_tag`, what makes the entry a miss still does: an
/// `invalidate_tag`, or the counter lost from the store (evicted,
/// deleted): never valid, not even stale, whatever grace says.
async fn a_miss_after_expire_tag(store: impl Store + Clone) {
    for lose in [false, true] {
        let a = cache(store.clone(), true, Duration::from_secs(10));
        let b = cache(store.clone(), false, Duration::from_secs(10));
        let db = Arc::new(Db::default());
        db.price.store(100, Ordering::SeqCst);
        a.invalidate("p").await.unwrap();
        shop(&a, &db, "p").await;
        a.expire_tag("shop").await.unwrap();
        let (value, served) = shop(&b, &db, "p").await;
        assert!(value == Some(100) && is_stale(served), "{served:?}");
        // Let the refresh land, then expire again: a stale entry stands.
        support::until("the refresh", || db.loads() == 2).await;
        sleep(Duration::from_millis(100)).await;
        a.expire_tag("shop").await.unwrap();
        db.price.store(120, Ordering::SeqCst);
        if lose {
            assert!(store.delete(COUNTER).await.unwrap(), "the counter exists");
        } else {
            a.invalidate_tag("shop").await.unwrap();
        }
        for cache in [&a, &b] {
            assert_eq!(cache.get("p").await.unwrap(), None, "lost counter: {lose}");
        }
        assert_eq!(shop(&b, &db, "p").await, (Some(120), Served::Loaded));
    }
}

#[tokio::test(start_paused = true)]
async fn invalidate_tag_or_a_lost_counter_after_expire_tag_is_a_miss_on_the_memory_store() {
    a_miss_after_expire_tag(MemoryStore::new()).await;
}

#[tokio::test]
async fn invalidate_tag_or_a_lost_counter_after_expire_tag_is_a_miss_on_redis() {
    let server = RedisServer::start();
    a_miss_after_expire_tag(support::connect(&server).await).await;
}

/// Two processes with L1 on one Redis: the other process's fresh L1 copy
/// is dropped when the message reaches it, so it serves the stored entry,
/// stale, not its old copy as a hit.
#[tokio::test]
async fn another_process_drops_its_l1_copy_on_redis() {
    let server = RedisServer::start();
    let grace = Duration::from_secs(10);
    let a = cache(support::connect(&server).await, true, grace);
    let b = cache(support::connect(&server).await, true, grace);
    let db = Arc::new(Db::default());
    db.price.store(100, Ordering::SeqCst);
    assert_eq!(shop(&a, &db, "p").await, (Some(100), Served::Loaded));
    // `b`'s L1 holds it, fresh (once its bus is up: until then L1 keeps
    // nothing).
    let mut near = false;
    for _ in 0..200 {
        if shop(&b, &db, "p").await == (Some(100), Served::L1Hit) {
            near = true;
            break;
        }
        sleep(Duration::from_millis(10)).await;
    }
    assert!(near, "b's L1 never held the entry");

    db.price.store(120, Ordering::SeqCst);
    db.down.store(true, Ordering::SeqCst);
    a.expire_tag("shop").await.unwrap();
    sleep(Duration::from_millis(300)).await;
    let (value, served) = shop(&b, &db, "p").await;
    assert!(value == Some(100) && is_stale(served), "{served:?}");
}

//! `expire` (a soft invalidation): the entry goes stale everywhere at once
//! and is served as `Stale` within grace while one load refreshes it, stays
//! a fail-safe stand-in within `max_stale`, and no load that began before
//! the call becomes fresh after it. Two `Cache`s over one store are two
//! processes; on the memory store with paused time and on a private Redis.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use breakwater_cache::{Cache, Jitter, L1Config, MemoryStore, Served, Store, Stored};
use breakwater_cache_testkit::RedisServer;
use futures_util::future::join_all;
use tokio::time::sleep;

/// The database: a price that changes, how many loads ran, and whether it
/// is down.
#[derive(Default)]
struct Db {
    price: AtomicU64,
    loads: AtomicUsize,
    down: AtomicBool,
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
                sleep(Duration::from_millis(50)).await;
                if db.down.load(Ordering::SeqCst) {
                    return Err(std::io::Error::other("database down"));
                }
                Ok(Some(price))
            })
        }
    }
}

fn cache(store: impl Store, l1: bool) -> Cache<u64> {
    let builder = Cache::builder()
        .namespace("expire")
        .store(store)
        .ttl(Duration::from_secs(300))
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

/// `expire` during traffic in process `a` while `b` serves too: 100
/// callers in each, nobody waits (all served at once, the old price as
/// `Stale` until the new one lands), one load fleet-wide.
async fn expire_during_traffic(a: Cache<u64>, b: Cache<u64>) {
    let db = Arc::new(Db::default());
    db.price.store(100, Ordering::SeqCst);
    assert_eq!(a.get_or_load("p", db.loader()).await.unwrap(), Some(100));
    assert_eq!(b.get_or_load("p", db.loader()).await.unwrap(), Some(100));
    assert_eq!(db.loads.load(Ordering::SeqCst), 1);

    db.price.store(120, Ordering::SeqCst);
    a.expire("p").await.unwrap();
    // Another process's L1 copy goes when the bus reaches it (the coherence
    // contract's bounded L1 staleness elsewhere); `a`'s own at once.
    let own = a.get_or_load_with_meta("p", db.loader()).await.unwrap();
    assert!(matches!(own.served, Served::Stale { .. }), "{own:?}");
    sleep(Duration::from_millis(20)).await;
    let calls = (0..100).flat_map(|_| {
        [
            a.get_or_load_with_meta("p", db.loader()),
            b.get_or_load_with_meta("p", db.loader()),
        ]
    });
    for fetched in join_all(calls).await {
        let fetched = fetched.unwrap();
        assert!(
            matches!(
                (fetched.value, fetched.served),
                (Some(100), Served::Stale { .. })
            ),
            "{fetched:?}"
        );
    }
    // One refresh, fleet-wide; then the new price everywhere.
    support::until("the refresh", || db.loads.load(Ordering::SeqCst) == 2).await;
    for _ in 0..200 {
        if a.get("p").await.unwrap() == Some(120) && b.get("p").await.unwrap() == Some(120) {
            break;
        }
        sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(a.get("p").await.unwrap(), Some(120));
    assert_eq!(b.get("p").await.unwrap(), Some(120));
    sleep(Duration::from_millis(200)).await;
    assert_eq!(
        db.loads.load(Ordering::SeqCst),
        2,
        "exactly one load fleet-wide"
    );
}

#[tokio::test(start_paused = true)]
async fn expire_serves_stale_while_one_load_refreshes_on_the_memory_store() {
    for l1 in [false, true] {
        let store = MemoryStore::new();
        expire_during_traffic(cache(store.clone(), l1), cache(store, l1)).await;
    }
}

#[tokio::test]
async fn expire_serves_stale_while_one_load_refreshes_on_redis() {
    let server = RedisServer::start();
    for l1 in [false, true] {
        let (a, b) = (
            support::connect(&server).await,
            support::connect(&server).await,
        );
        let (a, b) = (cache(a, l1), cache(b, l1));
        a.invalidate("p").await.unwrap();
        expire_during_traffic(a, b).await;
    }
}

#[tokio::test(start_paused = true)]
async fn expire_with_the_database_down_serves_the_old_value_within_max_stale() {
    let store = MemoryStore::new();
    let (a, b) = (cache(store.clone(), true), cache(store, false));
    let db = Arc::new(Db::default());
    db.price.store(100, Ordering::SeqCst);
    a.get_or_load("p", db.loader()).await.unwrap();
    db.down.store(true, Ordering::SeqCst);
    a.expire("p").await.unwrap();
    // Within grace, then past it (20 s, 60 s later): never an error.
    for wait in [0, 20, 60] {
        sleep(Duration::from_secs(wait)).await;
        for cache in [&a, &b] {
            let fetched = cache.get_or_load_with_meta("p", db.loader()).await.unwrap();
            assert_eq!(fetched.value, Some(100));
            assert!(
                matches!(fetched.served, Served::Stale { .. }),
                "{fetched:?}"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_load_that_began_before_expire_never_becomes_fresh_after_it() {
    for l1 in [false, true] {
        let store = MemoryStore::new();
        let a = cache(store.clone(), l1);
        let db = Arc::new(Db::default());
        db.price.store(100, Ordering::SeqCst);
        a.get_or_load("p", db.loader()).await.unwrap();
        a.invalidate("p").await.unwrap();
        // A slow load (50 ms) of price 100 is in the air when the price
        // changes and `expire` is called.
        let slow = {
            let (a, loader) = (a.clone(), db.loader());
            tokio::spawn(async move { a.get_or_load("p", loader).await })
        };
        sleep(Duration::from_millis(10)).await;
        db.price.store(120, Ordering::SeqCst);
        a.expire("p").await.unwrap();
        assert_eq!(slow.await.unwrap().unwrap(), Some(100));
        // Its write was refused: nothing fresh from before.
        let inspection = a.inspect("p").await.unwrap();
        assert!(
            matches!(inspection.stored, Stored::Missing),
            "l1: {l1}: {inspection:?}"
        );
        let next = a.get_or_load_with_meta("p", db.loader()).await.unwrap();
        assert_eq!((next.value, next.served), (Some(120), Served::Loaded));
    }
}

#[tokio::test]
async fn expire_of_a_missing_key_or_a_foreign_value_changes_nothing() {
    let server = RedisServer::start();
    let store = support::connect(&server).await;
    let a = cache(store.clone(), false);
    a.expire("nothing").await.unwrap();
    let key = a.storage_key("foreign").unwrap();
    store
        .set(&key, b"not an entry at all", Duration::from_secs(60))
        .await
        .unwrap();
    a.expire("foreign").await.unwrap();
    assert_eq!(
        store.get(&key).await.unwrap().as_deref(),
        Some(&b"not an entry at all"[..])
    );
}

//! A cached "not found" is never served stale: after `expire`,
//! `expire_tag` or a soft `clear` (each of which makes entries stale, not
//! gone), the next read of a negative entry loads, and returns what the
//! database now says as `Loaded`. ("Row created → `expire(k)` → the next
//! read still says not found" is what this rules out.) On the memory
//! store with paused time and on a private Redis, L1 off and on.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use breakwater_cache::{Cache, ClearMode, Jitter, L1Config, MemoryStore, Served, Store};
use breakwater_cache_testkit::RedisServer;

/// How a negative entry is made stale.
#[derive(Debug, Clone, Copy)]
enum Staling {
    Expire,
    ExpireTag,
    SoftClear,
}

fn cache(store: impl Store, l1: bool) -> Cache<u64> {
    let builder = Cache::builder()
        .namespace("negexp")
        .store(store)
        .ttl(Duration::from_secs(300))
        .negative_ttl(Duration::from_secs(300))
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

type RowLoad = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Option<u64>, std::io::Error>> + Send>,
>;

/// A loader reading `row`: "not found" while it holds 0.
fn row_loader(row: &Arc<AtomicU64>) -> impl FnOnce() -> RowLoad + Clone + Send + Sync + 'static {
    let row = Arc::clone(row);
    move || {
        Box::pin(async move {
            let found = row.load(Ordering::SeqCst);
            Ok((found != 0).then_some(found))
        })
    }
}

/// The row does not exist, is cached as "not found", is created, then the
/// entry is made stale by `how`: the next read says the row is there.
async fn negative_then(cache: &Cache<u64>, how: Staling) {
    let row = Arc::new(AtomicU64::new(0));
    let load = row_loader(&row);
    let first = cache
        .entry("row")
        .tags(["rows"])
        .get_or_load_with_meta(load.clone())
        .await
        .unwrap();
    assert_eq!(first.value, None, "{how:?}");
    row.store(1, Ordering::SeqCst);
    match how {
        Staling::Expire => cache.expire("row").await.unwrap(),
        Staling::ExpireTag => cache.expire_tag("rows").await.unwrap(),
        Staling::SoftClear => cache
            .clear(ClearMode::Soft {
                window: Duration::ZERO,
            })
            .await
            .unwrap(),
    }
    let next = cache
        .entry("row")
        .tags(["rows"])
        .get_or_load_with_meta(load)
        .await
        .unwrap();
    assert_eq!(
        (next.value, next.served),
        (Some(1), Served::Loaded),
        "{how:?}: a cached not-found was served stale"
    );
}

#[tokio::test(start_paused = true)]
async fn a_negative_entry_is_not_servable_stale_on_the_memory_store() {
    for how in [Staling::Expire, Staling::ExpireTag, Staling::SoftClear] {
        for l1 in [false, true] {
            negative_then(&cache(MemoryStore::new(), l1), how).await;
        }
    }
}

#[tokio::test]
async fn a_negative_entry_is_not_servable_stale_on_redis() {
    let server = RedisServer::start();
    for how in [Staling::Expire, Staling::ExpireTag, Staling::SoftClear] {
        for l1 in [false, true] {
            let cache = cache(support::connect(&server).await, l1);
            cache.clear(ClearMode::Hard).await.unwrap();
            negative_then(&cache, how).await;
        }
    }
}

/// A soft clear spread over a window: once the window is over, a cached
/// "not found" is loaded again (before its end it may still be fresh).
#[tokio::test(start_paused = true)]
async fn a_negative_entry_is_stale_once_a_soft_clears_window_is_over() {
    for l1 in [false, true] {
        let cache = cache(MemoryStore::new(), l1);
        let row = Arc::new(AtomicU64::new(0));
        let load = row_loader(&row);
        let entry = || cache.entry("row").tags(["rows"]);
        assert_eq!(entry().get_or_load(load.clone()).await.unwrap(), None);
        row.store(1, Ordering::SeqCst);
        cache
            .clear(ClearMode::Soft {
                window: Duration::from_millis(800),
            })
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(900)).await;
        let next = entry().get_or_load_with_meta(load).await.unwrap();
        assert_eq!(
            (next.value, next.served),
            (Some(1), Served::Loaded),
            "l1={l1}"
        );
    }
}

/// The simulation's shape: a short TTL (3 s, jitter 10%) under the default
/// negative TTL, two processes (one with L1), the negatives loaded in one
/// and read in the other, which soft-clears over 809 ms.
#[tokio::test(start_paused = true)]
async fn a_negative_entry_longer_than_the_ttl_is_stale_once_the_window_is_over() {
    let store = MemoryStore::new();
    let build = |l1: bool| {
        let builder = Cache::<u64>::builder()
            .namespace("negwin")
            .store(store.clone())
            .ttl(Duration::from_secs(3))
            .jitter(Jitter::ratio(0.1))
            .grace(Duration::from_secs(10));
        let builder = if l1 {
            builder.l1(L1Config::new())
        } else {
            builder
        };
        builder.build().unwrap()
    };
    let (a, b) = (build(true), build(false));
    let row = Arc::new(AtomicU64::new(0));
    let load = row_loader(&row);
    for key in ["n0", "n1", "n2", "n3"] {
        assert_eq!(
            a.entry(key)
                .tags(["neg"])
                .get_or_load(load.clone())
                .await
                .unwrap(),
            None
        );
        assert_eq!(
            b.entry(key)
                .tags(["neg"])
                .get_or_load(load.clone())
                .await
                .unwrap(),
            None
        );
    }
    tokio::time::sleep(Duration::from_millis(450)).await;
    row.store(1, Ordering::SeqCst);
    b.clear(ClearMode::Soft {
        window: Duration::from_millis(809),
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(900)).await;
    for key in ["n0", "n1", "n2", "n3"] {
        let next = b
            .entry(key)
            .tags(["neg"])
            .get_or_load_with_meta(load.clone())
            .await
            .unwrap();
        assert_eq!(
            (next.value, next.served),
            (Some(1), Served::Loaded),
            "{key}"
        );
    }
}

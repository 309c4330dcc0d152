//! `refresh` (a forced refresh): loads now whatever is cached, under the
//! lease (one load across the fleet, joined by concurrent refreshes), and
//! keeps the cached value (stored and served) if the load fails. Two
//! `Cache`s over one store are two processes.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use breakwater_cache::{Cache, L1Config, LoadContext, Loaded, MemoryStore, Served, Store, Stored};
use breakwater_cache_testkit::RedisServer;
use futures_util::future::join_all;
use tokio::time::sleep;

#[derive(Default)]
struct Feed {
    rate: AtomicU64,
    loads: AtomicUsize,
    down: AtomicBool,
}

type RateFuture = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Option<u64>, std::io::Error>> + Send>,
>;

impl Feed {
    fn loader(self: &Arc<Self>) -> impl FnOnce() -> RateFuture + Clone + Send + Sync + 'static {
        let feed = Arc::clone(self);
        move || {
            Box::pin(async move {
                feed.loads.fetch_add(1, Ordering::SeqCst);
                sleep(Duration::from_millis(50)).await;
                if feed.down.load(Ordering::SeqCst) {
                    return Err(std::io::Error::other("feed down"));
                }
                Ok(Some(feed.rate.load(Ordering::SeqCst)))
            })
        }
    }
}

fn cache(store: impl Store, l1: bool) -> Cache<u64> {
    let builder = Cache::builder()
        .namespace("refresh")
        .store(store)
        .ttl(Duration::from_secs(300));
    let builder = if l1 {
        builder.l1(L1Config::new())
    } else {
        builder
    };
    builder.build().expect("valid settings")
}

async fn refresh_once_across_the_fleet(a: Cache<u64>, b: Cache<u64>) {
    let feed = Arc::new(Feed::default());
    feed.rate.store(108, Ordering::SeqCst);
    assert_eq!(
        a.get_or_load("eur", feed.loader()).await.unwrap(),
        Some(108)
    );
    assert_eq!(
        b.get_or_load("eur", feed.loader()).await.unwrap(),
        Some(108)
    );
    assert_eq!(feed.loads.load(Ordering::SeqCst), 1);

    // Fresh, and refreshed anyway: 20 refreshes in two processes, one load.
    feed.rate.store(109, Ordering::SeqCst);
    let refreshes = (0..10).flat_map(|_| {
        [
            a.refresh("eur", feed.loader()),
            b.refresh("eur", feed.loader()),
        ]
    });
    let mut loaded = 0;
    for fetched in join_all(refreshes).await {
        let fetched = fetched.unwrap();
        assert_eq!(fetched.value, Some(109));
        match fetched.served {
            Served::Loaded => loaded += 1,
            Served::Coalesced => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(loaded, 1);
    assert_eq!(feed.loads.load(Ordering::SeqCst), 2, "one load fleet-wide");
    // Everyone reads the new value.
    sleep(Duration::from_millis(20)).await;
    for cache in [&a, &b] {
        let next = cache
            .get_or_load_with_meta("eur", feed.loader())
            .await
            .unwrap();
        assert_eq!(next.value, Some(109));
        assert!(
            matches!(next.served, Served::Hit | Served::L1Hit),
            "{next:?}"
        );
    }

    // A failed refresh: the error, and the value kept, stored and served.
    feed.down.store(true, Ordering::SeqCst);
    feed.rate.store(110, Ordering::SeqCst);
    let err = a.refresh("eur", feed.loader()).await.unwrap_err();
    assert!(err.is_loader(), "{err}");
    for cache in [&a, &b] {
        let next = cache
            .get_or_load_with_meta("eur", feed.loader())
            .await
            .unwrap();
        assert_eq!(next.value, Some(109));
    }
    let Stored::Entry(view) = a.inspect("eur").await.unwrap().stored else {
        panic!("the value is kept");
    };
    assert!(view.fresh_for.is_some());
    assert_eq!(feed.loads.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn refresh_loads_once_across_the_fleet_and_keeps_the_value_on_failure() {
    for l1 in [false, true] {
        let store = MemoryStore::new();
        refresh_once_across_the_fleet(cache(store.clone(), l1), cache(store, l1)).await;
    }
}

#[tokio::test]
async fn refresh_loads_once_across_the_fleet_on_redis() {
    let server = RedisServer::start();
    let (a, b) = (
        support::connect(&server).await,
        support::connect(&server).await,
    );
    refresh_once_across_the_fleet(cache(a, true), cache(b, false)).await;
}

#[tokio::test(start_paused = true)]
async fn refresh_with_context_can_answer_not_modified() {
    let cache = Cache::<u64>::builder()
        .store(MemoryStore::new())
        .ttl(Duration::from_secs(300))
        .jitter(breakwater_cache::Jitter::none())
        .build()
        .unwrap();
    let loader = |ctx: LoadContext<u64>| async move {
        if ctx.stale().and_then(|s| s.validator()) == Some(&b"v1"[..]) {
            return Ok::<_, std::io::Error>(Loaded::not_modified());
        }
        Ok(Loaded::value(7).validator("v1"))
    };
    let first = cache.refresh_with_context("k", loader).await.unwrap();
    assert_eq!((first.value, first.served), (Some(7), Served::Loaded));
    let before = cache.inspect("k").await.unwrap();
    sleep(Duration::from_secs(10)).await;
    let again = cache.refresh_with_context("k", loader).await.unwrap();
    assert_eq!(again.value, Some(7));
    let after = cache.inspect("k").await.unwrap();
    let fresh = |i: &breakwater_cache::Inspection| match &i.stored {
        Stored::Entry(view) => view.fresh_for.unwrap(),
        other => panic!("{other:?}"),
    };
    // Renewed: fresh for as long as after the first load, 10 s later.
    assert!(
        fresh(&after) + Duration::from_secs(1) >= fresh(&before),
        "{before:?} {after:?}"
    );
}

//! A tagged read that finds an entry written without its tags (by an
//! untagged call, or an untagged `get_many`) loads it again
//! under the lease and writes it with its tags, instead of serving it: an
//! untagged entry would escape `invalidate_tag` (a list built on
//! `get_many` served one product at the new price and another at the old
//! one). In the store and in L1; two `Cache`s are two processes.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use breakwater_cache::{Cache, L1Config, MemoryStore, Served};

#[derive(Default)]
struct Prices {
    price: AtomicU64,
    loads: AtomicUsize,
}

fn cache(store: MemoryStore, l1: bool) -> Cache<u64> {
    let builder = Cache::builder()
        .namespace("shop")
        .store(store)
        .ttl(Duration::from_secs(300));
    let builder = if l1 {
        builder.l1(L1Config::new())
    } else {
        builder
    };
    builder.build().expect("valid settings")
}

#[tokio::test(start_paused = true)]
async fn a_tagged_read_reloads_an_untagged_entry_and_no_old_price_survives_the_tag() {
    for l1 in [false, true] {
        let store = MemoryStore::new();
        let (lists, pages) = (cache(store.clone(), l1), cache(store, l1));
        let db = Arc::new(Prices::default());
        db.price.store(100, Ordering::SeqCst);
        // The list endpoint, untagged: products 5 and 6 at 100.
        let batch = {
            let db = Arc::clone(&db);
            move |ids: Vec<u64>| {
                let db = Arc::clone(&db);
                async move {
                    db.loads.fetch_add(ids.len(), Ordering::SeqCst);
                    let price = db.price.load(Ordering::SeqCst);
                    Ok::<_, std::io::Error>(
                        ids.into_iter()
                            .map(|id| (id, price))
                            .collect::<HashMap<_, _>>(),
                    )
                }
            }
        };
        let listed = lists.get_many([5u64, 6], batch.clone()).await.unwrap();
        assert_eq!(listed, [Some(100), Some(100)]);
        let single = |id: u64, cache: &Cache<u64>| {
            let db = Arc::clone(&db);
            let cache = cache.clone();
            async move {
                cache
                    .entry(id)
                    .tags(["shop:3"])
                    .get_or_load_with_meta(move || async move {
                        db.loads.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, std::io::Error>(Some(db.price.load(Ordering::SeqCst)))
                    })
                    .await
                    .unwrap()
            }
        };
        // The product page reads 5 tagged, in both processes: the untagged
        // entry is loaded again (once: the lease), then served tagged.
        for cache in [&pages, &lists] {
            let page = single(5, cache).await;
            assert_eq!(page.value, Some(100));
        }
        assert_eq!(db.loads.load(Ordering::SeqCst), 3, "l1: {l1}");
        let again = single(5, &pages).await;
        assert!(
            matches!(again.served, Served::Hit | Served::L1Hit),
            "{again:?}"
        );

        // A shop-wide price change: every tagged read gets the new price.
        db.price.store(120, Ordering::SeqCst);
        pages.invalidate_tag("shop:3").await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        for cache in [&pages, &lists] {
            for id in [5, 6] {
                let read = single(id, cache).await;
                assert_eq!(read.value, Some(120), "l1: {l1}, id {id}: {read:?}");
            }
        }
    }
}

/// A list endpoint on `get_many` with the shop's tag, in process `lists`;
/// `admin` changes prices and invalidates the tag, 50 times; after each
/// invalidation returned, every list read (20 keys) must show the new
/// price: 1,000 reads, 0 old values. The first lists were read untagged
/// (a deploy before the tag was added): those entries are loaded again.
async fn tagged_lists_see_every_invalidation(lists: Cache<u64>, admin: Cache<u64>) {
    let price = Arc::new(AtomicU64::new(100));
    let loads = Arc::new(AtomicUsize::new(0));
    let batch = {
        let (price, loads) = (Arc::clone(&price), Arc::clone(&loads));
        move |ids: Vec<u64>| {
            let (price, loads) = (Arc::clone(&price), Arc::clone(&loads));
            async move {
                loads.fetch_add(1, Ordering::SeqCst);
                let p = price.load(Ordering::SeqCst);
                Ok::<_, std::io::Error>(ids.into_iter().map(|id| (id, p + id)).collect::<Vec<_>>())
            }
        }
    };
    let ids: Vec<u64> = (0..20).collect();
    // Untagged first.
    let untagged = lists.get_many(ids.clone(), batch.clone()).await.unwrap();
    assert_eq!(untagged[3], Some(103));
    let mut reads = 0;
    for round in 0..50u64 {
        // Read tagged, so the entries carry the tag.
        let listed = lists
            .entries()
            .tags(["shop:3"])
            .get_many(ids.clone(), batch.clone())
            .await
            .unwrap();
        let now = price.load(Ordering::SeqCst);
        assert!(
            listed.iter().zip(&ids).all(|(v, id)| *v == Some(now + id)),
            "round {round}: {listed:?}"
        );
        // A shop-wide change in the other process.
        price.store(200 + round * 10, Ordering::SeqCst);
        admin.invalidate_tag("shop:3").await.unwrap();
        let after = lists
            .entries()
            .tags(["shop:3"])
            .get_many(ids.clone(), batch.clone())
            .await
            .unwrap();
        for (value, id) in after.iter().zip(&ids) {
            reads += 1;
            assert_eq!(
                *value,
                Some(200 + round * 10 + id),
                "round {round}, id {id}"
            );
        }
    }
    assert_eq!(reads, 1_000);
    // One batch load for the untagged read, one when the first tagged read
    // found untagged entries, one after each invalidation; every other
    // tagged read was served from the cache (the tags were recorded).
    assert_eq!(loads.load(Ordering::SeqCst), 52);
}

#[tokio::test(start_paused = true)]
async fn tagged_get_many_sees_every_invalidation_from_another_process() {
    let store = MemoryStore::new();
    tagged_lists_see_every_invalidation(cache(store.clone(), false), cache(store, false)).await;
}

#[tokio::test]
async fn tagged_get_many_sees_every_invalidation_from_another_process_on_redis() {
    let server = breakwater_cache_testkit::RedisServer::start();
    let connect = || async {
        let store = breakwater_cache::RedisStore::connect(&server.url()).unwrap();
        store.warm_up().await.unwrap();
        store
    };
    let build = |store: breakwater_cache::RedisStore| {
        Cache::<u64>::builder()
            .namespace("shop")
            .store(store)
            .ttl(Duration::from_secs(300))
            .build()
            .unwrap()
    };
    tagged_lists_see_every_invalidation(build(connect().await), build(connect().await)).await;
}

#[tokio::test(start_paused = true)]
async fn entries_take_their_own_settings_and_check_them() {
    let cache = cache(MemoryStore::new(), false);
    let load = |ids: Vec<u64>| async move {
        Ok::<_, std::io::Error>(ids.into_iter().map(|id| (id, id)).collect::<Vec<_>>())
    };
    cache
        .entries()
        .ttl(Duration::from_secs(5))
        .jitter(breakwater_cache::Jitter::none())
        .get_many([1u64], load)
        .await
        .unwrap();
    let inspection = cache.inspect(1u64).await.unwrap();
    let breakwater_cache::Stored::Entry(view) = inspection.stored else {
        panic!("{inspection:?}");
    };
    assert_eq!(view.fresh_for, Some(Duration::from_secs(5)));
    let err = cache
        .entries()
        .ttl(Duration::ZERO)
        .get_many([1u64], load)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), breakwater_cache::ErrorKind::Config);
    let err = cache
        .entries()
        .tags([""])
        .get_many([1u64], load)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), breakwater_cache::ErrorKind::InvalidKey);
}

/// An L1 copy serves a tagged call only if its entry has exactly the
/// call's tags: a copy of an entry tagged `B` is no hit for a call tagged
/// `A` (the store read finds `A` missing and loads again).
#[tokio::test(start_paused = true)]
async fn an_l1_copy_with_other_tags_is_no_hit_for_a_tagged_call() {
    let cache = cache(MemoryStore::new(), true);
    let price = Arc::new(AtomicU64::new(100));
    let read = |tag: &'static str| {
        let (cache, price) = (cache.clone(), Arc::clone(&price));
        async move {
            cache
                .entry("p:9")
                .tags([tag])
                .get_or_load_with_meta(move || async move {
                    Ok::<_, std::io::Error>(Some(price.load(Ordering::SeqCst)))
                })
                .await
                .unwrap()
        }
    };
    assert_eq!(read("B").await.value, Some(100));
    assert_eq!(read("B").await.served, Served::L1Hit);
    price.store(120, Ordering::SeqCst);
    // Tagged A: the B copy is not served; the entry is loaded again with A.
    let a = read("A").await;
    assert_eq!((a.value, a.served), (Some(120), Served::Loaded));
    assert_eq!(read("A").await.served, Served::L1Hit);
}

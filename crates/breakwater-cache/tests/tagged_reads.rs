//! A tagged read that finds an entry written without its tags (by an
//! untagged call, or by `get_many`, which cannot tag yet) loads it again
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

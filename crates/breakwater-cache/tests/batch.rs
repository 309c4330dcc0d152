//! `get_many`: one read for all keys, one batch loader call for the missing
//! ones, one load per key across caches (processes), each key's outcome as
//! `get_or_load` would give it. The memory store on paused time, and real
//! Redis (one server and a cluster) for the fleet-wide figures.

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use breakwater_cache::testing::CountingStore;
use breakwater_cache::{BreakerConfig, Cache, ErrorKind, MemoryStore, Served, StaleReason, Store};
use support::ten_second_cache;

/// What the test loader's future returns.
type Found =
    std::pin::Pin<Box<dyn Future<Output = Result<Vec<(u64, String)>, std::io::Error>> + Send>>;

/// A batch loader's record: every call with its keys.
#[derive(Default, Clone)]
struct Calls(Arc<Mutex<Vec<Vec<u64>>>>);

impl Calls {
    fn calls(&self) -> Vec<Vec<u64>> {
        self.0.lock().unwrap().clone()
    }

    fn loaded(&self) -> Vec<u64> {
        let mut all: Vec<u64> = self.calls().into_iter().flatten().collect();
        all.sort_unstable();
        all
    }

    /// A loader that records its keys, waits `delay`, and finds every key
    /// except multiples of 7 (value: `"v<id>"`).
    fn loader(&self, delay: Duration) -> impl Fn(Vec<u64>) -> Found + Send + Sync + 'static {
        let calls = self.clone();
        move |ids: Vec<u64>| {
            calls.0.lock().unwrap().push(ids.clone());
            Box::pin(async move {
                tokio::time::sleep(delay).await;
                Ok(ids
                    .into_iter()
                    .filter(|id| !id.is_multiple_of(7))
                    .map(|id| (id, format!("v{id}")))
                    .collect())
            })
        }
    }
}

fn expected(id: u64) -> Option<String> {
    (!id.is_multiple_of(7)).then(|| format!("v{id}"))
}

fn memory_cache(store: &MemoryStore) -> Cache<String> {
    ten_second_cache("many")
        .store(store.clone())
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn values_come_back_in_order_with_one_loader_call_for_the_missing() {
    let store = MemoryStore::new();
    let cache = memory_cache(&store);
    cache.set(3u64, &"cached".to_owned()).await.unwrap();
    let calls = Calls::default();
    let ids = [5u64, 3, 14, 1, 5];
    let got = cache
        .get_many_with_meta(ids, calls.loader(Duration::from_millis(10)))
        .await;
    // One call, the missing keys once each, in the order asked.
    assert_eq!(calls.calls(), vec![vec![5, 14, 1]]);
    let values: Vec<Option<String>> = got
        .iter()
        .map(|g| g.as_ref().unwrap().value.clone())
        .collect();
    assert_eq!(
        values,
        [
            expected(5),
            Some("cached".into()),
            None,
            expected(1),
            expected(5)
        ]
    );
    assert_eq!(got[1].as_ref().unwrap().served, Served::Hit);
    assert_eq!(got[0].as_ref().unwrap().served, Served::Loaded);

    // Everything is cached now, the absent key as "not found".
    let again = cache
        .get_many_with_meta(ids, calls.loader(Duration::from_millis(10)))
        .await;
    assert_eq!(calls.calls().len(), 1, "no second loader call");
    assert_eq!(again[2].as_ref().unwrap().served, Served::Negative);
    assert_eq!(cache.get(14u64).await.unwrap(), None);
    assert_eq!(cache.get(1u64).await.unwrap(), expected(1));
    let stats = cache.stats();
    assert_eq!(stats.loads.value, 1, "{stats}");
}

#[tokio::test(start_paused = true)]
async fn a_large_batch_is_split_into_loader_calls_of_at_most_500() {
    let store = MemoryStore::new();
    let cache = memory_cache(&store);
    let calls = Calls::default();
    let ids: Vec<u64> = (0..1_200).collect();
    let got = cache
        .get_many(ids.clone(), calls.loader(Duration::from_millis(10)))
        .await
        .unwrap();
    let sizes: Vec<usize> = calls.calls().iter().map(Vec::len).collect();
    assert_eq!(sizes.len(), 3, "{sizes:?}");
    assert!(sizes.iter().all(|&n| n <= 500), "{sizes:?}");
    assert_eq!(calls.loaded(), ids);
    for (id, value) in ids.iter().zip(got) {
        assert_eq!(value, expected(*id));
    }
}

#[tokio::test(start_paused = true)]
async fn caches_sharing_a_store_load_every_key_once() {
    let store = MemoryStore::new();
    let calls = Calls::default();
    // Four "processes", overlapping sets of 1,000 ids, all at once.
    let caches: Vec<Cache<String>> = (0..4).map(|_| memory_cache(&store)).collect();
    let tasks: Vec<_> = caches
        .iter()
        .enumerate()
        .map(|(p, cache)| {
            let cache = cache.clone();
            let loader = calls.loader(Duration::from_millis(50));
            let ids: Vec<u64> = (p as u64 * 250..p as u64 * 250 + 1_000).collect();
            tokio::spawn(async move {
                let got = cache.get_many(ids.clone(), loader).await.unwrap();
                (ids, got)
            })
        })
        .collect();
    for task in tasks {
        let (ids, got) = task.await.unwrap();
        for (id, value) in ids.iter().zip(got) {
            assert_eq!(value, expected(*id), "id {id}");
        }
    }
    let loaded = calls.loaded();
    let unique: HashSet<u64> = loaded.iter().copied().collect();
    assert_eq!(loaded.len(), unique.len(), "some id was loaded twice");
    assert_eq!(unique.len(), 1_750);
}

#[tokio::test(start_paused = true)]
async fn a_key_in_flight_in_this_process_is_joined_not_loaded_again() {
    let store = MemoryStore::new();
    let cache = memory_cache(&store);
    let single = {
        let cache = cache.clone();
        tokio::spawn(async move {
            cache
                .get_or_load(2u64, || async {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Ok::<_, std::io::Error>(Some("from get_or_load".to_owned()))
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    let calls = Calls::default();
    let got = cache
        .get_many_with_meta([1u64, 2], calls.loader(Duration::from_millis(10)))
        .await;
    assert_eq!(calls.calls(), vec![vec![1]]);
    let joined = got[1].as_ref().unwrap();
    assert_eq!(joined.value.as_deref(), Some("from get_or_load"));
    assert_eq!(joined.served, Served::Coalesced);
    assert_eq!(
        single.await.unwrap().unwrap().as_deref(),
        Some("from get_or_load")
    );

    // And the other way round: a get_or_load joins a get_many's load.
    let many = {
        let cache = cache.clone();
        let loader = calls.loader(Duration::from_millis(100));
        tokio::spawn(async move { cache.get_many([10u64, 11], loader).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    let one = cache
        .get_or_load_with_meta(11u64, || async {
            Ok::<_, std::io::Error>(Some("loaded again".to_owned()))
        })
        .await
        .unwrap();
    assert_eq!(one.value, expected(11));
    assert_eq!(one.served, Served::Coalesced);
    assert_eq!(many.await.unwrap().unwrap(), [expected(10), expected(11)]);
}

#[tokio::test(start_paused = true)]
async fn a_failed_batch_fails_its_keys_and_stale_values_stand_in() {
    let store = MemoryStore::new();
    let cache = ten_second_cache("many")
        .store(store.clone())
        .grace(Duration::from_secs(5))
        .max_stale(Duration::from_secs(3_600))
        .build()
        .unwrap();
    cache.set(1u64, &"old".to_owned()).await.unwrap();
    // Past its grace, inside max_stale: a load is needed; it fails.
    tokio::time::advance(Duration::from_secs(20)).await;
    let got = cache
        .get_many_with_meta([1u64, 2], |_ids: Vec<u64>| async {
            Err::<Vec<(u64, String)>, _>(std::io::Error::other("database down"))
        })
        .await;
    let stale = got[0].as_ref().unwrap();
    assert_eq!(stale.value.as_deref(), Some("old"));
    assert_eq!(
        stale.served,
        Served::Stale {
            reason: StaleReason::LoaderFailed
        }
    );
    let err = got[1].as_ref().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Loader, "{err}");
    assert!(
        err.to_string().contains("database down") || format!("{err:?}").contains("database down")
    );
    // `get_many` reports the first failure.
    let err = cache
        .get_many([2u64], |_ids: Vec<u64>| async {
            Err::<Vec<(u64, String)>, _>(std::io::Error::other("database down"))
        })
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Loader);
}

#[tokio::test(start_paused = true)]
async fn stale_values_in_grace_are_served_while_one_batch_refreshes_them() {
    let store = MemoryStore::new();
    let cache = ten_second_cache("many")
        .store(store.clone())
        .grace(Duration::from_secs(60))
        .build()
        .unwrap();
    let calls = Calls::default();
    cache
        .get_many([1u64, 2, 3], calls.loader(Duration::from_millis(10)))
        .await
        .unwrap();
    tokio::time::advance(Duration::from_secs(15)).await;
    let got = cache
        .get_many_with_meta([1u64, 2, 3], calls.loader(Duration::from_millis(10)))
        .await;
    for g in &got {
        assert_eq!(
            g.as_ref().unwrap().served,
            Served::Stale {
                reason: StaleReason::Refreshing
            }
        );
    }
    support::until("the refresh", || calls.calls().len() == 2).await;
    assert_eq!(
        calls.calls()[1],
        vec![1, 2, 3],
        "one batch refreshes all three"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    let got = cache
        .get_many_with_meta([1u64, 2], calls.loader(Duration::from_millis(10)))
        .await;
    assert_eq!(got[0].as_ref().unwrap().served, Served::Hit);
}

#[tokio::test(start_paused = true)]
async fn a_bad_key_fails_alone() {
    let store = MemoryStore::new();
    let cache = memory_cache(&store);
    let calls = Calls::default();
    let long = "x".repeat(10_000);
    let loader = {
        let calls = calls.clone();
        move |keys: Vec<String>| {
            calls.0.lock().unwrap().push(vec![keys.len() as u64]);
            async move {
                Ok::<_, std::io::Error>(
                    keys.into_iter().map(|k| (k.clone(), k)).collect::<Vec<_>>(),
                )
            }
        }
    };
    let got = cache
        .get_many_with_meta(
            ["a".to_owned(), String::new(), long, "b".to_owned()],
            loader,
        )
        .await;
    assert_eq!(got[0].as_ref().unwrap().value.as_deref(), Some("a"));
    assert_eq!(got[1].as_ref().unwrap_err().kind(), ErrorKind::InvalidKey);
    assert_eq!(got[2].as_ref().unwrap_err().kind(), ErrorKind::InvalidKey);
    assert_eq!(got[3].as_ref().unwrap().value.as_deref(), Some("b"));
    assert_eq!(calls.calls(), vec![vec![2]]);
}

#[tokio::test(start_paused = true)]
async fn an_invalidation_during_the_batch_keeps_its_result_out() {
    let store = MemoryStore::new();
    let cache = memory_cache(&store);
    let calls = Calls::default();
    let many = {
        let cache = cache.clone();
        let loader = calls.loader(Duration::from_millis(100));
        tokio::spawn(async move { cache.get_many([1u64, 2], loader).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    cache.invalidate(1u64).await.unwrap();
    // Its own callers still get the batch's result...
    assert_eq!(many.await.unwrap().unwrap(), [expected(1), expected(2)]);
    // ...but it was not written for key 1 (the lease was revoked), and a
    // call after the invalidation loads again.
    let raw = store.get(&cache.storage_key(1u64).unwrap()).await.unwrap();
    assert!(
        raw.is_none(),
        "a load from before the invalidation was written"
    );
    assert!(
        store
            .get(&cache.storage_key(2u64).unwrap())
            .await
            .unwrap()
            .is_some()
    );
    cache
        .get_many([1u64, 2], calls.loader(Duration::from_millis(1)))
        .await
        .unwrap();
    assert_eq!(calls.calls()[1], vec![1]);
}

#[tokio::test(start_paused = true)]
async fn a_holder_that_dies_is_taken_over_by_one_waiter() {
    let store = MemoryStore::new();
    let cache = memory_cache(&store);
    // A dead process's lease on key 1.
    let lease = cache.storage_key(1u64).unwrap();
    let lease = {
        let mut l = lease.clone();
        let at = l.windows(3).position(|w| w == b":v:").unwrap();
        l[at + 1] = b'l';
        l
    };
    assert!(
        store
            .acquire_lease(&lease, b"dead", Duration::from_secs(3))
            .await
            .unwrap()
            .is_acquired()
    );
    let calls = Calls::default();
    let started = tokio::time::Instant::now();
    let got = cache
        .get_many([1u64, 2], calls.loader(Duration::from_millis(10)))
        .await
        .unwrap();
    assert_eq!(got, [expected(1), expected(2)]);
    // Key 2 in the batch; key 1 alone once the dead lease ran out.
    assert_eq!(calls.calls(), vec![vec![2], vec![1]]);
    assert!(started.elapsed() >= Duration::from_secs(3));
}

#[tokio::test(start_paused = true)]
async fn a_loader_that_never_answers_ends_at_load_timeout() {
    let store = MemoryStore::new();
    let cache = ten_second_cache("many")
        .store(store.clone())
        .load_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let got = cache
        .get_many_with_meta([1u64, 2], |_ids: Vec<u64>| async {
            std::future::pending::<()>().await;
            Ok::<Vec<(u64, String)>, std::io::Error>(Vec::new())
        })
        .await;
    for g in got {
        assert_eq!(g.unwrap_err().kind(), ErrorKind::Timeout);
    }
}

/// Four caches on their own connections to one Redis (or cluster), each
/// asking for an overlapping set of 1,000 ids at once.
async fn four_processes(stores: Vec<breakwater_cache::RedisStore>) {
    let calls = Calls::default();
    let caches: Vec<Cache<String>> = stores
        .into_iter()
        .map(|store| ten_second_cache("fleet").store(store).build().unwrap())
        .collect();
    let tasks: Vec<_> = caches
        .iter()
        .enumerate()
        .map(|(p, cache)| {
            let cache = cache.clone();
            let loader = calls.loader(Duration::from_millis(50));
            let ids: Vec<u64> = (p as u64 * 250..p as u64 * 250 + 1_000).rev().collect();
            tokio::spawn(async move {
                let got = cache.get_many(ids.clone(), loader).await.unwrap();
                (ids, got)
            })
        })
        .collect();
    for task in tasks {
        let (ids, got) = task.await.unwrap();
        for (id, value) in ids.iter().zip(got) {
            assert_eq!(value, expected(*id), "id {id}");
        }
    }
    let loaded = calls.loaded();
    let mut times: HashMap<u64, usize> = HashMap::new();
    for id in &loaded {
        *times.entry(*id).or_default() += 1;
    }
    let twice: Vec<_> = times.iter().filter(|(_, n)| **n > 1).collect();
    let stats: Vec<String> = caches.iter().map(|c| c.stats().to_string()).collect();
    assert!(
        twice.is_empty(),
        "{} ids loaded more than once, e.g. {:?}; loader calls {}; stats:\n{}",
        twice.len(),
        &twice[..twice.len().min(5)],
        calls.calls().len(),
        stats.join("\n--\n")
    );
    assert_eq!(times.len(), 1_750);
}

/// One load per key is promised while the store is healthy: a store call
/// that times out opens the store breaker, and keys are then loaded
/// directly. On a CI machine with two busy cores a few thousand commands
/// can take longer than the tests' usual 5 s, so these stores wait up to
/// 60 s, and the two fleet tests take turns.
fn very_patient() -> breakwater_cache::RedisStoreConfig {
    breakwater_cache::RedisStoreConfig::default()
        .connect_timeout(Duration::from_secs(10))
        .response_timeout(Duration::from_secs(60))
        .write_timeout(Duration::from_secs(60))
}

static ONE_FLEET_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_on_redis_load_every_id_once() {
    let _turn = ONE_FLEET_AT_A_TIME.lock().await;
    let server = support::RedisServer::start();
    let mut stores = Vec::new();
    for _ in 0..4 {
        let store =
            breakwater_cache::RedisStore::connect_with(&server.url(), very_patient()).unwrap();
        store.warm_up().await.unwrap();
        stores.push(store);
    }
    four_processes(stores).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_on_a_cluster_load_every_id_once() {
    let _turn = ONE_FLEET_AT_A_TIME.lock().await;
    let cluster = support::RedisCluster::start();
    let mut stores = Vec::new();
    for _ in 0..4 {
        let store =
            breakwater_cache::RedisStore::connect_cluster_with(cluster.urls(), very_patient())
                .unwrap();
        store.warm_up().await.unwrap();
        stores.push(store);
    }
    four_processes(stores).await;
}

#[tokio::test(start_paused = true)]
async fn l1_answers_what_it_holds_without_a_store_read() {
    let store = CountingStore::new(MemoryStore::new());
    let cache = ten_second_cache("many")
        .store(store.clone())
        .l1(breakwater_cache::L1Config::new())
        .build()
        .unwrap();
    let calls = Calls::default();
    cache
        .get_many([1u64, 2, 3], calls.loader(Duration::from_millis(10)))
        .await
        .unwrap();
    let reads = store.gets();
    let got = cache
        .get_many_with_meta([1u64, 2, 3], calls.loader(Duration::from_millis(10)))
        .await;
    assert_eq!(store.gets(), reads, "L1 hits read nothing from the store");
    assert_eq!(calls.calls().len(), 1);
    for (id, g) in [1u64, 2, 3].iter().zip(&got) {
        assert_eq!(g.as_ref().unwrap().value, expected(*id));
    }
    assert_eq!(cache.stats().l1_hits, 3, "{}", cache.stats());
}

/// A store whose reads fail but which still answers is still the store:
/// the batch goes through the leases and is written (one load fleet-wide).
/// Only a store that cannot be used (here: its breaker opened by the failed
/// read) has the batch loaded directly, and not written.
#[tokio::test(start_paused = true)]
async fn a_failed_store_read_loads_through_the_leases_unless_the_store_is_unusable() {
    for unusable in [false, true] {
        let store = CountingStore::new(MemoryStore::new());
        let mut builder = ten_second_cache("many").store(store.clone());
        if unusable {
            builder = builder.store_breaker(BreakerConfig::new().consecutive_failures(1));
        }
        let cache = builder.build().unwrap();
        store.fail_gets(true);
        let calls = Calls::default();
        let got = cache
            .get_many([1u64, 2], calls.loader(Duration::from_millis(10)))
            .await
            .unwrap();
        assert_eq!(got, [expected(1), expected(2)]);
        assert_eq!(calls.calls(), vec![vec![1, 2]], "one batch");
        store.fail_gets(false);
        let raw = store
            .clone()
            .into_inner()
            .get(&cache.storage_key(1u64).unwrap())
            .await
            .unwrap();
        assert_eq!(
            raw.is_some(),
            !unusable,
            "written through the leases unless the store is unusable (unusable: {unusable})"
        );
    }
}

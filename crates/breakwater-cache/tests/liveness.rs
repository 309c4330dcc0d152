//! Liveness when a caller stops polling, a runtime goes idle or away, or a
//! caller drops an invalidation half-way (issue 27, point 3 and 4): every
//! other caller is served within its bound, the bus comes back (or L1 is
//! unverified), and the local step of an invalidation always runs.

mod support;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use breakwater_cache::testing::CountingStore;
use breakwater_cache::{Cache, L1Config, MemoryStore, RedisStore, RedisStoreConfig, Served, Store};
use support::{RedisServer, ten_second_cache};
use tokio::time::Instant;

/// Polls `fut` once (it must not be ready yet) and hands it back, started
/// and parked.
async fn poll_once<F: Future + Unpin>(mut fut: F) -> F {
    std::future::poll_fn(|cx: &mut Context<'_>| {
        assert!(
            Pin::new(&mut fut).poll(cx).is_pending(),
            "the call finished on its first poll"
        );
        Poll::Ready(())
    })
    .await;
    fut
}

/// A loader of whatever `db` holds now.
fn from(
    db: &Arc<AtomicU64>,
) -> impl FnOnce() -> support::VersionFuture + Clone + Send + Sync + 'static + use<> {
    let db = Arc::clone(db);
    move || {
        let db = Arc::clone(&db);
        Box::pin(async move { Ok(Some(db.load(Ordering::SeqCst))) })
    }
}

/// A memory store whose reads take 20 ms, and a cache on it without L1.
fn slow_reads() -> (CountingStore<MemoryStore>, Cache<u64>) {
    let store = CountingStore::slow(MemoryStore::new(), Duration::from_millis(20));
    let cache = Cache::<u64>::builder()
        .namespace("liveness")
        .store(store.clone())
        .build()
        .unwrap();
    (store, cache)
}

#[tokio::test(start_paused = true)]
async fn a_leader_held_unpolled_delays_no_other_caller() {
    // Task A's call leads the shared read of "k", is polled once, then
    // held unpolled (a `select!` whose other arm is busy).
    let (store, cache) = slow_reads();
    let db = Arc::new(AtomicU64::new(7));
    let held = poll_once(Box::pin(cache.get_or_load("k", from(&db)))).await;
    tokio::time::sleep(Duration::from_millis(50)).await;

    // B shares A's read; it must not wait for A to be polled again.
    let started = Instant::now();
    let got = tokio::time::timeout(Duration::from_secs(2), cache.get_or_load("k", from(&db)))
        .await
        .expect("B waited on A's unpolled future")
        .unwrap();
    let took = started.elapsed();
    assert_eq!(got, Some(7));
    // One read deadline (the memory store's 50 ms) of waiting, then its
    // own read (20 ms) and the load.
    assert!(
        took <= store.read_deadline() + Duration::from_millis(100),
        "took {took:?}"
    );
    drop(held);
}

#[tokio::test(start_paused = true)]
async fn followers_of_a_read_that_found_nothing_wait_on_the_load_not_the_leader() {
    // The leader's read finds nothing and joins the load; its caller then
    // stops polling it. Its followers wait on the load's own task.
    let (store, cache) = slow_reads();
    let slow = || async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        Ok::<_, std::io::Error>(Some(9u64))
    };
    let mut held = Box::pin(cache.get_or_load("k", slow));
    let follower = tokio::spawn({
        let cache = cache.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            cache.get_or_load("k", slow).await
        }
    });
    // Polled until the read is done and the load runs, then held.
    let until = Instant::now() + Duration::from_millis(30);
    while Instant::now() < until {
        held = poll_once(held).await;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let started = Instant::now();
    let got = tokio::time::timeout(Duration::from_secs(2), follower)
        .await
        .expect("the follower waited on the unpolled leader")
        .unwrap()
        .unwrap();
    assert_eq!(got, Some(9));
    assert!(started.elapsed() < Duration::from_millis(600));
    // The leader's read and the fill's read once it holds the lease: the
    // follower read nothing itself (it would have, had it waited for the
    // leader past the read deadline).
    // (And the namespace's clear record, read once by the process.)
    assert_eq!(store.gets(), 3, "the follower shared the leader's read");
    drop(held);
}

/// A cache with L1 over `store`, keyed in namespace "dropped".
fn near_cache<S: breakwater_cache::Store>(store: S) -> Cache<u64> {
    Cache::<u64>::builder()
        .namespace("dropped")
        .store(store)
        .ttl(Duration::from_secs(60))
        .l1(L1Config::new().ttl(Duration::from_secs(10)))
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_dropped_invalidate_still_drops_the_local_copy() {
    let store = CountingStore::new(MemoryStore::new());
    let cache = near_cache(store.clone());
    let db = Arc::new(AtomicU64::new(1));
    assert_eq!(cache.get_or_load("k", from(&db)).await.unwrap(), Some(1));
    let fetched = cache.get_or_load_with_meta("k", from(&db)).await.unwrap();
    assert_eq!(fetched.served, Served::L1Hit, "kept in L1");

    // The database changes; the invalidation runs in the store, and its
    // caller goes away before the reply comes.
    db.store(2, Ordering::SeqCst);
    store.hang_write_replies(true);
    let invalidation = tokio::time::timeout(Duration::from_millis(100), cache.invalidate("k"));
    assert!(invalidation.await.is_err(), "the reply never comes");
    store.hang_write_replies(false);

    // The process's own bus message is ignored (it sent it): only the
    // local step can drop the L1 copy.
    for _ in 0..20 {
        assert_eq!(cache.get_or_load("k", from(&db)).await.unwrap(), Some(2));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_dropped_set_still_drops_the_local_copy() {
    let store = CountingStore::new(MemoryStore::new());
    let cache = near_cache(store.clone());
    let db = Arc::new(AtomicU64::new(1));
    assert_eq!(cache.get_or_load("k", from(&db)).await.unwrap(), Some(1));

    store.hang_write_replies(true);
    let set = tokio::time::timeout(Duration::from_millis(100), cache.set("k", &2));
    assert!(set.await.is_err(), "the reply never comes");
    store.hang_write_replies(false);

    for _ in 0..20 {
        assert_eq!(cache.get("k").await.unwrap(), Some(2));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A runtime of its own, as a setup step, a test or a binding's thread
/// would make one.
fn side_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Timeouts of a healthy Redis, but a read deadline short enough for the
/// bound to show.
fn config() -> RedisStoreConfig {
    RedisStoreConfig::default()
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_millis(250))
        .write_timeout(Duration::from_secs(1))
}

#[test]
fn a_queue_owned_by_an_idle_runtime_delays_no_read() {
    let server = RedisServer::start();
    let store = RedisStore::connect_with(&server.url(), config()).unwrap();
    let cache = Cache::<u64>::builder()
        .namespace("queue")
        .store(store.clone())
        .build()
        .unwrap();
    let main = side_runtime();
    main.block_on(async {
        store.warm_up().await.unwrap();
        for i in 0..8u64 {
            cache.set(format!("k{i}"), &i).await.unwrap();
        }
    });

    // On a runtime whose `block_on` then returns (kept, but idle): four
    // reads in the air fill the admission, and a fifth is queued, which
    // schedules the batch task there.
    let idle = side_runtime();
    let parked = idle.block_on(async {
        let mut parked = Vec::new();
        for i in 0..5u64 {
            let cache = cache.clone();
            let read = Box::pin(async move { cache.get(format!("k{i}")).await });
            parked.push(poll_once(read).await);
        }
        parked
    });

    // A read from another runtime now queues behind that batch.
    main.block_on(async {
        let started = Instant::now();
        let got = tokio::time::timeout(Duration::from_secs(5), cache.get("k7"))
            .await
            .expect("a read waited on the idle runtime's batch");
        assert_eq!(got.unwrap(), Some(7));
        let took = started.elapsed();
        assert!(took < Duration::from_secs(1), "took {took:?}");
    });
    drop(parked);
    drop(idle);
}

#[test]
fn a_store_first_used_on_a_dropped_runtime_recovers() {
    let mut server = RedisServer::start();
    server.kill();
    let store = RedisStore::connect_with(&server.url(), config()).unwrap();
    let cache = ten_second_cache("recovers").store(store).build().unwrap();

    // First touched while Redis is down, on a runtime that is then
    // dropped: its reconnect task goes with it, mid-backoff.
    side_runtime().block_on(async {
        assert!(cache.set("k", &"v".to_owned()).await.is_err());
        tokio::time::sleep(Duration::from_millis(30)).await;
    });

    server.restart();
    let main = side_runtime();
    main.block_on(async {
        let up = Instant::now();
        let mut tries = 0;
        loop {
            tries += 1;
            if cache.set("k", &"v".to_owned()).await.is_ok()
                && cache.get("k").await.ok().flatten().as_deref() == Some("v")
            {
                break;
            }
            assert!(
                up.elapsed() < Duration::from_secs(5),
                "the store did not recover within 5 s of Redis coming up ({tries} tries)"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        eprintln!("recovered {:?} after redis came up", up.elapsed());
    });
}

/// A's L1 hears B's invalidation of "k" within 1.1 s, and then serves
/// hits again (its bus trusted once more): `first_calls` ran A's first
/// call, on a runtime of its own.
fn a_hears_b_after(first_calls: impl FnOnce(&Cache<u64>, &Arc<AtomicU64>)) {
    let server = RedisServer::start();
    let connect = || RedisStore::connect_with(&server.url(), config()).unwrap();
    let db = Arc::new(AtomicU64::new(1));
    let a_store = CountingStore::new(connect());
    let a = near_cache(a_store.clone());
    let b = near_cache(connect());
    first_calls(&a, &db);

    let main = side_runtime();
    main.block_on(async {
        // A keeps "k" in L1 (its bus is back, or it re-reads: either way
        // it must hear B's invalidation within the bound).
        assert_eq!(a.get_or_load("k", from(&db)).await.unwrap(), Some(1));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(a.get_or_load("k", from(&db)).await.unwrap(), Some(1));

        db.store(2, Ordering::SeqCst);
        b.invalidate("k").await.unwrap();
        let invalidated = Instant::now();
        loop {
            let got = a.get_or_load("k", from(&db)).await.unwrap();
            if got == Some(2) {
                break;
            }
            assert!(
                invalidated.elapsed() < Duration::from_millis(1_100),
                "A's L1 still served the old value {:?} after B's invalidation",
                invalidated.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        eprintln!(
            "A saw the new value {:?} after B's invalidation",
            invalidated.elapsed()
        );

        // And its L1 serves again once its bus is back: no store read for
        // a copy kept after that.
        let back = Instant::now();
        loop {
            assert_eq!(a.get_or_load("k", from(&db)).await.unwrap(), Some(2));
            let gets = a_store.gets();
            for _ in 0..20 {
                a.get_or_load("k", from(&db)).await.unwrap();
            }
            if a_store.gets() == gets {
                break;
            }
            assert!(
                back.elapsed() < Duration::from_secs(5),
                "A's L1 never served a hit again"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        eprintln!("A's L1 served hits again {:?} later", back.elapsed());
    });
}

#[test]
fn l1_of_a_cache_first_used_on_a_dropped_runtime_hears_invalidations() {
    // A's first call (its bus listener, its store's subscription and
    // connection) on a runtime that is then dropped.
    a_hears_b_after(|a, db| {
        side_runtime().block_on(async {
            assert_eq!(a.get_or_load("other", from(db)).await.unwrap(), Some(1));
            tokio::time::sleep(Duration::from_millis(200)).await;
        });
    });
}

#[test]
fn l1_of_a_cache_first_used_on_an_idle_runtime_hears_invalidations() {
    // The same on a runtime that is kept, but runs nothing once its
    // `block_on` returned: A's listener and its store's feed are stranded
    // there.
    let idle = side_runtime();
    a_hears_b_after(|a, db| {
        idle.block_on(async {
            assert_eq!(a.get_or_load("other", from(db)).await.unwrap(), Some(1));
            tokio::time::sleep(Duration::from_millis(200)).await;
        });
    });
    drop(idle);
}

#[test]
fn a_load_whose_runtime_is_dropped_is_loaded_again_for_callers_elsewhere() {
    let cache = Cache::<u64>::builder()
        .namespace("abandoned")
        .store(MemoryStore::new())
        .build()
        .unwrap();
    let calls = Arc::new(AtomicU64::new(0));
    let loader = {
        let calls = Arc::clone(&calls);
        move || {
            let calls = Arc::clone(&calls);
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok::<_, std::io::Error>(Some(5u64))
            }
        }
    };
    // A short-lived runtime on another thread leads the load, and is
    // dropped 100 ms into it.
    let side = std::thread::spawn({
        let (cache, loader) = (cache.clone(), loader.clone());
        move || {
            side_runtime().block_on(async {
                let lead = tokio::spawn(async move { cache.get_or_load("k", loader).await });
                tokio::time::sleep(Duration::from_millis(100)).await;
                drop(lead);
            });
        }
    });
    // A caller here joins that load 50 ms in.
    let got = side_runtime().block_on(async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        tokio::time::timeout(Duration::from_secs(30), cache.get_or_load("k", loader)).await
    });
    side.join().unwrap();
    let got = got
        .expect("bounded")
        .expect("the caller here loads again, not fails");
    assert_eq!(got, Some(5));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[test]
fn a_load_stranded_on_an_idle_runtime_is_loaded_again_for_callers_elsewhere() {
    let cache = Cache::<u64>::builder()
        .namespace("stranded")
        .store(MemoryStore::new())
        .lease_ttl(Duration::from_millis(500))
        .load_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let loader = || async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        Ok::<_, std::io::Error>(Some(3u64))
    };
    // A caller on a runtime of its own gives up 50 ms into the load; the
    // runtime is kept but runs nothing from then on (its `block_on`
    // returned), and the load's task is stranded there.
    let idle = side_runtime();
    idle.block_on(async {
        let call = cache.get_or_load("k", loader);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), call)
                .await
                .is_err()
        );
    });
    // A caller here joins that load: it waits no longer than a load can
    // take, then loads again here.
    let started = std::time::Instant::now();
    let got = side_runtime().block_on(async {
        tokio::time::timeout(Duration::from_secs(30), cache.get_or_load("k", loader)).await
    });
    let got = got.expect("waited on the stranded load").unwrap();
    assert_eq!(got, Some(3));
    eprintln!(
        "served {:?} after joining the stranded load",
        started.elapsed()
    );
    drop(idle);
}

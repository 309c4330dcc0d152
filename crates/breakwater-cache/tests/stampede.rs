//! One load per key: single-flight, the Redis lease, woken waiters and fenced
//! writes, against real private Redis servers. Separate `RedisStore` handles
//! (own connections, own caches) stand in for separate processes here; the
//! CLI's tests run real OS processes.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use breakwater_cache::testing::CountingStore;
use breakwater_cache::{Cache, ErrorKind, Jitter, MemoryStore, OnLockTimeout, RedisStore, Served};
use support::{redis_store, slow_loader};
use tokio::sync::Notify;

fn cache_on(store: &RedisStore) -> Cache<String> {
    Cache::builder()
        .namespace("stampede")
        .store(store.clone())
        .ttl(Duration::from_secs(60))
        .jitter(Jitter::ratio(0.1))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_concurrent_calls_one_process_one_load() {
    let (_server, store) = redis_store().await;
    let cache = cache_on(&store);
    let calls = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..1_000 {
        let cache = cache.clone();
        let loader = slow_loader(&calls, Duration::from_millis(50), "v");
        tasks.push(tokio::spawn(async move {
            cache.get_or_load("hot", loader).await
        }));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap().as_deref(), Some("v"));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A miss read once by many callers starts the load from that read; exactly
/// one caller reports leading it, and a caller whose own read arrives while
/// the load is in the air coalesces instead of claiming it.
#[tokio::test(start_paused = true)]
async fn a_shared_miss_has_one_leader_and_late_readers_coalesce() {
    let cache = Cache::<String>::builder()
        .store(MemoryStore::new())
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let call = |cache: &Cache<String>| {
        let (cache, loader) = (
            cache.clone(),
            slow_loader(&calls, Duration::from_millis(100), "v"),
        );
        tokio::spawn(async move { cache.get_or_load_with_meta("hot", loader).await })
    };
    let mut tasks: Vec<_> = (0..20).map(|_| call(&cache)).collect();
    tokio::time::sleep(Duration::from_millis(10)).await;
    let late = call(&cache);
    tasks.push(late);
    let mut served = Vec::new();
    for task in tasks {
        let fetched = task.await.unwrap().unwrap();
        assert_eq!(fetched.value.as_deref(), Some("v"));
        served.push(fetched.served);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let leaders = served.iter().filter(|s| **s == Served::Loaded).count();
    assert_eq!(leaders, 1, "{served:?}");
    assert_eq!(served.last(), Some(&Served::Coalesced), "{served:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_caches_with_their_own_connections_share_one_load() {
    let server = support::RedisServer::start();
    let calls = Arc::new(AtomicUsize::new(0));
    let mut caches = Vec::new();
    for _ in 0..4 {
        caches.push(cache_on(&support::connect(&server).await));
    }
    let start = Arc::new(Notify::new());
    let mut tasks = Vec::new();
    for cache in &caches {
        for _ in 0..250 {
            let cache = cache.clone();
            let loader = slow_loader(&calls, Duration::from_millis(500), "v");
            let start = Arc::clone(&start);
            tasks.push(tokio::spawn(async move {
                start.notified().await;
                cache.get_or_load("hot", loader).await
            }));
        }
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    start.notify_waiters();
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap().as_deref(), Some("v"));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_cancelled_callers_load_still_completes_once_for_the_others() {
    let (_server, store) = redis_store().await;
    let cache = cache_on(&store);
    let calls = Arc::new(AtomicUsize::new(0));
    let leader = tokio::time::timeout(
        Duration::from_millis(20),
        cache.get_or_load("k", slow_loader(&calls, Duration::from_millis(200), "v")),
    )
    .await;
    assert!(leader.is_err(), "the leader's caller should have given up");
    let v = cache
        .get_or_load(
            "k",
            slow_loader(&calls, Duration::from_millis(200), "second"),
        )
        .await
        .unwrap();
    assert_eq!(v.as_deref(), Some("v"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_panicking_loader_fails_every_waiter_and_the_next_call_loads_again() {
    let (server, store) = redis_store().await;
    let cache = cache_on(&store);
    let mut waiters = Vec::new();
    for _ in 0..20 {
        let cache = cache.clone();
        waiters.push(tokio::spawn(async move {
            cache
                .get_or_load("k", || async {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    if true {
                        panic!("loader bug");
                    }
                    Ok::<Option<String>, std::io::Error>(None)
                })
                .await
        }));
    }
    for waiter in waiters {
        let err = waiter.await.unwrap().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Loader);
        assert_eq!(
            err.to_string(),
            "loader failed: panicked: the next call for this key loads again"
        );
    }
    // The lease was released, not left to expire, and nothing was cached.
    assert_eq!(
        server.command(&["EXISTS", "bw:stampede:l:{k}"]).unwrap(),
        "0"
    );
    assert_eq!(
        server.command(&["EXISTS", "bw:stampede:v:{k}"]).unwrap(),
        "0"
    );
    let calls = Arc::new(AtomicUsize::new(0));
    let v = cache
        .get_or_load("k", slow_loader(&calls, Duration::ZERO, "ok"))
        .await
        .unwrap();
    assert_eq!(v.as_deref(), Some("ok"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn invalidate_during_a_slow_load_refuses_its_write() {
    let (server, store) = redis_store().await;
    let cache = cache_on(&store);
    let calls = Arc::new(AtomicUsize::new(0));
    let slow = {
        let cache = cache.clone();
        let loader = slow_loader(&calls, Duration::from_millis(300), "old");
        tokio::spawn(async move { cache.get_or_load("k", loader).await })
    };
    // Wait until the slow load holds the lease, then invalidate.
    support::until("the load to start", || calls.load(Ordering::SeqCst) > 0).await;
    cache.invalidate("k").await.unwrap();
    assert_eq!(slow.await.unwrap().unwrap().as_deref(), Some("old"));
    assert_eq!(
        server.command(&["EXISTS", "bw:stampede:v:{k}"]).unwrap(),
        "0",
        "the invalidated load wrote its result back"
    );
    let v = cache
        .get_or_load("k", slow_loader(&calls, Duration::ZERO, "new"))
        .await
        .unwrap();
    assert_eq!(v.as_deref(), Some("new"));
}

/// A stuck lease (held for a minute, never released: a foreign or broken
/// holder) on one memory store; `waiter` runs out of `lock_wait`.
async fn lock_timeout_case(
    policy: OnLockTimeout,
    with_stale: bool,
) -> (Result<Option<String>, breakwater_cache::Error>, usize) {
    let store = MemoryStore::new();
    let build = || {
        Cache::<String>::builder()
            .namespace("lw")
            .store(store.clone())
            .ttl(Duration::from_secs(10))
            .max_stale(Duration::from_secs(60)) // no grace: stale is only a fallback
            .jitter(Jitter::none())
            // queue_wait (1 s) + load_timeout + lease_ttl fit in lock_wait.
            .load_timeout(Duration::from_millis(500))
            .lease_ttl(Duration::from_millis(500))
            .lock_wait(Duration::from_secs(2))
            .on_lock_timeout(policy)
            .build()
            .unwrap()
    };
    let waiter = build();
    if with_stale {
        waiter.set("k", &"stale".to_string()).await.unwrap();
        tokio::time::advance(Duration::from_secs(11)).await; // past fresh, inside max_stale
    }
    let calls = Arc::new(AtomicUsize::new(0));
    let stuck = breakwater_cache::Store::acquire_lease(
        &store,
        b"bw:lw:l:{k}",
        b"stuck",
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    assert!(stuck.is_acquired());
    let started = tokio::time::Instant::now();
    let result = waiter
        .get_or_load("k", slow_loader(&calls, Duration::from_millis(1), "anyway"))
        .await;
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(2),
        "gave up early: {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(3),
        "waited past lock_wait: {waited:?}"
    );
    (result, calls.load(Ordering::SeqCst))
}

#[tokio::test(start_paused = true)]
async fn lock_timeout_load_anyway_calls_the_loader_for_a_stuck_lease() {
    let (result, calls) = lock_timeout_case(OnLockTimeout::load_anyway(), false).await;
    assert_eq!(result.unwrap().as_deref(), Some("anyway"));
    assert_eq!(calls, 1);
}

#[tokio::test(start_paused = true)]
async fn lock_timeout_serve_stale_serves_the_stale_value() {
    let (result, calls) = lock_timeout_case(OnLockTimeout::serve_stale(), true).await;
    assert_eq!(result.unwrap().as_deref(), Some("stale"));
    assert_eq!(calls, 0, "serve_stale must not call the loader");
}

#[tokio::test(start_paused = true)]
async fn lock_timeout_serve_stale_without_stale_is_a_lock_timeout() {
    let (result, calls) = lock_timeout_case(OnLockTimeout::serve_stale(), false).await;
    assert!(result.unwrap_err().is_lock_timeout());
    assert_eq!(calls, 0);
}

/// `processes` caches with default settings on `store`, `callers` calls of
/// key `k` in each, all at once, with a loader of `delay` counted in
/// `calls`; every caller must get the value.
async fn fleet_loads(
    store: &MemoryStore,
    namespace: &str,
    processes: usize,
    callers: usize,
    calls: &Arc<AtomicUsize>,
    delay: Duration,
) {
    let mut tasks = Vec::new();
    for _ in 0..processes {
        let cache: Cache<String> = Cache::builder()
            .namespace(namespace)
            .store(store.clone())
            .build()
            .unwrap();
        for _ in 0..callers {
            let (cache, loader) = (cache.clone(), slow_loader(calls, delay, "v"));
            tasks.push(tokio::spawn(
                async move { cache.get_or_load("k", loader).await },
            ));
        }
    }
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap().as_deref(), Some("v"));
    }
}

/// With default settings a load slower than the old 5 s `lock_wait` is
/// awaited by the other processes, not repeated: one load, no errors.
#[tokio::test(start_paused = true)]
async fn a_loader_slower_than_lock_wait_used_to_be_is_awaited_not_repeated() {
    let store = MemoryStore::new();
    let calls = Arc::new(AtomicUsize::new(0));
    fleet_loads(&store, "slow", 4, 25, &calls, Duration::from_secs(8)).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A lease holder that stops extending (its process died) is replaced by
/// exactly one waiting process, right after its lease runs out.
#[tokio::test(start_paused = true)]
async fn a_dead_holder_is_replaced_by_exactly_one_waiter_with_defaults() {
    use breakwater_cache::Store;
    let store = MemoryStore::new();
    // The dead holder's lease: 3 s (the default lease_ttl), never extended.
    let lease = b"bw:takeover:l:{k}";
    let taken = store
        .acquire_lease(lease, b"dead", Duration::from_secs(3))
        .await
        .unwrap();
    assert!(taken.is_acquired());
    let calls = Arc::new(AtomicUsize::new(0));
    let started = tokio::time::Instant::now();
    fleet_loads(
        &store,
        "takeover",
        3,
        20,
        &calls,
        Duration::from_millis(500),
    )
    .await;
    assert_eq!(calls.load(Ordering::SeqCst), 1, "exactly one takeover");
    let done = started.elapsed();
    assert!(
        done <= Duration::from_millis(3_000 + 500 + 100),
        "survivors done {done:?} after the lease was taken"
    );
}

#[tokio::test(start_paused = true)]
async fn lock_timeout_error_is_a_lock_timeout() {
    let (result, calls) = lock_timeout_case(OnLockTimeout::error(), true).await;
    let err = result.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LockTimeout);
    assert_eq!(
        err.to_string(),
        "lock wait timed out: another process held this key's lease for longer than lock_wait (2s)"
    );
    assert_eq!(calls, 0);
}

#[tokio::test(start_paused = true)]
async fn a_dead_leaders_lease_expires_and_a_waiter_takes_over() {
    use breakwater_cache::Store;
    let store = MemoryStore::new();
    let survivor = Cache::<String>::builder()
        .namespace("dead")
        .store(store.clone())
        .lease_ttl(Duration::from_secs(1))
        .lock_wait(Duration::from_secs(5))
        .on_lock_timeout(OnLockTimeout::error()) // only a takeover can succeed
        .build()
        .unwrap();
    // What a killed leader leaves behind: its lease, never extended again.
    let taken = store
        .acquire_lease(b"bw:dead:l:{k}", b"dead-token", Duration::from_secs(1))
        .await
        .unwrap();
    assert!(taken.is_acquired());
    let calls = Arc::new(AtomicUsize::new(0));
    let started = tokio::time::Instant::now();
    let v = survivor
        .get_or_load(
            "k",
            slow_loader(&calls, Duration::from_millis(10), "taken over"),
        )
        .await
        .unwrap();
    assert_eq!(v.as_deref(), Some("taken over"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(1),
        "took a held lease: {waited:?}"
    );
    assert!(waited < Duration::from_secs(2), "slow takeover: {waited:?}");
}

#[tokio::test(start_paused = true)]
async fn waiters_are_woken_by_the_fill_not_by_polling() {
    let store = MemoryStore::new();
    let build = || {
        Cache::<String>::builder()
            .namespace("wake")
            .store(store.clone())
            .lock_poll(Duration::from_secs(10)) // polling alone would take ≥ 5 s
            .build()
            .unwrap()
    };
    let a = build();
    let b = build();
    let calls = Arc::new(AtomicUsize::new(0));
    let leader = {
        let loader = slow_loader(&calls, Duration::from_millis(100), "v");
        tokio::spawn(async move { a.get_or_load("k", loader).await })
    };
    support::until("the load to start", || calls.load(Ordering::SeqCst) > 0).await;
    let started = tokio::time::Instant::now();
    let v = b
        .get_or_load("k", slow_loader(&calls, Duration::ZERO, "second"))
        .await
        .unwrap();
    assert_eq!(v.as_deref(), Some("v"));
    assert!(
        started.elapsed() <= Duration::from_millis(100),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    leader.await.unwrap().unwrap();
}

/// A cache on `store` that would poll only every 5–15 s, so a waiter is
/// served by its wake-up alone.
fn patient_waiter<S: breakwater_cache::Store + Clone>(store: &S) -> Cache<String> {
    Cache::builder()
        .namespace("stampede")
        .store(store.clone())
        .ttl(Duration::from_secs(60))
        .lock_poll(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// Process A loads `value` slowly while process B (its own connection)
/// waits; see [`support::wait_for_a_fill`].
async fn wait_for_a_fill(value: String) -> (Option<String>, usize) {
    let (server, a_store) = redis_store().await;
    let b_store = CountingStore::new(support::connect(&server).await);
    let (a, b) = (patient_waiter(&a_store), patient_waiter(&b_store));
    support::wait_for_a_fill(a, b, || b_store.gets(), "k", &value).await
}

#[tokio::test]
async fn a_waiter_in_another_process_gets_a_small_value_with_its_wake_up() {
    let (got, gets_after_wake) = wait_for_a_fill("small".to_owned()).await;
    assert_eq!(got.as_deref(), Some("small"));
    assert_eq!(gets_after_wake, 0, "the fill's message carried the value");
}

#[tokio::test]
async fn a_waiter_in_another_process_reads_a_large_value_back() {
    // 64 KiB that no compression shrinks below the 16 KiB bus limit.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let large: String = (0..64 * 1024)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            char::from(b'!' + (state % 90) as u8)
        })
        .collect();
    let (got, gets_after_wake) = wait_for_a_fill(large.clone()).await;
    assert_eq!(got, Some(large));
    assert_eq!(gets_after_wake, 1, "a large value is not pushed on the bus");
}

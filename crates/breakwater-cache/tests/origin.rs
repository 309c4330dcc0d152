//! Origin protection through the whole pipeline, on paused time: the circuit
//! breaker (with stale values, a fallback, or neither), the load bulkhead
//! (concurrency, rate, queue wait) and retries.

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use breakwater_cache::testing::CountingStore;
use breakwater_cache::{
    BreakerConfig, BreakerState, Cache, ErrorKind, Jitter, LimitConfig, MemoryStore, Origin,
    RetryConfig, Served, StaleReason,
};
use support::DbDown;
use tokio::time::Instant;

/// The origin: counts calls, and fails while `down` is set.
#[derive(Clone, Default)]
struct Db {
    calls: Arc<AtomicUsize>,
    down: Arc<std::sync::atomic::AtomicBool>,
}

impl Db {
    fn loader(
        &self,
        value: &str,
    ) -> impl Fn() -> std::future::Ready<Result<Option<String>, DbDown>> + Clone + Send + Sync + 'static
    {
        let db = self.clone();
        let value = value.to_owned();
        move || {
            db.calls.fetch_add(1, Ordering::SeqCst);
            if db.down.load(Ordering::SeqCst) {
                std::future::ready(Err(DbDown))
            } else {
                std::future::ready(Ok(Some(value.clone())))
            }
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }
}

/// Opens after 3 consecutive failures, for exactly 5 s, 2 half-open probes.
fn breaker() -> BreakerConfig {
    BreakerConfig::new()
        .consecutive_failures(3)
        .cool_down(Duration::from_secs(5))
        .cool_down_jitter(Jitter::none().with_floor(Duration::from_millis(1)))
        .half_open_probes(2)
}

#[tokio::test(start_paused = true)]
async fn an_open_breaker_stops_loads_lets_probes_through_and_closes_on_recovery() {
    let origin = Origin::builder("db").breaker(breaker()).build().unwrap();
    let cache: Cache<String> = Cache::builder().origin(origin.clone()).build().unwrap();
    let db = Db::default();
    db.set_down(true);

    // Three failures (distinct keys: no coalescing) open the breaker.
    for i in 0..3 {
        let err = cache
            .get_or_load(format!("k{i}"), db.loader("v"))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Loader);
    }
    assert_eq!(db.calls(), 3);
    assert_eq!(origin.breaker_state(), BreakerState::Open);

    // During the cool-down: CircuitOpen, and the loader is never called.
    let started = Instant::now();
    let mut i = 100;
    while started.elapsed() < Duration::from_millis(4_990) {
        let err = cache
            .get_or_load(format!("k{i}"), db.loader("v"))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::CircuitOpen, "{err}");
        // For a Retry-After header: the time until the breaker probes.
        let until_probe = Duration::from_secs(5) - started.elapsed();
        assert_eq!(err.retry_after(), Some(until_probe), "{err}");
        tokio::time::advance(Duration::from_millis(10)).await;
        i += 1;
    }
    assert_eq!(db.calls(), 3, "the loader was called during the cool-down");

    // After it: exactly two probes among ten concurrent requests.
    tokio::time::advance(Duration::from_millis(20)).await;
    db.set_down(false);
    let slow = |v: &str| {
        let db = db.clone();
        let v = v.to_owned();
        move || {
            db.calls.fetch_add(1, Ordering::SeqCst);
            let v = v.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                Ok::<_, DbDown>(Some(v))
            }
        }
    };
    let mut tasks = Vec::new();
    for j in 0..10 {
        let cache = cache.clone();
        let load = slow("probe");
        tasks.push(tokio::spawn(async move {
            cache.get_or_load(format!("p{j}"), load).await
        }));
    }
    let mut ok = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(_) => ok += 1,
            Err(err) => {
                assert_eq!(err.kind(), ErrorKind::CircuitOpen);
                // Half-open, probes running: they decide shortly.
                assert_eq!(err.retry_after(), Some(Duration::ZERO), "{err}");
            }
        }
    }
    assert_eq!(ok, 2, "half-open lets exactly the allowed probes through");
    assert_eq!(db.calls(), 5);
    assert_eq!(origin.breaker_state(), BreakerState::Closed);
    assert_eq!(
        cache
            .get_or_load("after", db.loader("v"))
            .await
            .unwrap()
            .as_deref(),
        Some("v")
    );
}

#[tokio::test(start_paused = true)]
async fn during_an_outage_stale_values_then_the_fallback_then_circuit_open() {
    let store = MemoryStore::new();
    let build = |fallback: bool| {
        let builder = Cache::<String>::builder()
            .store(store.clone())
            .ttl(Duration::from_secs(10))
            .max_stale(Duration::from_secs(3600))
            .jitter(Jitter::none())
            .breaker(breaker());
        if fallback {
            builder.fallback("degraded".to_string()).build().unwrap()
        } else {
            builder.build().unwrap()
        }
    };
    let with_stale = build(false);
    let db = Db::default();
    for i in 0..50 {
        with_stale
            .get_or_load(format!("s{i}"), db.loader("cached"))
            .await
            .unwrap();
    }
    tokio::time::advance(Duration::from_secs(11)).await; // all stale now
    db.set_down(true);

    // Every request during the outage gets its stale value, never an error.
    for round in 0..20 {
        for i in 0..50 {
            let fetched = with_stale
                .get_or_load_with_meta(format!("s{i}"), db.loader("new"))
                .await
                .unwrap();
            assert_eq!(fetched.value.as_deref(), Some("cached"), "round {round}");
            assert!(
                matches!(
                    fetched.served,
                    Served::Stale {
                        reason: StaleReason::LoaderFailed | StaleReason::BreakerOpen
                    }
                ),
                "{fetched:?}"
            );
        }
        tokio::time::advance(Duration::from_millis(500)).await;
    }
    assert!(
        db.calls() < 50 + 20,
        "the outage was hammered: {} calls",
        db.calls()
    );

    // No stale value: the fallback. No fallback: CircuitOpen.
    let with_fallback = build(true);
    for i in 0..3 {
        let _ = with_fallback
            .get_or_load(format!("trip{i}"), db.loader("x"))
            .await;
    }
    let fetched = with_fallback
        .get_or_load_with_meta("never-cached", db.loader("x"))
        .await
        .unwrap();
    assert_eq!(fetched.served, Served::Fallback);
    assert_eq!(fetched.value.as_deref(), Some("degraded"));
    let bare = build(false);
    for i in 0..3 {
        let _ = bare.get_or_load(format!("trip{i}"), db.loader("x")).await;
    }
    let err = bare
        .get_or_load("never-cached", db.loader("x"))
        .await
        .unwrap_err();
    assert!(err.is_circuit_open(), "{err}");
}

/// The store's breaker refuses at once, and says when it lets a call
/// through again (for a `Retry-After` header).
#[tokio::test(start_paused = true)]
async fn an_open_store_breaker_says_when_to_retry() {
    let store = CountingStore::new(MemoryStore::new());
    let cache: Cache<String> = Cache::builder()
        .shared_store(Arc::new(store.clone()))
        .store_breaker(
            BreakerConfig::new()
                .consecutive_failures(1)
                .cool_down(Duration::from_secs(10))
                .cool_down_jitter(Jitter::none().with_floor(Duration::from_millis(1))),
        )
        .build()
        .unwrap();
    let opened = Instant::now();
    store.fail_invalidations(1);
    let err = cache.invalidate("k").await.unwrap_err();
    assert!(err.is_store(), "{err}");
    // Its later attempts met the open breaker: the undelivered invalidation
    // says when to try again.
    let after = err.retry_after().expect("the breaker is open");
    assert_eq!(after, Duration::from_secs(10) - opened.elapsed(), "{err}");
    let err = cache.set("k", &"v".to_owned()).await.unwrap_err();
    assert!(err.is_store(), "{err}");
    assert_eq!(
        err.retry_after(),
        Some(Duration::from_secs(10) - opened.elapsed()),
        "{err}"
    );
    tokio::time::advance(Duration::from_secs(10)).await;
    cache.set("k", &"v".to_owned()).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn cold_start_ten_thousand_keys_never_more_than_the_bulkhead_at_once() {
    for (queue_wait, expect_shed) in [
        (Duration::from_secs(1), true),
        (Duration::from_secs(3600), false),
    ] {
        let cache: Cache<u64> = Cache::builder()
            .limit(LimitConfig::new().max_concurrent(32).queue_wait(queue_wait))
            .build()
            .unwrap();
        let running = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for i in 0..10_000u64 {
            let cache = cache.clone();
            let (running, peak) = (Arc::clone(&running), Arc::clone(&peak));
            tasks.push(tokio::spawn(async move {
                cache
                    .get_or_load(format!("cold:{i}"), move || {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        peak.fetch_max(now, Ordering::SeqCst);
                        let running = Arc::clone(&running);
                        async move {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            running.fetch_sub(1, Ordering::SeqCst);
                            Ok::<_, DbDown>(Some(i))
                        }
                    })
                    .await
            }));
        }
        let all = tokio::time::timeout(Duration::from_secs(3600), async {
            let (mut values, mut shed) = (0, 0);
            for task in tasks {
                match task.await.unwrap() {
                    Ok(Some(_)) => values += 1,
                    Err(err) if err.is_overloaded() => {
                        assert_eq!(err.retry_after(), Some(queue_wait), "{err}");
                        shed += 1;
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
            (values, shed)
        })
        .await
        .expect("nothing hangs");
        assert!(
            peak.load(Ordering::SeqCst) <= 32,
            "peak {}",
            peak.load(Ordering::SeqCst)
        );
        assert_eq!(all.0 + all.1, 10_000);
        assert_eq!(
            all.1 > 0,
            expect_shed,
            "{all:?} with queue wait {queue_wait:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn loads_per_second_never_exceed_the_rate_plus_burst() {
    let cache: Cache<u64> = Cache::builder()
        .limit(
            LimitConfig::new()
                .max_concurrent(64)
                .rate(100, 10)
                .queue_wait(Duration::from_secs(5)),
        )
        .build()
        .unwrap();
    let start = Instant::now();
    let per_second: Arc<Mutex<BTreeMap<u64, u32>>> = Arc::default();
    let next_key = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..50 {
        let cache = cache.clone();
        let (per_second, next_key) = (Arc::clone(&per_second), Arc::clone(&next_key));
        workers.push(tokio::spawn(async move {
            while start.elapsed() < Duration::from_secs(60) {
                let key = next_key.fetch_add(1, Ordering::SeqCst);
                let per_second = Arc::clone(&per_second);
                let _ = cache
                    .get_or_load(format!("r:{key}"), move || {
                        let second = start.elapsed().as_secs();
                        *per_second.lock().unwrap().entry(second).or_default() += 1;
                        async { Ok::<_, DbDown>(Some(1)) }
                    })
                    .await;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }));
    }
    for worker in workers {
        worker.await.unwrap();
    }
    let per_second = per_second.lock().unwrap();
    let busiest = per_second.values().max().copied().unwrap_or(0);
    assert!(
        busiest <= 110,
        "{busiest} loads in one second (rate 100 + burst 10)"
    );
    let total: u32 = per_second.values().sum();
    assert!(
        total >= 5_900,
        "the limiter starved the origin: {total} loads in 60 s"
    );
}

#[tokio::test(start_paused = true)]
async fn transient_failures_are_retried_with_backoff_and_the_breaker_sees_the_outcome() {
    let origin = Origin::builder("flaky")
        .breaker(BreakerConfig::new().consecutive_failures(1))
        .retry(RetryConfig::new().max_attempts(3))
        .rng_seed(9)
        .build()
        .unwrap();
    let cache: Cache<String> = Cache::builder().origin(origin.clone()).build().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let flaky = {
        let calls = Arc::clone(&calls);
        move || {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            async move {
                if n < 2 {
                    Err(DbDown)
                } else {
                    Ok(Some("third time".to_string()))
                }
            }
        }
    };
    let fetched = cache.get_or_load_with_meta("k", flaky).await.unwrap();
    assert_eq!(fetched.served, Served::Loaded);
    assert_eq!(fetched.value.as_deref(), Some("third time"));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    // Two failed attempts, one success: the breaker (threshold 1) saw a success.
    assert_eq!(origin.breaker_state(), BreakerState::Closed);

    // A loader that moves its captures into its future is retried too:
    // each attempt calls a fresh clone of it.
    let origin = Origin::builder("moving")
        .retry(RetryConfig::new().max_attempts(3))
        .build()
        .unwrap();
    let cache: Cache<String> = Cache::builder().origin(origin).build().unwrap();
    let (attempts, row) = (Arc::new(AtomicUsize::new(0)), String::from("row 7"));
    let load = {
        let attempts = Arc::clone(&attempts);
        move || async move {
            match attempts.fetch_add(1, Ordering::SeqCst) {
                0 => Err(DbDown),
                _ => Ok(Some(row)),
            }
        }
    };
    assert_eq!(
        cache.get_or_load(7u64, load).await.unwrap().as_deref(),
        Some("row 7")
    );
    assert_eq!(attempts.load(Ordering::SeqCst), 2);

    // A non-retryable error is tried once.
    let origin = Origin::builder("picky")
        .retry(
            RetryConfig::new()
                .max_attempts(5)
                .retry_if(|e| e.loader_error::<DbDown>().is_none()),
        )
        .build()
        .unwrap();
    let cache: Cache<String> = Cache::builder().origin(origin).build().unwrap();
    let db = Db::default();
    db.set_down(true);
    let err = cache.get_or_load("k", db.loader("v")).await.unwrap_err();
    assert!(err.loader_error::<DbDown>().is_some());
    assert_eq!(db.calls(), 1);
}

#[test]
fn origin_settings_go_on_the_origin_when_one_is_shared() {
    let origin = Origin::builder("db").build().unwrap();
    let err = Cache::<u64>::builder()
        .origin(origin)
        .breaker(BreakerConfig::new())
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "breaker, limit and retry belong to the shared Origin when one is given; set them on Origin::builder instead"
    );
    let err = Cache::<u64>::builder()
        .breaker(BreakerConfig::new().consecutive_failures(0))
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "breaker failure threshold must be at least 1"
    );
}

//! Soft and hard TTL, stale-while-revalidate, early refresh, fail-safe,
//! loader timeouts and per-call options, on paused time (memory store) and
//! on real private Redis servers.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use breakwater_cache::clock::SkewedClock;
use breakwater_cache::{
    BreakerConfig, Cache, EarlyRefresh, ErrorKind, Fetched, Jitter, MemoryStore, RedisStore,
    RedisStoreConfig, Served, StaleReason, Store,
};
use support::{DbDown, RedisServer};
use tokio::time::Instant;

type LoadFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Option<String>, DbDown>> + Send>>;

/// A loader that counts its calls, takes `delay`, and returns `value` (or
/// fails when `value` is `None`).
fn loader(
    calls: &Arc<AtomicUsize>,
    delay: Duration,
    value: Option<&str>,
) -> impl Fn() -> LoadFuture + Clone + Send + Sync + 'static {
    let calls = Arc::clone(calls);
    let value = value.map(str::to_owned);
    move || {
        let calls = Arc::clone(&calls);
        let value = value.clone();
        Box::pin(async move {
            calls.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(delay).await;
            value.map(Some).ok_or(DbDown)
        })
    }
}

fn stale(reason: StaleReason) -> Served {
    Served::Stale { reason }
}

fn swr_cache(store: MemoryStore) -> Cache<String> {
    Cache::builder()
        .namespace("fresh")
        .store(store)
        .ttl(Duration::from_secs(10))
        .grace(Duration::from_secs(60))
        .jitter(Jitter::none())
        .early_refresh(EarlyRefresh::none())
        .build()
        .unwrap()
}

/// 1,000 concurrent callers of a key in grace: every one is served the stale
/// value at once (no virtual time passes), exactly one refresh runs, and the
/// next read sees its value.
async fn grace_serves_everyone_at_once_with_one_refresh(cache: Cache<String>, paused: bool) {
    let calls = Arc::new(AtomicUsize::new(0));
    cache.set("hot", &"v1".to_string()).await.unwrap();
    if paused {
        tokio::time::advance(Duration::from_secs(11)).await;
    } else {
        tokio::time::sleep(Duration::from_millis(1_100)).await;
    }
    let mut tasks = Vec::new();
    for _ in 0..1_000 {
        let cache = cache.clone();
        let load = loader(&calls, Duration::from_millis(200), Some("v2"));
        tasks.push(tokio::spawn(async move {
            let started = Instant::now();
            let fetched = cache.get_or_load_with_meta("hot", load).await.unwrap();
            (fetched, started.elapsed())
        }));
    }
    for task in tasks {
        let (fetched, waited) = task.await.unwrap();
        assert_eq!(
            fetched,
            Fetched {
                value: Some("v1".to_string()),
                served: stale(StaleReason::Refreshing)
            }
        );
        // On paused time no virtual time may pass; on real Redis the
        // `Stale { Refreshing }` verdict above is the proof (no wall-clock
        // assertions in tests).
        if paused {
            assert_eq!(waited, Duration::ZERO, "a caller waited for the loader");
        }
    }
    // Let the one refresh land.
    let mut spins = 0;
    while cache.get("hot").await.unwrap().as_deref() != Some("v2") {
        spins += 1;
        assert!(spins < 1_000, "the refresh never landed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1, "loads per refresh");
    let fetched = cache
        .get_or_load_with_meta("hot", loader(&calls, Duration::ZERO, Some("v3")))
        .await
        .unwrap();
    assert_eq!(fetched.served, Served::Hit);
    assert_eq!(fetched.value.as_deref(), Some("v2"));
}

#[tokio::test(start_paused = true)]
async fn grace_on_paused_time() {
    grace_serves_everyone_at_once_with_one_refresh(swr_cache(MemoryStore::new()), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grace_on_real_redis() {
    let (_server, store) = support::redis_store().await;
    let cache = Cache::builder()
        .namespace("fresh")
        .store(store)
        .ttl(Duration::from_secs(1))
        .grace(Duration::from_secs(60))
        .jitter(Jitter::none().with_floor(Duration::from_millis(1)))
        .early_refresh(EarlyRefresh::none())
        .build()
        .unwrap();
    grace_serves_everyone_at_once_with_one_refresh(cache, false).await;
}

#[tokio::test(start_paused = true)]
async fn served_says_how_each_call_was_served() {
    let cache: Cache<String> = Cache::builder().jitter(Jitter::none()).build().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let first = cache
        .get_or_load_with_meta("k", loader(&calls, Duration::from_millis(50), Some("v")))
        .await
        .unwrap();
    assert_eq!(first.served, Served::Loaded);
    let hit = cache
        .get_or_load_with_meta("k", loader(&calls, Duration::ZERO, Some("x")))
        .await
        .unwrap();
    assert_eq!(hit.served, Served::Hit);

    // Two concurrent callers: one loads, the other shares it.
    let a = cache.get_or_load_with_meta("j", loader(&calls, Duration::from_millis(50), Some("j")));
    let b = cache.get_or_load_with_meta("j", loader(&calls, Duration::from_millis(50), Some("j")));
    let (a, b) = tokio::join!(a, b);
    let mut served = [a.unwrap().served, b.unwrap().served];
    served.sort_by_key(|s| format!("{s:?}"));
    assert_eq!(served, [Served::Coalesced, Served::Loaded]);

    let none = cache
        .get_or_load_with_meta("gone", || async { Ok::<Option<String>, DbDown>(None) })
        .await
        .unwrap();
    assert_eq!(
        none,
        Fetched {
            value: None,
            served: Served::Loaded
        }
    );
    let negative = cache
        .get_or_load_with_meta("gone", loader(&calls, Duration::ZERO, Some("x")))
        .await
        .unwrap();
    assert_eq!(
        negative,
        Fetched {
            value: None,
            served: Served::Negative
        }
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// ttl 10 s, no grace, fail-safe up to 60 s past fresh, throttle 5 s (and
/// a breaker that stays out of the way: this is about the fail-safe alone).
fn fail_safe_cache(store: MemoryStore) -> Cache<String> {
    Cache::builder()
        .namespace("failsafe")
        .store(store)
        .breaker(BreakerConfig::new().consecutive_failures(1_000))
        .ttl(Duration::from_secs(10))
        .max_stale(Duration::from_secs(60))
        .fail_safe_throttle(Duration::from_secs(5))
        .jitter(Jitter::none())
        .early_refresh(EarlyRefresh::none())
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_failing_loader_serves_stale_once_per_throttle_and_never_past_max_stale() {
    let cache = fail_safe_cache(MemoryStore::new());
    let calls = Arc::new(AtomicUsize::new(0));
    cache.set("k", &"old".to_string()).await.unwrap();
    tokio::time::advance(Duration::from_secs(10)).await; // fresh window over

    // Every request for 20 s (one per 100 ms) gets the stale value; the
    // failing loader runs at most once per 5 s throttle.
    for _ in 0..200 {
        let fetched = cache
            .get_or_load_with_meta("k", loader(&calls, Duration::from_millis(10), None))
            .await
            .unwrap();
        assert_eq!(fetched.value.as_deref(), Some("old"));
        assert_eq!(fetched.served, stale(StaleReason::LoaderFailed));
        tokio::time::advance(Duration::from_millis(100)).await;
    }
    let loads = calls.load(Ordering::SeqCst);
    assert!(
        (4..=5).contains(&loads),
        "{loads} loader calls in 20 s with a 5 s throttle"
    );

    // Past max_stale (60 s after the fresh window): the error, never the value.
    tokio::time::advance(Duration::from_secs(41)).await;
    let err = cache
        .get_or_load("k", loader(&calls, Duration::ZERO, None))
        .await
        .unwrap_err();
    assert!(err.is_loader());
    assert!(err.loader_error::<DbDown>().is_some());

    // Recovery: the next successful load is served and cached.
    let fetched = cache
        .get_or_load_with_meta("k", loader(&calls, Duration::ZERO, Some("new")))
        .await
        .unwrap();
    assert_eq!(
        fetched,
        Fetched {
            value: Some("new".into()),
            served: Served::Loaded
        }
    );
}

#[tokio::test(start_paused = true)]
async fn without_stale_a_failing_loader_is_an_error() {
    let cache = fail_safe_cache(MemoryStore::new());
    let calls = Arc::new(AtomicUsize::new(0));
    let err = cache
        .get_or_load("never-cached", loader(&calls, Duration::ZERO, None))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Loader);
}

#[tokio::test(start_paused = true)]
async fn soft_timeout_serves_stale_at_the_bound_and_the_slow_load_lands_later() {
    let store = MemoryStore::new();
    let cache: Cache<String> = Cache::builder()
        .store(store)
        .ttl(Duration::from_secs(10))
        .max_stale(Duration::from_secs(60))
        .soft_timeout(Duration::from_millis(100))
        .jitter(Jitter::none())
        .early_refresh(EarlyRefresh::none())
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    cache.set("k", &"old".to_string()).await.unwrap();
    tokio::time::advance(Duration::from_secs(11)).await;

    let started = Instant::now();
    let fetched = cache
        .get_or_load_with_meta("k", loader(&calls, Duration::from_secs(1), Some("slow")))
        .await
        .unwrap();
    assert_eq!(fetched.served, stale(StaleReason::SoftTimeout));
    assert_eq!(fetched.value.as_deref(), Some("old"));
    assert_eq!(started.elapsed(), Duration::from_millis(100));

    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(cache.get("k").await.unwrap().as_deref(), Some("slow"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn hard_timeout_is_a_timeout_error_and_never_hangs() {
    let cache: Cache<String> = Cache::builder()
        .load_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let err = cache
        .get_or_load(
            "k",
            loader(&calls, Duration::from_secs(3600), Some("never")),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert_eq!(started.elapsed(), Duration::from_secs(2));
    assert_eq!(
        err.to_string(),
        "timed out: the loader did not finish within load_timeout (2s)"
    );
}

#[tokio::test(start_paused = true)]
async fn early_refresh_refreshes_a_fresh_key_in_the_background() {
    let cache: Cache<String> = Cache::builder()
        .ttl(Duration::from_secs(10))
        .jitter(Jitter::none())
        .early_refresh(EarlyRefresh::after_fraction(0.5))
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    cache.set("k", &"v1".to_string()).await.unwrap();
    tokio::time::advance(Duration::from_secs(4)).await;
    let fetched = cache
        .get_or_load_with_meta("k", loader(&calls, Duration::from_millis(10), Some("v2")))
        .await
        .unwrap();
    assert_eq!(fetched.served, Served::Hit);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "refreshed before half the TTL"
    );

    tokio::time::advance(Duration::from_secs(2)).await; // 6 s: past half
    let fetched = cache
        .get_or_load_with_meta("k", loader(&calls, Duration::from_millis(10), Some("v2")))
        .await
        .unwrap();
    assert_eq!(
        fetched,
        Fetched {
            value: Some("v1".into()),
            served: Served::Hit
        }
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(
        cache.get("k").await.unwrap().as_deref(),
        Some("v2"),
        "never went stale"
    );
}

#[tokio::test(start_paused = true)]
async fn xfetch_refreshes_a_hot_key_before_it_expires() {
    // δ = 100 ms (the load's duration, kept in the envelope), β = 1: reads
    // every 10 ms near expiry trigger a refresh before the fresh window ends.
    let cache: Cache<String> = Cache::builder()
        .ttl(Duration::from_secs(10))
        .jitter(Jitter::none())
        .early_refresh(EarlyRefresh::xfetch(1.0))
        .rng_seed(2015)
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let mut early = 0;
    for cycle in 0..20 {
        let value = format!("v{cycle}");
        let fetched = cache
            .get_or_load_with_meta(
                "hot",
                loader(&calls, Duration::from_millis(100), Some(&value)),
            )
            .await
            .unwrap();
        assert!(
            matches!(fetched.served, Served::Loaded | Served::Hit),
            "{fetched:?}"
        );
        // Read every 10 ms until a refresh has landed or the key went stale.
        let loads_before = calls.load(Ordering::SeqCst);
        loop {
            tokio::time::advance(Duration::from_millis(10)).await;
            let f = cache
                .get_or_load_with_meta(
                    "hot",
                    loader(&calls, Duration::from_millis(100), Some(&value)),
                )
                .await
                .unwrap();
            if calls.load(Ordering::SeqCst) > loads_before {
                early += usize::from(f.served == Served::Hit);
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await; // let the refresh land
    }
    assert_eq!(early, 20, "every cycle refreshed while still fresh");
}

#[tokio::test(start_paused = true)]
async fn per_call_options_override_the_cache_defaults() {
    use breakwater_cache::Store;
    let store = MemoryStore::new();
    let cache: Cache<String> = Cache::builder()
        .store(store.clone())
        .ttl(Duration::from_secs(300))
        .jitter(Jitter::none())
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    cache
        .entry("short")
        .ttl(Duration::from_secs(5))
        .get_or_load(loader(&calls, Duration::ZERO, Some("v")))
        .await
        .unwrap();
    let raw = cache.storage_key(b"short").unwrap();
    assert_eq!(store.ttl(&raw).await.unwrap(), Some(Duration::from_secs(5)));

    let err = cache
        .entry("bad")
        .jitter(Jitter::ratio(2.0))
        .get_or_load(loader(&calls, Duration::ZERO, Some("v")))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid configuration: jitter ratio must be in 0..=1, got 2"
    );
    let err = cache
        .entry("bad")
        .grace(Duration::from_secs(60))
        .max_stale(Duration::from_secs(30))
        .get_or_load(loader(&calls, Duration::ZERO, Some("v")))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid configuration: grace (60s) must not exceed max_stale (30s)"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn no_grace_means_no_stale_value_ever() {
    // Data that must not be stale: grace 0 and Jitter::down give a strict
    // maximum age of the TTL.
    let cache: Cache<String> = Cache::builder()
        .ttl(Duration::from_secs(300))
        .jitter(Jitter::down(0.2))
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    cache.set("stock", &"3".to_string()).await.unwrap();
    tokio::time::advance(Duration::from_secs(300)).await;
    let fetched = cache
        .get_or_load_with_meta("stock", loader(&calls, Duration::ZERO, None))
        .await;
    assert!(fetched.unwrap_err().is_loader(), "a stale value was served");
}

/// Two caches over one Redis whose local wall clocks are ten minutes apart
/// agree on what is fresh, stale and expired: every verdict uses Redis's
/// clock.
#[tokio::test]
async fn caches_with_skewed_clocks_agree() {
    let server = RedisServer::start();
    let cache = |skew_ms: i64| {
        let config = RedisStoreConfig::default().wall_clock(Arc::new(SkewedClock::new(skew_ms)));
        let store = RedisStore::connect_with(&server.url(), config).unwrap();
        Cache::<String>::builder()
            .namespace("skew")
            .store(store)
            .ttl(Duration::from_millis(1_000))
            .grace(Duration::from_millis(1_000))
            .jitter(Jitter::none().with_floor(Duration::from_millis(1)))
            .early_refresh(EarlyRefresh::none())
            .build()
            .unwrap()
    };
    let ahead = cache(5 * 60 * 1000);
    let behind = cache(-5 * 60 * 1000);
    let calls = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let fetched = ahead
        .get_or_load_with_meta("k", loader(&calls, Duration::ZERO, Some("v")))
        .await
        .unwrap();
    assert_eq!(fetched.served, Served::Loaded);

    // Within the fresh window (checked at ~0.5 s, margins of 0.5 s each way).
    tokio::time::sleep_until(started + Duration::from_millis(500)).await;
    for cache in [&ahead, &behind] {
        let f = cache
            .get_or_load_with_meta("k", loader(&calls, Duration::ZERO, Some("x")))
            .await;
        assert_eq!(f.unwrap().served, Served::Hit);
    }
    // Inside grace (~1.5 s): both serve stale while refreshing. Use a failing
    // loader so the refresh does not change the entry under the second look.
    tokio::time::sleep_until(started + Duration::from_millis(1_500)).await;
    for cache in [&ahead, &behind] {
        let f = cache
            .get_or_load_with_meta("k", loader(&calls, Duration::from_secs(5), None))
            .await;
        let f = f.unwrap();
        assert!(matches!(f.served, Served::Stale { .. }), "{f:?}");
        assert_eq!(f.value.as_deref(), Some("v"));
    }
    // Past grace (~2.5 s): expired for both; the value is gone from Redis.
    tokio::time::sleep_until(started + Duration::from_millis(2_500)).await;
    for cache in [&ahead, &behind] {
        assert_eq!(cache.get("k").await.unwrap(), None);
    }
    assert_eq!(server.command(&["EXISTS", "bw:skew:v:{k}"]).unwrap(), "0");
}

/// A reading of the wall clock taken before Redis's clock is known (a
/// direct load while Redis is down at boot) does not pin the store's clock:
/// once sampled, it is Redis's time, even with the application clock an hour
/// ahead.
#[tokio::test]
async fn an_early_wall_clock_reading_does_not_freeze_the_store_clock() {
    let server = RedisServer::start();
    let hour: i64 = 3_600_000;
    let config = RedisStoreConfig::default().wall_clock(Arc::new(SkewedClock::new(hour)));
    let store = RedisStore::connect_with(&server.url(), config).unwrap();
    let early = store.now_ms();
    store.warm_up().await.unwrap();
    let redis_ms = |server: &RedisServer| {
        let time = server.command(&["TIME"]).unwrap();
        let secs: u64 = time.lines().next().unwrap().parse().unwrap();
        secs * 1000
    };
    let before = redis_ms(&server);
    let now = store.now_ms();
    assert!(
        now + 1_000 < early,
        "the early reading ({early}) pinned the clock ({now})"
    );
    assert!(
        now.abs_diff(before) < 2_000,
        "store {now} vs redis {before}"
    );
}

/// Fail-safe reaches L1: the store lost the entry (evicted, restarted
/// empty, flushed) while the database fails, and the L1 copy, past its
/// fresh time but inside `max_stale`, stands in for the failed load, for
/// `get_or_load` and `get_many` alike; past `max_stale` it does not.
#[tokio::test(start_paused = true)]
async fn a_failed_load_is_answered_from_l1_when_the_store_lost_the_entry() {
    let store = MemoryStore::new();
    let cache = Cache::<String>::builder()
        .namespace("failsafe-l1")
        .store(store.clone())
        .ttl(Duration::from_secs(10))
        .max_stale(Duration::from_secs(3600))
        .jitter(Jitter::none())
        .early_refresh(EarlyRefresh::none())
        .l1(breakwater_cache::L1Config::new())
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    for key in ["a", "b"] {
        cache
            .get_or_load(key, loader(&calls, Duration::ZERO, Some("v1")))
            .await
            .unwrap();
    }
    for key in ["a", "b"] {
        assert!(
            store
                .delete(&cache.storage_key(key).unwrap())
                .await
                .unwrap()
        );
    }
    tokio::time::advance(Duration::from_secs(11)).await;
    let down = loader(&calls, Duration::ZERO, None);
    let got = cache
        .get_or_load_with_meta("a", down.clone())
        .await
        .unwrap();
    assert_eq!(got.value.as_deref(), Some("v1"));
    assert_eq!(
        got.served,
        Served::Stale {
            reason: StaleReason::LoaderFailed
        }
    );
    // Throttled after the failure: the copy answers without a load.
    let before = calls.load(Ordering::SeqCst);
    let again = cache
        .get_or_load_with_meta("a", down.clone())
        .await
        .unwrap();
    assert_eq!(again.value.as_deref(), Some("v1"));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        before,
        "no load while throttled"
    );
    let many = cache
        .get_many_with_meta(["b".to_string()], |_keys: Vec<String>| async {
            Err::<Vec<(String, String)>, _>(DbDown)
        })
        .await;
    let b = many[0].as_ref().unwrap();
    assert_eq!(b.value.as_deref(), Some("v1"), "{many:?}");
    assert!(matches!(b.served, Served::Stale { .. }), "{many:?}");
    // Past max_stale nothing stands in.
    tokio::time::advance(Duration::from_secs(3600)).await;
    let err = cache.get_or_load_with_meta("a", down).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Loader, "{err}");
}

//! The composed cache on the memory store, driven by paused tokio time.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use breakwater_cache::testing::CountingStore;
use breakwater_cache::{Cache, Codec, Compression, ErrorKind, Jitter, MemoryStore, Store};
use serde::{Deserialize, Serialize};
use support::DbDown;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Product {
    id: u64,
    name: String,
    price_cents: i64,
}

fn product(id: u64) -> Product {
    Product {
        id,
        name: format!("product {id}"),
        price_cents: 1999,
    }
}

fn cache(store: &MemoryStore) -> Cache<Product> {
    Cache::builder()
        .namespace("catalog")
        .store(store.clone())
        .ttl(Duration::from_secs(300))
        .jitter(Jitter::ratio(0.2))
        .rng_seed(7)
        .build()
        .unwrap()
}

/// A loader that counts its calls.
fn counting(
    calls: &Arc<AtomicUsize>,
    value: Option<Product>,
) -> impl Fn() -> std::future::Ready<Result<Option<Product>, DbDown>> + Clone + Send + Sync + 'static
{
    let calls = Arc::clone(calls);
    move || {
        calls.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(value.clone()))
    }
}

#[tokio::test(start_paused = true)]
async fn get_or_load_loads_once_then_hits_until_the_jittered_ttl_ends() {
    let store = MemoryStore::new();
    let cache = cache(&store);
    let calls = Arc::new(AtomicUsize::new(0));

    let v = cache
        .get_or_load("p:1", counting(&calls, Some(product(1))))
        .await
        .unwrap();
    assert_eq!(v, Some(product(1)));
    let v = cache
        .get_or_load("p:1", counting(&calls, Some(product(2))))
        .await
        .unwrap();
    assert_eq!(v, Some(product(1)), "second call must be a hit");
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // The TTL lies inside ratio(0.2) of 300 s.
    let raw = cache.storage_key(b"p:1").unwrap();
    let ttl = store.ttl(&raw).await.unwrap().unwrap();
    assert!(
        ttl >= Duration::from_secs(240) && ttl <= Duration::from_secs(360),
        "{ttl:?}"
    );

    // Just before it ends: still a hit. At the end: a miss, loaded again.
    tokio::time::advance(ttl - Duration::from_millis(1)).await;
    assert_eq!(cache.get("p:1").await.unwrap(), Some(product(1)));
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(cache.get("p:1").await.unwrap(), None);
    let v = cache
        .get_or_load("p:1", counting(&calls, Some(product(2))))
        .await
        .unwrap();
    assert_eq!(v, Some(product(2)));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn not_found_is_cached_as_a_negative_entry_for_the_negative_ttl() {
    let store = MemoryStore::new();
    let cache: Cache<Product> = Cache::builder()
        .store(store.clone())
        .ttl(Duration::from_secs(300))
        .negative_ttl(Duration::from_secs(10))
        .jitter(Jitter::none())
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));

    assert_eq!(
        cache
            .get_or_load("gone", counting(&calls, None))
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        cache
            .get_or_load("gone", counting(&calls, None))
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the negative entry was not used"
    );
    assert_eq!(cache.get("gone").await.unwrap(), None);

    let raw = cache.storage_key(b"gone").unwrap();
    assert_eq!(
        store.ttl(&raw).await.unwrap(),
        Some(Duration::from_secs(10))
    );
    tokio::time::advance(Duration::from_secs(10)).await;
    let v = cache
        .get_or_load("gone", counting(&calls, Some(product(9))))
        .await
        .unwrap();
    assert_eq!(v, Some(product(9)));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn loader_errors_reach_the_caller_intact_and_are_not_cached() {
    let cache = cache(&MemoryStore::new());
    let err = cache
        .get_or_load("p:1", || async { Err::<Option<Product>, _>(DbDown) })
        .await
        .unwrap_err();
    assert!(err.is_loader());
    assert!(err.loader_error::<DbDown>().is_some(), "{err:?}");
    assert_eq!(err.to_string(), "loader failed: database is down");

    let calls = Arc::new(AtomicUsize::new(0));
    let v = cache
        .get_or_load("p:1", counting(&calls, Some(product(1))))
        .await
        .unwrap();
    assert_eq!(v, Some(product(1)));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn set_get_invalidate() {
    let cache = cache(&MemoryStore::new());
    assert_eq!(cache.get("p:1").await.unwrap(), None);
    cache.set("p:1", &product(1)).await.unwrap();
    assert_eq!(cache.get("p:1").await.unwrap(), Some(product(1)));
    cache.invalidate("p:1").await.unwrap();
    assert_eq!(cache.get("p:1").await.unwrap(), None);
}

#[tokio::test(start_paused = true)]
async fn every_write_is_jittered_within_bounds() {
    let store = MemoryStore::new();
    let cache = cache(&store);
    let mut ttls = Vec::new();
    for i in 0..1_000u64 {
        let key = format!("p:{i}");
        cache.set(&key, &product(i)).await.unwrap();
        let raw = cache.storage_key(key.as_bytes()).unwrap();
        ttls.push(store.ttl(&raw).await.unwrap().unwrap());
    }
    let (lo, hi) = Jitter::ratio(0.2).bounds(Duration::from_secs(300));
    assert!(ttls.iter().all(|t| *t >= lo && *t <= hi));
    ttls.sort();
    ttls.dedup();
    assert!(
        ttls.len() > 500,
        "TTLs barely vary: {} distinct",
        ttls.len()
    );
}

#[tokio::test(start_paused = true)]
async fn keys_are_namespaced() {
    let store = MemoryStore::new();
    let a: Cache<u32> = Cache::builder()
        .namespace("a")
        .store(store.clone())
        .build()
        .unwrap();
    let b: Cache<u32> = Cache::builder()
        .namespace("b")
        .store(store.clone())
        .build()
        .unwrap();
    a.set("k", &1).await.unwrap();
    assert_eq!(a.get("k").await.unwrap(), Some(1));
    assert_eq!(b.get("k").await.unwrap(), None);
    assert_eq!(a.storage_key(b"k").unwrap(), b"bw:a:v:{k}");
}

#[tokio::test(start_paused = true)]
async fn keys_with_braces_and_binary_bytes_are_distinct_and_stable() {
    let cache: Cache<u32> = Cache::builder().namespace("ns").build().unwrap();
    let keys: [&[u8]; 5] = [b"a}b", b"{a}", b"}", b"\x00\xff", b"a"];
    for (i, key) in keys.iter().enumerate() {
        cache.set(key, &(i as u32)).await.unwrap();
    }
    for (i, key) in keys.iter().enumerate() {
        assert_eq!(cache.get(key).await.unwrap(), Some(i as u32), "{key:?}");
    }
    let raw = cache.storage_key(b"a}b").unwrap();
    assert!(
        raw.starts_with(b"bw:ns:v:{#"),
        "{}",
        String::from_utf8_lossy(&raw)
    );
    assert!(raw.ends_with(b"}a}b"));
}

#[tokio::test(start_paused = true)]
async fn empty_and_absurd_keys_are_rejected_before_the_store() {
    let store = MemoryStore::new();
    let cache: Cache<u32> = Cache::builder()
        .store(store.clone())
        .max_key_len(16)
        .build()
        .unwrap();
    let err = cache.get("").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidKey);
    assert_eq!(err.to_string(), "invalid key: key must not be empty");

    let long = "x".repeat(17);
    let err = cache.set(&long, &1).await.unwrap_err();
    assert!(err.is_invalid_key());
    assert_eq!(
        err.to_string(),
        "invalid key: key is 17 bytes, the limit is 16 (see CacheBuilder::max_key_len)"
    );
    let err = cache
        .get_or_load(&long, || async { Ok::<_, DbDown>(Some(1)) })
        .await
        .unwrap_err();
    assert!(err.is_invalid_key());
    assert!(store.is_empty(), "a rejected key reached the store");
}

#[tokio::test(start_paused = true)]
async fn corrupt_bytes_are_a_miss_never_a_wrong_value() {
    let store = MemoryStore::new();
    let cache = cache(&store);
    let raw = cache.storage_key(b"p:1").unwrap();
    let garbage: [&[u8]; 5] = [
        b"",
        b"not a breakwater entry",
        b"{\"id\":1,\"name\":\"x\",\"price_cents\":1}",
        b"BW\x07\x01\x00",
        b"BW\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x01",
    ];
    for bytes in garbage {
        store
            .set(&raw, bytes, Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(cache.get("p:1").await.unwrap(), None, "{bytes:?}");
        let calls = Arc::new(AtomicUsize::new(0));
        let v = cache
            .get_or_load("p:1", counting(&calls, Some(product(1))))
            .await
            .unwrap();
        assert_eq!(v, Some(product(1)));
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "corrupt bytes were not reloaded"
        );
        assert_eq!(
            cache.get("p:1").await.unwrap(),
            Some(product(1)),
            "reload did not repair"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_value_of_another_type_or_codec_is_a_miss() {
    let store = MemoryStore::new();
    let strings: Cache<String> = Cache::builder()
        .namespace("shared")
        .store(store.clone())
        .build()
        .unwrap();
    strings.set("k", &"text".to_string()).await.unwrap();

    let products: Cache<Product> = Cache::builder()
        .namespace("shared")
        .store(store.clone())
        .build()
        .unwrap();
    assert_eq!(products.get("k").await.unwrap(), None);

    let json: Cache<String> = Cache::builder()
        .namespace("shared")
        .store(store.clone())
        .codec(Codec::json())
        .build()
        .unwrap();
    assert_eq!(
        json.get("k").await.unwrap(),
        None,
        "msgpack bytes read as json"
    );
}

#[tokio::test(start_paused = true)]
async fn large_values_are_compressed_and_round_trip() {
    let store = MemoryStore::new();
    let cache: Cache<Vec<String>> = Cache::builder()
        .store(store.clone())
        .compression(Compression::lz4().threshold(1024))
        .build()
        .unwrap();
    let value: Vec<String> = (0..2_000)
        .map(|i| format!("row {} of a catalog", i % 10))
        .collect();
    cache.set("big", &value).await.unwrap();
    let raw = cache.storage_key(b"big").unwrap();
    let stored = store.get(&raw).await.unwrap().unwrap();
    let plain = rmp_size(&value);
    assert!(
        stored.len() < plain / 2,
        "stored {} bytes for {plain}",
        stored.len()
    );
    assert_eq!(cache.get("big").await.unwrap(), Some(value));
}

fn rmp_size(v: &[String]) -> usize {
    v.iter().map(|s| s.len() + 1).sum::<usize>() + 3
}

#[test]
fn the_key_prefix_starts_every_key_and_is_checked() {
    let cache = Cache::<u32>::builder().namespace("ns").build().unwrap();
    assert_eq!(cache.storage_key(b"k").unwrap(), b"bw:ns:v:{k}");
    let cache = Cache::<u32>::builder()
        .key_prefix("myapp:")
        .namespace("ns")
        .build()
        .unwrap();
    assert_eq!(cache.storage_key(b"k").unwrap(), b"myapp:ns:v:{k}");
    let braced = cache.storage_key(b"a{b").unwrap();
    assert!(braced.starts_with(b"myapp:ns:v:{#") && braced.ends_with(b"}a{b"));
    let long = format!("{}:", "p".repeat(63));
    let cache = Cache::<u32>::builder().key_prefix(long.as_str()).build();
    assert!(cache.is_ok());

    let msg = |prefix: &str| {
        Cache::<u32>::builder()
            .key_prefix(prefix)
            .build()
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        msg(""),
        "key_prefix must not be empty; the default is \"bw:\""
    );
    assert_eq!(
        msg(&"p".repeat(65)),
        "key_prefix must be at most 64 bytes, got 65"
    );
    for (prefix, found) in [
        ("my{app}:", "'{'"),
        ("app}", "'}'"),
        ("app*", "'*'"),
        ("a?", "'?'"),
        ("a[b]", "'['"),
        ("a\\b", "'\\\\'"),
        ("my app:", "' '"),
        ("app:\n", "'\\n'"),
    ] {
        assert_eq!(
            msg(prefix),
            format!(
                "key_prefix must not contain braces (the keys' hash tags follow it), the ACL \
                 glob characters * ? [ ] \\, whitespace or control characters (found {found} in \
                 {prefix:?})"
            )
        );
    }
}

/// No two distinct (prefix, namespace, version) spell the same keys: the
/// pairs that did are refused with a message that says why.
#[test]
fn look_alike_prefixes_namespaces_and_versions_are_refused() {
    let build = |prefix: &str, ns: &str, version: u32| {
        Cache::<u32>::builder()
            .key_prefix(prefix)
            .namespace(ns)
            .version(version)
            .build()
    };
    // "bw:" + "a:b" is "bw:a:" + "b": the second prefix is refused.
    let ok = build("bw:", "a:b", 0).unwrap();
    assert_eq!(ok.storage_key(b"k").unwrap(), b"bw:a:b:v:{k}");
    for prefix in ["bw:a:", "myapp:cache:", "bw", "bw-"] {
        let err = build(prefix, "b", 0).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!(
                "key_prefix must end with ':' and contain no other ':' (got {prefix:?})"
            )),
            "{err}"
        );
    }
    // Namespace "a@1" at version 0 is namespace "a" at version 1.
    let v1 = build("bw:", "a", 1).unwrap();
    assert_eq!(v1.storage_key(b"k").unwrap(), b"bw:a@1:v:{k}");
    let err = build("bw:", "a@1", 0).unwrap_err().to_string();
    assert!(
        err.starts_with("namespace must not contain '@', which marks a version in the keys"),
        "{err}"
    );
}

#[test]
fn builder_rejects_invalid_settings_with_exact_messages() {
    let msg = |b: breakwater_cache::CacheBuilder<u32>| b.build().unwrap_err().to_string();
    assert_eq!(
        msg(Cache::builder().jitter(Jitter::ratio(1.5))),
        "jitter ratio must be in 0..=1, got 1.5"
    );
    assert_eq!(
        msg(Cache::builder().jitter(Jitter::down(f64::NAN))),
        "jitter ratio must be in 0..=1, got NaN"
    );
    assert_eq!(
        msg(Cache::builder().ttl(Duration::ZERO)),
        "ttl must be at least 1ms, got 0ns"
    );
    assert_eq!(
        msg(Cache::builder().namespace("")),
        "namespace must not be empty"
    );
    assert_eq!(
        msg(Cache::builder().namespace("a{b}")),
        "namespace must not contain braces, whitespace or control characters (found '{' in \"a{b}\")"
    );
    assert_eq!(
        msg(Cache::builder().negative_ttl(Duration::ZERO)),
        "negative_ttl must be at least 1ms, got 0ns"
    );
    assert_eq!(
        msg(Cache::builder().max_key_len(0)),
        "max_key_len must be greater than zero"
    );
    assert_eq!(
        msg(Cache::builder().lease_ttl(Duration::from_millis(5))),
        "lease_ttl must be at least 10ms, got 5ms"
    );
    assert_eq!(
        msg(Cache::builder().lock_wait(Duration::MAX)),
        "lock_wait must be at most 86400s, got 18446744073709551615.999999999s"
    );
    // A wait shorter than the holder's load would start a second load in
    // every waiting process.
    assert_eq!(
        msg(Cache::builder().lock_wait(Duration::from_secs(5))),
        "lock_wait (5s) must be at least queue_wait + load_timeout + lease_ttl (34s) with \
         OnLockTimeout::load_anyway, or every waiting process starts a second load while \
         the holder's is still running; raise lock_wait (or leave it unset), lower \
         load_timeout, or choose OnLockTimeout::serve_stale() or error()"
    );
}

/// Every setting whose arithmetic could overflow (or that makes no sense)
/// has an upper bound, with a message that says what to use instead.
#[test]
fn builder_rejects_settings_past_their_upper_bounds() {
    use breakwater_cache::{
        Backoff, BreakerConfig, EarlyRefresh, L1Config, LimitConfig, RetryConfig,
    };
    let msg = |b: breakwater_cache::CacheBuilder<u32>| b.build().unwrap_err().to_string();
    let max = Duration::MAX;
    let year = Duration::from_secs(365 * 24 * 3600);
    let day = Duration::from_secs(24 * 3600);
    let over = |d: Duration| d + Duration::from_millis(1);
    assert_eq!(
        msg(Cache::builder().ttl(max)),
        format!(
            "ttl must be at most 365 days, got {max:?}; a value kept longer belongs in the \
             database; use at most 365 days"
        )
    );
    assert_eq!(
        msg(Cache::builder().negative_ttl(over(year))),
        "negative_ttl must be at most 365 days, got 31536000.001s; a value kept longer \
         belongs in the database; use at most 365 days"
    );
    assert_eq!(
        msg(Cache::builder().grace(max)),
        format!(
            "grace must be at most 365 days, got {max:?}; use a grace of at most 365 days \
             (Duration::ZERO for none)"
        )
    );
    assert_eq!(
        msg(Cache::builder().max_stale(max)),
        format!(
            "max_stale must be at most 365 days, got {max:?}; use a max_stale of at most 365 days"
        )
    );
    assert_eq!(
        msg(Cache::builder().load_timeout(over(day))),
        "load_timeout must be at most 1 day, got 86400.001s; use a load_timeout of at most 1 day"
    );
    assert_eq!(
        msg(Cache::builder().fail_safe_throttle(max)),
        format!(
            "fail_safe_throttle must be at most 1 day, got {max:?}; use a throttle of at most \
             1 day (the default is 5s)"
        )
    );
    assert_eq!(
        msg(Cache::builder().jitter(Jitter::fixed(max))),
        format!(
            "jitter spread must be at most 365 days, got {max:?}; use a spread well below the \
             TTL, or Jitter::ratio"
        )
    );
    assert_eq!(
        msg(Cache::builder().jitter(Jitter::up_to(max))),
        format!(
            "jitter spread must be at most 365 days, got {max:?}; use a spread well below the \
             TTL, or Jitter::ratio"
        )
    );
    assert_eq!(
        msg(Cache::builder().early_refresh(EarlyRefresh::xfetch(1e6))),
        "xfetch beta must be at most 100, got 1000000; use 1 (the default) or a little more \
         for earlier refreshes"
    );
    assert_eq!(
        msg(Cache::builder().max_key_len(usize::MAX)),
        format!(
            "max_key_len must be at most 65536 bytes, got {}; hash longer keys into a short one",
            usize::MAX
        )
    );
    assert_eq!(
        msg(Cache::builder().l1(L1Config::new().ttl(max).keep(max))),
        format!(
            "l1 ttl must be at most 365 days, got {max:?}; use an l1 ttl of seconds to minutes \
             (the default is 30s)"
        )
    );
    assert_eq!(
        msg(Cache::builder().l1(L1Config::new().keep(max))),
        format!(
            "l1 keep must be at most 365 days, got {max:?}; use an l1 keep of at most 365 days \
             (the default is 10 min)"
        )
    );
    assert_eq!(
        msg(Cache::builder().l1(L1Config::new().entries(u64::MAX))),
        format!(
            "l1 entries must be at most 100000000, got {}; an in-process cache that large \
             belongs in the store, use fewer entries",
            u64::MAX
        )
    );
    assert_eq!(
        msg(Cache::builder().store_breaker(BreakerConfig::new().cool_down(max))),
        format!(
            "breaker cool-down must be at most 1 day, got {max:?}; use seconds to minutes (the \
             default is 5s)"
        )
    );
    assert_eq!(
        msg(Cache::builder().breaker(BreakerConfig::new().failure_ratio(0.5, max, 10))),
        format!(
            "breaker failure window must be at most 1 day, got {max:?}; use seconds to minutes, \
             e.g. 30s"
        )
    );
    assert_eq!(
        msg(Cache::builder().breaker(BreakerConfig::new().half_open_probes(u32::MAX))),
        format!(
            "breaker half-open probes must be at most 1000, got {}; a few probes tell whether \
             the origin is back",
            u32::MAX
        )
    );
    assert_eq!(
        msg(Cache::builder().limit(LimitConfig::new().max_concurrent(u32::MAX))),
        format!(
            "max concurrent loads must be at most 1000000, got {}; use what the database can \
             serve at once",
            u32::MAX
        )
    );
    assert_eq!(
        msg(Cache::builder().limit(LimitConfig::new().rate(u32::MAX, 1))),
        format!(
            "load rate must be at most 1000000 per second, got {}; leave rate unset for no limit",
            u32::MAX
        )
    );
    assert_eq!(
        msg(Cache::builder().limit(LimitConfig::new().rate(10, u32::MAX))),
        format!(
            "load burst must be at most 1000000, got {}; use at most the rate",
            u32::MAX
        )
    );
    assert_eq!(
        msg(Cache::builder().limit(LimitConfig::new().queue_wait(max))),
        format!(
            "queue wait must be at most 1 day, got {max:?}; use milliseconds to seconds (the \
             default is 1s)"
        )
    );
    assert_eq!(
        msg(Cache::builder().retry(RetryConfig::new().max_attempts(u32::MAX))),
        format!(
            "retry max attempts must be at most 100, got {}; a few attempts (load_timeout \
             bounds them all together) are enough",
            u32::MAX
        )
    );
    assert_eq!(
        msg(Cache::builder().retry(
            RetryConfig::new().backoff(Backoff::full_jitter(Duration::from_millis(100), max))
        )),
        format!(
            "backoff cap must be at most 1 day, got {max:?}; use seconds (load_timeout bounds \
             the retries anyway)"
        )
    );
    assert_eq!(
        msg(Cache::builder().compression(Compression::lz4().max_decompressed(usize::MAX))),
        format!(
            "max decompressed size must be at most 1073741824 bytes (1 GiB), got {}; use the \
             default (64 MiB) or the largest value you cache",
            usize::MAX
        )
    );
    // Each bound itself is accepted.
    Cache::<u32>::builder()
        .ttl(year)
        .negative_ttl(year)
        .grace(year)
        .max_stale(year)
        .jitter(Jitter::up_to(year))
        .load_timeout(Duration::from_secs(3600))
        .fail_safe_throttle(day)
        .early_refresh(EarlyRefresh::xfetch(100.0))
        .max_key_len(64 * 1024)
        .l1(L1Config::new().ttl(year).keep(year).entries(100_000_000))
        .store_breaker(BreakerConfig::new().cool_down(day))
        .build()
        .unwrap();
}

#[test]
fn safe_lease_settings_are_accepted() {
    use breakwater_cache::OnLockTimeout;
    let ok = |b: breakwater_cache::CacheBuilder<u32>| b.build().map(drop);
    ok(Cache::builder()).unwrap();
    ok(Cache::builder()
        .load_timeout(Duration::from_secs(2))
        .lock_wait(Duration::from_secs(6)))
    .unwrap();
    // Other policies never load on a timeout: any wait is safe.
    ok(Cache::builder()
        .lock_wait(Duration::from_millis(200))
        .on_lock_timeout(OnLockTimeout::serve_stale()))
    .unwrap();
    ok(Cache::builder()
        .lock_wait(Duration::from_millis(200))
        .on_lock_timeout(OnLockTimeout::error()))
    .unwrap();
}

#[tokio::test(start_paused = true)]
async fn concurrent_reads_of_one_key_share_one_get() {
    let store = CountingStore::slow(MemoryStore::new(), Duration::from_millis(10));
    let cache: Cache<Product> = Cache::builder().store(store.clone()).build().unwrap();
    cache.set("p:1", &product(1)).await.unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..100 {
        let cache = cache.clone();
        let loader = counting(&calls, Some(product(2)));
        tasks.push(tokio::spawn(async move {
            cache.get_or_load("p:1", loader).await
        }));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap(), Some(product(1)));
    }
    // (And the namespace's clear record, read once by the process.)
    assert_eq!(store.gets(), 2, "100 concurrent hits, one GET");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// The caller leading a shared read (it runs in that caller's own task) is
/// cancelled while its `GET` is on the way: the callers that joined the read
/// are neither failed nor sent to the loader; one of them reads again, and
/// all get the stored value. (A follower that took the leader's going away
/// for a store failure would load directly.)
#[tokio::test(start_paused = true)]
async fn followers_of_a_cancelled_read_read_again() {
    let store = CountingStore::slow(MemoryStore::new(), Duration::from_millis(100));
    let cache: Cache<Product> = Cache::builder().store(store.clone()).build().unwrap();
    cache.set("p:1", &product(1)).await.unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let leader = tokio::spawn({
        let (cache, loader) = (cache.clone(), counting(&calls, Some(product(2))));
        async move { cache.get_or_load("p:1", loader).await }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    let mut followers = Vec::new();
    for _ in 0..10 {
        let (cache, loader) = (cache.clone(), counting(&calls, Some(product(2))));
        followers.push(tokio::spawn(async move {
            cache.get_or_load("p:1", loader).await
        }));
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    leader.abort();
    for follower in followers {
        assert_eq!(follower.await.unwrap().unwrap(), Some(product(1)));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0, "nobody loaded");
    // (And the namespace's clear record, read once by the process.)
    assert_eq!(store.gets(), 3, "the cancelled read, then one more");
}

#[tokio::test(start_paused = true)]
async fn get_is_served_by_l1_once_it_has_read_a_value() {
    let store = CountingStore::new(MemoryStore::new());
    let writer: Cache<Product> = Cache::builder().store(store.clone()).build().unwrap();
    let reader: Cache<Product> = Cache::builder()
        .store(store.clone())
        .l1(breakwater_cache::L1Config::new())
        .build()
        .unwrap();
    writer.set("p:1", &product(1)).await.unwrap();
    assert_eq!(reader.get("p:1").await.unwrap(), Some(product(1)));
    // (And each process reads the namespace's clear record once.)
    assert_eq!(store.gets(), 3, "the first get reads the store");
    for _ in 0..3 {
        assert_eq!(reader.get("p:1").await.unwrap(), Some(product(1)));
    }
    assert_eq!(store.gets(), 3, "later gets are L1 hits");
    // Without L1, every get reads the store.
    assert_eq!(writer.get("p:1").await.unwrap(), Some(product(1)));
    assert_eq!(store.gets(), 4);
    // An invalid key is still refused before L1.
    assert!(reader.get("").await.unwrap_err().is_invalid_key());
}

/// A loader of the value 7.
async fn seven() -> Result<Option<u64>, std::io::Error> {
    Ok(Some(7))
}

/// A cache with L1 on, its key `hot` loaded (7, by [`seven`]) and in L1.
async fn hot_in_l1() -> Cache<u64> {
    let cache = Cache::<u64>::builder()
        .l1(breakwater_cache::L1Config::new().ttl(Duration::from_secs(60)))
        .ttl(Duration::from_secs(3600))
        .build()
        .unwrap();
    cache.get_or_load("hot", seven).await.unwrap();
    cache
}

/// A task serving L1 hits in a loop on a current-thread runtime (the one
/// thread a small service has) still lets a 10 ms timer fire: an L1 hit
/// takes tokio's cooperative budget and yields when it is spent. Before, the
/// loop never yielded and the timer fired only when the loop ended (here
/// after its 2 s cap; in a benchmark, when the L1 TTL ran out).
#[test]
fn a_loop_of_l1_hits_lets_a_timer_fire() {
    use std::sync::atomic::AtomicBool;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let cache = hot_in_l1().await;
        let stop = Arc::new(AtomicBool::new(false));
        let hits = tokio::spawn({
            let (cache, stop) = (cache.clone(), Arc::clone(&stop));
            async move {
                let started = std::time::Instant::now();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(2) {
                    assert_eq!(cache.get_or_load("hot", seven).await.unwrap(), Some(7));
                    n += 1;
                }
                n
            }
        });
        let started = std::time::Instant::now();
        tokio::time::sleep(Duration::from_millis(10)).await;
        let fired = started.elapsed();
        stop.store(true, Ordering::Relaxed);
        let n = hits.await.unwrap();
        eprintln!("10 ms timer fired after {fired:?} beside {n} L1 hits");
        assert!(n > 0, "the hits ran");
        // Measured: 10.7 ms (2.0 s before). The bound leaves room for a
        // loaded CI machine descheduling the thread; a starving loop is
        // caught either way.
        assert!(
            fired < Duration::from_millis(100),
            "the timer fired after {fired:?}: the hits starve the runtime"
        );
    });
}

/// An L1 hit dropped while it yields for tokio's cooperative budget was not
/// served, and is not counted: the request counts (`Stats::l1_hits`, the
/// `served="l1_hit"` counter) match the hits that returned.
#[tokio::test(flavor = "current_thread")]
async fn an_l1_hit_dropped_while_it_yields_is_not_counted() {
    use std::future::Future;
    use std::task::Poll;
    let cache = hot_in_l1().await;
    let before = cache.stats().l1_hits;
    let (returned, dropped) = std::future::poll_fn(|cx| {
        // Spend the task's budget: from now on every unit taken yields.
        while std::pin::pin!(tokio::task::coop::consume_budget())
            .poll(cx)
            .is_ready()
        {}
        let (mut returned, mut dropped) = (0u64, 0u64);
        // Every few hits take a unit; those yield here and are dropped.
        for _ in 0..64 {
            match std::pin::pin!(cache.get_or_load("hot", seven)).poll(cx) {
                Poll::Ready(Ok(Some(7))) => returned += 1,
                Poll::Ready(other) => panic!("unexpected {other:?}"),
                Poll::Pending => dropped += 1,
            }
        }
        Poll::Ready((returned, dropped))
    })
    .await;
    assert!(
        returned > 0 && dropped > 0,
        "{returned} returned, {dropped} dropped"
    );
    assert_eq!(
        cache.stats().l1_hits - before,
        returned,
        "{dropped} dropped hits"
    );
}

/// Integer ids are keys as they are (their decimal digits), in every call
/// that takes a key, with L1 on so the near cache is keyed the same way.
#[tokio::test(start_paused = true)]
async fn integer_keys_need_no_format() {
    let cache: Cache<Product> = Cache::builder()
        .l1(breakwater_cache::L1Config::new())
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let load = |id: u64| {
        let calls = Arc::clone(&calls);
        move || {
            calls.fetch_add(1, Ordering::SeqCst);
            async move { Ok::<_, DbDown>(Some(product(id))) }
        }
    };
    let id: u64 = 42;
    assert_eq!(
        cache.get_or_load(id, load(id)).await.unwrap(),
        Some(product(42))
    );
    assert_eq!(cache.get("42").await.unwrap(), Some(product(42)), "one key");
    assert_eq!(cache.get(42i8).await.unwrap(), Some(product(42)));
    let fetched = cache.get_or_load_with_meta(42u128, load(id)).await.unwrap();
    assert_eq!(fetched.served, breakwater_cache::Served::L1Hit);
    cache.invalidate(42usize).await.unwrap();
    assert_eq!(cache.get(id).await.unwrap(), None);
    cache.set(-1i64, &product(1)).await.unwrap();
    assert_eq!(cache.get("-1").await.unwrap(), Some(product(1)));
    cache
        .set_many((0u32..3).map(|i| (i, product(u64::from(i)))))
        .await
        .unwrap();
    assert_eq!(cache.get(b"2").await.unwrap(), Some(product(2)));
    let entry = cache.entry(7u16).ttl(Duration::from_secs(1));
    assert_eq!(entry.get_or_load(load(7)).await.unwrap(), Some(product(7)));
    let report = cache
        .warm(
            [7u64, 8],
            |id: u64| async move { Ok::<_, DbDown>(Some(product(id))) },
            breakwater_cache::Warm::new(),
        )
        .await
        .unwrap();
    assert_eq!((report.loaded, report.cached), (1, 1));
    assert_eq!(
        cache.inspect(8u8).await.unwrap().storage_key,
        b"bw:default:v:{8}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// Reads queued for one batch whose runtime shut down before the batch went
/// out (its task dropped unrun) do not leave the cache's read queue stuck:
/// reads from another runtime afterwards are answered.
#[test]
fn reads_queued_on_a_runtime_that_shut_down_leave_the_queue_working() {
    let store = CountingStore::slow(MemoryStore::new(), Duration::from_millis(50)).batching_reads();
    let cache: Cache<String> = Cache::builder().store(store).build().unwrap();
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let first = runtime();
    first.block_on(async {
        for i in 0..10 {
            cache.set(format!("k{i}"), &format!("v{i}")).await.unwrap();
        }
        for i in 0..10 {
            let cache = cache.clone();
            tokio::spawn(async move { cache.get(format!("k{i}")).await });
        }
        // The reads start (4 in the air, the rest queued); the runtime
        // goes before their batch is sent.
        tokio::task::yield_now().await;
    });
    drop(first);
    runtime().block_on(async {
        let reads = (0..10).map(|i| {
            let cache = cache.clone();
            async move { cache.get(format!("k{i}")).await }
        });
        let got = tokio::time::timeout(
            Duration::from_secs(10),
            futures_util::future::join_all(reads),
        )
        .await
        .expect("no read waits forever");
        for (i, got) in got.into_iter().enumerate() {
            assert_eq!(got.unwrap(), Some(format!("v{i}")), "k{i}");
        }
    });
}

//! Limits on a real, private `redis-server`: TTLs past what Redis accepts,
//! values past `max_value_size`.

mod support;

use std::time::Duration;

use breakwater_cache::{LeaseAttempt, Store};
use support::redis_store;

/// Redis refuses a `PX` that overflows its clock ("invalid expire time"):
/// the store cuts an endless TTL to ten years instead of failing the write.
#[tokio::test]
async fn an_endless_ttl_is_cut_to_what_redis_accepts() {
    let (_server, store) = redis_store().await;
    store.set(b"k", b"v", Duration::MAX).await.unwrap();
    assert_eq!(store.get(b"k").await.unwrap(), Some(b"v".to_vec()));
    let ttl = store.ttl(b"k").await.unwrap().unwrap();
    assert!(ttl > Duration::from_secs(9 * 365 * 24 * 3600), "{ttl:?}");
    let attempt = store.acquire_lease(b"l", b"t", Duration::MAX).await;
    assert!(matches!(attempt, Ok(LeaseAttempt::Acquired)), "{attempt:?}");
    assert!(store.extend_lease(b"l", b"t", Duration::MAX).await.unwrap());
}

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use breakwater_cache::{
    Cache, Compression, L1Config, MemoryStore, RedisStore, RedisStoreConfig, Stored,
};
use support::RedisServer;
use tokio::time::Instant;

/// A cache whose entries may be at most 4 KiB, uncompressed.
fn capped(store: &Arc<MemoryStore>, l1: bool) -> Cache<String> {
    let builder = Cache::builder()
        .namespace("capped")
        .shared_store(Arc::clone(store) as Arc<dyn Store>)
        .max_value_size(4096)
        .compression(Compression::none());
    let builder = if l1 {
        builder.l1(L1Config::new())
    } else {
        builder
    };
    builder.build().unwrap()
}

fn big() -> String {
    "x".repeat(10_000)
}

#[tokio::test(start_paused = true)]
async fn set_of_a_value_past_max_value_size_is_a_typed_error_and_writes_nothing() {
    let store = Arc::new(MemoryStore::new());
    let cache = capped(&store, false);
    let err = cache.set("k", &big()).await.unwrap_err();
    assert!(err.is_too_large(), "{err}");
    assert_eq!(err.kind(), breakwater_cache::ErrorKind::TooLarge);
    assert!(
        err.to_string()
            .starts_with("value too large: the serialized value is at least 100"),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("above max_value_size (4096 bytes)"),
        "{err}"
    );
    assert!(matches!(
        cache.inspect("k").await.unwrap().stored,
        Stored::Missing
    ));
    assert_eq!(cache.get("k").await.unwrap(), None);
    // A value that fits is written as before.
    cache.set("k", &"small".to_owned()).await.unwrap();
    assert_eq!(cache.get("k").await.unwrap().as_deref(), Some("small"));
}

#[tokio::test(start_paused = true)]
async fn a_loaded_value_past_max_value_size_is_returned_but_not_cached() {
    for l1 in [false, true] {
        let store = Arc::new(MemoryStore::new());
        let cache = capped(&store, l1);
        let calls = Arc::new(AtomicUsize::new(0));
        let loader = {
            let calls = Arc::clone(&calls);
            move || {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, std::io::Error>(Some(big())) }
            }
        };
        for round in 1..=2 {
            let fetched = cache
                .get_or_load_with_meta("k", loader.clone())
                .await
                .unwrap();
            assert_eq!(fetched.value, Some(big()));
            assert_eq!(fetched.served, breakwater_cache::Served::Loaded);
            assert_eq!(calls.load(Ordering::SeqCst), round, "l1 {l1}: not cached");
        }
        let inspection = cache.inspect("k").await.unwrap();
        assert!(matches!(inspection.stored, Stored::Missing), "l1 {l1}");
        assert!(!inspection.lease_held, "l1 {l1}: the lease is released");
        assert_eq!(cache.get("k").await.unwrap(), None);
    }
}

/// The lease is released with a message, so a process waiting on it loads
/// at once instead of waiting for the lease to run out.
#[tokio::test(start_paused = true)]
async fn waiters_on_a_value_too_large_to_cache_are_told() {
    let store = Arc::new(MemoryStore::new());
    let holder = capped(&store, false);
    let waiter = capped(&store, false);
    let slow = tokio::spawn(async move {
        holder
            .get_or_load("k", || async {
                tokio::time::sleep(Duration::from_secs(1)).await;
                Ok::<_, std::io::Error>(Some(big()))
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    let started = Instant::now();
    let value = waiter
        .get_or_load("k", || async { Ok::<_, std::io::Error>(Some(big())) })
        .await
        .unwrap();
    assert_eq!(value, Some(big()));
    // Woken by the release at ~1 s; the lease would have lasted 3 s more.
    assert!(
        started.elapsed() < Duration::from_millis(1_500),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(slow.await.unwrap().unwrap(), Some(big()));
}

#[test]
fn values_too_large_to_cache_are_counted() {
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let store = Arc::new(MemoryStore::new());
            let cache = capped(&store, false);
            assert!(cache.set("a", &big()).await.unwrap_err().is_too_large());
            let loaded = cache
                .get_or_load("b", || async { Ok::<_, std::io::Error>(Some(big())) })
                .await
                .unwrap();
            assert_eq!(loaded, Some(big()));
        });
    });
    let counted: u64 = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == "breakwater_too_large_total")
        .map(|(.., value)| match value {
            metrics_util::debugging::DebugValue::Counter(n) => n,
            _ => 0,
        })
        .sum();
    assert_eq!(counted, 2);
}

/// 64 MB of text that compresses poorly (LZ4 keeps most of it).
fn noise(len: usize) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let bytes: Vec<u8> = (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ALPHABET[(state >> 58) as usize]
        })
        .collect();
    String::from_utf8(bytes).unwrap()
}

/// A 64 MB value on a real Redis with default settings: `set` fails with
/// `TooLarge`, `get_or_load` returns it without caching it, both without
/// sending it to Redis (before: "redis did not answer in time" after
/// seconds, and nothing cached).
#[tokio::test]
async fn a_64_mb_value_is_refused_without_reaching_redis() {
    let server = RedisServer::start();
    let config = RedisStoreConfig::default();
    let store = RedisStore::connect_with(&server.url(), config).unwrap();
    store.warm_up().await.unwrap();
    let cache: Cache<String> = Cache::builder()
        .namespace("huge")
        .store(store.clone())
        .build()
        .unwrap();
    let value = Arc::new(noise(64 << 20));

    let started = Instant::now();
    let err = cache.set("huge", &value).await.unwrap_err();
    let set_took = started.elapsed();
    assert!(err.is_too_large(), "{err}");

    let calls = Arc::new(AtomicUsize::new(0));
    let loader = {
        let (calls, value) = (Arc::clone(&calls), Arc::clone(&value));
        move || {
            calls.fetch_add(1, Ordering::SeqCst);
            let value = String::clone(&value);
            async move { Ok::<_, std::io::Error>(Some(value)) }
        }
    };
    let started = Instant::now();
    let loaded = cache.get_or_load("huge", loader.clone()).await.unwrap();
    let load_took = started.elapsed();
    assert_eq!(loaded.as_deref().map(str::len), Some(64 << 20));
    let inspection = cache.inspect("huge").await.unwrap();
    assert!(matches!(inspection.stored, Stored::Missing));
    assert!(!inspection.lease_held);
    cache.get_or_load("huge", loader).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 2, "not cached");
    eprintln!("64 MB: set refused in {set_took:?}, get_or_load returned in {load_took:?}");
    // Nothing is sent to Redis, and serialization stops at max_value_size:
    // a 64 MB string is refused without being copied (set: 0.1 ms; the load
    // 0.11 s, the loader's own 64 MB clone, in a debug build); before, one
    // call took 4.7 s and failed. The bound is loose on purpose (a slow
    // machine must not fail it); the figures are printed above.
    let deadline = config_deadline() + Duration::from_millis(1_500);
    assert!(set_took < deadline, "set took {set_took:?}");
    assert!(load_took < deadline, "get_or_load took {load_took:?}");
}

/// One store deadline with default settings: `connect_timeout +
/// response_timeout`.
fn config_deadline() -> Duration {
    Duration::from_millis(500 + 50)
}

#[test]
fn max_value_size_is_checked_by_build() {
    let msg = |bytes| {
        Cache::<String>::builder()
            .max_value_size(bytes)
            .build()
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        msg(0),
        "max_value_size must be at least 1024 bytes, got 0; use the default (16 MiB) or the \
         largest value you cache"
    );
    assert_eq!(
        msg(usize::MAX),
        format!(
            "max_value_size must be at most 536869888 bytes (512 MiB, Redis's largest string, \
             less room for the header), got {}; use the default (16 MiB) or the largest value you cache",
            usize::MAX
        )
    );
    for ok in [1024, 16 << 20, (512 << 20) - 1024] {
        Cache::<String>::builder()
            .max_value_size(ok)
            .build()
            .unwrap();
    }
}

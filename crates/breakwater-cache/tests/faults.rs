//! Faults that must stay contained, against real private Redis servers: a
//! key of the wrong Redis type affects only that key, and a hung Redis
//! costs each call one deadline, not a queue behind a reconnect.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use breakwater_cache::{
    BreakerConfig, BreakerState, Cache, Jitter, RedisStore, RedisStoreConfig, Served,
};
use support::RedisServer;
use tokio::time::Instant;

/// A loader that counts its calls and answers at once.
fn counted(
    calls: &Arc<AtomicUsize>,
    value: &str,
) -> impl Fn() -> std::future::Ready<Result<Option<String>, std::io::Error>>
+ Clone
+ Send
+ Sync
+ 'static {
    let (calls, value) = (Arc::clone(calls), value.to_owned());
    move || {
        calls.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(Some(value.clone())))
    }
}

/// `RPUSH` under one cache key (a list where a string belongs): every call
/// on that key gets an answer, the store breaker stays closed, other keys
/// keep being served from Redis (no reloads), and the next load repairs the
/// key (a plain `GET` reads a string again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrongtype_key_affects_only_itself_and_is_repaired_by_the_next_load() {
    // The only test of this binary with a recorder; counts are read for
    // this test's namespace alone.
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();
    let server = RedisServer::start();
    let cache = Cache::<String>::builder()
        .namespace("wrongtype")
        .store(support::connect(&server).await)
        .ttl(Duration::from_secs(300))
        .jitter(Jitter::none())
        .store_breaker(BreakerConfig::new().consecutive_failures(3))
        .build()
        .unwrap();
    let healthy = Arc::new(AtomicUsize::new(0));
    for k in 0..10 {
        let key = format!("ok:{k}");
        cache
            .get_or_load(&key, counted(&healthy, &key))
            .await
            .unwrap();
    }
    assert_eq!(healthy.load(Ordering::SeqCst), 10);

    let bad_key = String::from_utf8(cache.storage_key(b"bad").unwrap()).unwrap();
    assert_eq!(server.command(&["RPUSH", &bad_key, "x"]).unwrap(), "1");
    assert_eq!(
        server.command(&["GET", &bad_key]).unwrap(),
        "-WRONGTYPE Operation against a key holding the wrong kind of value"
    );

    let bad = Arc::new(AtomicUsize::new(0));
    for round in 0..10 {
        // More calls in a row than the breaker's threshold.
        for _ in 0..5 {
            let got = cache
                .get_or_load_with_meta("bad", counted(&bad, "repaired"))
                .await
                .unwrap();
            assert_eq!(got.value.as_deref(), Some("repaired"), "round {round}");
        }
        for k in 0..10 {
            let key = format!("ok:{k}");
            let got = cache
                .get_or_load_with_meta(&key, counted(&healthy, "reloaded"))
                .await
                .unwrap();
            assert_eq!(got.served, Served::Hit, "round {round}, {key}");
            assert_eq!(got.value.as_deref(), Some(key.as_str()));
        }
        assert_eq!(
            cache.store_breaker_state(),
            BreakerState::Closed,
            "round {round}"
        );
    }
    // Loaded once, written over the list, then read back from Redis.
    assert_eq!(bad.load(Ordering::SeqCst), 1, "the key was never repaired");
    assert_eq!(
        healthy.load(Ordering::SeqCst),
        10,
        "healthy keys were reloaded"
    );
    assert_eq!(server.command(&["TYPE", &bad_key]).unwrap(), "string");
    assert!(!server.command(&["GET", &bad_key]).unwrap().starts_with('-'));
    // Counted as one key's error, never as a store failure.
    let counted = |name: &str| -> u64 {
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| {
                key.key().name() == name
                    && key
                        .key()
                        .labels()
                        .any(|l| l.key() == "namespace" && l.value() == "wrongtype")
            })
            .map(|(.., value)| match value {
                metrics_util::debugging::DebugValue::Counter(n) => n,
                _ => 0,
            })
            .sum()
    };
    // The read and the lease holder's re-read were refused, once each.
    assert!(counted("breakwater_key_errors_total") >= 1);
    assert_eq!(counted("breakwater_store_errors_total"), 0);
}
/// p50, p99 and max of `samples`.
fn percentiles(samples: &mut [Duration]) -> (Duration, Duration, Duration) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    (at(0.50), at(0.99), samples[samples.len() - 1])
}

/// Redis `SIGSTOP`ped for 3 s under 8 callers: each `get_or_load` pays at
/// most its store deadlines (the read, and the lease asked twice: a hung
/// Redis looks like a slow one, whose lease is still worth the wait), each
/// at most `max_response_timeout` (deadlines grow with each timeout), and
/// never a wait behind another caller's reconnect. The store breaker is
/// set so it does not open: this measures what the store itself costs a
/// call (an open breaker only hides it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_redis_costs_each_call_its_store_deadlines() {
    let response_timeout = Duration::from_millis(100);
    let ceiling = Duration::from_millis(300);
    let connect_timeout = Duration::from_millis(1500);
    let server = RedisServer::start();
    let store = RedisStore::connect_with(
        &server.url(),
        RedisStoreConfig::default()
            .connect_timeout(connect_timeout)
            .response_timeout(response_timeout)
            .max_response_timeout(ceiling),
    )
    .unwrap();
    store.warm_up().await.unwrap();
    let cache = Cache::<String>::builder()
        .namespace("hang")
        .store(store)
        .ttl(Duration::from_secs(300))
        .store_breaker(BreakerConfig::new().consecutive_failures(1_000_000))
        .build()
        .unwrap();
    let loads = Arc::new(AtomicUsize::new(0));
    for k in 0..40 {
        let key = format!("k{k}");
        cache
            .get_or_load(&key, counted(&loads, &key))
            .await
            .unwrap();
    }

    server.pause();
    let hang = Duration::from_secs(3);
    let until = Instant::now() + hang;
    let mut callers = Vec::new();
    for c in 0..8 {
        let (cache, loads) = (cache.clone(), Arc::clone(&loads));
        callers.push(tokio::spawn(async move {
            let mut took = Vec::new();
            let mut k = c * 5;
            while Instant::now() < until {
                let key = format!("k{k}");
                let started = Instant::now();
                let got = cache.get_or_load(&key, counted(&loads, &key)).await;
                took.push(started.elapsed());
                assert_eq!(got.unwrap().as_deref(), Some(key.as_str()));
                k = (k + 1) % 40;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            took
        }));
    }
    let mut took = Vec::new();
    for caller in callers {
        took.extend(caller.await.unwrap());
    }
    server.resume();
    let (p50, p99, max) = percentiles(&mut took);
    eprintln!(
        "during a {hang:?} SIGSTOP, {} calls: p50 {p50:?}, p99 {p99:?}, max {max:?} \
         (response_timeout {response_timeout:?}, max_response_timeout {ceiling:?}, \
         connect_timeout {connect_timeout:?})",
        took.len()
    );
    let bound = ceiling * 3 + Duration::from_millis(50);
    assert!(
        max <= bound,
        "max {max:?} is past three deadlines of at most {ceiling:?} + 50ms: \
         a call waited on a connection attempt"
    );

    // Back to Redis once it answers again.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = cache
            .get_or_load_with_meta("k1", counted(&loads, "k1"))
            .await
            .unwrap();
        if got.served == Served::Hit {
            break;
        }
        assert!(Instant::now() < deadline, "never read from Redis again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Connections the server has accepted so far (this query's own included).
fn connections_received(server: &RedisServer) -> u64 {
    let info = server.command(&["INFO", "stats"]).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// One slow reply (every client paused for 200 ms with `CLIENT PAUSE`, less
/// than the 250 ms write deadline past which the connection gives up) times
/// a read out, but the shared connection is kept: it is probed with a `PING`
/// in the background, which is answered once the pause ends, and no new
/// connection is made. Before, every timeout dropped the connection, and the
/// calls behind it waited for (or failed during) a reconnect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_slow_reply_keeps_the_connection() {
    use breakwater_cache::store::Store;
    let server = RedisServer::start();
    let store = RedisStore::connect_with(
        &server.url(),
        RedisStoreConfig::default().response_timeout(Duration::from_millis(50)),
    )
    .unwrap();
    store.warm_up().await.unwrap();
    assert_eq!(store.get(b"k").await.unwrap(), None);

    let before = connections_received(&server);
    assert_eq!(
        server.command(&["CLIENT", "PAUSE", "200", "ALL"]).unwrap(),
        "OK"
    );
    let err = store.get(b"k").await.unwrap_err();
    assert!(err.to_string().contains("did not answer in time"), "{err}");
    // The pause ends, the probe is answered, and the same connection serves.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(store.get(b"k").await.unwrap(), None);
    let after = connections_received(&server);
    assert_eq!(
        after - before,
        2,
        "only the test's own two commands connected (CLIENT PAUSE, INFO): the store made {} new \
         connection(s)",
        after - before - 2
    );
}

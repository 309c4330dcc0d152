//! Redis outages against real private servers: killed, paused, blackholed,
//! slowed; the store breaker, the L1 near cache, bounded direct loads, the
//! invalidation bus, and recovery.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use breakwater_cache::{
    BreakerConfig, BreakerState, Cache, EarlyRefresh, Jitter, L1Config, LimitConfig, RedisStore,
    RedisStoreConfig, Served, StaleReason,
};
use breakwater_cache_testkit::{Fault, FaultProxy};
use support::RedisServer;
use tokio::time::Instant;

type LoadFuture = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Option<String>, std::io::Error>> + Send>,
>;

/// The origin: counts calls and the peak of concurrent calls.
#[derive(Clone, Default)]
struct Db {
    calls: Arc<AtomicUsize>,
    running: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
}

impl Db {
    fn loader(&self, value: String) -> impl Fn() -> LoadFuture + Clone + Send + Sync + 'static {
        let db = self.clone();
        move || {
            let db = db.clone();
            let value = value.clone();
            Box::pin(async move {
                db.calls.fetch_add(1, Ordering::SeqCst);
                let now = db.running.fetch_add(1, Ordering::SeqCst) + 1;
                db.peak.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                db.running.fetch_sub(1, Ordering::SeqCst);
                Ok(Some(value))
            })
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

/// `max_response_timeout` of [`fast`].
const FAST_CEILING: Duration = Duration::from_millis(300);

/// Short deadlines: a hung Redis costs a read 100 ms, 300 ms at most once
/// the deadlines have grown with its timeouts.
fn fast(url: &str) -> RedisStore {
    let config = RedisStoreConfig::default()
        .connect_timeout(Duration::from_millis(200))
        .response_timeout(Duration::from_millis(100))
        .max_response_timeout(FAST_CEILING)
        .subscription_ping(Duration::from_millis(200));
    RedisStore::connect_with(url, config).unwrap()
}

fn cache_on(store: RedisStore, l1_ttl: Duration, max_concurrent: u32) -> Cache<String> {
    Cache::builder()
        .namespace("outage")
        .store(store)
        .ttl(Duration::from_secs(300))
        .jitter(Jitter::none())
        .early_refresh(EarlyRefresh::none())
        .l1(L1Config::new().ttl(l1_ttl))
        .limit(
            LimitConfig::new()
                .max_concurrent(max_concurrent)
                .queue_wait(Duration::from_secs(30)),
        )
        .store_breaker(
            BreakerConfig::new()
                .consecutive_failures(3)
                .cool_down(Duration::from_millis(300)),
        )
        .build()
        .unwrap()
}

/// Loads `<prefix>:0..n` (value `v<k>`), then, once the bus is up (entries
/// kept before it are unverified), reads them again, so every key is in L1.
async fn warm_l1(cache: &Cache<String>, db: &Db, prefix: &str, n: usize) {
    for _ in 0..2 {
        for k in 0..n {
            cache
                .get_or_load(format!("{prefix}:{k}"), db.loader(format!("v{k}")))
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Waits (bounded, no timing assertion) until `check` holds.
async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_under_load_no_errors_bounded_loads_and_recovery() {
    let mut server = RedisServer::start();
    let store = fast(&server.url());
    store.warm_up().await.unwrap();
    // L1 entries stay fresh 500 ms, so the outage outlasts them and forces loads.
    let cache = cache_on(store, Duration::from_millis(500), 8);
    let db = Db::default();
    warm_l1(&cache, &db, "hot", 100).await;
    assert_eq!(db.calls(), 100);

    server.kill();
    let outage_start = db.calls();
    db.peak.store(0, Ordering::SeqCst);
    let errors = Arc::new(AtomicUsize::new(0));
    let mut callers = Vec::new();
    for c in 0..200 {
        let (cache, db, errors) = (cache.clone(), db.clone(), Arc::clone(&errors));
        callers.push(tokio::spawn(async move {
            let until = Instant::now() + Duration::from_millis(1_500);
            let mut k = c % 100;
            while Instant::now() < until {
                let key = format!("hot:{k}");
                match cache.get_or_load(&key, db.loader(format!("v{k}"))).await {
                    Ok(Some(v)) => assert_eq!(v, format!("v{k}")),
                    other => {
                        errors.fetch_add(1, Ordering::SeqCst);
                        eprintln!("{key}: {other:?}");
                    }
                }
                k = (k + 7) % 100;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    for caller in callers {
        caller.await.unwrap();
    }
    assert_eq!(
        errors.load(Ordering::SeqCst),
        0,
        "callers saw errors during the outage"
    );
    // L1's copies went past their L1 TTL and were unverified when the bus
    // dropped, but they stand in for the unreachable store: no reloads.
    assert_eq!(
        db.calls(),
        outage_start,
        "warm keys were reloaded from the database"
    );
    assert!(
        db.peak.load(Ordering::SeqCst) <= 8,
        "peak {} loads",
        db.peak.load(Ordering::SeqCst)
    );
    // Open, or half-open if its cool-down ended since the last failed probe.
    assert_ne!(cache.store_breaker_state(), BreakerState::Closed);

    // Recovery: same port, breaker closes, Redis is repopulated.
    server.restart();
    eventually(
        "the store breaker closes and writes reach Redis",
        async || {
            let _ = cache.get_or_load("hot:1", db.loader("v1".into())).await;
            cache.store_breaker_state() == BreakerState::Closed
                && server.command(&["EXISTS", "bw:outage:v:{hot:1}"]).unwrap() == "1"
        },
    )
    .await;

    // The bus works again: another process's write reaches this L1.
    let other = cache_on(fast(&server.url()), Duration::from_secs(60), 8);
    cache
        .get_or_load("bus", db.loader("old".into()))
        .await
        .unwrap();
    other.set("bus", &"new".to_string()).await.unwrap();
    eventually("the other cache's write reaches L1", async || {
        cache
            .get_or_load("bus", db.loader("loader".into()))
            .await
            .unwrap()
            .as_deref()
            == Some("new")
    })
    .await;
}

/// Every call returns within a bound (the Redis deadline, one load, and a
/// wide margin for a loaded machine): nothing hangs on a silent Redis.
async fn calls_stay_bounded(cache: &Cache<String>, db: &Db, rounds: usize) {
    for round in 0..rounds {
        for k in 0..20 {
            let started = Instant::now();
            let v = cache
                .get_or_load(format!("k{k}"), db.loader(format!("v{k}")))
                .await
                .unwrap();
            assert_eq!(v, Some(format!("v{k}")));
            let took = started.elapsed();
            assert!(
                took < Duration::from_secs(2),
                "round {round}: a call took {took:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_redis_costs_one_deadline_then_l1_and_direct_loads() {
    let server = RedisServer::start();
    let store = fast(&server.url());
    store.warm_up().await.unwrap();
    let cache = cache_on(store, Duration::from_millis(300), 8);
    let db = Db::default();
    calls_stay_bounded(&cache, &db, 1).await;

    server.pause();
    calls_stay_bounded(&cache, &db, 5).await;
    server.resume();
    eventually("recovery after SIGCONT", async || {
        let _ = cache.get_or_load("k1", db.loader("v1".into())).await;
        cache.store_breaker_state() == BreakerState::Closed
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackholed_and_slow_redis_never_hold_a_call_past_its_deadline() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let store = fast(&proxy.url());
    store.warm_up().await.unwrap();
    let cache = cache_on(store, Duration::from_millis(300), 8);
    let db = Db::default();
    calls_stay_bounded(&cache, &db, 1).await;

    proxy.set(Fault::Blackhole);
    calls_stay_bounded(&cache, &db, 5).await;

    proxy.set(Fault::Delay(Duration::from_millis(200)));
    calls_stay_bounded(&cache, &db, 5).await;

    proxy.set(Fault::Pass);
    eventually("recovery after the proxy passes again", async || {
        let _ = cache.get_or_load("k1", db.loader("v1".into())).await;
        cache.store_breaker_state() == BreakerState::Closed
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidations_reach_other_processes_l1_and_a_dropped_bus_unverifies_it() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let a = cache_on(fast(&server.url()), Duration::from_secs(60), 8);
    // B reaches Redis (data and bus) through the proxy.
    let b = cache_on(fast(&proxy.url()), Duration::from_secs(60), 8);
    let db = Db::default();

    b.get_or_load("k", db.loader("v1".into())).await.unwrap();
    // B's L1 serves it once B's bus is up (a copy kept before its
    // subscription answered is unverified, and the next read keeps it
    // again): on a loaded machine that can take a read or two.
    eventually("B serves k from L1", async || {
        let f = b
            .get_or_load_with_meta("k", db.loader("x".into()))
            .await
            .unwrap();
        assert_eq!(f.value.as_deref(), Some("v1"));
        f.served == Served::L1Hit
    })
    .await;

    // An invalidation in A drops the key from B's L1.
    a.invalidate("k").await.unwrap();
    eventually("B stops serving the invalidated value", async || {
        b.get_or_load("k", db.loader("v2".into()))
            .await
            .unwrap()
            .as_deref()
            == Some("v2")
    })
    .await;

    // B's bus goes silent; A's next write cannot reach B. Once B notices
    // (a PING unanswered), it stops serving "v2" as fresh: its store is
    // unreachable too, so "v2" stands in, labelled as such.
    proxy.set(Fault::Blackhole);
    a.set("k", &"v3".to_string()).await.unwrap();
    eventually("B's L1 copy is unverified when its bus drops", async || {
        let f = b
            .get_or_load_with_meta("k", db.loader("direct".into()))
            .await
            .unwrap();
        f.served
            == Served::Stale {
                reason: StaleReason::StoreUnavailable,
            }
    })
    .await;
    proxy.set(Fault::Pass);
    eventually(
        "B reads A's write once Redis is reachable again",
        async || {
            b.get_or_load("k", db.loader("direct".into()))
                .await
                .unwrap()
                .as_deref()
                == Some("v3")
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_connection_is_retried_once_and_costs_the_caller_nothing() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let cache = cache_on(
        RedisStore::connect_with(&proxy.url(), support::patient()).unwrap(),
        Duration::from_millis(1),
        8,
    );
    cache.set("k", &"v".to_string()).await.unwrap();
    for _ in 0..3 {
        // Every open connection is closed under the cache's feet.
        proxy.set(Fault::Reset);
        proxy.set(Fault::Pass);
        assert_eq!(cache.get("k").await.unwrap().as_deref(), Some("v"));
    }
    assert_eq!(cache.store_breaker_state(), BreakerState::Closed);
}

/// A `GET` whose reply is held up (by a slow network) past this process's
/// own invalidation of the key neither answers later callers nor puts the
/// old value back into L1.
#[tokio::test]
async fn a_get_reply_delayed_past_an_invalidation_is_not_kept_in_l1() {
    let server = RedisServer::start();
    let writer = Cache::<String>::builder()
        .namespace("late")
        .store(support::connect(&server).await)
        .build()
        .unwrap();
    writer.set("k", &"old".to_string()).await.unwrap();
    let proxy = FaultProxy::start(server.addr());
    let store = RedisStore::connect_with(&proxy.url(), support::patient()).unwrap();
    store.warm_up().await.unwrap();
    let cache = Cache::<String>::builder()
        .namespace("late")
        .store(store)
        .l1(L1Config::new())
        .build()
        .unwrap();
    // Subscribed (through the proxy, too) before the delay starts: a
    // subscription that comes up later flushes L1 (as it may have missed
    // messages), which would hide what this test looks for.
    cache.get("warm").await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let new = || async { Ok::<_, std::io::Error>(Some("new".to_owned())) };
    proxy.set(Fault::Delay(Duration::from_millis(100)));
    let first = {
        let cache = cache.clone();
        tokio::spawn(async move { cache.get_or_load("k", new).await })
    };
    // The GET reaches Redis at ~100 ms and reads "old"; its reply lands at
    // ~200 ms, while the invalidation (sent at 150 ms) is still under way.
    tokio::time::sleep(Duration::from_millis(150)).await;
    cache.invalidate("k").await.unwrap();
    assert_eq!(first.await.unwrap().unwrap().as_deref(), Some("old"));
    for _ in 0..3 {
        let v = cache.get_or_load_with_meta("k", new).await.unwrap();
        assert_eq!(v.value.as_deref(), Some("new"), "{v:?}");
    }
}

/// Warm keys in L1, then Redis goes away (killed, or hung for 3 s) while
/// the database fails too: every call on a warm key is answered from L1,
/// labelled `Stale { StoreUnavailable }` once the dropped bus is noticed,
/// with no error. Returns the latencies of the calls made during the
/// outage.
async fn warm_keys_through_an_outage(server: &mut RedisServer, kill: bool) -> Vec<Duration> {
    let store = fast(&server.url());
    store.warm_up().await.unwrap();
    let cache = cache_on(store, Duration::from_secs(30), 8);
    let db = Db::default();
    warm_l1(&cache, &db, "warm", 50).await;
    let failing = || async { Err::<Option<String>, _>(std::io::Error::other("database down")) };
    if kill {
        server.kill();
    } else {
        server.pause();
    }
    let results = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut callers = Vec::new();
    for c in 0..8 {
        let (cache, results) = (cache.clone(), Arc::clone(&results));
        callers.push(tokio::spawn(async move {
            let until = Instant::now() + Duration::from_secs(3);
            let mut k = c;
            while Instant::now() < until {
                let started = Instant::now();
                let got = cache
                    .get_or_load_with_meta(format!("warm:{k}"), failing)
                    .await;
                let took = started.elapsed();
                results.lock().unwrap().push((k, got, took));
                k = (k + 7) % 50;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }));
    }
    for caller in callers {
        caller.await.unwrap();
    }
    if !kill {
        server.resume();
    }
    let results = std::mem::take(&mut *results.lock().unwrap());
    let mut stale = 0;
    for (k, got, _) in &results {
        let got = got
            .as_ref()
            .unwrap_or_else(|e| panic!("warm:{k} failed: {e}"));
        assert_eq!(got.value.as_deref(), Some(format!("v{k}").as_str()));
        match got.served {
            Served::L1Hit => {}
            Served::Stale {
                reason: StaleReason::StoreUnavailable,
            } => stale += 1,
            other => panic!("warm:{k} served as {other:?}"),
        }
    }
    assert!(stale > 0, "the dropped bus was never noticed");
    assert_eq!(db.calls(), 50, "no reload reached the database");
    results.into_iter().map(|(_, _, took)| took).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_keys_survive_a_killed_redis_and_a_failing_database() {
    let mut server = RedisServer::start();
    warm_keys_through_an_outage(&mut server, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_keys_survive_a_hung_redis_and_a_failing_database() {
    let mut server = RedisServer::start();
    let mut took = warm_keys_through_an_outage(&mut server, false).await;
    took.sort();
    let at = |q: f64| took[((took.len() as f64 * q) as usize).min(took.len() - 1)];
    eprintln!(
        "hung redis: {} calls, p50 {:?}, p99 {:?}, max {:?}",
        took.len(),
        at(0.5),
        at(0.99),
        took[took.len() - 1]
    );
    // One read deadline (100 ms, growing with each timeout up to 300 ms
    // here) and no more: no call waits behind a reconnect.
    let bound = FAST_CEILING + Duration::from_millis(10);
    assert!(at(0.99) <= bound, "p99 {:?}", at(0.99));
}

/// Warm keys in L1 with `max_stale` of an hour; Redis is killed and comes
/// back empty (a restart without persistence, as a failover to an empty
/// replica or a FLUSHDB would leave it) while the database keeps failing.
/// Redis answers again but has lost every entry: the L1 copies still stand
/// in for the failed loads, and no call on a warm key errs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_keys_survive_redis_restarting_empty_while_the_database_fails() {
    let mut server = RedisServer::start();
    let store = fast(&server.url());
    store.warm_up().await.unwrap();
    let cache = Cache::builder()
        .namespace("outage")
        .store(store)
        .ttl(Duration::from_secs(300))
        .max_stale(Duration::from_secs(3600))
        .jitter(Jitter::none())
        .early_refresh(EarlyRefresh::none())
        .l1(L1Config::new())
        .build()
        .unwrap();
    let db = Db::default();
    warm_l1(&cache, &db, "warm", 50).await;
    let failing = || async { Err::<Option<String>, _>(std::io::Error::other("database down")) };
    server.kill();
    let results = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut callers = Vec::new();
    for c in 0..8 {
        let (cache, results) = (cache.clone(), Arc::clone(&results));
        callers.push(tokio::spawn(async move {
            let until = Instant::now() + Duration::from_secs(4);
            let mut k = c;
            while Instant::now() < until {
                let got = cache
                    .get_or_load_with_meta(format!("warm:{k}"), failing)
                    .await;
                results.lock().unwrap().push((k, got));
                k = (k + 7) % 50;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    server.restart();
    for caller in callers {
        caller.await.unwrap();
    }
    let results = std::mem::take(&mut *results.lock().unwrap());
    let mut errors = Vec::new();
    let mut stand_ins = 0;
    for (k, got) in &results {
        match got {
            Err(err) => errors.push(format!("warm:{k}: {err}")),
            Ok(got) => {
                assert_eq!(got.value.as_deref(), Some(format!("v{k}").as_str()));
                if matches!(
                    got.served,
                    Served::Stale {
                        reason: StaleReason::LoaderFailed | StaleReason::BreakerOpen
                    }
                ) {
                    stand_ins += 1;
                }
            }
        }
    }
    eprintln!(
        "{} calls, {} errors, {stand_ins} served from L1 for a failed load",
        results.len(),
        errors.len()
    );
    assert!(
        errors.is_empty(),
        "{} of {} calls failed, first: {:?}",
        errors.len(),
        results.len(),
        errors.first()
    );
    assert!(
        stand_ins > 0,
        "Redis never answered empty during the run: the test proved nothing"
    );
}

/// A write (or a lease script) gets its own, longer deadline than a read:
/// with every reply 120 ms late, the first read times out (50 ms, while
/// the store has seen only quick replies) while writes and invalidations
/// land (250 ms). Then the deadlines have followed the latency: a read
/// lands too.
#[tokio::test]
async fn writes_have_their_own_deadline() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let store = RedisStore::connect(&proxy.url()).unwrap();
    store.warm_up().await.unwrap();
    let cache = Cache::<String>::builder()
        .namespace("deadlines")
        .store(store.clone())
        .build()
        .unwrap();
    // The scripts are loaded first (a first `EVALSHA` costs a second trip).
    cache.set("k", &"v".to_string()).await.unwrap();
    cache.invalidate("k").await.unwrap();
    proxy.set(Fault::Delay(Duration::from_millis(60)));
    let read = breakwater_cache::Store::get(&store, b"bw:deadlines:v:{k}").await;
    assert!(read.unwrap_err().is_store(), "a read past 50 ms fails");
    cache.set("k", &"v".to_string()).await.unwrap();
    assert_eq!(
        server.command(&["EXISTS", "bw:deadlines:v:{k}"]).unwrap(),
        "1"
    );
    cache.invalidate("k").await.unwrap();
    assert_eq!(
        server.command(&["EXISTS", "bw:deadlines:v:{k}"]).unwrap(),
        "0"
    );
    let read = breakwater_cache::Store::get(&store, b"bw:deadlines:v:{k}").await;
    assert_eq!(read.unwrap(), None, "the read deadline grew past 120 ms");
    let latency = store.latency();
    assert!(
        latency.round_trip.unwrap() >= Duration::from_millis(120),
        "{latency:?}"
    );
    assert_eq!(latency.read_deadline, latency.round_trip.unwrap() * 3);
}

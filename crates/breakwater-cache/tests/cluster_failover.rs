//! A real Redis Cluster failover under traffic: three primaries with one
//! replica each, two caches ("processes", B with an L1) reading and
//! invalidating keys over every slot while the primary of slot 0 (the
//! store's clock, and the node both subscriptions start on) is killed and
//! its replica is promoted.
//!
//! Checked: no wrong value (every value is its key's, and after an
//! invalidate returns, the invalidating process never reads an older
//! version), no hung request (each call has 10 s), and after the promotion:
//! invalidations reach the other process's L1 again, a fresh key loads once
//! across both processes, and the store's clock agrees with the promoted
//! node's `TIME` and is sampled from it.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use breakwater_cache::testing::CountingStore;
use breakwater_cache::{BreakerConfig, Cache, L1Config, RedisStore, RedisStoreConfig, Store};
use support::{RedisCluster, command_calls};
use tokio::time::{Instant, sleep, timeout};

/// Keys in the workload, spread over every slot range.
const KEYS: usize = 300;
/// Every call's deadline: a call that takes longer is a hung request.
const CALL_DEADLINE: Duration = Duration::from_secs(10);
/// The longest a replica may take to be promoted.
const PROMOTION_DEADLINE: Duration = Duration::from_secs(30);
/// Workers per process.
const WORKERS: usize = 6;
/// Traffic before the kill, and after the promotion.
const SETTLE: Duration = Duration::from_millis(1500);
/// The store breakers' cool-down (the default, spelled out): a breaker that
/// the failover opened refuses its keys' store calls for up to this long
/// after the promotion.
const COOL_DOWN: Duration = Duration::from_secs(1);

/// The "database": each key's current version. A loaded value is
/// `"<key>#<version>"`, read at load time.
struct Db {
    versions: Vec<AtomicU64>,
    loads: AtomicUsize,
}

impl Db {
    fn new() -> Arc<Db> {
        Arc::new(Db {
            versions: (0..KEYS).map(|_| AtomicU64::new(1)).collect(),
            loads: AtomicUsize::new(0),
        })
    }

    /// Bumps `key`'s version (a write to the database) and returns it.
    fn write(&self, key: usize) -> u64 {
        self.versions[key].fetch_add(1, Ordering::SeqCst) + 1
    }

    fn loader(
        self: &Arc<Self>,
        key: usize,
    ) -> impl Fn() -> std::future::Ready<Result<Option<String>, std::io::Error>>
    + Clone
    + Send
    + Sync
    + 'static {
        let db = Arc::clone(self);
        move || {
            db.loads.fetch_add(1, Ordering::SeqCst);
            let version = db.versions[key].load(Ordering::SeqCst);
            std::future::ready(Ok(Some(format!("{}#{version}", name(key)))))
        }
    }
}

fn name(key: usize) -> String {
    format!("item:{key}")
}

/// `"<key>#<version>"` split, or a panic naming the bad value.
fn parse(value: &str) -> (&str, u64) {
    let (key, version) = value
        .rsplit_once('#')
        .unwrap_or_else(|| panic!("malformed value {value:?}"));
    let version = version
        .parse()
        .unwrap_or_else(|e| panic!("malformed value {value:?}: {e}"));
    (key, version)
}

/// Moderate deadlines, as a production config would have on a busy CI
/// machine; the clock is sampled often so the failover window sees
/// refreshes.
fn config() -> RedisStoreConfig {
    RedisStoreConfig::default()
        .connect_timeout(Duration::from_secs(1))
        .response_timeout(Duration::from_millis(500))
        .clock_refresh(Duration::from_millis(250))
}

fn cache_on<S: Store>(store: S, l1: bool) -> Cache<String> {
    let builder = Cache::builder()
        .namespace("failover")
        .store(store)
        .ttl(Duration::from_secs(120))
        .store_breaker(
            BreakerConfig::new()
                .consecutive_failures(5)
                .cool_down(COOL_DOWN),
        );
    let builder = if l1 {
        // Long enough that only an invalidation (over the bus) can drop a
        // value within the test.
        builder.l1(L1Config::new().ttl(Duration::from_secs(120)))
    } else {
        builder
    };
    builder.build().unwrap()
}

/// When a call ran, relative to the kill and the promotion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Phase {
    /// Ended before the kill.
    Before,
    /// Overlapped the time from the kill to the promotion.
    Failover,
    /// Started within the breakers' cool-down after the promotion.
    Recovery,
    /// Started later.
    After,
}

/// The kill and promotion instants, once known.
#[derive(Default)]
struct Timeline {
    killed: Mutex<Option<Instant>>,
    promoted: Mutex<Option<Instant>>,
}

impl Timeline {
    /// The phase of a call that ran from `started` until now.
    fn phase(&self, started: Instant) -> Phase {
        let killed = *self.killed.lock().unwrap();
        let promoted = *self.promoted.lock().unwrap();
        match (killed, promoted) {
            (Some(_), Some(p)) if started >= p + COOL_DOWN => Phase::After,
            (Some(_), Some(p)) if started >= p => Phase::Recovery,
            (Some(_), _) => Phase::Failover,
            (None, _) => Phase::Before,
        }
    }
}

/// A read older than an invalidation: (key, version read, version
/// invalidated, phase of the invalidation, phase of the read).
type WentBack = (usize, u64, u64, Phase, Phase);

/// What the workers saw, per phase.
#[derive(Default, Debug)]
struct Tally {
    calls: usize,
    errors: usize,
    error_kinds: Vec<String>,
    hung: usize,
    invalidations: usize,
    failed_invalidations: usize,
    slowest: Duration,
}

#[derive(Default)]
struct Report {
    tallies: Mutex<HashMap<Phase, Tally>>,
    /// Values of the wrong key: must stay empty.
    wrong_key: Mutex<Vec<String>>,
    /// Reads older than an invalidation that had returned before the read
    /// started, in the invalidating process: (key, read, invalidated,
    /// phase of the invalidation, phase of the read).
    went_back: Mutex<Vec<WentBack>>,
}

impl Report {
    fn tally(&self, phase: Phase, f: impl FnOnce(&mut Tally)) {
        f(self.tallies.lock().unwrap().entry(phase).or_default());
    }

    /// Counts one `get_or_load` that started at `started`: hung (past its
    /// deadline), failed, or served.
    fn call<T, E: std::fmt::Display>(
        &self,
        phase: Phase,
        started: Instant,
        result: &Result<Result<T, E>, tokio::time::error::Elapsed>,
    ) {
        self.tally(phase, |t| {
            t.calls += 1;
            t.slowest = t.slowest.max(started.elapsed());
            match result {
                Err(_) => t.hung += 1,
                Ok(Err(e)) => {
                    t.errors += 1;
                    t.error_kinds.push(format!("get_or_load: {e}"));
                }
                Ok(Ok(_)) => {}
            }
        });
    }
}

/// One worker of process A: owns the keys `k % WORKERS == worker` (so no
/// other call of A touches them), reads them and now and then writes the
/// database and invalidates.
async fn invalidating_worker(
    cache: Cache<String>,
    db: Arc<Db>,
    worker: usize,
    stop: Arc<AtomicBool>,
    timeline: Arc<Timeline>,
    report: Arc<Report>,
) {
    // The version each owned key must have reached (at least), and the
    // phase its invalidation returned in.
    let mut floor: HashMap<usize, (u64, Phase)> = HashMap::new();
    let owned: Vec<usize> = (worker..KEYS).step_by(WORKERS).collect();
    let mut step = worker;
    while !stop.load(Ordering::Relaxed) {
        step = step.wrapping_mul(1_103_515_245).wrapping_add(12_345) % 1_000_003;
        // The key from other bits of the step than the choice to
        // invalidate (`step % 10`): with `step % owned.len()` (50 keys) the
        // keys invalidated were never the keys read, and the no-going-back
        // check below checked nothing.
        let key = owned[(step / 10) % owned.len()];
        let started = Instant::now();
        if step.is_multiple_of(10) {
            let version = db.write(key);
            let result = timeout(CALL_DEADLINE, cache.invalidate(name(key))).await;
            let phase = timeline.phase(started);
            report.tally(phase, |t| {
                t.invalidations += 1;
                t.slowest = t.slowest.max(started.elapsed());
                match &result {
                    Err(_) => t.hung += 1,
                    Ok(Err(e)) => {
                        t.failed_invalidations += 1;
                        t.error_kinds.push(format!("invalidate: {e}"));
                    }
                    Ok(Ok(())) => {}
                }
            });
            if let Ok(Ok(())) = result {
                floor.insert(key, (version, phase));
            }
            continue;
        }
        let result = timeout(CALL_DEADLINE, cache.get_or_load(name(key), db.loader(key))).await;
        let phase = timeline.phase(started);
        report.call(phase, started, &result);
        if let Ok(Ok(value)) = result {
            let value = value.expect("the loader always finds a value");
            let (got, version) = parse(&value);
            if got != name(key) {
                report
                    .wrong_key
                    .lock()
                    .unwrap()
                    .push(format!("{} -> {value}", name(key)));
            }
            if let Some(&(min, invalidated)) = floor.get(&key)
                && version < min
            {
                report
                    .went_back
                    .lock()
                    .unwrap()
                    .push((key, version, min, invalidated, phase));
            }
        }
    }
}

/// One worker of process B: reads every key, checking only that each
/// value is its key's.
async fn reading_worker(
    cache: Cache<String>,
    db: Arc<Db>,
    worker: usize,
    stop: Arc<AtomicBool>,
    timeline: Arc<Timeline>,
    report: Arc<Report>,
) {
    let mut step = worker + 7;
    while !stop.load(Ordering::Relaxed) {
        step = step.wrapping_mul(1_103_515_245).wrapping_add(12_345) % 1_000_003;
        let key = step % KEYS;
        let started = Instant::now();
        let result = timeout(CALL_DEADLINE, cache.get_or_load(name(key), db.loader(key))).await;
        let phase = timeline.phase(started);
        report.call(phase, started, &result);
        if let Ok(Ok(Some(value))) = result {
            let (got, version) = parse(&value);
            let current = db.versions[key].load(Ordering::SeqCst);
            if got != name(key) || version > current {
                report
                    .wrong_key
                    .lock()
                    .unwrap()
                    .push(format!("{} -> {value} (database at {current})", name(key)));
            }
        }
        // B also gives way now and then, so A's invalidations interleave.
        if step.is_multiple_of(50) {
            sleep(Duration::from_millis(1)).await;
        }
    }
}

/// The storage key's shard for user key `key`.
fn shard_of(cluster: &RedisCluster, cache: &Cache<String>, key: &str) -> usize {
    let storage = cache.storage_key(key.as_bytes()).unwrap();
    cluster.node_of(std::str::from_utf8(&storage).unwrap())
}

/// `TIME` of `node`, in ms.
fn node_time_ms(cluster: &RedisCluster, node: usize) -> u64 {
    let reply = cluster.nodes()[node].command(&["TIME"]).unwrap();
    let mut parts = reply.lines().map(|p| p.parse::<u64>().unwrap());
    let (secs, micros) = (parts.next().unwrap(), parts.next().unwrap());
    secs * 1000 + micros / 1000
}

fn time_calls(cluster: &RedisCluster, node: usize) -> u64 {
    command_calls(&cluster.nodes()[node])
        .into_iter()
        .find(|(name, _)| name == "time")
        .map_or(0, |(_, calls)| calls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_failover_under_traffic_loses_no_request_and_no_invalidation() {
    let test_started = Instant::now();
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start_with_replicas(1))
        .await
        .unwrap();
    let formed_in = test_started.elapsed();
    let a_store = RedisStore::connect_cluster_with(cluster.urls(), config()).unwrap();
    let b_redis = RedisStore::connect_cluster_with(cluster.urls(), config()).unwrap();
    a_store.warm_up().await.unwrap();
    b_redis.warm_up().await.unwrap();
    let b_store = CountingStore::new(b_redis.clone());
    let a = cache_on(a_store.clone(), false);
    let b = cache_on(b_store.clone(), true);

    // The workload covers every shard.
    let mut per_shard = [0usize; 3];
    for key in 0..KEYS {
        per_shard[shard_of(&cluster, &a, &name(key))] += 1;
    }
    assert!(per_shard.iter().all(|&n| n > 20), "{per_shard:?}");

    let db = Db::new();
    let stop = Arc::new(AtomicBool::new(false));
    let timeline = Arc::new(Timeline::default());
    let report = Arc::new(Report::default());
    let mut workers = Vec::new();
    for worker in 0..WORKERS {
        workers.push(tokio::spawn(invalidating_worker(
            a.clone(),
            Arc::clone(&db),
            worker,
            Arc::clone(&stop),
            Arc::clone(&timeline),
            Arc::clone(&report),
        )));
        workers.push(tokio::spawn(reading_worker(
            b.clone(),
            Arc::clone(&db),
            worker,
            Arc::clone(&stop),
            Arc::clone(&timeline),
            Arc::clone(&report),
        )));
    }
    sleep(SETTLE).await;
    let loads_before_kill = db.loads.load(Ordering::SeqCst);

    // Kill shard 0's primary: it serves slot 0 (the store's clock) and it is
    // the first seed node, where both subscriptions are.
    let timeline_kill = Arc::clone(&timeline);
    let (mut cluster, dead, promoted) = tokio::task::spawn_blocking(move || {
        let mut cluster = cluster;
        *timeline_kill.killed.lock().unwrap() = Some(Instant::now());
        let dead = cluster.kill_primary(0);
        let promoted = cluster.wait_for_promotion(0, PROMOTION_DEADLINE);
        *timeline_kill.promoted.lock().unwrap() = Some(Instant::now());
        (cluster, dead, promoted)
    })
    .await
    .unwrap();
    let killed_at = timeline.killed.lock().unwrap().unwrap();
    let promoted_at = timeline.promoted.lock().unwrap().unwrap();
    let loads_at_promotion = db.loads.load(Ordering::SeqCst);
    assert_eq!(dead, 0);
    let time_calls_at_promotion = time_calls(&cluster, promoted);

    sleep(SETTLE).await;
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.await.unwrap();
    }
    let loads_after = db.loads.load(Ordering::SeqCst);

    // The figures.
    let tallies = std::mem::take(&mut *report.tallies.lock().unwrap());
    eprintln!(
        "cluster formed in {formed_in:?}; promotion {:?} after the kill (node {dead} -> node {promoted})",
        promoted_at - killed_at
    );
    eprintln!(
        "loads: {loads_before_kill} before the kill, {} during the failover, {} after",
        loads_at_promotion - loads_before_kill,
        loads_after - loads_at_promotion
    );
    for (phase, tally) in tallies.iter().collect::<std::collections::BTreeMap<_, _>>() {
        let mut kinds: HashMap<&str, usize> = HashMap::new();
        for kind in &tally.error_kinds {
            *kinds.entry(kind.as_str()).or_default() += 1;
        }
        eprintln!(
            "{phase:?}: {} reads ({} errors), {} invalidations ({} failed), {} hung, slowest {:?}; errors: {kinds:?}",
            tally.calls,
            tally.errors,
            tally.invalidations,
            tally.failed_invalidations,
            tally.hung,
            tally.slowest
        );
    }
    let went_back = report.went_back.lock().unwrap().clone();
    eprintln!("reads older than a returned invalidation: {went_back:?}");

    // No wrong value, no hung request.
    let wrong_key = report.wrong_key.lock().unwrap().clone();
    assert!(wrong_key.is_empty(), "wrong values: {wrong_key:?}");
    let hung: usize = tallies.values().map(|t| t.hung).sum();
    assert_eq!(hung, 0, "requests that hit the {CALL_DEADLINE:?} deadline");
    assert!(
        went_back.is_empty(),
        "reads went back in time: {went_back:?}"
    );
    // Traffic flowed in every phase, and errors stayed in the failover and
    // the breakers' cool-down after it.
    for phase in [
        Phase::Before,
        Phase::Failover,
        Phase::Recovery,
        Phase::After,
    ] {
        assert!(
            tallies.get(&phase).is_some_and(|t| t.calls > 0),
            "{phase:?}"
        );
    }
    for phase in [Phase::Before, Phase::After] {
        let t = &tallies[&phase];
        assert_eq!(
            (t.errors, t.failed_invalidations),
            (0, 0),
            "{phase:?}: {:?}",
            t.error_kinds
        );
    }

    // The bus resubscribed: an invalidation in A reaches B's L1. Keys on the
    // promoted shard and on a shard that did not fail.
    for shard in [0, 2] {
        let key = (0..KEYS)
            .find(|&k| shard_of(&cluster, &a, &name(k)) == shard)
            .unwrap();
        let first = b.get_or_load(name(key), db.loader(key)).await.unwrap();
        let gets = b_store.gets();
        let again = b.get_or_load(name(key), db.loader(key)).await.unwrap();
        assert_eq!(again, first);
        assert_eq!(b_store.gets(), gets, "B's second read came from its L1");
        let version = db.write(key);
        a.invalidate(name(key)).await.unwrap();
        let invalidated = Instant::now();
        loop {
            let value = b.get_or_load(name(key), db.loader(key)).await.unwrap();
            if parse(value.as_deref().unwrap()).1 >= version {
                eprintln!(
                    "shard {shard}: A's invalidation reached B's L1 in {:?}",
                    invalidated.elapsed()
                );
                break;
            }
            assert!(
                invalidated.elapsed() < Duration::from_secs(5),
                "shard {shard}: B still serves {value:?} from L1 5 s after A invalidated it"
            );
            sleep(Duration::from_millis(10)).await;
        }
    }

    // Leases work on the promoted primary: a fresh key there, loaded by both
    // processes at once, is loaded once.
    let fresh = (0..)
        .map(|i| format!("fresh:{i}"))
        .find(|k| shard_of(&cluster, &a, k) == 0)
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let mut loads = Vec::new();
    for cache in [&a, &b].into_iter().cycle().take(20) {
        let cache = cache.clone();
        let fresh = fresh.clone();
        let loader = support::slow_loader(&calls, Duration::from_millis(300), "fresh");
        loads.push(tokio::spawn(async move {
            timeout(CALL_DEADLINE, cache.get_or_load(&fresh, loader)).await
        }));
    }
    for load in loads {
        let got = load.await.unwrap().expect("not hung").unwrap();
        assert_eq!(got.as_deref(), Some("fresh"));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1, "one load across processes");
    // A replica does not inherit its primary's script cache (Redis
    // replicates a script's effects): the promoted node learnt the lease
    // scripts through the `EVAL` fallback.
    let evals = command_calls(&cluster.nodes()[promoted])
        .into_iter()
        .find(|(name, _)| name == "eval")
        .map_or(0, |(_, calls)| calls);
    eprintln!("EVAL fallbacks on the promoted primary: {evals}");
    assert!(evals > 0, "the promoted primary never needed EVAL");

    // The clock is sampled from the promoted primary again, and agrees
    // with its TIME.
    sleep(Duration::from_secs(1)).await;
    let refreshes = time_calls(&cluster, promoted) - time_calls_at_promotion;
    eprintln!("TIME calls on the promoted primary since the promotion: {refreshes}");
    assert!(
        refreshes > 0,
        "neither store samples the clock of slot 0's new primary"
    );
    for store in [&a_store, &b_redis] {
        let node = node_time_ms(&cluster, promoted);
        let ours = store.now_ms();
        let skew = ours.abs_diff(node);
        eprintln!("clock: store {ours} vs promoted node {node}: {skew} ms apart");
        assert!(skew < 1000, "store clock {ours} vs node {node}");
    }

    // The killed node stays dead; dropping the cluster stops the rest.
    assert!(!cluster.node_mut(dead).is_running());
    eprintln!("test took {:?}", test_started.elapsed());
}

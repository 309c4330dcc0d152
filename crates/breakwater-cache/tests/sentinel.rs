//! Redis Sentinel: a store that finds its master through private sentinels,
//! clear errors when it cannot, and failovers under traffic.
//!
//! The failover tests run two caches ("processes": A invalidates, B reads
//! with an L1) over 300 keys while the master is failed over, once with
//! `SENTINEL FAILOVER` (the old master stays up, accepting writes until the
//! sentinels demote it) and once by killing it. Checked: no value of the
//! wrong key; A never reads a version older than an invalidation of its
//! own that returned `Ok` (not even one the old master acknowledged and the
//! failover lost); B never serves such a version as fresh later than the
//! documented bound after A's invalidation returned; no call hangs; and
//! after the bound every call succeeds, on the new master, with the bus
//! (B's L1 hears A's invalidations) and leases working there.

mod support;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use breakwater_cache::{
    BreakerConfig, Cache, Error, L1Config, RedisStore, RedisStoreConfig, SentinelError, Served,
};
use breakwater_cache_testkit::{RedisSentinel, SentinelSetup};
use support::command_calls;
use tokio::time::{Instant, sleep, timeout};

/// Every call's deadline: a call that takes longer is a hung request.
const CALL_DEADLINE: Duration = Duration::from_secs(5);
/// The longest the sentinels may take to name the new master.
const FAILOVER_DEADLINE: Duration = Duration::from_secs(20);
/// How often the stores ask the sentinels whether the master moved.
const PING: Duration = Duration::from_millis(250);
/// The stores' connect timeout.
const CONNECT: Duration = Duration::from_secs(1);
/// How long after the sentinels name the new master an invalidated value
/// may still be served as fresh (see the `sentinel` module's docs: until
/// each process has noticed, within `subscription_ping` plus a connect
/// timeout, and until the invalidating process has re-applied what the old
/// master may have lost, within another connect timeout), plus a second
/// for a busy machine. Calls that start later must all succeed.
const BOUND: Duration = Duration::from_millis(250 + 2 * 1000 + 1000);

/// Moderate deadlines, as a production config would have on a busy CI
/// machine; the sentinels are asked every 250 ms.
fn config() -> RedisStoreConfig {
    RedisStoreConfig::default()
        .connect_timeout(CONNECT)
        .response_timeout(Duration::from_millis(500))
        .subscription_ping(PING)
        .clock_refresh(Duration::from_millis(250))
}

/// `e`'s Display and Debug.
fn shown(e: &Error) -> String {
    format!("{e} | {e:?}")
}

fn cache_on(store: RedisStore, l1: bool) -> Cache<String> {
    let builder = Cache::builder()
        .namespace("sentinel")
        .store(store)
        .ttl(Duration::from_secs(120))
        .store_breaker(
            BreakerConfig::new()
                .consecutive_failures(5)
                .cool_down(Duration::from_millis(500)),
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

/// A loader of `value`.
fn value(
    value: &str,
) -> impl Fn() -> std::future::Ready<Result<Option<String>, std::io::Error>>
+ Clone
+ Send
+ Sync
+ 'static {
    let value = value.to_owned();
    move || std::future::ready(Ok(Some(value.clone())))
}

/// `GET` of `cache`'s storage key for `key` on data node `node`.
fn stored_on(setup: &RedisSentinel, node: usize, cache: &Cache<String>, key: &str) -> bool {
    let storage = cache.storage_key(key.as_bytes()).unwrap();
    let reply = setup.nodes()[node]
        .command(&["EXISTS", std::str::from_utf8(&storage).unwrap()])
        .unwrap();
    reply == "1"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_finds_the_master_through_the_sentinels_with_passwords_in_urls() {
    let setup = tokio::task::spawn_blocking(|| {
        RedisSentinel::start_with(SentinelSetup {
            sentinels: 1,
            password: Some("data-secret".into()),
            sentinel_password: Some("sentinel-secret".into()),
        })
    })
    .await
    .unwrap();
    // A dead sentinel first: the live one answers.
    let dead = format!("redis://:sentinel-secret@127.0.0.1:{}/", free_port());
    let mut sentinels = vec![dead];
    sentinels.extend(setup.sentinel_urls());
    let store = RedisStore::connect_sentinel_with(
        &sentinels,
        "redis://:data-secret@breakwater/0",
        config(),
    )
    .unwrap();
    let debug = format!("{store:?}");
    assert!(!debug.contains("secret"), "{debug}");
    assert!(debug.contains("breakwater"), "{debug}");
    store.warm_up().await.unwrap();

    let cache = cache_on(store, true);
    let got = cache.get_or_load("k", value("v1")).await.unwrap();
    assert_eq!(got.as_deref(), Some("v1"));
    assert!(
        stored_on(&setup, 0, &cache, "k"),
        "the value is on the master"
    );
    cache.invalidate("k").await.unwrap();
    assert!(!stored_on(&setup, 0, &cache, "k"));
    cache.set("k", &"v2".to_owned()).await.unwrap();
    let got = cache.get_or_load_with_meta("k", value("v3")).await.unwrap();
    assert_eq!(
        (got.value.as_deref(), got.served),
        (Some("v2"), Served::Hit)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failures_are_typed_and_show_no_password() {
    let setup = tokio::task::spawn_blocking(|| {
        RedisSentinel::start_with(SentinelSetup {
            sentinels: 1,
            password: Some("data-secret".into()),
            sentinel_password: Some("sentinel-secret".into()),
        })
    })
    .await
    .unwrap();
    let sentinels = setup.sentinel_urls();
    let quick = RedisStoreConfig::default()
        .connect_timeout(Duration::from_millis(500))
        .subscription_ping(Duration::from_secs(60));
    let failure = async |sentinels: &[String], master: &str| {
        let store = RedisStore::connect_sentinel_with(sentinels, master, quick.clone()).unwrap();
        let err = store.warm_up().await.unwrap_err();
        assert!(err.is_store(), "{err}");
        let shown = shown(&err);
        assert!(!shown.contains("secret"), "a password shows: {shown}");
        let found = SentinelError::find(&err)
            .unwrap_or_else(|| panic!("no SentinelError in {shown}"))
            .clone();
        // A call while reconnecting carries the same cause.
        let call = store.get(b"k").await.unwrap_err();
        assert_eq!(SentinelError::find(&call), Some(&found), "{call}");
        (found, err.to_string())
    };
    use breakwater_cache::Store as _;

    let (err, text) = failure(&sentinels, "redis://:data-secret@nope/0").await;
    assert_eq!(
        err,
        SentinelError::UnknownMaster {
            name: "nope".into(),
            answered: 1,
            asked: 1
        }
    );
    assert!(
        text.contains("no redis sentinel monitors a master named \"nope\""),
        "{text}"
    );

    let dead = [
        format!("redis://127.0.0.1:{}/", free_port()),
        format!("redis://:sentinel-secret@127.0.0.1:{}/", free_port()),
    ];
    let (err, text) = failure(&dead, "breakwater").await;
    let SentinelError::Unreachable { failures } = err else {
        panic!("{err:?}")
    };
    assert_eq!(failures.len(), 2, "{failures:?}");
    assert!(text.contains("no redis sentinel answered"), "{text}");

    // The sentinels' password is wrong: they do not answer.
    let wrong = setup.sentinel_urls()[0].replace("sentinel-secret", "bad-secret");
    let (err, _) = failure(&[wrong], "breakwater").await;
    assert!(matches!(err, SentinelError::Unreachable { .. }), "{err:?}");

    // The master's password is wrong: the sentinels answer, the master not.
    let (err, text) = failure(&sentinels, "redis://:bad-secret@breakwater/0").await;
    assert!(
        matches!(&err, SentinelError::MasterUnreachable { name, .. } if name == "breakwater"),
        "{err:?}"
    );
    assert!(text.contains("cannot be reached"), "{text}");

    // A data node given as a sentinel is not one.
    let (err, text) = failure(&[setup.nodes()[0].url()], "breakwater").await;
    assert!(matches!(err, SentinelError::Unreachable { .. }), "{err:?}");
    assert!(text.contains("SENTINEL"), "{text}");
}

/// Sentinels answering 600 ms late (a delay proxy in front of the one
/// sentinel; library defaults, whose `connect_timeout` is 500 ms): more
/// than one attempt's first budget, and the store still connects, as it
/// does to a single server that slow (the budget doubles per failed
/// attempt), and the value is loaded once and kept on the master.
/// (Before, the lookup had `connect_timeout` on every attempt, whatever
/// the latency: the store never connected.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_sentinels_are_waited_for_as_a_slow_server_is() {
    let setup = tokio::task::spawn_blocking(RedisSentinel::start)
        .await
        .unwrap();
    let sentinel = std::net::SocketAddr::from(([127, 0, 0, 1], setup.sentinels()[0].port()));
    let proxy = breakwater_cache_testkit::FaultProxy::start(sentinel);
    proxy.set(breakwater_cache_testkit::Fault::Delay(
        Duration::from_millis(300),
    ));
    let store = RedisStore::connect_sentinel_with(
        &[proxy.url()],
        setup.master_name(),
        RedisStoreConfig::default(),
    )
    .unwrap();
    let started = Instant::now();
    let connected = loop {
        match store.warm_up().await {
            Ok(()) => break Ok(started.elapsed()),
            Err(err) if started.elapsed() > Duration::from_secs(10) => break Err(err),
            Err(_) => sleep(Duration::from_millis(100)).await,
        }
    };
    let connected = connected.expect("the store connects through slow sentinels");
    eprintln!("connected after {connected:?}");
    let loads = Arc::new(AtomicUsize::new(0));
    let cache = cache_on(store, false);
    let counted = Arc::clone(&loads);
    let got = cache
        .get_or_load("slow", move || {
            counted.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Ok::<_, std::io::Error>(Some("v".to_owned())))
        })
        .await
        .unwrap();
    assert_eq!(got.as_deref(), Some("v"));
    assert_eq!(loads.load(Ordering::SeqCst), 1);
    assert!(stored_on(&setup, 0, &cache, "slow"), "kept on the master");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demoted_master_refusing_writes_sends_the_store_to_the_new_one() {
    let setup = tokio::task::spawn_blocking(RedisSentinel::start)
        .await
        .unwrap();
    // The sentinels are asked only every minute here: the store must learn
    // of the failover from the old master's `READONLY`.
    let store = RedisStore::connect_sentinel_with(
        setup.sentinel_urls(),
        setup.master_name(),
        config().subscription_ping(Duration::from_secs(60)),
    )
    .unwrap();
    store.warm_up().await.unwrap();
    let cache = cache_on(store, false);
    cache.set("before", &"v".to_owned()).await.unwrap();
    assert!(stored_on(&setup, 0, &cache, "before"));

    // Fail over, then demote the old master at once, as the sentinels do
    // later (a `REPLICAOF` keeps its clients connected).
    let setup = tokio::task::spawn_blocking(move || {
        let mut setup = setup;
        setup.failover();
        setup.wait_for_master(1, FAILOVER_DEADLINE);
        let new = setup.nodes()[1].port().to_string();
        let reply = setup.nodes()[0]
            .command(&["REPLICAOF", "127.0.0.1", &new])
            .unwrap();
        assert!(reply.starts_with("OK"), "{reply}");
        setup.wait_for_replica(0, FAILOVER_DEADLINE);
        setup
    })
    .await
    .unwrap();

    // The first write meets `READONLY`; the store goes to the new master
    // and the write succeeds there, within the call's retries or a few
    // calls.
    let started = Instant::now();
    let mut attempts = 0;
    loop {
        attempts += 1;
        match timeout(CALL_DEADLINE, cache.set("after", &"v".to_owned())).await {
            Ok(Ok(())) => break,
            Ok(Err(e)) => eprintln!("set failed: {e}"),
            Err(_) => panic!("set hung"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "writes still fail 5 s after the master was demoted"
        );
        sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "the write succeeded after {attempts} call(s), {:?}",
        started.elapsed()
    );
    assert!(stored_on(&setup, 1, &cache, "after"));
    // The replayed `set` of "before" (acknowledged by the old master)
    // removed it from the new one: at worst a miss, never the old value.
    assert!(!stored_on(&setup, 1, &cache, "before"));
    let got = cache.get_or_load("after", value("loaded")).await.unwrap();
    assert_eq!(got.as_deref(), Some("v"));
}

/// A port that was free on 127.0.0.1 a moment ago.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

// ---------------------------------------------------------------------------
// Failovers under traffic.

/// Keys in the workload.
const KEYS: usize = 300;
/// Workers per process.
const WORKERS: usize = 6;
/// Traffic before the failover.
const SETTLE: Duration = Duration::from_millis(1500);
/// Traffic after the bound, when every call must succeed.
const AFTER: Duration = Duration::from_millis(1500);

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

/// A's invalidations that returned `Ok`: per key, (when, version).
struct Acked {
    per_key: Vec<Mutex<Vec<(Instant, u64)>>>,
}

impl Acked {
    fn new() -> Arc<Acked> {
        Arc::new(Acked {
            per_key: (0..KEYS).map(|_| Mutex::default()).collect(),
        })
    }

    fn record(&self, key: usize, version: u64, at: Instant) {
        self.per_key[key].lock().unwrap().push((at, version));
    }

    /// How long before `at` the first invalidation of a version newer than
    /// `version` returned, if one had.
    fn late_by(&self, key: usize, version: u64, at: Instant) -> Option<Duration> {
        let acked = self.per_key[key].lock().unwrap();
        acked
            .iter()
            .filter(|&&(when, newer)| newer > version && when < at)
            .map(|&(when, _)| at - when)
            .max()
    }
}

/// When a call ran, relative to the failover.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Phase {
    /// Ended before the failover began.
    Before,
    /// Overlapped the time until the sentinels named the new master.
    Failover,
    /// Started within [`BOUND`] after that.
    Recovery,
    /// Started later.
    After,
}

/// The failover's start, and when the sentinels named the new master.
#[derive(Default)]
struct Timeline {
    triggered: Mutex<Option<Instant>>,
    switched: Mutex<Option<Instant>>,
}

impl Timeline {
    /// The phase of a call that ran from `started` until now.
    fn phase(&self, started: Instant) -> Phase {
        let triggered = *self.triggered.lock().unwrap();
        let switched = *self.switched.lock().unwrap();
        match (triggered, switched) {
            (Some(_), Some(s)) if started >= s + BOUND => Phase::After,
            (Some(_), Some(s)) if started >= s => Phase::Recovery,
            (Some(_), _) => Phase::Failover,
            (None, _) => Phase::Before,
        }
    }
}

/// A read older than one of A's invalidations: (key, version read, version
/// invalidated, phase of the read).
type WentBack = (usize, u64, u64, Phase);

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
    /// B: fresh reads of a version older than an invalidation that had
    /// returned, and the longest such lag.
    behind: usize,
    most_behind: Duration,
}

#[derive(Default)]
struct Report {
    tallies: Mutex<HashMap<Phase, Tally>>,
    /// Values of the wrong key: must stay empty.
    wrong_key: Mutex<Vec<String>>,
    /// A's reads older than its own returned invalidation: must stay empty.
    went_back: Mutex<Vec<WentBack>>,
    /// B's fresh reads older than an invalidation that returned more than
    /// [`BOUND`] before: must stay empty.
    too_late: Mutex<Vec<(usize, u64, Duration, Phase)>>,
}

impl Report {
    fn tally(&self, phase: Phase, f: impl FnOnce(&mut Tally)) {
        f(self.tallies.lock().unwrap().entry(phase).or_default());
    }

    fn call<T>(
        &self,
        phase: Phase,
        started: Instant,
        result: &Result<Result<T, Error>, tokio::time::error::Elapsed>,
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

/// What the workers share.
#[derive(Clone)]
struct Shared {
    db: Arc<Db>,
    acked: Arc<Acked>,
    stop: Arc<AtomicBool>,
    timeline: Arc<Timeline>,
    report: Arc<Report>,
}

/// One worker of process A: owns the keys `k % WORKERS == worker` (so no
/// other call of A touches them), reads them and now and then writes the
/// database and invalidates.
async fn invalidating_worker(cache: Cache<String>, worker: usize, s: Shared) {
    // The version each owned key must have reached (at least).
    let mut floor: HashMap<usize, u64> = HashMap::new();
    let owned: Vec<usize> = (worker..KEYS).step_by(WORKERS).collect();
    let mut step = worker;
    while !s.stop.load(Ordering::Relaxed) {
        step = step.wrapping_mul(1_103_515_245).wrapping_add(12_345) % 1_000_003;
        // The key and the choice to invalidate from different digits, so the
        // keys invalidated are the keys read.
        let key = owned[(step / 10) % owned.len()];
        let started = Instant::now();
        if step.is_multiple_of(10) {
            let version = s.db.write(key);
            let result = timeout(CALL_DEADLINE, cache.invalidate(name(key))).await;
            let phase = s.timeline.phase(started);
            s.report.tally(phase, |t| {
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
                floor.insert(key, version);
                s.acked.record(key, version, Instant::now());
            }
            continue;
        }
        let result = timeout(
            CALL_DEADLINE,
            cache.get_or_load(name(key), s.db.loader(key)),
        )
        .await;
        let phase = s.timeline.phase(started);
        s.report.call(phase, started, &result);
        if let Ok(Ok(value)) = result {
            let value = value.expect("the loader always finds a value");
            let (got, version) = parse(&value);
            if got != name(key) {
                let wrong = format!("{} -> {value}", name(key));
                s.report.wrong_key.lock().unwrap().push(wrong);
            }
            if let Some(&min) = floor.get(&key)
                && version < min
            {
                let back = (key, version, min, phase);
                s.report.went_back.lock().unwrap().push(back);
            }
        }
    }
}

/// One worker of process B: reads every key; a value served as fresh must
/// not be older than an invalidation that returned more than [`BOUND`]
/// before the read began.
async fn reading_worker(cache: Cache<String>, worker: usize, s: Shared) {
    let mut step = worker + 7;
    while !s.stop.load(Ordering::Relaxed) {
        step = step.wrapping_mul(1_103_515_245).wrapping_add(12_345) % 1_000_003;
        let key = step % KEYS;
        let started = Instant::now();
        let result = timeout(
            CALL_DEADLINE,
            cache.get_or_load_with_meta(name(key), s.db.loader(key)),
        )
        .await;
        let phase = s.timeline.phase(started);
        s.report.call(phase, started, &result);
        if let Ok(Ok(fetched)) = result
            && let Some(value) = &fetched.value
        {
            let (got, version) = parse(value);
            let current = s.db.versions[key].load(Ordering::SeqCst);
            if got != name(key) || version > current {
                let wrong = format!("{} -> {value} (database at {current})", name(key));
                s.report.wrong_key.lock().unwrap().push(wrong);
            }
            let fresh = !matches!(fetched.served, Served::Stale { .. } | Served::Fallback);
            if fresh && let Some(late) = s.acked.late_by(key, version, started) {
                s.report.tally(phase, |t| {
                    t.behind += 1;
                    t.most_behind = t.most_behind.max(late);
                });
                if late > BOUND {
                    let entry = (key, version, late, phase);
                    s.report.too_late.lock().unwrap().push(entry);
                }
            }
        }
        // B also gives way now and then, so A's invalidations interleave.
        if step.is_multiple_of(50) {
            sleep(Duration::from_millis(1)).await;
        }
    }
}

/// `calls` of the commands a store sends, on data node `node` (0 if it is
/// down). Not `PUBLISH`: the sentinels publish their hello messages on
/// every node.
fn store_commands(setup: &RedisSentinel, node: usize) -> u64 {
    if setup.nodes()[node].command(&["PING"]).is_err() {
        return 0;
    }
    command_calls(&setup.nodes()[node])
        .into_iter()
        .filter(|(name, _)| ["get", "evalsha", "eval", "set", "del"].contains(&name.as_str()))
        .map(|(_, calls)| calls)
        .sum()
}

/// How the master is failed over.
#[derive(Debug, Clone, Copy)]
enum Trigger {
    /// `SENTINEL FAILOVER`: the old master stays up.
    Command,
    /// `SIGKILL` of the master.
    Kill,
}

async fn fail_over_under_traffic(setup: RedisSentinel, trigger: Trigger) {
    let test_started = Instant::now();
    let a_store =
        RedisStore::connect_sentinel_with(setup.sentinel_urls(), setup.master_name(), config())
            .unwrap();
    let b_store =
        RedisStore::connect_sentinel_with(setup.sentinel_urls(), setup.master_name(), config())
            .unwrap();
    a_store.warm_up().await.unwrap();
    b_store.warm_up().await.unwrap();
    let a = cache_on(a_store.clone(), false);
    let b = cache_on(b_store.clone(), true);

    let shared = Shared {
        db: Db::new(),
        acked: Acked::new(),
        stop: Arc::default(),
        timeline: Arc::default(),
        report: Arc::default(),
    };
    let mut workers = Vec::new();
    for worker in 0..WORKERS {
        workers.push(tokio::spawn(invalidating_worker(
            a.clone(),
            worker,
            shared.clone(),
        )));
        workers.push(tokio::spawn(reading_worker(
            b.clone(),
            worker,
            shared.clone(),
        )));
    }
    sleep(SETTLE).await;
    let loads_before = shared.db.loads.load(Ordering::SeqCst);

    let timeline = Arc::clone(&shared.timeline);
    let setup = tokio::task::spawn_blocking(move || {
        let mut setup = setup;
        *timeline.triggered.lock().unwrap() = Some(Instant::now());
        match trigger {
            Trigger::Command => setup.failover(),
            Trigger::Kill => assert_eq!(setup.kill_master(), 0),
        }
        setup.wait_for_master(1, FAILOVER_DEADLINE);
        *timeline.switched.lock().unwrap() = Some(Instant::now());
        setup
    })
    .await
    .unwrap();
    let triggered = shared.timeline.triggered.lock().unwrap().unwrap();
    let switched = shared.timeline.switched.lock().unwrap().unwrap();
    let loads_at_switch = shared.db.loads.load(Ordering::SeqCst);

    sleep(BOUND).await;
    // From here on, nothing goes to the old master.
    let old_master_calls = store_commands(&setup, 0);
    let new_master_calls = store_commands(&setup, 1);
    sleep(AFTER).await;
    shared.stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.await.unwrap();
    }
    let loads_after = shared.db.loads.load(Ordering::SeqCst);
    let old_master_calls = store_commands(&setup, 0).saturating_sub(old_master_calls);
    let new_master_calls = store_commands(&setup, 1) - new_master_calls;

    // The figures.
    let report = &shared.report;
    let tallies = std::mem::take(&mut *report.tallies.lock().unwrap());
    eprintln!(
        "{trigger:?}: the sentinels named the new master {:?} after the trigger",
        switched - triggered
    );
    eprintln!(
        "loads: {loads_before} before, {} during the failover, {} after",
        loads_at_switch - loads_before,
        loads_after - loads_at_switch
    );
    for (phase, tally) in tallies.iter().collect::<BTreeMap<_, _>>() {
        let mut kinds: HashMap<&str, usize> = HashMap::new();
        for kind in &tally.error_kinds {
            *kinds.entry(kind.as_str()).or_default() += 1;
        }
        eprintln!(
            "{phase:?}: {} reads ({} errors), {} invalidations ({} failed), {} hung, slowest {:?}; \
             B's fresh reads behind an invalidation: {}, the most by {:?}; errors: {kinds:?}",
            tally.calls,
            tally.errors,
            tally.invalidations,
            tally.failed_invalidations,
            tally.hung,
            tally.slowest,
            tally.behind,
            tally.most_behind,
        );
    }
    eprintln!(
        "store commands after the bound: {old_master_calls} on the old master, \
         {new_master_calls} on the new one"
    );

    // No wrong value, no hung request, nothing older than allowed.
    let wrong_key = report.wrong_key.lock().unwrap().clone();
    assert!(wrong_key.is_empty(), "wrong values: {wrong_key:?}");
    let hung: usize = tallies.values().map(|t| t.hung).sum();
    assert_eq!(hung, 0, "requests that hit the {CALL_DEADLINE:?} deadline");
    let went_back = report.went_back.lock().unwrap().clone();
    assert!(
        went_back.is_empty(),
        "A read older than its own invalidation: {went_back:?}"
    );
    let too_late = report.too_late.lock().unwrap().clone();
    assert!(
        too_late.is_empty(),
        "B served as fresh a value invalidated more than {BOUND:?} before: {too_late:?}"
    );
    // Traffic flowed in every phase; after the bound, every call succeeds,
    // on the new master.
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
    assert_eq!(old_master_calls, 0, "the old master is still used");
    assert!(new_master_calls > 0, "the new master is not used");

    // The bus moved too: an invalidation in A reaches B's L1.
    let key = 0;
    let first = b
        .get_or_load(name(key), shared.db.loader(key))
        .await
        .unwrap();
    let again = b
        .get_or_load_with_meta(name(key), shared.db.loader(key))
        .await
        .unwrap();
    assert_eq!((again.value, again.served), (first, Served::L1Hit));
    let version = shared.db.write(key);
    a.invalidate(name(key)).await.unwrap();
    let invalidated = Instant::now();
    loop {
        let value = b
            .get_or_load(name(key), shared.db.loader(key))
            .await
            .unwrap();
        if parse(value.as_deref().unwrap()).1 >= version {
            eprintln!(
                "A's invalidation reached B's L1 in {:?}",
                invalidated.elapsed()
            );
            break;
        }
        assert!(
            invalidated.elapsed() < Duration::from_secs(5),
            "B still serves {value:?} from L1 5 s after A invalidated it"
        );
        sleep(Duration::from_millis(10)).await;
    }

    // Leases work on the new master: a fresh key, loaded by both processes
    // at once, is loaded once.
    let calls = Arc::new(AtomicUsize::new(0));
    let mut loads = Vec::new();
    for cache in [&a, &b].into_iter().cycle().take(20) {
        let cache = cache.clone();
        let loader = support::slow_loader(&calls, Duration::from_millis(300), "fresh");
        loads.push(tokio::spawn(async move {
            timeout(CALL_DEADLINE, cache.get_or_load("fresh", loader)).await
        }));
    }
    for load in loads {
        let got = load.await.unwrap().expect("not hung").unwrap();
        assert_eq!(got.as_deref(), Some("fresh"));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1, "one load across processes");
    assert!(stored_on(&setup, 1, &a, "fresh"));

    // The clock is the new master's.
    let time = setup.nodes()[1].command(&["TIME"]).unwrap();
    let mut parts = time.lines().map(|p| p.parse::<u64>().unwrap());
    let node_ms = parts.next().unwrap() * 1000 + parts.next().unwrap() / 1000;
    for store in [&a_store, &b_store] {
        use breakwater_cache::Store as _;
        let skew = store.now_ms().abs_diff(node_ms);
        assert!(
            skew < 1000,
            "store clock {} vs node {node_ms}",
            store.now_ms()
        );
    }
    eprintln!("test took {:?}", test_started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_under_traffic_serves_no_invalidated_value_past_the_bound() {
    let setup = tokio::task::spawn_blocking(RedisSentinel::start)
        .await
        .unwrap();
    fail_over_under_traffic(setup, Trigger::Command).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_under_traffic_is_replaced_without_wrong_values() {
    let setup = tokio::task::spawn_blocking(|| {
        RedisSentinel::start_with(SentinelSetup {
            sentinels: 3,
            ..SentinelSetup::default()
        })
    })
    .await
    .unwrap();
    fail_over_under_traffic(setup, Trigger::Kill).await;
}

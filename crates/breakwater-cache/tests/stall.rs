//! A stalled Redis (SIGSTOP: connections stay open, nothing answers) is not
//! a slow one: a caller that holds a servable L1 copy waits for it at most
//! the store's soft deadline (3 × the recent *answered* round trips, at
//! least `response_timeout`), not the hard deadline its timeouts have
//! grown; the give-ups open the store breaker within a few soft deadlines,
//! and it closes again once Redis answers.
//!
//! The acceptance run of issue 54, with library defaults (50 ms read
//! floor, 2 s ceiling): 50 warm keys in L1 (200 ms L1 TTL), 8 callers,
//! Redis stopped for 3 s; with the database answering, and with it failing
//! and `max_stale` of an hour.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use breakwater_cache::{
    BreakerState, Cache, L1Config, LoadContext, Loaded, RedisStore, RedisStoreConfig, Served,
    StaleReason,
};
use breakwater_cache_testkit::{Fault, FaultProxy};
use support::RedisServer;
use tokio::time::Instant;

/// The tests here measure latencies and count loads at once: they run
/// one at a time (each takes this first), so that one's CPU use (large
/// values, hundreds of tasks) does not show up in another's figures on a
/// 2-core machine.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Keys warmed in L1.
const KEYS: usize = 50;
/// Callers during the stall.
const CALLERS: usize = 8;
/// How long Redis is stopped.
const STALL: Duration = Duration::from_secs(3);

/// What the run saw.
struct Run {
    /// Each call during the stall: its key, how long it took, how it was
    /// served (or its error).
    calls: Vec<(usize, Duration, Result<Served, String>)>,
    /// When the store breaker was first seen open, after the stall began.
    opened_after: Option<Duration>,
    /// How long after SIGCONT a `set` landed in Redis.
    write_after_resume: Duration,
    loads: usize,
}

impl Run {
    fn quantile(&self, q: f64) -> Duration {
        let mut took: Vec<Duration> = self.calls.iter().map(|c| c.1).collect();
        took.sort();
        took[((took.len() as f64 * q) as usize).min(took.len() - 1)]
    }

    fn max(&self) -> Duration {
        self.calls.iter().map(|c| c.1).max().unwrap()
    }
}

/// How the callers of [`stall_with_l1`] ask: one key a call, or
/// `get_many` of 5 keys.
#[derive(Clone, Copy, PartialEq)]
enum Ask {
    One,
    Many,
}

async fn stall_with_l1(database_fails: bool, ask: Ask) -> Run {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).unwrap();
    store.warm_up().await.unwrap();
    let mut builder = Cache::<String>::builder()
        .namespace("stall")
        .store(store)
        .l1(L1Config::new().ttl(Duration::from_millis(200)));
    if database_fails {
        builder = builder.max_stale(Duration::from_secs(3600));
    }
    let cache = builder.build().unwrap();
    let loads = Arc::new(AtomicUsize::new(0));
    let failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let loader = {
        let (loads, failing) = (Arc::clone(&loads), Arc::clone(&failing));
        move |k: usize| {
            let (loads, failing) = (Arc::clone(&loads), Arc::clone(&failing));
            move || async move {
                loads.fetch_add(1, Ordering::SeqCst);
                if failing.load(Ordering::SeqCst) {
                    return Err(std::io::Error::other("database down"));
                }
                Ok(Some(format!("v{k}")))
            }
        }
    };
    // A batch loader of the same rows (what a `get_many` of `kN` loads).
    let batch_loader = {
        let (loads, failing) = (Arc::clone(&loads), Arc::clone(&failing));
        move |ids: Vec<String>| {
            let (loads, failing) = (Arc::clone(&loads), Arc::clone(&failing));
            async move {
                loads.fetch_add(ids.len(), Ordering::SeqCst);
                if failing.load(Ordering::SeqCst) {
                    return Err(std::io::Error::other("database down"));
                }
                let rows = ids.into_iter().map(|id| {
                    let value = id.replacen('k', "v", 1);
                    (id, value)
                });
                Ok(rows.collect::<Vec<_>>())
            }
        }
    };
    // The bus up first, as in a running service: a load that began before
    // the subscription was up is not kept in L1 (an invalidation may have
    // been missed; see `Cache`'s coherence contract).
    cache.get("warm-up").await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    for k in 0..KEYS {
        cache.get_or_load(format!("k{k}"), loader(k)).await.unwrap();
    }
    // The L1 copies are past their 200 ms: every call reads the store.
    tokio::time::sleep(Duration::from_millis(250)).await;
    failing.store(database_fails, Ordering::SeqCst);
    let warm_loads = loads.load(Ordering::SeqCst);

    server.pause();
    let stalled = Instant::now();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let opened = Arc::new(Mutex::new(None));
    let watcher = {
        let (cache, opened) = (cache.clone(), Arc::clone(&opened));
        tokio::spawn(async move {
            while stalled.elapsed() < STALL {
                if cache.store_breaker_state() == BreakerState::Open {
                    opened.lock().unwrap().get_or_insert(stalled.elapsed());
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let callers: Vec<_> = (0..CALLERS)
        .map(|c| {
            let (cache, calls, loader) = (cache.clone(), Arc::clone(&calls), loader.clone());
            let batch_loader = batch_loader.clone();
            tokio::spawn(async move {
                let mut k = c;
                while stalled.elapsed() < STALL {
                    let started = Instant::now();
                    let (keys, got) = match ask {
                        Ask::One => {
                            let got = cache
                                .get_or_load_with_meta(format!("k{k}"), loader(k))
                                .await;
                            (vec![k], vec![got])
                        }
                        Ask::Many => {
                            let keys: Vec<usize> = (0..5).map(|j| (k + j * 10) % KEYS).collect();
                            let names = keys.iter().map(|k| format!("k{k}"));
                            let got = cache.get_many_with_meta(names, batch_loader.clone()).await;
                            (keys, got)
                        }
                    };
                    let took = started.elapsed();
                    for (&k, got) in keys.iter().zip(got) {
                        let got = got
                            .map(|fetched| {
                                assert_eq!(
                                    fetched.value.as_deref(),
                                    Some(format!("v{k}").as_str())
                                );
                                fetched.served
                            })
                            .map_err(|e| e.to_string());
                        calls.lock().unwrap().push((k, took, got));
                    }
                    k = (k + 7) % KEYS;
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            })
        })
        .collect();
    for caller in callers {
        caller.await.unwrap();
    }
    watcher.await.unwrap();
    server.resume();
    let resumed = Instant::now();

    // A write after SIGCONT reaches Redis once the breaker lets it.
    let probe = "bw:stall:v:{after}";
    loop {
        let written = cache.set("after", &"x".to_owned()).await.is_ok();
        if written && server.command(&["EXISTS", probe]).unwrap().trim() == "1" {
            break;
        }
        assert!(
            resumed.elapsed() < Duration::from_secs(10),
            "no write landed after SIGCONT"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let write_after_resume = resumed.elapsed();
    let calls = std::mem::take(&mut *calls.lock().unwrap());
    let opened_after = *opened.lock().unwrap();
    Run {
        calls,
        opened_after,
        write_after_resume,
        loads: loads.load(Ordering::SeqCst) - warm_loads,
    }
}

fn check(run: &Run, what: &str) {
    let errors: Vec<_> = run.calls.iter().filter(|c| c.2.is_err()).collect();
    let stand_ins = run
        .calls
        .iter()
        .filter(|c| {
            c.2 == Ok(Served::Stale {
                reason: StaleReason::StoreUnavailable,
            })
        })
        .count();
    eprintln!(
        "{what}: {} calls, {} errors, {stand_ins} L1 stand-ins, p50 {:?}, p99 {:?}, max {:?}, \
         breaker open after {:?}, a write landed {:?} after SIGCONT, {} loads",
        run.calls.len(),
        errors.len(),
        run.quantile(0.5),
        run.quantile(0.99),
        run.max(),
        run.opened_after,
        run.write_after_resume,
        run.loads,
    );
    assert!(errors.is_empty(), "{what}: errors {errors:?}");
    assert!(stand_ins > 0, "{what}: no call was served the L1 copy");
    assert!(
        run.quantile(0.99) <= Duration::from_millis(250),
        "{what}: p99 {:?}",
        run.quantile(0.99)
    );
    assert!(
        run.max() <= Duration::from_secs(1),
        "{what}: max {:?}",
        run.max()
    );
    let opened = run.opened_after.expect("the store breaker never opened");
    assert!(
        opened <= Duration::from_secs(1),
        "{what}: the breaker opened after {opened:?}"
    );
    assert!(
        run.write_after_resume <= Duration::from_secs(3),
        "{what}: a write landed {:?} after SIGCONT",
        run.write_after_resume
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_redis_costs_a_caller_with_an_l1_copy_one_soft_deadline() {
    let _one = ONE_AT_A_TIME.lock().await;
    let run = stall_with_l1(false, Ask::One).await;
    check(&run, "stall");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_redis_and_a_failing_database_cost_no_errors() {
    let _one = ONE_AT_A_TIME.lock().await;
    let run = stall_with_l1(true, Ask::One).await;
    check(&run, "stall, database failing");
}

/// The same with `get_many` of 5 keys whose L1 copies all stand in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_redis_costs_a_batch_of_l1_copies_one_soft_deadline() {
    let _one = ONE_AT_A_TIME.lock().await;
    let run = stall_with_l1(true, Ask::Many).await;
    check(&run, "stall, get_many, database failing");
}

/// A `get` left pending on a current-thread runtime that then goes idle
/// (its future kept, never polled again) while it holds the namespace
/// clear record's read lock; Redis answers 300 ms late. A `get` on another
/// runtime waits for the lock at most one read deadline, then reads the
/// record beside it: it returns within 3 s (it never did while the lock
/// had no deadline).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranded_clear_record_reader_holds_up_no_other_runtime() {
    let _one = ONE_AT_A_TIME.lock().await;
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let writer = Cache::<String>::builder()
        .namespace("stranded")
        .store(RedisStore::connect(&server.url()).unwrap())
        .build()
        .unwrap();
    writer.set("k", &"v".to_owned()).await.unwrap();
    writer.set("other", &"w".to_owned()).await.unwrap();
    // Late from the start: the handshake's round trip sets the deadlines.
    proxy.set(Fault::Delay(Duration::from_millis(300)));
    let config = RedisStoreConfig::default().connect_timeout(Duration::from_secs(2));
    let store = RedisStore::connect_with(&proxy.url(), config).unwrap();
    store.warm_up().await.unwrap();
    let cache = Cache::<String>::builder()
        .namespace("stranded")
        .store(store)
        .build()
        .unwrap();

    let (ready, stranded) = std::sync::mpsc::channel();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let other = cache.clone();
    let idle = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        // Two round trips (the entry's GET among them) take 600 ms; then
        // the record's read (and its lock) is in the air until 900 ms:
        // polled until 750 ms.
        let mut pending = Box::pin(async move { other.get("k").await });
        runtime.block_on(async {
            let _ = tokio::time::timeout(Duration::from_millis(750), &mut pending).await;
        });
        ready.send(()).unwrap();
        let _ = released.recv_timeout(Duration::from_secs(30));
        drop(pending);
    });
    stranded.recv().unwrap();

    let started = Instant::now();
    // (Another key: the stranded `get` would lead a shared read of `k`.)
    let got = tokio::time::timeout(Duration::from_secs(10), cache.get("other")).await;
    let took = started.elapsed();
    release.send(()).unwrap();
    idle.join().unwrap();
    eprintln!("a get beside a stranded record reader took {took:?}");
    let got = got.expect("no answer within 10 s beside a stranded record reader");
    assert_eq!(got.unwrap().as_deref(), Some("w"));
    assert!(took <= Duration::from_secs(3), "took {took:?}");
}

/// A cache on a Redis whose every round trip takes `round_trip` (the fault
/// proxy holds each direction half of it) from the start, in a version
/// transition if `transition`.
async fn late_cache(
    server: &RedisServer,
    round_trip: Duration,
    transition: bool,
) -> (FaultProxy, Cache<String>) {
    let proxy = FaultProxy::start(server.addr());
    proxy.set(Fault::Delay(round_trip / 2));
    let config = RedisStoreConfig::default().connect_timeout(Duration::from_secs(3));
    let store = RedisStore::connect_with(&proxy.url(), config).unwrap();
    store.warm_up().await.unwrap();
    let mut builder = Cache::<String>::builder().namespace("late").store(store);
    if transition {
        builder = builder
            .version(2)
            .version_transition(Duration::from_secs(600));
    }
    (proxy, builder.build().unwrap())
}

/// Redis answering 600 ms and 1,200 ms late (and inside a version
/// transition, whose invalidations take two round trips): 8 of each of
/// `invalidate`, `invalidate_many`, `expire` and `invalidate_tag` at once
/// all return `Ok`, and each landed. Before, each had a fixed 1 s: most
/// returned "was not delivered" for invalidations that had landed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidations_on_a_late_redis_say_ok_when_they_landed() {
    let _one = ONE_AT_A_TIME.lock().await;
    let server = RedisServer::start();
    for (round_trip, transition) in [(600, false), (1_200, false), (600, true)] {
        let (_proxy, cache) =
            late_cache(&server, Duration::from_millis(round_trip), transition).await;
        let value = |k: &str| String::from_utf8(cache.storage_key(k).unwrap()).unwrap();
        // Written directly (not through the slow proxy).
        let keys: Vec<String> = (0..8)
            .flat_map(|i| [format!("i{i}"), format!("m{i}"), format!("e{i}")])
            .collect();
        for k in &keys {
            server.command(&["SET", &value(k), "x"]).unwrap();
        }
        let started = Instant::now();
        let calls: Vec<_> = (0..8)
            .flat_map(|i| {
                let c = [cache.clone(), cache.clone(), cache.clone(), cache.clone()];
                let [a, b, c, d] = c;
                [
                    tokio::spawn(async move { a.invalidate(format!("i{i}")).await }),
                    tokio::spawn(async move { b.invalidate_many([format!("m{i}")]).await }),
                    tokio::spawn(async move { c.expire(format!("e{i}")).await }),
                    tokio::spawn(async move { d.invalidate_tag(format!("t{i}")).await }),
                ]
            })
            .collect();
        let mut errors = Vec::new();
        for call in calls {
            if let Err(err) = call.await.unwrap() {
                errors.push(err.to_string());
            }
        }
        let took = started.elapsed();
        eprintln!(
            "round trip {round_trip} ms, transition {transition}: 32 invalidations in {took:?}, {} error(s)",
            errors.len()
        );
        assert!(
            errors.is_empty(),
            "round trip {round_trip} ms, transition {transition}: {errors:?}"
        );
        for i in 0..8 {
            for k in [format!("i{i}"), format!("m{i}")] {
                assert_eq!(
                    server.command(&["EXISTS", &value(&k)]).unwrap().trim(),
                    "0",
                    "{k}"
                );
            }
        }
    }
}

/// `len` bytes of text that does not compress (seeded).
fn incompressible(seed: u64, len: usize) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ALPHABET[(x % 64) as usize] as char
        })
        .collect()
}

/// `set_many` of 300 values of 512 KiB (150 MiB) with library defaults,
/// while another task reads a small warm key every 10 ms: the bulk write
/// returns `Ok` with every key written, and no small read waits behind
/// megabytes (steps are bounded by bytes as well as keys). Before, the
/// 300 values went as one 150 MiB transaction: `Err(redis did not answer
/// in time)` although every key landed, and the small reads waited behind
/// it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_write_of_large_values_lands_and_small_reads_pass_it() {
    let _one = ONE_AT_A_TIME.lock().await;
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).unwrap();
    store.warm_up().await.unwrap();
    let cache = Cache::<String>::builder()
        .namespace("large")
        .store(store)
        .build()
        .unwrap();
    cache.set("small", &"s".to_owned()).await.unwrap();
    // One incompressible 512 KiB text (each value is compressed on its
    // own), told apart by its first bytes: made once, not 300 times (in a
    // debug build that took seconds of a core the other tests need).
    let noise = incompressible(7, 512 * 1024 - 8);
    let items: Vec<(String, String)> = (0..300)
        .map(|i| (format!("big{i}"), format!("{i:08}{noise}")))
        .collect();

    let writing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let reader = {
        let (cache, writing) = (cache.clone(), Arc::clone(&writing));
        tokio::spawn(async move {
            let mut took = Vec::new();
            while writing.load(Ordering::SeqCst) {
                let started = Instant::now();
                let got = cache.get("small").await;
                took.push(started.elapsed());
                assert_eq!(got.unwrap().as_deref(), Some("s"));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            took
        })
    };
    tokio::time::sleep(Duration::from_millis(30)).await;
    let started = Instant::now();
    let written = cache
        .set_many(items.iter().map(|(k, v)| (k.as_str(), v.clone())))
        .await;
    let write_took = started.elapsed();
    writing.store(false, Ordering::SeqCst);
    let mut took = reader.await.unwrap();
    took.sort();
    let p99 = took[((took.len() as f64 * 0.99) as usize).min(took.len() - 1)];
    eprintln!(
        "set_many of 300 x 512 KiB: {written:?} in {write_took:?}; {} small reads beside it, p99 {p99:?}, max {:?}",
        took.len(),
        took.last().unwrap()
    );
    written.unwrap();
    let stored = server.command(&["DBSIZE"]).unwrap();
    assert!(
        stored.trim().parse::<u64>().unwrap() >= 301,
        "DBSIZE {stored}"
    );
    for (k, _) in items.iter().step_by(37) {
        let key = String::from_utf8(cache.storage_key(k.as_str()).unwrap()).unwrap();
        assert_eq!(
            server.command(&["EXISTS", &key]).unwrap().trim(),
            "1",
            "{k}"
        );
    }
    assert!(
        p99 <= Duration::from_millis(250),
        "p99 of the small reads {p99:?}"
    );
}

/// 4 caches in `namespace` on `server` with library defaults, as 4
/// processes would have (each its own connection, bus and flights), each
/// with its bus up, as in a running service.
async fn fleet(server: &RedisServer, namespace: &str) -> Vec<Cache<String>> {
    let mut caches = Vec::new();
    for _ in 0..4 {
        let store = RedisStore::connect(&server.url()).unwrap();
        store.warm_up().await.unwrap();
        let cache = Cache::<String>::builder()
            .namespace(namespace)
            .store(store)
            .build()
            .unwrap();
        cache.get("warm-up").await.unwrap();
        caches.push(cache);
    }
    caches
}

/// How one caller of [`hit_for_pass`] ended: when, and whether it got the
/// value.
type Answer = (Duration, Result<Option<String>, String>);

/// 4 caches (4 processes, each its own connection, bus and flights) × 50
/// callers on one cold key whose load takes 300 ms and then fails (or
/// answers "do not cache"); every caller's answer and the loads made.
async fn hit_for_pass(fails: bool) -> (Vec<Answer>, usize) {
    const LOAD: Duration = Duration::from_millis(300);
    let server = RedisServer::start();
    let caches = fleet(&server, "pass").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let loads = Arc::new(AtomicUsize::new(0));
    let loader = {
        let loads = Arc::clone(&loads);
        move |_ctx: LoadContext<String>| {
            let loads = Arc::clone(&loads);
            async move {
                loads.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(LOAD).await;
                if fails {
                    Err(std::io::Error::other("database down"))
                } else {
                    Ok(Loaded::value("uncacheable".to_owned()).do_not_cache())
                }
            }
        }
    };
    let started = Instant::now();
    let calls: Vec<_> = caches
        .iter()
        .flat_map(|cache| (0..50).map(move |_| cache.clone()))
        .map(|cache| {
            let loader = loader.clone();
            tokio::spawn(async move {
                let got = cache.get_or_load_with_context("cold", loader).await;
                (started.elapsed(), got.map_err(|e| e.to_string()))
            })
        })
        .collect();
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await.unwrap());
    }
    (answers, loads.load(Ordering::SeqCst))
}

fn check_pass(answers: &[Answer], loads: usize, what: &str) {
    let last = answers.iter().map(|a| a.0).max().unwrap();
    eprintln!(
        "{what}: {} callers, {loads} load(s), the last answered after {last:?}",
        answers.len()
    );
    // 2 × the load + 500 ms (before: one load per process, in series,
    // the last answered after 1.2 s).
    assert!(
        last <= Duration::from_millis(1_100),
        "{what}: the last caller answered after {last:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_fill_answers_the_fleets_waiters_with_its_error() {
    let _one = ONE_AT_A_TIME.lock().await;
    let (answers, loads) = hit_for_pass(true).await;
    for (_, got) in &answers {
        assert!(got.is_err(), "{got:?}");
    }
    check_pass(&answers, loads, "failing loader");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncacheable_fill_answers_the_fleets_waiters_with_its_value() {
    let _one = ONE_AT_A_TIME.lock().await;
    let (answers, loads) = hit_for_pass(false).await;
    for (_, got) in &answers {
        assert_eq!(got.as_ref().unwrap().as_deref(), Some("uncacheable"));
    }
    check_pass(&answers, loads, "do not cache");
}

/// A hot key's lease key deleted every 20 ms (evicted under `maxmemory`,
/// or deleted by hand) during its 500 ms load, 4 processes × 10 callers,
/// 3 rounds: at most 2 loads of the key at once (the holder and one
/// takeover at the lease's expiry). Before, every waiting process took the
/// vanished lease at its next poll: 4 loads at once in every round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_lease_costs_at_most_one_takeover() {
    let _one = ONE_AT_A_TIME.lock().await;
    const LOAD: Duration = Duration::from_millis(500);
    let server = RedisServer::start();
    let caches = fleet(&server, "evicted").await;
    let (running, peak, loads) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    for round in 0..3 {
        let key = format!("hot{round}");
        let lease = String::from_utf8(caches[0].storage_key(key.as_str()).unwrap())
            .unwrap()
            .replacen(":v:", ":l:", 1);
        let deleting = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let deleter = {
            let (deleting, mut conn, lease) = (Arc::clone(&deleting), conn.clone(), lease.clone());
            tokio::spawn(async move {
                let mut deleted = 0;
                while deleting.load(Ordering::SeqCst) {
                    let n: u32 = redis::cmd("DEL")
                        .arg(&lease)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    deleted += n;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                deleted
            })
        };
        let calls: Vec<_> = caches
            .iter()
            .flat_map(|cache| (0..10).map(move |_| cache.clone()))
            .map(|cache| {
                let (running, peak, loads, key) = (
                    Arc::clone(&running),
                    Arc::clone(&peak),
                    Arc::clone(&loads),
                    key.clone(),
                );
                tokio::spawn(async move {
                    cache
                        .get_or_load(key, move || async move {
                            loads.fetch_add(1, Ordering::SeqCst);
                            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                            peak.fetch_max(now, Ordering::SeqCst);
                            tokio::time::sleep(LOAD).await;
                            running.fetch_sub(1, Ordering::SeqCst);
                            Ok::<_, std::io::Error>(Some("v".to_owned()))
                        })
                        .await
                })
            })
            .collect();
        for call in calls {
            assert_eq!(call.await.unwrap().unwrap().as_deref(), Some("v"));
        }
        deleting.store(false, Ordering::SeqCst);
        let deleted = deleter.await.unwrap();
        eprintln!(
            "round {round}: lease deleted {deleted} times, {} loads so far, at most {} at once",
            loads.load(Ordering::SeqCst),
            peak.load(Ordering::SeqCst)
        );
        let _: () = redis::cmd("PING").query_async(&mut conn).await.unwrap();
    }
    assert!(
        peak.load(Ordering::SeqCst) <= 2,
        "{} loads at once",
        peak.load(Ordering::SeqCst)
    );
}

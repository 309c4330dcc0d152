//! A slow Redis costs no extra loads: the store's deadlines follow the
//! latency Redis actually has, and a read that times out still goes
//! through the fleet's lease.
//!
//! The acceptance run: a private `redis-server` behind the testkit's delay
//! proxy, so that every command's round trip is 100 ms (and, separately,
//! 250 ms); two OS processes (this test binary again, as
//! [`fleet_process`]) with library defaults start 200 callers each on one
//! cold key at the same instant. Exactly one loader call fleet-wide, and
//! no errors.

mod support;

use std::io::Read;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use breakwater_cache::{Cache, RedisStore};
use breakwater_cache_testkit::{Fault, FaultProxy, RedisServer, TiedChild, tied_command};

/// Callers per process, all on one key.
const CALLERS: usize = 200;
/// How long the loader takes.
const LOAD: Duration = Duration::from_millis(100);

fn unix_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// One process of the fleet (run by [`fleet`] as a child, with
/// `BW_SLOW_URL` set; a no-op otherwise): a cache with library defaults on
/// a cold store; at `BW_SLOW_START` (Unix ms) 200 tasks call
/// `get_or_load` on one key. Prints `loads=<n> errors=<e>` and what the
/// store measured: `round_trip_us=<peak> read_deadline_ms=<r>
/// write_deadline_ms=<w>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_process() {
    let Ok(url) = std::env::var("BW_SLOW_URL") else {
        return;
    };
    let start: u64 = std::env::var("BW_SLOW_START").unwrap().parse().unwrap();
    let store = RedisStore::connect(&url).unwrap();
    let cache = Cache::<String>::builder()
        .namespace("slow")
        .store(store.clone())
        .build()
        .unwrap();
    let loads = Arc::new(AtomicUsize::new(0));
    tokio::time::sleep(Duration::from_millis(start.saturating_sub(unix_ms()))).await;
    let callers: Vec<_> = (0..CALLERS)
        .map(|_| {
            let (cache, loads) = (cache.clone(), Arc::clone(&loads));
            tokio::spawn(async move {
                cache
                    .get_or_load("product:42", move || async move {
                        loads.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(LOAD).await;
                        Ok::<_, std::io::Error>(Some("the product".to_owned()))
                    })
                    .await
            })
        })
        .collect();
    let mut errors = 0;
    for caller in callers {
        match caller.await.unwrap() {
            Ok(Some(value)) => assert_eq!(value, "the product"),
            Ok(None) => panic!("a value was loaded"),
            Err(err) => {
                if errors < 3 {
                    eprintln!("error: {err}");
                }
                errors += 1;
            }
        }
    }
    let latency = store.latency();
    println!(
        "loads={} errors={errors} round_trip_us={} read_deadline_ms={} write_deadline_ms={}",
        loads.load(Ordering::SeqCst),
        latency.round_trip.map_or(0, |d| d.as_micros()),
        latency.read_deadline.as_millis(),
        latency.write_deadline.as_millis(),
    );
}

/// What one process of the fleet reported.
#[derive(Debug)]
struct Report {
    loads: u64,
    errors: u64,
    line: String,
}

/// Runs two [`fleet_process`]es against a Redis whose every round trip
/// through the proxy takes `round_trip` (the proxy holds each direction
/// for half of it).
fn fleet(round_trip: Duration) -> Vec<Report> {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    proxy.set(Fault::Delay(round_trip / 2));
    let start = unix_ms() + 1_500;
    let mut children: Vec<TiedChild> = (0..2)
        .map(|_| {
            let mut cmd = tied_command(std::env::current_exe().unwrap());
            cmd.args([
                "--exact",
                "fleet_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("BW_SLOW_URL", proxy.url())
            .env("BW_SLOW_START", start.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
            TiedChild::spawn(cmd).unwrap()
        })
        .collect();
    let mut reports = Vec::new();
    for child in &mut children {
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(std::time::Instant::now() < deadline, "a process hung");
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(status.success(), "{status:?}");
        let mut out = String::new();
        child
            .take_stdout()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        // (The test harness may print its own words on the same line.)
        let line = out
            .lines()
            .find_map(|l| l.find("loads=").map(|at| l[at..].to_owned()))
            .unwrap_or_else(|| panic!("no counts in {out:?}"));
        let field = |name: &str| -> u64 {
            line.split(' ')
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                .unwrap()
                .parse()
                .unwrap()
        };
        reports.push(Report {
            loads: field("loads"),
            errors: field("errors"),
            line: line.clone(),
        });
    }
    reports
}

fn one_load_no_errors(round_trip: Duration) {
    let reports = fleet(round_trip);
    for report in &reports {
        println!("round trip {round_trip:?}: {}", report.line);
    }
    let loads: u64 = reports.iter().map(|r| r.loads).sum();
    let errors: u64 = reports.iter().map(|r| r.errors).sum();
    assert_eq!(
        (loads, errors),
        (1, 0),
        "2 processes x {CALLERS} callers on one cold key, every round trip {round_trip:?}: {reports:?}"
    );
}

#[test]
fn a_redis_answering_100ms_late_costs_one_load_fleet_wide() {
    one_load_no_errors(Duration::from_millis(100));
}

#[test]
fn a_redis_answering_250ms_late_costs_one_load_fleet_wide() {
    one_load_no_errors(Duration::from_millis(250));
}

/// The bus holds at the same latency: a subscription through the delay
/// proxy (every round trip 100 ms, then 250 ms) comes up and stays up for
/// 4 s, its `PING`s (every second) answered within the store's read
/// deadline in force. Before, a `PING` had `response_timeout` (50 ms) and
/// the subscription dropped and came back every second, every drop
/// unverifying every L1 entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_redis_keeps_its_subscription() {
    for round_trip in [Duration::from_millis(100), Duration::from_millis(250)] {
        let server = RedisServer::start();
        let proxy = FaultProxy::start(server.addr());
        proxy.set(Fault::Delay(round_trip / 2));
        let store = RedisStore::connect(&proxy.url()).unwrap();
        // A command or two first, as a cache's calls would make: the
        // deadlines learn the latency.
        let _ = breakwater_cache::Store::get(&store, b"warm-up").await;
        let _ = breakwater_cache::Store::get(&store, b"warm-up").await;
        let mut bus = breakwater_cache::Store::subscribe(&store, b"bus");
        assert!(
            bus.ready(Duration::from_secs(10)).await,
            "subscribed at {round_trip:?}"
        );
        let mut missed = 0;
        let until = tokio::time::Instant::now() + Duration::from_secs(4);
        while let Ok(Some(delivery)) = tokio::time::timeout_at(until, bus.recv()).await {
            if delivery == breakwater_cache::Delivery::Missed {
                missed += 1;
            }
        }
        // The announcement of the subscription itself, at most.
        assert!(
            missed <= 1 && bus.is_ready(),
            "at {round_trip:?}: {missed} drops in 4 s, ready {}",
            bus.is_ready()
        );
    }
}

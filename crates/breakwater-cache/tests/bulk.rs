//! Bulk writes with default settings against a private Redis: many `set`s
//! in flight at once must all land.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use breakwater_cache::{Cache, L1Config, RedisStore};
use support::RedisServer;

/// A cache with default settings on `server`.
fn bulk_cache(server: &RedisServer) -> Cache<String> {
    Cache::builder()
        .namespace("bulk")
        .store(RedisStore::connect(&server.url()).unwrap())
        .build()
        .unwrap()
}

/// A cache with an L1 on `server`, in the same namespace.
fn l1_cache(server: &RedisServer) -> Cache<String> {
    Cache::builder()
        .namespace("bulk")
        .store(RedisStore::connect(&server.url()).unwrap())
        .l1(L1Config::new())
        .build()
        .unwrap()
}

/// Calls of command `name` that `server` has run.
fn calls_of(server: &RedisServer, name: &str) -> u64 {
    support::command_calls(server)
        .into_iter()
        .find(|(n, _)| n == name)
        .map_or(0, |(_, calls)| calls)
}

/// A load of `key` by `cache` that answers `value` after 500 ms, once it
/// holds the key's lease; its task and its loader's call count.
async fn load_in_flight(
    cache: &Cache<String>,
    key: &'static str,
    value: &'static str,
) -> (
    tokio::task::JoinHandle<Result<Option<String>, breakwater_cache::Error>>,
    Arc<AtomicUsize>,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    let slow = support::slow_loader(&calls, std::time::Duration::from_millis(500), value);
    let load = tokio::spawn({
        let cache = cache.clone();
        async move { cache.get_or_load(key, slow).await }
    });
    support::until("the load holds the lease", || {
        calls.load(Ordering::SeqCst) == 1
    })
    .await;
    (load, calls)
}

/// `PUBLISH`es `server` has run.
fn publishes(server: &RedisServer) -> u64 {
    calls_of(server, "publish")
}

/// Loads `"old"` into `cache` (its L1 too) for each key `k<i>` below
/// `total`.
async fn hold_old_copies(cache: &Cache<String>, total: usize) {
    for i in 0..total {
        let key = format!("k{i}");
        let old = cache
            .get_or_load(&key, || async {
                Ok::<_, std::io::Error>(Some("old".to_owned()))
            })
            .await
            .unwrap();
        assert_eq!(old.as_deref(), Some("old"));
    }
}

/// Waits (up to 5 s) until `cache` reads `expected(i)` for each key `k<i>`
/// below `total` (its L1 copies dropped once it heard the notices).
async fn reads_come_to(
    cache: &Cache<String>,
    total: usize,
    expected: impl Fn(usize) -> Option<String>,
) {
    let deadline = Instant::now() + std::time::Duration::from_secs(5);
    for i in 0..total {
        loop {
            let got = cache.get(&format!("k{i}")).await.unwrap();
            if got == expected(i) {
                break;
            }
            assert!(Instant::now() < deadline, "k{i} still {got:?}");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_sets_with_a_hundred_in_flight_all_land() {
    let server = RedisServer::start();
    let cache = bulk_cache(&server);
    let total = 100_000usize;
    let next = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let latencies = Arc::new(std::sync::Mutex::new(Vec::with_capacity(total)));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..100 {
        let (cache, next, failed) = (cache.clone(), Arc::clone(&next), Arc::clone(&failed));
        let latencies = Arc::clone(&latencies);
        workers.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    break;
                }
                let sent = Instant::now();
                let result = cache.set(format!("k{i}"), &format!("value {i}")).await;
                mine.push(sent.elapsed());
                if let Err(err) = result
                    && failed.fetch_add(1, Ordering::Relaxed) < 3
                {
                    eprintln!("set k{i}: {err}");
                }
            }
            latencies.lock().unwrap().extend(mine);
        }));
    }
    for worker in workers {
        worker.await.unwrap();
    }
    let took = started.elapsed();
    let mut latencies = std::mem::take(&mut *latencies.lock().unwrap());
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    eprintln!(
        "{total} sets, 100 in flight: {took:?} ({:.0}/s), {} failed; latency p50 {:?} p99 {:?} p99.9 {:?} max {:?}",
        total as f64 / took.as_secs_f64(),
        failed.load(Ordering::Relaxed),
        at(0.5),
        at(0.99),
        at(0.999),
        latencies[latencies.len() - 1]
    );
    assert_eq!(failed.load(Ordering::Relaxed), 0);
    // The entries, and the namespace's clear record (a pin).
    assert_eq!(
        server.command(&["DBSIZE"]).unwrap(),
        (total + 1).to_string()
    );
}

/// `set_many` of 100,000 keys with default settings, next to raw pipelined
/// `SET PX`s of the same entries (batches of 500) in the same run (the
/// figures are printed; `breakwater bench write` compares them in
/// interleaved trials).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_many_writes_a_hundred_thousand_keys_next_to_raw_pipelined_sets() {
    let server = RedisServer::start();
    let cache = bulk_cache(&server);
    let total = 100_000usize;
    let started = Instant::now();
    cache
        .set_many((0..total).map(|i| (format!("k{i}"), format!("value {i}"))))
        .await
        .unwrap();
    let ours = started.elapsed();
    // The entries, and the namespace's clear record (a pin).
    assert_eq!(
        server.command(&["DBSIZE"]).unwrap(),
        (total + 1).to_string()
    );
    assert_eq!(
        cache.get("k4242").await.unwrap().as_deref(),
        Some("value 4242")
    );

    server.command(&["FLUSHALL"]).unwrap();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let started = Instant::now();
    for chunk in (0..total).collect::<Vec<_>>().chunks(500) {
        let mut pipe = redis::pipe();
        for i in chunk {
            pipe.cmd("SET")
                .arg(format!("bw:bulk:v:{{k{i}}}"))
                .arg(format!("value {i}"))
                .arg("PX")
                .arg(300_000)
                .ignore();
        }
        pipe.query_async::<()>(&mut conn).await.unwrap();
    }
    let raw = started.elapsed();
    // (The cache, still up, puts its clear record back within a second
    // of the FLUSHALL: a process that knows it keeps it.)
    let record: usize = server
        .command(&["EXISTS", "bw:bulk:c"])
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(
        server.command(&["DBSIZE"]).unwrap(),
        (total + record).to_string()
    );
    eprintln!(
        "{total} keys: set_many {ours:?} ({:.0}/s), raw pipelined SET PX {raw:?} ({:.0}/s)",
        total as f64 / ours.as_secs_f64(),
        total as f64 / raw.as_secs_f64()
    );
}

/// A warm-up of 100,000 keys, 100 in flight, otherwise default settings:
/// every key loaded and written, none failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_up_of_a_hundred_thousand_keys_with_a_hundred_in_flight() {
    let server = RedisServer::start();
    let cache = bulk_cache(&server);
    let total = 100_000usize;
    let report = cache
        .warm(
            (0..total).map(|i| format!("k{i}")),
            |key: String| async move { Ok::<_, std::io::Error>(Some(format!("value of {key}"))) },
            breakwater_cache::Warm::new()
                .rate(1_000_000)
                .concurrency(100),
        )
        .await
        .unwrap();
    eprintln!(
        "warm of {total} keys, 100 in flight: {:?} ({:.0}/s), loaded {}, failed {}",
        report.elapsed,
        total as f64 / report.elapsed.as_secs_f64(),
        report.loaded,
        report.failed
    );
    assert_eq!(
        (report.loaded, report.failed),
        (total, 0),
        "{:?}",
        report.first_error
    );
    // The entries, and the namespace's clear record (a pin).
    assert_eq!(
        server.command(&["DBSIZE"]).unwrap(),
        (total + 1).to_string()
    );
}

/// `set_many` tells the other processes once per step (one `PUBLISH` for
/// up to 1,024 keys, not one per key), and a process that kept L1 copies
/// of those keys drops every one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_many_tells_other_processes_once_per_step_and_they_drop_their_copies() {
    let server = RedisServer::start();
    let a = bulk_cache(&server);
    let b = l1_cache(&server);
    let total = 2_000usize;
    hold_old_copies(&b, total).await;
    let publishes = || publishes(&server);
    let before = publishes();
    a.set_many((0..total).map(|i| (format!("k{i}"), format!("new {i}"))))
        .await
        .unwrap();
    assert_eq!(
        publishes() - before,
        2,
        "2,000 keys: two steps of up to 1,024"
    );
    // Each of b's copies goes once the notice is heard (b's reads, from
    // then on, take the store's new values).
    reads_come_to(&b, total, |i| Some(format!("new {i}"))).await;
}

/// A load that began before a `set_many` of its key cannot write its
/// older result over the new value: the batch revokes its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_many_revokes_a_load_in_flight() {
    let server = RedisServer::start();
    let a = bulk_cache(&server);
    let b = bulk_cache(&server);
    let (load, calls) = load_in_flight(&b, "k7", "old").await;
    a.set_many((0..100).map(|i| (format!("k{i}"), format!("new {i}"))))
        .await
        .unwrap();
    // The load's own caller gets its result; the store keeps the new one.
    assert_eq!(load.await.unwrap().unwrap().as_deref(), Some("old"));
    let c = bulk_cache(&server);
    assert_eq!(c.get("k7").await.unwrap().as_deref(), Some("new 7"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// `invalidate_many` of 2,000 keys: one `PUBLISH` per step of up to 1,024
/// keys, every entry gone, another process's L1 copies dropped, and a load
/// in flight of one of them cannot write its result back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidate_many_deletes_tells_once_per_step_and_revokes_loads() {
    let server = RedisServer::start();
    let a = bulk_cache(&server);
    let b = l1_cache(&server);
    let total = 2_000usize;
    a.set_many((0..total).map(|i| (format!("k{i}"), format!("v{i}"))))
        .await
        .unwrap();
    for i in 0..total {
        let got = b.get(&format!("k{i}")).await.unwrap();
        assert_eq!(got, Some(format!("v{i}")));
    }
    // A load of a missing key of the batch, in flight across the call.
    let (load, _) = load_in_flight(&b, "missing", "old").await;
    let publishes = || publishes(&server);
    let before = publishes();
    let keys: Vec<String> = (0..total)
        .map(|i| format!("k{i}"))
        .chain(["missing".into()])
        .collect();
    a.invalidate_many(&keys).await.unwrap();
    assert_eq!(
        publishes() - before,
        2,
        "2,001 keys: two steps of up to 1,024"
    );
    assert_eq!(load.await.unwrap().unwrap().as_deref(), Some("old"));
    // Only the namespace's clear record is left.
    assert_eq!(server.command(&["DBSIZE"]).unwrap(), "1");
    reads_come_to(&b, total, |_| None).await;
    // An empty batch sends nothing. (The revoked load's refused fill told
    // its waiters, if any, that its lease is free: one message.)
    let before = publishes();
    a.invalidate_many(Vec::<String>::new()).await.unwrap();
    assert_eq!(publishes() - before, 0);
}

/// A hundred `set`s side by side on a busy Redis meet in the write queue:
/// past the few in the air, they go out as batch transactions (one
/// `PUBLISH` each, not one script per key), and each keeps what a `set`
/// promises: its value lands, another process's L1 copy goes, and a load
/// in flight of one of the keys cannot write its older result back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sets_meet_in_batches_and_each_keeps_its_guarantees() {
    let server = RedisServer::start();
    let a = bulk_cache(&server);
    let b = l1_cache(&server);
    let total = 100usize;
    hold_old_copies(&b, total).await;
    // A load of one of the keys in flight across the sets.
    b.invalidate("k7").await.unwrap();
    let (load, _) = load_in_flight(&b, "k7", "older").await;
    let (scripts, transactions) = (calls_of(&server, "evalsha"), calls_of(&server, "exec"));
    let sets = (0..total).map(|i| {
        let a = a.clone();
        async move { a.set(&format!("k{i}"), &format!("new {i}")).await }
    });
    for set in futures_util::future::join_all(sets).await {
        set.unwrap();
    }
    let scripts = calls_of(&server, "evalsha") - scripts;
    let transactions = calls_of(&server, "exec") - transactions;
    assert!(
        transactions >= 1 && scripts + transactions < 50,
        "100 sets side by side: {scripts} scripts and {transactions} transactions"
    );
    assert_eq!(load.await.unwrap().unwrap().as_deref(), Some("older"));
    let c = bulk_cache(&server);
    for i in 0..total {
        let got = c.get(&format!("k{i}")).await.unwrap();
        assert_eq!(got, Some(format!("new {i}")), "k{i}");
    }
    reads_come_to(&b, total, |i| Some(format!("new {i}"))).await;
}

/// The lease index of namespace `bulk` on a single server.
const INDEX: &str = "bw:bulk:i:";

/// A lease holds only while the lease index names it: an index that is
/// lost (evicted, expired, flushed) or overwritten with another Redis type
/// validates no write in flight (it may have named a revocation), and the
/// next load makes a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_index_validates_no_write_in_flight() {
    let server = RedisServer::start();
    let cache = bulk_cache(&server);
    for (key, lose) in [
        ("k1", &["DEL", INDEX][..]),
        ("k2", &["SET", INDEX, "foreign"][..]),
    ] {
        let (load, calls) = load_in_flight(&cache, key, "loaded").await;
        server.command(lose).unwrap();
        // Its caller gets its result; the store takes none of it, and the
        // lease is released for whoever comes next.
        assert_eq!(load.await.unwrap().unwrap().as_deref(), Some("loaded"));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let stored = format!("bw:bulk:v:{{{key}}}");
        let lease = format!("bw:bulk:l:{{{key}}}");
        assert_eq!(server.command(&["EXISTS", &stored]).unwrap().trim(), "0");
        assert_eq!(server.command(&["EXISTS", &lease]).unwrap().trim(), "0");
    }
    // The next load enlists its lease in a new index and writes.
    let loaded = cache
        .get_or_load("k3", || async {
            Ok::<_, std::io::Error>(Some("v3".to_owned()))
        })
        .await
        .unwrap();
    assert_eq!(loaded.as_deref(), Some("v3"));
    assert!(
        server
            .command(&["GET", "bw:bulk:v:{k3}"])
            .unwrap()
            .contains("v3")
    );
}

/// The index lives as long as the leases it names, extended ones too,
/// and no longer; a member whose lease is gone is swept by the next
/// lease taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_index_lives_as_long_as_its_leases() {
    use breakwater_cache::Store;
    use std::time::Duration;
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).unwrap();
    let short = Duration::from_millis(100);
    let lease = b"bw:bulk:l:{a}";
    assert!(
        store
            .acquire_lease(lease, b"t-a", short)
            .await
            .unwrap()
            .is_acquired()
    );
    assert!(
        store
            .extend_lease(lease, b"t-a", Duration::from_secs(30))
            .await
            .unwrap()
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        store.lease_held(lease).await.unwrap(),
        "extended with its index"
    );
    assert!(
        store
            .release_lease(
                lease,
                b"t-a",
                breakwater_cache::Notice {
                    channel: b"bw:bulk:events",
                    message: b"released",
                    batch_head: None,
                }
            )
            .await
            .unwrap()
    );
    // A lease that runs out leaves a member behind, swept by the next one.
    assert!(
        store
            .acquire_lease(b"bw:bulk:l:{b}", b"t-b", short)
            .await
            .unwrap()
            .is_acquired()
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        server.command(&["EXISTS", INDEX]).unwrap().trim(),
        "0",
        "outlived its leases"
    );
    // `c` runs out under an index kept alive; taking `d` looks at both
    // members (two at a time) and sweeps `c`.
    assert!(
        store
            .acquire_lease(b"bw:bulk:l:{c}", b"t", short)
            .await
            .unwrap()
            .is_acquired()
    );
    server.command(&["PEXPIRE", INDEX, "30000"]).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        store
            .acquire_lease(b"bw:bulk:l:{d}", b"t", short)
            .await
            .unwrap()
            .is_acquired()
    );
    let members = server.command(&["SMEMBERS", INDEX]).unwrap();
    assert_eq!(members.trim(), "bw:bulk:l:{d}");
}

//! Bulk writes with default settings against a private Redis: many `set`s
//! in flight at once must all land.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use breakwater_cache::{Cache, RedisStore};
use support::RedisServer;

/// A cache with default settings on `server`.
fn bulk_cache(server: &RedisServer) -> Cache<String> {
    Cache::builder()
        .namespace("bulk")
        .store(RedisStore::connect(&server.url()).unwrap())
        .build()
        .unwrap()
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
/// `SET PX`s of the same entries (batches of 500) in the same run.
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
    assert_eq!(server.command(&["DBSIZE"]).unwrap(), total.to_string());
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

/// `set_many` sends its batch as `EVALSHA`s; a server that lost its scripts
/// (`SCRIPT FLUSH`, a restart, a failover) gets the batch again with `EVAL`,
/// and every key lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_many_survives_a_script_flush() {
    let server = RedisServer::start();
    let cache = bulk_cache(&server);
    for round in 0..3 {
        assert_eq!(server.command(&["SCRIPT", "FLUSH"]).unwrap(), "OK");
        cache
            .set_many((0..1_000).map(|i| (format!("k{i}"), format!("{round}:{i}"))))
            .await
            .unwrap();
        for i in [0, 499, 999] {
            let got = cache.get(&format!("k{i}")).await.unwrap();
            assert_eq!(got, Some(format!("{round}:{i}")));
        }
    }
}

//! Bulk writes with default settings against a private Redis: many `set`s
//! in flight at once must all land.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use breakwater::{Cache, RedisStore};
use support::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_sets_with_a_hundred_in_flight_all_land() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).unwrap();
    let cache = Cache::<String>::builder()
        .namespace("bulk")
        .store(store)
        .build()
        .unwrap();
    let total = 100_000usize;
    let next = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..100 {
        let (cache, next, failed) = (cache.clone(), Arc::clone(&next), Arc::clone(&failed));
        workers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    break;
                }
                if let Err(err) = cache.set(format!("k{i}"), &format!("value {i}")).await
                    && failed.fetch_add(1, Ordering::Relaxed) < 3
                {
                    eprintln!("set k{i}: {err}");
                }
            }
        }));
    }
    for worker in workers {
        worker.await.unwrap();
    }
    let took = started.elapsed();
    eprintln!(
        "{total} sets, 100 in flight: {took:?} ({:.0}/s), {} failed",
        total as f64 / took.as_secs_f64(),
        failed.load(Ordering::Relaxed)
    );
    assert_eq!(failed.load(Ordering::Relaxed), 0);
    assert_eq!(server.command(&["DBSIZE"]).unwrap(), total.to_string());
}

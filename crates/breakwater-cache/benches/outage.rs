//! `get_or_load` latency with Redis healthy, hung (SIGSTOP) and down
//! (killed), on a private `redis-server`, with and without the L1 near
//! cache. The loader takes 1 ms.
//!
//! ```sh
//! cargo bench -p breakwater-cache --bench outage
//! ```

use std::time::Duration;

use breakwater_cache::{Cache, EarlyRefresh, Jitter, L1Config, RedisStore};
use breakwater_cache_testkit::RedisServer;
use tokio::time::Instant;

const KEYS: usize = 200;
const CALLS: usize = 4_000;

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        println!("get_or_load latency, {CALLS} calls over {KEYS} keys, loader 1 ms, default RedisStore deadlines (response 50 ms)");
        println!();
        println!("{:<8} {:<6} {:>9} {:>9} {:>9} {:>7}", "redis", "l1", "p50 ms", "p99 ms", "max ms", "errors");
        for l1 in [false, true] {
            let mut server = RedisServer::start();
            let store = RedisStore::connect(&server.url()).expect("url");
            store.warm_up().await.expect("redis");
            let mut builder = Cache::<u64>::builder()
                .namespace("bench")
                .store(store)
                .ttl(Duration::from_millis(300))
                .jitter(Jitter::none().with_floor(Duration::from_millis(1)))
                .early_refresh(EarlyRefresh::none());
            if l1 {
                builder = builder.l1(L1Config::new().ttl(Duration::from_millis(300)));
            }
            let cache = builder.build().expect("cache");
            for phase in ["healthy", "hung", "down"] {
                match phase {
                    "hung" => server.pause(),
                    "down" => {
                        server.resume();
                        server.kill();
                    }
                    _ => {}
                }
                let (mut lat, errors) = run(&cache).await;
                lat.sort_unstable();
                let at = |q: f64| lat[((q * lat.len() as f64) as usize).min(lat.len() - 1)] as f64 / 1000.0;
                println!(
                    "{:<8} {:<6} {:>9.3} {:>9.3} {:>9.3} {:>7}",
                    phase,
                    if l1 { "on" } else { "off" },
                    at(0.50),
                    at(0.99),
                    *lat.last().unwrap_or(&0) as f64 / 1000.0,
                    errors
                );
            }
        }
    });
}

/// `CALLS` calls, 50 at a time, over `KEYS` keys; latencies in µs.
async fn run(cache: &Cache<u64>) -> (Vec<u64>, usize) {
    let mut latencies = Vec::with_capacity(CALLS);
    let mut errors = 0;
    for batch in 0..CALLS / 50 {
        let mut tasks = Vec::with_capacity(50);
        for i in 0..50 {
            let cache = cache.clone();
            let k = (batch * 50 + i) % KEYS;
            tasks.push(tokio::spawn(async move {
                let started = Instant::now();
                let r = cache
                    .get_or_load(format!("k{k}"), move || async move {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        Ok::<_, std::io::Error>(Some(k as u64))
                    })
                    .await;
                (started.elapsed(), r.is_ok())
            }));
        }
        for task in tasks {
            let (took, ok) = task.await.expect("task");
            latencies.push(u64::try_from(took.as_micros()).unwrap_or(u64::MAX));
            errors += usize::from(!ok);
        }
    }
    (latencies, errors)
}

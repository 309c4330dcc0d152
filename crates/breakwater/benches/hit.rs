//! A Redis hit through `get_or_load` next to a raw `GET` on one multiplexed
//! connection, in the same run, on a private `redis-server` (L1 off, so
//! every hit is one `GET`). Three interleaved trials per scenario; the
//! ratio is of the medians.
//!
//! ```sh
//! cargo bench -p breakwater --bench hit
//! ```
//!
//! Scenarios: one caller; 50 callers on 50 distinct keys; 50 callers on
//! one hot key (where concurrent reads of a key share one `GET`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use breakwater::{Cache, RedisStore};
use breakwater_testkit::RedisServer;

const TRIAL: Duration = Duration::from_millis(1_000);
const TRIALS: usize = 3;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let server = RedisServer::start();
    rt.block_on(async {
        let store = RedisStore::connect(&server.url()).expect("store");
        store.warm_up().await.expect("redis");
        let cache = Cache::<String>::builder()
            .namespace("bench")
            .store(store)
            .ttl(Duration::from_secs(3_600))
            .build()
            .expect("cache");
        let client = redis::Client::open(server.url()).expect("client");
        let raw = client
            .get_multiplexed_async_connection()
            .await
            .expect("connection");
        let keys: Vec<String> = (0..50).map(|k| format!("product:{k}")).collect();
        let mut raw_keys = Vec::new();
        for key in &keys {
            let value = format!("value of {key}, about the size of a small row");
            let v = value.clone();
            cache
                .get_or_load(key, move || {
                    let v = v.clone();
                    async move { Ok::<_, std::io::Error>(Some(v)) }
                })
                .await
                .expect("warm");
            let raw_key = format!("raw:{key}");
            redis::cmd("SET")
                .arg(&raw_key)
                .arg(&value)
                .query_async::<()>(&mut raw.clone())
                .await
                .expect("set");
            raw_keys.push(raw_key);
        }

        let keys = Arc::new(keys);
        let raw_keys = Arc::new(raw_keys);
        for (name, callers, distinct) in [
            ("1 caller", 1usize, true),
            ("50 callers, 50 keys", 50, true),
            ("50 callers, 1 hot key", 50, false),
        ] {
            let pick = move |i: usize| if distinct { i } else { 0 };
            let mut ours = Vec::new();
            let mut theirs = Vec::new();
            for _ in 0..TRIALS {
                let (conn, raw_keys) = (raw.clone(), Arc::clone(&raw_keys));
                theirs.push(
                    run(callers, move |i| {
                        let mut conn = conn.clone();
                        let key = raw_keys[pick(i)].clone();
                        async move {
                            let v: Option<String> =
                                redis::cmd("GET").arg(&key).query_async(&mut conn).await.unwrap();
                            assert!(v.is_some());
                        }
                    })
                    .await,
                );
                let (cache, keys) = (cache.clone(), Arc::clone(&keys));
                ours.push(
                    run(callers, move |i| {
                        let cache = cache.clone();
                        let keys = Arc::clone(&keys);
                        async move {
                            let v = cache
                                .get_or_load(&keys[pick(i)], || async {
                                    Ok::<_, std::io::Error>(Some(String::new()))
                                })
                                .await
                                .unwrap();
                            assert!(v.is_some_and(|v| !v.is_empty()));
                        }
                    })
                    .await,
                );
            }
            let (o, t) = (median(&mut ours), median(&mut theirs));
            println!(
                "{name:<22} get_or_load {o:>8.0}/s   raw GET {t:>8.0}/s   ratio {:.2}   (trials: ours {:?}, raw {:?})",
                o / t,
                ours.iter().map(|x| *x as u64).collect::<Vec<_>>(),
                theirs.iter().map(|x| *x as u64).collect::<Vec<_>>(),
            );
        }
    });
}

/// Operations per second of `callers` tasks, each awaiting `op(i)` in a
/// loop for one trial.
async fn run<F, Fut>(callers: usize, op: F) -> f64
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let op = Arc::new(op);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|i| {
            let (op, stop, done) = (Arc::clone(&op), Arc::clone(&stop), Arc::clone(&done));
            tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    op(i).await;
                    n += 1;
                }
                done.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    tokio::time::sleep(TRIAL).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("caller");
    }
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

//! L1 hit throughput on one core: `get_or_load` served from the near cache,
//! next to bare `moka` gets in the same run, interleaved round by round.
//!
//! ```sh
//! cargo bench -p breakwater-cache --bench l1
//! ```
//!
//! Three baselines, each a `get` of the same keys from a cache of the same
//! size holding the same `u64`s:
//! - `future`: `moka::future::Cache::get`, awaited (moka's cache for async
//!   code, default hasher);
//! - `sync`: `moka::sync::Cache::get` (default hasher), the map L1 is
//!   built on, with the same time-to-live set, as L1's;
//! - `sync+fold`: the same with foldhash, L1's own hasher: what the map
//!   alone costs L1, so the rest is breakwater's.

use std::hint::black_box;
use std::time::{Duration, Instant};

use breakwater_cache::{Cache, L1Config};

const KEYS: u64 = 1_000;
const OPS: u64 = 3_000_000;
const ROUNDS: usize = 5;

/// Operations per second of `OPS` calls of `one`.
async fn rate<F: AsyncFnMut(&[u8])>(keys: &[String], mut one: F) -> f64 {
    let started = Instant::now();
    for i in 0..OPS {
        one(keys[(i % KEYS) as usize].as_bytes()).await;
    }
    OPS as f64 / started.elapsed().as_secs_f64()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let hour = Duration::from_secs(3600);
        let cache = Cache::<u64>::builder()
            .namespace("bench")
            .ttl(hour)
            .l1(L1Config::new().entries(10_000).ttl(hour).keep(hour))
            .build()
            .expect("cache");
        let keys: Vec<String> = (0..KEYS).map(|k| format!("product:{k}")).collect();
        for (i, key) in keys.iter().enumerate() {
            let v = i as u64;
            cache
                .get_or_load(key, move || async move { Ok::<_, std::io::Error>(Some(v)) })
                .await
                .expect("warm");
        }

        let future: moka::future::Cache<Vec<u8>, u64> = moka::future::Cache::new(10_000);
        let sync: moka::sync::Cache<Vec<u8>, u64> = moka::sync::Cache::builder()
            .max_capacity(10_000)
            .time_to_live(hour)
            .build();
        let fold: moka::sync::Cache<Vec<u8>, u64, foldhash::fast::RandomState> =
            moka::sync::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(hour)
                .build_with_hasher(foldhash::fast::RandomState::default());
        for (i, key) in keys.iter().enumerate() {
            future.insert(key.as_bytes().to_vec(), i as u64).await;
            sync.insert(key.as_bytes().to_vec(), i as u64);
            fold.insert(key.as_bytes().to_vec(), i as u64);
        }

        let (mut ours, mut vs_future, mut vs_sync, mut vs_fold) = (vec![], vec![], vec![], vec![]);
        for round in 1..=ROUNDS {
            let l1 = rate(&keys, async |key| {
                let v = cache
                    .get_or_load(key, || async { Ok::<_, std::io::Error>(Some(0)) })
                    .await;
                black_box(v.ok());
            })
            .await;
            let f = rate(&keys, async |key| {
                black_box(future.get(key).await);
            })
            .await;
            let s = rate(&keys, async |key| {
                black_box(sync.get(key));
            })
            .await;
            let h = rate(&keys, async |key| {
                black_box(fold.get(key));
            })
            .await;
            println!(
                "round {round}: get_or_load L1 hit {:>5.2} M/s | bare moka get: future {:>5.2} M/s ({:.2}x) \
                 sync {:>5.2} M/s ({:.2}x) sync+fold {:>5.2} M/s ({:.2}x)",
                l1 / 1e6,
                f / 1e6,
                l1 / f,
                s / 1e6,
                l1 / s,
                h / 1e6,
                l1 / h
            );
            ours.push(l1);
            vs_future.push(l1 / f);
            vs_sync.push(l1 / s);
            vs_fold.push(l1 / h);
        }
        println!(
            "median of {ROUNDS}: L1 hit {:.2} M/s; ratio to bare moka get: future {:.2}, sync {:.2}, sync+fold {:.2}",
            median(ours) / 1e6,
            median(vs_future),
            median(vs_sync),
            median(vs_fold)
        );
    });
}

//! L1 hit throughput on one core: `get_or_load` served from the near cache,
//! next to a bare `moka` future-cache `get` in the same run.
//!
//! ```sh
//! cargo bench -p breakwater --bench l1
//! ```

use std::hint::black_box;
use std::time::{Duration, Instant};

use breakwater::{Cache, L1Config};

const KEYS: u64 = 1_000;
const OPS: u64 = 3_000_000;

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let cache = Cache::<u64>::builder()
            .namespace("bench")
            .ttl(Duration::from_secs(3600))
            .l1(
                L1Config::new()
                    .entries(10_000)
                    .ttl(Duration::from_secs(3600))
                    .keep(Duration::from_secs(3600)),
            )
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

        let moka: moka::future::Cache<Vec<u8>, u64> = moka::future::Cache::new(10_000);
        // The same map with L1's own hasher (foldhash), so the comparison
        // shows what the hasher buys apart from what the cache adds.
        let moka_fold: moka::future::Cache<Vec<u8>, u64, foldhash::fast::RandomState> =
            moka::future::Cache::builder()
                .max_capacity(10_000)
                .build_with_hasher(foldhash::fast::RandomState::default());
        for (i, key) in keys.iter().enumerate() {
            moka.insert(key.as_bytes().to_vec(), i as u64).await;
            moka_fold.insert(key.as_bytes().to_vec(), i as u64).await;
        }

        for round in 1..=3 {
            let started = Instant::now();
            for i in 0..OPS {
                let key = &keys[(i % KEYS) as usize];
                let v = cache
                    .get_or_load(key, || async { Ok::<_, std::io::Error>(Some(0)) })
                    .await;
                black_box(v.ok());
            }
            let l1 = OPS as f64 / started.elapsed().as_secs_f64();

            let started = Instant::now();
            for i in 0..OPS {
                let key = &keys[(i % KEYS) as usize];
                black_box(moka.get(key.as_bytes()).await);
            }
            let bare = OPS as f64 / started.elapsed().as_secs_f64();

            let started = Instant::now();
            for i in 0..OPS {
                let key = &keys[(i % KEYS) as usize];
                black_box(moka_fold.get(key.as_bytes()).await);
            }
            let fold = OPS as f64 / started.elapsed().as_secs_f64();
            println!(
                "round {round}: get_or_load L1 hit {:>10.0} ops/s   bare moka get {:>10.0} ops/s ({:.0}%)   \
                 bare moka get, foldhash {:>10.0} ops/s ({:.0}%)",
                l1,
                bare,
                100.0 * l1 / bare,
                fold,
                100.0 * l1 / fold
            );
        }
    });
}

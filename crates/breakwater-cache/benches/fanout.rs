//! The cost of sharing one load: C callers of one missing key on one core
//! (memory store, 20 ms loader); how long after the value was produced the
//! median and the last caller returned, and the CPU time per caller.
//!
//! ```sh
//! cargo bench -p breakwater-cache --bench fanout
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use breakwater_cache::Cache;

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        for callers in [100usize, 1_000, 10_000] {
            for round in 1..=3 {
                let cache = Cache::<String>::builder().build().expect("cache");
                let origin = Instant::now();
                let filled_at = Arc::new(AtomicU64::new(0));
                let mut tasks = Vec::with_capacity(callers);
                for _ in 0..callers {
                    let (cache, filled_at) = (cache.clone(), Arc::clone(&filled_at));
                    tasks.push(tokio::spawn(async move {
                        let v = cache
                            .get_or_load("hot", move || {
                                let filled_at = Arc::clone(&filled_at);
                                async move {
                                    tokio::time::sleep(Duration::from_millis(20)).await;
                                    let at = u64::try_from(origin.elapsed().as_micros()).unwrap_or(0);
                                    filled_at.store(at, Ordering::SeqCst);
                                    Ok::<_, std::io::Error>(Some("value".to_string()))
                                }
                            })
                            .await;
                        (v.is_ok(), u64::try_from(origin.elapsed().as_micros()).unwrap_or(0))
                    }));
                }
                let mut done = Vec::with_capacity(callers);
                for task in tasks {
                    let (ok, at) = task.await.expect("task");
                    assert!(ok);
                    done.push(at);
                }
                let total = origin.elapsed();
                let filled = filled_at.load(Ordering::SeqCst);
                done.sort_unstable();
                let after = |i: usize| done[i].saturating_sub(filled) as f64 / 1000.0;
                println!(
                    "C={callers:>6} round {round}: returned after the fill: median {:>7.3} ms, last {:>7.3} ms; \
                     wall {:>7.1} ms ({:.2} µs per caller beyond the 20 ms load)",
                    after(callers / 2),
                    after(callers - 1),
                    total.as_secs_f64() * 1000.0,
                    (total.as_secs_f64() * 1e6 - 20_000.0) / callers as f64
                );
            }
        }
    });
}

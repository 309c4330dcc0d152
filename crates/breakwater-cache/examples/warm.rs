//! Warming after a key-version bump: the new namespace starts empty, and
//! `Cache::warm` fills its hottest keys at a bounded rate before traffic
//! arrives, with jittered TTLs so they do not expire together later.
//!
//! ```sh
//! cargo run -p breakwater-cache --example warm
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use breakwater_cache::{Cache, Jitter, Warm};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let products = Cache::<String>::builder()
        .namespace("products:v4") // was v3: every key is cold
        .ttl(Duration::from_secs(3600))
        .build()?;
    let queries = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&queries);
    let hot = (1..=300).map(|id| format!("product:{id}"));
    let report = products
        .warm(
            hot,
            move |key: String| {
                counted.fetch_add(1, Ordering::SeqCst);
                async move {
                    tokio::time::sleep(Duration::from_millis(2)).await; // the query
                    Ok::<_, std::io::Error>(Some(format!("row for {key}")))
                }
            },
            Warm::new()
                .rate(500)
                .concurrency(8)
                .jitter(Jitter::ratio(0.2)),
        )
        .await?;
    println!(
        "loaded {} keys in {:.2} s ({} queries, at most 500 a second); {} failed",
        report.loaded,
        report.elapsed.as_secs_f64(),
        queries.load(Ordering::SeqCst),
        report.failed
    );

    // A second pass finds everything warm: reads, no queries.
    let again = products
        .warm(
            (1..=300).map(|id| format!("product:{id}")),
            |key: String| async move { Ok::<_, std::io::Error>(Some(key)) },
            Warm::new(),
        )
        .await?;
    println!(
        "second pass: {} already cached, {} loaded",
        again.cached, again.loaded
    );
    Ok(())
}

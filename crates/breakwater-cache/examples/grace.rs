//! Stale-while-revalidate: once a hot key's fresh window ends, requests are
//! served the stale value at once while one background refresh runs.
//!
//! ```sh
//! cargo run -p breakwater-cache --example grace
//! ```

use std::time::Duration;

use breakwater_cache::{Cache, EarlyRefresh, Jitter};
use tokio::time::Instant;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cache = Cache::<String>::builder()
        .namespace("catalog")
        .ttl(Duration::from_millis(500))
        .jitter(Jitter::none().with_floor(Duration::from_millis(1)))
        .grace(Duration::from_secs(60))
        .early_refresh(EarlyRefresh::none())
        .build()?;
    let slow_query = |v: &'static str| {
        move || async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok::<_, std::io::Error>(Some(v.to_string()))
        }
    };
    cache.get_or_load("summary", slow_query("v1")).await?;
    tokio::time::sleep(Duration::from_millis(600)).await; // v1 is stale now

    let started = Instant::now();
    let fetched = cache
        .get_or_load_with_meta("summary", slow_query("v2"))
        .await?;
    println!(
        "served {:?} as {:?} in {:?} (the query takes 300 ms)",
        fetched.value.as_deref().unwrap_or("-"),
        fetched.served,
        started.elapsed()
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    println!("after the refresh: {:?}", cache.get("summary").await?);
    Ok(())
}

//! The seed article's scenario: after 3 consecutive database failures the
//! circuit opens for 5 s, and requests get a degraded fallback instead of
//! hammering the database; when it recovers, the circuit closes.
//!
//! ```sh
//! cargo run -p breakwater-cache --example breaker
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use breakwater_cache::{BreakerConfig, Cache, Jitter};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    id: u64,
    status: String,
    message: String,
}

#[derive(Debug)]
struct DbError;
impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection refused")
    }
}
impl std::error::Error for DbError {}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cache = Cache::<Record>::builder()
        .namespace("resources")
        .ttl(Duration::from_secs(60))
        .jitter(Jitter::fixed(Duration::from_secs(15))) // ±15 s, as in the article
        .breaker(
            BreakerConfig::new()
                .consecutive_failures(3)
                .cool_down(Duration::from_secs(5))
                .cool_down_jitter(Jitter::none().with_floor(Duration::from_millis(1))),
        )
        .fallback(Record {
            id: 0,
            status: "degraded".into(),
            message: "Backend under protection; serving degraded fallback response.".into(),
        })
        .build()?;

    let db_up = Arc::new(AtomicBool::new(false));
    let queries = Arc::new(AtomicUsize::new(0));
    let loader = |id: u64| {
        let (db_up, queries) = (Arc::clone(&db_up), Arc::clone(&queries));
        move || {
            queries.fetch_add(1, Ordering::SeqCst);
            let up = db_up.load(Ordering::SeqCst);
            async move {
                if up {
                    Ok(Some(Record {
                        id,
                        status: "ok".into(),
                        message: "Critical Backend Data".into(),
                    }))
                } else {
                    Err(DbError)
                }
            }
        }
    };

    let request = |id: u64| {
        let (cache, queries, load) = (cache.clone(), Arc::clone(&queries), loader(id));
        async move {
            let fetched = cache
                .get_or_load_with_meta(format!("resource:{id}"), load)
                .await?;
            println!(
                "  resource:{id} -> {:?} ({:?}), database queries so far: {}",
                fetched.value.map(|r| r.status),
                fetched.served,
                queries.load(Ordering::SeqCst)
            );
            Ok::<_, breakwater_cache::Error>(())
        }
    };

    println!("database down:");
    for id in 1..=6 {
        request(id).await?;
    }
    println!("database back; waiting out the 5 s cool-down...");
    db_up.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(5_100)).await;
    for id in 7..=8 {
        request(id).await?;
    }
    Ok(())
}

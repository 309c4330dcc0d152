//! One load per key: 1,000 concurrent requests for a missing hot key run the
//! loader once. With a `RedisStore` the same holds across processes.
//!
//! ```sh
//! cargo run -p breakwater-cache --example stampede
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use breakwater_cache::{Cache, Served};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cache = Cache::<String>::builder().namespace("homepage").build()?;
    let queries = Arc::new(AtomicUsize::new(0));
    let mut requests = Vec::new();
    for _ in 0..1_000 {
        let cache = cache.clone();
        let queries = Arc::clone(&queries);
        requests.push(tokio::spawn(async move {
            cache
                .get_or_load_with_meta("config", move || {
                    queries.fetch_add(1, Ordering::SeqCst);
                    async {
                        tokio::time::sleep(Duration::from_millis(50)).await; // the expensive query
                        Ok::<_, std::io::Error>(Some("{\"banner\":\"sale\"}".to_string()))
                    }
                })
                .await
        }));
    }
    let (mut loaded, mut coalesced) = (0, 0);
    for request in requests {
        match request.await??.served {
            Served::Loaded => loaded += 1,
            Served::Coalesced => coalesced += 1,
            _ => {}
        }
    }
    println!(
        "1,000 requests: {} database query, {loaded} loaded, {coalesced} shared that load",
        queries.load(Ordering::SeqCst)
    );
    Ok(())
}

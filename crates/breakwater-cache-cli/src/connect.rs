//! Stores on the Redis a `--redis` names: one URL, or a Redis Cluster's
//! node URLs separated by commas.
//!
//! [`store`] is what `inspect` and `warm` run on, with the library's
//! deadlines; [`bench_store`] and [`bench_cluster_store`] are what the
//! benches and their worker processes run on, with patient ones (a
//! benchmark measures the cache, not timeouts on a busy machine), and
//! connected before they are handed out.

use std::time::Duration;

use breakwater_cache::{Error, RedisStore, RedisStoreConfig};

/// A store on `urls`: one Redis URL, or several (comma-separated) nodes of
/// a Redis Cluster.
pub(crate) fn store(urls: &str) -> Result<RedisStore, Error> {
    if urls.contains(',') {
        RedisStore::connect_cluster(urls.split(',').map(str::trim))
    } else {
        RedisStore::connect(urls)
    }
}

/// The benches' deadlines: responses and writes may take 2 s.
fn patient() -> RedisStoreConfig {
    RedisStoreConfig::default()
        .response_timeout(Duration::from_secs(2))
        .write_timeout(Duration::from_secs(2))
}

/// The store of `bench stampede`, `bench grace` and their workers, on one
/// Redis URL, connected.
pub(crate) async fn bench_store(url: &str) -> Result<RedisStore, Error> {
    let store = RedisStore::connect_with(url, patient())?;
    store.warm_up().await?;
    Ok(store)
}

/// The store of `bench many` and its workers, on one Redis URL or a Redis
/// Cluster's comma-separated node URLs, connected.
pub(crate) async fn bench_cluster_store(urls: &str) -> Result<RedisStore, Error> {
    let store = if urls.contains(',') {
        RedisStore::connect_cluster_with(urls.split(',').map(str::trim), patient())?
    } else {
        RedisStore::connect_with(urls, patient())?
    };
    store.warm_up().await?;
    Ok(store)
}

//! Shared support for breakwater's integration tests.
#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use breakwater::{RedisStore, RedisStoreConfig};
pub use breakwater_testkit::RedisServer;

/// Timeouts for tests that are about something other than a slow Redis:
/// generous, so a loaded CI machine cannot turn them into outage tests.
pub fn patient() -> RedisStoreConfig {
    RedisStoreConfig::default()
        .connect_timeout(Duration::from_secs(5))
        .response_timeout(Duration::from_secs(5))
}

/// A private Redis and a connected store on it (with [`patient`] timeouts).
pub async fn redis_store() -> (RedisServer, RedisStore) {
    let server = RedisServer::start();
    let store = connect(&server).await;
    (server, store)
}

/// Another connected store on `server` ([`patient`] timeouts), as another
/// process would have.
pub async fn connect(server: &RedisServer) -> RedisStore {
    let store = RedisStore::connect_with(&server.url(), patient()).expect("valid url");
    store.warm_up().await.expect("private redis is reachable");
    store
}

/// The loader error of the integration tests.
#[derive(Debug)]
pub struct DbDown;
impl std::fmt::Display for DbDown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("database is down")
    }
}
impl std::error::Error for DbDown {}

/// `calls` per command from `INFO commandstats`, e.g. `[("get", 1)]`.
pub fn command_calls(server: &RedisServer) -> Vec<(String, u64)> {
    let info = server.command(&["INFO", "commandstats"]).expect("INFO");
    let mut calls: Vec<(String, u64)> = info
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("cmdstat_")?;
            let (name, stats) = rest.split_once(':')?;
            let n = stats
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_owned(), n))
        })
        .collect();
    calls.sort();
    calls
}

//! Shared support for breakwater's integration tests.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use breakwater_cache::{Cache, RedisStore, RedisStoreConfig};
pub use breakwater_cache_testkit::{RedisCluster, RedisSentinel, RedisServer};

/// Timeouts for tests that are about something other than a slow Redis:
/// generous, so a loaded CI machine cannot turn them into outage tests.
pub fn patient() -> RedisStoreConfig {
    RedisStoreConfig::default()
        .connect_timeout(Duration::from_secs(5))
        .response_timeout(Duration::from_secs(5))
        .write_timeout(Duration::from_secs(5))
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

/// A private three-node Redis Cluster and a connected store on it (with
/// [`patient`] timeouts).
pub async fn cluster_store() -> (RedisCluster, RedisStore) {
    let cluster = RedisCluster::start();
    let store = connect_cluster(&cluster).await;
    (cluster, store)
}

/// Another connected store on `cluster` ([`patient`] timeouts), as another
/// process would have.
pub async fn connect_cluster(cluster: &RedisCluster) -> RedisStore {
    let store = RedisStore::connect_cluster_with(cluster.urls(), patient()).expect("valid urls");
    store.warm_up().await.expect("private cluster is reachable");
    store
}

/// A private Redis Sentinel setup (a master, its replica, one sentinel) and
/// a store connected through the sentinel (with [`patient`] timeouts).
pub async fn sentinel_store() -> (RedisSentinel, RedisStore) {
    let setup = RedisSentinel::start();
    let store =
        RedisStore::connect_sentinel_with(setup.sentinel_urls(), setup.master_name(), patient())
            .expect("valid urls");
    store
        .warm_up()
        .await
        .expect("private sentinel is reachable");
    (setup, store)
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

/// The future of [`slow_loader`]'s loader.
pub type LoadFuture = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Option<String>, std::io::Error>> + Send>,
>;

/// The future of a loader of `u64` versions.
pub type VersionFuture = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Option<u64>, std::io::Error>> + Send>,
>;

/// A loader that counts calls and takes `delay`.
pub fn slow_loader(
    calls: &Arc<AtomicUsize>,
    delay: Duration,
    value: &str,
) -> impl Fn() -> LoadFuture + Clone + Send + Sync + 'static {
    let calls = Arc::clone(calls);
    let value = value.to_string();
    move || {
        let calls = Arc::clone(&calls);
        let value = value.clone();
        Box::pin(async move {
            calls.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(delay).await;
            Ok(Some(value))
        })
    }
}

/// Two "processes": `a` loads `key` slowly (1.5 s) as `value` while `b`,
/// whose store `b_gets` counts `GET`s, waits for it. B's result, and the
/// `GET`s B made once it was waiting (0 when the fill's message carried the
/// value).
pub async fn wait_for_a_fill(
    a: Cache<String>,
    b: Cache<String>,
    b_gets: impl Fn() -> usize,
    key: &str,
    value: &str,
) -> (Option<String>, usize) {
    let calls = Arc::new(AtomicUsize::new(0));
    let leader = {
        let loader = slow_loader(&calls, Duration::from_millis(1500), value);
        let key = key.to_owned();
        tokio::spawn(async move { a.get_or_load(&key, loader).await })
    };
    until("A's load to start", || calls.load(Ordering::SeqCst) > 0).await;
    let waiter = {
        let loader = slow_loader(&calls, Duration::ZERO, "second");
        let key = key.to_owned();
        tokio::spawn(async move { b.get_or_load(&key, loader).await })
    };
    // B reads twice (its shared read, then once more after taking its
    // watch), then sleeps until woken.
    until("B to wait", || b_gets() >= 2).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before_fill = b_gets();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the fill has not happened yet"
    );
    let got = waiter.await.unwrap().unwrap();
    assert_eq!(leader.await.unwrap().unwrap().as_deref(), Some(value));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    (got, b_gets() - before_fill)
}

/// Waits until `ready()` holds, checking every millisecond (of tokio's
/// clock, paused or not); panics naming `what` after 30 s, so a regression
/// fails the test instead of hanging the suite.
pub async fn until(what: &str, ready: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !ready() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "waited 30 s for {what}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A `Cache<String>` builder: namespace `namespace`, TTL 10 s, no jitter.
pub fn ten_second_cache(namespace: &str) -> breakwater_cache::CacheBuilder<String> {
    Cache::<String>::builder()
        .namespace(namespace)
        .ttl(Duration::from_secs(10))
        .jitter(breakwater_cache::Jitter::none())
}

/// `key` through `cache`, loading `"v"`.
pub async fn value(
    cache: &Cache<String>,
    key: &str,
) -> Result<Option<String>, breakwater_cache::Error> {
    cache
        .get_or_load(key, || async {
            Ok::<_, std::io::Error>(Some("v".to_owned()))
        })
        .await
}

/// `key` through `cache`, with a loader that fails (`down`).
pub async fn failing(
    cache: &Cache<String>,
    key: &str,
) -> Result<Option<String>, breakwater_cache::Error> {
    cache
        .get_or_load(key, || async {
            Err::<Option<String>, _>(std::io::Error::other("down"))
        })
        .await
}

/// A current-thread runtime on paused (virtual) time, for tests that
/// install a recorder or a subscriber around `block_on`.
pub fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime")
}

//! Shared support for breakwater's integration tests.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use breakwater_cache::{
    Cache, FencedWrite, LeaseAttempt, Notice, RedisStore, RedisStoreConfig, Store, StoreFuture,
    Subscription,
};
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

/// A store that counts `get`s, optionally making each take `get_delay`
/// first, and hands every operation to `inner`. Two faults can be switched
/// on: `get` replies that arrive `late` (the read happens at once, its
/// reply later), lease attempts whose reply is lost after they ran, and
/// `get`s that fail.
#[derive(Debug, Clone)]
pub struct CountingStore<S> {
    inner: S,
    gets: Arc<AtomicUsize>,
    get_delay: Duration,
    late_replies: Arc<std::sync::Mutex<Duration>>,
    lose_lease_replies: Arc<std::sync::atomic::AtomicBool>,
    failing_invalidations: Arc<AtomicUsize>,
    failing_gets: Arc<std::sync::atomic::AtomicBool>,
    hang_write_replies: Arc<std::sync::atomic::AtomicBool>,
    batches_reads: bool,
}

impl<S: Store + Clone> CountingStore<S> {
    /// Counts `inner`'s `get`s.
    pub fn new(inner: S) -> Self {
        Self::slow(inner, Duration::ZERO)
    }

    /// Counts `inner`'s `get`s, and makes each take `get_delay`.
    pub fn slow(inner: S, get_delay: Duration) -> Self {
        CountingStore {
            inner,
            gets: Arc::default(),
            get_delay,
            late_replies: Arc::default(),
            lose_lease_replies: Arc::default(),
            failing_invalidations: Arc::default(),
            failing_gets: Arc::default(),
            hang_write_replies: Arc::default(),
            batches_reads: false,
        }
    }

    /// The same, asking caches to queue reads that meet into one
    /// `get_many` ([`Store::batches_reads`]); set before a cache is built.
    pub fn batching_reads(mut self) -> Self {
        self.batches_reads = true;
        self
    }

    /// While `failing`, each `get` fails at once (the store is down).
    pub fn fail_gets(&self, failing: bool) {
        self.failing_gets.store(failing, Ordering::SeqCst);
    }

    /// The next `n` invalidations fail (without running).
    pub fn fail_invalidations(&self, n: usize) {
        self.failing_invalidations.store(n, Ordering::SeqCst);
    }

    /// From now on each `get` reads at once and replies `delay` later.
    pub fn reply_late(&self, delay: Duration) {
        *self.late_replies.lock().unwrap() = delay;
    }

    /// From now on (while `lost`) each lease attempt runs, then fails as if
    /// its reply timed out.
    pub fn lose_lease_replies(&self, lost: bool) {
        self.lose_lease_replies.store(lost, Ordering::SeqCst);
    }

    /// While `hang`, each `invalidate` and `replace` runs, and its reply
    /// never comes (the caller's future waits until it is dropped).
    pub fn hang_write_replies(&self, hang: bool) {
        self.hang_write_replies.store(hang, Ordering::SeqCst);
    }

    /// Runs `write`, then, while write replies hang, never answers.
    fn maybe_hang<'a, T: Send + 'a>(&'a self, write: StoreFuture<'a, T>) -> StoreFuture<'a, T> {
        let hang = self.hang_write_replies.load(Ordering::SeqCst);
        Box::pin(async move {
            let done = write.await;
            if hang {
                std::future::pending::<()>().await;
            }
            done
        })
    }

    /// The wrapped store.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The `get`s so far.
    pub fn gets(&self) -> usize {
        self.gets.load(Ordering::SeqCst)
    }
}

impl<S: Store + Clone> Store for CountingStore<S> {
    fn get<'a>(&'a self, key: &'a [u8]) -> StoreFuture<'a, Option<Vec<u8>>> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        let late = *self.late_replies.lock().unwrap();
        let failing = self.failing_gets.load(Ordering::SeqCst);
        Box::pin(async move {
            if failing {
                return Err(breakwater_cache::Error::store_msg("connection refused"));
            }
            if !self.get_delay.is_zero() {
                tokio::time::sleep(self.get_delay).await;
            }
            let value = self.inner.get(key).await;
            if !late.is_zero() {
                tokio::time::sleep(late).await;
            }
            value
        })
    }
    fn set<'a>(&'a self, k: &'a [u8], v: &'a [u8], t: Duration) -> StoreFuture<'a, ()> {
        self.inner.set(k, v, t)
    }
    fn delete<'a>(&'a self, k: &'a [u8]) -> StoreFuture<'a, bool> {
        self.inner.delete(k)
    }
    fn ttl<'a>(&'a self, k: &'a [u8]) -> StoreFuture<'a, Option<Duration>> {
        self.inner.ttl(k)
    }
    fn now_ms(&self) -> u64 {
        self.inner.now_ms()
    }
    fn name(&self) -> &'static str {
        "counting"
    }
    fn batches_reads(&self) -> bool {
        self.batches_reads
    }
    /// A read takes `get_delay` (and a late reply's delay) more than the
    /// wrapped store's: so does its deadline.
    fn read_deadline(&self) -> Duration {
        self.inner.read_deadline() + self.get_delay + *self.late_replies.lock().unwrap()
    }
    fn acquire_lease<'a>(
        &'a self,
        l: &'a [u8],
        t: &'a [u8],
        d: Duration,
    ) -> StoreFuture<'a, LeaseAttempt> {
        let lost = self.lose_lease_replies.load(Ordering::SeqCst);
        Box::pin(async move {
            let attempt = self.inner.acquire_lease(l, t, d).await;
            if lost {
                return Err(breakwater_cache::Error::store_msg(
                    "redis did not answer in time",
                ));
            }
            attempt
        })
    }
    fn lease_held<'a>(&'a self, l: &'a [u8]) -> StoreFuture<'a, bool> {
        self.inner.lease_held(l)
    }
    fn extend_lease<'a>(&'a self, l: &'a [u8], t: &'a [u8], d: Duration) -> StoreFuture<'a, bool> {
        self.inner.extend_lease(l, t, d)
    }
    fn release_lease<'a>(
        &'a self,
        l: &'a [u8],
        t: &'a [u8],
        n: Notice<'a>,
    ) -> StoreFuture<'a, bool> {
        self.inner.release_lease(l, t, n)
    }
    fn fenced_set<'a>(&'a self, w: FencedWrite<'a>) -> StoreFuture<'a, bool> {
        self.inner.fenced_set(w)
    }
    fn pin<'a>(&'a self, k: &'a [u8], p: &'a [u8], ttl: Duration) -> StoreFuture<'a, Vec<u8>> {
        self.inner.pin(k, p, ttl)
    }
    fn replace<'a>(
        &'a self,
        k: &'a [u8],
        v: &'a [u8],
        t: Duration,
        l: &'a [u8],
        n: Notice<'a>,
    ) -> StoreFuture<'a, ()> {
        self.maybe_hang(self.inner.replace(k, v, t, l, n))
    }
    fn invalidate<'a>(&'a self, k: &'a [u8], l: &'a [u8], n: Notice<'a>) -> StoreFuture<'a, ()> {
        let failing = self
            .failing_invalidations
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            return Box::pin(async { Err(breakwater_cache::Error::store_msg("connection reset")) });
        }
        self.maybe_hang(self.inner.invalidate(k, l, n))
    }
    fn bump_generation<'a>(
        &'a self,
        k: &'a [u8],
        fresh: u64,
        ttl: Duration,
        n: Notice<'a>,
    ) -> StoreFuture<'a, u64> {
        self.inner.bump_generation(k, fresh, ttl, n)
    }
    fn tag_generations<'a>(
        &'a self,
        keys: &'a [&'a [u8]],
        fresh: u64,
        ttl: Duration,
    ) -> StoreFuture<'a, Vec<u64>> {
        self.inner.tag_generations(keys, fresh, ttl)
    }
    fn publish<'a>(&'a self, c: &'a [u8], m: &'a [u8]) -> StoreFuture<'a, ()> {
        self.inner.publish(c, m)
    }
    fn failure_domains(&self) -> usize {
        self.inner.failure_domains()
    }
    fn failure_domain(&self, k: &[u8]) -> usize {
        self.inner.failure_domain(k)
    }
    fn subscribe(&self, c: &[u8]) -> Subscription {
        self.inner.subscribe(c)
    }
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

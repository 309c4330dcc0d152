//! [`CacheBuilder`]: every setting, its default, and its validation.

use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::coherence::Local;
use super::guard::GuardedStore;
use super::handle::{Cache, CacheCore, Fallback, Previous};
use super::lease::{LeaseConfig, OnLockTimeout};
use super::notify::{BusHook, PreviousChannel, SENDER_LEN, Waiters};
use super::options::Options;
use super::origin::Origin;
use super::queue::{ReadQueue, WriteQueue};
use super::settings::Settings;
use super::throttle::Throttle;
use super::value::Value;
use crate::breaker::BreakerConfig;
use crate::codec::{Codec, Compression};
use crate::error::{ConfigError, KeyedResult};
use crate::freshness::EarlyRefresh;
use crate::jitter::Jitter;
use crate::l1::{L1Config, NearCache};
use crate::limit::LimitConfig;
use crate::log_limit::LogLimiter;
use crate::metrics::Metrics;
use crate::retry::RetryConfig;
use crate::store::{MemoryStore, Store};

/// Builds a [`Cache`]; every setting has a default, and [`build`](Self::build)
/// rejects invalid ones with an exact message.
///
/// The same settings can come from a file or the environment:
/// [`config`](Self::config) with a [`CacheConfig`](crate::config::CacheConfig), whose keys are these
/// methods' names.
///
/// # Defaults
///
/// | setting | default |
/// |---|---|
/// | `namespace` | `"default"` |
/// | `key_prefix` | `"bw:"`: keys `bw:<namespace>:v:{<key>}`, leases `bw:<namespace>:l:{<key>}`, channel `bw:<namespace>:events` |
/// | `store` | a new [`MemoryStore`] |
/// | `ttl` | 5 minutes |
/// | `jitter` | [`Jitter::ratio(0.1)`](Jitter::ratio) (±10 %, floor 1 s) |
/// | `negative_ttl` | 30 s, or `ttl` if shorter |
/// | `codec` | [`Codec::msgpack`] |
/// | `compression` | [`Compression::lz4`] above 1 KiB |
/// | `max_key_len` | 1024 bytes |
/// | `max_value_size` | 16 MiB of serialized value |
/// | `grace` | 0 (no stale-while-revalidate) |
/// | `max_stale` | `grace` (no value is ever served older than this past its fresh window) |
/// | `early_refresh` | [`EarlyRefresh::xfetch(1.0)`](EarlyRefresh::xfetch) |
/// | `soft_timeout` | off |
/// | `fail_safe_throttle` | 5 s |
/// | `lease_ttl` | 3 s, extended every third (1 s) while the loader runs, so a dead holder is replaced within 3 s |
/// | `lock_wait` | `queue_wait + load_timeout + 2 × lease_ttl` (37 s): a live holder's whole load (its bulkhead wait included), and one takeover |
/// | `lock_poll` | 200 ms (jittered 100..=300 ms), a fallback to pub/sub wake-ups |
/// | `on_lock_timeout` | [`OnLockTimeout::load_anyway`] |
/// | `load_timeout` | 30 s, retries included (hard: the load is abandoned, callers get `Timeout`) |
/// | `origin` | its own [`Origin`]: breaker after 5 consecutive failures with a 5 s cool-down, 64 concurrent loads, 1 s queue wait, no retries |
/// | `fallback` | none |
/// | `l1` | off; [`L1Config::new`] when enabled: 10,000 entries, 30 s |
/// | `store_breaker` | opens after 5 consecutive store failures, 1 s cool-down (jittered ±20 %); one per failure domain (per 256 hash slots on a Redis Cluster) |
/// | `rng_seed` | none (seeded from the OS) |
///
/// # Limits
///
/// [`build`](Self::build) rejects, with a message saying what to use
/// instead, any setting whose arithmetic could overflow or that makes no
/// sense: windows (`ttl`, `negative_ttl`, `grace`, `max_stale`, a jitter's
/// spread and floor, L1's `ttl` and `keep`) above 365 days; waits
/// (`load_timeout`, `fail_safe_throttle`, `lease_ttl`, `lock_wait`,
/// `lock_poll`, a bulkhead's `queue_wait`, a backoff cap, a breaker's
/// cool-down and window) above a day; `max_key_len` above 64 KiB;
/// `max_value_size` outside 1 KiB..=512 MiB; counts
/// past what their policy can use (see each config's `validate`).
pub struct CacheBuilder<V> {
    namespace: String,
    /// Whether [`namespace`](Self::namespace) was called (a warning at
    /// build otherwise).
    namespace_given: bool,
    key_prefix: String,
    store: Option<Arc<dyn Store>>,
    ttl: Duration,
    negative_ttl: Option<Duration>,
    jitter: Jitter,
    codec: Codec,
    compression: Compression,
    max_key_len: usize,
    max_value_size: usize,
    trace_keys: bool,
    startup_check: bool,
    version: u32,
    version_transition: Duration,
    grace: Duration,
    max_stale: Option<Duration>,
    early_refresh: EarlyRefresh,
    soft_timeout: Option<Duration>,
    fail_safe_throttle: Duration,
    lease: LeaseConfig,
    load_timeout: Duration,
    origin: Option<Origin>,
    breaker: Option<BreakerConfig>,
    limit: Option<LimitConfig>,
    retry: Option<RetryConfig>,
    fallback: Option<Fallback<V>>,
    l1: Option<L1Config>,
    store_breaker: BreakerConfig,
    rng_seed: Option<u64>,
    write_split: usize,
    _value: PhantomData<fn() -> V>,
}

impl<V> fmt::Debug for CacheBuilder<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheBuilder")
            .field("namespace", &self.namespace)
            .field("key_prefix", &self.key_prefix)
            .field("ttl", &self.ttl)
            .field("jitter", &self.jitter)
            .finish_non_exhaustive()
    }
}

/// The store breaker's default: opens after 5 consecutive store failures,
/// for 1 s (jittered ±20 %).
pub(crate) fn default_store_breaker() -> BreakerConfig {
    BreakerConfig::new()
        .consecutive_failures(5)
        .cool_down(Duration::from_secs(1))
}

/// The default `max_value_size`: 16 MiB.
const DEFAULT_MAX_VALUE_SIZE: usize = 16 * 1024 * 1024;
/// The smallest `max_value_size` accepted: 1 KiB.
const MIN_MAX_VALUE_SIZE: usize = 1024;
/// The largest `max_value_size` accepted: 512 MiB (Redis's largest
/// string) less 1 KiB for the entry's header.
const MAX_MAX_VALUE_SIZE: usize = 512 * 1024 * 1024 - 1024;

fn validate_max_value_size(bytes: usize) -> Result<(), ConfigError> {
    if bytes < MIN_MAX_VALUE_SIZE {
        return Err(ConfigError::new(format!(
            "max_value_size must be at least {MIN_MAX_VALUE_SIZE} bytes, got {bytes}; use the \
             default (16 MiB) or the largest value you cache"
        )));
    }
    if bytes > MAX_MAX_VALUE_SIZE {
        return Err(ConfigError::new(format!(
            "max_value_size must be at most {MAX_MAX_VALUE_SIZE} bytes (512 MiB, Redis's largest \
             string, less room for the header), got {bytes}; use the default (16 MiB) or the largest value you cache"
        )));
    }
    Ok(())
}

/// The largest `max_key_len` accepted, in bytes.
const MAX_KEY_LEN: usize = 64 * 1024;

/// The longest namespace accepted, in bytes.
const MAX_NAMESPACE_LEN: usize = 128;

/// The longest key prefix accepted, in bytes.
const MAX_KEY_PREFIX_LEN: usize = 64;

impl<V: Value> CacheBuilder<V> {
    pub(crate) fn new() -> Self {
        CacheBuilder {
            namespace: "default".to_owned(),
            namespace_given: false,
            key_prefix: "bw:".to_owned(),
            store: None,
            ttl: Duration::from_secs(300),
            negative_ttl: None,
            jitter: Jitter::ratio(0.1),
            codec: Codec::msgpack(),
            compression: Compression::lz4(),
            max_key_len: 1024,
            max_value_size: DEFAULT_MAX_VALUE_SIZE,
            grace: Duration::ZERO,
            max_stale: None,
            early_refresh: EarlyRefresh::xfetch(1.0),
            soft_timeout: None,
            fail_safe_throttle: Duration::from_secs(5),
            lease: LeaseConfig::new(),
            load_timeout: Duration::from_secs(30),
            origin: None,
            breaker: None,
            limit: None,
            retry: None,
            fallback: None,
            l1: None,
            store_breaker: default_store_breaker(),
            rng_seed: None,
            write_split: super::queue::SPLIT_FROM,
            trace_keys: false,
            startup_check: true,
            version: 0,
            version_transition: Duration::ZERO,
            _value: PhantomData,
        }
    }

    /// The namespace every key of this cache lives in. Two caches with
    /// different namespaces (or key prefixes, or versions) never see each
    /// other's keys: 1 to 128 bytes, `:` allowed, but no braces, whitespace,
    /// control characters or `@` (it marks a [`version`](Self::version) in
    /// the keys).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self.namespace_given = true;
        self
    }

    /// What every Redis key and channel of this cache starts with: the
    /// value of a key is stored under `<prefix><namespace>:v:{<key>}`, its
    /// lease under `<prefix><namespace>:l:{<key>}`, and fill and
    /// invalidation notices go to the channel `<prefix><namespace>:events`.
    /// The store touches no other key. `"bw:"` by default.
    ///
    /// Used as given, 1 to 64 bytes, ending with `:` and with no other `:`
    /// (so that no other prefix and namespace spell the same keys: `bw:`
    /// with namespace `a:b` and `bw:a:` with namespace `b` would), without
    /// `{` or `}` (the keys' Redis Cluster hash tags follow it), and
    /// without whitespace, control characters or the ACL glob characters
    /// `*`, `?`, `[`, `]`, `\`, so that the patterns `~<prefix>*` and
    /// `&<prefix>*` match exactly this cache's keys and channels.
    ///
    /// # Redis ACL users
    ///
    /// A Redis user limited to an application's own keys and channels works
    /// when the prefix is theirs. The commands the store sends are `GET`,
    /// `MGET` (batch reads, tags, reads that meet), `SET`, `DEL`, `PTTL`,
    /// `EXISTS`, `PUBLISH`, `SUBSCRIBE`, `EVALSHA` and `EVAL` (its Lua
    /// scripts also run `SETRANGE` and `PEXPIRE`, and `SADD`, `SISMEMBER`
    /// and `SRANDMEMBER` on the index of live leases), `MULTI`, `SREM`
    /// and `EXEC` (batch writes), and the keyless `PING` and `TIME`; a Redis Cluster
    /// also needs `CLUSTER SLOTS`, and a Sentinel-managed master `ROLE`
    /// (every connection to the master the sentinels name checks that it
    /// is one). The narrowest user:
    ///
    /// ```text
    /// ACL SETUSER app on >secret resetkeys ~myapp:* resetchannels &myapp:* -@all
    ///     +get +mget +set +del +pttl +exists +publish +subscribe +evalsha +eval
    ///     +getrange +setrange +pexpire +sadd +srem +sismember
    ///     +srandmember +multi +exec
    ///     +ping +time +cluster|slots +role
    /// ```
    ///
    /// or, less strictly, `+@all -@dangerous` for the commands. Connect as
    /// it with `redis://app:secret@host:6379/`. With another prefix (the
    /// default `bw:` included) every command fails with `NOPERM`: a
    /// [`Store`](crate::ErrorKind::Store) error that names the missing
    /// permission.
    ///
    /// # Examples
    ///
    /// ```
    /// use breakwater_cache::Cache;
    ///
    /// let cache = Cache::<String>::builder()
    ///     .key_prefix("myapp:")
    ///     .namespace("catalog")
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(cache.storage_key(b"product:42").unwrap(), b"myapp:catalog:v:{product:42}");
    /// ```
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// The backend: a [`MemoryStore`], a [`RedisStore`](crate::RedisStore),
    /// or your own [`Store`].
    pub fn store(mut self, store: impl Store) -> Self {
        self.store = Some(Arc::new(store));
        self
    }

    /// A backend shared with other caches.
    pub fn shared_store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = Some(store);
        self
    }

    /// How long a loaded value stays fresh, before jitter.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long "not found" (a loader returning `Ok(None)`) is remembered,
    /// before jitter.
    pub fn negative_ttl(mut self, ttl: Duration) -> Self {
        self.negative_ttl = Some(ttl);
        self
    }

    /// The jitter applied to every write's TTL.
    pub fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// How values are serialized.
    pub fn codec(mut self, codec: Codec) -> Self {
        self.codec = codec;
        self
    }

    /// When payloads are compressed, and the cap on decompressed size.
    pub fn compression(mut self, compression: Compression) -> Self {
        self.compression = compression;
        self
    }

    /// The longest user key accepted, in bytes.
    pub fn max_key_len(mut self, bytes: usize) -> Self {
        self.max_key_len = bytes;
        self
    }

    /// The largest value cached, in serialized bytes (what the codec
    /// produces, before compression; the stored entry adds a 33-byte
    /// header); between 1 KiB and 512 MiB less 1 KiB (Redis's largest
    /// string). A larger value is never cached:
    /// [`Cache::set`] fails with [`TooLarge`](crate::ErrorKind::TooLarge),
    /// and a loaded one is returned to its callers but not written (the
    /// lease is released, so waiters elsewhere load for themselves). Each
    /// one is counted in `breakwater_too_large_total` and logged
    /// (rate-limited) with its key and size. Serialization stops at the
    /// limit, so refusing a value costs at most serializing
    /// `max_value_size` bytes: a 64 MiB string is refused without being
    /// copied.
    pub fn max_value_size(mut self, bytes: usize) -> Self {
        self.max_value_size = bytes;
        self
    }

    /// The version of what this cache stores: bump it when values change
    /// shape or meaning (a new field, another unit) and the old entries
    /// must not be served as they are. Version 0, the default, stores under
    /// `<key_prefix><namespace>:v:{key}`; version `n` under
    /// `<key_prefix><namespace>@<n>:v:{key}` (a namespace has no `@`, so
    /// no two namespaces and versions share keys), with its own change
    /// channel. Processes
    /// of two versions share no entries; see
    /// [`version_transition`](Self::version_transition) for a deploy that
    /// does not start cold, and [`Cache::warm`](crate::Cache::warm) to fill
    /// the new version before traffic moves.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use breakwater_cache::Cache;
    ///
    /// // Version 3 of the product cache; for 10 minutes after start, a
    /// // product not yet in version 3 is served from version 2 (as stale)
    /// // while one load per key fills version 3.
    /// let products = Cache::<String>::builder()
    ///     .namespace("products")
    ///     .version(3)
    ///     .version_transition(Duration::from_secs(600))
    ///     .build()?;
    /// # Ok::<(), breakwater_cache::ConfigError>(())
    /// ```
    pub fn version(mut self, version: u32) -> Self {
        self.version = version;
        self
    }

    /// For `window` after the cache is built (a deploy that bumped
    /// [`version`](Self::version)), a `get_or_load` of a key with no entry
    /// in this version
    /// reads the previous version's entry (version `n - 1`; version 0 for
    /// version 1) and, if it decodes as this cache's value type, serves it
    /// as stale ([`StaleReason::PreviousVersion`](crate::StaleReason::PreviousVersion))
    /// while one background load under the key's lease fills this version.
    /// Those loads are background loads: the origin's bulkhead sheds them
    /// first, so a version bump under traffic never queues callers behind
    /// the database, and nobody waits or fails while the previous entry
    /// stands in. An entry that does not decode (the shape changed too
    /// much) is a miss, loaded as usual.
    ///
    /// Both versions stay coherent while they run side by side (a rolling
    /// deploy), by this version's doing alone: the previous version runs
    /// the code deployed before. An `invalidate` or `set` here revokes the
    /// previous version's entry and lease and tells its processes. An
    /// `invalidate`, `set` or fill there revokes this version's entry of the
    /// key: each entry written here inside the window is valid only while
    /// the previous version's entry it was loaded beside is unchanged
    /// (where there was none, a placeholder that the previous version reads
    /// as an expired entry marks the spot), checked on every read (the two
    /// entries are read with one `MGET`), and this version also listens on
    /// the previous version's channel to drop its L1 copies. A fill by the
    /// previous version therefore costs this version one more load of that
    /// key. The window should cover the whole deploy: past it, this version
    /// no longer hears the previous one. `Duration::ZERO` (the default): no
    /// transition. At most 7 days; needs a version of 1 or more.
    pub fn version_transition(mut self, window: Duration) -> Self {
        self.version_transition = window;
        self
    }

    /// Whether spans carry the raw key (`key` field). Off by default, for
    /// privacy: a key may hold an email address or a user id. Spans always
    /// carry `key.hash`, a 64-bit FNV-1a hash of the key (the same key gives
    /// the same hash in every process), so one key's calls can be followed
    /// without it. See [`Cache`]'s `# Tracing`.
    pub fn trace_keys(mut self, on: bool) -> Self {
        self.trace_keys = on;
        self
    }

    /// Whether the built cache checks its store once, in the background,
    /// and logs one line per finding ([`Cache::check`]: the eviction
    /// policy and what breakwater does under it, the commands its user
    /// lacks, pub/sub, L1 without a bus). On by default. The check runs
    /// on the tokio runtime `build` is called on; built outside one, the
    /// cache logs that the check did not run (call [`Cache::check`] from a
    /// runtime then). Off, nothing is checked unless [`Cache::check`] is
    /// called. The check writes and deletes one probe key under the
    /// cache's prefix and publishes one message on `<channel>:check`. A
    /// user without `+config|get` (such as the narrow user of
    /// [`key_prefix`](Self::key_prefix)'s docs) is refused its `CONFIG GET`:
    /// the check's warning says so, and Redis records it in `ACL LOG`.
    ///
    /// # Examples
    ///
    /// ```
    /// use breakwater_cache::Cache;
    ///
    /// // A test that counts the commands a cache sends: no check.
    /// let cache = Cache::<u64>::builder().startup_check(false).build()?;
    /// # let _ = cache;
    /// # Ok::<(), breakwater_cache::ConfigError>(())
    /// ```
    pub fn startup_check(mut self, on: bool) -> Self {
        self.startup_check = on;
        self
    }

    /// Stale-while-revalidate: for this long past its fresh window a value is
    /// served at once while one background refresh runs. `Duration::ZERO`
    /// (the default) opts out: data that must not be stale (payments, stock,
    /// permissions) waits for the load instead.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Fail-safe (stale-if-error): the most a value may be served past its
    /// fresh window, when its load fails, times out or cannot get the lease.
    /// Defaults to `grace`; must not be shorter than it. The store drops the
    /// value once this has passed, whatever any client believes.
    pub fn max_stale(mut self, max_stale: Duration) -> Self {
        self.max_stale = Some(max_stale);
        self
    }

    /// Refresh a hot key in the background before it goes stale.
    pub fn early_refresh(mut self, early: EarlyRefresh) -> Self {
        self.early_refresh = early;
        self
    }

    /// When a stale value exists and the load takes longer than this, serve
    /// the stale value and let the load finish in the background.
    pub fn soft_timeout(mut self, timeout: Duration) -> Self {
        self.soft_timeout = Some(timeout);
        self
    }

    /// After a failed load served a stale value, serve it without calling
    /// the loader again for this long (per process), so a failing database
    /// is not retried by every request.
    pub fn fail_safe_throttle(mut self, throttle: Duration) -> Self {
        self.fail_safe_throttle = throttle;
        self
    }

    /// The key's lease as one [`LeaseConfig`]: its TTL, how long and how
    /// often other callers wait for its holder, and what they do past the
    /// wait. The four settings also have shorthands here
    /// ([`lease_ttl`](Self::lease_ttl), [`lock_wait`](Self::lock_wait),
    /// [`lock_poll`](Self::lock_poll),
    /// [`on_lock_timeout`](Self::on_lock_timeout)); the last call wins.
    pub fn lease(mut self, config: LeaseConfig) -> Self {
        self.lease = config;
        self
    }

    /// [`LeaseConfig::lease_ttl`]: how long a loader's lease lives without
    /// being extended (3 s by default; at least 10 ms).
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease = self.lease.lease_ttl(ttl);
        self
    }

    /// [`LeaseConfig::lock_wait`]: how long a caller waits for another
    /// process's load before [`on_lock_timeout`](Self::on_lock_timeout)
    /// applies. With [`OnLockTimeout::load_anyway`] (the default policy) it
    /// must be at least `queue_wait + load_timeout + lease_ttl`.
    pub fn lock_wait(mut self, wait: Duration) -> Self {
        self.lease = self.lease.lock_wait(wait);
        self
    }

    /// [`LeaseConfig::lock_poll`]: how often a waiter re-checks on its own,
    /// in case a wake-up message is lost.
    pub fn lock_poll(mut self, poll: Duration) -> Self {
        self.lease = self.lease.lock_poll(poll);
        self
    }

    /// [`LeaseConfig::on_lock_timeout`]: what happens when `lock_wait` runs
    /// out.
    pub fn on_lock_timeout(mut self, policy: OnLockTimeout) -> Self {
        self.lease = self.lease.on_lock_timeout(policy);
        self
    }

    /// The hard bound on one loader call; past it callers get a
    /// [`Timeout`](crate::ErrorKind::Timeout) error and the lease is released.
    pub fn load_timeout(mut self, timeout: Duration) -> Self {
        self.load_timeout = timeout;
        self
    }

    /// Loads go through `origin`'s circuit breaker, bulkhead and retries,
    /// shared with every other cache built with a clone of it.
    pub fn origin(mut self, origin: Origin) -> Self {
        self.origin = Some(origin);
        self
    }

    /// The circuit breaker of this cache's own origin.
    pub fn breaker(mut self, config: BreakerConfig) -> Self {
        self.breaker = Some(config);
        self
    }

    /// The load bulkhead of this cache's own origin.
    pub fn limit(mut self, config: LimitConfig) -> Self {
        self.limit = Some(config);
        self
    }

    /// The retry policy of this cache's own origin.
    pub fn retry(mut self, config: RetryConfig) -> Self {
        self.retry = Some(config);
        self
    }

    /// Serve a clone of `value` when a load fails (or is refused by the
    /// breaker, or shed) and no stale value can stand in. Not cached.
    pub fn fallback(self, value: V) -> Self
    where
        V: Clone + Send + Sync + 'static,
    {
        self.fallback_with(move |_| Some(value.clone()))
    }

    /// Like [`fallback`](Self::fallback), computed from the key; `None`
    /// means "not found".
    pub fn fallback_with(
        mut self,
        fallback: impl Fn(&[u8]) -> Option<V> + Send + Sync + 'static,
    ) -> Self {
        self.fallback = Some(Arc::new(fallback));
        self
    }

    /// An in-process near cache of decoded values in front of the store,
    /// kept in step with other processes through the namespace channel.
    pub fn l1(mut self, config: L1Config) -> Self {
        self.l1 = Some(config);
        self
    }

    /// The store's circuit breaker: after repeated store failures or
    /// timeouts the cache stops calling the store for a cool-down and serves
    /// from L1 and direct loads. Each failure domain of the store (a Redis
    /// Cluster's groups of hash slots) gets its own breaker with this
    /// configuration.
    pub fn store_breaker(mut self, config: BreakerConfig) -> Self {
        self.store_breaker = config;
        self
    }

    /// Seeds the random source behind jitter, for reproducible runs.
    pub fn rng_seed(mut self, seed: u64) -> Self {
        self.rng_seed = Some(seed);
        self
    }

    /// Queued `set`s go out as two transactions side by side from `from`
    /// of them on (16 by default): for the simulation, whose few keys
    /// seldom queue 16.
    #[cfg(feature = "test-util")]
    #[doc(hidden)]
    pub fn write_split_from(mut self, from: usize) -> Self {
        self.write_split = from.max(2);
        self
    }

    /// Every check [`build`](Self::build) makes, in its order, and what it
    /// builds from them: the per-call defaults and the origin.
    pub(crate) fn check(&self) -> Result<Checked, ConfigError> {
        validate_namespace(&self.namespace).for_key("namespace")?;
        validate_key_prefix(&self.key_prefix).for_key("key_prefix")?;
        validate_version(self.version, self.version_transition)?;
        let defaults = Options {
            ttl: self.ttl,
            negative_ttl: self
                .negative_ttl
                .unwrap_or_else(|| self.ttl.min(Duration::from_secs(30))),
            jitter: self.jitter,
            grace: self.grace,
            max_stale: self.max_stale,
            early_refresh: self.early_refresh,
            soft_timeout: self.soft_timeout,
            load_timeout: self.load_timeout,
            fail_safe_throttle: self.fail_safe_throttle,
            poll_scale: 1,
        };
        defaults.validate()?;
        let origin = match &self.origin {
            Some(origin) => {
                if self.breaker.is_some() || self.limit.is_some() || self.retry.is_some() {
                    return Err(ConfigError::new(
                        "breaker, limit and retry belong to the shared Origin when one is given; \
                         set them on Origin::builder instead",
                    )
                    .for_key("origin"));
                }
                origin.clone()
            }
            None => {
                // Only what was set: the origin's own defaults stand otherwise.
                let mut origin = Origin::builder(self.namespace.clone());
                if let Some(breaker) = self.breaker {
                    origin = origin.breaker(breaker);
                }
                if let Some(limit) = self.limit {
                    origin = origin.limit(limit);
                }
                if let Some(retry) = &self.retry {
                    origin = origin.retry(retry.clone());
                }
                if let Some(seed) = self.rng_seed {
                    origin = origin.rng_seed(seed);
                }
                origin.build()?
            }
        };
        self.lease
            .validate(self.load_timeout.saturating_add(origin.queue_wait()))?;
        self.store_breaker.validate().within("store_breaker")?;
        if let Some(l1) = &self.l1 {
            l1.validate().within("l1")?;
        }
        if self.max_key_len == 0 {
            return Err(
                ConfigError::new("max_key_len must be greater than zero").for_key("max_key_len")
            );
        }
        if self.max_key_len > MAX_KEY_LEN {
            return Err(ConfigError::new(format!(
                "max_key_len must be at most {MAX_KEY_LEN} bytes, got {}; hash longer keys \
                 into a short one",
                self.max_key_len
            ))
            .for_key("max_key_len"));
        }
        validate_max_value_size(self.max_value_size).for_key("max_value_size")?;
        self.compression.validate().within("compression")?;
        Ok(Checked { defaults, origin })
    }

    /// The effective settings of a cache built from this builder.
    fn settings(&self, defaults: &Options, origin: &Origin) -> Settings {
        let (breaker, limit, retry) = origin.configs().clone();
        let load = defaults.load_timeout.saturating_add(origin.queue_wait());
        Settings {
            namespace: self.namespace.clone(),
            key_prefix: self.key_prefix.clone(),
            version: self.version,
            version_transition: self.version_transition,
            trace_keys: self.trace_keys,
            startup_check: self.startup_check,
            ttl: defaults.ttl,
            negative_ttl: defaults.negative_ttl,
            jitter: defaults.jitter,
            codec: self.codec,
            compression: self.compression,
            max_key_len: self.max_key_len,
            max_value_size: self.max_value_size,
            grace: defaults.grace,
            max_stale: defaults.max_stale(),
            early_refresh: defaults.early_refresh,
            soft_timeout: defaults.soft_timeout,
            fail_safe_throttle: defaults.fail_safe_throttle,
            lease_ttl: self.lease.lease_ttl,
            lock_wait: self.lease.lock_wait_for(load),
            lock_poll: self.lease.lock_poll,
            on_lock_timeout: self.lease.on_lock_timeout,
            load_timeout: defaults.load_timeout,
            origin: origin.name().to_owned(),
            breaker,
            limit,
            retry: super::settings::RetrySetting(retry),
            fallback: self.fallback.is_some(),
            l1: self.l1,
            store_breaker: self.store_breaker,
        }
    }

    /// One warning per default that surprises in production: no store
    /// (a process-local memory store that shares nothing) and no
    /// namespace (every cache left without one shares `"default"`).
    fn warn_of_defaults(&self) {
        if self.store.is_none() {
            tracing::warn!(
                namespace = %self.namespace,
                "cache built without .store(..): its entries live in a MemoryStore of its own, \
                 in this process only, shared with no other process or cache; pass \
                 .store(RedisStore::connect(url)?) to share them, or .store(MemoryStore::new()) \
                 if a process-local cache is what you want"
            );
        }
        if !self.namespace_given {
            tracing::warn!(
                "cache built without .namespace(..): it uses \"default\", which every cache \
                 left without one shares; caches of different value types there read each \
                 other's entries as misses. Name each cache, e.g. .namespace(\"products\")"
            );
        }
    }

    /// Checks every setting and builds the cache. No I/O happens here: a
    /// [`RedisStore`](crate::RedisStore) connects on first use.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the first invalid setting, e.g.
    /// `jitter ratio must be in 0..=1, got 1.5`, with the setting's key
    /// ([`ConfigError::key`]: `jitter.ratio`).
    pub fn build(self) -> Result<Cache<V>, ConfigError> {
        let Checked { defaults, origin } = self.check()?;
        let settings = self.settings(&defaults, &origin);
        let rng = match self.rng_seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => rand::make_rng(),
        };
        let versioned = |version: u32| match version {
            0 => format!("{}{}", self.key_prefix, self.namespace),
            n => format!("{}{}@{n}", self.key_prefix, self.namespace),
        };
        let value_prefix = format!("{}:v:", versioned(self.version)).into_bytes();
        let tag_prefix = format!("{}{}:t:", self.key_prefix, self.namespace).into_bytes();
        let clear_key = format!("{}:c", versioned(self.version)).into_bytes();
        let previous = (!self.version_transition.is_zero()).then(|| Previous {
            prefix: format!("{}:v:", versioned(self.version - 1)).into_bytes(),
            until: tokio::time::Instant::now() + self.version_transition,
            channel: format!("{}:events", versioned(self.version - 1)).into_bytes(),
        });
        self.warn_of_defaults();
        let metrics = Metrics::new(&self.namespace, origin.name());
        metrics.register();
        let channel = format!("{}:events", versioned(self.version)).into_bytes();
        let hears = previous.as_ref().map(|p| PreviousChannel {
            channel: p.channel.clone(),
            prefixes: (p.prefix.clone(), value_prefix.clone()),
            until: p.until,
        });
        let local = Arc::new(Local::new(
            self.l1.map(NearCache::<V>::new),
            value_prefix.len(),
        ));
        let hook = Some(Arc::clone(&local) as Arc<dyn BusHook>);
        let mut token_rng: StdRng = rand::make_rng();
        let sender: [u8; SENDER_LEN] = token_rng.random();
        let mut waiters = Waiters::new(channel, sender, hook, Some(metrics.clone()));
        if let Some(hears) = hears {
            waiters = waiters.with_previous(hears);
        }
        let raw_store = self.store.unwrap_or_else(|| Arc::new(MemoryStore::new()));
        let logs = Arc::new(LogLimiter::default());
        let store = Arc::new(GuardedStore::new(
            Arc::clone(&raw_store),
            &self.namespace,
            self.store_breaker,
            self.rng_seed.map(|s| s.wrapping_add(2)),
            metrics.clone(),
            Arc::clone(&logs),
        ));
        local.clears.link(
            Arc::clone(&store) as Arc<dyn Store>,
            clear_key.clone(),
            waiters.channel().to_vec(),
            *waiters.sender(),
        );
        let startup_check = self.startup_check;
        let cache = Cache {
            inner: Arc::new(CacheCore {
                value_prefix,
                tag_prefix,
                clear_key,
                read_queue: raw_store
                    .batches_reads()
                    .then(|| Arc::new(ReadQueue::default())),
                write_queue: raw_store
                    .batches_reads()
                    .then(|| Arc::new(WriteQueue::default())),
                write_split: self.write_split,
                raw_store,
                store,
                origin,
                defaults,
                previous,
                lease: self.lease,
                rng: Mutex::new(rng),
                store_retries: store_retries(self.rng_seed.map(|s| s.wrapping_add(3))),
                token_rng: Mutex::new(token_rng),
                waiters,
                metrics,
                logs,
                throttled: Throttle::default(),
                settings,
            }),
            local,
            fallback: self.fallback,
        };
        if startup_check {
            cache.check_at_startup();
        }
        Ok(cache)
    }
}

/// What [`CacheBuilder::check`] found valid and built.
pub(crate) struct Checked {
    /// The per-call settings unless a call overrides them.
    defaults: Options,
    origin: Origin,
}

fn validate_namespace(ns: &str) -> Result<(), ConfigError> {
    if ns.is_empty() {
        return Err(ConfigError::new("namespace must not be empty"));
    }
    if ns.len() > MAX_NAMESPACE_LEN {
        return Err(ConfigError::new(format!(
            "namespace must be at most {MAX_NAMESPACE_LEN} bytes, got {}",
            ns.len()
        )));
    }
    if let Some(c) = ns
        .chars()
        .find(|c| matches!(c, '{' | '}') || c.is_whitespace() || c.is_control())
    {
        return Err(ConfigError::new(format!(
            "namespace must not contain braces, whitespace or control characters \
             (found {c:?} in {ns:?})"
        )));
    }
    // `@<n>` marks a version: namespace "a@1" at version 0 would be
    // namespace "a" at version 1.
    if ns.contains('@') {
        return Err(ConfigError::new(format!(
            "namespace must not contain '@', which marks a version in the keys \
             (namespace \"a@1\" would share the keys of namespace \"a\" at version 1); \
             use CacheBuilder::version instead (got {ns:?})"
        )));
    }
    Ok(())
}

/// The longest version transition.
const MAX_VERSION_TRANSITION: Duration = Duration::from_secs(7 * 24 * 3600);

fn validate_version(version: u32, transition: Duration) -> Result<(), ConfigError> {
    if transition > MAX_VERSION_TRANSITION {
        return Err(ConfigError::new(format!(
            "version_transition must be at most 7 days, got {transition:?}"
        ))
        .for_key("version_transition"));
    }
    if !transition.is_zero() && version == 0 {
        return Err(ConfigError::new(
            "version_transition needs a version of 1 or more (version 0 has no previous \
             version to read)",
        )
        .for_key("version_transition"));
    }
    Ok(())
}

fn validate_key_prefix(prefix: &str) -> Result<(), ConfigError> {
    if prefix.is_empty() {
        return Err(ConfigError::new(
            "key_prefix must not be empty; the default is \"bw:\"",
        ));
    }
    if prefix.len() > MAX_KEY_PREFIX_LEN {
        return Err(ConfigError::new(format!(
            "key_prefix must be at most {MAX_KEY_PREFIX_LEN} bytes, got {}",
            prefix.len()
        )));
    }
    if let Some(c) = prefix.chars().find(|c| {
        matches!(c, '{' | '}' | '*' | '?' | '[' | ']' | '\\') || c.is_whitespace() || c.is_control()
    }) {
        return Err(ConfigError::new(format!(
            "key_prefix must not contain braces (the keys' hash tags follow it), the ACL glob \
             characters * ? [ ] \\, whitespace or control characters (found {c:?} in {prefix:?})"
        )));
    }
    // The prefix's one ':' is its last byte, so a key splits into prefix
    // and namespace one way only ("bw:" + "a:b" and "bw:a:" + "b" would
    // spell the same keys).
    if !prefix.ends_with(':') || prefix[..prefix.len() - 1].contains(':') {
        return Err(ConfigError::new(format!(
            "key_prefix must end with ':' and contain no other ':' (got {prefix:?}), so that \
             no other prefix and namespace spell the same keys (\"bw:\" with namespace \"a:b\" \
             and \"bw:a:\" with namespace \"b\" would); put the rest in the namespace, \
             e.g. key_prefix \"myapp:\" with namespace \"cache:catalog\""
        )));
    }
    Ok(())
}

/// Retries of store calls safe to repeat (`invalidate`, a warm-up's
/// reads): up to 10 attempts, 20..400 ms apart with full jitter (spread
/// over a second or more, so a store breaker's cool-down can pass), for
/// store failures that may pass (not a key's own fault).
pub(super) fn store_retries(seed: Option<u64>) -> crate::retry::Retry {
    let config = crate::RetryConfig::new()
        .max_attempts(10)
        .backoff(crate::Backoff::full_jitter(
            Duration::from_millis(20),
            Duration::from_millis(400),
        ))
        .retry_if(|err| err.is_store() && !err.is_key_fault());
    crate::retry::Retry::new(config, seed)
}

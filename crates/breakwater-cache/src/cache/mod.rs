//! The [`Cache`] handle, its builder, and the `get_or_load` pipeline.
//!
//! # Order
//!
//! One `get_or_load(key, loader)` reads top to bottom:
//!
//! 1. **Key**: validated and namespaced (a bad key never reaches the store).
//!    With an L1 ([`L1Config`](crate::L1Config)), a fresh local copy is
//!    returned here, before anything else is built.
//! 2. **Read**: one `GET` of the envelope, shared by the callers of the key
//!    in this process. Corrupt or foreign bytes are a miss plus a warning; a
//!    store failure is a miss plus a warning too: an L1 copy stands in if
//!    there is one; else a store that cannot be used (its breaker open, no
//!    connection) degrades to direct loads instead of failing requests,
//!    while one that timed out (slow, not gone) still goes through the
//!    lease (steps 4–6). An entry written with tags
//!    is checked against its tags' generations (one more round trip; see
//!    `tags`); one whose tag was invalidated is a miss. When nothing is stored, the
//!    shared read goes straight on to steps 4–6 and its callers get the
//!    load's outcome.
//! 3. **Freshness**: judged on the store's clock. Fresh → return.
//! 4. **One load per key**: callers in this process share one flight
//!    ([`SingleFlight`](crate::flight::SingleFlight)); the flight takes the key's lease in the store so
//!    one process in the fleet loads. Without the lease it waits to be woken
//!    by the holder's "filled" message (with jittered polling as a fallback)
//!    up to `lock_wait`, then follows [`OnLockTimeout`]. A waiter marks the
//!    lease as waited on, and the holder's message then carries the stored
//!    entry (up to 16 KiB), so woken waiters do not read it back.
//! 5. **Load**: the loader runs in its own task, under `load_timeout`, the
//!    lease extended while it runs; `Ok(None)` becomes a negative entry.
//! 6. **Fenced write**: the entry is written with a jittered TTL only if the
//!    lease is still ours (an invalidation revokes it), the lease released and
//!    "filled" published, atomically. A failed write is logged; the callers
//!    still get the loaded value.

mod batch;
mod builder;
mod coherence;
mod fill;
mod guard;
mod inspect;
mod notify;
mod options;
mod origin;
mod queue;
mod settings;
mod tags;
mod throttle;
mod transition;
mod warm;

pub(crate) use builder::default_store_breaker;
pub use builder::{CacheBuilder, OnLockTimeout};
pub use inspect::{EntryView, Inspection, Stored};
pub use options::CacheEntry;
pub use origin::{Origin, OriginBuilder};
pub use settings::Settings;
pub use warm::{Warm, WarmReport};

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::RngExt;
use rand::rngs::StdRng;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::breaker::BreakerState;
use crate::clock::millis;
use crate::codec::{Codec, Compression, Encode};
use crate::entry::{Entry, TagStamp};
use crate::error::{Error, ErrorKind};
use crate::flight::{Joined, Lead, Role, Turn};
use crate::freshness::{Freshness, FreshnessPolicy, Reading};
use crate::key::CacheKey;
use crate::l1::{Slot, Stamp, Ticket};
use crate::limit::Priority;
use crate::log_limit::{LogLimiter, Once, Warning, warn_limited};
use crate::metrics::Metrics;
use crate::metrics::Stats;
use crate::served::{Fetched, Served, StaleReason};
use crate::store::{Notice, Replace, Store, fnv1a};
use builder::OnLockTimeout as LockPolicy;
use coherence::Local;
use fill::Mode;
use guard::GuardedStore;
use notify::Waiters;
use options::Options;
use throttle::Throttle;
use tokio::time::Instant;
use tracing::field::Empty;
use tracing::{Instrument, Span};
use transition::Pinned;

/// A loader as every internal step takes it (the public methods spell the
/// bounds out): `FnOnce() -> impl Future<Output = Result<Option<V>, E>>`,
/// cloned for each call.
pub(crate) trait Load<V>: Clone + Send + Sync + 'static {
    /// The loader's future.
    type Fut: Future<Output = Result<Option<V>, Self::Err>> + Send + 'static;
    /// The loader's error.
    type Err: Into<Box<dyn StdError + Send + Sync + 'static>> + 'static;
    /// Calls the loader.
    fn call(&self) -> Self::Fut;
    /// The tags the call named, recorded in the entry its load writes.
    fn tags(&self) -> Option<&tags::TagSet> {
        None
    }
}

impl<V, F, Fut, E> Load<V> for F
where
    F: FnOnce() -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Option<V>, E>> + Send + 'static,
    E: Into<Box<dyn StdError + Send + Sync + 'static>> + 'static,
{
    type Fut = Fut;
    type Err = E;

    fn call(&self) -> Fut {
        (self.clone())()
    }
}

/// What a cached value must be: serializable, cloneable (one load is shared
/// by every caller waiting on it) and sendable across tasks.
pub trait Value: Serialize + DeserializeOwned + Clone + Send + Sync + 'static {}
impl<T: Serialize + DeserializeOwned + Clone + Send + Sync + 'static> Value for T {}

/// A typed cache of `V` values in one namespace of a [`Store`].
///
/// Cheap to clone: clones share the store, settings and random source. A
/// `Cache` and its clones are one *process* below: one set of in-process
/// flights, one L1, one bus subscription. Two `Cache`s built separately
/// (even in one OS process) are two processes.
///
/// # Coherence: one truth across the fleet
///
/// Each line is a property the test suite checks, including a seeded
/// fault-schedule simulation (`tests/simulation.rs`) that delays, reorders,
/// times out (after running) and drops store commands, loses bus messages
/// and stops the store.
///
/// 1. **No resurrection.** Once [`invalidate`](Self::invalidate) or
///    [`set`](Self::set) has returned `Ok`, no load that started before it —
///    a lease fill, a direct load, a warm-up, a background refresh, a
///    lock-timeout load — becomes visible in the store, in this process's
///    L1, or to a caller of this process that starts after it returned.
///    Every load writes through one fence, the key's lease, which the
///    invalidation revokes atomically; in-process flights that began before
///    are detached; L1 refuses values from reads and loads that began before
///    (per-key epochs).
/// 2. **Read your invalidation.** In the invalidating process every call
///    that starts after `invalidate` returned gets a value loaded after it.
/// 3. **Bounded L1 staleness elsewhere.** Another process's L1 serves the
///    old value as fresh only until the invalidation message reaches it (a
///    millisecond or two on a healthy bus). A message lost on a live bus:
///    at most until the L1 entry's TTL ([`L1Config::ttl`](crate::L1Config::ttl),
///    30 s by default) runs out. A dropped bus: until the drop is noticed
///    (at once when the connection breaks; within the subscription's `PING`
///    interval plus its response deadline, 1.05 s by default, when Redis
///    hangs); from then on every L1 entry is unverified — re-read from the
///    store, or, while the store is unreachable too, served labelled
///    `Stale { StoreUnavailable }` within its stale window. Without L1
///    another process serves from the store, which the fence keeps clean; a
///    read already in the air when the message arrives may still land there
///    (one store deadline).
/// 4. **One load per key per expiry**, fleet-wide, while the store
///    answers, however slowly: a [`RedisStore`](crate::RedisStore)'s
///    deadlines follow the latency Redis has, up to its
///    `max_response_timeout` (2 s by default; see `# Deadlines follow
///    Redis's latency` on [`RedisStoreConfig`](crate::RedisStoreConfig);
///    its first connection needs a round trip within `connect_timeout`),
///    a read that timed out still goes through the lease, and a lease
///    attempt that timed out is made again with the same token; only a
///    store that cannot be used (its breaker open, no connection to be
///    had) makes a process load directly: once per key at a time in that
///    process (single-flight), under the origin's bulkhead. Waiters keep
///    waiting while the holder's lease is alive (it
///    is extended every third of `lease_ttl` while the loader runs), so a
///    slow loader is awaited, not repeated. A holder that dies stops
///    extending; its lease runs out within `lease_ttl` (3 s by default) and
///    exactly one waiter takes over, at the moment it expires. Waiting
///    ends at `lock_wait` (by default `queue_wait + load_timeout + 2 ×
///    lease_ttl`: a live holder's whole load, and one takeover that starts
///    within a lease TTL of the wait):
///    [`OnLockTimeout`] then applies to a stuck lease, never to a slow
///    load, and a background refresh never loads without the lease.
/// 5. **Liveness.** Every call returns. Writing *S* for one store deadline
///    (a [`RedisStore`](crate::RedisStore)'s read deadline: 3 × the round
///    trips it sees, at least `response_timeout`, 50 ms, at most
///    `max_response_timeout`, 2 s; for a write or a lease script at least
///    `write_timeout`, 250 ms; a
///    reconnect runs in the background and no call waits for it longer
///    than that; the first connection's attempt for as long as it may take;
///    twice when a broken connection is retried once), a `get_or_load`
///    takes at most: one read (*S*); then either a
///    load it leads (the lease, asked at most twice, 2*S*, the bulkhead's
///    `queue_wait` + `load_timeout` + one write, *S*), or a wait of
///    `lock_wait` plus a few store calls (4*S* + 250 ms) followed, with `load_anyway`, by a load (`queue_wait` +
///    `load_timeout`). A call that waited for a load revoked before it
///    started (see line 1) goes through again, so it may take that bound
///    up to three times. With a store breaker open, store calls fail at once.
///    The bound is each call's own: it does not depend on another caller
///    being polled, nor on the runtime that first used the cache. A call
///    that shares another caller's read of the key waits for it at most
///    *S* and then reads alone (that caller may have stopped polling its
///    future); once the read found nothing, callers wait on the load's own
///    task. A read queued behind another runtime's batch waits at most *S*
///    too. A load whose task went away with its runtime is loaded again
///    (it counts as one of the three passes); so is one that has not
///    landed within what a load can take (`lock_wait` + `queue_wait` +
///    `load_timeout` + 5 s): its task is stranded on a runtime that no
///    longer runs it (a current-thread runtime whose `block_on` returned
///    when its own caller gave up).
///
/// **Runtimes and dropped callers.** Background work (the store's
/// reconnection, probes, clock refresh and subscriptions; the cache's bus
/// listener) runs on the runtime of the call that first needed it and is
/// started again, on the next call's runtime, when that runtime has shut
/// down (or left it stranded, idle, past its next deadline). A bus
/// listener that is not subscribed, or is gone, counts as a dropped bus
/// (line 3: L1 entries unverified) until a new one is. The local step of
/// an `invalidate`, `set` or `invalidate_tag` (line 1 and 2 in this
/// process) runs even when the caller's future is dropped after the store
/// may have run it.
/// 6. **Time.** Freshness is judged on the store's clock (Redis's `TIME`,
///    sampled); no application-clock reading can pin, freeze or jump it.
///
/// **Tags.** The same lines hold for
/// [`invalidate_tag`](Self::invalidate_tag) and the entries written with
/// that tag ([`CacheEntry::tags`]), with the tag's generation as the fence:
/// (1) a load that started before recorded the old generation, so its entry
/// is invalid wherever it lands, and a tag-invalidated entry is never served,
/// not even stale; (2) in the invalidating process L1 is emptied (if it
/// holds a tagged entry) and every
/// load and shared read in the air detached before it returns (an entry's
/// tags are known only once read, so this applies to every key); (3)
/// another process empties its L1 when the message arrives, within the
/// same bounds; without L1 it reads the store, which checks a tagged
/// entry's generations on every read (one more round trip, for tagged
/// entries only); (5) `invalidate_tag` is retried within 1 s, as
/// `invalidate`; (6) a generation is at least the store's clock in ms.
///
/// **Redis forgets.** What the store loses never validates anything: an
/// evicted or deleted value is a miss; a lost lease is a free lease (a
/// load holding the old one is refused by the fence); a load whose fenced
/// write was refused answers only the callers that started before its
/// lease was asked for, so a call that starts after another process's
/// `invalidate` returned never gets the revoked value, even where the
/// message has not arrived (later callers read and load again). When the
/// store lost an entry that this process's L1 still holds (an eviction,
/// an empty restart, a failover to an empty replica, a `FLUSHDB`) and the
/// load fails, the L1 copy stands in within `max_stale`, as a stored
/// stale value would (fail-safe: with the bus lost, it may be a copy whose
/// invalidation this process did not hear).
///
/// **Replication.** Redis replicates asynchronously: a master that fails
/// right after acknowledging an `invalidate`, `set` or `invalidate_tag`
/// may hand over to a replica that never saw it. With
/// [`RedisStore::connect_sentinel`](crate::RedisStore::connect_sentinel)
/// the store replays the revocations the old master acknowledged on the
/// new one before any call uses it (see its docs for the bound). With a
/// single node behind an external failover, or a Redis Cluster, nothing
/// replays them: a revocation acknowledged within the replication lag
/// before a failover (typically well under a second; unbounded when the
/// replica was cut off) is lost, and the old value is served from the
/// promoted replica, fresh until its own TTL ends. Invalidate again after
/// a failover, or keep such data on Sentinel or behind a short TTL.
///
/// When the store cannot be used at all (the read or the lease attempt
/// failed), values are loaded directly, served and kept in L1, and not
/// written to the store: no fence can tell such a load from one that began
/// before an invalidation. A bus message published before this process's
/// own invalidation (and still on its way) cannot hand a waiter its value
/// either: until the invalidation is heard back, values carried for that
/// key are not taken.
///
/// # Tracing
///
/// With a [`tracing`] subscriber, each public call has a span:
/// `breakwater.get_or_load` (fields `namespace`, `key.hash`, `served`,
/// `role`, `error`; the raw `key` only with
/// [`trace_keys`](CacheBuilder::trace_keys)), `breakwater.get`,
/// `breakwater.set`, `breakwater.invalidate`, `breakwater.invalidate_tag`
/// and `breakwater.get_many`, with the store read, the fill, the load
/// (`origin`, `outcome`, `load_ms`) and the fenced write as children.
///
/// Levels: a `get_or_load` or `get` that a fresh L1 copy answers alone
/// (no store read, no refresh) has its span at `debug`, so an exporter
/// filtered at `info` does not ship one span per near-cache hit; every
/// call that reads the store or loads is at `info`; the store calls' own
/// spans are at `debug`. Warnings about the store or the loader are
/// rate-limited: one line per kind per second, with a `suppressed` count.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use breakwater_cache::{Cache, Jitter, MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let cache = Cache::<String>::builder()
///     .namespace("greetings")
///     .store(MemoryStore::new())
///     .ttl(Duration::from_secs(300))
///     .jitter(Jitter::ratio(0.2)) // 240..=360 s
///     .build()?;
///
/// let v = cache
///     .get_or_load("en", || async { Ok::<_, std::io::Error>(Some("hello".to_string())) })
///     .await?;
/// assert_eq!(v.as_deref(), Some("hello"));
/// assert_eq!(cache.get("en").await?.as_deref(), Some("hello"));
/// # Ok(()) }
/// ```
pub struct Cache<V> {
    inner: Arc<Inner>,
    /// Flights in the air and the L1 near cache.
    local: Arc<Local<V>>,
    /// Served when a load fails and no stale value can stand in.
    fallback: Option<Fallback<V>>,
}

/// Produces the degraded value for a user key.
type Fallback<V> = Arc<dyn Fn(&[u8]) -> Option<V> + Send + Sync>;

impl<V> Clone for Cache<V> {
    fn clone(&self) -> Self {
        Cache {
            inner: Arc::clone(&self.inner),
            local: Arc::clone(&self.local),
            fallback: self.fallback.clone(),
        }
    }
}

impl<V> fmt::Debug for Cache<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cache")
            .field("namespace", &self.inner.namespace)
            .field("store", &self.inner.store)
            .field("ttl", &self.inner.defaults.ttl)
            .field("jitter", &self.inner.defaults.jitter)
            .finish_non_exhaustive()
    }
}

/// Everything a cache knows, independent of its value type.
struct Inner {
    namespace: String,
    /// `<key_prefix><namespace>:v:` (`bw:` by default); the user key
    /// follows inside a hash tag.
    value_prefix: Vec<u8>,
    /// `<key_prefix><namespace>:t:`, without the version: tags'
    /// generation counters (see `tags`).
    tag_prefix: Vec<u8>,
    /// The store as the user gave it.
    raw_store: Arc<dyn Store>,
    /// The same store behind its circuit breaker; every call goes here.
    store: Arc<GuardedStore>,
    /// Breaker, bulkhead and retries for loads.
    origin: Origin,
    /// Per-call settings unless a call overrides them.
    defaults: Options,
    codec: Codec,
    compression: Compression,
    max_key_len: usize,
    /// The largest encoded entry written.
    max_value_size: usize,
    /// Whether spans carry the raw key.
    trace_keys: bool,
    /// The previous version's entries, read inside a version transition.
    previous: Option<Previous>,
    lease_ttl: Duration,
    /// As set; `None`: `queue_wait + load_timeout + 2 × lease_ttl` for each call.
    lock_wait: Option<Duration>,
    lock_poll: Duration,
    on_lock_timeout: LockPolicy,
    /// Jitter and early-refresh draws; seedable.
    rng: Mutex<StdRng>,
    /// Retries of store calls that are safe to repeat and may meet a
    /// passing failure: `invalidate`, and a warm-up's reads.
    store_retries: crate::retry::Retry,
    /// Lease tokens; always from the OS, never seeded, so unguessable.
    token_rng: Mutex<StdRng>,
    waiters: Waiters,
    metrics: Metrics,
    /// Repeated warnings, one line per kind per second (shared with the
    /// guarded store).
    logs: Arc<LogLimiter>,
    /// Keys whose load failed recently, with the store-clock ms until which
    /// their stale value is served without calling the loader (fail-safe).
    throttled: Throttle,
    /// What the cache was built with, defaults resolved.
    settings: Settings,
}

/// The previous version, during a version transition (see
/// [`CacheBuilder::version_transition`]).
#[derive(Debug)]
pub(crate) struct Previous {
    /// Its `value_prefix`.
    pub(crate) prefix: Vec<u8>,
    /// When the transition ends.
    pub(crate) until: Instant,
    /// Its change channel.
    pub(crate) channel: Vec<u8>,
}

impl Inner {
    /// Storage key `key`'s entry in the previous version, while the version
    /// transition lasts.
    fn previous_key(&self, key: &[u8]) -> Option<Vec<u8>> {
        let previous = self.previous.as_ref()?;
        if Instant::now() >= previous.until {
            return None;
        }
        let rest = key.get(self.value_prefix.len()..)?;
        let mut old = Vec::with_capacity(previous.prefix.len() + rest.len());
        old.extend_from_slice(&previous.prefix);
        old.extend_from_slice(rest);
        Some(old)
    }

    /// The lease key that goes with a storage key: the same bytes with the
    /// record marker `v` replaced by `l`, so both share one hash tag.
    fn lease_key(&self, key: &[u8]) -> Vec<u8> {
        lease_key(key, self.value_prefix.len())
    }

    /// The user's key inside storage key `key` (L1 is keyed by it).
    fn user_key<'k>(&self, key: &'k [u8]) -> &'k [u8] {
        user_key(key, self.value_prefix.len())
    }

    /// 128 random bits from the OS-seeded generator.
    fn new_token(&self) -> [u8; 16] {
        let mut rng = self.token_rng.lock().unwrap_or_else(|p| p.into_inner());
        rng.random()
    }

    fn notice<'a>(&'a self, message: &'a [u8]) -> Notice<'a> {
        Notice {
            channel: self.waiters.channel(),
            message,
        }
    }

    /// `true` if `key`'s load failed within the fail-safe throttle.
    fn is_throttled(&self, key: &[u8], now_ms: u64) -> bool {
        self.throttled.is_throttled(key, now_ms)
    }

    /// Records a failed load of `key`: its stale value is served without
    /// loading until `throttle` has passed.
    fn throttle(&self, key: &[u8], throttle: Duration) {
        let now = self.store.now_ms();
        let until = now.saturating_add(millis(throttle));
        self.throttled.insert(key, now, until);
    }

    /// A successful load lifts the throttle.
    fn clear_throttle(&self, key: &[u8]) {
        self.throttled.remove(key);
    }

    /// How long a call waits for another holder of the lease: long enough
    /// for the holder's whole load (its bulkhead `queue_wait` and this
    /// call's `load_timeout`) and, by default, one takeover after a dead
    /// holder's lease runs out. An explicit `lock_wait` is used as set,
    /// except that with `load_anyway` it never ends before a live holder's
    /// load could (a per-call `load_timeout` may be longer than the one it
    /// was checked against).
    fn lock_wait_for(&self, options: &Options) -> Duration {
        let load = options
            .load_timeout
            .saturating_add(self.origin.queue_wait());
        match self.lock_wait {
            None => default_lock_wait(load, self.lease_ttl),
            Some(wait) if self.on_lock_timeout == LockPolicy::load_anyway() => {
                wait.max(load.saturating_add(self.lease_ttl))
            }
            Some(wait) => wait,
        }
    }

    fn freshness(&self, options: &Options) -> FreshnessPolicy {
        FreshnessPolicy {
            early: options.early_refresh,
            ttl: options.ttl,
            max_stale: Some(options.max_stale()),
        }
    }

    /// The fresh time left at or below which the cache's default policy
    /// could refresh early, for an L1 entry whose load took `load_ms`.
    fn default_early_window(&self, load_ms: u32) -> Option<u64> {
        self.freshness(&self.defaults).early_window_ms(load_ms)
    }

    /// The verdict on a store read. The shared (seedable) generator is
    /// locked only when a draw could change the answer: a value far from
    /// its end is fresh without one, so a hit takes no process-wide lock.
    fn judge(&self, options: &Options, reading: Reading) -> Freshness {
        let policy = self.freshness(options);
        let fresh_until = reading.fresh_until.min(reading.stale_until);
        if reading.now_ms < fresh_until
            && !policy.could_refresh_early(fresh_until - reading.now_ms, reading.load_ms)
        {
            return Freshness::Fresh;
        }
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        policy.judge(reading, &mut *rng)
    }
}

impl<V: Value> Cache<V> {
    /// Starts a [`CacheBuilder`] with the documented defaults.
    pub fn builder() -> CacheBuilder<V> {
        CacheBuilder::new()
    }

    /// The cached value under `key`, or `None` if it is missing, expired,
    /// cached as "not found", or unreadable (corrupt bytes are logged and
    /// treated as missing).
    ///
    /// With the L1 near cache on, a fresh L1 copy answers without a store
    /// read, as for [`get_or_load`](Self::get_or_load); otherwise a hit costs
    /// exactly one store read (one `GET` in Redis), and a fresh value read
    /// is kept in L1.
    ///
    /// # Errors
    ///
    /// [`InvalidKey`](ErrorKind::InvalidKey) for an empty or over-long key,
    /// [`Store`](ErrorKind::Store) if the store fails.
    pub async fn get(&self, key: impl CacheKey) -> Result<Option<V>, Error> {
        let key = key.key_bytes();
        let near = self.near(&key, None);
        let op = match near {
            Ok(Near::Fresh(..)) => Op::GetNear,
            _ => Op::Get,
        };
        let span = self.span(op, &key);
        let got = self.get_bytes(&key, near).instrument(span.clone()).await;
        if !span.is_disabled() {
            match &got {
                Ok(value) => {
                    span.record("found", value.is_some());
                }
                Err(err) => record_failure(&span, err),
            }
        }
        got
    }

    /// [`get`](Self::get), in its span, after L1 answered `near`.
    async fn get_bytes(
        &self,
        key: &[u8],
        near: Result<Near<V>, Error>,
    ) -> Result<Option<V>, Error> {
        if let Near::Fresh(fetched, _) = near? {
            cooperate().await;
            return Ok(fetched.value);
        }
        let key = self.key_in_store(key)?;
        let ticket = self.local.ticket();
        let Some(entry) = self.read(&key).await? else {
            return Ok(None);
        };
        if entry.negative || !self.is_fresh(&entry) {
            return Ok(None);
        }
        let Some(value) = self.decode_value(&key, &entry) else {
            return Ok(None);
        };
        let value = Some(value);
        self.remember(
            &key,
            &value,
            &entry,
            self.inner.store.now_ms(),
            ticket,
            &self.inner.defaults,
        );
        Ok(value)
    }

    /// Stores `value` under `key` with the cache's jittered TTL.
    ///
    /// Like [`invalidate`](Self::invalidate), it revokes any load of `key`
    /// in flight (in one atomic store operation with the write), so an older
    /// load cannot overwrite it, and once it has returned no caller in this
    /// process gets a value loaded before it.
    ///
    /// # Errors
    ///
    /// [`InvalidKey`](ErrorKind::InvalidKey), [`Codec`](ErrorKind::Codec) if
    /// the value cannot be serialized, [`TooLarge`](ErrorKind::TooLarge) if
    /// its encoded entry is larger than `max_value_size` (nothing is
    /// written), [`Store`](ErrorKind::Store) if the write fails.
    pub async fn set(&self, key: impl CacheKey, value: &V) -> Result<(), Error> {
        self.set_with(&key.key_bytes(), value, None, &self.inner.defaults)
            .await
    }

    /// [`set`](Self::set) with a call's settings and tags (their current
    /// generations read first and recorded with the value), in its span.
    async fn set_with(
        &self,
        key: &[u8],
        value: &V,
        tags: Option<&tags::TagSet>,
        options: &Options,
    ) -> Result<(), Error> {
        let span = self.span(Op::Set, key);
        let done = async {
            let key = self.key_in_store(key)?;
            // Inside a version transition the previous version's entry is
            // revoked first: from then on (also if the caller goes away)
            // nothing that began before may answer here.
            let _local = self.local.invalidation([&key]);
            // The value's windows start now, not after the generations'
            // read (which may take a store deadline).
            let now = self.inner.store.now_ms();
            let mut stamps = match tags {
                Some(tags) => self.tag_generations(tags).await?,
                None => Vec::new(),
            };
            // Inside a version transition the previous version's entry is
            // revoked and this one written beside a fresh pin of it.
            if let Some(pinned) = self
                .revoke_previous(&key, tags::counter_ttl(options))
                .await?
            {
                stamps.insert(0, pinned.stamp());
            }
            let sealed =
                self.seal_tagged(&key, Some(value), Duration::ZERO, options, stamps, now)?;
            self.replace_batch(vec![(key.clone(), sealed)]).await
        }
        .instrument(span.clone())
        .await;
        record_error(&span, &done);
        done
    }

    /// [`set`](Self::set) for many keys, written in batches of 500 (on
    /// Redis, one pipeline, one round trip, per batch; each write atomic on
    /// its own). Each key gets its own jittered TTL. Inside a version
    /// transition each key first revokes and pins the previous version's
    /// entry, one key at a time (two round trips per key).
    ///
    /// # Errors
    ///
    /// As [`set`](Self::set); the first batch that fails stops the call
    /// (earlier batches are written; sending the same items again is safe).
    ///
    /// # Examples
    ///
    /// ```
    /// # use breakwater_cache::Cache;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), breakwater_cache::Error> {
    /// let cache = Cache::<u64>::builder().build()?;
    /// cache.set_many((0..1_000u64).map(|i| (format!("sku:{i}"), i))).await?;
    /// assert_eq!(cache.get("sku:7").await?, Some(7));
    /// # Ok(()) }
    /// ```
    pub async fn set_many<K, I>(&self, items: I) -> Result<(), Error>
    where
        K: CacheKey,
        I: IntoIterator<Item = (K, V)>,
    {
        let mut batch = Vec::with_capacity(SET_MANY_BATCH);
        let longest = tags::counter_ttl(&self.inner.defaults);
        for (key, value) in items {
            let key = self.key_in_store(&key.key_bytes())?;
            // Inside a version transition, as for `set` (one key at a time).
            let pinned = self.revoke_previous(&key, longest).await?;
            let stamps = pinned.iter().map(Pinned::stamp).collect();
            let (now, options) = (self.inner.store.now_ms(), &self.inner.defaults);
            let sealed =
                self.seal_tagged(&key, Some(&value), Duration::ZERO, options, stamps, now)?;
            batch.push((key, sealed));
            if batch.len() == SET_MANY_BATCH {
                self.replace_batch(std::mem::take(&mut batch)).await?;
            }
        }
        if batch.is_empty() {
            return Ok(());
        }
        self.replace_batch(batch).await
    }

    /// Writes sealed entries with [`Store::replace`] (one) or
    /// [`Store::replace_many`]: each revokes any load in flight for its key
    /// first, so an older result cannot land on top of it, then wakes
    /// waiters. Nothing that began before answers in this process
    /// afterwards; the values are not kept in L1 (another `set` may land
    /// after this one while its reply is on the way: the next read takes
    /// the store's value).
    async fn replace_batch(&self, batch: Vec<(Vec<u8>, Sealed)>) -> Result<(), Error> {
        let inner = &self.inner;
        let listening = inner.waiters.is_listening();
        let prepared: Vec<_> = batch
            .iter()
            .map(|(key, _)| {
                self.local.expect_own_notice(key, listening);
                let message = notify::message(notify::INVALIDATED, inner.waiters.sender(), key);
                (inner.lease_key(key), message)
            })
            .collect();
        let writes: Vec<Replace<'_>> = batch
            .iter()
            .zip(&prepared)
            .map(|((key, sealed), (lease_key, message))| Replace {
                key,
                value: &sealed.bytes,
                ttl: sealed.ttl,
                lease_key,
                notice: inner.notice(message),
            })
            .collect();
        // Even if the reply is lost (the write may have happened), or the
        // caller goes away before it comes, nothing that began before may
        // answer from now on.
        let keys = batch.iter().map(|(key, _)| key);
        let _local = self.local.invalidation(keys);
        let written = match writes.as_slice() {
            [w] => {
                inner
                    .store
                    .replace(w.key, w.value, w.ttl, w.lease_key, w.notice)
                    .await
            }
            writes => inner.store.replace_many(writes).await,
        };
        if written.is_err() {
            for (key, _) in &batch {
                self.local.own_notice_heard(key);
            }
        }
        written
    }

    /// Removes `key` and revokes any load in flight for it, so the next read
    /// loads fresh data and a slow load that started before cannot write its
    /// result back.
    ///
    /// A transient store failure is tried again (up to 10 attempts,
    /// jittered, all within 1 s: the delete and its notice are idempotent). If none
    /// gets through, the error says the invalidation was not delivered:
    /// other processes may serve the old value until its TTL ends, so the
    /// caller should retry it (or fail the write it belongs to).
    ///
    /// Once it has returned `Ok`, every call in this process that starts
    /// later gets a value loaded after it: loads and shared reads that began
    /// before are detached (their own callers still get their result), and
    /// none of them can put its value into L1 or the store. Other processes
    /// hear of it on the bus; see the coherence contract on [`Cache`].
    ///
    /// # Errors
    ///
    /// [`InvalidKey`](ErrorKind::InvalidKey), or [`Store`](ErrorKind::Store)
    /// if the delete fails.
    pub async fn invalidate(&self, key: impl CacheKey) -> Result<(), Error> {
        let key = key.key_bytes();
        let span = self.span(Op::Invalidate, &key);
        let done = self.invalidate_bytes(&key).instrument(span.clone()).await;
        record_error(&span, &done);
        done
    }

    /// [`invalidate`](Self::invalidate), in its span.
    async fn invalidate_bytes(&self, key: &[u8]) -> Result<(), Error> {
        let key = self.key_in_store(key)?;
        let lease = self.inner.lease_key(&key);
        let message = notify::message(notify::INVALIDATED, self.inner.waiters.sender(), &key);
        let listening = self.inner.waiters.is_listening();
        let (key, lease, message) = (&key, &lease, &message);
        // Inside a version transition the previous version's entry goes
        // too (first): it must not stand in for the invalidated value. Its
        // lease is revoked and its processes are told on their channel.
        let previous = self.inner.previous_key(key).and_then(|old| {
            let p = self.inner.previous.as_ref()?;
            let old_lease = lease_key(&old, p.prefix.len());
            let message = notify::message(notify::INVALIDATED, self.inner.waiters.sender(), &old);
            Some((old, old_lease, message, &p.channel))
        });
        let previous = &previous;
        // After the store has answered (a read that starts later sees the
        // deletion); also if it failed (the reply may be all that was
        // lost), or if the caller goes away first.
        let _local = self.local.invalidation([key]);
        self.deliver(key, || async move {
            if let Some((old, old_lease, message, channel)) = previous {
                let notice = Notice { channel, message };
                self.inner.store.invalidate(old, old_lease, notice).await?;
            }
            self.local.expect_own_notice(key, listening);
            let done = self
                .inner
                .store
                .invalidate(key, lease, self.inner.notice(message))
                .await;
            if done.is_err() {
                self.local.own_notice_heard(key);
            }
            done
        })
        .await
    }

    /// Runs `attempt`, an invalidation (idempotent: a delete or a bump, with
    /// its notice), with the store retries, all within
    /// `INVALIDATE_WITHIN`; if none gets through, the error says the
    /// invalidation of `key` was not delivered (with the attempts made and
    /// the last failure).
    async fn deliver<F, Fut>(&self, key: &[u8], attempt: F) -> Result<(), Error>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<(), Error>>,
    {
        let last = Mutex::new((0u32, None::<Error>, Instant::now()));
        let (last, attempt) = (&last, &attempt);
        let attempts = self.inner.store_retries.run(|made| async move {
            let done = attempt().await;
            if let Err(err) = &done {
                *last.lock().unwrap_or_else(|p| p.into_inner()) =
                    (made, Some(err.clone()), Instant::now());
            }
            done
        });
        match tokio::time::timeout(INVALIDATE_WITHIN, attempts).await {
            Ok((Ok(()), _)) => Ok(()),
            Ok((Err(err), made)) => Err(undelivered(key, made, err, Instant::now())),
            Err(_) => {
                let (made, err, at) = last.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let err = err.unwrap_or_else(|| {
                    Error::new(ErrorKind::Timeout, "no attempt finished in time")
                });
                Err(undelivered(key, made, err, at))
            }
        }
    }

    /// The cached value under `key`, or the loader's, which is then cached.
    ///
    /// The loader is a closure returning a future of `Ok(Some(value))`,
    /// `Ok(None)` for "does not exist" (cached as a negative entry for
    /// `negative_ttl`, so a missing row is not queried on every request), or
    /// an error, which is returned to the caller intact inside [`Error`]
    /// (see [`Error::loader_error`]) and not cached.
    ///
    /// # Writing a loader
    ///
    /// The load runs in its own task and may outlive this call (other
    /// callers share it), so the loader owns what it uses (`'static`):
    /// write `move`. It is `FnOnce() + Clone`: each call of the loader is a
    /// fresh clone, so an `async move` block may move the captures out, and
    /// a retry (the origin's [`RetryConfig`](crate::RetryConfig)) calls
    /// another clone. Every closure whose captures are `Clone` is: an
    /// `Arc`, a connection pool, a client, an owned id.
    ///
    /// ```
    /// use std::sync::Arc;
    /// # use breakwater_cache::Cache;
    /// # #[derive(Debug)] struct DbError;
    /// # impl std::fmt::Display for DbError { fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str("db") } }
    /// # impl std::error::Error for DbError {}
    /// # struct Db;
    /// # impl Db { async fn product(&self, id: u64) -> Result<String, DbError> { Ok(format!("p{id}")) } }
    ///
    /// /// With a declared return type, `?` needs no annotation.
    /// async fn load_product(db: Arc<Db>, id: u64) -> Result<Option<String>, DbError> {
    ///     let row = db.product(id).await?;
    ///     Ok(Some(row))
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), breakwater_cache::Error> {
    /// # let cache = Cache::<String>::builder().build()?;
    /// let db = Arc::new(Db);
    /// let id: u64 = 42;
    /// // Captures moved into the load.
    /// let a = cache.get_or_load(id, move || async move { db.product(id).await.map(Some) });
    /// # let db = Arc::new(Db);
    /// // An async closure.
    /// let b = cache.get_or_load(id, async move || db.product(id).await.map(Some));
    /// # let db = Arc::new(Db);
    /// // A named async fn.
    /// let c = cache.get_or_load(id, move || load_product(db.clone(), id));
    /// # assert_eq!(a.await?.as_deref(), Some("p42"));
    /// # b.await?; c.await?;
    /// # Ok(()) }
    /// ```
    ///
    /// What the compiler says, and what to write instead:
    ///
    /// - **E0373** "closure may outlive the current function, but it borrows
    ///   `db`": add `move`.
    /// - **E0521** "borrowed data escapes": a borrowed value (a `&str` id,
    ///   `&self`) is captured. Capture an owned one: `let slug =
    ///   slug.to_owned();`, `let db = self.db.clone();`. An integer id is
    ///   `Copy` and a key as it is ([`CacheKey`]).
    /// - **E0283** "type annotations needed" on a `?` in an `async` block: the
    ///   block's error type is open. End it with `Ok::<_, DbError>(Some(row))`,
    ///   or use a named `async fn` as above.
    /// - **E0277** "`X: Clone` is not satisfied in `{closure}`": a capture is
    ///   not `Clone`; put it in an `Arc`. A loader returned from a helper
    ///   as `impl Fn() -> Fut` needs `+ Clone` in that signature.
    ///
    /// # One load per key
    ///
    /// Concurrent calls for one key share one load in this process, and the
    /// store's lease lets one process in the fleet load while the others wait
    /// to be woken. The load runs in its own task: a caller that gives up
    /// cancels nothing for the others, and a panicking loader reaches every
    /// waiter as a [`Loader`](ErrorKind::Loader) error.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// # use breakwater_cache::Cache;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), breakwater_cache::Error> {
    /// let cache = Cache::<u64>::builder().build()?;
    /// let calls = Arc::new(AtomicUsize::new(0));
    /// let requests = (0..100).map(|_| {
    ///     let calls = Arc::clone(&calls);
    ///     cache.get_or_load("hot", move || {
    ///         calls.fetch_add(1, Ordering::SeqCst);
    ///         async {
    ///             tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    ///             Ok::<_, std::io::Error>(Some(7))
    ///         }
    ///     })
    /// });
    /// for result in futures_util::future::join_all(requests).await {
    ///     assert_eq!(result?, Some(7));
    /// }
    /// assert_eq!(calls.load(Ordering::SeqCst), 1);
    /// # Ok(()) }
    /// ```
    ///
    /// If the store fails or holds unreadable bytes, the value is loaded
    /// directly: a sick cache degrades to the loader, never to wrong data.
    ///
    /// # Errors
    ///
    /// [`InvalidKey`](ErrorKind::InvalidKey) for an empty or over-long key,
    /// [`Loader`](ErrorKind::Loader) if the loader failed or panicked,
    /// [`Timeout`](ErrorKind::Timeout) past `load_timeout`,
    /// [`LockTimeout`](ErrorKind::LockTimeout) when another process held the
    /// lease past `lock_wait` and the policy says so,
    /// [`Codec`](ErrorKind::Codec) if the loaded value cannot be serialized.
    pub async fn get_or_load<F, Fut, E>(
        &self,
        key: impl CacheKey,
        loader: F,
    ) -> Result<Option<V>, Error>
    where
        F: FnOnce() -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<Option<V>, E>> + Send + 'static,
        E: Into<Box<dyn StdError + Send + Sync + 'static>> + 'static,
    {
        let fetched = self
            .fetch(&key.key_bytes(), loader, &self.inner.defaults)
            .await?;
        Ok(fetched.value)
    }

    /// [`get_or_load`](Self::get_or_load), also saying how the value was
    /// served ([`Served`]).
    ///
    /// # Errors
    ///
    /// As [`get_or_load`](Self::get_or_load).
    ///
    /// # Examples
    ///
    /// ```
    /// use breakwater_cache::{Cache, Served};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), breakwater_cache::Error> {
    /// let cache = Cache::<u64>::builder().build()?;
    /// let load = || async { Ok::<_, std::io::Error>(Some(1)) };
    /// assert_eq!(cache.get_or_load_with_meta("k", load).await?.served, Served::Loaded);
    /// assert_eq!(cache.get_or_load_with_meta("k", load).await?.served, Served::Hit);
    /// # Ok(()) }
    /// ```
    pub async fn get_or_load_with_meta<F, Fut, E>(
        &self,
        key: impl CacheKey,
        loader: F,
    ) -> Result<Fetched<V>, Error>
    where
        F: FnOnce() -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<Option<V>, E>> + Send + 'static,
        E: Into<Box<dyn StdError + Send + Sync + 'static>> + 'static,
    {
        self.fetch(&key.key_bytes(), loader, &self.inner.defaults)
            .await
    }

    /// One call with its own settings (TTL, jitter, grace, timeouts...).
    pub fn entry(&self, key: impl CacheKey) -> CacheEntry<'_, V> {
        CacheEntry::new(self, &key.key_bytes(), self.inner.defaults)
    }

    /// The pipeline, counted in `breakwater_requests_total`.
    ///
    /// A fresh L1 copy is served here; everything else goes through
    /// [`pipeline`](Self::pipeline), whose load step is boxed: that part
    /// of the future is large, and inline it would be built, moved and
    /// stored (by every task that awaits a `get_or_load`) on the hit path
    /// too.
    ///
    /// The call's span is made here (nothing is, without a subscriber), and
    /// entered only around the pipeline (see `pipeline_in`): an L1 hit
    /// neither builds nor wraps anything.
    async fn fetch<L>(&self, key: &[u8], loader: L, options: &Options) -> Result<Fetched<V>, Error>
    where
        L: Load<V>,
    {
        let near = self.near(key, Some(options));
        let near_hit = matches!(near, Ok(Near::Fresh(..)));
        if near_hit {
            // A fresh L1 copy waited on nothing: it takes the cooperative
            // budget (see `near`), before it is counted (a call dropped
            // while it yields was not served).
            cooperate().await;
            // Nothing to refresh and no subscriber: served here, counted,
            // and nothing else (no span to make or record).
            if !tracing::dispatcher::has_been_set()
                && let Ok(Near::Fresh(fetched, None)) = near
            {
                let result = Ok(fetched);
                self.count_served(&result);
                return result;
            }
        }
        // A plain L1 hit's span is at `debug`: with an exporter at `info`,
        // hits do not each become an exported span.
        let op = match near {
            Ok(Near::Fresh(_, None)) => Op::GetOrLoadNear,
            _ => Op::GetOrLoad,
        };
        let span = self.span(op, key);
        let result = match near {
            Ok(Near::Fresh(fetched, None)) => Ok(fetched),
            // Early refresh, judged on the L1 copy as on a store read.
            Ok(Near::Fresh(fetched, Some(replacing))) => self.key_in_store(key).map(|storage| {
                if !self.inner.is_throttled(&storage, self.inner.store.now_ms()) {
                    let _in = span.enter();
                    self.refresh_in_background(storage, loader, *options, replacing, true);
                }
                fetched
            }),
            Ok(Near::Stale(slot)) => {
                self.pipeline_in(&span, key, loader, options, Some(slot))
                    .await
            }
            Ok(Near::Miss) => self.pipeline_in(&span, key, loader, options, None).await,
            Err(err) => Err(err),
        };
        self.count_served(&result);
        if !span.is_disabled() {
            match &result {
                Ok(fetched) => {
                    span.record("served", fetched.served.as_str());
                }
                Err(err) => record_failure(&span, err),
            }
        }
        result
    }

    /// [`pipeline`](Self::pipeline) in the call's `span` (the parent of
    /// its child spans) when a subscriber listens; unwrapped otherwise, in
    /// place in the caller's future.
    async fn pipeline_in<L>(
        &self,
        span: &Span,
        user_key: &[u8],
        loader: L,
        options: &Options,
        local_stale: Option<Arc<Slot<V>>>,
    ) -> Result<Fetched<V>, Error>
    where
        L: Load<V>,
    {
        if span.is_disabled() {
            self.pipeline(user_key, loader, options, local_stale).await
        } else {
            Box::pin(self.pipeline(user_key, loader, options, local_stale))
                .instrument(span.clone())
                .await
        }
    }

    /// Counts how a request was served (the `served` metric) and the kind
    /// of its error.
    fn count_served(&self, result: &Result<Fetched<V>, Error>) {
        let index = match result {
            Ok(fetched) => fetched.served.metric_index(),
            Err(err) => {
                self.inner.metrics.error(err.kind());
                crate::served::SERVED_ERROR
            }
        };
        self.inner.metrics.served(index);
    }

    /// Steps 1 and 2: the key checked, and L1 asked (keyed by the user's
    /// key, so a hit builds nothing). With `options`, a fresh copy is also
    /// judged for early refresh, on the store's clock, as a store read is.
    ///
    /// A fresh copy completes without waiting on anything: the caller must
    /// then take tokio's cooperative budget ([`cooperate`]), or a loop of
    /// hits would never let the runtime run its timers and other tasks.
    fn near(&self, user_key: &[u8], options: Option<&Options>) -> Result<Near<V>, Error> {
        self.check_key(user_key)?;
        let Some(l1) = &self.local.l1 else {
            return Ok(Near::Miss);
        };
        // Other processes' writes must reach L1: keep the bus listening.
        self.inner.waiters.ensure_listening(&*self.inner.store);
        let Some(slot) = l1.get(user_key) else {
            return Ok(Near::Miss);
        };
        let now = Instant::now();
        // A listener that missed its heartbeat (its runtime idle) hears
        // nothing: L1 is unverified and a listener starts here.
        if self.inner.waiters.is_stranded(now) {
            self.inner.waiters.stranded(&*self.inner.store);
        }
        if l1.is_fresh(&slot, now) {
            let served = match slot.value {
                Some(_) => Served::L1Hit,
                None => Served::Negative,
            };
            let refresh = options.and_then(|options| self.refresh_due(&slot, options, now));
            let fetched = Fetched {
                value: slot.value.clone(),
                served,
            };
            return Ok(Near::Fresh(fetched, refresh));
        }
        Ok(if slot.is_servable(now) {
            Near::Stale(slot)
        } else {
            Near::Miss
        })
    }

    /// Whether a fresh L1 copy is due for an early refresh: `Some` with the
    /// `fresh_until` it would replace. Cheap unless the copy is close to its
    /// end: the random draw is only made where it could trigger.
    #[inline]
    fn refresh_due(&self, slot: &Slot<V>, options: &Options, now: Instant) -> Option<u64> {
        // Under the default policy, a copy far from its end is quiet: one
        // comparison (the policy's bound was worked out when it was kept).
        if std::ptr::eq(options, &self.inner.defaults) {
            match slot.quiet_until {
                None => return None,
                Some(quiet_until) if now < quiet_until => return None,
                Some(_) => {}
            }
        }
        self.refresh_due_slow(slot, options, now)
    }

    /// [`refresh_due`](Self::refresh_due) near the end, or with per-call
    /// settings.
    fn refresh_due_slow(&self, slot: &Slot<V>, options: &Options, now: Instant) -> Option<u64> {
        let policy = self.inner.freshness(options);
        let stamp = slot.stored;
        let remaining = millis(slot.refresh_by.saturating_duration_since(now));
        if remaining == 0 || !policy.could_refresh_early(remaining, stamp.load_ms) {
            return None;
        }
        let reading = Reading {
            now_ms: self.inner.store.now_ms(),
            fresh_until: stamp.fresh_until,
            stale_until: stamp.stale_until,
            load_ms: stamp.load_ms,
        };
        let verdict = self.inner.judge(options, reading);
        (verdict == Freshness::RefreshEarly).then_some(stamp.fresh_until)
    }

    /// The pipeline past L1; see the module docs for the order.
    /// `local_stale`: an L1 copy past its fresh time that may stand in
    /// while the store is unreachable, or for a failed load (fail-safe).
    ///
    /// A load whose fenced write was refused (see [`Loaded`]) answers only the callers that started before its lease
    /// was asked for; a later caller goes through the pipeline again
    /// (reading what the store has now, or joining a newer load). A load it
    /// joins then began after it started (the one it joined first was in
    /// the air when it joined, and a later one starts only once that one has
    /// landed or was detached), except that a shared read still in the air
    /// may hand it the same revoked outcome once more; a third pass then
    /// joins only reads and loads that began after it started. So three
    /// passes are the most a call takes ([`MAX_PASSES`]; were the last one
    /// ever to find a revoked load, the call would fail rather than get the
    /// value).
    async fn pipeline<L>(
        &self,
        user_key: &[u8],
        loader: L,
        options: &Options,
        local_stale: Option<Arc<Slot<V>>>,
    ) -> Result<Fetched<V>, Error>
    where
        L: Load<V>,
    {
        let key = self.key_in_store(user_key)?;
        let started = Instant::now();
        let mut passes = 1;
        loop {
            let last = passes == MAX_PASSES;
            let pass = self.pass(
                user_key,
                &key,
                &loader,
                options,
                local_stale.as_ref(),
                started,
                last,
            );
            match pass.await {
                Some(result) => return result,
                None => {
                    tracing::debug!(key = %show_key(&key), "the load this call joined was revoked before it started; reading again");
                    passes += 1;
                }
            }
        }
    }

    /// One pass of [`pipeline`](Self::pipeline) for a call that started at
    /// `started`: `None` if it found only a revoked load that began before
    /// it (unless `last`: then that load's outcome is an error).
    #[allow(clippy::too_many_arguments)]
    async fn pass<L>(
        &self,
        user_key: &[u8],
        key: &[u8],
        loader: &L,
        options: &Options,
        local_stale: Option<&Arc<Slot<V>>>,
        started: Instant,
        last: bool,
    ) -> Option<Result<Fetched<V>, Error>>
    where
        L: Load<V>,
    {
        // 3. Read the store (shared with concurrent reads of the key). A
        // miss goes on to the load in the read itself, unless an L1 copy
        // would stand in for a load the fail-safe throttle holds back.
        let load_on_miss =
            local_stale.is_none() || !self.inner.is_throttled(key, self.inner.store.now_ms());
        let read = self.read_shared(user_key, key, loader, options, load_on_miss);
        let read = match read.await {
            // The read found nothing and waited for the key's load: only
            // the L1 copy can stand in.
            Shared::Loaded(result, role) => {
                let result = revoked_before(result, started, last)?;
                let settled = self.settle(user_key, key, result, role, None, local_stale, options);
                return Some(settled);
            }
            Shared::Read(read) => read,
        };
        let (entry, mode, ticket) = match read {
            Ok(Read {
                entry: Some(old),
                previous: true,
                ..
            }) => {
                // The previous version's value stands in while one
                // background load fills this version; undecodable, it is a
                // miss.
                if let Some(value) = self.previous_value(key, &old) {
                    if !self.inner.is_throttled(key, self.inner.store.now_ms()) {
                        let key = key.to_vec();
                        self.refresh_in_background(key, loader.clone(), *options, 0, false);
                    }
                    return Some(Ok(Fetched {
                        value,
                        served: Served::Stale {
                            reason: StaleReason::PreviousVersion,
                        },
                    }));
                }
                (None, Mode::Fleet, None)
            }
            Ok(read) => (read.entry, Mode::Fleet, read.ticket),
            Err(err) => {
                self.inner.metrics.store_failed("get", &err);
                // A local stale copy stands in: no load at all.
                if let Some(slot) = local_stale {
                    warn_limited!(self.inner.logs, Warning::StoreRead, key = %show_key(key), error = %err, "store read failed; serving the stale L1 copy");
                    return Some(Ok(Fetched {
                        value: slot.value.clone(),
                        served: Served::Stale {
                            reason: StaleReason::StoreUnavailable,
                        },
                    }));
                }
                // Only a store that cannot be used is passed by: a slow
                // one still holds the fleet's lease (see `Mode::after`).
                let mode = Mode::after(&err);
                match mode {
                    Mode::Local => {
                        warn_limited!(self.inner.logs, Warning::StoreRead, key = %show_key(key), error = %err, "store read failed and the store cannot be used (breaker open or no connection); loading directly, without writing");
                    }
                    Mode::Fleet => {
                        warn_limited!(self.inner.logs, Warning::StoreRead, key = %show_key(key), error = %err, "store read failed; loading through the lease (the store answers, slowly)");
                    }
                }
                (None, mode, None)
            }
        };

        // 4. Freshness, on the store's clock.
        let mut fallback: Option<Arc<Entry>> = None;
        if let Some(entry) = entry {
            let now = self.inner.store.now_ms();
            match self.judge_entry(key, &entry, now, options) {
                Judged::Served(fetched, refresh) => {
                    self.remember(key, &fetched.value, &entry, now, ticket, options);
                    if let Some(Refresh { replacing, early }) = refresh {
                        let (key, loader) = (key.to_vec(), loader.clone());
                        self.refresh_in_background(key, loader, *options, replacing, early);
                    }
                    return Some(Ok(fetched));
                }
                Judged::Load { stale } => fallback = stale.then_some(entry),
            }
        }

        // Fail-safe on L1 alone: the store has no stand-in (it lost the
        // entry: an eviction, an empty restart, a failover), but L1 does,
        // and the key's loads failed within the throttle: served as a store
        // stale value would be, without calling the loader.
        if fallback.is_none()
            && let Some(slot) = local_stale
            && self.inner.is_throttled(key, self.inner.store.now_ms())
            && let Some(value) = self.local_stand_in(slot, options)
        {
            return Some(Ok(Fetched {
                value,
                served: Served::Stale {
                    reason: StaleReason::LoaderFailed,
                },
            }));
        }

        // 5. Boxed: the load's part of the future is the large one, and
        // a hit (which returned above) would otherwise build and carry it.
        let load = self.load(key.to_vec(), loader.clone(), options, fallback, mode);
        let (result, role, stale) = match Box::pin(load).await {
            Ok(done) => done,
            Err(served) => return Some(served),
        };
        let result = revoked_before(result, started, last)?;
        Some(self.settle(user_key, key, result, role, stale, local_stale, options))
    }

    /// Step 4 for an entry read from the store at `now` (store clock): a
    /// fresh value is served, with an early refresh if one is due; a stale
    /// one within grace is served while a refresh runs, or, while the key's
    /// loads are throttled after a failure, without one; past grace it is
    /// the fail-safe stand-in of the load that follows. (A value served
    /// from the store is then kept in L1 by the caller.)
    #[inline]
    fn judge_entry(&self, key: &[u8], entry: &Entry, now: u64, options: &Options) -> Judged<V> {
        let verdict = self.inner.judge(options, reading(entry, now));
        match verdict {
            Freshness::Fresh | Freshness::RefreshEarly => {
                let Some(value) = self.entry_value(key, entry) else {
                    return Judged::Load { stale: false };
                };
                let refresh = (verdict == Freshness::RefreshEarly
                    && !self.inner.is_throttled(key, now))
                .then_some(Refresh {
                    replacing: entry.fresh_until,
                    early: true,
                });
                let served = if entry.negative {
                    Served::Negative
                } else {
                    Served::Hit
                };
                Judged::Served(Fetched { value, served }, refresh)
            }
            Freshness::Stale => {
                let in_grace = in_grace(entry, now, options);
                let throttled = self.inner.is_throttled(key, now);
                if (in_grace || throttled)
                    && let Some(value) = self.entry_value(key, entry)
                {
                    let (reason, refresh) = if throttled {
                        (StaleReason::LoaderFailed, None)
                    } else {
                        let refresh = Refresh {
                            replacing: entry.fresh_until,
                            early: false,
                        };
                        (StaleReason::Refreshing, Some(refresh))
                    };
                    let served = Served::Stale { reason };
                    return Judged::Served(Fetched { value, served }, refresh);
                }
                // Past grace, inside max_stale: load, and fall back to it.
                Judged::Load { stale: true }
            }
            Freshness::Expired => Judged::Load { stale: false },
        }
    }

    /// Step 5 of the pipeline, past a store read that served nothing: one
    /// flight per key in this process; the flight takes the lease, loads
    /// and writes (see `fill`), or, in [`Mode::Local`] (the store cannot
    /// be used), loads directly. A soft timeout gives up waiting (not
    /// loading) when there is a stale value (`fallback`) to serve: that is
    /// `Err` (served at once); else the flight's outcome, this call's role
    /// in it and the stale stand-in, to settle.
    #[allow(clippy::type_complexity)]
    async fn load<L>(
        &self,
        key: Vec<u8>,
        loader: L,
        options: &Options,
        fallback: Option<Arc<Entry>>,
        mode: Mode,
    ) -> Result<(Result<Loaded<V>, Error>, Role, Option<Arc<Entry>>), Result<Fetched<V>, Error>>
    where
        L: Load<V>,
    {
        let (result, role) = {
            let (load, role) =
                self.join_fill(&key, loader, *options, None, Priority::Foreground, mode);
            let metrics = &self.inner.metrics;
            let key = &key;
            let flight = async move {
                let _waiting = (role == Role::Follower).then(|| metrics.waiting());
                (self.await_load(key, load, options).await, role)
            };
            match (options.soft_timeout, &fallback) {
                (Some(soft), Some(stale)) => match tokio::time::timeout(soft, flight).await {
                    Ok(done) => done,
                    Err(_) => {
                        if let Some(value) = self.entry_value(key, stale) {
                            let served = Served::Stale {
                                reason: StaleReason::SoftTimeout,
                            };
                            return Err(Ok(Fetched { value, served }));
                        }
                        return Err(Err(Error::new(
                            ErrorKind::Timeout,
                            "soft timeout with an unreadable stale value",
                        )));
                    }
                },
                _ => flight.await,
            }
        };

        Ok((result, role, fallback))
    }

    /// Step 6, a flight's outcome for one caller of user key `user_key`
    /// (storage key `key`). On failure: the stale entry if one may stand in
    /// (fail-safe), else this process's L1 copy (`local`) if it may (the
    /// store lost the entry, L1 did not), else the fallback, else the
    /// error.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn settle(
        &self,
        user_key: &[u8],
        key: &[u8],
        result: Result<Loaded<V>, Error>,
        role: Role,
        stale: Option<Arc<Entry>>,
        local: Option<&Arc<Slot<V>>>,
        options: &Options,
    ) -> Result<Fetched<V>, Error> {
        match result {
            Ok((value, served, _)) => {
                let served = if role == Role::Follower && served == Served::Loaded {
                    Served::Coalesced
                } else {
                    served
                };
                Ok(Fetched { value, served })
            }
            Err(err) => {
                let reason = match err.kind() {
                    ErrorKind::Loader | ErrorKind::Timeout | ErrorKind::Store => {
                        Some(StaleReason::LoaderFailed)
                    }
                    ErrorKind::CircuitOpen => Some(StaleReason::BreakerOpen),
                    ErrorKind::Overloaded => Some(StaleReason::Overloaded),
                    // A lock timeout was already decided by `OnLockTimeout`.
                    _ => None,
                };
                let Some(reason) = reason else {
                    return Err(err);
                };
                // The stored stale value, else the L1 copy.
                let stand_in = stale
                    .and_then(|entry| self.entry_value(key, &entry))
                    .map(|value| (value, "the stale value"))
                    .or_else(|| {
                        let value = self.local_stand_in(local?, options)?;
                        Some((value, "the stale L1 copy (the store has none)"))
                    });
                if let Some((value, what)) = stand_in {
                    warn_limited!(self.inner.logs, Warning::LoadFailed, key = %show_key(key), error = %err, "load failed; serving {what}");
                    if reason == StaleReason::LoaderFailed {
                        self.inner.throttle(key, options.fail_safe_throttle);
                    }
                    let served = Served::Stale { reason };
                    return Ok(Fetched { value, served });
                }
                if let Some(fallback) = &self.fallback {
                    warn_limited!(self.inner.logs, Warning::LoadFailed, key = %show_key(user_key), error = %err, "load failed; serving the fallback");
                    return Ok(Fetched {
                        value: fallback(user_key),
                        served: Served::Fallback,
                    });
                }
                Err(err)
            }
        }
    }

    /// The value of L1 copy `slot` if it may stand in for a failed load:
    /// still within its stale window and this call's `max_stale`, judged
    /// on the store's clock as a stored entry is.
    fn local_stand_in(&self, slot: &Slot<V>, options: &Options) -> Option<Option<V>> {
        let reading = Reading {
            now_ms: self.inner.store.now_ms(),
            fresh_until: slot.stored.fresh_until,
            stale_until: slot.stored.stale_until,
            load_ms: slot.stored.load_ms,
        };
        let servable = slot.is_servable(Instant::now())
            && self.inner.freshness(options).servable_stale(reading);
        servable.then(|| slot.value.clone())
    }

    /// Starts one refresh of `key` in the background, unless one is already
    /// in the air. Background flights are kept apart from foreground ones: a
    /// foreground caller never inherits a background refresh's refusals (it
    /// never loads without the lease); it takes its own turn at the lease,
    /// and is woken by the refresh's fill.
    /// `replacing` is the `fresh_until` of the entry being refreshed;
    /// `early` if it is still fresh (an early refresh, counted).
    fn refresh_in_background<L: Load<V>>(
        &self,
        key: Vec<u8>,
        loader: L,
        options: Options,
        replacing: u64,
        early: bool,
    ) {
        let (load, role) = self.join_fill(
            &key,
            loader,
            options,
            Some(replacing),
            Priority::Background,
            Mode::Fleet,
        );
        if role == Role::Follower {
            return;
        }
        if early {
            self.inner.metrics.early_refresh();
        }
        let cache = self.clone();
        tokio::spawn(async move {
            let result = load.result().await;
            cache.refreshed(&key, &result, &options);
        });
    }

    /// A background refresh of `key` ended: shed, it is nothing; failed, the
    /// key is throttled (fail-safe).
    fn refreshed(&self, key: &[u8], result: &Result<Loaded<V>, Error>, options: &Options) {
        match result {
            Err(err) if err.is_overloaded() || err.is_circuit_open() => {
                tracing::debug!(key = %show_key(key), error = %err, "background refresh shed");
            }
            Err(err) => {
                warn_limited!(self.inner.logs, Warning::RefreshFailed, key = %show_key(key), error = %err, "background refresh failed; throttling the key");
                self.inner.throttle(key, options.fail_safe_throttle);
            }
            Ok(_) => {}
        }
    }

    /// Joins the load flight for storage key `key`, starting one that runs
    /// [`fill`](Self::fill) with these settings if none is in the air. The
    /// loader is put in an `Arc` only if the flight starts, so a caller that
    /// joins one already in the air allocates nothing.
    fn join_fill<L: Load<V>>(
        &self,
        key: &[u8],
        loader: L,
        options: Options,
        replacing: Option<u64>,
        priority: Priority,
        mode: Mode,
    ) -> (Joined<Loaded<V>>, Role) {
        let flights = match priority {
            Priority::Foreground => &self.local.flights,
            Priority::Background => &self.local.background,
        };
        let (joined, role) = flights.join(key, || {
            // A child of the caller's span, though it runs in its own task.
            let span = tracing::info_span!(
                "breakwater.fill",
                background = priority == Priority::Background,
                lease = Empty,
                written = Empty,
            );
            self.clone()
                .fill(
                    key.to_vec(),
                    Arc::new(loader),
                    options,
                    replacing,
                    priority,
                    mode,
                )
                .instrument(span)
        });
        if priority == Priority::Foreground {
            Span::current().record("role", role.as_str());
        }
        (joined, role)
    }

    /// The span of one public call on `key` (see `# Tracing` on
    /// [`Cache`]); fields are filled only when a subscriber listens.
    fn span(&self, op: Op, key: &[u8]) -> Span {
        // Two instructions when no subscriber was ever set, in place of
        // the span macro's callsite checks.
        if !tracing::dispatcher::has_been_set() {
            return Span::none();
        }
        let ns = &self.inner.namespace;
        // A call's span: its level and name, the fields every call has,
        // and its own (the level must be a constant of the callsite).
        macro_rules! call_span {
            ($level:expr, $name:literal $(, $field:ident)*) => {
                tracing::span!(
                    $level,
                    $name,
                    namespace = %ns,
                    key.hash = Empty,
                    key = Empty,
                    $($field = Empty,)*
                    error = Empty,
                    otel.status_code = Empty,
                )
            };
        }
        use tracing::Level;
        let span = match op {
            Op::GetOrLoad => call_span!(Level::INFO, "breakwater.get_or_load", served, role),
            Op::GetOrLoadNear => call_span!(Level::DEBUG, "breakwater.get_or_load", served, role),
            Op::Get => call_span!(Level::INFO, "breakwater.get", found),
            Op::GetNear => call_span!(Level::DEBUG, "breakwater.get", found),
            Op::Set => call_span!(Level::INFO, "breakwater.set"),
            Op::Invalidate => call_span!(Level::INFO, "breakwater.invalidate"),
            Op::InvalidateTag => call_span!(Level::INFO, "breakwater.invalidate_tag"),
        };
        if !span.is_disabled() {
            span.record(
                "key.hash",
                tracing::field::display(format_args!("{:016x}", crate::store::fnv1a(key))),
            );
            if self.inner.trace_keys {
                span.record("key", show_key(key));
            }
        }
        span
    }

    /// The exact key the entry for `key` is stored under:
    /// `bw:<namespace>:v:{<key>}`, or `bw:<namespace>:v:{#<hash>}<key>` when
    /// the key itself contains a brace (`bw:` is the default
    /// [`key_prefix`](CacheBuilder::key_prefix)). The braces are a Redis Cluster hash
    /// tag, so every record of one key shares one slot.
    ///
    /// # Errors
    ///
    /// [`InvalidKey`](ErrorKind::InvalidKey) for an empty key or one longer
    /// than `max_key_len`.
    pub fn storage_key(&self, key: impl CacheKey) -> Result<Vec<u8>, Error> {
        self.key_in_store(&key.key_bytes())
    }

    /// [`storage_key`](Self::storage_key) of a key's bytes.
    fn key_in_store(&self, key: &[u8]) -> Result<Vec<u8>, Error> {
        self.check_key(key)?;
        Ok(hash_tagged(&self.inner.value_prefix, key))
    }

    /// An empty or over-long key is refused before it reaches L1 or the
    /// store.
    fn check_key(&self, key: &[u8]) -> Result<(), Error> {
        if key.is_empty() {
            return Err(Error::new(ErrorKind::InvalidKey, "key must not be empty"));
        }
        if key.len() > self.inner.max_key_len {
            return Err(Error::new(
                ErrorKind::InvalidKey,
                format!(
                    "key is {} bytes, the limit is {} (see CacheBuilder::max_key_len)",
                    key.len(),
                    self.inner.max_key_len
                ),
            ));
        }
        Ok(())
    }

    /// The namespace this cache was built with.
    pub fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    /// The settings this cache runs with, every default resolved; print
    /// them with `{:#?}` (see [`Settings`]).
    pub fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// The state of the store's circuit breaker. On a Redis Cluster there
    /// is one breaker per 256 hash slots; this is the worst of them (open if
    /// any is open).
    pub fn store_breaker_state(&self) -> BreakerState {
        self.inner.store.state()
    }

    /// A snapshot of this cache's counts since it was built (hits by
    /// tier, stale served by reason, loads, coalesced calls, errors by
    /// kind) and of its breakers now: what the [`metrics`](crate::metrics)
    /// report, for applications without a metrics stack. Cheap: it reads a
    /// few atomics (and each breaker's state).
    ///
    /// # Examples
    ///
    /// ```
    /// use breakwater_cache::Cache;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), breakwater_cache::Error> {
    /// let cache = Cache::<u64>::builder().build()?;
    /// cache.get_or_load("k", || async { Ok::<_, std::io::Error>(Some(1)) }).await?;
    /// let stats = cache.stats();
    /// assert_eq!(stats.loads.value, 1);
    /// assert_eq!(stats.errors_total(), 0);
    /// # Ok(()) }
    /// ```
    pub fn stats(&self) -> Stats {
        let origin = &self.inner.origin;
        self.inner.metrics.stats(
            (origin.breaker_state(), origin.breaker_openings()),
            self.inner.store.state(),
            origin.loads_in_flight(),
            self.local.l1.as_ref().map_or(0, |l1| l1.entries()),
        )
    }

    /// The store behind this cache.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.raw_store
    }

    /// Step 3: reads the store, shared with the reads of the key already in
    /// the air. With none in the air, the read runs inline in the caller's
    /// task (no task, no shared loader: an uncontended hit is one `GET` and
    /// its decoding); later readers of the key join it. Finding nothing,
    /// the read joins (or starts) the key's load, and its followers wait
    /// on that load too (unless `load_on_miss` is false: then the miss is
    /// the outcome, and each caller goes on to the load step itself): the
    /// leader hands them the load's flight as soon as it has joined it,
    /// so they wait on the flight's own task, not on the leader.
    ///
    /// A follower waits for the leader's read no longer than one store
    /// read deadline ([`Store::read_deadline`]): a leader whose caller
    /// stopped polling it (a `select!` busy elsewhere, a slowly consumed
    /// stream) delays nobody else by more than that; the follower then
    /// reads alone. A leader that goes away (its caller cancelled) hands
    /// nothing down: its followers read again, one of them leading, and a
    /// load already started goes on in its own task.
    async fn read_shared<L: Load<V>>(
        &self,
        user_key: &[u8],
        key: &[u8],
        loader: &L,
        options: &Options,
        load_on_miss: bool,
    ) -> Shared<V> {
        loop {
            let joined = match self.local.reads.lead_or_join(user_key) {
                Turn::Lead(lead) => {
                    return self
                        .read_led(Some(lead), key, loader, options, load_on_miss)
                        .await;
                }
                Turn::Follow(joined) => joined,
            };
            let _waiting = self.inner.metrics.waiting();
            let within = || self.inner.store.read_deadline();
            // One task keeps every shared read's deadline, not a timer
            // per follower; a follower from another runtime than that
            // task's has its own (boxed: it would grow every read's
            // future, hits included).
            let outcome = if self.local.reads.bound(&joined, within) {
                joined.outcome_or_late().await.map_err(drop)
            } else {
                Box::pin(tokio::time::timeout(within(), joined.outcome()))
                    .await
                    .map_err(drop)
            };
            match outcome {
                // A load that landed before this caller came to it may be
                // one it saw revoked on an earlier pass (the read stays in
                // the air until its leader is polled again): read alone.
                Ok(Some(Ok(Read {
                    loading: Some(load),
                    ..
                }))) if !load.has_landed() => {
                    let result = Box::pin(self.await_load(key, load, options)).await;
                    return Shared::Loaded(result, Role::Follower);
                }
                Ok(Some(Ok(Read {
                    loading: Some(_), ..
                }))) => {
                    drop(_waiting);
                    // Later callers lead a new shared read.
                    self.local.reads.detach(user_key);
                    return Box::pin(self.read_led(None, key, loader, options, load_on_miss)).await;
                }
                Ok(Some(read)) => return Shared::Read(read),
                // The leader went away: read again.
                Ok(None) => {}
                // The leader's read is late (its caller may have stopped
                // polling it): this caller reads alone.
                Err(_) => {
                    tracing::debug!(key = %show_key(key), "a shared read is late; reading alone");
                    drop(_waiting);
                    // Later callers lead a new shared read.
                    self.local.reads.detach(user_key);
                    return Box::pin(self.read_led(None, key, loader, options, load_on_miss)).await;
                }
            }
        }
    }

    /// The read of [`read_shared`](Self::read_shared), led by this caller
    /// (`lead`: the read its followers share; `None`: read alone, for a
    /// follower whose leader is late).
    async fn read_led<L: Load<V>>(
        &self,
        lead: Option<Lead<'_, Read<V>>>,
        key: &[u8],
        loader: &L,
        options: &Options,
        load_on_miss: bool,
    ) -> Shared<V> {
        let ticket = self.local.ticket();
        let entry = match self.read(key).await {
            Ok(entry) => entry.map(Arc::new),
            Err(err) => {
                if let Some(lead) = lead {
                    lead.land_with(|| Err(err.clone()));
                }
                return Shared::Read(Err(err));
            }
        };
        // Nothing in this version: inside a version transition
        // the previous version's entry stands in (judged by the
        // pipeline, which refreshes this version).
        // (Boxed: inline, a second read's state would grow
        // every `get_or_load` future, hits included.)
        let (entry, previous) = match entry {
            Some(entry) => (Some(entry), false),
            None if self.inner.previous.is_some() => {
                (Box::pin(self.read_previous(key, options)).await, true)
            }
            None => (None, false),
        };
        if entry.is_some() || !load_on_miss {
            let read = Read {
                entry,
                loading: None,
                ticket,
                previous,
            };
            if let Some(lead) = lead {
                lead.land_with(|| Ok(read.clone()));
            }
            return Shared::Read(Ok(read));
        }
        let (load, role) = self.join_fill(
            key,
            loader.clone(),
            *options,
            None,
            Priority::Foreground,
            Mode::Fleet,
        );
        // The followers wait on the flight itself from here (and so do
        // callers that join this read while the load runs).
        let lead = lead.map(|mut lead| {
            lead.publish(Ok(Read {
                previous: false,
                entry: None,
                loading: Some(load.clone()),
                ticket,
            }));
            lead
        });
        // Boxed: its timer would grow every read's future, hits included.
        let result = Box::pin(self.await_load(key, load, options)).await;
        drop(lead);
        Shared::Loaded(result, role)
    }

    /// The outcome of the load of storage key `key` that this call joined,
    /// waited for no longer than a load can take (`lock_wait`, the
    /// bulkhead's `queue_wait`, `load_timeout`, and [`STRANDED_AFTER`] for
    /// its store calls). A load still in the air by then is stranded: its
    /// task runs on a runtime that no longer runs it (idle, its `block_on`
    /// returned). It is detached, and the call goes through the pipeline
    /// again on its own runtime (see [`revoked_before`]): an
    /// abandoned flight's error.
    async fn await_load(
        &self,
        key: &[u8],
        load: Joined<Loaded<V>>,
        options: &Options,
    ) -> Result<Loaded<V>, Error> {
        let bound = self
            .inner
            .lock_wait_for(options)
            .saturating_add(self.inner.origin.queue_wait())
            .saturating_add(options.load_timeout)
            .saturating_add(STRANDED_AFTER);
        match tokio::time::timeout(bound, load.clone().result()).await {
            Ok(result) => result,
            Err(_) => {
                tracing::warn!(key = %show_key(key), ?bound, "a load did not land within its bound (its runtime is not running it); loading again");
                self.local.flights.detach_joined(key, &load);
                Err(crate::flight::stranded())
            }
        }
    }

    /// Reads and decodes the envelope; unreadable bytes are a miss plus a
    /// warning, never an error and never a wrong value. So is a key fault
    /// (say, a Redis list under the key: reported by the guarded store):
    /// the store is fine, and the key's next fenced write replaces it.
    ///
    /// Inside a version transition the previous version's entry is read
    /// beside it (one `MGET`), and an entry loaded beside another one than
    /// is there now is a miss (see `transition`).
    async fn read(&self, key: &[u8]) -> Result<Option<Entry>, Error> {
        match self.inner.previous_key(key) {
            None => self.read_in(key, None).await,
            Some(previous) => Box::pin(self.read_in(key, Some(&previous))).await,
        }
    }

    /// [`read`](Self::read), beside the previous version's key `previous`
    /// if one is given.
    async fn read_in(&self, key: &[u8], previous: Option<&[u8]>) -> Result<Option<Entry>, Error> {
        let span = if tracing::dispatcher::has_been_set() {
            tracing::debug_span!("breakwater.store.get")
        } else {
            Span::none()
        };
        let get = async {
            match previous {
                None => self.get_queued(key).await.map(|bytes| (bytes, None)),
                Some(previous) => {
                    let mut both = self.inner.store.get_many(&[key, previous]).await?;
                    let beside = both.pop().flatten();
                    Ok((both.pop().flatten(), Some(beside)))
                }
            }
        };
        // Not wrapped unless a subscriber listens (see `fetch`).
        let read = if span.is_disabled() {
            get.await
        } else {
            get.instrument(span).await
        };
        let (bytes, beside) = match read {
            Ok((Some(bytes), beside)) => (bytes, beside),
            Ok((None, _)) => return Ok(None),
            Err(err) if err.is_key_fault() => return Ok(None),
            Err(err) => return Err(err),
        };
        match self.decode_beside(key, bytes, beside.as_ref().map(|b| b.as_deref())) {
            // A tagged entry (never an untagged one) is checked against its
            // tags' generations: one more round trip, boxed so that its
            // state does not grow every read's future.
            Some(entry) if !entry.tags.is_empty() => Box::pin(self.still_tagged(key, entry)).await,
            entry => Ok(entry),
        }
    }

    /// One store read of storage key `key`, straight to the store unless
    /// it is busy and batches reads (see `queue`).
    async fn get_queued(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        let store = &self.inner.store;
        let Some(waiting) = store.read_queue() else {
            return store.get_inline(key).await;
        };
        match queue::admit(waiting) {
            Some(_admitted) => store.get_inline(key).await,
            // Boxed: its state would grow every read's future.
            None => Box::pin(queue::queued(store, waiting, key)).await,
        }
    }

    /// Inside a version transition, the previous version's entry for
    /// storage key `key` (this version's key): a value entry that reads
    /// and is still servable on the store's clock, else nothing (a negative
    /// entry, one past its stale window, a failed read and bytes of another
    /// codec are all a plain miss).
    async fn read_previous(&self, key: &[u8], options: &Options) -> Option<Arc<Entry>> {
        let old = self.inner.previous_key(key)?;
        match self.read_in(&old, None).await {
            Ok(Some(entry)) if self.stands_in(&entry, self.inner.store.now_ms(), options) => {
                Some(Arc::new(entry))
            }
            _ => None,
        }
    }

    /// Whether the previous version's `entry` may stand in for this
    /// version's at `now_ms` (store clock): a value, inside its stale
    /// window and this call's `max_stale` (a call that opted out of stale
    /// values gets none from the previous version either).
    fn stands_in(&self, entry: &Entry, now_ms: u64, options: &Options) -> bool {
        !entry.negative
            && self
                .inner
                .freshness(options)
                .servable_stale(reading(entry, now_ms))
    }

    /// [`decode`](Self::decode), for bytes read beside what the previous
    /// version's key holds now (`beside`, inside a version transition; see
    /// `transition`): an entry loaded beside something else is a miss.
    fn decode_beside(
        &self,
        key: &[u8],
        bytes: Vec<u8>,
        beside: Option<Option<&[u8]>>,
    ) -> Option<Entry> {
        let mut entry = self.decode(key, bytes)?;
        if !entry.tags.is_empty() && !transition::beside(&mut entry, beside) {
            tracing::debug!(key = %show_key(key), "the previous version's entry changed since this one was loaded; treating it as a miss");
            return None;
        }
        Some(entry)
    }

    /// Decodes stored bytes (read, or carried by a fill's message) the way
    /// [`read`](Self::read) does.
    fn decode(&self, key: &[u8], bytes: Vec<u8>) -> Option<Entry> {
        match Entry::decode(bytes, self.inner.compression.max_decompressed_len()) {
            Ok(entry) if entry.codec == self.inner.codec => Some(entry),
            Ok(entry) => {
                // One expression: a `format_args!` kept in a `let` needs Rust
                // 1.89, and the rust-version is 1.88.
                self.foreign(
                    Once::ForeignCodec,
                    key,
                    &format_args!(
                        "stored with {}, this cache uses {}",
                        entry.codec.name(),
                        self.inner.codec.name()
                    ),
                );
                None
            }
            Err(err) => {
                warn_limited!(self.inner.logs, Warning::Unreadable, key = %show_key(key), error = %err, "cached entry is unreadable; treating it as a miss");
                self.inner.metrics.unreadable();
                None
            }
        }
    }

    /// The value an entry stands for: `Some(None)` for a negative entry,
    /// `None` if it does not decode (reported as a foreign value).
    fn entry_value(&self, key: &[u8], entry: &Entry) -> Option<Option<V>> {
        self.stored_value(entry)
            .map_err(|err| self.foreign(Once::ForeignValue, key, &err))
            .ok()
    }

    /// [`entry_value`](Self::entry_value) of the previous version's entry
    /// (inside a version transition): one that does not decode is the
    /// expected end of a type change with the version bump, logged at
    /// `debug` only.
    fn previous_value(&self, key: &[u8], entry: &Entry) -> Option<Option<V>> {
        self.stored_value(entry)
            .map_err(|err| tracing::debug!(key = %show_key(key), error = %err, "the previous version's value does not decode as this version's type; loading"))
            .ok()
    }

    /// The value an entry stands for, `None` for a negative entry.
    fn stored_value(&self, entry: &Entry) -> Result<Option<V>, Error> {
        if entry.negative {
            return Ok(None);
        }
        entry.value::<V>().map(Some)
    }

    fn is_fresh(&self, entry: &Entry) -> bool {
        entry.fresh_until > self.inner.store.now_ms()
    }

    fn decode_value(&self, key: &[u8], entry: &Entry) -> Option<V> {
        entry
            .value::<V>()
            .map_err(|err| self.foreign(Once::ForeignValue, key, &err))
            .ok()
    }

    /// A stored entry this cache cannot take (`kind`: another value type,
    /// or another codec; `detail` says which): counted, and reported once
    /// per cache with its likely cause (a stream of identical warnings
    /// would say nothing more); at `debug` after that.
    #[cold]
    fn foreign(&self, kind: Once, key: &[u8], detail: &dyn std::fmt::Display) {
        self.inner.metrics.unreadable();
        let what = match kind {
            Once::ForeignValue => "a cached value does not decode as this cache's value type",
            Once::ForeignCodec => "a cached entry was written with another codec",
        };
        if self.inner.logs.first(kind) {
            tracing::warn!(
                namespace = %self.inner.namespace,
                key = %show_key(key),
                value_type = std::any::type_name::<V>(),
                detail = %detail,
                "{what}; treating it as a miss. Likely cause: another cache or service stores \
                 another type under the same namespace, or writes there with another codec \
                 (give each its own .namespace(..)), or the type changed without a .version(..) \
                 bump. Reported once; every such entry is counted in \
                 breakwater_unreadable_entries_total and logged at debug"
            );
        } else {
            tracing::debug!(key = %show_key(key), detail = %detail, "{what}; treating it as a miss");
        }
    }

    /// Counts and reports (rate-limited) a value above `max_value_size`,
    /// and builds the error for its caller.
    fn too_large(&self, key: &[u8], at_least: usize) -> Error {
        let inner = &self.inner;
        inner.metrics.too_large();
        warn_limited!(
            inner.logs,
            Warning::TooLarge,
            key = %show_key(key),
            bytes_at_least = at_least,
            max_value_size = inner.max_value_size,
            "value is larger than max_value_size; not cached"
        );
        Error::new(
            ErrorKind::TooLarge,
            format!(
                "the serialized value is at least {at_least} bytes, above max_value_size \
                 ({} bytes); it was not cached (raise CacheBuilder::max_value_size, or cache \
                 smaller values)",
                inner.max_value_size
            ),
        )
    }

    /// Encodes `value` (`None`: a negative entry) into an entry with the
    /// jittered TTL (the negative TTL for negative entries), and returns it
    /// with its physical TTL, which ends at `stale_until` (the fresh window
    /// plus `max_stale`).
    ///
    /// Every step saturates: the windows are validated (at most 365 days
    /// each), and even unvalidated ones give a TTL the store cuts to what
    /// it accepts, never an overflow.
    ///
    /// # Errors
    ///
    /// [`Codec`](ErrorKind::Codec) if the value does not serialize;
    /// [`TooLarge`](ErrorKind::TooLarge) if the encoded entry is larger
    /// than `max_value_size` (counted, and logged with `key` and the size).
    fn seal(
        &self,
        key: &[u8],
        value: Option<&V>,
        load_time: Duration,
        options: &Options,
    ) -> Result<Sealed, Error> {
        let now = self.inner.store.now_ms();
        self.seal_tagged(key, value, load_time, options, Vec::new(), now)
    }

    /// [`seal`](Self::seal), recording `tags` (with their generations) in
    /// the entry (a format version 2 entry, unless `tags` is empty), its
    /// windows counted from `now` (store clock): when the value was had,
    /// which for a `set` is before its tags' generations were read.
    fn seal_tagged(
        &self,
        key: &[u8],
        value: Option<&V>,
        load_time: Duration,
        options: &Options,
        tags: Vec<TagStamp>,
        now: u64,
    ) -> Result<Sealed, Error> {
        let inner = &self.inner;
        let (payload, negative) = match value {
            Some(v) => match inner.codec.encode_within(v, inner.max_value_size) {
                Ok(payload) => (payload, false),
                Err(Encode::Failed(err)) => return Err(err),
                Err(Encode::TooLarge { at_least }) => return Err(self.too_large(key, at_least)),
            },
            None => (Vec::new(), true),
        };
        let base = if negative {
            options.negative_ttl
        } else {
            options.ttl
        };
        let fresh = {
            let mut rng = inner.rng.lock().unwrap_or_else(|p| p.into_inner());
            options.jitter.apply(base, &mut *rng)
        };
        let fresh_ms = millis(fresh).max(1);
        // Negative entries are never served stale.
        let stale_ms = if negative {
            0
        } else {
            millis(options.max_stale())
        };
        let fresh_until = now.saturating_add(fresh_ms);
        let stale_until = fresh_until.saturating_add(stale_ms);
        let load_ms = u32::try_from(load_time.as_millis()).unwrap_or(u32::MAX);
        let entry = Entry {
            codec: inner.codec,
            negative,
            fresh_until,
            stale_until,
            load_ms,
            payload,
            tags: tags.into(),
        };
        let bytes = entry.encode(&inner.compression);
        Ok(Sealed {
            bytes,
            // What is left of the windows when it is written.
            ttl: Duration::from_millis(stale_until.saturating_sub(inner.store.now_ms()).max(1)),
            stamp: stamp(&entry),
        })
    }

    /// Keeps a value read from the store in L1, for no longer than the
    /// store says it is fresh, and servable as a stand-in no longer than
    /// both the entry and this reader's own `max_stale` allow (the writer
    /// may have allowed more), unless the key was invalidated since the read
    /// began (`ticket`).
    fn remember(
        &self,
        key: &[u8],
        value: &Option<V>,
        entry: &Entry,
        now_ms: u64,
        ticket: Option<Ticket>,
        options: &Options,
    ) {
        // (Before the value is cloned: a hit without L1 clones nothing.)
        if self.local.l1.is_none() {
            return;
        }
        let stale_until = entry.stale_until.min(
            entry
                .fresh_until
                .saturating_add(millis(options.max_stale())),
        );
        self.put_near(
            key,
            value.clone(),
            stamp(entry),
            stale_until,
            now_ms,
            ticket,
        );
    }

    /// Keeps a value this process just wrote (or loaded) in L1, unless the
    /// key was invalidated since the write or load began (`ticket`).
    fn remember_sealed(
        &self,
        key: &[u8],
        value: Option<V>,
        sealed: &Sealed,
        ticket: Option<Ticket>,
    ) {
        // What is left of the entry's windows now, not the windows it was
        // sealed with: a write that took its time (a slow or timed-out
        // store) must not extend the copy's life by as much.
        let now_ms = self.inner.store.now_ms();
        self.put_near(
            key,
            value,
            sealed.stamp,
            sealed.stamp.stale_until,
            now_ms,
            ticket,
        );
    }

    /// Puts `value` in L1 under storage key `key`'s user key, fresh for
    /// what is left at `now_ms` (the store's clock) of its entry's fresh
    /// window and servable until `stale_until`, unless the key was
    /// invalidated since `ticket`.
    fn put_near(
        &self,
        key: &[u8],
        value: Option<V>,
        stamp: Stamp,
        stale_until: u64,
        now_ms: u64,
        ticket: Option<Ticket>,
    ) {
        let (Some(l1), Some(ticket)) = (&self.local.l1, ticket) else {
            return;
        };
        let left = |until: u64| Duration::from_millis(until.saturating_sub(now_ms));
        l1.put(
            self.inner.user_key(key),
            value,
            left(stamp.fresh_until),
            left(stale_until),
            stamp,
            self.inner.default_early_window(stamp.load_ms),
            ticket,
        );
        self.inner.metrics.l1_entries(l1.entries());
    }
}

/// An encoded entry with its physical TTL and its deadlines.
struct Sealed {
    bytes: Vec<u8>,
    /// The store TTL: the fresh window plus `max_stale`.
    ttl: Duration,
    /// The entry's deadlines and load time, for L1.
    stamp: Stamp,
}

/// What a load flight lands with: the value, how it was served, and, if
/// the load's fenced write was refused, when its lease was asked for.
///
/// A refused write means the lease was revoked while the value was loaded
/// (an invalidation or `set`, possibly from another process that this one
/// has not heard from yet) or ran out: the value may predate a change that
/// completed before some of the flight's callers started. The revocation
/// came after the lease was asked for, so the value is served only to
/// callers that started by then; later ones read and load again (see
/// [`Cache::pipeline`]).
type Loaded<V> = (Option<V>, Served, Option<Instant>);

/// What a shared store read gives every caller that shared it.
#[derive(Clone)]
struct Read<V> {
    /// The envelope, if one is stored and readable.
    entry: Option<Arc<Entry>>,
    /// Nothing was: the key's load (started by the read, or already in
    /// the air), which the read's followers wait on.
    loading: Option<Joined<Loaded<V>>>,
    /// When the read began, for L1.
    ticket: Option<Ticket>,
    /// `entry` is the previous version's (a version transition).
    previous: bool,
}

/// How a shared store read ended for one caller.
enum Shared<V> {
    /// Nothing was stored: the key's load, and this caller's part in it
    /// (the leader only if it led the read and the load).
    Loaded(Result<Loaded<V>, Error>, Role),
    /// The read's outcome.
    Read(Result<Read<V>, Error>),
}

/// What a call gets from an entry read from the store (see
/// [`Cache::judge_entry`]).
enum Judged<V> {
    /// Served, with a refresh to start in the background, if one is due.
    Served(Fetched<V>, Option<Refresh>),
    /// Nothing servable: load; `stale`: the entry may stand in for a
    /// failed load.
    Load {
        /// The entry is the load's fail-safe stand-in.
        stale: bool,
    },
}

/// A background refresh a served entry asks for.
#[derive(Debug, Clone, Copy)]
struct Refresh {
    /// The `fresh_until` of the entry it replaces.
    replacing: u64,
    /// The entry is still fresh (an early refresh, counted as one).
    early: bool,
}

/// What L1 says about a key.
enum Near<V> {
    /// A fresh copy: served as it is; with the `fresh_until` of the entry
    /// an early refresh should replace, if one is due.
    Fresh(Fetched<V>, Option<u64>),
    /// A copy past its fresh time that may still stand in for the store.
    Stale(Arc<Slot<V>>),
    /// Nothing usable (or no L1).
    Miss,
}

/// The user's key inside a storage key built by [`Cache::storage_key`]
/// whose namespace prefix is `prefix_len` bytes: `{<key>}` (such a key has
/// no braces of its own) or `{#<16 hex digits>}<key>` (one that has).
pub(crate) fn user_key(storage_key: &[u8], prefix_len: usize) -> &[u8] {
    let tagged = storage_key.get(prefix_len..).unwrap_or_default();
    // In the plain form a `}` can only be the last byte; here it is not.
    if tagged.len() > HASH_TAG_LEN && tagged.starts_with(b"{#") && tagged[HASH_TAG_LEN - 1] == b'}'
    {
        return &tagged[HASH_TAG_LEN..];
    }
    tagged
        .strip_prefix(b"{")
        .and_then(|t| t.strip_suffix(b"}"))
        .unwrap_or(tagged)
}

/// `<prefix>{<key>}`, or `<prefix>{#<16 hex digits>}<key>` when the key
/// has a brace of its own: the key in a Redis Cluster hash tag of its own
/// (a storage key, a tag's counter).
pub(crate) fn hash_tagged(prefix: &[u8], key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(prefix.len() + key.len() + HASH_TAG_LEN + 1);
    out.extend_from_slice(prefix);
    if key.iter().any(|b| matches!(b, b'{' | b'}')) {
        out.extend_from_slice(format!("{{#{:016x}}}", fnv1a(key)).as_bytes());
        out.extend_from_slice(key);
    } else {
        out.push(b'{');
        out.extend_from_slice(key);
        out.push(b'}');
    }
    out
}

/// The default `lock_wait`: a holder's whole `load` (`queue_wait +
/// load_timeout`) `+ 2 × lease_ttl`.
fn default_lock_wait(load: Duration, lease_ttl: Duration) -> Duration {
    load.saturating_add(lease_ttl).saturating_add(lease_ttl)
}

/// `{#` + 16 hex digits + `}`.
const HASH_TAG_LEN: usize = 19;

/// Beyond its waits and its load, how long a load may take (its store
/// calls) before a caller takes it for stranded (see
/// [`Cache::await_load`]).
const STRANDED_AFTER: Duration = Duration::from_secs(5);

/// How many times one call goes through the pipeline when the load it
/// joined turns out revoked (see [`Cache::pipeline`]): what a call joins on
/// its third pass began after it started, so its value is served whatever
/// became of it.
pub(super) const MAX_PASSES: usize = 3;

/// A flight's outcome for a caller that started at `started`: `None` if
/// it is a revoked load whose lease was asked for before then (the caller
/// goes through the pipeline again), unless this is the `last` pass: then
/// an error, never the revoked value. `None` too for a flight abandoned
/// by its task (its runtime shut down) before the last pass.
fn revoked_before<V>(
    result: Result<Loaded<V>, Error>,
    started: Instant,
    last: bool,
) -> Option<Result<Loaded<V>, Error>> {
    match &result {
        // The flight's task went away with its runtime (another runtime's
        // caller led it): load again, on this caller's runtime.
        Err(err) if !last && crate::flight::is_abandoned(err) => None,
        Ok((_, _, Some(asked))) if started > *asked => last.then(|| {
            Err(Error::new(
                ErrorKind::Timeout,
                format!(
                    "the key was invalidated during each of the {MAX_PASSES} loads this call waited for; try again"
                ),
            ))
        }),
        _ => Some(result),
    }
}

/// What L1 keeps of an entry: its deadlines and load time.
fn stamp(entry: &Entry) -> Stamp {
    Stamp {
        // A transition stamp is no tag.
        tagged: entry.tags.iter().any(|t| !t.tag.is_empty()),
        fresh_until: entry.fresh_until,
        stale_until: entry.stale_until,
        load_ms: entry.load_ms,
    }
}

/// What the freshness policy needs of an entry.
fn reading(entry: &Entry, now_ms: u64) -> Reading {
    Reading {
        now_ms,
        fresh_until: entry.fresh_until,
        stale_until: entry.stale_until,
        load_ms: entry.load_ms,
    }
}

/// How many L1 hits on a thread take one unit of tokio's cooperative
/// budget. A unit costs about 50 instructions, a twenty-fifth of a whole
/// hit (about 1,250); one per 8 hits still yields a task that only hits L1
/// after 8 × 128 hits, well under a millisecond.
const HITS_PER_BUDGET_UNIT: u8 = 8;

thread_local! {
    static HITS_SINCE_BUDGET: std::cell::Cell<u8> = const { std::cell::Cell::new(0) };
}

/// Takes a unit of tokio's cooperative budget every
/// [`HITS_PER_BUDGET_UNIT`] hits on this thread (yielding if the budget is
/// spent).
async fn cooperate() {
    let due = HITS_SINCE_BUDGET.with(|hits| {
        let n = hits.get().wrapping_add(1);
        let due = n >= HITS_PER_BUDGET_UNIT;
        hits.set(if due { 0 } else { n });
        due
    });
    if due {
        tokio::task::coop::consume_budget().await;
    }
}

/// Whether a stale entry is still inside `options.grace`, where it is served
/// while one refresh runs (past it, a read waits for the load).
fn in_grace(entry: &Entry, now_ms: u64, options: &Options) -> bool {
    now_ms < entry.fresh_until.saturating_add(millis(options.grace))
}

/// How many writes `set_many` sends as one batch.
const SET_MANY_BATCH: usize = 500;

/// How long `invalidate` keeps trying to deliver one invalidation.
const INVALIDATE_WITHIN: Duration = Duration::from_secs(1);

/// Retries of store calls safe to repeat (`invalidate`, a warm-up's
/// reads): up to 10 attempts, 20..400 ms apart with full jitter (spread
/// over a second or more, so a store breaker's cool-down can pass), for
/// store failures that may pass (not a key's own fault).
fn store_retries(seed: Option<u64>) -> crate::retry::Retry {
    let config = crate::RetryConfig::new()
        .max_attempts(10)
        .backoff(crate::Backoff::full_jitter(
            Duration::from_millis(20),
            Duration::from_millis(400),
        ))
        .retry_if(|err| err.is_store() && !err.is_key_fault());
    crate::retry::Retry::new(config, seed)
}

/// The error of an invalidation that did not get through; when the last
/// attempt (failed at `at`) was refused by the store's open breaker, it says
/// when that ends.
fn undelivered(key: &[u8], attempts: u32, last: Error, at: Instant) -> Error {
    let retry_after = last
        .retry_after()
        .map(|after| after.saturating_sub(at.elapsed()));
    let err = Error::new(
        ErrorKind::Store,
        format!(
            "the invalidation of {} was not delivered ({attempts} attempt(s) within {:?}): \
             other processes may serve the old value until its TTL ends; retry it",
            show_key(key),
            INVALIDATE_WITHIN
        ),
    )
    .with_source(last);
    match retry_after {
        Some(after) => err.with_retry_after(after),
        None => err,
    }
}

/// The lease key of storage key `key` under a value prefix of
/// `prefix_len` bytes: the record marker `v` (the prefix ends in `:v:`)
/// replaced by `l`, so both share one hash tag.
fn lease_key(key: &[u8], prefix_len: usize) -> Vec<u8> {
    let mut lease = key.to_vec();
    if let Some(marker) = lease.get_mut(prefix_len - 2) {
        *marker = b'l';
    }
    lease
}

/// The public calls that have a span. A call L1 answers alone (a fresh
/// copy, nothing to refresh) has its span at `debug`, the others at `info`.
#[derive(Clone, Copy)]
enum Op {
    GetOrLoad,
    /// A `get_or_load` served by a fresh L1 copy.
    GetOrLoadNear,
    Get,
    /// A `get` served by a fresh L1 copy.
    GetNear,
    Set,
    Invalidate,
    InvalidateTag,
}

/// Records a call's error on its span.
fn record_error<T>(span: &Span, result: &Result<T, Error>) {
    if let (false, Err(err)) = (span.is_disabled(), result) {
        record_failure(span, err);
    }
}

/// Records `err` on a call's span: its `error` field, and the status an
/// OpenTelemetry bridge shows a failed span with.
fn record_failure(span: &Span, err: &Error) {
    span.record("error", tracing::field::display(err));
    span.record("otel.status_code", "ERROR");
}

/// A key as it may appear in logs: lossy UTF-8, cut at 128 bytes.
fn show_key(key: &[u8]) -> String {
    let cut = &key[..key.len().min(128)];
    let mut s = String::from_utf8_lossy(cut).into_owned();
    if key.len() > cut.len() {
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// L1 is keyed by the user's key and the bus carries storage keys:
        /// every storage key must give its user key back.
        #[test]
        fn user_key_inverts_storage_key(key in proptest::collection::vec(any::<u8>(), 1..64)) {
            let cache = Cache::<u8>::builder().namespace("ns").build().unwrap();
            let storage = cache.storage_key(&key).unwrap();
            prop_assert_eq!(user_key(&storage, cache.inner.value_prefix.len()), &key[..]);
        }
    }

    #[test]
    fn user_key_of_look_alike_keys() {
        let cache = Cache::<u8>::builder().namespace("ns").build().unwrap();
        let prefix = cache.inner.value_prefix.len();
        for key in [
            &b"#0123456789abcdef"[..],
            b"{#0123456789abcdef}x",
            b"}",
            b"{",
            b"#",
        ] {
            let storage = cache.storage_key(key).unwrap();
            assert_eq!(user_key(&storage, prefix), key, "{}", show_key(&storage));
        }
    }
}

//! The [`Cache`] handle and what it holds (`CacheCore`), the ground floor of
//! the pipeline: every step names these types, and this file names no
//! step.
//!
//! The type's documentation (the coherence contract) is here, with the
//! type; its public methods are in the module root (`cache/mod.rs`),
//! except those of a room of their own (`get_many` in `batch`, `warm`,
//! `inspect`), the steps' in their own files. Besides the type: the few accessors every
//! step uses (the key's records, lease tokens, the fail-safe throttle).

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::RngExt;
use rand::rngs::StdRng;
use tokio::time::Instant;

use super::coherence::Local;
use super::guard::GuardedStore;
use super::keys::{hash_tagged, lease_key, user_key};
use super::lease::LeaseConfig;
use super::notify::Waiters;
use super::options::Options;
use super::origin::Origin;
use super::queue::{ReadQueue, WriteQueue};
use super::settings::Settings;
use super::throttle::Throttle;
use super::value::Value;
use crate::clock::millis;

use crate::error::{Error, ErrorKind};
use crate::log_limit::LogLimiter;
use crate::metrics::Metrics;
use crate::store::{FRESH_GENERATIONS, Notice, Store};

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
///    [`OnLockTimeout`](crate::OnLockTimeout) then applies to a stuck lease, never to a slow
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
/// that tag ([`CacheEntry::tags`](crate::CacheEntry::tags)), with the tag's generation as the fence:
/// (1) a load that started before recorded the old generation, so its entry
/// is invalid wherever it lands, and a tag-invalidated entry is never served,
/// not even stale; (2) in the invalidating process L1 is emptied (if it
/// holds a tagged entry) and every
/// load and shared read in the air detached before it returns (an entry's
/// tags are known only once read, so this applies to every key); (3)
/// another process empties its L1 when the message arrives, within the
/// same bounds; without L1 it reads the store, which checks a tagged
/// entry's generations on every read (with the entry, when the call names
/// its tags; tagged entries only); (5) `invalidate_tag` is retried within 1 s, as
/// `invalidate`; (6) a generation is at least the store's clock in ms.
/// [`expire_tag`](Self::expire_tag) is the same with "invalid" read as
/// "stale": a load that started before lands stale, never fresh, and the
/// tag's entries are served stale within grace (fail-safe within
/// `max_stale`) instead of missing.
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
/// [`trace_keys`](crate::CacheBuilder::trace_keys)), `breakwater.get`,
/// `breakwater.set`, `breakwater.invalidate`, `breakwater.invalidate_tag`,
/// `breakwater.expire_tag` and `breakwater.get_many`, with the store read, the fill, the load
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
    pub(super) inner: Arc<CacheCore>,
    /// Flights in the air and the L1 near cache.
    pub(super) local: Arc<Local<V>>,
    /// Served when a load fails and no stale value can stand in.
    pub(super) fallback: Option<Fallback<V>>,
}

/// Produces the degraded value for a user key.
pub(super) type Fallback<V> = Arc<dyn Fn(&[u8]) -> Option<V> + Send + Sync>;

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
            .field("namespace", &self.inner.settings.namespace)
            .field("store", &self.inner.store)
            .field("ttl", &self.inner.defaults.ttl)
            .field("jitter", &self.inner.defaults.jitter)
            .finish_non_exhaustive()
    }
}

/// Everything a cache knows, independent of its value type.
pub(super) struct CacheCore {
    /// `<key_prefix><namespace>:v:` (`bw:` by default); the user key
    /// follows inside a hash tag.
    pub(super) value_prefix: Vec<u8>,
    /// `<key_prefix><namespace>:t:`, without the version: tags'
    /// generation counters (see `tags`).
    pub(super) tag_prefix: Vec<u8>,
    /// `<key_prefix><namespace>:c` (with the version, as the value
    /// prefix): the namespace's clear record (see `clear`).
    pub(super) clear_key: Vec<u8>,
    /// The store as the user gave it.
    pub(super) raw_store: Arc<dyn Store>,
    /// The same store behind its circuit breaker; every call goes here.
    pub(super) store: Arc<GuardedStore>,
    /// The queue of reads that meet while the store is busy, if the store
    /// batches reads ([`Store::batches_reads`]; see `queue`).
    pub(super) read_queue: Option<Arc<ReadQueue>>,
    /// The queue of `set`s that meet while the store is busy, on the same
    /// stores (see `queue`).
    pub(super) write_queue: Option<Arc<WriteQueue>>,
    /// Queued `set`s of at least this many go out as two transactions.
    pub(super) write_split: usize,
    /// Breaker, bulkhead and retries for loads.
    pub(super) origin: Origin,
    /// Per-call settings unless a call overrides them.
    pub(super) defaults: Options,
    /// The previous version's entries, read inside a version transition.
    pub(super) previous: Option<Previous>,
    /// The key's lease and the waits on it.
    pub(super) lease: LeaseConfig,
    /// Jitter and early-refresh draws; seedable.
    pub(super) rng: Mutex<StdRng>,
    /// Retries of store calls that are safe to repeat and may meet a
    /// passing failure: `invalidate`, and a warm-up's reads.
    pub(super) store_retries: crate::retry::Retry,
    /// Lease tokens; always from the OS, never seeded, so unguessable.
    pub(super) token_rng: Mutex<StdRng>,
    pub(super) waiters: Waiters,
    pub(super) metrics: Metrics,
    /// Repeated warnings, one line per kind per second (shared with the
    /// guarded store).
    pub(super) logs: Arc<LogLimiter>,
    /// Keys whose load failed recently, with the store-clock ms until which
    /// their stale value is served without calling the loader (fail-safe).
    pub(super) throttled: Throttle,
    /// What the cache was built with, defaults resolved.
    pub(super) settings: Settings,
}

/// The previous version, during a version transition (see
/// [`CacheBuilder::version_transition`](crate::CacheBuilder::version_transition)).
#[derive(Debug)]
pub(crate) struct Previous {
    /// Its `value_prefix`.
    pub(crate) prefix: Vec<u8>,
    /// When the transition ends.
    pub(crate) until: Instant,
    /// Its change channel.
    pub(crate) channel: Vec<u8>,
}

impl CacheCore {
    /// How long a call waits for another holder of the lease (see
    /// [`LeaseConfig::lock_wait_for`]): the holder's whole load is its
    /// bulkhead's `queue_wait` plus this call's `load_timeout`.
    pub(super) fn lock_wait_for(&self, options: &Options) -> Duration {
        let load = options
            .load_timeout
            .saturating_add(self.origin.queue_wait());
        self.lease.lock_wait_for(load)
    }

    /// Storage key `key`'s entry in the previous version, while the version
    /// transition lasts.
    pub(super) fn previous_key(&self, key: &[u8]) -> Option<Vec<u8>> {
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
    pub(super) fn lease_key(&self, key: &[u8]) -> Vec<u8> {
        lease_key(key, self.value_prefix.len())
    }

    /// The user's key inside storage key `key` (L1 is keyed by it).
    pub(super) fn user_key<'k>(&self, key: &'k [u8]) -> &'k [u8] {
        user_key(key, self.value_prefix.len())
    }

    /// 128 random bits from the OS-seeded generator.
    pub(super) fn new_token(&self) -> [u8; 16] {
        let mut rng = self.token_rng.lock().unwrap_or_else(|p| p.into_inner());
        rng.random()
    }

    /// A value a tag counter or a clear record starts again at: drawn
    /// from the OS-seeded generator (a seeded one would repeat across
    /// processes with the same seed), uniform over [`FRESH_GENERATIONS`],
    /// so no entry can have recorded it.
    pub(super) fn fresh_generation(&self) -> u64 {
        let mut rng = self.token_rng.lock().unwrap_or_else(|p| p.into_inner());
        rng.random_range(FRESH_GENERATIONS)
    }

    pub(super) fn notice<'a>(&'a self, message: &'a [u8]) -> Notice<'a> {
        Notice {
            channel: self.waiters.channel(),
            message,
            batch_head: None,
        }
    }

    /// `true` if `key`'s load failed within the fail-safe throttle.
    pub(super) fn is_throttled(&self, key: &[u8], now_ms: u64) -> bool {
        self.throttled.is_throttled(key, now_ms)
    }

    /// Records a failed load of `key`: its stale value is served without
    /// loading until `throttle` has passed.
    pub(super) fn throttle(&self, key: &[u8], throttle: Duration) {
        let now = self.store.now_ms();
        let until = now.saturating_add(millis(throttle));
        self.throttled.insert(key, now, until);
    }

    /// A successful load lifts the throttle.
    pub(super) fn clear_throttle(&self, key: &[u8]) {
        self.throttled.remove(key);
    }
}

impl<V: Value> Cache<V> {
    /// [`storage_key`](Self::storage_key) of a key's bytes.
    pub(super) fn key_in_store(&self, key: &[u8]) -> Result<Vec<u8>, Error> {
        self.check_key(key)?;
        Ok(hash_tagged(&self.inner.value_prefix, key))
    }

    /// An empty or over-long key is refused before it reaches L1 or the
    /// store.
    pub(super) fn check_key(&self, key: &[u8]) -> Result<(), Error> {
        if key.is_empty() {
            return Err(Error::new(ErrorKind::InvalidKey, "key must not be empty"));
        }
        if key.len() > self.inner.settings.max_key_len {
            return Err(Error::new(
                ErrorKind::InvalidKey,
                format!(
                    "key is {} bytes, the limit is {} (see CacheBuilder::max_key_len)",
                    key.len(),
                    self.inner.settings.max_key_len
                ),
            ));
        }
        Ok(())
    }
}

//! Where entries live: the [`Store`] trait and its two backends.
//!
//! A store is the handful of operations the `get_or_load` pipeline needs, not a
//! Redis client: read one key with one command, write with a TTL, delete, and
//! tell the time on the store's own clock. [`MemoryStore`] is the embedded
//! backend (one process, no server); [`RedisStore`] shares entries between
//! processes through Redis.
//!
//! # The store's clock
//!
//! Every freshness decision compares an entry's `fresh_until` and
//! `stale_until` (written in store-clock milliseconds) with
//! [`Store::now_ms`]. For [`MemoryStore`] that clock is tokio's, so tests can
//! pause and advance it; for [`RedisStore`] it is Redis's own `TIME`, so two
//! application machines whose clocks disagree still agree on what is fresh.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, watch};

use crate::error::Error;

mod generation;
mod memory;
pub(crate) mod namespace;
mod redis;

pub(crate) use generation::{
    FRESH_GENERATIONS, TagJudgment, TagState, parse_generation, parse_tag_state,
};
pub use memory::MemoryStore;
use namespace::{Applied, Clear, NamespaceState};
pub use redis::{RedisLatency, RedisStore, RedisStoreConfig, SentinelError};

/// The future returned by [`Store`] operations.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, Error>> + Send + 'a>>;

/// How many deliveries a subscriber may fall behind before it is told it
/// missed some.
pub(crate) const SUBSCRIPTION_BUFFER: usize = 4096;

/// The operations the cache needs from a backend.
///
/// Keys and values are bytes; the cache has already namespaced the key and
/// encoded the entry. Implementations must be cheap to share (`Arc<dyn Store>`)
/// and must never block the async runtime.
///
/// # Contract
///
/// - [`get`](Store::get) is exactly one round trip (one `GET` in Redis) and
///   returns `None` for a missing or expired key.
/// - [`set`](Store::set) replaces the value and its TTL; the key disappears
///   once the TTL has passed on the store's clock. A TTL below 1 ms is rejected
///   with a [`Config`](crate::ErrorKind::Config) error.
/// - [`delete`](Store::delete) reports whether a key was removed.
/// - [`now_ms`](Store::now_ms) is the store's clock in Unix milliseconds; it
///   never goes backwards within one store handle.
/// - Lease operations are atomic: a lease has one holder, identified by an
///   unguessable token; only that holder can extend, release or write
///   through it, and [`invalidate`](Store::invalidate) revokes it.
/// - Tag counters ([`bump_generation`](Store::bump_generation),
///   [`expire_generation`](Store::expire_generation),
///   [`tag_generations`](Store::tag_generations)) are atomic per counter,
///   start a missing or foreign counter at the caller's `fresh` value,
///   never validate anything once lost, and only ever lengthen a counter's
///   TTL.
///
/// The same contract test suite runs against every backend in this crate.
///
/// # What a new backend must write
///
/// The 17 methods without a default:
///
/// - [`get`](Store::get): one key's value.
/// - [`set`](Store::set): a value with its TTL.
/// - [`delete`](Store::delete): one key.
/// - [`ttl`](Store::ttl): a key's time left (for inspection).
/// - [`now_ms`](Store::now_ms): the store's clock.
/// - [`name`](Store::name): the backend's name, for logs and metrics.
/// - [`acquire_lease`](Store::acquire_lease): take a lease, or learn how
///   long its holder has left.
/// - [`lease_held`](Store::lease_held): whether a lease is held (for
///   inspection).
/// - [`extend_lease`](Store::extend_lease): the holder keeps its lease.
/// - [`release_lease`](Store::release_lease): the holder lets go, and
///   waiters are told.
/// - [`fenced_set`](Store::fenced_set): the holder's write.
/// - [`replace`](Store::replace): a write that revokes a load in flight.
/// - [`invalidate`](Store::invalidate): a delete that revokes one.
/// - [`bump_generation`](Store::bump_generation): a tag's invalidation.
/// - [`tag_generations`](Store::tag_generations): tag counters read (or
///   created) for a write.
/// - [`publish`](Store::publish): a message to every subscriber.
/// - [`subscribe`](Store::subscribe): the messages of one channel.
///
/// # Sections
///
/// The methods come in five sections, in this order. Every default keeps
/// the contract on any backend; a backend overrides one to do better
/// (fewer round trips, finer failure domains, a deadline of its own).
///
/// - **Core reads and writes**: `get`, `set`, `delete`, `ttl`, `now_ms`,
///   `name`; with defaults, [`read_deadline`](Store::read_deadline) (1 s),
///   [`soft_deadline`](Store::soft_deadline) and
///   [`write_deadline`](Store::write_deadline) (the read deadline),
///   [`failure_domains`](Store::failure_domains) (1: the store fails as a
///   whole) and [`failure_domain`](Store::failure_domain) (0).
/// - **Leases and fenced writes**: `acquire_lease`, `lease_held`,
///   `extend_lease`, `release_lease`, `fenced_set`, `replace`, `invalidate`,
///   `bump_generation`, `tag_generations`; with defaults,
///   [`expire_entry`](Store::expire_entry) (invalidates instead),
///   [`expire_generation`](Store::expire_generation) (bumps instead),
///   [`pin`](Store::pin) (a `get`, then a `set` of the placeholder if
///   nothing was there: not atomic, see its docs) and
///   [`fenced_renew`](Store::fenced_renew) (declines: the holder then
///   writes the whole entry with `fenced_set`).
/// - **Namespace clear**, with a default:
///   [`clear_namespace`](Store::clear_namespace) (a `get`, a `set` and a
///   `publish`: not atomic, see its docs).
/// - **Bus**: `publish`, `subscribe`; no defaults.
/// - **Batch**, all with defaults: [`get_many`](Store::get_many) (one `get`
///   after another), [`acquire_leases`](Store::acquire_leases) (one
///   `acquire_lease` after another), [`replace_many`](Store::replace_many)
///   and [`invalidate_many`](Store::invalidate_many) (one `replace` or
///   `invalidate` after another, each with its own message) and
///   [`batches_reads`](Store::batches_reads) (`false`: reads are never
///   gathered into a `get_many`).
pub trait Store: Send + Sync + fmt::Debug + Any + 'static {
    // --- core reads and writes ---

    /// Reads the value under `key`, or `None` if it is missing or expired.
    fn get<'a>(&'a self, key: &'a [u8]) -> StoreFuture<'a, Option<Vec<u8>>>;

    /// Writes `value` under `key`, expiring after `ttl` (millisecond precision).
    fn set<'a>(&'a self, key: &'a [u8], value: &'a [u8], ttl: Duration) -> StoreFuture<'a, ()>;

    /// Deletes `key`; `true` if it existed.
    fn delete<'a>(&'a self, key: &'a [u8]) -> StoreFuture<'a, bool>;

    /// Reads a bookkeeping key (a namespace's clear record) to keep it
    /// warm under an LRU or LFU eviction policy: a [`get`](Store::get)
    /// that is not traffic (wrappers that count reads need not count it).
    fn keep_warm<'a>(&'a self, key: &'a [u8]) -> StoreFuture<'a, Option<Vec<u8>>> {
        self.get(key)
    }

    /// The time `key` has left to live, or `None` if it is missing or has no
    /// expiry. For inspection and tests; the request path never calls it.
    fn ttl<'a>(&'a self, key: &'a [u8]) -> StoreFuture<'a, Option<Duration>>;

    /// The store's clock, in Unix milliseconds.
    fn now_ms(&self) -> u64;

    /// A short name for logs and metrics, e.g. `"redis"`.
    fn name(&self) -> &'static str;

    /// How long one read ([`get`](Store::get)) may take before the store
    /// gives up on it: its deadline. A cache's caller that shares another
    /// caller's read of the same key (or waits in a batch of reads) waits
    /// no longer than this for it before it reads alone, so a read whose
    /// caller stopped polling it delays nobody else by more. 1 s by
    /// default; stores with a deadline of their own return it.
    fn read_deadline(&self) -> Duration {
        Duration::from_secs(1)
    }

    /// How long a cache's caller that holds a servable stand-in (an L1
    /// copy past its fresh time) waits for a read of `key` before it is
    /// served that stand-in: the read's *soft* deadline. A store that
    /// tells a slow store (answers late: wait for it) from a stalled one
    /// (no answer at all: don't) returns less than its
    /// [`read_deadline`](Store::read_deadline) while it is stalled. The
    /// default: `read_deadline`.
    fn soft_deadline(&self, key: &[u8]) -> Duration {
        let _ = key;
        self.read_deadline()
    }

    /// How long one write (a lease script, an invalidation) may take now
    /// before the store gives up on it. A cache's invalidation gives each
    /// attempt a few of these, so one the store delivered is not reported
    /// as undelivered because a fixed budget ran out first. The default:
    /// [`read_deadline`](Store::read_deadline).
    fn write_deadline(&self) -> Duration {
        self.read_deadline()
    }

    /// How many independent failure domains the store has: 1 unless its
    /// keys live on separate servers that fail separately (the nodes of a
    /// Redis Cluster). The cache keeps one store circuit breaker per domain,
    /// so one failed node does not cut every key off from the store. The
    /// default: 1.
    fn failure_domains(&self) -> usize {
        1
    }

    /// The failure domain `key` (or a channel) lives in, below
    /// [`failure_domains`](Store::failure_domains). The default: 0.
    fn failure_domain(&self, key: &[u8]) -> usize {
        let _ = key;
        0
    }

    // --- leases and fenced writes ---

    /// Takes the lease `lease_key` for `ttl` if nobody holds it (`SET NX PX`),
    /// recording `token` as its holder: [`LeaseAttempt::Acquired`].
    ///
    /// Idempotent for one token: if `token` already holds the lease (a
    /// retried call whose first attempt ran but whose reply was lost), it is
    /// `Acquired` again, with its TTL left as it was.
    ///
    /// If someone else holds it, the call marks the lease as *waited on*
    /// (atomically with the attempt), so the holder's
    /// [`fenced_set`](Store::fenced_set) knows a waiter would like the value
    /// in the notice (see [`FencedWrite::value_notice`]), and reports how long
    /// the lease has left: a waiter tries again when it runs out, so a dead
    /// holder is replaced as soon as its lease expires.
    fn acquire_lease<'a>(
        &'a self,
        lease_key: &'a [u8],
        token: &'a [u8],
        ttl: Duration,
    ) -> StoreFuture<'a, LeaseAttempt>;

    /// Whether someone holds the lease `lease_key` (unexpired). For
    /// inspection; the request path never calls it.
    fn lease_held<'a>(&'a self, lease_key: &'a [u8]) -> StoreFuture<'a, bool>;

    /// Resets the lease's TTL to `ttl` if `token` still holds it
    /// (compare-and-pexpire). `false` means the lease was lost.
    fn extend_lease<'a>(
        &'a self,
        lease_key: &'a [u8],
        token: &'a [u8],
        ttl: Duration,
    ) -> StoreFuture<'a, bool>;

    /// Deletes the lease if `token` still holds it (compare-and-delete) and
    /// then publishes `notice` on its channel, atomically. `true` if released.
    fn release_lease<'a>(
        &'a self,
        lease_key: &'a [u8],
        token: &'a [u8],
        notice: Notice<'a>,
    ) -> StoreFuture<'a, bool>;

    /// The leader's write: only if `write.token` still holds `write.lease_key`,
    /// sets the value with its TTL, deletes the lease and publishes the
    /// notice, all atomically. `false` (and nothing written) if the lease was
    /// lost, e.g. revoked by [`invalidate`](Store::invalidate).
    fn fenced_set<'a>(&'a self, write: FencedWrite<'a>) -> StoreFuture<'a, bool>;

    /// A write that is not a load's (`Cache::set`): revokes the lease
    /// `lease_key` (so a load that started before cannot write its older
    /// result over this value), sets the value with its TTL and publishes
    /// `notice`, as one step: atomically, or at least in that order with
    /// nothing between that a fill could slip into (a Redis Cluster sends
    /// the three commands as one pipeline on one connection).
    fn replace<'a>(
        &'a self,
        key: &'a [u8],
        value: &'a [u8],
        ttl: Duration,
        lease_key: &'a [u8],
        notice: Notice<'a>,
    ) -> StoreFuture<'a, ()>;

    /// Deletes a value and its lease together and publishes `notice`, so a
    /// load that started before cannot write its result back.
    fn invalidate<'a>(
        &'a self,
        key: &'a [u8],
        lease_key: &'a [u8],
        notice: Notice<'a>,
    ) -> StoreFuture<'a, ()>;

    /// Makes the entry under `key` stale without removing it (a soft
    /// invalidation, `Cache::expire`): revokes the lease `lease_key` (a load
    /// that started before cannot write over it), then, if `key` holds an
    /// entry (the envelope's magic `BW`, format version 1 or 2), lowers its
    /// `fresh_until` (header bytes 5..13, big-endian store-clock ms) to
    /// `at_ms` (but not past its `stale_until`, bytes 13..21), or, if it is
    /// not above that already, by 1 ms: the bytes always change, so a
    /// version transition's entry pinned beside them is revoked too. Its TTL
    /// and the rest of the bytes stay as they are; then publishes
    /// `notice`. All atomically where the backend can (Redis: one script).
    /// `true` if an entry was there.
    ///
    /// The default invalidates instead (deletes the entry: correct, but
    /// nothing is left to serve stale or to stand in for a failed load).
    fn expire_entry<'a>(
        &'a self,
        key: &'a [u8],
        lease_key: &'a [u8],
        at_ms: u64,
        notice: Notice<'a>,
    ) -> StoreFuture<'a, bool> {
        let _ = at_ms;
        Box::pin(async move {
            self.invalidate(key, lease_key, notice).await?;
            Ok(false)
        })
    }

    /// Moves the generation counter under `key` on, atomically with
    /// publishing `notice`: a counter that holds a generation (decimal
    /// digits, below 2^53, or the `G:H:T` a soft bump left, see
    /// [`expire_generation`](Store::expire_generation)) goes up by one and
    /// holds plain digits (`G+1`: every generation before it a miss); a
    /// missing one, or one that holds anything else, is set to `fresh`.
    /// Its TTL becomes at least `ttl`
    /// (never shortened; a counter without one gets it). Returns the new
    /// generation.
    ///
    /// A cache keeps one counter per tag (`Cache::invalidate_tag`): an entry
    /// records its tags' generations when it is loaded
    /// ([`tag_generations`](Store::tag_generations)), and is valid only
    /// while every counter exists and still holds what it recorded. A lost
    /// counter (evicted under `maxmemory`, deleted, expired, gone in a
    /// failover) never validates anything: a missing counter equals no
    /// generation on the read path, and is created again only with a
    /// `fresh` value, which the cache draws at random from
    /// `[2^40, 2^52)` for each call (from the OS, never from a seed), so
    /// no entry can have recorded it.
    ///
    /// # Counter TTLs
    ///
    /// Counters expire: a tag whose entries are all gone should not keep a
    /// key forever. The cache asks for a TTL longer than any entry the
    /// counter can guard (the longest physical TTL of the write's settings,
    /// `ttl` with its jitter plus `max_stale`, plus its `load_timeout` and a
    /// minute, at least an hour), and every read-or-create and bump can
    /// only lengthen it, so a counter outlives the entries that recorded
    /// it; should it go sooner (evicted), those entries read as misses,
    /// never as valid. Under a `volatile-*` eviction policy counters are
    /// now candidates too.
    fn bump_generation<'a>(
        &'a self,
        key: &'a [u8],
        fresh: u64,
        ttl: Duration,
        notice: Notice<'a>,
    ) -> StoreFuture<'a, u64>;

    /// Several [`bump_generation`](Store::bump_generation)s
    /// (`Cache::invalidate_tags`) with one notice, as few atomic steps as
    /// the backend can (Redis: one script per hash slot, side by side; the
    /// memory store: one). Each step moves its counters on as
    /// `bump_generation` does (a missing or foreign one is set to `fresh`,
    /// each TTL at least `ttl`) and publishes `notice` once. `Err` if any
    /// step may have failed (a batch is safe to send again: an extra bump
    /// only invalidates again).
    ///
    /// The default bumps them one after another, each publishing `notice`.
    fn bump_generations<'a>(
        &'a self,
        keys: &'a [&'a [u8]],
        fresh: u64,
        ttl: Duration,
        notice: Notice<'a>,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            for key in keys {
                self.bump_generation(key, fresh, ttl, notice).await?;
            }
            Ok(())
        })
    }

    /// Moves the generation counter under `key` on softly
    /// (`Cache::expire_tag`), atomically with publishing `notice`: a
    /// counter holding `G` (or `G:H:T`, see below) comes to hold
    /// `G+1:H:at_ms`, its floor `H` kept (`H` is `G` for a counter holding
    /// plain digits); a missing one, or one that holds anything else, is
    /// set to `fresh` (plain digits: nothing recorded it). Its TTL becomes
    /// at least `ttl`, as for [`bump_generation`](Store::bump_generation).
    /// Returns the new generation.
    ///
    /// An entry that recorded a generation from `H` up to (not including)
    /// the counter's current one is then stale from `at_ms` (store-clock
    /// ms) on, not a miss: served stale within grace while one load
    /// refreshes it, and standing in for a failed load within
    /// `max_stale`. One that recorded a generation below `H` (from before
    /// the last [`bump_generation`](Store::bump_generation), which writes
    /// plain digits: `H` becomes the new `G`) is a miss, as is any entry of
    /// a lost counter. Every counter operation reads both forms
    /// ([`tag_generations`](Store::tag_generations) replies `G`).
    ///
    /// The default bumps instead ([`bump_generation`](Store::bump_generation):
    /// every entry of the tag a miss; stricter, never wrong).
    fn expire_generation<'a>(
        &'a self,
        key: &'a [u8],
        fresh: u64,
        ttl: Duration,
        at_ms: u64,
        notice: Notice<'a>,
    ) -> StoreFuture<'a, u64> {
        let _ = at_ms;
        self.bump_generation(key, fresh, ttl, notice)
    }

    /// The generations of the counters under `keys`, in their order,
    /// creating each one that is missing (or holds anything but a
    /// generation) with `fresh`, and making each counter's TTL at least
    /// `ttl` (never shortened; a counter without one gets it). Atomic per
    /// counter (Redis: one script; a Cluster: one script per hash slot).
    ///
    /// The write path's read: an entry only ever records generations of
    /// counters that exist (see [`bump_generation`](Store::bump_generation)).
    /// The read path checks them with a plain [`get`](Store::get) or
    /// [`get_many`](Store::get_many), where a missing counter invalidates.
    fn tag_generations<'a>(
        &'a self,
        keys: &'a [&'a [u8]],
        fresh: u64,
        ttl: Duration,
    ) -> StoreFuture<'a, Vec<u64>>;

    /// The states of the counters under `keys`, in their order, as a write
    /// of tags a loader chose after its load needs them (`Loaded::tags`):
    /// each reply the counter's state as stored, `G:H:T:F` (generation,
    /// floor, last soft bump's store-clock ms or 0, and `F`: the
    /// store-clock ms of its last hard change), after the call made it so.
    /// A missing counter (or one holding anything but a state) is created
    /// as `fresh:fresh:0:now_ms`; one whose `F` is unknown (plain digits
    /// `G`, or `G:H:T`: a hard bump writes plain digits) gets `F = now_ms`,
    /// its generation kept. "Now" is never earlier than the store's own
    /// clock when the call runs (Redis: `TIME` in the script): a call run
    /// late, after a reconnect or a timeout, must not date a change before
    /// it. Each counter's TTL becomes at least `ttl`, as
    /// for [`tag_generations`](Store::tag_generations). Atomic per counter
    /// (Redis: one script; a Cluster: one per hash slot).
    ///
    /// The tags are known only once the value is loaded, so their counters
    /// are read after the load; a counter whose `F` is not before the
    /// load's start may have been invalidated (or lost and started again)
    /// while the value was loaded, and the value is then served but not
    /// written. The other parts of the counter are what
    /// [`bump_generation`](Store::bump_generation) and
    /// [`expire_generation`](Store::expire_generation) keep: a soft bump
    /// keeps `F`.
    ///
    /// The default replies what [`tag_generations`](Store::tag_generations)
    /// does, plain digits: `F` unknown, so values with tags chosen by their
    /// loader are served and never written. (`now_ms` is `>= 1`.)
    fn tag_states<'a>(
        &'a self,
        keys: &'a [&'a [u8]],
        fresh: u64,
        ttl: Duration,
        now_ms: u64,
    ) -> StoreFuture<'a, Vec<Vec<u8>>> {
        let _ = now_ms;
        Box::pin(async move {
            let generations = self.tag_generations(keys, fresh, ttl).await?;
            Ok(generations
                .into_iter()
                .map(|g| g.to_string().into_bytes())
                .collect())
        })
    }

    /// What `key` holds, or, if it holds nothing, `placeholder`, which is
    /// then written there with `ttl`: atomically where the backend can
    /// (Redis: one script). A version transition pins the previous
    /// version's entry this way before a load, so that a change to it
    /// (even the deletion of an entry that was not there) can be seen
    /// afterwards (see [`FencedWrite::unchanged`]).
    ///
    /// The default reads, then writes the placeholder if nothing was there
    /// (a write landing in between is overwritten: its process loads it
    /// again; nothing wrong is served).
    fn pin<'a>(
        &'a self,
        key: &'a [u8],
        placeholder: &'a [u8],
        ttl: Duration,
    ) -> StoreFuture<'a, Vec<u8>> {
        Box::pin(async move {
            if let Some(held) = self.get(key).await? {
                return Ok(held);
            }
            self.set(key, placeholder, ttl).await?;
            Ok(placeholder.to_vec())
        })
    }

    /// The lease holder's renewal of an entry its load found unchanged (a
    /// loader's "not modified"), without sending the entry again: only if
    /// `renewal.token` still holds `renewal.lease_key` and the value under
    /// `renewal.key` holds `renewal.expected` at `renewal.offset`, writes
    /// `renewal.patch` at that offset, resets the key's TTL to
    /// `renewal.ttl`, deletes the lease and publishes the notice, all
    /// atomically ([`Renewal::Renewed`]). A lease no longer held changes
    /// nothing ([`Renewal::Refused`], as a refused [`fenced_set`](Store::fenced_set)).
    /// A value that does not hold `expected` there (gone, evicted,
    /// rewritten) changes nothing and keeps the lease
    /// ([`Renewal::Declined`]): the holder writes the whole entry instead.
    ///
    /// The default declines, so a backend without it writes whole entries
    /// and stays correct.
    fn fenced_renew<'a>(&'a self, renewal: FencedRenewal<'a>) -> StoreFuture<'a, Renewal> {
        let _ = renewal;
        Box::pin(async { Ok(Renewal::Declined) })
    }

    // --- namespace clear ---

    /// Records one clear of a namespace in its clear record under
    /// `clear.key` and publishes it, atomically (Redis: one script): the
    /// record is read (none, or foreign bytes, counts as none), advanced
    /// by the rule every backend shares (hard or soft over
    /// `clear.window_ms`, made at the store's clock; a first record starts
    /// at `clear.fresh`; see the module `store::namespace`), written back
    /// without a TTL, and `clear.notice.message` followed by the new record
    /// published on `clear.notice.channel`. Returns the new record and how
    /// many subscribers the message reached (Redis: `PUBLISH`'s count,
    /// on a Cluster the receiving node's), so the caller can wait for
    /// each to acknowledge it. A [pin](NamespaceClear::pin) is written
    /// only over no record (or foreign bytes); a record held is returned
    /// as it is, with nothing written or published.
    ///
    /// The default reads, then writes, then publishes: two clears at once
    /// may lose one (a backend that can should do it atomically). It
    /// counts one subscriber.
    fn clear_namespace<'a>(
        &'a self,
        clear: NamespaceClear<'a>,
    ) -> StoreFuture<'a, ClearedNamespace> {
        Box::pin(async move {
            let held = self.get(clear.key).await?;
            let held = held.as_deref().and_then(NamespaceState::parse);
            let (state, applied) = NamespaceState::applied(held, clear.rule(), self.now_ms());
            let record = state.encode();
            if applied != Applied::Kept {
                self.set(clear.key, &record, Duration::from_millis(MAX_STORE_TTL_MS))
                    .await?;
            }
            if applied != Applied::Published {
                return Ok(ClearedNamespace {
                    record,
                    receivers: 0,
                });
            }
            let message = [clear.notice.message, &record].concat();
            self.publish(clear.notice.channel, &message).await?;
            Ok(ClearedNamespace {
                record,
                receivers: 1,
            })
        })
    }

    /// A startup check of what this store is (see `breakwater inspect
    /// --check`): facts that decide how a cache behaves on it (Redis: the
    /// eviction policy, the commands its user may run on keys like
    /// `probe` and on `channel`, pub/sub, a Cluster), one [`Finding`]
    /// each. `probe` is a key the cache may write; it is written, then
    /// deleted. The default has nothing to report.
    fn check<'a>(&'a self, probe: &'a [u8], channel: &'a [u8]) -> StoreFuture<'a, Vec<Finding>> {
        let _ = (probe, channel);
        Box::pin(async { Ok(Vec::new()) })
    }

    // --- bus ---

    /// Publishes `message` on `channel` to every subscriber, in every process.
    fn publish<'a>(&'a self, channel: &'a [u8], message: &'a [u8]) -> StoreFuture<'a, ()>;

    /// Subscribes to `channel`. Messages published after the subscription is
    /// [ready](Subscription::ready) are delivered; when some may have been
    /// missed (lag, reconnection) the subscriber is told so.
    fn subscribe(&self, channel: &[u8]) -> Subscription;

    // --- batch ---

    /// Reads many keys at once: one round trip where the backend can (Redis:
    /// one `MGET`; a Cluster: one `MGET` per hash slot, side by side). The
    /// values come back in the order of `keys`, `None` for a missing key.
    ///
    /// The default reads them one after another.
    fn get_many<'a>(&'a self, keys: &'a [&'a [u8]]) -> StoreFuture<'a, Vec<Option<Vec<u8>>>> {
        Box::pin(async move {
            let mut values = Vec::with_capacity(keys.len());
            for key in keys {
                values.push(self.get(key).await?);
            }
            Ok(values)
        })
    }

    /// Several [`acquire_lease`](Store::acquire_lease)s with one TTL, as one
    /// atomic step where the backend can (Redis: one script; a Cluster: one
    /// script per hash slot). Each lease is taken or found held exactly as
    /// by `acquire_lease`; the attempts come back in the order of `leases`.
    ///
    /// The default tries them one after another.
    fn acquire_leases<'a>(
        &'a self,
        leases: &'a [LeaseRequest<'a>],
        ttl: Duration,
    ) -> StoreFuture<'a, Vec<LeaseAttempt>> {
        Box::pin(async move {
            let mut attempts = Vec::with_capacity(leases.len());
            for lease in leases {
                attempts.push(self.acquire_lease(lease.key, lease.token, ttl).await?);
            }
            Ok(attempts)
        })
    }

    /// Several [`replace`](Store::replace)s with one notice per batch, as
    /// few steps as the backend can (Redis: one transaction per 1,024
    /// writes; on a Cluster one pipeline per node, each key revoked before
    /// it is written; the memory store: one). Each step revokes its writes'
    /// leases, writes their values with their TTLs, and publishes on
    /// `notice.channel` one message, [`Notice::for_keys`] of its keys
    /// (`notice.message` is the head every such message starts with).
    /// `Err` if any write may have failed (a batch is safe to send again:
    /// each write is idempotent).
    ///
    /// The default runs them one after another, each a `replace` that
    /// publishes the message of its key alone.
    fn replace_many<'a>(
        &'a self,
        writes: &'a [Replace<'a>],
        notice: Notice<'a>,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            for w in writes {
                let message = notice.for_keys([w.key]);
                let single = notice.with_message(&message);
                self.replace(w.key, w.value, w.ttl, w.lease_key, single)
                    .await?;
            }
            Ok(())
        })
    }

    /// Several [`invalidate`](Store::invalidate)s with one notice per
    /// batch, as few steps as the backend can (Redis: one transaction per
    /// 1,024 keys; on a Cluster one pipeline per node, each key's lease
    /// revoked before it is deleted; the memory store: one). Each step
    /// deletes its keys and their leases and publishes on `notice.channel`
    /// one message, [`Notice::for_keys`] of its keys. `Err` if any step may have failed (a batch is safe to send
    /// again).
    ///
    /// The default runs them one after another, each an `invalidate` that
    /// publishes the message of its key alone.
    fn invalidate_many<'a>(
        &'a self,
        keys: &'a [Invalidate<'a>],
        notice: Notice<'a>,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            for k in keys {
                let message = notice.for_keys([k.key]);
                self.invalidate(k.key, k.lease_key, notice.with_message(&message))
                    .await?;
            }
            Ok(())
        })
    }

    /// Whether reads of distinct keys that meet while this store is busy
    /// may go out together as one [`get_many`](Store::get_many) (one `MGET`
    /// on Redis) instead of one [`get`](Store::get) each. Only worth it
    /// where a batch costs much less than its reads one by one; `false` by
    /// default. A cache never delays a read for this while the store is
    /// idle. The same goes for concurrent writes ([`replace`](Store::replace)
    /// calls meeting as one [`replace_many`](Store::replace_many)).
    fn batches_reads(&self) -> bool {
        false
    }
}

/// One write of [`Store::replace_many`]: the arguments of
/// [`Store::replace`].
#[derive(Debug, Clone, Copy)]
pub struct Replace<'a> {
    /// Where the value goes.
    pub key: &'a [u8],
    /// The encoded entry.
    pub value: &'a [u8],
    /// The value's TTL.
    pub ttl: Duration,
    /// The lease revoked with the write.
    pub lease_key: &'a [u8],
}

/// One key of [`Store::invalidate_many`]: the arguments of
/// [`Store::invalidate`] but the notice.
#[derive(Debug, Clone, Copy)]
pub struct Invalidate<'a> {
    /// The value to delete.
    pub key: &'a [u8],
    /// Its lease, deleted with it.
    pub lease_key: &'a [u8],
}

/// One fact a startup check found ([`Store::check`],
/// `Cache::check`): a topic, whether it is as breakwater expects, and
/// what it means for the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// What was checked (`maxmemory-policy`, `permissions`, `pub/sub`,
    /// `cluster`, `l1`).
    pub topic: &'static str,
    /// As breakwater expects (`false`: worth an operator's look).
    pub ok: bool,
    /// What was found and what the cache does about it.
    pub detail: String,
}

impl Finding {
    /// A finding that is as expected.
    pub fn ok(topic: &'static str, detail: impl Into<String>) -> Finding {
        Finding {
            topic,
            ok: true,
            detail: detail.into(),
        }
    }

    /// A finding worth an operator's look.
    pub fn warn(topic: &'static str, detail: impl Into<String>) -> Finding {
        Finding {
            topic,
            ok: false,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mark = if self.ok { "ok  " } else { "WARN" };
        write!(f, "{mark} {}: {}", self.topic, self.detail)
    }
}

/// One clear of a namespace; see [`Store::clear_namespace`].
#[derive(Debug, Clone, Copy)]
pub struct NamespaceClear<'a> {
    /// The namespace's clear record.
    pub key: &'a [u8],
    /// Hard (entries before it are a miss), or soft (stale once their
    /// moment in the window has come).
    pub hard: bool,
    /// A soft clear's spread window, in milliseconds.
    pub window_ms: u64,
    /// Where a new record starts: drawn at random from `[2^40, 2^52)`.
    pub fresh: u64,
    /// Not a clear but a pin (see `store::namespace`): made only if the
    /// key holds no record, and then published, a record that clears
    /// nothing and adopts every entry a lost record left (`hard` and
    /// `window_ms` are not read); a record held is returned as it is, and
    /// nothing is written or published (0 receivers).
    pub pin: bool,
    /// With `pin`: instead of a new pin, the record a process knew, put
    /// back as it was if the key holds none (written, not published: it
    /// changes nothing anyone knew). Bytes that are not a record count as
    /// none given.
    pub restore: Option<&'a [u8]>,
    /// Published with the new record appended to its message.
    pub notice: Notice<'a>,
}

impl<'a> NamespaceClear<'a> {
    /// The fields the record's rule reads.
    pub(crate) fn rule(&self) -> Clear<'a> {
        Clear {
            pin: self.pin,
            restore: self.restore,
            hard: self.hard,
            window_ms: self.window_ms,
            fresh: self.fresh,
        }
    }
}

/// What [`Store::clear_namespace`] made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClearedNamespace {
    /// The namespace's new clear record, as stored.
    pub record: Vec<u8>,
    /// How many subscribers the notice reached.
    pub receivers: u64,
}

/// One lease of [`Store::acquire_leases`].
#[derive(Debug, Clone, Copy)]
pub struct LeaseRequest<'a> {
    /// The lease key.
    pub key: &'a [u8],
    /// The would-be holder's token.
    pub token: &'a [u8],
}

/// What [`Store::acquire_lease`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseAttempt {
    /// The caller's token holds the lease.
    Acquired,
    /// Someone else holds it, for `ttl` more (unless extended).
    Held {
        /// The lease's remaining time to live.
        ttl: Duration,
    },
}

impl LeaseAttempt {
    /// `true` for [`Acquired`](LeaseAttempt::Acquired).
    pub fn is_acquired(self) -> bool {
        self == LeaseAttempt::Acquired
    }
}

/// A message to publish on a channel as part of another operation.
#[derive(Debug, Clone, Copy)]
pub struct Notice<'a> {
    /// The channel.
    pub channel: &'a [u8],
    /// The message.
    pub message: &'a [u8],
    /// How this notice may go out together with other keys' notices (of
    /// one key's write; `None`: only as it is): one message on the channel
    /// of this head and then each key ([`Notice::for_keys`]), where every
    /// notice in it has this channel and head. A store may send it so
    /// (a Redis Cluster does for concurrent `replace`s, whose `PUBLISH`es
    /// every node would otherwise forward one by one), or ignore it.
    pub batch_head: Option<&'a [u8]>,
}

impl<'a> Notice<'a> {
    /// This notice's channel with `message` instead.
    pub(crate) fn with_message<'m>(&self, message: &'m [u8]) -> Notice<'m>
    where
        'a: 'm,
    {
        Notice {
            channel: self.channel,
            message,
            batch_head: None,
        }
    }

    /// The message a batch operation ([`Store::replace_many`]) publishes
    /// about `keys`: this notice's message, then each key as its length
    /// (4 bytes, big-endian) and its bytes.
    ///
    /// # Panics
    ///
    /// If a key is 4 GiB or longer (no store takes such a key).
    pub fn for_keys<'k>(&self, keys: impl IntoIterator<Item = &'k [u8]>) -> Vec<u8> {
        let mut message = self.message.to_vec();
        for key in keys {
            let len = u32::try_from(key.len()).expect("a key under 4 GiB");
            message.extend_from_slice(&len.to_be_bytes());
            message.extend_from_slice(key);
        }
        message
    }
}

/// The leader's fenced write; see [`Store::fenced_set`].
#[derive(Debug, Clone, Copy)]
pub struct FencedWrite<'a> {
    /// Where the value goes.
    pub key: &'a [u8],
    /// The encoded entry.
    pub value: &'a [u8],
    /// The value's TTL.
    pub ttl: Duration,
    /// The lease that must still be held.
    pub lease_key: &'a [u8],
    /// The holder's token.
    pub token: &'a [u8],
    /// Published after a successful write.
    pub notice: Notice<'a>,
    /// A message to publish instead of `notice.message`, with `value`
    /// appended, if some [`acquire_lease`](Store::acquire_lease) found the
    /// lease held while this holder had it: waiters elsewhere then get the
    /// value with their wake-up and need not read it back. `None` (say, for a
    /// large value) always publishes `notice.message`.
    pub value_notice: Option<&'a [u8]>,
    /// A second condition: the write happens only if this key also still
    /// holds exactly these bytes (a version transition: the previous
    /// version's entry the value was loaded beside, see
    /// [`pin`](Store::pin)). When it does not, the write is refused as for a
    /// lost lease: the lease is released, `notice` published, `false`
    /// returned. The key shares the value's hash slot.
    pub unchanged: Option<Unchanged<'a>>,
}

/// A lease holder's renewal of an unchanged entry; see
/// [`Store::fenced_renew`].
#[derive(Debug, Clone, Copy)]
pub struct FencedRenewal<'a> {
    /// The entry's key.
    pub key: &'a [u8],
    /// Where in the stored value `expected` is compared and `patch`
    /// written.
    pub offset: usize,
    /// What the stored value must hold at `offset`: the entry as the holder
    /// read it.
    pub expected: &'a [u8],
    /// What is written at `offset` (never longer than `expected`).
    pub patch: &'a [u8],
    /// The key's new TTL.
    pub ttl: Duration,
    /// The lease that must still be held.
    pub lease_key: &'a [u8],
    /// The holder's token.
    pub token: &'a [u8],
    /// Published after a renewal, or (the lease deleted) a refusal of the
    /// entry's bytes; see [`Store::fenced_renew`].
    pub notice: Notice<'a>,
}

/// What [`Store::fenced_renew`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Renewal {
    /// Patched, its TTL reset, the lease released and the notice sent.
    Renewed,
    /// The lease was no longer held: nothing changed.
    Refused,
    /// The stored value did not hold what was expected (or the backend
    /// cannot renew): nothing changed, and the lease is still held.
    Declined,
}

/// The condition of a [`FencedWrite::unchanged`]: `key` holds `bytes`.
#[derive(Debug, Clone, Copy)]
pub struct Unchanged<'a> {
    /// The key, in the written value's hash slot.
    pub key: &'a [u8],
    /// What it must hold (never empty).
    pub bytes: &'a [u8],
}

/// What a [`Subscription`] receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// A published message.
    Message(Arc<[u8]>),
    /// Some messages may have been lost (the subscriber lagged, or the
    /// connection dropped and came back); anything waiting should re-check.
    Missed,
}

/// A live subscription to one channel; see [`Store::subscribe`].
///
/// Dropping it unsubscribes this receiver.
pub struct Subscription {
    messages: broadcast::Receiver<Delivery>,
    ready: watch::Receiver<bool>,
    /// Starts the store's feed of this channel again if the task that
    /// runs it is stranded on an idle runtime (`RedisStore`); with `true`,
    /// whatever that task's promises say.
    keeper: Option<Arc<dyn Fn(bool) + Send + Sync>>,
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("ready", &self.is_ready())
            .finish_non_exhaustive()
    }
}

impl Subscription {
    /// Wraps a broadcast of deliveries and a readiness flag; for [`Store`]
    /// implementations.
    pub fn new(messages: broadcast::Receiver<Delivery>, ready: watch::Receiver<bool>) -> Self {
        Subscription {
            messages,
            ready,
            keeper: None,
        }
    }

    /// The same, with `keeper`, which the subscriber calls now and then
    /// from its own runtime (see [`keep_alive`](Self::keep_alive)).
    pub(crate) fn kept_by(mut self, keeper: Arc<dyn Fn(bool) + Send + Sync>) -> Self {
        self.keeper = Some(keeper);
        self
    }

    /// Called by the subscriber now and then (a cache's listener: twice a
    /// second), from a runtime that runs: a store whose feed of the channel
    /// runs on a task stranded on an idle runtime starts it again here.
    pub(crate) fn keep_alive(&self) {
        if let Some(keeper) = &self.keeper {
            keeper(false);
        }
    }

    /// Has the store feed this channel from a new task on the caller's
    /// runtime, whatever the one feeding it now promised (a subscriber that
    /// found its own task stranded cannot trust the feed it shared that
    /// runtime with): until the new one is subscribed, the subscription is
    /// not ready.
    pub(crate) fn renew(&self) {
        if let Some(keeper) = &self.keeper {
            keeper(true);
        }
    }

    /// `true` while the subscription is established at the store.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Waits until the subscription is established, at most `timeout`.
    /// `true` if it is.
    pub async fn ready(&mut self, timeout: Duration) -> bool {
        matches!(
            tokio::time::timeout(timeout, self.ready.wait_for(|r| *r)).await,
            Ok(Ok(_))
        )
    }

    /// The next delivery; `None` once the store has shut the channel down.
    pub async fn recv(&mut self) -> Option<Delivery> {
        match self.messages.recv().await {
            Ok(delivery) => Some(delivery),
            Err(broadcast::error::RecvError::Lagged(_)) => Some(Delivery::Missed),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }
}

/// FNV-1a, 64 bit: a stable hash of key bytes, for choosing a memory shard
/// and a Redis Cluster hash tag (it never identifies a key).
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Lowers the `fresh_until` of the entry `bytes` to `at_ms` (but not
/// past its `stale_until`), in place, as [`Store::expire_entry`] describes;
/// `false` if `bytes` is no entry of format version 1 or 2.
pub(crate) fn expire_in_place(bytes: &mut [u8], at_ms: u64) -> bool {
    if bytes.len() < 21 || bytes[..2] != *b"BW" || !matches!(bytes[2], 1 | 2) {
        return false;
    }
    let read = |at: usize| {
        let mut word = [0; 8];
        word.copy_from_slice(&bytes[at..at + 8]);
        u64::from_be_bytes(word)
    };
    let (fresh_until, stale_until) = (read(5), read(13));
    let at = at_ms.min(stale_until);
    // Stale already: a millisecond earlier, so the bytes change all the
    // same (a version transition pinned beside them hears it).
    let moved = if fresh_until > at {
        at
    } else {
        fresh_until.saturating_sub(1)
    };
    bytes[5..13].copy_from_slice(&moved.to_be_bytes());
    true
}

/// The longest TTL a store is asked for, in ms: 10 years. Longer ones are
/// cut to it: Redis refuses a `PX` that overflows its clock ("invalid expire
/// time"), and an instant that far out would overflow. The cache's own TTLs
/// (each window at most 365 days) never come near it.
pub(crate) const MAX_STORE_TTL_MS: u64 = 10 * 365 * 24 * 3600 * 1000;

/// Converts a TTL to whole milliseconds, rejecting anything below 1 ms and
/// saturating at [`MAX_STORE_TTL_MS`].
pub(crate) fn ttl_millis(ttl: Duration) -> Result<u64, Error> {
    let ms = crate::clock::millis(ttl);
    if ms == 0 {
        return Err(crate::error::ConfigError::new(format!(
            "store TTL must be at least 1ms, got {ttl:?}"
        ))
        .into());
    }
    Ok(ms.min(MAX_STORE_TTL_MS))
}

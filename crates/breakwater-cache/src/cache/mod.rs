//! The [`Cache`] handle's public calls, and the story of one request.
//!
//! # The steps of one `get_or_load(key, loader)`
//!
//! Numbered here and nowhere else; everywhere else a step is called by its
//! name.
//!
//! 1. **Key**: validated and namespaced; a bad key never reaches L1 or the
//!    store.
//! 2. **Near cache**: with an L1 ([`L1Config`](crate::L1Config)), a fresh
//!    local copy is returned here, before anything else is built (an early
//!    refresh is judged on it as on a stored entry).
//! 3. **Read**: one `GET` of the envelope, shared by the callers of the key
//!    in this process. Corrupt or foreign bytes are a miss plus a warning; a
//!    store failure is a miss plus a warning too: an L1 copy stands in if
//!    there is one; else a store that cannot be used (its breaker open, no
//!    connection) degrades to direct loads instead of failing requests,
//!    while one that timed out (slow, not gone) still goes through the
//!    lease (fill). An entry written with tags is checked against its tags'
//!    generations (read in the entry's `MGET` when the call names its
//!    tags, else one more round trip; see `tags`); one whose tag was
//!    invalidated is a miss. When nothing is stored, the shared read goes
//!    straight on to the fill, and its callers get the load's outcome.
//! 4. **Verdict**: the entry judged on the store's clock: fresh (served),
//!    due for an early refresh (served, one refresh in the background),
//!    stale within grace (served while one refresh runs), stale past grace
//!    (the fail-safe stand-in of the load that follows), or nothing.
//! 5. **Fill**: callers in this process share one flight
//!    ([`SingleFlight`](crate::flight::SingleFlight)); the flight takes the
//!    key's lease in the store so one process in the fleet loads. Without
//!    the lease it waits to be woken by the holder's "filled" message (with
//!    jittered polling as a fallback) up to `lock_wait`, then follows
//!    [`OnLockTimeout`]. A waiter marks the lease as waited on, and the
//!    holder's message then carries the stored entry (up to 16 KiB), so
//!    woken waiters do not read it back.
//! 6. **Load**: the loader runs in its own task under the origin's
//!    breaker, bulkhead and retries, within `load_timeout`, the lease
//!    extended while it runs; `Ok(None)` becomes a negative entry.
//! 7. **Seal and fenced write**: the entry is sealed with a jittered TTL
//!    (and the size cap) and written only if the lease is still ours (an
//!    invalidation revokes it), the lease released and "filled" published,
//!    atomically. A failed write is logged; the callers still get the
//!    loaded value.
//! 8. **Settle**: each caller's outcome: the value (loaded, or coalesced
//!    for a follower), else a stand-in for a failed load (the stale entry,
//!    the L1 copy, the fallback), else the error.
//!
//! `get` is steps 1 to 4 without a load; `get_many` takes the same steps
//! for many keys at once (`batch`).
//!
//! # Rooms
//!
//! One file per step, and calls run one way: from the public calls down
//! through the steps in their order, never back up (the layering is
//! checked by `tests/layers.rs`).
//!
//! | file | holds | may use |
//! |---|---|---|
//! | `mod.rs` | the public calls and their docs | every room below |
//! | `per_call.rs` | [`CacheEntry`]: one call with its own settings | `pipeline`, `invalidate` |
//! | `pipeline.rs` | `fetch` (steps 1–2 and the count), `pipeline` (steps 3–8, in passes) and `refresh` (a forced fill) | `read`, `lookup` (for `get`), `verdict`, `fill`, `seal`, `trace` |
//! | `batch/` | `get_many`: the same steps for many keys | `pipeline`'s pass rules (`cooperate`, `revoked_before`, the count), `read`'s near cache, and the rooms below them |
//! | `warm.rs`, `inspect.rs` | warming and inspecting entries (public calls of their own) | the public calls, `pipeline`, `fill`, `lookup`, `verdict` |
//! | `read.rs` | near cache (2) and shared store reads (3), which hand a miss to the fill | `lookup`, `verdict`, `fill` |
//! | `invalidate.rs` | `set`, `set_many`, `invalidate`, `expire`, `invalidate_tag`, `expire_tag`: the fence and its delivery | `seal`, `lookup`, `transition`, `trace` |
//! | `fill.rs` | the fill, the load's task, the fenced write and settle (5–8) | `lease`, `lookup`, `verdict`, `seal`, `transition` |
//! | `verdict.rs` | the one judgment on a stored entry or an L1 copy (4): decode, fresh, early refresh, grace, stand-in | `seal`, `transition`, `handle` and the ground floor |
//! | `seal.rs` | sealing (7) and keeping values in L1 | `handle` and the ground floor |
//! | `lookup.rs` | one store read of a key: queued, beside the previous version, tags checked, judged by the clear record | `verdict`, `queue`, `tags`, `clear` |
//! | `clear.rs` | [`Cache::clear`], the clear record each read is judged by, and the generation each write records | `record`, `handle` and the ground floor |
//! | `transition.rs` | the previous version's entries during a version transition | `handle` and the ground floor |
//! | `trace.rs` | the calls' spans | `handle` and the ground floor |
//! | `builder.rs` | [`CacheBuilder`]: settings checked once, the parts assembled | `handle` and the ground floor |
//! | `handle.rs` | the [`Cache`] type (its docs: the coherence contract) and `CacheCore` | the ground floor |
//! | ground floor | `value` (the `Value` and `Load` bounds), `loaded` (a context loader's [`LoadContext`] and [`Loaded`]), `keys`, `lease` ([`LeaseConfig`]), `options`, `tags` (what a tag is), `coherence` (flights, L1, epochs), `record` (the clear record as a process knows it), `notify` (the bus), `guard` and `queue` (the store behind its breaker, batched reads), `origin`, `throttle`, `settings` | the crate's policies (`breaker`, `limit`, `retry`, `flight`, `l1`, `freshness`, `entry`, `codec`), `store`, `metrics`, and the crate's utilities (`error`, `served`, `clock`, `background`, `log_limit`) |
//!
//! # Vocabulary
//!
//! - **fetch**: a whole call: near cache, then the pipeline (`fetch`,
//!   `fetch_many`); a **pass** is one trip through the pipeline (a call
//!   whose load turned out revoked takes another, at most three).
//! - **read**: a store read (`lookup::read`), shared by the callers of a
//!   key (`read_shared`, led by `read_led`).
//! - **judge**: the verdict on an entry (`judge`, `judge_entry`).
//! - **fill**: a key's flight: take the lease, load, write (`fill`,
//!   `fill_many`); `join_fill` joins or starts one, `wait_for_fill` and
//!   `await_fill` wait for its outcome.
//! - **lead**: the lease holder's part of a fill (`lead`, `lead_many`,
//!   `lead_taken`, `lead_chunk`).
//! - **load**: a call of the loader through the origin: `load_batch` (one
//!   batch loader call), `load_unwritten` (loaded, not written),
//!   `load_direct` and `load_direct_many` (the store cannot be used),
//!   `load_unleased` (many keys whose leases could not be tried).
//! - **seal**: an entry encoded for the store, with its TTL (`seal`,
//!   `seal_tagged`).
//! - **keep**: a value put in L1 (`keep_read`, `keep_written`,
//!   `keep_unwritten`, all through `keep_near`).
//! - **renew**: a "not modified" answer's write: the stored entry's
//!   windows renewed in place through the fence (`renew`).
//! - **settle**: a flight's outcome for one caller (`settle`).
//! - **deliver**: an invalidation sent, retried for a second, each
//!   attempt bounded by the store's write deadlines (`deliver`).

mod batch;
mod builder;
mod check;
mod chosen;
mod clear;
mod coherence;
mod fill;
mod guard;
mod handle;
mod inspect;
mod invalidate;
mod keys;
mod lease;
mod loaded;
mod lookup;
mod notify;
mod options;
mod origin;
mod per_call;
mod pipeline;
mod queue;
mod read;
mod record;
mod seal;
mod settings;
mod tags;
mod throttle;
mod trace;
mod transition;
mod value;
mod verdict;
mod warm;

pub use batch::CacheEntries;
pub use builder::CacheBuilder;
pub(crate) use builder::default_store_breaker;
pub use clear::{CLEAR_ACKED_WITHIN, ClearMode};
pub use handle::Cache;
pub use inspect::{EntryView, Inspection, Stored};
pub use lease::{LeaseConfig, OnLockTimeout};
pub use loaded::{LoadContext, Loaded, StaleValue};
pub use origin::{Origin, OriginBuilder};
pub use per_call::CacheEntry;
pub use settings::Settings;
pub use value::Value;
pub use warm::{Warm, WarmReport};

use std::error::Error as StdError;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use crate::breaker::BreakerState;
use crate::entry::Extra;
use crate::error::Error;
use crate::key::CacheKey;
use crate::metrics::Stats;
use crate::served::Fetched;
use crate::store::Store;
use read::Near;
use trace::{Op, record_error, record_failure};
use transition::Pinned;
use value::WithContext;

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
    /// [`InvalidKey`](crate::ErrorKind::InvalidKey) for an empty or over-long key,
    /// [`Store`](crate::ErrorKind::Store) if the store fails.
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

    /// Stores `value` under `key` with the cache's jittered TTL.
    ///
    /// Like [`invalidate`](Self::invalidate), it revokes any load of `key`
    /// in flight (in one store step with the write, the revocation first),
    /// so an older load cannot overwrite it, and once it has returned no
    /// caller in this process gets a value loaded before it.
    ///
    /// A lone `set` goes straight to the store (one script run on Redis; on
    /// a Cluster the script's commands as one pipeline). Concurrent ones
    /// (not on a Cluster) that find a few of this cache's writes in the air
    /// meet in a queue and go out as one batch, as
    /// [`set_many`](Self::set_many)'s steps do (one transaction: one `SREM`
    /// revoking their leases, a `SET … PX` each, one `PUBLISH`), each with its
    /// own TTL, its lease revoked in the same step, and the batch's error
    /// if that fails; a `set` dropped before its batch went out is not
    /// written. One dropped after its write went out may still land, as
    /// any command already sent to Redis does, also after a `set` of the
    /// same key that started later has returned: cancel a request's `set`
    /// and the entry may hold either value until the key is next written
    /// or expires.
    ///
    /// # Errors
    ///
    /// [`InvalidKey`](crate::ErrorKind::InvalidKey), [`Codec`](crate::ErrorKind::Codec) if
    /// the value cannot be serialized, [`TooLarge`](crate::ErrorKind::TooLarge) if
    /// its encoded entry is larger than `max_value_size` (nothing is
    /// written), [`Store`](crate::ErrorKind::Store) if the write fails.
    pub async fn set(&self, key: impl CacheKey, value: &V) -> Result<(), Error> {
        self.set_with(&key.key_bytes(), value, None, &self.inner.defaults)
            .await
    }

    /// [`set`](Self::set) for many keys, with the same guarantees for each
    /// (its lease revoked, so no load that began before lands over it; its
    /// own jittered TTL; other processes told), in steps of up to 1,024
    /// keys and 1 MiB of keys and values (a larger value goes alone, so a
    /// small read beside a bulk write never waits behind megabytes): on
    /// Redis each step is one transaction (`MULTI`, one `SREM`
    /// revoking the leases, a `SET … PX` per key, one `PUBLISH` naming all its keys,
    /// `EXEC`), a few of them in flight at once; on a Cluster one pipeline
    /// of the same commands per node (each key's `SREM` before its `SET`).
    /// The items are taken in at once and sealed in batches of 32,768, each
    /// while the one before is written. Inside a version
    /// transition each key first revokes and pins the previous version's
    /// entry, one key at a time (two round trips per key).
    ///
    /// # Errors
    ///
    /// As [`set`](Self::set); the first batch that fails stops the call
    /// (earlier batches are written, and a failed batch's steps may be;
    /// sending the same items again is safe).
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
        // Taken in at once: an iterator held across the awaits below would
        // keep its closures' borrows in this future, which then no longer
        // passes for `Send` in a spawned task.
        let mut items = items.into_iter().collect::<Vec<_>>().into_iter();
        // The values' windows start now, as a `set`'s do: not after the
        // clear record's read (which may take a store deadline), nor when
        // a later batch is sealed.
        let now = self.inner.store.now_ms();
        // The namespace's clear generation, as a load records it.
        let namespace = Some(self.clear_generation().await?);
        // Each batch is sealed while the one before is being written.
        let mut writing = None;
        loop {
            let sealing = self.seal_many(&mut items, namespace, now);
            let batch = match writing.take() {
                None => sealing.await?,
                Some(written) => {
                    let (written, sealed) = futures_util::future::join(written, sealing).await;
                    written?;
                    sealed?
                }
            };
            if batch.is_empty() {
                return Ok(());
            }
            writing = Some(Box::pin(self.replace_batch(batch)));
        }
    }

    /// The next [`SET_MANY_BATCH`] of `items`, sealed as `set_many` writes
    /// them, their windows from `now`; letting other tasks run every
    /// [`SET_MANY_STEP`] items (the batch before is written meanwhile).
    async fn seal_many<K, I>(
        &self,
        items: &mut I,
        namespace: Option<u64>,
        now: u64,
    ) -> Result<Vec<(Vec<u8>, seal::Sealed)>, Error>
    where
        K: CacheKey,
        I: Iterator<Item = (K, V)>,
    {
        let longest = tags::counter_ttl(&self.inner.defaults);
        let mut batch = Vec::with_capacity(SET_MANY_BATCH);
        for (key, value) in items.by_ref().take(SET_MANY_BATCH) {
            let key = self.key_in_store(&key.key_bytes())?;
            // Inside a version transition, as for `set` (one key at a time).
            let pinned = self.revoke_previous(&key, longest).await?;
            let stamps = pinned.iter().map(Pinned::stamp).collect();
            let sealed = self.seal_tagged(
                &key,
                Some(&value),
                Duration::ZERO,
                &self.inner.defaults,
                stamps,
                now,
                Extra::default().in_namespace(namespace),
            )?;
            batch.push((key, sealed));
            if batch.len() % SET_MANY_STEP == 0 {
                queue::behind_the_woken().await;
            }
        }
        Ok(batch)
    }

    /// Removes `key` and revokes any load in flight for it, so the next read
    /// loads fresh data and a slow load that started before cannot write its
    /// result back.
    ///
    /// A transient store failure is tried again (up to 10 attempts,
    /// jittered, started within 1 s or twice the store's current write
    /// deadline if that is longer, so an attempt that timed out is tried
    /// again: the delete and its notice are idempotent). Each attempt has
    /// 3 of those write deadlines (at least 1 s) to finish, so a slow
    /// Redis that delivers the invalidation late gets it reported as
    /// delivered: the call returns when attempts stop starting, or with an
    /// attempt in the air then, at its end (under 2 s with a fast Redis;
    /// about 10 s on one at the 2 s deadline ceiling; twice that inside a
    /// version transition, two round trips). If none gets through, the error says the
    /// invalidation was not delivered: other processes may serve the old
    /// value until its TTL ends, so the caller should retry it (or fail
    /// the write it belongs to).
    ///
    /// Once it has returned `Ok`, every call in this process that starts
    /// later gets a value loaded after it: loads and shared reads that began
    /// before are detached (their own callers still get their result), and
    /// none of them can put its value into L1 or the store. Other processes
    /// hear of it on the bus; see the coherence contract on [`Cache`].
    ///
    /// # Errors
    ///
    /// [`InvalidKey`](crate::ErrorKind::InvalidKey), or [`Store`](crate::ErrorKind::Store)
    /// if the delete fails.
    pub async fn invalidate(&self, key: impl CacheKey) -> Result<(), Error> {
        let key = key.key_bytes();
        let span = self.span(Op::Invalidate, &key);
        let done = self.invalidate_bytes(&key).instrument(span.clone()).await;
        record_error(&span, &done);
        done
    }

    /// [`invalidate`](Self::invalidate) for many keys (each once), with
    /// the same contract for each, at the cost of a few store steps: on
    /// Redis one transaction per 1,024 keys (one `DEL` of the keys, one
    /// `SREM` revoking their leases, one `PUBLISH` naming them all; on a
    /// Cluster one pipeline of the same commands per node), in batches of 4,096 keys, each delivered (and retried) as a
    /// whole as one `invalidate` is (attempts started within 1 s, each with
    /// its own bound that follows the store's deadlines). A price list, a user's cached views: one call, not one
    /// script, retry loop and notice per key.
    ///
    /// # Errors
    ///
    /// [`InvalidKey`](crate::ErrorKind::InvalidKey) before anything is
    /// sent, or [`Store`](crate::ErrorKind::Store) if a batch was not
    /// delivered (earlier batches were; later ones are not sent): retry
    /// the call, which is safe.
    ///
    /// # Examples
    ///
    /// ```
    /// # use breakwater_cache::Cache;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), breakwater_cache::Error> {
    /// let cache = Cache::<u64>::builder().build()?;
    /// cache.set_many((0..100u64).map(|i| (format!("price:{i}"), i))).await?;
    /// cache.invalidate_many((0..100u64).map(|i| format!("price:{i}"))).await?;
    /// assert_eq!(cache.get("price:7").await?, None);
    /// # Ok(()) }
    /// ```
    pub async fn invalidate_many<K, I>(&self, keys: I) -> Result<(), Error>
    where
        K: CacheKey,
        I: IntoIterator<Item = K>,
    {
        // Taken in at once, as `set_many`'s items are.
        let keys: Vec<Vec<u8>> = keys.into_iter().map(|k| k.key_bytes().to_vec()).collect();
        let Some(first) = keys.first() else {
            return Ok(());
        };
        let span = self.span(Op::Invalidate, first);
        let done = self
            .invalidate_many_bytes(keys)
            .instrument(span.clone())
            .await;
        record_error(&span, &done);
        done
    }

    /// Makes the entry for `key` stale, everywhere at once, without
    /// removing it (a soft invalidation): the next caller is served the old
    /// value as [`Stale`](crate::Served::Stale) within grace while one load
    /// refreshes it (nobody waits for the database), and the old value
    /// still stands in for a failed load within `max_stale` (fail-safe). A
    /// negative entry is never served stale: the next caller loads.
    ///
    /// In the store the entry's fresh window is ended (one script: its
    /// `fresh_until` set to 100 ms before now, so that no process
    /// whose view of the store's clock lags a little sees it fresh), its
    /// lease revoked and the bus told, so every process's L1 drops its
    /// copy and reads the stale entry again. Like
    /// [`invalidate`](Self::invalidate), it is tried again on a transient
    /// failure (attempts started within 1 s), and once it has returned `Ok`:
    ///
    /// - **No load that began before it becomes fresh after it**: its
    ///   fenced write is refused (the lease was revoked), in the store, in
    ///   L1, and for callers of this process that start later.
    /// - **Read your expiry**: in this process, calls that start later get
    ///   the stale value (within grace, with a refresh) or a value loaded
    ///   after it.
    /// - **Elsewhere**: other processes read the store, whose entry is
    ///   stale; their L1 copies are dropped when the bus reaches them (see
    ///   the coherence contract on [`Cache`]).
    ///
    /// What each way of making a value go costs the database: see the
    /// crate docs' "I want to…" table.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use breakwater_cache::{Cache, Served};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), breakwater_cache::Error> {
    /// let cache = Cache::<u64>::builder().grace(Duration::from_secs(10)).build()?;
    /// cache.get_or_load("price:7", || async { Ok::<_, std::io::Error>(Some(100)) }).await?;
    /// cache.expire("price:7").await?;
    /// let next = cache
    ///     .get_or_load_with_meta("price:7", || async { Ok::<_, std::io::Error>(Some(120)) })
    ///     .await?;
    /// // The old price at once, while the new one loads in the background.
    /// assert_eq!(next.value, Some(100));
    /// assert!(matches!(next.served, Served::Stale { .. }));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`InvalidKey`](crate::ErrorKind::InvalidKey), or
    /// [`Store`](crate::ErrorKind::Store) if the store could not be told
    /// (other processes may serve the value as fresh until its TTL ends).
    pub async fn expire(&self, key: impl CacheKey) -> Result<(), Error> {
        let key = key.key_bytes();
        let span = self.span(Op::Expire, &key);
        let done = self.expire_bytes(&key).instrument(span.clone()).await;
        record_error(&span, &done);
        done
    }

    /// Makes every entry written with `tag` (through
    /// [`CacheEntry::tags`](super::CacheEntry::tags)) unreachable, in every
    /// process, at once: one store operation (a generation counter moved
    /// on, with its notice), however many entries carry the tag. Entries
    /// without tags, or with other tags only, are not touched in the store.
    ///
    /// A transient store failure is tried again, as for
    /// [`invalidate`](Self::invalidate) (up to 10 attempts started within 1 s; an
    /// extra bump only invalidates again). If none gets through, the error
    /// says the invalidation was not delivered.
    ///
    /// The counter may be missing (never written, expired, or lost to the
    /// store: evicted under `maxmemory`, deleted): then it starts again at
    /// a random value no entry can have recorded. A lost counter never
    /// makes an entry valid again; every entry that recorded it reads as a
    /// miss from then on, whether or not `invalidate_tag` is called. The
    /// counter expires once no entry can still have recorded it (see the
    /// module docs for its TTL; this call gives it at least the TTL the
    /// cache's default settings ask for).
    ///
    /// Once it has returned `Ok`:
    ///
    /// - **No resurrection**: a load that started before it recorded the
    ///   tag's old generation, so its entry is invalid when it lands; no
    ///   entry of the tag from before is served again, fresh or stale.
    /// - **Read your invalidation**: every call in this process that starts
    ///   later gets a value loaded after it. Entries' tags are known only
    ///   when they are read, so this process's L1 is emptied (if it holds a
    ///   tagged entry at all) and its loads and shared reads in the air are
    ///   detached (their own callers still get their results), for every
    ///   key.
    /// - **Elsewhere**: another process reads the store, which checks every
    ///   tagged entry's generations on each read (in the entry's own round
    ///   trip when the call names its tags; none for an untagged entry). Its L1 is emptied, and its
    ///   flights detached, when the message reaches it: the L1 bound of the
    ///   coherence contract on [`Cache`] holds for tags as for keys. As with
    ///   `invalidate`, a call there that joins a load or shared read
    ///   already in the air before the message arrives gets that flight's
    ///   result.
    ///
    /// # Errors
    ///
    /// [`InvalidKey`](crate::ErrorKind::InvalidKey) for an empty tag or one over
    /// 256 bytes, or [`Store`](crate::ErrorKind::Store) if it was not delivered.
    ///
    /// # Examples
    ///
    /// ```
    /// use breakwater_cache::Cache;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), breakwater_cache::Error> {
    /// let cache = Cache::<String>::builder().build()?;
    /// let name = cache
    ///     .entry("user:7:name")
    ///     .tags(["user:7"])
    ///     .get_or_load(|| async { Ok::<_, std::io::Error>(Some("Ada".to_string())) })
    ///     .await?;
    /// assert_eq!(name.as_deref(), Some("Ada"));
    /// cache.set("motd", &"hello".to_string()).await?; // no tags
    ///
    /// cache.invalidate_tag("user:7").await?;
    /// assert_eq!(cache.get("user:7:name").await?, None);
    /// assert_eq!(cache.get("motd").await?.as_deref(), Some("hello"));
    /// # Ok(()) }
    /// ```
    pub async fn invalidate_tag(&self, tag: impl CacheKey) -> Result<(), Error> {
        let tag = tag.key_bytes();
        let span = self.span(Op::InvalidateTag, &tag);
        let done = self
            .invalidate_tag_bytes(&tag)
            .instrument(span.clone())
            .await;
        record_error(&span, &done);
        done
    }

    /// [`invalidate_tag`](Self::invalidate_tag) for many tags (each once),
    /// with the same contract for each, at the cost of a few store steps:
    /// on Redis one script per hash slot of their counters (one, on a
    /// single server), side by side, each publishing one message, in
    /// batches of 4,096 tags, each delivered (and retried) as a whole as
    /// one `invalidate` is. A user's tags, a catalogue's categories: one call, not one
    /// script, retry loop and notice per tag. Other processes empty their
    /// L1 once for the batch.
    ///
    /// # Errors
    ///
    /// [`InvalidKey`](crate::ErrorKind::InvalidKey) for an empty tag or one
    /// over 256 bytes, before anything is sent, or
    /// [`Store`](crate::ErrorKind::Store) if a batch was not delivered
    /// (earlier batches were; later ones are not sent): retry the call,
    /// which is safe (an extra bump only invalidates again).
    ///
    /// # Examples
    ///
    /// ```
    /// use breakwater_cache::Cache;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), breakwater_cache::Error> {
    /// let cache = Cache::<u64>::builder().build()?;
    /// for (key, tag) in [("price:1", "shoes"), ("price:2", "hats"), ("price:3", "bags")] {
    ///     cache.entry(key).tags([tag]).set(&10).await?;
    /// }
    /// cache.invalidate_tags(["shoes", "hats"]).await?;
    /// assert_eq!(cache.get("price:1").await?, None);
    /// assert_eq!(cache.get("price:2").await?, None);
    /// assert_eq!(cache.get("price:3").await?, Some(10));
    /// # Ok(()) }
    /// ```
    pub async fn invalidate_tags<T, I>(&self, tags: I) -> Result<(), Error>
    where
        T: CacheKey,
        I: IntoIterator<Item = T>,
    {
        let tags: Vec<Vec<u8>> = tags.into_iter().map(|t| t.key_bytes().to_vec()).collect();
        let Some(first) = tags.first() else {
            return Ok(());
        };
        let span = self.span(Op::InvalidateTag, first);
        let done = self
            .invalidate_tags_bytes(&tags)
            .instrument(span.clone())
            .await;
        record_error(&span, &done);
        done
    }

    /// Makes every entry written with `tag` (through
    /// [`CacheEntry::tags`](super::CacheEntry::tags)) stale, in every
    /// process, at once, without removing it (a soft
    /// [`invalidate_tag`](Self::invalidate_tag), as
    /// [`expire`](Self::expire) is a soft [`invalidate`](Self::invalidate)):
    /// the next caller of each such key is served the old value as
    /// [`Stale`](crate::Served::Stale) within grace, counted from this call,
    /// while one load refreshes it, and the old value still stands in for a
    /// failed load within `max_stale` (fail-safe). A negative entry is
    /// never served stale: the next caller loads. Entries without tags, or
    /// with other tags only, are not touched.
    ///
    /// One store operation, however many entries carry the tag: the tag's
    /// counter moves on softly (with its notice), keeping the mark of its
    /// last hard invalidation, so an entry loaded before it reads as stale
    /// from now (less 100 ms, so that no process whose view of the store's
    /// clock lags a little sees it fresh), while one from before the last
    /// `invalidate_tag` stays a miss (see the `tags` module docs). A lost
    /// counter still validates nothing: if it is missing, it starts again
    /// at a random value no entry can have recorded, and every entry of the
    /// tag is a miss. Tried again on a transient failure as `invalidate_tag`
    /// is (attempts started within 1 s; an extra soft bump only expires again).
    ///
    /// Once it has returned `Ok`:
    ///
    /// - **No load that began before it becomes fresh after it**: such a
    ///   load recorded the tag's old generation, so its entry is stale
    ///   when it lands (served within grace, refreshed by the next read).
    /// - **Read your expiry**: in this process, calls that start later get
    ///   the stale value (within grace, with a refresh) or a value loaded
    ///   after it. Entries' tags are known only when they are read, so, as
    ///   for `invalidate_tag`, this process's L1 is emptied (if it holds a
    ///   tagged entry at all) and its loads and shared reads in the air are
    ///   detached, for every key.
    /// - **Elsewhere**: other processes read the store, which judges every
    ///   tagged entry by its tags' counters on each read; their L1s are
    ///   emptied when the message reaches them (see the coherence contract
    ///   on [`Cache`]).
    ///
    /// A store backend without soft bumps
    /// ([`Store::expire_generation`]'s
    /// default) invalidates the tag instead: its entries are misses.
    ///
    /// # Errors
    ///
    /// [`InvalidKey`](crate::ErrorKind::InvalidKey) for an empty tag or one over
    /// 256 bytes, or [`Store`](crate::ErrorKind::Store) if it was not delivered
    /// (other processes may serve the tag's entries as fresh until their
    /// TTLs end).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use breakwater_cache::{Cache, Served};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), breakwater_cache::Error> {
    /// let cache = Cache::<u64>::builder().grace(Duration::from_secs(10)).build()?;
    /// cache
    ///     .entry("price:7")
    ///     .tags(["shop:3"])
    ///     .get_or_load(|| async { Ok::<_, std::io::Error>(Some(100)) })
    ///     .await?;
    ///
    /// cache.expire_tag("shop:3").await?;
    /// let next = cache
    ///     .entry("price:7")
    ///     .tags(["shop:3"])
    ///     .get_or_load_with_meta(|| async { Ok::<_, std::io::Error>(Some(120)) })
    ///     .await?;
    /// // The old price at once, while the new one loads in the background.
    /// assert_eq!(next.value, Some(100));
    /// assert!(matches!(next.served, Served::Stale { .. }));
    /// # Ok(()) }
    /// ```
    pub async fn expire_tag(&self, tag: impl CacheKey) -> Result<(), Error> {
        let tag = tag.key_bytes();
        let span = self.span(Op::ExpireTag, &tag);
        let done = self.expire_tag_bytes(&tag).instrument(span.clone()).await;
        record_error(&span, &done);
        done
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
    /// waiter as a [`Loader`](crate::ErrorKind::Loader) error.
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
    /// [`InvalidKey`](crate::ErrorKind::InvalidKey) for an empty or over-long key,
    /// [`Loader`](crate::ErrorKind::Loader) if the loader failed or panicked,
    /// [`Timeout`](crate::ErrorKind::Timeout) past `load_timeout`,
    /// [`LockTimeout`](crate::ErrorKind::LockTimeout) when another process held the
    /// lease past `lock_wait` and the policy says so,
    /// [`Codec`](crate::ErrorKind::Codec) if the loaded value cannot be serialized.
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
    /// served ([`Served`](crate::Served)).
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

    /// [`get_or_load`](Self::get_or_load) with a loader that decides per
    /// value: it is given a [`LoadContext`] (the value it replaces, if the
    /// cache had one) and answers a [`Loaded`]: the value, or its absence,
    /// with the TTL, jitter, grace or `max_stale` of its own write, or
    /// "do not cache". Choices not made are the call's settings.
    ///
    /// The load is shared as every load is (one per key in this process,
    /// one lease across the fleet), background refreshes and early
    /// refreshes call the same loader, and the settings of the write are
    /// the loader's answer for *this* value: an OAuth token lives as long
    /// as its own `expires_in`, an empty search result 5 seconds, a row
    /// that failed validation not at all.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use breakwater_cache::{Cache, Jitter, LoadContext, Loaded};
    ///
    /// # #[derive(Clone)] struct Token { secret: String, expires_in: Duration }
    /// # async fn fetch_token() -> Result<Token, std::io::Error> {
    /// #     Ok(Token { secret: "s3cr3t".into(), expires_in: Duration::from_secs(3600) })
    /// # }
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), breakwater_cache::Error> {
    /// let cache = Cache::<String>::builder()
    ///     .ttl(Duration::from_secs(300))
    ///     .build()?;
    /// let token = cache
    ///     .get_or_load_with_context("oauth:billing", |_ctx: LoadContext<String>| async {
    ///         let token = fetch_token().await?;
    ///         // As long as the token is valid, never longer.
    ///         Ok::<_, std::io::Error>(
    ///             Loaded::value(token.secret)
    ///                 .ttl(token.expires_in)
    ///                 .jitter(Jitter::down(0.1))
    ///                 .grace(Duration::ZERO),
    ///         )
    ///     })
    ///     .await?;
    /// assert_eq!(token.as_deref(), Some("s3cr3t"));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`get_or_load`](Self::get_or_load), and
    /// [`Config`](crate::ErrorKind::Config) if the loader chose a setting
    /// out of the builder's bounds (a TTL of zero, a grace above
    /// `max_stale`...): then the value is neither served nor written, for
    /// every caller that shared the load.
    pub async fn get_or_load_with_context<F, Fut, E>(
        &self,
        key: impl CacheKey,
        loader: F,
    ) -> Result<Option<V>, Error>
    where
        F: FnOnce(LoadContext<V>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<Loaded<V>, E>> + Send + 'static,
        E: Into<Box<dyn StdError + Send + Sync + 'static>> + 'static,
    {
        let fetched = self
            .fetch(&key.key_bytes(), WithContext(loader), &self.inner.defaults)
            .await?;
        Ok(fetched.value)
    }

    /// [`get_or_load_with_context`](Self::get_or_load_with_context), also
    /// saying how the value was served ([`Served`](crate::Served)).
    ///
    /// # Errors
    ///
    /// As [`get_or_load_with_context`](Self::get_or_load_with_context).
    pub async fn get_or_load_with_context_meta<F, Fut, E>(
        &self,
        key: impl CacheKey,
        loader: F,
    ) -> Result<Fetched<V>, Error>
    where
        F: FnOnce(LoadContext<V>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<Loaded<V>, E>> + Send + 'static,
        E: Into<Box<dyn StdError + Send + Sync + 'static>> + 'static,
    {
        self.fetch(&key.key_bytes(), WithContext(loader), &self.inner.defaults)
            .await
    }

    /// Loads `key` now, whatever is cached (a forced refresh), and writes
    /// the result: under the key's lease, so the fleet still loads it
    /// once (a refresh in another process, or a load of the key already in
    /// the air in this one, is joined, and its value returned as
    /// [`Coalesced`](crate::Served::Coalesced)). Until it lands, every other
    /// caller is still served the value cached before; if the load fails,
    /// that value stays, cached and served, and the error is returned.
    ///
    /// # Examples
    ///
    /// ```
    /// use breakwater_cache::{Cache, Served};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), breakwater_cache::Error> {
    /// let cache = Cache::<u64>::builder().build()?;
    /// cache.get_or_load("rate:eur", || async { Ok::<_, std::io::Error>(Some(108)) }).await?;
    /// // The feed says the rate moved: load it now.
    /// let fresh = cache
    ///     .refresh("rate:eur", || async { Ok::<_, std::io::Error>(Some(109)) })
    ///     .await?;
    /// assert_eq!((fresh.value, fresh.served), (Some(109), Served::Loaded));
    /// assert_eq!(cache.get("rate:eur").await?, Some(109));
    /// // A failed refresh keeps the value.
    /// let failed = cache
    ///     .refresh("rate:eur", || async { Err::<Option<u64>, _>(std::io::Error::other("feed down")) })
    ///     .await;
    /// assert!(failed.is_err());
    /// assert_eq!(cache.get("rate:eur").await?, Some(109));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`get_or_load`](Self::get_or_load).
    pub async fn refresh<F, Fut, E>(
        &self,
        key: impl CacheKey,
        loader: F,
    ) -> Result<Fetched<V>, Error>
    where
        F: FnOnce() -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<Option<V>, E>> + Send + 'static,
        E: Into<Box<dyn StdError + Send + Sync + 'static>> + 'static,
    {
        self.refresh_in_span(&key.key_bytes(), loader).await
    }

    /// [`refresh`](Self::refresh) with a context loader (see
    /// [`get_or_load_with_context`](Self::get_or_load_with_context)): it
    /// sees the value it replaces, and may answer
    /// [`Loaded::not_modified`] to renew it without rewriting it.
    ///
    /// # Errors
    ///
    /// As [`get_or_load_with_context`](Self::get_or_load_with_context).
    pub async fn refresh_with_context<F, Fut, E>(
        &self,
        key: impl CacheKey,
        loader: F,
    ) -> Result<Fetched<V>, Error>
    where
        F: FnOnce(LoadContext<V>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<Loaded<V>, E>> + Send + 'static,
        E: Into<Box<dyn StdError + Send + Sync + 'static>> + 'static,
    {
        self.refresh_in_span(&key.key_bytes(), WithContext(loader))
            .await
    }

    /// One call with its own settings (TTL, jitter, grace, timeouts...).
    pub fn entry(&self, key: impl CacheKey) -> CacheEntry<'_, V> {
        CacheEntry::new(self, &key.key_bytes(), self.inner.defaults)
    }

    /// The exact key the entry for `key` is stored under:
    /// `bw:<namespace>:v:{<key>}`, or `bw:<namespace>:v:{#<hash>}<key>` when
    /// the key itself contains a brace (`bw:` is the default
    /// [`key_prefix`](CacheBuilder::key_prefix)). The braces are a Redis Cluster hash
    /// tag, so every record of one key shares one slot.
    ///
    /// # Errors
    ///
    /// [`InvalidKey`](crate::ErrorKind::InvalidKey) for an empty key or one longer
    /// than `max_key_len`.
    pub fn storage_key(&self, key: impl CacheKey) -> Result<Vec<u8>, Error> {
        self.key_in_store(&key.key_bytes())
    }

    /// The exact key of the namespace's clear record:
    /// `bw:<namespace>:c` (`bw:<namespace>@<version>:c` from version 1 on).
    /// The first write of a namespace makes it (see [`Cache::clear`]), and
    /// it has no TTL: a tool that removes a whole namespace deletes it
    /// with the entries. Deleted while entries stay, it is a lost record:
    /// a process that knows it puts it back within a second; where none
    /// does, the entries are adopted (stale at their own expiry at the
    /// latest), never turned into misses at once (see `cache::clear`).
    pub fn clear_record_key(&self) -> &[u8] {
        &self.inner.clear_key
    }

    /// The namespace this cache was built with.
    pub fn namespace(&self) -> &str {
        &self.inner.settings.namespace
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
}

/// How many writes `set_many` seals and sends as one batch (a Cluster's
/// are grouped by slot within it: the larger, the fewer transactions).
const SET_MANY_BATCH: usize = 32_768;

/// How many items `set_many` seals before it lets the write of the batch
/// before make progress.
const SET_MANY_STEP: usize = 256;

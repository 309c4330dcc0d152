//! Clearing a namespace at runtime without an avalanche: [`Cache::clear`]
//! makes every entry of the namespace a miss (hard) or spreads their
//! refreshes over a window (soft), fleet-wide, in one store write whatever
//! the number of keys.
//!
//! # The record, and what entries carry
//!
//! A clear advances the namespace's clear record
//! (`<key_prefix><namespace>:c`, see `store::namespace`) and publishes it,
//! in one store operation ([`Store::clear_namespace`]). Every entry
//! records the namespace generation its load began under (like a tag's
//! generation: read after the lease, before the loader; a `set` records
//! the one it began under). Before the first clear there is a record too:
//! the first write that finds none makes a pin, a record that clears
//! nothing (one `EVALSHA`, once per namespace, see `store::namespace`), so
//! every entry names the record it was written under. A read judges an
//! entry by the record:
//!
//! - written under the current generation (or under the pin before the
//!   first clear; or no record was ever made, and it records none): as it
//!   is;
//! - cleared hard: a miss, never served, not even stale;
//! - recorded under a record that was since lost, where no process put it
//!   back: adopted, as after a soft clear over one TTL (below, "A lost
//!   record");
//! - cleared soft at store-clock `T` over window `W`: fresh until a moment
//!   of its own in `[T, T + W)`, then stale as any entry (grace, fail-safe,
//!   one refresh). The moment keeps the order in which entries would have
//!   expired anyway: an entry with `r` of its fresh time left at `T` turns
//!   stale at `T + W × r / ttl` (`ttl`: the namespace's). One with more
//!   than `ttl` left (jitter drew a longer TTL, or a loader chose one)
//!   turns stale when it expires if that is within the window, else at a
//!   moment in the window its key's hash picks. Entries were written at
//!   all times before the clear, so their moments are spread evenly over
//!   the window: the database sees each key once over `W`, as it would
//!   over a TTL, instead of all of them at once. With `W` = `ttl` almost
//!   every entry keeps its own expiry, and the load stays at its steady
//!   rate (`breakwater demo`'s clear story measures it). Each refresh goes
//!   through the origin's bulkhead like any load.
//!
//! # A lost record
//!
//! The record has no TTL, but an `allkeys-*` eviction policy, a `DEL`, an
//! empty restart or a failover can still lose it. Its loss degrades
//! softly: it never turns the namespace into a miss and never erases L1.
//!
//! - **Kept warm.** Every process whose bus is up reads the record it
//!   trusts once a second, off the callers' paths (`Clears::keep_warm`,
//!   on the listener's beat): under an LRU or LFU policy the key is as
//!   recent as the entries in use, and a record that was deleted or
//!   evicted all the same is found within a second.
//! - **Put back as it was.** A process that knows a record (heard or read)
//!   and finds the store without it (its keep-warm read, a read after its
//!   bus came back, a write) judges entries by the one it knows and puts
//!   that back at once (a pin with the record given: written only over
//!   none, not published). Nothing changes for anyone: the entries in the
//!   store stay valid, L1 keeps its copies.
//! - **Adopted where nobody knows it.** A process that never knew a
//!   record (every process that did is gone) and reads an entry that
//!   recorded one judges it as an *adopting pin* would: stale at its own
//!   expiry, at the latest at a moment within one TTL of when it found the
//!   record missing (a soft clear over one TTL: the database sees no
//!   ramp). After a pause drawn at random (up to 500 ms, so a process that
//!   knows the record puts it back first, and the processes that noticed
//!   do not all write) it reads the record again and, still missing, makes
//!   that pin (`H = 0`, see `store::namespace`), published: every process
//!   takes it, and nothing is cleared. A write that finds no record makes
//!   the same pin (never a hard one, and never before it has a generation
//!   to record: it clears nothing).
//!
//! What a loss can cost is bounded by one double fault: a clear whose
//! record is lost before any process that heard it put it back (or while
//! the only processes that did were down) is not applied by the processes
//! that never heard it; they judge the entries by the record they knew,
//! or adopt them. Only a *heard* hard clear erases.
//!
//! A record that cannot be read is not a lost one: nothing is cleared for
//! it, and entries are judged by the last record known here; a process
//! that has not read it yet (its node is down) judges them as written.
//! Both take the risk of two faults at once (the record's node down, a
//! clear missed). (Entries that record no generation come only from a
//! build before pins; a process that never knew a record and reads only
//! those cannot tell, and serves them until a record is made.)
//!
//! # Every process at once
//!
//! Each process keeps the record it last read, and reads it again only
//! when it may have missed a clear: before its bus listener is subscribed,
//! while it is down, and once after every drop (then every store read
//! also reads the record, one more `GET`). A clear's message carries the
//! new record: each process takes it, drops its whole L1 (the next reads
//! judge the store's entries), and, for a hard clear, detaches the loads,
//! refreshes and shared reads in the air (their callers still get their
//! result; callers from then on start anew). Then it acknowledges on the
//! bus. `clear` returns once every subscriber the message reached
//! (`PUBLISH`'s count) has acknowledged, so no process serves a value from
//! before a hard clear afterwards; if some have not within
//! [`CLEAR_ACKED_WITHIN`], it says so in its error (those processes take
//! the record at the latest when their bus is seen down, and read it with
//! every read until it is back).

use std::time::Duration;

use rand::RngExt;

use tokio::time::Instant;

use super::handle::Cache;
use super::notify::{self, CLEARED};
use super::record::{KEEP_WARM, RECHECK};
use super::value::Value;
use crate::clock::millis;
use crate::entry::Entry;
use crate::error::{ConfigError, Error, ErrorKind, MAX_WINDOW};
use crate::log_limit::{Warning, show_key, warn_limited};
use crate::store::namespace::{NamespaceState, Standing};
use crate::store::{NamespaceClear, Store, fnv1a};

/// How long [`Cache::clear`] waits for every process to acknowledge.
pub const CLEAR_ACKED_WITHIN: Duration = Duration::from_secs(2);

/// The longest pause before a process that found the clear record lost
/// reads it again and, still missing, makes a new one.
const RESTORE_SPREAD: Duration = Duration::from_millis(500);

/// How long a restore may hold its slot without being polled before
/// another may start: its pause, a read and a clear take a few seconds.
const RESTORE_STRANDED: Duration = Duration::from_secs(10);

/// How [`Cache::clear`] clears a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClearMode {
    /// Every entry written before is a miss from now on, in every
    /// process: the next read of each key loads it. Clearing a busy
    /// namespace this way sends every key's next read to the database at
    /// once (the avalanche a soft clear avoids).
    Hard,
    /// Every entry written before turns stale at a moment of its own
    /// within `window` (in the order it would have expired anyway), then
    /// is served stale within grace while one load refreshes it: the
    /// database sees a ramp, not a cliff. A `window` of the namespace's
    /// TTL keeps the load at about its steady rate.
    ///
    /// A soft clear never makes an entry fresher than an earlier one left
    /// it: made while an earlier soft clear's window is still open, it
    /// keeps that window's start and ends no later than either; made
    /// after it ended, the earlier one's entries stay stale. (Entries
    /// written between two such clears are judged from the earlier start:
    /// those with more fresh time left than the TTL get a moment anywhere
    /// in the merged window, some of them already past, so part of them
    /// turn stale at once.)
    Soft {
        /// Over how long the refreshes are spread (at most 365 days;
        /// zero: every entry is stale at once, still served within grace).
        window: Duration,
    },
}

impl<V: Value> Cache<V> {
    /// Clears this namespace, fleet-wide, in one store write whatever the
    /// number of keys: [`ClearMode::Hard`] makes every entry written before
    /// a miss; [`ClearMode::Soft`] spreads their refreshes over a window,
    /// so the database sees a ramp, not the cliff a hard clear of a busy
    /// namespace is.
    ///
    /// Returns once every process listening on the namespace's bus has
    /// taken the clear: after a hard clear, no process serves a value from
    /// before it (L1 copies included); after a soft one, each entry turns
    /// stale at its moment in the window, and L1 copies are read again.
    /// See the module docs of `cache::clear` for how.
    ///
    /// "Every process" is counted as the store counts the clear's message's
    /// subscribers: on one Redis (or Sentinel) every subscribed
    /// connection, which caches sharing one [`RedisStore`](crate::RedisStore)
    /// share; on a Redis Cluster only the subscribers on the node that ran
    /// the clear, so there it returns once that many processes have
    /// acknowledged, and the others take it as their message arrives.
    ///
    /// # Errors
    ///
    /// [`Config`](ErrorKind::Config) for a window over 365 days;
    /// [`Store`](ErrorKind::Store) if the store could not record the clear
    /// (it may or may not have: clearing again is safe), or if some
    /// processes did not acknowledge it within [`CLEAR_ACKED_WITHIN`] (it
    /// was recorded; they take it at the latest once their bus is seen
    /// down).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use breakwater_cache::{Cache, ClearMode};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), breakwater_cache::Error> {
    /// let cache = Cache::<String>::builder().ttl(Duration::from_secs(600)).build()?;
    /// cache.set("page:home", &"old".to_string()).await?;
    ///
    /// // Every page refreshed within the next 10 minutes, spread out.
    /// cache.clear(ClearMode::Soft { window: Duration::from_secs(600) }).await?;
    /// assert_eq!(cache.get("page:home").await?.as_deref(), Some("old"));
    ///
    /// // Gone, everywhere, now.
    /// cache.clear(ClearMode::Hard).await?;
    /// assert_eq!(cache.get("page:home").await?, None);
    /// # Ok(()) }
    /// ```
    pub async fn clear(&self, mode: ClearMode) -> Result<(), Error> {
        let (hard, window) = match mode {
            ClearMode::Hard => (true, Duration::ZERO),
            ClearMode::Soft { window } => (false, window),
        };
        if window > MAX_WINDOW {
            return Err(ConfigError::new(format!(
                "a soft clear's window is at most 365 days, got {window:?}"
            ))
            .into());
        }
        let inner = &self.inner;
        // Subscribed first, so this process hears the acknowledgements.
        inner
            .waiters
            .subscribed_within(&*inner.store, CLEAR_ACKED_WITHIN)
            .await;
        let message = notify::message(CLEARED, inner.waiters.sender(), b"");
        let cleared = inner
            .store
            .clear_namespace(NamespaceClear {
                key: &inner.clear_key,
                hard,
                window_ms: millis(window),
                fresh: inner.fresh_generation(),
                pin: false,
                restore: None,
                notice: inner.notice(&message),
            })
            .await?;
        let Some(state) = NamespaceState::parse(&cleared.record) else {
            return Err(Error::new(
                ErrorKind::Store,
                "the store answered a clear with something that is not a clear record",
            ));
        };
        // This process, at once: the record taken as if heard (its own
        // listener may be down as it is published, and would miss it), L1
        // emptied. (The listener, if up, hears it too, and acknowledges.)
        self.local.clears.heard(&cleared.record);
        self.local.cleared(hard);
        // Processes that cannot trust their bus read the record again
        // within RECHECK: by the time this returns, they have.
        let rechecked = tokio::time::sleep(RECHECK);
        let deadline = Instant::now() + CLEAR_ACKED_WITHIN;
        let acked = self
            .local
            .clears
            .acks_of(state.generation, cleared.receivers, deadline)
            .await;
        self.local.clears.forget(state.generation);
        rechecked.await;
        if acked < cleared.receivers {
            return Err(Error::new(
                ErrorKind::Store,
                format!(
                    "the clear of {} was recorded, but only {acked} of the {} processes listening \
                     acknowledged it within {CLEAR_ACKED_WITHIN:?}: the others take it once their \
                     bus is seen down or the message arrives",
                    show_key(&inner.clear_key),
                    cleared.receivers
                ),
            ));
        }
        Ok(())
    }

    /// The namespace's clear record as this process must judge entries
    /// by: the one it knows while its bus has stayed up since (or read
    /// less than [`RECHECK`] ago), else read from the store (one `GET`).
    /// A record that cannot be read is judged by the last one known here
    /// (none, if none ever was): the record's node being down does not take
    /// every other key's reads down with it, at the risk (two faults at
    /// once) that a process which missed a clear serves entries from before
    /// it until it can read the record again.
    pub(super) async fn clear_record(&self) -> Result<Option<NamespaceState>, Error> {
        // Listening first: a record read before the listener is subscribed
        // is trusted only for RECHECK.
        self.inner.waiters.ensure_listening(&*self.inner.store);
        let clears = &self.local.clears;
        let before = clears.last();
        match clears.current().await {
            Ok(record) => {
                // The store lost the record known here: judged by as
                // known, and put back.
                if let Some(trusted) = clears.take_missing()
                    && record.is_some()
                {
                    self.record_lost(Some(trusted));
                }
                // A clear this process had not heard of (its bus was down):
                // taken as if heard, L1 copies and loads in the air from
                // before it included. A pin clears nothing, whatever it
                // replaces (a lost record's entries are adopted by it).
                if let (Some(before), Some(now)) = (before, record)
                    && now.generation != before.generation
                    && !now.is_pin()
                {
                    self.local.cleared(now.floor == now.generation);
                }
                Ok(record)
            }
            Err(err) => {
                warn_limited!(self.inner.logs, Warning::StoreRead, key = %show_key(&self.inner.clear_key), error = %err, "the namespace's clear record could not be read; judging entries by the last one known");
                Ok(clears.last())
            }
        }
    }

    /// [`clear_record`](Self::clear_record), if it needs no store read;
    /// `None` otherwise.
    pub(super) fn clear_record_now(&self) -> Option<Option<NamespaceState>> {
        self.local.clears.trusted()
    }

    /// `entry` of storage key `key` as the clear `record` leaves it: as it
    /// is, a miss (cleared hard), or fresh no longer than its moment in a
    /// soft clear's window. An entry that recorded a generation where the
    /// store holds no record and none is known here (the record was lost,
    /// and this process never knew it) is adopted: judged as an adopting
    /// pin would judge it, and one is made
    /// ([`record_lost`](Self::record_lost)).
    pub(super) fn after_clears(
        &self,
        key: &[u8],
        entry: Entry,
        record: Option<&NamespaceState>,
    ) -> Option<Entry> {
        if record.is_none() && entry.extra.namespace().is_some() && self.local.clears.ever_seen() {
            self.record_lost(None);
        }
        self.judge_clears(key, entry, record)
    }

    /// [`after_clears`](Self::after_clears) without its side effect (for
    /// `inspect`, which only reads).
    pub(super) fn judge_clears(
        &self,
        key: &[u8],
        mut entry: Entry,
        record: Option<&NamespaceState>,
    ) -> Option<Entry> {
        // The previous version's entries record generations of its own
        // record, which this version does not read: judged as recording
        // none, by this version's record (which that version's clears
        // reach, see `coherence`).
        if let Some(previous) = &self.inner.previous
            && key.starts_with(&previous.prefix)
        {
            entry.extra.forget_namespace();
        }
        let standing = match (record, entry.extra.namespace()) {
            // Never read here, nor heard (the read failed): the entry is
            // judged as written, the risk a record that cannot be read
            // takes everywhere (see `clear_record`).
            (None, _) if !self.local.clears.ever_seen() => Standing::Current,
            // No record, and none known here, though the entry recorded
            // one: it was lost. Adopted as an adopting pin made when this
            // process first found so would adopt it.
            (None, Some(_)) => Standing::Adopted {
                at: self.local.clears.lost_at(),
            },
            (record, recorded) => NamespaceState::standing(record, recorded),
        };
        let (at, window, by) = match standing {
            Standing::Current => return Some(entry),
            Standing::Cleared => {
                tracing::debug!(key = %show_key(key), "cached entry is from before a clear; treating it as a miss");
                return None;
            }
            Standing::Soft { at, window, by } => (at, window, by),
            Standing::Adopted { at } => (at, millis(self.inner.defaults.ttl), None),
        };
        let moment = at.saturating_add(self.moment_in(key, &entry, at, window));
        let moment = by.map_or(moment, |by| moment.min(by));
        entry.fresh_until = entry.fresh_until.min(moment);
        Some(entry)
    }

    /// When in a soft clear's `window` (made at `at`) `entry` turns stale,
    /// counted from `at`: its fresh time left then scaled by `window` over
    /// the namespace's `ttl`; past the window (fresh for longer than the
    /// `ttl`, by jitter or a loader's choice), its own expiry if that comes
    /// within the window, else a moment its key's hash picks.
    fn moment_in(&self, key: &[u8], entry: &Entry, at: u64, window: u64) -> u64 {
        if window == 0 {
            return 0;
        }
        let ttl = millis(self.inner.defaults.ttl).max(1);
        let left = entry.fresh_until.saturating_sub(at);
        let scaled = (u128::from(left) * u128::from(window)) / u128::from(ttl);
        match u64::try_from(scaled) {
            Ok(scaled) if scaled < window => scaled,
            _ if left < window => left,
            // The same fraction of any window: a shorter one (a later soft
            // clear's) never moves the moment later.
            _ => ((u128::from(fnv1a(key)) * u128::from(window)) >> 64) as u64,
        }
    }

    /// The namespace's clear record was lost (evicted under `maxmemory`,
    /// deleted, an empty restart). With `known` (`Some(trusted)`: this
    /// process knows a record, and trusted it, its bus up since it read or
    /// heard it), a trusted record is put back at once
    /// ([`Clears::put_back`](super::record::Clears::put_back): if the
    /// store still holds none, a record another process put back or made
    /// meanwhile is taken instead). Otherwise, after a pause of one
    /// keep-warm period and up to [`RESTORE_SPREAD`] more, drawn at random
    /// (so a process that trusts its record, whose keep-warm read finds
    /// the loss, puts it back first, and the fleet's processes that
    /// noticed do not all write), the record is read again and, still
    /// missing, the one known here is put back, or, none known, an
    /// adopting pin is made (published: every process takes it). In the
    /// background, one at a time in this process. Nothing is cleared:
    /// entries stay as they were judged, L1 included.
    fn record_lost(&self, known: Option<bool>) {
        let cache = self.clone();
        // One at a time (a restore stranded on a runtime that stopped
        // polling it is started again after RESTORE_STRANDED).
        self.local.clears.restoring.ensure(RESTORE_STRANDED, |duty| async move {
            let clears = &cache.local.clears;
            if known != Some(true) {
                // The cache's own generator: seeded, a run replays.
                let pause = {
                    let mut rng = cache.inner.rng.lock().unwrap_or_else(|p| p.into_inner());
                    KEEP_WARM + rng.random_range(Duration::ZERO..=RESTORE_SPREAD)
                };
                tokio::time::sleep(pause).await;
                match clears.read_again().await {
                    Ok(None) => {
                        warn_limited!(cache.inner.logs, Warning::ClearRecordLost, key = %show_key(&cache.inner.clear_key), "the namespace's clear record is gone from the store (evicted under maxmemory, deleted, or an empty restart) and no record is known here; making a pin that adopts the entries written under it");
                        if let Err(err) = clears.pin(None).await {
                            tracing::debug!(error = %err, "the adopting pin could not be made; the next read that finds the record missing tries again");
                        }
                        return duty.done();
                    }
                    // Still missing: the one known here, put back below.
                    Ok(Some(_)) if clears.take_missing().is_some() => {}
                    // Put back or made meanwhile; or the read failed (tried
                    // again by the next read that finds it missing).
                    Ok(Some(_)) | Err(_) => return duty.done(),
                }
            }
            clears.put_back().await;
            duty.done();
        });
    }

    /// The clear generation a load or `set` beginning now records: the
    /// record's (one known here, if the store lost it); if there is none,
    /// that of an adopting pin made for it (see `store::namespace`), which
    /// clears nothing. `Err` if the store could not make one: the value is
    /// then not written.
    pub(super) async fn clear_generation(&self) -> Result<u64, Error> {
        if let Some(state) = self.clear_record().await? {
            return Ok(state.generation);
        }
        Ok(self.local.clears.pin(None).await?.generation)
    }
}

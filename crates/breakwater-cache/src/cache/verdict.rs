//! The one verdict on a stored entry, so that a foreign, corrupt or
//! revoked entry is never served and every path (a read, a re-read under
//! the lease, an L1 copy, a batch) judges freshness alike: decoded, then
//! fresh, due for an early refresh, in grace, a fail-safe stand-in, or a
//! load.

use tokio::time::Instant;

use super::handle::{Cache, CacheCore};
use super::options::Options;
use super::tags::TagSet;
use super::transition::{self};
use super::value::Value;
use crate::clock::millis;
use crate::entry::Entry;
use crate::error::Error;
use crate::freshness::{Freshness, Reading};
use crate::l1::{NearCopy, Ticket};
use crate::log_limit::{Once, Warning, show_key, warn_limited};
use crate::served::{Fetched, Served, StaleReason};
use crate::store::Store;

impl CacheCore {
    /// The verdict on a store read. The shared (seedable) generator is
    /// locked only when a draw could change the answer: a value far from
    /// its end is fresh without one, so a hit takes no process-wide lock.
    fn judge(&self, options: &Options, reading: Reading) -> Freshness {
        let policy = options.freshness();
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
    /// What the fill's `coalesced` read judges, for an entry already in
    /// hand (one a fill's message carried): its value if fresh and not the
    /// entry being replaced; a servable stale one is kept in `stale`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn fresh_entry(
        &self,
        key: &[u8],
        entry: Entry,
        stale: &mut Option<Entry>,
        options: &Options,
        replacing: Option<u64>,
        ticket: Option<Ticket>,
        tags: Option<&TagSet>,
    ) -> Option<Option<V>> {
        // An entry without the call's tags is loaded again (under the
        // lease), never served to it, nor kept to stand in.
        if tags.is_some_and(|tags| !tags.carried_by(&entry)) {
            return None;
        }
        let now = self.inner.store.now_ms();
        if entry.fresh_until > now {
            if replacing == Some(entry.fresh_until) {
                // The entry an early refresh replaces: not done, but what
                // a context loader sees.
                *stale = Some(entry);
                return None;
            }
            let value = self.entry_value(key, &entry)?;
            self.keep_read(key, &value, &entry, now, ticket, options);
            return Some(value);
        }
        if options.freshness().servable_stale(reading(&entry, now)) {
            *stale = Some(entry);
        }
        None
    }

    /// Whether a fresh L1 copy is due for an early refresh: `Some` with the
    /// `fresh_until` it would replace. Cheap unless the copy is close to its
    /// end: the random draw is only made where it could trigger.
    #[inline]
    pub(super) fn refresh_due(
        &self,
        slot: &NearCopy<V>,
        options: &Options,
        now: Instant,
    ) -> Option<u64> {
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
    fn refresh_due_slow(&self, slot: &NearCopy<V>, options: &Options, now: Instant) -> Option<u64> {
        let policy = options.freshness();
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

    /// The verdict on an entry read from the store at `now` (store clock): a
    /// fresh value is served, with an early refresh if one is due; a stale
    /// one within grace is served while a refresh runs, or, while the key's
    /// loads are throttled after a failure, without one; past grace it is
    /// the fail-safe stand-in of the load that follows. (A value served
    /// from the store is then kept in L1 by the caller.)
    #[inline]
    pub(super) fn judge_entry(
        &self,
        key: &[u8],
        entry: &Entry,
        now: u64,
        options: &Options,
    ) -> Judged<V> {
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

    /// The value of L1 copy `slot` if it may stand in for a failed load:
    /// still within its stale window and this call's `max_stale`, judged
    /// on the store's clock as a stored entry is.
    pub(super) fn local_stand_in(
        &self,
        slot: &NearCopy<V>,
        options: &Options,
    ) -> Option<Option<V>> {
        let reading = Reading {
            now_ms: self.inner.store.now_ms(),
            fresh_until: slot.stored.fresh_until,
            stale_until: slot.stored.stale_until,
            load_ms: slot.stored.load_ms,
        };
        let servable =
            slot.is_servable(Instant::now()) && options.freshness().servable_stale(reading);
        servable.then(|| slot.value.clone())
    }

    /// Whether the previous version's `entry` may stand in for this
    /// version's at `now_ms` (store clock): a value, inside its stale
    /// window and this call's `max_stale` (a call that opted out of stale
    /// values gets none from the previous version either).
    pub(super) fn previous_stands_in(&self, entry: &Entry, now_ms: u64, options: &Options) -> bool {
        !entry.negative && options.freshness().servable_stale(reading(entry, now_ms))
    }

    /// [`decode`](Self::decode), for bytes read beside what the previous
    /// version's key holds now (`beside`, inside a version transition; see
    /// `transition`): an entry loaded beside something else is a miss.
    pub(super) fn decode_beside(
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

    /// The entry a fill's message carried for storage key `key`, if it may
    /// be taken as a read would: untagged (a tagged one is read from the
    /// store, which checks its tags) and current by the clear record known
    /// here (with none trusted, or cleared, it is read from the store).
    pub(super) fn carried(&self, key: &[u8], bytes: Vec<u8>) -> Option<Entry> {
        let entry = self
            .decode(key, bytes)
            .filter(|entry| entry.tags.is_empty())?;
        let record = self.clear_record_now()?;
        self.after_clears(key, entry, record.as_ref())
    }

    /// Decodes stored bytes (read, or carried by a fill's message) the way
    /// [`read`](Self::read) does.
    pub(super) fn decode(&self, key: &[u8], bytes: Vec<u8>) -> Option<Entry> {
        match Entry::decode(
            bytes,
            self.inner.settings.compression.max_decompressed_len(),
        ) {
            Ok(entry) if entry.codec == self.inner.settings.codec => Some(entry),
            Ok(entry) => {
                // One expression: a `format_args!` kept in a `let` needs Rust
                // 1.89, and the rust-version is 1.88.
                self.foreign(
                    Once::ForeignCodec,
                    key,
                    &format_args!(
                        "stored with {}, this cache uses {}",
                        entry.codec.name(),
                        self.inner.settings.codec.name()
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
    pub(super) fn entry_value(&self, key: &[u8], entry: &Entry) -> Option<Option<V>> {
        self.stored_value(entry)
            .map_err(|err| self.foreign(Once::ForeignValue, key, &err))
            .ok()
    }

    /// [`entry_value`](Self::entry_value) of the previous version's entry
    /// (inside a version transition): one that does not decode is the
    /// expected end of a type change with the version bump, logged at
    /// `debug` only.
    pub(super) fn previous_value(&self, key: &[u8], entry: &Entry) -> Option<Option<V>> {
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

    pub(super) fn is_fresh(&self, entry: &Entry) -> bool {
        entry.fresh_until > self.inner.store.now_ms()
    }

    pub(super) fn decode_value(&self, key: &[u8], entry: &Entry) -> Option<V> {
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
    pub(super) fn foreign(&self, kind: Once, key: &[u8], detail: &dyn std::fmt::Display) {
        self.inner.metrics.unreadable();
        let what = match kind {
            Once::ForeignValue => "a cached value does not decode as this cache's value type",
            Once::ForeignCodec => "a cached entry was written with another codec",
        };
        if self.inner.logs.first(kind) {
            tracing::warn!(
                namespace = %self.inner.settings.namespace,
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
}

/// What a call gets from an entry read from the store (see
/// [`Cache::judge_entry`]).
pub(super) enum Judged<V> {
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
pub(super) struct Refresh {
    /// The `fresh_until` of the entry it replaces.
    pub(super) replacing: u64,
    /// The entry is still fresh (an early refresh, counted as one).
    pub(super) early: bool,
}

/// What the freshness policy needs of an entry.
pub(super) fn reading(entry: &Entry, now_ms: u64) -> Reading {
    Reading {
        now_ms,
        fresh_until: entry.fresh_until,
        stale_until: entry.servable_until(),
        load_ms: entry.load_ms,
    }
}

/// Whether a stale entry is still inside its grace window (the one its
/// loader chose and stored with it, else `options.grace`), where it is
/// served while one refresh runs (past it, a read waits for the load).
pub(super) fn in_grace(entry: &Entry, now_ms: u64, options: &Options) -> bool {
    let grace = match entry.extra.grace_ms() {
        Some(own) => own,
        None => millis(options.grace),
    };
    now_ms < entry.fresh_until.saturating_add(grace)
}

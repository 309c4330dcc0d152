//! Sealing, so that every write carries a jittered TTL (no avalanche) and
//! stays under the size cap, and an L1 copy lives no longer than the entry
//! it copies: entries encoded for the store, and values kept in L1.

use std::time::Duration;

use super::handle::Cache;
use super::options::Options;
use super::tags::set_hash;
use super::value::Value;
use crate::clock::millis;
use crate::codec::Encode;
use crate::entry::{Entry, Extra, TagStamp};
use crate::error::{Error, ErrorKind};
use crate::l1::{Stamp, Ticket};
use crate::log_limit::{Warning, show_key, warn_limited};
use crate::store::Store;

impl<V: Value> Cache<V> {
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
            max_value_size = inner.settings.max_value_size,
            "value is larger than max_value_size; not cached"
        );
        Error::new(
            ErrorKind::TooLarge,
            format!(
                "the serialized value is at least {at_least} bytes, above max_value_size \
                 ({} bytes); it was not cached (raise CacheBuilder::max_value_size, or cache \
                 smaller values)",
                inner.settings.max_value_size
            ),
        )
    }

    /// Encodes `value` (`None`: a negative entry) into an entry with the
    /// jittered TTL (the negative TTL for negative entries), and returns it
    /// with its physical TTL, which ends at `stale_until` (the fresh window
    /// plus `max_stale`), its windows counted from `now` (store-clock ms:
    /// when the value was had).
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
    pub(super) fn seal(
        &self,
        key: &[u8],
        value: Option<&V>,
        load_time: Duration,
        options: &Options,
        now: u64,
    ) -> Result<Sealed, Error> {
        self.seal_tagged(
            key,
            value,
            load_time,
            options,
            Vec::new(),
            now,
            Extra::default(),
        )
    }

    /// [`seal`](Self::seal), recording `tags` (with their generations) in
    /// the entry (a format version 2 entry, unless `tags` is empty), its
    /// windows counted from `now` (store clock): when the value was had,
    /// which for a `set` is before its tags' generations were read; `extra`:
    /// the extension items it carries (a loader's validator).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn seal_tagged(
        &self,
        key: &[u8],
        value: Option<&V>,
        load_time: Duration,
        options: &Options,
        tags: Vec<TagStamp>,
        now: u64,
        extra: Extra,
    ) -> Result<Sealed, Error> {
        let inner = &self.inner;
        let (payload, negative) = match value {
            Some(v) => match inner
                .settings
                .codec
                .encode_within(v, inner.settings.max_value_size)
            {
                Ok(payload) => (payload, false),
                Err(Encode::Failed(err)) => return Err(err),
                Err(Encode::TooLarge { at_least }) => return Err(self.too_large(key, at_least)),
            },
            None => (Vec::new(), true),
        };
        let (fresh_until, stale_until) = self.windows(negative, options, now);
        let load_ms = u32::try_from(load_time.as_millis()).unwrap_or(u32::MAX);
        let entry = Entry {
            codec: inner.settings.codec,
            negative,
            fresh_until,
            stale_until,
            load_ms,
            payload,
            tags: tags.into(),
            extra,
        };
        let bytes = entry.encode(&inner.settings.compression);
        Ok(Sealed {
            bytes,
            // What is left of the windows when it is written.
            ttl: Duration::from_millis(stale_until.saturating_sub(inner.store.now_ms()).max(1)),
            stamp: stamp(&entry),
        })
    }

    /// An entry's windows from `now` (store clock) under `options`: fresh
    /// for the jittered TTL (the negative TTL for a negative entry), then
    /// servable stale for `max_stale` (never, for a negative entry).
    pub(super) fn windows(&self, negative: bool, options: &Options, now: u64) -> (u64, u64) {
        let base = if negative {
            options.negative_ttl
        } else {
            options.ttl
        };
        let fresh = {
            let mut rng = self.inner.rng.lock().unwrap_or_else(|p| p.into_inner());
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
        (fresh_until, fresh_until.saturating_add(stale_ms))
    }

    /// Keeps a value whose stored entry this process just renewed in L1,
    /// with the renewed windows (`stamp`), unless the key was invalidated
    /// since the load began (`ticket`).
    pub(super) fn keep_renewed(
        &self,
        key: &[u8],
        value: Option<V>,
        stamp: Stamp,
        ticket: Option<Ticket>,
    ) {
        let now_ms = self.inner.store.now_ms();
        self.keep_near(key, value, stamp, stamp.stale_until, now_ms, ticket);
    }

    /// Keeps a value read from the store in L1, for no longer than the
    /// store says it is fresh, and servable as a stand-in no longer than
    /// both the entry and this reader's own `max_stale` allow (the writer
    /// may have allowed more), unless the key was invalidated since the read
    /// began (`ticket`).
    pub(super) fn keep_read(
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
        let stale_until = entry.servable_until().min(
            entry
                .fresh_until
                .saturating_add(millis(options.max_stale())),
        );
        self.keep_near(
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
    pub(super) fn keep_written(
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
        self.keep_near(
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
    fn keep_near(
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
            self.inner
                .defaults
                .freshness()
                .early_window_ms(stamp.load_ms),
            ticket,
        );
        self.inner.metrics.l1_entries(l1.entries());
    }
}

/// An encoded entry with its physical TTL and its deadlines.
pub(super) struct Sealed {
    pub(super) bytes: Vec<u8>,
    /// The store TTL: the fresh window plus `max_stale`.
    pub(super) ttl: Duration,
    /// The entry's deadlines and load time, for L1.
    pub(super) stamp: Stamp,
}

/// What L1 keeps of an entry: its deadlines and load time.
pub(super) fn stamp(entry: &Entry) -> Stamp {
    // A transition stamp is no tag.
    let tags = entry.tags.iter().filter(|t| !t.tag.is_empty());
    Stamp {
        tagged: tags.clone().next().is_some(),
        tag_set: set_hash(tags.map(|t| &t.tag[..])),
        fresh_until: entry.fresh_until,
        stale_until: entry.servable_until(),
        load_ms: entry.load_ms,
    }
}

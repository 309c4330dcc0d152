//! One store read of a key, so that nothing the store returns is trusted
//! unchecked: the `GET` (queued behind a busy store), the previous
//! version's entry beside it inside a version transition, and a tagged
//! entry's generations. The read step, the fill's re-read under the lease,
//! `get`, `get_many` and `inspect` read through here.

use std::sync::Arc;

use tracing::{Instrument, Span};

use super::handle::Cache;
use super::keys::HASH_TAG_ROOM;
use super::options::Options;
use super::queue::{self};
use super::tags::{TagSet, judge_tagged, tag_key, tag_key_into, tag_state};
use super::value::Value;
use crate::entry::{Entry, MAX_TAGS, TagStamp};
use crate::error::{Error, ErrorKind};
use crate::log_limit::show_key;
use crate::store::{Store, TagState};

/// The tag stamps of a read entry; none for a miss or a failed read.
fn stamps(entry: &Result<Option<Entry>, Error>) -> &[TagStamp] {
    match entry {
        Ok(Some(entry)) => &entry.tags,
        _ => &[],
    }
}

impl<V: Value> Cache<V> {
    /// Reads and decodes the envelope; unreadable bytes are a miss plus a
    /// warning, never an error and never a wrong value. So is a key fault
    /// (say, a Redis list under the key: reported by the guarded store):
    /// the store is fine, and the key's next fenced write replaces it.
    ///
    /// `tags`: the tags the call names, if any. Their counters are read in
    /// the entry's own round trip (one `MGET` on a single server; on a
    /// Cluster, where they live in other slots, side by side with it), so
    /// an entry written with the call's tags is judged without a second
    /// round trip; a counter the entry records but the call does not name
    /// (a tag its loader chose) is read after it.
    ///
    /// Inside a version transition the previous version's entry is read
    /// beside it (one `MGET`), and an entry loaded beside another one than
    /// is there now is a miss (see `transition`); its tags are read after
    /// it.
    pub(super) async fn read(
        &self,
        key: &[u8],
        tags: Option<&TagSet>,
    ) -> Result<Option<Entry>, Error> {
        match (self.inner.previous_key(key), tags) {
            (None, None) => self.read_in(key, None).await,
            // Boxed, as every branch but the untagged hit's: their state
            // would grow every read's future.
            (None, Some(tags)) => Box::pin(self.read_naming(key, tags)).await,
            (Some(previous), _) => Box::pin(self.read_in(key, Some(&previous))).await,
        }
    }

    /// A span for one store read, only if a subscriber listens.
    fn store_read_span() -> Span {
        if tracing::dispatcher::has_been_set() {
            tracing::debug_span!("breakwater.store.get")
        } else {
            Span::none()
        }
    }

    /// [`read`](Self::read), beside the previous version's key `previous`
    /// if one is given.
    async fn read_in(&self, key: &[u8], previous: Option<&[u8]>) -> Result<Option<Entry>, Error> {
        let span = Self::store_read_span();
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
        let entry = match self.decode_beside(key, bytes, beside.as_ref().map(|b| b.as_deref())) {
            // A tagged entry (never an untagged one) is checked against its
            // tags' generations: one more round trip, boxed so that its
            // state does not grow every read's future.
            Some(entry) if !entry.tags.is_empty() => {
                Box::pin(self.still_tagged(key, entry, |_| None)).await?
            }
            entry => entry,
        };
        let Some(entry) = entry else { return Ok(None) };
        self.judged_by_clears(key, entry).await
    }

    /// A read entry judged by the namespace's clear record (see `clear`):
    /// the one known here while the bus has stayed up, else read (boxed:
    /// its state would grow every read's future).
    async fn judged_by_clears(&self, key: &[u8], entry: Entry) -> Result<Option<Entry>, Error> {
        let record = match self.clear_record_now() {
            Some(record) => record,
            None => Box::pin(self.clear_record()).await?,
        };
        Ok(self.after_clears(key, entry, record.as_ref()))
    }

    /// [`read`](Self::read) for a call that names `tags`, outside a version
    /// transition: the entry and the named tags' counters in one round
    /// trip ([`GuardedStore::get_beside`]). Not queued behind a busy
    /// store: it is a batch of its own already.
    async fn read_naming(&self, key: &[u8], tags: &TagSet) -> Result<Option<Entry>, Error> {
        // The counters' keys in one buffer: `ends[i]` is where the `i`th
        // ends.
        let tag_prefix = &self.inner.tag_prefix;
        let mut counters = Vec::with_capacity(
            tags.tags
                .iter()
                .map(|tag| tag_prefix.len() + tag.len() + HASH_TAG_ROOM)
                .sum(),
        );
        let mut ends = [0usize; MAX_TAGS];
        for (tag, end) in tags.tags.iter().zip(ends.iter_mut()) {
            tag_key_into(&mut counters, tag_prefix, tag);
            *end = counters.len();
        }
        let mut keys: Vec<&[u8]> = Vec::with_capacity(1 + tags.tags.len());
        keys.push(key);
        let mut from = 0;
        for &end in &ends[..tags.tags.len()] {
            keys.push(&counters[from..end]);
            from = end;
        }
        let span = Self::store_read_span();
        let get = self.inner.store.get_beside(&keys);
        let mut read = if span.is_disabled() {
            get.await
        } else {
            get.instrument(span).await
        };
        let Some(first) = read.first_mut() else {
            return Err(Error::new(
                ErrorKind::Store,
                "the store answered a read with no reply",
            ));
        };
        let bytes = match std::mem::replace(first, Ok(None)) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return Ok(None),
            Err(err) if err.is_key_fault() => return Ok(None),
            Err(err) => return Err(err),
        };
        let Some(entry) = self.decode_beside(key, bytes, None) else {
            return Ok(None);
        };
        let entry = if entry.tags.is_empty() {
            Some(entry)
        } else {
            let named = &read[1..];
            // A failed read of a counter the entry records leaves it
            // unjudged: an error, as a failed `GET` is, never a miss.
            for (tag, read) in tags.tags.iter().zip(named) {
                if let Err(err) = read
                    && entry.tags.iter().any(|stamp| stamp.tag == *tag)
                {
                    return Err(err.clone());
                }
            }
            let known = |tag: &[u8]| {
                let at = tags
                    .tags
                    .binary_search_by(|named| named.as_slice().cmp(tag))
                    .ok()?;
                let stored = named.get(at)?.as_ref().ok()?;
                Some(tag_state(stored.as_deref()))
            };
            self.still_tagged(key, entry, known).await?
        };
        let Some(entry) = entry else { return Ok(None) };
        self.judged_by_clears(key, entry).await
    }

    /// One store read of storage key `key`, straight to the store unless
    /// it is busy and batches reads (see `queue`).
    async fn get_queued(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        let store = &self.inner.store;
        let Some(waiting) = &self.inner.read_queue else {
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
    pub(super) async fn read_previous(&self, key: &[u8], options: &Options) -> Option<Arc<Entry>> {
        let old = self.inner.previous_key(key)?;
        match self.read_in(&old, None).await {
            Ok(Some(entry))
                if self.previous_stands_in(&entry, self.inner.store.now_ms(), options) =>
            {
                Some(Arc::new(entry))
            }
            _ => None,
        }
    }

    /// The current generations of `tags`, for a write to record: each
    /// counter read, or created (a missing or foreign one) with a fresh
    /// value, and its TTL made at least the tag set's `counter_ttl`, in one
    /// [`Store::tag_generations`] (a script; one per slot on a Cluster).
    /// An entry so only ever records a counter that exists.
    pub(super) async fn tag_generations(&self, tags: &TagSet) -> Result<Vec<TagStamp>, Error> {
        let tag_prefix = &self.inner.tag_prefix;
        let keys: Vec<Vec<u8>> = tags
            .tags
            .iter()
            .map(|tag| tag_key(tag_prefix, tag))
            .collect();
        let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let fresh = self.inner.fresh_generation();
        let stored = self
            .inner
            .store
            .tag_generations(&keys, fresh, tags.counter_ttl)
            .await?;
        if stored.len() != tags.tags.len() {
            return Err(Error::new(
                ErrorKind::Store,
                "the store answered a read of tag generations with the wrong number of replies",
            ));
        }
        Ok(tags
            .tags
            .iter()
            .zip(stored)
            .map(|(tag, generation)| TagStamp {
                tag: tag.clone(),
                generation,
            })
            .collect())
    }

    /// The current states of the counters of `tags` (see [`TagState`]),
    /// in their order, `None` for a missing counter (or one that holds no
    /// state): one `GET` for one tag (the store's cheapest read), else one
    /// `MGET` (one per slot on a Cluster). Nothing is created: a read only
    /// checks.
    async fn read_generations(
        &self,
        tags: &[impl AsRef<[u8]>],
    ) -> Result<Vec<Option<TagState>>, Error> {
        let tag_prefix = &self.inner.tag_prefix;
        if let [tag] = tags {
            let key = tag_key(tag_prefix, tag.as_ref());
            let stored = self.inner.store.get_inline(&key).await?;
            return Ok(vec![tag_state(stored.as_deref())]);
        }
        let keys: Vec<Vec<u8>> = tags
            .iter()
            .map(|tag| tag_key(tag_prefix, tag.as_ref()))
            .collect();
        let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let stored = self.inner.store.get_many(&keys).await?;
        Ok(stored.iter().map(|s| tag_state(s.as_deref())).collect())
    }

    /// A tagged entry read from storage key `key`, judged by its tags'
    /// counters ([`judge_tagged`]): `None` (a miss) if any moved on past
    /// it (a hard bump) or is missing; the entry, stale from a soft bump
    /// that came after its load (`expire_tag`), if any; else as it is.
    /// `known_state`: the state of a tag's counter read beside the entry
    /// (`None`: not read); the rest the entry records are read now (one
    /// `GET`, or one `MGET`).
    async fn still_tagged(
        &self,
        key: &[u8],
        mut entry: Entry,
        known_state: impl Fn(&[u8]) -> Option<Option<TagState>>,
    ) -> Result<Option<Entry>, Error> {
        // The stamps whose counters were not read beside the entry, by
        // position (none when the call named the entry's tags).
        let missing: Vec<usize> = (0..entry.tags.len())
            .filter(|&i| known_state(&entry.tags[i].tag).is_none())
            .collect();
        let read = if missing.is_empty() {
            Vec::new()
        } else {
            let tags: Vec<&[u8]> = missing
                .iter()
                .map(|&i| entry.tags[i].tag.as_slice())
                .collect();
            self.read_generations(&tags).await?
        };
        let valid = judge_tagged(&mut entry, |i, stamp| match known_state(&stamp.tag) {
            Some(state) => state,
            None => {
                let at = missing.iter().position(|&m| m == i)?;
                read.get(at).copied().flatten()
            }
        });
        if !valid {
            tracing::debug!(key = %show_key(key), "cached entry's tag was invalidated; treating it as a miss");
            return Ok(None);
        }
        Ok(Some(entry))
    }

    /// [`still_tagged`](Self::still_tagged) for many entries at once: each
    /// tagged entry of `entries` whose tags moved on (or whose counters are
    /// missing) becomes a miss, all
    /// checked with one read of their tags' generations. Entries that
    /// cannot be checked (the read failed) are misses too, never served.
    /// Then each is judged by the namespace's clear record (see `clear`).
    /// `keys`: their storage keys.
    pub(super) async fn keep_current(
        &self,
        keys: &[&[u8]],
        entries: &mut [Result<Option<Entry>, Error>],
    ) {
        let tags: Vec<Vec<u8>> = entries
            .iter()
            .flat_map(|entry| stamps(entry).iter().map(|stamp| stamp.tag.clone()))
            .collect();
        if !tags.is_empty() {
            self.still_tagged_many(entries, tags).await;
        }
        // Judged by the namespace's clear record (see `clear`); entries
        // that cannot be judged (the record could not be read) are misses.
        let record = match self.clear_record_now() {
            Some(record) => Ok(record),
            None => self.clear_record().await,
        };
        for (key, entry) in keys.iter().zip(entries.iter_mut()) {
            if let Ok(slot) = entry
                && let Some(read) = slot.take()
                && let Ok(record) = &record
            {
                *slot = self.after_clears(key, read, record.as_ref());
            }
        }
    }

    /// [`keep_current`](Self::keep_current)'s tag check: `tags`, the tags
    /// `entries` carry.
    async fn still_tagged_many(
        &self,
        entries: &mut [Result<Option<Entry>, Error>],
        mut tags: Vec<Vec<u8>>,
    ) {
        tags.sort_unstable();
        tags.dedup();
        let current = self.read_generations(&tags).await.ok();
        for entry in entries.iter_mut() {
            let stamps = stamps(entry);
            if stamps.is_empty() {
                continue;
            }
            let valid = match (current.as_ref(), entry.as_mut()) {
                (Some(current), Ok(Some(entry))) => judge_tagged(entry, |_, stamp| {
                    let at = tags.binary_search(&stamp.tag).ok()?;
                    current.get(at).copied().flatten()
                }),
                _ => false,
            };
            if !valid {
                *entry = Ok(None);
            }
        }
    }
}

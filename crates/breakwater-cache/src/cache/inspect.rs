//! Inspection: what the store holds for one key, as the cache sees it
//! (fresh, stale or unreadable, how long each window has left, whether a
//! load holds the lease), for operators and for tests.

use std::time::Duration;

use super::handle::Cache;
use super::value::Value;
use super::verdict::{in_grace, reading};
use crate::codec::Codec;
use crate::entry::Entry;
use crate::error::Error;
use crate::store::Store;
use crate::store::namespace::NamespaceState;

/// What the store holds for one key; see [`Cache::inspect`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Inspection {
    /// The exact key in the store (see [`Cache::storage_key`]).
    pub storage_key: Vec<u8>,
    /// What is stored there.
    pub stored: Stored,
    /// The time the store keeps the record, if it has an expiry.
    pub store_ttl: Option<Duration>,
    /// `true` while some process holds the key's lease (a load is running).
    pub lease_held: bool,
    /// The namespace's clear generation (see [`Cache::clear`]); `None`
    /// while it has no clear record (before its first write or clear).
    pub namespace_generation: Option<u64>,
    /// `true` once a clear was made over the namespace's record (`false`
    /// for the record its first write pins, which clears nothing).
    pub namespace_cleared: bool,
}

/// What is stored under a key; see [`Inspection`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stored {
    /// Nothing (never written, expired or invalidated).
    Missing,
    /// Bytes the cache cannot read as one of its entries (corrupt, another
    /// codec, a foreign writer); a read treats them as a miss.
    Unreadable {
        /// How many bytes are stored.
        bytes: usize,
        /// Why they cannot be read.
        reason: String,
    },
    /// One of the cache's entries.
    Entry(EntryView),
}

/// One stored entry, judged on the store's clock; see [`Stored::Entry`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EntryView {
    /// The entry records that the value does not exist (negative caching).
    pub negative: bool,
    /// The codec of the value.
    pub codec: Codec,
    /// The stored size (header and possibly compressed value).
    pub stored_bytes: usize,
    /// The serialized value's size, uncompressed.
    pub value_bytes: usize,
    /// How long the load that produced it took.
    pub load_time: Duration,
    /// Time left in the fresh window; `None` once it has ended.
    pub fresh_for: Option<Duration>,
    /// Time left in the stale window (which ends when the store drops the
    /// record); `None` once it has ended.
    pub stale_for: Option<Duration>,
    /// Whether a `get_or_load` with the cache's defaults serves it now:
    /// fresh, or stale within grace (while one refresh runs). Past grace but
    /// inside the stale window it only stands in if a load fails.
    pub servable: bool,
    /// The namespace clear generation its load began under (`None`: it was
    /// written by a build that recorded none before a first clear).
    pub generation: Option<u64>,
    /// `true` if a hard clear came after it: never served again. (A soft
    /// clear shows in `fresh_for`, cut to its moment in the window.)
    pub cleared: bool,
}

impl EntryView {
    fn new<V: Value>(
        cache: &Cache<V>,
        key: &[u8],
        entry: Entry,
        stored_bytes: usize,
        record: Option<&NamespaceState>,
    ) -> Self {
        let generation = entry.extra.namespace();
        let (entry, cleared) = match cache.judge_clears(key, entry.clone(), record) {
            Some(judged) => (judged, false),
            None => (entry, true),
        };
        let now = cache.inner.store.now_ms();
        let left = |until: u64| (until > now).then(|| Duration::from_millis(until - now));
        let fresh_for = left(entry.fresh_until);
        let defaults = &cache.inner.defaults;
        let servable = !cleared
            && (fresh_for.is_some()
                || (in_grace(&entry, now, defaults)
                    && defaults.freshness().servable_stale(reading(&entry, now))));
        EntryView {
            negative: entry.negative,
            codec: entry.codec,
            stored_bytes,
            value_bytes: entry.payload.len(),
            load_time: Duration::from_millis(u64::from(entry.load_ms)),
            fresh_for,
            stale_for: left(entry.servable_until()),
            servable,
            generation,
            cleared,
        }
    }
}

impl<V: Value> Cache<V> {
    /// What the store holds for `key`: the entry and its windows on the
    /// store's clock, unreadable bytes, or nothing; the record's TTL in the
    /// store; whether a load holds the key's lease; and the namespace's
    /// clear generation. Reads only: four store reads, no L1, no load, no
    /// metrics.
    ///
    /// # Examples
    ///
    /// ```
    /// use breakwater_cache::{Cache, Stored};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), breakwater_cache::Error> {
    /// let cache = Cache::<String>::builder().namespace("catalog").build()?;
    /// assert_eq!(cache.inspect("product:1").await?.stored, Stored::Missing);
    /// cache.set("product:1", &"espresso".to_owned()).await?;
    /// let Stored::Entry(entry) = cache.inspect("product:1").await?.stored else {
    ///     panic!("just written");
    /// };
    /// assert!(entry.fresh_for.is_some() && !entry.negative);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`InvalidKey`](crate::ErrorKind::InvalidKey) for an empty or
    /// over-long key, [`Store`](crate::ErrorKind::Store) if a read fails.
    pub async fn inspect(&self, key: impl crate::CacheKey) -> Result<Inspection, Error> {
        let storage_key = self.storage_key(key)?;
        let store = &self.inner.store;
        let bytes = store.get(&storage_key).await?;
        let store_ttl = store.ttl(&storage_key).await?;
        let lease_held = store
            .lease_held(&self.inner.lease_key(&storage_key))
            .await?;
        let record = store.get(&self.inner.clear_key).await?;
        let record = record.as_deref().and_then(NamespaceState::parse);
        let stored = match bytes {
            None => Stored::Missing,
            Some(bytes) => {
                let len = bytes.len();
                match Entry::decode(
                    bytes,
                    self.inner.settings.compression.max_decompressed_len(),
                ) {
                    Ok(entry) if entry.codec == self.inner.settings.codec => Stored::Entry(
                        EntryView::new(self, &storage_key, entry, len, record.as_ref()),
                    ),
                    Ok(entry) => Stored::Unreadable {
                        bytes: len,
                        reason: format!(
                            "written with codec {}, this cache reads {}",
                            entry.codec.name(),
                            self.inner.settings.codec.name()
                        ),
                    },
                    Err(err) => Stored::Unreadable {
                        bytes: len,
                        reason: err.to_string(),
                    },
                }
            }
        };
        Ok(Inspection {
            storage_key,
            stored,
            store_ttl,
            lease_held,
            namespace_generation: record.map(|state| state.generation),
            namespace_cleared: record.is_some_and(|state| !state.is_pin()),
        })
    }
}

//! `get_many`: many keys, one store read, one batch load for what is
//! missing, one load per key across the fleet.
//!
//! # Order
//!
//! The steps of `get_or_load` (see the parent module), for many keys:
//!
//! - **Keys**: each validated and namespaced; a key asked twice is fetched
//!   once. L1 answers what it holds fresh.
//! - **Read**: one [`Store::get_many`](crate::Store::get_many) for the rest
//!   (one `MGET`; on a Cluster one per hash slot, side by side). Each entry
//!   is judged as `get_or_load` judges it: fresh is served; stale within
//!   grace is served while a background refresh runs; past grace it is
//!   kept as the fail-safe stand-in.
//! - **Fill, one flight per key in this process**: a key another caller (a
//!   `get_or_load` or another `get_many`) is already loading is joined;
//!   the others are registered as this call's flights, so callers that
//!   come later join them.
//! - **Leases in one step**: one [`Store::acquire_leases`](crate::Store::acquire_leases)
//!   for all of them (one script; per hash slot on a Cluster). The keys
//!   taken are read once more (another process may have filled them just
//!   before), then loaded by **one batch loader call** per
//!   [`MAX_BATCH`](loader::MAX_BATCH) keys, under one bulkhead slot and one `load_timeout`
//!   per call, the leases extended while it runs, and written each
//!   through its own fence. The loader may return fewer keys than asked:
//!   a key it leaves out is cached as "not found" (a negative entry).
//! - **Keys another process holds** are awaited together, as a single
//!   key's are (woken by the holder's fill, a takeover when its lease
//!   expires, `lock_wait` and [`OnLockTimeout`](crate::OnLockTimeout)),
//!   and **taken over as a batch**: every waiting key of the call whose
//!   lease is gone (a holder that died stops extending its leases, which
//!   were taken together and so run out together) is tried in one lease
//!   step, gathering the ones that run out within 50 ms, and loaded as the
//!   leases taken in one step are (one loader call and one bulkhead slot per [`MAX_BATCH`](loader::MAX_BATCH)), so a
//!   dead holder costs each waiting call the lease TTL plus one load,
//!   not one load per key.
//! - **The store fails** (the read or the lease step): those keys are
//!   loaded directly in one batch, served and kept in L1, not written, as
//!   for `get_or_load`.
//!
//! Each key's outcome is settled as `get_or_load` settles it (fail-safe
//! stale value, fallback, error), and the whole call ends by a deadline:
//! `lock_wait` plus one load (`queue_wait + load_timeout`) plus one second
//! for store calls; a key not done by then is a
//! [`Timeout`](crate::ErrorKind::Timeout) (its load goes on for the others).
//! A key whose load turns out revoked before the call started (its fenced
//! write refused: see `Landed`) goes through a second pass with the other
//! such keys, as one batch, under a deadline of its own.

mod fill;
mod loader;
mod lookup;
mod pipeline;

use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::field::Empty;
use tracing::{Instrument, Span};

use crate::cache::handle::Cache;
use crate::cache::loaded::{LoadContext, Loaded};
use crate::cache::options::Options;
use crate::cache::per_call::call_settings;
use crate::cache::tags::TagSet;
use crate::cache::value::Value;
use crate::error::Error;
use crate::freshness::EarlyRefresh;
use crate::jitter::Jitter;
use crate::key::CacheKey;
use crate::served::Fetched;
use loader::{BatchLoad, BoxError, ContextBatch, TaggedBatch, UserBatch};

impl<V: Value> Cache<V> {
    /// The values of many keys at once, loading the missing ones with one
    /// call of `loader` (per 500 keys), in the order of `keys`.
    ///
    /// `loader` gets the keys that are missing or expired (and not being
    /// loaded by another caller or process) and returns the values it
    /// found, as `(key, value)` pairs in any order (a `Vec`, a `HashMap`):
    /// a key it leaves out does not exist, and is cached as such for
    /// `negative_ttl`. Across the fleet every key is loaded once: keys
    /// another process is loading are awaited and woken by its write, and
    /// keys this process is already loading are joined.
    ///
    /// # Order
    ///
    /// 1. L1 answers the keys it holds fresh.
    /// 2. One store read for the rest (one `MGET`; on a Redis Cluster one
    ///    per hash slot, side by side), each entry judged as `get_or_load`
    ///    judges it: fresh is served, stale within grace is served while
    ///    one background batch refreshes it.
    /// 3. The keys to load join the flights of this process already in the
    ///    air; the others' leases are taken in one step (one script; per
    ///    hash slot on a Cluster) and read once more.
    /// 4. One loader call per 500 of the keys taken; each value is written
    ///    through its key's lease fence, so an invalidation that lands
    ///    during the load keeps it out, as for `get_or_load`.
    /// 5. Keys another process is loading are awaited, woken by its write;
    ///    if it dies, its keys are taken over when their leases expire, as
    ///    one batch per waiting call (one loader call per 500 keys, one
    ///    fleet-wide per key): a dead holder costs the lease TTL plus one
    ///    load.
    ///
    /// Per key, what `get_or_load` guarantees holds: grace, fail-safe,
    /// L1, the breakers, one load per key fleet-wide, no resurrection.
    /// The call ends by `lock_wait + queue_wait + load_timeout + 1 s`; a
    /// key not done by then fails with [`Timeout`](crate::ErrorKind::Timeout).
    ///
    /// The bulkhead counts one slot per loader call (one database query),
    /// and `load_timeout` bounds each call.
    ///
    /// # Errors
    ///
    /// The first key's error, in the order of `keys`, if any key could not
    /// be served (no stale value or fallback stood in): as
    /// [`get_or_load`](Self::get_or_load). Use
    /// [`get_many_with_meta`](Self::get_many_with_meta) for each key's own
    /// outcome.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::collections::HashMap;
    /// # use breakwater_cache::Cache;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), breakwater_cache::Error> {
    /// let cache = Cache::<String>::builder().namespace("users").build()?;
    /// cache.set(2u64, &"cached".to_string()).await?;
    ///
    /// let names = cache
    ///     .get_many([1u64, 2, 3], |ids: Vec<u64>| async move {
    ///         // One query for every missing id: here 1 and 3. Id 3 does
    ///         // not exist, so it is left out.
    ///         assert_eq!(ids, [1, 3]);
    ///         let rows: HashMap<u64, String> = ids
    ///             .into_iter()
    ///             .filter(|id| *id != 3)
    ///             .map(|id| (id, format!("user {id}")))
    ///             .collect();
    ///         Ok::<_, std::io::Error>(rows)
    ///     })
    ///     .await?;
    /// assert_eq!(names, [Some("user 1".to_string()), Some("cached".to_string()), None]);
    /// # Ok(()) }
    /// ```
    pub async fn get_many<K, I, F, Fut, R, E>(
        &self,
        keys: I,
        loader: F,
    ) -> Result<Vec<Option<V>>, Error>
    where
        I: IntoIterator<Item = K>,
        K: CacheKey + Clone + Send + Sync + 'static,
        F: Fn(Vec<K>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, E>> + Send + 'static,
        R: IntoIterator<Item = (K, V)>,
        E: Into<BoxError> + 'static,
    {
        values(self.get_many_with_meta(keys, loader).await)
    }

    /// [`get_many`](Self::get_many), with each key's own outcome: its value
    /// and how it was served ([`Served`](crate::Served)), or its error.
    ///
    /// # Examples
    ///
    /// ```
    /// use breakwater_cache::{Cache, Served};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), breakwater_cache::Error> {
    /// let cache = Cache::<u64>::builder().build()?;
    /// let load = |ids: Vec<u64>| async move {
    ///     Ok::<_, std::io::Error>(ids.into_iter().map(|id| (id, id * 10)).collect::<Vec<_>>())
    /// };
    /// cache.get_many([1u64], load).await?;
    /// let got = cache.get_many_with_meta([1u64, 2], load).await;
    /// assert_eq!(got[0].as_ref().unwrap().served, Served::Hit);
    /// assert_eq!(got[1].as_ref().unwrap().served, Served::Loaded);
    /// assert_eq!(got[1].as_ref().unwrap().value, Some(20));
    /// # Ok(()) }
    /// ```
    pub async fn get_many_with_meta<K, I, F, Fut, R, E>(
        &self,
        keys: I,
        loader: F,
    ) -> Vec<Result<Fetched<V>, Error>>
    where
        I: IntoIterator<Item = K>,
        K: CacheKey + Clone + Send + Sync + 'static,
        F: Fn(Vec<K>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, E>> + Send + 'static,
        R: IntoIterator<Item = (K, V)>,
        E: Into<BoxError> + 'static,
    {
        let keys: Vec<K> = keys.into_iter().collect();
        let batch = UserBatch(loader, PhantomData);
        self.fetch_many_in_span(keys, batch, &self.inner.defaults, None)
            .await
    }

    /// [`get_many`](Self::get_many) with a loader that decides per value:
    /// it gets each key with its [`LoadContext`] (the value the load
    /// replaces, if any: a background refresh of stale keys shows them
    /// with their validators) and answers a [`Loaded`] per key, whose
    /// settings (TTL, jitter, grace, `max_stale`, "do not cache",
    /// "not modified", a validator) apply to that key's write alone, as a
    /// single-key context loader's do
    /// ([`get_or_load_with_context`](Self::get_or_load_with_context)). A
    /// key left out is cached as "not found"; a key whose choice is out of
    /// bounds fails alone, with a [`Config`](crate::ErrorKind::Config)
    /// error.
    ///
    /// # Errors
    ///
    /// As [`get_many`](Self::get_many).
    ///
    /// # Examples
    ///
    /// Search results cached for 5 minutes, empty ones for 5 seconds:
    ///
    /// ```
    /// use std::time::Duration;
    /// use breakwater_cache::{Cache, LoadContext, Loaded};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), breakwater_cache::Error> {
    /// let cache = Cache::<Vec<u64>>::builder().ttl(Duration::from_secs(300)).build()?;
    /// let hits = cache
    ///     .get_many_with_context(["shoes", "xyzzy"], |queries: Vec<(&'static str, LoadContext<Vec<u64>>)>| async move {
    ///         let answers = queries.into_iter().map(|(query, _ctx)| {
    ///             let found: Vec<u64> = if query == "shoes" { vec![7, 9] } else { vec![] };
    ///             let ttl = if found.is_empty() { 5 } else { 300 };
    ///             (query, Loaded::value(found).ttl(Duration::from_secs(ttl)))
    ///         });
    ///         Ok::<_, std::io::Error>(answers.collect::<Vec<_>>())
    ///     })
    ///     .await?;
    /// assert_eq!(hits, [Some(vec![7, 9]), Some(vec![])]);
    /// # Ok(()) }
    /// ```
    pub async fn get_many_with_context<K, I, F, Fut, R, E>(
        &self,
        keys: I,
        loader: F,
    ) -> Result<Vec<Option<V>>, Error>
    where
        I: IntoIterator<Item = K>,
        K: CacheKey + Clone + Send + Sync + 'static,
        F: Fn(Vec<(K, LoadContext<V>)>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, E>> + Send + 'static,
        R: IntoIterator<Item = (K, Loaded<V>)>,
        E: Into<BoxError> + 'static,
    {
        values(self.get_many_with_context_meta(keys, loader).await)
    }

    /// [`get_many_with_context`](Self::get_many_with_context), with each
    /// key's own outcome (as [`get_many_with_meta`](Self::get_many_with_meta)).
    pub async fn get_many_with_context_meta<K, I, F, Fut, R, E>(
        &self,
        keys: I,
        loader: F,
    ) -> Vec<Result<Fetched<V>, Error>>
    where
        I: IntoIterator<Item = K>,
        K: CacheKey + Clone + Send + Sync + 'static,
        F: Fn(Vec<(K, LoadContext<V>)>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, E>> + Send + 'static,
        R: IntoIterator<Item = (K, Loaded<V>)>,
        E: Into<BoxError> + 'static,
    {
        let keys: Vec<K> = keys.into_iter().collect();
        let batch = ContextBatch(loader, PhantomData);
        self.fetch_many_in_span(keys, batch, &self.inner.defaults, None)
            .await
    }

    /// One `get_many` call with its own settings and tags; see
    /// [`CacheEntries`].
    pub fn entries(&self) -> CacheEntries<'_, V> {
        CacheEntries {
            cache: self,
            options: self.inner.defaults,
            tags: Vec::new(),
        }
    }

    /// `get_many_with_meta`'s work, in its span: `tags`, if the call named
    /// them, recorded in every entry it writes, and required of every entry
    /// it serves.
    async fn fetch_many_in_span<K, B>(
        &self,
        keys: Vec<K>,
        batch: B,
        options: &Options,
        tags: Option<TagSet>,
    ) -> Vec<Result<Fetched<V>, Error>>
    where
        K: CacheKey + Clone + Send + Sync + 'static,
        B: BatchLoad<K, V>,
    {
        let span = if tracing::dispatcher::has_been_set() {
            tracing::info_span!(
                "breakwater.get_many",
                namespace = %self.inner.settings.namespace,
                keys = keys.len(),
                loaded = Empty,
            )
        } else {
            Span::none()
        };
        let started = Instant::now();
        match tags {
            None => {
                self.fetch_many(keys, Arc::new(batch), options, started, 1)
                    .instrument(span)
                    .await
            }
            Some(tags) => {
                let batch = Arc::new(TaggedBatch { batch, tags });
                self.fetch_many(keys, batch, options, started, 1)
                    .instrument(span)
                    .await
            }
        }
    }
}

/// One `get_many` with its own settings and tags; see [`Cache::entries`].
///
/// Settings not given here are the cache's. Tags are recorded in every
/// entry the call's loads write ([`Cache::invalidate_tag`] of any of them
/// makes those entries unreachable, fleet-wide), and required of every
/// entry it serves: an entry of one of its keys written without them (by
/// an untagged call) is loaded again, under its lease, and written with
/// them, so a tag invalidation reaches every value the call returns.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use breakwater_cache::Cache;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), breakwater_cache::Error> {
/// let cache = Cache::<u64>::builder().build()?;
/// let prices = cache
///     .entries()
///     .tags(["shop:3"])
///     .ttl(Duration::from_secs(60))
///     .get_many([5u64, 6], |ids: Vec<u64>| async move {
///         Ok::<_, std::io::Error>(ids.into_iter().map(|id| (id, 100 + id)).collect::<Vec<_>>())
///     })
///     .await?;
/// assert_eq!(prices, [Some(105), Some(106)]);
/// cache.invalidate_tag("shop:3").await?;
/// assert_eq!(cache.get(5u64).await?, None);
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "CacheEntries does nothing until get_many is called"]
pub struct CacheEntries<'a, V> {
    cache: &'a Cache<V>,
    options: Options,
    tags: Vec<Vec<u8>>,
}

impl<V: Value> CacheEntries<'_, V> {
    /// Tags every entry this call writes, and requires them of every entry
    /// it serves (see [`CacheEntries`]); called again, it adds more. The
    /// bounds are [`CacheEntry::tags`](crate::CacheEntry::tags)'.
    pub fn tags<I>(mut self, tags: I) -> Self
    where
        I: IntoIterator,
        I::Item: CacheKey,
    {
        self.tags
            .extend(tags.into_iter().map(|tag| tag.key_bytes().to_vec()));
        self
    }

    call_settings!();

    /// [`Cache::get_many`] with this call's settings and tags.
    ///
    /// # Errors
    ///
    /// As [`Cache::get_many`]; [`Config`](crate::ErrorKind::Config) if
    /// this call's settings are invalid, [`InvalidKey`](crate::ErrorKind::InvalidKey)
    /// for an invalid tag.
    pub async fn get_many<K, I, F, Fut, R, E>(
        self,
        keys: I,
        loader: F,
    ) -> Result<Vec<Option<V>>, Error>
    where
        I: IntoIterator<Item = K>,
        K: CacheKey + Clone + Send + Sync + 'static,
        F: Fn(Vec<K>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, E>> + Send + 'static,
        R: IntoIterator<Item = (K, V)>,
        E: Into<BoxError> + 'static,
    {
        values(self.get_many_with_meta(keys, loader).await?)
    }

    /// [`Cache::get_many_with_meta`] with this call's settings and tags.
    ///
    /// # Errors
    ///
    /// [`Config`](crate::ErrorKind::Config) if this call's settings are
    /// invalid, [`InvalidKey`](crate::ErrorKind::InvalidKey) for an
    /// invalid tag (nothing is read then); each key's own outcome
    /// otherwise.
    pub async fn get_many_with_meta<K, I, F, Fut, R, E>(
        self,
        keys: I,
        loader: F,
    ) -> Result<Vec<Result<Fetched<V>, Error>>, Error>
    where
        I: IntoIterator<Item = K>,
        K: CacheKey + Clone + Send + Sync + 'static,
        F: Fn(Vec<K>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, E>> + Send + 'static,
        R: IntoIterator<Item = (K, V)>,
        E: Into<BoxError> + 'static,
    {
        self.fetch(keys.into_iter().collect(), UserBatch(loader, PhantomData))
            .await
    }

    /// [`Cache::get_many_with_context`] with this call's settings and tags
    /// (the loader's choices override them per key).
    ///
    /// # Errors
    ///
    /// As [`CacheEntries::get_many`].
    pub async fn get_many_with_context<K, I, F, Fut, R, E>(
        self,
        keys: I,
        loader: F,
    ) -> Result<Vec<Option<V>>, Error>
    where
        I: IntoIterator<Item = K>,
        K: CacheKey + Clone + Send + Sync + 'static,
        F: Fn(Vec<(K, LoadContext<V>)>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, E>> + Send + 'static,
        R: IntoIterator<Item = (K, Loaded<V>)>,
        E: Into<BoxError> + 'static,
    {
        values(self.get_many_with_context_meta(keys, loader).await?)
    }

    /// [`Cache::get_many_with_context_meta`] with this call's settings and
    /// tags.
    ///
    /// # Errors
    ///
    /// As [`CacheEntries::get_many_with_meta`].
    pub async fn get_many_with_context_meta<K, I, F, Fut, R, E>(
        self,
        keys: I,
        loader: F,
    ) -> Result<Vec<Result<Fetched<V>, Error>>, Error>
    where
        I: IntoIterator<Item = K>,
        K: CacheKey + Clone + Send + Sync + 'static,
        F: Fn(Vec<(K, LoadContext<V>)>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, E>> + Send + 'static,
        R: IntoIterator<Item = (K, Loaded<V>)>,
        E: Into<BoxError> + 'static,
    {
        self.fetch(
            keys.into_iter().collect(),
            ContextBatch(loader, PhantomData),
        )
        .await
    }

    /// The call, once its settings and tags are checked.
    async fn fetch<K, B>(
        self,
        keys: Vec<K>,
        batch: B,
    ) -> Result<Vec<Result<Fetched<V>, Error>>, Error>
    where
        K: CacheKey + Clone + Send + Sync + 'static,
        B: BatchLoad<K, V>,
    {
        self.options.validate()?;
        let tags = if self.tags.is_empty() {
            None
        } else {
            Some(TagSet::new(self.tags, &self.options)?)
        };
        Ok(self
            .cache
            .fetch_many_in_span(keys, batch, &self.options, tags)
            .await)
    }
}

/// Each key's value, or the first key's error.
fn values<V>(fetched: Vec<Result<Fetched<V>, Error>>) -> Result<Vec<Option<V>>, Error> {
    fetched.into_iter().map(|f| f.map(|f| f.value)).collect()
}

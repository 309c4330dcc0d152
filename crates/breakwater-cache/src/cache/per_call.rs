//! One call with its own settings: [`CacheEntry`].

use std::error::Error as StdError;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::handle::Cache;
use super::loaded::{LoadContext, Loaded};
use super::options::Options;
use super::tags::TagSet;
use super::value::{Load, Tagged, Value, WithContext};
use crate::error::Error;
use crate::freshness::EarlyRefresh;
use crate::jitter::Jitter;
use crate::key::CacheKey;
use crate::served::Fetched;

/// The settings one call may override, as builder methods on `self.options`
/// (shared by [`CacheEntry`] and `CacheEntries`, `get_many`'s).
macro_rules! call_settings {
    () => {
        /// The fresh TTL for this call's write, before jitter.
        pub fn ttl(mut self, ttl: Duration) -> Self {
            self.options.ttl = ttl;
            self
        }

        /// The negative TTL for this call's write, before jitter.
        pub fn negative_ttl(mut self, ttl: Duration) -> Self {
            self.options.negative_ttl = ttl;
            self
        }

        /// The jitter for this call's write.
        pub fn jitter(mut self, jitter: Jitter) -> Self {
            self.options.jitter = jitter;
            self
        }

        /// The grace window (stale-while-revalidate); `Duration::ZERO` opts out.
        pub fn grace(mut self, grace: Duration) -> Self {
            self.options.grace = grace;
            self
        }

        /// The most a value may be served past its fresh window (fail-safe).
        pub fn max_stale(mut self, max_stale: Duration) -> Self {
            self.options.max_stale = Some(max_stale);
            self
        }

        /// Early refresh before the value goes stale.
        pub fn early_refresh(mut self, early: EarlyRefresh) -> Self {
            self.options.early_refresh = early;
            self
        }

        /// Serve the stale value if the load takes longer than this.
        pub fn soft_timeout(mut self, timeout: Duration) -> Self {
            self.options.soft_timeout = Some(timeout);
            self
        }

        /// The hard bound on this call's load.
        pub fn load_timeout(mut self, timeout: Duration) -> Self {
            self.options.load_timeout = timeout;
            self
        }
    };
}
pub(super) use call_settings;

/// One call with its own settings; see [`Cache::entry`].
///
/// Settings not given here are the cache's. When callers with different
/// settings share one load, the settings of the call that started it apply
/// to the write.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use breakwater_cache::{Cache, Jitter};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), breakwater_cache::Error> {
/// let cache = Cache::<u64>::builder().build()?;
/// let stock = cache
///     .entry("stock:42")
///     .ttl(Duration::from_secs(5))
///     .jitter(Jitter::down(0.2)) // never older than 5 s
///     .grace(Duration::ZERO)     // stock must not be served stale
///     .get_or_load(|| async { Ok::<_, std::io::Error>(Some(3)) })
///     .await?;
/// assert_eq!(stock, Some(3));
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "a CacheEntry does nothing until get_or_load is called"]
pub struct CacheEntry<'a, V> {
    cache: &'a Cache<V>,
    key: Vec<u8>,
    options: Options,
    /// The tags this call's write records; checked when the call is made.
    tags: Vec<Vec<u8>>,
}

impl<'a, V: Value> CacheEntry<'a, V> {
    pub(super) fn new(cache: &'a Cache<V>, key: &[u8], options: Options) -> Self {
        CacheEntry {
            cache,
            key: key.to_vec(),
            options,
            tags: Vec::new(),
        }
    }

    /// Tags this call's write: [`Cache::invalidate_tag`] of any of them
    /// makes the entry unreachable, fleet-wide. Called again, it adds more.
    ///
    /// A tag is 1 to 256 bytes (any [`CacheKey`]); an entry has at most 16
    /// distinct tags (duplicates count once). A store read by a call that
    /// names its entry's tags fetches the entry and their generations in
    /// one `MGET` (one round trip, as an untagged hit); tags the loader
    /// chose and the call did not name cost one more `MGET` on such a read,
    /// and the load that writes a tagged entry one more round trip.
    /// Untagged entries cost nothing more. Tags apply to the value this call writes: a call that finds
    /// the value cached, or shares another call's load, gets that value
    /// with the tags it was written with.
    ///
    /// # Examples
    ///
    /// ```
    /// use breakwater_cache::Cache;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), breakwater_cache::Error> {
    /// let cache = Cache::<u64>::builder().build()?;
    /// let price = cache
    ///     .entry("price:42")
    ///     .tags(["product:42", "catalog"])
    ///     .get_or_load(|| async { Ok::<_, std::io::Error>(Some(1999)) })
    ///     .await?;
    /// assert_eq!(price, Some(1999));
    /// cache.invalidate_tag("catalog").await?;
    /// assert_eq!(cache.get("price:42").await?, None);
    /// # Ok(()) }
    /// ```
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

    /// [`Cache::get_or_load`] with this call's settings.
    ///
    /// # Errors
    ///
    /// As [`Cache::get_or_load`], and [`Config`](crate::ErrorKind::Config) if
    /// this call's settings are invalid.
    pub async fn get_or_load<F, Fut, E>(self, loader: F) -> Result<Option<V>, Error>
    where
        F: FnOnce() -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<Option<V>, E>> + Send + 'static,
        E: Into<Box<dyn StdError + Send + Sync + 'static>> + 'static,
    {
        self.get_or_load_with_meta(loader).await.map(|f| f.value)
    }

    /// [`Cache::get_or_load_with_meta`] with this call's settings.
    ///
    /// # Errors
    ///
    /// As [`get_or_load`](Self::get_or_load).
    pub async fn get_or_load_with_meta<F, Fut, E>(self, loader: F) -> Result<Fetched<V>, Error>
    where
        F: FnOnce() -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<Option<V>, E>> + Send + 'static,
        E: Into<Box<dyn StdError + Send + Sync + 'static>> + 'static,
    {
        self.fetch_with(loader).await
    }

    /// The call, with any loader: its settings checked, its tags given to
    /// the loader's write.
    async fn fetch_with<L: Load<V>>(self, loader: L) -> Result<Fetched<V>, Error> {
        self.options.validate()?;
        if self.tags.is_empty() {
            return self.cache.fetch(&self.key, loader, &self.options).await;
        }
        let tags = TagSet::new(self.tags, &self.options)?;
        let loader = Tagged {
            loader,
            tags: Arc::new(tags),
        };
        self.cache.fetch(&self.key, loader, &self.options).await
    }

    /// [`Cache::get_or_load_with_context`] with this call's settings: the
    /// loader's choices go over them.
    ///
    /// # Errors
    ///
    /// As [`Cache::get_or_load_with_context`], and
    /// [`Config`](crate::ErrorKind::Config) if this call's settings are
    /// invalid.
    pub async fn get_or_load_with_context<F, Fut, E>(self, loader: F) -> Result<Option<V>, Error>
    where
        F: FnOnce(LoadContext<V>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<Loaded<V>, E>> + Send + 'static,
        E: Into<Box<dyn StdError + Send + Sync + 'static>> + 'static,
    {
        self.get_or_load_with_context_meta(loader)
            .await
            .map(|f| f.value)
    }

    /// [`Cache::get_or_load_with_context_meta`] with this call's settings.
    ///
    /// # Errors
    ///
    /// As [`get_or_load_with_context`](Self::get_or_load_with_context).
    pub async fn get_or_load_with_context_meta<F, Fut, E>(
        self,
        loader: F,
    ) -> Result<Fetched<V>, Error>
    where
        F: FnOnce(LoadContext<V>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<Loaded<V>, E>> + Send + 'static,
        E: Into<Box<dyn StdError + Send + Sync + 'static>> + 'static,
    {
        self.fetch_with(WithContext(loader)).await
    }

    /// [`Cache::set`] with this call's settings (TTL, jitter, `max_stale`)
    /// and [`tags`](Self::tags): the tags' current generations are read (one
    /// `MGET`) and recorded with the value. A tag invalidated between that
    /// read and the write leaves the value invalid at once (read as a miss),
    /// never an older value valid.
    ///
    /// # Errors
    ///
    /// As [`Cache::set`]; [`Config`](crate::ErrorKind::Config) if this
    /// call's settings are invalid, [`InvalidKey`](crate::ErrorKind::InvalidKey)
    /// for an invalid tag, [`Store`](crate::ErrorKind::Store) if the tags'
    /// generations cannot be read (nothing is written).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use breakwater_cache::Cache;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), breakwater_cache::Error> {
    /// let cache = Cache::<String>::builder().build()?;
    /// cache
    ///     .entry("user:7:name")
    ///     .tags(["user:7"])
    ///     .ttl(Duration::from_secs(60))
    ///     .set(&"Ada".to_string())
    ///     .await?;
    /// assert_eq!(cache.get("user:7:name").await?.as_deref(), Some("Ada"));
    /// cache.invalidate_tag("user:7").await?;
    /// assert_eq!(cache.get("user:7:name").await?, None);
    /// # Ok(()) }
    /// ```
    pub async fn set(self, value: &V) -> Result<(), Error> {
        self.options.validate()?;
        let tags = if self.tags.is_empty() {
            None
        } else {
            Some(TagSet::new(self.tags, &self.options)?)
        };
        self.cache
            .set_with(&self.key, value, tags.as_ref(), &self.options)
            .await
    }
}

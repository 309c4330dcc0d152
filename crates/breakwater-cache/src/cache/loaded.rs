//! A loader that decides per value, so that a value is cached as long as it
//! is good for and no longer: what a context loader sees before it runs
//! ([`LoadContext`]: the stale value it replaces) and what it answers
//! ([`Loaded`]: the value, with this value's TTL, jitter, grace,
//! `max_stale`, tags, or "do not cache").
//!
//! A loader of [`Cache::get_or_load`](crate::Cache::get_or_load) takes
//! nothing and returns `Option<V>`; one of
//! [`Cache::get_or_load_with_context`](crate::Cache::get_or_load_with_context)
//! takes a [`LoadContext`] and returns a [`Loaded`]. Its choices override
//! the call's settings (the cache's, or a [`CacheEntry`](crate::CacheEntry)'s)
//! for the write of this one value, and are checked by the same rules as
//! the builder's: a choice out of bounds is an
//! [`ErrorKind::Config`](crate::ErrorKind::Config) error for every caller
//! of that load (the value is not served, nor written), never a panic or a
//! silent default.
//!
//! # Conditional refresh
//!
//! A value may carry a small validator ([`Loaded::validator`]: an ETag, a
//! row version, an `updated_at`, up to 255 bytes), stored with it. A
//! refresh sees it ([`StaleValue::validator`]) and may answer
//! [`Loaded::not_modified`]: the stored entry's fresh window is renewed
//! (a new jittered TTL, through the lease's fence, with the fleet told so
//! other processes' L1 copies are dropped and read again) without the value
//! being encoded or sent again: the store is sent a few dozen bytes
//! whatever the value's size ([`Store::fenced_renew`](crate::Store::fenced_renew)).
//! If the stored entry is gone or was rewritten meanwhile, the value the
//! loader saw is written whole instead.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::options::Options;
use super::tags::check_tag;
use crate::clock::millis;
use crate::entry::{Extra, MAX_TAGS, MAX_VALIDATOR_LEN};
use crate::error::{ConfigError, Error};
use crate::jitter::Jitter;
use crate::key::CacheKey;

/// What a context loader sees before it runs.
///
/// Passed by value to each call of the loader (each retry gets its own);
/// cheap to clone.
///
/// # Examples
///
/// ```
/// use breakwater_cache::{Cache, LoadContext, Loaded};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), breakwater_cache::Error> {
/// let cache = Cache::<String>::builder().build()?;
/// let page = cache
///     .get_or_load_with_context("page:home", |ctx: LoadContext<String>| async move {
///         // A refresh sees the value it replaces.
///         let before = ctx.stale().and_then(|stale| stale.value().cloned());
///         Ok::<_, std::io::Error>(Loaded::value(format!("home (was {before:?})")))
///     })
///     .await?;
/// assert_eq!(page.as_deref(), Some("home (was None)"));
/// # Ok(()) }
/// ```
pub struct LoadContext<V> {
    stale: Option<Arc<StaleValue<V>>>,
}

impl<V> LoadContext<V> {
    /// A context with nothing in it (a first load).
    pub(crate) fn empty() -> Self {
        LoadContext { stale: None }
    }

    /// A context holding the stored value this load replaces.
    pub(crate) fn replacing(stale: StaleValue<V>) -> Self {
        LoadContext {
            stale: Some(Arc::new(stale)),
        }
    }

    /// The value this load replaces, if the cache had one: a stale value
    /// (a refresh in grace, or a load past it), or a fresh one (an early
    /// refresh). `None` for a first load, and when the store could not be
    /// read.
    pub fn stale(&self) -> Option<&StaleValue<V>> {
        self.stale.as_deref()
    }
}

impl<V> Clone for LoadContext<V> {
    fn clone(&self) -> Self {
        LoadContext {
            stale: self.stale.clone(),
        }
    }
}

impl<V: fmt::Debug> fmt::Debug for LoadContext<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadContext")
            .field("stale", &self.stale)
            .finish()
    }
}

/// The stored value a load replaces, as the loader sees it
/// ([`LoadContext::stale`]).
#[derive(Debug, Clone)]
pub struct StaleValue<V> {
    value: Option<V>,
    expired_for: Option<Duration>,
    validator: Option<Box<[u8]>>,
}

impl<V> StaleValue<V> {
    pub(crate) fn new(
        value: Option<V>,
        expired_for: Option<Duration>,
        validator: Option<Box<[u8]>>,
    ) -> Self {
        StaleValue {
            value,
            expired_for,
            validator,
        }
    }

    /// The validator the value was written with ([`Loaded::validator`]),
    /// if any: compare it with the source's and answer
    /// [`Loaded::not_modified`] when they match.
    pub fn validator(&self) -> Option<&[u8]> {
        self.validator.as_deref()
    }

    /// The value; `None` if what was cached is the absence of one (a
    /// negative entry).
    pub fn value(&self) -> Option<&V> {
        self.value.as_ref()
    }

    /// How long ago the value stopped being fresh, on the store's clock;
    /// `None` while it is still fresh (an early refresh).
    pub fn expired_for(&self) -> Option<Duration> {
        self.expired_for
    }
}

/// What a context loader answers: the value (or its absence), with the
/// settings of its own write.
///
/// Settings not chosen are the call's. `ttl` applies to a value,
/// `negative_ttl` to [`Loaded::none`]; both before jitter.
///
/// # Examples
///
/// An OAuth token cached exactly as long as it is valid, a search result
/// with no hits cached briefly, and a row that failed validation not
/// cached at all:
///
/// ```
/// use std::time::Duration;
/// use breakwater_cache::{Jitter, Loaded};
///
/// let token: Loaded<String> = Loaded::value("t0k3n".to_string())
///     .ttl(Duration::from_secs(3600))
///     .jitter(Jitter::down(0.1)); // never past the token's own expiry
/// let hits: Loaded<Vec<u64>> = Loaded::value(vec![]).ttl(Duration::from_secs(5));
/// let invalid: Loaded<String> = Loaded::value("half-written row".into()).do_not_cache();
/// # let _ = (token, hits, invalid);
/// ```
#[derive(Debug, Clone)]
#[must_use = "a Loaded is the loader's answer: return it"]
pub struct Loaded<V> {
    pub(crate) value: Option<V>,
    pub(crate) choices: Choices,
    validator: Option<Box<[u8]>>,
    /// "Not modified": the stored value stands.
    unchanged: bool,
    /// Tags chosen by the loader (see [`Loaded::tags`]).
    tags: Vec<Vec<u8>>,
}

/// A loader's answer as the fill takes it.
pub(crate) enum Resolved<V> {
    /// A value (or its absence), written with these settings and these
    /// extensions (its validator, its own grace); `None` settings: not
    /// cached.
    Write {
        value: Option<V>,
        keep: Option<Options>,
        extra: Extra,
        tags: Vec<Vec<u8>>,
    },
    /// "Not modified": the stored entry is renewed with these settings
    /// (`None`: left as it is); `grace_ms`: the grace the loader chose, if
    /// it chose one.
    Unchanged {
        keep: Option<Options>,
        grace_ms: Option<u64>,
        tags: Vec<Vec<u8>>,
    },
}

impl<V> Resolved<V> {
    /// The tags the loader chose, checked, distinct and sorted.
    pub(crate) fn tags(&self) -> &[Vec<u8>] {
        match self {
            Resolved::Write { tags, .. } | Resolved::Unchanged { tags, .. } => tags,
        }
    }
}

/// Tags a loader chose ([`Loaded::tags`]): each checked, distinct and
/// sorted; one out of bounds (or too many) is a
/// [`Config`](crate::ErrorKind::Config) error.
fn chosen_tags(mut tags: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>, Error> {
    if tags.is_empty() {
        return Ok(tags);
    }
    let invalid = |message: String| {
        Error::from(ConfigError::new(format!(
            "the loader chose an invalid setting: {message}"
        )))
    };
    for tag in &tags {
        check_tag(tag).map_err(|err| invalid(err.to_string()))?;
    }
    tags.sort_unstable();
    tags.dedup();
    if tags.len() > MAX_TAGS {
        return Err(invalid(format!(
            "{} tags on one entry, the limit is {MAX_TAGS}",
            tags.len()
        )));
    }
    Ok(tags)
}

/// The settings a loader chose for its value's write.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Choices {
    ttl: Option<Duration>,
    negative_ttl: Option<Duration>,
    jitter: Option<Jitter>,
    grace: Option<Duration>,
    max_stale: Option<Duration>,
    /// "Do not cache": served to the load's callers, neither written nor
    /// kept in L1.
    pub(crate) skip: bool,
}

impl Choices {
    /// Nothing chosen: the call's settings.
    pub(crate) const NONE: Choices = Choices {
        ttl: None,
        negative_ttl: None,
        jitter: None,
        grace: None,
        max_stale: None,
        skip: false,
    };

    /// The call's `options` with these choices over them, checked by the
    /// builder's rules; a choice out of bounds is a
    /// [`Config`](crate::ErrorKind::Config) error naming it.
    pub(crate) fn apply(&self, options: &Options) -> Result<Options, Error> {
        if *self == Choices::NONE {
            return Ok(*options);
        }
        let mut chosen = *options;
        if let Some(ttl) = self.ttl {
            chosen.ttl = ttl;
        }
        if let Some(ttl) = self.negative_ttl {
            chosen.negative_ttl = ttl;
        }
        if let Some(jitter) = self.jitter {
            chosen.jitter = jitter;
        }
        if let Some(grace) = self.grace {
            chosen.grace = grace;
            // A grace past the call's max_stale widens it: the loader
            // asked for that much stale serving.
            if self.max_stale.is_none() && chosen.max_stale.is_some_and(|m| m < grace) {
                chosen.max_stale = Some(grace);
            }
        }
        if let Some(max_stale) = self.max_stale {
            chosen.max_stale = Some(max_stale);
        }
        chosen.validate().map_err(|err| {
            Error::from(ConfigError::new(format!(
                "the loader chose an invalid setting: {}",
                err.message()
            )))
        })?;
        Ok(chosen)
    }
}

impl<V> Loaded<V> {
    /// The answer as a write takes it: the value, and the settings of its
    /// write (the call's `options` with the choices over them), `None` for
    /// "do not cache". A choice out of bounds is a
    /// [`Config`](crate::ErrorKind::Config) error.
    pub(crate) fn resolve(self, options: &Options) -> Result<Resolved<V>, Error> {
        let chosen = self.choices.apply(options)?;
        let keep = (!self.choices.skip).then_some(chosen);
        let grace_ms = self.choices.grace.map(millis);
        let tags = chosen_tags(self.tags)?;
        if self.unchanged {
            return Ok(Resolved::Unchanged {
                keep,
                grace_ms,
                tags,
            });
        }
        if let Some(validator) = &self.validator
            && (validator.is_empty() || validator.len() > MAX_VALIDATOR_LEN)
        {
            return Err(Error::from(ConfigError::new(format!(
                "the loader chose an invalid setting: a validator is 1 to {MAX_VALIDATOR_LEN} bytes, got {}",
                validator.len()
            ))));
        }
        Ok(Resolved::Write {
            value: self.value,
            keep,
            extra: Extra::new(self.validator, grace_ms),
            tags,
        })
    }

    /// A value, cached with the call's settings unless chosen here.
    pub fn value(value: V) -> Self {
        Loaded {
            value: Some(value),
            choices: Choices::NONE,
            validator: None,
            unchanged: false,
            tags: Vec::new(),
        }
    }

    /// No value: cached as a negative entry for the negative TTL (as a
    /// plain loader's `Ok(None)`).
    pub fn none() -> Self {
        Loaded {
            value: None,
            choices: Choices::NONE,
            validator: None,
            unchanged: false,
            tags: Vec::new(),
        }
    }

    /// "Not modified": the value the loader was shown
    /// ([`LoadContext::stale`]) is still right. Its stored entry is renewed
    /// (a new fresh window, with the call's settings or those chosen here)
    /// without being sent again, and its callers get that value. Without a
    /// stored value to keep (a first load, or one the store could not
    /// give), the load fails with a [`Loader`](crate::ErrorKind::Loader)
    /// error.
    ///
    /// # Examples
    ///
    /// ```
    /// use breakwater_cache::{Cache, LoadContext, Loaded};
    ///
    /// # async fn etag_of_row() -> Result<Vec<u8>, std::io::Error> { Ok(b"v7".to_vec()) }
    /// # async fn read_row() -> Result<String, std::io::Error> { Ok("row".into()) }
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), breakwater_cache::Error> {
    /// let cache = Cache::<String>::builder().build()?;
    /// let loader = |ctx: LoadContext<String>| async move {
    ///     let etag = etag_of_row().await?; // cheap: no row read
    ///     if ctx.stale().and_then(|s| s.validator()) == Some(&etag[..]) {
    ///         return Ok(Loaded::not_modified());
    ///     }
    ///     Ok::<_, std::io::Error>(Loaded::value(read_row().await?).validator(etag))
    /// };
    /// assert_eq!(cache.get_or_load_with_context("row:7", loader).await?.as_deref(), Some("row"));
    /// # Ok(()) }
    /// ```
    pub fn not_modified() -> Self {
        Loaded {
            value: None,
            choices: Choices::NONE,
            validator: None,
            unchanged: true,
            tags: Vec::new(),
        }
    }

    /// Stores `validator` (1 to 255 bytes: an ETag, a version, an
    /// `updated_at`) with this value, for the next refresh to compare
    /// ([`StaleValue::validator`]). Longer or empty is a
    /// [`Config`](crate::ErrorKind::Config) error.
    pub fn validator(mut self, validator: impl Into<Vec<u8>>) -> Self {
        self.validator = Some(validator.into().into_boxed_slice());
        self
    }

    /// This value's fresh TTL, before jitter (1 ms to 365 days).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.choices.ttl = Some(ttl);
        self
    }

    /// This absence's TTL, before jitter, for [`Loaded::none`] (1 ms to
    /// 365 days).
    pub fn negative_ttl(mut self, ttl: Duration) -> Self {
        self.choices.negative_ttl = Some(ttl);
        self
    }

    /// This value's TTL jitter. [`Jitter::down`] keeps the TTL an upper
    /// bound (a token never outlives its own expiry).
    pub fn jitter(mut self, jitter: Jitter) -> Self {
        self.choices.jitter = Some(jitter);
        self
    }

    /// This value's grace window (stale-while-revalidate);
    /// `Duration::ZERO` opts out. Stored with the value: every reader, in
    /// any process, serves it stale for this long, whatever its own
    /// grace. A grace longer than the call's `max_stale` widens
    /// `max_stale` to it.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.choices.grace = Some(grace);
        self
    }

    /// The most this value may be served past its fresh window
    /// (fail-safe); at least its grace.
    pub fn max_stale(mut self, max_stale: Duration) -> Self {
        self.choices.max_stale = Some(max_stale);
        self
    }

    /// Tags this value is written with, beside the call's own
    /// ([`CacheEntry::tags`](crate::CacheEntry::tags)): known only once
    /// it is loaded (a product's shop, an order's customer), so
    /// [`Cache::invalidate_tag`](crate::Cache::invalidate_tag) of any of
    /// them reaches it as it reaches entries tagged by their call. May be
    /// called more than once; duplicates count once. A tag is 1 to 256
    /// bytes, an entry has at most 16 distinct tags (its call's
    /// included); beyond that, a [`Config`](crate::ErrorKind::Config)
    /// error.
    ///
    /// These tags' counters are read after the load (one more round trip
    /// on the write, never on a read). If one of them changed hard since
    /// the load began (an `invalidate_tag`, or a counter the store lost,
    /// or one that did not exist yet: a tag's first load), the value may
    /// be older than that change: it is served to the load's callers and
    /// kept in L1 (which the invalidation's notice clears), but not
    /// written to the store; the next load writes it. A soft change
    /// ([`Cache::expire_tag`](crate::Cache::expire_tag)) since the load
    /// began writes it stale. With [`not_modified`](Self::not_modified),
    /// the stored entry's own tags stand unless tags are chosen here.
    ///
    /// A call that names tags itself and whose loader adds others is
    /// served from the store, not from L1 (an L1 copy serves a tagged call
    /// only if it has exactly the call's tags).
    ///
    /// # Examples
    ///
    /// ```
    /// use breakwater_cache::{Cache, LoadContext, Loaded};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), breakwater_cache::Error> {
    /// let cache = Cache::<String>::builder().build()?;
    /// let load = |_: LoadContext<String>| async {
    ///     // The product row says which shop it belongs to.
    ///     let (name, shop) = ("kettle".to_string(), 3);
    ///     Ok::<_, std::io::Error>(Loaded::value(name).tags([format!("shop:{shop}")]))
    /// };
    /// let name = cache.get_or_load_with_context("product:5", load).await?;
    /// assert_eq!(name.as_deref(), Some("kettle"));
    /// // Whenever the shop's prices change:
    /// cache.invalidate_tag("shop:3").await?;
    /// assert_eq!(cache.get("product:5").await?, None);
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

    /// Serve this value to the load's callers, but do not cache it: no
    /// write to the store, no L1 copy. The next call loads again (its
    /// callers still share one load, as every load's do).
    pub fn do_not_cache(mut self) -> Self {
        self.choices.skip = true;
        self
    }

    /// Whether [`do_not_cache`](Self::do_not_cache) was chosen.
    pub fn is_cached(&self) -> bool {
        !self.choices.skip
    }

    /// The tags chosen ([`Loaded::tags`]), as given (unchecked).
    pub(crate) fn chosen_tags(&self) -> &[Vec<u8>] {
        &self.tags
    }

    /// The value, if any.
    pub fn get(&self) -> Option<&V> {
        self.value.as_ref()
    }
}

impl<V> From<Option<V>> for Loaded<V> {
    /// A plain loader's answer: a value or its absence, with the call's
    /// settings.
    fn from(value: Option<V>) -> Self {
        Loaded {
            value,
            choices: Choices::NONE,
            validator: None,
            unchanged: false,
            tags: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn options() -> Options {
        let cache = crate::Cache::<u64>::builder()
            .store(crate::MemoryStore::new())
            .build()
            .expect("defaults build");
        cache.inner.defaults
    }

    #[test]
    fn nothing_chosen_is_the_call_s_settings() {
        let options = options();
        assert_eq!(Choices::NONE.apply(&options).unwrap(), options);
    }

    #[test]
    fn choices_override_the_call_s_settings() {
        let options = options();
        let loaded = Loaded::value(1u64)
            .ttl(Duration::from_secs(2))
            .jitter(Jitter::none())
            .grace(Duration::from_secs(7));
        let chosen = loaded.choices.apply(&options).unwrap();
        assert_eq!(chosen.ttl, Duration::from_secs(2));
        assert_eq!(chosen.jitter, Jitter::none());
        assert_eq!(chosen.grace, Duration::from_secs(7));
        assert!(chosen.max_stale() >= Duration::from_secs(7));
        assert_eq!(chosen.negative_ttl, options.negative_ttl);
    }

    #[test]
    fn an_invalid_choice_is_a_config_error_naming_it() {
        let options = options();
        for (loaded, says) in [
            (
                Loaded::value(1u64).ttl(Duration::ZERO),
                "ttl must be at least 1ms",
            ),
            (
                Loaded::value(1u64).ttl(Duration::from_secs(400 * 86_400)),
                "ttl",
            ),
            (
                Loaded::value(1u64)
                    .grace(Duration::from_secs(10))
                    .max_stale(Duration::from_secs(1)),
                "grace",
            ),
            (Loaded::value(1u64).jitter(Jitter::ratio(2.0)), "jitter"),
        ] {
            let err = loaded.choices.apply(&options).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "{err}");
            let text = err.to_string();
            assert!(text.contains("the loader chose"), "{text}");
            assert!(text.contains(says), "{text} should say {says}");
        }
    }
}

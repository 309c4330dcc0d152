//! Warming: filling the cache ahead of traffic (after a deploy, a key-version
//! bump, a flushed Redis) without stampeding the database that the cache
//! exists to protect.
//!
//! A warm-up walks a list of keys with a bounded number of keys in progress
//! (`concurrency`) and starts at most `rate` loads per second. Keys already
//! fresh in the store are counted and skipped without a load. Every load
//! joins the key's load flight, past L1 (the store is what is warmed), so it
//! shares single-flight, the lease and origin protection with live
//! traffic (a key that a request is loading is not loaded twice), and every
//! write gets the cache's TTL jitter (or the warm-up's own), so the warmed
//! keys do not expire together later. A key whose store read fails (after
//! up to 10 attempts within about a second and a half, for failures that
//! may pass: a timeout, an open store breaker) is counted as failed,
//! without a load; after such a key, the next keys try once until a read
//! succeeds again, so a store that is down fails a warm-up fast.

use std::error::Error as StdError;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::Mutex;
use tokio::time::{Instant, Interval, MissedTickBehavior};

use super::fill::Mode;
use super::handle::Cache;
use super::loaded::{LoadContext, Loaded};
use super::tags::EXPIRE_SKEW;
use super::value::{Load, Value, WithContext};
use super::verdict::reading;
use crate::error::{ConfigError, Error, ErrorKind};
use crate::jitter::Jitter;
use crate::key::CacheKey;
use crate::limit::Priority;
use crate::served::Served;
use crate::store::Store;

/// The highest warm rate: loads are spaced at least 1 µs apart.
const MAX_RATE: u32 = 1_000_000;

/// How a [`Cache::warm`] runs.
///
/// # Defaults
///
/// | setting | default |
/// |---|---|
/// | `rate` | 100 loads per second |
/// | `concurrency` | 4 keys in progress |
/// | `jitter` | the cache's |
///
/// # Examples
///
/// ```
/// use breakwater_cache::{Jitter, Warm};
///
/// // 500 loads a second, 16 at a time, TTLs spread by ±25 %.
/// let warm = Warm::new().rate(500).concurrency(16).jitter(Jitter::ratio(0.25));
/// # let _ = warm;
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Warm {
    rate: u32,
    concurrency: usize,
    jitter: Option<Jitter>,
}

impl Default for Warm {
    fn default() -> Self {
        Warm {
            rate: 100,
            concurrency: 4,
            jitter: None,
        }
    }
}

impl Warm {
    /// The defaults (see the table above).
    pub fn new() -> Self {
        Self::default()
    }

    /// At most `per_second` loads start per second, evenly spaced (no
    /// burst); from 1 to 1,000,000.
    pub fn rate(mut self, per_second: u32) -> Self {
        self.rate = per_second;
        self
    }

    /// At most `keys` keys are in progress (being checked or loaded) at once.
    pub fn concurrency(mut self, keys: usize) -> Self {
        self.concurrency = keys;
        self
    }

    /// The jitter of the warm-up's writes, instead of the cache's.
    pub fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = Some(jitter);
        self
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.rate == 0 {
            return Err(ConfigError::new(
                "warm rate must be at least 1 load per second",
            ));
        }
        if self.rate > MAX_RATE {
            return Err(ConfigError::new(format!(
                "warm rate must be at most {MAX_RATE} loads per second, got {}",
                self.rate
            )));
        }
        if self.concurrency == 0 {
            return Err(ConfigError::new("warm concurrency must be at least 1"));
        }
        Ok(())
    }
}

/// What a [`Cache::warm`] did.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct WarmReport {
    /// Keys this warm-up loaded and wrote (negative entries included; a
    /// write the store refused is logged, and the key still counts here).
    pub loaded: usize,
    /// Keys that were fresh in the store already, or that another caller
    /// filled while this warm-up waited for it: no load of this warm-up's.
    pub cached: usize,
    /// Keys that failed: a loader error or timeout (also when a stale or
    /// fallback value stood in for the load), an invalid key...
    pub failed: usize,
    /// The first failure, with its key (lossily shown as UTF-8).
    pub first_error: Option<(String, Error)>,
    /// How long the warm-up took.
    pub elapsed: Duration,
}

/// One key's outcome.
enum Outcome {
    Loaded,
    Cached,
    Failed(Error),
}

impl<V: Value> Cache<V> {
    /// Loads every key of `keys` that is not fresh in the cache, at most
    /// `warm.rate` loads per second and `warm.concurrency` keys at a time,
    /// and writes them with jittered TTLs. A failing key is counted and
    /// the warm-up goes on.
    ///
    /// Keys are checked with one store read before they are paced, so a
    /// warm-up over mostly warm keys costs reads, not loads. The store is
    /// what gets warmed: the L1 near cache is not consulted (a flushed Redis
    /// does not clear it), and a stale entry is reloaded now rather than
    /// served while it refreshes.
    ///
    /// # Examples
    ///
    /// ```
    /// use breakwater_cache::{Cache, Warm};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cache = Cache::<String>::builder().namespace("catalog").build()?;
    /// let keys = (1..=20).map(|id| format!("product:{id}"));
    /// let report = cache
    ///     .warm(keys, |key: String| async move {
    ///         Ok::<_, std::io::Error>(Some(format!("row for {key}"))) // your query here
    ///     }, Warm::new().rate(1_000))
    ///     .await?;
    /// assert_eq!(report.loaded, 20);
    /// assert_eq!(cache.get("product:7").await?.as_deref(), Some("row for product:7"));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`ConfigError`] for a rate outside 1..=1,000,000, a zero concurrency,
    /// or an invalid jitter; nothing is loaded then. Per-key failures are in
    /// the report.
    pub async fn warm<K, I, F, Fut, E>(
        &self,
        keys: I,
        loader: F,
        warm: Warm,
    ) -> Result<WarmReport, ConfigError>
    where
        I: IntoIterator<Item = K>,
        K: CacheKey + Clone + Send + Sync + 'static,
        F: Fn(K) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Option<V>, E>> + Send + 'static,
        E: Into<Box<dyn StdError + Send + Sync + 'static>> + 'static,
    {
        let loader = Arc::new(loader);
        let load = move |key: K| {
            let loader = Arc::clone(&loader);
            move || loader(key)
        };
        self.warm_with(keys, load, warm).await
    }

    /// [`warm`](Self::warm) with a loader that decides per value, as
    /// [`get_or_load_with_context`](Self::get_or_load_with_context)'s: it
    /// gets the key and a [`LoadContext`] (the stale entry a warm-up
    /// reloads, with its validator, so it may answer
    /// [`Loaded::not_modified`]) and answers a [`Loaded`] whose TTL,
    /// jitter, grace, `max_stale`, validator or "do not cache" apply to
    /// that key's write. A choice out of bounds fails that key alone, with
    /// a [`Config`](ErrorKind::Config) error in the report.
    ///
    /// A value tagged by its loader ([`Loaded::tags`]) is not written when
    /// one of its tags is new (its counter is made by that load: a cold
    /// store) or was invalidated during the load. Those keys are warmed
    /// once more, a moment after the first pass (their counters exist
    /// then): on a cold store, two loads each.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use breakwater_cache::{Cache, Loaded, Warm};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cache = Cache::<String>::builder().namespace("tokens").build()?;
    /// let report = cache
    ///     .warm_with_context(["svc:a", "svc:b"], |key: &str, _context| async move {
    ///         // Each token lives as long as its issuer says.
    ///         let (token, expires_in) = (format!("token for {key}"), Duration::from_secs(120));
    ///         Ok::<_, std::io::Error>(Loaded::value(token).ttl(expires_in))
    ///     }, Warm::new())
    ///     .await?;
    /// assert_eq!(report.loaded, 2);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`warm`](Self::warm).
    pub async fn warm_with_context<K, I, F, Fut, E>(
        &self,
        keys: I,
        loader: F,
        warm: Warm,
    ) -> Result<WarmReport, ConfigError>
    where
        I: IntoIterator<Item = K>,
        K: CacheKey + Clone + Send + Sync + 'static,
        F: Fn(K, LoadContext<V>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Loaded<V>, E>> + Send + 'static,
        E: Into<Box<dyn StdError + Send + Sync + 'static>> + 'static,
    {
        let started = Instant::now();
        let loader = Arc::new(loader);
        // The keys whose loader chose tags for a value to cache.
        let tagged: Arc<std::sync::Mutex<Vec<K>>> = Arc::default();
        let load = {
            let (loader, tagged) = (Arc::clone(&loader), Arc::clone(&tagged));
            move |key: K| {
                let (loader, tagged) = (Arc::clone(&loader), Arc::clone(&tagged));
                WithContext(move |context| {
                    let answer = loader(key.clone(), context);
                    async move {
                        let answer = answer.await;
                        if let Ok(loaded) = &answer
                            && loaded.is_cached()
                            && !loaded.chosen_tags().is_empty()
                        {
                            tagged.lock().unwrap_or_else(|p| p.into_inner()).push(key);
                        }
                        answer
                    }
                })
            }
        };
        let mut report = self.warm_with(keys, load, warm).await?;
        let again = std::mem::take(&mut *tagged.lock().unwrap_or_else(|p| p.into_inner()));
        if !again.is_empty() {
            // Past the clock skew a write allows for after a counter's
            // start: each key written by the first pass is `cached` now.
            tokio::time::sleep(2 * EXPIRE_SKEW).await;
            let load = move |key: K| {
                let loader = Arc::clone(&loader);
                WithContext(move |context| loader(key, context))
            };
            let second = self.warm_with(again, load, warm).await?;
            // Each key is counted once, by the first pass, unless the second
            // one failed it.
            report.loaded -= second.failed.min(report.loaded);
            report.failed += second.failed;
            report.first_error = report.first_error.or(second.first_error);
        }
        report.elapsed = started.elapsed();
        Ok(report)
    }

    /// The warm-up of [`warm`](Self::warm) and
    /// [`warm_with_context`](Self::warm_with_context): `load` makes each
    /// key's loader.
    async fn warm_with<K, I, L, M>(
        &self,
        keys: I,
        load: M,
        warm: Warm,
    ) -> Result<WarmReport, ConfigError>
    where
        I: IntoIterator<Item = K>,
        K: CacheKey + Clone + Send + Sync + 'static,
        L: Load<V>,
        M: Fn(K) -> L,
    {
        warm.validate()?;
        if let Some(jitter) = &warm.jitter {
            jitter.validate()?;
        }
        let started = Instant::now();
        let mut pace = tokio::time::interval(Duration::from_secs(1) / warm.rate);
        pace.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let pace = Mutex::new(pace);
        let store_down = AtomicBool::new(false);
        let store_down = &store_down;
        let mut report = WarmReport::default();
        let mut outcomes = futures_util::stream::iter(keys)
            .map(|key| {
                let outcome = self.warm_one(
                    key.clone(),
                    load(key.clone()),
                    &pace,
                    warm.jitter,
                    store_down,
                );
                async move { (key, outcome.await) }
            })
            .buffer_unordered(warm.concurrency);
        while let Some((key, outcome)) = outcomes.next().await {
            match outcome {
                Outcome::Loaded => {
                    report.loaded += 1;
                    self.inner.metrics.warm("loaded");
                }
                Outcome::Cached => {
                    report.cached += 1;
                    self.inner.metrics.warm("cached");
                }
                Outcome::Failed(err) => {
                    report.failed += 1;
                    self.inner.metrics.warm("failed");
                    if report.first_error.is_none() {
                        let shown = String::from_utf8_lossy(&key.key_bytes()).into_owned();
                        report.first_error = Some((shown, err));
                    }
                }
            }
        }
        report.elapsed = started.elapsed();
        Ok(report)
    }

    async fn warm_one<K: CacheKey, L: Load<V>>(
        &self,
        key: K,
        load: L,
        pace: &Mutex<Interval>,
        jitter: Option<Jitter>,
        store_down: &AtomicBool,
    ) -> Outcome {
        // The store is what is warmed: L1 is neither asked nor trusted (a
        // flushed Redis sends no message to clear it).
        let storage_key = match self.storage_key(&key) {
            Ok(storage_key) => storage_key,
            Err(err) => return Outcome::Failed(err),
        };
        // No grace for this load, so a stale entry is refreshed now rather
        // than served while it refreshes; the written entry keeps the stale
        // window (`max_stale`, which defaults to grace) it would have had.
        let mut options = self.inner.defaults;
        options.max_stale = Some(options.max_stale());
        options.grace = Duration::ZERO;
        if let Some(jitter) = jitter {
            options.jitter = jitter;
        }
        // One read decides. Without the store there is nothing to warm: the
        // key fails, and the database is spared a load that could not be
        // written.
        // A store failure that may pass (a timeout, an open breaker's
        // cool-down) is tried again, as an invalidation is: a busy moment
        // must not fail the rest of a warm-up. Once a key has run out of
        // attempts, later keys try once until a read succeeds again: a
        // store that is down fails the warm-up fast, not a second and a
        // half per key.
        let read = if store_down.load(Ordering::Relaxed) {
            self.read(&storage_key, None).await
        } else {
            self.inner
                .store_retries
                .run(|_| self.read(&storage_key, None))
                .await
                .0
        };
        store_down.store(read.is_err(), Ordering::Relaxed);
        let stale = match read {
            // Fresh and readable as this cache's value type.
            Ok(Some(entry))
                if self.is_fresh(&entry) && self.entry_value(&storage_key, &entry).is_some() =>
            {
                return Outcome::Cached;
            }
            // Inside its stale window, it stands in if the load fails, as in
            // `get_or_load` (fail-safe).
            Ok(Some(entry)) => {
                let now = self.inner.store.now_ms();
                let servable = options.freshness().servable_stale(reading(&entry, now));
                servable.then(|| Arc::new(entry))
            }
            Ok(None) => None,
            Err(err) => return Outcome::Failed(err),
        };
        pace.lock().await.tick().await;
        // Straight to the key's load flight (shared with live traffic), as
        // the pipeline would go after that read.
        let (load, role) = self.join_fill(
            &storage_key,
            load,
            options,
            None,
            Priority::Foreground,
            Mode::Fleet,
        );
        let fetched = self.settle(
            &key.key_bytes(),
            &storage_key,
            load.result().await,
            role,
            stale,
            None,
            &options,
        );
        self.count_served(&fetched);
        match fetched {
            Ok(fetched) => match fetched.served {
                Served::Loaded => Outcome::Loaded,
                Served::L1Hit | Served::Hit | Served::Negative | Served::Coalesced => {
                    Outcome::Cached
                }
                // The load failed and something else stood in for it.
                Served::Stale { .. } | Served::Fallback => Outcome::Failed(Error::new(
                    ErrorKind::Loader,
                    format!(
                        "the load did not succeed; the cache served {} instead",
                        fetched.served
                    ),
                )),
            },
            Err(err) => Outcome::Failed(err),
        }
    }
}

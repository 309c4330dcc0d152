//! [`Origin`]: the database (or service) behind a cache, and the protection
//! every load from it goes through.
//!
//! # Order
//!
//! 1. **Circuit breaker**: a known-down origin is refused at once, before the
//!    load queues for anything ([`CircuitOpen`](crate::ErrorKind::CircuitOpen)).
//! 2. **Bulkhead**: at most `max_concurrent` loads at once, an optional rate,
//!    a bounded queue wait; background refreshes never wait and are shed first
//!    ([`Overloaded`](crate::ErrorKind::Overloaded)).
//! 3. **Retries** with jittered exponential backoff, each attempt in its own
//!    task, all inside one hard deadline (`load_timeout`); they hold the
//!    bulkhead slot, so retries count against it.
//! 4. The breaker sees the final outcome only: a load that succeeded on its
//!    second attempt is a success.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument;
use tracing::field::Empty;

use super::loaded::{LoadContext, Loaded};
use super::value::Load;
use crate::breaker::{BreakerConfig, BreakerLabel, BreakerState, CircuitBreaker};
use crate::error::{ConfigError, Error, ErrorKind, KeyedResult};
use crate::limit::{LimitConfig, LoadLimiter, Priority};
use crate::metrics::Metrics;
use crate::retry::{Retry, RetryConfig};

/// The origin caches load from, with its circuit breaker, load bulkhead and
/// retry policy. Caches built with clones of one `Origin` share all three,
/// so one sick database trips one breaker and one concurrency cap, however
/// many caches front it.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use breakwater_cache::{BreakerConfig, Cache, LimitConfig, Origin};
///
/// let db = Origin::builder("postgres")
///     .breaker(BreakerConfig::new().consecutive_failures(3).cool_down(Duration::from_secs(5)))
///     .limit(LimitConfig::new().max_concurrent(32))
///     .build()?;
/// let products = Cache::<String>::builder().namespace("products").origin(db.clone()).build()?;
/// let prices = Cache::<u64>::builder().namespace("prices").origin(db).build()?;
/// # Ok::<(), breakwater_cache::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct Origin {
    inner: Arc<OriginCore>,
}

struct OriginCore {
    name: String,
    breaker: CircuitBreaker,
    limiter: LoadLimiter,
    retry: Retry,
    /// The settings as given, for [`Settings`](super::Settings).
    configs: (BreakerConfig, LimitConfig, RetryConfig),
}

impl fmt::Debug for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Origin")
            .field("name", &self.inner.name)
            .field("breaker", &self.inner.breaker.state())
            .field("in_flight", &self.inner.limiter.in_flight())
            .finish()
    }
}

/// Builds an [`Origin`].
///
/// # Defaults
///
/// | setting | default |
/// |---|---|
/// | `breaker` | [`BreakerConfig::new`]: opens after 5 consecutive failures, 5 s cool-down (jittered ±20 %), 1 half-open probe |
/// | `limit` | [`LimitConfig::new`]: 64 concurrent loads, no rate limit, 1 s queue wait |
/// | `retry` | [`RetryConfig::none`]: no retries |
#[derive(Debug)]
pub struct OriginBuilder {
    name: String,
    breaker: BreakerConfig,
    limit: LimitConfig,
    retry: RetryConfig,
    rng_seed: Option<u64>,
}

impl Origin {
    /// Starts an origin named `name` (for logs) with the documented defaults.
    pub fn builder(name: impl Into<String>) -> OriginBuilder {
        OriginBuilder {
            name: name.into(),
            breaker: BreakerConfig::new(),
            limit: LimitConfig::new(),
            retry: RetryConfig::none(),
            rng_seed: None,
        }
    }

    /// The origin's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The circuit breaker's state now.
    pub fn breaker_state(&self) -> BreakerState {
        self.inner.breaker.state()
    }

    /// Times the circuit breaker has opened since the origin was built (a
    /// failed half-open probe opens it again, and counts).
    pub fn breaker_openings(&self) -> u64 {
        self.inner.breaker.openings()
    }

    /// Loads running (or waiting for a rate token) now.
    pub fn loads_in_flight(&self) -> u32 {
        self.inner.limiter.in_flight()
    }

    /// The breaker, bulkhead and retry settings, as given.
    pub(crate) fn configs(&self) -> &(BreakerConfig, LimitConfig, RetryConfig) {
        &self.inner.configs
    }

    /// The longest a foreground load waits in the bulkhead before its
    /// `load_timeout` starts.
    pub(crate) fn queue_wait(&self) -> Duration {
        self.inner.limiter.queue_wait()
    }

    /// Fails fast while the breaker refuses loads, before a caller takes a
    /// lease or waits for one.
    pub(crate) fn check(&self) -> Result<(), Error> {
        self.inner.breaker.admits().map_err(Error::from)
    }

    /// Runs `loader` under the origin's protection (see the module's
    /// `# Order`), bounded by `deadline` in all; each attempt gets its own
    /// copy of `context`. Returns the loader's answer and how long the
    /// successful attempt took.
    pub(crate) async fn load<V, L>(
        &self,
        loader: &Arc<L>,
        context: LoadContext<V>,
        deadline: Duration,
        priority: Priority,
        metrics: &Metrics,
    ) -> Result<(Loaded<V>, Duration), Error>
    where
        V: Send + Sync + 'static,
        L: Load<V>,
    {
        let span = tracing::info_span!(
            "breakwater.load",
            origin = %self.inner.name,
            outcome = Empty,
            load_ms = Empty,
        );
        let result = self
            .load_in_span(loader, context, deadline, priority, metrics)
            .instrument(span.clone())
            .await;
        if !span.is_disabled() {
            match &result {
                Ok((loaded, took)) => {
                    span.record(
                        "outcome",
                        if loaded.value.is_some() {
                            "value"
                        } else {
                            "negative"
                        },
                    );
                    span.record("load_ms", took.as_millis() as u64);
                }
                Err(err) => {
                    span.record("outcome", tracing::field::display(err));
                }
            }
        }
        result
    }

    /// [`load`](Self::load), in its span.
    async fn load_in_span<V, L>(
        &self,
        loader: &Arc<L>,
        context: LoadContext<V>,
        deadline: Duration,
        priority: Priority,
        metrics: &Metrics,
    ) -> Result<(Loaded<V>, Duration), Error>
    where
        V: Send + Sync + 'static,
        L: Load<V>,
    {
        let inner = &self.inner;
        // 1. Breaker.
        let permit = inner.breaker.try_acquire().map_err(Error::from)?;
        // 2. Bulkhead. The gauge is set again once the slot is given back
        // (the guard is dropped after it), however the load ends.
        let _gauge = InFlightGauge {
            origin: self,
            metrics,
        };
        let _slot = match inner.limiter.acquire(priority).await {
            Ok(slot) => slot,
            Err(shed) => {
                metrics.shed(match priority {
                    Priority::Foreground => "foreground",
                    Priority::Background => "background",
                });
                return Err(shed.into());
            }
        };
        metrics.loads_in_flight(inner.limiter.in_flight());
        // 3. Retries, inside one deadline.
        let attempts = inner
            .retry
            .run(|_| attempt(Arc::clone(loader), context.clone(), metrics.clone()));
        let result = match tokio::time::timeout(deadline, attempts).await {
            Ok((result, _attempts)) => result,
            Err(_) => {
                metrics.load("timeout", deadline);
                Err(Error::new(
                    ErrorKind::Timeout,
                    format!("the loader did not finish within load_timeout ({deadline:?})"),
                ))
            }
        };
        // 4. The breaker sees the final outcome.
        match &result {
            Ok(_) => permit.success(),
            Err(_) => permit.failure(),
        }
        result
    }
}

impl OriginBuilder {
    /// The circuit breaker's settings.
    pub fn breaker(mut self, config: BreakerConfig) -> Self {
        self.breaker = config;
        self
    }

    /// The load bulkhead's settings.
    pub fn limit(mut self, config: LimitConfig) -> Self {
        self.limit = config;
        self
    }

    /// The retry policy for failed loads.
    pub fn retry(mut self, config: RetryConfig) -> Self {
        self.retry = config;
        self
    }

    /// Seeds the breaker's and the retries' jitter, for reproducible runs.
    pub fn rng_seed(mut self, seed: u64) -> Self {
        self.rng_seed = Some(seed);
        self
    }

    /// Checks the settings and builds the origin.
    ///
    /// # Errors
    ///
    /// The first invalid setting's [`ConfigError`]; an empty name (it
    /// labels the origin's metrics and logs).
    pub fn build(self) -> Result<Origin, ConfigError> {
        if self.name.trim().is_empty() {
            return Err(ConfigError::new(
                "origin name must not be empty (it labels the origin's metrics and logs), e.g. Origin::builder(\"postgres\")",
            ));
        }
        self.breaker.validate().within("breaker")?;
        self.limit.validate().within("limit")?;
        self.retry.validate().within("retry")?;
        let configs = (self.breaker, self.limit, self.retry.clone());
        // A panic is a bug, not a passing failure: never retried.
        let user = self.retry.clone();
        let retry = self
            .retry
            .retry_if(move |err| !is_panic(err) && user.retryable(err));
        Ok(Origin {
            inner: Arc::new(OriginCore {
                breaker: CircuitBreaker::new(self.breaker, self.rng_seed)
                    .labelled(BreakerLabel::origin(&self.name)),
                name: self.name,
                limiter: LoadLimiter::new(self.limit),
                retry: Retry::new(retry, self.rng_seed.map(|s| s.wrapping_add(1))),
                configs,
            }),
        })
    }
}

/// The source attached to a loader panic, so it can be told apart.
#[derive(Debug)]
struct Panicked;

impl fmt::Display for Panicked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the next call for this key loads again")
    }
}

impl StdError for Panicked {}

fn is_panic(err: &Error) -> bool {
    StdError::source(err).is_some_and(|s| s.is::<Panicked>())
}

/// Sets `breakwater_loads_in_flight` when dropped.
struct InFlightGauge<'a> {
    origin: &'a Origin,
    metrics: &'a Metrics,
}

impl Drop for InFlightGauge<'_> {
    fn drop(&mut self) {
        self.metrics
            .loads_in_flight(self.origin.inner.limiter.in_flight());
    }
}

/// Aborts the task when dropped, so a timed-out load does not run on.
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One loader call in its own task: a panic becomes an error, and the task
/// is aborted if the caller stops waiting (the deadline passed).
async fn attempt<V, L>(
    loader: Arc<L>,
    context: LoadContext<V>,
    metrics: Metrics,
) -> Result<(Loaded<V>, Duration), Error>
where
    V: Send + Sync + 'static,
    L: Load<V>,
{
    let started = Instant::now();
    let mut task = AbortOnDrop(tokio::spawn(async move {
        loader
            .call(context)
            .await
            .map(Into::into)
            .map_err(Error::loader)
    }));
    let joined = (&mut task.0).await;
    let took = started.elapsed();
    let (outcome, result) = match joined {
        Ok(Ok(loaded)) if loaded.value.is_some() => ("value", Ok((loaded, took))),
        Ok(Ok(loaded)) => ("negative", Ok((loaded, took))),
        Ok(Err(err)) => ("error", Err(err)),
        Err(join) if join.is_panic() => (
            "panic",
            Err(Error::new(ErrorKind::Loader, "panicked").with_source(Panicked)),
        ),
        Err(_) => (
            "error",
            Err(Error::new(ErrorKind::Loader, "its task was cancelled")),
        ),
    };
    metrics.load(outcome, took);
    result
}

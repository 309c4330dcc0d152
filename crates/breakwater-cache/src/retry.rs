//! Retries of a failed load, spaced by exponential backoff with jitter so a
//! fleet of callers does not retry in lockstep.
//!
//! Retrying is a load on a database that just failed, so it is bounded
//! (`max_attempts`), spaced ([`Backoff`], full jitter by default) and
//! selective (`retry_if`). Sleeps are [`tokio::time::sleep`], so paused-time
//! tests run them instantly.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::time::sleep;

use crate::error::{ConfigError, Error, KeyedResult};
use crate::jitter::Backoff;

type Classifier = Arc<dyn Fn(&Error) -> bool + Send + Sync + 'static>;

/// The most attempts accepted.
const MAX_ATTEMPTS: u32 = 100;

/// How often and how patiently a failed load is tried again.
///
/// # Defaults
///
/// | setting | default |
/// |---|---|
/// | `max_attempts` | 3 (1 try + 2 retries) |
/// | `backoff` | [`Backoff::full_jitter(100 ms, 2 s)`](Backoff::full_jitter) |
/// | `retry_if` | every error is retryable |
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use breakwater_cache::{Backoff, RetryConfig};
///
/// let config = RetryConfig::new()
///     .max_attempts(4)
///     .backoff(Backoff::full_jitter(Duration::from_millis(50), Duration::from_secs(1)))
///     .retry_if(|err| !err.is_invalid_key());
/// assert!(config.validate().is_ok());
///
/// let err = RetryConfig::new().max_attempts(0).validate().unwrap_err();
/// assert_eq!(err.message(), "retry max attempts must be at least 1");
/// ```
#[derive(Clone)]
pub struct RetryConfig {
    max_attempts: u32,
    backoff: Backoff,
    retry_if: Option<Classifier>,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_attempts: 3,
            backoff: Backoff::full_jitter(Duration::from_millis(100), Duration::from_secs(2)),
            retry_if: None,
        }
    }
}

impl fmt::Debug for RetryConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let retry_if = if self.retry_if.is_some() {
            "custom"
        } else {
            "every error"
        };
        f.debug_struct("RetryConfig")
            .field("max_attempts", &self.max_attempts)
            .field("backoff", &self.backoff)
            .field("retry_if", &retry_if)
            .finish()
    }
}

impl RetryConfig {
    /// The defaults (see the table above); the same as [`Default`].
    pub fn new() -> Self {
        Self::default()
    }

    /// No retries: one attempt only.
    ///
    /// # Examples
    ///
    /// ```
    /// use breakwater_cache::RetryConfig;
    ///
    /// assert!(RetryConfig::none().validate().is_ok());
    /// ```
    pub fn none() -> Self {
        Self::default().max_attempts(1)
    }

    /// Tries at most `n` times in all (the first try included); `n` must be
    /// at least 1.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    /// How long to wait before each retry.
    pub fn backoff(mut self, b: Backoff) -> Self {
        self.backoff = b;
        self
    }

    /// Which errors are worth retrying; gets the crate [`Error`] (the user's
    /// error is inside: `err.loader_error::<E>()`). By default every error
    /// is.
    ///
    /// # Examples
    ///
    /// ```
    /// use breakwater_cache::RetryConfig;
    ///
    /// #[derive(Debug)]
    /// struct NotFound;
    /// impl std::fmt::Display for NotFound {
    ///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
    ///         f.write_str("not found")
    ///     }
    /// }
    /// impl std::error::Error for NotFound {}
    ///
    /// // A missing row will not appear by asking again.
    /// let config = RetryConfig::new().retry_if(|err| err.loader_error::<NotFound>().is_none());
    /// ```
    pub fn retry_if(mut self, f: impl Fn(&Error) -> bool + Send + Sync + 'static) -> Self {
        self.retry_if = Some(Arc::new(f));
        self
    }

    /// Checks every setting and reports the first invalid one.
    ///
    /// Used without validation, zero attempts acts as one; nothing panics.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`]: `retry max attempts must be at least 1`, or the
    /// backoff's own message (see [`Backoff::validate`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use breakwater_cache::{Backoff, RetryConfig};
    ///
    /// let err = RetryConfig::new()
    ///     .backoff(Backoff::full_jitter(Duration::ZERO, Duration::from_secs(1)))
    ///     .validate()
    ///     .unwrap_err();
    /// assert_eq!(err.message(), "backoff base must be greater than zero");
    /// ```
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_attempts == 0 {
            return Err(
                ConfigError::new("retry max attempts must be at least 1").for_key("max_attempts")
            );
        }
        if self.max_attempts > MAX_ATTEMPTS {
            return Err(ConfigError::new(format!(
                "retry max attempts must be at most {MAX_ATTEMPTS}, got {}; a few attempts \
                 (load_timeout bounds them all together) are enough",
                self.max_attempts
            ))
            .for_key("max_attempts"));
        }
        self.backoff.validate().within("backoff")
    }

    /// The same attempts and backoff, and either both or neither with a
    /// custom `retry_if` (closures cannot be compared).
    pub(crate) fn same_settings(&self, other: &RetryConfig) -> bool {
        self.max_attempts == other.max_attempts
            && self.backoff == other.backoff
            && self.retry_if.is_some() == other.retry_if.is_some()
    }

    /// The backoff between attempts.
    pub(crate) fn backoff_config(&self) -> Backoff {
        self.backoff
    }

    pub(crate) fn retryable(&self, err: &Error) -> bool {
        self.retry_if.as_ref().is_none_or(|f| f(err))
    }
}

/// Runs an operation again after retryable failures, with jittered backoff.
pub(crate) struct Retry {
    config: RetryConfig,
    rng: Mutex<StdRng>,
}

impl fmt::Debug for Retry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Retry")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Retry {
    /// A retry policy; `rng_seed` seeds the backoff jitter (from the OS when
    /// `None`).
    pub(crate) fn new(config: RetryConfig, rng_seed: Option<u64>) -> Self {
        let rng = match rng_seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => rand::make_rng(),
        };
        Retry {
            config,
            rng: Mutex::new(rng),
        }
    }

    /// Runs `attempt` up to `max_attempts` times, sleeping the backoff's delay
    /// between tries, stopping early on success or a non-retryable error.
    /// `attempt` gets the attempt number (1-based). Returns the last result
    /// and the number of attempts made.
    ///
    /// With decorrelated backoff each delay is drawn from the previous one.
    pub(crate) async fn run<T, F, Fut>(&self, mut attempt: F) -> (Result<T, Error>, u32)
    where
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        let max_attempts = self.config.max_attempts.max(1);
        let mut made = 1;
        let mut previous = None;
        loop {
            let err = match attempt(made).await {
                Ok(value) => return (Ok(value), made),
                Err(err) => err,
            };
            if made >= max_attempts {
                tracing::debug!(attempts = made, error = %err, "giving up: out of attempts");
                return (Err(err), made);
            }
            if !self.config.retryable(&err) {
                tracing::debug!(attempts = made, error = %err, "not retrying: error not retryable");
                return (Err(err), made);
            }
            let delay = self.draw(made, previous);
            previous = Some(delay);
            tracing::debug!(attempt = made, ?delay, error = %err, "attempt failed; retrying");
            sleep(delay).await;
            made += 1;
        }
    }

    /// The delay before retry `retry` (1-based; 0 is taken as 1), exposed for
    /// tests and metrics. A decorrelated backoff draws it as for a first
    /// retry, since there is no previous delay here.
    #[cfg(test)]
    pub(crate) fn delay(&self, retry: u32) -> Duration {
        self.draw(retry, None)
    }

    fn draw(&self, retry: u32, previous: Option<Duration>) -> Duration {
        // The RNG holds no invariant a panic could break: ignore poisoning.
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        self.config
            .backoff
            .delay(retry.saturating_sub(1), previous, &mut *rng)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use proptest::prelude::*;
    use tokio::time::Instant;

    use super::*;
    use crate::error::ErrorKind;

    fn ms(m: u64) -> Duration {
        Duration::from_millis(m)
    }

    fn boom() -> Error {
        Error::new(ErrorKind::Store, "boom")
    }

    proptest! {
        #[test]
        fn delays_lie_within_full_jitter_bounds(
            base in 1..=10_000u64,
            cap_extra in 0..=60_000u64,
            seed in any::<u64>(),
        ) {
            let (base, cap) = (ms(base), ms(base + cap_extra));
            let backoff = Backoff::full_jitter(base, cap);
            let retry = Retry::new(RetryConfig::new().backoff(backoff), Some(seed));
            for n in 1..=40u32 {
                let ceiling = backoff.ceiling(n - 1);
                let grown = base.saturating_mul(1u32.checked_shl(n - 1).unwrap_or(u32::MAX));
                prop_assert_eq!(ceiling, cap.min(grown));
                for _ in 0..8 {
                    prop_assert!(retry.delay(n) <= ceiling);
                }
            }
        }
    }

    #[test]
    fn default_delays_cover_their_range() {
        let retry = Retry::new(RetryConfig::new(), Some(1));
        let first: Vec<_> = (0..2_000).map(|_| retry.delay(1)).collect();
        assert!(first.iter().all(|d| *d <= ms(100)));
        assert!(first.contains(&Duration::ZERO) && first.contains(&ms(100)));
        let late: Vec<_> = (0..2_000).map(|_| retry.delay(10)).collect();
        assert!(late.iter().all(|d| *d <= ms(2_000)));
        assert!(late.iter().any(|d| *d > ms(1_600)));
        assert!(retry.delay(0) <= ms(100), "retry 0 is taken as 1");
        assert!(retry.delay(u32::MAX) <= ms(2_000));
    }

    #[tokio::test(start_paused = true)]
    async fn stops_at_max_attempts() {
        for max in [1, 2, 3, 7] {
            let retry = Retry::new(RetryConfig::new().max_attempts(max), Some(2));
            let calls = AtomicU32::new(0);
            let (result, made) = retry
                .run(|n| {
                    let seen = calls.fetch_add(1, Ordering::SeqCst) + 1;
                    assert_eq!(n, seen, "attempts are numbered from 1");
                    async { Err::<(), _>(boom()) }
                })
                .await;
            assert!(result.unwrap_err().is_store());
            assert_eq!(made, max);
            assert_eq!(calls.load(Ordering::SeqCst), max);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn none_tries_once() {
        let retry = Retry::new(RetryConfig::none(), Some(3));
        let calls = AtomicU32::new(0);
        let (_, made) = retry
            .run(|_| {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Err::<(), _>(boom()) }
            })
            .await;
        assert_eq!((made, calls.load(Ordering::SeqCst)), (1, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn non_retryable_error_is_not_retried() {
        let config = RetryConfig::new()
            .max_attempts(5)
            .retry_if(|err| !err.is_invalid_key());
        let retry = Retry::new(config, Some(4));
        let calls = AtomicU32::new(0);
        let start = Instant::now();
        let (result, made) = retry
            .run(|_| {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Err::<(), _>(Error::new(ErrorKind::InvalidKey, "empty key")) }
            })
            .await;
        assert!(result.unwrap_err().is_invalid_key());
        assert_eq!((made, calls.load(Ordering::SeqCst)), (1, 1));
        assert_eq!(start.elapsed(), Duration::ZERO, "no backoff slept");
    }

    #[tokio::test(start_paused = true)]
    async fn classifier_sees_the_loader_error() {
        #[derive(Debug)]
        struct NotFound;
        impl fmt::Display for NotFound {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("not found")
            }
        }
        impl std::error::Error for NotFound {}

        let config = RetryConfig::new().retry_if(|err| err.loader_error::<NotFound>().is_none());
        let retry = Retry::new(config, Some(5));
        let (_, made) = retry
            .run(|_| async { Err::<(), _>(Error::loader(NotFound)) })
            .await;
        assert_eq!(made, 1);
        let (_, made) = retry
            .run(|_| async { Err::<(), _>(Error::loader(std::io::Error::other("reset"))) })
            .await;
        assert_eq!(made, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn success_on_the_second_attempt_stops() {
        let retry = Retry::new(RetryConfig::new().max_attempts(5), Some(6));
        let calls = AtomicU32::new(0);
        let (result, made) = retry
            .run(|n| {
                calls.fetch_add(1, Ordering::SeqCst);
                async move { if n < 2 { Err(boom()) } else { Ok(n * 10) } }
            })
            .await;
        assert_eq!(result.expect("second attempt"), 20);
        assert_eq!((made, calls.load(Ordering::SeqCst)), (2, 2));
    }

    #[tokio::test(start_paused = true)]
    async fn time_slept_is_the_sum_of_the_drawn_delays() {
        let config = RetryConfig::new()
            .max_attempts(8)
            .backoff(Backoff::full_jitter(ms(100), ms(3_000)));
        for seed in 0..20 {
            // Same seed, same draws: the twin tells us what `run` will sleep.
            let twin = Retry::new(config.clone(), Some(seed));
            let expected: Vec<_> = (1..8).map(|n| twin.delay(n)).collect();

            let retry = Retry::new(config.clone(), Some(seed));
            let start = Instant::now();
            let starts = Mutex::new(Vec::new());
            let (_, made) = retry
                .run(|_| {
                    starts.lock().expect("starts").push(start.elapsed());
                    async { Err::<(), _>(boom()) }
                })
                .await;
            assert_eq!(made, 8);
            let starts = starts.into_inner().expect("starts");
            let gaps: Vec<_> = starts.windows(2).map(|w| w[1] - w[0]).collect();
            assert_eq!(gaps, expected);
            assert_eq!(start.elapsed(), expected.iter().sum::<Duration>());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn decorrelated_backoff_chains_its_delays() {
        let backoff = Backoff::decorrelated(ms(100), ms(5_000));
        let retry = Retry::new(
            RetryConfig::new().max_attempts(10).backoff(backoff),
            Some(7),
        );
        let start = Instant::now();
        let (_, made) = retry.run(|_| async { Err::<(), _>(boom()) }).await;
        assert_eq!(made, 10);
        let slept = start.elapsed();
        assert!(ms(900) <= slept && slept <= ms(45_000), "{slept:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn unvalidated_zero_attempts_tries_once() {
        let retry = Retry::new(RetryConfig::new().max_attempts(0), Some(8));
        let (result, made) = retry.run(|_| async { Ok::<_, Error>(1) }).await;
        assert_eq!((result.expect("ok"), made), (1, 1));
        let (_, made) = retry.run(|_| async { Err::<(), _>(boom()) }).await;
        assert_eq!(made, 1);
    }

    #[test]
    fn validate_messages() {
        let msg = |c: RetryConfig| c.validate().map_err(|e| e.message().to_owned());
        assert_eq!(msg(RetryConfig::new()), Ok(()));
        assert_eq!(msg(RetryConfig::default()), Ok(()));
        assert_eq!(msg(RetryConfig::none()), Ok(()));
        assert_eq!(
            msg(RetryConfig::new().max_attempts(0)),
            Err("retry max attempts must be at least 1".to_owned())
        );
        assert_eq!(
            msg(RetryConfig::new().backoff(Backoff::full_jitter(Duration::ZERO, ms(1_000)))),
            Err("backoff base must be greater than zero".to_owned())
        );
        assert_eq!(
            msg(RetryConfig::new().backoff(Backoff::full_jitter(ms(100), ms(50)))),
            Err("backoff cap (50ms) must be at least the base (100ms)".to_owned())
        );
    }

    #[test]
    fn debug_does_not_need_the_closure() {
        let config = RetryConfig::new().retry_if(|_| true);
        let shown = format!("{config:?}");
        assert!(shown.contains("max_attempts: 3"), "{shown}");
        assert!(shown.contains("retry_if: \"custom\""), "{shown}");
        assert!(format!("{:?}", RetryConfig::none()).contains("every error"));
    }
}

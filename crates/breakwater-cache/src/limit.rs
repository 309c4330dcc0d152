//! A bulkhead for the loader, so a burst of misses cannot open more
//! database connections or start loads faster than the database takes:
//! how many loads run at once, how fast new ones start, and how long a load
//! may queue for its turn.
//!
//! * **Concurrency**: at most `max_concurrent` loads hold a permit (a
//!   [`tokio::sync::Semaphore`], first come first served).
//! * **Rate**: optionally, at most `per_second` loads start per second, with
//!   `burst` allowed at once after a quiet spell (a token bucket on tokio's
//!   clock, so paused-time tests drive it).
//! * **Queue wait**: a foreground load waits at most `queue_wait` for both;
//!   past that it is shed, so a slow database makes callers fail fast
//!   instead of piling up.
//!
//! Background refreshes yield to foreground loads and are shed first: they
//! never wait, and they hold at most half the permits.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, sleep, timeout};

use crate::clock::millis as to_ms;
use crate::error::{ConfigError, Error, ErrorKind, KeyedResult, MAX_WAIT};

/// The most concurrent loads, loads per second or burst accepted: a
/// million (a rate above it spaces loads less than 1 µs apart, which the
/// token bucket cannot tell from no limit).
const MAX_COUNT: u32 = 1_000_000;

/// How many loads may run, how fast they may start and how long they may
/// queue.
///
/// # Defaults
///
/// | setting | default |
/// |---|---|
/// | `max_concurrent` | 64 |
/// | `rate` | off |
/// | `queue_wait` | 1 s |
/// | background share | at most half the permits (at least one), never queued |
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use breakwater_cache::LimitConfig;
///
/// let config = LimitConfig::new()
///     .max_concurrent(16)
///     .rate(200, 20)
///     .queue_wait(Duration::from_millis(250));
/// assert!(config.validate().is_ok());
///
/// let err = LimitConfig::new().rate(0, 10).validate().unwrap_err();
/// assert_eq!(err.message(), "load rate must be at least 1 per second");
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LimitConfig {
    max_concurrent: u32,
    rate: Option<Rate>,
    queue_wait: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Rate {
    per_second: u32,
    burst: u32,
}

impl Default for LimitConfig {
    fn default() -> Self {
        LimitConfig {
            max_concurrent: 64,
            rate: None,
            queue_wait: Duration::from_secs(1),
        }
    }
}

impl LimitConfig {
    /// The defaults (see the table above); the same as [`Default`].
    pub fn new() -> Self {
        Self::default()
    }

    /// At most `n` loads at once; `n` must be at least 1. Background loads
    /// get at most half of them (rounded down, but at least one).
    pub fn max_concurrent(mut self, n: u32) -> Self {
        self.max_concurrent = n;
        self
    }

    /// At most `per_second` loads start per second on average, and at most
    /// `burst` at once after a quiet spell: in any one second, at most
    /// `per_second + burst` start. Both must be at least 1.
    pub fn rate(mut self, per_second: u32, burst: u32) -> Self {
        self.rate = Some(Rate { per_second, burst });
        self
    }

    /// How long a foreground load may wait for a permit and a rate token
    /// before it is shed. It must be greater than zero.
    pub fn queue_wait(mut self, d: Duration) -> Self {
        self.queue_wait = d;
        self
    }

    /// Checks every setting and reports the first invalid one.
    ///
    /// Used without validation, a zero `max_concurrent`, rate or burst acts
    /// as 1 and a zero `queue_wait` means "never wait"; nothing panics.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] whose message names the setting, e.g.
    /// `max concurrent loads must be at least 1`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use breakwater_cache::LimitConfig;
    ///
    /// let err = LimitConfig::new().queue_wait(Duration::ZERO).validate().unwrap_err();
    /// assert_eq!(err.message(), "queue wait must be greater than zero");
    /// ```
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_concurrent == 0 {
            return Err(ConfigError::new("max concurrent loads must be at least 1")
                .for_key("max_concurrent"));
        }
        if self.max_concurrent > MAX_COUNT {
            return Err(ConfigError::new(format!(
                "max concurrent loads must be at most {MAX_COUNT}, got {}; use what the \
                 database can serve at once",
                self.max_concurrent
            ))
            .for_key("max_concurrent"));
        }
        if let Some(rate) = self.rate {
            if rate.per_second == 0 {
                return Err(ConfigError::new("load rate must be at least 1 per second")
                    .for_key("rate.per_second"));
            }
            if rate.per_second > MAX_COUNT {
                return Err(ConfigError::new(format!(
                    "load rate must be at most {MAX_COUNT} per second, got {}; leave rate \
                     unset for no limit",
                    rate.per_second
                ))
                .for_key("rate.per_second"));
            }
            if rate.burst == 0 {
                return Err(ConfigError::new("load burst must be at least 1").for_key("rate.burst"));
            }
            if rate.burst > MAX_COUNT {
                return Err(ConfigError::new(format!(
                    "load burst must be at most {MAX_COUNT}, got {}; use at most the rate",
                    rate.burst
                ))
                .for_key("rate.burst"));
            }
        }
        if self.queue_wait.is_zero() {
            return Err(
                ConfigError::new("queue wait must be greater than zero").for_key("queue_wait")
            );
        }
        ConfigError::at_most(
            "queue wait",
            self.queue_wait,
            MAX_WAIT,
            "use milliseconds to seconds (the default is 1s)",
        )
        .for_key("queue_wait")
    }
}

/// Whether a load serves a caller now or refreshes in the background.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Priority {
    /// A caller is waiting for this load.
    Foreground,
    /// A refresh nobody waits for (grace, early refresh); shed first.
    Background,
}

/// The limiter refused a load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shed {
    /// How long the request waited before it was shed (zero for background
    /// requests, which never wait).
    pub(crate) waited: Duration,
    /// When a retry may get through: the next rate token's time if the rate
    /// shed it, else the queue wait (every permit was busy that long).
    pub(crate) retry_in: Duration,
}

impl From<Shed> for Error {
    fn from(shed: Shed) -> Self {
        Error::new(
            ErrorKind::Overloaded,
            format!(
                "too many loads are running; this one was shed after waiting {}ms",
                to_ms(shed.waited)
            ),
        )
        .with_retry_after(shed.retry_in)
    }
}

/// A token bucket kept as GCRA: `tat` is the theoretical arrival time of the
/// next request at the steady rate. A request may start once
/// `now >= tat - tolerance`; taking a token pushes `tat` one interval on.
/// Waiters reserve their token (and so their start time) when they join,
/// which keeps the order fair and lets a request that could not start in
/// time be shed at once instead of after its whole wait.
#[derive(Debug)]
struct TokenBucket {
    interval: Duration,
    tolerance: Duration,
    tat: Instant,
}

impl TokenBucket {
    fn new(rate: Rate, now: Instant) -> Self {
        let per_second = rate.per_second.max(1);
        let burst = rate.burst.max(1);
        let interval = Duration::from_secs(1) / per_second;
        TokenBucket {
            interval,
            tolerance: interval.saturating_mul(burst - 1),
            tat: now,
        }
    }

    /// Reserves the next token if it is available by `deadline` (`None`: no
    /// deadline) and returns when it may be used; `None` if it is not.
    fn reserve(&mut self, now: Instant, deadline: Option<Instant>) -> Option<Instant> {
        let tat = self.tat.max(now);
        let start = self.next_start(now);
        if deadline.is_some_and(|deadline| start > deadline) {
            return None;
        }
        // A `tat` past the end of the clock means "no more tokens".
        self.tat = tat.checked_add(self.interval)?;
        Some(start)
    }

    /// When the next token may be used, without taking it.
    fn next_start(&self, now: Instant) -> Instant {
        let tat = self.tat.max(now);
        tat.checked_sub(self.tolerance).unwrap_or(now).max(now)
    }
}

/// The loader bulkhead: a concurrency semaphore, an optional token bucket and
/// a bounded queue wait.
#[derive(Debug)]
pub(crate) struct LoadLimiter {
    config: LimitConfig,
    max_concurrent: u32,
    background_share: u32,
    semaphore: Arc<Semaphore>,
    background: Arc<AtomicU32>,
    bucket: Option<Mutex<TokenBucket>>,
}

impl LoadLimiter {
    /// A limiter with every permit and token free.
    /// The longest a foreground load waits for its turn.
    pub(crate) fn queue_wait(&self) -> Duration {
        self.config.queue_wait
    }

    pub(crate) fn new(config: LimitConfig) -> Self {
        let max_concurrent = config.max_concurrent.max(1);
        let permits = usize::try_from(max_concurrent)
            .unwrap_or(Semaphore::MAX_PERMITS)
            .min(Semaphore::MAX_PERMITS);
        LoadLimiter {
            config,
            max_concurrent,
            background_share: (max_concurrent / 2).max(1),
            semaphore: Arc::new(Semaphore::new(permits)),
            background: Arc::new(AtomicU32::new(0)),
            bucket: config
                .rate
                .map(|rate| Mutex::new(TokenBucket::new(rate, Instant::now()))),
        }
    }

    /// Waits at most `queue_wait` for a concurrency permit and a rate token.
    ///
    /// Background requests never wait: they get a permit only if one is free
    /// right now, a rate token is available right now, and background loads
    /// hold fewer than half the permits; else `Err(Shed)` at once.
    /// (Background refreshes yield to foreground loads and are shed first.)
    pub(crate) async fn acquire(&self, priority: Priority) -> Result<LoadPermit, Shed> {
        match priority {
            Priority::Foreground => self.acquire_foreground().await,
            Priority::Background => self.try_acquire_background(),
        }
    }

    /// Permits currently held.
    pub(crate) fn in_flight(&self) -> u32 {
        let free = u32::try_from(self.semaphore.available_permits()).unwrap_or(u32::MAX);
        self.max_concurrent.saturating_sub(free)
    }

    async fn acquire_foreground(&self) -> Result<LoadPermit, Shed> {
        let start = Instant::now();
        let queue_wait = self.config.queue_wait;
        let shed = |retry_in| {
            let waited = start.elapsed();
            tracing::debug!(
                ?waited,
                "load shed: no permit and rate token within the queue wait"
            );
            Shed { waited, retry_in }
        };
        let permit = match timeout(
            self.config.queue_wait,
            Arc::clone(&self.semaphore).acquire_owned(),
        )
        .await
        {
            Ok(Ok(permit)) => permit,
            // Err(_) inside: the semaphore is never closed; shed all the same.
            Ok(Err(_)) | Err(_) => return Err(shed(queue_wait)),
        };
        if let Some(bucket) = &self.bucket {
            let deadline = start.checked_add(self.config.queue_wait);
            let now = Instant::now();
            let (reserved, next) = {
                let mut bucket = lock(bucket);
                (bucket.reserve(now, deadline), bucket.next_start(now))
            };
            match reserved {
                Some(at) => sleep(at.saturating_duration_since(Instant::now())).await,
                None => return Err(shed(next.saturating_duration_since(now))),
            }
        }
        Ok(LoadPermit {
            _permit: permit,
            _background: None,
        })
    }

    fn try_acquire_background(&self) -> Result<LoadPermit, Shed> {
        let shed = Shed {
            waited: Duration::ZERO,
            retry_in: self.config.queue_wait,
        };
        let share = self.background_share;
        if self
            .background
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held < share).then_some(held + 1)
            })
            .is_err()
        {
            tracing::debug!("background load shed: background loads hold their share");
            return Err(shed);
        }
        // From here on the guard gives the background slot back on any exit.
        let slot = BackgroundSlot(Arc::clone(&self.background));
        // `try_acquire` fails while foreground loads queue: permits go to
        // waiters first.
        let Ok(permit) = Arc::clone(&self.semaphore).try_acquire_owned() else {
            tracing::debug!("background load shed: no permit free");
            return Err(shed);
        };
        if let Some(bucket) = &self.bucket {
            let now = Instant::now();
            let mut bucket = lock(bucket);
            if bucket.reserve(now, Some(now)).is_none() {
                tracing::debug!("background load shed: no rate token free");
                let retry_in = bucket.next_start(now).saturating_duration_since(now);
                return Err(Shed { retry_in, ..shed });
            }
        }
        Ok(LoadPermit {
            _permit: permit,
            _background: Some(slot),
        })
    }
}

fn lock(bucket: &Mutex<TokenBucket>) -> MutexGuard<'_, TokenBucket> {
    // The critical section is a few assignments with no panics: poisoning
    // cannot leave it half-done.
    bucket.lock().unwrap_or_else(|p| p.into_inner())
}

/// One of the background share's slots, given back on drop.
#[derive(Debug)]
struct BackgroundSlot(Arc<AtomicU32>);

impl Drop for BackgroundSlot {
    fn drop(&mut self) {
        // Only ever decremented after this slot's increment.
        let _ = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_sub(1)
            });
    }
}

/// Leave to run one load; the permit (and any background slot) is released
/// when it is dropped.
#[derive(Debug)]
pub(crate) struct LoadPermit {
    _permit: OwnedSemaphorePermit,
    _background: Option<BackgroundSlot>,
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use rand::rngs::StdRng;
    use rand::{RngExt, SeedableRng};

    use super::*;

    fn ms(m: u64) -> Duration {
        Duration::from_millis(m)
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[derive(Default)]
    struct Admissions {
        current: AtomicUsize,
        peak: AtomicUsize,
        granted: AtomicUsize,
        shed: AtomicUsize,
    }

    /// 10,000 concurrent foreground acquires, each holding its permit for a
    /// seeded random 1..=50 ms.
    async fn stampede(config: LimitConfig, seed: u64) -> (Arc<Admissions>, Vec<Duration>) {
        let limiter = Arc::new(LoadLimiter::new(config));
        let counts = Arc::new(Admissions::default());
        let mut rng = StdRng::seed_from_u64(seed);
        let mut tasks = Vec::new();
        for _ in 0..10_000 {
            let hold = ms(rng.random_range(1..=50));
            let limiter = Arc::clone(&limiter);
            let counts = Arc::clone(&counts);
            tasks.push(tokio::spawn(async move {
                match limiter.acquire(Priority::Foreground).await {
                    Ok(permit) => {
                        let now = counts.current.fetch_add(1, Ordering::SeqCst) + 1;
                        counts.peak.fetch_max(now, Ordering::SeqCst);
                        assert!(limiter.in_flight() <= 32);
                        sleep(hold).await;
                        counts.current.fetch_sub(1, Ordering::SeqCst);
                        counts.granted.fetch_add(1, Ordering::SeqCst);
                        drop(permit);
                        None
                    }
                    Err(shed) => {
                        counts.shed.fetch_add(1, Ordering::SeqCst);
                        Some(shed.waited)
                    }
                }
            }));
        }
        let mut waits = Vec::new();
        for task in tasks {
            if let Some(waited) = task.await.expect("task") {
                waits.push(waited);
            }
        }
        assert_eq!(limiter.in_flight(), 0);
        (counts, waits)
    }

    #[tokio::test(start_paused = true)]
    async fn ten_thousand_acquires_never_exceed_max_concurrent() {
        let config = LimitConfig::new().max_concurrent(32);
        let (counts, waits) = timeout(secs(3600), stampede(config, 1))
            .await
            .expect("nothing hangs");
        assert_eq!(counts.peak.load(Ordering::SeqCst), 32);
        let granted = counts.granted.load(Ordering::SeqCst);
        let shed = counts.shed.load(Ordering::SeqCst);
        assert_eq!(granted + shed, 10_000);
        // ~25.5 ms per load over 32 permits: about 1,250 fit in 1 s.
        assert!((1_000..2_000).contains(&granted), "{granted}");
        assert!(
            waits.iter().all(|w| *w == secs(1)),
            "shed exactly at queue_wait"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn with_a_long_queue_wait_every_acquire_gets_a_permit() {
        let config = LimitConfig::new().max_concurrent(32).queue_wait(secs(3600));
        let (counts, _) = timeout(secs(7200), stampede(config, 2))
            .await
            .expect("nothing hangs");
        assert_eq!(counts.peak.load(Ordering::SeqCst), 32);
        assert_eq!(counts.granted.load(Ordering::SeqCst), 10_000);
        assert_eq!(counts.shed.load(Ordering::SeqCst), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn rate_holds_in_every_one_second_window() {
        let limiter = Arc::new(LoadLimiter::new(
            LimitConfig::new().max_concurrent(1_000).rate(100, 10),
        ));
        let start = Instant::now();
        let end = start + secs(60);
        let grants = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for seed in 0..1_000u64 {
            let limiter = Arc::clone(&limiter);
            let grants = Arc::clone(&grants);
            tasks.push(tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(seed);
                while Instant::now() < end {
                    match limiter.acquire(Priority::Foreground).await {
                        Ok(permit) => {
                            let at = Instant::now();
                            if at < end {
                                let mut grants = grants.lock().expect("grants");
                                grants.push(at - start);
                                // A broken limiter fails the test, not hangs it.
                                if grants.len() > 20_000 {
                                    break;
                                }
                            }
                            sleep(ms(1)).await;
                            drop(permit);
                        }
                        // Eager, but not a busy loop: come back soon.
                        Err(_) => sleep(ms(rng.random_range(1..=100))).await,
                    }
                }
            }));
        }
        for task in tasks {
            timeout(secs(120), task)
                .await
                .expect("nothing hangs")
                .expect("task");
        }
        let mut grants = grants.lock().expect("grants").clone();
        grants.sort();
        // A burst at the start, then 100 per second.
        assert!((5_990..=6_010).contains(&grants.len()), "{}", grants.len());
        let mut worst = 0;
        for (i, first) in grants.iter().enumerate() {
            let in_window = grants[i..]
                .iter()
                .take_while(|at| **at < *first + secs(1))
                .count();
            worst = worst.max(in_window);
        }
        assert!(worst <= 110, "{worst} grants in one second");
        assert!(worst >= 100, "{worst}");
    }

    #[tokio::test(start_paused = true)]
    async fn queue_wait_runs_out_and_sheds() {
        let limiter = LoadLimiter::new(LimitConfig::new().max_concurrent(1).queue_wait(ms(250)));
        let held = limiter.acquire(Priority::Foreground).await.expect("free");
        let start = Instant::now();
        let shed = limiter.acquire(Priority::Foreground).await.unwrap_err();
        assert_eq!(
            shed,
            Shed {
                waited: ms(250),
                retry_in: ms(250)
            }
        );
        assert_eq!(start.elapsed(), ms(250));
        drop(held);
        assert!(limiter.acquire(Priority::Foreground).await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn rate_sheds_at_once_when_no_token_comes_in_time() {
        let limiter = LoadLimiter::new(LimitConfig::new().rate(1, 1).queue_wait(ms(500)));
        let _first = limiter.acquire(Priority::Foreground).await.expect("burst");
        let start = Instant::now();
        // The next token is 1 s away, past the 500 ms queue wait.
        let shed = limiter.acquire(Priority::Foreground).await.unwrap_err();
        assert_eq!(shed.waited, Duration::ZERO);
        assert_eq!(shed.retry_in, secs(1), "when the next token comes");
        assert_eq!(start.elapsed(), Duration::ZERO);
        // The shed request took no token: the next one is still 1 s after the first.
        sleep(ms(600)).await;
        let before = Instant::now();
        let _second = limiter.acquire(Priority::Foreground).await.expect("token");
        assert_eq!(before.elapsed(), ms(400));
    }

    #[tokio::test(start_paused = true)]
    async fn background_is_shed_when_foreground_holds_the_permits() {
        let limiter = LoadLimiter::new(LimitConfig::new().max_concurrent(8));
        let mut foreground = Vec::new();
        for _ in 0..8 {
            foreground.push(limiter.acquire(Priority::Foreground).await.expect("free"));
        }
        let start = Instant::now();
        assert_eq!(
            limiter.acquire(Priority::Background).await.unwrap_err(),
            Shed {
                waited: Duration::ZERO,
                retry_in: secs(1)
            }
        );
        assert_eq!(start.elapsed(), Duration::ZERO, "background never waits");
        assert_eq!(limiter.background.load(Ordering::SeqCst), 0);
        foreground.pop();
        assert!(limiter.acquire(Priority::Background).await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn background_never_takes_more_than_half() {
        let limiter = LoadLimiter::new(LimitConfig::new().max_concurrent(8));
        let mut background = Vec::new();
        for _ in 0..20 {
            if let Ok(permit) = limiter.acquire(Priority::Background).await {
                background.push(permit);
            }
        }
        assert_eq!(background.len(), 4);
        assert_eq!(limiter.in_flight(), 4);
        // The other half is still there for foreground loads.
        let mut foreground = Vec::new();
        for _ in 0..4 {
            foreground.push(limiter.acquire(Priority::Foreground).await.expect("free"));
        }
        assert_eq!(limiter.in_flight(), 8);
        // A finished background load frees a background slot.
        background.pop();
        assert!(limiter.acquire(Priority::Background).await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn background_yields_to_queued_foreground() {
        let limiter = Arc::new(LoadLimiter::new(LimitConfig::new().max_concurrent(2)));
        let a = limiter.acquire(Priority::Foreground).await.expect("free");
        let _b = limiter.acquire(Priority::Foreground).await.expect("free");
        let waiter = {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move { limiter.acquire(Priority::Foreground).await.is_ok() })
        };
        tokio::task::yield_now().await;
        drop(a);
        // The freed permit belongs to the queued foreground load.
        assert!(limiter.acquire(Priority::Background).await.is_err());
        assert!(waiter.await.expect("task"));
    }

    #[tokio::test(start_paused = true)]
    async fn background_needs_a_token_now() {
        let limiter = LoadLimiter::new(LimitConfig::new().rate(10, 2));
        let _a = limiter.acquire(Priority::Background).await.expect("burst");
        let _b = limiter.acquire(Priority::Background).await.expect("burst");
        assert!(limiter.acquire(Priority::Background).await.is_err());
        sleep(ms(100)).await;
        assert!(limiter.acquire(Priority::Background).await.is_ok());
    }

    #[test]
    fn shed_becomes_an_overloaded_error() {
        let err = Error::from(Shed {
            waited: secs(1),
            retry_in: ms(300),
        });
        assert!(err.is_overloaded());
        assert_eq!(err.retry_after(), Some(ms(300)));
        assert_eq!(
            err.to_string(),
            "overloaded: too many loads are running; this one was shed after waiting 1000ms"
        );
    }

    #[test]
    fn validate_messages() {
        let msg = |c: LimitConfig| c.validate().map_err(|e| e.message().to_owned());
        assert_eq!(msg(LimitConfig::new()), Ok(()));
        assert_eq!(msg(LimitConfig::default().rate(1, 1)), Ok(()));
        assert_eq!(
            msg(LimitConfig::new().max_concurrent(0)),
            Err("max concurrent loads must be at least 1".to_owned())
        );
        assert_eq!(
            msg(LimitConfig::new().rate(0, 10)),
            Err("load rate must be at least 1 per second".to_owned())
        );
        assert_eq!(
            msg(LimitConfig::new().rate(100, 0)),
            Err("load burst must be at least 1".to_owned())
        );
        assert_eq!(
            msg(LimitConfig::new().queue_wait(Duration::ZERO)),
            Err("queue wait must be greater than zero".to_owned())
        );
    }

    #[tokio::test(start_paused = true)]
    async fn unvalidated_configs_do_not_panic() {
        let limiter = LoadLimiter::new(
            LimitConfig::new()
                .max_concurrent(0)
                .rate(0, 0)
                .queue_wait(Duration::ZERO),
        );
        assert!(limiter.acquire(Priority::Foreground).await.is_ok());
        let limiter = LoadLimiter::new(
            LimitConfig::new()
                .max_concurrent(u32::MAX)
                .rate(u32::MAX, u32::MAX)
                .queue_wait(Duration::MAX),
        );
        let _held = limiter.acquire(Priority::Foreground).await.expect("free");
        assert_eq!(limiter.in_flight(), 1);
        assert!(limiter.acquire(Priority::Background).await.is_ok());
    }
}

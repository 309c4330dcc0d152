//! Randomised durations that keep a fleet from acting in lockstep.
//!
//! * [`Jitter`] spreads TTLs so keys written together do not expire together
//!   (cache avalanche).
//! * [`Backoff`] spaces out retries ("Exponential Backoff and Jitter").
//! * [`Interval`] jitters the period of refresh loops.
//! * [`poll_delay`] jitters the wait between lock polls.
//!
//! All arithmetic is done in whole milliseconds with saturating `u64`s, so no
//! input can overflow or panic; every result is a [`Duration`] of whole
//! milliseconds. Invalid parameters (a NaN ratio, a zero floor, ...) are
//! reported by the `validate` methods; used without validation they are
//! clamped to the nearest sensible value instead of panicking.

use std::fmt;
use std::time::Duration;

use rand::{Rng, RngExt};

use crate::clock::millis as to_ms;
use crate::error::{ConfigError, KeyedResult, MAX_WAIT, MAX_WINDOW};

/// The floor [`Interval`] uses when its jitter has no explicit floor.
const INTERVAL_FLOOR_MS: u64 = 1;

/// Formats a duration as `3s` when it is a whole number of seconds, else `1500ms`.
fn fmt_ms(f: &mut fmt::Formatter<'_>, d: Duration) -> fmt::Result {
    let ms = to_ms(d);
    if ms.is_multiple_of(1000) {
        write!(f, "{}s", ms / 1000)
    } else {
        write!(f, "{ms}ms")
    }
}

/// Draws uniformly from the inclusive range `[low, high]` (`low <= high`).
fn uniform<R: Rng + ?Sized>(low: u64, high: u64, rng: &mut R) -> u64 {
    if low >= high {
        low
    } else {
        rng.random_range(low..=high)
    }
}

/// The ratio actually used: NaN becomes 0, anything else is clamped to `[0, 1]`.
fn clamp_ratio(r: f64) -> f64 {
    if r.is_nan() { 0.0 } else { r.clamp(0.0, 1.0) }
}

fn check_ratio(r: f64) -> Result<(), ConfigError> {
    if (0.0..=1.0).contains(&r) {
        Ok(())
    } else {
        Err(ConfigError::new(format!(
            "jitter ratio must be in 0..=1, got {r}"
        )))
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum JitterKind {
    None,
    Ratio(f64),
    Down(f64),
    Fixed(Duration),
    UpTo(Duration),
}

/// How a base duration (usually a TTL) is randomised.
///
/// Every result is at least the floor ([`Jitter::DEFAULT_FLOOR`], 1 s, unless
/// changed with [`Jitter::with_floor`]) and at least 1 ms, so a tiny or zero
/// TTL never turns into "expire immediately". The one exception is
/// [`Jitter::down`], which never returns more than its base: below the
/// floor it returns the base itself (no jitter; at least 1 ms).
///
/// A fixed or additive spread and the floor must be at most 365 days
/// ([`validate`](Jitter::validate)).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use breakwater_cache::Jitter;
/// use rand::SeedableRng;
///
/// let jitter = Jitter::ratio(0.1);
/// jitter.validate().unwrap();
///
/// let mut rng = rand::rngs::StdRng::seed_from_u64(7);
/// let ttl = jitter.apply(Duration::from_secs(300), &mut rng);
/// assert!(ttl >= Duration::from_secs(270) && ttl <= Duration::from_secs(330));
/// assert_eq!(jitter.to_string(), "±10%");
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Jitter {
    kind: JitterKind,
    /// `None` means "the default": 1 s for TTLs, 1 ms for [`Interval`]s.
    floor: Option<Duration>,
}

impl Jitter {
    /// The floor applied when none is set with [`Jitter::with_floor`]: 1 s.
    pub const DEFAULT_FLOOR: Duration = Duration::from_secs(1);

    const fn of(kind: JitterKind) -> Jitter {
        Jitter { kind, floor: None }
    }

    /// No jitter: the result is the base itself (raised to the floor).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use breakwater_cache::Jitter;
    /// use rand::SeedableRng;
    ///
    /// let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    /// let ttl = Jitter::none().apply(Duration::from_secs(60), &mut rng);
    /// assert_eq!(ttl, Duration::from_secs(60));
    /// ```
    pub fn none() -> Jitter {
        Jitter::of(JitterKind::None)
    }

    /// A relative jitter: uniform in `[base·(1−r), base·(1+r)]`, so
    /// `ratio(0.1)` turns 300 s into 270..=330 s. `r` must be in `0..=1`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use breakwater_cache::Jitter;
    ///
    /// let (low, high) = Jitter::ratio(0.1).bounds(Duration::from_secs(300));
    /// assert_eq!(low, Duration::from_secs(270));
    /// assert_eq!(high, Duration::from_secs(330));
    /// ```
    pub fn ratio(r: f64) -> Jitter {
        Jitter::of(JitterKind::Ratio(r))
    }

    /// A downward-only jitter: uniform in `[base·(1−r), base]`, never above
    /// the base. Use it when the base is a maximum age that must hold.
    /// `r` must be in `0..=1`.
    ///
    /// The floor raises the low end, but never above the base: on a base
    /// below the floor (a sub-second TTL with the default 1 s floor) the
    /// result is the base itself, unjittered (and at least 1 ms).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use breakwater_cache::Jitter;
    ///
    /// let (low, high) = Jitter::down(0.2).bounds(Duration::from_secs(300));
    /// assert_eq!(low, Duration::from_secs(240));
    /// assert_eq!(high, Duration::from_secs(300));
    ///
    /// // Below the floor: the base, never more.
    /// let short = Duration::from_millis(500);
    /// assert_eq!(Jitter::down(0.2).bounds(short), (short, short));
    /// ```
    pub fn down(r: f64) -> Jitter {
        Jitter::of(JitterKind::Down(r))
    }

    /// An absolute jitter: uniform in `[base−d, base+d]`. Suits short TTLs,
    /// e.g. ±3 s on 10 s.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use breakwater_cache::Jitter;
    ///
    /// let jitter = Jitter::fixed(Duration::from_secs(3));
    /// let (low, high) = jitter.bounds(Duration::from_secs(10));
    /// assert_eq!((low, high), (Duration::from_secs(7), Duration::from_secs(13)));
    /// assert_eq!(jitter.to_string(), "±3s");
    /// ```
    pub fn fixed(d: Duration) -> Jitter {
        Jitter::of(JitterKind::Fixed(d))
    }

    /// An additive jitter: `base` plus uniform `[0, d]`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use breakwater_cache::Jitter;
    ///
    /// let jitter = Jitter::up_to(Duration::from_secs(90));
    /// let (low, high) = jitter.bounds(Duration::from_secs(600));
    /// assert_eq!((low, high), (Duration::from_secs(600), Duration::from_secs(690)));
    /// assert_eq!(jitter.to_string(), "+0..90s");
    /// ```
    pub fn up_to(d: Duration) -> Jitter {
        Jitter::of(JitterKind::UpTo(d))
    }

    /// Sets the smallest duration [`Jitter::apply`] returns (default 1 s).
    /// It must be at least 1 ms; whole milliseconds are used.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use breakwater_cache::Jitter;
    ///
    /// let jitter = Jitter::ratio(1.0).with_floor(Duration::from_secs(5));
    /// assert_eq!(jitter.floor(), Duration::from_secs(5));
    /// assert_eq!(jitter.bounds(Duration::from_secs(4)).0, Duration::from_secs(5));
    /// ```
    pub fn with_floor(self, floor: Duration) -> Jitter {
        Jitter {
            floor: Some(floor),
            ..self
        }
    }

    /// The smallest duration [`Jitter::apply`] returns.
    pub fn floor(&self) -> Duration {
        self.floor.unwrap_or(Self::DEFAULT_FLOOR)
    }

    /// Checks the parameters: a ratio must be in `0..=1` (not NaN), a fixed
    /// or additive spread at most 365 days, and the floor between 1 ms and
    /// 365 days.
    ///
    /// # Examples
    ///
    /// ```
    /// use breakwater_cache::Jitter;
    ///
    /// assert!(Jitter::ratio(0.2).validate().is_ok());
    /// let err = Jitter::ratio(1.5).validate().unwrap_err();
    /// assert_eq!(err.message(), "jitter ratio must be in 0..=1, got 1.5");
    /// ```
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self.kind {
            JitterKind::Ratio(r) => check_ratio(r).for_key("ratio")?,
            JitterKind::Down(r) => check_ratio(r).for_key("down")?,
            JitterKind::Fixed(d) | JitterKind::UpTo(d) => ConfigError::at_most(
                "jitter spread",
                d,
                MAX_WINDOW,
                "use a spread well below the TTL, or Jitter::ratio",
            )
            .for_key(if matches!(self.kind, JitterKind::Fixed(_)) {
                "fixed"
            } else {
                "up_to"
            })?,
            JitterKind::None => {}
        }
        let floor = self.floor();
        if to_ms(floor) == 0 {
            return Err(ConfigError::new(format!(
                "jitter floor must be at least 1ms, got {}ms",
                to_ms(floor)
            ))
            .for_key("floor"));
        }
        ConfigError::at_most(
            "jitter floor",
            floor,
            MAX_WINDOW,
            "use a floor below the TTL (the default is 1s)",
        )
        .for_key("floor")
    }

    /// The inclusive range `(low, high)` of what [`Jitter::apply`] can return
    /// for `base`, floor included.
    pub fn bounds(&self, base: Duration) -> (Duration, Duration) {
        let (low, high) = self.bounds_ms(to_ms(base), self.floor_ms(to_ms(Self::DEFAULT_FLOOR)));
        (Duration::from_millis(low), Duration::from_millis(high))
    }

    /// Returns `base` with the jitter applied: uniform over the whole
    /// milliseconds of [`Jitter::bounds`], never below the floor or 1 ms.
    pub fn apply<R>(&self, base: Duration, rng: &mut R) -> Duration
    where
        R: Rng + ?Sized,
    {
        let floor = self.floor_ms(to_ms(Self::DEFAULT_FLOOR));
        Duration::from_millis(self.apply_ms(to_ms(base), floor, rng))
    }

    /// The floor in ms, `default_ms` when unset, never below 1 ms.
    fn floor_ms(&self, default_ms: u64) -> u64 {
        self.floor.map_or(default_ms, to_ms).max(1)
    }

    /// `(low, high)` in ms for `base_ms`, both raised to `floor_ms`.
    fn bounds_ms(&self, base_ms: u64, floor_ms: u64) -> (u64, u64) {
        // Rounded ratio delta; exact (0) for a zero ratio, symmetric around base.
        let delta = |r: f64| {
            let d = (base_ms as f64 * clamp_ratio(r)).round();
            // `as` saturates; the delta can't exceed base_ms for r <= 1 anyway.
            (d as u64).min(base_ms)
        };
        let (low, high) = match self.kind {
            JitterKind::None => (base_ms, base_ms),
            JitterKind::Ratio(r) => {
                let d = delta(r);
                (base_ms - d, base_ms.saturating_add(d))
            }
            JitterKind::Down(r) => {
                // Never above the base: the floor lifts the low end at most
                // to the base, so a base below the floor is used as it is.
                let low = (base_ms - delta(r)).max(floor_ms.min(base_ms));
                return (low.max(1), base_ms.max(1));
            }
            JitterKind::Fixed(d) => {
                let d = to_ms(d);
                (base_ms.saturating_sub(d), base_ms.saturating_add(d))
            }
            JitterKind::UpTo(d) => (base_ms, base_ms.saturating_add(to_ms(d))),
        };
        (low.max(floor_ms), high.max(floor_ms))
    }

    fn apply_ms<R: Rng + ?Sized>(&self, base_ms: u64, floor_ms: u64, rng: &mut R) -> u64 {
        let (low, high) = self.bounds_ms(base_ms, floor_ms);
        uniform(low, high, rng)
    }
}

impl fmt::Display for Jitter {
    /// `none`, `±20%`, `-20%`, `±3s` or `+0..90s` (the floor is not shown).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Percent rounded to two decimals, so 0.07 prints as 7, not 7.000000000000001.
        let pct = |r: f64| (r * 10_000.0).round() / 100.0 + 0.0;
        match self.kind {
            JitterKind::None => f.write_str("none"),
            JitterKind::Ratio(r) => write!(f, "±{}%", pct(r)),
            JitterKind::Down(r) => write!(f, "-{}%", pct(r)),
            JitterKind::Fixed(d) => {
                f.write_str("±")?;
                fmt_ms(f, d)
            }
            JitterKind::UpTo(d) => {
                f.write_str("+0..")?;
                fmt_ms(f, d)
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BackoffMode {
    Full,
    Decorrelated,
}

/// Retry backoff with jitter (AWS "Exponential Backoff and Jitter").
///
/// Two strategies: *full jitter* (uniform in `[0, min(cap, base·2^attempt)]`)
/// and *decorrelated jitter* (`min(cap, uniform[base, previous·3])`).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use breakwater_cache::jitter::Backoff;
/// use rand::SeedableRng;
///
/// let backoff = Backoff::full_jitter(Duration::from_millis(100), Duration::from_secs(10));
/// backoff.validate().unwrap();
/// assert_eq!(backoff.ceiling(3), Duration::from_millis(800));
///
/// let mut rng = rand::rngs::StdRng::seed_from_u64(3);
/// let delay = backoff.delay(3, None, &mut rng);
/// assert!(delay <= Duration::from_millis(800));
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    strategy: BackoffMode,
    base: Duration,
    cap: Duration,
}

impl Backoff {
    /// Full jitter: the delay for `attempt` (0-based) is uniform in
    /// `[0, min(cap, base·2^attempt)]`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use breakwater_cache::jitter::Backoff;
    ///
    /// let backoff = Backoff::full_jitter(Duration::from_millis(100), Duration::from_secs(1));
    /// assert_eq!(backoff.ceiling(0), Duration::from_millis(100));
    /// assert_eq!(backoff.ceiling(10), Duration::from_secs(1));
    /// ```
    pub fn full_jitter(base: Duration, cap: Duration) -> Backoff {
        Backoff {
            strategy: BackoffMode::Full,
            base,
            cap,
        }
    }

    /// Decorrelated jitter: the delay is `min(cap, uniform[base, previous·3])`,
    /// where `previous` is the delay returned last time (the base on the first
    /// retry).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use breakwater_cache::jitter::Backoff;
    /// use rand::SeedableRng;
    ///
    /// let base = Duration::from_millis(100);
    /// let cap = Duration::from_secs(5);
    /// let backoff = Backoff::decorrelated(base, cap);
    /// let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    /// let mut previous = None;
    /// for attempt in 0..10 {
    ///     let delay = backoff.delay(attempt, previous, &mut rng);
    ///     assert!(delay >= base && delay <= cap);
    ///     previous = Some(delay);
    /// }
    /// ```
    pub fn decorrelated(base: Duration, cap: Duration) -> Backoff {
        Backoff {
            strategy: BackoffMode::Decorrelated,
            base,
            cap,
        }
    }

    /// `(base, cap, decorrelated)`: what it was built from.
    pub(crate) fn parts(&self) -> (Duration, Duration, bool) {
        (
            self.base,
            self.cap,
            self.strategy == BackoffMode::Decorrelated,
        )
    }

    /// Checks the parameters: the base must be at least 1 ms (arithmetic is
    /// in whole milliseconds) and the cap at least the base and at most a
    /// day.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use breakwater_cache::jitter::Backoff;
    ///
    /// let err = Backoff::full_jitter(Duration::from_millis(100), Duration::from_millis(50))
    ///     .validate()
    ///     .unwrap_err();
    /// assert_eq!(err.message(), "backoff cap (50ms) must be at least the base (100ms)");
    /// ```
    pub fn validate(&self) -> Result<(), ConfigError> {
        if to_ms(self.base) == 0 {
            return Err(ConfigError::new("backoff base must be greater than zero").for_key("base"));
        }
        if self.cap < self.base {
            return Err(ConfigError::new(format!(
                "backoff cap ({:?}) must be at least the base ({:?})",
                self.cap, self.base
            ))
            .for_key("cap"));
        }
        ConfigError::at_most(
            "backoff cap",
            self.cap,
            MAX_WAIT,
            "use seconds (load_timeout bounds the retries anyway)",
        )
        .for_key("cap")
    }

    /// The largest delay `attempt` (0-based) can get: `min(cap, base·2^attempt)`
    /// for full jitter (saturating, so any attempt is fine), the cap for
    /// decorrelated jitter.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        Duration::from_millis(self.ceiling_ms(attempt))
    }

    fn ceiling_ms(&self, attempt: u32) -> u64 {
        let cap = to_ms(self.cap);
        match self.strategy {
            BackoffMode::Full => {
                let grown = 1u64
                    .checked_shl(attempt)
                    .and_then(|factor| to_ms(self.base).checked_mul(factor))
                    .unwrap_or(u64::MAX);
                // A zero base stays zero however large the attempt.
                let grown = if self.base.is_zero() { 0 } else { grown };
                cap.min(grown)
            }
            BackoffMode::Decorrelated => cap,
        }
    }

    /// The delay before retry `attempt` (0-based).
    ///
    /// Full jitter uses `attempt` and ignores `previous`; decorrelated jitter
    /// uses `previous` (the delay it returned last time, `None` on the first
    /// retry) and ignores `attempt`.
    pub fn delay<R>(&self, attempt: u32, previous: Option<Duration>, rng: &mut R) -> Duration
    where
        R: Rng + ?Sized,
    {
        let ms = match self.strategy {
            BackoffMode::Full => uniform(0, self.ceiling_ms(attempt), rng),
            BackoffMode::Decorrelated => {
                let base = to_ms(self.base);
                let previous = previous.map_or(base, to_ms);
                let high = previous.saturating_mul(3).max(base);
                uniform(base, high, rng).min(to_ms(self.cap))
            }
        };
        Duration::from_millis(ms)
    }
}

/// A jittered period for cron-like refresh loops, so a fleet does not tick in
/// lockstep.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use breakwater_cache::jitter::{Interval, Jitter};
/// use rand::SeedableRng;
///
/// let interval = Interval::new(Duration::from_secs(60), Jitter::ratio(0.1));
/// interval.validate().unwrap();
///
/// let mut rng = rand::rngs::StdRng::seed_from_u64(5);
/// assert!(interval.first_delay(&mut rng) <= Duration::from_secs(60));
/// let next = interval.next_delay(&mut rng);
/// assert!(next >= Duration::from_secs(54) && next <= Duration::from_secs(66));
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Interval {
    period: Duration,
    jitter: Jitter,
}

impl Interval {
    /// An interval of `period` with `jitter` applied to every tick.
    ///
    /// The jitter's floor applies as for TTLs, except that a jitter without an
    /// explicit [`Jitter::with_floor`] gets a floor of 1 ms here, not 1 s.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use breakwater_cache::jitter::{Interval, Jitter};
    ///
    /// let interval = Interval::new(Duration::from_millis(200), Jitter::none());
    /// assert!(interval.validate().is_ok());
    /// ```
    pub fn new(period: Duration, jitter: Jitter) -> Interval {
        Interval { period, jitter }
    }

    /// Checks that the period is at least 1 ms (arithmetic is in whole
    /// milliseconds) and that the jitter is valid.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if to_ms(self.period) == 0 {
            return Err(ConfigError::new(
                "interval period must be greater than zero",
            ));
        }
        self.jitter.validate()
    }

    /// Delay before the first tick: uniform in `[0, period]`, spreading a
    /// fleet that starts together.
    pub fn first_delay<R>(&self, rng: &mut R) -> Duration
    where
        R: Rng + ?Sized,
    {
        Duration::from_millis(uniform(0, to_ms(self.period), rng))
    }

    /// Delay between ticks: the period with the jitter applied, never below
    /// the floor (1 ms unless the jitter has an explicit floor).
    pub fn next_delay<R>(&self, rng: &mut R) -> Duration
    where
        R: Rng + ?Sized,
    {
        let floor = self.jitter.floor_ms(INTERVAL_FLOOR_MS);
        Duration::from_millis(self.jitter.apply_ms(to_ms(self.period), floor, rng))
    }
}

/// The lock-polling delay `delay/2 + rand·delay`: uniform over the whole
/// milliseconds of `[delay/2, delay/2 + delay]` (that is, within
/// `[delay/2, 3·delay/2]`). A zero delay gives zero.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use breakwater_cache::jitter::poll_delay;
/// use rand::SeedableRng;
///
/// let mut rng = rand::rngs::StdRng::seed_from_u64(11);
/// let wait = poll_delay(Duration::from_millis(100), &mut rng);
/// assert!(wait >= Duration::from_millis(50) && wait <= Duration::from_millis(150));
/// ```
pub fn poll_delay<R>(delay: Duration, rng: &mut R) -> Duration
where
    R: Rng + ?Sized,
{
    let d = to_ms(delay);
    let low = d / 2;
    Duration::from_millis(uniform(low, low.saturating_add(d), rng))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;
    use std::collections::HashSet;

    const SAMPLES: usize = 10_000;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn ms(m: u64) -> Duration {
        Duration::from_millis(m)
    }

    fn rng(seed: u64) -> StdRng {
        StdRng::seed_from_u64(seed)
    }

    fn samples(jitter: Jitter, base: Duration, seed: u64) -> Vec<Duration> {
        let mut rng = rng(seed);
        (0..SAMPLES).map(|_| jitter.apply(base, &mut rng)).collect()
    }

    const TEN_DAYS_MS: u64 = 10 * 24 * 60 * 60 * 1000;
    const ONE_DAY_MS: u64 = 24 * 60 * 60 * 1000;

    fn any_jitter() -> impl Strategy<Value = Jitter> {
        prop_oneof![
            Just(Jitter::none()),
            (0.0..=1.0f64).prop_map(Jitter::ratio),
            (0.0..=1.0f64).prop_map(Jitter::down),
            (0..=TEN_DAYS_MS).prop_map(|d| Jitter::fixed(ms(d))),
            (0..=TEN_DAYS_MS).prop_map(|d| Jitter::up_to(ms(d))),
        ]
    }

    fn any_floor() -> impl Strategy<Value = Option<Duration>> {
        prop::option::of((1..=120_000u64).prop_map(ms))
    }

    fn with_floor(jitter: Jitter, floor: Option<Duration>) -> Jitter {
        match floor {
            Some(floor) => jitter.with_floor(floor),
            None => jitter,
        }
    }

    proptest! {
        #[test]
        fn apply_lies_within_bounds(
            jitter in any_jitter(),
            floor in any_floor(),
            base in prop_oneof![0..=2_000u64, 0..=TEN_DAYS_MS],
            seed in any::<u64>(),
        ) {
            let jitter = with_floor(jitter, floor);
            prop_assert!(jitter.validate().is_ok());
            let base = ms(base);
            // `down` never goes above its base, floor or not.
            let floor = match jitter.kind {
                JitterKind::Down(_) => jitter.floor().min(base).max(ms(1)),
                _ => jitter.floor(),
            };
            let (low, high) = jitter.bounds(base);
            prop_assert!(low <= high);
            prop_assert!(low >= floor);
            let mut rng = rng(seed);
            for _ in 0..16 {
                let out = jitter.apply(base, &mut rng);
                prop_assert!(low <= out && out <= high, "{out:?} not in {low:?}..={high:?}");
                prop_assert!(out >= floor);
                prop_assert!(out >= ms(1));
                prop_assert_eq!(out.subsec_nanos() % 1_000_000, 0);
            }
        }

        #[test]
        fn down_never_exceeds_base(
            r in 0.0..=1.0f64,
            floor in any_floor(),
            base in prop_oneof![0..=2_000u64, 0..=TEN_DAYS_MS],
            seed in any::<u64>(),
        ) {
            let jitter = with_floor(Jitter::down(r), floor);
            let base = ms(base);
            // Never above the base, whatever the floor (1 ms at least).
            let limit = base.max(ms(1));
            prop_assert!(jitter.bounds(base).1 <= limit);
            let mut rng = rng(seed);
            for _ in 0..16 {
                prop_assert!(jitter.apply(base, &mut rng) <= limit);
            }
        }

        #[test]
        fn ratio_bounds_are_symmetric(r in 0.0..=1.0f64, base in 0..=TEN_DAYS_MS) {
            // A 1 ms floor never binds above zero, so the bounds are symmetric.
            let jitter = Jitter::ratio(r).with_floor(ms(1));
            let (low, high) = jitter.bounds(ms(base));
            let (low, high) = (to_ms(low), to_ms(high));
            if base >= 1 && low > 1 {
                prop_assert_eq!(base - low, high - base);
            }
            let expected = (base as f64 * r).round() as u64;
            prop_assert_eq!(high - base, expected);
        }

        #[test]
        fn invalid_jitter_never_panics(
            r in prop_oneof![
                any::<f64>(),
                Just(f64::NAN),
                Just(f64::INFINITY),
                Just(f64::NEG_INFINITY),
                Just(-0.5),
                Just(1.5),
            ],
            floor in prop_oneof![Just(Duration::ZERO), Just(Duration::from_micros(500)), Just(Duration::MAX)],
            base in prop_oneof![Just(Duration::ZERO), Just(Duration::MAX), any::<u64>().prop_map(ms)],
            seed in any::<u64>(),
        ) {
            let mut rng = rng(seed);
            for jitter in [Jitter::ratio(r), Jitter::down(r), Jitter::fixed(Duration::MAX), Jitter::up_to(Duration::MAX)] {
                let jitter = jitter.with_floor(floor);
                let (low, high) = jitter.bounds(base);
                let out = jitter.apply(base, &mut rng);
                prop_assert!(low <= out && out <= high);
                prop_assert!(out >= ms(1));
                let _ = jitter.to_string();
                let _ = jitter.validate();
            }
        }

        #[test]
        fn full_jitter_within_ceiling(
            base in 1..=60_000u64,
            extra in 0..=(ONE_DAY_MS - 60_000),
            attempt in 0..=300u32,
            seed in any::<u64>(),
        ) {
            let backoff = Backoff::full_jitter(ms(base), ms(base + extra));
            prop_assert!(backoff.validate().is_ok());
            let ceiling = backoff.ceiling(attempt);
            prop_assert!(ceiling <= ms(base + extra));
            prop_assert!(ceiling <= backoff.ceiling(attempt.saturating_add(1)));
            let mut rng = rng(seed);
            for _ in 0..16 {
                prop_assert!(backoff.delay(attempt, None, &mut rng) <= ceiling);
            }
        }

        #[test]
        fn ceiling_is_monotone_and_capped(
            base in any::<u64>(),
            cap in any::<u64>(),
            decorrelated in any::<bool>(),
        ) {
            let backoff = if decorrelated {
                Backoff::decorrelated(ms(base), ms(cap))
            } else {
                Backoff::full_jitter(ms(base), ms(cap))
            };
            let mut last = Duration::ZERO;
            for attempt in (0..=200).chain([u32::MAX - 1, u32::MAX]) {
                let ceiling = backoff.ceiling(attempt);
                prop_assert!(ceiling >= last);
                prop_assert!(ceiling <= ms(cap));
                last = ceiling;
            }
        }

        #[test]
        fn decorrelated_within_base_and_cap(
            base in 1..=60_000u64,
            extra in 0..=TEN_DAYS_MS,
            previous in prop::option::of(prop_oneof![any::<u64>().prop_map(ms), Just(Duration::MAX)]),
            seed in any::<u64>(),
        ) {
            let (base, cap) = (ms(base), ms(base + extra));
            let backoff = Backoff::decorrelated(base, cap);
            let mut rng = rng(seed);
            let mut previous = previous;
            for attempt in 0..16 {
                let delay = backoff.delay(attempt, previous, &mut rng);
                prop_assert!(base <= delay && delay <= cap, "{delay:?}");
                previous = Some(delay);
            }
        }

        #[test]
        fn poll_delay_within_half_and_three_halves(d in prop_oneof![any::<u64>(), 0..=100_000u64], seed in any::<u64>()) {
            let mut rng = rng(seed);
            for _ in 0..16 {
                let out = to_ms(poll_delay(ms(d), &mut rng));
                prop_assert!(out >= d / 2);
                prop_assert!(u128::from(out) * 2 <= u128::from(d) * 3);
            }
        }

        #[test]
        fn interval_delays_within_range(
            period in 0..=TEN_DAYS_MS,
            jitter in any_jitter(),
            seed in any::<u64>(),
        ) {
            let interval = Interval::new(ms(period), jitter);
            let mut rng = rng(seed);
            for _ in 0..16 {
                prop_assert!(interval.first_delay(&mut rng) <= ms(period));
                let next = interval.next_delay(&mut rng);
                let (low, high) = jitter.with_floor(ms(1)).bounds(ms(period));
                prop_assert!(low <= next && next <= high);
                prop_assert!(next >= ms(1));
            }
        }
    }

    #[test]
    fn ratio_spreads_300s_over_240_to_360s() {
        let out = samples(Jitter::ratio(0.2), secs(300), 42);
        assert!(out.iter().all(|d| secs(240) <= *d && *d <= secs(360)));
        let mean = out.iter().map(|d| d.as_secs_f64()).sum::<f64>() / SAMPLES as f64;
        assert!((mean - 300.0).abs() < 3.0, "mean {mean}");
        let distinct: HashSet<_> = out.iter().collect();
        assert!(
            distinct.len() >= 100,
            "only {} distinct values",
            distinct.len()
        );
        let min = out.iter().min().copied().unwrap_or_default();
        let max = out.iter().max().copied().unwrap_or_default();
        assert!(min < secs(245), "min {min:?}");
        assert!(max > secs(355), "max {max:?}");
    }

    #[test]
    fn ratio_10_percent_bounds() {
        assert_eq!(Jitter::ratio(0.1).bounds(secs(300)), (secs(270), secs(330)));
    }

    #[test]
    fn down_never_above_300s() {
        let out = samples(Jitter::down(0.2), secs(300), 43);
        assert!(out.iter().all(|d| secs(240) <= *d && *d <= secs(300)));
        assert!(out.iter().min().copied().unwrap_or_default() < secs(245));
    }

    #[test]
    fn fixed_3s_on_10s() {
        let out = samples(Jitter::fixed(secs(3)), secs(10), 44);
        assert!(out.iter().all(|d| secs(7) <= *d && *d <= secs(13)));
        assert_eq!(Jitter::fixed(secs(3)).bounds(secs(10)), (secs(7), secs(13)));
    }

    #[test]
    fn up_to_adds_only() {
        let out = samples(Jitter::up_to(secs(90)), secs(600), 45);
        assert!(out.iter().all(|d| secs(600) <= *d && *d <= secs(690)));
    }

    #[test]
    fn tiny_ttls_never_below_default_floor() {
        for base in [ms(0), ms(1), ms(500)] {
            for jitter in [Jitter::ratio(1.0), Jitter::fixed(secs(10)), Jitter::none()] {
                let (low, _) = jitter.bounds(base);
                assert_eq!(low, secs(1), "{jitter} on {base:?}");
                let out = samples(jitter, base, 46);
                assert!(out.iter().all(|d| *d >= secs(1)), "{jitter} on {base:?}");
            }
        }
        assert_eq!(Jitter::none().bounds(ms(500)), (secs(1), secs(1)));
    }

    /// The floor never lifts `down` above its base: a sub-second TTL is
    /// used as it is.
    #[test]
    fn down_below_the_floor_is_the_base() {
        for base in [ms(1), ms(500), ms(999)] {
            assert_eq!(Jitter::down(0.2).bounds(base), (base, base));
            assert_eq!(Jitter::down(1.0).apply(base, &mut rng(3)), base);
        }
        assert_eq!(Jitter::down(1.0).bounds(ms(0)), (ms(1), ms(1)));
        // Above the floor, the floor still lifts the low end.
        assert_eq!(Jitter::down(0.9).bounds(secs(2)), (secs(1), secs(2)));
        assert_eq!(Jitter::down(0.2).bounds(ms(1100)), (secs(1), ms(1100)));
    }

    #[test]
    fn custom_floor_is_respected() {
        let jitter = Jitter::ratio(1.0).with_floor(secs(30));
        assert_eq!(jitter.floor(), secs(30));
        let out = samples(jitter, secs(40), 47);
        assert!(out.iter().all(|d| secs(30) <= *d && *d <= secs(80)));
        // A lower floor lets tiny TTLs through.
        let low = Jitter::none().with_floor(ms(1));
        assert_eq!(low.apply(ms(5), &mut rng(0)), ms(5));
        assert_eq!(low.apply(ms(0), &mut rng(0)), ms(1));
        assert_eq!(Jitter::none().floor(), Jitter::DEFAULT_FLOOR);
    }

    #[test]
    fn zero_ratio_is_exactly_the_base() {
        let mut rng = rng(48);
        for base in [secs(1), secs(300), ms(123_456_789), Duration::MAX] {
            let expected = Duration::from_millis(to_ms(base));
            for jitter in [Jitter::ratio(0.0), Jitter::down(0.0), Jitter::none()] {
                assert_eq!(jitter.apply(base, &mut rng), expected, "{jitter}");
                assert_eq!(jitter.bounds(base), (expected, expected));
            }
        }
    }

    #[test]
    fn same_seed_same_sequence() {
        let jitter = Jitter::ratio(0.2);
        assert_eq!(samples(jitter, secs(300), 7), samples(jitter, secs(300), 7));
        assert_ne!(samples(jitter, secs(300), 7), samples(jitter, secs(300), 8));

        let backoff = Backoff::decorrelated(ms(100), secs(30));
        let run = |seed| {
            let mut rng = rng(seed);
            let mut previous = None;
            (0..50)
                .map(|attempt| {
                    let d = backoff.delay(attempt, previous, &mut rng);
                    previous = Some(d);
                    d
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(run(9), run(9));
    }

    #[test]
    fn validate_messages() {
        let msg = |r: Result<(), ConfigError>| r.map_err(|e| e.message().to_owned());
        assert_eq!(
            msg(Jitter::ratio(1.5).validate()),
            Err("jitter ratio must be in 0..=1, got 1.5".to_owned())
        );
        assert_eq!(
            msg(Jitter::down(-0.25).validate()),
            Err("jitter ratio must be in 0..=1, got -0.25".to_owned())
        );
        assert_eq!(
            msg(Jitter::ratio(f64::NAN).validate()),
            Err("jitter ratio must be in 0..=1, got NaN".to_owned())
        );
        assert_eq!(
            msg(Jitter::down(f64::NAN).validate()),
            Err("jitter ratio must be in 0..=1, got NaN".to_owned())
        );
        assert_eq!(
            msg(Jitter::ratio(0.2).with_floor(Duration::ZERO).validate()),
            Err("jitter floor must be at least 1ms, got 0ms".to_owned())
        );
        assert_eq!(
            msg(Backoff::full_jitter(Duration::ZERO, secs(1)).validate()),
            Err("backoff base must be greater than zero".to_owned())
        );
        assert_eq!(
            msg(Backoff::decorrelated(ms(100), ms(50)).validate()),
            Err("backoff cap (50ms) must be at least the base (100ms)".to_owned())
        );
        assert_eq!(
            msg(Interval::new(Duration::ZERO, Jitter::none()).validate()),
            Err("interval period must be greater than zero".to_owned())
        );
        assert_eq!(
            msg(Interval::new(secs(1), Jitter::ratio(2.0)).validate()),
            Err("jitter ratio must be in 0..=1, got 2".to_owned())
        );

        let year = secs(365 * 24 * 3600);
        assert_eq!(
            msg(Jitter::fixed(Duration::MAX).validate()),
            Err(format!(
                "jitter spread must be at most 365 days, got {:?}; use a spread well below the TTL, or Jitter::ratio",
                Duration::MAX
            ))
        );
        assert_eq!(
            msg(Jitter::up_to(year + ms(1)).validate()),
            Err("jitter spread must be at most 365 days, got 31536000.001s; use a spread well below the TTL, or Jitter::ratio".to_owned())
        );
        assert_eq!(
            msg(Jitter::none().with_floor(Duration::MAX).validate()),
            Err(format!(
                "jitter floor must be at most 365 days, got {:?}; use a floor below the TTL (the default is 1s)",
                Duration::MAX
            ))
        );

        for ok in [
            Jitter::none(),
            Jitter::ratio(0.0),
            Jitter::ratio(1.0),
            Jitter::down(0.5),
            Jitter::fixed(Duration::ZERO),
            Jitter::fixed(year),
            Jitter::up_to(year),
            Jitter::ratio(0.2).with_floor(ms(1)),
            Jitter::ratio(0.2).with_floor(year),
        ] {
            assert_eq!(msg(ok.validate()), Ok(()), "{ok}");
        }
        assert!(Backoff::full_jitter(ms(100), ms(100)).validate().is_ok());
        assert!(
            Interval::new(ms(1), Jitter::fixed(secs(1)))
                .validate()
                .is_ok()
        );
    }

    #[test]
    fn invalid_values_are_clamped_at_apply_time() {
        let base = secs(100);
        assert_eq!(Jitter::ratio(f64::NAN).bounds(base), (base, base));
        assert_eq!(Jitter::ratio(-3.0).bounds(base), (base, base));
        assert_eq!(Jitter::ratio(7.0).bounds(base), (secs(1), secs(200)));
        assert_eq!(Jitter::down(f64::INFINITY).bounds(base), (secs(1), base));
        let zero_floor = Jitter::ratio(1.0).with_floor(Duration::ZERO);
        assert_eq!(zero_floor.bounds(Duration::ZERO), (ms(1), ms(1)));
        assert_eq!(zero_floor.apply(Duration::ZERO, &mut rng(1)), ms(1));
        // cap < base: the cap still wins.
        let bad = Backoff::decorrelated(secs(2), secs(1));
        assert_eq!(bad.delay(0, None, &mut rng(1)), secs(1));
        let zero = Backoff::full_jitter(Duration::ZERO, Duration::ZERO);
        assert_eq!(zero.ceiling(u32::MAX), Duration::ZERO);
        assert_eq!(zero.delay(5, None, &mut rng(1)), Duration::ZERO);
    }

    #[test]
    fn backoff_ceiling_doubles_then_caps() {
        let backoff = Backoff::full_jitter(ms(100), secs(10));
        let ceilings: Vec<_> = (0..9).map(|a| to_ms(backoff.ceiling(a))).collect();
        assert_eq!(
            ceilings,
            [100, 200, 400, 800, 1600, 3200, 6400, 10_000, 10_000]
        );
        assert_eq!(backoff.ceiling(200), secs(10));
        assert_eq!(backoff.ceiling(u32::MAX), secs(10));
        let huge = Backoff::full_jitter(Duration::MAX, Duration::MAX);
        assert_eq!(huge.ceiling(200), ms(u64::MAX));
        assert_eq!(Backoff::decorrelated(ms(100), secs(3)).ceiling(0), secs(3));
    }

    #[test]
    fn interval_uses_a_1ms_floor_by_default() {
        let interval = Interval::new(ms(10), Jitter::fixed(secs(1)));
        let mut rng = rng(49);
        let delays: Vec<_> = (0..1000).map(|_| interval.next_delay(&mut rng)).collect();
        assert!(delays.iter().all(|d| ms(1) <= *d && *d <= ms(1010)));
        assert!(delays.iter().any(|d| *d < secs(1)));
        // An explicit floor still applies.
        let floored = Interval::new(ms(10), Jitter::none().with_floor(ms(500)));
        assert_eq!(floored.next_delay(&mut rng), ms(500));
        let firsts: Vec<_> = (0..1000).map(|_| interval.first_delay(&mut rng)).collect();
        assert!(firsts.iter().all(|d| *d <= ms(10)));
        assert!(firsts.contains(&Duration::ZERO) && firsts.contains(&ms(10)));
    }

    #[test]
    fn poll_delay_examples() {
        let mut rng = rng(50);
        let out: Vec<_> = (0..1000).map(|_| poll_delay(ms(100), &mut rng)).collect();
        assert!(out.iter().all(|d| ms(50) <= *d && *d <= ms(150)));
        assert_eq!(poll_delay(Duration::ZERO, &mut rng), Duration::ZERO);
        let _ = poll_delay(Duration::MAX, &mut rng);
    }

    #[test]
    fn display() {
        assert_eq!(Jitter::none().to_string(), "none");
        assert_eq!(Jitter::ratio(0.2).to_string(), "±20%");
        assert_eq!(Jitter::ratio(0.07).to_string(), "±7%");
        assert_eq!(Jitter::down(0.2).to_string(), "-20%");
        assert_eq!(Jitter::fixed(secs(3)).to_string(), "±3s");
        assert_eq!(Jitter::fixed(ms(1500)).to_string(), "±1500ms");
        assert_eq!(Jitter::up_to(secs(90)).to_string(), "+0..90s");
        assert_eq!(Jitter::ratio(f64::NAN).to_string(), "±NaN%");
    }

    #[test]
    fn works_through_dyn_rng() {
        let mut rng = rng(51);
        let dyn_rng: &mut dyn Rng = &mut rng;
        let out = Jitter::ratio(0.2).apply(secs(300), dyn_rng);
        assert!(secs(240) <= out && out <= secs(360));
    }
}

//! A circuit breaker around the loader, so a failing database is left alone
//! to recover instead of being hit by every miss.
//!
//! The breaker is **closed** while loads succeed. It **opens** after
//! `failure_threshold` consecutive failures, or, if enabled, when the share of
//! failures over a sliding window reaches `failure_ratio`. While open it
//! refuses every load for a cool-down, jittered on each opening so a fleet of
//! processes does not probe the database in lockstep. Once the cool-down has
//! passed it is **half-open**: up to `half_open_probes` loads run as probes.
//! A probe that succeeds closes the breaker; a probe that fails opens it
//! again with a fresh cool-down.
//!
//! All time is [`tokio::time::Instant`], so paused-time tests drive the
//! cool-down with `tokio::time::advance`. That is why it is written here
//! rather than taken from a crate: the breaker crates read the system clock,
//! which a paused tokio runtime does not move. A healthy closed breaker is
//! lock-free (one atomic load per permit and per success); state changes
//! take its mutex.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use metrics::{Label, SharedString};
use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::time::Instant;

use crate::clock::millis as to_ms;
use crate::error::{ConfigError, Error, ErrorKind, KeyedResult, MAX_WAIT};
use crate::jitter::Jitter;

/// The sliding window is kept as this many buckets, so it slides in steps of
/// `window / BUCKETS` and its memory does not grow with the load.
const BUCKETS: u64 = 10;

/// The most half-open probes accepted.
const MAX_PROBES: u32 = 1_000;

/// How far ahead "never" is when a cool-down overflows the clock (30 years,
/// as tokio does).
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// When the circuit breaker opens and how long it stays open.
///
/// # Defaults
///
/// | setting | default |
/// |---|---|
/// | `consecutive_failures` | 5 |
/// | `failure_ratio` | off |
/// | `cool_down` | 5 s |
/// | `cool_down_jitter` | [`Jitter::ratio(0.2)`](Jitter::ratio) with a 1 ms floor (4..=6 s) |
/// | `half_open_probes` | 1 |
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use breakwater_cache::BreakerConfig;
///
/// let config = BreakerConfig::new()
///     .consecutive_failures(3)
///     .failure_ratio(0.5, Duration::from_secs(30), 50)
///     .cool_down(Duration::from_secs(10));
/// assert!(config.validate().is_ok());
///
/// let err = BreakerConfig::new().half_open_probes(0).validate().unwrap_err();
/// assert_eq!(err.message(), "breaker half-open probes must be at least 1");
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BreakerConfig {
    failure_threshold: u32,
    failure_ratio: Option<RatioRule>,
    cool_down: Duration,
    cool_down_jitter: Jitter,
    half_open_probes: u32,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            failure_threshold: 5,
            failure_ratio: None,
            cool_down: Duration::from_secs(5),
            cool_down_jitter: Jitter::ratio(0.2).with_floor(Duration::from_millis(1)),
            half_open_probes: 1,
        }
    }
}

impl BreakerConfig {
    /// The defaults (see the table above); the same as [`Default`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Opens the breaker after `n` failures in a row; a success resets the
    /// count. `n` must be at least 1.
    pub fn consecutive_failures(mut self, n: u32) -> Self {
        self.failure_threshold = n;
        self
    }

    /// Also opens the breaker when, over the last `window`, at least
    /// `min_calls` loads finished and the share that failed is at least
    /// `ratio`. `ratio` must be in `(0, 1]`, `window` greater than zero and
    /// `min_calls` at least 1.
    ///
    /// The window is kept as ten buckets, so old calls drop out in steps of
    /// `window / 10`: the rule sees between 90 % and 100 % of the window.
    pub fn failure_ratio(mut self, ratio: f64, window: Duration, min_calls: u32) -> Self {
        self.failure_ratio = Some(RatioRule {
            ratio,
            window,
            min_calls,
        });
        self
    }

    /// How long the breaker stays open before it lets a probe through, before
    /// jitter. It must be at least 1 ms (the jitter works in whole
    /// milliseconds).
    pub fn cool_down(mut self, d: Duration) -> Self {
        self.cool_down = d;
        self
    }

    /// The jitter drawn afresh for each opening's cool-down. A jitter without
    /// an explicit [`Jitter::with_floor`] gets Jitter's usual 1 s floor.
    pub fn cool_down_jitter(mut self, jitter: Jitter) -> Self {
        self.cool_down_jitter = jitter;
        self
    }

    /// How many probe loads may run at once while half-open. It must be at
    /// least 1.
    pub fn half_open_probes(mut self, n: u32) -> Self {
        self.half_open_probes = n;
        self
    }

    /// Checks every setting and reports the first invalid one.
    ///
    /// Used without validation, a zero threshold, probe count or `min_calls`
    /// acts as 1 and an out-of-range ratio simply trips early or never;
    /// nothing panics.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] whose message names the setting, e.g.
    /// `breaker failure ratio must be in (0, 1], got 1.5`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use breakwater_cache::BreakerConfig;
    ///
    /// let err = BreakerConfig::new()
    ///     .failure_ratio(1.5, Duration::from_secs(10), 20)
    ///     .validate()
    ///     .unwrap_err();
    /// assert_eq!(err.message(), "breaker failure ratio must be in (0, 1], got 1.5");
    /// ```
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.failure_threshold == 0 {
            return Err(
                ConfigError::new("breaker failure threshold must be at least 1")
                    .for_key("consecutive_failures"),
            );
        }
        if let Some(RatioRule {
            ratio,
            window,
            min_calls,
        }) = self.failure_ratio
        {
            if !(ratio > 0.0 && ratio <= 1.0) {
                return Err(ConfigError::new(format!(
                    "breaker failure ratio must be in (0, 1], got {ratio}"
                ))
                .for_key("failure_ratio.ratio"));
            }
            if window.is_zero() {
                return Err(
                    ConfigError::new("breaker failure window must be greater than zero")
                        .for_key("failure_ratio.window"),
                );
            }
            ConfigError::at_most(
                "breaker failure window",
                window,
                MAX_WAIT,
                "use seconds to minutes, e.g. 30s",
            )
            .for_key("failure_ratio.window")?;
            if min_calls == 0 {
                return Err(ConfigError::new("breaker min calls must be at least 1")
                    .for_key("failure_ratio.min_calls"));
            }
        }
        if to_ms(self.cool_down) == 0 {
            return Err(
                ConfigError::new("breaker cool-down must be greater than zero")
                    .for_key("cool_down"),
            );
        }
        ConfigError::at_most(
            "breaker cool-down",
            self.cool_down,
            MAX_WAIT,
            "use seconds to minutes (the default is 5s)",
        )
        .for_key("cool_down")?;
        if self.half_open_probes > MAX_PROBES {
            return Err(ConfigError::new(format!(
                "breaker half-open probes must be at most {MAX_PROBES}, got {}; a few probes \
                 tell whether the origin is back",
                self.half_open_probes
            ))
            .for_key("half_open_probes"));
        }
        self.cool_down_jitter
            .validate()
            .within("cool_down_jitter")?;
        if self.half_open_probes == 0 {
            return Err(
                ConfigError::new("breaker half-open probes must be at least 1")
                    .for_key("half_open_probes"),
            );
        }
        Ok(())
    }
}

/// Where a circuit breaker stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerState {
    /// Loads run; failures are being counted.
    Closed,
    /// Loads are refused until the cool-down has passed.
    Open,
    /// The cool-down has passed; a few probe loads decide whether to close.
    HalfOpen,
}

impl BreakerState {
    /// The `breakwater_breaker_state` gauge's value: 0 closed, 1 half-open,
    /// 2 open.
    pub(crate) fn gauge(self) -> f64 {
        match self {
            BreakerState::Closed => 0.0,
            BreakerState::HalfOpen => 1.0,
            BreakerState::Open => 2.0,
        }
    }
}

impl fmt::Display for BreakerState {
    /// `closed`, `open` or `half-open`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half-open",
        })
    }
}

/// The failure-ratio rule: over the last `window`, at least `min_calls`
/// finished and at least `ratio` of them failed.
#[derive(Clone, Copy, Debug, PartialEq)]
struct RatioRule {
    ratio: f64,
    window: Duration,
    min_calls: u32,
}

/// The breaker refused a load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rejected {
    /// How long until the breaker lets a probe through. Zero when it is
    /// half-open and every probe slot is taken: the probes in flight decide.
    pub(crate) retry_in: Duration,
}

impl Rejected {
    /// What the refusal means for whatever the breaker guards: `subject`
    /// failed repeatedly, so its `calls` (one of them: a `call`) wait.
    pub(crate) fn describe(self, subject: &str, calls: &str, call: &str) -> String {
        if self.retry_in.is_zero() {
            format!(
                "{subject} failed repeatedly and a probe {call} is testing it; try again shortly"
            )
        } else {
            format!(
                "{subject} failed repeatedly; {calls} resume in about {}ms",
                to_ms(self.retry_in)
            )
        }
    }
}

impl From<Rejected> for Error {
    fn from(rejected: Rejected) -> Self {
        Error::new(
            ErrorKind::CircuitOpen,
            rejected.describe("the loader", "loads", "load"),
        )
        .with_retry_after(rejected.retry_in)
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct WindowBucket {
    epoch: u64,
    calls: u64,
    failures: u64,
}

/// Calls and failures over a sliding window, in [`BUCKETS`] buckets.
#[derive(Debug)]
struct Window {
    origin: Instant,
    width_ns: u64,
    buckets: [WindowBucket; BUCKETS as usize],
}

impl Window {
    fn new(window: Duration, origin: Instant) -> Self {
        let width_ns = u64::try_from(window.as_nanos() / u128::from(BUCKETS)).unwrap_or(u64::MAX);
        Window {
            origin,
            width_ns: width_ns.max(1),
            buckets: [WindowBucket::default(); BUCKETS as usize],
        }
    }

    fn epoch(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.origin).as_nanos();
        u64::try_from(elapsed / u128::from(self.width_ns)).unwrap_or(u64::MAX)
    }

    fn record(&mut self, now: Instant, failed: bool) {
        let epoch = self.epoch(now);
        // `epoch % BUCKETS` is below BUCKETS, so it indexes the array.
        let slot = usize::try_from(epoch % BUCKETS).unwrap_or(0);
        let Some(bucket) = self.buckets.get_mut(slot) else {
            return;
        };
        if bucket.epoch != epoch {
            *bucket = WindowBucket {
                epoch,
                ..WindowBucket::default()
            };
        }
        bucket.calls = bucket.calls.saturating_add(1);
        if failed {
            bucket.failures = bucket.failures.saturating_add(1);
        }
    }

    /// `(calls, failures)` in the window ending at `now`.
    fn totals(&self, now: Instant) -> (u64, u64) {
        let epoch = self.epoch(now);
        self.buckets
            .iter()
            .filter(|b| epoch.saturating_sub(b.epoch) < BUCKETS)
            .fold((0, 0), |(calls, failures), b| {
                (
                    calls.saturating_add(b.calls),
                    failures.saturating_add(b.failures),
                )
            })
    }

    fn clear(&mut self) {
        self.buckets = [WindowBucket::default(); BUCKETS as usize];
    }
}

#[derive(Clone, Copy, Debug)]
enum Phase {
    Closed,
    Open { until: Instant },
    HalfOpen { probes: u32 },
}

#[derive(Debug)]
struct BreakerCore {
    phase: Phase,
    /// Bumped on every transition; a permit's verdict counts only if the
    /// breaker has not moved on since the permit was granted.
    generation: u64,
    consecutive: u32,
    /// Recent outcomes, kept only for the ratio rule.
    window: Option<Window>,
    rng: StdRng,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Success,
    Failure,
    Cancelled,
}

/// A circuit breaker: asks [`try_acquire`](Self::try_acquire) before each
/// load and reports the load's outcome on the permit.
///
/// Verdicts are judged against the state the permit was granted in: a load
/// that started while closed and fails after the breaker opened (or a probe
/// that finishes after another probe already decided) changes nothing.
#[derive(Debug)]
pub(crate) struct CircuitBreaker {
    config: BreakerConfig,
    inner: Mutex<BreakerCore>,
    /// The generation while nothing needs the lock: closed, no failure
    /// counted, no ratio window to record into; [`SLOW`] otherwise. Written
    /// under the lock after every change, read without it: a healthy
    /// breaker grants permits and takes successes with one atomic load.
    quick: AtomicU64,
    /// What the breaker guards, for its logs and metrics.
    label: BreakerLabel,
    /// Times it opened.
    openings: AtomicU64,
}

/// What a breaker guards: an origin (by name) or one failure domain of a
/// cache's store (by the cache's namespace and the domain's index). Its
/// log lines and its `breakwater_breaker_state` gauge say which.
#[derive(Debug, Clone)]
pub(crate) struct BreakerLabel {
    kind: &'static str,
    name: SharedString,
    domain: Option<usize>,
}

impl BreakerLabel {
    /// The breaker of the origin `name`.
    pub(crate) fn origin(name: &str) -> Self {
        BreakerLabel {
            kind: "origin",
            name: SharedString::from(Arc::<str>::from(name)),
            domain: None,
        }
    }

    /// The breaker of failure domain `domain` of cache `namespace`'s store.
    pub(crate) fn store(namespace: &str, domain: usize) -> Self {
        BreakerLabel {
            kind: "store",
            name: SharedString::from(Arc::<str>::from(namespace)),
            domain: Some(domain),
        }
    }

    /// The labels of this breaker's series: `breaker`, `name`, and
    /// `domain` for a store's breaker only (no empty label values).
    fn labels(&self) -> Vec<Label> {
        let mut labels = vec![
            Label::new("breaker", self.kind),
            Label::new("name", self.name.clone()),
        ];
        if let Some(domain) = self.domain {
            labels.push(Label::new("domain", domain.to_string()));
        }
        labels
    }

    /// The state gauge, set to `state`.
    fn gauge(&self, state: BreakerState) {
        metrics::gauge!("breakwater_breaker_state", self.labels()).set(state.gauge());
    }

    /// The transitions counter to `to`.
    fn transitions(&self, to: BreakerState) -> metrics::Counter {
        let to = match to {
            BreakerState::Closed => "closed",
            BreakerState::HalfOpen => "half_open",
            BreakerState::Open => "open",
        };
        let mut labels = self.labels();
        labels.push(Label::new("to", to));
        metrics::counter!("breakwater_breaker_transitions_total", labels)
    }

    /// The series of a breaker just built: the state gauge (closed) and
    /// the transitions counters at 0, so a healthy breaker's dashboard
    /// panels show 0 rather than no data.
    fn register(&self) {
        self.gauge(BreakerState::Closed);
        for to in [
            BreakerState::Open,
            BreakerState::HalfOpen,
            BreakerState::Closed,
        ] {
            self.transitions(to).increment(0);
        }
    }

    /// Records a change to `to`: the state gauge, the transitions counter.
    fn record(&self, to: BreakerState) {
        self.gauge(to);
        self.transitions(to).increment(1);
    }
}

/// [`CircuitBreaker::quick`] when a permit or a verdict needs the lock.
const SLOW: u64 = u64::MAX;

impl CircuitBreaker {
    /// A closed breaker. `rng_seed` seeds the cool-down jitter (from the OS
    /// when `None`).
    pub(crate) fn new(config: BreakerConfig, rng_seed: Option<u64>) -> Self {
        let rng = match rng_seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => rand::make_rng(),
        };
        let quick = if config.failure_ratio.is_none() {
            0
        } else {
            SLOW
        };
        CircuitBreaker {
            config,
            quick: AtomicU64::new(quick),
            label: BreakerLabel::origin(""),
            openings: AtomicU64::new(0),
            inner: Mutex::new(BreakerCore {
                phase: Phase::Closed,
                generation: 0,
                consecutive: 0,
                window: config
                    .failure_ratio
                    .map(|rule| Window::new(rule.window, Instant::now())),
                rng,
            }),
        }
    }

    /// Times the breaker opened (a failed half-open probe opens it again).
    pub(crate) fn openings(&self) -> u64 {
        self.openings.load(Ordering::Relaxed)
    }

    /// Names what the breaker guards (for its logs and metrics).
    /// Its series are registered here (the state gauge closed, the
    /// transitions at 0), so a healthy breaker has them before it first
    /// trips.
    pub(crate) fn labelled(mut self, label: BreakerLabel) -> Self {
        label.register();
        self.label = label;
        self
    }

    /// The current state; an open breaker whose cool-down has passed reports
    /// (and becomes) half-open.
    pub(crate) fn state(&self) -> BreakerState {
        let now = Instant::now();
        let mut inner = self.lock();
        self.refresh(&mut inner, now);
        match inner.phase {
            Phase::Closed => BreakerState::Closed,
            Phase::Open { .. } => BreakerState::Open,
            Phase::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// Ask to run one load. Closed → permit; Open → `Err(Rejected { retry_in })`;
    /// HalfOpen → a probe permit while fewer than `half_open_probes` probes
    /// are in flight, else `Rejected` with a zero `retry_in`.
    pub(crate) fn try_acquire(&self) -> Result<BreakerPermit<'_>, Rejected> {
        let quick = self.quick.load(Ordering::Acquire);
        if quick != SLOW {
            return Ok(BreakerPermit {
                breaker: self,
                probe: false,
                generation: quick,
                settled: false,
            });
        }
        let mut inner = self.lock();
        let probe = self.admit(&mut inner, true)?;
        Ok(BreakerPermit {
            breaker: self,
            probe,
            generation: inner.generation,
            settled: false,
        })
    }

    /// What [`try_acquire`](Self::try_acquire) would answer now, without
    /// taking a permit (or a probe slot): for failing fast before work that
    /// will ask for a permit later.
    pub(crate) fn admits(&self) -> Result<(), Rejected> {
        if self.quick.load(Ordering::Acquire) != SLOW {
            return Ok(());
        }
        self.admit(&mut self.lock(), false).map(drop)
    }

    /// The admission decision; `Ok(true)` for a half-open probe, whose slot
    /// is taken only if `take_probe`.
    fn admit(&self, inner: &mut BreakerCore, take_probe: bool) -> Result<bool, Rejected> {
        let now = Instant::now();
        self.refresh(inner, now);
        let max_probes = self.config.half_open_probes.max(1);
        match &mut inner.phase {
            Phase::Closed => Ok(false),
            Phase::Open { until } => Err(Rejected {
                retry_in: until.saturating_duration_since(now),
            }),
            Phase::HalfOpen { probes } if *probes < max_probes => {
                if take_probe {
                    *probes += 1;
                }
                Ok(true)
            }
            Phase::HalfOpen { .. } => Err(Rejected {
                retry_in: Duration::ZERO,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, BreakerCore> {
        // Every critical section is a few assignments with no panics:
        // poisoning cannot leave it half-done.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Turns Open into HalfOpen once the cool-down has passed.
    fn refresh(&self, inner: &mut BreakerCore, now: Instant) {
        if let Phase::Open { until } = inner.phase
            && now >= until
        {
            inner.phase = Phase::HalfOpen { probes: 0 };
            inner.generation = inner.generation.wrapping_add(1);
            let l = &self.label;
            match l.domain {
                None => tracing::info!(
                    origin = %l.name,
                    "origin circuit breaker half-open; letting a probe load through"
                ),
                Some(domain) => tracing::info!(
                    namespace = %l.name,
                    domain,
                    "store circuit breaker half-open; letting a probe call through"
                ),
            }
            l.record(BreakerState::HalfOpen);
        }
    }

    fn open(&self, inner: &mut BreakerCore, now: Instant, reason: &'static str) {
        let cool_down = self
            .config
            .cool_down_jitter
            .apply(self.config.cool_down, &mut inner.rng);
        let until = now
            .checked_add(cool_down)
            .or_else(|| now.checked_add(FAR_FUTURE))
            .unwrap_or(now);
        inner.phase = Phase::Open { until };
        inner.generation = inner.generation.wrapping_add(1);
        self.openings.fetch_add(1, Ordering::Relaxed);
        let l = &self.label;
        match l.domain {
            None => tracing::warn!(
                origin = %l.name,
                reason,
                ?cool_down,
                "origin circuit breaker opened; loads from it are refused (stale values are served where there are any)"
            ),
            Some(domain) => tracing::warn!(
                namespace = %l.name,
                domain,
                reason,
                ?cool_down,
                "store circuit breaker opened; store calls fail fast until a probe succeeds (L1 copies stand in for reads; a value that must load is loaded in this process and not written)"
            ),
        }
        l.record(BreakerState::Open);
    }

    fn close(&self, inner: &mut BreakerCore) {
        inner.phase = Phase::Closed;
        inner.generation = inner.generation.wrapping_add(1);
        inner.consecutive = 0;
        if let Some(window) = &mut inner.window {
            window.clear();
        }
        let l = &self.label;
        match l.domain {
            None => tracing::info!(origin = %l.name, "origin circuit breaker closed; loads resume"),
            Some(domain) => tracing::info!(
                namespace = %l.name,
                domain,
                "store circuit breaker closed; store calls resume"
            ),
        }
        l.record(BreakerState::Closed);
    }

    fn settle(&self, probe: bool, generation: u64, verdict: Verdict) {
        // A success (or a cancellation) while closed with nothing counted
        // changes nothing.
        if !probe && verdict != Verdict::Failure && self.quick.load(Ordering::Acquire) == generation
        {
            return;
        }
        let now = Instant::now();
        let mut inner = self.lock();
        self.settle_locked(&mut inner, now, probe, generation, verdict);
        self.requick(&inner);
    }

    /// A failure seen without a permit: a call whose caller gave up on it
    /// (its permit dropped, so counted as neither) once it was overdue.
    /// Counts as a failed call; while half-open, as a failed probe (the
    /// probe went unanswered), so the breaker opens again.
    pub(crate) fn failure_seen(&self, reason: &'static str) {
        let now = Instant::now();
        let mut inner = self.lock();
        self.refresh(&mut inner, now);
        match inner.phase {
            Phase::Open { .. } => {}
            Phase::HalfOpen { .. } => self.open(&mut inner, now, reason),
            Phase::Closed => {
                let generation = inner.generation;
                self.settle_locked(&mut inner, now, false, generation, Verdict::Failure);
            }
        }
        self.requick(&inner);
    }

    /// Keeps [`quick`](Self::quick) in step with `inner`.
    fn requick(&self, inner: &BreakerCore) {
        let quick = match inner.phase {
            Phase::Closed if inner.consecutive == 0 && inner.window.is_none() => inner.generation,
            _ => SLOW,
        };
        self.quick.store(quick, Ordering::Release);
    }

    fn settle_locked(
        &self,
        inner: &mut BreakerCore,
        now: Instant,
        probe: bool,
        generation: u64,
        verdict: Verdict,
    ) {
        if inner.generation != generation {
            return;
        }
        if probe {
            if let Phase::HalfOpen { probes } = &mut inner.phase {
                *probes = probes.saturating_sub(1);
            }
            match verdict {
                Verdict::Success => self.close(inner),
                Verdict::Failure => self.open(inner, now, "a probe load failed"),
                Verdict::Cancelled => {}
            }
            return;
        }
        match verdict {
            Verdict::Success => {
                inner.consecutive = 0;
                self.record(inner, now, false);
            }
            Verdict::Failure => {
                inner.consecutive = inner.consecutive.saturating_add(1);
                self.record(inner, now, true);
                if inner.consecutive >= self.config.failure_threshold.max(1) {
                    self.open(inner, now, "consecutive failures");
                } else if self.ratio_tripped(inner, now) {
                    self.open(inner, now, "failure ratio");
                }
            }
            Verdict::Cancelled => {}
        }
    }

    /// Counts an outcome for the ratio rule, if it is on.
    fn record(&self, inner: &mut BreakerCore, now: Instant, failed: bool) {
        if let Some(window) = &mut inner.window {
            window.record(now, failed);
        }
    }

    fn ratio_tripped(&self, inner: &BreakerCore, now: Instant) -> bool {
        let (Some(rule), Some(window)) = (self.config.failure_ratio, &inner.window) else {
            return false;
        };
        let (calls, failures) = window.totals(now);
        calls > 0
            && calls >= u64::from(rule.min_calls.max(1))
            && failures as f64 / calls as f64 >= rule.ratio
    }
}

/// Leave to run one load. Report the outcome with [`success`](Self::success)
/// or [`failure`](Self::failure); dropping it without a verdict (a cancelled
/// load) counts as neither, but frees its probe slot.
#[derive(Debug)]
pub(crate) struct BreakerPermit<'a> {
    breaker: &'a CircuitBreaker,
    probe: bool,
    generation: u64,
    settled: bool,
}

impl BreakerPermit<'_> {
    /// The load succeeded: resets the failure count, or closes a half-open
    /// breaker.
    pub(crate) fn success(mut self) {
        self.settle(Verdict::Success);
    }

    /// The load failed: counts towards opening, or re-opens a half-open
    /// breaker with a fresh cool-down.
    pub(crate) fn failure(mut self) {
        self.settle(Verdict::Failure);
    }

    fn settle(&mut self, verdict: Verdict) {
        if !self.settled {
            self.settled = true;
            self.breaker.settle(self.probe, self.generation, verdict);
        }
    }
}

impl Drop for BreakerPermit<'_> {
    fn drop(&mut self) {
        self.settle(Verdict::Cancelled);
    }
}

#[cfg(test)]
mod tests;

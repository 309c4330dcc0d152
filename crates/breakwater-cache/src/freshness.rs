//! Freshness, so a hot key is refreshed before it expires (no stampede at
//! the deadline) and a stale value is served only within the windows the
//! settings allow: is a stored value fresh, due for an early refresh,
//! stale or expired?
//!
//! # Soft and hard TTL
//!
//! Every entry carries two deadlines:
//!
//! * `fresh_until`, the **soft TTL**: the end of the *fresh window*. Before it
//!   the value is served as is.
//! * `stale_until`, the **hard TTL**: the end of the stale window,
//!   `fresh_until + max_stale`. The store's physical TTL (`PX`) ends here
//!   too, so the store itself drops the value whatever any client believes.
//!
//! Between the two the value is *stale*: not fresh any more, but still
//! servable. For the first `grace` of that window (grace ≤ max_stale) it is
//! served at once while exactly one refresh runs in the background
//! (**stale-while-revalidate**); for the rest it is only a fail-safe, served
//! when a load fails, times out or cannot get the lease. An optional
//! `max_stale` here bounds how long after `fresh_until` a stale value may be
//! served, even if the entry says longer. Past it the value is expired and
//! must not be served.
//!
//! # Early refresh
//!
//! Grace hides the refresh from users, but the first read after `fresh_until`
//! still sees a stale value. [`EarlyRefresh`] refreshes a hot key *before* it
//! stops being fresh:
//!
//! * [`EarlyRefresh::xfetch`] (the default, β = 1): XFetch, "optimal
//!   probabilistic cache stampede prevention" (Vattani, Chierichetti,
//!   Lowenstein, VLDB 2015). Each read draws `U` uniform in `(0, 1]` and starts
//!   a refresh when `δ·β·(−ln U) ≥ remaining`, where `δ` is how long the last
//!   load took and `remaining` the fresh time left. A read refreshes with
//!   probability `exp(−remaining / (δβ))`: negligible long before expiry,
//!   `1/e` at `δβ` before it, 1 at expiry. So the refresh happens on the order
//!   of `δβ` before expiry, about the time the load needs, and a hot key is
//!   refreshed before it expires; no coordination between processes is
//!   needed, and a rarely read key is not refreshed for nothing. The more reads
//!   per `δβ`, the earlier the first trigger: with `n` reads per `δβ` the
//!   refresh starts on average about `δβ·(ln n + 0.58)` before expiry (about
//!   290 ms for δ = 100 ms, β = 1 and a read every 10 ms). `β > 1` refreshes
//!   earlier.
//! * [`EarlyRefresh::after_fraction`]: the deterministic alternative
//!   (FusionCache's "eager refresh"): refresh on the first read after a fixed
//!   fraction of the configured fresh TTL has passed.
//! * [`EarlyRefresh::none`]: only refresh once the value is stale.
//!
//! Early refresh only *starts* a refresh; single-flight and the lease still
//! make it one load per key.
//!
//! # Clocks
//!
//! All times are milliseconds on the **store's** clock: the deadlines were
//! stamped with it, and `now` is the store's time as the caller knows it (for
//! Redis, sampled from `TIME`). No verdict compares the clocks of different
//! application machines, so application clock skew cannot change one.
//!
//! Nothing here panics: deadlines are `u64`s with saturating arithmetic, and
//! invalid parameters (a NaN β, a fraction of 1.5, ...) are reported by
//! [`EarlyRefresh::validate`]; used without validation they are clamped.

use std::time::Duration;

use rand::{Rng, RngExt};

use crate::clock::millis as to_ms;
use crate::error::ConfigError;

/// The β actually used: NaN and anything not above zero become 0 (no early
/// refresh), `+∞` stays (always refresh).
fn clamp_beta(beta: f64) -> f64 {
    if beta.is_nan() { 0.0 } else { beta.max(0.0) }
}

/// The fraction actually used: NaN becomes 1 (no early refresh), anything
/// else is clamped to `[0, 1]`.
fn clamp_fraction(fraction: f64) -> f64 {
    if fraction.is_nan() {
        1.0
    } else {
        fraction.clamp(0.0, 1.0)
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum EarlyKind {
    None,
    XFetch(f64),
    Fraction(f64),
}

/// The largest XFetch β accepted: past it nearly every read of a key
/// whose load takes any time would refresh it.
const MAX_BETA: f64 = 100.0;

/// Probabilistic or deterministic refresh before a value stops being fresh.
///
/// The default is [`EarlyRefresh::xfetch`] with β = 1.
///
/// # Examples
///
/// ```
/// use breakwater_cache::EarlyRefresh;
///
/// assert_eq!(EarlyRefresh::default(), EarlyRefresh::xfetch(1.0));
/// assert!(EarlyRefresh::after_fraction(0.8).validate().is_ok());
/// assert!(EarlyRefresh::none().validate().is_ok());
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EarlyRefresh {
    kind: EarlyKind,
}

impl EarlyRefresh {
    /// No early refresh: a value is refreshed only once it is stale.
    pub fn none() -> Self {
        EarlyRefresh {
            kind: EarlyKind::None,
        }
    }

    /// XFetch (Vattani, Chierichetti, Lowenstein, VLDB 2015): refresh when
    /// `δ·β·(−ln U) ≥ remaining fresh time`, with `δ` the last load's duration
    /// (ms) and `U` uniform in `(0, 1]`. A read refreshes with probability
    /// `exp(−remaining / (δβ))`; β > 1 favours earlier refresh. The default
    /// is β = 1. With δ = 0 (an instant load) it never refreshes early. β must
    /// be finite, greater than zero and at most 100.
    pub fn xfetch(beta: f64) -> Self {
        EarlyRefresh {
            kind: EarlyKind::XFetch(beta),
        }
    }

    /// Deterministic early refresh (FusionCache's "eager refresh"): refresh
    /// once `fraction` of the fresh window has passed, i.e. when
    /// `remaining ≤ (1 − fraction)·ttl` (rounded to whole ms), with `ttl` the
    /// configured, unjittered fresh TTL. `fraction` must be in `0..1`
    /// (exclusive at both ends).
    pub fn after_fraction(fraction: f64) -> Self {
        EarlyRefresh {
            kind: EarlyKind::Fraction(fraction),
        }
    }

    /// Checks the parameters: β must be finite, greater than zero and at
    /// most 100, a fraction strictly between 0 and 1 (NaN is rejected by
    /// both).
    ///
    /// # Examples
    ///
    /// ```
    /// use breakwater_cache::EarlyRefresh;
    ///
    /// let err = EarlyRefresh::xfetch(f64::NAN).validate().unwrap_err();
    /// assert_eq!(err.message(), "xfetch beta must be a finite number greater than zero, got NaN");
    /// let err = EarlyRefresh::after_fraction(1.5).validate().unwrap_err();
    /// assert_eq!(err.message(), "early refresh fraction must be in 0..1, got 1.5");
    /// ```
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self.kind {
            EarlyKind::None => Ok(()),
            EarlyKind::XFetch(beta) => {
                if !(beta.is_finite() && beta > 0.0) {
                    Err(ConfigError::new(format!(
                        "xfetch beta must be a finite number greater than zero, got {beta}"
                    ))
                    .for_key("xfetch"))
                } else if beta > MAX_BETA {
                    Err(ConfigError::new(format!(
                        "xfetch beta must be at most {MAX_BETA}, got {beta}; use 1 (the default) \
                         or a little more for earlier refreshes"
                    ))
                    .for_key("xfetch"))
                } else {
                    Ok(())
                }
            }
            EarlyKind::Fraction(f) => {
                if f > 0.0 && f < 1.0 {
                    Ok(())
                } else {
                    Err(ConfigError::new(format!(
                        "early refresh fraction must be in 0..1, got {f}"
                    ))
                    .for_key("after_fraction"))
                }
            }
        }
    }
}

impl Default for EarlyRefresh {
    /// [`EarlyRefresh::xfetch`] with β = 1.
    fn default() -> Self {
        EarlyRefresh::xfetch(1.0)
    }
}

/// The verdict for one read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Freshness {
    /// Serve it.
    Fresh,
    /// Serve it, and start one background refresh.
    RefreshEarly,
    /// Past fresh, inside `stale_until` and `max_stale`: servable, while one
    /// refresh runs (inside grace, which the caller judges) or as a
    /// fail-safe when a load fails.
    Stale,
    /// Past `stale_until` or past `max_stale`: must not be served.
    Expired,
}

/// The inputs a verdict needs, all in store-clock ms.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reading {
    /// The store's current time.
    pub(crate) now_ms: u64,
    /// End of the fresh window (soft TTL).
    pub(crate) fresh_until: u64,
    /// End of the stale window (hard TTL; the physical TTL ends here).
    pub(crate) stale_until: u64,
    /// How long the load that produced the value took (XFetch's δ).
    pub(crate) load_ms: u32,
}

/// How reads of one cache's entries are judged.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct FreshnessPolicy {
    /// When to refresh before the value stops being fresh.
    pub(crate) early: EarlyRefresh,
    /// The configured (unjittered) fresh TTL, for [`EarlyRefresh::after_fraction`].
    pub(crate) ttl: Duration,
    /// The longest a value may be served after `fresh_until`; `None` leaves
    /// grace (`stale_until`) as the only bound.
    pub(crate) max_stale: Option<Duration>,
}

impl FreshnessPolicy {
    /// The verdict for one read.
    ///
    /// `now < fresh_until` gives [`Freshness::Fresh`], or
    /// [`Freshness::RefreshEarly`] when the early policy says so; past
    /// `fresh_until` a [servable](Self::servable_stale) value is
    /// [`Freshness::Stale`], anything else [`Freshness::Expired`]. `stale_until`
    /// is the hard bound: a (malformed) entry with `fresh_until > stale_until`
    /// is expired from `stale_until` on.
    pub(crate) fn judge<R: Rng + ?Sized>(&self, r: Reading, rng: &mut R) -> Freshness {
        let fresh_until = r.fresh_until.min(r.stale_until);
        if r.now_ms < fresh_until {
            if self.refresh_early(fresh_until - r.now_ms, r.load_ms, rng) {
                Freshness::RefreshEarly
            } else {
                Freshness::Fresh
            }
        } else if self.servable_stale(r) {
            Freshness::Stale
        } else {
            Freshness::Expired
        }
    }

    /// `false` if [`judge`](Self::judge) cannot answer
    /// [`RefreshEarly`](Freshness::RefreshEarly) for this reading, whatever
    /// it draws; a cheap test for the L1 hit path, which then skips the
    /// draw. (`−ln U` for `U` in `(0, 1]` drawn from 53 random bits is at
    /// most about 36.7.)
    ///
    /// `remaining_ms` is the fresh time left (above zero: a value at or past
    /// its end is not fresh). For the fixed-fraction policy the answer is
    /// exact.
    pub(crate) fn could_refresh_early(&self, remaining_ms: u64, load_ms: u32) -> bool {
        match self.early.kind {
            EarlyKind::None => false,
            // In whole milliseconds, as `early_window_ms` says it: compared
            // as floats, a window past 2^53 ms took `w + 1` for `w`.
            EarlyKind::XFetch(_) => self
                .early_window_ms(load_ms)
                .is_some_and(|window| remaining_ms <= window),
            EarlyKind::Fraction(fraction) => self.fraction_due(fraction, remaining_ms),
        }
    }

    /// The fresh time left at or below which [`judge`](Self::judge) could
    /// answer [`RefreshEarly`](Freshness::RefreshEarly), in whole
    /// milliseconds (`None`: never): `could_refresh_early(r, load_ms)` is
    /// `early_window_ms(load_ms).is_some_and(|w| r <= w)`. Computed once
    /// per L1 entry, so a hit far from its end is judged by comparing two
    /// instants.
    pub(crate) fn early_window_ms(&self, load_ms: u32) -> Option<u64> {
        match self.early.kind {
            EarlyKind::None => None,
            EarlyKind::XFetch(beta) => {
                let span = f64::from(load_ms) * clamp_beta(beta);
                // `as` saturates; the product is never negative or NaN.
                Some((span * 37.0) as u64)
            }
            EarlyKind::Fraction(fraction) => {
                let left = ((1.0 - clamp_fraction(fraction)) * to_ms(self.ttl) as f64).round();
                Some(left as u64)
            }
        }
    }

    /// True if a stale value may still be served at `now_ms`: `now <
    /// stale_until`, and `now < fresh_until + max_stale` when `max_stale` is
    /// set.
    pub(crate) fn servable_stale(&self, r: Reading) -> bool {
        let within_max_stale = self
            .max_stale
            .is_none_or(|max| r.now_ms < r.fresh_until.saturating_add(to_ms(max)));
        r.now_ms < r.stale_until && within_max_stale
    }

    /// The XFetch probability of refreshing at a given remaining time:
    /// `exp(−remaining/(δβ))`; 1.0 when `remaining_ms = 0`, 0 when δ = 0 (or
    /// the clamped β is 0) and `remaining_ms > 0`. The tests hold `judge` to
    /// it.
    #[cfg(test)]
    pub(crate) fn xfetch_probability(delta_ms: u32, beta: f64, remaining_ms: u64) -> f64 {
        if remaining_ms == 0 {
            return 1.0;
        }
        let beta = clamp_beta(beta);
        if delta_ms == 0 || beta == 0.0 {
            return 0.0;
        }
        (-(remaining_ms as f64) / (f64::from(delta_ms) * beta)).exp()
    }

    /// Whether a read with `remaining_ms` of fresh time left starts an early
    /// refresh. Draws from `rng` only for XFetch.
    fn refresh_early<R: Rng + ?Sized>(&self, remaining_ms: u64, load_ms: u32, rng: &mut R) -> bool {
        match self.early.kind {
            EarlyKind::None => false,
            EarlyKind::XFetch(beta) => {
                let beta = clamp_beta(beta);
                if load_ms == 0 || beta == 0.0 {
                    return remaining_ms == 0;
                }
                // `random::<f64>()` is in [0, 1), so U is in (0, 1] and ln U finite.
                let u = 1.0 - rng.random::<f64>();
                // δ·β·(−ln U) ≥ remaining, divided through by δβ > 0 (which may
                // be +∞ for β = +∞: the threshold is then 0, always refresh).
                let threshold = remaining_ms as f64 / (f64::from(load_ms) * beta);
                -u.ln() >= threshold
            }
            EarlyKind::Fraction(fraction) => self.fraction_due(fraction, remaining_ms),
        }
    }

    /// The fixed-fraction verdict: `fraction` of the configured TTL has
    /// passed.
    fn fraction_due(&self, fraction: f64, remaining_ms: u64) -> bool {
        // Rounded so 0.8 of 10 s is exactly 2000 ms, not 1999.99...
        let left = ((1.0 - clamp_fraction(fraction)) * to_ms(self.ttl) as f64).round();
        // `as` saturates; `left` is never negative or NaN.
        remaining_ms <= left as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    const DRAWS: usize = 100_000;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn ms(m: u64) -> Duration {
        Duration::from_millis(m)
    }

    fn rng(seed: u64) -> StdRng {
        StdRng::seed_from_u64(seed)
    }

    fn policy(early: EarlyRefresh, ttl: Duration, max_stale: Option<Duration>) -> FreshnessPolicy {
        FreshnessPolicy {
            early,
            ttl,
            max_stale,
        }
    }

    fn reading(now_ms: u64, fresh_until: u64, stale_until: u64, load_ms: u32) -> Reading {
        Reading {
            now_ms,
            fresh_until,
            stale_until,
            load_ms,
        }
    }

    /// Asserts `measured` is within 3σ of `expected` over `DRAWS` draws.
    fn assert_within_3_sigma(measured: f64, expected: f64, what: &str) {
        let sigma = (expected * (1.0 - expected) / DRAWS as f64)
            .sqrt()
            .max(1e-4);
        println!(
            "{what}: measured {measured:.5}, expected {expected:.5}, 3σ {:.5}",
            3.0 * sigma
        );
        assert!(
            (measured - expected).abs() <= 3.0 * sigma,
            "{what}: measured {measured}, expected {expected} ± {}",
            3.0 * sigma
        );
    }

    #[test]
    fn xfetch_matches_its_probability() {
        let p = policy(EarlyRefresh::xfetch(1.0), secs(10), None);
        let fresh_until = 1_000_000;
        let mut rng = rng(2015);
        for remaining in [0u64, 10, 50, 100, 200, 400] {
            let expected = FreshnessPolicy::xfetch_probability(100, 1.0, remaining);
            // The decision itself, at every remaining time including 0.
            let hits = (0..DRAWS)
                .filter(|_| p.refresh_early(remaining, 100, &mut rng))
                .count();
            let what = format!("decision, remaining {remaining} ms");
            assert_within_3_sigma(hits as f64 / DRAWS as f64, expected, &what);
            if remaining == 0 {
                // now == fresh_until is no longer fresh: the verdict is Stale.
                let r = reading(fresh_until, fresh_until, fresh_until + 60_000, 100);
                assert_eq!(p.judge(r, &mut rng), Freshness::Stale);
                continue;
            }
            // The full verdict.
            let r = reading(
                fresh_until - remaining,
                fresh_until,
                fresh_until + 60_000,
                100,
            );
            let mut early = 0;
            for _ in 0..DRAWS {
                match p.judge(r, &mut rng) {
                    Freshness::RefreshEarly => early += 1,
                    Freshness::Fresh => {}
                    other => panic!("unexpected verdict {other:?}"),
                }
            }
            let what = format!("judge, remaining {remaining} ms");
            assert_within_3_sigma(early as f64 / DRAWS as f64, expected, &what);
        }
    }

    #[test]
    fn xfetch_probability_values() {
        assert_eq!(FreshnessPolicy::xfetch_probability(100, 1.0, 0), 1.0);
        assert_eq!(FreshnessPolicy::xfetch_probability(0, 1.0, 0), 1.0);
        assert_eq!(FreshnessPolicy::xfetch_probability(0, 1.0, 1), 0.0);
        assert_eq!(FreshnessPolicy::xfetch_probability(100, f64::NAN, 1), 0.0);
        assert_eq!(FreshnessPolicy::xfetch_probability(100, -1.0, 1), 0.0);
        assert_eq!(
            FreshnessPolicy::xfetch_probability(100, f64::INFINITY, 1),
            1.0
        );
        let p = FreshnessPolicy::xfetch_probability(100, 1.0, 100);
        assert!((p - (-1.0f64).exp()).abs() < 1e-12);
        let p = FreshnessPolicy::xfetch_probability(100, 2.0, 100);
        assert!((p - (-0.5f64).exp()).abs() < 1e-12);
    }

    #[test]
    fn xfetch_with_instant_loads_never_refreshes_early() {
        let p = policy(EarlyRefresh::xfetch(1.0), secs(10), None);
        let mut rng = rng(1);
        for remaining in [1u64, 2, 10, 1_000] {
            let r = reading(10_000 - remaining, 10_000, 20_000, 0);
            for _ in 0..1_000 {
                assert_eq!(p.judge(r, &mut rng), Freshness::Fresh);
            }
        }
    }

    /// A key with a 10 s fresh TTL whose load takes 100 ms, read every 10 ms
    /// of store time: XFetch should refresh it before it stops being fresh.
    #[test]
    fn steady_load_refreshes_before_expiry() {
        const CYCLES: u64 = 1_000;
        const READ_EVERY_MS: u64 = 10;
        const LOAD_MS: u32 = 100;
        let p = policy(EarlyRefresh::xfetch(1.0), secs(10), None);
        let mut rng = rng(42);
        let mut written_at = 0u64;
        let (mut early, mut total_lead, mut min_lead) = (0u64, 0u64, u64::MAX);
        for _ in 0..CYCLES {
            let fresh_until = written_at + 10_000;
            let stale_until = fresh_until + 60_000;
            let mut now = written_at + READ_EVERY_MS;
            loop {
                match p.judge(reading(now, fresh_until, stale_until, LOAD_MS), &mut rng) {
                    Freshness::Fresh => now += READ_EVERY_MS,
                    Freshness::RefreshEarly => {
                        assert!(now < fresh_until);
                        early += 1;
                        total_lead += fresh_until - now;
                        min_lead = min_lead.min(fresh_until - now);
                        break;
                    }
                    Freshness::Stale | Freshness::Expired => break,
                }
            }
            // The refresh lands one load later; the next cycle starts there.
            written_at = now + u64::from(LOAD_MS);
        }
        let pct = 100.0 * early as f64 / CYCLES as f64;
        println!(
            "early refreshes: {early}/{CYCLES} ({pct}%), mean lead {} ms, min lead {min_lead} ms",
            total_lead as f64 / early.max(1) as f64
        );
        assert!(early * 100 >= CYCLES * 99, "only {early}/{CYCLES} early");
    }

    #[test]
    fn after_fraction_refreshes_in_the_last_part_of_the_window() {
        let p = policy(EarlyRefresh::after_fraction(0.8), secs(10), None);
        let mut rng = rng(3);
        let (fresh_until, stale_until) = (10_000, 70_000);
        let at =
            |now: u64, rng: &mut StdRng| p.judge(reading(now, fresh_until, stale_until, 100), rng);
        for now in [0, 1, 5_000, 7_999] {
            assert_eq!(at(now, &mut rng), Freshness::Fresh, "at {now}");
        }
        for now in [8_000, 8_001, 9_000, 9_999] {
            assert_eq!(at(now, &mut rng), Freshness::RefreshEarly, "at {now}");
        }
        assert_eq!(at(10_000, &mut rng), Freshness::Stale);
    }

    #[test]
    fn after_fraction_uses_the_configured_ttl() {
        // A jittered window of 12 s still refreshes in the last 2 s of 10 s.
        let p = policy(EarlyRefresh::after_fraction(0.8), secs(10), None);
        let mut rng = rng(4);
        let judge = |now: u64, rng: &mut StdRng| p.judge(reading(now, 12_000, 20_000, 0), rng);
        assert_eq!(judge(9_999, &mut rng), Freshness::Fresh);
        assert_eq!(judge(10_000, &mut rng), Freshness::RefreshEarly);
    }

    #[test]
    fn none_never_refreshes_early() {
        let p = policy(EarlyRefresh::none(), secs(10), None);
        let mut rng = rng(5);
        for now in [0, 9_000, 9_999] {
            assert_eq!(
                p.judge(reading(now, 10_000, 20_000, 100), &mut rng),
                Freshness::Fresh
            );
        }
    }

    #[test]
    fn stale_and_expired_boundaries() {
        let mut rng = rng(6);
        let none = EarlyRefresh::none();
        // Grace of 60 s, no max_stale.
        let p = policy(none, secs(10), None);
        let judge = |p: &FreshnessPolicy, now: u64, stale_until: u64, rng: &mut StdRng| {
            p.judge(reading(now, 10_000, stale_until, 100), rng)
        };
        assert_eq!(judge(&p, 9_999, 70_000, &mut rng), Freshness::Fresh);
        assert_eq!(judge(&p, 10_000, 70_000, &mut rng), Freshness::Stale);
        assert_eq!(judge(&p, 69_999, 70_000, &mut rng), Freshness::Stale);
        assert_eq!(judge(&p, 70_000, 70_000, &mut rng), Freshness::Expired);
        assert_eq!(judge(&p, u64::MAX, 70_000, &mut rng), Freshness::Expired);

        // max_stale shorter than grace cuts it.
        let p = policy(none, secs(10), Some(secs(5)));
        assert_eq!(judge(&p, 10_000, 70_000, &mut rng), Freshness::Stale);
        assert_eq!(judge(&p, 14_999, 70_000, &mut rng), Freshness::Stale);
        assert_eq!(judge(&p, 15_000, 70_000, &mut rng), Freshness::Expired);
        assert!(!p.servable_stale(reading(15_000, 10_000, 70_000, 100)));

        // max_stale longer than grace: grace still bounds it.
        let p = policy(none, secs(10), Some(secs(600)));
        assert_eq!(judge(&p, 69_999, 70_000, &mut rng), Freshness::Stale);
        assert_eq!(judge(&p, 70_000, 70_000, &mut rng), Freshness::Expired);

        // max_stale of zero: nothing stale is served.
        let p = policy(none, secs(10), Some(Duration::ZERO));
        assert_eq!(judge(&p, 10_000, 70_000, &mut rng), Freshness::Expired);

        // No grace: expired right at fresh_until.
        let p = policy(none, secs(10), None);
        assert_eq!(judge(&p, 9_999, 10_000, &mut rng), Freshness::Fresh);
        assert_eq!(judge(&p, 10_000, 10_000, &mut rng), Freshness::Expired);
    }

    #[test]
    fn servable_stale_follows_grace_and_max_stale() {
        let p = policy(EarlyRefresh::none(), secs(10), Some(secs(5)));
        assert!(p.servable_stale(reading(0, 10_000, 70_000, 0)));
        assert!(p.servable_stale(reading(14_999, 10_000, 70_000, 0)));
        assert!(!p.servable_stale(reading(15_000, 10_000, 70_000, 0)));
        let p = policy(EarlyRefresh::none(), secs(10), None);
        assert!(p.servable_stale(reading(69_999, 10_000, 70_000, 0)));
        assert!(!p.servable_stale(reading(70_000, 10_000, 70_000, 0)));
        // A max_stale that would overflow saturates instead.
        let p = policy(EarlyRefresh::none(), secs(10), Some(Duration::MAX));
        assert!(p.servable_stale(reading(u64::MAX - 1, u64::MAX - 5, u64::MAX, 0)));
    }

    #[test]
    fn malformed_entry_is_bounded_by_stale_until() {
        // fresh_until after stale_until: the physical TTL wins.
        let p = policy(EarlyRefresh::none(), secs(10), None);
        let mut rng = rng(7);
        assert_eq!(
            p.judge(reading(4_999, 10_000, 5_000, 0), &mut rng),
            Freshness::Fresh
        );
        assert_eq!(
            p.judge(reading(5_000, 10_000, 5_000, 0), &mut rng),
            Freshness::Expired
        );
    }

    #[test]
    fn validate_messages() {
        let msg = |e: EarlyRefresh| e.validate().unwrap_err().message().to_owned();
        assert_eq!(
            msg(EarlyRefresh::xfetch(f64::NAN)),
            "xfetch beta must be a finite number greater than zero, got NaN"
        );
        assert_eq!(
            msg(EarlyRefresh::xfetch(0.0)),
            "xfetch beta must be a finite number greater than zero, got 0"
        );
        assert_eq!(
            msg(EarlyRefresh::xfetch(-1.5)),
            "xfetch beta must be a finite number greater than zero, got -1.5"
        );
        assert_eq!(
            msg(EarlyRefresh::xfetch(f64::INFINITY)),
            "xfetch beta must be a finite number greater than zero, got inf"
        );
        assert_eq!(
            msg(EarlyRefresh::after_fraction(1.5)),
            "early refresh fraction must be in 0..1, got 1.5"
        );
        assert_eq!(
            msg(EarlyRefresh::after_fraction(0.0)),
            "early refresh fraction must be in 0..1, got 0"
        );
        assert_eq!(
            msg(EarlyRefresh::after_fraction(1.0)),
            "early refresh fraction must be in 0..1, got 1"
        );
        assert_eq!(
            msg(EarlyRefresh::after_fraction(f64::NAN)),
            "early refresh fraction must be in 0..1, got NaN"
        );
        assert_eq!(
            msg(EarlyRefresh::after_fraction(-0.2)),
            "early refresh fraction must be in 0..1, got -0.2"
        );
        for ok in [
            EarlyRefresh::none(),
            EarlyRefresh::default(),
            EarlyRefresh::xfetch(1e-9),
            EarlyRefresh::xfetch(4.0),
            EarlyRefresh::after_fraction(0.01),
            EarlyRefresh::after_fraction(0.99),
        ] {
            assert_eq!(ok.validate(), Ok(()), "{ok:?}");
        }
    }

    #[test]
    fn default_is_xfetch_one() {
        assert_eq!(EarlyRefresh::default(), EarlyRefresh::xfetch(1.0));
    }

    /// Any f64, with the awkward ones made likely.
    fn any_param() -> impl Strategy<Value = f64> {
        prop_oneof![
            any::<f64>(),
            0.0..=1.0f64,
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(f64::NEG_INFINITY),
            Just(0.0),
            Just(-0.0),
            Just(f64::MIN_POSITIVE),
            Just(f64::MAX),
            Just(1.0),
        ]
    }

    fn any_early() -> impl Strategy<Value = EarlyRefresh> {
        prop_oneof![
            Just(EarlyRefresh::none()),
            any_param().prop_map(EarlyRefresh::xfetch),
            any_param().prop_map(EarlyRefresh::after_fraction),
        ]
    }

    /// A u64 from the whole range or near either end, so that orderings of
    /// several of them (and equality) are all likely.
    fn any_ms() -> impl Strategy<Value = u64> {
        prop_oneof![any::<u64>(), 0..=1_000u64, (u64::MAX - 1_000)..=u64::MAX]
    }

    fn any_reading() -> impl Strategy<Value = Reading> {
        (any_ms(), any_ms(), any_ms(), any::<u32>())
            .prop_map(|(now, fresh, stale, load)| reading(now, fresh, stale, load))
    }

    fn any_policy() -> impl Strategy<Value = FreshnessPolicy> {
        (any_early(), any_ms(), prop::option::of(any_ms()))
            .prop_map(|(early, ttl, max_stale)| policy(early, ms(ttl), max_stale.map(ms)))
    }

    proptest! {
        #[test]
        fn the_early_window_agrees_with_could_refresh_early(
            p in any_policy(),
            load_ms in any::<u32>(),
            remaining in any::<u64>(),
        ) {
            let window = p.early_window_ms(load_ms);
            prop_assert_eq!(
                p.could_refresh_early(remaining, load_ms),
                window.is_some_and(|w| remaining <= w)
            );
            if let Some(w) = window {
                prop_assert!(p.could_refresh_early(w, load_ms));
                prop_assert!(w == u64::MAX || !p.could_refresh_early(w + 1, load_ms));
            }
        }

        #[test]
        fn judge_never_panics_and_respects_the_bounds(
            p in any_policy(),
            r in any_reading(),
            seed in any::<u64>(),
        ) {
            let mut rng = rng(seed);
            let _ = p.early.validate();
            for _ in 0..8 {
                let verdict = p.judge(r, &mut rng);
                let fresh = matches!(verdict, Freshness::Fresh | Freshness::RefreshEarly);
                if r.now_ms >= r.stale_until {
                    prop_assert_eq!(verdict, Freshness::Expired);
                } else {
                    prop_assert_eq!(fresh, r.now_ms < r.fresh_until);
                }
                if !fresh {
                    prop_assert_eq!(verdict == Freshness::Stale, p.servable_stale(r));
                }
                if p.early == EarlyRefresh::none() {
                    prop_assert!(verdict != Freshness::RefreshEarly);
                }
                // The cheap bound of the L1 hit path never hides a refresh.
                let fresh_until = r.fresh_until.min(r.stale_until);
                if verdict == Freshness::RefreshEarly {
                    prop_assert!(p.could_refresh_early(fresh_until - r.now_ms, r.load_ms));
                }
            }
        }

        #[test]
        fn xfetch_probability_is_a_probability(
            delta in any::<u32>(),
            beta in any_param(),
            remaining in any_ms(),
        ) {
            let p = FreshnessPolicy::xfetch_probability(delta, beta, remaining);
            prop_assert!((0.0..=1.0).contains(&p), "{p}");
        }

        #[test]
        fn valid_params_pass_validation(beta in 1e-6..=100f64, fraction in 1e-6..(1.0 - 1e-6)) {
            prop_assert!(EarlyRefresh::xfetch(beta).validate().is_ok());
            prop_assert!(EarlyRefresh::after_fraction(fraction).validate().is_ok());
        }
    }
}

//! How long Redis takes to answer, per failure domain, and the deadlines
//! that follow from it.
//!
//! Each domain (one for a single server, one per 256 hash slots on a
//! Cluster) keeps a *decaying peak* of its commands' round trips: a slower
//! reply raises it at once, faster ones pull it down over about
//! [`DECAY`] of time. A command's deadline is [`MULTIPLIER`] × that peak,
//! never below the configured floor (`response_timeout` for a read,
//! `write_timeout` for a write) nor above the ceiling
//! (`max_response_timeout`, or the floor if that is higher).
//!
//! A command that timed out counts as a round trip of its whole deadline
//! (its reply took at least that long), so under a Redis that has become
//! slower the next deadline is [`MULTIPLIER`] times the last one, up to the
//! ceiling, as TCP backs its retransmission timeout off; answers that come
//! quickly again bring it back down.
//!
//! Beside it each domain keeps the same peak of *answered* round trips
//! only (a timeout does not raise it): the *soft* deadline, [`MULTIPLIER`]
//! × that peak within the same floor and ceiling, is how long a caller
//! that holds a servable stand-in (an L1 copy, a stale entry) waits for a
//! command before it is served the stand-in. A stalled Redis (no answer at
//! all) grows the hard deadline with each timeout but leaves the soft one
//! where the last answers put it; a slow but answering Redis raises both.
//!
//! Recording a round trip is four atomic loads and, when a peak moves, two
//! stores each: no lock and no timer of its own on the hit path (the
//! caller already reads the clock for its deadline).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// The deadline as a multiple of the peak round trip.
pub(super) const MULTIPLIER: u32 = 3;

/// How long the peak takes to come down to the round trips seen since
/// (first order: after `DECAY` without a slower reply, it is at the latest
/// one).
pub(super) const DECAY: Duration = Duration::from_secs(10);

/// [`DECAY`] in microseconds.
const DECAY_US: u64 = DECAY.as_micros() as u64;

/// Which floor a deadline has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DeadlineKind {
    /// `response_timeout`.
    Read,
    /// `write_timeout` (never less than `response_timeout`).
    Write,
}

/// The round trips of every failure domain of one store, and its bounds.
#[derive(Debug)]
pub(super) struct Latencies {
    domains: Box<[Domain]>,
    /// What `at_us` counts from.
    origin: Instant,
    read_floor: Duration,
    write_floor: Duration,
    ceiling: Duration,
}

/// One failure domain's decaying peaks.
#[derive(Debug, Default)]
struct Domain {
    /// Every round trip, a timeout as one of its whole deadline: the hard
    /// deadline's.
    all: Peak,
    /// Answered round trips only: the soft deadline's.
    answered: Peak,
}

/// A decaying peak of round trips.
#[derive(Debug, Default)]
struct Peak {
    /// The peak round trip in microseconds; 0 before the first sample.
    peak_us: AtomicU64,
    /// When the peak last moved, in microseconds since `origin`.
    at_us: AtomicU64,
}

/// What a store knows of its latency and the deadlines it chose, for one
/// failure domain (see [`RedisStore::latency`](crate::RedisStore::latency)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedisLatency {
    /// The decaying peak of recent round trips (`None` before the first
    /// reply): a slower reply raises it at once, quicker ones bring it
    /// down within about 10 s. A command that timed out counts as a round
    /// trip of its deadline.
    pub round_trip: Option<Duration>,
    /// The deadline a read (`GET`, `MGET`, `TIME`) gets now: 3 × the
    /// round trip, at least `response_timeout`, at most
    /// `max_response_timeout`.
    pub read_deadline: Duration,
    /// The deadline a write or lease script gets now: 3 × the round trip,
    /// at least `write_timeout`, at most `max_response_timeout`.
    pub write_deadline: Duration,
    /// How long a caller that holds a servable stand-in (an L1 copy, a
    /// stale entry) waits for a read before it is served that stand-in:
    /// 3 × the decaying peak of *answered* round trips (a timeout does
    /// not raise it), at least `response_timeout`, at most
    /// `max_response_timeout`. A stalled Redis costs such a caller this,
    /// not the hard deadline its timeouts have grown.
    pub soft_deadline: Duration,
}

fn micros(d: Duration) -> u64 {
    d.as_secs()
        .saturating_mul(1_000_000)
        .saturating_add(u64::from(d.subsec_micros()))
}

impl Latencies {
    /// `domains` failure domains (at least one), with these floors and
    /// ceiling (a ceiling below a floor is the floor).
    pub(super) fn new(
        domains: usize,
        read_floor: Duration,
        write_floor: Duration,
        ceiling: Duration,
    ) -> Self {
        let write_floor = write_floor.max(read_floor);
        Latencies {
            domains: (0..domains.max(1)).map(|_| Domain::default()).collect(),
            origin: Instant::now(),
            read_floor,
            write_floor,
            ceiling,
        }
    }

    #[inline]
    fn domain(&self, domain: usize) -> &Domain {
        self.domains.get(domain).unwrap_or(&self.domains[0])
    }

    /// The deadline of an `op` in `domain` now.
    #[inline]
    pub(super) fn deadline(&self, domain: usize, op: DeadlineKind) -> Duration {
        let peak = self.domain(domain).all.peak_us.load(Ordering::Relaxed);
        self.deadline_for(peak, op)
    }

    /// The soft deadline of a read in `domain` now (see the module docs).
    pub(super) fn soft_deadline(&self, domain: usize) -> Duration {
        let peak = self.domain(domain).answered.peak_us.load(Ordering::Relaxed);
        self.deadline_for(peak, DeadlineKind::Read)
    }

    fn deadline_for(&self, peak_us: u64, op: DeadlineKind) -> Duration {
        let floor = match op {
            DeadlineKind::Read => self.read_floor,
            DeadlineKind::Write => self.write_floor,
        };
        let wanted = Duration::from_micros(peak_us.saturating_mul(u64::from(MULTIPLIER)));
        wanted.min(self.ceiling).max(floor)
    }

    /// The longest deadline any command may get.
    pub(super) fn ceiling(&self) -> Duration {
        self.ceiling.max(self.write_floor)
    }

    /// A reply in `domain` that took `took`, seen at `now`.
    #[inline]
    pub(super) fn record(&self, domain: usize, took: Duration, now: Instant) {
        let (domain, us, at) = (self.domain(domain), micros(took), self.since_origin(now));
        domain.all.record(us, at);
        domain.answered.record(us, at);
    }

    /// A command in `domain` timed out after `waited`, seen at `now`: a
    /// round trip of at least that. `true` if this is news (the peak was
    /// below it); `false` if another command's timeout already raised it
    /// (commands sent together time out together: one event, and the
    /// others may wait on, to the deadline that followed it).
    pub(super) fn timed_out(&self, domain: usize, waited: Duration, now: Instant) -> bool {
        let peak = &self.domain(domain).all;
        let us = micros(waited);
        let news = peak.peak_us.load(Ordering::Relaxed) < us;
        peak.record(us, self.since_origin(now));
        news
    }

    /// A round trip measured outside any domain's commands (the handshake
    /// of a connection, a clock sample): every domain that has no sample
    /// yet starts from it.
    pub(super) fn seed(&self, took: Duration) {
        let us = micros(took).max(1);
        let at = self.since_origin(Instant::now());
        for peak in self.domains.iter().flat_map(|d| [&d.all, &d.answered]) {
            if peak.peak_us.load(Ordering::Relaxed) == 0 {
                peak.peak_us.store(us, Ordering::Relaxed);
                peak.at_us.store(at, Ordering::Relaxed);
            }
        }
    }

    fn since_origin(&self, now: Instant) -> u64 {
        micros(now.saturating_duration_since(self.origin))
    }

    /// What `domain` knows now.
    pub(super) fn report(&self, domain: usize) -> RedisLatency {
        let peak = self.domain(domain).all.peak_us.load(Ordering::Relaxed);
        RedisLatency {
            round_trip: (peak > 0).then(|| Duration::from_micros(peak)),
            read_deadline: self.deadline_for(peak, DeadlineKind::Read),
            write_deadline: self.deadline_for(peak, DeadlineKind::Write),
            soft_deadline: self.soft_deadline(domain),
        }
    }

    /// The domain with the highest peak (the first if none has a sample).
    pub(super) fn slowest(&self) -> usize {
        let mut slowest = (0, 0);
        for (i, domain) in self.domains.iter().enumerate() {
            let peak = domain.all.peak_us.load(Ordering::Relaxed);
            if peak > slowest.1 {
                slowest = (i, peak);
            }
        }
        slowest.0
    }
}

impl Peak {
    /// A round trip of `us` at `at` (microseconds since the origin). Races
    /// between threads may lose a sample; the estimate stays a peak of
    /// recent ones.
    fn record(&self, us: u64, at: u64) {
        let us = us.max(1);
        let peak = self.peak_us.load(Ordering::Relaxed);
        if us >= peak {
            if us > peak {
                self.peak_us.store(us, Ordering::Relaxed);
                self.at_us.store(at, Ordering::Relaxed);
            }
            return;
        }
        // Down toward `us` in proportion to the time since it last moved.
        // Nothing is stored until that comes to a whole microsecond, and
        // only the time a step used up is consumed (many quick replies in
        // a row still decay it at the same rate).
        let last = self.at_us.load(Ordering::Relaxed);
        let since = at.saturating_sub(last);
        let (excess, decay) = (peak - us, DECAY_US);
        if since >= decay {
            self.peak_us.store(us, Ordering::Relaxed);
            self.at_us.store(at, Ordering::Relaxed);
            return;
        }
        // (Below 2^64 for any excess under 21 days: `since` < 10^7.)
        let moved = excess.saturating_mul(since);
        if moved >= decay {
            let step = moved / decay;
            let used = step.saturating_mul(decay) / excess;
            self.peak_us.store(peak - step, Ordering::Relaxed);
            self.at_us.store(last + used.min(since), Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn defaults() -> Latencies {
        Latencies::new(1, ms(50), ms(250), ms(2000))
    }

    #[tokio::test(start_paused = true)]
    async fn a_fast_redis_keeps_the_configured_deadlines() {
        let latency = defaults();
        assert_eq!(latency.report(0).round_trip, None);
        for _ in 0..100 {
            latency.record(0, Duration::from_micros(300), Instant::now());
            tokio::time::advance(ms(1)).await;
        }
        let report = latency.report(0);
        assert_eq!(report.round_trip, Some(Duration::from_micros(300)));
        assert_eq!(report.read_deadline, ms(50));
        assert_eq!(report.write_deadline, ms(250));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_redis_gets_three_times_its_peak() {
        let latency = defaults();
        for took in [100, 120, 90, 110] {
            latency.record(0, ms(took), Instant::now());
            tokio::time::advance(ms(10)).await;
        }
        let report = latency.report(0);
        // The peak, a little decayed toward the quicker replies after it.
        let peak = report.round_trip.unwrap();
        assert!(peak > ms(119) && peak <= ms(120), "{peak:?}");
        assert_eq!(report.read_deadline, peak * 3);
        assert_eq!(report.write_deadline, peak * 3);
        assert!(latency.deadline(0, DeadlineKind::Read) > ms(250));
    }

    #[tokio::test(start_paused = true)]
    async fn timeouts_back_the_deadline_off_up_to_the_ceiling() {
        let latency = defaults();
        let mut deadlines = Vec::new();
        for _ in 0..6 {
            // A blackholed Redis: each read times out at its deadline.
            let deadline = latency.deadline(0, DeadlineKind::Read);
            deadlines.push(deadline.as_millis());
            tokio::time::advance(deadline).await;
            latency.timed_out(0, deadline, Instant::now());
        }
        assert_eq!(deadlines, [50, 150, 450, 1350, 2000, 2000]);
        assert_eq!(latency.deadline(0, DeadlineKind::Write), ms(2000));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stall_leaves_the_soft_deadline_where_the_answers_put_it() {
        let latency = defaults();
        latency.record(0, ms(2), Instant::now());
        // Stalled: every read times out, the hard deadline grows to the
        // ceiling, the soft one stays at the floor.
        for _ in 0..6 {
            let deadline = latency.deadline(0, DeadlineKind::Read);
            tokio::time::advance(deadline).await;
            latency.timed_out(0, deadline, Instant::now());
        }
        let report = latency.report(0);
        assert_eq!(report.read_deadline, ms(2000));
        assert_eq!(report.soft_deadline, ms(50));
        // A slow but answering Redis raises both.
        latency.record(0, ms(200), Instant::now());
        assert_eq!(latency.soft_deadline(0), ms(600));
        assert_eq!(latency.deadline(0, DeadlineKind::Read), ms(2000));
        // The handshake seeds both.
        let fresh = defaults();
        fresh.seed(ms(250));
        assert_eq!(fresh.soft_deadline(0), ms(750));
        assert_eq!(fresh.deadline(0, DeadlineKind::Read), ms(750));
    }

    #[tokio::test(start_paused = true)]
    async fn commands_that_time_out_together_are_one_event() {
        let latency = defaults();
        latency.record(0, ms(1), Instant::now());
        tokio::time::advance(ms(50)).await;
        // Three reads sent together time out together.
        assert!(latency.timed_out(0, ms(50), Instant::now()));
        assert!(!latency.timed_out(0, ms(50), Instant::now()));
        assert!(!latency.timed_out(0, ms(50), Instant::now()));
        // The others wait on to the deadline that followed.
        assert_eq!(latency.deadline(0, DeadlineKind::Read), ms(150));
        tokio::time::advance(ms(100)).await;
        assert!(latency.timed_out(0, ms(150), Instant::now()));
        assert_eq!(latency.deadline(0, DeadlineKind::Read), ms(450));
    }

    #[tokio::test(start_paused = true)]
    async fn quick_replies_bring_the_deadline_back_down() {
        let latency = defaults();
        latency.record(0, ms(600), Instant::now());
        assert_eq!(latency.deadline(0, DeadlineKind::Read), ms(1800));
        // Quick replies every 100 ms: after one DECAY the peak has come
        // most of the way down (first order, compounded: to about e^-1 of
        // the excess), after three the floors are back.
        for _ in 0..100 {
            tokio::time::advance(ms(100)).await;
            latency.record(0, ms(1), Instant::now());
        }
        let after_one = latency.report(0).round_trip.unwrap();
        assert!(after_one > ms(150) && after_one < ms(300), "{after_one:?}");
        for _ in 0..300 {
            tokio::time::advance(ms(100)).await;
            latency.record(0, ms(1), Instant::now());
        }
        assert_eq!(latency.deadline(0, DeadlineKind::Read), ms(50));
        assert_eq!(latency.deadline(0, DeadlineKind::Write), ms(250));
    }

    #[tokio::test(start_paused = true)]
    async fn a_quick_reply_after_a_long_quiet_resets_the_peak() {
        let latency = defaults();
        latency.record(0, ms(900), Instant::now());
        tokio::time::advance(DECAY * 2).await;
        latency.record(0, ms(2), Instant::now());
        assert_eq!(latency.report(0).round_trip, Some(ms(2)));
    }

    #[tokio::test(start_paused = true)]
    async fn many_quick_replies_in_a_burst_still_decay() {
        // Replies 10 µs apart: each step is below a microsecond, so the
        // time accumulates until one is whole.
        let latency = defaults();
        latency.record(0, ms(500), Instant::now());
        for _ in 0..200_000 {
            tokio::time::advance(Duration::from_micros(10)).await;
            latency.record(0, ms(1), Instant::now());
        }
        // 2 s = a fifth of DECAY: about 18% of the excess is gone.
        let peak = latency.report(0).round_trip.unwrap();
        assert!(peak < ms(450) && peak > ms(350), "{peak:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn domains_are_apart_and_seeded_only_when_empty() {
        let latency = Latencies::new(4, ms(50), ms(250), ms(2000));
        latency.record(1, ms(400), Instant::now());
        latency.seed(ms(100));
        assert_eq!(latency.report(0).round_trip, Some(ms(100)));
        assert_eq!(latency.report(1).round_trip, Some(ms(400)));
        assert_eq!(latency.slowest(), 1);
        assert_eq!(latency.deadline(1, DeadlineKind::Read), ms(1200));
        assert_eq!(latency.deadline(2, DeadlineKind::Read), ms(300));
    }

    #[test]
    fn a_ceiling_below_the_floor_is_the_floor() {
        let latency = Latencies::new(1, ms(5000), ms(5000), ms(2000));
        assert_eq!(latency.deadline(0, DeadlineKind::Read), ms(5000));
        assert_eq!(latency.ceiling(), ms(5000));
    }
}

//! The store's clock: Redis's `TIME`, sampled when a connection is made
//! and every `clock_refresh` after (by `connection`'s refresh task),
//! corrected by half the round trip, and extrapolated with the local
//! monotonic clock in between, so reading it costs no round trip.

use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::conn::{Conn, store_error};
use super::latency::{DeadlineKind, Latencies};
use crate::clock::millis;
use crate::error::{Error, ErrorKind};

/// Redis's clock as the store knows it: the sample in use, and the
/// highest time handed out from it.
#[derive(Debug, Default)]
pub(super) struct RedisClock {
    /// The sample in use; `None` before the first one.
    sample: RwLock<Option<ClockSample>>,
    /// The highest Redis-derived time handed out, so the clock does not run
    /// back by a sample's rounding when a new sample corrects it. Only
    /// readings from a sample count (never the wall-clock stand-in), and a
    /// new sample that is clearly behind resets it: no application-clock
    /// reading can pin the store's clock, and a Redis clock that stepped
    /// back (or a failover to a host behind) is followed, not frozen.
    last_now: AtomicU64,
}

/// Redis's clock at a local instant.
#[derive(Debug, Clone, Copy)]
struct ClockSample {
    local: Instant,
    redis_ms: u64,
    rtt: Duration,
}

impl ClockSample {
    /// Redis's clock now, as this sample extrapolates it.
    fn reading(&self) -> u64 {
        self.redis_ms.saturating_add(millis(self.local.elapsed()))
    }
}

impl RedisClock {
    /// Redis's clock, from the sample in use plus the local time elapsed
    /// since; never behind a time handed out before (see `last_now`).
    /// `None` before the first sample.
    #[inline]
    pub(super) fn now_ms(&self) -> Option<u64> {
        let sample = *self.sample.read().unwrap_or_else(|p| p.into_inner());
        let now = sample?.reading();
        // Written only when the clock moved on: within one
        // millisecond, calls from every thread only read it.
        let prev = self.last_now.load(Ordering::Relaxed);
        if now <= prev {
            return Some(prev);
        }
        Some(self.last_now.fetch_max(now, Ordering::Relaxed).max(now))
    }

    /// The round trip of the sample in use, halved: how far Redis's clock
    /// may be from what [`now_ms`](Self::now_ms) says. `None` before the
    /// first sample.
    pub(super) fn uncertainty(&self) -> Option<Duration> {
        let sample = *self.sample.read().unwrap_or_else(|p| p.into_inner());
        sample.map(|s| s.rtt / 2)
    }

    /// Samples `TIME` a few times and keeps the sample with the shortest
    /// round trip (the tightest bound on Redis's clock).
    ///
    /// Any one good sample will do. Until the store has a sample, a cluster
    /// may take it from any node; after that only from slot 0's primary (a
    /// failed refresh keeps the previous sample rather than switch clocks).
    ///
    /// Each reply gets the read deadline of the clock's domain (domain 0:
    /// the one server, or slot 0's primary) and is recorded there as a
    /// round trip (and seeds the domains that have none yet); a `TIME`
    /// that does not answer in time ends the sampling, and so does
    /// `max_response_timeout` spent. Each sample better than the ones
    /// before is put in use at once, so a sampling cut short keeps what it
    /// found.
    pub(super) async fn sample(&self, conn: &mut Conn, latency: &Latencies) -> Result<(), Error> {
        let any_node = self
            .sample
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_none();
        let started = Instant::now();
        let mut best: Option<ClockSample> = None;
        let mut failure = None;
        for _ in 0..3 {
            if best.is_some() && started.elapsed() >= latency.ceiling() {
                break;
            }
            let wait = latency.deadline(0, DeadlineKind::Read);
            let sent = Instant::now();
            let (secs, micros): (u64, u64) =
                match tokio::time::timeout(wait, conn.time(any_node)).await {
                    Ok(Ok(time)) => time,
                    Ok(Err(err)) => {
                        failure = Some(store_error(err));
                        continue;
                    }
                    Err(_) => {
                        latency.timed_out(0, wait, Instant::now());
                        failure = Some(Error::new(
                            ErrorKind::Store,
                            format!("redis did not answer TIME within {wait:?}"),
                        ));
                        break;
                    }
                };
            let now = Instant::now();
            let rtt = now - sent;
            latency.record(0, rtt, now);
            latency.seed(rtt);
            let sample = ClockSample {
                local: sent + rtt / 2,
                redis_ms: secs.saturating_mul(1000).saturating_add(micros / 1000),
                rtt,
            };
            if best.is_none_or(|b| sample.rtt < b.rtt) {
                best = Some(sample);
                self.install(sample);
            }
        }
        match (best, failure) {
            (Some(_), _) | (None, None) => Ok(()),
            (None, Some(err)) => Err(err),
        }
    }

    /// Puts clock sample `sample` in use.
    fn install(&self, sample: ClockSample) {
        let mut clock = self.sample.write().unwrap_or_else(|p| p.into_inner());
        *clock = Some(sample);
        // Behind the last time handed out by more than the sample's
        // own uncertainty: Redis's clock stepped back (or this is
        // another host's). Follow it rather than stand still.
        let now = sample.reading();
        let slack = millis(sample.rtt).max(1);
        if self.last_now.load(Ordering::Relaxed) > now.saturating_add(slack) {
            self.last_now.store(now, Ordering::Relaxed);
        }
    }
}

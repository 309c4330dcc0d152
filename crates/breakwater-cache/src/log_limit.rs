//! Rate-limited warnings: one line per kind per interval, with a count of
//! the ones held back.
//!
//! With Redis down every request fails the same way, and one warning per
//! request (434 lines in 3 s, measured) drowns the logs without saying
//! more than the first. Each [`Warning`] kind is logged the first time,
//! then at most once per interval (1 s by default); that line carries
//! `suppressed`, how many of its kind were held back since the previous
//! line of that kind. Kinds are limited separately, so a flood of one does
//! not hide another.
//!
//! Hand-rolled rather than a dependency: it is two atomics per kind on the
//! failure path (no lock, no allocation, no map keyed by message), it must
//! follow tokio's clock so paused-time tests drive it, and what it needs of
//! a generic rate limiter (governor's GCRA, a tracing layer) is one
//! comparison.
//!
//! The count is reported by the next line of the kind, not by a timer: a
//! kind that stops occurring leaves its last count unreported, which is
//! what a quiet log after a burst should look like.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::clock::millis;

/// A kind of repeated warning; each is limited on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Warning {
    /// A store read failed: a stale L1 copy is served, or the value loads
    /// (directly, or through the lease).
    StoreRead,
    /// A batch read failed: the same, for the keys of a `get_many`.
    StoreReadBatch,
    /// The lease could not be tried; the value is loaded directly.
    LeaseUnavailable,
    /// A lease extension failed while loading.
    LeaseExtension,
    /// A lease release failed.
    LeaseRelease,
    /// A fenced write failed; the loaded value is returned unwritten.
    StoreWrite,
    /// The lease was held past `lock_wait`; the value is loaded anyway.
    LockWaitLoadAnyway,
    /// A load failed and a stale value or the fallback was served.
    LoadFailed,
    /// A background refresh failed.
    RefreshFailed,
    /// Stored bytes did not decode (another codec, corrupt, foreign).
    Unreadable,
    /// The store refused one key (a value of another type under it, ...).
    KeyFault,
    /// A value was larger than `max_value_size` and not cached.
    TooLarge,
    /// The lease expired (or was taken over) while loading: the load is
    /// not written.
    LeaseLost,
    /// The namespace's clear record was lost (evicted, deleted); a hard
    /// clear makes a new one.
    ClearRecordLost,
}

impl Warning {
    const COUNT: usize = 14;

    fn index(self) -> usize {
        self as usize
    }
}

/// A warning given once per cache, with its likely cause; the same event
/// after that is logged at `debug` (and counted by the metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Once {
    /// A stored value did not decode as the cache's value type.
    ForeignValue,
    /// A stored entry was written with another codec.
    ForeignCodec,
}

impl Once {
    const COUNT: usize = 2;
}

/// One kind's state: when its next line may be logged, and how many were
/// held back since its last one.
#[derive(Debug, Default)]
struct Tally {
    /// Milliseconds since the limiter's origin.
    next_at: AtomicU64,
    suppressed: AtomicU64,
}

/// Decides which warnings are logged; see the module docs.
#[derive(Debug)]
pub(crate) struct LogLimiter {
    origin: Instant,
    interval_ms: u64,
    slots: [Tally; Warning::COUNT],
    /// Whether each [`Once`] kind was given.
    given: [AtomicBool; Once::COUNT],
}

impl Default for LogLimiter {
    fn default() -> Self {
        LogLimiter::new(Duration::from_secs(1))
    }
}

impl LogLimiter {
    /// At most one line per kind per `interval`.
    pub(crate) fn new(interval: Duration) -> Self {
        LogLimiter {
            origin: Instant::now(),
            interval_ms: millis(interval).max(1),
            slots: Default::default(),
            given: Default::default(),
        }
    }

    /// `true` the first time it is asked for `kind`, `false` after.
    pub(crate) fn first(&self, kind: Once) -> bool {
        !self.given[kind as usize].swap(true, Ordering::Relaxed)
    }

    /// `Some(suppressed)` if a warning of `kind` should be logged now
    /// (with how many of its kind were held back since the last one), or
    /// `None` if it is held back and counted.
    pub(crate) fn admit(&self, kind: Warning) -> Option<u64> {
        let slot = &self.slots[kind.index()];
        // +1: the first warning, at the origin, is due.
        let now = millis(self.origin.elapsed()) + 1;
        let next_at = slot.next_at.load(Ordering::Relaxed);
        if now >= next_at
            && slot
                .next_at
                .compare_exchange(
                    next_at,
                    now + self.interval_ms,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            return Some(slot.suppressed.swap(0, Ordering::Relaxed));
        }
        slot.suppressed.fetch_add(1, Ordering::Relaxed);
        None
    }
}

/// `tracing::warn!` through a [`LogLimiter`]: logged with a `suppressed`
/// field when admitted, counted otherwise.
macro_rules! warn_limited {
    ($limiter:expr, $kind:expr, $($arg:tt)+) => {
        if let Some(suppressed) = $limiter.admit($kind) {
            tracing::warn!(suppressed, $($arg)+);
        }
    };
}
pub(crate) use warn_limited;

/// A key as it may appear in logs: lossy UTF-8, cut at 128 bytes.
pub(crate) fn show_key(key: &[u8]) -> String {
    let cut = &key[..key.len().min(128)];
    let mut s = String::from_utf8_lossy(cut).into_owned();
    if key.len() > cut.len() {
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_once_kind_is_given_once() {
        let limiter = LogLimiter::default();
        assert!(limiter.first(Once::ForeignValue));
        assert!(!limiter.first(Once::ForeignValue));
        assert!(limiter.first(Once::ForeignCodec));
        assert!(!limiter.first(Once::ForeignCodec));
    }

    #[tokio::test(start_paused = true)]
    async fn first_logged_then_one_per_interval_with_the_count() {
        let limiter = LogLimiter::new(Duration::from_secs(1));
        assert_eq!(limiter.admit(Warning::StoreRead), Some(0));
        for _ in 0..433 {
            assert_eq!(limiter.admit(Warning::StoreRead), None);
        }
        tokio::time::advance(Duration::from_millis(999)).await;
        assert_eq!(limiter.admit(Warning::StoreRead), None);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(limiter.admit(Warning::StoreRead), Some(434));
        assert_eq!(limiter.admit(Warning::StoreRead), None);
        // A quiet spell: the next one is logged at once, with what was
        // held back before it.
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(limiter.admit(Warning::StoreRead), Some(1));
        assert_eq!(limiter.admit(Warning::StoreRead), None);
    }

    #[tokio::test(start_paused = true)]
    async fn kinds_are_limited_apart() {
        let limiter = LogLimiter::default();
        assert_eq!(limiter.admit(Warning::StoreRead), Some(0));
        assert_eq!(limiter.admit(Warning::StoreRead), None);
        assert_eq!(limiter.admit(Warning::StoreWrite), Some(0));
        assert_eq!(limiter.admit(Warning::KeyFault), Some(0));
        assert_eq!(limiter.admit(Warning::StoreWrite), None);
    }

    #[tokio::test(start_paused = true)]
    async fn three_seconds_of_an_outage_log_three_lines_per_kind() {
        let limiter = LogLimiter::default();
        let mut logged = 0;
        let mut reported = 0;
        // 434 failures, evenly over 3 s, as measured with Redis down.
        for _ in 0..434 {
            if let Some(suppressed) = limiter.admit(Warning::StoreRead) {
                logged += 1;
                reported += suppressed;
            }
            tokio::time::advance(Duration::from_micros(3_000_000 / 434)).await;
        }
        assert_eq!(logged, 3);
        // Every failure is either logged or counted in a later line, except
        // those after the last line.
        assert!(reported + logged <= 434 && reported + logged > 434 - 150);
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_callers_log_once_per_interval() {
        let limiter = std::sync::Arc::new(LogLimiter::default());
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let limiter = std::sync::Arc::clone(&limiter);
            tasks.push(tokio::spawn(async move {
                (0..1000)
                    .filter(|_| limiter.admit(Warning::LeaseUnavailable).is_some())
                    .count()
            }));
        }
        let mut logged = 0;
        for task in tasks {
            logged += task.await.unwrap();
        }
        assert_eq!(logged, 1);
    }
}

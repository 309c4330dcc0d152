//! The application machine's wall clock, as breakwater sees it.
//!
//! breakwater judges freshness on the *store's* clock (see
//! [`Store::now_ms`](crate::Store::now_ms)), never on the application
//! machine's, so two machines whose clocks disagree by minutes still agree on
//! what is fresh. The wall clock is only a stand-in where no store clock is
//! known yet (a [`RedisStore`](crate::RedisStore) before its first `TIME`
//! sample) and the epoch of a [`MemoryStore`](crate::MemoryStore). It is a
//! trait so simulations and tests can skew it and check that nothing else
//! depends on it.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

/// A duration as whole milliseconds, saturating at `u64::MAX`: the unit of
/// every store-clock computation.
pub(crate) fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A source of Unix time in milliseconds.
pub trait WallClock: Send + Sync + fmt::Debug + 'static {
    /// Milliseconds since the Unix epoch.
    fn unix_ms(&self) -> u64;
}

/// The operating system's clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl WallClock for SystemClock {
    fn unix_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, millis)
    }
}

/// The system clock shifted by a fixed offset: a machine whose clock is
/// wrong, for simulations and tests.
///
/// # Examples
///
/// ```
/// use breakwater_cache::clock::{SkewedClock, SystemClock, WallClock};
/// let ahead = SkewedClock::new(5 * 60 * 1000); // five minutes fast
/// assert!(ahead.unix_ms() >= SystemClock.unix_ms() + 299_000);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct SkewedClock {
    offset_ms: i64,
}

impl SkewedClock {
    /// A clock `offset_ms` ahead of the system clock (behind when negative).
    pub fn new(offset_ms: i64) -> Self {
        SkewedClock { offset_ms }
    }
}

impl WallClock for SkewedClock {
    fn unix_ms(&self) -> u64 {
        SystemClock.unix_ms().saturating_add_signed(self.offset_ms)
    }
}

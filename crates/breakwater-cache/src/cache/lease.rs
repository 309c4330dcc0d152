//! The lease, so that one process in the fleet loads a key while the
//! others wait as long as a live holder needs and no longer than a dead
//! holder's lease lasts: [`LeaseConfig`] (the lease's TTL, how long and how
//! often others wait, and what they do past the wait), its validation, and
//! the deadline arithmetic every wait on a lease uses.
//!
//! The lease's store side (acquire, extend, release, the fenced write) is
//! the [`Store`](crate::Store) trait's; taking it, extending it while the
//! loader runs and waiting on it are the fill's (`fill`, and `batch` for
//! many keys).

use std::time::Duration;

use tokio::time::Instant;

use crate::error::{ConfigError, Error, ErrorKind};
use crate::store::LeaseRequest;

/// What a caller does when another process has held the key's lease for
/// longer than `lock_wait`.
///
/// # Examples
///
/// ```
/// use breakwater_cache::{Cache, OnLockTimeout};
/// let cache = Cache::<u64>::builder()
///     .on_lock_timeout(OnLockTimeout::serve_stale())
///     .build()
///     .unwrap();
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OnLockTimeout(pub(crate) LockTimeoutKind);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LockTimeoutKind {
    LoadAnyway,
    ServeStale,
    Error,
}

impl OnLockTimeout {
    /// Call the loader anyway and return its value (without writing it: the
    /// lease holder will). The default; availability first. Waiters wait as
    /// long as the lease is held and extended, so this applies to a stuck
    /// lease (held past `lock_wait`, which must then cover `load_timeout +
    /// lease_ttl`), never to a slow load.
    pub fn load_anyway() -> Self {
        OnLockTimeout(LockTimeoutKind::LoadAnyway)
    }

    /// Return the stale value if one is inside `grace`, else fail with
    /// [`LockTimeout`](crate::ErrorKind::LockTimeout).
    pub fn serve_stale() -> Self {
        OnLockTimeout(LockTimeoutKind::ServeStale)
    }

    /// Fail with [`LockTimeout`](crate::ErrorKind::LockTimeout); the
    /// database is never called by a waiter.
    pub fn error() -> Self {
        OnLockTimeout(LockTimeoutKind::Error)
    }
}

/// The key's lease: how long it lives without being extended, how long
/// other callers wait for its holder's load, how often they look on their
/// own, and what they do when the wait runs out. Given whole to
/// [`CacheBuilder::lease`](crate::CacheBuilder::lease), or setting by
/// setting through the builder's shorthands (`lease_ttl`, `lock_wait`,
/// `lock_poll`, `on_lock_timeout`); checked by
/// [`build`](crate::CacheBuilder::build).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use breakwater_cache::{Cache, LeaseConfig, OnLockTimeout};
///
/// let lease = LeaseConfig::new()
///     .lease_ttl(Duration::from_secs(2))
///     .on_lock_timeout(OnLockTimeout::serve_stale());
/// let cache = Cache::<u64>::builder().lease(lease).build()?;
/// let settings = format!("{:?}", cache.settings());
/// assert!(settings.contains("lease_ttl: 2s"), "{settings}");
/// # Ok::<(), breakwater_cache::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseConfig {
    pub(crate) lease_ttl: Duration,
    /// `None`: `queue_wait + load_timeout + 2 × lease_ttl` for each call.
    pub(crate) lock_wait: Option<Duration>,
    pub(crate) lock_poll: Duration,
    pub(crate) on_lock_timeout: OnLockTimeout,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        LeaseConfig::new()
    }
}

impl LeaseConfig {
    /// The defaults: a 3 s lease, `lock_wait` of `queue_wait + load_timeout
    /// + 2 × lease_ttl`, a 200 ms poll, and
    /// [`OnLockTimeout::load_anyway`].
    pub fn new() -> Self {
        LeaseConfig {
            lease_ttl: Duration::from_secs(3),
            lock_wait: None,
            lock_poll: Duration::from_millis(200),
            on_lock_timeout: OnLockTimeout::load_anyway(),
        }
    }

    /// How long a loader's lease lives without being extended. The leader
    /// extends it every third of this while its loader runs; if the leader's
    /// process dies, the lease runs out within this long and exactly one
    /// waiting process takes over (waiters try again the moment it expires).
    /// Keep it well above the store's response time: at least 10 ms.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// How long a caller waits for another process's load before
    /// [`on_lock_timeout`](Self::on_lock_timeout) applies. Waiters keep
    /// waiting while the lease is held and extended, so this is the bound on
    /// a stuck lease, not on a slow load.
    ///
    /// With [`OnLockTimeout::load_anyway`] (the default policy) it must be at
    /// least `queue_wait + load_timeout + lease_ttl` (the bulkhead's
    /// `queue_wait`, 1 s by default): a shorter wait would start a second
    /// load while the holder's may still be running (and not write it). The
    /// default, `queue_wait + load_timeout + 2 × lease_ttl`, also covers one
    /// takeover.
    pub fn lock_wait(mut self, wait: Duration) -> Self {
        self.lock_wait = Some(wait);
        self
    }

    /// How often a waiter re-checks on its own (jittered to `poll/2 ..=
    /// 3·poll/2`), in case a wake-up message is lost.
    pub fn lock_poll(mut self, poll: Duration) -> Self {
        self.lock_poll = poll;
        self
    }

    /// What happens when `lock_wait` runs out.
    pub fn on_lock_timeout(mut self, policy: OnLockTimeout) -> Self {
        self.on_lock_timeout = policy;
        self
    }

    /// The `lock_wait` a call whose holder's whole load takes `load`
    /// (`queue_wait + load_timeout`) waits: long enough for that load and,
    /// by default, one takeover after a dead holder's lease runs out. An
    /// explicit `lock_wait` is used as set, except that with `load_anyway`
    /// it never ends before a live holder's load could (a per-call
    /// `load_timeout` may be longer than the one it was checked against).
    pub(crate) fn lock_wait_for(&self, load: Duration) -> Duration {
        match self.lock_wait {
            None => default_lock_wait(load, self.lease_ttl),
            Some(wait) if self.on_lock_timeout == OnLockTimeout::load_anyway() => {
                wait.max(load.saturating_add(self.lease_ttl))
            }
            Some(wait) => wait,
        }
    }

    /// The settings and how they relate: a holder extends its lease every
    /// third of `lease_ttl`; waiters wait `lock_wait`, and with
    /// `load_anyway` that must cover a live holder's `load` (`queue_wait +
    /// load_timeout`).
    pub(crate) fn validate(&self, load: Duration) -> Result<(), ConfigError> {
        let LeaseConfig {
            lease_ttl,
            lock_wait,
            lock_poll,
            on_lock_timeout,
        } = *self;
        if lease_ttl < Duration::from_millis(10) {
            return Err(ConfigError::new(format!(
                "lease_ttl must be at least 10ms, got {lease_ttl:?}"
            ))
            .for_key("lease_ttl"));
        }
        if lock_poll < Duration::from_millis(2) {
            return Err(ConfigError::new(format!(
                "lock_poll must be at least 2ms, got {lock_poll:?}"
            ))
            .for_key("lock_poll"));
        }
        for (name, value) in [
            ("lease_ttl", Some(lease_ttl)),
            ("lock_wait", lock_wait),
            ("lock_poll", Some(lock_poll)),
        ] {
            if let Some(value) = value.filter(|v| *v > MAX_LEASE_DURATION) {
                return Err(ConfigError::new(format!(
                    "{name} must be at most {MAX_LEASE_DURATION:?}, got {value:?}"
                ))
                .for_key(name));
            }
        }
        if let Some(wait) = lock_wait
            && on_lock_timeout == OnLockTimeout::load_anyway()
        {
            let needed = load.saturating_add(lease_ttl);
            if wait < needed {
                return Err(ConfigError::new(format!(
                    "lock_wait ({wait:?}) must be at least queue_wait + load_timeout + lease_ttl \
                     ({needed:?}) with \
                     OnLockTimeout::load_anyway, or every waiting process starts a second load while \
                     the holder's is still running; raise lock_wait (or leave it unset), lower \
                     load_timeout, or choose OnLockTimeout::serve_stale() or error()"
                ))
                .for_key("lock_wait"));
            }
        }
        Ok(())
    }
}

/// The default `lock_wait`: a holder's whole `load` (`queue_wait +
/// load_timeout`) `+ 2 × lease_ttl`.
fn default_lock_wait(load: Duration, lease_ttl: Duration) -> Duration {
    load.saturating_add(lease_ttl).saturating_add(lease_ttl)
}

/// The longest `lease_ttl` or `lock_wait` accepted: a day. Longer ones are
/// surely mistakes, and deadlines built from them must not overflow.
const MAX_LEASE_DURATION: Duration = Duration::from_secs(24 * 3600);

/// A lease as its holder knows it: its key and the holder's token.
pub(super) type Lease<'a> = LeaseRequest<'a>;

/// How long past a held lease's expiry a waiter tries to take it over (the
/// store's TTLs are whole milliseconds).
pub(super) const LEASE_RETRY_MARGIN: Duration = Duration::from_millis(2);

/// `now + wait`, or a day from now if that is later than tokio can tell
/// (a `load_timeout` of `Duration::MAX`): a deadline never overflows.
pub(super) fn deadline_after(wait: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(wait)
        .unwrap_or_else(|| now + Duration::from_secs(24 * 3600))
}

pub(super) fn lock_timeout(waited: Duration) -> Error {
    Error::new(
        ErrorKind::LockTimeout,
        format!("another process held this key's lease for longer than lock_wait ({waited:?})"),
    )
}

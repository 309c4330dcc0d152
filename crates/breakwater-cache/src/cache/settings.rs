//! [`Settings`]: what a built cache runs with, defaults resolved.

use std::fmt;
use std::time::Duration;

use super::lease::OnLockTimeout;
use crate::breaker::BreakerConfig;
use crate::codec::{Codec, Compression};
use crate::freshness::EarlyRefresh;
use crate::jitter::Jitter;
use crate::l1::L1Config;
use crate::limit::LimitConfig;
use crate::retry::RetryConfig;

/// The effective settings of a [`Cache`](crate::Cache), every default
/// resolved (`negative_ttl`, `max_stale` and `lock_wait` as computed, the
/// origin's breaker, bulkhead and retries as they are): see
/// [`Cache::settings`](crate::Cache::settings).
///
/// For logs and comparisons: print it with `{:#?}`, compare two with `==`
/// (a custom `retry_if` compares equal to any other custom one). The
/// printed form is not a stable format. The store and a fallback value are
/// not settings (a fallback's presence is).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use breakwater_cache::Cache;
///
/// let cache = Cache::<u64>::builder().ttl(Duration::from_secs(60)).build()?;
/// let settings = format!("{:?}", cache.settings());
/// assert!(settings.contains("ttl: 60s"), "{settings}");
/// assert!(settings.contains("lock_wait: 37s"), "{settings}");
/// # Ok::<(), breakwater_cache::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub(super) namespace: String,
    pub(super) key_prefix: String,
    pub(super) version: u32,
    pub(super) version_transition: Duration,
    pub(super) trace_keys: bool,
    pub(super) startup_check: bool,
    pub(super) ttl: Duration,
    pub(super) negative_ttl: Duration,
    pub(super) jitter: Jitter,
    pub(super) codec: Codec,
    pub(super) compression: Compression,
    pub(super) max_key_len: usize,
    pub(super) max_value_size: usize,
    pub(super) grace: Duration,
    pub(super) max_stale: Duration,
    pub(super) early_refresh: EarlyRefresh,
    pub(super) soft_timeout: Option<Duration>,
    pub(super) fail_safe_throttle: Duration,
    pub(super) lease_ttl: Duration,
    pub(super) lock_wait: Duration,
    pub(super) lock_poll: Duration,
    pub(super) on_lock_timeout: OnLockTimeout,
    pub(super) load_timeout: Duration,
    pub(super) origin: String,
    pub(super) breaker: BreakerConfig,
    pub(super) limit: LimitConfig,
    pub(super) retry: RetrySetting,
    pub(super) fallback: bool,
    pub(super) l1: Option<L1Config>,
    pub(super) store_breaker: BreakerConfig,
}

/// A [`RetryConfig`] compared by its attempts, backoff and whether it has
/// a custom `retry_if` (closures cannot be compared).
#[derive(Clone)]
pub(super) struct RetrySetting(pub(super) RetryConfig);

impl fmt::Debug for RetrySetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl PartialEq for RetrySetting {
    fn eq(&self, other: &Self) -> bool {
        self.0.same_settings(&other.0)
    }
}

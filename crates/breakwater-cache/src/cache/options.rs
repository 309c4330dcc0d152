//! The settings one call runs with ([`Options`]): the cache's defaults,
//! overridden per call by [`CacheEntry`](crate::CacheEntry) (in `per_call`).

use std::time::Duration;

use crate::error::{ConfigError, KeyedResult, MAX_WAIT, MAX_WINDOW};
use crate::freshness::{EarlyRefresh, FreshnessPolicy};
use crate::jitter::Jitter;

/// The settings one call runs with: the cache's defaults, overridden per
/// call through [`Cache::entry`](crate::Cache::entry).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Options {
    pub(crate) ttl: Duration,
    pub(crate) negative_ttl: Duration,
    pub(crate) jitter: Jitter,
    pub(crate) grace: Duration,
    /// `None`: the same as `grace`.
    pub(crate) max_stale: Option<Duration>,
    pub(crate) early_refresh: EarlyRefresh,
    pub(crate) soft_timeout: Option<Duration>,
    pub(crate) load_timeout: Duration,
    pub(crate) fail_safe_throttle: Duration,
    /// Waiters poll every `lock_poll × poll_scale` (at most every lease
    /// TTL): a `get_many` waiting on many keys spreads its fallback polls
    /// (1 for a single call).
    pub(crate) poll_scale: u32,
}

impl Options {
    /// The freshness policy these settings give.
    pub(crate) fn freshness(&self) -> FreshnessPolicy {
        FreshnessPolicy {
            early: self.early_refresh,
            ttl: self.ttl,
            max_stale: Some(self.max_stale()),
        }
    }

    /// How long past its fresh window a value may be served at all.
    pub(crate) fn max_stale(&self) -> Duration {
        self.max_stale.unwrap_or(self.grace)
    }

    /// Every rule a set of options must satisfy, with exact messages.
    ///
    /// Windows (`ttl`, `negative_ttl`, `grace`, `max_stale`) are at most 365
    /// days and waits (`load_timeout`, `fail_safe_throttle`) at most a day,
    /// so no deadline computed from them can overflow.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        for (name, value) in [("ttl", self.ttl), ("negative_ttl", self.negative_ttl)] {
            if value < Duration::from_millis(1) {
                return Err(ConfigError::new(format!(
                    "{name} must be at least 1ms, got {value:?}"
                ))
                .for_key(name));
            }
            ConfigError::at_most(
                name,
                value,
                MAX_WINDOW,
                "a value kept longer belongs in the database; use at most 365 days",
            )
            .for_key(name)?;
        }
        ConfigError::at_most(
            "grace",
            self.grace,
            MAX_WINDOW,
            "use a grace of at most 365 days (Duration::ZERO for none)",
        )
        .for_key("grace")?;
        if let Some(max_stale) = self.max_stale {
            ConfigError::at_most(
                "max_stale",
                max_stale,
                MAX_WINDOW,
                "use a max_stale of at most 365 days",
            )
            .for_key("max_stale")?;
        }
        if let Some(max_stale) = self.max_stale
            && self.grace > max_stale
        {
            return Err(ConfigError::new(format!(
                "grace ({:?}) must not exceed max_stale ({max_stale:?})",
                self.grace
            ))
            .for_key("grace"));
        }
        if self.load_timeout < Duration::from_millis(2) {
            return Err(ConfigError::new(format!(
                "load_timeout must be at least 2ms, got {:?}",
                self.load_timeout
            ))
            .for_key("load_timeout"));
        }
        ConfigError::at_most(
            "load_timeout",
            self.load_timeout,
            MAX_WAIT,
            "use a load_timeout of at most 1 day",
        )
        .for_key("load_timeout")?;
        ConfigError::at_most(
            "fail_safe_throttle",
            self.fail_safe_throttle,
            MAX_WAIT,
            "use a throttle of at most 1 day (the default is 5s)",
        )
        .for_key("fail_safe_throttle")?;
        if let Some(soft) = self.soft_timeout
            && (soft.is_zero() || soft >= self.load_timeout)
        {
            return Err(ConfigError::new(format!(
                "soft_timeout ({soft:?}) must be greater than zero and below load_timeout ({:?})",
                self.load_timeout
            ))
            .for_key("soft_timeout"));
        }
        self.jitter.validate().within("jitter")?;
        self.early_refresh.validate().within("early_refresh")
    }
}

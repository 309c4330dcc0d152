//! How a call was served ([`Served`], [`StaleReason`], [`Fetched`]) and
//! the `served` labels of `breakwater_requests_total`.
//!
//! The ground floor: the cache reports these and the metrics room counts
//! them, so both import them from here and neither imports the other.

/// How a call was served. Every return path says which.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// A fresh value from this process's near cache (L1): no store call.
    L1Hit,
    /// A fresh value from the store (Redis).
    Hit,
    /// A fresh "not found" from the cache (the loader said `None` earlier).
    Negative,
    /// A value past its fresh window, and why it was served anyway.
    Stale {
        /// Why the stale value was served.
        reason: StaleReason,
    },
    /// This call's loader ran and its value was returned (and cached).
    Loaded,
    /// Another call's load was shared: in this process, or another process
    /// that held the lease and woke this one.
    Coalesced,
    /// The load failed, was refused by the circuit breaker or shed, no stale
    /// value could stand in, and the configured fallback was served (it is
    /// not cached).
    Fallback,
}

/// The `served` label values of `breakwater_requests_total`, indexed by
/// [`Served::metric_index`]; the last one counts errors.
pub(crate) const SERVED_LABELS: [&str; 15] = [
    "l1_hit",
    "hit",
    "negative",
    "stale_refreshing",
    "stale_loader_failed",
    "stale_soft_timeout",
    "stale_lock_timeout",
    "stale_breaker_open",
    "stale_overloaded",
    "stale_store_unavailable",
    "stale_previous_version",
    "loaded",
    "coalesced",
    "fallback",
    "error",
];

/// The index of the `error` label in [`SERVED_LABELS`].
pub(crate) const SERVED_ERROR: usize = SERVED_LABELS.len() - 1;

impl Served {
    /// The outcome as one word: the `served` label of
    /// `breakwater_requests_total` (see [`metrics`](crate::metrics)):
    /// `l1_hit`, `hit`, `negative`, `stale_refreshing`, `stale_loader_failed`,
    /// `stale_soft_timeout`, `stale_lock_timeout`, `stale_breaker_open`,
    /// `stale_overloaded`, `stale_store_unavailable`, `stale_previous_version`, `loaded`,
    /// `coalesced` or `fallback`. [`Display`](std::fmt::Display) writes the
    /// same, so it fits an `x-cache` header or a log field.
    ///
    /// # Examples
    ///
    /// ```
    /// use breakwater_cache::{Served, StaleReason};
    ///
    /// assert_eq!(Served::L1Hit.as_str(), "l1_hit");
    /// assert_eq!(Served::Hit.as_str(), "hit");
    /// let stale = Served::Stale { reason: StaleReason::Refreshing };
    /// assert_eq!(stale.to_string(), "stale_refreshing");
    /// ```
    pub fn as_str(self) -> &'static str {
        SERVED_LABELS[self.metric_index()]
    }

    /// Where this outcome's label sits in [`SERVED_LABELS`].
    pub(crate) fn metric_index(self) -> usize {
        match self {
            Served::L1Hit => 0,
            Served::Hit => 1,
            Served::Negative => 2,
            Served::Stale { reason } => match reason {
                StaleReason::Refreshing => 3,
                StaleReason::LoaderFailed => 4,
                StaleReason::SoftTimeout => 5,
                StaleReason::LockTimeout => 6,
                StaleReason::BreakerOpen => 7,
                StaleReason::Overloaded => 8,
                StaleReason::StoreUnavailable => 9,
                StaleReason::PreviousVersion => 10,
            },
            Served::Loaded => 11,
            Served::Coalesced => 12,
            Served::Fallback => 13,
        }
    }
}

impl std::fmt::Display for Served {
    /// [`Served::as_str`].
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a stale value was served.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StaleReason {
    /// Inside grace: served at once while one background refresh runs.
    Refreshing,
    /// The loader failed (or failed recently: the key is throttled).
    LoaderFailed,
    /// The loader was slower than `soft_timeout`; it finishes in the
    /// background and updates the cache.
    SoftTimeout,
    /// Another process held the lease past `lock_wait`.
    LockTimeout,
    /// The origin's circuit breaker is open; the loader was not called.
    BreakerOpen,
    /// The origin's bulkhead was full; the load was shed.
    Overloaded,
    /// The store could not be reached; a local (L1) copy stood in.
    StoreUnavailable,
    /// The key had no entry in this cache's version yet, inside the
    /// version transition: the previous version's entry stood in while one
    /// background load fills this version (see
    /// [`CacheBuilder::version`](crate::CacheBuilder::version)).
    PreviousVersion,
}

/// A value with how it was served; see [`Cache::get_or_load_with_meta`](crate::Cache::get_or_load_with_meta).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched<V> {
    /// The value, or `None` for "does not exist".
    pub value: Option<V>,
    /// How it was served.
    pub served: Served,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The label list and the index match are kept by hand: every outcome
    /// must land on its own label.
    #[test]
    fn every_outcome_has_its_own_label() {
        let stale = |reason| Served::Stale { reason };
        let expected = [
            (Served::L1Hit, "l1_hit"),
            (Served::Hit, "hit"),
            (Served::Negative, "negative"),
            (stale(StaleReason::Refreshing), "stale_refreshing"),
            (stale(StaleReason::LoaderFailed), "stale_loader_failed"),
            (stale(StaleReason::SoftTimeout), "stale_soft_timeout"),
            (stale(StaleReason::LockTimeout), "stale_lock_timeout"),
            (stale(StaleReason::BreakerOpen), "stale_breaker_open"),
            (stale(StaleReason::Overloaded), "stale_overloaded"),
            (
                stale(StaleReason::StoreUnavailable),
                "stale_store_unavailable",
            ),
            (
                stale(StaleReason::PreviousVersion),
                "stale_previous_version",
            ),
            (Served::Loaded, "loaded"),
            (Served::Coalesced, "coalesced"),
            (Served::Fallback, "fallback"),
        ];
        for (served, label) in expected {
            assert_eq!(SERVED_LABELS[served.metric_index()], label, "{served:?}");
            assert_eq!(served.as_str(), label);
            assert_eq!(served.to_string(), label);
        }
        assert_eq!(SERVED_LABELS[SERVED_ERROR], "error");
        assert_eq!(SERVED_LABELS.len(), expected.len() + 1);
    }
}

//! What breakwater reports through the [`metrics`] facade.
//!
//! Install any `metrics` recorder (Prometheus, StatsD, ...) in your
//! application and these appear; without one they cost next to nothing.
//! Every metric carries the cache's `namespace` label.
//!
//! | metric | kind | labels | meaning |
//! |---|---|---|---|
//! | `breakwater_requests_total` | counter | `served`: `hit`, `negative`, `stale_refreshing`, `stale_loader_failed`, `stale_soft_timeout`, `stale_lock_timeout`, `loaded`, `coalesced`, `error` | how each `get_or_load` call was served; negative hits are counted apart from real values |
//! | `breakwater_loads_total` | counter | `outcome`: `value`, `negative`, `error`, `panic`, `timeout` | loader calls made by this process |
//! | `breakwater_load_seconds` | histogram | | how long each loader call took |
//! | `breakwater_lease_total` | counter | `event`: `acquired`, `busy`, `lost`, `revoked` | the key's lease: taken, held by another process (this one waited), lost while loading, or revoked before the write |
//! | `breakwater_unreadable_entries_total` | counter | | stored bytes that did not decode (treated as misses) |
//! | `breakwater_store_errors_total` | counter | `op` | store operations that failed |

use std::sync::Arc;
use std::time::Duration;

use metrics::{SharedString, counter, histogram};

/// The cache's handle on the metrics facade.
#[derive(Debug, Clone)]
pub(crate) struct Metrics {
    namespace: SharedString,
}

impl Metrics {
    pub(crate) fn new(namespace: &str) -> Self {
        Metrics {
            namespace: SharedString::from(Arc::<str>::from(namespace)),
        }
    }

    /// One `get_or_load` call, served as `served`.
    pub(crate) fn served(&self, served: &'static str) {
        counter!("breakwater_requests_total", "namespace" => self.namespace.clone(), "served" => served)
            .increment(1);
    }

    /// One loader call and how long it took.
    pub(crate) fn load(&self, outcome: &'static str, took: Duration) {
        counter!("breakwater_loads_total", "namespace" => self.namespace.clone(), "outcome" => outcome)
            .increment(1);
        histogram!("breakwater_load_seconds", "namespace" => self.namespace.clone())
            .record(took.as_secs_f64());
    }

    /// A lease event.
    pub(crate) fn lease(&self, event: &'static str) {
        counter!("breakwater_lease_total", "namespace" => self.namespace.clone(), "event" => event)
            .increment(1);
    }

    /// Stored bytes that did not decode.
    pub(crate) fn unreadable(&self) {
        counter!("breakwater_unreadable_entries_total", "namespace" => self.namespace.clone())
            .increment(1);
    }

    /// A failed store operation.
    pub(crate) fn store_error(&self, op: &'static str) {
        counter!("breakwater_store_errors_total", "namespace" => self.namespace.clone(), "op" => op)
            .increment(1);
    }
}

//! What breakwater reports through the [`metrics`] facade.
//!
//! Install any `metrics` recorder (Prometheus, StatsD, ...) in your
//! application and these appear; without one they cost next to nothing.
//! Every metric carries the cache's `namespace` label.
//!
//! | metric | kind | labels | meaning |
//! |---|---|---|---|
//! | `breakwater_requests_total` | counter | `served`: `hit`, `negative`, `stale_refreshing`, `stale_loader_failed`, `stale_soft_timeout`, `stale_lock_timeout`, `stale_breaker_open`, `stale_overloaded`, `stale_store_unavailable`, `loaded`, `coalesced`, `fallback`, `error` | how each `get_or_load` call (and each load a warm-up makes) was served ([`Served::as_str`](crate::Served::as_str) gives the same words); negative hits are counted apart from real values |
//! | `breakwater_loads_total` | counter | `outcome`: `value`, `negative`, `error`, `panic`, `timeout` | loader calls made by this process |
//! | `breakwater_load_seconds` | histogram | | how long each loader call took |
//! | `breakwater_lease_total` | counter | `event`: `acquired`, `busy`, `lost`, `revoked` | the key's lease: taken, held by another process (this one waited), lost while loading, or revoked before the write |
//! | `breakwater_unreadable_entries_total` | counter | | stored bytes that did not decode (treated as misses) |
//! | `breakwater_store_errors_total` | counter | `op` | store operations that failed |
//! | `breakwater_key_errors_total` | counter | `op` | store operations refused for one key (a value of another Redis type under it, a script or argument error about it, a value too large for the server): not store failures, never counted by the store breaker; the key's next fenced write replaces it |
//! | `breakwater_too_large_total` | counter | | values not cached because their encoded entry was larger than `max_value_size` (a `set` that failed with `TooLarge`, or a load returned unwritten) |
//! | `breakwater_warm_keys_total` | counter | `outcome`: `loaded`, `cached`, `failed` | keys walked by [`Cache::warm`](crate::Cache::warm) |

use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use metrics::{Counter, Recorder, SharedString, counter, histogram};

/// The request counters, registered with one recorder.
struct Served {
    /// Identifies the recorder the handles belong to.
    recorder: usize,
    counters: Vec<Counter>,
}

/// The request counter's handles: registered once with the first recorder
/// seen (read without a lock on every call after that), and with a later
/// one (a recorder installed after the cache was built) under a mutex.
#[derive(Default)]
struct ServedHandles {
    first: OnceLock<Served>,
    later: Mutex<Option<Served>>,
}

/// The cache's handle on the metrics facade.
///
/// The request counter is on every call's path, so its handles are
/// registered once per recorder rather than looked up on every call (which
/// costs more than an L1 hit); a recorder installed later is noticed and the
/// handles registered again.
#[derive(Clone)]
pub(crate) struct Metrics {
    namespace: SharedString,
    /// Every value of the `served` label, as the cache names them.
    served_labels: &'static [&'static str],
    served: Arc<ServedHandles>,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

/// The current recorder's address, as an identity.
fn recorder_id() -> usize {
    metrics::with_recorder(|r: &dyn Recorder| std::ptr::from_ref(r).cast::<()>() as usize)
}

impl Metrics {
    pub(crate) fn new(namespace: &str, served_labels: &'static [&'static str]) -> Self {
        Metrics {
            namespace: SharedString::from(Arc::<str>::from(namespace)),
            served_labels,
            served: Arc::default(),
        }
    }

    /// One `get_or_load` call, served as `served_labels[index]`.
    pub(crate) fn served(&self, index: usize) {
        let recorder = recorder_id();
        if let Some(h) = self.served.first.get()
            && h.recorder == recorder
        {
            if let Some(counter) = h.counters.get(index) {
                counter.increment(1);
            }
            return;
        }
        self.served_later(recorder, index);
    }

    /// [`served`](Self::served) for a recorder other than the first.
    #[cold]
    fn served_later(&self, recorder: usize, index: usize) {
        let register = || {
            Served {
            recorder,
            counters: self
                .served_labels
                .iter()
                .map(|label| {
                    counter!("breakwater_requests_total", "namespace" => self.namespace.clone(), "served" => *label)
                })
                .collect(),
        }
        };
        let first = self.served.first.get_or_init(register);
        if first.recorder == recorder {
            if let Some(counter) = first.counters.get(index) {
                counter.increment(1);
            }
            return;
        }
        let mut later = self.served.later.lock().unwrap_or_else(|p| p.into_inner());
        let handles = match later.as_mut() {
            Some(h) if h.recorder == recorder => h,
            _ => later.insert(register()),
        };
        if let Some(counter) = handles.counters.get(index) {
            counter.increment(1);
        }
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

    /// A value too large to cache.
    pub(crate) fn too_large(&self) {
        counter!("breakwater_too_large_total", "namespace" => self.namespace.clone()).increment(1);
    }

    /// One key of a warm-up: `loaded`, `cached` or `failed`.
    pub(crate) fn warm(&self, outcome: &'static str) {
        counter!("breakwater_warm_keys_total", "namespace" => self.namespace.clone(), "outcome" => outcome)
            .increment(1);
    }

    /// A store operation refused for one key (not a store failure).
    pub(crate) fn key_error(&self, op: &'static str) {
        counter!("breakwater_key_errors_total", "namespace" => self.namespace.clone(), "op" => op)
            .increment(1);
    }

    /// A failed store operation, unless it was refused for one key (a key
    /// fault, counted by the store guard under `key_errors_total`).
    pub(crate) fn store_failed(&self, op: &'static str, err: &crate::Error) {
        if !err.is_key_fault() {
            self.store_error(op);
        }
    }

    /// A failed store operation.
    fn store_error(&self, op: &'static str) {
        counter!("breakwater_store_errors_total", "namespace" => self.namespace.clone(), "op" => op)
            .increment(1);
    }
}

//! What breakwater reports: through the [`metrics`] facade, and as a
//! snapshot from [`Cache::stats`](crate::Cache::stats) for applications
//! without a metrics stack.
//!
//! Install any `metrics` recorder (Prometheus, StatsD, OpenTelemetry, ...)
//! in your application and these appear; without one they cost next to
//! nothing (the handles on a request's path are registered once per
//! recorder, not looked up per call). Every metric a cache reports carries
//! its `namespace` label; an origin's carry the origin's name (`origin`),
//! which is the namespace unless the cache was given a shared
//! [`Origin`](crate::Origin).
//!
//! When a cache is built it describes every metric to the installed
//! recorder (unit and help text: the `# HELP` and `# TYPE` lines of a
//! Prometheus page) and registers its series: counters at 0, gauges as they
//! stand, every label value below included, so a healthy service's
//! dashboard shows 0 rather than "No data". No label value is empty (the
//! origin's breaker has no `domain` label at all).
//!
//! | metric | kind | labels | meaning |
//! |---|---|---|---|
//! | `breakwater_requests_total` | counter | `namespace`, `served`: `l1_hit`, `hit`, `negative`, `stale_refreshing`, `stale_loader_failed`, `stale_soft_timeout`, `stale_lock_timeout`, `stale_breaker_open`, `stale_overloaded`, `stale_store_unavailable`, `stale_previous_version`, `loaded`, `coalesced`, `fallback`, `error` | how each `get_or_load` call (and each load a warm-up makes) was served, as [`Served::as_str`](crate::Served::as_str) names it (`l1_hit` from the near cache, `hit` from the store); negative hits are counted apart from real values |
//! | `breakwater_errors_total` | counter | `namespace`, `kind`: `loader`, `store`, `codec`, `config`, `invalid_key`, `timeout`, `lock_timeout`, `circuit_open`, `overloaded`, `too_large` | `get_or_load` calls that returned an error, by [`ErrorKind`] (they are also `served="error"` above) |
//! | `breakwater_loads_total` | counter | `namespace`, `origin`, `outcome`: `value`, `negative`, `error`, `panic`, `timeout` | loader calls made by this process |
//! | `breakwater_load_seconds` | histogram | `namespace`, `origin` | how long each loader call took |
//! | `breakwater_loads_in_flight` | gauge | `origin` | loads holding a slot of the origin's bulkhead |
//! | `breakwater_loads_shed_total` | counter | `origin`, `priority`: `foreground`, `background` | loads the bulkhead shed (full, or no rate token in time) |
//! | `breakwater_early_refreshes_total` | counter | `namespace` | background refreshes started before a value went stale (early refresh) |
//! | `breakwater_waiters` | gauge | `namespace` | callers waiting for a load another caller in this process runs |
//! | `breakwater_lease_total` | counter | `namespace`, `event`: `acquired`, `busy`, `lost`, `revoked` | the key's lease: taken, held by another process (this one waited), lost while loading, or revoked before the write |
//! | `breakwater_notices_total` | counter | `namespace`, `event`: `sent`, `received`, `missed` | the namespace's change notices on the Redis channel: published with a write or an invalidation, heard from the bus, or possibly missed (`missed`: once per drop of the subscription; L1 copies are no longer served as fresh until it is back) |
//! | `breakwater_breaker_state` | gauge | `breaker`: `origin` or `store`, `name` (the origin, or the namespace), `domain` (store only: the failure domain's index) | 0 closed, 1 half-open, 2 open; set (closed) when the breaker is built, then on each change |
//! | `breakwater_breaker_transitions_total` | counter | `breaker`, `name`, `domain`, `to`: `open`, `half_open`, `closed` | each change of a breaker's state |
//! | `breakwater_store_seconds` | histogram | `namespace`, `op` | how long each store call took, refused calls excepted |
//! | `breakwater_store_errors_total` | counter | `namespace`, `op` | store operations that failed |
//! | `breakwater_key_errors_total` | counter | `namespace`, `op` | store operations refused for one key (a value of another Redis type under it, a script or argument error about it, a value too large for the server): not store failures, never counted by the store breaker; the key's next fenced write replaces it |
//! | `breakwater_unreadable_entries_total` | counter | `namespace` | stored bytes that did not decode (treated as misses) |
//! | `breakwater_too_large_total` | counter | `namespace` | values not cached because their encoded entry was larger than `max_value_size` (a `set` that failed with `TooLarge`, or a load returned unwritten) |
//! | `breakwater_l1_entries` | gauge | `namespace` | entries in the L1 near cache (set after each insert; moka's count is approximate) |
//! | `breakwater_warm_keys_total` | counter | `namespace`, `outcome`: `loaded`, `cached`, `failed` | keys walked by [`Cache::warm`](crate::Cache::warm) |
//!
//! `op` is one of `get`, `set`, `delete`, `ttl`, `acquire_lease`,
//! `lease_held`, `extend_lease`, `release_lease`, `fenced_set`, `replace`,
//! `replace_many`, `invalidate`, `invalidate_many`, `publish`, `bump_generation` (a tag
//! invalidation), `bump_generations` (an `invalidate_tags`), `tag_generations` (a tagged write's read-or-create of
//! its tags' counters), `pin` (a version transition's pin of the previous
//! version's entry).

use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use metrics::{
    Counter, Gauge, Histogram, Recorder, SharedString, Unit, counter, describe_counter,
    describe_gauge, describe_histogram, gauge, histogram,
};

use crate::breaker::BreakerState;
use crate::error::ErrorKind;
use crate::served::{SERVED_LABELS, StaleReason};

/// The `outcome` labels of `breakwater_loads_total`.
const LOAD_OUTCOMES: [&str; 5] = ["value", "negative", "error", "panic", "timeout"];
/// The `event` labels of `breakwater_lease_total`.
const LEASE_EVENTS: [&str; 4] = ["acquired", "busy", "lost", "revoked"];
/// The `outcome` labels of `breakwater_warm_keys_total`.
const WARM_OUTCOMES: [&str; 3] = ["loaded", "cached", "failed"];
/// The `event` labels of `breakwater_notices_total`.
const NOTICE_EVENTS: [&str; 3] = ["sent", "received", "missed"];
/// The `kind` labels of `breakwater_errors_total`, in [`kind_index`] order.
const ERROR_KINDS: [&str; 10] = [
    "loader",
    "store",
    "codec",
    "config",
    "invalid_key",
    "timeout",
    "lock_timeout",
    "circuit_open",
    "overloaded",
    "too_large",
];
/// The store operations, for `breakwater_store_seconds`.
const STORE_OPS: [&str; 18] = [
    "get",
    "set",
    "delete",
    "ttl",
    "acquire_lease",
    "lease_held",
    "extend_lease",
    "release_lease",
    "fenced_set",
    "replace",
    "replace_many",
    "invalidate",
    "invalidate_many",
    "publish",
    "bump_generation",
    "bump_generations",
    "tag_generations",
    "pin",
];

fn kind_index(kind: ErrorKind) -> usize {
    match kind {
        ErrorKind::Loader => 0,
        ErrorKind::Store => 1,
        ErrorKind::Codec => 2,
        ErrorKind::Config => 3,
        ErrorKind::InvalidKey => 4,
        ErrorKind::Timeout => 5,
        ErrorKind::LockTimeout => 6,
        ErrorKind::CircuitOpen => 7,
        ErrorKind::Overloaded => 8,
        ErrorKind::TooLarge => 9,
    }
}

fn kind_of(index: usize) -> ErrorKind {
    [
        ErrorKind::Loader,
        ErrorKind::Store,
        ErrorKind::Codec,
        ErrorKind::Config,
        ErrorKind::InvalidKey,
        ErrorKind::Timeout,
        ErrorKind::LockTimeout,
        ErrorKind::CircuitOpen,
        ErrorKind::Overloaded,
        ErrorKind::TooLarge,
    ][index]
}

/// The stale reasons in `served` label order.
const STALE_REASONS: [StaleReason; 8] = [
    StaleReason::Refreshing,
    StaleReason::LoaderFailed,
    StaleReason::SoftTimeout,
    StaleReason::LockTimeout,
    StaleReason::BreakerOpen,
    StaleReason::Overloaded,
    StaleReason::StoreUnavailable,
    StaleReason::PreviousVersion,
];

/// Gives the installed recorder every metric's unit and help text (the
/// `# HELP` lines of a Prometheus page). Called when a cache is built.
fn describe() {
    describe_counter!(
        "breakwater_requests_total",
        Unit::Count,
        "Cache calls (get_or_load, and loads a warm-up makes) by how they were served."
    );
    describe_counter!(
        "breakwater_errors_total",
        Unit::Count,
        "Cache calls that returned an error, by error kind."
    );
    describe_counter!(
        "breakwater_loads_total",
        Unit::Count,
        "Loader calls this process made, by outcome."
    );
    describe_histogram!(
        "breakwater_load_seconds",
        Unit::Seconds,
        "How long each loader call took."
    );
    describe_gauge!(
        "breakwater_loads_in_flight",
        Unit::Count,
        "Loads holding a slot of the origin's bulkhead."
    );
    describe_counter!(
        "breakwater_loads_shed_total",
        Unit::Count,
        "Loads the origin's bulkhead shed (full, or no rate token in time), by priority."
    );
    describe_counter!(
        "breakwater_early_refreshes_total",
        Unit::Count,
        "Background refreshes started before a value went stale."
    );
    describe_gauge!(
        "breakwater_waiters",
        Unit::Count,
        "Callers waiting for a load or a read another caller in this process runs."
    );
    describe_counter!(
        "breakwater_lease_total",
        Unit::Count,
        "Lease events: acquired, busy (held by another process), lost while loading, revoked before the write."
    );
    describe_counter!(
        "breakwater_notices_total",
        Unit::Count,
        "Change notices on the namespace's Redis channel: sent, received, possibly missed."
    );
    describe_gauge!(
        "breakwater_breaker_state",
        Unit::Count,
        "Circuit breaker state: 0 closed, 1 half-open, 2 open."
    );
    describe_counter!(
        "breakwater_breaker_transitions_total",
        Unit::Count,
        "Circuit breaker state changes, by the state changed to."
    );
    describe_histogram!(
        "breakwater_store_seconds",
        Unit::Seconds,
        "How long each store call took, by operation (refused calls excepted)."
    );
    describe_counter!(
        "breakwater_store_errors_total",
        Unit::Count,
        "Store operations that failed, by operation."
    );
    describe_counter!(
        "breakwater_key_errors_total",
        Unit::Count,
        "Store operations refused for one key (wrong Redis type, too large for the server): not store failures."
    );
    describe_counter!(
        "breakwater_unreadable_entries_total",
        Unit::Count,
        "Stored entries that did not decode as this cache's value type (treated as misses)."
    );
    describe_counter!(
        "breakwater_too_large_total",
        Unit::Count,
        "Values not cached because their encoded entry was larger than max_value_size."
    );
    describe_gauge!(
        "breakwater_l1_entries",
        Unit::Count,
        "Entries in the L1 near cache (approximate)."
    );
    describe_counter!(
        "breakwater_warm_keys_total",
        Unit::Count,
        "Keys walked by Cache::warm, by outcome."
    );
}

/// The current recorder's address, as an identity.
fn recorder_id() -> usize {
    metrics::with_recorder(|r: &dyn Recorder| std::ptr::from_ref(r).cast::<()>() as usize)
}

/// Metric handles registered with one recorder: registered once with the
/// first recorder seen (read without a lock on every call after that), and
/// with a later one (a recorder installed after the cache was built) under
/// a mutex.
struct Handles<T> {
    first: OnceLock<(usize, T)>,
    later: Mutex<Option<(usize, T)>>,
}

impl<T> Default for Handles<T> {
    fn default() -> Self {
        Handles {
            first: OnceLock::new(),
            later: Mutex::new(None),
        }
    }
}

impl<T> Handles<T> {
    /// Runs `use_` on the current recorder's handles, registering them
    /// with `register` the first time that recorder is seen.
    fn with(&self, register: impl Fn() -> T, use_: impl FnOnce(&T)) {
        let recorder = recorder_id();
        if let Some((id, handles)) = self.first.get()
            && *id == recorder
        {
            return use_(handles);
        }
        self.with_later(recorder, register, use_);
    }

    #[cold]
    fn with_later(&self, recorder: usize, register: impl Fn() -> T, use_: impl FnOnce(&T)) {
        let (id, handles) = self.first.get_or_init(|| (recorder, register()));
        if *id == recorder {
            return use_(handles);
        }
        let mut later = self.later.lock().unwrap_or_else(|p| p.into_inner());
        let (_, handles) = match later.as_mut() {
            Some(h) if h.0 == recorder => h,
            _ => later.insert((recorder, register())),
        };
        use_(handles);
    }
}

/// The running counts behind [`Stats`]: relaxed atomics, one add per event.
#[derive(Default)]
struct EventCounts {
    served: [AtomicU64; SERVED_LABELS.len()],
    errors: [AtomicU64; ERROR_KINDS.len()],
    loads: [AtomicU64; LOAD_OUTCOMES.len()],
    leases: [AtomicU64; LEASE_EVENTS.len()],
    notices: [AtomicU64; NOTICE_EVENTS.len()],
    early_refreshes: AtomicU64,
    shed: AtomicU64,
    store_errors: AtomicU64,
    key_errors: AtomicU64,
    unreadable: AtomicU64,
    too_large: AtomicU64,
    waiters: AtomicI64,
}

fn add(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

fn read(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// A cache's handle on the metrics facade, and its running counts.
///
/// The request counter and the store's latency histogram are on every
/// call's path, so their handles are registered once per recorder rather
/// than looked up on every call (which costs more than an L1 hit).
#[derive(Clone)]
pub(crate) struct Metrics {
    namespace: SharedString,
    origin: SharedString,
    served: Arc<Handles<Vec<Counter>>>,
    store: Arc<Handles<Vec<Histogram>>>,
    waiters: Arc<Handles<Gauge>>,
    l1_entries: Arc<Handles<Gauge>>,
    counts: Arc<EventCounts>,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics")
            .field("namespace", &self.namespace)
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

impl Metrics {
    /// The metrics of cache `namespace`, loading from origin `origin`.
    pub(crate) fn new(namespace: &str, origin: &str) -> Self {
        Metrics {
            namespace: SharedString::from(Arc::<str>::from(namespace)),
            origin: SharedString::from(Arc::<str>::from(origin)),
            served: Arc::default(),
            store: Arc::default(),
            waiters: Arc::default(),
            l1_entries: Arc::default(),
            counts: Arc::default(),
        }
    }

    /// Describes every metric to the installed recorder and registers
    /// this cache's series at 0 (counters) or as they stand (gauges), so a
    /// healthy service's dashboard shows 0 where nothing happened yet
    /// rather than no data. Adding 0 leaves a series another cache of the
    /// same namespace or origin already counts as it is. Called when the
    /// cache is built; a recorder installed later gets the series as
    /// events happen.
    pub(crate) fn register(&self) {
        describe();
        let ns = || self.namespace.clone();
        let origin = || self.origin.clone();
        self.served.with(
            || self.served_counters(),
            |counters: &Vec<Counter>| counters.iter().for_each(|c| c.increment(0)),
        );
        self.store.with(|| self.store_histograms(), |_| {});
        self.waiters.with(
            || gauge!("breakwater_waiters", "namespace" => ns()),
            |gauge: &Gauge| gauge.increment(0.0),
        );
        self.l1_entries.with(
            || gauge!("breakwater_l1_entries", "namespace" => ns()),
            |gauge: &Gauge| gauge.increment(0.0),
        );
        for kind in ERROR_KINDS {
            counter!("breakwater_errors_total", "namespace" => ns(), "kind" => kind).increment(0);
        }
        for outcome in LOAD_OUTCOMES {
            counter!("breakwater_loads_total", "namespace" => ns(), "origin" => origin(), "outcome" => outcome)
                .increment(0);
        }
        // Registering is all a histogram needs here (no sample to record).
        drop(histogram!("breakwater_load_seconds", "namespace" => ns(), "origin" => origin()));
        gauge!("breakwater_loads_in_flight", "origin" => origin()).increment(0.0);
        for priority in ["foreground", "background"] {
            counter!("breakwater_loads_shed_total", "origin" => origin(), "priority" => priority)
                .increment(0);
        }
        counter!("breakwater_early_refreshes_total", "namespace" => ns()).increment(0);
        for event in LEASE_EVENTS {
            counter!("breakwater_lease_total", "namespace" => ns(), "event" => event).increment(0);
        }
        for event in NOTICE_EVENTS {
            counter!("breakwater_notices_total", "namespace" => ns(), "event" => event)
                .increment(0);
        }
        for op in STORE_OPS {
            counter!("breakwater_store_errors_total", "namespace" => ns(), "op" => op).increment(0);
            counter!("breakwater_key_errors_total", "namespace" => ns(), "op" => op).increment(0);
        }
        counter!("breakwater_unreadable_entries_total", "namespace" => ns()).increment(0);
        counter!("breakwater_too_large_total", "namespace" => ns()).increment(0);
        for outcome in WARM_OUTCOMES {
            counter!("breakwater_warm_keys_total", "namespace" => ns(), "outcome" => outcome)
                .increment(0);
        }
    }

    /// The request counters, one per `served` label, in label order.
    fn served_counters(&self) -> Vec<Counter> {
        SERVED_LABELS
            .iter()
            .map(|label| {
                counter!("breakwater_requests_total", "namespace" => self.namespace.clone(), "served" => *label)
            })
            .collect()
    }

    /// The store latency histograms, one per operation, in `STORE_OPS`
    /// order.
    fn store_histograms(&self) -> Vec<Histogram> {
        STORE_OPS
            .iter()
            .map(|op| {
                histogram!("breakwater_store_seconds", "namespace" => self.namespace.clone(), "op" => *op)
            })
            .collect()
    }

    /// One `get_or_load` call, served as `SERVED_LABELS[index]`.
    pub(crate) fn served(&self, index: usize) {
        if let Some(count) = self.counts.served.get(index) {
            add(count);
        }
        self.served.with(
            || self.served_counters(),
            |counters: &Vec<Counter>| {
                if let Some(counter) = counters.get(index) {
                    counter.increment(1);
                }
            },
        );
    }

    /// One `get_or_load` call that returned an error of `kind`.
    pub(crate) fn error(&self, kind: ErrorKind) {
        let index = kind_index(kind);
        add(&self.counts.errors[index]);
        counter!("breakwater_errors_total", "namespace" => self.namespace.clone(), "kind" => ERROR_KINDS[index])
            .increment(1);
    }

    /// One loader call and how long it took.
    pub(crate) fn load(&self, outcome: &'static str, took: Duration) {
        if let Some(i) = LOAD_OUTCOMES.iter().position(|o| *o == outcome) {
            add(&self.counts.loads[i]);
        }
        counter!("breakwater_loads_total", "namespace" => self.namespace.clone(), "origin" => self.origin.clone(), "outcome" => outcome)
            .increment(1);
        histogram!("breakwater_load_seconds", "namespace" => self.namespace.clone(), "origin" => self.origin.clone())
            .record(took.as_secs_f64());
    }

    /// A load the origin's bulkhead shed.
    pub(crate) fn shed(&self, priority: &'static str) {
        add(&self.counts.shed);
        counter!("breakwater_loads_shed_total", "origin" => self.origin.clone(), "priority" => priority)
            .increment(1);
    }

    /// The loads holding a slot of the origin's bulkhead.
    pub(crate) fn loads_in_flight(&self, n: u32) {
        gauge!("breakwater_loads_in_flight", "origin" => self.origin.clone()).set(f64::from(n));
    }

    /// A background refresh started before the value went stale.
    pub(crate) fn early_refresh(&self) {
        add(&self.counts.early_refreshes);
        counter!("breakwater_early_refreshes_total", "namespace" => self.namespace.clone())
            .increment(1);
    }

    /// A caller waits for a load (or a read) another caller in this
    /// process runs, until the guard is dropped.
    pub(crate) fn waiting(&self) -> WaitingGuard<'_> {
        self.waiters(1);
        WaitingGuard(self)
    }

    fn waiters(&self, delta: i64) {
        let now = self.counts.waiters.fetch_add(delta, Ordering::Relaxed) + delta;
        let register = || gauge!("breakwater_waiters", "namespace" => self.namespace.clone());
        self.waiters
            .with(register, |gauge: &Gauge| gauge.set(now as f64));
    }

    /// A lease event: `acquired`, `busy`, `lost` or `revoked`.
    pub(crate) fn lease(&self, event: &'static str) {
        if let Some(i) = LEASE_EVENTS.iter().position(|e| *e == event) {
            add(&self.counts.leases[i]);
        }
        counter!("breakwater_lease_total", "namespace" => self.namespace.clone(), "event" => event)
            .increment(1);
    }

    /// A change notice `sent`, `received` or possibly `missed`, `n` times.
    pub(crate) fn notices(&self, event: &'static str, n: u64) {
        if let Some(i) = NOTICE_EVENTS.iter().position(|e| *e == event) {
            self.counts.notices[i].fetch_add(n, Ordering::Relaxed);
        }
        counter!("breakwater_notices_total", "namespace" => self.namespace.clone(), "event" => event)
            .increment(n);
    }

    /// One store call `op` that the store answered (or failed) after
    /// `took`.
    pub(crate) fn store_call(&self, op: &'static str, took: Duration) {
        let Some(index) = STORE_OPS.iter().position(|o| *o == op) else {
            return;
        };
        self.store.with(
            || self.store_histograms(),
            |histograms: &Vec<Histogram>| {
                histograms[index].record(took.as_secs_f64());
            },
        );
    }

    /// The L1 near cache holds `n` entries.
    pub(crate) fn l1_entries(&self, n: u64) {
        // After every L1 insert (a store hit with L1 on): the handle is
        // registered once per recorder, like the request counter's.
        let register = || gauge!("breakwater_l1_entries", "namespace" => self.namespace.clone());
        self.l1_entries
            .with(register, |gauge: &Gauge| gauge.set(n as f64));
    }

    /// Stored bytes that did not decode.
    pub(crate) fn unreadable(&self) {
        add(&self.counts.unreadable);
        counter!("breakwater_unreadable_entries_total", "namespace" => self.namespace.clone())
            .increment(1);
    }

    /// A value too large to cache.
    pub(crate) fn too_large(&self) {
        add(&self.counts.too_large);
        counter!("breakwater_too_large_total", "namespace" => self.namespace.clone()).increment(1);
    }

    /// One key of a warm-up: `loaded`, `cached` or `failed`.
    pub(crate) fn warm(&self, outcome: &'static str) {
        counter!("breakwater_warm_keys_total", "namespace" => self.namespace.clone(), "outcome" => outcome)
            .increment(1);
    }

    /// A store operation refused for one key (not a store failure).
    pub(crate) fn key_error(&self, op: &'static str) {
        add(&self.counts.key_errors);
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

    /// A read given up on at its soft deadline (its caller served a
    /// stand-in): counted as a failed `get`, as a timed-out one is.
    pub(crate) fn store_overdue(&self) {
        self.store_error("get");
    }

    /// A failed store operation.
    fn store_error(&self, op: &'static str) {
        add(&self.counts.store_errors);
        counter!("breakwater_store_errors_total", "namespace" => self.namespace.clone(), "op" => op)
            .increment(1);
    }

    /// The counts so far, with what is read live (the breakers' states,
    /// the loads in flight, L1's entries) as given.
    pub(crate) fn stats(
        &self,
        (origin_breaker, origin_breaker_openings): (BreakerState, u64),
        store_breaker: BreakerState,
        loads_in_flight: u32,
        l1_entries: u64,
    ) -> Stats {
        let c = &self.counts;
        let served = |i: usize| read(&c.served[i]);
        let index = |s: Served| served(s.metric_index());
        let stale = STALE_REASONS
            .iter()
            .map(|reason| (*reason, index(Served::Stale { reason: *reason })))
            .filter(|(_, n)| *n > 0)
            .collect();
        let errors = (0..ERROR_KINDS.len())
            .map(|i| (kind_of(i), read(&c.errors[i])))
            .filter(|(_, n)| *n > 0)
            .collect();
        let loads = |i: usize| read(&c.loads[i]);
        let leases = |i: usize| read(&c.leases[i]);
        let notices = |i: usize| read(&c.notices[i]);
        Stats {
            requests: c.served.iter().map(read).sum(),
            l1_hits: index(Served::L1Hit),
            store_hits: index(Served::Hit),
            negative_hits: index(Served::Negative),
            stale,
            loaded: index(Served::Loaded),
            coalesced: index(Served::Coalesced),
            fallback: index(Served::Fallback),
            errors,
            loads: LoadStats {
                value: loads(0),
                negative: loads(1),
                error: loads(2),
                panic: loads(3),
                timeout: loads(4),
            },
            early_refreshes: read(&c.early_refreshes),
            shed_loads: read(&c.shed),
            leases: LeaseStats {
                acquired: leases(0),
                busy: leases(1),
                lost: leases(2),
                revoked: leases(3),
            },
            notices: NoticeStats {
                sent: notices(0),
                received: notices(1),
                missed: notices(2),
            },
            store_errors: read(&c.store_errors),
            key_errors: read(&c.key_errors),
            unreadable: read(&c.unreadable),
            too_large: read(&c.too_large),
            waiters: u64::try_from(c.waiters.load(Ordering::Relaxed)).unwrap_or(0),
            l1_entries,
            origin_breaker,
            origin_breaker_openings,
            store_breaker,
            loads_in_flight,
        }
    }
}

/// One caller counted in `breakwater_waiters` while it lives.
pub(crate) struct WaitingGuard<'a>(&'a Metrics);

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        self.0.waiters(-1);
    }
}

/// A snapshot of one cache's counts since it was built, from
/// [`Cache::stats`](crate::Cache::stats): what the metrics report, for
/// applications without a metrics stack. Counting costs one relaxed atomic
/// add per event; taking a snapshot reads them (no lock on a request's
/// path).
///
/// [`Display`](fmt::Display) prints it as a few lines.
///
/// # Examples
///
/// ```
/// use breakwater_cache::Cache;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), breakwater_cache::Error> {
/// let cache = Cache::<u64>::builder().build()?;
/// let load = || async { Ok::<_, std::io::Error>(Some(1)) };
/// cache.get_or_load("k", load).await?;
/// cache.get_or_load("k", load).await?;
/// let stats = cache.stats();
/// assert_eq!((stats.requests, stats.loaded, stats.store_hits), (2, 1, 1));
/// assert_eq!(stats.hit_ratio(), 0.5);
/// println!("{stats}");
/// # Ok(()) }
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    /// `get_or_load` calls (and loads a warm-up made), however served.
    pub requests: u64,
    /// Served fresh from the L1 near cache.
    pub l1_hits: u64,
    /// Served fresh from the store.
    pub store_hits: u64,
    /// Served a cached "does not exist".
    pub negative_hits: u64,
    /// Served stale, by reason (reasons that happened only).
    pub stale: Vec<(StaleReason, u64)>,
    /// Served by a load this call ran.
    pub loaded: u64,
    /// Served by a load another caller ran (in this process or another).
    pub coalesced: u64,
    /// Served by the fallback value.
    pub fallback: u64,
    /// Calls that returned an error, by kind (kinds that happened only).
    pub errors: Vec<(ErrorKind, u64)>,
    /// Loader calls made by this process, by outcome.
    pub loads: LoadStats,
    /// Background refreshes started before a value went stale.
    pub early_refreshes: u64,
    /// Loads the origin's bulkhead shed.
    pub shed_loads: u64,
    /// Lease events.
    pub leases: LeaseStats,
    /// Change notices on the namespace's channel.
    pub notices: NoticeStats,
    /// Store calls that failed (key faults excepted).
    pub store_errors: u64,
    /// Store calls refused for one key (not store failures).
    pub key_errors: u64,
    /// Stored entries that did not decode (served as misses).
    pub unreadable: u64,
    /// Values not cached because they were larger than `max_value_size`.
    pub too_large: u64,
    /// Callers waiting now for a load another caller in this process runs.
    pub waiters: u64,
    /// Entries in L1 (moka's approximate count; 0 without L1).
    pub l1_entries: u64,
    /// The origin's circuit breaker now.
    pub origin_breaker: BreakerState,
    /// Times the origin's breaker has opened (shared origins: by any cache).
    pub origin_breaker_openings: u64,
    /// The store's circuit breaker now (the worst of a cluster's).
    pub store_breaker: BreakerState,
    /// Loads holding a slot of the origin's bulkhead now.
    pub loads_in_flight: u32,
}

/// Loader calls by outcome; see [`Stats::loads`].
#[non_exhaustive]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadStats {
    /// Returned a value.
    pub value: u64,
    /// Returned "does not exist".
    pub negative: u64,
    /// Returned an error.
    pub error: u64,
    /// Panicked.
    pub panic: u64,
    /// Ran past `load_timeout`.
    pub timeout: u64,
}

impl LoadStats {
    /// Every loader call.
    pub fn total(&self) -> u64 {
        self.value + self.negative + self.error + self.panic + self.timeout
    }
}

/// Lease events; see [`Stats::leases`].
#[non_exhaustive]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaseStats {
    /// Leases this process took.
    pub acquired: u64,
    /// Leases found held by another process (this one waited).
    pub busy: u64,
    /// Leases lost while loading.
    pub lost: u64,
    /// Leases revoked (an invalidation) before the write.
    pub revoked: u64,
}

/// Change notices; see [`Stats::notices`].
#[non_exhaustive]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NoticeStats {
    /// Published with a write or an invalidation.
    pub sent: u64,
    /// Heard from the bus (own ones included).
    pub received: u64,
    /// Times the subscription dropped (notices may have been missed).
    pub missed: u64,
}

impl Stats {
    /// Calls served from a cache (L1, store or a negative entry), fresh or
    /// stale, over all calls; 0 before the first call.
    pub fn hit_ratio(&self) -> f64 {
        if self.requests == 0 {
            return 0.0;
        }
        let hits = self.l1_hits + self.store_hits + self.negative_hits + self.stale_served();
        hits as f64 / self.requests as f64
    }

    /// Calls served a stale value, for any reason.
    pub fn stale_served(&self) -> u64 {
        self.stale.iter().map(|(_, n)| n).sum()
    }

    /// Calls that returned an error.
    pub fn errors_total(&self) -> u64 {
        self.errors.iter().map(|(_, n)| n).sum()
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "requests {}  hit ratio {:.1}%  (l1 {}, store {}, negative {}, stale {})",
            self.requests,
            self.hit_ratio() * 100.0,
            self.l1_hits,
            self.store_hits,
            self.negative_hits,
            self.stale_served()
        )?;
        write!(f, "stale")?;
        if self.stale.is_empty() {
            write!(f, " none")?;
        }
        for (reason, n) in &self.stale {
            write!(f, " {}={n}", Served::Stale { reason: *reason }.as_str())?;
        }
        writeln!(
            f,
            "\nloaded {}  coalesced {}  fallback {}  errors {}",
            self.loaded,
            self.coalesced,
            self.fallback,
            self.errors_total()
        )?;
        if !self.errors.is_empty() {
            write!(f, "errors")?;
            for (kind, n) in &self.errors {
                write!(f, " {}={n}", ERROR_KINDS[kind_index(*kind)])?;
            }
            writeln!(f)?;
        }
        let l = &self.loads;
        writeln!(
            f,
            "loader calls {} (value {}, negative {}, error {}, panic {}, timeout {})  early refreshes {}  shed {}",
            l.total(),
            l.value,
            l.negative,
            l.error,
            l.panic,
            l.timeout,
            self.early_refreshes,
            self.shed_loads
        )?;
        let (le, n) = (&self.leases, &self.notices);
        writeln!(
            f,
            "leases: acquired {}, busy {}, lost {}, revoked {}  notices: sent {}, received {}, missed {}",
            le.acquired, le.busy, le.lost, le.revoked, n.sent, n.received, n.missed
        )?;
        writeln!(
            f,
            "store errors {}  key errors {}  unreadable {}  too large {}",
            self.store_errors, self.key_errors, self.unreadable, self.too_large
        )?;
        write!(
            f,
            "breakers: origin {} (opened {} times), store {}  loads in flight {}  waiters {}  l1 entries {}",
            state_name(self.origin_breaker),
            self.origin_breaker_openings,
            state_name(self.store_breaker),
            self.loads_in_flight,
            self.waiters,
            self.l1_entries
        )
    }
}

fn state_name(state: BreakerState) -> &'static str {
    match state {
        BreakerState::Closed => "closed",
        BreakerState::HalfOpen => "half-open",
        BreakerState::Open => "open",
    }
}

use crate::served::Served;

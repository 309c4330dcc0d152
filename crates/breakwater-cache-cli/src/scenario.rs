//! What `simulate` and `demo` run: a [`Scenario`] (a keyspace written at
//! once, a database, traffic, the strategies to compare) and the one
//! runner that plays it once per strategy and measures an [`Outcome`]
//! each.
//!
//! `simulate` builds its scenario from the command line; `demo`'s four
//! stories (avalanche, stampede, outage, clear) are named scenarios. Every
//! strategy runs on a fresh paused runtime with its own memory store and
//! database, so strategies cannot disturb each other and a seed gives the
//! same figures every time.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use breakwater_cache::{
    BreakerConfig, BreakerState, Cache, ClearMode, EarlyRefresh, Error, Jitter, LimitConfig,
    MemoryStore, Origin,
};
use indicatif::ProgressBar;
use tokio::time::Instant;

use crate::db::{self, Database};
use crate::outcome::{Cleared, Outcome};
use crate::traffic::{self, Client, Expiries, Traffic};

/// One comparison: every strategy meets the same keys, database and
/// traffic.
#[derive(Debug, Clone)]
pub(crate) struct Scenario {
    /// Keys `0..keys`, written before the traffic starts.
    pub(crate) keys: usize,
    /// `None`: the keys are written at once; else in even slices over
    /// this long before the traffic (every age, as in a running service).
    pub(crate) warm_up: Option<Duration>,
    /// When, from the traffic's start, the data changes and each
    /// breakwater strategy with a [`CacheSpec::clear`] clears its
    /// namespace.
    pub(crate) clear_at: Option<Duration>,
    /// The database behind the cache.
    pub(crate) db: DatabaseSpec,
    /// How requests arrive.
    pub(crate) traffic: Traffic,
    /// Seconds of per-second counts (charts, peaks).
    pub(crate) seconds: usize,
    /// A guarded origin the breakwater strategies load through; its
    /// breaker's state changes are part of the outcome.
    pub(crate) origin: Option<OriginSpec>,
    /// The strategies, in the order of the outcomes.
    pub(crate) strategies: Vec<Strategy>,
    /// Seed of the jitter, the origin and the request draws.
    pub(crate) seed: u64,
}

/// The simulated database: latency, capacity, outage.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DatabaseSpec {
    /// How long a query takes within capacity.
    pub(crate) latency: Duration,
    /// Queries served at `latency` at once; `None`: no limit.
    pub(crate) capacity: Option<usize>,
    /// Down from the first duration on, for the second.
    pub(crate) outage: Option<(Duration, Duration)>,
}

impl DatabaseSpec {
    /// A database taking `latency` a query, no limit, no outage.
    pub(crate) fn new(latency: Duration) -> Self {
        DatabaseSpec {
            latency,
            capacity: None,
            outage: None,
        }
    }

    /// Slower past `capacity` queries at once.
    pub(crate) fn capacity(self, capacity: usize) -> Self {
        DatabaseSpec {
            capacity: Some(capacity),
            ..self
        }
    }

    /// Down from `start` for `length`.
    pub(crate) fn outage(self, start: Duration, length: Duration) -> Self {
        DatabaseSpec {
            outage: Some((start, length)),
            ..self
        }
    }

    /// The database, counting from now.
    fn start(self) -> Database {
        let mut db = Database::new(self.latency);
        if let Some(capacity) = self.capacity {
            db = db.with_capacity(capacity);
        }
        if let Some((start, length)) = self.outage {
            db = db.with_outage(start, length);
        }
        db
    }
}

/// An origin's guards: its breaker and its bulkhead.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OriginSpec {
    /// The circuit breaker.
    pub(crate) breaker: BreakerConfig,
    /// The bulkhead.
    pub(crate) limit: LimitConfig,
}

impl OriginSpec {
    /// The origin, named `database`, seeded.
    fn build(self, seed: u64) -> Result<Origin, Error> {
        Ok(Origin::builder("database")
            .breaker(self.breaker)
            .limit(self.limit)
            .rng_seed(seed)
            .build()?)
    }
}

/// A named way of caching.
#[derive(Debug, Clone)]
pub(crate) struct Strategy {
    /// Its name in tables, charts and JSON: `naive`, `breakwater`, ...
    pub(crate) name: &'static str,
    /// How it caches.
    pub(crate) kind: Kind,
}

/// How a strategy caches.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    /// `GET`; on a miss query and `SET` with the one TTL.
    Naive {
        /// The TTL of every write.
        ttl: Duration,
    },
    /// breakwater's `get_or_load`, as `CacheSpec` builds it.
    Breakwater(CacheSpec),
}

impl Strategy {
    /// The naive cache, writing with `ttl`.
    pub(crate) fn naive(name: &'static str, ttl: Duration) -> Self {
        Strategy {
            name,
            kind: Kind::Naive { ttl },
        }
    }

    /// breakwater, built as `spec` says.
    pub(crate) fn breakwater(name: &'static str, spec: CacheSpec) -> Self {
        Strategy {
            name,
            kind: Kind::Breakwater(spec),
        }
    }
}

/// A breakwater cache's settings; the library's default for any not
/// given.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CacheSpec {
    /// The TTL.
    pub(crate) ttl: Duration,
    /// The TTL jitter.
    pub(crate) jitter: Jitter,
    /// The grace (stale-while-revalidate) window.
    pub(crate) grace: Option<Duration>,
    /// Early refresh.
    pub(crate) early_refresh: Option<EarlyRefresh>,
    /// How long a stale value may stand in for a failing load.
    pub(crate) max_stale: Option<Duration>,
    /// How it clears its namespace at the scenario's `clear_at`.
    pub(crate) clear: Option<ClearMode>,
}

impl CacheSpec {
    /// A cache with `ttl` and `jitter`, the rest the library's defaults.
    pub(crate) fn new(ttl: Duration, jitter: Jitter) -> Self {
        CacheSpec {
            ttl,
            jitter,
            grace: None,
            early_refresh: None,
            max_stale: None,
            clear: None,
        }
    }

    /// Clearing its namespace with `mode` at the scenario's `clear_at`.
    pub(crate) fn clear(self, mode: ClearMode) -> Self {
        CacheSpec {
            clear: Some(mode),
            ..self
        }
    }

    /// With a grace window of `grace`.
    pub(crate) fn grace(self, grace: Duration) -> Self {
        CacheSpec {
            grace: Some(grace),
            ..self
        }
    }

    /// With early refresh `early_refresh`.
    pub(crate) fn early_refresh(self, early_refresh: EarlyRefresh) -> Self {
        CacheSpec {
            early_refresh: Some(early_refresh),
            ..self
        }
    }

    /// With stale values served for up to `max_stale` while loads fail.
    pub(crate) fn max_stale(self, max_stale: Duration) -> Self {
        CacheSpec {
            max_stale: Some(max_stale),
            ..self
        }
    }

    /// The cache on `store`, seeded, loading through `origin` if given.
    ///
    /// # Errors
    ///
    /// A [`Config`](breakwater_cache::ErrorKind::Config) error for settings
    /// the library rejects.
    pub(crate) fn build(
        &self,
        store: &MemoryStore,
        seed: u64,
        origin: Option<&Origin>,
    ) -> Result<Cache<u64>, Error> {
        let mut builder = traffic::builder(store, self.jitter, seed).ttl(self.ttl);
        if let Some(grace) = self.grace {
            builder = builder.grace(grace);
        }
        if let Some(early_refresh) = self.early_refresh {
            builder = builder.early_refresh(early_refresh);
        }
        if let Some(max_stale) = self.max_stale {
            builder = builder.max_stale(max_stale);
        }
        if let Some(origin) = origin {
            builder = builder.origin(origin.clone());
        }
        Ok(builder.build()?)
    }
}

/// Runs every strategy of `scenario`, each on a fresh paused runtime;
/// `progress` advances by one per request.
///
/// # Errors
///
/// A [`Config`](breakwater_cache::ErrorKind::Config) error for settings
/// the library rejects; a store error.
pub(crate) fn run(
    scenario: &Scenario,
    progress: Option<&ProgressBar>,
) -> Result<Vec<Outcome>, Error> {
    scenario
        .strategies
        .iter()
        .map(|strategy| traffic::paused_runtime().block_on(play(scenario, strategy, progress)))
        .collect()
}

/// One strategy on the current (paused) runtime: the bulk write, its
/// expiries read back, then the traffic.
async fn play(
    scenario: &Scenario,
    strategy: &Strategy,
    progress: Option<&ProgressBar>,
) -> Result<Outcome, Error> {
    let store = MemoryStore::new();
    let origin = match scenario.origin {
        Some(spec) => Some(spec.build(scenario.seed)?),
        None => None,
    };
    let client = match strategy.kind {
        Kind::Naive { ttl } => Client::Naive { store, ttl },
        Kind::Breakwater(spec) => {
            Client::Breakwater(spec.build(&store, scenario.seed, origin.as_ref())?)
        }
    };
    match scenario.warm_up {
        None => client.preload(0..scenario.keys).await?,
        Some(span) => client.preload_over(scenario.keys, span).await?,
    }
    // Counting from the traffic's start.
    let db = Arc::new(scenario.db.start());
    let expiries_ms = client.expiries_ms(scenario.keys).await?;
    let breaker: Transitions = Arc::default();
    let watch = origin.map(|origin| tokio::spawn(watch_breaker(origin, Arc::clone(&breaker))));
    let clear = match (&client, strategy.kind, scenario.clear_at) {
        (Client::Breakwater(cache), Kind::Breakwater(spec), Some(at)) => spec
            .clear
            .map(|mode| tokio::spawn(clear_later(cache.clone(), Arc::clone(&db), at, mode))),
        _ => None,
    };
    let tally = traffic::run(&client, &db, &scenario.traffic, &expiries_ms, progress).await;
    if let Some(watch) = watch {
        watch.abort();
    }
    let cleared = match clear {
        // A panic is a bug: the run fails as any panicking story does.
        Some(clear) => Some(
            clear
                .await
                .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))?,
        ),
        None => None,
    };
    let started = db.started_ms();
    let expiries: Vec<u64> = expiries_ms.into_iter().flatten().collect();
    let breaker = std::mem::take(&mut *lock(&breaker));
    let mut outcome = Outcome::new(
        strategy.name,
        Expiries::of(&expiries),
        db::per_second(&started, scenario.seconds),
        &db,
        db::bursts(&started),
        tally,
        breaker,
    );
    outcome.cleared = cleared;
    Ok(outcome)
}

/// At `at` from now the data changes, and `cache` clears its namespace
/// with `mode`; once it returned, values from before are outdated. Answers
/// when it began and how long it took, in seconds.
///
/// # Errors
///
/// The clear's.
async fn clear_later(
    cache: Cache<u64>,
    db: Arc<Database>,
    at: Duration,
    mode: ClearMode,
) -> Result<Cleared, Error> {
    let began = Instant::now();
    tokio::time::sleep(at).await;
    let epoch = db.change();
    let start = Instant::now();
    cache.clear(mode).await?;
    db.settle(epoch);
    Ok(Cleared {
        at_s: (start - began).as_secs_f64(),
        took_s: start.elapsed().as_secs_f64(),
    })
}

/// The breaker's state changes: seconds from the start, and the new state.
type Transitions = Arc<Mutex<Vec<(f64, BreakerState)>>>;

/// Records the breaker's state changes into `changes`, polled every 10 ms
/// of tokio time, until aborted.
async fn watch_breaker(origin: Origin, changes: Transitions) {
    let began = Instant::now();
    let mut last = origin.breaker_state();
    loop {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let now = origin.breaker_state();
        if now != last {
            lock(&changes).push((began.elapsed().as_secs_f64(), now));
            last = now;
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

//! Requests against the simulated database, the same for `demo` and
//! `simulate`: a naive cache and breakwater's [`Cache`] on the embedded
//! memory store, on tokio's clock (paused by the callers, so minutes of
//! traffic take a moment and a seed gives the same figures every time).
//!
//! Everything measured comes from what the requests met: a database query
//! is one [`Database::query`], stale values are the library's
//! [`Served::Stale`], latencies are tokio time.
//!
//! [`run`] is the one request loop: requests arrive as a [`Traffic`] says
//! (steady, or each key again once it expired), each in its own task, and
//! a [`Tally`] counts what they met.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use breakwater_cache::{Cache, Error, Jitter, MemoryStore, Served, Stats, Store, Stored};
use indicatif::ProgressBar;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::db::{Database, Down};
use crate::histogram::peak_1s;
use crate::report::{percentile, thousands};

/// How requests are served.
#[derive(Clone)]
pub(crate) enum Client {
    /// `GET` the store; on a miss query the database and `SET` the value
    /// with the one TTL. No jitter, no coalescing, no stale values.
    Naive {
        /// Its store.
        store: MemoryStore,
        /// The TTL of every write.
        ttl: Duration,
    },
    /// [`Cache::get_or_load`], with whatever the cache was built with.
    Breakwater(Cache<u64>),
}

/// How one request went.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Answer {
    /// From arrival to answer, on tokio's clock.
    pub(crate) latency: Duration,
    /// A stale value was served ([`Served::Stale`]).
    pub(crate) stale: bool,
    /// The value served was from an epoch of the data older than
    /// [`Database::floor`] when the request arrived: from before a clear
    /// that had returned.
    pub(crate) outdated: bool,
}

/// The value of `key` in the data's `epoch`: the epoch in the high half,
/// the key in the low one (a bulk write's values are epoch 0).
fn value_of(key: usize, epoch: u64) -> u64 {
    (epoch << 32) | (key as u64 & u64::from(u32::MAX))
}

/// The epoch of a value [`value_of`] made.
fn epoch_of(value: u64) -> u64 {
    value >> 32
}

impl Client {
    /// The storage key of user key `key`.
    fn naive_key(key: usize) -> Vec<u8> {
        format!("naive:{key}").into_bytes()
    }

    /// Writes `keys` at once, each with its value, as the strategy writes
    /// (breakwater: [`Cache::set_many`], jittered).
    ///
    /// # Errors
    ///
    /// A store error.
    pub(crate) async fn preload(&self, keys: std::ops::Range<usize>) -> Result<(), Error> {
        match self {
            Client::Naive { store, ttl } => {
                for key in keys {
                    store
                        .set(&Self::naive_key(key), &value_of(key, 0).to_be_bytes(), *ttl)
                        .await?;
                }
                Ok(())
            }
            Client::Breakwater(cache) => {
                cache
                    .set_many(keys.map(|key| (key.to_string(), value_of(key, 0))))
                    .await
            }
        }
    }

    /// Writes keys `0..keys` as [`preload`](Self::preload) does, in even
    /// slices once a second over `span` (from now, on tokio's clock): a
    /// keyspace whose entries have all ages, as a running service's do, so
    /// their expiries are spread as evenly as they will stay.
    ///
    /// # Errors
    ///
    /// A store error.
    pub(crate) async fn preload_over(&self, keys: usize, span: Duration) -> Result<(), Error> {
        let seconds = usize::try_from(span.as_secs()).unwrap_or(usize::MAX).max(1);
        let start = Instant::now();
        for second in 0..seconds {
            tokio::time::sleep_until(start + Duration::from_secs(second as u64)).await;
            self.preload(keys * second / seconds..keys * (second + 1) / seconds)
                .await?;
        }
        tokio::time::sleep_until(start + span).await;
        Ok(())
    }

    /// When each key `0..keys` expires, in ms from now: when it stops being
    /// fresh, as the library judges it (naive: when the store drops it);
    /// `None` for a key that is gone.
    ///
    /// # Errors
    ///
    /// A store error.
    pub(crate) async fn expiries_ms(&self, keys: usize) -> Result<Vec<Option<u64>>, Error> {
        let mut expiries = Vec::with_capacity(keys);
        for key in 0..keys {
            let left = match self {
                Client::Naive { store, .. } => store.ttl(&Self::naive_key(key)).await?,
                Client::Breakwater(cache) => match cache.inspect(key.to_string()).await?.stored {
                    Stored::Entry(entry) => entry.fresh_for,
                    _ => None,
                },
            };
            expiries.push(
                left.map(|left| u64::try_from(left.as_micros().div_ceil(1000)).unwrap_or(u64::MAX)),
            );
        }
        Ok(expiries)
    }

    /// One request for `key`; the value is loaded from `db` on a miss.
    ///
    /// # Errors
    ///
    /// The request failed: the store failed, or the load did and no stale
    /// value stood in.
    pub(crate) async fn request(&self, key: usize, db: &Arc<Database>) -> Result<Answer, Error> {
        let start = Instant::now();
        let floor = db.floor();
        let (value, stale) = match self {
            Client::Naive { store, ttl } => {
                let raw = Self::naive_key(key);
                let cached = store
                    .get(&raw)
                    .await?
                    .and_then(|bytes| <[u8; 8]>::try_from(bytes.as_slice()).ok())
                    .map(u64::from_be_bytes);
                let value = match cached {
                    Some(value) => value,
                    None => {
                        let epoch = db.query().await.map_err(Error::loader)?;
                        let value = value_of(key, epoch);
                        store.set(&raw, &value.to_be_bytes(), *ttl).await?;
                        value
                    }
                };
                (value, false)
            }
            Client::Breakwater(cache) => {
                let db = Arc::clone(db);
                let fetched = cache
                    .get_or_load_with_meta(key.to_string(), move || async move {
                        let epoch = db.query().await?;
                        Ok::<_, Down>(Some(value_of(key, epoch)))
                    })
                    .await?;
                let value = fetched.value.unwrap_or(0);
                (value, matches!(fetched.served, Served::Stale { .. }))
            }
        };
        Ok(Answer {
            latency: start.elapsed(),
            stale,
            outdated: epoch_of(value) < floor,
        })
    }
}

/// What a run of requests met.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tally {
    /// Latencies of the answered requests, in µs, sorted once finished.
    pub(crate) latencies_us: Vec<u64>,
    /// Requests that failed (an error the client returned).
    pub(crate) errors: usize,
    /// Requests whose task panicked: a bug, not a figure; the command
    /// fails.
    pub(crate) panicked: usize,
    /// Requests answered with a stale value.
    pub(crate) stale: usize,
    /// Requests answered with a value from before a clear that had
    /// returned when they arrived ([`Answer::outdated`]).
    pub(crate) outdated: usize,
    /// The cache's own counts at the end ([`Cache::stats`]), for a
    /// breakwater client.
    pub(crate) stats: Option<Stats>,
    /// When the requests began to be counted in seconds (tokio time);
    /// `None`: no per-second counts.
    pub(crate) began: Option<Instant>,
    /// Failed requests in each second after `began`, by when they ended.
    pub(crate) errors_per_second: Vec<usize>,
    /// Requests answered with a stale value in each second after `began`.
    pub(crate) stale_per_second: Vec<usize>,
    /// Outdated answers in each second after `began`.
    pub(crate) outdated_per_second: Vec<usize>,
}

impl Tally {
    /// An empty tally that also counts errors and stale answers per second
    /// from `began`.
    pub(crate) fn since(began: Instant) -> Self {
        Tally {
            began: Some(began),
            ..Tally::default()
        }
    }

    /// Counts one finished request (in the second it is counted in).
    pub(crate) fn record(&mut self, done: Result<Result<Answer, Error>, tokio::task::JoinError>) {
        let second = self
            .began
            .map(|began| usize::try_from(began.elapsed().as_secs()).unwrap_or(usize::MAX));
        match done {
            Ok(Ok(answer)) => {
                self.latencies_us
                    .push(u64::try_from(answer.latency.as_micros()).unwrap_or(u64::MAX));
                self.stale += usize::from(answer.stale);
                self.outdated += usize::from(answer.outdated);
                if answer.outdated {
                    bump(&mut self.outdated_per_second, second);
                }
                if answer.stale {
                    bump(&mut self.stale_per_second, second);
                }
            }
            Ok(Err(_)) => {
                self.errors += 1;
                bump(&mut self.errors_per_second, second);
            }
            Err(_) => self.panicked += 1,
        }
    }

    /// Requests answered and failed.
    pub(crate) fn requests(&self) -> usize {
        self.latencies_us.len() + self.errors
    }

    /// Answered requests that waited at all (on the paused clock a cache
    /// answers in no time, so any wait is for a load or the bulkhead).
    pub(crate) fn waited(&self) -> usize {
        self.latencies_us.iter().filter(|&&us| us > 0).count()
    }

    /// The `q` quantile of the latencies, in ms; `None` with no answers.
    pub(crate) fn quantile_ms(&self, q: f64) -> Option<f64> {
        percentile(&self.latencies_us, q).map(|us| us as f64 / 1000.0)
    }
}

/// Adds one to `counts[second]`, growing `counts` as needed.
fn bump(counts: &mut Vec<usize>, second: Option<usize>) {
    // A day of seconds at most: a clock gone wrong must not allocate the
    // world.
    if let Some(second) = second.filter(|s| *s < 86_400) {
        if counts.len() <= second {
            counts.resize(second + 1, 0);
        }
        counts[second] += 1;
    }
}

/// Steady traffic: `rps` requests a second, evenly spaced, for `duration`,
/// each for a key in `0..keys` drawn with a Zipf law of exponent `zipf` (0:
/// uniform).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Workload {
    /// Keys requested.
    pub(crate) keys: usize,
    /// Requests per second.
    pub(crate) rps: u32,
    /// How long.
    pub(crate) duration: Duration,
    /// Zipf exponent of key popularity.
    pub(crate) zipf: f64,
    /// Seed of the key draws.
    pub(crate) seed: u64,
}

impl Workload {
    /// Requests in all.
    pub(crate) fn total(&self) -> u64 {
        u64::from(self.rps) * u64::try_from(self.duration.as_millis()).unwrap_or(u64::MAX) / 1000
    }
}

/// How requests arrive.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Traffic {
    /// Steady traffic over Zipf-drawn keys.
    Steady(Workload),
    /// Each key once, in the first whole second after it expired, for
    /// `seconds` (a keyspace where every key is busy: each expiry is one
    /// database query).
    OnExpiry {
        /// How long, in whole seconds.
        seconds: u64,
    },
}

/// Runs `traffic` through `client` from now, each request in its own task,
/// and waits for the last one; `expiries_ms` (from
/// [`Client::expiries_ms`]) says when each key expires, for
/// [`Traffic::OnExpiry`]. `progress` advances by one per request.
pub(crate) async fn run(
    client: &Client,
    db: &Arc<Database>,
    traffic: &Traffic,
    expiries_ms: &[Option<u64>],
    progress: Option<&ProgressBar>,
) -> Tally {
    match *traffic {
        Traffic::Steady(load) => {
            let cdf = zipf_cdf(load.keys, load.zipf);
            let mut rng = StdRng::seed_from_u64(load.seed);
            let gap_ns = 1_000_000_000 / u64::from(load.rps.max(1));
            let arrivals = (0..load.total()).map(move |i| {
                let key = pick(&cdf, rng.random::<f64>());
                (Duration::from_nanos(gap_ns * i), [key])
            });
            drive(client, db, arrivals, progress).await
        }
        Traffic::OnExpiry { seconds } => {
            let mut due: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
            for (key, at) in expiries_ms.iter().enumerate() {
                if let Some(at) = at {
                    due.entry(at.div_ceil(1000)).or_default().push(key);
                }
            }
            let arrivals = due
                .into_iter()
                .take_while(|(second, _)| *second < seconds)
                .map(|(second, keys)| (Duration::from_secs(second), keys));
            drive(client, db, arrivals, progress).await
        }
    }
}

/// The request loop: at each arrival's time (from now), one request per
/// key it names; finished requests are reaped as the run goes, so memory
/// follows the requests in flight, not all of them.
async fn drive<K: IntoIterator<Item = usize>>(
    client: &Client,
    db: &Arc<Database>,
    arrivals: impl Iterator<Item = (Duration, K)>,
    progress: Option<&ProgressBar>,
) -> Tally {
    let began = Instant::now();
    let mut tasks = JoinSet::new();
    let mut tally = Tally::since(began);
    for (at, keys) in arrivals {
        tokio::time::sleep_until(began + at).await;
        let mut sent = 0;
        for key in keys {
            let (client, db) = (client.clone(), Arc::clone(db));
            tasks.spawn(async move { client.request(key, &db).await });
            sent += 1;
        }
        while let Some(done) = tasks.try_join_next() {
            tally.record(done);
        }
        if let Some(bar) = progress {
            bar.inc(sent);
        }
    }
    while let Some(done) = tasks.join_next().await {
        tally.record(done);
    }
    tally.latencies_us.sort_unstable();
    if let Client::Breakwater(cache) = client {
        tally.stats = Some(cache.stats());
    }
    tally
}

/// Zipf key choice: `cdf[i]` is the probability of a key `<= i`.
pub(crate) fn zipf_cdf(keys: usize, s: f64) -> Vec<f64> {
    let weights: Vec<f64> = (1..=keys).map(|rank| 1.0 / (rank as f64).powf(s)).collect();
    let total: f64 = weights.iter().sum();
    let mut acc = 0.0;
    weights
        .iter()
        .map(|w| {
            acc += w / total;
            acc
        })
        .collect()
}

/// The key whose CDF step holds `u`.
pub(crate) fn pick(cdf: &[f64], u: f64) -> usize {
    cdf.partition_point(|&p| p < u)
        .min(cdf.len().saturating_sub(1))
}

/// How a bulk write's expiries spread, in ms from the write.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct Expiries {
    /// Keys read back with a TTL.
    pub(crate) count: usize,
    /// The earliest expiry, in seconds.
    pub(crate) first_s: f64,
    /// The latest, in seconds.
    pub(crate) last_s: f64,
    /// The most in any window `[t, t + 1 s)`.
    pub(crate) busiest_second: usize,
    /// `count` over the span from the first to the last (all of them when
    /// the span is under a second).
    pub(crate) mean_per_second: f64,
}

impl Expiries {
    /// The figures of expiry times `ms` (any order).
    pub(crate) fn of(ms: &[u64]) -> Self {
        let mut sorted = ms.to_vec();
        sorted.sort_unstable();
        let (first, last) = match (sorted.first(), sorted.last()) {
            (Some(&first), Some(&last)) => (first, last),
            _ => (0, 0),
        };
        let span_s = (last - first) as f64 / 1000.0;
        Expiries {
            count: sorted.len(),
            first_s: first as f64 / 1000.0,
            last_s: last as f64 / 1000.0,
            busiest_second: peak_1s(&sorted),
            mean_per_second: sorted.len() as f64 / span_s.max(1.0),
        }
    }

    /// `all at 300.0 s`, or `between 240.0 and 360.0 s, 833 a second on
    /// average`, then the busiest second.
    pub(crate) fn describe(&self) -> String {
        let when = if self.first_s == self.last_s {
            format!("all at {:.1} s", self.first_s)
        } else {
            format!(
                "between {:.1} and {:.1} s, {} a second on average",
                self.first_s,
                self.last_s,
                thousands(self.mean_per_second.round() as usize)
            )
        };
        format!("{when}; busiest second {}", thousands(self.busiest_second))
    }
}

/// A breakwater cache on `store` with `jitter`, seeded, for the runs.
pub(crate) fn builder(
    store: &MemoryStore,
    jitter: Jitter,
    seed: u64,
) -> breakwater_cache::CacheBuilder<u64> {
    Cache::<u64>::builder()
        .namespace("sim")
        .store(store.clone())
        .jitter(jitter)
        .rng_seed(seed)
}

/// Runs `work` on its own thread (which runs its own paused runtimes),
/// without blocking the caller's runtime; `None` if it panicked.
pub(crate) async fn off_thread<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let handle = std::thread::spawn(work);
    tokio::task::spawn_blocking(move || handle.join())
        .await
        .ok()?
        .ok()
}

/// A current-thread runtime on a paused clock.
pub(crate) fn paused_runtime() -> tokio::runtime::Runtime {
    // A current-thread runtime with a paused clock allocates and spawns
    // nothing that can fail short of memory exhaustion.
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_picks_favour_low_ranks() {
        let cdf = zipf_cdf(100, 1.0);
        assert!((cdf[99] - 1.0).abs() < 1e-9);
        assert_eq!(pick(&cdf, 0.0), 0);
        assert_eq!(pick(&cdf, 1.0), 99);
        assert!(cdf[0] > 0.15, "rank 1 of 100 under s=1 is about 19 %");
        let uniform = zipf_cdf(4, 0.0);
        assert!((uniform[1] - 0.5).abs() < 1e-9);
    }

    #[test]
    fn expiry_figures() {
        let e = Expiries::of(&[10_000; 500]);
        assert_eq!((e.count, e.busiest_second), (500, 500));
        assert_eq!((e.first_s, e.last_s), (10.0, 10.0));
        let spread: Vec<u64> = (0..100).map(|i| 5_000 + i * 100).collect();
        let e = Expiries::of(&spread);
        assert_eq!(e.busiest_second, 10);
        assert!((e.mean_per_second - 100.0 / 9.9).abs() < 1e-9);
    }

    #[tokio::test(start_paused = true)]
    async fn naive_queries_per_miss_and_breakwater_once() {
        let db = Arc::new(Database::new(Duration::from_millis(100)));
        let naive = Client::Naive {
            store: MemoryStore::new(),
            ttl: Duration::from_secs(10),
        };
        let load = Workload {
            keys: 1,
            rps: 100,
            duration: Duration::from_secs(1),
            zipf: 1.0,
            seed: 1,
        };
        let tally = run(&naive, &db, &Traffic::Steady(load), &[], None).await;
        assert_eq!(tally.requests(), 100);
        // 10 requests arrive during the first 100 ms load, each a miss.
        assert_eq!(db.started_ms().len(), 10);
        assert_eq!(tally.waited(), 10);

        let db = Arc::new(Database::new(Duration::from_millis(100)));
        let store = MemoryStore::new();
        let cache = builder(&store, Jitter::none(), 1).build().unwrap();
        let tally = run(
            &Client::Breakwater(cache),
            &db,
            &Traffic::Steady(load),
            &[],
            None,
        )
        .await;
        assert_eq!(db.started_ms().len(), 1);
        assert_eq!(tally.waited(), 10);
        assert_eq!(tally.errors, 0);
    }
}

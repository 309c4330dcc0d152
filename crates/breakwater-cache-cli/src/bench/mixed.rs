//! `breakwater bench mixed --redis URL[,URL…]`: a workload shaped like
//! production, on a real Redis (or a Redis Cluster), through breakwater and
//! through a naive cache, one after the other in the same run.
//!
//! P worker processes (`breakwater mixed-worker`, hidden; the line protocol
//! of [`fleet`](crate::fleet)) each run C callers that request keys drawn
//! from `0..K` by a Zipf law, back to back, for a duration; each process
//! has a simulated database (a query takes a latency, at most a share of
//! the fleet's capacity run at once, the rest queue) and, with `--writes`,
//! updates Zipf-chosen rows at a steady rate, each update followed by an
//! invalidation of its key. The cache starts cold, as after a deploy.
//!
//! - **breakwater**: [`Cache::get_or_load_with_meta`] with the TTL, jitter,
//!   grace and L1 given; an update is followed by [`Cache::invalidate`].
//! - **naive**: `GET`; on a miss a query and a `SET` with the one TTL; an
//!   update is followed by a `DEL` (through the same store, so a cluster
//!   works alike).
//!
//! Each worker reports every database query (when it arrived, which key),
//! every update (when it began and when its invalidation returned), its
//! latency histogram and its counts; the parent judges the queries
//! fleet-wide. A query is *needed* when its key had no query since the
//! last needed one, or that one is older than the shortest TTL a write can
//! get (an expiry), or an update of the key began or ended in between (an
//! invalidation); any other query is a *duplicate*, one a perfect
//! single-flight cache would not have run. The needed queries are the
//! ideal database load (one query per key per expiry or update): "loads
//! per expiry" is all queries over needed ones, and each second's ideal is
//! the needed queries in it.
//!
//! The first TTL is the warm-up: the cold cache fills (every key's first
//! load), as after a deploy. The figures after it show what the fill
//! leaves behind: without jitter its keys expire again together, a TTL
//! later and every TTL after (an avalanche: the busiest second after the
//! warm-up is the fill's echo); with jitter the echo spreads out and
//! flattens towards the ideal's mean. The busiest second is the most
//! queries in any 1-second window; the per-second counts are in `--json`.
//!
//! The keys both sides wrote (values, leases, the namespace's clear
//! record) are deleted when the bench ends, also when it fails.

use std::io::{self, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use breakwater_cache::{Cache, L1Config, RedisStore, Served, Store};
use clap::builder::RangedU64ValueParser;
use clap::{Args, ValueEnum};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::args::{self, JitterArg};
use crate::failure::{Failure, bad_url, unreachable};
use crate::fleet::{BoxError, Done, Fleet, read_line, say};
use crate::histogram::peak_1s;
use crate::report::thousands;
use crate::traffic::{pick, zipf_cdf};

/// Options of `breakwater bench mixed`.
#[derive(Debug, Clone, Args)]
pub(crate) struct MixedOpts {
    /// Redis URL to run against, or a cluster's nodes, comma-separated
    /// (writes keys under `bw:bench-mixed-<pid>:` and
    /// `raw:bench-mixed-<pid>:`, and deletes them when it ends).
    #[arg(long, value_name = "URL")]
    pub(crate) redis: String,
    /// Worker processes, released together (1 to 64).
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = args::processes())]
    pub(crate) processes: usize,
    /// Most calls in flight at once, per process (1 to 100,000).
    #[arg(long, value_name = "N", default_value_t = 50, value_parser = args::concurrency())]
    pub(crate) concurrency: usize,
    #[command(flatten)]
    pub(crate) workload: Workload,
    /// Print the figures as JSON instead of tables.
    #[arg(long)]
    pub(crate) json: bool,
    /// Only breakwater's side (no naive cache).
    #[arg(long)]
    pub(crate) no_naive: bool,
}

/// What each process runs, the same on both sides.
#[derive(Debug, Clone, Args)]
pub(crate) struct Workload {
    /// Keys (rows), `0..N`, requested with a Zipf law (1 to 10,000,000).
    #[arg(long, value_name = "N", default_value_t = 100_000,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=10_000_000))]
    pub(crate) keys: usize,
    /// Zipf exponent of key popularity (0 = uniform).
    #[arg(long, default_value_t = 1.0, value_parser = crate::simulate::zipf)]
    pub(crate) zipf: f64,
    /// Base TTL of the keys, e.g. `10m` or `1h` (1s to 365d).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = args::ttl)]
    pub(crate) ttl: Duration,
    /// TTL jitter: `0.2` or `ratio:0.2` (±20%), `down:0.2` (−20% to 0),
    /// `±30s` or `fixed:30s`, `up-to:30s` (0 to +30s), or `none`.
    #[arg(long, value_name = "JITTER", default_value = "0.2", value_parser = args::jitter, allow_hyphen_values = true)]
    pub(crate) jitter: JitterArg,
    /// breakwater's grace (stale-while-revalidate) window (`0s`: none).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub(crate) grace: Duration,
    /// breakwater's near cache (L1), entries per process (0: none).
    #[arg(long, value_name = "N", default_value_t = 10_000,
          value_parser = RangedU64ValueParser::<u64>::new().range(0..=100_000_000))]
    pub(crate) l1: u64,
    /// How long L1 serves an entry before asking Redis again.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = humantime::parse_duration)]
    pub(crate) l1_ttl: Duration,
    /// Row updates per second, fleet-wide, each followed by an
    /// invalidation of its key (Zipf-chosen rows; 0 to 100,000).
    #[arg(long, value_name = "N", default_value_t = 0,
          value_parser = RangedU64ValueParser::<u64>::new().range(0..=100_000))]
    pub(crate) writes: u64,
    /// How long each side runs (1s to 1 day).
    #[arg(long, value_name = "DURATION", default_value = "120s", value_parser = crate::simulate::window)]
    pub(crate) duration: Duration,
    /// How long one loader call (a database query) takes, e.g. `5ms` (0 to
    /// 1m).
    #[arg(long, value_name = "DURATION", default_value = "5ms", value_parser = args::loader_latency)]
    pub(crate) loader_latency: Duration,
    /// Queries the database runs at once, fleet-wide (shared evenly by the
    /// processes); the rest wait their turn (0 = no limit).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub(crate) db_capacity: usize,
    /// Seed for key choice.
    #[arg(long, value_name = "SEED", default_value_t = 1)]
    pub(crate) seed: u64,
    /// The warm-up, left out of the steady figures (default: the TTL, the
    /// cold cache's first fill; at most the duration).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub(crate) warm_up: Option<Duration>,
}

/// Which cache a side runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Side {
    /// breakwater's `get_or_load`.
    Breakwater,
    /// `GET`; on a miss a query and `SET` with the one TTL.
    Naive,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Breakwater => "breakwater",
            Side::Naive => "naive",
        }
    }
}

/// Options of `breakwater mixed-worker`.
#[derive(Debug, Clone, Args)]
pub(crate) struct MixedWorkerOpts {
    /// Redis URL, or a Redis Cluster's node URLs separated by commas.
    #[arg(long, value_name = "URL")]
    redis: String,
    /// Cache namespace (the naive side's keys are `raw:<namespace>:<id>`).
    #[arg(long)]
    namespace: String,
    /// Which cache this process runs.
    #[arg(long, value_enum)]
    side: Side,
    /// This process's number, from 0.
    #[arg(long, value_name = "N")]
    process: usize,
    /// Worker processes in the fleet (each takes its share of the writes
    /// and of the database's capacity).
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = args::processes())]
    processes: usize,
    /// Most calls in flight at once, per process (1 to 100,000).
    #[arg(long, value_name = "N", default_value_t = 50, value_parser = args::concurrency())]
    concurrency: usize,
    #[command(flatten)]
    workload: Workload,
}

/// The naive side's key of row `id`.
fn naive_key(namespace: &str, id: usize) -> Vec<u8> {
    format!("raw:{namespace}:{id}").into_bytes()
}

/// Latency histogram buckets: bucket `b` holds latencies from
/// `BUCKET_BASE^b - 1` µs up to the next (5% apart).
const BUCKET_BASE: f64 = 1.05;
/// Buckets kept; the last holds everything longer (about 7 hours).
const BUCKETS: usize = 512;

/// The bucket of a latency of `us` µs.
fn bucket(us: u64) -> usize {
    let b = ((us as f64 + 1.0).ln() / BUCKET_BASE.ln()) as usize;
    b.min(BUCKETS - 1)
}

/// The least latency in µs of bucket `b`.
fn bucket_floor_us(b: usize) -> u64 {
    (BUCKET_BASE.powi(i32::try_from(b).unwrap_or(i32::MAX)) - 1.0).max(0.0) as u64
}

/// The `q` quantile of a histogram, as a bucket's floor in µs.
fn quantile_us(hist: &[u64], q: f64) -> Option<u64> {
    let total: u64 = hist.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for (b, n) in hist.iter().enumerate() {
        seen += n;
        if seen >= rank {
            return Some(bucket_floor_us(b));
        }
    }
    None
}

/// A process's simulated database: a query takes `latency` once it runs;
/// at most `capacity` run at once (the rest queue). Records when each
/// query arrived, in ms since the release.
struct Database {
    latency: Duration,
    capacity: Option<Semaphore>,
    began: Instant,
    queries: Mutex<Vec<(u64, u32)>>,
    /// Each row's version (moved on by an update).
    versions: Vec<AtomicU64>,
}

impl Database {
    fn new(latency: Duration, capacity: usize, rows: usize, began: Instant) -> Self {
        Database {
            latency,
            capacity: (capacity > 0).then(|| Semaphore::new(capacity)),
            began,
            queries: Mutex::new(Vec::new()),
            versions: (0..rows).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn since_ms(&self) -> u64 {
        u64::try_from(self.began.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Row `id`'s current value.
    async fn query(&self, id: usize) -> u64 {
        let at = self.since_ms();
        lock(&self.queries).push((at, u32::try_from(id).unwrap_or(u32::MAX)));
        let _permit = match &self.capacity {
            Some(capacity) => capacity.acquire().await.ok(),
            None => None,
        };
        tokio::time::sleep(self.latency).await;
        self.versions[id].load(Ordering::Relaxed)
    }

    /// Moves row `id` on.
    fn update(&self, id: usize) {
        self.versions[id].fetch_add(1, Ordering::Relaxed);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The cache a worker runs.
#[derive(Clone)]
enum Client {
    Breakwater(Cache<u64>),
    Naive {
        store: RedisStore,
        namespace: Arc<str>,
        ttl: Duration,
    },
}

/// How one request was served.
enum Answer {
    /// From the cache (L1, Redis, or a stale value while it refreshes).
    Hit,
    /// After a load (its own, or one it shared).
    Miss,
}

impl Client {
    async fn request(&self, id: usize, db: &Arc<Database>) -> Result<Answer, String> {
        match self {
            Client::Breakwater(cache) => {
                let db = Arc::clone(db);
                let fetched = cache
                    .get_or_load_with_meta(id as u64, move || async move {
                        Ok::<_, std::io::Error>(Some(db.query(id).await))
                    })
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(match fetched.served {
                    Served::L1Hit | Served::Hit | Served::Stale { .. } | Served::Negative => {
                        Answer::Hit
                    }
                    _ => Answer::Miss,
                })
            }
            Client::Naive {
                store,
                namespace,
                ttl,
            } => {
                let key = naive_key(namespace, id);
                if store.get(&key).await.map_err(|e| e.to_string())?.is_some() {
                    return Ok(Answer::Hit);
                }
                let value = db.query(id).await;
                store
                    .set(&key, &value.to_be_bytes(), *ttl)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(Answer::Miss)
            }
        }
    }

    async fn invalidate(&self, id: usize) -> Result<(), String> {
        match self {
            Client::Breakwater(cache) => cache.invalidate(id as u64).await,
            Client::Naive {
                store, namespace, ..
            } => store.delete(&naive_key(namespace, id)).await.map(drop),
        }
        .map_err(|e| e.to_string())
    }
}

/// What one caller counted.
struct Counted {
    hist: Vec<u64>,
    hits: u64,
    misses: u64,
    errors: u64,
    first_error: Option<String>,
}

/// Runs the worker; exit code 0 unless it could not run.
pub(crate) async fn worker(opts: MixedWorkerOpts) -> ExitCode {
    match run_worker(opts).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("mixed-worker: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run_worker(opts: MixedWorkerOpts) -> Result<(), BoxError> {
    let load = &opts.workload;
    let store = crate::connect::bench_cluster_store(&opts.redis).await?;
    let client = match opts.side {
        Side::Breakwater => {
            let mut builder = Cache::<u64>::builder()
                .namespace(opts.namespace.clone())
                .store(store)
                .ttl(load.ttl)
                .jitter(load.jitter.jitter())
                .grace(load.grace)
                .rng_seed(load.seed.wrapping_add(opts.process as u64));
            if load.l1 > 0 {
                builder = builder.l1(L1Config::new().entries(load.l1).ttl(load.l1_ttl));
            }
            Client::Breakwater(builder.build()?)
        }
        Side::Naive => Client::Naive {
            store,
            namespace: opts.namespace.as_str().into(),
            ttl: load.ttl,
        },
    };
    let cdf = Arc::new(zipf_cdf(load.keys, load.zipf));
    let capacity = load.db_capacity.div_ceil(opts.processes);
    say("ready")?;
    let go = tokio::task::spawn_blocking(read_line).await??;
    if go.is_empty() {
        return Err("stdin closed before the go line".into());
    }
    let began = Instant::now();
    let until = began + load.duration;
    let db = Arc::new(Database::new(
        load.loader_latency,
        capacity,
        load.keys,
        began,
    ));
    let callers: Vec<_> = (0..opts.concurrency)
        .map(|caller| {
            let (client, db, cdf) = (client.clone(), Arc::clone(&db), Arc::clone(&cdf));
            let seed = load
                .seed
                .wrapping_mul(1_000_003)
                .wrapping_add((opts.process * 100_003 + caller) as u64);
            tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(seed);
                let mut counted = Counted {
                    hist: vec![0; BUCKETS],
                    hits: 0,
                    misses: 0,
                    errors: 0,
                    first_error: None,
                };
                loop {
                    let start = Instant::now();
                    if start >= until {
                        break;
                    }
                    let id = pick(&cdf, rng.random::<f64>());
                    match client.request(id, &db).await {
                        Ok(Answer::Hit) => counted.hits += 1,
                        Ok(Answer::Miss) => counted.misses += 1,
                        Err(err) => {
                            counted.errors += 1;
                            counted.first_error.get_or_insert(err);
                        }
                    }
                    let us = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
                    counted.hist[bucket(us)] += 1;
                }
                counted
            })
        })
        .collect();
    // This process's share of the updates, evenly spaced.
    let share = load.writes as f64 / opts.processes as f64;
    let writer = (share > 0.0).then(|| {
        let (client, db, cdf) = (client.clone(), Arc::clone(&db), Arc::clone(&cdf));
        let seed = load.seed ^ 0x5752_4954_4553 ^ opts.process as u64;
        tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed);
            let gap = Duration::from_secs_f64(1.0 / share);
            // Processes start their updates spread over one gap.
            let mut next = began + gap.mul_f64(rng.random::<f64>());
            let mut writes = Vec::new();
            let mut failed = (0u64, None::<String>);
            while next < until {
                tokio::time::sleep_until(next).await;
                next += gap;
                let id = pick(&cdf, rng.random::<f64>());
                let from = db.since_ms();
                db.update(id);
                if let Err(err) = client.invalidate(id).await {
                    failed.0 += 1;
                    failed.1.get_or_insert(err);
                }
                writes.push((from, db.since_ms(), id));
            }
            (writes, failed)
        })
    });
    let mut hist = vec![0u64; BUCKETS];
    let mut done = Done::default();
    let (mut hits, mut misses) = (0u64, 0u64);
    for caller in callers {
        let counted = caller.await?;
        for (all, n) in hist.iter_mut().zip(&counted.hist) {
            *all += n;
        }
        hits += counted.hits;
        misses += counted.misses;
        done.ok += usize::try_from(counted.hits + counted.misses).unwrap_or(usize::MAX);
        done.err += usize::try_from(counted.errors).unwrap_or(usize::MAX);
        if done.first_error.is_none() {
            done.first_error = counted.first_error;
        }
    }
    let writes = match writer {
        Some(writer) => {
            let (writes, (failed, first)) = writer.await?;
            done.err += usize::try_from(failed).unwrap_or(usize::MAX);
            if done.first_error.is_none() {
                done.first_error = first.map(|e| format!("invalidate: {e}"));
            }
            writes
        }
        None => Vec::new(),
    };
    let mut out = io::BufWriter::new(io::stdout().lock());
    for (at, id) in lock(&db.queries).iter() {
        writeln!(out, "q {at} {id}")?;
    }
    for (from, to, id) in &writes {
        writeln!(out, "w {from} {to} {id}")?;
    }
    for (b, n) in hist.iter().enumerate().filter(|(_, n)| **n > 0) {
        writeln!(out, "lat {b} {n}")?;
    }
    writeln!(out, "served {hits} {misses}")?;
    if let Client::Breakwater(cache) = &client {
        writeln!(
            out,
            "stats {}",
            cache.stats().to_string().replace('\n', " | ")
        )?;
    }
    if let Some(first) = &mut done.first_error {
        *first = first.replace('\n', " ");
    }
    writeln!(out, "{done}")?;
    out.flush()?;
    Ok(())
}

/// What one side's fleet reported.
#[derive(Debug, Default)]
struct Reported {
    /// Each query: when it arrived (ms since the release) and its key.
    queries: Vec<(u64, u32)>,
    /// Each update: when it began and when its invalidation returned, and
    /// its key.
    writes: Vec<(u64, u64, u32)>,
    hist: Vec<u64>,
    hits: u64,
    misses: u64,
    errors: usize,
    first_error: Option<String>,
    stats: Vec<String>,
}

/// One side's figures. "Steady" ones are of the time after the warm-up
/// (the first TTL, while the cold cache fills).
#[derive(Debug, Clone, serde::Serialize)]
struct Figures {
    side: &'static str,
    requests: u64,
    requests_per_s: f64,
    hit_ratio: f64,
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
    p999_ms: Option<f64>,
    /// Database queries, in all.
    queries: usize,
    /// Queries a perfect single-flight cache would have run, in all.
    needed: usize,
    /// All queries over the needed ones.
    loads_per_expiry: f64,
    /// The most queries in a second during the warm-up.
    warm_up_busiest_second: usize,
    /// Queries per second after the warm-up.
    steady_queries_per_s: f64,
    /// Needed queries per second after the warm-up: the ideal load.
    steady_ideal_per_s: f64,
    /// The most queries in a second after the warm-up.
    steady_busiest_second: usize,
    /// The most needed queries in a second after the warm-up: the ideal's
    /// busiest second.
    steady_ideal_busiest_second: usize,
    /// The busiest second over the ideal's.
    steady_busiest_over_ideal: f64,
    /// The most queries in a second, warm-up included.
    busiest_second: usize,
    /// Queries in each second from the release.
    queries_per_second: Vec<usize>,
    /// Needed queries in each second.
    needed_per_second: Vec<usize>,
    writes: usize,
    errors: usize,
    first_error: Option<String>,
}

/// Which queries were needed (see the module docs): `shortest` is the
/// shortest TTL a value is written with, in ms. Returns the arrival times
/// of the needed queries.
fn needed_queries(queries: &[(u64, u32)], writes: &[(u64, u64, u32)], shortest: u64) -> Vec<u64> {
    let mut by_key: Vec<(u32, u64)> = queries.iter().map(|&(at, id)| (id, at)).collect();
    by_key.sort_unstable();
    // Each update's two moments (begin, end), by key and time.
    let mut marks: Vec<(u32, u64)> = writes
        .iter()
        .flat_map(|&(from, to, id)| [(id, from), (id, to)])
        .collect();
    marks.sort_unstable();
    let mut needed = Vec::new();
    let mut last: Option<(u32, u64)> = None;
    for &(id, at) in &by_key {
        let need = match last {
            Some((key, when)) if key == id => {
                let changed = {
                    // A mark of this key in (when, at].
                    let from = marks.partition_point(|&m| m <= (id, when));
                    marks.get(from).is_some_and(|&(k, t)| k == id && t <= at)
                };
                changed || at - when >= shortest
            }
            _ => true,
        };
        if need {
            needed.push(at);
            last = Some((id, at));
        }
    }
    needed.sort_unstable();
    needed
}

/// How many of `sorted_ms` fall in each second, for `seconds` seconds
/// (later ones count in the last).
fn per_second(sorted_ms: &[u64], seconds: usize) -> Vec<usize> {
    let mut counts = vec![0; seconds.max(1)];
    for &t in sorted_ms {
        let second = usize::try_from(t / 1000).unwrap_or(usize::MAX);
        let last = counts.len() - 1;
        counts[second.min(last)] += 1;
    }
    counts
}

fn figures(side: Side, mut reported: Reported, load: &Workload) -> Figures {
    let seconds = load.duration.as_secs_f64();
    let shortest = match side {
        Side::Breakwater => load.jitter.jitter().bounds(load.ttl).0,
        Side::Naive => load.ttl,
    };
    let shortest = u64::try_from(shortest.as_millis()).unwrap_or(u64::MAX);
    let needed = needed_queries(&reported.queries, &reported.writes, shortest);
    reported.queries.sort_unstable();
    let times: Vec<u64> = reported.queries.iter().map(|&(at, _)| at).collect();
    let warm_up = u64::try_from(warm_up(load).as_millis()).unwrap_or(u64::MAX);
    let steady_seconds = (seconds - warm_up as f64 / 1000.0).max(1.0);
    let (cold, steady) = times.split_at(times.partition_point(|&t| t < warm_up));
    let steady_needed = &needed[needed.partition_point(|&t| t < warm_up)..];
    let steady_ideal_per_s = steady_needed.len() as f64 / steady_seconds;
    let steady_busiest_second = peak_1s(steady);
    let steady_ideal_busiest_second = peak_1s(steady_needed);
    let requests = reported.hits + reported.misses;
    let ms = |q: f64| quantile_us(&reported.hist, q).map(|us| us as f64 / 1_000.0);
    let whole = load.duration.as_secs().max(1);
    let whole = usize::try_from(whole).unwrap_or(usize::MAX);
    Figures {
        side: side.name(),
        requests,
        requests_per_s: requests as f64 / seconds,
        hit_ratio: if requests == 0 {
            0.0
        } else {
            reported.hits as f64 / requests as f64
        },
        p50_ms: ms(0.5),
        p99_ms: ms(0.99),
        p999_ms: ms(0.999),
        queries: times.len(),
        needed: needed.len(),
        loads_per_expiry: if needed.is_empty() {
            1.0
        } else {
            times.len() as f64 / needed.len() as f64
        },
        warm_up_busiest_second: peak_1s(cold),
        steady_queries_per_s: steady.len() as f64 / steady_seconds,
        steady_ideal_per_s,
        steady_busiest_second,
        steady_ideal_busiest_second,
        steady_busiest_over_ideal: steady_busiest_second as f64
            / steady_ideal_busiest_second.max(1) as f64,
        busiest_second: peak_1s(&times),
        queries_per_second: per_second(&times, whole),
        needed_per_second: per_second(&needed, whole),
        writes: reported.writes.len(),
        errors: reported.errors,
        first_error: reported.first_error,
    }
}

/// The warm-up: `--warm-up`, else the first TTL (the cold cache
/// filling); at most the whole run.
fn warm_up(load: &Workload) -> Duration {
    load.warm_up.unwrap_or(load.ttl).min(load.duration)
}

/// `breakwater bench mixed`.
pub(crate) async fn bench(opts: &MixedOpts) -> Result<(), Failure> {
    for url in opts.redis.split(',') {
        redis::Client::open(url.trim()).map_err(|err| bad_url(url, err))?;
    }
    let store = match crate::connect::bench_cluster_store(&opts.redis).await {
        Ok(store) => store,
        Err(err) => return Err(unreachable(&opts.redis, err).await),
    };
    let load = &opts.workload;
    let namespace = format!("bench-mixed-{}", std::process::id());
    let exe = std::env::current_exe().map_err(Failure::runtime)?;
    let l1 = if load.l1 == 0 {
        "no L1".to_owned()
    } else {
        format!(
            "L1 {} entries for {}",
            thousands(usize::try_from(load.l1).unwrap_or(usize::MAX)),
            humantime::format_duration(load.l1_ttl)
        )
    };
    let header = format!(
        "mixed: {} processes x {} callers, {} keys (Zipf {}), TTL {} jitter {}, grace {}, {l1}, \
         {} updates/s, database {} per query{}, {} per side",
        opts.processes,
        opts.concurrency,
        thousands(load.keys),
        load.zipf,
        humantime::format_duration(load.ttl),
        load.jitter,
        humantime::format_duration(load.grace),
        load.writes,
        humantime::format_duration(load.loader_latency),
        if load.db_capacity == 0 {
            String::new()
        } else {
            format!(" ({} at once)", load.db_capacity)
        },
        humantime::format_duration(load.duration),
    );
    if !opts.json {
        crate::outln!("{header}");
        if warm_up(load) >= load.duration {
            eprintln!(
                "breakwater: the run is no longer than the warm-up ({}): every figure after it is \
                 empty; give --duration longer than --warm-up (by default the TTL)",
                humantime::format_duration(warm_up(load))
            );
        }
    }
    let sides: &[Side] = if opts.no_naive {
        &[Side::Breakwater]
    } else {
        &[Side::Breakwater, Side::Naive]
    };
    let mut rows = Vec::new();
    let mut failed = None;
    for &side in sides {
        let spinner = (!opts.json).then(|| {
            crate::progress::spinner(&format!(
                "bench mixed: {} for {}",
                side.name(),
                humantime::format_duration(load.duration)
            ))
        });
        let run = run_side(&exe, opts, &namespace, side).await;
        if let Some(spinner) = spinner {
            spinner.finish_and_clear();
        }
        match run {
            Ok(reported) => {
                let stats = reported.stats.clone();
                let row = figures(side, reported, load);
                if row.errors > 0 && !opts.json {
                    for (p, stats) in stats.iter().enumerate() {
                        crate::outln!("  process {p}: {stats}");
                    }
                }
                rows.push(row);
            }
            Err(err) => {
                failed = Some(err.to_string());
                break;
            }
        }
    }
    let cleaned = clean_up(&opts.redis, &store, &namespace, load.keys).await;
    if let Some(err) = failed {
        return Err(Failure::runtime(err));
    }
    cleaned.map_err(Failure::runtime)?;
    if opts.json {
        let json = serde_json::json!({ "workload": header, "sides": rows });
        crate::outln!("{json:#}");
    } else {
        print_table(&rows, load);
    }
    let errors: usize = rows.iter().map(|r| r.errors).sum();
    if errors > 0 {
        let first = rows.iter().find_map(|r| r.first_error.clone());
        return Err(Failure::runtime(format!(
            "{errors} request(s) or update(s) failed (first: {})",
            first.as_deref().unwrap_or("none")
        )));
    }
    Ok(())
}

fn print_table(rows: &[Figures], load: &Workload) {
    let line = |cells: [&str; 13]| {
        crate::outln!(
            "{:<11} {:>9} {:>6} {:>7} {:>7} {:>7} | {:>8} | {:>7} {:>7} {:>8} {:>8} {:>7} | {:>9} {:>6}",
            "",
            cells[0],
            cells[1],
            cells[2],
            cells[3],
            cells[4],
            cells[5],
            cells[6],
            cells[7],
            cells[8],
            cells[9],
            cells[10],
            cells[11],
            cells[12]
        );
    };
    line([
        "req/s",
        "hit %",
        "p50 ms",
        "p99 ms",
        "p999 ms",
        "warm-up",
        "db q/s",
        "ideal",
        "busiest",
        "ideal",
        "busiest",
        "loads per",
        "errors",
    ]);
    line([
        "", "", "", "", "", "busiest", "", "q/s", "second", "busiest", "/ ideal", "expiry", "",
    ]);
    let ms = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"));
    for r in rows {
        crate::outln!(
            "{:<11} {:>9} {:>6.1} {:>7} {:>7} {:>7} | {:>8} | {:>7.0} {:>7.0} {:>8} {:>8} {:>7.2} | {:>9.3} {:>6}",
            r.side,
            thousands(r.requests_per_s as usize),
            r.hit_ratio * 100.0,
            ms(r.p50_ms),
            ms(r.p99_ms),
            ms(r.p999_ms),
            thousands(r.warm_up_busiest_second),
            r.steady_queries_per_s,
            r.steady_ideal_per_s,
            thousands(r.steady_busiest_second),
            thousands(r.steady_ideal_busiest_second),
            r.steady_busiest_over_ideal,
            r.loads_per_expiry,
            r.errors
        );
    }
    crate::outln!(
        "warm-up: the first {} (a cold cache filling); the rest is after it. ideal: the queries \
         a perfect single-flight cache runs (one per key per expiry or update)",
        humantime::format_duration(warm_up(load))
    );
    if let [bw, naive] = rows {
        crate::outln!(
            "database's busiest second, naive over breakwater: {:.1}x after the warm-up ({} vs {}), \
             {:.1}x in all ({} vs {})",
            naive.steady_busiest_second as f64 / bw.steady_busiest_second.max(1) as f64,
            thousands(naive.steady_busiest_second),
            thousands(bw.steady_busiest_second),
            naive.busiest_second as f64 / bw.busiest_second.max(1) as f64,
            thousands(naive.busiest_second),
            thousands(bw.busiest_second),
        );
    }
}

/// One side: its fleet released together, its reports gathered.
async fn run_side(
    exe: &std::path::Path,
    opts: &MixedOpts,
    namespace: &str,
    side: Side,
) -> Result<Reported, BoxError> {
    let load = &opts.workload;
    let each = (0..opts.processes).map(|p| {
        [
            "--redis".to_owned(),
            opts.redis.clone(),
            "--namespace".to_owned(),
            namespace.to_owned(),
            "--side".to_owned(),
            side.name().to_owned(),
            "--process".to_owned(),
            p.to_string(),
            "--processes".to_owned(),
            opts.processes.to_string(),
            "--concurrency".to_owned(),
            opts.concurrency.to_string(),
            "--keys".to_owned(),
            load.keys.to_string(),
            "--zipf".to_owned(),
            load.zipf.to_string(),
            "--ttl".to_owned(),
            humantime::format_duration(load.ttl).to_string(),
            format!("--jitter={}", jitter_arg(load.jitter)),
            "--grace".to_owned(),
            humantime::format_duration(load.grace).to_string(),
            "--l1".to_owned(),
            load.l1.to_string(),
            "--l1-ttl".to_owned(),
            humantime::format_duration(load.l1_ttl).to_string(),
            "--writes".to_owned(),
            load.writes.to_string(),
            "--duration".to_owned(),
            humantime::format_duration(load.duration).to_string(),
            "--loader-latency".to_owned(),
            humantime::format_duration(load.loader_latency).to_string(),
            "--db-capacity".to_owned(),
            load.db_capacity.to_string(),
            "--seed".to_owned(),
            load.seed.to_string(),
        ]
        .into()
    });
    let mut fleet = Fleet::spawn(exe, "mixed-worker", each)?;
    fleet.ready(Duration::from_secs(120))?;
    fleet.release()?;
    let mut reported = Reported {
        hist: vec![0; BUCKETS],
        ..Reported::default()
    };
    // A worker reports once its side's duration is over, and its calls in
    // flight have returned.
    let wait = load.duration + Duration::from_secs(120);
    let done = fleet.reports(wait, |line| {
        let mut parts = line.split(' ');
        let tag = parts.next();
        let mut number = || -> Result<u64, BoxError> {
            Ok(parts.next().ok_or("a short report line")?.parse::<u64>()?)
        };
        match tag {
            Some("q") => {
                let at = number()?;
                let id = u32::try_from(number()?)?;
                reported.queries.push((at, id));
            }
            Some("w") => {
                let (from, to) = (number()?, number()?);
                let id = u32::try_from(number()?)?;
                reported.writes.push((from, to, id));
            }
            Some("lat") => {
                let b = usize::try_from(number()?)?;
                let n = number()?;
                if let Some(slot) = reported.hist.get_mut(b) {
                    *slot += n;
                }
            }
            Some("served") => {
                reported.hits += number()?;
                reported.misses += number()?;
            }
            Some("stats") => reported.stats.push(line.to_owned()),
            _ => {}
        }
        Ok(())
    })?;
    for done in done {
        reported.errors += done.err;
        if reported.first_error.is_none() {
            reported.first_error = done.first_error;
        }
    }
    Ok(reported)
}

/// A jitter as `--jitter` takes it.
fn jitter_arg(jitter: JitterArg) -> String {
    match jitter {
        JitterArg::Number(r) | JitterArg::Ratio(r) => format!("ratio:{r}"),
        JitterArg::Down(r) => format!("down:{r}"),
        JitterArg::Fixed(d) => format!("fixed:{}", humantime::format_duration(d)),
        JitterArg::UpTo(d) => format!("up-to:{}", humantime::format_duration(d)),
        JitterArg::None => "none".to_owned(),
    }
}

/// Deletes what both sides wrote: breakwater's entries and leases (one
/// `invalidate_many`), its clear record, and the naive keys.
async fn clean_up(
    urls: &str,
    store: &RedisStore,
    namespace: &str,
    keys: usize,
) -> Result<(), String> {
    let cache = Cache::<u64>::builder()
        .namespace(namespace.to_owned())
        .store(store.clone())
        .build()
        .map_err(|e| e.to_string())?;
    cache
        .invalidate_many((0..keys).map(|id| id as u64))
        .await
        .map_err(|e| e.to_string())?;
    store
        .delete(cache.clear_record_key())
        .await
        .map_err(|e| e.to_string())?;
    let mut raw = super::write::Raw::connect(urls).await?;
    let ids: Vec<usize> = (0..keys).collect();
    for chunk in ids.chunks(1_000) {
        let mut p = redis::pipe();
        for &id in chunk {
            p.cmd("UNLINK").arg(naive_key(namespace, id)).ignore();
        }
        raw.run(&p).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_ordered_and_within_five_percent() {
        let mut last = 0;
        for us in [0u64, 1, 2, 10, 99, 1_000, 12_345, 1_000_000, 60_000_000] {
            let b = bucket(us);
            assert!(b >= last, "{us} µs");
            last = b;
            let floor = bucket_floor_us(b);
            assert!(
                floor <= us && (us as f64) < (floor as f64 + 1.0) * 1.06,
                "{us} µs in {b}, floor {floor}"
            );
        }
    }

    #[test]
    fn a_duplicate_is_a_query_of_a_key_within_its_ttl_with_no_update_between() {
        // Key 1: loaded at 0 and again at 5 (duplicate), then at 100 (an
        // expiry: the shortest TTL is 100). Key 2: loaded at 0, updated at
        // 10..12, loaded at 11 and at 13 (each after an update's mark),
        // then at 14 (a duplicate).
        let queries = [(0, 1), (5, 1), (100, 1), (0, 2), (11, 2), (13, 2), (14, 2)];
        let writes = [(10, 12, 2)];
        assert_eq!(
            needed_queries(&queries, &writes, 100),
            vec![0, 0, 11, 13, 100]
        );
    }

    #[test]
    fn quantiles_come_from_the_histogram() {
        let mut hist = vec![0; BUCKETS];
        hist[bucket(1_000)] = 99;
        hist[bucket(50_000)] = 1;
        assert_eq!(
            quantile_us(&hist, 0.5),
            Some(bucket_floor_us(bucket(1_000)))
        );
        assert_eq!(
            quantile_us(&hist, 1.0),
            Some(bucket_floor_us(bucket(50_000)))
        );
        assert_eq!(quantile_us(&[0; 4], 0.5), None);
    }
}

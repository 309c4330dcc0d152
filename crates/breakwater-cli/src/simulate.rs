//! `breakwater simulate`: a keyspace written at once, then steady traffic on
//! a virtual clock, against a slow database: a naive cache next to
//! breakwater, to watch the avalanche (every key expiring in the same
//! second) and the stampede (every request for a missing hot key querying
//! the database) happen, and not happen.
//!
//! Both scenarios run on the embedded memory store with paused tokio time
//! (a run of minutes takes seconds, and the same seed gives the same
//! figures). Requests arrive evenly at `--rps` and pick keys with a Zipf
//! distribution (a few hot keys, a long tail).
//!
//! - **naive**: `GET`; on a miss, query the database and `SET` with the one
//!   TTL. No jitter, no coalescing.
//! - **breakwater**: [`Cache::get_or_load`] with jitter, single-flight and a
//!   grace window of a tenth of the TTL.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use breakwater::{Cache, Error, Jitter, MemoryStore, Store};
use clap::Args;
use clap::builder::RangedU64ValueParser;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::bench::percentile;
use crate::db::Database;
use crate::demo::expiry_stats;

/// Options of `breakwater simulate`.
#[derive(Debug, Clone, Args)]
pub(crate) struct SimulateOpts {
    /// Keys, all written at the start with one TTL.
    #[arg(long, default_value_t = 2_000,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub(crate) keys: usize,
    /// Requests per second.
    #[arg(long, default_value_t = 400, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) rps: u32,
    /// Simulated minutes of traffic.
    #[arg(long, default_value_t = 25, value_parser = clap::value_parser!(u64).range(1..=1_440))]
    pub(crate) minutes: u64,
    /// Base TTL in seconds.
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(crate) ttl_secs: u64,
    /// breakwater's jitter ratio (±ratio).
    #[arg(long, default_value_t = 0.2, allow_negative_numbers = true)]
    pub(crate) ratio: f64,
    /// How long one database query takes, in milliseconds.
    #[arg(long, default_value_t = 50)]
    pub(crate) db_ms: u64,
    /// Zipf exponent of key popularity (0 = uniform).
    #[arg(long, default_value_t = 1.0)]
    pub(crate) zipf: f64,
    /// Seed for key choice and jitter.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
}

/// What one scenario measured.
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    /// Database queries in all (the initial bulk write not counted).
    pub(crate) queries: usize,
    /// The most queries started in any one second.
    pub(crate) peak_per_second: usize,
    /// The most queries running at once.
    pub(crate) peak_at_once: usize,
    /// Queries started in each simulated minute.
    pub(crate) per_minute: Vec<usize>,
    /// Request latencies in microseconds, sorted.
    pub(crate) latencies_us: Vec<u64>,
    /// Requests that failed.
    pub(crate) errors: usize,
}

/// Both scenarios.
#[derive(Debug, Clone)]
pub(crate) struct Simulation {
    pub(crate) naive: Outcome,
    pub(crate) breakwater: Outcome,
}

/// The most requests one scenario simulates (the latencies are kept).
const MAX_REQUESTS: u64 = 20_000_000;

/// Why a simulation could not run.
#[derive(Debug)]
pub(crate) enum SimError {
    /// `rps × minutes × 60` is above [`MAX_REQUESTS`].
    TooLarge(u64),
    /// The library refused an option, or the store failed.
    Cache(Error),
}

impl std::fmt::Display for SimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SimError::TooLarge(n) => write!(
                f,
                "{n} requests per scenario is too many (at most {MAX_REQUESTS}): lower --rps or --minutes"
            ),
            SimError::Cache(err) => err.fmt(f),
        }
    }
}

impl From<Error> for SimError {
    fn from(err: Error) -> Self {
        SimError::Cache(err)
    }
}

impl From<breakwater::ConfigError> for SimError {
    fn from(err: breakwater::ConfigError) -> Self {
        SimError::Cache(err.into())
    }
}

/// Runs `breakwater simulate`.
pub(crate) async fn main(opts: SimulateOpts) -> ExitCode {
    let handle = std::thread::spawn(move || {
        let simulation = simulate(&opts);
        (opts, simulation)
    });
    // The simulation has its own paused runtime on its own thread; wait for
    // it without blocking this runtime.
    let joined = tokio::task::spawn_blocking(move || handle.join()).await;
    match joined {
        Ok(Ok((opts, Ok(simulation)))) => {
            print!("{}", render(&opts, &simulation));
            ExitCode::SUCCESS
        }
        Ok(Ok((_, Err(err)))) => {
            eprintln!("error: {err}");
            match err {
                SimError::TooLarge(_) => ExitCode::from(2),
                SimError::Cache(err) if err.is_config() => ExitCode::from(2),
                SimError::Cache(_) => ExitCode::FAILURE,
            }
        }
        _ => {
            eprintln!("error: the simulation panicked");
            ExitCode::FAILURE
        }
    }
}

/// Runs both scenarios, each on a fresh paused runtime.
///
/// # Errors
///
/// A [`Config`](breakwater::ErrorKind::Config) error for options the
/// library rejects (e.g. a ratio outside `0..=1`).
pub(crate) fn simulate(opts: &SimulateOpts) -> Result<Simulation, SimError> {
    Jitter::ratio(opts.ratio).validate()?;
    let total = u64::from(opts.rps) * opts.minutes * 60;
    if total > MAX_REQUESTS {
        return Err(SimError::TooLarge(total));
    }
    let run = |naive: bool| {
        // A current-thread runtime with a paused clock allocates and spawns
        // nothing that can fail short of memory exhaustion.
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a current-thread runtime")
            .block_on(scenario(opts, naive))
    };
    Ok(Simulation {
        naive: run(true)?,
        breakwater: run(false)?,
    })
}

/// Zipf key choice: `cdf[i]` is the probability of a key `<= i`.
fn zipf_cdf(keys: usize, s: f64) -> Vec<f64> {
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

fn pick(cdf: &[f64], u: f64) -> usize {
    cdf.partition_point(|&p| p < u).min(cdf.len() - 1)
}

/// One scenario on the current (paused) runtime.
async fn scenario(opts: &SimulateOpts, naive: bool) -> Result<Outcome, Error> {
    let store = MemoryStore::new();
    let ttl = Duration::from_secs(opts.ttl_secs);
    let cache = Cache::<u64>::builder()
        .namespace("simulate")
        .store(store.clone())
        .ttl(ttl)
        .jitter(Jitter::ratio(opts.ratio))
        .grace(ttl / 10)
        .rng_seed(opts.seed)
        .build()?;
    let naive_key = |key: usize| format!("naive:{key}").into_bytes();

    // The bulk write that every key's expiry dates from.
    for key in 0..opts.keys {
        if naive {
            store
                .set(&naive_key(key), &(key as u64).to_be_bytes(), ttl)
                .await?;
        } else {
            cache.set(key.to_string(), &(key as u64)).await?;
        }
    }

    let cdf = Arc::new(zipf_cdf(opts.keys, opts.zipf));
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let total = u64::from(opts.rps) * opts.minutes * 60;
    let gap_ns = 1_000_000_000 / u64::from(opts.rps);
    let db = Arc::new(Database::new(Duration::from_millis(opts.db_ms)));
    let began = Instant::now();
    // Finished requests are reaped as the run goes, so memory follows the
    // requests in flight, not all of them.
    let mut tasks = JoinSet::new();
    let mut latencies_us = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
    let mut errors = 0;
    let mut record = |done: Result<Result<Duration, Error>, tokio::task::JoinError>| match done {
        Ok(Ok(latency)) => {
            latencies_us.push(u64::try_from(latency.as_micros()).unwrap_or(u64::MAX));
        }
        _ => errors += 1,
    };
    for i in 0..total {
        let arrival = began + Duration::from_nanos(gap_ns * i);
        tokio::time::sleep_until(arrival).await;
        let key = pick(&cdf, rng.random::<f64>());
        let db = Arc::clone(&db);
        if naive {
            let store = store.clone();
            let raw = naive_key(key);
            tasks.spawn(async move {
                let start = Instant::now();
                if store.get(&raw).await?.is_none() {
                    db.query().await;
                    store.set(&raw, &(key as u64).to_be_bytes(), ttl).await?;
                }
                Ok::<_, Error>(start.elapsed())
            });
        } else {
            let cache = cache.clone();
            tasks.spawn(async move {
                let start = Instant::now();
                cache
                    .get_or_load(key.to_string(), move || {
                        let db = Arc::clone(&db);
                        async move {
                            db.query().await;
                            Ok::<_, Error>(Some(key as u64))
                        }
                    })
                    .await?;
                Ok::<_, Error>(start.elapsed())
            });
        }
        while let Some(done) = tasks.try_join_next() {
            record(done);
        }
    }
    while let Some(done) = tasks.join_next().await {
        record(done);
    }
    latencies_us.sort_unstable();
    let started = db.started_ms();
    let mut per_minute = vec![0; usize::try_from(opts.minutes).unwrap_or(0).max(1)];
    for &ms in &started {
        let minute = usize::try_from(ms / 60_000).unwrap_or(usize::MAX);
        if let Some(slot) = per_minute.get_mut(minute) {
            *slot += 1;
        }
    }
    Ok(Outcome {
        queries: started.len(),
        peak_per_second: expiry_stats(&started).peak_1s,
        peak_at_once: db.peak(),
        per_minute,
        latencies_us,
        errors,
    })
}

/// The report as text.
pub(crate) fn render(opts: &SimulateOpts, sim: &Simulation) -> String {
    use std::fmt::Write as _;

    let mut out = String::new();
    let _ = writeln!(
        out,
        "simulate: {} keys written at once with a {} s TTL, then {} requests/s for {} min",
        opts.keys, opts.ttl_secs, opts.rps, opts.minutes
    );
    let _ = writeln!(
        out,
        "(Zipf s={}), database {} ms per query, virtual clock, seed {}",
        opts.zipf, opts.db_ms, opts.seed
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<11} {:>8} {:>7} {:>8} {:>8} {:>8} {:>8} {:>7}",
        "", "queries", "peak/s", "at once", "waited", "p99 ms", "max ms", "errors"
    );
    for (name, o) in [("naive", &sim.naive), ("breakwater", &sim.breakwater)] {
        // Requests that waited for the database (any wait at all: the
        // store itself answers at once on the virtual clock).
        let waited = o.latencies_us.iter().filter(|&&us| us >= 1_000).count();
        let _ = writeln!(
            out,
            "{name:<11} {:>8} {:>7} {:>8} {:>8} {:>8} {:>8} {:>7}",
            o.queries,
            o.peak_per_second,
            o.peak_at_once,
            waited,
            quantile_ms(&o.latencies_us, 0.99),
            quantile_ms(&o.latencies_us, 1.0),
            o.errors
        );
    }
    let _ = writeln!(
        out,
        "(queries: database queries; peak/s: most started in one second; at once: most"
    );
    let _ = writeln!(
        out,
        "running together; waited: requests that waited for one)"
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "database queries per minute (each row to its own peak):"
    );
    for (name, o) in [("naive", &sim.naive), ("breakwater", &sim.breakwater)] {
        let peak = o.per_minute.iter().copied().max().unwrap_or(0);
        let _ = writeln!(out, "{name:<11} {} (peak {peak})", sparkline(&o.per_minute));
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "naive: every key written together expires together, and every request for a"
    );
    let _ = writeln!(
        out,
        "missing key queries the database. breakwater: jittered TTLs spread the expiries;"
    );
    let _ = writeln!(
        out,
        "one query per key refills it while callers get the stale value (grace)."
    );
    out
}

/// The `p` quantile (nearest rank) of sorted µs samples, in ms.
fn quantile_ms(sorted_us: &[u64], p: f64) -> String {
    percentile(sorted_us, p).map_or("-".to_owned(), |us| format!("{:.1}", us as f64 / 1000.0))
}

/// One block character per value, scaled to the largest.
fn sparkline(values: &[usize]) -> String {
    const BLOCKS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let max = values.iter().copied().max().unwrap_or(0).max(1);
    values
        .iter()
        .map(|&v| BLOCKS[(v * (BLOCKS.len() - 1)).div_ceil(max).min(BLOCKS.len() - 1)])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> SimulateOpts {
        SimulateOpts {
            keys: 200,
            rps: 400,
            minutes: 3,
            ttl_secs: 60,
            ratio: 0.2,
            db_ms: 50,
            zipf: 1.0,
            seed: 7,
        }
    }

    #[test]
    fn breakwater_flattens_the_avalanche_and_the_stampede() {
        let sim = simulate(&opts()).unwrap();
        let (naive, bw) = (&sim.naive, &sim.breakwater);
        assert_eq!((naive.errors, bw.errors), (0, 0));
        assert_eq!(naive.latencies_us.len(), 400 * 180);
        // Every naive key expires at 60 s exactly: the busiest second
        // queries for many keys at once (and for hot keys, many times).
        assert!(
            naive.peak_per_second >= 4 * bw.peak_per_second.max(1),
            "naive {} vs breakwater {}",
            naive.peak_per_second,
            bw.peak_per_second
        );
        assert!(naive.peak_at_once > bw.peak_at_once, "{naive:?} {bw:?}");
        // Grace: breakwater's callers do not wait for the database.
        assert!(
            bw.latencies_us[bw.latencies_us.len() * 99 / 100] < 50_000,
            "{bw:?}"
        );
    }

    #[test]
    fn the_same_seed_gives_the_same_figures() {
        let a = simulate(&opts()).unwrap();
        let b = simulate(&opts()).unwrap();
        assert_eq!(a.naive.per_minute, b.naive.per_minute);
        assert_eq!(a.breakwater.per_minute, b.breakwater.per_minute);
        assert_eq!(a.breakwater.queries, b.breakwater.queries);
    }

    #[test]
    fn bad_options_are_refused_before_anything_runs() {
        let err = simulate(&SimulateOpts {
            ratio: 1.5,
            ..opts()
        })
        .unwrap_err();
        assert!(matches!(&err, SimError::Cache(e) if e.is_config()), "{err}");
        let huge = SimulateOpts {
            rps: 100_000,
            minutes: 1_440,
            ..opts()
        };
        assert!(matches!(
            simulate(&huge),
            Err(SimError::TooLarge(8_640_000_000))
        ));
    }

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
    fn sparklines_scale_to_the_peak() {
        assert_eq!(sparkline(&[0, 1, 8]), "▁▂█");
        assert_eq!(sparkline(&[0, 0]), "▁▁");
    }
}

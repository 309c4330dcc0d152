//! `breakwater simulate`: a keyspace written at once, then steady traffic on
//! a virtual clock against a simulated database, once per strategy: a
//! naive cache next to breakwater, to watch the avalanche (every key
//! expiring in the same second) and the stampede (every request for a
//! missing hot key querying the database) happen, and not happen.
//!
//! Every strategy runs on its own embedded memory store with paused tokio
//! time (a run of minutes takes seconds, and the same seed gives the same
//! figures). Requests arrive evenly at `--rps` and pick keys with a Zipf
//! law (a few hot keys, a long tail); the database ([`Database`](crate::db::Database)) slows
//! down past its capacity.
//!
//! - **naive**: `GET`; on a miss, query the database and `SET` with the one
//!   TTL. No jitter, no coalescing, no stale values.
//! - **breakwater**: [`Cache::get_or_load`](breakwater_cache::Cache::get_or_load)
//!   with the jitter, single-flight, the grace window and early refresh.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use breakwater_cache::{Error, MemoryStore};
use clap::builder::RangedU64ValueParser;
use clap::{Args, ValueEnum};
use indicatif::ProgressBar;

use crate::args::{self, JitterArg};
use crate::chart::{self, Event};
use crate::failure::{self, Failure};
use crate::outcome::{self, Column, Outcome, Table};
use crate::progress;
use crate::report::{ms, thousands};
use crate::scenario::{self, CacheSpec, DatabaseSpec, Scenario, Strategy};
use crate::traffic::{self, Traffic, Workload};

/// Options of `breakwater simulate`.
#[derive(Debug, Clone, Args)]
pub(crate) struct SimulateOpts {
    /// Keys, all written at the start with one TTL.
    #[arg(long, value_name = "N", default_value_t = 2_000,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub(crate) keys: usize,
    /// Base TTL of the keys, e.g. `10m` or `1h` (1s to 365d).
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = args::ttl)]
    pub(crate) ttl: Duration,
    /// TTL jitter: `0.2` or `ratio:0.2` (±20%), `down:0.2` (−20% to 0),
    /// `±30s` or `fixed:30s`, `up-to:30s` (0 to +30s), or `none`.
    #[arg(long, value_name = "JITTER", default_value = "0.2", value_parser = args::jitter, allow_hyphen_values = true)]
    pub(crate) jitter: JitterArg,
    /// breakwater's grace (stale-while-revalidate) window; a tenth of the
    /// TTL when not given.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub(crate) grace: Option<Duration>,
    /// Requests per second.
    #[arg(long, default_value_t = 400, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) rps: u32,
    /// Zipf exponent of key popularity (0 = uniform).
    #[arg(long, default_value_t = 1.0, value_parser = zipf)]
    pub(crate) zipf: f64,
    /// How long one loader call (a database query) takes, e.g. `5ms` (0 to
    /// 1m).
    #[arg(long, value_name = "DURATION", default_value = "50ms", value_parser = args::loader_latency)]
    pub(crate) loader_latency: Duration,
    /// Queries the database runs at once at `--loader-latency`; past it
    /// every query slows down in proportion (0 = no limit).
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub(crate) db_capacity: usize,
    /// Simulated time of traffic (`90s`, `25m`); longer than the TTL to see
    /// the bulk write expire.
    #[arg(long, value_name = "DURATION", default_value = "25m", value_parser = window)]
    pub(crate) duration: Duration,
    /// The strategies to run, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "naive,breakwater")]
    pub(crate) strategies: Vec<StrategyArg>,
    /// Seed for key choice and jitter.
    #[arg(long, value_name = "SEED", default_value_t = 1)]
    pub(crate) seed: u64,
    /// Print the figures as JSON instead of tables.
    #[arg(long)]
    pub(crate) json: bool,
    /// Directory the chart is written to (created if missing).
    #[arg(long, value_name = "DIR", default_value = "breakwater-simulate")]
    pub(crate) out: PathBuf,
}

/// A caching strategy, as `--strategies` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum StrategyArg {
    /// GET, and on a miss query and SET: no jitter, no coalescing.
    Naive,
    /// breakwater's `get_or_load`.
    Breakwater,
}

/// A duration of 1 s to 1 day.
pub(crate) fn window(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|err| err.to_string())?;
    if (Duration::from_secs(1)..=Duration::from_secs(86_400)).contains(&d) {
        Ok(d)
    } else {
        Err("must be between 1s and 1 day".to_owned())
    }
}

/// A Zipf exponent in `0..=10`.
pub(crate) fn zipf(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    if (0.0..=10.0).contains(&v) {
        Ok(v)
    } else {
        Err("must be between 0 and 10".to_owned())
    }
}

/// The most requests one strategy simulates (the latencies are kept).
const MAX_REQUESTS: u64 = 20_000_000;

/// Width of the strategies' names in the report.
const NAME_WIDTH: usize = 11;

/// The report's table.
const TABLE: Table = Table {
    name_width: NAME_WIDTH,
    columns: &[
        Column {
            heading: "queries",
            width: 9,
            figure: |o| thousands(o.queries),
        },
        Column {
            heading: "peak/s",
            width: 8,
            figure: |o| thousands(o.peak_per_second),
        },
        Column {
            heading: "at once",
            width: 8,
            figure: |o| thousands(o.peak_at_once),
        },
        Column {
            heading: "waited",
            width: 8,
            figure: |o| thousands(o.waited),
        },
        Column {
            heading: "p50 ms",
            width: 8,
            figure: |o| ms(o.p50_ms),
        },
        Column {
            heading: "p99 ms",
            width: 8,
            figure: |o| ms(o.p99_ms),
        },
        Column {
            heading: "max ms",
            width: 8,
            figure: |o| ms(o.max_ms),
        },
        Column {
            heading: "stale",
            width: 7,
            figure: |o| thousands(o.stale),
        },
        Column {
            heading: "errors",
            width: 7,
            figure: |o| thousands(o.errors),
        },
    ],
    legend: "(queries: database queries; peak/s: most started in one second; at once: most\n \
             running together; waited: requests not answered at once)",
};

/// Runs `breakwater simulate`.
pub(crate) async fn main(opts: SimulateOpts) -> ExitCode {
    let warnings = warnings(&opts);
    for warning in &warnings {
        eprintln!("breakwater simulate: warning: {warning}");
    }
    let total = workload(&opts).total();
    if total > MAX_REQUESTS {
        return Failure::usage(format!(
            "{total} requests per strategy is too many (at most {MAX_REQUESTS}): lower --rps \
             or --duration"
        ))
        .exit("simulate");
    }
    // Checked before any strategy runs: a setting the library refuses, or an
    // --out that cannot be written, must not cost a whole run.
    if let Err(err) = cache_spec(&opts).build(&MemoryStore::new(), opts.seed, None) {
        return Failure::from(err).exit("simulate");
    }
    if let Err(err) = std::fs::create_dir_all(&opts.out) {
        return Failure::runtime(format!("cannot create --out {}: {err}", opts.out.display()))
            .exit("simulate");
    }
    let bar = progress::bar(total * opts.strategies.len() as u64, "simulating");
    let (run_opts, run_bar) = (opts.clone(), bar.clone());
    let outcomes = traffic::off_thread(move || simulate(&run_opts, Some(&run_bar))).await;
    bar.finish_and_clear();
    let result = match outcomes {
        None => Err(Failure::runtime("the simulation panicked")),
        Some(outcomes) => outcomes
            .map_err(Failure::from)
            .and_then(|outcomes| report(&opts, &outcomes, &warnings)),
    };
    failure::finish("simulate", result)
}

/// Writes the chart and prints the report.
fn report(opts: &SimulateOpts, outcomes: &[Outcome], warnings: &[String]) -> Result<(), Failure> {
    let panicked: usize = outcomes.iter().map(|o| o.panicked).sum();
    if panicked > 0 {
        return Err(Failure::runtime(format!(
            "{panicked} simulated request(s) panicked"
        )));
    }
    let chart = outcome::chart(
        format!(
            "{} keys written at once, TTL {}, {} requests/s",
            thousands(opts.keys),
            humantime::format_duration(opts.ttl),
            thousands(opts.rps as usize)
        ),
        outcomes,
        vec![Event {
            at_s: opts.ttl.as_secs_f64(),
            label: "TTL".to_owned(),
        }],
        false,
    );
    let charts = chart::write(&chart, &opts.out, "simulate")?;
    if opts.json {
        let json = serde_json::json!({
            "keys": opts.keys,
            "ttl_s": opts.ttl.as_secs_f64(),
            "jitter": opts.jitter.to_string(),
            "grace_s": grace(opts).as_secs_f64(),
            "rps": opts.rps,
            "zipf": opts.zipf,
            "loader_latency_ms": opts.loader_latency.as_secs_f64() * 1000.0,
            "db_capacity": opts.db_capacity,
            "duration_s": opts.duration.as_secs_f64(),
            "seed": opts.seed,
            "warnings": warnings,
            "strategies": outcomes,
            "charts": charts,
        });
        crate::outln!("{json:#}");
    } else {
        crate::out!("{}", render(opts, outcomes));
        crate::outln!("chart: {} and {}", charts[0].display(), charts[1].display());
    }
    Ok(())
}

/// What looks wrong with the options, said before running.
pub(crate) fn warnings(opts: &SimulateOpts) -> Vec<String> {
    let mut out = Vec::new();
    // The last request is sent before the window ends, and a key is gone
    // only once its time has passed: the window must reach past the latest
    // expiry for every key of the bulk write to expire in it.
    let latest = opts.ttl.max(opts.jitter.jitter().bounds(opts.ttl).1);
    if opts.duration <= latest {
        out.push(format!(
            "--duration {} does not reach past the bulk write's expiries (naive: all at {}; \
             breakwater: up to {}): keys that expire after the window are never reloaded, so \
             the figures understate the avalanche; use a --duration longer than {}",
            humantime::format_duration(opts.duration),
            humantime::format_duration(opts.ttl),
            humantime::format_duration(latest),
            humantime::format_duration(latest)
        ));
    }
    out
}

/// breakwater's grace: as given, or a tenth of the TTL.
fn grace(opts: &SimulateOpts) -> Duration {
    opts.grace.unwrap_or(opts.ttl / 10)
}

fn workload(opts: &SimulateOpts) -> Workload {
    Workload {
        keys: opts.keys,
        rps: opts.rps,
        duration: opts.duration,
        zipf: opts.zipf,
        seed: opts.seed,
    }
}

/// The scenario `opts` describe: `--keys` written at once, then steady
/// traffic, once per strategy.
fn scenario_of(opts: &SimulateOpts) -> Scenario {
    let mut db = DatabaseSpec::new(opts.loader_latency);
    if opts.db_capacity > 0 {
        db = db.capacity(opts.db_capacity);
    }
    Scenario {
        keys: opts.keys,
        warm_up: None,
        clear_at: None,
        db,
        traffic: Traffic::Steady(workload(opts)),
        seconds: usize::try_from(opts.duration.as_secs()).unwrap_or(usize::MAX),
        origin: None,
        strategies: opts
            .strategies
            .iter()
            .map(|strategy| match strategy {
                StrategyArg::Naive => Strategy::naive("naive", opts.ttl),
                StrategyArg::Breakwater => Strategy::breakwater("breakwater", cache_spec(opts)),
            })
            .collect(),
        seed: opts.seed,
    }
}

/// breakwater's cache for `opts`.
fn cache_spec(opts: &SimulateOpts) -> CacheSpec {
    CacheSpec::new(opts.ttl, opts.jitter.jitter()).grace(grace(opts))
}

/// Runs every strategy, each on a fresh paused runtime.
///
/// # Errors
///
/// A [`Config`](breakwater_cache::ErrorKind::Config) error for options the
/// library rejects (e.g. a grace window above its limit).
pub(crate) fn simulate(
    opts: &SimulateOpts,
    progress: Option<&ProgressBar>,
) -> Result<Vec<Outcome>, Error> {
    scenario::run(&scenario_of(opts), progress)
}

/// The report as text.
pub(crate) fn render(opts: &SimulateOpts, outcomes: &[Outcome]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "simulate: {} keys written at once with TTL {}, then {} requests/s for {} (Zipf s={})",
        thousands(opts.keys),
        humantime::format_duration(opts.ttl),
        thousands(opts.rps as usize),
        humantime::format_duration(opts.duration),
        opts.zipf
    );
    let capacity = if opts.db_capacity == 0 {
        "no capacity limit".to_owned()
    } else {
        format!("slower past {} at once", thousands(opts.db_capacity))
    };
    let _ = writeln!(
        out,
        "database {} a query, {capacity}; breakwater: jitter {}, grace {}; virtual clock, seed {}",
        humantime::format_duration(opts.loader_latency),
        opts.jitter,
        humantime::format_duration(grace(opts)),
        opts.seed
    );
    let _ = writeln!(out);
    out.push_str(&TABLE.render(outcomes));
    let _ = writeln!(out);
    let _ = writeln!(out, "expiries of the bulk write:");
    for o in outcomes {
        let _ = writeln!(out, "{:<NAME_WIDTH$} {}", o.name, o.expiries.describe());
    }
    let _ = writeln!(out);
    out.push_str(&outcome::sparkline_chart(outcomes, NAME_WIDTH));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> SimulateOpts {
        SimulateOpts {
            keys: 200,
            ttl: Duration::from_secs(60),
            jitter: JitterArg::Ratio(0.2),
            grace: None,
            rps: 400,
            zipf: 1.0,
            loader_latency: Duration::from_millis(50),
            db_capacity: 100,
            duration: Duration::from_secs(180),
            strategies: vec![StrategyArg::Naive, StrategyArg::Breakwater],
            seed: 7,
            json: false,
            out: PathBuf::new(),
        }
    }

    #[test]
    fn breakwater_flattens_the_avalanche_and_the_stampede() {
        let outcomes = simulate(&opts(), None).unwrap();
        let (naive, bw) = (&outcomes[0], &outcomes[1]);
        assert_eq!((naive.errors, bw.errors), (0, 0));
        assert_eq!(naive.requests, 400 * 180);
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
        assert!(bw.p99_ms.unwrap() < 50.0, "{bw:?}");
    }

    /// The seed's own figures, with a fixed seed: 100,000 keys written at
    /// once with TTL 300 s.
    #[test]
    fn the_seed_figures_of_a_bulk_write() {
        let bulk = |spec: &str| {
            let opts = SimulateOpts {
                keys: 100_000,
                ttl: Duration::from_secs(300),
                jitter: args::jitter(spec).unwrap(),
                duration: Duration::from_secs(1),
                rps: 1,
                strategies: vec![StrategyArg::Breakwater],
                seed: 42,
                ..opts()
            };
            let outcome = simulate(&opts, None).unwrap().remove(0);
            assert_eq!(outcome.expiries.count, 100_000);
            outcome.expiries
        };

        let e = bulk("ratio:0.2");
        assert!(e.first_s >= 240.0 && e.last_s <= 360.0, "{e:?}");
        assert!(e.first_s < 241.0 && e.last_s > 359.0, "{e:?}");
        let even = 100_000.0 / 120.0;
        assert!(
            (e.mean_per_second - even).abs() <= 0.05 * even,
            "mean {} vs {even}",
            e.mean_per_second
        );
        assert!(e.busiest_second as f64 <= 1.2 * even, "{e:?}");

        let e = bulk("ratio:0.1");
        assert!(e.first_s >= 270.0 && e.last_s <= 330.0, "{e:?}");
        assert!(e.first_s < 271.0 && e.last_s > 329.0, "{e:?}");

        let e = bulk("none");
        assert_eq!(e.busiest_second, 100_000);
        assert_eq!((e.first_s, e.last_s), (300.0, 300.0));
    }

    #[test]
    fn the_same_seed_gives_the_same_figures() {
        let a = simulate(&opts(), None).unwrap();
        let b = simulate(&opts(), None).unwrap();
        for (a, b) in a.iter().zip(&b) {
            assert_eq!(a.per_second, b.per_second);
            assert_eq!(a.expiries, b.expiries);
        }
    }

    #[test]
    fn a_window_shorter_than_the_ttl_is_warned_about() {
        let short = SimulateOpts {
            duration: Duration::from_secs(120),
            ttl: Duration::from_secs(600),
            ..opts()
        };
        let warned = warnings(&short);
        assert_eq!(warned.len(), 1, "{warned:?}");
        assert!(warned[0].contains("does not reach past"), "{warned:?}");
        assert!(warnings(&opts()).is_empty());
        // As long as the TTL, or inside the jitter's reach: warned too.
        for secs in [600, 700] {
            let edge = SimulateOpts {
                duration: Duration::from_secs(secs),
                ttl: Duration::from_secs(600),
                ..opts()
            };
            assert_eq!(warnings(&edge).len(), 1, "{secs} s");
        }
    }
}

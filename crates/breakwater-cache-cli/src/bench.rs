//! `breakwater bench stampede`: one hot key, C concurrent callers in each of
//! P processes, released together against a Redis where the key is missing.
//! Runs breakwater's `get_or_load` and the common naive lock-and-sleep
//! algorithm (`GET`; on a miss `SET NX` a lock and load, while the others
//! sleep and retry) side by side, on the same Redis, and reports
//! loads, call latency and wake-up delay (how long after the value was
//! produced each caller got it).
//!
//! Every bench checks the URL and that Redis answers before it prints
//! anything, and deletes the keys it wrote when it ends, also when it fails
//! (keys named with this process's id, so another bench's keys are left
//! alone).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::builder::RangedU64ValueParser;
use clap::{Args, Subcommand};

use crate::args;
use crate::failure::{Failure, bad_url, shown, unreachable};
use crate::fleet::{BoxError, Fleet};
use crate::report::{percentile, stats_line, us_as_ms};
use crate::worker::Algo;

/// `breakwater bench` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum BenchCommand {
    /// Stampede on one hot key: loads, latency and wake-up, breakwater vs naive.
    #[command(
        after_help = "Example:\n  breakwater bench stampede --redis redis://127.0.0.1:6379 \\\n      --concurrency 100,1000 --processes 1,4 --runs 3"
    )]
    Stampede(StampedeOpts),
    /// A hot key in grace: how many callers wait on its refresh instead of
    /// being served the stale value at once (goal 0).
    #[command(
        after_help = "Example:\n  breakwater bench grace --redis redis://127.0.0.1:6379 --concurrency 100,1000"
    )]
    Grace(GraceOpts),
    /// Redis hits: `get_or_load` next to raw GETs on one connection, with ratios.
    #[command(
        after_help = "Example:\n  breakwater bench hit --redis redis://127.0.0.1:6379 --trials 6 --trial 1s\n  breakwater bench hit --redis redis://127.0.0.1:6379 --workers 2"
    )]
    Hit(HitOpts),
    /// `get_many` from several processes for overlapping ids at once: every
    /// id loaded once fleet-wide, batch loader calls, latency.
    #[command(
        after_help = "Example:\n  breakwater bench many --redis redis://127.0.0.1:6379 --processes 4 --ids 1000\n  breakwater bench many --redis redis://10.0.0.1:7000,redis://10.0.0.2:7000"
    )]
    Many(crate::many::ManyOpts),
    /// Writes: `set_many` and concurrent `set`s next to raw pipelined
    /// `SET PX`s on the same server, and `invalidate_many` next to single
    /// invalidations, with ratios.
    #[command(
        after_help = "Example:\n  breakwater bench write --redis redis://127.0.0.1:6379\n  breakwater bench write --redis redis://10.0.0.1:7000,redis://10.0.0.2:7000 --items 20000"
    )]
    Write(WriteOpts),
    /// A production-shaped workload: processes x callers on Zipf keys with
    /// TTL, jitter, grace, L1 and row updates, against a simulated
    /// database, through breakwater and through a naive cache; database
    /// load against its ideal.
    #[command(
        after_help = "Example:\n  breakwater bench mixed --redis redis://127.0.0.1:6379 --duration 60s\n  breakwater bench mixed --redis redis://127.0.0.1:6379 --jitter none --grace 0s --writes 200"
    )]
    Mixed(mixed::MixedOpts),
}

/// Options of `breakwater bench write`.
#[derive(Debug, Clone, Args)]
pub(crate) struct WriteOpts {
    /// Redis URL to run against, or a cluster's nodes, comma-separated
    /// (writes keys under `bw:bench-write-<pid>:` and
    /// `raw:bench-write-<pid>:`, and deletes them when it ends).
    #[arg(long, value_name = "URL")]
    pub(crate) redis: String,
    /// Interleaved trials per scenario (1 to 100); the ratio is of the
    /// medians. Which side runs first alternates, raw first in the first
    /// trial.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = RangedU64ValueParser::<usize>::new().range(1..=100))]
    pub(crate) trials: usize,
    /// Writes per trial and side (1 to 10,000,000).
    #[arg(long, value_name = "N", default_value_t = 100_000, value_parser = RangedU64ValueParser::<usize>::new().range(1..=10_000_000))]
    pub(crate) items: usize,
    /// The raw side's pipeline length next to `set_many` (1 to 10,000,000;
    /// default: all the items in one pipeline, as `set_many` gets them in
    /// one call).
    #[arg(long, value_name = "N", value_parser = RangedU64ValueParser::<usize>::new().range(1..=10_000_000))]
    pub(crate) batch: Option<usize>,
    /// Concurrent `set` calls, next to raw pipelines of as many `SET`s (1
    /// to 10,000).
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = RangedU64ValueParser::<usize>::new().range(1..=10_000))]
    pub(crate) in_flight: usize,
    /// Bytes of each value (1 to 1,000,000).
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub(crate) value_bytes: usize,
    /// Keys of the invalidation scenario (`invalidate_many` next to one
    /// `invalidate` at a time; 1 to 1,000,000, at most `--items`).
    #[arg(long, value_name = "N", default_value_t = 1_000, value_parser = RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub(crate) invalidations: usize,
    /// Only the `set_many` scenario.
    #[arg(long)]
    pub(crate) set_many_only: bool,
}

/// The comparison itself; `cargo bench -p breakwater-cache-cli --bench
/// write` runs it through this command, on a private `redis-server` and a
/// private cluster.
mod write;

/// `breakwater bench mixed` and its worker processes.
pub(crate) mod mixed;

/// `breakwater bench write`: its scenarios, one line each.
async fn write(opts: &WriteOpts) -> Result<(), Failure> {
    let first = opts.redis.split(',').next().unwrap_or_default().trim();
    check_redis(first).await?;
    crate::outln!(
        "Writes on {}: {} writes of {}-byte values per trial and side, {} trial(s), interleaved \
         (which side runs first alternates)",
        shown(&opts.redis),
        opts.items,
        opts.value_bytes,
        opts.trials,
    );
    let spinner = crate::progress::spinner("bench write");
    let plan = write::Plan {
        urls: opts.redis.clone(),
        trials: opts.trials,
        items: opts.items,
        batch: opts.batch.unwrap_or(opts.items),
        in_flight: opts.in_flight,
        value_bytes: opts.value_bytes,
        singles: !opts.set_many_only,
        invalidations: opts.invalidations.min(opts.items),
    };
    let rows = write::compare(&plan).await;
    spinner.finish_and_clear();
    for row in rows.map_err(Failure::runtime)? {
        crate::outln!("{row}");
    }
    Ok(())
}

/// Options of `breakwater bench hit`.
#[derive(Debug, Clone, Args)]
pub(crate) struct HitOpts {
    /// Redis URL to run against (writes keys under `bw:bench-hit-<pid>:`
    /// and `raw:bench-hit-<pid>:`, and deletes them when it ends).
    #[arg(long, value_name = "URL")]
    pub(crate) redis: String,
    /// Interleaved trials per scenario (1 to 100); the ratio is of the
    /// medians. Which side runs first alternates, raw GETs first in the
    /// first trial: an even count balances the order.
    #[arg(long, value_name = "N", default_value_t = 6, value_parser = RangedU64ValueParser::<usize>::new().range(1..=100))]
    pub(crate) trials: usize,
    /// Length of one trial, e.g. `1s` (1ms to 10m).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = args::trial)]
    pub(crate) trial: Duration,
    /// Worker threads of the runtime both sides run on (0 to 64; 0, the
    /// default, is a current-thread runtime, as `breakwater`'s own).
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = RangedU64ValueParser::<usize>::new().range(0..=64))]
    pub(crate) workers: usize,
}

/// The comparison itself; `cargo bench -p breakwater-cache-cli --bench hit`
/// runs it through this command, on a private `redis-server`.
mod hit;

/// `breakwater bench hit`: the four scenarios, one line each.
async fn hit(opts: &HitOpts) -> Result<(), Failure> {
    check_redis(&opts.redis).await?;
    let runtime = match opts.workers {
        0 => "current-thread runtime".to_string(),
        1 => "1 worker thread".to_string(),
        n => format!("{n} worker threads"),
    };
    crate::outln!(
        "Redis hits on {}: get_or_load (L1 off: a GET, or a share of an MGET, per hit) next to raw GETs on one \
         connection; {} trial(s) of {}, interleaved (which side runs first alternates); {runtime}",
        shown(&opts.redis),
        opts.trials,
        humantime::format_duration(opts.trial)
    );
    let spinner = crate::progress::spinner("bench hit: 4 scenarios");
    let (url, trials, trial) = (opts.redis.clone(), opts.trials, opts.trial);
    let rows = if opts.workers == 0 {
        hit::compare(&url, trials, trial).await
    } else {
        // A runtime of its own, run from a blocking thread (this one is
        // current-thread, and a runtime cannot block inside another).
        let workers = opts.workers;
        tokio::task::spawn_blocking(move || {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(workers)
                .enable_all()
                .build()
                .map_err(|e| format!("cannot start a runtime of {workers} worker threads: {e}"))?
                .block_on(hit::compare(&url, trials, trial))
        })
        .await
        .unwrap_or_else(|e| Err(format!("bench hit stopped: {e}")))
    };
    spinner.finish_and_clear();
    for row in rows.map_err(Failure::runtime)? {
        crate::outln!("{row}");
    }
    Ok(())
}

/// What every bench takes.
#[derive(Debug, Clone, Args)]
pub(crate) struct BenchArgs {
    /// Redis URL to run against (see the README for the keys the benches write).
    #[arg(long, value_name = "URL")]
    pub(crate) redis: String,
    /// How long one loader call (a database query) takes, e.g. `5ms` (0 to
    /// 1m).
    #[arg(long, value_name = "DURATION", default_value = "50ms", value_parser = args::loader_latency)]
    pub(crate) loader_latency: Duration,
    /// Most calls in flight at once, per process: a comma-separated list,
    /// one row each (each 1 to 100,000).
    #[arg(
        long,
        value_name = "N",
        value_delimiter = ',',
        default_value = "100,1000",
        value_parser = args::concurrency()
    )]
    pub(crate) concurrency: Vec<usize>,
    /// Repetitions of each scenario (1 to 1,000); figures are over all of them.
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = args::runs())]
    pub(crate) runs: usize,
}

/// Options of `breakwater bench grace`.
#[derive(Debug, Clone, Args)]
pub(crate) struct GraceOpts {
    #[command(flatten)]
    pub(crate) bench: BenchArgs,
}

/// Options of `breakwater bench stampede`.
#[derive(Debug, Clone, Args)]
pub(crate) struct StampedeOpts {
    #[command(flatten)]
    pub(crate) bench: BenchArgs,
    /// Worker processes, released together: a comma-separated list, one
    /// row each (each 1 to 64).
    #[arg(
        long,
        value_name = "N",
        value_delimiter = ',',
        default_value = "1,4",
        value_parser = args::processes()
    )]
    pub(crate) processes: Vec<usize>,
}

/// Runs a bench subcommand, then deletes the keys it wrote (also when it
/// failed).
///
/// The orchestration blocks on child processes; nothing else runs on the
/// runtime meanwhile, so that is harmless here.
pub(crate) async fn main(command: BenchCommand) -> ExitCode {
    let pid = std::process::id();
    let (name, url, result, written) = match &command {
        // It deletes its own keys (they may be on a cluster's nodes).
        BenchCommand::Many(opts) => {
            return crate::failure::finish("bench many", crate::many::bench(opts).await);
        }
        // It deletes its own keys (they may be on a cluster's nodes).
        BenchCommand::Write(opts) => {
            return crate::failure::finish("bench write", write(opts).await);
        }
        // It deletes its own keys (they may be on a cluster's nodes).
        BenchCommand::Mixed(opts) => {
            return crate::failure::finish("bench mixed", mixed::bench(opts).await);
        }
        BenchCommand::Stampede(opts) => (
            "bench stampede",
            &opts.bench.redis,
            stampede(opts).await,
            vec![
                format!("naive:hot:{pid}:*"),
                format!("lock:naive:hot:{pid}:*"),
                format!("bench:loads:{pid}:*"),
                format!("bw:bench-{pid}:*"),
            ],
        ),
        BenchCommand::Grace(opts) => (
            "bench grace",
            &opts.bench.redis,
            grace(opts).await,
            vec![format!("bw:bench-grace-{pid}:*")],
        ),
        BenchCommand::Hit(opts) => (
            "bench hit",
            &opts.redis,
            hit(opts).await,
            vec![
                format!("bw:bench-hit-{pid}:*"),
                format!("raw:bench-hit-{pid}:product:*"),
            ],
        ),
    };
    // Nothing was written if Redis could not be reached or the URL is bad.
    let cleaned = if matches!(result, Err(Failure::Usage(_))) {
        Ok(())
    } else {
        delete_matching(url, &written).await
    };
    match (result, cleaned) {
        (Err(failure), _) => failure.exit(name),
        (Ok(()), Err(err)) => Failure::runtime(format!(
            "could not delete the bench's keys ({err}); delete keys matching {} by hand",
            written.join(", ")
        ))
        .exit(name),
        (Ok(()), Ok(())) => ExitCode::SUCCESS,
    }
}

/// Checks that `url` parses (a usage error if not) and that Redis answers
/// (a runtime failure if not), before a bench prints anything.
async fn check_redis(url: &str) -> Result<breakwater_cache::RedisStore, Failure> {
    redis::Client::open(url).map_err(|err| bad_url(url, err))?;
    match crate::connect::bench_store(url).await {
        Ok(store) => Ok(store),
        Err(err) if err.is_config() => Err(bad_url(url, err)),
        Err(err) => Err(unreachable(url, err).await),
    }
}

/// Deletes every key matching one of `patterns` (SCAN and UNLINK, never
/// KEYS); every wait is bounded by the connection's timeouts.
async fn delete_matching(url: &str, patterns: &[String]) -> Result<(), redis::RedisError> {
    let client = redis::Client::open(url)?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(5)))
        .set_response_timeout(Some(Duration::from_secs(5)));
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await?;
    for pattern in patterns {
        let mut cursor = 0u64;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1_000)
                .query_async(&mut conn)
                .await?;
            if !keys.is_empty() {
                redis::cmd("UNLINK")
                    .arg(&keys)
                    .query_async::<i64>(&mut conn)
                    .await?;
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    Ok(())
}

/// What one scenario measured.
#[derive(Debug, Default)]
struct Figures {
    loads: u64,
    errors: usize,
    latencies_us: Vec<u64>,
    wakes_us: Vec<u64>,
}

/// `breakwater bench stampede`: checks Redis, then the table.
async fn stampede(opts: &StampedeOpts) -> Result<(), Failure> {
    check_redis(&opts.bench.redis).await?;
    stampede_table(opts).await.map_err(Failure::runtime)
}

async fn stampede_table(opts: &StampedeOpts) -> Result<(), Box<dyn std::error::Error>> {
    let exe = std::env::current_exe()?;
    crate::outln!(
        "stampede bench: one missing hot key, loader {}, {} run(s) per row, {}",
        humantime::format_duration(opts.bench.loader_latency),
        opts.bench.runs,
        shown(&opts.bench.redis)
    );
    crate::outln!();
    crate::outln!(
        "{:<11} {:>2} {:>5} {:>6} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9}",
        "algorithm",
        "P",
        "C",
        "loads",
        "p50 ms",
        "p99 ms",
        "max ms",
        "wake p50",
        "wake p99",
        "errors"
    );
    let total = opts.processes.len() * opts.bench.concurrency.len() * 2 * opts.bench.runs;
    let progress = crate::progress::bar(total as u64, "bench stampede");
    let mut scenario = 0u64;
    for &processes in &opts.processes {
        for &concurrency in &opts.bench.concurrency {
            for algo in [Algo::Naive, Algo::Breakwater] {
                let mut all = Figures::default();
                for _ in 0..opts.bench.runs {
                    scenario += 1;
                    let run = run_once(&exe, opts, algo, processes, concurrency, scenario).await?;
                    progress.inc(1);
                    all.loads += run.loads;
                    all.errors += run.errors;
                    all.latencies_us.extend(run.latencies_us);
                    all.wakes_us.extend(run.wakes_us);
                }
                all.latencies_us.sort_unstable();
                all.wakes_us.sort_unstable();
                let name = algo.name();
                progress.suspend(|| {
                    crate::outln!(
                        "{:<11} {:>2} {:>5} {:>6} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9}",
                        name,
                        processes,
                        concurrency,
                        format!("{:.1}", all.loads as f64 / opts.bench.runs as f64),
                        us_as_ms(percentile(&all.latencies_us, 0.50)),
                        us_as_ms(percentile(&all.latencies_us, 0.99)),
                        us_as_ms(all.latencies_us.last().copied()),
                        us_as_ms(percentile(&all.wakes_us, 0.50)),
                        us_as_ms(percentile(&all.wakes_us, 0.99)),
                        all.errors,
                    )
                });
            }
        }
    }
    progress.finish_and_clear();
    crate::outln!();
    crate::outln!(
        "loads: loader calls per run (goal 1). Latency: from the release to each call's return."
    );
    crate::outln!(
        "wake: from the moment the loaded value was produced to each caller's return (callers"
    );
    crate::outln!("that found the value already cached count too).");
    Ok(())
}

/// `breakwater bench grace`: checks Redis, then the table.
async fn grace(opts: &GraceOpts) -> Result<(), Failure> {
    let store = check_redis(&opts.bench.redis).await?;
    grace_table(opts, store).await.map_err(Failure::runtime)
}

/// C callers of one key whose fresh window has just ended (grace 60 s): how
/// many of them waited on a load instead of being served the stale value at
/// once, and how many loads the refresh took.
async fn grace_table(
    opts: &GraceOpts,
    store: breakwater_cache::RedisStore,
) -> Result<(), Box<dyn std::error::Error>> {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use breakwater_cache::{Cache, EarlyRefresh, Jitter, Served};
    use tokio::time::Instant;

    let loader_time = opts.bench.loader_latency;
    // The calls are spawned one by one; a caller's latency includes the
    // fan-out, so it is no measure of waiting (a busy machine takes longer
    // than the loader to start 1,000 tasks).
    crate::outln!(
        "grace bench: one hot key just past its fresh window (grace 60 s), loader {}, {} run(s), {}",
        humantime::format_duration(opts.bench.loader_latency),
        opts.bench.runs,
        shown(&opts.bench.redis)
    );
    crate::outln!(
        "waited: callers that waited on a load instead of being served at once (the stale"
    );
    crate::outln!("value, or the new one once it landed); goal 0 of all callers.");
    crate::outln!();
    crate::outln!(
        "{:>7} {:>16} {:>12} {:>8} {:>8} {:>8}",
        "C",
        "waited",
        "loads/run",
        "p50 ms",
        "p99 ms",
        "max ms"
    );
    let progress = crate::progress::bar(
        (opts.bench.concurrency.len() * opts.bench.runs) as u64,
        "bench grace",
    );
    for &concurrency in &opts.bench.concurrency {
        let (mut waited, mut loads) = (0usize, 0usize);
        let mut latencies = Vec::with_capacity(concurrency * opts.bench.runs);
        // One cache for this row's runs (each on its own key): its stats()
        // are the row's.
        let cache = Cache::<String>::builder()
            .namespace(format!("bench-grace-{}", std::process::id()))
            .store(store.clone())
            .ttl(Duration::from_millis(200))
            .grace(Duration::from_secs(60))
            .jitter(Jitter::none().with_floor(Duration::from_millis(1)))
            .early_refresh(EarlyRefresh::none())
            .build()?;
        for run in 0..opts.bench.runs {
            let key = format!("hot:{}:{concurrency}:{run}", std::process::id());
            cache.set(&key, &"old".to_owned()).await?;
            tokio::time::sleep(Duration::from_millis(250)).await;
            let calls = Arc::new(AtomicUsize::new(0));
            let released = Instant::now();
            let tasks: Vec<_> = (0..concurrency)
                .map(|_| {
                    let cache = cache.clone();
                    let key = key.clone();
                    let calls = Arc::clone(&calls);
                    tokio::spawn(async move {
                        let fetched = cache
                            .get_or_load_with_meta(key, move || {
                                calls.fetch_add(1, Ordering::SeqCst);
                                async move {
                                    tokio::time::sleep(loader_time).await;
                                    Ok::<_, std::io::Error>(Some("new".to_owned()))
                                }
                            })
                            .await;
                        (fetched, released.elapsed())
                    })
                })
                .collect();
            for task in tasks {
                let (fetched, latency) = task.await?;
                let fetched = fetched?;
                // Served by a load (its own or a shared one): it waited.
                if matches!(fetched.served, Served::Loaded | Served::Coalesced) {
                    waited += 1;
                }
                latencies.push(u64::try_from(latency.as_micros()).unwrap_or(u64::MAX));
            }
            // Let the one refresh land before counting its loads.
            let deadline = Instant::now() + Duration::from_secs(10);
            while cache.get(&key).await?.as_deref() != Some("new") && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            loads += calls.load(Ordering::SeqCst);
            progress.inc(1);
        }
        latencies.sort_unstable();
        let callers = concurrency * opts.bench.runs;
        progress.suspend(|| {
            crate::outln!(
                "{:>7} {:>16} {:>12} {:>8} {:>8} {:>8}",
                concurrency,
                format!("{waited} of {callers}"),
                format!("{:.1}", loads as f64 / opts.bench.runs as f64),
                us_as_ms(percentile(&latencies, 0.50)),
                us_as_ms(percentile(&latencies, 0.99)),
                us_as_ms(latencies.last().copied()),
            );
            crate::outln!("        stats(): {}", stats_line(&cache.stats()));
        });
    }
    progress.finish_and_clear();
    crate::outln!();
    crate::outln!(
        "waited: of all callers in all runs. loads/run: loader calls per refresh (goal 1)."
    );
    crate::outln!(
        "Latency: from the release to each call's return; a busy machine shows here, not"
    );
    crate::outln!("in waited.");
    Ok(())
}

/// One scenario: `processes` workers with `concurrency` callers each.
async fn run_once(
    exe: &std::path::Path,
    opts: &StampedeOpts,
    algo: Algo,
    processes: usize,
    concurrency: usize,
    scenario: u64,
) -> Result<Figures, BoxError> {
    let pid = std::process::id();
    let key = format!("hot:{pid}:{scenario}");
    let counter = format!("bench:loads:{pid}:{scenario}");
    let loader_latency = humantime::format_duration(opts.bench.loader_latency).to_string();
    let concurrency = concurrency.to_string();
    let namespace = format!("bench-{pid}");
    let args: Vec<String> = [
        "--redis",
        &opts.bench.redis,
        "--namespace",
        &namespace,
        "--key",
        &key,
        "--counter",
        &counter,
        "--algo",
        algo.name(),
        "--samples",
        "--concurrency",
        &concurrency,
        "--loader-latency",
        &loader_latency,
    ]
    .map(str::to_owned)
    .into();
    let mut fleet = Fleet::spawn(exe, "stampede-worker", vec![args; processes])?;
    fleet.ready(Duration::from_secs(30))?;
    fleet.release()?;
    // No worker reports until every worker's calls have returned.
    fleet.expect("finished", "finish", Duration::from_secs(120))?;
    fleet.send("report")?;
    let mut figures = Figures::default();
    let done = fleet.reports(Duration::from_secs(120), |line| {
        if let Some(rest) = line.strip_prefix("sample ") {
            let mut parts = rest.split(' ');
            let latency: u64 = parts.next().unwrap_or("0").parse()?;
            let wake: i64 = parts.next().unwrap_or("-1").parse()?;
            figures.latencies_us.push(latency);
            if let Ok(wake) = u64::try_from(wake) {
                figures.wakes_us.push(wake);
            }
        }
        Ok(())
    })?;
    figures.errors = done.iter().map(|done| done.err).sum();
    figures.loads = read_counter(&opts.bench.redis, &counter).await?;
    Ok(figures)
}

/// Reads (and deletes) the load counter.
async fn read_counter(url: &str, counter: &str) -> Result<u64, redis::RedisError> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let loads: Option<u64> = redis::cmd("GET")
        .arg(counter)
        .query_async(&mut conn)
        .await?;
    redis::cmd("DEL")
        .arg(counter)
        .query_async::<i64>(&mut conn)
        .await?;
    Ok(loads.unwrap_or(0))
}

//! `breakwater bench many`: P processes call `get_many` for overlapping sets
//! of ids at once, against one Redis or a Redis Cluster; the bench checks
//! that every id was loaded exactly once in the whole fleet and that every
//! caller got all its values in its own order, and reports the batch loader
//! calls and the latency of the calls.
//!
//! `breakwater many-worker` (hidden) is one such process: it connects,
//! prints `ready`, waits for one line on stdin, runs its `get_many` calls,
//! and prints one `latency <µs>` line per call, one `loaded <id>` line per id
//! its loader was asked for, `batches <n>`, `stats <line>`, and `done ok=<n>
//! err=<n> first_error=<message or none>` (the line protocol of
//! [`fleet`](crate::fleet)).

use std::io::{self, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use breakwater_cache::{Cache, Store};
use clap::Args;
use clap::builder::RangedU64ValueParser;
use tokio::time::Instant;

use crate::args;
use crate::connect::bench_cluster_store;
use crate::failure::{Failure, bad_url, unreachable};
use crate::fleet::{BoxError, Done, Fleet, read_line, say};
use crate::report::percentile;

/// Options of `breakwater bench many`.
#[derive(Debug, Clone, Args)]
pub(crate) struct ManyOpts {
    /// Redis URL, or a Redis Cluster's node URLs separated by commas.
    #[arg(long, value_name = "URL")]
    pub(crate) redis: String,
    /// Worker processes, released together (1 to 64).
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = args::processes())]
    pub(crate) processes: usize,
    /// Ids each process asks for in one `get_many` (1 to 100,000).
    #[arg(long, value_name = "N", default_value_t = 1_000, value_parser = RangedU64ValueParser::<usize>::new().range(1..=100_000))]
    pub(crate) ids: usize,
    /// Process p asks for ids from p × step on, so neighbours overlap by
    /// `ids - step` (0 to 100,000; 0: every process asks for the same ids).
    #[arg(long, value_name = "N", default_value_t = 250, value_parser = RangedU64ValueParser::<usize>::new().range(0..=100_000))]
    pub(crate) step: usize,
    /// Most calls in flight at once, per process (1 to 100,000).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = args::concurrency())]
    pub(crate) concurrency: usize,
    /// How long one loader call (a database query) takes, e.g. `5ms` (0 to
    /// 1m).
    #[arg(long, value_name = "DURATION", default_value = "50ms", value_parser = args::loader_latency)]
    pub(crate) loader_latency: Duration,
    /// Runs, each on ids no earlier run used, one row each (1 to 1,000).
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = args::runs())]
    pub(crate) runs: usize,
}

/// Options of `breakwater many-worker`.
#[derive(Debug, Clone, Args)]
pub(crate) struct ManyWorkerOpts {
    /// Redis URL, or a Redis Cluster's node URLs separated by commas.
    #[arg(long, value_name = "URL")]
    redis: String,
    /// Cache namespace.
    #[arg(long)]
    namespace: String,
    /// The first id.
    #[arg(long)]
    from: u64,
    /// How many ids.
    #[arg(long)]
    count: u64,
    /// Most calls in flight at once, per process (1 to 100,000).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = args::concurrency())]
    concurrency: usize,
    /// How long one loader call (a database query) takes, e.g. `5ms` (0 to
    /// 1m).
    #[arg(long, value_name = "DURATION", default_value = "50ms", value_parser = args::loader_latency)]
    loader_latency: Duration,
    /// Seeds each caller's order of the ids.
    #[arg(long, value_name = "SEED", default_value_t = 1)]
    seed: u64,
}

/// The value of id `id`; a multiple of 7 does not exist.
fn value_of(id: u64) -> Option<String> {
    (!id.is_multiple_of(7)).then(|| format!("row {id}"))
}

/// `ids` shuffled by `seed` (xorshift; a fixed order per caller).
fn shuffled(mut ids: Vec<u64>, seed: u64) -> Vec<u64> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for i in (1..ids.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ids.swap(i, (x % (i as u64 + 1)) as usize);
    }
    ids
}

/// Runs the worker; exit code 0 only if every call got every value right.
pub(crate) async fn worker(opts: ManyWorkerOpts) -> ExitCode {
    match run_worker(opts).await {
        Ok(0) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(err) => {
            eprintln!("many-worker: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run_worker(opts: ManyWorkerOpts) -> Result<usize, BoxError> {
    let store = bench_cluster_store(&opts.redis).await?;
    let cache = Cache::<String>::builder()
        .namespace(opts.namespace.clone())
        .store(store)
        .ttl(Duration::from_secs(600))
        .build()?;
    let loaded: Arc<Mutex<Vec<u64>>> = Arc::default();
    let batches = Arc::new(AtomicU64::new(0));
    say("ready")?;
    let go = tokio::task::spawn_blocking(read_line).await??;
    if go.is_empty() {
        return Err("stdin closed before the go line".into());
    }
    let ids: Vec<u64> = (opts.from..opts.from + opts.count).collect();
    let calls: Vec<_> = (0..opts.concurrency)
        .map(|caller| {
            let cache = cache.clone();
            let ids = shuffled(ids.clone(), opts.seed.wrapping_add(caller as u64));
            let (loaded, batches) = (Arc::clone(&loaded), Arc::clone(&batches));
            let delay = opts.loader_latency;
            tokio::spawn(async move {
                let loader = move |missing: Vec<u64>| {
                    batches.fetch_add(1, Ordering::Relaxed);
                    loaded
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .extend_from_slice(&missing);
                    async move {
                        tokio::time::sleep(delay).await;
                        Ok::<_, std::io::Error>(
                            missing
                                .into_iter()
                                .filter_map(|id| value_of(id).map(|v| (id, v)))
                                .collect::<Vec<_>>(),
                        )
                    }
                };
                let started = Instant::now();
                let got = cache.get_many(ids.clone(), loader).await;
                let took = started.elapsed();
                let outcome = match got {
                    Ok(values) if values.len() != ids.len() => Err(format!(
                        "asked for {} ids, got {} values",
                        ids.len(),
                        values.len()
                    )),
                    Ok(values) => ids
                        .iter()
                        .zip(&values)
                        .find(|(id, value)| **value != value_of(**id))
                        .map_or(Ok(()), |(id, value)| {
                            Err(format!(
                                "id {id}: got {value:?}, expected {:?}",
                                value_of(*id)
                            ))
                        }),
                    Err(err) => Err(err.to_string()),
                };
                (took, outcome)
            })
        })
        .collect();
    let mut outcomes = Vec::with_capacity(calls.len());
    for call in calls {
        outcomes.push(call.await?);
    }
    let mut out = io::BufWriter::new(io::stdout().lock());
    let mut done = Done::default();
    for (took, outcome) in outcomes {
        writeln!(out, "latency {}", took.as_micros())?;
        match outcome {
            Ok(()) => done.ok += 1,
            Err(message) => {
                done.err += 1;
                done.first_error.get_or_insert(message);
            }
        }
    }
    for id in loaded.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        writeln!(out, "loaded {id}")?;
    }
    writeln!(out, "batches {}", batches.load(Ordering::Relaxed))?;
    writeln!(
        out,
        "stats {}",
        cache.stats().to_string().replace('\n', " | ")
    )?;
    writeln!(out, "{done}")?;
    out.flush()?;
    Ok(done.err)
}

/// What one run measured.
#[derive(Debug, Default)]
struct Run {
    asked: usize,
    /// How many times each id was loaded, fleet-wide.
    loads: std::collections::BTreeMap<u64, u32>,
    batches: u64,
    errors: usize,
    first_error: Option<String>,
    latencies_us: Vec<u64>,
    /// Each process's `Cache::stats()`, on one line.
    stats: Vec<String>,
}

/// `breakwater bench many`.
pub(crate) async fn bench(opts: &ManyOpts) -> Result<(), Failure> {
    for url in opts.redis.split(',') {
        redis::Client::open(url.trim()).map_err(|err| bad_url(url, err))?;
    }
    let store = match bench_cluster_store(&opts.redis).await {
        Ok(store) => store,
        Err(err) => return Err(unreachable(&opts.redis, err).await),
    };
    let exe = std::env::current_exe().map_err(Failure::runtime)?;
    let pid = std::process::id();
    let namespace = format!("bench-many-{pid}");
    crate::outln!(
        "get_many: {} processes x {} caller(s), {} ids each (process p from p x {}), loader {}",
        opts.processes,
        opts.concurrency,
        opts.ids,
        opts.step,
        humantime::format_duration(opts.loader_latency)
    );
    crate::outln!(
        "{:>4} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>9} {:>9} {:>9}",
        "run",
        "ids",
        "loaded",
        "twice+",
        "never",
        "batches",
        "errors",
        "p50 ms",
        "p99 ms",
        "max ms"
    );
    let span = (opts.processes as u64 - 1) * opts.step as u64 + opts.ids as u64;
    let mut failed = Vec::new();
    let mut all_ids = Vec::new();
    for r in 0..opts.runs {
        let base = r as u64 * span * 2 + 1;
        let run = run_many(&exe, opts, &namespace, base)
            .await
            .map_err(Failure::runtime)?;
        all_ids.extend(base..base + span);
        let twice = run.loads.values().filter(|n| **n > 1).count();
        // Ids asked for that nobody loaded (they were not cached before).
        let never = (base..base + span)
            .filter(|id| !run.loads.contains_key(id))
            .count();
        let mut lat = run.latencies_us.clone();
        lat.sort_unstable();
        let pct = |p: f64| percentile(&lat, p).map_or(0.0, |us| us as f64 / 1_000.0);
        crate::outln!(
            "{:>4} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>9.1} {:>9.1} {:>9.1}",
            r + 1,
            span,
            run.loads.len(),
            twice,
            never,
            run.batches,
            run.errors,
            pct(0.5),
            pct(0.99),
            pct(1.0)
        );
        if twice > 0
            || never > 0
            || run.errors > 0
            || run.asked != opts.processes * opts.concurrency
        {
            failed.push(format!(
                "run {}: {twice} ids loaded more than once, {never} never loaded, {} errors (first: {})",
                r + 1,
                run.errors,
                run.first_error.as_deref().unwrap_or("none")
            ));
            for (p, stats) in run.stats.iter().enumerate() {
                crate::outln!("  process {p}: {stats}");
            }
        }
    }
    crate::outln!(
        "every id loaded exactly once across the fleet: {}",
        if failed.is_empty() { "yes" } else { "NO" }
    );
    // The bench's entries (and leases, none should be left) go.
    let cache = Cache::<String>::builder()
        .namespace(namespace)
        .store(store.clone())
        .build()
        .map_err(Failure::from)?;
    for id in all_ids {
        let key = cache.storage_key(id).map_err(Failure::from)?;
        store.delete(&key).await.map_err(Failure::runtime)?;
    }
    // And the namespace's clear record, made by its first write.
    store
        .delete(cache.clear_record_key())
        .await
        .map_err(Failure::runtime)?;
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Failure::runtime(failed.join("; ")))
    }
}

/// One run: the workers released together, their reports gathered.
async fn run_many(
    exe: &std::path::Path,
    opts: &ManyOpts,
    namespace: &str,
    base: u64,
) -> Result<Run, BoxError> {
    let loader_latency = humantime::format_duration(opts.loader_latency).to_string();
    let each = (0..opts.processes).map(|p| {
        let from = base + (p * opts.step) as u64;
        [
            "--redis",
            &opts.redis,
            "--namespace",
            namespace,
            "--from",
            &from.to_string(),
            "--count",
            &opts.ids.to_string(),
            "--concurrency",
            &opts.concurrency.to_string(),
            "--loader-latency",
            &loader_latency,
            "--seed",
            &(base + p as u64).to_string(),
        ]
        .map(str::to_owned)
        .into()
    });
    let mut fleet = Fleet::spawn(exe, "many-worker", each)?;
    fleet.ready(Duration::from_secs(120))?;
    fleet.release()?;
    let mut run = Run::default();
    let done = fleet.reports(Duration::from_secs(120), |line| {
        let mut parts = line.splitn(2, ' ');
        match (parts.next(), parts.next()) {
            (Some("latency"), Some(us)) => {
                run.asked += 1;
                run.latencies_us.push(us.parse()?);
            }
            (Some("loaded"), Some(id)) => *run.loads.entry(id.parse()?).or_default() += 1,
            (Some("batches"), Some(n)) => run.batches += n.parse::<u64>()?,
            (Some("stats"), Some(stats)) => run.stats.push(stats.to_owned()),
            _ => {}
        }
        Ok(())
    })?;
    for done in done {
        run.errors += done.err;
        if done.err > 0 && run.first_error.is_none() {
            run.first_error = done.first_error;
        }
    }
    Ok(run)
}

//! `breakwater bench stampede`: one hot key, C concurrent callers in each of
//! P processes, released together against a Redis where the key is missing.
//! Runs breakwater's `get_or_load` and the common naive lock-and-sleep
//! algorithm (`GET`; on a miss `SET NX` a lock and load, while the others
//! sleep and retry) side by side, on the same Redis, and reports
//! loads, call latency and wake-up delay (how long after the value was
//! produced each caller got it).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use clap::{Args, Subcommand};

use crate::worker::Algo;

/// `breakwater bench` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum BenchCommand {
    /// Stampede on one hot key: loads, latency and wake-up, breakwater vs naive.
    Stampede(StampedeOpts),
    /// A hot key in grace: how many callers wait for its refresh (goal 0).
    Grace(GraceOpts),
    /// Redis hits: `get_or_load` next to raw GETs on one connection, with ratios.
    Hit(HitOpts),
}

/// Options of `breakwater bench hit`.
#[derive(Debug, Clone, Args)]
pub(crate) struct HitOpts {
    /// Redis URL to run against (writes keys under `bw:bench-hit:` and
    /// `raw:bench-hit:`, expiring after an hour).
    #[arg(long)]
    pub(crate) redis: String,
    /// Interleaved trials per scenario; the ratio is of the medians.
    #[arg(long, default_value_t = 3)]
    pub(crate) trials: usize,
    /// Length of one trial, in milliseconds.
    #[arg(long, default_value_t = 1_000)]
    pub(crate) trial_ms: u64,
}

/// The comparison itself, shared with `cargo bench -p breakwater --bench hit`.
#[path = "../../breakwater/benches/common/hit.rs"]
#[allow(unreachable_pub, dead_code)]
mod hit;

/// `breakwater bench hit`: the three scenarios, one line each.
async fn hit(opts: &HitOpts) -> Result<(), Box<dyn std::error::Error>> {
    println!(
        "Redis hits on {}: get_or_load (L1 off: one GET per hit) next to raw GETs on one \
         connection; {} trial(s) of {} ms, interleaved; current-thread runtime",
        opts.redis, opts.trials, opts.trial_ms
    );
    let rows = hit::compare(
        &opts.redis,
        opts.trials,
        Duration::from_millis(opts.trial_ms.max(1)),
    )
    .await?;
    for row in rows {
        println!("{row}");
    }
    Ok(())
}

/// What every bench takes.
#[derive(Debug, Clone, Args)]
pub(crate) struct BenchArgs {
    /// Redis URL to run against (see the README for the keys the benches write).
    #[arg(long)]
    pub(crate) redis: String,
    /// Loader latency in milliseconds.
    #[arg(long, default_value_t = 50)]
    pub(crate) loader_ms: u64,
    /// Concurrent callers, per process (comma-separated list).
    #[arg(long, value_delimiter = ',', default_values_t = [100, 1000])]
    pub(crate) concurrency: Vec<usize>,
    /// Repetitions of each scenario; figures are over all of them.
    #[arg(long, default_value_t = 3)]
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
    /// Processes (comma-separated list).
    #[arg(long, value_delimiter = ',', default_values_t = [1, 4])]
    pub(crate) processes: Vec<usize>,
}

/// Runs a bench subcommand.
///
/// The orchestration blocks on child processes; nothing else runs on the
/// runtime meanwhile, so that is harmless here.
pub(crate) async fn main(command: BenchCommand) -> ExitCode {
    let (name, result) = match command {
        BenchCommand::Stampede(opts) => ("stampede", stampede(&opts).await),
        BenchCommand::Grace(opts) => ("grace", grace(&opts).await),
        BenchCommand::Hit(opts) => ("hit", hit(&opts).await),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("bench {name}: {err}");
            ExitCode::FAILURE
        }
    }
}

/// What one scenario measured.
#[derive(Debug, Default)]
struct Figures {
    loads: u64,
    errors: usize,
    latencies_us: Vec<u64>,
    wakes_us: Vec<u64>,
}

async fn stampede(opts: &StampedeOpts) -> Result<(), Box<dyn std::error::Error>> {
    let exe = std::env::current_exe()?;
    println!(
        "stampede bench: one missing hot key, loader {} ms, {} run(s) per row, {}",
        opts.bench.loader_ms, opts.bench.runs, opts.bench.redis
    );
    println!();
    println!(
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
    let mut scenario = 0u64;
    for &processes in &opts.processes {
        for &concurrency in &opts.bench.concurrency {
            for algo in [Algo::Naive, Algo::Breakwater] {
                let mut all = Figures::default();
                for _ in 0..opts.bench.runs {
                    scenario += 1;
                    let run = run_once(&exe, opts, algo, processes, concurrency, scenario).await?;
                    all.loads += run.loads;
                    all.errors += run.errors;
                    all.latencies_us.extend(run.latencies_us);
                    all.wakes_us.extend(run.wakes_us);
                }
                all.latencies_us.sort_unstable();
                all.wakes_us.sort_unstable();
                let name = algo.name();
                println!(
                    "{:<11} {:>2} {:>5} {:>6} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9}",
                    name,
                    processes,
                    concurrency,
                    format!("{:.1}", all.loads as f64 / opts.bench.runs as f64),
                    ms(percentile(&all.latencies_us, 0.50)),
                    ms(percentile(&all.latencies_us, 0.99)),
                    ms(all.latencies_us.last().copied()),
                    ms(percentile(&all.wakes_us, 0.50)),
                    ms(percentile(&all.wakes_us, 0.99)),
                    all.errors,
                );
            }
        }
    }
    println!();
    println!(
        "loads: loader calls per run (goal 1). Latency: from the release to each call's return."
    );
    println!(
        "wake: from the moment the loaded value was produced to each caller's return (callers"
    );
    println!("that found the value already cached count too).");
    Ok(())
}

/// C callers of one key whose fresh window has just ended (grace 60 s): how
/// many of them waited for the loader, and how many loads the refresh took.
async fn grace(opts: &GraceOpts) -> Result<(), Box<dyn std::error::Error>> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use breakwater::{Cache, EarlyRefresh, Jitter, Served};
    use tokio::time::Instant;

    let loader_time = Duration::from_millis(opts.bench.loader_ms);
    println!(
        "grace bench: one hot key just past its fresh window (grace 60 s), loader {} ms, {} run(s), {}",
        opts.bench.loader_ms, opts.bench.runs, opts.bench.redis
    );
    println!();
    println!(
        "{:>5} {:>8} {:>12} {:>8} {:>8} {:>8}",
        "C", "waited", "loads/run", "p50 ms", "p99 ms", "max ms"
    );
    let store = crate::worker::bench_store(&opts.bench.redis).await?;
    for &concurrency in &opts.bench.concurrency {
        let (mut waited, mut loads) = (0usize, 0usize);
        let mut latencies = Vec::with_capacity(concurrency * opts.bench.runs);
        for run in 0..opts.bench.runs {
            let cache = Cache::<String>::builder()
                .namespace("bench-grace")
                .store(store.clone())
                .ttl(Duration::from_millis(200))
                .grace(Duration::from_secs(60))
                .jitter(Jitter::none().with_floor(Duration::from_millis(1)))
                .early_refresh(EarlyRefresh::none())
                .build()?;
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
                if !matches!(fetched.served, Served::Stale { .. }) || latency >= loader_time {
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
        }
        latencies.sort_unstable();
        println!(
            "{:>5} {:>8} {:>12} {:>8} {:>8} {:>8}",
            concurrency,
            waited,
            format!("{:.1}", loads as f64 / opts.bench.runs as f64),
            ms(percentile(&latencies, 0.50)),
            ms(percentile(&latencies, 0.99)),
            ms(latencies.last().copied()),
        );
    }
    println!();
    println!(
        "waited: callers not served the stale value at once (goal 0); loads/run: loader calls"
    );
    println!("per refresh (goal 1).");
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
) -> Result<Figures, Box<dyn std::error::Error>> {
    let pid = std::process::id();
    let key = format!("hot:{pid}:{scenario}");
    let counter = format!("bench:loads:{pid}:{scenario}");
    let algo_arg = algo.name();
    let mut workers = Vec::with_capacity(processes);
    for _ in 0..processes {
        let mut child = Command::new(exe)
            .args([
                "stampede-worker",
                "--redis",
                &opts.bench.redis,
                "--namespace",
                "bench",
            ])
            .args([
                "--key",
                &key,
                "--counter",
                &counter,
                "--algo",
                algo_arg,
                "--samples",
            ])
            .args(["--concurrency", &concurrency.to_string()])
            .args(["--loader-ms", &opts.bench.loader_ms.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("worker has no stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        workers.push(Worker { child, lines: rx });
    }
    for worker in &mut workers {
        match worker.lines.recv_timeout(Duration::from_secs(30)) {
            Ok(line) if line == "ready" => {}
            other => return Err(format!("worker did not get ready: {other:?}").into()),
        }
    }
    for worker in &mut workers {
        worker.send(b"go\n")?;
    }
    // No worker reports until every worker's calls have returned.
    for worker in &mut workers {
        match worker.lines.recv_timeout(Duration::from_secs(120)) {
            Ok(line) if line == "finished" => {}
            other => return Err(format!("worker did not finish: {other:?}").into()),
        }
    }
    for worker in &mut workers {
        worker.send(b"report\n")?;
    }
    let mut figures = Figures::default();
    for worker in &mut workers {
        loop {
            let line = worker
                .lines
                .recv_timeout(Duration::from_secs(120))
                .map_err(|_| "worker did not finish within 120 s")?;
            if let Some(rest) = line.strip_prefix("sample ") {
                let mut parts = rest.split(' ');
                let latency: u64 = parts.next().unwrap_or("0").parse()?;
                let wake: i64 = parts.next().unwrap_or("-1").parse()?;
                figures.latencies_us.push(latency);
                if let Ok(wake) = u64::try_from(wake) {
                    figures.wakes_us.push(wake);
                }
            } else if let Some(rest) = line.strip_prefix("done ") {
                let errors = rest
                    .split(' ')
                    .find_map(|kv| kv.strip_prefix("err="))
                    .and_then(|n| n.parse::<usize>().ok())
                    .unwrap_or(0);
                figures.errors += errors;
                break;
            }
        }
        worker.child.wait()?;
    }
    figures.loads = read_counter(&opts.bench.redis, &counter).await?;
    Ok(figures)
}

struct Worker {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Worker {
    /// Writes one line to the worker's stdin.
    fn send(&mut self, line: &[u8]) -> std::io::Result<()> {
        let stdin = self
            .child
            .stdin
            .as_mut()
            .ok_or_else(|| std::io::Error::other("worker has no stdin"))?;
        stdin.write_all(line)?;
        stdin.flush()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
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

/// Microseconds as milliseconds with two decimals; `-` for no sample.
fn ms(us: Option<u64>) -> String {
    us.map_or("-".to_owned(), |u| format!("{:.2}", u as f64 / 1000.0))
}

/// The `q` quantile of sorted samples (nearest rank).
pub(crate) fn percentile(sorted: &[u64], q: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted.get(rank - 1).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_is_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.50), Some(50));
        assert_eq!(percentile(&v, 0.99), Some(99));
        assert_eq!(percentile(&v, 1.0), Some(100));
        assert_eq!(percentile(&[7], 0.99), Some(7));
        assert_eq!(percentile(&[], 0.5), None);
    }
}

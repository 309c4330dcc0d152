//! `breakwater stampede-worker` (hidden): one process of a multi-process
//! stampede test.
//!
//! The worker connects to Redis, prints `ready`, waits for one line on stdin
//! (the test releases every worker at once), then fires `concurrency` calls
//! of [`Cache::get_or_load`] for one key (or, with `--algo naive`, of the
//! seed article's lock-and-sleep algorithm, for comparison). Its loader
//! counts itself with an `INCR` on a Redis counter, so the test can check how
//! many loads the whole fleet ran, and stamps the value with the wall-clock
//! time the load finished, so each caller can tell how long after the fill it
//! returned (its wake-up delay). With `--samples`, once every call has
//! returned it prints `finished` and waits for one more line on stdin (or its
//! end) before it prints one line `sample <latency µs> <wake-up µs>` per
//! call: the bench lets no worker report while another is still measuring.
//! It ends with one line `done ok=<n> err=<n> first_error=<message or none>`
//! (the line protocol of [`fleet`](crate::fleet), whose parent side is
//! `bench stampede`).

use std::future::Future;
use std::io::{self, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use breakwater_cache::{Cache, OnLockTimeout};
use clap::{Args, ValueEnum};
use redis::IntoConnectionInfo;
use redis::aio::MultiplexedConnection;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::args;
use crate::connect::bench_store;
use crate::fleet::{Done, read_line, say};

/// Which stampede defence the worker runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Algo {
    /// `Cache::get_or_load`: single-flight, lease, woken waiters.
    Breakwater,
    /// The seed article's algorithm: GET; SET lock NX EX 10; sleep 100 ms;
    /// GET; else load.
    Naive,
}

impl Algo {
    /// The name on the command line and in reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Algo::Breakwater => "breakwater",
            Algo::Naive => "naive",
        }
    }
}

/// Options of `breakwater stampede-worker`.
#[derive(Debug, Clone, Args)]
pub(crate) struct WorkerOpts {
    /// Redis URL, e.g. `redis://127.0.0.1:6379`.
    #[arg(long, value_name = "URL")]
    pub(crate) redis: String,
    /// Cache namespace.
    #[arg(long, default_value = "stampede")]
    pub(crate) namespace: String,
    /// The one key every call asks for.
    #[arg(long, default_value = "hot")]
    pub(crate) key: String,
    /// Most calls in flight at once, per process (1 to 100,000).
    #[arg(long, value_name = "N", default_value_t = 250, value_parser = args::concurrency())]
    pub(crate) concurrency: usize,
    /// How long one loader call (a database query) takes, e.g. `5ms` (0 to
    /// 1m).
    #[arg(long, value_name = "DURATION", default_value = "50ms", value_parser = args::loader_latency)]
    pub(crate) loader_latency: Duration,
    /// The cache's lease TTL, e.g. `2s` (default: the library's).
    #[arg(long, value_name = "DURATION", value_parser = args::short_wait)]
    pub(crate) lease_ttl: Option<Duration>,
    /// The cache's lock wait, e.g. `300ms`; a waiter past it fails with a
    /// lock timeout instead of loading (default: the library's wait and
    /// policy).
    #[arg(long, value_name = "DURATION", value_parser = args::short_wait)]
    pub(crate) lock_wait: Option<Duration>,
    /// The Redis key the loader `INCR`s once per load.
    #[arg(long, default_value = "loads")]
    pub(crate) counter: String,
    /// The algorithm under test.
    #[arg(long, value_enum, default_value_t = Algo::Breakwater)]
    pub(crate) algo: Algo,
    /// Print one `sample <latency µs> <wake-up µs>` line per call.
    #[arg(long)]
    pub(crate) samples: bool,
}

/// Runs the worker; exit code 0 only if every call succeeded.
pub(crate) async fn main(opts: WorkerOpts) -> ExitCode {
    match run(opts).await {
        Ok(0) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(err) => {
            eprintln!("stampede-worker: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Sets up, waits for the go line, runs the calls and prints the summary.
/// Returns the number of failed calls.
async fn run(opts: WorkerOpts) -> Result<usize, Box<dyn std::error::Error>> {
    let store = bench_store(&opts.redis).await?;
    let mut cache = Cache::<String>::builder()
        .namespace(opts.namespace.clone())
        .store(store);
    if let Some(lease_ttl) = opts.lease_ttl {
        cache = cache.lease_ttl(lease_ttl);
    }
    if let Some(lock_wait) = opts.lock_wait {
        cache = cache
            .lock_wait(lock_wait)
            .on_lock_timeout(OnLockTimeout::error());
    }
    let cache = cache.build()?;
    // The loader's and the naive algorithm's connection: Nagle off, as in
    // `RedisStore`, so both algorithms talk to Redis the same way.
    let info = opts.redis.as_str().into_connection_info()?;
    let tcp = info.tcp_settings().clone().set_nodelay(true);
    let counter_conn = redis::Client::open(info.set_tcp_settings(tcp))?
        .get_multiplexed_async_connection()
        .await?;

    say("ready")?;
    // Blocking read off the runtime thread, so connection tasks keep running.
    let go = tokio::task::spawn_blocking(read_line).await??;
    if go.is_empty() {
        return Err("stdin closed before the go line".into());
    }

    // One shared copy of everything the calls need: per-call clones (and
    // their drops, during the fan-out) would be the harness's cost, not the
    // algorithm's.
    let shared = Arc::new(Shared {
        cache,
        conn: counter_conn,
        loader_sleep: opts.loader_latency,
        opts,
    });
    let finished = Arc::new(Finished {
        remaining: AtomicUsize::new(shared.opts.concurrency),
        all: Notify::new(),
    });
    let released = Instant::now();
    // One spawned future type per algorithm, so neither's task carries the
    // other's state.
    let handles: Vec<_> = (0..shared.opts.concurrency)
        .map(|_| {
            let countdown = Countdown(Arc::clone(&finished));
            let shared = Arc::clone(&shared);
            match shared.opts.algo {
                Algo::Breakwater => timed(released, countdown, breakwater_call(shared)),
                Algo::Naive => timed(released, countdown, naive_call(shared)),
            }
        })
        .collect();

    // The harness touches nothing until every call has returned: joining
    // (and freeing) tasks, parsing values or writing lines (a syscall each,
    // and the parent reading them) during the fan-out would take CPU from
    // the very wake-ups being measured.
    finished.all.notified().await;
    let mut outcomes = Vec::with_capacity(handles.len());
    for handle in handles {
        outcomes.push(handle.await);
    }
    if shared.opts.samples {
        // Report only when told to (or when stdin ends): formatting and
        // writing the samples, and the parent parsing them, would take CPU
        // from the other workers' wake-ups.
        say("finished")?;
        tokio::task::spawn_blocking(read_line).await??;
    }
    let mut done = Done::default();
    let mut stdout = io::BufWriter::new(io::stdout().lock());
    for outcome in outcomes {
        let outcome = match outcome {
            Ok(Ok((Some(value), latency, returned_at))) => {
                if shared.opts.samples {
                    let wake = wake_up(&value, returned_at)
                        .map_or(-1, |w| i64::try_from(w.as_micros()).unwrap_or(-1));
                    writeln!(stdout, "sample {} {wake}", latency.as_micros())?;
                }
                Ok(())
            }
            Ok(Ok((None, _, _))) => Err("loaded value was None".to_owned()),
            Ok(Err(e)) => Err(e),
            Err(e) => Err(format!("task failed: {e}")),
        };
        match outcome {
            Ok(()) => done.ok += 1,
            Err(msg) => {
                done.err += 1;
                done.first_error.get_or_insert(msg);
            }
        }
    }
    writeln!(stdout, "{done}")?;
    stdout.flush()?;
    Ok(done.err)
}

/// The database stand-in: count the load (and record this process's id
/// under `<counter>:pid`, so a test can find and kill the loading process),
/// take `delay`, and return a value stamped with the wall-clock time it was
/// produced.
async fn load(
    conn: &mut MultiplexedConnection,
    counter: &str,
    delay: Duration,
) -> Result<String, redis::RedisError> {
    redis::pipe()
        .cmd("INCR")
        .arg(counter)
        .ignore()
        .cmd("SET")
        .arg(format!("{counter}:pid"))
        .arg(std::process::id())
        .ignore()
        .query_async::<()>(conn)
        .await?;
    tokio::time::sleep(delay).await;
    Ok(format!("{}@{}", std::process::id(), unix_micros()))
}

/// What every call of one worker shares.
struct Shared {
    cache: Cache<String>,
    conn: MultiplexedConnection,
    opts: WorkerOpts,
    loader_sleep: Duration,
}

/// What one call's task returns: the value, the latency from the release,
/// and the wall-clock µs at which it returned.
type CallOutcome = Result<(Option<String>, Duration, u128), String>;

/// Spawns one call; only the clock is read when it returns (the wake-up is
/// worked out after the fan-out).
fn timed<F>(released: Instant, countdown: Countdown, call: F) -> JoinHandle<CallOutcome>
where
    F: Future<Output = Result<Option<String>, String>> + Send + 'static,
{
    tokio::spawn(async move {
        let _countdown = countdown;
        let value = call.await?;
        Ok((value, released.elapsed(), unix_micros()))
    })
}

async fn breakwater_call(shared: Arc<Shared>) -> Result<Option<String>, String> {
    let loader_shared = Arc::clone(&shared);
    shared
        .cache
        .get_or_load(&shared.opts.key, move || {
            let shared = Arc::clone(&loader_shared);
            async move {
                let mut conn = shared.conn.clone();
                load(&mut conn, &shared.opts.counter, shared.loader_sleep)
                    .await
                    .map(Some)
            }
        })
        .await
        .map_err(|e| e.to_string())
}

async fn naive_call(shared: Arc<Shared>) -> Result<Option<String>, String> {
    naive(shared.conn.clone(), &shared.opts, shared.loader_sleep)
        .await
        .map(Some)
        .map_err(|e| e.to_string())
}

/// Counts the calls still running; the last one to end (return, fail or
/// panic) wakes the harness.
struct Finished {
    remaining: AtomicUsize,
    all: Notify,
}

struct Countdown(Arc<Finished>);

impl Drop for Countdown {
    fn drop(&mut self) {
        if self.0.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.all.notify_one();
        }
    }
}

/// How long after `value` was produced a caller that got it at
/// `returned_at` (µs since the epoch) returned.
fn wake_up(value: &str, returned_at: u128) -> Option<Duration> {
    let filled: u128 = value.rsplit_once('@')?.1.parse().ok()?;
    Some(Duration::from_micros(
        u64::try_from(returned_at.saturating_sub(filled)).unwrap_or(u64::MAX),
    ))
}

fn unix_micros() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros())
}

/// A port of the seed article's request coalescing, for comparison only:
/// GET; on a miss `SET lock NX EX 10`; the lock holder loads, writes with
/// `EX 300` and deletes the lock; everyone else sleeps 100 ms, reads again,
/// and loads on its own if the value is still missing.
async fn naive(
    mut conn: MultiplexedConnection,
    opts: &WorkerOpts,
    delay: Duration,
) -> Result<String, redis::RedisError> {
    let key = format!("naive:{}", opts.key);
    let lock = format!("lock:{key}");
    let cached: Option<String> = redis::cmd("GET").arg(&key).query_async(&mut conn).await?;
    if let Some(value) = cached {
        return Ok(value);
    }
    let locked: Option<String> = redis::cmd("SET")
        .arg(&lock)
        .arg("1")
        .arg("NX")
        .arg("EX")
        .arg(10)
        .query_async(&mut conn)
        .await?;
    if locked.is_some() {
        let fresh = load(&mut conn, &opts.counter, delay).await?;
        redis::cmd("SET")
            .arg(&key)
            .arg(&fresh)
            .arg("EX")
            .arg(300)
            .query_async::<()>(&mut conn)
            .await?;
        redis::cmd("DEL")
            .arg(&lock)
            .query_async::<i64>(&mut conn)
            .await?;
        return Ok(fresh);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let retried: Option<String> = redis::cmd("GET").arg(&key).query_async(&mut conn).await?;
    match retried {
        Some(value) => Ok(value),
        None => load(&mut conn, &opts.counter, delay).await,
    }
}

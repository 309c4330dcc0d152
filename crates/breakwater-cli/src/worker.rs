//! `breakwater stampede-worker` (hidden): one process of a multi-process
//! stampede test.
//!
//! The worker connects to Redis, prints `ready`, waits for one line on stdin
//! (the test releases every worker at once), then fires `concurrency` calls
//! of [`Cache::get_or_load`] for one key. Its loader counts itself with an
//! `INCR` on a Redis counter, so the test can check how many loads the whole
//! fleet ran. It ends with one line
//! `done ok=<n> err=<n> first_error=<message or none>`.

use std::io::{self, BufRead, Write};
use std::process::ExitCode;
use std::time::Duration;

use breakwater::{Cache, OnLockTimeout, RedisStore};
use clap::Args;

/// Options of `breakwater stampede-worker`.
#[derive(Debug, Clone, Args)]
pub(crate) struct WorkerOpts {
    /// Redis URL, e.g. `redis://127.0.0.1:6379`.
    #[arg(long)]
    pub(crate) redis: String,
    /// Cache namespace.
    #[arg(long, default_value = "stampede")]
    pub(crate) namespace: String,
    /// The one key every call asks for.
    #[arg(long, default_value = "hot")]
    pub(crate) key: String,
    /// Concurrent `get_or_load` calls in this process.
    #[arg(long, default_value_t = 250)]
    pub(crate) concurrency: usize,
    /// How long the loader sleeps, in milliseconds.
    #[arg(long, default_value_t = 50)]
    pub(crate) loader_ms: u64,
    /// The cache's lease TTL, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    pub(crate) lease_ttl_ms: u64,
    /// The cache's lock wait, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) lock_wait_ms: u64,
    /// The Redis key the loader `INCR`s once per load.
    #[arg(long, default_value = "loads")]
    pub(crate) counter: String,
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
    let store = RedisStore::connect(&opts.redis)?;
    store.warm_up().await?;
    let cache = Cache::<String>::builder()
        .namespace(opts.namespace.clone())
        .store(store)
        .lease_ttl(Duration::from_millis(opts.lease_ttl_ms))
        .lock_wait(Duration::from_millis(opts.lock_wait_ms))
        .on_lock_timeout(OnLockTimeout::error())
        .build()?;
    let counter_conn = redis::Client::open(opts.redis.as_str())?
        .get_multiplexed_async_connection()
        .await?;

    {
        let mut stdout = io::stdout().lock();
        writeln!(stdout, "ready")?;
        stdout.flush()?;
    }
    // Blocking read off the runtime thread, so connection tasks keep running.
    let go = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        io::stdin().lock().read_line(&mut line).map(|_| line)
    })
    .await??;
    if go.is_empty() {
        return Err("stdin closed before the go line".into());
    }

    let pid = std::process::id();
    let loader_sleep = Duration::from_millis(opts.loader_ms);
    let handles: Vec<_> = (0..opts.concurrency)
        .map(|_| {
            let cache = cache.clone();
            let key = opts.key.clone();
            let counter = opts.counter.clone();
            let mut conn = counter_conn.clone();
            tokio::spawn(async move {
                cache
                    .get_or_load(key, move || async move {
                        redis::cmd("INCR")
                            .arg(&counter)
                            .query_async::<i64>(&mut conn)
                            .await?;
                        tokio::time::sleep(loader_sleep).await;
                        Ok::<_, redis::RedisError>(Some(format!("value from pid {pid}")))
                    })
                    .await
            })
        })
        .collect();

    let (mut ok, mut err) = (0usize, 0usize);
    let mut first_error: Option<String> = None;
    for handle in handles {
        let outcome = match handle.await {
            Ok(Ok(Some(_))) => Ok(()),
            Ok(Ok(None)) => Err("loaded value was None".to_owned()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(e) => Err(format!("task failed: {e}")),
        };
        match outcome {
            Ok(()) => ok += 1,
            Err(msg) => {
                err += 1;
                first_error.get_or_insert(msg);
            }
        }
    }
    let first_error = first_error.unwrap_or_else(|| "none".to_owned());
    let mut stdout = io::stdout().lock();
    writeln!(stdout, "done ok={ok} err={err} first_error={first_error}")?;
    stdout.flush()?;
    Ok(err)
}

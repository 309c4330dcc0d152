//! `breakwater warm`: fill a cold cache ahead of traffic without stampeding
//! the database, and show that it held back: how fast it loaded, how many
//! queries ran at once, and how the warmed keys' expiries spread.
//!
//! The "database" is a stand-in that takes `--loader-ms` per query and
//! counts the queries running at once. Without `--redis` the cache runs on
//! the embedded memory store; with it, on that Redis (keys under
//! `bw:<namespace>:`). A second pass over the same keys shows that a warm
//! cache costs reads, not loads.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use breakwater::{Cache, Error, Jitter, MemoryStore, Store, Warm, WarmReport};
use clap::Args;

use crate::db::Database;
use crate::demo::{ExpiryStats, expiry_ms, expiry_stats};

/// Options of `breakwater warm`.
#[derive(Debug, Clone, Args)]
pub(crate) struct WarmOpts {
    /// Redis URL (several, comma-separated, for the nodes of a Redis
    /// Cluster); without it the embedded memory store is used.
    #[arg(long)]
    pub(crate) redis: Option<String>,
    /// Cache namespace (the keys are `bw:<namespace>:v:{key:<i>}`).
    #[arg(long, default_value = "warm-demo")]
    pub(crate) namespace: String,
    /// Keys to warm.
    #[arg(long, default_value_t = 2_000)]
    pub(crate) keys: usize,
    /// Most loads started per second.
    #[arg(long, default_value_t = 1_000)]
    pub(crate) rate: u32,
    /// Most keys in progress at once.
    #[arg(long, default_value_t = 16)]
    pub(crate) concurrency: usize,
    /// How long one database query takes, in milliseconds.
    #[arg(long, default_value_t = 5)]
    pub(crate) loader_ms: u64,
    /// Base TTL in seconds.
    #[arg(long, default_value_t = 3_600)]
    pub(crate) ttl_secs: u64,
    /// Jitter ratio of the warmed TTLs (±ratio).
    #[arg(long, default_value_t = 0.2, allow_negative_numbers = true)]
    pub(crate) ratio: f64,
}

/// What a warm run measured.
#[derive(Debug)]
pub(crate) struct WarmRun {
    /// The first pass over a cold cache.
    pub(crate) cold: WarmReport,
    /// The second pass over the same keys.
    pub(crate) warm: WarmReport,
    /// Database queries in all.
    pub(crate) queries: usize,
    /// The most queries that ran at once.
    pub(crate) peak_queries: usize,
    /// How the warmed keys' expiries spread (ms after the first pass began).
    pub(crate) expiries: ExpiryStats,
}

/// Runs `breakwater warm`.
pub(crate) async fn main(opts: WarmOpts) -> ExitCode {
    match run(&opts).await {
        Ok(run) => {
            print!("{}", render(&opts, &run));
            if run.cold.failed + run.warm.failed == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(err) => {
            eprintln!("error: {err}");
            if err.is_config() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// Warms `opts.keys` keys twice and reads their expiries back.
pub(crate) async fn run(opts: &WarmOpts) -> Result<WarmRun, Error> {
    let store: Arc<dyn Store> = match &opts.redis {
        Some(url) => {
            let store = crate::redis_store(url)?;
            store.warm_up().await?;
            Arc::new(store)
        }
        None => Arc::new(MemoryStore::new()),
    };
    let jitter = Jitter::ratio(opts.ratio);
    let cache = Cache::<String>::builder()
        .namespace(opts.namespace.clone())
        .shared_store(Arc::clone(&store))
        .ttl(Duration::from_secs(opts.ttl_secs))
        .jitter(jitter)
        .build()?;
    let warm = Warm::new().rate(opts.rate).concurrency(opts.concurrency);
    let db = Arc::new(Database::new(Duration::from_millis(opts.loader_ms)));
    let keys: Vec<String> = (0..opts.keys).map(|i| format!("key:{i}")).collect();

    let began_ms = store.now_ms();
    let pass = || {
        let db = Arc::clone(&db);
        let query = move |key: String| {
            let db = Arc::clone(&db);
            async move {
                db.query().await;
                Ok::<_, Error>(Some(format!("row for {key}")))
            }
        };
        cache.warm(keys.clone(), query, warm)
    };
    let cold = pass().await?;
    let warm_pass = pass().await?;

    let mut expiries = Vec::with_capacity(keys.len());
    for key in &keys {
        if let Some(at) = expiry_ms(&cache, &*store, key, began_ms).await? {
            expiries.push(at);
        }
    }
    Ok(WarmRun {
        cold,
        warm: warm_pass,
        queries: db.started_ms().len(),
        peak_queries: db.peak(),
        expiries: expiry_stats(&expiries),
    })
}

/// The report as text.
pub(crate) fn render(opts: &WarmOpts, run: &WarmRun) -> String {
    use std::fmt::Write as _;

    let mut out = String::new();
    let store = opts.redis.as_deref().unwrap_or("the embedded memory store");
    let _ = writeln!(
        out,
        "warm: {} keys on {store}, at most {} loads/s and {} keys at once, {} ms per query",
        opts.keys, opts.rate, opts.concurrency, opts.loader_ms
    );
    let _ = writeln!(out);
    for (name, pass) in [("cold cache", &run.cold), ("warm cache", &run.warm)] {
        let secs = pass.elapsed.as_secs_f64();
        let per_second = if secs > 0.0 {
            format!("{:.0} loads/s", pass.loaded as f64 / secs)
        } else {
            "-".to_owned()
        };
        let _ = writeln!(
            out,
            "{name}: loaded {}, already cached {}, failed {} in {secs:.2} s ({per_second})",
            pass.loaded, pass.cached, pass.failed
        );
        if let Some((key, err)) = &pass.first_error {
            let _ = writeln!(out, "  first failure: {key}: {err}");
        }
    }
    let _ = writeln!(
        out,
        "database: {} queries, at most {} at once (limit {})",
        run.queries, run.peak_queries, opts.concurrency
    );
    let e = &run.expiries;
    if e.count > 0 {
        let _ = writeln!(
            out,
            "expiries: {} keys from {:.0} s to {:.0} s after the warm-up began, at most {} in any one second",
            e.count,
            e.first_ms as f64 / 1000.0,
            e.last_ms as f64 / 1000.0,
            e.peak_1s
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(keys: usize, rate: u32, concurrency: usize) -> WarmOpts {
        WarmOpts {
            redis: None,
            namespace: "warm-test".to_owned(),
            keys,
            rate,
            concurrency,
            loader_ms: 50,
            ttl_secs: 3_600,
            ratio: 0.2,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn warms_within_its_limits_and_spreads_expiries() {
        let o = opts(200, 100, 4);
        let run = run(&o).await.unwrap();
        assert_eq!(
            (run.cold.loaded, run.cold.cached, run.cold.failed),
            (200, 0, 0)
        );
        assert_eq!(
            (run.warm.loaded, run.warm.cached, run.warm.failed),
            (0, 200, 0)
        );
        assert_eq!(run.queries, 200, "the second pass queried nothing");
        assert!(run.peak_queries <= 4, "{}", run.peak_queries);
        // 200 loads at 100/s: about 2 s, never faster.
        assert!(
            run.cold.elapsed >= Duration::from_millis(1_990),
            "{:?}",
            run.cold.elapsed
        );
        // ±20 % of an hour: spread over minutes.
        assert_eq!(run.expiries.count, 200);
        assert!(run.expiries.spread_ms > 600_000, "{:?}", run.expiries);
        let text = render(&o, &run);
        assert!(
            text.contains("cold cache: loaded 200, already cached 0, failed 0"),
            "{text}"
        );
        assert!(
            text.contains("warm cache: loaded 0, already cached 200, failed 0"),
            "{text}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_rate_is_a_config_error() {
        let err = run(&opts(10, 0, 4)).await.unwrap_err();
        assert!(err.is_config(), "{err}");
        assert!(
            err.to_string().contains("warm rate must be at least 1"),
            "{err}"
        );
    }
}

//! `breakwater warm`: fill a cold cache ahead of traffic without stampeding
//! the database, and show that it held back: how fast it loaded, how many
//! queries ran at once, and how the warmed keys' expiries spread.
//!
//! The "database" is a stand-in that takes `--loader-latency` per query and
//! counts the queries running at once. Without `--redis` the cache runs on
//! the embedded memory store; with it, on that Redis (keys under
//! `bw:<namespace>:`). A second pass over the same keys shows that a warm
//! cache costs reads, not loads.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use breakwater_cache::{Cache, Error, MemoryStore, Store, Value, Warm, WarmReport};
use clap::Args;
use clap::builder::RangedU64ValueParser;

use crate::args::{self, JitterArg};
use crate::db::Database;
use crate::failure::{Failure, bad_url, shown};
use crate::histogram;
use crate::report::thousands;

/// Options of `breakwater warm`.
#[derive(Debug, Clone, Args)]
pub(crate) struct WarmOpts {
    /// Redis URL (several, comma-separated, for the nodes of a Redis
    /// Cluster); without it the embedded memory store is used.
    #[arg(long, value_name = "URL")]
    pub(crate) redis: Option<String>,
    /// Cache namespace (the keys are `bw:<namespace>:v:{key:<i>}`).
    #[arg(long, default_value = "warm-demo")]
    pub(crate) namespace: String,
    /// Keys to warm (1 to 10,000,000).
    #[arg(long, value_name = "N", default_value_t = 2_000, value_parser = RangedU64ValueParser::<usize>::new().range(1..=10_000_000))]
    pub(crate) keys: usize,
    /// Most loads started per second (1 to 1,000,000).
    #[arg(long, value_name = "N", default_value_t = 1_000, value_parser = args::rate())]
    pub(crate) rate: u64,
    /// Most calls in flight at once, per process (1 to 100,000).
    #[arg(long, value_name = "N", default_value_t = 16, value_parser = args::concurrency())]
    pub(crate) concurrency: usize,
    /// How long one loader call (a database query) takes, e.g. `5ms` (0 to
    /// 1m).
    #[arg(long, value_name = "DURATION", default_value = "5ms", value_parser = args::loader_latency)]
    pub(crate) loader_latency: Duration,
    /// Base TTL of the keys, e.g. `10m` or `1h` (1s to 365d).
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = args::ttl)]
    pub(crate) ttl: Duration,
    /// TTL jitter: `0.2` or `ratio:0.2` (±20%), `down:0.2` (−20% to 0),
    /// `±30s` or `fixed:30s`, `up-to:30s` (0 to +30s), or `none`.
    #[arg(long, value_name = "JITTER", default_value = "0.2", value_parser = args::jitter, allow_hyphen_values = true)]
    pub(crate) jitter: JitterArg,
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
    /// When the warmed keys expire, in ms after the first pass began,
    /// ascending.
    pub(crate) expiries: Vec<u64>,
}

/// Runs `breakwater warm`.
pub(crate) async fn main(opts: WarmOpts) -> ExitCode {
    let spinner = crate::progress::spinner(&format!("warming {} keys, twice", opts.keys));
    let result = run(&opts).await;
    spinner.finish_and_clear();
    match result {
        Ok(run) => {
            crate::out!("{}", render(&opts, &run));
            if run.cold.failed + run.warm.failed == 0 {
                ExitCode::SUCCESS
            } else {
                Failure::runtime(format!(
                    "{} key(s) failed to load; the first failure is above",
                    run.cold.failed + run.warm.failed
                ))
                .exit("warm")
            }
        }
        Err(failure) => failure.exit("warm"),
    }
}

/// Warms `opts.keys` keys twice and reads their expiries back.
pub(crate) async fn run(opts: &WarmOpts) -> Result<WarmRun, Failure> {
    let store: Arc<dyn Store> = match &opts.redis {
        Some(url) => {
            let store = crate::connect::store(url).map_err(|err| bad_url(url, err))?;
            if let Err(err) = store.warm_up().await {
                return Err(crate::failure::unreachable(url, err).await);
            }
            Arc::new(store)
        }
        None => Arc::new(MemoryStore::new()),
    };
    let jitter = opts.jitter.jitter();
    let cache = Cache::<String>::builder()
        .namespace(opts.namespace.clone())
        .shared_store(Arc::clone(&store))
        .ttl(opts.ttl)
        .jitter(jitter)
        .build()?;
    let warm = Warm::new()
        .rate(u32::try_from(opts.rate).unwrap_or(u32::MAX))
        .concurrency(opts.concurrency);
    let db = Arc::new(Database::new(opts.loader_latency));
    let keys: Vec<String> = (0..opts.keys).map(|i| format!("key:{i}")).collect();

    let began_ms = store.now_ms();
    let pass = || {
        let db = Arc::clone(&db);
        let query = move |key: String| {
            let db = Arc::clone(&db);
            async move {
                db.query().await?;
                Ok::<_, crate::db::Down>(Some(format!("row for {key}")))
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
    expiries.sort_unstable();
    Ok(WarmRun {
        cold,
        warm: warm_pass,
        queries: db.started_ms().len(),
        peak_queries: db.peak(),
        expiries,
    })
}

/// When `key` expires, in ms after `since_ms` on the store's clock; `None`
/// if it is gone or has no TTL.
async fn expiry_ms<V: Value>(
    cache: &Cache<V>,
    store: &dyn Store,
    key: &str,
    since_ms: u64,
) -> Result<Option<u64>, Error> {
    let raw = cache.storage_key(key.as_bytes())?;
    let now_ms = store.now_ms();
    let left = store.ttl(&raw).await?;
    Ok(left.map(|left| {
        let left_ms = u64::try_from(left.as_micros().div_ceil(1000)).unwrap_or(u64::MAX);
        now_ms.saturating_add(left_ms).saturating_sub(since_ms)
    }))
}

/// The report as text.
pub(crate) fn render(opts: &WarmOpts, run: &WarmRun) -> String {
    use std::fmt::Write as _;

    let mut out = String::new();
    let store = opts
        .redis
        .as_deref()
        .map_or("the embedded memory store".to_owned(), shown);
    let _ = writeln!(
        out,
        "warm: {} keys on {store}, at most {} loads/s and {} keys at once, {} per query",
        opts.keys,
        opts.rate,
        opts.concurrency,
        humantime::format_duration(opts.loader_latency)
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
    if let (Some(first), Some(last)) = (e.first(), e.last()) {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "expiries: {} keys from {:.0} s to {:.0} s after the warm-up began (TTL {}, jitter {})",
            thousands(e.len()),
            *first as f64 / 1000.0,
            *last as f64 / 1000.0,
            humantime::format_duration(opts.ttl),
            opts.jitter
        );
        out.push_str(&histogram::render(
            "seconds after the warm-up began",
            &[("expiries", e)],
        ));
        let (low, high) = opts.jitter.jitter().bounds(opts.ttl);
        let window_s = (high - low).as_secs_f64();
        let ideal = if window_s >= 1.0 {
            format!(
                "uniform ideal {:.0}/s (the keys spread evenly over the jitter's window)",
                e.len() as f64 / window_s
            )
        } else {
            "uniform ideal: all of them, there is no jitter window".to_owned()
        };
        let _ = writeln!(
            out,
            "busiest second: {}; {ideal}",
            thousands(histogram::peak_1s(e))
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(keys: usize, rate: u64, concurrency: usize) -> WarmOpts {
        WarmOpts {
            redis: None,
            namespace: "warm-test".to_owned(),
            keys,
            rate,
            concurrency,
            loader_latency: Duration::from_millis(50),
            ttl: Duration::from_secs(3_600),
            jitter: JitterArg::Number(0.2),
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
        assert_eq!(run.expiries.len(), 200);
        let spread_ms = run.expiries[199] - run.expiries[0];
        assert!(spread_ms > 600_000, "{spread_ms}");
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
        assert!(matches!(err, Failure::Usage(_)), "{err}");
        assert!(
            err.to_string().contains("warm rate must be at least 1"),
            "{err}"
        );
    }
}

//! The write comparison of `breakwater bench write --redis URL[,URL…]`
//! (which `cargo bench -p breakwater-cache-cli --bench write` runs on a
//! private `redis-server` and a private 3-node cluster): breakwater's
//! writes next to raw pipelined `SET k v PX ttl` of the same values on the
//! same server, interleaved trials, the ratio of the medians.
//!
//! Three scenarios, of `value_bytes`-byte values:
//! - `set_many`: one `Cache::set_many` of all `items`, next to raw
//!   `SET PX`s sent as pipelines of `batch` commands, one after another
//!   (with `batch` = `items`, the default, one pipeline);
//! - `set, N in flight`: N tasks calling `Cache::set` until the items are
//!   written, next to raw pipelines of N `SET PX`s, one after another;
//! - `invalidate K keys`: one `Cache::invalidate_many` of K keys next to K
//!   `Cache::invalidate`s one after another (the keys written again before
//!   each side; that write is not timed).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use breakwater_cache::Cache;

use super::hit::Row;

/// The raw side's TTL (the cache's own is the same, jittered).
const TTL: Duration = Duration::from_secs(300);

/// How many raw commands are in flight at once on a cluster (its
/// connection pipelines what waits for one node; a hundred thousand at
/// once overwhelm its bookkeeping).
const CLUSTER_IN_FLIGHT: usize = 1_000;

/// What to run.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// One Redis URL, or a cluster's nodes, comma-separated.
    pub(crate) urls: String,
    /// Interleaved trials per scenario.
    pub(crate) trials: usize,
    /// Writes per trial.
    pub(crate) items: usize,
    /// The raw side's pipeline length in the `set_many` scenario.
    pub(crate) batch: usize,
    /// Concurrent `set` calls (and the raw pipeline's length) in the
    /// single-write scenario.
    pub(crate) in_flight: usize,
    /// The size of each value.
    pub(crate) value_bytes: usize,
    /// Whether the single-write and invalidation scenarios run too.
    pub(crate) singles: bool,
    /// Keys of the invalidation scenario.
    pub(crate) invalidations: usize,
}

/// How long the raw side waits for one pipeline's replies: redis-rs's
/// default (500 ms) is shorter than one pipeline of a few hundred
/// thousand `SET`s takes (`--items 300000` timed out on the raw side).
const RAW_RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);

/// A raw connection: one multiplexed connection, or a cluster's.
#[derive(Clone)]
pub(super) enum Raw {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Raw {
    pub(super) async fn connect(urls: &str) -> Result<Raw, String> {
        if urls.contains(',') {
            let client = redis::cluster::ClusterClientBuilder::new(urls.split(',').map(str::trim))
                .response_timeout(RAW_RESPONSE_TIMEOUT)
                .build()
                .map_err(|e| e.to_string())?;
            Ok(Raw::Cluster(
                client
                    .get_async_connection()
                    .await
                    .map_err(|e| e.to_string())?,
            ))
        } else {
            let client = redis::Client::open(urls).map_err(|e| e.to_string())?;
            Ok(Raw::Single(
                client
                    .get_multiplexed_async_connection_with_config(
                        &redis::AsyncConnectionConfig::new()
                            .set_response_timeout(Some(RAW_RESPONSE_TIMEOUT)),
                    )
                    .await
                    .map_err(|e| e.to_string())?,
            ))
        }
    }

    /// Sends `pipeline`, waits for its replies. On a cluster (whose
    /// pipelines must keep to one slot) its commands go out side by side,
    /// [`CLUSTER_IN_FLIGHT`] at a time, each to its key's node: the
    /// connection writes what is waiting for one node together, as a
    /// pipeline.
    pub(super) async fn run(&mut self, pipeline: &redis::Pipeline) -> Result<(), String> {
        match self {
            Raw::Single(conn) => pipeline.query_async::<()>(conn).await,
            Raw::Cluster(conn) => {
                use futures_util::{StreamExt, TryStreamExt};
                let sent = pipeline.cmd_iter().map(|cmd| {
                    let mut conn = conn.clone();
                    async move { cmd.query_async::<()>(&mut conn).await }
                });
                futures_util::stream::iter(sent)
                    .buffer_unordered(CLUSTER_IN_FLIGHT)
                    .try_collect::<()>()
                    .await
            }
        }
        .map_err(|e| e.to_string())
    }
}

/// Runs the scenarios against `plan.urls`; writes keys under
/// `bw:bench-write-<pid>:` and `raw:bench-write-<pid>:`, and deletes them
/// when it ends (also when a scenario failed).
pub(super) async fn compare(plan: &Plan) -> Result<Vec<Row>, String> {
    let store = crate::connect::bench_cluster_store(&plan.urls)
        .await
        .map_err(|e| e.to_string())?;
    let cache = Cache::<String>::builder()
        .namespace(format!("bench-write-{}", std::process::id()))
        .store(store)
        .ttl(TTL)
        .build()
        .map_err(|e| e.to_string())?;
    let raw = Raw::connect(&plan.urls).await?;
    let pid = std::process::id();
    let keys: Arc<Vec<String>> = Arc::new((0..plan.items).map(|i| format!("item:{i}")).collect());
    let raw_keys: Arc<Vec<String>> = Arc::new(
        keys.iter()
            .map(|k| format!("raw:bench-write-{pid}:{k}"))
            .collect(),
    );
    let value: String = "v".repeat(plan.value_bytes);
    let ttl_ms = u64::try_from(TTL.as_millis()).unwrap_or(u64::MAX);
    let pipelines = |len: usize| -> Vec<redis::Pipeline> {
        raw_keys
            .chunks(len.max(1))
            .map(|chunk| {
                let mut p = redis::pipe();
                for k in chunk {
                    p.cmd("SET")
                        .arg(k)
                        .arg(&value)
                        .arg("PX")
                        .arg(ttl_ms)
                        .ignore();
                }
                p
            })
            .collect()
    };
    let rows = scenarios(plan, &cache, &raw, &keys, &value, &pipelines).await;
    // Every key either side wrote, the namespace's clear record, one
    // `UNLINK` each (a cluster routes each to its node).
    let mut doomed: Vec<Vec<u8>> = Vec::with_capacity(2 * keys.len() + 1);
    for (key, raw_key) in keys.iter().zip(raw_keys.iter()) {
        doomed.push(cache.storage_key(key.as_str()).map_err(|e| e.to_string())?);
        doomed.push(raw_key.clone().into_bytes());
    }
    doomed.push(cache.clear_record_key().to_vec());
    for chunk in doomed.chunks(1_000) {
        let mut p = redis::pipe();
        for key in chunk {
            p.cmd("UNLINK").arg(key).ignore();
        }
        raw.clone().run(&p).await?;
    }
    rows
}

/// The scenarios: `set_many`, then (unless `plan.singles` is off)
/// invalidations and concurrent `set`s.
async fn scenarios(
    plan: &Plan,
    cache: &Cache<String>,
    raw: &Raw,
    keys: &Arc<Vec<String>>,
    value: &str,
    pipelines: &dyn Fn(usize) -> Vec<redis::Pipeline>,
) -> Result<Vec<Row>, String> {
    let mut rows = Vec::new();

    // `set_many` of everything, next to raw pipelines of `batch`.
    let by_batch = pipelines(plan.batch);
    let mut row = Row::new(
        format!("set_many, {} items", plan.items),
        "set_many",
        "raw SET PX",
    );
    for trial in 0..plan.trials.max(1) {
        let ours = async {
            let items = keys.iter().map(|k| (k.as_str(), value.to_owned()));
            let started = Instant::now();
            cache.set_many(items).await.map_err(|e| e.to_string())?;
            Ok::<_, String>(plan.items as f64 / started.elapsed().as_secs_f64())
        };
        let theirs = raw_run(raw.clone(), &by_batch, plan.items);
        let (o, r) = interleaved(trial, ours, theirs).await?;
        row.ours.push(o);
        row.raw.push(r);
    }
    rows.push(row);
    if !plan.singles {
        return Ok(rows);
    }

    // `invalidate_many` of `invalidations` keys, next to as many
    // `invalidate`s one after another (each key written again first).
    let doomed: Vec<&str> = keys
        .iter()
        .take(plan.invalidations)
        .map(String::as_str)
        .collect();
    let mut row = Row::new(
        format!("invalidate {} keys", doomed.len()),
        "invalidate_many",
        "one invalidate at a time",
    );
    let rewrite = || cache.set_many(doomed.iter().map(|&k| (k, value.to_owned())));
    for trial in 0..plan.trials.max(1) {
        let ours = async {
            rewrite().await.map_err(|e| e.to_string())?;
            let started = Instant::now();
            cache
                .invalidate_many(&doomed)
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(doomed.len() as f64 / started.elapsed().as_secs_f64())
        };
        let singles = async {
            rewrite().await.map_err(|e| e.to_string())?;
            let started = Instant::now();
            for key in &doomed {
                cache.invalidate(key).await.map_err(|e| e.to_string())?;
            }
            Ok::<_, String>(doomed.len() as f64 / started.elapsed().as_secs_f64())
        };
        let (o, r) = interleaved(trial, ours, singles).await?;
        row.ours.push(o);
        row.raw.push(r);
    }
    rows.push(row);

    // `set` from `in_flight` tasks, next to raw pipelines of `in_flight`.
    let by_flight = pipelines(plan.in_flight);
    let mut row = Row::new(
        format!("set, {} in flight", plan.in_flight),
        "set",
        "raw SET PX",
    );
    for trial in 0..plan.trials.max(1) {
        let ours = concurrent_sets(cache, keys, value, plan.in_flight);
        let theirs = raw_run(raw.clone(), &by_flight, plan.items);
        let (o, r) = interleaved(trial, ours, theirs).await?;
        row.ours.push(o);
        row.raw.push(r);
    }
    rows.push(row);
    Ok(rows)
}

/// Runs `ours` and `theirs` one after the other, raw first in even trials.
async fn interleaved(
    trial: usize,
    ours: impl Future<Output = Result<f64, String>>,
    theirs: impl Future<Output = Result<f64, String>>,
) -> Result<(f64, f64), String> {
    if trial.is_multiple_of(2) {
        let r = theirs.await?;
        Ok((ours.await?, r))
    } else {
        let o = ours.await?;
        Ok((o, theirs.await?))
    }
}

/// Writes per second of `pipelines`, one after another.
async fn raw_run(mut raw: Raw, pipelines: &[redis::Pipeline], items: usize) -> Result<f64, String> {
    let started = Instant::now();
    for p in pipelines {
        raw.run(p).await?;
    }
    Ok(items as f64 / started.elapsed().as_secs_f64())
}

/// Writes per second of `in_flight` tasks calling `set` until every key is
/// written once.
async fn concurrent_sets(
    cache: &Cache<String>,
    keys: &Arc<Vec<String>>,
    value: &str,
    in_flight: usize,
) -> Result<f64, String> {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..in_flight.max(1))
        .map(|_| {
            let (cache, keys, next) = (cache.clone(), Arc::clone(keys), Arc::clone(&next));
            let value = value.to_owned();
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(key) = keys.get(i) else {
                        return Ok(());
                    };
                    cache.set(key.as_str(), &value).await?;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await
            .map_err(|e| format!("a writer stopped: {e}"))?
            .map_err(|e: breakwater_cache::Error| e.to_string())?;
    }
    Ok(keys.len() as f64 / started.elapsed().as_secs_f64())
}

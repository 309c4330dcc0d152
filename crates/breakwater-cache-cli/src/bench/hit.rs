//! The Redis-hit comparison of `breakwater bench hit --redis URL` (which
//! `cargo bench -p breakwater-cache-cli --bench hit` runs on a private
//! `redis-server`): a hit through `get_or_load` (L1 off, so every hit reads
//! Redis: one `GET`, or its share of an `MGET` when reads meet while the
//! store is busy) next to a raw `GET` on one multiplexed connection of the
//! same server, interleaved trials, the ratio of the medians; and a hit on
//! an entry tagged with two tags next to an untagged hit (one caller), with
//! the Redis commands a tagged hit costs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use breakwater_cache::{Cache, RedisStore};

/// One scenario's figures: operations per second of each trial.
pub(super) struct Row {
    /// What ran: callers and keys.
    name: String,
    /// What breakwater's side and the raw side call.
    labels: (&'static str, &'static str),
    /// breakwater's side, per trial.
    pub(super) ours: Vec<f64>,
    /// The raw side, per trial.
    pub(super) raw: Vec<f64>,
}

impl Row {
    /// A row of no trials yet.
    pub(super) fn new(name: String, ours: &'static str, raw: &'static str) -> Row {
        Row {
            name,
            labels: (ours, raw),
            ours: Vec::new(),
            raw: Vec::new(),
        }
    }

    /// The median of `get_or_load`'s trials over the median of the raw ones.
    fn ratio(&self) -> f64 {
        median(&self.ours) / median(&self.raw)
    }
}

impl std::fmt::Display for Row {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let whole = |xs: &[f64]| xs.iter().map(|x| *x as u64).collect::<Vec<_>>();
        write!(
            f,
            "{:<22} {} {:>8.0}/s   {} {:>8.0}/s   ratio {:.2}   (trials: ours {:?}, raw {:?})",
            self.name,
            self.labels.0,
            median(&self.ours),
            self.labels.1,
            median(&self.raw),
            self.ratio(),
            whole(&self.ours),
            whole(&self.raw),
        )
    }
}

/// Runs the four scenarios (1 caller; 50 callers on 50 keys; 50 callers
/// on one hot key; a tagged hit next to an untagged one) against the Redis at `url`, `trials` interleaved trials
/// of `trial` each. Which side runs first alternates from trial to trial
/// (raw `GET`s first in the first): the second of two back-to-back runs
/// can measure faster, and an even count of trials balances that out.
/// Writes keys under `bw:bench-hit-<pid>:` and `raw:bench-hit-<pid>:`
/// (the namespace of its own also holds the clear record its first write
/// pins, deleted with the rest).
pub(super) async fn compare(url: &str, trials: usize, trial: Duration) -> Result<Vec<Row>, String> {
    let store = RedisStore::connect(url).map_err(|e| e.to_string())?;
    store.warm_up().await.map_err(|e| e.to_string())?;
    let cache = Cache::<String>::builder()
        .namespace(format!("bench-hit-{}", std::process::id()))
        .store(store)
        .ttl(Duration::from_secs(3_600))
        .build()
        .map_err(|e| e.to_string())?;
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let raw = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let keys: Vec<String> = (0..50).map(|k| format!("product:{k}")).collect();
    let mut raw_keys = Vec::new();
    for key in &keys {
        let value = format!("value of {key}, about the size of a small row");
        cache.set(key, &value).await.map_err(|e| e.to_string())?;
        let raw_key = format!("raw:bench-hit-{}:{key}", std::process::id());
        redis::cmd("SET")
            .arg(&raw_key)
            .arg(&value)
            .arg("EX")
            .arg(3_600)
            .query_async::<()>(&mut raw.clone())
            .await
            .map_err(|e| e.to_string())?;
        raw_keys.push(raw_key);
    }
    let keys = Arc::new(keys);
    let raw_keys = Arc::new(raw_keys);
    let mut rows = Vec::new();
    for (name, callers, distinct) in [
        ("1 caller", 1usize, true),
        ("50 callers, 50 keys", 50, true),
        ("50 callers, 1 hot key", 50, false),
    ] {
        let pick = move |i: usize| if distinct { i } else { 0 };
        let mut row = Row::new(name.to_owned(), "get_or_load", "raw GET");
        for trial_no in 0..trials.max(1) {
            let (conn, raw_keys) = (raw.clone(), Arc::clone(&raw_keys));
            let raw_run = run(callers, trial, move |i| {
                let mut conn = conn.clone();
                let key = raw_keys[pick(i)].clone();
                async move {
                    let v: Option<String> = redis::cmd("GET")
                        .arg(&key)
                        .query_async(&mut conn)
                        .await
                        .unwrap_or(None);
                    v.is_some()
                }
            });
            let (cache, keys) = (cache.clone(), Arc::clone(&keys));
            let ours_run = run(callers, trial, move |i| {
                let cache = cache.clone();
                let keys = Arc::clone(&keys);
                async move {
                    let v = cache
                        .get_or_load(&keys[pick(i)], || async {
                            Ok::<_, std::io::Error>(Some(String::new()))
                        })
                        .await;
                    v.is_ok_and(|v| v.is_some_and(|v| !v.is_empty()))
                }
            });
            // Which side runs first alternates (see above).
            if trial_no % 2 == 0 {
                row.raw.push(raw_run.await);
                row.ours.push(ours_run.await);
            } else {
                row.ours.push(ours_run.await);
                row.raw.push(raw_run.await);
            }
        }
        rows.push(row);
    }
    rows.push(tagged(&cache, &raw, &keys[0], trials, trial).await?);
    Ok(rows)
}

/// The tags the tagged scenario's entry is written and read with.
const TAGS: [&str; 2] = ["product:0", "catalog"];

/// A tagged hit (an entry written with two tags, read by a call that names
/// them) next to an untagged hit, one caller, interleaved trials; its
/// name gives the Redis commands one tagged hit costs, counted with
/// `INFO commandstats` over 1,000 hits (`raw`: a connection to the same
/// server; `untagged`: a key already cached without tags).
async fn tagged(
    cache: &Cache<String>,
    raw: &redis::aio::MultiplexedConnection,
    untagged: &str,
    trials: usize,
    trial: Duration,
) -> Result<Row, String> {
    const KEY: &str = "tagged:product:0";
    let key = KEY;
    cache
        .entry(key)
        .tags(TAGS)
        .set(&format!("value of {key}, about the size of a small row"))
        .await
        .map_err(|e| e.to_string())?;
    let hit = |cache: Cache<String>| async move {
        cache
            .entry(KEY)
            .tags(TAGS)
            .get_or_load(|| async { Ok::<_, std::io::Error>(Some(String::new())) })
            .await
            .is_ok_and(|v| v.is_some_and(|v| !v.is_empty()))
    };
    const COUNTED: u64 = 1_000;
    let before = commands(&mut raw.clone()).await?;
    for _ in 0..COUNTED {
        if !hit(cache.clone()).await {
            return Err("a tagged hit missed or failed".to_owned());
        }
    }
    // The second INFO itself is counted once.
    let per_hit = (commands(&mut raw.clone()).await? - before - 1) as f64 / COUNTED as f64;
    let mut row = Row::new(
        format!("1 caller, 2 tags ({per_hit:.2} commands per hit)"),
        "tagged",
        "untagged",
    );
    for trial_no in 0..trials.max(1) {
        let c = cache.clone();
        let untagged = untagged.to_owned();
        let plain_run = run(1, trial, move |_| {
            let (cache, key) = (c.clone(), untagged.clone());
            async move {
                cache
                    .get_or_load(&key, || async {
                        Ok::<_, std::io::Error>(Some(String::new()))
                    })
                    .await
                    .is_ok_and(|v| v.is_some_and(|v| !v.is_empty()))
            }
        });
        let c = cache.clone();
        let tagged_run = run(1, trial, move |_| hit(c.clone()));
        if trial_no % 2 == 0 {
            row.raw.push(plain_run.await);
            row.ours.push(tagged_run.await);
        } else {
            row.ours.push(tagged_run.await);
            row.raw.push(plain_run.await);
        }
    }
    Ok(row)
}

/// Commands the server has run, by `INFO commandstats` (its `calls=`
/// summed over every command).
async fn commands(conn: &mut redis::aio::MultiplexedConnection) -> Result<u64, String> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .map_err(|e| e.to_string())?;
    Ok(info
        .lines()
        .filter_map(|line| line.split("calls=").nth(1))
        .filter_map(|rest| rest.split(',').next()?.parse::<u64>().ok())
        .sum())
}

/// Hits per second of `callers` tasks, each awaiting `op(i)` in a loop for
/// one trial; an op that answers `false` (a miss, an error) is not counted.
async fn run<F, Fut>(callers: usize, trial: Duration, op: F) -> f64
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send + 'static,
{
    let op = Arc::new(op);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|i| {
            let (op, stop, done) = (Arc::clone(&op), Arc::clone(&stop), Arc::clone(&done));
            tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += u64::from(op(i).await);
                }
                done.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    tokio::time::sleep(trial).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        let _ = task.await;
    }
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

/// The median; of an even count, the mean of the middle two (so that with
/// an even count of trials, each side's runs first and second weigh alike).
fn median(xs: &[f64]) -> f64 {
    let mut xs = xs.to_vec();
    xs.sort_by(f64::total_cmp);
    match xs.len() {
        0 => 0.0,
        n if n % 2 == 0 => (xs[n / 2 - 1] + xs[n / 2]) / 2.0,
        n => xs[n / 2],
    }
}

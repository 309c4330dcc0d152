//! `breakwater soak-worker` (hidden): one process of `breakwater soak`.
//!
//! It connects to Redis with the library's own deadlines (the soak tests
//! the real thing, stalls included), says `ready`, and then runs
//! `--concurrency` callers until its stdin ends: reads (`get_or_load`,
//! tagged with the row's group, and tagged `get_many` of a group's rows)
//! and writes to the soak's database, each announced to the cache
//! (`invalidate` after an update or a delete, `expire` after a create,
//! `invalidate_tag` or `expire_tag` after a group's rows are written,
//! now and then a hard or soft `clear`). It reports, one line each, as it
//! happens:
//!
//! - `r <row> <began µs> <seq or -> <served>`: a read's answer;
//! - `a <seq> <µs> <h|s>`: the announcement of write `seq` acknowledged
//!   (`h`: nothing older may be served; `s`: "not found" may not be), at
//!   that moment (a soft clear's: at the end of its window);
//! - `e <what>`: a call failed (not a violation: errors are allowed).

use std::io::{self, Write};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use breakwater_cache::{Cache, ClearMode, Error, L1Config, RedisStore};
use clap::Args;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::time::Instant;

use super::db::Client;
use crate::fleet::{read_line, say};
use crate::traffic::{pick, zipf_cdf};

/// Options of `breakwater soak-worker`.
#[derive(Debug, Clone, Args)]
pub(crate) struct SoakWorkerOpts {
    /// Redis URL.
    #[arg(long, value_name = "URL")]
    pub(crate) redis: String,
    /// The soak's database, `host:port`.
    #[arg(long, value_name = "ADDR")]
    pub(crate) db: SocketAddr,
    /// Cache namespace.
    #[arg(long)]
    pub(crate) namespace: String,
    /// This process's number (its incarnation: a restart gets another).
    #[arg(long)]
    pub(crate) worker: u32,
    /// The seed of this process's callers.
    #[arg(long)]
    pub(crate) seed: u64,
    /// Rows in the database.
    #[arg(long)]
    pub(crate) rows: u32,
    /// Groups of rows (one tag each).
    #[arg(long)]
    pub(crate) groups: u32,
    /// Most calls in flight at once, per process (1 to 100,000).
    #[arg(long, value_name = "N", value_parser = crate::args::concurrency())]
    pub(crate) concurrency: usize,
    /// Keep an L1 near cache.
    #[arg(long)]
    pub(crate) l1: bool,
}

/// The cache's TTL in the soak: short, so entries expire, refresh and
/// turn stale all the time.
pub(crate) const TTL: Duration = Duration::from_secs(3);
/// L1's TTL: the bound of another process's L1 the checker allows.
pub(crate) const L1_TTL: Duration = Duration::from_secs(1);
/// Shortest gap between two clears of one process.
const CLEAR_GAP: Duration = Duration::from_secs(5);

/// Runs the worker: exit code 0 unless it could not start.
pub(crate) async fn main(opts: SoakWorkerOpts) -> ExitCode {
    match run(opts).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("soak-worker: {err}");
            ExitCode::FAILURE
        }
    }
}

/// The tag of a group's rows.
fn tag(group: u32) -> String {
    format!("group:{group}")
}

/// Microseconds since the Unix epoch: the clock every process of the soak
/// shares (one machine).
pub(crate) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Writes one report line (stdout is line-buffered; a lost parent ends
/// the worker).
fn report(line: &str) {
    let mut out = io::stdout().lock();
    if writeln!(out, "{line}").is_err() {
        std::process::exit(0);
    }
}

async fn run(opts: SoakWorkerOpts) -> Result<(), Box<dyn std::error::Error>> {
    let store = RedisStore::connect(&opts.redis)?;
    let mut builder = Cache::<u64>::builder()
        .namespace(&opts.namespace)
        .store(store)
        .ttl(TTL)
        .negative_ttl(TTL)
        .grace(Duration::from_secs(2))
        .max_stale(Duration::from_secs(30));
    if opts.l1 {
        builder = builder.l1(L1Config::new().entries(100_000).ttl(L1_TTL));
    }
    let cache = Arc::new(builder.build()?);
    let db = Client::new(opts.db);
    say("ready")?;
    let last_clear = Arc::new(Mutex::new(Instant::now()));
    let mut callers = tokio::task::JoinSet::new();
    for caller in 0..opts.concurrency {
        let (cache, db, opts) = (Arc::clone(&cache), db.clone(), opts.clone());
        let last_clear = Arc::clone(&last_clear);
        let seed = opts.seed ^ ((opts.worker as u64) << 32) ^ caller as u64;
        callers.spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed);
            let cdf = zipf_cdf(opts.rows as usize, 1.0);
            loop {
                let key = pick(&cdf, rng.random::<f64>()) as u32;
                step(&cache, &db, &opts, &last_clear, &mut rng, key).await;
                // A short pause: the soak is about interleavings, not
                // throughput, and the machine runs Redis and the checker.
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..3))).await;
            }
        });
    }
    // Runs until the parent closes stdin (or kills it).
    tokio::task::spawn_blocking(|| while matches!(read_line(), Ok(l) if !l.is_empty()) {}).await?;
    callers.abort_all();
    Ok(())
}

/// One caller's step: a read, or a write announced to the cache.
async fn step(
    cache: &Cache<u64>,
    db: &Client,
    opts: &SoakWorkerOpts,
    last_clear: &Mutex<Instant>,
    rng: &mut StdRng,
    key: u32,
) {
    let group = key % opts.groups;
    let dice = rng.random::<f64>();
    if dice < 0.80 {
        let began = now_us();
        let db = db.clone();
        let fetched = cache
            .entry(key)
            .tags([tag(group)])
            .get_or_load_with_meta(move || async move { db.query(key).await })
            .await;
        match fetched {
            Ok(f) => report_read(key, began, f.value, f.served.as_str()),
            Err(e) => failed("get_or_load", &e),
        }
    } else if dice < 0.86 {
        // Up to four rows of the key's group, in one batch.
        let keys: Vec<u32> = (0..4)
            .map(|i| key + i * opts.groups)
            .filter(|&k| k < opts.rows)
            .collect();
        let began = now_us();
        let batch_db = db.clone();
        let got = cache
            .entries()
            .tags([tag(group)])
            .get_many_with_meta(keys.clone(), move |keys: Vec<u32>| {
                let db = batch_db.clone();
                async move {
                    let mut found = Vec::with_capacity(keys.len());
                    for key in keys {
                        if let Some(seq) = db.query(key).await? {
                            found.push((key, seq));
                        }
                    }
                    Ok::<_, io::Error>(found)
                }
            })
            .await;
        match got {
            Ok(answers) => {
                for (key, answer) in keys.into_iter().zip(answers) {
                    match answer {
                        Ok(f) => report_read(key, began, f.value, f.served.as_str()),
                        Err(e) => failed("get_many", &e),
                    }
                }
            }
            Err(e) => failed("get_many", &e),
        }
    } else if dice < 0.92 {
        announce(db, &format!("w {key}"), 'h', cache.invalidate(key)).await;
    } else if dice < 0.94 {
        announce(db, &format!("d {key}"), 'h', cache.invalidate(key)).await;
    } else if dice < 0.97 {
        announce(db, &format!("w {key}"), 's', cache.expire(key)).await;
    } else if dice < 0.985 {
        announce(
            db,
            &format!("t {group}"),
            'h',
            cache.invalidate_tag(tag(group)),
        )
        .await;
    } else if dice < 0.995 {
        announce(db, &format!("t {group}"), 's', cache.expire_tag(tag(group))).await;
    } else {
        {
            let mut last = last_clear.lock().unwrap_or_else(|p| p.into_inner());
            if last.elapsed() < CLEAR_GAP || rng.random::<f64>() < 0.9 {
                return;
            }
            *last = Instant::now();
        }
        if rng.random::<bool>() {
            announce(db, "c", 'h', cache.clear(ClearMode::Hard)).await;
        } else {
            // A soft clear over a window: "not found" may be served until
            // the window ends, so the acknowledgement counts from then.
            let window = Duration::from_millis(rng.random_range(0..2_000));
            let Ok(seq) = db.write("c").await else {
                report("e db_write");
                return;
            };
            match cache.clear(ClearMode::Soft { window }).await {
                Ok(()) => report(&format!(
                    "a {seq} {} s",
                    now_us() + window.as_micros() as u64
                )),
                Err(e) => failed("clear", &e),
            }
        }
    }
}

/// A database write, then its announcement to the cache; its
/// acknowledgement is reported with `mode`. (The announcement is built
/// before the write and awaited after it: futures do nothing until polled.)
async fn announce(
    db: &Client,
    request: &str,
    mode: char,
    announcement: impl Future<Output = Result<(), Error>>,
) {
    let Ok(seq) = db.write(request).await else {
        report("e db_write");
        return;
    };
    match announcement.await {
        Ok(()) => report(&format!("a {seq} {} {mode}", now_us())),
        Err(e) => failed("announce", &e),
    }
}

fn report_read(key: u32, began: u64, value: Option<u64>, served: &str) {
    let value = value.map_or_else(|| "-".to_owned(), |v| v.to_string());
    report(&format!("r {key} {began} {value} {served}"));
}

fn failed(call: &str, err: &Error) {
    report(&format!("e {call}:{:?}", err.kind()));
}

//! `breakwater spread`: fix an avalanche that already exists in a live
//! Redis. Keys written together with one TTL expire together; this spreads
//! them out in place.
//!
//! 1. `SCAN` the keys matching a pattern (any keys, not only breakwater's;
//!    `COUNT --batch`, never `KEYS`) and read their `PTTL`, one pipeline per
//!    page.
//! 2. Draw each key's factor `f` in `[1 − j, 1)` from the seed and the key's
//!    name (the same seed gives every key the same draw, in any SCAN order).
//! 3. In batches, at most `--rate` keys a second, one small script per batch
//!    reads each key's TTL *now* and sets it to `max(1, ⌊ttl·f⌋)` ms if that
//!    is shorter, all in one atomic step.
//!
//! # The rule: a TTL is only ever shortened or kept
//!
//! The new TTL is drawn in `[ttl·(1 − j), ttl]`, never past the TTL the key
//! has: spreading over `ttl·(1 ± j)` would keep data longer than whoever
//! wrote it asked for, which a repair tool must not do. The script works
//! from the TTL at the moment of the write, not the one read minutes
//! earlier, so a key whose TTL changed meanwhile (rewritten, refreshed,
//! shortened) still only gets shorter; a key that lost its TTL (`PERSIST`,
//! a plain `SET`) or vanished is left alone. `PEXPIRE key ms LT` would not
//! do: it treats a key without a TTL as an infinitely long one and gives it
//! a TTL.
//!
//! Single node only: on a Redis Cluster, run it once against each primary
//! (a node's `SCAN` sees its own keys only); a cluster node is refused.

use std::collections::HashSet;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use clap::builder::RangedU64ValueParser;
use redis::aio::MultiplexedConnection;

use crate::args::{self, JitterArg};
use crate::failure::{Failure, bad_url, shown, unreachable};
use crate::histogram;
use crate::report::thousands;

/// The examples under `breakwater spread --help`.
pub(crate) const AFTER_HELP: &str = "\
spread takes a --jitter ratio R, as `0.2` or `down:0.2` (0 < R < 1): each key's
TTL becomes a random value between ttl·(1−R) and ttl. A TTL is only ever
shortened or kept, never lengthened. Keys without a TTL are never touched.
Works on one Redis node; for a Redis Cluster run it once per primary.

Example:
  breakwater spread --redis redis://127.0.0.1:6379 --match 'product:*' --jitter 0.2 --dry-run
  breakwater spread --redis redis://127.0.0.1:6379 --match 'product:*' --jitter 0.2 --rate 5000";

/// Reads every key's TTL now and shortens it to `⌊ttl·f⌋` ms (at least 1)
/// when that is shorter. Returns two integers a key: 1 and the new TTL
/// (changed), 0 and the TTL (kept), -1 and 0 (no TTL: left alone), -2 and 0
/// (gone).
const SHORTEN: &str = r"
local out = {}
for i, key in ipairs(KEYS) do
  local ttl = redis.call('PTTL', key)
  if ttl > 0 then
    local new = math.floor(ttl * tonumber(ARGV[i]))
    if new < 1 then new = 1 end
    if new < ttl then
      redis.call('PEXPIRE', key, new)
      out[#out + 1] = 1
      out[#out + 1] = new
    else
      out[#out + 1] = 0
      out[#out + 1] = ttl
    end
  else
    out[#out + 1] = ttl
    out[#out + 1] = 0
  end
end
return out
";

/// Options of `breakwater spread`.
#[derive(Debug, Clone, Args)]
pub(crate) struct SpreadOpts {
    /// Redis URL of one node, e.g. `redis://127.0.0.1:6379` (not a Redis
    /// Cluster: run it once per primary).
    #[arg(long, value_name = "URL")]
    pub(crate) redis: String,
    /// The keys to spread: a SCAN MATCH pattern, e.g. `product:*` (quote it
    /// in the shell).
    #[arg(long = "match", value_name = "PATTERN")]
    pub(crate) pattern: String,
    /// TTL jitter: `0.2` or `ratio:0.2` (±20%), `down:0.2` (−20% to 0),
    /// `±30s` or `fixed:30s`, `up-to:30s` (0 to +30s), or `none`.
    #[arg(long, value_name = "JITTER", value_parser = args::jitter, allow_hyphen_values = true)]
    pub(crate) jitter: JitterArg,
    /// Most keys changed per second (1 to 1,000,000).
    #[arg(long, value_name = "N", default_value_t = 10_000, value_parser = args::rate())]
    pub(crate) rate: u64,
    /// Keys per SCAN page and per write (1 to 10,000).
    #[arg(long, value_name = "N", default_value_t = 500, value_parser = RangedU64ValueParser::<usize>::new().range(1..=10_000))]
    pub(crate) batch: usize,
    /// Change nothing: show the expiries now and what the run would draw.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Seed of the draw (default: a random one, printed); the same seed
    /// draws the same factor for the same key.
    #[arg(long, value_name = "SEED")]
    pub(crate) seed: Option<u64>,
}

/// One key the scan found with a TTL.
#[derive(Debug, Clone)]
struct Found {
    key: Vec<u8>,
    /// Its TTL when read, in ms.
    ttl_ms: u64,
    /// When it expired then, in ms after the run began.
    expires_ms: u64,
}

/// What the scan found.
#[derive(Debug, Default)]
struct Scan {
    with_ttl: Vec<Found>,
    without_ttl: usize,
    gone: usize,
}

/// What the writes did.
#[derive(Debug, Default)]
struct Applied {
    changed: usize,
    kept: usize,
    lost_ttl: usize,
    gone: usize,
    /// The keys' expiries afterwards, in ms after the run began.
    expiries_ms: Vec<u64>,
}

/// Runs `breakwater spread`.
pub(crate) async fn main(opts: SpreadOpts) -> ExitCode {
    crate::failure::finish("spread", run(&opts).await)
}

/// Checks the options, connects, scans, and spreads (or, dry, draws).
async fn run(opts: &SpreadOpts) -> Result<(), Failure> {
    let jitter = shortening(opts.jitter)?;
    if opts.pattern.is_empty() {
        return Err(Failure::usage(
            "--match must not be empty; use '*' for every key",
        ));
    }
    if opts.redis.contains(',') {
        return Err(Failure::usage(
            "--redis names one node; for a Redis Cluster run spread once per primary",
        ));
    }
    let client = redis::Client::open(opts.redis.as_str()).map_err(|e| bad_url(&opts.redis, e))?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(5)))
        .set_response_timeout(Some(Duration::from_secs(10)));
    let mut conn = match client
        .get_multiplexed_async_connection_with_config(&config)
        .await
    {
        Ok(conn) => conn,
        Err(err) => return Err(unreachable(&opts.redis, err).await),
    };
    let info: String = match redis::cmd("INFO")
        .arg("cluster")
        .query_async(&mut conn)
        .await
    {
        Ok(info) => info,
        Err(err) => return Err(unreachable(&opts.redis, err).await),
    };
    if info.contains("cluster_enabled:1") {
        return Err(Failure::usage(format!(
            "{} is a Redis Cluster node; spread works on one node's keys: run it once per primary",
            shown(&opts.redis)
        )));
    }
    let seed = opts.seed.unwrap_or_else(|| rand::random::<u64>() >> 12);
    let began_ms = unix_ms();

    crate::outln!(
        "spread: keys matching {:?} on {}, jitter {}: each TTL becomes {:.0}% to 100% of itself \
         (never longer); at most {} keys/s; seed {seed}",
        opts.pattern,
        shown(&opts.redis),
        jitter,
        (1.0 - jitter) * 100.0,
        thousands(usize::try_from(opts.rate).unwrap_or(usize::MAX)),
    );
    let scan = scan(&mut conn, opts, began_ms)
        .await
        .map_err(|e| Failure::runtime(format!("the scan failed ({e}); nothing was changed")))?;
    crate::outln!(
        "scanned {} keys: {} with a TTL, {} without (left alone), {} gone before they were read",
        thousands(scan.with_ttl.len() + scan.without_ttl + scan.gone),
        thousands(scan.with_ttl.len()),
        thousands(scan.without_ttl),
        thousands(scan.gone),
    );
    let mut before: Vec<u64> = scan.with_ttl.iter().map(|f| f.expires_ms).collect();
    before.sort_unstable();

    let applied = if opts.dry_run {
        dry(&scan, jitter, seed)
    } else {
        apply(&mut conn, &scan, opts, jitter, seed, began_ms).await?
    };
    let mut after = applied.expiries_ms.clone();
    after.sort_unstable();

    crate::outln!();
    crate::out!(
        "{}",
        histogram::render(
            "seconds from the start",
            &[
                ("before", &before),
                (
                    if opts.dry_run {
                        "after (drawn)"
                    } else {
                        "after"
                    },
                    &after
                )
            ],
        )
    );
    let ideal = uniform_ideal(&scan.with_ttl, jitter);
    crate::outln!(
        "busiest second: {} before, {} after; uniform ideal {ideal:.0}/s (every key's new \
         expiry evenly over its own window)",
        thousands(histogram::peak_1s(&before)),
        thousands(histogram::peak_1s(&after)),
    );
    if opts.dry_run {
        crate::outln!(
            "dry run: nothing was changed; {} TTL(s) would be shortened (--seed {seed} draws the same)",
            thousands(applied.changed)
        );
    } else {
        crate::outln!(
            "changed {} TTL(s), kept {} (the draw was not shorter than the TTL by then); left alone \
             {} that lost their TTL and {} that vanished since the scan; {:.1} s",
            thousands(applied.changed),
            thousands(applied.kept),
            thousands(applied.lost_ttl),
            thousands(applied.gone),
            unix_ms().saturating_sub(began_ms) as f64 / 1000.0,
        );
    }
    Ok(())
}

/// The ratio a `--jitter` shortens TTLs by: `R` or `down:R`, with
/// `0 < R < 1`. Any other jitter is a usage error: spread never lengthens a
/// TTL, and draws a factor of it.
fn shortening(jitter: JitterArg) -> Result<f64, Failure> {
    let r = match jitter {
        JitterArg::Number(r) | JitterArg::Down(r) => r,
        JitterArg::Ratio(r) => {
            return Err(Failure::usage(format!(
                "--jitter ratio:{r} would lengthen TTLs too; spread only shortens them: use \
                 --jitter down:{r} (or {r})"
            )));
        }
        other => {
            return Err(Failure::usage(format!(
                "--jitter {other} is not a ratio; spread shortens each TTL by up to a ratio: \
                 use e.g. --jitter 0.2 (or down:0.2)"
            )));
        }
    };
    if r > 0.0 && r < 1.0 {
        Ok(r)
    } else {
        Err(Failure::usage(format!(
            "--jitter must be more than 0 and less than 1, got {r} (0.2 shortens each TTL by up to 20%)"
        )))
    }
}

/// SCANs the matching keys (each once, though SCAN may repeat one) and
/// reads their TTLs, one pipeline per page.
async fn scan(
    conn: &mut MultiplexedConnection,
    opts: &SpreadOpts,
    began_ms: u64,
) -> Result<Scan, redis::RedisError> {
    let spinner = crate::progress::spinner("scanning");
    let mut seen: HashSet<Vec<u8>> = HashSet::new();
    let mut found = Scan::default();
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&opts.pattern)
            .arg("COUNT")
            .arg(opts.batch)
            .query_async(conn)
            .await?;
        let keys: Vec<Vec<u8>> = keys
            .into_iter()
            .filter(|k| seen.insert(k.clone()))
            .collect();
        if !keys.is_empty() {
            let mut pipe = redis::pipe();
            for key in &keys {
                pipe.cmd("PTTL").arg(key);
            }
            let ttls: Vec<i64> = pipe.query_async(conn).await?;
            let read_ms = unix_ms().saturating_sub(began_ms);
            for (key, ttl) in keys.into_iter().zip(ttls) {
                match u64::try_from(ttl) {
                    Ok(ttl_ms) if ttl_ms > 0 => found.with_ttl.push(Found {
                        key,
                        ttl_ms,
                        expires_ms: read_ms + ttl_ms,
                    }),
                    _ if ttl == -1 => found.without_ttl += 1,
                    _ => found.gone += 1,
                }
            }
            spinner.set_message(format!("scanning: {} keys", thousands(seen.len())));
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
    spinner.finish_and_clear();
    Ok(found)
}

/// What the run would do, from the TTLs the scan read.
fn dry(scan: &Scan, jitter: f64, seed: u64) -> Applied {
    let mut applied = Applied::default();
    for f in &scan.with_ttl {
        let new = shortened(f.ttl_ms, factor(seed, &f.key, jitter));
        if new < f.ttl_ms {
            applied.changed += 1;
        } else {
            applied.kept += 1;
        }
        applied.expiries_ms.push(f.expires_ms - f.ttl_ms + new);
    }
    applied
}

/// The script's arithmetic, for the dry run.
fn shortened(ttl_ms: u64, factor: f64) -> u64 {
    ((ttl_ms as f64 * factor).floor() as u64).clamp(1, ttl_ms)
}

/// Shortens the TTLs, `opts.batch` keys a script, at most `opts.rate` keys
/// a second.
async fn apply(
    conn: &mut MultiplexedConnection,
    scan: &Scan,
    opts: &SpreadOpts,
    jitter: f64,
    seed: u64,
    began_ms: u64,
) -> Result<Applied, Failure> {
    let script = redis::Script::new(SHORTEN);
    let progress = crate::progress::bar(scan.with_ttl.len() as u64, "spreading TTLs");
    let started = tokio::time::Instant::now();
    let mut applied = Applied::default();
    let mut done = 0usize;
    for batch in scan.with_ttl.chunks(opts.batch) {
        tokio::time::sleep_until(started + pace(done, opts.rate)).await;
        let mut invocation = script.prepare_invoke();
        for f in batch {
            invocation.key(&f.key[..]);
        }
        for f in batch {
            invocation.arg(factor(seed, &f.key, jitter).to_string());
        }
        let out: Vec<i64> = invocation.invoke_async(conn).await.map_err(|e| {
            Failure::runtime(format!(
                "Redis failed after {} of {} keys ({e}); those keep their new TTLs, run again to \
                 finish (a TTL is only ever shortened)",
                thousands(done),
                thousands(scan.with_ttl.len())
            ))
        })?;
        let wrote_ms = unix_ms().saturating_sub(began_ms);
        for pair in out.chunks(2) {
            let (status, ttl) = (pair[0], u64::try_from(pair.get(1).copied().unwrap_or(0)));
            match (status, ttl) {
                (1, Ok(ttl)) => {
                    applied.changed += 1;
                    applied.expiries_ms.push(wrote_ms + ttl);
                }
                (0, Ok(ttl)) => {
                    applied.kept += 1;
                    applied.expiries_ms.push(wrote_ms + ttl);
                }
                (-1, _) => applied.lost_ttl += 1,
                _ => applied.gone += 1,
            }
        }
        done += batch.len();
        progress.inc(batch.len() as u64);
    }
    progress.finish_and_clear();
    Ok(applied)
}

/// When the batch after `done` keys may start, at `rate` keys a second.
fn pace(done: usize, rate: u64) -> Duration {
    Duration::from_secs_f64(done as f64 / rate.max(1) as f64)
}

/// The key's factor in `[1 − jitter, 1)`, from the seed and the key's name
/// only: FNV-1a over the name, mixed with the seed by SplitMix64.
fn factor(seed: u64, key: &[u8], jitter: f64) -> f64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in key {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let mut z = hash ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    // 53 random bits: uniform in [0, 1).
    let unit = (z >> 11) as f64 / (1u64 << 53) as f64;
    1.0 - jitter * unit
}

/// The busiest second if every key's new expiry fell evenly over its own
/// window `[expiry − ttl·jitter, expiry]`: the peak of the summed densities,
/// by a sweep over the windows' ends. For one TTL, `keys / (ttl·jitter)`.
fn uniform_ideal(found: &[Found], jitter: f64) -> f64 {
    let mut events: Vec<(u64, f64)> = Vec::with_capacity(found.len() * 2);
    for f in found {
        let width_ms = f.ttl_ms as f64 * jitter;
        if width_ms < 1.0 {
            continue;
        }
        let per_second = 1000.0 / width_ms;
        let start = f.expires_ms.saturating_sub(width_ms as u64);
        events.push((start, per_second));
        events.push((f.expires_ms, -per_second));
    }
    // Ends before starts at the same instant: windows are half-open.
    events.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    let (mut now, mut peak) = (0.0f64, 0.0f64);
    for (_, delta) in events {
        now += delta;
        peak = peak.max(now);
    }
    peak
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factors_stay_in_bounds_and_depend_on_seed_and_key_only() {
        let mut sum = 0.0;
        for i in 0..10_000 {
            let key = format!("key:{i}");
            let f = factor(7, key.as_bytes(), 0.2);
            assert!((0.8..1.0).contains(&f), "{f}");
            assert_eq!(f, factor(7, key.as_bytes(), 0.2));
            sum += f;
        }
        // Uniform: the mean is the middle of the range.
        assert!((sum / 10_000.0 - 0.9).abs() < 0.005, "{}", sum / 10_000.0);
        assert_ne!(factor(7, b"a", 0.2), factor(8, b"a", 0.2));
        assert_ne!(factor(7, b"a", 0.2), factor(7, b"b", 0.2));
    }

    #[test]
    fn only_a_downward_ratio_spreads() {
        let ok = |s: &str| shortening(args::jitter(s).unwrap()).ok();
        assert_eq!(ok("0.2"), Some(0.2));
        assert_eq!(ok("down:0.3"), Some(0.3));
        for refused in ["0", "1", "ratio:0.2", "±30s", "up-to:1m", "none"] {
            assert_eq!(ok(refused), None, "{refused}");
        }
    }

    #[test]
    fn a_ttl_is_only_ever_shortened_or_kept() {
        assert_eq!(shortened(1_000, 0.8), 800);
        assert_eq!(shortened(1_000, 0.999_999), 999);
        assert_eq!(shortened(1, 0.8), 1, "never 0: PEXPIRE 0 deletes");
        assert_eq!(shortened(1_000, 1.5), 1_000);
    }

    #[test]
    fn the_ideal_for_one_ttl_is_keys_over_the_window() {
        let found: Vec<Found> = (0..1_000)
            .map(|i| Found {
                key: format!("k{i}").into_bytes(),
                ttl_ms: 300_000,
                expires_ms: 300_000,
            })
            .collect();
        let ideal = uniform_ideal(&found, 0.2);
        assert!((ideal - 1_000.0 / 60.0).abs() < 1e-6, "{ideal}");
        assert_eq!(uniform_ideal(&[], 0.2), 0.0);
    }

    #[test]
    fn pacing_spreads_batches_over_the_rate() {
        assert_eq!(pace(0, 1_000), Duration::ZERO);
        assert_eq!(pace(500, 1_000), Duration::from_millis(500));
        assert_eq!(pace(10_000, 1_000), Duration::from_secs(10));
    }
}

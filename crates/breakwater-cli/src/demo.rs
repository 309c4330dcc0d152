//! `breakwater demo`: cache avalanche, with and without TTL jitter.
//!
//! Two scenarios, each on its own fresh [`MemoryStore`]: the same keys are
//! written in one loop of [`Cache::set`] with the same base TTL, once without
//! jitter and once with [`Jitter::ratio`]. Every key's expiry is then read
//! back from the store (store clock + remaining TTL), and [`expiry_stats`]
//! reports how the expiries spread: first and last, the busiest 1-second
//! window, and a per-second histogram.
//!
//! [`run`] computes the [`Report`]; [`render`] turns it into text, so tests
//! check numbers, not stdout.

use std::fmt;
use std::process::ExitCode;
use std::time::Duration;

use breakwater::{Cache, ConfigError, Error, Jitter, MemoryStore, Store, Value};
use clap::Args;
use clap::builder::RangedU64ValueParser;

/// The widest line [`render`] produces, in columns.
const MAX_WIDTH: usize = 80;
/// Width of a full histogram bar, in cells.
const BAR_CELLS: usize = 48;
/// Histograms with more one-second buckets than this are summarised instead
/// of drawn.
const MAX_HISTOGRAM_ROWS: usize = 30;
/// The slack allowed over a perfectly even spread in the verdict line.
const PEAK_SLACK: f64 = 1.2;

/// Options of `breakwater demo`.
#[derive(Debug, Clone, Args)]
pub(crate) struct DemoOpts {
    /// Number of keys written in each scenario.
    #[arg(
        long,
        default_value_t = 10_000,
        value_parser = RangedU64ValueParser::<usize>::new().range(1..=1_000_000)
    )]
    pub(crate) keys: usize,

    /// Base TTL of every key, in seconds.
    #[arg(
        long,
        default_value_t = 10,
        value_parser = clap::value_parser!(u64).range(1..=86_400)
    )]
    pub(crate) ttl_secs: u64,

    /// Jitter ratio r: each TTL is drawn uniformly from ttl·(1−r) to ttl·(1+r).
    #[arg(long, default_value_t = 0.2, allow_negative_numbers = true)]
    pub(crate) ratio: f64,

    /// Seed for the jitter's random source, for reproducible output.
    #[arg(long)]
    pub(crate) seed: Option<u64>,
}

/// How the expiries of one scenario spread. Times are milliseconds after the
/// write began.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ExpiryStats {
    /// Number of expiries.
    pub(crate) count: usize,
    /// The earliest expiry (0 when there are none).
    pub(crate) first_ms: u64,
    /// The latest expiry (0 when there are none).
    pub(crate) last_ms: u64,
    /// `last_ms − first_ms`.
    pub(crate) spread_ms: u64,
    /// The most expiries in any half-open window `[t, t + 1000 ms)`.
    pub(crate) peak_1s: usize,
    /// The second of the first histogram bucket.
    pub(crate) first_second: u64,
    /// Expirations per second: `per_second[i]` counts the expiries in
    /// `[first_second + i, first_second + i + 1)` seconds. Sums to `count`.
    pub(crate) per_second: Vec<usize>,
}

/// Computes [`ExpiryStats`] over expiry times in milliseconds (any order).
pub(crate) fn expiry_stats(expiries_ms: &[u64]) -> ExpiryStats {
    let mut sorted = expiries_ms.to_vec();
    sorted.sort_unstable();
    let (Some(&first_ms), Some(&last_ms)) = (sorted.first(), sorted.last()) else {
        return ExpiryStats {
            count: 0,
            first_ms: 0,
            last_ms: 0,
            spread_ms: 0,
            peak_1s: 0,
            first_second: 0,
            per_second: Vec::new(),
        };
    };

    // Two pointers: for each expiry `t_j` (the window's last member), `start`
    // is the first expiry with `t_j − t_start < 1000`. The busiest window can
    // always be slid to start at an expiry, so this finds the true peak.
    let mut peak_1s = 0;
    let mut start = 0;
    for (end, &t) in sorted.iter().enumerate() {
        while t - sorted[start] >= 1000 {
            start += 1;
        }
        peak_1s = peak_1s.max(end - start + 1);
    }

    let first_second = first_ms / 1000;
    let buckets = usize::try_from(last_ms / 1000 - first_second).map_or(usize::MAX, |n| n + 1);
    let mut per_second = vec![0; buckets];
    for &t in &sorted {
        // In range: first_second ≤ t / 1000 ≤ last_ms / 1000.
        if let Ok(i) = usize::try_from(t / 1000 - first_second) {
            per_second[i] += 1;
        }
    }

    ExpiryStats {
        count: sorted.len(),
        first_ms,
        last_ms,
        spread_ms: last_ms - first_ms,
        peak_1s,
        first_second,
        per_second,
    }
}

/// One scenario: keys written with one jitter, and how they expire.
#[derive(Debug, Clone)]
pub(crate) struct Scenario {
    /// Row label, e.g. `jitter ±20%`.
    pub(crate) label: String,
    /// The jitter the cache applied to every TTL.
    pub(crate) jitter: Jitter,
    /// How long the write loop took on the store's clock, in ms.
    pub(crate) write_ms: u64,
    /// The expiries read back from the store.
    pub(crate) stats: ExpiryStats,
}

/// Everything `breakwater demo` prints, as data.
#[derive(Debug, Clone)]
pub(crate) struct Report {
    /// Keys written per scenario.
    pub(crate) keys: usize,
    /// The base TTL.
    pub(crate) ttl: Duration,
    /// The jitter ratio of the jittered scenario.
    pub(crate) ratio: f64,
    /// The seed, if one was given.
    pub(crate) seed: Option<u64>,
    /// The scenario without jitter.
    pub(crate) plain: Scenario,
    /// The scenario with `Jitter::ratio(ratio)`.
    pub(crate) jittered: Scenario,
}

impl Report {
    /// The average expirations per second if the jittered TTLs spread evenly
    /// over the jitter's range ([`Jitter::bounds`]). `None` when the range is
    /// empty (a zero ratio).
    pub(crate) fn theoretical_per_second(&self) -> Option<f64> {
        let (low, high) = self.jittered.jitter.bounds(self.ttl);
        let range_s = (high - low).as_secs_f64();
        (range_s > 0.0).then(|| self.keys as f64 / range_s)
    }

    /// `keys / spread × 1.2` for the jittered run: what the busiest second may
    /// hold if the spread is roughly even. A spread below 1 ms counts as 1 ms.
    pub(crate) fn peak_bound(&self) -> f64 {
        let spread_s = self.jittered.stats.spread_ms.max(1) as f64 / 1000.0;
        self.keys as f64 / spread_s * PEAK_SLACK
    }

    /// `true` if the jittered run's peak is within [`Report::peak_bound`].
    pub(crate) fn peak_within_bound(&self) -> bool {
        self.jittered.stats.peak_1s as f64 <= self.peak_bound()
    }
}

/// Why the demo could not run.
#[derive(Debug)]
pub(crate) enum DemoError {
    /// An option was rejected by the library (exit code 2).
    Config(ConfigError),
    /// The cache or store failed (exit code 1).
    Cache(Error),
    /// A key expired before its TTL was read back, because writing all keys
    /// took longer than the shortest TTL (exit code 1).
    Expired {
        /// The user key that was gone.
        key: String,
        /// How long the write loop took, in ms.
        write_ms: u64,
    },
}

impl fmt::Display for DemoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DemoError::Config(err) => fmt::Display::fmt(err, f),
            DemoError::Cache(err) => fmt::Display::fmt(err, f),
            DemoError::Expired { key, write_ms } => write!(
                f,
                "{key} expired before its TTL was read back (writing took {write_ms} ms); \
                 use fewer --keys or a longer --ttl-secs"
            ),
        }
    }
}

impl From<ConfigError> for DemoError {
    fn from(err: ConfigError) -> Self {
        DemoError::Config(err)
    }
}

impl From<Error> for DemoError {
    fn from(err: Error) -> Self {
        DemoError::Cache(err)
    }
}

/// Runs `breakwater demo`: prints the report, or the error on stderr.
pub(crate) async fn main(opts: DemoOpts) -> ExitCode {
    match run(&opts).await {
        Ok(report) => {
            print!("{}", render(&report));
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("error: {err}");
            match err {
                DemoError::Config(_) => ExitCode::from(2),
                DemoError::Cache(_) | DemoError::Expired { .. } => ExitCode::FAILURE,
            }
        }
    }
}

/// Runs both scenarios and collects the [`Report`].
///
/// Both caches are built before anything is written, so an invalid option
/// (e.g. `--ratio 1.5`) is reported up front.
///
/// # Errors
///
/// [`DemoError::Config`] for an option the library rejects,
/// [`DemoError::Cache`] if a write or TTL read fails, [`DemoError::Expired`]
/// if writing took longer than the shortest TTL.
pub(crate) async fn run(opts: &DemoOpts) -> Result<Report, DemoError> {
    let ttl = Duration::from_secs(opts.ttl_secs);
    let jitter = Jitter::ratio(opts.ratio);
    let (plain_cache, plain_store) = build(ttl, Jitter::none(), opts.seed)?;
    let (jittered_cache, jittered_store) = build(ttl, jitter, opts.seed)?;

    let plain = scenario(
        "no jitter".to_owned(),
        Jitter::none(),
        &plain_cache,
        &plain_store,
        opts.keys,
    )
    .await?;
    let jittered = scenario(
        format!("jitter {jitter}"),
        jitter,
        &jittered_cache,
        &jittered_store,
        opts.keys,
    )
    .await?;

    Ok(Report {
        keys: opts.keys,
        ttl,
        ratio: opts.ratio,
        seed: opts.seed,
        plain,
        jittered,
    })
}

/// A cache with `jitter` on its own fresh memory store.
fn build(
    ttl: Duration,
    jitter: Jitter,
    seed: Option<u64>,
) -> Result<(Cache<u64>, MemoryStore), ConfigError> {
    let store = MemoryStore::new();
    let mut builder = Cache::<u64>::builder()
        .namespace("demo")
        .store(store.clone())
        .ttl(ttl)
        .jitter(jitter);
    if let Some(seed) = seed {
        builder = builder.rng_seed(seed);
    }
    Ok((builder.build()?, store))
}

/// The user key of the `i`-th demo key.
fn demo_key(i: usize) -> String {
    format!("key:{i}")
}

/// Writes `keys` keys at once, then reads every key's expiry back from the
/// store.
async fn scenario(
    label: String,
    jitter: Jitter,
    cache: &Cache<u64>,
    store: &MemoryStore,
    keys: usize,
) -> Result<Scenario, DemoError> {
    let start_ms = store.now_ms();
    for i in 0..keys {
        cache.set(demo_key(i), &(i as u64)).await?;
    }
    let write_ms = store.now_ms() - start_ms;

    let mut expiries = Vec::with_capacity(keys);
    for i in 0..keys {
        let Some(at) = expiry_ms(cache, store, &demo_key(i), start_ms).await? else {
            return Err(DemoError::Expired {
                key: demo_key(i),
                write_ms,
            });
        };
        expiries.push(at);
    }

    Ok(Scenario {
        label,
        jitter,
        write_ms,
        stats: expiry_stats(&expiries),
    })
}

/// When `key` expires in `store`, in ms after `since_ms` on the store's
/// clock (its TTL left, rounded up to whole ms); `None` if it is gone.
pub(crate) async fn expiry_ms<V: Value>(
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

/// `n` with thousands separators: `10,000`.
fn count(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `ms` as seconds with millisecond precision: `10.000 s`.
fn secs(ms: u64) -> String {
    format!("{}.{:03} s", ms / 1000, ms % 1000)
}

/// A per-second rate: whole and grouped (rounded with `whole`) from 100 up,
/// else with two decimals.
fn rate(x: f64, whole: fn(f64) -> f64) -> String {
    if x >= 100.0 {
        count(whole(x) as usize)
    } else {
        format!("{x:.2}")
    }
}

/// A horizontal bar of `value / max` × [`BAR_CELLS`] cells, in eighths.
fn bar(value: usize, max: usize) -> String {
    const PARTIAL: [char; 8] = [' ', '▏', '▎', '▍', '▌', '▋', '▊', '▉'];
    if value == 0 || max == 0 {
        return String::new();
    }
    let eighths = (value * BAR_CELLS * 8).div_ceil(max).max(1);
    let mut out = "█".repeat(eighths / 8);
    if !eighths.is_multiple_of(8) {
        out.push(PARTIAL[eighths % 8]);
    }
    out
}

/// Greedy word wrap to `width` columns, each line prefixed by `indent`.
fn wrap(text: &str, width: usize, indent: &str) -> String {
    let mut out = String::new();
    let mut line = String::from(indent);
    for word in text.split_whitespace() {
        let fits = line.chars().count() + 1 + word.chars().count() <= width;
        if line.len() > indent.len() && !fits {
            out.push_str(line.trim_end());
            out.push('\n');
            line = String::from(indent);
        }
        if line.len() > indent.len() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if line.len() > indent.len() {
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// The report as text, every line at most [`MAX_WIDTH`] columns.
pub(crate) fn render(report: &Report) -> String {
    use std::fmt::Write as _;

    let mut out = String::new();
    let ttl_s = report.ttl.as_secs();
    let (plain, jittered) = (&report.plain, &report.jittered);
    let _ = writeln!(
        out,
        "breakwater demo — {} keys written at once, TTL {ttl_s} s, memory store",
        count(report.keys)
    );
    let seed = report
        .seed
        .map_or_else(|| "random seed".to_owned(), |s| format!("seed {s}"));
    let _ = writeln!(
        out,
        "times are after the write began; writing took {} ms and {} ms; {seed}",
        plain.write_ms, jittered.write_ms
    );
    out.push('\n');

    let _ = writeln!(
        out,
        "{:<14} {:>14} {:>14} {:>12} {:>16}",
        "", "first expiry", "last expiry", "spread", "peak in any 1 s"
    );
    for s in [plain, jittered] {
        let _ = writeln!(
            out,
            "{:<14} {:>14} {:>14} {:>12} {:>16}",
            s.label,
            secs(s.stats.first_ms),
            secs(s.stats.last_ms),
            secs(s.stats.spread_ms),
            count(s.stats.peak_1s)
        );
    }
    out.push('\n');

    let stats = &jittered.stats;
    let _ = writeln!(out, "expirations per second ({})", jittered.label);
    if stats.per_second.len() > MAX_HISTOGRAM_ROWS {
        let (busiest, n) = stats
            .per_second
            .iter()
            .enumerate()
            .max_by_key(|&(i, n)| (*n, std::cmp::Reverse(i)))
            .map_or((0, 0), |(i, n)| (i, *n));
        let _ = writeln!(
            out,
            "  {} one-second buckets, too many to draw; the busiest, {} s, holds {}",
            count(stats.per_second.len()),
            stats.first_second + busiest as u64,
            count(n)
        );
    } else {
        let max = stats.per_second.iter().copied().max().unwrap_or(0);
        let last_second = stats.first_second + stats.per_second.len() as u64;
        let label_width = last_second.to_string().len().max(2);
        for (i, &n) in stats.per_second.iter().enumerate() {
            let second = stats.first_second + i as u64;
            let _ = writeln!(
                out,
                "  {second:>label_width$} s │{} {}",
                bar(n, max),
                count(n)
            );
        }
    }
    out.push('\n');

    let (low, high) = jittered.jitter.bounds(report.ttl);
    let range = format!(
        "{}–{}",
        secs(low.as_millis() as u64).trim_end_matches(" s"),
        secs(high.as_millis() as u64)
    );
    match report.theoretical_per_second() {
        Some(avg) => {
            let _ = writeln!(
                out,
                "theory: {} draws each TTL from {range}, on average",
                jittered.jitter
            );
            let _ = writeln!(
                out,
                "        {} / (2·{}·{ttl_s} s) = {} expirations per second",
                count(report.keys),
                report.ratio,
                rate(avg, f64::round)
            );
        }
        None => {
            let _ = writeln!(out, "theory: ratio 0 spreads nothing; every TTL is {range}");
        }
    }
    let _ = writeln!(
        out,
        "check:  peak ≤ keys/spread × 1.2: {} ({} vs {} / {} × 1.2 = {})",
        if report.peak_within_bound() {
            "yes"
        } else {
            "no"
        },
        count(stats.peak_1s),
        count(report.keys),
        secs(stats.spread_ms.max(1)),
        rate(report.peak_bound(), f64::floor)
    );
    out.push('\n');

    let explanation = format!(
        "Without jitter every key written together expires in the same second, \
         and again one TTL after it is reloaded: a cache avalanche that sends the \
         whole wave to the database at once. Jitter spreads that wave over {range}, \
         but it cannot save one hot key: when it expires, all its readers miss \
         together (a stampede). That is the job of single-flight and leases, \
         coming with the stampede protection."
    );
    out.push_str(&wrap(&explanation, MAX_WIDTH - 2, ""));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(keys: usize, ratio: f64, seed: u64) -> DemoOpts {
        DemoOpts {
            keys,
            ttl_secs: 10,
            ratio,
            seed: Some(seed),
        }
    }

    #[test]
    fn peak_of_identical_times_is_n() {
        let stats = expiry_stats(&[10_000; 500]);
        assert_eq!(stats.peak_1s, 500);
        assert_eq!(stats.spread_ms, 0);
        assert_eq!((stats.first_ms, stats.last_ms), (10_000, 10_000));
        assert_eq!(stats.per_second, vec![500]);
        assert_eq!(stats.first_second, 10);
    }

    #[test]
    fn peak_of_evenly_spaced_times() {
        // Every 100 ms for 10 s: any 1 s window holds exactly 10.
        let times: Vec<u64> = (0..100).map(|i| 5_000 + i * 100).collect();
        let stats = expiry_stats(&times);
        assert_eq!(stats.peak_1s, 10);
        assert_eq!(stats.spread_ms, 9_900);
        assert_eq!(stats.per_second, vec![10; 10]);

        // Every 250 ms, shuffled: 4 per window.
        let mut times: Vec<u64> = (0..40).map(|i| i * 250).collect();
        times.reverse();
        assert_eq!(expiry_stats(&times).peak_1s, 4);
    }

    #[test]
    fn window_is_half_open() {
        assert_eq!(expiry_stats(&[0, 1_000]).peak_1s, 1);
        assert_eq!(expiry_stats(&[0, 999]).peak_1s, 2);
        assert_eq!(expiry_stats(&[0, 999, 1_000, 1_998]).peak_1s, 3);
        // Not aligned to whole seconds: 500..1499 is one window.
        assert_eq!(expiry_stats(&[500, 900, 1_200, 1_499, 1_500]).peak_1s, 4);
    }

    #[test]
    fn empty_input() {
        let stats = expiry_stats(&[]);
        assert_eq!(stats.count, 0);
        assert_eq!(stats.peak_1s, 0);
        assert_eq!(stats.spread_ms, 0);
        assert!(stats.per_second.is_empty());
    }

    #[test]
    fn histogram_sums_to_n() {
        // A small LCG: scattered times over ~7 s.
        let mut x: u64 = 12_345;
        let times: Vec<u64> = (0..5_000)
            .map(|_| {
                x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                8_000 + (x >> 33) % 7_000
            })
            .collect();
        let stats = expiry_stats(&times);
        assert_eq!(stats.per_second.iter().sum::<usize>(), 5_000);
        assert_eq!(stats.count, 5_000);
        assert_eq!(stats.first_second, stats.first_ms / 1000);
        assert_eq!(
            stats.per_second.len() as u64,
            stats.last_ms / 1000 - stats.first_ms / 1000 + 1
        );
        assert!(stats.peak_1s >= *stats.per_second.iter().max().unwrap());
    }

    #[test]
    fn formatting_helpers() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1_000), "1,000");
        assert_eq!(count(10_000), "10,000");
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(secs(10_000), "10.000 s");
        assert_eq!(secs(8_007), "8.007 s");
        assert_eq!(bar(0, 10), "");
        assert_eq!(bar(10, 10).chars().count(), BAR_CELLS);
        assert_eq!(bar(1, 1_000_000), "▏");
        assert_eq!(rate(2_952.6, f64::floor), "2,952");
        assert_eq!(rate(2_499.6, f64::round), "2,500");
        assert_eq!(rate(0.0347, f64::floor), "0.03");
    }

    // Paused clock: the write loop takes no time, so "at once" is exact.
    #[tokio::test(start_paused = true)]
    async fn demo_spreads_10_000_keys() {
        let report = run(&opts(10_000, 0.2, 42)).await.unwrap();

        let plain = &report.plain.stats;
        assert_eq!(plain.count, 10_000);
        assert_eq!(plain.peak_1s, 10_000);
        assert_eq!((plain.first_ms, plain.last_ms), (10_000, 10_000));

        let jittered = &report.jittered.stats;
        assert_eq!(jittered.count, 10_000);
        assert!(jittered.peak_1s <= 3_000, "peak {}", jittered.peak_1s);
        assert!(
            (3_900..=4_000).contains(&jittered.spread_ms),
            "spread {} ms",
            jittered.spread_ms
        );
        assert!(jittered.first_ms >= 8_000 && jittered.last_ms <= 12_000);
        assert_eq!(jittered.per_second.iter().sum::<usize>(), 10_000);
        assert!(report.peak_within_bound());
        assert_eq!(
            report.theoretical_per_second().map(f64::round),
            Some(2_500.0)
        );
        assert_eq!(report.jittered.label, "jitter ±20%");

        for line in render(&report).lines() {
            assert!(line.chars().count() <= MAX_WIDTH, "too wide: {line:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn same_seed_same_report() {
        let a = run(&opts(1_000, 0.2, 7)).await.unwrap();
        let b = run(&opts(1_000, 0.2, 7)).await.unwrap();
        assert_eq!(a.jittered.stats, b.jittered.stats);
    }

    #[tokio::test(start_paused = true)]
    async fn zero_ratio_renders() {
        let report = run(&opts(100, 0.0, 1)).await.unwrap();
        assert_eq!(report.jittered.stats.peak_1s, 100);
        assert_eq!(report.theoretical_per_second(), None);
        assert!(render(&report).contains("peak ≤ keys/spread × 1.2: yes"));
    }

    #[tokio::test]
    async fn bad_ratio_is_a_config_error() {
        let err = run(&opts(10, 1.5, 1)).await.unwrap_err();
        let DemoError::Config(config) = &err else {
            panic!("expected a config error, got {err:?}");
        };
        assert_eq!(config.message(), "jitter ratio must be in 0..=1, got 1.5");
        assert_eq!(err.to_string(), "jitter ratio must be in 0..=1, got 1.5");
    }
}

//! `breakwater demo`: three stories, a naive cache next to breakwater, each
//! run through the library on the embedded memory store against a
//! simulated database, on a paused (virtual) clock: minutes of traffic take
//! a moment, and every figure is measured from the run, the same on any
//! machine for the same seed.
//!
//! 1. **avalanche**: 100,000 keys bulk-loaded with one TTL. Every key is
//!    busy, so each one is read again in the second after the store says it
//!    expired: one database query per expiry.
//! 2. **stampede**: one hot key, 2,000 requests/s, a 200 ms query.
//! 3. **outage**: the database fails for 30 s under steady traffic.
//!
//! Each story prints a table and writes a chart (PNG and SVG) of the
//! database's queries per second on a log scale; the outage's chart has a
//! second panel of the errors and stale values the requests met each
//! second.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use breakwater_cache::{
    BreakerConfig, BreakerState, EarlyRefresh, Error, Jitter, LimitConfig, MemoryStore, Origin,
};
use clap::Args;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::chart::{self, Chart, Event, Line, Panel};
use crate::db::{self, Database};
use crate::failure::Failure;
use crate::report::{ms, stats_line, thousands};
use crate::traffic::{self, Client, Expiries, Tally, Workload};

/// Options of `breakwater demo`.
#[derive(Debug, Clone, Args)]
pub(crate) struct DemoOpts {
    /// Seed of the jitter and of the request draws; drawn at random (and
    /// printed) when not given, so any run can be replayed.
    #[arg(long, value_name = "SEED")]
    pub(crate) seed: Option<u64>,

    /// Directory the charts are written to (created if missing).
    #[arg(long, value_name = "DIR", default_value = "breakwater-demo")]
    pub(crate) out: PathBuf,
}

/// One strategy's figures in a story.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    /// `naive`, `breakwater`, ...
    pub(crate) name: String,
    /// Database queries started in each second.
    pub(crate) per_second: Vec<usize>,
    /// Database queries in all (failed ones included).
    pub(crate) queries: usize,
    /// What the requests met.
    pub(crate) tally: Tally,
}

impl Row {
    /// Measures `db` and `tally` over `seconds`.
    fn new(name: &str, db: &Database, tally: Tally, seconds: usize) -> Self {
        let started = db.started_ms();
        Row {
            name: name.to_owned(),
            per_second: db::per_second(&started, seconds),
            queries: started.len(),
            tally,
        }
    }

    /// The most queries started in one whole second.
    pub(crate) fn peak(&self) -> usize {
        self.per_second.iter().copied().max().unwrap_or(0)
    }
}

/// One story: its rows, the events on its clock and what it measured.
#[derive(Debug, Clone)]
pub(crate) struct Story {
    /// File name of its chart, e.g. `avalanche`.
    pub(crate) name: &'static str,
    /// Heading and chart caption.
    pub(crate) title: String,
    /// What was simulated, one line.
    pub(crate) setup: String,
    /// One row per strategy.
    pub(crate) rows: Vec<Row>,
    /// Marked on the chart.
    pub(crate) events: Vec<Event>,
    /// Lines printed under the table.
    pub(crate) notes: Vec<String>,
    /// Whether its chart also shows failed requests and stale values per
    /// second (the outage).
    pub(crate) served: bool,
}

/// A story, run with a seed.
type StoryFn = fn(u64) -> Result<Story, Error>;

/// Runs `breakwater demo`.
pub(crate) async fn main(opts: DemoOpts) -> ExitCode {
    let seed = opts.seed.unwrap_or_else(rand::random);
    crate::outln!(
        "breakwater demo — seed {seed} (replay with --seed {seed}); embedded memory store, \
         virtual clock"
    );
    let stories: [(&str, StoryFn); 3] = [
        ("avalanche", avalanche),
        ("stampede", stampede),
        ("outage", outage),
    ];
    for (i, (name, story)) in stories.into_iter().enumerate() {
        let spinner = crate::progress::spinner(&format!("{name} story"));
        let ran = traffic::off_thread(move || story(seed)).await;
        spinner.finish_and_clear();
        let Some(result) = ran else {
            return Failure::runtime(format!("the {name} story panicked")).exit("demo");
        };
        let done = result
            .map_err(Failure::from)
            .and_then(|story| show(i + 1, &story, &opts));
        if let Err(failure) = done {
            return failure.exit("demo");
        }
    }
    ExitCode::SUCCESS
}

/// Prints `story` and writes its chart.
fn show(number: usize, story: &Story, opts: &DemoOpts) -> Result<(), Failure> {
    let panicked: usize = story.rows.iter().map(|row| row.tally.panicked).sum();
    if panicked > 0 {
        return Err(Failure::runtime(format!(
            "{panicked} request(s) of the {} story panicked",
            story.name
        )));
    }
    crate::out!("\n{number}. {}", render(story));
    let [png, svg] = chart::write(&chart_of(story), &opts.out, story.name)?;
    crate::outln!("chart: {} and {}", png.display(), svg.display());
    Ok(())
}

/// The story's chart: database queries per second, one series per
/// strategy; for a story that shows what was served, a second panel of
/// failed requests and stale values per second.
pub(crate) fn chart_of(story: &Story) -> Chart {
    let queries = story
        .rows
        .iter()
        .map(|row| Line {
            name: row.name.clone(),
            per_second: row.per_second.clone(),
        })
        .collect();
    let mut chart = Chart::queries(story.title.clone(), queries, story.events.clone());
    if story.served {
        let mut lines = Vec::new();
        // Over the queries' seconds, zeros included.
        let fit = |counts: &[usize], row: &Row| {
            let mut counts = counts.to_vec();
            counts.resize(row.per_second.len(), 0);
            counts
        };
        for row in &story.rows {
            lines.push(Line {
                name: format!("{}: errors", row.name),
                per_second: fit(&row.tally.errors_per_second, row),
            });
        }
        for row in story.rows.iter().filter(|row| row.tally.stale > 0) {
            lines.push(Line {
                name: format!("{}: stale values", row.name),
                per_second: fit(&row.tally.stale_per_second, row),
            });
        }
        chart.panels.push(Panel {
            y_desc: "requests per second: errors, stale values".to_owned(),
            lines,
        });
    }
    chart
}

/// The story as text: heading, table, notes.
pub(crate) fn render(story: &Story) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}\n   {}\n", story.title, story.setup);
    let _ = writeln!(
        out,
        "{:<18} {:>10} {:>8} {:>9} {:>9} {:>7} {:>7} {:>7}",
        "", "db peak/s", "queries", "p50 ms", "p99 ms", "errors", "stale", "waited"
    );
    for row in &story.rows {
        let t = &row.tally;
        let _ = writeln!(
            out,
            "{:<18} {:>10} {:>8} {:>9} {:>9} {:>7} {:>7} {:>7}",
            row.name,
            thousands(row.peak()),
            thousands(row.queries),
            ms(t.quantile_ms(0.5)),
            ms(t.quantile_ms(0.99)),
            thousands(t.errors),
            thousands(t.stale),
            thousands(t.waited())
        );
    }
    let _ = writeln!(
        out,
        "(db peak/s: most queries started in one second; latencies of the requests on the\n \
         virtual clock; waited: requests not answered at once)"
    );
    for row in &story.rows {
        if let Some(stats) = &row.tally.stats {
            let _ = writeln!(out, "{} stats(): {}", row.name, stats_line(stats));
        }
    }
    for note in &story.notes {
        let _ = writeln!(out, "{note}");
    }
    out
}

/// 1. Avalanche: 100,000 keys bulk-loaded with TTL 300 s, without jitter and
///    with `Jitter::ratio(0.2)`.
fn avalanche(seed: u64) -> Result<Story, Error> {
    const KEYS: usize = 100_000;
    const TTL: Duration = Duration::from_secs(300);
    const SECONDS: u64 = 400;
    let jitter = Jitter::ratio(0.2);
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for (name, jitter) in [("naive", None), ("breakwater", Some(jitter))] {
        let (row, expiries) = traffic::paused_runtime().block_on(async {
            let store = MemoryStore::new();
            let db = Arc::new(Database::new(Duration::from_millis(5)).with_capacity(200));
            let client = match jitter {
                None => Client::Naive { store, ttl: TTL },
                Some(jitter) => Client::Breakwater(
                    traffic::builder(&store, jitter, seed)
                        .ttl(TTL)
                        .early_refresh(EarlyRefresh::none())
                        .build()?,
                ),
            };
            client.preload(KEYS).await?;
            let expiries = client.expiries_ms(KEYS).await?;
            // Each key is read in the first whole second after it expired.
            let mut due: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
            for (key, at) in expiries.iter().enumerate() {
                if let Some(at) = at {
                    due.entry(at.div_ceil(1000)).or_default().push(key);
                }
            }
            let began = Instant::now();
            let mut tasks = JoinSet::new();
            let mut tally = Tally::since(began);
            for (second, keys) in due.range(..SECONDS) {
                tokio::time::sleep_until(began + Duration::from_secs(*second)).await;
                for key in keys.iter().copied() {
                    let (client, db) = (client.clone(), Arc::clone(&db));
                    tasks.spawn(async move { client.request(key, &db).await });
                }
                while let Some(done) = tasks.try_join_next() {
                    tally.record(done);
                }
            }
            while let Some(done) = tasks.join_next().await {
                tally.record(done);
            }
            tally.latencies_us.sort_unstable();
            if let Client::Breakwater(cache) = &client {
                tally.stats = Some(cache.stats());
            }
            let expiries: Vec<u64> = expiries.into_iter().flatten().collect();
            let row = Row::new(name, &db, tally, SECONDS as usize);
            Ok::<_, Error>((row, Expiries::of(&expiries)))
        })?;
        let how = match jitter {
            None => "no jitter".to_owned(),
            Some(jitter) => format!("jitter {jitter}"),
        };
        notes.push(format!(
            "{name} ({how}): {} keys expire {}",
            thousands(expiries.count),
            expiries.describe()
        ));
        rows.push(row);
    }
    let (low, high) = jitter.bounds(TTL);
    let even = KEYS as f64 / (high - low).as_secs_f64();
    let bw_peak = rows[1].peak();
    notes.push(format!(
        "check on the virtual clock: breakwater's busiest second of queries, {}, is {} \
         1.2 × the even spread ({} / {} s = {}/s) = {}",
        thousands(bw_peak),
        if bw_peak as f64 <= 1.2 * even {
            "within"
        } else {
            "ABOVE"
        },
        thousands(KEYS),
        (high - low).as_secs(),
        thousands(even.round() as usize),
        thousands((1.2 * even).round() as usize)
    ));
    Ok(Story {
        name: "avalanche",
        title: "avalanche: 100,000 keys written together, TTL 300 s".to_owned(),
        setup: "every key is busy, so each expiry is one database query (5 ms; the database \
                slows down past 200 at once)"
            .to_owned(),
        rows,
        events: vec![Event {
            at_s: TTL.as_secs_f64(),
            label: "TTL 300 s".to_owned(),
        }],
        notes,
        served: false,
    })
}

/// 2. Stampede: one hot key at 2,000 requests/s, a 200 ms query, TTL 10 s.
fn stampede(seed: u64) -> Result<Story, Error> {
    const TTL: Duration = Duration::from_secs(10);
    let load = Workload {
        keys: 1,
        rps: 2_000,
        duration: Duration::from_secs(32),
        zipf: 0.0,
        seed,
    };
    let seconds = load.duration.as_secs() as usize + 1;
    let strategies = [
        ("naive", None),
        ("breakwater", Some(Duration::ZERO)),
        ("breakwater + grace", Some(Duration::from_secs(5))),
    ];
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for (name, grace) in strategies {
        let (row, refreshes) = traffic::paused_runtime().block_on(async {
            let store = MemoryStore::new();
            let db = Arc::new(Database::new(Duration::from_millis(200)));
            let client = match grace {
                None => Client::Naive { store, ttl: TTL },
                Some(grace) => {
                    let builder = traffic::builder(&store, Jitter::none(), seed)
                        .ttl(TTL)
                        .grace(grace);
                    // Without grace, no early refresh either: the plain
                    // single-flight case, where callers wait for the load.
                    let builder = if grace.is_zero() {
                        builder.early_refresh(EarlyRefresh::none())
                    } else {
                        builder
                    };
                    Client::Breakwater(builder.build()?)
                }
            };
            client.preload(1).await?;
            let tally = traffic::run(&client, &db, &load, None).await;
            let refreshes = bursts(&db.started_ms());
            Ok::<_, Error>((Row::new(name, &db, tally, seconds), refreshes))
        })?;
        let per_refresh = row.queries as f64 / refreshes.max(1) as f64;
        let waited = row.tally.waited();
        let per_waiter = if waited == 0 {
            String::new()
        } else {
            format!(
                " (1 query per {:.1} waiting requests)",
                waited as f64 / row.queries.max(1) as f64
            )
        };
        notes.push(format!(
            "{name}: {refreshes} refreshes, {per_refresh:.1} queries each; {} requests waited \
             for the database, {} queries ran{per_waiter}",
            thousands(waited),
            thousands(row.queries),
        ));
        rows.push(row);
    }
    let events = vec![Event {
        at_s: TTL.as_secs_f64(),
        label: "first expiry (TTL 10 s)".to_owned(),
    }];
    Ok(Story {
        name: "stampede",
        title: "stampede: one hot key, 2,000 requests/s, 200 ms query, TTL 10 s".to_owned(),
        setup: "naive: every request that misses queries; breakwater: one load per refresh; \
                + grace: stale-while-revalidate and early refresh"
            .to_owned(),
        rows,
        events,
        notes,
        served: false,
    })
}

/// Groups query start times into refreshes: bursts separated by more than
/// a second without a query.
fn bursts(started_ms: &[u64]) -> usize {
    let mut sorted = started_ms.to_vec();
    sorted.sort_unstable();
    let gaps = sorted.windows(2).filter(|w| w[1] - w[0] > 1_000).count();
    if sorted.is_empty() { 0 } else { gaps + 1 }
}

/// 3. Outage: the database fails from 30 s to 60 s under 2,000 requests/s
///    over 1,000 keys.
fn outage(seed: u64) -> Result<Story, Error> {
    const KEYS: usize = 1_000;
    const TTL: Duration = Duration::from_secs(10);
    const OUTAGE: (Duration, Duration) = (Duration::from_secs(30), Duration::from_secs(30));
    let load = Workload {
        keys: KEYS,
        rps: 2_000,
        duration: Duration::from_secs(90),
        zipf: 1.0,
        seed,
    };
    let seconds = load.duration.as_secs() as usize;
    let mut rows = Vec::new();
    let mut events = vec![
        Event {
            at_s: OUTAGE.0.as_secs_f64(),
            label: "database down".to_owned(),
        },
        Event {
            at_s: (OUTAGE.0 + OUTAGE.1).as_secs_f64(),
            label: "database back".to_owned(),
        },
    ];
    let mut notes = Vec::new();
    for name in ["naive", "breakwater"] {
        let (row, failed, transitions) = traffic::paused_runtime().block_on(async {
            let store = MemoryStore::new();
            let db = Arc::new(
                Database::new(Duration::from_millis(50))
                    .with_capacity(40)
                    .with_outage(OUTAGE.0, OUTAGE.1),
            );
            let origin = Origin::builder("database")
                .breaker(
                    BreakerConfig::new()
                        .consecutive_failures(5)
                        .cool_down(Duration::from_secs(5)),
                )
                .limit(LimitConfig::new().max_concurrent(16))
                .rng_seed(seed)
                .build()?;
            let client = if name == "naive" {
                Client::Naive { store, ttl: TTL }
            } else {
                Client::Breakwater(
                    traffic::builder(&store, Jitter::ratio(0.2), seed)
                        .ttl(TTL)
                        .grace(Duration::from_secs(5))
                        .max_stale(Duration::from_secs(120))
                        .origin(origin.clone())
                        .build()?,
                )
            };
            client.preload(KEYS).await?;
            let transitions = Arc::default();
            let watch = tokio::spawn(watch_breaker(origin, Arc::clone(&transitions)));
            let tally = traffic::run(&client, &db, &load, None).await;
            watch.abort();
            let transitions = std::mem::take(&mut *lock(&transitions));
            let row = Row::new(name, &db, tally, seconds);
            Ok::<_, Error>((row, db.failed(), transitions))
        })?;
        if name == "breakwater" {
            // Counted by the breaker itself (polling would miss a probe
            // that failed at once); the times are polled, every 10 ms.
            let opened = row
                .tally
                .stats
                .as_ref()
                .map_or(0, |stats| stats.origin_breaker_openings);
            let first_open = transitions
                .iter()
                .find(|(_, state)| *state == BreakerState::Open);
            let closed = transitions
                .iter()
                .rev()
                .find(|(_, state)| *state == BreakerState::Closed);
            if let Some((at, _)) = first_open {
                events.push(Event {
                    at_s: *at,
                    label: "breaker opens".to_owned(),
                });
            }
            if let Some((at, _)) = closed {
                events.push(Event {
                    at_s: *at,
                    label: "breaker closes".to_owned(),
                });
            }
            let at = |t: Option<&(f64, BreakerState)>| {
                t.map_or_else(|| "never".to_owned(), |(s, _)| format!("at {s:.1} s"))
            };
            notes.push(format!(
                "breakwater's breaker: opened {} (then {opened} openings in all, as half-open \
                 probes failed), closed {}",
                at(first_open),
                at(closed)
            ));
            let back = usize::try_from((OUTAGE.0 + OUTAGE.1).as_secs()).unwrap_or(usize::MAX);
            let recovery = row
                .per_second
                .get(back..seconds.min(back + 10))
                .unwrap_or_default();
            notes.push(format!(
                "recovery (bulkhead: 16 loads at once): queries/s from {back} s: {}",
                recovery
                    .iter()
                    .map(|n| thousands(*n))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        notes.push(format!(
            "{name}: {} queries sent to the database while it was down; {} requests failed",
            thousands(failed),
            thousands(row.tally.errors)
        ));
        rows.push(row);
    }
    Ok(Story {
        name: "outage",
        title: "outage: the database fails from 30 s to 60 s".to_owned(),
        setup: "2,000 requests/s over 1,000 keys (Zipf), TTL 10 s; the database takes 50 ms \
                and slows down past 40 queries at once"
            .to_owned(),
        rows,
        events,
        notes,
        served: true,
    })
}

/// The breaker's state changes: seconds from the start, and the new state.
type Transitions = Arc<Mutex<Vec<(f64, BreakerState)>>>;

/// Records the breaker's state changes into `changes`, polled every 10 ms
/// of tokio time, until aborted.
async fn watch_breaker(origin: Origin, changes: Transitions) {
    let began = Instant::now();
    let mut last = origin.breaker_state();
    loop {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let now = origin.breaker_state();
        if now != last {
            lock(&changes).push((began.elapsed().as_secs_f64(), now));
            last = now;
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

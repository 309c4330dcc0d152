//! `breakwater demo`: four stories, a naive cache next to breakwater, each
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
//! 4. **clear**: a busy namespace of 100,000 keys cleared at runtime, hard
//!    (the cliff) and soft, over a window (the ramp).
//!
//! Each story is a named [`Scenario`] of the runner `simulate` uses, and
//! what its outcomes say: a table and notes, and a chart (PNG and SVG) of
//! the database's queries per second on a log scale; the outage's chart
//! has a second panel of the errors and stale values the requests met each
//! second.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use breakwater_cache::{
    BreakerConfig, BreakerState, ClearMode, EarlyRefresh, Error, Jitter, LimitConfig,
};
use clap::Args;

use crate::chart::{self, Event};
use crate::failure::Failure;
use crate::outcome::{self, Column, Outcome, Table};
use crate::report::{ms, thousands};
use crate::scenario::{self, CacheSpec, DatabaseSpec, Kind, OriginSpec, Scenario, Strategy};
use crate::traffic::{self, Traffic, Workload};

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

/// One story told: its outcomes, the events on its clock and what they
/// say.
#[derive(Debug, Clone)]
pub(crate) struct Story {
    /// File name of its chart, e.g. `avalanche`.
    pub(crate) name: &'static str,
    /// Heading and chart caption.
    pub(crate) title: String,
    /// What was simulated, one line.
    pub(crate) setup: String,
    /// One outcome per strategy.
    pub(crate) outcomes: Vec<Outcome>,
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

/// The stories' table.
const TABLE: Table = Table {
    name_width: 18,
    columns: &[
        Column {
            heading: "db peak/s",
            width: 10,
            figure: |o| thousands(o.peak_per_second),
        },
        Column {
            heading: "queries",
            width: 8,
            figure: |o| thousands(o.queries),
        },
        Column {
            heading: "p50 ms",
            width: 9,
            figure: |o| ms(o.p50_ms),
        },
        Column {
            heading: "p99 ms",
            width: 9,
            figure: |o| ms(o.p99_ms),
        },
        Column {
            heading: "errors",
            width: 7,
            figure: |o| thousands(o.errors),
        },
        Column {
            heading: "stale",
            width: 7,
            figure: |o| thousands(o.stale),
        },
        Column {
            heading: "waited",
            width: 7,
            figure: |o| thousands(o.waited),
        },
    ],
    legend: "(db peak/s: most queries started in one second; latencies of the requests on the\n \
             virtual clock; waited: requests not answered at once)",
};

/// Runs `breakwater demo`.
pub(crate) async fn main(opts: DemoOpts) -> ExitCode {
    let seed = opts.seed.unwrap_or_else(rand::random);
    crate::outln!(
        "breakwater demo — seed {seed} (replay with --seed {seed}); embedded memory store, \
         virtual clock"
    );
    let stories: [(&str, StoryFn); 4] = [
        ("avalanche", avalanche),
        ("stampede", stampede),
        ("outage", outage),
        ("clear", clear),
    ];
    // Every story on its own thread at once (each a paused clock: the
    // figures do not depend on what else runs), told in order.
    let runs: Vec<_> = stories
        .into_iter()
        .map(|(name, story)| (name, tokio::spawn(traffic::off_thread(move || story(seed)))))
        .collect();
    for (i, (name, run)) in runs.into_iter().enumerate() {
        let spinner = crate::progress::spinner(&format!("{name} story"));
        let ran = run.await.ok().flatten();
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
    let panicked: usize = story.outcomes.iter().map(|o| o.panicked).sum();
    if panicked > 0 {
        return Err(Failure::runtime(format!(
            "{panicked} request(s) of the {} story panicked",
            story.name
        )));
    }
    crate::out!("\n{number}. {}", render(story));
    let chart = outcome::chart(
        story.title.clone(),
        &story.outcomes,
        story.events.clone(),
        story.served,
    );
    let [png, svg] = chart::write(&chart, &opts.out, story.name)?;
    crate::outln!("chart: {} and {}", png.display(), svg.display());
    Ok(())
}

/// The story as text: heading, table, notes.
pub(crate) fn render(story: &Story) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}\n   {}\n", story.title, story.setup);
    out.push_str(&TABLE.render(&story.outcomes));
    for note in &story.notes {
        let _ = writeln!(out, "{note}");
    }
    out
}

/// 1. Avalanche: 100,000 keys bulk-loaded with TTL 300 s, without jitter and
///    with `Jitter::ratio(0.2)`; every key is read again in the second
///    after it expired.
fn avalanche(seed: u64) -> Result<Story, Error> {
    const KEYS: usize = 100_000;
    const TTL: Duration = Duration::from_secs(300);
    const SECONDS: u64 = 400;
    let jitter = Jitter::ratio(0.2);
    let scenario = Scenario {
        keys: KEYS,
        warm_up: None,
        clear_at: None,
        db: DatabaseSpec::new(Duration::from_millis(5)).capacity(200),
        traffic: Traffic::OnExpiry { seconds: SECONDS },
        seconds: SECONDS as usize,
        origin: None,
        strategies: vec![
            Strategy::naive("naive", TTL),
            Strategy::breakwater(
                "breakwater",
                CacheSpec::new(TTL, jitter).early_refresh(EarlyRefresh::none()),
            ),
        ],
        seed,
    };
    let outcomes = scenario::run(&scenario, None)?;
    let mut notes = Vec::new();
    for (strategy, o) in scenario.strategies.iter().zip(&outcomes) {
        let how = match strategy.kind {
            Kind::Naive { .. } => "no jitter".to_owned(),
            Kind::Breakwater(spec) => format!("jitter {}", spec.jitter),
        };
        notes.push(format!(
            "{} ({how}): {} keys expire {}",
            o.name,
            thousands(o.expiries.count),
            o.expiries.describe()
        ));
    }
    let (low, high) = jitter.bounds(TTL);
    let even = KEYS as f64 / (high - low).as_secs_f64();
    let bw_peak = outcomes[1].peak_per_second;
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
        outcomes,
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
    let cache = CacheSpec::new(TTL, Jitter::none());
    let scenario = Scenario {
        keys: 1,
        warm_up: None,
        clear_at: None,
        db: DatabaseSpec::new(Duration::from_millis(200)),
        traffic: Traffic::Steady(load),
        seconds: load.duration.as_secs() as usize + 1,
        origin: None,
        strategies: vec![
            Strategy::naive("naive", TTL),
            // Without grace, no early refresh either: the plain
            // single-flight case, where callers wait for the load.
            Strategy::breakwater(
                "breakwater",
                cache
                    .grace(Duration::ZERO)
                    .early_refresh(EarlyRefresh::none()),
            ),
            Strategy::breakwater("breakwater + grace", cache.grace(Duration::from_secs(5))),
        ],
        seed,
    };
    let outcomes = scenario::run(&scenario, None)?;
    let mut notes = Vec::new();
    for o in &outcomes {
        let refreshes = o.bursts;
        let per_refresh = o.queries as f64 / refreshes.max(1) as f64;
        let per_waiter = if o.waited == 0 {
            String::new()
        } else {
            format!(
                " (1 query per {:.1} waiting requests)",
                o.waited as f64 / o.queries.max(1) as f64
            )
        };
        notes.push(format!(
            "{}: {refreshes} refreshes, {per_refresh:.1} queries each; {} requests waited \
             for the database, {} queries ran{per_waiter}",
            o.name,
            thousands(o.waited),
            thousands(o.queries),
        ));
    }
    Ok(Story {
        name: "stampede",
        title: "stampede: one hot key, 2,000 requests/s, 200 ms query, TTL 10 s".to_owned(),
        setup: "naive: every request that misses queries; breakwater: one load per refresh; \
                + grace: stale-while-revalidate and early refresh"
            .to_owned(),
        outcomes,
        events: vec![Event {
            at_s: TTL.as_secs_f64(),
            label: "first expiry (TTL 10 s)".to_owned(),
        }],
        notes,
        served: false,
    })
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
    let scenario = Scenario {
        keys: KEYS,
        warm_up: None,
        clear_at: None,
        db: DatabaseSpec::new(Duration::from_millis(50))
            .capacity(40)
            .outage(OUTAGE.0, OUTAGE.1),
        traffic: Traffic::Steady(load),
        seconds,
        origin: Some(OriginSpec {
            breaker: BreakerConfig::new()
                .consecutive_failures(5)
                .cool_down(Duration::from_secs(5)),
            limit: LimitConfig::new().max_concurrent(16),
        }),
        strategies: vec![
            Strategy::naive("naive", TTL),
            Strategy::breakwater(
                "breakwater",
                CacheSpec::new(TTL, Jitter::ratio(0.2))
                    .grace(Duration::from_secs(5))
                    .max_stale(Duration::from_secs(120)),
            ),
        ],
        seed,
    };
    let outcomes = scenario::run(&scenario, None)?;
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
    for (strategy, o) in scenario.strategies.iter().zip(&outcomes) {
        if let Kind::Breakwater(_) = strategy.kind {
            // Counted by the breaker itself (polling would miss a probe
            // that failed at once); the times are polled, every 10 ms.
            let opened = o
                .stats
                .as_ref()
                .map_or(0, |stats| stats.origin_breaker_openings);
            let first_open = o
                .breaker
                .iter()
                .find(|(_, state)| *state == BreakerState::Open);
            let closed = o
                .breaker
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
            let recovery = o
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
            "{}: {} queries sent to the database while it was down; {} requests failed",
            o.name,
            thousands(o.failed),
            thousands(o.errors)
        ));
    }
    Ok(Story {
        name: "outage",
        title: "outage: the database fails from 30 s to 60 s".to_owned(),
        setup: "2,000 requests/s over 1,000 keys (Zipf), TTL 10 s; the database takes 50 ms \
                and slows down past 40 queries at once"
            .to_owned(),
        outcomes,
        events,
        notes,
        served: true,
    })
}

/// 4. Clear: 100,000 keys in use (written over the TTL before the
///    traffic, as a running service's are), TTL 60 s, 2,000 requests/s
///    over Zipf-drawn keys; at 120 s the data changes and the namespace is
///    cleared, hard or soft over the TTL.
fn clear(seed: u64) -> Result<Story, Error> {
    const KEYS: usize = 100_000;
    const TTL: Duration = Duration::from_secs(60);
    const CLEAR_AT: Duration = Duration::from_secs(120);
    const SECONDS: u64 = 240;
    /// The steady state is measured from here to the clear: the first TTL
    /// of traffic still finds the tail's keys from the warm-up.
    const SETTLED: usize = 60;
    /// The soft clear over the TTL keeps the busiest second within this
    /// many times the steady rate.
    const BOUND: f64 = 1.5;
    let load = Workload {
        keys: KEYS,
        rps: 2_000,
        duration: Duration::from_secs(SECONDS),
        zipf: 1.0,
        seed,
    };
    let cache = CacheSpec::new(TTL, Jitter::ratio(0.2)).grace(Duration::from_secs(10));
    let scenario = Scenario {
        keys: KEYS,
        warm_up: Some(TTL),
        clear_at: Some(CLEAR_AT),
        db: DatabaseSpec::new(Duration::from_millis(5)).capacity(100),
        traffic: Traffic::Steady(load),
        seconds: SECONDS as usize,
        origin: None,
        strategies: vec![
            Strategy::breakwater("hard", cache.clear(ClearMode::Hard)),
            Strategy::breakwater(
                "soft, window TTL",
                cache.clear(ClearMode::Soft { window: TTL }),
            ),
        ],
        seed,
    };
    let outcomes = scenario::run(&scenario, None)?;
    let at = usize::try_from(CLEAR_AT.as_secs()).unwrap_or(usize::MAX);
    let mut notes = Vec::new();
    let mut events = vec![Event {
        at_s: CLEAR_AT.as_secs_f64(),
        label: "data changes, clear".to_owned(),
    }];
    for o in &outcomes {
        let before = o.per_second.get(SETTLED..at).unwrap_or_default();
        let steady = before.iter().sum::<usize>() as f64 / before.len().max(1) as f64;
        let busiest_before = before.iter().copied().max().unwrap_or(0);
        let after = o.per_second.get(at..).unwrap_or_default();
        let (peak_s, peak) = after
            .iter()
            .copied()
            .enumerate()
            .max_by_key(|(i, n)| (*n, std::cmp::Reverse(*i)))
            .unwrap_or((0, 0));
        let ratio = peak as f64 / steady.max(1.0);
        let took = o.cleared.map_or_else(
            || "no clear".to_owned(),
            |c| format!("returned in {} ms", ms(Some(c.took_s * 1000.0))),
        );
        let last = o
            .outdated_per_second
            .iter()
            .rposition(|&n| n > 0)
            .map_or_else(String::new, |s| format!(", the last at {s} s"));
        notes.push(format!(
            "{}: steady {steady:.0} queries/s before (busiest second {}); the clear {took}; \
             after it the busiest second is {} at {} s, {ratio:.2} × steady; {} answers from \
             before the clear once it had returned{last}",
            o.name,
            thousands(busiest_before),
            thousands(peak),
            at + peak_s,
            thousands(o.outdated),
        ));
        if o.name == "soft, window TTL" {
            notes.push(format!(
                "check on the virtual clock: the soft clear over the TTL keeps the busiest \
                 second {} {BOUND} × steady ({ratio:.2} ×), with {} errors",
                if ratio <= BOUND { "within" } else { "ABOVE" },
                thousands(o.errors),
            ));
        }
    }
    events.push(Event {
        at_s: (CLEAR_AT + TTL).as_secs_f64(),
        label: "end of the soft window".to_owned(),
    });
    Ok(Story {
        name: "clear",
        title: "clear: a busy namespace of 100,000 keys cleared at 120 s".to_owned(),
        setup: "2,000 requests/s over 100,000 keys (Zipf), TTL 60 s ± 20 %, grace 10 s; \
                hard: every entry a miss at once; soft: each stale at a moment of its own \
                over a window of the TTL"
            .to_owned(),
        outcomes,
        events,
        notes,
        served: false,
    })
}

//! What one strategy of a scenario measured ([`Outcome`]), and the ways
//! `demo` and `simulate` show outcomes: a [`Table`] (each command picks its
//! columns), a [`chart`] of database queries per second (and, for a story
//! about what was served, errors and stale values), and the same as text
//! ([`sparkline_chart`]).

use std::fmt::Write as _;

use breakwater_cache::{BreakerState, Stats};
use serde::Serialize;

use crate::chart::{Chart, Event, Line, Panel};
use crate::db::Database;
use crate::report::{stats_line, thousands};
use crate::traffic::{Expiries, Tally};

/// What one strategy measured; in `simulate --json` as it is serialized.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Outcome {
    /// The strategy's name.
    #[serde(rename = "strategy")]
    pub(crate) name: &'static str,
    /// How the bulk write's expiries spread.
    pub(crate) expiries: Expiries,
    /// Database queries in all (failed ones included; the bulk write not
    /// counted).
    pub(crate) queries: usize,
    /// The most queries started in one whole second.
    pub(crate) peak_per_second: usize,
    /// The most queries running at once.
    pub(crate) peak_at_once: usize,
    /// Requests made.
    pub(crate) requests: usize,
    /// Requests that waited at all (for a load or a bulkhead permit).
    pub(crate) waited: usize,
    /// Requests answered with a stale value.
    pub(crate) stale: usize,
    /// Requests answered with a value from before a clear that had
    /// returned when they arrived.
    pub(crate) outdated: usize,
    /// The scenario's clear, if this strategy made one.
    pub(crate) cleared: Option<Cleared>,
    /// Requests that failed.
    pub(crate) errors: usize,
    /// Requests whose task panicked (the command fails).
    pub(crate) panicked: usize,
    /// Latency quantiles of the answered requests, in ms.
    pub(crate) p50_ms: Option<f64>,
    /// 99th percentile.
    pub(crate) p99_ms: Option<f64>,
    /// The slowest.
    pub(crate) max_ms: Option<f64>,
    /// Queries started in each second.
    pub(crate) per_second: Vec<usize>,
    /// [`Cache::stats`](breakwater_cache::Cache::stats) at the end, for
    /// breakwater (one line in JSON).
    #[serde(serialize_with = "stats_as_line")]
    pub(crate) stats: Option<Stats>,
    /// Queries that failed because the database was down.
    #[serde(skip)]
    pub(crate) failed: usize,
    /// Bursts of queries (refreshes, for one key): runs with no gap of more
    /// than a second.
    #[serde(skip)]
    pub(crate) bursts: usize,
    /// Failed requests in each second.
    #[serde(skip)]
    pub(crate) errors_per_second: Vec<usize>,
    /// Requests answered with a stale value in each second.
    #[serde(skip)]
    pub(crate) stale_per_second: Vec<usize>,
    /// Outdated answers in each second.
    #[serde(skip)]
    pub(crate) outdated_per_second: Vec<usize>,
    /// The origin's breaker state changes: seconds from the start, and the
    /// new state (polled every 10 ms).
    #[serde(skip)]
    pub(crate) breaker: Vec<(f64, BreakerState)>,
}

impl Outcome {
    /// The figures of a run: `db`'s queries (`per_second` of them, in
    /// `bursts`), what the requests met (`tally`), the breaker's changes.
    pub(crate) fn new(
        name: &'static str,
        expiries: Expiries,
        per_second: Vec<usize>,
        db: &Database,
        bursts: usize,
        tally: Tally,
        breaker: Vec<(f64, BreakerState)>,
    ) -> Self {
        Outcome {
            name,
            expiries,
            queries: db.started_ms().len(),
            peak_per_second: per_second.iter().copied().max().unwrap_or(0),
            peak_at_once: db.peak(),
            requests: tally.requests(),
            waited: tally.waited(),
            stale: tally.stale,
            outdated: tally.outdated,
            cleared: None,
            errors: tally.errors,
            panicked: tally.panicked,
            p50_ms: tally.quantile_ms(0.5),
            p99_ms: tally.quantile_ms(0.99),
            max_ms: tally.quantile_ms(1.0),
            per_second,
            stats: tally.stats,
            failed: db.failed(),
            bursts,
            errors_per_second: tally.errors_per_second,
            stale_per_second: tally.stale_per_second,
            outdated_per_second: tally.outdated_per_second,
            breaker,
        }
    }
}

/// A clear a strategy made during its run.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Cleared {
    /// When it began, in seconds from the traffic's start.
    pub(crate) at_s: f64,
    /// How long it took to return (every process acknowledged), in
    /// seconds.
    pub(crate) took_s: f64,
}

/// `stats` as [`stats_line`] writes it.
fn stats_as_line<S: serde::Serializer>(stats: &Option<Stats>, s: S) -> Result<S::Ok, S::Error> {
    match stats {
        Some(stats) => s.serialize_some(&stats_line(stats)),
        None => s.serialize_none(),
    }
}

/// One column of a [`Table`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Column {
    /// Its heading.
    pub(crate) heading: &'static str,
    /// Its width; figures are right-aligned.
    pub(crate) width: usize,
    /// Its figure for an outcome.
    pub(crate) figure: fn(&Outcome) -> String,
}

/// A table of outcomes: one row per strategy, named on the left, then a
/// legend and each breakwater strategy's `stats()`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Table {
    /// Width of the strategies' names.
    pub(crate) name_width: usize,
    /// The figures, left to right.
    pub(crate) columns: &'static [Column],
    /// What the columns mean, printed under the rows.
    pub(crate) legend: &'static str,
}

impl Table {
    /// The table of `outcomes`.
    pub(crate) fn render(&self, outcomes: &[Outcome]) -> String {
        let mut out = String::new();
        let _ = write!(out, "{:<1$}", "", self.name_width);
        for column in self.columns {
            let _ = write!(out, " {:>1$}", column.heading, column.width);
        }
        out.push('\n');
        for outcome in outcomes {
            let _ = write!(out, "{:<1$}", outcome.name, self.name_width);
            for column in self.columns {
                let _ = write!(out, " {:>1$}", (column.figure)(outcome), column.width);
            }
            out.push('\n');
        }
        let _ = writeln!(out, "{}", self.legend);
        for outcome in outcomes {
            if let Some(stats) = &outcome.stats {
                let _ = writeln!(out, "{} stats(): {}", outcome.name, stats_line(stats));
            }
        }
        out
    }
}

/// The chart of `outcomes`: database queries per second, one series per
/// strategy, `events` marked; with `served`, a second panel of failed
/// requests and stale values per second.
pub(crate) fn chart(
    title: String,
    outcomes: &[Outcome],
    events: Vec<Event>,
    served: bool,
) -> Chart {
    let queries = outcomes
        .iter()
        .map(|o| Line {
            name: o.name.to_owned(),
            per_second: o.per_second.clone(),
        })
        .collect();
    let mut chart = Chart::queries(title, queries, events);
    if served {
        let mut lines = Vec::new();
        // Over the queries' seconds, zeros included.
        let fit = |counts: &[usize], o: &Outcome| {
            let mut counts = counts.to_vec();
            counts.resize(o.per_second.len(), 0);
            counts
        };
        for o in outcomes {
            lines.push(Line {
                name: format!("{}: errors", o.name),
                per_second: fit(&o.errors_per_second, o),
            });
        }
        for o in outcomes.iter().filter(|o| o.stale > 0) {
            lines.push(Line {
                name: format!("{}: stale values", o.name),
                per_second: fit(&o.stale_per_second, o),
            });
        }
        chart.panels.push(Panel {
            y_desc: "requests per second: errors, stale values".to_owned(),
            lines,
        });
    }
    chart
}

/// Sparklines have at most this many cells.
const SPARK_CELLS: usize = 60;

/// Database queries over time as text, one line of block characters per
/// strategy (names `name_width` wide), every line on one scale.
pub(crate) fn sparkline_chart(outcomes: &[Outcome], name_width: usize) -> String {
    let mut out = String::new();
    let seconds = outcomes
        .iter()
        .map(|o| o.per_second.len())
        .max()
        .unwrap_or(0);
    let width = seconds.div_ceil(SPARK_CELLS).max(1);
    let rows: Vec<Vec<usize>> = outcomes
        .iter()
        .map(|o| o.per_second.chunks(width).map(|c| c.iter().sum()).collect())
        .collect();
    let peak = rows.iter().flatten().copied().max().unwrap_or(0);
    let _ = writeln!(
        out,
        "database queries per {width} s, one scale for every row (█ = {}):",
        thousands(peak)
    );
    for (o, line) in outcomes.iter().zip(sparklines(&rows)) {
        let own = rows_peak(&o.per_second, width);
        let _ = writeln!(
            out,
            "{:<name_width$} {line} (peak {})",
            o.name,
            thousands(own)
        );
    }
    out
}

/// The most queries in one `width`-second bucket of `per_second`.
fn rows_peak(per_second: &[usize], width: usize) -> usize {
    per_second
        .chunks(width)
        .map(|c| c.iter().sum())
        .max()
        .unwrap_or(0)
}

/// One block character per value, every row on one scale: the largest
/// value of all rows is a full block, so rows compare at a glance.
fn sparklines(rows: &[Vec<usize>]) -> Vec<String> {
    const BLOCKS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let max = rows.iter().flatten().copied().max().unwrap_or(0).max(1);
    rows.iter()
        .map(|row| {
            row.iter()
                .map(|&v| BLOCKS[(v * (BLOCKS.len() - 1)).div_ceil(max).min(BLOCKS.len() - 1)])
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparklines_share_one_scale() {
        // A peak of 1,862 and one of 510: only the first reaches the top.
        let lines = sparklines(&[vec![0, 1_862, 0], vec![0, 510, 0]]);
        assert_eq!(lines[0], "▁█▁");
        assert_eq!(lines[1], "▁▃▁");
        assert_eq!(sparklines(&[vec![0, 0]]), ["▁▁"]);
    }
}

//! `dashboards/breakwater.json` cannot drift from the metrics: every
//! breakwater metric a panel queries is in the table of
//! `crates/breakwater-cache/src/metrics.rs` (a `_bucket` series only of a
//! histogram), and every label and label value a query names is in that
//! metric's row.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

/// A metric's row in the table: its kind and the backquoted words of its
/// labels column (label names and values alike).
struct Row {
    kind: String,
    words: Vec<String>,
}

fn repo_file(path: &str) -> String {
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path);
    std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

/// The metrics table in the `metrics` module's docs.
fn table() -> BTreeMap<String, Row> {
    let source = repo_file("crates/breakwater-cache/src/metrics.rs");
    let rows: BTreeMap<String, Row> = source
        .lines()
        .filter_map(|line| line.strip_prefix("//! | `breakwater_"))
        .map(|row| {
            let cells: Vec<&str> = row.split(" | ").collect();
            let name = format!("breakwater_{}", cells[0].trim_end_matches('`'));
            let words = cells[2]
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect();
            (
                name,
                Row {
                    kind: cells[1].trim().to_owned(),
                    words,
                },
            )
        })
        .collect();
    assert!(
        rows.len() >= 15,
        "the table was not found: {rows:?}",
        rows = rows.keys()
    );
    rows
}

/// Every query of every panel, with the panel's title.
fn queries(dashboard: &Value) -> Vec<(String, String)> {
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut queries = Vec::new();
    for panel in panels {
        if panel["type"] == "row" {
            continue;
        }
        let title = panel["title"].as_str().expect("a title").to_owned();
        let targets = panel["targets"].as_array().map_or(&[][..], Vec::as_slice);
        assert!(!targets.is_empty(), "panel {title:?} has no query");
        for target in targets {
            let expr = target["expr"].as_str().expect("a PromQL expr").to_owned();
            queries.push((title.clone(), expr));
        }
    }
    queries
}

/// A metric named in a query, with the label matchers after it.
#[derive(Debug)]
struct Use {
    series: String,
    matchers: Vec<(String, String)>,
}

/// The `breakwater_*` series an expression reads, with their matchers.
fn uses(expr: &str) -> Vec<Use> {
    let mut found = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("breakwater_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let series = tail[..end].to_owned();
        let mut matchers = Vec::new();
        let after = &tail[end..];
        if let Some(inside) = after.strip_prefix('{') {
            let close = inside.find('}').expect("a closed selector");
            for matcher in inside[..close].split(',') {
                let op = matcher.find(['=', '!']).expect("a label matcher");
                let label = matcher[..op].trim().to_owned();
                let value = matcher[op..]
                    .trim_start_matches(['=', '!', '~'])
                    .trim()
                    .trim_matches('"')
                    .to_owned();
                matchers.push((label, value));
            }
        }
        found.push(Use { series, matchers });
        rest = &tail[end..];
    }
    found
}

/// The labels a `by (...)` clause groups on.
fn grouped_by(expr: &str) -> Vec<String> {
    expr.match_indices("by (")
        .flat_map(|(at, _)| {
            let inside = &expr[at + 4..];
            let close = inside.find(')').expect("a closed by clause");
            inside[..close]
                .split(',')
                .map(|l| l.trim().to_owned())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Checks every query of `dashboard` against `table`; returns the metrics
/// charted, or what is wrong.
fn check(dashboard: &Value, table: &BTreeMap<String, Row>) -> Result<Vec<String>, String> {
    let mut charted = Vec::new();
    for (title, expr) in queries(dashboard) {
        let used = uses(&expr);
        if used.is_empty() {
            return Err(format!(
                "panel {title:?} reads no breakwater metric: {expr}"
            ));
        }
        let mut labels_here: Vec<&str> = vec!["le"];
        for Use { series, matchers } in &used {
            let (name, row) = match table.get(series) {
                Some(row) => (series.as_str(), row),
                None => {
                    let base = series.strip_suffix("_bucket").ok_or_else(|| {
                        format!("panel {title:?}: {series} is not in the metrics table")
                    })?;
                    let row = table.get(base).ok_or_else(|| {
                        format!("panel {title:?}: {base} is not in the metrics table")
                    })?;
                    if row.kind != "histogram" {
                        return Err(format!(
                            "panel {title:?}: {series}, but {base} is a {}",
                            row.kind
                        ));
                    }
                    (base, row)
                }
            };
            if row.kind == "histogram" && !series.ends_with("_bucket") {
                return Err(format!(
                    "panel {title:?}: the histogram {name} is read through its _bucket series"
                ));
            }
            charted.push(name.to_owned());
            labels_here.extend(row.words.iter().map(String::as_str));
            for (label, value) in matchers {
                if !row.words.contains(label) {
                    return Err(format!(
                        "panel {title:?}: {name} has no label {label:?} (table: {:?})",
                        row.words
                    ));
                }
                if value.contains('$') {
                    continue; // a dashboard variable
                }
                for alternative in value.split('|') {
                    let known = match alternative.strip_suffix(".*") {
                        Some(prefix) => row.words.iter().any(|w| w.starts_with(prefix)),
                        None => row.words.iter().any(|w| w == alternative),
                    };
                    if !known {
                        return Err(format!(
                            "panel {title:?}: {name}{{{label}=~{value:?}}}: {alternative:?} is \
                             not one of its values in the table ({:?})",
                            row.words
                        ));
                    }
                }
            }
            let by_namespace = matchers
                .iter()
                .any(|(l, v)| (l == "namespace" || l == "name") && v == "$namespace");
            if row.words.iter().any(|w| w == "namespace") && !by_namespace {
                return Err(format!(
                    "panel {title:?}: {name} is not filtered by the namespace variable: {expr}"
                ));
            }
        }
        for label in grouped_by(&expr) {
            if !labels_here.contains(&label.as_str()) {
                return Err(format!(
                    "panel {title:?} groups by {label:?}, a label none of its metrics has: {expr}"
                ));
            }
        }
    }
    Ok(charted)
}

fn dashboard() -> Value {
    serde_json::from_str(&repo_file("dashboards/breakwater.json")).expect("valid JSON")
}

#[test]
fn every_metric_the_dashboard_queries_is_in_the_metrics_table() {
    let table = table();
    let dashboard = dashboard();
    assert!(queries(&dashboard).len() >= 15);
    let charted = check(&dashboard, &table).unwrap_or_else(|problem| panic!("{problem}"));

    // The panels the dashboard is for.
    for needed in [
        "breakwater_requests_total",
        "breakwater_loads_total",
        "breakwater_load_seconds",
        "breakwater_breaker_state",
        "breakwater_loads_in_flight",
        "breakwater_loads_shed_total",
        "breakwater_waiters",
        "breakwater_store_seconds",
        "breakwater_errors_total",
        "breakwater_notices_total",
    ] {
        assert!(
            charted.iter().any(|c| c == needed),
            "no panel charts {needed}"
        );
    }
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("variables");
    assert!(
        variables.iter().any(|v| v["name"] == "namespace"),
        "a namespace variable"
    );
}

#[test]
fn a_drifted_dashboard_is_caught() {
    let table = table();
    let drifted = |from: &str, to: &str| {
        let text = repo_file("dashboards/breakwater.json");
        assert!(text.contains(from), "{from}");
        let dashboard: Value = serde_json::from_str(&text.replacen(from, to, 1)).unwrap();
        check(&dashboard, &table).expect_err(to)
    };
    let renamed = drifted("breakwater_loads_total", "breakwater_load_total");
    assert!(
        renamed.contains("breakwater_load_total is not in the metrics table"),
        "{renamed}"
    );
    let value = drifted("l1_hit|hit|", "l1_hits|hit|");
    assert!(
        value.contains("\"l1_hits\" is not one of its values"),
        "{value}"
    );
    let label = drifted("sum by (kind)", "sum by (error_kind)");
    assert!(label.contains("groups by \"error_kind\""), "{label}");
    let unfiltered = drifted(
        "breakwater_waiters{namespace=~\\\"$namespace\\\"}",
        "breakwater_waiters",
    );
    assert!(
        unfiltered.contains("not filtered by the namespace variable"),
        "{unfiltered}"
    );
    let summary = drifted("breakwater_load_seconds_bucket", "breakwater_load_seconds");
    assert!(
        summary.contains("read through its _bucket series"),
        "{summary}"
    );
}

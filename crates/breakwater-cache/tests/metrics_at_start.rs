//! A cache just built, before any call: every metric of the `metrics`
//! module's table is described (unit and help text) and present, at 0, with
//! no empty label value. One test in its own binary: the recorder is
//! process-global.

use std::collections::BTreeSet;

use breakwater_cache::{Cache, MemoryStore, Origin};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

/// The metric names of the table in `src/metrics.rs`'s docs.
fn documented() -> BTreeSet<String> {
    let names: BTreeSet<String> = include_str!("../src/metrics.rs")
        .lines()
        .filter_map(|line| line.strip_prefix("//! | `breakwater_"))
        .map(|row| format!("breakwater_{}", &row[..row.find('`').expect("a name")]))
        .collect();
    assert!(names.len() >= 19, "the table was not found: {names:?}");
    names
}

#[tokio::test]
async fn every_series_is_described_and_at_zero_when_a_cache_is_built() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("no other recorder in this test binary");

    let origin = Origin::builder("catalog-db").build().unwrap();
    let _cache: Cache<String> = Cache::builder()
        .namespace("fresh")
        .store(MemoryStore::new())
        .origin(origin)
        .build()
        .unwrap();

    let snapshot = snapshotter.snapshot().into_vec();
    let mut seen = BTreeSet::new();
    for (key, unit, description, value) in &snapshot {
        let key = key.key();
        let name = key.name().to_owned();
        assert!(
            description.as_ref().is_some_and(|d| !d.is_empty()),
            "{name} has no help text"
        );
        assert!(unit.is_some(), "{name} has no unit");
        for label in key.labels() {
            assert!(
                !label.value().is_empty(),
                "{name} has an empty label {:?}",
                label.key()
            );
        }
        match value {
            DebugValue::Counter(n) => assert_eq!(*n, 0, "{name} {key:?}"),
            DebugValue::Gauge(g) => {
                // The breaker's state gauge: 0 is closed.
                assert_eq!(g.0, 0.0, "{name} {key:?}");
            }
            DebugValue::Histogram(samples) => assert!(samples.is_empty(), "{name}"),
        }
        seen.insert(name);
    }
    let missing: Vec<_> = documented().difference(&seen).cloned().collect();
    assert!(missing.is_empty(), "not registered at build: {missing:?}");
    let undocumented: Vec<_> = seen.difference(&documented()).cloned().collect();
    assert!(
        undocumented.is_empty(),
        "not in the table: {undocumented:?}"
    );

    // Every `served` label and every breaker transition is there, at 0.
    let count = |name: &str| {
        snapshot
            .iter()
            .filter(|(key, ..)| key.key().name() == name)
            .count()
    };
    assert_eq!(count("breakwater_requests_total"), 15);
    // The origin's breaker (no `domain` label) and the store's one domain.
    assert_eq!(count("breakwater_breaker_state"), 2);
    assert_eq!(count("breakwater_breaker_transitions_total"), 6);
    let origin_gauge = snapshot
        .iter()
        .find(|(key, ..)| {
            key.key().name() == "breakwater_breaker_state"
                && key.key().labels().any(|l| l.value() == "origin")
        })
        .expect("the origin breaker's gauge");
    assert!(
        origin_gauge.0.key().labels().all(|l| l.key() != "domain"),
        "{:?}",
        origin_gauge.0
    );
}

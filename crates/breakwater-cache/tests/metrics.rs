//! The metrics every decision emits, read back through a debugging recorder.
//! One test in its own binary: the recorder is process-global.

use std::collections::HashMap;
use std::time::Duration;

use breakwater_cache::{Cache, Jitter};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

type Snapshot = Vec<(
    metrics_util::CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    DebugValue,
)>;

/// Counter values by (name, the label `label`'s value).
fn counters(snapshot: &Snapshot, label: &str) -> HashMap<(String, String), u64> {
    snapshot
        .iter()
        .filter_map(|(key, _, _, value)| {
            let DebugValue::Counter(n) = *value else {
                return None;
            };
            let key = key.key();
            let l = key
                .labels()
                .find(|l| l.key() == label)
                .map(|l| l.value().to_owned())
                .unwrap_or_default();
            Some(((key.name().to_owned(), l), n))
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn every_path_is_counted_and_negatives_apart_from_values() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("no other recorder in this test binary");

    let cache: Cache<String> = Cache::builder()
        .namespace("metered")
        .ttl(Duration::from_secs(10))
        .jitter(Jitter::none())
        .build()
        .unwrap();
    let some = || async { Ok::<_, std::io::Error>(Some("v".to_string())) };
    let none = || async { Ok::<Option<String>, std::io::Error>(None) };
    cache.get_or_load("a", some).await.unwrap(); // loaded (value)
    cache.get_or_load("a", some).await.unwrap(); // hit
    cache.get_or_load("a", some).await.unwrap(); // hit
    cache.get_or_load("gone", none).await.unwrap(); // loaded (negative)
    cache.get_or_load("gone", none).await.unwrap(); // negative hit
    let _ = cache
        .get_or_load("err", || async {
            Err::<Option<String>, _>(std::io::Error::other("down"))
        })
        .await;
    // A warm-up over one cached key, two new ones and a failing one.
    let report = cache
        .warm(
            ["a", "w1", "w2", "bad"],
            |key: &str| async move {
                if key == "bad" {
                    Err(std::io::Error::other("down"))
                } else {
                    Ok(Some(key.to_owned()))
                }
            },
            breakwater_cache::Warm::new(),
        )
        .await
        .unwrap();
    assert_eq!((report.loaded, report.cached, report.failed), (2, 1, 1));

    // One snapshot: taking one resets the counters.
    let snapshot: Snapshot = snapshotter.snapshot().into_vec();
    let served = counters(&snapshot, "served");
    let get = |name: &str, label: &str| served.get(&(name.to_owned(), label.to_owned())).copied();
    // (The warm-up's two loads and its failure are requests too.)
    assert_eq!(get("breakwater_requests_total", "loaded"), Some(4));
    assert_eq!(get("breakwater_requests_total", "hit"), Some(2));
    assert_eq!(get("breakwater_requests_total", "negative"), Some(1));
    assert_eq!(get("breakwater_requests_total", "error"), Some(2));

    let outcomes = counters(&snapshot, "outcome");
    let get = |name: &str, label: &str| outcomes.get(&(name.to_owned(), label.to_owned())).copied();
    assert_eq!(get("breakwater_loads_total", "value"), Some(3));
    assert_eq!(get("breakwater_loads_total", "negative"), Some(1));
    assert_eq!(get("breakwater_loads_total", "error"), Some(2));
    assert_eq!(get("breakwater_warm_keys_total", "loaded"), Some(2));
    assert_eq!(get("breakwater_warm_keys_total", "cached"), Some(1));
    assert_eq!(get("breakwater_warm_keys_total", "failed"), Some(1));

    let leases = counters(&snapshot, "event");
    assert_eq!(
        leases
            .get(&("breakwater_lease_total".to_owned(), "acquired".to_owned()))
            .copied(),
        Some(6)
    );
}

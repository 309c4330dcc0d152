//! The OpenTelemetry bridge the README documents, end to end: breakwater's
//! `tracing` spans reach OpenTelemetry through `tracing-opentelemetry`, its
//! `metrics` through `metrics-exporter-opentelemetry`, and both land in the
//! SDK's in-memory exporters with their names, parent links and
//! attributes. No `otel` feature in the library: the bridge is two layers
//! the application installs.
//!
//! Every test here installs a subscriber (a binary of its own, as
//! `tests/spans.rs` explains: tracing caches callsite interest
//! process-wide).

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use breakwater_cache::{Cache, Jitter};
use metrics_exporter_opentelemetry::Recorder;
use opentelemetry::trace::{SpanId, TracerProvider as _};
use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
use opentelemetry_sdk::metrics::{
    Aggregation, InMemoryMetricExporter, Instrument, PeriodicReader, Stream,
};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tracing_subscriber::layer::SubscriberExt;

/// Bucket bounds, in seconds, for breakwater's `*_seconds` histograms (the
/// SDK's default bounds, 0 to 10,000, suit milliseconds).
const SECONDS: [f64; 12] = [
    0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// A view giving every `*_seconds` histogram bucket bounds in seconds.
fn seconds_buckets(instrument: &Instrument) -> Option<Stream> {
    if !instrument.name().ends_with("_seconds") {
        return None;
    }
    Stream::builder()
        .with_aggregation(Aggregation::ExplicitBucketHistogram {
            boundaries: SECONDS.to_vec(),
            record_min_max: true,
        })
        .build()
        .ok()
}

/// One data point, flattened: its value (a counter's sum, a gauge's last
/// value, a histogram's count), its attributes and, for a histogram, its
/// bucket bounds.
#[derive(Debug)]
struct Point {
    value: f64,
    attributes: BTreeMap<String, String>,
    bounds: Vec<f64>,
}

/// What the exporters received.
struct Exported {
    spans: Vec<SpanData>,
    metrics: BTreeMap<String, Vec<Point>>,
}

fn attributes<'a>(kvs: impl Iterator<Item = &'a KeyValue>) -> BTreeMap<String, String> {
    kvs.map(|kv| (kv.key.to_string(), kv.value.as_str().into_owned()))
        .collect()
}

fn points(data: &AggregatedMetrics) -> Vec<Point> {
    fn of<T: Copy>(data: &MetricData<T>, float: impl Fn(T) -> f64) -> Vec<Point> {
        match data {
            MetricData::Sum(sum) => sum
                .data_points()
                .map(|p| Point {
                    value: float(p.value()),
                    attributes: attributes(p.attributes()),
                    bounds: Vec::new(),
                })
                .collect(),
            MetricData::Gauge(gauge) => gauge
                .data_points()
                .map(|p| Point {
                    value: float(p.value()),
                    attributes: attributes(p.attributes()),
                    bounds: Vec::new(),
                })
                .collect(),
            MetricData::Histogram(histogram) => histogram
                .data_points()
                .map(|p| Point {
                    value: p.count() as f64,
                    attributes: attributes(p.attributes()),
                    bounds: p.bounds().collect(),
                })
                .collect(),
            MetricData::ExponentialHistogram(_) => Vec::new(),
        }
    }
    match data {
        AggregatedMetrics::F64(data) => of(data, |v| v),
        AggregatedMetrics::U64(data) => of(data, |v| v as f64),
        AggregatedMetrics::I64(data) => of(data, |v| v as f64),
    }
}

/// Runs `scenario` on a paused current-thread runtime with the bridge
/// installed for this thread only: an OpenTelemetry tracing layer and an
/// OpenTelemetry `metrics` recorder, each into an in-memory exporter.
fn exported<F, Fut>(scenario: F) -> Exported
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let span_exporter = InMemorySpanExporter::default();
    let tracer_provider = SdkTracerProvider::builder()
        .with_simple_exporter(span_exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(tracer_provider.tracer("otel-test")));

    let metric_exporter = InMemoryMetricExporter::default();
    let (meter_provider, recorder) = Recorder::builder("otel-test")
        .with_meter_provider(|builder| {
            builder
                .with_reader(PeriodicReader::builder(metric_exporter.clone()).build())
                .with_view(seconds_buckets)
        })
        .build();

    let runtime = support::paused_runtime();
    tracing::subscriber::with_default(subscriber, || {
        tracing::callsite::rebuild_interest_cache();
        metrics::with_local_recorder(&recorder, || runtime.block_on(scenario()));
    });
    drop(runtime);

    tracer_provider.force_flush().unwrap();
    meter_provider.force_flush().unwrap();
    let spans = span_exporter.get_finished_spans().unwrap();
    let mut metrics: BTreeMap<String, Vec<Point>> = BTreeMap::new();
    // Cumulative temporality: the last export holds every series.
    if let Some(last) = metric_exporter.get_finished_metrics().unwrap().last() {
        for scope in last.scope_metrics() {
            for metric in scope.metrics() {
                metrics
                    .entry(metric.name().to_owned())
                    .or_default()
                    .extend(points(metric.data()));
            }
        }
    }
    Exported { spans, metrics }
}

/// A load, then a hit, of one key.
async fn load_then_hit() {
    let cache = Cache::<String>::builder()
        .namespace("otel")
        .ttl(Duration::from_secs(10))
        .jitter(Jitter::none())
        .build()
        .unwrap();
    for _ in 0..2 {
        let value = cache
            .get_or_load("user:42", || async {
                tokio::time::sleep(Duration::from_millis(30)).await;
                Ok::<_, std::io::Error>(Some("Ada".to_owned()))
            })
            .await
            .unwrap();
        assert_eq!(value.as_deref(), Some("Ada"));
    }
}

fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| match &kv.value {
            Value::String(s) => s.as_str().to_owned(),
            other => other.to_string(),
        })
}

#[test]
fn spans_arrive_with_names_parents_and_attributes() {
    let spans = exported(load_then_hit).spans;
    let name_of = |id: SpanId| {
        spans
            .iter()
            .find(|s| s.span_context.span_id() == id)
            .map(|s| s.name.to_string())
    };
    let named =
        |name: &str| -> Vec<&SpanData> { spans.iter().filter(|s| s.name == name).collect() };

    let calls = named("breakwater.get_or_load");
    assert_eq!(
        calls.len(),
        2,
        "{:#?}",
        spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    // Each call is a root (no span of the test around it): two traces.
    let (load, hit) = (calls[0], calls[1]);
    assert_eq!(load.parent_span_id, SpanId::INVALID);
    assert_ne!(load.span_context.trace_id(), hit.span_context.trace_id());
    assert_eq!(attribute(load, "namespace").as_deref(), Some("otel"));
    assert_eq!(attribute(load, "served").as_deref(), Some("loaded"));
    assert_eq!(attribute(load, "role").as_deref(), Some("leader"));
    let key_hash = attribute(load, "key.hash").expect("the key's hash");
    assert_eq!(key_hash.len(), 16, "a 64-bit hash in hex: {key_hash}");
    assert_eq!(attribute(load, "key"), None, "no raw key unless asked for");
    assert_eq!(attribute(hit, "served").as_deref(), Some("hit"));
    assert_eq!(attribute(hit, "key.hash"), Some(key_hash));

    // The fill (in its own task) is the load call's child, in its trace;
    // the loader call and the fenced write are the fill's.
    let fill = named("breakwater.fill");
    assert_eq!(fill.len(), 1);
    assert_eq!(
        name_of(fill[0].parent_span_id).as_deref(),
        Some("breakwater.get_or_load")
    );
    assert_eq!(fill[0].parent_span_id, load.span_context.span_id());
    assert_eq!(
        fill[0].span_context.trace_id(),
        load.span_context.trace_id()
    );
    assert_eq!(attribute(fill[0], "lease").as_deref(), Some("acquired"));
    assert_eq!(attribute(fill[0], "written").as_deref(), Some("true"));

    let loader = named("breakwater.load");
    assert_eq!(loader.len(), 1);
    assert_eq!(loader[0].parent_span_id, fill[0].span_context.span_id());
    assert_eq!(attribute(loader[0], "origin").as_deref(), Some("otel"));
    assert_eq!(attribute(loader[0], "outcome").as_deref(), Some("value"));
    assert_eq!(attribute(loader[0], "load_ms").as_deref(), Some("30"));

    let write = named("breakwater.store.fenced_set");
    assert_eq!(write.len(), 1);
    assert_eq!(write[0].parent_span_id, fill[0].span_context.span_id());

    // Each call's store read, and the fill's second look under the lease.
    let reads: Vec<Option<String>> = named("breakwater.store.get")
        .iter()
        .map(|r| name_of(r.parent_span_id))
        .collect();
    assert_eq!(reads.len(), 3, "{reads:?}");
    assert_eq!(
        reads
            .iter()
            .filter(|p| p.as_deref() == Some("breakwater.get_or_load"))
            .count(),
        2
    );
    assert_eq!(
        reads
            .iter()
            .filter(|p| p.as_deref() == Some("breakwater.fill"))
            .count(),
        1
    );
}

#[test]
fn metrics_arrive_with_their_labels() {
    let metrics = exported(load_then_hit).metrics;
    let series = |name: &str| -> &Vec<Point> {
        metrics
            .get(name)
            .unwrap_or_else(|| panic!("no {name} in {:?}", metrics.keys().collect::<Vec<_>>()))
    };
    let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };

    let mut requests: Vec<(String, f64)> = series("breakwater_requests_total")
        .iter()
        .filter(|p| p.value > 0.0)
        .map(|p| {
            assert_eq!(p.attributes["namespace"], "otel");
            (p.attributes["served"].clone(), p.value)
        })
        .collect();
    requests.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        requests,
        [("hit".to_owned(), 1.0), ("loaded".to_owned(), 1.0)]
    );

    let loads: Vec<&Point> = series("breakwater_loads_total")
        .iter()
        .filter(|p| p.value > 0.0)
        .collect();
    assert_eq!(loads.len(), 1);
    assert_eq!(
        loads[0].attributes,
        labels(&[
            ("namespace", "otel"),
            ("origin", "otel"),
            ("outcome", "value")
        ])
    );

    let load_seconds = series("breakwater_load_seconds");
    assert_eq!(load_seconds.len(), 1, "{load_seconds:?}");
    assert_eq!(
        load_seconds[0].attributes,
        labels(&[("namespace", "otel"), ("origin", "otel")])
    );
    assert_eq!(load_seconds[0].value, 1.0, "one loader call timed");
    assert_eq!(
        load_seconds[0].bounds, SECONDS,
        "the view's bounds, in seconds"
    );

    let store_ops: Vec<&str> = series("breakwater_store_seconds")
        .iter()
        .map(|p| p.attributes["op"].as_str())
        .collect();
    for op in ["get", "acquire_lease", "fenced_set"] {
        assert!(
            store_ops.contains(&op),
            "no store_seconds{{op={op}}}: {store_ops:?}"
        );
    }
}

//! Every public call has its span, with the documented fields, and the
//! fill, the load and the store calls are its children (a capturing
//! subscriber on every test of this binary; see `tests/observability.rs`
//! for why the span tests live apart).

mod support;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use support::{failing, ten_second_cache as cache, value};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::Registry;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// A closed span: its name, its parent's name, its fields.
#[derive(Debug, Clone)]
struct Closed {
    name: String,
    level: tracing::Level,
    parent: Option<String>,
    fields: HashMap<String, String>,
}

#[derive(Default)]
struct Fields(HashMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_owned(),
            format!("{value:?}").trim_matches('"').to_owned(),
        );
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

/// Keeps every span's fields and, when it closes, the span.
#[derive(Clone, Default)]
struct Capture {
    open: Arc<Mutex<HashMap<u64, Closed>>>,
    closed: Arc<Mutex<Vec<Closed>>>,
}

impl<S> Layer<S> for Capture
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        let parent = ctx
            .span(id)
            .and_then(|span| span.parent())
            .map(|p| p.name().to_owned());
        self.open.lock().unwrap().insert(
            id.into_u64(),
            Closed {
                name: attrs.metadata().name().to_owned(),
                level: *attrs.metadata().level(),
                parent,
                fields: fields.0,
            },
        );
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        values.record(&mut fields);
        if let Some(span) = self.open.lock().unwrap().get_mut(&id.into_u64()) {
            span.fields.extend(fields.0);
        }
    }

    fn on_close(&self, id: Id, _ctx: Context<'_, S>) {
        if let Some(span) = self.open.lock().unwrap().remove(&id.into_u64()) {
            self.closed.lock().unwrap().push(span);
        }
    }
}

/// Runs `scenario` with a capturing subscriber; returns the closed spans.
fn spans<F, Fut>(scenario: F) -> Vec<Closed>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()>,
{
    let capture = Capture::default();
    let subscriber = Registry::default().with(capture.clone());
    let runtime = support::paused_runtime();
    tracing::subscriber::with_default(subscriber, || {
        // Interest cached before this subscriber existed is recomputed.
        tracing::callsite::rebuild_interest_cache();
        runtime.block_on(scenario())
    });
    drop(runtime);
    capture.closed.lock().unwrap().clone()
}

fn named<'a>(spans: &'a [Closed], name: &str) -> Vec<&'a Closed> {
    spans.iter().filter(|s| s.name == name).collect()
}

#[test]
fn a_load_has_a_call_span_with_fill_load_and_write_children() {
    let spans = spans(|| async {
        let cache = cache("traced").build().unwrap();
        value(&cache, "user:42").await.unwrap();
        value(&cache, "user:42").await.unwrap();
    });
    let calls = named(&spans, "breakwater.get_or_load");
    assert_eq!(calls.len(), 2, "{spans:#?}");
    let f = &calls[0].fields;
    assert_eq!(f["namespace"], "traced");
    assert_eq!(f["served"], "loaded");
    assert_eq!(f["role"], "leader");
    assert_eq!(f["key.hash"].len(), 16, "a 64-bit hash in hex");
    assert!(
        !f.contains_key("key"),
        "the raw key is left out unless asked for"
    );
    assert_eq!(calls[1].fields["served"], "hit");
    assert_eq!(calls[1].fields["key.hash"], f["key.hash"]);

    let fill = named(&spans, "breakwater.fill");
    assert_eq!(fill.len(), 1);
    assert_eq!(fill[0].parent.as_deref(), Some("breakwater.get_or_load"));
    assert_eq!(fill[0].fields["lease"], "acquired");
    assert_eq!(fill[0].fields["written"], "true");
    let load = named(&spans, "breakwater.load");
    assert_eq!(load.len(), 1);
    assert_eq!(load[0].parent.as_deref(), Some("breakwater.fill"));
    assert_eq!(load[0].fields["origin"], "traced");
    assert_eq!(load[0].fields["outcome"], "value");
    assert!(load[0].fields.contains_key("load_ms"));
    let write = named(&spans, "breakwater.store.fenced_set");
    assert_eq!(write.len(), 1);
    assert_eq!(write[0].parent.as_deref(), Some("breakwater.fill"));
    // The calls' reads, and the fill's double-check under the lease.
    let reads: Vec<_> = named(&spans, "breakwater.store.get")
        .iter()
        .map(|r| r.parent.clone().unwrap_or_default())
        .collect();
    assert_eq!(
        reads,
        [
            "breakwater.get_or_load",
            "breakwater.fill",
            "breakwater.get_or_load"
        ]
    );
}

#[test]
fn an_l1_hit_has_its_span_at_debug_and_a_store_read_or_load_at_info() {
    let spans = spans(|| async {
        let cache = cache("near")
            .l1(breakwater_cache::L1Config::new())
            .build()
            .unwrap();
        value(&cache, "user:42").await.unwrap(); // loaded
        value(&cache, "user:42").await.unwrap(); // from L1
        assert!(cache.get("user:42").await.unwrap().is_some()); // from L1
        assert!(cache.get("user:7").await.unwrap().is_none()); // a store read
    });
    let levels = |name: &str| -> Vec<(tracing::Level, String)> {
        named(&spans, name)
            .iter()
            .map(|s| {
                let what = s.fields.get("served").or(s.fields.get("found"));
                (s.level, what.cloned().unwrap_or_default())
            })
            .collect()
    };
    use tracing::Level;
    assert_eq!(
        levels("breakwater.get_or_load"),
        [
            (Level::INFO, "loaded".to_owned()),
            (Level::DEBUG, "l1_hit".to_owned())
        ]
    );
    assert_eq!(
        levels("breakwater.get"),
        [
            (Level::DEBUG, "true".to_owned()),
            (Level::INFO, "false".to_owned())
        ]
    );
}

#[test]
fn get_set_and_invalidate_have_spans_and_keys_only_when_asked() {
    let spans = spans(|| async {
        let cache = cache("calls").trace_keys(true).build().unwrap();
        cache.set("k", &"v".to_owned()).await.unwrap();
        assert!(cache.get("k").await.unwrap().is_some());
        cache.invalidate("k").await.unwrap();
        assert!(cache.get("").await.is_err());
    });
    let set = named(&spans, "breakwater.set");
    assert_eq!(set.len(), 1);
    assert_eq!(set[0].fields["key"], "k");
    let get = named(&spans, "breakwater.get");
    assert_eq!(get.len(), 2);
    assert_eq!(get[0].fields["found"], "true");
    assert!(get[1].fields["error"].contains("empty"), "{:?}", get[1]);
    let invalidate = named(&spans, "breakwater.invalidate");
    assert_eq!(invalidate.len(), 1);
    assert_eq!(invalidate[0].fields["namespace"], "calls");
}

#[test]
fn a_failed_call_records_its_error_on_its_span() {
    let spans = spans(|| async {
        let cache = cache("failing").build().unwrap();
        failing(&cache, "a").await.unwrap_err();
    });
    let calls = named(&spans, "breakwater.get_or_load");
    assert_eq!(calls.len(), 1);
    assert!(calls[0].fields["error"].contains("down"), "{:?}", calls[0]);
    assert_eq!(calls[0].fields["otel.status_code"], "ERROR");
    let load = named(&spans, "breakwater.load");
    assert!(load[0].fields["outcome"].contains("down"), "{:?}", load[0]);
}

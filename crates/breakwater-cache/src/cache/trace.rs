//! Spans, one per public call, made only when a subscriber listens, so a
//! hit pays nothing for tracing and an exporter filtered at `info` ships no
//! span per L1 hit.

use tracing::Span;
use tracing::field::Empty;

use super::handle::Cache;
use super::value::Value;
use crate::error::Error;
use crate::log_limit::show_key;

impl<V: Value> Cache<V> {
    /// The span of one public call on `key` (see `# Tracing` on
    /// [`Cache`]); fields are filled only when a subscriber listens.
    pub(super) fn span(&self, op: Op, key: &[u8]) -> Span {
        // Two instructions when no subscriber was ever set, in place of
        // the span macro's callsite checks.
        if !tracing::dispatcher::has_been_set() {
            return Span::none();
        }
        let ns = &self.inner.settings.namespace;
        // A call's span: its level and name, the fields every call has,
        // and its own (the level must be a constant of the callsite).
        macro_rules! call_span {
            ($level:expr, $name:literal $(, $field:ident)*) => {
                tracing::span!(
                    $level,
                    $name,
                    namespace = %ns,
                    key.hash = Empty,
                    key = Empty,
                    $($field = Empty,)*
                    error = Empty,
                    otel.status_code = Empty,
                )
            };
        }
        use tracing::Level;
        let span = match op {
            Op::GetOrLoad => call_span!(Level::INFO, "breakwater.get_or_load", served, role),
            Op::GetOrLoadNear => call_span!(Level::DEBUG, "breakwater.get_or_load", served, role),
            Op::Get => call_span!(Level::INFO, "breakwater.get", found),
            Op::GetNear => call_span!(Level::DEBUG, "breakwater.get", found),
            Op::Set => call_span!(Level::INFO, "breakwater.set"),
            Op::Invalidate => call_span!(Level::INFO, "breakwater.invalidate"),
            Op::Expire => call_span!(Level::INFO, "breakwater.expire"),
            Op::Refresh => call_span!(Level::INFO, "breakwater.refresh"),
            Op::InvalidateTag => call_span!(Level::INFO, "breakwater.invalidate_tag"),
            Op::ExpireTag => call_span!(Level::INFO, "breakwater.expire_tag"),
        };
        if !span.is_disabled() {
            span.record(
                "key.hash",
                tracing::field::display(format_args!("{:016x}", crate::store::fnv1a(key))),
            );
            if self.inner.settings.trace_keys {
                span.record("key", show_key(key));
            }
        }
        span
    }
}

/// The public calls that have a span. A call L1 answers alone (a fresh
/// copy, nothing to refresh) has its span at `debug`, the others at `info`.
#[derive(Clone, Copy)]
pub(super) enum Op {
    GetOrLoad,
    /// A `get_or_load` served by a fresh L1 copy.
    GetOrLoadNear,
    Get,
    /// A `get` served by a fresh L1 copy.
    GetNear,
    Set,
    Invalidate,
    Expire,
    InvalidateTag,
    ExpireTag,
    Refresh,
}

/// Records a call's error on its span.
pub(super) fn record_error<T>(span: &Span, result: &Result<T, Error>) {
    if let (false, Err(err)) = (span.is_disabled(), result) {
        record_failure(span, err);
    }
}

/// Records `err` on a call's span: its `error` field, and the status an
/// OpenTelemetry bridge shows a failed span with.
pub(super) fn record_failure(span: &Span, err: &Error) {
    span.record("error", tracing::field::display(err));
    span.record("otel.status_code", "ERROR");
}

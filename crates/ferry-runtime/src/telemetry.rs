//! OpenTelemetry spans of a task's life, one trace per command: the producer's
//! `ferry.submit <kind>` span, whose W3C `traceparent` travels with the command (Kafka
//! header and envelope), the worker's `ferry.task <kind>` span under it, and a
//! `ferry.step <name>` / `ferry.undo <name>` span per step run. Spans go to the global
//! tracer provider; with none installed (the default) they cost nothing and a random
//! traceparent still correlates the command's records.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue, global};
use opentelemetry_sdk::propagation::TraceContextPropagator;

/// Name of Ferry's tracer (the instrumentation scope).
pub const TRACER: &str = "ferry";

/// The context a `traceparent` names (an empty context without one, or when malformed).
pub fn context_of(traceparent: Option<&str>) -> Context {
    let Some(tp) = traceparent else { return Context::new() };
    let carrier = HashMap::from([("traceparent".to_owned(), tp.to_owned())]);
    TraceContextPropagator::new().extract(&carrier)
}

/// The `traceparent` of a context's span, when it has a valid one.
pub fn traceparent(cx: &Context) -> Option<String> {
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier: HashMap<String, String> = HashMap::new();
    TraceContextPropagator::new().inject_context(cx, &mut carrier);
    carrier.remove("traceparent")
}

/// Starts a span under `parent`; the returned context holds it (end it with [`end`]).
pub fn start(name: String, kind: SpanKind, parent: &Context, attributes: Vec<KeyValue>) -> Context {
    let tracer = global::tracer(TRACER);
    let span = tracer.span_builder(name).with_kind(kind).with_attributes(attributes).start_with_context(&tracer, parent);
    parent.with_span(span)
}

/// Ends the span of `cx`, marking it failed with `error` when given.
pub fn end(cx: &Context, error: Option<String>) {
    let span = cx.span();
    if let Some(e) = error {
        span.set_status(Status::error(e));
    }
    span.end();
}

//! OpenTelemetry spans of a task's life, one trace per command: the producer's
//! `ferry.submit <kind>` span, whose W3C `traceparent` travels with the command (Kafka
//! header and envelope), the worker's `ferry.task <kind>` span under it, and a
//! `ferry.step <name>` / `ferry.undo <name>` span per step run. Spans go to the global
//! tracer provider; with none installed (the default) they cost nothing and a random
//! traceparent still correlates the command's records.
//!
//! Spans of Kafka records follow OpenTelemetry's messaging conventions: the worker's
//! `process <topic>` span for each command record it reads (see [`consumed`]), and the
//! producer's span, completed by [`start`] (see [`sent`]). A task run's logs join its
//! trace through a `tracing` span whose `trace_id` and `span_id` fields name the run's
//! `ferry.task` span.

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

/// `messaging.system`: always `kafka` here.
pub const MESSAGING_SYSTEM: &str = "messaging.system";
/// `messaging.operation.type`: `send`, `receive` or `process`.
pub const MESSAGING_OPERATION_TYPE: &str = "messaging.operation.type";
/// `messaging.operation.name`: Kafka's own name of the operation (`send`, `poll`, `process`).
pub const MESSAGING_OPERATION_NAME: &str = "messaging.operation.name";
/// `messaging.destination.name`: the topic.
pub const MESSAGING_DESTINATION_NAME: &str = "messaging.destination.name";
/// `messaging.destination.partition.id`: the partition, as a string.
pub const MESSAGING_PARTITION_ID: &str = "messaging.destination.partition.id";
/// `messaging.consumer.group.name`: the consumer group that read the record.
pub const MESSAGING_CONSUMER_GROUP: &str = "messaging.consumer.group.name";
/// `messaging.kafka.offset`: the record's offset in its partition.
pub const MESSAGING_KAFKA_OFFSET: &str = "messaging.kafka.offset";
/// `messaging.kafka.message.key`: the record's key, when it is UTF-8 (a subject).
pub const MESSAGING_KAFKA_KEY: &str = "messaging.kafka.message.key";

/// A messaging operation, as the conventions type and name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// A record handed to the producer (span kind Producer).
    Send,
    /// Records fetched by a poll (span kind Client).
    Receive,
    /// One record's processing (span kind Consumer).
    Process,
}

impl Operation {
    /// The `messaging.operation.type` value.
    pub fn type_name(self) -> &'static str {
        match self {
            Operation::Send => "send",
            Operation::Receive => "receive",
            Operation::Process => "process",
        }
    }

    /// The `messaging.operation.name` value (Kafka's name of the operation).
    pub fn kafka_name(self) -> &'static str {
        match self {
            Operation::Send => "send",
            Operation::Receive => "poll",
            Operation::Process => "process",
        }
    }
}

fn operation(op: Operation, topic: &str) -> Vec<KeyValue> {
    vec![
        KeyValue::new(MESSAGING_SYSTEM, "kafka"),
        KeyValue::new(MESSAGING_OPERATION_TYPE, op.type_name()),
        KeyValue::new(MESSAGING_OPERATION_NAME, op.kafka_name()),
        KeyValue::new(MESSAGING_DESTINATION_NAME, topic.to_owned()),
    ]
}

/// The attributes of a span that sends a record to `topic`.
pub fn sent(topic: &str) -> Vec<KeyValue> {
    operation(Operation::Send, topic)
}

/// The attributes of a span that receives or processes one record that `group` read from
/// `topic`. The key is left out unless it is UTF-8 (the conventions want its string form).
pub fn consumed(op: Operation, topic: &str, group: &str, partition: i32, offset: i64, key: Option<&[u8]>) -> Vec<KeyValue> {
    let mut attrs = operation(op, topic);
    attrs.push(KeyValue::new(MESSAGING_CONSUMER_GROUP, group.to_owned()));
    attrs.push(KeyValue::new(MESSAGING_PARTITION_ID, partition.to_string()));
    attrs.push(KeyValue::new(MESSAGING_KAFKA_OFFSET, offset));
    if let Some(k) = key.and_then(|k| std::str::from_utf8(k).ok()) {
        attrs.push(KeyValue::new(MESSAGING_KAFKA_KEY, k.to_owned()));
    }
    attrs
}

/// A Producer span's attributes with [`sent`]'s added when they name a destination and
/// no messaging system.
fn completed(kind: &SpanKind, mut attributes: Vec<KeyValue>) -> Vec<KeyValue> {
    if *kind == SpanKind::Producer && !attributes.iter().any(|a| a.key.as_str() == MESSAGING_SYSTEM) {
        let topic = attributes.iter().find(|a| a.key.as_str() == MESSAGING_DESTINATION_NAME).map(|a| a.value.to_string());
        if let Some(topic) = topic {
            attributes.extend(sent(&topic).into_iter().filter(|a| a.key.as_str() != MESSAGING_DESTINATION_NAME));
        }
    }
    attributes
}

/// Starts a span under `parent`; the returned context holds it (end it with [`end`]).
/// A Producer span that names its `messaging.destination.name` but no
/// `messaging.system` gets the rest of [`sent`]'s attributes.
pub fn start(name: String, kind: SpanKind, parent: &Context, attributes: Vec<KeyValue>) -> Context {
    let attributes = completed(&kind, attributes);
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

/// The `tracing` span of a task run's logs, entered with the run's first line ("task run
/// started"): its `trace_id` and `span_id` fields name the run's `ferry.task` span (`cx`;
/// left empty when it has none), so that JSON logs (`ferry --log-format json`) carry them
/// and a log line leads to its trace.
pub(crate) fn task_log_span(cx: &Context, snap: &crate::protocol::TaskSnapshot) -> tracing::Span {
    let span = tracing::info_span!("task", task_id = %snap.task_id, kind = %snap.kind, subject = %snap.subject, trace_id = tracing::field::Empty, span_id = tracing::field::Empty);
    let sc = cx.span().span_context().clone();
    if sc.is_valid() {
        span.record("trace_id", tracing::field::display(sc.trace_id()));
        span.record("span_id", tracing::field::display(sc.span_id()));
    }
    span.in_scope(|| tracing::debug!(state = ?snap.state, step = snap.journal.len(), "task run started"));
    span
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumed_records_carry_the_kafka_attributes() {
        let attrs = consumed(Operation::Process, "ferry.commands.test", "ferry-test", 3, 42, Some(b"subject-a"));
        let get = |k: &str| attrs.iter().find(|a| a.key.as_str() == k).map(|a| a.value.to_string());
        assert_eq!(get(MESSAGING_SYSTEM).as_deref(), Some("kafka"));
        assert_eq!(get(MESSAGING_OPERATION_TYPE).as_deref(), Some("process"));
        assert_eq!(get(MESSAGING_OPERATION_NAME).as_deref(), Some("process"));
        assert_eq!(get(MESSAGING_DESTINATION_NAME).as_deref(), Some("ferry.commands.test"));
        assert_eq!(get(MESSAGING_CONSUMER_GROUP).as_deref(), Some("ferry-test"));
        assert_eq!(get(MESSAGING_PARTITION_ID).as_deref(), Some("3"));
        assert_eq!(get(MESSAGING_KAFKA_OFFSET).as_deref(), Some("42"));
        assert_eq!(get(MESSAGING_KAFKA_KEY).as_deref(), Some("subject-a"));
        let binary = consumed(Operation::Receive, "t", "g", 0, 0, Some(&[0xff, 0xfe]));
        assert!(!binary.iter().any(|a| a.key.as_str() == MESSAGING_KAFKA_KEY), "a key with no string form is left out");
        assert!(binary.iter().any(|a| a.key.as_str() == MESSAGING_OPERATION_NAME && a.value.to_string() == "poll"));
    }

    #[test]
    fn producer_spans_that_name_a_topic_are_completed_as_sends() {
        let attrs = completed(&SpanKind::Producer, vec![KeyValue::new("ferry.task_id", "t1"), KeyValue::new(MESSAGING_DESTINATION_NAME, "ferry.commands.test")]);
        let keys: Vec<String> = attrs.iter().map(|a| format!("{}={}", a.key, a.value)).collect();
        for k in ["messaging.system=kafka", "messaging.operation.type=send", "messaging.operation.name=send", "messaging.destination.name=ferry.commands.test"] {
            assert!(keys.contains(&k.to_owned()), "{k}: {keys:?}");
        }
        assert_eq!(keys.len(), 5, "the destination is not repeated: {keys:?}");
        let internal = completed(&SpanKind::Internal, vec![KeyValue::new(MESSAGING_DESTINATION_NAME, "t")]);
        assert_eq!(internal.len(), 1, "only producer spans are completed");
        let no_topic = completed(&SpanKind::Producer, vec![KeyValue::new("ferry.task_id", "t1")]);
        assert_eq!(no_topic.len(), 1, "nothing to complete without a destination");
    }
}

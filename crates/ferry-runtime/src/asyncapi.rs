//! Ferry's protocol as an AsyncAPI 3.0 document, generated from the same definitions the
//! workers use (`topics/topics.yaml`, the registered kinds and their schema ids, the header names),
//! so that a client in any language can read every topic. `docs/asyncapi.yaml` is this
//! module's output; a test fails when it is out of date (`FERRY_BLESS=1` rewrites it).
//! docs/PROTOCOL.md explains the rules the document cannot say (order, dedupe, tenants).

use serde_json::{Map, Value, json};

use crate::kind::{TaskKind, catalogue, registered};
use crate::publisher::{
    CE_ID, CE_SOURCE, CE_SPECVERSION, CE_SUBJECT, CE_TIME, CE_TYPE, CLOUDEVENTS_VERSION, CONTENT_TYPE, DLQ_HEADERS_DROPPED, DLQ_KEY_BYTES, DLQ_OFFSET, DLQ_PARTITION, DLQ_REASON, DLQ_TOPIC,
    DLQ_VALUE_BYTES, DLQ_VALUE_SHA256, EVENT_CONTENT_TYPE, EVENT_TYPES, TASK_HEADER, TRACEPARENT, cloudevent_source, cloudevent_type,
};
use crate::tenants::TENANT_HEADER;
use crate::topics::Topics;
use crate::wire::embedded_schemas;

/// The schema id of a committed schema file.
fn id_of(file: &str) -> u32 {
    embedded_schemas()
        .iter()
        .find(|(_, f, _)| *f == file)
        .map(|(id, _, _)| *id)
        .unwrap_or_else(|| panic!("{file} is not registered (wire::PROTOCOL or a kind's KindInfo)"))
}

/// A channel key: letters and digits of `name` in camel case.
fn key(name: &str) -> String {
    let mut out = String::new();
    let mut upper = false;
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(if upper { c.to_ascii_uppercase() } else { c });
            upper = false;
        } else {
            upper = !out.is_empty();
        }
    }
    out
}

fn header(description: &str) -> Value {
    json!({"type": "string", "description": description})
}

/// A progress event's headers: the task, the trace, and the CloudEvents 1.0 attributes of
/// the Kafka binding's binary content mode (the value is the event's data).
fn event_headers(trace: &Value) -> Value {
    let sources: Vec<String> = registered().into_iter().map(cloudevent_source).collect();
    json!({
        TRACEPARENT: trace,
        TASK_HEADER: header("the task id"),
        CE_SPECVERSION: {"type": "string", "const": CLOUDEVENTS_VERSION, "description": "CloudEvents spec version"},
        CE_ID: header("CloudEvents id: `<task_id>:<seq>`, the event's dedupe key (a re-sent event keeps it); a seq 0 event (a refused command) is `<task_id>:0:<uuid>`, a UUID v5 of the command record it answers, the same when the command is read again"),
        CE_TYPE: {"type": "string", "enum": EVENT_TYPES.iter().map(|e| cloudevent_type(*e)).collect::<Vec<_>>(), "description": "CloudEvents type: the event's `event`, `io.ferry.task.<snake_case>`"},
        CE_SOURCE: {"type": "string", "enum": sources, "description": "CloudEvents source: the kind's workers, `/ferry/workers/<kind>` (the instance is the record's `worker`)"},
        CE_SUBJECT: header("CloudEvents subject: the task's subject"),
        CE_TIME: {"type": "string", "format": "date-time", "description": "CloudEvents time: the event's `at_ms`, RFC 3339 in UTC with milliseconds"},
        CONTENT_TYPE: {"type": "string", "const": EVENT_CONTENT_TYPE, "description": "the CloudEvents datacontenttype: the value is Avro in the Confluent framing"},
    })
}

/// An Avro message in the Confluent framing (magic 0, 4-byte schema id, datum).
fn avro_message(file: &str, key: &str, summary: &str, headers: Value) -> Value {
    json!({
        "summary": summary,
        "contentType": "application/vnd.apache.avro+binary",
        "headers": {"type": "object", "properties": headers},
        "payload": {
            "schemaFormat": "application/vnd.apache.avro;version=1.9.0",
            "schema": {"$ref": format!("../schemas/{file}")},
        },
        "bindings": {"kafka": {
            "key": {"type": "string", "description": key},
            "schemaIdLocation": "payload",
            "schemaIdPayloadEncoding": "confluent",
            "bindingVersion": "0.5.0",
        }},
        "x-ferry-schema-id": id_of(file),
    })
}

/// The document for `topics`.
pub fn document(topics: &Topics) -> Value {
    let trace = header("W3C trace context (traceparent) of the task's trace");
    let mut channels = Map::new();
    let mut operations = Map::new();
    let mut messages = Map::new();
    messages.insert(
        "command".into(),
        avro_message(
            "CommandEnvelope.v3.avsc",
            "the task's subject: one subject's commands stay in order",
            "Start, Cancel or Revert of a task; `spec` holds the kind's own record, itself Confluent-framed",
            json!({TRACEPARENT: trace, TENANT_HEADER: header("set by Ferry's gateway only, on commands copied from a tenant's topic: the tenant; any other sender's is refused or dropped")}),
        ),
    );
    for info in catalogue() {
        let kind: TaskKind = info.kind;
        let topic = &topics.command(kind).name;
        let spec = info.spec;
        channels.insert(
            key(topic),
            json!({
                "address": topic,
                "description": format!("{kind} commands from operators (and the tenants' gateway); the envelope's spec is a {} (schema id {})", spec.trim_end_matches(".avsc"), id_of(spec)),
                "messages": {"command": {"$ref": "#/components/messages/command"}},
                "x-ferry-spec": {"schema": {"$ref": format!("../schemas/{spec}")}, "schemaId": id_of(spec)},
            }),
        );
        operations.insert(
            key(&format!("submit-{kind}")),
            json!({"action": "send", "channel": {"$ref": format!("#/channels/{}", key(topic))}, "summary": format!("submit, cancel or revert a {kind} task")}),
        );
        let state = &topics.task_state(kind).name;
        channels.insert(
            key(state),
            json!({
                "address": state,
                "description": format!("the latest snapshot of every {kind} task (compacted; written only by {kind} workers)"),
                "messages": {"snapshot": {"$ref": "#/components/messages/snapshot"}},
            }),
        );
    }
    channels.insert(
        "tenantCommands".into(),
        json!({
            "address": format!("{}{{kind}}", topics.tenant_prefix("{tenant}")),
            "description": "a tenant's own command topics: only its KafkaUser may write them; the gateway copies each record to the kind's command topic with the tenant header",
            "parameters": {"tenant": {"description": "the tenant's name (its policy entry)"}, "kind": {"enum": registered().iter().map(|k| k.as_str().to_owned()).collect::<Vec<_>>()}},
            "messages": {"command": {"$ref": "#/components/messages/command"}},
        }),
    );
    operations.insert("submitAsTenant".into(), json!({"action": "send", "channel": {"$ref": "#/channels/tenantCommands"}, "summary": "submit, cancel or revert as a tenant"}));
    let progress = &topics.progress().name;
    channels.insert(
        key(progress),
        json!({"address": progress, "description": "every event of every task, in seq order per task", "messages": {"event": {"$ref": "#/components/messages/event"}}}),
    );
    operations.insert("follow".into(), json!({"action": "receive", "channel": {"$ref": format!("#/channels/{}", key(progress))}, "summary": "follow tasks; dedupe by (task_id, seq)"}));
    channels.insert(
        "tenantProgress".into(),
        json!({
            "address": topics.tenant_progress("{tenant}").name,
            "description": "a copy of every event of a tenant's tasks (and of refusals of the tenant's commands), written by the workers: the tenant reads this topic, not every task's progress",
            "parameters": {"tenant": {"description": "the tenant's name (its policy entry)"}},
            "messages": {"event": {"$ref": "#/components/messages/event"}},
        }),
    );
    operations.insert("followAsTenant".into(), json!({"action": "receive", "channel": {"$ref": "#/channels/tenantProgress"}, "summary": "follow a tenant's tasks; dedupe by (task_id, seq)"}));
    messages.insert(
        "event".into(),
        avro_message("ProgressEvent.v3.avsc", "the task id", "one event of a task (seq strictly increasing per task), a CloudEvent in the Kafka binding's binary content mode", event_headers(&trace)),
    );
    messages.insert(
        "snapshot".into(),
        avro_message("TaskSnapshot.v3.avsc", "the task id", "a task's state, journal and spec after its latest event", json!({TRACEPARENT: trace, TASK_HEADER: header("the task id")})),
    );
    let scores = &topics.scores().name;
    channels.insert(
        key(scores),
        json!({"address": scores, "description": "the latest placement score of every cluster (compacted)", "messages": {"score": {"$ref": "#/components/messages/score"}}}),
    );
    messages.insert("score".into(), avro_message("ClusterScore.avsc", "the cluster", "a cluster's latest score", json!({})));
    let dead = &topics.dead_letter().name;
    channels.insert(
        key(dead),
        json!({"address": dead, "description": "records no worker could decode or accept: the original key and bytes (or their head), and why", "messages": {"deadLetter": {"$ref": "#/components/messages/deadLetter"}}}),
    );
    messages.insert(
        "deadLetter".into(),
        json!({
            "summary": "the original record (its head when it would not fit), with why and where it came from",
            "contentType": "application/octet-stream",
            "payload": {"type": "string", "format": "binary"},
            "headers": {"type": "object", "properties": {
                DLQ_REASON: header("why it was refused"),
                DLQ_TOPIC: header("the topic it came from"),
                DLQ_PARTITION: header("its partition"),
                DLQ_OFFSET: header("its offset"),
                DLQ_VALUE_BYTES: header("the original value's size, when only its head is kept"),
                DLQ_VALUE_SHA256: header("the original value's SHA-256 (hex), when only its head is kept"),
                DLQ_KEY_BYTES: header("the original key's size, when only its head is kept"),
                DLQ_HEADERS_DROPPED: header("how many original headers did not fit"),
            }},
            "bindings": {"kafka": {"key": {"type": "string", "description": "the original key (or its head)"}, "bindingVersion": "0.5.0"}},
        }),
    );
    json!({
        "asyncapi": "3.0.0",
        "info": {
            "title": "Ferry",
            "version": "1",
            "description": "Kafka-driven orchestration of Kubernetes fleets: commands in, progress events and task state out. Avro in the Confluent framing; schema ids are fixed (x-ferry-schema-id) and the schemas are in schemas/. docs/PROTOCOL.md has the rules.",
        },
        "defaultContentType": "application/vnd.apache.avro+binary",
        "servers": {"kafka": {"host": "localhost:9092", "protocol": "kafka", "description": "any Kafka-protocol broker; SASL/SCRAM-SHA-512 in production"}},
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages},
    })
}

//! Writes a task's snapshot and then its event, the event only once the snapshot is
//! acknowledged, so every published event has a durable snapshot with a sequence number at
//! least as high (a resumed task never reuses a seq); a new task's Accepted, which only its
//! command decides, goes with its snapshot ([`Publisher::enqueue_accepted`]).

use std::sync::Arc;
use std::time::Duration;

use futures::future::try_join_all;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::kind::TaskKind;
use crate::metrics::Metrics;
use crate::protocol::{EventType, ProgressEvent, TaskSnapshot, TaskState, now_ms};
use crate::state_view::StateView;
use crate::topics::Topics;
use crate::wire::{Registry, WireError};

/// Header carrying the W3C trace context on every command, event and snapshot.
pub const TRACEPARENT: &str = "traceparent";
/// Header naming the task of a record.
pub const TASK_HEADER: &str = "ferry-task-id";
/// Header with a snapshot's seq: a state view skips decoding a snapshot it already holds
/// (its own writes, read back) by key and this header alone.
pub const SEQ_HEADER: &str = "ferry-seq";
/// CloudEvents 1.0 attributes of every progress event, in the binary content mode of the
/// Kafka protocol binding (`ce_` and the attribute's name; the value stays the Avro record).
pub const CE_SPECVERSION: &str = "ce_specversion";
/// The event's id: `<task id>:<seq>` (unique with `ce_source`; a re-sent event keeps it).
pub const CE_ID: &str = "ce_id";
/// The event's type: [`cloudevent_type`].
pub const CE_TYPE: &str = "ce_type";
/// Where it happened: [`cloudevent_source`].
pub const CE_SOURCE: &str = "ce_source";
/// The task's subject.
pub const CE_SUBJECT: &str = "ce_subject";
/// RFC 3339 UTC time of the event's `at_ms`.
pub const CE_TIME: &str = "ce_time";
/// The record value's media type; the binding maps it to the CloudEvents `datacontenttype`.
pub const CONTENT_TYPE: &str = "content-type";
/// The CloudEvents spec version Ferry's events follow.
pub const CLOUDEVENTS_VERSION: &str = "1.0";
/// `content-type` of a progress event: Avro (in the Confluent framing, docs/PROTOCOL.md).
pub const EVENT_CONTENT_TYPE: &str = "application/avro";
/// Dead-letter headers.
pub const DLQ_REASON: &str = "ferry-dlq-reason";
/// Topic the dead record came from.
pub const DLQ_TOPIC: &str = "ferry-dlq-topic";
/// Partition the dead record came from.
pub const DLQ_PARTITION: &str = "ferry-dlq-partition";
/// Offset of the dead record.
pub const DLQ_OFFSET: &str = "ferry-dlq-offset";
/// Size in bytes of the dead record's value, when the letter keeps only its head.
pub const DLQ_VALUE_BYTES: &str = "ferry-dlq-value-bytes";
/// Lowercase hex SHA-256 of the dead record's whole value, when the letter keeps only its head.
pub const DLQ_VALUE_SHA256: &str = "ferry-dlq-value-sha256";
/// Size in bytes of the dead record's key, when the letter keeps only its head.
pub const DLQ_KEY_BYTES: &str = "ferry-dlq-key-bytes";
/// How many of the dead record's headers the letter leaves out (they would not fit).
pub const DLQ_HEADERS_DROPPED: &str = "ferry-dlq-headers-dropped";

/// Why a record could not be made durable.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The record could not be encoded.
    #[error("encoding a {record} for task {task}: {source}")]
    Encode {
        /// Record type.
        record: &'static str,
        /// The task.
        task: String,
        /// Cause.
        #[source]
        source: WireError,
    },
    /// The broker did not acknowledge the record.
    #[error("producing to {topic}: {source}")]
    Produce {
        /// The topic.
        topic: String,
        /// Cause.
        #[source]
        source: KafkaError,
    },
    /// A task's transition (snapshot, then event) was not acknowledged.
    #[error("writing {} (seq {}) of task {}: {source}", event.event, event.seq, event.task_id)]
    Transition {
        /// The event whose write failed; its snapshot is the task's in-memory snapshot.
        event: Box<ProgressEvent>,
        /// The task's earlier events whose acknowledgement failed or was still awaited
        /// (events are acknowledged together with the next snapshot, [`InFlight`]), or
        /// that waited for this snapshot: written again before `event`, in order.
        before: Vec<ProgressEvent>,
        /// Cause.
        #[source]
        source: Box<PublishError>,
    },
    /// The task's partition was given up: this worker writes nothing more for it.
    #[error("task {task} is fenced: its partition now belongs to another worker")]
    Fenced {
        /// The task.
        task: String,
    },
    /// The producer was dropped before the record was acknowledged.
    #[error("producer shut down before {topic} acknowledged a record")]
    Dropped {
        /// The topic.
        topic: String,
    },
}

/// The optional fields of one event.
#[derive(Debug, Clone, Default)]
pub struct Detail {
    /// Step index from 1.
    pub step: Option<i32>,
    /// Step name.
    pub step_name: Option<String>,
    /// Percent for StepProgress.
    pub percent: Option<i32>,
    /// Human detail.
    pub message: Option<String>,
    /// Error code.
    pub code: Option<String>,
    /// Transient flag of a failure.
    pub transient: Option<bool>,
    /// Attempt number.
    pub attempt: Option<i32>,
    /// Backoff delay.
    pub delay_ms: Option<i64>,
}

impl Detail {
    /// Detail of a step event.
    pub fn step(index: usize, name: &str) -> Self {
        Self { step: Some(index as i32 + 1), step_name: Some(name.to_owned()), ..Self::default() }
    }

    /// With a message, cut to [`limits::MESSAGE_BYTES`](ferry_task::limits::MESSAGE_BYTES).
    pub fn message(mut self, m: impl Into<String>) -> Self {
        self.message = Some(ferry_task::limits::bounded(m.into(), ferry_task::limits::MESSAGE_BYTES));
        self
    }

    /// The event of `snap`'s task with this detail, numbered `seq`.
    pub fn into_event(self, snap_task: (&str, TaskKind, &str), seq: i64, event: EventType, worker: &str, at_ms: i64, trace_parent: Option<String>) -> ProgressEvent {
        let (task_id, kind, subject) = snap_task;
        ProgressEvent {
            task_id: task_id.to_owned(),
            seq,
            event,
            kind,
            subject: subject.to_owned(),
            worker: worker.to_owned(),
            at_ms,
            trace_parent,
            step: self.step,
            step_name: self.step_name,
            percent: self.percent,
            message: self.message,
            code: self.code,
            transient: self.transient,
            attempt: self.attempt,
            delay_ms: self.delay_ms,
        }
    }
}

/// Every event type, in the enum's order (a test checks them against the Avro symbols).
pub const EVENT_TYPES: [EventType; 16] = [
    EventType::Accepted,
    EventType::Rejected,
    EventType::StepStarted,
    EventType::StepProgress,
    EventType::StepSucceeded,
    EventType::StepFailed,
    EventType::Retrying,
    EventType::Succeeded,
    EventType::Failed,
    EventType::CancelRequested,
    EventType::Cancelled,
    EventType::Reverting,
    EventType::StepReverted,
    EventType::Reverted,
    EventType::RevertFailed,
    EventType::Signalled,
];

/// The CloudEvents `type` of an event: `io.ferry.task.` and its [`EventType`] in snake case
/// (`io.ferry.task.step_succeeded`), one per event type.
pub fn cloudevent_type(event: EventType) -> &'static str {
    match event {
        EventType::Accepted => "io.ferry.task.accepted",
        EventType::Rejected => "io.ferry.task.rejected",
        EventType::StepStarted => "io.ferry.task.step_started",
        EventType::StepProgress => "io.ferry.task.step_progress",
        EventType::StepSucceeded => "io.ferry.task.step_succeeded",
        EventType::StepFailed => "io.ferry.task.step_failed",
        EventType::Retrying => "io.ferry.task.retrying",
        EventType::Succeeded => "io.ferry.task.succeeded",
        EventType::Failed => "io.ferry.task.failed",
        EventType::CancelRequested => "io.ferry.task.cancel_requested",
        EventType::Cancelled => "io.ferry.task.cancelled",
        EventType::Reverting => "io.ferry.task.reverting",
        EventType::StepReverted => "io.ferry.task.step_reverted",
        EventType::Reverted => "io.ferry.task.reverted",
        EventType::RevertFailed => "io.ferry.task.revert_failed",
        EventType::Signalled => "io.ferry.task.signalled",
    }
}

/// The CloudEvents `source` of a kind's events: `/ferry/workers/<kind>`. The kind's workers
/// together, not one instance: after a worker moves, another may write the same event again
/// (same seq), and with the same source and id a consumer sees it as the duplicate it is.
/// The instance is the record's `worker` field.
pub fn cloudevent_source(kind: TaskKind) -> String {
    format!("/ferry/workers/{kind}")
}

/// The command record an event with seq 0 answers: where it sits on its kind's command
/// topic, and the producer's `created_at_ms` in it (offsets start again on a topic made
/// anew). The same on every reading of the record, by any worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answered {
    /// The command topic's partition.
    pub partition: i32,
    /// The record's offset there.
    pub offset: i64,
    /// The envelope's `created_at_ms`.
    pub created_at_ms: i64,
}

/// The UUID namespace of seq-0 events' ids (a UUID v5 of the command's place, [`Answered`]).
const ANSWER_ID_NAMESPACE: uuid::Uuid = uuid::uuid!("4a1c2f0e-8d6b-5e3a-9c71-0f2b6d8e4a13");

/// An event to write and, when its seq is 0, the command it answers: what its CloudEvents
/// id is made of ([`cloudevent_headers`]), kept with it while it may be written again.
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// The event.
    pub event: ProgressEvent,
    /// The command a seq-0 event answers.
    pub answers: Option<Answered>,
}

impl From<ProgressEvent> for Outgoing {
    fn from(event: ProgressEvent) -> Self {
        Self { event, answers: None }
    }
}

/// An event's CloudEvents id: `<task id>:<seq>`. An event with seq 0 (a refused command,
/// which leaves its task as it was) is not the task's n-th event and several may exist, so
/// its id is `<task id>:0:<uuid>`, the UUID (v5) made of the command it answers
/// ([`Answered`]): a worker that reads the command again after a crash, or writes its
/// answer again after a failed write, gives the answer the same id, and a consumer sees
/// the duplicate it is. Without the command (none of Ferry's own writes) a fresh UUID v7.
pub fn cloudevent_id(ev: &ProgressEvent, answers: Option<&Answered>) -> String {
    match (ev.seq, answers) {
        (0, Some(a)) => {
            let name = format!("{}/{}/{}", a.partition, a.offset, a.created_at_ms);
            format!("{}:0:{}", ev.task_id, uuid::Uuid::new_v5(&ANSWER_ID_NAMESPACE, name.as_bytes()).simple())
        }
        (0, None) => format!("{}:0:{}", ev.task_id, uuid::Uuid::now_v7().simple()),
        (seq, _) => format!("{}:{seq}", ev.task_id),
    }
}

/// The CloudEvents headers of `ev`, in order (binary content mode); `ce_id` is
/// [`cloudevent_id`]. `ce_time` is left out only if `at_ms` is not a time.
pub fn cloudevent_headers(ev: &ProgressEvent, answers: Option<&Answered>) -> Vec<(&'static str, String)> {
    let id = cloudevent_id(ev, answers);
    let mut h = vec![
        (CE_SPECVERSION, CLOUDEVENTS_VERSION.to_owned()),
        (CE_ID, id),
        (CE_TYPE, cloudevent_type(ev.event).to_owned()),
        (CE_SOURCE, cloudevent_source(ev.kind)),
        (CE_SUBJECT, ev.subject.clone()),
    ];
    if let Ok(t) = jiff::Timestamp::from_millisecond(ev.at_ms) {
        h.push((CE_TIME, format!("{t:.3}")));
    }
    h.push((CONTENT_TYPE, EVENT_CONTENT_TYPE.to_owned()));
    h
}

/// A record as it arrived, for the dead-letter topic.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// Source topic.
    pub topic: String,
    /// Source partition.
    pub partition: i32,
    /// Source offset.
    pub offset: i64,
    /// Original key.
    pub key: Option<Vec<u8>>,
    /// Original value, byte for byte.
    pub payload: Vec<u8>,
    /// Original headers.
    pub headers: Vec<(String, Vec<u8>)>,
    /// Why it is dead.
    pub reason: String,
}

/// A dead letter's headers: name and bytes, in order.
pub type LetterHeaders = Vec<(String, Vec<u8>)>;

impl DeadLetter {
    /// The letter as produced: key, value and headers cut to fit any topic
    /// ([`crate::limits`]), with the original sizes and the value's SHA-256 in headers
    /// where something was cut, then the reason and where the record came from. A record
    /// of any size becomes a letter that fits; small records keep every byte.
    pub fn fitted(&self) -> (Vec<u8>, Vec<u8>, LetterHeaders) {
        use crate::limits::{DEAD_LETTER_HEAD_BYTES, DEAD_LETTER_HEADERS_BYTES, DEAD_LETTER_KEY_BYTES, REASON_BYTES, truncate};
        use sha2::Digest;
        let mut headers = Vec::new();
        let mut size = 0;
        let mut dropped = 0;
        for (k, v) in &self.headers {
            if size + k.len() + v.len() <= DEAD_LETTER_HEADERS_BYTES {
                size += k.len() + v.len();
                headers.push((k.clone(), v.clone()));
            } else {
                dropped += 1;
            }
        }
        let key = self.key.clone().unwrap_or_default();
        let key = if key.len() > DEAD_LETTER_KEY_BYTES {
            headers.push((DLQ_KEY_BYTES.into(), key.len().to_string().into_bytes()));
            key[..DEAD_LETTER_KEY_BYTES].to_vec()
        } else {
            key
        };
        let payload = if self.payload.len() > DEAD_LETTER_HEAD_BYTES {
            headers.push((DLQ_VALUE_BYTES.into(), self.payload.len().to_string().into_bytes()));
            headers.push((DLQ_VALUE_SHA256.into(), format!("{:x}", sha2::Sha256::digest(&self.payload)).into_bytes()));
            self.payload[..DEAD_LETTER_HEAD_BYTES].to_vec()
        } else {
            self.payload.clone()
        };
        if dropped > 0 {
            headers.push((DLQ_HEADERS_DROPPED.into(), dropped.to_string().into_bytes()));
        }
        headers.push((DLQ_REASON.into(), truncate(&self.reason, REASON_BYTES).as_bytes().to_vec()));
        headers.push((DLQ_TOPIC.into(), self.topic.clone().into_bytes()));
        headers.push((DLQ_PARTITION.into(), self.partition.to_string().into_bytes()));
        headers.push((DLQ_OFFSET.into(), self.offset.to_string().into_bytes()));
        (key, payload, headers)
    }
}

/// A record encoded and ready, produced only once the records before it are durable.
struct Deferred {
    topic: String,
    key: Vec<u8>,
    payload: Vec<u8>,
    headers: OwnedHeaders,
}

/// Acknowledgements still to come for records already handed to the producer, and events
/// to produce once those are acknowledged: a task's event n goes out only after its
/// snapshot n is durable, so no event is ever durable without its snapshot (a task
/// resumed from the snapshot never reuses a seq).
#[must_use = "await the acknowledgements before treating the records as durable"]
pub struct Pending {
    futures: Vec<(String, DeliveryFuture)>,
    deferred: Vec<Deferred>,
    producer: Option<FutureProducer>,
    /// Snapshots among the records, for the local view once they are acknowledged.
    own: Vec<TaskSnapshot>,
    view: Option<Arc<StateView>>,
    /// The events among the records, in order: what a caller makes again with the task's
    /// newest snapshot when these writes fail ([`Self::events`]).
    events: Vec<Outgoing>,
}

/// Hands a record to the producer, waiting while its local queue is full.
fn send_record(producer: &FutureProducer, topic: &str, key: &[u8], payload: &[u8], headers: OwnedHeaders) -> Result<DeliveryFuture, PublishError> {
    let mut record = FutureRecord::to(topic).key(key).payload(payload).headers(headers);
    loop {
        match producer.send_result(record) {
            Ok(f) => return Ok(f),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                // The local queue drains as the broker acknowledges; serve callbacks meanwhile.
                producer.poll(Duration::from_millis(10));
                record = r;
            }
            Err((source, _)) => return Err(PublishError::Produce { topic: topic.to_owned(), source }),
        }
    }
}

async fn acknowledged(futures: Vec<(String, DeliveryFuture)>) -> Result<(), PublishError> {
    try_join_all(futures.into_iter().map(|(topic, f)| async move {
        match f.await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err((source, _))) => Err(PublishError::Produce { topic, source }),
            Err(_) => Err(PublishError::Dropped { topic }),
        }
    }))
    .await
    .map(|_| ())
}

impl Pending {
    fn none() -> Self {
        Self { futures: Vec::new(), deferred: Vec::new(), producer: None, own: Vec::new(), view: None, events: Vec::new() }
    }

    /// Hands the acknowledged snapshots to the local view: it holds what is durable, never
    /// a write that may have failed (a worker that took its partition back once republished
    /// the final event of a snapshot the broker never acknowledged, and left the task
    /// `Reverting` on the topic for good).
    fn into_view(own: Vec<TaskSnapshot>, view: Option<Arc<StateView>>) {
        if let Some(view) = view {
            for snap in own {
                view.apply_own(snap);
            }
        }
    }

    /// Adds another batch of acknowledgements (and its deferred events).
    pub fn extend(&mut self, other: Pending) {
        self.futures.extend(other.futures);
        self.deferred.extend(other.deferred);
        self.own.extend(other.own);
        self.events.extend(other.events);
        if self.producer.is_none() {
            self.producer = other.producer;
        }
        if self.view.is_none() {
            self.view = other.view;
        }
    }

    /// The events among these records, in the order they were handed over.
    pub(crate) fn events(&self) -> &[Outgoing] {
        &self.events
    }

    /// Waits until the broker acknowledged every record (acks=all), then produces the
    /// deferred events and waits for them too.
    pub async fn durable(self) -> Result<(), PublishError> {
        acknowledged(self.futures).await?;
        Self::into_view(self.own, self.view);
        let Some(producer) = self.producer else { return Ok(()) };
        let mut then = Vec::with_capacity(self.deferred.len());
        for d in self.deferred {
            then.push((d.topic.clone(), send_record(&producer, &d.topic, &d.key, &d.payload, d.headers)?));
        }
        acknowledged(then).await
    }
}

/// A task's events handed to the producer and not yet acknowledged, and events held for
/// the next snapshot ([`Publisher::transition`], [`Publisher::hold`]).
#[derive(Default)]
pub struct InFlight {
    sent: Vec<(ProgressEvent, DeliveryFuture)>,
    held: Vec<ProgressEvent>,
    /// The task's fence: once it falls (the partition went), no event of a snapshot
    /// acknowledged before is produced any more.
    fence: Option<tokio_util::sync::CancellationToken>,
}

impl InFlight {
    /// For a task that `fence` stops.
    pub fn fenced_by(fence: tokio_util::sync::CancellationToken) -> Self {
        Self { fence: Some(fence), ..Self::default() }
    }
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight")
            .field("sent", &self.sent.iter().map(|(e, _)| e.seq).collect::<Vec<_>>())
            .field("held", &self.held.iter().map(|e| e.seq).collect::<Vec<_>>())
            .finish()
    }
}

/// The producer side of a worker: snapshots, events and dead letters.
pub struct Publisher {
    producer: FutureProducer,
    topics: Topics,
    registry: Arc<Registry>,
    worker: String,
    view: Arc<StateView>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher").field("worker", &self.worker).finish()
    }
}

impl Publisher {
    pub(crate) fn new(
        producer: FutureProducer,
        topics: Topics,
        registry: Arc<Registry>,
        worker: String,
        view: Arc<StateView>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self { producer, topics, registry, worker, view, metrics }
    }

    /// This worker's instance name.
    pub fn worker(&self) -> &str {
        &self.worker
    }

    /// The worker's task-state view, which this publisher writes through to.
    pub(crate) fn view(&self) -> &StateView {
        &self.view
    }

    fn headers(task: &str, trace: Option<&str>) -> OwnedHeaders {
        let h = OwnedHeaders::new().insert(Header { key: TASK_HEADER, value: Some(task) });
        match trace {
            Some(t) => h.insert(Header { key: TRACEPARENT, value: Some(t) }),
            None => h,
        }
    }

    /// A progress event's headers: [`Self::headers`] and the CloudEvents attributes
    /// ([`cloudevent_headers`]). Every event Ferry writes goes through here.
    fn event_headers(ev: &ProgressEvent, answers: Option<&Answered>) -> OwnedHeaders {
        let mut h = Self::headers(&ev.task_id, ev.trace_parent.as_deref());
        for (key, value) in cloudevent_headers(ev, answers) {
            h = h.insert(Header { key, value: Some(&value) });
        }
        h
    }

    fn send(&self, topic: &str, key: &[u8], payload: &[u8], headers: OwnedHeaders) -> Result<DeliveryFuture, PublishError> {
        send_record(&self.producer, topic, key, payload, headers)
    }

    /// Encodes a task's record and hands it to the producer, keyed by the task id.
    fn enqueue_record<T: serde::Serialize + apache_avro::AvroSchema + 'static>(
        &self,
        topic: &str,
        record: &'static str,
        value: &T,
        task: &str,
        headers: OwnedHeaders,
    ) -> Result<Pending, PublishError> {
        let bytes = self.registry.encode(value).map_err(|source| PublishError::Encode { record, task: task.to_owned(), source })?;
        let f = self.send(topic, task.as_bytes(), &bytes, headers)?;
        Ok(Pending { futures: vec![(topic.to_owned(), f)], ..Pending::none() })
    }

    /// Hands the snapshot to the producer (and to the local view once acknowledged).
    pub fn enqueue_snapshot(&self, snap: &TaskSnapshot) -> Result<Pending, PublishError> {
        let topic = &self.topics.task_state(snap.kind).name;
        let seq = snap.seq.to_string();
        let headers = Self::headers(&snap.task_id, snap.trace_parent.as_deref()).insert(Header { key: SEQ_HEADER, value: Some(&seq) });
        let mut p = self.enqueue_record(topic, "TaskSnapshot", snap, &snap.task_id, headers)?;
        p.own.push(snap.clone());
        p.view = Some(self.view.clone());
        Ok(p)
    }

    /// Hands one event to the producer without touching any snapshot (the answer to a
    /// command that leaves its task as it was, with seq 0 and the command it answers; a
    /// final event published again): to `ferry.progress`, and to the tenant's progress
    /// topic when `requested_by` is a tenant's principal.
    pub fn enqueue_event(&self, ev: Outgoing, requested_by: &str) -> Result<Pending, PublishError> {
        let sent = self.send_event(&ev.event, ev.answers.as_ref(), requested_by)?;
        Ok(Pending { events: vec![ev], ..sent })
    }

    /// [`Self::enqueue_event`] without keeping a copy of the event in the [`Pending`]: for
    /// a new task's Accepted (every task's, on the hot path), which is never written again
    /// from a `Pending` (its command is read again instead).
    fn send_event(&self, ev: &ProgressEvent, answers: Option<&Answered>, requested_by: &str) -> Result<Pending, PublishError> {
        let mut futures = Vec::with_capacity(2);
        for d in self.deferred_event(ev, answers, requested_by)? {
            let f = self.send(&d.topic, &d.key, &d.payload, d.headers)?;
            futures.push((d.topic, f));
        }
        Ok(Pending { futures, ..Pending::none() })
    }

    /// Advances the snapshot by one event (seq + 1, state as already set by the caller)
    /// and returns that event.
    pub(crate) fn advance(&self, snap: &mut TaskSnapshot, event: EventType, d: Detail) -> ProgressEvent {
        snap.seq += 1;
        snap.last_event = event;
        snap.updated_at_ms = now_ms();
        snap.worker = self.worker.clone();
        d.into_event((&snap.task_id, snap.kind, &snap.subject), snap.seq, event, &self.worker, snap.updated_at_ms, snap.trace_parent.clone())
    }

    /// Hands the snapshot to the producer, and its event to produce once the snapshot is
    /// durable ([`Pending::durable`]).
    pub fn enqueue_write(&self, snap: &TaskSnapshot, ev: ProgressEvent) -> Result<Pending, PublishError> {
        self.write_all(snap, vec![ev.into()])
    }

    /// [`Self::enqueue_write`] with several events of the snapshot's task, produced in
    /// order once the snapshot is durable (a paused write whose previous event was not
    /// acknowledged either).
    pub fn enqueue_write_all(&self, snap: &TaskSnapshot, evs: &[Outgoing]) -> Result<Pending, PublishError> {
        self.write_all(snap, evs.to_vec())
    }

    fn write_all(&self, snap: &TaskSnapshot, evs: Vec<Outgoing>) -> Result<Pending, PublishError> {
        let mut deferred = Vec::with_capacity(evs.len());
        for ev in &evs {
            deferred.extend(self.deferred_event(&ev.event, ev.answers.as_ref(), &snap.requested_by)?);
        }
        let mut p = self.enqueue_snapshot(snap)?;
        p.deferred = deferred;
        p.producer = Some(self.producer.clone());
        for ev in &evs {
            self.metrics.written(snap, &ev.event);
        }
        p.events = evs;
        Ok(p)
    }

    /// The records of one event: on `ferry.progress`, and on the tenant's progress topic
    /// when the task is a tenant's (`requested_by`, the principal the intake set), so that
    /// a tenant reads its own tasks' events and no one else's. Every event goes through
    /// here, deferred or not.
    fn deferred_event(&self, ev: &ProgressEvent, answers: Option<&Answered>, requested_by: &str) -> Result<Vec<Deferred>, PublishError> {
        let bytes = self.registry.encode(ev).map_err(|source| PublishError::Encode { record: "ProgressEvent", task: ev.task_id.clone(), source })?;
        let record = |topic: String, payload: Vec<u8>| Deferred { topic, key: ev.task_id.as_bytes().to_vec(), payload, headers: Self::event_headers(ev, answers) };
        Ok(match crate::tenants::tenant_of(requested_by) {
            Some(tenant) => vec![record(self.topics.progress().name.clone(), bytes.clone()), record(self.topics.tenant_progress_name(tenant), bytes)],
            None => vec![record(self.topics.progress().name.clone(), bytes)],
        })
    }

    /// A new task's Accepted write: the snapshot (seq 1) and the Accepted event handed to the
    /// producer together, acknowledged in one round instead of two (docs/PROTOCOL.md, the
    /// one exception to "an event after its snapshot"). Safe because this event is the
    /// command's and nothing else's: the command's offset is committed only once both are
    /// durable, so until then any worker reads the command again and writes the same seq 1
    /// Accepted (readers dedupe by task and seq) with its snapshot, and no other event can
    /// take seq 1. A reader may see the event a moment before the snapshot.
    pub fn enqueue_accepted(&self, snap: &TaskSnapshot, ev: &ProgressEvent) -> Result<Pending, PublishError> {
        debug_assert!(ev.seq == 1 && ev.event == EventType::Accepted, "only a task's opening Accepted goes with its snapshot");
        let mut p = self.enqueue_snapshot(snap)?;
        p.extend(self.send_event(ev, None, &snap.requested_by)?);
        self.metrics.written(snap, ev);
        Ok(p)
    }

    /// Advances the snapshot by one event (seq + 1, state as already set by the caller),
    /// hands the snapshot to the producer and defers the event until the snapshot is
    /// durable.
    pub fn enqueue_transition(&self, snap: &mut TaskSnapshot, event: EventType, d: Detail) -> Result<Pending, PublishError> {
        let ev = self.advance(snap, event, d);
        self.enqueue_write(snap, ev)
    }

    /// A task's transition, pipelined: the snapshot is produced and acknowledged together
    /// with the task's events still in flight, then this transition's event (after any
    /// held ones, [`Self::hold`]) is produced and left in flight, its acknowledgement
    /// awaited with the next transition's snapshot or by [`Self::finish`]. One
    /// acknowledgement round per transition instead of two, and an event still never goes
    /// out before a snapshot at least as far is durable. On failure the error carries the
    /// events to write again after the snapshot (same seqs) before the task goes on.
    pub async fn transition(&self, snap: &mut TaskSnapshot, event: EventType, d: Detail, in_flight: &mut InFlight) -> Result<(), PublishError> {
        let ev = self.advance(snap, event, d);
        in_flight.held.push(ev);
        self.write_held(snap, in_flight).await
    }

    /// Advances the snapshot by one event without writing it: the event goes out with the
    /// next transition's snapshot, which covers both (a step's StepSucceeded and the next
    /// step's StepStarted: nothing happens between them, so one snapshot and one
    /// acknowledgement round serve both). The caller must make another transition or call
    /// [`Self::finish`] before anything else happens.
    pub fn hold(&self, snap: &mut TaskSnapshot, event: EventType, d: Detail, in_flight: &mut InFlight) {
        let ev = self.advance(snap, event, d);
        in_flight.held.push(ev);
    }

    /// Writes the snapshot (as it stands) and then the held events, acknowledging the
    /// events in flight together with the snapshot.
    async fn write_held(&self, snap: &TaskSnapshot, in_flight: &mut InFlight) -> Result<(), PublishError> {
        let mut held = std::mem::take(&mut in_flight.held);
        let Some(last) = held.pop() else { return Ok(()) };
        let sent = std::mem::take(&mut in_flight.sent);
        let fail = |mut before: Vec<ProgressEvent>, held: Vec<ProgressEvent>, ev: ProgressEvent, source| {
            before.extend(held);
            PublishError::Transition { event: Box::new(ev), before, source: Box::new(source) }
        };
        let encoded = held.iter().chain(Some(&last)).map(|e| self.deferred_event(e, None, &snap.requested_by)).collect::<Result<Vec<_>, _>>();
        let snapshot = encoded.and_then(|enc| self.enqueue_snapshot(snap).map(|p| (enc, p)));
        let (encoded, snapshot) = match snapshot {
            Ok(x) => x,
            Err(e) => return Err(fail(sent.into_iter().map(|(e, _)| e).collect(), held, last, e)),
        };
        let progress = self.topics.progress().name.clone();
        let (acked, previous) = futures::join!(acknowledged(snapshot.futures), Self::settle_each(sent, &progress));
        if acked.is_ok() {
            Pending::into_view(snapshot.own, snapshot.view);
        }
        match (acked, previous) {
            (Ok(()), Ok(())) => {}
            (Err(e), Ok(())) => return Err(fail(Vec::new(), held, last, e)),
            (_, Err((failed, e))) => return Err(fail(failed, held, last, e)),
        }
        // The snapshot was acknowledged, but the task may have been fenced while it waited
        // (its partition revoked with the write stuck in the producer): its next owner
        // may have read the task before this snapshot and write these seqs itself. Leave
        // them to it (a reader may see a gap, never two events with one seq).
        if in_flight.fence.as_ref().is_some_and(tokio_util::sync::CancellationToken::is_cancelled) {
            return Err(PublishError::Fenced { task: snap.task_id.clone() });
        }
        let events: Vec<ProgressEvent> = held.into_iter().chain(Some(last)).collect();
        for (i, (ev, records)) in events.iter().zip(encoded).enumerate() {
            for d in records {
                match send_record(&self.producer, &d.topic, &d.key, &d.payload, d.headers) {
                    // One entry per record: the event is written when all of its are.
                    Ok(f) => in_flight.sent.push((ev.clone(), f)),
                    Err(e) => {
                        // Those handed over stay in flight; this one and the rest are made
                        // again (a tenant's copy, too: readers dedupe by task and seq).
                        let mut rest = events[i..].to_vec();
                        let last = rest.pop().expect("at least this event");
                        return Err(fail(Vec::new(), rest, last, e));
                    }
                }
            }
            self.metrics.written(snap, ev);
        }
        Ok(())
    }

    /// Awaits the events in flight; the failed ones (in order) with the first error.
    async fn settle_each(sent: Vec<(ProgressEvent, DeliveryFuture)>, topic: &str) -> Result<(), (Vec<ProgressEvent>, PublishError)> {
        let results = futures::future::join_all(sent.into_iter().map(|(ev, f)| async move { (ev, acknowledged(vec![(topic.to_owned(), f)]).await) })).await;
        let mut failed: Vec<ProgressEvent> = Vec::new();
        let mut first = None;
        for (ev, r) in results {
            // An event's records are adjacent: both failing make it one to write again.
            if let Err(e) = r
                && failed.last().is_none_or(|f| f.seq != ev.seq || f.task_id != ev.task_id)
            {
                failed.push(ev);
                first.get_or_insert(e);
            }
        }
        match first {
            None => Ok(()),
            Some(e) => Err((failed, e)),
        }
    }

    /// Writes what is held and waits for every event in flight: before a runner hands its
    /// task back, so that whatever the scheduler writes for the task next comes after.
    pub async fn finish(&self, snap: &TaskSnapshot, in_flight: &mut InFlight) -> Result<(), PublishError> {
        if !in_flight.held.is_empty() {
            self.write_held(snap, in_flight).await?;
        }
        let sent = std::mem::take(&mut in_flight.sent);
        let progress = self.topics.progress().name.clone();
        Self::settle_each(sent, &progress).await.map_err(|(mut failed, e)| {
            let last = failed.pop().expect("a failed event");
            PublishError::Transition { event: Box::new(last), before: failed, source: Box::new(e) }
        })
    }

    /// Hands a dead letter to the producer: original key, bytes and headers (cut to fit,
    /// see [`DeadLetter::fitted`]), plus the reason and where the record came from.
    pub fn enqueue_dead_letter(&self, dl: &DeadLetter) -> Result<Pending, PublishError> {
        let (key, payload, headers) = dl.fitted();
        let mut h = OwnedHeaders::new();
        for (k, v) in &headers {
            h = h.insert(Header { key: k, value: Some(v.as_slice()) });
        }
        let topic = &self.topics.dead_letter().name;
        let f = self.send(topic, &key, &payload, h)?;
        self.metrics.dead_letter(&dl.topic);
        Ok(Pending { futures: vec![(topic.clone(), f)], ..Pending::none() })
    }

    /// Nothing to wait for.
    pub fn nothing() -> Pending {
        Pending::none()
    }

    /// Drops every record not yet acknowledged (queued or in flight; their waits fail):
    /// when the assignment is lost, another worker owns these tasks, and a write of ours
    /// landing after its writes would give one seq two events.
    pub(crate) fn purge_unacknowledged(&self) {
        self.producer.purge(rdkafka::producer::PurgeConfig::default().queue().inflight());
    }

    /// Flushes the producer (shutdown).
    pub fn flush(&self, timeout: Duration) {
        let _ = self.producer.flush(timeout);
    }
}

/// True when nothing more happens to the task without a new command.
pub fn settled(snap: &TaskSnapshot) -> bool {
    snap.state.is_terminal() && !snap.revert_requested && !(snap.cancel_requested && snap.state != TaskState::Cancelled)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{DEAD_LETTER_HEAD_BYTES, DEAD_LETTER_KEY_BYTES, RECORD_BYTES};

    fn header<'a>(h: &'a [(String, Vec<u8>)], key: &str) -> Option<&'a str> {
        h.iter().find(|(k, _)| k == key).map(|(_, v)| std::str::from_utf8(v).unwrap())
    }

    fn event(seq: i64, event: EventType) -> ProgressEvent {
        // 2026-01-02T03:04:05.678Z
        Detail::step(1, "install").into_event(("tsk_0190f1a2b3c4d5e6f708192a3b4c5d6e", TaskKind::DEPLOY, "shop/web"), seq, event, "ferry-deploy-0", 1_767_323_045_678, None)
    }

    #[test]
    fn an_event_carries_the_cloudevents_attributes_as_headers() {
        let h = cloudevent_headers(&event(5, EventType::StepSucceeded), None);
        let expected = [
            (CE_SPECVERSION, "1.0"),
            (CE_ID, "tsk_0190f1a2b3c4d5e6f708192a3b4c5d6e:5"),
            (CE_TYPE, "io.ferry.task.step_succeeded"),
            (CE_SOURCE, "/ferry/workers/deploy"),
            (CE_SUBJECT, "shop/web"),
            (CE_TIME, "2026-01-02T03:04:05.678Z"),
            (CONTENT_TYPE, "application/avro"),
        ];
        assert_eq!(h.iter().map(|(k, v)| (*k, v.as_str())).collect::<Vec<_>>(), expected);
        // Whole seconds keep their three digits: one shape for every event.
        let whole = cloudevent_headers(&Detail::default().into_event(("t", TaskKind::TEST, "s"), 1, EventType::Accepted, "w", 0, None), None);
        assert_eq!(whole.iter().find(|(k, _)| *k == CE_TIME).map(|(_, v)| v.as_str()), Some("1970-01-01T00:00:00.000Z"));
    }

    #[test]
    fn every_event_type_has_its_own_cloudevent_type() {
        use apache_avro::AvroSchema;
        let apache_avro::Schema::Enum(avro) = EventType::get_schema() else { panic!("EventType is an Avro enum") };
        let listed: Vec<String> = EVENT_TYPES.iter().map(|e| format!("{e:?}")).collect();
        assert_eq!(listed, avro.symbols, "EVENT_TYPES lists every event type");
        let types: std::collections::HashSet<&str> = EVENT_TYPES.iter().map(|e| cloudevent_type(*e)).collect();
        assert_eq!(types.len(), EVENT_TYPES.len());
        assert!(types.iter().all(|t| t.starts_with("io.ferry.task.") && t.bytes().all(|b| b.is_ascii_lowercase() || b == b'.' || b == b'_')), "{types:?}");
    }

    #[test]
    fn an_event_with_seq_0_is_named_by_the_command_it_answers() {
        let id = |ev: &ProgressEvent, a: Option<&Answered>| cloudevent_headers(ev, a).into_iter().find(|(k, _)| *k == CE_ID).unwrap().1;
        let cancel = Answered { partition: 2, offset: 41, created_at_ms: 1_767_323_045_000 };
        let (a, b) = (id(&event(0, EventType::Rejected), Some(&cancel)), id(&event(0, EventType::Rejected), Some(&Answered { offset: 42, ..cancel })));
        assert_ne!(a, b, "two refused Cancels of one task are two events");
        let uuid = a.strip_prefix("tsk_0190f1a2b3c4d5e6f708192a3b4c5d6e:0:").unwrap_or_else(|| panic!("{a}"));
        assert_eq!(uuid::Uuid::parse_str(uuid).map(|u| u.get_version_num()).ok(), Some(5), "{a}");
        // The same command answered again, by another worker, later: the same event.
        let mut again = event(0, EventType::Rejected);
        (again.worker, again.at_ms) = ("ferry-deploy-1".into(), again.at_ms + 60_000);
        assert_eq!(id(&again, Some(&cancel)), a, "a command answered again keeps its answer's id");
        // A topic made anew starts its offsets again; its commands are other commands.
        assert_ne!(id(&event(0, EventType::Rejected), Some(&Answered { created_at_ms: 1_767_400_000_000, ..cancel })), a);
        assert_ne!(id(&event(0, EventType::Rejected), None), id(&event(0, EventType::Rejected), None), "no command: a fresh id each time");
        assert_eq!(id(&event(3, EventType::Rejected), None), id(&event(3, EventType::Rejected), Some(&cancel)), "a seq names a task's event by itself");
        assert_eq!(id(&event(3, EventType::Rejected), None), "tsk_0190f1a2b3c4d5e6f708192a3b4c5d6e:3", "a re-sent event keeps its id");
    }

    #[test]
    fn a_small_record_keeps_every_byte() {
        let dl = DeadLetter {
            topic: "t".into(),
            partition: 2,
            offset: 7,
            key: Some(b"k".to_vec()),
            payload: b"garbage".to_vec(),
            headers: vec![("traceparent".into(), b"00-x".to_vec())],
            reason: "bad".into(),
        };
        let (key, payload, h) = dl.fitted();
        assert_eq!((key.as_slice(), payload.as_slice()), (&b"k"[..], &b"garbage"[..]));
        assert_eq!(header(&h, "traceparent"), Some("00-x"));
        assert_eq!(header(&h, DLQ_REASON), Some("bad"));
        assert_eq!(header(&h, DLQ_OFFSET), Some("7"));
        assert_eq!(header(&h, DLQ_VALUE_BYTES), None);
    }

    #[test]
    fn a_record_of_any_size_becomes_a_letter_that_fits() {
        use sha2::Digest;
        let payload: Vec<u8> = (0..RECORD_BYTES).map(|i| (i % 251) as u8).collect();
        let dl = DeadLetter {
            topic: "t".into(),
            partition: 0,
            offset: 1,
            key: Some(vec![b'k'; 100_000]),
            payload: payload.clone(),
            headers: (0..1000).map(|i| (format!("h{i}"), vec![b'v'; 1000])).collect(),
            reason: "r".repeat(100_000),
        };
        let (key, head, h) = dl.fitted();
        let size = key.len() + head.len() + h.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
        assert!(size < RECORD_BYTES / 4, "{size} bytes");
        assert_eq!(head, payload[..DEAD_LETTER_HEAD_BYTES]);
        assert_eq!(key.len(), DEAD_LETTER_KEY_BYTES);
        assert_eq!(header(&h, DLQ_VALUE_BYTES), Some(&*RECORD_BYTES.to_string()));
        assert_eq!(header(&h, DLQ_VALUE_SHA256), Some(&*format!("{:x}", sha2::Sha256::digest(&payload))));
        assert_eq!(header(&h, DLQ_KEY_BYTES), Some("100000"));
        assert!(header(&h, DLQ_HEADERS_DROPPED).is_some());
        assert_eq!(header(&h, DLQ_REASON).unwrap().len(), crate::limits::REASON_BYTES);
    }
}

//! Writes a task's snapshot and then its event, so every published event has a durable
//! snapshot with a sequence number at least as high (a resumed task never reuses a seq).

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
/// Dead-letter headers.
pub const DLQ_REASON: &str = "ferry-dlq-reason";
/// Topic the dead record came from.
pub const DLQ_TOPIC: &str = "ferry-dlq-topic";
/// Partition the dead record came from.
pub const DLQ_PARTITION: &str = "ferry-dlq-partition";
/// Offset of the dead record.
pub const DLQ_OFFSET: &str = "ferry-dlq-offset";

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

    /// With a message.
    pub fn message(mut self, m: impl Into<String>) -> Self {
        self.message = Some(m.into());
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

/// Acknowledgements still to come for records already handed to the producer.
#[must_use = "await the acknowledgements before treating the records as durable"]
pub struct Pending {
    futures: Vec<(String, DeliveryFuture)>,
}

impl Pending {
    fn none() -> Self {
        Self { futures: Vec::new() }
    }

    /// Adds another batch of acknowledgements.
    pub fn extend(&mut self, other: Pending) {
        self.futures.extend(other.futures);
    }

    /// Waits until the broker acknowledged every record (acks=all).
    pub async fn durable(self) -> Result<(), PublishError> {
        try_join_all(self.futures.into_iter().map(|(topic, f)| async move {
            match f.await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err((source, _))) => Err(PublishError::Produce { topic, source }),
                Err(_) => Err(PublishError::Dropped { topic }),
            }
        }))
        .await
        .map(|_| ())
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

    fn headers(task: &str, trace: Option<&str>) -> OwnedHeaders {
        let h = OwnedHeaders::new().insert(Header { key: TASK_HEADER, value: Some(task) });
        match trace {
            Some(t) => h.insert(Header { key: TRACEPARENT, value: Some(t) }),
            None => h,
        }
    }

    fn send(&self, topic: &str, key: &[u8], payload: &[u8], headers: OwnedHeaders) -> Result<DeliveryFuture, PublishError> {
        let mut record = FutureRecord::to(topic).key(key).payload(payload).headers(headers);
        loop {
            match self.producer.send_result(record) {
                Ok(f) => return Ok(f),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    // The local queue drains as the broker acknowledges; serve callbacks meanwhile.
                    self.producer.poll(Duration::from_millis(10));
                    record = r;
                }
                Err((source, _)) => return Err(PublishError::Produce { topic: topic.to_owned(), source }),
            }
        }
    }

    /// Encodes a task's record and hands it to the producer, keyed by the task id.
    fn enqueue_record<T: serde::Serialize + apache_avro::AvroSchema + 'static>(
        &self,
        topic: &str,
        record: &'static str,
        value: &T,
        task: &str,
        trace: Option<&str>,
    ) -> Result<Pending, PublishError> {
        let bytes = self.registry.encode(value).map_err(|source| PublishError::Encode { record, task: task.to_owned(), source })?;
        let f = self.send(topic, task.as_bytes(), &bytes, Self::headers(task, trace))?;
        Ok(Pending { futures: vec![(topic.to_owned(), f)] })
    }

    /// Hands the snapshot to the producer (and to the local view).
    pub fn enqueue_snapshot(&self, snap: &TaskSnapshot) -> Result<Pending, PublishError> {
        let topic = &self.topics.task_state().name;
        let p = self.enqueue_record(topic, "TaskSnapshot", snap, &snap.task_id, snap.trace_parent.as_deref())?;
        self.view.apply(snap.clone());
        Ok(p)
    }

    /// Hands one event to the producer without touching any snapshot (for commands that
    /// name no known task, and final events published again).
    pub fn enqueue_event(&self, ev: &ProgressEvent) -> Result<Pending, PublishError> {
        let topic = &self.topics.progress().name;
        self.enqueue_record(topic, "ProgressEvent", ev, &ev.task_id, ev.trace_parent.as_deref())
    }

    /// Advances the snapshot by one event (seq + 1, state as already set by the caller),
    /// and hands snapshot then event to the producer.
    pub fn enqueue_transition(&self, snap: &mut TaskSnapshot, event: EventType, d: Detail) -> Result<Pending, PublishError> {
        snap.seq += 1;
        snap.last_event = event;
        snap.updated_at_ms = now_ms();
        snap.worker = self.worker.clone();
        let ev = d.into_event(
            (&snap.task_id, snap.kind, &snap.subject),
            snap.seq,
            event,
            &self.worker,
            snap.updated_at_ms,
            snap.trace_parent.clone(),
        );
        let mut p = self.enqueue_snapshot(snap)?;
        p.extend(self.enqueue_event(&ev)?);
        self.metrics.event(snap.kind, event);
        Ok(p)
    }

    /// [`Self::enqueue_transition`], waiting until snapshot and event are durable.
    pub async fn transition(&self, snap: &mut TaskSnapshot, event: EventType, d: Detail) -> Result<(), PublishError> {
        self.enqueue_transition(snap, event, d)?.durable().await
    }

    /// Hands a dead letter to the producer: original key, bytes and headers, plus reasons.
    pub fn enqueue_dead_letter(&self, dl: &DeadLetter) -> Result<Pending, PublishError> {
        let mut h = OwnedHeaders::new();
        for (k, v) in &dl.headers {
            h = h.insert(Header { key: k, value: Some(v.as_slice()) });
        }
        let partition = dl.partition.to_string();
        let offset = dl.offset.to_string();
        h = h
            .insert(Header { key: DLQ_REASON, value: Some(&dl.reason) })
            .insert(Header { key: DLQ_TOPIC, value: Some(&dl.topic) })
            .insert(Header { key: DLQ_PARTITION, value: Some(&partition) })
            .insert(Header { key: DLQ_OFFSET, value: Some(&offset) });
        let topic = &self.topics.dead_letter().name;
        let key = dl.key.clone().unwrap_or_default();
        let f = self.send(topic, &key, &dl.payload, h)?;
        self.metrics.dead_letter(&dl.topic);
        Ok(Pending { futures: vec![(topic.clone(), f)] })
    }

    /// Nothing to wait for.
    pub fn nothing() -> Pending {
        Pending::none()
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

//! The command consumer: a thread that polls the kind's command topic in a consumer group,
//! decodes and validates records, hands them to the scheduler in batches, and stores each
//! offset only after the scheduler says the batch's records are durable (at-least-once,
//! in order). Rebalance callbacks block until the scheduler has handed tasks over.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers};
use rdkafka::{Message, TopicPartitionList};
use tokio::sync::{mpsc, oneshot};

use crate::ids::TaskId;
use crate::kafka::KafkaConfig;
use crate::kind::TaskKind;
use crate::limits;
use crate::protocol::{CommandAction, CommandEnvelope};
use crate::publisher::{DeadLetter, TRACEPARENT};
use crate::scheduler::{Incoming, SchedMsg, What};
use crate::step::TaskHandler;
use crate::wire::Registry;

/// Largest batch handed to the scheduler at once.
const MAX_BATCH: usize = 500;

/// Why the intake stopped.
#[derive(Debug, thiserror::Error)]
pub enum IntakeError {
    /// The consumer could not be created or subscribed.
    #[error("command consumer for {topic}: {source}")]
    Consumer {
        /// The topic.
        topic: String,
        /// Cause.
        #[source]
        source: Box<KafkaError>,
    },
    /// Accepted records could not be made durable; the intake stops without storing
    /// their offsets, so they are read again.
    #[error("records from {topic} could not be made durable: {source}")]
    Durability {
        /// The topic.
        topic: String,
        /// Cause.
        #[source]
        source: Box<crate::publisher::PublishError>,
    },
}

/// Why a decoded command is too big to become a task, if it is: the record over
/// [`limits::COMMAND_BYTES`] (its snapshot must fit on the task-state topic), or a name
/// over its limit.
fn oversized(record_bytes: usize, env: &CommandEnvelope) -> Option<String> {
    if record_bytes > limits::COMMAND_BYTES {
        return Some(format!(
            "the command record is {record_bytes} bytes; a command may be at most {} bytes (its task's snapshot carries the spec)",
            limits::COMMAND_BYTES
        ));
    }
    let names = [
        ("subject", Some(&env.subject), limits::SUBJECT_BYTES),
        ("requested_by", Some(&env.requested_by), limits::NAME_BYTES),
        ("idempotency_key", env.idempotency_key.as_ref(), limits::NAME_BYTES),
        ("reason", env.reason.as_ref(), limits::REASON_BYTES),
    ];
    names
        .into_iter()
        .find_map(|(what, value, max)| value.filter(|v| v.len() > max).map(|v| format!("{what} is {} bytes; the limit is {max}", v.len())))
}

/// The envelope as a rejection echoes it: names cut to their limits, an idempotency key
/// over its limit dropped (a cut key could match another task's), no spec.
fn bounded(env: &CommandEnvelope) -> CommandEnvelope {
    let cut = |s: &str, max| limits::truncate(s, max).to_owned();
    CommandEnvelope {
        task_id: env.task_id.clone(),
        kind: env.kind,
        action: env.action,
        subject: cut(&env.subject, limits::SUBJECT_BYTES),
        idempotency_key: env.idempotency_key.clone().filter(|k| k.len() <= limits::NAME_BYTES),
        requested_by: cut(&env.requested_by, limits::NAME_BYTES),
        created_at_ms: env.created_at_ms,
        deadline_ms: env.deadline_ms,
        keep_partial: env.keep_partial,
        reason: env.reason.as_deref().map(|r| cut(r, limits::REASON_BYTES)),
        spec: crate::protocol::Bytes::default(),
    }
}

pub(crate) struct IntakeContext {
    sched: mpsc::Sender<SchedMsg>,
    ready: Arc<AtomicBool>,
}

fn partitions(tpl: &TopicPartitionList) -> Vec<i32> {
    tpl.elements().iter().map(|e| e.partition()).collect()
}

impl ClientContext for IntakeContext {}

impl ConsumerContext for IntakeContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let (reply, rx) = oneshot::channel();
            let parts = partitions(tpl);
            tracing::info!(partitions = ?parts, "partitions revoked; stopping their tasks");
            let lost = consumer.assignment_lost();
            if self.sched.blocking_send(SchedMsg::Revoked { partitions: parts, lost, reply }).is_ok() {
                let _ = rx.blocking_recv();
            }
            // Offsets stored so far stand for durable work: commit them before letting go.
            match consumer.commit_consumer_state(CommitMode::Sync) {
                Ok(()) | Err(KafkaError::ConsumerCommit(rdkafka::types::RDKafkaErrorCode::NoOffset)) => {}
                Err(e) => tracing::warn!(error = %e, "commit on revoke failed; the next owner may see duplicates"),
            }
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            let (reply, rx) = oneshot::channel();
            let parts = partitions(tpl);
            tracing::info!(partitions = ?parts, "partitions assigned; resuming their tasks");
            if self.sched.blocking_send(SchedMsg::Assigned { partitions: parts, reply }).is_ok() {
                let _ = rx.blocking_recv();
            }
            self.ready.store(true, Ordering::Relaxed);
        }
    }
}

pub(crate) struct Intake<H: TaskHandler> {
    pub consumer: BaseConsumer<IntakeContext>,
    pub topic: String,
    pub kind: TaskKind,
    pub handler: Arc<H>,
    pub registry: Arc<Registry>,
    pub sched: mpsc::Sender<SchedMsg>,
    pub stop: Arc<AtomicBool>,
}

impl<H: TaskHandler> Intake<H> {
    #[allow(clippy::too_many_arguments)] // one call site, in Worker::run
    pub(crate) fn new(
        kafka: &KafkaConfig,
        group: &str,
        topic: &str,
        handler: Arc<H>,
        registry: Arc<Registry>,
        sched: mpsc::Sender<SchedMsg>,
        stop: Arc<AtomicBool>,
        ready: Arc<AtomicBool>,
    ) -> Result<Self, IntakeError> {
        let err = |source| IntakeError::Consumer { topic: topic.to_owned(), source: Box::new(source) };
        let ctx = IntakeContext { sched: sched.clone(), ready };
        let consumer: BaseConsumer<IntakeContext> = kafka.group_consumer(group).create_with_context(ctx).map_err(err)?;
        consumer.subscribe(&[topic]).map_err(err)?;
        let kind = handler.kind();
        Ok(Self { consumer, topic: topic.to_owned(), kind, handler, registry, sched, stop })
    }

    /// Polls until told to stop; then commits stored offsets and leaves the group.
    pub(crate) fn run(self) -> Result<(), IntakeError> {
        let result = self.poll_loop();
        // Leaving the group revokes our partitions (the callback stops their tasks).
        self.consumer.unsubscribe();
        let _ = self.consumer.commit_consumer_state(CommitMode::Sync);
        result
    }

    fn poll_loop(&self) -> Result<(), IntakeError> {
        while !self.stop.load(Ordering::Relaxed) {
            let Some(first) = self.consumer.poll(Duration::from_millis(100)) else { continue };
            let mut batch = Vec::new();
            let mut offsets = Vec::new();
            let mut next = Some(first);
            while let Some(r) = next.take() {
                match r {
                    Ok(m) => {
                        offsets.push((m.partition(), m.offset()));
                        batch.push(self.classify(&m));
                    }
                    Err(e) => tracing::warn!(topic = %self.topic, error = %e, "command consumer error"),
                }
                if batch.len() < MAX_BATCH {
                    next = self.consumer.poll(Duration::ZERO);
                }
            }
            if batch.is_empty() {
                continue;
            }
            let (reply, rx) = oneshot::channel();
            if self.sched.blocking_send(SchedMsg::Batch { items: batch, reply }).is_err() {
                return Ok(());
            }
            let skipped = match rx.blocking_recv() {
                Ok(Ok(skipped)) => skipped,
                Ok(Err(source)) => return Err(IntakeError::Durability { topic: self.topic.clone(), source: Box::new(source) }),
                Err(_) => return Ok(()),
            };
            for (p, o) in offsets.into_iter().filter(|(p, _)| !skipped.contains(p)) {
                // Fails only for partitions revoked meanwhile; their new owner reads them again.
                if let Err(e) = self.consumer.store_offset(&self.topic, p, o) {
                    tracing::debug!(partition = p, offset = o, error = %e, "offset not stored");
                }
            }
        }
        Ok(())
    }

    fn classify(&self, m: &BorrowedMessage<'_>) -> Incoming {
        let headers: Vec<(String, Vec<u8>)> = m
            .headers()
            .map(|hs| hs.iter().map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec())).collect())
            .unwrap_or_default();
        let trace_parent = headers
            .iter()
            .find(|(k, _)| k == TRACEPARENT)
            .and_then(|(_, v)| String::from_utf8(v.clone()).ok());
        let dead = |reason: String| DeadLetter {
            topic: self.topic.clone(),
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(<[u8]>::to_vec),
            payload: m.payload().unwrap_or_default().to_vec(),
            headers: headers.clone(),
            reason,
        };
        let what = self.check(m, &dead);
        Incoming { partition: m.partition(), offset: m.offset(), trace_parent, what }
    }

    fn check(&self, m: &BorrowedMessage<'_>, dead: &dyn Fn(String) -> DeadLetter) -> What {
        let Some(payload) = m.payload() else {
            return What::DeadLetter(dead("empty record: no command envelope".into()));
        };
        let env: CommandEnvelope = match self.registry.decode(payload) {
            Ok(e) => e,
            Err(e) => return What::DeadLetter(dead(format!("undecodable command envelope: {e}"))),
        };
        let id: TaskId = match env.task_id.parse() {
            Ok(id) => id,
            Err(e) => return What::DeadLetter(dead(format!("command envelope: {e}"))),
        };
        // A Rejected event and snapshot echo the envelope's names: cut to their limits,
        // and the spec left out, so that the rejection of any record fits on any topic.
        let reject = |reason: String| What::Reject { env: bounded(&env), reason, dead: None };
        if let Some(reason) = oversized(payload.len(), &env) {
            return reject(reason);
        }
        if env.kind != self.kind {
            return reject(format!("a {} command on the {} command topic {}", env.kind, self.kind, self.topic));
        }
        if env.subject.is_empty() {
            return reject("subject is empty: every command names what it acts on".into());
        }
        if m.key() != Some(env.subject.as_bytes()) {
            return reject(format!("record key must equal the subject {:?} so that its tasks stay in order", env.subject));
        }
        match env.action {
            CommandAction::Cancel | CommandAction::Revert => What::Control { env, id },
            CommandAction::Start => {
                let spec: H::Spec = match self.registry.decode(&env.spec.0) {
                    Ok(s) => s,
                    Err(e) => {
                        let reason = format!("spec of the {} command does not decode: {e}", self.kind);
                        return What::Reject { env: bounded(&env), dead: Some(dead(reason.clone())), reason };
                    }
                };
                match self.handler.validate(&env.subject, &spec) {
                    Ok(()) => What::Start { env, id },
                    Err(r) => reject(format!("invalid {} spec: {}", self.kind, r.reason)),
                }
            }
        }
    }
}

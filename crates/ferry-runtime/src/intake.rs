//! The command consumer: a thread that polls the kind's command topic in a consumer group,
//! decodes and validates records, hands them to the scheduler in batches, and stores each
//! offset only after the scheduler says the batch's records are durable (at-least-once,
//! in order). Rebalance callbacks block until the scheduler has handed tasks over.
//!
//! While a batch's writes are slow (the broker failing or gone), the intake pauses its
//! partitions and keeps polling: librdkafka delivers rebalance callbacks only on poll, and
//! a lost assignment must fence its tasks at once, not when the broker answers again.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers};
use rdkafka::{Message, TopicPartitionList};
use tokio::sync::mpsc;

use crate::fences::Fences;
use crate::ids::TaskId;
use crate::kafka::KafkaConfig;
use crate::kind::TaskKind;
use crate::limits;
use crate::protocol::{CommandAction, CommandEnvelope};
use crate::publisher::{DeadLetter, TRACEPARENT};
use crate::scheduler::{Incoming, SchedMsg, What};
use crate::step::TaskHandler;
use crate::tenants::{self, Policy, TENANT_HEADER};
use crate::wire::Registry;

/// Largest batch handed to the scheduler at once.
const MAX_BATCH: usize = 500;

/// How long the intake waits for a batch's writes before it pauses its partitions and
/// serves rebalance callbacks while it waits on.
const HOLD_AFTER: Duration = Duration::from_millis(200);

/// How long an assignment callback waits for the scheduler to resume its tasks.
const ASSIGN_LIMIT: Duration = Duration::from_secs(75);

/// First pause before a batch whose writes failed is read again; it doubles per failure
/// in a row up to [`REREAD_MAX`].
const REREAD_FIRST: Duration = Duration::from_secs(1);
const REREAD_MAX: Duration = Duration::from_secs(30);

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
        signal: env.signal.as_deref().map(|s| cut(s, limits::NAME_BYTES)),
    }
}

pub(crate) struct IntakeContext {
    sched: mpsc::Sender<SchedMsg>,
    ready: Arc<AtomicBool>,
    fences: Arc<Fences>,
    publisher: Arc<crate::publisher::Publisher>,
    /// How long a revoke waits for the scheduler to hand its tasks over.
    revoke_limit: Duration,
    /// Set while a batch's writes are slow and the assignment is paused: partitions
    /// assigned meanwhile are paused too.
    holding: AtomicBool,
    /// The partitions paused while a batch is held, assigned or not by now: the hold's end
    /// resumes each of them. librdkafka keeps a partition's pause across an unassign
    /// (confluentinc/librdkafka#1849), so one paused, then lost or revoked during the hold,
    /// came back paused from a later assignment and was never read again: its commands,
    /// reverts among them, waited for ever (the fault campaign's stall).
    paused: std::sync::Mutex<std::collections::BTreeSet<i32>>,
}

impl IntakeContext {
    /// Pauses `tpl` for a hold and records its partitions for [`Self::resume_held`].
    fn hold(&self, consumer: &BaseConsumer<Self>, tpl: &TopicPartitionList) {
        self.paused.lock().expect("paused lock").extend(partitions(tpl));
        if let Err(e) = consumer.pause(tpl) {
            tracing::warn!(error = %e, "could not pause the command partitions");
        }
    }

    /// Resumes every partition paused during the hold, including those unassigned since.
    fn resume_held(&self, consumer: &BaseConsumer<Self>, topic: &str) {
        let mut tpl = TopicPartitionList::new();
        for p in std::mem::take(&mut *self.paused.lock().expect("paused lock")) {
            tpl.add_partition(topic, p);
        }
        if let Err(e) = consumer.resume(&tpl) {
            tracing::warn!(error = %e, "could not resume the command partitions");
        }
    }
}

fn partitions(tpl: &TopicPartitionList) -> Vec<i32> {
    tpl.elements().iter().map(|e| e.partition()).collect()
}

impl ClientContext for IntakeContext {}

impl ConsumerContext for IntakeContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let parts = partitions(tpl);
            tracing::info!(partitions = ?parts, "partitions revoked; stopping their tasks");
            let lost = consumer.assignment_lost();
            if lost {
                // Another worker may own them already: fence their tasks here and now; the
                // scheduler may be waiting on the broker and see the revoke only later.
                tracing::warn!(partitions = ?parts, "assignment lost: fencing its tasks and dropping their unacknowledged writes");
                self.fences.close(&parts);
                // A lost assignment is the whole assignment: every record still in the
                // producer belongs to a task another worker may be running already.
                self.publisher.purge_unacknowledged();
            }
            let (reply, rx) = std::sync::mpsc::channel();
            if self.sched.blocking_send(SchedMsg::Revoked { partitions: parts.clone(), lost, reply }).is_ok()
                && let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(self.revoke_limit)
            {
                // The scheduler is stuck on the broker (a batch's writes hang): the group
                // waits for this callback, and holding it longer would have the coordinator
                // hand the partitions over while their tasks still run here. Fence them now,
                // and drop every unacknowledged write: some belong to these tasks, and the
                // producer cannot drop only those (the others are written again, identical).
                tracing::error!(partitions = ?parts, limit_ms = self.revoke_limit.as_millis() as u64, "tasks not handed over in time; fencing them and dropping unacknowledged writes");
                self.fences.close(&parts);
                self.publisher.purge_unacknowledged();
            }
            // Offsets stored so far stand for durable work: commit them before letting go.
            match consumer.commit_consumer_state(CommitMode::Sync) {
                Ok(()) | Err(KafkaError::ConsumerCommit(rdkafka::types::RDKafkaErrorCode::NoOffset)) => {}
                Err(e) => tracing::warn!(error = %e, "commit on revoke failed; the next owner may see duplicates"),
            }
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            let (reply, rx) = std::sync::mpsc::channel();
            let parts = partitions(tpl);
            tracing::info!(partitions = ?parts, "partitions assigned; resuming their tasks");
            // Bounded (the view's 60 s catch-up, and some): a scheduler stuck on the broker
            // must not hold the group's rebalance. The records fetched meanwhile reach it
            // after the assignment (one channel, in order).
            if self.sched.blocking_send(SchedMsg::Assigned { partitions: parts.clone(), reply }).is_ok()
                && rx.recv_timeout(ASSIGN_LIMIT).is_err()
            {
                tracing::warn!(partitions = ?parts, "resuming the assigned partitions' tasks goes on in the background");
            }
            if self.holding.load(Ordering::Relaxed) {
                self.hold(consumer, tpl);
            }
            self.ready.store(true, Ordering::Relaxed);
        }
    }
}

pub(crate) struct Intake<H: TaskHandler> {
    pub consumer: BaseConsumer<IntakeContext>,
    pub topic: String,
    /// The consumer group (for the records' spans).
    pub group: String,
    pub kind: TaskKind,
    pub handler: Arc<H>,
    pub registry: Arc<Registry>,
    pub sched: mpsc::Sender<SchedMsg>,
    pub stop: Arc<AtomicBool>,
    /// Records of deferred controls: no offset past them is stored.
    holds: Arc<crate::holds::CommitHolds>,
    /// The tenants' policy: commands forwarded by the gateway are checked against it.
    pub policy: Option<Arc<Policy>>,
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
        (fences, holds): (Arc<Fences>, Arc<crate::holds::CommitHolds>),
        publisher: Arc<crate::publisher::Publisher>,
        revoke_grace: Duration,
    ) -> Result<Self, IntakeError> {
        let err = |source| IntakeError::Consumer { topic: topic.to_owned(), source: Box::new(source) };
        // The scheduler's own bound on a revoke (grace, then 5 s), and a second to reply.
        let revoke_limit = revoke_grace + Duration::from_secs(6);
        let ctx = IntakeContext { sched: sched.clone(), ready, fences, publisher, revoke_limit, holding: AtomicBool::new(false), paused: Default::default() };
        let consumer: BaseConsumer<IntakeContext> = kafka.group_consumer(group).create_with_context(ctx).map_err(err)?;
        consumer.subscribe(&[topic]).map_err(err)?;
        let kind = handler.kind();
        Ok(Self { consumer, topic: topic.to_owned(), group: group.to_owned(), kind, handler, registry, sched, stop, holds, policy: None })
    }

    /// Checks tenants' commands against `policy` (none: a tenant's command is refused).
    pub(crate) fn with_policy(mut self, policy: Option<Arc<Policy>>) -> Self {
        self.policy = policy;
        self
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
        // Records polled while a batch was held (fetched before the pause took hold): the
        // next batch starts with them, so none is skipped.
        let mut carried = std::collections::VecDeque::new();
        let mut failures_in_a_row = 0u32;
        while !self.stop.load(Ordering::Relaxed) {
            // Offsets held back for deferred controls since applied: stored now.
            for (p, o) in self.holds.take_released() {
                self.store(p, o);
            }
            let first = match carried.pop_front() {
                Some(r) => r,
                None => match self.consumer.poll(Duration::from_millis(100)) {
                    Some(r) => r,
                    None => continue,
                },
            };
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
                    next = carried.pop_front().or_else(|| self.consumer.poll(Duration::ZERO));
                }
            }
            if batch.is_empty() {
                continue;
            }
            let (reply, rx) = std::sync::mpsc::channel();
            if self.sched.blocking_send(SchedMsg::Batch { items: batch, reply }).is_err() {
                return Ok(());
            }
            let skipped = match self.wait_serving_callbacks(&rx, &mut carried) {
                Some(Ok(skipped)) => skipped,
                Some(Err(e)) => {
                    // Not durable (the broker refused the writes for the whole message
                    // timeout): store no offset, read the batch again after a pause. The
                    // scheduler writes what it had accepted again, identical.
                    failures_in_a_row += 1;
                    let pause = REREAD_FIRST.saturating_mul(1 << (failures_in_a_row - 1).min(5)).min(REREAD_MAX);
                    tracing::error!(topic = %self.topic, error = %e, failures_in_a_row, pause_ms = pause.as_millis() as u64, "a batch of commands could not be made durable; reading it again");
                    self.reread(&offsets, pause, &mut carried);
                    continue;
                }
                None => return Ok(()),
            };
            failures_in_a_row = 0;
            for (p, o) in offsets.into_iter().filter(|(p, _)| !skipped.contains(p)) {
                // Not past a deferred control's record (see `holds`).
                if let Some(o) = self.holds.storable(p, o) {
                    self.store(p, o);
                }
            }
        }
        Ok(())
    }

    /// Stores `offset` of `partition` for the next commit (librdkafka commits the one
    /// after it). Fails only for partitions revoked meanwhile; their new owner reads them
    /// again.
    fn store(&self, partition: i32, offset: i64) {
        if let Err(e) = self.consumer.store_offset(&self.topic, partition, offset) {
            tracing::debug!(partition, offset, error = %e, "offset not stored");
        }
    }

    /// Waits `pause` with the partitions paused, serving rebalance callbacks, then rewinds
    /// each partition of a failed batch to its first record (what was fetched meanwhile of
    /// those partitions is dropped: the rewound fetch brings it again).
    fn reread<'a>(
        &'a self,
        offsets: &[(i32, i64)],
        pause: Duration,
        carried: &mut std::collections::VecDeque<rdkafka::error::KafkaResult<BorrowedMessage<'a>>>,
    ) {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            std::thread::sleep(pause);
            let _ = tx.send(());
        });
        let _ = self.wait_serving_callbacks(&rx, carried);
        let mut first: std::collections::BTreeMap<i32, i64> = std::collections::BTreeMap::new();
        for (p, o) in offsets {
            first.entry(*p).and_modify(|f| *f = (*f).min(*o)).or_insert(*o);
        }
        // Records of a rewound partition come again; those of the other partitions are
        // kept: their positions are past them, and dropping them lost them (a command
        // never run, its offset stored with the next one's).
        carried.retain(|r| r.as_ref().is_ok_and(|m| !first.contains_key(&m.partition())));
        for (p, o) in first {
            // Fails only for a partition revoked meanwhile: its next owner reads it again.
            if let Err(e) = self.consumer.seek(&self.topic, p, rdkafka::Offset::Offset(o), Duration::from_secs(10)) {
                tracing::warn!(partition = p, offset = o, error = %e, "could not rewind the partition");
            }
        }
    }

    /// Waits for a batch's reply. When it is slow, pauses the assignment (librdkafka drops
    /// what it prefetched and fetches from the position on resume) and polls meanwhile, so
    /// that rebalance callbacks, a lost assignment's above all, are served at once.
    /// `None`: the scheduler is gone.
    fn wait_serving_callbacks<'a, T>(
        &'a self,
        rx: &std::sync::mpsc::Receiver<T>,
        carried: &mut std::collections::VecDeque<rdkafka::error::KafkaResult<BorrowedMessage<'a>>>,
    ) -> Option<T> {
        use std::sync::mpsc::RecvTimeoutError;
        match rx.recv_timeout(HOLD_AFTER) {
            Ok(v) => return Some(v),
            Err(RecvTimeoutError::Disconnected) => return None,
            Err(RecvTimeoutError::Timeout) => {}
        }
        let ctx = self.consumer.context();
        ctx.holding.store(true, Ordering::Relaxed);
        if let Ok(tpl) = self.consumer.assignment() {
            ctx.hold(&self.consumer, &tpl);
        }
        tracing::debug!(topic = %self.topic, "a batch's writes are slow; partitions paused, serving rebalances");
        let reply = loop {
            match rx.try_recv() {
                Ok(v) => break Some(v),
                Err(std::sync::mpsc::TryRecvError::Disconnected) => break None,
                Err(std::sync::mpsc::TryRecvError::Empty) => {}
            }
            if let Some(r) = self.consumer.poll(Duration::from_millis(50)) {
                carried.push_back(r);
            }
        };
        ctx.holding.store(false, Ordering::Relaxed);
        ctx.resume_held(&self.consumer, &self.topic);
        reply
    }

    /// The tenant a command comes from: `Ok(None)` for an operator's (no header), an error
    /// for a header this worker cannot vouch for, or an operator's claim to be a tenant.
    fn tenancy<'t>(&self, tenant: Option<&'t str>, claimed: &str) -> Result<Option<&'t str>, String> {
        let Some(t) = tenant else {
            if claimed.starts_with("tenant:") {
                let claimed = limits::truncate(claimed, limits::NAME_BYTES);
                return Err(format!("requested_by {claimed:?}: only the tenant gateway names a tenant (write to the tenant's own topic)"));
            }
            return Ok(None);
        };
        match &self.policy {
            None => Err(format!("a command of tenant {:?} (header {TENANT_HEADER}), and this worker has no tenant policy", limits::truncate(t, limits::NAME_BYTES))),
            Some(p) if !p.tenants().any(|x| x == t) => Err(format!("tenant {:?} is not in the tenant policy", limits::truncate(t, limits::NAME_BYTES))),
            Some(_) => Ok(Some(t)),
        }
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
        let tenant = headers.iter().find(|(k, _)| k == TENANT_HEADER).map(|(_, v)| String::from_utf8_lossy(v).into_owned());
        let attrs = crate::telemetry::consumed(crate::telemetry::Operation::Process, &self.topic, &self.group, m.partition(), m.offset(), m.key());
        let span = crate::telemetry::start(format!("process {}", self.topic), opentelemetry::trace::SpanKind::Consumer, &crate::telemetry::context_of(trace_parent.as_deref()), attrs);
        let what = self.check(m, &dead, tenant.as_deref());
        crate::telemetry::end(&span, match &what {
            What::DeadLetter(d) => Some(d.reason.clone()),
            What::Reject { reason, .. } => Some(reason.clone()),
            _ => None,
        });
        Incoming { partition: m.partition(), offset: m.offset(), trace_parent, what }
    }

    /// `tenant`: the [`TENANT_HEADER`] the gateway set (only gateways and operators write
    /// command topics).
    fn check(&self, m: &BorrowedMessage<'_>, dead: &dyn Fn(String) -> DeadLetter, tenant: Option<&str>) -> What {
        let Some(payload) = m.payload() else {
            return What::DeadLetter(dead("empty record: no command envelope".into()));
        };
        let mut env: CommandEnvelope = match self.registry.decode(payload) {
            Ok(e) => e,
            Err(e) => return What::DeadLetter(dead(format!("undecodable command envelope: {e}"))),
        };
        let id: TaskId = match env.task_id.parse() {
            Ok(id) => id,
            Err(e) => return What::DeadLetter(dead(format!("command envelope: {e}"))),
        };
        // Who sent it is what the broker established (the tenant's topic), never what the
        // envelope says; the claim is kept in the log only.
        let claimed = std::mem::take(&mut env.requested_by);
        let tenancy = self.tenancy(tenant, &claimed);
        env.requested_by = match &tenancy {
            Ok(Some(t)) => tenants::principal(t),
            _ => limits::truncate(&claimed, limits::NAME_BYTES).to_owned(),
        };
        if tenant.is_some() && claimed != env.requested_by {
            let claimed = limits::truncate(&claimed, limits::NAME_BYTES);
            tracing::debug!(task = %env.task_id, %claimed, principal = %env.requested_by, "requested_by replaced by the tenant's principal");
        }
        // A Rejected event and snapshot echo the envelope's names: cut to their limits,
        // and the spec left out, so that the rejection of any record fits on any topic.
        let reject = |reason: String| What::Reject { env: bounded(&env), reason, dead: None };
        if claimed.len() > limits::NAME_BYTES {
            return reject(format!("requested_by is {} bytes; the limit is {}", claimed.len(), limits::NAME_BYTES));
        }
        if let Some(reason) = oversized(payload.len(), &env) {
            return reject(reason);
        }
        let tenant = match tenancy {
            Ok(t) => t,
            Err(reason) => return reject(reason),
        };
        if env.kind != self.kind {
            return reject(format!("a {} command on the {} command topic {}", env.kind, self.kind, self.topic));
        }
        if env.subject.is_empty() {
            return reject("subject is empty: every command names what it acts on".into());
        }
        if m.key() != Some(env.subject.as_bytes()) {
            return reject(format!("record key must equal the subject {:?} so that its tasks stay in order", env.subject));
        }
        if let Some(t) = tenant {
            // The tenant's keys live in the tenant's own space, and so do the ids they give.
            let start = env.action == CommandAction::Start;
            let key = env.idempotency_key.clone();
            match &key {
                Some(key) if start => {
                    let expected = tenants::tenant_task_id(self.kind, t, key);
                    if id != expected {
                        return reject(format!(
                            "task id {id} is not the one tenant {t:?}'s idempotency key {key:?} gives ({expected}): ids of keyed commands are derived in the tenant's own space"
                        ));
                    }
                }
                None if start && id.is_derived() => {
                    return reject(format!("task id {id} is derived from an idempotency key, and the command carries none"));
                }
                _ => {}
            }
            env.idempotency_key = key.map(|k| tenants::tenant_key(t, &k));
        }
        match env.action {
            CommandAction::Cancel | CommandAction::Revert => What::Control { env, id },
            CommandAction::Signal => match env.signal.as_deref().map_or_else(|| Some("a Signal names its signal (`signal`)".to_owned()), crate::protocol::Signal::invalid_name) {
                Some(reason) => What::Reject { env: bounded(&env), reason, dead: None },
                None => What::Control { env, id },
            },
            CommandAction::Start => {
                let spec: H::Spec = match self.registry.decode(&env.spec.0) {
                    Ok(s) => s,
                    Err(e) => {
                        let reason = format!("spec of the {} command does not decode: {e}", self.kind);
                        return What::Reject { env: bounded(&env), dead: Some(dead(reason.clone())), reason };
                    }
                };
                if let Err(r) = self.handler.validate(&env.subject, &spec) {
                    return What::Reject { env: bounded(&env), reason: format!("invalid {} spec: {}", self.kind, r.reason), dead: None };
                }
                if let (Some(t), Some(policy)) = (tenant, &self.policy)
                    && let Err(reason) = policy.check(t, self.kind, &self.handler.targets(&env.subject, &spec))
                {
                    return What::Reject { env: bounded(&env), reason, dead: None };
                }
                What::Start { env, id }
            }
        }
    }
}

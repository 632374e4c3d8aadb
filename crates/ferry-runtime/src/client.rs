//! The producer side for services, the CLI and tests: submit commands, cancel and revert
//! tasks, read snapshots and follow progress events. A one-shot caller (the CLI) reads the
//! task-state topics per call; a long-running service starts [`Client::live_view`] once,
//! and every later read, cancel and revert is answered from it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use apache_avro::AvroSchema;
use futures::StreamExt;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};
use serde::Serialize;

use crate::ids::TaskId;
use crate::kafka::KafkaConfig;
use crate::kind::TaskKind;
use crate::live::{Decoder, Follower, LiveError, LiveState};
use crate::protocol::{Bytes, CommandAction, CommandEnvelope, EventType, ProgressEvent, TaskSnapshot, TaskState, now_ms};
use crate::publisher::TRACEPARENT;
use crate::state_view::ViewError;
use crate::topics::Topics;
use crate::wire::{Registry, WireError};

/// Every task's latest snapshot as one read found them ([`Client::task_states`]).
#[derive(Debug, Clone)]
pub struct TaskStates {
    /// The tasks' snapshots, but for those in [`Self::newer`].
    pub snapshots: Vec<TaskSnapshot>,
    /// Tasks (ids) whose last snapshot is in a record version newer than this program
    /// knows, with its schema id.
    pub newer: Vec<(String, u32)>,
    /// The id of the newest snapshot version this program knows.
    pub newest_known: u32,
}

/// Why a client call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Kafka refused.
    #[error("{what}: {source}")]
    Kafka {
        /// The operation.
        what: String,
        /// Cause.
        #[source]
        source: KafkaError,
    },
    /// Encoding failed.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// Reading the task-state topic failed.
    #[error(transparent)]
    View(#[from] ViewError),
    /// Following the task-state (or another) topic failed.
    #[error(transparent)]
    Live(#[from] LiveError),
    /// No snapshot of the task exists.
    #[error("no task {0} on the task-state topic")]
    UnknownTask(TaskId),
    /// The task's last snapshot is in a record version newer than this program knows: a
    /// newer Ferry's worker wrote it, and what this program could read of it is older.
    #[error("task {task}'s state is in record version (schema id) {schema_id}, newer than this ferry knows ({newest_known}): a newer Ferry's worker wrote it; upgrade this ferry to read it")]
    NewerRecord {
        /// The task.
        task: TaskId,
        /// The schema id of its last snapshot.
        schema_id: u32,
        /// The id of the newest snapshot version this program knows.
        newest_known: u32,
    },
    /// A tenant's client found no event of the task on the tenant's own progress topic: the
    /// task is another's (a tenant sees only its own), or there is none.
    #[error("no task {id} among tenant {tenant:?}'s tasks (no event of it on {topic}; a tenant sees only its own tasks)")]
    NotTenants {
        /// The task asked for.
        id: TaskId,
        /// The client's tenant.
        tenant: String,
        /// The tenant's progress topic, where it was looked for.
        topic: String,
    },
    /// The request itself is malformed (e.g. a signal's name); nothing was sent.
    #[error("{0}")]
    Invalid(String),
    /// The wait ran out.
    #[error("task {task} did not reach the awaited event within {} s", .waited.as_secs_f64().round())]
    Timeout {
        /// The task.
        task: TaskId,
        /// How long we waited.
        waited: Duration,
    },
}

fn kafka(what: impl Into<String>) -> impl FnOnce(KafkaError) -> ClientError {
    let what = what.into();
    move |source| ClientError::Kafka { what, source }
}

/// Options of one submission.
#[derive(Debug, Clone, Default)]
pub struct SubmitOptions {
    /// Same key, same task: the id is derived from it.
    pub idempotency_key: Option<String>,
    /// Deadline of the forward run, from now.
    pub deadline: Option<Duration>,
    /// Deadline of the forward run as a time (ms since the epoch); wins over `deadline`
    /// (a plan passes its own on to its children unchanged).
    pub deadline_at_ms: Option<i64>,
    /// On failure keep finished steps instead of reverting.
    pub keep_partial: bool,
    /// W3C trace context of the caller.
    pub trace_parent: Option<String>,
    /// Who the command is from, instead of the client's user (a plan names itself,
    /// `plan/<id>`, so that its children are linked to it).
    pub requested_by: Option<String>,
    /// Sends on behalf of this tenant (a tenant's plan's child, sent by the plan worker):
    /// to the kind's command topic with the tenant header, which only Ferry's own writers
    /// of command topics (gateways, the plan worker; their ACLs) set; the id is in the
    /// tenant's space and the worker holds the command to the tenant's policy.
    pub for_tenant: Option<String>,
}

/// How long a read of the task-state topics may take to reach their ends.
const READ_LIMIT: Duration = Duration::from_secs(60);

/// One record as (key, payload).
pub type KeyedRecord = (Option<Vec<u8>>, Vec<u8>);

/// A Kafka client for Ferry's topics.
pub struct Client {
    kafka: KafkaConfig,
    topics: Topics,
    registry: Arc<Registry>,
    /// Made at once by [`Client::with_registry`] (an idempotent producer needs a moment
    /// before it can send), at the first send by [`Client::short_lived`] (a command that
    /// only reads makes none: dropping a producer waits up to 100 ms for its polling
    /// thread).
    producer: std::sync::OnceLock<FutureProducer>,
    producer_config: rdkafka::ClientConfig,
    requested_by: String,
    /// Set: commands go to this tenant's own topics (the broker lets its user write only
    /// those), and idempotency keys give ids in the tenant's space.
    tenant: Option<String>,
    /// Set by [`Client::live_view`]: reads, cancels and reverts are answered from it.
    live: Mutex<Option<LiveState>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("kafka", &self.kafka).finish()
    }
}

/// A task a Cancel or Revert was sent to, as [`Client::locate`] found it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Target {
    /// The task.
    pub task_id: String,
    /// Its kind.
    pub kind: TaskKind,
    /// Its subject.
    pub subject: String,
    /// Its state, where the client reads task state (not a tenant's).
    pub state: Option<TaskState>,
    /// Its latest event known.
    pub last_event: Option<EventType>,
}

impl Target {
    /// Its state: as read, or for a tenant (who reads events only) the one its last event
    /// sets, where that event sets one.
    pub fn known_state(&self) -> Option<TaskState> {
        self.state.or_else(|| self.last_event.and_then(EventType::state_after))
    }

    /// Why `action` sent now would do nothing, if it would: a Cancel or Signal of a task
    /// that has ended, a Revert of one Rejected or Reverted. The runtime answers these by
    /// publishing the task's state again and nothing else (`scheduler.rs`, `control`), so
    /// a caller that says this instead of sending tells the truth sooner (the CLI, the
    /// dashboard). `None` when the state is not known or the action would act.
    pub fn pointless(&self, action: CommandAction) -> Option<String> {
        let s = self.known_state().filter(|s| s.is_terminal())?;
        let id = &self.task_id;
        match action {
            CommandAction::Cancel => Some(format!("task {id} has ended ({s}): there is nothing to cancel")),
            CommandAction::Signal => Some(format!("task {id} has ended ({s}): a signal reaches only a queued or running task")),
            CommandAction::Revert if !s.is_revertible() => Some(format!("task {id} is {s}: there is nothing to revert")),
            _ => None,
        }
    }
}

impl Client {
    /// A client of `topics` on the brokers of `kafka`, with the embedded schema registry.
    pub fn new(kafka: KafkaConfig, topics: Topics) -> Result<Self, ClientError> {
        Self::with_registry(kafka, topics, Registry::embedded())
    }

    /// A client using `registry` (e.g. from [`crate::schema_registry::confluent`]).
    pub fn with_registry(kafka: KafkaConfig, topics: Topics, registry: Registry) -> Result<Self, ClientError> {
        let config = kafka.producer();
        let client = Self::from_parts(kafka, topics, registry, config);
        client.producer()?;
        Ok(client)
    }

    /// A client for a process that sends a few commands and exits (the CLI): its producer
    /// can send at once instead of after about 0.5 s ([`KafkaConfig::command_producer`]).
    pub fn short_lived(kafka: KafkaConfig, topics: Topics, registry: Registry) -> Result<Self, ClientError> {
        let config = kafka.command_producer();
        Ok(Self::from_parts(kafka, topics, registry, config))
    }

    fn from_parts(kafka: KafkaConfig, topics: Topics, registry: Registry, producer_config: rdkafka::ClientConfig) -> Self {
        let requested_by = std::env::var("USER").unwrap_or_else(|_| "ferry-cli".into());
        let producer = std::sync::OnceLock::new();
        Self { kafka, topics, registry: Arc::new(registry), producer, producer_config, requested_by, tenant: None, live: Mutex::new(None) }
    }

    /// The producer, made on first use.
    fn producer(&self) -> Result<&FutureProducer, ClientError> {
        if let Some(p) = self.producer.get() {
            return Ok(p);
        }
        let made: FutureProducer = self.producer_config.create().map_err(self::kafka("creating the producer"))?;
        Ok(self.producer.get_or_init(|| made))
    }

    /// This client as `tenant`: its commands go to the tenant's topics
    /// (`ferry.tenants.<tenant>.<kind>`), where the worker's gateway takes them.
    #[must_use]
    pub fn as_tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    /// This client's commands name `who` as their sender (`requested_by`) instead of the
    /// user running it: a service that acts for others names itself (the dashboard, a
    /// plan). Tenants' commands are named by their gateway whatever this says.
    #[must_use]
    pub fn sent_by(mut self, who: impl Into<String>) -> Self {
        self.requested_by = who.into();
        self
    }

    /// The tenant this client sends as, if any.
    pub fn tenant(&self) -> Option<&str> {
        self.tenant.as_deref()
    }

    /// The topic this client sends `kind` commands to.
    pub fn command_topic(&self, kind: TaskKind) -> String {
        match &self.tenant {
            Some(t) => self.topics.tenant_command(t, kind).name,
            None => self.topics.command(kind).name.clone(),
        }
    }

    /// The id a submission of `kind` with idempotency key `key` gets from this client.
    pub fn id_for_key(&self, kind: TaskKind, key: &str) -> TaskId {
        self.id_for_key_of(kind, key, None)
    }

    /// The id a submission of `kind` with idempotency key `key` gets on behalf of
    /// `for_tenant` ([`SubmitOptions::for_tenant`]), else of this client's tenant, if any:
    /// in that tenant's key space.
    pub fn id_for_key_of(&self, kind: TaskKind, key: &str, for_tenant: Option<&str>) -> TaskId {
        match for_tenant.or(self.tenant.as_deref()) {
            Some(t) => crate::tenants::tenant_task_id(kind, t, key),
            None => TaskId::for_idempotency_key(kind, key),
        }
    }

    /// The topics.
    pub fn topics(&self) -> &Topics {
        &self.topics
    }

    /// The schema registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Submits a Start command with a typed spec; returns the task id.
    pub async fn submit<S: Serialize + AvroSchema + 'static>(
        &self,
        kind: TaskKind,
        subject: &str,
        spec: &S,
        opts: SubmitOptions,
    ) -> Result<TaskId, ClientError> {
        let bytes = self.registry.encode(spec)?;
        self.submit_encoded(kind, subject, bytes, opts).await
    }

    /// Submits a Start command and follows the task to its final event, within `limit`;
    /// returns its id and every event it published. Events are read from the moment of
    /// submission, so none is missed.
    pub async fn submit_and_wait<S: Serialize + AvroSchema + 'static>(
        &self,
        kind: TaskKind,
        subject: &str,
        spec: &S,
        opts: SubmitOptions,
        limit: Duration,
    ) -> Result<(TaskId, Vec<ProgressEvent>), ClientError> {
        let mut events = self.events(false).await?;
        let id = self.submit(kind, subject, spec, opts).await?;
        let evs = events.until(id, limit, |e| e.event.is_final()).await?;
        Ok((id, evs))
    }

    /// Submits a Start command whose spec is already Confluent-framed.
    pub async fn submit_encoded(&self, kind: TaskKind, subject: &str, spec: Vec<u8>, opts: SubmitOptions) -> Result<TaskId, ClientError> {
        let id = match &opts.idempotency_key {
            Some(k) => self.id_for_key_of(kind, k, opts.for_tenant.as_deref()),
            None => TaskId::new(),
        };
        let env = CommandEnvelope {
            task_id: id.to_string(),
            kind,
            action: CommandAction::Start,
            subject: subject.to_owned(),
            idempotency_key: opts.idempotency_key.clone(),
            requested_by: opts.requested_by.clone().unwrap_or_else(|| self.requested_by.clone()),
            created_at_ms: now_ms(),
            deadline_ms: opts.deadline_at_ms.or_else(|| opts.deadline.map(|d| now_ms() + d.as_millis() as i64)),
            keep_partial: opts.keep_partial,
            reason: None,
            spec: Bytes(spec),
            signal: None,
        };
        // Every task gets a trace: a producer span under the caller's trace (or a new
        // root); without a tracer provider, the caller's traceparent or a random one.
        let parent = crate::telemetry::context_of(opts.trace_parent.as_deref());
        let attrs = vec![
            opentelemetry::KeyValue::new("ferry.task_id", id.to_string()),
            opentelemetry::KeyValue::new("ferry.subject", subject.to_owned()),
            opentelemetry::KeyValue::new("messaging.destination.name", self.command_topic(kind)),
        ];
        let cx = crate::telemetry::start(format!("ferry.submit {kind}"), opentelemetry::trace::SpanKind::Producer, &parent, attrs);
        let trace = crate::telemetry::traceparent(&cx).or_else(|| opts.trace_parent.clone()).unwrap_or_else(new_trace_parent);
        let sent = match &opts.for_tenant {
            // On the tenant's behalf: the kind's own topic, with the tenant header.
            Some(tenant) => self.send_to(&self.topics.command(kind).name, &env, Some(&trace), Some(tenant)).await,
            None => self.send(&env, Some(&trace)).await,
        };
        crate::telemetry::end(&cx, sent.as_ref().err().map(ToString::to_string));
        sent?;
        Ok(id)
    }

    /// Sends an envelope to its kind's command topic (the tenant's, for a tenant's client),
    /// keyed by its subject.
    pub async fn send(&self, env: &CommandEnvelope, trace_parent: Option<&str>) -> Result<(), ClientError> {
        self.send_to(&self.command_topic(env.kind), env, trace_parent, None).await
    }

    /// Sends an envelope to `topic`, keyed by its subject, with the trace and tenant
    /// headers given (the tenant header: see [`SubmitOptions::for_tenant`]).
    async fn send_to(&self, topic: &str, env: &CommandEnvelope, trace_parent: Option<&str>, tenant: Option<&str>) -> Result<(), ClientError> {
        let bytes = self.registry.encode(env)?;
        let mut headers = OwnedHeaders::new();
        if let Some(t) = trace_parent {
            headers = headers.insert(Header { key: TRACEPARENT, value: Some(t) });
        }
        if let Some(t) = tenant {
            headers = headers.insert(Header { key: crate::tenants::TENANT_HEADER, value: Some(t) });
        }
        self.send_raw(topic, Some(env.subject.as_bytes()), &bytes, headers).await
    }

    /// Sends arbitrary bytes to a topic (tests of bad input, replays).
    pub async fn send_raw(&self, topic: &str, key: Option<&[u8]>, payload: &[u8], headers: OwnedHeaders) -> Result<(), ClientError> {
        let mut record = FutureRecord::to(topic).payload(payload).headers(headers);
        if let Some(k) = key {
            record = record.key(k);
        }
        self.producer()?
            .send(record, Duration::from_secs(30))
            .await
            .map(|_| ())
            .map_err(|(e, _)| ClientError::Kafka { what: format!("producing to {topic}"), source: e })
    }

    /// Sends Cancel or Revert for a task whose kind and subject are known.
    pub async fn control(&self, kind: TaskKind, subject: &str, id: TaskId, action: CommandAction, reason: Option<String>) -> Result<(), ClientError> {
        self.send(&self.control_envelope(kind, subject, id, action, reason), None).await
    }

    /// The envelope of a Cancel, Revert or Signal of task `id` (no spec, no key).
    pub(crate) fn control_envelope(&self, kind: TaskKind, subject: &str, id: TaskId, action: CommandAction, reason: Option<String>) -> CommandEnvelope {
        CommandEnvelope {
            task_id: id.to_string(),
            kind,
            action,
            subject: subject.to_owned(),
            idempotency_key: None,
            requested_by: self.requested_by.clone(),
            created_at_ms: now_ms(),
            deadline_ms: None,
            keep_partial: false,
            reason,
            spec: Bytes::default(),
            signal: None,
        }
    }

    /// Sends Signal `name` to a task found by [`Self::locate`] (e.g. `approve`, `pause`,
    /// `resume` for a plan's waves). Its idempotency key is new for each call, so a
    /// redelivered command is recorded once and two calls are two signals.
    pub async fn signal(&self, id: TaskId, name: &str, reason: Option<String>) -> Result<Target, ClientError> {
        if let Some(why) = crate::protocol::Signal::invalid_name(name) {
            return Err(ClientError::Invalid(why));
        }
        let target = self.locate(id).await?;
        self.signal_target(id, &target, name, reason).await?;
        Ok(target)
    }

    /// Sends Signal `name` to task `id`, already located as `target` ([`Self::locate`]).
    pub async fn signal_target(&self, id: TaskId, target: &Target, name: &str, reason: Option<String>) -> Result<(), ClientError> {
        if let Some(why) = crate::protocol::Signal::invalid_name(name) {
            return Err(ClientError::Invalid(why));
        }
        let env = CommandEnvelope {
            idempotency_key: Some(format!("sig/{}", uuid::Uuid::now_v7())),
            signal: Some(name.to_owned()),
            ..self.control_envelope(target.kind, &target.subject, id, CommandAction::Signal, reason)
        };
        self.send(&env, None).await
    }

    /// Cancels a task, looking up its kind and subject ([`Self::locate`]; a service that
    /// knows them, from its command or a progress event, sends [`Self::control`] instead).
    pub async fn cancel(&self, id: TaskId) -> Result<Target, ClientError> {
        self.control_by_id(id, CommandAction::Cancel, None).await
    }

    /// Reverts a task, looking up its kind and subject as [`Self::cancel`] does.
    pub async fn revert(&self, id: TaskId) -> Result<Target, ClientError> {
        self.control_by_id(id, CommandAction::Revert, None).await
    }

    /// Sends Cancel or Revert (with its reason) to a task found by [`Self::locate`].
    pub async fn control_by_id(&self, id: TaskId, action: CommandAction, reason: Option<String>) -> Result<Target, ClientError> {
        let target = self.locate(id).await?;
        self.control(target.kind, &target.subject, id, action, reason).await?;
        Ok(target)
    }

    /// Where a task is: its kind and subject, and how far it is. An operator's client
    /// looks in the live view when one runs ([`Self::live_view`]), else on the task-state
    /// topics (a read of every topic). A tenant's reads no task state (its KafkaUser may
    /// not): it finds its task's events on its own progress topic.
    pub async fn locate(&self, id: TaskId) -> Result<Target, ClientError> {
        if self.tenant.is_some() {
            return self.locate_by_events(id).await;
        }
        let target = |snap: TaskSnapshot| Target { task_id: snap.task_id, kind: snap.kind, subject: snap.subject, state: Some(snap.state), last_event: Some(snap.last_event) };
        match self.target(id).await {
            Ok(snap) => Ok(target(snap)),
            // A new task's Accepted event may be read a moment before its snapshot (the two
            // are written together, docs/PROTOCOL.md): a task a reader was told of is not
            // unknown. Any later event has its snapshot durable before it, so past Accepted
            // the snapshot is looked for once more (the task moved on between the two reads,
            // or it was deleted: a tombstoned task has events and no snapshot).
            Err(ClientError::UnknownTask(_)) => {
                let by_events = self.locate_by_events(id).await?;
                if by_events.last_event == Some(EventType::Accepted) {
                    return Ok(by_events);
                }
                self.target(id).await.map(target)
            }
            Err(e) => Err(e),
        }
    }

    /// [`Self::locate`] from the task's own events (seq 0 ones are refusals of commands
    /// that named it), on this client's progress topic.
    async fn locate_by_events(&self, id: TaskId) -> Result<Target, ClientError> {
        let events: Vec<ProgressEvent> = self.history(id).await?.into_iter().filter(|e| e.seq > 0).collect();
        let (Some(first), Some(last)) = (events.first(), events.last()) else { return Err(self.not_found(id)) };
        Ok(Target { task_id: id.to_string(), kind: first.kind, subject: first.subject.clone(), state: None, last_event: Some(last.event) })
    }

    /// The error for a task this client cannot find: a tenant's looks only among its own.
    pub fn not_found(&self, id: TaskId) -> ClientError {
        match &self.tenant {
            Some(t) => ClientError::NotTenants { id, tenant: t.clone(), topic: self.progress_topic() },
            None => ClientError::UnknownTask(id),
        }
    }

    /// The topic this client follows events on: `ferry.progress`, or a tenant's own
    /// progress topic (the workers copy its tasks' events there).
    pub fn progress_topic(&self) -> String {
        match &self.tenant {
            Some(t) => self.topics.tenant_progress(t).name,
            None => self.topics.progress().name.clone(),
        }
    }

    /// The live view of every task, started on the first call (a consumer thread that
    /// follows every kind's task-state topic until the client and every clone of the view
    /// are dropped). From then on [`Self::snapshots`], [`Self::snapshot`], [`Self::cancel`]
    /// and [`Self::revert`] answer from it instead of reading the topics.
    pub async fn live_view(&self) -> Result<LiveState, ClientError> {
        if let Some(live) = self.live() {
            return Ok(live);
        }
        let (kafka, topics, registry) = (self.kafka.clone(), self.topics.clone(), self.registry.clone());
        let started = tokio::task::spawn_blocking(move || LiveState::start(&kafka, &topics, registry)).await.expect("live view start task")?;
        // Two first calls at once: the first stored wins, the other's reader stops when dropped.
        Ok(self.live.lock().expect("live view lock").get_or_insert(started).clone())
    }

    fn live(&self) -> Option<LiveState> {
        self.live.lock().expect("live view lock").clone()
    }

    /// Follows `topics` (compacted, keyed) with a [`Follower`] that decodes their records
    /// with this client's registry through `decode` (the topic's name, the registry, the
    /// payload; `Ok(None)` leaves a record out).
    pub async fn follow<V, F>(&self, topics: Vec<String>, decode: F) -> Result<Follower<V>, ClientError>
    where
        V: Send + Sync + 'static,
        F: Fn(&str, &Registry, &[u8]) -> Result<Option<V>, WireError> + Send + Sync + 'static,
    {
        let (kafka, registry) = (self.kafka.clone(), self.registry.clone());
        let decode: Decoder<V> = Box::new(move |topic, payload| decode(topic, &registry, payload));
        Ok(tokio::task::spawn_blocking(move || Follower::start(&kafka, topics, decode)).await.expect("follower start task")?)
    }

    /// Every task's latest snapshot, as of the topics' ends at the call: from the live view
    /// when one runs (after it has caught up with those ends), else by reading every kind's
    /// task-state topic to its end. A snapshot on another kind's topic than its own is not
    /// the task's (no worker of that kind wrote it) and is left out.
    pub async fn snapshots(&self) -> Result<Vec<TaskSnapshot>, ClientError> {
        self.snapshots_of(None).await
    }

    /// [`Self::snapshots`] of one kind's tasks (`Some`): without a live view, only that
    /// kind's task-state topic is read.
    pub async fn snapshots_of(&self, kind: Option<TaskKind>) -> Result<Vec<TaskSnapshot>, ClientError> {
        Ok(self.task_states(kind).await?.snapshots)
    }

    /// [`Self::snapshots_of`], and the tasks whose last snapshot is in a record version
    /// newer than this program knows (their snapshots are left out: what it could read
    /// of them is older than their state).
    pub async fn task_states(&self, kind: Option<TaskKind>) -> Result<TaskStates, ClientError> {
        let states = |live: &LiveState| {
            let newer = live.newer_all();
            let mut snapshots = live.all();
            snapshots.retain(|s| kind.is_none_or(|k| s.kind == k) && !newer.iter().any(|(t, _)| *t == s.task_id));
            TaskStates { snapshots, newer, newest_known: live.newest_known() }
        };
        if let Some(live) = self.live() {
            live.caught_up(READ_LIMIT).await?;
            return Ok(states(&live));
        }
        Ok(states(&self.read_states(kind).await?))
    }

    /// Reads the task-state topics (of one kind, `Some`) to their ends once; the reader
    /// stops when the value is dropped.
    async fn read_states(&self, kind: Option<TaskKind>) -> Result<LiveState, ClientError> {
        let (kafka, topics, registry) = (self.kafka.clone(), self.topics.clone(), self.registry.clone());
        let once = tokio::task::spawn_blocking(move || LiveState::start_of(&kafka, &topics, registry, kind)).await.expect("task-state reader start task")?;
        once.follower().ready(READ_LIMIT).await?;
        Ok(once)
    }

    /// The latest snapshot of one task, as of the topics' ends at the call (see
    /// [`Self::snapshots`]); [`ClientError::NewerRecord`] when it is in a record version
    /// newer than this program knows.
    pub async fn snapshot(&self, id: TaskId) -> Result<Option<TaskSnapshot>, ClientError> {
        let of = |live: &LiveState| match live.newer(id) {
            Some(schema_id) => Err(ClientError::NewerRecord { task: id, schema_id, newest_known: live.newest_known() }),
            None => Ok(live.get(id)),
        };
        if let Some(live) = self.live() {
            live.caught_up(READ_LIMIT).await?;
            return of(&live);
        }
        of(&self.read_states(None).await?)
    }

    /// The snapshot a Cancel or Revert takes the task's kind and subject from (neither
    /// changes in a task's life): with a live view, the one it holds, at once; a task it
    /// does not hold yet (just submitted) is looked for again once it has caught up.
    async fn target(&self, id: TaskId) -> Result<TaskSnapshot, ClientError> {
        let found = match self.live() {
            Some(live) => match live.get(id) {
                Some(s) => Some(s),
                None => {
                    live.caught_up(READ_LIMIT).await?;
                    live.get(id)
                }
            },
            None => self.snapshot(id).await?,
        };
        found.ok_or(ClientError::UnknownTask(id))
    }

    /// Every progress event of one task so far, in order.
    pub async fn history(&self, id: TaskId) -> Result<Vec<ProgressEvent>, ClientError> {
        let key = id.to_string();
        let records = self.read_to_end(&self.progress_topic()).await?;
        let mut out: Vec<ProgressEvent> = records
            .into_iter()
            .filter(|(k, _)| k.as_deref() == Some(key.as_bytes()))
            .filter_map(|(_, p)| self.registry.decode::<ProgressEvent>(&p).ok())
            .collect();
        out.sort_by_key(|e| e.seq);
        Ok(out)
    }

    /// Every record of `topic` from its beginning to its current end, as (key, payload),
    /// in partition order (for compacted topics: what compaction has kept, newest last).
    pub async fn read_to_end(&self, topic: &str) -> Result<Vec<KeyedRecord>, ClientError> {
        let cfg = self.kafka.reader();
        let topic = topic.to_owned();
        let what = format!("reading {topic}");
        tokio::task::spawn_blocking(move || -> Result<Vec<KeyedRecord>, KafkaError> {
            let c: rdkafka::consumer::BaseConsumer = cfg.create()?;
            let md = c.fetch_metadata(Some(&topic), Duration::from_secs(30))?;
            let mut ends = std::collections::HashMap::new();
            let mut tpl = TopicPartitionList::new();
            for p in md.topics().iter().flat_map(|t| t.partitions()) {
                let (lo, hi) = c.fetch_watermarks(&topic, p.id(), Duration::from_secs(30))?;
                if hi > lo {
                    ends.insert(p.id(), hi);
                    tpl.add_partition_offset(&topic, p.id(), Offset::Beginning)?;
                }
            }
            c.assign(&tpl)?;
            let mut out = Vec::new();
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            while !ends.is_empty() && std::time::Instant::now() < deadline {
                let Some(m) = c.poll(Duration::from_millis(200)) else { continue };
                let m = m?;
                if ends.get(&m.partition()).is_some_and(|hi| m.offset() + 1 >= *hi) {
                    ends.remove(&m.partition());
                }
                if let Some(p) = m.payload() {
                    out.push((m.key().map(<[u8]>::to_vec), p.to_vec()));
                }
            }
            Ok(out)
        })
        .await
        .expect("topic reader task")
        .map_err(kafka(what))
    }

    /// Progress events from the beginning of the topic (`from_start`) or from its current
    /// end, so that nothing published after this call is missed.
    /// A tenant's client reads its own progress topic ([`Self::progress_topic`]).
    pub async fn events(&self, from_start: bool) -> Result<EventStream, ClientError> {
        let topic = self.progress_topic();
        let kafka_err = kafka(format!("assigning {topic}"));
        let cfg = self.kafka.clone();
        let consumer = tokio::task::spawn_blocking(move || cfg.topic_reader(&topic, from_start))
            .await
            .expect("progress reader set-up task")
            .map_err(kafka_err)?;
        Ok(EventStream { consumer, registry: self.registry.clone(), kept: Default::default() })
    }
}

/// A new W3C `traceparent` (version 00, random trace and span ids, sampled).
pub fn new_trace_parent() -> String {
    let trace: u128 = rand::random::<u128>().max(1);
    let span: u64 = rand::random::<u64>().max(1);
    format!("00-{trace:032x}-{span:016x}-01")
}

/// Progress events as they arrive. Events of other tasks met while [`Self::until`] waits
/// for one task are kept, in order, for later calls (tasks' events arrive interleaved
/// in any order across partitions).
pub struct EventStream {
    consumer: StreamConsumer,
    registry: Arc<Registry>,
    kept: std::collections::VecDeque<ProgressEvent>,
}

impl std::fmt::Debug for EventStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EventStream")
    }
}

impl EventStream {
    /// The next decodable event (undecodable ones are logged and skipped).
    pub async fn next(&mut self) -> Option<ProgressEvent> {
        if let Some(ev) = self.kept.pop_front() {
            return Some(ev);
        }
        self.next_new().await
    }

    async fn next_new(&mut self) -> Option<ProgressEvent> {
        loop {
            let m = self.consumer.stream().next().await?;
            match m {
                Ok(m) => match m.payload().map(|p| self.registry.decode::<ProgressEvent>(p)) {
                    Some(Ok(ev)) => return Some(ev),
                    // A newer Ferry's event (a newer version of a record gets a higher id):
                    // a follower of its task would wait for it in vain, so say what to do.
                    Some(Err(WireError::UnknownSchemaId(id))) if self.registry.id_of::<ProgressEvent>().is_ok_and(|known| id > known) => {
                        let task = m.key().map(String::from_utf8_lossy).unwrap_or_default();
                        tracing::warn!(task = %task, schema_id = id, "progress event in a record version newer than this ferry knows skipped: a newer Ferry's worker wrote it; upgrade this ferry to follow its task");
                    }
                    Some(Err(e)) => tracing::warn!(error = %e, "undecodable progress event skipped"),
                    None => {}
                },
                Err(e) => tracing::warn!(error = %e, "progress reader error"),
            }
        }
    }

    /// Collects the events of `task` until one satisfies `done`; fails after `limit`.
    pub async fn until(
        &mut self,
        task: TaskId,
        limit: Duration,
        mut done: impl FnMut(&ProgressEvent) -> bool,
    ) -> Result<Vec<ProgressEvent>, ClientError> {
        let key = task.to_string();
        let mut seen = Vec::new();
        // First the events of this task that earlier waits kept.
        let mut rest = std::collections::VecDeque::new();
        let mut finished = false;
        while let Some(ev) = self.kept.pop_front() {
            if finished || ev.task_id != key {
                rest.push_back(ev);
                continue;
            }
            finished = done(&ev);
            seen.push(ev);
        }
        self.kept = rest;
        if finished {
            return Ok(seen);
        }
        let r = tokio::time::timeout(limit, async {
            while let Some(ev) = self.next_new().await {
                if ev.task_id != key {
                    self.kept.push_back(ev);
                    continue;
                }
                let stop = done(&ev);
                seen.push(ev);
                if stop {
                    return true;
                }
            }
            false
        })
        .await;
        match r {
            Ok(true) => Ok(seen),
            _ => Err(ClientError::Timeout { task, waited: limit }),
        }
    }
}

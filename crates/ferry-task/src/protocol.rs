//! The wire records: command envelope, progress event, task snapshot (Avro, `schemas/*.avsc`).
//!
//! Record names match the Rust type names. Unions are kept out of the wire model (Avro
//! unions evolve badly): an event is one flat record whose `event` enum says which of the
//! optional fields are set. `schemas/` holds the committed `.avsc` of each record; a test
//! checks that the derived schemas equal them.

use std::collections::HashMap;

use apache_avro::AvroSchema;
use apache_avro::schema::{Name, Namespace, Schema, derive::AvroSchemaComponent};
use serde::{Deserialize, Serialize};

use crate::kind::TaskKind;

/// Raw bytes, as an Avro `bytes` field.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Bytes(#[serde(with = "apache_avro::serde_avro_bytes")] pub Vec<u8>);

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bytes({} bytes)", self.0.len())
    }
}

impl AvroSchemaComponent for Bytes {
    fn get_schema_in_ctxt(_: &mut HashMap<Name, Schema>, _: &Namespace) -> Schema {
        Schema::Bytes
    }
}

/// What a command asks of its task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, AvroSchema)]
#[avro(namespace = "io.ferry.v1")]
pub enum CommandAction {
    /// Start a new task with the envelope's spec.
    Start,
    /// Stop a running task promptly; finished steps stay, revertible later.
    Cancel,
    /// Undo a finished task, or cancel then undo a running one.
    Revert,
    /// Tell a queued or running task something a person decided: the envelope's `signal`
    /// names it (`approve`, `pause`, `resume` for a plan's waves). Recorded in the task's
    /// snapshot (once per idempotency key) for the step that waits for it. Version 3.
    Signal,
}

/// Every record on a command topic. Key = the task's subject.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, AvroSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct CommandEnvelope {
    /// `tsk_...`; for Cancel and Revert, the task they act on.
    pub task_id: String,
    /// Must match the command topic's kind.
    pub kind: TaskKind,
    /// Start, Cancel or Revert.
    pub action: CommandAction,
    /// What the task acts on (cluster, pair, namespace, app); tasks on one subject run in order.
    pub subject: String,
    /// A command with the key of an existing task starts nothing new.
    pub idempotency_key: Option<String>,
    /// Who asked (user or service), for audit.
    pub requested_by: String,
    /// Producer's clock, milliseconds since the epoch.
    pub created_at_ms: i64,
    /// Absolute deadline of the whole task, milliseconds since the epoch.
    pub deadline_ms: Option<i64>,
    /// On failure, keep finished steps instead of reverting them.
    pub keep_partial: bool,
    /// Free text for Cancel and Revert.
    pub reason: Option<String>,
    /// The kind's own spec record, Confluent-framed Avro (empty for Cancel and Revert).
    pub spec: Bytes,
    /// For Signal: its name (1 to 63 lowercase letters, digits and `-`). Version 3 of the
    /// schema (id 100); earlier versions have none.
    #[serde(default)]
    #[avro(default = "null")]
    pub signal: Option<String>,
}

/// The kinds of progress event, in the order a task usually meets them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, AvroSchema)]
#[avro(namespace = "io.ferry.v1")]
pub enum EventType {
    /// The command was valid and the task is durable; it runs when its subject is free.
    Accepted,
    /// The command was invalid; `message` says why. Nothing was done.
    Rejected,
    /// A step began (again, after a resume).
    StepStarted,
    /// A running step reported `percent` and `message`.
    StepProgress,
    /// A step finished; its output is in the journal.
    StepSucceeded,
    /// A step failed for good (`code`, `message`, `transient`).
    StepFailed,
    /// A step attempt failed transiently; attempt `attempt` follows after `delay_ms`.
    Retrying,
    /// Every step finished.
    Succeeded,
    /// A step failed and the command asked to keep partial work.
    Failed,
    /// A Cancel (or Revert of a running task) arrived.
    CancelRequested,
    /// The task stopped; finished steps stay.
    Cancelled,
    /// Undo of the task's steps began.
    Reverting,
    /// One step was undone.
    StepReverted,
    /// Every started step was undone.
    Reverted,
    /// An undo failed for good; a new Revert retries it.
    RevertFailed,
    /// A Signal reached the task and is in its snapshot (`message`: its name and who sent
    /// it). Version 3.
    Signalled,
}

impl std::fmt::Display for TaskState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.symbol())
    }
}

impl std::fmt::Display for EventType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `pad`: widths and alignment apply (`{:<10}` in a table).
        f.pad(self.name())
    }
}

impl EventType {
    /// The event's name as the protocol spells it (the Avro symbol: `Succeeded`,
    /// `StepFailed`); also its `Display`.
    pub fn name(self) -> &'static str {
        match self {
            EventType::Accepted => "Accepted",
            EventType::Rejected => "Rejected",
            EventType::StepStarted => "StepStarted",
            EventType::StepProgress => "StepProgress",
            EventType::StepSucceeded => "StepSucceeded",
            EventType::StepFailed => "StepFailed",
            EventType::Retrying => "Retrying",
            EventType::Succeeded => "Succeeded",
            EventType::Failed => "Failed",
            EventType::CancelRequested => "CancelRequested",
            EventType::Cancelled => "Cancelled",
            EventType::Reverting => "Reverting",
            EventType::StepReverted => "StepReverted",
            EventType::Reverted => "Reverted",
            EventType::RevertFailed => "RevertFailed",
            EventType::Signalled => "Signalled",
        }
    }

    /// The state an event of this type leaves its task in, where the type alone says it
    /// (`None`: the task stays as it was, e.g. a retry or progress in a run or an undo).
    /// What a reader of events only (a tenant) knows of a task's state.
    pub fn state_after(self) -> Option<TaskState> {
        match self {
            EventType::Accepted => Some(TaskState::Accepted),
            EventType::Rejected => Some(TaskState::Rejected),
            EventType::StepStarted | EventType::StepSucceeded => Some(TaskState::Running),
            EventType::Succeeded => Some(TaskState::Succeeded),
            EventType::Failed => Some(TaskState::Failed),
            EventType::Cancelled => Some(TaskState::Cancelled),
            EventType::Reverting | EventType::StepReverted => Some(TaskState::Reverting),
            EventType::Reverted => Some(TaskState::Reverted),
            EventType::RevertFailed => Some(TaskState::RevertFailed),
            EventType::StepProgress | EventType::StepFailed | EventType::Retrying | EventType::CancelRequested | EventType::Signalled => None,
        }
    }

    /// Events after which nothing more happens unless a new command arrives.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            EventType::Rejected
                | EventType::Succeeded
                | EventType::Failed
                | EventType::Cancelled
                | EventType::Reverted
                | EventType::RevertFailed
        )
    }
}

/// One record on the progress topic. Key = task id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, AvroSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct ProgressEvent {
    /// The task.
    pub task_id: String,
    /// Per-task sequence number, from 1, strictly increasing across workers and restarts.
    pub seq: i64,
    /// What happened.
    pub event: EventType,
    /// The task's kind.
    pub kind: TaskKind,
    /// The task's subject.
    pub subject: String,
    /// The worker instance that emitted it.
    pub worker: String,
    /// Worker's clock, milliseconds since the epoch.
    pub at_ms: i64,
    /// W3C `traceparent` of the command's trace.
    pub trace_parent: Option<String>,
    /// Step index from 1, for step events.
    pub step: Option<i32>,
    /// Step name, for step events.
    pub step_name: Option<String>,
    /// 0 to 100, for StepProgress.
    pub percent: Option<i32>,
    /// Human-readable detail (progress message, error, rejection reason).
    pub message: Option<String>,
    /// Stable error code, for failures.
    pub code: Option<String>,
    /// Whether the failure was transient.
    pub transient: Option<bool>,
    /// Attempt number, for Retrying.
    pub attempt: Option<i32>,
    /// Backoff before the next attempt, for Retrying.
    pub delay_ms: Option<i64>,
}

/// Where a task is. Terminal states change only through a new command (Revert).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, AvroSchema)]
#[avro(namespace = "io.ferry.v1")]
pub enum TaskState {
    /// Durable and waiting for its subject.
    Accepted,
    /// Running its steps.
    Running,
    /// Every step finished.
    Succeeded,
    /// A step failed; partial work kept on request.
    Failed,
    /// Stopped by a Cancel; finished steps kept.
    Cancelled,
    /// Undoing its steps.
    Reverting,
    /// Every started step undone.
    Reverted,
    /// An undo failed; a new Revert retries.
    RevertFailed,
    /// The command was invalid.
    Rejected,
}

impl TaskState {
    /// Every state, in a task's life order.
    pub const ALL: [TaskState; 9] = [
        TaskState::Accepted,
        TaskState::Running,
        TaskState::Succeeded,
        TaskState::Failed,
        TaskState::Cancelled,
        TaskState::Reverting,
        TaskState::Reverted,
        TaskState::RevertFailed,
        TaskState::Rejected,
    ];

    /// The name on the command line: `accepted`, ..., `revert-failed`.
    pub fn name(self) -> &'static str {
        match self {
            TaskState::Accepted => "accepted",
            TaskState::Running => "running",
            TaskState::Succeeded => "succeeded",
            TaskState::Failed => "failed",
            TaskState::Cancelled => "cancelled",
            TaskState::Reverting => "reverting",
            TaskState::Reverted => "reverted",
            TaskState::RevertFailed => "revert-failed",
            TaskState::Rejected => "rejected",
        }
    }

    /// The state's name as the protocol spells it (the Avro symbol: `Succeeded`,
    /// `RevertFailed`); also its `Display`.
    pub fn symbol(self) -> &'static str {
        match self {
            TaskState::Accepted => "Accepted",
            TaskState::Running => "Running",
            TaskState::Succeeded => "Succeeded",
            TaskState::Failed => "Failed",
            TaskState::Cancelled => "Cancelled",
            TaskState::Reverting => "Reverting",
            TaskState::Reverted => "Reverted",
            TaskState::RevertFailed => "RevertFailed",
            TaskState::Rejected => "Rejected",
        }
    }

    /// One line on what the state means (the CLI's `--help` lists it).
    pub fn describe(self) -> &'static str {
        match self {
            TaskState::Accepted => "Durable and waiting for its subject",
            TaskState::Running => "Running its steps",
            TaskState::Succeeded => "Every step finished",
            TaskState::Failed => "A step failed; partial work kept on request",
            TaskState::Cancelled => "Stopped by a Cancel; finished steps kept",
            TaskState::Reverting => "Undoing its steps",
            TaskState::Reverted => "Every started step undone",
            TaskState::RevertFailed => "An undo failed; a new Revert retries",
            TaskState::Rejected => "The command was invalid",
        }
    }

    /// No step runs in this state until a new command arrives.
    pub fn is_terminal(self) -> bool {
        !matches!(self, TaskState::Accepted | TaskState::Running | TaskState::Reverting)
    }

    /// A Revert command may start from this state.
    pub fn is_revertible(self) -> bool {
        matches!(
            self,
            TaskState::Succeeded | TaskState::Failed | TaskState::Cancelled | TaskState::RevertFailed
        )
    }
}

/// Where one step of the journal is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, AvroSchema)]
#[avro(namespace = "io.ferry.v1")]
pub enum StepStatus {
    /// Began; may have had effects (so a revert undoes it too).
    Started,
    /// Finished with the entry's output.
    Succeeded,
    /// Undone.
    Reverted,
}

/// One step in the task's journal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, AvroSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct JournalEntry {
    /// Index from 1.
    pub step: i32,
    /// The step's name.
    pub name: String,
    /// Started, Succeeded or Reverted.
    pub status: StepStatus,
    /// The step's output (JSON), what its undo needs.
    pub output: Option<String>,
    /// Attempts made by the last run.
    pub attempts: i32,
    /// When it (last) started.
    pub started_at_ms: i64,
    /// When it finished or was undone.
    pub finished_at_ms: Option<i64>,
}

impl JournalEntry {
    /// The journal as a reader of events only (a tenant) can know it: each step's status,
    /// attempts and times from its StepStarted, Retrying, StepSucceeded and StepReverted
    /// events (outputs are in the task state only), by step index.
    pub fn from_events(events: &[ProgressEvent]) -> Vec<JournalEntry> {
        let mut journal: std::collections::BTreeMap<i32, JournalEntry> = std::collections::BTreeMap::new();
        for e in events.iter().filter(|e| e.seq > 0) {
            let Some(step) = e.step else { continue };
            let name = e.step_name.clone().unwrap_or_default();
            match e.event {
                EventType::StepStarted => {
                    let entry = journal.entry(step).or_insert_with(|| JournalEntry { step, name: name.clone(), status: StepStatus::Started, output: None, attempts: 0, started_at_ms: e.at_ms, finished_at_ms: None });
                    entry.status = StepStatus::Started;
                    entry.attempts = e.attempt.unwrap_or(1);
                    entry.started_at_ms = e.at_ms;
                    entry.finished_at_ms = None;
                }
                EventType::Retrying => {
                    if let (Some(entry), Some(a)) = (journal.get_mut(&step), e.attempt) {
                        entry.attempts = a;
                    }
                }
                EventType::StepSucceeded | EventType::StepReverted => {
                    if let Some(entry) = journal.get_mut(&step) {
                        entry.status = if e.event == EventType::StepSucceeded { StepStatus::Succeeded } else { StepStatus::Reverted };
                        entry.finished_at_ms = Some(e.at_ms);
                    }
                }
                _ => {}
            }
        }
        journal.into_values().collect()
    }
}

/// Why a task failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, AvroSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct TaskError {
    /// Stable error code.
    pub code: String,
    /// What went wrong, for the operator.
    pub message: String,
    /// Failing step, from 1.
    pub step: Option<i32>,
    /// Whether the last error was transient (retries ran out).
    pub transient: bool,
}

impl TaskError {
    /// A task's error; its message cut to [`crate::limits::MESSAGE_BYTES`].
    pub fn new(code: impl Into<String>, message: impl Into<String>, step: Option<i32>, transient: bool) -> Self {
        Self { code: code.into(), message: crate::limits::bounded(message.into(), crate::limits::MESSAGE_BYTES), step, transient }
    }
}

/// The latest state of a task: one record per task on the compacted task-state topic.
/// This is the durable source of truth; there is no other database.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, AvroSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct TaskSnapshot {
    /// The task.
    pub task_id: String,
    /// Its kind.
    pub kind: TaskKind,
    /// Its subject.
    pub subject: String,
    /// Where it is.
    pub state: TaskState,
    /// Sequence number of the last event; written before that event is published.
    pub seq: i64,
    /// The last event.
    pub last_event: EventType,
    /// The command's idempotency key.
    pub idempotency_key: Option<String>,
    /// Who asked.
    pub requested_by: String,
    /// Command-topic partition the task came from: its owner is that partition's consumer.
    pub origin_partition: i32,
    /// Command-topic offset it came from: orders resumed tasks of one subject.
    pub origin_offset: i64,
    /// When the command was produced.
    pub created_at_ms: i64,
    /// When this snapshot was written.
    pub updated_at_ms: i64,
    /// Absolute deadline of the forward run.
    pub deadline_ms: Option<i64>,
    /// Keep partial work on failure.
    pub keep_partial: bool,
    /// Worker instance that wrote this snapshot.
    pub worker: String,
    /// W3C `traceparent` of the command.
    pub trace_parent: Option<String>,
    /// The spec, Confluent-framed Avro, so any worker can resume the task.
    pub spec: Bytes,
    /// Finished and started steps with their outputs.
    pub journal: Vec<JournalEntry>,
    /// Why it failed, if it did.
    pub error: Option<TaskError>,
    /// A Cancel arrived and has not been carried out yet.
    pub cancel_requested: bool,
    /// A Revert arrived and has not been carried out yet.
    pub revert_requested: bool,
    /// The Signals that reached the task, in order. Version 3 of the schema (id 102);
    /// earlier versions have none.
    #[serde(default)]
    #[avro(default = "[]")]
    pub signals: Vec<Signal>,
}

/// A Signal a task received ([`CommandAction::Signal`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, AvroSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct Signal {
    /// Its name.
    pub name: String,
    /// Who sent it, as the runtime established it (`tenant:<t>` for a tenant).
    pub by: String,
    /// When the worker recorded it (ms since the epoch).
    pub at_ms: i64,
    /// The command's idempotency key: a Signal redelivered with it is recorded once.
    pub key: Option<String>,
    /// The command's reason, if any.
    pub reason: Option<String>,
}

impl Signal {
    /// The message of the Signalled event that tells it.
    pub fn message(&self) -> String {
        let reason = self.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default();
        format!("signal {} from {}{reason}", self.name, self.by)
    }

    /// Longest signal name.
    pub const NAME_LEN: usize = 63;

    /// Why `name` may not name a signal, if it may not.
    pub fn invalid_name(name: &str) -> Option<String> {
        (!crate::kind::is_label(name.as_bytes(), Self::NAME_LEN)).then(|| format!("signal {name:?}: 1 to {} lowercase letters, digits and '-', starting and ending with a letter or digit", Self::NAME_LEN))
    }
}

impl TaskSnapshot {
    /// Most Signals a task keeps (they ride in its snapshot).
    pub const MAX_SIGNALS: usize = 100;

    /// Records `signal`; false when one with its idempotency key is recorded already (a
    /// redelivered command). Past [`Self::MAX_SIGNALS`], an error saying so.
    pub fn record_signal(&mut self, signal: Signal) -> Result<bool, String> {
        if signal.key.is_some() && self.signals.iter().any(|s| s.key == signal.key) {
            return Ok(false);
        }
        if self.signals.len() >= Self::MAX_SIGNALS {
            return Err(format!("task {} has received {} signals, the most a task keeps", self.task_id, Self::MAX_SIGNALS));
        }
        let reason = signal.reason.map(|r| crate::limits::bounded(r, crate::limits::SIGNAL_REASON_BYTES));
        self.signals.push(Signal { reason, ..signal });
        Ok(true)
    }

    /// The names of the Signals received, in order.
    pub fn signal_names(&self) -> Vec<String> {
        self.signals.iter().map(|s| s.name.clone()).collect()
    }

    /// The journaled output of step `step`, decoded (None: no such step, no output, or
    /// not a `T`).
    pub fn output_of<T: serde::de::DeserializeOwned>(&self, step: &str) -> Option<T> {
        self.journal.iter().find(|j| j.name == step).and_then(|j| serde_json::from_str(j.output.as_deref()?).ok())
    }
}

/// Milliseconds since the epoch, now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use apache_avro::{AvroSchema, Schema};

    use super::EventType;

    /// `EventType::name` is written out by hand: it must say every symbol of the schema
    /// as serde reads it, so a new or renamed event cannot print another name.
    #[test]
    fn event_names_are_the_schema_symbols() {
        let Schema::Enum(e) = EventType::get_schema() else { panic!("EventType is an Avro enum") };
        assert!(e.symbols.len() >= 16);
        for symbol in &e.symbols {
            let event: EventType = serde_json::from_value(serde_json::json!(symbol)).unwrap();
            assert_eq!(event.name(), symbol);
            assert_eq!(format!("{event:<16}|"), format!("{symbol:<16}|"), "Display pads");
        }
    }
}

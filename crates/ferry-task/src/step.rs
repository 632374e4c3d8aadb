//! What a worker writes: a [`TaskHandler`] validates a spec and plans its [`Step`]s; each
//! step has an idempotent `run` and `undo`. A step that changes nothing (a check, a wait)
//! implements [`CheckStep`] instead and gets an undo that does nothing.
//!
//! # Expected flow
//! The runtime runs the plan's steps in order: `run` until it succeeds (transient errors
//! retried with backoff within the step's [`StepPolicy`] and the task's deadline). When a
//! step fails for good, or the task is reverted, the runtime calls `undo` of every
//! started step in reverse order, the failed one included.
//!
//! # Guarantees (what the runtime promises a step)
//! - The steps of one task never run at once, and the tasks of one subject never
//!   overlap (docs/ARCHITECTURE.md, "Guarantees and their limits", says where the runtime
//!   falls short of this and how far).
//! - `undo` gets the step's journaled output when `run` finished, else `None`.
//! - A step's output is journaled before the next step starts: later steps read it
//!   through its typed key ([`crate::Output`]).
//!
//! # Assumptions (what a step must do; as kube-runtime's finalizer `Apply`/`Cleanup`)
//! - `run` may run more than once (a crash between its effect and the journal write, a
//!   rebalance, a retry): it must be idempotent, e.g. server-side apply.
//! - `undo` may run after `run` never ran, ran halfway, or ran to the end: it must tolerate
//!   all three, and be idempotent.
//! - `plan` returns the same steps for the same spec: a resumed task continues by index.
//!
//! # Caveats
//! - Waiting is a watch with a deadline inside `run`; the runtime drops the future on
//!   cancel, revoke or timeout, so every await point must be a safe place to stop.
//! - Only a step before any step with effects may return [`StepError::rejected`].
//!
//! # Errors
//! A [`StepError`] carries a code from [`crate::codes`], a message with the context an
//! operator needs, and whether it is transient (retried) or rejects the command.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use apache_avro::AvroSchema;
use backon::ExponentialBuilder;
use futures::future::BoxFuture;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::ids::TaskId;
use crate::kind::TaskKind;

/// A step failure, with the operator-facing code and whether retrying may help.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct StepError {
    /// Stable, greppable code (`CLUSTER_NOT_READY`, `DEADLINE_EXCEEDED`, ...).
    pub code: String,
    /// What went wrong, with the context an operator needs.
    pub message: String,
    /// Retrying may succeed (network, 5xx, conflicts, not-yet-ready).
    pub transient: bool,
    /// The command itself is invalid against the live state (a referenced Secret or
    /// cluster that does not exist, a placement nothing satisfies): the task ends
    /// Rejected. Only a step that comes before any step with effects may reject.
    pub rejects: bool,
    /// The step put back what of its own work had to go (a plan's failed wave) and asks the
    /// task to keep its finished steps: it ends Failed, as with keep-partial, and a later
    /// Revert undoes the rest. Only for permanent failures.
    pub keeps_done: bool,
    /// What the step did before it failed (JSON text), kept in its journal entry and given
    /// to its undo as `output`: a step that starts many things records which it started.
    pub output: Option<String>,
}

impl StepError {
    /// A failure worth retrying.
    pub fn transient(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self { code: code.into(), message: message.into(), transient: true, rejects: false, keeps_done: false, output: None }
    }

    /// A failure that retrying cannot fix.
    pub fn permanent(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self { code: code.into(), message: message.into(), transient: false, rejects: false, keeps_done: false, output: None }
    }

    /// The command is invalid against the live state: the task ends Rejected, as if its
    /// spec had failed validation. Use it only in steps that precede every effect.
    pub fn rejected(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self { code: code.into(), message: message.into(), transient: false, rejects: true, keeps_done: false, output: None }
    }

    /// This failure, asking the task to keep its finished steps (see [`Self::keeps_done`]).
    pub fn keeping_done(mut self) -> Self {
        self.keeps_done = true;
        self
    }

    /// This failure, with what the step did before it (see [`Self::output`]).
    pub fn with_output(mut self, output: &Value) -> Self {
        self.output = Some(output.to_string());
        self
    }
}

/// Why a command's spec is refused before anything is done.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct Rejection {
    /// Precise reason, naming the field and the rule.
    pub reason: String,
}

impl Rejection {
    /// A rejection with `reason`.
    pub fn new(reason: impl Into<String>) -> Self {
        Self { reason: reason.into() }
    }
}

/// Timeout and retry policy of one step.
#[derive(Debug, Clone)]
pub struct StepPolicy {
    /// Limit of one attempt (also bounded by the task's deadline).
    pub timeout: Duration,
    /// Attempts after the first for transient errors.
    pub max_retries: usize,
    /// First backoff delay.
    pub min_delay: Duration,
    /// Largest backoff delay.
    pub max_delay: Duration,
    /// How long the step's undo keeps retrying transient errors: the waits between its
    /// attempts add up to at most this (`max_retries` does not bound an undo). A revert is
    /// what puts a fleet back, often after the outage that failed the run; an undo that
    /// gave up as soon as the run did would end RevertFailed and leave the work behind.
    pub undo_patience: Duration,
}

impl Default for StepPolicy {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(300),
            max_retries: 5,
            min_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(30),
            undo_patience: Duration::from_secs(600),
        }
    }
}

impl StepPolicy {
    /// Exponential backoff with jitter for the step's run, from `backon`.
    pub fn backoff(&self) -> ExponentialBuilder {
        ExponentialBuilder::default()
            .with_min_delay(self.min_delay)
            .with_max_delay(self.max_delay)
            .with_max_times(self.max_retries)
            .with_jitter()
    }

    /// The backoff of the step's undo: the same delays, bounded by [`Self::undo_patience`]
    /// instead of a number of attempts.
    pub fn undo_backoff(&self) -> ExponentialBuilder {
        ExponentialBuilder::default()
            .with_min_delay(self.min_delay)
            .with_max_delay(self.max_delay)
            .without_max_times()
            .with_total_delay(Some(self.undo_patience))
            .with_jitter()
    }
}

/// What a running step reports to the runtime that runs it.
#[derive(Debug)]
pub enum StepReport {
    /// A StepProgress event to publish.
    Progress {
        /// 0-100.
        percent: u8,
        /// What is going on.
        message: String,
    },
}

/// Everything a step sees of its task.
pub struct StepContext<'a, S> {
    /// The task.
    pub task_id: &'a TaskId,
    /// Its subject.
    pub subject: &'a str,
    /// Its spec.
    pub spec: &'a S,
    /// Outputs of the finished steps, by step name.
    pub outputs: &'a BTreeMap<String, Value>,
    /// 1 for the first attempt of this run.
    pub attempt: u32,
    /// The task's deadline (ms since the epoch), if its command set one: what a step that
    /// starts other tasks (a plan's child) passes on to them.
    pub deadline_ms: Option<i64>,
    /// Whether the task keeps its finished steps on failure instead of reverting them.
    pub keep_partial: bool,
    /// W3C trace context of this step's span: a task this step starts is traced under it.
    pub trace_parent: Option<String>,
    /// Who asked for the task, as the runtime established it (`tenant:<name>` for a
    /// tenant's task): a task this step starts is asked for on the same behalf.
    pub requested_by: &'a str,
    reports: mpsc::UnboundedSender<StepReport>,
    /// The names of the task's Signals so far (`None`: a context without a runtime, which
    /// has none).
    signals: Option<tokio::sync::watch::Receiver<Vec<String>>>,
}

impl<'a, S> StepContext<'a, S> {
    /// The context of one attempt of a step; `reports` carries its progress to the runtime.
    pub fn new(
        task_id: &'a TaskId,
        subject: &'a str,
        spec: &'a S,
        outputs: &'a BTreeMap<String, Value>,
        attempt: u32,
        reports: mpsc::UnboundedSender<StepReport>,
    ) -> Self {
        Self { task_id, subject, spec, outputs, attempt, deadline_ms: None, keep_partial: false, trace_parent: None, requested_by: "", reports, signals: None }
    }

    /// The task's Signals as the runtime records them (see [`Self::signals`]).
    pub fn with_signals(mut self, signals: tokio::sync::watch::Receiver<Vec<String>>) -> Self {
        self.signals = Some(signals);
        self
    }

    /// The names of the Signals the task has received so far, in order (durable: a resumed
    /// task sees the ones it received before). A person's decisions reach a step this way
    /// (`ferry tasks signal ID approve`).
    pub fn signals(&self) -> Vec<String> {
        self.signals.as_ref().map(|s| s.borrow().clone()).unwrap_or_default()
    }

    /// Waits until `until` accepts the task's Signals (checked at once, then at each new
    /// one). Without a runtime (no signals can come) it waits for ever: bound it with the
    /// step's timeout or a `select!`.
    pub async fn wait_for_signals(&self, mut until: impl FnMut(&[String]) -> bool) {
        let Some(rx) = &self.signals else { return std::future::pending().await };
        let mut rx = rx.clone();
        loop {
            if until(&rx.borrow_and_update()) {
                return;
            }
            if rx.changed().await.is_err() {
                // The runner is gone: the step is being dropped with it.
                return std::future::pending().await;
            }
        }
    }

    /// Who asked for the task (see the field).
    pub fn with_requester(mut self, requested_by: &'a str) -> Self {
        self.requested_by = requested_by;
        self
    }

    /// The task's deadline, keep-partial and the step's trace context (see the fields).
    pub fn with_task(mut self, deadline_ms: Option<i64>, keep_partial: bool, trace_parent: Option<String>) -> Self {
        self.deadline_ms = deadline_ms;
        self.keep_partial = keep_partial;
        self.trace_parent = trace_parent;
        self
    }

    /// Publishes a StepProgress event (best effort, in order).
    pub fn progress(&self, percent: u8, message: impl Into<String>) {
        let _ = self.reports.send(StepReport::Progress { percent: percent.min(100), message: message.into() });
    }

    /// The output of an earlier step, decoded.
    pub fn output_of<T: DeserializeOwned>(&self, step: &str) -> Option<T> {
        self.outputs.get(step).and_then(|v| serde_json::from_value(v.clone()).ok())
    }

    /// The output of an earlier step the plan guarantees ran; an internal error if absent.
    pub fn required<T: DeserializeOwned>(&self, step: &str) -> Result<T, StepError> {
        self.output_of(step).ok_or_else(|| StepError::permanent(crate::codes::INTERNAL, format!("the {step} step left no output")))
    }
}

/// One step of a task: an idempotent `run` and its `undo`.
pub trait Step<S>: Send + Sync {
    /// Stable name, shown in progress and used as the output key.
    fn name(&self) -> &str;

    /// Timeout and retries.
    fn policy(&self) -> StepPolicy {
        StepPolicy::default()
    }

    /// Does the work; returns what `undo` (and later steps) need.
    fn run<'a>(&'a self, cx: &'a StepContext<'a, S>) -> BoxFuture<'a, Result<Value, StepError>>;

    /// Undoes the work; `output` is what `run` returned, or what its failure recorded
    /// ([`StepError::with_output`]), or `None` when it did not finish and recorded nothing.
    fn undo<'a>(&'a self, cx: &'a StepContext<'a, S>, output: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>>;

    /// Called once a Cancel interrupted `run` (its future dropped after CancelRequested
    /// was durable), before the task ends Cancelled: a step whose run set work going
    /// elsewhere (a plan's child task) stops it there. Not called when the task only moves
    /// to another worker, nor for a Revert (the undo that follows deals with the step).
    /// Bounded by the step's policy; its failure is logged and the cancel goes on.
    fn on_cancel<'a>(&'a self, _cx: &'a StepContext<'a, S>) -> BoxFuture<'a, Result<(), StepError>> {
        Box::pin(async { Ok(()) })
    }

    /// Whether running this step may change anything outside Kafka. A rejection
    /// ([`StepError::rejected`]) ends a task Rejected only while no step before it acts;
    /// after one acted, the runtime treats it as a permanent failure, which reverts (or
    /// keeps the partial work with `keep_partial`). A [`CheckStep`] does not act.
    fn acts(&self) -> bool {
        true
    }
}

/// A step that changes nothing (a check of the live state, a wait for a condition): its
/// undo has nothing to put back. Implementing it gives the [`Step`] with a no-op undo.
pub trait CheckStep<S>: Send + Sync {
    /// Stable name, shown in progress and used as the output key.
    fn name(&self) -> &str;

    /// Timeout and retries.
    fn policy(&self) -> StepPolicy {
        StepPolicy::default()
    }

    /// Checks or waits; returns what later steps need.
    fn run<'a>(&'a self, cx: &'a StepContext<'a, S>) -> BoxFuture<'a, Result<Value, StepError>>;
}

impl<S, C: CheckStep<S>> Step<S> for C {
    fn name(&self) -> &str {
        CheckStep::name(self)
    }

    fn policy(&self) -> StepPolicy {
        CheckStep::policy(self)
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, S>) -> BoxFuture<'a, Result<Value, StepError>> {
        CheckStep::run(self, cx)
    }

    fn acts(&self) -> bool {
        false
    }

    fn undo<'a>(&'a self, _: &'a StepContext<'a, S>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        Box::pin(async { Ok(()) })
    }
}

/// A worker's logic for one task kind.
pub trait TaskHandler: Send + Sync + 'static {
    /// The command's own record (Avro, registered in `schemas/`).
    type Spec: Serialize + DeserializeOwned + AvroSchema + Clone + Send + Sync + 'static;

    /// The kind this handler serves.
    fn kind(&self) -> TaskKind;

    /// Checks a spec before anything is done; the reason goes into the Rejected event.
    fn validate(&self, subject: &str, spec: &Self::Spec) -> Result<(), Rejection>;

    /// What a (valid) spec acts on: a tenant's command is refused unless its policy allows
    /// every target. Every kind says, so that no kind is open to tenants by omission.
    fn targets(&self, subject: &str, spec: &Self::Spec) -> crate::targets::Targets;

    /// The steps of the task, in order. Same spec, same steps.
    fn plan(&self, spec: &Self::Spec) -> Vec<Arc<dyn Step<Self::Spec>>>;

    /// This handler's own gauges, read at each scrape of the worker's `/metrics` (none by
    /// default).
    fn gauges(&self) -> Vec<crate::gauges::GaugeFamily> {
        Vec::new()
    }
}

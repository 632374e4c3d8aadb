//! Runs one task: its steps forward with retries, timeouts and the deadline, or its undo in
//! reverse; answers Cancel, Revert and Stop while it runs. It is the only writer of its
//! task's snapshot while it runs, and hands the snapshot back to the scheduler when done.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::BackoffBuilder;
use futures::future::BoxFuture;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::codes;
use crate::ids::TaskId;
use crate::protocol::{EventType, JournalEntry, StepStatus, TaskError, TaskSnapshot, TaskState, now_ms};
use crate::publisher::{Detail, PublishError, Publisher};
use crate::step::{Step, StepContext, StepError, StepPolicy, StepReport, TaskHandler};
use crate::metrics::Metrics;

/// What the scheduler may ask of a running task.
#[derive(Debug)]
pub(crate) enum Control {
    /// Stop promptly; keep what is done.
    Cancel { reply: oneshot::Sender<ControlReply> },
    /// Stop, then undo everything started.
    Revert { reply: oneshot::Sender<ControlReply> },
    /// Ownership is moving (revoke, shutdown): reach a safe point within `grace` and exit
    /// without a final state, so the next owner resumes.
    Stop { grace: Duration, reply: oneshot::Sender<ControlReply> },
    /// Record a Signal and tell the running step.
    Signal { signal: crate::protocol::Signal, reply: oneshot::Sender<ControlReply> },
}

/// The runner's answer to a control.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ControlReply {
    /// Carried out (made durable) by the runner.
    Handled,
    /// The runner had already handed its task back; the scheduler must handle it.
    Finished,
    /// Refused, for this reason (a Signal past the most a task keeps): the scheduler tells
    /// the sender with a Rejected event, as it does for a queued task.
    Refused(String),
}

/// A runner handing its task back.
#[derive(Debug)]
pub(crate) struct Done {
    pub task_id: TaskId,
    /// Which run of the task this is (the scheduler numbers the runners it starts): a
    /// hand-back from a run the scheduler gave up is told from the current run's.
    pub run: u64,
    pub snapshot: TaskSnapshot,
    /// Left for the next owner (Stop) rather than settled.
    pub stopped: bool,
    /// Left because another worker wrote the task while this one ran it
    /// ([`crate::state_view::StateView::guard`]): the scheduler takes it up again later,
    /// from the newest snapshot, if it still owns the partition.
    pub overtaken: bool,
    /// Left because its state could not be written (the broker refused or timed out):
    /// the scheduler makes the same write again, then runs the task again, before any
    /// other task of its subject.
    pub unwritten: Option<Unwritten>,
}

/// The write a runner could not make: its snapshot is the one handed back.
#[derive(Debug, Clone)]
pub(crate) struct Unwritten {
    /// The events to write after that snapshot, in order (none: the snapshot alone): the
    /// transition's event, after every earlier one not acknowledged or held for it; or a
    /// batch's deferred controls' events, a seq-0 answer with the command it answers.
    pub events: Vec<crate::publisher::Outgoing>,
}

/// What a runner shares with every other runner of its worker.
pub(crate) struct Env<H: TaskHandler> {
    pub handler: Arc<H>,
    pub publisher: Arc<Publisher>,
    pub metrics: Arc<Metrics>,
    pub registry: Arc<crate::wire::Registry>,
    /// The tenants' policy, checked again when a tenant's task is taken up.
    pub policy: Option<Arc<crate::tenants::Policy>>,
}

enum Flow {
    /// The snapshot changed state; decide again.
    Continue,
    /// Stopped for the next owner.
    Stopped,
}

/// The task as a step sees it, owned for the length of one run, cancel hook or undo
/// ([`Runner::scope`]): one place builds every [`StepContext`].
struct StepScope {
    id: TaskId,
    subject: String,
    outputs: BTreeMap<String, Value>,
    /// The task's deadline for a forward run; none for a cancel hook or an undo.
    deadline_ms: Option<i64>,
    keep_partial: bool,
    trace_parent: Option<String>,
    requested_by: String,
    signals: tokio::sync::watch::Receiver<Vec<String>>,
}

impl StepScope {
    fn cx<'a, S>(&'a self, spec: &'a S, attempt: u32, reports: mpsc::UnboundedSender<StepReport>) -> StepContext<'a, S> {
        StepContext::new(&self.id, &self.subject, spec, &self.outputs, attempt, reports)
            .with_task(self.deadline_ms, self.keep_partial, self.trace_parent.clone())
            .with_requester(&self.requested_by)
            .with_signals(self.signals.clone())
    }
}

/// Which attempts [`Runner::execute`] makes: a step's run (or its cancel hook), which a
/// Cancel or Revert may interrupt and `max_retries` bounds, or an undo, which runs to its
/// end and retries transient errors for the step's `undo_patience`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attempts {
    Forward,
    Undo,
}

/// `d` as people write it (`10m`, `1s`).
fn human(d: Duration) -> String {
    jiff::SignedDuration::try_from(d).map(|d| format!("{d:#}")).unwrap_or_else(|_| format!("{}s", d.as_secs()))
}

enum Exec<T> {
    Ok(T, u32),
    Err(StepError, u32),
    /// A Cancel or Revert arrived and is durable (CancelRequested published).
    Cancelled,
    /// A Stop's grace ran out, or it came between attempts.
    Stopped,
}

/// Why a journal does not fit a plan, if it does not: more entries than steps, or an
/// entry whose name is not the plan's step at its index.
fn plan_mismatch<S>(journal: &[JournalEntry], steps: &[Arc<dyn Step<S>>]) -> Option<String> {
    if journal.len() > steps.len() {
        return Some(format!("the journal has {} steps, the plan {}", journal.len(), steps.len()));
    }
    journal.iter().zip(steps).enumerate().find(|(_, (e, s))| e.name != s.name()).map(|(i, (e, s))| {
        format!("step {} is {:?} in the journal but {:?} in the plan: the plan changed since the task started", i + 1, e.name, s.name())
    })
}

pub(crate) struct Runner<H: TaskHandler> {
    env: Arc<Env<H>>,
    id: TaskId,
    snap: TaskSnapshot,
    ctl: mpsc::Receiver<Control>,
    done: mpsc::UnboundedSender<Done>,
    stop: Option<(Instant, oneshot::Sender<ControlReply>)>,
    /// Cancelled when this worker gives the task's partition up for good (the revoke grace
    /// ran out, or the assignment was lost): nothing more is written, no step goes on.
    fence: CancellationToken,
    /// Set, with the fence cancelled, when another worker wrote this task meanwhile.
    overtaken: Arc<std::sync::atomic::AtomicBool>,
    /// This run's `ferry.task` span, under the command's trace.
    otel: opentelemetry::Context,
    /// The scheduler's number for this run (see [`Done::run`]).
    run: u64,
    /// Events sent and not yet acknowledged, and events held for the next snapshot
    /// ([`Publisher::transition`], [`Publisher::hold`]).
    in_flight: crate::publisher::InFlight,
    /// The names of the task's Signals, as steps see them ([`StepContext::signals`]).
    signals: tokio::sync::watch::Sender<Vec<String>>,
}

impl<H: TaskHandler> Runner<H> {
    pub(crate) fn new(
        env: Arc<Env<H>>,
        id: TaskId,
        snap: TaskSnapshot,
        ctl: mpsc::Receiver<Control>,
        done: mpsc::UnboundedSender<Done>,
        (fence, overtaken): (CancellationToken, Arc<std::sync::atomic::AtomicBool>),
        run: u64,
    ) -> Self {
        let signals = tokio::sync::watch::Sender::new(snap.signal_names());
        let in_flight = crate::publisher::InFlight::fenced_by(fence.clone());
        Self { env, id, snap, ctl, done, stop: None, fence, overtaken, otel: opentelemetry::Context::new(), run, in_flight, signals }
    }

    /// Fails once the task is fenced: its partition belongs to another worker now, or
    /// another worker wrote the task past this run's seq (seen by the view's guard, or here
    /// before a write: the newest snapshot the view holds is not this run's).
    fn fenced(&self) -> Result<(), PublishError> {
        if !self.fence.is_cancelled()
            && let Some(seq) = self.env.publisher.view().seq_of(&self.id)
            && seq > self.snap.seq
        {
            tracing::warn!(task = %self.id, seq, held = self.snap.seq, "another worker wrote this task past this run's seq: stopping it");
            self.overtaken.store(true, std::sync::atomic::Ordering::Relaxed);
            self.fence.cancel();
        }
        if self.fence.is_cancelled() {
            return Err(PublishError::Fenced { task: self.snap.task_id.clone() });
        }
        Ok(())
    }

    /// Publishes a transition of this task, unless it is fenced (checked before the write,
    /// and after it: a write that was in flight when the fence fell is the last one).
    async fn transition(&mut self, event: EventType, d: Detail) -> Result<(), PublishError> {
        self.fenced()?;
        let written = self.env.publisher.transition(&mut self.snap, event, d, &mut self.in_flight).await;
        // Fenced meanwhile: the write failing (purged when the assignment was lost) or not,
        // the task is another worker's now.
        self.fenced()?;
        written
    }

    /// Advances the task by an event written with the next transition ([`Publisher::hold`]).
    fn hold(&mut self, event: EventType, d: Detail) -> Result<(), PublishError> {
        self.fenced()?;
        self.env.publisher.hold(&mut self.snap, event, d, &mut self.in_flight);
        Ok(())
    }

    /// Drives the task, hands it back, then answers late controls with `Finished` until
    /// the scheduler lets go.
    pub(crate) async fn run(mut self) {
        let parent = crate::telemetry::context_of(self.snap.trace_parent.as_deref());
        let attrs = vec![
            opentelemetry::KeyValue::new("ferry.task_id", self.snap.task_id.clone()),
            opentelemetry::KeyValue::new("ferry.subject", self.snap.subject.clone()),
        ];
        self.otel = crate::telemetry::start(format!("ferry.task {}", self.snap.kind), opentelemetry::trace::SpanKind::Consumer, &parent, attrs);
        let logs = crate::telemetry::task_log_span(&self.otel, &self.snap);
        let mut driven = tracing::Instrument::instrument(self.drive(), logs.clone()).await;
        // The last event's acknowledgement, before the task is handed back: whatever the
        // scheduler writes for the task next (a control, another run) comes after it.
        if !matches!(driven, Err(PublishError::Fenced { .. }))
            && let Err(e) = self.env.publisher.finish(&self.snap, &mut self.in_flight).await
        {
            driven = Err(match self.fenced() {
                Err(fenced) => fenced,
                Ok(()) => e,
            });
        }
        let error = match (&driven, &self.snap.error) {
            (Err(e), _) => Some(e.to_string()),
            (Ok(_), Some(e)) if !matches!(self.snap.state, TaskState::Succeeded) => Some(format!("{}: {}", e.code, e.message)),
            _ => None,
        };
        crate::telemetry::end(&self.otel, error);
        logs.in_scope(|| tracing::debug!(state = ?self.snap.state, "task run ended"));
        let overtaken = self.overtaken.load(std::sync::atomic::Ordering::Relaxed);
        let (stopped, unwritten) = match driven {
            Ok(stopped) => (stopped, None),
            Err(PublishError::Fenced { .. }) if overtaken => {
                tracing::warn!(task = %self.id, "task overtaken by another worker's write; stopped without another write, to be taken up again later");
                (true, None)
            }
            Err(PublishError::Fenced { .. }) => {
                tracing::warn!(task = %self.id, "task fenced: its partition moved to another worker; stopped without another write");
                (true, None)
            }
            Err(e) => {
                // The broker refused our writes for the whole message timeout. The write
                // may or may not be durable: the scheduler makes it again, identical (same
                // seq, same event), before the task goes on.
                tracing::error!(task = %self.id, error = %e, "task paused: its state could not be written; it runs again first in its subject");
                let events = match e {
                    PublishError::Transition { event, mut before, .. } => {
                        before.push(*event);
                        before
                    }
                    _ => Vec::new(),
                };
                (true, Some(Unwritten { events: events.into_iter().map(Into::into).collect() }))
            }
        };
        let _ = self.done.send(Done { task_id: self.id, run: self.run, snapshot: self.snap.clone(), stopped, overtaken, unwritten });
        if let Some((_, reply)) = self.stop.take() {
            let _ = reply.send(ControlReply::Handled);
        }
        while let Some(c) = self.ctl.recv().await {
            let reply = match c {
                Control::Cancel { reply } | Control::Revert { reply } | Control::Stop { reply, .. } | Control::Signal { reply, .. } => reply,
            };
            let _ = reply.send(ControlReply::Finished);
        }
    }

    fn stopping(&self) -> bool {
        self.stop.is_some()
    }

    async fn drive(&mut self) -> Result<bool, PublishError> {
        let spec: H::Spec = match self.env.registry.decode(&self.snap.spec.0) {
            Ok(s) => s,
            Err(e) => {
                // Accepted specs decode by construction; this is a registry mismatch.
                self.snap.state = TaskState::Failed;
                self.snap.error = Some(TaskError::new("SPEC_UNDECODABLE", e.to_string(), None, false));
                let d = Detail { code: Some("SPEC_UNDECODABLE".into()), ..Detail::default() }.message(e.to_string());
                self.transition(EventType::Failed, d).await?;
                return Ok(false);
            }
        };
        if let Some(why) = self.invalid_spec(&spec) {
            // The intake validated it; a snapshot that fails now was not written by one (or
            // the rules grew stricter): run nothing of it, forward or back.
            tracing::error!(task = %self.id, %why, "the stored spec does not pass validation; nothing of it runs");
            self.refuse(codes::SPEC_INVALID, why).await?;
            return Ok(false);
        }
        let steps = self.env.handler.plan(&spec);
        if let Some(why) = plan_mismatch(&self.snap.journal, &steps) {
            // Resume and undo go by step index: with another plan they would run, or undo,
            // the wrong step. Stop here, saying so.
            tracing::error!(task = %self.id, %why, "the task's journal does not match its plan");
            self.refuse(codes::PLAN_CHANGED, why).await?;
            return Ok(false);
        }
        loop {
            if self.stopping() {
                return Ok(true);
            }
            let flow = match self.snap.state {
                TaskState::Accepted | TaskState::Running if self.snap.cancel_requested => {
                    self.snap.state = TaskState::Cancelled;
                    self.snap.cancel_requested = false;
                    self.transition(EventType::Cancelled, Detail::default()).await?;
                    Flow::Continue
                }
                TaskState::Accepted | TaskState::Running => self.forward(&spec, &steps).await?,
                TaskState::Reverting => self.revert(&spec, &steps).await?,
                s if self.snap.revert_requested && s.is_revertible() => {
                    self.snap.state = TaskState::Reverting;
                    self.snap.revert_requested = false;
                    self.transition(EventType::Reverting, Detail::default()).await?;
                    Flow::Continue
                }
                _ => {
                    if self.snap.revert_requested || self.snap.cancel_requested {
                        // Nothing left to cancel or revert (e.g. Revert of a Reverted task).
                        self.snap.revert_requested = false;
                        self.snap.cancel_requested = false;
                        self.fenced()?;
                        self.env.publisher.enqueue_snapshot(&self.snap)?.durable().await?;
                    }
                    return Ok(false);
                }
            };
            if let Flow::Stopped = flow {
                return Ok(true);
            }
        }
    }

    /// Ends a task that must not run, forward or back, with `code` and `why`: Failed, or
    /// RevertFailed for one reverting or asked to; a settled task is left as it is.
    async fn refuse(&mut self, code: &str, why: String) -> Result<(), PublishError> {
        let (state, event) = match self.snap.state {
            TaskState::Accepted | TaskState::Running => (TaskState::Failed, EventType::Failed),
            TaskState::Reverting => (TaskState::RevertFailed, EventType::RevertFailed),
            s if self.snap.revert_requested && s.is_revertible() => (TaskState::RevertFailed, EventType::RevertFailed),
            _ => return Ok(()),
        };
        self.snap.state = state;
        self.snap.revert_requested = false;
        self.snap.cancel_requested = false;
        self.snap.error = Some(TaskError::new(code, why.clone(), None, false));
        let d = Detail { code: Some(code.into()), ..Detail::default() }.message(why);
        self.transition(event, d).await
    }

    /// Why the stored spec would not be accepted now: the kind's `validate`, and for a
    /// tenant's task (`requested_by` `tenant:<name>`) the tenant's policy.
    fn invalid_spec(&self, spec: &H::Spec) -> Option<String> {
        if let Err(r) = self.env.handler.validate(&self.snap.subject, spec) {
            return Some(format!("the stored {} spec is not valid: {}", self.snap.kind, r.reason));
        }
        let tenant = self.snap.requested_by.strip_prefix("tenant:")?;
        let verdict = match &self.env.policy {
            Some(p) => p.check(tenant, self.snap.kind, &self.env.handler.targets(&self.snap.subject, spec)),
            None => Err(format!("task of tenant {tenant:?}, and this worker has no tenant policy")),
        };
        verdict.err().map(|why| format!("the stored spec is outside its tenant's policy now: {why}"))
    }

    /// What every context of one step run, cancel hook or undo is built from (each
    /// attempt gets its own [`StepContext`] from it).
    fn scope(&self, outputs: BTreeMap<String, Value>, deadline_ms: Option<i64>, trace_parent: Option<String>) -> StepScope {
        StepScope {
            id: self.id,
            subject: self.snap.subject.clone(),
            outputs,
            deadline_ms,
            keep_partial: self.snap.keep_partial,
            trace_parent,
            requested_by: self.snap.requested_by.clone(),
            signals: self.signals.subscribe(),
        }
    }

    fn outputs(&self) -> BTreeMap<String, Value> {
        self.snap
            .journal
            .iter()
            .filter(|e| e.status == StepStatus::Succeeded)
            .filter_map(|e| Some((e.name.clone(), serde_json::from_str(e.output.as_deref()?).ok()?)))
            .collect()
    }

    async fn forward(&mut self, spec: &H::Spec, steps: &[Arc<dyn Step<H::Spec>>]) -> Result<Flow, PublishError> {
        let first = self
            .snap
            .journal
            .iter()
            .take_while(|e| e.status == StepStatus::Succeeded)
            .count();
        let deadline = self.snap.deadline_ms;
        for (i, step) in steps.iter().enumerate().skip(first) {
            if self.stopping() {
                return Ok(Flow::Stopped);
            }
            let name = step.name().to_owned();
            let entry = JournalEntry {
                step: i as i32 + 1,
                name: name.clone(),
                status: StepStatus::Started,
                output: None,
                attempts: 0,
                started_at_ms: now_ms(),
                finished_at_ms: None,
            };
            match self.snap.journal.get_mut(i) {
                Some(e) => *e = entry,
                None => self.snap.journal.push(entry),
            }
            self.snap.state = TaskState::Running;
            self.transition(EventType::StepStarted, Detail::step(i, &name)).await?;
            let outputs = self.outputs();
            let started = Instant::now();
            let step_cx = crate::telemetry::start(format!("ferry.step {name}"), opentelemetry::trace::SpanKind::Internal, &self.otel, vec![opentelemetry::KeyValue::new("ferry.step", i as i64 + 1)]);
            let policy = step.policy();
            let scope = self.scope(outputs, deadline, crate::telemetry::traceparent(&step_cx));
            let scope = &scope;
            let result = self
                .execute(i, &name, &policy, deadline, Attempts::Forward, move |attempt, reports| {
                    Box::pin(async move { step.run(&scope.cx(spec, attempt, reports)).await })
                })
                .await?;
            self.env.metrics.step_finished(self.snap.kind, &name, started.elapsed());
            crate::telemetry::end(&step_cx, match &result {
                Exec::Err(e, _) => Some(format!("{}: {}", e.code, e.message)),
                _ => None,
            });
            let result = match result {
                Exec::Ok(output, attempts) => self.bounded_output(i, output, attempts),
                other => other,
            };
            match result {
                Exec::Ok(output, attempts) => {
                    let e = &mut self.snap.journal[i];
                    e.status = StepStatus::Succeeded;
                    e.output = Some(output.to_string());
                    e.attempts = attempts as i32;
                    e.finished_at_ms = Some(now_ms());
                    // Written with the next transition's snapshot (the next StepStarted or
                    // Succeeded, or at hand-back): nothing happens in between.
                    self.hold(EventType::StepSucceeded, Detail::step(i, &name))?;
                }
                Exec::Err(err, attempts) => {
                    self.snap.journal[i].attempts = attempts as i32;
                    // What the step did before it failed, for its undo, if it fits beside
                    // the other outputs (else the undo works it out again).
                    let others = self.other_outputs_len(i);
                    self.snap.journal[i].output = err.output.clone().filter(|o| o.len() + others <= crate::limits::STEP_OUTPUTS_BYTES);
                    self.snap.error = Some(TaskError::new(err.code.clone(), err.message.clone(), Some(i as i32 + 1), err.transient));
                    let d = Detail {
                        code: Some(err.code.clone()),
                        transient: Some(err.transient),
                        attempt: Some(attempts as i32),
                        ..Detail::step(i, &name)
                    }
                    .message(err.message.clone());
                    self.transition(EventType::StepFailed, d).await?;
                    // A rejection means "nothing was done": true only while no earlier step
                    // acted. After one did, it is a permanent failure, which reverts.
                    let acted = steps[..i].iter().any(|s| s.acts());
                    if err.rejects && acted {
                        let step = steps.iter().take(i).rev().find(|s| s.acts()).map(|s| s.name().to_owned()).unwrap_or_default();
                        tracing::warn!(task = %self.id, step = %name, after = %step, "a step rejected after an earlier step acted: failing the task instead");
                        if let Some(e) = self.snap.error.as_mut() {
                            let note = format!(" (a rejection after step {step:?} acted: treated as a failure)");
                            // The note is kept whole; the message gives way so the bound holds.
                            let keep = crate::limits::MESSAGE_BYTES.saturating_sub(note.len());
                            e.message = format!("{}{note}", crate::limits::bounded(std::mem::take(&mut e.message), keep));
                        }
                    }
                    if err.rejects && !acted {
                        // Checks against the live state come before every effect: nothing to undo.
                        self.snap.state = TaskState::Rejected;
                        let d = Detail { code: Some(err.code.clone()), ..Detail::default() }.message(err.message);
                        self.transition(EventType::Rejected, d).await?;
                    } else if self.snap.keep_partial || (err.keeps_done && !err.transient) {
                        self.snap.state = TaskState::Failed;
                        let d = Detail { code: Some(err.code.clone()), ..Detail::default() }.message(err.message);
                        self.transition(EventType::Failed, d).await?;
                    } else {
                        self.snap.state = TaskState::Reverting;
                        let d = Detail { code: Some(err.code.clone()), ..Detail::default() }
                            .message(format!("step {} ({name}) failed: {}", i + 1, err.message));
                        self.transition(EventType::Reverting, d).await?;
                    }
                    return Ok(Flow::Continue);
                }
                Exec::Cancelled => {
                    if !self.snap.revert_requested && !self.on_cancel(i, &name, spec, step.as_ref()).await? {
                        return Ok(Flow::Stopped);
                    }
                    self.snap.state = TaskState::Cancelled;
                    self.snap.cancel_requested = false;
                    self.transition(EventType::Cancelled, Detail::step(i, &name)).await?;
                    return Ok(Flow::Continue);
                }
                Exec::Stopped => return Ok(Flow::Stopped),
            }
        }
        self.snap.state = TaskState::Succeeded;
        self.snap.error = None;
        self.transition(EventType::Succeeded, Detail::default()).await?;
        Ok(Flow::Continue)
    }

    /// Runs the interrupted step's cancel hook ([`Step::on_cancel`]) under its policy;
    /// false when the task is to stop for the next owner meanwhile. A failed hook is
    /// logged: the cancel goes on. A Revert that comes meanwhile is recorded (the task is
    /// reverted once Cancelled).
    async fn on_cancel(&mut self, i: usize, name: &str, spec: &H::Spec, step: &dyn Step<H::Spec>) -> Result<bool, PublishError> {
        let policy = step.policy();
        let scope = self.scope(self.outputs(), None, self.snap.trace_parent.clone());
        let scope = &scope;
        let result = self
            .execute(i, name, &policy, None, Attempts::Forward, move |attempt, reports| {
                Box::pin(async move { step.on_cancel(&scope.cx(spec, attempt, reports)).await.map(|()| Value::Null) })
            })
            .await?;
        match result {
            Exec::Stopped => Ok(false),
            Exec::Err(e, _) => {
                tracing::warn!(task = %self.id, step = %name, code = %e.code, error = %e.message, "the step's cancel hook failed; cancelling anyway");
                Ok(true)
            }
            Exec::Ok(..) | Exec::Cancelled => Ok(true),
        }
    }

    /// The bytes of every journaled output but step `i`'s: what a new output of step `i`
    /// shares the snapshot's output budget with.
    fn other_outputs_len(&self, i: usize) -> usize {
        self.snap.journal.iter().enumerate().filter(|(j, _)| *j != i).filter_map(|(_, e)| e.output.as_ref().map(String::len)).sum()
    }

    /// A step's output, or the permanent failure `OUTPUT_TOO_LARGE` when it would take the
    /// task's outputs past their limit: its snapshot would not fit in a record, and its
    /// every write would fail (the task stuck retrying it).
    fn bounded_output(&self, i: usize, output: Value, attempts: u32) -> Exec<Value> {
        let size = output.to_string().len();
        let others = self.other_outputs_len(i);
        if size + others <= crate::limits::STEP_OUTPUTS_BYTES {
            return Exec::Ok(output, attempts);
        }
        let message = format!(
            "the step's output is {size} bytes and the task's earlier steps' {others}; a task's step outputs may take {} bytes in all (they ride in its snapshot)",
            crate::limits::STEP_OUTPUTS_BYTES
        );
        Exec::Err(crate::step::StepError::permanent(codes::OUTPUT_TOO_LARGE, message), attempts)
    }

    async fn revert(&mut self, spec: &H::Spec, steps: &[Arc<dyn Step<H::Spec>>]) -> Result<Flow, PublishError> {
        let todo: Vec<usize> = (0..self.snap.journal.len())
            .rev()
            .filter(|i| self.snap.journal[*i].status != StepStatus::Reverted)
            .collect();
        for i in todo {
            if self.stopping() {
                return Ok(Flow::Stopped);
            }
            let Some(step) = steps.get(i) else { continue };
            let name = step.name().to_owned();
            let output: Option<Value> = self.snap.journal[i]
                .output
                .as_deref()
                .and_then(|o| serde_json::from_str(o).ok());
            let policy = step.policy();
            let output_ref = output.as_ref();
            let undo_cx = crate::telemetry::start(format!("ferry.undo {name}"), opentelemetry::trace::SpanKind::Internal, &self.otel, vec![opentelemetry::KeyValue::new("ferry.step", i as i64 + 1)]);
            // An undo runs past the task's deadline (it bounds the forward run).
            let scope = self.scope(self.outputs(), None, crate::telemetry::traceparent(&undo_cx));
            let scope = &scope;
            let result = self
                .execute(i, &name, &policy, None, Attempts::Undo, move |attempt, reports| {
                    Box::pin(async move { step.undo(&scope.cx(spec, attempt, reports), output_ref).await.map(|()| Value::Null) })
                })
                .await?;
            crate::telemetry::end(&undo_cx, match &result {
                Exec::Err(e, _) => Some(format!("{}: {}", e.code, e.message)),
                _ => None,
            });
            match result {
                Exec::Ok(_, _) => {
                    let e = &mut self.snap.journal[i];
                    e.status = StepStatus::Reverted;
                    e.finished_at_ms = Some(now_ms());
                    self.transition(EventType::StepReverted, Detail::step(i, &name)).await?;
                }
                Exec::Err(err, attempts) => {
                    self.snap.state = TaskState::RevertFailed;
                    let message = format!("undo of step {} ({name}) failed: {}", i + 1, err.message);
                    self.snap.error = Some(TaskError::new(err.code.clone(), message, Some(i as i32 + 1), err.transient));
                    let d = Detail {
                        code: Some(err.code),
                        transient: Some(err.transient),
                        attempt: Some(attempts as i32),
                        ..Detail::step(i, &name)
                    }
                    .message(err.message);
                    self.transition(EventType::RevertFailed, d).await?;
                    return Ok(Flow::Continue);
                }
                Exec::Cancelled => unreachable!("undo is not cancellable"),
                Exec::Stopped => return Ok(Flow::Stopped),
            }
        }
        self.snap.state = TaskState::Reverted;
        self.transition(EventType::Reverted, Detail::default()).await?;
        Ok(Flow::Continue)
    }

    /// Runs attempts of one step (or undo) until it succeeds, fails for good, runs out of
    /// retries or time, or a control stops it.
    #[allow(clippy::too_many_arguments)]
    async fn execute<'s>(
        &mut self,
        i: usize,
        name: &str,
        policy: &StepPolicy,
        deadline_ms: Option<i64>,
        attempts: Attempts,
        make: impl Fn(u32, mpsc::UnboundedSender<StepReport>) -> BoxFuture<'s, Result<Value, StepError>>,
    ) -> Result<Exec<Value>, PublishError> {
        let cancellable = attempts == Attempts::Forward;
        let mut backoff = match attempts {
            Attempts::Forward => policy.backoff(),
            Attempts::Undo => policy.undo_backoff(),
        }
        .build();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut attempt: u32 = 0;
        loop {
            attempt += 1;
            let mut limit = policy.timeout;
            let mut deadline_binds = false;
            if let Some(d) = deadline_ms {
                let left = Duration::from_millis((d - now_ms()).max(0) as u64);
                if left <= limit {
                    limit = left;
                    deadline_binds = true;
                }
            }
            let fut = tokio::time::timeout(limit, make(attempt, tx.clone()));
            tokio::pin!(fut);
            let result = loop {
                let grace = async {
                    match &self.stop {
                        Some((until, _)) => tokio::time::sleep_until((*until).into()).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    // The partition is gone for good: drop the step before its next write.
                    () = self.fence.cancelled() => return Err(PublishError::Fenced { task: self.snap.task_id.clone() }),
                    r = &mut fut => break r,
                    Some(report) = rx.recv() => {
                        let StepReport::Progress { percent, message } = report;
                        let d = Detail { percent: Some(percent as i32), ..Detail::step(i, name) }.message(message);
                        self.transition(EventType::StepProgress, d).await?;
                    }
                    c = self.ctl.recv() => match c {
                        Some(c) => {
                            if let Some(exec) = self.on_control(c, i, name, cancellable).await? {
                                return Ok(exec);
                            }
                        }
                        // The scheduler dropped this task (its partition is gone): another
                        // owner resumes it, so stop before the step writes anything more.
                        None => return Ok(Exec::Stopped),
                    },
                    () = grace => return Ok(Exec::Stopped),
                }
            };
            // Reports sent just before the step returned are still queued: publish them
            // (in order, before the step's own outcome) rather than lose them.
            while let Ok(StepReport::Progress { percent, message }) = rx.try_recv() {
                let d = Detail { percent: Some(percent as i32), ..Detail::step(i, name) }.message(message);
                self.transition(EventType::StepProgress, d).await?;
            }
            let err = match result {
                Ok(Ok(v)) => return Ok(Exec::Ok(v, attempt)),
                Ok(Err(e)) => e,
                Err(_) if deadline_binds => {
                    return Ok(Exec::Err(
                        StepError::permanent("DEADLINE_EXCEEDED", format!("task deadline passed during step {} ({name})", i + 1)),
                        attempt,
                    ));
                }
                Err(_) => StepError::transient("STEP_TIMEOUT", format!("attempt {attempt} exceeded the step timeout of {:?}", policy.timeout)),
            };
            if !err.transient {
                return Ok(Exec::Err(err, attempt));
            }
            let Some(delay) = backoff.next() else {
                let message = match attempts {
                    Attempts::Forward => format!("gave up after {attempt} attempts: {}", err.message),
                    Attempts::Undo => format!("gave up after {attempt} attempts (undo patience {}): {}", human(policy.undo_patience), err.message),
                };
                return Ok(Exec::Err(StepError { message, ..err }, attempt));
            };
            if self.stopping() {
                return Ok(Exec::Stopped);
            }
            self.env.metrics.retry(self.snap.kind, name);
            let d = Detail {
                code: Some(err.code.clone()),
                transient: Some(true),
                attempt: Some(attempt as i32 + 1),
                delay_ms: Some(delay.as_millis() as i64),
                ..Detail::step(i, name)
            }
            .message(err.message.clone());
            self.transition(EventType::Retrying, d).await?;
            let sleep = tokio::time::sleep(delay);
            tokio::pin!(sleep);
            loop {
                tokio::select! {
                    () = &mut sleep => break,
                    c = self.ctl.recv() => {
                        let Some(c) = c else { return Ok(Exec::Stopped) };
                        if let Some(exec) = self.on_control(c, i, name, cancellable).await? {
                            return Ok(exec);
                        }
                        if self.stopping() {
                            return Ok(Exec::Stopped);
                        }
                    }
                }
            }
        }
    }

    /// Handles a control during a step; `Some` ends the step.
    async fn on_control(&mut self, c: Control, i: usize, name: &str, cancellable: bool) -> Result<Option<Exec<Value>>, PublishError> {
        match c {
            Control::Stop { grace, reply } => {
                self.stop = Some((Instant::now() + grace, reply));
                Ok(None)
            }
            Control::Signal { signal, reply } => {
                let message = signal.message();
                match self.snap.record_signal(signal) {
                    Ok(true) => {
                        self.transition(EventType::Signalled, Detail::step(i, name).message(message)).await?;
                        self.signals.send_replace(self.snap.signal_names());
                    }
                    Ok(false) => tracing::info!(task = %self.id, "signal already recorded (a redelivered command)"),
                    Err(why) => {
                        let _ = reply.send(ControlReply::Refused(why));
                        return Ok(None);
                    }
                }
                let _ = reply.send(ControlReply::Handled);
                Ok(None)
            }
            Control::Cancel { reply } | Control::Revert { reply } if !cancellable => {
                // Already undoing: the revert runs to its end.
                let _ = reply.send(ControlReply::Handled);
                Ok(None)
            }
            Control::Cancel { reply } => {
                self.snap.cancel_requested = true;
                self.transition(EventType::CancelRequested, Detail::step(i, name)).await?;
                let _ = reply.send(ControlReply::Handled);
                Ok(Some(Exec::Cancelled))
            }
            Control::Revert { reply } => {
                self.snap.cancel_requested = true;
                self.snap.revert_requested = true;
                let d = Detail::step(i, name).message("revert requested");
                self.transition(EventType::CancelRequested, d).await?;
                let _ = reply.send(ControlReply::Handled);
                Ok(Some(Exec::Cancelled))
            }
        }
    }
}

//! One plan step: run one child command as its own task and wait for its end; undo
//! reverts it.
//!
//! # Idempotency
//! The child's idempotency key is `plan/<plan task id>/<step name>`, so its id is fixed
//! by the plan and the step. A run looks the child up first: a resumed plan (after a crash,
//! a rebalance, a retry) re-attaches to the child it submitted and never submits a second
//! one; when no worker has taken the child up yet, the Start is sent again, which the
//! runtime's idempotency makes harmless.
//!
//! # Output
//! `{"task_id", "kind", "subject", "outputs": {<child step>: <its output>}}`: what later
//! steps' `${steps.<name>...}` references read, and what the undo reverts.
//!
//! # Cancel
//! A Cancel of the plan while this step waits cancels the child too ([`Step::on_cancel`]):
//! the plan ends Cancelled once the child has ended, and a later Revert of the plan
//! reverts the child with the rest.
//!
//! # Undo
//! Reverts the child and waits for its Reverted (a running child is cancelled, then
//! undone, by its own worker). A child already Reverted or Rejected needs nothing; a child
//! whose Start never reached a worker within the appear grace was never submitted. A step
//! marked `keep` leaves its child as it is.
//!
//! # Errors
//! The child ending otherwise than Succeeded is [`codes::CHILD_FAILED`] (permanent: the
//! plan reverts what it did, or keeps it with keep-partial); a reference that names nothing
//! is [`codes::REF_UNRESOLVED`]; Kafka errors are transient; a child that does not end
//! within the child timeout is [`codes::DEADLINE_EXCEEDED`].

use std::sync::Arc;
use std::time::Duration;

use ferry_task::children::{ChildCommand, ChildError, Children};
use ferry_task::protocol::{StepStatus, TaskSnapshot};
use ferry_task::{Step, StepContext, StepError, StepPolicy, TaskId, TaskKind, TaskState, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Value, json};

use crate::handler::PlanConfig;
use crate::refs;
use crate::spec::{PlanSpec, PlanStep};

/// The idempotency key of the child a plan's step runs: fixed by the plan and the step.
pub fn child_key(plan: &TaskId, step: &str) -> String {
    format!("plan/{plan}/{step}")
}

/// The `requested_by` of every child of `plan`.
pub fn parent_link(plan: &TaskId) -> String {
    format!("plan/{plan}")
}

/// One child of the plan.
pub struct ChildStep {
    step: PlanStep,
    /// Parsed from `step.kind`; `validate` has checked it parses.
    kind: TaskKind,
    cfg: PlanConfig,
}

impl ChildStep {
    /// The step running `step`; fails when its kind does not parse (`validate` refuses such
    /// a plan, so only a bug gets here).
    pub fn new(step: PlanStep, cfg: PlanConfig) -> Result<Self, ferry_task::kind::UnknownKind> {
        let kind = step.kind.parse()?;
        Ok(Self { step, kind, cfg })
    }

    fn children(&self) -> &Arc<dyn Children> {
        &self.cfg.children
    }

    fn id(&self, plan: &TaskId, on_behalf_of: &str) -> TaskId {
        self.children().child_id(self.kind, &child_key(plan, &self.step.name), on_behalf_of)
    }

    /// The child's command with the earlier children's outputs put in, under the plan's
    /// deadline, keep-partial and this step's trace.
    fn command(&self, cx: &StepContext<'_, PlanSpec>) -> Result<ChildCommand, StepError> {
        let (plan, outputs) = (cx.task_id, cx.outputs);
        let unresolved = |e: refs::RefError| StepError::permanent(codes::REF_UNRESOLVED, format!("step {}: {e}", self.step.name));
        let spec = self.step.spec_value().map_err(|e| StepError::permanent(codes::INTERNAL, format!("step {}: the validated spec no longer parses: {e}", self.step.name)))?;
        let subject = match &self.step.subject {
            Some(s) => match refs::resolve_text(s, outputs).map_err(unresolved)? {
                Value::String(s) => Some(s),
                other => Some(other.to_string()),
            },
            None => None,
        };
        Ok(ChildCommand {
            kind: self.kind,
            subject,
            spec: refs::resolve(&spec, outputs).map_err(unresolved)?,
            idempotency_key: child_key(plan, &self.step.name),
            parent: *plan,
            deadline_ms: cx.deadline_ms,
            keep_partial: cx.keep_partial,
            trace_parent: cx.trace_parent.clone(),
            on_behalf_of: cx.requested_by.to_owned(),
        })
    }

    /// The child's snapshot, once it has one. The Start may be on its way to the child's
    /// worker (the run sent it just before it stopped): wait the appear grace for it to be
    /// taken up. `None` if it never is: no Start was sent (or it was rejected without a
    /// snapshot), so there is nothing to cancel or undo.
    async fn appeared(&self, id: TaskId) -> Result<Option<TaskSnapshot>, StepError> {
        if let Some(s) = self.children().snapshot(id).await.map_err(step_error)? {
            return Ok(Some(s));
        }
        match self.children().wait(id, self.cfg.appear_grace, &mut |_| true).await {
            Ok(s) => Ok(Some(s)),
            Err(ChildError::Timeout { .. }) => Ok(None),
            Err(e) => Err(step_error(e)),
        }
    }

    /// Reports where the child is, once per new snapshot.
    fn report(&self, cx: &StepContext<'_, PlanSpec>, id: TaskId, snap: &TaskSnapshot) {
        let done = snap.journal.iter().filter(|j| j.status == StepStatus::Succeeded).count();
        let at = match snap.journal.last() {
            Some(j) => format!(" step {} {}", j.step, j.name),
            None => String::new(),
        };
        // The child's step count is its worker's to know: the share of its started steps
        // that finished, below 100 until it ends.
        let percent = if snap.state == TaskState::Succeeded { 100 } else { (done * 100 / (snap.journal.len() + 1)).min(99) as u8 };
        cx.progress(percent, format!("child {id} ({}) {:?}{at}", self.kind, snap.last_event));
    }
}

/// A [`ChildError`] as the step's error: Kafka trouble is retried, a bad spec is not.
fn step_error(e: ChildError) -> StepError {
    match &e {
        ChildError::Spec { .. } => StepError::permanent(codes::CHILD_SPEC, e.to_string()),
        ChildError::Unreachable { .. } => StepError::transient(codes::CHILDREN_UNREACHABLE, e.to_string()),
        ChildError::Timeout { .. } => StepError::permanent(codes::DEADLINE_EXCEEDED, e.to_string()),
    }
}

/// The step's output: the child's identity and its steps' outputs.
fn output(kind: TaskKind, snap: &TaskSnapshot) -> Value {
    let outputs: serde_json::Map<String, Value> = snap
        .journal
        .iter()
        .map(|j| (j.name.clone(), j.output.as_deref().and_then(|o| serde_json::from_str(o).ok()).unwrap_or(Value::Null)))
        .collect();
    json!({ "task_id": snap.task_id, "kind": kind.as_str(), "subject": snap.subject, "outputs": outputs })
}

impl Step<PlanSpec> for ChildStep {
    fn name(&self) -> &str {
        &self.step.name
    }

    fn policy(&self) -> StepPolicy {
        StepPolicy {
            // Past the child's own wait, so that the wait's precise error ends the attempt.
            timeout: self.cfg.child_timeout + Duration::from_secs(60),
            max_retries: 5,
            min_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(10),
        }
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, PlanSpec>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let id = self.id(cx.task_id, cx.requested_by);
            match self.children().snapshot(id).await.map_err(step_error)? {
                Some(snap) => {
                    tracing::info!(plan = %cx.task_id, child = %id, state = ?snap.state, "re-attached to the child");
                    self.report(cx, id, &snap);
                }
                None => {
                    let command = self.command(cx)?;
                    self.children().submit(&command).await.map_err(step_error)?;
                    cx.progress(0, format!("child {id} ({}) submitted", self.kind));
                }
            }
            let mut seen = 0;
            let mut until = |s: &TaskSnapshot| {
                if s.seq > seen {
                    seen = s.seq;
                    self.report(cx, id, s);
                }
                s.state.is_terminal()
            };
            let end = self.children().wait(id, self.cfg.child_timeout, &mut until).await.map_err(step_error)?;
            if end.state != TaskState::Succeeded {
                let why = end.error.as_ref().map(|e| format!(": {}: {}", e.code, e.message)).unwrap_or_default();
                return Err(StepError::permanent(
                    codes::CHILD_FAILED,
                    format!("child {id} ({} on {}) of step {} ended {}{why}", self.kind, end.subject, self.step.name, end.state.name()),
                ));
            }
            Ok(output(self.kind, &end))
        }
        .boxed()
    }

    fn on_cancel<'a>(&'a self, cx: &'a StepContext<'a, PlanSpec>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            let id = self.id(cx.task_id, cx.requested_by);
            let Some(snap) = self.appeared(id).await? else { return Ok(()) };
            if snap.state.is_terminal() {
                return Ok(());
            }
            let reason = format!("plan {} was cancelled in its step {}", cx.task_id, self.step.name);
            self.children().cancel(self.kind, &snap.subject, id, reason).await.map_err(step_error)?;
            cx.progress(50, format!("child {id} ({}) cancelling", self.kind));
            let end = self.children().wait(id, self.cfg.child_timeout, &mut |s| s.state.is_terminal()).await.map_err(step_error)?;
            cx.progress(100, format!("child {id} ({}) ended {}", self.kind, end.state.name()));
            Ok(())
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, PlanSpec>, _output: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            let id = self.id(cx.task_id, cx.requested_by);
            if self.step.keep {
                cx.progress(100, format!("child {id} ({}) kept (keep: true)", self.kind));
                return Ok(());
            }
            let Some(snap) = self.appeared(id).await? else { return Ok(()) };
            if matches!(snap.state, TaskState::Reverted | TaskState::Rejected) {
                return Ok(());
            }
            if snap.state != TaskState::Reverting {
                let reason = format!("plan {} reverts its step {}", cx.task_id, self.step.name);
                self.children().revert(self.kind, &snap.subject, id, reason).await.map_err(step_error)?;
            }
            cx.progress(50, format!("child {id} ({}) reverting", self.kind));
            let from = snap.seq;
            let mut until = |s: &TaskSnapshot| s.seq > from && matches!(s.state, TaskState::Reverted | TaskState::RevertFailed);
            let end = self.children().wait(id, self.cfg.child_timeout, &mut until).await.map_err(step_error)?;
            if end.state == TaskState::RevertFailed {
                let why = end.error.as_ref().map(|e| format!(": {}: {}", e.code, e.message)).unwrap_or_default();
                return Err(StepError::permanent(codes::CHILD_REVERT_FAILED, format!("child {id} ({} on {}) of step {} could not be reverted{why}", self.kind, end.subject, self.step.name)));
            }
            Ok(())
        }
        .boxed()
    }
}

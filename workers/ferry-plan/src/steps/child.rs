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

/// The idempotency key of the child a fanned-out (waves) step runs on `cluster`:
/// [`child_key`] of the step, then `/<cluster>`.
pub fn wave_child_key(plan: &TaskId, step: &str, cluster: &str) -> String {
    format!("{}/{cluster}", child_key(plan, step))
}

/// The plan, step (and cluster) a child with idempotency key `key` runs for; `None` for a
/// key no plan gives. The inverse of [`child_key`] and [`wave_child_key`]: step names hold
/// no `/` (`validate`). A key is what its sender chose: who sent the task decides whether
/// it is that plan's (the CLI's `plan_children::child_of`).
pub fn plan_of(key: &str) -> Option<(TaskId, &str, Option<&str>)> {
    let (plan, rest) = key.strip_prefix("plan/")?.split_once('/')?;
    let plan: TaskId = plan.parse().ok()?;
    let (step, cluster) = match rest.split_once('/') {
        Some((step, cluster)) => (step, Some(cluster)),
        None => (rest, None),
    };
    (!step.is_empty()).then_some((plan, step, cluster))
}

/// One child task of a plan, found by its idempotency key: what a plan step (one child)
/// and a fanned-out step (one child per cluster) both do with their children.
pub(crate) struct Child<'c> {
    pub kind: TaskKind,
    /// Its idempotency key ([`child_key`], or [`wave_child_key`] for a fanned-out step).
    pub key: String,
    /// How messages name it: the step's name, or `<step>/<cluster>`.
    pub label: String,
    /// The plan: its controls of the child are sent as the plan's.
    pub parent: TaskId,
    pub cfg: &'c PlanConfig,
}

impl Child<'_> {
    fn children(&self) -> &Arc<dyn Children> {
        &self.cfg.children
    }

    /// Its id: fixed by its kind, key and on whose behalf the plan runs.
    pub fn id(&self, on_behalf_of: &str) -> TaskId {
        self.children().child_id(self.kind, &self.key, on_behalf_of)
    }

    /// Submits the child (`command` builds it), or re-attaches to the one submitted
    /// before (a resumed plan): its id, and its snapshot if it has one.
    pub async fn start(&self, cx: &StepContext<'_, PlanSpec>, command: impl FnOnce() -> Result<ChildCommand, StepError>) -> Result<(TaskId, Option<TaskSnapshot>), StepError> {
        let known = self.children().snapshot(self.id(cx.requested_by)).await.map_err(step_error)?;
        self.start_known(cx, known, command).await
    }

    /// [`Self::start`] with the child's snapshot already read (`known`, a wave reads its
    /// children's at once).
    pub async fn start_known(
        &self,
        cx: &StepContext<'_, PlanSpec>,
        known: Option<TaskSnapshot>,
        command: impl FnOnce() -> Result<ChildCommand, StepError>,
    ) -> Result<(TaskId, Option<TaskSnapshot>), StepError> {
        let id = self.id(cx.requested_by);
        if let Some(snap) = known {
            tracing::info!(plan = %cx.task_id, child = %id, state = ?snap.state, "re-attached to the child");
            return Ok((id, Some(snap)));
        }
        self.children().submit(&command()?).await.map_err(step_error)?;
        Ok((id, None))
    }

    /// Waits for the child's end (within the child timeout); `seen` sees each newer
    /// snapshot on the way. The end state is the caller's to judge.
    pub async fn end(&self, id: TaskId, seen: &mut (dyn FnMut(&TaskSnapshot) + Send)) -> Result<TaskSnapshot, StepError> {
        let mut last = 0;
        let mut until = |s: &TaskSnapshot| {
            if s.seq > last {
                last = s.seq;
                seen(s);
            }
            s.state.is_terminal()
        };
        self.children().wait(id, self.cfg.child_timeout, &mut until).await.map_err(step_error)
    }

    /// The failure of a child that ended otherwise than Succeeded.
    pub fn failed(&self, end: &TaskSnapshot) -> StepError {
        let why = end.error.as_ref().map(|e| format!(": {}: {}", e.code, e.message)).unwrap_or_default();
        StepError::permanent(codes::CHILD_FAILED, format!("child {} ({} on {}) of step {} ended {}{why}", end.task_id, self.kind, end.subject, self.label, end.state.name()))
    }

    /// The child's snapshot, once it has one. The Start may be on its way to the child's
    /// worker (the run sent it just before it stopped): wait the appear grace for it to be
    /// taken up. `None` if it never is: no Start was sent (or it was rejected without a
    /// snapshot), so there is nothing to cancel or undo.
    pub async fn appeared(&self, id: TaskId) -> Result<Option<TaskSnapshot>, StepError> {
        if let Some(s) = self.children().snapshot(id).await.map_err(step_error)? {
            return Ok(Some(s));
        }
        match self.children().wait(id, self.cfg.appear_grace, &mut |_| true).await {
            Ok(s) => Ok(Some(s)),
            Err(ChildError::Timeout { .. }) => Ok(None),
            Err(e) => Err(step_error(e)),
        }
    }

    /// `snap` when the caller read it already, else [`Self::appeared`].
    async fn known_or_appeared(&self, id: TaskId, snap: Option<TaskSnapshot>) -> Result<Option<TaskSnapshot>, StepError> {
        match snap {
            Some(s) => Ok(Some(s)),
            None => self.appeared(id).await,
        }
    }

    /// Cancels the child if it runs (found with `snap`, or as [`Self::appeared`]), and
    /// waits for its end. Its end state, if it has a snapshot.
    pub async fn cancel(&self, id: TaskId, snap: Option<TaskSnapshot>, reason: String) -> Result<Option<TaskState>, StepError> {
        let Some(snap) = self.known_or_appeared(id, snap).await? else { return Ok(None) };
        if snap.state.is_terminal() {
            return Ok(Some(snap.state));
        }
        self.children().cancel(self.kind, &snap.subject, id, self.parent, reason).await.map_err(step_error)?;
        let end = self.children().wait(id, self.cfg.child_timeout, &mut |s| s.state.is_terminal()).await.map_err(step_error)?;
        Ok(Some(end.state))
    }

    /// Reverts the child (found with `snap`, or as [`Self::appeared`]) and waits for its
    /// Reverted; nothing for a child Reverted, Rejected or never taken up. False when
    /// there was nothing to do.
    pub async fn revert(&self, id: TaskId, snap: Option<TaskSnapshot>, reason: String) -> Result<bool, StepError> {
        let Some(snap) = self.known_or_appeared(id, snap).await? else { return Ok(false) };
        if matches!(snap.state, TaskState::Reverted | TaskState::Rejected) {
            return Ok(false);
        }
        if snap.state != TaskState::Reverting {
            self.children().revert(self.kind, &snap.subject, id, self.parent, reason).await.map_err(step_error)?;
        }
        let from = snap.seq;
        let mut until = |s: &TaskSnapshot| s.seq > from && matches!(s.state, TaskState::Reverted | TaskState::RevertFailed);
        let end = self.children().wait(id, self.cfg.child_timeout, &mut until).await.map_err(step_error)?;
        if end.state == TaskState::RevertFailed {
            let why = end.error.as_ref().map(|e| format!(": {}: {}", e.code, e.message)).unwrap_or_default();
            return Err(StepError::permanent(codes::CHILD_REVERT_FAILED, format!("child {id} ({} on {}) of step {} could not be reverted{why}", self.kind, end.subject, self.label)));
        }
        Ok(true)
    }
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

    fn child(&self, plan: &TaskId) -> Child<'_> {
        Child { kind: self.kind, key: child_key(plan, &self.step.name), label: self.step.name.clone(), parent: *plan, cfg: &self.cfg }
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

/// The command of a child: `spec` (the step's, or a cluster's) with the earlier children's
/// outputs put in, under the plan's deadline, keep-partial and this step's trace.
pub(crate) fn command(cx: &StepContext<'_, PlanSpec>, kind: TaskKind, label: &str, key: String, subject: Option<&str>, spec: &Value) -> Result<ChildCommand, StepError> {
    let (plan, outputs) = (cx.task_id, cx.outputs);
    let unresolved = |e: refs::RefError| StepError::permanent(codes::REF_UNRESOLVED, format!("step {label}: {e}"));
    let subject = match subject {
        Some(s) => match refs::resolve_text(s, outputs).map_err(unresolved)? {
            Value::String(s) => Some(s),
            other => Some(other.to_string()),
        },
        None => None,
    };
    Ok(ChildCommand {
        kind,
        subject,
        spec: refs::resolve(spec, outputs).map_err(unresolved)?,
        idempotency_key: key,
        parent: *plan,
        deadline_ms: cx.deadline_ms,
        keep_partial: cx.keep_partial,
        trace_parent: cx.trace_parent.clone(),
        on_behalf_of: cx.requested_by.to_owned(),
    })
}

/// A [`ChildError`] as the step's error: Kafka trouble is retried, a bad spec is not.
pub(crate) fn step_error(e: ChildError) -> StepError {
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
            ..StepPolicy::default()
        }
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, PlanSpec>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let child = self.child(cx.task_id);
            let spec = self.step.spec_value().map_err(|e| StepError::permanent(codes::INTERNAL, format!("step {}: the validated spec no longer parses: {e}", self.step.name)))?;
            let key = child.key.clone();
            let (id, found) = child.start(cx, || command(cx, self.kind, &self.step.name, key, self.step.subject.as_deref(), &spec)).await?;
            match &found {
                Some(snap) => self.report(cx, id, snap),
                None => cx.progress(0, format!("child {id} ({}) submitted", self.kind)),
            }
            let end = child.end(id, &mut |s| self.report(cx, id, s)).await?;
            if end.state != TaskState::Succeeded {
                return Err(child.failed(&end));
            }
            Ok(output(self.kind, &end))
        }
        .boxed()
    }

    fn on_cancel<'a>(&'a self, cx: &'a StepContext<'a, PlanSpec>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            let child = self.child(cx.task_id);
            let id = child.id(cx.requested_by);
            let reason = format!("plan {} was cancelled in its step {}", cx.task_id, self.step.name);
            if let Some(state) = child.cancel(id, None, reason).await? {
                cx.progress(100, format!("child {id} ({}) ended {}", self.kind, state.name()));
            }
            Ok(())
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, PlanSpec>, _output: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            let child = self.child(cx.task_id);
            let id = child.id(cx.requested_by);
            if self.step.keep {
                cx.progress(100, format!("child {id} ({}) kept (keep: true)", self.kind));
                return Ok(());
            }
            let reason = format!("plan {} reverts its step {}", cx.task_id, self.step.name);
            if child.revert(id, None, reason).await? {
                cx.progress(100, format!("child {id} ({}) reverted", self.kind));
            }
            Ok(())
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_childs_key_names_its_step_and_cluster() {
        let plan: TaskId = "tsk_0123456789abcdef0123456789abcdef".parse().unwrap();
        let other: TaskId = "tsk_fedcba9876543210fedcba9876543210".parse().unwrap();
        assert_eq!(plan_of(&child_key(&plan, "create")), Some((plan, "create", None)));
        assert_eq!(plan_of(&wave_child_key(&plan, "rollout", "member-1")), Some((plan, "rollout", Some("member-1"))));
        assert_eq!(plan_of(&child_key(&other, "create")), Some((other, "create", None)));
        for key in ["deploy-42", "plan/", "plan/tsk_nope/create", "plan/tsk_0123456789abcdef0123456789abcdef", "plan/tsk_0123456789abcdef0123456789abcdef/"] {
            assert_eq!(plan_of(key), None, "{key}");
        }
    }
}

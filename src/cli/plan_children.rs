//! A plan's child tasks as `ferry tasks` shows them: found among every kind's task state by
//! their idempotency keys (`plan/<plan>/<step>[/<cluster>]`, `ferry_plan`'s `child_key`, in
//! the key space of whoever asked) and who asked ([`claimed_plan`]);
//! `tasks get` lists them, `tasks revert --dry-run` says which a revert would revert.

use ferry_plan::spec::PlanSpec;
use ferry_plan::steps::child::plan_of;
use ferry_runtime::protocol::TaskSnapshot;
use ferry_runtime::tenants::tenant_of;
use ferry_runtime::{Client, TaskId, TaskKind, TaskState};
use serde::Serialize;

/// One child of a plan.
#[derive(Debug, Clone, Serialize)]
pub struct ChildView {
    pub task_id: String,
    /// The plan step it runs for (its journal entry's name).
    pub step: String,
    /// For a fanned-out step, the cluster it is for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    pub kind: String,
    pub subject: String,
    pub state: TaskState,
    /// RFC 3339, beside `created_at_ms`.
    pub created_at: Option<String>,
    pub created_at_ms: i64,
}

/// The plan a task says it runs for (plan, step, cluster), by its idempotency key, where
/// it was sent as that plan's children are: an operator's plan sends them as
/// `plan/<id>` (`ferry_runtime::child_tasks`), in the operator's key space; a tenant's
/// plan as the tenant, whose keys are `<tenant>/<key>` (`tenants::tenant_key`) and whom
/// the workers record as the broker established it. So no tenant places its task under
/// an operator's plan by the key it chooses; under a plan of its own tenant only if that
/// plan is the tenant's too, which [`child_of`] checks (it reads the plan).
pub fn claimed_plan(s: &TaskSnapshot) -> Option<(TaskId, &str, Option<&str>)> {
    let key = s.idempotency_key.as_deref()?;
    match tenant_of(&s.requested_by) {
        Some(t) => plan_of(key.strip_prefix(t)?.strip_prefix('/')?),
        None => plan_of(key).filter(|(p, ..)| s.requested_by == format!("plan/{p}")),
    }
}

/// The step (and cluster) of `plan` that `task` runs for, if it is one of its children: it
/// says so ([`claimed_plan`]) and was asked for by the plan's tenant (or, for an
/// operator's plan, by the plan).
pub fn child_of<'t>(plan: &TaskSnapshot, task: &'t TaskSnapshot) -> Option<(&'t str, Option<&'t str>)> {
    let (p, step, cluster) = claimed_plan(task)?;
    (p.to_string() == plan.task_id && claim_holds(&task.requested_by, Some(&plan.requested_by))).then_some((step, cluster))
}

/// Whether a task asked for by `task_requested_by` runs for the plan its key names
/// ([`claimed_plan`]), the plan asked for by `plan_requested_by` (`None`: not read here):
/// both a tenant's, the same, or both an operator's. Unread, an operator's claim holds
/// (only the plan worker sends as `plan/<id>`) and a tenant's does not.
pub fn claim_holds(task_requested_by: &str, plan_requested_by: Option<&str>) -> bool {
    match plan_requested_by {
        Some(p) => tenant_of(p) == tenant_of(task_requested_by),
        None => tenant_of(task_requested_by).is_none(),
    }
}

/// Drops the `plan` of each view whose claim does not hold ([`check_claim`]); `plans`
/// gives who asked for each plan it knows (by id).
pub fn check_claims(views: &mut [super::tasks::TaskView], plans: &std::collections::HashMap<String, String>) {
    for v in views {
        let plan_requested_by = v.plan.as_ref().and_then(|p| plans.get(&p.task_id)).cloned();
        check_claim(v, plan_requested_by.as_deref());
    }
}

/// Drops the view's `plan` unless its claim holds ([`claim_holds`]), the plan asked for by
/// `plan_requested_by` (`None`: not read).
pub fn check_claim(v: &mut super::tasks::TaskView, plan_requested_by: Option<&str>) {
    if v.plan.is_some() && !claim_holds(&v.requested_by, plan_requested_by) {
        v.plan = None;
    }
}

/// The children of `plan` (an operator's read: every kind's task state), oldest first.
pub async fn children(client: &Client, plan: &TaskSnapshot) -> anyhow::Result<Vec<ChildView>> {
    let mut found: Vec<ChildView> = client
        .snapshots_of(None)
        .await?
        .into_iter()
        .filter_map(|s| {
            let (step, cluster) = child_of(plan, &s).map(|(step, cluster)| (step.to_owned(), cluster.map(str::to_owned)))?;
            Some(ChildView {
                step,
                cluster,
                task_id: s.task_id,
                kind: s.kind.to_string(),
                subject: s.subject,
                state: s.state,
                created_at: super::table::rfc3339(s.created_at_ms),
                created_at_ms: s.created_at_ms,
            })
        })
        .collect();
    found.sort_by(|a, b| (a.created_at_ms, &a.task_id).cmp(&(b.created_at_ms, &b.task_id)));
    Ok(found)
}

/// What the undo of the plan's step `step` does with its children: those a revert reverts
/// (every one not Reverted or Rejected, newest first, as its waves are undone last first),
/// or none when the step keeps them (`keep: true`).
pub fn reverted_by_undo<'c>(spec: Option<&PlanSpec>, children: &'c [ChildView], step: &str) -> Undo<'c> {
    if spec.is_some_and(|p| p.steps.iter().any(|s| s.name == step && s.keep)) {
        return Undo::Kept;
    }
    let reverts: Vec<&ChildView> = children
        .iter()
        .rev()
        .filter(|c| c.step == step && !matches!(c.state, TaskState::Reverted | TaskState::Rejected))
        .collect();
    Undo::Reverts(reverts)
}

/// What a child runs for, as `tasks get` and `tasks watch` say it: `step S`, or `step S,
/// cluster C` for a fanned-out step's child.
pub fn runs_for(step: &str, cluster: Option<&str>) -> String {
    match cluster {
        Some(c) => format!("step {step}, cluster {c}"),
        None => format!("step {step}"),
    }
}

/// What a plan step's undo does with its children.
pub enum Undo<'c> {
    /// Reverts these, in this order.
    Reverts(Vec<&'c ChildView>),
    /// Leaves them (`keep: true`).
    Kept,
}

/// The plan's spec, where the snapshot is a plan's and it reads (a step's `keep`).
pub fn plan_spec(client: &Client, snap: &TaskSnapshot) -> Option<PlanSpec> {
    (snap.kind == TaskKind::PLAN).then(|| client.registry().decode::<PlanSpec>(&snap.spec.0).ok()).flatten()
}

#[cfg(test)]
mod tests {
    use ferry_runtime::testkind::TestTaskSpec;

    use super::*;

    /// A task snapshot asked for by `requested_by` with idempotency key `key`.
    fn task(n: i64, kind: TaskKind, requested_by: &str, key: Option<String>) -> TaskSnapshot {
        let r = ferry_runtime::wire::Registry::embedded();
        let mut s = super::super::fleet_view::tests::snap(&r, n, kind, "s", &TestTaskSpec::steps(1), TaskState::Running, vec![]);
        s.task_id = TaskId::for_idempotency_key(kind, &format!("task-{n}")).to_string();
        s.requested_by = requested_by.into();
        s.idempotency_key = key;
        s
    }

    /// Whose children are a plan's: an operator's plan's are sent as `plan/<id>` in the
    /// operator's key space; a tenant's plan's as the tenant, keys in the tenant's space. A
    /// key that merely looks like a plan child's places no task under that plan: an
    /// operator's own key, another tenant's, or a tenant's under an operator's plan.
    #[test]
    fn a_plans_children_are_those_sent_as_its_children_are() {
        let ops = task(1, TaskKind::PLAN, "alice", None);
        let acme = task(2, TaskKind::PLAN, "tenant:acme", None);
        let (op_id, acme_id) = (ops.task_id.clone(), acme.task_id.clone());
        let child = task(3, TaskKind::TEST, &format!("plan/{op_id}"), Some(format!("plan/{op_id}/roll/member-1")));
        assert_eq!(claimed_plan(&child).map(|(p, s, c)| (p.to_string(), s, c)), Some((op_id.clone(), "roll", Some("member-1"))));
        assert_eq!(child_of(&ops, &child), Some(("roll", Some("member-1"))));
        assert_eq!(child_of(&acme, &child), None, "another plan's child");
        let tenant_child = task(4, TaskKind::TEST, "tenant:acme", Some(format!("acme/plan/{acme_id}/one")));
        assert_eq!(child_of(&acme, &tenant_child), Some(("one", None)));
        // Keys that look like a plan child's, chosen by whoever sent the task.
        let by_hand = task(5, TaskKind::TEST, "bob", Some(format!("plan/{op_id}/roll")));
        assert_eq!(claimed_plan(&by_hand), None, "an operator's own key: not sent by the plan");
        let globex = task(6, TaskKind::TEST, "tenant:globex", Some(format!("globex/plan/{acme_id}/one")));
        assert!(claimed_plan(&globex).is_some());
        assert_eq!(child_of(&acme, &globex), None, "another tenant's task under acme's plan");
        let under_ops = task(7, TaskKind::TEST, "tenant:globex", Some(format!("globex/plan/{op_id}/roll")));
        assert_eq!(child_of(&ops, &under_ops), None, "a tenant's task under an operator's plan");
        let unprefixed = task(8, TaskKind::TEST, "tenant:acme", Some(format!("plan/{acme_id}/one")));
        assert_eq!(claimed_plan(&unprefixed), None, "a tenant's key is always in its own space");
        // A plan not read (a listing of one kind): an operator's claim holds, a tenant's not.
        assert!(claim_holds(&child.requested_by, None) && !claim_holds(&tenant_child.requested_by, None));
    }
}

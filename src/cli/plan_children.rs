//! A plan's child tasks as `ferry tasks` shows them: found among every kind's task state by
//! their idempotency keys (`plan/<plan>/<step>[/<cluster>]`, `ferry_plan`'s `child_key`);
//! `tasks get` lists them, `tasks revert --dry-run` says which a revert would revert.

use ferry_plan::spec::PlanSpec;
use ferry_plan::steps::child::child_of;
use ferry_runtime::protocol::TaskSnapshot;
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

/// The children of `plan` (an operator's read: every kind's task state), oldest first.
pub async fn children(client: &Client, plan: &TaskSnapshot) -> anyhow::Result<Vec<ChildView>> {
    let id: TaskId = plan.task_id.parse()?;
    let mut found: Vec<ChildView> = client
        .snapshots_of(None)
        .await?
        .into_iter()
        .filter_map(|s| {
            let (step, cluster) = child_of(&id, s.idempotency_key.as_deref()?)?;
            Some(ChildView {
                step: step.to_owned(),
                cluster: cluster.map(str::to_owned),
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

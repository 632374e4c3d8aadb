//! The deploy task's steps, one module each, in plan order: [`check`], [`place`],
//! [`apply`], [`wait`]. What their runs and undos share: [`record`] (the app record on the
//! hub), `converge` (the fleet from one app state to another), and here the state a task
//! makes and whether a ManifestWork is applied.

pub mod apply;
pub mod check;
mod converge;
pub mod place;
pub mod record;
pub mod wait;

use ferry_kube::kinds::ManifestWork;
use ferry_task::{StepContext, StepError};
use serde_json::Value;

use crate::render::AppState;
use crate::spec::{DeployApp, DeployOperation};

/// The state this task makes: None for a delete.
fn desired(cx: &StepContext<'_, DeployApp>) -> Result<Option<AppState>, StepError> {
    if cx.spec.operation == DeployOperation::Delete {
        return Ok(None);
    }
    let placed = place::PLACE.required(cx)?;
    Ok(Some(AppState { spec: cx.spec.clone(), targets: placed.targets }))
}

/// Why the work agent has not applied `w` as it is now, or None when it has: Applied=True
/// observed at the current generation (older conditions and feedback describe the
/// previous spec).
fn unapplied(w: &ManifestWork) -> Option<String> {
    if w.condition("Applied") == Some("False") {
        return Some(ferry_kube::kinds::condition_message(&w.status, "Applied").unwrap_or_default());
    }
    let applied = w.status.get("conditions").and_then(Value::as_array).and_then(|cs| cs.iter().find(|c| c["type"] == "Applied"));
    if applied.is_some_and(|c| c["status"] == "True" && c["observedGeneration"].as_i64() == w.metadata.generation) {
        None
    } else {
        Some(format!("the work agent has not applied generation {} yet", w.metadata.generation.unwrap_or(0)))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn work(generation: i64, status: &str, observed: i64) -> ManifestWork {
        serde_json::from_value(json!({"apiVersion": "work.open-cluster-management.io/v1", "kind": "ManifestWork",
            "metadata": {"name": "w", "namespace": "member-1", "generation": generation},
            "spec": {}, "status": {"conditions": [{"type": "Applied", "status": status, "observedGeneration": observed}]}}))
        .unwrap()
    }

    #[test]
    fn a_work_is_applied_only_at_its_current_generation() {
        assert_eq!(unapplied(&work(3, "True", 3)), None);
        assert_eq!(unapplied(&work(3, "True", 2)).as_deref(), Some("the work agent has not applied generation 3 yet"), "a condition of the previous spec");
        assert!(unapplied(&work(3, "False", 3)).is_some_and(|m| m.starts_with("Applied=False")));
    }

    #[test]
    fn outputs_keep_the_shape_journals_and_views_read() {
        let ready = wait::Ready { components: vec![wait::ComponentStatus { component: "web".into(), cluster: "member-1".into(), ready: 2, address: None }] };
        assert_eq!(wait::WAIT.value(&ready).unwrap(), json!({"components": [{"component": "web", "cluster": "member-1", "ready": 2, "address": null}]}));
        let applied = apply::Applied { applied: vec!["member-1".into()], removed: vec!["member-2".into()] };
        assert_eq!(apply::APPLY.value(&applied).unwrap(), json!({"applied": ["member-1"], "removed": ["member-2"]}));
        assert_eq!(check::CHECK.value(&check::Checked::default()).unwrap(), json!({"previous": null}));
        assert_eq!(place::PLACE.value(&place::Placed::default()).unwrap(), json!({"targets": {}}));
    }
}

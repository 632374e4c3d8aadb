//! The deploy task's steps, one module each, in plan order: [`check`], [`place`],
//! [`apply`], [`wait`]. What their runs and undos share: [`record`] (the app record on the
//! hub), `converge` (the fleet from one app state to another), `guard` (writing and
//! deleting only what is Ferry's), and here the state a task makes and whether a
//! ManifestWork is applied.

pub mod apply;
pub mod check;
mod converge;
mod guard;
pub mod place;
pub mod record;
pub mod wait;

use ferry_kube::kinds::ManifestWork;
use ferry_task::{StepContext, StepError};
use serde_json::Value;

use crate::ownership::{NotFerrys, describe, is_conflict};
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
/// observed at the current generation (older conditions describe the previous spec; the
/// feedback may still do so after it, `render::feedback_is_current`).
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

/// A server-side apply conflict the work agent met applying `w` at its current
/// generation (a manifest's Applied=False with the API server's conflict message), as the
/// task's error: the work agent does not force (`render::manifest_work`), and retrying
/// will not help. ocm reports it per manifest (`pkg/work/spoke/controllers/
/// manifestcontroller/manifestwork_reconciler.go`, `buildAppliedStatusCondition`).
fn ssa_conflict(w: &ManifestWork, cluster: &str) -> Option<NotFerrys> {
    let manifests = w.status.pointer("/resourceStatus/manifests").and_then(Value::as_array)?;
    manifests.iter().find_map(|m| {
        let c = m.get("conditions").and_then(Value::as_array)?.iter().find(|c| c["type"] == "Applied")?;
        let current = c["observedGeneration"].as_i64().is_none_or(|g| Some(g) == w.metadata.generation);
        let message = c["message"].as_str().filter(|msg| c["status"] == "False" && current && is_conflict(msg))?;
        let s = |k: &str| m["resourceMeta"][k].as_str().unwrap_or("");
        Some(NotFerrys::conflict(cluster, s("kind"), describe(s("kind"), Some(s("namespace")), s("name")), message))
    })
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
    fn a_conflict_the_work_agent_met_fails_the_task() {
        let mut w = work(3, "False", 3);
        w.status["resourceStatus"] = json!({"manifests": [
            {"resourceMeta": {"kind": "Namespace", "name": "shop", "namespace": ""}, "conditions": [{"type": "Applied", "status": "True", "observedGeneration": 3}]},
            {"resourceMeta": {"kind": "Deployment", "name": "web", "namespace": "shop"}, "conditions": [{"type": "Applied", "status": "False", "observedGeneration": 3,
                "message": "Failed to apply manifest: Apply failed with 1 conflict: conflict with \"someone-else\" using apps/v1: .spec.replicas"}]},
        ]});
        let e = ssa_conflict(&w, "member-1").expect("a conflict");
        assert!(e.to_string().starts_with(r#"cluster "member-1": Deployment shop/web: fields Ferry applies are owned by field manager(s) ["someone-else"]"#), "{e}");
        // Of an older generation, or another failure: not this error.
        w.metadata.generation = Some(4);
        assert_eq!(ssa_conflict(&w, "member-1"), None);
        assert_eq!(ssa_conflict(&work(3, "False", 3), "member-1"), None);
    }

    #[test]
    fn outputs_keep_the_shape_journals_and_views_read() {
        let ready = wait::Ready { components: vec![wait::ComponentStatus { component: "web".into(), cluster: "member-1".into(), ready: 2, address: None }] };
        assert_eq!(wait::WAIT.value(&ready).unwrap(), json!({"components": [{"component": "web", "cluster": "member-1", "ready": 2, "address": null}]}));
        let namespaces = Some(vec![guard::NamespaceUse { cluster: "member-1".into(), namespace: "shop".into(), created: true }]);
        let applied = apply::Applied { applied: vec!["member-1".into()], removed: vec!["member-2".into()], namespaces };
        assert_eq!(
            apply::APPLY.value(&applied).unwrap(),
            json!({"applied": ["member-1"], "removed": ["member-2"], "namespaces": [{"cluster": "member-1", "namespace": "shop", "created": true}]})
        );
        // An output of an older Ferry has no namespaces: none was created (all are kept).
        let old: apply::Applied = serde_json::from_value(json!({"applied": ["member-1"], "removed": []})).unwrap();
        assert_eq!(old.namespaces, None);
        assert_eq!(check::CHECK.value(&check::Checked::default()).unwrap(), json!({"previous": null}));
        assert_eq!(place::PLACE.value(&place::Placed::default()).unwrap(), json!({"targets": {}}));
    }
}

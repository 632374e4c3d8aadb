//! Which objects are Ferry's, and the error when one is not (pure). Everything the deploy
//! worker writes carries [`MANAGED_BY`]`=ferry` and [`APP_LABEL`]`=<app>`, and is written
//! by field manager [`MANAGER`] (so `metadata.managedFields` names it); an object of the
//! same name without all three is someone else's (or another app's), and Ferry neither
//! takes it over nor deletes it. A namespace Ferry creates also carries
//! [`CREATED_BY_ANNOTATION`] naming the task: only such a namespace is ever deleted.

use ferry_task::{StepError, codes};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::render::{APP_LABEL, MANAGER};

/// The label naming who manages an object (Kubernetes' recommended label).
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Its value on everything Ferry makes.
pub const FERRY: &str = "ferry";
/// Annotation naming the task that created a namespace (set only when Ferry created it).
pub const CREATED_BY_ANNOTATION: &str = "ferry.io/created-by-task";

/// Whether Ferry made the object for `app`: both its labels say so, and Ferry's field
/// manager wrote it (labels alone anyone can copy).
pub fn is_ferrys(meta: &ObjectMeta, app: &str) -> bool {
    let label = |k: &str| meta.labels.as_ref().and_then(|l| l.get(k)).map(String::as_str);
    let written = meta.managed_fields.iter().flatten().any(|f| f.manager.as_deref() == Some(MANAGER));
    label(MANAGED_BY) == Some(FERRY) && label(APP_LABEL) == Some(app) && written
}

/// The task that created the namespace, when Ferry created it.
pub fn created_by(meta: &ObjectMeta) -> Option<&str> {
    meta.annotations.as_ref().and_then(|a| a.get(CREATED_BY_ANNOTATION)).map(String::as_str)
}

/// Who manages the object, for a message: its managed-by label (and app label when it is
/// Ferry's) and its field managers; never its content.
pub fn managed_by(meta: &ObjectMeta) -> String {
    let label = |k: &str| meta.labels.as_ref().and_then(|l| l.get(k)).cloned();
    let mut parts = Vec::new();
    match (label(MANAGED_BY), label(APP_LABEL)) {
        (Some(m), Some(a)) if m == FERRY => parts.push(format!("{MANAGED_BY}={m} for app {a:?}")),
        (Some(m), _) => parts.push(format!("{MANAGED_BY}={m}")),
        (None, _) => {}
    }
    let mut managers: Vec<&str> = meta.managed_fields.iter().flatten().filter_map(|f| f.manager.as_deref()).collect();
    managers.sort_unstable();
    managers.dedup();
    if !managers.is_empty() {
        parts.push(format!("field managers ({})", managers.join(", ")));
    }
    if parts.is_empty() { "no label or field manager recorded".to_owned() } else { parts.join(", ") }
}

/// The field managers a server-side apply conflict names: the API server says
/// `Apply failed with 1 conflict: conflict with "kubectl" using apps/v1: .spec.replicas`,
/// or with several `conflicts with "<manager>"` each followed by its paths (kubernetes
/// `staging/src/k8s.io/apimachinery/pkg/util/managedfields/internal/conflict.go`,
/// `getConflictMessage`, `printManager`).
pub fn conflict_managers(message: &str) -> Vec<String> {
    let mut out: Vec<String> = message
        .split("with \"")
        .skip(1)
        .filter_map(|rest| rest.split_once('"').map(|(m, _)| m.to_owned()))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Whether an API server's (or a work agent's) message is a server-side apply conflict.
pub fn is_conflict(message: &str) -> bool {
    message.contains("Apply failed with") && message.contains("conflict")
}

/// Why Ferry leaves an object alone. Messages name the cluster, the kind, the
/// namespace/name and who manages it, never the object's content.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotFerrys {
    /// An object of that name exists and Ferry did not make it for this app.
    #[error("cluster {cluster:?}: {what} exists and Ferry did not make it for app {app:?} (managed by: {by}); Ferry leaves it alone")]
    Foreign {
        /// Where.
        cluster: String,
        /// `Kind namespace/name`.
        what: String,
        /// The app being deployed.
        app: String,
        /// Who manages it ([`managed_by`]).
        by: String,
    },
    /// Server-side apply without force met fields another field manager owns.
    #[error("cluster {cluster:?}: {what}: fields Ferry applies are owned by field manager(s) {by:?} (server-side apply conflict{detail}); Ferry does not force them")]
    Conflict {
        /// Where.
        cluster: String,
        /// `Kind namespace/name`.
        what: String,
        /// The other field managers.
        by: Vec<String>,
        /// The API server's words (the conflicting field paths), or empty for a Secret.
        detail: String,
    },
}

impl NotFerrys {
    /// A conflict from the API server's (or work agent's) `message`; the field paths it
    /// names are kept except for a Secret (whose paths are its keys).
    pub fn conflict(cluster: &str, kind: &str, what: String, message: &str) -> Self {
        let detail = if kind == "Secret" { String::new() } else { format!(": {}", message.replace('\n', " ")) };
        Self::Conflict { cluster: cluster.to_owned(), what, by: conflict_managers(message), detail }
    }
}

impl From<NotFerrys> for StepError {
    fn from(e: NotFerrys) -> Self {
        StepError::permanent(codes::OBJECT_NOT_FERRYS, e.to_string())
    }
}

/// `Kind namespace/name` (or `Kind name` when cluster-scoped).
pub fn describe(kind: &str, namespace: Option<&str>, name: &str) -> String {
    match namespace.filter(|n| !n.is_empty()) {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn meta(v: serde_json::Value) -> ObjectMeta {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn only_both_labels_and_ferrys_field_manager_make_an_object_ferrys_for_the_app() {
        let written = json!([{"manager": "someone-else", "operation": "Apply"}, {"manager": MANAGER, "operation": "Apply"}]);
        assert!(is_ferrys(&meta(json!({"labels": {MANAGED_BY: "ferry", APP_LABEL: "shop"}, "managedFields": written})), "shop"));
        assert!(!is_ferrys(&meta(json!({"labels": {MANAGED_BY: "ferry", APP_LABEL: "blog"}, "managedFields": written})), "shop"), "another app's");
        assert!(!is_ferrys(&meta(json!({"labels": {APP_LABEL: "shop"}, "managedFields": written})), "shop"), "no managed-by");
        assert!(!is_ferrys(&meta(json!({"labels": {MANAGED_BY: "helm", APP_LABEL: "shop"}, "managedFields": written})), "shop"));
        let copied = json!([{"manager": "someone-else", "operation": "Apply"}]);
        assert!(!is_ferrys(&meta(json!({"labels": {MANAGED_BY: "ferry", APP_LABEL: "shop"}, "managedFields": copied})), "shop"), "labels copied by someone else");
        assert!(!is_ferrys(&meta(json!({})), "shop"));
    }

    #[test]
    fn who_manages_names_labels_and_field_managers_only() {
        let m = meta(json!({"labels": {MANAGED_BY: "helm"}, "managedFields": [
            {"manager": "kubectl", "operation": "Apply"}, {"manager": "helm", "operation": "Update"}, {"manager": "kubectl", "operation": "Update"}]}));
        assert_eq!(managed_by(&m), r#"app.kubernetes.io/managed-by=helm, field managers (helm, kubectl)"#);
        let other = meta(json!({"labels": {MANAGED_BY: "ferry", APP_LABEL: "blog"}}));
        assert_eq!(managed_by(&other), r#"app.kubernetes.io/managed-by=ferry for app "blog""#);
        assert_eq!(managed_by(&meta(json!({}))), "no label or field manager recorded");
    }

    #[test]
    fn conflicts_name_the_other_managers_and_keep_a_secrets_keys_out() {
        let one = r#"Apply failed with 1 conflict: conflict with "someone-else" using apps/v1: .spec.replicas"#;
        let two = "Apply failed with 2 conflicts: conflicts with \"kubectl\" using v1:\n- .data.password\nconflicts with \"helm\" using v1:\n- .data.user";
        assert!(is_conflict(one) && is_conflict(two));
        assert!(!is_conflict("namespaces \"x\" not found"));
        assert_eq!(conflict_managers(one), ["someone-else"]);
        assert_eq!(conflict_managers(two), ["helm", "kubectl"]);
        let e = NotFerrys::conflict("member-1", "Deployment", describe("Deployment", Some("shop"), "web"), one);
        assert!(e.to_string().contains(".spec.replicas") && e.to_string().contains("\"someone-else\""), "{e}");
        let s = NotFerrys::conflict("member-1", "Secret", describe("Secret", Some("shop"), "db"), two).to_string();
        assert!(!s.contains("password") && !s.contains(".data"), "a Secret's keys stay out: {s}");
        let err = StepError::from(NotFerrys::Foreign { cluster: "member-1".into(), what: describe("Namespace", None, "shop"), app: "shop".into(), by: "x".into() });
        assert_eq!(err.code, codes::OBJECT_NOT_FERRYS);
        assert!(!err.transient);
        assert!(err.message.starts_with(r#"cluster "member-1": Namespace shop exists"#), "{}", err.message);
    }
}

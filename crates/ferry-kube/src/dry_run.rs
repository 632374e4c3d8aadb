//! What a command would write, judged by the cluster that would hold it: each object a
//! worker renders is sent as a server-side dry run (`dryRun=All`: the upstream CRD's
//! schema, defaulting and the cluster's admission webhooks judge it, nothing is stored),
//! and what the cluster would then hold is compared with what it holds now, as RFC 6902
//! operations (labels, and every top-level field but `metadata` and `status`: both sides
//! as the same server defaults them). A Secret's values never show: its keys do, redacted.
//! [`Preview`] is a kind's whole dry run: its plan, the checks' verdict, these objects.

use kube::api::PatchParams;
use serde::Serialize;
use serde_json::{Value, json};

use crate::clusters::{ClusterError, Clusters};

/// What a Secret's value shows as in a preview.
pub const REDACTED: &str = "(redacted)";

/// What would become of one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// There is none: it would be created.
    Create,
    /// It differs: it would be updated.
    Update,
    /// It would stay as it is.
    Unchanged,
    /// It would be deleted.
    Delete,
    /// The cluster refused the dry run (see `refused`).
    Refused,
    /// Not sent: the cluster cannot judge it before an earlier write (see `note`).
    NotSent,
}

/// One object's part of a preview.
#[derive(Debug, Clone, Serialize)]
pub struct ObjectPreview {
    /// The cluster that would hold it (`hub` for the hub).
    pub cluster: String,
    /// `Kind namespace/name` (`Kind name` when cluster-scoped).
    pub object: String,
    /// What would become of it.
    pub change: Change,
    /// The cluster's refusal, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// Why it was not sent, or what the run would do first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// RFC 6902 operations from what is there now to what the cluster would hold.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub operations: Vec<Value>,
}

impl ObjectPreview {
    /// `obj` on `cluster`, not sent, for `note`.
    pub fn not_sent(cluster: &str, obj: &Value, note: impl Into<String>) -> Self {
        Self { cluster: cluster.to_owned(), object: describe(obj), change: Change::NotSent, refused: None, note: Some(note.into()), operations: Vec::new() }
    }

    /// `obj` on `cluster`, refused (by the cluster, or by what the run would check first).
    pub fn refused(cluster: &str, obj: &Value, why: impl Into<String>) -> Self {
        Self { cluster: cluster.to_owned(), object: describe(obj), change: Change::Refused, refused: Some(why.into()), note: None, operations: Vec::new() }
    }

    /// `obj` on `cluster`, which the run would delete.
    pub fn deleted(cluster: &str, obj: &Value, note: impl Into<String>) -> Self {
        Self { cluster: cluster.to_owned(), object: describe(obj), change: Change::Delete, refused: None, note: Some(note.into()), operations: Vec::new() }
    }
}

/// A kind's dry run on the clusters: its plan and the checks' verdict
/// ([`ferry_task::dry_run::checks`]), the objects it would write, and what it cannot show
/// before it runs.
#[derive(Debug, Clone, Serialize)]
pub struct Preview {
    /// The plan and the verdict.
    #[serde(flatten)]
    pub checked: ferry_task::dry_run::Checked,
    /// The objects the steps that act would write, judged by their clusters.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub objects: Vec<ObjectPreview>,
    /// What the run decides or writes only as it goes (named, not previewed).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl Preview {
    /// A preview with the checks' findings and nothing rendered yet.
    pub fn new(checked: ferry_task::dry_run::Checked) -> Self {
        Self { checked, objects: Vec::new(), notes: Vec::new() }
    }

    /// Whether a task would not get through: the checks reject it or fail for good, or a
    /// cluster refuses an object.
    pub fn refused(&self) -> bool {
        matches!(self.checked.verdict, ferry_task::dry_run::Verdict::Rejected { .. } | ferry_task::dry_run::Verdict::Fails { .. }) || self.objects.iter().any(|o| o.change == Change::Refused)
    }
}

/// `Kind namespace/name` of an object (`Kind name` when it has no namespace).
pub fn describe(obj: &Value) -> String {
    let kind = obj["kind"].as_str().unwrap_or("?");
    let name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("?");
    match obj.pointer("/metadata/namespace").and_then(Value::as_str) {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

/// Sends `obj` to `cluster` as a server-side apply dry run by `manager` and compares what
/// the cluster would hold with what it holds; `Err` only when the cluster could not be
/// asked (a refusal is a [`Change::Refused`]).
pub async fn apply(clusters: &Clusters, cluster: &str, obj: &Value, manager: &str) -> Result<ObjectPreview, ClusterError> {
    apply_guarded(clusters, cluster, obj, PatchParams::apply(manager).force(), |_| None).await
}

/// As [`apply`], applied with `pp` as the run applies (a run that does not force its
/// applies meets other field managers' conflicts: so does its dry run), and first asking
/// `guard` of the object there now (if any) whether the run would refuse to touch it
/// (another owner's object): its reason is a [`Change::Refused`], and nothing is sent.
pub async fn apply_guarded(
    clusters: &Clusters,
    cluster: &str,
    obj: &Value,
    pp: PatchParams,
    guard: impl FnOnce(&kube::api::DynamicObject) -> Option<String>,
) -> Result<ObjectPreview, ClusterError> {
    let refused = |why: String| ObjectPreview::refused(cluster, obj, why);
    let current = match clusters.get(cluster, obj).await {
        Ok(c) => c,
        Err(e @ ClusterError::NotServed { .. }) => return Ok(refused(e.to_string())),
        Err(e) => return Err(e),
    };
    if let Some(why) = current.as_ref().and_then(guard) {
        return Ok(refused(why));
    }
    let would = match clusters.dry_run_apply_with(cluster, obj, pp).await {
        Ok(w) => w,
        // Worded as every refusal is ([`crate::said`]): message, reason and code.
        Err(ClusterError::Kube { source: e @ kube::Error::Api(_), .. }) => return Ok(refused(crate::said::said(&e))),
        Err(e) => return Err(e),
    };
    let (change, operations) = match current {
        None => (Change::Create, Vec::new()),
        Some(now) => {
            let (before, after) = (comparable(&to_value(now)), comparable(&to_value(would)));
            let ops: Vec<Value> = serde_json::to_value(json_patch::diff(&before, &after)).ok().and_then(|v| v.as_array().cloned()).unwrap_or_default();
            (if ops.is_empty() { Change::Unchanged } else { Change::Update }, ops)
        }
    };
    Ok(ObjectPreview { cluster: cluster.to_owned(), object: describe(obj), change, refused: None, note: None, operations })
}

fn to_value(o: kube::api::DynamicObject) -> Value {
    serde_json::to_value(o).unwrap_or(Value::Null)
}

/// What a preview compares of an object: its labels and every top-level field but
/// `apiVersion`, `kind`, `metadata` and `status`; the values of every Secret in it
/// redacted (the object itself, or one it carries: a ManifestWork's manifests).
pub fn comparable(obj: &Value) -> Value {
    let mut out = json!({"labels": obj.pointer("/metadata/labels").cloned().unwrap_or_else(|| json!({}))});
    if let Some(m) = obj.as_object() {
        for (k, v) in m.iter().filter(|(k, _)| !matches!(k.as_str(), "apiVersion" | "kind" | "metadata" | "status")) {
            out[k] = v.clone();
        }
    }
    if obj["kind"] == "Secret" {
        redact_secret(&mut out);
    }
    redact(&mut out);
    out
}

/// Redacts every Secret object nested in `v`.
pub fn redact(v: &mut Value) {
    match v {
        Value::Object(m) => {
            if m.get("kind").and_then(Value::as_str) == Some("Secret") && m.get("apiVersion").and_then(Value::as_str) == Some("v1") {
                redact_secret(v);
                return;
            }
            m.values_mut().for_each(redact);
        }
        Value::Array(a) => a.iter_mut().for_each(redact),
        _ => {}
    }
}

fn redact_secret(secret: &mut Value) {
    for field in ["data", "stringData"] {
        if let Some(d) = secret.get_mut(field).and_then(Value::as_object_mut) {
            d.values_mut().for_each(|v| *v = json!(REDACTED));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_compares_by_its_keys_and_metadata_noise_is_left_out() {
        let s = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db", "namespace": "a", "resourceVersion": "7", "labels": {"x": "1"}},
                       "data": {"password": "aHVudGVyMg=="}, "type": "Opaque"});
        let c = comparable(&s);
        assert_eq!(c, json!({"labels": {"x": "1"}, "data": {"password": REDACTED}, "type": "Opaque"}));
        assert!(!c.to_string().contains("aHVudGVyMg"));
        assert_eq!(describe(&s), "Secret a/db");
        assert_eq!(describe(&json!({"kind": "Namespace", "metadata": {"name": "a"}})), "Namespace a");
        // A Secret a ManifestWork carries is redacted too.
        let work = json!({"apiVersion": "work.open-cluster-management.io/v1", "kind": "ManifestWork", "metadata": {"name": "w"},
                          "spec": {"workload": {"manifests": [s.clone(), {"apiVersion": "v1", "kind": "ConfigMap", "data": {"k": "plain"}}]}}});
        let c = comparable(&work);
        assert_eq!(c["spec"]["workload"]["manifests"][0]["data"], json!({"password": REDACTED}));
        assert_eq!(c["spec"]["workload"]["manifests"][1]["data"], json!({"k": "plain"}));
    }
}

//! The Liqo objects of an offloading (Liqo v1 API, `offloading.liqo.io/v1beta1`): the
//! NamespaceOffloading `offloading` in the namespace, selecting the target clusters by
//! their virtual nodes' labels, and how to read its status. Pure.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::spec::{NamespaceMappingStrategy, OffloadCommand, PodOffloadingStrategy, SelectorRequirement};

/// The only name Liqo accepts for a NamespaceOffloading.
pub const NAME: &str = "offloading";
/// Label of a virtual node: its provider's cluster id.
pub use ferry_kube::vocab::liqo::REMOTE_ID_LABEL;
/// Label selecting virtual nodes.
pub const VIRTUAL_NODE_SELECTOR: &str = "liqo.io/type=virtual-node";
/// Label on the NamespaceOffloading a task created: the task's id.
pub const TASK_LABEL: &str = "ferry.dev/offload-task";
/// The scheduling label Liqo puts on an offloaded namespace and the toleration key its pod
/// webhook adds (see [`ferry_kube::vocab::liqo`]).
pub use ferry_kube::vocab::liqo::{SCHEDULING_LABEL, VIRTUAL_NODE_TOLERATION_KEY};

fn pod_strategy(s: PodOffloadingStrategy) -> &'static str {
    match s {
        PodOffloadingStrategy::LocalAndRemote => "LocalAndRemote",
        PodOffloadingStrategy::Local => "Local",
        PodOffloadingStrategy::Remote => "Remote",
    }
}

fn mapping(s: NamespaceMappingStrategy) -> &'static str {
    match s {
        NamespaceMappingStrategy::DefaultName => "DefaultName",
        NamespaceMappingStrategy::EnforceSameName => "EnforceSameName",
        NamespaceMappingStrategy::SelectedName => "SelectedName",
    }
}

fn requirement(r: &SelectorRequirement) -> Value {
    let mut v = json!({"key": r.key, "operator": r.operator});
    if !r.values.is_empty() {
        v["values"] = json!(r.values);
    }
    v
}

/// The spec offloading `c.namespace` to the clusters with Liqo ids `ids` (or, when `ids`
/// is None, those `c.cluster_selector` selects among the virtual nodes).
pub fn spec(c: &OffloadCommand, strategy: PodOffloadingStrategy, ids: Option<&[String]>) -> Value {
    let mut exprs = vec![json!({"key": "liqo.io/type", "operator": "In", "values": ["virtual-node"]})];
    match ids {
        Some(ids) => exprs.push(json!({"key": REMOTE_ID_LABEL, "operator": "In", "values": ids})),
        None => exprs.extend(c.cluster_selector.iter().map(requirement)),
    }
    let mut s = json!({
        "podOffloadingStrategy": pod_strategy(strategy),
        "namespaceMappingStrategy": mapping(c.namespace_mapping_strategy),
        "clusterSelector": {"nodeSelectorTerms": [{"matchExpressions": exprs}]},
    });
    if let Some(n) = &c.remote_namespace_name {
        s["remoteNamespaceName"] = json!(n);
    }
    s
}

/// The NamespaceOffloading of `namespace` with `spec`, labelled for `task` (the task that
/// made it; None for one Ferry restores but did not make).
pub fn namespace_offloading(namespace: &str, spec: &Value, task: Option<&str>) -> Value {
    let labels = match task {
        Some(t) => json!({TASK_LABEL: t, "app.kubernetes.io/managed-by": "ferry"}),
        None => json!({}),
    };
    json!({"apiVersion": "offloading.liqo.io/v1beta1", "kind": "NamespaceOffloading",
        "metadata": {"name": NAME, "namespace": namespace, "labels": labels}, "spec": spec})
}

/// Why a NamespaceOffloading with `current` spec cannot become one with `desired` by an
/// update: Liqo's webhook refuses any change of `namespaceMappingStrategy` or
/// `remoteNamespaceName` after creation (`pkg/webhooks/namespaceoffloading/nsoff.go`), so
/// it has to be deleted and created again. None when an update will do. An absent
/// strategy is the CRD's default (`DefaultName`), an absent name the empty one.
pub fn immutable_change(current: &Value, desired: &Value) -> Option<String> {
    let strategy = |s: &Value| s.get("namespaceMappingStrategy").and_then(Value::as_str).unwrap_or("DefaultName").to_owned();
    let name = |s: &Value| s.get("remoteNamespaceName").and_then(Value::as_str).unwrap_or_default().to_owned();
    if strategy(current) != strategy(desired) {
        return Some(format!("namespaceMappingStrategy {} → {}", strategy(current), strategy(desired)));
    }
    if name(current) != name(desired) {
        return Some(format!("remoteNamespaceName {:?} → {:?}", name(current), name(desired)));
    }
    None
}

/// True when `labels` satisfy every requirement.
pub fn matches(labels: &BTreeMap<String, String>, reqs: &[SelectorRequirement]) -> bool {
    reqs.iter().all(|r| {
        let v = labels.get(&r.key);
        match r.operator.as_str() {
            "In" => v.is_some_and(|v| r.values.contains(v)),
            "NotIn" => v.is_none_or(|v| !r.values.contains(v)),
            "Exists" => v.is_some(),
            "DoesNotExist" => v.is_none(),
            _ => false,
        }
    })
}

/// What a NamespaceOffloading's status says about `ids`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// Ready on every id: the twin namespaces' name.
    Ready(String),
    /// Not yet (why).
    Pending(String),
    /// Failed on some (their conditions' messages).
    Failed(String),
}

/// Reads `status` (and whether the controller saw the latest `generation`). `SomeFailed` and
/// `AllFailed` are failures, as liqoctl's own wait reads them (`pkg/liqoctl/wait/wait.go`,
/// `ForOffloading`, which stops at once); but Liqo's NamespaceMap controller also reports a
/// transient failure (an API error, a RoleBinding refused in a terminating namespace) as
/// `CreationLoopBackOff` until a retry succeeds (`namespacemap-controller/enforcement.go`),
/// so the offload step fails only once one has lasted its grace period
/// (`OffloadConfig::failure_grace`).
pub fn progress(status: &Value, generation: Option<i64>, ids: &[String]) -> Progress {
    let observed = status.get("observedGeneration").and_then(Value::as_i64);
    if let (Some(g), Some(o)) = (generation, observed)
        && o < g
    {
        return Progress::Pending(format!("the controller has seen generation {o} of {g}"));
    }
    let phase = status.get("offloadingPhase").and_then(Value::as_str).unwrap_or("(none)");
    let ready =
        |id: &str| {
            status.pointer(&format!("/remoteNamespacesConditions/{id}")).and_then(Value::as_array).and_then(|cs| cs.iter().find(|c| c["type"] == "Ready")).map(
                |c| (c["status"] == "True", format!("{id}: {} {}", c["reason"].as_str().unwrap_or(""), c["message"].as_str().unwrap_or("")).trim().to_owned()),
            )
        };
    match phase {
        "SomeFailed" | "AllFailed" => {
            let why: Vec<String> = ids.iter().filter_map(|id| ready(id)).filter(|(ok, _)| !ok).map(|(_, m)| m).collect();
            Progress::Failed(format!("offloading phase {phase}: {}", why.join("; ")))
        }
        "Ready" => {
            let missing: Vec<&String> = ids.iter().filter(|id| !ready(id).is_some_and(|(ok, _)| ok)).collect();
            match status.get("remoteNamespaceName").and_then(Value::as_str) {
                Some(n) if missing.is_empty() => Progress::Ready(n.to_owned()),
                _ => Progress::Pending(format!("Ready, but not yet on {missing:?}")),
            }
        }
        other => Progress::Pending(format!("offloading phase {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_targets_select_their_virtual_nodes() {
        let c = OffloadCommand { cluster: "member-1".into(), namespace: "web".into(), ..OffloadCommand::default() };
        let s = spec(&c, PodOffloadingStrategy::LocalAndRemote, Some(&["member-2".to_owned()]));
        assert_eq!(
            s["clusterSelector"]["nodeSelectorTerms"][0]["matchExpressions"][1],
            json!({"key": REMOTE_ID_LABEL, "operator": "In", "values": ["member-2"]})
        );
        assert_eq!(s["namespaceMappingStrategy"], "DefaultName");
        assert!(s.get("remoteNamespaceName").is_none());
    }

    #[test]
    fn mapping_strategy_and_remote_name_changes_need_a_new_offloading() {
        let default = json!({"namespaceMappingStrategy": "DefaultName", "podOffloadingStrategy": "LocalAndRemote"});
        assert_eq!(immutable_change(&default, &json!({"namespaceMappingStrategy": "DefaultName", "podOffloadingStrategy": "Remote"})), None);
        assert_eq!(immutable_change(&json!({}), &default), None, "absent is the CRD's default");
        let same = json!({"namespaceMappingStrategy": "EnforceSameName"});
        assert_eq!(immutable_change(&default, &same).as_deref(), Some("namespaceMappingStrategy DefaultName → EnforceSameName"));
        let named = |n: &str| json!({"namespaceMappingStrategy": "SelectedName", "remoteNamespaceName": n});
        assert_eq!(immutable_change(&named("a"), &named("a")), None);
        assert_eq!(immutable_change(&named("a"), &named("b")).as_deref(), Some("remoteNamespaceName \"a\" → \"b\""));
    }

    #[test]
    fn selectors_and_status() {
        let labels: BTreeMap<String, String> = [("zone".to_owned(), "eu".to_owned())].into();
        let r = |k: &str, op: &str, v: &[&str]| SelectorRequirement { key: k.into(), operator: op.into(), values: v.iter().map(|s| (*s).to_owned()).collect() };
        assert!(matches(&labels, &[r("zone", "In", &["eu", "us"]), r("gpu", "DoesNotExist", &[])]));
        assert!(!matches(&labels, &[r("zone", "NotIn", &["eu"])]));
        let ids = ["member-2".to_owned()];
        // As upstream writes them (`namespaceoffloading-controller/status.go`): a condition
        // per peered provider, an unselected one among them.
        let ok = json!({"offloadingPhase": "Ready", "remoteNamespaceName": "web-member-1", "observedGeneration": 1,
            "remoteNamespacesConditions": {
                "member-2": [{"type": "OffloadingRequired", "status": "True", "reason": "ClusterSelected"},
                             {"type": "Ready", "status": "True", "reason": "NamespaceCreated"}],
                "member-3": [{"type": "OffloadingRequired", "status": "False", "reason": "ClusterNotSelected"}]}});
        assert_eq!(progress(&ok, Some(1), &ids), Progress::Ready("web-member-1".into()));
        assert!(matches!(progress(&ok, Some(2), &ids), Progress::Pending(_)));
        let bad = json!({"offloadingPhase": "AllFailed", "remoteNamespacesConditions": {"member-2": [{"type": "Ready", "status": "False",
            "reason": "CreationLoopBackOff", "message": "Some problems occurred during remote namespace creation"}]}});
        assert_eq!(progress(&bad, None, &ids), Progress::Failed("offloading phase AllFailed: member-2: CreationLoopBackOff Some problems occurred during remote namespace creation".into()));
    }
}

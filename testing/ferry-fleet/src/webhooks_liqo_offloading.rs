//! Liqo's offloading admission webhooks on every member, as Liqo's chart installs them
//! (liqotech/liqo at 557c199; `deployments/liqo/templates/webhooks/liqo-validating-webhook.yaml`
//! and `liqo-mutating-webhook.yaml`, `failurePolicy: Fail` by the chart's values):
//!
//! - `nsoff.validate.liqo.io` (`pkg/webhooks/namespaceoffloading/nsoff.go`), on CREATE and
//!   UPDATE of NamespaceOffloadings not labelled `liqo.io/webhook-skip=true`: the name must
//!   be `offloading`; `SelectedName` needs a `remoteNamespaceName` at creation;
//!   `namespaceMappingStrategy` and `remoteNamespaceName` never change after creation.
//!   (Upstream also warns when `podOffloadingStrategy` becomes more restrictive; a warning
//!   allows the write, so it is not reproduced.)
//! - `pod.mutate.liqo.io` (`pkg/webhooks/pod/pod.go`, `mutations.go`), on CREATE of pods
//!   only, in namespaces labelled `liqo.io/scheduling-enabled=true` (Liqo's
//!   namespaceoffloading controller sets that label, `labels.go`): it reads the namespace's
//!   NamespaceOffloading (refusing the pod when there is none) and, unless the strategy is
//!   `Local` or the pod runs with Liqo's runtime class, adds the virtual nodes' toleration
//!   and a required node affinity built from the `clusterSelector`: `Remote` requires a
//!   virtual node in every term; `LocalAndRemote` with a selector adds a term for local
//!   nodes; an existing required affinity is merged term by term. A pod that existed
//!   before the label never gets them: the API server calls the webhook only at creation.
//!
//! The pod webhook reads its own cluster, so each member has its own (see
//! [`crate::admission::Webhook::for_cluster`]).

use std::sync::Arc;

use ferry_kube::vocab::liqo::{TYPE_LABEL, TYPE_VIRTUAL_NODE};
use futures::FutureExt;
use futures::future::BoxFuture;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::core::admission::{AdmissionRequest, Operation};
use serde_json::{Value, json};

use crate::admission::{AdmissionError, AdmissionServer, JsonPatch, Mutator, Registration, Requirement, Selector, Validator, Webhook, diff};

/// The only NamespaceOffloading name Liqo accepts (`pkg/consts/namespace_mapping.go`,
/// `DefaultNamespaceOffloadingName`).
pub const OFFLOADING_NAME: &str = "offloading";
pub use ferry_kube::vocab::liqo::{SCHEDULING_LABEL, VIRTUAL_NODE_TOLERATION_KEY};
/// Liqo's runtime class (the chart's `offloading.runtimeClass.name`): pods using it are
/// left as they are.
pub const LIQO_RUNTIME_CLASS: &str = "liqo";
/// The label that exempts an object from Liqo's webhooks (their `objectSelector`).
pub const WEBHOOK_SKIP_LABEL: &str = "liqo.io/webhook-skip";

const SKIP: Selector = Selector { match_labels: &[], match_expressions: &[Requirement { key: WEBHOOK_SKIP_LABEL, operator: "NotIn", values: &["true"] }] };

/// The NamespaceOffloading webhook's registration, as the chart has it.
pub const NAMESPACE_OFFLOADING: Registration = Registration {
    name: "nsoff.validate.liqo.io",
    groups: &["offloading.liqo.io"],
    versions: &["v1beta1"],
    resources: &["namespaceoffloadings"],
    operations: &["CREATE", "UPDATE"],
    namespace_selector: None,
    object_selector: Some(SKIP),
};

/// The pod webhook's registration, as the chart has it: CREATE only, in namespaces
/// labelled for scheduling.
pub const POD: Registration = Registration {
    name: "pod.mutate.liqo.io",
    groups: &[""],
    versions: &["v1"],
    resources: &["pods"],
    operations: &["CREATE"],
    namespace_selector: Some(Selector { match_labels: &[(SCHEDULING_LABEL, "true")], match_expressions: &[] }),
    object_selector: None,
};

/// Both webhooks of the member `cluster`, whose API `client` reaches, each at a path of
/// its own.
pub fn webhooks(cluster: &str, client: kube::Client) -> Vec<Webhook> {
    vec![
        Webhook::validating(NAMESPACE_OFFLOADING, Arc::new(NamespaceOffloadingWebhook)).for_cluster(cluster),
        Webhook::mutating(POD, Arc::new(PodWebhook { client, runtime_class: LIQO_RUNTIME_CLASS })).for_cluster(cluster),
    ]
}

/// Serves both webhooks of every one of `members` (name, client) and registers them there.
pub async fn start(members: &[(String, kube::Client)]) -> Result<AdmissionServer, AdmissionError> {
    let per_member: Vec<Vec<Webhook>> = members.iter().map(|(name, client)| webhooks(name, client.clone())).collect();
    let server = AdmissionServer::serve(per_member.iter().flatten().cloned().collect()).await?;
    for ((_, client), hooks) in members.iter().zip(&per_member) {
        for w in hooks {
            server.register_endpoint(client, &w.endpoint).await?;
        }
    }
    Ok(server)
}

fn data(o: Option<&DynamicObject>) -> Value {
    o.map(|o| o.data.clone()).unwrap_or(Value::Null)
}

/// A string field of a spec, absent and empty alike (Go's zero value).
fn field<'a>(spec: &'a Value, key: &str) -> &'a str {
    spec[key].as_str().unwrap_or_default()
}

/// `nsoff.go`'s decision on a NamespaceOffloading named `name` with `spec` (and, for an
/// update, the `old` spec); `Err` is upstream's denial.
pub fn check_namespace_offloading(operation: &Operation, name: &str, spec: &Value, old: Option<&Value>) -> Result<(), String> {
    if name != OFFLOADING_NAME {
        return Err(format!("NamespaceOffloading name must match {OFFLOADING_NAME}"));
    }
    match operation {
        Operation::Create if field(spec, "namespaceMappingStrategy") == "SelectedName" && field(spec, "remoteNamespaceName").is_empty() => {
            return Err("The RemoteNamespaceName value cannot be empty when using the SelectedName NamespaceMappingStrategy".into());
        }
        Operation::Update => {
            let old = old.unwrap_or(&Value::Null);
            if field(old, "namespaceMappingStrategy") != field(spec, "namespaceMappingStrategy") {
                return Err("The NamespaceMappingStrategy value cannot be modified after creation".into());
            }
            if field(old, "remoteNamespaceName") != field(spec, "remoteNamespaceName") {
                return Err("The RemoteNamespaceName value cannot be modified after creation".into());
            }
        }
        _ => {}
    }
    Ok(())
}

struct NamespaceOffloadingWebhook;

impl Validator for NamespaceOffloadingWebhook {
    fn validate<'a>(&'a self, req: &'a AdmissionRequest<DynamicObject>) -> BoxFuture<'a, Result<(), String>> {
        async move {
            let Some(new) = req.object.as_ref() else { return Ok(()) };
            let name = new.metadata.name.clone().unwrap_or_default();
            let old = data(req.old_object.as_ref());
            check_namespace_offloading(&req.operation, &name, &data(Some(new))["spec"], Some(&old["spec"]))
        }
        .boxed()
    }
}

struct PodWebhook {
    client: kube::Client,
    runtime_class: &'static str,
}

/// The NamespaceOffloading kind.
fn namespace_offloadings() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("offloading.liqo.io", "v1beta1", "NamespaceOffloading"), "namespaceoffloadings")
}

impl Mutator for PodWebhook {
    fn mutate<'a>(&'a self, req: &'a AdmissionRequest<DynamicObject>) -> BoxFuture<'a, Result<JsonPatch, String>> {
        async move {
            let Some(obj) = req.object.as_ref() else { return Ok(JsonPatch(Vec::new())) };
            let before = serde_json::to_value(obj).map_err(|e| format!("decoding the pod: {e}"))?;
            // pod.go: the namespace's NamespaceOffloading (req.Namespace: the pod's may be unset).
            let ns = req.namespace.clone().unwrap_or_default();
            let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &ns, &namespace_offloadings());
            let nsoff = match api.get_opt(OFFLOADING_NAME).await {
                Ok(Some(o)) => o,
                Ok(None) | Err(_) => return Err("failed retrieving NamespaceOffloading".into()),
            };
            let mut after = before.clone();
            mutate_pod(&data(Some(&nsoff))["spec"], &mut after, self.runtime_class).map_err(|_| "failed constructing pod mutation".to_owned())?;
            Ok(diff(&before, &after))
        }
        .boxed()
    }
}

/// The toleration of the virtual nodes' taint (`getVirtualNodeToleration`).
pub fn virtual_node_toleration() -> Value {
    json!({"key": VIRTUAL_NODE_TOLERATION_KEY, "operator": "Exists", "effect": "NoExecute"})
}

/// `mutatePod`: the pod as the NamespaceOffloading with `spec` wants it created. Unknown
/// strategies are an error, as upstream.
pub fn mutate_pod(spec: &Value, pod: &mut Value, runtime_class: &str) -> Result<(), String> {
    let strategy = field(spec, "podOffloadingStrategy");
    if strategy == "Local" {
        return Ok(());
    }
    if pod["spec"]["runtimeClassName"].as_str() == Some(runtime_class) {
        return Ok(());
    }
    // createTolerationFromNamespaceOffloading
    if !matches!(strategy, "LocalAndRemote" | "Remote") {
        return Err(format!("unknown PodOffloadingStrategyType {strategy:?}"));
    }
    match pod["spec"]["tolerations"].as_array_mut() {
        Some(ts) => ts.push(virtual_node_toleration()),
        None => pod["spec"]["tolerations"] = json!([virtual_node_toleration()]),
    }
    if let Some(imposed) = imposed_node_selector(spec)? {
        fill_node_selector(pod, imposed);
    }
    Ok(())
}

fn virtual_node_requirement(operator: &str) -> Value {
    json!({"key": TYPE_LABEL, "operator": operator, "values": [TYPE_VIRTUAL_NODE]})
}

/// `createNodeSelectorFromNamespaceOffloading`: the required node selector the strategy
/// imposes (None: no constraint).
fn imposed_node_selector(spec: &Value) -> Result<Option<Value>, String> {
    let mut terms: Vec<Value> = spec["clusterSelector"]["nodeSelectorTerms"].as_array().cloned().unwrap_or_default();
    match field(spec, "podOffloadingStrategy") {
        // Every term also requires a virtual node, so no local node qualifies.
        "Remote" => {
            if terms.is_empty() {
                terms.push(json!({}));
            }
            for t in &mut terms {
                match t["matchExpressions"].as_array_mut() {
                    Some(e) => e.push(virtual_node_requirement("In")),
                    None => t["matchExpressions"] = json!([virtual_node_requirement("In")]),
                }
            }
        }
        // No selector already allows every node; otherwise one more term allows local ones.
        "LocalAndRemote" => {
            if terms.is_empty() {
                return Ok(None);
            }
            terms.push(json!({"matchExpressions": [virtual_node_requirement("NotIn")]}));
        }
        "Local" => return Ok(None),
        other => return Err(format!("unknown PodOffloadingStrategyType {other:?}")),
    }
    Ok(Some(json!({"nodeSelectorTerms": terms})))
}

/// `fillPodWithTheNewNodeSelector`: sets the pod's required node affinity to `imposed`, or
/// merges it with the one the pod has (`utils.MergeNodeSelector`: each pair of terms
/// ANDed, their match expressions concatenated).
fn fill_node_selector(pod: &mut Value, imposed: Value) {
    let required = &mut pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
    let own: Vec<Value> = required["nodeSelectorTerms"].as_array().cloned().unwrap_or_default();
    if own.is_empty() {
        *required = imposed;
        return;
    }
    let exprs = |t: &Value| t["matchExpressions"].as_array().cloned().unwrap_or_default();
    let mut merged = Vec::new();
    for a in &own {
        for b in imposed["nodeSelectorTerms"].as_array().into_iter().flatten() {
            let both: Vec<Value> = exprs(a).into_iter().chain(exprs(b)).collect();
            merged.push(if both.is_empty() { json!({}) } else { json!({"matchExpressions": both}) });
        }
    }
    *required = json!({"nodeSelectorTerms": merged});
}

#[cfg(test)]
mod tests {
    use super::*;

    fn only(provider: &str) -> Value {
        json!({"nodeSelectorTerms": [{"matchExpressions": [{"key": "liqo.io/remote-cluster-id", "operator": "In", "values": [provider]}]}]})
    }

    fn pod() -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}})
    }

    #[test]
    fn namespace_offloading_name_and_immutable_fields() {
        let spec = json!({"namespaceMappingStrategy": "DefaultName", "podOffloadingStrategy": "LocalAndRemote"});
        assert_eq!(check_namespace_offloading(&Operation::Create, "other", &spec, None), Err("NamespaceOffloading name must match offloading".into()));
        assert_eq!(check_namespace_offloading(&Operation::Create, "offloading", &spec, None), Ok(()));
        let selected = json!({"namespaceMappingStrategy": "SelectedName"});
        assert!(check_namespace_offloading(&Operation::Create, "offloading", &selected, None).unwrap_err().contains("cannot be empty"));
        // What the old undo sent: the previous mapping strategy, re-applied over another.
        let same = json!({"namespaceMappingStrategy": "EnforceSameName"});
        assert_eq!(
            check_namespace_offloading(&Operation::Update, "offloading", &same, Some(&spec)),
            Err("The NamespaceMappingStrategy value cannot be modified after creation".into())
        );
        let named = |n: &str| json!({"namespaceMappingStrategy": "SelectedName", "remoteNamespaceName": n});
        assert_eq!(
            check_namespace_offloading(&Operation::Update, "offloading", &named("b"), Some(&named("a"))),
            Err("The RemoteNamespaceName value cannot be modified after creation".into())
        );
        // The pod strategy and the selector may change.
        let wider = json!({"namespaceMappingStrategy": "DefaultName", "podOffloadingStrategy": "Remote", "clusterSelector": only("member-2")});
        assert_eq!(check_namespace_offloading(&Operation::Update, "offloading", &wider, Some(&spec)), Ok(()));
    }

    #[test]
    fn pods_get_the_toleration_and_the_affinity_of_the_strategy() {
        // LocalAndRemote without a selector: the toleration only.
        let mut p = pod();
        mutate_pod(&json!({"podOffloadingStrategy": "LocalAndRemote"}), &mut p, LIQO_RUNTIME_CLASS).unwrap();
        assert_eq!(p["spec"]["tolerations"], json!([virtual_node_toleration()]));
        assert!(p["spec"].get("affinity").is_none());
        // LocalAndRemote with a selector: the selected virtual nodes or a local node.
        let mut p = pod();
        mutate_pod(&json!({"podOffloadingStrategy": "LocalAndRemote", "clusterSelector": only("member-2")}), &mut p, LIQO_RUNTIME_CLASS).unwrap();
        let terms = &p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
        assert_eq!(terms[0], only("member-2")["nodeSelectorTerms"][0]);
        assert_eq!(terms[1], json!({"matchExpressions": [{"key": "liqo.io/type", "operator": "NotIn", "values": ["virtual-node"]}]}));
        // Remote: a virtual node in every term, even without a selector.
        let mut p = pod();
        mutate_pod(&json!({"podOffloadingStrategy": "Remote"}), &mut p, LIQO_RUNTIME_CLASS).unwrap();
        assert_eq!(
            p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"],
            json!({"nodeSelectorTerms": [{"matchExpressions": [{"key": "liqo.io/type", "operator": "In", "values": ["virtual-node"]}]}]})
        );
        // Local, Liqo's runtime class: untouched; an unknown strategy: an error.
        for (spec, p0) in [(json!({"podOffloadingStrategy": "Local"}), pod()), (json!({"podOffloadingStrategy": "Remote"}), {
            let mut p = pod();
            p["spec"]["runtimeClassName"] = json!("liqo");
            p
        })] {
            let mut p = p0.clone();
            mutate_pod(&spec, &mut p, LIQO_RUNTIME_CLASS).unwrap();
            assert_eq!(p, p0);
        }
        assert!(mutate_pod(&json!({"podOffloadingStrategy": "Elsewhere"}), &mut pod(), LIQO_RUNTIME_CLASS).is_err());
    }

    #[test]
    fn an_own_required_affinity_is_merged_term_by_term() {
        let mut p = pod();
        p["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
        ]}}});
        mutate_pod(&json!({"podOffloadingStrategy": "Remote"}), &mut p, LIQO_RUNTIME_CLASS).unwrap();
        let terms = p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"].as_array().unwrap().clone();
        assert_eq!(terms.len(), 2);
        for (t, zone) in terms.iter().zip(["a", "b"]) {
            assert_eq!(t["matchExpressions"][0]["values"], json!([zone]));
            assert_eq!(t["matchExpressions"][1], json!({"key": "liqo.io/type", "operator": "In", "values": ["virtual-node"]}));
        }
        // The patch the server answers with adds exactly that.
        let patch = diff(&pod(), &p);
        assert!(!patch.0.is_empty());
    }
}

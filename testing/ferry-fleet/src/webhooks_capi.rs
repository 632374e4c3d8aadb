//! Cluster API's Cluster admission, the part Ferry's flows meet (cluster-api at
//! `ae7ff04`, `core/webhooks/admission/cluster.go`): a Cluster with a topology whose
//! ClusterClass exists and is reconciled (`clusterClassIsReconciled`: the observed
//! generation and `VariablesReady`) must set every variable the class's
//! `status.variables` marks required (`internal/topology/variables/
//! cluster_variable_validation.go`, `validateRequiredVariables`) and has no top-level
//! schema default (the webhook defaults those first: `cluster_variable_defaulting.go`,
//! `defaultValue`; not written back here); a class not found or not
//! reconciled only warns upstream, so it is let through here. Variable values are not
//! checked against their schemas (not needed by the flows).

use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::core::admission::AdmissionRequest;
use serde_json::Value;

use crate::admission::{Registration, Validator};

/// The Cluster webhook's registration (CAPI's `validation.cluster.cluster.x-k8s.io`).
pub const CLUSTER: Registration = Registration {
    name: "validation.cluster.cluster.x-k8s.io",
    groups: &["cluster.x-k8s.io"],
    versions: &["v1beta2"],
    resources: &["clusters"],
    operations: &["CREATE", "UPDATE"],
    namespace_selector: None,
    object_selector: None,
};

/// The Cluster webhook, reading ClusterClasses on the hub `hub` reaches.
pub fn validators(hub: kube::Client) -> Vec<(Registration, Arc<dyn Validator>)> {
    vec![(CLUSTER, Arc::new(ClusterWebhook { hub }))]
}

struct ClusterWebhook {
    hub: kube::Client,
}

/// The variables `class` requires, when it is reconciled; None otherwise.
fn required_variables(class: &DynamicObject) -> Option<Vec<String>> {
    let generation = class.metadata.generation.unwrap_or(0);
    let observed = class.data.pointer("/status/observedGeneration").and_then(Value::as_i64);
    let ready = class.data.pointer("/status/conditions").and_then(Value::as_array).into_iter().flatten().any(|c| c["type"] == "VariablesReady" && c["status"] == "True");
    if observed != Some(generation) || !ready {
        return None;
    }
    Some(
        class
            .data
            .pointer("/status/variables")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|v| v.pointer("/definitions/0/required").and_then(Value::as_bool) == Some(true))
            .filter(|v| v.pointer("/definitions/0/schema/openAPIV3Schema/default").is_none())
            .filter_map(|v| v["name"].as_str().map(str::to_owned))
            .collect(),
    )
}

impl ClusterWebhook {
    async fn check(&self, req: &AdmissionRequest<DynamicObject>) -> Result<(), String> {
        let Some(new) = req.object.as_ref() else { return Ok(()) };
        let Some(topology) = new.data.pointer("/spec/topology") else { return Ok(()) };
        let name = new.metadata.name.clone().unwrap_or_default();
        let Some(class) = topology.pointer("/classRef/name").and_then(Value::as_str) else { return Ok(()) };
        let ns = topology.pointer("/classRef/namespace").and_then(Value::as_str).map(str::to_owned).or_else(|| new.metadata.namespace.clone()).unwrap_or_default();
        let gvk = GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "ClusterClass");
        let api: Api<DynamicObject> = Api::namespaced_with(self.hub.clone(), &ns, &ApiResource::from_gvk(&gvk));
        let Some(cc) = api.get_opt(class).await.map_err(|e| e.to_string())? else { return Ok(()) };
        let Some(required) = required_variables(&cc) else { return Ok(()) };
        let set: Vec<&str> = topology.pointer("/variables").and_then(Value::as_array).into_iter().flatten().filter_map(|v| v["name"].as_str()).collect();
        let missing: Vec<String> = required
            .iter()
            .filter(|r| !set.contains(&r.as_str()))
            .map(|r| format!("spec.topology.variables: Required value: required variable {r:?} must be set"))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(format!("Cluster.cluster.x-k8s.io {name:?} is invalid: [{}]", missing.join(", ")))
    }
}

impl Validator for ClusterWebhook {
    fn validate<'a>(&'a self, req: &'a AdmissionRequest<DynamicObject>) -> BoxFuture<'a, Result<(), String>> {
        self.check(req).boxed()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn only_a_reconciled_class_requires_its_required_variables() {
        let class = |generation: i64, observed: i64, ready: &str| -> DynamicObject {
            serde_json::from_value(json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "ClusterClass",
                "metadata": {"name": "quick-start", "namespace": "fleet", "generation": generation},
                "status": {"observedGeneration": observed, "conditions": [{"type": "VariablesReady", "status": ready}],
                    "variables": [{"name": "imageRepository", "definitions": [{"from": "inline", "required": true}]},
                                  {"name": "etcdImageTag", "definitions": [{"from": "inline", "required": false}]},
                                  {"name": "coreDNSImageTag", "definitions": [{"from": "inline", "required": true,
                                      "schema": {"openAPIV3Schema": {"type": "string", "default": ""}}}]}]}}))
            .unwrap()
        };
        assert_eq!(required_variables(&class(2, 2, "True")), Some(vec!["imageRepository".to_owned()]));
        assert_eq!(required_variables(&class(2, 1, "True")), None, "an older generation: not reconciled");
        assert_eq!(required_variables(&class(2, 2, "False")), None);
    }
}

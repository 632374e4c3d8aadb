//! OCM's hub admission webhooks, as the cluster manager installs them (open-cluster-
//! management-io/ocm at 00f84c3): who may accept a ManagedCluster, put it into a
//! ManagedClusterSet, or bind a set to a namespace. Without them the test bed would let
//! any identity do what a real hub refuses.
//!
//! - ManagedCluster (`pkg/registration/webhook/v1/managedcluster_validating.go`;
//!   registered by `manifests/cluster-manager/hub/registration/webhook-validatingconfiguration.yaml`):
//!   the name must be a namespace name; client config URLs must be https; setting
//!   `hubAcceptsClient` (on create, or changing it to true on update) needs `update` on
//!   `register.open-cluster-management.io` `managedclusters/accept` for that cluster, and
//!   is refused while the cluster's namespace terminates; adding, changing or removing the
//!   clusterset label needs `create` on `managedclustersets/join` for the old and the
//!   new set.
//! - ManagedCluster, mutating (`pkg/registration/webhook/v1/managedcluster_mutating.go`;
//!   `manifests/cluster-manager/hub/registration/webhook-mutatingconfiguration.yaml`):
//!   the taints' `timeAdded`, which only it sets ([`crate::ocm_taints::stamp`]), and the
//!   `default` clusterset label on a cluster without one (feature gate `DefaultClusterSet`,
//!   on by default in `open-cluster-management.io/api` `feature/feature.go`). It runs before
//!   the validating webhook, so joining `default` needs `join` on it too.
//! - ManagedClusterSetBinding (`pkg/registration/webhook/v1beta2/managedclustersetbinding_validating.go`):
//!   its name must equal `spec.clusterSet`; creating one needs `create` on
//!   `managedclustersets/bind` for that set.

use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use kube::api::DynamicObject;
use kube::core::admission::{AdmissionRequest, Operation};
use serde_json::Value;

use crate::admission::{AdmissionError, AdmissionServer, Endpoint, JsonPatch, Mutator, Registration, Validator, Webhook, diff, user_may};

/// The clusterset label (open-cluster-management-io/api `cluster/v1beta2`, `ClusterSetLabel`).
const CLUSTERSET_LABEL: &str = ferry_kube::vocab::ocm::CLUSTERSET_LABEL;

/// The ManagedCluster webhook's registration, as upstream's manifest has it.
pub const MANAGED_CLUSTER: Registration = Registration {
    name: "managedclustervalidators.admission.cluster.open-cluster-management.io",
    groups: &["cluster.open-cluster-management.io"],
    versions: &["*"],
    resources: &["managedclusters"],
    operations: &["CREATE", "UPDATE"],
    namespace_selector: None,
    object_selector: None,
};

/// The ManagedCluster mutating webhook's registration, as upstream's manifest has it: the
/// validating one's rules under its own name.
pub const MANAGED_CLUSTER_MUTATOR: Registration = Registration { name: "managedclustermutators.admission.cluster.open-cluster-management.io", ..MANAGED_CLUSTER };

/// The set a cluster without a clusterset label is put into (`defaultClusterSetName`).
pub const DEFAULT_SET: &str = ferry_kube::vocab::ocm::DEFAULT_CLUSTER_SET;

/// The ManagedClusterSetBinding webhook's registration, as upstream's manifest has it.
pub const CLUSTER_SET_BINDING: Registration = Registration {
    name: "managedclustersetbindingvalidators.admission.cluster.open-cluster-management.io",
    groups: &["cluster.open-cluster-management.io"],
    versions: &["v1beta2"],
    resources: &["managedclustersetbindings"],
    operations: &["CREATE", "UPDATE"],
    namespace_selector: None,
    object_selector: None,
};

/// Both OCM webhooks, deciding with SubjectAccessReviews on the hub `hub` reaches.
pub fn validators(hub: kube::Client) -> Vec<(Registration, Arc<dyn Validator>)> {
    vec![(MANAGED_CLUSTER, Arc::new(ManagedClusterWebhook { hub: hub.clone() })), (CLUSTER_SET_BINDING, Arc::new(BindingWebhook { hub }))]
}

/// Serves OCM's hub webhooks (both validators and the ManagedCluster mutator, deciding
/// with SubjectAccessReviews on the hub `hub` reaches) and registers them there, as the
/// cluster manager does. Dropping the server stops them (the hub then refuses the writes
/// they cover: `failurePolicy: Fail`).
pub async fn serve(hub: &kube::Client) -> Result<AdmissionServer, AdmissionError> {
    let mut webhooks: Vec<Webhook> = validators(hub.clone()).into_iter().map(|(r, v)| Webhook::validating(r, v)).collect();
    webhooks.push(Webhook::mutating(MANAGED_CLUSTER_MUTATOR, Arc::new(ManagedClusterMutator)));
    let endpoints: Vec<Endpoint> = webhooks.iter().map(|w| w.endpoint.clone()).collect();
    let server = AdmissionServer::serve(webhooks).await?;
    for e in &endpoints {
        server.register_endpoint(hub, e).await?;
    }
    Ok(server)
}

/// `managedcluster_mutating.go`, `Default`: the taints stamped, then the default set.
struct ManagedClusterMutator;

/// The ManagedCluster `new` (`old` before an update) as the mutating webhook leaves it at
/// `now`, or its refusal.
pub fn mutate_managed_cluster(new: &Value, old: Option<&Value>, now: &str) -> Result<Value, String> {
    let mut after = new.clone();
    if let Some(taints) = crate::ocm_taints::stamp(new, old, now)? {
        after["spec"]["taints"] = Value::Array(taints);
    }
    // addDefaultClusterSetLabel: a missing or empty label becomes `default`.
    let labels = &mut after["metadata"]["labels"];
    if labels.get(CLUSTERSET_LABEL).and_then(Value::as_str).is_none_or(str::is_empty) {
        labels[CLUSTERSET_LABEL] = Value::from(DEFAULT_SET);
    }
    Ok(after)
}

impl Mutator for ManagedClusterMutator {
    fn mutate<'a>(&'a self, req: &'a AdmissionRequest<DynamicObject>) -> BoxFuture<'a, Result<JsonPatch, String>> {
        async move {
            let Some(obj) = req.object.as_ref() else { return Ok(JsonPatch(Vec::new())) };
            let before = serde_json::to_value(obj).map_err(|e| format!("decoding the ManagedCluster: {e}"))?;
            let old = req.old_object.as_ref().map(serde_json::to_value).transpose().map_err(|e| format!("decoding the old ManagedCluster: {e}"))?;
            let after = mutate_managed_cluster(&before, old.as_ref(), &crate::emulate::now())?;
            Ok(diff(&before, &after))
        }
        .boxed()
    }
}

struct ManagedClusterWebhook {
    hub: kube::Client,
}

fn data(o: Option<&DynamicObject>) -> Value {
    o.map(|o| o.data.clone()).unwrap_or(Value::Null)
}

fn set_label(o: Option<&DynamicObject>) -> String {
    o.and_then(|o| o.metadata.labels.as_ref()).and_then(|l| l.get(CLUSTERSET_LABEL)).cloned().unwrap_or_default()
}

/// Apimachinery's `ValidateNamespaceName`: a DNS-1123 label.
fn namespace_name_problem(name: &str) -> Option<String> {
    (!ferry_kube::names::is_dns1123_label(name)).then(|| format!("metadata.name format is not correct: {name:?} is not a valid namespace name (a DNS-1123 label)"))
}

impl ManagedClusterWebhook {
    async fn check(&self, req: &AdmissionRequest<DynamicObject>) -> Result<(), String> {
        let Some(new) = req.object.as_ref() else { return Ok(()) };
        let name = new.metadata.name.clone().unwrap_or_default();
        let mut problems: Vec<String> = namespace_name_problem(&name).into_iter().collect();
        let spec = &data(Some(new))["spec"];
        for cfg in spec["managedClusterClientConfigs"].as_array().into_iter().flatten() {
            let url = cfg["url"].as_str().unwrap_or_default();
            if !url.starts_with("https://") || url.len() <= "https://".len() {
                problems.push(format!("url {url:?} is invalid in client configs"));
            }
        }
        if !problems.is_empty() {
            return Err(problems.join("\n"));
        }
        let accepts = spec["hubAcceptsClient"].as_bool().unwrap_or(false);
        let accepted_before = data(req.old_object.as_ref())["spec"]["hubAcceptsClient"].as_bool().unwrap_or(false);
        let accepting = match req.operation {
            Operation::Create => accepts,
            _ => accepts && !accepted_before,
        };
        if accepting {
            self.namespace_not_terminating(&name).await?;
            if !user_may(&self.hub, req, "register.open-cluster-management.io", "managedclusters", "accept", "update", &name).await? {
                return Err(format!("managedclusters.cluster.open-cluster-management.io/accept {name:?} is forbidden: user {:?} cannot update the HubAcceptsClient field", req.user_info.username.clone().unwrap_or_default()));
            }
        }
        let (old_set, new_set) = (set_label(req.old_object.as_ref()), set_label(Some(new)));
        if old_set != new_set {
            for set in [old_set, new_set].into_iter().filter(|s| !s.is_empty()) {
                if !user_may(&self.hub, req, "cluster.open-cluster-management.io", "managedclustersets", "join", "create", &set).await? {
                    return Err(format!(
                        "managedclustersets.cluster.open-cluster-management.io/join {set:?} is forbidden: user {:?} cannot add/remove a ManagedCluster to/from ManagedClusterSet {set:?}",
                        req.user_info.username.clone().unwrap_or_default()
                    ));
                }
            }
        }
        Ok(())
    }

    /// Upstream refuses to accept a cluster whose namespace is being deleted.
    async fn namespace_not_terminating(&self, name: &str) -> Result<(), String> {
        use k8s_openapi::api::core::v1::Namespace;
        let ns = kube::Api::<Namespace>::all(self.hub.clone()).get_opt(name).await.map_err(|e| e.to_string())?;
        match ns.and_then(|n| n.status).and_then(|s| s.phase) {
            Some(p) if p == "Terminating" => Err(format!("managedclusters.cluster.open-cluster-management.io/accept {name:?} is forbidden: cluster namespace {name:?} is terminating")),
            _ => Ok(()),
        }
    }
}

impl Validator for ManagedClusterWebhook {
    fn validate<'a>(&'a self, req: &'a AdmissionRequest<DynamicObject>) -> BoxFuture<'a, Result<(), String>> {
        self.check(req).boxed()
    }
}

struct BindingWebhook {
    hub: kube::Client,
}

impl BindingWebhook {
    async fn check(&self, req: &AdmissionRequest<DynamicObject>) -> Result<(), String> {
        let Some(new) = req.object.as_ref() else { return Ok(()) };
        let name = new.metadata.name.clone().unwrap_or_default();
        let set = data(Some(new))["spec"]["clusterSet"].as_str().unwrap_or_default().to_owned();
        if name != set {
            return Err("The ManagedClusterSetBinding must have the same name as the target ManagedClusterSet".into());
        }
        if req.operation == Operation::Create && !user_may(&self.hub, req, "cluster.open-cluster-management.io", "managedclustersets", "bind", "create", &set).await? {
            return Err(format!(
                "managedclustersets.cluster.open-cluster-management.io/bind {set:?} is forbidden: user {:?} is not allowed to bind cluster set {set:?}",
                req.user_info.username.clone().unwrap_or_default()
            ));
        }
        Ok(())
    }
}

impl Validator for BindingWebhook {
    fn validate<'a>(&'a self, req: &'a AdmissionRequest<DynamicObject>) -> BoxFuture<'a, Result<(), String>> {
        self.check(req).boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_cluster_without_a_set_is_put_into_default_and_its_taints_stamped() {
        let made = mutate_managed_cluster(&json!({"metadata": {"name": "c"}, "spec": {"taints": [{"key": "k", "effect": "NoSelect"}]}}), None, "NOW").unwrap();
        assert_eq!(made["metadata"]["labels"][CLUSTERSET_LABEL], DEFAULT_SET);
        assert_eq!(made["spec"]["taints"][0]["timeAdded"], "NOW");
        let empty = mutate_managed_cluster(&json!({"metadata": {"labels": {CLUSTERSET_LABEL: "", "x": "y"}}}), None, "NOW").unwrap();
        assert_eq!(empty["metadata"]["labels"], json!({CLUSTERSET_LABEL: DEFAULT_SET, "x": "y"}));
        let chosen = json!({"metadata": {"labels": {CLUSTERSET_LABEL: "blue"}}});
        assert_eq!(mutate_managed_cluster(&chosen, None, "NOW").unwrap(), chosen);
        let forged = json!({"spec": {"taints": [{"key": "k", "effect": "NoSelect", "timeAdded": "2026-01-01T00:00:00Z"}]}});
        assert!(mutate_managed_cluster(&forged, Some(&json!({})), "NOW").is_err());
    }
}

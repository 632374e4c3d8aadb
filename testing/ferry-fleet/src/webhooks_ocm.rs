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
//! - ManagedClusterSetBinding (`pkg/registration/webhook/v1beta2/managedclustersetbinding_validating.go`):
//!   its name must equal `spec.clusterSet`; creating one needs `create` on
//!   `managedclustersets/bind` for that set.

use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use kube::api::DynamicObject;
use kube::core::admission::{AdmissionRequest, Operation};
use serde_json::Value;

use crate::admission::{Registration, Validator, user_may};

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

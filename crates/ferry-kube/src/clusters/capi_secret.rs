//! Which `<cluster>-kubeconfig` Secrets are Cluster API's, as upstream writes them
//! (kubernetes-sigs/cluster-api `ae7ff047`):
//!
//! - `util/kubeconfig/kubeconfig.go` `GenerateSecretWithOwner` (through `CreateSecret`,
//!   `CreateSecretWithOwner`, `GenerateSecret`): name `<cluster>-kubeconfig` in the
//!   Cluster's namespace, label `cluster.x-k8s.io/cluster-name: <cluster>`, type
//!   `cluster.x-k8s.io/secret` (`ClusterSecretType`, `api/core/v1beta2/common_types.go`),
//!   key `value`, and exactly the one owner reference it is given.
//! - `core/reconcilers/cluster/cluster_controller_phases.go` `reconcileKubeconfig` (the
//!   brief's `internal/controllers/cluster/`, moved there upstream): a Cluster without a
//!   `controlPlaneRef` gets it from the core controller, owned by the Cluster itself
//!   (`CreateSecret`: apiVersion `cluster.x-k8s.io/<version>`, kind `Cluster`, its name and
//!   uid; no `controller` flag).
//! - `controlplane/kubeadm/reconcilers/kubeadmcontrolplane/helpers.go` (the brief's
//!   `controlplane/kubeadm/internal/controllers/`) `reconcileKubeconfig`: with a control
//!   plane, the provider makes it, owned by a controller reference to its control plane
//!   (`metav1.NewControllerRef(kcp, ...)`: `controller: true`); `adoptKubeconfigSecret`
//!   makes the control plane the controller of a Cluster-made one, and calls a Secret of
//!   another type "provided by the user". Other control plane providers do the same in the
//!   same group: k3s-io/cluster-api-k3s `7ed944f`
//!   `controlplane/controllers/kthreescontrolplane_controller.go` (`CreateSecretWithOwner`
//!   with a controller reference to the KThreesControlPlane, group
//!   `controlplane.cluster.x-k8s.io`).
//!
//! So a Secret is used only with the label naming the cluster, that type, and an owner
//! reference either to the Cluster `cluster.x-k8s.io` `Cluster` of that name or, as
//! controller, to an object of group `controlplane.cluster.x-k8s.io` (any kind: KCP, k3s,
//! ...; its name is the provider's, often `<cluster>-control-plane`). A user-provided
//! kubeconfig Secret (upstream allows one) is refused. These rules tell Cluster API's
//! Secrets from others'; the boundary against someone who may write Secrets is the
//! namespace list ([`super::NAMESPACES_ENV`]) and the chart's Roles there: whoever can write
//! in those namespaces can write all of this too.

use std::fmt;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::CLUSTER_NAME_LABEL;

/// The type Cluster API gives its Secrets (`ClusterSecretType`).
pub const SECRET_TYPE: &str = "cluster.x-k8s.io/secret";
/// The group of the `Cluster` kind.
pub const CLUSTER_GROUP: &str = "cluster.x-k8s.io";
/// The group of every control plane provider's kinds.
pub const CONTROL_PLANE_GROUP: &str = "controlplane.cluster.x-k8s.io";

/// A rule a kubeconfig Secret must keep to be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Label `cluster.x-k8s.io/cluster-name` names the cluster.
    Label,
    /// Type `cluster.x-k8s.io/secret`.
    Type,
    /// Owned by the cluster's `Cluster`, or controlled by a control plane.
    Owner,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Label => "label",
            Self::Type => "type",
            Self::Owner => "owner",
        })
    }
}

fn group_of(api_version: &str) -> &str {
    api_version.split_once('/').map_or("", |(g, _)| g)
}

/// The owner reference Cluster API's core controller gives the Secret: the Cluster itself.
fn is_cluster(cluster: &str, o: &OwnerReference) -> bool {
    group_of(&o.api_version) == CLUSTER_GROUP && o.kind == "Cluster" && o.name == cluster
}

/// The owner reference a control plane provider gives it: a controller reference.
fn is_control_plane(o: &OwnerReference) -> bool {
    group_of(&o.api_version) == CONTROL_PLANE_GROUP && o.controller == Some(true)
}

/// Ok when `secret` is shaped as Cluster API makes `cluster`'s kubeconfig Secret; else the
/// first rule it breaks and how (names, type and owners only: its data is never read here).
pub fn check(cluster: &str, secret: &Secret) -> Result<(), (Rule, String)> {
    let label = secret.metadata.labels.as_ref().and_then(|l| l.get(CLUSTER_NAME_LABEL));
    if label.map(String::as_str) != Some(cluster) {
        let has = label.map_or_else(|| "absent".to_owned(), |l| format!("{l:?}"));
        return Err((Rule::Label, format!("label {CLUSTER_NAME_LABEL} is {has}, not {cluster:?}")));
    }
    // The API server stores a Secret without a type as Opaque.
    let type_ = secret.type_.as_deref().unwrap_or("Opaque");
    if type_ != SECRET_TYPE {
        return Err((Rule::Type, format!("type is {type_:?}, not {SECRET_TYPE:?}")));
    }
    let owners = secret.metadata.owner_references.as_deref().unwrap_or_default();
    if !owners.iter().any(|o| is_cluster(cluster, o) || is_control_plane(o)) {
        let had: Vec<String> = owners.iter().map(|o| format!("{} {}/{}{}", o.api_version, o.kind, o.name, if o.controller == Some(true) { " (controller)" } else { "" })).collect();
        return Err((
            Rule::Owner,
            format!(
                "no owner reference to {CLUSTER_GROUP} Cluster {cluster:?} nor a controller reference to a {CONTROL_PLANE_GROUP} control plane (owners: {})",
                if had.is_empty() { "none".to_owned() } else { had.join(", ") }
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn secret(labels: Value, type_: Option<&str>, owners: Value) -> Secret {
        let mut s = json!({"metadata": {"name": "c1-kubeconfig", "namespace": "fleet", "labels": labels, "ownerReferences": owners}, "data": {"value": "eA=="}});
        if let Some(t) = type_ {
            s["type"] = json!(t);
        }
        serde_json::from_value(s).unwrap()
    }

    fn owner(api_version: &str, kind: &str, name: &str, controller: Option<bool>) -> Value {
        let mut o = json!({"apiVersion": api_version, "kind": kind, "name": name, "uid": "0b8c7a3e-1111-2222-3333-444455556666"});
        if let Some(c) = controller {
            o["controller"] = json!(c);
        }
        o
    }

    fn rule(s: &Secret) -> Option<Rule> {
        check("c1", s).err().map(|(r, _)| r)
    }

    #[test]
    fn upstream_shapes_are_accepted() {
        let label = json!({CLUSTER_NAME_LABEL: "c1"});
        // The core controller's (GenerateSecret: the Cluster, no controller flag), v1beta1 or v1beta2.
        for v in ["cluster.x-k8s.io/v1beta2", "cluster.x-k8s.io/v1beta1"] {
            assert_eq!(check("c1", &secret(label.clone(), Some(SECRET_TYPE), json!([owner(v, "Cluster", "c1", None)]))), Ok(()));
        }
        // KubeadmControlPlane's and k3s's (a controller reference), also once adopted beside the Cluster's.
        let kcp = owner("controlplane.cluster.x-k8s.io/v1beta2", "KubeadmControlPlane", "c1-control-plane", Some(true));
        assert_eq!(check("c1", &secret(label.clone(), Some(SECRET_TYPE), json!([kcp]))), Ok(()));
        let k3s = owner("controlplane.cluster.x-k8s.io/v1beta2", "KThreesControlPlane", "c1", Some(true));
        assert_eq!(check("c1", &secret(label.clone(), Some(SECRET_TYPE), json!([owner("cluster.x-k8s.io/v1beta2", "Cluster", "c1", None), k3s]))), Ok(()));
    }

    #[test]
    fn each_rule_is_named() {
        let label = json!({CLUSTER_NAME_LABEL: "c1"});
        let cluster = json!([owner("cluster.x-k8s.io/v1beta2", "Cluster", "c1", None)]);
        assert_eq!(rule(&secret(json!({}), Some(SECRET_TYPE), cluster.clone())), Some(Rule::Label));
        assert_eq!(rule(&secret(json!({CLUSTER_NAME_LABEL: "c2"}), Some(SECRET_TYPE), cluster.clone())), Some(Rule::Label));
        assert_eq!(rule(&secret(label.clone(), None, cluster.clone())), Some(Rule::Type), "no type is Opaque");
        assert_eq!(rule(&secret(label.clone(), Some("Opaque"), cluster.clone())), Some(Rule::Type));
        let (r, why) = check("c1", &secret(label.clone(), Some(SECRET_TYPE), json!([]))).unwrap_err();
        assert_eq!((r, why.contains("owners: none")), (Rule::Owner, true), "{why}");
        // Another cluster's Cluster, a Cluster of another group, a control plane that is not
        // the controller, a controller of another group: none is Cluster API's making.
        for o in [
            owner("cluster.x-k8s.io/v1beta2", "Cluster", "c2", None),
            owner("example.com/v1", "Cluster", "c1", None),
            owner("cluster.x-k8s.io/v1beta2", "Machine", "c1", Some(true)),
            owner("controlplane.cluster.x-k8s.io/v1beta2", "KubeadmControlPlane", "c1", None),
            owner("controlplane.cluster.x-k8s.io/v1beta2", "KubeadmControlPlane", "c1", Some(false)),
            owner("controlplane.example.com/v1", "KubeadmControlPlane", "c1", Some(true)),
            owner("v1", "ConfigMap", "c1", Some(true)),
        ] {
            assert_eq!(rule(&secret(label.clone(), Some(SECRET_TYPE), json!([o.clone()]))), Some(Rule::Owner), "{o}");
        }
    }
}

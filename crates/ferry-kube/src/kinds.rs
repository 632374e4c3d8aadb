//! Typed handles of the Cluster API, OCM and Liqo kinds Ferry watches, with `spec` and
//! `status` kept as JSON: enough for [`crate::Watches`] (which needs a static type) without
//! generating Rust types for whole upstream CRDs. Fields are read with JSON pointers.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

/// Declares a JSON-bodied resource type:
/// `resource!(RustName, "Kind", "group", "version", "plural", Namespaced|Cluster)`.
#[macro_export]
macro_rules! resource {
    ($(#[$doc:meta])* $name:ident, $kind:literal, $group:literal, $version:literal, $plural:literal, $scope:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
        pub struct $name {
            /// Standard object metadata.
            pub metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
            /// The spec, as JSON.
            #[serde(default)]
            pub spec: serde_json::Value,
            /// The status, as JSON.
            #[serde(default)]
            pub status: serde_json::Value,
        }

        impl kube::Resource for $name {
            type DynamicType = ();
            type Scope = $crate::kinds::scope!($scope);
            fn kind(_: &()) -> std::borrow::Cow<'_, str> { $kind.into() }
            fn group(_: &()) -> std::borrow::Cow<'_, str> { $group.into() }
            fn version(_: &()) -> std::borrow::Cow<'_, str> { $version.into() }
            fn plural(_: &()) -> std::borrow::Cow<'_, str> { $plural.into() }
            fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta { &self.metadata }
            fn meta_mut(&mut self) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta { &mut self.metadata }
        }

        impl $name {
            /// `status` at a JSON pointer (e.g. `/conditions`).
            pub fn status_at(&self, pointer: &str) -> Option<&serde_json::Value> {
                self.status.pointer(pointer)
            }

            /// The status of condition `type_` ("True", "False", "Unknown"), if present.
            pub fn condition(&self, type_: &str) -> Option<&str> {
                $crate::kinds::condition(&self.status, type_)
            }
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __scope {
    (Namespaced) => { k8s_openapi::NamespaceResourceScope };
    (Cluster) => { k8s_openapi::ClusterResourceScope };
}
#[doc(hidden)]
pub use __scope as scope;

/// What a namespace being deleted still waits for, as the namespace controller says it
/// (its `NamespaceContentRemaining` and `NamespaceFinalizersRemaining` conditions name the
/// kinds and finalizers left); `still exists` while it is not being deleted.
pub fn namespace_terminating(ns: &k8s_openapi::api::core::v1::Namespace) -> String {
    let left: Vec<String> = ns
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.status == "True" && matches!(c.type_.as_str(), "NamespaceContentRemaining" | "NamespaceFinalizersRemaining"))
        .filter_map(|c| c.message.clone())
        .collect();
    match (ns.metadata.deletion_timestamp.is_some(), left.is_empty()) {
        (false, _) => "still exists".to_owned(),
        (true, true) => "terminating".to_owned(),
        (true, false) => format!("terminating: {}", left.join("; ")),
    }
}

/// True when the Node reports `Ready=True`.
pub fn node_ready(n: &k8s_openapi::api::core::v1::Node) -> bool {
    n.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

impl ManagedCluster {
    /// Whether the hub accepted the cluster: then its namespace on the hub exists
    /// ([`crate::vocab::ocm::CONDITION_HUB_ACCEPTED`]).
    pub fn accepted(&self) -> bool {
        self.condition(crate::vocab::ocm::CONDITION_HUB_ACCEPTED) == Some("True")
    }

    /// Why no Placement selects the cluster yet although it may be joined: not Available,
    /// or Available with an availability taint the hub has not taken off yet
    /// ([`crate::vocab::ocm::AVAILABILITY_TAINTS`]). `None` once it is placeable.
    pub fn not_placeable(&self) -> Option<String> {
        if self.condition(crate::vocab::ocm::CONDITION_AVAILABLE) != Some("True") {
            return Some(condition_message(&self.status, crate::vocab::ocm::CONDITION_AVAILABLE).unwrap_or_else(|| "not joined yet".into()));
        }
        let taints = self.spec["taints"].as_array().into_iter().flatten();
        taints
            .filter_map(|t| t["key"].as_str())
            .find(|k| crate::vocab::ocm::AVAILABILITY_TAINTS.contains(k))
            .map(|k| format!("Available; the hub has not taken its taint {k} off yet"))
    }
}

/// The `status` of condition `type_` in `status.conditions`.
pub fn condition<'a>(status: &'a Value, type_: &str) -> Option<&'a str> {
    status.get("conditions")?.as_array()?.iter().find(|c| c.get("type").and_then(Value::as_str) == Some(type_))?.get("status")?.as_str()
}

/// The `message` (or reason) of condition `type_`, for error texts.
pub fn condition_message(status: &Value, type_: &str) -> Option<String> {
    let c = status.get("conditions")?.as_array()?.iter().find(|c| c.get("type").and_then(Value::as_str) == Some(type_))?;
    let s = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or("");
    Some(format!("{}={} {} {}", type_, s("status"), s("reason"), s("message")).trim().to_owned())
}

resource!(
    /// OCM ManagedCluster (hub, cluster-scoped).
    ManagedCluster, "ManagedCluster", "cluster.open-cluster-management.io", "v1", "managedclusters", Cluster
);
resource!(
    /// OCM ManagedClusterSet (hub, cluster-scoped): which ManagedClusters it holds, by its
    /// label or a label selector (`open-cluster-management-io/api`
    /// `cluster/v1beta2/types_managedclusterset.go`).
    ManagedClusterSet, "ManagedClusterSet", "cluster.open-cluster-management.io", "v1beta2", "managedclustersets", Cluster
);
resource!(
    /// OCM ManifestWork (hub, in the cluster's namespace).
    ManifestWork, "ManifestWork", "work.open-cluster-management.io", "v1", "manifestworks", Namespaced
);
resource!(
    /// OCM Placement.
    Placement, "Placement", "cluster.open-cluster-management.io", "v1beta1", "placements", Namespaced
);
resource!(
    /// OCM PlacementDecision.
    PlacementDecision, "PlacementDecision", "cluster.open-cluster-management.io", "v1beta1", "placementdecisions", Namespaced
);
resource!(
    /// OCM AddOnPlacementScore (hub, in the cluster's namespace).
    AddOnPlacementScore, "AddOnPlacementScore", "cluster.open-cluster-management.io", "v1alpha1", "addonplacementscores", Namespaced
);
resource!(
    /// OCM ManagedClusterAddOn (hub, in the cluster's namespace).
    ManagedClusterAddOn, "ManagedClusterAddOn", "addon.open-cluster-management.io", "v1alpha1", "managedclusteraddons", Namespaced
);
resource!(
    /// Cluster API Cluster.
    CapiCluster, "Cluster", "cluster.x-k8s.io", "v1beta2", "clusters", Namespaced
);
resource!(
    /// Cluster API Machine (`status.nodeRef` names its Node in the workload cluster).
    CapiMachine, "Machine", "cluster.x-k8s.io", "v1beta2", "machines", Namespaced
);

/// The values of a ManifestWork's status feedback (`resourceStatus.manifests[]`), as
/// (name, text), for the manifests `which` accepts (it sees each `resourceMeta`).
pub fn feedback_values(work: &ManifestWork, which: impl Fn(&Value) -> bool) -> Vec<(String, String)> {
    let Some(manifests) = work.status_at("/resourceStatus/manifests").and_then(Value::as_array) else { return Vec::new() };
    manifests
        .iter()
        .filter(|m| which(&m["resourceMeta"]))
        .filter_map(|m| m.pointer("/statusFeedback/values")?.as_array())
        .flatten()
        .filter_map(|v| Some((v.get("name")?.as_str()?.to_owned(), feedback_text(v.get("fieldValue")?)?)))
        .collect()
}

/// A feedback `fieldValue` (Integer, String, Boolean or JsonRaw) as text.
pub fn feedback_text(f: &Value) -> Option<String> {
    match f.get("type")?.as_str()? {
        "Integer" => f.get("integer").map(|i| i.to_string()),
        "String" => f.get("string")?.as_str().map(str::to_owned),
        "Boolean" => f.get("boolean").map(|b| b.to_string()),
        _ => f.get("jsonRaw")?.as_str().map(str::to_owned),
    }
}

/// Metadata with a name and optional namespace (for building objects).
pub fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta { name: Some(name.to_owned()), namespace: namespace.map(str::to_owned), ..ObjectMeta::default() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_terminating_namespace_says_what_is_left_in_it() {
        let ns = |v: Value| serde_json::from_value::<k8s_openapi::api::core::v1::Namespace>(v).unwrap();
        assert_eq!(namespace_terminating(&ns(serde_json::json!({"metadata": {"name": "a"}}))), "still exists");
        let deleting = serde_json::json!({"name": "a", "deletionTimestamp": "2026-11-30T12:00:00Z"});
        assert_eq!(namespace_terminating(&ns(serde_json::json!({"metadata": deleting}))), "terminating");
        let status = serde_json::json!({"phase": "Terminating", "conditions": [
            {"type": "NamespaceDeletionDiscoveryFailure", "status": "False", "message": "All resources successfully discovered"},
            {"type": "NamespaceContentRemaining", "status": "True", "message": "Some resources are remaining: configmaps. has 1 resource instances"},
            {"type": "NamespaceFinalizersRemaining", "status": "True", "message": "Some content in the namespace has finalizers remaining: ferry.test/hold in 1 resource instances"},
        ]});
        assert_eq!(
            namespace_terminating(&ns(serde_json::json!({"metadata": deleting, "status": status}))),
            "terminating: Some resources are remaining: configmaps. has 1 resource instances; Some content in the namespace has finalizers remaining: ferry.test/hold in 1 resource instances"
        );
    }
}

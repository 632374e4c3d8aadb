//! The OCM objects of a Submariner peering (on the hub): the ManagedClusterSet the pair
//! joins, a SubmarinerConfig and the submariner ManagedClusterAddOn in each cluster's
//! namespace. Everything carries [`PEERING_LABEL`]. Pure.

use serde_json::{Value, json};

use crate::liqo::PEERING_LABEL;

pub use ferry_kube::vocab::ocm::CLUSTERSET_LABEL;

/// The ManagedClusterSet `name` (membership by the exclusive cluster-set label).
pub fn cluster_set(name: &str, pair: &str) -> Value {
    json!({"apiVersion": "cluster.open-cluster-management.io/v1beta2", "kind": "ManagedClusterSet",
        "metadata": {"name": name, "labels": {PEERING_LABEL: pair, "app.kubernetes.io/managed-by": "ferry"}},
        "spec": {"clusterSelector": {"selectorType": "ExclusiveClusterSetLabel"}}})
}

/// The SubmarinerConfig of `cluster` (IPsec with NAT traversal, one gateway).
pub fn config(cluster: &str, pair: &str) -> Value {
    json!({"apiVersion": "submarineraddon.open-cluster-management.io/v1alpha1", "kind": "SubmarinerConfig",
        "metadata": {"name": "submariner", "namespace": cluster, "labels": {PEERING_LABEL: pair, "app.kubernetes.io/managed-by": "ferry"}},
        "spec": {"cableDriver": "libreswan", "IPSecNATTPort": 4500, "NATTEnable": true, "gatewayConfig": {"gateways": 1}}})
}

/// The submariner ManagedClusterAddOn of `cluster`.
pub fn addon(cluster: &str, pair: &str) -> Value {
    json!({"apiVersion": "addon.open-cluster-management.io/v1alpha1", "kind": "ManagedClusterAddOn",
        "metadata": {"name": "submariner", "namespace": cluster, "labels": {PEERING_LABEL: pair, "app.kubernetes.io/managed-by": "ferry"}},
        "spec": {"installNamespace": "submariner-operator"}})
}

//! The project's own CRD subset for the simulated fleet: the kinds Ferry's workers and the
//! emulated controllers touch, as minimal CRDs (our own text: names, scope, storage
//! version and a status subresource, with open schemas). The real schemas are the
//! upstream CRDs in ../shared/crds; a test checks every name here against them.

use serde_json::{Value, json};

/// One kind: group, storage version, kind, plural, namespaced, has a status subresource.
pub type Kind = (&'static str, &'static str, &'static str, &'static str, bool, bool);

/// Every kind of the subset.
pub const KINDS: &[Kind] = &[
    // Cluster API (core, kubeadm, Docker and OpenStack providers).
    ("cluster.x-k8s.io", "v1beta2", "Cluster", "clusters", true, true),
    ("cluster.x-k8s.io", "v1beta2", "ClusterClass", "clusterclasses", true, true),
    ("cluster.x-k8s.io", "v1beta2", "MachineDeployment", "machinedeployments", true, true),
    ("cluster.x-k8s.io", "v1beta2", "Machine", "machines", true, true),
    ("addons.cluster.x-k8s.io", "v1beta2", "ClusterResourceSet", "clusterresourcesets", true, true),
    ("controlplane.cluster.x-k8s.io", "v1beta2", "KubeadmControlPlane", "kubeadmcontrolplanes", true, true),
    ("bootstrap.cluster.x-k8s.io", "v1beta2", "KubeadmConfigTemplate", "kubeadmconfigtemplates", true, false),
    ("infrastructure.cluster.x-k8s.io", "v1beta2", "DockerCluster", "dockerclusters", true, true),
    ("infrastructure.cluster.x-k8s.io", "v1beta2", "DockerMachineTemplate", "dockermachinetemplates", true, true),
    ("infrastructure.cluster.x-k8s.io", "v1beta2", "OpenStackCluster", "openstackclusters", true, true),
    ("infrastructure.cluster.x-k8s.io", "v1beta2", "OpenStackMachineTemplate", "openstackmachinetemplates", true, true),
    // Open Cluster Management.
    ("cluster.open-cluster-management.io", "v1", "ManagedCluster", "managedclusters", false, true),
    ("cluster.open-cluster-management.io", "v1beta2", "ManagedClusterSet", "managedclustersets", false, true),
    ("cluster.open-cluster-management.io", "v1beta2", "ManagedClusterSetBinding", "managedclustersetbindings", true, true),
    ("cluster.open-cluster-management.io", "v1beta1", "Placement", "placements", true, true),
    ("cluster.open-cluster-management.io", "v1beta1", "PlacementDecision", "placementdecisions", true, true),
    ("cluster.open-cluster-management.io", "v1alpha1", "AddOnPlacementScore", "addonplacementscores", true, true),
    ("work.open-cluster-management.io", "v1", "ManifestWork", "manifestworks", true, true),
    ("addon.open-cluster-management.io", "v1alpha1", "ManagedClusterAddOn", "managedclusteraddons", true, true),
    ("addon.open-cluster-management.io", "v1alpha1", "ClusterManagementAddOn", "clustermanagementaddons", false, true),
    ("submarineraddon.open-cluster-management.io", "v1alpha1", "SubmarinerConfig", "submarinerconfigs", true, true),
    // Liqo peering and offloading.
    ("core.liqo.io", "v1beta1", "ForeignCluster", "foreignclusters", false, true),
    ("authentication.liqo.io", "v1beta1", "Tenant", "tenants", true, true),
    ("authentication.liqo.io", "v1beta1", "Identity", "identities", true, true),
    ("authentication.liqo.io", "v1beta1", "ResourceSlice", "resourceslices", true, true),
    ("networking.liqo.io", "v1beta1", "Configuration", "configurations", true, true),
    ("networking.liqo.io", "v1beta1", "GatewayServer", "gatewayservers", true, true),
    ("networking.liqo.io", "v1beta1", "GatewayClient", "gatewayclients", true, true),
    ("networking.liqo.io", "v1beta1", "PublicKey", "publickeies", true, false),
    ("networking.liqo.io", "v1beta1", "Connection", "connections", true, true),
    ("ipam.liqo.io", "v1alpha1", "Network", "networks", true, true),
    ("offloading.liqo.io", "v1beta1", "VirtualNode", "virtualnodes", true, true),
    ("offloading.liqo.io", "v1beta1", "NamespaceMap", "namespacemaps", true, true),
    ("offloading.liqo.io", "v1beta1", "NamespaceOffloading", "namespaceoffloadings", true, true),
];

/// The CRD of one kind: open schemas for spec and status, status subresource if any.
pub fn crd(k: &Kind) -> Value {
    let (group, version, kind, plural, namespaced, status) = *k;
    let open = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    let mut v = json!({
        "name": version, "served": true, "storage": true,
        "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": open, "status": open}}},
    });
    if status {
        v["subresources"] = json!({"status": {}});
    }
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}"), "labels": {"ferry.dev/crd-subset": "true"}},
        "spec": {
            "group": group,
            "scope": if namespaced { "Namespaced" } else { "Cluster" },
            "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
            "versions": [v],
        },
    })
}

/// Every CRD of the subset.
pub fn crds() -> Vec<Value> {
    KINDS.iter().map(crd).collect()
}

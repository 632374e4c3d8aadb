//! Names the upstream projects define, in one place: the labels, namespaces and
//! well-known objects of Open Cluster Management and Liqo that more than one worker (or
//! the test bed) uses. A worker's own names stay in its crate.

/// Open Cluster Management (open-cluster-management-io/api, `cluster/v1beta2`).
pub mod ocm {
    /// The label that makes a ManagedCluster a member of a ManagedClusterSet
    /// (`cluster/v1beta2/types_managedclusterset.go`, `ClusterSetLabel`).
    pub const CLUSTERSET_LABEL: &str = "cluster.open-cluster-management.io/clusterset";
}

/// Liqo v1 (liqotech/liqo).
pub mod liqo {
    /// Label Liqo puts on per-remote objects (package `pkg/consts`, `RemoteClusterID`).
    pub const REMOTE_ID_LABEL: &str = "liqo.io/remote-cluster-id";
    /// The namespace Liqo is installed in (the chart's default).
    pub const LIQO_NAMESPACE: &str = "liqo";
    /// The ConfigMap with a cluster's id, key `CLUSTER_ID`.
    pub const CLUSTER_ID_CONFIGMAP: &str = "liqo-clusterid-configmap";
    /// Liqo's controller manager, whose readiness says Liqo runs.
    pub const CONTROLLER_MANAGER: &str = "liqo-controller-manager";

    /// The Liqo cluster id of the cluster `client` reaches (None: no id ConfigMap or key).
    pub async fn cluster_id(client: kube::Client) -> Result<Option<String>, kube::Error> {
        let cm = kube::Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client, LIQO_NAMESPACE).get_opt(CLUSTER_ID_CONFIGMAP).await?;
        Ok(cm.and_then(|c| c.data?.get("CLUSTER_ID").cloned()))
    }
}

//! Names the upstream projects define, in one place: the labels, namespaces and
//! well-known objects of Open Cluster Management and Liqo that more than one worker (or
//! the test bed) uses. A worker's own names stay in its crate.

/// Open Cluster Management (open-cluster-management-io/api, `cluster/v1beta2`).
pub mod ocm {
    /// The label that makes a ManagedCluster a member of a ManagedClusterSet
    /// (`cluster/v1beta2/types_managedclusterset.go`, `ClusterSetLabel`).
    pub const CLUSTERSET_LABEL: &str = "cluster.open-cluster-management.io/clusterset";
    /// The set the hub puts a cluster without a clusterset label into (its mutating webhook,
    /// feature gate `DefaultClusterSet`, on by default: ocm
    /// `pkg/registration/webhook/v1/managedcluster_mutating.go`, `defaultClusterSetName`).
    pub const DEFAULT_CLUSTER_SET: &str = "default";
    /// The taint the registration hub keeps on a cluster whose Available condition is
    /// missing or Unknown (`cluster/v1/types.go`, `ManagedClusterTaintUnreachable`;
    /// `pkg/registration/hub/taint/controller.go`).
    pub const TAINT_UNREACHABLE: &str = "cluster.open-cluster-management.io/unreachable";
    /// The taint it keeps while Available is False (`ManagedClusterTaintUnavailable`).
    pub const TAINT_UNAVAILABLE: &str = "cluster.open-cluster-management.io/unavailable";
    /// Both: no Placement without a toleration selects a cluster while one is there.
    pub const AVAILABILITY_TAINTS: [&str; 2] = [TAINT_UNREACHABLE, TAINT_UNAVAILABLE];
    /// A ManagedCluster's condition once the hub accepted it (`cluster/v1/types.go`,
    /// `ManagedClusterConditionHubAccepted`). The hub's ManagedCluster controller makes the
    /// cluster's namespace on the hub (where its ManifestWorks and AddOnPlacementScores
    /// live) only for an accepted cluster, and keeps it after the cluster is deleted (ocm
    /// `pkg/registration/hub/managedcluster/controller.go`, `sync`).
    pub const CONDITION_HUB_ACCEPTED: &str = "HubAcceptedManagedCluster";
    /// The condition its registration agent sets once it joined with its own identity
    /// (`ManagedClusterConditionJoined`; ocm `pkg/registration/spoke/managedcluster/joining_reconcile.go`).
    pub const CONDITION_JOINED: &str = "ManagedClusterJoined";
    /// The condition the agent keeps while the cluster's API server is healthy
    /// (`ManagedClusterConditionAvailable`).
    pub const CONDITION_AVAILABLE: &str = "ManagedClusterConditionAvailable";
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
    /// Label of a tenant namespace (`pkg/consts/core.go`, `TenantNamespaceLabel`); Liqo's
    /// Tenant webhook refuses a Tenant in a namespace without it.
    pub const TENANT_NAMESPACE_LABEL: &str = "liqo.io/tenant-namespace";
    /// The PodSecurity labels a tenant namespace carries, all `privileged`
    /// (`pkg/tenantNamespace/namespaceManager.go`, `ForgeNamespace`).
    pub const POD_SECURITY_LABELS: [&str; 3] =
        ["pod-security.kubernetes.io/audit", "pod-security.kubernetes.io/enforce", "pod-security.kubernetes.io/warn"];
    /// The namespace label (value `true`) Liqo's namespace offloading controller sets for
    /// the `LocalAndRemote` and `Remote` strategies; Liqo's pod webhook mutates only pods
    /// created in a namespace with it (`pkg/consts/namespace_mapping.go`,
    /// `SchedulingLiqoLabel`; `deployments/liqo/templates/webhooks/liqo-mutating-webhook.yaml`).
    pub const SCHEDULING_LABEL: &str = "liqo.io/scheduling-enabled";
    /// The virtual nodes' taint (`=true:NoExecute`), whose key is also that of the
    /// toleration Liqo's pod webhook adds (`pkg/consts/webhook.go`, `VirtualNodeTolerationKey`).
    pub const VIRTUAL_NODE_TOLERATION_KEY: &str = "virtual-node.liqo.io/not-allowed";
    /// Label and value of a virtual node (`pkg/consts/namespace_mapping.go`, `TypeLabel`, `TypeNode`).
    pub const TYPE_LABEL: &str = "liqo.io/type";
    /// See [`TYPE_LABEL`].
    pub const TYPE_VIRTUAL_NODE: &str = "virtual-node";
    /// Label (value `true`) the virtual kubelet puts on a local pod it offloaded
    /// (`pkg/consts/replication.go`, `LocalPodLabelKey`; `pkg/virtualKubelet/forge/pods.go`,
    /// `LocalPodOffloadedLabel`): the pods a VirtualNode's deletion drains (`drain.go`).
    pub const SHADOW_POD_LABEL: &str = "liqo.io/shadowPod";
    /// The Secret in Liqo's namespace with the cluster's authentication keys, fields
    /// `privateKey` (PKCS #8 PEM) and `publicKey` (PKIX PEM) (`pkg/consts/authentication.go`,
    /// `pkg/liqo-controller-manager/authentication/keys.go`).
    pub const AUTH_KEYS_SECRET: &str = "authentication-keys";
    /// The provider's nonce Secret in its tenant namespace (`authentication/forge/nonce.go`),
    /// labelled [`NONCE_LABEL`]; the nonce is in field [`NONCE_FIELD`].
    pub const NONCE_SECRET: &str = "liqo-nonce";
    /// Label of a nonce Secret (`pkg/consts/authentication.go`, `NonceSecretLabelKey`).
    pub const NONCE_LABEL: &str = "liqo.io/nonce";
    /// The consumer's signed-nonce Secret in its tenant namespace (`authentication/forge/signednonce.go`).
    pub const SIGNED_NONCE_SECRET: &str = "liqo-signed-nonce";
    /// Label of a signed-nonce Secret (`SignedNonceSecretLabelKey`).
    pub const SIGNED_NONCE_LABEL: &str = "liqo.io/signed-nonce";
    /// Field of the nonce in both Secrets (`NonceSecretField`).
    pub const NONCE_FIELD: &str = "nonce";
    /// Field of the signature in the signed-nonce Secret (`SignedNonceSecretField`).
    pub const SIGNED_NONCE_FIELD: &str = "signedNonce";
    /// Organization of a control-plane CSR (`authentication/csr.go`, `OrganizationControlPlaneCSR`).
    pub const CONTROL_PLANE_ORGANIZATION: &str = "liqo.io";
    /// Replication labels of a ResourceSlice (`pkg/consts/replication.go`).
    pub const REPLICATION_LABEL: &str = "liqo.io/replication";
    /// See [`REPLICATION_LABEL`]: the cluster it is replicated to.
    pub const REPLICATION_DESTINATION_LABEL: &str = "liqo.io/remoteID";
    /// Annotation asking for a VirtualNode for a ResourceSlice (`CreateVirtualNodeAnnotation`).
    pub const CREATE_VIRTUAL_NODE_ANNOTATION: &str = "liqo.io/create-virtual-node";
    /// Label of an IPAM Network's type (`pkg/consts/ipam.go`, `NetworkTypeLabelKey`):
    /// `pod-cidr`, `external-cidr`, ...
    pub const NETWORK_TYPE_LABEL: &str = "ipam.liqo.io/network-type";
    /// The gateway templates `liqoctl network connect` names by default, installed by the
    /// chart in Liqo's namespace (`networking/forge/{gatewayserver,gatewayclient}.go`).
    pub const SERVER_TEMPLATE: &str = "wireguard-server";
    /// See [`SERVER_TEMPLATE`].
    pub const CLIENT_TEMPLATE: &str = "wireguard-client";
    /// Kind of [`SERVER_TEMPLATE`] (`DefaultGwServerType`: `networking.liqo.io/v1beta1/wggatewayservertemplates`).
    pub const SERVER_TEMPLATE_KIND: &str = "WgGatewayServerTemplate";
    /// Kind of [`CLIENT_TEMPLATE`] (`DefaultGwClientType`).
    pub const CLIENT_TEMPLATE_KIND: &str = "WgGatewayClientTemplate";
    /// Label naming an application (`pkg/consts`, `K8sAppNameKey`): Liqo's tenant
    /// controller finds the ClusterRoles it binds by it.
    pub const APP_NAME_LABEL: &str = "app.kubernetes.io/name";
    /// [`APP_NAME_LABEL`] of the ClusterRole Liqo's tenant controller binds in a tenant
    /// namespace for the consumer (`tenant-controller/tenant_controller.go`,
    /// `tenantClusterRolesLabelValues`; the chart's `liqo-remote-controlplane`).
    pub const REMOTE_CONTROLPLANE_APP: &str = "remote-controlplane";
    /// [`APP_NAME_LABEL`] of the ClusterRole it binds cluster-wide for the consumer's group
    /// (`tenantClusterRolesClusterWideLabelValues`).
    pub const VK_REMOTE_CLUSTERWIDE_APP: &str = "virtual-kubelet-remote-clusterwide";
    /// Without ClusterRoles of both these names the tenant controller reconciles no Tenant
    /// (`ensureSetup`) and records no event.
    pub const TENANT_ROLE_APPS: [&str; 2] = [REMOTE_CONTROLPLANE_APP, VK_REMOTE_CLUSTERWIDE_APP];

    /// The tenant namespace a cluster keeps for `remote_id` (`pkg/tenantNamespace`,
    /// `NamePrefix` + the id).
    pub fn tenant_namespace(remote_id: &str) -> String {
        format!("liqo-tenant-{remote_id}")
    }

    /// The Liqo cluster id of the cluster `client` reaches (None: no id ConfigMap or key).
    pub async fn cluster_id(client: kube::Client) -> Result<Option<String>, kube::Error> {
        let cm = kube::Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client, LIQO_NAMESPACE).get_opt(CLUSTER_ID_CONFIGMAP).await?;
        Ok(cm.and_then(|c| c.data?.get("CLUSTER_ID").cloned()))
    }
}

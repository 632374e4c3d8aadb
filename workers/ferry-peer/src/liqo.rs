//! The Liqo objects of a peering (Liqo v1 API, `v1beta1`), as `liqoctl peer` makes them
//! (liqotech/liqo `pkg/liqoctl/{network,authenticate,rest/resourceslice}`, the forges in
//! `pkg/liqo-controller-manager/{networking,authentication}/forge/`): per side the tenant
//! namespace for the other (`pkg/tenantNamespace/namespaceManager.go`); the network (a
//! Configuration on each side holding only the peer's CIDRs, a GatewayServer on the
//! provider and a GatewayClient on the consumer naming their templates, a PublicKey on
//! each side with the other gateway's key); the authentication (the provider's nonce
//! Secret, the consumer's signed-nonce Secret, the Tenant on the provider, the Identity on
//! the consumer); the resources (a ResourceSlice on the consumer, labelled for
//! replication and annotated for a virtual node). Everything also carries
//! [`PEERING_LABEL`] so exactly it is removed. Pure, but for [`cluster_id`], which reads a
//! cluster's Liqo id. ForeignClusters are not made here: Liqo's ForeignCluster controller
//! creates them for every object labelled with a remote cluster id
//! (`core/foreigncluster-controller/foreigncluster_controller.go`, `foreignclusterEnqueuer`).

use base64::Engine;
use serde_json::{Value, json};

/// Label on everything a peering created: `<first>.<second>` (the pair by name).
pub const PEERING_LABEL: &str = "ferry.dev/peering";
pub use ferry_kube::vocab::liqo::{
    CLIENT_TEMPLATE, CLIENT_TEMPLATE_KIND, CLUSTER_ID_CONFIGMAP, CONTROLLER_MANAGER, LIQO_NAMESPACE, REMOTE_ID_LABEL, SERVER_TEMPLATE, SERVER_TEMPLATE_KIND,
    cluster_id, tenant_namespace,
};
use ferry_kube::vocab::liqo::{
    CREATE_VIRTUAL_NODE_ANNOTATION, NONCE_FIELD, NONCE_LABEL, NONCE_SECRET, POD_SECURITY_LABELS, REPLICATION_DESTINATION_LABEL, REPLICATION_LABEL,
    SIGNED_NONCE_LABEL, SIGNED_NONCE_SECRET, TENANT_NAMESPACE_LABEL,
};

/// The gateway port (`DefaultGwServerPort`).
pub const GATEWAY_PORT: i64 = 51840;
/// The gateways' MTU (liqoctl's default).
pub const MTU: i64 = 1340;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Whether `obj` (as stored) is labelled for `pair`'s peering: what a peering removes and
/// what `check` counts as Ferry's.
pub fn is_pairs(obj: &Value, pair: &str) -> bool {
    obj.pointer("/metadata/labels").and_then(|l| l.get(PEERING_LABEL)).and_then(Value::as_str) == Some(pair)
}

/// The label value of a pair.
pub fn pair_label(a: &str, b: &str) -> String {
    if a <= b { format!("{a}.{b}") } else { format!("{b}.{a}") }
}

/// One side of a peering toward the other: the remote's Liqo id and the tenant namespace
/// this side keeps for it. Liqo finds a tenant namespace by its labels, not its name
/// (`pkg/tenantNamespace/namespaceManager.go`, `GetNamespace`: `liqo.io/remote-cluster-id`
/// = the id and `liqo.io/tenant-namespace`), so one made by an older Liqo or by an admin
/// may have any name; `check` finds it so, and only when there is none does the peering
/// make one under the default name, as `CreateNamespace` does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Toward {
    /// The remote's Liqo cluster id.
    pub remote_id: String,
    /// This side's tenant namespace for it.
    pub namespace: String,
}

impl Toward {
    /// Toward `remote_id` in `namespace`; an empty one is the default name (records written
    /// before the namespace was recorded named no other).
    pub fn new(remote_id: &str, namespace: &str) -> Self {
        let namespace = if namespace.is_empty() { tenant_namespace(remote_id) } else { namespace.to_owned() };
        Self { remote_id: remote_id.to_owned(), namespace }
    }

    fn meta(&self, name: &str, pair: &str) -> Value {
        meta(name, Some(&self.namespace), &self.remote_id, pair)
    }
}

fn meta(name: &str, ns: Option<&str>, remote_id: &str, pair: &str) -> Value {
    let mut m = json!({"name": name, "labels": {PEERING_LABEL: pair, REMOTE_ID_LABEL: remote_id, "app.kubernetes.io/managed-by": "ferry"}});
    if let Some(ns) = ns {
        m["namespace"] = json!(ns);
    }
    m
}

/// The tenant namespace toward a remote, labelled as Liqo's namespace manager labels it
/// (`ForgeNamespace`): Liqo's Tenant webhook refuses a Tenant in any other.
pub fn namespace(to: &Toward, pair: &str) -> Value {
    let mut ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": meta(&to.namespace, None, &to.remote_id, pair)});
    ns["metadata"]["labels"][TENANT_NAMESPACE_LABEL] = json!("true");
    for l in POD_SECURITY_LABELS {
        ns["metadata"]["labels"][l] = json!("privileged");
    }
    ns
}

/// A peer's CIDRs as its IPAM has them (`ConfigurationForRemoteCluster`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cidrs {
    /// Its pod CIDRs.
    pub pod: Vec<String>,
    /// Its external CIDR.
    pub external: String,
}

/// The network Configuration a cluster keeps toward the remote, holding only the remote's
/// CIDRs (`SetupConfiguration`: `spec.local` is the configuration controller's).
pub fn configuration(to: &Toward, remote: &Cidrs, pair: &str) -> Value {
    json!({"apiVersion": "networking.liqo.io/v1beta1", "kind": "Configuration",
        "metadata": to.meta(&to.remote_id, pair),
        "spec": {"remote": {"cidr": {"pod": remote.pod, "external": [remote.external]}}}})
}

fn template_ref(kind: &str, name: &str) -> Value {
    json!({"apiVersion": "networking.liqo.io/v1beta1", "kind": kind, "name": name, "namespace": LIQO_NAMESPACE})
}

/// The GatewayServer on the provider, for the consumer it is toward (`forge/gatewayserver.go`:
/// named after the remote, a LoadBalancer on port 51840, the `wireguard-server` template).
pub fn gateway_server(to: &Toward, pair: &str) -> Value {
    json!({"apiVersion": "networking.liqo.io/v1beta1", "kind": "GatewayServer",
        "metadata": to.meta(&to.remote_id, pair),
        "spec": {"mtu": MTU, "endpoint": {"port": GATEWAY_PORT, "serviceType": "LoadBalancer"},
                 "serverTemplateRef": template_ref(SERVER_TEMPLATE_KIND, SERVER_TEMPLATE)}})
}

/// The GatewayClient on the consumer, toward the provider at the server's
/// published endpoint (`forge/gatewayclient.go`, the `wireguard-client` template).
pub fn gateway_client(to: &Toward, addresses: &[String], port: i64, pair: &str) -> Value {
    json!({"apiVersion": "networking.liqo.io/v1beta1", "kind": "GatewayClient",
        "metadata": to.meta(&to.remote_id, pair),
        "spec": {"mtu": MTU, "endpoint": {"addresses": addresses, "port": port, "protocol": "UDP"},
                 "clientTemplateRef": template_ref(CLIENT_TEMPLATE_KIND, CLIENT_TEMPLATE)}})
}

/// The PublicKey a cluster keeps toward the remote: the remote gateway's WireGuard key,
/// owned by the local gateway (`forge/publickey.go`; liqoctl's `EnsurePublicKey`).
/// `owner`: the local gateway's (kind, name, uid).
pub fn public_key(to: &Toward, key: &[u8], owner: (&str, &str, &str), pair: &str) -> Value {
    let mut m = to.meta(&to.remote_id, pair);
    m["labels"]["networking.liqo.io/gateway-resource"] = json!("true");
    m["ownerReferences"] = json!([{"apiVersion": "networking.liqo.io/v1beta1", "kind": owner.0, "name": owner.1, "uid": owner.2}]);
    json!({"apiVersion": "networking.liqo.io/v1beta1", "kind": "PublicKey", "metadata": m, "spec": {"publicKey": B64.encode(key)}})
}

/// The provider's nonce Secret for the consumer it is toward (`forge/nonce.go`): Liqo's
/// nonce creator fills it.
pub fn nonce_secret(to: &Toward, pair: &str) -> Value {
    let mut m = to.meta(NONCE_SECRET, pair);
    m["labels"][NONCE_LABEL] = json!("true");
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": m})
}

/// The consumer's signed-nonce Secret toward the provider, holding the provider's nonce
/// (`forge/signednonce.go`): Liqo's nonce signer adds the signature.
pub fn signed_nonce_secret(to: &Toward, nonce: &[u8], pair: &str) -> Value {
    let mut m = to.meta(SIGNED_NONCE_SECRET, pair);
    m["labels"][SIGNED_NONCE_LABEL] = json!("true");
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": m, "data": {NONCE_FIELD: B64.encode(nonce)}})
}

/// What the consumer proves itself with: its public key (PEM), a CSR for its control
/// plane (PEM) and the provider's nonce signed with its key.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Handshake {
    /// PKIX PEM.
    pub public_key: Vec<u8>,
    /// PEM CSR, common name the consumer's id, organization `liqo.io`.
    pub csr: Vec<u8>,
    /// The signature over the nonce.
    pub signature: Vec<u8>,
}

impl std::fmt::Debug for Handshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handshake").finish_non_exhaustive()
    }
}

/// The Tenant on the provider for the consumer it is toward (`forge/tenant.go`,
/// `TenantForRemoteCluster`: named after the consumer, in the provider's tenant namespace
/// for it).
pub fn tenant(to: &Toward, h: &Handshake, pair: &str) -> Value {
    json!({"apiVersion": "authentication.liqo.io/v1beta1", "kind": "Tenant",
        "metadata": to.meta(&to.remote_id, pair),
        "spec": {"clusterID": to.remote_id, "publicKey": B64.encode(&h.public_key), "csr": B64.encode(&h.csr), "signature": B64.encode(&h.signature)}})
}

/// The Identity on the consumer toward the provider, from the Tenant's status
/// (`GenerateIdentityControlPlane`, `forge/identity.go`: `controlplane-<provider id>`).
pub fn identity(to: &Toward, auth_params: &Value, provider_tenant_namespace: &str, pair: &str) -> Value {
    json!({"apiVersion": "authentication.liqo.io/v1beta1", "kind": "Identity",
        "metadata": to.meta(&identity_name(&to.remote_id), pair),
        "spec": {"clusterID": to.remote_id, "type": "ControlPlane", "authParams": auth_params, "namespace": provider_tenant_namespace}})
}

/// The control-plane Identity's name (`ControlPlaneIdentityName`).
pub fn identity_name(provider_id: &str) -> String {
    format!("controlplane-{provider_id}")
}

/// The ResourceSlice on the consumer asking the provider for resources (`forge/resourceslice.go`,
/// `MutateResourceSlice`: named after the provider, labelled for replication to it,
/// annotated for a virtual node, class `default`; the consumer's id and CSR are filled by
/// Liqo's local ResourceSlice controller).
pub fn resource_slice(to: &Toward, pair: &str) -> Value {
    let mut m = to.meta(&to.remote_id, pair);
    m["labels"][REPLICATION_LABEL] = json!("true");
    m["labels"][REPLICATION_DESTINATION_LABEL] = json!(to.remote_id);
    m["annotations"] = json!({CREATE_VIRTUAL_NODE_ANNOTATION: "true"});
    json!({"apiVersion": "authentication.liqo.io/v1beta1", "kind": "ResourceSlice", "metadata": m,
        "spec": {"class": "default", "providerClusterID": to.remote_id}})
}

/// The virtual node a consumer gets from `provider_id`: named after the ResourceSlice,
/// which is named after the provider (`virtualnodecreator_controller.go`).
pub fn virtual_node_name(provider_id: &str) -> String {
    provider_id.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_labelled_for_the_pair_and_placed_in_tenant_namespaces() {
        let pair = pair_label("member-2", "member-1");
        assert_eq!(pair, "member-1.member-2");
        let cidrs = Cidrs { pod: vec!["10.244.0.0/16".into()], external: "10.70.0.0/16".into() };
        let h = Handshake { public_key: b"pk".to_vec(), csr: b"csr".to_vec(), signature: b"sig".to_vec() };
        let to_2 = Toward::new("member-2", "");
        let to_1 = Toward::new("member-1", "");
        for o in [
            namespace(&to_2, &pair),
            configuration(&to_2, &cidrs, &pair),
            gateway_client(&to_2, &["203.0.113.5".into()], GATEWAY_PORT, &pair),
            resource_slice(&to_2, &pair),
            tenant(&to_1, &h, &pair),
            nonce_secret(&to_1, &pair),
        ] {
            assert_eq!(o["metadata"]["labels"][PEERING_LABEL], pair);
        }
        assert_eq!(gateway_server(&to_1, &pair)["metadata"]["namespace"], "liqo-tenant-member-1");
        assert_eq!(namespace(&to_2, &pair)["metadata"]["labels"][TENANT_NAMESPACE_LABEL], "true");
        assert!(configuration(&to_2, &cidrs, &pair)["spec"].get("local").is_none(), "spec.local is the controller's");
        assert_eq!(resource_slice(&to_2, &pair)["metadata"]["labels"][REPLICATION_DESTINATION_LABEL], "member-2");
        assert_eq!(format!("{h:?}"), "Handshake { .. }", "the handshake is never printed");
        // A tenant namespace found under another name holds every object toward its remote.
        let found = Toward::new("member-2", "made-by-hand");
        assert_eq!(namespace(&found, &pair)["metadata"]["name"], "made-by-hand");
        for o in [configuration(&found, &cidrs, &pair), identity(&found, &json!({}), "theirs", &pair), signed_nonce_secret(&found, b"n", &pair), resource_slice(&found, &pair)] {
            assert_eq!(o["metadata"]["namespace"], "made-by-hand", "{o}");
        }
    }
}

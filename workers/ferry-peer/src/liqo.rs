//! The Liqo objects of a peering (Liqo v1 API, `v1beta1`), as `liqoctl peer` creates them:
//! per side a tenant namespace and a ForeignCluster; the network (a Configuration on each
//! side, a GatewayServer on the provider, a GatewayClient on the consumer); the
//! authentication (a Tenant on the provider); the resources (a ResourceSlice on the
//! consumer). Everything carries [`PEERING_LABEL`] so exactly it is removed. Pure, but
//! for [`cluster_id`], which reads a cluster's Liqo id.

use serde_json::{Value, json};

/// Label on everything a peering created: `<first>.<second>` (the pair by name).
pub const PEERING_LABEL: &str = "ferry.dev/peering";
pub use ferry_kube::vocab::liqo::{CLUSTER_ID_CONFIGMAP, CONTROLLER_MANAGER, LIQO_NAMESPACE, REMOTE_ID_LABEL, cluster_id};
/// The gateway port.
pub const GATEWAY_PORT: i64 = 51840;

/// The label value of a pair.
pub fn pair_label(a: &str, b: &str) -> String {
    if a <= b { format!("{a}.{b}") } else { format!("{b}.{a}") }
}

/// The namespace where a cluster keeps what concerns `remote_id`.
pub fn tenant_namespace(remote_id: &str) -> String {
    format!("liqo-tenant-{remote_id}")
}

fn meta(name: &str, ns: Option<&str>, remote_id: &str, pair: &str) -> Value {
    let mut m = json!({"name": name, "labels": {PEERING_LABEL: pair, REMOTE_ID_LABEL: remote_id, "app.kubernetes.io/managed-by": "ferry"}});
    if let Some(ns) = ns {
        m["namespace"] = json!(ns);
    }
    m
}

/// A cluster's pod CIDR as the peering advertises it (one /16 per cluster id).
pub fn pod_cidr(cluster_id: &str) -> String {
    let h = cluster_id.bytes().fold(7u32, |a, b| a.wrapping_mul(31).wrapping_add(u32::from(b)));
    format!("10.{}.0.0/16", 64 + h % 128)
}

/// The tenant namespace for `remote_id`.
pub fn namespace(remote_id: &str, pair: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": meta(&tenant_namespace(remote_id), None, remote_id, pair)})
}

/// The ForeignCluster naming `remote_id` (cluster-scoped).
pub fn foreign_cluster(remote_id: &str, pair: &str) -> Value {
    json!({"apiVersion": "core.liqo.io/v1beta1", "kind": "ForeignCluster", "metadata": meta(remote_id, None, remote_id, pair), "spec": {"clusterID": remote_id}})
}

/// The network Configuration on `local_id` for `remote_id`.
pub fn configuration(local_id: &str, remote_id: &str, pair: &str) -> Value {
    json!({"apiVersion": "networking.liqo.io/v1beta1", "kind": "Configuration",
        "metadata": meta(remote_id, Some(&tenant_namespace(remote_id)), remote_id, pair),
        "spec": {"local": {"cidr": {"pod": [pod_cidr(local_id)], "external": []}},
                 "remote": {"cidr": {"pod": [pod_cidr(remote_id)], "external": []}}}})
}

/// The GatewayServer on the provider, for the consumer `remote_id`.
pub fn gateway_server(remote_id: &str, pair: &str) -> Value {
    json!({"apiVersion": "networking.liqo.io/v1beta1", "kind": "GatewayServer",
        "metadata": meta(&format!("server-{remote_id}"), Some(&tenant_namespace(remote_id)), remote_id, pair),
        "spec": {"mtu": 1340, "endpoint": {"port": GATEWAY_PORT, "serviceType": "LoadBalancer"}}})
}

/// The GatewayClient on the consumer, toward the provider `remote_id` at `address`.
pub fn gateway_client(remote_id: &str, address: &str, pair: &str) -> Value {
    json!({"apiVersion": "networking.liqo.io/v1beta1", "kind": "GatewayClient",
        "metadata": meta(&format!("client-{remote_id}"), Some(&tenant_namespace(remote_id)), remote_id, pair),
        "spec": {"mtu": 1340, "endpoint": {"addresses": [address], "port": GATEWAY_PORT, "protocol": "UDP"}}})
}

/// The Tenant on the provider for the consumer `consumer_id`.
pub fn tenant(consumer_id: &str, pair: &str) -> Value {
    json!({"apiVersion": "authentication.liqo.io/v1beta1", "kind": "Tenant",
        "metadata": meta(consumer_id, Some(&tenant_namespace(consumer_id)), consumer_id, pair),
        "spec": {"clusterID": consumer_id, "tenantCondition": "Active"}})
}

/// The ResourceSlice on the consumer asking `provider_id` for resources.
pub fn resource_slice(consumer_id: &str, provider_id: &str, pair: &str) -> Value {
    json!({"apiVersion": "authentication.liqo.io/v1beta1", "kind": "ResourceSlice",
        "metadata": meta(provider_id, Some(&tenant_namespace(provider_id)), provider_id, pair),
        "spec": {"consumerClusterID": consumer_id, "providerClusterID": provider_id, "class": "default"}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_labelled_for_the_pair_and_placed_in_tenant_namespaces() {
        let pair = pair_label("member-2", "member-1");
        assert_eq!(pair, "member-1.member-2");
        for o in [
            foreign_cluster("member-2", &pair),
            configuration("member-1", "member-2", &pair),
            gateway_client("member-2", "203.0.113.5", &pair),
            resource_slice("member-1", "member-2", &pair),
        ] {
            assert_eq!(o["metadata"]["labels"][PEERING_LABEL], pair);
        }
        assert_eq!(gateway_server("member-1", &pair)["metadata"]["namespace"], "liqo-tenant-member-1");
        assert_ne!(pod_cidr("member-1"), pod_cidr("member-2"));
    }
}

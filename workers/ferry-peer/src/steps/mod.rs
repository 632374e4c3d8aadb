//! The `peer` tasks' steps, one module each, in plan order. Liqo: [`liqo_check`] (`check`),
//! [`prepare`], [`network`], [`authentication`] and [`resources`] (each once more,
//! `-reverse`, when bidirectional), [`established`]. Submariner: [`submariner_check`]
//! (`check`), [`cluster_set`], [`submariner_broker`] (`broker`), [`submariner_addon`]
//! (`config`, `addon`). A force unpeer: [`force_unpeer`] (`check`, `force-unpeer`). Steps that apply
//! a set of objects and wait are [`objects::ObjectSet`]s run by [`objects::Applies`];
//! unpeer runs each step [`objects::Inverse`]d. What the steps share is here: the Liqo
//! kinds they watch, the step policy, a direction's roles and the tenant-namespace waits.

pub mod authentication;
pub mod cluster_set;
pub mod established;
pub mod force_unpeer;
pub mod liqo_check;
pub mod network;
pub mod objects;
pub mod prepare;
pub mod resources;
pub mod submariner_addon;
pub mod submariner_broker;
pub mod submariner_check;

use std::time::Duration;

use ferry_kube::step_errors::{kube_err, wait_err};
use ferry_kube::{Check, ClusterError};
use ferry_task::{StepError, StepPolicy, codes};
use serde_json::Value;

use crate::handler::Inner;
use crate::liqo;
use crate::spec::PeerClusters;
use liqo_check::Ids;

ferry_kube::resource!(
    /// Liqo Connection (a gateway's tunnel state in `status.value`).
    LiqoConnection, "Connection", "networking.liqo.io", "v1beta1", "connections", Namespaced
);
ferry_kube::resource!(
    /// Liqo Identity (the consumer's credentials toward a provider).
    LiqoIdentity, "Identity", "authentication.liqo.io", "v1beta1", "identities", Namespaced
);
ferry_kube::resource!(
    /// Liqo ResourceSlice.
    LiqoResourceSlice, "ResourceSlice", "authentication.liqo.io", "v1beta1", "resourceslices", Namespaced
);
ferry_kube::resource!(
    /// Liqo GatewayServer.
    LiqoGatewayServer, "GatewayServer", "networking.liqo.io", "v1beta1", "gatewayservers", Namespaced
);
ferry_kube::resource!(
    /// Liqo ForeignCluster.
    LiqoForeignCluster, "ForeignCluster", "core.liqo.io", "v1beta1", "foreignclusters", Cluster
);
ferry_kube::resource!(
    /// Liqo GatewayClient.
    LiqoGatewayClient, "GatewayClient", "networking.liqo.io", "v1beta1", "gatewayclients", Namespaced
);
ferry_kube::resource!(
    /// Liqo network Configuration (the remote's CIDRs, remapped in `status.remote`).
    LiqoConfiguration, "Configuration", "networking.liqo.io", "v1beta1", "configurations", Namespaced
);
ferry_kube::resource!(
    /// Liqo Tenant (the consumer's handshake; `status.authParams` once accepted).
    LiqoTenant, "Tenant", "authentication.liqo.io", "v1beta1", "tenants", Namespaced
);
ferry_kube::resource!(
    /// Liqo PublicKey (a gateway's WireGuard key toward a peer).
    LiqoPublicKey, "PublicKey", "networking.liqo.io", "v1beta1", "publickeys", Namespaced
);
ferry_kube::resource!(
    /// Liqo IPAM Network (`status.cidr` once allocated).
    LiqoNetwork, "Network", "ipam.liqo.io", "v1alpha1", "networks", Namespaced
);
ferry_kube::resource!(
    /// Liqo VirtualNode (made by Liqo for an accepted ResourceSlice, named after it).
    LiqoVirtualNode, "VirtualNode", "offloading.liqo.io", "v1beta1", "virtualnodes", Namespaced
);
ferry_kube::resource!(
    /// Liqo NamespaceMap (made by Liqo per provider with a VirtualNode; replicated to it).
    LiqoNamespaceMap, "NamespaceMap", "offloading.liqo.io", "v1beta1", "namespacemaps", Namespaced
);
ferry_kube::resource!(
    /// Liqo's default gateway server template kind.
    LiqoServerTemplate, "WgGatewayServerTemplate", "networking.liqo.io", "v1beta1", "wggatewayservertemplates", Namespaced
);
ferry_kube::resource!(
    /// Liqo's default gateway client template kind.
    LiqoClientTemplate, "WgGatewayClientTemplate", "networking.liqo.io", "v1beta1", "wggatewayclienttemplates", Namespaced
);

/// Every step's policy: waits are bounded by the command's timeout, removals by the
/// worker's (300 s default).
pub(crate) fn policy(p: &PeerClusters) -> StepPolicy {
    StepPolicy { timeout: p.timeout() * 3 + Duration::from_secs(600), ..StepPolicy::default() }
}

/// One direction of a Liqo peering: who consumes whose resources.
pub(crate) struct Roles {
    pub consumer: String,
    pub provider: String,
    pub consumer_id: String,
    pub provider_id: String,
    /// The consumer's side toward the provider.
    pub at_consumer: liqo::Toward,
    /// The provider's side toward the consumer.
    pub at_provider: liqo::Toward,
}

/// The roles of the direction `a` → `b`, or `b` → `a` when `reverse`.
pub(crate) fn roles(p: &PeerClusters, ids: &Ids, reverse: bool) -> Roles {
    let (consumer, provider, consumer_id, provider_id, at_consumer, at_provider) =
        if reverse { (&p.b, &p.a, &ids.b, &ids.a, ids.b_side(), ids.a_side()) } else { (&p.a, &p.b, &ids.a, &ids.b, ids.a_side(), ids.b_side()) };
    Roles { consumer: consumer.clone(), provider: provider.clone(), consumer_id: consumer_id.clone(), provider_id: provider_id.clone(), at_consumer, at_provider }
}

/// Waits until the Connection in `cluster`'s tenant namespace toward the remote is Connected.
pub(crate) async fn connected(inner: &Inner, cluster: &str, to: &liqo::Toward, timeout: Duration) -> Result<(), StepError> {
    let client = inner.client(cluster).await?;
    let remote = &to.remote_id;
    inner
        .cfg
        .watches
        .wait_store::<LiqoConnection, ()>(cluster, &client, Some(&to.namespace), &format!("the gateway toward {remote}"), timeout, |s| {
            let states: Vec<String> = s.state().iter().map(|c| c.status_at("/value").and_then(Value::as_str).unwrap_or("(none)").to_owned()).collect();
            if states.iter().any(|v| v == "Connected") { Check::Done(()) } else { Check::Pending(format!("connections: {states:?}")) }
        })
        .await
        .map_err(|e| wait_err(codes::GATEWAY_NOT_CONNECTED, e))
}

/// Waits until nothing of `K` is left in `cluster`'s tenant namespace toward the remote.
pub(crate) async fn none_left<K>(inner: &Inner, cluster: &str, to: &liqo::Toward, what: &str) -> Result<(), StepError>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let client = match inner.cfg.clusters.client(cluster).await {
        Ok(c) => c,
        Err(ClusterError::Unknown { .. }) => return Ok(()),
        Err(e) => return Err(kube_err(codes::CLUSTER_API, e)),
    };
    inner
        .cfg
        .watches
        .wait_store::<K, ()>(cluster, &client, Some(&to.namespace), what, inner.cfg.removal_timeout, |s| {
            if s.state().is_empty() { Check::Done(()) } else { Check::Pending(format!("{} left", s.state().len())) }
        })
        .await
        .map_err(|e| wait_err(codes::REMOVAL, e))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn outputs_keep_the_shape_journals_and_views_read() {
        let ids = Ids {
            a: "id-a".into(),
            b: "id-b".into(),
            a_knew_b: false,
            b_knew_a: true,
            a_namespace_kept: true,
            b_namespace_kept: false,
            a_namespace: "by-hand".into(),
            b_namespace: "liqo-tenant-id-a".into(),
            reused: false,
        };
        assert_eq!(
            liqo_check::IDS.value(&ids).unwrap(),
            json!({"a": "id-a", "b": "id-b", "a_knew_b": false, "b_knew_a": true, "a_namespace_kept": true, "b_namespace_kept": false,
                   "a_namespace": "by-hand", "b_namespace": "liqo-tenant-id-a", "reused": false})
        );
        // A check journaled before the later fields: both sides assumed to know the other, so
        // a revert keeps their ForeignClusters; namespaces were Ferry's (it labelled them)
        // under the default name; the task owns what it applied.
        let old: Ids = serde_json::from_value(json!({"a": "id-a", "b": "id-b"})).unwrap();
        assert!(old.a_knew_b && old.b_knew_a && !old.a_namespace_kept && !old.b_namespace_kept && !old.reused);
        assert_eq!((old.a_side().namespace, old.b_side().namespace), ("liqo-tenant-id-b".to_owned(), "liqo-tenant-id-a".to_owned()));
        let gw = network::Gateway { gateway: "10.0.0.1".into() };
        assert_eq!(network::NETWORK.value(&gw).unwrap(), json!({"gateway": "10.0.0.1"}));
        let auth = authentication::Authenticated { consumer: "member-1".into() };
        assert_eq!(authentication::AUTHENTICATION.value(&auth).unwrap(), json!({"consumer": "member-1"}));
        assert_eq!(authentication::AUTHENTICATION_REVERSE.step(), "authentication-reverse");
        let vn = resources::VirtualNode { virtual_node: "id-b".into(), on: "member-1".into(), resources: json!({"cpu": "4"}) };
        assert_eq!(resources::RESOURCES.value(&vn).unwrap(), json!({"virtual_node": "id-b", "on": "member-1", "resources": {"cpu": "4"}}));
        assert_eq!(resources::RESOURCES_REVERSE.step(), "resources-reverse");
        let fc = established::ForeignClusterRole { cluster: "member-1".into(), remote: "id-b".into(), role: "Provider".into() };
        assert_eq!(
            established::ESTABLISHED.value(&established::Established { foreign_clusters: vec![fc] }).unwrap(),
            json!({"foreign_clusters": [{"cluster": "member-1", "remote": "id-b", "role": "Provider"}]})
        );
        let sets = submariner_check::Sets { a: None, b: Some("blue".into()), target: "submariner".into(), existed: false };
        assert_eq!(submariner_check::SETS.value(&sets).unwrap(), json!({"a": null, "b": "blue", "target": "submariner", "existed": false}));
        assert_eq!(cluster_set::CLUSTER_SET.value(&cluster_set::Joined { set: "blue".into() }).unwrap(), json!({"set": "blue"}));
        let av = submariner_addon::Available { available: vec!["member-1".into(), "member-2".into()] };
        assert_eq!(submariner_addon::ADDON.value(&av).unwrap(), json!({"available": ["member-1", "member-2"]}));
    }

    #[test]
    fn a_direction_names_its_consumer_and_provider() {
        let p = PeerClusters { a: "member-1".into(), b: "member-2".into(), ..Default::default() };
        let ids = Ids { a: "id-1".into(), b: "id-2".into(), a_namespace: "ns-on-1".into(), ..Ids::default() };
        let there = roles(&p, &ids, false);
        assert_eq!((there.consumer.as_str(), there.provider.as_str(), there.consumer_id.as_str(), there.provider_id.as_str()), ("member-1", "member-2", "id-1", "id-2"));
        assert_eq!((there.at_consumer.remote_id.as_str(), there.at_consumer.namespace.as_str()), ("id-2", "ns-on-1"));
        assert_eq!((there.at_provider.remote_id.as_str(), there.at_provider.namespace.as_str()), ("id-1", "liqo-tenant-id-1"));
        let back = roles(&p, &ids, true);
        assert_eq!((back.consumer.as_str(), back.provider.as_str(), back.consumer_id.as_str(), back.provider_id.as_str()), ("member-2", "member-1", "id-2", "id-1"));
        assert_eq!(back.at_provider.namespace, "ns-on-1");
    }
}

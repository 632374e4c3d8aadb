//! The OCM objects of a Submariner peering (on the hub): the ManagedClusterSet the pair
//! joins, the set's Broker, a SubmarinerConfig and the submariner ManagedClusterAddOn in
//! each cluster's namespace. Everything carries [`PEERING_LABEL`]. And how the add-on's
//! status reads: whether the tunnel is up, else what is missing ([`addon_ready`]). Pure.

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

/// The Broker the add-on's agent controller reads in the set's broker namespace
/// (stolostron/submariner-addon `pkg/hub/submarineragent/controller.go`, `BrokerObjectName`).
pub const BROKER: &str = "submariner-broker";
/// OLM's API group: the operator's OperatorGroup and Subscription.
pub const OLM_GROUP: &str = "operators.coreos.com";

/// The broker namespace of ManagedClusterSet `set`, where the add-on's broker controller
/// puts it (`pkg/hub/submarinerbrokerinfo/brokerinfo.go`, `GenerateBrokerName`):
/// `<set>-broker`, or, past 63 characters, the set's name without its first five.
pub fn broker_namespace(set: &str) -> String {
    let n = format!("{set}-broker");
    if n.len() > 63 { format!("{}-broker", set.get(5..).unwrap_or(set)) } else { n }
}

/// The Broker of `set` (globalnet off, as the add-on's demo makes it: `scripts/demo.sh`).
pub fn broker(set: &str, pair: &str) -> Value {
    json!({"apiVersion": "submariner.io/v1alpha1", "kind": "Broker",
        "metadata": {"name": BROKER, "namespace": broker_namespace(set), "labels": {PEERING_LABEL: pair, "app.kubernetes.io/managed-by": "ferry"}},
        "spec": {"globalnetEnabled": false}})
}

/// Whether a `submariner` ManagedClusterAddOn's `status` says the tunnel is up: the
/// agent's lease (`Available`), the operator deployed (`SubmarinerAgentDegraded=False`)
/// and the gateway connected (`SubmarinerConnectionDegraded=False`), the conditions the
/// add-on's agent writes (`pkg/spoke/submarineragent/{deployment,connections}_controller.go`).
/// Else why not, the first missing piece first.
pub fn addon_ready(status: &Value) -> Result<(), String> {
    let find = |t: &str| {
        let c = status.get("conditions")?.as_array()?.iter().find(|c| c.get("type").and_then(Value::as_str) == Some(t))?;
        let s = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        Some((s("status"), s("reason"), s("message")))
    };
    let said = |t: &str, (s, r, m): (String, String, String)| format!("{t}={s} ({r}){}", if m.is_empty() { String::new() } else { format!(": {m}") });
    if let Some(c) = find("SubmarinerBrokerConfigApplied").filter(|c| c.0 == "False") {
        return Err(format!("{}; the add-on waits for brokers.submariner.io {BROKER} in the set's broker namespace", said("SubmarinerBrokerConfigApplied", c)));
    }
    match find("Available") {
        Some(c) if c.0 == "True" => {}
        Some(c) => return Err(said("Available", c)),
        None => return Err("no Available condition yet: the add-on's agent reports through the cluster's klusterlet, and none has".into()),
    }
    match find("SubmarinerAgentDegraded") {
        Some(c) if c.0 == "False" => {}
        Some(c) => return Err(said("SubmarinerAgentDegraded", c)),
        None => {
            return Err("no SubmarinerAgentDegraded yet: the Submariner operator is not installed, and the add-on installs it through OLM (does the cluster run OLM? \
                        the add-on's ManifestWork submariner-operator says whether the cluster's work agent could apply the Subscription)"
                .into());
        }
    }
    match find("SubmarinerConnectionDegraded") {
        Some(c) if c.0 == "False" => Ok(()),
        Some(c) => Err(said("SubmarinerConnectionDegraded", c)),
        None => Err("the agent has not reported the gateway's connections (no SubmarinerConnectionDegraded yet)".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(conds: &[(&str, &str, &str)]) -> Value {
        json!({"conditions": conds.iter().map(|(t, s, r)| json!({"type": t, "status": s, "reason": r, "message": ""})).collect::<Vec<_>>()})
    }

    #[test]
    fn the_tunnel_is_up_only_when_the_agent_says_so() {
        let up = [("Available", "True", "ManagedClusterAddOnLeaseUpdated"), ("SubmarinerAgentDegraded", "False", "SubmarinerAgentDeployed"), ("SubmarinerConnectionDegraded", "False", "ConnectionsEstablished")];
        addon_ready(&status(&up)).unwrap();
        // The agent's lease alone is not a tunnel.
        assert!(addon_ready(&status(&up[..1])).unwrap_err().contains("SubmarinerAgentDegraded"));
        let missing = [("SubmarinerBrokerConfigApplied", "False", "BrokerConfigMissing"), up[0], up[1], up[2]];
        assert!(addon_ready(&status(&missing)).unwrap_err().contains("BrokerConfigMissing"));
        assert!(addon_ready(&json!({})).unwrap_err().contains("klusterlet"));
        let degraded = [up[0], up[1], ("SubmarinerConnectionDegraded", "True", "ConnectionsDegraded")];
        assert!(addon_ready(&status(&degraded)).unwrap_err().contains("ConnectionsDegraded"));
    }

    #[test]
    fn broker_namespaces_are_named_as_the_add_on_names_them() {
        assert_eq!(broker_namespace("submariner"), "submariner-broker");
        assert_eq!(broker_namespace(&"x".repeat(57)).len(), 59);
    }
}

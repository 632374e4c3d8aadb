//! What a fleet looks like right now: clusters, nodes, allocatable and requested capacity.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use serde::Serialize;

use crate::fleet::{FleetError, client_for};

/// One node.
#[derive(Debug, Clone, Serialize)]
pub struct NodeView {
    /// Node name.
    pub name: String,
    /// Ready condition is True.
    pub ready: bool,
    /// Allocatable cpu, memory, pods (as the node reports them).
    pub allocatable: BTreeMap<String, String>,
    /// Pods bound to the node that have not finished.
    pub pods: usize,
}

/// One cluster.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterView {
    /// Cluster name.
    pub name: String,
    /// Its kubeconfig.
    pub kubeconfig: String,
    /// Its nodes.
    pub nodes: Vec<NodeView>,
    /// Pods not yet bound to a node.
    pub pending_pods: usize,
}

/// Reads nodes and pods of each `(name, kubeconfig)`.
pub async fn describe(clusters: &[(String, std::path::PathBuf)]) -> Result<Vec<ClusterView>, FleetError> {
    let mut out = Vec::new();
    for (name, kc) in clusters {
        out.push(describe_one(name, kc).await?);
    }
    Ok(out)
}

async fn describe_one(name: &str, kubeconfig: &Path) -> Result<ClusterView, FleetError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = client_for(name, kubeconfig).await?;
    let err = |e: kube::Error| FleetError::Client { cluster: name.to_owned(), source: Box::new(e) };
    let nodes = Api::<Node>::all(client.clone()).list(&ListParams::default()).await.map_err(err)?;
    let pods = Api::<Pod>::all(client).list(&ListParams::default()).await.map_err(err)?;
    let live = |p: &&Pod| !matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded") | Some("Failed"));
    let node_of = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.clone());
    let views = nodes
        .items
        .iter()
        .map(|n| {
            let nname = n.metadata.name.clone().unwrap_or_default();
            let status = n.status.clone().unwrap_or_default();
            NodeView {
                ready: status.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True"),
                allocatable: status.allocatable.unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)).collect(),
                pods: pods.items.iter().filter(live).filter(|p| node_of(p).as_deref() == Some(nname.as_str())).count(),
                name: nname,
            }
        })
        .collect();
    let pending_pods = pods.items.iter().filter(live).filter(|p| node_of(p).is_none()).count();
    Ok(ClusterView { name: name.to_owned(), kubeconfig: kubeconfig.display().to_string(), nodes: views, pending_pods })
}

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
    /// Why its API server could not be read (it stopped, say); nothing else is known then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unreachable: Option<String>,
}

/// Reads nodes and pods of each `(name, kubeconfig)`; a cluster that cannot be read is
/// listed with why, and the others still are.
pub async fn describe(clusters: &[(String, std::path::PathBuf)]) -> Vec<ClusterView> {
    let mut out = Vec::new();
    for (name, kc) in clusters {
        out.push(describe_one(name, kc).await.unwrap_or_else(|e| ClusterView {
            name: name.clone(),
            kubeconfig: kc.display().to_string(),
            nodes: Vec::new(),
            pending_pods: 0,
            unreachable: Some(with_root_cause(&e)),
        }));
    }
    out
}

/// `e` and, when it has sources, the deepest one (a refused connection, say), which kube's
/// outer layers do not repeat.
fn with_root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut root = e;
    while let Some(s) = root.source() {
        root = s;
    }
    if std::ptr::addr_eq(root, e) { e.to_string() } else { format!("{e} ({root})") }
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
    Ok(ClusterView { name: name.to_owned(), kubeconfig: kubeconfig.display().to_string(), nodes: views, pending_pods, unreachable: None })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_cluster_that_cannot_be_read_is_listed_with_why() {
        let dir = tempfile::tempdir().unwrap();
        let kc = dir.path().join("kubeconfig");
        // Nothing listens on port 1: the API server of a cluster that stopped.
        let text = "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\nusers: [{name: u, user: {}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n";
        std::fs::write(&kc, text).unwrap();
        let views = describe(&[("gone".to_owned(), kc)]).await;
        assert_eq!(views.len(), 1);
        assert_eq!(views[0].name, "gone");
        let why = views[0].unreachable.as_deref().unwrap_or_default();
        assert!(why.contains("gone") && why.contains("Connection refused"), "{why}");
    }
}

//! `nodes`: as many Machines of the cluster as it has control-plane and worker replicas
//! have nodes, and each such Node is Ready through the workload kubeconfig ([`wait_nodes`],
//! which a scale's `wait` and the undo of `scale` use too). It changes nothing, so its undo
//! has nothing to put back.

use std::sync::Arc;
use std::time::Duration;

use ferry_kube::kinds::CapiMachine;
use ferry_kube::step_errors::kube_err;
use ferry_kube::{Check, HUB};
use ferry_task::{CheckStep, Output, StepContext, StepError, StepPolicy, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Node;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{ready_timeout, wait_err, wait_policy};
use crate::handler::Inner;
use crate::render;
use crate::spec::ClusterCommand;

/// The `nodes` step's output.
pub const NODES: Output<ReadyNodes> = Output::new("nodes");

/// Output of `nodes` (and of a scale's `wait`): the cluster's Ready nodes.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ReadyNodes {
    /// Node names, from the Machines' `nodeRef`.
    pub nodes: Vec<String>,
}

/// Waits until `want` Machines of the cluster have nodes and every such Node is Ready.
pub(super) async fn wait_nodes(
    inner: &Inner,
    cmd: &ClusterCommand,
    want: usize,
    timeout: Duration,
    cx: &StepContext<'_, ClusterCommand>,
) -> Result<Vec<String>, StepError> {
    let hub = inner.hub();
    let name = cmd.name.clone();
    let nodes = inner
        .cfg
        .watches
        .wait_store::<CapiMachine, Vec<String>>(HUB, &hub, Some(cmd.namespace()), &format!("{want} Machines of {name} with nodes"), timeout, |store| {
            let ms: Vec<_> = store
                .state()
                .into_iter()
                .filter(|m| {
                    m.metadata.labels.as_ref().and_then(|l| l.get(render::CAPI_CLUSTER_LABEL)) == Some(&name) && m.metadata.deletion_timestamp.is_none()
                })
                .collect();
            let with_node: Vec<String> = ms.iter().filter_map(|m| m.status_at("/nodeRef/name").and_then(Value::as_str).map(str::to_owned)).collect();
            if ms.len() == want && with_node.len() == want {
                Check::Done(with_node)
            } else {
                Check::Pending(format!("{} Machines, {} with a node, want {want}", ms.len(), with_node.len()))
            }
        })
        .await
        .map_err(wait_err)?;
    cx.progress(50, format!("{want} machines have nodes"));
    let client = inner.cfg.clusters.client(&cmd.name).await.map_err(|e| kube_err(codes::KUBECONFIG, e))?;
    let wanted = nodes.clone();
    inner
        .cfg
        .watches
        .wait_store::<Node, ()>(&cmd.name, &client, None, "Ready nodes", timeout, |store| {
            let nodes = store.state();
            let ready = |n: &str| nodes.iter().any(|node| node.metadata.name.as_deref() == Some(n) && ferry_kube::kinds::node_ready(node));
            let not_ready: Vec<&str> = wanted.iter().filter(|n| !ready(n)).map(String::as_str).collect();
            if not_ready.is_empty() {
                return Check::Done(());
            }
            // The kubelet says why (kubeadm without a CNI: NetworkPluginNotReady).
            let why = nodes
                .iter()
                .filter(|node| node.metadata.name.as_deref().is_some_and(|n| not_ready.contains(&n)))
                .find_map(|node| ferry_kube::kinds::condition_message(&serde_json::to_value(&node.status).ok()?, "Ready"));
            Check::Pending(match why {
                Some(w) if w.contains("NetworkPluginNotReady") => {
                    format!("not Ready yet: {}: {w} (no pod network: ask for a CNI add-on, e.g. addons: [{{name: cni}}])", not_ready.join(", "))
                }
                Some(w) => format!("not Ready yet: {}: {w}", not_ready.join(", ")),
                None => format!("not Ready yet: {}", not_ready.join(", ")),
            })
        })
        .await
        .map_err(wait_err)?;
    Ok(nodes)
}

/// The `nodes` step.
pub struct NodesStep(pub(crate) Arc<Inner>);

impl CheckStep<ClusterCommand> for NodesStep {
    fn name(&self) -> &str {
        NODES.step()
    }

    fn policy(&self) -> StepPolicy {
        wait_policy(Duration::from_secs(1800))
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let cmd = cx.spec;
            let want = (cmd.control_plane_count() + cmd.worker_count()) as usize;
            let nodes = wait_nodes(&self.0, cmd, want, ready_timeout(cmd), cx).await?;
            cx.progress(100, format!("{} nodes Ready", nodes.len()));
            NODES.value(&ReadyNodes { nodes })
        }
        .boxed()
    }
}

//! `nodes`: as many Machines of the cluster as it has control-plane and worker replicas
//! have nodes, none is being deleted (a scale down's Machines drained and gone, what holds
//! them said as Cluster API says it), and each such Node is Ready through the workload
//! kubeconfig ([`wait_nodes`], which a scale's `wait` and the undo of `scale` use too). It
//! changes nothing, so its undo has nothing to put back.

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

/// Waits until `want` Machines of the cluster have nodes and every such Node is Ready and,
/// when `shrinking` (a scale to fewer machines), until no Machine of it is being deleted.
pub(super) async fn wait_nodes(
    inner: &Inner,
    cmd: &ClusterCommand,
    want: usize,
    shrinking: bool,
    timeout: Duration,
    cx: &StepContext<'_, ClusterCommand>,
) -> Result<Vec<String>, StepError> {
    let hub = inner.hub();
    let name = cmd.name.clone();
    let mut said = None;
    let what = format!("{want} Machines of {name} with nodes{}", if shrinking { ", none being deleted" } else { "" });
    let nodes = inner
        .cfg
        .watches
        .wait_store::<CapiMachine, Vec<String>>(HUB, &hub, Some(cmd.namespace()), &what, timeout, |store| {
            let all: Vec<_> = store.state().into_iter().filter(|m| m.metadata.labels.as_ref().and_then(|l| l.get(render::CAPI_CLUSTER_LABEL)) == Some(&name)).collect();
            let (deleted, ms): (Vec<_>, Vec<_>) = all.into_iter().partition(|m| m.metadata.deletion_timestamp.is_some());
            let with_node: Vec<String> = ms.iter().filter_map(|m| m.status_at("/nodeRef/name").and_then(Value::as_str).map(str::to_owned)).collect();
            if ms.len() != want || with_node.len() != want {
                return Check::Pending(format!("{} Machines, {} with a node, want {want}", ms.len(), with_node.len()));
            }
            // A scale down (`shrinking`) is done once the Machines it removes are gone:
            // Cluster API drains each one's node first, and a PodDisruptionBudget can hold
            // that for ever (no drain timeout by default); the Machine's `Deleting`
            // condition says what holds it, and the wait says it when that changed.
            let Some(why) = being_deleted(&deleted).filter(|_| shrinking) else { return Check::Done(with_node) };
            if said.as_ref() != Some(&why) {
                cx.progress(25, why.clone());
                said = Some(why.clone());
            }
            Check::Pending(why)
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

/// What Machines being deleted are waited for, in the words of their v1beta2 `Deleting`
/// condition (cluster-api `core/reconcilers/machine/machine_controller.go` `reconcileDelete`:
/// reason `DrainingNode` while the node's drain is not done, the message naming the pods
/// left and why each could not be evicted, as `drain/drain.go` `ConditionMessage` words
/// it), on one line. None when none is.
fn being_deleted(deleted: &[std::sync::Arc<CapiMachine>]) -> Option<String> {
    let mut said: Vec<String> = deleted
        .iter()
        .map(|m| {
            let name = m.metadata.name.as_deref().unwrap_or_default();
            let condition = m.status.get("conditions").and_then(Value::as_array).and_then(|cs| cs.iter().find(|c| c["type"] == "Deleting" && c["status"] == "True"));
            match condition {
                Some(c) => {
                    let (reason, message) = (c["reason"].as_str().unwrap_or_default(), c["message"].as_str().unwrap_or_default());
                    let message = message.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" ");
                    format!("Machine {name} is being deleted ({reason}): {message}")
                }
                None => format!("Machine {name} is being deleted"),
            }
        })
        .collect();
    said.sort();
    (!said.is_empty()).then(|| said.join("; "))
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
            let nodes = wait_nodes(&self.0, cmd, want, false, ready_timeout(cmd), cx).await?;
            cx.progress(100, format!("{} nodes Ready", nodes.len()));
            NODES.value(&ReadyNodes { nodes })
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A draining Machine is said in its `Deleting` condition's words, on one line; one
    /// without the condition yet is said plainly; none, nothing.
    #[test]
    fn machines_being_deleted_are_said_as_cluster_api_says_them() {
        let machine = |name: &str, conditions: Value| {
            std::sync::Arc::new(CapiMachine { metadata: kube::core::ObjectMeta { name: Some(name.into()), ..Default::default() }, spec: Value::Null, status: serde_json::json!({"conditions": conditions}) })
        };
        let draining = machine("c-md-0-2", serde_json::json!([{"type": "Deleting", "status": "True", "reason": "DrainingNode",
            "message": "Drain not completed yet (started at 2026-11-30T21:00:00Z):\n* Pod default/held: cannot evict pod as it would violate the pod's disruption budget."}]));
        let fresh = machine("c-md-0-1", serde_json::json!([]));
        assert_eq!(
            being_deleted(&[draining, fresh]).unwrap(),
            "Machine c-md-0-1 is being deleted; Machine c-md-0-2 is being deleted (DrainingNode): Drain not completed yet (started at 2026-11-30T21:00:00Z): * Pod default/held: cannot evict pod as it would violate the pod's disruption budget."
        );
        assert_eq!(being_deleted(&[]), None);
    }
}

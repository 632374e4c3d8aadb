//! A scale's steps. `check`: the Cluster is Ferry's and not being deleted (else the
//! command is rejected), and its replica counts now. `scale`: the counts the command asks
//! for, by a merge patch of replicas (of the control plane and the MachineDeployment, or of
//! the topology); its undo restores the counts before and waits for their nodes. `wait`:
//! as many Ready nodes as asked for and, scaling down, the removed Machines gone (Cluster
//! API drains their nodes first; what holds a drain is said as it says it). The check and the wait change nothing, so their undo
//! has nothing to put back.

use std::sync::Arc;
use std::time::Duration;

use ferry_kube::HUB;
use ferry_kube::kinds::CapiCluster;
use ferry_kube::step_errors::{hub_err, kube_err};
use ferry_task::{CheckStep, Output, Step, StepContext, StepError, StepPolicy, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use kube::api::{Patch, PatchParams};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::nodes::{ReadyNodes, wait_nodes};
use super::{clusters_api, own_cluster, ready_timeout, wait_policy};
use crate::handler::Inner;
use crate::render;
use crate::spec::ClusterCommand;

/// The `check` step's output (a scale's): the counts before.
pub const CHECK: Output<Counts> = Output::new("check");

/// The `scale` step's output: the counts asked for.
pub const SCALE: Output<Counts> = Output::new("scale");

/// The `wait` step's output.
pub const WAIT: Output<ReadyNodes> = Output::new("wait");

/// Output of a scale's `check` (the counts before) and of `scale` (the counts asked for).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Counts {
    /// Control-plane replicas.
    pub control_plane: i64,
    /// Worker replicas.
    pub workers: i64,
}

/// Where a cluster's replica counts live: its control plane and MachineDeployment, or its
/// topology.
enum Replicas {
    Objects { control_plane: Value, workers: Value },
    Topology,
}

impl Counts {
    /// Whether going from these counts to `to` removes machines (of either kind).
    pub fn shrunk_to(&self, to: &Counts) -> bool {
        to.control_plane < self.control_plane || to.workers < self.workers
    }
}

fn replicas_of(cluster: &CapiCluster, cmd: &ClusterCommand) -> Replicas {
    if cluster.spec.get("topology").is_some() {
        return Replicas::Topology;
    }
    let cp = cluster.spec.get("controlPlaneRef").cloned().unwrap_or_default();
    let group = cp["apiGroup"].as_str().unwrap_or("controlplane.cluster.x-k8s.io");
    Replicas::Objects {
        control_plane: json!({"apiVersion": format!("{group}/v1beta2"), "kind": cp["kind"], "metadata": {"name": cp["name"], "namespace": cmd.namespace()}}),
        workers: json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment", "metadata": {"name": render::workers_name(cmd), "namespace": cmd.namespace()}}),
    }
}

async fn read_counts(inner: &Inner, cmd: &ClusterCommand, cluster: &CapiCluster) -> Result<Counts, StepError> {
    let get = |o: Value| async move {
        let found = inner.cfg.clusters.get(HUB, &o).await.map_err(|e| kube_err(codes::HUB_API, e))?;
        Ok::<i64, StepError>(found.and_then(|d| d.data.pointer("/spec/replicas").and_then(Value::as_i64)).unwrap_or(0))
    };
    Ok(match replicas_of(cluster, cmd) {
        Replicas::Topology => Counts {
            control_plane: cluster.spec.pointer("/topology/controlPlane/replicas").and_then(Value::as_i64).unwrap_or(1),
            workers: cluster.spec.pointer("/topology/workers/machineDeployments/0/replicas").and_then(Value::as_i64).unwrap_or(0),
        },
        Replicas::Objects { control_plane, workers } => Counts { control_plane: get(control_plane).await?, workers: get(workers).await? },
    })
}

async fn set_counts(inner: &Inner, cmd: &ClusterCommand, to: &Counts) -> Result<(), StepError> {
    let cluster = clusters_api(&inner.hub(), cmd.namespace()).get(&cmd.name).await.map_err(hub_err)?;
    let pp = PatchParams::default();
    match replicas_of(&cluster, cmd) {
        Replicas::Topology => {
            let mut topo = cluster.spec["topology"].clone();
            topo["controlPlane"]["replicas"] = json!(to.control_plane);
            if let Some(md) = topo.pointer_mut("/workers/machineDeployments/0") {
                md["replicas"] = json!(to.workers);
            }
            clusters_api(&inner.hub(), cmd.namespace()).patch(&cmd.name, &pp, &Patch::Merge(&json!({"spec": {"topology": topo}}))).await.map_err(hub_err)?;
        }
        Replicas::Objects { control_plane, workers } => {
            for (o, n) in [(control_plane, to.control_plane), (workers, to.workers)] {
                let gvk = ferry_kube::clusters::gvk_of(&o).map_err(|e| kube_err(codes::HUB_API, e))?;
                let api = inner.cfg.clusters.api(HUB, &gvk, Some(cmd.namespace())).await.map_err(|e| kube_err(codes::HUB_API, e))?;
                let name = o["metadata"]["name"].as_str().unwrap_or_default().to_owned();
                // A merge patch of replicas only: the create's applied fields stay its own.
                api.patch(&name, &pp, &Patch::Merge(&json!({"spec": {"replicas": n}}))).await.map_err(hub_err)?;
            }
        }
    }
    Ok(())
}

/// The `check` step of a scale.
pub struct ScaleCheck(pub(crate) Arc<Inner>);

impl CheckStep<ClusterCommand> for ScaleCheck {
    fn name(&self) -> &str {
        CHECK.step()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let c = own_cluster(&self.0, cx.spec).await?;
            let before = read_counts(&self.0, cx.spec, &c).await?;
            cx.progress(100, format!("now {} control-plane and {} worker machines", before.control_plane, before.workers));
            CHECK.value(&before)
        }
        .boxed()
    }
}

fn before(cx: &StepContext<'_, ClusterCommand>) -> Result<Counts, StepError> {
    CHECK.required(cx)
}

fn target(cmd: &ClusterCommand, before: &Counts) -> Counts {
    Counts { control_plane: cmd.control_plane.count.map_or(before.control_plane, i64::from), workers: cmd.workers.count.map_or(before.workers, i64::from) }
}

/// The `scale` step.
pub struct ScaleStep(pub(crate) Arc<Inner>);

impl Step<ClusterCommand> for ScaleStep {
    fn name(&self) -> &str {
        SCALE.step()
    }

    fn policy(&self) -> StepPolicy {
        wait_policy(Duration::from_secs(1800))
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let to = target(cx.spec, &before(cx)?);
            set_counts(&self.0, cx.spec, &to).await?;
            cx.progress(100, format!("asked for {} control-plane and {} worker machines", to.control_plane, to.workers));
            SCALE.value(&to)
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            let b = before(cx)?;
            let asked = target(cx.spec, &b);
            set_counts(&self.0, cx.spec, &b).await?;
            // Below the wait's own marks (25 while machines go, 50 once they have nodes), so
            // the undo's progress only rises.
            cx.progress(10, format!("restoring {} control-plane and {} worker machines", b.control_plane, b.workers));
            let nodes = wait_nodes(&self.0, cx.spec, (b.control_plane + b.workers) as usize, asked.shrunk_to(&b), ready_timeout(cx.spec), cx).await?;
            cx.progress(100, format!("restored: {} nodes Ready", nodes.len()));
            Ok(())
        }
        .boxed()
    }
}

/// The `wait` step of a scale.
pub struct ScaleWait(pub(crate) Arc<Inner>);

impl CheckStep<ClusterCommand> for ScaleWait {
    fn name(&self) -> &str {
        WAIT.step()
    }

    fn policy(&self) -> StepPolicy {
        wait_policy(Duration::from_secs(1800))
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let b = before(cx)?;
            let to = target(cx.spec, &b);
            let nodes = wait_nodes(&self.0, cx.spec, (to.control_plane + to.workers) as usize, b.shrunk_to(&to), ready_timeout(cx.spec), cx).await?;
            cx.progress(100, format!("{} nodes Ready", nodes.len()));
            WAIT.value(&ReadyNodes { nodes })
        }
        .boxed()
    }
}

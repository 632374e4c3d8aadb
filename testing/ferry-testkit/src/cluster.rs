//! `ferry dev --demo create-cluster`: a Docker/kubeadm cluster with a CNI and MetalLB,
//! registered with OCM, through Kafka, the create-cluster worker and the emulated Cluster
//! API; then scaled from 2 to 3 workers, then deleted, and the hub checked to hold nothing
//! of it.

use std::time::Duration;

use ferry_kube::kinds::{CapiCluster, ManagedCluster};
use ferry_runtime::report::print_outcome;
use ferry_runtime::{Client, ProgressEvent, SubmitOptions, TaskId, TaskKind};
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{Api, ListParams};
use serde_json::json;

use ferry_cluster::render::{CAPI_CLUSTER_LABEL, CLUSTER_LABEL};
use ferry_cluster::spec::{AddonRequest, ClusterCommand, ClusterOperation, MachinePool, OcmRegistration, WorkerPool};

/// The ManagedClusterSet the demo's cluster joins.
pub const SET: &str = "edge";

/// The demo's cluster: Docker, kubeadm, 1 control-plane and 2 worker machines, a CNI and
/// MetalLB, registered with OCM in [`SET`].
pub fn edge() -> ClusterCommand {
    ClusterCommand {
        name: "edge-1".into(),
        namespace: Some("fleet".into()),
        infrastructure: "docker".into(),
        version: "v1.33.1".into(),
        control_plane: MachinePool { count: Some(1), flavor: None },
        workers: WorkerPool { count: Some(2), flavor: None },
        addons: vec![
            AddonRequest { name: "cni".into(), ..AddonRequest::default() },
            AddonRequest { name: "metallb".into(), params: [("address_pool".to_owned(), "172.18.255.200-172.18.255.250".to_owned())].into() },
        ],
        labels: [("tier".to_owned(), "edge".to_owned())].into(),
        ocm: OcmRegistration { enabled: true, cluster_set: Some(SET.into()) },
        ready_timeout_seconds: Some(300),
        addon_timeout_seconds: Some(120),
        ..ClusterCommand::default()
    }
}

/// A scale of `cmd`'s cluster to `workers` workers.
pub fn scale(cmd: &ClusterCommand, workers: i32) -> ClusterCommand {
    ClusterCommand {
        operation: ClusterOperation::Scale,
        name: cmd.name.clone(),
        namespace: cmd.namespace.clone(),
        workers: WorkerPool { count: Some(workers), flavor: None },
        ..ClusterCommand::default()
    }
}

/// The deletion of `cmd`'s cluster.
pub fn delete(cmd: &ClusterCommand) -> ClusterCommand {
    ClusterCommand { operation: ClusterOperation::Delete, name: cmd.name.clone(), namespace: cmd.namespace.clone(), ..ClusterCommand::default() }
}

/// Creates ManagedClusterSet `set` on the hub (its members: the clusters labelled with it).
pub async fn cluster_set(hub: &kube::Client, set: &str) -> anyhow::Result<()> {
    apply_cluster_set(hub, set, json!({"selectorType": "ExclusiveClusterSetLabel"})).await
}

/// Creates ManagedClusterSet `set` on the hub whose members are the clusters `label_selector`
/// selects (`{}`: every cluster, as the hub's `global` set).
pub async fn label_selector_set(hub: &kube::Client, set: &str, label_selector: serde_json::Value) -> anyhow::Result<()> {
    apply_cluster_set(hub, set, json!({"selectorType": "LabelSelector", "labelSelector": label_selector})).await
}

async fn apply_cluster_set(hub: &kube::Client, set: &str, selector: serde_json::Value) -> anyhow::Result<()> {
    let clusters = ferry_kube::Clusters::new(hub.clone());
    let obj = json!({"apiVersion": "cluster.open-cluster-management.io/v1beta2", "kind": "ManagedClusterSet", "metadata": {"name": set},
        "spec": {"clusterSelector": selector}});
    clusters.apply(ferry_kube::HUB, &obj, "ferry-demo").await?;
    Ok(())
}

/// Submits `cmd` and waits for its final event; returns the task and its events.
pub async fn submit(client: &Client, cmd: &ClusterCommand, wait: Duration) -> anyhow::Result<(TaskId, Vec<ProgressEvent>)> {
    Ok(client.submit_and_wait(TaskKind::CREATE_CLUSTER, &cmd.subject(), cmd, SubmitOptions::default(), wait).await?)
}

/// What of `cmd`'s cluster is on the hub: Cluster API objects labelled for it, its
/// kubeconfig Secret, its ManagedCluster.
pub async fn leftovers(hub: &kube::Client, cmd: &ClusterCommand) -> anyhow::Result<Vec<String>> {
    let mut left = Vec::new();
    let ns = cmd.namespace();
    if Api::<CapiCluster>::namespaced(hub.clone(), ns).get_opt(&cmd.name).await?.is_some() {
        left.push(format!("Cluster {ns}/{}", cmd.name));
    }
    let clusters = ferry_kube::Clusters::new(hub.clone());
    for (group, kind) in [
        ("cluster.x-k8s.io", "MachineDeployment"),
        ("cluster.x-k8s.io", "Machine"),
        ("controlplane.cluster.x-k8s.io", "KubeadmControlPlane"),
        ("bootstrap.cluster.x-k8s.io", "KubeadmConfigTemplate"),
        ("infrastructure.cluster.x-k8s.io", "DockerCluster"),
        ("infrastructure.cluster.x-k8s.io", "DockerMachineTemplate"),
    ] {
        let gvk = kube::core::GroupVersionKind::gvk(group, "v1beta2", kind);
        let Ok(api) = clusters.api(ferry_kube::HUB, &gvk, Some(ns)).await else {
            continue;
        };
        for label in [CLUSTER_LABEL, CAPI_CLUSTER_LABEL] {
            for o in api.list(&ListParams::default().labels(&format!("{label}={}", cmd.name))).await?.items {
                let s = format!("{kind} {ns}/{}", o.metadata.name.unwrap_or_default());
                if !left.contains(&s) {
                    left.push(s);
                }
            }
        }
    }
    let secrets = Api::<Secret>::all(hub.clone()).list(&ListParams::default().labels(&format!("{CAPI_CLUSTER_LABEL}={}", cmd.name))).await?;
    left.extend(secrets.items.into_iter().map(|s| format!("Secret {}/{}", s.metadata.namespace.unwrap_or_default(), s.metadata.name.unwrap_or_default())));
    if let Ok(Some(_)) = Api::<ManagedCluster>::all(hub.clone()).get_opt(&cmd.name).await {
        left.push(format!("ManagedCluster {}", cmd.name));
    }
    Ok(left)
}

async fn ready_nodes(hub: &kube::Client, cluster: &str) -> anyhow::Result<usize> {
    let client = ferry_kube::Clusters::new(hub.clone()).client(cluster).await?;
    let nodes = Api::<Node>::all(client).list(&ListParams::default()).await?;
    Ok(nodes
        .items
        .iter()
        .filter(|n| n.metadata.name.as_deref().is_some_and(|x| x.starts_with(&format!("{cluster}-"))))
        .filter(|n| ferry_kube::kinds::node_ready(n))
        .count())
}

/// Runs the demo against `hub` (with emulated Cluster API and OCM); true when every check
/// passed.
pub async fn run(client: &Client, hub: &kube::Client) -> anyhow::Result<bool> {
    let cmd = edge();
    cluster_set(hub, SET).await?;
    let wait = Duration::from_secs(600);

    let (id, evs) = submit(client, &cmd, wait).await?;
    if !print_outcome("create", id, &evs) {
        return Ok(false);
    }
    let mut ok = true;
    let nodes = ready_nodes(hub, &cmd.name).await?;
    ok &= nodes == 3;
    println!("create: {nodes} Ready nodes in {}: {}", cmd.name, if nodes == 3 { "ok" } else { "MISMATCH" });
    let mc = Api::<ManagedCluster>::all(hub.clone()).get_opt(&cmd.name).await?;
    let available = mc.as_ref().and_then(|m| m.condition("ManagedClusterConditionAvailable")) == Some("True");
    ok &= available;
    println!("create: ManagedCluster {} available: {}", cmd.name, if available { "ok" } else { "MISMATCH" });

    let (id, evs) = submit(client, &scale(&cmd, 3), wait).await?;
    ok &= print_outcome("scale", id, &evs);
    let nodes = ready_nodes(hub, &cmd.name).await?;
    ok &= nodes == 4;
    println!("scale: {nodes} Ready nodes: {}", if nodes == 4 { "ok" } else { "MISMATCH" });

    let (id, evs) = submit(client, &delete(&cmd), wait).await?;
    ok &= print_outcome("delete", id, &evs);
    let left = leftovers(hub, &cmd).await?;
    println!("delete: left behind on the hub {}: {}", crate::listing(&left), if left.is_empty() { "ok" } else { "MISMATCH" });
    ok &= left.is_empty();
    println!("create-cluster: {}", if ok { "created with add-ons and registered, scaled, deleted without a trace" } else { "FAILED" });
    Ok(ok)
}

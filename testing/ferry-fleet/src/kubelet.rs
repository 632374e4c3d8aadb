//! The emulated node agent of one cluster, the way kwok does it: registers Nodes of a given
//! flavor (the real scheduler then binds Pods within their allocatable), marks bound Pods
//! Running and Ready after a start delay, completes the Pods of Jobs, and confirms the
//! deletion of terminating Pods (so namespaces and foreground deletions finish).
//!
//! No container runs: a Pod is "running" because its status says so, which is what
//! Deployments, Jobs, the scheduler and Ferry's workers look at.
//!
//! A kubeadm node has no pod network until a CNI runs ([`Kubelet::require_cni`]): as the
//! kubelet does (`pkg/kubelet/kubelet_node_status.go`, the runtime's `NetworkReady`
//! condition), it reports `Ready=False` with `NetworkPluginNotReady` and keeps the
//! `node.kubernetes.io/not-ready:NoSchedule` taint; only host-network Pods start on it.
//! The network comes up when a Pod on the node that mounts the CNI configuration
//! directory (`hostPath` [`CNI_CONF_DIR`], as calico-node, flannel and cilium do) runs;
//! the Cluster API quick start's "Deploy a CNI solution" step
//! (`docs/book/src/user/quick-start.md`) is this.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tokio::task::JoinHandle;

/// The shape of the emulated nodes.
#[derive(Debug, Clone)]
pub struct NodeFlavor {
    /// Allocatable CPU (Kubernetes quantity, e.g. "4").
    pub cpu: String,
    /// Allocatable memory (e.g. "8Gi").
    pub memory: String,
    /// Allocatable pods.
    pub pods: u32,
    /// Extra node labels.
    pub labels: BTreeMap<String, String>,
    /// Node taints, e.g. `dedicated=gpu:NoSchedule`.
    pub taints: Vec<k8s_openapi::api::core::v1::Taint>,
}

impl Default for NodeFlavor {
    fn default() -> Self {
        Self { cpu: "4".into(), memory: "8Gi".into(), pods: 110, labels: BTreeMap::new(), taints: Vec::new() }
    }
}

/// How often nodes report (the kubelet's default node-status update period is 10 s).
const HEARTBEAT: Duration = Duration::from_secs(10);

/// Where a CNI plugin writes its configuration on the host.
pub const CNI_CONF_DIR: &str = "/etc/cni/net.d";

/// The kubelet's Ready message while the runtime has no pod network.
pub const NETWORK_NOT_READY: &str =
    "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized";

/// The taint a node carries while it is not Ready.
const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";

/// The pod network of the kubelet's nodes.
#[derive(Debug, Default)]
struct Network {
    /// Nodes need a CNI (kubeadm); otherwise every node has a network from the start.
    required: bool,
    /// Nodes whose CNI runs.
    ready: HashSet<String>,
    /// Pods waiting for their node's network, by node.
    waiting: std::collections::HashMap<String, Vec<Pod>>,
    /// Nodes' own taints (their flavor's), restored when the network comes up.
    taints: std::collections::HashMap<String, Vec<k8s_openapi::api::core::v1::Taint>>,
}

impl Network {
    fn up(&self, node: &str) -> bool {
        !self.required || self.ready.contains(node)
    }
}

/// The Ready condition of a node whose network is `up` or not.
fn ready_condition(up: bool, now: &str) -> serde_json::Value {
    if up {
        json!({"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "emulated by ferry-fleet", "lastHeartbeatTime": now})
    } else {
        json!({"type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": NETWORK_NOT_READY, "lastHeartbeatTime": now})
    }
}

/// Why the kubelet could not act.
#[derive(Debug, thiserror::Error)]
#[error("emulated kubelet of {cluster}: {what}: {source}")]
pub struct KubeletError {
    cluster: String,
    what: String,
    #[source]
    source: kube::Error,
}

/// Waits until Pods can be created in `namespace` without naming a service account.
///
/// The test bed's Kubernetes (v1.20) runs the `ServiceAccount` admission plugin with
/// `RequireAPIToken` (`plugin/pkg/admission/serviceaccount/admission.go`): a Pod is refused
/// with a `ServerTimeout` ("No API token found for service account \"default\"") until the
/// token controller has made the default account's token Secret and listed it on the
/// account. A Deployment's controller retries that; a client creating a Pod itself waits
/// here first. The plugin reads both through informers, so the Secret is also read back.
pub async fn await_pod_admission(client: &kube::Client, namespace: &str) -> Result<(), kube::runtime::wait::Error> {
    use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let has_token = |o: Option<&ServiceAccount>| o.and_then(|a| a.secrets.as_ref()).is_some_and(|s| !s.is_empty());
    let account = kube::runtime::wait::await_condition(accounts, "default", has_token).await?;
    for name in account.and_then(|a| a.secrets).unwrap_or_default().into_iter().filter_map(|r| r.name) {
        kube::runtime::wait::await_condition(secrets.clone(), &name, |o: Option<&Secret>| o.is_some()).await?;
    }
    Ok(())
}

/// A running emulated kubelet; stops when dropped.
pub struct Kubelet {
    cluster: String,
    client: kube::Client,
    nodes: Arc<Mutex<HashSet<String>>>,
    crashing: Arc<Mutex<Vec<String>>>,
    network: Arc<Mutex<Network>>,
    pods: Pods,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for Kubelet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kubelet").field("cluster", &self.cluster).finish()
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Kubelet {
    /// Starts the pod loop of `cluster`; add nodes with [`Self::add_nodes`].
    pub fn start(cluster: &str, client: kube::Client, start_delay: Duration) -> Self {
        let nodes = Arc::new(Mutex::new(HashSet::new()));
        let crashing: Arc<Mutex<Vec<String>>> = Arc::default();
        let network: Arc<Mutex<Network>> = Arc::default();
        let shared = Pods { client: client.clone(), nodes: nodes.clone(), crashing: crashing.clone(), network: network.clone(), delay: start_delay, started: Arc::default() };
        let pods = pod_loop(shared.clone());
        let services = service_loop(client.clone(), lb_prefix(cluster));
        let beats = heartbeat_loop(client.clone(), nodes.clone(), network.clone());
        let task = tokio::spawn(async move {
            tokio::join!(pods, services, beats);
        });
        Self { cluster: cluster.to_owned(), client, nodes, crashing, network, pods: shared, task }
    }

    /// Nodes added from now on have no pod network until a CNI runs on them (kubeadm's
    /// nodes; k3s and kind ship one).
    pub fn require_cni(&self) {
        self.network.lock().expect("network lock").required = true;
    }

    fn err(&self, what: impl Into<String>) -> impl FnOnce(kube::Error) -> KubeletError + '_ {
        let what = what.into();
        move |source| KubeletError { cluster: self.cluster.clone(), what, source }
    }

    /// The client of the API server its nodes register with.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// Registers `count` Ready nodes of `flavor` named `<cluster>-<prefix>-<i>`.
    pub async fn add_nodes(&self, prefix: &str, count: usize, flavor: &NodeFlavor) -> Result<Vec<String>, KubeletError> {
        let api: Api<Node> = Api::all(self.client.clone());
        let mut names = Vec::new();
        for i in 0..count {
            let name = format!("{}-{prefix}-{i}", self.cluster);
            let mut labels = flavor.labels.clone();
            labels.insert("kubernetes.io/hostname".into(), name.clone());
            labels.insert("ferry.dev/emulated".into(), "true".into());
            let node: Node = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": labels},
            }))
            .expect("valid node");
            crate::emulate::present(api.create(&PostParams::default(), &node).await).map_err(self.err(format!("creating node {name}")))?;
            let now = chrono_now();
            let up = {
                let mut net = self.network.lock().expect("network lock");
                net.taints.insert(name.clone(), flavor.taints.clone());
                net.up(&name)
            };
            let mut ready = ready_condition(up, &now);
            ready["lastTransitionTime"] = json!(now);
            let status = json!({"status": {
                "capacity": {"cpu": flavor.cpu, "memory": flavor.memory, "pods": flavor.pods.to_string()},
                "allocatable": {"cpu": flavor.cpu, "memory": flavor.memory, "pods": flavor.pods.to_string()},
                "conditions": [ready],
                "nodeInfo": {"kubeletVersion": "v1.20.2-ferry", "kubeProxyVersion": "", "architecture": "amd64",
                    "operatingSystem": "linux", "osImage": "emulated", "kernelVersion": "", "containerRuntimeVersion": "emulated://1",
                    "machineID": "", "systemUUID": "", "bootID": ""},
            }});
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                .await
                .map_err(self.err(format!("setting status of node {name}")))?;
            // Admission tainted the new node not-ready; once ready, the flavor's taints only.
            let mut taints = flavor.taints.clone();
            if !up {
                taints.push(k8s_openapi::api::core::v1::Taint { key: NOT_READY_TAINT.into(), effect: "NoSchedule".into(), ..Default::default() });
            }
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&json!({"spec": {"taints": taints}})))
                .await
                .map_err(self.err(format!("setting the taints of node {name}")))?;
            self.nodes.lock().expect("nodes lock").insert(name.clone());
            // Pods bound while the node registered (a DaemonSet's, at once) passed the
            // watch before the node was ours: a kubelet syncs what is bound to it on start.
            let bound = Api::<Pod>::all(self.client.clone())
                .list(&kube::api::ListParams::default().fields(&format!("spec.nodeName={name}")))
                .await
                .map_err(self.err(format!("listing the pods bound to node {name}")))?;
            for pod in bound.items {
                admit(&self.pods, pod).await;
            }
            names.push(name);
        }
        Ok(names)
    }

    /// Containers whose image starts with one of `prefixes` crash-loop from now on: Running
    /// but never Ready, waiting in `CrashLoopBackOff` (a failing add-on, a bad release).
    pub fn crash_images(&self, prefixes: Vec<String>) {
        *self.crashing.lock().expect("crashing lock") = prefixes;
    }

    /// Removes nodes (their Pods are left to the controllers, as after a node loss).
    pub async fn remove_nodes(&self, names: &[String]) -> Result<(), KubeletError> {
        let api: Api<Node> = Api::all(self.client.clone());
        for n in names {
            match api.delete(n, &Default::default()).await {
                Ok(_) | Err(kube::Error::Api(_)) => {}
                Err(e) => return Err(self.err(format!("deleting node {n}"))(e)),
            }
            self.nodes.lock().expect("nodes lock").remove(n);
        }
        Ok(())
    }
}

/// Renews the Ready condition's heartbeat of every node, as a kubelet does.
async fn heartbeat_loop(client: kube::Client, nodes: Arc<Mutex<HashSet<String>>>, network: Arc<Mutex<Network>>) {
    let api: Api<Node> = Api::all(client);
    let mut ticks = tokio::time::interval(HEARTBEAT);
    loop {
        ticks.tick().await;
        let names: Vec<String> = nodes.lock().expect("nodes lock").iter().cloned().collect();
        let now = chrono_now();
        for n in names {
            let up = network.lock().expect("network lock").up(&n);
            // A strategic merge keyed by condition type updates only Ready.
            let patch = json!({"status": {"conditions": [ready_condition(up, &now)]}});
            if let Err(e) = api.patch_status(&n, &PatchParams::default(), &Patch::Strategic(&patch)).await {
                tracing::debug!(node = %n, error = %e, "heartbeat not written");
            }
        }
    }
}

/// The node's pod network is up: Ready, its own taints only, and the Pods that waited
/// for it start.
async fn network_up(p: &Pods, node: &str) {
    let (waiting, taints) = {
        let mut net = p.network.lock().expect("network lock");
        if !net.ready.insert(node.to_owned()) {
            return;
        }
        (net.waiting.remove(node).unwrap_or_default(), net.taints.get(node).cloned().unwrap_or_default())
    };
    let api: Api<Node> = Api::all(p.client.clone());
    let now = chrono_now();
    let mut ready = ready_condition(true, &now);
    ready["lastTransitionTime"] = json!(now);
    if let Err(e) = api.patch_status(node, &PatchParams::default(), &Patch::Strategic(&json!({"status": {"conditions": [ready]}}))).await {
        tracing::debug!(node, error = %e, "Ready not written; the heartbeat writes it");
    }
    if let Err(e) = api.patch(node, &PatchParams::default(), &Patch::Merge(&json!({"spec": {"taints": taints}}))).await {
        tracing::warn!(node, error = %e, "the not-ready taint stays");
    }
    tracing::info!(node, pods = waiting.len(), "the CNI runs: the node is Ready");
    for pod in waiting {
        start(p, pod, node.to_owned());
    }
}

/// The Pod mounts the CNI configuration directory from the host (a CNI's node agent).
fn is_cni_agent(pod: &Pod) -> bool {
    pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()).any(|v| v.host_path.as_ref().is_some_and(|h| h.path.trim_end_matches('/') == CNI_CONF_DIR))
}

/// A per-cluster address block for emulated LoadBalancer IPs (TEST-NET-3, never routed).
fn lb_prefix(cluster: &str) -> String {
    let n = cluster.bytes().fold(0u32, |a, b| a.wrapping_mul(31).wrapping_add(u32::from(b))) % 250;
    format!("203.0.113.{}", n + 1)
}

/// Gives LoadBalancer Services an ingress address, as a cloud controller would.
async fn service_loop(client: kube::Client, prefix: String) {
    use k8s_openapi::api::core::v1::Service;
    let api: Api<Service> = Api::all(client.clone());
    let mut services = watcher(api, watcher::Config::default()).default_backoff().applied_objects().boxed();
    while let Some(ev) = services.next().await {
        let Ok(svc) = ev else { continue };
        let is_lb = svc.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer");
        let has_ip = svc.status.as_ref().and_then(|s| s.load_balancer.as_ref()).and_then(|l| l.ingress.as_ref()).is_some_and(|i| !i.is_empty());
        let (Some(ns), Some(name)) = (svc.metadata.namespace.clone(), svc.metadata.name.clone()) else { continue };
        if !is_lb || has_ip {
            continue;
        }
        // One address per cluster in this emulation: the last octet is fixed per cluster.
        let status = json!({"status": {"loadBalancer": {"ingress": [{"ip": prefix}]}}});
        let api: Api<Service> = Api::namespaced(client.clone(), &ns);
        if let Err(e) = api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await {
            tracing::debug!(service = %name, error = %e, "load balancer address not set");
        }
    }
}

fn chrono_now() -> String {
    k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// What the pod loop shares with the Pods it starts.
#[derive(Clone)]
struct Pods {
    client: kube::Client,
    nodes: Arc<Mutex<HashSet<String>>>,
    crashing: Arc<Mutex<Vec<String>>>,
    network: Arc<Mutex<Network>>,
    delay: Duration,
    /// Uids of the Pods started (or waiting for their network).
    started: Arc<Mutex<HashSet<String>>>,
}

async fn pod_loop(p: Pods) {
    let api: Api<Pod> = Api::all(p.client.clone());
    let mut pods = watcher(api.clone(), watcher::Config::default()).default_backoff().applied_objects().boxed();
    while let Some(ev) = pods.next().await {
        let Ok(pod) = ev else { continue };
        admit(&p, pod).await;
    }
}

/// What the kubelet does with a Pod it sees: confirms the deletion of one terminating on
/// its node, starts a Pending one bound to its node (or keeps it waiting for the node's
/// pod network); ignores the rest.
async fn admit(p: &Pods, pod: Pod) {
    let (Some(ns), Some(name), Some(uid)) = (pod.metadata.namespace.clone(), pod.metadata.name.clone(), pod.metadata.uid.clone()) else { return };
    let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else { return };
    let phase = pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
    let ours = p.nodes.lock().expect("nodes lock").contains(&node);
    if ours && pod.metadata.deletion_timestamp.is_some() {
        // The containers "stopped": confirm the graceful deletion, as a kubelet does.
        let api = Api::<Pod>::namespaced(p.client.clone(), &ns);
        let dp = kube::api::DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
        if let Err(e) = api.delete(&name, &dp).await {
            tracing::debug!(pod = %name, error = %e, "terminating pod not removed; retried on the next event");
        }
        return;
    }
    if phase != "Pending" || !ours {
        return;
    }
    if !p.started.lock().expect("started lock").insert(uid) {
        return;
    }
    // Without a pod network only host-network Pods get a sandbox; the rest wait.
    let host_network = pod.spec.as_ref().and_then(|s| s.host_network).unwrap_or(false);
    {
        let mut net = p.network.lock().expect("network lock");
        if !host_network && !net.up(&node) {
            net.waiting.entry(node).or_default().push(pod);
            return;
        }
    }
    start(p, pod, node);
}

/// Starts `pod` on `node` after the start delay; a CNI agent brings the node's network up.
fn start(p: &Pods, pod: Pod, node: String) {
    let (Some(ns), Some(name)) = (pod.metadata.namespace.clone(), pod.metadata.name.clone()) else { return };
    let is_job = pod.metadata.owner_references.iter().flatten().any(|o| o.kind == "Job");
    let api = Api::<Pod>::namespaced(p.client.clone(), &ns);
    let crashing = p.crashing.lock().expect("crashing lock").clone();
    let p = p.clone();
    tokio::spawn(async move {
        // The emulated container start time.
        tokio::time::sleep(p.delay).await;
        let patch = pod_status(&pod, &node, is_job, &crashing);
        match api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) if is_cni_agent(&pod) => network_up(&p, &node).await,
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(pod = %name, error = %e, "pod status not set; retried on the next event");
                if let Some(uid) = &pod.metadata.uid {
                    p.started.lock().expect("started lock").remove(uid);
                }
            }
        }
    });
}

fn pod_status(pod: &Pod, node: &str, completed: bool, crashing: &[String]) -> serde_json::Value {
    let now = chrono_now();
    let crashes = |c: &k8s_openapi::api::core::v1::Container| crashing.iter().any(|p| c.image.as_deref().unwrap_or("").starts_with(p.as_str()));
    let any_crash = pod.spec.iter().flat_map(|s| s.containers.iter()).any(crashes);
    let containers: Vec<serde_json::Value> = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .map(|c| {
            let crash = crashes(c);
            let state = if crash {
                json!({"waiting": {"reason": "CrashLoopBackOff", "message": "back-off restarting failed container (emulated)"}})
            } else if completed {
                json!({"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}})
            } else {
                json!({"running": {"startedAt": now}})
            };
            let up = !completed && !crash;
            json!({"name": c.name, "ready": up, "started": up, "restartCount": if crash { 5 } else { 0 },
                   "image": c.image.clone().unwrap_or_default(), "imageID": "", "state": state})
        })
        .collect();
    let ready = if completed || any_crash { "False" } else { "True" };
    let cond = |t: &str, s: &str| json!({"type": t, "status": s, "lastTransitionTime": now});
    json!({"status": {
        "phase": if completed { "Succeeded" } else { "Running" },
        "hostIP": "10.0.0.1",
        "podIP": format!("10.244.{}.{}", node.len() % 250, (pod.metadata.name.as_deref().unwrap_or("").len() * 7) % 250 + 2),
        "startTime": now,
        "conditions": [cond("Initialized", "True"), cond("PodScheduled", "True"), cond("ContainersReady", ready), cond("Ready", ready)],
        "containerStatuses": containers,
    }})
}

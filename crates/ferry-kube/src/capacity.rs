//! A cluster's capacity as the scheduler sees it: its Nodes and Pods turned into a
//! [`ClusterLoad`] (scoring, placement checks and bursts all measure with it), counting what the
//! scheduler counts. A pod's request is, per resource, the larger of its largest init
//! container and the sum of its app containers, plus its overhead; finished pods
//! (Succeeded, Failed) and pods not bound to a node request nothing.

use std::collections::HashMap;

use crate::quantity;
use k8s_openapi::api::core::v1::{Container, Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::BTreeMap;



/// One node as the scheduler sees it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NodeLoad {
    /// The node.
    pub name: String,
    /// None when pods can be scheduled on it; otherwise why not (unschedulable, not
    /// Ready, a NoSchedule/NoExecute taint).
    pub excluded: Option<String>,
    /// Allocatable CPU, millicores.
    pub cpu_allocatable: i64,
    /// Allocatable memory, bytes.
    pub mem_allocatable: i64,
    /// CPU requested by the unfinished pods on it, millicores.
    pub cpu_requested: i64,
    /// Memory requested by the unfinished pods on it, bytes.
    pub mem_requested: i64,
}

impl NodeLoad {
    /// Free CPU (negative when over-committed), millicores.
    pub fn cpu_free(&self) -> i64 {
        self.cpu_allocatable - self.cpu_requested
    }

    /// Free memory (negative when over-committed), bytes.
    pub fn mem_free(&self) -> i64 {
        self.mem_allocatable - self.mem_requested
    }
}

/// One cluster's nodes.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct ClusterLoad {
    /// The cluster.
    pub cluster: String,
    /// Its nodes.
    pub nodes: Vec<NodeLoad>,
}

impl ClusterLoad {
    /// The nodes pods can be scheduled on.
    pub fn schedulable(&self) -> impl Iterator<Item = &NodeLoad> {
        self.nodes.iter().filter(|n| n.excluded.is_none())
    }

    /// Free CPU (millicores) and memory (bytes) summed over schedulable nodes; negative
    /// when the cluster is over-committed.
    pub fn available(&self) -> (i64, i64) {
        self.schedulable().fold((0, 0), |(c, m), n| (c + n.cpu_free(), m + n.mem_free()))
    }

    /// How many replicas of `cpu` millicores and `mem` bytes fit, node by node (mck8s):
    /// the sum over schedulable nodes of `min(floor(cpu free / cpu), floor(mem free / mem))`.
    /// A zero request does not limit; both zero is refused by validation.
    pub fn replicas_that_fit(&self, cpu: i64, mem: i64) -> i64 {
        let per = |free: i64, req: i64| if req <= 0 { i64::MAX } else { free.max(0) / req };
        self.schedulable().map(|n| per(n.cpu_free(), cpu).min(per(n.mem_free(), mem))).map(|k| k.min(1 << 40)).sum()
    }

    /// "; not counted: node (why), ..." for the nodes left out, or nothing.
    pub fn excluded_note(&self) -> String {
        let excluded: Vec<String> =
            self.nodes.iter().filter_map(|n| n.excluded.as_ref().map(|w| format!("{} ({w})", n.name))).collect();
        if excluded.is_empty() { String::new() } else { format!("; not counted: {}", excluded.join(", ")) }
    }
}

/// A quantity in an object that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{object}: {source}")]
pub struct BadQuantity {
    /// Which object and field.
    pub object: String,
    /// The parse error.
    #[source]
    pub source: quantity::QuantityError,
}

fn get(map: Option<&BTreeMap<String, Quantity>>, key: &str, cpu: bool, object: &str) -> Result<i64, BadQuantity> {
    let Some(q) = map.and_then(|m| m.get(key)) else { return Ok(0) };
    let r = if cpu { quantity::millicores(&q.0) } else { quantity::units(&q.0) };
    r.map_err(|source| BadQuantity { object: format!("{object} {key}"), source })
}

fn container_requests(c: &Container, object: &str) -> Result<(i64, i64), BadQuantity> {
    let req = c.resources.as_ref().and_then(|r| r.requests.as_ref());
    let what = format!("{object} container {}", c.name);
    Ok((get(req, "cpu", true, &what)?, get(req, "memory", false, &what)?))
}

/// What `pod` requests of CPU (millicores) and memory (bytes), as the scheduler counts it.
pub fn pod_requests(pod: &Pod) -> Result<(i64, i64), BadQuantity> {
    let object = format!("pod {}/{}", pod.metadata.namespace.as_deref().unwrap_or(""), pod.metadata.name.as_deref().unwrap_or(""));
    let Some(spec) = &pod.spec else { return Ok((0, 0)) };
    let (mut cpu, mut mem) = (0, 0);
    for c in &spec.containers {
        let (c, m) = container_requests(c, &object)?;
        cpu += c;
        mem += m;
    }
    for c in spec.init_containers.iter().flatten() {
        let (c, m) = container_requests(c, &object)?;
        cpu = cpu.max(c);
        mem = mem.max(m);
    }
    let overhead = spec.overhead.as_ref();
    cpu += get(overhead, "cpu", true, &format!("{object} overhead"))?;
    mem += get(overhead, "memory", false, &format!("{object} overhead"))?;
    Ok((cpu, mem))
}

/// Why pods cannot be scheduled on `node`, if they cannot.
pub fn excluded(node: &Node) -> Option<String> {
    let spec = node.spec.as_ref();
    if spec.and_then(|s| s.unschedulable) == Some(true) {
        return Some("unschedulable".into());
    }
    if let Some(t) = spec.and_then(|s| s.taints.as_ref()).into_iter().flatten().find(|t| t.effect == "NoSchedule" || t.effect == "NoExecute") {
        return Some(format!("taint {}{}:{}", t.key, t.value.as_deref().map(|v| format!("={v}")).unwrap_or_default(), t.effect));
    }
    let ready = node.status.as_ref().and_then(|s| s.conditions.as_ref()).into_iter().flatten().find(|c| c.type_ == "Ready");
    match ready {
        Some(c) if c.status == "True" => None,
        Some(c) => Some(format!("not Ready ({})", c.reason.as_deref().unwrap_or(&c.status))),
        None => Some("no Ready condition".into()),
    }
}

/// The load of `cluster` from its nodes and pods.
pub fn load(cluster: &str, nodes: &[Node], pods: &[Pod]) -> Result<ClusterLoad, BadQuantity> {
    let mut requested: HashMap<&str, (i64, i64)> = HashMap::new();
    for p in pods {
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            continue;
        }
        let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.as_deref()) else { continue };
        let (c, m) = pod_requests(p)?;
        let e = requested.entry(node).or_default();
        e.0 += c;
        e.1 += m;
    }
    let mut out = Vec::new();
    for n in nodes {
        let name = n.metadata.name.clone().unwrap_or_default();
        let status = n.status.as_ref();
        let alloc = status.and_then(|s| s.allocatable.as_ref()).or_else(|| status.and_then(|s| s.capacity.as_ref()));
        let object = format!("node {name} allocatable");
        let (cr, mr) = requested.get(name.as_str()).copied().unwrap_or_default();
        out.push(NodeLoad {
            excluded: excluded(n),
            cpu_allocatable: get(alloc, "cpu", true, &object)?,
            mem_allocatable: get(alloc, "memory", false, &object)?,
            cpu_requested: cr,
            mem_requested: mr,
            name,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(ClusterLoad { cluster: cluster.to_owned(), nodes: out })
}

/// Measures `cluster` through `clusters`: lists its Nodes and Pods and counts them with
/// [`load`]. The error names what failed, for a step's message.
pub async fn measure(clusters: &crate::Clusters, cluster: &str) -> Result<ClusterLoad, String> {
    use k8s_openapi::api::core::v1::{Node, Pod};
    use kube::api::{Api, ListParams};
    let client = clusters.client(cluster).await.map_err(|e| e.to_string())?;
    let nodes = Api::<Node>::all(client.clone()).list(&ListParams::default()).await.map_err(|e| format!("listing nodes: {}", crate::said::said(&e)))?;
    let pods = Api::<Pod>::all(client).list(&ListParams::default()).await.map_err(|e| format!("listing pods: {}", crate::said::said(&e)))?;
    load(cluster, &nodes.items, &pods.items).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    fn c(name: &str, cpu: &str, mem: &str) -> serde_json::Value {
        json!({"name": name, "image": "x", "resources": {"requests": {"cpu": cpu, "memory": mem}}})
    }

    #[test]
    fn init_containers_count_as_the_scheduler_counts_them() {
        // (containers, init containers, expected cpu m, expected bytes)
        let table = [
            (vec![c("a", "100m", "64Mi"), c("b", "200m", "64Mi")], vec![], 300, 128 << 20),
            // The largest init container dominates when larger than the app sum.
            (vec![c("a", "100m", "64Mi")], vec![c("i1", "1", "32Mi"), c("i2", "500m", "1Gi")], 1000, 1 << 30),
            // The app sum dominates when larger.
            (vec![c("a", "1", "1Gi"), c("b", "1", "1Gi")], vec![c("i", "1500m", "1Gi")], 2000, 2 << 30),
            // Quantities in every notation: 0.5 cores, 1e9 bytes.
            (vec![c("a", "0.5", "1e9")], vec![], 500, 1_000_000_000),
        ];
        for (containers, inits, cpu, mem) in table {
            let p = pod(json!({"metadata": {"name": "p"}, "spec": {"containers": containers, "initContainers": inits, "nodeName": "n"}}));
            assert_eq!(pod_requests(&p).unwrap(), (cpu, mem));
        }
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {"containers": [c("a", "100m", "1Mi")], "overhead": {"cpu": "50m", "memory": "1Mi"}}}));
        assert_eq!(pod_requests(&p).unwrap(), (150, 2 << 20), "overhead is added");
        let bad = pod(json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": {"containers": [c("a", "lots", "1Mi")]}}));
        let e = pod_requests(&bad).unwrap_err();
        assert!(e.to_string().contains("pod ns/p container a cpu"), "{e}");
    }

    #[test]
    fn load_skips_finished_and_unbound_pods_and_marks_excluded_nodes() {
        let node = |name: &str, extra: serde_json::Value| -> Node {
            let mut n = json!({"metadata": {"name": name}, "status": {"allocatable": {"cpu": "4", "memory": "8Gi"},
                "conditions": [{"type": "Ready", "status": "True"}]}});
            if let Some(spec) = extra.get("spec") { n["spec"] = spec.clone(); }
            if let Some(st) = extra.get("ready") { n["status"]["conditions"][0]["status"] = st.clone(); }
            serde_json::from_value(n).unwrap()
        };
        let nodes = [
            node("a", json!({})),
            node("b", json!({"spec": {"taints": [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]}})),
            node("c", json!({"spec": {"unschedulable": true}})),
            node("d", json!({"ready": "False"})),
            node("e", json!({"spec": {"taints": [{"key": "soft", "effect": "PreferNoSchedule"}]}})),
        ];
        let on = |n: &str, phase: &str| pod(json!({"metadata": {"name": "p"}, "spec": {"nodeName": n, "containers": [c("x", "1", "1Gi")]}, "status": {"phase": phase}}));
        let pods = [on("a", "Running"), on("a", "Succeeded"), on("a", "Failed"), on("a", "Pending"),
            pod(json!({"metadata": {"name": "unbound"}, "spec": {"containers": [c("x", "1", "1Gi")]}}))];
        let l = load("k", &nodes, &pods).unwrap();
        let a = &l.nodes[0];
        assert_eq!((a.cpu_requested, a.mem_requested), (2000, 2 << 30), "running + pending bound pods count");
        let why: Vec<Option<&str>> = l.nodes.iter().map(|n| n.excluded.as_deref()).collect();
        assert_eq!(why, [None, Some("taint gpu=yes:NoSchedule"), Some("unschedulable"), Some("not Ready (False)"), None]);
        assert_eq!(l.available(), (2000 + 4000, (6 << 30) + (8 << 30)));
    }
}


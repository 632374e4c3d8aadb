//! Emulated Cluster API against the hub: plays the core, kubeadm control-plane and
//! infrastructure providers' part. A `Cluster` moves through the real phases and
//! conditions (Pending → Provisioning with `InfrastructureReady` → Provisioned with the
//! control plane initialized); then a workload cluster appears in the test bed (a real
//! API server with a controller manager and scheduler, or, past
//! [`CapiOptions::real_api_servers`], a lightweight virtual one sharing a backing API
//! server), its `<name>-kubeconfig` Secret is written, and emulated nodes of the requested
//! count and flavor register, each with its `Machine` on the hub. Replica changes of the
//! control plane or a MachineDeployment add nodes, or delete Machines, whose nodes are
//! drained first as upstream's machine controller does ([`drain_machines`]); deleting a
//! Cluster removes its workload cluster, Machines and Secret after a delay (no drain).
//! [`CapiKnobs`] set delays, a cluster that never becomes ready and crash-looping images
//! (a failing add-on).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::emulate::now;
use crate::wake::Wake;
use crate::fleet::{ClusterSpawner, kubeconfig_secret_owned};
use crate::{Cluster, Fleet, FleetError, Kubelet, NodeFlavor};

/// Finalizer the emulator keeps on Clusters until their workload cluster is gone.
pub const FINALIZER: &str = "cluster.cluster.x-k8s.io";
/// Field manager of the emulator's writes.
const MANAGER: &str = "ferry-emulated-capi";
/// Label of a Cluster's objects (Machines, Secrets).
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
/// The machine controller's finalizer on every Machine (`api/core/v1beta2/machine_types.go`
/// `MachineFinalizer`): a deleted Machine stays until its node is drained and deleted.
pub const MACHINE_FINALIZER: &str = "machine.cluster.x-k8s.io";

/// Behaviour of the emulated providers for one cluster.
#[derive(Debug, Clone)]
pub struct CapiKnobs {
    /// From creation to infrastructure provisioned; the control plane takes as long again.
    pub provision_delay: Duration,
    /// The infrastructure provisions but the control plane never initializes.
    pub never_ready: bool,
    /// From the deletion request to the Cluster being gone.
    pub deletion_delay: Duration,
    /// Images (prefixes) whose containers crash-loop in the workload cluster.
    pub crashing_images: Vec<String>,
    /// How long a Machine whose node's drain is not done waits for the next try (upstream:
    /// 20 s, `drainRetryInterval`; shortened as the other delays are).
    pub drain_retry: Duration,
}

impl Default for CapiKnobs {
    fn default() -> Self {
        Self {
            provision_delay: Duration::from_millis(500),
            never_ready: false,
            deletion_delay: Duration::from_millis(300),
            crashing_images: Vec::new(),
            drain_retry: Duration::from_secs(1),
        }
    }
}

/// How the emulator builds workload clusters.
#[derive(Debug, Clone)]
pub struct CapiOptions {
    /// Workload clusters with their own API server (about 500 MB each with controllers);
    /// the rest are virtual: they share one backing API server, kept apart by node names.
    pub real_api_servers: usize,
    /// Node shape by machine flavor name (OpenStack `flavor`); unknown flavors get the default.
    pub flavors: BTreeMap<String, NodeFlavor>,
    /// kubeadm nodes come with a pod network, as when a ClusterResourceSet or the machine
    /// image installs the CNI; otherwise (the default) they stay NotReady until one runs.
    pub cni_with_cluster: bool,
}

impl Default for CapiOptions {
    fn default() -> Self {
        let f = |cpu: &str, memory: &str| NodeFlavor { cpu: cpu.into(), memory: memory.into(), ..NodeFlavor::default() };
        let flavors = [("m1.small", f("1", "2Gi")), ("m1.medium", f("2", "4Gi")), ("m1.large", f("4", "8Gi")), ("m1.xlarge", f("8", "16Gi"))]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        Self { real_api_servers: 2, flavors, cni_with_cluster: false }
    }
}

/// A workload cluster the emulator made.
struct Workload {
    _server: Option<Cluster>,
    kubelet: Kubelet,
    /// Its client for evictions ([`Cluster::evicting_client`]).
    evictor: kube::Client,
    /// Node pool → node count.
    pools: HashMap<String, usize>,
    uid: String,
}

impl Drop for Workload {
    /// Its API server stops with it: its kubeconfig goes too, so that `ferry fleet` (which
    /// lists the fleet folders that have one) no longer shows it; its logs stay.
    fn drop(&mut self) {
        if let Some(server) = &self._server {
            let _ = std::fs::remove_file(&server.kubeconfig);
        }
    }
}

#[derive(Default)]
struct State {
    first_seen: HashMap<String, Instant>,
    deleting_since: HashMap<String, Instant>,
    workloads: HashMap<String, Workload>,
    virtual_backing: Option<Arc<Cluster>>,
    real_started: usize,
}

/// Emulated Cluster API on a fleet's hub; stops (and removes its workload clusters) on drop.
pub struct EmulatedCapi {
    state: Arc<tokio::sync::Mutex<State>>,
    knobs: Arc<Mutex<(CapiKnobs, HashMap<String, CapiKnobs>)>>,
    /// The loop's wake, poked when a knob changes.
    wake: Arc<Wake>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for EmulatedCapi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmulatedCapi").finish_non_exhaustive()
    }
}

impl Drop for EmulatedCapi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A v1beta2 kind of `group`, its plural as kube derives it (ClusterClass: clusterclasses).
fn gvk(group: &str, kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, "v1beta2", kind))
}

struct Ctx {
    hub: kube::Client,
    spawner: ClusterSpawner,
    opts: CapiOptions,
    knobs: Arc<Mutex<(CapiKnobs, HashMap<String, CapiKnobs>)>>,
    wake: Arc<Wake>,
}

impl EmulatedCapi {
    /// Starts the providers' loop on `fleet`'s hub.
    pub async fn start(fleet: &Fleet, opts: CapiOptions) -> Result<Self, FleetError> {
        let hub = fleet.hub().client().await?;
        let knobs: Arc<Mutex<(CapiKnobs, HashMap<String, CapiKnobs>)>> = Arc::default();
        let state: Arc<tokio::sync::Mutex<State>> = Arc::default();
        // What the providers' controllers watch. The infrastructure objects it reads it
        // writes itself (their status), and a machine template's flavor matters only when
        // machines are added, which a watched replica count starts; the delays ask for
        // their ends and the knobs poke. So the fallback pass is a quiet one.
        let mut wake = Wake::with_fallback(crate::emulated_registration::FALLBACK);
        for (group, kind) in [("cluster.x-k8s.io", "Cluster"), ("cluster.x-k8s.io", "ClusterClass"), ("cluster.x-k8s.io", "MachineDeployment"), ("controlplane.cluster.x-k8s.io", "KubeadmControlPlane")] {
            wake.watch(&hub, &gvk(group, kind));
        }
        let wake = Arc::new(wake);
        let cx = Ctx { hub, spawner: fleet.spawner(), opts, knobs: knobs.clone(), wake: wake.clone() };
        let st = state.clone();
        let task = tokio::spawn(async move {
            loop {
                cx.wake.next().await;
                let mut s = st.lock().await;
                if let Err(e) = tick(&cx, &mut s).await {
                    cx.wake.after(crate::wake::RETRY);
                    tracing::debug!(error = %e, "emulated Cluster API: retrying");
                }
            }
        });
        Ok(Self { state, knobs, wake, task })
    }

    /// Changes the knobs of the cluster named `cluster` (from its next step on, at once).
    pub fn set(&self, cluster: &str, f: impl FnOnce(&mut CapiKnobs)) {
        {
            let mut k = self.knobs.lock().expect("knobs lock");
            let base = k.0.clone();
            f(k.1.entry(cluster.to_owned()).or_insert(base));
        }
        self.wake.poke();
    }

    /// Changes the knobs of every cluster without its own.
    pub fn set_default(&self, f: impl FnOnce(&mut CapiKnobs)) {
        f(&mut self.knobs.lock().expect("knobs lock").0);
        self.wake.poke();
    }

    /// How many workload clusters exist now (real and virtual).
    pub async fn workload_count(&self) -> usize {
        self.state.lock().await.workloads.len()
    }
}

impl Ctx {
    fn knob(&self, cluster: &str) -> CapiKnobs {
        let k = self.knobs.lock().expect("knobs lock");
        k.1.get(cluster).cloned().unwrap_or_else(|| k.0.clone())
    }

    fn api(&self, ns: &str, group: &str, kind: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.hub.clone(), ns, &gvk(group, kind))
    }
}

fn cond(type_: &str, ok: bool, reason: &str, old: Option<&Value>) -> Value {
    let status = if ok { "True" } else { "False" };
    // Keep the transition time while the status stays, so unchanged statuses are not rewritten.
    let time = old
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_ && c["status"] == status))
        .map_or_else(|| Value::String(now()), |c| c["lastTransitionTime"].clone());
    json!({"type": type_, "status": status, "reason": reason, "message": "", "lastTransitionTime": time})
}

/// Merge-patches `status` only when one of its fields differs.
async fn set_status(api: &Api<DynamicObject>, obj: &DynamicObject, status: Value) -> Result<(), kube::Error> {
    let current = obj.data.get("status").cloned().unwrap_or(Value::Null);
    let differs = status.as_object().is_some_and(|m| m.iter().any(|(k, v)| current.get(k) != Some(v)));
    if differs {
        api.patch_status(&obj.metadata.name.clone().unwrap_or_default(), &PatchParams::default(), &Patch::Merge(&json!({"status": status}))).await?;
    }
    Ok(())
}

fn str_at<'a>(v: &'a Value, p: &str) -> Option<&'a str> {
    v.pointer(p).and_then(Value::as_str)
}

/// The ClusterClass controller's part the Cluster webhook reads
/// (`internal/controllers/clusterclass/clusterclass_controller.go`): each inline variable
/// definition in `status.variables`, `VariablesReady`, the observed generation.
async fn classes(cx: &Ctx) -> Result<(), kube::Error> {
    let classes: Api<DynamicObject> = Api::all_with(cx.hub.clone(), &gvk("cluster.x-k8s.io", "ClusterClass"));
    for cc in classes.list(&ListParams::default()).await?.items {
        let generation = cc.metadata.generation.unwrap_or(0);
        if cc.data.pointer("/status/observedGeneration").and_then(Value::as_i64) == Some(generation) {
            continue;
        }
        let Some(ns) = cc.metadata.namespace.clone() else { continue };
        let variables: Vec<Value> = cc
            .data
            .pointer("/spec/variables")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|v| json!({"name": v["name"], "definitions": [{"from": "inline", "required": v.get("required").cloned().unwrap_or(json!(false)), "schema": v["schema"]}]}))
            .collect();
        let status = json!({"observedGeneration": generation, "variables": variables,
            "conditions": [{"type": "VariablesReady", "status": "True", "reason": "VariablesReady", "message": "", "observedGeneration": generation,
                "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()}]});
        set_status(&cx.api(&ns, "cluster.x-k8s.io", "ClusterClass"), &cc, status).await?;
    }
    Ok(())
}

async fn tick(cx: &Ctx, s: &mut State) -> Result<(), kube::Error> {
    // A class's status is no Cluster's business: a refused write is logged, not fatal.
    if let Err(e) = classes(cx).await {
        tracing::warn!(error = %e, "emulated Cluster API: ClusterClass status not written");
    }
    let clusters: Api<DynamicObject> = Api::all_with(cx.hub.clone(), &gvk("cluster.x-k8s.io", "Cluster"));
    let list = clusters.list(&ListParams::default()).await?;
    let mut seen = Vec::new();
    for c in list.items {
        let (Some(ns), Some(name)) = (c.metadata.namespace.clone(), c.metadata.name.clone()) else { continue };
        let key = format!("{ns}/{name}");
        seen.push(key.clone());
        let api = cx.api(&ns, "cluster.x-k8s.io", "Cluster");
        if c.metadata.deletion_timestamp.is_some() {
            remove(cx, s, &api, &c, &ns, &name, &key).await?;
            continue;
        }
        let finalizers = c.metadata.finalizers.clone().unwrap_or_default();
        if !finalizers.iter().any(|f| f == FINALIZER) {
            let mut f = finalizers;
            f.push(FINALIZER.to_owned());
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&json!({"metadata": {"finalizers": f}}))).await?;
        }
        provision(cx, s, &api, &c, &ns, &name, &key).await?;
    }
    // Clusters gone without us (e.g. the finalizer removed by hand): drop their workloads.
    s.workloads.retain(|k, _| seen.contains(k));
    s.first_seen.retain(|k, _| seen.contains(k));
    Ok(())
}

async fn remove(cx: &Ctx, s: &mut State, api: &Api<DynamicObject>, c: &DynamicObject, ns: &str, name: &str, key: &str) -> Result<(), kube::Error> {
    let since = *s.deleting_since.entry(key.to_owned()).or_insert_with(Instant::now);
    if cx.wake.waiting(cx.knob(name).deletion_delay, since.elapsed()) {
        let status = json!({"phase": "Deleting"});
        return set_status(api, c, status).await;
    }
    let lp = ListParams::default().labels(&format!("{CLUSTER_NAME_LABEL}={name}"));
    let machines = cx.api(ns, "cluster.x-k8s.io", "Machine");
    machines.delete_collection(&DeleteParams::default(), &lp).await?;
    // No drain while the Cluster is being deleted (`machine_controller.go`
    // `isDeleteNodeAllowed`: `errClusterIsBeingDeleted`): the finalizers go at once.
    for m in machines.list(&lp).await?.items {
        lift_machine_finalizer(&machines, &m).await?;
    }
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(cx.hub.clone(), ns);
    match secrets.delete(&format!("{name}-kubeconfig"), &DeleteParams::default()).await {
        Ok(_) | Err(kube::Error::Api(_)) => {}
        Err(e) => return Err(e),
    }
    // The workload cluster goes (its API server stops, or its virtual nodes are removed).
    if let Some(w) = s.workloads.remove(key) {
        let names: Vec<String> = w.pools.iter().flat_map(|(p, n)| (0..*n).map(move |i| format!("{name}-{p}-{i}"))).collect();
        if w._server.is_none() {
            let _ = w.kubelet.remove_nodes(&names).await;
        }
    }
    let rest: Vec<String> = c.metadata.finalizers.iter().flatten().filter(|f| *f != FINALIZER).cloned().collect();
    api.patch(name, &PatchParams::default(), &Patch::Merge(&json!({"metadata": {"finalizers": rest}}))).await?;
    s.deleting_since.remove(key);
    s.first_seen.remove(key);
    Ok(())
}

/// A referenced object (`{apiGroup, kind, name}`) in `ns`, if it exists.
async fn referenced(cx: &Ctx, ns: &str, r: Option<&Value>) -> Result<Option<(Api<DynamicObject>, DynamicObject)>, kube::Error> {
    let Some(r) = r else { return Ok(None) };
    let (Some(group), Some(kind), Some(name)) = (str_at(r, "/apiGroup"), str_at(r, "/kind"), str_at(r, "/name")) else { return Ok(None) };
    let api = cx.api(ns, group, kind);
    Ok(api.get_opt(name).await?.map(|o| (api, o)))
}

/// The flavor of the machine template `r` points at.
async fn flavor(cx: &Ctx, ns: &str, r: Option<&Value>) -> Result<NodeFlavor, kube::Error> {
    // CAPO v1beta2: `flavor: {filter: {name}}` (v1beta1: a plain name).
    let f = referenced(cx, ns, r).await?.and_then(|(_, t)| {
        str_at(&t.data, "/spec/template/spec/flavor/filter/name").or_else(|| str_at(&t.data, "/spec/template/spec/flavor")).map(str::to_owned)
    });
    Ok(f.and_then(|f| cx.opts.flavors.get(&f).cloned()).unwrap_or_default())
}

async fn provision(cx: &Ctx, s: &mut State, api: &Api<DynamicObject>, c: &DynamicObject, ns: &str, name: &str, key: &str) -> Result<(), kube::Error> {
    let knobs = cx.knob(name);
    let age = s.first_seen.entry(key.to_owned()).or_insert_with(Instant::now).elapsed();
    let old = c.data.pointer("/status/conditions");
    if cx.wake.waiting(knobs.provision_delay, age) {
        return set_status(api, c, json!({"phase": "Pending"})).await;
    }
    // Infrastructure provisioned.
    if let Some((iapi, infra)) = referenced(cx, ns, c.data.pointer("/spec/infrastructureRef")).await? {
        let st = json!({"initialization": {"provisioned": true}, "ready": true,
                        "conditions": [cond("Ready", true, "Provisioned", infra.data.pointer("/status/conditions"))]});
        set_status(&iapi, &infra, st).await?;
    }
    if knobs.never_ready || cx.wake.waiting(knobs.provision_delay * 2, age) {
        let st = json!({"phase": "Provisioning", "initialization": {"infrastructureProvisioned": true},
            "conditions": [cond("InfrastructureReady", true, "Provisioned", old), cond("ControlPlaneInitialized", false, "WaitingForControlPlane", old),
                           cond("Available", false, "WaitingForControlPlane", old)]});
        return set_status(api, c, st).await;
    }
    // The workload cluster and its kubeconfig.
    let uid = c.metadata.uid.clone().unwrap_or_default();
    if s.workloads.get(key).is_some_and(|w| w.uid != uid) {
        s.workloads.remove(key);
    }
    if !s.workloads.contains_key(key) {
        // kubeadm's nodes have no pod network until a CNI runs (the quick start's "Deploy a
        // CNI solution"); k3s ships flannel. A topology's control plane is kubeadm here (the
        // test bed serves no other provider).
        let kubeadm = str_at(&c.data, "/spec/controlPlaneRef/kind").is_none_or(|k| k == "KubeadmControlPlane");
        let w = workload(cx, s, ns, c, &knobs, kubeadm).await.map_err(|e| kube::Error::Service(Box::new(e)))?;
        s.workloads.insert(key.to_owned(), w);
    }
    // Control plane replicas and flavor.
    let kcp = referenced(cx, ns, c.data.pointer("/spec/controlPlaneRef")).await?;
    let (cp_replicas, cp_flavor) = match &kcp {
        Some((_, k)) => {
            let f = flavor(cx, ns, k.data.pointer("/spec/machineTemplate/spec/infrastructureRef")).await?;
            (k.data.pointer("/spec/replicas").and_then(Value::as_u64).unwrap_or(1), f)
        }
        None => (c.data.pointer("/spec/topology/controlPlane/replicas").and_then(Value::as_u64).unwrap_or(1), NodeFlavor::default()),
    };
    let mut cp_flavor = cp_flavor;
    cp_flavor.labels.insert("node-role.kubernetes.io/control-plane".into(), String::new());
    let mut pools = vec![("cp".to_owned(), cp_replicas as usize, cp_flavor, None)];
    let mds = cx.api(ns, "cluster.x-k8s.io", "MachineDeployment").list(&ListParams::default()).await?;
    for md in mds.items.iter().filter(|m| str_at(&m.data, "/spec/clusterName") == Some(name)) {
        let md_name = md.metadata.name.clone().unwrap_or_default();
        let pool = md_name.strip_prefix(&format!("{name}-")).unwrap_or(&md_name).to_owned();
        let f = flavor(cx, ns, md.data.pointer("/spec/template/spec/infrastructureRef")).await?;
        pools.push((pool, md.data.pointer("/spec/replicas").and_then(Value::as_u64).unwrap_or(1) as usize, f, Some(md.clone())));
    }
    if kcp.is_none() {
        for (i, w) in c.data.pointer("/spec/topology/workers/machineDeployments").and_then(Value::as_array).into_iter().flatten().enumerate() {
            let pool = str_at(w, "/name").map_or_else(|| format!("md-{i}"), str::to_owned);
            pools.push((pool, w.pointer("/replicas").and_then(Value::as_u64).unwrap_or(1) as usize, NodeFlavor::default(), None));
        }
    }
    let w = s.workloads.get_mut(key).expect("workload just ensured");
    let machines = cx.api(ns, "cluster.x-k8s.io", "Machine");
    let draining = drain_machines(cx, w, &machines, name, &knobs).await?;
    for (pool, want, f, _) in &pools {
        let have = w.pools.get(pool).copied().unwrap_or(0);
        if *want > have {
            // Machines are named by index here (upstream's get random names): one of the
            // names still draining is made again once it is gone.
            if (have..*want).any(|i| draining.contains(&format!("{name}-{pool}-{i}"))) {
                continue;
            }
            let added = w.kubelet.add_nodes(pool, *want, f).await.map_err(|e| kube::Error::Service(Box::new(e)))?;
            for node in added.iter().skip(have) {
                machine(&machines, name, pool, node).await?;
            }
        } else if *want < have {
            // Deleted, each Machine's finalizer keeps it until its node is drained and
            // gone ([`drain_machines`], from this pass on).
            for m in (*want..have).map(|i| format!("{name}-{pool}-{i}")) {
                crate::emulate::absent(machines.delete(&m, &DeleteParams::default()).await)?;
            }
            cx.wake.after(Duration::ZERO);
        }
        w.pools.insert(pool.clone(), *want);
    }
    // Statuses: control plane, machine deployments, cluster.
    let n = |v: usize| json!(v);
    if let Some((kapi, k)) = &kcp {
        let version = k.data.pointer("/spec/version").cloned().unwrap_or(Value::Null);
        let st = json!({"replicas": n(cp_replicas as usize), "readyReplicas": n(cp_replicas as usize), "availableReplicas": n(cp_replicas as usize),
            "upToDateReplicas": n(cp_replicas as usize), "version": version, "initialization": {"controlPlaneInitialized": true},
            "conditions": [cond("Available", true, "Available", k.data.pointer("/status/conditions"))]});
        set_status(kapi, k, st).await?;
    }
    let md_api = cx.api(ns, "cluster.x-k8s.io", "MachineDeployment");
    for (_, want, _, md) in &pools {
        if let Some(md) = md {
            let st = json!({"replicas": n(*want), "readyReplicas": n(*want), "availableReplicas": n(*want), "upToDateReplicas": n(*want), "phase": "Running",
                "conditions": [cond("Available", true, "Available", md.data.pointer("/status/conditions"))]});
            set_status(&md_api, md, st).await?;
        }
    }
    let workers: usize = pools.iter().skip(1).map(|p| p.1).sum();
    let st = json!({"phase": "Provisioned",
        "initialization": {"infrastructureProvisioned": true, "controlPlaneInitialized": true},
        "controlPlane": {"desiredReplicas": n(cp_replicas as usize), "replicas": n(cp_replicas as usize), "readyReplicas": n(cp_replicas as usize), "availableReplicas": n(cp_replicas as usize), "upToDateReplicas": n(cp_replicas as usize)},
        "workers": {"desiredReplicas": n(workers), "replicas": n(workers), "readyReplicas": n(workers), "availableReplicas": n(workers), "upToDateReplicas": n(workers)},
        "conditions": [cond("InfrastructureReady", true, "Provisioned", old), cond("ControlPlaneInitialized", true, "Initialized", old),
                       cond("ControlPlaneAvailable", true, "Available", old), cond("WorkersAvailable", true, "Available", old), cond("Available", true, "Available", old)]});
    set_status(api, c, st).await
}

/// Drains and deletes the nodes of `cluster`'s deleted Machines, as upstream's machine
/// controller does before it lifts [`MACHINE_FINALIZER`] (cluster-api
/// `core/reconcilers/machine/machine_controller.go` `reconcileDelete`, `drainNode`;
/// `core/reconcilers/machine/drain/drain.go` `EvictPods`, `ConditionMessage`;
/// `drain/filters.go`): the node cordoned; its pods, but DaemonSets' and mirror pods,
/// evicted through the Eviction API (a PodDisruptionBudget refuses with 429, kept with the
/// API server's causes); while pods are left, the Machine's `status.deletion.
/// nodeDrainStartTime` and its v1beta2 `Deleting` condition, reason `DrainingNode`, saying
/// which pods and why, and another try after [`CapiKnobs::drain_retry`]; once none is
/// left, the node deleted, then the finalizer lifted. Returns the Machines still draining.
async fn drain_machines(cx: &Ctx, w: &Workload, machines: &Api<DynamicObject>, cluster: &str, knobs: &CapiKnobs) -> Result<HashSet<String>, kube::Error> {
    let lp = ListParams::default().labels(&format!("{CLUSTER_NAME_LABEL}={cluster}"));
    let mut left = HashSet::new();
    let deleted = machines.list(&lp).await?.items.into_iter().filter(|m| m.metadata.deletion_timestamp.is_some());
    for m in deleted.filter(|m| m.metadata.finalizers.iter().flatten().any(|f| f == MACHINE_FINALIZER)) {
        let name = m.metadata.name.clone().unwrap_or_default();
        let node = str_at(&m.data, "/status/nodeRef/name").map(str::to_owned);
        let holding = match &node {
            Some(n) => drain_node(w.kubelet.client(), &w.evictor, n).await?,
            None => None,
        };
        if let Some(holding) = holding {
            let started = str_at(&m.data, "/status/deletion/nodeDrainStartTime").map_or_else(now, str::to_owned);
            let message = format!("Drain not completed yet (started at {started}):{holding}");
            let old = m.data.pointer("/status/conditions").and_then(Value::as_array).and_then(|cs| cs.iter().find(|c| c["type"] == "Deleting" && c["status"] == "True"));
            let since = old.map_or_else(|| Value::String(now()), |c| c["lastTransitionTime"].clone());
            let deleting = json!({"type": "Deleting", "status": "True", "reason": "DrainingNode", "message": message, "lastTransitionTime": since});
            set_status(machines, &m, json!({"deletion": {"nodeDrainStartTime": started}, "conditions": [deleting]})).await?;
            cx.wake.after(knobs.drain_retry);
            left.insert(name);
            continue;
        }
        if let Some(n) = node {
            w.kubelet.remove_nodes(&[n]).await.map_err(|e| kube::Error::Service(Box::new(e)))?;
        }
        lift_machine_finalizer(machines, &m).await?;
    }
    Ok(left)
}

/// Takes [`MACHINE_FINALIZER`] off Machine `m` as upstream's machine controller does
/// ([`crate::emulate::finalizer_patch`]: at the read version, the others kept); a Machine
/// gone already is done.
async fn lift_machine_finalizer(machines: &Api<DynamicObject>, m: &DynamicObject) -> Result<(), kube::Error> {
    let Some(patch) = crate::emulate::finalizer_patch(&m.metadata, MACHINE_FINALIZER, false) else { return Ok(()) };
    crate::emulate::absent(machines.patch(m.metadata.name.as_deref().unwrap_or_default(), &PatchParams::default(), &Patch::Merge(&patch)).await)
}

/// One pass of upstream's drain of `node` (`drainNode`): cordons it, evicts its pods but
/// DaemonSets' and mirror pods, and says, as `EvictionResult::ConditionMessage` words it
/// (the lines after its "Drain not completed yet" head), what is left; None once no such
/// pod is left, or when the node is gone (an admin deleted it: no drain).
async fn drain_node(client: &kube::Client, evictor: &kube::Client, node: &str) -> Result<Option<String>, kube::Error> {
    use k8s_openapi::api::core::v1::{Node, Pod};
    let nodes: Api<Node> = Api::all(client.clone());
    let Some(n) = nodes.get_opt(node).await? else { return Ok(None) };
    if n.spec.as_ref().and_then(|s| s.unschedulable) != Some(true) {
        nodes.patch(node, &PatchParams::default(), &Patch::Merge(&json!({"spec": {"unschedulable": true}}))).await?;
    }
    let on_node = ListParams::default().fields(&format!("spec.nodeName={node}"));
    let pods: Vec<Pod> = Api::<Pod>::all(client.clone())
        .list(&on_node)
        .await?
        .items
        .into_iter()
        .filter(|p| !p.metadata.owner_references.iter().flatten().any(|o| o.controller == Some(true) && o.kind == "DaemonSet"))
        .filter(|p| !p.metadata.annotations.as_ref().is_some_and(|a| a.contains_key("kubernetes.io/config.mirror")))
        .collect();
    if pods.is_empty() {
        return Ok(None);
    }
    let key = |p: &Pod| format!("{}/{}", p.metadata.namespace.as_deref().unwrap_or_default(), p.metadata.name.as_deref().unwrap_or_default());
    let mut deleting = Vec::new();
    let mut failed: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in &pods {
        if p.metadata.deletion_timestamp.is_some() {
            deleting.push(key(p));
            continue;
        }
        let api: Api<Pod> = Api::namespaced(evictor.clone(), p.metadata.namespace.as_deref().unwrap_or_default());
        match api.evict(p.metadata.name.as_deref().unwrap_or_default(), &kube::api::EvictParams::default()).await {
            Ok(_) => deleting.push(key(p)),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            // The API server's message with its causes (`EvictPods`: "Cannot evict pod as
            // it would violate the pod's disruption budget. The disruption budget web needs
            // 1 healthy pods and has 1 currently").
            Err(kube::Error::Api(e)) => {
                let causes: Vec<String> = e.details.iter().flat_map(|d| d.causes.iter().map(|c| c.message.clone())).collect();
                let why = if causes.is_empty() { e.message.clone() } else { format!("{} {}", e.message, causes.join(",")) };
                failed.entry(why).or_default().push(key(p));
            }
            Err(e) => return Err(e),
        }
    }
    // `PodListToString(pods, 3)`: the first three, then how many more.
    let listed = |ps: &[String]| {
        let (kind, more) = (if ps.len() > 1 { "Pods" } else { "Pod" }, ps.len().saturating_sub(3));
        let names = ps.iter().take(3).cloned().collect::<Vec<_>>().join(", ");
        if more > 0 { format!("{kind} {names}, ... ({more} more)") } else { format!("{kind} {names}") }
    };
    let mut message = String::new();
    if !deleting.is_empty() {
        message += &format!("\n* {}: deletionTimestamp set, but still not removed from the Node", listed(&deleting));
    }
    for (why, ps) in &failed {
        let why = why.replace("Cannot evict pod as it would violate the pod's disruption budget.", "cannot evict pod as it would violate the pod's disruption budget.");
        let why = if why.starts_with("cannot evict pod as it would violate the pod's disruption budget.") { why } else { format!("failed to evict Pod, {why}") };
        message += &format!("\n* {}: {why}", listed(ps));
    }
    Ok(Some(message))
}

/// A Machine for an emulated node, with its nodeRef.
async fn machine(api: &Api<DynamicObject>, cluster: &str, pool: &str, node: &str) -> Result<(), kube::Error> {
    let mut labels = json!({CLUSTER_NAME_LABEL: cluster});
    if pool == "cp" {
        labels["cluster.x-k8s.io/control-plane"] = json!("");
    } else {
        labels["cluster.x-k8s.io/deployment-name"] = json!(format!("{cluster}-{pool}"));
    }
    let m = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": node, "labels": labels, "finalizers": [MACHINE_FINALIZER]},
        "spec": {"clusterName": cluster, "bootstrap": {"dataSecretName": format!("{node}-bootstrap")},
                 "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "EmulatedMachine", "name": node}}});
    api.patch(node, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&m)).await?;
    let st = json!({"status": {"phase": "Running", "nodeRef": {"name": node}, "initialization": {"infrastructureProvisioned": true, "bootstrapDataSecretCreated": true}}});
    api.patch_status(node, &PatchParams::default(), &Patch::Merge(&st)).await?;
    Ok(())
}

/// The owner reference of Cluster `c`'s kubeconfig Secret, as upstream gives it: with a
/// control plane (`spec.controlPlaneRef`, here when its object exists) a controller
/// reference to it (`controlplane/kubeadm/reconcilers/kubeadmcontrolplane/helpers.go`
/// `reconcileKubeconfig`); without one, the Cluster itself, no controller flag
/// (`core/reconcilers/cluster/cluster_controller_phases.go` `reconcileKubeconfig`,
/// `util/kubeconfig/kubeconfig.go` `CreateSecret`).
async fn kubeconfig_owner(cx: &Ctx, ns: &str, c: &DynamicObject) -> Result<Value, kube::Error> {
    if let Some((_, cp)) = referenced(cx, ns, c.data.pointer("/spec/controlPlaneRef")).await? {
        let kind = cp.types.as_ref().map(|t| (t.api_version.clone(), t.kind.clone())).unwrap_or_default();
        return Ok(json!({"apiVersion": kind.0, "kind": kind.1, "name": cp.metadata.name, "uid": cp.metadata.uid, "controller": true, "blockOwnerDeletion": true}));
    }
    Ok(json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "name": c.metadata.name, "uid": c.metadata.uid}))
}

/// Starts the workload cluster of Cluster `c` and writes its kubeconfig Secret. A kubeadm
/// cluster on an API server of its own needs a CNI before its nodes are Ready; virtual
/// clusters share one backing API server, where one cluster's CNI DaemonSet would run on
/// every cluster's nodes, so theirs have a network from the start.
async fn workload(cx: &Ctx, s: &mut State, ns: &str, c: &DynamicObject, knobs: &CapiKnobs, kubeadm: bool) -> Result<Workload, FleetError> {
    let (name, uid) = (c.metadata.name.as_deref().unwrap_or_default(), c.metadata.uid.as_deref().unwrap_or_default());
    let real = s.real_started < cx.opts.real_api_servers;
    let (server, kubeconfig, client, evictor) = if real {
        let server = cx.spawner.spawn(name, true).await?;
        s.real_started += 1;
        let kc = server.kubeconfig_inline()?;
        let (client, evictor) = (server.client().await?, server.evicting_client().await?);
        (Some(server), kc, client, evictor)
    } else {
        if s.virtual_backing.is_none() {
            s.virtual_backing = Some(Arc::new(cx.spawner.spawn("virtual-backing", true).await?));
        }
        let b = s.virtual_backing.clone().expect("backing just started");
        let kc = b.kubeconfig_inline()?;
        (None, kc, b.client().await?, b.evicting_client().await?)
    };
    let kubelet = Kubelet::start(name, client, Duration::from_millis(100));
    kubelet.crash_images(knobs.crashing_images.clone());
    if real && kubeadm && !cx.opts.cni_with_cluster {
        kubelet.require_cni();
    }
    let err = |e: kube::Error| FleetError::Client { cluster: "hub".into(), source: Box::new(e) };
    let secret = kubeconfig_secret_owned(name, &kubeconfig, kubeconfig_owner(cx, ns, c).await.map_err(err)?);
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(cx.hub.clone(), ns);
    secrets.patch(&format!("{name}-kubeconfig"), &PatchParams::apply(MANAGER).force(), &Patch::Apply(&secret)).await.map_err(err)?;
    Ok(Workload { _server: server, kubelet, evictor, pools: HashMap::new(), uid: uid.to_owned() })
}

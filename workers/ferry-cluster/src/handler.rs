//! The `create-cluster` tasks. Create: check (live rules that reject), apply (render and
//! server-side apply; undo deletes the Cluster and waits until it is gone), wait for the
//! infrastructure, the control plane, the kubeconfig Secret and Ready nodes, one step per
//! add-on (apply, readiness, crash-loop detection; undo removes it), register with OCM.
//! Scale: check, scale (undo restores the counts), wait. Delete: check, deregister, delete.
//! Every wait is a shared watch with a deadline; kubeconfigs stay on the hub.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ferry_kube::kinds::{CapiCluster, CapiMachine, ManagedCluster};
use ferry_kube::step_errors::{hub_err, kube_err};
use ferry_kube::{Check, ClusterError, Clusters, HUB, WaitError, Watches};
use ferry_task::{Rejection, Step, StepContext, StepError, StepPolicy, TaskHandler, TaskKind};
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::addons::{Catalog, ReadyCheck};
use crate::render::{self, CLUSTER_LABEL, MANAGED_BY, MANAGER, NAMESPACE_LABEL, TASK_ANNOTATION};
use crate::spec::{AddonRequest, ClusterCommand, ClusterOperation};

/// What the create-cluster worker needs.
#[derive(Clone)]
pub struct ClusterConfig {
    /// The hub and the workload clusters (through their kubeconfig Secrets).
    pub clusters: Arc<Clusters>,
    /// Shared watches.
    pub watches: Arc<Watches>,
    /// The add-on catalog.
    pub catalog: Arc<Catalog>,
    /// How long a deleted Cluster or ManagedCluster has to disappear.
    pub removal_timeout: Duration,
    /// How long a new ManagedCluster has to become available.
    pub registration_timeout: Duration,
}

impl ClusterConfig {
    /// Defaults: the built-in catalog, 600 s to remove, 300 s to register.
    pub fn new(clusters: Arc<Clusters>) -> Self {
        Self {
            clusters,
            watches: Arc::new(Watches::new()),
            catalog: Arc::new(Catalog::builtin()),
            removal_timeout: Duration::from_secs(600),
            registration_timeout: Duration::from_secs(300),
        }
    }
}

struct Inner {
    cfg: ClusterConfig,
}

impl Inner {
    fn hub(&self) -> kube::Client {
        self.cfg.clusters.hub().clone()
    }
}

/// The handler of `create-cluster` tasks.
#[derive(Clone)]
pub struct ClusterHandler {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ClusterHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterHandler").finish_non_exhaustive()
    }
}

impl ClusterHandler {
    /// A handler.
    pub fn new(cfg: ClusterConfig) -> Self {
        Self { inner: Arc::new(Inner { cfg }) }
    }
}

fn wait_err(e: WaitError) -> StepError {
    match e {
        WaitError::Timeout { .. } => StepError::permanent(ferry_task::codes::DEADLINE_EXCEEDED, e.to_string()),
        WaitError::Failed { .. } => StepError::permanent(ferry_task::codes::FAILED, e.to_string()),
    }
}

fn secs(v: Option<i32>, default: u64) -> Duration {
    Duration::from_secs(v.map_or(default, |s| s.max(1) as u64))
}

fn ready_timeout(cmd: &ClusterCommand) -> Duration {
    secs(cmd.ready_timeout_seconds, 1800)
}

fn wait_policy(t: Duration) -> StepPolicy {
    // The deadline bounds the wait; a miss is final (the task reverts).
    StepPolicy { timeout: t + Duration::from_secs(60), max_retries: 5, ..StepPolicy::default() }
}

fn clusters_api(hub: &kube::Client, ns: &str) -> Api<CapiCluster> {
    Api::namespaced(hub.clone(), ns)
}

fn is_ferrys(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> bool {
    meta.labels.as_ref().and_then(|l| l.get(MANAGED_BY.0)).map(String::as_str) == Some(MANAGED_BY.1)
}

fn task_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    meta.annotations.as_ref().and_then(|a| a.get(TASK_ANNOTATION)).cloned().unwrap_or_else(|| "?".into())
}

/// The ManagedCluster of `cmd`'s cluster, when it is Ferry's for this namespace.
async fn own_managed_cluster(inner: &Inner, cmd: &ClusterCommand) -> Result<Option<ManagedCluster>, StepError> {
    let api: Api<ManagedCluster> = Api::all(inner.hub());
    let mc = match api.get_opt(&cmd.name).await {
        Ok(mc) => mc,
        // OCM not installed: nothing registered.
        Err(kube::Error::Api(s)) if s.code == 404 => None,
        Err(e) => return Err(hub_err(e)),
    };
    Ok(mc.filter(|m| m.metadata.labels.as_ref().and_then(|l| l.get(NAMESPACE_LABEL)).map(String::as_str) == Some(cmd.namespace())))
}

// ---------------------------------------------------------------------------------------
// create: check

/// Output of a create's `check`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CreateChecked {
    /// The namespace existed before (a revert keeps it).
    pub namespace_existed: bool,
    /// The ClusterClass's worker class (topology only).
    pub worker_class: Option<String>,
}

struct CreateCheck(Arc<Inner>);

impl CreateCheck {
    async fn check(&self, cmd: &ClusterCommand) -> Result<CreateChecked, StepError> {
        let hub = self.0.hub();
        let (ns, name) = (cmd.namespace(), cmd.name.as_str());
        // Every kind the command needs is served (its provider is installed).
        for (group, kind) in render::required_kinds(cmd) {
            let gvk = GroupVersionKind::gvk(group, "v1beta2", kind);
            match self.0.cfg.clusters.api(HUB, &gvk, Some(ns)).await {
                Ok(_) => {}
                Err(ClusterError::NotServed { .. }) => {
                    return Err(StepError::rejected(
                        "PROVIDER_MISSING",
                        format!(
                            "the hub does not serve {group}/v1beta2 {kind}: install the provider that owns it (clusterctl init) before creating {ns}/{name}"
                        ),
                    ));
                }
                Err(e) => return Err(kube_err(ferry_task::codes::HUB_API, e)),
            }
        }
        if let Some(c) = clusters_api(&hub, ns).get_opt(name).await.map_err(hub_err)? {
            return Err(if is_ferrys(&c.metadata) {
                StepError::rejected(
                    "CLUSTER_EXISTS",
                    format!("Cluster {ns}/{name} already exists (created by Ferry task {}): scale or delete it instead", task_of(&c.metadata)),
                )
            } else {
                StepError::rejected(
                    "CLUSTER_NOT_FERRYS",
                    format!("a Cluster {ns}/{name} exists that Ferry did not create (no label {}={}): refusing to touch it", MANAGED_BY.0, MANAGED_BY.1),
                )
            });
        }
        // Workers reach clusters by name: a name in use elsewhere would be ambiguous.
        let secrets: Api<Secret> = Api::all(hub.clone());
        let lp = ListParams::default().labels(&format!("{}={name}", render::CAPI_CLUSTER_LABEL));
        if let Some(s) = secrets.list(&lp).await.map_err(hub_err)?.items.into_iter().find(|s| s.metadata.name.as_deref() == Some(&format!("{name}-kubeconfig")))
        {
            return Err(StepError::rejected(
                "NAME_TAKEN",
                format!(
                    "cluster name {name:?} is taken: Secret {}/{name}-kubeconfig exists; cluster names must be unique across namespaces",
                    s.metadata.namespace.unwrap_or_default()
                ),
            ));
        }
        if cmd.ocm.enabled {
            let api: Api<ManagedCluster> = Api::all(hub.clone());
            match api.get_opt(name).await {
                Ok(Some(_)) => {
                    return Err(StepError::rejected(ferry_task::codes::NAME_TAKEN, format!("a ManagedCluster {name:?} is already registered on the hub")));
                }
                Ok(None) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    return Err(StepError::rejected(
                        "OCM_MISSING",
                        "ocm.enabled is set but the hub does not serve ManagedClusters (OCM's cluster manager is not installed)",
                    ));
                }
                Err(e) => return Err(hub_err(e)),
            }
            if let Some(set) = &cmd.ocm.cluster_set {
                let gvk = GroupVersionKind::gvk("cluster.open-cluster-management.io", "v1beta2", "ManagedClusterSet");
                let api = self.0.cfg.clusters.api(HUB, &gvk, None).await.map_err(|e| kube_err(ferry_task::codes::HUB_API, e))?;
                if api.get_opt(set).await.map_err(hub_err)?.is_none() {
                    return Err(StepError::rejected(ferry_task::codes::CLUSTER_SET_MISSING, format!("ManagedClusterSet {set:?} does not exist on the hub")));
                }
            }
        }
        let mut worker_class = None;
        if let Some(class) = &cmd.cluster_class {
            let gvk = GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "ClusterClass");
            let api = self.0.cfg.clusters.api(HUB, &gvk, Some(ns)).await.map_err(|e| kube_err(ferry_task::codes::HUB_API, e))?;
            let Some(cc) = api.get_opt(class).await.map_err(hub_err)? else {
                return Err(StepError::rejected(ferry_task::codes::CLUSTER_CLASS_MISSING, format!("ClusterClass {ns}/{class} does not exist")));
            };
            worker_class = cc.data.pointer("/spec/workers/machineDeployments/0/class").and_then(Value::as_str).map(str::to_owned);
            if worker_class.is_none() && cmd.worker_count() > 0 {
                return Err(StepError::rejected(
                    "CLUSTER_CLASS_NO_WORKERS",
                    format!("ClusterClass {ns}/{class} defines no worker class, but {} workers are requested", cmd.worker_count()),
                ));
            }
        }
        let namespace_existed = Api::<Namespace>::all(hub).get_opt(ns).await.map_err(hub_err)?.is_some();
        Ok(CreateChecked { namespace_existed, worker_class })
    }
}

impl Step<ClusterCommand> for CreateCheck {
    fn acts(&self) -> bool {
        false // reads the live state only
    }

    fn name(&self) -> &str {
        "check"
    }

    fn policy(&self) -> StepPolicy {
        StepPolicy { timeout: Duration::from_secs(120), ..StepPolicy::default() }
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let out = self.check(cx.spec).await?;
            cx.progress(100, "the name is free and the providers are installed");
            Ok(serde_json::to_value(out).unwrap_or_default())
        }
        .boxed()
    }

    fn undo<'a>(&'a self, _: &'a StepContext<'a, ClusterCommand>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async { Ok(()) }.boxed()
    }
}

fn create_checked(cx: &StepContext<'_, ClusterCommand>) -> Result<CreateChecked, StepError> {
    cx.required("check")
}

// ---------------------------------------------------------------------------------------
// create: apply

struct ApplyStep(Arc<Inner>);

/// `kind namespace/name` of a rendered object.
fn describe(o: &Value) -> String {
    format!("{} {}/{}", o["kind"].as_str().unwrap_or("?"), o["metadata"]["namespace"].as_str().unwrap_or(""), o["metadata"]["name"].as_str().unwrap_or("?"))
}

impl ApplyStep {
    /// Deletes the Cluster (the providers remove its machines and workload cluster), waits
    /// until it is gone, then the rest of what `apply` rendered.
    async fn remove(&self, cmd: &ClusterCommand, objects: &[Value], namespace_existed: bool, cx: &StepContext<'_, ClusterCommand>) -> Result<(), StepError> {
        let inner = &self.0;
        let hub = inner.hub();
        let (ns, name) = (cmd.namespace(), cmd.name.as_str());
        if let Some(c) = clusters_api(&hub, ns).get_opt(name).await.map_err(hub_err)? {
            if !is_ferrys(&c.metadata) {
                return Err(StepError::permanent(
                    "CLUSTER_NOT_FERRYS",
                    format!("Cluster {ns}/{name} is not Ferry's any more (its managed-by label changed): leaving it"),
                ));
            }
            cx.progress(10, format!("deleting Cluster {ns}/{name}"));
            match clusters_api(&hub, ns).delete(name, &kube::api::DeleteParams::background()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(hub_err(e)),
            }
            inner.cfg.watches.wait_deleted::<CapiCluster>(HUB, &hub, Some(ns), name, inner.cfg.removal_timeout).await.map_err(wait_err)?;
        }
        inner.cfg.watches.forget(name);
        cx.progress(70, "Cluster gone; deleting its templates");
        for o in objects.iter().rev().filter(|o| o["kind"] != "Cluster") {
            match inner.cfg.clusters.delete(HUB, o).await {
                Ok(_) | Err(ClusterError::NotServed { .. }) => {}
                Err(e) => return Err(kube_err(ferry_task::codes::HUB_API, e)),
            }
        }
        // The namespace the create made goes too, unless another cluster lives in it (creates
        // into a new namespace may run side by side, each finding it missing).
        if !namespace_existed && ns != "default" {
            let nss = Api::<Namespace>::all(hub.clone());
            let ours = nss.get_opt(ns).await.map_err(hub_err)?.is_some_and(|n| is_ferrys(&n.metadata));
            let others = !clusters_api(&hub, ns).list(&ListParams::default().limit(1)).await.map_err(hub_err)?.items.is_empty();
            if ours && !others {
                cx.progress(90, format!("deleting namespace {ns}"));
                match nss.delete(ns, &Default::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(hub_err(e)),
                }
                inner.cfg.watches.wait_deleted::<Namespace>(HUB, &hub, None, ns, inner.cfg.removal_timeout).await.map_err(wait_err)?;
            }
        }
        Ok(())
    }
}

impl Step<ClusterCommand> for ApplyStep {
    fn name(&self) -> &str {
        "apply"
    }

    fn policy(&self) -> StepPolicy {
        StepPolicy { timeout: self.0.cfg.removal_timeout + Duration::from_secs(60), ..StepPolicy::default() }
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let cmd = cx.spec;
            let checked = create_checked(cx)?;
            let hub = self.0.hub();
            if !checked.namespace_existed {
                let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": cmd.namespace(), "labels": {MANAGED_BY.0: MANAGED_BY.1}}});
                Api::<Namespace>::all(hub).patch(cmd.namespace(), &PatchParams::apply(MANAGER), &Patch::Apply(&ns)).await.map_err(hub_err)?;
            }
            let objects = render::objects(cmd, &cx.task_id.to_string(), checked.worker_class.as_deref());
            let n = objects.len();
            for (i, o) in objects.iter().enumerate() {
                self.0.cfg.clusters.apply(HUB, o, MANAGER).await.map_err(|e| kube_err(ferry_task::codes::APPLY_FAILED, e))?;
                cx.progress(((i + 1) * 100 / n) as u8, format!("applied {}", describe(o)));
            }
            Ok(json!({"objects": objects.iter().map(describe).collect::<Vec<_>>()}))
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            // Rendering is pure: the same objects whether or not `run` finished.
            let checked = create_checked(cx)?;
            let objects = render::objects(cx.spec, &cx.task_id.to_string(), checked.worker_class.as_deref());
            self.remove(cx.spec, &objects, checked.namespace_existed, cx).await
        }
        .boxed()
    }
}

// ---------------------------------------------------------------------------------------
// waits: infrastructure, control plane

/// Waits until the Cluster's `status.initialization.<field>` is true.
struct ClusterWait {
    inner: Arc<Inner>,
    step: &'static str,
    field: &'static str,
    what: &'static str,
}

impl Step<ClusterCommand> for ClusterWait {
    fn name(&self) -> &str {
        self.step
    }

    fn policy(&self) -> StepPolicy {
        wait_policy(Duration::from_secs(1800))
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let cmd = cx.spec;
            let hub = self.inner.hub();
            let pointer = format!("/initialization/{}", self.field);
            // The shared watch may not have seen the new Cluster yet: absent is a failure
            // only after it was seen.
            let mut seen = false;
            let phase = self
                .inner
                .cfg
                .watches
                .wait_object::<CapiCluster, String>(HUB, &hub, Some(cmd.namespace()), &cmd.name, ready_timeout(cmd), |c| {
                    seen |= c.is_some();
                    match c {
                        None if seen => Check::Failed("the Cluster was deleted".into()),
                        None => Check::Pending("the watch has not seen the Cluster yet".into()),
                        Some(c) if c.status_at(&pointer).and_then(Value::as_bool) == Some(true) => {
                            Check::Done(c.status_at("/phase").and_then(Value::as_str).unwrap_or("").to_owned())
                        }
                        Some(c) => Check::Pending(format!(
                            "phase {}, {}",
                            c.status_at("/phase").and_then(Value::as_str).unwrap_or("(none)"),
                            ferry_kube::kinds::condition_message(&c.status, "Available").unwrap_or_else(|| "no Available condition".into())
                        )),
                    }
                })
                .await
                .map_err(wait_err)?;
            cx.progress(100, format!("{} (phase {phase})", self.what));
            Ok(json!({"phase": phase}))
        }
        .boxed()
    }

    fn undo<'a>(&'a self, _: &'a StepContext<'a, ClusterCommand>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async { Ok(()) }.boxed()
    }
}

// ---------------------------------------------------------------------------------------
// kubeconfig

struct KubeconfigStep(Arc<Inner>);

impl Step<ClusterCommand> for KubeconfigStep {
    fn name(&self) -> &str {
        "kubeconfig"
    }

    fn policy(&self) -> StepPolicy {
        wait_policy(Duration::from_secs(600))
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let cmd = cx.spec;
            let hub = self.0.hub();
            let secret = format!("{}-kubeconfig", cmd.name);
            self.0
                .cfg
                .watches
                .wait_object::<Secret, ()>(HUB, &hub, Some(cmd.namespace()), &secret, ready_timeout(cmd), |s| match s {
                    Some(_) => Check::Done(()),
                    None => Check::Pending("the providers have not written it yet".into()),
                })
                .await
                .map_err(wait_err)?;
            // The kubeconfig is read here and used by this worker only; the task records the
            // Secret's name and the server's version, never the content.
            let client = self.0.cfg.clusters.client(&cmd.name).await.map_err(|e| kube_err(ferry_task::codes::KUBECONFIG, e))?;
            let version =
                client.apiserver_version().await.map_err(|e| kube_err(ferry_task::codes::WORKLOAD_API, ClusterError::Kube { cluster: cmd.name.clone(), source: e }))?;
            cx.progress(100, format!("the workload API server answers (Kubernetes {})", version.git_version));
            Ok(json!({"secret": format!("{}/{secret}", cmd.namespace()), "server_version": version.git_version}))
        }
        .boxed()
    }

    fn undo<'a>(&'a self, _: &'a StepContext<'a, ClusterCommand>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async { Ok(()) }.boxed()
    }
}

// ---------------------------------------------------------------------------------------
// nodes

/// Waits until `want` Machines of the cluster have nodes and every such Node is Ready.
async fn wait_nodes(
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
    let client = inner.cfg.clusters.client(&cmd.name).await.map_err(|e| kube_err(ferry_task::codes::KUBECONFIG, e))?;
    let wanted = nodes.clone();
    inner
        .cfg
        .watches
        .wait_store::<Node, ()>(&cmd.name, &client, None, "Ready nodes", timeout, |store| {
            let ready = |n: &str| store.state().iter().any(|node| node.metadata.name.as_deref() == Some(n) && ferry_kube::kinds::node_ready(node));
            let not_ready: Vec<&String> = wanted.iter().filter(|n| !ready(n)).collect();
            if not_ready.is_empty() { Check::Done(()) } else { Check::Pending(format!("not Ready yet: {not_ready:?}")) }
        })
        .await
        .map_err(wait_err)?;
    Ok(nodes)
}

struct NodesStep(Arc<Inner>);

impl Step<ClusterCommand> for NodesStep {
    fn name(&self) -> &str {
        "nodes"
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
            Ok(json!({"nodes": nodes}))
        }
        .boxed()
    }

    fn undo<'a>(&'a self, _: &'a StepContext<'a, ClusterCommand>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async { Ok(()) }.boxed()
    }
}

// ---------------------------------------------------------------------------------------
// add-ons

struct AddonStep {
    inner: Arc<Inner>,
    addon: AddonRequest,
    step: String,
}

/// A crash-looping container among `ns`'s Pods named `<workload>-...`.
fn crash_looping(pods: &[Arc<Pod>], workload: &str) -> Option<String> {
    for p in pods {
        let name = p.metadata.name.as_deref().unwrap_or("");
        if !name.starts_with(&format!("{workload}-")) {
            continue;
        }
        for c in p.status.as_ref().and_then(|s| s.container_statuses.as_ref()).into_iter().flatten() {
            let waiting = c.state.as_ref().and_then(|s| s.waiting.as_ref()).and_then(|w| w.reason.as_deref());
            if waiting == Some("CrashLoopBackOff") && c.restart_count >= 3 {
                return Some(format!("pod {name}: container {} is in CrashLoopBackOff after {} restarts", c.name, c.restart_count));
            }
        }
    }
    None
}

impl AddonStep {
    async fn wait_ready(&self, cluster: &str, client: &kube::Client, r: &ReadyCheck, timeout: Duration) -> Result<(), StepError> {
        let w = &self.inner.cfg.watches;
        let ns = Some(r.namespace.as_str());
        let ready = async {
            match r.kind.as_str() {
                "Deployment" => {
                    w.wait_object::<Deployment, ()>(cluster, client, ns, &r.name, timeout, |d| match d {
                        None => Check::Pending("not created yet".into()),
                        Some(d) => {
                            let want = d.spec.replicas.unwrap_or(1);
                            let st = d.status.clone().unwrap_or_default();
                            let fresh = st.observed_generation >= d.metadata.generation;
                            if fresh && st.available_replicas.unwrap_or(0) >= want && st.updated_replicas.unwrap_or(0) >= want {
                                Check::Done(())
                            } else {
                                Check::Pending(format!("{}/{want} available", st.available_replicas.unwrap_or(0)))
                            }
                        }
                    })
                    .await
                }
                "DaemonSet" => {
                    w.wait_object::<DaemonSet, ()>(cluster, client, ns, &r.name, timeout, |d| match d {
                        None => Check::Pending("not created yet".into()),
                        Some(d) => {
                            let st = d.status.clone().unwrap_or_default();
                            let fresh = st.observed_generation >= d.metadata.generation && d.status.is_some();
                            if fresh && st.number_ready >= st.desired_number_scheduled {
                                Check::Done(())
                            } else {
                                Check::Pending(format!("{}/{} ready", st.number_ready, st.desired_number_scheduled))
                            }
                        }
                    })
                    .await
                }
                _ => {
                    w.wait_object::<StatefulSet, ()>(cluster, client, ns, &r.name, timeout, |s| match s {
                        None => Check::Pending("not created yet".into()),
                        Some(s) => {
                            let want = s.spec.replicas.unwrap_or(1);
                            let ready = s.status.as_ref().and_then(|st| st.ready_replicas).unwrap_or(0);
                            if ready >= want { Check::Done(()) } else { Check::Pending(format!("{ready}/{want} ready")) }
                        }
                    })
                    .await
                }
            }
        };
        let crashing = w.wait_store::<Pod, String>(cluster, client, ns, "crash-looping pods", timeout + Duration::from_secs(5), |store| {
            crash_looping(&store.state(), &r.name).map_or_else(|| Check::Pending("none".into()), Check::Done)
        });
        tokio::select! {
            r = ready => r.map_err(wait_err),
            c = crashing => match c {
                Ok(why) => Err(StepError::permanent(ferry_task::codes::ADDON_FAILED, format!("add-on {} on {cluster}: {} {}/{} will not become ready: {why}", self.addon.name, r.kind, r.namespace, r.name))),
                Err(e) => Err(wait_err(e)),
            },
        }
    }

    async fn apply_all(&self, cluster: &str, objects: &[Value]) -> Result<(), StepError> {
        for o in objects {
            match self.inner.cfg.clusters.apply(cluster, o, MANAGER).await {
                Ok(_) => {}
                // A custom resource whose CRD this add-on applied a moment ago: retried.
                Err(e @ ClusterError::NotServed { .. }) => {
                    return Err(StepError::transient(ferry_task::codes::APPLY_FAILED, e.to_string()));
                }
                Err(e) => return Err(kube_err(ferry_task::codes::APPLY_FAILED, e)),
            }
        }
        Ok(())
    }
}

impl Step<ClusterCommand> for AddonStep {
    fn name(&self) -> &str {
        &self.step
    }

    fn policy(&self) -> StepPolicy {
        wait_policy(Duration::from_secs(600))
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let cmd = cx.spec;
            let cluster = cmd.name.as_str();
            let m = self.inner.cfg.catalog.manifests(&self.addon).await.map_err(|e| {
                if e.is_transient() { StepError::transient(ferry_task::codes::ADDON_SOURCE, e.to_string()) } else { StepError::permanent(ferry_task::codes::ADDON_SOURCE, e.to_string()) }
            })?;
            self.apply_all(cluster, &m.install).await?;
            cx.progress(30, format!("applied {} objects of {}", m.install.len(), self.addon.name));
            let client = self.inner.cfg.clusters.client(cluster).await.map_err(|e| kube_err(ferry_task::codes::KUBECONFIG, e))?;
            let addon = self.inner.cfg.catalog.get(&self.addon.name).cloned();
            let timeout = secs(cmd.addon_timeout_seconds, 600);
            for r in addon.iter().flat_map(|a| a.ready.iter()) {
                self.wait_ready(cluster, &client, r, timeout).await?;
                cx.progress(80, format!("{} {}/{} ready", r.kind, r.namespace, r.name));
            }
            self.apply_all(cluster, &m.after).await?;
            cx.progress(100, format!("add-on {} ready", self.addon.name));
            Ok(json!({"objects": m.install.iter().chain(&m.after).map(describe).collect::<Vec<_>>()}))
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            let cluster = cx.spec.name.as_str();
            // The cluster (or its kubeconfig) is gone already: so is the add-on.
            match self.inner.cfg.clusters.client(cluster).await {
                Err(ClusterError::Unknown { .. }) => return Ok(()),
                Err(e) => return Err(kube_err(ferry_task::codes::KUBECONFIG, e)),
                Ok(_) => {}
            }
            let m = self.inner.cfg.catalog.manifests(&self.addon).await.map_err(|e| StepError::transient(ferry_task::codes::ADDON_SOURCE, e.to_string()))?;
            for o in m.after.iter().chain(&m.install).rev() {
                match self.inner.cfg.clusters.delete(cluster, o).await {
                    Ok(_) | Err(ClusterError::NotServed { .. }) => {}
                    Err(e) => return Err(kube_err(ferry_task::codes::WORKLOAD_API, e)),
                }
            }
            cx.progress(100, format!("add-on {} removed", self.addon.name));
            Ok(())
        }
        .boxed()
    }
}

// ---------------------------------------------------------------------------------------
// OCM registration

struct RegisterStep(Arc<Inner>);

async fn deregister(inner: &Inner, cmd: &ClusterCommand) -> Result<bool, StepError> {
    let Some(_) = own_managed_cluster(inner, cmd).await? else {
        return Ok(false);
    };
    let hub = inner.hub();
    let api: Api<ManagedCluster> = Api::all(hub.clone());
    match api.delete(&cmd.name, &Default::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(hub_err(e)),
    }
    inner.cfg.watches.wait_deleted::<ManagedCluster>(HUB, &hub, None, &cmd.name, inner.cfg.removal_timeout).await.map_err(wait_err)?;
    Ok(true)
}

impl Step<ClusterCommand> for RegisterStep {
    fn name(&self) -> &str {
        "register"
    }

    fn policy(&self) -> StepPolicy {
        wait_policy(self.0.cfg.registration_timeout.max(self.0.cfg.removal_timeout))
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let cmd = cx.spec;
            let hub = self.0.hub();
            self.0.cfg.clusters.apply(HUB, &render::managed_cluster(cmd), MANAGER).await.map_err(|e| kube_err(ferry_task::codes::HUB_API, e))?;
            cx.progress(30, format!("ManagedCluster {} accepted; waiting for it to join", cmd.name));
            let mut seen = false;
            self.0
                .cfg
                .watches
                .wait_object::<ManagedCluster, ()>(HUB, &hub, None, &cmd.name, self.0.cfg.registration_timeout, |m| {
                    seen |= m.is_some();
                    match m {
                        None if seen => Check::Failed("the ManagedCluster was deleted".into()),
                        None => Check::Pending("the watch has not seen the ManagedCluster yet".into()),
                        Some(m) if m.condition("ManagedClusterConditionAvailable") == Some("True") => Check::Done(()),
                        Some(m) => Check::Pending(
                            ferry_kube::kinds::condition_message(&m.status, "ManagedClusterConditionAvailable").unwrap_or_else(|| "not joined yet".into()),
                        ),
                    }
                })
                .await
                .map_err(wait_err)?;
            let set = cmd.ocm.cluster_set.clone().unwrap_or_else(|| "default".into());
            cx.progress(100, format!("registered with OCM in ManagedClusterSet {set}"));
            Ok(json!({"managed_cluster": cmd.name, "cluster_set": set}))
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            deregister(&self.0, cx.spec).await?;
            Ok(())
        }
        .boxed()
    }
}

// ---------------------------------------------------------------------------------------
// scale

/// Output of a scale's `check`: the counts before.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Counts {
    /// Control-plane replicas.
    pub control_plane: i64,
    /// Worker replicas.
    pub workers: i64,
}

/// The Ferry-made Cluster of `cmd`, or a rejection.
async fn own_cluster(inner: &Inner, cmd: &ClusterCommand) -> Result<CapiCluster, StepError> {
    let (ns, name) = (cmd.namespace(), cmd.name.as_str());
    let Some(c) = clusters_api(&inner.hub(), ns).get_opt(name).await.map_err(hub_err)? else {
        return Err(StepError::rejected(ferry_task::codes::CLUSTER_NOT_FOUND, format!("no Cluster {ns}/{name}")));
    };
    if !is_ferrys(&c.metadata) {
        return Err(StepError::rejected(
            "CLUSTER_NOT_FERRYS",
            format!("Cluster {ns}/{name} was not created by Ferry (no label {}={})", MANAGED_BY.0, MANAGED_BY.1),
        ));
    }
    if c.metadata.deletion_timestamp.is_some() {
        return Err(StepError::rejected(ferry_task::codes::CLUSTER_DELETING, format!("Cluster {ns}/{name} is being deleted")));
    }
    Ok(c)
}

/// Where a cluster's replica counts live: its control plane and MachineDeployment, or its
/// topology.
enum Replicas {
    Objects { control_plane: Value, workers: Value },
    Topology,
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
        let found = inner.cfg.clusters.get(HUB, &o).await.map_err(|e| kube_err(ferry_task::codes::HUB_API, e))?;
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
                let gvk = ferry_kube::clusters::gvk_of(&o).map_err(|e| kube_err(ferry_task::codes::HUB_API, e))?;
                let api = inner.cfg.clusters.api(HUB, &gvk, Some(cmd.namespace())).await.map_err(|e| kube_err(ferry_task::codes::HUB_API, e))?;
                let name = o["metadata"]["name"].as_str().unwrap_or_default().to_owned();
                // A merge patch of replicas only: the create's applied fields stay its own.
                api.patch(&name, &pp, &Patch::Merge(&json!({"spec": {"replicas": n}}))).await.map_err(hub_err)?;
            }
        }
    }
    Ok(())
}

struct ScaleCheck(Arc<Inner>);

impl Step<ClusterCommand> for ScaleCheck {
    fn acts(&self) -> bool {
        false // reads the live state only
    }

    fn name(&self) -> &str {
        "check"
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let c = own_cluster(&self.0, cx.spec).await?;
            let before = read_counts(&self.0, cx.spec, &c).await?;
            cx.progress(100, format!("now {} control-plane and {} worker machines", before.control_plane, before.workers));
            Ok(serde_json::to_value(before).unwrap_or_default())
        }
        .boxed()
    }

    fn undo<'a>(&'a self, _: &'a StepContext<'a, ClusterCommand>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async { Ok(()) }.boxed()
    }
}

fn before(cx: &StepContext<'_, ClusterCommand>) -> Result<Counts, StepError> {
    cx.required("check")
}

fn target(cmd: &ClusterCommand, before: &Counts) -> Counts {
    Counts { control_plane: cmd.control_plane.count.map_or(before.control_plane, i64::from), workers: cmd.workers.count.map_or(before.workers, i64::from) }
}

struct ScaleStep(Arc<Inner>);

impl Step<ClusterCommand> for ScaleStep {
    fn name(&self) -> &str {
        "scale"
    }

    fn policy(&self) -> StepPolicy {
        wait_policy(Duration::from_secs(1800))
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let to = target(cx.spec, &before(cx)?);
            set_counts(&self.0, cx.spec, &to).await?;
            cx.progress(100, format!("asked for {} control-plane and {} worker machines", to.control_plane, to.workers));
            Ok(serde_json::to_value(to).unwrap_or_default())
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            let b = before(cx)?;
            set_counts(&self.0, cx.spec, &b).await?;
            cx.progress(50, format!("restoring {} control-plane and {} worker machines", b.control_plane, b.workers));
            wait_nodes(&self.0, cx.spec, (b.control_plane + b.workers) as usize, ready_timeout(cx.spec), cx).await?;
            Ok(())
        }
        .boxed()
    }
}

struct ScaleWait(Arc<Inner>);

impl Step<ClusterCommand> for ScaleWait {
    fn name(&self) -> &str {
        "wait"
    }

    fn policy(&self) -> StepPolicy {
        wait_policy(Duration::from_secs(1800))
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let to = target(cx.spec, &before(cx)?);
            let nodes = wait_nodes(&self.0, cx.spec, (to.control_plane + to.workers) as usize, ready_timeout(cx.spec), cx).await?;
            cx.progress(100, format!("{} nodes Ready", nodes.len()));
            Ok(json!({"nodes": nodes}))
        }
        .boxed()
    }

    fn undo<'a>(&'a self, _: &'a StepContext<'a, ClusterCommand>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async { Ok(()) }.boxed()
    }
}

// ---------------------------------------------------------------------------------------
// delete

struct DeleteCheck(Arc<Inner>);

impl Step<ClusterCommand> for DeleteCheck {
    fn acts(&self) -> bool {
        false // reads the live state only
    }

    fn name(&self) -> &str {
        "check"
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let c = own_cluster(&self.0, cx.spec).await?;
            let registered = own_managed_cluster(&self.0, cx.spec).await?.is_some();
            cx.progress(100, format!("Cluster created by task {}; registered with OCM: {registered}", task_of(&c.metadata)));
            Ok(json!({"registered": registered}))
        }
        .boxed()
    }

    fn undo<'a>(&'a self, _: &'a StepContext<'a, ClusterCommand>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async { Ok(()) }.boxed()
    }
}

struct DeregisterStep(Arc<Inner>);

impl Step<ClusterCommand> for DeregisterStep {
    fn name(&self) -> &str {
        "deregister"
    }

    fn policy(&self) -> StepPolicy {
        wait_policy(self.0.cfg.removal_timeout)
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let removed = deregister(&self.0, cx.spec).await?;
            cx.progress(100, if removed { "ManagedCluster removed" } else { "not registered with OCM" });
            Ok(json!({"removed": removed}))
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>, out: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            // Re-register while the Cluster still stands (the deletion failed before it began).
            let registered: bool = cx.output_of::<Value>("check").and_then(|v| v["registered"].as_bool()).unwrap_or(false);
            let removed = out.and_then(|o| o["removed"].as_bool()).unwrap_or(registered);
            if removed && own_cluster(&self.0, cx.spec).await.is_ok() {
                let mut cmd = cx.spec.clone();
                cmd.ocm.enabled = true;
                self.0.cfg.clusters.apply(HUB, &render::managed_cluster(&cmd), MANAGER).await.map_err(|e| kube_err(ferry_task::codes::HUB_API, e))?;
            }
            Ok(())
        }
        .boxed()
    }
}

/// Every `(group, kind)` the worker may have rendered besides the Cluster.
const RENDERED_KINDS: &[(&str, &str)] = &[
    ("cluster.x-k8s.io", "MachineDeployment"),
    ("controlplane.cluster.x-k8s.io", "KubeadmControlPlane"),
    ("controlplane.cluster.x-k8s.io", "KThreesControlPlane"),
    ("bootstrap.cluster.x-k8s.io", "KubeadmConfigTemplate"),
    ("bootstrap.cluster.x-k8s.io", "KThreesConfigTemplate"),
    ("infrastructure.cluster.x-k8s.io", "DockerCluster"),
    ("infrastructure.cluster.x-k8s.io", "DockerMachineTemplate"),
    ("infrastructure.cluster.x-k8s.io", "OpenStackCluster"),
    ("infrastructure.cluster.x-k8s.io", "OpenStackMachineTemplate"),
];

struct DeleteStep(Arc<Inner>);

impl Step<ClusterCommand> for DeleteStep {
    fn name(&self) -> &str {
        "delete"
    }

    fn policy(&self) -> StepPolicy {
        wait_policy(self.0.cfg.removal_timeout)
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let cmd = cx.spec;
            let inner = &self.0;
            let hub = inner.hub();
            let (ns, name) = (cmd.namespace(), cmd.name.as_str());
            match clusters_api(&hub, ns).delete(name, &kube::api::DeleteParams::background()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(hub_err(e)),
            }
            cx.progress(10, format!("Cluster {ns}/{name} deleting"));
            inner.cfg.watches.wait_deleted::<CapiCluster>(HUB, &hub, Some(ns), name, inner.cfg.removal_timeout).await.map_err(wait_err)?;
            inner.cfg.watches.forget(name);
            cx.progress(80, "Cluster gone; deleting its templates");
            let mut removed = BTreeMap::new();
            for (group, kind) in RENDERED_KINDS {
                let gvk = GroupVersionKind::gvk(group, "v1beta2", kind);
                let api = match inner.cfg.clusters.api(HUB, &gvk, Some(ns)).await {
                    Ok(a) => a,
                    Err(ClusterError::NotServed { .. }) => continue,
                    Err(e) => return Err(kube_err(ferry_task::codes::HUB_API, e)),
                };
                let lp = ListParams::default().labels(&format!("{CLUSTER_LABEL}={name},{}={}", MANAGED_BY.0, MANAGED_BY.1));
                for o in api.list(&lp).await.map_err(hub_err)?.items {
                    let n = o.metadata.name.clone().unwrap_or_default();
                    match api.delete(&n, &Default::default()).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(s)) if s.code == 404 => {}
                        Err(e) => return Err(hub_err(e)),
                    }
                    *removed.entry((*kind).to_owned()).or_insert(0) += 1;
                }
            }
            cx.progress(100, format!("Cluster {ns}/{name} deleted"));
            Ok(json!({"removed": removed}))
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>, out: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            let gone_or_going = match clusters_api(&self.0.hub(), cx.spec.namespace()).get_opt(&cx.spec.name).await.map_err(hub_err)? {
                None => true,
                Some(c) => c.metadata.deletion_timestamp.is_some(),
            };
            if out.is_some() || gone_or_going {
                return Err(StepError::permanent(
                    "IRREVERSIBLE",
                    format!("Cluster {} is deleted (or being deleted): a deletion cannot be undone; create it again with a create command", cx.spec.subject()),
                ));
            }
            Ok(())
        }
        .boxed()
    }
}

// ---------------------------------------------------------------------------------------

impl TaskHandler for ClusterHandler {
    type Spec = ClusterCommand;

    fn kind(&self) -> TaskKind {
        TaskKind::CreateCluster
    }

    fn validate(&self, subject: &str, spec: &ClusterCommand) -> Result<(), Rejection> {
        crate::validate::validate(subject, spec, &self.inner.cfg.catalog)
    }

    fn plan(&self, spec: &ClusterCommand) -> Vec<Arc<dyn Step<ClusterCommand>>> {
        let i = &self.inner;
        match spec.operation {
            ClusterOperation::Create => {
                let mut steps: Vec<Arc<dyn Step<ClusterCommand>>> = vec![
                    Arc::new(CreateCheck(i.clone())),
                    Arc::new(ApplyStep(i.clone())),
                    Arc::new(ClusterWait { inner: i.clone(), step: "infrastructure", field: "infrastructureProvisioned", what: "infrastructure provisioned" }),
                    Arc::new(ClusterWait { inner: i.clone(), step: "control-plane", field: "controlPlaneInitialized", what: "control plane initialized" }),
                    Arc::new(KubeconfigStep(i.clone())),
                    Arc::new(NodesStep(i.clone())),
                ];
                for a in &spec.addons {
                    steps.push(Arc::new(AddonStep { inner: i.clone(), addon: a.clone(), step: format!("addon-{}", a.name) }));
                }
                if spec.ocm.enabled {
                    steps.push(Arc::new(RegisterStep(i.clone())));
                }
                steps
            }
            ClusterOperation::Scale => vec![Arc::new(ScaleCheck(i.clone())), Arc::new(ScaleStep(i.clone())), Arc::new(ScaleWait(i.clone()))],
            ClusterOperation::Delete => vec![Arc::new(DeleteCheck(i.clone())), Arc::new(DeregisterStep(i.clone())), Arc::new(DeleteStep(i.clone()))],
        }
    }
}

//! The `offload` tasks. Offload: check (the namespace exists; every target is peered
//! with the cluster: it has a virtual node of it) → offload (the NamespaceOffloading;
//! waits until its phase is Ready on every target) → twins (waits for the twin namespaces
//! on the targets). Unoffload: check (records the offloading) → remove (deletes it; waits
//! until it and the twin namespaces are gone); its revert restores it. Burst: check (the
//! Deployment, its pods' requests, the candidates) → scale (the replicas wanted; waits
//! until every pod is placed or unschedulable) → place (the overflow to the nearest
//! candidates with room) → offload (to those) → ready (every replica Ready). Undo
//! restores what was there: the previous offloading or none, the previous replicas.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ferry_kube::kinds::node_ready;
use ferry_kube::step_errors::{api_err, client_err, kube_err, wait_err};
use ferry_kube::{Check, ClusterError, Clusters, Watches};
use ferry_task::{Rejection, Step, StepContext, StepError, StepPolicy, TaskHandler, TaskKind};
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::latency::LatencyMatrix;
use crate::liqo::{self, Progress, REMOTE_ID_LABEL};
use crate::placement::{self, Candidate, Resources, Share};
use crate::spec::{OffloadCommand, OffloadOperation, PodOffloadingStrategy};

ferry_kube::resource!(
    /// Liqo NamespaceOffloading.
    NamespaceOffloading, "NamespaceOffloading", "offloading.liqo.io", "v1beta1", "namespaceoffloadings", Namespaced
);

/// Field manager of the worker's writes.
pub const MANAGER: &str = "ferry-offload";

/// What the offload worker needs.
#[derive(Clone)]
pub struct OffloadConfig {
    /// The hub and the clusters.
    pub clusters: Arc<Clusters>,
    /// Shared watches.
    pub watches: Arc<Watches>,
    /// Milliseconds between clusters, for bursts.
    pub latency: LatencyMatrix,
    /// How long removals (the offloading, its twin namespaces) have to finish.
    pub removal_timeout: Duration,
}

impl OffloadConfig {
    /// A config reaching clusters through `clusters`, no latency known, 300 s removals.
    pub fn new(clusters: Arc<Clusters>) -> Self {
        Self { clusters, watches: Arc::new(Watches::new()), latency: LatencyMatrix::default(), removal_timeout: Duration::from_secs(300) }
    }
}

struct Inner {
    cfg: OffloadConfig,
}

/// The handler of `offload` tasks.
#[derive(Clone)]
pub struct OffloadHandler {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for OffloadHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OffloadHandler").finish_non_exhaustive()
    }
}

impl OffloadHandler {
    /// A handler.
    pub fn new(cfg: OffloadConfig) -> Self {
        Self { inner: Arc::new(Inner { cfg }) }
    }
}

fn policy(c: &OffloadCommand) -> StepPolicy {
    StepPolicy { timeout: c.timeout() * 3 + Duration::from_secs(600), ..StepPolicy::default() }
}

/// A peered cluster the namespace goes to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    /// The cluster's name (None when no kubeconfig names it: its twin is not checked).
    pub cluster: Option<String>,
    /// Its Liqo cluster id.
    pub id: String,
    /// Its virtual node on the consumer.
    pub node: String,
}

/// What `check` found.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Checked {
    /// The targets (offload) or the candidates (burst).
    pub targets: Vec<Target>,
    /// The namespace's offloading before the task (its spec), if any.
    pub previous: Option<Value>,
    /// The Ferry task that made that offloading, if one did.
    #[serde(default)]
    pub previous_task: Option<String>,
    /// Burst: the Deployment's replicas before.
    pub previous_replicas: Option<i32>,
    /// Burst: what one pod requests.
    pub per_pod: Option<Resources>,
}

fn checked(cx: &StepContext<'_, OffloadCommand>) -> Result<Checked, StepError> {
    cx.required("check")
}

/// The Ferry task that made offloading `o` (its [`liqo::TASK_LABEL`]), if one did.
fn made_by(o: &NamespaceOffloading) -> Option<&str> {
    o.metadata.labels.as_ref()?.get(liqo::TASK_LABEL).map(String::as_str)
}

fn remote_id(n: &Node) -> Option<String> {
    n.metadata.labels.as_ref().and_then(|l| l.get(REMOTE_ID_LABEL)).cloned()
}

impl Inner {
    async fn client(&self, cluster: &str) -> Result<kube::Client, StepError> {
        self.cfg.clusters.client(cluster).await.map_err(client_err)
    }

    /// The Liqo cluster id of `cluster`.
    async fn liqo_id(&self, cluster: &str) -> Result<String, StepError> {
        let client = self.client(cluster).await?;
        ferry_kube::vocab::liqo::cluster_id(client).await.map_err(api_err(cluster))?.ok_or_else(|| {
            StepError::rejected(
                "LIQO_MISSING",
                format!("{cluster} runs no Liqo (no ConfigMap {}/{})", ferry_kube::vocab::liqo::LIQO_NAMESPACE, ferry_kube::vocab::liqo::CLUSTER_ID_CONFIGMAP),
            )
        })
    }

    async fn virtual_nodes(&self, cluster: &str) -> Result<Vec<Node>, StepError> {
        let client = self.client(cluster).await?;
        Ok(Api::<Node>::all(client).list(&ListParams::default().labels(liqo::VIRTUAL_NODE_SELECTOR)).await.map_err(api_err(cluster))?.items)
    }

    /// The clusters `c` targets among `c.cluster`'s peers: the named ones (each must be
    /// peered: a Rejection names the first that is not), the selected ones, or all.
    async fn targets(&self, c: &OffloadCommand) -> Result<Vec<Target>, StepError> {
        let nodes = self.virtual_nodes(&c.cluster).await?;
        let peers: Vec<String> = nodes.iter().filter_map(remote_id).collect();
        let mut out = Vec::new();
        if !c.clusters.is_empty() {
            for t in &c.clusters {
                let id = self.liqo_id(t).await?;
                let Some(n) = nodes.iter().find(|n| remote_id(n).as_deref() == Some(&id)) else {
                    return Err(StepError::rejected(
                        "NOT_PEERED",
                        format!(
                            "{t} is not peered with {}: {} has no virtual node of it ({REMOTE_ID_LABEL}={id}; its peers: {peers:?}); peer them first",
                            c.cluster, c.cluster
                        ),
                    ));
                };
                out.push(Target { cluster: Some(t.clone()), id, node: n.metadata.name.clone().unwrap_or_default() });
            }
            return Ok(out);
        }
        for n in &nodes {
            let labels = n.metadata.labels.clone().unwrap_or_default();
            if !liqo::matches(&labels, &c.cluster_selector) {
                continue;
            }
            let Some(id) = remote_id(n) else { continue };
            // Ferry knows clusters by name; Liqo by id. A kubeconfig named as the id is the cluster.
            let cluster = self.cfg.clusters.client(&id).await.ok().map(|_| id.clone());
            out.push(Target { cluster, id, node: n.metadata.name.clone().unwrap_or_default() });
        }
        if out.is_empty() && c.operation != OffloadOperation::Burst {
            let why = if c.cluster_selector.is_empty() {
                "it has no peered clusters".to_owned()
            } else {
                format!("the cluster selector matches none of its peers {peers:?}")
            };
            return Err(StepError::rejected(ferry_task::codes::NOT_PEERED, format!("nothing to offload {} of {} to: {why}", c.namespace, c.cluster)));
        }
        Ok(out)
    }

    /// Waits until the virtual nodes of `targets` are Ready.
    async fn targets_ready(&self, c: &OffloadCommand, targets: &[Target]) -> Result<(), StepError> {
        let client = self.client(&c.cluster).await?;
        for t in targets {
            self.cfg
                .watches
                .wait_object::<Node, ()>(&c.cluster, &client, None, &t.node, c.timeout(), |n| match n {
                    Some(n) if node_ready(n) => Check::Done(()),
                    Some(_) => Check::Pending("the virtual node is not Ready".into()),
                    None => Check::Pending("the virtual node is gone".into()),
                })
                .await
                .map_err(|e| wait_err(ferry_task::codes::PEER_NOT_READY, e))?;
        }
        Ok(())
    }

    async fn offloading(&self, c: &OffloadCommand) -> Result<Option<NamespaceOffloading>, StepError> {
        let client = self.client(&c.cluster).await?;
        Api::<NamespaceOffloading>::namespaced(client, &c.namespace).get_opt(liqo::NAME).await.map_err(api_err(&c.cluster))
    }

    /// Applies the offloading with `spec` and waits until it is Ready on `ids`; the twin
    /// namespaces' name.
    async fn offload(&self, c: &OffloadCommand, spec: &Value, ids: &[String], task: Option<&str>) -> Result<String, StepError> {
        let obj = liqo::namespace_offloading(&c.namespace, spec, task);
        let applied = self.cfg.clusters.apply(&c.cluster, &obj, MANAGER).await.map_err(|e| match e {
            e @ ClusterError::NotServed { .. } => StepError::permanent(ferry_task::codes::LIQO_MISSING, format!("{e}: is Liqo installed on {}?", c.cluster)),
            e => kube_err(ferry_task::codes::APPLY_FAILED, e),
        })?;
        let client = self.client(&c.cluster).await?;
        self.cfg
            .watches
            .wait_object::<NamespaceOffloading, String>(&c.cluster, &client, Some(&c.namespace), liqo::NAME, c.timeout(), |o| match o {
                None => Check::Pending("not seen yet".into()),
                // The shared watch may still hold one an earlier task removed.
                Some(o) if o.metadata.uid != applied.metadata.uid => Check::Pending("the watch has not seen the applied object yet".into()),
                Some(o) => match liqo::progress(&o.status, o.metadata.generation, ids) {
                    Progress::Ready(n) => Check::Done(n),
                    Progress::Pending(why) => Check::Pending(why),
                    Progress::Failed(why) => Check::Failed(why),
                },
            })
            .await
            .map_err(|e| wait_err(ferry_task::codes::OFFLOADING_FAILED, e))
    }

    /// Deletes the namespace's offloading and waits until it is gone (Liqo removes the
    /// twin namespaces before it lets it go).
    async fn unoffload(&self, c: &OffloadCommand) -> Result<(), StepError> {
        let obj = liqo::namespace_offloading(&c.namespace, &json!({}), None);
        self.cfg.clusters.delete(&c.cluster, &obj).await.map_err(|e| kube_err(ferry_task::codes::CLUSTER_API, e))?;
        let client = self.client(&c.cluster).await?;
        self.cfg
            .watches
            .wait_deleted::<NamespaceOffloading>(&c.cluster, &client, Some(&c.namespace), liqo::NAME, self.cfg.removal_timeout)
            .await
            .map_err(|e| wait_err(ferry_task::codes::REMOVAL, e))
    }

    /// The pods of `deployment` (by its selector), not being deleted.
    fn deployment_pods<'s>(store: &'s [Arc<Pod>], selector: &BTreeMap<String, String>) -> Vec<&'s Arc<Pod>> {
        store
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| {
                let l = p.metadata.labels.clone().unwrap_or_default();
                selector.iter().all(|(k, v)| l.get(k) == Some(v))
            })
            .collect()
    }
}

// ---------------------------------------------------------------------------------------
// Steps

struct CheckStep(Arc<Inner>, StepPolicy);

impl Step<OffloadCommand> for CheckStep {
    fn acts(&self) -> bool {
        false // reads the live state only
    }

    fn name(&self) -> &str {
        "check"
    }

    fn policy(&self) -> StepPolicy {
        self.1.clone()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, OffloadCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let c = cx.spec;
            let client = self.0.client(&c.cluster).await?;
            if Api::<Namespace>::all(client.clone()).get_opt(&c.namespace).await.map_err(api_err(&c.cluster))?.is_none() {
                return Err(StepError::rejected(ferry_task::codes::NAMESPACE_MISSING, format!("namespace {} does not exist on {}", c.namespace, c.cluster)));
            }
            let current = self.0.offloading(c).await?;
            let previous_task = current.as_ref().and_then(made_by).map(str::to_owned);
            let mut out = Checked { previous: current.map(|o| o.spec), previous_task, ..Checked::default() };
            match c.operation {
                OffloadOperation::Unoffload => {
                    let msg = if out.previous.is_some() { "offloaded now; it will be removed" } else { "not offloaded: nothing to remove" };
                    cx.progress(100, format!("{}/{}: {msg}", c.cluster, c.namespace));
                }
                OffloadOperation::Offload => {
                    out.targets = self.0.targets(c).await?;
                    self.0.targets_ready(c, &out.targets).await?;
                    cx.progress(100, format!("peered and ready: {:?}", out.targets.iter().map(|t| &t.id).collect::<Vec<_>>()));
                }
                OffloadOperation::Burst => {
                    let name = c.deployment.clone().unwrap_or_default();
                    let Some(d) = Api::<Deployment>::namespaced(client, &c.namespace).get_opt(&name).await.map_err(api_err(&c.cluster))? else {
                        return Err(StepError::rejected(ferry_task::codes::DEPLOYMENT_MISSING, format!("Deployment {}/{name} does not exist on {}", c.namespace, c.cluster)));
                    };
                    let spec = d.spec;
                    out.previous_replicas = Some(spec.replicas.unwrap_or(1));
                    out.per_pod = Some(spec.template.spec.as_ref().map(placement::pod_requests).unwrap_or_default());
                    out.targets = self.0.targets(c).await?;
                    cx.progress(
                        100,
                        format!(
                            "Deployment {name}: {} replicas now; candidates {:?}",
                            spec.replicas.unwrap_or(1),
                            out.targets.iter().map(|t| &t.id).collect::<Vec<_>>()
                        ),
                    );
                }
            }
            Ok(serde_json::to_value(out).unwrap_or_default())
        }
        .boxed()
    }

    fn undo<'a>(&'a self, _: &'a StepContext<'a, OffloadCommand>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async { Ok(()) }.boxed()
    }
}

/// The targets of the `offload` step: `check`'s (offload) or `place`'s (burst).
fn offload_targets(cx: &StepContext<'_, OffloadCommand>) -> Result<Vec<Target>, StepError> {
    match cx.spec.operation {
        OffloadOperation::Burst => {
            let shares: Vec<Share> = cx.required("place")?;
            Ok(shares.into_iter().map(|s| Target { cluster: Some(s.cluster), id: s.id, node: s.node }).collect())
        }
        _ => Ok(checked(cx)?.targets),
    }
}

struct OffloadStep(Arc<Inner>, StepPolicy);

impl Step<OffloadCommand> for OffloadStep {
    fn name(&self) -> &str {
        "offload"
    }

    fn policy(&self) -> StepPolicy {
        self.1.clone()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, OffloadCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let c = cx.spec;
            let targets = offload_targets(cx)?;
            let ids: Vec<String> = targets.iter().map(|t| t.id.clone()).collect();
            if targets.is_empty() {
                cx.progress(100, "nothing overflows: no offloading needed");
                return Ok(json!({"remote_namespace": null, "targets": []}));
            }
            let burst = c.operation == OffloadOperation::Burst;
            // A burst into a namespace someone else offloaded: only within their targets.
            if burst && let Some(prev) = checked(cx)?.previous {
                let current = self.0.offloading(c).await?;
                if current.as_ref().and_then(made_by) != Some(&cx.task_id.to_string()) {
                    let status = current.map(|o| o.status).unwrap_or_default();
                    return match liqo::progress(&status, None, &ids) {
                        Progress::Ready(n) => {
                            cx.progress(100, format!("{} is already offloaded to {ids:?}; the overflow goes there", c.namespace));
                            Ok(json!({"remote_namespace": n, "targets": targets, "reused": true}))
                        }
                        _ => Err(StepError::permanent(
                            "ALREADY_OFFLOADED",
                            format!(
                                "{} is already offloaded ({prev}) and not to all of {ids:?} the overflow needs: unoffload it or burst within its clusters",
                                c.namespace
                            ),
                        )),
                    };
                }
            }
            let strategy = if burst { PodOffloadingStrategy::LocalAndRemote } else { c.pod_offloading_strategy };
            let selector = if c.clusters.is_empty() && !burst { None } else { Some(ids.as_slice()) };
            cx.progress(20, format!("NamespaceOffloading {}/offloading toward {ids:?}", c.namespace));
            let remote = self.0.offload(c, &liqo::spec(c, strategy, selector), &ids, Some(&cx.task_id.to_string())).await?;
            cx.progress(100, format!("offloading Ready; twin namespace {remote} on {ids:?}"));
            Ok(json!({"remote_namespace": remote, "targets": targets}))
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, OffloadCommand>, out: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            let c = cx.spec;
            if out.and_then(|o| o.get("reused")).and_then(Value::as_bool) == Some(true) {
                return Ok(());
            }
            let current = self.0.offloading(c).await?;
            if current.as_ref().and_then(made_by) != Some(&cx.task_id.to_string()) {
                return Ok(());
            }
            let ch = checked(cx)?;
            match ch.previous {
                // It was there before: put it back as it was.
                Some(prev) => {
                    self.0.offload(c, &prev, &[], ch.previous_task.as_deref()).await?;
                    cx.progress(100, "the previous offloading is restored");
                }
                None => {
                    self.0.unoffload(c).await?;
                    cx.progress(100, "the offloading and its twin namespaces are removed");
                }
            }
            Ok(())
        }
        .boxed()
    }
}

struct TwinsStep(Arc<Inner>, StepPolicy);

impl Step<OffloadCommand> for TwinsStep {
    fn name(&self) -> &str {
        "twins"
    }

    fn policy(&self) -> StepPolicy {
        self.1.clone()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, OffloadCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let c = cx.spec;
            let out: Value = cx.output_of("offload").unwrap_or_default();
            let Some(remote) = out["remote_namespace"].as_str() else { return Ok(json!({"twins": []})) };
            let targets = offload_targets(cx)?;
            let mut twins = Vec::new();
            for (i, t) in targets.iter().enumerate() {
                let Some(cluster) = &t.cluster else {
                    cx.progress(100, format!("{}: no kubeconfig names this Liqo id; its twin is not checked", t.id));
                    continue;
                };
                let client = self.0.client(cluster).await?;
                self.0
                    .cfg
                    .watches
                    .wait_object::<Namespace, ()>(cluster, &client, None, remote, c.timeout(), |n| match n {
                        Some(n) if n.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Active") => Check::Done(()),
                        Some(_) => Check::Pending("not Active".into()),
                        None => Check::Pending("not created yet".into()),
                    })
                    .await
                    .map_err(|e| wait_err(ferry_task::codes::TWIN_MISSING, e))?;
                cx.progress((100 * (i + 1) / targets.len()) as u8, format!("namespace {remote} exists on {cluster}"));
                twins.push(json!({"cluster": cluster, "namespace": remote}));
            }
            Ok(json!({"twins": twins}))
        }
        .boxed()
    }

    fn undo<'a>(&'a self, _: &'a StepContext<'a, OffloadCommand>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        // The offload step's undo removes the offloading, and Liqo the twins with it.
        async { Ok(()) }.boxed()
    }
}

/// Unoffload: remove the offloading; revert puts it back as it was.
struct RemoveStep(Arc<Inner>, StepPolicy);

impl Step<OffloadCommand> for RemoveStep {
    fn name(&self) -> &str {
        "remove"
    }

    fn policy(&self) -> StepPolicy {
        self.1.clone()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, OffloadCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let c = cx.spec;
            if checked(cx)?.previous.is_none() {
                cx.progress(100, "not offloaded: nothing removed");
                return Ok(json!({"removed": false}));
            }
            self.0.unoffload(c).await?;
            cx.progress(100, format!("{}/{} is no longer offloaded; its twin namespaces are gone", c.cluster, c.namespace));
            Ok(json!({"removed": true}))
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, OffloadCommand>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            let ch = checked(cx)?;
            if let Some(prev) = ch.previous {
                self.0.offload(cx.spec, &prev, &[], ch.previous_task.as_deref()).await?;
                cx.progress(100, "the offloading is restored");
            }
            Ok(())
        }
        .boxed()
    }
}

/// Burst: scale to the replicas wanted and see what the scheduler cannot place.
struct ScaleStep(Arc<Inner>, StepPolicy);

/// What `scale` saw once the scheduler had tried every pod.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Scaled {
    /// Pods placed on nodes.
    pub placed: u32,
    /// Pods the scheduler could not place.
    pub pending: u32,
}

impl ScaleStep {
    async fn set_replicas(&self, c: &OffloadCommand, replicas: i32) -> Result<BTreeMap<String, String>, StepError> {
        let client = self.0.client(&c.cluster).await?;
        let api = Api::<Deployment>::namespaced(client, &c.namespace);
        let name = c.deployment.clone().unwrap_or_default();
        let d = api.patch(&name, &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": replicas}}))).await.map_err(api_err(&c.cluster))?;
        Ok(d.spec.selector.match_labels.unwrap_or_default())
    }

    /// Waits until `replicas` pods exist and each is placed or found unschedulable.
    async fn settle(&self, c: &OffloadCommand, selector: &BTreeMap<String, String>, replicas: u32, timeout: Duration) -> Result<Scaled, StepError> {
        let client = self.0.client(&c.cluster).await?;
        self.0
            .cfg
            .watches
            .wait_store::<Pod, Scaled>(
                &c.cluster,
                &client,
                Some(&c.namespace),
                &format!("the pods of {}", c.deployment.as_deref().unwrap_or("")),
                timeout,
                |s| {
                    let all = s.state();
                    let pods = Inner::deployment_pods(&all, selector);
                    let placed = pods.iter().filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some()).count() as u32;
                    let unschedulable = pods
                        .iter()
                        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none())
                        .filter(|p| {
                            p.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|cs| {
                                cs.iter().any(|c| c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some("Unschedulable"))
                            })
                        })
                        .count() as u32;
                    if pods.len() as u32 == replicas && placed + unschedulable == replicas {
                        Check::Done(Scaled { placed, pending: unschedulable })
                    } else {
                        Check::Pending(format!("{} pods of {replicas}: {placed} placed, {unschedulable} unschedulable", pods.len()))
                    }
                },
            )
            .await
            .map_err(|e| wait_err(ferry_task::codes::SCHEDULING, e))
    }
}

impl Step<OffloadCommand> for ScaleStep {
    fn name(&self) -> &str {
        "scale"
    }

    fn policy(&self) -> StepPolicy {
        self.1.clone()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, OffloadCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let c = cx.spec;
            let replicas = c.replicas.unwrap_or(1);
            let selector = self.set_replicas(c, replicas).await?;
            cx.progress(30, format!("{} scaled to {replicas}", c.deployment.as_deref().unwrap_or("")));
            let s = self.settle(c, &selector, replicas as u32, c.timeout()).await?;
            cx.progress(100, format!("{} placed, {} unschedulable", s.placed, s.pending));
            Ok(serde_json::to_value(s).unwrap_or_default())
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, OffloadCommand>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            let Some(prev) = checked(cx)?.previous_replicas else { return Ok(()) };
            self.set_replicas(cx.spec, prev).await?;
            cx.progress(100, format!("{} back to {prev} replicas", cx.spec.deployment.as_deref().unwrap_or("")));
            Ok(())
        }
        .boxed()
    }
}

/// Burst: the overflow to the nearest candidates with room.
struct PlaceStep(Arc<Inner>, StepPolicy);

impl Step<OffloadCommand> for PlaceStep {
    fn name(&self) -> &str {
        "place"
    }

    fn policy(&self) -> StepPolicy {
        self.1.clone()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, OffloadCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let c = cx.spec;
            let scaled: Scaled = cx.output_of("scale").unwrap_or_default();
            if scaled.pending == 0 {
                cx.progress(100, "every replica fits at home");
                return Ok(json!([]));
            }
            let ch = checked(cx)?;
            if ch.targets.is_empty() {
                return Err(StepError::permanent(
                    "NOT_PEERED",
                    format!("{} pods do not fit on {} and it has no peered cluster to burst to", scaled.pending, c.cluster),
                ));
            }
            self.0.targets_ready(c, &ch.targets).await?;
            let client = self.0.client(&c.cluster).await?;
            let pods = Api::<Pod>::all(client.clone());
            let nodes = Api::<Node>::all(client);
            let mut candidates = Vec::new();
            for t in &ch.targets {
                let Some(node) = nodes.get_opt(&t.node).await.map_err(api_err(&c.cluster))? else { continue };
                let alloc = node.status.and_then(|s| s.allocatable).unwrap_or_default();
                let q = |k: &str, f: fn(&str) -> Result<i64, ferry_kube::quantity::QuantityError>| alloc.get(k).and_then(|q| f(&q.0).ok()).unwrap_or(0);
                let mut free = Resources { cpu_m: q("cpu", ferry_kube::quantity::millicores), memory: q("memory", ferry_kube::quantity::units) };
                let lp = ListParams::default().fields(&format!("spec.nodeName={},status.phase!=Succeeded,status.phase!=Failed", t.node));
                for p in pods.list(&lp).await.map_err(api_err(&c.cluster))?.items {
                    let r = p.spec.as_ref().map(placement::pod_requests).unwrap_or_default();
                    free.cpu_m -= r.cpu_m;
                    free.memory -= r.memory;
                }
                let name = t.cluster.clone().unwrap_or_else(|| t.id.clone());
                let latency = c.latency_ms.get(&name).map(|v| *v as u32).or_else(|| self.0.cfg.latency.get(&c.cluster, &name));
                candidates.push(Candidate { cluster: name, id: t.id.clone(), node: t.node.clone(), latency_ms: latency, free });
            }
            let shares =
                placement::place(scaled.pending, ch.per_pod.unwrap_or_default(), candidates).map_err(|e| StepError::permanent(ferry_task::codes::NO_ROOM, e.to_string()))?;
            let summary: Vec<String> = shares
                .iter()
                .map(|s| format!("{} pods to {} ({})", s.pods, s.cluster, s.latency_ms.map_or("latency unknown".into(), |l| format!("{l} ms"))))
                .collect();
            cx.progress(100, summary.join(", "));
            Ok(serde_json::to_value(shares).unwrap_or_default())
        }
        .boxed()
    }

    fn undo<'a>(&'a self, _: &'a StepContext<'a, OffloadCommand>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async { Ok(()) }.boxed()
    }
}

/// Burst: every replica Ready, wherever it runs.
struct ReadyStep(Arc<Inner>, StepPolicy);

impl Step<OffloadCommand> for ReadyStep {
    fn name(&self) -> &str {
        "ready"
    }

    fn policy(&self) -> StepPolicy {
        self.1.clone()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, OffloadCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let c = cx.spec;
            let name = c.deployment.clone().unwrap_or_default();
            let replicas = c.replicas.unwrap_or(1);
            let client = self.0.client(&c.cluster).await?;
            self.0
                .cfg
                .watches
                .wait_object::<Deployment, ()>(&c.cluster, &client, Some(&c.namespace), &name, c.timeout(), |d| {
                    let ready = d.and_then(|d| d.status.as_ref()).and_then(|s| s.ready_replicas).unwrap_or(0);
                    if ready >= replicas { Check::Done(()) } else { Check::Pending(format!("{ready}/{replicas} replicas Ready")) }
                })
                .await
                .map_err(|e| wait_err(ferry_task::codes::NOT_READY, e))?;
            // Where they run: at home, or on which peer's virtual node.
            let selector = Api::<Deployment>::namespaced(client.clone(), &c.namespace)
                .get(&name)
                .await
                .map_err(api_err(&c.cluster))?
                .spec
                .selector
                .match_labels
                .unwrap_or_default();
            let sel: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let pods =
                Api::<Pod>::namespaced(client.clone(), &c.namespace).list(&ListParams::default().labels(&sel.join(","))).await.map_err(api_err(&c.cluster))?;
            let virtual_nodes: BTreeMap<String, String> =
                self.0.virtual_nodes(&c.cluster).await?.iter().filter_map(|n| Some((n.metadata.name.clone()?, remote_id(n)?))).collect();
            let mut on: BTreeMap<String, u32> = BTreeMap::new();
            for p in pods.items.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
                let node = p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
                *on.entry(virtual_nodes.get(&node).cloned().unwrap_or_else(|| c.cluster.clone())).or_default() += 1;
            }
            cx.progress(100, format!("{replicas} replicas Ready: {}", on.iter().map(|(k, v)| format!("{v} on {k}")).collect::<Vec<_>>().join(", ")));
            Ok(json!({"replicas": replicas, "on": on}))
        }
        .boxed()
    }

    fn undo<'a>(&'a self, _: &'a StepContext<'a, OffloadCommand>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async { Ok(()) }.boxed()
    }
}

impl TaskHandler for OffloadHandler {
    type Spec = OffloadCommand;

    fn kind(&self) -> TaskKind {
        TaskKind::Offload
    }

    fn validate(&self, subject: &str, spec: &OffloadCommand) -> Result<(), Rejection> {
        crate::spec::validate(subject, spec)
    }

    fn plan(&self, c: &OffloadCommand) -> Vec<Arc<dyn Step<OffloadCommand>>> {
        let (i, p) = (&self.inner, policy(c));
        let check: Arc<dyn Step<OffloadCommand>> = Arc::new(CheckStep(i.clone(), p.clone()));
        match c.operation {
            OffloadOperation::Offload => vec![check, Arc::new(OffloadStep(i.clone(), p.clone())), Arc::new(TwinsStep(i.clone(), p))],
            OffloadOperation::Unoffload => vec![check, Arc::new(RemoveStep(i.clone(), p))],
            OffloadOperation::Burst => vec![
                check,
                Arc::new(ScaleStep(i.clone(), p.clone())),
                Arc::new(PlaceStep(i.clone(), p.clone())),
                Arc::new(OffloadStep(i.clone(), p.clone())),
                Arc::new(ReadyStep(i.clone(), p)),
            ],
        }
    }
}

//! The `deploy` task: check (live rules that reject), place (OCM Placements →
//! decisions), apply (ManifestWorks, or objects through kubeconfigs, and the app record on
//! the hub), wait (every component's rollout, from ManifestWork feedback). Every step's
//! undo converges the fleet back to the app's previous state, so a revert of a deploy
//! removes it, of an update restores the previous spec, of a delete re-creates it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_kube::kinds::{ManagedCluster, ManifestWork, PlacementDecision};
use ferry_kube::step_errors::{hub_err, kube_err};
use ferry_kube::{Check, ClusterError, Clusters, HUB, Watches};
use ferry_task::{Rejection, Step, StepContext, StepError, StepPolicy, TaskHandler, TaskKind};
use ferry_kube::vocab::ocm::CLUSTERSET_LABEL;
use futures::FutureExt;
use futures::future::{BoxFuture, join_all};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::render::{self, APP_LABEL, AppState, MANAGER, OWNER_LABEL, SecretData, TASK_ANNOTATION, Targets};
use crate::spec::{Component, Delivery, DeployApp, DeployOperation};

/// Label OCM puts on a Placement's decisions.
pub const PLACEMENT_LABEL: &str = "cluster.open-cluster-management.io/placement";
/// Key of the app record's ConfigMap holding the [`AppState`] as JSON.
pub const STATE_KEY: &str = "state.json";

/// Name of the app record on the hub (a ConfigMap in the app's namespace).
pub fn record_name(app: &str) -> String {
    format!("ferry-app-{app}")
}

/// What the deploy worker needs.
#[derive(Clone)]
pub struct DeployConfig {
    /// The hub and the managed clusters.
    pub clusters: Arc<Clusters>,
    /// Shared watches (ManifestWorks, decisions, Deployments).
    pub watches: Arc<Watches>,
    /// How long a placement has to decide.
    pub placement_timeout: Duration,
    /// How long deleted ManifestWorks have to disappear.
    pub removal_timeout: Duration,
}

impl DeployConfig {
    /// Defaults: 120 s to place, 300 s to remove.
    pub fn new(clusters: Arc<Clusters>) -> Self {
        Self { clusters, watches: Arc::new(Watches::new()), placement_timeout: Duration::from_secs(120), removal_timeout: Duration::from_secs(300) }
    }
}

struct Inner {
    cfg: DeployConfig,
}

/// The handler of `deploy` tasks.
#[derive(Clone)]
pub struct DeployHandler {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for DeployHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeployHandler").finish_non_exhaustive()
    }
}

impl DeployHandler {
    /// A handler.
    pub fn new(cfg: DeployConfig) -> Self {
        Self { inner: Arc::new(Inner { cfg }) }
    }
}

/// Output of `check`: the app as it was before this task.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Checked {
    /// The previous state (None: not deployed).
    pub previous: Option<AppState>,
}

/// Output of `place`: where each component goes.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Placed {
    /// Component → clusters.
    pub targets: Targets,
}

/// One component on one cluster, as the `wait` step left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComponentStatus {
    /// The component.
    pub component: String,
    /// The cluster.
    pub cluster: String,
    /// Ready replicas.
    pub ready: i64,
    /// Its Service's ClusterIP or load-balancer address, when it has one.
    #[serde(default)]
    pub address: Option<String>,
}

/// Why the work agent has not applied `w` as it is now, or None when it has: Applied=True
/// observed at the current generation (older conditions and feedback describe the
/// previous spec).
fn unapplied(w: &ManifestWork) -> Option<String> {
    if w.condition("Applied") == Some("False") {
        return Some(ferry_kube::kinds::condition_message(&w.status, "Applied").unwrap_or_default());
    }
    let applied = w.status.get("conditions").and_then(Value::as_array).and_then(|cs| cs.iter().find(|c| c["type"] == "Applied"));
    if applied.is_some_and(|c| c["status"] == "True" && c["observedGeneration"].as_i64() == w.metadata.generation) {
        None
    } else {
        Some(format!("the work agent has not applied generation {} yet", w.metadata.generation.unwrap_or(0)))
    }
}

impl Inner {
    fn hub(&self) -> kube::Client {
        self.cfg.clusters.hub().clone()
    }

    async fn read_state(&self, app: &DeployApp) -> Result<Option<AppState>, StepError> {
        let cms: Api<ConfigMap> = Api::namespaced(self.hub(), app.namespace());
        let Some(cm) = cms.get_opt(&record_name(&app.name)).await.map_err(hub_err)? else { return Ok(None) };
        let text = cm.data.and_then(|mut d| d.remove(STATE_KEY)).unwrap_or_default();
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| StepError::permanent("BAD_APP_RECORD", format!("ConfigMap {}/{} on the hub: {e}", app.namespace(), record_name(&app.name))))
    }

    async fn write_state(&self, app: &DeployApp, state: Option<&AppState>, task: &str) -> Result<(), StepError> {
        let cms: Api<ConfigMap> = Api::namespaced(self.hub(), app.namespace());
        let name = record_name(&app.name);
        match state {
            Some(s) => {
                let cm = json!({
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": app.namespace(),
                        "labels": {"app.kubernetes.io/managed-by": "ferry", APP_LABEL: app.name, OWNER_LABEL: render::owner_label(&s.spec.owner)},
                        "annotations": {TASK_ANNOTATION: task}},
                    "data": {STATE_KEY: serde_json::to_string(s).expect("serializable")},
                });
                cms.patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&cm)).await.map_err(hub_err)?;
            }
            None => match cms.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(hub_err(e)),
            },
        }
        Ok(())
    }

    async fn ensure_hub_namespace(&self, ns: &str) -> Result<(), StepError> {
        let obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.hub());
        if api.get_opt(ns).await.map_err(hub_err)?.is_none() {
            api.patch(ns, &PatchParams::apply(MANAGER), &Patch::Apply(&obj)).await.map_err(hub_err)?;
        }
        Ok(())
    }

    /// The Secrets components reference, read from the app's namespace on the hub.
    async fn secrets(&self, app: &DeployApp, comps: &[&Component]) -> Result<BTreeMap<String, SecretData>, StepError> {
        let api: Api<Secret> = Api::namespaced(self.hub(), app.namespace());
        let mut out = BTreeMap::new();
        for name in comps.iter().flat_map(|c| c.secrets()).collect::<BTreeSet<_>>() {
            let s = api.get_opt(&name).await.map_err(hub_err)?.ok_or_else(|| {
                StepError::permanent("SECRET_MISSING", format!("Secret {}/{name} on the hub is gone (it existed when the task was checked)", app.namespace()))
            })?;
            let data = s.data.unwrap_or_default().into_iter().map(|(k, v)| (k, base64_encode(&v.0))).collect();
            out.insert(name, SecretData { type_: s.type_.unwrap_or_else(|| "Opaque".into()), data });
        }
        Ok(out)
    }

    /// Makes the fleet hold `to` instead of `from`: applies `to`'s objects and removes
    /// those only `from` has; records `to` on the hub. Safe to repeat and to interrupt.
    async fn converge(&self, from: Option<&AppState>, to: Option<&AppState>, app: &DeployApp, task: &str) -> Result<(), StepError> {
        let delivery = to.or(from).map(|s| s.spec.delivery).unwrap_or_default();
        if let Some(to) = to {
            self.ensure_hub_namespace(to.spec.namespace()).await?;
            for (cluster, comps) in to.by_cluster() {
                let secrets = self.secrets(&to.spec, &comps).await?;
                match delivery {
                    Delivery::ManifestWork => {
                        let work = render::manifest_work(&to.spec, &cluster, &comps, &secrets, task);
                        self.cfg.clusters.apply(HUB, &work, MANAGER).await.map_err(|e| kube_err("HUB_API", e))?;
                    }
                    Delivery::Direct => {
                        for obj in render::objects(&to.spec, &comps, &secrets) {
                            self.cfg.clusters.apply(&cluster, &obj, MANAGER).await.map_err(|e| kube_err("CLUSTER_API", e))?;
                        }
                    }
                }
            }
        }
        if let Some(from) = from {
            let keep = to.map(AppState::clusters).unwrap_or_default();
            match delivery {
                Delivery::ManifestWork => {
                    for cluster in from.clusters().difference(&keep) {
                        let work = json!({"apiVersion": "work.open-cluster-management.io/v1", "kind": "ManifestWork",
                            "metadata": {"name": render::work_name(&from.spec), "namespace": cluster}});
                        self.cfg.clusters.delete(HUB, &work).await.map_err(|e| kube_err("HUB_API", e))?;
                    }
                }
                Delivery::Direct => {
                    let wanted: BTreeSet<(String, String)> = to
                        .map(|t| t.by_cluster().into_iter().flat_map(|(cl, comps)| identities(&cl, &t.spec, &comps)).collect())
                        .unwrap_or_default();
                    for (cluster, comps) in from.by_cluster() {
                        let mut objs = render::objects(&from.spec, &comps, &BTreeMap::new());
                        objs.reverse();
                        for obj in objs {
                            if !wanted.contains(&(cluster.clone(), identity(&obj))) {
                                self.cfg.clusters.delete(&cluster, &obj).await.map_err(|e| kube_err("CLUSTER_API", e))?;
                            }
                        }
                    }
                }
            }
        }
        self.write_state(app, to, task).await
    }

    /// Waits until every ManifestWork of `state` is applied at its current generation: a
    /// revert is done when the clusters run the previous spec again, not when the hub has it.
    async fn wait_restored(&self, state: Option<&AppState>) -> Result<(), StepError> {
        let Some(state) = state.filter(|s| s.spec.delivery == Delivery::ManifestWork) else { return Ok(()) };
        let name = render::work_name(&state.spec);
        for cluster in state.clusters() {
            self.cfg
                .watches
                .wait_object::<ManifestWork, ()>(HUB, &self.hub(), Some(&cluster), &name, self.cfg.removal_timeout, |w| match w {
                    Some(w) => unapplied(w).map_or(Check::Done(()), Check::Pending),
                    None => Check::Pending("the ManifestWork is not there".into()),
                })
                .await
                .map_err(|e| StepError::transient("NOT_RESTORED", e.to_string()))?;
        }
        Ok(())
    }

    /// Waits until the objects `from` has and `to` has not are gone.
    async fn wait_removed(&self, from: Option<&AppState>, to: Option<&AppState>) -> Result<(), StepError> {
        let Some(from) = from else { return Ok(()) };
        let keep = to.map(AppState::clusters).unwrap_or_default();
        let timeout = self.cfg.removal_timeout;
        match from.spec.delivery {
            Delivery::ManifestWork => {
                let name = render::work_name(&from.spec);
                for cluster in from.clusters().difference(&keep) {
                    self.cfg
                        .watches
                        .wait_deleted::<ManifestWork>(HUB, &self.hub(), Some(cluster), &name, timeout)
                        .await
                        .map_err(|e| StepError::transient("NOT_REMOVED", e.to_string()))?;
                }
            }
            Delivery::Direct => {
                let wanted: BTreeSet<(String, String)> =
                    to.map(|t| t.by_cluster().into_iter().flat_map(|(cl, comps)| identities(&cl, &t.spec, &comps)).collect()).unwrap_or_default();
                for (cluster, comps) in from.by_cluster() {
                    let client = self.cfg.clusters.client(&cluster).await.map_err(|e| kube_err("CLUSTER_API", e))?;
                    for c in comps {
                        let id = identity(&json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": c.name, "namespace": c.namespace(&from.spec)}}));
                        if wanted.contains(&(cluster.clone(), id)) {
                            continue;
                        }
                        self.cfg
                            .watches
                            .wait_deleted::<Deployment>(&cluster, &client, Some(c.namespace(&from.spec)), &c.name, timeout)
                            .await
                            .map_err(|e| StepError::transient("NOT_REMOVED", e.to_string()))?;
                    }
                }
            }
        }
        Ok(())
    }
}

fn identity(obj: &Value) -> String {
    let s = |p: &str| obj.pointer(p).and_then(Value::as_str).unwrap_or("").to_owned();
    format!("{} {} {}/{}", s("/apiVersion"), s("/kind"), s("/metadata/namespace"), s("/metadata/name"))
}

fn identities(cluster: &str, app: &DeployApp, comps: &[&Component]) -> Vec<(String, String)> {
    render::objects(app, comps, &BTreeMap::new()).iter().map(|o| (cluster.to_owned(), identity(o))).collect()
}

fn base64_encode(b: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(b)
}

fn checked(cx: &StepContext<'_, DeployApp>) -> Result<Checked, StepError> {
    cx.required("check")
}

/// The state this task makes: None for a delete.
fn desired(cx: &StepContext<'_, DeployApp>) -> Result<Option<AppState>, StepError> {
    if cx.spec.operation == DeployOperation::Delete {
        return Ok(None);
    }
    let placed: Placed = cx.required("place")?;
    Ok(Some(AppState { spec: cx.spec.clone(), targets: placed.targets }))
}

// ---------------------------------------------------------------------------------------
// check

struct CheckStep(Arc<Inner>);

impl CheckStep {
    async fn check_secrets(&self, app: &DeployApp) -> Result<(), StepError> {
        let api: Api<Secret> = Api::namespaced(self.0.hub(), app.namespace());
        for c in &app.components {
            for name in c.secrets() {
                let Some(s) = api.get_opt(&name).await.map_err(hub_err)? else {
                    return Err(StepError::rejected(
                        "SECRET_MISSING",
                        format!("component {:?} references Secret {}/{name}, which does not exist on the hub", c.name, app.namespace()),
                    ));
                };
                let keys: BTreeSet<String> = s.data.unwrap_or_default().into_keys().chain(s.string_data.unwrap_or_default().into_keys()).collect();
                for e in c.env.iter().filter_map(|e| e.secret.as_ref()).filter(|r| r.name == name) {
                    if !keys.contains(&e.key) {
                        return Err(StepError::rejected(
                            "SECRET_KEY_MISSING",
                            format!("component {:?} references key {:?} of Secret {}/{name}, which has keys {keys:?}", c.name, e.key, app.namespace()),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    async fn check_cluster(&self, app: &DeployApp, c: &Component, cluster: &str) -> Result<(), StepError> {
        match app.delivery {
            Delivery::ManifestWork => {
                let mc = Api::<ManagedCluster>::all(self.0.hub()).get_opt(cluster).await.map_err(hub_err)?;
                if mc.is_none() {
                    return Err(StepError::rejected(
                        "UNKNOWN_CLUSTER",
                        format!("component {:?}: cluster {cluster:?} is not registered with OCM (no ManagedCluster {cluster:?} on the hub)", c.name),
                    ));
                }
            }
            Delivery::Direct => match self.0.cfg.clusters.kubeconfig_secret(cluster).await {
                Ok(_) => {}
                Err(e @ (ClusterError::Unknown { .. } | ClusterError::Ambiguous { .. })) => {
                    return Err(StepError::rejected("UNKNOWN_CLUSTER", format!("component {:?}: {e}", c.name)));
                }
                Err(e) => return Err(kube_err("HUB_API", e)),
            },
        }
        Ok(())
    }

    /// The clusters a placement may choose, with the reason when there are none.
    async fn candidates(&self, app: &DeployApp, c: &Component) -> Result<Vec<String>, StepError> {
        let p = c.placement.as_ref().expect("a placement component");
        let gvk = GroupVersionKind::gvk("cluster.open-cluster-management.io", "v1beta2", "ManagedClusterSetBinding");
        let bindings = self.0.cfg.clusters.api(HUB, &gvk, Some(app.namespace())).await.map_err(|e| kube_err("HUB_API", e))?;
        let bound: BTreeSet<String> = bindings.list(&ListParams::default()).await.map_err(hub_err)?.items.into_iter().filter_map(|b| b.metadata.name).collect();
        let sets: BTreeSet<String> = if p.cluster_sets.is_empty() { bound.clone() } else { p.cluster_sets.iter().cloned().collect() };
        if let Some(s) = sets.iter().find(|s| !bound.contains(*s)) {
            return Err(StepError::rejected(
                "CLUSTERSET_NOT_BOUND",
                format!("component {:?}: namespace {:?} is not bound to ManagedClusterSet {s:?} (no ManagedClusterSetBinding {s:?} in it)", c.name, app.namespace()),
            ));
        }
        if sets.is_empty() {
            return Err(StepError::rejected(
                "CLUSTERSET_NOT_BOUND",
                format!("component {:?}: namespace {:?} is bound to no ManagedClusterSet, so a placement has no clusters", c.name, app.namespace()),
            ));
        }
        let all = Api::<ManagedCluster>::all(self.0.hub()).list(&ListParams::default()).await.map_err(hub_err)?;
        let mut out = Vec::new();
        for mc in all.items {
            let labels = mc.metadata.labels.clone().unwrap_or_default();
            let in_set = labels.get(CLUSTERSET_LABEL).is_some_and(|s| sets.contains(s));
            let matches = p.labels.iter().all(|(k, v)| labels.get(k) == Some(v));
            if in_set && matches {
                out.extend(mc.metadata.name);
            }
        }
        out.sort();
        if out.is_empty() {
            return Err(StepError::rejected(
                "NO_CANDIDATES",
                format!("component {:?}: no cluster of ManagedClusterSet(s) {sets:?} has the labels {:?}", c.name, p.labels),
            ));
        }
        Ok(out)
    }

    /// Rejects a placement no cluster has room for, saying what each cluster has free.
    async fn check_room(&self, c: &Component, candidates: &[String]) -> Result<(), StepError> {
        let (cpu, mem) = match (&c.cpu, &c.memory) {
            (None, None) => return Ok(()),
            (cpu, mem) => (
                cpu.as_deref().map(ferry_kube::quantity::millicores).transpose().map_err(|e| StepError::rejected("BAD_SPEC", e.to_string()))?.unwrap_or(0),
                mem.as_deref().map(ferry_kube::quantity::units).transpose().map_err(|e| StepError::rejected("BAD_SPEC", e.to_string()))?.unwrap_or(0),
            ),
        };
        let want = c.placement.as_ref().and_then(|p| p.clusters).unwrap_or(1) as usize;
        let mut fits = 0;
        let mut seen = Vec::new();
        for cl in candidates {
            match ferry_kube::capacity::measure(&self.0.cfg.clusters, cl).await {
                Ok(load) => {
                    let n = load.replicas_that_fit(cpu.max(1), mem.max(1));
                    if n >= i64::from(c.replicas()) {
                        fits += 1;
                    }
                    let (free_cpu, free_mem) = load.nodes.iter().filter(|n| n.excluded.is_none()).map(|n| (n.cpu_free(), n.mem_free())).max().unwrap_or((0, 0));
                    seen.push(format!("{cl}: room for {n} replica(s), largest node has {}m CPU and {}Mi free", free_cpu, free_mem >> 20));
                }
                // A cluster that cannot be measured may still be chosen by OCM.
                Err(_) => fits += 1,
            }
        }
        if fits < want {
            return Err(StepError::rejected(
                "NO_ROOM",
                format!(
                    "component {:?}: {fits} of the {want} cluster(s) needed can run {} replica(s) of {} CPU and {} memory each ({})",
                    c.name,
                    c.replicas(),
                    c.cpu.as_deref().unwrap_or("0"),
                    c.memory.as_deref().unwrap_or("0"),
                    seen.join("; ")
                ),
            ));
        }
        Ok(())
    }
}

impl Step<DeployApp> for CheckStep {
    fn name(&self) -> &str {
        "check"
    }

    fn policy(&self) -> StepPolicy {
        StepPolicy { timeout: Duration::from_secs(120), ..StepPolicy::default() }
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, DeployApp>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let app = cx.spec;
            let previous = self.0.read_state(app).await?;
            match (app.operation, &previous) {
                (DeployOperation::Deploy, Some(_)) => {
                    return Err(StepError::rejected("ALREADY_DEPLOYED", format!("app {} is already deployed; send operation update to change it", app.subject())));
                }
                (DeployOperation::Update | DeployOperation::Delete, None) => {
                    return Err(StepError::rejected("NOT_DEPLOYED", format!("app {} is not deployed (no app record {} on the hub)", app.subject(), record_name(&app.name))));
                }
                (DeployOperation::Update, Some(p)) if p.spec.delivery != app.delivery => {
                    return Err(StepError::rejected("DELIVERY_CHANGED", format!("app {} is delivered by {:?}; an update cannot switch to {:?} (delete and deploy)", app.subject(), p.spec.delivery, app.delivery)));
                }
                _ => {}
            }
            if app.operation != DeployOperation::Delete {
                self.check_secrets(app).await?;
                for c in &app.components {
                    if let Some(cl) = &c.cluster {
                        self.check_cluster(app, c, cl).await?;
                    } else {
                        let cands = self.candidates(app, c).await?;
                        self.check_room(c, &cands).await?;
                    }
                }
            }
            cx.progress(100, match &previous {
                Some(p) => format!("app {} runs on {} cluster(s) now", app.subject(), p.clusters().len()),
                None => format!("app {} is new", app.subject()),
            });
            Ok(serde_json::to_value(Checked { previous }).expect("serializable"))
        }
        .boxed()
    }

    fn undo<'a>(&'a self, _cx: &'a StepContext<'a, DeployApp>, _output: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async { Ok(()) }.boxed()
    }
}

// ---------------------------------------------------------------------------------------
// place

struct PlaceStep(Arc<Inner>);

impl PlaceStep {
    /// Applies the placements of `state` and deletes the app's other Placements.
    async fn converge_placements(&self, app: &DeployApp, state: Option<&DeployApp>, task: &str) -> Result<(), StepError> {
        let gvk = GroupVersionKind::gvk("cluster.open-cluster-management.io", "v1beta1", "Placement");
        let api = self.0.cfg.clusters.api(HUB, &gvk, Some(app.namespace())).await.map_err(|e| kube_err("HUB_API", e))?;
        let mut keep = BTreeSet::new();
        if let Some(s) = state {
            self.0.ensure_hub_namespace(s.namespace()).await?;
            for c in &s.components {
                if let Some(p) = render::placement(s, c, task) {
                    keep.insert(render::placement_name(s, &c.name));
                    self.0.cfg.clusters.apply(HUB, &p, MANAGER).await.map_err(|e| kube_err("HUB_API", e))?;
                }
            }
        }
        let lp = ListParams::default().labels(&format!("{APP_LABEL}={}", app.name));
        let existing = match api.list(&lp).await {
            Ok(l) => l.items,
            Err(kube::Error::Api(s)) if s.code == 404 => Vec::new(),
            Err(e) => return Err(hub_err(e)),
        };
        for p in existing {
            let name = p.metadata.name.unwrap_or_default();
            if !keep.contains(&name) {
                match api.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(hub_err(e)),
                }
            }
        }
        Ok(())
    }

    /// Waits for the decisions of one placement.
    async fn decisions(&self, app: &DeployApp, c: &Component) -> Result<Vec<String>, StepError> {
        let name = render::placement_name(app, &c.name);
        let want = c.placement.as_ref().and_then(|p| p.clusters).unwrap_or(1) as usize;
        let hub = self.0.hub();
        let r = self
            .0
            .cfg
            .watches
            .wait_store::<PlacementDecision, Vec<String>>(HUB, &hub, Some(app.namespace()), &format!("decisions of Placement {}/{name}", app.namespace()), self.0.cfg.placement_timeout, |store| {
                let mut clusters: Vec<String> = store
                    .state()
                    .iter()
                    .filter(|d| d.metadata.labels.as_ref().and_then(|l| l.get(PLACEMENT_LABEL)) == Some(&name))
                    .filter_map(|d| d.status_at("/decisions").and_then(Value::as_array).cloned())
                    .flatten()
                    .filter_map(|d| d.get("clusterName").and_then(Value::as_str).map(str::to_owned))
                    .collect();
                clusters.sort();
                clusters.dedup();
                if clusters.len() >= want { Check::Done(clusters) } else { Check::Pending(format!("{} of {want} cluster(s) decided: {clusters:?}", clusters.len())) }
            })
            .await;
        match r {
            Ok(c) => Ok(c),
            Err(e) => {
                // Say why in OCM's words when the Placement has them.
                let p = self.0.cfg.clusters.get(HUB, &json!({"apiVersion": "cluster.open-cluster-management.io/v1beta1", "kind": "Placement",
                    "metadata": {"name": name, "namespace": app.namespace()}})).await.ok().flatten();
                let why = p.and_then(|p| ferry_kube::kinds::condition_message(p.data.get("status")?, "PlacementSatisfied"));
                Err(StepError::permanent("PLACEMENT_UNSATISFIED", format!("component {:?}: {e}{}", c.name, why.map(|w| format!(" ({w})")).unwrap_or_default())))
            }
        }
    }
}

impl Step<DeployApp> for PlaceStep {
    fn name(&self) -> &str {
        "place"
    }

    fn policy(&self) -> StepPolicy {
        StepPolicy { timeout: self.0.cfg.placement_timeout + Duration::from_secs(60), ..StepPolicy::default() }
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, DeployApp>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let app = cx.spec;
            if app.operation == DeployOperation::Delete {
                return Ok(serde_json::to_value(Placed::default()).expect("serializable"));
            }
            self.converge_placements(app, Some(app), &cx.task_id.to_string()).await?;
            let mut targets = Targets::new();
            for c in &app.components {
                let clusters = match &c.cluster {
                    Some(cl) => vec![cl.clone()],
                    None => {
                        let d = self.decisions(app, c).await?;
                        cx.progress(50, format!("component {} placed on {}", c.name, d.join(", ")));
                        d
                    }
                };
                targets.insert(c.name.clone(), clusters);
            }
            let clusters: BTreeSet<&String> = targets.values().flatten().collect();
            cx.progress(100, format!("{} component(s) on {} cluster(s)", targets.len(), clusters.len()));
            Ok(serde_json::to_value(Placed { targets }).expect("serializable"))
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, DeployApp>, _output: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            let c = checked(cx)?;
            self.converge_placements(cx.spec, c.previous.as_ref().map(|p| &p.spec), &cx.task_id.to_string()).await
        }
        .boxed()
    }
}

// ---------------------------------------------------------------------------------------
// apply

struct ApplyStep(Arc<Inner>);

impl Step<DeployApp> for ApplyStep {
    fn name(&self) -> &str {
        "apply"
    }

    fn policy(&self) -> StepPolicy {
        StepPolicy { timeout: Duration::from_secs(120), ..StepPolicy::default() }
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, DeployApp>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let previous = checked(cx)?.previous;
            let to = desired(cx)?;
            if cx.spec.operation == DeployOperation::Delete {
                // The placements go with the app; their undo is this step's.
                PlaceStep(self.0.clone()).converge_placements(cx.spec, None, &cx.task_id.to_string()).await?;
            }
            self.0.converge(previous.as_ref(), to.as_ref(), cx.spec, &cx.task_id.to_string()).await?;
            let applied: Vec<String> = to.as_ref().map(|t| t.clusters().into_iter().collect()).unwrap_or_default();
            let removed: Vec<String> = previous.as_ref().map(|p| p.clusters().into_iter().filter(|c| !applied.contains(c)).collect()).unwrap_or_default();
            let how = if cx.spec.delivery == Delivery::ManifestWork { "ManifestWork" } else { "direct apply" };
            cx.progress(100, format!("{how}: applied to {applied:?}, removing from {removed:?}"));
            Ok(json!({"applied": applied, "removed": removed}))
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, DeployApp>, _output: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            let previous = checked(cx)?.previous;
            let to = desired(cx)?;
            if cx.spec.operation == DeployOperation::Delete {
                PlaceStep(self.0.clone()).converge_placements(cx.spec, previous.as_ref().map(|p| &p.spec), &cx.task_id.to_string()).await?;
            }
            self.0.converge(to.as_ref(), previous.as_ref(), cx.spec, &cx.task_id.to_string()).await?;
            self.0.wait_removed(to.as_ref(), previous.as_ref()).await?;
            self.0.wait_restored(previous.as_ref()).await
        }
        .boxed()
    }
}

// ---------------------------------------------------------------------------------------
// wait

struct WaitStep(Arc<Inner>, Duration);

impl WaitStep {
    async fn wait_work(&self, cx: &StepContext<'_, DeployApp>, state: &AppState, cluster: &str, comps: &[&Component], seen: &Mutex<BTreeMap<(String, String), render::Readiness>>) -> Result<Vec<ComponentStatus>, StepError> {
        let hub = self.0.hub();
        let name = render::work_name(&state.spec);
        let total: i64 = state.by_cluster().values().flatten().map(|c| i64::from(c.replicas())).sum();
        let r = self
            .0
            .cfg
            .watches
            .wait_object::<ManifestWork, Vec<ComponentStatus>>(HUB, &hub, Some(cluster), &name, self.1, |w| {
                let Some(w) = w else { return Check::Pending("the ManifestWork is not there".into()) };
                if let Some(why) = unapplied(w) {
                    return Check::Pending(why);
                }
                let mut out = Vec::new();
                let mut pending = Vec::new();
                let mut changed = false;
                for c in comps {
                    let ns = c.namespace(&state.spec);
                    let r = render::readiness(&render::feedback(w, "Deployment", ns, &c.name), c.replicas());
                    {
                        let mut s = seen.lock().expect("seen lock");
                        let key = (cluster.to_owned(), c.name.clone());
                        if s.get(&key) != Some(&r) {
                            s.insert(key, r.clone());
                            changed = true;
                        }
                    }
                    if !r.done {
                        pending.push(format!("{} {}/{} ready", c.name, r.ready, r.wanted));
                    }
                    let svc = render::feedback(w, "Service", ns, &c.name);
                    let address = svc.get("loadBalancerIP").or(svc.get("clusterIP")).cloned();
                    out.push(ComponentStatus { component: c.name.clone(), cluster: cluster.to_owned(), ready: r.ready, address });
                }
                if changed {
                    let ready: i64 = seen.lock().expect("seen lock").values().map(|r| r.ready.min(r.wanted)).sum();
                    let line: Vec<String> = out.iter().map(|s| format!("{}@{} {} ready", s.component, s.cluster, s.ready)).collect();
                    cx.progress((ready * 100 / total.max(1)).clamp(0, 100) as u8, line.join(", "));
                }
                if pending.is_empty() { Check::Done(out) } else { Check::Pending(format!("on {cluster}: {}", pending.join(", "))) }
            })
            .await;
        r.map_err(|e| StepError::permanent("NOT_READY", e.to_string()))
    }

    async fn wait_direct(&self, state: &AppState, cluster: &str, comps: &[&Component]) -> Result<Vec<ComponentStatus>, StepError> {
        let client = self.0.cfg.clusters.client(cluster).await.map_err(|e| kube_err("CLUSTER_API", e))?;
        let mut out = Vec::new();
        for c in comps {
            let ns = c.namespace(&state.spec);
            let wanted = c.replicas();
            let ready = self
                .0
                .cfg
                .watches
                .wait_object::<Deployment, i64>(cluster, &client, Some(ns), &c.name, self.1, |d| {
                    let Some(d) = d else { return Check::Pending("the Deployment is not there".into()) };
                    let st = d.status.clone().unwrap_or_default();
                    let values: BTreeMap<String, String> = [
                        ("ReadyReplicas", st.ready_replicas),
                        ("Replicas", st.replicas),
                        ("AvailableReplicas", st.available_replicas),
                        ("updatedReplicas", st.updated_replicas),
                        ("observedGeneration", st.observed_generation.map(|g| g as i32)),
                        ("generation", d.metadata.generation.map(|g| g as i32)),
                    ]
                    .into_iter()
                    .filter_map(|(k, v)| Some((k.to_owned(), v?.to_string())))
                    .collect();
                    let r = render::readiness(&values, wanted);
                    if r.done { Check::Done(r.ready) } else { Check::Pending(format!("{} {}/{} ready on {cluster}", c.name, r.ready, r.wanted)) }
                })
                .await
                .map_err(|e| StepError::permanent("NOT_READY", e.to_string()))?;
            out.push(ComponentStatus { component: c.name.clone(), cluster: cluster.to_owned(), ready, address: None });
        }
        Ok(out)
    }
}

impl Step<DeployApp> for WaitStep {
    fn name(&self) -> &str {
        "wait"
    }

    fn policy(&self) -> StepPolicy {
        // The readiness deadline bounds the wait; a miss is final (the task reverts).
        StepPolicy { timeout: self.1 + self.0.cfg.removal_timeout + Duration::from_secs(60), ..StepPolicy::default() }
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, DeployApp>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let previous = checked(cx)?.previous;
            let to = desired(cx)?;
            let mut statuses = Vec::new();
            if let Some(state) = &to {
                let seen = Mutex::new(BTreeMap::new());
                let by = state.by_cluster();
                let waits = by.iter().map(|(cluster, comps)| {
                    let seen = &seen;
                    async move {
                        match state.spec.delivery {
                            Delivery::ManifestWork => self.wait_work(cx, state, cluster, comps, seen).await,
                            Delivery::Direct => self.wait_direct(state, cluster, comps).await,
                        }
                    }
                });
                for r in join_all(waits).await {
                    statuses.extend(r?);
                }
            }
            self.0.wait_removed(previous.as_ref(), to.as_ref()).await?;
            let msg = match &to {
                Some(s) => format!("{} component(s) ready on {} cluster(s)", s.spec.components.len(), s.clusters().len()),
                None => format!("app {} removed from every cluster", cx.spec.subject()),
            };
            cx.progress(100, msg);
            Ok(json!({"components": statuses}))
        }
        .boxed()
    }

    fn undo<'a>(&'a self, _cx: &'a StepContext<'a, DeployApp>, _output: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async { Ok(()) }.boxed()
    }
}

impl TaskHandler for DeployHandler {
    type Spec = DeployApp;

    fn kind(&self) -> TaskKind {
        TaskKind::Deploy
    }

    fn validate(&self, subject: &str, spec: &DeployApp) -> Result<(), Rejection> {
        crate::validate::validate(subject, spec)
    }

    fn plan(&self, spec: &DeployApp) -> Vec<Arc<dyn Step<DeployApp>>> {
        let ready = Duration::from_secs(spec.ready_timeout_seconds.unwrap_or(600).max(1) as u64);
        vec![
            Arc::new(CheckStep(self.inner.clone())),
            Arc::new(PlaceStep(self.inner.clone())),
            Arc::new(ApplyStep(self.inner.clone())),
            Arc::new(WaitStep(self.inner.clone(), ready)),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn work(generation: i64, status: &str, observed: i64) -> ManifestWork {
        serde_json::from_value(json!({"apiVersion": "work.open-cluster-management.io/v1", "kind": "ManifestWork",
            "metadata": {"name": "w", "namespace": "member-1", "generation": generation},
            "spec": {}, "status": {"conditions": [{"type": "Applied", "status": status, "observedGeneration": observed}]}}))
        .unwrap()
    }

    #[test]
    fn a_work_is_applied_only_at_its_current_generation() {
        assert_eq!(unapplied(&work(3, "True", 3)), None);
        assert_eq!(unapplied(&work(3, "True", 2)).as_deref(), Some("the work agent has not applied generation 3 yet"), "a condition of the previous spec");
        assert!(unapplied(&work(3, "False", 3)).is_some_and(|m| m.starts_with("Applied=False")));
    }
}

//! Emulated Liqo namespace offloading on the fleet's members, so the offload worker meets
//! NamespaceOffloadings that progress and pods that really run on the provider. This is the
//! controllers' part; Liqo's admission webhooks (the NamespaceOffloading's immutable
//! fields, pods mutated at creation) are the test bed's [`crate::webhooks_liqo_offloading`]:
//!
//! - **Namespace offloading** (liqotech/liqo `pkg/liqo-controller-manager/offloading/
//!   namespaceoffloading-controller/`): a NamespaceOffloading named `offloading` gets
//!   Liqo's finalizer (`lifecycle.go`); the consumer's virtual nodes matching its
//!   `clusterSelector` select the providers (`clusterselector.go`); each gets a twin
//!   namespace (named by the mapping strategy, `status.go`) labelled with the consumer and
//!   the origin namespace; twins no longer selected are deleted; while the strategy is
//!   `LocalAndRemote` or `Remote` the namespace is labelled `liqo.io/scheduling-enabled=true`,
//!   otherwise not (`labels.go`; set after the selection, before the status, as
//!   `Reconcile` does); the status reports the phase and, per provider,
//!   `OffloadingRequired` and `Ready` (`SomeFailed`/`AllFailed` only for lasting
//!   failures: the [`OffloadingKnobs::fails`] knob, a foreign namespace of that name, a
//!   refusal; `InProgress` while an old twin of that name still terminates or after a
//!   transient error). On deletion (`deletionLogic`): the scheduling label goes first,
//!   then `Terminating`, twins deleted, the consumer's pods on virtual nodes deleted, the
//!   finalizer removed once no twin is left.
//! - **Scheduling**: not here. Liqo's pod webhook gives a pod *created* in a labelled
//!   namespace the virtual nodes' toleration and a node affinity from the cluster selector
//!   (`Remote` keeps it off local nodes); the real kube-scheduler then places it. A pod
//!   created before the label keeps neither and stays where the scheduler left it.
//! - **Virtual kubelet**: a pod bound to a virtual node (known by its labels
//!   `liqo.io/type=virtual-node` and `liqo.io/remote-cluster-id`, never by its name) is
//!   reflected into the twin namespace on the provider (its scheduler and emulated kubelet
//!   run it); the remote status is mirrored onto the local pod; deletions propagate both
//!   ways. While a selected provider's twin is not there (being made, or failing), the pod
//!   waits, bound and Pending; a pod on a provider no longer selected, or in a namespace
//!   no longer offloaded, is deleted (its controller re-creates it).
//!
//! Not emulated: NamespaceMaps (twins are made directly); reflected pods keep only their
//! containers' name, image and resources (no volumes, env, probes, owners: an offloaded
//! Job's pod never completes); no Services, ConfigMaps or Secrets are reflected;
//! `DefaultName` is `<namespace>-<consumer>` rather than Liqo's hashed id.
//!
//! Every member runs one loop every 250 ms over watch-fed caches of its
//! NamespaceOffloadings, virtual nodes, pods, namespaces labelled for scheduling and twin
//! namespaces; writes happen only on change; a failed write is logged at debug and
//! retried on the next tick.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Container, Namespace, Node, Pod};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions};
use kube::core::GroupVersionKind;
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::emulate::now;
pub use crate::emulated_liqo::{NOT_ALLOWED_TAINT, REMOTE_ID_LABEL, VIRTUAL_NODE_SELECTOR};
pub use crate::webhooks_liqo_offloading::SCHEDULING_LABEL;
use crate::{Fleet, FleetError};

/// The only NamespaceOffloading name Liqo acts on.
pub const OFFLOADING_NAME: &str = "offloading";
/// Liqo's finalizer on a NamespaceOffloading.
pub const FINALIZER: &str = "namespaceoffloading-controller.liqo.io/finalizer";
/// Label of a twin namespace (and of a reflected pod): the consumer's namespace.
pub const ORIGIN_NAMESPACE_LABEL: &str = "offloading.liqo.io/origin-namespace";
/// Label of a reflected pod: the consumer's cluster id.
pub const ORIGIN_CLUSTER_LABEL: &str = "offloading.liqo.io/origin-cluster-id";
/// Annotation of a reflected pod: the uid of the local pod it reflects.
pub const ORIGIN_POD_UID_ANNOTATION: &str = "offloading.liqo.io/origin-pod-uid";
const TICK: Duration = Duration::from_millis(250);

/// The NamespaceOffloading kind (`offloading.liqo.io/v1beta1`).
pub fn namespace_offloading_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("offloading.liqo.io", "v1beta1", "NamespaceOffloading"), "namespaceoffloadings")
}

/// The twin namespace's name under `DefaultName` (Liqo appends a hash of the cluster id;
/// the emulation appends the consumer's name).
pub fn default_remote_namespace(namespace: &str, consumer: &str) -> String {
    format!("{namespace}-{consumer}")
}

/// `status.offloadingPhase`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffloadingPhase {
    /// Every selected provider has its twin namespace.
    Ready,
    /// No virtual node matches the cluster selector.
    NoClusterSelected,
    /// Some twins are still to be made (an old one still terminating, a transient error);
    /// none failed.
    InProgress,
    /// Some selected providers have no twin namespace.
    SomeFailed,
    /// No selected provider has its twin namespace.
    AllFailed,
    /// Being deleted: twins are going.
    Terminating,
}

impl OffloadingPhase {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ready => "Ready",
            Self::NoClusterSelected => "NoClusterSelected",
            Self::InProgress => "InProgress",
            Self::SomeFailed => "SomeFailed",
            Self::AllFailed => "AllFailed",
            Self::Terminating => "Terminating",
        }
    }

    /// From the API's spelling.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Ready, Self::NoClusterSelected, Self::InProgress, Self::SomeFailed, Self::AllFailed, Self::Terminating].into_iter().find(|p| p.as_str() == s)
    }

    /// From how many providers are selected, ready and failed (the rest are in progress).
    fn of(selected: usize, ready: usize, failed: usize) -> Self {
        match (selected, ready, failed) {
            (0, _, _) => Self::NoClusterSelected,
            (s, r, _) if s == r => Self::Ready,
            (s, _, f) if s == f => Self::AllFailed,
            (_, _, 0) => Self::InProgress,
            _ => Self::SomeFailed,
        }
    }
}

/// `spec.podOffloadingStrategy` (absent: `LocalAndRemote`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodOffloadingStrategy {
    /// Pods may run locally or on the providers.
    LocalAndRemote,
    /// Pods run on the providers only (the pod webhook's affinity requires a virtual node).
    Remote,
    /// No pod is offloaded.
    Local,
}

impl PodOffloadingStrategy {
    /// From the spec's field; an unknown value offloads nothing.
    fn parse(s: Option<&str>) -> Self {
        match s {
            None | Some("LocalAndRemote") => Self::LocalAndRemote,
            Some("Remote") => Self::Remote,
            _ => Self::Local,
        }
    }
}

/// Knobs of one (provider) cluster.
#[derive(Debug, Clone, Default)]
pub struct OffloadingKnobs {
    /// Creating a twin namespace on this cluster always fails (an existing one stays).
    pub fails: bool,
}

/// Emulated namespace offloading; stops on drop.
pub struct EmulatedOffloading {
    knobs: Arc<Mutex<HashMap<String, OffloadingKnobs>>>,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for EmulatedOffloading {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmulatedOffloading").finish_non_exhaustive()
    }
}

impl Drop for EmulatedOffloading {
    fn drop(&mut self) {
        self.tasks.iter().for_each(JoinHandle::abort);
    }
}

/// One member with the caches its loop (as consumer) and the others' (as provider) read.
struct Member {
    name: String,
    client: kube::Client,
    offloadings: Store<DynamicObject>,
    virtual_nodes: Store<Node>,
    pods: Store<Pod>,
    /// Namespaces labelled [`ORIGIN_NAMESPACE_LABEL`]: twins on this cluster as a provider.
    twins: Store<Namespace>,
    /// Namespaces labelled [`SCHEDULING_LABEL`] (with any value) on this cluster as a consumer.
    scheduling: Store<Namespace>,
}

impl Member {
    /// Its own caches have listed everything once (a consumer's view).
    fn synced_as_consumer(&self) -> bool {
        synced(&self.offloadings) && synced(&self.virtual_nodes) && synced(&self.scheduling) && self.synced_as_provider()
    }

    /// The caches others read (a provider's view).
    fn synced_as_provider(&self) -> bool {
        synced(&self.pods) && synced(&self.twins)
    }
}

fn synced<K>(store: &Store<K>) -> bool
where
    K: kube::runtime::reflector::Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    matches!(store.wait_until_ready().now_or_never(), Some(Ok(())))
}

impl EmulatedOffloading {
    /// Starts on `fleet`'s members (every cluster but the hub), each as a consumer;
    /// `knobs` apply from the start.
    pub async fn start(fleet: &Fleet, knobs: HashMap<String, OffloadingKnobs>) -> Result<Self, FleetError> {
        // Built first so that an early return aborts the tasks already started.
        let mut this = Self { knobs: Arc::new(Mutex::new(knobs)), tasks: Vec::new() };
        let tasks = &mut this.tasks;
        let mut members = Vec::new();
        for c in fleet.clusters.iter().skip(1) {
            let client = c.client().await?;
            let ar = namespace_offloading_resource();
            members.push(Member {
                name: c.name.clone(),
                offloadings: mirror(tasks, &c.name, Api::all_with(client.clone(), &ar), ar, watcher::Config::default()),
                virtual_nodes: mirror(tasks, &c.name, Api::all(client.clone()), (), watcher::Config::default().labels(VIRTUAL_NODE_SELECTOR)),
                pods: mirror(tasks, &c.name, Api::all(client.clone()), (), watcher::Config::default()),
                twins: mirror(tasks, &c.name, Api::all(client.clone()), (), watcher::Config::default().labels(ORIGIN_NAMESPACE_LABEL)),
                scheduling: mirror(tasks, &c.name, Api::all(client.clone()), (), watcher::Config::default().labels(SCHEDULING_LABEL)),
                client,
            });
        }
        let members = Arc::new(members);
        for me in 0..members.len() {
            let (members, knobs) = (members.clone(), this.knobs.clone());
            tasks.push(tokio::spawn(async move {
                let mut every = tokio::time::interval(TICK);
                every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut memory = Memory::default();
                loop {
                    every.tick().await;
                    // Knobs are read live, when each twin is decided.
                    tick(&members, me, &knobs, &mut memory).await;
                }
            }));
        }
        Ok(this)
    }

    /// Changes the knobs of `cluster`.
    pub fn set(&self, cluster: &str, f: impl FnOnce(&mut OffloadingKnobs)) {
        f(self.knobs.lock().expect("knobs lock").entry(cluster.to_owned()).or_default());
    }
}

/// A cache of `api`'s objects, fed by a watch task pushed onto `tasks`.
fn mirror<K>(tasks: &mut Vec<JoinHandle<()>>, cluster: &str, api: Api<K>, dyntype: K::DynamicType, config: watcher::Config) -> Store<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    let writer = Writer::new(dyntype);
    let store = writer.as_reader();
    let cluster = cluster.to_owned();
    tasks.push(tokio::spawn(async move {
        let mut events = reflector::reflector(writer, watcher(api, config).default_backoff()).boxed();
        while let Some(ev) = events.next().await {
            if let Err(e) = ev {
                tracing::debug!(%cluster, error = %e, "emulated offloading: watch failed; backing off");
            }
        }
    }));
    store
}

/// A write that failed; logged at debug, retried on the next tick.
#[derive(Debug, thiserror::Error)]
#[error("emulated offloading on {cluster}: {what}: {source}")]
struct Failed {
    cluster: String,
    what: String,
    #[source]
    source: kube::Error,
}

fn logged<T>(cluster: &str, what: impl FnOnce() -> String, r: Result<T, kube::Error>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        // Gone already: what a delete wanted, and nothing left to update.
        Err(kube::Error::Api(s)) if s.code == 404 => None,
        Err(source) => {
            tracing::debug!(error = %Failed { cluster: cluster.to_owned(), what: what(), source }, "retrying on the next tick");
            None
        }
    }
}

fn label<'a>(meta: &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, key: &str) -> Option<&'a str> {
    meta.labels.as_ref()?.get(key).map(String::as_str)
}

/// Does a NodeSelectorRequirement (`In`, `NotIn`, `Exists`, `DoesNotExist`) hold for `value`?
fn requirement_holds(req: &Value, value: Option<&str>) -> bool {
    let values: Vec<&str> = req["values"].as_array().map(|v| v.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    match req["operator"].as_str() {
        Some("In") => value.is_some_and(|v| values.contains(&v)),
        Some("NotIn") => value.is_none_or(|v| !values.contains(&v)),
        Some("Exists") => value.is_some(),
        Some("DoesNotExist") => value.is_none(),
        _ => false,
    }
}

/// Does `clusterSelector` select a virtual node with `labels` and `name`? Terms are ORed, a
/// term's requirements ANDed; no selector or no terms selects every virtual node; an empty
/// term selects none (as Kubernetes' NodeSelector).
pub fn cluster_selector_matches(selector: Option<&Value>, name: &str, labels: &BTreeMap<String, String>) -> bool {
    let Some(terms) = selector.and_then(|s| s["nodeSelectorTerms"].as_array()).filter(|t| !t.is_empty()) else { return true };
    terms.iter().any(|term| {
        let exprs = term["matchExpressions"].as_array().map(Vec::as_slice).unwrap_or_default();
        let fields = term["matchFields"].as_array().map(Vec::as_slice).unwrap_or_default();
        (!exprs.is_empty() || !fields.is_empty())
            && exprs.iter().all(|r| requirement_holds(r, r["key"].as_str().and_then(|k| labels.get(k)).map(String::as_str)))
            && fields.iter().all(|r| r["key"] == "metadata.name" && requirement_holds(r, Some(name)))
    })
}

/// The twin namespace's name by `spec.namespaceMappingStrategy`, or why there is none.
pub fn remote_namespace(spec: &Value, namespace: &str, consumer: &str) -> Result<String, String> {
    match spec["namespaceMappingStrategy"].as_str() {
        None | Some("DefaultName") => Ok(default_remote_namespace(namespace, consumer)),
        Some("EnforceSameName") => Ok(namespace.to_owned()),
        Some("SelectedName") => match spec["remoteNamespaceName"].as_str() {
            Some(n) if !n.is_empty() => Ok(n.to_owned()),
            _ => Err("SelectedName needs spec.remoteNamespaceName".to_owned()),
        },
        Some(other) => Err(format!("unknown namespaceMappingStrategy {other}")),
    }
}

/// What one tick learnt about a namespace's offloading, for the pod loops.
struct Offload {
    terminating: bool,
    /// The providers its cluster selector selects.
    selected: BTreeSet<String>,
    /// Provider → twin namespace, for the providers whose twin exists.
    ready: BTreeMap<String, String>,
}

/// What a consumer's loop remembers between ticks.
#[derive(Default)]
struct Memory {
    /// Local pods whose reflection was seen: its disappearance then deletes them.
    reflected: HashSet<String>,
    /// Every virtual node seen (by its labels) → its provider, so pods still bound to one
    /// that is gone (an unpeer) are known as offloaded.
    virtual_nodes: HashMap<String, String>,
}

async fn tick(members: &[Member], me: usize, knobs: &Mutex<HashMap<String, OffloadingKnobs>>, memory: &mut Memory) {
    let consumer = &members[me];
    if !consumer.synced_as_consumer() || !members.iter().all(Member::synced_as_provider) {
        tracing::debug!(cluster = %consumer.name, "emulated offloading: caches not synced yet");
        return;
    }
    // This consumer's twins on every other member.
    let twins: Vec<(&Member, Arc<Namespace>)> = members
        .iter()
        .filter(|p| p.name != consumer.name)
        .flat_map(|p| p.twins.state().into_iter().filter(|t| label(&t.metadata, REMOTE_ID_LABEL) == Some(&consumer.name)).map(move |t| (p, t)))
        .collect();
    let virtual_nodes = consumer.virtual_nodes.state();
    let mut offloads = BTreeMap::new();
    for nso in consumer.offloadings.state() {
        if nso.metadata.name.as_deref() != Some(OFFLOADING_NAME) {
            continue;
        }
        let ns = nso.metadata.namespace.clone().unwrap_or_default();
        let o = offloading(consumer, members, &nso, &ns, &virtual_nodes, &twins, knobs).await;
        offloads.insert(ns, o);
    }
    // Twins nobody wants any more.
    for (p, t) in &twins {
        let name = t.metadata.name.clone().unwrap_or_default();
        let origin = label(&t.metadata, ORIGIN_NAMESPACE_LABEL).unwrap_or_default();
        let wanted = offloads.get(origin).is_some_and(|o| !o.terminating && o.ready.get(&p.name) == Some(&name));
        if !wanted && t.metadata.deletion_timestamp.is_none() {
            let api: Api<Namespace> = Api::all(p.client.clone());
            logged(&p.name, || format!("deleting twin namespace {name}"), api.delete(&name, &DeleteParams::default()).await);
        }
    }
    for n in &virtual_nodes {
        if let (Some(name), Some(provider)) = (n.metadata.name.clone(), label(&n.metadata, REMOTE_ID_LABEL)) {
            memory.virtual_nodes.insert(name, provider.to_owned());
        }
    }
    pods(consumer, members, &offloads, memory).await;
}

/// Liqo's scheduling label on `ns`, present or not as `wanted` (`labels.go`:
/// `enforceSchedulingLabelPresence` / `enforceSchedulingLabelAbsence`; a value other than
/// `true` counts as absent, and is left alone when absence is wanted).
async fn scheduling_label(consumer: &Member, ns: &str, wanted: bool) {
    let has = consumer.scheduling.get(&ObjectRef::new(ns)).is_some_and(|n| label(&n.metadata, SCHEDULING_LABEL) == Some("true"));
    if has == wanted {
        return;
    }
    let value = if wanted { json!("true") } else { Value::Null };
    let patch = json!({"metadata": {"labels": {SCHEDULING_LABEL: value}}});
    let api: Api<Namespace> = Api::all(consumer.client.clone());
    let what = if wanted { "adding" } else { "removing" };
    logged(&consumer.name, || format!("{what} the scheduling label of namespace {ns}"), api.patch(ns, &PatchParams::default(), &Patch::Merge(&patch)).await);
}

/// One NamespaceOffloading: finalizer, twins, status; or, when deleted, its cleanup.
async fn offloading(
    consumer: &Member,
    members: &[Member],
    nso: &DynamicObject,
    ns: &str,
    virtual_nodes: &[Arc<Node>],
    twins: &[(&Member, Arc<Namespace>)],
    knobs: &Mutex<HashMap<String, OffloadingKnobs>>,
) -> Offload {
    let api: Api<DynamicObject> = Api::namespaced_with(consumer.client.clone(), ns, &namespace_offloading_resource());
    let what = |w: &str| format!("{w} NamespaceOffloading {ns}/{OFFLOADING_NAME}");
    let finalizers = nso.metadata.finalizers.clone().unwrap_or_default();
    let rv = nso.metadata.resource_version.clone();
    let spec = nso.data.get("spec").cloned().unwrap_or(Value::Null);
    let pods = PodOffloadingStrategy::parse(spec["podOffloadingStrategy"].as_str());
    let old = nso.data.get("status").cloned().unwrap_or(Value::Null);

    if nso.metadata.deletion_timestamp.is_some() {
        // deletionLogic: the label first, so no pod created from now on is offloaded.
        scheduling_label(consumer, ns, false).await;
        let phase = OffloadingPhase::Terminating;
        if old["offloadingPhase"] != phase.as_str() {
            let patch = json!({"status": {"offloadingPhase": phase.as_str()}});
            logged(&consumer.name, || what("setting the status of"), api.patch_status(OFFLOADING_NAME, &PatchParams::default(), &Patch::Merge(&patch)).await);
        }
        // The twins are deleted by the caller; the pods on virtual nodes by the pod loop.
        let left = twins.iter().any(|(_, t)| label(&t.metadata, ORIGIN_NAMESPACE_LABEL) == Some(ns));
        if !left && finalizers.iter().any(|f| f == FINALIZER) {
            let rest: Vec<&String> = finalizers.iter().filter(|f| *f != FINALIZER).collect();
            let patch = json!({"metadata": {"finalizers": rest, "resourceVersion": rv}});
            logged(&consumer.name, || what("removing the finalizer of"), api.patch(OFFLOADING_NAME, &PatchParams::default(), &Patch::Merge(&patch)).await);
        }
        return Offload { terminating: true, selected: BTreeSet::new(), ready: BTreeMap::new() };
    }

    if !finalizers.iter().any(|f| f == FINALIZER) {
        let mut all = finalizers.clone();
        all.push(FINALIZER.to_owned());
        let patch = json!({"metadata": {"finalizers": all, "resourceVersion": rv}});
        logged(&consumer.name, || what("adding the finalizer to"), api.patch(OFFLOADING_NAME, &PatchParams::default(), &Patch::Merge(&patch)).await);
    }
    let selected: BTreeSet<String> = virtual_nodes
        .iter()
        .filter(|n| {
            let labels = n.metadata.labels.clone().unwrap_or_default();
            cluster_selector_matches(spec.get("clusterSelector"), n.metadata.name.as_deref().unwrap_or_default(), &labels)
        })
        .filter_map(|n| label(&n.metadata, REMOTE_ID_LABEL).map(str::to_owned))
        .collect();
    let remote = remote_namespace(&spec, ns, &consumer.name);
    let mut ready = BTreeMap::new();
    let mut failed = 0;
    let mut conditions = serde_json::Map::new();
    for p in &selected {
        let fails = knobs.lock().expect("knobs lock").get(p).is_some_and(|k| k.fails);
        let outcome = match &remote {
            Ok(rns) => twin(consumer, members, ns, rns, p, twins, fails).await,
            Err(why) => Err(NotReady::Failed(why.clone())),
        };
        let old_conds = old.pointer(&format!("/remoteNamespacesConditions/{p}"));
        let required = condition(old_conds, "OffloadingRequired", true, "ClusterSelected", "the cluster matches the cluster selector");
        let created = match &outcome {
            Ok(rns) => condition(old_conds, "Ready", true, "Created", &format!("namespace {rns} exists on {p}")),
            Err(NotReady::Failed(why)) => condition(old_conds, "Ready", false, "CreationFailed", why),
            Err(NotReady::Pending(why)) => condition(old_conds, "Ready", false, "Creating", why),
        };
        conditions.insert(p.clone(), json!([required, created]));
        match outcome {
            Ok(rns) => drop(ready.insert(p.clone(), rns)),
            Err(NotReady::Failed(_)) => failed += 1,
            Err(NotReady::Pending(_)) => {}
        }
    }
    // Reconcile: after the cluster selection, before the status.
    scheduling_label(consumer, ns, matches!(pods, PodOffloadingStrategy::LocalAndRemote | PodOffloadingStrategy::Remote)).await;
    let phase = OffloadingPhase::of(selected.len(), ready.len(), failed);
    // Providers no longer selected leave the map (null removes a key in a merge patch).
    if let Some(before) = old["remoteNamespacesConditions"].as_object() {
        for p in before.keys().filter(|p| !conditions.contains_key(*p)).cloned().collect::<Vec<_>>() {
            conditions.insert(p, Value::Null);
        }
    }
    let status = json!({
        "observedGeneration": nso.metadata.generation,
        "remoteNamespaceName": remote.as_ref().ok(),
        "offloadingPhase": phase.as_str(),
        "remoteNamespacesConditions": conditions,
    });
    let same = status.as_object().expect("an object").iter().all(|(k, v)| match (k.as_str(), v) {
        ("remoteNamespacesConditions", Value::Object(want)) => {
            let have = old[k].as_object().cloned().unwrap_or_default();
            want.iter().all(|(p, c)| have.get(p).unwrap_or(&Value::Null) == c) && have.keys().all(|p| want.contains_key(p))
        }
        _ => old.get(k).unwrap_or(&Value::Null) == v,
    });
    if !same {
        logged(
            &consumer.name,
            || what("setting the status of"),
            api.patch_status(OFFLOADING_NAME, &PatchParams::default(), &Patch::Merge(&json!({"status": status}))).await,
        );
    }
    Offload { terminating: false, selected, ready }
}

/// A condition, keeping its transition time when its status did not change.
fn condition(old: Option<&Value>, type_: &str, ok: bool, reason: &str, message: &str) -> Value {
    let status = if ok { "True" } else { "False" };
    let since = old
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_ && c["status"] == status))
        .and_then(|c| c["lastTransitionTime"].as_str().map(str::to_owned))
        .unwrap_or_else(now);
    json!({"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": since})
}

/// Why a provider's twin is not there.
enum NotReady {
    /// It will be (an old twin still terminating, a transient API error).
    Pending(String),
    /// It will not be until something changes (the knob, a foreign namespace, a refusal).
    Failed(String),
}

/// Makes sure `provider` has the twin `rns` of `consumer`'s `ns`: its name, or why not.
async fn twin(
    consumer: &Member,
    members: &[Member],
    ns: &str,
    rns: &str,
    provider: &str,
    twins: &[(&Member, Arc<Namespace>)],
    fails: bool,
) -> Result<String, NotReady> {
    let Some(p) = members.iter().find(|m| m.name == provider && m.name != consumer.name) else {
        return Err(NotReady::Failed(format!("{provider} is not a member cluster of the fleet")));
    };
    let ours = |n: &Namespace| label(&n.metadata, REMOTE_ID_LABEL) == Some(&consumer.name) && label(&n.metadata, ORIGIN_NAMESPACE_LABEL) == Some(ns);
    let judge = |n: &Namespace| match (ours(n), n.metadata.deletion_timestamp.is_some()) {
        (false, _) => Err(NotReady::Failed(format!("namespace {rns} exists on {provider} and is not the twin of {}/{ns}", consumer.name))),
        (true, true) => Err(NotReady::Pending(format!("the previous namespace {rns} on {provider} is still terminating"))),
        (true, false) => Ok(rns.to_owned()),
    };
    if let Some((_, t)) = twins.iter().find(|(m, t)| m.name == provider && t.metadata.name.as_deref() == Some(rns)) {
        return judge(t);
    }
    if fails {
        return Err(NotReady::Failed(format!("creating namespace {rns} on {provider} failed (emulated failure)")));
    }
    let api: Api<Namespace> = Api::all(p.client.clone());
    let obj: Namespace = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": rns, "labels": {REMOTE_ID_LABEL: consumer.name, ORIGIN_NAMESPACE_LABEL: ns}}}))
    .expect("a valid namespace");
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => Ok(rns.to_owned()),
        // Not ours (the cache holds only labelled namespaces), or ours and not cached yet.
        Err(kube::Error::Api(s)) if s.code == 409 => match api.get_opt(rns).await {
            Ok(Some(n)) => judge(&n),
            Ok(None) => Err(NotReady::Pending(format!("namespace {rns} on {provider} is being replaced"))),
            Err(e) => Err(NotReady::Pending(format!("reading namespace {rns} on {provider}: {e}"))),
        },
        // Refused (forbidden, invalid): it stays so; anything else may pass next time.
        Err(kube::Error::Api(s)) if (400..500).contains(&s.code) && s.code != 429 => {
            Err(NotReady::Failed(format!("creating namespace {rns} on {provider}: {}", s.message)))
        }
        Err(e) => Err(NotReady::Pending(format!("creating namespace {rns} on {provider}: {e}"))),
    }
}

/// The pods of the consumer: the virtual kubelet for those bound to virtual nodes, and
/// removal of reflections nobody reflects any more.
async fn pods(consumer: &Member, members: &[Member], offloads: &BTreeMap<String, Offload>, memory: &mut Memory) {
    let Memory { reflected, virtual_nodes: provider_of_node } = memory;
    let providers: HashMap<&str, &Member> = members.iter().filter(|m| m.name != consumer.name).map(|m| (m.name.as_str(), m)).collect();
    // Reflections of this consumer's pods, by (provider, origin namespace, name).
    let mut reflections: HashMap<(String, String, String), Vec<Arc<Pod>>> = HashMap::new();
    for p in providers.values() {
        for r in p.pods.state() {
            if label(&r.metadata, ORIGIN_CLUSTER_LABEL) == Some(&consumer.name) {
                let origin = label(&r.metadata, ORIGIN_NAMESPACE_LABEL).unwrap_or_default().to_owned();
                reflections.entry((p.name.clone(), origin, r.metadata.name.clone().unwrap_or_default())).or_default().push(r);
            }
        }
    }
    let mut keep: HashSet<String> = HashSet::new();
    let locals = consumer.pods.state();
    for pod in &locals {
        let (Some(ns), Some(name), Some(uid)) = (pod.metadata.namespace.clone(), pod.metadata.name.clone(), pod.metadata.uid.clone()) else { continue };
        let api: Api<Pod> = Api::namespaced(consumer.client.clone(), &ns);
        // Not scheduled yet: the scheduler's (and, at its creation, Liqo's webhook's).
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else { continue };
        // A virtual node, or one that was (its pods stay bound to it after an unpeer).
        let Some(provider) = provider_of_node.get(&node).cloned() else { continue };
        let Some(p) = providers.get(provider.as_str()) else { continue };
        let mine = reflections.get(&(provider.clone(), ns.clone(), name.clone())).map(Vec::as_slice).unwrap_or_default();
        let by_uid = |grace: Option<u32>| DeleteParams {
            grace_period_seconds: grace,
            preconditions: Some(Preconditions { uid: Some(uid.clone()), resource_version: None }),
            ..DeleteParams::default()
        };
        if pod.metadata.deletion_timestamp.is_some() {
            // As a kubelet: once the containers (the reflection) are gone, confirm the deletion.
            if mine.is_empty() {
                logged(&consumer.name, || format!("removing terminated pod {ns}/{name}"), api.delete(&name, &by_uid(Some(0))).await);
            }
            continue;
        }
        let offload = offloads.get(&ns);
        let Some(rns) = offload.filter(|o| !o.terminating).and_then(|o| o.ready.get(&provider)) else {
            // Selected, its twin not there (yet): the virtual kubelet waits for it.
            if offload.is_some_and(|o| !o.terminating && o.selected.contains(&provider)) {
                continue;
            }
            // No twin to run in: the pod goes, its controller recreates it. Pods that got
            // there on their own in a namespace never offloaded are left alone.
            if offload.is_some() || tolerates_virtual_nodes(pod) {
                logged(&consumer.name, || format!("deleting pod {ns}/{name} from {node}"), api.delete(&name, &by_uid(None)).await);
            }
            continue;
        };
        let current = mine.iter().find(|r| {
            r.metadata.namespace.as_deref() == Some(rns)
                && r.metadata.annotations.as_ref().and_then(|a| a.get(ORIGIN_POD_UID_ANNOTATION)) == Some(&uid)
                && r.metadata.deletion_timestamp.is_none()
        });
        match current {
            Some(r) => {
                keep.insert(r.metadata.uid.clone().unwrap_or_default());
                reflected.insert(uid.clone());
                mirror_status(consumer, &api, pod, r).await;
            }
            None if reflected.contains(&uid) => {
                // The reflection disappeared (deleted on the provider, or its namespace).
                logged(&consumer.name, || format!("deleting pod {ns}/{name}, whose reflection is gone"), api.delete(&name, &by_uid(None)).await);
            }
            // A stale reflection of the same name is still being removed.
            None if mine.iter().any(|r| r.metadata.namespace.as_deref() == Some(rns)) => {}
            None => reflect(consumer, p, pod, rns, &ns, &uid).await,
        }
    }
    let live: HashSet<&str> = locals.iter().filter_map(|p| p.metadata.uid.as_deref()).collect();
    reflected.retain(|uid| live.contains(uid.as_str()));
    // Reflections not kept: their pod is gone, terminating, elsewhere, or of another incarnation.
    for ((provider, _, name), rs) in &reflections {
        for r in rs.iter().filter(|r| r.metadata.deletion_timestamp.is_none() && !keep.contains(r.metadata.uid.as_deref().unwrap_or_default())) {
            let rns = r.metadata.namespace.clone().unwrap_or_default();
            let api: Api<Pod> = Api::namespaced(providers[provider.as_str()].client.clone(), &rns);
            let dp = DeleteParams { preconditions: Some(Preconditions { uid: r.metadata.uid.clone(), resource_version: None }), ..DeleteParams::default() };
            logged(provider, || format!("deleting reflected pod {rns}/{name}"), api.delete(name, &dp).await);
        }
    }
}

/// Whether `pod` tolerates the virtual nodes' taint: Liqo's pod webhook gave it that
/// toleration (or its author did).
fn tolerates_virtual_nodes(pod: &Pod) -> bool {
    pod.spec.iter().flat_map(|s| s.tolerations.iter().flatten()).any(|t| t.key.as_deref() == Some(NOT_ALLOWED_TAINT))
}

/// Creates the reflection of `pod` in `rns` on `provider`.
async fn reflect(consumer: &Member, provider: &Member, pod: &Pod, rns: &str, ns: &str, uid: &str) {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let mut labels = pod.metadata.labels.clone().unwrap_or_default();
    labels.insert(ORIGIN_CLUSTER_LABEL.into(), consumer.name.clone());
    labels.insert(ORIGIN_NAMESPACE_LABEL.into(), ns.to_owned());
    let containers: Vec<Container> = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .map(|c| Container { name: c.name.clone(), image: c.image.clone(), resources: c.resources.clone(), ..Container::default() })
        .collect();
    let obj: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": rns, "labels": labels, "annotations": {ORIGIN_POD_UID_ANNOTATION: uid}},
        "spec": {"containers": containers}}))
    .expect("a valid pod");
    let api: Api<Pod> = Api::namespaced(provider.client.clone(), rns);
    match api.create(&PostParams::default(), &obj).await {
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        r => drop(logged(&provider.name, || format!("reflecting pod {ns}/{name} into {rns}"), r)),
    }
}

/// Copies the reflection's status onto the local pod when it differs.
async fn mirror_status(consumer: &Member, api: &Api<Pod>, pod: &Pod, remote: &Pod) {
    let theirs = serde_json::to_value(&remote.status).unwrap_or(Value::Null);
    let ours = serde_json::to_value(&pod.status).unwrap_or(Value::Null);
    let mut patch = serde_json::Map::new();
    for key in ["phase", "conditions", "containerStatuses", "podIP", "podIPs", "hostIP", "startTime"] {
        if let Some(v) = theirs.get(key).filter(|v| ours.get(key) != Some(*v)) {
            patch.insert(key.to_owned(), v.clone());
        }
    }
    if patch.is_empty() {
        return;
    }
    let name = pod.metadata.name.clone().unwrap_or_default();
    logged(
        &consumer.name,
        || format!("mirroring the status of pod {name}"),
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&json!({"status": patch}))).await,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn cluster_selector_ors_terms_and_ands_expressions() {
        let m2 = labels(&[(REMOTE_ID_LABEL, "member-2"), ("zone", "a")]);
        let m3 = labels(&[(REMOTE_ID_LABEL, "member-3")]);
        assert!(cluster_selector_matches(None, "member-2", &m2), "no selector: all");
        assert!(cluster_selector_matches(Some(&json!({"nodeSelectorTerms": []})), "member-2", &m2), "no terms: all");
        assert!(!cluster_selector_matches(Some(&json!({"nodeSelectorTerms": [{}]})), "member-2", &m2), "an empty term: none");
        let only2 = json!({"nodeSelectorTerms": [{"matchExpressions": [{"key": REMOTE_ID_LABEL, "operator": "In", "values": ["member-2"]}]}]});
        assert!(cluster_selector_matches(Some(&only2), "member-2", &m2));
        assert!(!cluster_selector_matches(Some(&only2), "member-3", &m3));
        let and = json!({"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "Exists"}, {"key": REMOTE_ID_LABEL, "operator": "NotIn", "values": ["member-2"]}]}]});
        assert!(!cluster_selector_matches(Some(&and), "member-2", &m2));
        assert!(!cluster_selector_matches(Some(&and), "member-3", &m3));
        let or = json!({"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}, {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["member-2"]}]}]});
        assert!(cluster_selector_matches(Some(&or), "member-2", &m2));
        assert!(cluster_selector_matches(Some(&or), "member-3", &m3));
    }

    #[test]
    fn remote_namespace_follows_the_mapping_strategy() {
        assert_eq!(remote_namespace(&json!({}), "web", "member-1"), Ok("web-member-1".to_owned()));
        assert_eq!(remote_namespace(&json!({"namespaceMappingStrategy": "EnforceSameName"}), "web", "member-1"), Ok("web".to_owned()));
        let selected = json!({"namespaceMappingStrategy": "SelectedName", "remoteNamespaceName": "elsewhere"});
        assert_eq!(remote_namespace(&selected, "web", "member-1"), Ok("elsewhere".to_owned()));
        assert!(remote_namespace(&json!({"namespaceMappingStrategy": "SelectedName"}), "web", "member-1").is_err());
    }

    #[test]
    fn phase_from_selected_and_ready() {
        assert_eq!(OffloadingPhase::of(0, 0, 0), OffloadingPhase::NoClusterSelected);
        assert_eq!(OffloadingPhase::of(2, 2, 0), OffloadingPhase::Ready);
        assert_eq!(OffloadingPhase::of(2, 1, 1), OffloadingPhase::SomeFailed);
        assert_eq!(OffloadingPhase::of(2, 0, 1), OffloadingPhase::SomeFailed);
        assert_eq!(OffloadingPhase::of(2, 0, 2), OffloadingPhase::AllFailed);
        assert_eq!(OffloadingPhase::of(2, 1, 0), OffloadingPhase::InProgress);
        for p in
            [OffloadingPhase::Ready, OffloadingPhase::NoClusterSelected, OffloadingPhase::SomeFailed, OffloadingPhase::AllFailed, OffloadingPhase::Terminating]
        {
            assert_eq!(OffloadingPhase::parse(p.as_str()), Some(p));
        }
    }

    #[test]
    fn pod_strategies_parse_as_the_crd_spells_them() {
        assert_eq!(PodOffloadingStrategy::parse(None), PodOffloadingStrategy::LocalAndRemote);
        assert_eq!(PodOffloadingStrategy::parse(Some("Remote")), PodOffloadingStrategy::Remote);
        assert_eq!(PodOffloadingStrategy::parse(Some("Local")), PodOffloadingStrategy::Local);
        assert_eq!(PodOffloadingStrategy::parse(Some("Elsewhere")), PodOffloadingStrategy::Local);
    }
}

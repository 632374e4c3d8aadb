//! Emulated Liqo namespace offloading on the fleet's members, so the offload worker meets
//! NamespaceOffloadings that progress and pods that really run on the provider. This is the
//! controllers' part; Liqo's admission webhooks (the NamespaceOffloading's immutable
//! fields, pods mutated at creation) are the test bed's [`crate::webhooks_liqo_offloading`]:
//!
//! - **Namespace offloading** (liqotech/liqo `557c199`, `pkg/liqo-controller-manager/
//!   offloading/namespaceoffloading-controller/`): a NamespaceOffloading named `offloading`
//!   gets Liqo's finalizer (`lifecycle.go`); the consumer's VirtualNodes (their Node's
//!   labels, else the cluster id) matching its `clusterSelector` select the providers
//!   (`clusterselector.go`); each selected provider's NamespaceMap gets the namespace's
//!   desired mapping to the remote name of the mapping strategy (`status.go`,
//!   `remoteNamespaceName`), the others lose it (`mappings.go`); while a cluster with a
//!   VirtualNode has no NamespaceMap yet, no mapping changes. While the strategy is
//!   `LocalAndRemote` or `Remote` the namespace is labelled `liqo.io/scheduling-enabled=true`,
//!   otherwise not (`labels.go`). The status is the NamespaceMaps' (`status.go`,
//!   `enforceStatus`): per map (every peered provider, selected or not) `OffloadingRequired`
//!   (`ClusterSelected` / `ClusterNotSelected`) and, once asked for or mapped, `Ready` from
//!   the mapping's phase (`NamespaceCreated`, `CreationLoopBackOff`, `Terminating`,
//!   `Creating`), each kept while its status and reason hold; the phase from how many are
//!   required, ready and failed. On deletion (`deletionLogic`): the scheduling label goes
//!   first, then the desired mappings, and the finalizer only once no remote condition is
//!   left (every remote namespace gone).
//! - **NamespaceMaps** ([`namespace_maps`]): made per peered provider on the consumer,
//!   replicated by the emulated CRD replicator, enforced by the provider's NamespaceMap
//!   controller (the remote namespaces, the virtual kubelet's RoleBinding, the phases).
//! - **Scheduling**: not here. Liqo's pod webhook gives a pod *created* in a labelled
//!   namespace the virtual nodes' toleration and a node affinity from the cluster selector
//!   (`Remote` keeps it off local nodes); the real kube-scheduler then places it. A pod
//!   created before the label keeps neither and stays where the scheduler left it.
//! - **Virtual kubelet** ([`virtual_kubelet`]): pods bound to a virtual node run in the
//!   remote namespace on the provider.
//!
//! Not emulated: reflected pods are Pods, not ShadowPods (see [`virtual_kubelet`]); no
//! Services, ConfigMaps or Secrets are reflected; Events of an invalid cluster selector.
//!
//! Every member runs one loop every 250 ms over watch-fed caches of its
//! NamespaceOffloadings, VirtualNodes, virtual nodes, NamespaceMaps, pods, namespaces
//! labelled for scheduling, remote namespaces and their RoleBindings, as a provider (the
//! NamespaceMap controller) and then as a consumer; writes happen only on change; a failed
//! write is logged at debug and retried on the next tick.

pub mod namespace_maps;
pub mod virtual_kubelet;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::emulate::{finalizer_patch, merge_patch, now};
pub use crate::emulated_liqo::{NOT_ALLOWED_TAINT, REMOTE_ID_LABEL, VIRTUAL_NODE_SELECTOR};
use crate::emulated_liqo::resources::namespace_map_resource;
pub use crate::webhooks_liqo_offloading::SCHEDULING_LABEL;
use crate::{Fleet, FleetError};
pub use virtual_kubelet::{ORIGIN_POD_UID_ANNOTATION, REFLECTION_DESTINATION_LABEL, REFLECTION_ORIGIN_LABEL};

/// The only NamespaceOffloading name Liqo acts on.
pub const OFFLOADING_NAME: &str = "offloading";
/// Liqo's finalizer on a NamespaceOffloading.
pub const FINALIZER: &str = "namespaceoffloading-controller.liqo.io/finalizer";
const TICK: Duration = Duration::from_millis(250);

/// The NamespaceOffloading kind (`offloading.liqo.io/v1beta1`).
pub fn namespace_offloading_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("offloading.liqo.io", "v1beta1", "NamespaceOffloading"), "namespaceoffloadings")
}

/// The remote namespace's name under `DefaultName`: the namespace and the consumer's
/// cluster id (`status.go`, `remoteNamespaceName`, with `foreignclusterutils.UniqueName`).
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
    /// Creating a remote namespace on this cluster always fails (an existing one stays).
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

/// One member with the caches its loop (as consumer and as provider) and the others' (as
/// provider) read.
struct Member {
    name: String,
    client: kube::Client,
    offloadings: Store<DynamicObject>,
    /// VirtualNode objects (`offloading.liqo.io`): the clusters an offloading may select.
    virtual_node_objects: Store<DynamicObject>,
    /// Nodes labelled as virtual: their labels select, their pods are reflected.
    virtual_nodes: Store<Node>,
    /// Every NamespaceMap: its own (as consumer) and replicated ones (as provider).
    namespace_maps: Store<DynamicObject>,
    pods: Store<Pod>,
    /// Namespaces labelled [`REMOTE_ID_LABEL`]: remote namespaces (and tenant namespaces).
    remote_namespaces: Store<Namespace>,
    /// RoleBindings labelled [`REMOTE_ID_LABEL`]: the virtual kubelets' in remote namespaces.
    bindings: Store<RoleBinding>,
    /// Namespaces labelled [`SCHEDULING_LABEL`] (with any value) on this cluster as a consumer.
    scheduling: Store<Namespace>,
}

impl Member {
    /// Its own caches have listed everything once (a consumer's view).
    fn synced_as_consumer(&self) -> bool {
        synced(&self.offloadings) && synced(&self.virtual_node_objects) && synced(&self.virtual_nodes) && synced(&self.scheduling) && self.synced_as_provider()
    }

    /// The caches others read, and its NamespaceMap controller's (a provider's view).
    fn synced_as_provider(&self) -> bool {
        synced(&self.pods) && synced(&self.remote_namespaces) && synced(&self.namespace_maps) && synced(&self.bindings)
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
    /// Starts on `fleet`'s members (every cluster but the hub), each as a consumer and a
    /// provider; `knobs` apply from the start.
    pub async fn start(fleet: &Fleet, knobs: HashMap<String, OffloadingKnobs>) -> Result<Self, FleetError> {
        // Built first so that an early return aborts the tasks already started.
        let mut this = Self { knobs: Arc::new(Mutex::new(knobs)), tasks: Vec::new() };
        let tasks = &mut this.tasks;
        let mut members = Vec::new();
        for c in fleet.clusters.iter().skip(1) {
            let client = c.client().await?;
            let (nso, vn, nm) = (namespace_offloading_resource(), virtual_node_resource(), namespace_map_resource());
            let all = watcher::Config::default;
            members.push(Member {
                name: c.name.clone(),
                offloadings: mirror(tasks, &c.name, Api::all_with(client.clone(), &nso), nso, all()),
                virtual_node_objects: mirror(tasks, &c.name, Api::all_with(client.clone(), &vn), vn, all()),
                virtual_nodes: mirror(tasks, &c.name, Api::all(client.clone()), (), all().labels(VIRTUAL_NODE_SELECTOR)),
                namespace_maps: mirror(tasks, &c.name, Api::all_with(client.clone(), &nm), nm, all()),
                pods: mirror(tasks, &c.name, Api::all(client.clone()), (), all()),
                remote_namespaces: mirror(tasks, &c.name, Api::all(client.clone()), (), all().labels(REMOTE_ID_LABEL)),
                bindings: mirror(tasks, &c.name, Api::all(client.clone()), (), all().labels(REMOTE_ID_LABEL)),
                scheduling: mirror(tasks, &c.name, Api::all(client.clone()), (), all().labels(SCHEDULING_LABEL)),
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
                    // Knobs are read live, on each tick.
                    let fails = knobs.lock().expect("knobs lock").get(&members[me].name).is_some_and(|k| k.fails);
                    tick(&members, me, fails, &mut memory).await;
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

/// The VirtualNode kind (`offloading.liqo.io/v1beta1`).
fn virtual_node_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("offloading.liqo.io", "v1beta1", "VirtualNode"), "virtualnodes")
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

/// The remote namespace's name by `spec.namespaceMappingStrategy` (`status.go`,
/// `remoteNamespaceName`: an unknown strategy falls back to `DefaultName`; `SelectedName`
/// takes `spec.remoteNamespaceName` as it is, which Liqo's webhook requires).
pub fn remote_namespace(spec: &Value, namespace: &str, consumer: &str) -> String {
    match spec["namespaceMappingStrategy"].as_str() {
        Some("EnforceSameName") => namespace.to_owned(),
        Some("SelectedName") => spec["remoteNamespaceName"].as_str().unwrap_or_default().to_owned(),
        _ => default_remote_namespace(namespace, consumer),
    }
}

/// What one tick learnt about a namespace's offloading, for the pod loops.
struct Offload {
    terminating: bool,
    /// The providers whose NamespaceMap asks for it.
    selected: BTreeSet<String>,
    /// Provider → remote namespace, for the providers whose mapping is Accepted.
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
    /// As a provider: the NamespaceMaps whose last reconcile failed, and when to try again.
    requeues: namespace_maps::Requeues,
}

async fn tick(members: &[Member], me: usize, fails: bool, memory: &mut Memory) {
    let this = &members[me];
    if !this.synced_as_consumer() || !members.iter().all(Member::synced_as_provider) {
        tracing::debug!(cluster = %this.name, "emulated offloading: caches not synced yet");
        return;
    }
    namespace_maps::reconcile_as_provider(this, fails, &mut memory.requeues).await;
    namespace_maps::ensure_presence(this).await;
    let mut offloads = BTreeMap::new();
    for nso in this.offloadings.state() {
        if nso.metadata.name.as_deref() != Some(OFFLOADING_NAME) {
            continue;
        }
        let ns = nso.metadata.namespace.clone().unwrap_or_default();
        let o = offloading(this, &nso, &ns).await;
        offloads.insert(ns, o);
    }
    for n in &this.virtual_nodes.state() {
        if let (Some(name), Some(provider)) = (n.metadata.name.clone(), label(&n.metadata, REMOTE_ID_LABEL)) {
            memory.virtual_nodes.insert(name, provider.to_owned());
        }
    }
    virtual_kubelet::pods(this, members, &offloads, memory).await;
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

/// Sets (`Some`) or removes (`None`) the desired mapping of `ns` on NamespaceMap `nm`, if
/// it differs (`mappings.go`, `addDesiredMapping` / `removeDesiredMapping`); the mappings
/// as they are now.
async fn desire(consumer: &Member, nm: &DynamicObject, ns: &str, remote: Option<&str>) -> BTreeMap<String, String> {
    let mut desired = namespace_maps::desired(nm);
    if desired.get(ns).map(String::as_str) == remote {
        return desired;
    }
    let api: Api<DynamicObject> = Api::namespaced_with(consumer.client.clone(), nm.metadata.namespace.as_deref().unwrap_or_default(), &namespace_map_resource());
    let patch = json!({"spec": {"desiredMapping": {ns: remote}}});
    let name = nm.metadata.name.clone().unwrap_or_default();
    if logged(&consumer.name, || format!("changing the desired mapping of {ns} on NamespaceMap {name}"), api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await).is_some() {
        match remote {
            Some(r) => drop(desired.insert(ns.to_owned(), r.to_owned())),
            None => drop(desired.remove(ns)),
        }
    }
    desired
}

/// The NamespaceOffloading controller on one offloading: finalizer, desired mappings,
/// scheduling label, status; or, when deleted, its cleanup.
async fn offloading(consumer: &Member, nso: &DynamicObject, ns: &str) -> Offload {
    let api: Api<DynamicObject> = Api::namespaced_with(consumer.client.clone(), ns, &namespace_offloading_resource());
    let what = |w: &str| format!("{w} NamespaceOffloading {ns}/{OFFLOADING_NAME}");
    let spec = nso.data.get("spec").cloned().unwrap_or(Value::Null);
    let old = nso.data.get("status").cloned().unwrap_or(Value::Null);
    let terminating = nso.metadata.deletion_timestamp.is_some();
    // `getClusterIDMap`: the consumer's own NamespaceMaps by their cluster id.
    let maps: BTreeMap<String, Arc<DynamicObject>> = consumer
        .namespace_maps
        .state()
        .into_iter()
        .filter(|m| namespace_maps::is_local(m))
        .filter_map(|m| Some((label(&m.metadata, REMOTE_ID_LABEL)?.to_owned(), m)))
        .collect();
    // Each map's desired mappings once this pass's changes are made.
    let mut desired: BTreeMap<String, BTreeMap<String, String>> = maps.iter().map(|(id, m)| (id.clone(), namespace_maps::desired(m))).collect();
    if terminating {
        // `deletionLogic`: the label first, so no pod created from now on is offloaded; then
        // the mappings; the finalizer once the last pass's status had no remote condition.
        scheduling_label(consumer, ns, false).await;
        for (id, m) in &maps {
            desired.insert(id.clone(), desire(consumer, m, ns, None).await);
        }
        let none_left = old["remoteNamespacesConditions"].as_object().is_none_or(serde_json::Map::is_empty);
        if none_left && let Some(patch) = finalizer_patch(&nso.metadata, FINALIZER, false) {
            logged(&consumer.name, || what("removing the finalizer of"), api.patch(OFFLOADING_NAME, &PatchParams::default(), &Patch::Merge(&patch)).await);
        }
    } else {
        if let Some(patch) = finalizer_patch(&nso.metadata, FINALIZER, true) {
            logged(&consumer.name, || what("adding the finalizer to"), api.patch(OFFLOADING_NAME, &PatchParams::default(), &Patch::Merge(&patch)).await);
        }
        enforce_cluster_selector(consumer, &spec, ns, &maps, &mut desired).await;
        let pods = PodOffloadingStrategy::parse(spec["podOffloadingStrategy"].as_str());
        scheduling_label(consumer, ns, matches!(pods, PodOffloadingStrategy::LocalAndRemote | PodOffloadingStrategy::Remote)).await;
    }
    let (status, offload) = status(&old, nso, &remote_namespace(&spec, ns, &consumer.name), &maps, &desired, terminating);
    if status != old {
        logged(
            &consumer.name,
            || what("setting the status of"),
            api.patch_status(OFFLOADING_NAME, &PatchParams::default(), &Patch::Merge(&json!({"status": merge_patch(&old, &status)}))).await,
        );
    }
    offload
}

/// `enforceClusterSelector`: each VirtualNode's map asks for the namespace when the
/// selector matches the VirtualNode (its Node's labels, else its cluster id:
/// `virtualnode.GetLabelSelectors`), and no longer when it does not. Nothing changes while
/// a cluster with a VirtualNode has no NamespaceMap yet.
async fn enforce_cluster_selector(
    consumer: &Member,
    spec: &Value,
    ns: &str,
    maps: &BTreeMap<String, Arc<DynamicObject>>,
    desired: &mut BTreeMap<String, BTreeMap<String, String>>,
) {
    let vns = consumer.virtual_node_objects.state();
    let id_of = |v: &DynamicObject| v.data.pointer("/spec/clusterID").and_then(Value::as_str).map(str::to_owned);
    if let Some(missing) = vns.iter().filter_map(|v| id_of(v)).find(|id| !maps.contains_key(id)) {
        tracing::debug!(cluster = %consumer.name, "emulated offloading: no NamespaceMap found for remote cluster ID: {missing}");
        return;
    }
    let remote = remote_namespace(spec, ns, &consumer.name);
    for vn in &vns {
        let (Some(id), Some(name)) = (id_of(vn), vn.metadata.name.clone()) else { continue };
        let labels = match consumer.virtual_nodes.get(&ObjectRef::new(&name)) {
            Some(node) => node.metadata.labels.clone().unwrap_or_default(),
            None => BTreeMap::from([(REMOTE_ID_LABEL.to_owned(), id.clone())]),
        };
        let wanted = cluster_selector_matches(spec.get("clusterSelector"), &name, &labels);
        let now = desire(consumer, &maps[&id], ns, wanted.then_some(remote.as_str())).await;
        desired.insert(id, now);
    }
}

/// `enforceStatus`: the offloading's status from the NamespaceMaps (`desired` as this pass
/// left them), and what the pod loop needs.
fn status(
    old: &Value,
    nso: &DynamicObject,
    remote: &str,
    maps: &BTreeMap<String, Arc<DynamicObject>>,
    desired: &BTreeMap<String, BTreeMap<String, String>>,
    terminating: bool,
) -> (Value, Offload) {
    let ns = nso.metadata.namespace.as_deref().unwrap_or_default();
    // Conditions of maps that are gone go (`ensureRemoteConditionsConsistence`).
    let mut conditions: serde_json::Map<String, Value> =
        old["remoteNamespacesConditions"].as_object().cloned().unwrap_or_default().into_iter().filter(|(id, _)| maps.contains_key(id)).collect();
    let mut offload = Offload { terminating, selected: BTreeSet::new(), ready: BTreeMap::new() };
    let (mut required, mut ready, mut failed) = (0, 0, 0);
    for (id, nm) in maps {
        let requested = desired.get(id).is_some_and(|d| d.contains_key(ns));
        let mapping = namespace_maps::current(nm).get(ns).cloned().unwrap_or(Value::Null);
        let phase = mapping["phase"].as_str().unwrap_or_default();
        if requested {
            required += 1;
            offload.selected.insert(id.clone());
        }
        if phase == namespace_maps::ACCEPTED {
            ready += 1;
            offload.ready.insert(id.clone(), mapping["remoteNamespace"].as_str().unwrap_or_default().to_owned());
        } else if phase == namespace_maps::CREATION_LOOP_BACK_OFF {
            failed += 1;
        }
        if terminating && !requested && phase.is_empty() {
            conditions.remove(id);
            continue;
        }
        let mut cs = conditions.get(id).and_then(Value::as_array).cloned().unwrap_or_default();
        set_condition(&mut cs, required_condition(requested));
        if requested || !phase.is_empty() {
            set_condition(&mut cs, ready_condition(phase));
        }
        conditions.insert(id.clone(), Value::Array(cs));
    }
    let phase = if terminating { OffloadingPhase::Terminating } else { OffloadingPhase::of(required, ready, failed) };
    let status = json!({
        "observedGeneration": nso.metadata.generation,
        "remoteNamespaceName": remote,
        "offloadingPhase": phase.as_str(),
        "remoteNamespacesConditions": conditions,
    });
    (status, offload)
}

/// `setRemoteCondition`: a condition of the same type is kept while its status and reason
/// hold, else replaced; a new type is appended.
fn set_condition(conditions: &mut Vec<Value>, c: Value) {
    match conditions.iter_mut().find(|o| o["type"] == c["type"]) {
        Some(o) if o["status"] == c["status"] && o["reason"] == c["reason"] => {}
        Some(o) => *o = c,
        None => conditions.push(c),
    }
}

/// `nsoffRequiredCondition`.
fn required_condition(required: bool) -> Value {
    let (status, reason, message) = if required {
        ("True", "ClusterSelected", "The remote cluster has been selected through the ClusterSelector field")
    } else {
        ("False", "ClusterNotSelected", "The remote cluster has not been selected through the ClusterSelector field")
    };
    json!({"type": "OffloadingRequired", "status": status, "reason": reason, "message": message, "lastTransitionTime": now()})
}

/// `nsoffReadyCondition`, from the mapping's phase.
fn ready_condition(phase: &str) -> Value {
    let (status, reason, message) = match phase {
        namespace_maps::ACCEPTED => ("True", "NamespaceCreated", "Namespace correctly offloaded to the remote cluster"),
        namespace_maps::CREATION_LOOP_BACK_OFF => ("False", "CreationLoopBackOff", "Some problems occurred during remote namespace creation"),
        namespace_maps::TERMINATING => ("False", "Terminating", "The remote namespace is being deleted"),
        _ => ("False", "Creating", "The remote namespace is being created"),
    };
    json!({"type": "Ready", "status": status, "reason": reason, "message": message, "lastTransitionTime": now()})
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
        assert_eq!(remote_namespace(&json!({}), "web", "member-1"), "web-member-1");
        assert_eq!(remote_namespace(&json!({"namespaceMappingStrategy": "EnforceSameName"}), "web", "member-1"), "web");
        let selected = json!({"namespaceMappingStrategy": "SelectedName", "remoteNamespaceName": "elsewhere"});
        assert_eq!(remote_namespace(&selected, "web", "member-1"), "elsewhere");
        assert_eq!(remote_namespace(&json!({"namespaceMappingStrategy": "Unknown"}), "web", "member-1"), "web-member-1", "upstream's fallback");
    }

    fn map(id: &str, desired: Value, current: Value) -> Arc<DynamicObject> {
        let mut o: DynamicObject = serde_json::from_value(json!({"apiVersion": "offloading.liqo.io/v1beta1", "kind": "NamespaceMap",
            "metadata": {"name": id, "namespace": format!("liqo-tenant-{id}"), "labels": {REMOTE_ID_LABEL: id}},
            "spec": {"desiredMapping": desired}, "status": {"currentMapping": current}}))
        .expect("a NamespaceMap");
        o.metadata.namespace = Some(format!("liqo-tenant-{id}"));
        Arc::new(o)
    }

    fn nso(deleting: bool) -> DynamicObject {
        let mut o: DynamicObject = serde_json::from_value(json!({"apiVersion": "offloading.liqo.io/v1beta1", "kind": "NamespaceOffloading",
            "metadata": {"name": "offloading", "namespace": "web", "generation": 2}}))
        .expect("a NamespaceOffloading");
        if deleting {
            o.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()));
        }
        o
    }

    /// `enforceStatus`: a condition per map, selected or not; Ready from the mapping's phase
    /// with upstream's reasons; the phase from required, ready and failed; while deleting, a
    /// map that neither asks for nor maps the namespace loses its conditions.
    #[test]
    fn status_follows_the_namespace_maps() {
        let maps: BTreeMap<String, Arc<DynamicObject>> = [
            ("member-2".to_owned(), map("member-2", json!({"web": "web-member-1"}), json!({"web": {"remoteNamespace": "web-member-1", "phase": "Accepted"}}))),
            ("member-3".to_owned(), map("member-3", json!({"web": "web-member-1"}), json!({"web": {"remoteNamespace": "web-member-1", "phase": "CreationLoopBackOff"}}))),
            ("member-4".to_owned(), map("member-4", json!({}), json!({}))),
        ]
        .into_iter()
        .collect();
        let desired = maps.iter().map(|(id, m)| (id.clone(), namespace_maps::desired(m))).collect();
        let (status, offload) = status(&Value::Null, &nso(false), "web-member-1", &maps, &desired, false);
        assert_eq!(status["offloadingPhase"], "SomeFailed");
        assert_eq!(status["observedGeneration"], 2);
        let cond = |id: &str, t: &str| {
            status["remoteNamespacesConditions"][id].as_array().and_then(|cs| cs.iter().find(|c| c["type"] == t)).map(|c| (c["status"].clone(), c["reason"].clone()))
        };
        assert_eq!(cond("member-2", "Ready"), Some((json!("True"), json!("NamespaceCreated"))));
        assert_eq!(cond("member-3", "Ready"), Some((json!("False"), json!("CreationLoopBackOff"))));
        assert_eq!(cond("member-4", "OffloadingRequired"), Some((json!("False"), json!("ClusterNotSelected"))));
        assert_eq!(cond("member-4", "Ready"), None, "not asked for, not mapped: no Ready condition");
        assert_eq!(offload.ready, BTreeMap::from([("member-2".to_owned(), "web-member-1".to_owned())]));
        assert_eq!(offload.selected, BTreeSet::from(["member-2".to_owned(), "member-3".to_owned()]));
        // The same status again keeps the conditions (and their times) as they were.
        let (again, _) = status_again(&status, &maps, &desired);
        assert_eq!(again, status);
        // Deleting, mappings withdrawn: member-4's conditions go, the others' stay while mapped.
        let withdrawn: BTreeMap<String, BTreeMap<String, String>> = maps.keys().map(|id| (id.clone(), BTreeMap::new())).collect();
        let (deleting, _) = super::status(&status, &nso(true), "web-member-1", &maps, &withdrawn, true);
        assert_eq!(deleting["offloadingPhase"], "Terminating");
        let left: Vec<&String> = deleting["remoteNamespacesConditions"].as_object().unwrap().keys().collect();
        assert_eq!(left, ["member-2", "member-3"]);
    }

    fn status_again(old: &Value, maps: &BTreeMap<String, Arc<DynamicObject>>, desired: &BTreeMap<String, BTreeMap<String, String>>) -> (Value, Offload) {
        status(old, &nso(false), "web-member-1", maps, desired, false)
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

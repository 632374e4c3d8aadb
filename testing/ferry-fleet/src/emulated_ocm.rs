//! Open Cluster Management's part in the simulated fleet, played against the real API
//! servers: registration as upstream's ([`crate::emulated_registration`]: the hub's
//! controllers and a klusterlet per managed cluster, the members' and the Cluster API
//! workload clusters'), the work agent of each managed cluster (applies a ManifestWork's manifests server-side,
//! reports conditions, resource status and feedback, owns what it applied through the
//! work's AppliedManifestWork and, when the work goes, deletes only that, as the delete
//! option says), and the placement controller (Placement → PlacementDecision by cluster
//! sets, label predicates, the clusters' taints against the Placement's tolerations
//! ([`crate::ocm_taints`]: availability counts only through the taints the hub keeps) and
//! AddOnPlacementScore prioritizers).
//!
//! Each part is a loop that re-reads its objects whenever one of the kinds it reads
//! changes ([`crate::wake`]) and writes only what changed: simple, restart-proof, and quick
//! enough for tests. Knobs make a cluster never become available or a work agent stuck.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, Preconditions, PropagationPolicy};
use kube::core::{ApiResource, GroupVersionKind};
use kube::discovery::{ApiCapabilities, Scope};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::task::JoinHandle;

use crate::emulate::{finalizer_patch, now};
use crate::emulated_registration::Klusterlet;
use crate::wake::Wake;
use crate::work_apply_sync::{ApplySync, Outcome, Refusal, WorkSpec};
use crate::work_status_sync::{ResourceKey, StatusSync};
use crate::fleet::Fleet;
use crate::ocm_prioritizers::{self, Decision};
use ferry_kube::cluster_sets::{ClusterSet, ClusterSetError};
use ferry_kube::kinds::ManagedClusterSet;

/// The work agent's finalizer (as OCM names it).
pub const WORK_FINALIZER: &str = "cluster.open-cluster-management.io/manifest-work-cleanup";
/// The finalizer of an AppliedManifestWork (api `work/v1/types.go`,
/// `AppliedManifestWorkFinalizer`).
pub const APPLIED_FINALIZER: &str = "cluster.open-cluster-management.io/applied-manifest-work-cleanup";
/// The AppliedManifestWork kind, cluster-scoped on each managed cluster: the record of what
/// a work applied and the owner of what it owns. The work agent installs it (the project's
/// open-schema form, [`crate::kinds::crd`]: upstream's CRD is not among the shared ones).
pub const APPLIED_KIND: crate::kinds::Kind = ("work.open-cluster-management.io", "v1", "AppliedManifestWork", "appliedmanifestworks", false, true);
pub use ferry_kube::vocab::ocm::CLUSTERSET_LABEL;
/// Label of a Placement's decisions.
pub const PLACEMENT_LABEL: &str = "cluster.open-cluster-management.io/placement";
const MANAGER: &str = "ferry-fleet-ocm";

fn ar(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

fn works() -> ApiResource {
    ar("work.open-cluster-management.io", "v1", "ManifestWork", "manifestworks")
}
fn applied_works() -> ApiResource {
    let (group, version, kind, plural, _, _) = APPLIED_KIND;
    ar(group, version, kind, plural)
}
fn managed_clusters() -> ApiResource {
    ar("cluster.open-cluster-management.io", "v1", "ManagedCluster", "managedclusters")
}
fn placements() -> ApiResource {
    ar("cluster.open-cluster-management.io", "v1beta1", "Placement", "placements")
}
fn decisions() -> ApiResource {
    ar("cluster.open-cluster-management.io", "v1beta1", "PlacementDecision", "placementdecisions")
}
fn bindings() -> ApiResource {
    ar("cluster.open-cluster-management.io", "v1beta2", "ManagedClusterSetBinding", "managedclustersetbindings")
}
fn scores() -> ApiResource {
    ar("cluster.open-cluster-management.io", "v1alpha1", "AddOnPlacementScore", "addonplacementscores")
}

fn condition(type_: &str, ok: bool, reason: &str, message: &str, generation: i64) -> Value {
    json!({"type": type_, "status": if ok { "True" } else { "False" }, "reason": reason, "message": message,
           "lastTransitionTime": now(), "observedGeneration": generation})
}

/// Keeps the lastTransitionTime of conditions whose status did not change, so a status is
/// rewritten only when something in it changed.
fn keep_times(old: Option<&Value>, new: &mut Value) {
    let (Some(old), Some(new)) = (old.and_then(Value::as_array), new.as_array_mut()) else { return };
    for c in new {
        if let Some(o) = old.iter().find(|o| o["type"] == c["type"] && o["status"] == c["status"]) {
            c["lastTransitionTime"] = o["lastTransitionTime"].clone();
        }
    }
}

/// The knobs of one emulated part, changeable while it runs.
#[derive(Debug, Clone, Default)]
pub struct OcmKnobs {
    /// The work agent does nothing (a cluster whose agent is down).
    pub stuck: bool,
    /// The cluster's klusterlet finds its API server unhealthy: it reports Available
    /// False (`ManagedClusterKubeAPIServerUnavailable`) and still renews its lease.
    pub unavailable: bool,
    /// The work agent applies a new ManifestWork generation only this long after it
    /// first saw it (a slow agent).
    pub apply_delay: Duration,
    /// The work agent refuses every manifest (Applied=False, reason injected).
    pub fail_apply: bool,
    /// The work agent's status controller reads a new generation's resources only this
    /// long after its apply controller applied them (upstream requeues it every
    /// `--status-sync-interval`, 10 s, besides on work events): Applied stands at the new
    /// generation beside the previous spec's feedback meanwhile.
    pub status_delay: Duration,
    /// The work agent's `--status-sync-interval` (the Klusterlet's
    /// `workConfiguration.statusSyncInterval`); None: upstream's default, 10 s
    /// ([`crate::work_status_sync`]).
    pub status_sync_interval: Option<Duration>,
    /// The work agent's apply resync (upstream's `ResyncInterval`, which its integration
    /// tests shorten); None: upstream's 4 minutes, jittered to 4-6
    /// ([`crate::work_apply_sync`]).
    pub apply_resync_interval: Option<Duration>,
}

/// Emulated OCM of a fleet; stops when dropped.
#[derive(Debug)]
pub struct EmulatedOcm {
    knobs: Arc<Mutex<HashMap<String, OcmKnobs>>>,
    /// The agents' wakes, poked when a knob changes (a stopped agent's are gone).
    wakes: Arc<Mutex<Vec<Weak<Wake>>>>,
    tasks: Vec<JoinHandle<()>>,
    /// OCM's hub webhooks, served while the hub is emulated.
    _admission: crate::admission::AdmissionServer,
}

impl Drop for EmulatedOcm {
    fn drop(&mut self) {
        self.tasks.iter().for_each(JoinHandle::abort);
    }
}

impl EmulatedOcm {
    /// Starts registration and placement on the hub and a work agent per managed cluster.
    pub async fn start(fleet: &Fleet) -> Result<Self, crate::FleetError> {
        let knobs: Arc<Mutex<HashMap<String, OcmKnobs>>> = Arc::default();
        let hub = fleet.hub().client().await?;
        let hub_cluster = fleet.hub();
        crate::emulated_registration::install_hub(&hub, &hub_cluster.server, &hub_cluster.ca_pem()?)
            .await
            .map_err(|e| crate::FleetError::Client { cluster: "hub".into(), source: Box::new(e) })?;
        // The cluster manager's webhooks come with the hub: the default set and the taints'
        // times are theirs, and what they refuse a real hub refuses.
        let admission = crate::webhooks_ocm::serve(&hub).await.map_err(|e| crate::FleetError::Client { cluster: "hub".into(), source: Box::new(e) })?;
        // `HubHash`: what names a work's AppliedManifestWork (`<hub hash>-<work>`).
        let hub_hash: String = Sha256::digest(hub_cluster.server.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
        let knobs_wake: Arc<Mutex<Vec<Weak<Wake>>>> = Arc::default();
        let mut registration_wake = Wake::with_fallback(crate::emulated_registration::FALLBACK);
        // Not the ManifestWorks: upstream's GC and ManagedCluster controllers list them
        // while a deleted cluster's go and look again 5 s later (`requeueError`), so a
        // work's status write is no registration pass.
        for ar in [managed_clusters(), bindings(), ApiResource::erase::<ManagedClusterSet>(&())] {
            registration_wake.watch(&hub, &ar);
        }
        let rbac = Arc::new(crate::emulated_registration::HubRbac::default());
        rbac.watch(&hub, &mut registration_wake);
        let mut placement_wake = Wake::with_fallback(PLACEMENT_FALLBACK);
        for ar in [placements(), managed_clusters(), bindings(), scores(), ApiResource::erase::<ManagedClusterSet>(&())] {
            placement_wake.watch(&hub, &ar);
        }
        let placement_wake = Arc::new(placement_wake);
        let registration_wake = Arc::new(registration_wake);
        let mut tasks = vec![
            tokio::spawn(forever("registration", registration_wake.clone(), {
                let hub = hub.clone();
                move || {
                    let (hub, wake, rbac) = (hub.clone(), registration_wake.clone(), rbac.clone());
                    async move {
                        // Separate controllers: one's failure does not stop the other.
                        let sets = crate::emulated_cluster_sets::tick(&hub).await;
                        crate::emulated_registration::hub_tick(&hub, &wake, &rbac).await.and(sets)
                    }
                }
            })),
            tokio::spawn(agents(fleet.clusters.iter().skip(1).map(|c| c.name.clone()).collect(), hub.clone(), hub_hash.clone(), knobs.clone(), knobs_wake.clone())),
            tokio::spawn(forever("placement", placement_wake.clone(), {
                let hub = hub.clone();
                move || placement(hub.clone(), placement_wake.clone())
            })),
        ];
        for c in fleet.clusters.iter().skip(1) {
            crate::crds::install(&c.client().await?, vec![crate::kinds::crd(&APPLIED_KIND)])
                .await
                .map_err(|e| crate::FleetError::Client { cluster: c.name.clone(), source: Box::new(e) })?;
            let managed = c.client().await?;
            let wake = klusterlet_wake(&hub, &managed);
            let klusterlet = Arc::new(Klusterlet::new(&c.name, managed.clone(), knobs.clone(), wake.clone()));
            knobs_wake.lock().expect("wakes lock").push(Arc::downgrade(&wake));
            tasks.push(tokio::spawn(forever("klusterlet", wake, move || {
                let k = klusterlet.clone();
                async move { k.tick().await }
            })));
            let wake = work_agent_wake(&hub, &managed);
            knobs_wake.lock().expect("wakes lock").push(Arc::downgrade(&wake));
            let agent = WorkAgent {
                cluster: c.name.clone(),
                hub_hash: hub_hash.clone(),
                hub: hub.clone(),
                managed: managed.clone(),
                knobs: knobs.clone(),
                kinds: Mutex::default(),
                first_seen: Mutex::default(),
                applied_at: Mutex::default(),
                applied: Mutex::default(),
                klusterlet: None,
                applies: ApplySync::new(&wake),
                status: StatusSync::new(managed.clone(), &wake),
                finalizing: Mutex::default(),
                wake: wake.clone(),
            };
            let agent = Arc::new(agent);
            tasks.push(tokio::spawn(forever("work agent", wake, move || {
                let a = agent.clone();
                async move { a.tick().await }
            })));
        }
        Ok(Self { knobs, wakes: knobs_wake, tasks, _admission: admission })
    }

    /// Changes the knobs of `cluster`; its agents look again at once.
    pub fn set(&self, cluster: &str, f: impl FnOnce(&mut OcmKnobs)) {
        f(self.knobs.lock().expect("knobs lock").entry(cluster.to_owned()).or_default());
        self.wakes.lock().expect("wakes lock").iter().filter_map(Weak::upgrade).for_each(|w| w.poke());
    }
}

/// The placement loop's longest sleep with nothing changed: it watches what it decides on
/// and asks for the times tolerations run out; upstream's scheduler requeues for nothing
/// else (an AddOnPlacementScore's `validUntil` passing is seen on the next change:
/// `pkg/placement/plugins/addon/addon.go`, `RequeueAfter`).
const PLACEMENT_FALLBACK: std::time::Duration = std::time::Duration::from_secs(10);

/// How often a Cluster API workload cluster's work agent looks whether its klusterlet has
/// joined (its operator starts the agent then).
const AGENT_START: Duration = Duration::from_secs(1);

/// What a registration agent watches: its Klusterlet, bootstrap Secret and nodes (what it
/// reports) on the managed cluster, its ManagedCluster and CSR on the hub (upstream's
/// status controller watches the nodes too, `spoke/managedcluster/status_controller.go`).
/// It asks for its lease renewals.
fn klusterlet_wake(hub: &kube::Client, managed: &kube::Client) -> Arc<Wake> {
    let mut wake = Wake::with_fallback(crate::emulated_registration::FALLBACK);
    wake.watch(managed, &crate::emulated_registration::klusterlets());
    wake.watch(managed, &ApiResource::erase::<k8s_openapi::api::core::v1::Secret>(&()));
    wake.watch(managed, &ApiResource::erase::<k8s_openapi::api::core::v1::Node>(&()));
    wake.watch(hub, &managed_clusters());
    wake.watch(hub, &ApiResource::erase::<k8s_openapi::api::certificates::v1::CertificateSigningRequest>(&()));
    Arc::new(wake)
}

/// What a work agent watches: the hub's ManifestWorks and its cluster's
/// AppliedManifestWorks. It asks for its works' status syncs, and the resources a work
/// wants watched wake it ([`crate::work_status_sync`]): upstream's agent reads a
/// resource's status on the sync interval unless its feedback is `Watch`.
fn work_agent_wake(hub: &kube::Client, managed: &kube::Client) -> Arc<Wake> {
    let mut wake = Wake::with_fallback(crate::emulated_registration::FALLBACK);
    wake.watch(hub, &works());
    wake.watch(managed, &applied_works());
    Arc::new(wake)
}

/// The klusterlets of Cluster API's workload clusters: one per `<name>-kubeconfig` Secret
/// on the hub (the fleet's own members, named in `members`, have theirs already), each with
/// the work agent its operator runs beside the registration agent (acting only while the
/// klusterlet's agents run, [`Klusterlet::agents_run`]).
async fn agents(members: Vec<String>, hub: kube::Client, hub_hash: String, knobs: Arc<Mutex<HashMap<String, OcmKnobs>>>, wakes: Arc<Mutex<Vec<Weak<Wake>>>>) {
    use k8s_openapi::api::core::v1::Secret;
    let mut running: HashMap<String, (String, JoinHandle<()>)> = HashMap::new();
    // Only the Secrets change what it runs.
    let mut wake = Wake::with_fallback(crate::emulated_registration::FALLBACK);
    wake.watch(&hub, &ApiResource::erase::<Secret>(&()));
    loop {
        wake.next().await;
        let secrets: Api<Secret> = Api::all(hub.clone());
        let Ok(list) = secrets.list(&ListParams::default().labels("cluster.x-k8s.io/cluster-name")).await else {
            wake.after(crate::wake::RETRY);
            continue;
        };
        let mut seen = BTreeSet::new();
        for s in list.items {
            let Some(name) = s.metadata.labels.as_ref().and_then(|l| l.get("cluster.x-k8s.io/cluster-name")).cloned() else { continue };
            if members.contains(&name) || s.metadata.name.as_deref() != Some(&format!("{name}-kubeconfig")) {
                continue;
            }
            let Some(kc) = s.data.as_ref().and_then(|d| d.get("value")).map(|b| String::from_utf8_lossy(&b.0).into_owned()) else { continue };
            seen.insert(name.clone());
            if running.get(&name).is_some_and(|(k, _)| *k == kc) {
                continue;
            }
            let Ok(client) = crate::emulated_registration::client_from(&kc).await else { continue };
            let (registration_wake, work_wake) = (klusterlet_wake(&hub, &client), work_agent_wake(&hub, &client));
            let klusterlet = Arc::new(Klusterlet::new(&name, client.clone(), knobs.clone(), registration_wake.clone()));
            // A stopped agent's wakes drop with its task (and their watches with them).
            let mut all = wakes.lock().expect("wakes lock");
            all.retain(|w| w.strong_count() > 0);
            all.extend([Arc::downgrade(&registration_wake), Arc::downgrade(&work_wake)]);
            drop(all);
            let agent = Arc::new(WorkAgent {
                cluster: name.clone(),
                hub_hash: hub_hash.clone(),
                hub: hub.clone(),
                managed: client.clone(),
                knobs: knobs.clone(),
                kinds: Mutex::default(),
                first_seen: Mutex::default(),
                applied_at: Mutex::default(),
                applied: Mutex::default(),
                klusterlet: Some(klusterlet.clone()),
                applies: ApplySync::new(&work_wake),
                status: StatusSync::new(client.clone(), &work_wake),
                finalizing: Mutex::default(),
                wake: work_wake.clone(),
            });
            let task = tokio::spawn(async move {
                let registration = forever("klusterlet", registration_wake, || {
                    let k = klusterlet.clone();
                    async move { k.tick().await }
                });
                let work = async {
                    // The agent's AppliedManifestWork kind, as for the members.
                    loop {
                        work_wake.next().await;
                        match crate::crds::install(&agent.managed, vec![crate::kinds::crd(&APPLIED_KIND)]).await {
                            Ok(_) => break,
                            Err(e) => {
                                work_wake.after(crate::wake::RETRY);
                                tracing::debug!(error = %e, "emulated work agent: installing its CRD again");
                            }
                        }
                    }
                    forever("work agent", work_wake.clone(), || {
                        let a = agent.clone();
                        async move { a.tick().await }
                    })
                    .await
                };
                tokio::join!(registration, work);
            });
            if let Some((_, old)) = running.insert(name, (kc, task)) {
                old.abort();
            }
        }
        running.retain(|name, (_, task)| {
            let keep = seen.contains(name);
            if !keep {
                task.abort();
            }
            keep
        });
    }
}

/// Runs `tick` whenever `wake` says; errors are logged and retried soon.
async fn forever<F, Fut, E>(what: &'static str, wake: Arc<Wake>, tick: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    loop {
        wake.next().await;
        if let Err(e) = tick().await {
            wake.after(crate::wake::RETRY);
            tracing::debug!(what, error = %e, "emulated OCM: retrying");
        }
    }
}

fn knob(knobs: &Mutex<HashMap<String, OcmKnobs>>, cluster: &str) -> OcmKnobs {
    knobs.lock().expect("knobs lock").get(cluster).cloned().unwrap_or_default()
}

// ---------------------------------------------------------------------------------------
// work agent

struct WorkAgent {
    cluster: String,
    /// The hub's hash (ocm `pkg/work/helper/helpers.go`, `HubHash`).
    hub_hash: String,
    hub: kube::Client,
    managed: kube::Client,
    knobs: Arc<Mutex<HashMap<String, OcmKnobs>>>,
    kinds: Mutex<HashMap<(String, String), (ApiResource, ApiCapabilities)>>,
    /// When each (work uid, generation) was first seen, for the apply delay.
    first_seen: Mutex<HashMap<(String, i64), std::time::Instant>>,
    /// When each (work uid, generation) was applied, for the status delay.
    applied_at: Mutex<HashMap<(String, i64), std::time::Instant>>,
    /// Starts its passes; asked for a pass when an apply delay runs out.
    wake: Arc<Wake>,
    /// What each (work uid, manifest) was last written as, and the live object's
    /// resourceVersion right after: upstream's resource cache (`SafeToSkipApply`).
    applied: Mutex<BTreeMap<(String, Meta), (String, String)>>,
    /// The cluster's klusterlet, whose operator runs this agent (a Cluster API workload
    /// cluster's): the agent acts only while [`Klusterlet::agents_run`], so the works of a
    /// cluster that left (or never joined) keep their finalizer, as upstream's, where only
    /// the work agent removes it (ocm `pkg/work/spoke/controllers/finalizercontroller/manifestwork_finalize_controller.go`).
    /// None: a fleet member's agent, deployed with the member and always running.
    klusterlet: Option<Arc<Klusterlet>>,
    /// When each work's manifests are applied, and how each fared.
    applies: ApplySync,
    /// When each work's status is synced, and the watches of watch-type feedback.
    status: StatusSync,
    /// Per AppliedManifestWork being finalized: how many passes found resources still
    /// going (upstream's rate limiter, 50 ms doubling to 60 s, sets the next look).
    finalizing: Mutex<HashMap<String, u32>>,
}

/// A manifest's write: the API server's refusal, if any, and the live object after it.
type Written = (Outcome, Option<DynamicObject>);

/// How the work agent writes one manifest: `manifestConfigs[].updateStrategy.type`, as
/// upstream's `pkg/work/spoke/apply` does it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Strategy {
    /// The default (`update_apply.go`): create when missing; otherwise, whenever the
    /// manifest or the live object changed since the last write, replace the object with
    /// the manifest (labels, annotations and owners merged, finalizers kept). What others
    /// wrote into the object (a result in a ConfigMap's data) is overwritten.
    Update,
    /// `server_side_apply.go`: a server-side apply by this field manager; fields other
    /// managers own and the manifest does not name survive.
    ServerSideApply { manager: String, force: bool },
    /// `create_only_apply.go`: created when missing, never written again.
    CreateOnly,
    /// `read_only_apply.go`: never written; only its status and feedback are read.
    ReadOnly,
}

/// Whether the live object already is what manifest `m` asks for, as the Update
/// strategy judges it: library-go's typed appliers (`resourceapply/core.go`, `rbac.go`)
/// for the kinds they handle (a Namespace and a ServiceAccount by their metadata only, a
/// ConfigMap and a Secret by their data, RBAC by rules, subjects and roleRef), and
/// ocm's `isSameUnstructured` (everything but metadata and status) for the rest.
fn same_as_live(m: &Value, live: &DynamicObject) -> bool {
    let live_v = serde_json::to_value(live).unwrap_or_default();
    let field = |v: &Value, k: &str| v.get(k).filter(|x| !x.is_null()).cloned().unwrap_or(Value::Null);
    let subset = |k: &str| {
        m.pointer(&format!("/metadata/{k}")).and_then(Value::as_object).into_iter().flatten().all(|(key, val)| live_v.pointer(&format!("/metadata/{k}/{}", key.replace('~', "~0").replace('/', "~1"))) == Some(val))
    };
    if !(subset("labels") && subset("annotations")) {
        return false;
    }
    let same = |keys: &[&str]| keys.iter().all(|k| field(m, k) == field(&live_v, k));
    match m.get("kind").and_then(Value::as_str).unwrap_or("") {
        "Namespace" | "ServiceAccount" => true,
        "ConfigMap" | "Secret" => same(&["data", "binaryData"]),
        "Role" | "ClusterRole" => same(&["rules"]),
        "RoleBinding" | "ClusterRoleBinding" => same(&["subjects", "roleRef"]),
        _ => {
            let strip = |v: &Value| {
                let mut v = v.clone();
                if let Some(o) = v.as_object_mut() {
                    o.remove("metadata");
                    o.remove("status");
                }
                v
            };
            strip(m) == strip(&live_v)
        }
    }
}

fn strategy(config: Option<&Value>) -> Strategy {
    let s = config.and_then(|c| c.get("updateStrategy"));
    match s.and_then(|s| s.get("type")).and_then(Value::as_str).unwrap_or("Update") {
        "ServerSideApply" => Strategy::ServerSideApply {
            // The CRD defaults the field manager to `work-agent`.
            manager: s.and_then(|s| s.pointer("/serverSideApply/fieldManager")).and_then(Value::as_str).unwrap_or("work-agent").to_owned(),
            force: s.and_then(|s| s.pointer("/serverSideApply/force")).and_then(Value::as_bool).unwrap_or(false),
        },
        "CreateOnly" => Strategy::CreateOnly,
        "ReadOnly" => Strategy::ReadOnly,
        _ => Strategy::Update,
    }
}

/// Where a manifest lives on the managed cluster.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Meta {
    group: String,
    version: String,
    kind: String,
    resource: String,
    namespace: String,
    name: String,
}

impl Meta {
    /// Where it lives, as the status sync and the dynamic client name it.
    fn key(&self) -> ResourceKey {
        ResourceKey { group: self.group.clone(), version: self.version.clone(), resource: self.resource.clone(), namespace: self.namespace.clone(), name: self.name.clone() }
    }

    fn json(&self, ordinal: usize) -> Value {
        json!({"ordinal": ordinal, "group": self.group, "version": self.version, "kind": self.kind,
               "resource": self.resource, "namespace": self.namespace, "name": self.name})
    }

    fn from_status(v: &Value) -> Option<Self> {
        let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        Some(Self { group: s("group"), version: s("version"), kind: s("kind"), resource: s("resource"), namespace: s("namespace"), name: v.get("name")?.as_str()?.to_owned() })
    }
}

/// One entry of an AppliedManifestWork's `status.appliedResources`
/// (`AppliedManifestResourceMeta`): what the work applied, with the UID it had then. The
/// order is upstream's (`appliedmanifestwork_reconciler.go` sorts by group, version,
/// resource, namespace, name).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct AppliedResource {
    group: String,
    version: String,
    resource: String,
    namespace: String,
    name: String,
    uid: String,
}

impl AppliedResource {
    /// Where it lives (its API: [`ResourceKey::api`], as upstream's dynamic client reaches it).
    fn key(&self) -> ResourceKey {
        ResourceKey { group: self.group.clone(), version: self.version.clone(), resource: self.resource.clone(), namespace: self.namespace.clone(), name: self.name.clone() }
    }

    fn json(&self) -> Value {
        json!({"group": self.group, "version": self.version, "resource": self.resource, "namespace": self.namespace, "name": self.name, "uid": self.uid})
    }

    /// Read as the API server keeps it (an empty string may come back null).
    fn from_json(v: &Value) -> Option<Self> {
        let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        Some(Self { group: s("group"), version: s("version"), resource: s("resource"), namespace: s("namespace"), name: v.get("name")?.as_str()?.to_owned(), uid: s("uid") })
    }

    /// Its `ResourceIdentifier` (no version: `FindUntrackedResources` matches by this).
    fn id(&self) -> (&str, &str, &str, &str) {
        (&self.group, &self.resource, &self.namespace, &self.name)
    }
}

/// The applied resources an AppliedManifestWork records.
fn applied_resources(amw: &DynamicObject) -> Vec<AppliedResource> {
    amw.data.pointer("/status/appliedResources").and_then(Value::as_array).into_iter().flatten().filter_map(AppliedResource::from_json).collect()
}

/// The owner reference an AppliedManifestWork puts on what its work owns (ocm
/// `pkg/work/helper/helpers.go`, `NewAppliedManifestWorkOwner`).
fn applied_owner(amw: &DynamicObject) -> OwnerReference {
    let (group, version, kind, _, _, _) = APPLIED_KIND;
    OwnerReference {
        api_version: format!("{group}/{version}"),
        kind: kind.to_owned(),
        name: amw.metadata.name.clone().unwrap_or_default(),
        uid: amw.metadata.uid.clone().unwrap_or_default(),
        ..OwnerReference::default()
    }
}

/// Whether the work owns the manifest at `meta` (ocm `pkg/work/helper/helpers.go`,
/// `OwnedByTheWork`): yes by default and under `Foreground`; no under `Orphan`; under
/// `SelectivelyOrphan` (or no policy), no when an orphaning rule names its group, resource,
/// namespace and name exactly (no wildcards, unlike a manifest config's identifier).
fn owned_by_the_work(meta: &Meta, delete_option: Option<&Value>) -> bool {
    let Some(option) = delete_option.filter(|d| !d.is_null()) else { return true };
    match option.get("propagationPolicy").and_then(Value::as_str) {
        Some("Foreground") => return true,
        Some("Orphan") => return false,
        _ => {}
    }
    let Some(selectively) = option.get("selectivelyOrphans").filter(|s| !s.is_null()) else { return true };
    let rules = selectively.get("orphaningRules").and_then(Value::as_array).into_iter().flatten();
    let field = |r: &Value, k: &str| r.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    !rules.into_iter().any(|r| field(r, "group") == meta.group && field(r, "resource") == meta.resource && field(r, "namespace") == meta.namespace && field(r, "name") == meta.name)
}

/// The owner references an object should carry, None when it already does: the work's
/// owner added when the work owns it, else removed (ocm `manifestwork_reconciler.go`,
/// `manageOwnerRef`, asks library-go's `resourcemerge.MergeOwnerRefs` to remove it with
/// the `<uid>-` key; owners match by name, kind and API group).
fn merge_owner(existing: &[OwnerReference], owner: &OwnerReference, owned: bool) -> Option<Vec<OwnerReference>> {
    let group = |av: &str| av.rsplit_once('/').map_or(String::new(), |(g, _)| g.to_owned());
    let mut refs = existing.to_vec();
    match (refs.iter().position(|o| o.name == owner.name && o.kind == owner.kind && group(&o.api_version) == group(&owner.api_version)), owned) {
        (None, false) => return None,
        (None, true) => refs.push(owner.clone()),
        (Some(i), false) => {
            refs.remove(i);
        }
        (Some(i), true) if refs[i] == *owner => return None,
        (Some(i), true) => refs[i] = owner.clone(),
    }
    Some(refs)
}

/// `helpers.go`, `ApplyOwnerReferences`: a merge patch of the owner references (guarded by
/// the object's UID and resourceVersion) when [`merge_owner`] changes them; the object as
/// it is after.
async fn apply_owner(api: &Api<DynamicObject>, obj: DynamicObject, owner: &OwnerReference, owned: bool) -> Result<DynamicObject, kube::Error> {
    let Some(refs) = merge_owner(obj.metadata.owner_references.as_deref().unwrap_or_default(), owner, owned) else { return Ok(obj) };
    let patch = json!({"metadata": {"uid": obj.metadata.uid, "resourceVersion": obj.metadata.resource_version, "ownerReferences": refs}});
    api.patch(obj.metadata.name.as_deref().unwrap_or_default(), &PatchParams::default(), &Patch::Merge(&patch)).await
}

/// The work's owner on what it writes, and whether this manifest takes it.
struct Own<'a> {
    owner: &'a OwnerReference,
    owned: bool,
}

impl WorkAgent {
    async fn resolve(&self, api_version: &str, kind: &str) -> Result<(ApiResource, ApiCapabilities), kube::Error> {
        let key = (api_version.to_owned(), kind.to_owned());
        if let Some(v) = self.kinds.lock().expect("kinds lock").get(&key) {
            return Ok(v.clone());
        }
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let found = kube::discovery::pinned_kind(&self.managed, &GroupVersionKind::gvk(group, version, kind)).await?;
        self.kinds.lock().expect("kinds lock").insert(key, found.clone());
        Ok(found)
    }

    fn api(&self, ar: &ApiResource, caps: &ApiCapabilities, namespace: &str) -> Api<DynamicObject> {
        match caps.scope {
            Scope::Namespaced => Api::namespaced_with(self.managed.clone(), namespace, ar),
            Scope::Cluster => Api::all_with(self.managed.clone(), ar),
        }
    }

    async fn meta_of(&self, m: &Value) -> Result<Meta, String> {
        let av = m.get("apiVersion").and_then(Value::as_str).ok_or("manifest without apiVersion")?;
        let kind = m.get("kind").and_then(Value::as_str).ok_or("manifest without kind")?;
        let name = m.pointer("/metadata/name").and_then(Value::as_str).ok_or("manifest without metadata.name")?;
        let (ar, caps) = self.resolve(av, kind).await.map_err(|e| format!("{av} {kind} is not served: {e}"))?;
        let namespace = if caps.scope == Scope::Namespaced { m.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("default") } else { "" };
        Ok(Meta { group: ar.group, version: ar.version, kind: ar.kind, resource: ar.plural, namespace: namespace.to_owned(), name: name.to_owned() })
    }

    /// Writes manifest `m` as `strategy` says. The outcome is the manifest's apply
    /// failure, if the API server refused the write (reported in the work's status); with
    /// it comes the live object as this pass left it (the write's answer, or the object
    /// read before it), which the status reports from.
    ///
    /// A successful write leaves the work's owner on the object when the work owns it, and
    /// takes it off when not (`own`): the Update strategy merges it into its write
    /// (`update_apply.go`), a create carries it, the others patch it on after the write
    /// (`server_side_apply.go` and `create_only_apply.go` call `ApplyOwnerReferences`, on
    /// an object that was already there too). A refused write (a server-side apply's
    /// conflict) adds nothing, and `ReadOnly` never touches the object.
    async fn write(&self, work: &str, m: &Value, meta: &Meta, strategy: Strategy, changed: bool, own: &Own<'_>) -> Result<Written, kube::Error> {
        let (ar, caps) = self.resolve(m["apiVersion"].as_str().unwrap_or(""), &meta.kind).await?;
        let api = self.api(&ar, &caps, &meta.namespace);
        let live = api.get_opt(&meta.name).await?;
        let key = (work.to_owned(), meta.clone());
        let required = m.to_string();
        let last = self.applied.lock().expect("applied lock").get(&key).cloned();
        // Nothing changed since this agent's last write: upstream skips the write.
        let untouched = live.as_ref().is_some_and(|l| last.as_ref().is_some_and(|(req, rv)| *req == required && l.metadata.resource_version.as_ref() == Some(rv)));
        let owners = |o: &DynamicObject| merge_owner(o.metadata.owner_references.as_deref().unwrap_or_default(), own.owner, own.owned);
        let written = match (&strategy, &live) {
            (Strategy::ReadOnly, _) => return Ok((Ok(()), live)),
            (Strategy::CreateOnly, Some(l)) => Ok(l.clone()),
            (Strategy::ServerSideApply { .. } | Strategy::Update, Some(l)) if untouched && !changed => Ok(l.clone()),
            (Strategy::ServerSideApply { manager, force }, _) => {
                let mut pp = PatchParams::apply(manager);
                pp.force = *force;
                api.patch(&meta.name, &pp, &Patch::Apply(m)).await
            }
            (Strategy::Update | Strategy::CreateOnly, None) => match serde_json::from_value::<DynamicObject>(m.clone()) {
                Ok(mut obj) => {
                    if own.owned {
                        obj.metadata.owner_references = Some(vec![own.owner.clone()]);
                    }
                    api.create(&PostParams::default(), &obj).await
                }
                Err(e) => return Ok((Err(Refusal::retried(format!("the manifest does not decode: {e}"))), live)),
            },
            (Strategy::Update, Some(l)) if same_as_live(m, l) && owners(l).is_none() => Ok(l.clone()),
            (Strategy::Update, Some(l)) => {
                let mut obj: DynamicObject = match serde_json::from_value(m.clone()) {
                    Ok(o) => o,
                    Err(e) => return Ok((Err(Refusal::retried(format!("the manifest does not decode: {e}"))), live)),
                };
                // resourcemerge: the live labels, annotations and owners merged with the
                // manifest's (the work's owner added or removed); finalizers kept; the rest
                // is the manifest.
                let mut labels = l.metadata.labels.clone().unwrap_or_default();
                labels.extend(obj.metadata.labels.take().unwrap_or_default());
                let mut annotations = l.metadata.annotations.clone().unwrap_or_default();
                annotations.extend(obj.metadata.annotations.take().unwrap_or_default());
                obj.metadata.labels = Some(labels);
                obj.metadata.annotations = Some(annotations);
                obj.metadata.owner_references = owners(l).or_else(|| l.metadata.owner_references.clone());
                obj.metadata.finalizers = l.metadata.finalizers.clone();
                obj.metadata.resource_version = l.metadata.resource_version.clone();
                api.replace(&meta.name, &PostParams::default(), &obj).await
            }
        };
        let obj = match written {
            Ok(obj) => obj,
            Err(kube::Error::Api(s)) => {
                // A server-side apply's conflict is not retried (`ServerSideApplyConflictError`).
                let retried = !(s.code == 409 && matches!(strategy, Strategy::ServerSideApply { .. }));
                return Ok((Err(Refusal { message: s.message, retried }), live));
            }
            Err(e) => return Err(e),
        };
        // A conflict (a controller wrote the object between our read and the owner patch)
        // is reported by upstream as the manifest's apply error and the work requeued at
        // once (the controller's rate-limited queue: milliseconds), so the next pass
        // mends it. The emulator's next pass is a tick away, which a loaded machine
        // stretches: re-read and patch again here instead, as that immediate requeue would.
        let mut current = obj;
        let mut attempts = 0;
        let obj = loop {
            match apply_owner(&api, current.clone(), own.owner, own.owned).await {
                Ok(o) => break o,
                Err(kube::Error::Api(s)) if s.code == 409 && attempts < 5 => {
                    attempts += 1;
                    match api.get_opt(&meta.name).await? {
                        Some(o) => current = o,
                        None => return Ok((Err(Refusal::retried(s.message)), Some(current))),
                    }
                }
                // Upstream reports it as the manifest's apply error.
                Err(kube::Error::Api(s)) => return Ok((Err(Refusal::retried(s.message)), Some(current))),
                Err(e) => return Err(e),
            }
        };
        let rv = obj.metadata.resource_version.clone().unwrap_or_default();
        self.applied.lock().expect("applied lock").insert(key, (required, rv));
        Ok((Ok(()), Some(obj)))
    }

    fn applied_api(&self) -> Api<DynamicObject> {
        Api::all_with(self.managed.clone(), &applied_works())
    }

    /// ocm `pkg/work/helper/helpers.go`, `DeleteAppliedResources`: deletes those of
    /// `resources` the work owns (they carry `owner`, `IsOwnedBy`) and returns those still
    /// being deleted. One without the owner is left alone: a manifest the work failed to
    /// apply (another field manager's conflict), one it orphaned, one someone else made.
    /// One another AppliedManifestWork also owns only loses `owner`; one whose UID is not
    /// the recorded one was made again and is forgotten. Deleted in the background, with
    /// the UID as precondition.
    async fn delete_applied(&self, resources: &[AppliedResource], owner: &OwnerReference) -> Result<Vec<AppliedResource>, kube::Error> {
        let mut pending = Vec::new();
        for r in resources {
            let api: Api<DynamicObject> = r.key().api(&self.managed);
            let Some(live) = api.get_opt(&r.name).await? else { continue };
            let owners = live.metadata.owner_references.clone().unwrap_or_default();
            if !owners.iter().any(|o| o.uid == owner.uid) {
                continue;
            }
            // `existOtherAppliedManifestWorkOwners`.
            if owners.iter().any(|o| o.api_version == owner.api_version && o.kind == owner.kind && o.uid != owner.uid) {
                apply_owner(&api, live, owner, false).await?;
                continue;
            }
            if live.metadata.uid.as_deref() != Some(r.uid.as_str()) {
                continue;
            }
            if live.metadata.deletion_timestamp.is_some() {
                pending.push(r.clone());
                continue;
            }
            let dp = DeleteParams {
                propagation_policy: Some(PropagationPolicy::Background),
                preconditions: Some(Preconditions { uid: Some(r.uid.clone()), resource_version: None }),
                ..DeleteParams::default()
            };
            match api.delete(&r.name, &dp).await {
                Ok(_) => pending.push(r.clone()),
                // Gone, or the UID precondition failed: forgotten.
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(pending)
    }

    /// ocm `pkg/work/spoke/controllers/finalizercontroller/appliedmanifestwork_finalize_controller.go`:
    /// an AppliedManifestWork being deleted deletes what its work owns
    /// ([`Self::delete_applied`]), records what is still going, and once nothing is, drops
    /// its finalizer.
    async fn finalize_applied(&self, amw: &DynamicObject) -> Result<(), kube::Error> {
        let finalizers = amw.metadata.finalizers.clone().unwrap_or_default();
        if amw.metadata.deletion_timestamp.is_none() || !finalizers.iter().any(|f| f == APPLIED_FINALIZER) {
            return Ok(());
        }
        let name = amw.metadata.name.clone().unwrap_or_default();
        let resources = applied_resources(amw);
        let pending = self.delete_applied(&resources, &applied_owner(amw)).await?;
        let api = self.applied_api();
        if pending != resources {
            // Upstream returns on a status update and goes on at the next event.
            let listed: Vec<Value> = pending.iter().map(AppliedResource::json).collect();
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&json!({"status": {"appliedResources": listed}}))).await?;
            return Ok(());
        }
        if !pending.is_empty() {
            // Nothing changed: upstream requeues through its rate limiter
            // (`NewTypedItemExponentialFailureRateLimiter(50ms, 60s)`).
            let mut finalizing = self.finalizing.lock().expect("finalizing lock");
            let tries = finalizing.entry(name).or_default();
            self.wake.after(Duration::from_millis(50).saturating_mul(1 << (*tries).min(11)).min(Duration::from_secs(60)));
            *tries += 1;
            return Ok(());
        }
        self.finalizing.lock().expect("finalizing lock").remove(&name);
        if let Some(patch) = finalizer_patch(&amw.metadata, APPLIED_FINALIZER, false) {
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        }
        Ok(())
    }

    /// The work's AppliedManifestWork (`manifestwork_controller.go`,
    /// `applyAppliedManifestWork`: `<hub hash>-<work>`, the work's labels, the finalizer),
    /// made when missing.
    async fn applied_work(&self, w: &DynamicObject) -> Result<DynamicObject, kube::Error> {
        let work = w.metadata.name.clone().unwrap_or_default();
        let name = format!("{}-{work}", self.hub_hash);
        let api = self.applied_api();
        if let Some(amw) = api.get_opt(&name).await? {
            return Ok(amw);
        }
        let mut amw = DynamicObject::new(&name, &applied_works()).data(json!({"spec": {"hubHash": self.hub_hash, "manifestWorkName": work, "agentID": self.cluster}}));
        amw.metadata.labels = w.metadata.labels.clone();
        amw.metadata.finalizers = Some(vec![APPLIED_FINALIZER.to_owned()]);
        api.create(&PostParams::default(), &amw).await
    }

    async fn tick(&self) -> Result<(), kube::Error> {
        if knob(&self.knobs, &self.cluster).stuck {
            return Ok(());
        }
        let api: Api<DynamicObject> = Api::namespaced_with(self.hub.clone(), &self.cluster, &works());
        let list = match api.list(&ListParams::default()).await {
            Ok(l) => l,
            // The cluster's namespace is not there yet.
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(e) => return Err(e),
        };
        // The apply and status clocks and the watches of works gone or going.
        let live = list.items.iter().filter(|w| w.metadata.deletion_timestamp.is_none()).filter_map(|w| w.metadata.name.clone()).collect();
        self.applies.retain(&live);
        self.status.retain(&live);
        if list.items.is_empty() {
            return Ok(());
        }
        let runs = match &self.klusterlet {
            Some(k) => k.agents_run().await,
            None => true,
        };
        if !runs {
            // Its operator starts the agent once the klusterlet has joined: look again soon.
            self.wake.after(AGENT_START);
            return Ok(());
        }
        for w in list.items {
            let name = w.metadata.name.clone().unwrap_or_default();
            if let Err(e) = self.reconcile(&api, w).await {
                // Upstream's queue retries a failed work within milliseconds.
                self.applies.again(&name);
                self.wake.after(crate::wake::RETRY);
                tracing::debug!(cluster = %self.cluster, work = %name, error = %e, "work agent: retrying");
            }
        }
        Ok(())
    }

    async fn reconcile(&self, api: &Api<DynamicObject>, w: DynamicObject) -> Result<(), kube::Error> {
        let name = w.metadata.name.clone().unwrap_or_default();
        let finalizers = w.metadata.finalizers.clone().unwrap_or_default();
        if w.metadata.deletion_timestamp.is_some() {
            if !finalizers.iter().any(|f| f == WORK_FINALIZER) {
                return Ok(());
            }
            // ocm `pkg/work/spoke/controllers/finalizercontroller/manifestwork_finalize_controller.go`:
            // the work is marked Deleting and its AppliedManifestWork deleted; that one's
            // finalize controller ([`Self::finalize_applied`]) deletes what the work owns,
            // and once it is gone the work's finalizer goes. What the work does not own (its
            // delete option orphaned it, or it never applied it) stays.
            let amws = self.applied_api();
            match amws.get_opt(&format!("{}-{name}", self.hub_hash)).await? {
                Some(amw) if amw.metadata.deletion_timestamp.is_none() => {
                    let mut conds = w.data.pointer("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
                    if !conds.iter().any(|c| c["type"] == "Deleting" && c["status"] == "True") {
                        conds.retain(|c| c["type"] != "Deleting");
                        conds.push(condition("Deleting", true, "WorkDeleting", "ManifestWork is being deleted", w.metadata.generation.unwrap_or(0)));
                        let patch = json!({"status": {"conditions": conds}, "metadata": {"resourceVersion": w.metadata.resource_version}});
                        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
                    }
                    crate::emulate::absent(amws.delete(amw.metadata.name.as_deref().unwrap_or_default(), &DeleteParams::default()).await)?;
                }
                Some(amw) => self.finalize_applied(&amw).await?,
                None => {
                    if let Some(patch) = finalizer_patch(&w.metadata, WORK_FINALIZER, false) {
                        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
                    }
                }
            }
            return Ok(());
        }
        if let Some(patch) = finalizer_patch(&w.metadata, WORK_FINALIZER, true) {
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
            return Ok(());
        }
        let generation = w.metadata.generation.unwrap_or(0);
        let k = knob(&self.knobs, &self.cluster);
        let uid = w.metadata.uid.clone().unwrap_or_default();
        let key = (uid.clone(), generation);
        let seen = *self.first_seen.lock().expect("seen lock").entry(key.clone()).or_insert_with(std::time::Instant::now);
        if self.wake.waiting(k.apply_delay, seen.elapsed()) {
            return Ok(());
        }
        let spec = WorkSpec { uid, generation, labels: w.metadata.labels.clone().unwrap_or_default() };
        if k.fail_apply {
            let mut conds = json!([condition("Applied", false, "AppliedManifestWorkFailed", "Failed to apply manifest work: injected failure (emulated work agent)", generation)]);
            keep_times(w.data.pointer("/status/conditions"), &mut conds);
            if w.data.pointer("/status/conditions") != Some(&conds) {
                let patch = json!({"status": {"conditions": conds}, "metadata": {"resourceVersion": w.metadata.resource_version}});
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
            }
            // An injected failure is no pass: the work is applied once the knob goes.
            self.applies.again(&name);
            return Ok(());
        }
        let manifests: Vec<Value> = w.data.pointer("/spec/workload/manifests").and_then(Value::as_array).cloned().unwrap_or_default();
        let configs: Vec<Value> = w.data.pointer("/spec/manifestConfigs").and_then(Value::as_array).cloned().unwrap_or_default();
        let resync = k.apply_resync_interval.unwrap_or(crate::work_apply_sync::RESYNC_INTERVAL);
        // Per manifest: where it lives, the write's outcome (or the last pass's), the live
        // object after it.
        let results = if self.applies.due(&name, &spec, resync) {
            // A spec this agent has not applied yet (or not since it started) is written
            // even where the live object is as this agent left it.
            let fresh = !self.applies.has_pass(&name, &spec);
            let Some(results) = self.apply(&w, &manifests, &configs, fresh, &spec, resync).await? else {
                return Ok(());
            };
            // Two controllers write a work's status upstream, each on its own pass: the
            // apply controller (ocm `pkg/work/spoke/controllers/manifestcontroller/
            // manifestwork_controller.go`, `sync`: `PatchStatus` after every pass, a patch
            // only where the status changed) only Applied, per manifest and for the work,
            // merged into the status as it was (`pkg/work/helper/helpers.go`,
            // `MergeManifestConditions`: a manifest keeps its statusFeedbacks and its other
            // conditions, Available and StatusFeedbackSynced of the older generation among
            // them); the available-status controller (`statuscontroller/
            // availablestatus_controller.go`) availability and feedback later: here, the
            // next pass, as the apply controller's write is a change of the work. So a
            // reader sees Applied at a new generation, or a manifest's new outcome at a
            // resync, beside the feedback read before, as on a real cluster.
            if self.write_applied(api, &w, &results, generation).await.inspect_err(|_| self.applies.again(&name))? {
                self.applied_at.lock().expect("applied lock").entry(key).or_insert_with(std::time::Instant::now);
                return Ok(());
            }
            Some(results)
        } else {
            None
        };
        let applied_at = self.applied_at.lock().expect("applied lock").get(&key).copied();
        if applied_at.is_some_and(|at| self.wake.waiting(k.status_delay, at.elapsed())) {
            return Ok(());
        }
        // The status controller's pass: on the work's changes, its sync interval and its
        // watched resources' changes only ([`crate::work_status_sync`]).
        if !self.status.due(&name, w.metadata.resource_version.as_deref().unwrap_or_default()) {
            return Ok(());
        }
        let results = match results {
            Some(r) => r,
            // It reads each resource itself (upstream's `objectreader`: a GET, or its
            // informer's cache for a watched one), beside the last apply's outcomes.
            None => self.read(&name, &spec, &manifests).await.inspect_err(|_| self.status.again(&name))?,
        };
        let mut statuses = Vec::new();
        let mut all_available = true;
        for (i, (meta, (r, live))) in results.iter().enumerate() {
            let Some(meta) = meta else {
                all_available = false;
                continue;
            };
            all_available &= live.is_some();
            let mut conds = vec![
                manifest_applied(r, generation),
                condition("Available", live.is_some(), if live.is_some() { "ResourceAvailable" } else { "ResourceNotAvailable" }, if live.is_some() { "Resource is available" } else { "Resource is not available" }, generation),
            ];
            let mut entry = json!({"resourceMeta": meta.json(i)});
            if let Some(obj) = live {
                // `RegisterInformer` or `UnRegisterInformer`, after a successful read.
                let config = config_for(&configs, meta);
                self.status.register(&name, &meta.key(), config.and_then(|c| c.get("feedbackScrapeType")).and_then(Value::as_str) == Some("Watch"));
                let (values, synced) = feedback(config, &meta.group, &meta.kind, &serde_json::to_value(obj).unwrap_or_default(), generation);
                conds.push(synced);
                if !values.is_empty() {
                    entry["statusFeedback"] = json!({"values": values});
                }
            }
            let old = old_manifest(&w, meta);
            let mut conds = Value::Array(conds);
            keep_times(old.and_then(|o| o.get("conditions")), &mut conds);
            entry["conditions"] = conds;
            statuses.push(entry);
        }
        let mut conds = json!([
            work_applied(&results, generation),
            condition("Available", all_available, if all_available { "ResourcesAvailable" } else { "ResourcesNotAvailable" },
                if all_available { "All resources are available" } else { "Some resources are not available" }, generation),
        ]);
        keep_times(w.data.pointer("/status/conditions"), &mut conds);
        let status = json!({"conditions": conds, "resourceStatus": {"manifests": statuses}});
        // Its own write is not a change to sync again on (upstream's informer requeues the
        // work on it, and its pass finds nothing new unless a resource changed meanwhile:
        // here that waits for the next sync).
        let written = write_status(api, &w, status).await.inspect_err(|_| self.status.again(&name))?;
        self.status.synced(&name, &written, k.status_sync_interval.unwrap_or(crate::work_status_sync::STATUS_SYNC_INTERVAL));
        Ok(())
    }

    /// The apply controller's pass over work `w` (ocm `manifestwork_controller.go`, `sync`,
    /// and its two reconcilers): its AppliedManifestWork, each manifest written in
    /// upstream's kind order ([`crate::work_apply_sync::kind_order`]), what an earlier
    /// version listed and this one does not deleted, and the pass recorded on the apply
    /// clock. None: the work waits for the AppliedManifestWork of an earlier work of its
    /// name to go (upstream would apply against it).
    async fn apply(&self, w: &DynamicObject, manifests: &[Value], configs: &[Value], changed: bool, spec: &WorkSpec, resync: Duration) -> Result<Option<Vec<(Option<Meta>, Written)>>, kube::Error> {
        let name = w.metadata.name.clone().unwrap_or_default();
        let amw = self.applied_work(w).await?;
        if amw.metadata.deletion_timestamp.is_some() {
            self.finalize_applied(&amw).await?;
            return Ok(None);
        }
        let owner = applied_owner(&amw);
        let delete_option = w.data.pointer("/spec/deleteOption");
        let mut order: Vec<usize> = (0..manifests.len()).collect();
        order.sort_by_key(|i| crate::work_apply_sync::kind_order(manifests[*i].get("kind").and_then(Value::as_str)));
        let mut results: Vec<(Option<Meta>, Written)> = vec![(None, (Ok(()), None)); manifests.len()];
        for i in order {
            let m = &manifests[i];
            let meta = match self.meta_of(m).await {
                Ok(meta) => meta,
                Err(e) => {
                    results[i] = (None, (Err(Refusal::retried(e)), None));
                    continue;
                }
            };
            let own = Own { owner: &owner, owned: owned_by_the_work(&meta, delete_option) };
            let written = self.write(&spec.uid, m, &meta, strategy(config_for(configs, &meta)), changed, &own).await?;
            results[i] = (Some(meta), written);
        }
        // ocm `pkg/work/spoke/controllers/manifestcontroller/appliedmanifestwork_reconciler.go`
        // (once the work has an Applied condition, which this pass gives it when it has
        // manifests): every manifest that exists is recorded with its UID, applied or not;
        // those an earlier version listed and this one does not are deleted if the work
        // owns them (`FindUntrackedResources`, `DeleteAppliedResources`), their feedback
        // watches unregistered (`UnRegisterInformerFromAppliedManifestWork`), and they stay
        // recorded while they are going, the work requeued on the rate limiter.
        let has_applied = w.data.pointer("/status/conditions").and_then(Value::as_array).into_iter().flatten().any(|c| c["type"] == "Applied");
        let mut pending = false;
        if !manifests.is_empty() || has_applied {
            let mut now: Vec<AppliedResource> = results
                .iter()
                .filter_map(|(meta, (_, live))| {
                    let (meta, live) = (meta.as_ref()?, live.as_ref()?);
                    Some(AppliedResource {
                        group: meta.group.clone(),
                        version: meta.version.clone(),
                        resource: meta.resource.clone(),
                        namespace: meta.namespace.clone(),
                        name: meta.name.clone(),
                        uid: live.metadata.uid.clone().unwrap_or_default(),
                    })
                })
                .collect();
            let before = applied_resources(&amw);
            let untracked: Vec<AppliedResource> = before.iter().filter(|o| !now.iter().any(|n| n.id() == o.id())).cloned().collect();
            for r in &untracked {
                self.status.register(&name, &r.key(), false);
            }
            let going = self.delete_applied(&untracked, &owner).await?;
            pending = !going.is_empty();
            now.extend(going);
            now.sort();
            if now != before {
                let listed: Vec<Value> = now.iter().map(AppliedResource::json).collect();
                self.applied_api()
                    .patch_status(amw.metadata.name.as_deref().unwrap_or_default(), &PatchParams::default(), &Patch::Merge(&json!({"status": {"appliedResources": listed}})))
                    .await?;
            }
        }
        self.applies.passed(&name, spec, results.iter().map(|(_, (r, _))| r.clone()).collect(), pending, resync);
        Ok(Some(results))
    }

    /// The status controller's reads of work `name`'s resources between apply passes: each
    /// manifest's live object (None when missing), beside its outcome at the last apply
    /// pass.
    async fn read(&self, name: &str, spec: &WorkSpec, manifests: &[Value]) -> Result<Vec<(Option<Meta>, Written)>, kube::Error> {
        let outcomes = self.applies.outcomes(name, spec).unwrap_or_default();
        let mut results = Vec::with_capacity(manifests.len());
        for (i, m) in manifests.iter().enumerate() {
            let outcome = outcomes.get(i).cloned().unwrap_or(Ok(()));
            let Ok(meta) = self.meta_of(m).await else {
                results.push((None, (outcome, None)));
                continue;
            };
            let live = meta.key().api::<DynamicObject>(&self.managed).get_opt(&meta.name).await?;
            results.push((Some(meta), (outcome, live)));
        }
        Ok(results)
    }

    /// The apply controller's status write (see [`Self::reconcile`]): each manifest's
    /// Applied condition and the work's, merged into the status as it is; true when that
    /// changed the status (and it was written).
    async fn write_applied(&self, api: &Api<DynamicObject>, w: &DynamicObject, results: &[(Option<Meta>, Written)], generation: i64) -> Result<bool, kube::Error> {
        let mut statuses = Vec::new();
        for (i, (meta, (r, _))) in results.iter().enumerate() {
            let Some(meta) = meta else { continue };
            let old = old_manifest(w, meta);
            let mut entry = json!({"resourceMeta": meta.json(i), "conditions": merged(old.and_then(|o| o.get("conditions")), manifest_applied(r, generation))});
            if let Some(feedback) = old.and_then(|o| o.get("statusFeedback")) {
                entry["statusFeedback"] = feedback.clone();
            }
            statuses.push(entry);
        }
        let status = json!({"conditions": merged(w.data.pointer("/status/conditions"), work_applied(results, generation)), "resourceStatus": {"manifests": statuses}});
        // `write_status` skips an unchanged status and then answers the work's own version.
        write_status(api, w, status).await.map(|rv| w.metadata.resource_version.as_deref() != Some(rv.as_str()))
    }
}

/// A manifest's Applied condition after its write `r`.
fn manifest_applied(r: &Outcome, generation: i64) -> Value {
    condition("Applied", r.is_ok(), if r.is_ok() { "AppliedManifestComplete" } else { "AppliedManifestFailed" }, r.as_ref().err().map_or("Apply manifest complete", |e| e.message.as_str()), generation)
}

/// The work's Applied condition after the writes of its manifests.
fn work_applied(results: &[(Option<Meta>, Written)], generation: i64) -> Value {
    let failed: Vec<String> = results.iter().filter_map(|(_, (r, _))| Some(r.as_ref().err()?.message.clone())).collect();
    let ok = failed.is_empty();
    condition("Applied", ok, if ok { "AppliedManifestWorkComplete" } else { "AppliedManifestWorkFailed" },
        &if ok { "Apply manifest work complete".to_owned() } else { format!("Failed to apply manifest work: {}", failed.join("; ")) }, generation)
}

/// The status entry `w` holds for the manifest at `meta`, if any.
fn old_manifest<'a>(w: &'a DynamicObject, meta: &Meta) -> Option<&'a Value> {
    w.data.pointer("/status/resourceStatus/manifests").and_then(Value::as_array).and_then(|ms| ms.iter().find(|m| Meta::from_status(&m["resourceMeta"]).as_ref() == Some(meta)))
}

/// Writes `status` as `w`'s when it differs from what `w` has; the work's resourceVersion
/// after.
async fn write_status(api: &Api<DynamicObject>, w: &DynamicObject, status: Value) -> Result<String, kube::Error> {
    if w.data.get("status") == Some(&status) {
        return Ok(w.metadata.resource_version.clone().unwrap_or_default());
    }
    let name = w.metadata.name.clone().unwrap_or_default();
    let patch = json!({"status": status, "metadata": {"resourceVersion": w.metadata.resource_version}});
    Ok(api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?.metadata.resource_version.unwrap_or_default())
}

/// `old` conditions with `new` in place of the one of its type, its transition time kept
/// when its status did not change; one of an older generation is removed and `new` goes
/// last (ocm `pkg/work/helper/helpers.go`, `MergeStatusConditions`: `RemoveStatusCondition`
/// on a new observedGeneration, then `meta.SetStatusCondition`).
fn merged(old: Option<&Value>, new: Value) -> Value {
    let mut conds: Vec<Value> = old.and_then(Value::as_array).cloned().unwrap_or_default();
    match conds.iter_mut().find(|c| c["type"] == new["type"]) {
        Some(c) if c["observedGeneration"] == new["observedGeneration"] => *c = new,
        _ => {
            conds.retain(|c| c["type"] != new["type"]);
            conds.push(new);
        }
    }
    let mut conds = Value::Array(conds);
    keep_times(old, &mut conds);
    conds
}

fn config_for<'a>(configs: &'a [Value], meta: &Meta) -> Option<&'a Value> {
    configs.iter().find(|c| {
        let id = &c["resourceIdentifier"];
        let s = |k: &str| id.get(k).and_then(Value::as_str).unwrap_or("");
        s("group") == meta.group && s("resource") == meta.resource && s("name") == meta.name && s("namespace") == meta.namespace
    })
}

/// Evaluates a feedback JSON path: `.a.b[0].c`, a backslash escaping the next character
/// of a key as upstream's parser does (`k8s.io/client-go/util/jsonpath`, `parseField`:
/// `.metadata.annotations.ferry\.io/task`; ocm `pkg/work/spoke/statusfeedback/reader.go`
/// evaluates each path with it), and a filter `[?(@.field=="value")]` keeping the items of
/// a list whose field equals the string, of which the reader takes the first
/// (`getValueByJsonPath`: `results[0][0]`), as the well-known Job and Pod rules use it.
pub fn json_path<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    let mut segs = Vec::new();
    let mut seg = String::new();
    let mut chars = path.chars();
    let mut depth = 0usize;
    while let Some(c) = chars.next() {
        match c {
            '\\' => seg.extend(chars.next()),
            '.' if depth == 0 => segs.push(std::mem::take(&mut seg)),
            c => {
                match c {
                    '[' => depth += 1,
                    ']' => depth = depth.saturating_sub(1),
                    _ => {}
                }
                seg.push(c);
            }
        }
    }
    segs.push(seg);
    let mut cur = obj;
    for seg in segs.iter().map(String::as_str).filter(|s| !s.is_empty()) {
        let (field, rest) = seg.split_once('[').map_or((seg, None), |(f, r)| (f, Some(r)));
        if !field.is_empty() {
            cur = cur.get(field)?;
        }
        if let Some(r) = rest {
            for idx in r.split('[') {
                let idx = idx.trim_end_matches(']');
                cur = match filter(idx) {
                    Some((field, want)) => cur.as_array()?.iter().find(|item| item.get(field).and_then(Value::as_str) == Some(want))?,
                    None => cur.get(idx.parse::<usize>().ok()?)?,
                };
            }
        }
    }
    Some(cur)
}

/// `?(@.field=="value")` as (field, value).
fn filter(idx: &str) -> Option<(&str, &str)> {
    let inner = idx.strip_prefix("?(@.")?.strip_suffix(')')?;
    let (field, value) = inner.split_once("==")?;
    Some((field, value.trim_matches('"')))
}

/// The well-known status paths of a kind, by group and kind as upstream keys them
/// (ocm `pkg/work/spoke/statusfeedback/rules/rule.go`, `DefaultWellKnownStatusRule`:
/// apps Deployment and DaemonSet, batch Job, core Pod; no other kind has any).
fn well_known(group: &str, kind: &str) -> Option<&'static [(&'static str, &'static str)]> {
    match (group, kind) {
        ("apps", "Deployment") => Some(&[("ReadyReplicas", ".status.readyReplicas"), ("Replicas", ".status.replicas"), ("AvailableReplicas", ".status.availableReplicas")]),
        ("apps", "DaemonSet") => Some(&[("NumberReady", ".status.numberReady"), ("DesiredNumberScheduled", ".status.desiredNumberScheduled"), ("NumberAvailable", ".status.numberAvailable")]),
        ("batch", "Job") => Some(&[("JobComplete", r#".status.conditions[?(@.type=="Complete")].status"#), ("JobSucceeded", ".status.succeeded")]),
        ("", "Pod") => Some(&[("PodReady", r#".status.conditions[?(@.type=="Ready")].status"#), ("PodPhase", ".status.phase")]),
        _ => None,
    }
}

fn field_value(v: &Value) -> Value {
    match v {
        Value::Number(n) if n.is_i64() => json!({"type": "Integer", "integer": n.as_i64()}),
        Value::String(s) => json!({"type": "String", "string": s}),
        Value::Bool(b) => json!({"type": "Boolean", "boolean": b}),
        other => json!({"type": "JsonRaw", "jsonRaw": other.to_string()}),
    }
}

/// The status feedback values of `obj` (of API group `group`) under the rules of one
/// manifest config, and the `StatusFeedbackSynced` condition upstream's status controller
/// gives them (ocm `pkg/work/spoke/controllers/statuscontroller/availablestatus_controller.go`,
/// `getFeedbackValues`: no rules, `NoStatusFeedbackSynced`; a rule that fails, e.g.
/// WellKnownStatus on a kind without well-known paths (`reader.go`, `GetValuesByRule`),
/// `False`/`StatusFeedbackSyncFailed` with the error, the other values still reported).
pub fn feedback(config: Option<&Value>, group: &str, kind: &str, obj: &Value, generation: i64) -> (Vec<Value>, Value) {
    let rules: Vec<&Value> = config.and_then(|c| c.get("feedbackRules")).and_then(Value::as_array).into_iter().flatten().collect();
    if rules.is_empty() {
        return (Vec::new(), condition("StatusFeedbackSynced", true, "NoStatusFeedbackSynced", "", generation));
    }
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for rule in rules {
        let paths: Vec<(String, String)> = match rule.get("type").and_then(Value::as_str) {
            Some("WellKnownStatus") => match well_known(group, kind) {
                Some(paths) => paths.iter().map(|(n, p)| ((*n).to_owned(), (*p).to_owned())).collect(),
                None => {
                    let version = obj.get("apiVersion").and_then(Value::as_str).and_then(|v| v.rsplit('/').next()).unwrap_or("v1");
                    errors.push(format!("cannot find the wellknown statuses for resource with gvk {}{version}, Kind={kind}", if group.is_empty() { String::new() } else { format!("{group}/") }));
                    Vec::new()
                }
            },
            Some("JSONPaths") => rule
                .get("jsonPaths")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|p| Some((p.get("name")?.as_str()?.to_owned(), p.get("path")?.as_str()?.to_owned())))
                .collect(),
            _ => Vec::new(),
        };
        for (name, path) in paths {
            if let Some(v) = json_path(obj, &path).filter(|v| !v.is_null()) {
                out.push(json!({"name": name, "fieldValue": field_value(v)}));
            }
        }
    }
    let synced = if errors.is_empty() {
        condition("StatusFeedbackSynced", true, "StatusFeedbackSynced", "", generation)
    } else {
        condition("StatusFeedbackSynced", false, "StatusFeedbackSyncFailed", &format!("Sync status feedback failed with error [{}]", errors.join(", ")), generation)
    };
    (out, synced)
}

// ---------------------------------------------------------------------------------------
// placement

fn matches_selector(labels: &BTreeMap<String, String>, sel: &Value) -> bool {
    let ml = sel.get("matchLabels").and_then(Value::as_object).into_iter().flatten().all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str());
    let me = sel.get("matchExpressions").and_then(Value::as_array).into_iter().flatten().all(|e| {
        let key = e["key"].as_str().unwrap_or("");
        let values: Vec<&str> = e["values"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        match e["operator"].as_str().unwrap_or("") {
            "In" => labels.get(key).is_some_and(|v| values.contains(&v.as_str())),
            "NotIn" => labels.get(key).is_none_or(|v| !values.contains(&v.as_str())),
            "Exists" => labels.contains_key(key),
            "DoesNotExist" => !labels.contains_key(key),
            _ => false,
        }
    });
    ml && me
}

/// The AddOn score of a cluster: the item of a valid (not expired) AddOnPlacementScore, else 0.
fn addon_score(scores: &[DynamicObject], cluster: &str, resource: &str, item: &str) -> i64 {
    let now = k8s_openapi::jiff::Timestamp::now();
    scores
        .iter()
        .find(|s| s.metadata.namespace.as_deref() == Some(cluster) && s.metadata.name.as_deref() == Some(resource))
        .filter(|s| {
            s.data.pointer("/status/validUntil").and_then(Value::as_str).and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok()).is_none_or(|t| t > now)
        })
        .and_then(|s| s.data.pointer("/status/scores")?.as_array()?.iter().find(|i| i["name"] == item)?.get("value")?.as_i64())
        .unwrap_or(0)
}

/// One pass of the placement scheduler over every Placement; it asks `wake` for the time a
/// toleration a decided cluster is selected by runs out (upstream's `RequeueAfter`).
async fn placement(hub: kube::Client, wake: Arc<Wake>) -> Result<(), kube::Error> {
    let pls: Api<DynamicObject> = Api::all_with(hub.clone(), &placements());
    let all = pls.list(&ListParams::default()).await?.items;
    if all.is_empty() {
        return Ok(());
    }
    let clusters = Api::<DynamicObject>::all_with(hub.clone(), &managed_clusters()).list(&ListParams::default()).await?.items;
    let binds = Api::<DynamicObject>::all_with(hub.clone(), &bindings()).list(&ListParams::default()).await?.items;
    // Each set's members as upstream's scheduler resolves them, by the set's label or its
    // label selector (`global`: every cluster) (ocm `pkg/placement/controllers/scheduling/helpers.go`,
    // `GetAvailableClusters`; sdk-go `pkg/apis/cluster/v1beta2/managedclusterset.go`, `BuildClusterSelector`).
    let known_sets: BTreeMap<String, Result<ClusterSet, ClusterSetError>> =
        Api::<ManagedClusterSet>::all(hub.clone()).list(&ListParams::default()).await?.items.iter().filter_map(|s| Some((s.metadata.name.clone()?, ClusterSet::of(s)))).collect();
    let scs = Api::<DynamicObject>::all_with(hub.clone(), &scores()).list(&ListParams::default()).await?.items;
    let decided: Vec<Decision> = Api::<DynamicObject>::all_with(hub.clone(), &decisions())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|d| Decision {
            namespace: d.metadata.namespace.clone().unwrap_or_default(),
            placement: d.metadata.labels.as_ref().and_then(|l| l.get(PLACEMENT_LABEL)).cloned().unwrap_or_default(),
            clusters: d.data.pointer("/status/decisions").and_then(Value::as_array).into_iter().flatten().filter_map(|x| x["clusterName"].as_str().map(str::to_owned)).collect(),
        })
        .collect();
    for p in all {
        let (Some(ns), Some(name)) = (p.metadata.namespace.clone(), p.metadata.name.clone()) else { continue };
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let spec = p.data.get("spec").cloned().unwrap_or(Value::Null);
        // Valid bindings only: those of sets that exist (`GetValidManagedClusterSetBindings`).
        let bound: BTreeSet<String> =
            binds.iter().filter(|b| b.metadata.namespace.as_deref() == Some(&ns)).filter_map(|b| b.metadata.name.clone()).filter(|s| known_sets.contains_key(s)).collect();
        let wanted_sets: Vec<String> = spec.get("clusterSets").and_then(Value::as_array).into_iter().flatten().filter_map(|s| s.as_str().map(str::to_owned)).collect();
        let sets: BTreeSet<String> = if wanted_sets.is_empty() { bound.clone() } else { wanted_sets.iter().filter(|s| bound.contains(*s)).cloned().collect() };
        // A set upstream builds no selector for fails the Placement's sync: no decision.
        let Ok(resolved) = sets.iter().filter_map(|s| known_sets.get(s)).map(Result::as_ref).collect::<Result<Vec<&ClusterSet>, _>>() else { continue };
        let mut available = 0;
        let predicates: Vec<Value> = spec.get("predicates").and_then(Value::as_array).cloned().unwrap_or_default();
        let tolerations: Vec<Value> = spec.get("tolerations").and_then(Value::as_array).cloned().unwrap_or_default();
        let mut feasible: Vec<String> = Vec::new();
        let now = k8s_openapi::jiff::Timestamp::now();
        let decided_here: BTreeSet<&str> = decided.iter().filter(|d| d.namespace == ns && d.placement == name).flat_map(|d| d.clusters.iter().map(String::as_str)).collect();
        for mc in &clusters {
            let Some(cname) = mc.metadata.name.clone() else { continue };
            let labels = mc.metadata.labels.clone().unwrap_or_default();
            let in_set = mc.metadata.deletion_timestamp.is_none() && resolved.iter().any(|s| s.selects(&labels));
            available += usize::from(in_set);
            // Availability counts through the taints the hub's taint controller keeps
            // (crate::ocm_taints): a Placement may tolerate an unreachable cluster.
            let tolerated = crate::ocm_taints::tolerated(&mc.data, &tolerations, decided_here.contains(cname.as_str()), now);
            let selected = predicates.is_empty()
                || predicates.iter().any(|pr| pr.pointer("/requiredClusterSelector/labelSelector").is_none_or(|sel| matches_selector(&labels, sel)));
            if in_set && tolerated && selected {
                feasible.push(cname);
            }
        }
        // Ranked as upstream's scheduler ranks (Additive keeps Balance and Steady).
        // A cluster's allocatable as its klusterlet reports it (with its capacity).
        let allocatable = |c: &str, resource: &str| {
            let mc = clusters.iter().find(|m| m.metadata.name.as_deref() == Some(c))?;
            let q = |what: &str| mc.data.pointer(&format!("/status/{what}/{resource}")).and_then(Value::as_str).and_then(|q| ferry_kube::quantity::parse(q).ok());
            q("capacity")?;
            q("allocatable")
        };
        let ranked = match crate::ocm_taints::misconfigured(&tolerations) {
            Some(why) => Err(why),
            None => ocm_prioritizers::rank(&spec, &ns, &name, &feasible, &decided, |c, res, item| addon_score(&scs, c, res, item), allocatable).map_err(|e| e.to_string()),
        };
        let candidates = match ranked {
            Ok(c) => c,
            Err(e) => {
                let mut conds = json!([condition("PlacementMisconfigured", true, "Misconfigured", &format!(":{e}"), p.metadata.generation.unwrap_or(0))]);
                keep_times(p.data.pointer("/status/conditions"), &mut conds);
                if p.data.pointer("/status/conditions") != Some(&conds) {
                    Api::<DynamicObject>::namespaced_with(hub.clone(), &ns, &placements())
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&json!({"status": {"conditions": conds}})))
                        .await?;
                }
                continue;
            }
        };
        let want = spec.get("numberOfClusters").and_then(Value::as_i64).map(|n| n.max(0) as usize);
        let mut chosen: Vec<String> = candidates.iter().take(want.unwrap_or(usize::MAX)).map(|(_, c)| c.clone()).collect();
        // The ranking picks the clusters; the decision lists them by name, as upstream's
        // `divideDecisionGroups` sorts a group before writing it (`scheduling_controller.go`).
        chosen.sort();
        // `TaintToleration.RequeueAfter` over the decided clusters: looked at again when a
        // toleration one of them is selected by runs out.
        for c in clusters.iter().filter(|m| m.metadata.name.as_ref().is_some_and(|n| chosen.contains(n))) {
            if let Some(until) = crate::ocm_taints::requeue_at(&c.data, &tolerations, now) {
                wake.at(until);
            }
        }
        write_decision(&hub, &p, &ns, &name, &chosen).await?;
        // As upstream's `newSatisfiedCondition` (`scheduling_controller.go`) says it.
        let (ok, reason, message) = if bound.is_empty() {
            (false, "NoManagedClusterSetBindings", "No valid ManagedClusterSetBindings found in placement namespace".to_owned())
        } else if sets.is_empty() {
            (false, "NoIntersection", format!("None of ManagedClusterSets [{}] is bound to placement namespace", wanted_sets.join(",")))
        } else if available == 0 {
            (false, "AllManagedClusterSetsEmpty", format!("All ManagedClusterSets [{}] have no member ManagedCluster", sets.iter().cloned().collect::<Vec<_>>().join(",")))
        } else if want.is_none_or(|w| chosen.len() >= w) {
            (true, "AllDecisionsScheduled", "All cluster decisions scheduled".to_owned())
        } else {
            (false, "NotAllDecisionsScheduled", format!("{} cluster decisions unscheduled", want.unwrap_or(0) - chosen.len()))
        };
        let generation = p.metadata.generation.unwrap_or(0);
        let mut conds = json!([
            condition("PlacementMisconfigured", false, "Succeedconfigured", "Placement configurations check pass", generation),
            condition("PlacementSatisfied", ok, reason, &message, generation)
        ]);
        keep_times(p.data.pointer("/status/conditions"), &mut conds);
        let status = json!({"numberOfSelectedClusters": chosen.len(), "conditions": conds});
        if p.data.get("status") != Some(&status) {
            Api::<DynamicObject>::namespaced_with(hub.clone(), &ns, &placements())
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&json!({"status": status})))
                .await?;
        }
    }
    Ok(())
}

async fn write_decision(hub: &kube::Client, p: &DynamicObject, ns: &str, name: &str, chosen: &[String]) -> Result<(), kube::Error> {
    let api: Api<DynamicObject> = Api::namespaced_with(hub.clone(), ns, &decisions());
    let dname = format!("{name}-decision-1");
    let decisions: Vec<Value> = chosen.iter().map(|c| json!({"clusterName": c, "reason": ""})).collect();
    let existing = api.get_opt(&dname).await?;
    if existing.as_ref().and_then(|d| d.data.pointer("/status/decisions")) == Some(&Value::Array(decisions.clone())) {
        return Ok(());
    }
    if existing.is_none() {
        let obj = json!({
            "apiVersion": "cluster.open-cluster-management.io/v1beta1", "kind": "PlacementDecision",
            "metadata": {"name": dname, "namespace": ns,
                "labels": {PLACEMENT_LABEL: name, "cluster.open-cluster-management.io/decision-group-index": "0", "cluster.open-cluster-management.io/decision-group-name": ""},
                "ownerReferences": [{"apiVersion": "cluster.open-cluster-management.io/v1beta1", "kind": "Placement", "name": name,
                    "uid": p.metadata.uid, "controller": true, "blockOwnerDeletion": true}]},
        });
        api.patch(&dname, &PatchParams::apply(MANAGER), &Patch::Apply(&obj)).await?;
    }
    api.patch_status(&dname, &PatchParams::default(), &Patch::Merge(&json!({"status": {"decisions": decisions}}))).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_update_strategy_judges_sameness_as_upstreams_appliers() {
        let live = |v: Value| serde_json::from_value::<DynamicObject>(v).unwrap();
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "r", "namespace": "b"}});
        // A result written into the data is a difference: Update rewrites (erases) it.
        let written = live(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "r", "namespace": "b", "resourceVersion": "7"}, "data": {"result": "10"}}));
        assert!(!same_as_live(&cm, &written));
        assert!(same_as_live(&cm, &live(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "r", "namespace": "b", "labels": {"x": "y"}}}))));
        // A ServiceAccount is judged by its metadata: the token controller's secrets are not a difference.
        let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "s", "namespace": "b"}});
        assert!(same_as_live(&sa, &live(json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "s", "namespace": "b"}, "secrets": [{"name": "s-token-x"}]}))));
        // A label the manifest names and the live object lacks is a difference.
        let labelled = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "s", "namespace": "b", "labels": {"a": "1"}}});
        assert!(!same_as_live(&labelled, &live(json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "s", "namespace": "b"}}))));
        // Other kinds: everything but metadata and status, so a defaulted Job template differs.
        let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "b"}, "spec": {"template": {"spec": {"restartPolicy": "Never"}}}});
        let defaulted = live(json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "b"},
            "spec": {"backoffLimit": 6, "template": {"spec": {"restartPolicy": "Never"}}}, "status": {"succeeded": 1}}));
        assert!(!same_as_live(&job, &defaulted));
        assert_eq!(strategy(None), Strategy::Update);
        assert_eq!(strategy(Some(&json!({"updateStrategy": {"type": "CreateOnly"}}))), Strategy::CreateOnly);
        assert_eq!(
            strategy(Some(&json!({"updateStrategy": {"type": "ServerSideApply"}}))),
            Strategy::ServerSideApply { manager: "work-agent".into(), force: false }
        );
    }

    #[test]
    fn the_delete_option_decides_ownership_as_upstreams_owned_by_the_work() {
        let meta = |group: &str, resource: &str, namespace: &str, name: &str| Meta {
            group: group.into(),
            version: "v1".into(),
            kind: String::new(),
            resource: resource.into(),
            namespace: namespace.into(),
            name: name.into(),
        };
        let ns = meta("", "namespaces", "", "shop");
        let web = meta("apps", "deployments", "shop", "web");
        assert!(owned_by_the_work(&ns, None));
        assert!(owned_by_the_work(&ns, Some(&json!({"propagationPolicy": "Foreground"}))));
        assert!(!owned_by_the_work(&web, Some(&json!({"propagationPolicy": "Orphan"}))));
        // SelectivelyOrphan without rules orphans nothing.
        assert!(owned_by_the_work(&ns, Some(&json!({"propagationPolicy": "SelectivelyOrphan"}))));
        // A rule names group, resource, namespace and name exactly (an empty string may be stored as null).
        let rules = json!({"propagationPolicy": "SelectivelyOrphan", "selectivelyOrphans": {"orphaningRules": [{"group": null, "resource": "namespaces", "name": "shop"}]}});
        assert!(!owned_by_the_work(&ns, Some(&rules)));
        assert!(owned_by_the_work(&meta("", "namespaces", "", "blog"), Some(&rules)));
        assert!(owned_by_the_work(&web, Some(&rules)));
        let wildcard = json!({"propagationPolicy": "SelectivelyOrphan", "selectivelyOrphans": {"orphaningRules": [{"group": "apps", "resource": "deployments", "namespace": "shop", "name": "*"}]}});
        assert!(owned_by_the_work(&web, Some(&wildcard)), "no wildcards in orphaning rules");
    }

    #[test]
    fn the_works_owner_is_merged_as_library_gos_merge_owner_refs() {
        let owner = |name: &str, uid: &str| OwnerReference {
            api_version: "work.open-cluster-management.io/v1".into(),
            kind: "AppliedManifestWork".into(),
            name: name.into(),
            uid: uid.into(),
            ..OwnerReference::default()
        };
        let mine = owner("h-w", "1");
        let other = owner("h-x", "2");
        assert_eq!(merge_owner(&[], &mine, true), Some(vec![mine.clone()]));
        assert_eq!(merge_owner(&[other.clone(), mine.clone()], &mine, true), None, "already there");
        assert_eq!(merge_owner(std::slice::from_ref(&other), &mine, false), None, "nothing to remove");
        assert_eq!(merge_owner(&[mine.clone(), other.clone()], &mine, false), Some(vec![other.clone()]));
        // Matched by name, kind and group: an AppliedManifestWork made again replaces its old self.
        assert_eq!(merge_owner(&[owner("h-w", "0")], &mine, true), Some(vec![mine.clone()]));
    }

    #[test]
    fn json_paths_reach_fields_and_indexes() {
        let o = json!({"spec": {"clusterIP": "10.96.0.9"}, "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}]}, "readyReplicas": 2}});
        assert_eq!(json_path(&o, ".spec.clusterIP"), Some(&json!("10.96.0.9")));
        assert_eq!(json_path(&o, ".status.loadBalancer.ingress[0].ip"), Some(&json!("203.0.113.7")));
        assert_eq!(json_path(&o, ".status.loadBalancer.ingress[1].ip"), None);
        assert_eq!(json_path(&o, ".status.readyReplicas"), Some(&json!(2)));
        let d = json!({"metadata": {"annotations": {"ferry.io/task": "tsk_1"}}});
        assert_eq!(json_path(&d, r".metadata.annotations.ferry\.io/task"), Some(&json!("tsk_1")), "an escaped dot is part of the key");
        assert_eq!(json_path(&d, ".metadata.annotations.ferry.io/task"), None);
    }

    #[test]
    fn feedback_values_are_typed_and_missing_ones_left_out() {
        let cfg = json!({"feedbackRules": [{"type": "WellKnownStatus"}, {"type": "JSONPaths", "jsonPaths": [{"name": "gen", "path": ".metadata.generation"}, {"name": "none", "path": ".status.nothing"}]}]});
        let obj = json!({"apiVersion": "apps/v1", "metadata": {"generation": 3}, "status": {"replicas": 2, "readyReplicas": 1}});
        let (v, synced) = feedback(Some(&cfg), "apps", "Deployment", &obj, 1);
        let names: Vec<&str> = v.iter().map(|x| x["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["ReadyReplicas", "Replicas", "gen"]);
        assert_eq!(v[0]["fieldValue"], json!({"type": "Integer", "integer": 1}));
        assert_eq!((synced["status"].as_str(), synced["reason"].as_str()), (Some("True"), Some("StatusFeedbackSynced")));
        // No rules: synced, with nothing to sync.
        assert_eq!(feedback(None, "apps", "Deployment", &obj, 1).1["reason"], "NoStatusFeedbackSynced");
    }

    #[test]
    fn well_known_statuses_are_upstreams_per_group_and_kind() {
        let wk = json!({"feedbackRules": [{"type": "WellKnownStatus"}]});
        // A Job: JobComplete is the Complete condition's status, JobSucceeded the count
        // (rules/rule.go, `jobRule`), not the count under JobComplete.
        let job = json!({"apiVersion": "batch/v1", "status": {"succeeded": 1, "conditions": [{"type": "SuccessCriteriaMet", "status": "True"}, {"type": "Complete", "status": "True"}]}});
        let (v, synced) = feedback(Some(&wk), "batch", "Job", &job, 1);
        assert_eq!(v, [json!({"name": "JobComplete", "fieldValue": {"type": "String", "string": "True"}}), json!({"name": "JobSucceeded", "fieldValue": {"type": "Integer", "integer": 1}})]);
        assert_eq!(synced["status"], "True");
        let running = json!({"apiVersion": "batch/v1", "status": {"active": 1}});
        assert_eq!(feedback(Some(&wk), "batch", "Job", &running, 1).0, Vec::<Value>::new(), "nothing to report yet");
        let pod = json!({"apiVersion": "v1", "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}});
        let names: Vec<Value> = feedback(Some(&wk), "", "Pod", &pod, 1).0.iter().map(|x| x["name"].clone()).collect();
        assert_eq!(names, [json!("PodReady"), json!("PodPhase")]);
        // A StatefulSet has no well-known paths: the rule fails, and the condition says so.
        let sts = json!({"apiVersion": "apps/v1", "status": {"replicas": 1}});
        let (v, synced) = feedback(Some(&wk), "apps", "StatefulSet", &sts, 4);
        assert!(v.is_empty());
        assert_eq!((synced["status"].as_str(), synced["reason"].as_str()), (Some("False"), Some("StatusFeedbackSyncFailed")));
        assert!(synced["message"].as_str().unwrap().contains("cannot find the wellknown statuses for resource with gvk apps/v1, Kind=StatefulSet"), "{synced}");
        assert_eq!(json_path(&job, r#".status.conditions[?(@.type=="Failed")].status"#), None);
    }

    #[test]
    fn selectors_match_labels_and_expressions() {
        let l = BTreeMap::from([("tier".to_owned(), "gold".to_owned())]);
        assert!(matches_selector(&l, &json!({"matchLabels": {"tier": "gold"}})));
        assert!(!matches_selector(&l, &json!({"matchLabels": {"tier": "silver"}})));
        assert!(matches_selector(&l, &json!({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gold", "x"]}]})));
        assert!(matches_selector(&l, &json!({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]})));
        assert!(!matches_selector(&l, &json!({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gold"]}]})));
    }
}

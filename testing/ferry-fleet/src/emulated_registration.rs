//! OCM registration as upstream does it (open-cluster-management-io/ocm `pkg/registration`,
//! v1.x at `00f84c3`), both sides, on the test bed's real API servers:
//!
//! - [`install_hub`]: what `clusteradm init` leaves for joins: the bootstrap ServiceAccount
//!   and ClusterRole (`deploy/cluster-manager/chart/cluster-manager/templates/bootstrap_*.yaml`)
//!   and kubeadm's `kube-public/cluster-info` (the hub's address and CA).
//! - [`hub_tick`]: the hub's ManagedCluster controller (`hub/managedcluster/controller.go`):
//!   an accepted cluster gets its namespace, its RBAC (`hub/manifests/rbac/*.yaml`), the
//!   cleanup finalizer and `HubAcceptedManagedCluster`; a denied one loses its bindings; a
//!   deleted one its RBAC, then, once no ManifestWork is left in its namespace, the
//!   finalizer (`removeClusterSpecificRoleBindings` requeues while any is). And its GC
//!   controller (`hub/gc/controller.go`, `gc_resources.go`; feature gate `ResourceCleanup`,
//!   on by default): [`GC_FINALIZER`] on every ManagedCluster; on its deletion the
//!   ManagedClusterAddOns, then the ManifestWorks, of its namespace deleted (lowest
//!   `open-cluster-management.io/cleanup-priority` first), the finalizer kept while any
//!   remains (a work's finalizer goes only through its cluster's work agent, so a work of
//!   a cluster whose agent is gone holds the ManagedCluster for ever). And its lease controller
//!   (`hub/lease/controller.go`): creates `managed-cluster-lease` for an accepted cluster
//!   and, when the agent stops renewing it for 5 lease durations, sets Available `Unknown`.
//!   The hub never sets Joined or Available `True`. And its taint controller
//!   (`hub/taint/controller.go`, [`crate::ocm_taints`]): `unreachable` while Available is
//!   missing or Unknown, `unavailable` while it is False, both `NoSelect`.
//! - [`Klusterlet`]: the registration agent on a managed cluster. Given a `Klusterlet` and
//!   the `bootstrap-hub-kubeconfig` Secret (what `clusteradm join` leaves), it creates the
//!   ManagedCluster with the bootstrap identity (`spoke/registration/creating_controller.go`),
//!   makes a key and a CSR for `system:open-cluster-management:<cluster>:<agent>`
//!   (`register/csr/csr.go`), waits until the CSR is approved and signed (the API
//!   server's csrsigning controller, with the test bed's client CA), then, with its own
//!   certificate, sets `ManagedClusterJoined` once accepted (`spoke/managedcluster/joining_reconcile.go`)
//!   and Available (`available_reconcile.go`), and renews its lease (`spoke/lease/lease_controller.go`).
//!   Without a Klusterlet (or with its bootstrap Secret gone) it does nothing. Its
//!   ManagedCluster deleted on the hub, it does not make it again: upstream's creating
//!   controller runs only while the agent bootstraps, and the agent bootstraps again only
//!   when its hub kubeconfig is invalid (its certificate expired), not when its cluster is
//!   gone (`spoke/spokeagent.go`, `RunSpokeAgent`; `register/common.go`,
//!   `IsHubKubeConfigValidFunc`). [`Klusterlet::agents_run`] says whether the klusterlet's
//!   agents run, which the emulated work agent of a Cluster API workload cluster follows.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use ferry_kube::ocm_join::{AGENT_NAMESPACE, BOOTSTRAP_ROLE, BOOTSTRAP_SA, BOOTSTRAP_SECRET, CLUSTER_NAME_LABEL, HUB_NAMESPACE, HUB_SECRET, KLUSTERLET};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

use crate::applied_cache::AppliedCache;
use crate::emulate::{finalizer_patch, now};
use crate::emulated_ocm::OcmKnobs;
use crate::wake::Wake;

const MANAGER: &str = "ferry-fleet-registration";
/// The hub's cleanup finalizer on accepted clusters (`v1.ManagedClusterFinalizer`).
pub const CLEANUP_FINALIZER: &str = "cluster.open-cluster-management.io/api-resource-cleanup";
/// The GC controller's finalizer on every ManagedCluster (ocm
/// `pkg/common/helpers/clusters.go`, `GcFinalizer`).
pub const GC_FINALIZER: &str = "cluster.open-cluster-management.io/resource-cleanup";
/// A resource's place in the GC's order (ocm `api/cluster/v1/types.go`,
/// `CleanupPriorityAnnotationKey`: 0 to 100, lowest deleted first).
const CLEANUP_PRIORITY: &str = "open-cluster-management.io/cleanup-priority";
/// The lease the agent renews in its cluster's namespace on the hub.
pub const LEASE: &str = "managed-cluster-lease";
/// `leaseDurationTimes`: the grace is five lease durations.
const LEASE_DURATION_TIMES: i64 = 5;
/// `LeaseDurationSeconds` when the ManagedCluster sets none.
const DEFAULT_LEASE_SECONDS: i64 = 60;
const SUBJECT_PREFIX: &str = "system:open-cluster-management:";
/// The longest the registration controllers (hub and agents) sleep with nothing changed:
/// they watch what they read and ask for the times they wait for (lease renewals and
/// expiry, the GC's requeue); what is left unwatched (RBAC deleted by someone, add-ons,
/// the hub's leases) is looked at again within this (a pass every second made an idle
/// hub answer 27 requests/s, docs/BENCHMARKS.md, session 39).
pub const FALLBACK: Duration = Duration::from_secs(10);
/// How soon the GC looks again while resources remain (`gc_resources.go`, `requeueError`),
/// and the ManagedCluster controller while a deleted cluster's works do
/// (`managedcluster/controller.go`, `requeueError`): neither watches the works.
const GC_REQUEUE: Duration = Duration::from_secs(5);
/// The agent's lease renewals are jittered by up to this part of the lease duration
/// (`spoke/lease/lease_controller.go`, `leaseUpdateJitterFactor`).
const LEASE_JITTER: f64 = 0.25;

fn managed_clusters() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("cluster.open-cluster-management.io", "v1", "ManagedCluster"), "managedclusters")
}

/// What the GC controller deletes from a deleted cluster's namespace, in this order (ocm
/// `pkg/registration/hub/manager.go`, `GCResourceList`). Upstream lists the add-ons as
/// `v1beta1`; the test bed's CRDs (API v1.3.0, ../shared/crds) serve them as `v1alpha1`,
/// the same objects.
fn gc_resources() -> [ApiResource; 2] {
    [
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("addon.open-cluster-management.io", "v1alpha1", "ManagedClusterAddOn"), "managedclusteraddons"),
        manifest_works(),
    ]
}

fn manifest_works() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("work.open-cluster-management.io", "v1", "ManifestWork"), "manifestworks")
}

pub(crate) fn klusterlets() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("operator.open-cluster-management.io", "v1", "Klusterlet"), "klusterlets")
}

fn apply(api_version: &str, kind: &str) -> ApiResource {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let plural = format!("{}s", kind.to_ascii_lowercase());
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), &plural)
}

/// Server-side applies `obj` (cluster-scoped or namespaced) with the admin client.
async fn ssa(client: &kube::Client, obj: &Value) -> Result<(), kube::Error> {
    let ar = apply(obj["apiVersion"].as_str().unwrap_or_default(), obj["kind"].as_str().unwrap_or_default());
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    let api: Api<DynamicObject> = match obj["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    api.patch(name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(obj)).await.map(drop)
}

async fn delete(client: &kube::Client, api_version: &str, kind: &str, ns: Option<&str>, name: &str) -> Result<(), kube::Error> {
    let ar = apply(api_version, kind);
    let api: Api<DynamicObject> = match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    crate::emulate::absent(api.delete(name, &DeleteParams::default()).await)
}

/// The Klusterlet CRD as the klusterlet chart installs it on a managed cluster
/// (`deploy/klusterlet/chart/klusterlet/crds/`), with an open schema: ../shared/crds has
/// no Klusterlet. The emulated catalog's `klusterlet` stand-in carries the same.
pub fn klusterlet_crd() -> Value {
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": {"name": "klusterlets.operator.open-cluster-management.io"},
        "spec": {"group": "operator.open-cluster-management.io", "scope": "Cluster",
            "names": {"kind": "Klusterlet", "listKind": "KlusterletList", "plural": "klusterlets", "singular": "klusterlet"},
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}})
}

// ---------------------------------------------------------------------------------------
// the hub

/// Installs on the hub what `clusteradm init` leaves for joins: the bootstrap identity
/// and `kube-public/cluster-info` naming `server` with CA `ca_pem`.
pub async fn install_hub(hub: &kube::Client, server: &str, ca_pem: &[u8]) -> Result<(), kube::Error> {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let info = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: \"\"\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\ncontexts: []\nusers: []\ncurrent-context: \"\"\n"
    );
    for obj in [
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": HUB_NAMESPACE}}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": BOOTSTRAP_SA, "namespace": HUB_NAMESPACE}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": BOOTSTRAP_ROLE}, "rules": [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]},
            {"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests"], "verbs": ["create", "get", "list", "watch"]},
            {"apiGroups": ["cluster.open-cluster-management.io"], "resources": ["managedclusters"], "verbs": ["get", "create", "list", "watch"]},
            {"apiGroups": ["cluster.open-cluster-management.io"], "resources": ["managedclustersets/join"], "verbs": ["create"]},
        ]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "open-cluster-management:bootstrap:agent-registration"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": BOOTSTRAP_ROLE},
               "subjects": [{"kind": "ServiceAccount", "name": BOOTSTRAP_SA, "namespace": HUB_NAMESPACE}]}),
        // kubeadm's bootstrap-token phase (`phases/bootstraptoken/clusterinfo`).
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cluster-info", "namespace": "kube-public"}, "data": {"kubeconfig": info}}),
    ] {
        ssa(hub, &obj).await?;
    }
    Ok(())
}

fn conditions(mc: &DynamicObject) -> Vec<Value> {
    mc.data.pointer("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default()
}

fn condition_status(mc: &DynamicObject, type_: &str) -> Option<String> {
    conditions(mc).into_iter().find(|c| c["type"] == type_).and_then(|c| c["status"].as_str().map(str::to_owned))
}

/// Sets one condition as `meta.SetStatusCondition` does (the transition time moves only
/// with the status); true when something changed.
fn set_condition(conds: &mut Vec<Value>, type_: &str, status: &str, reason: &str, message: &str) -> bool {
    match conds.iter_mut().find(|c| c["type"] == type_) {
        Some(c) if c["status"] == status && c["reason"] == reason && c["message"] == message => false,
        Some(c) => {
            if c["status"] != status {
                c["lastTransitionTime"] = json!(now());
            }
            c["status"] = json!(status);
            c["reason"] = json!(reason);
            c["message"] = json!(message);
            true
        }
        None => {
            conds.push(json!({"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": now()}));
            true
        }
    }
}

/// Writes `conds` as the status conditions of `mc` (an update at its resourceVersion: a
/// concurrent writer makes it fail, and the next tick reads again).
async fn write_conditions(api: &Api<DynamicObject>, mc: &DynamicObject, conds: Vec<Value>, extra: Vec<(&str, Value)>) -> Result<(), kube::Error> {
    let mut obj = mc.clone();
    let status = obj.data.as_object_mut().map(|o| o.entry("status").or_insert_with(|| json!({})));
    if let Some(status) = status {
        status["conditions"] = json!(conds);
        for (k, v) in extra {
            status[k] = v;
        }
    }
    let name = mc.metadata.name.clone().unwrap_or_default();
    api.replace_status(&name, &PostParams::default(), &obj).await.map(drop)
}

/// The per-cluster RBAC of an accepted (or denied) cluster, from `hub/manifests/rbac`.
fn cluster_rbac(name: &str, accepted: bool) -> Vec<Value> {
    let labels = json!({CLUSTER_NAME_LABEL: name});
    let groups = json!([
        {"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": format!("{SUBJECT_PREFIX}{name}")},
        {"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": format!("open-cluster-management:{name}")},
    ]);
    let rules = if accepted {
        json!([
            {"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests"], "verbs": ["create", "get", "list", "watch"]},
            {"apiGroups": ["register.open-cluster-management.io"], "resources": ["managedclusters/clientcertificates"], "verbs": ["renew"]},
            {"apiGroups": ["cluster.open-cluster-management.io"], "resources": ["managedclusters"], "resourceNames": [name], "verbs": ["get", "list", "update", "watch"]},
            {"apiGroups": ["cluster.open-cluster-management.io"], "resources": ["managedclusters/status"], "resourceNames": [name], "verbs": ["patch", "update"]},
        ])
    } else {
        json!([{"apiGroups": ["cluster.open-cluster-management.io"], "resources": ["managedclusters"], "resourceNames": [name], "verbs": ["get", "list", "watch"]}])
    };
    let role = format!("open-cluster-management:managedcluster:{name}");
    vec![
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": role, "labels": labels}, "rules": rules}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": role, "labels": labels},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role}, "subjects": groups}),
    ]
}

/// The role every agent shares and its binding in the cluster's namespace (leases).
fn registration_rbac(name: &str) -> Vec<Value> {
    let shared = "open-cluster-management:managedcluster:registration";
    vec![
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": shared}, "rules": [
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "list", "watch", "update"]},
            {"apiGroups": ["addon.open-cluster-management.io"], "resources": ["managedclusteraddons"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["addon.open-cluster-management.io"], "resources": ["managedclusteraddons/status"], "verbs": ["patch", "update"]},
            {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create"]},
        ]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": format!("open-cluster-management:managedcluster:{name}:registration"), "namespace": name, "labels": {CLUSTER_NAME_LABEL: name}},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": shared},
               "subjects": [
                   {"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": format!("{SUBJECT_PREFIX}{name}")},
                   {"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": format!("open-cluster-management:{name}")},
               ]}),
    ]
}

/// The RBAC the hub's ManagedCluster controller applied and has not seen change since:
/// upstream's permission applier compares each object with its informers' caches and
/// writes only what differs (`pkg/registration/hub/managedcluster/controller.go`,
/// `apply.NewPermissionApplier` over the Role, RoleBinding, ClusterRole and
/// ClusterRoleBinding listers); here an object whose manifest is the one last applied is
/// skipped until any RBAC object of the hub changes ([`HubRbac::watch`] forgets them all).
#[derive(Default)]
pub struct HubRbac {
    applied: Arc<AppliedCache>,
}

impl HubRbac {
    /// Wakes `wake` on every change of the hub's RBAC (upstream's informers enqueue the
    /// cluster a labelled object belongs to), after forgetting what was applied.
    pub fn watch(&self, hub: &kube::Client, wake: &mut Wake) {
        use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
        for ar in [ApiResource::erase::<ClusterRole>(&()), ApiResource::erase::<ClusterRoleBinding>(&()), ApiResource::erase::<Role>(&()), ApiResource::erase::<RoleBinding>(&())] {
            let applied = self.applied.clone();
            wake.watch_then(hub, &ar, move || applied.forget_all());
        }
    }

    /// Applies `obj` unless it is what was applied last and nothing changed since. A
    /// change seen while the write was under way leaves it unremembered.
    async fn apply(&self, hub: &kube::Client, obj: &Value) -> Result<(), kube::Error> {
        let key = format!("{}/{}/{}/{}", obj["kind"].as_str().unwrap_or(""), obj.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or(""), obj["metadata"]["name"].as_str().unwrap_or(""), obj["apiVersion"].as_str().unwrap_or(""));
        self.applied.apply(key, obj.to_string(), ssa(hub, obj)).await
    }

    /// Forgets what was applied (this pass deletes some of it).
    fn forget(&self) {
        self.applied.forget_all();
    }
}

async fn remove_rbac(hub: &kube::Client, name: &str) -> Result<(), kube::Error> {
    let role = format!("open-cluster-management:managedcluster:{name}");
    delete(hub, "rbac.authorization.k8s.io/v1", "ClusterRoleBinding", None, &role).await?;
    delete(hub, "rbac.authorization.k8s.io/v1", "ClusterRole", None, &role).await?;
    delete(hub, "rbac.authorization.k8s.io/v1", "RoleBinding", Some(name), &format!("{role}:registration")).await
}

/// One pass of the hub's ManagedCluster, GC, lease and taint controllers; a cluster whose
/// pass fails does not hold up the others (the first error is returned after all ran).
/// What only time changes, it asks `wake` for: a lease's expiry (the lease controller's
/// `AddAfter`), the GC's look again while resources remain.
pub async fn hub_tick(hub: &kube::Client, wake: &Wake, rbac: &HubRbac) -> Result<(), kube::Error> {
    let api: Api<DynamicObject> = Api::all_with(hub.clone(), &managed_clusters());
    let mut first = Ok(());
    for mc in api.list(&Default::default()).await?.items {
        let r = match gc(hub, &api, &mc, wake).await {
            // It wrote the ManagedCluster: the others read it again on the next pass.
            Ok(true) => Ok(()),
            Ok(false) => match taint(&api, &mc).await {
                Ok(()) => reconcile(hub, &api, mc, wake, rbac).await,
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        if first.is_ok() {
            first = r;
        }
    }
    first
}

/// The hub's GC controller over one ManagedCluster (ocm `pkg/registration/hub/gc/controller.go`,
/// `sync`, and `gc_resources.go`, `reconcile`): [`GC_FINALIZER`] on a cluster not being
/// deleted; on a deleted one, the first kind of [`gc_resources`] with objects left in the
/// cluster's namespace has its lowest-priority ones deleted and the `Deleting` condition
/// says what remains (and the pass runs again within [`GC_REQUEUE`]); with none left,
/// `Deleting` True and the finalizer removed. True when it wrote the cluster.
async fn gc(hub: &kube::Client, api: &Api<DynamicObject>, mc: &DynamicObject, wake: &Wake) -> Result<bool, kube::Error> {
    let Some(name) = mc.metadata.name.as_deref() else { return Ok(false) };
    if mc.metadata.deletion_timestamp.is_none() {
        let Some(patch) = finalizer_patch(&mc.metadata, GC_FINALIZER, true) else { return Ok(false) };
        api.patch(name, &PatchParams::default(), &Patch::Merge(patch)).await?;
        return Ok(true);
    }
    let mut conds = conditions(mc);
    for ar in gc_resources() {
        let items = match Api::<DynamicObject>::namespaced_with(hub.clone(), name, &ar).list(&Default::default()).await {
            Ok(l) => l.items,
            // The kind is not served: nothing of it to delete.
            Err(kube::Error::Api(s)) if s.code == 404 => continue,
            Err(e) => return Err(e),
        };
        if items.is_empty() {
            continue;
        }
        let pending = items.iter().filter(|o| o.metadata.finalizers.as_ref().is_some_and(|f| !f.is_empty())).count();
        let message = format!("The resource {} is remaning, the remaining count is {}, the finalizer pending count is {pending}", ar.plural, items.len());
        // `getCleanupPriority`: 0 to 100, anything else 0; the lowest go first.
        let priority = |o: &DynamicObject| {
            o.metadata.annotations.as_ref().and_then(|a| a.get(CLEANUP_PRIORITY)).and_then(|v| v.parse::<i64>().ok()).filter(|p| (0..=100).contains(p)).unwrap_or(0)
        };
        let first = items.iter().map(priority).min().unwrap_or(0);
        let objects: Api<DynamicObject> = Api::namespaced_with(hub.clone(), name, &ar);
        for o in items.iter().filter(|o| priority(o) == first) {
            delete_named(&objects, o.metadata.name.as_deref().unwrap_or_default()).await?;
        }
        wake.after(GC_REQUEUE);
        if set_condition(&mut conds, "Deleting", "False", "ResourceRemaining", &message) {
            write_conditions(api, mc, conds, Vec::new()).await?;
            return Ok(true);
        }
        return Ok(false);
    }
    if set_condition(&mut conds, "Deleting", "True", "NoResource", "No cleaned resource in cluster ns.") {
        write_conditions(api, mc, conds, Vec::new()).await?;
        return Ok(true);
    }
    let Some(patch) = finalizer_patch(&mc.metadata, GC_FINALIZER, false) else { return Ok(false) };
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch)).await?;
    Ok(true)
}

/// Deletes `name` through `api`; gone already is fine.
async fn delete_named(api: &Api<DynamicObject>, name: &str) -> Result<(), kube::Error> {
    crate::emulate::absent(api.delete(name, &DeleteParams::default()).await)
}

/// Whether ManifestWorks are left in cluster namespace `name` (the kind not served: none).
async fn works_left(hub: &kube::Client, name: &str) -> Result<bool, kube::Error> {
    match Api::<DynamicObject>::namespaced_with(hub.clone(), name, &manifest_works()).list(&ListParams::default().limit(1)).await {
        Ok(l) => Ok(!l.items.is_empty()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// The hub's taint controller (`hub/taint/controller.go`): the availability taints of
/// one ManagedCluster, any cluster but one being deleted ([`crate::ocm_taints::wanted`]),
/// written as upstream's patcher does (a merge patch of the spec, at the version read).
async fn taint(api: &Api<DynamicObject>, mc: &DynamicObject) -> Result<(), kube::Error> {
    let Some(name) = mc.metadata.name.as_deref() else { return Ok(()) };
    if mc.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let Some(taints) = crate::ocm_taints::wanted(&mc.data) else { return Ok(()) };
    let patch = json!({"metadata": {"resourceVersion": mc.metadata.resource_version}, "spec": {"taints": taints}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch)).await.map(|_| ())
}

/// The controllers' pass over one ManagedCluster.
async fn reconcile(hub: &kube::Client, api: &Api<DynamicObject>, mc: DynamicObject, wake: &Wake, rbac: &HubRbac) -> Result<(), kube::Error> {
    let api = api.clone();
    {
        let Some(name) = mc.metadata.name.clone() else { return Ok(()) };
        let finalizers = mc.metadata.finalizers.clone().unwrap_or_default();
        if mc.metadata.deletion_timestamp.is_some() {
            if finalizers.iter().any(|f| f == CLEANUP_FINALIZER) {
                rbac.forget();
                remove_rbac(hub, &name).await?;
                // `removeClusterSpecificRoleBindings`: the work agent's binding (here the
                // agent acts as the admin) and with it this finalizer stay while works do.
                if works_left(hub, &name).await? {
                    wake.after(GC_REQUEUE);
                    return Ok(());
                }
                if let Some(patch) = finalizer_patch(&mc.metadata, CLEANUP_FINALIZER, false) {
                    api.patch(&name, &PatchParams::default(), &Patch::Merge(patch)).await?;
                }
            }
            return Ok(());
        }
        let accepts = mc.data.pointer("/spec/hubAcceptsClient").and_then(Value::as_bool) == Some(true);
        let mut conds = conditions(&mc);
        if !accepts {
            if condition_status(&mc, "HubAcceptedManagedCluster").as_deref() == Some("True") {
                rbac.forget();
                for obj in cluster_rbac(&name, false) {
                    ssa(hub, &obj).await?;
                }
                delete(hub, "rbac.authorization.k8s.io/v1", "RoleBinding", Some(&name), &format!("open-cluster-management:managedcluster:{name}:registration")).await?;
                set_condition(&mut conds, "HubAcceptedManagedCluster", "False", "HubClusterAdminDenied", "Denied by hub cluster admin");
                write_conditions(&api, &mc, conds, Vec::new()).await?;
            }
            return Ok(());
        }
        ssa(hub, &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {CLUSTER_NAME_LABEL: name}}})).await?;
        if let Some(patch) = finalizer_patch(&mc.metadata, CLEANUP_FINALIZER, true) {
            api.patch(&name, &PatchParams::default(), &Patch::Merge(patch)).await?;
            return Ok(()); // the status write below would conflict; next tick
        }
        for obj in cluster_rbac(&name, true).into_iter().chain(registration_rbac(&name)) {
            rbac.apply(hub, &obj).await?;
        }
        if set_condition(&mut conds, "HubAcceptedManagedCluster", "True", "HubClusterAdminAccepted", "Accepted by hub cluster admin") {
            write_conditions(&api, &mc, conds, Vec::new()).await?;
            return Ok(());
        }
        lease_tick(hub, &api, &mc, &name, conds, wake).await?;
    }
    Ok(())
}

/// The lease controller's pass over one accepted cluster (`hub/lease/controller.go`,
/// `sync`): the lease made if missing; Available `Unknown` once it is older than the grace
/// (five lease durations); the pass asked for again when the lease would expire, or a
/// grace later once it has (upstream's `AddAfter`; the agent's renewal is not watched:
/// the agent sets Available again itself).
async fn lease_tick(hub: &kube::Client, api: &Api<DynamicObject>, mc: &DynamicObject, name: &str, mut conds: Vec<Value>, wake: &Wake) -> Result<(), kube::Error> {
    let seconds = lease_seconds(mc);
    let grace = chrono_seconds(seconds * LEASE_DURATION_TIMES);
    let leases: Api<Lease> = Api::namespaced(hub.clone(), name);
    let Some(lease) = leases.get_opt(LEASE).await? else {
        let lease: Lease = serde_json::from_value(json!({"metadata": {"name": LEASE, "namespace": name, "labels": {CLUSTER_NAME_LABEL: name}},
            "spec": {"holderIdentity": LEASE, "renewTime": micro_now()}}))
        .expect("a lease");
        leases.create(&PostParams::default(), &lease).await?;
        wake.at(k8s_openapi::jiff::Timestamp::now() + grace);
        return Ok(());
    };
    let now = k8s_openapi::jiff::Timestamp::now();
    let expires = lease.spec.and_then(|s| s.renew_time).map(|t| t.0 + grace);
    match expires.filter(|t| now < *t) {
        Some(t) => wake.at(t),
        None => {
            wake.at(now + grace);
            if set_condition(&mut conds, "ManagedClusterConditionAvailable", "Unknown", "ManagedClusterLeaseUpdateStopped", "Registration agent stopped updating its lease.") {
                write_conditions(api, mc, conds, Vec::new()).await?;
            }
        }
    }
    Ok(())
}

/// A ManagedCluster's `leaseDurationSeconds` (the default when unset or zero, as both
/// lease controllers read it).
fn lease_seconds(mc: &DynamicObject) -> i64 {
    mc.data.pointer("/spec/leaseDurationSeconds").and_then(Value::as_i64).filter(|s| *s > 0).unwrap_or(DEFAULT_LEASE_SECONDS)
}

fn chrono_seconds(s: i64) -> k8s_openapi::jiff::SignedDuration {
    k8s_openapi::jiff::SignedDuration::from_secs(s)
}

fn micro_now() -> String {
    k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

// ---------------------------------------------------------------------------------------
// the agent

/// What the agent holds between passes.
struct AgentState {
    /// The agent's name (`--agent-name`; upstream generates one).
    agent: String,
    /// The CSR it made and its private key (PEM).
    csr: Option<(String, String)>,
    /// The hub as this agent (its issued certificate).
    hub: Option<kube::Client>,
    /// The uid of the Klusterlet it runs for: another one (removed and made again) gets
    /// a fresh agent, its hub kubeconfig gone with the old one's agent namespace.
    klusterlet: Option<String>,
    /// The lease updater while it runs (the cluster accepted): the lease duration it runs
    /// with and when it renews next.
    lease: Option<(i64, Instant)>,
}

impl AgentState {
    /// A new agent incarnation: a fresh name, no CSR, no hub identity.
    fn fresh() -> Self {
        Self { agent: format!("{:08x}", rand::random::<u32>()), csr: None, hub: None, klusterlet: None, lease: None }
    }
}

/// The registration agent of one managed cluster; see the module docs.
pub struct Klusterlet {
    /// The test bed's name for the cluster: the agent acts only on a Klusterlet of this
    /// name (virtual workload clusters share an API server, one Klusterlet among them).
    cluster: String,
    managed: kube::Client,
    knobs: Arc<Mutex<std::collections::HashMap<String, OcmKnobs>>>,
    state: tokio::sync::Mutex<AgentState>,
    /// What runs its passes: asked for the lease's next renewal.
    wake: Arc<Wake>,
}

impl Klusterlet {
    /// An agent for `cluster`, reached with `managed`, its passes run on `wake`.
    pub fn new(cluster: &str, managed: kube::Client, knobs: Arc<Mutex<std::collections::HashMap<String, OcmKnobs>>>, wake: Arc<Wake>) -> Self {
        Self { cluster: cluster.to_owned(), managed, knobs, state: tokio::sync::Mutex::new(AgentState::fresh()), wake }
    }

    /// Whether the klusterlet's agents (registration and work) run: its Klusterlet names
    /// this cluster and is not being deleted (the klusterlet operator removes the agents
    /// with it), and the agent holds its hub identity (the work agent runs with the hub
    /// kubeconfig registration wrote). Reads the Klusterlet now, not as of the last pass.
    pub async fn agents_run(&self) -> bool {
        let serves = {
            let state = self.state.lock().await;
            match state.hub {
                Some(_) => state.klusterlet.clone(),
                None => return false,
            }
        };
        let kl: Api<DynamicObject> = Api::all_with(self.managed.clone(), &klusterlets());
        kl.get_opt(KLUSTERLET).await.ok().flatten().is_some_and(|k| {
            k.metadata.uid == serves
                && k.metadata.deletion_timestamp.is_none()
                && k.data.pointer("/spec/clusterName").and_then(Value::as_str) == Some(self.cluster.as_str())
        })
    }

    /// One pass; errors are retried on the next.
    pub async fn tick(&self) -> Result<(), String> {
        let cluster = &self.cluster;
        let e = |what: &'static str| move |err: kube::Error| format!("klusterlet of {cluster}: {what}: {err}");
        let kl: Api<DynamicObject> = Api::all_with(self.managed.clone(), &klusterlets());
        let klusterlet = match kl.get_opt(KLUSTERLET).await {
            Ok(k) => k,
            Err(kube::Error::Api(s)) if s.code == 404 => None, // no CRD: no klusterlet installed
            Err(err) => return Err(e("reading the Klusterlet")(err)),
        };
        let name = klusterlet.as_ref().and_then(|k| k.data.pointer("/spec/clusterName")?.as_str().map(str::to_owned));
        let mut state = self.state.lock().await;
        let Some(name) = name.filter(|n| *n == self.cluster && klusterlet.as_ref().is_some_and(|k| k.metadata.deletion_timestamp.is_none())) else {
            // The klusterlet is removed (or not this cluster's): the agent stops.
            if state.hub.is_some() || state.csr.is_some() {
                *state = AgentState::fresh();
            }
            return Ok(());
        };
        let uid = klusterlet.as_ref().and_then(|k| k.metadata.uid.clone());
        if state.klusterlet != uid {
            *state = AgentState { klusterlet: uid, ..AgentState::fresh() };
        }
        if state.hub.is_none() {
            let Some(kc) = secret_kubeconfig(&self.managed).await.map_err(e("reading the bootstrap Secret"))? else { return Ok(()) };
            let boot = client_from(&kc).await.map_err(|err| format!("klusterlet of {name}: the bootstrap kubeconfig: {err}"))?;
            self.bootstrap(&boot, &kc, &name, &mut state).await?;
            if state.hub.is_none() {
                return Ok(());
            }
        }
        let hub = state.hub.clone().expect("the hub identity");
        drop(state);
        self.joined(&hub, &name).await
    }

    /// With the bootstrap identity: the ManagedCluster, the CSR, and once signed, the
    /// hub identity (also written to `hub-kubeconfig-secret`, as the agent does).
    async fn bootstrap(&self, boot: &kube::Client, boot_kc: &str, name: &str, state: &mut AgentState) -> Result<(), String> {
        let mcs: Api<DynamicObject> = Api::all_with(boot.clone(), &managed_clusters());
        let err = |what: &'static str| move |e: kube::Error| format!("klusterlet of {name}: {what}: {e}");
        if mcs.get_opt(name).await.map_err(err("reading its ManagedCluster"))?.is_none() {
            let mc = json!({"apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster", "metadata": {"name": name},
                "spec": {"hubAcceptsClient": false, "leaseDurationSeconds": DEFAULT_LEASE_SECONDS}});
            let obj: DynamicObject = serde_json::from_value(mc).expect("a ManagedCluster");
            crate::emulate::present(mcs.create(&PostParams::default(), &obj).await).map_err(err("creating its ManagedCluster"))?;
        }
        let csrs: Api<CertificateSigningRequest> = Api::all(boot.clone());
        let Some((csr_name, key)) = state.csr.clone() else {
            let (request, key) = make_csr(name, &state.agent).map_err(|e| format!("klusterlet of {name}: making a CSR: {e}"))?;
            let csr: CertificateSigningRequest = serde_json::from_value(json!({
                "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
                "metadata": {"generateName": format!("{name}-"), "labels": {CLUSTER_NAME_LABEL: name}},
                "spec": {"request": base64::engine::general_purpose::STANDARD.encode(request), "signerName": "kubernetes.io/kube-apiserver-client",
                         "usages": ["digital signature", "key encipherment", "client auth"]},
            }))
            .expect("a CSR");
            let made = csrs.create(&PostParams::default(), &csr).await.map_err(err("creating its CSR"))?;
            state.csr = Some((made.metadata.name.unwrap_or_default(), key));
            return Ok(());
        };
        let Some(csr) = csrs.get_opt(&csr_name).await.map_err(err("reading its CSR"))? else {
            state.csr = None; // removed: make another
            return Ok(());
        };
        let status = csr.status.unwrap_or_default();
        if status.conditions.iter().flatten().any(|c| c.type_ == "Denied" || c.type_ == "Failed") {
            state.csr = None;
            return Err(format!("klusterlet of {name}: CSR {csr_name} was denied"));
        }
        let Some(cert) = status.certificate.filter(|c| !c.0.is_empty()) else { return Ok(()) };
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let mut kc: Value = serde_json::from_str(boot_kc).or_else(|_| serde_yaml_ng::from_str(boot_kc)).map_err(|e| format!("klusterlet of {name}: {e}"))?;
        kc["users"] = json!([{"name": "agent", "user": {"client-certificate-data": b64(&cert.0), "client-key-data": b64(key.as_bytes())}}]);
        kc["contexts"][0]["context"]["user"] = json!("agent");
        let text = kc.to_string();
        let hub = client_from(&text).await.map_err(|e| format!("klusterlet of {name}: its hub kubeconfig: {e}"))?;
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": HUB_SECRET, "namespace": AGENT_NAMESPACE},
            "stringData": {"kubeconfig": text, "cluster-name": name, "agent-name": state.agent}});
        ssa(&self.managed, &secret).await.map_err(err("writing hub-kubeconfig-secret"))?;
        state.hub = Some(hub);
        Ok(())
    }

    /// With its own identity, once accepted: the lease renewed, then Joined and Available.
    async fn joined(&self, hub: &kube::Client, name: &str) -> Result<(), String> {
        let err = |what: &'static str| move |e: kube::Error| format!("klusterlet of {name}: {what}: {e}");
        let api: Api<DynamicObject> = Api::all_with(hub.clone(), &managed_clusters());
        let mc = match api.get_opt(name).await {
            Ok(mc) => mc,
            // Deleted on the hub, or not accepted (any more), or deleted with its RBAC: the
            // agent keeps its identity (valid while its certificate is) and makes nothing
            // again; only a bootstrapping agent creates its ManagedCluster
            // (`spoke/spokeagent.go`, `RunSpokeAgent`; `register/common.go`,
            // `IsHubKubeConfigValidFunc` checks the certificate, not the cluster).
            Err(kube::Error::Api(s)) if s.code == 403 => None,
            Err(e) => return Err(err("reading its ManagedCluster")(e)),
        };
        let Some(mc) = mc.filter(|mc| condition_status(mc, "HubAcceptedManagedCluster").as_deref() == Some("True")) else {
            // Gone or not accepted: its lease updater stops.
            self.state.lock().await.lease = None;
            return Ok(());
        };
        // The lease updater runs on its own upstream (`spoke/lease/lease_controller.go`): a
        // status write that keeps failing does not stop the renewals.
        let renewed = self.renew(hub, name, lease_seconds(&mc)).await.map_err(err("renewing its lease"));
        renewed.and(self.report(&api, &mc, name).await)
    }

    /// The status controller (`spoke/managedcluster/status_controller.go`): Joined,
    /// Available (or not, by the knob), capacity, allocatable and version.
    async fn report(&self, api: &Api<DynamicObject>, mc: &DynamicObject, name: &str) -> Result<(), String> {
        let err = |what: &'static str| move |e: kube::Error| format!("klusterlet of {name}: {what}: {e}");
        let unavailable = self.knobs.lock().expect("knobs lock").get(name).is_some_and(|k| k.unavailable);
        let mut conds = conditions(mc);
        let mut changed = set_condition(&mut conds, "ManagedClusterJoined", "True", "ManagedClusterJoined", "Managed cluster joined");
        changed |= if unavailable {
            set_condition(&mut conds, "ManagedClusterConditionAvailable", "False", "ManagedClusterKubeAPIServerUnavailable", "The kube-apiserver is not ok, status code: 503")
        } else {
            set_condition(&mut conds, "ManagedClusterConditionAvailable", "True", "ManagedClusterAvailable", "Managed cluster is available")
        };
        // `resource_reconcile.go`: capacity and allocatable summed over the nodes (an
        // unschedulable node's allocatable left out), and the server version.
        let (capacity, allocatable) = resources(&self.managed).await.map_err(err("listing its nodes"))?;
        changed |= mc.data.pointer("/status/capacity") != Some(&capacity) || mc.data.pointer("/status/allocatable") != Some(&allocatable);
        if changed {
            let extra = vec![("version", json!({"kubernetes": "v1.20.2"})), ("capacity", capacity), ("allocatable", allocatable)];
            write_conditions(api, mc, conds, extra).await.map_err(err("updating its status"))?;
        }
        Ok(())
    }

    /// The lease updater (`spoke/lease/lease_controller.go`, `sync` and `leaseUpdater`):
    /// started once the cluster is accepted and again when its `leaseDurationSeconds`
    /// changes, it renews at once, then every lease duration jittered by up to a quarter
    /// (`wait.JitterUntilWithContext`, sliding); a renewal that fails (the hub has not made
    /// the lease yet) waits for the next. The lease says the agent lives, whatever the
    /// health of its API server.
    async fn renew(&self, hub: &kube::Client, name: &str, seconds: i64) -> Result<(), kube::Error> {
        let now = Instant::now();
        let next = {
            let mut state = self.state.lock().await;
            match state.lease {
                Some((s, at)) if s == seconds && now < at => {
                    self.wake.after(at - now);
                    return Ok(());
                }
                _ => {}
            }
            let period = crate::wake::jitter(Duration::from_secs(seconds.unsigned_abs()), LEASE_JITTER);
            state.lease = Some((seconds, now + period));
            period
        };
        self.wake.after(next);
        let leases: Api<Lease> = Api::namespaced(hub.clone(), name);
        if let Some(mut lease) = leases.get_opt(LEASE).await? {
            lease.spec.get_or_insert_with(Default::default).renew_time = serde_json::from_value(json!(micro_now())).ok();
            leases.replace(LEASE, &PostParams::default(), &lease).await?;
        }
        Ok(())
    }
}

/// A cluster's capacity and allocatable (cpu in cores or millicores, the rest as integers).
async fn resources(managed: &kube::Client) -> Result<(Value, Value), kube::Error> {
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(managed.clone()).list(&Default::default()).await?.items;
    let mut capacity: BTreeMap<String, i64> = BTreeMap::new();
    let mut allocatable: BTreeMap<String, i64> = BTreeMap::new();
    let add = |sum: &mut BTreeMap<String, i64>, list: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>| {
        for (k, q) in list.into_iter().flatten() {
            let v = if k == "cpu" { ferry_kube::quantity::millicores(&q.0) } else { ferry_kube::quantity::units(&q.0) };
            *sum.entry(k.clone()).or_default() += v.unwrap_or(0);
        }
    };
    for n in &nodes {
        let status = n.status.as_ref();
        add(&mut capacity, status.and_then(|s| s.capacity.as_ref()));
        if n.spec.as_ref().and_then(|s| s.unschedulable) != Some(true) {
            add(&mut allocatable, status.and_then(|s| s.allocatable.as_ref()));
        }
    }
    let render = |sum: BTreeMap<String, i64>| {
        Value::Object(
            sum.into_iter()
                .map(|(k, v)| {
                    let q = if k == "cpu" { if v % 1000 == 0 { (v / 1000).to_string() } else { format!("{v}m") } } else { v.to_string() };
                    (k, json!(q))
                })
                .collect(),
        )
    };
    Ok((render(capacity), render(allocatable)))
}

async fn secret_kubeconfig(managed: &kube::Client) -> Result<Option<String>, kube::Error> {
    let secrets: Api<Secret> = Api::namespaced(managed.clone(), AGENT_NAMESPACE);
    Ok(secrets.get_opt(BOOTSTRAP_SECRET).await?.and_then(|s| s.data?.get("kubeconfig").map(|b| String::from_utf8_lossy(&b.0).into_owned())))
}

pub async fn client_from(kubeconfig: &str) -> Result<kube::Client, String> {
    let kc = kube::config::Kubeconfig::from_yaml(kubeconfig).map_err(|e| e.to_string())?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.map_err(|e| e.to_string())?;
    kube::Client::try_from(config).map_err(|e| e.to_string())
}

/// A new key and a PEM CSR for the agent's identity (`register/csr/csr.go`: O =
/// `system:open-cluster-management:<cluster>`, CN =
/// `system:open-cluster-management:<cluster>:<agent>`). Upstream adds a second O, the
/// managed-clusters group; rcgen keeps one value per attribute type, and only the
/// cluster's group is bound by the registration RBAC.
fn make_csr(cluster: &str, agent: &str) -> Result<(String, String), rcgen::Error> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(rcgen::DnType::OrganizationName, format!("{SUBJECT_PREFIX}{cluster}"));
    params.distinguished_name.push(rcgen::DnType::CommonName, format!("{SUBJECT_PREFIX}{cluster}:{agent}"));
    let csr = params.serialize_request(&key)?;
    Ok((csr.pem()?, key.serialize_pem()))
}

/// The agents of a fleet's managed clusters, by the test bed's cluster name.
pub type Agents = BTreeMap<String, Arc<Klusterlet>>;


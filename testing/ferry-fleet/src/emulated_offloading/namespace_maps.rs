//! Emulated Liqo NamespaceMaps: how an offloading reaches a provider (liqotech/liqo
//! `557c199`, `pkg/liqo-controller-manager/offloading/`).
//!
//! - **On the consumer** (`virtualnode-controller/namespacemap.go`): each remote cluster
//!   with a VirtualNode gets a NamespaceMap named after its id in its tenant namespace
//!   (found by labels, as upstream's tenant namespace manager finds it), labelled
//!   `liqo.io/remote-cluster-id`, `liqo.io/replication=true` and `liqo.io/remoteID`, so
//!   the CRD replicator ([`crate::emulated_liqo::resources::replicate`]) copies it to the
//!   provider and copies the provider's status back; the VirtualNode's deletion routine
//!   deletes it when the cluster's last VirtualNode goes
//!   ([`crate::emulated_liqo::resources`], `ensureNamespaceMapAbsence`), and the
//!   replicator's finalizer keeps it until its copy on the provider is gone. The
//!   NamespaceOffloading controller
//!   ([`super`]) writes `spec.desiredMapping` (local namespace → remote name) and reads
//!   `status.currentMapping`.
//! - **On the provider** (`namespacemap-controller/`): a replicated NamespaceMap
//!   (`liqo.io/replicated=true`) gets `namespacemap-controller.liqo.io/finalizer`; each
//!   desired mapping gets its namespace, annotated `liqo.io/managed-by-namespace-map:
//!   <namespace>/<name>` of the map and `liqo.io/original-name`, labelled with the
//!   consumer's id, and a RoleBinding named after the map's namespace binding the chart's
//!   `liqo-virtual-kubelet-remote` ClusterRole to the consumer's group (`enforcement.go`,
//!   `createNamespace`). A namespace of that name managed by anything else is refused, as
//!   is a failed creation: phase `CreationLoopBackOff`; a RoleBinding that cannot be
//!   written keeps an `Accepted` mapping and fails a new one. Mappings no longer desired
//!   have their namespace deleted (`Terminating` until it is gone, then dropped;
//!   `ensureNamespacesDeletion`); a deleted map deletes all of them before its finalizer
//!   goes (`NamespaceMapDeletionProcess`). A map whose namespaces could not all be
//!   enforced is reconciled again as controller-runtime requeues a failed key
//!   ([`Requeues`]): with per-item exponential backoff, or at once when the map changes.
//!   [`super::OffloadingKnobs::fails`] makes every creation on a provider fail.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use backon::BackoffBuilder;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::reflector::ObjectRef;
use serde_json::{Value, json};

use super::{Member, REMOTE_ID_LABEL, label, logged};
use crate::emulate::{finalizer_patch, merge_patch};
use crate::emulated_liqo::authentication::VK_REMOTE_ROLE;
use crate::emulated_liqo::resources::{ORIGIN_LABEL, REPLICATED_LABEL, namespace_map_resource};
use crate::emulated_liqo::{name_of, ns_of, tenant_namespace_of};
use ferry_kube::vocab::liqo::{REPLICATION_DESTINATION_LABEL, REPLICATION_LABEL};

/// The finalizer of a replicated NamespaceMap (`namespacemap-controller/finalizer.go`).
pub const FINALIZER: &str = "namespacemap-controller.liqo.io/finalizer";
/// Annotation of a remote namespace: the NamespaceMap (`<namespace>/<name>`) that made it
/// (`pkg/consts/namespace_mapping.go`, `RemoteNamespaceManagedByAnnotationKey`).
pub const MANAGED_BY_ANNOTATION: &str = "liqo.io/managed-by-namespace-map";
/// Annotation of a remote namespace: the consumer's namespace it mirrors
/// (`RemoteNamespaceOriginalNameAnnotationKey`).
pub const ORIGINAL_NAME_ANNOTATION: &str = "liqo.io/original-name";
/// `status.currentMapping.*.phase` (`apis/offloading/v1beta1/namespacemap_types.go`).
pub const ACCEPTED: &str = "Accepted";
/// See [`ACCEPTED`].
pub const CREATION_LOOP_BACK_OFF: &str = "CreationLoopBackOff";
/// See [`ACCEPTED`].
pub const TERMINATING: &str = "Terminating";

/// A consumer's own NamespaceMap (not a copy replicated from another cluster).
pub(super) fn is_local(nm: &DynamicObject) -> bool {
    nm.metadata.labels.as_ref().is_none_or(|l| !l.contains_key(ORIGIN_LABEL))
}

/// `spec.desiredMapping`: local namespace → remote name.
pub fn desired(nm: &DynamicObject) -> BTreeMap<String, String> {
    let m = nm.data.pointer("/spec/desiredMapping").and_then(Value::as_object);
    m.iter().flat_map(|m| m.iter()).filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned()))).collect()
}

/// `status.currentMapping`: local namespace → {remoteNamespace, phase}.
pub fn current(nm: &DynamicObject) -> serde_json::Map<String, Value> {
    nm.data.pointer("/status/currentMapping").and_then(Value::as_object).cloned().unwrap_or_default()
}

/// The virtual node controller's part on `consumer`: a NamespaceMap per remote cluster
/// with a VirtualNode (`ensureNamespaceMapPresence`; the deletion is the VirtualNode's
/// deletion routine's).
pub(super) async fn ensure_presence(consumer: &Member) {
    let ids: BTreeSet<String> = consumer
        .virtual_node_objects
        .state()
        .iter()
        .filter(|v| v.metadata.deletion_timestamp.is_none())
        .filter_map(|v| v.data.pointer("/spec/clusterID").and_then(Value::as_str).map(str::to_owned))
        .collect();
    let maps = consumer.namespace_maps.state();
    let local: Vec<_> = maps.iter().filter(|m| is_local(m)).collect();
    let r = namespace_map_resource();
    for id in &ids {
        // `getters.GetNamespaceMapByLabel` over every namespace, by the three labels.
        let labelled = |m: &DynamicObject| {
            label(&m.metadata, REMOTE_ID_LABEL) == Some(id)
                && label(&m.metadata, REPLICATION_LABEL) == Some("true")
                && label(&m.metadata, REPLICATION_DESTINATION_LABEL) == Some(id)
        };
        if local.iter().any(|m| labelled(m)) {
            continue;
        }
        let tenant = match tenant_namespace_of(&consumer.client, id).await {
            Ok(Ok(Some(ns))) => ns,
            other => {
                tracing::debug!(cluster = %consumer.name, remote = %id, outcome = ?other.map(|o| o.map(|_| ())), "emulated offloading: no tenant namespace for a NamespaceMap yet");
                continue;
            }
        };
        let api: Api<DynamicObject> = Api::namespaced_with(consumer.client.clone(), &tenant, &r);
        let labels = json!({REMOTE_ID_LABEL: id, REPLICATION_LABEL: "true", REPLICATION_DESTINATION_LABEL: id});
        let nm: DynamicObject = serde_json::from_value(json!({"apiVersion": r.api_version, "kind": r.kind, "metadata": {"name": id, "namespace": tenant, "labels": labels}}))
            .expect("a NamespaceMap");
        match api.create(&PostParams::default(), &nm).await {
            // `CreateOrUpdate`: one of that name already there gets the labels.
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let patch = json!({"metadata": {"labels": labels}});
                logged(&consumer.name, || format!("labelling NamespaceMap {tenant}/{id}"), api.patch(id, &PatchParams::default(), &Patch::Merge(&patch)).await);
            }
            r => drop(logged(&consumer.name, || format!("creating NamespaceMap {tenant}/{id}"), r)),
        }
    }
}

/// A NamespaceMap whose last reconcile failed, and when it is reconciled again.
/// `NamespaceMapReconciler.Reconcile` returns the enforcement's error, so controller-runtime
/// requeues the key through the default controller rate limiter (client-go
/// `util/workqueue/default_rate_limiters.go`, `DefaultTypedControllerRateLimiter`: per
/// item 5 ms doubling to 1,000 s, forgotten on success), while a change of the map (its
/// watch: `namespacemap_controller.go`, `SetupWithManager`; the reconcile's own status
/// write included) enqueues it at once. A foreign namespace in the way, which no watch
/// maps to the map, is tried again only as the backoff allows.
pub(super) struct Requeue {
    delays: backon::ExponentialBackoff,
    at: tokio::time::Instant,
    version: Option<String>,
}

/// The failed NamespaceMaps of one provider, by `<namespace>/<name>`.
pub(super) type Requeues = HashMap<String, Requeue>;

/// The rate limiter's per-item delays: 5 ms, 10 ms, ... up to 1,000 s.
fn delays() -> backon::ExponentialBackoff {
    backon::ExponentialBuilder::new().with_min_delay(Duration::from_millis(5)).with_factor(2.0).with_max_delay(Duration::from_secs(1000)).without_max_times().build()
}

/// Whether map `id` (at `version`) waits for its requeue at `now`: it failed, has not
/// changed since, and its time has not come.
fn waits(requeues: &Requeues, id: &str, version: &Option<String>, now: tokio::time::Instant) -> bool {
    requeues.get(id).is_some_and(|r| r.version == *version && now < r.at)
}

/// Records the outcome of a reconcile of `id` (at `version`) that ended at `now`: a
/// failure requeues it after the next delay, a success forgets it.
fn reconciled(requeues: &mut Requeues, id: &str, version: Option<String>, failed: bool, now: tokio::time::Instant) {
    if !failed {
        requeues.remove(id);
        return;
    }
    let r = requeues.entry(id.to_owned()).or_insert_with(|| Requeue { delays: delays(), at: now, version: None });
    r.at = now + r.delays.next().unwrap_or(Duration::from_secs(1000));
    r.version = version;
}

/// The NamespaceMap controller on `provider`: every replicated map's namespaces, status
/// and finalizer, but the maps that wait for their requeue. `fails`: every namespace
/// creation fails.
pub(super) async fn reconcile_as_provider(provider: &Member, fails: bool, requeues: &mut Requeues) {
    for nm in provider.namespace_maps.state() {
        if label(&nm.metadata, REPLICATED_LABEL) != Some("true") {
            continue;
        }
        let Some(origin) = label(&nm.metadata, ORIGIN_LABEL).map(str::to_owned) else { continue };
        let (ns, name) = (ns_of(&nm), name_of(&nm));
        let id = format!("{ns}/{name}");
        let version = nm.metadata.resource_version.clone();
        if waits(requeues, &id, &version, tokio::time::Instant::now()) {
            continue;
        }
        let mut failed = false;
        let api: Api<DynamicObject> = Api::namespaced_with(provider.client.clone(), &ns, &namespace_map_resource());
        let mut now = current(&nm);
        let deleting = nm.metadata.deletion_timestamp.is_some();
        if !deleting
            && let Some(patch) = finalizer_patch(&nm.metadata, FINALIZER, true)
            && logged(&provider.name, || format!("adding the finalizer to NamespaceMap {id}"), api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await).is_none()
        {
            continue;
        }
        let wanted = if deleting { BTreeMap::new() } else { desired(&nm) };
        for (local, remote) in &wanted {
            let (ignorable, outcome) = create_namespace(provider, remote, local, &id, &origin, &ns, fails).await;
            let accepted_before = now.get(local).is_some_and(|m| m["phase"] == ACCEPTED);
            let phase = match outcome {
                Ok(()) => ACCEPTED,
                Err(why) => {
                    tracing::debug!(cluster = %provider.name, namespace_map = %id, "emulated offloading: namespace enforcement failure: {why}");
                    failed = true;
                    if ignorable && accepted_before { ACCEPTED } else { CREATION_LOOP_BACK_OFF }
                }
            };
            now.insert(local.clone(), json!({"remoteNamespace": remote, "phase": phase}));
        }
        for (local, mapping) in current(&nm) {
            if wanted.contains_key(&local) {
                continue;
            }
            let remote = mapping["remoteNamespace"].as_str().unwrap_or_default().to_owned();
            match delete_namespace(provider, &remote, &id).await {
                Ok(true) => drop(now.insert(local, json!({"remoteNamespace": remote, "phase": TERMINATING}))),
                Ok(false) => drop(now.remove(&local)),
                Err(why) => {
                    tracing::debug!(cluster = %provider.name, namespace_map = %id, "emulated offloading: namespace deletion failure: {why}");
                    failed = true;
                }
            }
        }
        reconciled(requeues, &id, version, failed, tokio::time::Instant::now());
        let old = nm.data.get("status").cloned().unwrap_or(json!({}));
        let new = json!({"currentMapping": now});
        if old != new
            && logged(
                &provider.name,
                || format!("setting the status of NamespaceMap {id}"),
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&json!({"status": merge_patch(&old, &new)}))).await,
            )
            .is_none()
        {
            continue;
        }
        if deleting
            && now.is_empty()
            && let Some(patch) = finalizer_patch(&nm.metadata, FINALIZER, false)
        {
            logged(&provider.name, || format!("removing the finalizer of NamespaceMap {id}"), api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await);
        }
    }
}

/// `createNamespace`: the remote namespace `name` for the consumer's `local` one, with its
/// RoleBinding. Whether a failure may keep an accepted mapping (`ignorable`), and the
/// failure.
async fn create_namespace(provider: &Member, name: &str, local: &str, map_id: &str, origin: &str, map_ns: &str, fails: bool) -> (bool, Result<(), String>) {
    let api: Api<Namespace> = Api::all(provider.client.clone());
    let existing = match provider.remote_namespaces.get(&ObjectRef::new(name)) {
        Some(n) => (*n).clone(),
        None if fails => return (false, Err(format!("failed to create namespace {name:?}: emulated failure"))),
        None => {
            let obj: Namespace = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name,
                "annotations": {MANAGED_BY_ANNOTATION: map_id, ORIGINAL_NAME_ANNOTATION: local}, "labels": {REMOTE_ID_LABEL: origin}}}))
            .expect("a namespace");
            match api.create(&PostParams::default(), &obj).await {
                Ok(n) => n,
                // Not labelled (so not cached), or not cached yet: read it.
                Err(kube::Error::Api(s)) if s.code == 409 => match api.get_opt(name).await {
                    Ok(Some(n)) => n,
                    Ok(None) => return (true, Err(format!("namespace {name:?} is being replaced"))),
                    Err(e) => return (true, Err(format!("failed to retrieve namespace {name:?}: {e}"))),
                },
                Err(e) => return (false, Err(format!("failed to create namespace {name:?}: {e}"))),
            }
        }
    };
    if existing.metadata.annotations.as_ref().and_then(|a| a.get(MANAGED_BY_ANNOTATION)).map(String::as_str) != Some(map_id) {
        return (false, Err(format!("namespace {name:?} already exists and it is not managed by NamespaceMap {map_id:?}")));
    }
    // The virtual kubelet's permissions there, named after the map's namespace.
    if provider.bindings.get(&ObjectRef::new(map_ns).within(name)).is_none() {
        let binding: RoleBinding = serde_json::from_value(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": map_ns, "namespace": name, "annotations": {MANAGED_BY_ANNOTATION: map_id},
                         "labels": {"app.kubernetes.io/managed-by": "liqo", REMOTE_ID_LABEL: origin}},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": origin}],
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": VK_REMOTE_ROLE}}))
        .expect("a RoleBinding");
        match Api::<RoleBinding>::namespaced(provider.client.clone(), name).create(&PostParams::default(), &binding).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            // E.g. the namespace is terminating.
            Err(e) => return (true, Err(format!("failed to enforce role binding {name}/{map_ns}: {e}"))),
        }
    }
    (true, Ok(()))
}

/// `deleteNamespace`: whether the remote namespace `name` still exists (deleted now or
/// terminating); one the map does not manage counts as gone.
async fn delete_namespace(provider: &Member, name: &str, map_id: &str) -> Result<bool, String> {
    let api: Api<Namespace> = Api::all(provider.client.clone());
    let n = match api.get_opt(name).await {
        Ok(None) => return Ok(false),
        Ok(Some(n)) => n,
        Err(e) => return Err(format!("failed to retrieve namespace {name:?}: {e}")),
    };
    if n.metadata.annotations.as_ref().and_then(|a| a.get(MANAGED_BY_ANNOTATION)).map(String::as_str) != Some(map_id) {
        return Ok(false);
    }
    if n.metadata.deletion_timestamp.is_some() {
        return Ok(true);
    }
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(format!("failed to delete namespace {name:?}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed map waits 5 ms, then 10, 20, ... up to 1,000 s, unless it changes (then at
    /// once); a success forgets its failures.
    #[test]
    fn a_failed_map_is_requeued_with_the_rate_limiters_backoff() {
        let mut requeues = Requeues::new();
        let t0 = tokio::time::Instant::now();
        let v = |s: &str| Some(s.to_owned());
        assert!(!waits(&requeues, "t/m", &v("1"), t0), "never failed: reconciled");
        let mut now = t0;
        let mut waited = Vec::new();
        for _ in 0..20 {
            reconciled(&mut requeues, "t/m", v("2"), true, now);
            let at = requeues["t/m"].at;
            assert!(waits(&requeues, "t/m", &v("2"), at - Duration::from_nanos(1)), "waits until its time");
            assert!(!waits(&requeues, "t/m", &v("2"), at), "then is reconciled");
            assert!(!waits(&requeues, "t/m", &v("3"), now), "a changed map is reconciled at once");
            waited.push(at - now);
            now = at;
        }
        // To the millisecond (backon's factor is an f32).
        let ms: Vec<u128> = waited.iter().map(|d| (d.as_micros() + 500) / 1000).collect();
        assert_eq!(&ms[..5], &[5, 10, 20, 40, 80], "{waited:?}");
        assert_eq!(ms[19], 1_000_000, "capped: {waited:?}");
        reconciled(&mut requeues, "t/m", v("4"), false, now);
        assert!(requeues.is_empty(), "forgotten on success");
        reconciled(&mut requeues, "t/m", v("4"), true, now);
        assert_eq!(requeues["t/m"].at - now, Duration::from_millis(5), "the backoff starts over");
    }
}

//! The emulated virtual kubelet of each consumer: a pod bound to a virtual node (known by
//! its labels `liqo.io/type=virtual-node` and `liqo.io/remote-cluster-id`, never by its
//! name) is reflected into its namespace's remote namespace on the provider, once the
//! provider's NamespaceMap controller has made it (the mapping `Accepted`); the provider's
//! scheduler and emulated kubelet run it; the remote status is mirrored onto the local pod;
//! deletions propagate both ways; a pod it offloads is labelled `liqo.io/shadowPod=true`
//! (`podns.go`, `HandleLabels`), what a VirtualNode's drain selects. While a selected provider's remote namespace is not
//! there (being made, or failing), the pod waits, bound and Pending; a pod on a provider no
//! longer selected, or in a namespace no longer offloaded, is deleted (its controller
//! re-creates it).
//!
//! Reflections carry upstream's reflection labels (`pkg/virtualKubelet/forge/meta.go`,
//! `ReflectionLabels`: `offloading.liqo.io/origin` and `offloading.liqo.io/destination`)
//! beside the local pod's own; a reflection's local namespace is its remote namespace's
//! `liqo.io/original-name` annotation (set by the NamespaceMap controller). Not upstream:
//! Liqo's virtual kubelet writes a ShadowPod with its ResourceSlice identity and the
//! provider's ShadowPod controller makes the Pod (`forge/pods.go`, `RemoteShadowPod`;
//! `shadowpod-controller`); here the Pod is written directly, with an administrator's
//! client (`../shared/crds` has no ShadowPod CRD), keeping only its containers' name,
//! image and resources, and marked with the local pod's uid
//! ([`ORIGIN_POD_UID_ANNOTATION`], the emulation's own) so that a reflection of an older
//! incarnation of the same name is told apart.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::reflector::ObjectRef;
use serde_json::{Value, json};

use super::{Member, Memory, NOT_ALLOWED_TAINT, Offload, label, logged};
use super::namespace_maps::ORIGINAL_NAME_ANNOTATION;
use ferry_kube::vocab::liqo::SHADOW_POD_LABEL;

/// Label of a reflected object: the cluster it comes from (`forge/meta.go`, `LiqoOriginClusterIDKey`).
pub const REFLECTION_ORIGIN_LABEL: &str = "offloading.liqo.io/origin";
/// Label of a reflected object: the cluster it is reflected to (`LiqoDestinationClusterIDKey`).
pub const REFLECTION_DESTINATION_LABEL: &str = "offloading.liqo.io/destination";
/// Annotation of a reflected pod: the uid of the local pod it reflects (the emulation's own).
pub const ORIGIN_POD_UID_ANNOTATION: &str = "offloading.liqo.io/origin-pod-uid";

/// The pods of the consumer: the virtual kubelet for those bound to virtual nodes, and
/// removal of reflections nobody reflects any more.
pub(super) async fn pods(consumer: &Member, members: &[Member], offloads: &BTreeMap<String, Offload>, memory: &mut Memory) {
    let Memory { reflected, virtual_nodes: provider_of_node, .. } = memory;
    let providers: HashMap<&str, &Member> = members.iter().filter(|m| m.name != consumer.name).map(|m| (m.name.as_str(), m)).collect();
    // Reflections of this consumer's pods, by (provider, local namespace, name).
    let mut reflections: HashMap<(String, String, String), Vec<Arc<Pod>>> = HashMap::new();
    for p in providers.values() {
        for r in p.pods.state() {
            if label(&r.metadata, REFLECTION_ORIGIN_LABEL) != Some(&consumer.name) {
                continue;
            }
            let rns = r.metadata.namespace.clone().unwrap_or_default();
            // The remote namespace says which local one it mirrors (gone: left to its deletion).
            let origin = p
                .remote_namespaces
                .get(&ObjectRef::new(&rns))
                .filter(|n| label(&n.metadata, super::REMOTE_ID_LABEL) == Some(&consumer.name))
                .and_then(|n| n.metadata.annotations.as_ref()?.get(ORIGINAL_NAME_ANNOTATION).cloned())
                .unwrap_or_default();
            reflections.entry((p.name.clone(), origin, r.metadata.name.clone().unwrap_or_default())).or_default().push(r);
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
            // Selected, its remote namespace not there (yet): the virtual kubelet waits for it.
            if offload.is_some_and(|o| !o.terminating && o.selected.contains(&provider)) {
                continue;
            }
            // No remote namespace to run in: the pod goes, its controller recreates it. Pods
            // that got there on their own in a namespace never offloaded are left alone.
            if offload.is_some() || tolerates_virtual_nodes(pod) {
                logged(&consumer.name, || format!("deleting pod {ns}/{name} from {node}"), api.delete(&name, &by_uid(None)).await);
            }
            continue;
        };
        // `podns.go`, `HandleLabels`: a pod the virtual kubelet offloads is labelled so
        // before it is reflected (a VirtualNode's drain selects these).
        if label(&pod.metadata, SHADOW_POD_LABEL) != Some("true") {
            let labelled = json!({"metadata": {"labels": {SHADOW_POD_LABEL: "true"}}});
            logged(&consumer.name, || format!("labelling pod {ns}/{name} offloaded"), api.patch(&name, &PatchParams::default(), &Patch::Merge(&labelled)).await);
        }
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
    labels.insert(REFLECTION_ORIGIN_LABEL.into(), consumer.name.clone());
    labels.insert(REFLECTION_DESTINATION_LABEL.into(), provider.name.clone());
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

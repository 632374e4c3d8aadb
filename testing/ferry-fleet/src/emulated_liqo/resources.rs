//! Emulated Liqo resource sharing on one member (liqotech/liqo
//! `pkg/liqo-controller-manager/authentication/` and `virtualnodecreator-controller/`):
//!
//! - **Local ResourceSlice controller** (`localresourceslice-controller`): a consumer's
//!   slice gets `spec.consumerClusterID`, `spec.providerClusterID` (from its
//!   remote-cluster-id label) and `spec.csr`: a CSR signed with the cluster's key for
//!   common name `<slice>-<hash of the consumer id>`, organization the consumer id
//!   (`csr.go`, `GenerateCSRForResourceSlice`).
//! - **Replication** (the CRD replicator, `internal/crdReplicator`; ResourceSlices here,
//!   NamespaceMaps alike, [`replicate`]): once the consumer's
//!   control-plane Identity toward the provider has its kubeconfig Secret (annotated with
//!   the provider's tenant namespace, the Identity's `spec.namespace`), a slice in that
//!   Secret's namespace labelled `liqo.io/replication=true` and `liqo.io/remoteID=<provider>`
//!   gets the finalizer `crdreplicator.liqo.io/resource` and is copied into the annotated
//!   namespace on the provider (labels `liqo.io/originID`, `liqo.io/replicated=true`,
//!   `liqo.io/replication=false`); the provider's status is copied back; the copy goes
//!   with its origin, which keeps its finalizer until the copy has vanished. Without the
//!   labels, or in another namespace, nothing reaches the provider. Neither namespace is
//!   derived from a cluster id: tenant namespaces may have any name.
//! - **Remote ResourceSlice controller** (`remoteresourceslice-controller`): on the
//!   provider, the copy must sit in the consumer's tenant namespace (found by labels,
//!   `GetNamespace`) next to its Tenant (found by label, `GetTenantByClusterID`);
//!   its CSR must match the Tenant's public key, common name and organization
//!   (`CheckCSRForResourceSlice`) — else `Authentication: Denied` — and is then signed
//!   (`status.authParams`); an active Tenant's slice gets `Resources: Accepted` and
//!   `status.resources`: what the slice asks, else the provider's spare capacity.
//! - **VirtualNode creator** (`virtualnodecreator_controller.go`): a slice annotated
//!   `liqo.io/create-virtual-node` whose conditions are all Accepted gets a VirtualNode of
//!   the slice's name, owned by it; the virtual kubelet (`pkg/vkMachinery/forge/forge.go`)
//!   registers a Node of the VirtualNode's name, labelled `liqo.io/type=virtual-node` and
//!   with the provider's id, tainted `virtual-node.liqo.io/not-allowed=true:NoExecute`,
//!   Ready with the slice's resources. Nodes whose VirtualNode is gone go. A VirtualNode
//!   gets `virtualnode-controller.liqo.io/finalizer` (`virtualnode-controller/`); being
//!   deleted (`deletion-routine.go`), its Node is cordoned and drained: the pods the
//!   virtual kubelet offloaded onto it are evicted (PodDisruptionBudgets hold them), or
//!   deleted at once when the provider is dead (`drain.go`); once they are gone the Node
//!   goes, then the NamespaceMaps toward its cluster when it was the cluster's last, then
//!   the finalizer.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, EvictParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::authentication::{IDENTITY_TYPE_LABEL, REMOTE_TENANT_NAMESPACE_ANNOTATION, auth, authenticated_toward, issue, private_key};
use super::{MANAGER, Member, apply, ar, event, keys, name_of, now, ns_of, set_status, tenant_namespace_of};
use crate::emulate::finalizer_patch;
use ferry_kube::quantity::{millicores, units};
use ferry_kube::vocab::liqo::{
    CREATE_VIRTUAL_NODE_ANNOTATION, REMOTE_ID_LABEL, REPLICATION_DESTINATION_LABEL, REPLICATION_LABEL, SHADOW_POD_LABEL, TYPE_LABEL, TYPE_VIRTUAL_NODE,
};

/// Label on a replicated copy: the cluster it came from (`pkg/consts/replication.go`).
pub(crate) const ORIGIN_LABEL: &str = "liqo.io/originID";
/// Label on a replicated copy, `true` (`pkg/consts/replication.go`, `ReplicationStatusLabel`).
pub(crate) const REPLICATED_LABEL: &str = "liqo.io/replicated";
/// Label the replicator drops from a copy (`pkg/consts/replication.go`, `LocalResourceOwnership`).
const OWNERSHIP_LABEL: &str = "liqo.io/ownership";

/// Where the CRD replicator reflects toward one provider: the local namespace it watches
/// and the provider's namespace it writes to.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Reflection {
    local: String,
    remote: String,
    /// The kubeconfig Secret's name (in `local`): the reflector's credential toward the
    /// provider (`setupReflectionToPeeringCluster`: a dynamic client from its config).
    secret: String,
}

/// The CRD replicator's reflectors, by provider id, from the control-plane kubeconfig
/// Secrets (`internal/crdReplicator/crdReplicator-operator.go`, `Reconcile`: Secrets
/// labelled `liqo.io/remote-cluster-id` and `liqo.io/identity-type=ControlPlane`; one
/// without the `liqo.io/remote-tenant-namespace` annotation is refused, `validateSecret`;
/// more than one for a cluster is an error, `getters.GetControlPlaneKubeconfigSecretByClusterID`,
/// and nothing is reflected; local = the Secret's namespace, remote = the annotation).
/// A Secret being deleted keeps its reflector while it holds [`OPERATOR_FINALIZER`]
/// ([`stop_reflections`]).
fn reflections(secrets: &[Secret]) -> BTreeMap<String, Reflection> {
    let mut by_id: BTreeMap<String, Vec<&Secret>> = BTreeMap::new();
    let holds = |s: &Secret| s.metadata.finalizers.as_ref().is_some_and(|f| f.iter().any(|f| f == OPERATOR_FINALIZER));
    for s in secrets.iter().filter(|s| s.metadata.deletion_timestamp.is_none() || holds(s)) {
        let labels = s.metadata.labels.as_ref();
        if labels.and_then(|l| l.get(IDENTITY_TYPE_LABEL)).map(String::as_str) != Some("ControlPlane") {
            continue;
        }
        if let Some(id) = labels.and_then(|l| l.get(REMOTE_ID_LABEL)) {
            by_id.entry(id.clone()).or_default().push(s);
        }
    }
    by_id
        .into_iter()
        .filter_map(|(id, s)| {
            let [s] = s.as_slice() else { return None };
            let remote = s.metadata.annotations.as_ref()?.get(REMOTE_TENANT_NAMESPACE_ANNOTATION)?.clone();
            Some((id, Reflection { local: s.metadata.namespace.clone()?, remote, secret: s.metadata.name.clone()? }))
        })
        .collect()
}

/// The labels of a copy (`internal/crdReplicator/reflection/handler.go`, `mutateLabelsForRemote`).
fn labels_for_remote(mut labels: BTreeMap<String, String>, local_id: &str) -> BTreeMap<String, String> {
    labels.insert(REPLICATION_LABEL.into(), "false".into());
    labels.insert(REPLICATED_LABEL.into(), "true".into());
    labels.insert(ORIGIN_LABEL.into(), local_id.to_owned());
    labels.insert(REMOTE_ID_LABEL.into(), local_id.to_owned());
    labels.remove(OWNERSHIP_LABEL);
    labels
}
/// Taint of every virtual node (`=true:NoExecute`), as Liqo's: only tolerating pods go there.
pub use ferry_kube::vocab::liqo::VIRTUAL_NODE_TOLERATION_KEY as NOT_ALLOWED_TAINT;

fn slices(client: &kube::Client, ns: Option<&str>) -> Api<DynamicObject> {
    let r = auth("ResourceSlice", "resourceslices");
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &r),
        None => Api::all_with(client.clone(), &r),
    }
}

fn label(o: &DynamicObject, key: &str) -> Option<String> {
    o.metadata.labels.as_ref()?.get(key).cloned()
}

fn condition<'a>(s: &'a DynamicObject, type_: &str) -> Option<&'a str> {
    s.data.pointer("/status/conditions")?.as_array()?.iter().find(|c| c["type"] == type_)?.get("status")?.as_str()
}

/// Spare CPU and memory of a cluster's real (not virtual) nodes: allocatable less the
/// requests of the pods bound to them.
async fn capacity(client: &kube::Client) -> Result<(String, String), kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let (mut cpu_m, mut mem) = (0i64, 0i64);
    let mut real = HashSet::new();
    for n in nodes.list(&ListParams::default()).await?.items {
        if n.metadata.labels.as_ref().is_some_and(|l| l.get(TYPE_LABEL).map(String::as_str) == Some(TYPE_VIRTUAL_NODE)) {
            continue;
        }
        real.insert(n.metadata.name.clone().unwrap_or_default());
        let alloc = n.status.and_then(|s| s.allocatable).unwrap_or_default();
        cpu_m += alloc.get("cpu").map_or(0, |q| millicores(&q.0).unwrap_or(0));
        mem += alloc.get("memory").map_or(0, |q| units(&q.0).unwrap_or(0));
    }
    let pods: Api<Pod> = Api::all(client.clone());
    for p in pods.list(&ListParams::default().fields("status.phase!=Succeeded,status.phase!=Failed")).await?.items {
        let Some(spec) = p.spec else { continue };
        if !spec.node_name.as_ref().is_some_and(|n| real.contains(n)) {
            continue;
        }
        for c in &spec.containers {
            let req = c.resources.as_ref().and_then(|r| r.requests.as_ref());
            cpu_m -= req.and_then(|r| r.get("cpu")).map_or(0, |q| millicores(&q.0).unwrap_or(0));
            mem -= req.and_then(|r| r.get("memory")).map_or(0, |q| units(&q.0).unwrap_or(0));
        }
    }
    Ok((format!("{}m", cpu_m.max(0)), format!("{}Mi", mem.max(0) / (1024 * 1024))))
}

/// The consumer's side: the local slice controller (what a slice's spec lacks).
pub(super) async fn local_slices(m: &Member) -> Result<(), kube::Error> {
    let all = slices(&m.client, None).list(&ListParams::default()).await?.items;
    let private = private_key(&m.client).await?;
    for s in all.iter().filter(|s| label(s, ORIGIN_LABEL).is_none() && s.metadata.deletion_timestamp.is_none()) {
        let (name, ns) = (name_of(s), ns_of(s));
        let mut spec = serde_json::Map::new();
        if s.data.pointer("/spec/consumerClusterID").is_none() {
            spec.insert("consumerClusterID".into(), json!(m.name));
        }
        if s.data.pointer("/spec/providerClusterID").is_none()
            && let Some(p) = label(s, REMOTE_ID_LABEL)
        {
            spec.insert("providerClusterID".into(), json!(p));
        }
        if s.data.pointer("/spec/csr").and_then(Value::as_str).is_none_or(str::is_empty)
            && let Some(private) = &private
            && let Ok(csr) = keys::csr(private, &keys::resource_slice_common_name(&name, &m.name), &m.name)
        {
            spec.insert("csr".into(), json!(base64::Engine::encode(&base64::engine::general_purpose::STANDARD, csr)));
        }
        if !spec.is_empty() {
            slices(&m.client, Some(&ns)).patch(&name, &PatchParams::apply(MANAGER), &Patch::Merge(&json!({"spec": spec}))).await?;
        }
    }
    Ok(())
}

/// The kinds the CRD replicator copies to providers, the spec out and the status back
/// (`internal/crdReplicator/resources/resources.go`, `GetResourcesToReplicate`: both
/// `OwnershipShared`; Renews, the third, are not emulated).
fn replicated_kinds() -> [ApiResource; 2] {
    [auth("ResourceSlice", "resourceslices"), namespace_map_resource()]
}

/// The NamespaceMap kind (`offloading.liqo.io/v1beta1`).
pub fn namespace_map_resource() -> ApiResource {
    ar("offloading.liqo.io", "v1beta1", "NamespaceMap", "namespacemaps")
}

/// The ForeignCluster kind (`core.liqo.io/v1beta1`, cluster-scoped).
pub fn foreign_cluster_resource() -> ApiResource {
    ar("core.liqo.io", "v1beta1", "ForeignCluster", "foreignclusters")
}

/// The CRD replicator of a consumer: each reflector its control-plane kubeconfig Secret
/// starts copies the objects of [`replicated_kinds`] of that Secret's namespace labelled
/// for replication toward its provider (`reflection/reflector.go`, `StartForResource`:
/// the local lister is `ByNamespace(localNamespace)`) into the annotated namespace there
/// (`reflection/handler.go`, `createRemoteObject`), as this cluster: with the
/// control-plane Identity's kubeconfig, which the provider's tenant controller bound to
/// its tenant namespace (`authentication.rs`), not with an administrator's credentials.
pub(super) async fn replicate(m: &Member) -> Result<(), kube::Error> {
    let kubeconfigs = Api::<Secret>::all(m.client.clone()).list(&ListParams::default().labels(&format!("{REMOTE_ID_LABEL},{IDENTITY_TYPE_LABEL}=ControlPlane"))).await?;
    let reflections = reflections(&kubeconfigs.items);
    let mut clients = BTreeMap::new();
    for (provider, r) in &reflections {
        let secret = kubeconfigs.items.iter().find(|s| s.metadata.namespace.as_deref() == Some(r.local.as_str()) && s.metadata.name.as_deref() == Some(r.secret.as_str()));
        if let Some(s) = secret
            && let Some(c) = m.client_from(s).await
        {
            clients.insert(provider.clone(), c);
        }
    }
    // The state controller's verdicts ([`judge`]), as they stand at this pass.
    let dead = m.unreachable.lock().expect("unreachable lock").clone();
    for kind in replicated_kinds() {
        let all = Api::<DynamicObject>::all_with(m.client.clone(), &kind).list(&ListParams::default()).await?.items;
        // What the replicator's local listers hold (`reflection/manager.go`, `localLabelSelector`).
        let mut origins = HashSet::new();
        for s in all.iter().filter(|s| label(s, ORIGIN_LABEL).is_none()) {
            let (Some("true"), Some(provider)) = (label(s, REPLICATION_LABEL).as_deref(), label(s, REPLICATION_DESTINATION_LABEL)) else { continue };
            let (name, ns) = (name_of(s), ns_of(s));
            origins.insert((ns.clone(), name.clone()));
            let here: Api<DynamicObject> = Api::namespaced_with(m.client.clone(), &ns, &kind);
            let reflection = clients.get(&provider).zip(reflections.get(&provider).filter(|r| r.local == ns));
            if s.metadata.deletion_timestamp.is_some() {
                let Some(patch) = finalizer_patch(&s.metadata, REPLICATOR_FINALIZER, false) else { continue };
                if copy_vanished(reflection, dead.contains(&provider), &kind, &name).await {
                    here.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
                }
                continue;
            }
            let Some((pc, r)) = reflection else { continue };
            // `handle`: the local object holds the finalizer before its copy exists.
            if let Some(patch) = finalizer_patch(&s.metadata, REPLICATOR_FINALIZER, true) {
                here.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
            }
            let there: Api<DynamicObject> = Api::namespaced_with(pc.clone(), &r.remote, &kind);
            let labels = labels_for_remote(s.metadata.labels.clone().unwrap_or_default(), &m.name);
            let copy = json!({"apiVersion": kind.api_version, "kind": kind.kind,
                "metadata": {"name": name, "namespace": r.remote, "labels": labels}, "spec": s.data.get("spec").cloned().unwrap_or(json!({}))});
            match there.get_opt(&name).await {
                Ok(Some(remote)) => {
                    // The spec as a merge patch, as upstream replaces it (`handler.go`,
                    // `updateRemoteObjectSpec`): an applied map whose last key goes would be
                    // null, which the NamespaceMap schema refuses.
                    let (theirs, ours) = (remote.data.get("spec").unwrap_or(&Value::Null), s.data.get("spec").unwrap_or(&Value::Null));
                    if theirs != ours {
                        let patch = json!({"spec": crate::emulate::merge_patch(theirs, ours)});
                        there.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
                    }
                    let (ours, theirs) = (s.data.get("status").unwrap_or(&Value::Null), remote.data.get("status").unwrap_or(&Value::Null));
                    if !theirs.is_null() && ours != theirs {
                        let patch = json!({"status": crate::emulate::merge_patch(ours, theirs)});
                        here.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
                    }
                }
                Ok(None) => {
                    if let Err(e) = apply(&there, &copy).await {
                        // The provider's tenant namespace may not be there yet: retried.
                        tracing::debug!(error = %e, kind = %kind.kind, "emulated Liqo: replicating");
                    }
                }
                Err(e) => tracing::debug!(error = %e, kind = %kind.kind, "emulated Liqo: reading a replicated copy"),
            }
        }
        // Copies on providers whose origin here is gone (`reflection/handler.go`, `handle`:
        // no local object of that name in the reflector's local namespace), in the namespace
        // each reflector writes to, among the copies its remote informer sees (`reflector.go`,
        // `remoteLabelSelector`).
        for (provider, r) in &reflections {
            let Some(pc) = clients.get(provider).filter(|_| provider != &m.name) else { continue };
            let there: Api<DynamicObject> = Api::namespaced_with(pc.clone(), &r.remote, &kind);
            let Ok(list) = there.list(&ListParams::default().labels(&format!("{ORIGIN_LABEL}={},{REPLICATED_LABEL}=true", m.name))).await else { continue };
            for c in list.items.iter().filter(|c| c.metadata.deletion_timestamp.is_none()) {
                if !origins.contains(&(r.local.clone(), name_of(c))) {
                    let _ = there.delete(&name_of(c), &DeleteParams::default()).await;
                }
            }
        }
    }
    stop_reflections(m, &kubeconfigs.items, &reflections, &clients, &dead).await
}

/// The CRD replicator's finalizer on a control-plane kubeconfig Secret
/// (`internal/crdReplicator/crdReplicator-operator.go`, `finalizer`).
pub const OPERATOR_FINALIZER: &str = "crdreplicator.liqo.io/operator";

/// The replicator's operator on its kubeconfig Secrets (`crdReplicator-operator.go`,
/// `Reconcile`): a valid one gets [`OPERATOR_FINALIZER`]; one being deleted keeps it, and
/// its reflector keeps working, until the reflector stops, which it does only once no
/// object to replicate is left in the local namespace and no copy in the remote one
/// (`reflection/reflector.go`, `stop`/`stopForResource`: the remote check is skipped when
/// the provider is declared dead, `RemoteReachable`, or forbids the listing; any other
/// error keeps it). So a tenant namespace being deleted waits for its objects' copies to
/// go from a provider that answers, and for ever for one that never does, unless declared
/// dead.
async fn stop_reflections(
    m: &Member,
    secrets: &[Secret],
    reflections: &BTreeMap<String, Reflection>,
    clients: &BTreeMap<String, kube::Client>,
    dead: &HashSet<String>,
) -> Result<(), kube::Error> {
    for s in secrets {
        let (ns, name) = (s.metadata.namespace.clone().unwrap_or_default(), s.metadata.name.clone().unwrap_or_default());
        let here: Api<Secret> = Api::namespaced(m.client.clone(), &ns);
        let Some(provider) = s.metadata.labels.as_ref().and_then(|l| l.get(REMOTE_ID_LABEL)).cloned() else { continue };
        // `validateSecret`: without the remote tenant namespace nothing is done with it.
        if s.metadata.annotations.as_ref().and_then(|a| a.get(REMOTE_TENANT_NAMESPACE_ANNOTATION)).is_none() {
            continue;
        }
        if s.metadata.deletion_timestamp.is_none() {
            if let Some(patch) = finalizer_patch(&s.metadata, OPERATOR_FINALIZER, true) {
                here.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
            }
            continue;
        }
        let Some(patch) = finalizer_patch(&s.metadata, OPERATOR_FINALIZER, false) else { continue };
        let reachable = !dead.contains(&provider);
        let reflection = reflections.get(&provider).filter(|r| r.secret == name && r.local == ns);
        let mut drained = true;
        for kind in replicated_kinds() {
            let local = Api::<DynamicObject>::namespaced_with(m.client.clone(), &ns, &kind)
                .list(&ListParams::default().labels(&format!("{REPLICATION_LABEL}=true,{REPLICATION_DESTINATION_LABEL}")))
                .await?;
            if !local.items.is_empty() {
                drained = false;
                break;
            }
            let (Some(r), Some(pc), true) = (reflection, clients.get(&provider), reachable) else { continue };
            let there: Api<DynamicObject> = Api::namespaced_with(pc.clone(), &r.remote, &kind);
            match there.list(&ListParams::default().labels(&format!("{ORIGIN_LABEL}={},{REPLICATED_LABEL}=true", m.name))).await {
                Ok(l) if l.items.is_empty() => {}
                Err(kube::Error::Api(e)) if e.code == 403 => {}
                Ok(_) | Err(_) => {
                    drained = false;
                    break;
                }
            }
        }
        if drained {
            here.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        }
    }
    Ok(())
}

/// The VirtualNode controller's finalizer (`virtualnode_controller.go`).
pub const VIRTUAL_NODE_FINALIZER: &str = "virtualnode-controller.liqo.io/finalizer";

/// The VirtualNode controller's deletion routine on a VirtualNode being deleted
/// (`deletion-routine.go`, `handle`): the VirtualNode's `Node` condition says `Draining`,
/// its Node is cordoned and drained ([`drain`]) and, once no pod is left on it, deleted;
/// then, when it is the last VirtualNode of its cluster, the NamespaceMaps toward that
/// cluster are deleted (not awaited: `namespacemap.go`, `ensureNamespaceMapAbsence`),
/// then the finalizer. Returns whether the Node is to be kept (still draining).
async fn virtual_node_deletion(m: &Member, here: &Api<DynamicObject>, nodes: &Api<Node>, vn: &DynamicObject, all: &[DynamicObject]) -> Result<bool, kube::Error> {
    let Some(patch) = finalizer_patch(&vn.metadata, VIRTUAL_NODE_FINALIZER, false) else { return Ok(false) };
    let node = name_of(vn);
    if let Some(n) = nodes.get_opt(&node).await? {
        let draining = json!({"status": {"conditions": [{"type": "Node", "status": "Draining", "lastTransitionTime": now()}]}});
        let already = vn.data.pointer("/status/conditions").and_then(Value::as_array).is_some_and(|cs| cs.iter().any(|c| c["type"] == "Node" && c["status"] == "Draining"));
        if !already {
            here.patch_status(&node, &PatchParams::default(), &Patch::Merge(&draining)).await?;
        }
        let provider = vn.data.pointer("/spec/clusterID").and_then(Value::as_str).unwrap_or_default();
        if !drain(m, nodes, &n, provider).await? {
            return Ok(true);
        }
    }
    crate::emulate::absent(nodes.delete(&node, &DeleteParams::default()).await)?;
    let cluster = vn.data.pointer("/spec/clusterID").and_then(Value::as_str).unwrap_or_default();
    if all.iter().filter(|v| v.data.pointer("/spec/clusterID").and_then(Value::as_str) == Some(cluster)).count() == 1 {
        let maps: Api<DynamicObject> = Api::all_with(m.client.clone(), &namespace_map_resource());
        let listed = match maps.list(&ListParams::default().labels(&format!("{REPLICATION_DESTINATION_LABEL}={cluster}"))).await {
            Ok(l) => l.items,
            // No NamespaceMap kind served: none to delete.
            Err(kube::Error::Api(e)) if e.code == 404 => Vec::new(),
            Err(e) => return Err(e),
        };
        for nm in listed.iter().filter(|nm| nm.metadata.deletion_timestamp.is_none()) {
            let api: Api<DynamicObject> = Api::namespaced_with(m.client.clone(), &ns_of(nm), &namespace_map_resource());
            crate::emulate::absent(api.delete(&name_of(nm), &DeleteParams::default()).await)?;
        }
    }
    here.patch(&name_of(vn), &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(false)
}

/// The deletion routine's cordon and drain of a virtual node (`cordon.go`, `cordonNode`;
/// `drain.go`, `drainNode`): the Node is made unschedulable; the pods on it that the
/// virtual kubelet offloaded ([`SHADOW_POD_LABEL`]), but those of a DaemonSet and mirror
/// pods, are evicted through the Eviction API, so a PodDisruptionBudget holds them (its
/// refusal, 429, ends this node's drain for the pass; the next pass tries again, as
/// upstream's rate-limited requeue does), or deleted
/// at once without grace when the provider is dead (`foreigncluster.IsDead`; no
/// ForeignCluster counts as dead). Returns whether none is left: upstream waits for each
/// evicted pod to be deleted (the virtual kubelet's part) before it deletes the Node.
async fn drain(m: &Member, nodes: &Api<Node>, n: &Node, provider: &str) -> Result<bool, kube::Error> {
    let node = n.metadata.name.as_deref().unwrap_or_default();
    if n.spec.as_ref().and_then(|s| s.unschedulable) != Some(true) {
        nodes.patch(node, &PatchParams::default(), &Patch::Merge(&json!({"spec": {"unschedulable": true}}))).await?;
    }
    let lp = ListParams::default().fields(&format!("spec.nodeName={node}")).labels(&format!("{SHADOW_POD_LABEL}=true"));
    let pods: Vec<Pod> = Api::<Pod>::all(m.client.clone())
        .list(&lp)
        .await?
        .items
        .into_iter()
        .filter(|p| !p.metadata.owner_references.iter().flatten().any(|o| o.kind == "DaemonSet"))
        .filter(|p| !p.metadata.annotations.as_ref().is_some_and(|a| a.contains_key("kubernetes.io/config.mirror")))
        .collect();
    if pods.is_empty() {
        return Ok(true);
    }
    let fcs = Api::<DynamicObject>::all_with(m.client.clone(), &foreign_cluster_resource());
    let fc = fcs.list(&ListParams::default().labels(&format!("{REMOTE_ID_LABEL}={provider}"))).await?.items.into_iter().next();
    let dead = fc.as_ref().is_none_or(is_dead);
    for p in pods.iter().filter(|p| p.metadata.deletion_timestamp.is_none() || dead) {
        let (ns, name) = (p.metadata.namespace.clone().unwrap_or_default(), p.metadata.name.clone().unwrap_or_default());
        let api: Api<Pod> = Api::namespaced(m.client.clone(), &ns);
        if dead {
            crate::emulate::absent(api.delete(&name, &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() }).await)?;
            continue;
        }
        let evictions: Api<Pod> = Api::namespaced(m.evictor.clone(), &ns);
        match evictions.evict(&name, &EvictParams::default()).await {
            // A PodDisruptionBudget refuses it: upstream's `evictPods` stops at the first
            // refusal and the routine is requeued; the other VirtualNodes go on meanwhile.
            Err(kube::Error::Api(e)) if e.code == 429 => {
                tracing::debug!(member = %m.name, pod = %format!("{ns}/{name}"), reason = %e.message, "emulated Liqo: eviction refused");
                break;
            }
            r => crate::emulate::absent(r)?,
        }
    }
    Ok(false)
}

/// The CRD replicator's finalizer on the local objects it copies (`reflection/handler.go`):
/// a local object being deleted keeps it until its copy on the provider has vanished.
pub const REPLICATOR_FINALIZER: &str = "crdreplicator.liqo.io/resource";

/// Whether the provider's copy of a local object being deleted has vanished, deleting it
/// when it is still there (`handler.go`, `deleteRemoteObject`): gone, or not readable
/// (Forbidden: the provider removed the permission), counts as vanished; a copy deleted
/// now or still finalizing does not, nor does a provider that does not answer (retried).
/// A provider judged dead ([`judge`]) counts as vanished without being asked.
/// Without a reflection toward the provider (no control-plane kubeconfig: its Secret,
/// kept by [`OPERATOR_FINALIZER`] while objects remain, is gone) the copy counts as
/// vanished too.
async fn copy_vanished(reflection: Option<(&kube::Client, &Reflection)>, dead: bool, kind: &ApiResource, name: &str) -> bool {
    let Some((pc, r)) = reflection.filter(|_| !dead) else { return true };
    let there: Api<DynamicObject> = Api::namespaced_with(pc.clone(), &r.remote, kind);
    match there.get_opt(name).await {
        Ok(None) => true,
        Err(kube::Error::Api(e)) if e.code == 403 => true,
        Ok(Some(c)) => {
            if c.metadata.deletion_timestamp.is_none()
                && let Err(e) = crate::emulate::absent(there.delete(name, &DeleteParams::default()).await)
            {
                tracing::debug!(error = %e, kind = %kind.kind, "emulated Liqo: deleting a replicated copy");
            }
            false
        }
        Err(e) => {
            tracing::debug!(error = %e, kind = %kind.kind, "emulated Liqo: reading a replicated copy being deleted");
            false
        }
    }
}

/// The annotation `liqoctl force unpeer` puts on a ForeignCluster (`pkg/consts/annotations.go`).
pub const PERMANENTLY_UNREACHABLE_ANNOTATION: &str = "liqo.io/foreign-cluster-permanently-unreachable";

/// The CRD replicator's ForeignCluster state controller
/// (`internal/crdReplicator/foreignclusterstate_controller.go`), on each change of a
/// ForeignCluster seen by a watch (`EmulatedLiqo::start`): one whose role is `Unknown` is
/// skipped and its cluster keeps the last verdict (a peering being torn down loses its
/// Tenant and Identity, so its role, while its copies still wait); any other sets its
/// reflector's `RemoteReachable` to `!IsDead` ([`is_dead`]). `unreachable` holds the
/// cluster ids judged dead: their copies count as vanished, and their reflectors stop
/// without asking them. A provider that merely does not answer is not dead.
pub(super) fn judge(unreachable: &std::sync::Mutex<HashSet<String>>, fc: &DynamicObject) {
    if fc.data.pointer("/status/role").and_then(Value::as_str) == Some("Unknown") {
        return;
    }
    let Some(id) = fc.data.pointer("/spec/clusterID").and_then(Value::as_str) else { return };
    let mut dead = unreachable.lock().expect("unreachable lock");
    if is_dead(fc) {
        dead.insert(id.to_owned());
    } else {
        dead.remove(id);
    }
}

/// `foreigncluster.IsDead` (`pkg/utils/foreigncluster/conditions.go`): annotated
/// [`PERMANENTLY_UNREACHABLE_ANNOTATION`]`: "true"` with no `Established` `APIServerStatus`
/// condition.
fn is_dead(fc: &DynamicObject) -> bool {
    let annotated = fc.metadata.annotations.as_ref().and_then(|a| a.get(PERMANENTLY_UNREACHABLE_ANNOTATION)).is_some_and(|v| v == "true");
    let api_server_up = fc
        .data
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == "APIServerStatus"))
        .is_some_and(|c| c["status"] == "Established");
    annotated && !api_server_up
}

/// A status condition as Liqo's controllers write one, changed now.
pub(super) fn cond(type_: &str, status: &str, reason: &str, message: &str) -> Value {
    json!({"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": now()})
}

/// The provider's side: the remote slice controller.
pub(super) async fn remote_slices(m: &Member) -> Result<(), kube::Error> {
    let all = slices(&m.client, None).list(&ListParams::default()).await?.items;
    for s in all.iter().filter(|s| label(s, ORIGIN_LABEL).is_some() && s.metadata.deletion_timestamp.is_none()) {
        let (name, ns) = (name_of(s), ns_of(s));
        let Some(consumer) = s.data.pointer("/spec/consumerClusterID").and_then(Value::as_str).map(str::to_owned) else {
            event(&m.client, s, "Warning", "RemoteCertificateFailed", "ConsumerClusterID not set").await?;
            continue;
        };
        // `remoteresourceslice_controller.go`, `Reconcile`: the consumer's tenant namespace
        // as `GetNamespace` finds it by labels (none or several: an error, retried); a slice
        // in any other namespace is skipped.
        match tenant_namespace_of(&m.client, &consumer).await? {
            Ok(Some(tenant_ns)) if tenant_ns == ns => {}
            _ => continue,
        }
        // `getters.GetTenantByClusterID(..., tenantNamespace)`: by its `liqo.io/remote-cluster-id`
        // label there; none or several is a `TenantNotFound` Warning.
        let tenants: Api<DynamicObject> = Api::namespaced_with(m.client.clone(), &ns, &auth("Tenant", "tenants"));
        let mut tenants = tenants.list(&ListParams::default().labels(&format!("{REMOTE_ID_LABEL}={consumer}"))).await?.items;
        let tenant = match tenants.len() {
            1 => tenants.pop().expect("one Tenant"),
            0 => {
                event(&m.client, s, "Warning", "TenantNotFound", &format!("tenants.authentication.liqo.io {consumer:?} not found")).await?;
                continue;
            }
            _ => {
                let why = format!("multiple resources of type {{tenants}} found for cluster {{{consumer}}}, when only one was expected");
                event(&m.client, s, "Warning", "TenantNotFound", &why).await?;
                continue;
            }
        };
        let check_key = tenant.data.pointer("/spec/authzPolicy").and_then(Value::as_str) != Some("TolerateNoHandshake");
        let b64 = |o: &DynamicObject, p: &str| {
            o.data.pointer(p).and_then(Value::as_str).and_then(|v| base64::Engine::decode(&base64::engine::general_purpose::STANDARD, v).ok())
        };
        let public = b64(&tenant, "/spec/publicKey");
        let der = if check_key { public.as_deref().and_then(|p| keys::public_key_der(p).ok()) } else { None };
        let csr = b64(s, "/spec/csr").unwrap_or_default();
        let checked = if check_key && der.is_none() {
            Err("failed to parse tenant public key".to_owned())
        } else {
            keys::check_csr(&csr, &keys::resource_slice_common_name(&name, &consumer), &consumer, der.as_deref()).map_err(|e| e.to_string())
        };
        let mut status = s.data.get("status").cloned().unwrap_or(json!({}));
        let auth_cond = match checked {
            Err(why) => {
                event(&m.client, s, "Warning", "InvalidCSR", &why).await?;
                cond("Authentication", "Denied", "InvalidCSR", &why)
            }
            Ok(()) => {
                if status.pointer("/authParams/signedCRT").is_none() {
                    let Some(cert) = issue(m, &csr).await? else { continue };
                    let e = |b: &[u8]| base64::Engine::encode(&base64::engine::general_purpose::STANDARD, b);
                    status["authParams"] = json!({"signedCRT": e(&cert), "ca": e(&m.ca_pem), "apiServer": m.server});
                }
                cond("Authentication", "Accepted", "AuthenticationAccepted", "")
            }
        };
        let res_cond = match tenant.data.pointer("/spec/tenantCondition").and_then(Value::as_str).unwrap_or("Active") {
            "Active" => {
                let (cpu, memory) = capacity(&m.client).await?;
                let mut res = json!({"cpu": cpu, "memory": memory, "pods": "110"});
                if let Some(asked) = s.data.pointer("/spec/resources").and_then(Value::as_object) {
                    for (k, v) in asked {
                        res[k] = v.clone();
                    }
                }
                if status.get("resources").is_none() {
                    status["resources"] = res;
                }
                cond("Resources", "Accepted", "ResourcesAccepted", "")
            }
            _ => cond("Resources", "Denied", "ResourcesDenied", "the tenant is cordoned or drained"),
        };
        let same = |c: &Value| condition(s, c["type"].as_str().unwrap_or_default()) == c["status"].as_str();
        if !same(&auth_cond) || !same(&res_cond) || s.data.get("status") != Some(&status) {
            status["conditions"] = json!([auth_cond, res_cond]);
            set_status(&slices(&m.client, Some(&ns)), &name, status).await?;
        }
    }
    Ok(())
}

fn virtual_node_taints() -> Value {
    json!([{"key": NOT_ALLOWED_TAINT, "value": "true", "effect": "NoExecute"}])
}

/// The VirtualNode creator and the virtual kubelet's Node.
pub(super) async fn virtual_nodes(m: &Member) -> Result<(), kube::Error> {
    let all = slices(&m.client, None).list(&ListParams::default()).await?.items;
    let authenticated = authenticated_toward(m).await?;
    let vn_res = ar("offloading.liqo.io", "v1beta1", "VirtualNode", "virtualnodes");
    for s in all.iter().filter(|s| label(s, ORIGIN_LABEL).is_none() && s.metadata.deletion_timestamp.is_none()) {
        let wanted = s.metadata.annotations.as_ref().and_then(|a| a.get(CREATE_VIRTUAL_NODE_ANNOTATION)).is_some_and(|v| !v.is_empty() && !v.eq_ignore_ascii_case("false"));
        let accepted = condition(s, "Authentication") == Some("Accepted") && condition(s, "Resources") == Some("Accepted");
        let Some(provider) = label(s, REMOTE_ID_LABEL) else { continue };
        if !wanted || !accepted || !authenticated.contains_key(&provider) {
            continue;
        }
        let (name, ns) = (name_of(s), ns_of(s));
        let vns: Api<DynamicObject> = Api::namespaced_with(m.client.clone(), &ns, &vn_res);
        if vns.get_opt(&name).await?.is_none() {
            let quota = s.data.pointer("/status/resources").cloned().unwrap_or(json!({}));
            let vn = json!({"apiVersion": "offloading.liqo.io/v1beta1", "kind": "VirtualNode", "metadata": {"name": name, "namespace": ns,
                "labels": {REMOTE_ID_LABEL: provider, "liqo.io/resourceslice-name": name},
                "ownerReferences": [{"apiVersion": "authentication.liqo.io/v1beta1", "kind": "ResourceSlice", "name": name, "uid": s.metadata.uid.clone().unwrap_or_default(), "controller": true}]},
                "spec": {"clusterID": provider, "createNode": true, "resourceQuota": {"hard": quota}}});
            apply(&vns, &vn).await?;
        }
    }
    // The virtual kubelets: a Node per VirtualNode asking for one; Nodes without one go.
    let nodes: Api<Node> = Api::all(m.client.clone());
    let all_vns = Api::<DynamicObject>::all_with(m.client.clone(), &vn_res).list(&ListParams::default()).await?.items;
    let mut wanted = HashSet::new();
    for vn in &all_vns {
        let here: Api<DynamicObject> = Api::namespaced_with(m.client.clone(), &ns_of(vn), &vn_res);
        if vn.metadata.deletion_timestamp.is_some() {
            if virtual_node_deletion(m, &here, &nodes, vn, &all_vns).await? {
                wanted.insert(name_of(vn));
            }
            continue;
        }
        // `virtualnode_controller.go`, `Reconcile`: the finalizer first.
        if let Some(patch) = finalizer_patch(&vn.metadata, VIRTUAL_NODE_FINALIZER, true) {
            here.patch(&name_of(vn), &PatchParams::default(), &Patch::Merge(&patch)).await?;
        }
        if vn.data.pointer("/spec/createNode") == Some(&json!(false)) {
            continue;
        }
        let name = name_of(vn);
        let provider = vn.data.pointer("/spec/clusterID").and_then(Value::as_str).unwrap_or_default().to_owned();
        wanted.insert(name.clone());
        let existing = nodes.get_opt(&name).await?;
        if existing.is_none() {
            let node: Node = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name,
                "labels": {REMOTE_ID_LABEL: provider, TYPE_LABEL: TYPE_VIRTUAL_NODE, "kubernetes.io/hostname": name}},
                "spec": {"taints": virtual_node_taints()}}))
            .expect("valid node");
            crate::emulate::present(nodes.create(&PostParams::default(), &node).await)?;
        }
        // Admission adds the not-ready taint at creation: its own taints only, before it
        // reports Ready (so a Ready virtual node has its final taints).
        let taints = existing.as_ref().and_then(|n| n.spec.as_ref()).and_then(|s| serde_json::to_value(&s.taints).ok());
        if taints.as_ref() != Some(&virtual_node_taints()) {
            nodes.patch(&name, &PatchParams::default(), &Patch::Merge(&json!({"spec": {"taints": virtual_node_taints()}}))).await?;
        }
        let ready = existing.as_ref().and_then(|n| n.status.as_ref()?.conditions.as_ref()).is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        if !ready {
            let hard = vn.data.pointer("/spec/resourceQuota/hard").cloned().unwrap_or(json!({}));
            let status = json!({"status": {"capacity": hard, "allocatable": hard,
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "emulated Liqo virtual kubelet", "lastHeartbeatTime": now(), "lastTransitionTime": now()}]}});
            nodes.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await?;
        }
    }
    for n in nodes.list(&ListParams::default().labels(&format!("{TYPE_LABEL}={TYPE_VIRTUAL_NODE}"))).await?.items {
        let name = n.metadata.name.clone().unwrap_or_default();
        if !wanted.contains(&name) {
            nodes.delete(&name, &DeleteParams::default()).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kubeconfig(ns: &str, remote: &str, type_: &str, annotation: Option<&str>) -> Secret {
        let mut meta = json!({"name": format!("kubeconfig-{remote}"), "namespace": ns, "labels": {REMOTE_ID_LABEL: remote, IDENTITY_TYPE_LABEL: type_}});
        if let Some(a) = annotation {
            meta["annotations"] = json!({REMOTE_TENANT_NAMESPACE_ANNOTATION: a});
        }
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Secret", "metadata": meta})).expect("a Secret")
    }

    /// A reflector per control-plane kubeconfig Secret: from its namespace to the annotated
    /// one, whatever their names; none without the annotation, none when two Secrets name
    /// the same cluster, none for other identity types.
    /// Dead only when declared so (`liqoctl force unpeer`'s annotation) and its API server
    /// is not known to answer; a ForeignCluster of role Unknown is not judged.
    #[test]
    fn a_provider_is_dead_only_when_declared_permanently_unreachable() {
        let fc = |annotated: bool, status: Value| {
            let mut meta = json!({"name": "b"});
            if annotated {
                meta["annotations"] = json!({PERMANENTLY_UNREACHABLE_ANNOTATION: "true"});
            }
            serde_json::from_value::<DynamicObject>(json!({"apiVersion": "core.liqo.io/v1beta1", "kind": "ForeignCluster", "metadata": meta, "spec": {"clusterID": "b"}, "status": status}))
                .unwrap()
        };
        let api_server = |s: &str| json!({"role": "Provider", "conditions": [{"type": "APIServerStatus", "status": s}]});
        assert!(!is_dead(&fc(false, json!({"role": "Provider"}))), "not answering is not dead");
        assert!(is_dead(&fc(true, json!({"role": "Provider"}))));
        assert!(is_dead(&fc(true, api_server("NotReady"))));
        assert!(!is_dead(&fc(true, api_server("Established"))), "an API server that answers keeps it alive");
        // The state controller skips a ForeignCluster of role Unknown: its last verdict stays.
        let unreachable = std::sync::Mutex::new(HashSet::new());
        judge(&unreachable, &fc(true, json!({"role": "Unknown"})));
        assert!(unreachable.lock().unwrap().is_empty(), "not judged");
        judge(&unreachable, &fc(true, json!({"role": "Provider"})));
        judge(&unreachable, &fc(true, json!({"role": "Unknown"})));
        assert!(unreachable.lock().unwrap().contains("b"), "still dead once its Tenant and Identity are gone");
        judge(&unreachable, &fc(false, json!({"role": "Provider"})));
        assert!(unreachable.lock().unwrap().is_empty(), "alive again");
    }

    #[test]
    fn reflections_follow_the_control_plane_kubeconfig() {
        let r = reflections(&[
            kubeconfig("old-tenant-b", "b", "ControlPlane", Some("admin-made-for-a")),
            kubeconfig("liqo-tenant-c", "c", "ControlPlane", None),
            kubeconfig("liqo-tenant-d", "d", "ControlPlane", Some("liqo-tenant-a")),
            kubeconfig("other-d", "d", "ControlPlane", Some("liqo-tenant-a")),
            kubeconfig("liqo-tenant-e", "e", "ResourceSlice", Some("liqo-tenant-a")),
        ]);
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!(r.get("b"), Some(&Reflection { local: "old-tenant-b".into(), remote: "admin-made-for-a".into(), secret: "kubeconfig-b".into() }));
    }

    /// `mutateLabelsForRemote`: the copy is not replicated again, says where it came from.
    #[test]
    fn copies_are_labelled_as_upstreams() {
        let local = BTreeMap::from([
            (REPLICATION_LABEL.to_owned(), "true".to_owned()),
            (REPLICATION_DESTINATION_LABEL.to_owned(), "b".to_owned()),
            (REMOTE_ID_LABEL.to_owned(), "b".to_owned()),
            (OWNERSHIP_LABEL.to_owned(), "Local".to_owned()),
        ]);
        let remote = labels_for_remote(local, "a");
        assert_eq!(remote.get(REPLICATION_LABEL).map(String::as_str), Some("false"));
        assert_eq!(remote.get(REPLICATED_LABEL).map(String::as_str), Some("true"));
        assert_eq!(remote.get(ORIGIN_LABEL).map(String::as_str), Some("a"));
        assert_eq!(remote.get(REMOTE_ID_LABEL).map(String::as_str), Some("a"));
        assert_eq!(remote.get(REPLICATION_DESTINATION_LABEL).map(String::as_str), Some("b"));
        assert!(!remote.contains_key(OWNERSHIP_LABEL));
    }
}

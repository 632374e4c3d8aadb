//! Emulated Liqo namespace offloading on real API servers, with Liqo's offloading
//! webhooks: a consumer (member-1) peered with two providers (member-2, member-3) by the
//! peer worker; a NamespaceOffloading selecting one provider, whose namespace Liqo labels
//! for scheduling; a Deployment larger than the consumer, created afterwards, whose pods
//! Liqo's pod webhook mutates so that the real scheduler sends the overflow to that
//! provider's virtual node only, where the emulated virtual kubelet runs it; deletion
//! taking everything back (the label first); a provider whose twin namespaces cannot be
//! created; an unpeering that waits for Liqo's teardown through its finalizers, and for
//! the drain of the provider's virtual node, which a PodDisruptionBudget holds (the
//! unpeer says so while it waits) until it is relaxed and lets the evictions through.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use ferry_fleet::NodeFlavor;
use ferry_fleet::emulated_liqo::NOT_ALLOWED_TAINT;
use ferry_fleet::emulated_liqo::authentication::VK_REMOTE_ROLE;
use ferry_fleet::emulated_liqo::resources::{REPLICATOR_FINALIZER, VIRTUAL_NODE_FINALIZER, namespace_map_resource};
use ferry_kube::vocab::liqo::{REPLICATION_DESTINATION_LABEL, SHADOW_POD_LABEL};
use ferry_fleet::emulated_offloading::namespace_maps::{self, MANAGED_BY_ANNOTATION, ORIGINAL_NAME_ANNOTATION};
use ferry_fleet::emulated_offloading::{
    FINALIZER, OffloadingKnobs, REFLECTION_DESTINATION_LABEL, REFLECTION_ORIGIN_LABEL, REMOTE_ID_LABEL, SCHEDULING_LABEL, VIRTUAL_NODE_SELECTOR,
    namespace_offloading_resource,
};
use ferry_peer::spec::PeerClusters;
use ferry_peer::{PeerConfig, PeerHandler};
use ferry_runtime::{EventType, SubmitOptions, TaskId, TaskKind};
use ferry_testkit::Bed;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(120);
const CONSUMER: &str = "member-1";

/// Watches `api` until `done` holds for what it lists, within [`WAIT`]; what it listed last.
async fn wait_for<K>(what: &str, api: Api<K>, dyntype: K::DynamicType, config: watcher::Config, done: impl Fn(&[Arc<K>]) -> bool) -> Vec<Arc<K>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    let writer = Writer::new(dyntype);
    let store = writer.as_reader();
    let mut events = reflector::reflector(writer, watcher(api, config).default_backoff()).boxed();
    let met = tokio::time::timeout(WAIT, async {
        while let Some(ev) = events.next().await {
            let listed = matches!(store.wait_until_ready().now_or_never(), Some(Ok(())));
            if ev.is_ok() && listed && done(&store.state()) {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    if !met {
        let seen: Vec<String> = store.state().iter().map(|o| summary(&serde_json::to_value(&**o).unwrap())).collect();
        panic!("{what}: not within {WAIT:?}; last seen: {seen:#?}");
    }
    store.state()
}

/// Name, node and status of an object, short enough for a failure message.
fn summary(o: &Value) -> String {
    let mut s = format!("{} {} {}", o["metadata"]["name"], o["spec"]["nodeName"], o["status"]);
    s.truncate(600);
    s
}

fn by_name(name: &str) -> watcher::Config {
    watcher::Config::default().fields(&format!("metadata.name={name}"))
}

fn dynamic(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

async fn apply(client: &kube::Client, ar: &ApiResource, obj: Value) {
    let name = obj["metadata"]["name"].as_str().unwrap().to_owned();
    let api: Api<DynamicObject> = match obj["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, ar),
        None => Api::all_with(client.clone(), ar),
    };
    api.patch(&name, &PatchParams::apply("offloading-test"), &Patch::Apply(&obj)).await.unwrap_or_else(|e| panic!("applying {name}: {e}"));
}

async fn namespace(client: &kube::Client, name: &str) {
    apply(client, &dynamic("", "v1", "Namespace", "namespaces"), json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})).await;
}

/// Peers `provider` with the consumer through the peer worker (a real `liqoctl peer`'s
/// objects, which the emulated Liqo reacts to).
async fn peer(bed: &Bed, provider: &str) -> TaskId {
    let cmd = PeerClusters { a: CONSUMER.into(), b: provider.into(), timeout_seconds: Some(60), ..PeerClusters::default() };
    let (id, evs) = bed.client().submit_and_wait(TaskKind::PEER, &cmd.subject(), &cmd, SubmitOptions::default(), WAIT).await.expect("the peering's events");
    let summary = ferry_runtime::report::summary(&evs);
    assert_eq!(evs.last().map(|e| e.event), Some(EventType::Succeeded), "peering {CONSUMER} with {provider} ({id}): {summary}");
    id
}

fn offloading(ns: &str, spec: Value) -> Value {
    json!({"apiVersion": "offloading.liqo.io/v1beta1", "kind": "NamespaceOffloading", "metadata": {"name": "offloading", "namespace": ns}, "spec": spec})
}

fn only(provider: &str) -> Value {
    json!({"nodeSelectorTerms": [{"matchExpressions": [{"key": REMOTE_ID_LABEL, "operator": "In", "values": [provider]}]}]})
}

/// Waits until the NamespaceOffloading of `ns` reports `phase`.
async fn phase(client: &kube::Client, ns: &str, phase: &str) -> Arc<DynamicObject> {
    let api = Api::namespaced_with(client.clone(), ns, &namespace_offloading_resource());
    let done = |l: &[Arc<DynamicObject>]| l.iter().any(|o| o.data.pointer("/status/offloadingPhase") == Some(&json!(phase)));
    wait_for(&format!("{ns}: offloading phase {phase}"), api, namespace_offloading_resource(), by_name("offloading"), done).await.remove(0)
}

/// The `Ready` condition of `provider` in an offloading's status: (status, reason, message).
fn ready_condition(o: &DynamicObject, provider: &str) -> (String, String, String) {
    let cs = o.data.pointer(&format!("/status/remoteNamespacesConditions/{provider}")).and_then(Value::as_array).cloned().unwrap_or_default();
    let c = cs.iter().find(|c| c["type"] == "Ready").unwrap_or_else(|| panic!("no Ready condition for {provider}: {:?}", o.data["status"]));
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
    (s("status"), s("reason"), s("message"))
}

/// The remote namespaces on `client`'s cluster: those a NamespaceMap manages (by Liqo's annotation).
async fn twins(client: &kube::Client) -> Vec<String> {
    let all = Api::<Namespace>::all(client.clone()).list(&ListParams::default()).await.unwrap().items;
    let managed = |n: &Namespace| n.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(MANAGED_BY_ANNOTATION));
    all.into_iter().filter(|n| managed(n)).filter_map(|n| n.metadata.name).collect()
}

/// A condition of `provider` in an offloading's status: (status, reason), if there is one.
fn remote_condition(o: &DynamicObject, provider: &str, type_: &str) -> Option<(String, String)> {
    let cs = o.data.pointer(&format!("/status/remoteNamespacesConditions/{provider}"))?.as_array()?.clone();
    let c = cs.into_iter().find(|c| c["type"] == type_)?;
    Some((c["status"].as_str()?.to_owned(), c["reason"].as_str()?.to_owned()))
}

/// The consumer's NamespaceMap toward `provider` (in any namespace, by Liqo's labels).
async fn namespace_map(client: &kube::Client, provider: &str) -> DynamicObject {
    let lp = ListParams::default().labels(&format!("{REMOTE_ID_LABEL}={provider},liqo.io/replication=true"));
    let mut maps = Api::<DynamicObject>::all_with(client.clone(), &namespace_map_resource()).list(&lp).await.unwrap().items;
    assert_eq!(maps.len(), 1, "one NamespaceMap toward {provider}");
    maps.remove(0)
}

/// The value of Liqo's scheduling label on namespace `ns`, if any.
async fn scheduling_label(client: &kube::Client, ns: &str) -> Option<String> {
    Api::<Namespace>::all(client.clone()).get(ns).await.unwrap().metadata.labels.unwrap_or_default().get(SCHEDULING_LABEL).cloned()
}

fn node_of(p: &Pod) -> String {
    p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_offload_pods_overflow_to_the_provider_and_deletion_takes_them_back() {
    let started = std::time::Instant::now();
    // member-3 cannot get twin namespaces until the knob is cleared.
    let knobs = HashMap::from([("member-3".to_owned(), OffloadingKnobs { fails: true })]);
    let Some(mut bed) = Bed::builder()
        .member(1, NodeFlavor::default())
        .member(2, NodeFlavor::default())
        .member(2, NodeFlavor::default())
        .kubeconfigs()
        .liqo(HashMap::new())
        .offloading(knobs)
        .start()
        .await
    else {
        return;
    };
    bed.run_worker(PeerHandler::new(PeerConfig::new(bed.clusters.clone())));
    let (m1, m2, m3) = (bed.cluster("member-1").await, bed.cluster("member-2").await, bed.cluster("member-3").await);
    let to_member_2 = peer(&bed, "member-2").await;
    peer(&bed, "member-3").await;
    let ready = |l: &[Arc<Node>]| {
        l.len() == 2
            && l.iter()
                .all(|n| n.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")))
    };
    let vnodes = wait_for("two Ready virtual nodes", Api::all(m1.clone()), (), watcher::Config::default().labels(VIRTUAL_NODE_SELECTOR), ready).await;
    // Virtual nodes by their labels: provider id → node name.
    let vnode: BTreeMap<String, String> =
        vnodes.iter().map(|n| (n.metadata.labels.as_ref().unwrap()[REMOTE_ID_LABEL].clone(), n.metadata.name.clone().unwrap())).collect();
    let virtual_names: BTreeSet<String> = vnode.values().cloned().collect();
    for n in &vnodes {
        let taints: BTreeSet<(String, String, String)> =
            n.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default().into_iter().map(|t| (t.key, t.value.unwrap_or_default(), t.effect)).collect();
        let want = BTreeSet::from([(NOT_ALLOWED_TAINT.to_owned(), "true".to_owned(), "NoExecute".to_owned())]);
        assert_eq!(taints, want, "virtual node {:?}: Liqo's taint, nothing else", n.metadata.name);
    }
    println!("peered in {:?}", started.elapsed());

    // Offload `web` to member-2 only.
    namespace(&m1, "web").await;
    apply(&m1, &namespace_offloading_resource(), offloading("web", json!({"clusterSelector": only("member-2"), "namespaceMappingStrategy": "DefaultName"})))
        .await;
    let nso = phase(&m1, "web", "Ready").await;
    assert!(nso.metadata.finalizers.iter().flatten().any(|f| f == FINALIZER), "Liqo's finalizer: {:?}", nso.metadata.finalizers);
    assert_eq!(nso.data.pointer("/status/remoteNamespaceName"), Some(&json!("web-member-1")));
    assert_eq!(ready_condition(&nso, "member-2"), ("True".into(), "NamespaceCreated".into(), "Namespace correctly offloaded to the remote cluster".into()));
    // Upstream keeps a condition per peered provider, selected or not.
    assert_eq!(remote_condition(&nso, "member-3", "OffloadingRequired"), Some(("False".into(), "ClusterNotSelected".into())), "{:?}", nso.data["status"]);
    assert_eq!(remote_condition(&nso, "member-3", "Ready"), None, "member-3 is not selected: {:?}", nso.data["status"]);
    // The mapping went through member-1's NamespaceMap toward member-2, replicated there.
    let nm = namespace_map(&m1, "member-2").await;
    assert_eq!(namespace_maps::desired(&nm).get("web").map(String::as_str), Some("web-member-1"));
    assert_eq!(namespace_maps::current(&nm)["web"], json!({"remoteNamespace": "web-member-1", "phase": "Accepted"}));
    assert!(namespace_maps::desired(&namespace_map(&m1, "member-3").await).is_empty(), "member-3's map asks for nothing");
    let copies = Api::<DynamicObject>::all_with(m2.clone(), &namespace_map_resource()).list(&ListParams::default().labels("liqo.io/replicated=true")).await.unwrap().items;
    let [copy] = copies.as_slice() else { panic!("one replicated NamespaceMap on member-2: {copies:?}") };
    assert!(copy.metadata.finalizers.iter().flatten().any(|f| f == namespace_maps::FINALIZER), "the provider's NamespaceMap controller finalizes it");
    let map_id = format!("{}/{}", copy.metadata.namespace.as_deref().unwrap(), copy.metadata.name.as_deref().unwrap());
    let twin = Api::<Namespace>::all(m2.clone()).get("web-member-1").await.expect("the twin namespace on member-2");
    assert_eq!(twin.metadata.labels.unwrap()[REMOTE_ID_LABEL], CONSUMER);
    let annotations = twin.metadata.annotations.unwrap();
    assert_eq!((annotations[MANAGED_BY_ANNOTATION].as_str(), annotations[ORIGINAL_NAME_ANNOTATION].as_str()), (map_id.as_str(), "web"));
    // The consumer's virtual kubelet may work there: the chart's role, bound to its group.
    let binding = Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(m2.clone(), "web-member-1").get(copy.metadata.namespace.as_deref().unwrap()).await.unwrap();
    assert_eq!((binding.role_ref.kind.as_str(), binding.role_ref.name.as_str()), ("ClusterRole", VK_REMOTE_ROLE));
    let subjects: Vec<(String, String)> = binding.subjects.unwrap_or_default().into_iter().map(|s| (s.kind, s.name)).collect();
    assert_eq!(subjects, [("Group".to_owned(), CONSUMER.to_owned())]);
    assert_eq!(twins(&m3).await, Vec::<String>::new(), "nothing on member-3");
    assert_eq!(scheduling_label(&m1, "web").await.as_deref(), Some("true"), "Liqo labels the offloaded namespace for scheduling");

    // 7 replicas of 1 CPU: member-1's one node (4 CPUs) takes at most 4, the rest go remote;
    // member-2 (2 nodes of 4 CPUs, a virtual node of 8) runs any split.
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "app", "namespace": "web"},
        "spec": {"replicas": 7, "selector": {"matchLabels": {"app": "app"}},
                 "template": {"metadata": {"labels": {"app": "app"}},
                              "spec": {"containers": [{"name": "app", "image": "nginx:1.25", "resources": {"requests": {"cpu": "1"}}}]}}}});
    apply(&m1, &dynamic("apps", "v1", "Deployment", "deployments"), deployment).await;
    let all_ready = |l: &[Arc<Deployment>]| l.iter().any(|d| d.status.as_ref().and_then(|s| s.ready_replicas) == Some(7));
    wait_for("7 ready replicas", Api::namespaced(m1.clone(), "web"), (), by_name("app"), all_ready).await;
    println!("7 replicas ready at {:?}", started.elapsed());
    let pods = Api::<Pod>::namespaced(m1.clone(), "web").list(&ListParams::default()).await.unwrap().items;
    let remote: BTreeSet<String> = pods.iter().filter(|p| node_of(p) == vnode["member-2"]).filter_map(|p| p.metadata.name.clone()).collect();
    // Liqo's pod webhook gave each pod the toleration and the affinity of the selector
    // (member-2's virtual node, or a local node): member-3's virtual node is never used.
    assert!(pods.iter().all(|p| ["member-1-node-0", vnode["member-2"].as_str()].contains(&node_of(p).as_str())), "local node or member-2's virtual node only");
    for p in &pods {
        let spec = serde_json::to_value(p.spec.as_ref().unwrap()).unwrap();
        assert!(spec["tolerations"].as_array().unwrap().iter().any(|t| t["key"] == NOT_ALLOWED_TAINT && t["operator"] == "Exists"), "{:?}", p.metadata.name);
        let terms = &spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
        assert_eq!(terms.as_array().map(Vec::len), Some(2), "the selector's term and the local nodes' term: {terms}");
    }
    assert!(remote.len() >= 3, "the overflow runs on member-2's virtual node: {remote:?}");
    let reflections = Api::<Pod>::namespaced(m2.clone(), "web-member-1").list(&ListParams::default()).await.unwrap().items;
    let reflected: BTreeSet<String> = reflections.iter().filter_map(|p| p.metadata.name.clone()).collect();
    assert_eq!(reflected, remote, "each offloaded pod has its reflection on member-2");
    for r in &reflections {
        assert!(node_of(r).starts_with("member-2-node-"), "{:?} runs on member-2's nodes", r.metadata.name);
        assert_eq!(r.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Running"));
        let labels = r.metadata.labels.as_ref().unwrap();
        assert_eq!((labels[REFLECTION_ORIGIN_LABEL].as_str(), labels[REFLECTION_DESTINATION_LABEL].as_str()), (CONSUMER, "member-2"));
    }

    // Deleting the offloading takes everything back.
    Api::<DynamicObject>::namespaced_with(m1.clone(), "web", &namespace_offloading_resource()).delete("offloading", &DeleteParams::default()).await.unwrap();
    let gone = |l: &[Arc<DynamicObject>]| l.is_empty();
    wait_for(
        "the offloading gone",
        Api::namespaced_with(m1.clone(), "web", &namespace_offloading_resource()),
        namespace_offloading_resource(),
        by_name("offloading"),
        gone,
    )
    .await;
    wait_for("the twin namespace gone", Api::<Namespace>::all(m2.clone()), (), by_name("web-member-1"), |l| l.is_empty()).await;
    let local = |l: &[Arc<Pod>]| !l.is_empty() && l.iter().all(|p| !virtual_names.contains(&node_of(p)));
    wait_for("no pod of web on a virtual node", Api::namespaced(m1.clone(), "web"), (), watcher::Config::default(), local).await;
    assert_eq!(scheduling_label(&m1, "web").await, None, "the scheduling label went with the offloading");
    println!("offloading deleted at {:?}", started.elapsed());

    // member-3 fails: SomeFailed when selected with member-2, AllFailed alone; then it recovers.
    namespace(&m1, "api").await;
    namespace(&m1, "batch").await;
    let api_spec = json!({"namespaceMappingStrategy": "SelectedName", "remoteNamespaceName": "api-remote", "podOffloadingStrategy": "Local"});
    apply(&m1, &namespace_offloading_resource(), offloading("api", api_spec)).await;
    apply(
        &m1,
        &namespace_offloading_resource(),
        offloading("batch", json!({"clusterSelector": only("member-3"), "namespaceMappingStrategy": "EnforceSameName"})),
    )
    .await;
    let some = phase(&m1, "api", "SomeFailed").await;
    assert_eq!(scheduling_label(&m1, "api").await, None, "pods of a Local offloading stay home: no scheduling label");
    assert_eq!(ready_condition(&some, "member-2").0, "True");
    let (status, reason, message) = ready_condition(&some, "member-3");
    assert_eq!((status.as_str(), reason.as_str()), ("False", "CreationLoopBackOff"), "{message}");
    let all = phase(&m1, "batch", "AllFailed").await;
    assert_eq!(ready_condition(&all, "member-3").1, "CreationLoopBackOff");
    assert!(Api::<Namespace>::all(m2.clone()).get_opt("api-remote").await.unwrap().is_some(), "member-2's twin exists meanwhile");
    assert_eq!(twins(&m3).await, Vec::<String>::new(), "nothing created on the failing member-3");
    bed.offloading.as_ref().unwrap().set("member-3", |k| k.fails = false);
    phase(&m1, "batch", "Ready").await;
    phase(&m1, "api", "Ready").await;
    assert_eq!(twins(&m3).await, ["api-remote", "batch"], "twins on member-3 once it recovers");

    // A namespace of the remote name that Liqo did not make is refused, and left alone.
    namespace(&m2, "taken").await;
    namespace(&m1, "clash").await;
    let clash = json!({"clusterSelector": only("member-2"), "namespaceMappingStrategy": "SelectedName", "remoteNamespaceName": "taken", "podOffloadingStrategy": "Local"});
    apply(&m1, &namespace_offloading_resource(), offloading("clash", clash)).await;
    let refused = phase(&m1, "clash", "AllFailed").await;
    assert_eq!(ready_condition(&refused, "member-2").1, "CreationLoopBackOff");
    let taken = Api::<Namespace>::all(m2.clone()).get("taken").await.unwrap();
    assert!(!taken.metadata.annotations.unwrap_or_default().contains_key(MANAGED_BY_ANNOTATION), "the foreign namespace is not taken over");

    // Pods offloaded to member-2 under a PodDisruptionBudget that allows no eviction: Liqo
    // drains member-2's virtual node before it deletes it, and the budget holds the drain.
    namespace(&m1, "shop").await;
    let shop_spec = json!({"clusterSelector": only("member-2"), "namespaceMappingStrategy": "DefaultName", "podOffloadingStrategy": "Remote"});
    apply(&m1, &namespace_offloading_resource(), offloading("shop", shop_spec)).await;
    phase(&m1, "shop", "Ready").await;
    let shop = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "shop", "namespace": "shop"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "shop"}},
                 "template": {"metadata": {"labels": {"app": "shop"}},
                              "spec": {"containers": [{"name": "shop", "image": "nginx:1.25", "resources": {"requests": {"cpu": "100m"}}}]}}}});
    apply(&m1, &dynamic("apps", "v1", "Deployment", "deployments"), shop).await;
    let two_ready = |l: &[Arc<Deployment>]| l.iter().any(|d| d.status.as_ref().and_then(|s| s.ready_replicas) == Some(2));
    wait_for("2 ready shop replicas", Api::namespaced(m1.clone(), "shop"), (), by_name("shop"), two_ready).await;
    let shop_pods = Api::<Pod>::namespaced(m1.clone(), "shop").list(&ListParams::default()).await.unwrap().items;
    for p in &shop_pods {
        assert_eq!(node_of(p), vnode["member-2"], "{:?} is offloaded (Remote)", p.metadata.name);
        let labels = p.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels.get(SHADOW_POD_LABEL).map(String::as_str), Some("true"), "the virtual kubelet marks what it offloads: {labels:?}");
    }
    // The test bed's Kubernetes (1.20) serves budgets as policy/v1beta1 only.
    let budgets = dynamic("policy", "v1beta1", "PodDisruptionBudget", "poddisruptionbudgets");
    let budget = json!({"apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget", "metadata": {"name": "hold", "namespace": "shop"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "shop"}}}});
    apply(&m1, &budgets, budget).await;

    // Unpeering member-2 follows Liqo's teardown. The consumer's slice and map toward it
    // carry the CRD replicator's finalizer, its VirtualNode the VirtualNode controller's.
    let slices = dynamic("authentication.liqo.io", "v1beta1", "ResourceSlice", "resourceslices");
    let virtual_nodes = dynamic("offloading.liqo.io", "v1beta1", "VirtualNode", "virtualnodes");
    let toward_2 = ListParams::default().labels(&format!("{REPLICATION_DESTINATION_LABEL}=member-2"));
    let has = |o: &DynamicObject, f: &str| o.metadata.finalizers.iter().flatten().any(|x| x == f);
    let slice = Api::<DynamicObject>::all_with(m1.clone(), &slices).list(&toward_2).await.unwrap().items.remove(0);
    assert!(has(&slice, REPLICATOR_FINALIZER), "{:?}", slice.metadata.finalizers);
    assert!(has(&namespace_map(&m1, "member-2").await, REPLICATOR_FINALIZER));
    let (slice_ns, slice_name) = (slice.metadata.namespace.clone().unwrap(), slice.metadata.name.clone().unwrap());
    let vn_api: Api<DynamicObject> = Api::namespaced_with(m1.clone(), &slice_ns, &virtual_nodes);
    assert!(has(&vn_api.get(&slice_name).await.unwrap(), VIRTUAL_NODE_FINALIZER), "the VirtualNode is named after its slice and finalized");
    // A hold on the provider's copy of the slice: the consumer's slice, being deleted, must
    // wait for the copy, and its VirtualNode (owned by it) with it.
    let copy = Api::<DynamicObject>::all_with(m2.clone(), &slices).list(&ListParams::default().labels("liqo.io/originID=member-1")).await.unwrap().items.remove(0);
    let copies: Api<DynamicObject> = Api::namespaced_with(m2.clone(), copy.metadata.namespace.as_deref().unwrap(), &slices);
    let hold = |f: Value| json!({"metadata": {"finalizers": f}});
    copies.patch(&slice_name, &PatchParams::default(), &Patch::Merge(&hold(json!(["ferry.test/hold"])))).await.unwrap();
    let mut events = bed.client().events(false).await.unwrap();
    bed.client().revert(to_member_2).await.unwrap();
    wait_for("the provider's copy of the slice deleted, held", copies.clone(), slices.clone(), by_name(&slice_name), |l| {
        l.iter().any(|c| c.metadata.deletion_timestamp.is_some())
    })
    .await;
    let held = Api::<DynamicObject>::namespaced_with(m1.clone(), &slice_ns, &slices).get(&slice_name).await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some() && has(&held, REPLICATOR_FINALIZER), "the consumer's slice waits for its copy: {:?}", held.metadata);
    assert!(vn_api.get_opt(&slice_name).await.unwrap().is_some(), "the VirtualNode stays while its slice does");
    copies.patch(&slice_name, &PatchParams::default(), &Patch::Merge(&hold(json!([])))).await.unwrap();
    // The budget holds the drain; the unpeer's wait for the VirtualNode says so while it
    // lasts (and would in its failure at its bound): which pods are left, which budget.
    // (The budget's status is computed by the test bed's disruption controller: a look
    // before it was would say so, and the next look, when it changed, says this.)
    let holding = |e: &ferry_runtime::ProgressEvent| e.event == EventType::StepProgress && e.message.as_deref().is_some_and(|m| m.contains("wanted pods healthy"));
    let evs = events.until(to_member_2, WAIT, holding).await.expect("the unpeer says what holds the drain");
    let said = evs.last().and_then(|e| e.message.clone()).unwrap_or_default();
    assert!(
        said.starts_with("Liqo is draining virtual node member-2: 2 offloaded pod(s) left on it (shop/shop-")
            && said.contains("PodDisruptionBudget shop/hold allows no disruption (2 of 2 wanted pods healthy)"),
        "{said}"
    );
    // Liqo's drain as upstream's: the Node cordoned, the VirtualNode `Draining`, the pods there.
    let cordoned = |l: &[Arc<Node>]| l.iter().any(|n| n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true));
    wait_for("member-2's virtual node cordoned", Api::all(m1.clone()), (), by_name(&vnode["member-2"]), cordoned).await;
    let draining = |l: &[Arc<DynamicObject>]| {
        l.iter().any(|v| v.data.pointer("/status/conditions").and_then(Value::as_array).is_some_and(|cs| cs.iter().any(|c| c["type"] == "Node" && c["status"] == "Draining")))
    };
    wait_for("the VirtualNode Draining", vn_api.clone(), virtual_nodes.clone(), by_name(&slice_name), draining).await;
    let left = Api::<Pod>::namespaced(m1.clone(), "shop").list(&ListParams::default()).await.unwrap().items;
    assert_eq!(left.iter().filter(|p| node_of(p) == vnode["member-2"] && p.metadata.deletion_timestamp.is_none()).count(), 2, "no pod evicted under the budget");
    // Relaxed to allow both pods' eviction, the budget lets the drain go on by itself (its
    // status computed again by the disruption controller), and the unpeer with it.
    let relaxed = json!({"spec": {"minAvailable": 0}});
    Api::<DynamicObject>::namespaced_with(m1.clone(), "shop", &budgets).patch("hold", &PatchParams::default(), &Patch::Merge(&relaxed)).await.unwrap();
    let evs = events.until(to_member_2, WAIT, |e| e.event.is_final()).await.expect("the unpeering ends");
    assert_eq!(evs.last().map(|e| e.event), Some(EventType::Reverted), "{}", ferry_runtime::report::summary(&evs));
    // Once the revert ends the teardown is done: no slice, VirtualNode, Node or map toward
    // member-2, and no twin namespace left on it.
    assert!(Api::<DynamicObject>::all_with(m1.clone(), &slices).list(&toward_2).await.unwrap().items.is_empty());
    assert!(vn_api.get_opt(&slice_name).await.unwrap().is_none());
    assert!(Api::<Node>::all(m1.clone()).get_opt(&vnode["member-2"]).await.unwrap().is_none());
    let maps = Api::<DynamicObject>::all_with(m1.clone(), &namespace_map_resource()).list(&toward_2).await.unwrap().items;
    assert!(maps.is_empty(), "{maps:?}");
    assert_eq!(twins(&m2).await, Vec::<String>::new(), "twin namespaces left on member-2");
    println!("done in {:?}", started.elapsed());
    bed.stop().await;
}

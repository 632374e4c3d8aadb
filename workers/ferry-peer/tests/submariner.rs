//! The peer worker's Submariner method end to end: commands through the embedded broker,
//! the worker, and the test bed's hub with emulated OCM (members joined through their
//! klusterlets) and the emulated Submariner add-on, which behaves as upstream's
//! controllers do: no agent without the set's Broker, no operator without OLM, no report
//! without a klusterlet.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ferry_fleet::emulated_submariner::SubmarinerKnobs;
use ferry_kube::dry_run::Change;
use ferry_kube::kinds::ManagedCluster;
use ferry_peer::spec::{PeerClusters, PeerMethod};
use ferry_peer::submariner::{BROKER, addon_ready, broker_namespace};
use ferry_peer::{PeerConfig, PeerHandler};
use ferry_runtime::{Client, EventType, ProgressEvent, SubmitOptions, TaskId, TaskKind};
use ferry_testkit::Bed;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::wait::await_condition;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(400);
const SET_LABEL: &str = "cluster.open-cluster-management.io/clusterset";
const OLM_CRD: &str = "subscriptions.operators.coreos.com";

async fn start(kubeconfigs: bool, knobs: HashMap<String, SubmarinerKnobs>) -> Option<Bed> {
    let mut b = Bed::builder().members(2, 2).ocm().submariner(knobs);
    if kubeconfigs {
        b = b.kubeconfigs();
    }
    let mut bed = b.start().await?;
    ferry_testkit::ocm::join(&bed.fleet, &["member-1", "member-2"], "").await.expect("the members join OCM");
    bed.run_worker(PeerHandler::new(PeerConfig::new(Arc::new(ferry_kube::Clusters::new(bed.hub().await)))));
    Some(bed)
}

async fn submit(client: &Client, p: &PeerClusters) -> (TaskId, Vec<ProgressEvent>) {
    let mut events = client.events(false).await.unwrap();
    let id = client.submit(TaskKind::PEER, &p.subject(), p, SubmitOptions::default()).await.unwrap();
    let evs = events.until(id, WAIT, |e| e.event.is_final()).await.unwrap();
    (id, evs)
}

async fn revert(client: &Client, id: TaskId) -> Vec<ProgressEvent> {
    let mut events = client.events(false).await.unwrap();
    client.revert(id).await.unwrap();
    events.until(id, WAIT, |e| e.event.is_final()).await.unwrap()
}

fn last(evs: &[ProgressEvent]) -> String {
    ferry_runtime::report::summary(evs)
}

fn end(evs: &[ProgressEvent]) -> EventType {
    evs.last().map(|e| e.event).unwrap_or(EventType::Failed)
}

fn failed(evs: &[ProgressEvent]) -> &ProgressEvent {
    evs.iter().find(|e| matches!(e.event, EventType::StepFailed | EventType::Rejected | EventType::Failed)).unwrap_or_else(|| panic!("no failure: {}", last(evs)))
}

fn tunnel(a: &str, b: &str, timeout: i32) -> PeerClusters {
    PeerClusters { a: a.into(), b: b.into(), method: PeerMethod::Submariner, timeout_seconds: Some(timeout), ..PeerClusters::default() }
}

fn api(hub: &kube::Client, ns: Option<&str>, group: &str, version: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
    match ns {
        Some(ns) => Api::namespaced_with(hub.clone(), ns, &ar),
        None => Api::all_with(hub.clone(), &ar),
    }
}

fn addons(hub: &kube::Client, ns: &str) -> Api<DynamicObject> {
    api(hub, Some(ns), "addon.open-cluster-management.io", "v1alpha1", "ManagedClusterAddOn", "managedclusteraddons")
}

fn configs(hub: &kube::Client, ns: &str) -> Api<DynamicObject> {
    api(hub, Some(ns), "submarineraddon.open-cluster-management.io", "v1alpha1", "SubmarinerConfig", "submarinerconfigs")
}

fn brokers(hub: &kube::Client, set: &str) -> Api<DynamicObject> {
    api(hub, Some(&broker_namespace(set)), "submariner.io", "v1alpha1", "Broker", "brokers")
}

fn works(hub: &kube::Client, ns: &str) -> Api<DynamicObject> {
    api(hub, Some(ns), "work.open-cluster-management.io", "v1", "ManifestWork", "manifestworks")
}

fn sets(hub: &kube::Client) -> Api<DynamicObject> {
    api(hub, None, "cluster.open-cluster-management.io", "v1beta2", "ManagedClusterSet", "managedclustersets")
}

fn set_of(m: ManagedCluster) -> Option<String> {
    m.metadata.labels.and_then(|l| l.get(SET_LABEL).cloned())
}

/// Waits (bounded) until `object` of `api` satisfies `ok`.
async fn until<F: Fn(Option<&DynamicObject>) -> bool>(api: &Api<DynamicObject>, name: &str, what: &str, ok: F) {
    tokio::time::timeout(WAIT, await_condition(api.clone(), name, ok)).await.unwrap_or_else(|_| panic!("{what} within {WAIT:?}")).unwrap();
}

/// Waits (bounded) until namespace `ns` of the hub is gone.
async fn namespace_gone(hub: &kube::Client, ns: &str) {
    let api: Api<Namespace> = Api::all(hub.clone());
    tokio::time::timeout(WAIT, await_condition(api, ns, |n: Option<&Namespace>| n.is_none())).await.unwrap_or_else(|_| panic!("namespace {ns} is gone within {WAIT:?}")).unwrap();
}

fn condition<'a>(o: &'a DynamicObject, t: &str) -> Option<&'a serde_json::Value> {
    o.data.pointer("/status/conditions")?.as_array()?.iter().find(|c| c["type"] == t)
}

/// A ManagedCluster no klusterlet runs for, accepted (so the hub makes its namespace).
async fn registered_only(hub: &kube::Client, name: &str, set: Option<&str>) {
    let mcs = api(hub, None, "cluster.open-cluster-management.io", "v1", "ManagedCluster", "managedclusters");
    let labels = set.map_or(json!({}), |s| json!({SET_LABEL: s}));
    let mc: DynamicObject = serde_json::from_value(json!({"apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster",
        "metadata": {"name": name, "labels": labels}, "spec": {"hubAcceptsClient": true}}))
    .unwrap();
    mcs.create(&PostParams::default(), &mc).await.unwrap();
    let nss: Api<Namespace> = Api::all(hub.clone());
    tokio::time::timeout(WAIT, await_condition(nss, name, |n: Option<&Namespace>| n.is_some())).await.expect("the hub makes the cluster's namespace").unwrap();
}

async fn exclusive_set(hub: &kube::Client, name: &str) {
    let obj = json!({"apiVersion": "cluster.open-cluster-management.io/v1beta2", "kind": "ManagedClusterSet", "metadata": {"name": name},
        "spec": {"clusterSelector": {"selectorType": "ExclusiveClusterSetLabel"}}});
    sets(hub).patch(name, &PatchParams::apply("test"), &Patch::Apply(&obj)).await.unwrap();
}

async fn addon_for(hub: &kube::Client, cluster: &str) {
    let obj = json!({"apiVersion": "addon.open-cluster-management.io/v1alpha1", "kind": "ManagedClusterAddOn", "metadata": {"name": "submariner", "namespace": cluster},
        "spec": {"installNamespace": "submariner-operator"}});
    addons(hub, cluster).patch("submariner", &PatchParams::apply("test"), &Patch::Apply(&obj)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submariner_through_ocm_its_broker_and_its_revert() {
    let Some(bed) = start(true, HashMap::new()).await else { return };
    let client = bed.client();
    let hub = bed.hub().await;
    let mcs: Api<ManagedCluster> = Api::all(hub.clone());

    // A tunnel in a new set: the worker makes the set, waits for the add-on's broker
    // namespace and makes the Broker; both add-ons say the tunnel is up.
    let p = tunnel("member-1", "member-2", 60);
    // Its dry run first: the check runs; the new set, the SubmarinerConfigs and the add-ons
    // are judged by the hub (OCM's and the add-on's CRDs); the Broker's namespace is the
    // add-on's to make once the set exists, so the Broker is named, not sent. Nothing is
    // written.
    let dry = ferry_peer::preview::preview(&PeerConfig::new(Arc::new(ferry_kube::Clusters::new(hub.clone()))), &p.subject(), &p).await.unwrap();
    assert_eq!(dry.checked.verdict, ferry_runtime::dry_run::Verdict::Passes, "{dry:?}");
    let judged: Vec<(&str, Change)> = dry.objects.iter().map(|o| (o.object.as_str(), o.change)).collect();
    assert_eq!(
        judged,
        [
            ("ManagedClusterSet submariner", Change::Create),
            ("Broker submariner-broker/submariner-broker", Change::NotSent),
            ("SubmarinerConfig member-1/submariner", Change::Create),
            ("SubmarinerConfig member-2/submariner", Change::Create),
            ("ManagedClusterAddOn member-1/submariner", Change::Create),
            ("ManagedClusterAddOn member-2/submariner", Change::Create),
        ],
        "{dry:?}"
    );
    assert!(sets(&hub).get_opt("submariner").await.unwrap().is_none(), "the dry run made the set");
    assert!(addons(&hub, "member-1").get_opt("submariner").await.unwrap().is_none(), "the dry run made an add-on");
    // Both are in `default`, where the hub put them: a set nobody chose, so the pair gets
    // one of its own (a broker in `default` would serve the whole fleet).
    for c in ["member-1", "member-2"] {
        assert_eq!(set_of(mcs.get(c).await.unwrap()).as_deref(), Some("default"), "the hub's webhook puts {c} into default");
    }
    let (id, evs) = submit(&client, &p).await;
    assert_eq!(end(&evs), EventType::Succeeded, "{}", last(&evs));
    let steps: Vec<&str> = evs.iter().filter(|e| e.event == EventType::StepSucceeded).filter_map(|e| e.step_name.as_deref()).collect();
    assert_eq!(steps, ["check", "cluster-set", "broker", "config", "addon"]);
    let broker = brokers(&hub, "submariner").get(BROKER).await.unwrap();
    assert!(broker.metadata.labels.as_ref().unwrap().contains_key(ferry_peer::liqo::PEERING_LABEL), "the worker's Broker carries the pair's label");
    for c in ["member-1", "member-2"] {
        assert_eq!(set_of(mcs.get(c).await.unwrap()).as_deref(), Some("submariner"));
        let a = addons(&hub, c).get("submariner").await.unwrap();
        addon_ready(a.data.get("status").unwrap()).unwrap();
    }
    // The revert removes what the worker made: add-ons, configs, Broker, the set (whose
    // broker namespace the add-on then removes), and restores the membership.
    let evs = revert(&client, id).await;
    assert_eq!(end(&evs), EventType::Reverted, "{}", last(&evs));
    for c in ["member-1", "member-2"] {
        assert_eq!(set_of(mcs.get(c).await.unwrap()).as_deref(), Some("default"), "{c} is back in the set it was in");
        assert!(addons(&hub, c).get_opt("submariner").await.unwrap().is_none());
        assert!(configs(&hub, c).get_opt("submariner").await.unwrap().is_none());
    }
    namespace_gone(&hub, &broker_namespace("submariner")).await;
    until(&sets(&hub), "submariner", "the worker's set is gone", |s| s.is_none()).await;

    // A Broker that was there is left alone, at the peering and at its revert. (The add-on
    // itself deletes a set's Broker with the set's last add-on, so edge-1, a cluster of
    // the set with an add-on of its own, keeps it.)
    exclusive_set(&hub, "tunnels").await;
    registered_only(&hub, "edge-1", Some("tunnels")).await;
    addon_for(&hub, "edge-1").await;
    let nss: Api<Namespace> = Api::all(hub.clone());
    tokio::time::timeout(WAIT, await_condition(nss, "tunnels-broker", |n: Option<&Namespace>| n.is_some())).await.expect("the add-on makes tunnels-broker").unwrap();
    let theirs: DynamicObject = serde_json::from_value(json!({"apiVersion": "submariner.io/v1alpha1", "kind": "Broker", "metadata": {"name": BROKER, "namespace": "tunnels-broker"},
        "spec": {"globalnetEnabled": false}}))
    .unwrap();
    let uid = brokers(&hub, "tunnels").create(&PostParams::default(), &theirs).await.unwrap().metadata.uid;
    let mut p = tunnel("member-1", "member-2", 60);
    p.cluster_set = Some("tunnels".into());
    let (id, evs) = submit(&client, &p).await;
    assert_eq!(end(&evs), EventType::Succeeded, "{}", last(&evs));
    let b = brokers(&hub, "tunnels").get(BROKER).await.unwrap();
    assert_eq!(b.metadata.uid, uid);
    assert!(!b.metadata.labels.unwrap_or_default().contains_key(ferry_peer::liqo::PEERING_LABEL), "the worker did not take the Broker over");
    let evs = revert(&client, id).await;
    assert_eq!(end(&evs), EventType::Reverted, "{}", last(&evs));
    assert_eq!(brokers(&hub, "tunnels").get(BROKER).await.unwrap().metadata.uid, uid, "the Broker that was there is still there");
    assert!(sets(&hub).get_opt("tunnels").await.unwrap().is_some(), "the set that was there is still there");
    // A Broker the worker made stays while another cluster of the set uses it; the add-on
    // removes it after the set's last add-on.
    brokers(&hub, "tunnels").delete(BROKER, &Default::default()).await.unwrap();
    let (id, evs) = submit(&client, &p).await;
    assert_eq!(end(&evs), EventType::Succeeded, "{}", last(&evs));
    assert!(evs.iter().any(|e| e.message.as_deref() == Some("Broker tunnels-broker/submariner-broker made")), "{}", last(&evs));
    let evs = revert(&client, id).await;
    assert_eq!(end(&evs), EventType::Reverted, "{}", last(&evs));
    assert!(evs.iter().any(|e| e.message.as_deref().is_some_and(|m| m.contains("kept: edge-1 of the set use it"))), "{}", last(&evs));
    assert!(brokers(&hub, "tunnels").get_opt(BROKER).await.unwrap().is_some(), "edge-1 still uses the Broker");
    addons(&hub, "edge-1").delete("submariner", &Default::default()).await.unwrap();
    until(&brokers(&hub, "tunnels"), BROKER, "the add-on removes the Broker after the set's last add-on", |b| b.is_none()).await;

    // A gateway that never connects: the add-on never says the tunnel is up; the task
    // fails at the deadline with the agent's reason, and nothing is left. The deadline
    // must leave the add-on's agents time to come up and report the gateway on a loaded
    // machine (15 s did not in session 45's CI: member-1's lease was not there yet), so
    // the same 60 s as the tunnels that succeed.
    bed.submariner.as_ref().unwrap().set("member-2", |k| k.never_connects = true);
    let (_, evs) = submit(&client, &tunnel("member-1", "member-2", 60)).await;
    assert_eq!(end(&evs), EventType::Reverted, "{}", last(&evs));
    let f = failed(&evs);
    assert_eq!(f.step_name.as_deref(), Some("addon"), "{}", last(&evs));
    let msg = f.message.as_deref().unwrap_or("");
    assert!(msg.contains("SubmarinerConnectionDegraded=True (ConnectionsDegraded)") && msg.contains("is not established (status=connecting)"), "{f:?}");
    for c in ["member-1", "member-2"] {
        assert!(addons(&hub, c).get_opt("submariner").await.unwrap().is_none());
        assert_eq!(set_of(mcs.get(c).await.unwrap()).as_deref(), Some("default"));
    }
    bed.submariner.as_ref().unwrap().set("member-2", |k| k.never_connects = false);
    until(&sets(&hub), "submariner", "the worker's set is gone", |s| s.is_none()).await;

    // A cluster without OLM: the check says so, naming the cluster, before anything is made.
    bed.submariner.as_ref().unwrap().set("member-2", |k| k.no_olm = true);
    let crds: Api<CustomResourceDefinition> = Api::all(bed.cluster("member-2").await);
    tokio::time::timeout(WAIT, await_condition(crds, OLM_CRD, |c: Option<&CustomResourceDefinition>| c.is_none())).await.expect("OLM goes from member-2").unwrap();
    let (_, evs) = submit(&client, &tunnel("member-1", "member-2", 60)).await;
    assert_eq!(end(&evs), EventType::Rejected, "{}", last(&evs));
    let msg = failed(&evs).message.clone().unwrap_or_default();
    assert!(msg.contains("member-2 has no OLM") && msg.contains("Subscription"), "{msg}");
    assert!(sets(&hub).get_opt("submariner").await.unwrap().is_none(), "a rejected peering made nothing");
    bed.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_add_on_refuses_what_upstream_refuses() {
    // No kubeconfigs: the worker reaches only the hub, as an OCM-only deployment does.
    let knobs = HashMap::from([("member-2".to_owned(), SubmarinerKnobs { no_olm: true, ..Default::default() })]);
    let Some(bed) = start(false, knobs).await else { return };
    let client = bed.client();
    let hub = bed.hub().await;

    // member-2 has no OLM: the work agent cannot apply the operator's Subscription there
    // (the add-on's ManifestWork says so), the add-on's agent never reports the operator,
    // and the worker, which cannot look at member-2 itself, says so at the deadline
    // (naming the cluster and OLM), then undoes it all.
    let (_, evs) = submit(&client, &tunnel("member-1", "member-2", 60)).await;
    assert_eq!(end(&evs), EventType::Reverted, "{}", last(&evs));
    assert!(evs.iter().any(|e| e.message.as_deref().is_some_and(|m| m.contains("OLM on member-2 not checked"))), "{}", last(&evs));
    let f = failed(&evs);
    assert_eq!(f.step_name.as_deref(), Some("addon"), "{f:?}");
    let msg = f.message.as_deref().unwrap_or("");
    assert!(msg.contains("ManagedClusterAddOn member-2/submariner") && msg.contains("no SubmarinerAgentDegraded yet") && msg.contains("OLM"), "{msg}");
    until(&works(&hub, "member-2"), "submariner-operator", "the operator's ManifestWork goes with the add-on", |w| w.is_none()).await;
    for c in ["member-1", "member-2"] {
        assert!(addons(&hub, c).get_opt("submariner").await.unwrap().is_none());
    }
    until(&sets(&hub), "submariner", "the worker's set is gone", |s| s.is_none()).await;

    // A cluster no klusterlet runs for: the check waits for its Available in vain and
    // says why; and the add-on never gets an agent there, while member-1's reports.
    registered_only(&hub, "edge-1", None).await;
    let (_, evs) = submit(&client, &tunnel("member-1", "edge-1", 3)).await;
    assert_eq!(end(&evs), EventType::Reverted, "{}", last(&evs));
    let f = failed(&evs);
    assert_eq!(f.step_name.as_deref(), Some("check"));
    assert!(f.message.as_deref().unwrap_or("").contains("edge-1") && f.message.as_deref().unwrap_or("").contains("no klusterlet"), "{f:?}");
    addon_for(&hub, "member-1").await;
    addon_for(&hub, "edge-1").await;
    until(&addons(&hub, "member-1"), "submariner", "member-1's add-on agent reports", |a| a.and_then(|a| condition(a, "Available")).is_some_and(|c| c["status"] == "True")).await;
    let edge = addons(&hub, "edge-1").get("submariner").await.unwrap();
    assert!(condition(&edge, "Available").is_none(), "no klusterlet, no report: {:?}", edge.data.get("status"));
    let deploy = works(&hub, "edge-1").get("addon-submariner-deploy-0").await.unwrap();
    assert!(condition(&deploy, "Applied").is_none(), "no klusterlet, no work agent: {:?}", deploy.data.get("status"));
    for c in ["member-1", "edge-1"] {
        addons(&hub, c).delete("submariner", &Default::default()).await.unwrap();
        until(&addons(&hub, c), "submariner", "the add-on goes", |a| a.is_none()).await;
    }

    // The old flow (set, configs, add-ons, no Broker) hangs: the add-on says
    // BrokerConfigMissing and deploys nothing.
    exclusive_set(&hub, "legacy").await;
    for c in ["member-1", "member-2"] {
        let mcs: Api<ManagedCluster> = Api::all(hub.clone());
        mcs.patch(c, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {SET_LABEL: "legacy"}}}))).await.unwrap();
        let cfg = json!({"apiVersion": "submarineraddon.open-cluster-management.io/v1alpha1", "kind": "SubmarinerConfig", "metadata": {"name": "submariner", "namespace": c},
            "spec": {"cableDriver": "libreswan", "IPSecNATTPort": 4500, "NATTEnable": true, "gatewayConfig": {"gateways": 1}}});
        configs(&hub, c).patch("submariner", &PatchParams::apply("test"), &Patch::Apply(&cfg)).await.unwrap();
        addon_for(&hub, c).await;
    }
    for c in ["member-1", "member-2"] {
        until(&addons(&hub, c), "submariner", "BrokerConfigMissing", |a| {
            a.and_then(|a| condition(a, "SubmarinerBrokerConfigApplied")).is_some_and(|c| c["status"] == "False" && c["reason"] == "BrokerConfigMissing")
        })
        .await;
        assert!(works(&hub, c).get_opt("submariner-operator").await.unwrap().is_none(), "nothing deployed on {c} without a Broker");
    }
    let ready = |a: Option<&DynamicObject>| a.is_some_and(|a| addon_ready(a.data.get("status").unwrap_or(&json!({}))).is_ok());
    let hung = tokio::time::timeout(Duration::from_secs(3), await_condition(addons(&hub, "member-1"), "submariner", ready)).await;
    assert!(hung.is_err(), "without a Broker the tunnel never comes up");
    // With the Broker the add-on deploys; on member-2, without OLM, the work agent cannot
    // apply the operator's Subscription (the ManifestWork says so, as upstream's does) and
    // the agent never reports the operator.
    let b: DynamicObject = serde_json::from_value(json!({"apiVersion": "submariner.io/v1alpha1", "kind": "Broker", "metadata": {"name": BROKER, "namespace": "legacy-broker"},
        "spec": {"globalnetEnabled": false}}))
    .unwrap();
    brokers(&hub, "legacy").create(&PostParams::default(), &b).await.unwrap();
    until(&works(&hub, "member-2"), "submariner-operator", "member-2's work agent cannot apply OLM's objects", |w| {
        w.and_then(|w| condition(w, "Applied")).is_some_and(|c| c["status"] == "False" && c["message"].as_str().unwrap_or("").contains("operators.coreos.com"))
    })
    .await;
    until(&addons(&hub, "member-1"), "submariner", "member-1's operator is deployed", |a| {
        a.and_then(|a| condition(a, "SubmarinerAgentDegraded")).is_some_and(|c| c["status"] == "False")
    })
    .await;
    let m2 = addons(&hub, "member-2").get("submariner").await.unwrap();
    assert!(condition(&m2, "SubmarinerAgentDegraded").is_none(), "no operator on member-2, no report: {:?}", m2.data.get("status"));
    // OLM on member-2 is all that was missing.
    bed.submariner.as_ref().unwrap().set("member-2", |k| k.no_olm = false);
    for c in ["member-1", "member-2"] {
        until(&addons(&hub, c), "submariner", "the tunnel comes up once OLM is there", ready).await;
    }
    bed.stop().await;
}

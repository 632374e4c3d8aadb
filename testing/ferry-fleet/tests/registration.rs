//! OCM registration on the test bed goes only through a klusterlet, as upstream's does: a
//! ManagedCluster the admin accepts without an agent never becomes Available; a joined
//! cluster's agent makes its ManagedCluster and CSR with the bootstrap identity, which may
//! not accept it; once the CSR is approved and the cluster accepted, the agent (with its
//! own certificate, limited to its own cluster) reports it Joined and Available and renews
//! its lease; when the agent stops, the hub's lease controller marks it Unknown; a denied
//! cluster loses its acceptance; a deleted one is cleaned up and registered again. The
//! hub's webhooks and set controllers put clusters into `default` and keep `global`.

use std::time::Duration;

use ferry_fleet::emulated_ocm::EmulatedOcm;
use ferry_fleet::emulated_registration::{self, LEASE};
use ferry_fleet::{Fleet, FleetOptions, ocm_taints};
use ferry_kube::kinds::ManagedCluster;
use ferry_kube::ocm_join::{self, AGENT_NAMESPACE, BOOTSTRAP_USER, CLUSTER_NAME_LABEL, HUB_SECRET, KLUSTERLET};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use futures::StreamExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::runtime::wait::await_condition;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(90);

fn cond(m: Option<&ManagedCluster>, type_: &str) -> Option<String> {
    m.and_then(|m| m.condition(type_).map(str::to_owned))
}

async fn until<F: Fn(Option<&ManagedCluster>) -> bool>(api: &Api<ManagedCluster>, name: &str, what: &str, f: F) -> Option<ManagedCluster> {
    tokio::time::timeout(WAIT, await_condition(api.clone(), name, f)).await.unwrap_or_else(|_| panic!("{name}: {what} within {WAIT:?}")).unwrap()
}

/// Both clusters in set `s` bound to namespace `p`: a Placement without tolerations gets
/// the Available one only; one tolerating `unreachable` gets the other too; a toleration
/// without a key and without `Exists` is Misconfigured.
async fn placements_follow_the_taints(hub: &kube::Client, mcs: &Api<ManagedCluster>) {
    use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
    let ar = |g: &str, v: &str, k: &str| ApiResource::from_gvk(&GroupVersionKind::gvk(g, v, k));
    let apply = |ar: ApiResource, ns: Option<&str>, obj: serde_json::Value| {
        let api: Api<DynamicObject> = match ns {
            Some(ns) => Api::namespaced_with(hub.clone(), ns, &ar),
            None => Api::all_with(hub.clone(), &ar),
        };
        async move {
            let name = obj["metadata"]["name"].as_str().unwrap().to_owned();
            api.patch(&name, &PatchParams::apply("test"), &Patch::Apply(&obj)).await.unwrap();
        }
    };
    for c in ["member-1", "no-agent"] {
        mcs.patch(c, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {ferry_fleet::emulated_ocm::CLUSTERSET_LABEL: "s"}}}))).await.unwrap();
    }
    apply(ar("", "v1", "Namespace"), None, json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "p"}})).await;
    // The set itself: upstream's scheduler ignores a binding of a set that does not exist.
    let set = ar("cluster.open-cluster-management.io", "v1beta2", "ManagedClusterSet");
    apply(set, None, json!({"apiVersion": "cluster.open-cluster-management.io/v1beta2", "kind": "ManagedClusterSet", "metadata": {"name": "s"}, "spec": {}})).await;
    let set = ar("cluster.open-cluster-management.io", "v1beta2", "ManagedClusterSetBinding");
    apply(set, Some("p"), json!({"apiVersion": "cluster.open-cluster-management.io/v1beta2", "kind": "ManagedClusterSetBinding", "metadata": {"name": "s", "namespace": "p"}, "spec": {"clusterSet": "s"}})).await;
    let pl = ar("cluster.open-cluster-management.io", "v1beta1", "Placement");
    let placement = |name: &str, tolerations: serde_json::Value| {
        json!({"apiVersion": "cluster.open-cluster-management.io/v1beta1", "kind": "Placement", "metadata": {"name": name, "namespace": "p"}, "spec": {"tolerations": tolerations}})
    };
    apply(pl.clone(), Some("p"), placement("strict", json!([]))).await;
    apply(pl.clone(), Some("p"), placement("tolerant", json!([{"key": ocm_taints::UNREACHABLE, "operator": "Exists"}]))).await;
    // (An empty key string is refused by the schema; a missing one gets to the filter.)
    apply(pl.clone(), Some("p"), placement("wrong", json!([{"operator": "Equal", "value": "x"}]))).await;
    let decisions: Api<DynamicObject> = Api::namespaced_with(hub.clone(), "p", &ar("cluster.open-cluster-management.io", "v1beta1", "PlacementDecision"));
    // Each Placement's decision, watched until it names `want` (upstream lists a decision's clusters by name).
    let chosen = |name: &'static str, want: &'static [&'static str]| {
        let decisions = decisions.clone();
        async move {
            let config = watcher::Config::default().labels(&format!("{}={name}", ferry_fleet::emulated_ocm::PLACEMENT_LABEL));
            let mut seen = watcher(decisions, config).applied_objects().boxed();
            let names = |d: &DynamicObject| -> Vec<String> {
                d.data["status"]["decisions"].as_array().into_iter().flatten().filter_map(|d| d["clusterName"].as_str().map(str::to_owned)).collect()
            };
            let found = tokio::time::timeout(WAIT, async {
                while let Some(d) = seen.next().await {
                    if names(&d.unwrap()) == want {
                        return true;
                    }
                }
                false
            });
            assert!(found.await.unwrap_or(false), "placement {name} decides {want:?} within {WAIT:?}");
        }
    };
    chosen("strict", &["member-1"]).await;
    chosen("tolerant", &["member-1", "no-agent"]).await;
    let placements: Api<DynamicObject> = Api::namespaced_with(hub.clone(), "p", &pl);
    let misconfigured = |p: Option<&DynamicObject>| {
        p.and_then(|p| p.data["status"]["conditions"].as_array().cloned()).unwrap_or_default().iter().any(|c| c["type"] == "PlacementMisconfigured" && c["status"] == "True")
    };
    tokio::time::timeout(WAIT, await_condition(placements, "wrong", misconfigured)).await.expect("the wrong toleration is Misconfigured").unwrap();
}

/// The keys of the cluster's NoSelect taints.
fn no_select(m: Option<&ManagedCluster>) -> Vec<String> {
    let taints = m.and_then(|m| m.spec["taints"].as_array().cloned()).unwrap_or_default();
    taints.iter().filter(|t| t["effect"] == "NoSelect").filter_map(|t| t["key"].as_str().map(str::to_owned)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_goes_only_through_a_klusterlet() {
    let _ = tracing_subscriber::fmt().with_env_filter("warn").with_test_writer().try_init();
    let fleet = Fleet::start(FleetOptions { crds: true, ..FleetOptions::hub_and(1) }).await.unwrap();
    fleet.install_crds().await.unwrap();
    let _ocm = EmulatedOcm::start(&fleet).await.unwrap();
    let hub = fleet.hub().client().await.unwrap();
    let member = fleet.cluster("member-1").unwrap().client().await.unwrap();
    let kubelet = ferry_fleet::Kubelet::start("member-1", member.clone(), Duration::from_millis(100));
    kubelet.add_nodes("node", 2, &ferry_fleet::NodeFlavor::default()).await.unwrap();
    let mcs: Api<ManagedCluster> = Api::all(hub.clone());

    // Accepted by the admin, no agent: the hub accepts it and makes its lease, and nothing
    // ever says it joined or is available.
    let lone = json!({"apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster", "metadata": {"name": "no-agent"}, "spec": {"hubAcceptsClient": true}});
    mcs.patch("no-agent", &PatchParams::apply("test"), &Patch::Apply(&lone)).await.unwrap();
    until(&mcs, "no-agent", "accepted by the hub", |m| cond(m, "HubAcceptedManagedCluster").as_deref() == Some("True")).await;
    let leases: Api<Lease> = Api::namespaced(hub.clone(), "no-agent");
    tokio::time::timeout(WAIT, await_condition(leases, LEASE, |l: Option<&Lease>| l.is_some())).await.expect("its lease").unwrap();
    let m = mcs.get("no-agent").await.unwrap();
    assert_eq!(m.condition("ManagedClusterJoined"), None, "only an agent says a cluster joined");
    assert_eq!(m.condition("ManagedClusterConditionAvailable"), None, "only an agent says a cluster is available");
    // The hub's taint controller keeps Placements off it (ocm_taints).
    let m = until(&mcs, "no-agent", "tainted unreachable", |m| no_select(m) == [ocm_taints::UNREACHABLE]).await.unwrap();
    // The controller writes the taint with no time; the hub's mutating webhook stamps it,
    // and puts the cluster, made without a set, into `default`.
    assert!(m.spec["taints"][0]["timeAdded"].is_string(), "the webhook stamps the taint: {}", m.spec);
    assert_eq!(m.metadata.labels.as_ref().and_then(|l| l.get(ferry_fleet::emulated_ocm::CLUSTERSET_LABEL)).map(String::as_str), Some("default"));
    // The hub keeps `default` and `global`, and puts a changed selector back.
    let sets: Api<kube::core::DynamicObject> =
        Api::all_with(hub.clone(), &kube::core::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk("cluster.open-cluster-management.io", "v1beta2", "ManagedClusterSet")));
    // Until set `name` selects its clusters by `selector_type`.
    let selects = |name: &'static str, selector_type: &'static str, what: &'static str| {
        let found = await_condition(sets.clone(), name, move |s: Option<&kube::core::DynamicObject>| {
            s.and_then(|s| s.data.pointer("/spec/clusterSelector/selectorType")).and_then(|t| t.as_str()) == Some(selector_type)
        });
        async move { tokio::time::timeout(WAIT, found).await.expect(what).unwrap() }
    };
    selects("default", "ExclusiveClusterSetLabel", "the default set").await;
    selects("global", "LabelSelector", "the global set").await;
    sets.patch("global", &PatchParams::default(), &Patch::Merge(json!({"spec": {"clusterSelector": {"selectorType": "ExclusiveClusterSetLabel", "labelSelector": null}}}))).await.unwrap();
    selects("global", "LabelSelector", "the global selector put back").await;

    // clusteradm join: the agent makes its ManagedCluster (not accepted) and a CSR as the
    // bootstrap identity.
    ferry_fleet::crds::install(&member, vec![emulated_registration::klusterlet_crd()]).await.unwrap();
    let bootstrap = ocm_join::bootstrap_kubeconfig(&hub, None).await.unwrap();
    let on_member = ferry_kube::Clusters::new(member.clone());
    for obj in ocm_join::agent_objects("member-1", &bootstrap) {
        on_member.apply(ferry_kube::HUB, &obj, "test").await.unwrap();
    }
    let m = until(&mcs, "member-1", "made by its agent", |m| m.is_some()).await.unwrap();
    assert_eq!(m.spec["hubAcceptsClient"], false);
    let csrs: Api<CertificateSigningRequest> = Api::all(hub.clone());
    let mut made = watcher(csrs.clone(), watcher::Config::default().labels(&format!("{CLUSTER_NAME_LABEL}=member-1"))).applied_objects().boxed();
    let csr = tokio::time::timeout(WAIT, made.next()).await.expect("the agent's CSR").unwrap().unwrap();
    assert_eq!(csr.spec.username.as_deref(), Some(BOOTSTRAP_USER), "made with the bootstrap identity");
    assert_eq!(csr.spec.signer_name, "kubernetes.io/kube-apiserver-client");

    // The bootstrap identity may not accept its own cluster.
    let kc = kube::config::Kubeconfig::from_yaml(&bootstrap).unwrap();
    let boot = kube::Client::try_from(kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap()).unwrap();
    let refused = Api::<ManagedCluster>::all(boot).patch("member-1", &PatchParams::default(), &Patch::Merge(json!({"spec": {"hubAcceptsClient": true}}))).await;
    assert!(matches!(&refused, Err(kube::Error::Api(s)) if s.code == 403), "the bootstrap identity accepted a cluster: {refused:?}");
    assert_eq!(mcs.get("member-1").await.unwrap().condition("ManagedClusterConditionAvailable"), None, "not available before it is accepted");

    // clusteradm accept: the CSR approved (the signer issues the certificate), the cluster
    // accepted; the agent reports it joined and available and renews its lease.
    assert!(ocm_join::approve_csrs(&hub, "member-1").await.unwrap(), "the agent's CSR is approved");
    ocm_join::accept(&hub, "member-1", &json!({})).await.unwrap();
    until(&mcs, "member-1", "Available", |m| cond(m, "ManagedClusterConditionAvailable").as_deref() == Some("True")).await;
    until(&mcs, "member-1", "untainted once Available", |m| no_select(m).is_empty()).await;
    placements_follow_the_taints(&hub, &mcs).await;
    assert_eq!(mcs.get("member-1").await.unwrap().condition("ManagedClusterJoined"), Some("True"));
    // The agent reports what its nodes offer (two of 4 CPUs and 8 GiB), for placement's
    // ResourceAllocatable prioritizers.
    let m = until(&mcs, "member-1", "its resources reported", |m| m.is_some_and(|m| m.status["allocatable"]["cpu"] == "8")).await.unwrap();
    assert_eq!(m.status["capacity"]["memory"], (16u64 << 30).to_string());
    // The agent renews its lease every lease duration (60 s by default; 1 s from here on,
    // which restarts its updater).
    mcs.patch("member-1", &PatchParams::default(), &Patch::Merge(json!({"spec": {"leaseDurationSeconds": 1}}))).await.unwrap();
    let leases: Api<Lease> = Api::namespaced(hub.clone(), "member-1");
    let renewed = |l: &Lease| l.spec.as_ref().and_then(|s| s.renew_time.clone());
    let lease = tokio::time::timeout(WAIT, await_condition(leases.clone(), LEASE, |l: Option<&Lease>| l.is_some())).await.expect("its lease").unwrap();
    let first = lease.as_ref().and_then(renewed);
    tokio::time::timeout(WAIT, await_condition(leases.clone(), LEASE, |l: Option<&Lease>| l.and_then(renewed) != first)).await.expect("renewed").unwrap();

    // The agent's own identity (its signed certificate) reaches its cluster only.
    let secret = Api::<Secret>::namespaced(member.clone(), AGENT_NAMESPACE).get(HUB_SECRET).await.unwrap();
    let text = String::from_utf8(secret.data.unwrap()["kubeconfig"].0.clone()).unwrap();
    let agent = emulated_registration::client_from(&text).await.unwrap();
    let as_agent: Api<ManagedCluster> = Api::all(agent);
    assert!(as_agent.get("member-1").await.is_ok(), "the agent reads its own cluster");
    let other = as_agent.get("no-agent").await;
    assert!(matches!(&other, Err(kube::Error::Api(s)) if s.code == 403), "the agent read another cluster: {other:?}");

    // The agent stops (its Klusterlet removed): past five lease durations the hub's lease
    // controller says Unknown.
    let klusterlet = ocm_join::klusterlet("member-1");
    on_member.delete(ferry_kube::HUB, &klusterlet).await.unwrap();
    let m = until(&mcs, "member-1", "Unknown once the lease is stale", |m| cond(m, "ManagedClusterConditionAvailable").as_deref() == Some("Unknown")).await.unwrap();
    let c = m.status["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "ManagedClusterConditionAvailable").unwrap().clone();
    assert_eq!(c["reason"], "ManagedClusterLeaseUpdateStopped");
    until(&mcs, "member-1", "tainted unreachable again", |m| no_select(m) == [ocm_taints::UNREACHABLE]).await;
    assert_eq!(KLUSTERLET, klusterlet["metadata"]["name"]);

    // Denied: the hub withdraws its acceptance.
    mcs.patch("member-1", &PatchParams::default(), &Patch::Merge(json!({"spec": {"hubAcceptsClient": false}}))).await.unwrap();
    until(&mcs, "member-1", "denied", |m| cond(m, "HubAcceptedManagedCluster").as_deref() == Some("False")).await;

    // Deleted: the hub removes its RBAC and its finalizer; gone.
    mcs.delete("no-agent", &DeleteParams::default()).await.unwrap();
    tokio::time::timeout(WAIT, await_condition(mcs.clone(), "no-agent", |m: Option<&ManagedCluster>| m.is_none())).await.expect("deleted").unwrap();
}

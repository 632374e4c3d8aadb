//! The test bed against real API servers: kube's typed and dynamic APIs, watches,
//! server-side apply, status, finalizers, garbage collection, scheduling on emulated
//! nodes, Jobs, and the upstream CRDs' validation.

use std::collections::BTreeMap;
use std::time::Duration;

use ferry_fleet::{Fleet, FleetOptions, Kubelet, NodeFlavor};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Pod};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(90);

fn init() {
    let _ = tracing_subscriber::fmt().with_env_filter("warn").with_test_writer().try_init();
}

async fn ns(client: &kube::Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    api.create(&PostParams::default(), &ns).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_semantics_across_hub_and_two_managed_clusters() {
    init();
    let fleet = Fleet::start(FleetOptions::hub_and(2)).await.unwrap();
    assert_eq!(fleet.clusters.len(), 3);
    let hub = fleet.hub().client().await.unwrap();
    let m1 = fleet.cluster("member-1").unwrap().client().await.unwrap();

    // Isolation: each cluster has its own etcd prefix.
    ns(&hub, "apps").await;
    let on_m1: Api<Namespace> = Api::all(m1.clone());
    assert!(on_m1.get_opt("apps").await.unwrap().is_none());

    // Server-side apply, with managed fields, and a conflict for a second manager.
    let cms: Api<ConfigMap> = Api::namespaced(hub.clone(), "apps");
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "labels": {"tier": "web"}}, "data": {"k": "v1"}});
    cms.patch("c", &PatchParams::apply("ferry"), &Patch::Apply(&cm)).await.unwrap();
    let again = cms.patch("c", &PatchParams::apply("ferry"), &Patch::Apply(&cm)).await.unwrap();
    assert!(again.metadata.managed_fields.unwrap().iter().any(|m| m.manager.as_deref() == Some("ferry")));
    let other = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": "v2"}});
    let conflict = cms.patch("c", &PatchParams::apply("intruder"), &Patch::Apply(&other)).await.unwrap_err();
    assert!(matches!(conflict, kube::Error::Api(ref s) if s.code == 409), "{conflict:?}");

    // Label selectors, and a watcher + reflector that sees a later object.
    cms.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "d", "labels": {"tier": "db"}}})).unwrap())
        .await
        .unwrap();
    let web = cms.list(&ListParams::default().labels("tier=web")).await.unwrap();
    assert_eq!(web.items.len(), 1);
    // A reflector's store holds the selected objects once the initial list is in.
    let (reader, writer) = reflector::store::<ConfigMap>();
    let drain = tokio::spawn(reflector(writer, watcher(cms.clone(), watcher::Config::default().labels("tier"))).for_each(|_| async {}));
    tokio::time::timeout(WAIT, reader.wait_until_ready()).await.unwrap().unwrap();
    assert_eq!(reader.state().len(), 2);
    // A watch sees an object created after it started.
    let stream = watcher(cms.clone(), watcher::Config::default().labels("tier=cache")).applied_objects();
    let seen = tokio::spawn(async move {
        let mut stream = stream.boxed();
        stream.try_next().await.unwrap().unwrap()
    });
    cms.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "e", "labels": {"tier": "cache"}}})).unwrap())
        .await
        .unwrap();
    let seen = tokio::time::timeout(WAIT, seen).await.expect("watch delivers the new object").unwrap();
    assert_eq!(seen.metadata.name.as_deref(), Some("e"));
    drain.abort();

    // Finalizers hold a deletion until removed; the namespace controller then empties it.
    let fin = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "f", "finalizers": ["ferry.dev/cleanup"]}});
    cms.patch("f", &PatchParams::apply("ferry"), &Patch::Apply(&fin)).await.unwrap();
    cms.delete("f", &DeleteParams::default()).await.unwrap();
    let held = cms.get("f").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    let uid = held.metadata.uid.clone().unwrap();
    cms.patch("f", &PatchParams::default(), &Patch::Merge(&json!({"metadata": {"finalizers": null}}))).await.unwrap();
    tokio::time::timeout(WAIT, await_condition(cms.clone(), "f", conditions::is_deleted(&uid))).await.unwrap().unwrap();

    // Cascading deletion through ownerReferences (the garbage collector runs).
    let owner = cms.get("d").await.unwrap();
    let child = json!({"metadata": {"name": "child", "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap",
        "name": "d", "uid": owner.metadata.uid.clone().unwrap()}]}});
    let child = cms.create(&PostParams::default(), &serde_json::from_value(child).unwrap()).await.unwrap();
    cms.delete("d", &DeleteParams::foreground()).await.unwrap();
    let child_uid = child.metadata.uid.unwrap();
    tokio::time::timeout(WAIT, await_condition(cms.clone(), "child", conditions::is_deleted(&child_uid))).await.unwrap().unwrap();

    // The dynamic API and status patches, on a Deployment of member-2.
    let m2 = fleet.cluster("member-2").unwrap().client().await.unwrap();
    ns(&m2, "apps").await;
    let gvk = GroupVersionKind::gvk("apps", "v1", "Deployment");
    let dynapi: Api<DynamicObject> = Api::namespaced_with(m2.clone(), "apps", &ApiResource::from_gvk(&gvk));
    let dep = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}]}}}});
    dynapi.patch("web", &PatchParams::apply("ferry"), &Patch::Apply(&dep)).await.unwrap();
    let deps: Api<Deployment> = Api::namespaced(m2, "apps");
    let got = deps.get("web").await.unwrap();
    assert_eq!(got.spec.replicas, Some(0));
    let bad = dynapi
        .patch("web", &PatchParams::apply("ferry"), &Patch::Apply(&json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}, "spec": {"replicas": "many"}})))
        .await
        .unwrap_err();
    // 1.20 answers a mistyped field in server-side apply with 500 and the field path.
    assert!(matches!(bad, kube::Error::Api(ref s) if s.message.contains(".spec.replicas")), "{bad:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_beyond_capacity_stay_pending_and_a_job_completes() {
    init();
    let fleet = Fleet::start(FleetOptions { clusters: vec!["edge".into()], ..FleetOptions::default() }).await.unwrap();
    let client = fleet.hub().client().await.unwrap();
    let kubelet = Kubelet::start("edge", client.clone(), Duration::from_millis(200));
    let flavor = NodeFlavor { cpu: "2".into(), memory: "4Gi".into(), pods: 110, labels: BTreeMap::new(), taints: Vec::new() };
    kubelet.add_nodes("worker", 1, &flavor).await.unwrap();
    // A tainted node of the flavor: nothing without a toleration lands there.
    let tainted = NodeFlavor {
        taints: vec![serde_json::from_value(json!({"key": "dedicated", "value": "gpu", "effect": "NoSchedule"})).unwrap()],
        ..NodeFlavor::default()
    };
    let gpu = kubelet.add_nodes("gpu", 1, &tainted).await.unwrap();
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let node = nodes.get(&gpu[0]).await.unwrap();
    let taints = node.spec.clone().unwrap().taints.unwrap();
    assert_eq!(taints.len(), 1, "only the flavor's taint: {taints:?}");
    assert_eq!(taints[0].key, "dedicated");
    let heartbeat = |n: &k8s_openapi::api::core::v1::Node| {
        n.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready")?.last_heartbeat_time.clone()
    };
    let first_beat = heartbeat(&node);
    ns(&client, "load").await;
    // Pods need the namespace's default service account and its token (the controllers make them).
    tokio::time::timeout(WAIT, ferry_fleet::kubelet::await_pod_admission(&client, "load")).await.unwrap().unwrap();

    let deps: Api<Deployment> = Api::namespaced(client.clone(), "load");
    let dep = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "big"},
        "spec": {"replicas": 4, "selector": {"matchLabels": {"app": "big"}},
            "template": {"metadata": {"labels": {"app": "big"}}, "spec": {"containers": [{"name": "c", "image": "busybox:1.36",
                "resources": {"requests": {"cpu": "900m", "memory": "256Mi"}}}]}}}});
    deps.patch("big", &PatchParams::apply("ferry"), &Patch::Apply(&dep)).await.unwrap();
    // Two 900m pods fit on 2 CPUs; the Deployment settles at 2 ready replicas.
    let two_ready = |d: Option<&Deployment>| d.and_then(|d| d.status.as_ref()).and_then(|s| s.ready_replicas) == Some(2);
    tokio::time::timeout(WAIT, await_condition(deps.clone(), "big", two_ready)).await.expect("2 ready").unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "load");
    let events: Api<Event> = Api::namespaced(client.clone(), "load");
    let unschedulable = tokio::time::timeout(WAIT, async {
        loop {
            let evs = events.list(&ListParams::default()).await.unwrap();
            if let Some(e) = evs.items.iter().find(|e| e.reason.as_deref() == Some("FailedScheduling")) {
                return e.message.clone().unwrap_or_default();
            }
            // Events arrive asynchronously: wait for the next one.
            let mut w = watcher(events.clone(), watcher::Config::default()).applied_objects().boxed();
            let _ = w.next().await;
        }
    })
    .await
    .expect("a FailedScheduling event");
    assert!(unschedulable.contains("Insufficient cpu"), "{unschedulable}");
    let all = pods.list(&ListParams::default().labels("app=big")).await.unwrap();
    assert!(all.items.iter().all(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(gpu[0].as_str())), "the taint kept pods off");
    let phases: Vec<String> = all.items.iter().filter_map(|p| p.status.as_ref()?.phase.clone()).collect();
    assert_eq!(phases.iter().filter(|p| *p == "Running").count(), 2, "{phases:?}");
    assert_eq!(phases.iter().filter(|p| *p == "Pending").count(), 2, "{phases:?}");

    let jobs: Api<Job> = Api::namespaced(client.clone(), "load");
    let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "bench"},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "b", "image": "busybox:1.36",
            "resources": {"requests": {"cpu": "100m"}}}]}}}});
    jobs.patch("bench", &PatchParams::apply("ferry"), &Patch::Apply(&job)).await.unwrap();
    let complete = |j: Option<&Job>| {
        j.and_then(|j| j.status.as_ref())
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Complete" && c.status == "True"))
    };
    tokio::time::timeout(WAIT, await_condition(jobs, "bench", complete)).await.expect("job completes").unwrap();

    // A LoadBalancer Service gets an address; the API server gave it a ClusterIP.
    let svcs: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(client.clone(), "load");
    let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"type": "LoadBalancer", "selector": {"app": "big"}, "ports": [{"port": 80, "protocol": "TCP"}]}});
    svcs.patch("web", &PatchParams::apply("ferry"), &Patch::Apply(&svc)).await.unwrap();
    let has_ip = |s: Option<&k8s_openapi::api::core::v1::Service>| {
        s.and_then(|s| s.status.as_ref()?.load_balancer.as_ref()?.ingress.as_ref()).is_some_and(|i| !i.is_empty())
    };
    let svc = tokio::time::timeout(WAIT, await_condition(svcs, "web", has_ip)).await.expect("a load balancer address").unwrap().unwrap();
    assert!(svc.spec.unwrap().cluster_ip.is_some_and(|ip| ip.starts_with("10.96.")));

    // The emulated kubelet renews its nodes' heartbeats (every 10 s).
    let renewed = |n: Option<&k8s_openapi::api::core::v1::Node>| n.and_then(heartbeat) != first_beat;
    tokio::time::timeout(WAIT, await_condition(nodes, &gpu[0], renewed)).await.expect("a new heartbeat").unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubeadm_node_is_not_ready_until_a_cni_runs_on_it() {
    use k8s_openapi::api::apps::v1::DaemonSet;
    use k8s_openapi::api::core::v1::Node;
    init();
    let fleet = Fleet::start(FleetOptions { clusters: vec!["kubeadm".into()], ..FleetOptions::default() }).await.unwrap();
    let client = fleet.hub().client().await.unwrap();
    let kubelet = Kubelet::start("kubeadm", client.clone(), Duration::from_millis(100));
    kubelet.require_cni();
    let node = kubelet.add_nodes("md", 1, &NodeFlavor::default()).await.unwrap().remove(0);
    let nodes: Api<Node> = Api::all(client.clone());
    let ready = |n: &Node| n.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready").cloned();
    let n = nodes.get(&node).await.unwrap();
    let cond = ready(&n).unwrap();
    assert_eq!(cond.status, "False");
    assert!(cond.message.unwrap_or_default().contains("NetworkPluginNotReady"));
    let taints: Vec<String> = n.spec.unwrap().taints.unwrap_or_default().into_iter().map(|t| t.key).collect();
    assert_eq!(taints, ["node.kubernetes.io/not-ready"]);
    ns(&client, "apps").await;
    tokio::time::timeout(WAIT, ferry_fleet::kubelet::await_pod_admission(&client, "apps")).await.unwrap().unwrap();
    // A pod that tolerates the taint but needs the pod network is bound and waits.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "apps");
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
        "spec": {"tolerations": [{"operator": "Exists"}], "containers": [{"name": "c", "image": "nginx:1.27"}]}});
    // The admission plugin reads the account through an informer that may lag ours by a
    // moment; it says so with a ServerTimeout and a retry-after, which a client honours.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match pods.patch("web", &PatchParams::apply("ferry"), &Patch::Apply(&pod)).await {
            Ok(_) => break,
            Err(kube::Error::Api(s)) if s.reason == "ServerTimeout" && tokio::time::Instant::now() < deadline => {
                let after = s.details.map_or(1, |d| u64::from(d.retry_after_seconds).max(1));
                tokio::time::sleep(Duration::from_secs(after)).await;
            }
            Err(e) => panic!("creating the pod: {e}"),
        }
    }
    let bound = |p: Option<&Pod>| p.and_then(|p| p.spec.as_ref()?.node_name.clone()).is_some();
    tokio::time::timeout(WAIT, await_condition(pods.clone(), "web", bound)).await.expect("the pod is bound").unwrap();
    // The CNI's node agent (host network, the CNI configuration directory from the host).
    let agents: Api<DaemonSet> = Api::namespaced(client.clone(), "kube-system");
    let ds = json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "calico-node"},
        "spec": {"selector": {"matchLabels": {"k8s-app": "calico-node"}}, "template": {"metadata": {"labels": {"k8s-app": "calico-node"}},
            "spec": {"hostNetwork": true, "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "calico-node", "image": "quay.io/calico/node:v3.29.1", "volumeMounts": [{"name": "cni", "mountPath": "/host/etc/cni/net.d"}]}],
                "volumes": [{"name": "cni", "hostPath": {"path": "/etc/cni/net.d"}}]}}}});
    // Until it runs, the pod waits for its sandbox.
    assert_eq!(pods.get("web").await.unwrap().status.and_then(|s| s.phase).as_deref(), Some("Pending"));
    agents.patch("calico-node", &PatchParams::apply("ferry"), &Patch::Apply(&ds)).await.unwrap();
    let is_ready = |n: Option<&Node>| n.and_then(ready).is_some_and(|c| c.status == "True");
    tokio::time::timeout(WAIT, await_condition(nodes.clone(), &node, is_ready)).await.expect("the node becomes Ready").unwrap();
    let running = |p: Option<&Pod>| p.and_then(|p| p.status.as_ref()?.phase.clone()).as_deref() == Some("Running");
    tokio::time::timeout(WAIT, await_condition(pods, "web", running)).await.expect("the waiting pod starts").unwrap();
    let untainted = |n: Option<&Node>| n.is_some_and(|n| n.spec.as_ref().and_then(|s| s.taints.as_ref()).is_none_or(|t| t.iter().all(|t| t.key != "node.kubernetes.io/not-ready")));
    tokio::time::timeout(WAIT, await_condition(nodes, &node, untainted)).await.expect("the not-ready taint goes").unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_crds_install_and_the_server_validates_against_them() {
    init();
    let Some(dir) = ferry_fleet::crds::shared_dir() else {
        println!("skipped: ../shared/crds is not present beside the project");
        return;
    };
    let fleet = Fleet::start(FleetOptions { clusters: vec!["hub".into()], controllers: false, ..FleetOptions::default() }).await.unwrap();
    let client = fleet.hub().client().await.unwrap();
    let mut installed = Vec::new();
    for sub in ["cluster-api", "cluster-api-provider-openstack", "open-cluster-management", "liqo", "strimzi", "submariner-addon"] {
        installed.extend(ferry_fleet::crds::install_dir(&client, &dir.join(sub)).await.unwrap_or_else(|e| panic!("{sub}: {e}")));
    }
    assert!(installed.len() >= 45, "{installed:?}");
    refuses_a_mistyped_cluster_and_takes_a_right_one(&client).await;
}

/// Cluster API's Cluster schema is enforced on `client`'s server: a wrong type is refused
/// naming the field, the right one taken.
async fn refuses_a_mistyped_cluster_and_takes_a_right_one(client: &kube::Client) {
    ns(client, "capi").await;
    let gvk = GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Cluster");
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "capi", &ApiResource::from_gvk(&gvk));
    let bad = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "metadata": {"name": "c1"}, "spec": {"paused": "notabool"}});
    let err = api.patch("c1", &PatchParams::apply("ferry"), &Patch::Apply(&bad)).await.unwrap_err();
    let kube::Error::Api(status) = err else { panic!("{err:?}") };
    assert!(status.message.contains("spec.paused"), "{}", status.message);
    let good = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "metadata": {"name": "c1"}, "spec": {"paused": true}});
    api.patch("c1", &PatchParams::apply("ferry"), &Patch::Apply(&good)).await.unwrap();
}

/// A fleet started with its CRDs stored ahead ([`ferry_fleet::crd_seed`]) serves exactly
/// what installing them through the API gives: every CRD, Established, on every cluster,
/// its schema enforced; the stored form is recorded (the cache emptied first: other fleets
/// only ever read it) and cached for the next fleet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preloaded_crds_are_served_and_validated_as_installed_ones() {
    init();
    let Some(shared) = ferry_fleet::crds::shared_dir() else {
        println!("skipped: ../shared/crds is not present beside the project");
        return;
    };
    let crds = ferry_fleet::crds::upstream_subset(&shared).unwrap();
    let bins = ferry_fleet::binaries::Binaries::locate().unwrap();
    let cached = ferry_fleet::crd_seed::cache_file(&ferry_fleet::binaries::cache_dir(), &crds, &bins.apiserver);
    // Another test's fleet that finds no file records one too: removing it races with nothing.
    let _ = std::fs::remove_file(&cached);
    let fleet = Fleet::start(FleetOptions { crds: true, controllers: false, ..FleetOptions::hub_and(1) }).await.unwrap();
    assert_eq!(fleet.install_crds().await.unwrap(), ferry_fleet::CrdSource::Upstream);
    let wanted: BTreeMap<String, serde_json::Value> = crds
        .iter()
        .map(|c| (c["metadata"]["name"].as_str().unwrap().to_owned(), c["spec"]["versions"][0]["name"].clone()))
        .collect();
    for c in &fleet.clusters {
        let client = c.client().await.unwrap();
        let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> = Api::all(client.clone());
        let served: BTreeMap<String, serde_json::Value> = crds
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|crd| {
                let name = crd.metadata.name.clone().unwrap();
                let established = crd.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|cs| cs.iter().any(|x| x.type_ == "Established" && x.status == "True"));
                assert!(established, "{}: {name} is not Established", c.name);
                (name, json!(crd.spec.versions[0].name))
            })
            .collect();
        assert_eq!(served, wanted, "{}", c.name);
        // Served and validated.
        refuses_a_mistyped_cluster_and_takes_a_right_one(&client).await;
    }
    assert_eq!(ferry_fleet::crd_seed::load(&cached).map(|s| s.len()), Some(wanted.len()), "the seed is cached at {}", cached.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_projects_crd_subset_matches_upstream_names_and_serves_objects() {
    init();
    // Names, scope and storage version agree with the upstream CRDs (when present).
    if let Some(dir) = ferry_fleet::crds::shared_dir() {
        let mut upstream = std::collections::HashMap::new();
        for sub in std::fs::read_dir(&dir).unwrap().flatten().filter(|e| e.path().is_dir()) {
            for f in std::fs::read_dir(sub.path()).unwrap().flatten() {
                let text = std::fs::read_to_string(f.path()).unwrap();
                let v: serde_json::Value = serde_yaml_ng::from_str(&text).unwrap();
                let s = &v["spec"];
                let storage = s["versions"].as_array().unwrap().iter().find(|x| x["storage"] == true).unwrap()["name"].clone();
                upstream.insert(v["metadata"]["name"].as_str().unwrap().to_owned(), (s["names"]["kind"].clone(), s["scope"].clone(), storage));
            }
        }
        for crd in ferry_fleet::kinds::crds() {
            let name = crd["metadata"]["name"].as_str().unwrap();
            let (kind, scope, version) = upstream.get(name).unwrap_or_else(|| panic!("{name} is not an upstream CRD"));
            assert_eq!(&crd["spec"]["names"]["kind"], kind, "{name}");
            assert_eq!(&crd["spec"]["scope"], scope, "{name}");
            assert_eq!(&crd["spec"]["versions"][0]["name"], version, "{name}");
        }
    } else {
        println!("skipped the upstream comparison: ../shared/crds is not present");
    }
    let fleet = Fleet::start(FleetOptions { clusters: vec!["hub".into()], controllers: false, ..FleetOptions::default() }).await.unwrap();
    fleet.install_project_crds().await.unwrap();
    let client = fleet.hub().client().await.unwrap();
    ns(&client, "fleet").await;
    for (group, version, kind, plural, namespaced, status) in ferry_fleet::kinds::KINDS {
        let gvk = GroupVersionKind::gvk(group, version, kind);
        // Explicit plurals: guessing gets Liqo's "publickeies" wrong.
        let ar = ApiResource::from_gvk_with_plural(&gvk, plural);
        let api: Api<DynamicObject> = if *namespaced { Api::namespaced_with(client.clone(), "fleet", &ar) } else { Api::all_with(client.clone(), &ar) };
        let obj = json!({"apiVersion": format!("{group}/{version}"), "kind": kind, "metadata": {"name": "probe"}, "spec": {"any": {"shape": [1, 2]}}});
        api.patch("probe", &PatchParams::apply("ferry"), &Patch::Apply(&obj)).await.unwrap_or_else(|e| panic!("{kind}: {e}"));
        if *status {
            let st = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
            let got = api.patch_status("probe", &PatchParams::default(), &Patch::Merge(&st)).await.unwrap();
            assert_eq!(got.data["status"]["conditions"][0]["type"], "Ready", "{kind}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emulated_controller_acts_after_its_delay_and_through_injected_failures() {
    init();
    let fleet = Fleet::start(FleetOptions { clusters: vec!["hub".into()], controllers: false, ..FleetOptions::default() }).await.unwrap();
    let client = fleet.hub().client().await.unwrap();
    ns(&client, "emu").await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "emu");
    let attempts = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let seen = attempts.clone();
    let writer = cms.clone();
    // Plays a provider: marks every ConfigMap "provisioned".
    let knobs = ferry_fleet::emulate::Knobs { delay: Duration::from_millis(300), stuck: false, fail_next: 2 };
    let emu = ferry_fleet::emulate::run(cms.clone(), knobs, move |cm: std::sync::Arc<ConfigMap>| {
        seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let writer = writer.clone();
        async move {
            if cm.data.as_ref().and_then(|d| d.get("phase")).is_some() {
                return Ok(());
            }
            let patch = json!({"data": {"phase": "Provisioned"}});
            writer.patch(&cm.metadata.name.clone().unwrap(), &PatchParams::default(), &Patch::Merge(&patch)).await.map(|_| ())
        }
    });
    let created = std::time::Instant::now();
    cms.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "c1"}})).unwrap()).await.unwrap();
    let provisioned = |c: Option<&ConfigMap>| c.and_then(|c| c.data.as_ref()).is_some_and(|d| d.get("phase").is_some());
    tokio::time::timeout(WAIT, await_condition(cms.clone(), "c1", provisioned)).await.unwrap().unwrap();
    assert!(created.elapsed() >= Duration::from_millis(300), "acted no earlier than its delay");
    assert!(attempts.load(std::sync::atomic::Ordering::Relaxed) >= 1);
    // Held stuck, then released: the object is provisioned once released.
    emu.set(|k| k.stuck = true);
    emu.set(|k| k.delay = Duration::ZERO);
    cms.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "c2"}})).unwrap()).await.unwrap();
    emu.set(|k| k.stuck = false);
    // A change makes the controller look again.
    cms.patch("c2", &PatchParams::default(), &Patch::Merge(&json!({"metadata": {"labels": {"poke": "1"}}}))).await.unwrap();
    tokio::time::timeout(WAIT, await_condition(cms, "c2", provisioned)).await.unwrap().unwrap();
}

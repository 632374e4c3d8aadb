//! The create-cluster worker end to end: commands through a real Kafka-protocol broker
//! (the embedded mock cluster), the worker, and the test bed's hub (a real API server)
//! with emulated Cluster API providers (workload clusters are real or virtual API servers)
//! and emulated OCM registration.

use std::sync::Arc;
use std::time::Duration;

use ferry_cluster::spec::{AddonRequest, ClusterCommand, ClusterOperation, MachinePool, OcmRegistration, WorkerPool};
use ferry_cluster::{Catalog, ClusterConfig, ClusterHandler};
use ferry_testkit::cluster as demo;
use ferry_fleet::emulated_capi::{CapiOptions, EmulatedCapi};
use ferry_kube::Clusters;
use ferry_kube::dry_run::Change;
use ferry_runtime::dry_run::Verdict;
use ferry_fleet::emulated_ocm::WORK_FINALIZER;
use ferry_fleet::emulated_registration::GC_FINALIZER;
use ferry_kube::kinds::{CapiCluster, ManagedCluster, ManifestWork};
use ferry_runtime::{Client, EventType, ProgressEvent, SubmitOptions, TaskKind};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::wait::await_condition;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(300);

/// The test kit's bed with emulated OCM (and its webhooks) and Cluster API, and the
/// create-cluster worker run as a task a test may abort.
struct Bed {
    bed: ferry_testkit::Bed,
}

impl Bed {
    async fn start(opts: CapiOptions) -> Option<Self> {
        let bed = ferry_testkit::Bed::builder().ocm().capi(opts).start().await?;
        bed.capi.as_ref().expect("emulated Cluster API").set_default(|k| k.provision_delay = Duration::from_millis(300));
        Some(Self { bed })
    }

    fn capi(&self) -> &EmulatedCapi {
        self.bed.capi.as_ref().expect("emulated Cluster API")
    }

    /// Starts a worker (its own process in production; a task here, which a test may
    /// abort to lose it without a graceful stop).
    async fn start_worker(&self) -> tokio::task::JoinHandle<()> {
        let clusters = Arc::new(Clusters::new(self.hub().await));
        let mut cfg = ClusterConfig::new(clusters);
        cfg.catalog = Arc::new(Catalog::emulated());
        cfg.registration_timeout = Duration::from_secs(60);
        cfg.removal_timeout = Duration::from_secs(120);
        let mut opts = self.bed.worker_options();
        opts.revoke_grace = Duration::from_secs(1);
        self.bed.spawn_worker(opts, ClusterHandler::new(cfg))
    }

    fn client(&self) -> Client {
        self.bed.client()
    }

    async fn hub(&self) -> kube::Client {
        self.bed.hub().await
    }

    async fn stop(self, worker: tokio::task::JoinHandle<()>) {
        let Self { mut bed } = self;
        bed.adopt(worker);
        bed.stop().await;
    }
}

fn last(evs: &[ProgressEvent]) -> &ProgressEvent {
    evs.last().expect("a final event")
}

fn small(name: &str) -> ClusterCommand {
    ClusterCommand {
        name: name.into(),
        namespace: Some("fleet".into()),
        infrastructure: "docker".into(),
        version: "v1.33.1".into(),
        control_plane: MachinePool { count: Some(1), flavor: None },
        workers: WorkerPool { count: Some(1), flavor: None },
        ready_timeout_seconds: Some(240),
        addon_timeout_seconds: Some(60),
        // kubeadm: the nodes are NotReady until a pod network runs.
        addons: vec![AddonRequest { name: "cni".into(), ..AddonRequest::default() }],
        ..ClusterCommand::default()
    }
}

async fn nodes_of(hub: &kube::Client, cluster: &str) -> usize {
    let client = Clusters::new(hub.clone()).client(cluster).await.unwrap();
    Api::<Node>::all(client)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|n| n.metadata.name.as_deref().unwrap_or("").starts_with(&format!("{cluster}-")))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_with_addons_and_ocm_then_scale_revert_and_delete() {
    let Some(bed) = Bed::start(CapiOptions::default()).await else {
        return;
    };
    let h = bed.start_worker().await;
    let client = bed.client();
    let hub = bed.hub().await;

    // `ferry dev --demo create-cluster`: create (CNI, MetalLB, OCM), scale 2 → 3, delete.
    assert!(demo::run(&client, &hub).await.unwrap(), "the demo's checks failed (see its output)");

    // Every step reported progress with a percent; the add-ons were steps of their own.
    let cmd = small("scaled");
    let mut with_addon = cmd.clone();
    with_addon.addons.push(AddonRequest { name: "ingress-nginx".into(), ..AddonRequest::default() });
    let (id, evs) = demo::submit(&client, &with_addon, WAIT).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Succeeded, "{:?}", last(&evs));
    let steps: Vec<String> = evs.iter().filter(|e| e.event == EventType::StepSucceeded).filter_map(|e| e.step_name.clone()).collect();
    // The CNI before the nodes are waited for (kubeadm's stay NotReady without one), the
    // other add-ons after.
    assert_eq!(steps, ["check", "apply", "infrastructure", "control-plane", "kubeconfig", "addon-cni", "nodes", "addon-ingress-nginx"]);
    for s in &steps {
        assert!(
            evs.iter().any(|e| e.event == EventType::StepProgress && e.step_name.as_ref() == Some(s) && e.percent.is_some()),
            "no progress percent from step {s}"
        );
    }
    // The task names the kubeconfig Secret; the kubeconfig itself never reaches Kafka.
    let snap = client.snapshot(id).await.unwrap().unwrap();
    let kc = ferry_cluster::steps::kubeconfig::KUBECONFIG.from_snapshot(&snap).unwrap();
    assert_eq!(kc.secret, "fleet/scaled-kubeconfig");
    assert_eq!(nodes_of(&hub, "scaled").await, 2);
    let secret = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(hub.clone(), "fleet").get("scaled-kubeconfig").await.unwrap();
    let text = String::from_utf8(secret.data.unwrap()["value"].0.clone()).unwrap();
    let token: Vec<String> = text.lines().filter_map(|l| l.trim().strip_prefix("token: ").map(str::to_owned)).collect();
    assert_eq!(token.len(), 1, "the workload kubeconfig has a token");
    let mut scanned = 0;
    for t in bed.bed.topics.all() {
        for (_, payload) in client.read_to_end(&t.name).await.unwrap() {
            assert_eq!(ferry_runtime::secrets::find_with(&payload, &token), None, "secret material on {}", t.name);
            scanned += 1;
        }
    }
    assert!(scanned > 50, "the scan read the topics ({scanned} records)");

    // Scale to 3 workers, then revert the scale: back to 1 worker.
    let (id, evs) = demo::submit(&client, &demo::scale(&cmd, 3), WAIT).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Succeeded, "{:?}", last(&evs));
    assert_eq!(nodes_of(&hub, "scaled").await, 4);
    // A pod on the last worker under a PodDisruptionBudget that allows no disruption
    // (policy/v1beta1: the test bed is Kubernetes 1.20): Cluster API drains that node
    // before it deletes its Machine, and the budget holds the drain.
    let workload = Clusters::new(hub.clone()).client("scaled").await.unwrap();
    let held = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "held", "namespace": "default", "labels": {"app": "held"}},
        "spec": {"nodeName": "scaled-md-0-2", "containers": [{"name": "held", "image": "nginx:1.25"}]}});
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(workload.clone(), "default");
    pods.create(&Default::default(), &serde_json::from_value(held).unwrap()).await.unwrap();
    // Running first: the API server evicts a Pending pod without asking its budget
    // (`eviction.go` `canIgnorePDB`).
    let running = |p: Option<&k8s_openapi::api::core::v1::Pod>| p.and_then(|p| p.status.as_ref()).and_then(|s| s.phase.as_deref()) == Some("Running");
    tokio::time::timeout(WAIT, await_condition(pods.clone(), "held", running)).await.expect("the held pod runs").unwrap();
    let budgets = kube::api::ApiResource::from_gvk_with_plural(&kube::api::GroupVersionKind::gvk("policy", "v1beta1", "PodDisruptionBudget"), "poddisruptionbudgets");
    let budgets: Api<kube::api::DynamicObject> = Api::namespaced_with(workload.clone(), "default", &budgets);
    let budget = json!({"apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget", "metadata": {"name": "held"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "held"}}}});
    budgets.create(&Default::default(), &serde_json::from_value(budget).unwrap()).await.unwrap();
    let mut events = client.events(false).await.unwrap();
    client.revert(id).await.unwrap();
    // The revert's wait says what Cluster API says holds the Machine (its `Deleting`
    // condition), while it lasts.
    let holding = |e: &ProgressEvent| e.event == EventType::StepProgress && e.message.as_deref().is_some_and(|m| m.contains("disruption budget"));
    let evs = events.until(id, WAIT, holding).await.expect("the revert says what holds the scale down");
    let held_evs = evs.clone();
    let said = last(&evs).message.clone().unwrap_or_default();
    assert!(
        said.starts_with("Machine scaled-md-0-2 is being deleted (DrainingNode): Drain not completed yet (started at ")
            && said.contains("* Pod default/held: cannot evict pod as it would violate the pod's disruption budget."),
        "{said}"
    );
    let machines: Api<ferry_kube::kinds::CapiMachine> = Api::namespaced(hub.clone(), "fleet");
    let draining = machines.get("scaled-md-0-2").await.unwrap();
    assert!(draining.metadata.deletion_timestamp.is_some(), "{:?}", draining.metadata);
    let node = Api::<Node>::all(workload.clone()).get("scaled-md-0-2").await.unwrap();
    assert_eq!(node.spec.and_then(|s| s.unschedulable), Some(true), "the draining node is cordoned");
    assert_eq!(pods.get("held").await.unwrap().metadata.deletion_timestamp, None, "the budget let no eviction through");
    // Relaxed, the budget lets the eviction through: the drain ends, the Machine goes.
    budgets.patch("held", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"minAvailable": 0}}))).await.unwrap();
    let evs = events.until(id, WAIT, |e| e.event.is_final()).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Reverted, "{:?}", last(&evs));
    // The scale's undo says how far it is, and that only rises (it said 50 %, then 25 %
    // while machines went, then 50 % again).
    let percents: Vec<(i32, String)> = held_evs
        .iter()
        .chain(&evs)
        .filter(|e| e.event == EventType::StepProgress && e.step_name.as_deref() == Some("scale"))
        .map(|e| (e.percent.unwrap_or_default(), e.message.clone().unwrap_or_default()))
        .collect();
    assert!(percents.windows(2).all(|w| w[0].0 <= w[1].0) && percents.last().is_some_and(|p| p.0 == 100), "{percents:#?}");
    assert_eq!(nodes_of(&hub, "scaled").await, 2, "the revert restored 1 control-plane and 1 worker node");
    assert!(machines.get_opt("scaled-md-0-2").await.unwrap().is_none(), "the drained Machine is gone");

    // A revert of the create deletes what it created.
    let mut events = client.events(false).await.unwrap();
    let snaps = client.snapshots().await.unwrap();
    let create =
        snaps.iter().find(|s| s.subject == "fleet/scaled" && s.kind == TaskKind::CREATE_CLUSTER && s.journal.iter().any(|j| j.name == "apply")).unwrap();
    let create_id = create.task_id.parse().unwrap();
    client.revert(create_id).await.unwrap();
    let evs = events.until(create_id, WAIT, |e| e.event.is_final()).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Reverted, "{:?}", last(&evs));
    assert_eq!(demo::leftovers(&hub, &cmd).await.unwrap(), Vec::<String>::new());

    bed.stop(h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_revert_bad_input_is_rejected_and_a_topology_works() {
    let Some(bed) = Bed::start(CapiOptions::default()).await else {
        return;
    };
    let h = bed.start_worker().await;
    let client = bed.client();
    let hub = bed.hub().await;
    bed.capi().set_default(|k| k.crashing_images = vec!["ferry.invalid/crashing".into()]);
    demo::cluster_set(&hub, "edge").await.unwrap();

    // The second add-on crash-loops: the task fails there and reverts everything.
    let mut cmd = small("doomed");
    cmd.addons = vec![AddonRequest { name: "cni".into(), ..AddonRequest::default() }, AddonRequest { name: "crashing".into(), ..AddonRequest::default() }];
    cmd.ocm = OcmRegistration { enabled: true, cluster_set: Some("edge".into()) };
    let (_, evs) = demo::submit(&client, &cmd, WAIT).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Reverted, "{:?}", last(&evs));
    let failed = evs.iter().find(|e| e.event == EventType::StepFailed).unwrap();
    assert_eq!(failed.step_name.as_deref(), Some("addon-crashing"));
    assert_eq!(failed.code.as_deref(), Some("ADDON_FAILED"));
    assert!(failed.message.as_deref().unwrap_or("").contains("CrashLoopBackOff"), "{failed:?}");
    let reverted: Vec<String> = evs.iter().filter(|e| e.event == EventType::StepReverted).filter_map(|e| e.step_name.clone()).collect();
    assert!(reverted.contains(&"addon-cni".to_owned()) && reverted.contains(&"apply".to_owned()), "{reverted:?}");
    assert_eq!(demo::leftovers(&hub, &cmd).await.unwrap(), Vec::<String>::new(), "the revert left the hub as before");
    assert!(Api::<k8s_openapi::api::core::v1::Namespace>::all(hub.clone()).get_opt("fleet").await.unwrap().is_none(), "the namespace the task created is gone");

    // A cluster whose control plane never initializes fails at its deadline, with the
    // last state seen, and reverts.
    bed.capi().set("stuck", |k| k.never_ready = true);
    let mut stuck = small("stuck");
    stuck.ready_timeout_seconds = Some(5);
    let (_, evs) = demo::submit(&client, &stuck, WAIT).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Reverted, "{:?}", last(&evs));
    let failed = evs.iter().find(|e| e.event == EventType::StepFailed).unwrap();
    assert_eq!((failed.step_name.as_deref(), failed.code.as_deref()), (Some("control-plane"), Some("DEADLINE_EXCEEDED")), "{failed:?}");
    assert!(failed.message.as_deref().unwrap_or("").contains("phase Provisioning"), "{failed:?}");
    assert_eq!(demo::leftovers(&hub, &stuck).await.unwrap(), Vec::<String>::new());

    // kubeadm without a CNI (on an API server of its own, as `doomed` was): the nodes
    // never become Ready; the task fails at the nodes' deadline saying why, and reverts.
    let mut bare = small("bare");
    bare.addons.clear();
    bare.ready_timeout_seconds = Some(45);
    let (_, evs) = demo::submit(&client, &bare, WAIT).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Reverted, "{:?}", last(&evs));
    let failed = evs.iter().find(|e| e.event == EventType::StepFailed).unwrap();
    assert_eq!((failed.step_name.as_deref(), failed.code.as_deref()), (Some("nodes"), Some("DEADLINE_EXCEEDED")), "{failed:?}");
    let message = failed.message.as_deref().unwrap_or("");
    assert!(message.contains("NetworkPluginNotReady") && message.contains("CNI add-on"), "{failed:?}");
    assert_eq!(demo::leftovers(&hub, &bare).await.unwrap(), Vec::<String>::new());

    // Bad input: each refused with its reason, nothing applied.
    let bad = |f: &dyn Fn(&mut ClusterCommand)| {
        let mut c = small("bad-input");
        f(&mut c);
        c
    };
    let cases: Vec<(ClusterCommand, &str)> = vec![
        (bad(&|c| c.infrastructure = "vsphere".into()), "infrastructure provider \"vsphere\" is not supported"),
        (bad(&|c| c.control_plane.count = Some(0)), "control_plane.count is 0"),
        (bad(&|c| c.control_plane.count = Some(4)), "control_plane.count 4 is even"),
        (bad(&|c| c.addons = vec![AddonRequest { name: "istio".into(), ..AddonRequest::default() }]), "unknown add-on \"istio\""),
        // The hub has no k3s control-plane provider.
        (bad(&|c| c.control_plane_provider = Some("k3s".into())), "does not serve controlplane.cluster.x-k8s.io/v1beta2 KThreesControlPlane"),
        (bad(&|c| c.ocm = OcmRegistration { enabled: true, cluster_set: Some("nowhere".into()) }), "ManagedClusterSet \"nowhere\" does not exist"),
    ];
    let mut names = cases.iter().map(|(c, _)| c.subject()).collect::<Vec<_>>();
    names.dedup();
    for (c, want) in &cases {
        let (_, evs) = demo::submit(&client, c, WAIT).await.unwrap();
        let e = last(&evs);
        assert_eq!(e.event, EventType::Rejected, "{c:?}: {e:?}");
        assert!(e.message.as_deref().unwrap_or("").contains(want), "{:?} should contain {want:?}", e.message);
    }
    // A name that is not a DNS-1123 label is refused before a subject check could pass.
    let mut c = small("Bad_Name");
    c.name = "Bad_Name".into();
    let mut events = client.events(false).await.unwrap();
    let id = client.submit(TaskKind::CREATE_CLUSTER, &c.subject(), &c, SubmitOptions::default()).await.unwrap();
    let evs = events.until(id, WAIT, |e| e.event.is_final()).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Rejected);
    assert!(last(&evs).message.as_deref().unwrap_or("").contains("is not a DNS-1123 label"), "{:?}", last(&evs));
    assert_eq!(demo::leftovers(&hub, &small("bad-input")).await.unwrap(), Vec::<String>::new());

    // A Cluster of that name that Ferry did not create: refused, and left as it was.
    let foreign =
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "metadata": {"name": "theirs", "namespace": "default"}, "spec": {"paused": true}});
    let api: Api<CapiCluster> = Api::namespaced(hub.clone(), "default");
    api.patch("theirs", &PatchParams::apply("someone-else"), &Patch::Apply(&foreign)).await.unwrap();
    let mut theirs = small("theirs");
    theirs.namespace = None;
    for op in [ClusterOperation::Create, ClusterOperation::Scale, ClusterOperation::Delete] {
        theirs.operation = op;
        let (_, evs) = demo::submit(&client, &theirs, WAIT).await.unwrap();
        assert_eq!(last(&evs).event, EventType::Rejected, "{op:?}: {:?}", last(&evs));
        assert!(
            last(&evs).message.as_deref().unwrap_or("").contains("Ferry did not create")
                || last(&evs).message.as_deref().unwrap_or("").contains("not created by Ferry"),
            "{:?}",
            last(&evs)
        );
    }
    let still = api.get("theirs").await.unwrap();
    assert!(still.metadata.deletion_timestamp.is_none());
    assert_eq!(still.spec["paused"], true);

    // A ClusterClass topology: the Cluster alone, its replicas scaled in the topology.
    // A whole ClusterClass as upstream's schema requires one (its template references).
    let template = |api: &str, kind: &str, name: &str| json!({"templateRef": {"apiVersion": api, "kind": kind, "name": name}});
    let class = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "ClusterClass", "metadata": {"name": "quick-start", "namespace": "default"},
        "spec": {
            "controlPlane": template("controlplane.cluster.x-k8s.io/v1beta2", "KubeadmControlPlaneTemplate", "quick-start-control-plane"),
            "infrastructure": template("infrastructure.cluster.x-k8s.io/v1beta2", "DockerClusterTemplate", "quick-start-cluster"),
            "workers": {"machineDeployments": [{"class": "default-worker",
                "bootstrap": template("bootstrap.cluster.x-k8s.io/v1beta2", "KubeadmConfigTemplate", "quick-start-worker"),
                "infrastructure": template("infrastructure.cluster.x-k8s.io/v1beta2", "DockerMachineTemplate", "quick-start-worker")}]},
        }});
    Clusters::new(hub.clone()).apply(ferry_kube::HUB, &class, "test").await.unwrap();
    let mut classy = small("classy");
    classy.namespace = None;
    classy.cluster_class = Some("quick-start".into());
    let (_, evs) = demo::submit(&client, &classy, WAIT).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Succeeded, "{:?}", evs.iter().find(|e| e.event == EventType::StepFailed));
    let c = api.get("classy").await.unwrap();
    assert_eq!(c.spec["topology"]["workers"]["machineDeployments"][0]["class"], "default-worker");
    assert_eq!(nodes_of(&hub, "classy").await, 2);
    let (_, evs) = demo::submit(&client, &demo::scale(&classy, 2), WAIT).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Succeeded, "{:?}", last(&evs));
    assert_eq!(api.get("classy").await.unwrap().spec["topology"]["workers"]["machineDeployments"][0]["replicas"], 2);
    assert_eq!(nodes_of(&hub, "classy").await, 3);
    let (_, evs) = demo::submit(&client, &demo::delete(&classy), WAIT).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Succeeded, "{:?}", last(&evs));
    assert!(api.get_opt("classy").await.unwrap().is_none());

    // A class requiring a variable: Cluster API's webhook refuses a topology without it
    // (what the worker would have applied), and the worker rejects the command first.
    let mut strict = class.clone();
    strict["metadata"]["name"] = json!("strict");
    strict["spec"]["variables"] = json!([{"name": "imageRepository", "required": true, "schema": {"openAPIV3Schema": {"type": "string"}}}]);
    let classes = Api::<kube::api::DynamicObject>::namespaced_with(
        hub.clone(),
        "default",
        &kube::api::ApiResource::from_gvk_with_plural(&kube::api::GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "ClusterClass"), "clusterclasses"),
    );
    Clusters::new(hub.clone()).apply(ferry_kube::HUB, &strict, "test").await.unwrap();
    let reconciled = |o: Option<&kube::api::DynamicObject>| {
        o.is_some_and(|c| c.data.pointer("/status/observedGeneration").and_then(serde_json::Value::as_i64) == c.metadata.generation)
    };
    tokio::time::timeout(WAIT, kube::runtime::wait::await_condition(classes, "strict", reconciled)).await.expect("the class is reconciled").unwrap();
    let mut bare_topology = classy.clone();
    bare_topology.name = "strict-1".into();
    bare_topology.cluster_class = Some("strict".into());
    let cluster = ferry_cluster::render::cluster(&bare_topology, "tsk_test", &ferry_cluster::render::Topology::worker("default-worker"));
    let refused = Clusters::new(hub.clone()).apply(ferry_kube::HUB, &cluster, "test").await.unwrap_err().to_string();
    assert!(refused.contains("required variable \"imageRepository\" must be set"), "{refused}");
    let (_, evs) = demo::submit(&client, &bare_topology, WAIT).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Rejected, "{:?}", last(&evs));
    assert_eq!(last(&evs).code.as_deref(), Some("CLUSTER_CLASS_VARIABLES"), "{:?}", last(&evs));
    assert!(last(&evs).message.as_deref().unwrap_or("").contains("imageRepository"), "{:?}", last(&evs));
    // Given the variable, the topology carries it and Cluster API's webhook lets it in.
    let mut with_var = bare_topology.clone();
    with_var.variables = [("imageRepository".to_owned(), "registry.example.com/k8s".to_owned())].into();
    let (_, evs) = demo::submit(&client, &with_var, WAIT).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Succeeded, "{:?}", evs.iter().find(|e| e.event.is_final() || e.event == EventType::StepFailed));
    assert_eq!(api.get("strict-1").await.unwrap().spec["topology"]["variables"], json!([{"name": "imageRepository", "value": "registry.example.com/k8s"}]));
    let (_, evs) = demo::submit(&client, &demo::delete(&with_var), WAIT).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Succeeded, "{:?}", last(&evs));

    bed.stop(h).await;
}

/// Deleting a registered cluster with a ManifestWork in its namespace (what a deploy
/// leaves) finishes and leaves no ManagedCluster. The hub's GC controller holds a deleted
/// ManagedCluster until the works of its namespace are gone (ocm
/// `pkg/registration/hub/gc/controller.go`), and only the cluster's work agent removes a
/// work's finalizer (`pkg/work/spoke/controllers/finalizercontroller/manifestwork_finalize_controller.go`):
/// a delete that removes the klusterlet before the ManagedCluster pins it until the
/// deadline, and the delete fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_cluster_with_a_manifest_work_finishes_and_leaves_no_managed_cluster() {
    let Some(bed) = Bed::start(CapiOptions::default()).await else {
        return;
    };
    let h = bed.start_worker().await;
    let client = bed.client();
    let hub = bed.hub().await;
    demo::cluster_set(&hub, "edge").await.unwrap();
    let mut cmd = small("worked");
    cmd.ocm = OcmRegistration { enabled: true, cluster_set: Some("edge".into()) };
    let (_, evs) = demo::submit(&client, &cmd, WAIT).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Succeeded, "{:?}", last(&evs));
    let mcs: Api<ManagedCluster> = Api::all(hub.clone());
    let finalizers = mcs.get("worked").await.unwrap().metadata.finalizers.unwrap_or_default();
    assert!(finalizers.iter().any(|f| f == GC_FINALIZER), "the hub's GC controller holds the ManagedCluster: {finalizers:?}");

    // A deploy's ManifestWork in the cluster's namespace, applied by the cluster's work
    // agent (which puts its finalizer on it).
    let work = json!({"apiVersion": "work.open-cluster-management.io/v1", "kind": "ManifestWork", "metadata": {"name": "shop", "namespace": "worked"},
        "spec": {"workload": {"manifests": [
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "shop", "namespace": "default"}, "data": {"tier": "web"}},
        ]}}});
    let works: Api<ManifestWork> = Api::namespaced(hub.clone(), "worked");
    works.patch("shop", &PatchParams::apply("test"), &Patch::Apply(&work)).await.unwrap();
    let applied = |w: Option<&ManifestWork>| {
        w.is_some_and(|w| {
            w.metadata.finalizers.iter().flatten().any(|f| f == WORK_FINALIZER)
                && w.condition("Applied") == Some("True")
        })
    };
    tokio::time::timeout(WAIT, await_condition(works.clone(), "shop", applied)).await.expect("the work agent applied the work").unwrap();

    // The delete finishes: the ManagedCluster goes while the work agent still runs.
    let (_, evs) = demo::submit(&client, &demo::delete(&cmd), WAIT).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Succeeded, "{:?}", evs.iter().filter(|e| e.message.is_some()).collect::<Vec<_>>());
    assert_eq!(demo::leftovers(&hub, &cmd).await.unwrap(), Vec::<String>::new());
    assert!(works.get_opt("shop").await.unwrap().is_none(), "the hub's GC deleted the work");
    bed.stop(h).await;
}

/// A worker stopped without warning while the infrastructure provisions: another worker
/// resumes the task from its journal, and the Cluster is the same one (not re-created).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_lost_during_provisioning_is_resumed_and_one_cluster_exists() {
    let Some(bed) = Bed::start(CapiOptions::default()).await else {
        return;
    };
    bed.capi().set_default(|k| k.provision_delay = Duration::from_secs(3));
    let first = bed.start_worker().await;
    let client = bed.client();
    let hub = bed.hub().await;
    let cmd = small("resumed");
    let mut events = client.events(false).await.unwrap();
    let id = client.submit(TaskKind::CREATE_CLUSTER, &cmd.subject(), &cmd, SubmitOptions::default()).await.unwrap();
    let early = events.until(id, WAIT, |e| e.event == EventType::StepStarted && e.step_name.as_deref() == Some("infrastructure")).await.unwrap();
    let api: Api<CapiCluster> = Api::namespaced(hub.clone(), "fleet");
    let uid = api.get("resumed").await.unwrap().metadata.uid;
    first.abort();
    let _ = first.await;
    let second = bed.start_worker().await;
    let evs = events.until(id, WAIT, |e| e.event.is_final()).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Succeeded, "{:?}", last(&evs));
    assert_ne!(last(&evs).worker, last(&early).worker, "the second worker finished the task");
    assert!(!evs.iter().any(|e| e.step_name.as_deref() == Some("apply")), "apply was journaled and did not run again");
    let clusters = api.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(clusters.len(), 1);
    assert_eq!(clusters[0].metadata.uid, uid, "the same Cluster, not a second one");
    let machines = ferry_kube::Clusters::new(hub.clone());
    let gvk = kube::core::GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Machine");
    let m = machines.api(ferry_kube::HUB, &gvk, Some("fleet")).await.unwrap().list(&ListParams::default()).await.unwrap().items;
    assert_eq!(m.len(), 2, "one control-plane and one worker machine");
    bed.stop(second).await;
}

/// 50 clusters requested at once all finish (2 with API servers of their own, 48 virtual).
/// Their CNI comes with the cluster (a ClusterResourceSet's way): the virtual clusters
/// share one backing API server, so 50 CNI add-ons would be one shared DaemonSet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_clusters_requested_at_once_all_finish() {
    let Some(bed) = Bed::start(CapiOptions { real_api_servers: 2, cni_with_cluster: true, ..CapiOptions::default() }).await else {
        return;
    };
    let h = bed.start_worker().await;
    let client = bed.client();
    let mut events = client.events(false).await.unwrap();
    let mut ids = Vec::new();
    for i in 0..50 {
        let mut cmd = small(&format!("many-{i:02}"));
        cmd.addons.clear();
        ids.push(client.submit(TaskKind::CREATE_CLUSTER, &cmd.subject(), &cmd, SubmitOptions::default()).await.unwrap());
    }
    let mut finals = std::collections::HashMap::new();
    let mut failures = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(900);
    while finals.len() < ids.len() {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let e = tokio::time::timeout(left, events.next()).await.expect("50 clusters within the deadline").expect("the event stream ended");
        if e.event == EventType::StepFailed && failures.len() < 5 {
            failures.push(format!("{}: {}: {}", e.subject, e.step_name.clone().unwrap_or_default(), e.message.clone().unwrap_or_default()));
        }
        if e.event.is_final() {
            finals.insert(e.task_id.clone(), e);
        }
    }
    let failed: Vec<&ProgressEvent> = finals.values().filter(|e| e.event != EventType::Succeeded).collect();
    assert!(failed.is_empty(), "{} of 50 did not succeed; first failures: {failures:#?}", failed.len());
    assert_eq!(bed.capi().workload_count().await, 50);
    bed.stop(h).await;
}

/// A dry run (what `ferry submit create-cluster --dry-run --kubeconfig HUB` prints): the
/// create's `check` runs on the hub; the Cluster API objects it renders are judged by the
/// hub (the upstream CRDs and Cluster API's webhook) and one already there shows what the
/// run would change in it; a namespace still to be made is judged and what goes in it
/// named; the checks' refusals are told with their codes. Nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_judges_the_create_on_the_hub_and_writes_nothing() {
    let Some(bed) = Bed::start(CapiOptions::default()).await else {
        return;
    };
    let hub = bed.hub().await;
    let clusters = Arc::new(Clusters::new(hub.clone()));
    let cfg = ClusterConfig { catalog: Arc::new(Catalog::emulated()), ..ClusterConfig::new(clusters.clone()) };
    let preview = |cmd: ClusterCommand| {
        let cfg = cfg.clone();
        async move { ferry_cluster::preview::preview(&cfg, &cmd.subject(), &cmd).await.expect("the hub answers") }
    };

    // Namespace fleet does not exist yet: it is judged; what goes in it is named, not sent.
    let cmd = small("dry");
    let p = preview(cmd.clone()).await;
    assert_eq!(p.checked.verdict, Verdict::Passes, "{p:?}");
    let steps: Vec<(&str, bool)> = p.checked.steps.iter().map(|s| (s.name.as_str(), s.ran)).collect();
    assert_eq!(
        steps,
        [("check", true), ("apply", false), ("infrastructure", false), ("control-plane", false), ("kubeconfig", false), ("addon-cni", false), ("nodes", false)]
    );
    assert_eq!((p.objects[0].object.as_str(), p.objects[0].change), ("Namespace fleet", Change::Create), "{p:?}");
    assert_eq!(p.objects.len(), 8, "the namespace and the 7 objects of a Docker/kubeadm cluster: {p:?}");
    assert!(p.objects[1..].iter().all(|o| o.change == Change::NotSent), "{p:?}");
    assert!(Api::<k8s_openapi::api::core::v1::Namespace>::all(hub.clone()).get_opt("fleet").await.unwrap().is_none(), "the dry run made the namespace");

    // The namespace there, and someone's KubeadmConfigTemplate of the same name with
    // another kubelet flag: every object is judged by the hub and accepted, that one as
    // an update whose operations say what the run would change.
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "fleet"}});
    clusters.apply(ferry_kube::HUB, &ns, "test").await.unwrap();
    let objects = ferry_cluster::render::objects(&cmd, "earlier", &ferry_cluster::render::Topology::default());
    let mut theirs = objects.iter().find(|o| o["kind"] == "KubeadmConfigTemplate").unwrap().clone();
    theirs["spec"]["template"]["spec"]["joinConfiguration"]["nodeRegistration"]["kubeletExtraArgs"] = json!([{"name": "eviction-hard", "value": "memory.available<100Mi"}]);
    clusters.apply(ferry_kube::HUB, &theirs, "someone").await.unwrap();
    let p = preview(cmd.clone()).await;
    let judged: Vec<(&str, Change)> = p.objects.iter().map(|o| (o.object.as_str(), o.change)).collect();
    assert_eq!(
        judged,
        [
            ("DockerMachineTemplate fleet/dry-control-plane", Change::Create),
            ("DockerMachineTemplate fleet/dry-md-0", Change::Create),
            ("KubeadmConfigTemplate fleet/dry-md-0", Change::Update),
            ("DockerCluster fleet/dry", Change::Create),
            ("KubeadmControlPlane fleet/dry-control-plane", Change::Create),
            ("MachineDeployment fleet/dry-md-0", Change::Create),
            ("Cluster fleet/dry", Change::Create),
        ],
        "{p:?}"
    );
    let ops = &p.objects[2].operations;
    assert!(
        ops.iter().any(|o| o["path"].as_str().is_some_and(|p| p.contains("kubeletExtraArgs")) && o["value"].as_str().is_some_and(|v| v.starts_with("nodefs.available"))),
        "the kubelet flag the run would set: {ops:?}"
    );
    assert!(!p.refused());

    // The checks' refusals, with their codes: a ClusterClass that does not exist; a delete
    // of a cluster that is not there.
    let mut classy = small("classy");
    classy.cluster_class = Some("missing".into());
    let p = preview(classy).await;
    assert!(matches!(&p.checked.verdict, Verdict::Rejected { step, code, .. } if step == "check" && code == "CLUSTER_CLASS_MISSING"), "{p:?}");
    assert!(p.objects.is_empty() && p.refused());
    let p = preview(demo::delete(&small("ghost"))).await;
    assert!(matches!(&p.checked.verdict, Verdict::Rejected { code, .. } if code == "CLUSTER_NOT_FOUND"), "{p:?}");

    // Nothing was written: no Cluster, and no object of the create but the test's own.
    assert!(Api::<CapiCluster>::all(hub.clone()).list(&ListParams::default()).await.unwrap().items.is_empty());
    for o in objects.iter().filter(|o| o["kind"] != "KubeadmConfigTemplate") {
        assert!(clusters.get(ferry_kube::HUB, o).await.unwrap().is_none(), "the dry run wrote {}", o["kind"]);
    }
    bed.bed.stop().await;
}

//! The peer worker end to end: commands through the embedded Kafka-protocol broker, the
//! worker, and the test bed's real API servers with emulated Liqo (on the members) and
//! emulated OCM with the Submariner add-on (on the hub).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ferry_fleet::emulated_liqo::{EmulatedLiqo, LiqoKnobs};
use ferry_fleet::emulated_ocm::EmulatedOcm;
use ferry_fleet::{Fleet, FleetOptions, Kubelet, NodeFlavor};
use ferry_kube::Clusters;
use ferry_kube::kinds::ManagedCluster;
use ferry_peer::liqo::PEERING_LABEL;
use ferry_peer::spec::{PeerClusters, PeerMethod, PeerOperation};
use ferry_peer::{PeerConfig, PeerHandler};
use ferry_runtime::{Client, EmbeddedBroker, EventType, KafkaConfig, ProgressEvent, SubmitOptions, TaskId, TaskKind, Topics, Worker, WorkerOptions};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(240);

struct Bed {
    fleet: Fleet,
    _kubelets: Vec<Kubelet>,
    _ocm: EmulatedOcm,
    liqo: EmulatedLiqo,
    broker: Option<EmbeddedBroker>,
    kafka: KafkaConfig,
    topics: Topics,
    stop: CancellationToken,
    worker: Option<tokio::task::JoinHandle<()>>,
}

impl Bed {
    async fn start() -> Option<Self> {
        let _ = tracing_subscriber::fmt().with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into())).with_test_writer().try_init();
        if !ferry_fleet::binaries::Binaries::installed() {
            ferry_runtime::report::missing_prerequisite("the test bed is not installed (scripts/install-testbed.sh)");
            return None;
        }
        let fleet = Fleet::start(FleetOptions::hub_and(3)).await.expect("fleet");
        fleet.install_crds().await.expect("CRDs");
        fleet.publish_kubeconfigs().await.expect("kubeconfigs");
        let mut kubelets = Vec::new();
        for c in fleet.clusters.iter().skip(1) {
            let k = Kubelet::start(&c.name, c.client().await.unwrap(), Duration::from_millis(100));
            k.add_nodes("node", 2, &NodeFlavor::default()).await.unwrap();
            kubelets.push(k);
        }
        let ocm = EmulatedOcm::start(&fleet).await.expect("emulated OCM");
        // member-3's Liqo never comes up.
        let knobs = HashMap::from([("member-3".to_owned(), LiqoKnobs { not_installed: true, ..LiqoKnobs::default() })]);
        let liqo = EmulatedLiqo::start(&fleet, knobs).await.expect("emulated Liqo");
        let hub = fleet.hub().client().await.unwrap();
        // The members join OCM through their klusterlets (clusteradm join + accept).
        ferry_testkit::ocm::join(&fleet, &["member-1", "member-2", "member-3"], "").await.expect("the members join OCM");
        let topics = Topics::standard();
        let broker = EmbeddedBroker::start(1, &topics).expect("broker");
        let kafka = KafkaConfig::for_embedded(broker.bootstrap());
        let mut opts = WorkerOptions::new(kafka.clone());
        opts.topics = topics.clone();
        opts.shutdown_grace = Duration::from_secs(2);
        let stop = CancellationToken::new();
        let handler = PeerHandler::new(PeerConfig::new(Arc::new(Clusters::new(hub))));
        let s = stop.clone();
        let worker = tokio::spawn(async move { Worker::new(opts, handler).run(s).await.expect("peer worker") });
        Some(Self { fleet, _kubelets: kubelets, _ocm: ocm, liqo, broker: Some(broker), kafka, topics, stop, worker: Some(worker) })
    }

    fn client(&self) -> Client {
        Client::new(self.kafka.clone(), self.topics.clone()).unwrap()
    }

    async fn member(&self, name: &str) -> kube::Client {
        self.fleet.cluster(name).unwrap().client().await.unwrap()
    }

    async fn hub(&self) -> kube::Client {
        self.fleet.hub().client().await.unwrap()
    }

    async fn stop(mut self) {
        self.stop.cancel();
        self.worker.take().unwrap().await.unwrap();
        drop(self.broker.take());
    }
}

async fn submit(client: &Client, p: &PeerClusters) -> (TaskId, Vec<ProgressEvent>) {
    let mut events = client.events(false).await.unwrap();
    let id = client.submit(TaskKind::Peer, &p.subject(), p, SubmitOptions::default()).await.unwrap();
    let mut evs = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let e = tokio::time::timeout_at(deadline, events.next())
            .await
            .unwrap_or_else(|_| panic!("{id} did not end within {WAIT:?}; seen: {evs:#?}"))
            .expect("the stream goes on");
        if e.task_id == id.to_string() {
            println!("{id}: {:?} {} {}", e.event, e.step_name.as_deref().unwrap_or(""), e.message.as_deref().unwrap_or(""));
            let fin = e.event.is_final();
            evs.push(e);
            if fin {
                return (id, evs);
            }
        }
    }
}

fn last(evs: &[ProgressEvent]) -> String {
    ferry_runtime::report::summary(evs)
}

fn end(evs: &[ProgressEvent]) -> EventType {
    evs.last().unwrap().event
}

fn peer(a: &str, b: &str) -> PeerClusters {
    PeerClusters { a: a.into(), b: b.into(), timeout_seconds: Some(60), ..PeerClusters::default() }
}

/// Everything labelled for a peering on `cluster`: namespaces, ForeignClusters, virtual nodes.
async fn peering_objects(c: &kube::Client) -> Vec<String> {
    let lp = ListParams::default().labels(PEERING_LABEL);
    let mut out: Vec<String> =
        Api::<Namespace>::all(c.clone()).list(&lp).await.unwrap().items.into_iter().map(|n| format!("Namespace {}", n.metadata.name.unwrap())).collect();
    let fc = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("core.liqo.io", "v1beta1", "ForeignCluster"), "foreignclusters");
    out.extend(
        Api::<DynamicObject>::all_with(c.clone(), &fc)
            .list(&lp)
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|f| format!("ForeignCluster {}", f.metadata.name.unwrap())),
    );
    out.extend(
        Api::<Node>::all(c.clone())
            .list(&ListParams::default().labels("liqo.io/type=virtual-node"))
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|n| format!("Node {}", n.metadata.name.unwrap())),
    );
    out
}

async fn virtual_node_ready(c: &kube::Client, name: &str) -> bool {
    Api::<Node>::all(c.clone()).get_opt(name).await.unwrap().is_some_and(|n| ferry_kube::kinds::node_ready(&n))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn liqo_peer_unpeer_and_revert_remove_exactly_what_was_created() {
    let Some(bed) = Bed::start().await else { return };
    let client = bed.client();
    let (m1, m2) = (bed.member("member-1").await, bed.member("member-2").await);

    // A pod of 1 CPU already runs on member-2: its spare capacity is what it offers.
    let node = Api::<Node>::all(m2.clone()).list(&ListParams::default()).await.unwrap().items[0].metadata.name.clone().unwrap();
    let pod: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "busy", "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "busy", "image": "busy:1", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}))
    .unwrap();
    Api::<Pod>::namespaced(m2.clone(), "default").create(&Default::default(), &pod).await.unwrap();

    // Peer member-1 (consumer) with member-2 (provider).
    let (id, evs) = submit(&client, &peer("member-1", "member-2")).await;
    assert_eq!(end(&evs), EventType::Succeeded, "{}", last(&evs));
    let steps: Vec<String> = evs.iter().filter(|e| e.event == EventType::StepSucceeded).filter_map(|e| e.step_name.clone()).collect();
    assert_eq!(steps, ["check", "prepare", "network", "authentication", "resources", "established"]);
    assert!(virtual_node_ready(&m1, "liqo-member-2").await, "member-1 has a Ready virtual node of member-2");
    assert!(!virtual_node_ready(&m2, "liqo-member-1").await, "one direction only");
    let snap = client.snapshot(id).await.unwrap().unwrap();
    let res = snap.journal.iter().find(|j| j.name == "resources").and_then(|j| j.output.clone()).unwrap();
    assert!(res.contains("7000m"), "the provider's spare capacity (2 nodes of 4 CPUs, 1 requested) is offered: {res}");

    // Unpeer: everything labelled for the pair is gone on both sides.
    let mut un = peer("member-2", "member-1");
    un.operation = PeerOperation::Unpeer;
    let (_, evs) = submit(&client, &un).await;
    assert_eq!(end(&evs), EventType::Succeeded, "{}", last(&evs));
    let removed: Vec<String> = evs.iter().filter(|e| e.event == EventType::StepSucceeded).filter_map(|e| e.step_name.clone()).collect();
    assert_eq!(removed[1..4], ["remove-resources-reverse", "remove-authentication-reverse", "remove-resources"], "reverse order: {removed:?}");
    assert_eq!(peering_objects(&m1).await, Vec::<String>::new());
    assert_eq!(peering_objects(&m2).await, Vec::<String>::new());

    // Bidirectional, then revert it.
    let mut both = peer("member-1", "member-2");
    both.bidirectional = true;
    let (id, evs) = submit(&client, &both).await;
    assert_eq!(end(&evs), EventType::Succeeded, "{}", last(&evs));
    assert!(virtual_node_ready(&m1, "liqo-member-2").await && virtual_node_ready(&m2, "liqo-member-1").await);
    let mut events = client.events(false).await.unwrap();
    client.revert(id).await.unwrap();
    let evs = events.until(id, WAIT, |e| e.event.is_final()).await.unwrap();
    assert_eq!(end(&evs), EventType::Reverted, "{}", last(&evs));
    assert_eq!(peering_objects(&m1).await, Vec::<String>::new());
    assert_eq!(peering_objects(&m2).await, Vec::<String>::new());
    bed.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unready_components_fail_at_the_deadline_and_commands_of_a_pair_never_interleave() {
    let Some(bed) = Bed::start().await else { return };
    let client = bed.client();
    let (m1, m2) = (bed.member("member-1").await, bed.member("member-2").await);

    // Liqo never comes up on member-3: the check fails at its deadline, nothing created.
    let mut p = peer("member-1", "member-3");
    p.timeout_seconds = Some(3);
    let (_, evs) = submit(&client, &p).await;
    assert_eq!(end(&evs), EventType::Reverted, "{}", last(&evs));
    let failed = evs.iter().find(|e| e.event == EventType::StepFailed).unwrap();
    assert_eq!((failed.step_name.as_deref(), failed.code.as_deref()), (Some("check"), Some("DEADLINE_EXCEEDED")));
    assert!(failed.message.as_deref().unwrap_or("").contains("LIQO_NOT_READY") && failed.message.as_deref().unwrap_or("").contains("member-3"), "{failed:?}");
    assert_eq!(peering_objects(&m1).await, Vec::<String>::new());

    // member-2's gateway never connects: the network step fails at its deadline and the
    // revert removes the namespaces, ForeignClusters and gateways already made.
    bed.liqo.set("member-2", |k| k.gateway_never_connects = true);
    let mut p = peer("member-1", "member-2");
    p.timeout_seconds = Some(3);
    let (_, evs) = submit(&client, &p).await;
    assert_eq!(end(&evs), EventType::Reverted, "{}", last(&evs));
    let failed = evs.iter().find(|e| e.event == EventType::StepFailed).unwrap();
    assert_eq!((failed.step_name.as_deref(), failed.code.as_deref()), (Some("network"), Some("DEADLINE_EXCEEDED")), "{failed:?}");
    assert!(failed.message.as_deref().unwrap_or("").contains("Connecting"), "the last state seen is in the error: {failed:?}");
    assert_eq!(peering_objects(&m1).await, Vec::<String>::new());
    assert_eq!(peering_objects(&m2).await, Vec::<String>::new());
    bed.liqo.set("member-2", |k| k.gateway_never_connects = false);

    // A gateway that connects late: the network step waits for it (the delay bounds its
    // duration from below; creation timestamps are whole seconds) and the peering succeeds.
    bed.liqo.set("member-2", |k| k.gateway_delay = Duration::from_secs(2));
    let (_, evs) = submit(&client, &peer("member-1", "member-2")).await;
    assert_eq!(end(&evs), EventType::Succeeded, "{}", last(&evs));
    let at = |t: EventType| evs.iter().find(|e| e.event == t && e.step_name.as_deref() == Some("network")).unwrap().at_ms;
    assert!(at(EventType::StepSucceeded) - at(EventType::StepStarted) >= 1000, "the network step waited for the late gateway");
    bed.liqo.set("member-2", |k| k.gateway_delay = Duration::ZERO);

    // An unknown cluster is refused.
    let (_, evs) = submit(&client, &peer("member-1", "nowhere")).await;
    assert_eq!(end(&evs), EventType::Rejected, "{}", last(&evs));
    assert!(last(&evs).contains("nowhere"), "{}", last(&evs));

    // Two commands for one pair (either order of a and b): the second starts only after
    // the first ended.
    let mut events = client.events(false).await.unwrap();
    let first = client.submit(TaskKind::Peer, &peer("member-1", "member-2").subject(), &peer("member-1", "member-2"), SubmitOptions::default()).await.unwrap();
    let mut un = peer("member-2", "member-1");
    un.operation = PeerOperation::Unpeer;
    let second = client.submit(TaskKind::Peer, &un.subject(), &un, SubmitOptions::default()).await.unwrap();
    // Events of different tasks may sit in different partitions of the progress topic, so
    // the order is read from the events' clocks (one worker process), not arrival order.
    let mut seen: Vec<ProgressEvent> = Vec::new();
    let mut finals = 0;
    while finals < 2 {
        let e = tokio::time::timeout(WAIT, events.next()).await.expect("both end").expect("the stream goes on");
        let id: TaskId = e.task_id.parse().unwrap();
        if id == first || id == second {
            finals += usize::from(e.event.is_final());
            seen.push(e);
        }
    }
    let of = |id: TaskId| seen.iter().filter(move |e| e.task_id == id.to_string());
    let first_end = of(first).find(|e| e.event.is_final()).unwrap();
    let second_start = of(second).find(|e| e.event == EventType::StepStarted).unwrap();
    assert!(second_start.at_ms >= first_end.at_ms, "the unpeer started at {} before the peer ended at {}", second_start.at_ms, first_end.at_ms);
    assert_eq!(first_end.event, EventType::Succeeded);
    assert_eq!(of(second).next_back().unwrap().event, EventType::Succeeded);
    assert_eq!(peering_objects(&m1).await, Vec::<String>::new());
    bed.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submariner_through_ocm_and_its_revert() {
    let Some(bed) = Bed::start().await else { return };
    let client = bed.client();
    let hub = bed.hub().await;
    let mcs: Api<ManagedCluster> = Api::all(hub.clone());
    let addons = |ns: &str| {
        Api::<DynamicObject>::namespaced_with(
            hub.clone(),
            ns,
            &ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("addon.open-cluster-management.io", "v1alpha1", "ManagedClusterAddOn"),
                "managedclusteraddons",
            ),
        )
    };
    let set_of = |m: ManagedCluster| m.metadata.labels.and_then(|l| l.get("cluster.open-cluster-management.io/clusterset").cloned());

    let mut p = peer("member-1", "member-2");
    p.method = PeerMethod::Submariner;
    let (id, evs) = submit(&client, &p).await;
    assert_eq!(end(&evs), EventType::Succeeded, "{}", last(&evs));
    for c in ["member-1", "member-2"] {
        assert_eq!(set_of(mcs.get(c).await.unwrap()).as_deref(), Some("submariner"));
        let a = addons(c).get("submariner").await.unwrap();
        assert_eq!(ferry_kube::kinds::condition(a.data.get("status").unwrap(), "Available"), Some("True"));
    }
    // The revert removes the add-ons and configs and restores the set membership.
    let mut events = client.events(false).await.unwrap();
    client.revert(id).await.unwrap();
    let evs = events.until(id, WAIT, |e| e.event.is_final()).await.unwrap();
    assert_eq!(end(&evs), EventType::Reverted, "{}", last(&evs));
    for c in ["member-1", "member-2"] {
        assert_eq!(set_of(mcs.get(c).await.unwrap()), None, "{c} left the set it was put in");
        assert!(addons(c).get_opt("submariner").await.unwrap().is_none());
    }

    // An add-on that never becomes available: fails at the deadline, nothing left.
    bed.liqo.set("member-2", |k| k.submariner_unavailable = true);
    p.timeout_seconds = Some(3);
    let (_, evs) = submit(&client, &p).await;
    assert_eq!(end(&evs), EventType::Reverted, "{}", last(&evs));
    let failed = evs.iter().find(|e| e.event == EventType::StepFailed).unwrap();
    assert_eq!(failed.step_name.as_deref(), Some("addon"));
    assert!(failed.message.as_deref().unwrap_or("").contains("GatewayNotConnected"), "{failed:?}");
    for c in ["member-1", "member-2"] {
        assert!(addons(c).get_opt("submariner").await.unwrap().is_none());
        assert_eq!(set_of(mcs.get(c).await.unwrap()), None);
    }
    bed.stop().await;
}

//! The offload worker end to end: commands through the embedded Kafka-protocol broker;
//! the peer worker peers the clusters first; the test bed's real API servers and
//! schedulers with emulated kubelets, emulated Liqo and its namespace offloading.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ferry_fleet::emulated_liqo::EmulatedLiqo;
use ferry_fleet::emulated_offloading::{EmulatedOffloading, OffloadingKnobs};
use ferry_fleet::{Fleet, FleetOptions, Kubelet, NodeFlavor};
use ferry_kube::Clusters;
use ferry_offload::latency::LatencyMatrix;
use ferry_offload::spec::{OffloadCommand, OffloadOperation};
use ferry_offload::{OffloadConfig, OffloadHandler};
use ferry_offload::steps::place::PLACE;
use ferry_peer::spec::PeerClusters;
use ferry_peer::{PeerConfig, PeerHandler};
use ferry_runtime::{Client, EmbeddedBroker, EventType, KafkaConfig, ProgressEvent, SubmitOptions, TaskId, TaskKind, Topics, Worker, WorkerOptions};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(240);

struct Bed {
    fleet: Fleet,
    _kubelets: Vec<Kubelet>,
    _liqo: EmulatedLiqo,
    offloading: EmulatedOffloading,
    broker: Option<EmbeddedBroker>,
    kafka: KafkaConfig,
    topics: Topics,
    stop: CancellationToken,
    workers: Vec<tokio::task::JoinHandle<()>>,
}

impl Bed {
    /// member-1: one node of 4 CPUs; member-2: two of 4; member-3: one of 2. member-1
    /// consumes; `peers` are peered with it (Liqo, through the peer worker).
    async fn start(peers: &[&str]) -> Option<Self> {
        let _ = tracing_subscriber::fmt().with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into())).with_test_writer().try_init();
        if !ferry_fleet::binaries::Binaries::installed() {
            ferry_runtime::report::missing_prerequisite("the test bed is not installed (scripts/install-testbed.sh)");
            return None;
        }
        let fleet = Fleet::start(FleetOptions::hub_and(3)).await.expect("fleet");
        fleet.install_crds().await.expect("CRDs");
        fleet.publish_kubeconfigs().await.expect("kubeconfigs");
        let mut kubelets = Vec::new();
        for (c, n, cpu) in [("member-1", 1, "4"), ("member-2", 2, "4"), ("member-3", 1, "2")] {
            let k = Kubelet::start(c, fleet.cluster(c).unwrap().client().await.unwrap(), Duration::from_millis(100));
            k.add_nodes("node", n, &NodeFlavor { cpu: cpu.into(), ..NodeFlavor::default() }).await.unwrap();
            kubelets.push(k);
        }
        let liqo = EmulatedLiqo::start(&fleet, HashMap::new()).await.expect("emulated Liqo");
        let offloading = EmulatedOffloading::start(&fleet, HashMap::new()).await.expect("emulated offloading");
        let topics = Topics::standard();
        let broker = EmbeddedBroker::start(1, &topics).expect("broker");
        let kafka = KafkaConfig::for_embedded(broker.bootstrap());
        let stop = CancellationToken::new();
        let hub = Arc::new(Clusters::new(fleet.hub().client().await.unwrap()));
        let opts = || {
            let mut o = WorkerOptions::new(kafka.clone());
            o.topics = topics.clone();
            o.shutdown_grace = Duration::from_secs(2);
            o
        };
        let mut cfg = OffloadConfig::new(hub.clone());
        cfg.latency = LatencyMatrix::parse("member-1: {member-2: 40, member-3: 5}", "test").unwrap();
        let (s1, s2) = (stop.clone(), stop.clone());
        let (o1, o2) = (opts(), opts());
        let workers = vec![
            tokio::spawn(async move { Worker::new(o1, OffloadHandler::new(cfg)).run(s1).await.expect("offload worker") }),
            tokio::spawn(async move { Worker::new(o2, PeerHandler::new(PeerConfig::new(hub))).run(s2).await.expect("peer worker") }),
        ];
        let bed = Self { fleet, _kubelets: kubelets, _liqo: liqo, offloading, broker: Some(broker), kafka, topics, stop, workers };
        let client = bed.client();
        for p in peers {
            let cmd = PeerClusters { a: "member-1".into(), b: (*p).into(), timeout_seconds: Some(60), ..PeerClusters::default() };
            let (_, evs) = submit(&client, TaskKind::Peer, &cmd.subject(), &cmd).await;
            assert_eq!(end(&evs), EventType::Succeeded, "peering member-1 with {p}: {}", last(&evs));
        }
        Some(bed)
    }

    fn client(&self) -> Client {
        Client::new(self.kafka.clone(), self.topics.clone()).unwrap()
    }

    async fn member(&self, name: &str) -> kube::Client {
        self.fleet.cluster(name).unwrap().client().await.unwrap()
    }

    async fn stop(mut self) {
        self.stop.cancel();
        for w in self.workers.drain(..) {
            w.await.unwrap();
        }
        drop(self.broker.take());
    }
}

async fn submit<T: serde::Serialize + apache_avro::AvroSchema + 'static>(
    client: &Client,
    kind: TaskKind,
    subject: &str,
    spec: &T,
) -> (TaskId, Vec<ProgressEvent>) {
    let events = client.events(false).await.unwrap();
    let id = client.submit(kind, subject, spec, SubmitOptions::default()).await.unwrap();
    (id, follow(events, id).await)
}

async fn follow(mut events: ferry_runtime::EventStream, id: TaskId) -> Vec<ProgressEvent> {
    let mut evs = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let e = match tokio::time::timeout_at(deadline, events.next()).await {
            Ok(e) => e.expect("the stream goes on"),
            Err(_) => panic!(
                "{id} did not end within {WAIT:?}; seen: {:?}",
                evs.iter().map(|e: &ProgressEvent| (e.event, e.step_name.clone(), e.message.clone())).collect::<Vec<_>>()
            ),
        };
        if e.task_id == id.to_string() {
            println!("{id}: {:?} {} {}", e.event, e.step_name.as_deref().unwrap_or(""), e.message.as_deref().unwrap_or(""));
            let fin = e.event.is_final();
            evs.push(e);
            if fin {
                return evs;
            }
        }
    }
}

async fn offload(client: &Client, c: &OffloadCommand) -> (TaskId, Vec<ProgressEvent>) {
    submit(client, TaskKind::Offload, &c.subject(), c).await
}

async fn revert(client: &Client, id: TaskId) -> Vec<ProgressEvent> {
    let events = client.events(false).await.unwrap();
    client.revert(id).await.unwrap();
    follow(events, id).await
}

fn last(evs: &[ProgressEvent]) -> String {
    ferry_runtime::report::summary(evs)
}

fn end(evs: &[ProgressEvent]) -> EventType {
    evs.last().unwrap().event
}

fn steps(evs: &[ProgressEvent]) -> Vec<String> {
    evs.iter().filter(|e| e.event == EventType::StepSucceeded).filter_map(|e| e.step_name.clone()).collect()
}

async fn namespace(c: &kube::Client, name: &str) {
    Api::<Namespace>::all(c.clone())
        .patch(name, &PatchParams::apply("test"), &Patch::Apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})))
        .await
        .unwrap();
}

async fn exists(c: &kube::Client, ns: &str) -> bool {
    Api::<Namespace>::all(c.clone()).get_opt(ns).await.unwrap().is_some_and(|n| n.metadata.deletion_timestamp.is_none())
}

fn offloadings(c: &kube::Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("offloading.liqo.io", "v1beta1", "NamespaceOffloading"), "namespaceoffloadings");
    Api::namespaced_with(c.clone(), ns, &ar)
}

fn cmd(ns: &str, targets: &[&str]) -> OffloadCommand {
    OffloadCommand {
        cluster: "member-1".into(),
        namespace: ns.into(),
        clusters: targets.iter().map(|t| (*t).to_owned()).collect(),
        timeout_seconds: Some(60),
        ..OffloadCommand::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offload_unoffload_revert_and_refusals() {
    let Some(bed) = Bed::start(&["member-2"]).await else { return };
    let client = bed.client();
    let (m1, m2, m3) = (bed.member("member-1").await, bed.member("member-2").await, bed.member("member-3").await);
    for ns in ["web", "batch", "flaky"] {
        namespace(&m1, ns).await;
    }

    // Offload web to member-2: Ready, the twin namespace exists there and nowhere else.
    let (offload_id, evs) = offload(&client, &cmd("web", &["member-2"])).await;
    assert_eq!(end(&evs), EventType::Succeeded, "{}", last(&evs));
    assert_eq!(steps(&evs), ["check", "offload", "twins"]);
    assert!(exists(&m2, "web-member-1").await && !exists(&m3, "web-member-1").await);
    let o = offloadings(&m1, "web").get("offloading").await.unwrap();
    assert_eq!(o.data["status"]["offloadingPhase"], "Ready");
    assert_eq!(o.data["spec"]["clusterSelector"]["nodeSelectorTerms"][0]["matchExpressions"][1]["values"], json!(["member-2"]));

    // member-3 is not peered with member-1: refused with the reason, nothing created.
    let (_, evs) = offload(&client, &cmd("batch", &["member-3"])).await;
    assert_eq!(end(&evs), EventType::Rejected, "{}", last(&evs));
    assert!(last(&evs).contains("member-3 is not peered with member-1"), "{}", last(&evs));
    assert!(offloadings(&m1, "batch").get_opt("offloading").await.unwrap().is_none());
    // A namespace that does not exist, and a system namespace, are refused too.
    let (_, evs) = offload(&client, &cmd("nowhere", &["member-2"])).await;
    assert!(end(&evs) == EventType::Rejected && last(&evs).contains("namespace nowhere does not exist on member-1"), "{}", last(&evs));
    let (_, evs) = offload(&client, &cmd("kube-system", &["member-2"])).await;
    assert!(end(&evs) == EventType::Rejected && last(&evs).contains("system or Liqo namespace"), "{}", last(&evs));

    // Unoffload: the offloading and the twin go; its revert brings both back.
    let mut un = cmd("web", &[]);
    un.operation = OffloadOperation::Unoffload;
    let (un_id, evs) = offload(&client, &un).await;
    assert_eq!(end(&evs), EventType::Succeeded, "{}", last(&evs));
    assert!(offloadings(&m1, "web").get_opt("offloading").await.unwrap().is_none());
    assert!(!exists(&m2, "web-member-1").await, "the twin namespace is gone");
    let evs = revert(&client, un_id).await;
    assert_eq!(end(&evs), EventType::Reverted, "{}", last(&evs));
    assert!(exists(&m2, "web-member-1").await, "the revert restored the offloading");
    // Reverting the offload itself removes it for good.
    let evs = revert(&client, offload_id).await;
    assert_eq!(end(&evs), EventType::Reverted, "{}", last(&evs));
    assert!(offloadings(&m1, "web").get_opt("offloading").await.unwrap().is_none());
    assert!(!exists(&m2, "web-member-1").await);

    // A provider that cannot create the twin: the offload fails with its reason and the
    // automatic revert leaves no offloading behind.
    bed.offloading.set("member-2", |k: &mut OffloadingKnobs| k.fails = true);
    let (_, evs) = offload(&client, &cmd("flaky", &["member-2"])).await;
    assert_eq!(end(&evs), EventType::Reverted, "{}", last(&evs));
    let failed = evs.iter().find(|e| e.event == EventType::StepFailed).unwrap();
    assert_eq!((failed.step_name.as_deref(), failed.code.as_deref()), (Some("offload"), Some("OFFLOADING_FAILED")), "{failed:?}");
    assert!(failed.message.as_deref().unwrap_or("").contains("member-2"), "{failed:?}");
    assert!(offloadings(&m1, "flaky").get_opt("offloading").await.unwrap().is_none());
    bed.stop().await;
}

/// Pods of `app` in `ns` per node.
async fn placement(c: &kube::Client, ns: &str, app: &str) -> HashMap<String, usize> {
    let mut out = HashMap::new();
    for p in Api::<Pod>::namespaced(c.clone(), ns).list(&ListParams::default().labels(&format!("app={app}"))).await.unwrap().items {
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let node = p.spec.and_then(|s| s.node_name).unwrap_or_else(|| "(pending)".into());
        let node = if node.starts_with("liqo-") || node == "(pending)" { node } else { "home".into() };
        *out.entry(node).or_default() += 1;
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_sends_the_overflow_to_the_nearest_peers_with_room_and_revert_takes_it_back() {
    let Some(bed) = Bed::start(&["member-2", "member-3"]).await else { return };
    let client = bed.client();
    let (m1, m3) = (bed.member("member-1").await, bed.member("member-3").await);
    namespace(&m1, "shop").await;
    // Pods of 1 CPU: member-1 (4 CPUs) fits 4.
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "api", "namespace": "shop"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "api"}},
            "template": {"metadata": {"labels": {"app": "api"}}, "spec": {"containers": [{"name": "api", "image": "ghcr.io/ferry/api:1",
                "resources": {"requests": {"cpu": "1", "memory": "256Mi"}}}]}}}});
    let deployments = Api::<Deployment>::namespaced(m1.clone(), "shop");
    deployments.patch("api", &PatchParams::apply("test"), &Patch::Apply(&deployment)).await.unwrap();
    let burst =
        |replicas: i32| OffloadCommand { operation: OffloadOperation::Burst, deployment: Some("api".into()), replicas: Some(replicas), ..cmd("shop", &[]) };

    // 6 replicas: 2 overflow; member-3 is nearest (5 ms) and fits 2 (2 CPUs).
    let (id, evs) = offload(&client, &burst(6)).await;
    assert_eq!(end(&evs), EventType::Succeeded, "{}", last(&evs));
    assert_eq!(steps(&evs), ["check", "scale", "place", "offload", "ready"]);
    let snap = client.snapshot(id).await.unwrap().unwrap();
    let shares = PLACE.from_snapshot(&snap).unwrap();
    assert_eq!(shares.iter().map(|s| (s.cluster.as_str(), s.pods)).collect::<Vec<_>>(), [("member-3", 2)]);
    assert_eq!(placement(&m1, "shop", "api").await, HashMap::from([("home".to_owned(), 4), ("liqo-member-3".to_owned(), 2)]));
    let reflected = Api::<Pod>::namespaced(m3.clone(), "shop-member-1").list(&ListParams::default()).await.unwrap().items;
    assert_eq!(reflected.iter().filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")).count(), 2, "the overflow runs on member-3");

    // The revert: back to 2 replicas at home, no offloading, no twin.
    let evs = revert(&client, id).await;
    assert_eq!(end(&evs), EventType::Reverted, "{}", last(&evs));
    assert_eq!(deployments.get("api").await.unwrap().spec.replicas, Some(2));
    assert!(offloadings(&m1, "shop").get_opt("offloading").await.unwrap().is_none());
    assert!(!exists(&m3, "shop-member-1").await);
    assert!(placement(&m1, "shop", "api").await.keys().all(|k| !k.starts_with("liqo-")), "no pod left on a virtual node");

    // 10 replicas: 6 overflow; member-3 takes 2, the next nearest (member-2, 40 ms) 4.
    let (id, evs) = offload(&client, &burst(10)).await;
    assert_eq!(end(&evs), EventType::Succeeded, "{}", last(&evs));
    let snap = client.snapshot(id).await.unwrap().unwrap();
    let shares = PLACE.from_snapshot(&snap).unwrap();
    assert_eq!(
        shares.iter().map(|s| (s.cluster.as_str(), s.pods)).collect::<Vec<_>>(),
        [("member-3", 2), ("member-2", 4)]
    );
    let at = placement(&m1, "shop", "api").await;
    assert_eq!(at.get("home"), Some(&4));
    assert_eq!(at.iter().filter(|(k, _)| k.starts_with("liqo-")).map(|(_, v)| v).sum::<usize>(), 6, "{at:?}");
    let evs = revert(&client, id).await;
    assert_eq!(end(&evs), EventType::Reverted, "{}", last(&evs));

    // 20 replicas: 16 overflow, the peers fit 10: the burst fails saying so, and its
    // automatic revert restores the 2 replicas.
    let (_, evs) = offload(&client, &burst(20)).await;
    assert_eq!(end(&evs), EventType::Reverted, "{}", last(&evs));
    let failed = evs.iter().find(|e| e.event == EventType::StepFailed).unwrap();
    assert_eq!((failed.step_name.as_deref(), failed.code.as_deref()), (Some("place"), Some("NO_ROOM")), "{failed:?}");
    assert!(failed.message.as_deref().unwrap_or("").contains("fit only 10 (member-3: 2, member-2: 8)"), "{failed:?}");
    assert_eq!(deployments.get("api").await.unwrap().spec.replicas, Some(2));
    bed.stop().await;
}

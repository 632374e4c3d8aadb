//! The offload worker end to end: commands through the embedded Kafka-protocol broker;
//! the peer worker peers the clusters first; the test bed's real API servers and
//! schedulers with emulated kubelets, emulated Liqo, its namespace offloading and Liqo's
//! offloading webhooks (the NamespaceOffloading's immutable fields; pods mutated only at
//! creation, in namespaces labelled for scheduling).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use ferry_fleet::NodeFlavor;
use ferry_kube::dry_run::{Change, Preview};
use ferry_runtime::dry_run::Verdict;
use ferry_fleet::emulated_offloading::OffloadingKnobs;
use ferry_offload::latency::LatencyMatrix;
use ferry_offload::liqo::{REMOTE_ID_LABEL, SCHEDULING_LABEL, TASK_LABEL, VIRTUAL_NODE_SELECTOR, VIRTUAL_NODE_TOLERATION_KEY};
use ferry_offload::spec::{NamespaceMappingStrategy, OffloadCommand, OffloadOperation};
use ferry_offload::steps::place::PLACE;
use ferry_offload::steps::respawn::RESPAWN;
use ferry_offload::{OffloadConfig, OffloadHandler};
use ferry_peer::spec::PeerClusters;
use ferry_peer::{PeerConfig, PeerHandler};
use ferry_runtime::{Client, EventType, ProgressEvent, SubmitOptions, TaskId, TaskKind};
use ferry_testkit::Bed;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(240);

fn cpus(n: &str) -> NodeFlavor {
    NodeFlavor { cpu: n.into(), ..NodeFlavor::default() }
}

/// member-1: one node of 4 CPUs; member-2: two of 4; member-3: one of 2. member-1
/// consumes; `peers` are peered with it (Liqo, through the peer worker). The offload
/// worker waits a failed twin out for `grace`.
async fn start(peers: &[&str], grace: Duration) -> Option<Bed> {
    let mut bed = Bed::builder()
        .member(1, cpus("4"))
        .member(2, cpus("4"))
        .member(1, cpus("2"))
        .kubeconfigs()
        .liqo(HashMap::new())
        .offloading(HashMap::new())
        .start()
        .await?;
    let mut cfg = OffloadConfig::new(bed.clusters.clone());
    cfg.latency = LatencyMatrix::parse("member-1: {member-2: 40, member-3: 5}", "test").unwrap();
    cfg.failure_grace = grace;
    bed.run_worker(OffloadHandler::new(cfg));
    bed.run_worker(PeerHandler::new(PeerConfig::new(bed.clusters.clone())));
    let client = bed.client();
    for p in peers {
        let cmd = PeerClusters { a: "member-1".into(), b: (*p).into(), timeout_seconds: Some(60), ..PeerClusters::default() };
        let (_, evs) = submit(&client, TaskKind::PEER, &cmd.subject(), &cmd).await;
        assert_eq!(end(&evs), EventType::Succeeded, "peering member-1 with {p}: {}", last(&evs));
    }
    Some(bed)
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
    follow_until(&mut events, id, |_| false).await
}

/// `id`'s events until one `stop` picks or the final one.
async fn follow_until(events: &mut ferry_runtime::EventStream, id: TaskId, stop: impl Fn(&ProgressEvent) -> bool) -> Vec<ProgressEvent> {
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
            let fin = e.event.is_final() || stop(&e);
            evs.push(e);
            if fin {
                return evs;
            }
        }
    }
}

async fn offload(client: &Client, c: &OffloadCommand) -> (TaskId, Vec<ProgressEvent>) {
    submit(client, TaskKind::OFFLOAD, &c.subject(), c).await
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

/// The dry run of `c` (`ferry submit offload --dry-run --kubeconfig HUB`).
async fn preview(bed: &Bed, c: &OffloadCommand) -> Preview {
    ferry_offload::preview::preview(&OffloadConfig::new(bed.clusters.clone()), &c.subject(), c).await.expect("the clusters answer")
}

/// The grace of the tests that want a failed twin to fail the offload: short, so a lasting
/// failure ends the task soon after it has been waited out.
const LASTING: Duration = Duration::from_secs(2);

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
    let Some(bed) = start(&["member-2"], LASTING).await else { return };
    let client = bed.client();
    let (m1, m2, m3) = (bed.cluster("member-1").await, bed.cluster("member-2").await, bed.cluster("member-3").await);
    for ns in ["web", "batch", "flaky"] {
        namespace(&m1, ns).await;
    }

    // A dry run first: the check runs, the NamespaceOffloading is judged by member-1 (Liqo's
    // CRD and webhook) and would be created; nothing is written.
    let p = preview(&bed, &cmd("web", &["member-2"])).await;
    assert_eq!(p.checked.verdict, Verdict::Passes, "{p:?}");
    let planned: Vec<(&str, bool)> = p.checked.steps.iter().map(|s| (s.name.as_str(), s.ran)).collect();
    assert_eq!(planned, [("check", true), ("offload", false), ("twins", false)]);
    let judged: Vec<(&str, &str, Change)> = p.objects.iter().map(|o| (o.cluster.as_str(), o.object.as_str(), o.change)).collect();
    assert_eq!(judged, [("member-1", "NamespaceOffloading web/offloading", Change::Create)], "{p:?}");
    assert!(offloadings(&m1, "web").get_opt("offloading").await.unwrap().is_none(), "the dry run wrote the offloading");

    // Offload web to member-2: Ready, the twin namespace exists there and nowhere else.
    let (offload_id, evs) = offload(&client, &cmd("web", &["member-2"])).await;
    assert_eq!(end(&evs), EventType::Succeeded, "{}", last(&evs));
    assert_eq!(steps(&evs), ["check", "offload", "twins"]);
    assert!(exists(&m2, "web-member-1").await && !exists(&m3, "web-member-1").await);
    let o = offloadings(&m1, "web").get("offloading").await.unwrap();
    assert_eq!(o.data["status"]["offloadingPhase"], "Ready");
    assert_eq!(o.data["spec"]["clusterSelector"]["nodeSelectorTerms"][0]["matchExpressions"][1]["values"], json!(["member-2"]));

    // The same command again, dry: only the task label would change. Under another mapping
    // strategy: the offloading there would be deleted and the new one created after (Liqo's
    // webhook makes the strategy immutable), so the new one is not sent.
    let p = preview(&bed, &cmd("web", &["member-2"])).await;
    assert_eq!(p.objects.len(), 1, "{p:?}");
    assert_eq!(p.objects[0].change, Change::Update, "{p:?}");
    assert!(p.objects[0].operations.iter().all(|o| o["path"].as_str().is_some_and(|p| p.starts_with("/labels/"))), "only the task label differs: {p:?}");
    let same = OffloadCommand { namespace_mapping_strategy: NamespaceMappingStrategy::EnforceSameName, ..cmd("web", &["member-2"]) };
    let p = preview(&bed, &same).await;
    let judged: Vec<Change> = p.objects.iter().map(|o| o.change).collect();
    assert_eq!(judged, [Change::Delete, Change::NotSent], "{p:?}");
    assert!(p.objects[0].note.as_deref().unwrap_or("").contains("namespaceMappingStrategy DefaultName → EnforceSameName cannot be changed"), "{p:?}");
    // A target that is not peered: the dry run says the task would be rejected, and why.
    let p = preview(&bed, &cmd("batch", &["member-3"])).await;
    assert!(matches!(&p.checked.verdict, Verdict::Rejected { step, reason, .. } if step == "check" && reason.contains("member-3 is not peered with member-1")), "{p:?}");
    assert!(p.objects.is_empty() && p.refused(), "{p:?}");

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
    let ns = Api::<Namespace>::all(m1.clone()).get("web").await.unwrap();
    assert_eq!(ns.metadata.labels.unwrap_or_default().get(SCHEDULING_LABEL).map(String::as_str), Some("true"), "Liqo labels an offloaded namespace for scheduling");

    // Offloading web again under another mapping strategy: Liqo's webhook forbids changing
    // it on the offloading there, so the offload re-creates it; its revert re-creates the
    // previous one, as it was (the old worker re-applied the spec and was refused).
    let (same_id, evs) = offload(&client, &same).await;
    assert_eq!(end(&evs), EventType::Succeeded, "{}", last(&evs));
    assert!(evs.iter().any(|e| e.message.as_deref().unwrap_or("").contains("namespaceMappingStrategy DefaultName → EnforceSameName cannot be changed")), "{}", last(&evs));
    assert!(exists(&m2, "web").await && !exists(&m2, "web-member-1").await, "the twin is named as the namespace now");
    let evs = revert(&client, same_id).await;
    assert_eq!(end(&evs), EventType::Reverted, "{}", last(&evs));
    assert!(exists(&m2, "web-member-1").await && !exists(&m2, "web").await, "the previous twin is back");
    let o = offloadings(&m1, "web").get("offloading").await.unwrap();
    assert_eq!(o.data["spec"]["namespaceMappingStrategy"], "DefaultName");
    assert_eq!(o.metadata.labels.unwrap_or_default().get(TASK_LABEL), Some(&offload_id.to_string()), "restored as the first offload's");
    // Reverting the offload itself removes it for good.
    let evs = revert(&client, offload_id).await;
    assert_eq!(end(&evs), EventType::Reverted, "{}", last(&evs));
    assert!(offloadings(&m1, "web").get_opt("offloading").await.unwrap().is_none());
    assert!(!exists(&m2, "web-member-1").await);

    // A provider that cannot create the twin for longer than the grace: the offload says it
    // waits, then fails with its reason, and the automatic revert leaves no offloading behind.
    bed.offloading.as_ref().unwrap().set("member-2", |k: &mut OffloadingKnobs| k.fails = true);
    let (_, evs) = offload(&client, &cmd("flaky", &["member-2"])).await;
    assert_eq!(end(&evs), EventType::Reverted, "{}", last(&evs));
    assert!(evs.iter().any(|e| e.event == EventType::StepProgress && e.message.as_deref().unwrap_or("").contains("Liqo retries")), "{}", last(&evs));
    let failed = evs.iter().find(|e| e.event == EventType::StepFailed).unwrap();
    assert_eq!((failed.step_name.as_deref(), failed.code.as_deref()), (Some("offload"), Some("OFFLOADING_FAILED")), "{failed:?}");
    let message = failed.message.as_deref().unwrap_or("");
    assert!(message.contains("member-2: CreationLoopBackOff") && message.contains("(for "), "{failed:?}");
    assert!(offloadings(&m1, "flaky").get_opt("offloading").await.unwrap().is_none());
    bed.stop().await;
}

/// A provider that fails to create the twin for a while (Liqo's `CreationLoopBackOff`, which
/// its NamespaceMap controller retries) does not fail the offload: the worker says it waits,
/// and the offload succeeds once the provider creates the twin. With a grace of zero (the
/// worker before it, and liqoctl's wait) this offload would end Reverted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twin_that_fails_for_a_while_is_waited_out() {
    let Some(bed) = start(&["member-2"], ferry_offload::handler::DEFAULT_FAILURE_GRACE).await else { return };
    let client = bed.client();
    let (m1, m2) = (bed.cluster("member-1").await, bed.cluster("member-2").await);
    namespace(&m1, "mended").await;
    bed.offloading.as_ref().unwrap().set("member-2", |k: &mut OffloadingKnobs| k.fails = true);
    let c = cmd("mended", &["member-2"]);
    let mut events = client.events(false).await.unwrap();
    let id = client.submit(TaskKind::OFFLOAD, &c.subject(), &c, SubmitOptions::default()).await.unwrap();
    let waiting = |e: &ProgressEvent| e.event == EventType::StepProgress && e.message.as_deref().unwrap_or("").contains("Liqo retries");
    let evs = follow_until(&mut events, id, waiting).await;
    let said = evs.last().unwrap();
    assert!(waiting(said), "the worker did not say it waits the failure out: {}", last(&evs));
    assert!(said.message.as_deref().unwrap().contains("member-2: CreationLoopBackOff"), "{said:?}");
    assert!(!exists(&m2, "mended-member-1").await, "the provider made the twin while told to fail");
    // Liqo's retry succeeds now.
    bed.offloading.as_ref().unwrap().set("member-2", |k: &mut OffloadingKnobs| k.fails = false);
    let evs = follow(events, id).await;
    assert_eq!(end(&evs), EventType::Succeeded, "{}", last(&evs));
    assert!(!evs.iter().any(|e| e.event == EventType::StepFailed), "{}", last(&evs));
    assert!(exists(&m2, "mended-member-1").await);
    bed.stop().await;
}

/// The virtual nodes of `c` (by Liqo's labels, never by name) → their provider's id.
async fn virtual_nodes(c: &kube::Client) -> BTreeMap<String, String> {
    let nodes = Api::<Node>::all(c.clone()).list(&ListParams::default().labels(VIRTUAL_NODE_SELECTOR)).await.unwrap().items;
    nodes.into_iter().filter_map(|n| Some((n.metadata.name?, n.metadata.labels?.get(REMOTE_ID_LABEL)?.clone()))).collect()
}

/// Pods of `app` in `ns`: how many run at home, on each provider's virtual node
/// (`virtual:<id>`), or are still Pending.
async fn placement(c: &kube::Client, ns: &str, app: &str) -> HashMap<String, usize> {
    let virtual_nodes = virtual_nodes(c).await;
    let mut out = HashMap::new();
    for p in Api::<Pod>::namespaced(c.clone(), ns).list(&ListParams::default().labels(&format!("app={app}"))).await.unwrap().items {
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let at = match p.spec.and_then(|s| s.node_name) {
            None => "(pending)".to_owned(),
            Some(n) => virtual_nodes.get(&n).map_or_else(|| "home".to_owned(), |id| format!("virtual:{id}")),
        };
        *out.entry(at).or_default() += 1;
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_sends_the_overflow_to_the_nearest_peers_with_room_and_revert_takes_it_back() {
    let Some(bed) = start(&["member-2", "member-3"], LASTING).await else { return };
    let client = bed.client();
    let (m1, m3) = (bed.cluster("member-1").await, bed.cluster("member-3").await);
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

    // 6 replicas: 2 overflow; member-3 is nearest (5 ms) and fits 2 (2 CPUs). The 2 left
    // Pending by `scale` predate the offloading: Liqo's webhook (CREATE only) never
    // touches them, so `respawn` has them created again once the namespace is labelled.
    let (id, evs) = offload(&client, &burst(6)).await;
    assert_eq!(end(&evs), EventType::Succeeded, "{}", last(&evs));
    assert_eq!(steps(&evs), ["check", "scale", "place", "offload", "respawn", "ready"]);
    let snap = client.snapshot(id).await.unwrap().unwrap();
    let shares = PLACE.from_snapshot(&snap).unwrap();
    assert_eq!(shares.iter().map(|s| (s.cluster.as_str(), s.pods)).collect::<Vec<_>>(), [("member-3", 2)]);
    assert_eq!(RESPAWN.from_snapshot(&snap).unwrap().pods.len(), 2, "the 2 Pending pods were created again");
    assert_eq!(placement(&m1, "shop", "api").await, HashMap::from([("home".to_owned(), 4), ("virtual:member-3".to_owned(), 2)]));
    let vnodes = virtual_nodes(&m1).await;
    for p in Api::<Pod>::namespaced(m1.clone(), "shop").list(&ListParams::default().labels("app=api")).await.unwrap().items {
        let on_virtual = p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some_and(|n| vnodes.contains_key(n));
        let tolerates = p.spec.iter().flat_map(|s| s.tolerations.iter().flatten()).any(|t| t.key.as_deref() == Some(VIRTUAL_NODE_TOLERATION_KEY));
        assert!(!on_virtual || tolerates, "{:?} runs on a virtual node with the toleration Liqo's webhook gave it", p.metadata.name);
    }
    let reflected = Api::<Pod>::namespaced(m3.clone(), "shop-member-1").list(&ListParams::default()).await.unwrap().items;
    assert_eq!(reflected.iter().filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")).count(), 2, "the overflow runs on member-3");

    // The revert: back to 2 replicas at home, no offloading, no twin.
    let evs = revert(&client, id).await;
    assert_eq!(end(&evs), EventType::Reverted, "{}", last(&evs));
    assert_eq!(deployments.get("api").await.unwrap().spec.replicas, Some(2));
    assert!(offloadings(&m1, "shop").get_opt("offloading").await.unwrap().is_none());
    assert!(!exists(&m3, "shop-member-1").await);
    let ns = Api::<Namespace>::all(m1.clone()).get("shop").await.unwrap();
    assert!(!ns.metadata.labels.unwrap_or_default().contains_key(SCHEDULING_LABEL), "Liqo removed the scheduling label with the offloading");
    assert!(placement(&m1, "shop", "api").await.keys().all(|k| !k.starts_with("virtual:")), "no pod left on a virtual node");

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
    assert_eq!(at.iter().filter(|(k, _)| k.starts_with("virtual:")).map(|(_, v)| v).sum::<usize>(), 6, "{at:?}");
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

//! The score worker end to end: commands through a real Kafka-protocol broker (the
//! embedded mock cluster), the worker, and the test bed's real API servers.

use std::sync::Arc;
use std::time::Duration;

use ferry_runtime::{Client, EventType, SubmitOptions, TaskKind};
use ferry_score::spec::{ScoreClusters, ScorePolicy, Workload};
use ferry_score::{ScoreConfig, ScoreHandler};
use ferry_testkit::Bed;
use ferry_testkit::score as demo;
use ferry_kube::kinds::ManagedCluster;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DeleteParams};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(120);

/// Three members of two nodes each and the score worker (the test kit's bed).
async fn bed() -> Option<Bed> {
    let mut bed = Bed::builder().members(3, 2).ocm().start().await?;
    let handler = ScoreHandler::new(ScoreConfig::new(bed.clusters.clone(), bed.kafka.clone(), bed.topics.clone())).unwrap();
    bed.run_worker(handler);
    Some(bed)
}

/// The final events of one task of each of `subjects`, in any order.
async fn finals(events: &mut ferry_runtime::EventStream, subjects: &[&str]) -> Vec<ferry_runtime::ProgressEvent> {
    let mut out = Vec::new();
    let r = tokio::time::timeout(WAIT, async {
        while out.len() < subjects.len() {
            let e = events.next().await.expect("event stream ended");
            if e.kind == TaskKind::SCORE && subjects.contains(&e.subject.as_str()) && e.event.is_final() && !out.iter().any(|o: &ferry_runtime::ProgressEvent| o.subject == e.subject) {
                out.push(e);
            }
        }
    })
    .await;
    let seen: Vec<&str> = out.iter().map(|e| e.subject.as_str()).collect();
    assert!(r.is_ok(), "final events of {subjects:?} within {WAIT:?}: saw only {seen:?}");
    out
}

async fn next_final(events: &mut ferry_runtime::EventStream, subject: &str) -> ferry_runtime::ProgressEvent {
    finals(events, &[subject]).await.remove(0)
}

async fn final_event(client: &Client, events: &mut ferry_runtime::EventStream, spec: &ScoreClusters, subject: &str) -> (ferry_runtime::TaskId, Vec<ferry_runtime::ProgressEvent>) {
    let id = client.submit(TaskKind::SCORE, subject, spec, SubmitOptions::default()).await.unwrap();
    let evs = events.until(id, WAIT, |e| e.event.is_final()).await.unwrap_or_else(|e| panic!("{e}"));
    (id, evs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusters_are_ranked_published_and_scored_on_joining() {
    let Some(bed) = bed().await else { return };
    let client = bed.client();

    // Three clusters under different loads rank in the expected order, and the
    // AddOnPlacementScores and the scores topic agree (the `ferry dev --demo score` run).
    assert!(demo::run(&client, &bed.fleet).await.unwrap(), "the demo's checks failed (see its output)");

    let mut events = client.events(false).await.unwrap();
    // Worst-fit and best-fit rank the same clusters in opposite orders.
    let fit = |policy| ScoreClusters {
        cluster_set: Some("demo".into()),
        policy,
        workload: Some(Workload { cpu: "500m".into(), memory: "512Mi".into(), replicas: 2 }),
        ..ScoreClusters::default()
    };
    let (worst, evs) = final_event(&client, &mut events, &fit(ScorePolicy::WorstFit), "demo/worst").await;
    assert_eq!(evs.last().unwrap().event, EventType::Succeeded);
    let (best, evs) = final_event(&client, &mut events, &fit(ScorePolicy::BestFit), "demo/best").await;
    assert_eq!(evs.last().unwrap().event, EventType::Succeeded);
    let order = |r: Vec<ferry_score::handler::Ranked>| r.into_iter().map(|r| r.cluster).collect::<Vec<_>>();
    assert_eq!(order(demo::ranking(&client, worst).await.unwrap()), ["member-1", "member-3", "member-2"]);
    assert_eq!(order(demo::ranking(&client, best).await.unwrap()), ["member-2", "member-3", "member-1"]);

    // Bad input is rejected with the rule it breaks; an unknown cluster fails by name.
    let bad = ScoreClusters { clusters: vec!["Not_A_Name".into()], ..ScoreClusters::default() };
    let (_, evs) = final_event(&client, &mut events, &bad, "demo/bad").await;
    let last = evs.last().unwrap();
    assert_eq!(last.event, EventType::Rejected);
    assert!(last.message.as_deref().unwrap_or("").contains("\"Not_A_Name\" is not a DNS-1123 label"), "{last:?}");
    let unknown = ScoreClusters { clusters: vec!["nowhere".into()], ..ScoreClusters::default() };
    let (_, evs) = final_event(&client, &mut events, &unknown, "demo/unknown").await;
    let failed = evs.iter().find(|e| e.event == EventType::StepFailed).expect("a failed step");
    assert_eq!(failed.code.as_deref(), Some("UNKNOWN_CLUSTER"));
    assert!(failed.message.as_deref().unwrap_or("").contains("nowhere-kubeconfig"), "{failed:?}");

    // The onboarding watcher scores each cluster it finds, then one created by hand once its
    // agent reports it joined, then one that becomes available again.
    let hub = bed.fleet.hub().client().await.unwrap();
    let watcher_stop = CancellationToken::new();
    let onboarding = tokio::spawn(ferry_score::onboarding::run(hub.clone(), Arc::new(bed.client()), ScoreClusters::default(), watcher_stop.clone()));
    for ev in finals(&mut events, &["cluster/member-1", "cluster/member-2", "cluster/member-3"]).await {
        assert_eq!(ev.event, EventType::Succeeded, "{ev:?}");
    }
    // member-2's ManagedCluster deleted (the hub's GC lets it go) and made anew by hand, as
    // an admin re-registering it would: a new cluster. (A running klusterlet does not make
    // it again: upstream creates it only while bootstrapping, ocm
    // `pkg/registration/spoke/spokeagent.go`; its agent goes on reporting on the new one.)
    let mcs: Api<ManagedCluster> = Api::all(hub.clone());
    let old = mcs.get("member-2").await.unwrap();
    mcs.delete("member-2", &DeleteParams::default()).await.unwrap();
    tokio::time::timeout(WAIT, kube::runtime::wait::await_condition(mcs.clone(), "member-2", |m: Option<&ManagedCluster>| m.is_none())).await.expect("deleted").unwrap();
    // Made anew but not accepted yet: not scored by the watcher, and a scoring asked by hand
    // ranks it without a placement score (upstream's hub makes a cluster's namespace only
    // on acceptance; this one's is still there, kept after the old one's deletion).
    let mut spec = old.spec.clone();
    spec["hubAcceptsClient"] = serde_json::json!(false);
    let anew: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster",
        "metadata": {"name": "member-2", "labels": old.metadata.labels},
        "spec": spec,
    }))
    .unwrap();
    let dynamic: Api<kube::api::DynamicObject> = Api::all_with(hub.clone(), &kube::api::ApiResource::erase::<ManagedCluster>(&()));
    dynamic.create(&kube::api::PostParams::default(), &anew).await.unwrap();
    let by_hand = ScoreClusters { clusters: vec!["member-2".into()], ..ScoreClusters::default() };
    let (_, evs) = final_event(&client, &mut events, &by_hand, "demo/unaccepted").await;
    assert_eq!(evs.last().map(|e| e.event), Some(EventType::Succeeded), "{evs:?}");
    let said: Vec<&str> = evs.iter().filter_map(|e| e.message.as_deref()).collect();
    assert!(said.contains(&"1 cluster(s), 0 accepted by the OCM hub; not accepted by the hub yet (no placement score): member-2"), "{said:?}");
    assert!(said.contains(&"0 placement score(s), 1 record(s) on the scores topic"), "{said:?}");
    // Accepted (`clusteradm accept`): its klusterlet goes on reporting, so it joins and
    // turns available, and that is scored (once: it was never seen joined and unavailable).
    dynamic.patch("member-2", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(serde_json::json!({"spec": {"hubAcceptsClient": true}}))).await.unwrap();
    let is = |status: &'static str| move |m: Option<&ManagedCluster>| m.is_some_and(|m| m.condition("ManagedClusterConditionAvailable") == Some(status));
    tokio::time::timeout(WAIT, kube::runtime::wait::await_condition(mcs.clone(), "member-2", is("True"))).await.expect("member-2 available again").unwrap();
    let ev = next_final(&mut events, "cluster/member-2").await;
    assert_eq!(ev.event, EventType::Succeeded, "a ManagedCluster created anew is scored once it joined: {ev:?}");
    // member-3's API server fails its klusterlet's health check, then recovers.
    let ocm = bed.ocm.as_ref().expect("the bed's OCM");
    ocm.set("member-3", |k| k.unavailable = true);
    tokio::time::timeout(WAIT, kube::runtime::wait::await_condition(mcs.clone(), "member-3", is("False"))).await.expect("member-3 unavailable").unwrap();
    ocm.set("member-3", |k| k.unavailable = false);
    let ev = next_final(&mut events, "cluster/member-3").await;
    assert_eq!(ev.event, EventType::Succeeded, "a cluster that becomes available is scored: {ev:?}");
    watcher_stop.cancel();
    assert_eq!(onboarding.await.unwrap().unwrap(), 5, "three found, one created anew, one available again");

    // No topic holds secret material: no kubeconfig, token or key, and none of the fleet's
    // actual admin tokens (the workers read them from Secrets on the hub all along).
    let tokens: Vec<String> = bed
        .fleet
        .clusters
        .iter()
        .filter_map(|c| c.kubeconfig_inline().ok())
        .filter_map(|k| k.lines().find_map(|l| l.trim().strip_prefix("token: ").map(str::to_owned)))
        .collect();
    assert_eq!(tokens.len(), 4);
    let mut scanned = 0;
    for t in bed.topics.all() {
        for (_, payload) in client.read_to_end(&t.name).await.unwrap() {
            assert_eq!(ferry_runtime::secrets::find_with(&payload, &tokens), None, "secret material on {}", t.name);
            scanned += 1;
        }
    }
    assert!(scanned > 50, "the scan read the topics ({scanned} records)");
    bed.stop().await;
}

/// The benchmark policy through OCM: a ManifestWork per cluster runs the benchmark Job
/// (the test bed's emulated work agent applies it; the emulated benchmark image writes
/// the result), feedback brings the results back, a cluster that never reports scores
/// -100 at the deadline, and every ManifestWork and what it applied is gone afterwards,
/// but a benchmark namespace that was there before, and what is in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_benchmark_scoring_runs_through_manifest_works_and_cleans_up() {
    let Some(bed) = bed().await else { return };
    let hub = bed.fleet.hub().client().await.unwrap();
    demo::register(&bed.fleet, &["member-1", "member-2", "member-3"], "bench").await.unwrap();
    let overrides: ferry_testkit::benchmark_image::Overrides = Default::default();
    overrides.lock().unwrap().extend([("member-1".to_owned(), Some(10.0)), ("member-2".to_owned(), Some(30.0)), ("member-3".to_owned(), None)]);
    let mut images = Vec::new();
    for c in ["member-1", "member-2", "member-3"] {
        images.push(ferry_testkit::benchmark_image::start(c, bed.fleet.cluster(c).unwrap().client().await.unwrap(), overrides.clone()));
    }
    // Ferry reads the clusters (through their kubeconfig Secrets) to see which namespaces
    // are there; someone's namespace of the benchmark's name on member-1, with something in it.
    bed.fleet.publish_kubeconfigs().await.unwrap();
    let ns = ferry_score::ScoreConfig::new(bed.clusters.clone(), bed.kafka.clone(), bed.topics.clone()).benchmark_namespace;
    let m1 = bed.fleet.cluster("member-1").unwrap().client().await.unwrap();
    let pp = kube::api::PatchParams::apply("someone");
    let theirs = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
    Api::<Namespace>::all(m1.clone()).patch(&ns, &pp, &kube::api::Patch::Apply(&theirs)).await.unwrap();
    let kept = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "keep-me", "namespace": ns}, "data": {"k": "v"}});
    Api::<ConfigMap>::namespaced(m1.clone(), &ns).patch("keep-me", &pp, &kube::api::Patch::Apply(&kept)).await.unwrap();
    let client = bed.client();
    let mut events = client.events(false).await.unwrap();
    let spec = ScoreClusters {
        cluster_set: Some("bench".into()),
        policy: ScorePolicy::Benchmark,
        benchmark: Some(ferry_score::spec::BenchmarkSpec { image: "ghcr.io/acme/bench:1".into(), deadline_seconds: 20 }),
        ..ScoreClusters::default()
    };
    let (id, evs) = final_event(&client, &mut events, &spec, "bench/benchmark").await;
    assert_eq!(evs.last().unwrap().event, EventType::Succeeded, "{:?}", evs.last());
    let ranking = demo::ranking(&client, id).await.unwrap();
    let order: Vec<(&str, i32)> = ranking.iter().map(|r| (r.cluster.as_str(), r.score)).collect();
    assert_eq!(order.iter().map(|o| o.0).collect::<Vec<_>>(), ["member-2", "member-1", "member-3"], "{ranking:?}");
    assert_eq!(order[2].1, -100, "a cluster that never reports scores -100: {ranking:?}");
    assert!(ranking[2].reason.contains("waited"), "the reason says it timed out: {:?}", ranking[2].reason);
    for c in ["member-1", "member-2", "member-3"] {
        let works = Api::<ferry_kube::kinds::ManifestWork>::namespaced(hub.clone(), c).list(&Default::default()).await.unwrap();
        assert!(works.items.is_empty(), "no ManifestWork left in {c}: {:?}", works.items.iter().map(|w| w.metadata.name.clone()).collect::<Vec<_>>());
        let kc = bed.fleet.cluster(c).unwrap().client().await.unwrap();
        let jobs = Api::<k8s_openapi::api::batch::v1::Job>::all(kc).list(&Default::default()).await.unwrap();
        assert!(jobs.items.is_empty(), "no benchmark Job left on {c}");
    }
    // The namespace that was there stays, with what is in it, and without the work's owner;
    // one the benchmark made goes with its ManifestWork.
    let there = Api::<Namespace>::all(m1.clone()).get_opt(&ns).await.unwrap().expect("the namespace that was there is kept");
    assert!(there.metadata.deletion_timestamp.is_none(), "the namespace that was there is not being deleted");
    assert!(there.metadata.owner_references.unwrap_or_default().is_empty(), "no work owns it");
    assert!(Api::<ConfigMap>::namespaced(m1.clone(), &ns).get_opt("keep-me").await.unwrap().is_some(), "what was in it is kept");
    let m2 = bed.fleet.cluster("member-2").unwrap().client().await.unwrap();
    let made = Api::<Namespace>::all(m2).get_opt(&ns).await.unwrap();
    assert!(made.is_none_or(|n| n.metadata.deletion_timestamp.is_some()), "the namespace the benchmark made goes");
    drop(images);
    bed.stop().await;
}

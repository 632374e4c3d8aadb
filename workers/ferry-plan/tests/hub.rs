//! Fanned-out plan steps that choose their clusters on a real hub: the test bed's API
//! server with OCM's upstream CRDs, 24 ManagedClusters on it (virtual clusters: objects
//! on the hub, no API server each; their children are `test` tasks, one per cluster),
//! and ManagedClusterSets of both selector types. Commands go through the embedded broker
//! to real `test` and `plan` workers. Every wait is on events with a deadline.

use std::sync::Arc;
use std::time::Duration;

use ferry_kube::kinds::{ManagedCluster, ManagedClusterSet};
use ferry_plan::spec::PlanSpec;
use ferry_plan::{PlanConfig, PlanHandler};
use ferry_runtime::child_tasks::{KafkaChildren, encode_registered};
use ferry_runtime::testkind::{TestHandler, TestTaskSpec};
use ferry_runtime::{EventType, SubmitOptions, TaskId, TaskKind, TaskState};
use ferry_testkit::Bed;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(180);

/// `edge-01` .. `edge-24`: `env=prod` for the first 20, `env=dev` for the rest; the first
/// six in set `blue` (its label), every third `tier=core`.
fn clusters() -> Vec<(String, Value)> {
    (1..=24)
        .map(|i| {
            let name = format!("edge-{i:02}");
            let mut labels = json!({"env": if i <= 20 { "prod" } else { "dev" }});
            if i <= 6 {
                labels["cluster.open-cluster-management.io/clusterset"] = json!("blue");
            }
            if i % 3 == 0 {
                labels["tier"] = json!("core");
            }
            (name, labels)
        })
        .collect()
}

fn apply() -> PatchParams {
    PatchParams::apply("ferry-test").force()
}

async fn bed() -> Option<Bed> {
    let mut bed = Bed::builder().start().await?;
    let hub = bed.hub().await;
    let mcs: Api<ManagedCluster> = Api::all(hub.clone());
    for (name, labels) in clusters() {
        let mc = json!({
            "apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster",
            "metadata": {"name": name, "labels": labels},
            "spec": {"hubAcceptsClient": true},
        });
        mcs.patch(&name, &apply(), &Patch::Apply(mc)).await.expect("create a ManagedCluster");
    }
    let sets: Api<ManagedClusterSet> = Api::all(hub.clone());
    for set in [
        // The default selector type, ExclusiveClusterSetLabel (the API server's default).
        ("blue", json!({})),
        ("core", json!({"clusterSelector": {"selectorType": "LabelSelector", "labelSelector": {"matchLabels": {"tier": "core"}}}})),
    ] {
        let (name, spec) = set;
        let set = json!({"apiVersion": "cluster.open-cluster-management.io/v1beta2", "kind": "ManagedClusterSet", "metadata": {"name": name}, "spec": spec});
        sets.patch(name, &apply(), &Patch::Apply(set)).await.expect("create a ManagedClusterSet");
    }
    bed.run_worker(TestHandler { min_delay: Some(Duration::from_millis(10)), effects: None });
    let children = KafkaChildren::new(bed.client(), Arc::new(encode_registered)).await.expect("children over Kafka");
    let mut cfg = PlanConfig::new(Arc::new(children)).with_hub(hub);
    cfg.child_timeout = WAIT;
    bed.run_worker(PlanHandler::new(cfg));
    Some(bed)
}

fn rollout(for_each: Value) -> PlanSpec {
    serde_json::from_value(json!({"steps": [{
        "name": "roll", "kind": "test", "subject": "${cluster}/app",
        "spec": serde_json::to_value(TestTaskSpec::steps(1)).unwrap(),
        "for_each": for_each,
    }]}))
    .unwrap()
}

/// The clusters of a finished rollout's children, from its output, and each child's state.
async fn children(bed: &Bed, plan: TaskId) -> Vec<(String, TaskState)> {
    let snap = bed.client().snapshot(plan).await.unwrap().expect("the plan's snapshot");
    let out: Value = snap.output_of("roll").expect("the step's output");
    let mut found = Vec::new();
    for (cluster, id) in out["clusters"].as_object().expect("clusters") {
        let id: TaskId = id.as_str().unwrap().parse().unwrap();
        let child = bed.client().snapshot(id).await.unwrap().expect("a child's snapshot");
        assert_eq!(child.subject, format!("{cluster}/app"));
        found.push((cluster.clone(), child.state));
    }
    found
}

async fn run(client: &ferry_runtime::Client, for_each: Value, subject: &str) -> TaskId {
    client.submit(TaskKind::PLAN, subject, &rollout(for_each), SubmitOptions::default()).await.expect("submit")
}

fn names(range: impl Iterator<Item = usize>) -> Vec<String> {
    range.map(|i| format!("edge-{i:02}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_fans_out_over_the_clusters_its_labels_or_cluster_set_choose() {
    let Some(bed) = bed().await else { return };
    let client = bed.client();
    let mut events = client.events(true).await.unwrap();

    // By labels: the 20 prod clusters, by name, in waves of 5 with 3 in flight.
    let id = run(&client, json!({"labels": {"env": "prod"}, "waves": {"size": 5, "max_in_flight": 3}}), "rollout/prod").await;
    let evs = events.until(id, WAIT, |e| e.event.is_final()).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(evs.last().unwrap().event, EventType::Succeeded, "{evs:#?}");
    let out: Value = client.snapshot(id).await.unwrap().unwrap().output_of("roll").unwrap();
    let waves: Vec<Vec<String>> = serde_json::from_value(out["waves"].clone()).unwrap();
    assert_eq!(waves, [names(1..=5), names(6..=10), names(11..=15), names(16..=20)]);
    let done = children(&bed, id).await;
    assert_eq!(done.len(), 20, "{done:?}");
    assert!(done.iter().all(|(_, s)| *s == TaskState::Succeeded), "{done:?}");

    // By a set of the ExclusiveClusterSetLabel type (its label), and of the LabelSelector
    // type (its selector), as OCM defines them.
    for (set, want) in [("blue", names(1..=6)), ("core", names((3..=24).step_by(3)))] {
        let id = run(&client, json!({"cluster_set": set}), "rollout/set").await;
        let evs = events.until(id, WAIT, |e| e.event.is_final()).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(evs.last().unwrap().event, EventType::Succeeded, "{evs:#?}");
        let got: Vec<String> = children(&bed, id).await.into_iter().map(|(c, _)| c).collect();
        assert_eq!(got, want, "set {set}");
    }

    // Clusters OCM's taints keep out of a Placement are left out here too, and the choice
    // says why: edge-02 unavailable (NoSelect), edge-04 NoSelectIfNew; edge-03's
    // PreferNoSelect only ranks it lower, so it stays.
    let mcs: Api<ManagedCluster> = Api::all(bed.hub().await);
    for (cluster, key, effect) in [
        ("edge-02", "cluster.open-cluster-management.io/unavailable", "NoSelect"),
        ("edge-03", "example.com/busy", "PreferNoSelect"),
        ("edge-04", "example.com/draining", "NoSelectIfNew"),
    ] {
        let taint = json!({"apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster", "metadata": {"name": cluster},
            "spec": {"taints": [{"key": key, "effect": effect, "timeAdded": "2026-01-01T00:00:00Z"}]}});
        mcs.patch(cluster, &PatchParams::apply("ocm-taints").force(), &Patch::Apply(taint)).await.expect("taint a ManagedCluster");
    }
    let id = run(&client, json!({"cluster_set": "blue"}), "rollout/tainted").await;
    let evs = events.until(id, WAIT, |e| e.event.is_final()).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(evs.last().unwrap().event, EventType::Succeeded, "{evs:#?}");
    let got: Vec<String> = children(&bed, id).await.into_iter().map(|(c, _)| c).collect();
    assert_eq!(got, ["edge-01", "edge-03", "edge-05", "edge-06"]);
    let choice: Value = client.snapshot(id).await.unwrap().unwrap().output_of("roll.clusters").expect("the choice's output");
    assert_eq!(
        choice["left_out"],
        json!({"edge-02": "taint cluster.open-cluster-management.io/unavailable:NoSelect", "edge-04": "taint example.com/draining:NoSelectIfNew"}),
        "{choice}"
    );

    // A set that does not exist: rejected before any child is sent, naming it.
    let id = run(&client, json!({"cluster_set": "green"}), "rollout/none").await;
    let evs = events.until(id, WAIT, |e| e.event.is_final()).await.unwrap_or_else(|e| panic!("{e}"));
    let last = evs.last().unwrap();
    assert_eq!((last.event, last.code.as_deref()), (EventType::Rejected, Some("CLUSTERS_UNCHOSEN")), "{evs:#?}");
    assert_eq!(last.message.as_deref(), Some("step roll: ManagedClusterSet \"green\" does not exist on the hub"));

    // A child its kind refuses, of a cluster only the hub's labels choose: the choice
    // checks every child once it knows them, so the plan is Rejected before its first
    // wave sends any (before, edge-01 .. edge-06 ran and were reverted first).
    let bad = json!({"labels": {"env": "prod"}, "waves": {"size": 6}, "overrides": [{"clusters": ["edge-07"], "spec": {"steps": 0}}]});
    let id = run(&client, bad, "rollout/refused").await;
    let evs = events.until(id, WAIT, |e| e.event.is_final()).await.unwrap_or_else(|e| panic!("{e}"));
    let last = evs.last().unwrap();
    assert_eq!((last.event, last.code.as_deref()), (EventType::Rejected, Some("CHILD_SPEC")), "{evs:#?}");
    let why = last.message.as_deref().unwrap_or_default();
    assert!(why.starts_with("step roll for edge-07: the test kind refuses this child: "), "{why}");
    assert!(!evs.iter().any(|e| e.event == EventType::StepStarted && e.step_name.as_deref() == Some("roll")), "a wave started: {evs:#?}");
    bed.stop().await;
}

/// Marks `cluster` Available (as its registration agent would) and gives it an
/// AddOnPlacementScore `ferry-resource-usage` whose `score` item is `score`, valid an hour.
async fn healthy(hub: &kube::Client, cluster: &str, score: i32) {
    let status = json!({"status": {"conditions": [{"type": "ManagedClusterConditionAvailable", "status": "True", "reason": "ManagedClusterAvailable",
        "message": "the agent reports", "lastTransitionTime": "2026-11-26T00:00:00Z"}]}});
    Api::<ManagedCluster>::all(hub.clone()).patch_status(cluster, &PatchParams::default(), &Patch::Merge(&status)).await.expect("ManagedCluster status");
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": cluster}});
    Api::<k8s_openapi::api::core::v1::Namespace>::all(hub.clone()).patch(cluster, &apply(), &Patch::Apply(ns)).await.expect("cluster namespace");
    let scores: Api<ferry_kube::kinds::AddOnPlacementScore> = Api::namespaced(hub.clone(), cluster);
    let aps = json!({"apiVersion": "cluster.open-cluster-management.io/v1alpha1", "kind": "AddOnPlacementScore", "metadata": {"name": "ferry-resource-usage", "namespace": cluster}});
    scores.patch("ferry-resource-usage", &apply(), &Patch::Apply(aps)).await.expect("an AddOnPlacementScore");
    let until = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1);
    let status = json!({"status": {"scores": [{"name": "score", "value": score}], "validUntil": until.to_string()}});
    scores.patch_status("ferry-resource-usage", &PatchParams::default(), &Patch::Merge(&status)).await.expect("its scores");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wave_passes_its_gate_only_if_the_hub_says_its_clusters_are_available_and_scored_enough() {
    let Some(bed) = bed().await else { return };
    let client = bed.client();
    let hub = bed.hub().await;
    for i in 1..=6 {
        healthy(&hub, &format!("edge-{i:02}"), if i == 4 { 10 } else { 80 }).await;
    }
    let mut events = client.events(true).await.unwrap();
    let gate = json!({"available": true, "score": {"name": "ferry-resource-usage", "item": "score", "min": 50}});

    // Set blue (edge-01..06) in waves of 3: the first passes; in the second, edge-04's
    // score is below the minimum, so that wave is put back though its children succeeded.
    let id = run(&client, json!({"cluster_set": "blue", "waves": {"size": 3, "gate": gate}, "on_failure": "revert-wave"}), "rollout/gated").await;
    let evs = events.until(id, WAIT, |e| e.event.is_final()).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(evs.last().unwrap().event, EventType::Failed, "{evs:#?}");
    let failed = evs.iter().find(|e| e.event == EventType::StepFailed).expect("the step failed");
    let why = failed.message.clone().unwrap_or_default();
    assert!(why.contains("wave 2/2") && why.contains("edge-04: score 10 of AddOnPlacementScore edge-04/ferry-resource-usage is below the gate's 50"), "{why}");
    assert!(evs.iter().any(|e| e.message.as_deref() == Some("wave 1/2: the hub's gate passed")), "{evs:#?}");
    let states: Vec<(String, TaskState)> = children(&bed, id).await;
    let want: Vec<(String, TaskState)> = names(1..=6).into_iter().map(|c| {
        let s = if c.as_str() <= "edge-03" { TaskState::Succeeded } else { TaskState::Reverted };
        (c, s)
    }).collect();
    assert_eq!(states, want, "the first wave stays, the second is put back");

    // edge-07 never reported to the hub: not Available, so the gate fails.
    let id = run(&client, json!({"clusters": ["edge-07"], "waves": {"gate": {"available": true}}, "on_failure": "halt"}), "rollout/unavailable").await;
    let evs = events.until(id, WAIT, |e| e.event.is_final()).await.unwrap_or_else(|e| panic!("{e}"));
    let why = evs.iter().find(|e| e.event == EventType::StepFailed).and_then(|e| e.message.clone()).unwrap_or_default();
    assert!(why.contains("edge-07: the gate wants it Available on the hub; ManagedClusterConditionAvailable is not reported"), "{why}");
    bed.stop().await;
}

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

    // A set that does not exist: rejected before any child is sent, naming it.
    let id = run(&client, json!({"cluster_set": "green"}), "rollout/none").await;
    let evs = events.until(id, WAIT, |e| e.event.is_final()).await.unwrap_or_else(|e| panic!("{e}"));
    let last = evs.last().unwrap();
    assert_eq!((last.event, last.code.as_deref()), (EventType::Rejected, Some("CLUSTERS_UNCHOSEN")), "{evs:#?}");
    assert_eq!(last.message.as_deref(), Some("step roll: ManagedClusterSet \"green\" does not exist on the hub"));
    bed.stop().await;
}

//! The emulated work agent reports a ManifestWork's status when upstream's would, not
//! sooner: a resource whose feedback is `Watch` is reported as soon as it changes; one
//! polled (the default) only on the work's next status sync (its interval, or a change of
//! the work), so a worker tested here cannot come to rely on a promptness a real agent
//! does not have (ocm `pkg/work/spoke/controllers/statuscontroller/availablestatus_controller.go`,
//! `pkg/work/spoke/objectreader/reader.go`).

use std::time::Duration;

use ferry_kube::kinds::ManifestWork;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::wait::await_condition;
use serde_json::json;

mod common;

const WAIT: Duration = Duration::from_secs(90);

/// A work carrying ConfigMap `name` (created only: the agent leaves later changes alone)
/// with its `data.v` fed back, by watch or by poll.
fn work(name: &str, watch: bool) -> serde_json::Value {
    let mut config = json!({
        "resourceIdentifier": {"group": "", "resource": "configmaps", "name": name, "namespace": "default"},
        "updateStrategy": {"type": "CreateOnly"},
        "feedbackRules": [{"type": "JSONPaths", "jsonPaths": [{"name": "v", "path": ".data.v"}]}],
    });
    if watch {
        config["feedbackScrapeType"] = json!("Watch");
    }
    json!({
        "apiVersion": "work.open-cluster-management.io/v1", "kind": "ManifestWork",
        "metadata": {"name": name, "namespace": "member-1"},
        "spec": {
            "workload": {"manifests": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"}, "data": {"v": "1"}}]},
            "manifestConfigs": [config],
        },
    })
}

/// The value `v` the work's status feeds back, if any.
fn fed_back(w: Option<&ManifestWork>) -> Option<String> {
    ferry_kube::kinds::feedback_values(w?, |_| true).into_iter().find_map(|(n, v)| (n == "v").then_some(v))
}

async fn until_fed_back(works: &Api<ManifestWork>, name: &str, value: &'static str) {
    tokio::time::timeout(WAIT, await_condition(works.clone(), name, move |w: Option<&ManifestWork>| fed_back(w).as_deref() == Some(value)))
        .await
        .unwrap_or_else(|_| {
            let w = futures::executor::block_on(works.get(name));
            panic!("work {name} feeds back v={value} within {WAIT:?}: {:?}", w.map(|w| (w.metadata, w.status)))
        })
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_polled_resource_is_reported_on_the_status_sync_a_watched_one_at_once() {
    // A status sync interval no test outlasts: a polled resource is read again only when
    // its work changes.
    let bed = common::work_agent_bed(|k| k.status_sync_interval = Some(Duration::from_secs(3600))).await;
    let (works, cms) = (&bed.works, &bed.configmaps);
    for (name, watch) in [("watched", true), ("polled", false)] {
        works.patch(name, &PatchParams::apply("test"), &Patch::Apply(&work(name, watch))).await.unwrap();
    }
    until_fed_back(works, "watched", "1").await;
    until_fed_back(works, "polled", "1").await;

    // Both resources change on the cluster: the watched one's work reports it.
    for name in ["watched", "polled"] {
        cms.patch(name, &PatchParams::default(), &Patch::Merge(json!({"data": {"v": "2"}}))).await.unwrap();
    }
    until_fed_back(works, "watched", "2").await;
    // The polled one's still says what it read last: its sync is an hour away and its work
    // did not change (before, every pass of the agent reported every work).
    let polled = works.get("polled").await.unwrap();
    assert_eq!(fed_back(Some(&polled)).as_deref(), Some("1"), "a polled resource's change is reported before the work's status sync: {:?}", polled.status);

    // A change of the work is a sync: now it reports the new value.
    works.patch("polled", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}}))).await.unwrap();
    until_fed_back(works, "polled", "2").await;
}

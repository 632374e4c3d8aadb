//! The emulated work agent applies a ManifestWork's manifests when upstream's would, not
//! more often: when the work's spec or labels change, and on its resync (4-6 minutes), so
//! a manifest deleted on the cluster comes back minutes later, not on the agent's next
//! pass over another work. A worker tested here cannot come to rely on a repair a real
//! agent does not make (ocm `pkg/work/spoke/controllers/manifestcontroller/manifestwork_controller.go`).

use std::time::Duration;

use ferry_kube::kinds::ManifestWork;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use serde_json::json;

mod common;

const WAIT: Duration = Duration::from_secs(90);

/// A work carrying ConfigMap `name` with `data.v` (the default Update strategy).
fn work(name: &str, v: &str) -> serde_json::Value {
    json!({
        "apiVersion": "work.open-cluster-management.io/v1", "kind": "ManifestWork",
        "metadata": {"name": name, "namespace": "member-1"},
        "spec": {"workload": {"manifests": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"}, "data": {"v": v}}]}},
    })
}

/// Waits until ConfigMap `name` on the member holds `v` (None: is gone).
async fn until(cms: &Api<ConfigMap>, name: &str, v: Option<&'static str>, what: &str) {
    let holds = move |cm: Option<&ConfigMap>| cm.map(|c| c.data.as_ref().and_then(|d| d.get("v")).cloned().unwrap_or_default()) == v.map(str::to_owned);
    tokio::time::timeout(WAIT, await_condition(cms.clone(), name, holds))
        .await
        .unwrap_or_else(|_| panic!("{what} within {WAIT:?}: ConfigMap {name} is {:?}", futures::executor::block_on(cms.get_opt(name)).map(|c| c.map(|c| c.data))))
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_deleted_on_the_cluster_comes_back_on_its_works_change_or_resync_only() {
    // A resync no test outlasts: a work is applied again only when it changes.
    let bed = common::work_agent_bed(|k| k.apply_resync_interval = Some(Duration::from_secs(3600))).await;
    let (works, cms, ocm) = (&bed.works, &bed.configmaps, &bed.ocm);
    // The agent goes over the works in the order the API server lists them, by name:
    // "kept" before "z-other".
    for name in ["kept", "z-other"] {
        works.patch(name, &PatchParams::apply("test"), &Patch::Apply(&work(name, "1"))).await.unwrap();
    }
    until(cms, "kept", Some("1"), "the first work is applied").await;
    until(cms, "z-other", Some("1"), "the second work is applied").await;

    // Someone deletes the first work's ConfigMap on the cluster; then the second work
    // changes. The agent's pass that applies the second does not apply the first again
    // (before, every pass re-applied every work, the first one ahead of the second).
    let uid = cms.get("kept").await.unwrap().metadata.uid.unwrap_or_default();
    cms.delete("kept", &DeleteParams::default()).await.unwrap();
    tokio::time::timeout(WAIT, await_condition(cms.clone(), "kept", conditions::is_deleted(&uid))).await.expect("the ConfigMap goes").unwrap();
    works.patch("z-other", &PatchParams::apply("test"), &Patch::Apply(&work("z-other", "2"))).await.unwrap();
    until(cms, "z-other", Some("2"), "the second work's change is applied").await;
    assert!(cms.get_opt("kept").await.unwrap().is_none(), "a deleted manifest is not re-applied before its work changes or its resync");

    // A change of the work's labels is a pass (upstream's update handler): it comes back.
    works.patch("kept", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}}))).await.unwrap();
    until(cms, "kept", Some("1"), "a change of the work's labels applies it again").await;

    // So does the resync, once it runs out.
    let uid = cms.get("kept").await.unwrap().metadata.uid.unwrap_or_default();
    cms.delete("kept", &DeleteParams::default()).await.unwrap();
    tokio::time::timeout(WAIT, await_condition(cms.clone(), "kept", conditions::is_deleted(&uid))).await.expect("the ConfigMap goes").unwrap();
    ocm.set("member-1", |k| k.apply_resync_interval = Some(Duration::from_secs(1)));
    until(cms, "kept", Some("1"), "the resync applies it again").await;
}

/// The work's `Applied` condition: its status and observed generation.
fn applied(w: Option<&ManifestWork>) -> Option<(String, i64)> {
    let c = w?.status_at("/conditions")?.as_array()?.iter().find(|c| c["type"] == "Applied")?;
    Some((c["status"].as_str()?.to_owned(), c["observedGeneration"].as_i64()?))
}

async fn until_applied(works: &Api<ManifestWork>, name: &str, status: &'static str, what: &str) {
    tokio::time::timeout(WAIT, await_condition(works.clone(), name, move |w: Option<&ManifestWork>| applied(w).is_some_and(|(s, _)| s == status)))
        .await
        .unwrap_or_else(|_| panic!("{what} within {WAIT:?}: {:?}", futures::executor::block_on(works.get(name)).map(|w| w.status)))
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apply_pass_that_fails_reports_applied_false_at_once_and_retries_on_the_rate_limiter() {
    // Neither a resync nor a status sync comes by itself: the test says when.
    let bed = common::work_agent_bed(|k| {
        k.apply_resync_interval = Some(Duration::from_secs(3600));
        k.status_sync_interval = Some(Duration::from_secs(3600));
    })
    .await;
    let (works, cms, ocm) = (&bed.works, &bed.configmaps, &bed.ocm);
    let namespaces: Api<Namespace> = Api::all(cms.clone().into_client());
    let ns = || serde_json::from_value::<Namespace>(json!({"metadata": {"name": "doomed"}})).unwrap();
    namespaces.create(&Default::default(), &ns()).await.unwrap();
    let mut w = work("kept", "1");
    w["spec"]["workload"]["manifests"][0]["metadata"]["namespace"] = json!("doomed");
    works.patch("kept", &PatchParams::apply("test"), &Patch::Apply(&w)).await.unwrap();
    until_applied(works, "kept", "True", "the work is applied").await;
    let generation = applied(Some(&works.get("kept").await.unwrap())).unwrap().1;

    // The namespace goes on the cluster; the work's resync comes: its ConfigMap cannot be
    // created. The apply controller's own status write says so at once (upstream's
    // `PatchStatus` after every pass); before, only the status controller's next sync
    // (an hour away here) would have.
    let uid = namespaces.get("doomed").await.unwrap().metadata.uid.unwrap_or_default();
    namespaces.delete("doomed", &DeleteParams::default()).await.unwrap();
    tokio::time::timeout(WAIT, await_condition(namespaces.clone(), "doomed", conditions::is_deleted(&uid))).await.expect("the namespace goes").unwrap();
    ocm.set("member-1", |k| k.apply_resync_interval = Some(Duration::from_secs(1)));
    until_applied(works, "kept", "False", "a failed resync's Applied=False").await;
    assert_eq!(applied(Some(&works.get("kept").await.unwrap())).unwrap().1, generation, "the same generation, a later outcome");

    // A failed pass is retried on the queue's rate limiter, not on the resync: with the
    // resync an hour away again, the namespace's return is enough.
    ocm.set("member-1", |k| k.apply_resync_interval = Some(Duration::from_secs(3600)));
    namespaces.create(&Default::default(), &ns()).await.unwrap();
    until_applied(works, "kept", "True", "the rate limiter's retry applies it").await;
    let cms: Api<ConfigMap> = Api::namespaced(cms.clone().into_client(), "doomed");
    until(&cms, "kept", Some("1"), "the ConfigMap is back").await;
}

//! The benchmark policy's measurement, through OCM as the onboarding flow did it, but
//! cleaned up: one ManifestWork per cluster carries the benchmark Job (with a
//! ServiceAccount allowed to write one ConfigMap), feedback rules bring back the Job's
//! completion and the result the Job writes to ConfigMap `ferry-benchmark-result` (key
//! `result`, a number, higher is better); every cluster has until the deadline; then the
//! ManifestWorks are deleted and their removal awaited. The benchmark namespace is made
//! only when missing and, when it was there before the task (someone else's, or another
//! benchmark's), orphaned: deleting the ManifestWork never deletes it or what is in it
//! ([`ferry_kube::orphans`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use ferry_kube::kinds::ManifestWork;
use ferry_kube::step_errors::{client_err, kube_err};
use ferry_kube::{Check, HUB};
use ferry_task::{StepContext, StepError, codes};
use futures::future::join_all;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};

use crate::handler::{Inner, MANAGER, TASK_ANNOTATION};
use crate::spec::ScoreClusters;

/// Name of the ConfigMap the benchmark writes its result to.
pub const RESULT_CONFIGMAP: &str = "ferry-benchmark-result";
/// Label on the benchmark Job.
pub const BENCHMARK_LABEL: &str = "ferry.io/benchmark";

/// The ManifestWork's name for a task (stable, so re-runs apply the same object).
pub fn work_name(cx: &StepContext<'_, ScoreClusters>) -> String {
    let id = cx.task_id.to_string();
    let tail: String = id.chars().rev().take(12).collect::<Vec<_>>().into_iter().rev().collect();
    format!("ferry-benchmark-{tail}")
}

/// The ManifestWork that runs the benchmark on `cluster`; `found`: the namespaces there
/// before the task, which the work must not own.
pub fn manifest_work(cluster: &str, name: &str, namespace: &str, image: &str, deadline_s: i32, task: &str, found: &BTreeSet<String>) -> Value {
    let labels = json!({"app.kubernetes.io/managed-by": "ferry", BENCHMARK_LABEL: "true"});
    let manifests = json!([
        // Marked with the task, so that a run of this task again knows it made it.
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": labels, "annotations": {TASK_ANNOTATION: task}}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "ferry-benchmark", "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "ferry-benchmark", "namespace": namespace},
         "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [RESULT_CONFIGMAP], "verbs": ["get", "update", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "ferry-benchmark", "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "ferry-benchmark"},
         "subjects": [{"kind": "ServiceAccount", "name": "ferry-benchmark", "namespace": namespace}]},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": RESULT_CONFIGMAP, "namespace": namespace, "labels": labels}},
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": namespace, "labels": labels},
         "spec": {"backoffLimit": 0, "activeDeadlineSeconds": deadline_s, "template": {"metadata": {"labels": labels}, "spec": {
            "restartPolicy": "Never", "serviceAccountName": "ferry-benchmark",
            "containers": [{"name": "benchmark", "image": image,
                "env": [{"name": "RESULT_CONFIGMAP", "value": RESULT_CONFIGMAP}, {"name": "RESULT_NAMESPACE", "value": namespace}],
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}}}},
    ]);
    json!({
        "apiVersion": "work.open-cluster-management.io/v1",
        "kind": "ManifestWork",
        "metadata": {"name": name, "namespace": cluster, "labels": {"app.kubernetes.io/managed-by": "ferry"}, "annotations": {TASK_ANNOTATION: task}},
        "spec": {
            "workload": {"manifests": manifests},
            // Foreground (or no option) would own, and on deletion delete, a namespace
            // that was there (ocm pkg/work/helper/helpers.go, OwnedByTheWork): orphan it.
            "deleteOption": ferry_kube::orphans::delete_option(manifests.as_array().map_or(&[][..], Vec::as_slice), found),
            // CreateOnly for the two objects the cluster writes after they are created:
            // the default strategy, Update, rewrites a manifest as written whenever the
            // live object differs (ocm pkg/work/spoke/apply/update_apply.go, library-go's
            // ApplyConfigMap compares the data), which would erase the result the Job
            // writes, and would try to rewrite the Job's defaulted, immutable template.
            // The namespace too: Update would rewrite one that is there (its labels and
            // annotations merged, ocm update_apply.go) and add the work's owner to it.
            // Feedback by watch: the agent reports the Job's end and the result at once,
            // not on its 10-19 s status sync (ocm pkg/work/spoke/objectreader/reader.go).
            "manifestConfigs": [
                {"resourceIdentifier": {"group": "", "resource": "namespaces", "name": namespace}, "updateStrategy": {"type": ferry_kube::orphans::CREATE_ONLY}},
                {"resourceIdentifier": {"group": "batch", "resource": "jobs", "name": name, "namespace": namespace},
                 "feedbackRules": [{"type": "JSONPaths", "jsonPaths": [{"name": "succeeded", "path": ".status.succeeded"}, {"name": "failed", "path": ".status.failed"}]}],
                 "feedbackScrapeType": "Watch",
                 "updateStrategy": {"type": "CreateOnly"}},
                {"resourceIdentifier": {"group": "", "resource": "configmaps", "name": RESULT_CONFIGMAP, "namespace": namespace},
                 "feedbackRules": [{"type": "JSONPaths", "jsonPaths": [{"name": "result", "path": ".data.result"}]}],
                 "feedbackScrapeType": "Watch",
                 "updateStrategy": {"type": "CreateOnly"}},
            ],
        },
    })
}

/// The feedback value `name` of any manifest in a ManifestWork's status, as text.
pub fn feedback(work: &ManifestWork, name: &str) -> Option<String> {
    ferry_kube::kinds::feedback_values(work, |_| true).into_iter().find_map(|(n, v)| (n == name).then_some(v))
}

/// What the ManifestWork's feedback says of the benchmark.
pub fn outcome(work: Option<&ManifestWork>) -> Check<Result<f64, String>> {
    let Some(w) = work else { return Check::Pending("the ManifestWork is not there yet".into()) };
    if let Some(r) = feedback(w, "result").filter(|r| !r.is_empty()) {
        return Check::Done(r.trim().parse::<f64>().map_err(|_| format!("result {r:?} is not a number")));
    }
    if feedback(w, "failed").and_then(|f| f.parse::<i64>().ok()).is_some_and(|f| f > 0) {
        return Check::Done(Err("the benchmark Job failed".into()));
    }
    let applied = w.condition("Applied").unwrap_or("Unknown");
    let done = feedback(w, "succeeded").unwrap_or_else(|| "unknown".into());
    Check::Pending(format!("Applied={applied}, job succeeded={done}, no result yet"))
}

/// Runs the benchmark on every cluster; each result or the reason it has none. The
/// ManifestWorks are gone when this returns Ok.
pub(crate) async fn run(inner: &Inner, cx: &StepContext<'_, ScoreClusters>, clusters: &[String]) -> Result<BTreeMap<String, Result<f64, String>>, StepError> {
    let Some(b) = &cx.spec.benchmark else { return Err(StepError::permanent(codes::BAD_SPEC, "no benchmark")) };
    let name = work_name(cx);
    let ns = &inner.cfg.benchmark_namespace;
    let task = cx.task_id.to_string();
    for c in clusters {
        let planned = manifest_work(c, &name, ns, &b.image, b.deadline_seconds, &task, &BTreeSet::new());
        let manifests = planned.pointer("/spec/workload/manifests").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
        // A namespace this task made (a step run again) goes with the work; any other is kept.
        let ours = |m: &ObjectMeta| m.annotations.as_ref().and_then(|a| a.get(TASK_ANNOTATION)) == Some(&task);
        let found = ferry_kube::orphans::found_namespaces(&inner.cfg.clusters, c, manifests, ours).await.map_err(client_err)?;
        let work = manifest_work(c, &name, ns, &b.image, b.deadline_seconds, &task, &found);
        inner.cfg.clusters.apply(HUB, &work, MANAGER).await.map_err(|e| kube_err(codes::HUB_API, e))?;
    }
    cx.progress(10, format!("benchmark ManifestWork {name} applied to {} cluster(s)", clusters.len()));
    let deadline = Duration::from_secs(b.deadline_seconds as u64);
    let hub = inner.cfg.clusters.hub().clone();
    let waits = clusters.iter().map(|c| {
        let (hub, name) = (hub.clone(), name.clone());
        async move {
            let r = inner.cfg.watches.wait_object::<ManifestWork, Result<f64, String>>(HUB, &hub, Some(c), &name, deadline, outcome).await;
            (c.clone(), r.unwrap_or_else(|e| Err(e.to_string())))
        }
    });
    let results: BTreeMap<String, Result<f64, String>> = join_all(waits).await.into_iter().collect();
    cx.progress(80, format!("{} of {} cluster(s) reported", results.values().filter(|r| r.is_ok()).count(), clusters.len()));
    clean_up(inner, cx, clusters).await?;
    cx.progress(100, "benchmark ManifestWorks removed");
    Ok(results)
}

/// Deletes the task's benchmark ManifestWorks and waits until they are gone (the work
/// agent removes what they applied first).
pub(crate) async fn clean_up(inner: &Inner, cx: &StepContext<'_, ScoreClusters>, clusters: &[String]) -> Result<(), StepError> {
    let name = work_name(cx);
    let hub = inner.cfg.clusters.hub().clone();
    for c in clusters {
        let work = json!({"apiVersion": "work.open-cluster-management.io/v1", "kind": "ManifestWork", "metadata": {"name": name, "namespace": c}});
        inner.cfg.clusters.delete(HUB, &work).await.map_err(|e| StepError::transient(codes::HUB_API, e.to_string()))?;
    }
    for c in clusters {
        inner
            .cfg
            .watches
            .wait_deleted::<ManifestWork>(HUB, &hub, Some(c), &name, Duration::from_secs(120))
            .await
            .map_err(|e| StepError::transient(codes::CLEANUP, e.to_string()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_jobs_end_and_its_result_are_fed_back_by_watch() {
        let w = manifest_work("member-1", "bench", "ferry-bench", "busybox", 60, "tsk_1", &BTreeSet::new());
        let configs = w["spec"]["manifestConfigs"].as_array().expect("manifest configs");
        for resource in ["jobs", "configmaps"] {
            let c = configs.iter().find(|c| c["resourceIdentifier"]["resource"] == resource).unwrap_or_else(|| panic!("no config of {resource}"));
            assert_eq!(c["feedbackScrapeType"], "Watch", "reported at once, not on the agent's status sync: {c}");
            assert!(c["feedbackRules"].as_array().is_some_and(|r| !r.is_empty()), "{c}");
        }
    }
}

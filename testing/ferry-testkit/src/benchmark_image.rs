//! The benchmark's part in the simulated fleet: when a benchmark Job succeeds on a
//! managed cluster, write a result into `ferry-benchmark-result` as the real image would
//! (by default the cluster's allocatable millicores, so bigger clusters score higher).
//! The result of a cluster can be fixed, or withheld (a benchmark that never reports).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use ferry_fleet::emulate::{self, Emulated, Knobs};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, ListParams, Patch, PatchParams};

use ferry_score::benchmark::{BENCHMARK_LABEL, RESULT_CONFIGMAP};

/// Results to report, by cluster: `Some(v)` reports v, `None` reports nothing.
pub type Overrides = Arc<Mutex<HashMap<String, Option<f64>>>>;

/// Starts the emulated benchmark of `cluster`; it stops when dropped.
pub fn start(cluster: &str, client: kube::Client, overrides: Overrides) -> Emulated {
    let cluster = cluster.to_owned();
    let jobs: Api<Job> = Api::all(client.clone());
    // A benchmark container writes its result once and exits: each Job reports once, so
    // whatever erases the result afterwards (a work agent re-applying the ConfigMap) is seen.
    let reported: Arc<Mutex<HashSet<String>>> = Arc::default();
    emulate::run(jobs, Knobs::default(), move |job: Arc<Job>| {
        let (client, cluster, overrides, reported) = (client.clone(), cluster.clone(), overrides.clone(), reported.clone());
        async move {
            let labelled = job.metadata.labels.as_ref().and_then(|l| l.get(BENCHMARK_LABEL)).is_some_and(|v| v == "true");
            let done = job.status.as_ref().and_then(|s| s.succeeded).unwrap_or(0) > 0;
            let uid = job.metadata.uid.clone().unwrap_or_default();
            if !labelled || !done || reported.lock().expect("reported lock").contains(&uid) {
                return Ok(());
            }
            let fixed = overrides.lock().expect("overrides lock").get(&cluster).cloned();
            let result = match fixed {
                Some(None) => return Ok(()),
                Some(Some(v)) => v,
                None => {
                    let nodes = Api::<Node>::all(client.clone()).list(&ListParams::default()).await?;
                    let alloc = nodes.items.iter().filter_map(|n| n.status.as_ref()?.allocatable.as_ref()?.get("cpu").cloned());
                    alloc.filter_map(|q| ferry_kube::quantity::millicores(&q.0).ok()).sum::<i64>() as f64
                }
            };
            let ns = job.metadata.namespace.clone().unwrap_or_default();
            let cm = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": RESULT_CONFIGMAP, "namespace": ns}, "data": {"result": result.to_string()}});
            Api::<ConfigMap>::namespaced(client, &ns).patch(RESULT_CONFIGMAP, &PatchParams::apply("ferry-benchmark-image"), &Patch::Apply(&cm)).await?;
            reported.lock().expect("reported lock").insert(uid);
            Ok(())
        }
    })
}

//! `place` (burst): what `scale` found unschedulable goes to the nearest candidates with
//! room (their virtual nodes Ready; free capacity from the virtual node's allocatable less
//! the requests of the pods on it; nearness from the command's latencies, else the
//! worker's matrix). It only reads and decides, so its undo has nothing to put back.

use std::sync::Arc;

use ferry_kube::step_errors::api_err;
use ferry_task::{CheckStep, Output, StepContext, StepError, StepPolicy, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use serde_json::Value;

use super::check::CHECK;
use super::scale::SCALE;
use crate::handler::Inner;
use crate::placement::{self, Candidate, Resources, Share};
use crate::spec::OffloadCommand;

/// The `place` step's output: the overflow's share of each chosen cluster (`[]` when every
/// replica fits at home).
pub const PLACE: Output<Vec<Share>> = Output::new("place");

/// Burst: the overflow to the nearest candidates with room.
pub struct PlaceStep {
    pub(crate) inner: Arc<Inner>,
    pub(crate) policy: StepPolicy,
}

impl CheckStep<OffloadCommand> for PlaceStep {
    fn name(&self) -> &str {
        PLACE.step()
    }

    fn policy(&self) -> StepPolicy {
        self.policy.clone()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, OffloadCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let c = cx.spec;
            let scaled = SCALE.get(cx).unwrap_or_default();
            if scaled.pending == 0 {
                cx.progress(100, "every replica fits at home");
                return PLACE.value(&Vec::new());
            }
            let ch = CHECK.required(cx)?;
            if ch.targets.is_empty() {
                return Err(StepError::permanent(
                    codes::NOT_PEERED,
                    format!("{} pods do not fit on {} and it has no peered cluster to burst to", scaled.pending, c.cluster),
                ));
            }
            self.inner.targets_ready(c, &ch.targets).await?;
            let client = self.inner.client(&c.cluster).await?;
            let pods = Api::<Pod>::all(client.clone());
            let nodes = Api::<Node>::all(client);
            let mut candidates = Vec::new();
            for t in &ch.targets {
                let Some(node) = nodes.get_opt(&t.node).await.map_err(api_err(&c.cluster))? else { continue };
                let alloc = node.status.and_then(|s| s.allocatable).unwrap_or_default();
                let q = |k: &str, f: fn(&str) -> Result<i64, ferry_kube::quantity::QuantityError>| alloc.get(k).and_then(|q| f(&q.0).ok()).unwrap_or(0);
                let mut free = Resources { cpu_m: q("cpu", ferry_kube::quantity::millicores), memory: q("memory", ferry_kube::quantity::units) };
                let lp = ListParams::default().fields(&format!("spec.nodeName={},status.phase!=Succeeded,status.phase!=Failed", t.node));
                for p in pods.list(&lp).await.map_err(api_err(&c.cluster))?.items {
                    let r = p.spec.as_ref().map(placement::pod_requests).unwrap_or_default();
                    free.cpu_m -= r.cpu_m;
                    free.memory -= r.memory;
                }
                let name = t.cluster.clone().unwrap_or_else(|| t.id.clone());
                let latency = c.latency_ms.get(&name).map(|v| *v as u32).or_else(|| self.inner.cfg.latency.get(&c.cluster, &name));
                candidates.push(Candidate { cluster: name, id: t.id.clone(), node: t.node.clone(), latency_ms: latency, free });
            }
            let shares =
                placement::place(scaled.pending, ch.per_pod.unwrap_or_default(), candidates).map_err(|e| StepError::permanent(codes::NO_ROOM, e.to_string()))?;
            let summary: Vec<String> = shares
                .iter()
                .map(|s| format!("{} pods to {} ({})", s.pods, s.cluster, s.latency_ms.map_or("latency unknown".into(), |l| format!("{l} ms"))))
                .collect();
            cx.progress(100, summary.join(", "));
            PLACE.value(&shares)
        }
        .boxed()
    }
}

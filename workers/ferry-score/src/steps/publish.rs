//! `publish`: the ranking where placement reads it: an AddOnPlacementScore `ferry-<policy>`
//! (with `validUntil`) in each OCM cluster's namespace on the hub, and a `ClusterScore`
//! record per cluster on the compacted scores topic. Its undo deletes the placement scores
//! this task wrote (not newer ones of other tasks); topic records stay as measurements.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use ferry_kube::HUB;
use ferry_kube::step_errors::{hub_err, kube_err};
use ferry_task::{Output, Step, StepContext, StepError, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use kube::api::{Patch, PatchParams};
use kube::core::GroupVersionKind;
use rdkafka::producer::FutureRecord;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::resolve::RESOLVE;
use super::score::{Ranked, SCORE};
use crate::handler::{Inner, MANAGER, TASK_ANNOTATION};
use crate::spec::{ClusterScore, ScoreClusters, ScorePolicy};

/// The `publish` step's output.
pub const PUBLISH: Output<Published> = Output::new("publish");

/// Output of the publish step.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Published {
    /// The AddOnPlacementScores written, as `<cluster>/<name>`.
    pub placement_scores: Vec<String>,
    /// Their `validUntil` (RFC 3339).
    pub valid_until: String,
}

/// Name of the AddOnPlacementScore a policy writes (`ferry-<policy>`); its items are the
/// policy's items plus `score`.
pub fn placement_score_name(p: ScorePolicy) -> String {
    format!("ferry-{}", p.name())
}

fn aps_gvk() -> GroupVersionKind {
    GroupVersionKind::gvk("cluster.open-cluster-management.io", "v1alpha1", "AddOnPlacementScore")
}

/// The `publish` step.
pub struct Publish {
    inner: Arc<Inner>,
}

impl Publish {
    pub(crate) fn new(inner: Arc<Inner>) -> Self {
        Self { inner }
    }

    async fn placement_score(&self, cx: &StepContext<'_, ScoreClusters>, r: &Ranked, valid_until: &str) -> Result<String, StepError> {
        let name = placement_score_name(cx.spec.policy);
        let api = self.inner.cfg.clusters.api(HUB, &aps_gvk(), Some(&r.cluster)).await.map_err(|e| kube_err(codes::HUB_API, e))?;
        let meta = json!({
            "name": name,
            "namespace": r.cluster,
            "labels": {"app.kubernetes.io/managed-by": "ferry"},
            "annotations": {TASK_ANNOTATION: cx.task_id.to_string()},
        });
        let obj = json!({"apiVersion": "cluster.open-cluster-management.io/v1alpha1", "kind": "AddOnPlacementScore", "metadata": meta});
        let pp = PatchParams::apply(MANAGER).force();
        api.patch(&name, &pp, &Patch::Apply(&obj)).await.map_err(hub_err)?;
        let mut items: BTreeMap<String, i32> = r.items.clone();
        items.insert("score".into(), r.score);
        let scores: Vec<Value> = items.iter().map(|(k, v)| json!({"name": k, "value": v})).collect();
        let status = json!({
            "apiVersion": "cluster.open-cluster-management.io/v1alpha1",
            "kind": "AddOnPlacementScore",
            "metadata": {"name": name, "namespace": r.cluster},
            "status": {"scores": scores, "validUntil": valid_until},
        });
        api.patch_status(&name, &pp, &Patch::Apply(&status)).await.map_err(hub_err)?;
        Ok(format!("{}/{name}", r.cluster))
    }
}

impl Step<ScoreClusters> for Publish {
    fn name(&self) -> &str {
        PUBLISH.step()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, ScoreClusters>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let r = RESOLVE.required(cx)?;
            let ranking = SCORE.required(cx)?.ranking;
            let now = jiff::Timestamp::now();
            let valid_for = jiff::SignedDuration::from_secs(i64::from(cx.spec.valid_for_seconds.unwrap_or(600)));
            let valid_until = now.checked_add(valid_for).unwrap_or(now).round(jiff::Unit::Second).unwrap_or(now).to_string();
            let mut written = Vec::new();
            for x in &ranking {
                if r.ocm.contains(&x.cluster) {
                    written.push(self.placement_score(cx, x, &valid_until).await?);
                }
                let rec = ClusterScore {
                    cluster: x.cluster.clone(),
                    policy: cx.spec.policy.name().into(),
                    score: x.score,
                    items: x.items.iter().map(|(k, v)| (k.clone(), *v)).collect::<HashMap<_, _>>(),
                    reason: x.reason.clone(),
                    rank: x.rank,
                    task_id: cx.task_id.to_string(),
                    measured_at: now.to_string(),
                    valid_until: valid_until.clone(),
                };
                let payload = self.inner.registry.encode(&rec).map_err(|e| StepError::permanent(codes::ENCODE, e.to_string()))?;
                let topic = self.inner.cfg.topics.scores().name.clone();
                self.inner
                    .producer
                    .send(FutureRecord::to(&topic).key(&x.cluster).payload(&payload), Duration::from_secs(30))
                    .await
                    .map_err(|(e, _)| StepError::transient(codes::KAFKA, format!("writing the score of {} to {topic}: {e}", x.cluster)))?;
            }
            cx.progress(100, format!("{} placement score(s), {} record(s) on the scores topic", written.len(), ranking.len()));
            PUBLISH.value(&Published { placement_scores: written, valid_until })
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, ScoreClusters>, _output: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            // Remove the placement scores this task wrote (not newer ones of other tasks).
            // Records on the scores topic are measurements in time: they stay.
            let Some(r) = RESOLVE.get(cx) else { return Ok(()) };
            let name = placement_score_name(cx.spec.policy);
            for c in &r.ocm {
                let api = self.inner.cfg.clusters.api(HUB, &aps_gvk(), Some(c)).await.map_err(|e| kube_err(codes::HUB_API, e))?;
                let Some(o) = api.get_opt(&name).await.map_err(hub_err)? else { continue };
                let ours = o.metadata.annotations.as_ref().and_then(|a| a.get(TASK_ANNOTATION)).map(String::as_str) == Some(&cx.task_id.to_string());
                if ours {
                    match api.delete(&name, &Default::default()).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(s)) if s.code == 404 => {}
                        Err(e) => return Err(hub_err(e)),
                    }
                }
            }
            Ok(())
        }
        .boxed()
    }
}

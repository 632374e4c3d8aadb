//! A score command's dry run (`ferry submit score --dry-run --kubeconfig HUB`): its plan
//! and `resolve-clusters` run as a task runs it (the clusters listed or the set's members,
//! which of them OCM knows), then the AddOnPlacementScore `publish` would write in each
//! OCM cluster's namespace on the hub, sent there as a server-side dry run (OCM's CRD,
//! `../shared/crds`, judges it; open-cluster-management-io/api
//! `cluster/v1alpha1/types_addonplacementscore.go`). The scores in its status are measured
//! at run time: named, not previewed.

use ferry_kube::dry_run::{self, Preview};
use ferry_kube::{ClusterError, HUB};
use ferry_task::dry_run::Verdict;
use serde_json::json;

use crate::handler::{MANAGER, ScoreConfig, ScoreHandler};
use crate::spec::{ScoreClusters, ScorePolicy};
use crate::steps::publish::placement_score_name;
use crate::steps::resolve::RESOLVE;

/// Why there is no preview.
#[derive(Debug, thiserror::Error)]
pub enum PreviewError {
    /// The scores topic's producer could not be configured.
    #[error("configuring the scores topic's producer: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// The hub could not be asked about an object.
    #[error(transparent)]
    Hub(#[from] ClusterError),
}

/// The dry run of `s` against the hub of `cfg` (nothing is produced: the producer is only
/// configured).
pub async fn preview(cfg: &ScoreConfig, subject: &str, s: &ScoreClusters) -> Result<Preview, PreviewError> {
    let handler = ScoreHandler::new(cfg.clone())?;
    let mut p = Preview::new(ferry_task::dry_run::checks(&handler, subject, s, ferry_task::dry_run::BOUND).await);
    if p.checked.verdict != Verdict::Passes {
        return Ok(p);
    }
    let Some(resolved) = RESOLVE.from_outputs(&p.checked.outputs) else { return Ok(p) };
    let name = placement_score_name(s.policy);
    for cluster in &resolved.ocm {
        let obj = json!({"apiVersion": "cluster.open-cluster-management.io/v1alpha1", "kind": "AddOnPlacementScore",
                         "metadata": {"name": name, "namespace": cluster, "labels": {"app.kubernetes.io/managed-by": "ferry"}}});
        p.objects.push(dry_run::apply(&cfg.clusters, HUB, &obj, MANAGER).await?);
    }
    let measured = if s.policy == ScorePolicy::Benchmark { "a benchmark Job on each cluster (through a ManifestWork)" } else { "the clusters' loads" };
    p.notes.push(format!("{} clusters scored by {measured}, at run time; the ranking goes into each score's status and onto the scores topic", resolved.clusters.len()));
    Ok(p)
}

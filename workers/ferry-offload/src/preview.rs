//! An offload command's dry run (`ferry submit offload --dry-run --kubeconfig HUB`): its
//! plan, its `check` run as a task runs it (the namespace there, every target peered with
//! a Ready virtual node), then the NamespaceOffloading the `offload` step would apply on
//! the consumer cluster, rendered by [`liqo::namespace_offloading`] and sent there as a
//! server-side dry run (Liqo's CRD schema and its webhook, liqotech/liqo
//! `pkg/webhooks/namespaceoffloading/nsoff.go`, judge it). Where the one there differs in
//! a field that webhook makes immutable, the run deletes it and creates the new one: shown
//! so. Unoffload: what would go. A burst's overflow is placed at run time: named.

use ferry_kube::ClusterError;
use ferry_kube::dry_run::{self, ObjectPreview, Preview};
use ferry_task::dry_run::Verdict;
use serde_json::json;

use crate::handler::{OffloadConfig, OffloadHandler};
use crate::liqo;
use crate::spec::{OffloadCommand, OffloadOperation};
use crate::steps::MANAGER;
use crate::steps::check::CHECK;

/// The dry run of `c` against its consumer cluster; `Err` only when that cluster could not
/// be asked about the offloading.
pub async fn preview(cfg: &OffloadConfig, subject: &str, c: &OffloadCommand) -> Result<Preview, ClusterError> {
    let handler = OffloadHandler::new(cfg.clone());
    let mut p = Preview::new(ferry_task::dry_run::checks(&handler, subject, c, ferry_task::dry_run::BOUND).await);
    if p.checked.verdict != Verdict::Passes {
        return Ok(p);
    }
    let checked = CHECK.from_outputs(&p.checked.outputs).unwrap_or_default();
    let current = liqo::namespace_offloading(&c.namespace, &json!({}), None);
    match c.operation {
        OffloadOperation::Offload => {
            let ids: Vec<String> = checked.targets.iter().map(|t| t.id.clone()).collect();
            let selector = if c.clusters.is_empty() { None } else { Some(ids.as_slice()) };
            let desired = liqo::spec(c, c.pod_offloading_strategy, selector);
            let obj = liqo::namespace_offloading(&c.namespace, &desired, Some("dry-run"));
            match checked.previous.as_ref().and_then(|prev| liqo::immutable_change(prev, &desired)) {
                Some(change) => {
                    p.objects.push(ObjectPreview::deleted(&c.cluster, &current, format!("{change} cannot be changed on a NamespaceOffloading: deleted, and its twin namespaces with it")));
                    p.objects.push(ObjectPreview::not_sent(&c.cluster, &obj, "created once the current one is gone"));
                }
                None => p.objects.push(dry_run::apply(&cfg.clusters, &c.cluster, &obj, MANAGER).await?),
            }
            let to: Vec<String> = checked.targets.iter().map(|t| t.cluster.clone().unwrap_or_else(|| t.id.clone())).collect();
            p.notes.push(format!("Liqo then makes the twin namespaces of {} on {to:?}", c.namespace));
        }
        OffloadOperation::Unoffload => match checked.previous {
            Some(_) => p.objects.push(ObjectPreview::deleted(&c.cluster, &current, "Liqo removes its twin namespaces with it")),
            None => p.notes.push(format!("{} is not offloaded: nothing to remove", c.namespace)),
        },
        OffloadOperation::Burst => {
            p.notes.push(format!(
                "Deployment {}/{} scaled to {} replicas; what does not fit at home is placed on the nearest of {} candidates with room, at run time",
                c.namespace,
                c.deployment.as_deref().unwrap_or("?"),
                c.replicas.unwrap_or_default(),
                checked.targets.len()
            ));
        }
    }
    Ok(p)
}

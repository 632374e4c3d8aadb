//! A peer command's dry run (`ferry submit peer --dry-run --kubeconfig HUB`): its plan and
//! its `check` run as a task runs it (Liqo on both clusters and their ids, or OCM, the
//! submariner-addon and the clusters' sets). A Submariner peering's hub objects
//! ([`crate::submariner`]: the ManagedClusterSet when new, each cluster's SubmarinerConfig
//! and submariner ManagedClusterAddOn, the Broker) are sent to the hub as a server-side
//! dry run, judged by the upstream CRDs (`../shared/crds`: submariner-addon's
//! `submarinerconfigs`, OCM's `managedclusteraddons`); the Broker's namespace is made by
//! the add-on's broker controller once the set exists (stolostron/submariner-addon
//! `pkg/hub/submarinerbrokerinfo/brokerinfo.go`), so a new set's Broker is named, not
//! sent. A Liqo peering's objects carry what the clusters exchange as it runs (keys,
//! nonces, CIDRs): named, not previewed. Unpeer: what would go.

use std::time::Duration;

use ferry_kube::dry_run::{self, ObjectPreview, Preview};
use ferry_kube::{ClusterError, HUB};
use ferry_task::dry_run::Verdict;

use crate::handler::{MANAGER, PeerConfig, PeerHandler};
use crate::spec::{PeerClusters, PeerMethod, PeerOperation};
use crate::steps::submariner_check::SETS;
use crate::{liqo, submariner};

/// How long each check has to answer.
const BOUND: Duration = Duration::from_secs(60);

/// The dry run of `p`; `Err` only when the hub could not be asked about an object.
pub async fn preview(cfg: &PeerConfig, subject: &str, p: &PeerClusters) -> Result<Preview, ClusterError> {
    let handler = PeerHandler::new(cfg.clone());
    let mut out = Preview::new(ferry_task::dry_run::checks(&handler, subject, p, BOUND).await);
    if out.checked.verdict != Verdict::Passes {
        return Ok(out);
    }
    let pair = liqo::pair_label(&p.a, &p.b);
    match (p.method, p.operation) {
        (PeerMethod::Submariner, op) => {
            let sets = SETS.from_outputs(&out.checked.outputs).unwrap_or_default();
            let mut objects = vec![submariner::config(&p.a, &pair), submariner::config(&p.b, &pair), submariner::addon(&p.a, &pair), submariner::addon(&p.b, &pair)];
            if op == PeerOperation::Unpeer {
                objects.push(submariner::broker(&sets.target, &pair));
                for o in objects.iter().rev() {
                    if cfg.clusters.get(HUB, o).await.ok().flatten().is_some() {
                        out.objects.push(ObjectPreview::deleted(HUB, o, "only if this pair's peering made it"));
                    }
                }
                out.notes.push(format!("{} and {} leave ManagedClusterSet {} (their set labels put back as the peering found them)", p.a, p.b, sets.target));
                return Ok(out);
            }
            if !sets.existed {
                out.objects.push(dry_run::apply(&cfg.clusters, HUB, &submariner::cluster_set(&sets.target, &pair), MANAGER).await?);
            }
            out.notes.push(format!("ManagedClusters {} and {} labelled into ManagedClusterSet {}", p.a, p.b, sets.target));
            let broker = submariner::broker(&sets.target, &pair);
            if sets.existed {
                out.objects.push(dry_run::apply(&cfg.clusters, HUB, &broker, MANAGER).await?);
            } else {
                out.objects.push(ObjectPreview::not_sent(HUB, &broker, format!("the submariner-addon makes namespace {} once the set exists", submariner::broker_namespace(&sets.target))));
            }
            for o in &objects {
                out.objects.push(dry_run::apply(&cfg.clusters, HUB, o, MANAGER).await?);
            }
        }
        (PeerMethod::Liqo, PeerOperation::Peer) => {
            let dirs = if p.bidirectional { "both ways" } else { "one way" };
            out.notes.push(format!(
                "Liqo peering of {} and {} ({dirs}): network, authentication and resource objects on both clusters, written with what they exchange as it runs (not previewed)",
                p.a, p.b
            ));
        }
        (PeerMethod::Liqo, PeerOperation::Unpeer) => {
            out.notes.push(format!("every object of the Liqo peering of {} and {} goes, both ways, in reverse order", p.a, p.b));
        }
    }
    Ok(out)
}

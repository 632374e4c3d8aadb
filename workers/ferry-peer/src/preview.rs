//! A peer command's dry run (`ferry submit peer --dry-run --kubeconfig HUB`): its plan and
//! its `check` run as a task runs it (Liqo on both clusters and their ids, or OCM, the
//! submariner-addon and the clusters' sets). A Submariner peering's hub objects
//! ([`crate::submariner`]: the ManagedClusterSet when new, each cluster's SubmarinerConfig
//! and submariner ManagedClusterAddOn, the Broker) are sent to the hub as a server-side
//! dry run, judged by the upstream CRDs (`../shared/crds`: submariner-addon's
//! `submarinerconfigs`, OCM's `managedclusteraddons`); the Broker's namespace is made by
//! the add-on's broker controller once the set exists (stolostron/submariner-addon
//! `pkg/hub/submarinerbrokerinfo/brokerinfo.go`), so a new set's Broker is named, not
//! sent. A Liqo peering's tenant namespaces and ResourceSlices (the `prepare` and
//! `resources` steps' own object sets, [`crate::steps::objects::ObjectSet`]) are judged by
//! the clusters that would hold them (a ResourceSlice's tenant namespace is made by
//! `prepare` first: named); its network and authentication objects carry what the clusters
//! exchange as it runs (keys, nonces, endpoints): named, not previewed. A tenant namespace
//! that exists and is not Ferry's is shown unchanged, saying so (the run reuses it and never
//! deletes it); Liqo objects of a peering made outside Ferry fail the check, naming them.
//! Unpeer: what would go. Force unpeer: what would go on `a` ([`crate::steps::force_unpeer`]).

use ferry_kube::dry_run::{self, Change, ObjectPreview, Preview};
use ferry_kube::{ClusterError, HUB};
use ferry_task::dry_run::Verdict;
use serde_json::Value;

use crate::handler::{MANAGER, PeerConfig, PeerHandler};
use crate::spec::{PeerClusters, PeerMethod, PeerOperation};
use crate::steps::force_unpeer::{self, FORCE_CHECK};
use crate::steps::liqo_check::{IDS, Ids};
use crate::steps::objects::ObjectSet;
use crate::steps::prepare::Prepare;
use crate::steps::resources::Resources;
use crate::steps::submariner_addon::{Addon, Config};
use crate::steps::submariner_check::SETS;
use crate::{liqo, submariner};

/// Each of `objects` that is there now, as the run would delete it.
async fn deleted(cfg: &PeerConfig, objects: &[(String, Value)], note: &str, out: &mut Vec<ObjectPreview>) {
    for (cluster, o) in objects.iter().rev() {
        if cfg.clusters.get(cluster, o).await.ok().flatten().is_some() {
            out.push(ObjectPreview::deleted(cluster, o, note));
        }
    }
}

/// The dry run of `p`; `Err` only when the hub could not be asked about an object.
pub async fn preview(cfg: &PeerConfig, subject: &str, p: &PeerClusters) -> Result<Preview, ClusterError> {
    let handler = PeerHandler::new(cfg.clone());
    let mut out = Preview::new(ferry_task::dry_run::checks(&handler, subject, p, ferry_task::dry_run::BOUND).await);
    if out.checked.verdict != Verdict::Passes {
        return Ok(out);
    }
    let pair = liqo::pair_label(&p.a, &p.b);
    match (p.method, p.operation) {
        (PeerMethod::Submariner, op) => {
            let sets = SETS.from_outputs(&out.checked.outputs).unwrap_or_default();
            let ids = Ids::default();
            let mut objects: Vec<(String, Value)> = Config.objects(p, &ids);
            objects.extend(Addon.objects(p, &ids));
            if op == PeerOperation::Unpeer {
                objects.push((HUB.to_owned(), submariner::broker(&sets.target, &pair)));
                deleted(cfg, &objects, "only if this pair's peering made it", &mut out.objects).await;
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
            for (cluster, o) in &objects {
                out.objects.push(dry_run::apply(&cfg.clusters, cluster, o, MANAGER).await?);
            }
        }
        (PeerMethod::Liqo, PeerOperation::ForceUnpeer) => {
            let found = FORCE_CHECK.from_outputs(&out.checked.outputs).unwrap_or_default();
            let Some(remote) = found.remote else {
                out.notes.push(format!("{} holds nothing of a Ferry peering with {}: nothing would change", p.a, p.b));
                return Ok(out);
            };
            let kube = |source| ClusterError::Kube { cluster: p.a.clone(), source };
            let client = cfg.clusters.client(&p.a).await?;
            let (namespaces, objects) = force_unpeer::labelled(&client, &pair).await.map_err(kube)?;
            for ns in namespaces.iter().filter(|n| n.metadata.name == found.namespace) {
                out.objects.push(ObjectPreview::deleted(&p.a, &serde_json::to_value(ns).unwrap_or_default(), "Ferry's tenant namespace, with everything in it"));
            }
            for (kind, o) in objects.iter().filter(|(_, o)| o.metadata.namespace != found.namespace) {
                let mut v = serde_json::to_value(o).unwrap_or_default();
                v["kind"] = Value::from(kind.kind.clone());
                out.objects.push(ObjectPreview::deleted(&p.a, &v, "the pair's, in a tenant namespace Ferry reused (the namespace stays)"));
            }
            out.notes.push(format!(
                "ForeignCluster {remote} on {} annotated {} first (Liqo there stops waiting for {}), deleted last; {} is never contacted and keeps what it holds",
                p.a,
                force_unpeer::PERMANENTLY_UNREACHABLE,
                p.b,
                p.b
            ));
        }
        (PeerMethod::Liqo, op) => {
            let ids = IDS.from_outputs(&out.checked.outputs).unwrap_or_default();
            let mut slices = Resources { reverse: false }.objects(p, &ids);
            // Unpeer removes both directions, whatever the peer asked.
            if p.bidirectional || op == PeerOperation::Unpeer {
                slices.extend(Resources { reverse: true }.objects(p, &ids));
            }
            let tenants = Prepare.objects(p, &ids);
            // Tenant namespaces there before and not Ferry's (judged by `check`): left alone.
            let kept: Vec<ObjectPreview> = ids.sides(p)
                .into_iter()
                .filter(|(cluster, _)| ids.namespace_kept(p, cluster))
                .map(|(cluster, to)| ObjectPreview {
                    cluster: cluster.clone(),
                    object: dry_run::describe(&liqo::namespace(&to, &pair)),
                    change: Change::Unchanged,
                    refused: None,
                    note: Some(format!("exists and is not Ferry's (not labelled {}={pair}): {}, never labelled or deleted", liqo::PEERING_LABEL, if op == PeerOperation::Unpeer { "left" } else { "reused" })),
                    operations: Vec::new(),
                })
                .collect();
            if op == PeerOperation::Unpeer {
                let mut all = tenants.clone();
                all.extend(slices);
                deleted(cfg, &all, "with everything of the peering in it, in reverse order", &mut out.objects).await;
                out.objects.extend(kept);
                out.notes.push(format!("each side's ForeignCluster of the other is kept, as `liqoctl unpeer` keeps it ({} and {})", p.a, p.b));
                return Ok(out);
            }
            out.objects.extend(kept);
            if ids.reused {
                out.notes.push(format!(
                    "{} and {} are already peered by an earlier Ferry task: the peer reuses that peering, applies nothing and its revert removes nothing",
                    p.a, p.b
                ));
                return Ok(out);
            }
            let mut made = Vec::new();
            for (cluster, ns) in &tenants {
                let judged = dry_run::apply(&cfg.clusters, cluster, ns, MANAGER).await?;
                if judged.change == Change::Create {
                    made.push((cluster.clone(), ns["metadata"]["name"].as_str().unwrap_or_default().to_owned()));
                }
                out.objects.push(judged);
            }
            let dirs = if p.bidirectional { "both ways" } else { "one way" };
            out.notes.push(format!(
                "network ({} ↔ {}): Configurations and the WireGuard gateway pair, with the CIDRs and endpoint the clusters give as it runs; authentication ({dirs}): nonce, Tenant and Identity signed with keys exchanged as it runs (not previewed)",
                p.a, p.b
            ));
            for (cluster, slice) in &slices {
                let ns = slice["metadata"]["namespace"].as_str().unwrap_or_default();
                if made.iter().any(|(c, n)| c == cluster && n == ns) {
                    out.objects.push(ObjectPreview::not_sent(cluster, slice, format!("tenant namespace {ns} does not exist yet: `prepare` makes it first")));
                } else {
                    out.objects.push(dry_run::apply(&cfg.clusters, cluster, slice, MANAGER).await?);
                }
            }
        }
    }
    Ok(out)
}

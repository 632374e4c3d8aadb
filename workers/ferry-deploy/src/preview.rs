//! A deploy's dry run (`ferry submit deploy --dry-run --kubeconfig HUB`): its plan and its
//! `check` run as a task runs it (the app's state before, Secrets there and exportable,
//! clusters registered, the namespace bound, room for the replicas), then what `apply`
//! would write and remove, with the worker's own renderers, judged by the cluster that
//! would hold each object as a server-side dry run (`dryRun=All`: the upstream CRD's schema
//! and the cluster's webhooks judge it, nothing is stored), applied as the run applies
//! (not forced: another field manager's fields are a conflict here too):
//! - ManifestWork delivery: each named cluster's ManifestWork ([`render::manifest_work`],
//!   namespaces to orphan read as the run reads them) on the hub;
//! - direct delivery: each object ([`render::objects`]) on its cluster; an object of that
//!   name Ferry did not make for the app is refused as the run refuses it
//!   ([`crate::ownership`]); objects in a namespace still to be made are named, not sent;
//! - removals: the ManifestWorks (or objects) of the clusters the app leaves, everything
//!   of the app for a delete.
//!
//! Secret values never appear: a Secret is rendered with its keys and a redacted value, and
//! both sides of a comparison are redacted (a changed value is not shown). Components OCM
//! places (a placement, not a cluster) are rendered for the clusters their Placement's
//! decisions name now when an update keeps that Placement as it is (`place` takes those);
//! a new or changed Placement's are chosen at run time: named, not rendered.

use std::collections::{BTreeMap, BTreeSet};
use ferry_kube::dry_run::{self, ObjectPreview, Preview};
use ferry_kube::{ClusterError, HUB};
use ferry_task::dry_run::Verdict;
use kube::api::PatchParams;
use serde_json::Value;

use crate::exportable::Unshippable;
use crate::handler::{DeployConfig, DeployHandler};
use crate::ownership::{self, NotFerrys};
use crate::render::{self, AppState, MANAGER, Removal, SecretData};
use crate::spec::{Component, Delivery, DeployApp, DeployOperation};
use crate::steps::check::CHECK;
use crate::steps::place::{PLACEMENT_LABEL, decided, same_placement};
use ferry_kube::kinds::PlacementDecision;

/// What a Secret's value shows as in a preview (base64 of `(redacted)`, so that the
/// rendered Secret stays valid for the server's dry run).
const REDACTED: &str = "KHJlZGFjdGVkKQ==";

/// The task id the dry run renders into the ManifestWorks' annotation.
const DRY_RUN_TASK: &str = "dry-run";

/// The dry run of `app`, sent with `subject`, against the clusters of `cfg` (the worker's
/// validation first: a subject other than `<namespace>/<name>` is Rejected, as the worker
/// rejects it); `Err` only when a cluster could not be asked about an object.
pub async fn preview(cfg: &DeployConfig, subject: &str, app: &DeployApp) -> Result<Preview, ClusterError> {
    let handler = DeployHandler::new(cfg.clone());
    let mut p = Preview::new(ferry_task::dry_run::checks(&handler, subject, app, ferry_task::dry_run::BOUND).await);
    if p.checked.verdict != Verdict::Passes {
        return Ok(p);
    }
    let previous = CHECK.from_outputs(&p.checked.outputs).and_then(|c| c.previous);
    let mut placed = BTreeSet::new();
    let to = if app.operation == DeployOperation::Delete {
        None
    } else {
        let mut targets = render::Targets::new();
        for c in &app.components {
            match &c.cluster {
                Some(cluster) => targets.entry(c.name.clone()).or_default().push(cluster.clone()),
                // An update that keeps a component's Placement as it is: `place` takes the
                // clusters its decisions name now, so they are rendered and compared.
                None => match decided_now(cfg, previous.as_ref(), app, c).await? {
                    Some(clusters) => {
                        p.notes.push(format!("component {}: on {}, as Placement {}/{} decides now (its spec is unchanged)", c.name, ferry_task::report::listed(&clusters), app.namespace(), render::placement_name(app, &c.name)));
                        targets.insert(c.name.clone(), clusters);
                    }
                    None => {
                        placed.insert(c.name.clone());
                    }
                },
            }
        }
        Some(AppState { spec: app.clone(), targets })
    };
    if let Some(to) = &to {
        for (cluster, comps) in to.by_cluster() {
            let secrets = match redacted_secrets(cfg, app, &comps).await? {
                Ok(s) => s,
                Err(why) => {
                    p.objects.push(ObjectPreview::refused(&cluster, &render::work_ref(app, &cluster), why));
                    continue;
                }
            };
            let objects = render::objects(app, &comps, &secrets);
            match app.delivery {
                Delivery::ManifestWork => p.objects.push(manifest_work(cfg, app, &cluster, &comps, &secrets, &objects).await?),
                Delivery::Direct => direct(cfg, app, &cluster, &objects, &mut p.objects).await?,
            }
        }
    }
    if let Some(from) = &previous {
        removals(from, to.as_ref(), &placed, &mut p.objects);
    }
    for c in &placed {
        p.notes.push(format!("component {c}: its clusters are chosen by OCM at run time (a new or changed Placement's decisions), so its ManifestWorks are not rendered here"));
    }
    Ok(p)
}

/// The clusters placed component `c` is on after the run, where that is known now: its
/// Placement is the one the app has (an update that leaves its spec as it is) and OCM has
/// decided as many clusters as it asks for; `place` takes those decisions as they are
/// (`steps::place`). `None`: a new or changed Placement, decided at run time.
async fn decided_now(cfg: &DeployConfig, previous: Option<&AppState>, app: &DeployApp, c: &Component) -> Result<Option<Vec<String>>, ClusterError> {
    if !same_placement(previous.map(|p| &p.spec), app, c) {
        return Ok(None);
    }
    let name = render::placement_name(app, &c.name);
    let lp = kube::api::ListParams::default().labels(&format!("{PLACEMENT_LABEL}={name}"));
    let decisions = kube::Api::<PlacementDecision>::namespaced(cfg.clusters.hub().clone(), app.namespace())
        .list(&lp)
        .await
        .map_err(|source| ClusterError::Kube { cluster: HUB.to_owned(), source })?;
    let clusters = decided(decisions.items.iter(), &name);
    let want = c.wanted_clusters();
    Ok((clusters.len() >= want).then_some(clusters))
}

/// The hub's judgement of `cluster`'s ManifestWork.
async fn manifest_work(cfg: &DeployConfig, app: &DeployApp, cluster: &str, comps: &[&Component], secrets: &BTreeMap<String, SecretData>, objects: &[Value]) -> Result<ObjectPreview, ClusterError> {
    let inner = crate::handler::Inner { cfg: cfg.clone() };
    let found = inner.found_namespaces(cluster, objects, &app.name).await?;
    let work = render::manifest_work(app, cluster, comps, secrets, DRY_RUN_TASK, &found);
    // A run stamps each Deployment with its task (`render::feedback_is_current`), which is
    // no change of the app: rendered as the work there has it. A failed read is the judging
    // below's to report.
    let there = cfg.clusters.get(HUB, &work).await.ok().flatten();
    let task = there.and_then(|w| w.metadata.annotations?.remove(render::TASK_ANNOTATION));
    let work = match task {
        Some(task) => render::manifest_work(app, cluster, comps, secrets, &task, &found),
        None => work,
    };
    let mut judged = dry_run::apply_guarded(&cfg.clusters, HUB, &work, PatchParams::apply(MANAGER), |live| foreign(HUB, app, live)).await?;
    let manifests: Vec<String> = objects.iter().map(|o| format!("{} {}", o["kind"].as_str().unwrap_or("?"), o["metadata"]["name"].as_str().unwrap_or("?"))).collect();
    judged.note = Some(format!("for {cluster}: {}", manifests.join(", ")));
    Ok(judged)
}

/// Each object of a direct delivery, judged by `cluster`.
async fn direct(cfg: &DeployConfig, app: &DeployApp, cluster: &str, objects: &[Value], out: &mut Vec<ObjectPreview>) -> Result<(), ClusterError> {
    let mut missing = BTreeSet::new();
    for o in objects {
        let ns = o.pointer("/metadata/namespace").and_then(Value::as_str);
        if let Some(ns) = ns.filter(|ns| missing.contains(*ns)) {
            out.push(ObjectPreview::not_sent(cluster, o, format!("namespace {ns} does not exist yet: the run creates it first")));
            continue;
        }
        if o["kind"] == "Namespace" {
            // The run creates a missing namespace and leaves one that is there as it is.
            let name = o["metadata"]["name"].as_str().unwrap_or_default();
            let there = cfg.clusters.get(cluster, o).await?.is_some();
            if !there {
                missing.insert(name.to_owned());
                out.push(dry_run::apply(&cfg.clusters, cluster, o, MANAGER).await?);
            }
            continue;
        }
        out.push(dry_run::apply_guarded(&cfg.clusters, cluster, o, PatchParams::apply(MANAGER), |live| foreign(cluster, app, live)).await?);
    }
    Ok(())
}

/// Why the run would leave `live` alone: it is not Ferry's for the app.
fn foreign(cluster: &str, app: &DeployApp, live: &kube::api::DynamicObject) -> Option<String> {
    (!ownership::is_ferrys(&live.metadata, &app.name)).then(|| {
        let what = format!("{} {}", live.types.as_ref().map_or("?", |t| t.kind.as_str()), live.metadata.name.as_deref().unwrap_or("?"));
        NotFerrys::Foreign { cluster: cluster.to_owned(), what, app: app.name.clone(), by: ownership::managed_by(&live.metadata) }.to_string()
    })
}

/// What the run removes: what `from` has on the clusters `to` leaves (every cluster for a
/// delete); placed components' clusters are decided at run time, so they are not counted
/// as left.
fn removals(from: &AppState, to: Option<&AppState>, placed: &BTreeSet<String>, out: &mut Vec<ObjectPreview>) {
    let keep = from.targets.iter().filter(|(c, _)| placed.contains(*c)).flat_map(|(_, cl)| cl.iter().cloned()).collect();
    for r in render::removed(from, to, &keep) {
        let (at, note) = match r.at {
            Removal::Hub => (HUB, format!("the app leaves {}: its work agent removes the manifests there", r.cluster)),
            Removal::Cluster if r.object["kind"] == "Namespace" => (r.cluster.as_str(), "only if a deploy of this app created it".to_owned()),
            Removal::Cluster => (r.cluster.as_str(), "if Ferry made it for this app".to_owned()),
        };
        out.push(ObjectPreview::deleted(at, &r.object, note));
    }
}

/// The Secrets `comps` reference, read as the run reads them (there, exportable), their
/// values redacted; `Err` with the reason a run would be refused.
async fn redacted_secrets(cfg: &DeployConfig, app: &DeployApp, comps: &[&Component]) -> Result<Result<BTreeMap<String, SecretData>, String>, ClusterError> {
    let names = comps.iter().flat_map(|c| c.secrets()).collect::<BTreeSet<_>>();
    let read = crate::exportable::read(cfg.clusters.hub(), app.namespace(), names).await.map_err(|source| ClusterError::Kube { cluster: HUB.to_owned(), source })?;
    Ok(match read {
        Ok(secrets) => Ok(secrets
            .into_iter()
            .map(|(name, s)| {
                let data = s.data.unwrap_or_default().into_keys().map(|k| (k, REDACTED.to_owned())).collect();
                (name, SecretData { type_: s.type_.unwrap_or_else(|| "Opaque".into()), data })
            })
            .collect()),
        Err(Unshippable::Missing(name)) => Err(format!("Secret {}/{name} does not exist on the hub", app.namespace())),
        Err(Unshippable::Refused(why)) => Err(why),
    })
}

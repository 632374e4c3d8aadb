//! A deploy's dry run on the server (`ferry submit deploy --dry-run --kubeconfig HUB`): the
//! ManifestWork each target cluster would get, rendered by the worker's own code
//! ([`render::manifest_work`]), sent to the hub as a server-side dry run (`dryRun=All`:
//! the upstream CRD's schema and the hub's admission webhooks judge it, nothing is
//! stored), and the difference between what the hub would then hold and the ManifestWork
//! there now, as RFC 6902 operations on its `spec` (both as the same server defaults them).
//! Nothing is written: no task, no object. Secret values never appear: a Secret manifest
//! shows its keys with a redacted value, on both sides (a changed value is not shown).
//! Components placed by OCM (a placement, not a cluster) are chosen at run time: listed,
//! not rendered.

use std::collections::{BTreeMap, BTreeSet};

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde::Serialize;
use serde_json::{Value, json};

use crate::exportable::Unshippable;
use crate::handler::DeployConfig;
use crate::render::{self, AppState, MANAGER, SecretData};
use crate::spec::{Delivery, DeployApp, DeployOperation};

/// What a Secret's value shows as in a preview (base64 of `(redacted)`).
const REDACTED: &str = "KHJlZGFjdGVkKQ==";

/// Why there is no preview.
#[derive(Debug, thiserror::Error)]
pub enum PreviewError {
    /// The hub could not be read.
    #[error("reading the hub: {0}")]
    Hub(#[source] kube::Error),
    /// What the dry run does not cover yet.
    #[error("a dry run on the server covers deploys and updates delivered by ManifestWork; {0}")]
    Unsupported(String),
}

/// What a cluster's ManifestWork would become.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Change {
    /// There is none: it would be created.
    Create,
    /// It differs: it would be updated.
    Update,
    /// It would stay as it is.
    Unchanged,
    /// The hub refused the dry run (see `refused`).
    Refused,
}

/// One target cluster's part of a preview.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterPreview {
    /// The cluster.
    pub cluster: String,
    /// The ManifestWork, `<cluster>/<name>` on the hub.
    pub work: String,
    /// The kinds and names of its manifests.
    pub manifests: Vec<String>,
    /// What would become of it.
    pub change: Change,
    /// The hub's (or the check's) refusal, if any.
    pub refused: Option<String>,
    /// RFC 6902 operations from the `spec` there now to the one the hub would hold
    /// (values of Secrets redacted).
    pub operations: Vec<Value>,
}

/// A deploy's dry run.
#[derive(Debug, Clone, Serialize)]
pub struct Preview {
    /// Each cluster named by a component, in name order.
    pub clusters: Vec<ClusterPreview>,
    /// Components OCM places at run time (not rendered).
    pub placed_at_run_time: Vec<String>,
}

/// The dry run of `app` (already validated) against the hub of `cfg`.
pub async fn preview(cfg: &DeployConfig, app: &DeployApp) -> Result<Preview, PreviewError> {
    if app.operation == DeployOperation::Delete {
        return Err(PreviewError::Unsupported("a delete's would remove the app's ManifestWorks (`ferry tasks revert --dry-run` shows an undo)".into()));
    }
    if app.delivery != Delivery::ManifestWork {
        return Err(PreviewError::Unsupported("direct delivery writes to the clusters themselves".into()));
    }
    let mut targets = render::Targets::new();
    let mut placed = Vec::new();
    for c in &app.components {
        match &c.cluster {
            Some(cluster) => targets.entry(c.name.clone()).or_default().push(cluster.clone()),
            None => placed.push(c.name.clone()),
        }
    }
    let state = AppState { spec: app.clone(), targets };
    let hub = cfg.clusters.hub().clone();
    let works = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("work.open-cluster-management.io", "v1", "ManifestWork"), "manifestworks");
    let mut clusters = Vec::new();
    for (cluster, comps) in state.by_cluster() {
        let name = render::work_name(app);
        let secrets = match redacted_secrets(&hub, app, &comps).await? {
            Ok(s) => s,
            Err(why) => {
                clusters.push(ClusterPreview { cluster: cluster.clone(), work: format!("{cluster}/{name}"), manifests: vec![], change: Change::Refused, refused: Some(why), operations: vec![] });
                continue;
            }
        };
        // The namespaces to orphan, as the run decides them (the cluster's own
        // namespaces, read through its kubeconfig; all of them when it cannot be read).
        let objects = render::objects(app, &comps, &secrets);
        let found = found_namespaces(cfg, &cluster, &objects, &app.name).await;
        let work = render::manifest_work(app, &cluster, &comps, &secrets, "dry-run", &found);
        let manifests = objects.iter().map(|o| format!("{} {}", o["kind"].as_str().unwrap_or("?"), o["metadata"]["name"].as_str().unwrap_or("?"))).collect();
        let api: Api<DynamicObject> = Api::namespaced_with(hub.clone(), &cluster, &works);
        let current = api.get_opt(&name).await.map_err(PreviewError::Hub)?;
        let pp = PatchParams::apply(MANAGER).force().dry_run();
        let (change, refused, operations) = match api.patch(&name, &pp, &Patch::Apply(&work)).await {
            Err(kube::Error::Api(e)) => (Change::Refused, Some(format!("{} ({})", e.message, e.reason)), vec![]),
            Err(e) => return Err(PreviewError::Hub(e)),
            Ok(would) => {
                let after = redacted(would.data.get("spec").cloned().unwrap_or(Value::Null));
                match current {
                    None => (Change::Create, None, vec![]),
                    Some(now) => {
                        let before = redacted(now.data.get("spec").cloned().unwrap_or(Value::Null));
                        let ops: Vec<Value> = serde_json::to_value(json_patch::diff(&before, &after)).ok().and_then(|v| v.as_array().cloned()).unwrap_or_default();
                        (if ops.is_empty() { Change::Unchanged } else { Change::Update }, None, ops)
                    }
                }
            }
        };
        clusters.push(ClusterPreview { cluster: cluster.clone(), work: format!("{cluster}/{name}"), manifests, change, refused, operations });
    }
    Ok(Preview { clusters, placed_at_run_time: placed })
}

/// The Secrets `comps` reference, checked as the run checks them (there, exportable),
/// their values redacted; `Err` with the reason a run would be refused.
async fn redacted_secrets(hub: &kube::Client, app: &DeployApp, comps: &[&crate::spec::Component]) -> Result<Result<BTreeMap<String, SecretData>, String>, PreviewError> {
    let names = comps.iter().flat_map(|c| c.secrets()).collect::<BTreeSet<_>>();
    Ok(match crate::exportable::read(hub, app.namespace(), names).await.map_err(PreviewError::Hub)? {
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

/// `spec` with every Secret manifest's values redacted.
fn redacted(mut spec: Value) -> Value {
    if let Some(ms) = spec.pointer_mut("/workload/manifests").and_then(Value::as_array_mut) {
        for m in ms.iter_mut().filter(|m| m["kind"] == "Secret") {
            for field in ["data", "stringData"] {
                if let Some(d) = m.get_mut(field).and_then(Value::as_object_mut) {
                    for v in d.values_mut() {
                        *v = json!(REDACTED);
                    }
                }
            }
        }
    }
    spec
}

/// The run's choice of namespaces to orphan ([`render::manifest_work`]).
async fn found_namespaces(cfg: &DeployConfig, cluster: &str, objects: &[Value], app: &str) -> BTreeSet<String> {
    let inner = crate::handler::Inner { cfg: cfg.clone() };
    inner.found_namespaces(cluster, objects, app).await
}

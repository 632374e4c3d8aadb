//! The first half of a fanned-out step (`<step>.clusters`): choose its clusters once and
//! record them as its output, so that the waves, a resumed run and the undo all work on
//! the same list even if the hub's labels change meanwhile. It also checks every child
//! the waves will send, as its kind will read it, and that no two share a subject
//! ([`crate::steps::waves::check_children`]): a bad child fails the step before the first
//! wave, not after some waves ran.
//!
//! # Which clusters
//! - `clusters`: those names, in that order (no hub needed; each child's worker refuses a
//!   cluster it does not know).
//! - `labels`: the hub's ManagedClusters carrying every label, by name.
//! - `cluster_set`: the ManagedClusters the ManagedClusterSet selects, as OCM defines it
//!   (`open-cluster-management-io/api` `cluster/v1beta2/types_managedclusterset.go`):
//!   `spec.clusterSelector.selectorType` `ExclusiveClusterSetLabel` (the default) selects
//!   the clusters labelled `cluster.open-cluster-management.io/clusterset=<set>`;
//!   `LabelSelector` selects by `spec.clusterSelector.labelSelector` (resolved by
//!   [`ferry_kube::cluster_sets`], as the deploy and score workers resolve a set).
//!
//! ManagedClusters being deleted are left out, and so are those a Placement without
//! tolerations would not select: a taint with effect `NoSelect` or `NoSelectIfNew` (a new
//! choice; `PreferNoSelect` only ranks lower), such as the `unavailable` and `unreachable`
//! taints OCM's registration puts on a cluster whose `ManagedClusterConditionAvailable` is
//! False or Unknown (`pkg/registration/hub/taint/controller.go`; the filter:
//! `pkg/placement/plugins/tainttoleration/taint_toleration.go`, `isTaintTolerated`). The
//! step's output names each cluster left out and why. Choosing none, or more than
//! [`MAX_CLUSTERS`], rejects the plan when nothing before it acted (else fails it).

use std::collections::BTreeMap;

use ferry_kube::cluster_sets;
use ferry_kube::kinds::ManagedCluster;
use ferry_kube::step_errors::{cluster_set_err, hub_err};
use ferry_task::{Step, StepContext, StepError, StepPolicy, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use kube::api::{Api, ListParams};
use kube::core::Selector;
use serde_json::{Value, json};

use crate::handler::PlanConfig;
use crate::spec::{ForEach, PlanSpec, PlanStep};
use crate::steps::{child, waves};

/// Clusters one step may fan out over: each child is a journal line of the step's output,
/// which rides in the plan's snapshot.
pub const MAX_CLUSTERS: usize = 1000;

/// The runtime step's name for a fanned-out step `step`'s choice of clusters (a plan's
/// step names have no `.`, so it is no user step's name).
pub fn step_name(step: &str) -> String {
    format!("{step}.clusters")
}

/// The clusters `select`'s output lists.
pub fn chosen(output: &Value) -> Option<Vec<String>> {
    serde_json::from_value(output.get("clusters")?.clone()).ok()
}

/// Chooses a fanned-out step's clusters.
pub struct SelectStep {
    name: String,
    step: PlanStep,
    each: ForEach,
    cfg: PlanConfig,
}

impl SelectStep {
    /// The choice of `step`'s clusters by `each`.
    pub fn new(step: PlanStep, each: ForEach, cfg: PlanConfig) -> Self {
        Self { name: step_name(&step.name), step, each, cfg }
    }

    async fn choose(&self) -> Result<Chosen, StepError> {
        choose(&self.step.name, &self.each, self.cfg.hub.as_ref()).await
    }
}

/// A fanned-out step's clusters, and those its selection matched but left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chosen {
    /// The clusters, in order.
    pub clusters: Vec<String>,
    /// Cluster → why it was left out (a taint a Placement would not tolerate).
    pub left_out: BTreeMap<String, String>,
}

/// The clusters `each` chooses for step `step` (names as listed; else the hub's
/// ManagedClusters by labels or set, sorted, without those OCM's taints keep out of a
/// Placement): what the run records, and what a dry run shows.
pub async fn choose(step: &str, each: &ForEach, hub: Option<&kube::Client>) -> Result<Chosen, StepError> {
    if !each.clusters.is_empty() {
        return Ok(Chosen { clusters: each.clusters.clone(), left_out: BTreeMap::new() });
    }
    let Some(hub) = hub else {
        return Err(StepError::permanent(
            codes::NO_HUB,
            format!("step {step} chooses its clusters on the hub (labels or cluster_set) and this plan worker has no hub: run it with a kubeconfig, or list the clusters"),
        ));
    };
    let (list, what) = selected(step, each, hub).await?;
    let mut chosen = Chosen::default();
    for c in list.into_iter().filter(|c| c.metadata.deletion_timestamp.is_none()) {
        let Some(name) = c.metadata.name.clone() else { continue };
        match untolerated(&c.spec) {
            Some(why) => {
                chosen.left_out.insert(name, why);
            }
            None => chosen.clusters.push(name),
        }
    }
    chosen.clusters.sort();
    if chosen.clusters.is_empty() {
        let left = if chosen.left_out.is_empty() { String::new() } else { format!(" a Placement would select (left out: {})", shown(&chosen.left_out)) };
        return Err(StepError::rejected(codes::CLUSTERS_UNCHOSEN, format!("step {step}: {what} selects no ManagedCluster{left}")));
    }
    Ok(chosen)
}

/// `cluster: why` pairs, for a message.
fn shown(left_out: &BTreeMap<String, String>) -> String {
    left_out.iter().map(|(c, why)| format!("{c}: {why}")).collect::<Vec<_>>().join("; ")
}

/// The first taint of a ManagedCluster's `spec` that a Placement without tolerations
/// would not tolerate for a new decision, as `key:Effect`.
fn untolerated(spec: &Value) -> Option<String> {
    spec.get("taints").and_then(Value::as_array).into_iter().flatten().find_map(|t| {
        let effect = t.get("effect").and_then(Value::as_str).unwrap_or("");
        matches!(effect, "NoSelect" | "NoSelectIfNew").then(|| format!("taint {}:{effect}", t.get("key").and_then(Value::as_str).unwrap_or("")))
    })
}

/// The ManagedClusters `each` selects (by set or labels), and how to name it in messages.
async fn selected(step: &str, each: &ForEach, hub: &kube::Client) -> Result<(Vec<ManagedCluster>, String), StepError> {
    if let Some(set) = &each.cluster_set {
        let unresolved = |e| {
            let mut err = cluster_set_err(codes::CLUSTERS_UNCHOSEN, e);
            err.message = format!("step {step}: {}", err.message);
            err
        };
        let Some(found) = cluster_sets::get(hub, set).await.map_err(unresolved)? else {
            return Err(StepError::rejected(codes::CLUSTERS_UNCHOSEN, format!("step {step}: ManagedClusterSet {set:?} does not exist on the hub")));
        };
        let clusters = found.clusters(hub).await.map_err(unresolved)?;
        return Ok((clusters, format!("ManagedClusterSet {set:?} ({})", found.describe())));
    }
    let labels: BTreeMap<String, String> = each.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let shown = labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
    let api: Api<ManagedCluster> = Api::all(hub.clone());
    let list = api.list(&ListParams::default().labels_from(&Selector::from_iter(labels))).await.map_err(hub_err)?;
    Ok((list.items, format!("labels {shown}")))
}

impl Step<PlanSpec> for SelectStep {
    fn name(&self) -> &str {
        &self.name
    }

    fn policy(&self) -> StepPolicy {
        StepPolicy { max_retries: 5, ..StepPolicy::default() }
    }

    /// It reads the hub only.
    fn acts(&self) -> bool {
        false
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, PlanSpec>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let Chosen { clusters: names, left_out } = self.choose().await?;
            if names.len() > MAX_CLUSTERS {
                return Err(StepError::rejected(codes::CLUSTERS_UNCHOSEN, format!("step {}: {} clusters chosen; a step fans out over at most {MAX_CLUSTERS}", self.step.name, names.len())));
            }
            // Each child as its kind will read it, before the first wave sends any: a child
            // refused (or two on one subject) fails the step now, not after a wave ran.
            let kind = self.step.kind.parse().map_err(|e: ferry_task::kind::UnknownKind| StepError::permanent(codes::INTERNAL, e.to_string()))?;
            waves::check_children(&self.step, &self.each, &names, |subject, spec| {
                let c = child::command(cx, kind, &self.step.name, String::new(), subject.as_deref(), &spec)?;
                Ok((c.subject, c.spec))
            })?;
            if !left_out.is_empty() {
                cx.progress(50, format!("left out as a Placement would leave them: {}", shown(&left_out)));
            }
            cx.progress(100, format!("{} clusters: {}", names.len(), names.join(", ")));
            let mut out = json!({ "clusters": names });
            if !left_out.is_empty() {
                out["left_out"] = json!(left_out);
            }
            Ok(out)
        }
        .boxed()
    }

    fn undo<'a>(&'a self, _: &'a StepContext<'a, PlanSpec>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async { Ok(()) }.boxed()
    }
}

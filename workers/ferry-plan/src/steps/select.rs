//! The first half of a fanned-out step (`<step>.clusters`): choose its clusters once and
//! record them as its output, so that the waves, a resumed run and the undo all work on
//! the same list even if the hub's labels change meanwhile.
//!
//! # Which clusters
//! - `clusters`: those names, in that order (no hub needed; each child's worker refuses a
//!   cluster it does not know).
//! - `labels`: the hub's ManagedClusters carrying every label, by name.
//! - `cluster_set`: the ManagedClusters the ManagedClusterSet selects, as OCM defines it
//!   (`open-cluster-management-io/api` `cluster/v1beta2/types_managedclusterset.go`):
//!   `spec.clusterSelector.selectorType` `ExclusiveClusterSetLabel` (the default) selects
//!   the clusters labelled `cluster.open-cluster-management.io/clusterset=<set>`;
//!   `LabelSelector` selects by `spec.clusterSelector.labelSelector`.
//!
//! ManagedClusters being deleted are left out. Choosing none, or more than
//! [`MAX_CLUSTERS`], rejects the plan when nothing before it acted (else fails it).

use std::collections::BTreeMap;

use ferry_kube::kinds::{ManagedCluster, ManagedClusterSet};
use ferry_kube::step_errors::hub_err;
use ferry_kube::vocab::ocm::CLUSTERSET_LABEL;
use ferry_task::{Step, StepContext, StepError, StepPolicy, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, ListParams};
use kube::core::Selector;
use serde_json::{Value, json};

use crate::handler::PlanConfig;
use crate::spec::{ForEach, PlanSpec};

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
    step: String,
    each: ForEach,
    cfg: PlanConfig,
}

impl SelectStep {
    /// The choice of `step`'s clusters by `each`.
    pub fn new(step: &str, each: ForEach, cfg: PlanConfig) -> Self {
        Self { name: step_name(step), step: step.to_owned(), each, cfg }
    }

    async fn choose(&self) -> Result<Vec<String>, StepError> {
        choose(&self.step, &self.each, self.cfg.hub.as_ref()).await
    }
}

/// The clusters `each` chooses for step `step` (names as listed; else the hub's
/// ManagedClusters by labels or set, sorted): what the run records, and what a dry run shows.
pub async fn choose(step: &str, each: &ForEach, hub: Option<&kube::Client>) -> Result<Vec<String>, StepError> {
    let chooser = Chooser { step, each };
    chooser.choose(hub).await
}

struct Chooser<'a> {
    step: &'a str,
    each: &'a ForEach,
}

impl Chooser<'_> {
    /// What to list ManagedClusters by, and how to name it in messages.
    async fn selector(&self, hub: &kube::Client) -> Result<(Selector, String), StepError> {
        if let Some(set) = &self.each.cluster_set {
            let api: Api<ManagedClusterSet> = Api::all(hub.clone());
            let Some(found) = api.get_opt(set).await.map_err(hub_err)? else {
                return Err(StepError::rejected(codes::CLUSTERS_UNCHOSEN, format!("step {}: ManagedClusterSet {set:?} does not exist on the hub", self.step)));
            };
            let cs = found.spec.get("clusterSelector");
            let kind = cs.and_then(|c| c.get("selectorType")).and_then(Value::as_str).unwrap_or("ExclusiveClusterSetLabel");
            return match kind {
                "ExclusiveClusterSetLabel" => Ok((Selector::from_iter([(CLUSTERSET_LABEL.to_owned(), set.clone())]), format!("ManagedClusterSet {set:?} (label {CLUSTERSET_LABEL}={set})"))),
                "LabelSelector" => {
                    let ls: LabelSelector = serde_json::from_value(cs.and_then(|c| c.get("labelSelector")).cloned().unwrap_or(json!({})))
                        .map_err(|e| StepError::permanent(codes::CLUSTERS_UNCHOSEN, format!("step {}: ManagedClusterSet {set:?} has a label selector that does not parse: {e}", self.step)))?;
                    let sel = Selector::try_from(ls).map_err(|e| StepError::permanent(codes::CLUSTERS_UNCHOSEN, format!("step {}: ManagedClusterSet {set:?}'s label selector: {e}", self.step)))?;
                    Ok((sel, format!("ManagedClusterSet {set:?} (its label selector)")))
                }
                other => Err(StepError::permanent(codes::CLUSTERS_UNCHOSEN, format!("step {}: ManagedClusterSet {set:?} has selectorType {other:?}, which OCM does not define", self.step))),
            };
        }
        let labels: BTreeMap<String, String> = self.each.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let shown = labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
        Ok((Selector::from_iter(labels), format!("labels {shown}")))
    }

    async fn choose(&self, hub: Option<&kube::Client>) -> Result<Vec<String>, StepError> {
        if !self.each.clusters.is_empty() {
            return Ok(self.each.clusters.clone());
        }
        let Some(hub) = hub else {
            return Err(StepError::permanent(
                codes::NO_HUB,
                format!("step {} chooses its clusters on the hub (labels or cluster_set) and this plan worker has no hub: run it with a kubeconfig, or list the clusters", self.step),
            ));
        };
        let (selector, what) = self.selector(hub).await?;
        let api: Api<ManagedCluster> = Api::all(hub.clone());
        let list = api.list(&ListParams::default().labels_from(&selector)).await.map_err(hub_err)?;
        let mut names: Vec<String> = list.items.into_iter().filter(|c| c.metadata.deletion_timestamp.is_none()).filter_map(|c| c.metadata.name).collect();
        names.sort();
        if names.is_empty() {
            return Err(StepError::rejected(codes::CLUSTERS_UNCHOSEN, format!("step {}: {what} selects no ManagedCluster", self.step)));
        }
        Ok(names)
    }
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
            let names = self.choose().await?;
            if names.len() > MAX_CLUSTERS {
                return Err(StepError::rejected(codes::CLUSTERS_UNCHOSEN, format!("step {}: {} clusters chosen; a step fans out over at most {MAX_CLUSTERS}", self.step, names.len())));
            }
            cx.progress(100, format!("{} clusters: {}", names.len(), names.join(", ")));
            Ok(json!({ "clusters": names }))
        }
        .boxed()
    }

    fn undo<'a>(&'a self, _: &'a StepContext<'a, PlanSpec>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async { Ok(()) }.boxed()
    }
}

//! `place`: a Placement on the hub per placed component, then its PlacementDecision (the
//! clusters OCM chose; a component with a named cluster keeps it); its undo puts back the
//! previous app's Placements (none after a deploy). A delete places nothing: `apply`
//! removes the Placements with the app, and puts them back in its undo.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ferry_kube::kinds::PlacementDecision;
use ferry_kube::step_errors::{hub_err, kube_err};
use ferry_kube::{Check, HUB};
use ferry_task::{Output, Step, StepContext, StepError, StepPolicy, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use kube::api::{DeleteParams, ListParams};
use kube::core::GroupVersionKind;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::check::{CHECK, candidates};
use crate::handler::Inner;
use crate::ownership::{FERRY, MANAGED_BY};
use crate::render::{self, APP_LABEL, Targets};
use crate::spec::{Component, DeployApp, DeployOperation};

/// Label OCM puts on a Placement's decisions.
pub const PLACEMENT_LABEL: &str = "cluster.open-cluster-management.io/placement";

/// The `place` step's output.
pub const PLACE: Output<Placed> = Output::new("place");

/// Output of `place`: where each component goes.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Placed {
    /// Component → clusters.
    pub targets: Targets,
}

/// The `place` step.
pub struct Place {
    inner: Arc<Inner>,
}

impl Inner {
    /// Applies the placements of `state` and deletes the app's other Placements (`apply`
    /// calls it too: a delete's Placements go with the app); a Placement of that name that
    /// is not Ferry's for the app fails it (`OBJECT_NOT_FERRYS`), and is not deleted.
    pub(super) async fn converge_placements(&self, app: &DeployApp, state: Option<&DeployApp>, task: &str) -> Result<(), StepError> {
        let gvk = GroupVersionKind::gvk("cluster.open-cluster-management.io", "v1beta1", "Placement");
        let api = self.cfg.clusters.api(HUB, &gvk, Some(app.namespace())).await.map_err(|e| kube_err(codes::HUB_API, e))?;
        let mut keep = BTreeSet::new();
        if let Some(s) = state {
            self.ensure_hub_namespace(s.namespace()).await?;
            for c in &s.components {
                if let Some(p) = render::placement(s, c, task) {
                    keep.insert(render::placement_name(s, &c.name));
                    self.apply_owned(HUB, &p, &app.name).await?;
                }
            }
        }
        let lp = ListParams::default().labels(&format!("{MANAGED_BY}={FERRY},{APP_LABEL}={}", app.name));
        let existing = match api.list(&lp).await {
            Ok(l) => l.items,
            Err(kube::Error::Api(s)) if s.code == 404 => Vec::new(),
            Err(e) => return Err(hub_err(e)),
        };
        for p in existing {
            let name = p.metadata.name.unwrap_or_default();
            if !keep.contains(&name) {
                match api.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(hub_err(e)),
                }
            }
        }
        Ok(())
    }
}

impl Place {
    pub(crate) fn new(inner: Arc<Inner>) -> Self {
        Self { inner }
    }

    /// Waits for the decisions of one placement; with `allowed` (its Placement's spec
    /// changed), only for decisions of exactly its number of clusters, all of them in
    /// `allowed`.
    ///
    /// A PlacementDecision says nothing of the Placement generation it was made for: OCM's
    /// scheduler writes decisions and the Placement's status with no observedGeneration
    /// (ocm `pkg/placement/controllers/scheduling/scheduling_controller.go`, `bind` and
    /// `updateStatus`; api `cluster/v1beta1` `PlacementDecisionStatus`), and re-schedules
    /// a changed Placement later. Right after the step re-applies a changed Placement, the
    /// decisions there are the old spec's, as many clusters as before: new labels or sets
    /// at the same count would deploy to the old clusters. So the decided clusters are
    /// checked against the new predicates here (the sets' members and labels, as `check`
    /// finds the candidates) before they are taken.
    async fn decisions(&self, app: &DeployApp, c: &Component, allowed: Option<&BTreeSet<String>>) -> Result<Vec<String>, StepError> {
        let name = render::placement_name(app, &c.name);
        let want = c.wanted_clusters();
        let hub = self.inner.hub();
        let r = self
            .inner
            .cfg
            .watches
            .wait_store::<PlacementDecision, Vec<String>>(HUB, &hub, Some(app.namespace()), &format!("decisions of Placement {}/{name}", app.namespace()), self.inner.cfg.placement_timeout, |store| {
                let clusters = decided(store.state().iter().map(|d| &**d), &name);
                if let Some(a) = allowed.filter(|a| clusters.len() != want || clusters.iter().any(|c| !a.contains(c))) {
                    return Check::Pending(format!("decisions {} are not yet of the changed Placement ({want} of {})", ferry_task::report::listed(&clusters), ferry_task::report::listed(a)));
                }
                if clusters.len() >= want { Check::Done(clusters) } else { Check::Pending(format!("{} of {want} cluster(s) decided: {}", clusters.len(), ferry_task::report::listed(&clusters))) }
            })
            .await;
        match r {
            Ok(c) => Ok(c),
            Err(e) => {
                // Say why in OCM's words when the Placement has them.
                let p = self.inner.cfg.clusters.get(HUB, &json!({"apiVersion": "cluster.open-cluster-management.io/v1beta1", "kind": "Placement",
                    "metadata": {"name": name, "namespace": app.namespace()}})).await.ok().flatten();
                let why = p.and_then(|p| ferry_kube::kinds::condition_message(p.data.get("status")?, "PlacementSatisfied"));
                Err(StepError::permanent(codes::PLACEMENT_UNSATISFIED, format!("component {:?}: {e}{}", c.name, why.map(|w| format!(" ({w})")).unwrap_or_default())))
            }
        }
    }
}

/// The clusters Placement `name`'s decisions (among `decisions`, OCM's PlacementDecisions
/// of its namespace, labelled with the Placement's name) name, sorted, once each.
pub(crate) fn decided<'d>(decisions: impl Iterator<Item = &'d PlacementDecision>, name: &str) -> Vec<String> {
    let mut clusters: Vec<String> = decisions
        .filter(|d| d.metadata.labels.as_ref().and_then(|l| l.get(PLACEMENT_LABEL)).is_some_and(|p| p == name))
        .filter_map(|d| d.status_at("/decisions").and_then(Value::as_array).cloned())
        .flatten()
        .filter_map(|d| d.get("clusterName").and_then(Value::as_str).map(str::to_owned))
        .collect();
    clusters.sort();
    clusters.dedup();
    clusters
}

/// Whether component `c` keeps the Placement `previous` (the app before this task) has
/// for it, spec unchanged: its decisions there are the ones `place` takes.
pub(crate) fn same_placement(previous: Option<&DeployApp>, app: &DeployApp, c: &Component) -> bool {
    let before = previous.and_then(|p| placement_spec(p, &c.name));
    before.is_some() && before == placement_spec(app, &c.name)
}

/// The spec of component `name`'s Placement in `app` (`None`: it names its cluster, or
/// `app` has no such component).
fn placement_spec(app: &DeployApp, name: &str) -> Option<Value> {
    let c = app.components.iter().find(|c| c.name == name)?;
    render::placement(app, c, "").map(|p| p["spec"].clone())
}

/// Whether component `c`'s Placement differs from the one `previous` (the app before this
/// task) had for it, so that the decisions there may be the old spec's. A Placement that is
/// new has none of the app's.
fn changed_placement(previous: Option<&DeployApp>, app: &DeployApp, c: &Component) -> bool {
    let before = previous.and_then(|p| placement_spec(p, &c.name));
    before.is_some_and(|b| Some(b) != placement_spec(app, &c.name))
}

impl Step<DeployApp> for Place {
    fn name(&self) -> &str {
        PLACE.step()
    }

    fn policy(&self) -> StepPolicy {
        StepPolicy { timeout: self.inner.cfg.placement_timeout + Duration::from_secs(60), ..StepPolicy::default() }
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, DeployApp>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let app = cx.spec;
            if app.operation == DeployOperation::Delete {
                return PLACE.value(&Placed::default());
            }
            let previous = CHECK.required(cx)?.previous;
            self.inner.converge_placements(app, Some(app), &cx.task_id.to_string()).await?;
            let mut targets = Targets::new();
            for c in &app.components {
                let clusters = match &c.cluster {
                    Some(cl) => vec![cl.clone()],
                    None => {
                        let allowed = if changed_placement(previous.as_ref().map(|p| &p.spec), app, c) {
                            // `check` found candidates before any effect; gone since, it is this run's failure.
                            let found = candidates(&self.inner, app, c).await.map_err(|e| if e.rejects { StepError::permanent(codes::PLACEMENT_UNSATISFIED, e.message) } else { e })?;
                            Some(found.into_iter().collect::<BTreeSet<String>>())
                        } else {
                            None
                        };
                        let d = self.decisions(app, c, allowed.as_ref()).await?;
                        cx.progress(50, format!("component {} placed on {}", c.name, d.join(", ")));
                        d
                    }
                };
                targets.insert(c.name.clone(), clusters);
            }
            let clusters: BTreeSet<&String> = targets.values().flatten().collect();
            cx.progress(100, format!("{} component(s) on {} cluster(s)", targets.len(), clusters.len()));
            PLACE.value(&Placed { targets })
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, DeployApp>, _output: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            let c = CHECK.required(cx)?;
            self.inner.converge_placements(cx.spec, c.previous.as_ref().map(|p| &p.spec), &cx.task_id.to_string()).await
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::PlacementSpec;

    fn app(labels: &[(&str, &str)], clusters: i32) -> DeployApp {
        let placement = PlacementSpec { cluster_sets: vec!["demo".into()], labels: labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(), clusters: Some(clusters), ..PlacementSpec::default() };
        DeployApp { name: "shop".into(), components: vec![Component { name: "web".into(), image: "nginx:1.27".into(), placement: Some(placement), ..Component::default() }], ..DeployApp::default() }
    }

    #[test]
    fn a_placement_changed_by_the_update_is_told_apart() {
        let gold = app(&[("tier", "gold")], 1);
        let c = &gold.components[0];
        assert!(!changed_placement(None, &gold, c), "a new Placement has no old decisions");
        assert!(!changed_placement(Some(&gold), &gold, c));
        let mut other_image = gold.clone();
        other_image.components[0].image = "nginx:1.28".into();
        assert!(!changed_placement(Some(&other_image), &gold, c), "only the Placement's spec counts");
        assert!(changed_placement(Some(&app(&[("tier", "silver")], 1)), &gold, c), "other labels, the same count");
        assert!(changed_placement(Some(&app(&[("tier", "gold")], 2)), &gold, c));
        let mut named = gold.clone();
        named.components[0].placement = None;
        named.components[0].cluster = Some("member-1".into());
        assert!(!changed_placement(Some(&named), &gold, c), "it had no Placement before");
    }
}

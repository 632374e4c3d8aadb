//! The `deploy` task: check (live rules that reject), place (OCM Placements →
//! decisions), apply (ManifestWorks, or objects through kubeconfigs, and the app record on
//! the hub), wait (every component's rollout, from ManifestWork feedback); each step is a
//! module of [`crate::steps`]. The undos of place and apply converge the fleet back to the
//! app's previous state (check and wait change nothing), so a revert of a deploy removes
//! it, of an update restores the previous spec, of a delete re-creates it.

use std::sync::Arc;
use std::time::Duration;

use ferry_kube::{Clusters, Watches};
use ferry_task::{Rejection, Step, TaskHandler, TaskKind};

use crate::spec::DeployApp;
use crate::steps::{apply::Apply, check::Check, place::Place, wait::Wait};

// The test kit and the CLI name it here.
pub use crate::steps::wait::ComponentStatus;

/// What the deploy worker needs.
#[derive(Clone)]
pub struct DeployConfig {
    /// The hub and the managed clusters.
    pub clusters: Arc<Clusters>,
    /// Shared watches (ManifestWorks, decisions, Deployments).
    pub watches: Arc<Watches>,
    /// How long a placement has to decide.
    pub placement_timeout: Duration,
    /// How long deleted ManifestWorks have to disappear.
    pub removal_timeout: Duration,
}

impl DeployConfig {
    /// Defaults: 120 s to place, 300 s to remove.
    pub fn new(clusters: Arc<Clusters>) -> Self {
        Self { clusters, watches: Arc::new(Watches::new()), placement_timeout: Duration::from_secs(120), removal_timeout: Duration::from_secs(300) }
    }
}

/// What every step shares: the configuration (its helpers live beside the steps that use
/// them: `steps::record`, `steps::converge`, `steps::place`).
pub(crate) struct Inner {
    pub(crate) cfg: DeployConfig,
}

impl Inner {
    pub(crate) fn hub(&self) -> kube::Client {
        self.cfg.clusters.hub().clone()
    }
}

/// The handler of `deploy` tasks.
#[derive(Clone)]
pub struct DeployHandler {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for DeployHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeployHandler").finish_non_exhaustive()
    }
}

impl DeployHandler {
    /// A handler.
    pub fn new(cfg: DeployConfig) -> Self {
        Self { inner: Arc::new(Inner { cfg }) }
    }
}

impl TaskHandler for DeployHandler {
    type Spec = DeployApp;

    fn kind(&self) -> TaskKind {
        TaskKind::DEPLOY
    }

    fn validate(&self, subject: &str, spec: &DeployApp) -> Result<(), Rejection> {
        crate::validate::validate(subject, spec)
    }

    /// The clusters components name, the sets their placements choose in (a placement with
    /// none chooses among every set bound to the namespace), the app's namespace and the
    /// namespaces components are offloaded to.
    fn targets(&self, _subject: &str, spec: &DeployApp) -> ferry_task::Targets {
        let mut t = ferry_task::Targets::clusters(spec.components.iter().filter_map(|c| c.cluster.clone()))
            .with_namespaces([spec.namespace().to_owned()])
            .with_namespaces(spec.components.iter().filter_map(|c| c.offloaded_namespace.clone()));
        for p in spec.components.iter().filter_map(|c| c.placement.as_ref()) {
            if p.cluster_sets.is_empty() {
                t = t.chosen_at_run(format!("a placement with no cluster set (every set bound to namespace {:?})", spec.namespace()));
            }
            t = t.with_sets(p.cluster_sets.iter().cloned());
        }
        t
    }

    /// One plan for deploy, update and delete: each step reads the operation.
    fn plan(&self, spec: &DeployApp) -> Vec<Arc<dyn Step<DeployApp>>> {
        let ready = Duration::from_secs(spec.ready_timeout_seconds.unwrap_or(600).max(1) as u64);
        let i = &self.inner;
        vec![
            Arc::new(Check::new(i.clone())),       // live rules that reject; the app as it was
            Arc::new(Place::new(i.clone())),       // Placements → the clusters of each component
            Arc::new(Apply::new(i.clone())),       // ManifestWorks (or objects) and the app record
            Arc::new(Wait::new(i.clone(), ready)), // every component rolled out, the removed ones gone
        ]
    }

    /// `ferry_cluster_watches_failing{cluster}`: the clusters this worker waits on whose
    /// API servers do not answer its watches.
    fn gauges(&self) -> Vec<ferry_task::gauges::GaugeFamily> {
        self.inner.cfg.watches.gauges()
    }
}

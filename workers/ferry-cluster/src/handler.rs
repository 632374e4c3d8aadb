//! The `create-cluster` tasks. Create: check (live rules that reject), apply (render and
//! server-side apply; undo deletes the Cluster and waits until it is gone), wait for the
//! infrastructure, the control plane and the kubeconfig Secret, the CNI add-ons, Ready
//! nodes, one step per other add-on (apply, readiness, crash-loop detection; undo removes
//! it), register with OCM.
//! Scale: check, scale (undo restores the counts), wait. Delete: check, deregister, delete.
//! Every wait is a shared watch with a deadline; kubeconfigs stay on the hub. Each step is
//! a module of [`crate::steps`].

use std::sync::Arc;
use std::time::Duration;

use ferry_kube::{Clusters, Watches};
use ferry_task::{Rejection, Step, TaskHandler, TaskKind};

use crate::addons::Catalog;
use crate::spec::{AddonRequest, ClusterCommand, ClusterOperation};
use crate::steps::addon::AddonStep;
use crate::steps::apply::ApplyStep;
use crate::steps::check::CreateCheck;
use crate::steps::delete::{DeleteCheck, DeleteStep};
use crate::steps::initialization::{CONTROL_PLANE, ClusterWait, INFRASTRUCTURE};
use crate::steps::kubeconfig::KubeconfigStep;
use crate::steps::nodes::NodesStep;
use crate::steps::register::{DeregisterStep, KLUSTERLET_ADDON, RegisterStep};
use crate::steps::scale::{ScaleCheck, ScaleStep, ScaleWait};

/// What the create-cluster worker needs.
#[derive(Clone)]
pub struct ClusterConfig {
    /// The hub and the workload clusters (through their kubeconfig Secrets).
    pub clusters: Arc<Clusters>,
    /// Shared watches.
    pub watches: Arc<Watches>,
    /// The add-on catalog.
    pub catalog: Arc<Catalog>,
    /// How long a deleted Cluster or ManagedCluster has to disappear.
    pub removal_timeout: Duration,
    /// How long a new ManagedCluster has to become available.
    pub registration_timeout: Duration,
    /// The hub's API address for new clusters' klusterlets (`clusteradm join
    /// --hub-apiserver`); None: the address in the hub's `kube-public/cluster-info`.
    pub hub_apiserver: Option<String>,
}

impl ClusterConfig {
    /// Defaults: the built-in catalog, 600 s to remove, 300 s to register.
    pub fn new(clusters: Arc<Clusters>) -> Self {
        Self {
            clusters,
            watches: Arc::new(Watches::new()),
            catalog: Arc::new(Catalog::builtin()),
            removal_timeout: Duration::from_secs(600),
            registration_timeout: Duration::from_secs(300),
            hub_apiserver: None,
        }
    }
}

/// What every step shares: the configuration (the steps' helpers are in
/// [`crate::steps`]).
pub(crate) struct Inner {
    pub(crate) cfg: ClusterConfig,
}

impl Inner {
    pub(crate) fn hub(&self) -> kube::Client {
        self.cfg.clusters.hub().clone()
    }
}

/// The handler of `create-cluster` tasks.
#[derive(Clone)]
pub struct ClusterHandler {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ClusterHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterHandler").finish_non_exhaustive()
    }
}

impl ClusterHandler {
    /// A handler.
    pub fn new(cfg: ClusterConfig) -> Self {
        Self { inner: Arc::new(Inner { cfg }) }
    }
}

impl TaskHandler for ClusterHandler {
    type Spec = ClusterCommand;

    fn kind(&self) -> TaskKind {
        TaskKind::CREATE_CLUSTER
    }

    fn validate(&self, subject: &str, spec: &ClusterCommand) -> Result<(), Rejection> {
        crate::validate::validate(subject, spec, &self.inner.cfg.catalog)
    }

    /// The cluster, its namespace on the hub and the set it joins in OCM.
    fn targets(&self, _subject: &str, spec: &ClusterCommand) -> ferry_task::Targets {
        ferry_task::Targets::clusters([spec.name.clone()])
            .with_namespaces([spec.namespace().to_owned()])
            .with_sets(spec.ocm.cluster_set.clone())
    }

    /// One plan per operation.
    fn plan(&self, spec: &ClusterCommand) -> Vec<Arc<dyn Step<ClusterCommand>>> {
        let i = &self.inner;
        match spec.operation {
            ClusterOperation::Create => {
                let mut steps: Vec<Arc<dyn Step<ClusterCommand>>> = vec![
                    Arc::new(CreateCheck(i.clone())), // live rules that reject; whether the namespace exists
                    Arc::new(ApplyStep(i.clone())),   // namespace and rendered objects; undo deletes the Cluster
                    Arc::new(ClusterWait { inner: i.clone(), step: INFRASTRUCTURE, field: "infrastructureProvisioned", what: "infrastructure provisioned" }),
                    Arc::new(ClusterWait { inner: i.clone(), step: CONTROL_PLANE, field: "controlPlaneInitialized", what: "control plane initialized" }),
                    Arc::new(KubeconfigStep(i.clone())), // the kubeconfig Secret; the workload API answers
                ];
                // A pod network first: kubeadm's nodes stay NotReady until a CNI runs
                // (Cluster API quick start, "Deploy a CNI solution"). Each add-on: apply,
                // ready (or crash-looping), after; undo removes it.
                let (cnis, rest): (Vec<_>, Vec<_>) = spec.addons.iter().partition(|a| i.cfg.catalog.get(&a.name).is_some_and(|c| c.cni));
                steps.extend(cnis.into_iter().map(|a| Arc::new(AddonStep::new(i, a)) as Arc<dyn Step<ClusterCommand>>));
                steps.push(Arc::new(NodesStep(i.clone()))); // Machines with nodes, the nodes Ready
                steps.extend(rest.into_iter().map(|a| Arc::new(AddonStep::new(i, a)) as Arc<dyn Step<ClusterCommand>>));
                if spec.ocm.enabled {
                    // The klusterlet operator (clusteradm join installs its chart), unless
                    // the command names it; then join and accept.
                    if !spec.addons.iter().any(|a| a.name == KLUSTERLET_ADDON) && i.cfg.catalog.get(KLUSTERLET_ADDON).is_some() {
                        steps.push(Arc::new(AddonStep::new(i, &AddonRequest { name: KLUSTERLET_ADDON.into(), ..AddonRequest::default() })));
                    }
                    steps.push(Arc::new(RegisterStep(i.clone()))); // joined, accepted, Available; undo deregisters
                }
                steps
            }
            ClusterOperation::Scale => vec![
                Arc::new(ScaleCheck(i.clone())), // Ferry's Cluster; the counts before
                Arc::new(ScaleStep(i.clone())),  // the counts asked for; undo restores the counts before
                Arc::new(ScaleWait(i.clone())),  // as many Ready nodes
            ],
            ClusterOperation::Delete => vec![
                Arc::new(DeleteCheck(i.clone())),    // Ferry's Cluster; registered or not
                Arc::new(DeregisterStep(i.clone())), // ManagedCluster gone; undo re-registers
                Arc::new(DeleteStep(i.clone())),     // Cluster gone, then its templates; no undo once begun
            ],
        }
    }

    /// `ferry_cluster_watches_failing{cluster}`: the clusters this worker waits on whose
    /// API servers do not answer its watches.
    fn gauges(&self) -> Vec<ferry_task::gauges::GaugeFamily> {
        self.inner.cfg.watches.gauges()
    }
}

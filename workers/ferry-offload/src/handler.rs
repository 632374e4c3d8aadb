//! The `offload` tasks. Offload: check (the namespace exists; every target is peered
//! with the cluster: it has a virtual node of it) → offload (the NamespaceOffloading;
//! waits until its phase is Ready on every target) → twins (waits for the twin namespaces
//! on the targets). Unoffload: check (records the offloading) → remove (deletes it; waits
//! until it and the twin namespaces are gone); its revert restores it. Burst: check (the
//! Deployment, its pods' requests, the candidates) → scale (the replicas wanted; waits
//! until every pod is placed or unschedulable) → place (the overflow to the nearest
//! candidates with room) → offload (to those) → respawn (the Pending overflow, created
//! before the offloading, deleted for its ReplicaSet to create again under Liqo's pod
//! webhook, which acts at creation only) → ready (every replica Ready). Undo restores what
//! was there: the previous offloading (re-created where its immutable fields differ) or
//! none, the previous replicas.
//! Each step is a module of [`crate::steps`].

use std::sync::Arc;
use std::time::Duration;

use ferry_kube::{Clusters, Watches};
use ferry_task::{Rejection, Step, TaskHandler, TaskKind};

use crate::latency::LatencyMatrix;
use crate::spec::{OffloadCommand, OffloadOperation};
use crate::steps::check::OffloadCheck;
use crate::steps::offload::OffloadStep;
use crate::steps::place::PlaceStep;
use crate::steps::policy;
use crate::steps::ready::ReadyStep;
use crate::steps::remove::RemoveStep;
use crate::steps::respawn::RespawnStep;
use crate::steps::scale::ScaleStep;
use crate::steps::twins::TwinsStep;

/// How long a failed twin is waited out by default: a minute covers a dozen of the
/// NamespaceMap controller's retries once controller-runtime's per-item backoff (5 ms
/// doubling) has grown to seconds, and is short beside an offload's 10-minute deadline.
pub const DEFAULT_FAILURE_GRACE: Duration = Duration::from_secs(60);

/// What the offload worker needs.
#[derive(Clone)]
pub struct OffloadConfig {
    /// The hub and the clusters.
    pub clusters: Arc<Clusters>,
    /// Shared watches.
    pub watches: Arc<Watches>,
    /// Milliseconds between clusters, for bursts.
    pub latency: LatencyMatrix,
    /// How long removals (the offloading, its twin namespaces) have to finish.
    pub removal_timeout: Duration,
    /// How long an offloading may report a failed twin (Liqo's `CreationLoopBackOff`,
    /// which its NamespaceMap controller also reports for a failure its next retry mends)
    /// before the offload fails; zero fails at once, as liqoctl's wait does.
    pub failure_grace: Duration,
}

impl OffloadConfig {
    /// A config reaching clusters through `clusters`, no latency known, 300 s removals,
    /// failed twins waited out for [`DEFAULT_FAILURE_GRACE`].
    pub fn new(clusters: Arc<Clusters>) -> Self {
        Self {
            clusters,
            watches: Arc::new(Watches::new()),
            latency: LatencyMatrix::default(),
            removal_timeout: Duration::from_secs(300),
            failure_grace: DEFAULT_FAILURE_GRACE,
        }
    }
}

/// What every step shares: the configuration (the steps' helpers are in
/// [`crate::steps`]).
pub(crate) struct Inner {
    pub(crate) cfg: OffloadConfig,
}

/// The handler of `offload` tasks.
#[derive(Clone)]
pub struct OffloadHandler {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for OffloadHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OffloadHandler").finish_non_exhaustive()
    }
}

impl OffloadHandler {
    /// A handler.
    pub fn new(cfg: OffloadConfig) -> Self {
        Self { inner: Arc::new(Inner { cfg }) }
    }
}

impl TaskHandler for OffloadHandler {
    type Spec = OffloadCommand;

    fn kind(&self) -> TaskKind {
        TaskKind::OFFLOAD
    }

    fn validate(&self, subject: &str, spec: &OffloadCommand) -> Result<(), Rejection> {
        crate::spec::validate(subject, spec)
    }

    /// The consumer, the providers it names (or a selector that chooses them), the
    /// namespace and its remote name.
    fn targets(&self, _subject: &str, spec: &OffloadCommand) -> ferry_task::Targets {
        let mut t = ferry_task::Targets::clusters(std::iter::once(spec.cluster.clone()).chain(spec.clusters.iter().cloned()))
            .with_namespaces(std::iter::once(spec.namespace.clone()).chain(spec.remote_namespace_name.clone()));
        if !spec.cluster_selector.is_empty() {
            t = t.chosen_at_run("a cluster selector (the peered clusters whose labels match)");
        }
        t
    }

    /// One plan per operation; every step has the same policy.
    fn plan(&self, c: &OffloadCommand) -> Vec<Arc<dyn Step<OffloadCommand>>> {
        let (i, p) = (&self.inner, policy(c));
        // the namespace; the offloading now; the targets peered and Ready (burst: the Deployment, the candidates)
        let check: Arc<dyn Step<OffloadCommand>> = Arc::new(OffloadCheck { inner: i.clone(), policy: p.clone() });
        match c.operation {
            OffloadOperation::Offload => vec![
                check,
                Arc::new(OffloadStep { inner: i.clone(), policy: p.clone() }), // the offloading Ready on the targets; undo restores the previous one or none
                Arc::new(TwinsStep { inner: i.clone(), policy: p }),           // the twin namespaces Active on the targets
            ],
            OffloadOperation::Unoffload => vec![
                check,
                Arc::new(RemoveStep { inner: i.clone(), policy: p }), // the offloading and its twins gone; undo restores it
            ],
            OffloadOperation::Burst => vec![
                check,
                Arc::new(ScaleStep { inner: i.clone(), policy: p.clone() }),   // the replicas wanted, each pod placed or unschedulable; undo restores the replicas
                Arc::new(PlaceStep { inner: i.clone(), policy: p.clone() }),   // the overflow to the nearest candidates with room
                Arc::new(OffloadStep { inner: i.clone(), policy: p.clone() }), // the offloading toward those; undo as an offload's
                Arc::new(RespawnStep { inner: i.clone(), policy: p.clone() }), // the Pending overflow created again under Liqo's pod webhook
                Arc::new(ReadyStep { inner: i.clone(), policy: p }),           // every replica Ready, wherever it runs
            ],
        }
    }

    /// `ferry_cluster_watches_failing{cluster}`: the clusters this worker waits on whose
    /// API servers do not answer its watches.
    fn gauges(&self) -> Vec<ferry_task::gauges::GaugeFamily> {
        self.inner.cfg.watches.gauges()
    }
}

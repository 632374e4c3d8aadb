//! `resolve-clusters`: the clusters to score (the command's list, or the members of its
//! ManagedClusterSet, by the set's label or label selector as OCM resolves them) and which
//! of them the OCM hub accepted (only those have a namespace on the hub for their
//! AddOnPlacementScore and the benchmark's ManifestWork); a cluster the policy cannot reach
//! fails with UNKNOWN_CLUSTER. It changes nothing, so its undo has nothing to put back.

use std::sync::Arc;
use std::time::Duration;

use ferry_kube::kinds::ManagedCluster;
use ferry_kube::step_errors::{cluster_set_err, hub_err, kube_err};
use ferry_kube::{ClusterError, cluster_sets};
use ferry_task::{CheckStep, Output, StepContext, StepError, StepPolicy, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use kube::api::Api;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::handler::Inner;
use crate::spec::{ScoreClusters, ScorePolicy};

/// The `resolve-clusters` step's output.
pub const RESOLVE: Output<Resolved> = Output::new("resolve-clusters");

/// Output of the resolve step.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Resolved {
    /// The clusters to score.
    pub clusters: Vec<String>,
    /// Those the OCM hub accepted (they get an AddOnPlacementScore): a ManagedCluster
    /// not accepted yet has no namespace on the hub (ocm
    /// `pkg/registration/hub/managedcluster/controller.go` makes it on acceptance).
    pub ocm: Vec<String>,
}

/// The `resolve-clusters` step.
pub struct Resolve {
    inner: Arc<Inner>,
}

impl Resolve {
    pub(crate) fn new(inner: Arc<Inner>) -> Self {
        Self { inner }
    }
}

impl CheckStep<ScoreClusters> for Resolve {
    fn name(&self) -> &str {
        RESOLVE.step()
    }

    fn policy(&self) -> StepPolicy {
        StepPolicy { timeout: Duration::from_secs(60), ..StepPolicy::default() }
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, ScoreClusters>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let spec = cx.spec;
            let hub = self.inner.cfg.clusters.hub().clone();
            let mcs: Api<ManagedCluster> = Api::all(hub.clone());
            let clusters = match &spec.cluster_set {
                Some(set) if spec.clusters.is_empty() => {
                    // The set's members as OCM resolves them: by its label or its label
                    // selector (`global` selects every cluster) (sdk-go
                    // `pkg/apis/cluster/v1beta2/managedclusterset.go`, `GetClustersFromClusterSet`).
                    let unresolved = |e| cluster_set_err(codes::NO_CLUSTERS, e);
                    let Some(found) = cluster_sets::get(&hub, set).await.map_err(unresolved)? else {
                        return Err(StepError::permanent(codes::NO_CLUSTERS, format!("ManagedClusterSet {set:?} has no member clusters: it does not exist on the hub")));
                    };
                    let mut names: Vec<String> = found.clusters(&hub).await.map_err(unresolved)?.into_iter().filter_map(|m| m.metadata.name).collect();
                    names.sort();
                    if names.is_empty() {
                        return Err(StepError::permanent(codes::NO_CLUSTERS, format!("ManagedClusterSet {set:?} has no member clusters ({})", found.describe())));
                    }
                    names
                }
                _ => spec.clusters.clone(),
            };
            let (mut ocm, mut waiting) = (Vec::new(), Vec::new());
            for c in &clusters {
                let mc = mcs.get_opt(c).await.map_err(hub_err)?;
                match &mc {
                    Some(mc) if mc.accepted() => ocm.push(c.clone()),
                    Some(_) => waiting.push(c.as_str()),
                    None => {}
                }
                if spec.policy == ScorePolicy::Benchmark && !ocm.contains(c) {
                    let why = if mc.is_some() { "registered with OCM but not accepted by the hub yet" } else { "not registered with OCM" };
                    return Err(StepError::permanent(codes::UNKNOWN_CLUSTER, format!("cluster {c:?} is {why}: the benchmark runs through a ManifestWork in its namespace on the hub")));
                }
                if matches!(spec.policy, ScorePolicy::ResourceUsage | ScorePolicy::WorstFit | ScorePolicy::BestFit) {
                    match self.inner.cfg.clusters.kubeconfig_secret(c).await {
                        Ok(_) => {}
                        Err(e @ (ClusterError::Unknown { .. } | ClusterError::Ambiguous { .. })) => {
                            return Err(StepError::permanent(codes::UNKNOWN_CLUSTER, e.to_string()));
                        }
                        Err(e) => return Err(kube_err(codes::HUB_API, e)),
                    }
                }
            }
            let waiting = if waiting.is_empty() { String::new() } else { format!("; not accepted by the hub yet (no placement score): {}", waiting.join(", ")) };
            cx.progress(100, format!("{} cluster(s), {} accepted by the OCM hub{waiting}", clusters.len(), ocm.len()));
            RESOLVE.value(&Resolved { clusters, ocm })
        }
        .boxed()
    }
}

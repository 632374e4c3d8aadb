//! `cluster-set`: the ManagedClusterSet both clusters join (created when it did not
//! exist, labelled for the pair) and each ManagedCluster's set label. Undo puts each
//! cluster's label back as `check` found it and deletes the set only if this peering made
//! it.

use std::sync::Arc;

use ferry_kube::HUB;
use ferry_kube::kinds::ManagedCluster;
use ferry_kube::step_errors::hub_err;
use ferry_task::{Output, Step, StepContext, StepError};
use futures::FutureExt;
use futures::future::BoxFuture;
use kube::api::{Api, Patch, PatchParams};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::submariner_check::SETS;
use crate::handler::Inner;
use crate::spec::PeerClusters;
use crate::submariner::CLUSTERSET_LABEL;
use crate::{liqo, submariner};

/// The `cluster-set` step's output.
pub const CLUSTER_SET: Output<Joined> = Output::new("cluster-set");

/// Output of `cluster-set`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Joined {
    /// The ManagedClusterSet both are in.
    pub set: String,
}

/// The `cluster-set` step.
pub(crate) struct ClusterSet(pub(crate) Arc<Inner>);

impl ClusterSet {
    async fn label(&self, cluster: &str, set: Option<&str>) -> Result<(), StepError> {
        let api: Api<ManagedCluster> = Api::all(self.0.cfg.clusters.hub().clone());
        let patch = json!({"metadata": {"labels": {CLUSTERSET_LABEL: set}}});
        api.patch(cluster, &PatchParams::default(), &Patch::Merge(&patch)).await.map_err(hub_err)?;
        Ok(())
    }
}

impl Step<PeerClusters> for ClusterSet {
    fn name(&self) -> &str {
        CLUSTER_SET.step()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, PeerClusters>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let (p, s) = (cx.spec, SETS.required(cx)?);
            if !s.existed {
                self.0.apply(HUB, &submariner::cluster_set(&s.target, &liqo::pair_label(&p.a, &p.b))).await?;
            }
            self.label(&p.a, Some(&s.target)).await?;
            self.label(&p.b, Some(&s.target)).await?;
            cx.progress(100, format!("{} and {} are in ManagedClusterSet {}", p.a, p.b, s.target));
            CLUSTER_SET.value(&Joined { set: s.target })
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, PeerClusters>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            let (p, s) = (cx.spec, SETS.required(cx)?);
            self.label(&p.a, s.a.as_deref()).await?;
            self.label(&p.b, s.b.as_deref()).await?;
            if !s.existed {
                let pair = liqo::pair_label(&p.a, &p.b);
                self.0.delete_own(HUB, &submariner::cluster_set(&s.target, &pair), &pair).await?;
            }
            Ok(())
        }
        .boxed()
    }
}

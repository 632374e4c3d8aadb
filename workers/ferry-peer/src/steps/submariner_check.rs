//! `check` of a Submariner peering: both clusters are ManagedClusters of the hub and the
//! submariner add-on is installed (either missing rejects the command), both are
//! Available within the timeout, and which ManagedClusterSet they join (the command's,
//! else the one both are in, else `submariner`). Its output keeps each cluster's set
//! before, so a revert puts them back. It changes nothing.

use std::sync::Arc;

use ferry_kube::kinds::ManagedCluster;
use ferry_kube::step_errors::{hub_err, kube_err, wait_err};
use ferry_kube::{Check, HUB};
use ferry_task::{CheckStep, Output, StepContext, StepError, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use kube::api::Api;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::handler::Inner;
use crate::spec::PeerClusters;
use crate::submariner::CLUSTERSET_LABEL;

/// The Submariner `check` step's output.
pub const SETS: Output<Sets> = Output::new("check");

/// Output of the Submariner `check`: each cluster's set before, and the set to join.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Sets {
    /// `a`'s set label before (none: no label).
    pub a: Option<String>,
    /// `b`'s.
    pub b: Option<String>,
    /// The set both join.
    pub target: String,
    /// The set existed before.
    pub existed: bool,
}

/// The `check` step of a Submariner peering.
pub(crate) struct SubmarinerCheck(pub(crate) Arc<Inner>);

impl CheckStep<PeerClusters> for SubmarinerCheck {
    fn name(&self) -> &str {
        SETS.step()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, PeerClusters>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let p = cx.spec;
            let hub = self.0.cfg.clusters.hub().clone();
            let mcs: Api<ManagedCluster> = Api::all(hub.clone());
            let mut labels = Vec::new();
            for c in [&p.a, &p.b] {
                let Some(mc) = mcs.get_opt(c).await.map_err(hub_err)? else {
                    return Err(StepError::rejected(codes::UNKNOWN_CLUSTER, format!("{c} is not a ManagedCluster of the hub")));
                };
                labels.push(mc.metadata.labels.as_ref().and_then(|l| l.get(CLUSTERSET_LABEL)).cloned());
            }
            let gvk = kube::core::GroupVersionKind::gvk("addon.open-cluster-management.io", "v1alpha1", "ClusterManagementAddOn");
            let cma = self.0.cfg.clusters.api(HUB, &gvk, None).await.map_err(|e| kube_err(codes::HUB_API, e))?;
            if cma.get_opt("submariner").await.map_err(hub_err)?.is_none() {
                return Err(StepError::rejected(codes::SUBMARINER_MISSING, "the hub has no ClusterManagementAddOn submariner: install the submariner-addon first"));
            }
            for c in [&p.a, &p.b] {
                self.0
                    .cfg
                    .watches
                    .wait_object::<ManagedCluster, ()>(HUB, &hub, None, c, p.timeout(), |m| match m {
                        Some(m) if m.condition("ManagedClusterConditionAvailable") == Some("True") => Check::Done(()),
                        _ => Check::Pending("not Available".into()),
                    })
                    .await
                    .map_err(|e| wait_err(codes::CLUSTER_NOT_READY, e))?;
            }
            let target = match (&p.cluster_set, &labels[0], &labels[1]) {
                (Some(s), _, _) => s.clone(),
                (None, Some(x), Some(y)) if x == y => x.clone(),
                _ => "submariner".to_owned(),
            };
            let gvk = kube::core::GroupVersionKind::gvk("cluster.open-cluster-management.io", "v1beta2", "ManagedClusterSet");
            let api = self.0.cfg.clusters.api(HUB, &gvk, None).await.map_err(|e| kube_err(codes::HUB_API, e))?;
            let existed = api.get_opt(&target).await.map_err(hub_err)?.is_some();
            cx.progress(100, format!("both clusters available; they join ManagedClusterSet {target}"));
            SETS.value(&Sets { a: labels[0].clone(), b: labels[1].clone(), target, existed })
        }
        .boxed()
    }
}

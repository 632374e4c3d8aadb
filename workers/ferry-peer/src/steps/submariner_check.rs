//! `check` of a Submariner peering, before anything is written; each missing piece rejects
//! the command and says what it is: both clusters are ManagedClusters of the hub (a
//! klusterlet registered them); the submariner add-on is installed (its
//! ClusterManagementAddOn and its Broker CRD); OLM runs on both clusters, when Ferry can
//! reach them (the add-on installs Submariner's operator as an OLM Subscription,
//! stolostron/submariner-addon `pkg/hub/submarineragent/manifests/operator/submariner-operator-subscription.yaml`);
//! the set to join selects its clusters by the exclusive set label (the add-on's broker
//! controller serves no other, `pkg/hub/submarinerbroker/controller.go`). Then both
//! clusters are Available within the timeout (their klusterlets report), and which
//! ManagedClusterSet they join (the command's, else the one both are in unless it is the
//! hub's `default`, else `submariner`). Its output keeps each cluster's set before, so a
//! revert puts them back.

use std::sync::Arc;

use ferry_kube::kinds::ManagedCluster;
use ferry_kube::step_errors::{api_err, hub_err, kube_err, wait_err};
use ferry_kube::{Check, ClusterError, HUB};
use ferry_task::{CheckStep, Output, StepContext, StepError, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use kube::api::Api;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::handler::Inner;
use crate::spec::PeerClusters;
use crate::submariner::{CLUSTERSET_LABEL, OLM_GROUP};

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
                    return Err(StepError::rejected(codes::UNKNOWN_CLUSTER, format!("{c} is not a ManagedCluster of the hub: no klusterlet registered it (join it first, as `clusteradm join` does)")));
                };
                labels.push(mc.metadata.labels.as_ref().and_then(|l| l.get(CLUSTERSET_LABEL)).cloned());
            }
            let gvk = kube::core::GroupVersionKind::gvk("addon.open-cluster-management.io", "v1alpha1", "ClusterManagementAddOn");
            let cma = self.0.cfg.clusters.api(HUB, &gvk, None).await.map_err(|e| kube_err(codes::HUB_API, e))?;
            if cma.get_opt("submariner").await.map_err(hub_err)?.is_none() {
                return Err(StepError::rejected(codes::SUBMARINER_MISSING, "the hub has no ClusterManagementAddOn submariner: install the submariner-addon first"));
            }
            // The add-on installs the Broker CRD (`pkg/hub/submarinerbroker/brokerCRDsController.go`).
            match self.0.cfg.clusters.api(HUB, &kube::core::GroupVersionKind::gvk("submariner.io", "v1alpha1", "Broker"), None).await {
                Ok(_) => {}
                Err(ClusterError::NotServed { .. }) => {
                    return Err(StepError::rejected(codes::SUBMARINER_MISSING, "the hub does not serve submariner.io/v1alpha1 Broker: the submariner-addon installs that CRD; is the add-on running?"));
                }
                Err(e) => return Err(kube_err(codes::HUB_API, e)),
            }
            for c in [&p.a, &p.b] {
                self.olm(cx, c).await?;
            }
            for c in [&p.a, &p.b] {
                self.0
                    .cfg
                    .watches
                    .wait_object::<ManagedCluster, ()>(HUB, &hub, None, c, p.timeout(), |m| match m {
                        Some(m) if m.condition("ManagedClusterConditionAvailable") == Some("True") => Check::Done(()),
                        Some(m) => Check::Pending(match ferry_kube::kinds::condition_message(&m.status, "ManagedClusterConditionAvailable") {
                            Some(said) => format!("{said}: is its klusterlet running?"),
                            None => "no ManagedClusterConditionAvailable: no klusterlet has reported for it (only a klusterlet sets it)".into(),
                        }),
                        None => Check::Pending("no longer a ManagedCluster".into()),
                    })
                    .await
                    .map_err(|e| wait_err(codes::CLUSTER_NOT_READY, e))?;
            }
            let target = implicit_set(p.cluster_set.as_deref(), labels[0].as_deref(), labels[1].as_deref());
            let gvk = kube::core::GroupVersionKind::gvk("cluster.open-cluster-management.io", "v1beta2", "ManagedClusterSet");
            let api = self.0.cfg.clusters.api(HUB, &gvk, None).await.map_err(|e| kube_err(codes::HUB_API, e))?;
            let set = api.get_opt(&target).await.map_err(hub_err)?;
            let selector = set.as_ref().and_then(|s| s.data.pointer("/spec/clusterSelector/selectorType")).and_then(Value::as_str).unwrap_or("");
            if !selector.is_empty() && selector != "ExclusiveClusterSetLabel" {
                return Err(StepError::rejected(
                    codes::BAD_SPEC,
                    format!("ManagedClusterSet {target} selects its clusters by {selector}: the submariner-addon makes a broker only for sets of the ExclusiveClusterSetLabel type"),
                ));
            }
            let existed = set.is_some();
            cx.progress(100, format!("both clusters available; they join ManagedClusterSet {target}"));
            SETS.value(&Sets { a: labels[0].clone(), b: labels[1].clone(), target, existed })
        }
        .boxed()
    }
}

/// The set a pair joins: the command's, else the one both are in, else `submariner`.
/// `default` is nobody's choice: a real hub puts every cluster without a set there (its
/// mutating webhook), so two clusters found only there get a set of their own instead of
/// a broker shared with the whole fleet.
fn implicit_set(asked: Option<&str>, a: Option<&str>, b: Option<&str>) -> String {
    match (asked, a, b) {
        (Some(s), _, _) => s.to_owned(),
        (None, Some(x), Some(y)) if x == y && x != ferry_kube::vocab::ocm::DEFAULT_CLUSTER_SET => x.to_owned(),
        _ => "submariner".to_owned(),
    }
}

impl SubmarinerCheck {
    /// Rejects the command when `cluster` does not serve OLM's Subscription. A cluster
    /// Ferry cannot reach directly (no kubeconfig) is not checked here: the add-on never
    /// reports the operator there, and the `addon` step's deadline says so.
    async fn olm(&self, cx: &StepContext<'_, PeerClusters>, cluster: &str) -> Result<(), StepError> {
        let client = match self.0.cfg.clusters.client(cluster).await {
            Ok(c) => c,
            Err(ClusterError::Unknown { .. }) => {
                cx.progress(0, format!("OLM on {cluster} not checked: Ferry has no kubeconfig of it (without OLM the add-on's agent never reports the operator)"));
                return Ok(());
            }
            Err(e) => return Err(kube_err(codes::CLUSTER_API, e)),
        };
        let gvk = kube::core::GroupVersionKind::gvk(OLM_GROUP, "v1alpha1", "Subscription");
        match kube::discovery::pinned_kind(&client, &gvk).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Err(no_olm(cluster)),
            Err(kube::Error::Discovery(_)) => Err(no_olm(cluster)),
            Err(e) => Err(api_err(cluster)(e)),
        }
    }
}

fn no_olm(cluster: &str) -> StepError {
    StepError::rejected(
        codes::SUBMARINER_MISSING,
        format!(
            "{cluster} has no OLM (it does not serve {OLM_GROUP}/v1alpha1 Subscription): the submariner add-on installs Submariner's operator on each cluster through an OLM Subscription; install OLM on {cluster} first"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::implicit_set;

    #[test]
    fn a_pair_joins_the_asked_set_or_a_shared_one_but_never_default_unasked() {
        assert_eq!(implicit_set(Some("tunnels"), Some("blue"), Some("blue")), "tunnels");
        assert_eq!(implicit_set(None, Some("blue"), Some("blue")), "blue");
        assert_eq!(implicit_set(None, Some("blue"), Some("red")), "submariner");
        assert_eq!(implicit_set(None, Some("default"), Some("default")), "submariner");
        assert_eq!(implicit_set(Some("default"), Some("default"), Some("default")), "default");
        assert_eq!(implicit_set(None, None, None), "submariner");
    }
}

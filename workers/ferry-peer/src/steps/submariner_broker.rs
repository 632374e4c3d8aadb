//! `broker`: the Broker `submariner-broker` of the set both clusters join, in its broker
//! namespace `<set>-broker`. The add-on's agent controller deploys nothing without it
//! (`SubmarinerBrokerConfigApplied=False`, reason `BrokerConfigMissing`:
//! stolostron/submariner-addon `pkg/hub/submarineragent/controller.go`); the add-on does
//! not make it (a user does: `scripts/demo.sh`), so the peering does, when absent. The
//! namespace is the add-on's: its broker controller makes it for the set
//! (`pkg/hub/submarinerbroker/controller.go`) and deletes it with the set, so the step
//! waits for it and never makes or deletes it. A Broker this step makes carries the pair's
//! label; undo deletes only that, never a Broker that was there before, and not while
//! other clusters of the set keep their `submariner` add-on (it is theirs too then; the
//! add-on itself deletes the set's Broker when the set's last add-on goes:
//! `deleteGlobalBrokerResourcesIfNecessary`).

use std::sync::Arc;

use ferry_kube::step_errors::{hub_err, kube_err, wait_err};
use ferry_kube::{Check, ClusterError, HUB};
use ferry_task::{Output, Step, StepContext, StepError, StepPolicy, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Namespace;
use ferry_kube::kinds::{ManagedCluster, ManagedClusterAddOn};
use kube::api::{Api, DynamicObject, PostParams};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::submariner_check::SETS;
use crate::handler::Inner;
use crate::liqo::{self, PEERING_LABEL};
use crate::spec::PeerClusters;
use crate::submariner::{self, BROKER};

/// The `broker` step's output.
pub const BROKER_STEP: Output<BrokerMade> = Output::new("broker");

/// Output of `broker`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BrokerMade {
    /// The set's broker namespace.
    pub namespace: String,
    /// This peering made the Broker (else it was there).
    pub created: bool,
}

/// The `broker` step.
pub(crate) struct SubmarinerBroker(pub(crate) Arc<Inner>, pub(crate) StepPolicy);

impl Step<PeerClusters> for SubmarinerBroker {
    fn name(&self) -> &str {
        BROKER_STEP.step()
    }

    fn policy(&self) -> StepPolicy {
        self.1.clone()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, PeerClusters>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let (p, s) = (cx.spec, SETS.required(cx)?);
            let ns = submariner::broker_namespace(&s.target);
            let hub = self.0.cfg.clusters.hub().clone();
            let set = s.target.clone();
            self.0
                .cfg
                .watches
                .wait_object::<Namespace, ()>(HUB, &hub, None, &ns, p.timeout(), |n| match n {
                    Some(n) if n.metadata.deletion_timestamp.is_none() => Check::Done(()),
                    Some(_) => Check::Pending("being deleted (the set's earlier broker namespace); the add-on makes it again".into()),
                    None => Check::Pending(format!("the submariner-addon has not made it: its broker controller does for ManagedClusterSet {set}")),
                })
                .await
                .map_err(|e| wait_err(codes::SUBMARINER_NOT_AVAILABLE, e))?;
            cx.progress(30, format!("the add-on made broker namespace {ns}"));
            let pair = liqo::pair_label(&p.a, &p.b);
            let obj = submariner::broker(&s.target, &pair);
            let gvk = kube::core::GroupVersionKind::gvk("submariner.io", "v1alpha1", "Broker");
            let api = self.0.cfg.clusters.api(HUB, &gvk, Some(&ns)).await.map_err(|e| match e {
                e @ ClusterError::NotServed { .. } => StepError::permanent(codes::SUBMARINER_MISSING, format!("{e}: is the submariner-addon running?")),
                e => kube_err(codes::HUB_API, e),
            })?;
            let ours = |b: &DynamicObject| b.metadata.labels.as_ref().and_then(|l| l.get(PEERING_LABEL)).is_some_and(|v| *v == pair);
            let created = match api.get_opt(BROKER).await.map_err(hub_err)? {
                Some(b) => ours(&b),
                None => {
                    let b: DynamicObject = serde_json::from_value(obj).map_err(|e| StepError::permanent(codes::INTERNAL, format!("the Broker does not decode: {e}")))?;
                    match api.create(&PostParams { field_manager: Some(crate::handler::MANAGER.into()), ..Default::default() }, &b).await {
                        Ok(_) => true,
                        // Made meanwhile by someone else: theirs.
                        Err(kube::Error::Api(e)) if e.code == 409 => api.get_opt(BROKER).await.map_err(hub_err)?.is_some_and(|b| ours(&b)),
                        Err(e) => return Err(hub_err(e)),
                    }
                }
            };
            cx.progress(100, if created { format!("Broker {ns}/{BROKER} made") } else { format!("Broker {ns}/{BROKER} was there: left as it is") });
            BROKER_STEP.value(&BrokerMade { namespace: ns, created })
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, PeerClusters>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            let (p, s) = (cx.spec, SETS.required(cx)?);
            let users = self.users(p, &s.target).await?;
            if !users.is_empty() {
                cx.progress(100, format!("Broker of ManagedClusterSet {} kept: {} of the set use it", s.target, users.join(", ")));
                return Ok(());
            }
            let pair = liqo::pair_label(&p.a, &p.b);
            self.0.delete_own(HUB, &submariner::broker(&s.target, &pair), &pair).await
        }
        .boxed()
    }
}

impl SubmarinerBroker {
    /// The other clusters of `set` whose `submariner` add-on stays: while there are any,
    /// the set's Broker is theirs too (the add-on deletes it after the last one,
    /// `deleteGlobalBrokerResourcesIfNecessary`).
    async fn users(&self, p: &PeerClusters, set: &str) -> Result<Vec<String>, StepError> {
        let hub = self.0.cfg.clusters.hub().clone();
        let lp = kube::api::ListParams::default().labels(&format!("{}={set}", submariner::CLUSTERSET_LABEL));
        let mut users = Vec::new();
        for mc in Api::<ManagedCluster>::all(hub.clone()).list(&lp).await.map_err(hub_err)?.items {
            let name = mc.metadata.name.unwrap_or_default();
            if name == p.a || name == p.b {
                continue;
            }
            let addon = Api::<ManagedClusterAddOn>::namespaced(hub.clone(), &name).get_opt("submariner").await.map_err(hub_err)?;
            if addon.is_some_and(|a| a.metadata.deletion_timestamp.is_none()) {
                users.push(name);
            }
        }
        Ok(users)
    }
}

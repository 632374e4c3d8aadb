//! `config` (a SubmarinerConfig per cluster on the hub) and `addon` (the submariner
//! ManagedClusterAddOn per cluster; on undo waits until both are gone), as the
//! submariner-addon documents enabling Submariner through OCM. `addon` waits until the
//! add-on's agent says the tunnel is up on both clusters ([`submariner::addon_ready`]);
//! at the deadline it says, per cluster, what the add-on last said is missing (the
//! Broker, the agent, the operator OLM installs, the gateway's connections).

use ferry_kube::kinds::ManagedClusterAddOn;
use ferry_kube::step_errors::{hub_err, wait_err};
use ferry_kube::{Check, HUB};
use ferry_task::{Output, StepError, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use kube::api::Api;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::liqo_check::Ids;
use super::objects::{ObjectSet, Progress};
use crate::handler::Inner;
use crate::spec::PeerClusters;
use crate::{liqo, submariner};

/// The `addon` step's output.
pub const ADDON: Output<Available> = Output::new("addon");

/// Output of `addon`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Available {
    /// The clusters whose add-on is Available.
    pub available: Vec<String>,
}

/// The `config` step's objects.
pub(crate) struct Config;

impl ObjectSet for Config {
    fn name(&self) -> &'static str {
        "config"
    }

    fn objects(&self, p: &PeerClusters, _: &Ids) -> Vec<(String, Value)> {
        let pair = liqo::pair_label(&p.a, &p.b);
        vec![(HUB.to_owned(), submariner::config(&p.a, &pair)), (HUB.to_owned(), submariner::config(&p.b, &pair))]
    }
}

/// The `addon` step's objects.
pub(crate) struct Addon;

impl ObjectSet for Addon {
    fn name(&self) -> &'static str {
        ADDON.step()
    }

    fn objects(&self, p: &PeerClusters, _: &Ids) -> Vec<(String, Value)> {
        let pair = liqo::pair_label(&p.a, &p.b);
        vec![(HUB.to_owned(), submariner::addon(&p.a, &pair)), (HUB.to_owned(), submariner::addon(&p.b, &pair))]
    }

    fn ready<'a>(&'a self, inner: &'a Inner, p: &'a PeerClusters, _: &'a Ids) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            // Both at once (a cluster's tunnel needs its peer's); a failure says what each lacks.
            match futures::future::join(up(inner, p, &p.a), up(inner, p, &p.b)).await {
                (Ok(()), Ok(())) => {}
                (Err(e), Ok(())) | (Ok(()), Err(e)) => return Err(e),
                (Err(x), Err(y)) => return Err(StepError { message: format!("{}; {}", x.message, y.message), ..x }),
            }
            ADDON.value(&Available { available: vec![p.a.clone(), p.b.clone()] })
        }
        .boxed()
    }

    fn gone<'a>(&'a self, inner: &'a Inner, p: &'a PeerClusters, _: &'a Ids, _: Progress<'a>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            let hub = inner.cfg.clusters.hub().clone();
            for c in [&p.a, &p.b] {
                inner
                    .cfg
                    .watches
                    .wait_deleted::<ManagedClusterAddOn>(HUB, &hub, Some(c), "submariner", inner.cfg.removal_timeout)
                    .await
                    .map_err(|e| wait_err(codes::REMOVAL, e))?;
            }
            Ok(())
        }
        .boxed()
    }
}

/// Waits until the add-on says the tunnel is up on `c`.
async fn up(inner: &Inner, p: &PeerClusters, c: &str) -> Result<(), StepError> {
    let hub = inner.cfg.clusters.hub().clone();
    // The shared watch may still hold an add-on an earlier peering removed: only the one
    // there now (by uid, read fresh) counts.
    let now = Api::<ManagedClusterAddOn>::namespaced(hub.clone(), c).get_opt("submariner").await.map_err(hub_err)?;
    let uid = now.and_then(|a| a.metadata.uid);
    inner
        .cfg
        .watches
        .wait_object::<ManagedClusterAddOn, ()>(HUB, &hub, Some(c), "submariner", p.timeout(), |a| match a {
            Some(a) if a.metadata.uid != uid => Check::Pending("the watch has not seen the current add-on yet".into()),
            Some(a) => match submariner::addon_ready(&a.status) {
                Ok(()) => Check::Done(()),
                Err(why) => Check::Pending(why),
            },
            None => Check::Pending("not seen yet".into()),
        })
        .await
        .map_err(|e| wait_err(codes::SUBMARINER_NOT_AVAILABLE, e))
}

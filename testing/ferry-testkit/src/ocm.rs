//! Test-bed members joined to the hub the way a platform team joins a cluster, through
//! the same flow the create-cluster worker runs ([`ferry_kube::ocm_join`], `clusteradm
//! join` + `accept`): the klusterlet operator (CRD) installed, a bootstrap kubeconfig and
//! Klusterlet on the member, the agent's CSR approved, the cluster accepted into its set;
//! done when the emulated klusterlet reports it Available. Needs the bed's emulated OCM.

use std::time::Duration;

use anyhow::Context;
use ferry_fleet::Fleet;
use ferry_kube::ocm_join;
use kube::api::Api;
use kube::runtime::wait::await_condition;
use serde_json::json;

use ferry_kube::vocab::ocm::CLUSTERSET_LABEL;

/// How long a join may take: a few seconds on a quiet machine; the bound is for a loaded one.
const JOIN_LIMIT: Duration = Duration::from_secs(120);

/// Joins `clusters` of `fleet` to its hub in ManagedClusterSet `set` (none when empty; the
/// set made first when missing, as `clusteradm create clusterset`: OCM resolves a set's
/// members only from the set) and waits until each is Available.
pub async fn join(fleet: &Fleet, clusters: &[&str], set: &str) -> anyhow::Result<()> {
    let hub = fleet.hub().client().await?;
    if !set.is_empty() && ferry_kube::cluster_sets::get(&hub, set).await?.is_none() {
        crate::cluster::cluster_set(&hub, set).await?;
    }
    for c in clusters {
        let member = fleet.cluster(c).with_context(|| format!("no cluster {c} in the fleet"))?.client().await?;
        ferry_fleet::crds::install(&member, vec![ferry_fleet::emulated_registration::klusterlet_crd()]).await?;
        let bootstrap = ocm_join::bootstrap_kubeconfig(&hub, None).await?;
        let on_member = ferry_kube::Clusters::new(member);
        for obj in ocm_join::agent_objects(c, &bootstrap) {
            on_member.apply(ferry_kube::HUB, &obj, "ferry-demo").await.with_context(|| format!("joining {c}"))?;
        }
    }
    let mcs: Api<ferry_kube::kinds::ManagedCluster> = Api::all(hub.clone());
    for c in clusters {
        // clusteradm accept --wait: the agent's CSR, then acceptance into the set.
        tokio::time::timeout(JOIN_LIMIT, async {
            let mut every = tokio::time::interval(Duration::from_millis(250));
            loop {
                every.tick().await;
                if mcs.get_opt(c).await?.is_some() && ocm_join::approve_csrs(&hub, c).await? {
                    let labels = if set.is_empty() { json!({}) } else { json!({CLUSTERSET_LABEL: set}) };
                    return ocm_join::accept(&hub, c, &labels).await.map_err(anyhow::Error::from);
                }
            }
        })
        .await
        .with_context(|| format!("the klusterlet of {c} made no ManagedCluster and CSR within {JOIN_LIMIT:?}"))??;
    }
    for c in clusters {
        // Available, and the hub's taint controller has taken its availability taint off:
        // until then no Placement (and no plan wave) selects it.
        let placeable = |m: Option<&ferry_kube::kinds::ManagedCluster>| m.is_some_and(|m| m.not_placeable().is_none());
        tokio::time::timeout(JOIN_LIMIT, await_condition(mcs.clone(), c, placeable))
            .await
            .with_context(|| format!("{c} was not Available and untainted within {JOIN_LIMIT:?} of its acceptance"))??;
    }
    Ok(())
}

//! `register` (the last step of a create with `ocm.enabled`): the new cluster joins the
//! hub as `clusteradm join` + `clusteradm accept` do ([`ferry_kube::ocm_join`]): a
//! bootstrap kubeconfig and the Klusterlet on the cluster (its operator is the
//! `klusterlet` add-on, installed just before), then, once the agent has made its
//! ManagedCluster and CSR, the CSR approved and the cluster accepted with Ferry's labels;
//! done when the agent reports it Available (only a klusterlet does:
//! `pkg/registration/hub/lease/controller.go` never sets True). Its undo deregisters
//! (the ManagedCluster deleted and gone while the klusterlet still runs, then the
//! Klusterlet and bootstrap Secret removed), and removes the cluster namespace OCM made on
//! the hub for it if the create caused it (OCM keeps it after the ManagedCluster is gone).
//! `deregister` (a delete's, before `delete`): the same deregistration; its undo accepts
//! the cluster again while its Cluster and klusterlet still stand.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_kube::WaitError;
use ferry_kube::kinds::{ManagedCluster, ManifestWork};
use ferry_kube::ocm_join::{self, JoinError};
use ferry_kube::step_errors::{hub_err, kube_err};
use ferry_kube::{Check, HUB};
use ferry_task::{Output, Step, StepContext, StepError, StepPolicy, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{check, delete, own_cluster, own_managed_cluster, wait_err, wait_policy};
use crate::handler::Inner;
use crate::render::{self, MANAGER};
use crate::spec::ClusterCommand;

/// The catalog add-on that installs the klusterlet operator.
pub const KLUSTERLET_ADDON: &str = "klusterlet";

/// How often the accept looks for the agent's CSR (`clusteradm accept --wait` polls too).
const CSR_POLL: Duration = Duration::from_secs(1);

fn join_err(e: JoinError) -> StepError {
    match e {
        JoinError::Hub { source, .. } => hub_err(source),
        e @ JoinError::NotAHub(_) => StepError::permanent(codes::OCM_MISSING, e.to_string()),
        e @ JoinError::SeveralRequesters { .. } => StepError::permanent(codes::OCM_CSR_CONFLICT, e.to_string()),
    }
}

/// The `register` step's output.
pub const REGISTER: Output<Registered> = Output::new("register");

/// Output of `register`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Registered {
    /// The ManagedCluster's name (the cluster's).
    pub managed_cluster: String,
    /// The ManagedClusterSet it joined (`default` when the command names none).
    pub cluster_set: String,
}

/// The `deregister` step's output.
pub const DEREGISTER: Output<Deregistered> = Output::new("deregister");

/// Output of `deregister`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Deregistered {
    /// A ManagedCluster was removed (false: the cluster was not registered).
    pub removed: bool,
}

/// Deletes Ferry's ManagedCluster of `cmd` (or one its klusterlet made that was never
/// accepted) and waits until it is gone, then removes the klusterlet's Klusterlet and
/// bootstrap Secret; false when there was no ManagedCluster.
///
/// In this order because the hub's GC controller holds a deleted ManagedCluster (finalizer
/// `cluster.open-cluster-management.io/resource-cleanup`) until the ManagedClusterAddOns and
/// ManifestWorks of its namespace are gone (ocm `pkg/registration/hub/gc/controller.go`,
/// `gc_resources.go`; `pkg/registration/hub/manager.go`, `GCResourceList`), and only the
/// cluster's work agent takes a ManifestWork's finalizer off
/// (`pkg/work/spoke/controllers/finalizercontroller/manifestwork_finalize_controller.go`):
/// with the klusterlet (and so its work agent) removed first, one ManifestWork a deploy left
/// there holds the ManagedCluster for ever. The running agent does not make the deleted
/// ManagedCluster again: only a bootstrapping agent creates it (`pkg/registration/spoke/spokeagent.go`).
async fn deregister(inner: &Inner, cmd: &ClusterCommand) -> Result<bool, StepError> {
    let hub = inner.hub();
    let api: Api<ManagedCluster> = Api::all(hub.clone());
    let own = own_managed_cluster(inner, cmd).await?.is_some();
    let pending = || async {
        Ok::<_, StepError>(api.get_opt(&cmd.name).await.map_err(hub_err)?.is_some_and(|m| {
            m.metadata.labels.as_ref().is_none_or(|l| !l.contains_key(render::NAMESPACE_LABEL)) && m.spec.get("hubAcceptsClient").and_then(Value::as_bool) != Some(true)
        }))
    };
    let removed = own || pending().await?;
    if removed {
        match api.delete(&cmd.name, &Default::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(hub_err(e)),
        }
        wait_managed_cluster_gone(inner, &cmd.name).await?;
    }
    unjoin(inner, cmd).await?;
    Ok(removed)
}

/// Waits (`removal_timeout`) until ManagedCluster `name` is gone. At the deadline the error
/// names the ManifestWorks still in its namespace (names only): what holds it when the
/// cluster's work agent does not finalize them.
async fn wait_managed_cluster_gone(inner: &Inner, name: &str) -> Result<(), StepError> {
    let hub = inner.hub();
    match inner.cfg.watches.wait_deleted::<ManagedCluster>(HUB, &hub, None, name, inner.cfg.removal_timeout).await {
        Ok(()) => Ok(()),
        Err(e @ WaitError::Timeout { .. }) => {
            let works = match Api::<ManifestWork>::namespaced(hub, name).list(&Default::default()).await {
                Ok(l) => l.items.into_iter().filter_map(|w| w.metadata.name).collect::<Vec<_>>(),
                Err(e) => return Err(hub_err(e)),
            };
            let held = if works.is_empty() {
                "no ManifestWork is left in its namespace".to_owned()
            } else {
                format!("ManifestWorks left in its namespace, each waiting for the cluster's work agent to remove its finalizer: {}", works.join(", "))
            };
            Err(StepError::permanent(codes::DEADLINE_EXCEEDED, format!("ManagedCluster {name} was not removed: {e}; {held}")))
        }
        Err(e) => Err(wait_err(e)),
    }
}

/// Deletes OCM's cluster namespace `cluster` on the hub (only if OCM made it for this
/// cluster: its `open-cluster-management.io/cluster-name` label) and waits until it is gone.
async fn forget_cluster_namespace(inner: &Inner, cluster: &str) -> Result<(), StepError> {
    let hub = inner.hub();
    let api: Api<Namespace> = Api::all(hub.clone());
    let ocm_made = api.get_opt(cluster).await.map_err(hub_err)?.is_some_and(|n| {
        n.metadata.labels.as_ref().and_then(|l| l.get(ocm_join::CLUSTER_NAME_LABEL)).is_some_and(|v| v == cluster)
    });
    if !ocm_made {
        return Ok(());
    }
    match api.delete(cluster, &Default::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(e) => return Err(hub_err(e)),
    }
    inner.cfg.watches.wait_namespace_deleted(HUB, &hub, cluster, inner.cfg.removal_timeout).await.map_err(wait_err)
}

/// Removes the Klusterlet and the bootstrap Secret from the workload cluster (its
/// operator goes with the `klusterlet` add-on's undo); a cluster already gone is fine.
async fn unjoin(inner: &Inner, cmd: &ClusterCommand) -> Result<(), StepError> {
    let Ok(_) = inner.cfg.clusters.client(&cmd.name).await else { return Ok(()) };
    for obj in ocm_join::agent_objects(&cmd.name, "").into_iter().skip(1) {
        match inner.cfg.clusters.delete(&cmd.name, &obj).await {
            Ok(_) => {}
            Err(e) if e.is_transient() => return Err(kube_err(codes::WORKLOAD_API, e)),
            // The Klusterlet's kind is not served (the operator is gone): nothing to remove.
            Err(_) => {}
        }
    }
    Ok(())
}

/// `clusteradm join`: a bootstrap kubeconfig (a one-hour token, never logged) and the
/// Klusterlet on the cluster.
async fn join(inner: &Inner, cmd: &ClusterCommand) -> Result<(), StepError> {
    let bootstrap = ocm_join::bootstrap_kubeconfig(&inner.hub(), inner.cfg.hub_apiserver.as_deref()).await.map_err(join_err)?;
    for obj in ocm_join::agent_objects(&cmd.name, &bootstrap) {
        inner.cfg.clusters.apply(&cmd.name, &obj, MANAGER).await.map_err(|e| kube_err(codes::WORKLOAD_API, e))?;
    }
    Ok(())
}

/// `clusteradm accept` until the deadline: the agent's ManagedCluster and CSR, the CSR
/// approved, the cluster accepted with Ferry's labels.
async fn accept(inner: &Inner, cmd: &ClusterCommand, deadline: Instant) -> Result<(), StepError> {
    let hub = inner.hub();
    let api: Api<ManagedCluster> = Api::all(hub.clone());
    let mut every = tokio::time::interval(CSR_POLL);
    loop {
        every.tick().await;
        let exists = api.get_opt(&cmd.name).await.map_err(hub_err)?.is_some();
        if exists && ocm_join::approve_csrs(&hub, &cmd.name).await.map_err(join_err)? {
            let labels = render::managed_cluster(cmd)["metadata"]["labels"].clone();
            return ocm_join::accept(&hub, &cmd.name, &labels).await.map_err(join_err);
        }
        if Instant::now() >= deadline {
            let what = if exists { "its CSR" } else { "its ManagedCluster" };
            return Err(StepError::permanent(
                codes::DEADLINE_EXCEEDED,
                format!("the klusterlet of {} made no {what} within {}s (is the klusterlet operator running?)", cmd.name, inner.cfg.registration_timeout.as_secs()),
            ));
        }
    }
}

/// The `register` step.
pub struct RegisterStep(pub(crate) Arc<Inner>);

impl Step<ClusterCommand> for RegisterStep {
    fn name(&self) -> &str {
        REGISTER.step()
    }

    fn policy(&self) -> StepPolicy {
        wait_policy(self.0.cfg.registration_timeout.max(self.0.cfg.removal_timeout))
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let cmd = cx.spec;
            let hub = self.0.hub();
            let deadline = Instant::now() + self.0.cfg.registration_timeout;
            join(&self.0, cmd).await?;
            cx.progress(20, format!("klusterlet of {} given a bootstrap kubeconfig; waiting for its CSR", cmd.name));
            accept(&self.0, cmd, deadline).await?;
            cx.progress(50, format!("CSR approved and ManagedCluster {} accepted; waiting for its agent to report it Available (and the hub to untaint it)", cmd.name));
            let mut seen = false;
            self.0
                .cfg
                .watches
                .wait_object::<ManagedCluster, ()>(HUB, &hub, None, &cmd.name, self.0.cfg.registration_timeout, |m| {
                    seen |= m.is_some();
                    match m {
                        None if seen => Check::Failed("the ManagedCluster was deleted".into()),
                        None => Check::Pending("the watch has not seen the ManagedCluster yet".into()),
                        // Available, and the hub has taken its availability taint off:
                        // until then no Placement selects the new cluster.
                        Some(m) => m.not_placeable().map_or(Check::Done(()), Check::Pending),
                    }
                })
                .await
                .map_err(wait_err)?;
            let set = cmd.ocm.cluster_set.clone().unwrap_or_else(|| "default".into());
            cx.progress(100, format!("registered with OCM in ManagedClusterSet {set}"));
            REGISTER.value(&Registered { managed_cluster: cmd.name.clone(), cluster_set: set })
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            deregister(&self.0, cx.spec).await?;
            if check::CHECK.get(cx).is_some_and(|c| !c.cluster_namespace_existed) {
                forget_cluster_namespace(&self.0, &cx.spec.name).await?;
            }
            Ok(())
        }
        .boxed()
    }
}

/// The `deregister` step of a delete.
pub struct DeregisterStep(pub(crate) Arc<Inner>);

impl Step<ClusterCommand> for DeregisterStep {
    fn name(&self) -> &str {
        DEREGISTER.step()
    }

    fn policy(&self) -> StepPolicy {
        wait_policy(self.0.cfg.removal_timeout)
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let removed = deregister(&self.0, cx.spec).await?;
            cx.progress(100, if removed { "ManagedCluster removed" } else { "not registered with OCM" });
            DEREGISTER.value(&Deregistered { removed })
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>, out: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            // Re-register while the Cluster still stands (the deletion failed before it began).
            let registered = delete::CHECK.get(cx).is_some_and(|c| c.registered);
            let removed = out.and_then(|o| o["removed"].as_bool()).unwrap_or(registered);
            if removed && own_cluster(&self.0, cx.spec).await.is_ok() {
                // A deletion under way is not called back: the cluster joins again once its
                // ManagedCluster is gone, through a klusterlet of its own (a running agent
                // keeps its identity and makes no ManagedCluster again,
                // `pkg/registration/spoke/spokeagent.go`).
                let api: Api<ManagedCluster> = Api::all(self.0.hub());
                let gone = match api.get_opt(&cx.spec.name).await.map_err(hub_err)? {
                    None => true,
                    Some(m) if m.metadata.deletion_timestamp.is_some() => {
                        wait_managed_cluster_gone(&self.0, &cx.spec.name).await?;
                        true
                    }
                    Some(_) => false,
                };
                if gone {
                    unjoin(&self.0, cx.spec).await?;
                }
                // Joined and accepted again, with the labels it had.
                let mut cmd = cx.spec.clone();
                cmd.ocm.enabled = true;
                join(&self.0, &cmd).await?;
                accept(&self.0, &cmd, Instant::now() + self.0.cfg.registration_timeout).await?;
            }
            Ok(())
        }
        .boxed()
    }
}

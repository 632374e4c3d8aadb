//! `register` (the last step of a create with `ocm.enabled`): the ManagedCluster applied
//! on the hub and Available (joined); its undo deregisters. `deregister` (a delete's, before
//! `delete`): Ferry's ManagedCluster of this namespace deleted and gone; its undo registers
//! the cluster again while its Cluster still stands.

use std::sync::Arc;

use ferry_kube::kinds::ManagedCluster;
use ferry_kube::step_errors::{hub_err, kube_err};
use ferry_kube::{Check, HUB};
use ferry_task::{Output, Step, StepContext, StepError, StepPolicy, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use kube::api::Api;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{delete, own_cluster, own_managed_cluster, wait_err, wait_policy};
use crate::handler::Inner;
use crate::render::{self, MANAGER};
use crate::spec::ClusterCommand;

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

/// The `register` step.
pub struct RegisterStep(pub(crate) Arc<Inner>);

/// Deletes Ferry's ManagedCluster of `cmd` and waits until it is gone; false when there
/// was none.
async fn deregister(inner: &Inner, cmd: &ClusterCommand) -> Result<bool, StepError> {
    let Some(_) = own_managed_cluster(inner, cmd).await? else {
        return Ok(false);
    };
    let hub = inner.hub();
    let api: Api<ManagedCluster> = Api::all(hub.clone());
    match api.delete(&cmd.name, &Default::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(hub_err(e)),
    }
    inner.cfg.watches.wait_deleted::<ManagedCluster>(HUB, &hub, None, &cmd.name, inner.cfg.removal_timeout).await.map_err(wait_err)?;
    Ok(true)
}

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
            self.0.cfg.clusters.apply(HUB, &render::managed_cluster(cmd), MANAGER).await.map_err(|e| kube_err(codes::HUB_API, e))?;
            cx.progress(30, format!("ManagedCluster {} accepted; waiting for it to join", cmd.name));
            let mut seen = false;
            self.0
                .cfg
                .watches
                .wait_object::<ManagedCluster, ()>(HUB, &hub, None, &cmd.name, self.0.cfg.registration_timeout, |m| {
                    seen |= m.is_some();
                    match m {
                        None if seen => Check::Failed("the ManagedCluster was deleted".into()),
                        None => Check::Pending("the watch has not seen the ManagedCluster yet".into()),
                        Some(m) if m.condition("ManagedClusterConditionAvailable") == Some("True") => Check::Done(()),
                        Some(m) => Check::Pending(
                            ferry_kube::kinds::condition_message(&m.status, "ManagedClusterConditionAvailable").unwrap_or_else(|| "not joined yet".into()),
                        ),
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
                let mut cmd = cx.spec.clone();
                cmd.ocm.enabled = true;
                self.0.cfg.clusters.apply(HUB, &render::managed_cluster(&cmd), MANAGER).await.map_err(|e| kube_err(codes::HUB_API, e))?;
            }
            Ok(())
        }
        .boxed()
    }
}

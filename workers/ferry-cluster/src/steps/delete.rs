//! A delete's steps besides `deregister` (in [`super::register`]). `check`: the Cluster is
//! Ferry's and not being deleted (else the command is rejected), and whether it is
//! registered with OCM; it changes nothing, so its undo has nothing to put back. `delete`:
//! the Cluster deleted and gone, then the templates Ferry rendered for it (by label); its
//! undo fails IRREVERSIBLE once the deletion began.

use std::collections::BTreeMap;
use std::sync::Arc;

use ferry_kube::kinds::CapiCluster;
use ferry_kube::step_errors::{hub_err, kube_err};
use ferry_kube::{ClusterError, HUB};
use ferry_task::{CheckStep, Output, Step, StepContext, StepError, StepPolicy, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use kube::api::ListParams;
use kube::core::GroupVersionKind;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{clusters_api, own_cluster, own_managed_cluster, task_of, wait_err, wait_policy};
use crate::handler::Inner;
use crate::render::{CLUSTER_LABEL, MANAGED_BY};
use crate::spec::ClusterCommand;

/// The `check` step's output (a delete's).
pub const CHECK: Output<DeleteChecked> = Output::new("check");

/// Output of a delete's `check`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DeleteChecked {
    /// Ferry's ManagedCluster of the cluster exists (the undo of `deregister` restores it).
    pub registered: bool,
}

/// The `delete` step's output.
pub const DELETE: Output<Deleted> = Output::new("delete");

/// Output of `delete`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Deleted {
    /// Kind → how many objects of it were deleted besides the Cluster.
    pub removed: BTreeMap<String, u32>,
}

/// The `check` step of a delete.
pub struct DeleteCheck(pub(crate) Arc<Inner>);

impl CheckStep<ClusterCommand> for DeleteCheck {
    fn name(&self) -> &str {
        CHECK.step()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let c = own_cluster(&self.0, cx.spec).await?;
            let registered = own_managed_cluster(&self.0, cx.spec).await?.is_some();
            cx.progress(100, format!("Cluster created by task {}; registered with OCM: {registered}", task_of(&c.metadata)));
            CHECK.value(&DeleteChecked { registered })
        }
        .boxed()
    }
}

/// Every `(group, kind)` the worker may have rendered besides the Cluster.
const RENDERED_KINDS: &[(&str, &str)] = &[
    ("cluster.x-k8s.io", "MachineDeployment"),
    ("controlplane.cluster.x-k8s.io", "KubeadmControlPlane"),
    ("controlplane.cluster.x-k8s.io", "KThreesControlPlane"),
    ("bootstrap.cluster.x-k8s.io", "KubeadmConfigTemplate"),
    ("bootstrap.cluster.x-k8s.io", "KThreesConfigTemplate"),
    ("infrastructure.cluster.x-k8s.io", "DockerCluster"),
    ("infrastructure.cluster.x-k8s.io", "DockerMachineTemplate"),
    ("infrastructure.cluster.x-k8s.io", "OpenStackCluster"),
    ("infrastructure.cluster.x-k8s.io", "OpenStackMachineTemplate"),
];

/// The `delete` step.
pub struct DeleteStep(pub(crate) Arc<Inner>);

impl Step<ClusterCommand> for DeleteStep {
    fn name(&self) -> &str {
        DELETE.step()
    }

    fn policy(&self) -> StepPolicy {
        wait_policy(self.0.cfg.removal_timeout)
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let cmd = cx.spec;
            let inner = &self.0;
            let hub = inner.hub();
            let (ns, name) = (cmd.namespace(), cmd.name.as_str());
            match clusters_api(&hub, ns).delete(name, &kube::api::DeleteParams::background()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(hub_err(e)),
            }
            cx.progress(10, format!("Cluster {ns}/{name} deleting"));
            inner.cfg.watches.wait_deleted::<CapiCluster>(HUB, &hub, Some(ns), name, inner.cfg.removal_timeout).await.map_err(wait_err)?;
            inner.cfg.watches.forget(name);
            cx.progress(80, "Cluster gone; deleting its templates");
            let mut removed = BTreeMap::new();
            for (group, kind) in RENDERED_KINDS {
                let gvk = GroupVersionKind::gvk(group, "v1beta2", kind);
                let api = match inner.cfg.clusters.api(HUB, &gvk, Some(ns)).await {
                    Ok(a) => a,
                    Err(ClusterError::NotServed { .. }) => continue,
                    Err(e) => return Err(kube_err(codes::HUB_API, e)),
                };
                let lp = ListParams::default().labels(&format!("{CLUSTER_LABEL}={name},{}={}", MANAGED_BY.0, MANAGED_BY.1));
                for o in api.list(&lp).await.map_err(hub_err)?.items {
                    let n = o.metadata.name.clone().unwrap_or_default();
                    match api.delete(&n, &Default::default()).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(s)) if s.code == 404 => {}
                        Err(e) => return Err(hub_err(e)),
                    }
                    *removed.entry((*kind).to_owned()).or_insert(0) += 1;
                }
            }
            cx.progress(100, format!("Cluster {ns}/{name} deleted"));
            DELETE.value(&Deleted { removed })
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>, out: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            let gone_or_going = match clusters_api(&self.0.hub(), cx.spec.namespace()).get_opt(&cx.spec.name).await.map_err(hub_err)? {
                None => true,
                Some(c) => c.metadata.deletion_timestamp.is_some(),
            };
            if out.is_some() || gone_or_going {
                return Err(StepError::permanent(
                    codes::IRREVERSIBLE,
                    format!("Cluster {} is deleted (or being deleted): a deletion cannot be undone; create it again with a create command", cx.spec.subject()),
                ));
            }
            Ok(())
        }
        .boxed()
    }
}

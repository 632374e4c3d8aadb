//! `apply`: the namespace when it was missing, then every rendered object (Cluster API
//! objects, or a ClusterClass topology) by server-side apply. Its undo deletes the Cluster,
//! waits until it is gone (the providers remove its machines and workload cluster), then
//! deletes the rest of what `apply` rendered and the namespace it made, unless another
//! Cluster lives there.

use std::sync::Arc;
use std::time::Duration;

use ferry_kube::kinds::CapiCluster;
use ferry_kube::step_errors::{hub_err, kube_err};
use ferry_kube::{ClusterError, HUB};
use ferry_task::{Output, Step, StepContext, StepError, StepPolicy, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::check::CHECK;
use super::{clusters_api, describe, is_ferrys, wait_err};
use crate::handler::Inner;
use crate::render::{self, MANAGED_BY, MANAGER};
use crate::spec::ClusterCommand;

/// The `apply` step's output.
pub const APPLY: Output<Applied> = Output::new("apply");

/// Output of `apply`: what it applied, as `kind namespace/name` (never the objects).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Applied {
    /// `kind namespace/name` of each object, in apply order.
    pub objects: Vec<String>,
}

/// The `apply` step.
pub struct ApplyStep(pub(crate) Arc<Inner>);

impl ApplyStep {
    /// Deletes the Cluster (the providers remove its machines and workload cluster), waits
    /// until it is gone, then the rest of what `apply` rendered.
    async fn remove(&self, cmd: &ClusterCommand, objects: &[Value], namespace_existed: bool, cx: &StepContext<'_, ClusterCommand>) -> Result<(), StepError> {
        let inner = &self.0;
        let hub = inner.hub();
        let (ns, name) = (cmd.namespace(), cmd.name.as_str());
        if let Some(c) = clusters_api(&hub, ns).get_opt(name).await.map_err(hub_err)? {
            if !is_ferrys(&c.metadata) {
                return Err(StepError::permanent(
                    codes::CLUSTER_NOT_FERRYS,
                    format!("Cluster {ns}/{name} is not Ferry's any more (its managed-by label changed): leaving it"),
                ));
            }
            cx.progress(10, format!("deleting Cluster {ns}/{name}"));
            match clusters_api(&hub, ns).delete(name, &kube::api::DeleteParams::background()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(hub_err(e)),
            }
            inner.cfg.watches.wait_deleted::<CapiCluster>(HUB, &hub, Some(ns), name, inner.cfg.removal_timeout).await.map_err(wait_err)?;
        }
        inner.cfg.watches.forget(name);
        cx.progress(70, "Cluster gone; deleting its templates");
        for o in objects.iter().rev().filter(|o| o["kind"] != "Cluster") {
            match inner.cfg.clusters.delete(HUB, o).await {
                Ok(_) | Err(ClusterError::NotServed { .. }) => {}
                Err(e) => return Err(kube_err(codes::HUB_API, e)),
            }
        }
        // The namespace the create made goes too, unless another cluster lives in it (creates
        // into a new namespace may run side by side, each finding it missing).
        if !namespace_existed && ns != "default" {
            let nss = Api::<Namespace>::all(hub.clone());
            let ours = nss.get_opt(ns).await.map_err(hub_err)?.is_some_and(|n| is_ferrys(&n.metadata));
            let others = !clusters_api(&hub, ns).list(&ListParams::default().limit(1)).await.map_err(hub_err)?.items.is_empty();
            if ours && !others {
                cx.progress(90, format!("deleting namespace {ns}"));
                match nss.delete(ns, &Default::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(hub_err(e)),
                }
                inner.cfg.watches.wait_namespace_deleted(HUB, &hub, ns, inner.cfg.removal_timeout).await.map_err(wait_err)?;
            }
        }
        Ok(())
    }
}

impl Step<ClusterCommand> for ApplyStep {
    fn name(&self) -> &str {
        APPLY.step()
    }

    fn policy(&self) -> StepPolicy {
        StepPolicy { timeout: self.0.cfg.removal_timeout + Duration::from_secs(60), ..StepPolicy::default() }
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let cmd = cx.spec;
            let checked = CHECK.required(cx)?;
            let hub = self.0.hub();
            if !checked.namespace_existed {
                let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": cmd.namespace(), "labels": {MANAGED_BY.0: MANAGED_BY.1}}});
                Api::<Namespace>::all(hub).patch(cmd.namespace(), &PatchParams::apply(MANAGER), &Patch::Apply(&ns)).await.map_err(hub_err)?;
            }
            let objects = render::objects(cmd, &cx.task_id.to_string(), &checked.topology);
            let n = objects.len();
            for (i, o) in objects.iter().enumerate() {
                self.0.cfg.clusters.apply(HUB, o, MANAGER).await.map_err(|e| kube_err(codes::APPLY_FAILED, e))?;
                cx.progress(((i + 1) * 100 / n) as u8, format!("applied {}", describe(o)));
            }
            APPLY.value(&Applied { objects: objects.iter().map(describe).collect() })
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            // Rendering is pure: the same objects whether or not `run` finished.
            let checked = CHECK.required(cx)?;
            let objects = render::objects(cx.spec, &cx.task_id.to_string(), &checked.topology);
            self.remove(cx.spec, &objects, checked.namespace_existed, cx).await
        }
        .boxed()
    }
}

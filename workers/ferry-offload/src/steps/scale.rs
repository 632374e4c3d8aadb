//! `scale` (burst): sets the Deployment's replicas to those wanted and waits until every
//! pod is placed on a node or found unschedulable; the output counts both (what is
//! unschedulable is the overflow `place` sends away). Its undo puts back the replicas
//! `check` recorded.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ferry_kube::Check;
use ferry_kube::step_errors::{api_err, wait_err};
use ferry_task::{Output, Step, StepContext, StepError, StepPolicy, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::check::CHECK;
use crate::handler::Inner;
use crate::spec::OffloadCommand;

/// The `scale` step's output.
pub const SCALE: Output<Scaled> = Output::new("scale");

/// Burst: scale to the replicas wanted and see what the scheduler cannot place.
pub struct ScaleStep {
    pub(crate) inner: Arc<Inner>,
    pub(crate) policy: StepPolicy,
}

/// What `scale` saw once the scheduler had tried every pod.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Scaled {
    /// Pods placed on nodes.
    pub placed: u32,
    /// Pods the scheduler could not place.
    pub pending: u32,
}

impl Inner {
    /// The pods of `deployment` (by its selector), not being deleted.
    fn deployment_pods<'s>(store: &'s [Arc<Pod>], selector: &BTreeMap<String, String>) -> Vec<&'s Arc<Pod>> {
        store
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| {
                let l = p.metadata.labels.clone().unwrap_or_default();
                selector.iter().all(|(k, v)| l.get(k) == Some(v))
            })
            .collect()
    }
}

impl ScaleStep {
    async fn set_replicas(&self, c: &OffloadCommand, replicas: i32) -> Result<BTreeMap<String, String>, StepError> {
        let client = self.inner.client(&c.cluster).await?;
        let api = Api::<Deployment>::namespaced(client, &c.namespace);
        let name = c.deployment.clone().unwrap_or_default();
        let d = api.patch(&name, &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": replicas}}))).await.map_err(api_err(&c.cluster))?;
        Ok(d.spec.selector.match_labels.unwrap_or_default())
    }

    /// Waits until `replicas` pods exist and each is placed or found unschedulable.
    async fn settle(&self, c: &OffloadCommand, selector: &BTreeMap<String, String>, replicas: u32, timeout: Duration) -> Result<Scaled, StepError> {
        let client = self.inner.client(&c.cluster).await?;
        self.inner
            .cfg
            .watches
            .wait_store::<Pod, Scaled>(
                &c.cluster,
                &client,
                Some(&c.namespace),
                &format!("the pods of {}", c.deployment.as_deref().unwrap_or("")),
                timeout,
                |s| {
                    let all = s.state();
                    let pods = Inner::deployment_pods(&all, selector);
                    let placed = pods.iter().filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some()).count() as u32;
                    let unschedulable = pods
                        .iter()
                        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none())
                        .filter(|p| {
                            p.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|cs| {
                                cs.iter().any(|c| c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some("Unschedulable"))
                            })
                        })
                        .count() as u32;
                    if pods.len() as u32 == replicas && placed + unschedulable == replicas {
                        Check::Done(Scaled { placed, pending: unschedulable })
                    } else {
                        Check::Pending(format!("{} pods of {replicas}: {placed} placed, {unschedulable} unschedulable", pods.len()))
                    }
                },
            )
            .await
            .map_err(|e| wait_err(codes::SCHEDULING, e))
    }
}

impl Step<OffloadCommand> for ScaleStep {
    fn name(&self) -> &str {
        SCALE.step()
    }

    fn policy(&self) -> StepPolicy {
        self.policy.clone()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, OffloadCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let c = cx.spec;
            let replicas = c.replicas.unwrap_or(1);
            let selector = self.set_replicas(c, replicas).await?;
            cx.progress(30, format!("{} scaled to {replicas}", c.deployment.as_deref().unwrap_or("")));
            let s = self.settle(c, &selector, replicas as u32, c.timeout()).await?;
            cx.progress(100, format!("{} placed, {} unschedulable", s.placed, s.pending));
            SCALE.value(&s)
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, OffloadCommand>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            let Some(prev) = CHECK.required(cx)?.previous_replicas else { return Ok(()) };
            self.set_replicas(cx.spec, prev).await?;
            cx.progress(100, format!("{} back to {prev} replicas", cx.spec.deployment.as_deref().unwrap_or("")));
            Ok(())
        }
        .boxed()
    }
}

//! `ready` (burst): waits until every replica of the Deployment is Ready, wherever it runs,
//! and counts where they run: at home or on which peer's virtual node. It changes nothing,
//! so its undo has nothing to put back (`scale`'s and `offload`'s undos do).

use std::collections::BTreeMap;
use std::sync::Arc;

use ferry_kube::Check;
use ferry_kube::step_errors::{api_err, wait_err};
use ferry_task::{CheckStep, Output, StepContext, StepError, StepPolicy, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::remote_id;
use crate::handler::Inner;
use crate::spec::OffloadCommand;

/// The `ready` step's output.
pub const READY: Output<ReadyReplicas> = Output::new("ready");

/// Output of `ready`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadyReplicas {
    /// The replicas wanted, all Ready.
    pub replicas: i32,
    /// Where they run: the cluster itself, or a peer's Liqo id → its pods.
    pub on: BTreeMap<String, u32>,
}

/// Burst: every replica Ready, wherever it runs.
pub struct ReadyStep {
    pub(crate) inner: Arc<Inner>,
    pub(crate) policy: StepPolicy,
}

impl CheckStep<OffloadCommand> for ReadyStep {
    fn name(&self) -> &str {
        READY.step()
    }

    fn policy(&self) -> StepPolicy {
        self.policy.clone()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, OffloadCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let c = cx.spec;
            let name = c.deployment.clone().unwrap_or_default();
            let replicas = c.replicas.unwrap_or(1);
            let client = self.inner.client(&c.cluster).await?;
            self.inner
                .cfg
                .watches
                .wait_object::<Deployment, ()>(&c.cluster, &client, Some(&c.namespace), &name, c.timeout(), |d| {
                    let ready = d.and_then(|d| d.status.as_ref()).and_then(|s| s.ready_replicas).unwrap_or(0);
                    if ready >= replicas { Check::Done(()) } else { Check::Pending(format!("{ready}/{replicas} replicas Ready")) }
                })
                .await
                .map_err(|e| wait_err(codes::NOT_READY, e))?;
            // Where they run: at home, or on which peer's virtual node.
            let selector = Api::<Deployment>::namespaced(client.clone(), &c.namespace)
                .get(&name)
                .await
                .map_err(api_err(&c.cluster))?
                .spec
                .selector
                .match_labels
                .unwrap_or_default();
            let sel: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let pods =
                Api::<Pod>::namespaced(client.clone(), &c.namespace).list(&ListParams::default().labels(&sel.join(","))).await.map_err(api_err(&c.cluster))?;
            let virtual_nodes: BTreeMap<String, String> =
                self.inner.virtual_nodes(&c.cluster).await?.iter().filter_map(|n| Some((n.metadata.name.clone()?, remote_id(n)?))).collect();
            let mut on: BTreeMap<String, u32> = BTreeMap::new();
            for p in pods.items.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
                let node = p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
                *on.entry(virtual_nodes.get(&node).cloned().unwrap_or_else(|| c.cluster.clone())).or_default() += 1;
            }
            cx.progress(100, format!("{replicas} replicas Ready: {}", on.iter().map(|(k, v)| format!("{v} on {k}")).collect::<Vec<_>>().join(", ")));
            READY.value(&ReadyReplicas { replicas, on })
        }
        .boxed()
    }
}

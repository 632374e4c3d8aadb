//! `check`: what every operation starts from, read from the live state: the namespace
//! exists, and the offloading it has now (its spec, the task that made it). Offload: every
//! target is peered with the cluster (it has a virtual node of it) and that node is Ready.
//! Burst: the Deployment, its replicas and what one pod requests, the candidates. It
//! changes nothing, so its undo has nothing to put back.

use std::sync::Arc;

use ferry_kube::step_errors::api_err;
use ferry_task::{CheckStep, Output, StepContext, StepError, StepPolicy, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Target, made_by, remote_id};
use crate::handler::Inner;
use crate::liqo::{self, REMOTE_ID_LABEL};
use crate::placement::{self, Resources};
use crate::spec::{OffloadCommand, OffloadOperation};

/// The `check` step's output.
pub const CHECK: Output<Checked> = Output::new("check");

/// What `check` found.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Checked {
    /// The targets (offload) or the candidates (burst).
    pub targets: Vec<Target>,
    /// The namespace's offloading before the task (its spec), if any.
    pub previous: Option<Value>,
    /// The Ferry task that made that offloading, if one did.
    #[serde(default)]
    pub previous_task: Option<String>,
    /// Burst: the Deployment's replicas before.
    pub previous_replicas: Option<i32>,
    /// Burst: what one pod requests.
    pub per_pod: Option<Resources>,
}

/// The `check` step.
pub struct OffloadCheck {
    pub(crate) inner: Arc<Inner>,
    pub(crate) policy: StepPolicy,
}

impl Inner {
    /// The Liqo cluster id of `cluster`.
    async fn liqo_id(&self, cluster: &str) -> Result<String, StepError> {
        let client = self.client(cluster).await?;
        ferry_kube::vocab::liqo::cluster_id(client).await.map_err(api_err(cluster))?.ok_or_else(|| {
            StepError::rejected(
                codes::LIQO_MISSING,
                format!("{cluster} runs no Liqo (no ConfigMap {}/{})", ferry_kube::vocab::liqo::LIQO_NAMESPACE, ferry_kube::vocab::liqo::CLUSTER_ID_CONFIGMAP),
            )
        })
    }

    /// The clusters `c` targets among `c.cluster`'s peers: the named ones (each must be
    /// peered: a Rejection names the first that is not), the selected ones, or all.
    async fn targets(&self, c: &OffloadCommand) -> Result<Vec<Target>, StepError> {
        let nodes = self.virtual_nodes(&c.cluster).await?;
        let peers: Vec<String> = nodes.iter().filter_map(remote_id).collect();
        let mut out = Vec::new();
        if !c.clusters.is_empty() {
            for t in &c.clusters {
                let id = self.liqo_id(t).await?;
                let Some(n) = nodes.iter().find(|n| remote_id(n).as_deref() == Some(&id)) else {
                    return Err(StepError::rejected(
                        codes::NOT_PEERED,
                        format!(
                            "{t} is not peered with {}: {} has no virtual node of it ({REMOTE_ID_LABEL}={id}; its peers: {peers:?}); peer them first",
                            c.cluster, c.cluster
                        ),
                    ));
                };
                out.push(Target { cluster: Some(t.clone()), id, node: n.metadata.name.clone().unwrap_or_default() });
            }
            return Ok(out);
        }
        for n in &nodes {
            let labels = n.metadata.labels.clone().unwrap_or_default();
            if !liqo::matches(&labels, &c.cluster_selector) {
                continue;
            }
            let Some(id) = remote_id(n) else { continue };
            // Ferry knows clusters by name; Liqo by id. A kubeconfig named as the id is the cluster.
            let cluster = self.cfg.clusters.client(&id).await.ok().map(|_| id.clone());
            out.push(Target { cluster, id, node: n.metadata.name.clone().unwrap_or_default() });
        }
        if out.is_empty() && c.operation != OffloadOperation::Burst {
            let why = if c.cluster_selector.is_empty() {
                "it has no peered clusters".to_owned()
            } else {
                format!("the cluster selector matches none of its peers {peers:?}")
            };
            return Err(StepError::rejected(codes::NOT_PEERED, format!("nothing to offload {} of {} to: {why}", c.namespace, c.cluster)));
        }
        Ok(out)
    }
}

// Reads the live state only: it does not act, so a rejection here ends the task Rejected.
impl CheckStep<OffloadCommand> for OffloadCheck {
    fn name(&self) -> &str {
        CHECK.step()
    }

    fn policy(&self) -> StepPolicy {
        self.policy.clone()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, OffloadCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let c = cx.spec;
            let client = self.inner.client(&c.cluster).await?;
            if Api::<Namespace>::all(client.clone()).get_opt(&c.namespace).await.map_err(api_err(&c.cluster))?.is_none() {
                return Err(StepError::rejected(codes::NAMESPACE_MISSING, format!("namespace {} does not exist on {}", c.namespace, c.cluster)));
            }
            let current = self.inner.offloading(c).await?;
            let previous_task = current.as_ref().and_then(made_by).map(str::to_owned);
            let mut out = Checked { previous: current.map(|o| o.spec), previous_task, ..Checked::default() };
            match c.operation {
                OffloadOperation::Unoffload => {
                    let msg = if out.previous.is_some() { "offloaded now; it will be removed" } else { "not offloaded: nothing to remove" };
                    cx.progress(100, format!("{}/{}: {msg}", c.cluster, c.namespace));
                }
                OffloadOperation::Offload => {
                    out.targets = self.inner.targets(c).await?;
                    self.inner.targets_ready(c, &out.targets).await?;
                    cx.progress(100, format!("peered and ready: {}", ferry_task::report::listed(out.targets.iter().map(|t| &t.id))));
                }
                OffloadOperation::Burst => {
                    let name = c.deployment.clone().unwrap_or_default();
                    let Some(d) = Api::<Deployment>::namespaced(client, &c.namespace).get_opt(&name).await.map_err(api_err(&c.cluster))? else {
                        return Err(StepError::rejected(codes::DEPLOYMENT_MISSING, format!("Deployment {}/{name} does not exist on {}", c.namespace, c.cluster)));
                    };
                    let spec = d.spec;
                    out.previous_replicas = Some(spec.replicas.unwrap_or(1));
                    out.per_pod = Some(spec.template.spec.as_ref().map(placement::pod_requests).unwrap_or_default());
                    out.targets = self.inner.targets(c).await?;
                    cx.progress(
                        100,
                        format!(
                            "Deployment {name}: {} replicas now; candidates {}",
                            spec.replicas.unwrap_or(1),
                            ferry_task::report::listed(out.targets.iter().map(|t| &t.id))
                        ),
                    );
                }
            }
            CHECK.value(&out)
        }
        .boxed()
    }
}

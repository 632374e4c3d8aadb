//! `twins`: waits until the twin namespace `offload` named is Active on every target a
//! kubeconfig names (a target known by its Liqo id only is not checked). It changes
//! nothing, so its undo has nothing to put back: the offload step's undo removes the
//! offloading, and Liqo the twins with it.

use std::sync::Arc;

use ferry_kube::Check;
use ferry_kube::step_errors::wait_err;
use ferry_task::{CheckStep, Output, StepContext, StepError, StepPolicy, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Namespace;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::offload::{OFFLOAD, offload_targets};
use crate::handler::Inner;
use crate::spec::OffloadCommand;

/// The `twins` step's output.
pub const TWINS: Output<Twins> = Output::new("twins");

/// Output of `twins`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Twins {
    /// The twin namespaces seen Active.
    pub twins: Vec<Twin>,
}

/// A twin namespace on a target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Twin {
    /// The target cluster.
    pub cluster: String,
    /// The twin namespace's name.
    pub namespace: String,
}

/// The `twins` step.
pub struct TwinsStep {
    pub(crate) inner: Arc<Inner>,
    pub(crate) policy: StepPolicy,
}

impl CheckStep<OffloadCommand> for TwinsStep {
    fn name(&self) -> &str {
        TWINS.step()
    }

    fn policy(&self) -> StepPolicy {
        self.policy.clone()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, OffloadCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let c = cx.spec;
            let out = OFFLOAD.get(cx).unwrap_or_default();
            let Some(remote) = out.remote_namespace.as_deref() else { return TWINS.value(&Twins::default()) };
            let targets = offload_targets(cx)?;
            let mut twins = Vec::new();
            for (i, t) in targets.iter().enumerate() {
                let Some(cluster) = &t.cluster else {
                    cx.progress(100, format!("{}: no kubeconfig names this Liqo id; its twin is not checked", t.id));
                    continue;
                };
                let client = self.inner.client(cluster).await?;
                self.inner
                    .cfg
                    .watches
                    .wait_object::<Namespace, ()>(cluster, &client, None, remote, c.timeout(), |n| match n {
                        Some(n) if n.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Active") => Check::Done(()),
                        Some(_) => Check::Pending("not Active".into()),
                        None => Check::Pending("not created yet".into()),
                    })
                    .await
                    .map_err(|e| wait_err(codes::TWIN_MISSING, e))?;
                cx.progress((100 * (i + 1) / targets.len()) as u8, format!("namespace {remote} exists on {cluster}"));
                twins.push(Twin { cluster: cluster.clone(), namespace: remote.to_owned() });
            }
            TWINS.value(&Twins { twins })
        }
        .boxed()
    }
}

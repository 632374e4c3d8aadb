//! `kubeconfig`: the providers wrote the `<name>-kubeconfig` Secret on the hub and the
//! workload API server answers through it. The worker reads the kubeconfig; the output
//! names the Secret and the server's version, never the content. It changes nothing, so its
//! undo has nothing to put back.

use std::sync::Arc;
use std::time::Duration;

use ferry_kube::step_errors::kube_err;
use ferry_kube::{Check, ClusterError, HUB};
use ferry_task::{CheckStep, Output, StepContext, StepError, StepPolicy, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Secret;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{ready_timeout, wait_err, wait_policy};
use crate::handler::Inner;
use crate::spec::ClusterCommand;

/// The `kubeconfig` step's output.
pub const KUBECONFIG: Output<Kubeconfig> = Output::new("kubeconfig");

/// Output of `kubeconfig`: where the kubeconfig is, never what it holds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Kubeconfig {
    /// `<namespace>/<name>-kubeconfig` on the hub.
    pub secret: String,
    /// The workload API server's `gitVersion`.
    pub server_version: String,
}

/// The `kubeconfig` step.
pub struct KubeconfigStep(pub(crate) Arc<Inner>);

impl CheckStep<ClusterCommand> for KubeconfigStep {
    fn name(&self) -> &str {
        KUBECONFIG.step()
    }

    fn policy(&self) -> StepPolicy {
        wait_policy(Duration::from_secs(600))
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let cmd = cx.spec;
            let hub = self.0.hub();
            let secret = format!("{}-kubeconfig", cmd.name);
            self.0
                .cfg
                .watches
                .wait_object::<Secret, ()>(HUB, &hub, Some(cmd.namespace()), &secret, ready_timeout(cmd), |s| match s {
                    Some(_) => Check::Done(()),
                    None => Check::Pending("the providers have not written it yet".into()),
                })
                .await
                .map_err(wait_err)?;
            // The kubeconfig is read here and used by this worker only; the task records the
            // Secret's name and the server's version, never the content.
            let client = self.0.cfg.clusters.client(&cmd.name).await.map_err(|e| kube_err(codes::KUBECONFIG, e))?;
            let version =
                client.apiserver_version().await.map_err(|e| kube_err(codes::WORKLOAD_API, ClusterError::Kube { cluster: cmd.name.clone(), source: e }))?;
            cx.progress(100, format!("the workload API server answers (Kubernetes {})", version.git_version));
            KUBECONFIG.value(&Kubeconfig { secret: format!("{}/{secret}", cmd.namespace()), server_version: version.git_version })
        }
        .boxed()
    }
}

//! `infrastructure` and `control-plane`: the Cluster's `status.initialization` field says
//! the infrastructure is provisioned, then the control plane initialized (a watch with the
//! `ready_timeout_seconds` deadline; a Cluster deleted meanwhile fails it). They change
//! nothing, so their undo has nothing to put back (the undo of `apply` removes the Cluster).

use std::sync::Arc;
use std::time::Duration;

use ferry_kube::kinds::CapiCluster;
use ferry_kube::{Check, HUB};
use ferry_task::{CheckStep, Output, StepContext, StepError, StepPolicy};
use futures::FutureExt;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{ready_timeout, wait_err, wait_policy};
use crate::handler::Inner;
use crate::spec::ClusterCommand;

/// The `infrastructure` step's output.
pub const INFRASTRUCTURE: Output<Initialized> = Output::new("infrastructure");

/// The `control-plane` step's output.
pub const CONTROL_PLANE: Output<Initialized> = Output::new("control-plane");

/// Output of `infrastructure` and `control-plane`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Initialized {
    /// The Cluster's `status.phase` then.
    pub phase: String,
}

/// Waits until the Cluster's `status.initialization.<field>` is true.
pub struct ClusterWait {
    pub(crate) inner: Arc<Inner>,
    /// The step, and the key of its output.
    pub(crate) step: Output<Initialized>,
    /// The field of `status.initialization` that says it.
    pub(crate) field: &'static str,
    /// What the progress says once it is true.
    pub(crate) what: &'static str,
}

impl CheckStep<ClusterCommand> for ClusterWait {
    fn name(&self) -> &str {
        self.step.step()
    }

    fn policy(&self) -> StepPolicy {
        wait_policy(Duration::from_secs(1800))
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let cmd = cx.spec;
            let hub = self.inner.hub();
            let pointer = format!("/initialization/{}", self.field);
            // The shared watch may not have seen the new Cluster yet: absent is a failure
            // only after it was seen.
            let mut seen = false;
            let phase = self
                .inner
                .cfg
                .watches
                .wait_object::<CapiCluster, String>(HUB, &hub, Some(cmd.namespace()), &cmd.name, ready_timeout(cmd), |c| {
                    seen |= c.is_some();
                    match c {
                        None if seen => Check::Failed("the Cluster was deleted".into()),
                        None => Check::Pending("the watch has not seen the Cluster yet".into()),
                        Some(c) if c.status_at(&pointer).and_then(Value::as_bool) == Some(true) => {
                            Check::Done(c.status_at("/phase").and_then(Value::as_str).unwrap_or("").to_owned())
                        }
                        Some(c) => Check::Pending(format!(
                            "phase {}, {}",
                            c.status_at("/phase").and_then(Value::as_str).unwrap_or("(none)"),
                            ferry_kube::kinds::condition_message(&c.status, "Available").unwrap_or_else(|| "no Available condition".into())
                        )),
                    }
                })
                .await
                .map_err(wait_err)?;
            cx.progress(100, format!("{} (phase {phase})", self.what));
            self.step.value(&Initialized { phase })
        }
        .boxed()
    }
}

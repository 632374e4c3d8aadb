//! `offload`: applies the namespace's NamespaceOffloading toward the targets (`check`'s for
//! an offload, `place`'s for a burst) and waits until its phase is Ready on every one; a
//! burst into a namespace another task offloaded reuses that offloading when it reaches
//! them all. Its undo restores what was there: the previous offloading as it was, or none
//! (Liqo removes the twin namespaces with it); it leaves alone a reused offloading or one
//! another task made since.
//!
//! Liqo's webhook makes `namespaceMappingStrategy` and `remoteNamespaceName` immutable
//! (liqotech/liqo `pkg/webhooks/namespaceoffloading/nsoff.go`): where the run or the undo
//! needs other values than the offloading there has, it deletes it, waits until Liqo let
//! it go, and creates the new one (`Inner::offload` in [`crate::steps`]).

use std::sync::Arc;

use ferry_task::{Output, Step, StepContext, StepError, StepPolicy, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::check::CHECK;
use super::place::PLACE;
use super::{Target, made_by};
use crate::handler::Inner;
use crate::liqo::{self, Progress};
use crate::spec::{OffloadCommand, OffloadOperation, PodOffloadingStrategy};

/// The `offload` step's output.
pub const OFFLOAD: Output<Offloaded> = Output::new("offload");

/// Output of `offload`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Offloaded {
    /// The twin namespaces' name on the targets (None when nothing was offloaded).
    pub remote_namespace: Option<String>,
    /// Where the namespace is offloaded.
    pub targets: Vec<Target>,
    /// A burst that reused an offloading another task made (its undo leaves it alone).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reused: bool,
}

/// The `offload` step (of an offload and of a burst).
pub struct OffloadStep {
    pub(crate) inner: Arc<Inner>,
    pub(crate) policy: StepPolicy,
}

/// The targets of the `offload` step: `check`'s (offload) or `place`'s (burst).
pub(super) fn offload_targets(cx: &StepContext<'_, OffloadCommand>) -> Result<Vec<Target>, StepError> {
    match cx.spec.operation {
        OffloadOperation::Burst => {
            let shares = PLACE.required(cx)?;
            Ok(shares.into_iter().map(|s| Target { cluster: Some(s.cluster), id: s.id, node: s.node }).collect())
        }
        _ => Ok(CHECK.required(cx)?.targets),
    }
}

impl Step<OffloadCommand> for OffloadStep {
    fn name(&self) -> &str {
        OFFLOAD.step()
    }

    fn policy(&self) -> StepPolicy {
        self.policy.clone()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, OffloadCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let c = cx.spec;
            let targets = offload_targets(cx)?;
            let ids: Vec<String> = targets.iter().map(|t| t.id.clone()).collect();
            if targets.is_empty() {
                cx.progress(100, "nothing overflows: no offloading needed");
                return OFFLOAD.value(&Offloaded { remote_namespace: None, targets: Vec::new(), reused: false });
            }
            let burst = c.operation == OffloadOperation::Burst;
            // A burst into a namespace someone else offloaded: only within their targets.
            if burst && let Some(prev) = CHECK.required(cx)?.previous {
                let current = self.inner.offloading(c).await?;
                if current.as_ref().and_then(made_by) != Some(&cx.task_id.to_string()) {
                    let status = current.map(|o| o.status).unwrap_or_default();
                    return match liqo::progress(&status, None, &ids) {
                        Progress::Ready(n) => {
                            cx.progress(100, format!("{} is already offloaded to {}; the overflow goes there", c.namespace, ferry_task::report::listed(&ids)));
                            OFFLOAD.value(&Offloaded { remote_namespace: Some(n), targets, reused: true })
                        }
                        _ => Err(StepError::permanent(
                            codes::ALREADY_OFFLOADED,
                            format!(
                                "{} is already offloaded ({prev}) and not to all of {} the overflow needs: unoffload it or burst within its clusters",
                                c.namespace,
                                ferry_task::report::listed(&ids)
                            ),
                        )),
                    };
                }
            }
            let strategy = if burst { PodOffloadingStrategy::LocalAndRemote } else { c.pod_offloading_strategy };
            let selector = if c.clusters.is_empty() && !burst { None } else { Some(ids.as_slice()) };
            cx.progress(20, format!("NamespaceOffloading {}/offloading toward {}", c.namespace, ferry_task::report::listed(&ids)));
            let remote = self.inner.offload(cx, &liqo::spec(c, strategy, selector), &ids, Some(&cx.task_id.to_string())).await?;
            cx.progress(100, format!("offloading Ready; twin namespace {remote} on {}", ferry_task::report::listed(&ids)));
            OFFLOAD.value(&Offloaded { remote_namespace: Some(remote), targets, reused: false })
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, OffloadCommand>, out: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            let c = cx.spec;
            if out.and_then(|o| o.get("reused")).and_then(Value::as_bool) == Some(true) {
                return Ok(());
            }
            let current = self.inner.offloading(c).await?;
            if current.as_ref().and_then(made_by) != Some(&cx.task_id.to_string()) {
                return Ok(());
            }
            let ch = CHECK.required(cx)?;
            match ch.previous {
                // It was there before: put it back as it was.
                Some(prev) => {
                    self.inner.offload(cx, &prev, &[], ch.previous_task.as_deref()).await?;
                    cx.progress(100, "the previous offloading is restored");
                }
                None => {
                    self.inner.unoffload(c).await?;
                    cx.progress(100, "the offloading and its twin namespaces are removed");
                }
            }
            Ok(())
        }
        .boxed()
    }
}

//! `remove` (unoffload): deletes the namespace's offloading and waits until it and the twin
//! namespaces are gone (nothing to do when `check` found none). Its undo (the revert)
//! restores the offloading as it was, labelled with the task that made it.

use std::sync::Arc;

use ferry_task::{Output, Step, StepContext, StepError, StepPolicy};
use futures::FutureExt;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::check::CHECK;
use crate::handler::Inner;
use crate::spec::OffloadCommand;

/// The `remove` step's output.
pub const REMOVE: Output<Removed> = Output::new("remove");

/// Output of `remove`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Removed {
    /// Whether there was an offloading to remove.
    pub removed: bool,
}

/// Unoffload: remove the offloading; revert puts it back as it was.
pub struct RemoveStep {
    pub(crate) inner: Arc<Inner>,
    pub(crate) policy: StepPolicy,
}

impl Step<OffloadCommand> for RemoveStep {
    fn name(&self) -> &str {
        REMOVE.step()
    }

    fn policy(&self) -> StepPolicy {
        self.policy.clone()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, OffloadCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let c = cx.spec;
            if CHECK.required(cx)?.previous.is_none() {
                cx.progress(100, "not offloaded: nothing removed");
                return REMOVE.value(&Removed { removed: false });
            }
            self.inner.unoffload(c).await?;
            cx.progress(100, format!("{}/{} is no longer offloaded; its twin namespaces are gone", c.cluster, c.namespace));
            REMOVE.value(&Removed { removed: true })
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, OffloadCommand>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            let ch = CHECK.required(cx)?;
            if let Some(prev) = ch.previous {
                self.inner.offload(cx, &prev, &[], ch.previous_task.as_deref()).await?;
                cx.progress(100, "the offloading is restored");
            }
            Ok(())
        }
        .boxed()
    }
}

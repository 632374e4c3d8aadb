//! `check` of a Liqo peering: both clusters are known (an unknown one rejects the
//! command), each has a Ready node of its own and a running Liqo with a cluster id, within
//! the command's timeout. The ids are its output; every later Liqo step names objects by
//! them. It changes nothing.

use std::sync::Arc;

use ferry_task::{CheckStep, Output, StepContext, StepError, StepPolicy};
use futures::FutureExt;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::handler::Inner;
use crate::spec::PeerClusters;

/// The Liqo `check` step's output.
pub const IDS: Output<Ids> = Output::new("check");

/// The clusters' Liqo ids.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Ids {
    /// The consumer's id.
    pub a: String,
    /// The provider's id.
    pub b: String,
}

/// The `check` step of a Liqo peering.
pub(crate) struct LiqoCheck(pub(crate) Arc<Inner>, pub(crate) StepPolicy);

impl CheckStep<PeerClusters> for LiqoCheck {
    fn name(&self) -> &str {
        IDS.step()
    }

    fn policy(&self) -> StepPolicy {
        self.1.clone()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, PeerClusters>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let p = cx.spec;
            // Both are known before either is waited on: an unknown cluster is a rejection.
            self.0.client(&p.a).await?;
            self.0.client(&p.b).await?;
            let a = self.0.liqo_ready(&p.a, p.timeout()).await?;
            cx.progress(50, format!("Liqo runs on {} (cluster id {a})", p.a));
            let b = self.0.liqo_ready(&p.b, p.timeout()).await?;
            cx.progress(100, format!("Liqo runs on {} (cluster id {b})", p.b));
            IDS.value(&Ids { a, b })
        }
        .boxed()
    }
}

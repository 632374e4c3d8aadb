//! `check` of a Liqo peering: both clusters are known (an unknown one rejects the
//! command), each has a Ready node of its own and a running Liqo with a cluster id, its
//! IPAM's pod and external CIDRs, and the gateway template its side of the network needs
//! (`wireguard-client` on `a`, `wireguard-server` on `b`: liqoctl's `CheckTemplateGwClient`
//! / `CheckTemplateGwServer`, `pkg/liqoctl/network/handler.go`), within the command's
//! timeout. The ids are its output; every later Liqo step names objects by
//! them, and whether each side already had a ForeignCluster of the other (what a revert
//! leaves in place). It changes nothing.

use std::sync::Arc;

use ferry_task::{CheckStep, Output, StepContext, StepError, StepPolicy};
use futures::FutureExt;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{LiqoClientTemplate, LiqoServerTemplate};
use crate::handler::Inner;
use crate::liqo;
use crate::spec::PeerClusters;

/// The Liqo `check` step's output.
pub const IDS: Output<Ids> = Output::new("check");

/// The clusters' Liqo ids, and whether each already knew the other (its ForeignCluster
/// existed before this task: Liqo's controller makes one for every object naming a remote
/// cluster and never deletes it, so a revert deletes only the ones this peering caused).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ids {
    /// The consumer's id.
    pub a: String,
    /// The provider's id.
    pub b: String,
    /// `a` had a ForeignCluster of `b` before (records without it: assumed, so kept).
    #[serde(default = "known")]
    pub a_knew_b: bool,
    /// `b` had a ForeignCluster of `a` before.
    #[serde(default = "known")]
    pub b_knew_a: bool,
}

fn known() -> bool {
    true
}

impl Default for Ids {
    fn default() -> Self {
        Self { a: String::new(), b: String::new(), a_knew_b: true, b_knew_a: true }
    }
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
            cx.progress(80, format!("Liqo runs on {} (cluster id {b})", p.b));
            for c in [&p.a, &p.b] {
                self.0.ipam_cidrs(c, p.timeout()).await?;
            }
            self.0.template::<LiqoClientTemplate>(&p.a, liqo::CLIENT_TEMPLATE, p.timeout()).await?;
            self.0.template::<LiqoServerTemplate>(&p.b, liqo::SERVER_TEMPLATE, p.timeout()).await?;
            let a_knew_b = self.0.foreign_cluster(&p.a, &b).await?;
            let b_knew_a = self.0.foreign_cluster(&p.b, &a).await?;
            cx.progress(100, "networks and gateway templates in place");
            IDS.value(&Ids { a, b, a_knew_b, b_knew_a })
        }
        .boxed()
    }
}

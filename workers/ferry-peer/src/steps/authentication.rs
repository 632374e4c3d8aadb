//! `authentication` (and `authentication-reverse`): the consumer's Tenant on the
//! provider; waits until the consumer holds the Identity Liqo issues for it. Undo waits
//! until no Identity is left.

use ferry_kube::Check;
use ferry_kube::step_errors::wait_err;
use ferry_task::{Output, StepError, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::liqo_check::Ids;
use super::objects::ObjectSet;
use super::{LiqoIdentity, none_left, roles};
use crate::handler::Inner;
use crate::liqo;
use crate::spec::PeerClusters;

/// The `authentication` step's output.
pub const AUTHENTICATION: Output<Authenticated> = Output::new("authentication");
/// The `authentication-reverse` step's output (bidirectional peerings).
pub const AUTHENTICATION_REVERSE: Output<Authenticated> = Output::new("authentication-reverse");

/// Output of `authentication`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Authenticated {
    /// The cluster that holds the Identity.
    pub consumer: String,
}

/// Authentication of the direction's consumer on its provider.
pub(crate) struct Authentication {
    /// The direction `b` → `a`.
    pub reverse: bool,
}

impl Authentication {
    fn key(&self) -> Output<Authenticated> {
        if self.reverse { AUTHENTICATION_REVERSE } else { AUTHENTICATION }
    }
}

impl ObjectSet for Authentication {
    fn name(&self) -> &'static str {
        self.key().step()
    }

    fn objects(&self, p: &PeerClusters, ids: &Ids) -> Vec<(String, Value)> {
        let pair = liqo::pair_label(&p.a, &p.b);
        let r = roles(p, ids, self.reverse);
        vec![(r.provider, liqo::tenant(&r.consumer_id, &pair))]
    }

    fn ready<'a>(&'a self, inner: &'a Inner, p: &'a PeerClusters, ids: &'a Ids) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let r = roles(p, ids, self.reverse);
            let client = inner.client(&r.consumer).await?;
            inner
                .cfg
                .watches
                .wait_store::<LiqoIdentity, ()>(&r.consumer, &client, Some(&liqo::tenant_namespace(&r.provider_id)), "the Identity", p.timeout(), |s| {
                    if s.state().is_empty() { Check::Pending("no Identity yet".into()) } else { Check::Done(()) }
                })
                .await
                .map_err(|e| wait_err(codes::AUTHENTICATION, e))?;
            self.key().value(&Authenticated { consumer: r.consumer })
        }
        .boxed()
    }

    fn gone<'a>(&'a self, inner: &'a Inner, p: &'a PeerClusters, ids: &'a Ids) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            let r = roles(p, ids, self.reverse);
            none_left::<LiqoIdentity>(inner, &r.consumer, &r.provider_id, "identities").await
        }
        .boxed()
    }
}

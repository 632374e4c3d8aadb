//! `network`: a Configuration on each side, the GatewayServer on the provider, then (once
//! the server's Service has an address) the GatewayClient on the consumer; waits until
//! both sides' Connections are Connected. The server goes first because the client needs
//! its address, so this is a step of its own rather than an object set.

use std::sync::Arc;

use ferry_kube::Check;
use ferry_kube::step_errors::wait_err;
use ferry_task::{Output, Step, StepContext, StepError, StepPolicy, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::liqo_check::IDS;
use super::{LiqoConnection, LiqoGatewayServer, connected, none_left};
use crate::handler::Inner;
use crate::liqo;
use crate::spec::PeerClusters;

/// The `network` step's output.
pub const NETWORK: Output<Gateway> = Output::new("network");

/// Output of `network`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Gateway {
    /// The GatewayServer's endpoint address the client connects to.
    pub gateway: String,
}

/// The `network` step.
pub(crate) struct Network(Arc<Inner>, StepPolicy);

impl Network {
    pub(crate) fn new(inner: &Arc<Inner>, policy: StepPolicy) -> Self {
        Self(inner.clone(), policy)
    }
}

impl Step<PeerClusters> for Network {
    fn name(&self) -> &str {
        NETWORK.step()
    }

    fn policy(&self) -> StepPolicy {
        self.1.clone()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, PeerClusters>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let (p, ids) = (cx.spec, IDS.required(cx)?);
            let pair = liqo::pair_label(&p.a, &p.b);
            self.0.apply(&p.a, &liqo::configuration(&ids.a, &ids.b, &pair)).await?;
            self.0.apply(&p.b, &liqo::configuration(&ids.b, &ids.a, &pair)).await?;
            self.0.apply(&p.b, &liqo::gateway_server(&ids.a, &pair)).await?;
            cx.progress(20, format!("GatewayServer on {}", p.b));
            let client = self.0.client(&p.b).await?;
            let ns = liqo::tenant_namespace(&ids.a);
            let server = format!("server-{}", ids.a);
            let address = self
                .0
                .cfg
                .watches
                .wait_object::<LiqoGatewayServer, String>(&p.b, &client, Some(&ns), &server, p.timeout(), |s| {
                    match s.and_then(|s| s.status_at("/endpoint/addresses/0")).and_then(Value::as_str) {
                        Some(a) => Check::Done(a.to_owned()),
                        None => Check::Pending("no endpoint address yet".into()),
                    }
                })
                .await
                .map_err(|e| wait_err(codes::GATEWAY_NOT_CONNECTED, e))?;
            self.0.apply(&p.a, &liqo::gateway_client(&ids.b, &address, &pair)).await?;
            cx.progress(50, format!("GatewayClient on {} toward {address}", p.a));
            connected(&self.0, &p.a, &ids.b, p.timeout()).await?;
            connected(&self.0, &p.b, &ids.a, p.timeout()).await?;
            cx.progress(100, "gateways connected");
            NETWORK.value(&Gateway { gateway: address })
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, PeerClusters>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            let (p, ids) = (cx.spec, IDS.required(cx)?);
            let pair = liqo::pair_label(&p.a, &p.b);
            // The gateway's direction is the peering's (client on the consumer), and an
            // unpeer may name the pair in either order: both orientations are removed.
            for (client_side, server_side, client_id, server_id) in [(&p.a, &p.b, &ids.a, &ids.b), (&p.b, &p.a, &ids.b, &ids.a)] {
                self.0.delete_own(client_side, &liqo::gateway_client(server_id, "", &pair), &pair).await?;
                self.0.delete_own(server_side, &liqo::gateway_server(client_id, &pair), &pair).await?;
            }
            self.0.delete_own(&p.b, &liqo::configuration(&ids.b, &ids.a, &pair), &pair).await?;
            self.0.delete_own(&p.a, &liqo::configuration(&ids.a, &ids.b, &pair), &pair).await?;
            none_left::<LiqoConnection>(&self.0, &p.a, &ids.b, "connections").await?;
            none_left::<LiqoConnection>(&self.0, &p.b, &ids.a, "connections").await?;
            cx.progress(100, "gateways removed");
            Ok(())
        }
        .boxed()
    }
}

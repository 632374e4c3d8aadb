//! `network`: `liqoctl network connect` (liqotech/liqo `pkg/liqoctl/network/handler.go`,
//! `RunConnect`), in its order: a Configuration on each side holding the other's pod and
//! external CIDRs as its IPAM has them, then waits until Liqo remapped both
//! (`NetworkCIDRsConfigured` at the current generation, `CheckNetworkInitialized`); the
//! GatewayServer on the provider from the `wireguard-server` template, then its published
//! endpoint; the GatewayClient on the consumer toward that endpoint; then the key
//! exchange: each gateway's WireGuard public key (its `status.secretRef` Secret, field
//! `publicKey`) into a PublicKey on the other side (`EnsurePublicKey`), owned by the local
//! gateway; waits until both sides' Connections are Connected. A gateway Liqo refuses to
//! deploy (no template) fails with Liqo's reason. Undo removes the pair's PublicKeys,
//! gateways and Configurations, both orientations, and waits for the Connections to go.

use std::sync::Arc;

use ferry_kube::Check;
use ferry_kube::step_errors::wait_err;
use ferry_task::{Output, Step, StepContext, StepError, StepPolicy, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Secret;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::liqo_check::IDS;
use super::{LiqoConfiguration, LiqoConnection, LiqoGatewayClient, LiqoGatewayServer, connected, none_left};
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

/// A gateway as the key exchange needs it: its uid and its key Secret's reference.
struct Deployed {
    uid: String,
    secret: (String, String),
    endpoint: Option<(Vec<String>, i64)>,
}

impl Network {
    /// Waits until Liqo configured the Configuration on `cluster` toward the remote.
    async fn configured(&self, cluster: &str, to: &liqo::Toward, timeout: std::time::Duration) -> Result<(), StepError> {
        let client = self.0.client(cluster).await?;
        self.0
            .cfg
            .watches
            .wait_object::<LiqoConfiguration, ()>(cluster, &client, Some(&to.namespace), &to.remote_id, timeout, |c| {
                let Some(c) = c else { return Check::Pending("no Configuration".into()) };
                let cond = c.status_at("/conditions").and_then(Value::as_array).and_then(|cs| cs.iter().find(|x| x["type"] == "NetworkCIDRsConfigured"));
                let current = cond.is_some_and(|x| x["status"] == "True" && x["observedGeneration"].as_i64() == c.metadata.generation);
                if current {
                    Check::Done(())
                } else {
                    Check::Pending(format!("NetworkCIDRsConfigured: {}", cond.and_then(|x| x["reason"].as_str()).unwrap_or("(none)")))
                }
            })
            .await
            .map_err(|e| wait_err(codes::LIQO_NOT_READY, e))
    }

    /// Waits until the gateway `K` on `cluster` toward the remote (named after it) is
    /// deployed (its key Secret referenced, and for a server its endpoint published); a
    /// refusal Liqo recorded on it is in the error.
    async fn deployed<K>(&self, cluster: &str, to: &liqo::Toward, server: bool, timeout: std::time::Duration) -> Result<Deployed, StepError>
    where
        K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static + Status,
    {
        let client = self.0.client(cluster).await?;
        let (ns, remote) = (&to.namespace, &to.remote_id);
        let kind = K::kind(&()).into_owned();
        let got = self
            .0
            .cfg
            .watches
            .wait_object::<K, Deployed>(cluster, &client, Some(ns), remote, timeout, |g| {
                let Some(g) = g else { return Check::Pending(format!("no {kind}")) };
                let st = g.status();
                let secret = (st.pointer("/secretRef/namespace").and_then(Value::as_str), st.pointer("/secretRef/name").and_then(Value::as_str));
                let addresses: Vec<String> =
                    st.pointer("/endpoint/addresses").and_then(Value::as_array).map(|a| a.iter().filter_map(|x| x.as_str().map(str::to_owned)).collect()).unwrap_or_default();
                let port = st.pointer("/endpoint/port").and_then(Value::as_i64).unwrap_or(liqo::GATEWAY_PORT);
                match secret {
                    (Some(sns), Some(sname)) if !server || !addresses.is_empty() => Check::Done(Deployed {
                        uid: g.meta().uid.clone().unwrap_or_default(),
                        secret: (sns.to_owned(), sname.to_owned()),
                        endpoint: server.then_some((addresses, port)),
                    }),
                    _ => Check::Pending(format!("the {kind} is not deployed yet (no key Secret{})", if server { " or endpoint" } else { "" })),
                }
            })
            .await;
        match got {
            Ok(d) => Ok(d),
            Err(e) => {
                let mut err = wait_err(codes::GATEWAY_NOT_CONNECTED, e);
                if let Some(why) = self.0.refusal(cluster, ns, &K::kind(&()), remote, None).await {
                    err = StepError::permanent(codes::GATEWAY_NOT_CONNECTED, format!("{err}; Liqo on {cluster}: {why}"));
                }
                Err(err)
            }
        }
    }

    /// The public key in a gateway's key Secret on `cluster`.
    async fn key(&self, cluster: &str, secret: &(String, String)) -> Result<Vec<u8>, StepError> {
        let client = self.0.client(cluster).await?;
        let s = kube::Api::<Secret>::namespaced(client, &secret.0)
            .get(&secret.1)
            .await
            .map_err(|e| StepError::transient(codes::CLUSTER_API, format!("reading the gateway key Secret {}/{} on {cluster}: {}", secret.0, secret.1, ferry_kube::said::said(&e))))?;
        s.data.and_then(|d| d.get("publicKey").map(|k| k.0.clone())).filter(|k| !k.is_empty()).ok_or_else(|| {
            StepError::transient(codes::GATEWAY_NOT_CONNECTED, format!("the gateway key Secret {}/{} on {cluster} has no publicKey yet", secret.0, secret.1))
        })
    }
}

/// The status of the gateway kinds.
pub(crate) trait Status {
    fn status(&self) -> &Value;
}

impl Status for LiqoGatewayServer {
    fn status(&self) -> &Value {
        &self.status
    }
}

impl Status for LiqoGatewayClient {
    fn status(&self) -> &Value {
        &self.status
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
            let (on_a, on_b) = (ids.a_side(), ids.b_side());
            // `initNetworkConfigs`: each side learns the other's CIDRs from its IPAM.
            let (cidrs_a, cidrs_b) = (self.0.ipam_cidrs(&p.a, p.timeout()).await?, self.0.ipam_cidrs(&p.b, p.timeout()).await?);
            self.0.apply(&p.a, &liqo::configuration(&on_a, &cidrs_b, &pair)).await?;
            self.0.apply(&p.b, &liqo::configuration(&on_b, &cidrs_a, &pair)).await?;
            self.configured(&p.a, &on_a, p.timeout()).await?;
            self.configured(&p.b, &on_b, p.timeout()).await?;
            cx.progress(20, "network configurations remapped on both sides");
            // The server on the provider, then the client toward its endpoint.
            self.0.apply(&p.b, &liqo::gateway_server(&on_b, &pair)).await?;
            let server = self.deployed::<LiqoGatewayServer>(&p.b, &on_b, true, p.timeout()).await?;
            let (addresses, port) = server.endpoint.clone().unwrap_or_default();
            cx.progress(40, format!("GatewayServer on {} at {} port {port}", p.b, ferry_task::report::listed(&addresses)));
            self.0.apply(&p.a, &liqo::gateway_client(&on_a, &addresses, port, &pair)).await?;
            let client = self.deployed::<LiqoGatewayClient>(&p.a, &on_a, false, p.timeout()).await?;
            cx.progress(60, format!("GatewayClient on {} toward {}", p.a, ferry_task::report::listed(&addresses)));
            // The key exchange: each side gets the other gateway's key.
            let server_key = self.key(&p.b, &server.secret).await?;
            let client_key = self.key(&p.a, &client.secret).await?;
            let client_name = ids.b.clone();
            let server_name = ids.a.clone();
            self.0.apply(&p.a, &liqo::public_key(&on_a, &server_key, ("GatewayClient", &client_name, &client.uid), &pair)).await?;
            self.0.apply(&p.b, &liqo::public_key(&on_b, &client_key, ("GatewayServer", &server_name, &server.uid), &pair)).await?;
            cx.progress(70, "public keys exchanged");
            connected(&self.0, &p.a, &on_a, p.timeout()).await?;
            connected(&self.0, &p.b, &on_b, p.timeout()).await?;
            cx.progress(100, "gateways connected");
            NETWORK.value(&Gateway { gateway: addresses.first().cloned().unwrap_or_default() })
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, PeerClusters>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            let (p, ids) = (cx.spec, IDS.required(cx)?);
            let pair = liqo::pair_label(&p.a, &p.b);
            let none = liqo::Cidrs::default();
            let (on_a, on_b) = (ids.a_side(), ids.b_side());
            // The gateway's direction is the peering's (client on the consumer), and an
            // unpeer may name the pair in either order: both orientations are removed.
            for (client_side, server_side, at_client, at_server) in [(&p.a, &p.b, &on_a, &on_b), (&p.b, &p.a, &on_b, &on_a)] {
                self.0.delete_own(client_side, &liqo::public_key(at_client, &[], ("GatewayClient", "", ""), &pair), &pair).await?;
                self.0.delete_own(server_side, &liqo::public_key(at_server, &[], ("GatewayServer", "", ""), &pair), &pair).await?;
                self.0.delete_own(client_side, &liqo::gateway_client(at_client, &[], 0, &pair), &pair).await?;
                self.0.delete_own(server_side, &liqo::gateway_server(at_server, &pair), &pair).await?;
            }
            self.0.delete_own(&p.b, &liqo::configuration(&on_b, &none, &pair), &pair).await?;
            self.0.delete_own(&p.a, &liqo::configuration(&on_a, &none, &pair), &pair).await?;
            none_left::<LiqoConnection>(&self.0, &p.a, &on_a, "connections").await?;
            none_left::<LiqoConnection>(&self.0, &p.b, &on_b, "connections").await?;
            cx.progress(100, "gateways removed");
            Ok(())
        }
        .boxed()
    }
}

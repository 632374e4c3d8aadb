//! `established`: waits until each consumer's ForeignCluster reports its networking and
//! authentication modules Established and offloading Ready, as `liqoctl info` shows a
//! working peering. It changes nothing.

use std::sync::Arc;

use ferry_kube::Check;
use ferry_kube::step_errors::wait_err;
use ferry_task::{CheckStep, Output, StepContext, StepError, StepPolicy, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::LiqoForeignCluster;
use super::liqo_check::IDS;
use crate::handler::Inner;
use crate::spec::PeerClusters;

/// The `established` step's output.
pub const ESTABLISHED: Output<Established> = Output::new("established");

/// Output of `established`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Established {
    /// Each consumer's ForeignCluster.
    pub foreign_clusters: Vec<ForeignClusterRole>,
}

/// A ForeignCluster and the role Liqo gave it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ForeignClusterRole {
    /// The cluster holding it.
    pub cluster: String,
    /// Its name: the remote's cluster id.
    pub remote: String,
    /// `status.role` (Provider, Consumer, ConsumerAndProvider).
    pub role: String,
}

/// The `established` step.
pub(crate) struct EstablishedCheck(pub(crate) Arc<Inner>, pub(crate) StepPolicy);

impl CheckStep<PeerClusters> for EstablishedCheck {
    fn name(&self) -> &str {
        ESTABLISHED.step()
    }

    fn policy(&self) -> StepPolicy {
        self.1.clone()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, PeerClusters>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let (p, ids) = (cx.spec, IDS.required(cx)?);
            let mut sides = vec![(p.a.clone(), ids.b.clone())];
            if p.bidirectional {
                sides.push((p.b.clone(), ids.a.clone()));
            }
            let mut foreign_clusters = Vec::new();
            for (cluster, remote) in sides {
                let client = self.0.client(&cluster).await?;
                let role = self
                    .0
                    .cfg
                    .watches
                    .wait_object::<LiqoForeignCluster, String>(&cluster, &client, None, &remote, p.timeout(), |fc| {
                        let Some(fc) = fc else { return Check::Pending("no ForeignCluster".into()) };
                        let status = |module: &str, type_: &str| {
                            fc.status_at(&format!("/modules/{module}/conditions"))
                                .and_then(Value::as_array)
                                .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
                                .and_then(|c| c["status"].as_str())
                                .unwrap_or("(none)")
                                .to_owned()
                        };
                        let (n, a, o) = (
                            status("networking", "NetworkConnectionStatus"),
                            status("authentication", "AuthIdentityControlPlaneStatus"),
                            status("offloading", "OffloadingVirtualNodeStatus"),
                        );
                        if n == "Established" && a == "Established" && o == "Ready" {
                            Check::Done(fc.status_at("/role").and_then(Value::as_str).unwrap_or("").to_owned())
                        } else {
                            Check::Pending(format!("networking {n}, authentication {a}, offloading {o}"))
                        }
                    })
                    .await
                    .map_err(|e| wait_err(codes::NOT_ESTABLISHED, e))?;
                cx.progress(100, format!("ForeignCluster {remote} on {cluster}: established ({role})"));
                foreign_clusters.push(ForeignClusterRole { cluster, remote, role });
            }
            ESTABLISHED.value(&Established { foreign_clusters })
        }
        .boxed()
    }
}

//! `established`: waits until each consumer's ForeignCluster reports its networking
//! Established and its authentication and offloading modules Ready, as `liqoctl info` shows
//! a working peering. It changes nothing.

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
                    .wait_object::<LiqoForeignCluster, String>(&cluster, &client, None, &remote, p.timeout(), |fc| match fc {
                        Some(fc) => established(&fc.status),
                        None => Check::Pending("no ForeignCluster".into()),
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

/// Judges a consumer's ForeignCluster of its provider by the conditions upstream's
/// controller writes (liqotech/liqo `557c199`,
/// `pkg/liqo-controller-manager/core/foreigncluster-controller/status.go`):
/// `NetworkConnectionStatus` is `Established` once the Connection is Connected
/// (`handleConnectionStatus`); `AuthIdentityControlPlaneStatus` is `Ready` once the
/// Identity's kubeconfig exists (`handleAuthenticationModuleStatus`: Ready or NotReady, never
/// Established); `OffloadingVirtualNodeStatus` is `Ready` once the VirtualNode is
/// (`handleOffloadingModuleStatus`). Done with `status.role`.
fn established(status: &Value) -> Check<String> {
    let condition = |module: &str, type_: &str| {
        status
            .pointer(&format!("/modules/{module}/conditions"))
            .and_then(Value::as_array)
            .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
            .and_then(|c| c["status"].as_str())
            .unwrap_or("(none)")
            .to_owned()
    };
    let (n, a, o) = (
        condition("networking", "NetworkConnectionStatus"),
        condition("authentication", "AuthIdentityControlPlaneStatus"),
        condition("offloading", "OffloadingVirtualNodeStatus"),
    );
    if n == "Established" && a == "Ready" && o == "Ready" {
        Check::Done(status.pointer("/role").and_then(Value::as_str).unwrap_or("").to_owned())
    } else {
        Check::Pending(format!("networking {n}, authentication {a}, offloading {o}"))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn cond(type_: &str, status: &str) -> Value {
        json!({"type": type_, "status": status, "reason": type_, "message": "", "lastTransitionTime": "2026-11-01T00:00:00Z"})
    }

    /// A consumer's ForeignCluster as upstream's `status.go` writes it for a working
    /// peering: networking Established, authentication Ready, offloading Ready.
    #[test]
    fn upstream_shaped_status_is_established() {
        let status = json!({
            "role": "Provider",
            "modules": {
                "networking": {"enabled": true, "conditions": [cond("NetworkConnectionStatus", "Established"), cond("NetworkGatewayPresence", "Ready")]},
                "authentication": {"enabled": true, "conditions": [cond("AuthIdentityControlPlaneStatus", "Ready")]},
                "offloading": {"enabled": true, "conditions": [cond("OffloadingVirtualNodeStatus", "Ready"), cond("OffloadingNodeStatus", "Ready")]},
            },
        });
        assert!(matches!(established(&status), Check::Done(role) if role == "Provider"));
    }

    #[test]
    fn a_module_not_ready_is_pending() {
        for (n, a, o) in [("Pending", "Ready", "Ready"), ("Established", "NotReady", "Ready"), ("Established", "Ready", "NotReady"), ("Established", "Established", "Ready")] {
            let status = json!({"modules": {
                "networking": {"conditions": [cond("NetworkConnectionStatus", n)]},
                "authentication": {"conditions": [cond("AuthIdentityControlPlaneStatus", a)]},
                "offloading": {"conditions": [cond("OffloadingVirtualNodeStatus", o)]},
            }});
            assert!(matches!(established(&status), Check::Pending(_)), "{n} {a} {o}");
        }
        assert!(matches!(established(&json!({})), Check::Pending(why) if why.contains("(none)")));
    }
}

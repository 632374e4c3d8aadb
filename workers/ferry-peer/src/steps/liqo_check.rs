//! `check` of a Liqo peering: both clusters are known (an unknown one rejects the
//! command), each has a Ready node of its own and a running Liqo with a cluster id, its
//! IPAM's pod and external CIDRs, and the gateway template its side of the network needs
//! (`wireguard-client` on `a`, `wireguard-server` on `b`: liqoctl's `CheckTemplateGwClient`
//! / `CheckTemplateGwServer`, `pkg/liqoctl/network/handler.go`), within the command's
//! timeout. The ids are its output; every later Liqo step names objects by
//! them, and whether each side already had a ForeignCluster of the other (what a revert
//! leaves in place).
//!
//! It also records what of the peering already exists and is not Ferry's for this pair
//! (not labelled [`liqo::PEERING_LABEL`]`=<pair>`), since Ferry's applies are forced
//! server-side applies that would take such an object over and its undo would then delete
//! it:
//! - a Liqo tenant namespace for the remote (labelled `liqo.io/tenant-namespace` and
//!   `liqo.io/remote-cluster-id=<remote>`) is reused as Liqo's namespace manager reuses it
//!   (liqotech/liqo `pkg/tenantNamespace/namespaceManager.go`, `CreateNamespace` returns the
//!   existing one) and left alone: never labelled, never deleted. `liqoctl unpeer` leaves
//!   tenant namespaces behind unless `--delete-namespaces` (`pkg/liqoctl/unpeer/handler.go`),
//!   and their owners keep their own things in them; a person peering again expects it to
//!   work and their namespace to outlive Ferry's revert;
//! - a namespace of that name that is not a Liqo tenant namespace for the remote refuses a
//!   peer (`OBJECT_NOT_FERRYS`), as upstream's `CreateNamespace` fails to create it;
//! - a Configuration, GatewayServer, GatewayClient, Tenant, Identity or ResourceSlice the
//!   peer would apply that is not Ferry's means the pair is already peered (or half
//!   peered) outside Ferry (`liqoctl peer` names them alike: `pkg/liqoctl/peer/handler.go`,
//!   `networking/forge/*.go`): the peer is refused (`OBJECT_NOT_FERRYS`, naming them).
//!   Leaving them alone while adding Ferry's halves would mix two owners in one peering,
//!   and taking them over would rewrite a working peering and delete it on revert: refusing
//!   is the only safe choice.
//!
//! An unpeer refuses nothing: it removes only what is labelled for the pair. It changes
//! nothing.

use std::sync::Arc;

use ferry_kube::ClusterError;
use ferry_kube::step_errors::kube_err;
use ferry_kube::vocab::liqo::TENANT_NAMESPACE_LABEL;
use ferry_task::{CheckStep, Output, StepContext, StepError, StepPolicy, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{LiqoClientTemplate, LiqoServerTemplate, roles};
use crate::handler::Inner;
use crate::liqo::{self, PEERING_LABEL};
use crate::spec::{PeerClusters, PeerOperation};

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
    /// `a`'s tenant namespace for `b` existed before and is not Ferry's for this pair: the
    /// peering reuses it and never labels nor deletes it (records without it: false, as
    /// Ferry then labelled what it applied).
    #[serde(default)]
    pub a_namespace_kept: bool,
    /// `b`'s tenant namespace for `a` existed before and is not Ferry's.
    #[serde(default)]
    pub b_namespace_kept: bool,
}

impl Ids {
    /// Whether `cluster`'s tenant namespace for the other (`a` or `b` of `p`) is kept.
    pub fn namespace_kept(&self, p: &PeerClusters, cluster: &str) -> bool {
        (cluster == p.a && self.a_namespace_kept) || (cluster == p.b && self.b_namespace_kept)
    }
}

/// What is on a cluster under a tenant namespace's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Existing {
    /// None there, or Ferry's own for this pair: the peering applies it (its undo deletes it).
    Ferrys,
    /// Liqo's tenant namespace for the remote, not Ferry's: reused, left alone.
    TenantNamespace,
    /// A namespace that is neither: a peer cannot use it.
    Other,
}

/// Judges `ns` (as stored, if any) as `remote`'s tenant namespace for `pair`.
fn judge_namespace(ns: Option<&Value>, remote: &str, pair: &str) -> Existing {
    let Some(ns) = ns else { return Existing::Ferrys };
    let label = |k: &str| ns.pointer("/metadata/labels").and_then(|l| l.get(k)).and_then(Value::as_str);
    if !not_ours(ns, pair) {
        Existing::Ferrys
    } else if label(TENANT_NAMESPACE_LABEL).is_some() && label(liqo::REMOTE_ID_LABEL) == Some(remote) {
        Existing::TenantNamespace
    } else {
        Existing::Other
    }
}

/// Whether `obj` as stored is someone else's than this pair's peering.
fn not_ours(obj: &Value, pair: &str) -> bool {
    obj.pointer("/metadata/labels").and_then(|l| l.get(PEERING_LABEL)).and_then(Value::as_str) != Some(pair)
}

impl LiqoCheck {
    /// `obj` as stored on `cluster`, if it is there (a kind not served counts as absent:
    /// the apply says so).
    async fn stored(&self, cluster: &str, obj: &Value) -> Result<Option<Value>, StepError> {
        match self.0.cfg.clusters.get(cluster, obj).await {
            Ok(o) => Ok(o.map(|o| serde_json::to_value(o).unwrap_or_default())),
            Err(ClusterError::NotServed { .. }) => Ok(None),
            Err(e) => Err(kube_err(codes::CLUSTER_API, e)),
        }
    }

    /// Whether `cluster`'s tenant namespace for `remote` is kept; refuses a peer when the
    /// name is taken by a namespace that is not a Liqo tenant namespace for `remote`.
    async fn namespace_kept(&self, p: &PeerClusters, cluster: &str, remote: &str, pair: &str) -> Result<bool, StepError> {
        let probe = liqo::namespace(remote, pair);
        let ns = self.stored(cluster, &probe).await?;
        match judge_namespace(ns.as_ref(), remote, pair) {
            Existing::Ferrys => Ok(false),
            Existing::TenantNamespace => Ok(true),
            // An unpeer only removes the pair's own: it leaves this one as it leaves any.
            Existing::Other if p.operation == PeerOperation::Unpeer => Ok(true),
            Existing::Other => Err(StepError::permanent(
                codes::OBJECT_NOT_FERRYS,
                format!(
                    "Namespace {} on {cluster} exists and is neither Ferry's for {pair} nor a Liqo tenant namespace for {remote} (labels {TENANT_NAMESPACE_LABEL}, {}={remote}): Liqo's namespace manager could not create it either; Ferry leaves it alone",
                    liqo::tenant_namespace(remote),
                    liqo::REMOTE_ID_LABEL
                ),
            )),
        }
    }

    /// The Liqo objects a peer would apply that exist and are not this pair's.
    async fn foreign_objects(&self, p: &PeerClusters, ids: &Ids, pair: &str) -> Result<Vec<String>, StepError> {
        let none = liqo::Cidrs::default();
        let mut would = vec![
            (p.a.clone(), liqo::configuration(&ids.b, &none, pair)),
            (p.b.clone(), liqo::configuration(&ids.a, &none, pair)),
            (p.b.clone(), liqo::gateway_server(&ids.a, pair)),
            (p.a.clone(), liqo::gateway_client(&ids.b, &[], 0, pair)),
        ];
        let directions: &[bool] = if p.bidirectional { &[false, true] } else { &[false] };
        for &reverse in directions {
            let r = roles(p, ids, reverse);
            would.push((r.provider.clone(), liqo::tenant(&r.consumer_id, &liqo::Handshake::default(), pair)));
            would.push((r.consumer.clone(), liqo::identity(&r.provider_id, &json!({}), "", pair)));
            would.push((r.consumer.clone(), liqo::resource_slice(&r.provider_id, pair)));
        }
        let mut foreign = Vec::new();
        for (cluster, obj) in &would {
            if self.stored(cluster, obj).await?.is_some_and(|o| not_ours(&o, pair)) {
                foreign.push(format!("{} on {cluster}", ferry_kube::dry_run::describe(obj)));
            }
        }
        Ok(foreign)
    }
}

fn known() -> bool {
    true
}

impl Default for Ids {
    fn default() -> Self {
        Self { a: String::new(), b: String::new(), a_knew_b: true, b_knew_a: true, a_namespace_kept: false, b_namespace_kept: false }
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
            let pair = liqo::pair_label(&p.a, &p.b);
            let a_namespace_kept = self.namespace_kept(p, &p.a, &b, &pair).await?;
            let b_namespace_kept = self.namespace_kept(p, &p.b, &a, &pair).await?;
            let ids = Ids { a, b, a_knew_b, b_knew_a, a_namespace_kept, b_namespace_kept };
            if p.operation == PeerOperation::Peer {
                let foreign = self.foreign_objects(p, &ids, &pair).await?;
                if !foreign.is_empty() {
                    return Err(StepError::permanent(
                        codes::OBJECT_NOT_FERRYS,
                        format!(
                            "{} and {} are already peered outside Ferry: {} not Ferry's (not labelled {PEERING_LABEL}={pair}); Ferry would take it over and a revert would delete it. Unpeer them with liqoctl first, or leave this pair to it",
                            p.a,
                            p.b,
                            foreign.join(", ")
                        ),
                    ));
                }
            }
            for (cluster, remote, kept) in [(&p.a, &ids.b, ids.a_namespace_kept), (&p.b, &ids.a, ids.b_namespace_kept)] {
                if kept {
                    cx.progress(90, format!("Namespace {} on {cluster} exists and is not Ferry's: reused, never labelled or deleted", liqo::tenant_namespace(remote)));
                }
            }
            cx.progress(100, "networks and gateway templates in place");
            IDS.value(&ids)
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_namespace_is_kept_unless_it_is_the_pairs() {
        let pair = liqo::pair_label("member-1", "member-2");
        let ours = liqo::namespace("member-2", &pair);
        assert_eq!(judge_namespace(None, "member-2", &pair), Existing::Ferrys);
        assert_eq!(judge_namespace(Some(&ours), "member-2", &pair), Existing::Ferrys);
        // Liqo's (or a person's made alike): its labels without the pair's.
        let mut liqos = ours.clone();
        liqos["metadata"]["labels"].as_object_mut().unwrap().remove(PEERING_LABEL);
        assert_eq!(judge_namespace(Some(&liqos), "member-2", &pair), Existing::TenantNamespace);
        assert_eq!(judge_namespace(Some(&liqos), "member-3", &pair), Existing::Other, "a tenant namespace for another remote");
        let plain = json!({"metadata": {"name": "liqo-tenant-member-2"}});
        assert_eq!(judge_namespace(Some(&plain), "member-2", &pair), Existing::Other);
        let other_pair = liqo::namespace("member-2", &liqo::pair_label("member-2", "member-3"));
        assert_eq!(judge_namespace(Some(&other_pair), "member-2", &pair), Existing::TenantNamespace);
        assert!(not_ours(&plain, &pair) && !not_ours(&ours, &pair));
    }
}

//! `check` of a Liqo peering: both clusters are known (an unknown one rejects the
//! command), each has a Ready node of its own and a running Liqo with a cluster id, its
//! IPAM's pod and external CIDRs, and the gateway template its side of the network needs
//! (`wireguard-client` on `a`, `wireguard-server` on `b`: liqoctl's `CheckTemplateGwClient`
//! / `CheckTemplateGwServer`, `pkg/liqoctl/network/handler.go`), and, for a peer, on each
//! provider the ClusterRoles Liqo's tenant controller binds for a consumer (without them
//! it reconciles no Tenant and says nothing: `ensureSetup`), within the command's
//! timeout. The ids are its output; every later Liqo step names objects by
//! them, and whether each side already had a ForeignCluster of the other (what a revert
//! leaves in place).
//!
//! Each side's tenant namespace for the other is found as Liqo finds it, by its labels
//! (liqotech/liqo `pkg/tenantNamespace/namespaceManager.go`, `GetNamespace`:
//! `liqo.io/remote-cluster-id=<remote>` and `liqo.io/tenant-namespace`), whatever its name;
//! only when there is none does the peering make one under the default name, as
//! `CreateNamespace` does. Its name is recorded ([`Ids::a_namespace`]) and every later step
//! puts its objects there. More than one is refused (`TENANT_NAMESPACES`), as Liqo's
//! manager refuses it ("multiple tenant namespaces found").
//!
//! It also records what of the peering already exists and is not Ferry's for this pair
//! (not labelled [`liqo::PEERING_LABEL`]`=<pair>`), since Ferry's applies are forced
//! server-side applies that would take such an object over and its undo would then delete
//! it:
//! - a Liqo tenant namespace for the remote that is not Ferry's is reused as Liqo's
//!   namespace manager reuses it (`CreateNamespace` returns the existing one) and left
//!   alone: never labelled, never deleted. `liqoctl unpeer` leaves tenant namespaces behind
//!   unless `--delete-namespaces` (`pkg/liqoctl/unpeer/handler.go`), and their owners keep
//!   their own things in them; a person peering again expects it to work and their
//!   namespace to outlive Ferry's revert;
//! - where there is none, a namespace of the default name (not a Liqo tenant namespace for
//!   the remote, else Liqo's labels would have found it) refuses a peer
//!   (`OBJECT_NOT_FERRYS`), as upstream's `CreateNamespace` fails to create it;
//! - a Configuration, GatewayServer, GatewayClient, Tenant, Identity or ResourceSlice the
//!   peer would apply that is not Ferry's means the pair is already peered (or half
//!   peered) outside Ferry (`liqoctl peer` names them alike: `pkg/liqoctl/peer/handler.go`,
//!   `networking/forge/*.go`): the peer is refused (`OBJECT_NOT_FERRYS`, naming them).
//!   Leaving them alone while adding Ferry's halves would mix two owners in one peering,
//!   and taking them over would rewrite a working peering and delete it on revert: refusing
//!   is the only safe choice;
//! - every object a peer would apply already there and the pair's: an earlier Ferry task
//!   peered the pair. The peer *reuses* the peering ([`Ids::reused`]): it applies nothing,
//!   checks that the peering is established, and its undo removes nothing (the peering is
//!   the earlier task's; a revert of that one, or an unpeer, removes it), as a burst reuses
//!   a namespace another task offloaded. Without this, a second peer took the objects for
//!   its own and its revert unpeered the pair under the first;
//! - some of them the pair's and some missing: the pair is partly peered (an undo that did
//!   not finish, or a peering of the other direction): refused (`PARTLY_PEERED`), naming
//!   both, since neither owning nor reusing it is right.
//!
//! An unpeer refuses nothing but ambiguous tenant namespaces: it removes only what is
//! labelled for the pair. It changes nothing.

use std::sync::Arc;

use ferry_kube::ClusterError;
use ferry_kube::step_errors::{api_err, kube_err};
use ferry_kube::vocab::liqo::TENANT_NAMESPACE_LABEL;
use ferry_task::{CheckStep, Output, StepContext, StepError, StepPolicy, codes};
use futures::FutureExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::ListParams;
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
    /// `a`'s tenant namespace for `b`, found by Liqo's labels (records without it: the
    /// default name, the only one Ferry used then).
    #[serde(default)]
    pub a_namespace: String,
    /// `b`'s tenant namespace for `a`.
    #[serde(default)]
    pub b_namespace: String,
    /// The pair was peered by an earlier Ferry task when this one checked: it applies
    /// nothing and its undo removes nothing.
    #[serde(default)]
    pub reused: bool,
}

impl Ids {
    /// Whether `cluster`'s tenant namespace for the other (`a` or `b` of `p`) is kept.
    pub fn namespace_kept(&self, p: &PeerClusters, cluster: &str) -> bool {
        (cluster == p.a && self.a_namespace_kept) || (cluster == p.b && self.b_namespace_kept)
    }

    /// `a`'s side toward `b`: `b`'s id and `a`'s tenant namespace for it.
    pub fn a_side(&self) -> liqo::Toward {
        liqo::Toward::new(&self.b, &self.a_namespace)
    }

    /// `b`'s side toward `a`.
    pub fn b_side(&self) -> liqo::Toward {
        liqo::Toward::new(&self.a, &self.b_namespace)
    }

    /// Each cluster of `p` with its side toward the other.
    pub fn sides<'p>(&self, p: &'p PeerClusters) -> [(&'p String, liqo::Toward); 2] {
        [(&p.a, self.a_side()), (&p.b, self.b_side())]
    }
}

/// What `check` makes of a cluster's tenant namespace for a remote.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Existing {
    /// None there (the peering makes it under this name), or Ferry's own for this pair:
    /// the peering applies it (its undo deletes it).
    Ferrys(String),
    /// Liqo's tenant namespace for the remote, not Ferry's: reused, left alone.
    TenantNamespace(String),
    /// None found by Liqo's labels, and a namespace that is not one has the default name:
    /// a peer cannot make it.
    Other(String),
    /// More than one found by Liqo's labels.
    Ambiguous(Vec<String>),
}

/// Judges a cluster's tenant namespaces for a remote: `selected`, those Liqo's labels
/// select, and `default`, the default name and what is stored under it (if anything).
fn judge_namespace(selected: &[Value], default: (&str, Option<&Value>), pair: &str) -> Existing {
    let name = |ns: &Value| ns.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_owned();
    match selected {
        [] if default.1.is_some() => Existing::Other(default.0.to_owned()),
        [] => Existing::Ferrys(default.0.to_owned()),
        [ns] if !not_ours(ns, pair) => Existing::Ferrys(name(ns)),
        [ns] => Existing::TenantNamespace(name(ns)),
        many => Existing::Ambiguous(many.iter().map(name).collect()),
    }
}

/// Whether `obj` as stored is someone else's than this pair's peering.
fn not_ours(obj: &Value, pair: &str) -> bool {
    !liqo::is_pairs(obj, pair)
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

    /// `cluster`'s tenant namespace for `remote` and whether it is kept (not Ferry's);
    /// refuses a peer when Liqo's labels find none and the default name is taken by a
    /// namespace that is not a tenant namespace, and any operation when they find several.
    async fn tenant_namespace(&self, p: &PeerClusters, cluster: &str, remote: &str, pair: &str) -> Result<(String, bool), StepError> {
        let client = self.0.client(cluster).await?;
        let selector = format!("{}={remote},{TENANT_NAMESPACE_LABEL}", liqo::REMOTE_ID_LABEL);
        let selected = kube::Api::<Namespace>::all(client)
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(api_err(cluster))?;
        let selected: Vec<Value> = selected.items.iter().map(|n| serde_json::to_value(n).unwrap_or_default()).collect();
        let default = liqo::tenant_namespace(remote);
        let stored = if selected.is_empty() { self.stored(cluster, &liqo::namespace(&liqo::Toward::new(remote, &default), pair)).await? } else { None };
        match judge_namespace(&selected, (&default, stored.as_ref()), pair) {
            Existing::Ferrys(name) => Ok((name, false)),
            Existing::TenantNamespace(name) => Ok((name, true)),
            // An unpeer only removes the pair's own: it leaves this one as it leaves any.
            Existing::Other(name) if p.operation == PeerOperation::Unpeer => Ok((name, true)),
            Existing::Other(name) => Err(StepError::permanent(
                codes::OBJECT_NOT_FERRYS,
                format!(
                    "Namespace {name} on {cluster} exists and is neither Ferry's for {pair} nor a Liqo tenant namespace for {remote} (labels {TENANT_NAMESPACE_LABEL}, {}={remote}): Liqo's namespace manager could not create it either; Ferry leaves it alone",
                    liqo::REMOTE_ID_LABEL
                ),
            )),
            Existing::Ambiguous(names) => Err(StepError::permanent(
                codes::TENANT_NAMESPACES,
                format!(
                    "{cluster} has {} Liqo tenant namespaces for {remote} ({}; labels {selector}): Liqo refuses this too (\"multiple tenant namespaces found for clusterid {remote}\"); remove all but one",
                    names.len(),
                    names.join(", ")
                ),
            )),
        }
    }

    /// What of the Liqo objects a peer would apply exists: (not this pair's, this pair's,
    /// missing), each described with its cluster.
    async fn existing(&self, p: &PeerClusters, ids: &Ids, pair: &str) -> Result<(Vec<String>, Vec<String>, Vec<String>), StepError> {
        let none = liqo::Cidrs::default();
        let (on_a, on_b) = (ids.a_side(), ids.b_side());
        let mut would = vec![
            (p.a.clone(), liqo::configuration(&on_a, &none, pair)),
            (p.b.clone(), liqo::configuration(&on_b, &none, pair)),
            (p.b.clone(), liqo::gateway_server(&on_b, pair)),
            (p.a.clone(), liqo::gateway_client(&on_a, &[], 0, pair)),
        ];
        let directions: &[bool] = if p.bidirectional { &[false, true] } else { &[false] };
        for &reverse in directions {
            let r = roles(p, ids, reverse);
            would.push((r.provider.clone(), liqo::tenant(&r.at_provider, &liqo::Handshake::default(), pair)));
            would.push((r.consumer.clone(), liqo::identity(&r.at_consumer, &json!({}), "", pair)));
            would.push((r.consumer.clone(), liqo::resource_slice(&r.at_consumer, pair)));
        }
        let (mut foreign, mut ours, mut missing) = (Vec::new(), Vec::new(), Vec::new());
        for (cluster, obj) in &would {
            let named = format!("{} on {cluster}", ferry_kube::dry_run::describe(obj));
            match self.stored(cluster, obj).await? {
                Some(o) if not_ours(&o, pair) => foreign.push(named),
                Some(_) => ours.push(named),
                None => missing.push(named),
            }
        }
        Ok((foreign, ours, missing))
    }
}

fn known() -> bool {
    true
}

impl Default for Ids {
    fn default() -> Self {
        Self {
            a: String::new(),
            b: String::new(),
            a_knew_b: true,
            b_knew_a: true,
            a_namespace_kept: false,
            b_namespace_kept: false,
            a_namespace: String::new(),
            b_namespace: String::new(),
            reused: false,
        }
    }
}

/// An unpeer's check that found `down` not ready (gone, or Liqo not running there) names
/// the way out when it is gone for good: a force unpeer cleans `up` alone.
fn way_out(p: &PeerClusters, mut e: StepError, down: &str, up: &str) -> StepError {
    if p.operation == PeerOperation::Unpeer {
        e.message = format!(
            "{}; an unpeer needs both clusters. If {down} is gone for good, operation ForceUnpeer with a: {up}, b: {down} cleans {up}'s side alone (liqoctl force unpeer)",
            e.message
        );
    }
    e
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
            let a = self.0.liqo_ready(&p.a, p.timeout()).await.map_err(|e| way_out(p, e, &p.a, &p.b))?;
            cx.progress(50, format!("Liqo runs on {} (cluster id {a})", p.a));
            let b = self.0.liqo_ready(&p.b, p.timeout()).await.map_err(|e| way_out(p, e, &p.b, &p.a))?;
            cx.progress(80, format!("Liqo runs on {} (cluster id {b})", p.b));
            for c in [&p.a, &p.b] {
                self.0.ipam_cidrs(c, p.timeout()).await?;
            }
            self.0.template::<LiqoClientTemplate>(&p.a, liqo::CLIENT_TEMPLATE, p.timeout()).await?;
            self.0.template::<LiqoServerTemplate>(&p.b, liqo::SERVER_TEMPLATE, p.timeout()).await?;
            if p.operation == PeerOperation::Peer {
                // Each provider's tenant controller must be able to bind the consumer.
                for provider in if p.bidirectional { vec![&p.a, &p.b] } else { vec![&p.b] } {
                    self.0.tenant_roles(provider, p.timeout()).await?;
                }
            }
            let a_knew_b = self.0.foreign_cluster(&p.a, &b).await?;
            let b_knew_a = self.0.foreign_cluster(&p.b, &a).await?;
            let pair = liqo::pair_label(&p.a, &p.b);
            let (a_namespace, a_namespace_kept) = self.tenant_namespace(p, &p.a, &b, &pair).await?;
            let (b_namespace, b_namespace_kept) = self.tenant_namespace(p, &p.b, &a, &pair).await?;
            let mut ids = Ids { a, b, a_knew_b, b_knew_a, a_namespace_kept, b_namespace_kept, a_namespace, b_namespace, reused: false };
            if p.operation == PeerOperation::Peer {
                let (foreign, ours, missing) = self.existing(p, &ids, &pair).await?;
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
                if !ours.is_empty() && !missing.is_empty() {
                    return Err(StepError::permanent(
                        codes::PARTLY_PEERED,
                        format!(
                            "{} and {} are partly peered by an earlier Ferry task ({PEERING_LABEL}={pair}): {} there, {} missing (an undo that did not finish, or a peering of another direction). Unpeer them first",
                            p.a,
                            p.b,
                            ours.join(", "),
                            missing.join(", ")
                        ),
                    ));
                }
                ids.reused = !ours.is_empty();
            }
            for (cluster, ns, kept) in [(&p.a, &ids.a_namespace, ids.a_namespace_kept), (&p.b, &ids.b_namespace, ids.b_namespace_kept)] {
                if kept {
                    cx.progress(90, format!("Namespace {ns} on {cluster} exists and is not Ferry's: reused, never labelled or deleted"));
                }
            }
            if ids.reused {
                cx.progress(95, format!("{} and {} are already peered by an earlier Ferry task: this one reuses the peering, applies nothing and its revert removes nothing", p.a, p.b));
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
    fn a_tenant_namespace_is_found_by_liqos_labels_and_kept_unless_it_is_the_pairs() {
        let pair = liqo::pair_label("member-1", "member-2");
        let default = "liqo-tenant-member-2";
        let ours = liqo::namespace(&liqo::Toward::new("member-2", ""), &pair);
        assert_eq!(judge_namespace(&[], (default, None), &pair), Existing::Ferrys(default.into()));
        assert_eq!(judge_namespace(std::slice::from_ref(&ours), (default, None), &pair), Existing::Ferrys(default.into()));
        // Liqo's (or a person's made alike), under any name: its labels without the pair's.
        let mut liqos = liqo::namespace(&liqo::Toward::new("member-2", "made-by-hand"), &pair);
        liqos["metadata"]["labels"].as_object_mut().unwrap().remove(PEERING_LABEL);
        assert_eq!(judge_namespace(std::slice::from_ref(&liqos), (default, None), &pair), Existing::TenantNamespace("made-by-hand".into()));
        // Liqo's labels find none and the default name is taken: Liqo could not make it.
        let plain = json!({"metadata": {"name": default}});
        assert_eq!(judge_namespace(&[], (default, Some(&plain)), &pair), Existing::Other(default.into()));
        // Two: Liqo's manager refuses to choose, and so does Ferry.
        assert_eq!(judge_namespace(&[ours.clone(), liqos], (default, None), &pair), Existing::Ambiguous(vec![default.into(), "made-by-hand".into()]));
        let other_pair = liqo::namespace(&liqo::Toward::new("member-2", ""), &liqo::pair_label("member-2", "member-3"));
        assert_eq!(judge_namespace(&[other_pair], (default, None), &pair), Existing::TenantNamespace(default.into()));
        assert!(not_ours(&plain, &pair) && !not_ours(&ours, &pair));
    }
}

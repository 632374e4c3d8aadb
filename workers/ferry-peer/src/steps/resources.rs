//! `resources` (and `resources-reverse`): the consumer's ResourceSlice toward the provider
//! (`liqoctl peer`'s `ensureOffloading`, `pkg/liqoctl/rest/resourceslice/create.go`:
//! labelled for replication to the provider, annotated for a virtual node); waits until
//! the provider authorized and accepted it (`ForResourceSliceAuthentication`; a denial
//! fails the step with Liqo's reason) and the virtual node, named after the slice (the
//! provider's id), is Ready. Undo waits until the slice, the VirtualNode, its Node and
//! the NamespaceMaps toward the provider are gone ([`Resources::gone`]).

use ferry_kube::Check;
use ferry_kube::kinds::node_ready;
use ferry_kube::step_errors::wait_err;
use ferry_kube::vocab::liqo::REPLICATION_DESTINATION_LABEL;
use ferry_task::{Output, StepError, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Node;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::liqo_check::Ids;
use super::objects::{ObjectSet, Progress};
use super::{LiqoNamespaceMap, LiqoResourceSlice, LiqoVirtualNode, roles};
use crate::handler::Inner;
use crate::liqo;
use crate::spec::PeerClusters;

/// The `resources` step's output.
pub const RESOURCES: Output<VirtualNode> = Output::new("resources");
/// The `resources-reverse` step's output (bidirectional peerings).
pub const RESOURCES_REVERSE: Output<VirtualNode> = Output::new("resources-reverse");

/// Output of `resources`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct VirtualNode {
    /// The virtual node's name.
    pub virtual_node: String,
    /// The cluster it is on (the consumer).
    pub on: String,
    /// What the provider offers (the ResourceSlice's `status.resources`).
    pub resources: Value,
}

/// Resources of the direction's provider for its consumer.
pub(crate) struct Resources {
    /// The direction `b` → `a`.
    pub reverse: bool,
}

impl Resources {
    fn key(&self) -> Output<VirtualNode> {
        if self.reverse { RESOURCES_REVERSE } else { RESOURCES }
    }
}

impl ObjectSet for Resources {
    fn name(&self) -> &'static str {
        self.key().step()
    }

    fn objects(&self, p: &PeerClusters, ids: &Ids) -> Vec<(String, Value)> {
        let pair = liqo::pair_label(&p.a, &p.b);
        let r = roles(p, ids, self.reverse);
        vec![(r.consumer, liqo::resource_slice(&r.at_consumer, &pair))]
    }

    fn ready<'a>(&'a self, inner: &'a Inner, p: &'a PeerClusters, ids: &'a Ids) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let r = roles(p, ids, self.reverse);
            let client = inner.client(&r.consumer).await?;
            let offered = inner
                .cfg
                .watches
                .wait_object::<LiqoResourceSlice, Value>(&r.consumer, &client, Some(&r.at_consumer.namespace), &r.provider_id, p.timeout(), |s| {
                    let cond = |type_: &str| {
                        s.and_then(|s| s.status_at("/conditions"))
                            .and_then(Value::as_array)
                            .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
                            .map(|c| (c["status"].as_str().unwrap_or("").to_owned(), c["message"].as_str().unwrap_or("").to_owned()))
                    };
                    match (cond("Authentication"), cond("Resources")) {
                        (Some((a, why)), _) if a == "Denied" => Check::Failed(format!("the provider denied the ResourceSlice's authentication: {why}")),
                        (_, Some((r, why))) if r == "Denied" => Check::Failed(format!("the provider denied the ResourceSlice's resources: {why}")),
                        (Some((a, _)), Some((r, _))) if a == "Accepted" && r == "Accepted" => {
                            Check::Done(s.and_then(|s| s.status_at("/resources")).cloned().unwrap_or_default())
                        }
                        (a, r) => Check::Pending(format!(
                            "authentication {}, resources {}",
                            a.map_or("(none)".into(), |x| x.0),
                            r.map_or("(none)".into(), |x| x.0)
                        )),
                    }
                })
                .await
                .map_err(|e| wait_err(codes::RESOURCES, e))?;
            let node = liqo::virtual_node_name(&r.provider_id);
            inner
                .cfg
                .watches
                .wait_object::<Node, ()>(&r.consumer, &client, None, &node, p.timeout(), |n| {
                    if n.is_some_and(node_ready) { Check::Done(()) } else { Check::Pending("the virtual node is not Ready yet".into()) }
                })
                .await
                .map_err(|e| wait_err(codes::VIRTUAL_NODE, e))?;
            self.key().value(&VirtualNode { virtual_node: node, on: r.consumer, resources: offered })
        }
        .boxed()
    }

    /// What liqoctl unpeer's `disableOffloading` awaits (`pkg/liqoctl/unpeer/utils.go`): the
    /// ResourceSlice absent (the CRD replicator lets it go once its copy on the provider
    /// has: `internal/crdReplicator/reflection/handler.go`), then the VirtualNode (its
    /// controller lets it go once its Node is drained and deleted and its NamespaceMaps
    /// are asked to go: `virtualnode-controller/deletion-routine.go`; while the wait lasts,
    /// and in its failure, it says what holds the drain, [`crate::drain`]) and its Node.
    /// Then, beyond
    /// liqoctl, the NamespaceMaps toward the provider absent: each goes once the provider
    /// deleted the twin namespaces it made, which needs the replication the next undo
    /// (authentication) removes, so an unpeer leaves no twin namespace behind.
    fn gone<'a>(&'a self, inner: &'a Inner, p: &'a PeerClusters, ids: &'a Ids, progress: Progress<'a>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            let r = roles(p, ids, self.reverse);
            let Ok(client) = inner.cfg.clusters.client(&r.consumer).await else { return Ok(()) };
            let (w, ns, timeout) = (&inner.cfg.watches, Some(r.at_consumer.namespace.as_str()), inner.cfg.removal_timeout);
            let removal = |e| wait_err(codes::REMOVAL, e);
            w.wait_deleted::<LiqoResourceSlice>(&r.consumer, &client, ns, &r.provider_id, timeout).await.map_err(removal)?;
            // Liqo drains the virtual node first: what holds the drain is said while the
            // wait lasts, and in its failure.
            let node = liqo::virtual_node_name(&r.provider_id);
            let vn_gone = w.wait_deleted::<LiqoVirtualNode>(&r.consumer, &client, ns, &r.provider_id, timeout);
            if let Err(e) = crate::drain::saying_what_holds(&client, &node, vn_gone, progress).await {
                let mut err = removal(e);
                match crate::drain::held_by(&client, &node).await {
                    Ok(Some(why)) => err.message = format!("{}; {why}", err.message),
                    Ok(None) => {}
                    Err(e) => tracing::debug!(error = %ferry_kube::said::said(&e), "reading what holds the virtual node's drain"),
                }
                return Err(err);
            }
            w.wait_deleted::<Node>(&r.consumer, &client, None, &liqo::virtual_node_name(&r.provider_id), timeout).await.map_err(removal)?;
            let what = format!("the NamespaceMaps toward {}", r.provider_id);
            w.wait_store::<LiqoNamespaceMap, ()>(&r.consumer, &client, ns, &what, timeout, |maps| {
                let left: Vec<String> = maps
                    .state()
                    .iter()
                    .filter(|m| m.metadata.labels.as_ref().and_then(|l| l.get(REPLICATION_DESTINATION_LABEL)) == Some(&r.provider_id))
                    .map(|m| m.metadata.name.clone().unwrap_or_default())
                    .collect();
                if left.is_empty() { Check::Done(()) } else { Check::Pending(format!("{left:?} still there (Liqo deletes them once the provider removed their twin namespaces)")) }
            })
            .await
            .map_err(removal)
        }
        .boxed()
    }
}

//! `prepare`: on each side the tenant namespace for the other, labelled as Liqo's
//! namespace manager labels it (`EnsureTenantNamespace` in `pkg/liqoctl/authenticate` and
//! `network`). The ForeignClusters are Liqo's: its controller makes one for every object
//! naming a remote cluster. A tenant namespace that existed and is not Ferry's
//! ([`Ids::a_namespace_kept`], judged by `check`) is reused as Liqo's namespace manager
//! reuses it (`pkg/tenantNamespace/namespaceManager.go`, `CreateNamespace`) and is not in
//! the set: never labelled, never deleted. Undo waits until the tenant namespaces it made
//! are gone (Liqo's objects inside them go with them), then deletes the ForeignClusters the
//! peering caused (not those a cluster had before it).

use ferry_kube::step_errors::wait_err;
use ferry_task::{StepError, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::Value;

use super::liqo_check::Ids;
use super::objects::{ObjectSet, Progress};
use crate::handler::Inner;
use crate::liqo;
use crate::spec::PeerClusters;

/// The `prepare` step's objects.
pub(crate) struct Prepare;

impl ObjectSet for Prepare {
    fn name(&self) -> &'static str {
        "prepare"
    }

    fn objects(&self, p: &PeerClusters, ids: &Ids) -> Vec<(String, Value)> {
        let pair = liqo::pair_label(&p.a, &p.b);
        ids.sides(p)
            .into_iter()
            .filter(|(cluster, _)| !ids.namespace_kept(p, cluster))
            .map(|(cluster, to)| (cluster.clone(), liqo::namespace(&to, &pair)))
            .collect()
    }

    fn gone<'a>(&'a self, inner: &'a Inner, p: &'a PeerClusters, ids: &'a Ids, _: Progress<'a>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            for (cluster, to) in ids.sides(p) {
                if ids.namespace_kept(p, cluster) {
                    continue;
                }
                let Ok(client) = inner.cfg.clusters.client(cluster).await else { continue };
                inner
                    .cfg
                    .watches
                    .wait_namespace_deleted(cluster, &client, &to.namespace, inner.cfg.removal_timeout)
                    .await
                    .map_err(|e| wait_err(codes::REMOVAL, e))?;
            }
            // The ForeignClusters Liqo's controller made because of this peering (it never
            // deletes one: `core/foreigncluster-controller/foreigncluster_controller.go`,
            // `foreignclusterEnqueuer`), once nothing names the remote any more: a revert
            // leaves each cluster as it was. An unpeer's own check found them, so it keeps
            // them, as `liqoctl unpeer` does (`pkg/liqoctl/unpeer/handler.go`).
            for (cluster, remote, knew) in [(&p.a, &ids.b, ids.a_knew_b), (&p.b, &ids.a, ids.b_knew_a)] {
                if !knew {
                    inner.forget_foreign_cluster(cluster, remote).await?;
                }
            }
            Ok(())
        }
        .boxed()
    }
}

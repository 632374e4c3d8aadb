//! The namespaces a ManifestWork carries but must not own: those that were on the cluster
//! before it and that its sender did not make. Shared by every worker that ships a
//! Namespace in a ManifestWork (the deploy worker's apps, the score worker's benchmark).
//!
//! # Upstream
//! OCM's work agent owns, and on the work's deletion deletes, whatever it applied, an
//! object that was there before included: `pkg/work/spoke/apply/create_only_apply.go`,
//! `update_apply.go` and `server_side_apply.go` call `helper.ApplyOwnerReferences` on
//! success, and `pkg/work/helper/helpers.go`, `DeleteAppliedResources`, deletes what
//! carries the work's owner. `OwnedByTheWork` (same file) says the work owns a manifest
//! unless the delete option is `Orphan`, or `SelectivelyOrphan` with a rule naming it
//! (`Foreground`, the default, owns everything); `manifestwork_reconciler.go`,
//! `manageOwnerRef`, then keeps the owner off it. So such a namespace is shipped
//! `CreateOnly` ([`CREATE_ONLY`]: made when missing, never written when there) and named in
//! the work's orphaning rules ([`delete_option`]): deleting the work never deletes it.

use std::collections::BTreeSet;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use serde_json::{Value, json};

use crate::{ClusterError, Clusters};

/// The `updateStrategy` type of a manifest made only when missing (ocm
/// `pkg/work/spoke/apply/create_only_apply.go`).
pub const CREATE_ONLY: &str = "CreateOnly";

/// The names of the Namespace manifests among `manifests`.
fn namespaces(manifests: &[Value]) -> BTreeSet<String> {
    manifests.iter().filter(|o| o["kind"] == "Namespace").filter_map(|o| o["metadata"]["name"].as_str().map(str::to_owned)).collect()
}

/// The namespaces of `manifests` that a ManifestWork must orphan on `cluster`: those there
/// already that `ours` does not claim (the sender made them, so they go with the work).
/// Read through the cluster's kubeconfig; a read that fails for a moment (5xx, 429, a
/// dropped connection) is tried again for a few seconds ([`read_retries`]). A cluster that
/// still cannot be read is an error, never a guess: taking every namespace for found
/// orphaned namespaces the work agent then made for the sender (left behind by its undo),
/// and taking none would let the work's deletion delete a namespace someone else made.
/// The caller's step fails (transiently when the cause is) and runs again.
pub async fn found_namespaces(clusters: &Clusters, cluster: &str, manifests: &[Value], ours: impl Fn(&ObjectMeta) -> bool) -> Result<BTreeSet<String>, ClusterError> {
    let names = namespaces(manifests);
    if names.is_empty() {
        return Ok(names);
    }
    let client = clusters.client(cluster).await?;
    let api: Api<Namespace> = Api::all(client);
    let mut found = BTreeSet::new();
    for n in names {
        let there = (|| api.get_opt(&n)).retry(read_retries()).when(crate::clusters::transient).await;
        match there.map_err(|source| ClusterError::Kube { cluster: cluster.to_owned(), source })? {
            Some(ns) if !ours(&ns.metadata) => {
                found.insert(n);
            }
            _ => {}
        }
    }
    Ok(found)
}

/// How a namespace's read is tried again before it is taken for found: the fault
/// campaign's member answers 12 requests with 500 and blacks out for 3 s; a step that
/// fails on the first 500 is run again only after the runtime's backoff.
fn read_retries() -> ExponentialBuilder {
    ExponentialBuilder::default().with_min_delay(Duration::from_millis(200)).with_max_delay(Duration::from_secs(2)).with_max_times(6)
}

/// The ManifestWork's `deleteOption`: on deletion everything it applied goes but the
/// Namespace manifests in `found` (and any without a name), orphaned by
/// `SelectivelyOrphan` rules.
pub fn delete_option(manifests: &[Value], found: &BTreeSet<String>) -> Value {
    let orphans: Vec<Value> = manifests
        .iter()
        .filter(|m| m["kind"] == "Namespace" && m["metadata"]["name"].as_str().is_none_or(|n| found.contains(n)))
        .map(|m| json!({"group": "", "resource": "namespaces", "name": m["metadata"]["name"]}))
        .collect();
    json!({"propagationPolicy": "SelectivelyOrphan", "selectivelyOrphans": {"orphaningRules": orphans}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_namespaces_found_are_orphaned() {
        let manifests = vec![
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "theirs"}}),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "mine"}}),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "theirs", "namespace": "theirs"}}),
        ];
        let found = BTreeSet::from(["theirs".to_owned()]);
        let d = delete_option(&manifests, &found);
        assert_eq!(d["propagationPolicy"], "SelectivelyOrphan");
        assert_eq!(d["selectivelyOrphans"]["orphaningRules"], json!([{"group": "", "resource": "namespaces", "name": "theirs"}]));
        assert_eq!(delete_option(&manifests, &BTreeSet::new())["selectivelyOrphans"]["orphaningRules"], json!([]));
        assert_eq!(namespaces(&manifests), BTreeSet::from(["mine".to_owned(), "theirs".to_owned()]));
    }
}

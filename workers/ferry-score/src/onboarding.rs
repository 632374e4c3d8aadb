//! The onboarding watcher: when a ManagedCluster joins the hub, or becomes available,
//! submit a `ScoreClusters` command for it (as the OCM onboarding flow reacted to new
//! clusters through an API-server event source). Idempotency keys derived from the
//! cluster's uid and the transition make restarts and several replicas submit each
//! scoring once. A cluster that only appeared (its klusterlet created it, the hub has not
//! accepted it) is not scored yet: it has no namespace on the hub for its placement score
//! and no work agent for a benchmark.

use std::collections::HashMap;
use std::sync::Arc;

use ferry_kube::kinds::ManagedCluster;
use ferry_runtime::{Client, SubmitOptions, TaskKind};
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio_util::sync::CancellationToken;

use crate::spec::ScoreClusters;

/// The condition OCM sets when a managed cluster is available.
pub const AVAILABLE: &str = ferry_kube::vocab::ocm::CONDITION_AVAILABLE;

/// Why the watcher stopped.
#[derive(Debug, thiserror::Error)]
pub enum OnboardingError {
    /// Submitting a command failed.
    #[error("submitting the scoring of cluster {cluster}: {source}")]
    Submit {
        /// The cluster.
        cluster: String,
        /// What the client said.
        #[source]
        source: ferry_runtime::ClientError,
    },
}

/// What happened to a cluster that deserves a scoring, as an idempotency key: it turned
/// Available (each transition a key), or, the first time it is seen and not Available, it
/// has joined (`ManagedClusterJoined`, which its agent sets only once the hub accepted it).
pub fn trigger_key(mc: &ManagedCluster, seen_before: bool) -> Option<String> {
    let name = mc.metadata.name.as_deref()?;
    let uid = mc.metadata.uid.as_deref().unwrap_or("-");
    if mc.condition(AVAILABLE) == Some("True") {
        let since = mc
            .status
            .get("conditions")
            .and_then(|c| c.as_array())
            .and_then(|c| c.iter().find(|c| c.get("type").and_then(|t| t.as_str()) == Some(AVAILABLE)))
            .and_then(|c| c.get("lastTransitionTime"))
            .and_then(|t| t.as_str())
            .unwrap_or("-");
        return Some(format!("onboarding/{name}/{uid}/available/{since}"));
    }
    let joined = mc.condition(ferry_kube::vocab::ocm::CONDITION_JOINED) == Some("True");
    (joined && !seen_before).then(|| format!("onboarding/{name}/{uid}/joined"))
}

/// Watches ManagedClusters until `shutdown`, submitting `template` (with `clusters` set to
/// the one cluster) for each trigger. Returns the number of commands submitted.
pub async fn run(hub: kube::Client, client: Arc<Client>, template: ScoreClusters, shutdown: CancellationToken) -> Result<usize, OnboardingError> {
    let api: Api<ManagedCluster> = Api::all(hub);
    let stream = watcher(api, watcher::Config::default()).default_backoff().applied_objects();
    futures::pin_mut!(stream);
    let mut last: HashMap<String, String> = HashMap::new();
    let mut submitted = 0;
    loop {
        let mc = tokio::select! {
            _ = shutdown.cancelled() => return Ok(submitted),
            next = stream.next() => match next {
                None => return Ok(submitted),
                Some(Err(e)) => {
                    tracing::warn!(error = %ferry_kube::said::watch_said(&e), "watching ManagedClusters; retrying");
                    continue;
                }
                Some(Ok(mc)) => mc,
            },
        };
        let Some(name) = mc.metadata.name.clone() else { continue };
        let uid = mc.metadata.uid.clone().unwrap_or_default();
        let Some(key) = trigger_key(&mc, last.contains_key(&uid)) else { continue };
        if last.get(&uid) == Some(&key) {
            continue;
        }
        last.insert(uid, key.clone());
        let spec = ScoreClusters { clusters: vec![name.clone()], cluster_set: None, ..template.clone() };
        let opts = SubmitOptions { idempotency_key: Some(key.clone()), ..SubmitOptions::default() };
        let id = client
            .submit(TaskKind::SCORE, &format!("cluster/{name}"), &spec, opts)
            .await
            .map_err(|source| OnboardingError::Submit { cluster: name.clone(), source })?;
        tracing::info!(cluster = %name, task = %id, trigger = %key, "submitted a scoring for a joining cluster");
        submitted += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn mc(available: Option<&str>, since: &str) -> ManagedCluster {
        let joined = json!({"type": "ManagedClusterJoined", "status": "True", "lastTransitionTime": since});
        let conditions: Vec<_> = available.map(|s| json!({"type": AVAILABLE, "status": s, "lastTransitionTime": since})).into_iter().chain(Some(joined)).collect();
        serde_json::from_value(json!({"metadata": {"name": "edge-1", "uid": "u1"}, "spec": {}, "status": {"conditions": conditions}})).unwrap()
    }

    #[test]
    fn triggers_on_join_and_on_each_transition_to_available() {
        let appeared: ManagedCluster = serde_json::from_value(json!({"metadata": {"name": "edge-1", "uid": "u1"}, "spec": {}, "status": {}})).unwrap();
        assert_eq!(trigger_key(&appeared, false), None, "made by its klusterlet, not accepted: no namespace on the hub to score into");
        assert_eq!(trigger_key(&mc(None, ""), false).as_deref(), Some("onboarding/edge-1/u1/joined"));
        assert_eq!(trigger_key(&mc(None, ""), true), None, "an update of a known, unavailable cluster");
        assert_eq!(trigger_key(&mc(Some("False"), "t1"), true), None);
        assert_eq!(trigger_key(&mc(Some("True"), "t2"), true).as_deref(), Some("onboarding/edge-1/u1/available/t2"));
        assert_ne!(trigger_key(&mc(Some("True"), "t3"), true), trigger_key(&mc(Some("True"), "t2"), true), "a new transition is a new scoring");
    }
}

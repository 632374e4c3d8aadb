//! `respawn` (burst): Liqo's pod webhook mutates a pod only when it is created, and only
//! in a namespace labelled `liqo.io/scheduling-enabled=true` (liqotech/liqo
//! `deployments/liqo/templates/webhooks/liqo-mutating-webhook.yaml`: `operations:
//! ["CREATE"]`, `namespaceSelector`; `pkg/webhooks/pod/mutations.go`), a label Liqo's
//! namespaceoffloading controller sets once the offloading exists (`labels.go`). The
//! overflow pods `scale` left Pending were created before `offload`, so they never get the
//! virtual nodes' toleration nor the affinity to the chosen peers. This step waits until
//! the namespace carries the label, then deletes those pods (unscheduled, without Liqo's
//! toleration); the Deployment's ReplicaSet creates them again, through the webhook, and
//! the scheduler places them on the chosen peers' virtual nodes (`ready` waits for that).
//! Once the ReplicaSet has replaced them, it looks again: a replacement created before the
//! API server's own cache saw the label is passed over as well, and is replaced in turn
//! (a few rounds at most).
//! Liqo's documentation names the same remedy for pods created before the offloading
//! (`docs/usage/namespace-offloading.md`: "the Kubernetes abstractions ... ensure that the
//! desired pods get eventually created correctly").
//!
//! # Idempotency
//! A pod already gone counts as deleted (each deletion is conditioned on the pod's uid);
//! a second run finds only pods created before the label, i.e. none once they are replaced.
//!
//! # Undo
//! Nothing to put back: the pods are the ReplicaSet's, which re-created them; `offload`'s
//! undo removes the offloading (the remote pods come home) and `scale`'s the replicas.
//!
//! # Errors
//! `SCHEDULING` when the namespace is not labelled for scheduling within the command's
//! timeout (the offloading's pod strategy is `Local`, or Liqo's controller does not run);
//! API errors of the cluster.

use std::collections::HashSet;
use std::sync::Arc;

use ferry_kube::Check;
use ferry_kube::step_errors::{api_err, wait_err};
use ferry_task::{Output, Step, StepContext, StepError, StepPolicy, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, ListParams};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::offload::OFFLOAD;
use super::scale::SCALE;
use crate::handler::Inner;
use crate::liqo::{SCHEDULING_LABEL, VIRTUAL_NODE_TOLERATION_KEY};
use crate::spec::OffloadCommand;

/// How many times pods passed over by the webhook are replaced before `ready` takes over.
const ROUNDS: usize = 3;

/// The `respawn` step's output.
pub const RESPAWN: Output<Respawned> = Output::new("respawn");

/// Output of `respawn`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Respawned {
    /// The pods deleted for their ReplicaSet to create again under Liqo's webhook.
    pub pods: Vec<String>,
}

/// Burst: the Pending overflow created again, now under Liqo's pod webhook.
pub struct RespawnStep {
    pub(crate) inner: Arc<Inner>,
    pub(crate) policy: StepPolicy,
}

/// Whether Liqo's pod webhook passed over `p`: its toleration is missing.
pub(crate) fn unmutated(p: &Pod) -> bool {
    !p.spec.iter().flat_map(|s| s.tolerations.iter().flatten()).any(|t| t.key.as_deref() == Some(VIRTUAL_NODE_TOLERATION_KEY))
}

/// The pods to create again: not being deleted, not scheduled, never mutated by Liqo.
pub(crate) fn stale(pods: &[Pod]) -> Vec<&Pod> {
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none())
        .filter(|p| unmutated(p))
        .collect()
}

impl Step<OffloadCommand> for RespawnStep {
    fn name(&self) -> &str {
        RESPAWN.step()
    }

    fn policy(&self) -> StepPolicy {
        self.policy.clone()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, OffloadCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let c = cx.spec;
            let offloaded = OFFLOAD.get(cx).unwrap_or_default();
            if SCALE.get(cx).unwrap_or_default().pending == 0 || offloaded.remote_namespace.is_none() {
                cx.progress(100, "nothing overflows: no pod to create again");
                return RESPAWN.value(&Respawned::default());
            }
            let client = self.inner.client(&c.cluster).await?;
            self.inner
                .cfg
                .watches
                .wait_object::<Namespace, ()>(&c.cluster, &client, None, &c.namespace, c.timeout(), |n| {
                    match n.and_then(|n| n.metadata.labels.as_ref()).and_then(|l| l.get(SCHEDULING_LABEL)).map(String::as_str) {
                        Some("true") => Check::Done(()),
                        _ => Check::Pending(format!("Liqo has not labelled the namespace {SCHEDULING_LABEL}=true yet")),
                    }
                })
                .await
                .map_err(|e| wait_err(codes::SCHEDULING, e))?;
            cx.progress(30, format!("{} is labelled for Liqo's scheduling", c.namespace));
            let name = c.deployment.clone().unwrap_or_default();
            let selector = Api::<Deployment>::namespaced(client.clone(), &c.namespace)
                .get(&name)
                .await
                .map_err(api_err(&c.cluster))?
                .spec
                .selector
                .match_labels
                .unwrap_or_default();
            let sel: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let api = Api::<Pod>::namespaced(client.clone(), &c.namespace);
            let replicas = c.replicas.unwrap_or(1).max(0) as usize;
            let mut respawned = Vec::new();
            let mut gone: HashSet<String> = HashSet::new();
            for _ in 0..ROUNDS {
                let pods = api.list(&ListParams::default().labels(&sel.join(","))).await.map_err(api_err(&c.cluster))?.items;
                let before = respawned.len();
                for p in stale(&pods) {
                    let pod = p.metadata.name.clone().unwrap_or_default();
                    // Gone already, or replaced by one of the same name: nothing stale left.
                    ferry_kube::deletes::delete_if_unchanged(&api, &pod, &p.metadata, DeleteParams::default()).await.map_err(api_err(&c.cluster))?;
                    gone.insert(p.metadata.uid.clone().unwrap_or_default());
                    respawned.push(pod);
                }
                if respawned.len() == before {
                    break;
                }
                // The ReplicaSet replaces them; then the replacements are looked at again.
                self.inner
                    .cfg
                    .watches
                    .wait_store::<Pod, ()>(&c.cluster, &client, Some(&c.namespace), &format!("the pods of {name}"), c.timeout(), |s| {
                        let live = s
                            .state()
                            .iter()
                            .filter(|p| p.metadata.deletion_timestamp.is_none() && !gone.contains(p.metadata.uid.as_deref().unwrap_or_default()))
                            .filter(|p| selector.iter().all(|(k, v)| p.metadata.labels.as_ref().and_then(|l| l.get(k)) == Some(v)))
                            .count();
                        if live >= replicas { Check::Done(()) } else { Check::Pending(format!("{live} of {replicas} pods after the re-creation")) }
                    })
                    .await
                    .map_err(|e| wait_err(codes::SCHEDULING, e))?;
            }
            cx.progress(100, format!("{} Pending pods created again under Liqo's webhook: {}", respawned.len(), ferry_task::report::listed(&respawned)));
            RESPAWN.value(&Respawned { pods: respawned })
        }
        .boxed()
    }

    fn undo<'a>(&'a self, _: &'a StepContext<'a, OffloadCommand>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        // The pods are the ReplicaSet's: nothing of this step's to put back.
        async { Ok(()) }.boxed()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(name: &str, node: Option<&str>, tolerated: bool, deleting: bool) -> Pod {
        let mut p = json!({"metadata": {"name": name}, "spec": {"containers": [{"name": "c"}]}});
        if let Some(n) = node {
            p["spec"]["nodeName"] = json!(n);
        }
        if tolerated {
            p["spec"]["tolerations"] = json!([{"key": VIRTUAL_NODE_TOLERATION_KEY, "operator": "Exists", "effect": "NoExecute"}]);
        }
        if deleting {
            p["metadata"]["deletionTimestamp"] = json!("2026-11-25T00:00:00Z");
        }
        serde_json::from_value(p).unwrap()
    }

    #[test]
    fn only_unscheduled_pods_the_webhook_never_saw_are_created_again() {
        let pods = [
            pod("old-pending", None, false, false),
            pod("new-pending", None, true, false),
            pod("home", Some("member-1-node-0"), false, false),
            pod("going", None, false, true),
        ];
        let names: Vec<&str> = stale(&pods).iter().filter_map(|p| p.metadata.name.as_deref()).collect();
        assert_eq!(names, ["old-pending"]);
    }
}

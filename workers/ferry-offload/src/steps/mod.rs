//! The `offload` tasks' steps, one module each, in plan order. Offload: [`check`],
//! [`offload`], [`twins`]. Unoffload: [`check`], [`remove`]. Burst: [`check`], [`scale`],
//! [`place`], [`offload`], [`respawn`], [`ready`]. What they share is here: the step
//! policy, the targets ([`Target`]) and their virtual nodes' readiness, the namespace's
//! NamespaceOffloading (read, applied or re-created and waited for, removed) and which
//! task made it.

pub mod check;
pub mod offload;
pub mod place;
pub mod ready;
pub mod remove;
pub mod respawn;
pub mod scale;
pub mod twins;

use std::time::Duration;

use ferry_kube::kinds::node_ready;
use ferry_kube::step_errors::{api_err, client_err, kube_err, wait_err};
use ferry_kube::{Check, ClusterError};
use ferry_task::{StepContext, StepError, StepPolicy, codes};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::handler::Inner;
use crate::liqo::{self, Progress, REMOTE_ID_LABEL};
use crate::spec::OffloadCommand;

ferry_kube::resource!(
    /// Liqo NamespaceOffloading.
    NamespaceOffloading, "NamespaceOffloading", "offloading.liqo.io", "v1beta1", "namespaceoffloadings", Namespaced
);

/// Field manager of the worker's writes.
pub const MANAGER: &str = "ferry-offload";

/// Every step's policy.
pub(crate) fn policy(c: &OffloadCommand) -> StepPolicy {
    StepPolicy { timeout: c.timeout() * 3 + Duration::from_secs(600), ..StepPolicy::default() }
}

/// A peered cluster the namespace goes to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    /// The cluster's name (None when no kubeconfig names it: its twin is not checked).
    pub cluster: Option<String>,
    /// Its Liqo cluster id.
    pub id: String,
    /// Its virtual node on the consumer.
    pub node: String,
}

/// The Ferry task that made offloading `o` (its [`liqo::TASK_LABEL`]), if one did.
fn made_by(o: &NamespaceOffloading) -> Option<&str> {
    o.metadata.labels.as_ref()?.get(liqo::TASK_LABEL).map(String::as_str)
}

fn remote_id(n: &Node) -> Option<String> {
    n.metadata.labels.as_ref().and_then(|l| l.get(REMOTE_ID_LABEL)).cloned()
}

impl Inner {
    async fn client(&self, cluster: &str) -> Result<kube::Client, StepError> {
        self.cfg.clusters.client(cluster).await.map_err(client_err)
    }

    async fn virtual_nodes(&self, cluster: &str) -> Result<Vec<Node>, StepError> {
        let client = self.client(cluster).await?;
        Ok(Api::<Node>::all(client).list(&ListParams::default().labels(liqo::VIRTUAL_NODE_SELECTOR)).await.map_err(api_err(cluster))?.items)
    }

    /// Waits until the virtual nodes of `targets` are Ready.
    async fn targets_ready(&self, c: &OffloadCommand, targets: &[Target]) -> Result<(), StepError> {
        let client = self.client(&c.cluster).await?;
        for t in targets {
            self.cfg
                .watches
                .wait_object::<Node, ()>(&c.cluster, &client, None, &t.node, c.timeout(), |n| match n {
                    Some(n) if node_ready(n) => Check::Done(()),
                    Some(_) => Check::Pending("the virtual node is not Ready".into()),
                    None => Check::Pending("the virtual node is gone".into()),
                })
                .await
                .map_err(|e| wait_err(codes::PEER_NOT_READY, e))?;
        }
        Ok(())
    }

    async fn offloading(&self, c: &OffloadCommand) -> Result<Option<NamespaceOffloading>, StepError> {
        let client = self.client(&c.cluster).await?;
        Api::<NamespaceOffloading>::namespaced(client, &c.namespace).get_opt(liqo::NAME).await.map_err(api_err(&c.cluster))
    }

    /// Applies the offloading with `spec` and waits until it is Ready on `ids`; the twin
    /// namespaces' name. An offloading whose mapping strategy or remote namespace name
    /// differs from `spec`'s (Liqo's webhook refuses changing them: `nsoff.go`), or one
    /// being deleted, is first deleted and waited gone (Liqo's finalizer: its twins go),
    /// then created anew.
    async fn offload(&self, cx: &StepContext<'_, OffloadCommand>, spec: &Value, ids: &[String], task: Option<&str>) -> Result<String, StepError> {
        let c = cx.spec;
        if let Some(current) = self.offloading(c).await? {
            let why = match liqo::immutable_change(&current.spec, spec) {
                Some(change) => Some(format!("{change} cannot be changed on a NamespaceOffloading")),
                None => current.metadata.deletion_timestamp.is_some().then(|| "the current one is being deleted".to_owned()),
            };
            if let Some(why) = why {
                cx.progress(10, format!("re-creating NamespaceOffloading {}/{}: {why}", c.namespace, liqo::NAME));
                self.unoffload(c).await?;
            }
        }
        let obj = liqo::namespace_offloading(&c.namespace, spec, task);
        let applied = self.cfg.clusters.apply(&c.cluster, &obj, MANAGER).await.map_err(|e| match e {
            e @ ClusterError::NotServed { .. } => StepError::permanent(codes::LIQO_MISSING, format!("{e}: is Liqo installed on {}?", c.cluster)),
            e => kube_err(codes::APPLY_FAILED, e),
        })?;
        let client = self.client(&c.cluster).await?;
        let grace = self.cfg.failure_grace;
        // Since when the offloading has reported a failure without a break.
        let mut failing: Option<tokio::time::Instant> = None;
        self.cfg
            .watches
            .wait_object::<NamespaceOffloading, String>(&c.cluster, &client, Some(&c.namespace), liqo::NAME, c.timeout(), |o| match o {
                None => Check::Pending("not seen yet".into()),
                // The shared watch may still hold one an earlier task removed.
                Some(o) if o.metadata.uid != applied.metadata.uid => Check::Pending("the watch has not seen the applied object yet".into()),
                Some(o) => match liqo::progress(&o.status, o.metadata.generation, ids) {
                    Progress::Ready(n) => Check::Done(n),
                    Progress::Pending(why) => {
                        failing = None;
                        Check::Pending(why)
                    }
                    // Liqo retries a failed twin (`namespacemap-controller/enforcement.go`
                    // requeues with backoff): a failure fails the step only once it has
                    // lasted the grace period.
                    Progress::Failed(why) => {
                        let since = *failing.get_or_insert_with(|| {
                            if !grace.is_zero() {
                                cx.progress(30, format!("{why}; Liqo retries, the step fails if it lasts {} s", grace.as_secs_f32()));
                            }
                            tokio::time::Instant::now()
                        });
                        match grace.checked_sub(since.elapsed()) {
                            Some(left) if !left.is_zero() => Check::Recheck(why, left),
                            _ if grace.is_zero() => Check::Failed(why),
                            _ => Check::Failed(format!("{why} (for {} s)", since.elapsed().as_secs())),
                        }
                    }
                },
            })
            .await
            .map_err(|e| wait_err(codes::OFFLOADING_FAILED, e))
    }

    /// Deletes the namespace's offloading and waits until it is gone (Liqo removes the
    /// twin namespaces before it lets it go).
    async fn unoffload(&self, c: &OffloadCommand) -> Result<(), StepError> {
        let obj = liqo::namespace_offloading(&c.namespace, &json!({}), None);
        self.cfg.clusters.delete(&c.cluster, &obj).await.map_err(|e| kube_err(codes::CLUSTER_API, e))?;
        let client = self.client(&c.cluster).await?;
        self.cfg
            .watches
            .wait_deleted::<NamespaceOffloading>(&c.cluster, &client, Some(&c.namespace), liqo::NAME, self.cfg.removal_timeout)
            .await
            .map_err(|e| wait_err(codes::REMOVAL, e))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;
    use crate::placement::{Resources, Share};

    fn target(n: u8) -> Target {
        Target { cluster: Some(format!("member-{n}")), id: format!("id-{n}"), node: format!("liqo-member-{n}") }
    }

    #[test]
    fn outputs_keep_the_shape_journals_and_views_read() {
        // check
        let checked = check::Checked {
            targets: vec![target(2)],
            previous: Some(json!({"namespaceMappingStrategy": "DefaultName"})),
            previous_task: Some("t-1".into()),
            previous_replicas: Some(2),
            per_pod: Some(Resources { cpu_m: 250, memory: 1 << 20 }),
        };
        assert_eq!(
            check::CHECK.value(&checked).unwrap(),
            json!({"targets": [{"cluster": "member-2", "id": "id-2", "node": "liqo-member-2"}], "previous": {"namespaceMappingStrategy": "DefaultName"},
                "previous_task": "t-1", "previous_replicas": 2, "per_pod": {"cpu_m": 250, "memory": 1048576}})
        );
        assert_eq!(
            check::CHECK.value(&check::Checked::default()).unwrap(),
            json!({"targets": [], "previous": null, "previous_task": null, "previous_replicas": null, "per_pod": null})
        );
        // offload: nothing to offload, offloaded, a burst reusing another task's offloading
        let none = offload::Offloaded::default();
        assert_eq!(offload::OFFLOAD.value(&none).unwrap(), json!({"remote_namespace": null, "targets": []}));
        let mut done = offload::Offloaded { remote_namespace: Some("web-member-1".into()), targets: vec![target(2)], reused: false };
        assert_eq!(
            offload::OFFLOAD.value(&done).unwrap(),
            json!({"remote_namespace": "web-member-1", "targets": [{"cluster": "member-2", "id": "id-2", "node": "liqo-member-2"}]})
        );
        done.reused = true;
        assert_eq!(
            offload::OFFLOAD.value(&done).unwrap(),
            json!({"remote_namespace": "web-member-1", "targets": [{"cluster": "member-2", "id": "id-2", "node": "liqo-member-2"}], "reused": true})
        );
        // twins
        assert_eq!(twins::TWINS.value(&twins::Twins::default()).unwrap(), json!({"twins": []}));
        let t = twins::Twins { twins: vec![twins::Twin { cluster: "member-2".into(), namespace: "web-member-1".into() }] };
        assert_eq!(twins::TWINS.value(&t).unwrap(), json!({"twins": [{"cluster": "member-2", "namespace": "web-member-1"}]}));
        // remove
        assert_eq!(remove::REMOVE.value(&remove::Removed { removed: true }).unwrap(), json!({"removed": true}));
        assert_eq!(remove::REMOVE.value(&remove::Removed { removed: false }).unwrap(), json!({"removed": false}));
        // burst
        assert_eq!(scale::SCALE.value(&scale::Scaled { placed: 4, pending: 2 }).unwrap(), json!({"placed": 4, "pending": 2}));
        assert_eq!(place::PLACE.value(&Vec::new()).unwrap(), json!([]));
        let share = Share { cluster: "member-2".into(), id: "id-2".into(), node: "liqo-member-2".into(), latency_ms: Some(5), pods: 2 };
        assert_eq!(
            place::PLACE.value(&vec![share]).unwrap(),
            json!([{"cluster": "member-2", "id": "id-2", "node": "liqo-member-2", "latency_ms": 5, "pods": 2}])
        );
        assert_eq!(respawn::RESPAWN.value(&respawn::Respawned::default()).unwrap(), json!({"pods": []}));
        assert_eq!(respawn::RESPAWN.value(&respawn::Respawned { pods: vec!["api-1".into()] }).unwrap(), json!({"pods": ["api-1"]}));
        let ready = ready::ReadyReplicas { replicas: 6, on: BTreeMap::from([("member-1".to_owned(), 4), ("id-2".to_owned(), 2)]) };
        assert_eq!(ready::READY.value(&ready).unwrap(), json!({"replicas": 6, "on": {"id-2": 2, "member-1": 4}}));
    }

    #[test]
    fn outputs_journaled_before_the_keys_still_decode() {
        // What a worker of the previous version journaled (its `json!` literals), read
        // through the typed keys.
        let outputs: BTreeMap<String, Value> = BTreeMap::from([
            // a check journaled before `previous_task` existed
            ("check".to_owned(), json!({"targets": [{"cluster": null, "id": "id-3", "node": "liqo-id-3"}], "previous": null, "previous_replicas": 2, "per_pod": {"cpu_m": 100, "memory": 0}})),
            ("scale".to_owned(), json!({"placed": 4, "pending": 2})),
            ("place".to_owned(), json!([{"cluster": "member-2", "id": "id-2", "node": "liqo-member-2", "latency_ms": null, "pods": 2}])),
            ("offload".to_owned(), json!({"remote_namespace": "web-member-1", "targets": [{"cluster": "member-2", "id": "id-2", "node": "liqo-member-2"}], "reused": true})),
            ("twins".to_owned(), json!({"twins": [{"cluster": "member-2", "namespace": "web-member-1"}]})),
            ("remove".to_owned(), json!({"removed": false})),
            ("ready".to_owned(), json!({"replicas": 6, "on": {"member-1": 4, "id-2": 2}})),
        ]);
        let checked = check::CHECK.from_outputs(&outputs).unwrap();
        assert_eq!(checked.targets, [Target { cluster: None, id: "id-3".into(), node: "liqo-id-3".into() }]);
        assert_eq!((checked.previous, checked.previous_task, checked.previous_replicas), (None, None, Some(2)));
        let scaled = scale::SCALE.from_outputs(&outputs).unwrap();
        assert_eq!((scaled.placed, scaled.pending), (4, 2));
        let shares = place::PLACE.from_outputs(&outputs).unwrap();
        assert_eq!((shares[0].cluster.as_str(), shares[0].pods, shares[0].latency_ms), ("member-2", 2, None));
        let offloaded = offload::OFFLOAD.from_outputs(&outputs).unwrap();
        assert_eq!((offloaded.remote_namespace.as_deref(), offloaded.targets.clone(), offloaded.reused), (Some("web-member-1"), vec![target(2)], true));
        assert_eq!(twins::TWINS.from_outputs(&outputs).unwrap().twins[0].namespace, "web-member-1");
        assert!(!remove::REMOVE.from_outputs(&outputs).unwrap().removed);
        assert_eq!(ready::READY.from_outputs(&outputs).unwrap().on["id-2"], 2);
        // An offload with nothing to offload: no `reused`, no twin namespace.
        let nothing = BTreeMap::from([("offload".to_owned(), json!({"remote_namespace": null, "targets": []}))]);
        assert_eq!(offload::OFFLOAD.from_outputs(&nothing), Some(offload::Offloaded::default()));
    }
}

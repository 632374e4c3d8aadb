//! The fleet as the task-state topic tells it, for the dashboard: clusters Ferry created
//! (create, scale, delete), live peerings (peer, unpeer) and offloaded namespaces
//! (offload, burst, unoffload). Each is the replay of the succeeded tasks of its subject in
//! order; reverted tasks changed nothing, so they are skipped.

use std::collections::BTreeMap;

use ferry_cluster::spec::{ClusterCommand, ClusterOperation};
use ferry_offload::spec::{OffloadCommand, OffloadOperation};
use ferry_peer::spec::{PeerClusters, PeerMethod, PeerOperation};
use ferry_runtime::wire::Registry;
use ferry_runtime::{TaskKind, TaskSnapshot, TaskState};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// A cluster Ferry created.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ClusterView {
    /// `<namespace>/<name>` on the hub.
    pub cluster: String,
    /// The infrastructure provider.
    pub infrastructure: String,
    /// The Kubernetes version.
    pub version: String,
    /// Worker machines, as last created or scaled.
    pub workers: Option<i32>,
    /// The task that made it so.
    pub task_id: String,
}

/// A live peering.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PeeringView {
    /// The consumer.
    pub a: String,
    /// The provider.
    pub b: String,
    /// `liqo` or `submariner`.
    pub method: String,
    /// Both directions.
    pub bidirectional: bool,
    /// The task that made it.
    pub task_id: String,
}

/// An offloaded namespace.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct OffloadView {
    /// The consumer cluster.
    pub cluster: String,
    /// The namespace.
    pub namespace: String,
    /// The Liqo ids it reaches.
    pub targets: Vec<String>,
    /// The burst's Deployment and replicas, when a burst offloaded it.
    pub burst: Option<String>,
    /// The task that made it.
    pub task_id: String,
}

/// The succeeded tasks of `kind`, oldest first, with their decoded specs.
pub(crate) fn replay<'s, S: DeserializeOwned + apache_avro::AvroSchema + 'static>(
    registry: &Registry,
    snapshots: &'s [TaskSnapshot],
    kind: TaskKind,
) -> Vec<(&'s TaskSnapshot, S)> {
    let mut v: Vec<&TaskSnapshot> = snapshots.iter().filter(|s| s.kind == kind && s.state == TaskState::Succeeded).collect();
    v.sort_by_key(|s| (s.created_at_ms, s.origin_partition, s.origin_offset));
    v.into_iter().filter_map(|s| Some((s, registry.decode::<S>(&s.spec.0).ok()?))).collect()
}

/// Clusters created and not deleted.
pub fn clusters(registry: &Registry, snapshots: &[TaskSnapshot]) -> Vec<ClusterView> {
    let mut live: BTreeMap<String, ClusterView> = BTreeMap::new();
    for (s, c) in replay::<ClusterCommand>(registry, snapshots, TaskKind::CREATE_CLUSTER) {
        match c.operation {
            ClusterOperation::Create => {
                live.insert(
                    s.subject.clone(),
                    ClusterView {
                        cluster: s.subject.clone(),
                        infrastructure: c.infrastructure,
                        version: c.version,
                        workers: c.workers.count,
                        task_id: s.task_id.clone(),
                    },
                );
            }
            ClusterOperation::Scale => {
                if let Some(v) = live.get_mut(&s.subject) {
                    v.workers = c.workers.count.or(v.workers);
                    v.task_id = s.task_id.clone();
                }
            }
            ClusterOperation::Delete => {
                live.remove(&s.subject);
            }
        }
    }
    live.into_values().collect()
}

/// Peerings made and not unpeered.
pub fn peerings(registry: &Registry, snapshots: &[TaskSnapshot]) -> Vec<PeeringView> {
    let mut live: BTreeMap<String, PeeringView> = BTreeMap::new();
    for (s, p) in replay::<PeerClusters>(registry, snapshots, TaskKind::PEER) {
        match p.operation {
            PeerOperation::Peer => {
                let method = match p.method {
                    PeerMethod::Liqo => "liqo",
                    PeerMethod::Submariner => "submariner",
                };
                live.insert(
                    s.subject.clone(),
                    PeeringView { a: p.a, b: p.b, method: method.into(), bidirectional: p.bidirectional, task_id: s.task_id.clone() },
                );
            }
            PeerOperation::Unpeer | PeerOperation::ForceUnpeer => {
                live.remove(&s.subject);
            }
        }
    }
    live.into_values().collect()
}

/// Namespaces offloaded (by an offload or a burst that needed it) and not unoffloaded.
pub fn offloads(registry: &Registry, snapshots: &[TaskSnapshot]) -> Vec<OffloadView> {
    let mut live: BTreeMap<String, OffloadView> = BTreeMap::new();
    for (s, c) in replay::<OffloadCommand>(registry, snapshots, TaskKind::OFFLOAD) {
        if c.operation == OffloadOperation::Unoffload {
            live.remove(&s.subject);
            continue;
        }
        let targets: Vec<String> = ferry_offload::outputs::OFFLOAD.from_snapshot(s).map(|o| o.targets.into_iter().map(|t| t.id).collect()).unwrap_or_default();
        if targets.is_empty() {
            // A burst that fit at home offloaded nothing.
            continue;
        }
        let burst =
            (c.operation == OffloadOperation::Burst).then(|| format!("{} × {}", c.deployment.clone().unwrap_or_default(), c.replicas.unwrap_or_default()));
        live.insert(s.subject.clone(), OffloadView { cluster: c.cluster, namespace: c.namespace, targets, burst, task_id: s.task_id.clone() });
    }
    live.into_values().collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use ferry_runtime::EventType;
    use ferry_runtime::protocol::{Bytes, JournalEntry, StepStatus};

    /// A snapshot of task `n` (created at `n`) with `spec`.
    pub(crate) fn snap<S: serde::Serialize + apache_avro::AvroSchema + 'static>(
        r: &Registry,
        n: i64,
        kind: TaskKind,
        subject: &str,
        spec: &S,
        state: TaskState,
        journal: Vec<JournalEntry>,
    ) -> TaskSnapshot {
        TaskSnapshot {
            task_id: format!("tsk_{n}"),
            kind,
            subject: subject.into(),
            state,
            seq: 1,
            last_event: EventType::Succeeded,
            idempotency_key: None,
            requested_by: "test".into(),
            origin_partition: 0,
            origin_offset: n,
            created_at_ms: n,
            updated_at_ms: n,
            deadline_ms: None,
            keep_partial: false,
            worker: "w".into(),
            trace_parent: None,
            spec: Bytes(r.encode(spec).unwrap()),
            journal,
            error: None,
            cancel_requested: false,
            revert_requested: false,
            signals: Vec::new(),
        }
    }

    #[test]
    fn unpeer_removes_and_a_reverted_unpeer_changes_nothing() {
        let r = Registry::embedded();
        let p = PeerClusters { a: "member-1".into(), b: "member-2".into(), ..PeerClusters::default() };
        let q = PeerClusters { a: "member-1".into(), b: "member-3".into(), method: PeerMethod::Submariner, ..PeerClusters::default() };
        let un = |p: &PeerClusters| PeerClusters { operation: PeerOperation::Unpeer, ..p.clone() };
        let all = vec![
            snap(&r, 1, TaskKind::PEER, &p.subject(), &p, TaskState::Succeeded, vec![]),
            snap(&r, 2, TaskKind::PEER, &q.subject(), &q, TaskState::Succeeded, vec![]),
            snap(&r, 3, TaskKind::PEER, &p.subject(), &un(&p), TaskState::Reverted, vec![]),
            snap(&r, 4, TaskKind::PEER, &q.subject(), &un(&q), TaskState::Succeeded, vec![]),
        ];
        let got: Vec<(String, String, String)> = peerings(&r, &all).into_iter().map(|v| (v.a, v.b, v.method)).collect();
        assert_eq!(got, [("member-1".to_owned(), "member-2".to_owned(), "liqo".to_owned())]);
    }

    #[test]
    fn offloads_carry_their_targets_and_unoffload_removes() {
        let r = Registry::embedded();
        // The offload step's output as the worker journals it.
        let entry = |remote: &str, targets: &str| JournalEntry {
            step: 2,
            name: "offload".into(),
            status: StepStatus::Succeeded,
            output: Some(format!("{{\"remote_namespace\": \"{remote}\", \"targets\": {targets}}}")),
            attempts: 1,
            started_at_ms: 0,
            finished_at_ms: Some(1),
        };
        let web = OffloadCommand { cluster: "member-1".into(), namespace: "web".into(), ..OffloadCommand::default() };
        let shop =
            OffloadCommand { namespace: "shop".into(), operation: OffloadOperation::Burst, deployment: Some("api".into()), replicas: Some(6), ..web.clone() };
        let all = vec![
            snap(&r, 1, TaskKind::OFFLOAD, &web.subject(), &web, TaskState::Succeeded, vec![entry("web-member-1", r#"[{"cluster": "member-2", "id": "member-2", "node": "liqo-member-2"}]"#)]),
            snap(&r, 2, TaskKind::OFFLOAD, &shop.subject(), &shop, TaskState::Succeeded, vec![entry("shop-member-1", r#"[{"cluster": "member-3", "id": "member-3", "node": "liqo-member-3"}]"#)]),
            snap(
                &r,
                3,
                TaskKind::OFFLOAD,
                &web.subject(),
                &OffloadCommand { operation: OffloadOperation::Unoffload, ..web.clone() },
                TaskState::Succeeded,
                vec![],
            ),
        ];
        let got = offloads(&r, &all);
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].namespace.as_str(), got[0].targets.clone(), got[0].burst.as_deref()), ("shop", vec!["member-3".to_owned()], Some("api × 6")));
    }
}

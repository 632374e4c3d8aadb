//! The task kinds Ferry knows, one per command topic.

use std::fmt;
use std::str::FromStr;

use apache_avro::AvroSchema;
use serde::{Deserialize, Serialize};

/// What a task does; selects the command topic and the worker that owns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, AvroSchema)]
#[avro(namespace = "io.ferry.v1")]
pub enum TaskKind {
    /// Cluster API provisioning, scaling and deletion.
    CreateCluster,
    /// Liqo or Submariner peering between two clusters.
    Peer,
    /// Liqo namespace offloading and bursting.
    Offload,
    /// Applications through OCM ManifestWork.
    Deploy,
    /// Cluster scoring for placement.
    Score,
    /// The runtime's own no-op task, for demos, tests and benchmarks.
    Test,
    /// A list of commands of the other kinds, each run as a child task, reverted as one.
    /// Last: a new Avro enum symbol goes at the end, so older records keep their indexes.
    Plan,
}

impl TaskKind {
    /// Every kind, in topic order.
    pub const ALL: [TaskKind; 7] = [
        TaskKind::CreateCluster,
        TaskKind::Peer,
        TaskKind::Offload,
        TaskKind::Deploy,
        TaskKind::Score,
        TaskKind::Test,
        TaskKind::Plan,
    ];

    /// The name used on the command line and in `topics/topics.yaml`.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskKind::CreateCluster => "create-cluster",
            TaskKind::Peer => "peer",
            TaskKind::Offload => "offload",
            TaskKind::Deploy => "deploy",
            TaskKind::Score => "score",
            TaskKind::Test => "test",
            TaskKind::Plan => "plan",
        }
    }
}

impl TaskKind {
    /// One line on what the kind does (the CLI's `--help` lists it).
    pub fn describe(self) -> &'static str {
        match self {
            TaskKind::CreateCluster => "Cluster API provisioning, scaling and deletion",
            TaskKind::Peer => "Liqo or Submariner peering between two clusters",
            TaskKind::Offload => "Liqo namespace offloading and bursting",
            TaskKind::Deploy => "Applications through OCM ManifestWork",
            TaskKind::Score => "Cluster scoring for placement",
            TaskKind::Test => "The runtime's own no-op task, for demos, tests and benchmarks",
            TaskKind::Plan => "Commands of the other kinds run as child tasks, reverted as one",
        }
    }
}

impl fmt::Display for TaskKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not a task kind.
#[derive(Debug, thiserror::Error)]
#[error("unknown task kind {0:?}: expected one of create-cluster, peer, offload, deploy, score, test, plan")]
pub struct UnknownKind(pub String);

impl FromStr for TaskKind {
    type Err = UnknownKind;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TaskKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| UnknownKind(s.to_owned()))
    }
}

//! The `score` command (`ScoreClusters`) and the record each scoring leaves on the
//! compacted scores topic (`ClusterScore`, key = cluster).

use std::collections::HashMap;

use apache_avro::AvroSchema;
use serde::{Deserialize, Serialize};

/// How clusters are scored (each a pure function in [`crate::policy`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
// Avro symbols are the variant names; spec files may use the kebab-case names.
pub enum ScorePolicy {
    /// Free CPU and memory against MIN and MAX bounds (rcs-score).
    #[default]
    #[serde(alias = "resource-usage")]
    #[schemars(extend("x-aliases" = ["resource-usage"]))]
    ResourceUsage,
    /// The most replicas of the workload fit: spread (mck8s worst-fit).
    #[serde(alias = "worst-fit")]
    #[schemars(extend("x-aliases" = ["worst-fit"]))]
    WorstFit,
    /// The fewest replicas still fit: pack (mck8s best-fit).
    #[serde(alias = "best-fit")]
    #[schemars(extend("x-aliases" = ["best-fit"]))]
    BestFit,
    /// Nearest to the source location by the latency matrix.
    #[serde(alias = "latency-aware")]
    #[schemars(extend("x-aliases" = ["latency-aware"]))]
    LatencyAware,
    /// A benchmark Job on each cluster through a ManifestWork.
    #[serde(alias = "benchmark")]
    #[schemars(extend("x-aliases" = ["benchmark"]))]
    Benchmark,
}

impl ScorePolicy {
    /// The kebab-case name (also the AddOnPlacementScore's suffix).
    pub fn name(self) -> &'static str {
        match self {
            Self::ResourceUsage => "resource-usage",
            Self::WorstFit => "worst-fit",
            Self::BestFit => "best-fit",
            Self::LatencyAware => "latency-aware",
            Self::Benchmark => "benchmark",
        }
    }
}

/// What one replica requests, and how many replicas.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct Workload {
    /// CPU per replica, a Kubernetes quantity (`500m`, `1`).
    pub cpu: String,
    /// Memory per replica, a Kubernetes quantity (`256Mi`).
    pub memory: String,
    /// Replicas.
    pub replicas: i32,
}

/// Bounds of the resource-usage policy: available resources at MIN score -100, at MAX +100.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct UsageBounds {
    /// CPU at -100 (quantity); default 0.
    #[serde(default)]
    pub min_cpu: Option<String>,
    /// CPU at +100 (quantity); default 8.
    #[serde(default)]
    pub max_cpu: Option<String>,
    /// Memory at -100 (quantity); default 0.
    #[serde(default)]
    pub min_memory: Option<String>,
    /// Memory at +100 (quantity); default 16Gi.
    #[serde(default)]
    pub max_memory: Option<String>,
}

/// The benchmark policy's Job.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct BenchmarkSpec {
    /// Image of the benchmark; it writes its result (higher is better) to the ConfigMap
    /// `ferry-benchmark-result`, key `result`.
    pub image: String,
    /// Time for every cluster to report, in seconds (1 to 3600).
    pub deadline_seconds: i32,
}

/// `ScoreClusters`: score the named clusters (or a ManagedClusterSet's members).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct ScoreClusters {
    /// Clusters to score; empty means the members of `cluster_set`.
    #[serde(default)]
    pub clusters: Vec<String>,
    /// A ManagedClusterSet whose members are scored (when `clusters` is empty).
    #[serde(default)]
    pub cluster_set: Option<String>,
    /// The policy.
    #[serde(default)]
    pub policy: ScorePolicy,
    /// The workload to place (worst-fit and best-fit need it).
    #[serde(default)]
    pub workload: Option<Workload>,
    /// Where the workload's users are (latency-aware needs it): a row of the matrix.
    #[serde(default)]
    pub source: Option<String>,
    /// Latency matrix in milliseconds, `from -> to -> ms`; when absent the worker's
    /// configured ConfigMap is read.
    #[serde(default)]
    pub latency_ms: Option<HashMap<String, HashMap<String, i32>>>,
    /// Resource-usage bounds.
    #[serde(default)]
    pub bounds: Option<UsageBounds>,
    /// The benchmark (benchmark policy).
    #[serde(default)]
    pub benchmark: Option<BenchmarkSpec>,
    /// How long the published scores stay valid, in seconds (default 600).
    #[serde(default)]
    pub valid_for_seconds: Option<i32>,
}

/// One cluster's score on the scores topic (key = cluster; compacted: the latest stays).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, AvroSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct ClusterScore {
    /// The cluster.
    pub cluster: String,
    /// The policy's name.
    pub policy: String,
    /// Overall score in [-100, 100].
    pub score: i32,
    /// The items (e.g. cpuAvailable, memAvailable), each in [-100, 100].
    pub items: HashMap<String, i32>,
    /// Why this score, in words.
    pub reason: String,
    /// Rank among the task's clusters, from 1.
    pub rank: i32,
    /// The scoring task.
    pub task_id: String,
    /// When measured (RFC 3339).
    pub measured_at: String,
    /// Until when it is valid (RFC 3339).
    pub valid_until: String,
}

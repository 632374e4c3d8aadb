//! The `score` task: resolve the clusters, measure them as the policy needs, score, and
//! publish (AddOnPlacementScores on the hub and records on the scores topic); each step is
//! a module of [`crate::steps`].

use std::sync::Arc;

use ferry_kube::{Clusters, Watches};
use ferry_runtime::{KafkaConfig, Topics};
use ferry_task::wire::Registry;
use ferry_task::{Rejection, Step, TaskHandler, TaskKind};
use rdkafka::producer::FutureProducer;

use crate::spec::ScoreClusters;
use crate::steps::{measure::Measure, publish::Publish, resolve::Resolve, score::Score};

// The test kit and the fault campaign name them here.
pub use crate::steps::publish::placement_score_name;
pub use crate::steps::score::Ranked;

/// Field manager of everything this worker applies.
pub const MANAGER: &str = "ferry-score";
pub use ferry_kube::vocab::ocm::CLUSTERSET_LABEL;
/// Annotation naming the task that wrote an object.
pub const TASK_ANNOTATION: &str = "ferry.io/task";

/// What the score worker needs.
#[derive(Clone)]
pub struct ScoreConfig {
    /// The hub and the managed clusters.
    pub clusters: Arc<Clusters>,
    /// Shared watches (benchmark waits).
    pub watches: Arc<Watches>,
    /// Kafka, for the scores topic.
    pub kafka: KafkaConfig,
    /// Topic names.
    pub topics: Topics,
    /// The hub ConfigMap (`namespace`, `name`) holding the latency matrix under key
    /// `latency.yaml` (`from: {to: ms}`), read when a command carries none.
    pub latency_configmap: (String, String),
    /// Namespace of the benchmark on the managed clusters.
    pub benchmark_namespace: String,
}

impl ScoreConfig {
    /// Defaults: latency matrix in `ferry-system/ferry-latency`, benchmark in `ferry-benchmark`.
    pub fn new(clusters: Arc<Clusters>, kafka: KafkaConfig, topics: Topics) -> Self {
        Self {
            clusters,
            watches: Arc::new(Watches::new()),
            kafka,
            topics,
            latency_configmap: ("ferry-system".into(), "ferry-latency".into()),
            benchmark_namespace: "ferry-benchmark".into(),
        }
    }
}

/// What the steps share: the configuration, and the producer and registry of the scores
/// topic (`publish`).
pub(crate) struct Inner {
    pub(crate) cfg: ScoreConfig,
    pub(crate) producer: FutureProducer,
    pub(crate) registry: Registry,
}

/// The handler of `score` tasks.
#[derive(Clone)]
pub struct ScoreHandler {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ScoreHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScoreHandler").finish_non_exhaustive()
    }
}

impl ScoreHandler {
    /// A handler; fails when the Kafka producer cannot be configured.
    pub fn new(cfg: ScoreConfig) -> Result<Self, rdkafka::error::KafkaError> {
        let producer: FutureProducer = cfg.kafka.producer().create()?;
        Ok(Self { inner: Arc::new(Inner { cfg, producer, registry: Registry::embedded() }) })
    }
}

impl TaskHandler for ScoreHandler {
    type Spec = ScoreClusters;

    fn kind(&self) -> TaskKind {
        TaskKind::SCORE
    }

    fn validate(&self, _subject: &str, spec: &ScoreClusters) -> Result<(), Rejection> {
        crate::validate::validate(spec)
    }

    /// The clusters named, the set scored; neither means every managed cluster.
    fn targets(&self, _subject: &str, spec: &ScoreClusters) -> ferry_task::Targets {
        let t = ferry_task::Targets::clusters(spec.clusters.iter().cloned()).with_sets(spec.cluster_set.clone());
        if spec.clusters.is_empty() && spec.cluster_set.is_none() { t.chosen_at_run("no cluster or set named: every managed cluster") } else { t }
    }

    fn plan(&self, _spec: &ScoreClusters) -> Vec<Arc<dyn Step<ScoreClusters>>> {
        let i = &self.inner;
        vec![
            Arc::new(Resolve::new(i.clone())), // the clusters: listed, or a ManagedClusterSet's members
            Arc::new(Measure::new(i.clone())), // loads, the latency matrix, or the benchmark
            Arc::new(Score),                   // the ranking, with a reason per cluster (pure)
            Arc::new(Publish::new(i.clone())), // AddOnPlacementScores and the scores topic
        ]
    }

    /// `ferry_cluster_watches_failing{cluster}`: the clusters this worker waits on whose
    /// API servers do not answer its watches.
    fn gauges(&self) -> Vec<ferry_task::gauges::GaugeFamily> {
        self.inner.cfg.watches.gauges()
    }
}

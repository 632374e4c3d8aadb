//! The `score` task: resolve the clusters, measure them as the policy needs, score, and
//! publish (AddOnPlacementScores on the hub and records on the scores topic).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use ferry_kube::kinds::ManagedCluster;
use ferry_kube::step_errors::{hub_err, kube_err};
use ferry_kube::{ClusterError, Clusters, HUB, Watches};
use ferry_task::wire::Registry;
use ferry_runtime::{KafkaConfig, Topics};
use ferry_task::{Rejection, Step, StepContext, StepError, StepPolicy, TaskHandler, TaskKind};
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::policy::{self, ClusterLoad, LatencyMatrix, Scored};
use crate::spec::{ClusterScore, ScoreClusters, ScorePolicy};

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

pub(crate) struct Inner {
    pub(crate) cfg: ScoreConfig,
    producer: FutureProducer,
    registry: Registry,
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

/// Output of the resolve step.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Resolved {
    /// The clusters to score.
    pub clusters: Vec<String>,
    /// Those registered with OCM (they get an AddOnPlacementScore).
    pub ocm: Vec<String>,
}

/// Output of the measure step.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Measured {
    /// Loads of the clusters that answered (resource-usage, fit policies).
    #[serde(default)]
    pub loads: Vec<ClusterLoad>,
    /// The latency matrix used (latency-aware).
    #[serde(default)]
    pub latency: Option<LatencyMatrix>,
    /// Benchmark results (benchmark).
    #[serde(default)]
    pub results: BTreeMap<String, Result<f64, String>>,
    /// Clusters that could not be measured, and why.
    #[serde(default)]
    pub failed: BTreeMap<String, String>,
}

/// One line of the ranking (the task's output).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Ranked {
    /// From 1.
    pub rank: i32,
    /// The cluster.
    pub cluster: String,
    /// In [-100, 100].
    pub score: i32,
    /// The items.
    pub items: BTreeMap<String, i32>,
    /// Why.
    pub reason: String,
}

struct Resolve(Arc<Inner>);
struct Measure(Arc<Inner>);
struct ScoreStep;
struct Publish(Arc<Inner>);

impl Step<ScoreClusters> for Resolve {
    fn name(&self) -> &str {
        "resolve-clusters"
    }

    fn policy(&self) -> StepPolicy {
        StepPolicy { timeout: Duration::from_secs(60), ..StepPolicy::default() }
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, ScoreClusters>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let spec = cx.spec;
            let hub = self.0.cfg.clusters.hub().clone();
            let mcs: Api<ManagedCluster> = Api::all(hub);
            let clusters = match &spec.cluster_set {
                Some(set) if spec.clusters.is_empty() => {
                    let lp = ListParams::default().labels(&format!("{CLUSTERSET_LABEL}={set}"));
                    let mut names: Vec<String> = mcs.list(&lp).await.map_err(hub_err)?.items.into_iter().filter_map(|m| m.metadata.name).collect();
                    names.sort();
                    if names.is_empty() {
                        return Err(StepError::permanent("NO_CLUSTERS", format!("ManagedClusterSet {set:?} has no member clusters (label {CLUSTERSET_LABEL}={set})")));
                    }
                    names
                }
                _ => spec.clusters.clone(),
            };
            let mut ocm = Vec::new();
            for c in &clusters {
                let registered = mcs.get_opt(c).await.map_err(hub_err)?.is_some();
                if registered {
                    ocm.push(c.clone());
                }
                if spec.policy == ScorePolicy::Benchmark && !registered {
                    return Err(StepError::permanent("UNKNOWN_CLUSTER", format!("cluster {c:?} is not registered with OCM: the benchmark runs through a ManifestWork")));
                }
                if matches!(spec.policy, ScorePolicy::ResourceUsage | ScorePolicy::WorstFit | ScorePolicy::BestFit) {
                    match self.0.cfg.clusters.kubeconfig_secret(c).await {
                        Ok(_) => {}
                        Err(e @ (ClusterError::Unknown { .. } | ClusterError::Ambiguous { .. })) => {
                            return Err(StepError::permanent("UNKNOWN_CLUSTER", e.to_string()));
                        }
                        Err(e) => return Err(kube_err("HUB_API", e)),
                    }
                }
            }
            cx.progress(100, format!("{} cluster(s), {} registered with OCM", clusters.len(), ocm.len()));
            Ok(serde_json::to_value(Resolved { clusters, ocm }).expect("serializable"))
        }
        .boxed()
    }

    fn undo<'a>(&'a self, _cx: &'a StepContext<'a, ScoreClusters>, _output: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async { Ok(()) }.boxed()
    }
}

fn resolved(cx: &StepContext<'_, ScoreClusters>) -> Result<Resolved, StepError> {
    cx.required("resolve-clusters")
}

impl Measure {
    async fn latency(&self, spec: &ScoreClusters) -> Result<LatencyMatrix, StepError> {
        if let Some(m) = &spec.latency_ms {
            return Ok(m.clone());
        }
        let (ns, name) = &self.0.cfg.latency_configmap;
        let cm = Api::<ConfigMap>::namespaced(self.0.cfg.clusters.hub().clone(), ns).get_opt(name).await.map_err(hub_err)?;
        let text = cm.and_then(|c| c.data).and_then(|mut d| d.remove("latency.yaml")).ok_or_else(|| {
            StepError::permanent("NO_LATENCY_MATRIX", format!("the command has no latency_ms and ConfigMap {ns}/{name} on the hub has no key latency.yaml"))
        })?;
        serde_yaml_ng::from_str(&text).map_err(|e| StepError::permanent("BAD_LATENCY_MATRIX", format!("ConfigMap {ns}/{name} latency.yaml: {e}")))
    }
}

impl Step<ScoreClusters> for Measure {
    fn name(&self) -> &str {
        "measure"
    }

    fn policy(&self) -> StepPolicy {
        // The benchmark's own deadline bounds it; add room for applying and cleaning up.
        StepPolicy { timeout: Duration::from_secs(3600 + 300), ..StepPolicy::default() }
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, ScoreClusters>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let spec = cx.spec;
            let r = resolved(cx)?;
            let mut out = Measured::default();
            match spec.policy {
                ScorePolicy::ResourceUsage | ScorePolicy::WorstFit | ScorePolicy::BestFit => {
                    let n = r.clusters.len();
                    for (i, c) in r.clusters.iter().enumerate() {
                        match ferry_kube::capacity::measure(&self.0.cfg.clusters, c).await {
                            Ok(l) => out.loads.push(l),
                            Err(why) => {
                                out.failed.insert(c.clone(), why);
                            }
                        }
                        cx.progress(((i + 1) * 100 / n) as u8, format!("measured {c}"));
                    }
                }
                ScorePolicy::LatencyAware => out.latency = Some(self.latency(spec).await?),
                ScorePolicy::Benchmark => {
                    out.results = crate::benchmark::run(&self.0, cx, &r.clusters).await?;
                }
            }
            Ok(serde_json::to_value(out).expect("serializable"))
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, ScoreClusters>, _output: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            if cx.spec.policy == ScorePolicy::Benchmark
                && let Some(r) = cx.output_of::<Resolved>("resolve-clusters")
            {
                crate::benchmark::clean_up(&self.0, cx, &r.clusters).await?;
            }
            Ok(())
        }
        .boxed()
    }
}

/// Scores measurements by the spec's policy (pure), best first.
pub fn score(spec: &ScoreClusters, r: &Resolved, m: &Measured) -> Result<Vec<Ranked>, Rejection> {
    let failed = |c: &String, why: &String| Scored { cluster: c.clone(), score: -100, items: BTreeMap::from([("score".into(), -100)]), reason: format!("not measured: {why}") };
    let mut scored: Vec<Scored> = match spec.policy {
        ScorePolicy::ResourceUsage => {
            let b = crate::validate::bounds(spec)?;
            m.loads.iter().map(|l| policy::resource_usage(l, b)).collect()
        }
        ScorePolicy::WorstFit | ScorePolicy::BestFit => {
            let d = crate::validate::demand(spec)?.ok_or_else(|| Rejection::new("no workload"))?;
            if spec.policy == ScorePolicy::WorstFit { policy::worst_fit(&m.loads, d) } else { policy::best_fit(&m.loads, d) }
        }
        ScorePolicy::LatencyAware => {
            let matrix = m.latency.clone().unwrap_or_default();
            policy::latency_aware(&r.clusters, &matrix, spec.source.as_deref().unwrap_or_default())
        }
        ScorePolicy::Benchmark => {
            let results: Vec<(String, Result<f64, String>)> = r.clusters.iter().map(|c| (c.clone(), m.results.get(c).cloned().unwrap_or(Err("no result".into())))).collect();
            policy::benchmark(&results)
        }
    };
    scored.extend(m.failed.iter().map(|(c, w)| failed(c, w)));
    Ok(policy::rank(scored)
        .into_iter()
        .enumerate()
        .map(|(i, s)| Ranked { rank: i as i32 + 1, cluster: s.cluster, score: s.score, items: s.items, reason: s.reason })
        .collect())
}

impl Step<ScoreClusters> for ScoreStep {
    fn name(&self) -> &str {
        "score"
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, ScoreClusters>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let r = resolved(cx)?;
            let m: Measured = cx.required("measure")?;
            let ranking = score(cx.spec, &r, &m).map_err(|e| StepError::permanent("BAD_SPEC", e.reason))?;
            if let Some(top) = ranking.first() {
                cx.progress(100, format!("best: {} ({}): {}", top.cluster, top.score, top.reason));
            }
            Ok(json!({ "policy": cx.spec.policy.name(), "ranking": ranking }))
        }
        .boxed()
    }

    fn undo<'a>(&'a self, _cx: &'a StepContext<'a, ScoreClusters>, _output: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async { Ok(()) }.boxed()
    }
}

/// Name of the AddOnPlacementScore a policy writes (`ferry-<policy>`); its items are the
/// policy's items plus `score`.
pub fn placement_score_name(p: ScorePolicy) -> String {
    format!("ferry-{}", p.name())
}

fn aps_gvk() -> GroupVersionKind {
    GroupVersionKind::gvk("cluster.open-cluster-management.io", "v1alpha1", "AddOnPlacementScore")
}

impl Publish {
    async fn placement_score(&self, cx: &StepContext<'_, ScoreClusters>, r: &Ranked, valid_until: &str) -> Result<String, StepError> {
        let name = placement_score_name(cx.spec.policy);
        let api = self.0.cfg.clusters.api(HUB, &aps_gvk(), Some(&r.cluster)).await.map_err(|e| kube_err("HUB_API", e))?;
        let meta = json!({
            "name": name,
            "namespace": r.cluster,
            "labels": {"app.kubernetes.io/managed-by": "ferry"},
            "annotations": {TASK_ANNOTATION: cx.task_id.to_string()},
        });
        let obj = json!({"apiVersion": "cluster.open-cluster-management.io/v1alpha1", "kind": "AddOnPlacementScore", "metadata": meta});
        let pp = PatchParams::apply(MANAGER).force();
        api.patch(&name, &pp, &Patch::Apply(&obj)).await.map_err(hub_err)?;
        let mut items: BTreeMap<String, i32> = r.items.clone();
        items.insert("score".into(), r.score);
        let scores: Vec<Value> = items.iter().map(|(k, v)| json!({"name": k, "value": v})).collect();
        let status = json!({
            "apiVersion": "cluster.open-cluster-management.io/v1alpha1",
            "kind": "AddOnPlacementScore",
            "metadata": {"name": name, "namespace": r.cluster},
            "status": {"scores": scores, "validUntil": valid_until},
        });
        api.patch_status(&name, &pp, &Patch::Apply(&status)).await.map_err(hub_err)?;
        Ok(format!("{}/{name}", r.cluster))
    }
}

impl Step<ScoreClusters> for Publish {
    fn name(&self) -> &str {
        "publish"
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, ScoreClusters>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let r = resolved(cx)?;
            let out = cx.required::<Value>("score")?;
            let ranking: Vec<Ranked> = serde_json::from_value(out["ranking"].clone()).map_err(|e| StepError::permanent("INTERNAL", e.to_string()))?;
            let now = jiff::Timestamp::now();
            let valid_for = jiff::SignedDuration::from_secs(i64::from(cx.spec.valid_for_seconds.unwrap_or(600)));
            let valid_until = now.checked_add(valid_for).unwrap_or(now).round(jiff::Unit::Second).unwrap_or(now).to_string();
            let mut written = Vec::new();
            for x in &ranking {
                if r.ocm.contains(&x.cluster) {
                    written.push(self.placement_score(cx, x, &valid_until).await?);
                }
                let rec = ClusterScore {
                    cluster: x.cluster.clone(),
                    policy: cx.spec.policy.name().into(),
                    score: x.score,
                    items: x.items.iter().map(|(k, v)| (k.clone(), *v)).collect::<HashMap<_, _>>(),
                    reason: x.reason.clone(),
                    rank: x.rank,
                    task_id: cx.task_id.to_string(),
                    measured_at: now.to_string(),
                    valid_until: valid_until.clone(),
                };
                let payload = self.0.registry.encode(&rec).map_err(|e| StepError::permanent("ENCODE", e.to_string()))?;
                let topic = self.0.cfg.topics.scores().name.clone();
                self.0
                    .producer
                    .send(FutureRecord::to(&topic).key(&x.cluster).payload(&payload), Duration::from_secs(30))
                    .await
                    .map_err(|(e, _)| StepError::transient("KAFKA", format!("writing the score of {} to {topic}: {e}", x.cluster)))?;
            }
            cx.progress(100, format!("{} placement score(s), {} record(s) on the scores topic", written.len(), ranking.len()));
            Ok(json!({ "placement_scores": written, "valid_until": valid_until }))
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, ScoreClusters>, _output: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            // Remove the placement scores this task wrote (not newer ones of other tasks).
            // Records on the scores topic are measurements in time: they stay.
            let Some(r) = cx.output_of::<Resolved>("resolve-clusters") else { return Ok(()) };
            let name = placement_score_name(cx.spec.policy);
            for c in &r.ocm {
                let api = self.0.cfg.clusters.api(HUB, &aps_gvk(), Some(c)).await.map_err(|e| kube_err("HUB_API", e))?;
                let Some(o) = api.get_opt(&name).await.map_err(hub_err)? else { continue };
                let ours = o.metadata.annotations.as_ref().and_then(|a| a.get(TASK_ANNOTATION)).map(String::as_str) == Some(&cx.task_id.to_string());
                if ours {
                    match api.delete(&name, &Default::default()).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(s)) if s.code == 404 => {}
                        Err(e) => return Err(hub_err(e)),
                    }
                }
            }
            Ok(())
        }
        .boxed()
    }
}

impl TaskHandler for ScoreHandler {
    type Spec = ScoreClusters;

    fn kind(&self) -> TaskKind {
        TaskKind::Score
    }

    fn validate(&self, _subject: &str, spec: &ScoreClusters) -> Result<(), Rejection> {
        crate::validate::validate(spec)
    }

    fn plan(&self, _spec: &ScoreClusters) -> Vec<Arc<dyn Step<ScoreClusters>>> {
        vec![
            Arc::new(Resolve(self.inner.clone())),
            Arc::new(Measure(self.inner.clone())),
            Arc::new(ScoreStep),
            Arc::new(Publish(self.inner.clone())),
        ]
    }
}

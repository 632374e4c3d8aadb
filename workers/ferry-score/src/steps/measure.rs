//! `measure`: what the policy scores, per cluster: Nodes and Pods through each cluster's
//! kubeconfig (resource-usage, the fit policies; a cluster that does not answer is noted,
//! not fatal), the latency matrix (from the command or the hub's ConfigMap), or the
//! benchmark through ManifestWorks ([`crate::benchmark`], removed before the step ends).
//! Its undo removes the benchmark's ManifestWorks a cut-short run left.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ferry_kube::step_errors::hub_err;
use ferry_task::{Output, Step, StepContext, StepError, StepPolicy, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::resolve::RESOLVE;
use crate::handler::Inner;
use crate::policy::{ClusterLoad, LatencyMatrix};
use crate::spec::{ScoreClusters, ScorePolicy};

/// The `measure` step's output.
pub const MEASURE: Output<Measured> = Output::new("measure");

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

/// The `measure` step.
pub struct Measure {
    inner: Arc<Inner>,
}

impl Measure {
    pub(crate) fn new(inner: Arc<Inner>) -> Self {
        Self { inner }
    }

    async fn latency(&self, spec: &ScoreClusters) -> Result<LatencyMatrix, StepError> {
        if let Some(m) = &spec.latency_ms {
            return Ok(m.clone());
        }
        let (ns, name) = &self.inner.cfg.latency_configmap;
        let cm = Api::<ConfigMap>::namespaced(self.inner.cfg.clusters.hub().clone(), ns).get_opt(name).await.map_err(hub_err)?;
        let text = cm.and_then(|c| c.data).and_then(|mut d| d.remove("latency.yaml")).ok_or_else(|| {
            StepError::permanent(codes::NO_LATENCY_MATRIX, format!("the command has no latency_ms and ConfigMap {ns}/{name} on the hub has no key latency.yaml"))
        })?;
        serde_yaml_ng::from_str(&text).map_err(|e| StepError::permanent(codes::BAD_LATENCY_MATRIX, format!("ConfigMap {ns}/{name} latency.yaml: {e}")))
    }
}

impl Step<ScoreClusters> for Measure {
    fn name(&self) -> &str {
        MEASURE.step()
    }

    fn policy(&self) -> StepPolicy {
        // The benchmark's own deadline bounds it; add room for applying and cleaning up.
        StepPolicy { timeout: Duration::from_secs(3600 + 300), ..StepPolicy::default() }
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, ScoreClusters>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let spec = cx.spec;
            let r = RESOLVE.required(cx)?;
            let mut out = Measured::default();
            match spec.policy {
                ScorePolicy::ResourceUsage | ScorePolicy::WorstFit | ScorePolicy::BestFit => {
                    let n = r.clusters.len();
                    for (i, c) in r.clusters.iter().enumerate() {
                        match ferry_kube::capacity::measure(&self.inner.cfg.clusters, c).await {
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
                    out.results = crate::benchmark::run(&self.inner, cx, &r.clusters).await?;
                }
            }
            MEASURE.value(&out)
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, ScoreClusters>, _output: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            if cx.spec.policy == ScorePolicy::Benchmark
                && let Some(r) = RESOLVE.get(cx)
            {
                crate::benchmark::clean_up(&self.inner, cx, &r.clusters).await?;
            }
            Ok(())
        }
        .boxed()
    }
}

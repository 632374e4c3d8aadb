//! `score`: the measurements scored by the command's policy ([`crate::policy`], pure) into
//! a ranking, best first, with a reason per cluster (one that could not be measured scores
//! -100). It changes nothing, so its undo has nothing to put back.

use std::collections::BTreeMap;

use ferry_task::{CheckStep, Output, Rejection, StepContext, StepError, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::measure::{MEASURE, Measured};
use super::resolve::{RESOLVE, Resolved};
use crate::policy::{self, Scored};
use crate::spec::{ScoreClusters, ScorePolicy};

/// The `score` step's output.
pub const SCORE: Output<Ranking> = Output::new("score");

/// Output of the score step: the ranking by one policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ranking {
    /// The policy's kebab-case name.
    pub policy: String,
    /// Best first.
    pub ranking: Vec<Ranked>,
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

/// The `score` step (pure: it needs nothing but earlier outputs).
pub struct Score;

impl CheckStep<ScoreClusters> for Score {
    fn name(&self) -> &str {
        SCORE.step()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, ScoreClusters>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let r = RESOLVE.required(cx)?;
            let m = MEASURE.required(cx)?;
            let ranking = score(cx.spec, &r, &m).map_err(|e| StepError::permanent(codes::BAD_SPEC, e.reason))?;
            if let Some(top) = ranking.first() {
                cx.progress(100, format!("best: {} ({}): {}", top.cluster, top.score, top.reason));
            }
            SCORE.value(&Ranking { policy: cx.spec.policy.name().into(), ranking })
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_output_keeps_the_shape_views_read() {
        let ranked = Ranked { rank: 1, cluster: "member-1".into(), score: 40, items: BTreeMap::from([("cpu".into(), 40)]), reason: "free".into() };
        let out = SCORE.value(&Ranking { policy: "resource-usage".into(), ranking: vec![ranked] }).unwrap();
        assert_eq!(
            out,
            json!({"policy": "resource-usage", "ranking": [{"rank": 1, "cluster": "member-1", "score": 40, "items": {"cpu": 40}, "reason": "free"}]})
        );
    }
}

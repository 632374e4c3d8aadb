//! Checks a `ScoreClusters` command before anything is read or written; each refusal
//! names the field and the rule.

use ferry_kube::quantity;
use ferry_task::Rejection;

use crate::policy::{Bounds, Demand};
use crate::spec::{ScoreClusters, ScorePolicy};

/// Most clusters one task scores.
pub const MAX_CLUSTERS: usize = 1000;

pub use ferry_kube::names::is_dns1123_label;

fn qty(field: &str, v: &str, cpu: bool) -> Result<i64, Rejection> {
    let r = if cpu { quantity::millicores(v) } else { quantity::units(v) };
    match r {
        Ok(n) if n >= 0 => Ok(n),
        Ok(_) => Err(Rejection::new(format!("{field} must not be negative, got {v:?}"))),
        Err(e) => Err(Rejection::new(format!("{field}: {e}"))),
    }
}

/// The workload in millicores and bytes, when the spec has one.
pub fn demand(spec: &ScoreClusters) -> Result<Option<Demand>, Rejection> {
    let Some(w) = &spec.workload else { return Ok(None) };
    let cpu = qty("workload.cpu", &w.cpu, true)?;
    let mem = qty("workload.memory", &w.memory, false)?;
    if cpu == 0 && mem == 0 {
        return Err(Rejection::new("workload.cpu and workload.memory are both zero: every cluster would fit it without limit"));
    }
    if w.replicas < 1 {
        return Err(Rejection::new(format!("workload.replicas must be at least 1, got {}", w.replicas)));
    }
    Ok(Some(Demand { cpu, mem, replicas: i64::from(w.replicas) }))
}

/// The resource-usage bounds, defaults filled in.
pub fn bounds(spec: &ScoreClusters) -> Result<Bounds, Rejection> {
    let d = Bounds::default();
    let Some(b) = &spec.bounds else { return Ok(d) };
    let pick = |field: &str, v: &Option<String>, cpu: bool, default: i64| v.as_deref().map_or(Ok(default), |v| qty(field, v, cpu));
    let out = Bounds {
        min_cpu: pick("bounds.min_cpu", &b.min_cpu, true, d.min_cpu)?,
        max_cpu: pick("bounds.max_cpu", &b.max_cpu, true, d.max_cpu)?,
        min_mem: pick("bounds.min_memory", &b.min_memory, false, d.min_mem)?,
        max_mem: pick("bounds.max_memory", &b.max_memory, false, d.max_mem)?,
    };
    if out.min_cpu > out.max_cpu {
        return Err(Rejection::new("bounds.min_cpu is larger than bounds.max_cpu"));
    }
    if out.min_mem > out.max_mem {
        return Err(Rejection::new("bounds.min_memory is larger than bounds.max_memory"));
    }
    Ok(out)
}

/// Every rule of a `ScoreClusters` command.
pub fn validate(spec: &ScoreClusters) -> Result<(), Rejection> {
    match (spec.clusters.is_empty(), &spec.cluster_set) {
        (true, None) => return Err(Rejection::new("name the clusters to score in `clusters`, or a ManagedClusterSet in `cluster_set`")),
        (false, Some(_)) => return Err(Rejection::new("give either `clusters` or `cluster_set`, not both")),
        (true, Some(set)) if !is_dns1123_label(set) => {
            return Err(Rejection::new(format!("cluster_set {set:?} is not a DNS-1123 label (lowercase letters, digits, '-', at most 63)")));
        }
        _ => {}
    }
    if spec.clusters.len() > MAX_CLUSTERS {
        return Err(Rejection::new(format!("at most {MAX_CLUSTERS} clusters per task, got {}", spec.clusters.len())));
    }
    let mut seen = std::collections::HashSet::new();
    for c in &spec.clusters {
        if !is_dns1123_label(c) {
            return Err(Rejection::new(format!("cluster {c:?} is not a DNS-1123 label (lowercase letters, digits, '-', at most 63)")));
        }
        if let Some(why) = ferry_kube::names::hub_named(c) {
            return Err(Rejection::new(why));
        }
        if !seen.insert(c) {
            return Err(Rejection::new(format!("cluster {c:?} is listed twice")));
        }
    }
    let demand = demand(spec)?;
    bounds(spec)?;
    match spec.policy {
        ScorePolicy::WorstFit | ScorePolicy::BestFit if demand.is_none() => {
            return Err(Rejection::new(format!("policy {} needs `workload` (cpu, memory, replicas)", spec.policy.name())));
        }
        ScorePolicy::LatencyAware if spec.source.as_deref().is_none_or(str::is_empty) => {
            return Err(Rejection::new("policy latency-aware needs `source`: the location the latency matrix measures from"));
        }
        ScorePolicy::Benchmark => match &spec.benchmark {
            None => return Err(Rejection::new("policy benchmark needs `benchmark` (image, deadline_seconds)")),
            Some(b) if b.image.trim().is_empty() || b.image.contains(char::is_whitespace) => {
                return Err(Rejection::new(format!("benchmark.image {:?} is not an image reference", b.image)));
            }
            Some(b) if !(1..=3600).contains(&b.deadline_seconds) => {
                return Err(Rejection::new(format!("benchmark.deadline_seconds must be 1 to 3600, got {}", b.deadline_seconds)));
            }
            _ => {}
        },
        _ => {}
    }
    if let Some(v) = spec.valid_for_seconds
        && !(1..=86_400).contains(&v)
    {
        return Err(Rejection::new(format!("valid_for_seconds must be 1 to 86400, got {v}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{BenchmarkSpec, UsageBounds, Workload};

    fn base() -> ScoreClusters {
        ScoreClusters { clusters: vec!["a".into(), "b".into()], ..ScoreClusters::default() }
    }

    #[test]
    fn refusals_name_the_field_and_rule() {
        let w = |cpu: &str, mem: &str, replicas| Some(Workload { cpu: cpu.into(), memory: mem.into(), replicas });
        let cases: Vec<(ScoreClusters, &str)> = vec![
            (ScoreClusters::default(), "name the clusters"),
            (ScoreClusters { cluster_set: Some("set".into()), ..base() }, "not both"),
            (ScoreClusters { clusters: vec!["Bad_Name".into()], ..base() }, "\"Bad_Name\" is not a DNS-1123 label"),
            (ScoreClusters { clusters: vec!["a".into(), "a".into()], ..base() }, "listed twice"),
            (ScoreClusters { policy: ScorePolicy::WorstFit, ..base() }, "worst-fit needs `workload`"),
            (ScoreClusters { policy: ScorePolicy::BestFit, workload: w("1x", "1Mi", 1), ..base() }, "workload.cpu"),
            (ScoreClusters { policy: ScorePolicy::BestFit, workload: w("0", "0", 1), ..base() }, "both zero"),
            (ScoreClusters { policy: ScorePolicy::BestFit, workload: w("1", "1Gi", 0), ..base() }, "replicas must be at least 1"),
            (ScoreClusters { policy: ScorePolicy::LatencyAware, ..base() }, "needs `source`"),
            (ScoreClusters { policy: ScorePolicy::Benchmark, ..base() }, "needs `benchmark`"),
            (ScoreClusters { policy: ScorePolicy::Benchmark, benchmark: Some(BenchmarkSpec { image: "x".into(), deadline_seconds: 0 }), ..base() }, "deadline_seconds"),
            (ScoreClusters { bounds: Some(UsageBounds { min_cpu: Some("4".into()), max_cpu: Some("2".into()), ..UsageBounds::default() }), ..base() }, "min_cpu is larger"),
            (ScoreClusters { valid_for_seconds: Some(0), ..base() }, "valid_for_seconds"),
        ];
        for (spec, want) in cases {
            let e = validate(&spec).expect_err(want);
            assert!(e.reason.contains(want), "{:?} should contain {want:?}", e.reason);
        }
        assert!(validate(&base()).is_ok());
        assert!(validate(&ScoreClusters { clusters: vec![], cluster_set: Some("edge".into()), ..base() }).is_ok());
    }
}

//! The scoring policies: pure functions from measurements to scores in [-100, 100], each
//! with the reason for its number. Nothing here talks to a cluster; [`ferry_kube::capacity`]
//! turns Nodes and Pods into [`ClusterLoad`]s.
//!
//! | policy | input | score |
//! |---|---|---|
//! | resource-usage | free CPU and memory of schedulable nodes | per resource `clamp(trunc(200 * (free - MIN) / (MAX - MIN) - 100), -100, 100)` (rcs-score); overall the mean of the two, truncated |
//! | worst-fit | replicas of the workload that fit | clusters that cannot fit every replica: -100; the others linearly from 0 (fewest fit) to 100 (most fit): spread |
//! | best-fit | the same | -100 when not every replica fits; the others from 100 (fewest fit: tightest) to 0 (most fit): pack |
//! | latency-aware | milliseconds from the source | 100 for the nearest, -100 for the farthest, linear between; unknown latency: -100 |
//! | benchmark | the benchmark's result (higher is better) | 100 for the best, -100 for the worst, linear between; failed or late: -100 |
//!
//! When every candidate measures the same, each gets 100 (there is nothing to prefer).
//! With `MIN = MAX`, a resource scores 100 when free ≥ MAX and -100 otherwise.

use std::collections::BTreeMap;

pub use ferry_kube::capacity::{ClusterLoad, NodeLoad};

/// A cluster's score and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Scored {
    /// The cluster.
    pub cluster: String,
    /// In [-100, 100].
    pub score: i32,
    /// Named parts (e.g. `cpuAvailable`), each in [-100, 100].
    pub items: BTreeMap<String, i32>,
    /// The reason, for the task's output.
    pub reason: String,
}

/// rcs-score's mapping: `clamp(trunc(200 * (value - min) / (max - min) - 100), -100, 100)`;
/// with `min == max`, 100 when `value >= max`, else -100.
pub fn linear(value: f64, min: f64, max: f64) -> i32 {
    if max <= min {
        return if value >= max { 100 } else { -100 };
    }
    (200.0 * (value - min) / (max - min) - 100.0).trunc().clamp(-100.0, 100.0) as i32
}

/// Bounds of the resource-usage policy, in millicores and bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// CPU scoring -100.
    pub min_cpu: i64,
    /// CPU scoring 100.
    pub max_cpu: i64,
    /// Memory scoring -100.
    pub min_mem: i64,
    /// Memory scoring 100.
    pub max_mem: i64,
}

impl Default for Bounds {
    fn default() -> Self {
        Self { min_cpu: 0, max_cpu: 8_000, min_mem: 0, max_mem: 16 << 30 }
    }
}

/// resource-usage: free CPU and memory of the schedulable nodes against `bounds`.
pub fn resource_usage(load: &ClusterLoad, bounds: Bounds) -> Scored {
    let (cpu, mem) = load.available();
    let c = linear(cpu as f64, bounds.min_cpu as f64, bounds.max_cpu as f64);
    let m = linear(mem as f64, bounds.min_mem as f64, bounds.max_mem as f64);
    let schedulable = load.schedulable().count();
    Scored {
        cluster: load.cluster.clone(),
        score: (c + m) / 2,
        items: BTreeMap::from([("cpuAvailable".to_owned(), c), ("memAvailable".to_owned(), m)]),
        reason: format!(
            "{} free CPU and {} MiB free memory on {schedulable} schedulable node(s){}",
            fmt_cpu(cpu),
            mem >> 20,
            load.excluded_note()
        ),
    }
}

fn fmt_cpu(m: i64) -> String {
    format!("{}.{:03} cores", m / 1000, (m % 1000).abs())
}

/// The workload of the fit policies, in millicores and bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Demand {
    /// CPU per replica.
    pub cpu: i64,
    /// Memory per replica.
    pub mem: i64,
    /// Replicas.
    pub replicas: i64,
}

fn fit_scores(loads: &[ClusterLoad], d: Demand, tight_first: bool) -> Vec<Scored> {
    let fits: Vec<i64> = loads.iter().map(|l| l.replicas_that_fit(d.cpu, d.mem)).collect();
    let ok: Vec<i64> = fits.iter().copied().filter(|&f| f >= d.replicas).collect();
    let (lo, hi) = (ok.iter().min().copied().unwrap_or(0), ok.iter().max().copied().unwrap_or(0));
    loads
        .iter()
        .zip(fits)
        .map(|(l, fit)| {
            let (score, why) = if fit < d.replicas {
                (-100, format!("only {fit} of {} replicas fit", d.replicas))
            } else {
                let s = if hi == lo {
                    100
                } else {
                    let room = 100.0 * (fit - lo) as f64 / (hi - lo) as f64;
                    (if tight_first { 100.0 - room } else { room }).trunc() as i32
                };
                (s, format!("{fit} replicas fit ({} needed)", d.replicas))
            };
            Scored { cluster: l.cluster.clone(), score, items: BTreeMap::from([("score".to_owned(), score)]), reason: format!("{why}{}", l.excluded_note()) }
        })
        .collect()
}

/// worst-fit: prefer the cluster where the most replicas fit (spread).
pub fn worst_fit(loads: &[ClusterLoad], d: Demand) -> Vec<Scored> {
    fit_scores(loads, d, false)
}

/// best-fit: prefer the cluster where the fewest replicas still fit (pack).
pub fn best_fit(loads: &[ClusterLoad], d: Demand) -> Vec<Scored> {
    fit_scores(loads, d, true)
}

/// Milliseconds from a place to others: `from -> to -> ms`.
pub type LatencyMatrix = std::collections::HashMap<String, std::collections::HashMap<String, i32>>;

/// Milliseconds between two places (either direction) in `matrix`.
pub fn latency(matrix: &LatencyMatrix, a: &str, b: &str) -> Option<i32> {
    if a == b {
        return Some(0);
    }
    matrix.get(a).and_then(|r| r.get(b)).or_else(|| matrix.get(b).and_then(|r| r.get(a))).copied()
}

/// latency-aware: nearer to `source` is better.
pub fn latency_aware(clusters: &[String], matrix: &LatencyMatrix, source: &str) -> Vec<Scored> {
    let known: Vec<i32> = clusters.iter().filter_map(|c| latency(matrix, source, c)).collect();
    let (lo, hi) = (known.iter().min().copied().unwrap_or(0), known.iter().max().copied().unwrap_or(0));
    clusters
        .iter()
        .map(|c| {
            let (score, reason) = match latency(matrix, source, c) {
                None => (-100, format!("no latency known between {source} and {c}")),
                Some(ms) => {
                    let s = if hi == lo { 100 } else { -linear(f64::from(ms), f64::from(lo), f64::from(hi)) };
                    (s, format!("{ms} ms from {source}"))
                }
            };
            Scored { cluster: c.clone(), score, items: BTreeMap::from([("score".to_owned(), score)]), reason }
        })
        .collect()
}

/// benchmark: a higher result is better; a failed or late benchmark scores -100.
pub fn benchmark(results: &[(String, Result<f64, String>)]) -> Vec<Scored> {
    let ok: Vec<f64> = results.iter().filter_map(|(_, r)| r.as_ref().ok().copied()).collect();
    let lo = ok.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = ok.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    results
        .iter()
        .map(|(c, r)| {
            let (score, reason) = match r {
                Err(why) => (-100, format!("benchmark failed: {why}")),
                Ok(v) => (if hi <= lo { 100 } else { linear(*v, lo, hi) }, format!("benchmark result {v}")),
            };
            Scored { cluster: c.clone(), score, items: BTreeMap::from([("score".to_owned(), score)]), reason }
        })
        .collect()
}

/// Best first; ties by cluster name, so the ranking is deterministic.
pub fn rank(mut scored: Vec<Scored>) -> Vec<Scored> {
    scored.sort_by(|a, b| b.score.cmp(&a.score).then_with(|| a.cluster.cmp(&b.cluster)));
    scored
}

#[cfg(test)]
mod tests {
    use super::*;

    const GI: i64 = 1 << 30;

    fn node(name: &str, cpu: i64, mem: i64, cpu_req: i64, mem_req: i64) -> NodeLoad {
        NodeLoad { name: name.into(), excluded: None, cpu_allocatable: cpu, mem_allocatable: mem, cpu_requested: cpu_req, mem_requested: mem_req }
    }

    fn cluster(name: &str, nodes: Vec<NodeLoad>) -> ClusterLoad {
        ClusterLoad { cluster: name.into(), nodes }
    }

    #[test]
    fn linear_matches_rcs_score_table() {
        // (value, min, max, expected)
        let table = [
            (0.0, 0.0, 100.0, -100),
            (50.0, 0.0, 100.0, 0),
            (100.0, 0.0, 100.0, 100),
            (150.0, 0.0, 100.0, 100),   // above MAX: clamped
            (-20.0, 0.0, 100.0, -100),  // over-committed: clamped
            (25.7, 0.0, 100.0, -48),    // -48.6: truncated toward zero, as Go's int()
            (74.9, 0.0, 100.0, 49),     // 49.8 → 49
            (5.0, 5.0, 5.0, 100),       // MIN = MAX, at MAX
            (4.0, 5.0, 5.0, -100),      // MIN = MAX, below
            (1.0, 10.0, 2.0, -100),     // MIN > MAX (refused by validation) acts as a threshold at MAX
        ];
        for (v, lo, hi, want) in table {
            assert_eq!(linear(v, lo, hi), want, "linear({v}, {lo}, {hi})");
        }
    }

    #[test]
    fn resource_usage_table() {
        let b = Bounds { min_cpu: 0, max_cpu: 4_000, min_mem: 0, max_mem: 8 * GI };
        let mut tainted = node("t", 4_000, 8 * GI, 0, 0);
        tainted.excluded = Some("taint dedicated=gpu:NoSchedule".into());
        let mut cordoned = node("c", 4_000, 8 * GI, 0, 0);
        cordoned.excluded = Some("unschedulable".into());
        // (name, load, cpuAvailable, memAvailable, overall)
        let table = [
            ("empty cluster: no nodes", cluster("a", vec![]), -100, -100, -100),
            ("idle node at MAX", cluster("a", vec![node("n", 4_000, 8 * GI, 0, 0)]), 100, 100, 100),
            ("half used", cluster("a", vec![node("n", 4_000, 8 * GI, 2_000, 4 * GI)]), 0, 0, 0),
            ("tainted and cordoned nodes do not count", cluster("a", vec![node("n", 4_000, 8 * GI, 3_000, 6 * GI), tainted, cordoned]), -50, -50, -50),
            ("over-committed", cluster("a", vec![node("n", 2_000, 2 * GI, 3_000, 4 * GI)]), -100, -100, -100),
            ("cpu free, memory full", cluster("a", vec![node("n", 4_000, 8 * GI, 0, 8 * GI)]), 100, -100, 0),
            ("two nodes add up", cluster("a", vec![node("n1", 2_000, 4 * GI, 1_000, 0), node("n2", 2_000, 4 * GI, 0, 2 * GI)]), 50, 50, 50),
        ];
        for (name, load, cpu, mem, overall) in table {
            let s = resource_usage(&load, b);
            assert_eq!((s.items["cpuAvailable"], s.items["memAvailable"], s.score), (cpu, mem, overall), "{name}: {}", s.reason);
        }
        // MIN = MAX: a threshold.
        let eq = Bounds { min_cpu: 1_000, max_cpu: 1_000, min_mem: GI, max_mem: GI };
        let s = resource_usage(&cluster("a", vec![node("n", 1_000, GI, 0, 0)]), eq);
        assert_eq!((s.items["cpuAvailable"], s.items["memAvailable"]), (100, 100));
        let s = resource_usage(&cluster("a", vec![node("n", 999, GI - 1, 0, 0)]), eq);
        assert_eq!((s.items["cpuAvailable"], s.items["memAvailable"]), (-100, -100));
    }

    #[test]
    fn replicas_that_fit_node_by_node() {
        // Free capacity split across nodes does not add up into one replica.
        let split = cluster("a", vec![node("n1", 600, GI, 0, 0), node("n2", 600, GI, 0, 0)]);
        assert_eq!(split.replicas_that_fit(1_000, 1), 0);
        assert_eq!(split.replicas_that_fit(500, GI / 2), 2);
        // Memory limits before CPU.
        assert_eq!(cluster("a", vec![node("n", 8_000, GI, 0, 0)]).replicas_that_fit(100, 300 << 20), 3);
        // Over-committed nodes fit nothing rather than a negative count.
        assert_eq!(cluster("a", vec![node("n", 1_000, GI, 2_000, 0), node("m", 1_000, GI, 0, 0)]).replicas_that_fit(500, 1), 2);
        // A zero request does not limit.
        assert_eq!(cluster("a", vec![node("n", 1_000, GI, 0, 0)]).replicas_that_fit(0, GI / 4), 4);
        // Empty cluster.
        assert_eq!(cluster("a", vec![]).replicas_that_fit(1, 1), 0);
    }

    #[test]
    fn worst_and_best_fit_rank_opposite_ways() {
        let loads = [
            cluster("small", vec![node("n", 2_000, 4 * GI, 0, 0)]),   // 4 fit
            cluster("large", vec![node("n", 8_000, 16 * GI, 0, 0)]),  // 16 fit
            cluster("medium", vec![node("n", 5_000, 10 * GI, 0, 0)]), // 10 fit
            cluster("full", vec![node("n", 1_000, 2 * GI, 0, 0)]),    // 2 fit < 3 needed
        ];
        let d = Demand { cpu: 500, mem: GI, replicas: 3 };
        let worst = rank(worst_fit(&loads, d));
        assert_eq!(worst.iter().map(|s| (s.cluster.as_str(), s.score)).collect::<Vec<_>>(), [("large", 100), ("medium", 50), ("small", 0), ("full", -100)]);
        assert_eq!(worst[3].reason, "only 2 of 3 replicas fit");
        let best = rank(best_fit(&loads, d));
        assert_eq!(best.iter().map(|s| (s.cluster.as_str(), s.score)).collect::<Vec<_>>(), [("small", 100), ("medium", 50), ("large", 0), ("full", -100)]);
        // Nothing fits anywhere: all -100, ranked by name.
        let none = rank(worst_fit(&loads, Demand { cpu: 100_000, mem: 1, replicas: 1 }));
        assert!(none.iter().all(|s| s.score == -100));
        // A single fitting cluster, or all equal: 100.
        let one = best_fit(&loads[..1], d);
        assert_eq!(one[0].score, 100);
    }

    #[test]
    fn latency_aware_prefers_near_and_penalizes_unknown() {
        let m: LatencyMatrix = serde_json::from_value(serde_json::json!({
            "eu-west": {"paris": 5, "frankfurt": 15},
            "tokyo": {"eu-west": 220},
        }))
        .unwrap();
        let cs = ["paris", "frankfurt", "tokyo", "mars"].map(String::from);
        let r = rank(latency_aware(&cs, &m, "eu-west"));
        assert_eq!(r.iter().map(|s| (s.cluster.as_str(), s.score)).collect::<Vec<_>>(), [("paris", 100), ("frankfurt", 90), ("mars", -100), ("tokyo", -100)]);
        assert_eq!(r[2].reason, "no latency known between eu-west and mars");
        assert_eq!(latency(&m, "tokyo", "eu-west"), latency(&m, "eu-west", "tokyo"), "symmetric lookup");
        assert_eq!(latency(&m, "paris", "paris"), Some(0));
    }

    #[test]
    fn benchmark_scores_results_and_failures() {
        let r = rank(benchmark(&[
            ("a".into(), Ok(100.0)),
            ("b".into(), Ok(300.0)),
            ("c".into(), Err("no result within 60s".into())),
            ("d".into(), Ok(200.0)),
        ]));
        assert_eq!(r.iter().map(|s| (s.cluster.as_str(), s.score)).collect::<Vec<_>>(), [("b", 100), ("d", 0), ("a", -100), ("c", -100)]);
        assert!(r[3].reason.contains("no result within 60s"));
        assert_eq!(benchmark(&[("x".into(), Ok(7.0))])[0].score, 100);
    }
}

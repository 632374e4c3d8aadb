//! OCM placement's ranking of feasible clusters, as the placement controller scores them
//! (ocm `00f84c3`): `pkg/placement/controllers/scheduling/schedule.go` (`getWeights`,
//! `mergeWeights`, the weighted sum, the sort by score then name) and the prioritizers in
//! `pkg/placement/plugins/{balance,steady,addon}`. In `Additive` mode (and the empty
//! mode) the built-in Balance and Steady keep weight 1 unless a configuration overrides
//! them; in `Exact` mode only the configured prioritizers count. Pure: the emulator hands
//! it the cluster list, every PlacementDecision and every AddOnPlacementScore.
//!
//! `ResourceAllocatableCPU` and `ResourceAllocatableMemory` (`plugins/resource`) score
//! each cluster by where its `status.allocatable` lies between the feasible clusters'
//! least and most, from -100 to 100 (100 for all when they are equal; nothing for a
//! cluster that reports no allocatable or capacity).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

/// `plugins.MaxClusterScore`.
const MAX_SCORE: i64 = 100;

/// A prioritizer a Placement can name (`spec.prioritizerPolicy.configurations[].scoreCoordinate`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Prioritizer {
    /// `BuiltIn` and its name (`Balance`, `Steady`, `ResourceAllocatableCPU`, ...).
    BuiltIn(String),
    /// `AddOn` with its AddOnPlacementScore resource and score names.
    AddOn {
        /// `addOn.resourceName`.
        resource: String,
        /// `addOn.scoreName`.
        score: String,
    },
}

/// A PlacementDecision as the prioritizers read it.
#[derive(Debug, Clone)]
pub struct Decision {
    /// Its namespace.
    pub namespace: String,
    /// Its placement (the `cluster.open-cluster-management.io/placement` label).
    pub placement: String,
    /// The clusters it decided.
    pub clusters: Vec<String>,
}

/// Why a Placement's prioritizer policy cannot be used (upstream: `Misconfigured`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Misconfigured {
    /// A mode other than `Additive`, `Exact` or empty.
    #[error("incorrect prioritizer policy mode: {0}")]
    Mode(String),
    /// A configuration without `scoreCoordinate`.
    #[error("scoreCoordinate field is required")]
    NoCoordinate,
}

/// The weight of each prioritizer of a Placement's `spec` (`getWeights`); weight 0
/// disables one.
pub fn weights(spec: &Value) -> Result<BTreeMap<Prioritizer, i64>, Misconfigured> {
    let policy = spec.get("prioritizerPolicy");
    let mode = policy.and_then(|p| p.get("mode")).and_then(Value::as_str).unwrap_or("");
    let mut w = BTreeMap::new();
    match mode {
        "Exact" => {}
        "Additive" | "" => {
            w.insert(Prioritizer::BuiltIn("Balance".into()), 1);
            w.insert(Prioritizer::BuiltIn("Steady".into()), 1);
        }
        other => return Err(Misconfigured::Mode(other.to_owned())),
    }
    for c in policy.and_then(|p| p.get("configurations")).and_then(Value::as_array).into_iter().flatten() {
        let sc = c.get("scoreCoordinate").ok_or(Misconfigured::NoCoordinate)?;
        // The CRD defaults `weight` to 1.
        let weight = c.get("weight").and_then(Value::as_i64).unwrap_or(1);
        let p = match sc.get("type").and_then(Value::as_str).unwrap_or("BuiltIn") {
            "AddOn" => Prioritizer::AddOn {
                resource: sc.pointer("/addOn/resourceName").and_then(Value::as_str).unwrap_or("").to_owned(),
                score: sc.pointer("/addOn/scoreName").and_then(Value::as_str).unwrap_or("").to_owned(),
            },
            _ => Prioritizer::BuiltIn(sc.get("builtIn").and_then(Value::as_str).unwrap_or("").to_owned()),
        };
        w.insert(p, weight);
    }
    Ok(w)
}

/// `plugins/balance`: 100 for a cluster no other placement decided; otherwise
/// `2 * int(100 * (0.5 - count / maxCount))`, counting every other placement's decisions.
pub fn balance(ns: &str, placement: &str, clusters: &[String], decisions: &[Decision]) -> BTreeMap<String, i64> {
    let mut count: BTreeMap<&str, i64> = BTreeMap::new();
    for d in decisions.iter().filter(|d| !(d.placement == placement && d.namespace == ns)) {
        for c in &d.clusters {
            *count.entry(c.as_str()).or_default() += 1;
        }
    }
    let max = count.values().copied().max().unwrap_or(0);
    clusters
        .iter()
        .map(|c| {
            let s = match count.get(c.as_str()) {
                Some(&n) => 2 * ((MAX_SCORE as f64) * (0.5 - n as f64 / max as f64)) as i64,
                None => MAX_SCORE,
            };
            (c.clone(), s)
        })
        .collect()
}

/// `plugins/steady`: 100 for a cluster this placement already decided, else 0.
pub fn steady(ns: &str, placement: &str, clusters: &[String], decisions: &[Decision]) -> BTreeMap<String, i64> {
    let current: BTreeSet<&str> =
        decisions.iter().filter(|d| d.placement == placement && d.namespace == ns).flat_map(|d| d.clusters.iter().map(String::as_str)).collect();
    clusters.iter().map(|c| (c.clone(), if current.contains(c.as_str()) { MAX_SCORE } else { 0 })).collect()
}

/// `plugins/resource` `mostResourceAllocatableScores`: `allocatable` of each cluster (None:
/// it reports none, or no capacity) scored by `((a - min) / (max - min) - 0.5) * 200`.
pub fn most_allocatable(clusters: &[String], allocatable: impl Fn(&str) -> Option<f64>) -> BTreeMap<String, i64> {
    let known: Vec<(String, f64)> = clusters.iter().filter_map(|c| allocatable(c).map(|a| (c.clone(), a))).collect();
    let min = known.iter().map(|(_, a)| *a).fold(f64::INFINITY, f64::min);
    let max = known.iter().map(|(_, a)| *a).fold(f64::NEG_INFINITY, f64::max);
    known
        .into_iter()
        .map(|(c, a)| {
            let s = if max - min != 0.0 { (((a - min) / (max - min) - 0.5) * 2.0 * 100.0) as i64 } else { MAX_SCORE };
            (c, s)
        })
        .collect()
}

/// The feasible `clusters` ranked best first: the weighted sum of every prioritizer with
/// a weight other than 0, ties by name. `addon(cluster, resource, score)` is the
/// AddOnPlacementScore item (0 when missing or expired, as `plugins/addon` gives);
/// `allocatable(cluster, "cpu" | "memory")` a cluster's reported allocatable (None when
/// it reports no allocatable or capacity of it).
pub fn rank(
    spec: &Value,
    ns: &str,
    placement: &str,
    clusters: &[String],
    decisions: &[Decision],
    addon: impl Fn(&str, &str, &str) -> i64,
    allocatable: impl Fn(&str, &str) -> Option<f64>,
) -> Result<Vec<(i64, String)>, Misconfigured> {
    let mut sum: BTreeMap<String, i64> = clusters.iter().map(|c| (c.clone(), 0)).collect();
    for (p, weight) in weights(spec)?.into_iter().filter(|(_, w)| *w != 0) {
        let scores: BTreeMap<String, i64> = match &p {
            Prioritizer::BuiltIn(b) if b == "Balance" => balance(ns, placement, clusters, decisions),
            Prioritizer::BuiltIn(b) if b == "Steady" => steady(ns, placement, clusters, decisions),
            Prioritizer::BuiltIn(b) if b == "ResourceAllocatableCPU" => most_allocatable(clusters, |c| allocatable(c, "cpu")),
            Prioritizer::BuiltIn(b) if b == "ResourceAllocatableMemory" => most_allocatable(clusters, |c| allocatable(c, "memory")),
            Prioritizer::BuiltIn(_) => BTreeMap::new(),
            Prioritizer::AddOn { resource, score } => clusters.iter().map(|c| (c.clone(), addon(c, resource, score))).collect(),
        };
        for (c, s) in scores {
            *sum.entry(c).or_default() += s * weight;
        }
    }
    let mut ranked: Vec<(i64, String)> = sum.into_iter().map(|(c, s)| (s, c)).collect();
    ranked.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    Ok(ranked)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    fn by_score(spec: &Value, decisions: &[Decision]) -> Vec<String> {
        // member-1 scores 30, member-2 80 on the AddOn score.
        let addon = |c: &str, _: &str, _: &str| if c == "member-2" { 80 } else { 30 };
        rank(spec, "apps", "web", &names(&["member-1", "member-2"]), decisions, addon, |_, _| None).unwrap().into_iter().map(|(_, c)| c).collect()
    }

    #[test]
    fn resource_allocatable_scores_between_the_least_and_the_most() {
        let cpu = |c: &str| match c {
            "c1" => Some(2.0),
            "c2" => Some(4.0),
            "c3" => Some(6.0),
            _ => None,
        };
        let s = most_allocatable(&names(&["c1", "c2", "c3", "c4"]), cpu);
        assert_eq!(s, BTreeMap::from([("c1".into(), -100), ("c2".into(), 0), ("c3".into(), 100)]), "c4 reports nothing: no score");
        assert_eq!(most_allocatable(&names(&["c1", "c9"]), |c| (c == "c1").then_some(3.0)), BTreeMap::from([("c1".into(), 100)]));
        let exact = json!({"prioritizerPolicy": {"mode": "Exact", "configurations": [{"scoreCoordinate": {"type": "BuiltIn", "builtIn": "ResourceAllocatableCPU"}, "weight": 2}]}});
        let ranked = rank(&exact, "a", "p", &names(&["c1", "c2", "c3"]), &[], |_, _, _| 0, |c, r| (r == "cpu").then(|| cpu(c)).flatten()).unwrap();
        assert_eq!(ranked, [(200, "c3".into()), (0, "c2".into()), (-200, "c1".into())]);
    }

    fn addon_policy(mode: &str) -> Value {
        json!({"prioritizerPolicy": {"mode": mode, "configurations": [
            {"scoreCoordinate": {"type": "AddOn", "addOn": {"resourceName": "ferry-resource-usage", "scoreName": "score"}}, "weight": 1}]}})
    }

    #[test]
    fn additive_keeps_steady_so_a_current_decision_outranks_a_better_score() {
        // The placement decided member-1 before; member-2 now scores 50 more.
        let before = [Decision { namespace: "apps".into(), placement: "web".into(), clusters: names(&["member-1"]) }];
        assert_eq!(by_score(&addon_policy("Additive"), &before), ["member-1", "member-2"], "Steady's +100 wins");
        assert_eq!(by_score(&addon_policy(""), &before), ["member-1", "member-2"], "the empty mode is Additive");
        assert_eq!(by_score(&addon_policy("Exact"), &before), ["member-2", "member-1"], "Exact ranks by the score alone");
    }

    #[test]
    fn additive_keeps_balance_so_other_placements_decisions_count() {
        // Another placement decided member-2 twice: Balance gives it -100, member-1 100.
        let others = [
            Decision { namespace: "apps".into(), placement: "db".into(), clusters: names(&["member-2"]) },
            Decision { namespace: "other".into(), placement: "web".into(), clusters: names(&["member-2"]) },
        ];
        assert_eq!(balance("apps", "web", &names(&["member-1", "member-2"]), &others), BTreeMap::from([("member-1".into(), 100), ("member-2".into(), -100)]));
        assert_eq!(by_score(&addon_policy("Additive"), &others), ["member-1", "member-2"]);
        assert_eq!(by_score(&addon_policy("Exact"), &others), ["member-2", "member-1"]);
    }

    #[test]
    fn weights_follow_merge_weights() {
        let w = weights(&json!({})).unwrap();
        assert_eq!(w.len(), 2, "no policy: Balance and Steady at 1");
        let off = json!({"prioritizerPolicy": {"mode": "Additive", "configurations": [
            {"scoreCoordinate": {"type": "BuiltIn", "builtIn": "Steady"}, "weight": 0}]}});
        assert_eq!(weights(&off).unwrap()[&Prioritizer::BuiltIn("Steady".into())], 0, "a configuration overrides a default");
        assert_eq!(weights(&json!({"prioritizerPolicy": {"mode": "Sometimes"}})), Err(Misconfigured::Mode("Sometimes".into())));
        assert_eq!(weights(&json!({"prioritizerPolicy": {"configurations": [{"weight": 2}]}})), Err(Misconfigured::NoCoordinate));
    }

    #[test]
    fn balance_normalizes_by_the_busiest_cluster() {
        let d = [
            Decision { namespace: "a".into(), placement: "p1".into(), clusters: names(&["c1", "c2"]) },
            Decision { namespace: "a".into(), placement: "p2".into(), clusters: names(&["c1"]) },
        ];
        // c1: 2 of max 2 → 2*int(100*(0.5-1)) = -100; c2: 1 of 2 → 0; c3: none → 100.
        let s = balance("a", "p3", &names(&["c1", "c2", "c3"]), &d);
        assert_eq!(s, BTreeMap::from([("c1".into(), -100), ("c2".into(), 0), ("c3".into(), 100)]));
    }
}

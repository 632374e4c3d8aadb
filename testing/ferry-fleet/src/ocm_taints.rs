//! OCM's cluster taints, both ends, as upstream has them (open-cluster-management-io/ocm):
//! the registration hub's taint controller (`pkg/registration/hub/taint/controller.go`)
//! keeps `cluster.open-cluster-management.io/unreachable` (Available missing or Unknown) or
//! `.../unavailable` (Available False) on a ManagedCluster, both `NoSelect`, and removes
//! them once it is Available; the placement scheduler's TaintToleration filter
//! (`pkg/placement/plugins/tainttoleration/taint_toleration.go`) keeps a cluster only when
//! the Placement tolerates each of its taints: `PreferNoSelect` never filters,
//! `NoSelectIfNew` spares a cluster the Placement already decided, a toleration matches by
//! effect (empty: any), key (empty: any, with `Exists`) and value (`Equal`, the default),
//! for `tolerationSeconds` after the taint's `timeAdded` (the scheduler looks again when
//! one a decided cluster relies on runs out, `RequeueAfter`); and the hub's mutating webhook
//! (`pkg/registration/webhook/v1/managedcluster_mutating.go`, `processTaints`), which alone
//! sets `timeAdded`. Pure: the emulator applies it.

use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

/// The taints' keys (upstream's names, shared with the workers).
pub use ferry_kube::vocab::ocm::{TAINT_UNAVAILABLE as UNAVAILABLE, TAINT_UNREACHABLE as UNREACHABLE};

/// The taints the hub's taint controller leaves on a ManagedCluster (`mc`, as JSON), or
/// `None` when they are right already. A taint it adds has a zero `timeAdded` (`null`, as
/// Go writes upstream's `UnreachableTaint`): the hub's mutating webhook ([`stamp`]) sets
/// it; the others are kept as they are.
pub fn wanted(mc: &Value) -> Option<Vec<Value>> {
    let available = mc
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "ManagedClusterConditionAvailable")
        .and_then(|c| c["status"].as_str());
    let (add, remove): (Option<&str>, &[&str]) = match available {
        None | Some("Unknown") => (Some(UNREACHABLE), &[UNAVAILABLE]),
        Some("False") => (Some(UNAVAILABLE), &[UNREACHABLE]),
        _ => (None, &[UNAVAILABLE, UNREACHABLE]),
    };
    let current: Vec<Value> = mc.pointer("/spec/taints").and_then(Value::as_array).cloned().unwrap_or_default();
    // helpers.FindTaint: the same key and effect.
    let is = |t: &Value, key: &str| t["key"] == key && t["effect"] == "NoSelect";
    let mut next: Vec<Value> = current.iter().filter(|t| !remove.iter().any(|k| is(t, k))).cloned().collect();
    if let Some(key) = add
        && !next.iter().any(|t| is(t, key))
    {
        next.push(json!({"key": key, "effect": "NoSelect", "timeAdded": null}));
    }
    (next != current).then_some(next)
}

/// A taint's `timeAdded`, `None` for Go's zero time (absent or `null`).
fn time_added(t: &Value) -> Option<k8s_openapi::jiff::Timestamp> {
    t["timeAdded"].as_str().and_then(|a| a.parse().ok())
}

/// The hub's mutating webhook over the taints of a ManagedCluster being written (`new`,
/// the object; `old`, what it was, `None` on create): the taints with `timeAdded` set to
/// `now` where the webhook sets it, or its refusal. On create every taint gets `now` (what
/// the request said is ignored); on update a new taint, or one whose value or effect
/// changed, must come without `timeAdded` and gets `now`, and an unchanged one must keep
/// its `timeAdded` exactly (taints are matched by key, `FindTaintByKey`).
pub fn stamp(new: &Value, old: Option<&Value>, now: &str) -> Result<Option<Vec<Value>>, String> {
    let Some(taints) = new.pointer("/spec/taints").and_then(Value::as_array).filter(|t| !t.is_empty()) else { return Ok(None) };
    let old_taints: Vec<Value> = old.and_then(|o| o.pointer("/spec/taints")).and_then(Value::as_array).cloned().unwrap_or_default();
    let mut out = taints.clone();
    let mut invalid = Vec::new();
    for t in &mut out {
        let key = t["key"].as_str().unwrap_or("").to_owned();
        let original = old_taints.iter().find(|o| o["key"] == t["key"]);
        let set = match (old, original) {
            (None, _) => true,
            (Some(_), Some(o)) if o["value"] == t["value"] && o["effect"] == t["effect"] => {
                if time_added(o) != time_added(t) {
                    invalid.push(key);
                }
                false
            }
            (Some(_), _) if time_added(t).is_some() => {
                invalid.push(key);
                false
            }
            (Some(_), _) => true,
        };
        if set {
            t["timeAdded"] = json!(now);
        }
    }
    if !invalid.is_empty() {
        return Err(format!("It is not allowed to set TimeAdded of Taint {:?}.", invalid.join(",")));
    }
    Ok((&out != taints).then_some(out))
}

/// Why a Placement's tolerations are misconfigured (the filter's `Misconfigured`): an
/// empty key needs `Exists`, and `Exists` takes no value.
pub fn misconfigured(tolerations: &[Value]) -> Option<String> {
    tolerations.iter().find_map(|t| {
        let key = t["key"].as_str().unwrap_or("");
        let exists = t["operator"] == "Exists";
        if key.is_empty() && !exists {
            Some(format!("toleration {t}: an empty key needs the operator Exists"))
        } else if exists && t["value"].as_str().is_some_and(|v| !v.is_empty()) {
            Some(format!("toleration {t}: the operator Exists takes no value"))
        } else {
            None
        }
    })
}

/// Whether a Placement with `tolerations` may select the cluster `mc` (`decided`: the
/// Placement chose it already) at `now`.
pub fn tolerated(mc: &Value, tolerations: &[Value], decided: bool, now: Timestamp) -> bool {
    taints(mc).iter().all(|taint| taint_tolerated(taint, tolerations, decided, now).is_some())
}

/// When the scheduler looks again at a Placement that chose the cluster `mc`: the
/// earliest time a toleration it is selected by runs out (`RequeueAfter`, over the
/// decided clusters, `isClusterTolerated`); `None` when none runs out or the cluster is
/// not tolerated now.
pub fn requeue_at(mc: &Value, tolerations: &[Value], now: Timestamp) -> Option<Timestamp> {
    let mut earliest: Option<Timestamp> = None;
    for taint in taints(mc) {
        if let Some(until) = taint_tolerated(&taint, tolerations, true, now)? {
            earliest = Some(earliest.map_or(until, |e| e.min(until)));
        }
    }
    earliest
}

fn taints(mc: &Value) -> Vec<Value> {
    mc.pointer("/spec/taints").and_then(Value::as_array).cloned().unwrap_or_default()
}

/// `isTaintTolerated`: `None` when `taint` filters the cluster out, else until when it is
/// tolerated (`Some(None)`: for ever), by the first toleration that tolerates it.
fn taint_tolerated(taint: &Value, tolerations: &[Value], decided: bool, now: Timestamp) -> Option<Option<Timestamp>> {
    match taint["effect"].as_str() {
        Some("PreferNoSelect") => Some(None),
        Some("NoSelectIfNew") if decided => Some(None),
        _ => tolerations.iter().find_map(|t| tolerates(t, taint, now)),
    }
}

/// `isTolerated`: `None` when `t` does not tolerate `taint` at `now`, else until when
/// (`Some(None)`: no `tolerationSeconds`, for ever).
fn tolerates(t: &Value, taint: &Value, now: Timestamp) -> Option<Option<Timestamp>> {
    let s = |v: &Value, k: &str| v[k].as_str().unwrap_or("").to_owned();
    if !s(t, "effect").is_empty() && s(t, "effect") != s(taint, "effect") {
        return None;
    }
    if !s(t, "key").is_empty() && s(t, "key") != s(taint, "key") {
        return None;
    }
    let matched = match t["operator"].as_str() {
        None | Some("" | "Equal") => s(t, "value") == s(taint, "value"),
        Some("Exists") => true,
        Some(_) => false,
    };
    if !matched {
        return None;
    }
    // isTolerationTimeExpired: tolerated while timeAdded + tolerationSeconds is ahead (no
    // timeAdded is Go's zero time: long expired).
    let Some(secs) = t["tolerationSeconds"].as_i64() else { return Some(None) };
    let until = time_added(taint)?.checked_add(k8s_openapi::jiff::SignedDuration::from_secs(secs)).ok()?;
    (now < until).then_some(Some(until))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mc(available: Option<&str>, taints: Value) -> Value {
        let conds = available.map(|s| json!([{"type": "ManagedClusterConditionAvailable", "status": s}])).unwrap_or(json!([]));
        json!({"spec": {"taints": taints}, "status": {"conditions": conds}})
    }

    #[test]
    fn the_controller_taints_by_availability_and_keeps_other_taints() {
        let other = json!({"key": "example.com/draining", "effect": "NoSelectIfNew"});
        let t = wanted(&mc(None, json!([other]))).unwrap();
        assert_eq!(t, [other.clone(), json!({"key": UNREACHABLE, "effect": "NoSelect", "timeAdded": null})]);
        // Unknown → False swaps the taint; True removes it; right already: nothing to write.
        let t = wanted(&mc(Some("False"), Value::Array(t))).unwrap();
        assert_eq!(t, [other.clone(), json!({"key": UNAVAILABLE, "effect": "NoSelect", "timeAdded": null})]);
        assert_eq!(wanted(&mc(Some("False"), Value::Array(t.clone()))), None);
        assert_eq!(wanted(&mc(Some("True"), Value::Array(t))).unwrap(), [other]);
        assert_eq!(wanted(&mc(Some("True"), json!([]))), None);
    }

    #[test]
    fn the_webhook_alone_sets_time_added() {
        let taints = |t: Value| json!({"spec": {"taints": t}});
        let at = |k: &str, v: &str, when: Value| json!({"key": k, "value": v, "effect": "NoSelect", "timeAdded": when});
        // Create: every taint gets now, whatever the request said.
        let made = stamp(&taints(json!([at("a", "1", json!("2020-01-01T00:00:00Z"))])), None, "NOW").unwrap().unwrap();
        assert_eq!(made, [at("a", "1", json!("NOW"))]);
        let old = taints(json!([at("a", "1", json!("2026-01-01T00:00:00Z"))]));
        // Update: the controller's new taint (null) gets now; the unchanged one stays.
        let next = taints(json!([at("a", "1", json!("2026-01-01T00:00:00Z")), at("b", "", Value::Null)]));
        assert_eq!(stamp(&next, Some(&old), "NOW").unwrap().unwrap()[1], at("b", "", json!("NOW")));
        // A new taint with a time, an unchanged one with another (or none): refused.
        let forged = taints(json!([at("a", "1", json!("2026-01-01T00:00:00Z")), at("b", "", json!("2026-01-02T00:00:00Z"))]));
        assert_eq!(stamp(&forged, Some(&old), "NOW"), Err("It is not allowed to set TimeAdded of Taint \"b\".".into()));
        assert!(stamp(&taints(json!([at("a", "1", Value::Null)])), Some(&old), "NOW").is_err());
        // A changed value restarts the clock; nothing to change: no patch.
        assert_eq!(stamp(&taints(json!([at("a", "2", Value::Null)])), Some(&old), "NOW").unwrap().unwrap(), [at("a", "2", json!("NOW"))]);
        assert_eq!(stamp(&old, Some(&old), "NOW"), Ok(None));
        assert_eq!(stamp(&taints(json!([])), Some(&old), "NOW"), Ok(None));
    }

    #[test]
    fn placements_select_only_clusters_whose_taints_they_tolerate() {
        let now: k8s_openapi::jiff::Timestamp = "2026-01-01T00:10:00Z".parse().unwrap();
        let unreachable = mc(None, json!([{"key": UNREACHABLE, "effect": "NoSelect", "timeAdded": "2026-01-01T00:00:00Z"}]));
        assert!(!tolerated(&unreachable, &[], false, now));
        assert!(!tolerated(&unreachable, &[], true, now), "NoSelect filters decided clusters too");
        assert!(tolerated(&unreachable, &[json!({"key": UNREACHABLE, "operator": "Exists"})], false, now));
        assert!(tolerated(&unreachable, &[json!({"operator": "Exists"})], false, now), "an empty key with Exists tolerates every taint");
        assert!(!tolerated(&unreachable, &[json!({"key": UNREACHABLE, "operator": "Exists", "effect": "PreferNoSelect"})], false, now));
        // Tolerated for tolerationSeconds after timeAdded: 900 s covers 10 minutes, 300 does not.
        assert!(tolerated(&unreachable, &[json!({"key": UNREACHABLE, "operator": "Exists", "tolerationSeconds": 900})], false, now));
        assert!(!tolerated(&unreachable, &[json!({"key": UNREACHABLE, "operator": "Exists", "tolerationSeconds": 300})], false, now));
        let gold = mc(Some("True"), json!([{"key": "tier", "value": "gold", "effect": "NoSelect"}]));
        assert!(tolerated(&gold, &[json!({"key": "tier", "value": "gold"})], false, now), "Equal is the default operator");
        assert!(!tolerated(&gold, &[json!({"key": "tier", "value": "silver"})], false, now));
        let new_only = mc(Some("True"), json!([{"key": "draining", "effect": "NoSelectIfNew"}, {"key": "slow", "effect": "PreferNoSelect"}]));
        assert!(!tolerated(&new_only, &[], false, now));
        assert!(tolerated(&new_only, &[], true, now));
        assert_eq!(misconfigured(&[json!({"key": "", "operator": "Equal"})]).map(|m| m.contains("needs the operator Exists")), Some(true));
        assert_eq!(misconfigured(&[json!({"key": "k", "operator": "Exists", "value": "v"})]).map(|m| m.contains("takes no value")), Some(true));
        assert_eq!(misconfigured(&[json!({"key": "k", "operator": "Exists"})]), None);
    }

    #[test]
    fn a_placement_is_looked_at_again_when_a_toleration_it_relies_on_runs_out() {
        let at = |t: &str| t.parse::<Timestamp>().unwrap();
        let now = at("2026-01-01T00:10:00Z");
        let taint = |key: &str, added: &str| json!({"key": key, "effect": "NoSelect", "timeAdded": added});
        let both = mc(None, json!([taint(UNREACHABLE, "2026-01-01T00:00:00Z"), taint("tier", "2026-01-01T00:05:00Z")]));
        let exists = |key: &str, secs: Option<i64>| match secs {
            Some(s) => json!({"key": key, "operator": "Exists", "tolerationSeconds": s}),
            None => json!({"key": key, "operator": "Exists"}),
        };
        // The earliest expiry of the tolerations the cluster is selected by.
        assert_eq!(requeue_at(&both, &[exists(UNREACHABLE, Some(900)), exists("tier", Some(600))], now), Some(at("2026-01-01T00:15:00Z")));
        assert_eq!(requeue_at(&both, &[exists(UNREACHABLE, Some(900)), exists("tier", None)], now), Some(at("2026-01-01T00:15:00Z")));
        // None that runs out, or the cluster not tolerated now: nothing to look at again.
        assert_eq!(requeue_at(&both, &[exists(UNREACHABLE, None), exists("tier", None)], now), None);
        assert_eq!(requeue_at(&both, &[exists(UNREACHABLE, Some(300)), exists("tier", Some(600))], now), None);
        // A toleration run out gives way to the next that tolerates the taint (`isTaintTolerated`).
        let later = [exists(UNREACHABLE, Some(300)), exists(UNREACHABLE, Some(1200)), exists("tier", None)];
        assert!(tolerated(&both, &later, false, now));
        assert_eq!(requeue_at(&both, &later, now), Some(at("2026-01-01T00:20:00Z")));
        // Tolerated up to the instant it runs out, not after (`Now().Before(requeueTime)`).
        let edge = [exists(UNREACHABLE, Some(600)), exists("tier", None)];
        assert!(!tolerated(&both, &edge, false, now));
        assert!(tolerated(&both, &edge, false, at("2026-01-01T00:09:59.999Z")));
    }
}

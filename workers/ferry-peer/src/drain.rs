//! What holds a Liqo virtual node's drain: the offloaded pods still on it and the
//! PodDisruptionBudgets that refuse their eviction, said when an unpeer's wait for the
//! VirtualNode runs out.
//!
//! Liqo deletes a VirtualNode only after its deletion routine cordoned the Node and
//! evicted the pods the virtual kubelet offloaded onto it (labelled `liqo.io/shadowPod`,
//! not of a DaemonSet; `pkg/liqo-controller-manager/offloading/virtualnode-controller/
//! drain.go`), waiting for each to be deleted. An eviction a PodDisruptionBudget refuses
//! is retried for ever, so an unpeer of a consumer running such a workload on the provider
//! waits until the budget allows it; only the controller's log says why. The unpeer
//! says it: in a StepProgress while it waits ([`saying_what_holds`]) and in its failure.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use ferry_kube::vocab::liqo::SHADOW_POD_LABEL;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::core::{Selector, SelectorExt};

/// How many pods a message names before it says how many more there are.
const NAMED: usize = 5;

/// How often a wait for a draining virtual node looks at what holds it.
pub(crate) const LOOK_EVERY: Duration = Duration::from_secs(20);

/// Runs `wait` (for the VirtualNode of `node` to go) and, every [`LOOK_EVERY`] while it
/// lasts, says through `progress` what holds the node's drain when that changed: a user
/// following the unpeer learns of a budget holding it long before the wait's bound.
pub(crate) async fn saying_what_holds<T>(client: &kube::Client, node: &str, wait: impl Future<Output = T>, progress: &(dyn Fn(String) + Send + Sync)) -> T {
    let look = async {
        let mut said = None;
        let mut every = tokio::time::interval_at(tokio::time::Instant::now() + LOOK_EVERY, LOOK_EVERY);
        loop {
            every.tick().await;
            match held_by(client, node).await {
                Ok(Some(why)) if said.as_ref() != Some(&why) => {
                    progress(why.clone());
                    said = Some(why);
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %ferry_kube::said::said(&e), node, "reading what holds a virtual node's drain"),
            }
        }
    };
    tokio::select! {
        done = wait => done,
        never = look => never,
    }
}

/// Why virtual node `node` on the consumer (`client`) is not gone, when pods are left on
/// it: those pods, and the budgets in their namespaces that allow no disruption of any of
/// them. None when no offloaded pod is left (the wait's own reason says enough).
pub(crate) async fn held_by(client: &kube::Client, node: &str) -> Result<Option<String>, kube::Error> {
    let lp = ListParams::default().fields(&format!("spec.nodeName={node}")).labels(&format!("{SHADOW_POD_LABEL}=true"));
    let pods: Vec<Pod> = Api::<Pod>::all(client.clone())
        .list(&lp)
        .await?
        .items
        .into_iter()
        .filter(|p| !p.metadata.owner_references.iter().flatten().any(|o| o.kind == "DaemonSet"))
        .collect();
    if pods.is_empty() {
        return Ok(None);
    }
    let namespaces: BTreeSet<String> = pods.iter().filter_map(|p| p.metadata.namespace.clone()).collect();
    let mut holding = Vec::new();
    for ns in &namespaces {
        for pdb in budgets(client, ns).await? {
            if let Some(why) = refuses(&pdb, pods.iter().filter(|p| p.metadata.namespace.as_deref() == Some(ns))) {
                holding.push(why);
            }
        }
    }
    Ok(Some(message(node, &pods, &holding)))
}

/// The PodDisruptionBudgets of `ns`: `policy/v1`, or `policy/v1beta1` where only that is
/// served (Kubernetes before 1.21), read as v1 (the fields read here are the same; a
/// v1beta1 budget with an empty selector selects no pod, so it is left out).
async fn budgets(client: &kube::Client, ns: &str) -> Result<Vec<PodDisruptionBudget>, kube::Error> {
    match Api::<PodDisruptionBudget>::namespaced(client.clone(), ns).list(&ListParams::default()).await {
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        other => return other.map(|l| l.items),
    }
    let v1beta1 = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("policy", "v1beta1", "PodDisruptionBudget"), "poddisruptionbudgets");
    let listed = Api::<DynamicObject>::namespaced_with(client.clone(), ns, &v1beta1).list(&ListParams::default()).await?.items;
    Ok(listed
        .into_iter()
        .filter_map(|o| {
            let mut v = serde_json::to_value(o).ok()?;
            v["apiVersion"] = "policy/v1".into();
            serde_json::from_value::<PodDisruptionBudget>(v).ok()
        })
        .filter(|pdb| {
            let selector = pdb.spec.as_ref().and_then(|s| s.selector.as_ref());
            selector.is_some_and(|s| s.match_labels.as_ref().is_some_and(|m| !m.is_empty()) || s.match_expressions.as_ref().is_some_and(|e| !e.is_empty()))
        })
        .collect())
}

/// Whether `pdb` refuses the eviction of one of `pods` now (it selects one and allows no
/// disruption), and how it says so.
fn refuses<'a>(pdb: &PodDisruptionBudget, pods: impl Iterator<Item = &'a Pod>) -> Option<String> {
    let selector = Selector::try_from(pdb.spec.as_ref()?.selector.clone()?).ok()?;
    let empty = BTreeMap::new();
    let selected = pods.filter(|p| selector.matches(p.metadata.labels.as_ref().unwrap_or(&empty))).count();
    let status = pdb.status.clone().unwrap_or_default();
    if selected == 0 || status.disruptions_allowed.unwrap_or(0) > 0 {
        return None;
    }
    let name = format!("{}/{}", pdb.metadata.namespace.as_deref().unwrap_or_default(), pdb.metadata.name.as_deref().unwrap_or_default());
    // The API server refuses evictions under a budget its disruption controller has not
    // computed yet (`pkg/registry/core/pod/storage/eviction.go`) as it does under one that
    // allows none.
    let computed = pdb.status.is_some() && status.observed_generation.unwrap_or(0) >= pdb.metadata.generation.unwrap_or(0);
    Some(if computed {
        format!("PodDisruptionBudget {name} allows no disruption ({} of {} wanted pods healthy)", status.current_healthy.unwrap_or(0), status.desired_healthy.unwrap_or(0))
    } else {
        format!("PodDisruptionBudget {name} allows no disruption (the disruption controller has not computed it)")
    })
}

fn message(node: &str, pods: &[Pod], holding: &[String]) -> String {
    let mut names: Vec<String> = pods.iter().map(|p| format!("{}/{}", p.metadata.namespace.as_deref().unwrap_or_default(), p.metadata.name.as_deref().unwrap_or_default())).collect();
    names.sort();
    let more = names.len().saturating_sub(NAMED);
    names.truncate(NAMED);
    let listed = if more > 0 { format!("{} and {more} more", names.join(", ")) } else { names.join(", ") };
    let left = format!("Liqo is draining virtual node {node}: {} offloaded pod(s) left on it ({listed})", pods.len());
    if holding.is_empty() {
        format!("{left}, evicted or waiting for their eviction; their copies on the provider must go first")
    } else {
        format!("{left}; {}: relax or delete it, or scale its workload down, and Liqo goes on by itself", holding.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(ns: &str, name: &str, app: &str) -> Pod {
        serde_json::from_value(json!({"metadata": {"namespace": ns, "name": name, "labels": {"app": app, SHADOW_POD_LABEL: "true"}}})).unwrap()
    }

    fn pdb(allowed: i32) -> PodDisruptionBudget {
        serde_json::from_value(json!({"metadata": {"namespace": "shop", "name": "web", "generation": 1}, "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}},
            "status": {"disruptionsAllowed": allowed, "currentHealthy": 2, "desiredHealthy": 2, "expectedPods": 2, "observedGeneration": 1}}))
        .unwrap()
    }

    /// A budget holds the drain only when it selects a pod left there and allows no
    /// disruption now; the message names the node, the pods and the budget.
    #[test]
    fn a_budget_that_allows_no_disruption_of_a_pod_left_holds_the_drain() {
        let pods = [pod("shop", "web-1", "web"), pod("shop", "db-1", "db")];
        let why = refuses(&pdb(0), pods.iter()).expect("it selects web-1 and allows nothing");
        assert_eq!(why, "PodDisruptionBudget shop/web allows no disruption (2 of 2 wanted pods healthy)");
        assert_eq!(refuses(&pdb(1), pods.iter()), None, "it allows one eviction");
        assert_eq!(refuses(&pdb(0), [pod("shop", "db-1", "db")].iter()), None, "it selects no pod left");
        let mut fresh = pdb(0);
        fresh.status = None;
        assert_eq!(refuses(&fresh, pods.iter()).unwrap(), "PodDisruptionBudget shop/web allows no disruption (the disruption controller has not computed it)");
        let text = message("member-2", &pods, &[why]);
        assert!(text.starts_with("Liqo is draining virtual node member-2: 2 offloaded pod(s) left on it (shop/db-1, shop/web-1); PodDisruptionBudget shop/web"), "{text}");
        let many: Vec<Pod> = (0..8).map(|i| pod("shop", &format!("web-{i}"), "web")).collect();
        assert!(message("n", &many, &[]).contains("shop/web-4 and 3 more), evicted or waiting"), "{}", message("n", &many, &[]));
    }
}

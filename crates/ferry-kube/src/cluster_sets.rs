//! A ManagedClusterSet's member clusters, resolved as OCM resolves them: the deploy
//! worker's candidates, the score worker's set, a plan's fanned-out step and the test bed's
//! emulated placement all ask here, so that they agree with each other and with upstream.
//!
//! # Upstream
//! - A set selects its ManagedClusters by `spec.clusterSelector`
//!   (`open-cluster-management-io/api` `cluster/v1beta2/types_managedclusterset.go`):
//!   `selectorType` `ExclusiveClusterSetLabel` (the default) selects the clusters labelled
//!   `cluster.open-cluster-management.io/clusterset=<set>`; `LabelSelector` selects by
//!   `labelSelector`, an absent one selecting nothing
//!   (`open-cluster-management-io/sdk-go` `pkg/apis/cluster/v1beta2/managedclusterset.go`,
//!   `BuildClusterSelector`, with `metav1.LabelSelectorAsSelector(nil)` = `labels.Nothing()`;
//!   `GetClustersFromClusterSet` lists the ManagedClusters by it).
//! - The hub keeps set `global` as `LabelSelector {}`: every cluster
//!   (`open-cluster-management-io/ocm`
//!   `pkg/registration/hub/managedclusterset/global_managedclusterset_controller.go`).
//! - A Placement's clusters are the members of the sets bound to its namespace (and named
//!   in its `clusterSets`, if any) that exist; a set that does not exist adds nothing, and
//!   clusters being deleted are left out (`ocm`
//!   `pkg/placement/controllers/scheduling/helpers.go`, `GetValidManagedClusterSetBindings`,
//!   `GetAvailableClusters`): [`available_clusters`].

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, ListParams};
use kube::core::{ParseExpressionError, Selector, SelectorExt};
use serde_json::Value;

use crate::kinds::{ManagedCluster, ManagedClusterSet};
use crate::vocab::ocm::CLUSTERSET_LABEL;

/// `selectorType` `ExclusiveClusterSetLabel` (the default).
pub const EXCLUSIVE_CLUSTERSET_LABEL: &str = "ExclusiveClusterSetLabel";
/// `selectorType` `LabelSelector`.
pub const LABEL_SELECTOR: &str = "LabelSelector";

/// A set that cannot be resolved, or a hub that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ClusterSetError {
    /// The set's `selectorType` is none OCM defines (upstream's `BuildClusterSelector`
    /// fails the same way).
    #[error("ManagedClusterSet {set:?} has selectorType {selector_type:?}, which OCM does not define")]
    UnknownSelectorType {
        /// The set.
        set: String,
        /// Its selector type.
        selector_type: String,
    },
    /// The set's `labelSelector` is not a label selector.
    #[error("ManagedClusterSet {set:?} has a labelSelector that does not parse: {source}")]
    LabelSelectorShape {
        /// The set.
        set: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// The set's `labelSelector` has an expression Kubernetes refuses.
    #[error("ManagedClusterSet {set:?}'s labelSelector: {source}")]
    LabelSelectorExpression {
        /// The set.
        set: String,
        /// Why.
        #[source]
        source: ParseExpressionError,
    },
    /// Reading the hub failed.
    #[error("reading ManagedClusterSets or ManagedClusters on the hub: {}", crate::said::said(source))]
    Hub {
        /// The API's error.
        #[source]
        source: kube::Error,
    },
}

/// Which ManagedClusters a set selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Members {
    /// Those whose labels match (an empty selector: every cluster).
    Matching(Selector),
    /// None: `LabelSelector` without a `labelSelector`.
    Nothing,
}

/// A ManagedClusterSet and how it selects its clusters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSet {
    /// The set's name.
    pub name: String,
    /// Its members.
    pub members: Members,
    /// Its selector type, as written (`ExclusiveClusterSetLabel` when unset).
    pub selector_type: String,
}

impl ClusterSet {
    /// The set `name` with `spec` (as upstream's `BuildClusterSelector` reads it).
    pub fn from_spec(name: &str, spec: &Value) -> Result<Self, ClusterSetError> {
        let cs = spec.get("clusterSelector");
        let selector_type = cs.and_then(|c| c.get("selectorType")).and_then(Value::as_str).filter(|t| !t.is_empty()).unwrap_or(EXCLUSIVE_CLUSTERSET_LABEL);
        let members = match selector_type {
            EXCLUSIVE_CLUSTERSET_LABEL => Members::Matching(Selector::from_iter([(CLUSTERSET_LABEL.to_owned(), name.to_owned())])),
            LABEL_SELECTOR => match cs.and_then(|c| c.get("labelSelector")).filter(|l| !l.is_null()) {
                None => Members::Nothing,
                Some(ls) => {
                    let ls: LabelSelector = serde_json::from_value(ls.clone()).map_err(|source| ClusterSetError::LabelSelectorShape { set: name.to_owned(), source })?;
                    Members::Matching(Selector::try_from(ls).map_err(|source| ClusterSetError::LabelSelectorExpression { set: name.to_owned(), source })?)
                }
            },
            other => return Err(ClusterSetError::UnknownSelectorType { set: name.to_owned(), selector_type: other.to_owned() }),
        };
        Ok(Self { name: name.to_owned(), members, selector_type: selector_type.to_owned() })
    }

    /// The set as the hub holds it.
    pub fn of(set: &ManagedClusterSet) -> Result<Self, ClusterSetError> {
        Self::from_spec(set.metadata.name.as_deref().unwrap_or_default(), &set.spec)
    }

    /// Whether a ManagedCluster with `labels` is a member.
    pub fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        match &self.members {
            Members::Matching(sel) => sel.matches(labels),
            Members::Nothing => false,
        }
    }

    /// How the set selects, for messages: `label k=v`, `label selector …`.
    pub fn describe(&self) -> String {
        match (&self.members, self.selector_type.as_str()) {
            (Members::Nothing, _) => "a LabelSelector set without labelSelector: no cluster".to_owned(),
            (Members::Matching(sel), EXCLUSIVE_CLUSTERSET_LABEL) => format!("label {sel}"),
            (Members::Matching(sel), _) if sel.selects_all() => "label selector {}: every cluster".to_owned(),
            (Members::Matching(sel), _) => format!("label selector {sel}"),
        }
    }

    /// Its ManagedClusters on the hub, deleting ones included (upstream's
    /// `GetClustersFromClusterSet`).
    pub async fn clusters(&self, hub: &kube::Client) -> Result<Vec<ManagedCluster>, ClusterSetError> {
        let Members::Matching(sel) = &self.members else { return Ok(Vec::new()) };
        let api: Api<ManagedCluster> = Api::all(hub.clone());
        Ok(api.list(&ListParams::default().labels_from(sel)).await.map_err(|source| ClusterSetError::Hub { source })?.items)
    }
}

/// ManagedClusterSet `name` on the hub (`None`: there is no such set).
pub async fn get(hub: &kube::Client, name: &str) -> Result<Option<ClusterSet>, ClusterSetError> {
    let api: Api<ManagedClusterSet> = Api::all(hub.clone());
    match api.get_opt(name).await.map_err(|source| ClusterSetError::Hub { source })? {
        Some(s) => Ok(Some(ClusterSet::of(&s)?)),
        None => Ok(None),
    }
}

/// The ManagedClusters a Placement may choose from when `sets` are its eligible sets (bound
/// to its namespace, and named by it if it names any), as upstream's `GetAvailableClusters`
/// finds them: sets that do not exist add nothing, clusters being deleted are left out.
/// Sorted by name, each once.
pub async fn available_clusters(hub: &kube::Client, sets: impl IntoIterator<Item = &str>) -> Result<Vec<ManagedCluster>, ClusterSetError> {
    let mut found: BTreeMap<String, ManagedCluster> = BTreeMap::new();
    for name in sets {
        let Some(set) = get(hub, name).await? else { continue };
        for c in set.clusters(hub).await? {
            if c.metadata.deletion_timestamp.is_none()
                && let Some(n) = c.metadata.name.clone()
            {
                found.insert(n, c);
            }
        }
    }
    Ok(found.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn sets_select_as_upstreams_build_cluster_selector() {
        let member = labels(&[(CLUSTERSET_LABEL, "blue"), ("tier", "core")]);
        let other = labels(&[(CLUSTERSET_LABEL, "red")]);
        // The default type (as the API server defaults it, and unset).
        for spec in [json!({}), json!({"clusterSelector": {"selectorType": "ExclusiveClusterSetLabel"}}), json!({"clusterSelector": {"selectorType": ""}})] {
            let s = ClusterSet::from_spec("blue", &spec).unwrap();
            assert!(s.selects(&member) && !s.selects(&other), "{spec}");
        }
        // `global`, as the hub makes it: every cluster, labelled or not.
        let global = ClusterSet::from_spec("global", &json!({"clusterSelector": {"selectorType": "LabelSelector", "labelSelector": {}}})).unwrap();
        assert!(global.selects(&member) && global.selects(&other) && global.selects(&BTreeMap::new()));
        assert_eq!(global.describe(), "label selector {}: every cluster");
        // A label selector, with expressions.
        let core = ClusterSet::from_spec("core", &json!({"clusterSelector": {"selectorType": "LabelSelector",
            "labelSelector": {"matchLabels": {"tier": "core"}, "matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}}})).unwrap();
        assert!(core.selects(&member) && !core.selects(&other));
        assert!(!core.selects(&labels(&[("tier", "core"), ("zone", "a")])));
        // No labelSelector at all: LabelSelectorAsSelector(nil) selects nothing.
        let none = ClusterSet::from_spec("none", &json!({"clusterSelector": {"selectorType": "LabelSelector"}})).unwrap();
        assert_eq!(none.members, Members::Nothing);
        assert!(!none.selects(&member) && !none.selects(&BTreeMap::new()));
        // Types OCM does not define, and selectors that do not parse.
        assert!(matches!(ClusterSet::from_spec("x", &json!({"clusterSelector": {"selectorType": "Regex"}})), Err(ClusterSetError::UnknownSelectorType { .. })));
        let bad_op = json!({"clusterSelector": {"selectorType": "LabelSelector", "labelSelector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}}});
        assert!(matches!(ClusterSet::from_spec("x", &bad_op), Err(ClusterSetError::LabelSelectorExpression { .. })));
        let bad_shape = json!({"clusterSelector": {"selectorType": "LabelSelector", "labelSelector": {"matchLabels": ["a"]}}});
        assert!(matches!(ClusterSet::from_spec("x", &bad_shape), Err(ClusterSetError::LabelSelectorShape { .. })));
    }
}

//! `apply`: the app onto its clusters (a ManifestWork per cluster, or with `delivery:
//! direct` the objects through each cluster's kubeconfig), removed from the clusters it
//! leaves, and the app record on the hub; a delete also removes the Placements. Only
//! Ferry's objects of the app are written or removed: anything else of the same name fails
//! the step (`OBJECT_NOT_FERRYS`) and is left alone. Its undo converges back to the
//! previous app (re-reading Secrets from the hub) and waits until the clusters run it:
//! what this task added is gone (a namespace only when this task created it), the
//! restored ManifestWorks applied.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ferry_task::{Output, Step, StepContext, StepError, StepPolicy};
use futures::FutureExt;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::check::CHECK;
use super::desired;
pub use super::guard::NamespaceUse;
use super::guard::Namespaces;
use crate::handler::Inner;
use crate::spec::{Delivery, DeployApp, DeployOperation};

/// The `apply` step's output.
pub const APPLY: Output<Applied> = Output::new("apply");

/// Output of `apply`: the clusters the app was applied to and removed from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    /// Clusters that hold the app now.
    pub applied: Vec<String>,
    /// Clusters it was removed from.
    pub removed: Vec<String>,
    /// The namespaces a direct delivery put the app in, created by this task or found
    /// (none with ManifestWorks). None in the output of an older Ferry: its undo keeps
    /// every namespace.
    #[serde(default)]
    pub namespaces: Option<Vec<NamespaceUse>>,
}

/// The namespaces the undo of the task may delete, by its `apply` output: None when the
/// step did not finish (the namespaces' annotations decide alone).
fn created(output: Option<&Value>) -> Option<BTreeSet<(String, String)>> {
    let applied: Applied = serde_json::from_value(output?.clone()).unwrap_or_default();
    Some(applied.namespaces.unwrap_or_default().into_iter().filter(|n| n.created).map(|n| (n.cluster, n.namespace)).collect())
}

/// The `apply` step.
pub struct Apply {
    inner: Arc<Inner>,
}

impl Apply {
    pub(crate) fn new(inner: Arc<Inner>) -> Self {
        Self { inner }
    }
}

impl Step<DeployApp> for Apply {
    fn name(&self) -> &str {
        APPLY.step()
    }

    fn policy(&self) -> StepPolicy {
        StepPolicy { timeout: Duration::from_secs(120), ..StepPolicy::default() }
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, DeployApp>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let previous = CHECK.required(cx)?.previous;
            let to = desired(cx)?;
            if cx.spec.operation == DeployOperation::Delete {
                // The placements go with the app; their undo is this step's.
                self.inner.converge_placements(cx.spec, None, &cx.task_id.to_string()).await?;
            }
            let task = cx.task_id.to_string();
            let namespaces = self.inner.converge(previous.as_ref(), to.as_ref(), cx.spec, &task, &Namespaces::Ferrys).await?;
            let applied: Vec<String> = to.as_ref().map(|t| t.clusters().into_iter().collect()).unwrap_or_default();
            let removed: Vec<String> = previous.as_ref().map(|p| p.clusters().into_iter().filter(|c| !applied.contains(c)).collect()).unwrap_or_default();
            let how = if cx.spec.delivery == Delivery::ManifestWork { "ManifestWork" } else { "direct apply" };
            cx.progress(100, format!("{how}: applied to {}, removing from {}", ferry_task::report::listed(&applied), ferry_task::report::listed(&removed)));
            APPLY.value(&Applied { applied, removed, namespaces: Some(namespaces) })
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, DeployApp>, output: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            let previous = CHECK.required(cx)?.previous;
            let to = desired(cx)?;
            if cx.spec.operation == DeployOperation::Delete {
                self.inner.converge_placements(cx.spec, previous.as_ref().map(|p| &p.spec), &cx.task_id.to_string()).await?;
            }
            let task = cx.task_id.to_string();
            let rule = Namespaces::ThisTask { task: &task, created: created(output) };
            self.inner.converge(to.as_ref(), previous.as_ref(), cx.spec, &task, &rule).await?;
            self.inner.wait_removed(to.as_ref(), previous.as_ref()).await?;
            self.inner.wait_restored(previous.as_ref()).await
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_undo_deletes_only_namespaces_the_output_says_this_task_created() {
        let out = json!({"applied": ["m1"], "removed": [], "namespaces": [
            {"cluster": "m1", "namespace": "made", "created": true}, {"cluster": "m1", "namespace": "found", "created": false}]});
        assert_eq!(created(Some(&out)), Some(BTreeSet::from([("m1".to_owned(), "made".to_owned())])));
        // An older Ferry's output: every namespace was found.
        assert_eq!(created(Some(&json!({"applied": ["m1"], "removed": []}))), Some(BTreeSet::new()));
        // No output (the step did not finish): the annotations decide.
        assert_eq!(created(None), None);
    }
}

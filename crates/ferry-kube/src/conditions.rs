//! Named wait conditions every worker judges the same way: a workload's rollout as
//! `kubectl rollout status` judges it, and "the object the watch shows is the one just
//! written" (by uid), so a lagging shared watch cannot answer with a removed object.
//!
//! Rollout, as kubectl's `DeploymentStatusViewer` (k8s.io/kubectl `pkg/polymorphichelpers/
//! rollout_status.go`): the controller has observed the current generation, every wanted
//! replica is updated, no old replica is left, and every updated replica is available.

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use kube::Resource;

/// Where a workload's rollout stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rollout {
    /// Replicas ready (Deployment, StatefulSet) or pods ready (DaemonSet).
    pub ready: i64,
    /// Replicas (or scheduled pods) wanted.
    pub wanted: i64,
    /// The rollout is complete.
    pub done: bool,
}

impl Rollout {
    /// "`ready`/`wanted` ready", for a wait's pending reason.
    pub fn progress(&self) -> String {
        format!("{}/{} ready", self.ready, self.wanted)
    }
}

/// A Deployment's status counters, read from the object or from status feedback.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeploymentCounts {
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// `status.observedGeneration`.
    pub observed_generation: Option<i64>,
    /// `status.replicas` (old and new pods).
    pub replicas: Option<i64>,
    /// `status.updatedReplicas`.
    pub updated: Option<i64>,
    /// `status.readyReplicas`.
    pub ready: Option<i64>,
    /// `status.availableReplicas`.
    pub available: Option<i64>,
}

impl DeploymentCounts {
    /// The counters of `d`.
    pub fn of(d: &Deployment) -> Self {
        let st = d.status.clone().unwrap_or_default();
        Self {
            generation: d.metadata.generation,
            observed_generation: st.observed_generation,
            replicas: st.replicas.map(i64::from),
            updated: st.updated_replicas.map(i64::from),
            ready: st.ready_replicas.map(i64::from),
            available: st.available_replicas.map(i64::from),
        }
    }

    /// The rollout toward `wanted` replicas. Unknown counters count as not there yet.
    pub fn rollout(&self, wanted: i64) -> Rollout {
        let ready = self.ready.unwrap_or(0);
        let observed = matches!((self.observed_generation, self.generation), (Some(o), Some(g)) if o >= g);
        let updated = self.updated.unwrap_or(0);
        let done = observed
            && updated >= wanted
            && self.replicas.unwrap_or(0) <= updated
            && self.available.unwrap_or(0) >= updated
            && ready >= wanted;
        Rollout { ready, wanted, done }
    }
}

/// A Deployment's rollout toward its own `spec.replicas` (1 when unset).
pub fn deployment(d: &Deployment) -> Rollout {
    let wanted = d.spec.replicas.unwrap_or(1);
    DeploymentCounts::of(d).rollout(i64::from(wanted))
}

/// A DaemonSet's rollout: the current generation observed, every scheduled pod updated
/// and available.
pub fn daemon_set(d: &DaemonSet) -> Rollout {
    let Some(st) = d.status.as_ref() else { return Rollout { ready: 0, wanted: 0, done: false } };
    let wanted = i64::from(st.desired_number_scheduled);
    let observed = matches!((st.observed_generation, d.metadata.generation), (Some(o), Some(g)) if o >= g);
    let updated = i64::from(st.updated_number_scheduled.unwrap_or(0));
    let available = i64::from(st.number_available.unwrap_or(0));
    let ready = i64::from(st.number_ready);
    Rollout { ready, wanted, done: observed && updated >= wanted && available >= wanted && ready >= wanted }
}

/// A StatefulSet's rollout: the current generation observed, every wanted replica ready
/// and updated.
pub fn stateful_set(s: &StatefulSet) -> Rollout {
    let wanted = i64::from(s.spec.replicas.unwrap_or(1));
    let Some(st) = s.status.as_ref() else { return Rollout { ready: 0, wanted, done: false } };
    let observed = matches!((st.observed_generation, s.metadata.generation), (Some(o), Some(g)) if o >= g);
    let ready = i64::from(st.ready_replicas.unwrap_or(0));
    let updated = i64::from(st.updated_replicas.unwrap_or(0));
    Rollout { ready, wanted, done: observed && ready >= wanted && updated >= wanted }
}

/// True when `seen` (what a watch shows) is the object whose uid is `uid`: a watch that
/// still shows a removed object of the same name answers false.
pub fn is_current<K: Resource>(seen: Option<&K>, uid: Option<&str>) -> bool {
    matches!((seen.and_then(|o| o.meta().uid.as_deref()), uid), (Some(a), Some(b)) if a == b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(g: i64, o: i64, replicas: i64, updated: i64, ready: i64, available: i64) -> DeploymentCounts {
        DeploymentCounts {
            generation: Some(g),
            observed_generation: Some(o),
            replicas: Some(replicas),
            updated: Some(updated),
            ready: Some(ready),
            available: Some(available),
        }
    }

    #[test]
    fn a_rollout_is_done_only_as_kubectl_says() {
        assert!(counts(3, 3, 2, 2, 2, 2).rollout(2).done);
        // Generation not observed yet: the counters describe the previous spec.
        assert!(!counts(4, 3, 2, 2, 2, 2).rollout(2).done);
        // An old replica still terminating after a scale-down or an update.
        assert!(!counts(3, 3, 3, 2, 2, 2).rollout(2).done);
        // Updated but not yet available.
        assert!(!counts(3, 3, 2, 2, 2, 1).rollout(2).done);
        // Not every wanted replica updated.
        assert!(!counts(3, 3, 2, 1, 1, 1).rollout(2).done);
        // Nothing known: not done.
        assert!(!DeploymentCounts::default().rollout(1).done);
        assert_eq!(counts(3, 3, 2, 2, 1, 1).rollout(2).progress(), "1/2 ready");
    }
}

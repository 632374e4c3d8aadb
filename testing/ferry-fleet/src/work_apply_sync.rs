//! When the emulated work agent applies a ManifestWork's manifests, as upstream's apply
//! controller does (ocm `pkg/work/spoke/controllers/manifestcontroller/manifestwork_controller.go`):
//! when the work comes with its finalizer, when its spec or labels change (`onUpdateFunc`),
//! again after a pass that failed, on the queue's rate limiter (client-go's
//! `DefaultTypedControllerRateLimiter`: 5 ms doubling to 1,000 s; a resource still being
//! deleted requeues the same way, `appliedmanifestwork_reconciler.go`), and otherwise
//! `wait.Jitter(ResyncInterval, 0.5)` after its last pass (4 to 6 minutes). Between passes
//! nothing is re-applied: a manifest deleted or changed on the cluster comes back at the
//! next resync, minutes later, as on a real cluster. The status controller reads the
//! resources on its own clock ([`crate::work_status_sync`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::wake::Wake;

/// Upstream's `ResyncInterval` (a package variable its integration tests shorten).
pub const RESYNC_INTERVAL: Duration = Duration::from_secs(4 * 60);
/// `wait.Jitter(ResyncInterval, 0.5)`.
const RESYNC_JITTER: f64 = 0.5;
/// The rate limiter's first delay and its ceiling.
const RETRY_BASE: Duration = Duration::from_millis(5);
const RETRY_MAX: Duration = Duration::from_secs(1000);

/// What upstream's update handler compares: a new work under the name (its UID), its spec
/// (the generation counts its changes) and its labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkSpec {
    pub uid: String,
    pub generation: i64,
    pub labels: BTreeMap<String, String>,
}

/// Why a manifest is not applied: the message its Applied condition reports, and whether
/// upstream's queue retries the work for it (every apply error but a server-side apply's
/// conflict with another field manager, `ServerSideApplyConflictError`, which only a
/// change of the work or its resync tries again: `manifestwork_reconciler.go`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub message: String,
    pub retried: bool,
}

impl Refusal {
    /// An error the queue retries.
    pub fn retried(message: impl Into<String>) -> Self {
        Self { message: message.into(), retried: true }
    }
}

/// A manifest's outcome at an apply pass.
pub type Outcome = Result<(), Refusal>;

/// The last apply pass of one work.
#[derive(Debug)]
struct Pass {
    spec: WorkSpec,
    /// When the next pass is due: a retry's time, or None for the resync (the pass's time
    /// plus the interval, jittered by `factor`, read when asked so a changed interval
    /// counts at once).
    retry_at: Option<Instant>,
    at: Instant,
    factor: f64,
    /// Failed passes in a row (the rate limiter's exponent).
    failures: u32,
    /// Each manifest's outcome (its apply error, if any), by its place in the spec.
    outcomes: Vec<Outcome>,
}

/// One work agent's apply clock.
pub struct ApplySync {
    wake: Weak<Wake>,
    passes: Mutex<HashMap<String, Pass>>,
}

impl ApplySync {
    /// The clock of the agent whose passes `wake` starts.
    pub fn new(wake: &Arc<Wake>) -> Self {
        Self { wake: Arc::downgrade(wake), passes: Mutex::default() }
    }

    /// Whether the work `name` (as `spec`) is due an apply pass: it is new, its spec or
    /// labels changed, a failed pass's retry time came, or its resync `interval` ran out.
    pub fn due(&self, name: &str, spec: &WorkSpec, interval: Duration) -> bool {
        let passes = self.passes.lock().expect("apply lock");
        let Some(p) = passes.get(name) else { return true };
        let at = p.retry_at.unwrap_or_else(|| p.at + interval.mul_f64(1.0 + p.factor));
        p.spec != *spec || Instant::now() >= at
    }

    /// Records a pass over the work `name` (as `spec`) with each manifest's outcome. Where
    /// one failed in a way the queue retries, or a resource the work dropped is still
    /// being deleted (`pending`), the next pass comes on the rate limiter. Otherwise the
    /// failures are forgotten and the next pass is the resync, `interval` later, jittered.
    pub fn passed(&self, name: &str, spec: &WorkSpec, outcomes: Vec<Outcome>, pending: bool, interval: Duration) {
        let failed = pending || outcomes.iter().any(|o| o.as_ref().is_err_and(|r| r.retried));
        let now = Instant::now();
        let mut passes = self.passes.lock().expect("apply lock");
        let failures = passes.get(name).filter(|p| p.spec == *spec).map_or(0, |p| p.failures);
        let factor = crate::wake::jitter_factor(RESYNC_JITTER);
        let (failures, next) = if failed {
            let delay = RETRY_BASE.saturating_mul(1 << failures.min(20)).min(RETRY_MAX);
            (failures + 1, delay)
        } else {
            (0, interval.mul_f64(1.0 + factor))
        };
        let retry_at = failed.then_some(now + next);
        passes.insert(name.to_owned(), Pass { spec: spec.clone(), retry_at, at: now, factor, failures, outcomes });
        drop(passes);
        if let Some(wake) = self.wake.upgrade() {
            wake.after(next);
        }
    }

    /// A pass over the work `name` stopped short (the API server failed it, or it waits on
    /// something): it is due again on the next pass.
    pub fn again(&self, name: &str) {
        if let Some(p) = self.passes.lock().expect("apply lock").get_mut(name) {
            p.retry_at = Some(Instant::now());
        }
    }

    /// The outcome of each manifest of the work `name` at its last pass, if it was at
    /// `spec` (what the status controller reports beside the resources' status).
    pub fn outcomes(&self, name: &str, spec: &WorkSpec) -> Option<Vec<Outcome>> {
        self.passes.lock().expect("apply lock").get(name).filter(|p| p.spec == *spec).map(|p| p.outcomes.clone())
    }

    /// Whether the work `name` had a pass at `spec` (since this agent started).
    pub fn has_pass(&self, name: &str, spec: &WorkSpec) -> bool {
        self.passes.lock().expect("apply lock").get(name).is_some_and(|p| p.spec == *spec)
    }

    /// Forgets the works not in `names` (gone, or being deleted).
    pub fn retain(&self, names: &BTreeSet<String>) {
        self.passes.lock().expect("apply lock").retain(|name, _| names.contains(name));
    }
}

/// ocm `manifestwork_reconciler.go`, `resourceApplyOrder` and `kindOrder` (OCM 1.3): the
/// rank a manifest of `kind` is applied in (lower first; the sort is stable, so equal
/// ranks keep the spec's order); kinds not listed come after all listed ones, and a
/// manifest that does not parse last.
pub fn kind_order(kind: Option<&str>) -> u32 {
    let Some(kind) = kind else { return 1001 };
    match kind {
        "PriorityClass" | "Namespace" | "CustomResourceDefinition" | "StorageClass" | "PersistentVolume" | "PodSecurityPolicy" => 0,
        "ClusterRole" | "ClusterRoleBinding" | "Role" | "RoleBinding" => 1,
        "NetworkPolicy" | "ResourceQuota" | "LimitRange" | "PodDisruptionBudget" | "ServiceAccount" => 2,
        "Secret" | "ConfigMap" | "PersistentVolumeClaim" => 3,
        "Service" => 4,
        "DaemonSet" | "Pod" | "ReplicationController" | "ReplicaSet" | "Deployment" | "HorizontalPodAutoscaler" | "StatefulSet" | "Job" | "CronJob" => 5,
        "APIService" | "MutatingWebhookConfiguration" | "ValidatingWebhookConfiguration" | "ValidatingAdmissionPolicy" | "ValidatingAdmissionPolicyBinding" => 6,
        _ => 1000,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(generation: i64) -> WorkSpec {
        WorkSpec { uid: "u".into(), generation, labels: BTreeMap::new() }
    }

    #[tokio::test]
    async fn a_work_is_applied_when_new_changed_failed_or_its_resync_ran_out() {
        let wake = Arc::new(Wake::default());
        let sync = ApplySync::new(&wake);
        let hour = Duration::from_secs(3600);
        assert!(sync.due("w", &spec(1), hour), "a new work");
        sync.passed("w", &spec(1), vec![Ok(())], false, hour);
        assert!(!sync.due("w", &spec(1), hour), "nothing changed, the resync has not run out");
        let conflict = Refusal { message: "conflict".into(), retried: false };
        sync.passed("w", &spec(1), vec![Err(conflict)], false, hour);
        assert!(!sync.due("w", &spec(1), hour), "a server-side apply's conflict waits for the resync");
        assert!(sync.due("w", &spec(2), hour), "its spec changed");
        let mut labelled = spec(1);
        labelled.labels.insert("a".into(), "b".into());
        assert!(sync.due("w", &labelled, hour), "its labels changed");
        assert!(sync.due("w", &WorkSpec { uid: "v".into(), ..spec(1) }, hour), "a new work under the name");
        assert!(sync.due("w", &spec(1), Duration::ZERO), "a shorter resync counts at once");
        sync.again("w");
        assert!(sync.due("w", &spec(1), hour), "a pass stopped short");
        sync.retain(&BTreeSet::new());
        assert!(sync.due("w", &spec(1), hour), "a work forgotten is new again");
    }

    #[tokio::test]
    async fn a_failed_pass_is_retried_on_the_rate_limiter_and_the_outcomes_kept() {
        let wake = Arc::new(Wake::default());
        let sync = ApplySync::new(&wake);
        let hour = Duration::from_secs(3600);
        let refused = || vec![Err(Refusal::retried("refused"))];
        sync.passed("w", &spec(1), refused(), false, hour);
        let failures = |s: &ApplySync| s.passes.lock().expect("apply lock")["w"].failures;
        assert_eq!(failures(&sync), 1);
        sync.passed("w", &spec(1), vec![Ok(())], true, hour);
        assert_eq!(failures(&sync), 2, "a resource still being deleted counts as a failure: the delay doubles");
        let retry = sync.passes.lock().expect("apply lock")["w"].retry_at.expect("a retry time");
        assert!(retry <= Instant::now() + Duration::from_millis(10), "5 ms, then 10 ms");
        assert_eq!(sync.outcomes("w", &spec(1)), Some(vec![Ok(())]));
        assert_eq!(sync.outcomes("w", &spec(2)), None, "outcomes of another spec are not this one's");
        assert!(sync.has_pass("w", &spec(1)) && !sync.has_pass("w", &spec(2)));
        sync.passed("w", &spec(1), vec![Ok(())], false, hour);
        assert_eq!(failures(&sync), 0, "a pass that succeeds forgets the failures");
        assert!(!sync.due("w", &spec(1), hour));
    }

    #[test]
    fn manifests_are_applied_in_upstreams_kind_order() {
        let mut kinds = vec![Some("Deployment"), Some("Widget"), None, Some("ConfigMap"), Some("Namespace"), Some("Service"), Some("RoleBinding"), Some("ServiceAccount"), Some("ValidatingWebhookConfiguration")];
        kinds.sort_by_key(|k| kind_order(*k));
        assert_eq!(kinds, [Some("Namespace"), Some("RoleBinding"), Some("ServiceAccount"), Some("ConfigMap"), Some("Service"), Some("Deployment"), Some("ValidatingWebhookConfiguration"), Some("Widget"), None]);
    }
}

//! Kubernetes errors as task-step errors, the same in every worker: an unknown cluster is
//! a rejection, transient API errors are retried, the rest are permanent; a wait that
//! ran out of time is `DEADLINE_EXCEEDED`.

use ferry_task::StepError;
use ferry_task::codes;

use crate::cluster_sets::ClusterSetError;
use crate::{ClusterError, HUB, WaitError};

/// `e` under `code`: transient when the API error is, else permanent.
pub fn kube_err(code: &str, e: ClusterError) -> StepError {
    if e.is_transient() { StepError::transient(code, e.to_string()) } else { StepError::permanent(code, e.to_string()) }
}

/// An error of the hub's API (`HUB_API`).
pub fn hub_err(e: kube::Error) -> StepError {
    kube_err(codes::HUB_API, ClusterError::Kube { cluster: HUB.into(), source: e })
}

/// A ManagedClusterSet that cannot be resolved: the hub's errors as [`hub_err`], the
/// set's own (a selector OCM would refuse too) permanent under `code`.
pub fn cluster_set_err(code: &str, e: ClusterSetError) -> StepError {
    match e {
        ClusterSetError::Hub { source } => hub_err(source),
        e => StepError::permanent(code, e.to_string()),
    }
}

/// Errors of `cluster`'s API (`CLUSTER_API`), for `map_err`.
pub fn api_err(cluster: &str) -> impl Fn(kube::Error) -> StepError + '_ {
    move |source| kube_err(codes::CLUSTER_API, ClusterError::Kube { cluster: cluster.to_owned(), source })
}

/// Reaching a cluster failed: rejected (`UNKNOWN_CLUSTER`) when Ferry knows no such
/// cluster, else as [`kube_err`] under `CLUSTER_API`.
pub fn client_err(e: ClusterError) -> StepError {
    match e {
        ClusterError::Unknown { .. } => StepError::rejected(codes::UNKNOWN_CLUSTER, e.to_string()),
        e => kube_err(codes::CLUSTER_API, e),
    }
}

/// A failed wait: `DEADLINE_EXCEEDED` at the deadline, else `code`; the message names
/// `code` and the last state seen.
pub fn wait_err(code: &str, e: WaitError) -> StepError {
    StepError::permanent(if matches!(e, WaitError::Timeout { .. }) { codes::DEADLINE_EXCEEDED } else { code }, format!("{code}: {e}"))
}

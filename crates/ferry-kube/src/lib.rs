//! Kubernetes plumbing shared by Ferry's workers.
//!
//! - [`clusters`]: the hub's client, and each managed cluster's client built from its
//!   Cluster API kubeconfig Secret `<cluster>-kubeconfig` on the hub (never from Kafka);
//!   discovery-backed dynamic APIs and idempotent server-side apply and delete.
//! - [`watches`]: one shared watch (reflector) per kind, cluster and namespace, which any
//!   number of tasks wait on with deadlines; the number of open watches does not grow with
//!   the number of waiting tasks.
//! - [`kinds`]: typed handles (JSON spec/status) of the OCM, Cluster API and Liqo kinds.
//! - [`names`]: DNS-1123 names and label keys and values.
//! - [`quantity`]: resource quantities parsed as Kubernetes parses them.
//! - [`step_errors`]: Kubernetes errors as task-step errors, alike in every worker.
//! - [`dry_run`]: what a command would write, judged by a server-side dry run and compared
//!   with what is there (secrets redacted).
//! - [`conditions`]: named wait conditions (a rollout as kubectl judges it; the object a
//!   watch shows is the one just written).
//! - [`vocab`]: the OCM and Liqo names more than one worker uses.
//! - [`capacity`]: a cluster's Nodes and Pods as the scheduler counts them (scoring,
//!   placement checks, bursts).
//! - [`cluster_sets`]: a ManagedClusterSet's members as OCM resolves them (by its label or
//!   its label selector, `global` included): deploy's candidates, score's set, a plan's
//!   fanned-out step, the test bed's placement.
//! - [`deletes`]: deleting the very object read (a UID precondition), never another of
//!   its name; gone or replaced counts as done.
//! - [`orphans`]: the namespaces a ManifestWork ships but must not own (there before it):
//!   `CreateOnly` and orphaned, so that deleting the work never deletes them.
//! - [`said`]: Kubernetes errors in an operator's words (no `Status` in Rust's debug
//!   notation in any user-facing line).

pub mod capacity;
pub mod cluster_sets;
pub mod clusters;
pub mod conditions;
pub mod deletes;
pub mod dry_run;
pub mod kinds;
pub mod names;
pub mod ocm_join;
pub mod orphans;
pub mod quantity;
pub mod said;
pub mod step_errors;
pub mod vocab;
pub mod watches;

pub use clusters::{ClusterError, Clusters, HUB};
pub use watches::{Check, WaitError, Watches};

/// Installs the process-wide rustls crypto provider `kube` needs (idempotent).
pub fn init_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

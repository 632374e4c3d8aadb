//! What a task that runs other tasks (a plan) is written against: [`Children`] submits a
//! child command, reads and waits for a child's snapshot, and asks for its revert. The
//! runtime implements it over Kafka (`ferry_runtime::children`); a worker crate needs only
//! this trait, so it stays free of any Kafka client.
//!
//! # Guarantees (what an implementation promises)
//! - [`Children::child_id`] is a pure function of (kind, key): a resumed parent finds the
//!   child it submitted before a crash, and a second submission of the same key starts
//!   nothing new (the runtime's idempotency of keyed commands).
//! - [`Children::wait`] returns as soon as `until` accepts a snapshot of the child, and
//!   after `limit` at the latest: waits are watches with a deadline, never open-ended.
//!
//! # Errors
//! A [`ChildError`] says whether retrying may help ([`ChildError::is_transient`]).

use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::Value;

use crate::ids::TaskId;
use crate::kind::TaskKind;
use crate::protocol::TaskSnapshot;

/// A child command: a Start of `kind` on `subject` with `spec` (the kind's fields as JSON).
#[derive(Debug, Clone, PartialEq)]
pub struct ChildCommand {
    /// The child's kind.
    pub kind: TaskKind,
    /// Its subject; `None` takes the one the kind derives from the spec (deploy,
    /// create-cluster, peer, offload), and is an error for kinds that derive none.
    pub subject: Option<String>,
    /// The kind's spec, as JSON (encoded as the kind's Avro record by the implementation).
    pub spec: Value,
    /// The child's idempotency key: its id is derived from it.
    pub idempotency_key: String,
    /// The task that runs it, recorded as the child's `requested_by` (`plan/<id>`).
    pub parent: TaskId,
    /// The parent's deadline (ms since the epoch): the child's forward run ends by it too.
    pub deadline_ms: Option<i64>,
    /// The parent's keep-partial: a failing child keeps its finished steps as the plan does.
    pub keep_partial: bool,
    /// W3C trace context the child is traced under (the parent's step).
    pub trace_parent: Option<String>,
    /// Who asked for the parent (its `requested_by`): a tenant's plan's children are the
    /// tenant's, held to its policy, with ids in its space ([`Children::child_id`]).
    pub on_behalf_of: String,
}

/// Why a child could not be submitted, followed or reverted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChildError {
    /// The child's spec does not encode as its kind's record, or names no subject where
    /// its kind derives none. Permanent: the same spec fails again.
    #[error("the {kind} child's spec: {reason}")]
    Spec {
        /// The child's kind.
        kind: TaskKind,
        /// What is wrong, naming the field.
        reason: String,
    },
    /// Kafka refused or did not answer (sending a command, reading the task-state topics).
    #[error("{what}: {reason}")]
    Unreachable {
        /// The operation.
        what: String,
        /// The cause.
        reason: String,
    },
    /// The wait ran out before the child reached the awaited state.
    #[error("child {task} did not reach the awaited state within {waited:?}")]
    Timeout {
        /// The child.
        task: TaskId,
        /// How long the wait took.
        waited: Duration,
    },
}

impl ChildError {
    /// Whether retrying may succeed: Kafka errors and timeouts may, a bad spec never.
    pub fn is_transient(&self) -> bool {
        !matches!(self, ChildError::Spec { .. })
    }
}

/// The child tasks of a task: submit, read, wait, cancel, revert.
pub trait Children: Send + Sync + 'static {
    /// The id a child of `kind` with idempotency key `key`, asked for on behalf of
    /// `on_behalf_of` (the parent's `requested_by`), gets (the same on every call).
    fn child_id(&self, kind: TaskKind, key: &str, on_behalf_of: &str) -> TaskId;

    /// Sends the child's Start command; returns its id. Safe to repeat: a second Start with
    /// the same key starts nothing new.
    fn submit<'a>(&'a self, child: &'a ChildCommand) -> BoxFuture<'a, Result<TaskId, ChildError>>;

    /// The child's latest snapshot as of the task-state topics' ends at the call; `None`
    /// when no worker has taken its command up yet (or it was never sent).
    fn snapshot(&self, id: TaskId) -> BoxFuture<'_, Result<Option<TaskSnapshot>, ChildError>>;

    /// [`Self::snapshot`] of each of `ids`, in order, as of one moment: what a wave of
    /// children reads at once (an implementation reads the topics' ends once, not per id).
    fn snapshots<'a>(&'a self, ids: &'a [TaskId]) -> BoxFuture<'a, Result<Vec<Option<TaskSnapshot>>, ChildError>> {
        Box::pin(async move {
            let mut out = Vec::with_capacity(ids.len());
            for id in ids {
                out.push(self.snapshot(*id).await?);
            }
            Ok(out)
        })
    }

    /// Waits until `until` accepts the child's snapshot, and returns that snapshot. `until`
    /// also sees the child's snapshots on the way, as they are read (progress to report;
    /// two written close together may show as the later one only); fails with
    /// [`ChildError::Timeout`] after `limit`.
    fn wait<'a>(
        &'a self,
        id: TaskId,
        limit: Duration,
        until: &'a mut (dyn FnMut(&TaskSnapshot) -> bool + Send),
    ) -> BoxFuture<'a, Result<TaskSnapshot, ChildError>>;

    /// Sends a Revert of the child (of `kind` on `subject`) as its parent (`requested_by`
    /// `plan/<parent>`: "Reverted by" names the plan); the child's worker undoes its steps
    /// (cancelling it first if it runs).
    fn revert<'a>(&'a self, kind: TaskKind, subject: &'a str, id: TaskId, parent: TaskId, reason: String) -> BoxFuture<'a, Result<(), ChildError>>;

    /// Sends a Cancel of the child (of `kind` on `subject`) as its parent, as
    /// [`Self::revert`] does: its worker stops it at its next safe point and it ends
    /// Cancelled (its finished steps stay until a Revert).
    fn cancel<'a>(&'a self, kind: TaskKind, subject: &'a str, id: TaskId, parent: TaskId, reason: String) -> BoxFuture<'a, Result<(), ChildError>>;
}

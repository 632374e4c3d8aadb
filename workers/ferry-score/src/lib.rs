//! Ferry's score worker: scores clusters by a named policy and publishes the scores where
//! placement reads them: an AddOnPlacementScore per cluster on the hub (with validUntil),
//! a record per cluster on the compacted scores topic, and the ranking with reasons as the
//! task's output. An onboarding watcher submits a scoring when a ManagedCluster joins.
//!
//! - [`spec`]: the command and the scores-topic record.
//! - [`policy`]: the policies, pure functions with table tests.
//! - [`observe`]: Nodes and Pods → loads, counting what the scheduler counts.

pub mod observe;
pub mod policy;
pub mod spec;

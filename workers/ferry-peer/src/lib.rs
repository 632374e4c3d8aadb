//! Ferry's peer worker: connects two clusters with Liqo (the peering objects `liqoctl
//! peer` creates, through the clusters' kubeconfigs) or Submariner (through OCM: cluster
//! set membership, SubmarinerConfig, the submariner ManagedClusterAddOn), checks both
//! sides first with bounded waits, and removes exactly what it created, in reverse order,
//! on unpeer or revert. Commands for one pair share a subject, so they never interleave.
//!
//! - [`spec`]: the command (`PeerClusters`: peer, unpeer).
//! - [`liqo`]: the Liqo objects (pure).
//! - [`submariner`]: the OCM objects of a Submariner peering (pure).
//! - [`handler`]: the handler, what steps share, and the plan.
//! - [`steps`]: the steps, one module each, with their typed outputs.

pub mod handler;
pub mod liqo;
pub mod spec;
pub mod steps;
pub mod submariner;

pub use handler::{PeerConfig, PeerHandler};

//! Ferry's offload worker: offloads a cluster's namespace to its Liqo peers (a
//! NamespaceOffloading; waits until Ready and the twin namespaces exist), refuses targets
//! that are not peered, unoffloads, and bursts a Deployment: scales it, and what the
//! scheduler cannot place at home goes to the nearest peered clusters with room (a
//! latency matrix ranks them). Every task's revert puts back what was there.
//!
//! - [`spec`]: the command (`OffloadCommand`: offload, unoffload, burst).
//! - [`liqo`]: the NamespaceOffloading and its status (pure).
//! - [`placement`]: where overflow goes (pure).
//! - [`latency`]: the latency matrix.
//! - [`handler`]: the steps.

pub mod handler;
pub mod latency;
pub mod liqo;
pub mod placement;
pub mod spec;

pub use handler::{OffloadConfig, OffloadHandler};

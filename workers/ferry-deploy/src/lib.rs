//! Ferry's deploy worker: multi-component applications onto named or placed clusters
//! through OCM ManifestWorks (or directly through kubeconfigs), tracked to readiness from
//! status feedback, and revertible: every step's undo converges back to the previous app.
//!
//! - [`spec`]: the command (`DeployApp`: deploy, update, delete).
//! - [`validate`]: rules that need no cluster.
//! - [`render`]: app → objects, ManifestWorks, Placements; feedback → readiness (pure).
//! - [`handler`]: the steps check, place, apply, wait.
//! - [`tosca`]: a TOSCA blueprint → `DeployApp`.

pub mod handler;
pub mod render;
pub mod spec;
pub mod tosca;
pub mod validate;

pub use handler::{DeployConfig, DeployHandler};

//! Ferry's create-cluster worker: Cluster API clusters created (rendered objects or a
//! ClusterClass topology), scaled and deleted as revertible tasks; add-ons installed one
//! step each with readiness checks; registration with OCM. Kubeconfigs stay on the hub.
//!
//! - [`spec`]: the command (`ClusterCommand`: create, scale, delete).
//! - [`validate`]: rules that need no cluster.
//! - [`render`]: command → Cluster API objects and the ManagedCluster (pure).
//! - [`addons`]: the add-on catalog (manifests, parameters, readiness).
//! - [`handler`]: the configuration and the plans of create, scale and delete.
//! - [`steps`]: one module per step, each with the typed key of its output.

pub mod addons;
pub mod handler;
pub mod render;
pub mod spec;
pub mod steps;
pub mod validate;

pub use addons::Catalog;
pub use handler::{ClusterConfig, ClusterHandler};

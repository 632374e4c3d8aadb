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
//! - [`preview`]: a command's dry run on the hub (its checks, the objects judged there).

pub mod addons;
pub mod handler;
pub mod preview;
pub mod render;
pub mod spec;
pub mod steps;
pub mod validate;

pub use addons::Catalog;
pub use handler::{ClusterConfig, ClusterHandler};

// The kind this crate serves, for the runtime, the CLI and the generators (ferry_task::kind).
ferry_task::register_kind!(ferry_task::kind::KindInfo {
    kind: ferry_task::TaskKind::CREATE_CLUSTER,
    describe: "Cluster API provisioning, scaling and deletion",
    order: 10,
    schemas: &[
        (30, "ClusterCommand.avsc", include_str!("../../../schemas/ClusterCommand.avsc")),
        (31, "ClusterCommand.v2.avsc", include_str!("../../../schemas/ClusterCommand.v2.avsc")),
    ],
    spec: "ClusterCommand.v2.avsc",
    access: ferry_task::kind::Access::NONE,
    not_for_tenants: None,
    encode: ferry_task::kind::encode_json::<spec::ClusterCommand>,
    check: |subject, spec| ferry_task::kind::check_json::<spec::ClusterCommand>(subject, spec, validate::rules),
    subject_of: |spec| serde_json::from_value::<spec::ClusterCommand>(spec.clone()).ok().map(|c| c.subject()),
    derived_subject: Some("`<namespace>/<name>`"),
});

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
//! - [`handler`]: the configuration and the plans of offload, unoffload and burst.
//! - [`steps`]: one module per step, each with the typed key of its output.
//! - [`preview`]: a command's dry run (its checks, the offloading judged by the consumer).

pub mod handler;
pub mod latency;
pub mod liqo;
pub mod placement;
pub mod preview;
pub mod spec;
pub mod steps;

pub use handler::{OffloadConfig, OffloadHandler};

/// The keys of the steps' outputs, for views that read an offload task's journal (e.g.
/// `outputs::OFFLOAD.from_snapshot(&snapshot)`: the twin namespace and its targets).
pub mod outputs {
    pub use crate::steps::check::CHECK;
    pub use crate::steps::offload::OFFLOAD;
    pub use crate::steps::place::PLACE;
    pub use crate::steps::ready::READY;
    pub use crate::steps::remove::REMOVE;
    pub use crate::steps::respawn::RESPAWN;
    pub use crate::steps::scale::SCALE;
    pub use crate::steps::twins::TWINS;
}

// The kind this crate serves, for the runtime, the CLI and the generators (ferry_task::kind).
ferry_task::register_kind!(ferry_task::kind::KindInfo {
    kind: ferry_task::TaskKind::OFFLOAD,
    describe: "Liqo namespace offloading and bursting",
    order: 30,
    schemas: &[
        (40, "OffloadCommand.avsc", include_str!("../../../schemas/OffloadCommand.avsc")),
    ],
    spec: "OffloadCommand.avsc",
    access: ferry_task::kind::Access::NONE,
    not_for_tenants: None,
    encode: ferry_task::kind::encode_json::<spec::OffloadCommand>,
    check: |subject, spec| ferry_task::kind::check_json::<spec::OffloadCommand>(subject, spec, spec::validate),
    subject_of: |spec| serde_json::from_value::<spec::OffloadCommand>(spec.clone()).ok().map(|c| c.subject()),
    derived_subject: Some("`<cluster>/<namespace>`"),
});

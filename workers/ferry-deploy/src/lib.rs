//! Ferry's deploy worker: multi-component applications onto named or placed clusters
//! through OCM ManifestWorks (or directly through kubeconfigs), tracked to readiness from
//! status feedback, and revertible: a revert converges the fleet back to the previous app.
//!
//! - [`spec`]: the command (`DeployApp`: deploy, update, delete).
//! - [`validate`]: rules that need no cluster.
//! - [`exportable`]: which hub Secrets a deploy may copy to clusters.
//! - [`ownership`]: which objects are Ferry's; the rest it neither takes over nor deletes.
//! - [`render`]: app → objects, ManifestWorks, Placements; feedback → readiness (pure).
//! - [`handler`]: the configuration and the plan: check, place, apply, wait.
//! - [`steps`]: one module per step; [`outputs`]: the keys of their outputs.
//! - [`preview`]: a dry run: the checks, then the ManifestWorks (or objects) a deploy
//!   would write, judged by their clusters (`dryRun=All`) and compared with those there
//!   now, and what it would remove; nothing written.
//! - [`tosca`]: a TOSCA blueprint → `DeployApp`.

pub mod exportable;
pub mod handler;
pub mod ownership;
pub mod preview;
pub mod render;
pub mod spec;
pub mod steps;
pub mod tosca;
pub mod validate;

pub use handler::{DeployConfig, DeployHandler};

/// The keys of the steps' outputs, for views that read a deploy task's journal (e.g.
/// `outputs::WAIT.from_snapshot(&snapshot)`: each component's cluster and readiness).
pub mod outputs {
    pub use crate::steps::apply::APPLY;
    pub use crate::steps::check::CHECK;
    pub use crate::steps::place::PLACE;
    pub use crate::steps::wait::WAIT;
}

// The kind this crate serves, for the runtime, the CLI and the generators (ferry_task::kind).
// Reads the scores topic: placement by score.
ferry_task::register_kind!(ferry_task::kind::KindInfo {
    kind: ferry_task::TaskKind::DEPLOY,
    describe: "Applications through OCM ManifestWork",
    order: 40,
    schemas: &[
        (50, "DeployApp.avsc", include_str!("../../../schemas/DeployApp.avsc")),
        (51, "DeployApp.v2.avsc", include_str!("../../../schemas/DeployApp.v2.avsc")),
    ],
    spec: "DeployApp.v2.avsc",
    access: ferry_task::kind::Access { reads_scores: true, ..ferry_task::kind::Access::NONE },
    not_for_tenants: None,
    encode: ferry_task::kind::encode_json::<spec::DeployApp>,
    check: |subject, spec| ferry_task::kind::check_json::<spec::DeployApp>(subject, spec, validate::validate),
    subject_of: |spec| serde_json::from_value::<spec::DeployApp>(spec.clone()).ok().map(|c| c.subject()),
    derived_subject: Some("`<namespace>/<name>`"),
});

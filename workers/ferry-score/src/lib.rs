//! Ferry's score worker: scores clusters by a named policy and publishes the scores where
//! placement reads them: an AddOnPlacementScore per cluster on the hub (with validUntil),
//! a record per cluster on the compacted scores topic, and the ranking with reasons as the
//! task's output. An onboarding watcher submits a scoring when a ManagedCluster joins.
//!
//! - [`spec`]: the command and the scores-topic record.
//! - [`policy`]: the policies, pure functions with table tests, over loads measured by
//!   `ferry_kube::capacity` (what the scheduler counts).
//! - [`validate`]: the command's rules.
//! - [`handler`]: the configuration and the plan: resolve-clusters, measure, score, publish.
//! - [`steps`]: one module per step; [`outputs`]: the keys of their outputs.
//! - [`benchmark`]: the benchmark Job through a ManifestWork with feedback rules.
//! - [`scores`]: the latest score of every cluster from the scores topic.
//! - [`onboarding`]: submits a scoring when a ManagedCluster joins or becomes available.
//! - [`preview`]: a command's dry run (resolve-clusters; the placement scores judged).

pub mod benchmark;
pub mod handler;
pub mod onboarding;
pub mod policy;
pub mod preview;
pub mod scores;
pub mod spec;
pub mod steps;
pub mod validate;

pub use handler::{ScoreConfig, ScoreHandler};

/// The keys of the steps' outputs, for views that read a score task's journal (e.g.
/// `outputs::SCORE.from_snapshot(&snapshot)`: the ranking).
pub mod outputs {
    pub use crate::steps::measure::MEASURE;
    pub use crate::steps::publish::PUBLISH;
    pub use crate::steps::resolve::RESOLVE;
    pub use crate::steps::score::SCORE;
}

// The kind this crate serves, for the runtime, the CLI and the generators (ferry_task::kind).
// Writes the scores topic, and its own command topic (the onboarding watcher's scorings).
ferry_task::register_kind!(ferry_task::kind::KindInfo {
    kind: ferry_task::TaskKind::SCORE,
    describe: "Cluster scoring for placement",
    order: 50,
    schemas: &[
        (10, "ScoreClusters.avsc", include_str!("../../../schemas/ScoreClusters.avsc")),
        (11, "ClusterScore.avsc", include_str!("../../../schemas/ClusterScore.avsc")),
    ],
    spec: "ScoreClusters.avsc",
    access: ferry_task::kind::Access { writes_scores: true, writes_own_commands: true, ..ferry_task::kind::Access::NONE },
    not_for_tenants: None,
    encode: ferry_task::kind::encode_json::<spec::ScoreClusters>,
    check: |subject, spec| ferry_task::kind::check_json::<spec::ScoreClusters>(subject, spec, |_, s| validate::validate(s)),
    subject_of: ferry_task::kind::no_subject,
    derived_subject: None,
});

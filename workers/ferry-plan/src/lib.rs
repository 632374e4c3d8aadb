//! Ferry's plan worker: a plan lists commands of the other kinds; each runs as a child
//! task with its own id and events, linked to the plan (idempotency key
//! `plan/<plan>/<step>`, `requested_by` `plan/<plan>`); a child's spec may refer to earlier
//! children's outputs (`${steps.<name>.outputs...}`). A child that does not succeed fails
//! the plan, whose undo reverts the succeeded children in reverse order, across workers.
//!
//! # Layout
//! - [`spec`]: the command (`PlanSpec`).
//! - [`validate`]: its rules (names, kinds, subjects, references).
//! - [`refs`]: the `${steps...}` references, found and resolved.
//! - [`handler`]: the configuration and the plan: one step per child.
//! - [`steps`]: the child step (submit or re-attach, wait, revert); a step fanned out
//!   over clusters (`for_each`): the choice of clusters, then its children in waves with a
//!   gate and a policy for a failed wave.
//!
//! The worker reaches Kafka only through [`ferry_task::children::Children`], which
//! `ferry_runtime::child_tasks` implements, and the hub (to choose a fanned-out step's
//! clusters) through `kube`.

pub mod handler;
pub mod refs;
pub mod spec;
pub mod steps;
pub mod validate;

pub use handler::{PlanConfig, PlanHandler};

// The kind this crate serves, for the runtime, the CLI and the generators (ferry_task::kind).
// Submits its children: the other kinds' command topics (a tenant's plan's children on the
// tenant's behalf: held to the tenant's policy by their own kinds' workers).
ferry_task::register_kind!(ferry_task::kind::KindInfo {
    kind: ferry_task::TaskKind::PLAN,
    describe: "Commands of the other kinds run as child tasks, reverted as one",
    order: 70,
    schemas: &[
        (60, "PlanSpec.avsc", include_str!("../../../schemas/PlanSpec.avsc")),
        (61, "PlanSpec.v2.avsc", include_str!("../../../schemas/PlanSpec.v2.avsc")),
        (62, "PlanSpec.v3.avsc", include_str!("../../../schemas/PlanSpec.v3.avsc")),
    ],
    spec: "PlanSpec.v3.avsc",
    access: ferry_task::kind::Access { submits_children: true, ..ferry_task::kind::Access::NONE },
    not_for_tenants: None,
    encode: ferry_task::kind::encode_json::<spec::PlanSpec>,
    check: |subject, spec| ferry_task::kind::check_json::<spec::PlanSpec>(subject, spec, |_, s| validate::validate(s)),
    subject_of: ferry_task::kind::no_subject,
    derived_subject: None,
});

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
//! - [`steps`]: the child step (submit or re-attach, wait, revert).
//!
//! The worker reaches Kafka only through [`ferry_task::children::Children`], which
//! `ferry_runtime::child_tasks` implements.

pub mod handler;
pub mod refs;
pub mod spec;
pub mod steps;
pub mod validate;

pub use handler::{PlanConfig, PlanHandler};

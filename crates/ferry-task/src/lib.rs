//! What a Ferry worker is written against, with no Kafka client in it: a [`TaskHandler`]
//! (a spec check and a list of idempotent [`Step`]s with undo), the errors a step returns,
//! task ids and kinds, and the wire records with their Avro framing. `ferry-runtime` runs
//! handlers over Kafka; worker crates need only this crate and `ferry-kube`.
//!
//! # Layout
//! - [`step`]: handler, steps, step context, errors and retry policies.
//! - [`ids`], [`kind`]: task ids (deterministic from idempotency keys) and task kinds.
//! - [`protocol`], [`wire`]: the records on the wire and their schema-id framing.
//! - [`output`]: typed step outputs ([`Output`]): a step's output read through one key.
//! - [`codes`]: every error code, one meaning each.
//! - [`limits`]: the size of records and of a command's fields.
//! - [`report`]: a finished task's events printed for a person, or summed up for a test.
//! - [`targets`]: what a command acts on, for the tenants' policy.
//! - [`children`]: what a task that runs other tasks (a plan) submits and follows them with.

pub mod children;
pub mod codes;
pub mod dry_run;
pub mod gauges;
pub mod ids;
pub mod kind;
pub mod limits;
pub mod output;
pub mod protocol;
pub mod report;
mod schema_test;
pub mod step;
pub mod targets;
pub mod wire;

pub use ids::TaskId;
pub use kind::TaskKind;
pub use output::Output;
pub use protocol::{CommandAction, EventType, ProgressEvent, TaskSnapshot, TaskState};
pub use step::{CheckStep, Rejection, Step, StepContext, StepError, StepPolicy, TaskHandler};
pub use targets::Targets;

// For `register_kind!` in worker crates.
#[doc(hidden)]
pub use inventory as __inventory;

// For `committed_schemas!` in other crates' tests.
#[doc(hidden)]
pub use apache_avro as __avro;

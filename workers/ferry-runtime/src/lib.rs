//! Ferry's durable task runtime over Kafka: every worker is a [`TaskHandler`] (a spec
//! check and a list of idempotent steps with undo) run by a [`Worker`], which turns
//! commands into durable, trackable, cancellable, revertible tasks.
//!
//! # Layout
//! - [`protocol`], [`wire`], [`topics`], [`ids`], [`kind`]: what is on the wire and where.
//! - [`step`]: what a worker writes (handler, steps, errors, policies).
//! - [`worker`]: the process: `intake` (command consumer) → `scheduler` (event loop,
//!   per-subject queues, ownership) → `runner` (one task: steps, retries, undo) →
//!   [`publisher`] (snapshot then event) and [`state_view`] (the task-state table).
//! - [`client`]: submit, cancel, revert, read state, follow events.
//! - [`embedded`]: the in-process broker for `ferry dev` and fault tests.
//! - [`testkind`]: the runtime's own `test` task kind.
//!
//! docs/ARCHITECTURE.md has the protocol and the reasoning behind it.

pub mod client;
pub mod embedded;
pub mod http;
pub mod ids;
mod intake;
pub mod kafka;
pub mod kind;
mod lag;
pub mod metrics;
pub mod preflight;
pub mod protocol;
pub mod publisher;
pub mod report;
mod runner;
mod scheduler;
pub mod schema_registry;
pub mod state_view;
pub mod secrets;
pub mod step;
pub mod strimzi;
pub mod telemetry;
pub mod tansu;
pub mod testkind;
pub mod topics;
pub mod wire;
pub mod worker;

pub use client::{Client, ClientError, EventStream, SubmitOptions};
pub use embedded::EmbeddedBroker;
pub use ids::TaskId;
pub use intake::IntakeError;
pub use kafka::KafkaConfig;
pub use kind::TaskKind;
pub use protocol::{CommandAction, EventType, ProgressEvent, TaskSnapshot, TaskState};
pub use step::{Rejection, Step, StepContext, StepError, StepPolicy, TaskHandler};
pub use topics::Topics;
pub use worker::{Worker, WorkerError, WorkerHandle, WorkerOptions};

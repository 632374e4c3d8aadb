//! Ferry's durable task runtime over Kafka: every worker is a [`TaskHandler`] (a spec
//! check and a list of idempotent steps with undo) run by a [`Worker`], which turns
//! commands into durable, trackable, cancellable, revertible tasks.
//!
//! # Layout
//! - [`protocol`], [`wire`], [`ids`], [`kind`], [`step`]: re-exported from `ferry-task`,
//!   the crate workers are written against (no Kafka client in it); [`topics`]: where
//!   records go.
//! - [`worker`]: the process: `intake` (command consumer) → `scheduler` (event loop,
//!   per-subject queues, ownership) → `runner` (one task: steps, retries, undo) →
//!   [`publisher`] (snapshot then event) and [`state_view`] (the task-state table).
//! - [`tenants`]: who sent a command (the tenant whose topic it came on, forwarded by
//!   the worker's `gateway`) and what each tenant may target.
//! - [`client`]: submit, cancel, revert, read state, follow events.
//! - [`child_tasks`]: [`children::Children`] over a [`Client`], for the `plan` kind.
//! - [`asyncapi`]: the protocol as an AsyncAPI document (`docs/asyncapi.yaml`).
//! - [`embedded`]: the in-process broker for `ferry dev` and fault tests.
//! - [`testkind`]: the runtime's own `test` task kind.
//!
//! docs/ARCHITECTURE.md has the protocol and the reasoning behind it.

pub use ferry_task::{children, codes, dry_run, gauges, ids, kind, limits, output, protocol, report, step, targets, wire};

pub mod asyncapi;
pub mod client;
pub mod child_tasks;
pub mod effects;
pub mod embedded;
mod fences;
mod gateway;
pub mod history;
mod holds;
pub mod http;
mod intake;
pub mod kafka;
mod lag;
pub mod live;
pub mod metrics;
pub mod preflight;
pub mod publisher;
mod runner;
mod scheduler;
pub mod schema_registry;
pub mod state_view;
pub mod secrets;
pub mod strimzi;
pub mod telemetry;
pub mod tansu;
pub mod tenants;
pub mod testkind;
pub mod topics;
pub mod worker;

pub use client::{Client, ClientError, EventStream, SubmitOptions, Target, TaskStates};
pub use embedded::EmbeddedBroker;
pub use ferry_task::register_kind;
pub use ferry_task::{CheckStep, CommandAction, EventType, Output, ProgressEvent, Rejection, Step, StepContext, StepError, StepPolicy, TaskHandler, TaskId, TaskKind};
pub use ferry_task::{TaskSnapshot, TaskState};
pub use intake::IntakeError;
pub use kafka::KafkaConfig;
pub use topics::Topics;
pub use worker::{Worker, WorkerError, WorkerHandle, WorkerOptions};

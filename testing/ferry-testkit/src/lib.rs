//! Ferry's test kit: what the end-to-end tests, the fault campaign, the demos and
//! `ferry dev` share, kept out of the worker crates (no worker depends on it, or on the
//! test bed, except as a dev-dependency).
//!
//! # Layout
//! - [`bed`]: the test bed assembled one way ([`Bed::builder`]): members, emulated
//!   controllers, the hub's admission webhooks, the embedded broker, workers.
//!
//! One module per worker, each with its fixtures (submit a command and collect its events,
//! register clusters, list leftovers) and its `ferry dev --demo` scenario (`run`):
//! - [`cluster`]: `--demo create-cluster`.
//! - [`deploy`]: `--demo deploy`.
//! - [`offload`]: `--demo peer-offload`.
//! - [`plan`]: `--demo plan` (the four workers as one plan, waves, the plan reverted).
//! - [`score`]: `--demo score`; [`benchmark_image`] plays the benchmark Job's image on the
//!   test bed.

pub mod bed;
pub mod benchmark_image;
pub mod cluster;
pub mod deploy;
pub mod ocm;
pub mod offload;
pub mod plan;
pub mod score;

pub use bed::{Bed, BedBuilder, BedError};

/// Names for a person: `a, b, c`, or `nothing` (not a Rust list's `[]`).
pub fn listing<S: AsRef<str>>(items: &[S]) -> String {
    if items.is_empty() {
        return "nothing".to_owned();
    }
    items.iter().map(AsRef::as_ref).collect::<Vec<_>>().join(", ")
}

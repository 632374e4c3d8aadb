//! `ferry`: run workers, the embedded dev environment, submit and track tasks, benchmark.
//!
//! # Layout
//! - `cli::dev`: `ferry dev` (embedded broker, test bed, workers) and its demos.
//! - `cli::submit`, `cli::tasks`: the task tracker's commands.
//! - `cli::bench`: `ferry bench`.
//! - `cli::common`: broker settings, spec files, output formats.

mod cli;

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    let args = cli::Cli::parse();
    cli::init_tracing(args.verbose);
    match cli::run(args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

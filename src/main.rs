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
    // One process-wide TLS crypto provider (ring) for every rustls user: kube, and reqwest
    // (OTLP export, add-on manifests), which is built without a provider of its own.
    ferry_kube::init_crypto();
    let otel = match cli::otlp::init(args.command.name()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: OTLP export: {e:#}");
            return ExitCode::from(2);
        }
    };
    let code = match cli::run(args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    };
    // Spans still in the batch go out before the process ends.
    if let Some(p) = otel
        && let Err(e) = tokio::task::spawn_blocking(move || p.shutdown()).await.unwrap_or(Ok(()))
    {
        eprintln!("warning: flushing OTLP spans: {e}");
    }
    code
}

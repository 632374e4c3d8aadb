//! `ferry`: run workers, the embedded dev environment, submit and track tasks, benchmark.
//!
//! # Layout
//! - `cli::dev`: `ferry dev` (embedded broker, test bed, workers) and its demos.
//! - `cli::submit`, `cli::tasks`: the task tracker's commands.
//! - `cli::bench`: `ferry bench`.
//! - `cli::common`: broker settings, spec files, output formats.

mod cli;

/// mimalloc instead of glibc's malloc: allocation and free were a fifth of the CPU in
/// `ferry bench runtime` (docs/BENCHMARKS.md, "Throughput, session 16").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    let args = cli::Cli::parse();
    if args.command.prints_and_exits() {
        // As other Unix tools: `ferry tasks list | head` ends quietly when `head` closes the
        // pipe. Rust ignores SIGPIPE, so each print to a closed pipe panicked instead.
        // Servers and workers keep ignoring it (their sockets report EPIPE as errors).
        // SAFETY: restores a signal's default disposition before any thread is spawned
        // that could depend on it; no handler runs Rust code.
        #[allow(unsafe_code)]
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    cli::init_tracing(args.verbose, args.log_format);
    let json = args.log_format == cli::logs::LogFormat::Json;
    // One process-wide TLS crypto provider (ring) for every rustls user: kube, and reqwest
    // (OTLP export, add-on manifests), which is built without a provider of its own.
    ferry_kube::init_crypto();
    let otel = match cli::otlp::init(&cli::otlp::service_name(&args.command)) {
        Ok(p) => p,
        Err(e) => {
            say(json, Level::Error, format!("OTLP export: {e:#}"));
            return ExitCode::from(2);
        }
    };
    let code = match cli::run(args).await {
        Ok(code) => code,
        Err(e) => {
            say(json, Level::Error, format!("{e:#}"));
            ExitCode::from(2)
        }
    };
    // Spans still in the batch go out before the process ends.
    if let Some(p) = otel
        && let Err(e) = tokio::task::spawn_blocking(move || p.shutdown()).await.unwrap_or(Ok(()))
    {
        say(json, Level::Warning, format!("flushing OTLP spans: {e}"));
    }
    code
}

/// How bad a line of [`say`] is.
#[derive(Clone, Copy)]
enum Level {
    Error,
    Warning,
}

/// A last line for the operator on stderr, whatever the log filter: with `--log-format
/// json` a JSON object like the log lines, so that every line of stderr stays one object.
fn say(json: bool, level: Level, message: String) {
    let (word, json_level) = match level {
        Level::Error => ("error", "ERROR"),
        Level::Warning => ("warning", "WARN"),
    };
    if json {
        eprintln!("{}", serde_json::json!({ "level": json_level, "target": "ferry", "message": message }));
    } else {
        eprintln!("{word}: {message}");
    }
}

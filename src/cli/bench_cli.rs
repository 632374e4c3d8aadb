//! `ferry bench cli`: the wall time of the `ferry` commands a user types, each a new
//! process as from a shell, against an embedded broker and a `test` worker started here
//! (as `ferry dev --no-fleet` runs them), beside the same binary's `ferry --version`.

use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use ferry_runtime::testkind::TestHandler;
use ferry_runtime::{EmbeddedBroker, KafkaConfig, Topics, Worker, WorkerOptions};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::bench::pct;

#[derive(Debug, Args)]
pub struct CliArgs {
    /// Runs of each command.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub runs: u32,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct Timing {
    command: String,
    runs: usize,
    p50_ms: f64,
    p90_ms: f64,
    max_ms: f64,
    /// p50_ms / the p50 of `ferry --version` (the process alone) in this run.
    p50_over_startup: f64,
}

/// The 3-step no-op task every submit sends.
const SPEC: &str = "subject: bench-cli\nspec: {steps: 3, step_ms: 0, fail_transient: 0, undo_fail_transient: 0}\n";

pub async fn run(a: CliArgs, properties: &[(String, String)]) -> anyhow::Result<ExitCode> {
    let topics = Topics::standard();
    let broker = EmbeddedBroker::start(3, &topics)?;
    let kafka = KafkaConfig::for_embedded(broker.bootstrap());
    let shutdown = CancellationToken::new();
    let mut opts = WorkerOptions::new(kafka.clone());
    opts.topics = topics.clone();
    let worker = tokio::spawn(Worker::new(opts, TestHandler { min_delay: Some(Duration::ZERO), effects: None }).run(shutdown.clone()));

    // The commands find the broker as they find `ferry dev`'s: through its state folder
    // (so they use the embedded broker's fetch wait, as a user's would).
    let state = tempfile::tempdir()?;
    std::fs::create_dir_all(state.path().join("dev"))?;
    std::fs::write(state.path().join("dev/bootstrap"), broker.bootstrap())?;
    let spec = state.path().join("task.yaml");
    std::fs::write(&spec, SPEC)?;
    let spec = spec.display().to_string();
    let extra: Vec<String> = properties.iter().flat_map(|(k, v)| ["--kafka-property".to_owned(), format!("{k}={v}")]).collect();
    let ferry = std::env::current_exe()?;
    let time = |args: Vec<String>| {
        let (ferry, state, extra) = (ferry.clone(), state.path().to_owned(), extra.clone());
        async move {
            let t0 = Instant::now();
            let out = tokio::process::Command::new(&ferry)
                .args(&args)
                .args(&extra)
                .env("FERRY_STATE", &state)
                .env_remove("FERRY_BROKERS")
                .env_remove("FERRY_CONFIG")
                .stdin(Stdio::null())
                .output()
                .await?;
            let ms = t0.elapsed().as_secs_f64() * 1000.0;
            anyhow::ensure!(out.status.success(), "`ferry {}` failed ({}): {}", args.join(" "), out.status, String::from_utf8_lossy(&out.stderr).trim());
            Ok::<_, anyhow::Error>((ms, String::from_utf8_lossy(&out.stdout).trim().to_owned()))
        }
    };
    // Warm-up: the worker's group join and the topics' first fetches are not what a user
    // meets on a running `ferry dev`.
    let (_, warm) = time(vec!["submit".into(), "test".into(), "-f".into(), spec.clone(), "--wait".into(), "-o".into(), "json".into()]).await?;
    anyhow::ensure!(warm.contains("Succeeded"), "the warm-up task did not succeed: {warm}");

    let mut rows: Vec<(String, Vec<f64>)> = Vec::new();
    let mut last_id = String::new();
    let commands: [(&str, Vec<String>); 6] = [
        ("ferry --version", vec!["--version".into()]),
        ("ferry submit test -f F", vec!["submit".into(), "test".into(), "-f".into(), spec.clone()]),
        ("ferry submit test -f F --wait", vec!["submit".into(), "test".into(), "-f".into(), spec.clone(), "--wait".into()]),
        ("ferry tasks get ID", Vec::new()),
        ("ferry tasks list", vec!["tasks".into(), "list".into()]),
        ("ferry tasks list --kind test", vec!["tasks".into(), "list".into(), "--kind".into(), "test".into()]),
    ];
    for (name, args) in commands {
        let mut ms = Vec::with_capacity(a.runs as usize);
        for _ in 0..a.runs {
            let args = if name == "ferry tasks get ID" { vec!["tasks".into(), "get".into(), last_id.clone()] } else { args.clone() };
            let (t, out) = time(args).await?;
            if name == "ferry submit test -f F" {
                last_id = out;
            }
            ms.push(t);
        }
        rows.push((name.to_owned(), ms));
    }
    shutdown.cancel();
    worker.await??;
    drop(broker);

    let startup = pct(&mut rows[0].1.clone(), 0.5);
    let report: Vec<Timing> = rows
        .into_iter()
        .map(|(command, mut ms)| {
            let p50 = pct(&mut ms, 0.5);
            Timing { command, runs: ms.len(), p50_ms: p50, p90_ms: pct(&mut ms, 0.9), max_ms: pct(&mut ms, 1.0), p50_over_startup: p50 / startup }
        })
        .collect();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let mut t = super::table::table(["COMMAND", "RUNS", "P50 MS", "P90 MS", "MAX MS", "P50 / STARTUP"]);
        for r in &report {
            t.add_row([r.command.clone(), r.runs.to_string(), format!("{:.0}", r.p50_ms), format!("{:.0}", r.p90_ms), format!("{:.0}", r.max_ms), format!("{:.1}", r.p50_over_startup)]);
        }
        super::table::print(t);
    }
    Ok(ExitCode::SUCCESS)
}

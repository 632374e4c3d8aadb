//! Command-line definition and dispatch.

pub mod apps;
pub mod bench;
pub mod bench_latency;
pub mod bench_recovery;
pub mod bench_tracker;
pub mod bench_waits;
pub mod common;
pub mod config;
pub mod dashboard;
pub mod dashboard_access;
pub mod dev;
pub mod fleet_view;
pub mod otlp;
pub mod submit;
pub mod tasks;
pub mod topics;
pub mod watch;
pub mod workers;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};


/// Ferry: Kafka-driven orchestration workers for fleets of Kubernetes clusters.
#[derive(Debug, Parser)]
#[command(name = "ferry", version, about, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    pub conn: common::Conn,
    /// More log output (-v info, -vv debug); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run Ferry on an embedded default: in-process Kafka, the workers, until interrupted.
    Dev(dev::DevArgs),
    /// Run the worker of one task kind against a Kafka cluster.
    Worker(workers::WorkerArgs),
    /// Submit a command from a spec file; prints the task id.
    Submit(submit::SubmitArgs),
    /// Track tasks: get, list, cancel, revert.
    #[command(subcommand)]
    Tasks(tasks::TasksCommand),
    /// A live web page of the tasks and the fleet, with Revert and Cancel buttons.
    Dashboard(dashboard::DashboardArgs),
    /// Apps the deploy worker runs (from the task state).
    #[command(subcommand)]
    Apps(apps::AppsCommand),
    /// Kafka topics: create them from topics/topics.yaml.
    #[command(subcommand)]
    Topics(topics::TopicsCommand),
    /// Benchmarks (figures go to docs/BENCHMARKS.md).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// The Kubernetes test bed.
    #[command(subcommand)]
    Testbed(TestbedCommand),
    /// The simulated fleet of the running `ferry dev`: clusters, nodes, capacity.
    Fleet {
        #[arg(short, long, value_enum, default_value_t)]
        output: common::Output,
    },
}

#[derive(Debug, Subcommand)]
pub enum TestbedCommand {
    /// Build or fetch the control-plane binaries (cached; idempotent).
    Install,
}

impl Command {
    /// The subcommand's name (the default OTLP service name is `ferry-<name>`).
    pub fn name(&self) -> &'static str {
        match self {
            Command::Dev(_) => "dev",
            Command::Worker(_) => "worker",
            Command::Submit(_) => "submit",
            Command::Tasks(_) => "tasks",
            Command::Apps(_) => "apps",
            Command::Dashboard(_) => "dashboard",
            Command::Topics(_) => "topics",
            Command::Bench(_) => "bench",
            Command::Testbed(_) => "testbed",
            Command::Fleet { .. } => "fleet",
        }
    }
}

pub fn init_tracing(verbose: u8) {
    let default = match verbose {
        // kube logs every failed request at ERROR, probes of starting API servers included;
        // the errors that matter reach Ferry as results and are reported there.
        0 => "warn,ferry=info,ferry_runtime=info,kube_client::client::builder=off",
        1 => "info",
        _ => "debug",
    };
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| default.into());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

pub async fn run(mut cli: Cli) -> anyhow::Result<ExitCode> {
    let file = config::load(cli.conn.config.as_deref())?;
    cli.conn.apply(file);
    match cli.command {
        Command::Dev(a) => dev::run(a).await,
        Command::Worker(a) => workers::run(&cli.conn, a).await,
        Command::Submit(a) => submit::run(&cli.conn, a).await,
        Command::Tasks(c) => tasks::run(&cli.conn, c).await,
        Command::Apps(c) => apps::run(&cli.conn, c).await,
        Command::Dashboard(a) => dashboard::run(&cli.conn, a).await,
        Command::Topics(c) => topics::run(&cli.conn, c).await,
        Command::Bench(c) => bench::run(c).await,
        Command::Testbed(TestbedCommand::Install) => testbed_install(),
        Command::Fleet { output } => fleet(output).await,
    }
}

/// Runs the project's install script (compiled in, so it works from any directory).
fn testbed_install() -> anyhow::Result<ExitCode> {
    let script = include_str!("../../scripts/install-testbed.sh");
    let status = std::process::Command::new("bash").arg("-c").arg(script).status()?;
    Ok(if status.success() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Where `ferry dev` keeps its state (bootstrap address, kubeconfigs).
pub fn state_dir() -> PathBuf {
    std::env::var_os("FERRY_STATE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| ".".into())).join(".local/state/ferry"))
}

/// Prints the clusters of the running `ferry dev` fleet.
async fn fleet(output: common::Output) -> anyhow::Result<ExitCode> {
    let dir = state_dir().join("dev/fleet");
    let mut clusters = Vec::new();
    for e in std::fs::read_dir(&dir).map_err(|e| anyhow::anyhow!("no running `ferry dev` fleet in {}: {e}", dir.display()))? {
        let p = e?.path();
        if p.join("kubeconfig").exists() {
            let name = p.file_name().unwrap_or_default().to_string_lossy().into_owned();
            clusters.push((name, p.join("kubeconfig")));
        }
    }
    clusters.sort();
    let views = ferry_fleet::describe::describe(&clusters).await?;
    match output {
        common::Output::Json => println!("{}", serde_json::to_string_pretty(&views)?),
        common::Output::Yaml => print!("{}", serde_yaml_ng::to_string(&views)?),
        common::Output::Table => {
            for c in &views {
                println!("{} ({} nodes, {} pods pending)  {}", c.name, c.nodes.len(), c.pending_pods, c.kubeconfig);
                for n in &c.nodes {
                    let alloc = n.allocatable.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ");
                    println!("  {:<28} ready={:<5} pods={:<3} {alloc}", n.name, n.ready, n.pods);
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

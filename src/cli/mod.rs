//! Command-line definition and dispatch.

pub mod apps;
pub mod bench;
pub mod bench_cli;
pub mod bench_latency;
pub mod bench_recovery;
pub mod bench_tracker;
pub mod bench_waits;
pub mod bench_wave;
pub mod common;
pub mod completions;
pub mod config;
pub mod dashboard;
pub mod dashboard_access;
pub mod dev;
pub mod dry_run;
pub mod fleet_view;
pub mod logs;
pub mod otlp;
pub mod plan_children;
pub mod submit;
pub mod table;
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
    /// Log lines on stderr as text, or as JSON objects one a line (inside a task with its
    /// trace_id and span_id).
    #[arg(long, global = true, value_enum, env = "FERRY_LOG_FORMAT", default_value_t)]
    pub log_format: logs::LogFormat,
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
    /// Track and steer tasks: get, list, watch, cancel, revert, signal.
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
    /// The config file's contexts: get-contexts, use-context, current-context.
    #[command(subcommand)]
    Config(config::ConfigCommand),
    /// A shell completion script (bash, zsh, fish, powershell, elvish) on stdout.
    Completions(completions::CompletionsArgs),
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
            Command::Config(_) => "config",
            Command::Completions(_) => "completions",
        }
    }

    /// A command that prints its answer and exits (a closed stdout may end it, as it ends
    /// other Unix tools), not a server, worker or benchmark that runs on.
    pub fn prints_and_exits(&self) -> bool {
        match self {
            Command::Submit(_) | Command::Tasks(_) | Command::Apps(_) | Command::Topics(_) | Command::Fleet { .. } | Command::Config(_) | Command::Completions(_) => true,
            Command::Dev(_) | Command::Worker(_) | Command::Dashboard(_) | Command::Bench(_) | Command::Testbed(_) => false,
        }
    }
}

pub fn init_tracing(verbose: u8, format: logs::LogFormat) {
    let default = match verbose {
        // kube logs every failed request at ERROR, probes of starting API servers included;
        // the errors that matter reach Ferry as results and are reported there.
        0 => "warn,ferry=info,ferry_runtime=info,kube_client::client::builder=off",
        1 => "info",
        _ => "debug",
    };
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| default.into());
    logs::init(&filter, format);
}

pub async fn run(mut cli: Cli) -> anyhow::Result<ExitCode> {
    // Neither needs a connection; use-context must work while the current one is broken.
    match cli.command {
        Command::Completions(a) => return completions::run(a),
        Command::Config(c) => return config::run(&cli.conn, c),
        _ => {}
    }
    config::resolve(&mut cli.conn)?;
    match cli.command {
        Command::Dev(a) => dev::run(a).await,
        Command::Worker(a) => workers::run(&cli.conn, a).await,
        Command::Submit(a) => submit::run(&cli.conn, a).await,
        Command::Tasks(c) => tasks::run(&cli.conn, c).await,
        Command::Apps(c) => apps::run(&cli.conn, c).await,
        Command::Dashboard(a) => dashboard::run(&cli.conn, a).await,
        Command::Topics(c) => topics::run(&cli.conn, c).await,
        Command::Bench(c) => bench::run(c, &cli.conn.kafka_properties).await,
        Command::Testbed(TestbedCommand::Install) => testbed_install(),
        Command::Fleet { output } => fleet(output).await,
        Command::Completions(_) | Command::Config(_) => unreachable!("handled above"),
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
    let views = ferry_fleet::describe::describe(&clusters).await;
    match output {
        common::Output::Json => println!("{}", serde_json::to_string_pretty(&views)?),
        common::Output::Yaml => print!("{}", serde_yaml_ng::to_string(&views)?),
        common::Output::Table => {
            // The clusters, then their nodes (kubectl's columns: upper-case, no borders).
            let mut clusters = table::table(["CLUSTER", "NODES", "PENDING PODS", "KUBECONFIG"]);
            let mut unreachable = Vec::new();
            let mut nodes = table::table(["CLUSTER", "NODE", "READY", "PODS", "ALLOCATABLE"]);
            for c in &views {
                if let Some(why) = &c.unreachable {
                    unreachable.push(format!("{}: unreachable: {why}", c.name));
                    clusters.add_row([c.name.clone(), "?".into(), "?".into(), c.kubeconfig.clone()]);
                    continue;
                }
                clusters.add_row([c.name.clone(), c.nodes.len().to_string(), c.pending_pods.to_string(), c.kubeconfig.clone()]);
                for n in &c.nodes {
                    let alloc = n.allocatable.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ");
                    nodes.add_row([c.name.clone(), n.name.clone(), n.ready.to_string(), n.pods.to_string(), alloc]);
                }
            }
            table::print(clusters);
            println!();
            table::print(nodes);
            for u in unreachable {
                eprintln!("{u}");
            }
        }
    }
    // Everything it could read is printed; a cluster it could not fails the command, as
    // `kubectl get` does, so a script sees it.
    Ok(if views.iter().any(|c| c.unreachable.is_some()) { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

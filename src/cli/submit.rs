//! `ferry submit <kind> -f FILE [--wait]`: encode a spec file as the kind's Avro record,
//! send the Start command, and optionally follow the task to its end.
//!
//! Exit codes: 0 submitted (or, with `--wait`, Succeeded); 1 the task ended otherwise;
//! 2 bad input or Kafka unreachable; 3 `--wait` timed out.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use ferry_runtime::{EventType, SubmitOptions, TaskId, TaskKind};
use serde::Deserialize;

use super::common::{Conn, Output};
use super::tasks::{print_event, print_snapshot};

#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// Task kind.
    pub kind: TaskKind,
    /// YAML or JSON file: `subject:` and `spec:` (the kind's fields); deploy, create-cluster, peer and offload specs may
    /// leave out `subject:` (derived: deploy `<namespace>/<name>`, offload `<cluster>/<namespace>`, ...).
    #[arg(short = 'f', long = "file", required_unless_present = "tosca", conflicts_with = "tosca")]
    pub file: Option<PathBuf>,
    /// deploy: convert this TOSCA blueprint into the DeployApp command.
    #[arg(long)]
    pub tosca: Option<PathBuf>,
    /// --tosca: the app's owner (default: the blueprint's metadata.owner).
    #[arg(long, requires = "tosca")]
    pub owner: Option<String>,
    /// --tosca: the cluster of components that name none (default: none, they need one).
    #[arg(long, requires = "tosca")]
    pub cluster: Option<String>,
    /// Same key, same task: resubmitting is safe.
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// Deadline of the task, e.g. 90s, 10m, 2h.
    #[arg(long, value_parser = parse_duration)]
    pub deadline: Option<Duration>,
    /// On failure keep finished steps instead of reverting them.
    #[arg(long)]
    pub keep_partial: bool,
    /// Follow progress until the task ends; exit 0 only if it succeeded.
    #[arg(long)]
    pub wait: bool,
    /// Give up waiting after this long.
    #[arg(long, value_parser = parse_duration, default_value = "1h")]
    pub timeout: Duration,
    #[arg(short, long, value_enum, default_value_t)]
    pub output: Output,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SpecFile {
    #[serde(default)]
    subject: Option<String>,
    spec: serde_json::Value,
}

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num.parse().map_err(|_| format!("{s:?}: expected a number with s, m or h"))?;
    match unit {
        "" | "s" => Ok(Duration::from_secs(n)),
        "ms" => Ok(Duration::from_millis(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        "h" => Ok(Duration::from_secs(n * 3600)),
        _ => Err(format!("{s:?}: unknown unit {unit:?} (use ms, s, m or h)")),
    }
}

/// Encodes a spec given as JSON for `kind` (Confluent-framed Avro).
pub fn encode_spec(client: &ferry_runtime::Client, kind: TaskKind, spec: serde_json::Value) -> anyhow::Result<Vec<u8>> {
    match kind {
        TaskKind::Test => {
            let s: ferry_runtime::testkind::TestTaskSpec = serde_json::from_value(spec).context("spec does not match the test kind's fields")?;
            Ok(client.registry().encode(&s)?)
        }
        TaskKind::Score => {
            let s: ferry_score::spec::ScoreClusters = serde_json::from_value(spec).context("spec does not match the score kind's fields (ScoreClusters)")?;
            Ok(client.registry().encode(&s)?)
        }
        TaskKind::Deploy => {
            let s: ferry_deploy::spec::DeployApp = serde_json::from_value(spec).context("spec does not match the deploy kind's fields (DeployApp)")?;
            Ok(client.registry().encode(&s)?)
        }
        TaskKind::CreateCluster => {
            let s: ferry_cluster::spec::ClusterCommand =
                serde_json::from_value(spec).context("spec does not match the create-cluster kind's fields (ClusterCommand)")?;
            Ok(client.registry().encode(&s)?)
        }
        TaskKind::Peer => {
            let s: ferry_peer::spec::PeerClusters = serde_json::from_value(spec).context("spec does not match the peer kind's fields (PeerClusters)")?;
            Ok(client.registry().encode(&s)?)
        }
        TaskKind::Offload => {
            let s: ferry_offload::spec::OffloadCommand =
                serde_json::from_value(spec).context("spec does not match the offload kind's fields (OffloadCommand)")?;
            Ok(client.registry().encode(&s)?)
        }
    }
}

pub async fn run(conn: &Conn, a: SubmitArgs) -> anyhow::Result<ExitCode> {
    let file = read_spec(&a)?;
    let subject = match (file.subject, a.kind) {
        (Some(s), _) => s,
        (None, TaskKind::Deploy) => {
            let app: ferry_deploy::spec::DeployApp =
                serde_json::from_value(file.spec.clone()).context("spec does not match the deploy kind's fields (DeployApp)")?;
            app.subject()
        }
        (None, TaskKind::CreateCluster) => {
            let c: ferry_cluster::spec::ClusterCommand =
                serde_json::from_value(file.spec.clone()).context("spec does not match the create-cluster kind's fields (ClusterCommand)")?;
            c.subject()
        }
        (None, TaskKind::Peer) => {
            let p: ferry_peer::spec::PeerClusters =
                serde_json::from_value(file.spec.clone()).context("spec does not match the peer kind's fields (PeerClusters)")?;
            p.subject()
        }
        (None, TaskKind::Offload) => {
            let c: ferry_offload::spec::OffloadCommand =
                serde_json::from_value(file.spec.clone()).context("spec does not match the offload kind's fields (OffloadCommand)")?;
            c.subject()
        }
        (None, kind) => anyhow::bail!("the spec file has no subject: (required for {kind} tasks)"),
    };
    let client = conn.client().await?;
    let spec = encode_spec(&client, a.kind, file.spec)?;
    // Follow from the current end before sending, so no event is missed.
    let mut events = if a.wait { Some(client.events(false).await?) } else { None };
    let opts = SubmitOptions { idempotency_key: a.idempotency_key, deadline: a.deadline, keep_partial: a.keep_partial, trace_parent: None };
    let id = client.submit_encoded(a.kind, &subject, spec, opts).await?;
    let Some(events) = events.as_mut() else {
        match a.output {
            Output::Json => println!("{}", serde_json::json!({ "task_id": id.to_string() })),
            _ => println!("{id}"),
        }
        return Ok(ExitCode::SUCCESS);
    };
    if a.output == Output::Table {
        eprintln!("task {id} submitted; following its progress");
    }
    wait_for_end(&client, events, id, a.timeout, a.output, EventType::Succeeded, EventType::is_final).await
}

/// The spec file, or the DeployApp converted from a TOSCA blueprint.
fn read_spec(a: &SubmitArgs) -> anyhow::Result<SpecFile> {
    if let Some(path) = &a.tosca {
        anyhow::ensure!(a.kind == TaskKind::Deploy, "--tosca makes a deploy command; the kind is {}", a.kind);
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let overrides = ferry_deploy::tosca::Overrides { name: None, owner: a.owner.clone(), cluster: a.cluster.clone() };
        let converted = ferry_deploy::tosca::convert(&text, &overrides).with_context(|| format!("converting {}", path.display()))?;
        if !converted.skipped.is_empty() {
            eprintln!("tosca: external node(s) left out: {}", converted.skipped.join(", "));
        }
        return Ok(SpecFile { subject: Some(converted.app.subject()), spec: serde_json::to_value(&converted.app)? });
    }
    let path = a.file.as_ref().context("give -f FILE or --tosca FILE")?;
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_yaml_ng::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Prints events of `id` until a final one, then (json/yaml) the snapshot; exit 0 only
/// when that final event is `success`.
pub async fn wait_for_end(
    client: &ferry_runtime::Client,
    events: &mut ferry_runtime::EventStream,
    id: TaskId,
    timeout: Duration,
    output: Output,
    success: EventType,
    ends: fn(EventType) -> bool,
) -> anyhow::Result<ExitCode> {
    let r = events
        .until(id, timeout, |e| {
            if output == Output::Table {
                print_event(e);
            }
            ends(e.event)
        })
        .await;
    let last = match r {
        Ok(evs) => evs.last().map(|e| e.event),
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(3));
        }
    };
    if output != Output::Table
        && let Some(s) = client.snapshot(id).await?
    {
        print_snapshot(&s, output)?;
    }
    Ok(if last == Some(success) { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

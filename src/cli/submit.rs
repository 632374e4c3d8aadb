//! `ferry submit <kind> -f FILE [--wait]`: encode a spec file (`-f -`: standard input) as
//! the kind's Avro record, send the Start command, and optionally follow the task to its end.
//!
//! Exit codes: 0 submitted (or, with `--wait`, Succeeded); 1 the task ended otherwise;
//! 2 bad input or Kafka unreachable; 3 `--wait` timed out.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use ferry_runtime::{EventType, SubmitOptions, TaskId, TaskKind, TaskState};
use serde::Deserialize;

use super::common::{Conn, Output, kind_parser, parse_duration};
use super::tasks::{print_event, print_snapshot};

/// How long `--wait` waits for a worker's first answer before it says none may be running.
const NO_ANSWER_NOTE: Duration = Duration::from_secs(10);

#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// Task kind.
    #[arg(value_parser = kind_parser())]
    pub kind: TaskKind,
    /// YAML or JSON file (`-`: standard input): `subject:` and `spec:` (the kind's fields); deploy, create-cluster, peer
    /// and offload specs may leave out `subject:` (derived: deploy `<namespace>/<name>`, offload `<cluster>/<namespace>`, ...).
    #[arg(short = 'f', long = "file", required_unless_present = "tosca", conflicts_with = "tosca")]
    pub file: Option<PathBuf>,
    /// deploy: convert this TOSCA blueprint into the DeployApp command.
    #[arg(long)]
    pub tosca: Option<PathBuf>,
    /// --tosca: the app's owner (default: the blueprint's metadata.owner).
    #[arg(long, requires = "tosca")]
    pub owner: Option<String>,
    /// --tosca: the cluster of components that name none (default: none, they need one; a
    /// CHARITY `placement_hint` then places them on clusters labelled with it).
    #[arg(long, requires = "tosca")]
    pub cluster: Option<String>,
    /// --tosca: the app's name (default: the blueprint's metadata.template_name).
    #[arg(long, requires = "tosca")]
    pub name: Option<String>,
    /// --tosca: a value for one of the blueprint's inputs (over its default); repeatable.
    #[arg(long = "input", value_name = "NAME=VALUE", requires = "tosca", value_parser = parse_input)]
    pub inputs: Vec<(String, String)>,
    /// --tosca: Ingress hosts the blueprint does not name become `<component>.<app>.<DOMAIN>`.
    #[arg(long, value_name = "DOMAIN", requires = "tosca")]
    pub ingress_domain: Option<String>,
    /// Print the command that would be sent (`subject:` and `spec:`, a file `-f` takes) and
    /// check it as the worker would before anything runs; send nothing. Exit 0 if it is
    /// valid, 2 if not.
    #[arg(long)]
    pub dry_run: bool,
    /// With --dry-run: the hub's kubeconfig. The command is tried on the clusters as its
    /// worker would run it: its checks run, and the objects it would write are sent to the
    /// clusters that would hold them as a server-side dry run (their schemas and webhooks
    /// judge them; nothing is stored) and compared with those there now; exit 2 if it
    /// would be rejected or a cluster refuses one, 1 if a check could not tell. Default:
    /// the running `ferry dev`'s hub, when no --brokers is given.
    #[arg(long, requires = "dry_run", value_name = "HUB_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Same key, same task: resubmitting is safe.
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// Deadline of the task, e.g. 90s, 10m, 1h30m.
    #[arg(long, value_parser = parse_duration)]
    pub deadline: Option<Duration>,
    /// On failure keep finished steps instead of reverting them.
    #[arg(long)]
    pub keep_partial: bool,
    /// Follow progress until the task ends; exit 0 only if it succeeded.
    #[arg(long)]
    pub wait: bool,
    /// Give up waiting after this long, e.g. 10m, 1h30m.
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

fn parse_input(s: &str) -> Result<(String, String), String> {
    let (k, v) = s.split_once('=').ok_or_else(|| format!("'{s}': expected NAME=VALUE"))?;
    Ok((k.to_owned(), v.to_owned()))
}

/// Encodes a spec given as JSON for `kind` (Confluent-framed Avro), as its registration says.
pub fn encode_spec(client: &ferry_runtime::Client, kind: TaskKind, spec: serde_json::Value) -> anyhow::Result<Vec<u8>> {
    let info = ferry_runtime::kind::info(kind).with_context(|| format!("no worker crate in this program registers the {kind} kind"))?;
    (info.encode)(client.registry(), spec).map_err(|e| anyhow::anyhow!("{kind}: {e}"))
}

pub async fn run(conn: &Conn, a: SubmitArgs) -> anyhow::Result<ExitCode> {
    let file = read_spec(&a)?;
    if a.dry_run {
        return super::dry_run::run(conn, &a, file.subject, file.spec).await;
    }
    let info = ferry_runtime::kind::info(a.kind).with_context(|| format!("no worker crate in this program registers the {} kind", a.kind))?;
    // A spec the kind cannot read says so first: before it says it lacks a subject, and
    // before anything needs a broker.
    (info.encode)(&ferry_runtime::wire::Registry::embedded(), file.spec.clone()).map_err(|e| anyhow::anyhow!("{}: {e}", a.kind))?;
    let Some(subject) = file.subject.or_else(|| (info.subject_of)(&file.spec)) else {
        anyhow::bail!("the spec file has no subject: (required for {} tasks)", a.kind);
    };
    let client = conn.submit_client(a.kind).await?;
    let spec = encode_spec(&client, a.kind, file.spec)?;
    // Follow from the current end before sending, so no event is missed.
    let mut events = if a.wait { Some(client.events(false).await?) } else { None };
    let key = a.idempotency_key.clone();
    let opts = SubmitOptions { idempotency_key: a.idempotency_key, deadline: a.deadline, keep_partial: a.keep_partial, ..SubmitOptions::default() };
    let id = client.submit_encoded(a.kind, &subject, spec, opts).await?;
    let Some(events) = events.as_mut() else {
        match a.output {
            Output::Json => println!("{}", serde_json::json!({ "task_id": id.to_string() })),
            _ => println!("{id}"),
        }
        return Ok(ExitCode::SUCCESS);
    };
    // A key used before names its task, and the worker answers a resubmission only by
    // publishing its state again, with no event: an ended task is answered from what it
    // did; a running one is followed, without the no-answer note (its next event may be a
    // long step away).
    let mut note = Some(a.kind);
    if let Some(key) = &key
        && let Ok(target) = client.locate(id).await
    {
        match target.known_state() {
            Some(state) if state.is_terminal() => {
                if a.output == Output::Table {
                    eprintln!("task {id} (idempotency key {key:?}) had already ended: {}", super::table::name(&state));
                    client.history(id).await?.iter().filter(|e| e.seq > 0).for_each(print_event);
                } else if let Some(s) = client.snapshot(id).await? {
                    print_snapshot(&client, &s, a.output).await?;
                }
                return Ok(if state == TaskState::Succeeded { ExitCode::SUCCESS } else { ExitCode::from(1) });
            }
            Some(_) => note = None,
            None => {}
        }
    }
    if a.output == Output::Table {
        eprintln!("task {id} submitted; following its progress");
    }
    wait_for_end(&client, events, id, note, a.timeout, a.output, EventType::Succeeded, EventType::is_final).await
}

/// The spec file, or the DeployApp converted from a TOSCA blueprint.
fn read_spec(a: &SubmitArgs) -> anyhow::Result<SpecFile> {
    if let Some(path) = &a.tosca {
        anyhow::ensure!(a.kind == TaskKind::DEPLOY, "--tosca makes a deploy command; the kind is {}", a.kind);
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let overrides = ferry_deploy::tosca::Overrides {
            name: a.name.clone(),
            owner: a.owner.clone(),
            cluster: a.cluster.clone(),
            inputs: a.inputs.iter().cloned().collect(),
            ingress_domain: a.ingress_domain.clone(),
        };
        let converted = ferry_deploy::tosca::convert(&text, &overrides).with_context(|| format!("converting {}", path.display()))?;
        // DeployApp has no field for them (its schema is versioned): said here.
        if !converted.skipped.is_empty() {
            eprintln!("tosca: external node(s) left out: {}", converted.skipped.join(", "));
        }
        for note in &converted.notes {
            eprintln!("tosca: note: {note}");
        }
        return Ok(SpecFile { subject: Some(converted.app.subject()), spec: serde_json::to_value(&converted.app)? });
    }
    let path = a.file.as_ref().context("give -f FILE or --tosca FILE")?;
    let (text, name) = if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).context("reading the spec from standard input")?;
        (text, "the spec from standard input".to_owned())
    } else {
        (std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?, path.display().to_string())
    };
    serde_yaml_ng::from_str(&text).with_context(|| format!("parsing {name}"))
}

/// Prints events of `id` until a final one, then (json/yaml) the snapshot; exit 0 only
/// when that final event is `success`. A Cancelled that starts a Revert is followed on
/// to the undo's end.
#[allow(clippy::too_many_arguments)]
pub async fn wait_for_end(
    client: &ferry_runtime::Client,
    events: &mut ferry_runtime::EventStream,
    id: TaskId,
    // The task's kind, for the note when no worker answers at first (None: no note).
    note: Option<TaskKind>,
    timeout: Duration,
    output: Output,
    success: EventType,
    ends: fn(EventType) -> bool,
) -> anyhow::Result<ExitCode> {
    let show = |e: &ferry_runtime::ProgressEvent| {
        if output == Output::Table {
            print_event(e);
        }
        ends(e.event)
    };
    // A worker answers a command it takes at once (Accepted, or the control's first event),
    // whatever the task then waits for. No answer for a while means no worker of the kind
    // takes it: said once, while the wait goes on (the command keeps on the topic).
    let started = std::time::Instant::now();
    let first = events.until(id, NO_ANSWER_NOTE.min(timeout), |_| true).await;
    let r = match first {
        Ok(evs) => {
            // The first answer (the only event here); the rest follow if it is not the end.
            if evs.iter().fold(false, |_, e| show(e)) { Ok(evs) } else { events.until(id, timeout.saturating_sub(started.elapsed()), show).await }
        }
        Err(ferry_runtime::ClientError::Timeout { .. }) if timeout > NO_ANSWER_NOTE => {
            if let Some(kind) = note {
                eprintln!(
                "note: no worker has answered in {}: is a {kind} worker running? (`ferry worker {kind}`; the command waits on {} until one takes it)",
                    humantime::format_duration(NO_ANSWER_NOTE),
                    client.command_topic(kind)
                );
            }
            events.until(id, timeout.saturating_sub(started.elapsed()), show).await
        }
        Err(e) => Err(e),
    };
    // A Revert of a running task cancels it first, then undoes it: that Cancelled is not the
    // end the caller waits for (the clusters are still being put back). Its snapshot is
    // acknowledged before the event is published, so it already says so.
    let r = match r {
        Ok(evs) if success != EventType::Cancelled && evs.last().is_some_and(|e| e.event == EventType::Cancelled) => {
            let cancelled = evs.last().map_or(0, |e| e.seq);
            match client.snapshot(id).await? {
                Some(s) if s.revert_requested || s.seq > cancelled => {
                    if output == Output::Table {
                        eprintln!("task {id} was cancelled for a revert; following its undo until it ends");
                    }
                    let undone = |e: &ferry_runtime::ProgressEvent| {
                        if output == Output::Table {
                            print_event(e);
                        }
                        matches!(e.event, EventType::Reverted | EventType::RevertFailed)
                    };
                    events.until(id, timeout.saturating_sub(started.elapsed()), undone).await
                }
                _ => Ok(evs),
            }
        }
        r => r,
    };
    let last = match r {
        Ok(evs) => evs.last().map(|e| e.event),
        Err(ferry_runtime::ClientError::Timeout { task, .. }) => {
            eprintln!("error: task {task} did not end within {} (it goes on; follow it with `ferry tasks watch {task}`)", humantime::format_duration(timeout));
            return Ok(ExitCode::from(3));
        }
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(3));
        }
    };
    if output != Output::Table
        && let Some(s) = client.snapshot(id).await?
    {
        print_snapshot(client, &s, output).await?;
    }
    Ok(if last == Some(success) { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

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
use ferry_runtime::{EventType, SubmitOptions, TaskId, TaskKind};
use serde::Deserialize;

use super::common::{Conn, Output, kind_parser, parse_duration};
use super::tasks::{print_event, print_snapshot};

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
    /// With --dry-run of a deploy: the hub's kubeconfig. The ManifestWorks the deploy would
    /// write are sent to the hub as a server-side dry run (its schemas and webhooks judge
    /// them; nothing is stored) and compared with those there now; exit 2 if the hub
    /// refuses one.
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
        return dry_run(&a, file).await;
    }
    let info = ferry_runtime::kind::info(a.kind).with_context(|| format!("no worker crate in this program registers the {} kind", a.kind))?;
    let Some(subject) = file.subject.or_else(|| (info.subject_of)(&file.spec)) else {
        // A spec the kind cannot read says so before it says it lacks a subject.
        (info.encode)(&ferry_runtime::wire::Registry::embedded(), file.spec).map_err(|e| anyhow::anyhow!("{}: {e}", a.kind))?;
        anyhow::bail!("the spec file has no subject: (required for {} tasks)", a.kind);
    };
    let client = conn.client().await?;
    let spec = encode_spec(&client, a.kind, file.spec)?;
    // Follow from the current end before sending, so no event is missed.
    let mut events = if a.wait { Some(client.events(false).await?) } else { None };
    let opts = SubmitOptions { idempotency_key: a.idempotency_key, deadline: a.deadline, keep_partial: a.keep_partial, ..SubmitOptions::default() };
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

/// `v` without its null fields and empty lists (every such field of a spec has a default),
/// for people to read.
fn compact(v: serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(m) => serde_json::Value::Object(
            m.into_iter().filter(|(_, x)| !x.is_null() && x.as_array().is_none_or(|a| !a.is_empty())).map(|(k, x)| (k, compact(x))).collect(),
        ),
        serde_json::Value::Array(a) => serde_json::Value::Array(a.into_iter().map(compact).collect()),
        other => other,
    }
}

/// `--dry-run`: prints the command as a spec file and checks it (deploy: every rule of
/// `ferry_deploy::validate`; other kinds: that the spec decodes as the kind's record);
/// with `--kubeconfig`, a deploy or a plan is also tried on the hub.
async fn dry_run(a: &SubmitArgs, file: SpecFile) -> anyhow::Result<ExitCode> {
    // The spec read once as its kind's record (deploy and plan: the kinds with rules here).
    let parsed = match a.kind {
        TaskKind::DEPLOY => serde_json::from_value(file.spec.clone()).map(Checked::Deploy).map_err(|e| format!("spec does not match the deploy kind's fields (DeployApp): {e}")),
        TaskKind::PLAN => serde_json::from_value(file.spec.clone()).map(Checked::Plan).map_err(|e| format!("spec does not match the plan kind's fields (PlanSpec): {e}")),
        _ => Ok(Checked::Other),
    };
    let subject = match (&file.subject, &parsed) {
        (Some(s), _) => s.clone(),
        (None, Ok(Checked::Deploy(d))) => d.subject(),
        (None, _) => String::new(),
    };
    let server_side = a.kubeconfig.is_some() && (a.kind == TaskKind::DEPLOY || a.kind == TaskKind::PLAN);
    anyhow::ensure!(a.kubeconfig.is_none() || server_side, "--kubeconfig: a dry run on the server covers deploys and plans; {} is checked locally", a.kind);
    // On the server, JSON and YAML print one document: the preview.
    match a.output {
        _ if server_side && a.output != Output::Table => {}
        Output::Json => println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "subject": subject, "spec": compact(file.spec.clone()) }))?),
        _ => print!("{}{}", serde_yaml_ng::to_string(&serde_json::json!({ "subject": subject }))?, serde_yaml_ng::to_string(&serde_json::json!({ "spec": compact(file.spec.clone()) }))?),
    }
    let verdict = parsed.and_then(|c| {
        match &c {
            Checked::Deploy(app) => ferry_deploy::validate::validate(&subject, app).map_err(|r| r.reason),
            Checked::Plan(plan) => ferry_plan::validate::validate(plan).map_err(|r| r.reason),
            Checked::Other => Ok(()),
        }
        .map(|()| c)
    });
    match (verdict, a.kubeconfig.as_deref()) {
        (Ok(Checked::Deploy(app)), Some(path)) => server_dry_run(&app, path, a.output).await,
        (Ok(Checked::Plan(plan)), Some(path)) => plan_server_dry_run(&plan, path, a.output).await,
        (Ok(_), _) => {
            eprintln!("dry run: nothing sent");
            Ok(ExitCode::SUCCESS)
        }
        (Err(reason), _) => {
            eprintln!("dry run: the {} task would be rejected: {reason}", a.kind);
            Ok(ExitCode::from(2))
        }
    }
}

/// A spec a dry run read as its kind's record.
enum Checked {
    Deploy(ferry_deploy::spec::DeployApp),
    Plan(ferry_plan::spec::PlanSpec),
    Other,
}

/// A deploy's dry run on the hub ([`ferry_deploy::preview`]): each ManifestWork it would
/// write, the hub's verdict and the difference from the one there; exit 2 if the hub
/// refuses one.
async fn server_dry_run(app: &ferry_deploy::spec::DeployApp, hub: &std::path::Path, output: Output) -> anyhow::Result<ExitCode> {
    let cfg = ferry_deploy::DeployConfig::new(super::workers::hub(Some(hub)).await?);
    let p = ferry_deploy::preview::preview(&cfg, app).await?;
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&p)?),
        Output::Yaml => print!("{}", serde_yaml_ng::to_string(&p)?),
        Output::Table => print_preview("", &p),
    }
    let refused = p.clusters.iter().any(|c| c.refused.is_some());
    eprintln!("dry run on the hub: nothing written, nothing sent");
    Ok(if refused { ExitCode::from(2) } else { ExitCode::SUCCESS })
}

/// A preview as lines, each starting with `prefix`.
fn print_preview(prefix: &str, p: &ferry_deploy::preview::Preview) {
    for c in &p.clusters {
        let verdict = c.refused.as_deref().map_or_else(|| "the hub accepts it".to_owned(), |why| format!("REFUSED: {why}"));
        println!("{prefix}ManifestWork {}: {:?} ({verdict}); {}", c.work, c.change, c.manifests.join(", "));
        for o in &c.operations {
            let value = o.get("value").map(|v| format!(" {v}")).unwrap_or_default();
            println!("{prefix}  {} /spec{}{value}", o["op"].as_str().unwrap_or("?"), o["path"].as_str().unwrap_or(""));
        }
    }
    for c in &p.placed_at_run_time {
        println!("{prefix}component {c}: placed by OCM at run time (not rendered)");
    }
}

/// One deploy step's (or fanned-out child's) part of a plan's dry run.
#[derive(serde::Serialize)]
struct StepPreview {
    step: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    cluster: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    preview: Option<ferry_deploy::preview::Preview>,
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

/// A plan's dry run on the hub: each deploy step (each child of a fanned-out one, its
/// clusters chosen on the hub as the run chooses them, overrides merged in) previewed as
/// [`server_dry_run`] does; steps of other kinds, and specs that use an earlier step's
/// outputs (known only at run time), are named and not previewed. Exit 2 if the hub
/// refuses one.
async fn plan_server_dry_run(plan: &ferry_plan::spec::PlanSpec, hub: &std::path::Path, output: Output) -> anyhow::Result<ExitCode> {
    let clusters = super::workers::hub(Some(hub)).await?;
    let cfg = ferry_deploy::DeployConfig::new(clusters.clone());
    let mut entries = Vec::new();
    let mut refused = false;
    for step in &plan.steps {
        if step.kind != TaskKind::DEPLOY.as_str() {
            entries.push(StepPreview { step: step.name.clone(), cluster: None, preview: None, note: Some(format!("a {} step: checked locally; a dry run on the server covers deploy steps", step.kind)) });
            continue;
        }
        let specs: Vec<(Option<String>, serde_json::Value)> = match &step.for_each {
            Some(each) => {
                let chosen = ferry_plan::steps::select::choose(&step.name, each, Some(clusters.hub())).await.map_err(|e| anyhow::anyhow!("step {}: {e}", step.name))?;
                chosen
                    .into_iter()
                    .map(|c| ferry_plan::steps::waves::spec_for(step, each, &c).map(|s| (Some(c), s)))
                    .collect::<Result<_, _>>()
                    .map_err(|e| anyhow::anyhow!("step {}: {e}", step.name))?
            }
            None => vec![(None, step.spec_value()?)],
        };
        for (cluster, spec) in specs {
            if !ferry_plan::refs::in_value(&spec, "spec").map(|r| r.is_empty()).unwrap_or(false) {
                entries.push(StepPreview { step: step.name.clone(), cluster, preview: None, note: Some("uses an earlier step's outputs, known only at run time: not previewed".into()) });
                continue;
            }
            let app: ferry_deploy::spec::DeployApp = serde_json::from_value(spec).with_context(|| format!("step {}: not a deploy spec", step.name))?;
            let p = ferry_deploy::preview::preview(&cfg, &app).await.with_context(|| format!("step {}", step.name))?;
            refused |= p.clusters.iter().any(|c| c.refused.is_some());
            entries.push(StepPreview { step: step.name.clone(), cluster, preview: Some(p), note: None });
        }
    }
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&serde_json::json!({"steps": entries}))?),
        Output::Yaml => print!("{}", serde_yaml_ng::to_string(&serde_json::json!({"steps": entries}))?),
        Output::Table => {
            for e in &entries {
                let at = match &e.cluster {
                    Some(c) => format!("step {} ({c}): ", e.step),
                    None => format!("step {}: ", e.step),
                };
                match &e.preview {
                    Some(p) => print_preview(&at, p),
                    None => println!("{at}{}", e.note.as_deref().unwrap_or("")),
                }
            }
        }
    }
    eprintln!("dry run on the hub: nothing written, nothing sent");
    Ok(if refused { ExitCode::from(2) } else { ExitCode::SUCCESS })
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
        Err(ferry_runtime::ClientError::Timeout { task, waited }) => {
            eprintln!("error: task {task} did not end within {} (it goes on; follow it with `ferry tasks watch {task}`)", humantime::format_duration(waited));
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
        print_snapshot(&s, output)?;
    }
    Ok(if last == Some(success) { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

//! `ferry submit <kind> --dry-run [--kubeconfig HUB]`: the command printed as a spec file
//! and checked as the worker checks it, sending nothing. With the hub's kubeconfig (by
//! default the running `ferry dev`'s, for a command sent to its broker), every
//! kind is tried on the clusters through its worker crate's own `preview` (the same
//! checks and renderers a task runs, [`ferry_kube::dry_run::Preview`]): a deploy's
//! ManifestWorks or objects, a create-cluster's Cluster API objects, an offload's
//! NamespaceOffloading, a Submariner peering's hub objects, a score's
//! AddOnPlacementScores, and a plan's steps, each previewed as its kind is. Nothing is written, no task is made.
//!
//! Exit codes: 0 it would run; 2 it would be rejected, a check fails for good or a cluster
//! refuses an object; 1 a check could not tell (a cluster did not answer).

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use ferry_kube::Clusters;
use ferry_kube::dry_run::{Change, Preview};
use ferry_runtime::TaskKind;
use ferry_runtime::dry_run::Verdict;
use serde_json::Value;

use super::common::{Conn, Output};
use super::submit::SubmitArgs;

/// `v` without its null fields and empty lists (every such field of a spec has a default),
/// for people to read.
fn compact(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(m.into_iter().filter(|(_, x)| !x.is_null() && x.as_array().is_none_or(|a| !a.is_empty())).map(|(k, x)| (k, compact(x))).collect()),
        Value::Array(a) => Value::Array(a.into_iter().map(compact).collect()),
        other => other,
    }
}

/// A spec a dry run read as its kind's record.
enum Checked {
    Deploy(ferry_deploy::spec::DeployApp),
    Plan(ferry_plan::spec::PlanSpec),
    Other,
}

/// `--dry-run`: prints the command as a spec file and checks it (deploy and plan: every
/// rule of their `validate`; other kinds: that the spec decodes as the kind's record);
/// with `--kubeconfig`, tries it on the clusters.
pub async fn run(conn: &Conn, a: &SubmitArgs, subject: Option<String>, spec: Value) -> anyhow::Result<ExitCode> {
    // The spec read once as its kind's record.
    let parsed = if a.kind == TaskKind::DEPLOY {
        ferry_runtime::kind::strict_json(spec.clone()).map(Checked::Deploy).map_err(|e| format!("spec does not match the deploy kind's fields (DeployApp): {e}"))
    } else if a.kind == TaskKind::PLAN {
        ferry_runtime::kind::strict_json(spec.clone()).map(Checked::Plan).map_err(|e| format!("spec does not match the plan kind's fields (PlanSpec): {e}"))
    } else {
        let info = ferry_runtime::kind::info(a.kind).with_context(|| format!("no worker crate in this program registers the {} kind", a.kind))?;
        (info.encode)(&ferry_runtime::wire::Registry::embedded(), spec.clone()).map(|_| Checked::Other).map_err(|e| e.to_string())
    };
    let subject = match (&subject, &parsed) {
        (Some(s), _) => s.clone(),
        (None, Ok(Checked::Deploy(d))) => d.subject(),
        (None, _) => ferry_runtime::kind::info(a.kind).and_then(|i| (i.subject_of)(&spec)).unwrap_or_default(),
    };
    anyhow::ensure!(a.kubeconfig.is_none() || PREVIEWED.contains(&a.kind.as_str()), "--kubeconfig: a dry run on the clusters covers {}; {} is checked locally", PREVIEWED.join(", "), a.kind);
    // Without --kubeconfig, a command for the running `ferry dev` (no --brokers) is tried
    // on its fleet, as the worker there would run it.
    let kubeconfig = a.kubeconfig.clone().or_else(|| (conn.brokers.is_none() && PREVIEWED.contains(&a.kind.as_str())).then(super::dev::running_hub).flatten());
    let server_side = kubeconfig.is_some();
    // On the clusters, JSON and YAML print one document: the preview.
    match a.output {
        _ if server_side && a.output != Output::Table => {}
        Output::Json => println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "subject": subject, "spec": compact(spec.clone()) }))?),
        _ => print!("{}{}", serde_yaml_ng::to_string(&serde_json::json!({ "subject": subject }))?, serde_yaml_ng::to_string(&serde_json::json!({ "spec": compact(spec.clone()) }))?),
    }
    let verdict = parsed.and_then(|c| {
        match &c {
            Checked::Deploy(app) => ferry_deploy::validate::validate(&subject, app).map_err(|r| r.reason),
            Checked::Plan(plan) => ferry_plan::validate::validate(plan).map_err(|r| r.reason),
            Checked::Other => Ok(()),
        }
        .map(|()| c)
    });
    let checked = match verdict {
        Ok(c) => c,
        Err(reason) => {
            eprintln!("dry run: the {} task would be rejected: {reason}", a.kind);
            return Ok(ExitCode::from(2));
        }
    };
    let Some(path) = kubeconfig.as_deref() else {
        eprintln!("dry run: nothing sent");
        return Ok(ExitCode::SUCCESS);
    };
    if a.kubeconfig.is_none() {
        eprintln!("dry run on the running `ferry dev`'s clusters (hub kubeconfig {})", path.display());
    }
    let clusters = super::workers::hub(Some(path)).await?;
    match checked {
        Checked::Plan(plan) => plan_dry_run(conn, &plan, &clusters, a.output).await,
        Checked::Deploy(_) | Checked::Other => {
            let p = kind_preview(conn, a.kind, &subject, spec, &clusters).await?.context("a kind without a dry run on the clusters")?;
            match a.output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&p)?),
                Output::Yaml => print!("{}", serde_yaml_ng::to_string(&p)?),
                Output::Table => print_kind_preview("", &p),
            }
            eprintln!("dry run on the clusters: nothing written, nothing sent");
            Ok(exit_of(&p))
        }
    }
}

/// 2 when the task would be refused, 1 when a check could not tell, else 0.
fn exit_of(p: &Preview) -> ExitCode {
    if p.refused() {
        ExitCode::from(2)
    } else if matches!(p.checked.verdict, Verdict::Unknown { .. }) {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// The kinds a dry run tries on the clusters.
const PREVIEWED: &[&str] = &["deploy", "plan", "create-cluster", "offload", "peer", "score"];

/// A deploy, create-cluster, offload, peer or score command's dry run on the clusters: its
/// worker crate's `preview`, with the configuration a worker started on this hub has; None for
/// the other kinds.
async fn kind_preview(conn: &Conn, kind: TaskKind, subject: &str, spec: Value, clusters: &Arc<Clusters>) -> anyhow::Result<Option<Preview>> {
    let decode = |what: &str| format!("spec does not match the {kind} kind's fields ({what})");
    if kind == TaskKind::DEPLOY {
        let app = ferry_runtime::kind::strict_json(spec).with_context(|| decode("DeployApp"))?;
        Ok(Some(ferry_deploy::preview::preview(&ferry_deploy::DeployConfig::new(clusters.clone()), subject, &app).await?))
    } else if kind == TaskKind::CREATE_CLUSTER {
        let cmd = ferry_runtime::kind::strict_json(spec).with_context(|| decode("ClusterCommand"))?;
        Ok(Some(ferry_cluster::preview::preview(&ferry_cluster::ClusterConfig::new(clusters.clone()), subject, &cmd).await?))
    } else if kind == TaskKind::OFFLOAD {
        let cmd = ferry_runtime::kind::strict_json(spec).with_context(|| decode("OffloadCommand"))?;
        Ok(Some(ferry_offload::preview::preview(&ferry_offload::OffloadConfig::new(clusters.clone()), subject, &cmd).await?))
    } else if kind == TaskKind::PEER {
        let cmd = ferry_runtime::kind::strict_json(spec).with_context(|| decode("PeerClusters"))?;
        Ok(Some(ferry_peer::preview::preview(&ferry_peer::PeerConfig::new(clusters.clone()), subject, &cmd).await?))
    } else if kind == TaskKind::SCORE {
        let cmd = ferry_runtime::kind::strict_json(spec).with_context(|| decode("ScoreClusters"))?;
        let cfg = ferry_score::ScoreConfig::new(clusters.clone(), conn.kafka()?, conn.topics());
        Ok(Some(ferry_score::preview::preview(&cfg, subject, &cmd).await?))
    } else {
        Ok(None)
    }
}

/// A kind's preview as lines, each starting with `prefix`.
fn print_kind_preview(prefix: &str, p: &Preview) {
    let steps: Vec<String> = p.checked.steps.iter().map(|s| if s.ran { format!("{} (checked)", s.name) } else { s.name.clone() }).collect();
    if !steps.is_empty() {
        println!("{prefix}steps: {}", steps.join(" → "));
    }
    match &p.checked.verdict {
        Verdict::Passes => println!("{prefix}checks: pass"),
        Verdict::Rejected { step, code, reason } => println!("{prefix}REJECTED by {step} ({code}): {reason}"),
        Verdict::Fails { step, code, reason } => println!("{prefix}FAILS at {step} ({code}): {reason}"),
        Verdict::Unknown { step, reason } => println!("{prefix}UNKNOWN: {step} could not tell: {reason}"),
    }
    for o in &p.objects {
        let on = if o.cluster == ferry_kube::HUB { "the hub".to_owned() } else { o.cluster.clone() };
        let verdict = match (o.change, &o.refused, &o.note) {
            (Change::Refused, Some(why), _) => format!("REFUSED by {on}: {why}"),
            (Change::NotSent, _, Some(note)) => format!("not sent: {note}"),
            (Change::Delete, _, Some(note)) => format!("deleted on {on}: {note}"),
            (change, _, _) => format!("{} ({on} accepts it)", serde_json::to_value(change).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()),
        };
        println!("{prefix}{}: {verdict}", o.object);
        if let (Some(note), Change::Create | Change::Update | Change::Unchanged) = (&o.note, o.change) {
            println!("{prefix}  ({note})");
        }
        print_operations(prefix, &o.operations);
    }
    for n in &p.notes {
        println!("{prefix}then: {n}");
    }
}

fn print_operations(prefix: &str, ops: &[Value]) {
    for o in ops {
        let value = o.get("value").map(|v| format!(" {v}")).unwrap_or_default();
        println!("{prefix}  {} {}{value}", o["op"].as_str().unwrap_or("?"), o["path"].as_str().unwrap_or(""));
    }
}

/// One step's (or fanned-out child's) part of a plan's dry run.
#[derive(serde::Serialize)]
struct StepPreview {
    step: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    cluster: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    preview: Option<Preview>,
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

/// Whether a plan step's spec or subject refers to an earlier step's outputs (or could not
/// be read for references): known only at run time, so not previewed.
fn uses_outputs(spec: &Value, subject: Option<&str>) -> bool {
    let refers = |refs: Result<usize, _>| !matches!(refs, Ok(0));
    refers(ferry_plan::refs::in_value(spec, "spec").map(|r| r.len())) || subject.is_some_and(|s| refers(ferry_plan::refs::in_text(s).map(|r| r.len())))
}

/// A plan's dry run on the hub: each step (each child of a fanned-out one, its clusters
/// chosen on the hub as the run chooses them, overrides merged in) previewed as its kind
/// is; specs that use an earlier step's outputs (known only at run time) are named and not
/// previewed. Each step is judged on the clusters as they are now, not as the steps before
/// it would leave them. Exit 2 if one would be refused.
async fn plan_dry_run(conn: &Conn, plan: &ferry_plan::spec::PlanSpec, clusters: &Arc<Clusters>, output: Output) -> anyhow::Result<ExitCode> {
    let mut entries = Vec::new();
    let mut exit = ExitCode::SUCCESS;
    for step in &plan.steps {
        let specs: Vec<(Option<String>, Value)> = match &step.for_each {
            Some(each) => {
                let chosen = ferry_plan::steps::select::choose(&step.name, each, Some(clusters.hub())).await.map_err(|e| anyhow::anyhow!("step {}: {e}", step.name))?;
                for (cluster, why) in &chosen.left_out {
                    entries.push(StepPreview { step: step.name.clone(), cluster: Some(cluster.clone()), preview: None, note: Some(format!("left out, as a Placement would leave it: {why}")) });
                }
                // As the run refuses them once the clusters are chosen (not when the step
                // uses earlier outputs, known only then): children on one subject. Each
                // child is then previewed as its kind checks it.
                if !uses_outputs(&step.spec_value()?, step.subject.as_deref())
                    && let Err(e) = ferry_plan::steps::waves::check_subjects(step, each, &chosen.clusters) {
                    entries.push(StepPreview { step: step.name.clone(), cluster: None, preview: None, note: Some(format!("REFUSED ({}): {}", e.code, e.message.strip_prefix(&format!("step {}: ", step.name)).unwrap_or(&e.message))) });
                    exit = ExitCode::from(2);
                    continue;
                }
                chosen
                    .clusters
                    .into_iter()
                    .map(|c| ferry_plan::steps::waves::spec_for(step, each, &c).map(|s| (Some(c), s)))
                    .collect::<Result<_, _>>()
                    .map_err(|e| anyhow::anyhow!("step {}: {e}", step.name))?
            }
            None => vec![(None, step.spec_value()?)],
        };
        for (cluster, spec) in specs {
            // The subject the child is sent with: a fanned-out child's has its cluster put in.
            let given = match &cluster {
                Some(c) => ferry_plan::steps::waves::subject_for(step, c),
                None => step.subject.clone(),
            };
            let mut entry = StepPreview { step: step.name.clone(), cluster, preview: None, note: None };
            if uses_outputs(&spec, given.as_deref()) {
                entry.note = Some("uses an earlier step's outputs, known only at run time: not previewed".into());
            } else {
                let kind: TaskKind = step.kind.parse().map_err(|e| anyhow::anyhow!("step {}: {e}", step.name))?;
                let subject = given.or_else(|| ferry_runtime::kind::info(kind).and_then(|i| (i.subject_of)(&spec))).unwrap_or_default();
                match kind_preview(conn, kind, &subject, spec, clusters).await.with_context(|| format!("step {}", step.name))? {
                    Some(p) => {
                        if exit_of(&p) != ExitCode::SUCCESS && exit == ExitCode::SUCCESS {
                            exit = exit_of(&p);
                        }
                        entry.preview = Some(p);
                    }
                    None => entry.note = Some(format!("a {kind} step: checked locally; a dry run on the clusters covers {}", PREVIEWED.join(", "))),
                }
            }
            entries.push(entry);
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
                    Some(p) => print_kind_preview(&at, p),
                    None => println!("{at}{}", e.note.as_deref().unwrap_or("")),
                }
            }
        }
    }
    eprintln!("dry run on the hub: nothing written, nothing sent");
    Ok(exit)
}

//! `ferry tasks get|list|watch|cancel|revert`: the task tracker over the task-state and progress
//! topics (and, for who cancelled or reverted a task and why, the command topic).

use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;
use ferry_runtime::protocol::{CommandEnvelope, JournalEntry, StepStatus, TaskSnapshot, now_ms};
use ferry_runtime::{ClientError, CommandAction, EventType, ProgressEvent, TaskId, TaskKind, TaskState};
use serde::Serialize;

use super::common::{Conn, Output, kind_parser, parse_duration, state_parser};
use super::plan_children::{self, ChildView, Undo};
use super::submit::wait_for_end;
use super::table::{age, name, rfc3339, table};

#[derive(Debug, Subcommand)]
pub enum TasksCommand {
    /// One task: state, steps with their outputs, the error, and its event history.
    Get {
        id: TaskId,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Tasks from the task-state topic, newest first.
    List {
        /// Only tasks in this state (any case: running, Failed, revert-failed).
        #[arg(long, value_parser = state_parser(), ignore_case = true)]
        state: Option<TaskState>,
        /// Only tasks of this kind.
        #[arg(long, value_parser = kind_parser())]
        kind: Option<TaskKind>,
        #[arg(long)]
        subject: Option<String>,
        /// Only tasks created within this long, e.g. 1h, 2h30m.
        #[arg(long, value_parser = parse_duration)]
        since: Option<Duration>,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Live progress bars for these tasks (exit when they end; 0 if all succeeded), or for
    /// every running task and each new one (until interrupted). A plan's child tasks are
    /// shown under it (without a terminal, each of their ends as a `child ID KIND SUBJECT STATE`
    /// line on stderr).
    Watch { ids: Vec<TaskId> },
    /// Stop a running task; finished steps stay and can be reverted later.
    Cancel {
        id: TaskId,
        /// Why, for the record (carried in the command; `tasks get` shows it).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Undo a task (cancelling it first if it runs).
    Revert {
        id: TaskId,
        /// Why, for the record (carried in the command; `tasks get` shows it).
        #[arg(long)]
        reason: Option<String>,
        /// Follow until the revert ends; exit 0 only if Reverted.
        #[arg(long)]
        wait: bool,
        /// Print the undo plan (the steps a revert would undo, last first, each with the
        /// output its undo gets) and send nothing.
        #[arg(long, conflicts_with_all = ["wait", "reason"])]
        dry_run: bool,
        /// Give up waiting after this long, e.g. 10m, 1h30m.
        #[arg(long, value_parser = parse_duration, default_value = "1h")]
        timeout: Duration,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Tell a queued or running task a decision: `approve` (the next wave of a plan that
    /// waits for approval), `pause` (a plan stops before its next wave), `resume` (goes on,
    /// also past a wave that failed under `on_failure: pause`). Recorded in the task.
    Signal {
        id: TaskId,
        /// The signal's name (lowercase letters, digits and '-').
        name: String,
        /// Why, for the record (carried in the command; `tasks get` shows it).
        #[arg(long)]
        reason: Option<String>,
    },
}

/// A snapshot as people and scripts read it (spec bytes left out, outputs as JSON). Times
/// twice: `*_ms` (milliseconds since the epoch, as before) and `*_at` (RFC 3339, UTC).
#[derive(Debug, Serialize)]
pub struct TaskView {
    pub task_id: String,
    pub kind: String,
    pub subject: String,
    pub state: TaskState,
    pub seq: i64,
    pub requested_by: String,
    pub idempotency_key: Option<String>,
    pub created_at_ms: i64,
    pub created_at: Option<String>,
    pub updated_at_ms: i64,
    pub updated_at: Option<String>,
    pub deadline_ms: Option<i64>,
    pub deadline_at: Option<String>,
    pub worker: String,
    pub steps: Vec<StepView>,
    pub error: Option<ferry_runtime::protocol::TaskError>,
    /// Steps a Revert would undo, last first.
    pub revert_would_undo: Vec<String>,
    /// W3C traceparent of the command (find the task's trace with it).
    pub trace_parent: Option<String>,
    /// The plan the task runs for, where it is a plan's child (by its idempotency key).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanRef>,
}

/// The plan a child task runs for, and its step (and cluster, for a fanned-out step).
#[derive(Debug, Serialize)]
pub struct PlanRef {
    pub task_id: String,
    pub step: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct StepView {
    pub step: i32,
    pub name: String,
    pub status: StepStatus,
    pub attempts: i32,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    pub output: Option<serde_json::Value>,
}

/// A Cancel or Revert of a task, from its kind's command topic: who, when, why.
#[derive(Debug, Serialize)]
pub struct ControlView {
    pub action: CommandAction,
    pub requested_by: String,
    pub requested_at_ms: i64,
    pub requested_at: Option<String>,
    pub reason: Option<String>,
    /// A Signal's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    /// A Cancel or Signal sent after the task had ended (by a client that did not check):
    /// the worker did nothing with it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub after_end: bool,
}

impl From<&TaskSnapshot> for TaskView {
    fn from(s: &TaskSnapshot) -> Self {
        let steps: Vec<StepView> = s.journal.iter().map(step_view).collect();
        let revert_would_undo = if s.state.is_revertible() {
            undo_order(&s.journal).map(|e| e.name.clone()).collect()
        } else {
            Vec::new()
        };
        Self {
            trace_parent: s.trace_parent.clone(),
            task_id: s.task_id.clone(),
            kind: s.kind.to_string(),
            subject: s.subject.clone(),
            state: s.state,
            seq: s.seq,
            requested_by: s.requested_by.clone(),
            idempotency_key: s.idempotency_key.clone(),
            created_at_ms: s.created_at_ms,
            created_at: rfc3339(s.created_at_ms),
            updated_at_ms: s.updated_at_ms,
            updated_at: rfc3339(s.updated_at_ms),
            deadline_ms: s.deadline_ms,
            deadline_at: s.deadline_ms.and_then(rfc3339),
            worker: s.worker.clone(),
            steps,
            error: s.error.clone(),
            revert_would_undo,
            plan: plan_children::claimed_plan(s).map(|(plan, step, cluster)| PlanRef {
                task_id: plan.to_string(),
                step: step.to_owned(),
                cluster: cluster.map(str::to_owned),
            }),
        }
    }
}

impl TaskView {
    /// A task as its events tell it (a tenant reads its events, not the task state): kind,
    /// subject and state from them, times from the first and the last, the journal as the
    /// events tell it ([`JournalEntry::from_events`]: no outputs), the last error.
    fn from_events(events: &[ProgressEvent]) -> Option<Self> {
        let (first, last) = (events.first()?, events.last()?);
        let state = state_from_events(events);
        let journal = JournalEntry::from_events(events);
        let error = events.iter().rev().find(|e| e.code.is_some() && matches!(e.event, EventType::StepFailed | EventType::Failed | EventType::Rejected | EventType::RevertFailed)).map(|e| {
            ferry_runtime::protocol::TaskError { code: e.code.clone().unwrap_or_default(), message: e.message.clone().unwrap_or_default(), step: e.step, transient: e.transient.unwrap_or(false) }
        });
        let revert_would_undo = if state.is_revertible() { undo_order(&journal).map(|e| e.name.clone()).collect() } else { Vec::new() };
        Some(Self {
            trace_parent: None,
            task_id: first.task_id.clone(),
            kind: first.kind.to_string(),
            subject: first.subject.clone(),
            state,
            seq: last.seq,
            requested_by: String::new(),
            idempotency_key: None,
            created_at_ms: first.at_ms,
            created_at: rfc3339(first.at_ms),
            updated_at_ms: last.at_ms,
            updated_at: rfc3339(last.at_ms),
            deadline_ms: None,
            deadline_at: None,
            worker: last.worker.clone(),
            steps: journal.iter().map(step_view).collect(),
            error,
            revert_would_undo,
            plan: None,
        })
    }
}

/// A task's state as its events tell it (a tenant's view).
fn state_from_events(events: &[ProgressEvent]) -> TaskState {
    events.iter().rev().find_map(|e| e.event.state_after()).unwrap_or(TaskState::Accepted)
}

/// A journal entry as `tasks get` shows it.
fn step_view(e: &JournalEntry) -> StepView {
    StepView {
        step: e.step,
        name: e.name.clone(),
        status: e.status,
        attempts: e.attempts,
        started_at: rfc3339(e.started_at_ms),
        finished_at: e.finished_at_ms.and_then(rfc3339),
        output: e.output.as_deref().and_then(|o| serde_json::from_str(o).ok()),
    }
}

/// A tenant's tasks, from its own progress topic (each task's events, seq 0 refusals left
/// out), newest first.
async fn tenant_views(client: &ferry_runtime::Client) -> anyhow::Result<Vec<TaskView>> {
    let mut by_task: std::collections::HashMap<String, Vec<ProgressEvent>> = std::collections::HashMap::new();
    for (_, payload) in client.read_to_end(&client.progress_topic()).await? {
        if let Ok(e) = client.registry().decode::<ProgressEvent>(&payload)
            && e.seq > 0
        {
            by_task.entry(e.task_id.clone()).or_default().push(e);
        }
    }
    let mut views: Vec<TaskView> = by_task
        .into_values()
        .filter_map(|mut evs| {
            evs.sort_by_key(|e| e.seq);
            evs.dedup_by_key(|e| e.seq);
            TaskView::from_events(&evs)
        })
        .collect();
    views.sort_by_key(|v| std::cmp::Reverse(v.created_at_ms));
    Ok(views)
}

/// One event as a line: `seq Event[ step N name][ detail][: message]`.
pub fn print_event(e: &ProgressEvent) {
    println!("{:>4} {}", e.seq, event_line(e));
}

/// An event without its seq: `Event[ step N name][ detail][: message]`.
fn event_line(e: &ProgressEvent) -> String {
    let step = match (&e.step, &e.step_name) {
        (Some(i), Some(n)) => format!(" step {i} {n}"),
        _ => String::new(),
    };
    let extra = match e.event {
        EventType::StepProgress => format!(" {}%", e.percent.unwrap_or(0)),
        EventType::Retrying => {
            let delay = humantime::format_duration(Duration::from_millis(e.delay_ms.unwrap_or(0).max(0) as u64));
            format!(" attempt {} in {delay}", e.attempt.unwrap_or(0))
        }
        _ => String::new(),
    };
    let msg = e.message.as_deref().map(|m| format!(": {m}")).unwrap_or_default();
    format!("{}{step}{extra}{msg}", name(&e.event))
}

/// The event as JSON, with `at` (RFC 3339) beside `at_ms`.
fn event_json(e: &ProgressEvent) -> anyhow::Result<serde_json::Value> {
    let mut v = serde_json::to_value(e)?;
    if let Some(m) = v.as_object_mut() {
        m.insert("at".into(), rfc3339(e.at_ms).into());
    }
    Ok(v)
}

pub async fn print_snapshot(client: &ferry_runtime::Client, s: &TaskSnapshot, output: Output) -> anyhow::Result<()> {
    let mut v = TaskView::from(s);
    // The plan it says it runs for, only where that plan's requester sent it.
    if let Some((plan, ..)) = plan_children::claimed_plan(s) {
        let by = client.snapshot(plan).await?.map(|p| p.requested_by);
        plan_children::check_claim(&mut v, by.as_deref());
    }
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&v)?),
        Output::Yaml => print!("{}", serde_yaml_ng::to_string(&v)?),
        Output::Table => print_view(&v, &[], &[]),
    }
    Ok(())
}

/// `tasks get`'s table: the task's fields, its steps, its error, and its cancels and reverts.
fn print_view(v: &TaskView, controls: &[ControlView], children: &[ChildView]) {
    let now = now_ms();
    let mut fields = vec![
        ("Task:", v.task_id.clone()),
        ("Kind:", v.kind.clone()),
        ("Subject:", v.subject.clone()),
        ("State:", name(&v.state)),
        ("Requested by:", v.requested_by.clone()),
        ("Created:", format!("{} ({} ago)", v.created_at.clone().unwrap_or_default(), age(now, v.created_at_ms))),
        ("Updated:", format!("{} ({} ago)", v.updated_at.clone().unwrap_or_default(), age(now, v.updated_at_ms))),
    ];
    if let Some(d) = &v.deadline_at {
        fields.push(("Deadline:", d.clone()));
    }
    if let Some(p) = &v.plan {
        fields.push(("Plan:", format!("{} ({})", p.task_id, plan_children::runs_for(&p.step, p.cluster.as_deref()))));
    }
    if let Some(e) = &v.error {
        let mut notes: Vec<String> = e.step.map(|s| format!("step {s}")).into_iter().collect();
        if e.transient {
            notes.push("transient".into());
        }
        let notes = if notes.is_empty() { String::new() } else { format!(" ({})", notes.join(", ")) };
        fields.push(("Error:", format!("{}: {}{notes}", e.code, e.message)));
    }
    for c in controls {
        let reason = c.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default();
        let signal = format!(" ({})", c.signal.as_deref().unwrap_or_default());
        // One the worker did nothing with does not say it cancelled or signalled.
        let (label, what) = match (c.action, c.after_end) {
            (CommandAction::Cancel, false) => ("Cancelled by:", String::new()),
            (CommandAction::Cancel, true) => ("Cancel asked by:", String::new()),
            (CommandAction::Signal, false) => ("Signalled by:", signal),
            (CommandAction::Signal, true) => ("Signal asked by:", signal),
            _ => ("Reverted by:", String::new()),
        };
        let ignored = if c.after_end { " (after it had ended: nothing done)" } else { "" };
        fields.push((label, format!("{}{what} {} ago{reason}{ignored}", c.requested_by, age(now, c.requested_at_ms))));
    }
    if !v.revert_would_undo.is_empty() {
        fields.push(("Revert would undo:", v.revert_would_undo.join(", ")));
    }
    let mut t = super::table::plain();
    t.add_rows(fields.into_iter().map(|(k, v)| [k.to_owned(), v]));
    super::table::print(t);
    if !v.steps.is_empty() {
        let mut t = table(["STEP", "NAME", "STATUS", "ATTEMPTS", "OUTPUT"]);
        for st in &v.steps {
            let out = st.output.as_ref().map(|o| o.to_string()).unwrap_or_default();
            t.add_row([st.step.to_string(), st.name.clone(), name(&st.status), st.attempts.to_string(), out]);
        }
        println!();
        super::table::print(t);
    }
    if !children.is_empty() {
        // A plan's: each child task with the step (and cluster) it runs for.
        let mut t = table(["CHILD", "STEP", "KIND", "SUBJECT", "STATE", "AGE"]);
        for c in children {
            let step = c.cluster.as_ref().map_or_else(|| c.step.clone(), |cl| format!("{}/{cl}", c.step));
            t.add_row([c.task_id.clone(), step, c.kind.clone(), c.subject.clone(), name(&c.state), age(now, c.created_at_ms)]);
        }
        println!();
        super::table::print(t);
    }
}

/// The Cancels and Revert of `snap`'s task on its kind's command topic, oldest first.
async fn controls(conn: &Conn, client: &ferry_runtime::Client, snap: &TaskSnapshot) -> anyhow::Result<Vec<ControlView>> {
    let topic = conn.topics().command(snap.kind).name.clone();
    let records = client.read_to_end(&topic).await?;
    let mut out: Vec<ControlView> = records
        .into_iter()
        .filter(|(k, _)| k.as_deref() == Some(snap.subject.as_bytes()))
        .filter_map(|(_, p)| client.registry().decode::<CommandEnvelope>(&p).ok())
        .filter(|c| c.task_id == snap.task_id && c.action != CommandAction::Start)
        .map(|c| ControlView {
            action: c.action,
            requested_by: c.requested_by,
            requested_at_ms: c.created_at_ms,
            requested_at: rfc3339(c.created_at_ms),
            // The snapshot is not touched by a control that does nothing: one asked after
            // its last change, of a task that has ended, found it ended.
            after_end: matches!(c.action, CommandAction::Cancel | CommandAction::Signal) && snap.state.is_terminal() && c.created_at_ms > snap.updated_at_ms,
            reason: c.reason,
            signal: c.signal,
        })
        .collect();
    out.sort_by_key(|c| c.requested_at_ms);
    Ok(out)
}

/// What a Cancel, Revert or Signal to `id` would find: its target, how far the task was,
/// and why the control would do nothing, if it would (the worker's own answer: a task that
/// has ended has nothing to cancel and takes no signal; one Rejected or Reverted has
/// nothing to revert). Such a control is not sent: `--wait` would wait for an end that has
/// been, and `tasks get` would list a cancel that cancelled nothing.
async fn locate_for(client: &ferry_runtime::Client, id: TaskId, action: CommandAction) -> anyhow::Result<(ferry_runtime::Target, String, Option<String>)> {
    let target = client.locate(id).await?;
    let was = match (target.state, target.last_event) {
        (Some(state), _) => format!("task was {}", name(&state)),
        (None, Some(event)) => format!("its last event: {}", name(&event)),
        (None, None) => "task not seen yet".to_owned(),
    };
    // The runtime's words, and the command that undoes what an ended task did.
    let revertible = target.known_state().is_some_and(TaskState::is_revertible);
    let pointless = target.pointless(action).map(|why| match action {
        CommandAction::Cancel if revertible => format!("{why}; `ferry tasks revert {id}` undoes what it did"),
        _ => why,
    });
    Ok((target, was, pointless))
}

pub async fn run(conn: &Conn, cmd: TasksCommand) -> anyhow::Result<ExitCode> {
    let client = conn.command_client().await?;
    match cmd {
        TasksCommand::Get { id, output } => {
            // A tenant knows its task from its events; an operator from the task state,
            // and the controls sent to it from the command topic.
            let (view, controls, children, history) = if client.tenant().is_some() {
                let history = client.history(id).await?;
                let own: Vec<ProgressEvent> = history.iter().filter(|e| e.seq > 0).cloned().collect();
                (TaskView::from_events(&own), Vec::new(), Vec::new(), history)
            } else {
                // The events are read beside the state and the controls: each read sets up
                // a reader of its own, and one after the other they took twice as long.
                let state = async {
                    match client.snapshot(id).await? {
                        Some(snap) => {
                            let children = async {
                                if snap.kind == TaskKind::PLAN { plan_children::children(&client, &snap).await } else { Ok(Vec::new()) }
                            };
                            // Who asked for the plan it says it runs for: the claim needs it.
                            let plan_requested_by = async {
                                match plan_children::claimed_plan(&snap) {
                                    Some((p, ..)) => Ok::<_, anyhow::Error>(client.snapshot(p).await?.map(|plan| plan.requested_by)),
                                    None => Ok(None),
                                }
                            };
                            let (controls, children, plan_requested_by) = tokio::join!(controls(conn, &client, &snap), children, plan_requested_by);
                            let mut view = TaskView::from(&snap);
                            plan_children::check_claim(&mut view, plan_requested_by?.as_deref());
                            Ok::<_, anyhow::Error>((Some(view), controls?, children?))
                        }
                        None => Ok((None, Vec::new(), Vec::new())),
                    }
                };
                let (state, history) = tokio::join!(state, client.history(id));
                let (view, controls, children) = state?;
                (view, controls, children, history?)
            };
            let Some(view) = view else {
                eprintln!("error: no task {id}");
                return Ok(ExitCode::from(1));
            };
            match output {
                Output::Table => {
                    print_view(&view, &controls, &children);
                    let now = now_ms();
                    let mut t = table(["SEQ", "AGE", "EVENT"]);
                    for e in &history {
                        t.add_row([e.seq.to_string(), age(now, e.at_ms), event_line(e)]);
                    }
                    println!();
                    super::table::print(t);
                }
                Output::Json | Output::Yaml => {
                    let events = history.iter().map(event_json).collect::<anyhow::Result<Vec<_>>>()?;
                    let mut v = serde_json::json!({ "task": view, "controls": controls, "events": events });
                    if view.kind == TaskKind::PLAN.as_str() && client.tenant().is_none() {
                        v["children"] = serde_json::to_value(&children)?;
                    }
                    if output == Output::Json {
                        println!("{}", serde_json::to_string_pretty(&v)?);
                    } else {
                        print!("{}", serde_yaml_ng::to_string(&v)?);
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        TasksCommand::List { state, kind, subject, since, output } => {
            let now = now_ms();
            let all: Vec<TaskView> = if client.tenant().is_some() {
                tenant_views(&client).await?
            } else {
                // `--kind`: only that kind's task-state topic is read.
                let states = client.task_states(kind).await?;
                // Tasks a newer Ferry wrote last: left out, and said (an older state of
                // them would be shown as if current).
                if !states.newer.is_empty() {
                    let ids: Vec<&str> = states.newer.iter().take(3).map(|(t, _)| t.as_str()).collect();
                    let highest = states.newer.iter().map(|(_, s)| *s).max().unwrap_or_default();
                    eprintln!(
                        "warning: {} task(s) left out ({}{}): their state is in a record version newer than this ferry knows (schema id {highest} > {}); upgrade this ferry to see them",
                        states.newer.len(),
                        ids.join(", "),
                        if states.newer.len() > ids.len() { ", ..." } else { "" },
                        states.newest_known
                    );
                }
                let mut snaps = states.snapshots;
                snaps.sort_by_key(|s| std::cmp::Reverse(s.created_at_ms));
                let plans = snaps.iter().filter(|s| s.kind == TaskKind::PLAN).map(|s| (s.task_id.clone(), s.requested_by.clone())).collect();
                let mut views: Vec<TaskView> = snaps.iter().map(TaskView::from).collect();
                plan_children::check_claims(&mut views, &plans);
                views
            };
            let views: Vec<TaskView> = all
                .into_iter()
                .filter(|v| state.is_none_or(|st| v.state == st))
                .filter(|v| kind.is_none_or(|k| v.kind == k.as_str()))
                .filter(|v| subject.as_ref().is_none_or(|x| &v.subject == x))
                .filter(|v| since.is_none_or(|d| v.created_at_ms >= now - d.as_millis() as i64))
                .collect();
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&views)?),
                Output::Yaml => print!("{}", serde_yaml_ng::to_string(&views)?),
                // As kubectl: nothing on stdout, a word on stderr.
                Output::Table if views.is_empty() => eprintln!("No tasks found."),
                Output::Table => {
                    let mut t = table(["TASK", "KIND", "SUBJECT", "STATE", "STEPS", "AGE"]);
                    for v in &views {
                        let done = v.steps.iter().filter(|s| s.status == StepStatus::Succeeded).count();
                        t.add_row([v.task_id.clone(), v.kind.clone(), v.subject.clone(), name(&v.state), format!("{done}/{}", v.steps.len()), age(now, v.created_at_ms)]);
                    }
                    super::table::print(t);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        TasksCommand::Watch { ids } => super::watch::run(conn, ids).await,
        TasksCommand::Signal { id, name: signal, reason } => {
            // A name no task could take is said before the task is looked for.
            if let Some(why) = ferry_runtime::protocol::Signal::invalid_name(&signal) {
                return Err(ClientError::Invalid(why).into());
            }
            let (target, was, pointless) = locate_for(&client, id, CommandAction::Signal).await?;
            if let Some(why) = pointless {
                eprintln!("error: {why}; nothing sent");
                return Ok(ExitCode::from(1));
            }
            client.signal_target(id, &target, &signal, reason).await?;
            println!("signal {signal} to {id} sent ({was})");
            Ok(ExitCode::SUCCESS)
        }
        TasksCommand::Cancel { id, reason } => {
            let (target, was, pointless) = locate_for(&client, id, CommandAction::Cancel).await?;
            if let Some(why) = pointless {
                eprintln!("error: {why}; nothing sent");
                return Ok(ExitCode::from(1));
            }
            client.control(target.kind, &target.subject, id, CommandAction::Cancel, reason).await?;
            println!("cancel of {id} sent ({was})");
            Ok(ExitCode::SUCCESS)
        }
        TasksCommand::Revert { id, dry_run: true, output, .. } => {
            if client.tenant().is_some() {
                // A tenant's: from its events (the journal without outputs).
                let own: Vec<ProgressEvent> = client.history(id).await?.into_iter().filter(|e| e.seq > 0).collect();
                let first = own.first().ok_or_else(|| client.not_found(id))?;
                let (kind, journal) = (first.kind.to_string(), JournalEntry::from_events(&own));
                let undoable = Undoable { task_id: &first.task_id, kind: &kind, subject: &first.subject, state: state_from_events(&own), journal: &journal, outputs_known: false, plan: None };
                print_undo_plan(undoable, output)?;
            } else {
                let snap = client.snapshot(id).await?.ok_or(ClientError::UnknownTask(id))?;
                let kind = snap.kind.to_string();
                // A plan's undo reverts its steps' children: which, and in what order.
                let children = if snap.kind == TaskKind::PLAN { plan_children::children(&client, &snap).await? } else { Vec::new() };
                let spec = plan_children::plan_spec(&client, &snap);
                let plan = (snap.kind == TaskKind::PLAN).then_some(PlanUndo { children: &children, spec: spec.as_ref() });
                print_undo_plan(Undoable { task_id: &snap.task_id, kind: &kind, subject: &snap.subject, state: snap.state, journal: &snap.journal, outputs_known: true, plan }, output)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        TasksCommand::Revert { id, reason, wait, timeout, output, .. } => {
            let mut events = if wait { Some(client.events(false).await?) } else { None };
            let (target, was, pointless) = locate_for(&client, id, CommandAction::Revert).await?;
            // Nothing of it is in effect (Reverted, or Rejected before any step ran): what a
            // revert is for holds already.
            if let Some(why) = pointless {
                println!("{why}; nothing sent");
                return Ok(ExitCode::SUCCESS);
            }
            client.control(target.kind, &target.subject, id, CommandAction::Revert, reason).await?;
            let Some(events) = events.as_mut() else {
                println!("revert of {id} sent ({was})");
                return Ok(ExitCode::SUCCESS);
            };
            wait_for_end(&client, events, id, Some(target.kind), timeout, output, EventType::Reverted, |e| {
                matches!(e, EventType::Reverted | EventType::RevertFailed | EventType::Rejected)
            })
            .await
        }
    }
}

/// The journal's steps a revert undoes, in the order `Runner::revert` undoes them: every
/// one not yet Reverted, last first (`tasks get`'s `revert_would_undo` and the dry run).
fn undo_order(journal: &[JournalEntry]) -> impl Iterator<Item = &JournalEntry> {
    journal.iter().rev().filter(|e| e.status != StepStatus::Reverted)
}

/// What an undo plan is made from: a task's identity, state and journal (from its
/// snapshot, or for a tenant from its events, where outputs are not known).
struct Undoable<'a> {
    task_id: &'a str,
    kind: &'a str,
    subject: &'a str,
    state: TaskState,
    journal: &'a [JournalEntry],
    outputs_known: bool,
    /// A plan's children and spec (an operator's read), whose steps' undos revert them.
    plan: Option<PlanUndo<'a>>,
}

/// What a plan's undo plan is made from besides its journal.
struct PlanUndo<'a> {
    children: &'a [ChildView],
    spec: Option<&'a ferry_plan::spec::PlanSpec>,
}

/// One step of an undo plan: what the runtime's revert does with it (`runner.rs`,
/// `Runner::revert`: every journaled step not yet Reverted, last first; a finished step's
/// undo gets its output, a step that started and did not finish is undone without one).
#[derive(Debug, Serialize)]
struct UndoStep {
    step: i32,
    name: String,
    status: StepStatus,
    /// The output the undo gets (a finished step's), if any.
    output: Option<serde_json::Value>,
    /// A plan's step: the children its undo reverts, in order.
    #[serde(skip_serializing_if = "Option::is_none")]
    reverts_children: Option<Vec<ChildView>>,
    /// A plan's step with `keep: true`: its undo leaves its children.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    keeps_children: bool,
}

/// What the undo of a plan's step `step` does with its children, read once: those it
/// reverts, in order (`None`: none, or another kind's step), and whether it keeps them.
fn children_undo(plan: Option<&PlanUndo<'_>>, step: &str) -> (Option<Vec<ChildView>>, bool) {
    match plan.map(|p| plan_children::reverted_by_undo(p.spec, p.children, step)) {
        Some(Undo::Reverts(c)) if !c.is_empty() => (Some(c.into_iter().cloned().collect()), false),
        Some(Undo::Kept) => (None, true),
        _ => (None, false),
    }
}

/// `tasks revert --dry-run`: the steps a Revert sent now would undo, in order; nothing is
/// sent. A running task is cancelled first, so its plan can still grow by the step it runs.
fn print_undo_plan(snap: Undoable<'_>, output: Output) -> anyhow::Result<()> {
    let running = matches!(snap.state, TaskState::Accepted | TaskState::Running | TaskState::Reverting);
    let plan: Vec<UndoStep> = if snap.state.is_revertible() || running {
        undo_order(snap.journal)
            .map(|e| {
                let (reverts_children, keeps_children) = children_undo(snap.plan.as_ref(), &e.name);
                UndoStep {
                    step: e.step,
                    name: e.name.clone(),
                    status: e.status,
                    // As `Runner::revert` gives it: a finished step's output, or what a failed
                    // step recorded of what it started (`StepError::with_output`).
                    output: e.output.as_deref().and_then(|o| serde_json::from_str(o).ok()),
                    reverts_children,
                    keeps_children,
                }
            })
            .collect()
    } else {
        Vec::new()
    };
    let note = match snap.state {
        TaskState::Accepted | TaskState::Running => "the task runs: a revert cancels it first, then undoes what started by then (so far, below)",
        TaskState::Reverting => "the task is being reverted already: a revert changes nothing",
        s if s.is_revertible() => "a revert undoes these steps, last first; an undo that fails ends RevertFailed (revert again to retry)",
        _ => "nothing to undo: a revert of a task in this state changes nothing",
    };
    match output {
        Output::Json | Output::Yaml => {
            let v = serde_json::json!({
                "task_id": snap.task_id, "kind": snap.kind, "subject": snap.subject, "state": snap.state,
                "would_undo": plan, "note": note, "sent": false,
            });
            if output == Output::Json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print!("{}", serde_yaml_ng::to_string(&v)?);
            }
        }
        Output::Table => {
            println!("revert of {} ({} {}, {}): {note}", snap.task_id, snap.kind, snap.subject, name(&snap.state));
            if !plan.is_empty() {
                let mut t = table(["STEP", "NAME", "STATUS", "UNDO GETS"]);
                for u in &plan {
                    let given = match &u.output {
                        Some(o) => o.to_string(),
                        None if snap.outputs_known => "no output (the step did not finish or record one)".to_owned(),
                        None => "its output (in the task state, which a tenant does not read)".to_owned(),
                    };
                    t.add_row([u.step.to_string(), u.name.clone(), name(&u.status), given]);
                }
                super::table::print(t);
            }
            // A plan's steps revert child tasks: which, in the order they would be.
            let children: Vec<(&UndoStep, &ChildView)> = plan.iter().flat_map(|u| u.reverts_children.iter().flatten().map(move |c| (u, c))).collect();
            if !children.is_empty() {
                println!("\nchild tasks it reverts, in order:");
                let mut t = table(["CHILD", "STEP", "KIND", "SUBJECT", "STATE"]);
                for (u, c) in children {
                    let step = c.cluster.as_ref().map_or_else(|| u.name.clone(), |cl| format!("{}/{cl}", u.name));
                    t.add_row([c.task_id.clone(), step, c.kind.clone(), c.subject.clone(), name(&c.state)]);
                }
                super::table::print(t);
            }
            for u in plan.iter().filter(|u| u.keeps_children) {
                println!("step {} keeps its children (keep: true)", u.name);
            }
        }
    }
    eprintln!("dry run: nothing sent");
    Ok(())
}

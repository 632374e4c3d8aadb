//! `ferry tasks get|list|watch|cancel|revert`: the task tracker over the task-state and progress
//! topics.

use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;
use ferry_runtime::protocol::{StepStatus, TaskSnapshot};
use ferry_runtime::{EventType, ProgressEvent, TaskId, TaskKind, TaskState};
use serde::Serialize;

use super::common::{Conn, Output};
use super::submit::{parse_duration, wait_for_end};

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
        /// Only tasks in this state (e.g. Running, Failed).
        #[arg(long)]
        state: Option<String>,
        #[arg(long)]
        kind: Option<TaskKind>,
        #[arg(long)]
        subject: Option<String>,
        /// Only tasks created within this long, e.g. 1h.
        #[arg(long, value_parser = parse_duration)]
        since: Option<Duration>,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Live progress bars for these tasks (exit when they end; 0 if all succeeded), or for
    /// every running task and each new one (until interrupted).
    Watch { ids: Vec<TaskId> },
    /// Stop a running task; finished steps stay and can be reverted later.
    Cancel { id: TaskId },
    /// Undo a task (cancelling it first if it runs).
    Revert {
        id: TaskId,
        /// Follow until the revert ends; exit 0 only if Reverted.
        #[arg(long)]
        wait: bool,
        #[arg(long, value_parser = parse_duration, default_value = "1h")]
        timeout: Duration,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
}

/// A snapshot as people and scripts read it (spec bytes left out, outputs as JSON).
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
    pub updated_at_ms: i64,
    pub deadline_ms: Option<i64>,
    pub worker: String,
    pub steps: Vec<StepView>,
    pub error: Option<ferry_runtime::protocol::TaskError>,
    /// Steps a Revert would undo, last first.
    pub revert_would_undo: Vec<String>,
    /// W3C traceparent of the command (find the task's trace with it).
    pub trace_parent: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct StepView {
    pub step: i32,
    pub name: String,
    pub status: StepStatus,
    pub attempts: i32,
    pub output: Option<serde_json::Value>,
}

impl From<&TaskSnapshot> for TaskView {
    fn from(s: &TaskSnapshot) -> Self {
        let steps: Vec<StepView> = s
            .journal
            .iter()
            .map(|e| StepView {
                step: e.step,
                name: e.name.clone(),
                status: e.status,
                attempts: e.attempts,
                output: e.output.as_deref().and_then(|o| serde_json::from_str(o).ok()),
            })
            .collect();
        let revert_would_undo = if s.state.is_revertible() {
            steps.iter().rev().filter(|st| st.status != StepStatus::Reverted).map(|st| st.name.clone()).collect()
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
            updated_at_ms: s.updated_at_ms,
            deadline_ms: s.deadline_ms,
            worker: s.worker.clone(),
            steps,
            error: s.error.clone(),
            revert_would_undo,
        }
    }
}

pub fn print_event(e: &ProgressEvent) {
    let step = match (&e.step, &e.step_name) {
        (Some(i), Some(n)) => format!(" step {i} {n}"),
        _ => String::new(),
    };
    let extra = match e.event {
        EventType::StepProgress => format!(" {}%", e.percent.unwrap_or(0)),
        EventType::Retrying => format!(" attempt {} in {}ms", e.attempt.unwrap_or(0), e.delay_ms.unwrap_or(0)),
        _ => String::new(),
    };
    let msg = e.message.as_deref().map(|m| format!(": {m}")).unwrap_or_default();
    println!("{:>4} {:?}{step}{extra}{msg}", e.seq, e.event);
}

pub fn print_snapshot(s: &TaskSnapshot, output: Output) -> anyhow::Result<()> {
    let v = TaskView::from(s);
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&v)?),
        Output::Yaml => print!("{}", serde_yaml_ng::to_string(&v)?),
        Output::Table => {
            println!("task     {}\nkind     {}\nsubject  {}\nstate    {:?}", v.task_id, v.kind, v.subject, v.state);
            for st in &v.steps {
                let out = st.output.as_ref().map(|o| o.to_string()).unwrap_or_default();
                println!("  {:>2} {:<24} {:<10} attempts {:<2} {out}", st.step, st.name, format!("{:?}", st.status), st.attempts);
            }
            if let Some(e) = &v.error {
                println!("error    {}: {} (step {:?}, transient {})", e.code, e.message, e.step, e.transient);
            }
            if !v.revert_would_undo.is_empty() {
                println!("revert would undo: {}", v.revert_would_undo.join(", "));
            }
        }
    }
    Ok(())
}

pub async fn run(conn: &Conn, cmd: TasksCommand) -> anyhow::Result<ExitCode> {
    let client = conn.client().await?;
    match cmd {
        TasksCommand::Get { id, output } => {
            let Some(snap) = client.snapshot(id).await? else {
                eprintln!("error: no task {id}");
                return Ok(ExitCode::from(1));
            };
            let history = client.history(id).await?;
            match output {
                Output::Table => {
                    print_snapshot(&snap, output)?;
                    println!("history:");
                    history.iter().for_each(print_event);
                }
                Output::Json => {
                    let v = serde_json::json!({ "task": TaskView::from(&snap), "events": history });
                    println!("{}", serde_json::to_string_pretty(&v)?);
                }
                Output::Yaml => {
                    let v = serde_json::json!({ "task": TaskView::from(&snap), "events": history });
                    print!("{}", serde_yaml_ng::to_string(&v)?);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        TasksCommand::List { state, kind, subject, since, output } => {
            let now = ferry_runtime::protocol::now_ms();
            let mut all: Vec<TaskSnapshot> = client
                .snapshots()
                .await?
                .into_iter()
                .filter(|s| state.as_ref().is_none_or(|st| format!("{:?}", s.state).eq_ignore_ascii_case(st)))
                .filter(|s| kind.is_none_or(|k| s.kind == k))
                .filter(|s| subject.as_ref().is_none_or(|x| &s.subject == x))
                .filter(|s| since.is_none_or(|d| s.created_at_ms >= now - d.as_millis() as i64))
                .collect();
            all.sort_by_key(|s| std::cmp::Reverse(s.created_at_ms));
            let views: Vec<TaskView> = all.iter().map(TaskView::from).collect();
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&views)?),
                Output::Yaml => print!("{}", serde_yaml_ng::to_string(&views)?),
                Output::Table => {
                    println!("{:<38} {:<15} {:<24} {:<13} STEPS", "TASK", "KIND", "SUBJECT", "STATE");
                    for v in &views {
                        let done = v.steps.iter().filter(|s| s.status == StepStatus::Succeeded).count();
                        println!("{:<38} {:<15} {:<24} {:<13} {done}/{}", v.task_id, v.kind, v.subject, format!("{:?}", v.state), v.steps.len());
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        TasksCommand::Watch { ids } => super::watch::run(conn, ids).await,
        TasksCommand::Cancel { id } => {
            let snap = client.cancel(id).await?;
            println!("cancel of {id} sent (task was {:?})", snap.state);
            Ok(ExitCode::SUCCESS)
        }
        TasksCommand::Revert { id, wait, timeout, output } => {
            let mut events = if wait { Some(client.events(false).await?) } else { None };
            let snap = client.revert(id).await?;
            let Some(events) = events.as_mut() else {
                println!("revert of {id} sent (task was {:?})", snap.state);
                return Ok(ExitCode::SUCCESS);
            };
            if snap.state == TaskState::Reverted {
                println!("task {id} is already Reverted");
                return Ok(ExitCode::SUCCESS);
            }
            wait_for_end(&client, events, id, timeout, output, EventType::Reverted, |e| {
                matches!(e, EventType::Reverted | EventType::RevertFailed | EventType::Rejected)
            })
            .await
        }
    }
}

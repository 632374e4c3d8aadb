//! `ferry tasks watch [ID ...]`: live progress bars (indicatif) for the given tasks, or for
//! every running task and each new one. With IDs it exits when they have all ended: 0 when
//! each Succeeded (or was Reverted on request, not after a failure), 1 otherwise. Each end is also
//! printed as one plain line on stdout, so scripts and logs see it without a terminal.

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;
use std::time::Duration;

use ferry_runtime::{EventType, ProgressEvent, TaskId, TaskState};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::common::Conn;
use super::table::name;

struct Bar {
    bar: ProgressBar,
    /// A step failed: a Reverted end is the automatic revert of a failure.
    step_failed: bool,
}

fn style() -> ProgressStyle {
    ProgressStyle::with_template("{prefix:.bold} [{bar:24.cyan/blue}] {pos:>3}% {wide_msg}").expect("valid template").progress_chars("=> ")
}

/// How long a watched task may be unknown (submitted, not yet accepted) before the watch
/// gives up on it.
const UNKNOWN_GRACE: Duration = Duration::from_secs(30);

fn short(id: &str) -> &str {
    &id[..id.len().min(16)]
}

pub async fn run(conn: &Conn, ids: Vec<TaskId>) -> anyhow::Result<ExitCode> {
    let client = conn.command_client().await?;
    // Follow from now before reading the state, so nothing between the two is missed.
    let mut events = client.events(false).await?;
    let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
    let mut bars: BTreeMap<String, Bar> = BTreeMap::new();
    let mut waiting: BTreeSet<String> = ids.iter().map(ToString::to_string).collect();
    let mut failed = false;
    let add = |multi: &MultiProgress, kind: &str, subject: &str, id: &str| {
        let bar = multi.add(ProgressBar::new(100).with_style(style()));
        bar.set_prefix(format!("{kind} {subject} {}", short(id)));
        bar
    };
    for s in client.snapshots().await? {
        let watched = if ids.is_empty() { !s.state.is_terminal() } else { waiting.contains(&s.task_id) };
        if !watched {
            continue;
        }
        if s.state.is_terminal() && !ids.is_empty() {
            // Already over: report it and stop waiting for it.
            println!("{} {} {} {}", s.task_id, s.kind, s.subject, name(&s.state));
            failed |= !(s.state == TaskState::Succeeded || (s.state == TaskState::Reverted && s.error.is_none()));
            waiting.remove(&s.task_id);
            continue;
        }
        let bar = add(&multi, s.kind.as_str(), &s.subject, &s.task_id);
        bar.set_message(name(&s.state));
        bars.insert(s.task_id.clone(), Bar { bar, step_failed: s.error.is_some() });
    }
    if !ids.is_empty() && waiting.is_empty() {
        return Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS });
    }
    // Said once following has started (the bars are not drawn without a terminal): from
    // here on, every end is printed.
    if ids.is_empty() {
        eprintln!("watching {} running task(s) and every new one; Ctrl-C to stop", bars.len());
    } else {
        eprintln!("watching {} task(s) until they end", waiting.len());
    }
    // A task just submitted may not be in the state yet: its events are awaited a while.
    let mut unknown: BTreeSet<String> = waiting.iter().filter(|w| !bars.contains_key(*w)).cloned().collect();
    let unknown_until = tokio::time::Instant::now() + UNKNOWN_GRACE;
    loop {
        let limit = if unknown.is_empty() { tokio::time::Instant::now() + Duration::from_secs(3600) } else { unknown_until };
        let e = match tokio::time::timeout_at(limit, events.next()).await {
            Ok(Some(e)) => e,
            Ok(None) => break,
            Err(_) if !unknown.is_empty() => {
                anyhow::bail!(
                    "no task {} is known (not in the task state, no events within {})",
                    unknown.first().expect("not empty"),
                    humantime::format_duration(UNKNOWN_GRACE)
                )
            }
            Err(_) => break,
        };
        if !ids.is_empty() && !waiting.contains(&e.task_id) {
            continue;
        }
        let first_seen = unknown.remove(&e.task_id);
        if !bars.contains_key(&e.task_id) {
            if e.event.is_final() && !first_seen {
                continue;
            }
            let bar = add(&multi, e.kind.as_str(), &e.subject, &e.task_id);
            bars.insert(e.task_id.clone(), Bar { bar, step_failed: false });
        }
        let b = bars.get_mut(&e.task_id).expect("inserted above");
        update(b, &e);
        if e.event.is_final() {
            let ok = e.event == EventType::Succeeded || (e.event == EventType::Reverted && !b.step_failed);
            failed |= !ok;
            b.bar.finish_with_message(format!("{}{}", name(&e.event), e.message.as_deref().map(|m| format!(": {m}")).unwrap_or_default()));
            multi.suspend(|| println!("{} {} {} {}", e.task_id, e.kind, e.subject, name(&e.event)));
            waiting.remove(&e.task_id);
            if !ids.is_empty() && waiting.is_empty() {
                break;
            }
        }
    }
    Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

fn update(b: &mut Bar, e: &ProgressEvent) {
    let step = match (&e.step, &e.step_name) {
        (Some(n), Some(name)) => format!("step {n} {name}"),
        _ => String::new(),
    };
    match e.event {
        EventType::StepStarted => {
            b.bar.set_position(0);
            b.bar.set_message(format!("{step} started"));
        }
        EventType::StepProgress => {
            b.bar.set_position(e.percent.unwrap_or(0).clamp(0, 100) as u64);
            b.bar.set_message(format!("{step}: {}", e.message.clone().unwrap_or_default()));
        }
        EventType::StepSucceeded => {
            b.bar.set_position(100);
            b.bar.set_message(format!("{step} done"));
        }
        EventType::Retrying => b.bar.set_message(format!("{step} retrying: {}", e.message.clone().unwrap_or_default())),
        EventType::StepFailed => {
            b.step_failed = true;
            b.bar.set_message(format!("{step} failed: {}", e.message.clone().unwrap_or_default()));
        }
        EventType::StepReverted => b.bar.set_message(format!("{step} undone")),
        _ => b.bar.set_message(format!("{} {step}", name(&e.event))),
    }
}

//! `ferry tasks watch [ID ...]`: live progress bars (indicatif) for the given tasks, or for
//! every running task and each new one. With IDs it exits when they have all ended: 0 when
//! each Succeeded (or was Reverted on request, not after a failure), 1 otherwise. Each end is also
//! printed as one plain line on stdout, so scripts and logs see it without a terminal. A
//! watched plan's child tasks are followed under its bar, and without a terminal each of
//! their ends is printed as a `child ...` line on stderr (found by their idempotency keys and who asked, [`claim_holds`], in a live view
//! of the task state); they do not change the exit code, their plan's end does.

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;
use std::time::Duration;

use ferry_runtime::live::LiveState;
use ferry_runtime::{EventType, ProgressEvent, TaskId, TaskKind, TaskSnapshot, TaskState};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::common::Conn;
use super::plan_children::{claim_holds, claimed_plan, runs_for};
use super::table::name;

struct Bar {
    bar: ProgressBar,
    /// A step failed: a Reverted end is the automatic revert of a failure.
    step_failed: bool,
    /// Where the task is a watched plan's child: which plan, and what it runs for.
    child: Option<ChildOf>,
    /// For a child, the end last said of it.
    said: Option<TaskState>,
}

/// What a child task runs for in its plan.
struct ChildOf {
    plan: String,
    /// `step S`, or `step S, cluster C` for a fanned-out step's child.
    label: String,
}

fn style() -> ProgressStyle {
    ProgressStyle::with_template("{prefix:.bold} [{bar:24.cyan/blue}] {pos:>3}% {wide_msg}").expect("valid template").progress_chars("=> ")
}

/// How long a watched task may be unknown (submitted, not yet accepted) before the watch
/// gives up on it.
const UNKNOWN_GRACE: Duration = Duration::from_secs(30);
/// How long finding whether a task is a watched plan's child may wait for the task state.
const CHILD_LOOKUP_LIMIT: Duration = Duration::from_secs(30);

fn short(id: &str) -> &str {
    &id[..id.len().min(16)]
}

/// The bars: one per watched task, with each watched plan's children right under it.
struct Bars {
    multi: MultiProgress,
    bars: BTreeMap<String, Bar>,
    /// Per watched plan, the bar its next child goes under (its own, then its last child's).
    last_under: BTreeMap<String, ProgressBar>,
}

impl Bars {
    fn add(&mut self, kind: TaskKind, subject: &str, id: &str, child: Option<ChildOf>) -> &mut Bar {
        let bar = ProgressBar::new(100).with_style(style());
        let bar = match child.as_ref().and_then(|c| self.last_under.get(&c.plan)) {
            Some(after) => self.multi.insert_after(after, bar),
            None => self.multi.add(bar),
        };
        match &child {
            Some(c) => {
                bar.set_prefix(format!("  └ {kind} {subject} {} ({})", short(id), c.label));
                self.last_under.insert(c.plan.clone(), bar.clone());
            }
            None => {
                bar.set_prefix(format!("{kind} {subject} {}", short(id)));
                if kind == TaskKind::PLAN {
                    self.last_under.insert(id.to_owned(), bar.clone());
                }
            }
        }
        self.bars.entry(id.to_owned()).or_insert(Bar { bar, step_failed: false, child, said: None })
    }

    /// Leaves every bar on the screen as it is (a child's stays open while its plan runs).
    fn leave(&self) {
        for b in self.bars.values().filter(|b| !b.bar.is_finished()) {
            b.bar.abandon();
        }
    }

    /// Says a child's state on stderr where no bars are drawn (a child may end more than
    /// once: Succeeded, then Reverted by its plan's undo).
    fn child_line(&mut self, id: &str, kind: TaskKind, subject: &str, state: TaskState, detail: Option<&str>) {
        let Some(b) = self.bars.get_mut(id) else { return };
        b.said = Some(state);
        let Some(c) = b.child.as_ref() else { return };
        // On a terminal the child's bar says it.
        if !self.multi.is_hidden() {
            return;
        }
        let state = name(&state);
        let detail = detail.map(|d| format!(": {d}")).unwrap_or_default();
        self.multi.suspend(|| eprintln!("child {id} {kind} {subject} {state} (plan {}, {}){detail}", c.plan, c.label));
    }
}

/// What a child runs for, where it is a child of one of `plans` (`requested_by` gives who
/// asked for a plan: that decides whose children are its, [`claim_holds`]).
fn child_of_plans(plans: &BTreeSet<String>, requested_by: impl Fn(TaskId) -> Option<String>, snap: &TaskSnapshot) -> Option<ChildOf> {
    let (id, step, cluster) = claimed_plan(snap)?;
    let plan = id.to_string();
    if !plans.contains(&plan) || !claim_holds(&snap.requested_by, Some(&requested_by(id)?)) {
        return None;
    }
    Some(ChildOf { plan, label: runs_for(step, cluster) })
}

/// An end event as a bar says it: its name, and its message if any.
fn end_message(e: &ProgressEvent) -> String {
    format!("{}{}", name(&e.event), e.message.as_deref().map(|m| format!(": {m}")).unwrap_or_default())
}

/// Whether a task is over: in a final state, and not cancelled for a Revert still to come.
fn over(s: &TaskSnapshot) -> bool {
    s.state.is_terminal() && !s.revert_requested
}

/// Whether a Cancelled is not the task's end: the cancel of a Revert (of a running task),
/// whose undo follows, or a task gone on since. Its snapshot is acknowledged before the
/// event is published: after a catch-up the view holds it or a later one.
async fn reverted_next(live: &LiveState, e: &ProgressEvent) -> anyhow::Result<bool> {
    live.caught_up(CHILD_LOOKUP_LIMIT).await?;
    Ok(live.get(e.task_id.parse()?).is_some_and(|s| s.revert_requested || s.seq > e.seq))
}

/// The snapshot of the task an event is about, from the live view: an event other than
/// Accepted is published only once its snapshot is acknowledged, so after a catch-up the
/// view holds it; an Accepted leaves with its snapshot and may come first (`None`: ask again
/// at the task's next event).
async fn snapshot_of(live: &LiveState, e: &ProgressEvent) -> anyhow::Result<Option<TaskSnapshot>> {
    let id: TaskId = e.task_id.parse()?;
    if let Some(s) = live.get(id) {
        return Ok(Some(s));
    }
    if e.event == EventType::Accepted {
        return Ok(None);
    }
    live.caught_up(CHILD_LOOKUP_LIMIT).await?;
    Ok(live.get(id))
}

pub async fn run(conn: &Conn, ids: Vec<TaskId>) -> anyhow::Result<ExitCode> {
    let client = conn.command_client().await?;
    // Follow from now before reading the state, so nothing between the two is missed.
    let mut events = client.events(false).await?;
    // The state is read into a live view, where a plan's children are looked up as their
    // events come, and a Cancelled is told from the cancel of a Revert.
    let live = client.live_view().await?;
    let mut bars = Bars { multi: MultiProgress::with_draw_target(ProgressDrawTarget::stderr()), bars: BTreeMap::new(), last_under: BTreeMap::new() };
    let mut waiting: BTreeSet<String> = ids.iter().map(ToString::to_string).collect();
    let mut failed = false;
    let snapshots = client.snapshots().await?;
    // Watched plans (any state: a plan already over lists its children's ends too).
    let mut plans: BTreeSet<String> = snapshots.iter().filter(|s| s.kind == TaskKind::PLAN && waiting.contains(&s.task_id)).map(|s| s.task_id.clone()).collect();
    let mut ended_plans = Vec::new();
    for s in &snapshots {
        let watched = if ids.is_empty() { !over(s) } else { waiting.contains(&s.task_id) };
        if !watched {
            continue;
        }
        if over(s) && !ids.is_empty() {
            // Already over: report it and stop waiting for it.
            println!("{} {} {} {}", s.task_id, s.kind, s.subject, name(&s.state));
            failed |= !(s.state == TaskState::Succeeded || (s.state == TaskState::Reverted && s.error.is_none()));
            waiting.remove(&s.task_id);
            if s.kind == TaskKind::PLAN {
                ended_plans.push(s.task_id.clone());
            }
            continue;
        }
        let b = bars.add(s.kind, &s.subject, &s.task_id, None);
        b.bar.set_message(name(&s.state));
        b.step_failed = s.error.is_some();
    }
    // The children the watched plans have so far, oldest first.
    let plan_requested_by: BTreeMap<&String, &String> = snapshots.iter().filter(|s| plans.contains(&s.task_id)).map(|s| (&s.task_id, &s.requested_by)).collect();
    let mut known: Vec<(&TaskSnapshot, ChildOf)> = snapshots
        .iter()
        .filter(|s| !bars.bars.contains_key(&s.task_id))
        .filter_map(|s| Some((s, child_of_plans(&plans, |p| plan_requested_by.get(&p.to_string()).map(|r| (*r).clone()), s)?)))
        .collect();
    known.sort_by_key(|(s, _)| (s.created_at_ms, s.task_id.clone()));
    for (s, child) in known {
        let b = bars.add(s.kind, &s.subject, &s.task_id, Some(child));
        b.bar.set_message(name(&s.state));
        if s.state.is_terminal() {
            b.bar.set_position(100);
            bars.child_line(&s.task_id, s.kind, &s.subject, s.state, None);
        }
    }
    plans.retain(|p| !ended_plans.contains(p));
    if !ids.is_empty() && waiting.is_empty() {
        bars.leave();
        return Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS });
    }
    // Said once following has started (the bars are not drawn without a terminal): from
    // here on, every end is printed.
    // Through the bars, so that they are drawn again under it, not over it.
    let said = if ids.is_empty() {
        format!("watching {} running task(s) and every new one; Ctrl-C to stop", bars.bars.len())
    } else {
        format!("watching {} task(s) until they end", waiting.len())
    };
    bars.multi.suspend(|| eprintln!("{said}"));
    // A task just submitted may not be in the state yet: its events are awaited a while.
    let mut unknown: BTreeSet<String> = waiting.iter().filter(|w| !bars.bars.contains_key(*w)).cloned().collect();
    let unknown_until = tokio::time::Instant::now() + UNKNOWN_GRACE;
    // Tasks found not to be a watched plan's child.
    let mut not_children: BTreeSet<String> = BTreeSet::new();
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
        let first_seen = unknown.remove(&e.task_id);
        if first_seen && e.kind == TaskKind::PLAN {
            plans.insert(e.task_id.clone());
        }
        let is_child = bars.bars.get(&e.task_id).is_some_and(|b| b.child.is_some());
        if is_child {
            child_event(&mut bars, &e);
            continue;
        }
        if !ids.is_empty() && !waiting.contains(&e.task_id) {
            if !plans.is_empty()
                && !bars.bars.contains_key(&e.task_id)
                && !not_children.contains(&e.task_id)
            {
                // `None`: an Accepted before its snapshot; the task's next event asks again.
                if let Some(s) = snapshot_of(&live, &e).await? {
                    match child_of_plans(&plans, |p| live.follower().with(&p.to_string(), |plan| plan.requested_by.clone()), &s) {
                        Some(child) => {
                            bars.add(e.kind, &e.subject, &e.task_id, Some(child));
                            child_event(&mut bars, &e);
                        }
                        None => {
                            not_children.insert(e.task_id.clone());
                        }
                    }
                }
            }
            continue;
        }
        if !bars.bars.contains_key(&e.task_id) {
            if e.event.is_final() && !first_seen {
                continue;
            }
            bars.add(e.kind, &e.subject, &e.task_id, None);
        }
        let goes_on = e.event == EventType::Cancelled && reverted_next(&live, &e).await?;
        let b = bars.bars.get_mut(&e.task_id).expect("inserted above");
        update(b, &e);
        if goes_on {
            b.bar.set_message("Cancelled: its revert follows");
        } else if e.event.is_final() {
            let ok = e.event == EventType::Succeeded || (e.event == EventType::Reverted && !b.step_failed);
            failed |= !ok;
            b.bar.finish_with_message(end_message(&e));
            if plans.contains(&e.task_id) {
                children_ended(&mut bars, &live, &e.task_id).await?;
            }
            bars.multi.suspend(|| println!("{} {} {} {}", e.task_id, e.kind, e.subject, name(&e.event)));
            waiting.remove(&e.task_id);
            if !ids.is_empty() && waiting.is_empty() {
                break;
            }
        }
    }
    bars.leave();
    Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// A child's event: its bar moves; an end is said on stderr, and the bar stays open (its
/// plan may still revert it).
fn child_event(bars: &mut Bars, e: &ProgressEvent) {
    let Some(b) = bars.bars.get_mut(&e.task_id) else { return };
    update(b, e);
    if e.event.is_final() {
        b.bar.set_position(100);
        b.bar.set_message(end_message(e));
        if let Some(state) = e.event.state_after() {
            bars.child_line(&e.task_id, e.kind, &e.subject, state, e.message.as_deref());
        }
    }
}

/// At a plan's end, each of its children's last end, where its event has not come yet: a
/// child's event is published once its snapshot is acknowledged, and the plan, which waits
/// on that snapshot, may publish its own end first.
async fn children_ended(bars: &mut Bars, live: &LiveState, plan: &str) -> anyhow::Result<()> {
    live.caught_up(CHILD_LOOKUP_LIMIT).await?;
    let ids: Vec<String> = bars.bars.iter().filter(|(_, b)| b.child.as_ref().is_some_and(|c| c.plan == plan)).map(|(id, _)| id.clone()).collect();
    for id in ids {
        let Some(s) = live.get(id.parse()?) else { continue };
        let b = bars.bars.get_mut(&id).expect("listed above");
        if s.state.is_terminal() && b.said != Some(s.state) {
            b.bar.set_position(100);
            b.bar.set_message(name(&s.state));
            bars.child_line(&id, s.kind, &s.subject, s.state, None);
        }
    }
    Ok(())
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

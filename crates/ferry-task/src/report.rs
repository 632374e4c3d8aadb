//! One finished task printed for a person (the demos, scripts): each step's outcome, the
//! final event, and the last message when it did not succeed.

use crate::{EventType, ProgressEvent, TaskId};

/// Names in a line for a person: `a, b, c`, or `none` (not Rust's `["a", "b"]`).
pub fn listed<I: IntoIterator<Item = S>, S: AsRef<str>>(items: I) -> String {
    let names: Vec<String> = items.into_iter().map(|s| s.as_ref().to_owned()).collect();
    if names.is_empty() { "none".to_owned() } else { names.join(", ") }
}

/// How a task ended, for a person: its final event's name, or that none came.
pub fn ended(last: Option<EventType>) -> &'static str {
    last.map_or("without a final event", EventType::name)
}

/// Prints `evs` of task `id` as `<what> step <name> <outcome>` lines and the end; true when
/// the task succeeded.
pub fn print_outcome(what: &str, id: TaskId, evs: &[ProgressEvent]) -> bool {
    for e in evs.iter().filter(|e| e.event == EventType::StepSucceeded || e.event == EventType::StepFailed) {
        println!("{what} step {:<16} {}", e.step_name.clone().unwrap_or_default(), e.event);
    }
    let last = evs.last().map(|e| e.event);
    println!("{what} {id} ended {}", ended(last));
    if last != Some(EventType::Succeeded) {
        if let Some(e) = evs.iter().rev().find(|e| e.message.is_some()) {
            println!("{what}: {}", e.message.clone().unwrap_or_default());
        }
        return false;
    }
    true
}

/// The final event of `evs` and every failure or rejection on the way, on one line (for
/// assertion messages).
pub fn summary(evs: &[ProgressEvent]) -> String {
    let failures: Vec<String> = evs
        .iter()
        .filter(|e| matches!(e.event, EventType::StepFailed | EventType::RevertFailed | EventType::Rejected))
        .map(|e| format!("{} {}: {}", e.event, e.step_name.clone().unwrap_or_default(), e.message.clone().unwrap_or_default()))
        .collect();
    format!("{}; failures: {}", evs.last().map_or("no event", |e| e.event.name()), if failures.is_empty() { "none".to_owned() } else { failures.join("; ") })
}

/// Says that a test's prerequisite (`what`, with the script that installs it) is missing.
/// Outside CI the test then returns early with this note; in CI (`CI` set) it panics, so a
/// missing install fails the run instead of passing as a silent skip.
pub fn missing_prerequisite(what: &str) {
    assert!(std::env::var_os("CI").is_none(), "missing in CI: {what}; the test cannot run without it");
    println!("note: {what}; skipping");
}

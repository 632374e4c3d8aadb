//! A history checker: reads the progress events of many tasks (as `ferry.progress` holds
//! them, duplicates included) and reports every violation of the runtime's guarantees
//! instead of deduplicating it away: one seq carrying two different events (two runners
//! of one task, or a seq reused after a crash), a task that ended twice, and two tasks of
//! one subject running at once; and, against the task-state topic, an event without a
//! durable snapshot.

use std::collections::{BTreeMap, HashMap};

use crate::{EventType, ProgressEvent};

/// One broken guarantee, named with the task (and subject) it concerns; its `Display` is
/// a sentence for a person.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    /// Two different events carry one (task, seq).
    #[error("task {task}: seq {seq} carries two different events ({}, then {})", .events[0], .events[1])]
    SeqReused {
        /// The task.
        task: String,
        /// The seq.
        seq: i64,
        /// The two events, as `event step worker`.
        events: [String; 2],
    },
    /// A task has final events at more than one seq with no Reverting between them (it
    /// ended twice; a Revert of a settled task legitimately ends it again).
    #[error("task {task} ended more than once: {}", .finals.join("; "))]
    EndedTwice {
        /// The task.
        task: String,
        /// The final events, as `seq event worker`.
        finals: Vec<String>,
    },
    /// A task of a subject started a step while another task of that subject had started
    /// and not yet ended.
    #[error("subject {subject}: task {started} started a step while task {running} was running")]
    SubjectOverlap {
        /// The subject.
        subject: String,
        /// The task that was running.
        running: String,
        /// The task that started meanwhile.
        started: String,
    },
    /// Two workers ran steps of one task at the same time, as an effect log outside Kafka
    /// shows ([`check_effects`]).
    #[error("task {task} ran on two workers at once: {} and {}", .runs[0], .runs[1])]
    TwoRunners {
        /// The task.
        task: String,
        /// The two runs, as `step N on WORKER from..to` (microseconds).
        runs: [String; 2],
    },
    /// An event is durable but no snapshot of its task reached its seq (a task resumed
    /// from that snapshot would number a different event the same).
    #[error("task {task}: event seq {seq} is durable, its latest snapshot is {}", .snapshot_seq.map_or_else(|| "missing".to_owned(), |s| format!("at seq {s}")))]
    EventWithoutSnapshot {
        /// The task.
        task: String,
        /// The event's seq.
        seq: i64,
        /// The seq of the task's latest snapshot, if it has one.
        snapshot_seq: Option<i64>,
    },
}

/// Every event of `events` whose task's latest snapshot (`snapshot_seq`, as the compacted
/// the task-state topics hold it: task id to seq) has a lower seq, or that has no snapshot.
pub fn check_snapshots(events: &[ProgressEvent], snapshot_seq: &std::collections::HashMap<String, i64>) -> Vec<Violation> {
    let mut highest: BTreeMap<&str, i64> = BTreeMap::new();
    for e in events {
        // Seq 0: an event about a command that never became a task (no snapshot by design).
        if e.seq > 0 {
            let h = highest.entry(e.task_id.as_str()).or_insert(e.seq);
            *h = (*h).max(e.seq);
        }
    }
    highest
        .into_iter()
        .filter(|(task, seq)| snapshot_seq.get(*task).is_none_or(|s| s < seq))
        .map(|(task, seq)| Violation::EventWithoutSnapshot { task: task.to_owned(), seq, snapshot_seq: snapshot_seq.get(task).copied() })
        .collect()
}

/// Every pair of step runs of one task by two workers that overlap in time, from an
/// effect log ([`crate::effects`]). A run with no end (its worker killed, or fenced and its
/// step dropped) is left out: when it stopped is not known.
pub fn check_effects(effects: &[crate::effects::Effect]) -> Vec<Violation> {
    use crate::effects::Phase;
    // (task, step, worker) -> start of the run under way; task -> finished runs.
    let mut open: HashMap<(&str, i32, &str), i64> = HashMap::new();
    let mut runs: BTreeMap<&str, Vec<(i64, i64, i32, &str)>> = BTreeMap::new();
    for e in effects {
        let key = (e.task.as_str(), e.step, e.worker.as_str());
        match e.phase {
            Phase::Start => {
                open.insert(key, e.at_us);
            }
            Phase::End => {
                if let Some(start) = open.remove(&key) {
                    runs.entry(e.task.as_str()).or_default().push((start, e.at_us, e.step, e.worker.as_str()));
                }
            }
        }
    }
    let mut out = Vec::new();
    for (task, mut rs) in runs {
        rs.sort();
        for (i, a) in rs.iter().enumerate() {
            if let Some(b) = rs[i + 1..].iter().find(|b| b.3 != a.3 && b.0 < a.1) {
                let show = |r: &(i64, i64, i32, &str)| format!("step {} on {} from {} to {}", r.2, r.3, r.0, r.1);
                out.push(Violation::TwoRunners { task: task.to_owned(), runs: [show(a), show(b)] });
            }
        }
    }
    out
}

fn describe(e: &ProgressEvent) -> String {
    format!("{:?} {} {}", e.event, e.step_name.as_deref().unwrap_or("-"), e.worker)
}

/// Every violation in `events` (any order; repeated identical events are fine: a new
/// owner republishes a settled task's final event under its seq).
pub fn check(events: &[ProgressEvent]) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut by_seq: HashMap<(&str, i64), &ProgressEvent> = HashMap::new();
    let mut finals: BTreeMap<&str, BTreeMap<i64, &ProgressEvent>> = BTreeMap::new();
    let mut reverting: HashMap<&str, Vec<i64>> = HashMap::new();
    for e in events {
        match by_seq.get(&(e.task_id.as_str(), e.seq)) {
            // A final event is compared by its type only: a new owner republishes it from
            // the snapshot, which keeps the ending but not every detail (the step of a
            // Reverted, say) of the event as first written.
            Some(seen) if seen.event != e.event || (!e.event.is_final() && seen.step != e.step) => out.push(Violation::SeqReused {
                task: e.task_id.clone(),
                seq: e.seq,
                events: [describe(seen), describe(e)],
            }),
            Some(_) => {}
            None => {
                by_seq.insert((e.task_id.as_str(), e.seq), e);
            }
        }
        if e.event.is_final() {
            finals.entry(e.task_id.as_str()).or_default().insert(e.seq, e);
        }
        if e.event == EventType::Reverting {
            reverting.entry(e.task_id.as_str()).or_default().push(e.seq);
        }
    }
    for (task, f) in &finals {
        let seqs: Vec<i64> = f.keys().copied().collect();
        let reverted_between = |a: i64, b: i64| reverting.get(task).is_some_and(|r| r.iter().any(|s| a < *s && *s < b));
        if seqs.windows(2).any(|w| !reverted_between(w[0], w[1])) {
            out.push(Violation::EndedTwice {
                task: (*task).to_owned(),
                finals: f.iter().map(|(seq, e)| format!("{seq} {:?} {}", e.event, e.worker)).collect(),
            });
        }
    }
    out.extend(overlaps(events));
    out
}

/// Tasks of one subject whose runs overlap: each task runs from its first StepStarted to
/// its final event (time by the events' clocks, one machine's in tests).
fn overlaps(events: &[ProgressEvent]) -> Vec<Violation> {
    // subject -> task -> (first StepStarted, final)
    type Span = (Option<i64>, Option<i64>);
    let mut spans: BTreeMap<&str, BTreeMap<&str, Span>> = BTreeMap::new();
    for e in events {
        let span = spans.entry(e.subject.as_str()).or_default().entry(e.task_id.as_str()).or_default();
        if e.event == EventType::StepStarted {
            span.0 = Some(span.0.map_or(e.at_ms, |s| s.min(e.at_ms)));
        }
        if e.event.is_final() {
            span.1 = Some(span.1.map_or(e.at_ms, |f| f.min(e.at_ms)));
        }
    }
    let mut out = Vec::new();
    for (subject, tasks) in spans {
        let mut runs: Vec<(i64, i64, &str)> = tasks.iter().filter_map(|(t, (s, f))| Some((s.as_ref().copied()?, f.unwrap_or(i64::MAX), *t))).collect();
        runs.sort();
        for w in runs.windows(2) {
            let ((_, end, running), (start, _, started)) = (w[0], w[1]);
            // A task's next starts after the previous one's final event was produced.
            if start < end {
                out.push(Violation::SubjectOverlap { subject: subject.to_owned(), running: running.to_owned(), started: started.to_owned() });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TaskKind;

    fn ev(task: &str, subject: &str, seq: i64, event: EventType, step: Option<i32>, worker: &str, at: i64) -> ProgressEvent {
        ProgressEvent {
            task_id: task.into(),
            seq,
            event,
            kind: TaskKind::TEST,
            subject: subject.into(),
            worker: worker.into(),
            at_ms: at,
            trace_parent: None,
            step,
            step_name: step.map(|s| format!("step-{s}")),
            percent: None,
            message: None,
            code: None,
            transient: None,
            attempt: None,
            delay_ms: None,
        }
    }

    #[test]
    fn a_clean_history_has_no_violation_and_a_republished_final_event_is_fine() {
        let h = [
            ev("t1", "s", 1, EventType::Accepted, None, "a", 1),
            ev("t1", "s", 2, EventType::StepStarted, Some(1), "a", 2),
            ev("t1", "s", 3, EventType::StepSucceeded, Some(1), "a", 3),
            ev("t1", "s", 4, EventType::Succeeded, None, "a", 4),
            ev("t1", "s", 4, EventType::Succeeded, None, "b", 9),
            ev("t2", "s", 1, EventType::Accepted, None, "a", 2),
            ev("t2", "s", 2, EventType::StepStarted, Some(1), "b", 5),
            ev("t2", "s", 3, EventType::Cancelled, Some(1), "b", 6),
            // Republished from the snapshot, which does not keep the step.
            ev("t2", "s", 3, EventType::Cancelled, None, "c", 10),
        ];
        assert_eq!(check(&h), Vec::new());
    }

    #[test]
    fn each_violation_is_reported() {
        let h = [
            // t1 run twice at once: seq 3 carries two events, and it ends twice.
            ev("t1", "s", 1, EventType::Accepted, None, "a", 1),
            ev("t1", "s", 2, EventType::StepStarted, Some(1), "a", 2),
            ev("t1", "s", 3, EventType::StepSucceeded, Some(1), "a", 3),
            ev("t1", "s", 3, EventType::StepStarted, Some(2), "b", 3),
            ev("t1", "s", 8, EventType::Succeeded, None, "a", 10),
            ev("t1", "s", 9, EventType::Succeeded, None, "b", 11),
            // t2 of the same subject starts while t1 runs.
            ev("t2", "s", 1, EventType::Accepted, None, "a", 1),
            ev("t2", "s", 2, EventType::StepStarted, Some(1), "a", 5),
            ev("t2", "s", 3, EventType::Succeeded, None, "a", 12),
        ];
        let v = check(&h);
        assert!(v.iter().any(|v| matches!(v, Violation::SeqReused { task, seq: 3, .. } if task == "t1")), "{v:?}");
        assert!(v.iter().any(|v| matches!(v, Violation::EndedTwice { task, finals } if task == "t1" && finals.len() == 2)), "{v:?}");
        assert!(v.iter().any(|v| matches!(v, Violation::SubjectOverlap { running, started, .. } if running == "t1" && started == "t2")), "{v:?}");
        assert_eq!(v.len(), 3, "{v:?}");
    }

    #[test]
    fn a_revert_after_a_final_event_is_not_an_end_twice() {
        let h = [
            ev("t1", "s", 1, EventType::Accepted, None, "a", 1),
            ev("t1", "s", 2, EventType::Succeeded, None, "a", 2),
            ev("t1", "s", 3, EventType::Reverting, None, "a", 3),
            ev("t1", "s", 4, EventType::RevertFailed, None, "a", 4),
            ev("t1", "s", 5, EventType::Reverting, None, "b", 5),
            ev("t1", "s", 6, EventType::Reverted, None, "b", 6),
        ];
        assert_eq!(check(&h), Vec::new());
    }

    #[test]
    fn an_event_ahead_of_its_snapshot_is_reported() {
        let h = [
            ev("t1", "s", 1, EventType::Accepted, None, "a", 1),
            ev("t1", "s", 2, EventType::StepStarted, Some(1), "a", 2),
            ev("t2", "s", 1, EventType::Accepted, None, "a", 1),
            ev("t3", "s", 0, EventType::Rejected, None, "a", 1),
        ];
        let snaps: std::collections::HashMap<String, i64> = [("t1".to_owned(), 1), ("t2".to_owned(), 1)].into();
        assert_eq!(check_snapshots(&h, &snaps), vec![Violation::EventWithoutSnapshot { task: "t1".into(), seq: 2, snapshot_seq: Some(1) }]);
    }
}

#[cfg(test)]
mod effect_tests {
    use super::*;
    use crate::effects::{Effect, Phase};

    fn fx(task: &str, step: i32, worker: &str, phase: Phase, at_us: i64) -> Effect {
        Effect { task: task.into(), step, worker: worker.into(), phase, at_us }
    }

    #[test]
    fn a_takeover_after_the_first_run_ended_is_fine_and_an_overlap_is_reported() {
        let clean = [
            fx("t1", 1, "a", Phase::Start, 10),
            fx("t1", 1, "a", Phase::End, 20),
            // Killed mid-step: no end, left out.
            fx("t1", 2, "a", Phase::Start, 21),
            fx("t1", 2, "b", Phase::Start, 40),
            fx("t1", 2, "b", Phase::End, 50),
        ];
        assert_eq!(check_effects(&clean), Vec::new());
        let twice = [
            fx("t1", 2, "a", Phase::Start, 21),
            fx("t1", 2, "b", Phase::Start, 40),
            fx("t1", 2, "a", Phase::End, 45),
            fx("t1", 2, "b", Phase::End, 50),
        ];
        let v = check_effects(&twice);
        assert!(matches!(&v[..], [Violation::TwoRunners { task, .. }] if task == "t1"), "{v:?}");
    }
}

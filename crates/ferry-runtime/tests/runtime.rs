//! The runtime's guarantees, end to end through a real Kafka-protocol broker: the embedded
//! mock cluster and, where it differs, a tansu process.

mod support;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use ferry_runtime::protocol::{Bytes, CommandAction, CommandEnvelope, now_ms};
use ferry_runtime::publisher::DLQ_REASON;
use ferry_runtime::testkind::TestTaskSpec;
use ferry_runtime::{EventType, SubmitOptions, TaskId, TaskKind, TaskState};
use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, OwnedHeaders};
use support::*;

async fn three_steps_succeed(broker: TestBroker) {
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let (stop, worker) = broker.spawn_worker(broker.worker_options());
    let id = submit(&client, "cluster-a", &TestTaskSpec::steps(3)).await;
    let evs = until_final(&mut events, id).await;
    use EventType::*;
    assert_eq!(
        types(&evs),
        vec![Accepted, StepStarted, StepSucceeded, StepStarted, StepSucceeded, StepStarted, StepSucceeded, Succeeded]
    );
    let seqs: Vec<i64> = evs.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=8).collect::<Vec<_>>(), "events ordered by sequence number");
    let snap = client.snapshot(id).await.unwrap().expect("snapshot");
    assert_eq!(snap.state, TaskState::Succeeded);
    assert!(snap.state.is_terminal());
    assert_eq!(snap.seq, 8);
    assert_eq!(snap.journal.len(), 3);
    stop.cancel();
    worker.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_step_task_succeeds_in_order_embedded() {
    three_steps_succeed(TestBroker::embedded()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_step_task_succeeds_in_order_tansu() {
    three_steps_succeed(TestBroker::tansu().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_at_any_step_reverts_the_started_steps_in_reverse() {
    let broker = TestBroker::embedded();
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let (stop, worker) = broker.spawn_worker(broker.worker_options());
    for k in 1..=4 {
        let spec = TestTaskSpec { fail_at: Some(k), ..TestTaskSpec::steps(4) };
        let id = submit(&client, &format!("s{k}"), &spec).await;
        let evs = until_final(&mut events, id).await;
        let failed = evs.iter().find(|e| e.event == EventType::StepFailed).expect("StepFailed");
        assert_eq!(failed.step, Some(k));
        assert_eq!(failed.code.as_deref(), Some("INJECTED_FAILURE"));
        assert_eq!(failed.transient, Some(false));
        let reverted: Vec<i32> = evs.iter().filter(|e| e.event == EventType::StepReverted).filter_map(|e| e.step).collect();
        // The failed step started and may have had effects, so its undo runs too.
        assert_eq!(reverted, (1..=k).rev().collect::<Vec<_>>(), "k = {k}");
        assert_eq!(evs.last().unwrap().event, EventType::Reverted);
        let snap = client.snapshot(id).await.unwrap().unwrap();
        assert_eq!(snap.state, TaskState::Reverted);
        assert_eq!(snap.error.as_ref().map(|e| e.code.as_str()), Some("INJECTED_FAILURE"));
    }
    stop.cancel();
    worker.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_partial_leaves_finished_steps_and_transient_errors_retry() {
    let broker = TestBroker::embedded();
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let (stop, worker) = broker.spawn_worker(broker.worker_options());
    let spec = TestTaskSpec { fail_at: Some(2), ..TestTaskSpec::steps(3) };
    let opts = SubmitOptions { keep_partial: true, ..SubmitOptions::default() };
    let id = client.submit(TaskKind::TEST, "keep", &spec, opts).await.unwrap();
    let evs = until_final(&mut events, id).await;
    assert_eq!(evs.last().unwrap().event, EventType::Failed);
    assert!(!types(&evs).contains(&EventType::StepReverted));

    let spec = TestTaskSpec { fail_transient: 2, ..TestTaskSpec::steps(1) };
    let id = submit(&client, "flaky", &spec).await;
    let evs = until_final(&mut events, id).await;
    let retries: Vec<i32> = evs.iter().filter(|e| e.event == EventType::Retrying).filter_map(|e| e.attempt).collect();
    assert_eq!(retries, vec![2, 3]);
    assert_eq!(evs.last().unwrap().event, EventType::Succeeded);

    let spec = TestTaskSpec { fail_transient: 100, ..TestTaskSpec::steps(1) };
    let id = submit(&client, "hopeless", &spec).await;
    let evs = until_final(&mut events, id).await;
    let failed = evs.iter().find(|e| e.event == EventType::StepFailed).unwrap();
    assert_eq!(failed.attempt, Some(6), "first attempt + 5 retries");
    assert!(failed.message.as_deref().unwrap().contains("gave up after 6 attempts"));
    assert_eq!(evs.last().unwrap().event, EventType::Reverted);
    stop.cancel();
    worker.await.unwrap();
}

/// An undo retries transient errors for its step's `undo_patience`, not the run's
/// `max_retries`: a revert after an outage outlasts the outage the run gave up on. The
/// test kind's run gives up after 6 attempts and its undo waits at most 1 s in all here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undo_retries_past_the_runs_budget_and_gives_up_only_after_its_patience() {
    let broker = TestBroker::embedded();
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let (stop, worker) = broker.spawn_worker(broker.worker_options());

    // Each undo fails 7 times (a run would have given up after 5 retries), then succeeds.
    let spec = TestTaskSpec { fail_at: Some(2), undo_fail_transient: 7, ..TestTaskSpec::steps(2) };
    let id = submit(&client, "patient", &spec).await;
    let evs = until_final(&mut events, id).await;
    let failed_at = evs.iter().position(|e| e.event == EventType::StepFailed).expect("StepFailed");
    for step in [1, 2] {
        let retries: Vec<i32> = evs[failed_at..]
            .iter()
            .filter(|e| e.event == EventType::Retrying && e.step == Some(step))
            .filter_map(|e| e.attempt)
            .collect();
        assert_eq!(retries, (2..=8).collect::<Vec<_>>(), "undo of step {step}");
    }
    let reverted: Vec<i32> = evs.iter().filter(|e| e.event == EventType::StepReverted).filter_map(|e| e.step).collect();
    assert_eq!(reverted, vec![2, 1]);
    assert_eq!(evs.last().unwrap().event, EventType::Reverted, "{:?}", types(&evs));

    // An undo that never succeeds ends RevertFailed once its patience is spent, saying so.
    let spec = TestTaskSpec { fail_at: Some(1), undo_fail_transient: i32::MAX, ..TestTaskSpec::steps(1) };
    let id = submit(&client, "hopeless-undo", &spec).await;
    let evs = until_final(&mut events, id).await;
    let last = evs.last().unwrap();
    assert_eq!(last.event, EventType::RevertFailed, "{:?}", types(&evs));
    assert_eq!(last.code.as_deref(), Some("INJECTED_TRANSIENT"));
    assert!(last.attempt.unwrap() > 6, "more attempts than a run gets: {:?}", last.attempt);
    let message = last.message.as_deref().unwrap();
    assert!(message.contains("undo patience 1s"), "{message}");
    let snap = client.snapshot(id).await.unwrap().unwrap();
    assert_eq!(snap.state, TaskState::RevertFailed);
    stop.cancel();
    worker.await.unwrap();
}

/// Sends a Start under a new id with an idempotency key another task already has (a
/// producer that does not derive ids from keys); returns the new id.
async fn send_under_another_id(client: &ferry_runtime::Client, subject: &str, key: &str, spec: &TestTaskSpec) -> TaskId {
    let other = TaskId::new();
    let env = CommandEnvelope {
        task_id: other.to_string(),
        kind: TaskKind::TEST,
        action: CommandAction::Start,
        subject: subject.into(),
        idempotency_key: Some(key.into()),
        requested_by: "test".into(),
        created_at_ms: now_ms(),
        deadline_ms: None,
        keep_partial: false,
        reason: None,
        spec: Bytes(client.registry().encode(spec).unwrap()),
        signal: None,
    };
    client.send(&env, None).await.unwrap();
    other
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_command_makes_one_task() {
    let broker = TestBroker::embedded();
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    // All three commands are on the topic before the worker starts, so the duplicates can
    // meet the task while it is still queued (one batch), not only once it runs.
    let opts = SubmitOptions { idempotency_key: Some("create-a-once".into()), ..SubmitOptions::default() };
    let a = client.submit(TaskKind::TEST, "dup", &TestTaskSpec::steps(2), opts.clone()).await.unwrap();
    let b = client.submit(TaskKind::TEST, "dup", &TestTaskSpec::steps(2), opts).await.unwrap();
    assert_eq!(a, b, "same key, same task id");
    // A producer that does not derive ids from keys: another id with the same key.
    let other = send_under_another_id(&client, "dup", "create-a-once", &TestTaskSpec::steps(2)).await;
    let (stop, worker) = broker.spawn_worker(broker.worker_options());
    let rejected = until_final(&mut events, other).await;
    assert_eq!(rejected.last().unwrap().event, EventType::Rejected);
    assert!(rejected.last().unwrap().message.as_deref().unwrap().contains(&format!("duplicate of task {a}")));
    let mut events = client.events(true).await.unwrap();
    let evs = until_final(&mut events, a).await;
    assert_eq!(evs.iter().filter(|e| e.event == EventType::Accepted).count(), 1);
    assert_eq!(evs.last().unwrap().event, EventType::Succeeded);
    stop.cancel();
    worker.await.unwrap();
}

/// A duplicate of a running task (the same command again, and another id with its
/// idempotency key) leaves the task's durable state where the runner put it. Before, the
/// worker republished the snapshot the runner had started from: the task-state topic got
/// a seq-1 (Accepted) record after the runner's seq-3 one while step 1 ran; had the worker
/// crashed then and the topic been compacted, the next owner would have run the step again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_of_a_running_task_leaves_its_state_where_the_runner_put_it() {
    let broker = TestBroker::embedded();
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let (stop, worker) = broker.spawn_worker(broker.worker_options());
    let opts = SubmitOptions { idempotency_key: Some("running-once".into()), ..SubmitOptions::default() };
    // A long first step: nothing the runner writes overwrites a rolled-back state before
    // the test reads it.
    let spec = TestTaskSpec { step_ms: 8000, ..TestTaskSpec::steps(1) };
    let id = client.submit(TaskKind::TEST, "dup-running", &spec, opts.clone()).await.unwrap();
    let started = until_event(&mut events, id, EventType::StepStarted).await;
    let seq = started.last().unwrap().seq;
    assert_eq!(client.submit(TaskKind::TEST, "dup-running", &spec, opts).await.unwrap(), id);
    // Another id with the same key: rejected. Its Rejected event comes after the duplicate
    // above was handled (one subject, one partition, in order).
    let other = send_under_another_id(&client, "dup-running", "running-once", &spec).await;
    assert_eq!(until_final(&mut events, other).await.last().unwrap().event, EventType::Rejected);
    // The task's records on the task-state topic, in order: their seqs never go back (the
    // last one is what compaction keeps and a new owner resumes from; readers that keep
    // the highest seq do not show a step back).
    let key = id.to_string();
    let seqs: Vec<(i64, TaskState)> = client
        .read_to_end(&broker.topics.task_state(TaskKind::TEST).name)
        .await
        .unwrap()
        .into_iter()
        .filter(|(k, _)| k.as_deref() == Some(key.as_bytes()))
        .filter_map(|(_, p)| client.registry().decode::<ferry_runtime::TaskSnapshot>(&p).ok())
        .map(|s| (s.seq, s.state))
        .collect();
    assert!(seqs.windows(2).all(|w| w[0].0 <= w[1].0), "the task's state went back: {seqs:?}");
    assert!(seqs.last().is_some_and(|(s, _)| *s >= seq), "{seqs:?}");
    let evs = until_final(&mut events, id).await;
    assert_eq!(evs.last().unwrap().event, EventType::Succeeded);
    stop.cancel();
    worker.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_rejected_or_dead_lettered_and_the_worker_goes_on() {
    let broker = TestBroker::embedded();
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let (stop, worker) = broker.spawn_worker(broker.worker_options());
    let topic = broker.topics.command(TaskKind::TEST).name.clone();
    let hdrs = || OwnedHeaders::new();
    client.send_raw(&topic, Some(b"x"), b"\xde\xad\xbe\xef garbage", hdrs()).await.unwrap();
    client.send_raw(&topic, Some(b"x"), &[0, 0, 0, 0, 0x7f, 2, 3], hdrs()).await.unwrap();
    // A valid envelope whose spec fails validation.
    let bad = TestTaskSpec::steps(0);
    let invalid = submit(&client, "x", &bad).await;
    // A valid envelope whose spec does not decode.
    let undecodable = client.submit_encoded(TaskKind::TEST, "x", vec![0, 0, 0, 0, 4, 0xff], SubmitOptions::default()).await.unwrap();
    let ok = submit(&client, "x", &TestTaskSpec::steps(1)).await;

    let evs = until_final(&mut events, invalid).await;
    assert_eq!(evs.last().unwrap().event, EventType::Rejected);
    assert_eq!(evs.last().unwrap().message.as_deref(), Some("invalid test spec: steps must be 1 to 100, got 0"));
    let evs = until_final(&mut events, undecodable).await;
    assert_eq!(evs.last().unwrap().event, EventType::Rejected);
    assert!(evs.last().unwrap().message.as_deref().unwrap().contains("does not decode"));
    let evs = until_final(&mut events, ok).await;
    assert_eq!(evs.last().unwrap().event, EventType::Succeeded, "the worker went on");
    let snap = client.snapshot(invalid).await.unwrap().unwrap();
    assert_eq!(snap.state, TaskState::Rejected);

    // Three dead letters: garbage, unknown schema id, undecodable spec; original bytes kept.
    let dlq = broker.topics.dead_letter().name.clone();
    let reader: BaseConsumer = broker.kafka.reader().create().unwrap();
    reader.subscribe(&[&dlq]).unwrap();
    let mut reasons = Vec::new();
    let mut payloads = Vec::new();
    let deadline = std::time::Instant::now() + WAIT;
    while reasons.len() < 3 && std::time::Instant::now() < deadline {
        if let Some(Ok(m)) = reader.poll(Duration::from_millis(200)) {
            let h = m.headers().unwrap();
            let reason = h.iter().find(|h| h.key == DLQ_REASON).and_then(|h| h.value).map(|v| String::from_utf8_lossy(v).into_owned());
            reasons.push(reason.unwrap());
            payloads.push(m.payload().unwrap().to_vec());
        }
    }
    assert_eq!(reasons.len(), 3, "{reasons:?}");
    assert!(reasons[0].contains("unknown magic byte 0xde"), "{}", reasons[0]);
    assert!(reasons[1].contains("unknown schema id 127"), "{}", reasons[1]);
    assert!(reasons[2].contains("does not decode"), "{}", reasons[2]);
    assert_eq!(payloads[0], b"\xde\xad\xbe\xef garbage");
    stop.cancel();
    worker.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_a_blocked_task_and_revert_undoes_it() {
    let broker = TestBroker::embedded();
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let (stop, worker) = broker.spawn_worker(broker.worker_options());
    let spec = TestTaskSpec { block_at: Some(2), ..TestTaskSpec::steps(3) };
    let id = submit(&client, "blocked", &spec).await;
    let evs = until_event(&mut events, id, EventType::StepProgress).await;
    assert_eq!(evs.last().unwrap().step, Some(2));
    client.cancel(id).await.unwrap();
    let evs = until_final(&mut events, id).await;
    assert_eq!(types(&evs), vec![EventType::CancelRequested, EventType::Cancelled]);
    let snap = client.snapshot(id).await.unwrap().unwrap();
    assert_eq!(snap.state, TaskState::Cancelled);
    client.revert(id).await.unwrap();
    let evs = until_final(&mut events, id).await;
    assert_eq!(types(&evs), vec![EventType::Reverting, EventType::StepReverted, EventType::StepReverted, EventType::Reverted]);
    let steps: Vec<i32> = evs.iter().filter_map(|e| e.step).collect();
    assert_eq!(steps, vec![2, 1]);
    assert_eq!(client.snapshot(id).await.unwrap().unwrap().state, TaskState::Reverted);

    // Revert of a running task: cancel, then undo.
    let id = submit(&client, "blocked-2", &spec).await;
    until_event(&mut events, id, EventType::StepProgress).await;
    client.revert(id).await.unwrap();
    let evs = events.until(id, WAIT, |e| e.event == EventType::Reverted).await.unwrap();
    assert_eq!(
        types(&evs),
        vec![EventType::CancelRequested, EventType::Cancelled, EventType::Reverting, EventType::StepReverted, EventType::StepReverted, EventType::Reverted]
    );
    stop.cancel();
    worker.await.unwrap();
}

/// A running task keeps at most `MAX_SIGNALS` Signals (they ride in its snapshot): the next
/// is refused with a Rejected event naming the limit, as for a queued task, and the task
/// goes on; it is not dropped with a log line only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_past_the_limit_to_a_running_task_is_refused_with_the_reason() {
    let broker = TestBroker::embedded();
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let (stop, worker) = broker.spawn_worker(broker.worker_options());
    let spec = TestTaskSpec { block_at: Some(1), ..TestTaskSpec::steps(2) };
    let id = submit(&client, "signalled", &spec).await;
    until_event(&mut events, id, EventType::StepProgress).await;
    let max = ferry_runtime::TaskSnapshot::MAX_SIGNALS;
    for _ in 0..max {
        client.signal(id, "note", None).await.unwrap();
    }
    let mut seen = 0;
    events.until(id, WAIT, |e| { seen += usize::from(e.event == EventType::Signalled); seen == max }).await.unwrap();
    client.signal(id, "note", Some("one too many".into())).await.unwrap();
    let evs = events.until(id, WAIT, |e| e.event == EventType::Rejected).await.unwrap();
    let refused = evs.last().unwrap();
    assert_eq!(refused.seq, 0, "an event beside the task's own sequence: {refused:?}");
    assert!(refused.message.as_deref().unwrap_or("").contains(&format!("has received {max} signals")), "{refused:?}");
    let snap = client.snapshot(id).await.unwrap().unwrap();
    assert_eq!((snap.state, snap.signals.len()), (TaskState::Running, max), "the task goes on with the signals it kept");
    client.cancel(id).await.unwrap();
    until_final(&mut events, id).await;
    stop.cancel();
    worker.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_task_finishes_after_a_ten_second_broker_outage() {
    let broker = TestBroker::embedded();
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let (stop, worker) = broker.spawn_worker(broker.worker_options());
    let spec = TestTaskSpec { step_ms: 200, ..TestTaskSpec::steps(3) };
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(submit(&client, &format!("outage-{i}"), &spec).await);
    }
    until_event(&mut events, ids[0], EventType::StepSucceeded).await;
    let mock = broker.embedded.as_ref().unwrap();
    mock.all_down().unwrap();
    // The fault itself: ten seconds without any broker (this is the scenario, not a wait).
    tokio::time::sleep(Duration::from_secs(10)).await;
    mock.all_up().unwrap();
    let mut finished: HashMap<String, EventType> = HashMap::new();
    let want: HashSet<String> = ids.iter().map(ToString::to_string).collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while finished.len() < ids.len() {
        let ev = tokio::time::timeout_at(deadline, events.next()).await.expect("all tasks finish").unwrap();
        if want.contains(&ev.task_id) && ev.event.is_final() {
            finished.insert(ev.task_id.clone(), ev.event);
        }
    }
    assert!(finished.values().all(|e| *e == EventType::Succeeded), "{finished:?}");
    stop.cancel();
    worker.await.unwrap();
}

/// The seq of every task's latest snapshot on the task-state topic.
/// Events without a snapshot at least as far (`history::check_snapshots`), once a reader
/// of the task-state topics has had 30 s to read them: tansu 0.6 reports the base offset
/// of a partition's last batch as its end (docs/BENCHMARKS.md), so a reader that stops at
/// the end it reports can miss that batch's snapshots. A snapshot that is not there by
/// the deadline is reported.
async fn snapshot_violations(client: &ferry_runtime::Client, history: &[ferry_runtime::ProgressEvent]) -> Vec<ferry_runtime::history::Violation> {
    let live = client.live_view().await.unwrap();
    let check = |f: &ferry_runtime::live::Follower<ferry_runtime::TaskSnapshot>| {
        let seqs: HashMap<String, i64> = f.scan(|all| all.map(|s| (s.task_id.clone(), s.seq)).collect());
        ferry_runtime::history::check_snapshots(history, &seqs)
    };
    match live.follower().wait_for(Duration::from_secs(30), |f| check(f).is_empty().then_some(())).await {
        Ok(()) => Vec::new(),
        Err(_) => check(live.follower()),
    }
}

async fn two_instances_share_and_lose_nothing(broker: TestBroker) {
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    // The steps record their runs outside Kafka: two workers running one task show there.
    let dir = tempfile::tempdir().unwrap();
    let effects = dir.path().join("effects");
    let (stop_a, worker_a) = broker.spawn_worker_recording(broker.worker_options(), Some(&effects));
    // Steps long enough (40 subjects x ~4 tasks x 3 steps x 200 ms, about 2.4 s) that both
    // rebalances land while tasks run, however far behind the event reader is.
    let spec = TestTaskSpec { step_ms: 200, ..TestTaskSpec::steps(3) };
    let mut ids = Vec::new();
    for i in 0..150 {
        ids.push(submit(&client, &format!("subject-{}", i % 40), &spec).await);
    }
    let want: HashSet<String> = ids.iter().map(ToString::to_string).collect();
    let mut finished: HashMap<String, EventType> = HashMap::new();
    let mut workers: HashSet<String> = HashSet::new();
    let mut b = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    let mut stopped_a = false;
    let mut history = Vec::new();
    while finished.len() < ids.len() {
        let ev = tokio::time::timeout_at(deadline, events.next()).await.expect("all tasks finish").unwrap();
        if !want.contains(&ev.task_id) {
            continue;
        }
        history.push(ev.clone());
        workers.insert(ev.worker.clone());
        if ev.event.is_final() {
            finished.insert(ev.task_id.clone(), ev.event);
        }
        // A second instance joins once work has begun (rebalance), later the first leaves
        // (another rebalance).
        if ev.event == EventType::StepSucceeded && b.is_none() {
            b = Some(broker.spawn_worker_recording(broker.worker_options(), Some(&effects)));
        }
        if finished.len() == 40 && !stopped_a {
            stopped_a = true;
            stop_a.cancel();
        }
    }
    assert!(finished.values().all(|e| *e == EventType::Succeeded), "{finished:?}");
    assert!(workers.len() >= 2, "both instances worked: {workers:?}");
    // Tasks queued behind others on shared subjects while partitions moved: no task ran
    // twice at once, none ended twice, and no two tasks of a subject overlapped.
    let mut violations = ferry_runtime::history::check(&history);
    violations.extend(snapshot_violations(&client, &history).await);
    let runs = ferry_runtime::effects::EffectLog::read(&effects).unwrap();
    assert!(runs.len() >= 150 * 3 * 2, "every step run recorded: {} lines", runs.len());
    violations.extend(ferry_runtime::history::check_effects(&runs));
    assert!(violations.is_empty(), "{} violations of the runtime's guarantees:\n{violations:#?}", violations.len());
    worker_a.await.unwrap();
    let (stop_b, worker_b) = b.unwrap();
    stop_b.cancel();
    worker_b.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_partitions_and_a_rebalance_loses_nothing_embedded() {
    two_instances_share_and_lose_nothing(TestBroker::embedded()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_partitions_and_a_rebalance_loses_nothing_tansu() {
    two_instances_share_and_lose_nothing(TestBroker::tansu().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_context_rides_from_the_command_through_every_event_and_probes_report() {
    let broker = TestBroker::embedded();
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let mut opts = broker.worker_options();
    opts.http = Some("127.0.0.1:0".parse().unwrap());
    let (token, worker, handle) = spawn_with_handle(opts).await;
    let trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_owned();
    let opts = SubmitOptions { trace_parent: Some(trace.clone()), ..SubmitOptions::default() };
    let spec = TestTaskSpec { fail_transient: 1, ..TestTaskSpec::steps(2) };
    let id = client.submit(TaskKind::TEST, "traced", &spec, opts).await.unwrap();
    let evs = until_final(&mut events, id).await;
    assert!(evs.iter().all(|e| e.trace_parent.as_deref() == Some(trace.as_str())));
    assert_eq!(client.snapshot(id).await.unwrap().unwrap().trace_parent.as_deref(), Some(trace.as_str()));

    // The probes: ready after the assignment; metrics count what happened.
    let addr = handle.http.unwrap();
    let get = |path: &'static str| async move {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    };
    assert!(get("/healthz").await.starts_with("HTTP/1.0 200"));
    assert!(get("/readyz").await.starts_with("HTTP/1.0 200"));
    let metrics = get("/metrics").await;
    assert!(metrics.contains(r#"ferry_task_events_total{kind="test",event="Succeeded"} 1"#), "{metrics}");
    assert!(metrics.contains(r#"ferry_step_retries_total{kind="test",step="step-1"} 1"#), "{metrics}");
    assert!(metrics.contains("ferry_step_duration_seconds_count"), "{metrics}");
    token.cancel();
    worker.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_queued_behind_a_cancelled_one_run_next() {
    let broker = TestBroker::embedded();
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let (stop, worker) = broker.spawn_worker(broker.worker_options());
    let spec = TestTaskSpec { block_at: Some(1), ..TestTaskSpec::steps(2) };
    let ids = [submit(&client, "lane", &spec).await, submit(&client, "lane", &spec).await, submit(&client, "lane", &spec).await];
    for id in ids {
        // Each blocks in turn; cancelling it frees the lane for the next.
        until_event(&mut events, id, EventType::StepProgress).await;
        client.cancel(id).await.unwrap();
        assert_eq!(until_final(&mut events, id).await.last().unwrap().event, EventType::Cancelled);
    }
    stop.cancel();
    worker.await.unwrap();
}

/// The zig-zag varint of a non-negative Avro long.
fn varint(n: i64) -> Vec<u8> {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    let mut out = Vec::new();
    loop {
        let b = (z & 0x7f) as u8;
        z >>= 7;
        if z == 0 {
            out.push(b);
            return out;
        }
        out.push(b | 0x80);
    }
}

/// Records of any size and Avro length bombs, read by two workers of one kind on one
/// partition: the oversized record becomes a dead letter that fits (its head, size and
/// digest), the bomb a dead letter with its bytes, the oversized command and the oversized
/// subject are Rejected with the reason, and both workers go on to the next task.
async fn records_of_any_size_and_length_bombs(broker: TestBroker) {
    use ferry_runtime::publisher::{DLQ_VALUE_BYTES, DLQ_VALUE_SHA256};
    use sha2::Digest;
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let (stop_a, worker_a) = broker.spawn_worker(broker.worker_options());
    let (stop_b, worker_b) = broker.spawn_worker(broker.worker_options());
    let topic = broker.topics.command(TaskKind::TEST).name.clone();
    let subject = "poison";

    // Before: a 999,900-byte record made both workers exit (its dead letter, with the
    // reason headers added, exceeded the producer's limit: MessageSizeTooLarge).
    let oversized: Vec<u8> = (0..999_900u32).map(|i| (i % 253) as u8).collect();
    client.send_raw(&topic, Some(subject.as_bytes()), &oversized, OwnedHeaders::new()).await.unwrap();
    // An envelope whose first field, the task id, claims 500 million bytes.
    let bomb = [&[0, 0, 0, 0, 1][..], &varint(500_000_000)].concat();
    client.send_raw(&topic, Some(subject.as_bytes()), &bomb, OwnedHeaders::new()).await.unwrap();
    // A well-formed command whose spec makes the record bigger than a command may be.
    let heavy = client.submit_encoded(TaskKind::TEST, subject, vec![7; 300 * 1024], SubmitOptions::default()).await.unwrap();
    // A subject longer than any subject may be (its key equals it).
    let long = "s".repeat(600);
    let spec = client.registry().encode(&TestTaskSpec::steps(1)).unwrap();
    let named = client.submit_encoded(TaskKind::TEST, &long, spec, SubmitOptions::default()).await.unwrap();
    let ok = submit(&client, subject, &TestTaskSpec::steps(1)).await;

    let evs = until_final(&mut events, heavy).await;
    let last = evs.last().unwrap();
    assert_eq!(last.event, EventType::Rejected);
    assert!(last.message.as_deref().unwrap().contains("a command may be at most 262144 bytes"), "{:?}", last.message);
    let evs = until_final(&mut events, named).await;
    let last = evs.last().unwrap();
    assert_eq!(last.event, EventType::Rejected);
    assert_eq!(last.message.as_deref(), Some("subject is 600 bytes; the limit is 512"));
    assert_eq!(until_final(&mut events, ok).await.last().unwrap().event, EventType::Succeeded, "the workers went on");

    let reader: BaseConsumer = broker.kafka.reader().create().unwrap();
    reader.subscribe(&[&broker.topics.dead_letter().name]).unwrap();
    let mut letters = Vec::new();
    let deadline = std::time::Instant::now() + WAIT;
    while letters.len() < 2 {
        assert!(std::time::Instant::now() < deadline, "dead letters so far: {}", letters.len());
        if let Some(Ok(m)) = reader.poll(Duration::from_millis(200)) {
            let h = m.headers().unwrap();
            let header = |k: &str| h.iter().find(|h| h.key == k).and_then(|h| h.value).map(|v| String::from_utf8_lossy(v).into_owned());
            letters.push((m.payload().unwrap_or_default().to_vec(), header(DLQ_REASON).unwrap(), header(DLQ_VALUE_BYTES), header(DLQ_VALUE_SHA256)));
        }
    }
    let (head, reason, bytes, sha) = &letters[0];
    assert_eq!(head[..], oversized[..ferry_runtime::limits::DEAD_LETTER_HEAD_BYTES], "the letter keeps the record's head");
    assert_eq!(bytes.as_deref(), Some("999900"));
    assert_eq!(sha.as_deref(), Some(&*format!("{:x}", sha2::Sha256::digest(&oversized))));
    assert!(reason.contains("undecodable"), "{reason}");
    let (payload, reason, bytes, _) = &letters[1];
    assert_eq!(payload, &bomb, "a small record keeps every byte");
    assert_eq!(bytes, &None);
    assert!(reason.contains("500000000"), "{reason}");

    assert!(!worker_a.is_finished() && !worker_b.is_finished(), "both workers still run");
    stop_a.cancel();
    stop_b.cancel();
    worker_a.await.unwrap();
    worker_b.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_any_size_and_length_bombs_stop_no_worker_embedded() {
    records_of_any_size_and_length_bombs(TestBroker::embedded()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_any_size_and_length_bombs_stop_no_worker_tansu() {
    records_of_any_size_and_length_bombs(TestBroker::tansu().await).await;
}

/// A write the broker never acknowledges (an outage longer than the worker's
/// `message.timeout.ms`) pauses its task: the same write is made again once the broker is
/// back, the task goes on, and the next task of its subject waits for it. Before, the task
/// was left unfinished and the next task of its subject started at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_times_out_pauses_its_task_and_its_subject_keeps_order() {
    let broker = TestBroker::embedded();
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let mut opts = broker.worker_options();
    opts.kafka.extra.push(("message.timeout.ms".into(), "2000".into()));
    let (stop, worker) = broker.spawn_worker(opts);
    let first = submit(&client, "paused", &TestTaskSpec { step_ms: 1500, ..TestTaskSpec::steps(3) }).await;
    let second = submit(&client, "paused", &TestTaskSpec::steps(1)).await;
    let mut history = until_event(&mut events, second, EventType::Accepted).await;
    history.extend(until_event(&mut events, first, EventType::StepSucceeded).await);
    // Every produce request fails (retriably, as while replicas are missing); fetches and
    // the group's heartbeats go on, so no rebalance hands the task to a new run.
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    let mock = broker.embedded.as_ref().unwrap().mock();
    mock.request_errors(RDKafkaApiKey::Produce, &vec![RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS; 100_000]);
    // The fault itself: longer than the worker's message timeout, while step 2 runs and
    // ends (its writes cannot be acknowledged).
    tokio::time::sleep(Duration::from_secs(6)).await;
    mock.clear_request_errors(RDKafkaApiKey::Produce);
    let mut finals: Vec<String> = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while finals.len() < 2 {
        let ev = tokio::time::timeout_at(deadline, events.next())
            .await
            .unwrap_or_else(|_| panic!("both tasks end; ended so far: {finals:?}; events: {:?}", types(&history)))
            .unwrap();
        if ev.task_id != first.to_string() && ev.task_id != second.to_string() {
            continue;
        }
        if ev.event.is_final() && !finals.contains(&ev.task_id) {
            assert_eq!(ev.event, EventType::Succeeded, "{ev:?}");
            finals.push(ev.task_id.clone());
        }
        history.push(ev);
    }
    // The order the worker ran them in, by its clock: the progress topic is keyed by task,
    // so the two tasks' events sit on different partitions and the order they are read in
    // says nothing (under load the second's end was read before the first's).
    let at = |id: TaskId, e: EventType| history.iter().filter(|ev| ev.task_id == id.to_string() && ev.event == e).map(|ev| ev.at_ms).min();
    let (first_end, second_start) = (at(first, EventType::Succeeded).unwrap(), at(second, EventType::StepStarted).unwrap());
    assert!(second_start >= first_end, "the subject's second task started {} ms before the first ended: {:?}", first_end - second_start, types(&history));
    let mut violations = ferry_runtime::history::check(&history);
    violations.extend(snapshot_violations(&client, &history).await);
    assert!(violations.is_empty(), "{violations:#?}");
    stop.cancel();
    worker.await.unwrap();
}

/// Incremental (cooperative-sticky) rebalancing: when a second worker joins, only the tasks
/// of the partitions that move stop (and resume on the new worker); the first worker's
/// other tasks run on. Steps outlast the revoke grace, so a task stopped by a rebalance
/// restarts its step: on the same worker if its partition stayed (what eager rebalancing
/// did to every task), on the other if it moved.
async fn a_joining_worker_stops_only_the_tasks_that_move(broker: TestBroker, step_ms: i64) {
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let (stop_a, worker_a) = broker.spawn_worker(broker.worker_options());
    let spec = TestTaskSpec { step_ms, ..TestTaskSpec::steps(2) };
    let mut ids = Vec::new();
    for i in 0..12 {
        ids.push(submit(&client, &format!("sticky-{i}"), &spec).await);
    }
    let want: HashSet<String> = ids.iter().map(ToString::to_string).collect();
    let mut history = Vec::new();
    let mut finished = HashSet::new();
    let mut b = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    while finished.len() < ids.len() {
        let ev = tokio::time::timeout_at(deadline, events.next()).await.expect("all tasks finish").unwrap();
        if !want.contains(&ev.task_id) {
            continue;
        }
        if ev.event.is_final() {
            assert_eq!(ev.event, EventType::Succeeded, "{ev:?}");
            finished.insert(ev.task_id.clone());
        }
        if ev.event == EventType::StepStarted && b.is_none() && history.iter().filter(|e: &&ferry_runtime::ProgressEvent| e.event == EventType::StepStarted).count() >= 11 {
            // Most tasks are mid-step on the first worker: the second joins.
            b = Some(broker.spawn_worker(broker.worker_options()));
        }
        history.push(ev);
    }
    let mut first: HashMap<(String, Option<i32>), String> = HashMap::new();
    let (mut in_place, mut moved) = (Vec::new(), 0);
    for e in history.iter().filter(|e| e.event == EventType::StepStarted) {
        match first.get(&(e.task_id.clone(), e.step)) {
            Some(w) if *w == e.worker => in_place.push(format!("{} step {:?} on {}", e.task_id, e.step, e.worker)),
            Some(_) => moved += 1,
            None => {
                first.insert((e.task_id.clone(), e.step), e.worker.clone());
            }
        }
    }
    assert!(in_place.is_empty(), "tasks stopped by the rebalance though their partition stayed: {in_place:?}");
    assert!(moved > 0, "some tasks moved to the joining worker");
    let violations = ferry_runtime::history::check(&history);
    assert!(violations.is_empty(), "{violations:#?}");
    stop_a.cancel();
    worker_a.await.unwrap();
    let (stop_b, worker_b) = b.unwrap();
    stop_b.cancel();
    worker_b.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joining_worker_stops_only_the_tasks_that_move_embedded() {
    // librdkafka's mock cluster completes a cooperative rebalance only after about 20 s
    // (its coordinator waits out a session timeout per round; measured): the steps must
    // outlast that for any task to still be running when the partitions move.
    a_joining_worker_stops_only_the_tasks_that_move(TestBroker::embedded(), 15_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joining_worker_stops_only_the_tasks_that_move_tansu() {
    a_joining_worker_stops_only_the_tasks_that_move(TestBroker::tansu().await, 4_000).await;
}

/// A worker cut off from its group (heartbeats failing) while its writes hang (produce
/// requests failing) loses its assignment; another worker takes the tasks over and the
/// writes come back. The first worker's writes for those tasks must not land after the
/// takeover: it fences its tasks and drops its unacknowledged writes the moment librdkafka
/// reports the assignment lost, even while its intake waits on a batch whose writes hang.
/// Before, the intake sat in that wait, the loss was seen only after the writes went
/// through, and both workers' events landed under the same seqs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_loses_its_assignment_while_writes_hang_writes_nothing_after_the_takeover() {
    use rdkafka::types::{RDKafkaApiKey as Api, RDKafkaRespErr as Err};
    let broker = TestBroker::embedded();
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let opts = |id: &str| {
        let mut o = broker.worker_options();
        o.worker_id = id.into();
        o.kafka.extra.extend([("session.timeout.ms".into(), "6000".into()), ("heartbeat.interval.ms".into(), "500".into())]);
        o
    };
    let dir = tempfile::tempdir().unwrap();
    let effects = dir.path().join("effects");
    let (stop_a, worker_a) = broker.spawn_worker_recording(opts("a"), Some(&effects));
    let spec = TestTaskSpec { step_ms: 3000, ..TestTaskSpec::steps(4) };
    let (ids, mut history) = eight_started(&client, &mut events, "lost", &spec).await;
    let mock = broker.embedded.as_ref().unwrap().mock();
    // A command the first worker fetches only once its writes hang: its intake then waits
    // on that batch's Accepted write.
    mock.request_errors(Api::Fetch, &vec![Err::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION; 1_000_000]);
    let late = submit(&client, "lost-late", &TestTaskSpec::steps(1)).await;
    mock.request_errors(Api::Produce, &vec![Err::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS; 1_000_000]);
    mock.request_errors(Api::Heartbeat, &vec![Err::RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE; 1_000_000]);
    mock.clear_request_errors(Api::Fetch);
    // The fault's course, not a synchronisation: the first worker's session (6 s) runs
    // out with no heartbeat answered; the second joins just before and takes everything
    // over; its own heartbeats are answered again before its session could run out; then
    // the writes go through.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (stop_b, worker_b) = broker.spawn_worker_recording(opts("b"), Some(&effects));
    tokio::time::sleep(Duration::from_secs(3)).await;
    mock.clear_request_errors(Api::Heartbeat);
    tokio::time::sleep(Duration::from_secs(2)).await;
    mock.clear_request_errors(Api::Produce);
    let want: HashSet<String> = ids.iter().chain([&late]).map(ToString::to_string).collect();
    until_all_succeeded(&mut events, &want, &mut history, Duration::from_secs(180)).await;
    let taken_over = history.iter().filter(|e| e.worker == "b" && e.event == EventType::StepStarted).count();
    assert!(taken_over > 0, "the second worker took tasks over: {:?}", types(&history));
    // The first worker rejoins and gets partitions back: it reads them again. It paused
    // them while its batch was held, and librdkafka keeps a pause across an unassign:
    // before, they came back paused and their commands waited for ever. New tasks go out
    // in rounds (one per subject) until the first worker has run some.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(150);
    let mut round = 0;
    let ran_on_a = loop {
        round += 1;
        let mut batch = Vec::new();
        for i in 0..6 {
            batch.push(submit(&client, &format!("back-{round}-{i}"), &TestTaskSpec::steps(1)).await);
        }
        let mut on_a = false;
        for id in batch {
            let evs = tokio::time::timeout_at(deadline, until_final(&mut events, id))
                .await
                .unwrap_or_else(|_| panic!("task {id} of round {round} never ended: its partition is not read"));
            assert_eq!(evs.last().unwrap().event, EventType::Succeeded);
            on_a |= evs.iter().any(|e| e.worker == "a" && e.event == EventType::StepStarted);
            history.extend(evs);
        }
        if on_a || tokio::time::Instant::now() >= deadline {
            break on_a;
        }
    };
    assert!(ran_on_a, "the first worker got partitions back and ran tasks from them ({round} rounds)");
    let mut violations = ferry_runtime::history::check(&history);
    violations.extend(snapshot_violations(&client, &history).await);
    // Outside Kafka too: no step of the first worker ran on while the second ran the task.
    violations.extend(ferry_runtime::history::check_effects(&ferry_runtime::effects::EffectLog::read(&effects).unwrap()));
    assert!(violations.is_empty(), "{} violations: {violations:#?}", violations.len());
    stop_a.cancel();
    stop_b.cancel();
    worker_a.await.unwrap();
    worker_b.await.unwrap();
}

/// A worker whose partitions are revoked (not lost: its heartbeats are answered) while
/// its tasks' writes are stuck in its producer (produce requests failing) gives the moved
/// tasks up after the revoke's grace: it drops their stuck writes and produces nothing for
/// them after, so the next owner's seqs are its own. Before, their runners stayed in the
/// write, and once the broker took writes again the first worker's snapshots and events
/// landed beside the second worker's, under the same seqs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_task_whose_write_is_stuck_writes_nothing_after_the_handover() {
    use rdkafka::types::{RDKafkaApiKey as Api, RDKafkaRespErr as Err};
    let broker = TestBroker::embedded();
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let opts = |id: &str| {
        let mut o = broker.worker_options();
        o.worker_id = id.into();
        o.revoke_grace = Duration::from_secs(1);
        // Shorter rounds of the mock's rebalance (it waits out a session per round).
        o.kafka.extra.extend([("session.timeout.ms".into(), "6000".into()), ("heartbeat.interval.ms".into(), "500".into())]);
        o
    };
    let (stop_a, worker_a, a) = spawn_with_handle(opts("a")).await;
    let mut held_by_a = a.metrics.tasks_in_flight();
    let spec = TestTaskSpec { step_ms: 3000, ..TestTaskSpec::steps(2) };
    let (ids, mut history) = eight_started(&client, &mut events, "stuck", &spec).await;
    // Every task is in its first step on the first worker: the writes at the steps' ends
    // hang from now on, while the second worker joins and the group moves partitions.
    let mock = broker.embedded.as_ref().unwrap().mock();
    mock.request_errors(Api::Produce, &vec![Err::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS; 1_000_000]);
    let (stop_b, worker_b) = broker.spawn_worker(opts("b"));
    // The first worker gives the moved tasks up (its runners end) while the writes still
    // hang; before, they waited in their writes until the broker took them.
    let gave_up = tokio::time::timeout(Duration::from_secs(120), held_by_a.wait_for(|n| *n < 8)).await.is_ok();
    mock.clear_request_errors(Api::Produce);
    let want: HashSet<String> = ids.iter().map(ToString::to_string).collect();
    until_all_succeeded(&mut events, &want, &mut history, Duration::from_secs(180)).await;
    let mut violations = ferry_runtime::history::check(&history);
    violations.extend(snapshot_violations(&client, &history).await);
    assert!(violations.is_empty(), "{} violations: {violations:#?}", violations.len());
    assert!(gave_up, "the first worker held its moved tasks in their stuck writes until the broker took them");
    let moved = history.iter().filter(|e| e.worker == "b" && e.event == EventType::StepStarted).count();
    assert!(moved > 0, "the second worker took tasks over: {:?}", types(&history));
    stop_a.cancel();
    stop_b.cancel();
    worker_a.await.unwrap();
    worker_b.await.unwrap();
}

/// Commands whose Accepted writes the broker never acknowledges (produce requests failing
/// for longer than the worker's `message.timeout.ms`) are read again after a pause, and
/// their tasks run once the broker takes writes again; the worker never stops. Before, the
/// intake stopped and took the worker down with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_that_cannot_be_made_durable_are_read_again_and_the_worker_goes_on() {
    use rdkafka::types::{RDKafkaApiKey as Api, RDKafkaRespErr as Err};
    let broker = TestBroker::embedded();
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let mut opts = broker.worker_options();
    opts.kafka.extra.push(("message.timeout.ms".into(), "2000".into()));
    let (stop, worker) = broker.spawn_worker(opts);
    let warm = submit(&client, "durable-warm", &TestTaskSpec::steps(1)).await;
    until_final(&mut events, warm).await;
    let mock = broker.embedded.as_ref().unwrap().mock();
    // The worker fetches the commands only once its writes fail.
    mock.request_errors(Api::Fetch, &vec![Err::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION; 1_000_000]);
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(submit(&client, &format!("durable-{i}"), &TestTaskSpec::steps(2)).await);
    }
    mock.request_errors(Api::Produce, &vec![Err::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS; 1_000_000]);
    mock.clear_request_errors(Api::Fetch);
    // The fault's length, not a synchronisation: three message timeouts.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(!worker.is_finished(), "the worker goes on while its writes fail");
    mock.clear_request_errors(Api::Produce);
    let mut history = Vec::new();
    for id in &ids {
        let evs = until_final(&mut events, *id).await;
        assert_eq!(evs.last().map(|e| e.event), Some(EventType::Succeeded), "{:?}", types(&evs));
        history.extend(evs);
    }
    let mut violations = ferry_runtime::history::check(&history);
    violations.extend(snapshot_violations(&client, &history).await);
    assert!(violations.is_empty(), "{violations:#?}");
    stop.cancel();
    worker.await.unwrap();
}

/// A new task and a Cancel of it, read in one batch whose writes fail: read again, the task
/// is Accepted (seq 1, identical) and cancelled once. Before, the failed batch left the
/// Cancel applied in memory, so the command read again found the task at seq 2 and only
/// republished it: its Accepted event was never written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_and_its_cancel_in_a_batch_that_fails_are_applied_once() {
    use rdkafka::types::{RDKafkaApiKey as Api, RDKafkaRespErr as Err};
    let broker = TestBroker::embedded();
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let mut opts = broker.worker_options();
    opts.kafka.extra.push(("message.timeout.ms".into(), "2000".into()));
    let (stop, worker, a) = spawn_with_handle(opts).await;
    let mut batches = a.metrics.command_batch_failures();
    let warm = submit(&client, "batch-cancel", &TestTaskSpec::steps(1)).await;
    until_final(&mut events, warm).await;
    let mock = broker.embedded.as_ref().unwrap().mock();
    // The worker fetches the two commands together, once its writes fail.
    mock.request_errors(Api::Fetch, &vec![Err::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION; 1_000_000]);
    // Blocked at its first step until cancelled: a worker's fetch already waiting at the
    // broker when the Fetch errors begin can still bring the task alone (session 40's CI:
    // it then ran its two no-op steps to Succeeded before the Cancel was read). Blocked,
    // it ends Cancelled either way; read together, the two go through the failing batch.
    let id = submit(&client, "batch-cancel", &TestTaskSpec { steps: 2, block_at: Some(1), ..TestTaskSpec::default() }).await;
    client.control(TaskKind::TEST, "batch-cancel", id, CommandAction::Cancel, Some("test".into())).await.unwrap();
    mock.request_errors(Api::Produce, &vec![Err::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS; 1_000_000]);
    mock.clear_request_errors(Api::Fetch);
    let failed = tokio::time::timeout(WAIT, batches.wait_for(|n| *n > 0)).await.is_ok();
    mock.clear_request_errors(Api::Produce);
    assert!(failed, "no batch failed while the broker refused writes");
    let evs = until_final(&mut events, id).await;
    let seqs: Vec<(i64, EventType)> = evs.iter().map(|e| (e.seq, e.event)).collect();
    assert_eq!(evs.first().map(|e| (e.seq, e.event)), Some((1, EventType::Accepted)), "{seqs:?}");
    assert_eq!(evs.last().map(|e| e.event), Some(EventType::Cancelled), "{seqs:?}");
    let seen: std::collections::BTreeSet<i64> = evs.iter().map(|e| e.seq).collect();
    assert_eq!(seen, (1..=evs.last().unwrap().seq).collect(), "a seq never written: {seqs:?}");
    let mut violations = ferry_runtime::history::check(&evs);
    violations.extend(snapshot_violations(&client, &evs).await);
    assert!(violations.is_empty(), "{violations:#?}");
    stop.cancel();
    worker.await.unwrap();
}

/// A Cancel that reaches a task paused on a failed write: the paused write is made first,
/// then the cancel's, in order, and the retry writes nothing more. Before, the cancel's
/// write (seq n + 1) went first and the retry's older snapshot (seq n) landed after it:
/// the task's latest durable state lost the cancel until its next write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_for_a_paused_task_is_written_after_the_paused_write() {
    use rdkafka::types::{RDKafkaApiKey as Api, RDKafkaRespErr as Err};
    let broker = TestBroker::embedded();
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let mut opts = broker.worker_options();
    opts.kafka.extra.push(("message.timeout.ms".into(), "2000".into()));
    let (stop, worker) = broker.spawn_worker(opts);
    let id = submit(&client, "paused-cancel", &TestTaskSpec { step_ms: 1500, ..TestTaskSpec::steps(4) }).await;
    let mut history = until_event(&mut events, id, EventType::StepStarted).await;
    let mock = broker.embedded.as_ref().unwrap().mock();
    mock.request_errors(Api::Produce, &vec![Err::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS; 1_000_000]);
    // The fault's course, not a synchronisation: step 1 ends at 1.5 s and its write times
    // out at 3.5 s (the task pauses); its retries go out at 4.5 s and 8.5 s and time out at
    // 6.5 s and 10.5 s, then it waits 4 s. The cancel, sent at 10 s, gets through when the
    // writes do, at 12 s: inside that wait, while the task is paused with no retry out.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let cancel = {
        let client = broker.client();
        tokio::spawn(async move { client.control(TaskKind::TEST, "paused-cancel", id, CommandAction::Cancel, Some("test".into())).await })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    mock.clear_request_errors(Api::Produce);
    cancel.await.unwrap().unwrap();
    history.extend(until_final(&mut events, id).await);
    assert_eq!(history.last().map(|e| e.event), Some(EventType::Cancelled), "{:?}", types(&history));
    // The task's events arrive in seq order (a repeat of a seen seq aside).
    let mut highest = 0;
    for e in &history {
        assert!(e.seq >= highest, "seq {} ({:?}) after seq {highest}: {:?}", e.seq, e.event, history.iter().map(|e| (e.seq, e.event)).collect::<Vec<_>>());
        highest = highest.max(e.seq);
    }
    let snap = client.snapshot(id).await.unwrap().unwrap();
    assert_eq!((snap.state, snap.seq), (TaskState::Cancelled, highest));
    let mut violations = ferry_runtime::history::check(&history);
    violations.extend(snapshot_violations(&client, &history).await);
    assert!(violations.is_empty(), "{violations:#?}");
    stop.cancel();
    worker.await.unwrap();
}

/// A Cancel whose batch fails after it took over a paused write leaves the task as it was:
/// paused on that write, which is made once the broker takes writes again, and the Cancel,
/// read again, applied once. Before, the failed batch left the control applied in memory
/// and the pause gone: a task whose final write had paused stayed Running on its
/// task-state topic, its Succeeded never written. Only the task-state topic's broker goes
/// down, so the Cancel itself gets through while the worker's writes fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_batch_leaves_the_paused_write_it_took_over_to_be_made_again() {
    let broker = TestBroker::embedded();
    let state_topic = broker.topics.task_state(TaskKind::TEST).name.clone();
    {
        let mock = broker.embedded.as_ref().unwrap().mock();
        for def in broker.topics.all() {
            let leader = if def.name == state_topic { 3 } else { 1 };
            for p in 0..def.partitions {
                mock.partition_leader(&def.name, p, Some(leader)).unwrap();
            }
        }
        let opts = broker.worker_options();
        let group = opts.group_id.clone().unwrap_or_else(|| format!("ferry-{}", TaskKind::TEST));
        mock.coordinator(rdkafka::mocking::MockCoordinator::Group(group), 1).unwrap();
    }
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let mut opts = broker.worker_options();
    opts.kafka.extra.push(("message.timeout.ms".into(), "2000".into()));
    let (stop, worker, a) = spawn_with_handle(opts).await;
    let (mut failures, mut batches) = (a.metrics.state_write_failures(), a.metrics.command_batch_failures());
    let id = submit(&client, "paused-final", &TestTaskSpec { step_ms: 1500, ..TestTaskSpec::steps(1) }).await;
    let mut history = until_event(&mut events, id, EventType::StepStarted).await;

    let mock = broker.embedded.as_ref().unwrap().mock();
    mock.broker_down(3).unwrap();
    let paused = tokio::time::timeout(WAIT, failures.wait_for(|n| *n > 0)).await.is_ok();
    assert!(paused, "no write failed with the task-state topic's broker down");
    client.control(TaskKind::TEST, "paused-final", id, CommandAction::Cancel, Some("test".into())).await.unwrap();
    let failed = tokio::time::timeout(WAIT, batches.wait_for(|n| *n > 0)).await.is_ok();
    mock.broker_up(3).unwrap();
    assert!(failed, "the Cancel's batch did not fail");

    history.extend(until_final(&mut events, id).await);
    let seqs: Vec<(i64, EventType)> = history.iter().map(|e| (e.seq, e.event)).collect();
    let highest = history.iter().map(|e| e.seq).max().unwrap();
    let seen: std::collections::BTreeSet<i64> = history.iter().map(|e| e.seq).collect();
    assert_eq!(seen, (1..=highest).collect(), "a seq never written: {seqs:?}");
    let snap = client.snapshot(id).await.unwrap().unwrap();
    assert!(snap.state.is_terminal(), "{snap:?}");
    assert_eq!(snap.seq, highest, "{seqs:?}");
    let mut violations = ferry_runtime::history::check(&history);
    violations.extend(snapshot_violations(&client, &history).await);
    assert!(violations.is_empty(), "{violations:#?}");
    // The subject's lane is free again.
    let next = submit(&client, "paused-final", &TestTaskSpec::steps(1)).await;
    assert_eq!(until_final(&mut events, next).await.last().unwrap().event, EventType::Succeeded);
    stop.cancel();
    worker.await.unwrap();
}

/// A worker that takes up an overtaken or stray task after half a second (its name, its
/// stop and its handle).
fn spawn_quick_to_take_up(broker: &TestBroker) -> (String, tokio_util::sync::CancellationToken, tokio::task::JoinHandle<()>) {
    let mut opts = broker.worker_options();
    opts.overtaken_pause = Duration::from_millis(500);
    let me = opts.worker_id.clone();
    let (stop, worker) = broker.spawn_worker(opts);
    (me, stop, worker)
}

/// Writes `snap` to the test kind's task-state topic as another worker would.
async fn plant(broker: &TestBroker, client: &ferry_runtime::Client, snap: &ferry_runtime::TaskSnapshot) {
    let bytes = client.registry().encode(snap).unwrap();
    let topic = broker.topics.task_state(TaskKind::TEST).name.clone();
    client.send_raw(&topic, Some(snap.task_id.as_bytes()), &bytes, OwnedHeaders::new()).await.unwrap();
}

/// Another worker's newer write of a task this worker runs (both take themselves for its
/// owner: one lost its partition without knowing yet) stops the run at once, without a
/// write, and the task is taken up again after a pause from the newest snapshot. Here the
/// other write is planted while the task is blocked in its second step: before, the run
/// stayed blocked and the Cancel sent next was written under the run's old seqs, below the
/// other worker's (the campaign saw a zombie cancel and revert a task at seqs 3 and 5 after
/// its owner's Reverted at 21).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_another_worker_writes_ahead_is_stopped_and_goes_on_from_the_newest_snapshot() {
    let broker = TestBroker::embedded();
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let (me, stop, worker) = spawn_quick_to_take_up(&broker);
    let spec = TestTaskSpec { block_at: Some(2), ..TestTaskSpec::steps(3) };
    let id = submit(&client, "overtaken", &spec).await;
    until_event(&mut events, id, EventType::StepProgress).await;

    // The other worker's snapshot: the same task, ten seqs further.
    let mut ahead = client.snapshot(id).await.unwrap().unwrap();
    let was = ahead.seq;
    ahead.seq += 10;
    ahead.worker = "another-worker".into();
    plant(&broker, &client, &ahead).await;

    // Taken up again from it: step 2 starts again past the other worker's seq.
    let evs = events.until(id, WAIT, |e| e.event == EventType::StepStarted && e.seq > ahead.seq).await.unwrap();
    let between: Vec<String> = evs.iter().filter(|e| e.worker == me && e.seq > was && e.seq <= ahead.seq).map(|e| format!("{} {:?}", e.seq, e.event)).collect();
    assert!(between.is_empty(), "the overtaken run wrote under seqs the other worker had used: {between:?}");
    assert_eq!(evs.last().unwrap().step, Some(2), "resumed at its started step");
    until_event(&mut events, id, EventType::StepProgress).await;
    client.cancel(id).await.unwrap();
    let evs = until_final(&mut events, id).await;
    assert_eq!(types(&evs), vec![EventType::CancelRequested, EventType::Cancelled]);
    assert!(evs.iter().all(|e| e.seq > ahead.seq && e.worker == me), "{evs:?}");
    let snap = client.snapshot(id).await.unwrap().unwrap();
    assert_eq!((snap.state, snap.worker.as_str()), (TaskState::Cancelled, me.as_str()));
    stop.cancel();
    worker.await.unwrap();
}

/// A snapshot in a record version newer than this worker knows (a newer Ferry's worker
/// took the task over, in a rolling upgrade across a protocol version): the worker stops
/// its run of that task at once, without a write, and stops itself with an error naming
/// the version, instead of resuming the task from the older snapshot it can read (which
/// ran its steps again, under seqs the newer worker had used). A record it cannot read for
/// another reason is skipped, as before, and the worker goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_in_a_newer_record_version_stops_the_worker_instead_of_a_rerun() {
    let broker = TestBroker::embedded();
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let opts = broker.worker_options();
    let me = opts.worker_id.clone();
    let stop = tokio_util::sync::CancellationToken::new();
    let handler = ferry_runtime::testkind::TestHandler { min_delay: Some(Duration::from_millis(10)), effects: None };
    let mut worker = tokio::spawn(ferry_runtime::Worker::new(opts, handler).run(stop.clone()));
    let spec = TestTaskSpec { block_at: Some(2), ..TestTaskSpec::steps(3) };
    let id = submit(&client, "upgraded", &spec).await;
    until_event(&mut events, id, EventType::StepProgress).await;
    let was = client.snapshot(id).await.unwrap().unwrap().seq;
    let topic = broker.topics.task_state(TaskKind::TEST).name.clone();
    let key = id.to_string();

    // Garbage (not the wire format's magic byte): skipped; the task still runs here.
    client.send_raw(&topic, Some(key.as_bytes()), &[7, 0, 0, 0, 1, 2], OwnedHeaders::new()).await.unwrap();
    let other = submit(&client, "still-here", &TestTaskSpec::steps(1)).await;
    assert_eq!(until_final(&mut events, other).await.last().unwrap().event, EventType::Succeeded);
    assert!(!worker.is_finished(), "a garbage record stopped the worker");

    // The newer worker's snapshot of the blocked task: the next schema id, and a datum.
    let newer = client.registry().id_of::<ferry_runtime::TaskSnapshot>().unwrap() + 1;
    let mut record = vec![0];
    record.extend_from_slice(&newer.to_be_bytes());
    record.extend_from_slice(&[2, 4, 6, 8]);
    client.send_raw(&topic, Some(key.as_bytes()), &record, OwnedHeaders::new()).await.unwrap();
    let ended = tokio::time::timeout(WAIT, &mut worker).await.expect("the worker stops of itself").unwrap();
    let err = ended.expect_err("it stops with an error");
    assert!(matches!(&err, ferry_runtime::worker::WorkerError::Outdated(o) if o.schema_id == newer && o.task.as_deref() == Some(key.as_str())), "{err}");
    assert!(err.to_string().contains(&format!("of task {id} in record version (schema id) {newer}, newer than this program knows")), "{err}");
    let after: Vec<String> = client.history(id).await.unwrap().iter().filter(|e| e.seq > was).map(|e| format!("{} {:?} by {}", e.seq, e.event, e.worker)).collect();
    assert!(after.is_empty(), "the old worker wrote the task after the newer version's snapshot (worker {me}): {after:?}");

    // An old reader (the CLI) says so instead of showing the older snapshot as the
    // task's state, and a list leaves the task out and names it.
    let read = client.snapshot(id).await;
    assert!(matches!(&read, Err(ferry_runtime::ClientError::NewerRecord { task, schema_id, .. }) if *task == id && *schema_id == newer), "{read:?}");
    assert!(read.unwrap_err().to_string().contains("upgrade this ferry"));
    let states = client.task_states(None).await.unwrap();
    assert_eq!(states.newer, vec![(key.clone(), newer)]);
    assert!(states.snapshots.iter().all(|s| s.task_id != key) && states.snapshots.iter().any(|s| s.task_id == other.to_string()), "{:?}", states.snapshots.iter().map(|s| &s.task_id).collect::<Vec<_>>());
}

/// A former owner's write that lands after this worker took the partition and caught up
/// (it lost the partition without knowing yet): a finished task it began to revert, say.
/// The owner holds no such task and nobody runs it; before, it stayed `Reverting` until
/// the next rebalance (the campaign's lost revert had this shape). It is taken up after a
/// pause and reverted to its end by the owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsettled_task_a_former_owner_wrote_late_is_taken_up() {
    let broker = TestBroker::embedded();
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let (me, stop, worker) = spawn_quick_to_take_up(&broker);
    let id = submit(&client, "stray", &TestTaskSpec::steps(2)).await;
    assert_eq!(until_final(&mut events, id).await.last().unwrap().event, EventType::Succeeded);

    // The former owner's write: the task Reverting, the next seq, by another worker.
    let mut late = client.snapshot(id).await.unwrap().unwrap();
    late.seq += 1;
    late.state = TaskState::Reverting;
    late.last_event = EventType::Reverting;
    late.worker = "a-former-owner".into();
    plant(&broker, &client, &late).await;

    let evs = until_final(&mut events, id).await;
    assert_eq!(types(&evs), vec![EventType::StepReverted, EventType::StepReverted, EventType::Reverted], "{evs:?}");
    assert!(evs.iter().all(|e| e.seq > late.seq && e.worker == me), "{evs:?}");
    assert_eq!(client.snapshot(id).await.unwrap().unwrap().state, TaskState::Reverted);
    stop.cancel();
    worker.await.unwrap();
}

/// Starts a `test` worker and waits until it is started: its stop, its handle and what
/// the worker exposes (metrics, its state view).
async fn spawn_with_handle(opts: ferry_runtime::WorkerOptions) -> (tokio_util::sync::CancellationToken, tokio::task::JoinHandle<()>, ferry_runtime::WorkerHandle) {
    let (handle_tx, handle_rx) = tokio::sync::oneshot::channel();
    let stop = tokio_util::sync::CancellationToken::new();
    let t = stop.clone();
    let worker = tokio::spawn(async move {
        let handler = ferry_runtime::testkind::TestHandler { min_delay: Some(Duration::from_millis(10)), effects: None };
        ferry_runtime::Worker::new(opts, handler)
            .run_with(t, move |h| {
                let _ = handle_tx.send(h);
            })
            .await
            .expect("worker failed")
    });
    (stop, worker, handle_rx.await.expect("the worker started"))
}

/// A Cancel that comes while another worker's newer write of its queued task stands in the
/// view is deferred with the task (applying it to the older snapshot would write under
/// seqs the other used). If the worker gives the partition up before it applies it, the
/// partition's next owner reads the Cancel again and cancels the task. Before, the
/// Cancel's offset was committed with its batch and the control went with the first
/// worker's memory: the task ran to Succeeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_deferred_when_its_partition_goes_is_read_again_by_its_next_owner() {
    let broker = TestBroker::embedded();
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let opts = |id: &str| {
        let mut o = broker.worker_options();
        o.worker_id = id.into();
        o
    };
    // The first worker takes no overtaken task up again while the test runs: the deferred
    // Cancel waits with its task until the worker stops.
    let mut first = opts("a");
    first.overtaken_pause = Duration::from_secs(3600);
    let (stop_a, worker_a, a) = spawn_with_handle(first).await;
    let Deferral { blocker, victim, ahead, after } = defer_a_cancel(&broker, &client, &mut events, &a, "deferred").await;
    stop_a.cancel();
    worker_a.await.unwrap();

    let (stop_b, worker_b) = broker.spawn_worker(opts("b"));
    let evs = until_event(&mut events, victim, EventType::CancelRequested).await;
    let by_a: Vec<String> = evs.iter().filter(|e| e.worker == "a" && e.seq > 1).map(|e| format!("{} {:?}", e.seq, e.event)).collect();
    assert!(by_a.is_empty(), "the first worker wrote the victim after another worker's newer write: {by_a:?}");
    let requested = evs.last().unwrap();
    assert!(requested.worker == "b" && requested.seq > ahead.seq, "{requested:?}");
    client.cancel(blocker).await.unwrap();
    assert_eq!(until_final(&mut events, blocker).await.last().unwrap().event, EventType::Cancelled);
    assert_eq!(types(&until_final(&mut events, victim).await), vec![EventType::Cancelled]);
    let evs = until_final(&mut events, after).await;
    assert_eq!(evs.last().unwrap().event, EventType::Succeeded, "{evs:?}");
    assert_eq!(evs.iter().filter(|e| e.event == EventType::StepStarted).count(), 1, "the later task ran once: {evs:?}");
    stop_b.cancel();
    worker_b.await.unwrap();
}

/// A Cancel deferred by [`defer_a_cancel`], and the tasks around it.
struct Deferral {
    /// Holds the subject's lane (blocked in its step until cancelled).
    blocker: TaskId,
    /// Queued behind the blocker; the Cancel is for it.
    victim: TaskId,
    /// Another worker's snapshot of the victim, ten seqs further, planted on the topic.
    ahead: ferry_runtime::TaskSnapshot,
    /// Queued behind the victim.
    after: TaskId,
}

/// One subject: a blocker holds its lane and a victim waits behind it without a runner;
/// another worker's newer snapshot of the victim is planted and read by the worker, then a
/// Cancel for the victim comes, which the worker defers. Returns once it did (a later
/// command of the subject, on the same partition, was Accepted after it).
async fn defer_a_cancel(broker: &TestBroker, client: &ferry_runtime::Client, events: &mut ferry_runtime::EventStream, worker: &ferry_runtime::WorkerHandle, subject: &str) -> Deferral {
    let blocker = submit(client, subject, &TestTaskSpec { block_at: Some(1), ..TestTaskSpec::steps(1) }).await;
    until_event(events, blocker, EventType::StepProgress).await;
    let victim = submit(client, subject, &TestTaskSpec::steps(1)).await;
    until_event(events, victim, EventType::Accepted).await;
    let mut ahead = client.snapshot(victim).await.unwrap().unwrap();
    ahead.seq += 10;
    ahead.worker = "another-worker".into();
    plant(broker, client, &ahead).await;
    worker.view.caught_up(WAIT).await.unwrap();
    client.cancel(victim).await.unwrap();
    let after = submit(client, subject, &TestTaskSpec::steps(1)).await;
    until_event(events, after, EventType::Accepted).await;
    Deferral { blocker, victim, ahead, after }
}

/// A deferred Cancel whose writes fail when its task is taken up again pauses the task on
/// them, as a runner's failed write does: they are made again once the broker takes writes,
/// before the task runs on. Before, the worker ran the task on with the cancel applied in
/// memory only: its CancelRequested was never written (the task's events skipped a seq)
/// and its record stayed held until the partition went.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_control_whose_writes_fail_is_written_again_before_its_task_runs() {
    use rdkafka::types::{RDKafkaApiKey as Api, RDKafkaRespErr as Err};
    let broker = TestBroker::embedded();
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let mut opts = broker.worker_options();
    opts.kafka.extra.push(("message.timeout.ms".into(), "2000".into()));
    // Long enough for the test to inject the fault after the blocker ends and before the
    // victim is taken up again.
    opts.overtaken_pause = Duration::from_secs(5);
    let (stop, worker, a) = spawn_with_handle(opts).await;
    let mut failures = a.metrics.state_write_failures();
    let Deferral { blocker, victim, ahead, after } = defer_a_cancel(&broker, &client, &mut events, &a, "replay").await;

    // The blocker ends: the victim, overtaken, is taken up again after the pause, and its
    // deferred Cancel applied then; the broker refuses every write from now on.
    client.cancel(blocker).await.unwrap();
    until_final(&mut events, blocker).await;
    let mock = broker.embedded.as_ref().unwrap().mock();
    mock.request_errors(Api::Produce, &vec![Err::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS; 1_000_000]);
    let failed = tokio::time::timeout(WAIT, failures.wait_for(|n| *n > 0)).await.is_ok();
    mock.clear_request_errors(Api::Produce);
    assert!(failed, "no write failed while the broker refused them");

    let evs = until_final(&mut events, victim).await;
    let seen: Vec<(i64, EventType, &str)> = evs.iter().map(|e| (e.seq, e.event, e.worker.as_str())).collect();
    let later: Vec<(i64, EventType)> = seen.iter().filter(|(seq, ..)| *seq > ahead.seq).map(|(seq, e, _)| (*seq, *e)).collect();
    assert_eq!(later, vec![(ahead.seq + 1, EventType::CancelRequested), (ahead.seq + 2, EventType::Cancelled)], "{seen:?}");
    let snap = client.snapshot(victim).await.unwrap().unwrap();
    assert_eq!((snap.state, snap.seq), (TaskState::Cancelled, ahead.seq + 2));
    let evs = until_final(&mut events, after).await;
    assert_eq!(evs.last().unwrap().event, EventType::Succeeded, "{evs:?}");
    stop.cancel();
    worker.await.unwrap();
}

/// A reader of the test kind's task-state topic from its beginning (every partition
/// assigned), with the topic's name.
fn task_state_reader(broker: &TestBroker) -> (BaseConsumer, String) {
    let topic = broker.topics.task_state(TaskKind::TEST).name.clone();
    let reader: BaseConsumer = broker.kafka.reader().create().unwrap();
    let md = reader.fetch_metadata(Some(&topic), WAIT).unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in md.topics().iter().flat_map(|t| t.partitions()) {
        tpl.add_partition_offset(&topic, p.id(), rdkafka::Offset::Beginning).unwrap();
    }
    reader.assign(&tpl).unwrap();
    (reader, topic)
}

/// The seq header of a task-state record, if it has one.
fn seq_of(m: &rdkafka::message::BorrowedMessage<'_>) -> Option<i64> {
    let h = m.headers()?.iter().find(|h| h.key == ferry_runtime::publisher::SEQ_HEADER)?;
    std::str::from_utf8(h.value?).ok()?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_snapshot_landing_after_the_newest_is_followed_by_the_newest_again() {
    let broker = TestBroker::embedded();
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let (stop, worker) = broker.spawn_worker(broker.worker_options());
    let id = submit(&client, "stale-last", &TestTaskSpec::steps(2)).await;
    assert_eq!(until_final(&mut events, id).await.last().unwrap().event, EventType::Succeeded);
    let newest = client.snapshot(id).await.unwrap().unwrap().seq;

    // The task's first snapshot, as it was written (payload and headers), sent again: what
    // a former owner's write still on the wire when it lost the partition looks like when
    // it lands after the new owner's. A compacted topic keeps the last record of a key.
    let (reader, topic) = task_state_reader(&broker);
    let key = id.to_string();
    let deadline = std::time::Instant::now() + WAIT;
    let first = loop {
        assert!(std::time::Instant::now() < deadline, "the task's first snapshot was not read back");
        if let Some(Ok(m)) = reader.poll(Duration::from_millis(200))
            && m.key() == Some(key.as_bytes())
            && seq_of(&m) == Some(1)
        {
            break (m.payload().unwrap().to_vec(), m.headers().unwrap().detach());
        }
    };
    assert!(newest > 1, "the task moved past its first snapshot");
    client.send_raw(&topic, Some(key.as_bytes()), &first.0, first.1).await.unwrap();

    // After the stale record, the worker owning the task writes its newest snapshot again.
    let mut after_stale = Vec::new();
    let mut stale_seen = false;
    while !after_stale.contains(&newest) {
        assert!(std::time::Instant::now() < deadline, "no newer record followed the stale one: {after_stale:?}");
        let Some(Ok(m)) = reader.poll(Duration::from_millis(200)) else { continue };
        if m.key() != Some(key.as_bytes()) {
            continue;
        }
        let seq = seq_of(&m).unwrap_or(-1);
        if stale_seen {
            after_stale.push(seq);
        } else if seq == 1 && m.payload() == Some(&first.0[..]) {
            stale_seen = true;
        }
    }
    assert_eq!(after_stale, vec![newest], "one write of the newest snapshot, nothing else");
    let snap = client.snapshot(id).await.unwrap().unwrap();
    assert_eq!((snap.seq, snap.state), (newest, TaskState::Succeeded));
    stop.cancel();
    worker.await.unwrap();
}

/// A worker alone with its tasks writes each snapshot once. Its view holds its own
/// snapshots before they land, so a record read back just before the next one lands is
/// older than the view's newest but not stale: taking it for stale made the worker write
/// its newest snapshot again on nearly every step (seen as "an older snapshot of the task
/// landed after its newest" on a quiet run), and a rewrite queued behind the runner's
/// next write is itself older than that write. A revert of a finished task is a new seq
/// as well (a same-seq rewrite with `revert_requested` set could be erased).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_worker_writes_each_snapshot_once() {
    let broker = TestBroker::embedded();
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let (stop, worker) = broker.spawn_worker(broker.worker_options());
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(submit(&client, &format!("once-{i}"), &TestTaskSpec::steps(8)).await);
    }
    for id in &ids {
        assert_eq!(until_final(&mut events, *id).await.last().unwrap().event, EventType::Succeeded);
    }
    // Two reverted after they finished: the revert is a new seq too. It was once written
    // as the final snapshot again with `revert_requested` set, under the same seq, and
    // another record of that seq could then erase it (a revert read and lost).
    for id in &ids[..2] {
        client.revert(*id).await.unwrap();
        let evs = until_final(&mut events, *id).await;
        assert_eq!(types(&evs).first(), Some(&EventType::Reverting), "{id}: {:?}", types(&evs));
        assert_eq!(evs.last().unwrap().event, EventType::Reverted);
    }
    // Everything on the task-state topic up to its end, as written (no compaction here).
    let (reader, topic) = task_state_reader(&broker);
    let ends: HashMap<i32, i64> =
        reader.assignment().unwrap().elements().iter().map(|e| (e.partition(), reader.fetch_watermarks(&topic, e.partition(), WAIT).unwrap().1)).collect();
    let mut seqs: HashMap<String, Vec<i64>> = HashMap::new();
    let mut read: HashMap<i32, i64> = HashMap::new();
    let deadline = std::time::Instant::now() + WAIT;
    while ends.iter().any(|(p, end)| read.get(p).copied().unwrap_or(0) < *end) {
        assert!(std::time::Instant::now() < deadline, "the task-state topic was not read to its end");
        let Some(Ok(m)) = reader.poll(Duration::from_millis(200)) else { continue };
        read.insert(m.partition(), m.offset() + 1);
        let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
        seqs.entry(key).or_default().push(seq_of(&m).unwrap_or(-1));
    }
    for id in &ids {
        let written = &seqs[&id.to_string()];
        assert!(written.windows(2).all(|w| w[0] < w[1]), "task {id}: snapshots written {written:?} (each seq once, in order)");
    }
    stop.cancel();
    worker.await.unwrap();
}

/// The `test` kind's steps under another kind's name: a kind the runtime and ferry-task
/// know nothing of, registered by this test binary (`support::OTHER_KIND`).
struct OtherKind(ferry_runtime::testkind::TestHandler);

impl ferry_runtime::TaskHandler for OtherKind {
    type Spec = TestTaskSpec;
    fn kind(&self) -> TaskKind {
        OTHER_KIND
    }
    fn validate(&self, subject: &str, spec: &TestTaskSpec) -> Result<(), ferry_runtime::Rejection> {
        self.0.validate(subject, spec)
    }
    fn targets(&self, subject: &str, spec: &TestTaskSpec) -> ferry_task::Targets {
        self.0.targets(subject, spec)
    }
    fn plan(&self, spec: &TestTaskSpec) -> Vec<std::sync::Arc<dyn ferry_runtime::Step<TestTaskSpec>>> {
        self.0.plan(spec)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kind_registered_outside_the_runtime_gets_its_topics_and_runs_reverts_and_is_tracked() {
    // The kind is no constant of ferry-task and no symbol of a closed enum: its crate (here
    // the test) registers it, and the broker's topics, the worker, the client and the live
    // view take it by name; its records carry the name as a string.
    assert!(ferry_runtime::kind::registered().contains(&OTHER_KIND));
    let broker = TestBroker::embedded();
    assert!(broker.topics.all().iter().any(|t| t.name == "ferry.commands.other"), "the registered kind has its command topic");
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let live = client.live_view().await.unwrap();
    let token = tokio_util::sync::CancellationToken::new();
    let handler = OtherKind(ferry_runtime::testkind::TestHandler::default());
    let worker = {
        let (opts, t) = (broker.worker_options(), token.clone());
        tokio::spawn(async move { ferry_runtime::Worker::new(opts, handler).run(t).await.expect("worker failed") })
    };
    let id = client.submit(OTHER_KIND, "other/a", &TestTaskSpec::steps(2), SubmitOptions::default()).await.unwrap();
    let evs = until_final(&mut events, id).await;
    assert_eq!(evs.last().map(|e| (e.event, e.kind)), Some((EventType::Succeeded, OTHER_KIND)));
    live.wait_for(id, WAIT, |s| s.state == TaskState::Succeeded).await.unwrap();
    assert_eq!(live.locate(id), Some((OTHER_KIND, "other/a".to_owned())));
    // Reverting it finds it by id, as any kind's task.
    client.revert(id).await.unwrap();
    until_final(&mut events, id).await;
    let snap = live.wait_for(id, WAIT, |s| s.state == TaskState::Reverted).await.unwrap();
    assert_eq!(snap.kind, OTHER_KIND);
    // On the wire the envelope's kind is the name (schema v2, a string).
    let reader: BaseConsumer = broker.kafka.reader().create().unwrap();
    reader.subscribe(&[&broker.topics.command(OTHER_KIND).name]).unwrap();
    let deadline = std::time::Instant::now() + WAIT;
    let raw = loop {
        assert!(std::time::Instant::now() < deadline, "no record on the kind's command topic");
        if let Some(Ok(m)) = reader.poll(Duration::from_millis(200)) {
            break m.payload().unwrap_or_default().to_vec();
        }
    };
    let env: CommandEnvelope = client.registry().decode(&raw).unwrap();
    assert_eq!((&raw[..5], env.kind.as_str()), (&[0u8, 0, 0, 0, 100][..], "other"));
    token.cancel();
    worker.await.unwrap();
}

/// Reads events until every task of `want` has ended (each Succeeded), adding theirs to
/// `history`; fails after `within`.
async fn until_all_succeeded(events: &mut ferry_runtime::EventStream, want: &HashSet<String>, history: &mut Vec<ferry_runtime::ProgressEvent>, within: Duration) {
    let mut finished = HashSet::new();
    let deadline = tokio::time::Instant::now() + within;
    while finished.len() < want.len() {
        let ev = tokio::time::timeout_at(deadline, events.next())
            .await
            .unwrap_or_else(|_| panic!("every task ends; ended: {finished:?}"))
            .unwrap();
        if !want.contains(&ev.task_id) {
            continue;
        }
        if ev.event.is_final() {
            assert_eq!(ev.event, EventType::Succeeded, "{ev:?}");
            finished.insert(ev.task_id.clone());
        }
        history.push(ev);
    }
}

/// Submits eight tasks of `spec` (subjects `<prefix>-0` to `-7`) and waits until each has
/// started its first step; their ids and events so far.
async fn eight_started(client: &ferry_runtime::Client, events: &mut ferry_runtime::EventStream, prefix: &str, spec: &TestTaskSpec) -> (Vec<TaskId>, Vec<ferry_runtime::ProgressEvent>) {
    let mut ids = Vec::new();
    for i in 0..8 {
        ids.push(submit(client, &format!("{prefix}-{i}"), spec).await);
    }
    let mut history = Vec::new();
    for id in &ids {
        history.extend(until_event(events, *id, EventType::StepStarted).await);
    }
    (ids, history)
}

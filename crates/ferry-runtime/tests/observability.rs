//! A worker's metrics against the embedded broker: `ferry_tasks_in_flight` counts the tasks
//! its runners hold, moves a task from `running` to `reverting`, and comes back to zero
//! once they end; `ferry_task_duration_seconds` times each task by its outcome; a
//! handler's own gauges are exported beside them.

mod support;

use std::time::Duration;

use ferry_runtime::testkind::{TestHandler, TestTaskSpec};
use ferry_runtime::{EventType, Worker};
use support::{TestBroker, WAIT, submit, until_event, until_final};
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_in_flight_come_back_to_zero_when_their_runners_end() {
    let broker = TestBroker::embedded();
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let token = CancellationToken::new();
    let (opts, t) = (broker.worker_options(), token.clone());
    let worker = tokio::spawn(async move {
        let handler = TestHandler { min_delay: Some(Duration::from_millis(10)), effects: None };
        Worker::new(opts, handler)
            .run_with(t, move |h| {
                let _ = tx.send(h);
            })
            .await
            .expect("worker failed")
    });
    let handle = rx.await.unwrap();
    let metrics = handle.metrics.clone();
    let mut in_flight = metrics.tasks_in_flight();

    // A task that blocks in its first step: its runner holds it.
    let blocked = submit(&client, "held", &TestTaskSpec { block_at: Some(1), ..TestTaskSpec::steps(2) }).await;
    until_event(&mut events, blocked, EventType::StepStarted).await;
    tokio::time::timeout(WAIT, in_flight.wait_for(|n| *n == 1)).await.expect("the blocked task is counted").unwrap();
    let text = metrics.encode();
    assert!(text.contains(r#"ferry_tasks_in_flight{kind="test",state="running"} 1"#), "{text}");
    // A second task of that subject waits for its lane: queued, not running.
    let behind = submit(&client, "held", &TestTaskSpec::steps(1)).await;
    until_event(&mut events, behind, EventType::Accepted).await;
    let mut queued = metrics.tasks_queued();
    tokio::time::timeout(WAIT, queued.wait_for(|n| *n == 1)).await.expect("the task behind is counted as queued").unwrap();
    let text = metrics.encode();
    assert!(text.contains(r#"ferry_tasks_in_flight{kind="test",state="queued"} 1"#), "{text}");

    // Another subject's task fails at its second step and is undone: it passes through
    // `reverting`.
    let undone = submit(&client, "undone", &TestTaskSpec { fail_at: Some(2), ..TestTaskSpec::steps(2) }).await;
    let evs = until_final(&mut events, undone).await;
    assert_eq!(evs.last().unwrap().event, EventType::Reverted);

    client.cancel(blocked).await.unwrap();
    let evs = until_final(&mut events, blocked).await;
    assert_eq!(evs.last().unwrap().event, EventType::Cancelled);
    assert_eq!(until_final(&mut events, behind).await.last().unwrap().event, EventType::Succeeded, "the queued task ran once its lane was free");
    tokio::time::timeout(WAIT, queued.wait_for(|n| *n == 0)).await.expect("the queued task left the gauge").unwrap();
    let text = metrics.encode();
    assert!(text.contains(r#"ferry_tasks_in_flight{kind="test",state="queued"} 0"#), "{text}");

    tokio::time::timeout(WAIT, in_flight.wait_for(|n| *n == 0)).await.expect("every runner ended and left the gauge").unwrap();
    let text = metrics.encode();
    assert!(text.contains(r#"ferry_tasks_in_flight{kind="test",state="running"} 0"#), "{text}");
    assert!(text.contains(r#"ferry_tasks_in_flight{kind="test",state="reverting"} 0"#), "the undone task was counted as reverting: {text}");
    assert!(text.contains(r#"ferry_task_duration_seconds_count{kind="test",outcome="Reverted"} 1"#), "{text}");
    assert!(text.contains(r#"ferry_task_duration_seconds_count{kind="test",outcome="Cancelled"} 1"#), "{text}");
    assert!(text.contains(&format!("ferry_build_info{{version=\"{}\"}} 1", env!("CARGO_PKG_VERSION"))), "{text}");
    token.cancel();
    worker.await.unwrap();
}

/// A handler whose own gauge the worker exports: the test kind's, with one gauge.
struct Gauged(TestHandler);

impl ferry_runtime::TaskHandler for Gauged {
    type Spec = TestTaskSpec;

    fn kind(&self) -> ferry_runtime::TaskKind {
        self.0.kind()
    }

    fn validate(&self, subject: &str, spec: &TestTaskSpec) -> Result<(), ferry_runtime::Rejection> {
        self.0.validate(subject, spec)
    }

    fn targets(&self, subject: &str, spec: &TestTaskSpec) -> ferry_runtime::targets::Targets {
        self.0.targets(subject, spec)
    }

    fn plan(&self, spec: &TestTaskSpec) -> Vec<std::sync::Arc<dyn ferry_runtime::Step<TestTaskSpec>>> {
        self.0.plan(spec)
    }

    fn gauges(&self) -> Vec<ferry_runtime::gauges::GaugeFamily> {
        vec![ferry_runtime::gauges::GaugeFamily { name: "cluster_watches_failing", help: "Failing watches", samples: vec![(vec![("cluster", "member-1".to_owned())], 1)] }]
    }
}

/// The worker's `/metrics` carries its handler's gauges (the kube workers'
/// `ferry_cluster_watches_failing{cluster}`) beside the runtime's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_exports_its_handlers_gauges() {
    let broker = TestBroker::embedded();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let token = CancellationToken::new();
    let (opts, t) = (broker.worker_options(), token.clone());
    let worker = tokio::spawn(async move {
        Worker::new(opts, Gauged(TestHandler::default()))
            .run_with(t, move |h| {
                let _ = tx.send(h);
            })
            .await
            .expect("worker failed")
    });
    let text = rx.await.unwrap().metrics.encode();
    assert!(text.contains(r#"ferry_cluster_watches_failing{cluster="member-1"} 1"#), "{text}");
    assert!(text.contains("ferry_build_info"), "{text}");
    token.cancel();
    worker.await.unwrap();
}

//! What a step's plan promises, end to end on both brokers (embedded and tansu): a
//! rejection after an earlier step acted is a failure that reverts (a rejection before any
//! step acted still ends Rejected), a task resumed by a worker whose plan changed stops
//! with PLAN_CHANGED instead of running, or undoing, the wrong step, and a step output too
//! big for the snapshot fails the task. The steps record what they do, so a wrong run is
//! seen.

mod support;

use std::sync::{Arc, Mutex};

use ferry_runtime::step::{CheckStep, Rejection, Step, StepContext, StepError, TaskHandler};
use ferry_runtime::testkind::TestTaskSpec;
use ferry_runtime::{EventType, TaskKind, TaskState, Worker, WorkerOptions};
use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use support::*;
use tokio_util::sync::CancellationToken;

type Log = Arc<Mutex<Vec<String>>>;

/// A step that records its runs and undos.
struct Act(&'static str, Log);

impl Step<TestTaskSpec> for Act {
    fn name(&self) -> &str {
        self.0
    }

    fn run<'a>(&'a self, _: &'a StepContext<'a, TestTaskSpec>) -> BoxFuture<'a, Result<Value, StepError>> {
        self.1.lock().unwrap().push(format!("run {}", self.0));
        async { Ok(json!({})) }.boxed()
    }

    fn undo<'a>(&'a self, _: &'a StepContext<'a, TestTaskSpec>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        self.1.lock().unwrap().push(format!("undo {}", self.0));
        async { Ok(()) }.boxed()
    }
}

/// A check that records that it looked.
struct Look(Log);

impl CheckStep<TestTaskSpec> for Look {
    fn name(&self) -> &str {
        "look"
    }

    fn run<'a>(&'a self, _: &'a StepContext<'a, TestTaskSpec>) -> BoxFuture<'a, Result<Value, StepError>> {
        self.0.lock().unwrap().push("look".into());
        async { Ok(json!({})) }.boxed()
    }
}

/// A step that refuses the command against the live state, as a check would.
struct Refuse;

impl CheckStep<TestTaskSpec> for Refuse {
    fn name(&self) -> &str {
        "refuse"
    }

    fn run<'a>(&'a self, _: &'a StepContext<'a, TestTaskSpec>) -> BoxFuture<'a, Result<Value, StepError>> {
        async { Err(StepError::rejected("REFUSED", "the live state says no")) }.boxed()
    }
}

/// A step that acts and returns an output too big for a task's snapshot.
struct Big(Log);

impl Step<TestTaskSpec> for Big {
    fn name(&self) -> &str {
        "big"
    }

    fn run<'a>(&'a self, _: &'a StepContext<'a, TestTaskSpec>) -> BoxFuture<'a, Result<Value, StepError>> {
        self.0.lock().unwrap().push("run big".into());
        let blob = "x".repeat(ferry_runtime::limits::STEP_OUTPUTS_BYTES);
        async move { Ok(json!({ "blob": blob })) }.boxed()
    }

    fn undo<'a>(&'a self, _: &'a StepContext<'a, TestTaskSpec>, output: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        self.0.lock().unwrap().push(format!("undo big (output kept: {})", output.is_some()));
        async { Ok(()) }.boxed()
    }
}

/// A step that says too much: a progress report and an error of over a megabyte each (a
/// Kubernetes error can echo a whole object); a rejection when `.0`.
struct Loud(bool);

impl CheckStep<TestTaskSpec> for Loud {
    fn name(&self) -> &str {
        "loud"
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, TestTaskSpec>) -> BoxFuture<'a, Result<Value, StepError>> {
        let words = "why ".repeat(300_000);
        cx.progress(50, words.clone());
        let reject = self.0;
        async move { Err(if reject { StepError::rejected("LOUD", words) } else { StepError::permanent("LOUD", words) }) }.boxed()
    }
}

/// A step that never ends (until its worker stops it).
struct Hang;

impl CheckStep<TestTaskSpec> for Hang {
    fn name(&self) -> &str {
        "hang"
    }

    fn run<'a>(&'a self, _: &'a StepContext<'a, TestTaskSpec>) -> BoxFuture<'a, Result<Value, StepError>> {
        futures::future::pending().boxed()
    }
}

/// Plans chosen by the spec's `steps`, in two versions of the worker.
struct Scripted {
    version: u8,
    log: Log,
}

impl TaskHandler for Scripted {
    type Spec = TestTaskSpec;

    fn kind(&self) -> TaskKind {
        TaskKind::TEST
    }

    fn validate(&self, _: &str, _: &TestTaskSpec) -> Result<(), Rejection> {
        Ok(())
    }

    fn targets(&self, subject: &str, _: &TestTaskSpec) -> ferry_task::Targets {
        ferry_task::Targets::clusters([subject])
    }

    fn plan(&self, spec: &TestTaskSpec) -> Vec<Arc<dyn Step<TestTaskSpec>>> {
        let log = &self.log;
        match (spec.steps, self.version) {
            (1, _) => vec![Arc::new(Look(log.clone())), Arc::new(Refuse)],
            (2, _) => vec![Arc::new(Act("make", log.clone())), Arc::new(Refuse)],
            (4, _) => vec![Arc::new(Act("make", log.clone())), Arc::new(Big(log.clone()))],
            (5, _) => vec![Arc::new(Act("make", log.clone())), Arc::new(Loud(false))],
            (7, _) => vec![Arc::new(Act("make", log.clone())), Arc::new(Loud(true))],
            (6, _) => vec![Arc::new(Act("after", log.clone()))],
            (_, 1) => vec![Arc::new(Act("make", log.clone())), Arc::new(Hang)],
            _ => vec![Arc::new(Act("make", log.clone())), Arc::new(Act("other", log.clone()))],
        }
    }
}

fn spawn(broker: &TestBroker, version: u8, log: &Log) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let opts: WorkerOptions = broker.worker_options();
    let handler = Scripted { version, log: log.clone() };
    let token = CancellationToken::new();
    let t = token.clone();
    (token, tokio::spawn(async move { Worker::new(opts, handler).run(t).await.expect("worker failed") }))
}

async fn a_rejection_after_a_step_acted_reverts_and_one_before_ends_rejected(broker: TestBroker) {
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let log: Log = Arc::default();
    let (stop, worker) = spawn(&broker, 1, &log);

    let checked = submit(&client, "checked", &TestTaskSpec::steps(1)).await;
    let evs = until_final(&mut events, checked).await;
    assert_eq!(evs.last().unwrap().event, EventType::Rejected, "{:?}", types(&evs));
    assert_eq!(log.lock().unwrap().drain(..).collect::<Vec<_>>(), ["look"]);

    // Before: Rejected, and what `make` made stayed.
    let acted = submit(&client, "acted", &TestTaskSpec::steps(2)).await;
    let evs = until_final(&mut events, acted).await;
    let last = evs.last().unwrap();
    assert_eq!(last.event, EventType::Reverted, "{:?}", types(&evs));
    assert_eq!(log.lock().unwrap().drain(..).collect::<Vec<_>>(), ["run make", "undo make"]);
    let snap = client.snapshot(acted).await.unwrap().unwrap();
    let error = snap.error.expect("the failure is kept");
    assert_eq!(error.code, "REFUSED");
    assert!(error.message.contains("a rejection after step \"make\" acted"), "{}", error.message);
    // A long rejection after a step acted: the note is kept and the message stays within
    // its bound (a snapshot must always fit a record).
    let loud = submit(&client, "loud", &TestTaskSpec::steps(7)).await;
    let evs = until_final(&mut events, loud).await;
    assert_eq!(evs.last().unwrap().event, EventType::Reverted, "{:?}", types(&evs));
    let error = client.snapshot(loud).await.unwrap().unwrap().error.expect("the failure is kept");
    assert!(error.message.len() <= ferry_runtime::limits::MESSAGE_BYTES, "{} bytes", error.message.len());
    assert!(error.message.starts_with("why why") && error.message.ends_with("(a rejection after step \"make\" acted: treated as a failure)"), "{}", &error.message[error.message.len() - 120..]);
    stop.cancel();
    worker.await.unwrap();
}

async fn a_task_resumed_under_a_changed_plan_stops_with_plan_changed(broker: TestBroker) {
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let log: Log = Arc::default();
    let (stop, worker) = spawn(&broker, 1, &log);
    let id = submit(&client, "changed", &TestTaskSpec::steps(3)).await;
    let evs = events.until(id, WAIT, |e| e.event == EventType::StepStarted && e.step == Some(2)).await.unwrap();
    assert_eq!(evs.last().unwrap().step_name.as_deref(), Some("hang"));
    stop.cancel();
    worker.await.unwrap();

    // The next worker's plan has `other` where `hang` was. Before, it ran `other` as step 2.
    let (stop, worker) = spawn(&broker, 2, &log);
    let evs = until_final(&mut events, id).await;
    let last = evs.last().unwrap();
    assert_eq!((last.event, last.code.as_deref()), (EventType::Failed, Some("PLAN_CHANGED")), "{:?}", types(&evs));
    assert!(last.message.as_deref().unwrap().contains("step 2 is \"hang\" in the journal but \"other\" in the plan"), "{:?}", last.message);
    assert_eq!(*log.lock().unwrap(), ["run make"], "nothing ran or was undone under the new plan");
    assert_eq!(client.snapshot(id).await.unwrap().unwrap().state, TaskState::Failed);
    stop.cancel();
    worker.await.unwrap();
}

/// A step whose output would not fit in its task's snapshot fails the task, which
/// reverts (the big step's undo too, without its output). Before, every write of the
/// snapshot failed and the task was retried for ever.
async fn an_output_too_large_for_the_snapshot_fails_the_task_which_reverts(broker: TestBroker) {
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let log: Log = Arc::default();
    let (stop, worker) = spawn(&broker, 1, &log);
    let id = submit(&client, "big", &TestTaskSpec::steps(4)).await;
    let evs = until_final(&mut events, id).await;
    assert_eq!(evs.last().unwrap().event, EventType::Reverted, "{:?}", types(&evs));
    let failed = evs.iter().find(|e| e.event == EventType::StepFailed).expect("the big step failed");
    assert_eq!((failed.step_name.as_deref(), failed.code.as_deref()), (Some("big"), Some("OUTPUT_TOO_LARGE")));
    assert_eq!(*log.lock().unwrap(), ["run make", "run big", "undo big (output kept: false)", "undo make"]);
    stop.cancel();
    worker.await.unwrap();
}

/// A step's megabyte-long error and progress reach the snapshot and the events cut to
/// `MESSAGE_BYTES`, with a note: the task fails and reverts, and the next task of its
/// subject runs. Before, the snapshot was over the producer's record limit: the write
/// was refused and retried for ever, holding the subject's lane.
async fn a_step_that_says_too_much_fails_with_its_message_cut(broker: TestBroker) {
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let log: Log = Arc::default();
    let (stop, worker) = spawn(&broker, 1, &log);
    let id = submit(&client, "loud", &TestTaskSpec::steps(5)).await;
    let evs = until_final(&mut events, id).await;
    assert_eq!(evs.last().unwrap().event, EventType::Reverted, "{:?}", types(&evs));
    let cut = |m: &str| m.len() <= ferry_runtime::limits::MESSAGE_BYTES && m.starts_with("why why") && m.ends_with(" … (1200000 bytes cut)");
    let progress = evs.iter().find(|e| e.event == EventType::StepProgress).expect("the step's report");
    assert!(cut(progress.message.as_deref().unwrap()), "{:?}", progress.message.as_deref().map(str::len));
    let failed = evs.iter().find(|e| e.event == EventType::StepFailed).expect("the loud step failed");
    assert!(cut(failed.message.as_deref().unwrap()), "{:?}", failed.message.as_deref().map(str::len));
    let error = client.snapshot(id).await.unwrap().unwrap().error.expect("the failure is kept");
    assert_eq!(error.code, "LOUD");
    assert!(cut(&error.message), "{}", error.message.len());
    // The subject's lane is free: the next task of it runs.
    let next = submit(&client, "loud", &TestTaskSpec::steps(6)).await;
    assert_eq!(until_final(&mut events, next).await.last().unwrap().event, EventType::Succeeded);
    assert_eq!(*log.lock().unwrap(), ["run make", "undo make", "run after"]);
    stop.cancel();
    worker.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_that_says_too_much_fails_with_its_message_cut_embedded() {
    a_step_that_says_too_much_fails_with_its_message_cut(TestBroker::embedded()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejection_after_a_step_acted_reverts_and_one_before_ends_rejected_embedded() {
    a_rejection_after_a_step_acted_reverts_and_one_before_ends_rejected(TestBroker::embedded()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejection_after_a_step_acted_reverts_and_one_before_ends_rejected_tansu() {
    a_rejection_after_a_step_acted_reverts_and_one_before_ends_rejected(TestBroker::tansu().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_resumed_under_a_changed_plan_stops_with_plan_changed_embedded() {
    a_task_resumed_under_a_changed_plan_stops_with_plan_changed(TestBroker::embedded()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_resumed_under_a_changed_plan_stops_with_plan_changed_tansu() {
    a_task_resumed_under_a_changed_plan_stops_with_plan_changed(TestBroker::tansu().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_too_large_for_the_snapshot_fails_the_task_which_reverts_embedded() {
    an_output_too_large_for_the_snapshot_fails_the_task_which_reverts(TestBroker::embedded()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_too_large_for_the_snapshot_fails_the_task_which_reverts_tansu() {
    an_output_too_large_for_the_snapshot_fails_the_task_which_reverts(TestBroker::tansu().await).await;
}

//! A plan worker process killed with SIGKILL while a child runs: a second `ferry worker
//! plan` process resumes the plan, re-attaches to the running child, and submits no child
//! twice. Real processes against the embedded broker in this test process; the `test`
//! children run on an in-process `test` worker.

// Each kind registers itself in its worker crate (ferry_task::kind): link every one Ferry
// ships, as the `ferry` binary does, so that topics and schemas cover them all.
use {ferry_cluster as _, ferry_deploy as _, ferry_offload as _, ferry_peer as _, ferry_plan as _, ferry_score as _};

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ferry_runtime::protocol::CommandEnvelope;
use ferry_runtime::testkind::{TestHandler, TestTaskSpec};
use ferry_runtime::{Client, EmbeddedBroker, EventType, KafkaConfig, SubmitOptions, TaskId, TaskKind, TaskState, Topics, Worker, WorkerOptions};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(120);

/// A `ferry worker plan` process, killed on drop.
struct PlanWorker(Child);

impl PlanWorker {
    fn spawn(bootstrap: &str, log: &std::path::Path) -> Self {
        let log = std::fs::File::create(log).expect("worker log");
        let child = Command::new(env!("CARGO_BIN_EXE_ferry"))
            .args(["worker", "plan", "--brokers", bootstrap])
            // Fast failure detection, so that a killed worker's partitions move in seconds.
            .args(["--kafka-property", "session.timeout.ms=6000", "--kafka-property", "heartbeat.interval.ms=500"])
            .args(["--kafka-property", "fetch.wait.max.ms=5"])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn ferry worker plan");
        Self(child)
    }

    fn kill(mut self) {
        self.0.kill().expect("SIGKILL");
        self.0.wait().unwrap();
    }
}

impl Drop for PlanWorker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn child(plan: TaskId, step: &str) -> TaskId {
    TaskId::for_idempotency_key(TaskKind::TEST, &format!("plan/{plan}/{step}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_plan_worker_is_replaced_and_no_child_is_submitted_twice() {
    let topics = Topics::standard();
    let broker = EmbeddedBroker::start(3, &topics).unwrap();
    let bootstrap = broker.bootstrap();
    let kafka = KafkaConfig::for_embedded(bootstrap.clone());
    let client = Client::new(kafka.clone(), topics.clone()).unwrap();
    let mut events = client.events(true).await.unwrap();
    let logs = tempfile::tempdir().unwrap();

    let mut opts = WorkerOptions::new(kafka);
    opts.topics = topics.clone();
    opts.shutdown_grace = Duration::from_secs(2);
    let stop = CancellationToken::new();
    let tests = tokio::spawn(Worker::new(opts, TestHandler { min_delay: Some(Duration::from_millis(10)), effects: None }).run(stop.clone()));
    let first = PlanWorker::spawn(&bootstrap, &logs.path().join("plan-1.log"));

    let step = |name: &str, spec: TestTaskSpec| json!({"name": name, "kind": "test", "subject": format!("crash/{name}"), "spec": serde_json::to_value(spec).unwrap()});
    let plan: ferry_plan::spec::PlanSpec = serde_json::from_value(json!({"steps": [
        step("one", TestTaskSpec::steps(2)),
        step("two", TestTaskSpec { step_ms: 3000, ..TestTaskSpec::steps(3) }),
        step("three", TestTaskSpec::steps(1)),
    ]}))
    .unwrap();
    let id = client.submit(TaskKind::PLAN, "crash", &plan, SubmitOptions::default()).await.unwrap();
    events.until(child(id, "two"), WAIT, |e| e.event == EventType::StepStarted).await.unwrap_or_else(|e| panic!("{e}"));
    first.kill();
    assert_eq!(client.snapshot(child(id, "two")).await.unwrap().map(|s| s.state), Some(TaskState::Running), "child two runs on");

    let _second = PlanWorker::spawn(&bootstrap, &logs.path().join("plan-2.log"));
    let evs = events.until(id, WAIT, |e| e.event.is_final()).await.unwrap_or_else(|e| {
        let log = std::fs::read_to_string(logs.path().join("plan-2.log")).unwrap_or_default();
        panic!("{e}\nsecond plan worker's log:\n{log}")
    });
    assert_eq!(evs.last().unwrap().event, EventType::Succeeded, "{evs:#?}");
    let workers: std::collections::BTreeSet<&str> = evs.iter().map(|e| e.worker.as_str()).collect();
    assert_eq!(workers.len(), 2, "two plan workers wrote the plan's events: {workers:?}");
    assert_eq!(evs.iter().filter(|e| e.event == EventType::StepStarted && e.step == Some(1)).count(), 1, "step one is not run again");

    // One Start command per (plan, step): the resumed plan re-attached to child two.
    let prefix = format!("plan/{id}/");
    let mut starts: BTreeMap<String, usize> = BTreeMap::new();
    for (_, payload) in client.read_to_end(&topics.command(TaskKind::TEST).name).await.unwrap() {
        let env: CommandEnvelope = client.registry().decode(&payload).unwrap();
        if let Some(key) = env.idempotency_key.filter(|k| k.starts_with(&prefix)) {
            *starts.entry(key).or_default() += 1;
        }
    }
    assert_eq!(starts, ["one", "two", "three"].iter().map(|s| (format!("{prefix}{s}"), 1)).collect::<BTreeMap<_, _>>());
    for name in ["one", "two", "three"] {
        // The plan ends on its children's snapshots; a child's own Succeeded is another
        // partition's record from another producer, and may come after the plan's.
        events.until(child(id, name), WAIT, |e| e.event == EventType::Succeeded).await.unwrap_or_else(|e| panic!("child {name}: {e}"));
        let history = client.history(child(id, name)).await.unwrap();
        assert_eq!(history.iter().filter(|e| e.event == EventType::Accepted).count(), 1, "child {name} accepted once");
        assert_eq!(history.last().map(|e| e.event), Some(EventType::Succeeded), "child {name}");
    }
    stop.cancel();
    tests.await.unwrap().unwrap();
}

//! Worker processes killed with SIGKILL mid-step: other instances resume their tasks and
//! none is lost (issue: runtime must-show 3). Real processes (`ferry worker test`) against
//! the embedded broker in this test process.

// Each kind registers itself in its worker crate (ferry_task::kind): link every one Ferry
// ships, as the `ferry` binary does, so that topics and schemas cover them all.
use {ferry_cluster as _, ferry_deploy as _, ferry_offload as _, ferry_peer as _, ferry_plan as _, ferry_score as _};

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ferry_runtime::testkind::TestTaskSpec;
use ferry_runtime::{Client, EmbeddedBroker, EventType, KafkaConfig, SubmitOptions, TaskKind, TaskState, Topics};
use rand::Rng;

struct Workers {
    bootstrap: String,
    procs: Vec<Child>,
}

impl Workers {
    fn spawn(&mut self) {
        let child = Command::new(env!("CARGO_BIN_EXE_ferry"))
            .args(["worker", "test", "--brokers", &self.bootstrap])
            // Fast failure detection so a killed worker's partitions move in seconds.
            .args(["--kafka-property", "session.timeout.ms=6000", "--kafka-property", "heartbeat.interval.ms=500"])
            .args(["--kafka-property", "fetch.wait.max.ms=5"])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ferry worker");
        self.procs.push(child);
    }

    fn kill_one(&mut self) {
        let i = rand::rng().random_range(0..self.procs.len());
        let mut c = self.procs.remove(i);
        c.kill().expect("SIGKILL");
        c.wait().unwrap();
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for c in &mut self.procs {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

async fn run(tasks: usize, kills_at: &[usize], spec: TestTaskSpec) {
    let topics = Topics::standard();
    let broker = EmbeddedBroker::start(3, &topics).unwrap();
    let bootstrap = broker.bootstrap();
    let client = Client::new(KafkaConfig::for_embedded(bootstrap.clone()), topics).unwrap();
    let mut events = client.events(true).await.unwrap();
    let mut workers = Workers { bootstrap, procs: Vec::new() };
    for _ in 0..3 {
        workers.spawn();
    }
    let mut ids = Vec::new();
    for i in 0..tasks {
        ids.push(client.submit(TaskKind::TEST, &format!("cluster-{}", i % 100), &spec, SubmitOptions::default()).await.unwrap());
    }
    let want: HashMap<String, usize> = ids.iter().enumerate().map(|(i, id)| (id.to_string(), i)).collect();
    let mut finals: HashMap<String, EventType> = HashMap::new();
    let mut kills = kills_at.iter().peekable();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    while finals.len() < tasks {
        let ev = tokio::time::timeout_at(deadline, events.next())
            .await
            .unwrap_or_else(|_| panic!("only {} of {tasks} tasks finished", finals.len()))
            .unwrap();
        if !want.contains_key(&ev.task_id) {
            continue;
        }
        if ev.event.is_final() {
            finals.insert(ev.task_id.clone(), ev.event);
        }
        if kills.peek().is_some_and(|k| finals.len() >= **k) {
            kills.next();
            workers.kill_one();
            workers.spawn();
        }
    }
    let failed: Vec<_> = finals.iter().filter(|(_, e)| **e != EventType::Succeeded).collect();
    assert!(failed.is_empty(), "tasks that did not succeed: {failed:?}");
    // The durable state agrees: every task's snapshot is Succeeded with all steps journaled.
    let snaps = client.snapshots().await.unwrap();
    let mut succeeded = 0;
    for s in snaps.iter().filter(|s| want.contains_key(&s.task_id)) {
        assert_eq!(s.state, TaskState::Succeeded, "{}", s.task_id);
        assert_eq!(s.journal.len(), spec.steps as usize);
        succeeded += 1;
    }
    assert_eq!(succeeded, tasks, "every task has a snapshot");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_step_is_resumed_by_another() {
    // Long steps, so the kill lands while steps are running.
    run(30, &[5], TestTaskSpec { step_ms: 400, ..TestTaskSpec::steps(3) }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_tasks_with_random_kills_lose_nothing() {
    run(1000, &[100, 350, 600, 850], TestTaskSpec { step_ms: 10, ..TestTaskSpec::steps(3) }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_a_worker_cleanly_and_another_finishes_its_task() {
    let topics = Topics::standard();
    let broker = EmbeddedBroker::start(1, &topics).unwrap();
    let bootstrap = broker.bootstrap();
    let client = Client::new(KafkaConfig::for_embedded(bootstrap.clone()), topics).unwrap();
    let mut events = client.events(true).await.unwrap();
    let mut workers = Workers { bootstrap, procs: Vec::new() };
    workers.spawn();
    let spec = TestTaskSpec { step_ms: 1500, ..TestTaskSpec::steps(3) };
    let id = client.submit(TaskKind::TEST, "graceful", &spec, SubmitOptions::default()).await.unwrap();
    events.until(id, Duration::from_secs(60), |e| e.event == EventType::StepStarted).await.unwrap();
    let mut first = workers.procs.remove(0);
    let pid = first.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let status = tokio::time::timeout(Duration::from_secs(60), tokio::task::spawn_blocking(move || first.wait()))
        .await
        .expect("the worker exits within its grace period")
        .unwrap()
        .unwrap();
    assert!(status.success(), "clean exit on SIGTERM: {status:?}");
    workers.spawn();
    let evs = events.until(id, Duration::from_secs(120), |e| e.event.is_final()).await.unwrap();
    assert_eq!(evs.last().unwrap().event, EventType::Succeeded);
    let snap = client.snapshot(id).await.unwrap().unwrap();
    assert_eq!(snap.state, TaskState::Succeeded);
}

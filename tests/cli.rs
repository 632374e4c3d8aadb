//! The `ferry` CLI contract against the embedded broker: `submit --wait` exit codes, JSON
//! output that parses, `tasks get|list|cancel|revert`.

// Each kind registers itself in its worker crate (ferry_task::kind): link every one Ferry
// ships, as the `ferry` binary does, so that topics and schemas cover them all.
use {ferry_cluster as _, ferry_deploy as _, ferry_offload as _, ferry_peer as _, ferry_plan as _, ferry_score as _};

use std::time::Duration;

use ferry_runtime::testkind::TestHandler;
use ferry_runtime::{Client, EmbeddedBroker, EventType, KafkaConfig, TaskId, TaskKind, Topics, Worker, WorkerOptions};
use tokio_util::sync::CancellationToken;

struct Env {
    bootstrap: String,
    client: Client,
    dir: tempfile::TempDir,
    stop: CancellationToken,
    worker: Option<tokio::task::JoinHandle<Result<(), ferry_runtime::WorkerError>>>,
    // Dropped last: the worker must be stopped before its broker goes away.
    _broker: EmbeddedBroker,
}

async fn env() -> Env {
    env_with_policy(None)
}

/// A broker and a `test` worker; with tenant `rules` (a policy), the tenants' topics too
/// and the worker held to them.
fn env_with_policy(rules: Option<&str>) -> Env {
    let topics = Topics::standard();
    let broker = EmbeddedBroker::start(1, &topics).unwrap();
    let bootstrap = broker.bootstrap();
    let kafka = KafkaConfig::for_embedded(bootstrap.clone());
    let mut opts = WorkerOptions::new(kafka.clone());
    opts.shutdown_grace = Duration::from_secs(1);
    if let Some(rules) = rules {
        let policy = ferry_runtime::tenants::Policy::parse(rules).unwrap();
        for t in topics.tenant_topics(&policy) {
            broker.create_topic(&t.name, t.partitions, 1).unwrap();
        }
        opts.policy = Some(std::sync::Arc::new(policy));
    }
    let stop = CancellationToken::new();
    let handler = TestHandler { min_delay: Some(Duration::from_millis(10)), effects: None };
    let worker = tokio::spawn(Worker::new(opts, handler).run(stop.clone()));
    let client = Client::new(kafka, topics).unwrap();
    Env { bootstrap, client, dir: tempfile::tempdir().unwrap(), stop, worker: Some(worker), _broker: broker }
}

impl Env {
    /// Stops the worker gracefully while its broker still runs.
    async fn shutdown(mut self) {
        self.stop.cancel();
        if let Some(w) = self.worker.take() {
            w.await.unwrap().unwrap();
        }
    }
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Env {
    async fn ferry(&self, args: &[&str]) -> Out {
        let o = tokio::process::Command::new(env!("CARGO_BIN_EXE_ferry"))
            .args(args)
            .args(["--brokers", &self.bootstrap, "--kafka-property", "fetch.wait.max.ms=5"])
            .env("RUST_LOG", "error")
            .output()
            .await
            .unwrap();
        Out {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }

    fn spec(&self, name: &str, body: &str) -> String {
        let p = self.dir.path().join(name);
        std::fs::write(&p, body).unwrap();
        p.display().to_string()
    }

    /// `ferry worker plan` on the broker (killed when dropped).
    fn plan_worker(&self) -> tokio::process::Child {
        self.plan_worker_with(&[])
    }

    /// [`Self::plan_worker`] with more arguments (`--policy FILE`).
    fn plan_worker_with(&self, more: &[&str]) -> tokio::process::Child {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_ferry"))
            .args(["worker", "plan", "--brokers", &self.bootstrap, "--kafka-property", "fetch.wait.max.ms=5", "--http", "127.0.0.1:0"])
            .args(more)
            .env("RUST_LOG", "error")
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap()
    }

    /// `ferry tasks watch ID` in the background, once it follows the task (its "watching"
    /// line read).
    async fn watch(&self, id: &str) -> Watch {
        self.follow(&["tasks", "watch", id], "watching 1 task(s) until they end").await
    }

    /// `ferry ARGS` in the background, once it has said `ready` (a line of stderr starting so).
    async fn follow(&self, args: &[&str], ready: &str) -> Watch {
        use tokio::io::AsyncBufReadExt;
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ferry"))
            .args(args)
            .args(["--brokers", &self.bootstrap, "--kafka-property", "fetch.wait.max.ms=5"])
            .env("RUST_LOG", "error")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let mut w = Watch { child, stdout, lines, stderr: Vec::new(), deadline: tokio::time::Instant::now() + Duration::from_secs(120) };
        while !w.stderr.iter().any(|l| l.starts_with(ready)) {
            let line = tokio::time::timeout_at(w.deadline, w.lines.next_line()).await.expect("it starts").unwrap();
            w.stderr.push(line.unwrap_or_else(|| panic!("ferry {args:?} ended before it said {ready:?}: {:?}", w.stderr)));
        }
        w
    }
}

/// A `ferry tasks watch` (or another command that follows tasks) running in the background.
struct Watch {
    child: tokio::process::Child,
    stdout: tokio::process::ChildStdout,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStderr>>,
    /// The stderr lines read so far.
    stderr: Vec<String>,
    deadline: tokio::time::Instant,
}

impl Watch {
    /// Waits for the watch to end: its exit code, stdout and stderr lines.
    async fn end(mut self) -> (Option<i32>, String, Vec<String>) {
        use tokio::io::AsyncReadExt;
        while let Some(line) = tokio::time::timeout_at(self.deadline, self.lines.next_line()).await.expect("the watch ends").unwrap() {
            self.stderr.push(line);
        }
        let code = tokio::time::timeout_at(self.deadline, self.child.wait()).await.expect("the watch ends").unwrap().code();
        let mut out = String::new();
        self.stdout.read_to_string(&mut out).await.unwrap();
        (code, out, self.stderr)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_wait_exit_codes_and_json_output() {
    let env = env().await;
    let ok = env.spec("ok.yaml", "subject: a\nspec: {steps: 3, fail_transient: 0, step_ms: 0}\n");
    let out = env.ferry(&["submit", "test", "-f", &ok, "--wait"]).await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("Succeeded"), "{}", out.stdout);
    assert_eq!(out.stdout.lines().filter(|l| l.contains("StepSucceeded")).count(), 3);

    let bad = env.spec("bad.yaml", "subject: b\nspec: {steps: 2, fail_at: 1, fail_transient: 0, step_ms: 0}\n");
    let out = env.ferry(&["submit", "test", "-f", &bad, "--wait", "--output", "json"]).await;
    assert_eq!(out.code, 1, "a reverted task is not a success: {}{}", out.stdout, out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["state"], "Reverted");
    assert_eq!(v["error"]["code"], "INJECTED_FAILURE");

    let invalid = env.spec("invalid.yaml", "subject: c\nspec: {steps: 0, fail_transient: 0, step_ms: 0}\n");
    let out = env.ferry(&["submit", "test", "-f", &invalid, "--wait"]).await;
    assert_eq!(out.code, 1);
    assert!(out.stdout.contains("Rejected: invalid test spec: steps must be 1 to 100, got 0"), "{}", out.stdout);

    let out = env.ferry(&["submit", "test", "-f", &ok, "--output", "json"]).await;
    assert_eq!(out.code, 0);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let id: TaskId = v["task_id"].as_str().unwrap().parse().unwrap();
    let mut events = env.client.events(true).await.unwrap();
    events.until(id, Duration::from_secs(60), |e| e.event == EventType::Succeeded).await.unwrap();
    let out = env.ferry(&["tasks", "get", &id.to_string(), "--output", "json"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["task"]["state"], "Succeeded");
    assert_eq!(v["task"]["steps"].as_array().unwrap().len(), 3);
    assert_eq!(v["task"]["revert_would_undo"], serde_json::json!(["step-3", "step-2", "step-1"]));
    assert_eq!(v["events"].as_array().unwrap().len(), 8);

    let out = env.ferry(&["tasks", "list", "--state", "succeeded", "--output", "json"]).await;
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert!(v.as_array().unwrap().iter().any(|t| t["task_id"] == id.to_string()));
    // `--kind` reads that kind's task-state topic alone.
    let out = env.ferry(&["tasks", "list", "--kind", "test", "--output", "json"]).await;
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert!(v.as_array().unwrap().iter().any(|t| t["task_id"] == id.to_string()), "{v}");
    let out = env.ferry(&["tasks", "list", "--kind", "deploy", "--output", "json"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert!(v.as_array().unwrap().iter().all(|t| t["kind"] == "deploy"), "{v}");

    let missing = env.ferry(&["submit", "test", "-f", "/nonexistent.yaml"]).await;
    assert_eq!(missing.code, 2);
    assert!(missing.stderr.contains("reading /nonexistent.yaml"), "{}", missing.stderr);
    env.shutdown().await;
}

/// A task whose last snapshot a newer Ferry's worker wrote (a record version this ferry
/// does not know, as in a rolling upgrade): `tasks get` says to upgrade instead of showing
/// the older snapshot as the task's state, and `tasks list` leaves it out and names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_a_newer_ferry_wrote_last_is_named_not_shown_stale() {
    let mut env = env().await;
    let ok = env.spec("ok.yaml", "subject: n\nspec: {steps: 1, fail_transient: 0, step_ms: 0}\n");
    let out = env.ferry(&["submit", "test", "-f", &ok, "--wait", "--output", "json"]).await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let id = serde_json::from_str::<serde_json::Value>(&out.stdout).unwrap()["task_id"].as_str().unwrap().to_owned();
    // A worker stops on such a record (an old worker in an upgrade): this one first.
    env.stop.cancel();
    env.worker.take().unwrap().await.unwrap().unwrap();
    let topic = Topics::standard().task_state(TaskKind::TEST).name.clone();
    let newer = env.client.registry().id_of::<ferry_runtime::TaskSnapshot>().unwrap() + 1;
    let mut record = vec![0];
    record.extend_from_slice(&newer.to_be_bytes());
    record.extend_from_slice(&[2, 4, 6, 8]);
    env.client.send_raw(&topic, Some(id.as_bytes()), &record, rdkafka::message::OwnedHeaders::new()).await.unwrap();

    let get = env.ferry(&["tasks", "get", &id]).await;
    assert_eq!(get.code, 2, "{}{}", get.stdout, get.stderr);
    assert!(get.stdout.is_empty(), "the older state was shown: {}", get.stdout);
    assert!(get.stderr.contains(&format!("task {id}'s state is in record version (schema id) {newer}, newer than this ferry knows")) && get.stderr.contains("upgrade this ferry"), "{}", get.stderr);
    let list = env.ferry(&["tasks", "list"]).await;
    assert_eq!(list.code, 0, "{}", list.stderr);
    assert!(!list.stdout.contains(&id), "{}", list.stdout);
    assert!(list.stderr.contains(&format!("warning: 1 task(s) left out ({id}): their state is in a record version newer than this ferry knows")), "{}", list.stderr);
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_and_revert_through_the_cli() {
    let env = env().await;
    let blocked = env.spec("blocked.yaml", "subject: d\nspec: {steps: 3, block_at: 2, fail_transient: 0, step_ms: 0}\n");
    let mut events = env.client.events(true).await.unwrap();
    let out = env.ferry(&["submit", "test", "-f", &blocked]).await;
    assert_eq!(out.code, 0);
    let id: TaskId = out.stdout.trim().parse().unwrap();
    events.until(id, Duration::from_secs(60), |e| e.event == EventType::StepProgress).await.unwrap();
    let out = env.ferry(&["tasks", "cancel", &id.to_string()]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    events.until(id, Duration::from_secs(60), |e| e.event == EventType::Cancelled).await.unwrap();
    // The undo plan: step 2 (started, blocked, cancelled) then step 1 (finished, with its
    // output); nothing goes to the command topic.
    let commands = Topics::standard().command(TaskKind::TEST).name.clone();
    let before = env.client.read_to_end(&commands).await.unwrap().len();
    let out = env.ferry(&["tasks", "revert", &id.to_string(), "--dry-run", "-o", "json"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let plan: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let steps: Vec<(i64, &str)> = plan["would_undo"].as_array().unwrap().iter().map(|u| (u["step"].as_i64().unwrap(), u["status"].as_str().unwrap())).collect();
    assert_eq!(steps, [(2, "Started"), (1, "Succeeded")], "{}", out.stdout);
    assert!(plan["would_undo"][0]["output"].is_null() && !plan["would_undo"][1]["output"].is_null(), "{}", out.stdout);
    assert_eq!(plan["sent"], false);
    assert_eq!(env.client.read_to_end(&commands).await.unwrap().len(), before, "a dry run sent a command");
    let table = env.ferry(&["tasks", "revert", &id.to_string(), "--dry-run"]).await;
    assert!(table.stdout.contains("a revert undoes these steps, last first") && table.stderr.contains("dry run: nothing sent"), "{}{}", table.stdout, table.stderr);
    let out = env.ferry(&["tasks", "revert", &id.to_string(), "--wait"]).await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("Reverted"));
    assert_eq!(out.stdout.lines().filter(|l| l.contains("StepReverted")).count(), 2);

    // What would do nothing is not sent, and says why: a cancel or a signal of a task that
    // has ended (each refused, exit 1), a revert of one Reverted or Rejected (exit 0: nothing
    // of it is in effect; before, `--wait` waited out its whole timeout for a Rejected one).
    let before = env.client.read_to_end(&commands).await.unwrap().len();
    let out = env.ferry(&["tasks", "cancel", &id.to_string()]).await;
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    assert!(out.stderr.contains(&format!("task {id} has ended (Reverted): there is nothing to cancel; nothing sent")), "{}", out.stderr);
    let out = env.ferry(&["tasks", "signal", &id.to_string(), "approve"]).await;
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("a signal reaches only a queued or running task; nothing sent"), "{}", out.stderr);
    // A name no task takes is said first, whatever the task.
    let out = env.ferry(&["tasks", "signal", &id.to_string(), "Approve!"]).await;
    assert_ne!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("signal \"Approve!\": 1 to 63 lowercase letters"), "{}", out.stderr);
    let out = env.ferry(&["tasks", "revert", &id.to_string(), "--wait"]).await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains(&format!("task {id} is Reverted: there is nothing to revert; nothing sent")), "{}", out.stdout);
    let rejected = env.spec("rejected.yaml", "subject: d\nspec: {steps: 0}\n");
    let out = env.ferry(&["submit", "test", "-f", &rejected, "--wait"]).await;
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    let rejected = out.stderr.split_whitespace().find(|w| w.starts_with("tsk_")).unwrap().to_owned();
    let out = env.ferry(&["tasks", "revert", &rejected, "--wait", "--timeout", "10m"]).await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains(&format!("task {rejected} is Rejected: there is nothing to revert; nothing sent")), "{}", out.stdout);
    // The rejected submit is the only command written since.
    assert_eq!(env.client.read_to_end(&commands).await.unwrap().len(), before + 1, "a pointless control was sent");
    // One another client sends anyway is listed as asked, not as done.
    env.client.cancel(id).await.unwrap();
    let out = env.ferry(&["tasks", "get", &id.to_string(), "-o", "json"]).await;
    let got: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let controls: Vec<(&str, bool)> = got["controls"].as_array().unwrap().iter().map(|c| (c["action"].as_str().unwrap(), c["after_end"].as_bool().unwrap_or(false))).collect();
    assert_eq!(controls, [("Cancel", false), ("Revert", false), ("Cancel", true)], "{}", out.stdout);
    let table = env.ferry(&["tasks", "get", &id.to_string()]).await.stdout;
    assert!(table.contains("Cancelled by:") && table.contains("Cancel asked by:") && table.contains("(after it had ended: nothing done)"), "{table}");
    env.shutdown().await;
}

/// A plan's child tasks: `tasks get` lists them with the step (and cluster) each runs for,
/// and `tasks revert --dry-run` names those a revert would revert, in order (before, the
/// dry run of a plan showed only its own steps, "no output", and not the tasks it undoes);
/// a `keep: true` step's are named as kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plans_children_are_listed_and_its_revert_dry_run_names_them() {
    let env = env().await;
    let mut events = env.client.events(true).await.unwrap();
    let mut plans = env.plan_worker();
    let plan = env.spec("plan.yaml", "subject: kids\nspec:\n  steps:\n    - {name: one, kind: test, subject: kids/one, keep: true, spec: {steps: 1, fail_transient: 0, step_ms: 0}}\n    - {name: two, kind: test, subject: kids/two, spec: {steps: 1, fail_transient: 0, step_ms: 0}}\n    - {name: three, kind: test, subject: kids/three, spec: {steps: 2, block_at: 1, fail_transient: 0, step_ms: 0}}\n");
    let out = env.ferry(&["submit", "plan", "-f", &plan]).await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let id: TaskId = out.stdout.trim().parse().unwrap();
    let child = |step: &str| TaskId::for_idempotency_key(TaskKind::TEST, &format!("plan/{id}/{step}")).to_string();
    // Child three blocks in its first step: the plan waits on it.
    events.until(child("three").parse().unwrap(), Duration::from_secs(120), |e| e.event == EventType::StepProgress).await.unwrap();

    let out = env.ferry(&["tasks", "get", &id.to_string(), "-o", "json"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let got: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let children: Vec<(&str, &str, &str)> = got["children"].as_array().unwrap().iter().map(|c| (c["task_id"].as_str().unwrap(), c["step"].as_str().unwrap(), c["state"].as_str().unwrap())).collect();
    let (one, two, three) = (child("one"), child("two"), child("three"));
    assert_eq!(children, [(one.as_str(), "one", "Succeeded"), (two.as_str(), "two", "Succeeded"), (three.as_str(), "three", "Running")], "{}", out.stdout);
    let table = env.ferry(&["tasks", "get", &id.to_string()]).await.stdout;
    assert!(table.lines().any(|l| l.starts_with(&three) && l.contains("kids/three") && l.contains("Running")), "{table}");
    // A child names its plan and step.
    let out = env.ferry(&["tasks", "get", &three, "-o", "json"]).await;
    let got: serde_json::Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}{}", out.stdout, out.stderr));
    assert_eq!(got["task"]["plan"], serde_json::json!({"task_id": id.to_string(), "step": "three"}), "{}", out.stdout);
    let table = env.ferry(&["tasks", "get", &three]).await.stdout;
    assert!(table.lines().any(|l| l.starts_with("Plan:") && l.ends_with(&format!("{id} (step three)"))), "{table}");
    let out = env.ferry(&["tasks", "get", &id.to_string(), "-o", "json"]).await;
    assert!(serde_json::from_str::<serde_json::Value>(&out.stdout).unwrap()["task"].get("plan").is_none(), "a plan is no child: {}", out.stdout);

    let out = env.ferry(&["tasks", "revert", &id.to_string(), "--dry-run", "-o", "json"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let undo: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let steps: Vec<(&str, Vec<&str>, bool)> = undo["would_undo"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| {
            let reverts = u["reverts_children"].as_array().map(|c| c.iter().map(|c| c["task_id"].as_str().unwrap()).collect()).unwrap_or_default();
            (u["name"].as_str().unwrap(), reverts, u["keeps_children"].as_bool().unwrap_or(false))
        })
        .collect();
    assert_eq!(steps, [("three", vec![three.as_str()], false), ("two", vec![two.as_str()], false), ("one", vec![], true)], "{}", out.stdout);
    let table = env.ferry(&["tasks", "revert", &id.to_string(), "--dry-run"]).await.stdout;
    let listed = table.split_once("child tasks it reverts, in order:").map(|(_, t)| t).unwrap_or_else(|| panic!("{table}"));
    assert!(listed.find(&three) < listed.find(&two) && !listed.contains(&one), "{table}");
    assert!(table.contains("step one keeps its children (keep: true)"), "{table}");

    let out = env.ferry(&["tasks", "cancel", &id.to_string()]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    events.until(id, Duration::from_secs(120), |e| e.event.is_final()).await.unwrap();
    plans.kill().await.unwrap();
    env.shutdown().await;
}

/// A running task reverted while watched: the watch follows its undo to Reverted, exit 0
/// (before, it ended at the Cancelled that starts the revert of a running task, exit 1,
/// while the undo went on unwatched).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_follows_a_running_tasks_revert_to_its_end() {
    let env = env().await;
    let mut events = env.client.events(true).await.unwrap();
    let blocked = env.spec("blocked.yaml", "subject: undone\nspec: {steps: 2, block_at: 2, fail_transient: 0, step_ms: 0}\n");
    let id = env.ferry(&["submit", "test", "-f", &blocked]).await.stdout.trim().to_owned();
    events.until(id.parse().unwrap(), Duration::from_secs(120), |e| e.event == EventType::StepProgress).await.unwrap();
    let watch = env.watch(&id).await;
    let out = env.ferry(&["tasks", "revert", &id]).await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let (code, out, stderr) = watch.end().await;
    assert_eq!((code, out.trim()), (Some(0), format!("{id} test undone Reverted").as_str()), "{stderr:#?}");
    env.shutdown().await;
}

/// `submit --wait` of a task someone reverts while it runs follows the undo to its end:
/// the Cancelled that starts the revert, then Reverted, exit 1 (it did not succeed).
/// Before, it ended at that Cancelled while the undo went on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submit_wait_follows_a_revert_of_its_task_to_the_end() {
    let env = env().await;
    let mut events = env.client.events(true).await.unwrap();
    let blocked = env.spec("blocked.yaml", "subject: undone-wait\nspec: {steps: 2, block_at: 2, fail_transient: 0, step_ms: 0}\n");
    let wait = env.follow(&["submit", "test", "-f", &blocked, "--wait"], "task ").await;
    let id = wait.stderr.iter().find_map(|l| l.strip_prefix("task ")?.strip_suffix(" submitted; following its progress")).expect("the task's id").to_owned();
    events.until(id.parse().unwrap(), Duration::from_secs(120), |e| e.event == EventType::StepProgress).await.unwrap();
    let out = env.ferry(&["tasks", "revert", &id]).await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let (code, out, stderr) = wait.end().await;
    assert_eq!(code, Some(1), "{out}{stderr:#?}");
    let said: Vec<&str> = out.lines().filter_map(|l| Some(l.split_whitespace().nth(1)?.trim_end_matches(':'))).collect();
    let cancelled = said.iter().position(|e| *e == "Cancelled").unwrap_or_else(|| panic!("no Cancelled: {out}"));
    assert_eq!(said.last(), Some(&"Reverted"), "{out}");
    assert!(cancelled < said.len() - 1, "{out}");
    assert!(stderr.iter().any(|l| l == &format!("task {id} was cancelled for a revert; following its undo until it ends")), "{stderr:#?}");
    env.shutdown().await;
}

/// `tasks watch` of a plan follows its children under it: each child's end, and a later
/// revert of it by the plan's undo, is said on stderr as a `child` line naming its plan and
/// step, whether the child came while the watch ran or was there when it started; the exit
/// code stays the plan's (before, a plan's watch showed the plan's own bar only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watching_a_plan_follows_its_children() {
    let env = env().await;
    let mut plans = env.plan_worker();
    // The plan's id follows from its key: the watch starts before the plan is sent.
    let id = TaskId::for_idempotency_key(TaskKind::PLAN, "watched-kids");
    let child = |step: &str| TaskId::for_idempotency_key(TaskKind::TEST, &format!("plan/{id}/{step}")).to_string();
    let (one, two) = (child("one"), child("two"));
    let watch = env.watch(&id.to_string()).await;
    // Step two's child fails: the plan fails, and its undo reverts step one's child.
    let plan = env.spec("plan.yaml", "subject: watched\nspec:\n  steps:\n    - {name: one, kind: test, subject: watched/one, spec: {steps: 1, fail_transient: 0, step_ms: 0}}\n    - {name: two, kind: test, subject: watched/two, spec: {steps: 2, fail_at: 2, fail_transient: 0, step_ms: 0}}\n");
    let out = env.ferry(&["submit", "plan", "-f", &plan, "--idempotency-key", "watched-kids"]).await;
    assert_eq!((out.code, out.stdout.trim()), (0, id.to_string().as_str()), "{}", out.stderr);
    let (code, out, stderr) = watch.end().await;
    assert_eq!(code, Some(1), "the plan failed: {out}{stderr:#?}");
    assert!(out.contains(&format!("{id} plan watched Reverted")), "{out}");
    let said = |stderr: &[String], child: &str, step: &str, state: &str| {
        let head = format!("child {child} test watched/{step} {state} (plan {id}, step {step})");
        stderr.iter().position(|l| l.starts_with(&head)).unwrap_or_else(|| panic!("no {head:?} in {stderr:#?}"))
    };
    let (ended, failed, undone) = (said(&stderr, &one, "one", "Succeeded"), said(&stderr, &two, "two", "Reverted"), said(&stderr, &one, "one", "Reverted"));
    assert!(ended < failed && failed < undone, "{stderr:#?}");

    // Watched once it is over: the plan's end, and each child's last.
    let again = env.ferry(&["tasks", "watch", &id.to_string()]).await;
    assert_eq!(again.code, 1, "{}{}", again.stdout, again.stderr);
    assert!(again.stdout.contains(&format!("{id} plan watched Reverted")), "{}", again.stdout);
    let stderr: Vec<String> = again.stderr.lines().map(str::to_owned).collect();
    said(&stderr, &one, "one", "Reverted");
    said(&stderr, &two, "two", "Reverted");
    assert!(!again.stderr.contains("Succeeded"), "{}", again.stderr);
    plans.kill().await.unwrap();
    env.shutdown().await;
}

/// A plan worker in a rolling upgrade across a protocol version: a child a newer Ferry's
/// worker wrote last has a state this one cannot know. It stops ("upgrade this one") with
/// nothing more written for the plan, rather than wait on the child's older state until
/// the child timeout and fail (and undo) the plan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_worker_stops_on_a_child_a_newer_ferry_wrote() {
    use tokio::io::AsyncReadExt;
    let mut env = env().await;
    let mut plans = tokio::process::Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["worker", "plan", "--brokers", &env.bootstrap, "--kafka-property", "fetch.wait.max.ms=5", "--http", "127.0.0.1:0"])
        .env("RUST_LOG", "error")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let id = TaskId::for_idempotency_key(TaskKind::PLAN, "upgraded-kids");
    let child = TaskId::for_idempotency_key(TaskKind::TEST, &format!("plan/{id}/one"));
    let mut events = env.client.events(true).await.unwrap();
    let plan = env.spec("plan.yaml", "subject: upgraded\nspec:\n  steps:\n    - {name: one, kind: test, subject: upgraded/one, spec: {steps: 2, block_at: 1, fail_transient: 0, step_ms: 0}}\n");
    let out = env.ferry(&["submit", "plan", "-f", &plan, "--idempotency-key", "upgraded-kids"]).await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    // The child runs (held at its first step) and the plan waits on it.
    events.until(child, Duration::from_secs(60), |e| e.event == EventType::StepStarted).await.unwrap();

    // A newer worker of the child's kind wrote it last.
    let topic = Topics::standard().task_state(TaskKind::TEST).name.clone();
    let newer = env.client.registry().id_of::<ferry_runtime::TaskSnapshot>().unwrap() + 1;
    let mut record = vec![0];
    record.extend_from_slice(&newer.to_be_bytes());
    record.extend_from_slice(&[2, 4, 6, 8]);
    env.client.send_raw(&topic, Some(child.to_string().as_bytes()), &record, rdkafka::message::OwnedHeaders::new()).await.unwrap();
    let stopped = tokio::time::timeout(Duration::from_secs(120), plans.wait()).await.expect("the plan worker stops of itself").unwrap();
    let mut stderr = String::new();
    plans.stderr.take().unwrap().read_to_string(&mut stderr).await.unwrap();
    assert_eq!(stopped.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&format!("of task {child} in record version (schema id) {newer}, newer than this program knows")) && stderr.contains("upgrade this one"), "{stderr}");
    // The old test worker (the child's kind) stops on it too.
    let worker = tokio::time::timeout(Duration::from_secs(120), env.worker.take().unwrap()).await.expect("the test worker stops of itself").unwrap();
    assert!(matches!(worker, Err(ferry_runtime::WorkerError::Outdated(_))), "{worker:?}");
    // The plan was left running, to be resumed by a newer plan worker: nothing failed,
    // retried or ended (its progress lines about the child may have gone on until the stop).
    let went_on: Vec<String> = env
        .client
        .history(id)
        .await
        .unwrap()
        .iter()
        .filter(|e| !matches!(e.event, EventType::Accepted | EventType::StepStarted | EventType::StepProgress))
        .map(|e| format!("{} {:?} {}", e.seq, e.event, e.message.as_deref().unwrap_or_default()))
        .collect();
    assert!(went_on.is_empty(), "the plan went on past its child's newer state: {went_on:?}");
    env.shutdown().await;
}

/// A resubmission with a key already used names the same task; `--wait` answers it from
/// what the task did (the worker republishes only its state, no event: it waited its whole
/// timeout before), with the task's exit code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resubmission_with_a_used_key_is_answered_by_its_task() {
    let env = env().await;
    let ok = env.spec("ok.yaml", "subject: keyed\nspec: {steps: 2, fail_transient: 0, step_ms: 0}\n");
    let first = env.ferry(&["submit", "test", "-f", &ok, "--idempotency-key", "k-1", "--wait", "-o", "json"]).await;
    assert_eq!(first.code, 0, "{}{}", first.stdout, first.stderr);
    let first: serde_json::Value = serde_json::from_str(&first.stdout).unwrap();
    let again = env.ferry(&["submit", "test", "-f", &ok, "--idempotency-key", "k-1", "--wait", "--timeout", "5m"]).await;
    assert_eq!(again.code, 0, "{}{}", again.stdout, again.stderr);
    assert!(again.stderr.contains(&format!("task {} (idempotency key \"k-1\") had already ended: Succeeded", first["task_id"].as_str().unwrap())), "{}", again.stderr);
    assert!(again.stdout.contains("Succeeded") && !again.stderr.contains("note:"), "{}{}", again.stdout, again.stderr);
    let json = env.ferry(&["submit", "test", "-f", &ok, "--idempotency-key", "k-1", "--wait", "-o", "json"]).await;
    let json: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!((&json["task_id"], &json["state"]), (&first["task_id"], &serde_json::json!("Succeeded")), "{json}");
    // One that failed answers as it did.
    let bad = env.spec("bad.yaml", "subject: keyed\nspec: {steps: 2, fail_at: 1, fail_transient: 0, step_ms: 0}\n");
    let failed = env.ferry(&["submit", "test", "-f", &bad, "--idempotency-key", "k-2", "--wait"]).await;
    assert_eq!(failed.code, 1, "{}{}", failed.stdout, failed.stderr);
    let again = env.ferry(&["submit", "test", "-f", &bad, "--idempotency-key", "k-2", "--wait", "--timeout", "5m"]).await;
    assert_eq!(again.code, 1, "{}{}", again.stdout, again.stderr);
    assert!(again.stderr.contains("(idempotency key \"k-2\") had already ended: "), "{}", again.stderr);
    env.shutdown().await;
}

/// `--wait` for a kind no worker takes says so once no worker has answered for a while,
/// and keeps waiting to its timeout (the command stays on the topic for a later worker).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_no_worker_answers_says_why() {
    let env = env().await;
    let score = format!("{}/examples/score.yaml", env!("CARGO_MANIFEST_DIR"));
    let out = env.ferry(&["submit", "score", "-f", &score, "--wait", "--timeout", "12s"]).await;
    assert_eq!(out.code, 3, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("note: no worker has answered in 10s: is a score worker running? (`ferry worker score`; the command waits on ferry.commands.score until one takes it)"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("did not end within 12s"), "the whole wait, not what was left of it: {}", out.stderr);
    // A kind whose worker answers says nothing of the kind.
    let ok = env.spec("ok.yaml", "subject: n\nspec: {steps: 1, fail_transient: 0, step_ms: 0}\n");
    let out = env.ferry(&["submit", "test", "-f", &ok, "--wait"]).await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(!out.stderr.contains("note:"), "{}", out.stderr);
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_follows_tasks_to_their_end() {
    let env = env().await;
    let slow = env.spec("slow.yaml", "subject: w1\nspec: {steps: 3, fail_transient: 0, step_ms: 400}\n");
    let failing = env.spec("failing.yaml", "subject: w2\nspec: {steps: 3, fail_at: 3, fail_transient: 0, step_ms: 300}\n");
    let ok = env.ferry(&["submit", "test", "-f", &slow]).await.stdout.trim().to_owned();
    let bad = env.ferry(&["submit", "test", "-f", &failing]).await.stdout.trim().to_owned();
    // Both are followed live; the failed one makes the exit code 1.
    let out = env.ferry(&["tasks", "watch", &ok, &bad]).await;
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains(&format!("{ok} test w1 Succeeded")), "{}", out.stdout);
    assert!(out.stdout.contains(&format!("{bad} test w2 Reverted")), "{}", out.stdout);
    // A finished task is reported at once.
    let out = env.ferry(&["tasks", "watch", &ok]).await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains(&format!("{ok} test w1 Succeeded")), "{}", out.stdout);

    // The broker settings can come from a config file instead of flags.
    let cfg = env.spec("config.yaml", &format!("brokers: {}\nkafka_properties: {{fetch.wait.max.ms: '5'}}\n", env.bootstrap));
    let o = tokio::process::Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["--config", &cfg, "tasks", "get", &ok, "--output", "json"])
        .env("RUST_LOG", "error")
        .env_remove("FERRY_BROKERS")
        .output()
        .await
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["task"]["state"], "Succeeded");
    env.shutdown().await;
}

/// With OTEL_EXPORTER_OTLP_ENDPOINT set, `ferry submit` exports its producer span over
/// OTLP/HTTP: an in-process collector receives and decodes it, and the task's events
/// carry that span as their trace parent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_exports_its_span_over_otlp() {
    let env = env().await;
    let (endpoint, mut rx) = otlp_collector().await;

    let spec = env.spec("traced.yaml", "subject: otlp\nspec: {steps: 1, fail_transient: 0, step_ms: 0}\n");
    let o = tokio::process::Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["submit", "test", "-f", &spec, "--wait", "--output", "json", "--brokers", &env.bootstrap, "--kafka-property", "fetch.wait.max.ms=5"])
        .env("RUST_LOG", "error")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .output()
        .await
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let task: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let req = tokio::time::timeout(Duration::from_secs(30), rx.recv()).await.expect("the collector got spans").unwrap();
    let spans: Vec<_> = req.resource_spans.iter().flat_map(|r| &r.scope_spans).flat_map(|s| &s.spans).collect();
    let submit = spans.iter().find(|s| s.name == "ferry.submit test").expect("the producer span");
    let service = req.resource_spans[0].resource.as_ref().unwrap().attributes.iter().find(|a| a.key == "service.name").unwrap();
    assert!(format!("{:?}", service.value).contains("ferry-submit"), "{service:?}");
    assert_eq!(otlp_attr(&submit.attributes, "messaging.system").as_deref(), Some("kafka"), "the producer span is a Kafka send");
    assert_eq!(otlp_attr(&submit.attributes, "messaging.operation.type").as_deref(), Some("send"));
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let tp = format!("00-{}-{}-01", hex(&submit.trace_id), hex(&submit.span_id));
    assert_eq!(task["trace_parent"], serde_json::json!(tp), "the task carries the exported span as its trace parent");
    env.shutdown().await;
}

/// An operator's `tasks get` of a tenant's plan lists its children (a tenant's keys are in
/// its own space, `web/plan/<id>/<step>`: before, no child was found), and only those the
/// plan sent: a task of another tenant, or an operator's, whose key merely names the plan
/// is not one, in `tasks get` nor in the child's own `plan`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_plan_lists_its_children_and_no_task_that_only_names_it() {
    let rules = "tenants: {web: {plan: {}, test: {clusters: ['web-*']}}, ops: {test: {clusters: ['*']}}}";
    let env = env_with_policy(Some(rules));
    let policy_file = env.spec("policy.yaml", rules);
    let mut plans = env.plan_worker_with(&["--policy", &policy_file]);

    let plan = env.spec("plan.yaml", "subject: web-rollout\nspec:\n  steps:\n    - {name: one, kind: test, subject: web-1, spec: {steps: 1, fail_transient: 0, step_ms: 0}}\n    - {name: two, kind: test, subject: web-2, spec: {steps: 1, fail_transient: 0, step_ms: 0}}\n");
    let out = env.ferry(&["submit", "plan", "-f", &plan, "--tenant", "web", "--wait", "--output", "json"]).await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let id = serde_json::from_str::<serde_json::Value>(&out.stdout).unwrap()["task_id"].as_str().unwrap().to_owned();
    // Tasks that only name the plan in their keys: another tenant's, and an operator's.
    let fake = env.spec("fake.yaml", "subject: web-9\nspec: {steps: 1, fail_transient: 0, step_ms: 0}\n");
    for tenant in [&["--tenant", "ops"][..], &[]] {
        let key = format!("plan/{id}/one");
        let out = env.ferry(&[&["submit", "test", "-f", &fake, "--idempotency-key", &key, "--wait", "--output", "json"][..], tenant].concat()).await;
        assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
        let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        assert!(v["plan"].is_null(), "a task that only names the plan is shown as its child: {v}");
    }
    let out = env.ferry(&["tasks", "get", &id, "--output", "json"]).await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let got: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let children: Vec<(&str, &str, &str)> = got["children"]
        .as_array()
        .expect("children")
        .iter()
        .map(|c| (c["step"].as_str().unwrap(), c["subject"].as_str().unwrap(), c["state"].as_str().unwrap()))
        .collect();
    assert_eq!(children, [("one", "web-1", "Succeeded"), ("two", "web-2", "Succeeded")], "{got}");
    let listed: Vec<serde_json::Value> = serde_json::from_str(&env.ferry(&["tasks", "list", "--output", "json"]).await.stdout).unwrap();
    let under: Vec<(&str, Option<&str>)> = listed
        .iter()
        .filter(|t| t["kind"] == "test")
        .map(|t| (t["subject"].as_str().unwrap(), t["plan"]["task_id"].as_str()))
        .collect::<Vec<_>>();
    for (subject, plan) in &under {
        assert_eq!(*plan == Some(id.as_str()), subject.starts_with("web-") && *subject != "web-9", "{subject}: {under:?}");
    }
    assert_eq!(under.len(), 4, "{under:?}");
    plans.kill().await.unwrap();
    env.shutdown().await;
}

/// `--tenant`: the CLI sends to the tenant's own topic, the worker's gateway takes it from
/// there, the task is the tenant's (whatever `$USER` says) and the policy holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_submits_on_its_own_topic_and_is_held_to_its_policy() {
    let env = env_with_policy(Some("tenants: {web: {test: {clusters: ['web-*']}}}"));

    let ok = env.spec("ok.yaml", "subject: web-1\nspec: {steps: 3, fail_transient: 1, step_ms: 0}\n");
    let out = env.ferry(&["submit", "test", "-f", &ok, "--tenant", "web", "--wait", "--output", "json"]).await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["state"], "Succeeded");
    let id = v["task_id"].as_str().unwrap().to_owned();
    let snap = env.client.snapshots().await.unwrap().into_iter().find(|s| s.task_id == id).unwrap();
    assert_eq!(snap.requested_by, "tenant:web");

    let far = env.spec("far.yaml", "subject: db-1\nspec: {steps: 1, fail_transient: 0, step_ms: 0}\n");
    let out = env.ferry(&["submit", "test", "-f", &far, "--tenant", "web", "--wait"]).await;
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("may not target cluster \"db-1\" with test (tenants.web.test.clusters: [web-*])"), "{}", out.stdout);

    // The tenant lists, gets and reverts its tasks from its own progress topic (it reads
    // no task state): both tasks, as their events tell them.
    let out = env.ferry(&["tasks", "list", "--tenant", "web", "--output", "json"]).await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let listed: Vec<serde_json::Value> = serde_json::from_str(&out.stdout).unwrap();
    let states: Vec<(&str, &str)> = listed.iter().map(|t| (t["subject"].as_str().unwrap(), t["state"].as_str().unwrap())).collect();
    assert_eq!(states, [("db-1", "Rejected"), ("web-1", "Succeeded")], "{}", out.stdout);
    let out = env.ferry(&["tasks", "get", &id, "--tenant", "web", "--output", "json"]).await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let got: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!((got["task"]["kind"].as_str(), got["task"]["state"].as_str()), (Some("test"), Some("Succeeded")), "{}", out.stdout);
    // Its journal as the events tell it: the same steps, statuses and attempts as the task
    // state holds (outputs stay in the task state); its undo plan likewise.
    let journal = |v: &serde_json::Value| -> Vec<(String, String, i64)> {
        v.as_array().unwrap().iter().map(|s| (s["name"].as_str().unwrap().to_owned(), s["status"].as_str().unwrap().to_owned(), s["attempts"].as_i64().unwrap())).collect()
    };
    let operator: serde_json::Value = serde_json::from_str(&env.ferry(&["tasks", "get", &id, "--output", "json"]).await.stdout).unwrap();
    assert!(!journal(&operator["task"]["steps"]).is_empty(), "{operator}");
    assert_eq!(journal(&got["task"]["steps"]), journal(&operator["task"]["steps"]), "{got}");
    assert_eq!(got["task"]["revert_would_undo"], operator["task"]["revert_would_undo"], "{got}");
    let out = env.ferry(&["tasks", "revert", &id, "--tenant", "web", "--dry-run", "--output", "json"]).await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let plan: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let names: Vec<&str> = plan["would_undo"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(serde_json::json!(names), operator["task"]["revert_would_undo"], "{plan}");
    let out = env.ferry(&["tasks", "revert", &id, "--tenant", "web", "--wait"]).await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let out = env.ferry(&["tasks", "list", "--tenant", "web", "--state", "reverted", "--output", "json"]).await;
    let listed: Vec<serde_json::Value> = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(listed.iter().map(|t| t["task_id"].as_str().unwrap()).collect::<Vec<_>>(), [id.as_str()], "{}", out.stdout);

    // Another's task is not the tenant's to find, and says so.
    let theirs = env.client.submit(TaskKind::TEST, "web-2", &ferry_runtime::testkind::TestTaskSpec::steps(1), ferry_runtime::SubmitOptions::default()).await.unwrap().to_string();
    let out = env.ferry(&["tasks", "cancel", &theirs, "--tenant", "web"]).await;
    assert_eq!(out.code, 2, "{}{}", out.stdout, out.stderr);
    assert!(out.stderr.contains(&format!("no task {theirs} among tenant \"web\"'s tasks")), "{}", out.stderr);
    // A tenant (or a kind) no policy gives topics fails at once, naming what is missing,
    // instead of waiting for an answer no worker would send.
    let out = env.ferry(&["submit", "test", "-f", &ok, "--tenant", "nobody", "--wait"]).await;
    assert_eq!(out.code, 2, "{}{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("tenant \"nobody\" has no topics at") && out.stderr.contains("(no ferry.tenant-progress.nobody)"), "{}", out.stderr);
    let out = env.ferry(&["submit", "deploy", "-f", &env.spec("app.yaml", "spec: {name: web-1, components: []}\n"), "--tenant", "web"]).await;
    assert_eq!(out.code, 2, "{}{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("tenant \"web\" may not submit deploy tasks at") && out.stderr.contains("no topic ferry.tenants.web.deploy"), "{}", out.stderr);
    env.shutdown().await;
}

/// `submit --tosca FILE --dry-run` prints the command a blueprint becomes (a spec file `-f`
/// takes back) and sends nothing; a blueprint that does not convert says where, and fails.
#[test]
fn tosca_dry_run_prints_the_command_and_sends_nothing() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    // No broker is named or running: a dry run must not need one.
    let run = |args: &[&str]| std::process::Command::new(env!("CARGO_BIN_EXE_ferry")).args(args).env("RUST_LOG", "error").env("FERRY_BROKERS", "127.0.0.1:9").output().unwrap();
    let charity = root.join("examples/charity.tosca.yaml");
    let out = run(&["submit", "deploy", "--tosca", charity.to_str().unwrap(), "--cluster", "member-1", "--dry-run"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&stdout).expect("the dry run prints a spec file");
    let names: Vec<&str> = doc["spec"]["components"].as_sequence().unwrap().iter().filter_map(|c| c["name"].as_str()).collect();
    assert!(names.contains(&"ingest") && !names.contains(&"charity-kafka"), "externals are left out: {names:?}");
    let bad = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(bad.path(), std::fs::read_to_string(&charity).unwrap().replacen("name: ingest", "name: ingest\n        replicas: 4294967297", 1)).unwrap();
    let out = run(&["submit", "deploy", "--tosca", bad.path().to_str().unwrap(), "--cluster", "member-1", "--dry-run"]);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_ne!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("node_templates.ingest.properties.replicas") && text.contains("4294967297"), "{text}");
}

/// A `ferry worker test` process against `bootstrap`, its stderr piped (killed on drop).
fn ferry_worker(bootstrap: &str, args: &[&str], envs: &[(&str, &str)]) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["worker", "test", "--brokers", bootstrap, "--kafka-property", "fetch.wait.max.ms=5"])
        .args(args)
        .envs(envs.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// An in-process OTLP/HTTP collector: its endpoint, and the export requests it receives.
async fn otlp_collector() -> (String, tokio::sync::mpsc::UnboundedReceiver<opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest>) {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use prost::Message;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<ExportTraceServiceRequest>();
    let collector = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let tx = tx.clone();
            async move {
                if let Ok(req) = ExportTraceServiceRequest::decode(body) {
                    let _ = tx.send(req);
                }
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, collector).await.unwrap() });
    (endpoint, rx)
}

/// An OTLP attribute's value as text (strings and integers), if the attribute is there.
fn otlp_attr(attrs: &[opentelemetry_proto::tonic::common::v1::KeyValue], key: &str) -> Option<String> {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    match attrs.iter().find(|a| a.key == key)?.value.as_ref()?.value.as_ref()? {
        Value::StringValue(s) => Some(s.clone()),
        Value::IntValue(i) => Some(i.to_string()),
        other => Some(format!("{other:?}")),
    }
}

/// `--log-format json`: every stderr line of a worker is one JSON object, and the lines of
/// a task's run carry the trace id the task's command came with, and a span id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_logs_json_lines_that_name_each_tasks_trace() {
    use ferry_runtime::testkind::TestTaskSpec;
    use tokio::io::AsyncBufReadExt;
    let topics = Topics::standard();
    let broker = EmbeddedBroker::start(1, &topics).unwrap();
    let client = Client::new(KafkaConfig::for_embedded(broker.bootstrap()), topics).unwrap();
    let mut events = client.events(false).await.unwrap();
    let mut worker = ferry_worker(&broker.bootstrap(), &["--log-format", "json"], &[("RUST_LOG", "info,ferry_runtime=debug")]);
    let mut lines = tokio::io::BufReader::new(worker.stderr.take().unwrap()).lines();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut seen: Vec<serde_json::Value> = Vec::new();
    // Reads stderr until a line matches, checking that every line is one JSON object.
    let mut read_until = async |pred: &dyn Fn(&serde_json::Value) -> bool, seen: &mut Vec<serde_json::Value>| loop {
        let line = tokio::time::timeout_at(deadline, lines.next_line()).await.expect("the awaited log line in time").unwrap().expect("the worker is running");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        assert!(v.is_object(), "{line}");
        let hit = pred(&v);
        seen.push(v);
        if hit {
            return;
        }
    };
    read_until(&|v| v["message"].as_str().is_some_and(|m| m.starts_with("partitions assigned")), &mut seen).await;

    let id = client.submit(ferry_runtime::TaskKind::TEST, "json-logs", &TestTaskSpec::steps(2), ferry_runtime::SubmitOptions::default()).await.unwrap();
    let evs = events.until(id, Duration::from_secs(60), |e| e.event.is_final()).await.unwrap();
    assert_eq!(evs.last().unwrap().event, EventType::Succeeded);
    let trace = evs[0].trace_parent.as_deref().expect("the task's traceparent").split('-').nth(1).unwrap().to_owned();
    let task = id.to_string();
    let of_task = |v: &serde_json::Value| v["span"]["task_id"].as_str() == Some(task.as_str());
    read_until(&|v| of_task(v) && v["message"] == "task run ended", &mut seen).await;
    worker.start_kill().unwrap();
    let _ = worker.wait().await;

    let task_lines: Vec<&serde_json::Value> = seen.iter().filter(|v| of_task(v)).collect();
    assert!(task_lines.iter().any(|v| v["message"] == "task run started"), "{task_lines:?}");
    for v in &task_lines {
        assert_eq!(v["trace_id"].as_str(), Some(trace.as_str()), "a task line names the task's trace: {v}");
        let span = v["span_id"].as_str().unwrap_or_default();
        assert!(span.len() == 16 && span.chars().all(|c| c.is_ascii_hexdigit()), "a task line names a span: {v}");
        assert_eq!(v["level"], "DEBUG", "{v}");
    }
    let started = seen.iter().find(|v| v["message"].as_str().is_some_and(|m| m.starts_with("partitions assigned"))).unwrap();
    assert!(started.get("trace_id").is_none(), "lines outside a task name no trace: {started}");
    assert!(started["timestamp"].is_string() && started["target"].is_string(), "{started}");
}

/// A worker's spans go out under its kind's service name, and the span of each command
/// record it reads carries OpenTelemetry's Kafka messaging attributes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_exports_spans_under_its_kinds_service_name_with_messaging_attributes() {
    use ferry_runtime::testkind::TestTaskSpec;
    let topics = Topics::standard();
    let command_topic = topics.command(ferry_runtime::TaskKind::TEST).name.clone();
    let broker = EmbeddedBroker::start(1, &topics).unwrap();
    let client = Client::new(KafkaConfig::for_embedded(broker.bootstrap()), topics).unwrap();
    let mut events = client.events(false).await.unwrap();
    let (endpoint, mut rx) = otlp_collector().await;
    let _worker = ferry_worker(
        &broker.bootstrap(),
        &[],
        // Export every 100 ms: the spans arrive while the worker runs.
        &[("RUST_LOG", "error"), ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint), ("OTEL_BSP_SCHEDULE_DELAY", "100")],
    );
    let id = client.submit(ferry_runtime::TaskKind::TEST, "otlp-worker", &TestTaskSpec::steps(1), ferry_runtime::SubmitOptions::default()).await.unwrap();
    let evs = events.until(id, Duration::from_secs(60), |e| e.event.is_final()).await.unwrap();
    assert_eq!(evs.last().unwrap().event, EventType::Succeeded);
    let trace = evs[0].trace_parent.as_deref().unwrap().split('-').nth(1).unwrap().to_owned();

    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let (mut process, mut task) = (None, None);
    while process.is_none() || task.is_none() {
        let req = tokio::time::timeout_at(deadline, rx.recv()).await.expect("the worker's spans in time").unwrap();
        for rs in &req.resource_spans {
            let service = otlp_attr(&rs.resource.as_ref().unwrap().attributes, "service.name");
            for s in rs.scope_spans.iter().flat_map(|s| &s.spans) {
                if hex(&s.trace_id) != trace {
                    continue;
                }
                if s.name == format!("process {command_topic}") {
                    process = Some((service.clone(), s.clone()));
                } else if s.name == "ferry.task test" {
                    task = Some((service.clone(), s.clone()));
                }
            }
        }
    }
    let (service, process) = process.unwrap();
    assert_eq!(service.as_deref(), Some("ferry-test"), "a worker's service is named after its kind");
    assert_eq!(task.unwrap().0.as_deref(), Some("ferry-test"));
    assert_eq!(process.kind, opentelemetry_proto::tonic::trace::v1::span::SpanKind::Consumer as i32);
    let a = |k: &str| otlp_attr(&process.attributes, k);
    assert_eq!(a("messaging.system").as_deref(), Some("kafka"));
    assert_eq!(a("messaging.operation.type").as_deref(), Some("process"));
    assert_eq!(a("messaging.operation.name").as_deref(), Some("process"));
    assert_eq!(a("messaging.destination.name").as_deref(), Some(command_topic.as_str()));
    assert_eq!(a("messaging.consumer.group.name").as_deref(), Some("ferry-test"));
    assert_eq!(a("messaging.kafka.message.key").as_deref(), Some("otlp-worker"));
    assert!(a("messaging.destination.partition.id").is_some_and(|p| p.parse::<u32>().is_ok()), "{:?}", process.attributes);
    assert!(a("messaging.kafka.offset").is_some_and(|o| o.parse::<u64>().is_ok()), "{:?}", process.attributes);
}

impl Env {
    /// `ferry ARGS` with `input` on its standard input.
    async fn ferry_stdin(&self, args: &[&str], input: &str) -> Out {
        use tokio::io::AsyncWriteExt;
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ferry"))
            .args(args)
            .args(["--brokers", &self.bootstrap, "--kafka-property", "fetch.wait.max.ms=5"])
            .env("RUST_LOG", "error")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(input.as_bytes()).await.unwrap();
        drop(stdin);
        let o = child.wait_with_output().await.unwrap();
        Out { code: o.status.code().unwrap_or(-1), stdout: String::from_utf8_lossy(&o.stdout).into_owned(), stderr: String::from_utf8_lossy(&o.stderr).into_owned() }
    }
}

/// `ferry ARGS` with no broker anywhere (HOME and the config file pointed at an empty
/// directory, so neither a running `ferry dev` nor the user's config is found).
fn ferry_offline(home: &std::path::Path, args: &[&str], envs: &[(&str, &str)]) -> Out {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(args)
        .env("RUST_LOG", "error")
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env("FERRY_STATE", home.join("state"))
        .env_remove("FERRY_BROKERS")
        .env_remove("FERRY_CONTEXT")
        .env_remove("FERRY_CONFIG")
        .envs(envs.iter().copied())
        .output()
        .unwrap();
    Out { code: o.status.code().unwrap_or(-1), stdout: String::from_utf8_lossy(&o.stdout).into_owned(), stderr: String::from_utf8_lossy(&o.stderr).into_owned() }
}

/// Kinds and states are closed sets: `--help` lists them and a typo is refused with the
/// valid names; `completions` prints a script that knows the subcommands.
#[test]
fn kinds_and_states_are_checked_and_completions_know_the_commands() {
    let home = tempfile::tempdir().unwrap();
    let out = ferry_offline(home.path(), &["completions", "bash"], &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("submit") && out.stdout.contains("tasks") && out.stdout.contains("complete -F"), "{}", out.stdout);
    for shell in ["zsh", "fish", "powershell", "elvish"] {
        let out = ferry_offline(home.path(), &["completions", shell], &[]);
        assert!(out.code == 0 && out.stdout.contains("submit"), "{shell}: {}", out.stderr);
    }

    let out = ferry_offline(home.path(), &["tasks", "list", "--state", "runing"], &[]);
    assert_eq!(out.code, 2);
    assert!(out.stderr.contains("invalid value 'runing' for '--state <STATE>'"), "{}", out.stderr);
    assert!(out.stderr.contains("possible values: accepted, running, succeeded"), "{}", out.stderr);
    assert!(out.stderr.contains("a similar value exists: 'running'"), "{}", out.stderr);
    let out = ferry_offline(home.path(), &["submit", "dpeloy", "-f", "x.yaml"], &[]);
    assert_eq!(out.code, 2);
    assert!(out.stderr.contains("invalid value 'dpeloy'") && out.stderr.contains("create-cluster, peer, offload, deploy, score, test"), "{}", out.stderr);
    let out = ferry_offline(home.path(), &["tasks", "list", "--help"], &[]);
    assert!(out.stdout.contains("revert-failed") && out.stdout.contains("create-cluster"), "{}", out.stdout);
    let out = ferry_offline(home.path(), &["submit", "test", "-f", "x.yaml", "--timeout", "1h30"], &[]);
    assert_eq!(out.code, 2);
    assert!(out.stderr.contains("invalid value '1h30' for '--timeout <TIMEOUT>'"), "{}", out.stderr);
}

/// No broker at the address: the command says so, naming it, instead of hanging on reads.
#[test]
fn an_unreachable_broker_is_a_clear_failure() {
    let home = tempfile::tempdir().unwrap();
    let out = ferry_offline(home.path(), &["tasks", "list", "--brokers", "127.0.0.1:1", "--connect-timeout", "1s"], &[]);
    assert_ne!(out.code, 0, "{}", out.stdout);
    assert!(out.stderr.contains("error: cannot reach Kafka at 127.0.0.1:1: "), "{}", out.stderr);
    assert!(out.stderr.contains("Connection refused"), "librdkafka's reason is kept: {}", out.stderr);
    assert_eq!(out.stderr.lines().count(), 1, "one line, not librdkafka's retries: {}", out.stderr);
    // A spec file of the wrong kind, or with a field its kind does not have, is refused
    // before any broker is needed: no `ferry dev` runs here.
    let root = env!("CARGO_MANIFEST_DIR");
    let out = ferry_offline(home.path(), &["submit", "deploy", "-f", &format!("{root}/examples/score.yaml")], &[]);
    assert_ne!(out.code, 0, "{}", out.stdout);
    assert!(out.stderr.contains("deploy: the spec does not match the fields of DeployApp: "), "{}", out.stderr);
    let file = home.path().join("typo.yaml");
    std::fs::write(&file, "subject: s\nspec: {steps: 2, step_ms: 0, fail_transeint: 1}\n").unwrap();
    let out = ferry_offline(home.path(), &["submit", "test", "-f", file.to_str().unwrap()], &[]);
    assert_ne!(out.code, 0, "{}", out.stdout);
    assert!(out.stderr.contains("unknown field `fail_transeint`"), "{}", out.stderr);
}

/// `ferry fleet` prints what it could read and fails when a cluster did not answer (as
/// `kubectl get` does), naming the cluster and why.
#[test]
fn fleet_fails_when_a_cluster_does_not_answer() {
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join("state/dev/fleet/gone");
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = "apiVersion: v1\nkind: Config\nclusters: [{name: gone, cluster: {server: 'https://127.0.0.1:1'}}]\n\
        users: [{name: u, user: {token: t}}]\ncontexts: [{name: gone, context: {cluster: gone, user: u}}]\ncurrent-context: gone\n";
    std::fs::write(dir.join("kubeconfig"), kubeconfig).unwrap();
    let out = ferry_offline(home.path(), &["fleet"], &[]);
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("gone") && out.stderr.contains("gone: unreachable: "), "{}{}", out.stdout, out.stderr);
}

/// Contexts in the config file, as kubectl has them: `--context`/`FERRY_CONTEXT` over
/// `current_context:`, flags and environment over both, `use-context` writes the file.
#[test]
fn contexts_select_the_broker_and_use_context_switches() {
    let home = tempfile::tempdir().unwrap();
    let cfg = home.path().join("ferry.yaml");
    std::fs::write(&cfg, "brokers: 127.0.0.1:1\ncurrent_context: one\ncontexts:\n  one: {brokers: 127.0.0.1:2, tenant: web}\n  two: {brokers: 127.0.0.1:3}\n").unwrap();
    let cfg_s = cfg.to_str().unwrap();
    // Which broker a command tries, from its error: no broker listens on these ports.
    let tried = |args: &[&str], envs: &[(&str, &str)]| {
        let mut a = vec!["--config", cfg_s, "--connect-timeout", "1s"];
        a.extend_from_slice(args);
        a.extend_from_slice(&["tasks", "list"]);
        let out = ferry_offline(home.path(), &a, envs);
        assert_ne!(out.code, 0);
        out.stderr.split("cannot reach Kafka at ").nth(1).and_then(|r| r.split(':').nth(1)).map(str::to_owned).unwrap_or_else(|| panic!("{}", out.stderr))
    };
    assert_eq!(tried(&[], &[]), "2", "current_context");
    assert_eq!(tried(&["--context", "two"], &[]), "3", "--context over current_context");
    assert_eq!(tried(&[], &[("FERRY_CONTEXT", "two")]), "3", "FERRY_CONTEXT over current_context");
    assert_eq!(tried(&[], &[("FERRY_BROKERS", "127.0.0.1:4")]), "4", "the environment over the context");
    assert_eq!(tried(&["--brokers", "127.0.0.1:5"], &[("FERRY_BROKERS", "127.0.0.1:4")]), "5", "a flag over the environment");

    let out = ferry_offline(home.path(), &["--config", cfg_s, "--context", "nope", "tasks", "list"], &[]);
    assert_eq!(out.code, 2);
    assert!(out.stderr.contains("no context \"nope\" in the config file") && out.stderr.contains("(contexts: one, two)"), "{}", out.stderr);

    let out = ferry_offline(home.path(), &["--config", cfg_s, "config", "get-contexts"], &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(lines[0].starts_with("CURRENT   NAME   BROKERS"), "{}", out.stdout);
    assert!(lines[1].starts_with("*         one    127.0.0.1:2") && lines[1].ends_with("web"), "{}", out.stdout);
    let out = ferry_offline(home.path(), &["--config", cfg_s, "config", "use-context", "two"], &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let out = ferry_offline(home.path(), &["--config", cfg_s, "config", "current-context"], &[]);
    assert_eq!(out.stdout.trim(), "two");
    assert_eq!(tried(&[], &[]), "3", "use-context wrote the file");
    let out = ferry_offline(home.path(), &["--config", cfg_s, "config", "use-context", "three"], &[]);
    assert_ne!(out.code, 0);
    assert!(out.stderr.contains("no context \"three\""), "{}", out.stderr);
}

fn is_rfc3339_utc(v: &serde_json::Value) -> bool {
    v.as_str().is_some_and(|s| s.len() >= 20 && s.as_bytes()[10] == b'T' && s.ends_with('Z') && s[..4].parse::<u32>().is_ok_and(|y| y >= 2024))
}

/// `-f -` reads the spec from standard input; `--reason` is carried by the Cancel and
/// Revert commands and shown by `tasks get`; tables show ages, JSON RFC 3339 times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_specs_reasons_and_times() {
    let env = env().await;
    let out = env.ferry_stdin(&["submit", "test", "-f", "-", "--wait", "--output", "json"], "subject: in\nspec: {steps: 2, fail_transient: 0, step_ms: 0}\n").await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!((v["subject"].as_str(), v["state"].as_str()), (Some("in"), Some("Succeeded")));
    assert!(is_rfc3339_utc(&v["created_at"]) && is_rfc3339_utc(&v["updated_at"]) && v["created_at_ms"].is_i64(), "{v}");
    assert!(is_rfc3339_utc(&v["steps"][0]["started_at"]), "{v}");
    let out = env.ferry_stdin(&["submit", "test", "-f", "-"], "subject: [unclosed\n").await;
    assert_eq!(out.code, 2);
    assert!(out.stderr.contains("parsing the spec from standard input"), "{}", out.stderr);

    let blocked = env.spec("blocked.yaml", "subject: r\nspec: {steps: 3, block_at: 2, fail_transient: 0, step_ms: 0}\n");
    let mut events = env.client.events(true).await.unwrap();
    let id: TaskId = env.ferry(&["submit", "test", "-f", &blocked]).await.stdout.trim().parse().unwrap();
    events.until(id, Duration::from_secs(60), |e| e.event == EventType::StepProgress).await.unwrap();
    let out = env.ferry(&["tasks", "cancel", &id.to_string(), "--reason", "wrong cluster, see INC-42"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("(task was Running)"), "{}", out.stdout);
    events.until(id, Duration::from_secs(60), |e| e.event == EventType::Cancelled).await.unwrap();
    let out = env.ferry(&["tasks", "revert", &id.to_string(), "--reason", "roll back INC-42", "--wait"]).await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);

    let out = env.ferry(&["tasks", "get", &id.to_string(), "--output", "json"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let controls = v["controls"].as_array().unwrap();
    assert_eq!(controls.len(), 2, "{v}");
    assert_eq!((controls[0]["action"].as_str(), controls[0]["reason"].as_str()), (Some("Cancel"), Some("wrong cluster, see INC-42")));
    assert_eq!((controls[1]["action"].as_str(), controls[1]["reason"].as_str()), (Some("Revert"), Some("roll back INC-42")));
    assert!(is_rfc3339_utc(&controls[0]["requested_at"]) && is_rfc3339_utc(&v["events"][0]["at"]), "{v}");

    let out = env.ferry(&["tasks", "get", &id.to_string()]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.lines().any(|l| l.starts_with("Cancelled by:") && l.ends_with("ago: wrong cluster, see INC-42")), "{}", out.stdout);
    assert!(out.stdout.lines().any(|l| l.starts_with("State:") && l.ends_with("Reverted")), "{}", out.stdout);
    assert!(!out.stdout.contains("Some("), "no Debug text: {}", out.stdout);

    let out = env.ferry(&["tasks", "list", "--state", "Reverted"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let header = out.stdout.lines().next().unwrap();
    assert!(header.starts_with("TASK") && header.ends_with("AGE"), "{}", out.stdout);
    let row = out.stdout.lines().find(|l| l.starts_with(&id.to_string())).unwrap_or_else(|| panic!("{}", out.stdout));
    let age = row.split_whitespace().last().unwrap();
    assert!(age.ends_with('s') || age.ends_with('m'), "an age like 45s or 3m, not epoch milliseconds: {row}");
    env.shutdown().await;
}

/// A command piped into a reader that goes away (`ferry tasks list | head -1`) ends as
/// other Unix tools do, by SIGPIPE, without a panic and its backtrace on stderr.
#[test]
fn a_closed_stdout_ends_a_command_quietly() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["completions", "bash"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The read end closes before the first write: that write meets a broken pipe.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{:?}: {stderr}", out.status);
}

/// `ferry bench wave` on a small fleet: the plan fans out over every simulated cluster in
/// waves and its revert puts back every child (the bench fails otherwise), and the report
/// holds what docs/BENCHMARKS.md quotes.
#[test]
fn bench_wave_rolls_out_and_reverts_every_child_and_reports() {
    if !ferry_fleet::binaries::Binaries::installed() {
        ferry_runtime::report::missing_prerequisite("the test bed is not installed (scripts/install-testbed.sh), needed by ferry bench wave");
        return;
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["bench", "wave", "--clusters", "12", "--size", "5", "--json"])
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("a JSON report");
    assert_eq!((report["clusters"].as_u64(), report["waves"].as_u64()), (Some(12), Some(3)), "{report}");
    // One LIST (a retried one at most), not one per wave.
    assert!(report["hub_requests"].as_u64().is_some_and(|n| (1..=2).contains(&n)), "the clusters are chosen once: {report}");
    for field in ["rollout_s", "revert_s", "per_wave_over_direct_batch", "peak_rss_mib", "records_per_cluster"] {
        assert!(report[field].as_f64().is_some_and(|v| v > 0.0), "{field}: {report}");
    }
}

/// `submit plan --dry-run --kubeconfig HUB`: a fanned-out deploy step's children are
/// previewed on the hub, one per cluster its set chooses there, overrides merged in (each
/// ManifestWork judged by a server-side dry run); a score step runs its checks and its
/// AddOnPlacementScores are judged by the hub; a test step is named, not previewed;
/// nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_dry_run_on_the_hub_previews_each_child_of_a_fanned_out_deploy_and_writes_nothing() {
    let Some(bed) = ferry_testkit::Bed::builder().members(2, 1).ocm().kubeconfigs().start().await else { return };
    ferry_testkit::deploy::prepare(&bed.fleet, &["member-1", "member-2"], "shop").await.unwrap();
    let plan = serde_json::json!({"subject": "demo/agents", "spec": {"steps": [
        {"name": "agents", "kind": "deploy", "spec": {"name": "agent-${cluster}", "namespace": "shop", "owner": "team-demo",
            "components": [{"name": "agent", "image": "ghcr.io/ferry/agent:1", "cluster": "${cluster}"}]},
         "for_each": {"cluster_set": "demo", "overrides": [{"clusters": ["member-2"], "spec": {"components": [{"name": "agent", "image": "ghcr.io/ferry/agent:2", "cluster": "${cluster}"}]}}]}},
        {"name": "rank", "kind": "score", "subject": "demo", "spec": {"cluster_set": "demo"}},
        {"name": "check", "kind": "test", "subject": "s", "spec": {"steps": 1}},
    ]}});
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), serde_json::to_string(&plan).unwrap()).unwrap();
    let hub = bed.fleet.hub().kubeconfig.clone();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["submit", "plan", "-f", file.path().to_str().unwrap(), "--dry-run", "--kubeconfig", hub.to_str().unwrap(), "-o", "json"])
        .env("RUST_LOG", "error")
        .env("FERRY_BROKERS", "127.0.0.1:9")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("one JSON document: the preview");
    let steps = report["steps"].as_array().expect("steps");
    let seen: Vec<(String, String, String)> = steps
        .iter()
        .filter(|s| s["step"] == "agents")
        .filter_map(|s| {
            let o = s["preview"]["objects"].get(0)?;
            Some((s["cluster"].as_str()?.to_owned(), o["object"].as_str()?.to_owned(), o["change"].as_str()?.to_owned()))
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("member-1".to_owned(), "ManifestWork member-1/shop-agent-member-1".to_owned(), "create".to_owned()),
            ("member-2".to_owned(), "ManifestWork member-2/shop-agent-member-2".to_owned(), "create".to_owned())
        ],
        "{report}"
    );
    assert!(steps.iter().any(|s| s["step"] == "check" && s["note"].as_str().is_some_and(|n| n.contains("a test step"))), "{report}");
    let rank = steps.iter().find(|s| s["step"] == "rank").expect("the score step");
    assert_eq!(rank["preview"]["verdict"], "passes", "{report}");
    let judged: Vec<(&str, &str)> = rank["preview"]["objects"].as_array().expect("objects").iter().filter_map(|o| Some((o["object"].as_str()?, o["change"].as_str()?))).collect();
    assert_eq!(
        judged,
        [("AddOnPlacementScore member-1/ferry-resource-usage", "create"), ("AddOnPlacementScore member-2/ferry-resource-usage", "create")],
        "{report}"
    );
    // A fanned-out child's subject is the one the run sends (`${cluster}` put in), checked
    // as its worker checks it: a deploy's must be <namespace>/<name> (before, the literal
    // text went unchecked and the dry run passed a plan whose children were all Rejected).
    // Of clusters a set chooses, by the preview of each child; of clusters the plan names,
    // by the plan's own rules before anything else (as the plan worker refuses it).
    let subject_plan = |subject: Option<&str>, name: &str, for_each: serde_json::Value| {
        let plan = serde_json::json!({"subject": "demo/agents", "spec": {"steps": [
            {"name": "agents", "kind": "deploy", "subject": subject, "spec": {"name": name, "namespace": "shop", "owner": "team-demo",
                "components": [{"name": "agent", "image": "ghcr.io/ferry/agent:1", "cluster": "${cluster}"}]},
             "for_each": for_each},
        ]}});
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), serde_json::to_string(&plan).unwrap()).unwrap();
        let args = ["submit", "plan", "-f", file.path().to_str().unwrap(), "--dry-run", "--kubeconfig", hub.to_str().unwrap(), "-o", "json"].map(str::to_owned);
        async move {
            let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_ferry")).args(args).env("RUST_LOG", "error").env("FERRY_BROKERS", "127.0.0.1:9").output().await.unwrap();
            drop(file);
            (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
        }
    };
    let preview = |(code, stdout, stderr): (Option<i32>, String, String)| {
        let report: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}{stderr}"));
        let p = &report["steps"][0]["preview"];
        (code, p["verdict"].as_str().map(str::to_owned), p["reason"].as_str().map(str::to_owned))
    };
    let (code, verdict, reason) = preview(subject_plan(Some("${cluster}/agent"), "agent-${cluster}", serde_json::json!({"cluster_set": "demo"})).await);
    assert_eq!((code, verdict.as_deref()), (Some(2), Some("rejected")), "{reason:?}");
    assert_eq!(reason.as_deref(), Some(r#"the subject of a deploy task must be <namespace>/<name> = "shop/agent-member-1", got "member-1/agent""#));
    let (code, _, stderr) = subject_plan(Some("${cluster}/agent"), "agent-${cluster}", serde_json::json!({"clusters": ["member-1"]})).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains(r#"steps[0] (agents) for member-1: the deploy kind refuses this child: the subject of a deploy task must be <namespace>/<name> = "shop/agent-member-1", got "member-1/agent""#),
        "{stderr}"
    );
    let (code, verdict, reason) = preview(subject_plan(Some("shop/agent-${cluster}"), "agent-${cluster}", serde_json::json!({"clusters": ["member-1"]})).await);
    assert_eq!((code, verdict.as_deref()), (Some(0), Some("passes")), "{reason:?}");
    // Children that would share a subject (one app `shop/agent` for every cluster: the
    // second deploy would find the first's app): refused as the run refuses them, once the
    // set's clusters are known, instead of each child passing on its own.
    let (code, stdout, stderr) = subject_plan(None, "agent", serde_json::json!({"cluster_set": "demo"})).await;
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}{stderr}"));
    assert_eq!(code, Some(2), "{report}");
    assert_eq!(
        report["steps"][0]["note"].as_str(),
        Some(r#"REFUSED (CHILD_SPEC): its children for member-1 and member-2 would both act on subject "shop/agent", one deploy task after the other on the same thing; a deploy task's subject is `<namespace>/<name>`: put ${cluster} in one of its parts in the spec"#),
        "{report}"
    );
    let works: kube::Api<ferry_kube::kinds::ManifestWork> = kube::Api::all(bed.hub().await);
    assert!(works.list(&Default::default()).await.unwrap().items.is_empty(), "the dry run wrote a ManifestWork");
    // Without --kubeconfig and --brokers, the running `ferry dev`'s hub (its state names it)
    // is the one tried (before, only the command was printed); without one, nothing is.
    let state = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(state.path().join("dev")).unwrap();
    std::fs::write(state.path().join("dev/bootstrap"), "127.0.0.1:9").unwrap();
    let on_dev = || async {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_ferry"))
            .args(["submit", "plan", "-f", file.path().to_str().unwrap(), "--dry-run", "-o", "json"])
            .env("RUST_LOG", "error")
            .env("FERRY_STATE", state.path())
            .env_remove("FERRY_BROKERS")
            .output()
            .await
            .unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (ok, stdout, stderr) = on_dev().await;
    let printed: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}{stderr}"));
    assert!(ok && printed.get("spec").is_some() && printed.get("steps").is_none(), "no dev hub: the command only: {stdout}{stderr}");
    std::fs::write(state.path().join("dev/hub-kubeconfig"), hub.to_str().unwrap()).unwrap();
    let (ok, stdout, stderr) = on_dev().await;
    let dev_report: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}{stderr}"));
    assert!(ok && stderr.contains("dry run on the running `ferry dev`'s clusters"), "{stdout}{stderr}");
    assert_eq!(dev_report["steps"].as_array().map(Vec::len), Some(steps.len()), "{dev_report}");

    // One kind's dry run as a person reads it: the plan with what was checked, each object
    // with the hub's verdict; a set with no members fails the check (exit 2).
    let dry = |spec: &str| {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), spec).unwrap();
        let args = ["submit", "score", "-f", file.path().to_str().unwrap(), "--dry-run", "--kubeconfig", hub.to_str().unwrap()].map(str::to_owned);
        async move {
            let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_ferry")).args(args).env("RUST_LOG", "error").env("FERRY_BROKERS", "127.0.0.1:9").output().await.unwrap();
            drop(file);
            (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
        }
    };
    let (code, stdout, stderr) = dry("subject: demo\nspec: {cluster_set: demo}\n").await;
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("steps: resolve-clusters (checked) → measure → score → publish"), "{stdout}");
    assert!(stdout.contains("AddOnPlacementScore member-1/ferry-resource-usage: create (the hub accepts it)"), "{stdout}");
    assert!(stderr.contains("nothing written, nothing sent"), "{stderr}");
    let (code, stdout, stderr) = dry("subject: demo\nspec: {cluster_set: nobody}\n").await;
    assert_eq!(code, Some(2), "{stdout}{stderr}");
    assert!(stdout.contains("FAILS at resolve-clusters (NO_CLUSTERS): ManagedClusterSet \"nobody\" has no member clusters"), "{stdout}");
    bed.stop().await;
}

//! `ferry bench recovery`: a worker process holding N tasks mid-step is killed with
//! SIGKILL; a new instance takes over. Reports the time until it has resumed every task
//! and until all succeeded, and counts lost tasks, every step that ran more than once, and
//! the history checker's violations. Each task's step was mid-way when the worker died, so
//! each runs twice (expected, once per task); any other second run, a loss or a violation
//! fails the run.

use std::collections::{HashMap, HashSet};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use ferry_runtime::testkind::TestTaskSpec;
use ferry_runtime::{Client, EventType, Topics};
use serde::Serialize;

#[derive(Debug, Args)]
pub struct RecoveryArgs {
    /// Which broker to measure through.
    #[arg(long, value_enum, default_value = "embedded")]
    pub broker: super::bench::BrokerChoice,
    /// Bootstrap of an external broker (with --broker external).
    #[arg(long)]
    pub bootstrap: Option<String>,
    /// Tasks in flight when the worker dies.
    #[arg(long, default_value_t = 10_000)]
    pub tasks: usize,
    /// Length of the step every task is in when the worker dies, in seconds.
    #[arg(long, default_value_t = 20)]
    pub step_seconds: u64,
    /// The consumer group's session timeout (how fast a dead member is noticed), ms.
    #[arg(long, default_value_t = 6000)]
    pub session_timeout_ms: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct Report {
    broker: String,
    tasks: usize,
    session_timeout_ms: u64,
    in_flight_after_s: f64,
    kill_to_all_resumed_s: f64,
    kill_to_all_succeeded_s: f64,
    lost: usize,
    /// Steps started more than once (task, step): every task once, as its worker died mid-step.
    step_reruns: usize,
    /// Reruns beyond that: a step started again by the worker that had started it, or
    /// started three times or more.
    unexpected_reruns: usize,
    /// `history::check` over every event of the run: seqs reused, tasks ended twice,
    /// overlapping tasks of a subject.
    violations: usize,
}

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn worker(bootstrap: &str, id: &str, session_ms: u64) -> anyhow::Result<Proc> {
    let exe = std::env::current_exe()?;
    let child = Command::new(exe)
        .args(["worker", "test", "--brokers", bootstrap])
        .args(["--kafka-property", &format!("session.timeout.ms={session_ms}"), "--kafka-property", "heartbeat.interval.ms=500"])
        .args(["--kafka-property", "fetch.wait.max.ms=5"])
        .env("HOSTNAME", id)
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    Ok(Proc(child))
}

pub async fn run(a: RecoveryArgs) -> anyhow::Result<std::process::ExitCode> {
    let topics = Topics::standard();
    let (broker, kafka) = super::bench::BenchBroker::start(a.broker, a.bootstrap.as_deref(), &topics, 3).await?;
    let bootstrap = kafka.bootstrap.clone();
    let progress = topics.progress().name.clone();
    let client = Client::new(kafka, topics)?;
    let mut events = client.events(false).await?;
    let mut first = worker(&bootstrap, "first", a.session_timeout_ms)?;

    let start = Instant::now();
    let spec = TestTaskSpec { step_ms: (a.step_seconds * 1000) as i64, ..TestTaskSpec::steps(1) };
    let ids = super::bench::submit_tests(&client, a.tasks, &spec, |i| format!("recovery/{i}")).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1800);
    super::bench::until_each(&mut events, &ids, EventType::StepStarted, deadline).await?;
    let in_flight_after = start.elapsed().as_secs_f64();

    // SIGKILL: no handover, no final events; then a fresh instance joins.
    first.0.kill()?;
    first.0.wait()?;
    let killed = Instant::now();
    let _second = worker(&bootstrap, "second", a.session_timeout_ms)?;
    let mut resumed = HashSet::new();
    let mut all_resumed = None;
    let mut succeeded = HashSet::new();
    while succeeded.len() < a.tasks {
        let Ok(Some(ev)) = tokio::time::timeout_at(deadline, events.next()).await else { break };
        if !ids.contains(&ev.task_id) {
            continue;
        }
        if ev.event == EventType::StepStarted && ev.worker.starts_with("second") {
            resumed.insert(ev.task_id.clone());
            if resumed.len() == a.tasks && all_resumed.is_none() {
                all_resumed = Some(killed.elapsed().as_secs_f64());
            }
        }
        if ev.event == EventType::Succeeded {
            succeeded.insert(ev.task_id.clone());
        }
    }
    // The whole history of these tasks, the first worker's events included (the loop
    // above reads only what came after the kill).
    let history: Vec<ferry_runtime::ProgressEvent> = client
        .read_to_end(&progress)
        .await?
        .into_iter()
        .filter_map(|(_, payload)| client.registry().decode::<ferry_runtime::ProgressEvent>(&payload).ok())
        .filter(|e| ids.contains(&e.task_id))
        .collect();
    // Every (task, step) start, by worker, in order.
    let mut starts: HashMap<(String, Option<i32>), Vec<String>> = HashMap::new();
    for e in history.iter().filter(|e| e.event == EventType::StepStarted) {
        starts.entry((e.task_id.clone(), e.step)).or_default().push(e.worker.clone());
    }
    let step_reruns = starts.values().map(|w| w.len().saturating_sub(1)).sum();
    let unexpected_reruns = starts.values().filter(|w| w.len() > 2 || (w.len() == 2 && w[0] == w[1])).count();
    let violations = ferry_runtime::history::check(&history);
    for v in violations.iter().take(10) {
        eprintln!("violation: {v}");
    }
    let report = Report {
        broker: a.broker.name().to_owned(),
        tasks: a.tasks,
        session_timeout_ms: a.session_timeout_ms,
        in_flight_after_s: in_flight_after,
        kill_to_all_resumed_s: all_resumed.unwrap_or(f64::NAN),
        kill_to_all_succeeded_s: killed.elapsed().as_secs_f64(),
        lost: a.tasks - succeeded.len(),
        step_reruns,
        unexpected_reruns,
        violations: violations.len(),
    };
    drop(events);
    drop(client);
    drop(_second);
    drop(broker);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("broker                    {}", report.broker);
        println!("tasks in flight           {} (all mid-step after {:.1} s)", report.tasks, report.in_flight_after_s);
        println!("kill -9 -> all resumed    {:.1} s (session timeout {} ms)", report.kill_to_all_resumed_s, report.session_timeout_ms);
        println!("kill -9 -> all succeeded  {:.1} s (each resumed step reruns its {} s)", report.kill_to_all_succeeded_s, a.step_seconds);
        println!("lost                      {}", report.lost);
        println!("steps run twice           {} (each task's step was mid-way at the kill: {} expected)", report.step_reruns, report.tasks);
        println!("unexpected reruns         {}", report.unexpected_reruns);
        println!("checker violations        {}", report.violations);
    }
    let clean = report.lost == 0 && report.unexpected_reruns == 0 && report.violations == 0 && report.step_reruns <= report.tasks;
    Ok(if clean { std::process::ExitCode::SUCCESS } else { std::process::ExitCode::FAILURE })
}

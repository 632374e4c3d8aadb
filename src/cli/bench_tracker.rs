//! `ferry bench tracker`: what `ferry tasks list` costs over a large task-state topic.
//! Fills `ferry.task-state.test` with N snapshots (as N finished tasks leave it), then times
//! reading it to the end and filtering it the way `tasks list --state` does.

use std::time::{Duration, Instant};

use clap::Args;
use ferry_runtime::protocol::{Bytes, EventType, JournalEntry, StepStatus, TaskSnapshot, TaskState};
use ferry_runtime::testkind::TestTaskSpec;
use ferry_runtime::wire::Registry;
use ferry_runtime::{Client, TaskId, TaskKind, Topics};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde::Serialize;

#[derive(Debug, Args)]
pub struct TrackerArgs {
    /// Which broker to measure through.
    #[arg(long, value_enum, default_value = "embedded")]
    pub broker: super::bench::BrokerChoice,
    /// Bootstrap of an external broker (with --broker external).
    #[arg(long)]
    pub bootstrap: Option<String>,
    /// Tasks in the task-state topic.
    #[arg(long, default_value_t = 100_000)]
    pub tasks: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct Report {
    broker: String,
    tasks: usize,
    snapshot_bytes: usize,
    fill_s: f64,
    read_all_s: f64,
    tasks_per_s: f64,
    failed_found: usize,
}

fn snapshot(r: &Registry, i: usize) -> TaskSnapshot {
    let failed = i.is_multiple_of(10);
    TaskSnapshot {
        task_id: TaskId::new().to_string(),
        kind: TaskKind::Test,
        subject: format!("bench/{}", i % 1000),
        state: if failed { TaskState::Failed } else { TaskState::Succeeded },
        seq: 8,
        last_event: if failed { EventType::Failed } else { EventType::Succeeded },
        idempotency_key: None,
        requested_by: "bench".into(),
        origin_partition: (i % 6) as i32,
        origin_offset: i as i64,
        created_at_ms: 1,
        updated_at_ms: 2,
        deadline_ms: None,
        keep_partial: false,
        worker: "bench".into(),
        trace_parent: None,
        spec: Bytes(r.encode(&TestTaskSpec::steps(3)).expect("spec encodes")),
        journal: (0..3)
            .map(|s| JournalEntry {
                step: s,
                name: format!("step-{s}"),
                status: StepStatus::Succeeded,
                output: Some(format!(r#"{{"step":{s}}}"#)),
                attempts: 1,
                started_at_ms: 1,
                finished_at_ms: Some(2),
            })
            .collect(),
        error: None,
        cancel_requested: false,
        revert_requested: false,
    }
}

pub async fn run(a: TrackerArgs) -> anyhow::Result<std::process::ExitCode> {
    let topics = Topics::standard();
    let (broker, kafka) = super::bench::BenchBroker::start(a.broker, a.bootstrap.as_deref(), &topics, 1).await?;
    let registry = Registry::embedded();
    let producer: FutureProducer = kafka.producer().set("linger.ms", "20").create()?;
    let topic = topics.task_state(TaskKind::Test).name.clone();
    let fill = Instant::now();
    let mut bytes = 0;
    let mut pending = Vec::with_capacity(1000);
    for i in 0..a.tasks {
        let s = snapshot(&registry, i);
        let payload = registry.encode(&s)?;
        bytes = payload.len();
        let (p, t, key) = (producer.clone(), topic.clone(), s.task_id.clone());
        pending.push(tokio::spawn(async move { p.send(FutureRecord::to(&t).key(&key).payload(&payload), Duration::from_secs(60)).await.map(|_| ()).map_err(|(e, _)| e) }));
        if pending.len() == 1000 {
            for h in pending.drain(..) {
                h.await??;
            }
        }
    }
    for h in pending {
        h.await??;
    }
    let fill_s = fill.elapsed().as_secs_f64();
    let client = Client::new(kafka, topics)?;
    let read = Instant::now();
    let all = client.snapshots().await?;
    let failed = all.iter().filter(|s| s.state == TaskState::Failed).count();
    let read_all_s = read.elapsed().as_secs_f64();
    anyhow::ensure!(all.len() == a.tasks, "read {} of {} tasks", all.len(), a.tasks);
    let report = Report {
        broker: a.broker.name().to_owned(),
        tasks: a.tasks,
        snapshot_bytes: bytes,
        fill_s,
        read_all_s,
        tasks_per_s: a.tasks as f64 / read_all_s,
        failed_found: failed,
    };
    drop(client);
    drop(broker);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("broker                    {}", report.broker);
        println!("tasks in ferry.task-state.test {} ({} bytes per snapshot; filled in {:.1} s)", report.tasks, report.snapshot_bytes, report.fill_s);
        println!("read all + filter         {:.2} s ({:.0} tasks/s; {} failed found)", report.read_all_s, report.tasks_per_s, report.failed_found);
    }
    Ok(std::process::ExitCode::SUCCESS)
}

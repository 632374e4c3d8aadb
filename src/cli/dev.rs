//! `ferry dev`: Ferry on an embedded default. Starts the in-process Kafka-protocol broker
//! with every topic, the workers, and (with `--demo`) a scripted scenario that exits 0 only
//! when every task reached its expected final state.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use ferry_runtime::testkind::{TestHandler, TestTaskSpec};
use ferry_runtime::{Client, EmbeddedBroker, EventType, KafkaConfig, SubmitOptions, TaskKind, Topics, Worker, WorkerOptions};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Args)]
pub struct DevArgs {
    /// Run a scripted scenario, print one line per task, and exit.
    #[arg(long, value_enum)]
    pub demo: Option<Demo>,
    /// Mock brokers in the embedded cluster.
    #[arg(long, default_value_t = 3)]
    pub mock_brokers: i32,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Demo {
    /// Runtime tasks: success, failure with automatic revert, retries, cancel.
    Smoke,
}

pub async fn run(a: DevArgs) -> anyhow::Result<ExitCode> {
    let topics = Topics::standard();
    eprintln!("ferry dev: starting the embedded Kafka-protocol broker ({} brokers)", a.mock_brokers);
    let broker = EmbeddedBroker::start(a.mock_brokers, &topics)?;
    let bootstrap = broker.bootstrap();
    let state = super::state_dir().join("dev");
    std::fs::create_dir_all(&state).with_context(|| format!("creating {}", state.display()))?;
    std::fs::write(state.join("bootstrap"), &bootstrap)?;
    println!("bootstrap: {bootstrap}");
    println!("state: {}", state.display());

    let shutdown = CancellationToken::new();
    let kafka = KafkaConfig::for_embedded(bootstrap.clone());
    let mut opts = WorkerOptions::new(kafka.clone());
    opts.topics = topics.clone();
    opts.shutdown_grace = Duration::from_secs(5);
    let worker = tokio::spawn(Worker::new(opts, TestHandler::default()).run(shutdown.clone()));
    eprintln!("ferry dev: workers running: test");

    let code = match a.demo {
        Some(Demo::Smoke) => smoke(&kafka, &topics).await?,
        None => {
            eprintln!("ferry dev: ready. In another terminal: ferry submit test -f examples/test-task.yaml --wait");
            eprintln!("ferry dev: Ctrl-C to stop");
            super::common::cancel_on_signal(shutdown.clone());
            shutdown.cancelled().await;
            ExitCode::SUCCESS
        }
    };
    shutdown.cancel();
    worker.await??;
    let _ = std::fs::remove_file(state.join("bootstrap"));
    drop(broker);
    Ok(code)
}

/// One scripted task and the final event it must reach.
struct Case {
    name: &'static str,
    spec: TestTaskSpec,
    cancel: bool,
    expect: EventType,
}

async fn smoke(kafka: &KafkaConfig, topics: &Topics) -> anyhow::Result<ExitCode> {
    let client = Client::new(kafka.clone(), topics.clone())?;
    let mut events = client.events(true).await?;
    let cases = [
        Case { name: "three-steps", spec: TestTaskSpec::steps(3), cancel: false, expect: EventType::Succeeded },
        Case { name: "fails-at-2", spec: TestTaskSpec { fail_at: Some(2), ..TestTaskSpec::steps(3) }, cancel: false, expect: EventType::Reverted },
        Case { name: "flaky", spec: TestTaskSpec { fail_transient: 2, ..TestTaskSpec::steps(2) }, cancel: false, expect: EventType::Succeeded },
        Case { name: "cancelled", spec: TestTaskSpec { block_at: Some(2), ..TestTaskSpec::steps(3) }, cancel: true, expect: EventType::Cancelled },
    ];
    let mut all_ok = true;
    for case in cases {
        let id = client.submit(TaskKind::Test, &format!("smoke-{}", case.name), &case.spec, SubmitOptions::default()).await?;
        if case.cancel {
            events.until(id, Duration::from_secs(60), |e| e.event == EventType::StepProgress).await?;
            client.cancel(id).await?;
        }
        let evs = events.until(id, Duration::from_secs(120), |e| e.event.is_final()).await?;
        let last = evs.last().map(|e| e.event);
        let ok = last == Some(case.expect);
        all_ok &= ok;
        let steps = evs.iter().filter(|e| e.event == EventType::StepSucceeded).count();
        let reverted = evs.iter().filter(|e| e.event == EventType::StepReverted).count();
        println!(
            "smoke {:<12} {id} {:<10} expected {:<10} steps done {steps}, reverted {reverted}, events {} {}",
            case.name,
            format!("{last:?}").trim_start_matches("Some(").trim_end_matches(')'),
            format!("{:?}", case.expect),
            evs.len(),
            if ok { "ok" } else { "MISMATCH" }
        );
    }
    println!("smoke: {}", if all_ok { "every task reached its expected state" } else { "FAILED" });
    Ok(if all_ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

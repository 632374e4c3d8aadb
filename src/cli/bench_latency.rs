//! `ferry bench latency`: what a user feels. Tasks submitted open-loop at a fixed rate
//! (one every 1/rate s, whatever the earlier ones do), each timed from its send to its
//! Accepted and its Succeeded event as a reader sees them, beside the broker's own round
//! trip (produce, then consume) measured in the same run at the same rate.

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use ferry_runtime::testkind::{TestHandler, TestTaskSpec};
use ferry_runtime::{Client, EventType, KafkaConfig, SubmitOptions, TaskKind, Topics, Worker, WorkerOptions};
use futures::StreamExt;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::Message;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::bench::{BenchBroker, BrokerChoice, pct};

#[derive(Debug, Args)]
pub struct LatencyArgs {
    /// Which broker to measure through.
    #[arg(long, value_enum, default_value = "embedded")]
    pub broker: BrokerChoice,
    /// Bootstrap of an external broker (with --broker external).
    #[arg(long)]
    pub bootstrap: Option<String>,
    /// Tasks (and raw messages) per second, sent open-loop.
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// How long each phase sends.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Steps per task (no-op steps of the `test` kind).
    #[arg(long, default_value_t = 3)]
    pub steps: i32,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct Report {
    broker: String,
    machine: String,
    rate_per_s: f64,
    seconds: f64,
    raw_messages: usize,
    raw_round_trip_p50_ms: f64,
    raw_round_trip_p99_ms: f64,
    tasks: usize,
    steps: i32,
    accepted_p50_ms: f64,
    accepted_p99_ms: f64,
    succeeded_p50_ms: f64,
    succeeded_p99_ms: f64,
    /// accepted_p99_ms / raw_round_trip_p99_ms (the goal: at most 2 at 100/s).
    accepted_p99_over_raw_p99: f64,
}

/// Sends `n` ticks, one every `1/rate` s from now, calling `send(i)` without waiting for
/// the earlier ones (open loop: a slow answer does not slow the schedule).
async fn open_loop<F, Fut>(rate: f64, n: usize, send: F) -> anyhow::Result<()>
where
    F: Fn(usize, Instant) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let start = tokio::time::Instant::now();
    let mut handles = Vec::with_capacity(n);
    for i in 0..n {
        let at = start + Duration::from_secs_f64(i as f64 / rate);
        tokio::time::sleep_until(at).await;
        handles.push(tokio::spawn(send(i, Instant::now())));
    }
    for h in handles {
        h.await??;
    }
    Ok(())
}

/// Round trips of single records produced at `rate` for `n` records: each timed from its
/// send to its arrival at a reader of the topic.
async fn raw_round_trips(kafka: &KafkaConfig, topic: &str, rate: f64, n: usize) -> anyhow::Result<Vec<f64>> {
    let producer: FutureProducer = kafka.producer().create()?;
    let consumer = kafka.topic_reader(topic, false)?;
    let sent: Arc<Mutex<HashMap<usize, Instant>>> = Arc::default();
    let read = {
        let sent = sent.clone();
        async move {
            let mut rtt = Vec::with_capacity(n);
            let mut stream = consumer.stream();
            while rtt.len() < n {
                let m = tokio::time::timeout(Duration::from_secs(60), stream.next()).await?.ok_or_else(|| anyhow::anyhow!("consumer ended"))??;
                let i: usize = std::str::from_utf8(m.payload().unwrap_or_default())?.parse()?;
                if let Some(t0) = sent.lock().expect("sent lock").remove(&i) {
                    rtt.push(t0.elapsed().as_secs_f64() * 1000.0);
                }
            }
            Ok::<_, anyhow::Error>(rtt)
        }
    };
    let write = open_loop(rate, n, |i, t0| {
        sent.lock().expect("sent lock").insert(i, t0);
        let producer = producer.clone();
        let topic = topic.to_owned();
        async move {
            let key = format!("rtt-{}", i % 256);
            producer.send(FutureRecord::to(&topic).key(&key).payload(&i.to_string()), Duration::from_secs(30)).await.map_err(|(e, _)| e)?;
            Ok(())
        }
    });
    let (rtt, w) = tokio::join!(read, write);
    w?;
    rtt
}

pub async fn run(a: LatencyArgs, properties: &[(String, String)]) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(a.rate > 0.0 && a.rate <= 20_000.0, "--rate must be above 0 and at most 20000 per second");
    let n = ((a.rate * a.duration.as_secs_f64()).round() as usize).max(1);
    let topics = Topics::standard();
    let raw_topic = "ferry.bench.latency";
    let (broker, mut kafka) = BenchBroker::start(a.broker, a.bootstrap.as_deref(), &topics, 3).await?;
    // The baseline runs with the same client settings as the tasks: a `linger.ms` given
    // here moves both, and the ratio compares like with like.
    kafka.extra.extend(properties.iter().cloned());
    broker.create_topic(raw_topic, 6).await?;
    let mut rtt = raw_round_trips(&kafka, raw_topic, a.rate, n).await?;

    let shutdown = CancellationToken::new();
    let mut opts = WorkerOptions::new(kafka.clone());
    opts.topics = topics.clone();
    let worker = tokio::spawn(Worker::new(opts, TestHandler { min_delay: Some(Duration::ZERO), effects: None }).run(shutdown.clone()));
    let client = Arc::new(Client::new(kafka.clone(), topics.clone())?);
    let mut events = client.events(false).await?;
    // Warm-up: the group join and the first fetches are not the steady state.
    let warm = client.submit(TaskKind::TEST, "warm", &TestTaskSpec::steps(1), SubmitOptions::default()).await?;
    events.until(warm, Duration::from_secs(60), |e| e.event == EventType::Succeeded).await?;

    let sent: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let spec = TestTaskSpec::steps(a.steps);
    let read = {
        let sent = sent.clone();
        async move {
            let (mut accepted, mut succeeded) = (Vec::with_capacity(n), Vec::with_capacity(n));
            while succeeded.len() < n {
                let ev = tokio::time::timeout(Duration::from_secs(120), events.next())
                    .await
                    .map_err(|_| anyhow::anyhow!("no event for 120 s; {} of {n} tasks succeeded", succeeded.len()))?
                    .ok_or_else(|| anyhow::anyhow!("event stream ended"))?;
                let Some(t0) = sent.lock().expect("sent lock").get(&ev.task_id).copied() else { continue };
                let ms = t0.elapsed().as_secs_f64() * 1000.0;
                match ev.event {
                    EventType::Accepted => accepted.push(ms),
                    EventType::Succeeded => succeeded.push(ms),
                    e if e.is_final() => anyhow::bail!("task {} ended {e:?}", ev.task_id),
                    _ => {}
                }
            }
            Ok::<_, anyhow::Error>((accepted, succeeded))
        }
    };
    let write = open_loop(a.rate, n, |i, t0| {
        let (client, sent, spec) = (client.clone(), sent.clone(), spec.clone());
        async move {
            // The id is chosen here so that the clock starts before the send.
            let key = format!("latency-{i}-{}", std::process::id());
            let id = client.id_for_key(TaskKind::TEST, &key);
            sent.lock().expect("sent lock").insert(id.to_string(), t0);
            let opts = SubmitOptions { idempotency_key: Some(key), ..SubmitOptions::default() };
            client.submit(TaskKind::TEST, &format!("latency-{}", i % 512), &spec, opts).await?;
            Ok(())
        }
    });
    let (r, w) = tokio::join!(read, write);
    w?;
    let (mut accepted, mut succeeded) = r?;
    shutdown.cancel();
    worker.await??;
    // Clients before their broker: a producer whose broker went first logs its reconnects.
    drop(client);
    drop(broker);
    let raw_p99 = pct(&mut rtt, 0.99);
    let report = Report {
        broker: a.broker.name().to_owned(),
        machine: format!("{} cores", std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)),
        rate_per_s: a.rate,
        seconds: a.duration.as_secs_f64(),
        raw_messages: n,
        raw_round_trip_p50_ms: pct(&mut rtt, 0.5),
        raw_round_trip_p99_ms: raw_p99,
        tasks: n,
        steps: a.steps,
        accepted_p50_ms: pct(&mut accepted, 0.5),
        accepted_p99_ms: pct(&mut accepted, 0.99),
        succeeded_p50_ms: pct(&mut succeeded, 0.5),
        succeeded_p99_ms: pct(&mut succeeded, 0.99),
        accepted_p99_over_raw_p99: pct(&mut accepted, 0.99) / raw_p99,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("broker                  {} ({})", report.broker, report.machine);
        println!("open-loop rate          {} per second for {:.0} s ({} tasks, {} raw records)", report.rate_per_s, report.seconds, report.tasks, report.raw_messages);
        println!("raw round trip          p50 {:.2} ms  p99 {:.2} ms", report.raw_round_trip_p50_ms, report.raw_round_trip_p99_ms);
        println!("command -> Accepted     p50 {:.2} ms  p99 {:.2} ms  ({:.2} x raw p99)", report.accepted_p50_ms, report.accepted_p99_ms, report.accepted_p99_over_raw_p99);
        println!("command -> Succeeded    p50 {:.2} ms  p99 {:.2} ms  ({} no-op steps)", report.succeeded_p50_ms, report.succeeded_p99_ms, report.steps);
    }
    Ok(ExitCode::SUCCESS)
}

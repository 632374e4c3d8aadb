//! `ferry bench runtime`: tasks per second and command-to-Accepted latency through a real
//! broker, beside that broker's raw produce-to-consume rate and round trip in the same run.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand, ValueEnum};
use ferry_runtime::testkind::{TestHandler, TestTaskSpec};
use ferry_runtime::{Client, EmbeddedBroker, EventType, KafkaConfig, SubmitOptions, TaskKind, Topics, Worker, WorkerOptions};
use futures::StreamExt;
use rdkafka::consumer::Consumer;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// The task runtime against the broker's own limit.
    Runtime(RuntimeArgs),
    /// Command -> Accepted and -> Succeeded at a fixed open-loop rate, beside the broker's
    /// round trip at that rate.
    Latency(super::bench_latency::LatencyArgs),
    /// The wall time of the commands a user types (`submit`, `--wait`, `tasks`), each a
    /// new process, beside the process's own start-up.
    Cli(super::bench_cli::CliArgs),
    /// Many tasks waiting for simulated clusters in one worker: watches, memory, idle CPU.
    Waits(super::bench_waits::WaitsArgs),
    /// Reading the task-state topic as `ferry tasks list` does, over many tasks.
    Tracker(super::bench_tracker::TrackerArgs),
    /// kill -9 of a worker holding many tasks mid-step: time to resume, nothing lost.
    Recovery(super::bench_recovery::RecoveryArgs),
    /// A plan step fanned out in waves over many simulated clusters, then reverted.
    Wave(super::bench_wave::WaveArgs),
    /// The test bed: start-up time and memory per cluster.
    Testbed {
        /// Clusters to start (hub included).
        #[arg(long, default_value_t = 3)]
        clusters: usize,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct RuntimeArgs {
    /// Which broker to measure through.
    #[arg(long, value_enum, default_value = "embedded")]
    pub broker: BrokerChoice,
    /// Bootstrap of an external broker (with --broker external).
    #[arg(long)]
    pub bootstrap: Option<String>,
    /// Tasks to run.
    #[arg(long, default_value_t = 2000)]
    pub tasks: usize,
    /// Subjects the tasks are spread over; a subject runs one task at a time.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub subjects: u32,
    /// Raw messages per round of the broker baseline (each round on a topic of its own; at
    /// most 150,000 on the embedded broker, which keeps 5 MB per partition).
    #[arg(long, default_value_t = 100_000)]
    pub messages: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum BrokerChoice {
    /// librdkafka's in-process mock cluster.
    Embedded,
    /// A tansu broker process from the cache (scripts/install-tansu.sh).
    Tansu,
    /// A broker you started (e.g. Kafka), topics already created.
    External,
}

impl BrokerChoice {
    /// The name reports print.
    pub fn name(self) -> &'static str {
        match self {
            Self::Embedded => "embedded",
            Self::Tansu => "tansu",
            Self::External => "external",
        }
    }
}

/// The broker a benchmark runs through; it stops when this is dropped.
pub enum BenchBroker {
    /// librdkafka's mock cluster in this process.
    Embedded(EmbeddedBroker),
    /// A tansu process.
    Tansu(ferry_runtime::tansu::Tansu),
    /// Someone else's broker.
    External,
}

/// `fetch.wait.max.ms` of benchmark clients on the embedded broker.
const BENCH_FETCH_WAIT_MS: u32 = 5;

impl BenchBroker {
    /// Starts `choice` with Ferry's topics (`brokers` mock brokers when embedded); the
    /// config to reach it.
    pub async fn start(choice: BrokerChoice, bootstrap: Option<&str>, topics: &Topics, brokers: i32) -> anyhow::Result<(Self, KafkaConfig)> {
        Ok(match choice {
            BrokerChoice::Embedded => {
                let b = EmbeddedBroker::start(brokers, topics)?;
                // The benchmarks' figures (docs/BENCHMARKS.md) were all taken at a 5 ms fetch
                // wait: they keep it, so runs stay comparable and the latency goal is judged
                // where it was set; tests and `ferry dev` wait longer for less idle CPU.
                let k = KafkaConfig { fetch_wait_max_ms: Some(BENCH_FETCH_WAIT_MS), ..KafkaConfig::for_embedded(b.bootstrap()) };
                (Self::Embedded(b), k)
            }
            BrokerChoice::Tansu => {
                let t = ferry_runtime::tansu::Tansu::start(topics).await?;
                let k = t.kafka();
                (Self::Tansu(t), k)
            }
            BrokerChoice::External => {
                let b = bootstrap.ok_or_else(|| anyhow::anyhow!("--bootstrap is required with --broker external"))?;
                (Self::External, KafkaConfig::plaintext(b))
            }
        })
    }

    /// Creates a topic for the benchmark's own use (an external broker must have it).
    pub async fn create_topic(&self, name: &str, partitions: i32) -> anyhow::Result<()> {
        match self {
            Self::Embedded(b) => b.create_topic(name, partitions, 3)?,
            Self::Tansu(t) => t.create_topic(name, partitions).await?,
            Self::External => {}
        }
        Ok(())
    }
}

/// Most raw messages per round on the embedded broker: 150,000 records of 200 bytes over
/// 6 partitions fill its 5 MB per partition.
const EMBEDDED_RAW_MESSAGES_MAX: usize = 150_000;

/// Rounds of the raw baseline; its rate is their median.
const RAW_ROUNDS: usize = 5;

/// Single-record round trips the raw baseline measures.
const RAW_ROUND_TRIPS: usize = 300;

#[derive(Debug, Serialize)]
struct Report {
    broker: String,
    machine: String,
    raw_messages: usize,
    /// The median of the rounds below.
    raw_messages_per_s: f64,
    /// Each round of the raw baseline ([`RAW_ROUNDS`], `raw_messages` records each).
    raw_rounds_messages_per_s: Vec<f64>,
    raw_round_trip_p50_ms: f64,
    raw_round_trip_p90_ms: f64,
    raw_round_trip_p99_ms: f64,
    tasks: usize,
    tasks_per_s: f64,
    /// Records the run wrote per task (commands, snapshots and events on the topics, the
    /// warm-up task included), counted from the topics' end offsets.
    records_per_task: f64,
    /// The broker's limit for such tasks: raw msg/s ÷ records per task.
    ideal_tasks_per_s: f64,
    /// tasks/s ÷ ideal (issue 21's goal: ≥ 0.5).
    ratio_of_ideal: f64,
    accepted_p50_ms: f64,
    accepted_p90_ms: f64,
    accepted_p99_ms: f64,
    succeeded_p50_ms: f64,
    succeeded_p90_ms: f64,
    succeeded_p99_ms: f64,
}

/// The `p` quantile (0 to 1) of `v` (sorted in place); 0 for none.
pub(crate) fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// Runs a benchmark; `properties` (the global `--kafka-property`) apply to every client of
/// `bench runtime` and `bench latency`, their raw baselines included (for tuning
/// experiments: a ratio compares the same client settings on both sides).
pub async fn run(cmd: BenchCommand, properties: &[(String, String)]) -> anyhow::Result<ExitCode> {
    let a = match cmd {
        BenchCommand::Runtime(a) => a,
        BenchCommand::Testbed { clusters, json } => return testbed(clusters, json).await,
        BenchCommand::Waits(a) => return super::bench_waits::run(a).await,
        BenchCommand::Tracker(a) => return super::bench_tracker::run(a).await,
        BenchCommand::Recovery(a) => return super::bench_recovery::run(a).await,
        BenchCommand::Latency(a) => return super::bench_latency::run(a, properties).await,
        BenchCommand::Cli(a) => return super::bench_cli::run(a, properties).await,
        BenchCommand::Wave(a) => return super::bench_wave::run(a).await,
    };
    anyhow::ensure!(
        !matches!(a.broker, BrokerChoice::Embedded) || a.messages <= EMBEDDED_RAW_MESSAGES_MAX,
        "--messages {}: the embedded broker keeps 5 MB per partition, so a round of the raw baseline holds at most {EMBEDDED_RAW_MESSAGES_MAX} messages (its reader would miss the dropped ones and wait forever)",
        a.messages
    );
    anyhow::ensure!(a.messages > 0, "--messages must be at least 1");
    let topics = Topics::standard();
    // One topic per round of the raw baseline: the embedded (mock) broker keeps at most
    // 5 MB or 100,000 batches per partition and drops the oldest beyond (librdkafka's
    // rdkafka_mock.c, rd_kafka_mock_partition_init), so a reader behind them would skip.
    let bench_topics: Vec<String> = (1..=RAW_ROUNDS).map(|r| format!("ferry.bench.raw.{r}")).collect();
    let (broker, mut kafka) = BenchBroker::start(a.broker, a.bootstrap.as_deref(), &topics, 3).await?;
    // The baseline runs with the same client settings as the tasks (see bench latency).
    kafka.extra.extend(properties.iter().cloned());
    let mut rounds = Vec::new();
    let mut rtt = Vec::new();
    for (i, topic) in bench_topics.iter().enumerate() {
        broker.create_topic(topic, 6).await?;
        // Round trips once, after the last round (300 take 150 s on tansu).
        let round_trips = if i + 1 == bench_topics.len() { RAW_ROUND_TRIPS } else { 0 };
        let (rate, round_trips) = raw_baseline(&kafka, topic, a.messages, round_trips).await?;
        rounds.push(rate);
        rtt.extend(round_trips);
    }
    // The median round: a round lasts a fraction of a second, and single rounds were seen
    // at 0.7 and at 1.6 times their run's median (docs/BENCHMARKS.md, session 24).
    let rate = pct(&mut rounds.clone(), 0.5);

    let shutdown = CancellationToken::new();
    let mut opts = WorkerOptions::new(kafka.clone());
    opts.topics = topics.clone();
    let worker = tokio::spawn(Worker::new(opts, TestHandler::default()).run(shutdown.clone()));
    let client = Client::new(kafka.clone(), topics.clone())?;
    let mut events = client.events(false).await?;
    let topics_written = [topics.command(TaskKind::TEST).name.clone(), topics.task_state(TaskKind::TEST).name.clone(), topics.progress().name.clone()];
    // What an outside broker's topics held before (`--bootstrap`); none on a new broker.
    let records_before = records_on(&kafka, &topics_written)?;
    // Warm-up: the group join and the first fetches are not part of the steady state.
    let warm = client.submit(TaskKind::TEST, "warm", &TestTaskSpec::steps(1), SubmitOptions::default()).await?;
    events.until(warm, Duration::from_secs(60), |e| e.event == EventType::Succeeded).await?;

    let spec = TestTaskSpec::steps(3);
    let subjects = a.subjects as usize;
    let start = Instant::now();
    // Submit concurrently, as many producers would; each task's clock starts at its send.
    let sent: HashMap<String, Instant> = futures::stream::iter(0..a.tasks)
        .map(|i| {
            let client = &client;
            let spec = &spec;
            async move {
                let t0 = Instant::now();
                let id = client.submit(TaskKind::TEST, &format!("bench-{}", i % subjects), spec, SubmitOptions::default()).await?;
                Ok::<_, anyhow::Error>((id.to_string(), t0))
            }
        })
        .buffer_unordered(512)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let mut accepted = Vec::new();
    let mut succeeded = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    while succeeded.len() < a.tasks {
        let Some(ev) = tokio::time::timeout_at(deadline, events.next()).await? else { break };
        let Some(t0) = sent.get(&ev.task_id) else { continue };
        let ms = t0.elapsed().as_secs_f64() * 1000.0;
        match ev.event {
            EventType::Accepted => accepted.push(ms),
            EventType::Succeeded => succeeded.push(ms),
            e if e.is_final() => anyhow::bail!("task {} ended {e:?}", ev.task_id),
            _ => {}
        }
    }
    let took = start.elapsed().as_secs_f64();
    shutdown.cancel();
    worker.await??;
    let records = (records_on(&kafka, &topics_written)? - records_before) as f64 / (a.tasks + 1) as f64;
    let tasks_per_s = a.tasks as f64 / took;
    let report = Report {
        broker: a.broker.name().to_owned(),
        machine: format!("{} cores", std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)),
        raw_messages: a.messages,
        raw_messages_per_s: rate,
        raw_rounds_messages_per_s: rounds,
        raw_round_trip_p50_ms: pct(&mut rtt, 0.5),
        raw_round_trip_p90_ms: pct(&mut rtt, 0.9),
        raw_round_trip_p99_ms: pct(&mut rtt, 0.99),
        tasks: a.tasks,
        tasks_per_s,
        records_per_task: records,
        ideal_tasks_per_s: rate / records,
        ratio_of_ideal: tasks_per_s * records / rate,
        accepted_p50_ms: pct(&mut accepted, 0.5),
        accepted_p90_ms: pct(&mut accepted, 0.9),
        accepted_p99_ms: pct(&mut accepted, 0.99),
        succeeded_p50_ms: pct(&mut succeeded, 0.5),
        succeeded_p90_ms: pct(&mut succeeded, 0.9),
        succeeded_p99_ms: pct(&mut succeeded, 0.99),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("broker                    {}", report.broker);
        let rounds: Vec<String> = report.raw_rounds_messages_per_s.iter().map(|r| format!("{r:.0}")).collect();
        println!("raw produce->consume      {:.0} msg/s (median of {} rounds of {} messages: {})", report.raw_messages_per_s, rounds.len(), report.raw_messages, rounds.join(" / "));
        println!("raw round trip            p50 {:.2} ms  p90 {:.2} ms  p99 {:.2} ms", report.raw_round_trip_p50_ms, report.raw_round_trip_p90_ms, report.raw_round_trip_p99_ms);
        println!("3-step no-op tasks        {:.0} tasks/s ({} tasks, {:.1} records each = {:.0} records/s)", report.tasks_per_s, report.tasks, report.records_per_task, report.tasks_per_s * report.records_per_task);
        println!("of the broker's limit     {:.2} (ideal {:.0} tasks/s = raw msg/s / records per task)", report.ratio_of_ideal, report.ideal_tasks_per_s);
        println!("command -> Accepted       p50 {:.2} ms  p90 {:.2} ms  p99 {:.2} ms", report.accepted_p50_ms, report.accepted_p90_ms, report.accepted_p99_ms);
        println!("command -> Succeeded      p50 {:.2} ms  p90 {:.2} ms  p99 {:.2} ms", report.succeeded_p50_ms, report.succeeded_p90_ms, report.succeeded_p99_ms);
    }
    Ok(ExitCode::SUCCESS)
}

/// Records ever written to `topics`: the sum of their partitions' end offsets. Not end
/// minus start: the embedded broker drops a partition's oldest batches beyond 5 MB (see
/// `embedded.rs`), which raised the start offsets of a long run's topics and counted 11.9
/// records per task where 14.0 were written (docs/BENCHMARKS.md, session 43).
pub(crate) fn records_on(kafka: &KafkaConfig, topics: &[String]) -> anyhow::Result<i64> {
    let c: rdkafka::consumer::BaseConsumer = kafka.reader().create()?;
    let mut n = 0;
    for t in topics {
        let md = c.fetch_metadata(Some(t), Duration::from_secs(10))?;
        for p in md.topics().iter().flat_map(|t| t.partitions()) {
            let (_, hi) = c.fetch_watermarks(t, p.id(), Duration::from_secs(10))?;
            n += hi;
        }
    }
    Ok(n)
}

/// Messages/s produced and consumed through the broker, then `round_trips` single-message
/// round trips.
async fn raw_baseline(kafka: &KafkaConfig, topic: &str, n: usize, round_trips: usize) -> anyhow::Result<(f64, Vec<f64>)> {
    let producer: FutureProducer = kafka.producer().create()?;
    let consumer = kafka.topic_reader(topic, false)?;
    let payload = vec![7u8; 200];
    let start = Instant::now();
    let produce = async {
        let mut acks = futures::stream::FuturesUnordered::new();
        for i in 0..n {
            let key = (i % 256).to_string();
            let f = producer.send_result(FutureRecord::to(topic).key(&key).payload(&payload));
            match f {
                Ok(f) => acks.push(f),
                Err((e, _)) => anyhow::bail!("produce: {e}"),
            }
            if acks.len() >= 10_000 {
                acks.next().await;
            }
        }
        while acks.next().await.is_some() {}
        Ok(())
    };
    let consume = async {
        let mut stream = consumer.stream();
        let mut got = 0;
        while got < n {
            stream.next().await.ok_or_else(|| anyhow::anyhow!("consumer ended"))??;
            got += 1;
        }
        Ok::<_, anyhow::Error>(())
    };
    let (p, c) = tokio::join!(produce, consume);
    p?;
    c?;
    let rate = n as f64 / start.elapsed().as_secs_f64();
    let mut rtt = Vec::new();
    let mut stream = consumer.stream();
    for _ in 0..round_trips {
        let t0 = Instant::now();
        producer
            .send(FutureRecord::to(topic).key("rtt").payload(&payload), Duration::from_secs(10))
            .await
            .map_err(|(e, _)| e)?;
        stream.next().await.ok_or_else(|| anyhow::anyhow!("consumer ended"))??;
        rtt.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    Ok((rate, rtt))
}

/// Starts `n` clusters with controllers, then reads time and memory.
async fn testbed(n: usize, json: bool) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    let opts = ferry_fleet::FleetOptions::hub_and(n.saturating_sub(1));
    let fleet = ferry_fleet::Fleet::start(opts).await?;
    let ready = started.elapsed().as_secs_f64();
    // Controllers start after their API server; let them finish their own start-up by
    // waiting until the hub's default service account exists (the controller made it).
    let sa: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> = kube::Api::namespaced(fleet.hub().client().await?, "default");
    kube::runtime::wait::await_condition(sa, "default", |o: Option<&k8s_openapi::api::core::v1::ServiceAccount>| o.is_some()).await?;
    let rss = ferry_fleet::measure::rss_by_program(&fleet.dir);
    let total: f64 = rss.values().map(|(_, mb)| mb).sum();
    let report = serde_json::json!({
        "clusters": n,
        "api_servers_ready_s": ready,
        "rss_mib_by_program": rss.iter().map(|(k, (c, mb))| (k.clone(), serde_json::json!({"processes": c, "mib": mb}))).collect::<serde_json::Map<_, _>>(),
        "rss_mib_total": total,
        "rss_mib_per_cluster": total / n as f64,
        "clusters_fitting_in_memory": ((total_memory_mib() * 0.8) / (total / n as f64)).floor(),
    });
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("clusters                 {n}");
        println!("API servers ready        {ready:.1} s");
        for (k, (c, mb)) in &rss {
            println!("  {k:<24} {c} processes, {mb:.0} MiB");
        }
        println!("RSS total                {total:.0} MiB ({:.0} MiB per cluster)", total / n as f64);
        println!("clusters in 80% of RAM   {}", report["clusters_fitting_in_memory"]);
    }
    Ok(ExitCode::SUCCESS)
}

fn total_memory_mib() -> f64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().find(|l| l.starts_with("MemTotal:"))?.split_whitespace().nth(1)?.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Submits `n` `test` tasks with `spec` concurrently (512 in flight), the subject of each
/// from its index; returns their ids.
pub async fn submit_tests(client: &Client, n: usize, spec: &TestTaskSpec, subject: impl Fn(usize) -> String) -> anyhow::Result<std::collections::HashSet<String>> {
    futures::stream::iter(0..n)
        .map(|i| {
            let subject = subject(i);
            async move { client.submit(TaskKind::TEST, &subject, spec, SubmitOptions::default()).await.map(|id| id.to_string()) }
        })
        .buffer_unordered(512)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .map(|r| r.map_err(anyhow::Error::from))
        .collect()
}

/// Waits until every task of `ids` has published an `event`.
pub async fn until_each(events: &mut ferry_runtime::EventStream, ids: &std::collections::HashSet<String>, event: EventType, deadline: tokio::time::Instant) -> anyhow::Result<()> {
    let mut seen = std::collections::HashSet::new();
    while seen.len() < ids.len() {
        let ev = tokio::time::timeout_at(deadline, events.next()).await?.ok_or_else(|| anyhow::anyhow!("event stream ended"))?;
        if ids.contains(&ev.task_id) && ev.event == event {
            seen.insert(ev.task_id);
        }
    }
    Ok(())
}

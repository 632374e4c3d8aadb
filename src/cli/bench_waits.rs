//! `ferry bench waits`: N tasks in one worker, each waiting in a step for one of M
//! simulated clusters (ConfigMaps on a real API server of the test bed) to become ready.
//! Reports what must not grow with N (watches and API connections), peak memory, CPU
//! while every task waits, and the time from the clusters turning ready to the last task
//! succeeding.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use ferry_kube::{Check, Clusters, HUB, Watches};
use ferry_runtime::testkind::TestTaskSpec;
use ferry_runtime::{Client, EventType, Rejection, Step, StepContext, StepError, StepPolicy, TaskHandler, TaskKind, Topics, Worker, WorkerOptions};
use futures::future::BoxFuture;
use futures::FutureExt;
use k8s_openapi::api::core::v1::ConfigMap;
use serde::Serialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Args)]
pub struct WaitsArgs {
    /// Waiting tasks.
    #[arg(long, default_value_t = 10_000)]
    pub tasks: usize,
    /// Which broker to measure through.
    #[arg(long, value_enum, default_value = "embedded")]
    pub broker: super::bench::BrokerChoice,
    /// Bootstrap of an external broker (with --broker external).
    #[arg(long)]
    pub bootstrap: Option<String>,
    /// Simulated clusters they wait for.
    #[arg(long, default_value_t = 100)]
    pub clusters: usize,
    /// Seconds to measure CPU while every task waits.
    #[arg(long, default_value_t = 10)]
    pub idle_seconds: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

const NS: &str = "bench";

/// One step: wait until ConfigMap `bench/<cluster>` says ready (the cluster is the
/// subject's middle part, `waits/<cluster>/<n>`).
struct WaitStep {
    hub: kube::Client,
    watches: Arc<Watches>,
}

impl Step<TestTaskSpec> for WaitStep {
    fn name(&self) -> &str {
        "wait-for-cluster"
    }

    fn policy(&self) -> StepPolicy {
        StepPolicy { timeout: Duration::from_secs(3600), ..StepPolicy::default() }
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, TestTaskSpec>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let cluster = cx.subject.split('/').nth(1).unwrap_or_default();
            cx.progress(10, format!("waiting for {cluster}"));
            self.watches
                .wait_object::<ConfigMap, ()>(HUB, &self.hub, Some(NS), cluster, Duration::from_secs(3600), |o| {
                    match o.and_then(|c| c.data.as_ref()).and_then(|d| d.get("ready")) {
                        Some(v) if v == "true" => Check::Done(()),
                        _ => Check::Pending("not ready".into()),
                    }
                })
                .await
                .map_err(|e| StepError::permanent("WAIT", e.to_string()))?;
            Ok(json!({}))
        }
        .boxed()
    }

    fn undo<'a>(&'a self, _cx: &'a StepContext<'a, TestTaskSpec>, _output: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async { Ok(()) }.boxed()
    }
}

struct WaitHandler {
    step: Arc<WaitStep>,
}

impl TaskHandler for WaitHandler {
    type Spec = TestTaskSpec;

    fn kind(&self) -> TaskKind {
        TaskKind::TEST
    }

    fn validate(&self, _subject: &str, _spec: &TestTaskSpec) -> Result<(), Rejection> {
        Ok(())
    }

    fn targets(&self, subject: &str, _spec: &TestTaskSpec) -> ferry_runtime::targets::Targets {
        ferry_runtime::targets::Targets::clusters([subject])
    }

    fn plan(&self, _spec: &TestTaskSpec) -> Vec<Arc<dyn Step<TestTaskSpec>>> {
        vec![self.step.clone()]
    }
}

#[derive(Debug, Serialize)]
struct Report {
    broker: String,
    tasks: usize,
    clusters: usize,
    open_watches: usize,
    api_connections: usize,
    rss_mib_while_waiting: f64,
    peak_rss_mib: f64,
    idle_cpu_percent_of_one_core: f64,
    all_waiting_after_s: f64,
    ready_to_all_succeeded_s: f64,
}

pub(crate) fn proc_status_mib(field: &str) -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// utime + stime of this process, in seconds.
fn cpu_seconds() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses and may contain spaces).
    let rest = s.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the line: 11 and 12 after the name.
    (ticks(11) + ticks(12)) / 100.0
}

/// Established TCP connections to `port` on loopback.
fn connections_to(port: u16) -> usize {
    let hex = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .flat_map(|t| t.lines().skip(1).map(str::to_owned).collect::<Vec<_>>())
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[2].ends_with(&hex) && f[3] == "01"
        })
        .count()
}

pub async fn run(a: WaitsArgs) -> anyhow::Result<std::process::ExitCode> {
    anyhow::ensure!(a.clusters > 0 && a.tasks > 0, "--tasks and --clusters must be positive");
    let fleet = ferry_fleet::Fleet::start(ferry_fleet::FleetOptions { controllers: false, ..ferry_fleet::FleetOptions::hub_and(0) }).await?;
    let hub = fleet.hub().client().await?;
    let port: u16 = fleet.hub().server.rsplit(':').next().and_then(|p| p.parse().ok()).context("hub port")?;
    let clusters = Clusters::new(hub.clone());
    clusters.apply(HUB, &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}), "ferry-bench").await?;
    let cm = |i: usize, ready: bool| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("c-{i}"), "namespace": NS}, "data": {"ready": ready.to_string()}});
    for i in 0..a.clusters {
        clusters.apply(HUB, &cm(i, false), "ferry-bench").await?;
    }

    let topics = Topics::standard();
    let (broker, kafka) = super::bench::BenchBroker::start(a.broker, a.bootstrap.as_deref(), &topics, 1).await?;
    let watches = Arc::new(Watches::new());
    let handler = WaitHandler { step: Arc::new(WaitStep { hub: hub.clone(), watches: watches.clone() }) };
    let mut opts = WorkerOptions::new(kafka.clone());
    opts.topics = topics.clone();
    opts.shutdown_grace = Duration::from_secs(2);
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(Worker::new(opts, handler).run(shutdown.clone()));
    let client = Client::new(kafka.clone(), topics.clone())?;
    let mut events = client.events(false).await?;

    let start = Instant::now();
    let spec = TestTaskSpec::steps(1);
    let ids = super::bench::submit_tests(&client, a.tasks, &spec, |i| format!("waits/c-{}/{i}", i % a.clusters)).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1800);
    super::bench::until_each(&mut events, &ids, EventType::StepProgress, deadline).await?;
    let all_waiting = start.elapsed().as_secs_f64();
    let cpu0 = cpu_seconds();
    tokio::time::sleep(Duration::from_secs(a.idle_seconds)).await; // a measurement window, not synchronisation
    let idle_cpu = (cpu_seconds() - cpu0) / a.idle_seconds as f64 * 100.0;
    let open_watches = watches.open_count();
    let api_connections = connections_to(port);
    let rss = proc_status_mib("VmRSS:");

    let flip = Instant::now();
    for i in 0..a.clusters {
        clusters.apply(HUB, &cm(i, true), "ferry-bench").await?;
    }
    let mut done = 0;
    while done < a.tasks {
        let ev = tokio::time::timeout_at(deadline, events.next()).await?.context("event stream ended")?;
        if ids.contains(&ev.task_id) && ev.event.is_final() {
            anyhow::ensure!(ev.event == EventType::Succeeded, "task {} ended {:?}: {:?}", ev.task_id, ev.event, ev.message);
            done += 1;
        }
    }
    let report = Report {
        broker: a.broker.name().to_owned(),
        tasks: a.tasks,
        clusters: a.clusters,
        open_watches,
        api_connections,
        rss_mib_while_waiting: rss,
        peak_rss_mib: proc_status_mib("VmHWM:"),
        idle_cpu_percent_of_one_core: idle_cpu,
        all_waiting_after_s: all_waiting,
        ready_to_all_succeeded_s: flip.elapsed().as_secs_f64(),
    };
    shutdown.cancel();
    worker.await??;
    drop(events);
    drop(client);
    drop(broker);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("broker                    {}", report.broker);
        println!("tasks waiting             {} on {} simulated clusters (all waiting after {:.1} s)", report.tasks, report.clusters, report.all_waiting_after_s);
        println!("open watches              {}", report.open_watches);
        println!("API server connections    {}", report.api_connections);
        println!("RSS while waiting         {:.0} MiB (peak {:.0} MiB, whole process: broker and client included)", report.rss_mib_while_waiting, report.peak_rss_mib);
        println!("CPU while waiting         {:.1} % of one core", report.idle_cpu_percent_of_one_core);
        println!("ready -> all succeeded    {:.1} s", report.ready_to_all_succeeded_s);
    }
    Ok(std::process::ExitCode::SUCCESS)
}

//! `ferry bench tracker`: what `ferry tasks list` costs over a large task-state topic.
//! Fills `ferry.task-state.test` with N snapshots (as N finished tasks leave it), then times
//! reading it to the end and filtering it the way `tasks list --state` does; then starts
//! the dashboard's router in-process on the same topics, times its live view's first
//! catch-up, and loads its `/api/tasks` with concurrent requests over HTTP (requests/s,
//! p50 and p99 latency).

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use ferry_runtime::protocol::{Bytes, EventType, JournalEntry, StepStatus, TaskSnapshot, TaskState};
use ferry_runtime::testkind::TestTaskSpec;
use ferry_runtime::wire::Registry;
use ferry_runtime::{Client, TaskId, TaskKind, Topics};
use futures::StreamExt;
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
    /// Requests to the dashboard's `/api/tasks` in flight at once.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Requests to the dashboard's `/api/tasks` in all.
    #[arg(long, default_value_t = 400)]
    pub requests: usize,
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
    /// The dashboard's live view: its first catch-up with the topics.
    live_catch_up_s: f64,
    api_tasks: ApiLoad,
}

/// `/api/tasks` under concurrent requests.
#[derive(Debug, Serialize)]
struct ApiLoad {
    concurrency: usize,
    requests: usize,
    requests_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    response_bytes: usize,
}

/// The `q` quantile of sorted `v`, in milliseconds.
fn quantile_ms(v: &[Duration], q: f64) -> f64 {
    let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
    v[i].as_secs_f64() * 1000.0
}

/// Starts the dashboard's router on a loopback port over `client` (its live view already
/// caught up) and sends `requests` GETs of `/api/tasks`, `concurrency` at a time.
async fn load_api_tasks(client: Client, concurrency: usize, requests: usize) -> anyhow::Result<ApiLoad> {
    anyhow::ensure!(concurrency > 0 && requests > 0, "--concurrency and --requests must be at least 1");
    let access = Arc::new(super::dashboard_access::Access::new(Vec::new(), None));
    let app = super::dashboard::router(client, access).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/api/tasks", listener.local_addr()?);
    let stop = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(axum::serve(listener, app).with_graceful_shutdown(stop.clone().cancelled_owned()).into_future());
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http::<axum::body::Body>();
    let get = |http: hyper_util::client::legacy::Client<_, axum::body::Body>, url: String| async move {
        let t0 = Instant::now();
        let req = axum::http::Request::get(&url).body(axum::body::Body::empty())?;
        let resp = http.request(req).await?;
        let status = resp.status();
        let body = axum::body::to_bytes(axum::body::Body::new(resp.into_body()), usize::MAX).await?;
        anyhow::ensure!(status.is_success(), "GET {url}: {status}: {}", String::from_utf8_lossy(&body));
        anyhow::Ok((t0.elapsed(), body.len()))
    };
    // One request first: connections made and the handler warm.
    let (_, response_bytes) = get(http.clone(), url.clone()).await?;
    let started = Instant::now();
    let results: Vec<anyhow::Result<(Duration, usize)>> =
        futures::stream::iter(0..requests).map(|_| get(http.clone(), url.clone())).buffer_unordered(concurrency).collect().await;
    let took = started.elapsed();
    stop.cancel();
    server.await??;
    let mut latencies = results.into_iter().map(|r| r.map(|(d, _)| d)).collect::<anyhow::Result<Vec<_>>>()?;
    latencies.sort();
    Ok(ApiLoad {
        concurrency,
        requests,
        requests_per_s: requests as f64 / took.as_secs_f64(),
        p50_ms: quantile_ms(&latencies, 0.50),
        p99_ms: quantile_ms(&latencies, 0.99),
        response_bytes,
    })
}

fn snapshot(r: &Registry, i: usize) -> TaskSnapshot {
    let failed = i.is_multiple_of(10);
    TaskSnapshot {
        task_id: TaskId::new().to_string(),
        kind: TaskKind::TEST,
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
        signals: Vec::new(),
    }
}

pub async fn run(a: TrackerArgs) -> anyhow::Result<std::process::ExitCode> {
    let topics = Topics::standard();
    let (broker, kafka) = super::bench::BenchBroker::start(a.broker, a.bootstrap.as_deref(), &topics, 1).await?;
    let registry = Registry::embedded();
    let producer: FutureProducer = kafka.producer().set("linger.ms", "20").create()?;
    let topic = topics.task_state(TaskKind::TEST).name.clone();
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
    let client = Client::new(kafka.clone(), topics.clone())?;
    let read = Instant::now();
    let all = client.snapshots().await?;
    let failed = all.iter().filter(|s| s.state == TaskState::Failed).count();
    let read_all_s = read.elapsed().as_secs_f64();
    anyhow::ensure!(all.len() == a.tasks, "read {} of {} tasks", all.len(), a.tasks);
    drop(all);

    // The dashboard on the same topics: its live view reads them once, then answers.
    let dashboard = Client::new(kafka, topics)?;
    let catch_up = Instant::now();
    let live = dashboard.live_view().await?;
    live.follower().ready(Duration::from_secs(600)).await?;
    let live_catch_up_s = catch_up.elapsed().as_secs_f64();
    anyhow::ensure!(live.follower().len() == a.tasks, "the live view holds {} of {} tasks", live.follower().len(), a.tasks);
    drop(live);
    let api_tasks = load_api_tasks(dashboard, a.concurrency, a.requests).await?;
    let report = Report {
        broker: a.broker.name().to_owned(),
        tasks: a.tasks,
        snapshot_bytes: bytes,
        fill_s,
        read_all_s,
        tasks_per_s: a.tasks as f64 / read_all_s,
        failed_found: failed,
        live_catch_up_s,
        api_tasks,
    };
    drop(client);
    drop(broker);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("broker                    {}", report.broker);
        println!("tasks in ferry.task-state.test {} ({} bytes per snapshot; filled in {:.1} s)", report.tasks, report.snapshot_bytes, report.fill_s);
        println!("read all + filter         {:.2} s ({:.0} tasks/s; {} failed found)", report.read_all_s, report.tasks_per_s, report.failed_found);
        println!("dashboard live view       caught up in {:.2} s", report.live_catch_up_s);
        let l = &report.api_tasks;
        println!(
            "dashboard /api/tasks      {:.0} requests/s at concurrency {} ({} requests; p50 {:.1} ms, p99 {:.1} ms; {} bytes per response)",
            l.requests_per_s, l.concurrency, l.requests, l.p50_ms, l.p99_ms, l.response_bytes
        );
    }
    Ok(std::process::ExitCode::SUCCESS)
}

//! `ferry bench wave`: one plan step fanned out in waves over N simulated clusters
//! (ManagedClusters on a real API server of the test bed, a `test` child each), then the
//! plan reverted. Reports the time of both, the plan's time per wave against a batch of the
//! same children submitted directly in the same run, peak memory, the records written and
//! the requests the plan worker made to the hub.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use ferry_runtime::testkind::{TestHandler, TestTaskSpec};
use ferry_runtime::{Client, EventType, SubmitOptions, TaskKind, Topics, Worker, WorkerOptions};
use serde::Serialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Args)]
pub struct WaveArgs {
    /// Simulated clusters the step fans out over.
    #[arg(long, default_value_t = 200)]
    pub clusters: usize,
    /// Clusters per wave.
    #[arg(long, default_value_t = 20)]
    pub size: usize,
    /// Children of a wave running at once (0: the whole wave).
    #[arg(long, default_value_t = 0)]
    pub max_in_flight: usize,
    /// Which broker to measure through.
    #[arg(long, value_enum, default_value = "embedded")]
    pub broker: super::bench::BrokerChoice,
    /// Bootstrap of an external broker (with --broker external).
    #[arg(long)]
    pub bootstrap: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// The label every simulated cluster carries; the plan chooses its clusters by it.
const LABEL: (&str, &str) = ("ferry.bench/wave", "yes");
/// OCM's API group on the hub: the requests counted are the plan worker's reads of it.
const OCM_GROUP: &str = "cluster.open-cluster-management.io";

#[derive(Debug, Serialize)]
struct Report {
    broker: String,
    clusters: usize,
    waves: usize,
    wave_size: usize,
    max_in_flight: usize,
    rollout_s: f64,
    revert_s: f64,
    per_wave_s: f64,
    direct_batch_s: f64,
    per_wave_over_direct_batch: f64,
    peak_rss_mib: f64,
    records: i64,
    records_per_cluster: f64,
    hub_requests: u64,
    plan_snapshot_bytes: usize,
}

pub async fn run(a: WaveArgs) -> anyhow::Result<std::process::ExitCode> {
    anyhow::ensure!(a.clusters > 0 && a.size > 0, "--clusters and --size must be positive");
    anyhow::ensure!(a.clusters <= ferry_plan::steps::select::MAX_CLUSTERS, "--clusters: a fanned-out step has at most {} clusters", ferry_plan::steps::select::MAX_CLUSTERS);
    let fleet = ferry_fleet::Fleet::start(ferry_fleet::FleetOptions { controllers: false, crds: true, ..ferry_fleet::FleetOptions::hub_and(0) }).await?;
    let source = fleet.install_crds().await?;
    let hub = fleet.hub().client().await?;
    let clusters: kube::Api<ferry_kube::kinds::ManagedCluster> = kube::Api::all(hub.clone());
    let pp = kube::api::PatchParams::apply("ferry-bench").force();
    for i in 0..a.clusters {
        let name = format!("sim-{i:04}");
        let mc = json!({"apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster",
            "metadata": {"name": name, "labels": {LABEL.0: LABEL.1}}, "spec": {"hubAcceptsClient": true}});
        clusters.patch(&name, &pp, &kube::api::Patch::Apply(mc)).await.with_context(|| format!("creating ManagedCluster {name}"))?;
    }

    let topics = Topics::standard();
    let (broker, kafka) = super::bench::BenchBroker::start(a.broker, a.bootstrap.as_deref(), &topics, 1).await?;
    let mut opts = WorkerOptions::new(kafka.clone());
    opts.topics = topics.clone();
    opts.shutdown_grace = Duration::from_secs(2);
    let shutdown = CancellationToken::new();
    let children = tokio::spawn(Worker::new(opts.clone(), TestHandler { min_delay: Some(Duration::from_millis(10)), effects: None }).run(shutdown.clone()));
    let client = Client::new(kafka.clone(), topics.clone())?;
    let mut opts = opts;
    let plan_handler = super::workers::plan_handler(Client::new(kafka.clone(), topics.clone())?, Duration::from_secs(600), Some(hub.clone()), &mut opts).await?;
    let plans = tokio::spawn(Worker::new(opts, plan_handler).run(shutdown.clone()));
    let mut events = client.events(false).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1800);

    // The same run's baseline: one wave's worth of children submitted directly (after a
    // warm-up batch: group joins and first fetches are not what is measured).
    let spec = TestTaskSpec::steps(1);
    let warm = super::bench::submit_tests(&client, a.size, &spec, |i| format!("warm-{i}")).await?;
    super::bench::until_each(&mut events, &warm, EventType::Succeeded, deadline).await?;
    let t = Instant::now();
    let direct = super::bench::submit_tests(&client, a.size, &spec, |i| format!("direct-{i}")).await?;
    super::bench::until_each(&mut events, &direct, EventType::Succeeded, deadline).await?;
    let direct_batch_s = t.elapsed().as_secs_f64();

    let requests_before = ocm_requests(&hub).await?;
    let plan: ferry_plan::spec::PlanSpec = serde_json::from_value(json!({"steps": [{
        "name": "roll", "kind": "test", "subject": "${cluster}/bench",
        "spec": serde_json::to_value(&spec)?,
        "for_each": {"labels": {LABEL.0: LABEL.1}, "waves": {"size": a.size, "max_in_flight": a.max_in_flight}},
    }]}))?;
    let t = Instant::now();
    let id = client.submit(TaskKind::PLAN, "bench-wave", &plan, SubmitOptions::default()).await?;
    let succeeded = until_plan(&mut events, &id.to_string(), EventType::Succeeded, a.clusters, deadline).await?;
    let rollout_s = t.elapsed().as_secs_f64();
    anyhow::ensure!(succeeded == a.clusters, "{succeeded} children succeeded, {} expected", a.clusters);
    let plan_snapshot_bytes = client.snapshot(id).await?.map(|s| serde_json::to_vec(&s).map(|v| v.len())).transpose()?.unwrap_or(0);

    let t = Instant::now();
    client.revert(id).await?;
    let reverted = until_plan(&mut events, &id.to_string(), EventType::Reverted, a.clusters, deadline).await?;
    let revert_s = t.elapsed().as_secs_f64();
    anyhow::ensure!(reverted == a.clusters, "{reverted} children reverted, {} expected", a.clusters);
    let hub_requests = ocm_requests(&hub).await?.saturating_sub(requests_before);

    shutdown.cancel();
    plans.await??;
    children.await??;
    let written = [TaskKind::PLAN, TaskKind::TEST].iter().flat_map(|k| [topics.command(*k).name.clone(), topics.task_state(*k).name.clone()]).chain([topics.progress().name.clone()]).collect::<Vec<_>>();
    // The warm-up and direct batches are on the same topics: theirs are subtracted at the
    // rate the direct batch wrote (its tasks are the same as the children).
    let records = super::bench::records_on(&kafka, &written)?;
    drop(events);
    drop(client);
    drop(broker);
    let waves = a.clusters.div_ceil(a.size);
    let per_wave_s = rollout_s / waves as f64;
    let report = Report {
        broker: a.broker.name().to_owned(),
        clusters: a.clusters,
        waves,
        wave_size: a.size,
        max_in_flight: a.max_in_flight,
        rollout_s,
        revert_s,
        per_wave_s,
        direct_batch_s,
        per_wave_over_direct_batch: per_wave_s / direct_batch_s,
        peak_rss_mib: super::bench_waits::proc_status_mib("VmHWM:"),
        records,
        records_per_cluster: records as f64 / (a.clusters + 2 * a.size) as f64,
        hub_requests,
        plan_snapshot_bytes,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("broker                    {} (CRDs: {source})", report.broker);
        println!("clusters                  {} simulated, {} waves of {} ({} at once)", report.clusters, report.waves, report.wave_size, if a.max_in_flight == 0 { a.size } else { a.max_in_flight });
        println!("rollout                   {:.1} s ({:.2} s per wave)", report.rollout_s, report.per_wave_s);
        println!("one batch, direct         {:.2} s ({} test tasks submitted at once, same run)", report.direct_batch_s, a.size);
        println!("per wave / direct batch   {:.2}", report.per_wave_over_direct_batch);
        println!("revert of the plan        {:.1} s", report.revert_s);
        println!("peak RSS                  {:.0} MiB (whole process: broker, workers, client)", report.peak_rss_mib);
        println!("records                   {} ({:.1} per task, warm-up and direct batches included)", report.records, report.records_per_cluster);
        println!("hub requests              {} (to {OCM_GROUP}, rollout and revert)", report.hub_requests);
        println!("plan snapshot             {} bytes", report.plan_snapshot_bytes);
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// Follows the plan `id` to its end, counting its children that reached `end` too
/// (children are the `test` tasks whose subject ends `/bench`); fails unless the plan
/// ends `end`. A child's event may be read after the plan's final one: the plan learns of
/// its children's ends from their snapshots, and their events are other partitions'
/// records, written by another worker's producer (no order across them). So once the plan
/// ended, the events go on being read until `expected` children are counted, for at most
/// [`LATE_CHILD_EVENTS`].
async fn until_plan(events: &mut ferry_runtime::EventStream, id: &str, end: EventType, expected: usize, deadline: tokio::time::Instant) -> anyhow::Result<usize> {
    let mut children = HashSet::new();
    let mut ended = false;
    let mut deadline = deadline;
    while !ended || children.len() < expected {
        let ev = match tokio::time::timeout_at(deadline, events.next()).await {
            Ok(ev) => ev.context("event stream ended")?,
            Err(_) if ended => break,
            Err(_) => anyhow::bail!("the plan did not end in time"),
        };
        if ev.kind == TaskKind::TEST && ev.subject.ends_with("/bench") && ev.event == end {
            children.insert(ev.task_id.clone());
        }
        if ev.task_id == id && ev.event.is_final() && !ended {
            anyhow::ensure!(ev.event == end, "the plan ended {:?}: {}", ev.event, ev.message.unwrap_or_default());
            ended = true;
            deadline = deadline.min(tokio::time::Instant::now() + LATE_CHILD_EVENTS);
        }
    }
    Ok(children.len())
}

/// How long the children's events are waited for once their plan ended.
const LATE_CHILD_EVENTS: Duration = Duration::from_secs(60);

/// Requests the hub's API server has served for OCM's API group so far (its
/// `apiserver_request_total` counter, every verb and code).
async fn ocm_requests(hub: &kube::Client) -> anyhow::Result<u64> {
    let req = axum::http::Request::get("/metrics").body(Vec::new())?;
    let text = hub.request_text(req).await.context("reading the hub's /metrics")?;
    let group = format!("group=\"{OCM_GROUP}\"");
    Ok(text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{") && l.contains(&group))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64)
}

//! A worker process for one task kind: `WorkerOptions -> Worker::run(shutdown)`.
//!
//! # Guarantees
//! - At-least-once, in order: a command's offset is stored only after its Accepted (or
//!   Rejected, or dead-letter) record is acknowledged by the broker (acks=all, idempotent).
//! - Tasks run concurrently, one at a time per subject; the consumer never waits on a step.
//! - On assignment the worker catches up with the task-state topic and resumes unsettled
//!   tasks of its partitions from their first unfinished step; on revoke and shutdown it
//!   stops them at a safe point within the grace period.
//! - A task snapshot in a record version newer than this program knows (a newer Ferry's
//!   worker wrote it, in a rolling upgrade across a protocol version) stops the worker
//!   ([`WorkerError::Outdated`]): its run of that task at once, without a write, and no
//!   run starts after it. It never resumes a task from an older snapshot than the newest.
//!   So does one in a view of other kinds' tasks its handler reads
//!   ([`WorkerOptions::reads`]: the plan worker's children), which it cannot know either.
//!
//! # Limits
//! A step may run twice (after a crash between its effect and its journal entry), so steps
//! must be idempotent.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdkafka::producer::FutureProducer;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::intake::{Intake, IntakeError};
use crate::kafka::KafkaConfig;
use crate::metrics::Metrics;
use crate::publisher::Publisher;
use crate::runner::Env;
use crate::scheduler::{SchedMsg, Scheduler};
use crate::state_view::{StateView, ViewError};
use crate::step::TaskHandler;
use crate::topics::Topics;
use crate::wire::Registry;

/// How a worker runs.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// Brokers and security.
    pub kafka: KafkaConfig,
    /// Topic names.
    pub topics: Topics,
    /// Instance name in events (defaults to host and pid).
    pub worker_id: String,
    /// Consumer group (defaults to `ferry-<kind>`).
    pub group_id: Option<String>,
    /// Time running steps get to reach a safe point when partitions move.
    pub revoke_grace: Duration,
    /// Time running steps get to finish on shutdown.
    pub shutdown_grace: Duration,
    /// How long a task another worker wrote while this one ran it waits before this
    /// worker takes it up again from the newest snapshot (if it still owns the partition):
    /// longer than the group's session timeout, so that whichever of the two had lost its
    /// partition without knowing has learnt it by then.
    pub overtaken_pause: Duration,
    /// Where to serve `/healthz`, `/readyz`, `/metrics`.
    pub http: Option<SocketAddr>,
    /// A Confluent-compatible schema registry (`http://...`); the embedded one if None.
    pub schema_registry: Option<String>,
    /// How long the start waits for Kafka to answer before failing.
    pub preflight_limit: Duration,
    /// The tenants and what each may target: with one, the worker forwards its tenants'
    /// command topics to its own (the gateway) and enforces the policy on their commands.
    pub policy: Option<Arc<crate::tenants::Policy>>,
    /// Live views of other kinds' task states that the handler reads (the plan worker's
    /// of its children): a task there that a newer Ferry wrote last stops the worker as
    /// one on its own topic does ([`WorkerError::Outdated`]), since the handler cannot
    /// know that task's state.
    pub reads: Vec<crate::live::LiveState>,
}

impl WorkerOptions {
    /// Defaults for `kafka` with the standard topics.
    pub fn new(kafka: KafkaConfig) -> Self {
        Self {
            kafka,
            topics: Topics::standard(),
            worker_id: default_worker_id(),
            group_id: None,
            revoke_grace: Duration::from_secs(5),
            overtaken_pause: Duration::from_secs(15),
            shutdown_grace: Duration::from_secs(20),
            http: None,
            schema_registry: None,
            preflight_limit: Duration::from_secs(60),
            policy: None,
            reads: Vec::new(),
        }
    }
}

/// `host-pid-random`, unique per process.
pub fn default_worker_id() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "local".into());
    format!("{host}-{}-{:04x}", std::process::id(), rand::random::<u16>())
}

/// Why a worker stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// Kafka cannot be used (credentials, reachability, topics).
    #[error(transparent)]
    Preflight(#[from] crate::preflight::PreflightError),
    /// The producer could not be created.
    #[error("creating the producer: {0}")]
    Producer(#[source] rdkafka::error::KafkaError),
    /// The task-state view failed.
    #[error(transparent)]
    View(#[from] ViewError),
    /// The command intake failed.
    #[error(transparent)]
    Intake(#[from] IntakeError),
    /// The tenants' gateway could not start.
    #[error(transparent)]
    Gateway(#[from] crate::gateway::GatewayError),
    /// The schema registry could not be used.
    #[error(transparent)]
    SchemaRegistry(#[from] crate::schema_registry::RegistryError),
    /// A newer Ferry's worker writes this kind's task state (or that of tasks the handler
    /// reads: [`WorkerOptions::reads`]): this one stopped, so that it never runs a task
    /// from an older snapshot than the newest (a rolling upgrade across a protocol version
    /// ends with the old workers stopped, their partitions with the new).
    #[error("worker stopped: {0}")]
    Outdated(crate::state_view::Outdated),
    /// The probe server could not bind.
    #[error("serving probes on {addr}: {source}")]
    Http {
        /// The address.
        addr: SocketAddr,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// A running worker's handles, for tests and `ferry dev`.
#[derive(Debug, Clone)]
pub struct WorkerHandle {
    /// Set once the first partition assignment has been processed.
    pub ready: Arc<AtomicBool>,
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// The address the probes are served on.
    pub http: Option<SocketAddr>,
    /// The worker's view of its kind's task states (what it resumes and routes controls
    /// from): `caught_up` tells when it has read what is on the topic now.
    pub view: Arc<StateView>,
}

/// One worker of one kind.
pub struct Worker<H: TaskHandler> {
    opts: WorkerOptions,
    handler: Arc<H>,
}

impl<H: TaskHandler> std::fmt::Debug for Worker<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker").field("opts", &self.opts).finish()
    }
}

impl<H: TaskHandler> Worker<H> {
    /// A worker running `handler` with `opts`.
    pub fn new(opts: WorkerOptions, handler: H) -> Self {
        Self { opts, handler: Arc::new(handler) }
    }

    /// Runs until `shutdown` fires, then stops taking commands, brings running steps to a
    /// safe point within the grace period and flushes the producer. It stops so of itself,
    /// with [`WorkerError::Outdated`], once it reads a task snapshot in a record version
    /// newer than it knows.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), WorkerError> {
        self.run_with(shutdown, |_| {}).await
    }

    /// [`Self::run`], calling `started` with the worker's handles once it is running.
    pub async fn run_with(self, shutdown: CancellationToken, started: impl FnOnce(WorkerHandle)) -> Result<(), WorkerError> {
        let Self { opts, handler } = self;
        let kind = handler.kind();
        // Falls at `shutdown`, or when the worker stops of itself (a newer Ferry writes here).
        let stopping = shutdown.child_token();
        let registry = Arc::new(match &opts.schema_registry {
            Some(url) => crate::schema_registry::confluent(url).await?,
            None => Registry::embedded(),
        });
        // The tenants' topics of this kind (tenant topic, tenant), for the gateway.
        let tenant_topics: Vec<(String, String)> = opts
            .policy
            .iter()
            .flat_map(|p| p.tenants_of(kind).into_iter().map(|t| (opts.topics.tenant_command(t, kind).name, t.to_owned())))
            .collect();
        let needed: Vec<String> = [opts.topics.command(kind).name.clone(), opts.topics.progress().name.clone(), opts.topics.task_state(kind).name.clone(), opts.topics.dead_letter().name.clone()]
            .into_iter()
            .chain(tenant_topics.iter().map(|(t, _)| t.clone()))
            // Every tenant's progress topic: its tasks' events and its refusals go there too.
            .chain(opts.policy.iter().flat_map(|p| p.tenants().map(|t| opts.topics.tenant_progress(t).name).collect::<Vec<_>>()))
            .collect();
        crate::preflight::check(&opts.kafka, &needed, opts.preflight_limit).await?;
        let metrics = Arc::new(Metrics::new());
        let gauges_of = handler.clone();
        metrics.report_gauges(Box::new(move || gauges_of.gauges()));
        let ready = Arc::new(AtomicBool::new(false));
        let (view, view_thread) =
            StateView::start(&opts.kafka, &opts.topics.task_state(kind).name, Some(kind), registry.clone())?;
        let producer: FutureProducer = opts.kafka.producer().create().map_err(WorkerError::Producer)?;
        let publisher = Arc::new(Publisher::new(
            producer,
            opts.topics.clone(),
            registry.clone(),
            opts.worker_id.clone(),
            view.clone(),
            metrics.clone(),
        ));
        let env = Arc::new(Env { handler: handler.clone(), publisher: publisher.clone(), metrics: metrics.clone(), registry: registry.clone(), policy: opts.policy.clone() });
        let (sched_tx, sched_rx) = mpsc::channel(64);
        let fences = Arc::new(crate::fences::Fences::default());
        let holds = Arc::new(crate::holds::CommitHolds::default());
        let scheduler = tokio::spawn(Scheduler::new(env, view.clone(), opts.revoke_grace, opts.overtaken_pause, fences.clone(), holds.clone()).run(sched_rx));

        let http = match opts.http {
            Some(addr) => Some(
                crate::http::serve(addr, ready.clone(), metrics.clone(), stopping.clone())
                    .await
                    .map_err(|source| WorkerError::Http { addr, source })?,
            ),
            None => None,
        };
        let topic = opts.topics.command(kind).name.clone();
        let group = opts.group_id.clone().unwrap_or_else(|| format!("ferry-{kind}"));
        let stop = Arc::new(AtomicBool::new(false));
        // If this future is dropped (a test's panic, an aborted task), the threads stop too.
        let _stop_guard = StopOnDrop { flag: stop.clone(), view: view.clone() };
        let intake = Intake::new(&opts.kafka, &group, &topic, handler, registry, sched_tx.clone(), stop.clone(), ready.clone(), (fences, holds), publisher.clone(), opts.revoke_grace)?
            .with_policy(opts.policy.clone());
        let gateway_thread = if tenant_topics.is_empty() {
            None
        } else {
            let gateway = crate::gateway::Gateway::new(&opts.kafka, &format!("ferry-gateway-{kind}"), tenant_topics, &topic, stop.clone())?;
            Some(std::thread::Builder::new().name(format!("ferry-gateway-{kind}")).spawn(move || gateway.run()).expect("spawn gateway thread"))
        };
        // The thread reports its end on a channel instead of being joined: closing a
        // consumer blocks while no broker answers, and shutdown must stay bounded.
        let (intake_tx, intake_done) = oneshot::channel();
        std::thread::Builder::new()
            .name(format!("ferry-intake-{kind}"))
            .spawn(move || {
                let _ = intake_tx.send(intake.run());
            })
            .expect("spawn intake thread");
        tracing::info!(%kind, %topic, %group, worker = %opts.worker_id, "worker started");
        started(WorkerHandle { ready: ready.clone(), metrics: metrics.clone(), http, view: view.clone() });

        let lag_metrics = metrics.clone();
        let lag_kafka = opts.kafka.clone();
        let lag_group = group.clone();
        let lag_topic = topic.clone();
        let lag_stop = stopping.clone();
        let lag = tokio::spawn(async move { crate::lag::report(lag_kafka, lag_group, lag_topic, lag_metrics, lag_stop).await });

        let mut intake_done = intake_done;
        // A newer Ferry's snapshot in a view the handler reads (its children's).
        let reads = opts.reads.clone();
        let read_newer = async move {
            if reads.is_empty() {
                return std::future::pending().await;
            }
            futures::future::select_all(reads.iter().map(|r| Box::pin(r.newer_read()))).await.0
        };
        let mut newer_read = None;
        let intake_result = tokio::select! {
            () = shutdown.cancelled() => None,
            () = view.outdated_read() => None,
            newer = read_newer => {
                tracing::error!("{newer}");
                newer_read = Some(newer);
                None
            }
            r = &mut intake_done => Some(r),
        };
        stopping.cancel();
        stop.store(true, Ordering::Relaxed);
        let intake_result = match intake_result {
            Some(r) => r.ok(),
            None => match tokio::time::timeout(opts.shutdown_grace + Duration::from_secs(15), intake_done).await {
                Ok(r) => r.ok(),
                Err(_) => {
                    tracing::error!("the command consumer did not close in time (brokers unreachable?); leaving it");
                    None
                }
            },
        };
        // The intake's revoke callback already stopped the tasks of its partitions; stop
        // anything left with the full shutdown grace.
        let (reply, rx) = oneshot::channel();
        if sched_tx.send(SchedMsg::Shutdown { reply }).await.is_ok() {
            let _ = tokio::time::timeout(opts.shutdown_grace + Duration::from_secs(5), rx).await;
        }
        drop(sched_tx);
        let _ = scheduler.await;
        publisher.flush(Duration::from_secs(10));
        // Every client of this worker is closed when `run` returns: whoever stops the
        // broker next (`ferry dev`, a test) sees no reconnect storm from a reader left
        // behind. The lag reporter ends at the shutdown token (its calls are bounded by
        // 5 s); the state view's reader at its next poll (100 ms).
        // The gateway commits what it forwarded and closes once it sees `stop`. Each wait is
        // bounded: a thread that cannot close (no broker answers) is left, as the intake's.
        view.stop();
        let _ = tokio::time::timeout(Duration::from_secs(15), lag).await;
        let _ = tokio::time::timeout(Duration::from_secs(5), tokio::task::spawn_blocking(move || view_thread.join())).await;
        if let Some(gateway) = gateway_thread {
            let _ = tokio::time::timeout(opts.shutdown_grace + Duration::from_secs(15), tokio::task::spawn_blocking(move || gateway.join())).await;
        }
        tracing::info!(%kind, "worker stopped");
        if let Some(newer) = view.outdated().or(newer_read) {
            return Err(WorkerError::Outdated(newer));
        }
        match intake_result {
            Some(Err(e)) => Err(e.into()),
            _ => Ok(()),
        }
    }
}

/// Stops the intake and state-view threads when the worker's future goes away.
struct StopOnDrop {
    flag: Arc<AtomicBool>,
    view: Arc<StateView>,
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.flag.store(true, Ordering::Relaxed);
        self.view.stop();
    }
}

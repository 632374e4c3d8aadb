//! `ferry worker <kind>`: builds the handler of one task kind from flags and environment
//! and runs it until SIGINT/SIGTERM. Workers that touch Kubernetes reach the hub through
//! `--kubeconfig` (or KUBECONFIG, or the in-cluster config) and the managed clusters
//! through their kubeconfig Secrets on the hub.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use ferry_kube::Clusters;
use ferry_runtime::{TaskHandler, TaskKind, Worker, WorkerOptions};
use tokio_util::sync::CancellationToken;

use super::common;

#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// The task kind this worker serves.
    #[arg(value_parser = common::kind_parser())]
    pub kind: TaskKind,
    /// Serve /healthz, /readyz and /metrics here.
    #[arg(long, env = "FERRY_HTTP", default_value = "127.0.0.1:0")]
    pub http: SocketAddr,
    /// Consumer group (default ferry-<kind>).
    #[arg(long)]
    pub group: Option<String>,
    /// The hub's kubeconfig (default: KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long, env = "FERRY_HUB_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// score: do not submit scorings when ManagedClusters join.
    #[arg(long)]
    pub no_onboarding: bool,
    /// create-cluster: the add-on catalog (YAML; default the built-in one, `emulated` for
    /// the emulated fleet's).
    #[arg(long, env = "FERRY_ADDONS")]
    pub addons: Option<String>,
    /// create-cluster: the hub's API address as new clusters' klusterlets reach it
    /// (`clusteradm join --hub-apiserver`; default: the hub's kube-public/cluster-info).
    #[arg(long, env = "FERRY_HUB_APISERVER")]
    pub hub_apiserver: Option<String>,
    /// offload: the latency matrix bursts rank peers by (YAML `from: {to: milliseconds}`).
    #[arg(long, env = "FERRY_LATENCY")]
    pub latency: Option<PathBuf>,
    /// offload: how long an offloading may report a failed twin namespace (Liqo's
    /// CreationLoopBackOff, which its retries may mend) before the offload fails; 0s fails
    /// at once, as liqoctl does.
    #[arg(long, env = "FERRY_OFFLOAD_FAILURE_GRACE", value_parser = common::parse_duration, default_value = "60s")]
    pub failure_grace: std::time::Duration,
    /// The tenants and what each may target (YAML; see examples/tenants.yaml): the worker
    /// takes its tenants' commands from their own topics and refuses what the policy does
    /// not allow.
    #[arg(long, env = "FERRY_POLICY")]
    pub policy: Option<PathBuf>,
    /// test: append each step run's start and end to this file (`task step worker
    /// start|end microseconds`), an effect outside Kafka that shows a double run.
    #[arg(long)]
    pub effects: Option<PathBuf>,
    /// plan: how long a child task may take to end, or to be reverted, e.g. 30m, 2h.
    #[arg(long, value_parser = common::parse_duration, default_value = "1h")]
    pub child_timeout: std::time::Duration,
}

/// The add-on catalog named by `--addons`.
pub fn catalog(arg: Option<&str>) -> anyhow::Result<ferry_cluster::Catalog> {
    Ok(match arg {
        None => ferry_cluster::Catalog::builtin(),
        Some("emulated") => ferry_cluster::Catalog::emulated(),
        Some(path) => ferry_cluster::Catalog::load(Path::new(path))?,
    })
}

/// The hub and managed clusters, from a kubeconfig file or the usual inference.
pub async fn hub(kubeconfig: Option<&Path>) -> anyhow::Result<Arc<Clusters>> {
    ferry_kube::init_crypto();
    let client = match kubeconfig {
        Some(p) => ferry_kube::clusters::client_from_file(p).await.map_err(|e| anyhow::anyhow!("hub kubeconfig {}: {e}", p.display()))?,
        None => kube::Client::try_default().await.context("no hub kubeconfig: pass --kubeconfig, set KUBECONFIG, or run in a cluster")?,
    };
    Ok(Arc::new(Clusters::new(client)))
}

/// Runs `handler` until `shutdown`, printing where the probes are.
pub async fn serve<H: TaskHandler>(opts: WorkerOptions, handler: H, shutdown: CancellationToken) -> anyhow::Result<()> {
    Worker::new(opts, handler)
        .run_with(shutdown, |h| {
            if let Some(addr) = h.http {
                // A log line, so that `--log-format json` keeps stderr all JSON.
                tracing::info!(%addr, "probes: http://{addr}/healthz /readyz /metrics");
            }
        })
        .await?;
    Ok(())
}

/// The plan handler: children submitted with `client` (the operator's), their specs
/// encoded as `ferry submit` encodes them; fanned-out steps choose their clusters on `hub`.
/// The view its children are read in goes into `opts.reads` (a child a newer Ferry wrote
/// stops the worker).
pub async fn plan_handler(client: ferry_runtime::Client, child_timeout: std::time::Duration, hub: Option<kube::Client>, opts: &mut WorkerOptions) -> anyhow::Result<ferry_plan::PlanHandler> {
    let children = ferry_runtime::child_tasks::KafkaChildren::new(client, Arc::new(ferry_runtime::child_tasks::encode_registered)).await?;
    opts.reads.push(children.view());
    let mut cfg = ferry_plan::PlanConfig::new(Arc::new(children));
    cfg.child_timeout = child_timeout;
    cfg.hub = hub;
    Ok(ferry_plan::PlanHandler::new(cfg))
}

/// The score worker and, given a client to submit with, its onboarding watcher.
pub async fn score(opts: WorkerOptions, clusters: Arc<Clusters>, onboarding: Option<ferry_runtime::Client>, shutdown: CancellationToken) -> anyhow::Result<()> {
    let cfg = ferry_score::ScoreConfig::new(clusters.clone(), opts.kafka.clone(), opts.topics.clone());
    let handler = ferry_score::ScoreHandler::new(cfg)?;
    let watcher = if let Some(client) = onboarding {
        let client = Arc::new(client);
        let template = ferry_score::spec::ScoreClusters::default();
        Some(tokio::spawn(ferry_score::onboarding::run(clusters.hub().clone(), client, template, shutdown.clone())))
    } else {
        None
    };
    serve(opts, handler, shutdown).await?;
    if let Some(w) = watcher {
        w.await??;
    }
    Ok(())
}

pub async fn run(conn: &common::Conn, a: WorkerArgs) -> anyhow::Result<ExitCode> {
    let mut opts = WorkerOptions::new(conn.kafka()?);
    opts.topics = conn.topics();
    opts.http = Some(a.http);
    opts.group_id = a.group;
    opts.schema_registry = conn.schema_registry.clone();
    opts.policy = match &a.policy {
        Some(p) => Some(Arc::new(ferry_runtime::tenants::Policy::load(p)?)),
        None => None,
    };
    let shutdown = CancellationToken::new();
    common::cancel_on_signal(shutdown.clone());
    match a.kind {
        TaskKind::TEST => {
            let effects = a.effects.map(|p| ferry_runtime::effects::EffectLog::new(p, opts.worker_id.clone()));
            serve(opts, ferry_runtime::testkind::TestHandler { effects, ..Default::default() }, shutdown).await?
        }
        TaskKind::SCORE => {
            let onboarding = if a.no_onboarding { None } else { Some(conn.client().await?) };
            score(opts, hub(a.kubeconfig.as_deref()).await?, onboarding, shutdown).await?;
        }
        TaskKind::DEPLOY => {
            let cfg = ferry_deploy::DeployConfig::new(hub(a.kubeconfig.as_deref()).await?);
            serve(opts, ferry_deploy::DeployHandler::new(cfg), shutdown).await?;
        }
        TaskKind::CREATE_CLUSTER => {
            let mut cfg = ferry_cluster::ClusterConfig::new(hub(a.kubeconfig.as_deref()).await?);
            cfg.catalog = Arc::new(catalog(a.addons.as_deref())?);
            cfg.hub_apiserver = a.hub_apiserver.clone();
            serve(opts, ferry_cluster::ClusterHandler::new(cfg), shutdown).await?;
        }
        TaskKind::PEER => {
            let cfg = ferry_peer::PeerConfig::new(hub(a.kubeconfig.as_deref()).await?);
            serve(opts, ferry_peer::PeerHandler::new(cfg), shutdown).await?;
        }
        TaskKind::OFFLOAD => {
            let mut cfg = ferry_offload::OffloadConfig::new(hub(a.kubeconfig.as_deref()).await?);
            cfg.failure_grace = a.failure_grace;
            if let Some(p) = &a.latency {
                cfg.latency = ferry_offload::latency::LatencyMatrix::load(p)?;
            }
            serve(opts, ferry_offload::OffloadHandler::new(cfg), shutdown).await?;
        }
        TaskKind::PLAN => {
            // The hub is optional (a kubeconfig given must work): without one, a
            // fanned-out step must list its clusters.
            let hub = match hub(a.kubeconfig.as_deref()).await {
                Ok(c) => Some(c.hub().clone()),
                Err(e) if a.kubeconfig.is_some() => return Err(e),
                Err(e) => {
                    tracing::warn!(error = %e, "no hub: plan steps that choose their clusters by labels or a ManagedClusterSet will fail (NO_HUB)");
                    None
                }
            };
            let handler = plan_handler(conn.client().await?, a.child_timeout, hub, &mut opts).await?;
            serve(opts, handler, shutdown).await?
        }
        other => anyhow::bail!("`ferry worker` has no handler for the {other} kind (a crate registers it, but this binary does not run its worker)"),
    }
    Ok(ExitCode::SUCCESS)
}

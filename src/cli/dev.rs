//! `ferry dev`: Ferry on an embedded default. Starts the in-process Kafka-protocol broker
//! with every topic, the workers, and (with `--demo`) a scripted scenario that exits 0 only
//! when every task reached its expected final state.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use ferry_runtime::testkind::{TestHandler, TestTaskSpec};
use ferry_runtime::{Client, EmbeddedBroker, EventType, KafkaConfig, SubmitOptions, TaskKind, Topics, WorkerOptions};
use ferry_testkit::Bed;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Args)]
pub struct DevArgs {
    /// Run a scripted scenario, print one line per task, and exit.
    #[arg(long, value_enum)]
    pub demo: Option<Demo>,
    /// Mock brokers in the embedded cluster. One unless asked: every idle consumer sends a
    /// fetch to each broker it reads from every 20 ms, so three brokers cost an idle
    /// `ferry dev` about a third more CPU (docs/BENCHMARKS.md, "Session 38").
    #[arg(long, default_value_t = 1)]
    pub mock_brokers: i32,
    /// Managed clusters beside the hub in the simulated fleet.
    #[arg(long, default_value_t = 2)]
    pub clusters: usize,
    /// Emulated nodes per managed cluster.
    #[arg(long, default_value_t = 2)]
    pub nodes: usize,
    /// Do not start the Kubernetes test bed.
    #[arg(long)]
    pub no_fleet: bool,
    /// The tenants and what each may target (YAML; see examples/tenants.yaml): their
    /// topics are made on the embedded broker and every worker holds their commands to it,
    /// so `ferry submit ... --tenant NAME` can be tried here.
    #[arg(long, env = "FERRY_POLICY")]
    pub policy: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Demo {
    /// Runtime tasks: success, failure with automatic revert, retries, cancel.
    Smoke,
    /// Three clusters under different loads, scored and ranked (AddOnPlacementScores, scores topic).
    Score,
    /// A three-component app across two clusters through OCM ManifestWorks, then deleted.
    Deploy,
    /// A Cluster API cluster with add-ons, registered with OCM, scaled, then deleted.
    CreateCluster,
    /// Liqo peering, a namespace offloaded and a pod run remotely, then undone.
    PeerOffload,
    /// One plan across four workers, a fanned-out step whose second wave fails and is put
    /// back, then the whole plan reverted and every cluster checked unchanged.
    Plan,
}

/// The file in `ferry dev`'s state that names its hub's kubeconfig while its fleet runs.
const HUB_FILE: &str = "hub-kubeconfig";

/// The hub kubeconfig of the running `ferry dev`, if one runs with a fleet: what `ferry
/// submit --dry-run` tries a command on when it goes to that `ferry dev`'s broker.
pub fn running_hub() -> Option<std::path::PathBuf> {
    let dev = super::state_dir().join("dev");
    if !dev.join("bootstrap").exists() {
        return None;
    }
    let path = std::path::PathBuf::from(std::fs::read_to_string(dev.join(HUB_FILE)).ok()?.trim());
    path.is_file().then_some(path)
}

pub async fn run(a: DevArgs) -> anyhow::Result<ExitCode> {
    let topics = Topics::standard();
    let state = super::state_dir().join("dev");
    std::fs::create_dir_all(&state).with_context(|| format!("creating {}", state.display()))?;
    // A policy that does not load fails before anything starts.
    let policy = match &a.policy {
        Some(p) => Some(Arc::new(ferry_runtime::tenants::Policy::load(p)?)),
        None => None,
    };
    // The smoke demo exercises the runtime only; it needs no clusters. With clusters, the
    // test bed starts the broker beside them; without, it runs alone.
    let needs_fleet = !a.no_fleet && !matches!(a.demo, Some(Demo::Smoke));
    let (bed, lone_broker) = if needs_fleet {
        (Some(start_bed(&a, &state).await?), None)
    } else {
        eprintln!("ferry dev: starting the embedded Kafka-protocol broker ({})", brokers(a.mock_brokers));
        (None, Some(EmbeddedBroker::start(a.mock_brokers, &topics)?))
    };
    let bootstrap = match (&bed, &lone_broker) {
        (Some(bed), _) => bed.broker().bootstrap(),
        (None, Some(broker)) => broker.bootstrap(),
        (None, None) => unreachable!("a bed or a broker was started"),
    };
    if let Some(policy) = &policy {
        let broker = bed.as_ref().map(|b| b.broker()).or(lone_broker.as_ref()).expect("a bed or a broker was started");
        let tenants: Vec<&str> = policy.tenants().collect();
        for def in topics.tenant_topics(policy) {
            broker.create_topic(&def.name, def.partitions, a.mock_brokers.min(def.replication_factor).max(1))?;
        }
        eprintln!("ferry dev: tenants {}: their topics made; the workers hold their commands to the policy", tenants.join(", "));
    }
    std::fs::write(state.join("bootstrap"), &bootstrap)?;
    // The hub a dry run on the clusters defaults to ([`running_hub`]): this fleet's, or
    // none (a `--no-fleet` run leaves no older fleet's to find).
    match &bed {
        Some(bed) => std::fs::write(state.join(HUB_FILE), bed.fleet.hub().kubeconfig.display().to_string())?,
        None => {
            let _ = std::fs::remove_file(state.join(HUB_FILE));
        }
    }
    println!("bootstrap: {bootstrap}");
    println!("state: {}", state.display());

    let shutdown = CancellationToken::new();
    let kafka = KafkaConfig::for_embedded(bootstrap.clone());
    let mut opts = WorkerOptions::new(kafka.clone());
    opts.topics = topics.clone();
    opts.shutdown_grace = Duration::from_secs(5);
    opts.policy = policy;
    let hub = bed.as_ref().map(|b| b.clusters.hub().clone());
    let mut plan_opts = opts.clone();
    let plans = super::workers::plan_handler(Client::new(kafka.clone(), topics.clone())?, Duration::from_secs(3600), hub, &mut plan_opts).await?;
    let mut workers = vec![
        tokio::spawn(super::workers::serve(opts.clone(), TestHandler::default(), shutdown.clone())),
        tokio::spawn(super::workers::serve(plan_opts, plans, shutdown.clone())),
    ];
    let mut names = vec!["test", "plan"];
    if let Some(bed) = &bed {
        let clusters = bed.clusters.clone();
        // Onboarding scorings would race the demo's own; they run in the interactive mode.
        let onboarding = if a.demo.is_none() { Some(Client::new(kafka.clone(), topics.clone())?) } else { None };
        workers.push(tokio::spawn(super::workers::score(opts.clone(), clusters.clone(), onboarding, shutdown.clone())));
        workers.push(tokio::spawn(super::workers::serve(
            opts.clone(),
            ferry_deploy::DeployHandler::new(ferry_deploy::DeployConfig::new(clusters.clone())),
            shutdown.clone(),
        )));
        let mut cluster_cfg = ferry_cluster::ClusterConfig::new(clusters.clone());
        cluster_cfg.catalog = Arc::new(ferry_cluster::Catalog::emulated());
        workers.push(tokio::spawn(super::workers::serve(opts.clone(), ferry_cluster::ClusterHandler::new(cluster_cfg), shutdown.clone())));
        workers.push(tokio::spawn(super::workers::serve(
            opts.clone(),
            ferry_peer::PeerHandler::new(ferry_peer::PeerConfig::new(clusters.clone())),
            shutdown.clone(),
        )));
        workers.push(tokio::spawn(super::workers::serve(
            opts.clone(),
            ferry_offload::OffloadHandler::new(ferry_offload::OffloadConfig::new(clusters.clone())),
            shutdown.clone(),
        )));
        names.extend(["score", "deploy", "create-cluster", "peer", "offload"]);
    }
    eprintln!("ferry dev: workers running: {}", names.join(", "));

    let code = match a.demo {
        Some(Demo::Smoke) => smoke(&kafka, &topics).await?,
        Some(Demo::Score) => {
            let client = Client::new(kafka.clone(), topics.clone())?;
            let bed = bed.as_ref().context("the score demo needs the fleet")?;
            if ferry_testkit::score::run(&client, &bed.fleet).await? { ExitCode::SUCCESS } else { ExitCode::FAILURE }
        }
        Some(Demo::Deploy) => {
            let client = Client::new(kafka.clone(), topics.clone())?;
            let bed = bed.as_ref().context("the deploy demo needs the fleet")?;
            if ferry_testkit::deploy::run(&client, &bed.fleet).await? { ExitCode::SUCCESS } else { ExitCode::FAILURE }
        }
        Some(Demo::CreateCluster) => {
            let client = Client::new(kafka.clone(), topics.clone())?;
            let bed = bed.as_ref().context("the create-cluster demo needs the fleet")?;
            if ferry_testkit::cluster::run(&client, &bed.hub().await).await? { ExitCode::SUCCESS } else { ExitCode::FAILURE }
        }
        Some(Demo::PeerOffload) => {
            let client = Client::new(kafka.clone(), topics.clone())?;
            let bed = bed.as_ref().context("the peer-offload demo needs the fleet")?;
            let member = |n: &str| bed.fleet.cluster(n).with_context(|| format!("the fleet has no {n}: run with --clusters 2 or more"));
            let (consumer, provider) = (member(ferry_testkit::offload::CONSUMER)?.client().await?, member(ferry_testkit::offload::PROVIDER)?.client().await?);
            if ferry_testkit::offload::run(&client, &consumer, &provider).await? { ExitCode::SUCCESS } else { ExitCode::FAILURE }
        }
        Some(Demo::Plan) => {
            let client = Client::new(kafka.clone(), topics.clone())?;
            let bed = bed.as_ref().context("the plan demo needs the fleet")?;
            if ferry_testkit::plan::run(&client, &bed.fleet).await? { ExitCode::SUCCESS } else { ExitCode::FAILURE }
        }
        None => {
            // The members join OCM through their klusterlets (clusteradm join + accept) into
            // ManagedClusterSet `demo`, bound to the README deploy example's namespace.
            if let Some(bed) = bed.as_ref() {
                // The README's offload example offloads namespace `web` of member-1; its burst
                // example scales `web/api` there beyond what member-1 fits. Running before
                // the members join, so the scores taken as they join count it.
                if let Some(m) = bed.fleet.cluster(ferry_testkit::offload::CONSUMER) {
                    eprintln!("ferry dev: namespace web with Deployment api on {} (the README's offload and burst examples)", m.name);
                    let client = m.client().await?;
                    ferry_testkit::offload::namespace(&client, "web").await?;
                    ferry_testkit::offload::deployment(&client, "web", "api").await?;
                    if let Err(e) = ferry_testkit::offload::deployment_available(&client, "web", "api", Duration::from_secs(120)).await {
                        eprintln!("ferry dev: {e}; the first scores may not count it");
                    }
                }
                let members: Vec<&str> = bed.fleet.clusters.iter().skip(1).map(|c| c.name.as_str()).collect();
                eprintln!("ferry dev: joining {} to OCM (ManagedClusterSet demo, bound to namespace hello)", members.join(", "));
                ferry_testkit::deploy::prepare(&bed.fleet, &members, "hello").await?;
            }
            eprintln!("ferry dev: ready. In another terminal: ferry submit test -f examples/test-task.yaml --wait");
            eprintln!("ferry dev: Ctrl-C to stop");
            super::common::cancel_on_signal(shutdown.clone());
            shutdown.cancelled().await;
            ExitCode::SUCCESS
        }
    };
    shutdown.cancel();
    for w in workers {
        w.await??;
    }
    let _ = std::fs::remove_file(state.join("bootstrap"));
    let _ = std::fs::remove_file(state.join(HUB_FILE));
    // The emulators before the API servers they watch, the broker after the workers.
    if let Some(bed) = bed {
        bed.stop().await;
    }
    drop(lone_broker);
    Ok(code)
}

/// The simulated fleet (a hub and managed clusters with emulated nodes, OCM, Cluster API,
/// Liqo, offloading and, without a demo, the Submariner add-on) and the broker, as the tests' bed; installs the control plane
/// first if it is not cached yet (minutes, once).
async fn start_bed(a: &DevArgs, state: &std::path::Path) -> anyhow::Result<Bed> {
    if !ferry_fleet::binaries::Binaries::installed() {
        eprintln!("ferry dev: the Kubernetes test bed is not installed yet; building it once (about 10 minutes)");
        let script = include_str!("../../scripts/install-testbed.sh");
        let ok = std::process::Command::new("bash").arg("-c").arg(script).status()?.success();
        anyhow::ensure!(ok, "installing the test bed failed (see the output above)");
    }
    // The score demo compares three clusters.
    let n = if matches!(a.demo, Some(Demo::Score)) { a.clusters.max(3) } else { a.clusters };
    eprintln!("ferry dev: starting the simulated fleet (hub + {n} managed clusters) and the embedded Kafka-protocol broker ({})", brokers(a.mock_brokers));
    let mut bed = Bed::builder()
        .members(n, a.nodes)
        .kubeconfigs()
        .ocm()
        .capi(ferry_fleet::emulated_capi::CapiOptions::default())
        .liqo(Default::default())
        .offloading(Default::default())
        .brokers(a.mock_brokers)
        .dir(state.join("fleet"))
        .pod_start_delay(Duration::from_millis(500));
    // The Submariner add-on for the README's peer-submariner example, on the plain `ferry
    // dev` only: like upstream's submariner-addon it makes a `<set>-broker` namespace for
    // every ManagedClusterSet, and the demos, which compare the fleet before and after,
    // would find the namespace of a set a plan made (and reverted) still being deleted.
    if a.demo.is_none() {
        bed = bed.submariner(Default::default());
    }
    let bed = bed.try_start().await?;
    match bed.crds {
        ferry_fleet::CrdSource::Upstream => eprintln!("ferry dev: upstream CRDs from ../shared/crds: the API servers validate what is written"),
        ferry_fleet::CrdSource::ProjectSubset => {
            eprintln!("ferry dev: ../shared/crds is absent: the project's open-schema CRDs stand in, and nothing written to them is validated")
        }
    }
    for c in &bed.fleet.clusters {
        println!("kubeconfig {}: {}", c.name, c.kubeconfig.display());
    }
    println!("kubeconfig: {}", bed.fleet.hub().kubeconfig.display());
    Ok(bed)
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
        let id = client.submit(TaskKind::TEST, &format!("smoke-{}", case.name), &case.spec, SubmitOptions::default()).await?;
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
            ferry_runtime::report::ended(last),
            case.expect,
            evs.len(),
            if ok { "ok" } else { "MISMATCH" }
        );
    }
    println!("smoke: {}", if all_ok { "every task reached its expected state" } else { "FAILED" });
    Ok(if all_ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// "1 broker", "3 brokers".
fn brokers(n: i32) -> String {
    if n == 1 { "1 broker".into() } else { format!("{n} brokers") }
}

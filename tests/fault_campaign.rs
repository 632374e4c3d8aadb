//! The fault campaign: 1,000 mixed tasks (runtime `test` tasks that succeed, fail and
//! revert, retry, or are cancelled; `score` tasks against real API servers, some reverted;
//! `deploy` tasks through the emulated OCM, some reverted; `create-cluster` tasks through
//! the emulated Cluster API, some reverted; a Liqo `peer` task and Submariner ones that are
//! reverted; `offload` tasks over the Liqo peering, some reverted) run on worker
//! *processes* while workers are SIGKILLed and restarted (the peer and offload workers in
//! the middle of a task), the broker goes down and comes back, then fails produce, fetch,
//! commit and heartbeat requests, and the hub's API answers 500 and 429, slows down and
//! blacks out (through the test bed's fault proxy).
//! Every task must end in its expected final state, none may be lost, reverted scorings
//! must leave no placement score, reverted deploys no ManifestWork or Deployment,
//! reverted clusters nothing on the hub, reverted tunnels no Submariner object and
//! reverted offloads no NamespaceOffloading or twin namespace behind; every created
//! cluster must exist exactly once, the peering and the standing offloads must be in
//! place, and no topic may hold secret material afterwards.

// Each kind registers itself in its worker crate (ferry_task::kind): link every one Ferry
// ships, as the `ferry` binary does, so that topics and schemas cover them all.
use {ferry_cluster as _, ferry_deploy as _, ferry_offload as _, ferry_peer as _, ferry_plan as _, ferry_score as _};

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use ferry_fleet::inventory::{Inventory, ObjectRef};
use ferry_fleet::process::Managed;
use ferry_fleet::FaultProxy;
use ferry_kube::kinds::{AddOnPlacementScore, ManagedCluster, ManagedClusterAddOn, ManifestWork};
use ferry_runtime::testkind::TestTaskSpec;
use ferry_runtime::{CommandAction, EventType, KafkaConfig, SubmitOptions, TaskId, TaskKind, TaskState};
use ferry_testkit::Bed;
use ferry_score::spec::ScoreClusters;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::{ApiResource, GroupVersionKind};
use rand::Rng;

const TASKS: usize = 1000;

/// The worker processes, each under the test bed's guard (they die with the test, even
/// on SIGKILL) and named by its HOSTNAME, which starts its worker id (`w7-<pid>-<rand>`).
struct Workers {
    bootstrap: String,
    hub_kubeconfig: std::path::PathBuf,
    logs: std::path::PathBuf,
    started: usize,
    procs: Vec<(TaskKind, String, Managed)>,
}

impl Workers {
    fn spawn(&mut self, kind: TaskKind) {
        self.started += 1;
        let name = format!("w{}", self.started);
        // FERRY_CAMPAIGN_RUST_LOG (e.g. `warn,rdkafka=info`) for a closer look at a run.
        // The runtime's own lines by default: a failure prints those naming its tasks.
        let log_filter = std::env::var("FERRY_CAMPAIGN_RUST_LOG").unwrap_or_else(|_| "error,ferry_runtime=info".into());
        let mut args: Vec<String> = vec![format!("HOSTNAME={name}"), format!("RUST_LOG={log_filter}"), env!("CARGO_BIN_EXE_ferry").into()];
        args.extend(["worker", &kind.to_string(), "--brokers", &self.bootstrap].map(String::from));
        args.extend(["--kafka-property", "session.timeout.ms=6000", "--kafka-property", "heartbeat.interval.ms=500"].map(String::from));
        args.extend(["--kafka-property", "fetch.wait.max.ms=5"].map(String::from));
        if kind != TaskKind::TEST {
            args.extend(["--kubeconfig".to_owned(), self.hub_kubeconfig.display().to_string()]);
        }
        match kind {
            // The test workers' steps record their runs outside Kafka (an effect log).
            TaskKind::TEST => args.extend(["--effects".to_owned(), self.logs.join("effects").display().to_string()]),
            TaskKind::SCORE => args.push("--no-onboarding".into()),
            TaskKind::CREATE_CLUSTER => args.extend(["--addons", "emulated"].map(String::from)),
            _ => {}
        }
        let log = self.logs.join(format!("{name}-{kind}.log"));
        let p = Managed::spawn(&name, std::path::Path::new("/usr/bin/env"), &args, &log).expect("spawn ferry worker");
        self.procs.push((kind, name, p));
    }

    /// SIGKILLs a random worker of `kind` (dropping its guard) and starts a fresh one.
    fn kill_and_replace(&mut self, kind: TaskKind) {
        let of_kind: Vec<usize> = self.procs.iter().enumerate().filter(|(_, (k, _, _))| *k == kind).map(|(i, _)| i).collect();
        let i = of_kind[rand::rng().random_range(0..of_kind.len())];
        drop(self.procs.remove(i));
        self.spawn(kind);
    }

    /// SIGKILLs the worker process named in an event's `worker`, the one holding that
    /// task, and starts a fresh one of its kind.
    fn kill_holder(&mut self, worker: &str) -> bool {
        let Some(i) = self.procs.iter().position(|(_, name, _)| worker.starts_with(&format!("{name}-"))) else { return false };
        let (kind, _, p) = self.procs.remove(i);
        drop(p);
        self.spawn(kind);
        true
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    Succeed,
    FailAndRevert,
    Flaky,
    Cancel,
    Score,
    ScoreThenRevert,
    Deploy,
    DeployThenRevert,
    Cluster,
    ClusterThenRevert,
    Peer,
    TunnelThenRevert,
    Offload,
    OffloadThenRevert,
}

impl Plan {
    fn expect(self) -> EventType {
        match self {
            Plan::Succeed | Plan::Flaky | Plan::Score | Plan::Deploy | Plan::Cluster | Plan::Peer | Plan::Offload => EventType::Succeeded,
            Plan::FailAndRevert
            | Plan::ScoreThenRevert
            | Plan::DeployThenRevert
            | Plan::ClusterThenRevert
            | Plan::TunnelThenRevert
            | Plan::OffloadThenRevert => EventType::Reverted,
            Plan::Cancel => EventType::Cancelled,
        }
    }
}

fn plan(i: usize) -> Plan {
    match i % 10 {
        0..=5 => Plan::Succeed,
        6 => Plan::FailAndRevert,
        7 => Plan::Flaky,
        8 => Plan::Cancel,
        _ if i % 50 == 9 => Plan::ScoreThenRevert,
        _ if i % 50 == 19 => Plan::Deploy,
        _ if i % 50 == 39 => Plan::DeployThenRevert,
        _ if i % 100 == 29 => Plan::Cluster,
        _ if i % 100 == 79 => Plan::ClusterThenRevert,
        _ if i == 49 => Plan::Peer,
        _ if i % 200 == 49 => Plan::TunnelThenRevert,
        _ if i % 200 == 99 => Plan::Offload,
        _ if i % 200 == 199 => Plan::OffloadThenRevert,
        _ => Plan::Score,
    }
}

/// The peering: member-1 consumes member-2 through Liqo. It stands.
fn peering() -> ferry_peer::spec::PeerClusters {
    ferry_peer::spec::PeerClusters { a: "member-1".into(), b: "member-2".into(), timeout_seconds: Some(180), ..Default::default() }
}

/// A Submariner tunnel between the same pair (the same subject, so after the peering);
/// the clusters stay in their set, `campaign`.
fn tunnel() -> ferry_peer::spec::PeerClusters {
    ferry_peer::spec::PeerClusters { method: ferry_peer::spec::PeerMethod::Submariner, ..peering() }
}

/// The offload of task `i`: member-1's namespace `camp-off-<i>` to member-2.
fn offload(i: usize) -> ferry_offload::spec::OffloadCommand {
    ferry_offload::spec::OffloadCommand {
        cluster: "member-1".into(),
        namespace: format!("camp-off-{i}"),
        clusters: vec!["member-2".into()],
        timeout_seconds: Some(180),
        ..Default::default()
    }
}

/// The cluster of create-cluster task `i`: Docker, kubeadm, one control plane and one
/// worker, a virtual workload cluster of the emulated Cluster API.
fn cluster(i: usize) -> ferry_cluster::spec::ClusterCommand {
    use ferry_cluster::spec::{ClusterCommand, MachinePool, WorkerPool};
    ClusterCommand {
        name: format!("camp-{i}"),
        namespace: Some("campaign".into()),
        infrastructure: "docker".into(),
        version: "v1.33.1".into(),
        control_plane: MachinePool { count: Some(1), flavor: None },
        workers: WorkerPool { count: Some(1), flavor: None },
        ready_timeout_seconds: Some(300),
        ..ClusterCommand::default()
    }
}

/// The lines of every worker log in `dir` that name `task` (the last 30 by their
/// timestamps, each marked with its log's name): what the workers did with a task the
/// campaign found stuck.
fn log_lines(dir: &std::path::Path, task: &str) -> String {
    let mut lines = Vec::new();
    let mut logs: Vec<std::path::PathBuf> = std::fs::read_dir(dir).into_iter().flatten().flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "log")).collect();
    logs.sort();
    for log in logs {
        let name = log.file_stem().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        for line in std::fs::read_to_string(&log).unwrap_or_default().lines().filter(|l| l.contains(task)) {
            lines.push((line.chars().take(400).collect::<String>(), name.clone()));
        }
    }
    // Each line starts with its timestamp (after the same colour code).
    lines.sort();
    let skip = lines.len().saturating_sub(30);
    let lines: Vec<String> = lines[skip..].iter().map(|(line, name)| format!("    {name}: {line}")).collect();
    if lines.is_empty() { "    (none)".into() } else { lines.join("\n") }
}

/// Whether `name` mentions `token` as a whole part between `-`, `.`, `:` or `/`
/// (`app-19-web` and `x:app-19` mention `app-19`; `app-119` does not).
fn mentions(name: &str, token: &str) -> bool {
    let edge = |c: Option<char>| c.is_none_or(|c| matches!(c, '-' | '.' | ':' | '/'));
    name.match_indices(token).any(|(at, _)| edge(name[..at].chars().next_back()) && edge(name[at + token.len()..].chars().next()))
}

/// Whether an object that appeared on `cluster` during the campaign belongs to something
/// that stands: a deployed app, a created cluster, an offloaded namespace or its twin (by
/// name, namespace or a label value), the Liqo peering on the members (its labels, its
/// tenant namespaces; Liqo's installation, which the emulator makes on its first tick),
/// a placement score (checked on its own, by task), or a service-account token Secret
/// (Kubernetes 1.20's token controller adds them to namespaces made just before).
fn explained(cluster: &str, o: &ObjectRef, labels: &BTreeMap<String, String>, standing: &[String], peered: bool) -> bool {
    use ferry_peer::liqo::{LIQO_NAMESPACE, PEERING_LABEL, REMOTE_ID_LABEL};
    let ours = standing.iter().any(|t| mentions(&o.name, t) || mentions(&o.namespace, t) || labels.values().any(|v| mentions(v, t)));
    let liqo = cluster != "hub"
        && peered
        && (labels.contains_key(PEERING_LABEL)
            || labels.contains_key(REMOTE_ID_LABEL)
            || o.namespace.starts_with("liqo-tenant-")
            || (o.kind == "Namespace" && o.name.starts_with("liqo-tenant-")));
    let liqo_installed = cluster != "hub" && (o.namespace == LIQO_NAMESPACE || (o.kind == "Namespace" && o.name == LIQO_NAMESPACE));
    // Liqo's own, which outlive a peering upstream too: the ForeignCluster its controller
    // makes for every remote it heard of (never deleted), and the certificate requests its
    // identity manager approved (until Kubernetes' CSR cleaner removes them).
    let liqo_own = cluster != "hub"
        && (o.kind == "ForeignCluster" || (o.kind == "CertificateSigningRequest" && labels.contains_key("liqo.io/remote-tenant-csr")));
    let token = o.kind == "Secret" && o.name.starts_with("default-token-");
    ours || liqo || liqo_installed || liqo_own || token || o.kind == "AddOnPlacementScore"
}

/// Awaits `f`, saying so when it took more than 2 s (where the campaign stalls).
async fn timed<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    let t = std::time::Instant::now();
    let out = f.await;
    if t.elapsed() > Duration::from_secs(2) {
        println!("campaign: {what} took {:.1} s", t.elapsed().as_secs_f64());
    }
    out
}

/// Where a late task's commands are: each record on its kind's command topic that names
/// it (partition, offset, age), and the offset the kind's group has committed on that
/// partition. Tells a command never consumed from one consumed and then dropped.
fn command_trace(kafka: &KafkaConfig, topic: &str, group: &str, task: &str) -> String {
    use rdkafka::Message;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let trace = || -> Result<String, rdkafka::error::KafkaError> {
        let reader: BaseConsumer = kafka.reader().create()?;
        let md = reader.fetch_metadata(Some(topic), Duration::from_secs(10))?;
        let mut tpl = rdkafka::TopicPartitionList::new();
        let mut ends = HashMap::new();
        for p in md.topics().iter().flat_map(|t| t.partitions()) {
            let (_, high) = reader.fetch_watermarks(topic, p.id(), Duration::from_secs(10))?;
            ends.insert(p.id(), high);
            tpl.add_partition_offset(topic, p.id(), rdkafka::Offset::Beginning)?;
        }
        reader.assign(&tpl)?;
        let (mut found, mut read) = (Vec::new(), HashMap::new());
        let until = std::time::Instant::now() + Duration::from_secs(20);
        while ends.iter().any(|(p, end)| read.get(p).copied().unwrap_or(-1) + 1 < *end) && std::time::Instant::now() < until {
            let Some(Ok(m)) = reader.poll(Duration::from_millis(200)) else { continue };
            read.insert(m.partition(), m.offset());
            if m.payload().is_some_and(|b| b.windows(task.len()).any(|w| w == task.as_bytes())) {
                let age = m.timestamp().to_millis().map(|t| (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64 - t) as f64 / 1000.0).unwrap_or(-1.0);
                found.push(format!("p{}@{} ({age:.0} s old)", m.partition(), m.offset()));
            }
        }
        let group_view: BaseConsumer = kafka.group_consumer(group).create()?;
        let committed = group_view.committed_offsets(tpl, Duration::from_secs(10))?;
        let committed: Vec<String> = committed.elements().iter().map(|e| format!("p{}@{:?}", e.partition(), e.offset())).collect();
        Ok(format!("commands {}; {group} committed {}", found.join(", "), committed.join(" ")))
    };
    trace().unwrap_or_else(|e| format!("no command trace: {e}"))
}

fn kube_heavy(p: Plan) -> bool {
    !matches!(p, Plan::Succeed | Plan::FailAndRevert | Plan::Flaky | Plan::Cancel)
}

/// The app of deploy task `i`: one small component on member-1 or member-2, in its own
/// namespace.
fn app(i: usize) -> ferry_deploy::spec::DeployApp {
    use ferry_deploy::spec::{Component, DeployApp};
    DeployApp {
        name: format!("app-{i}"),
        owner: "campaign".into(),
        components: vec![Component {
            name: "web".into(),
            image: "nginx:1.27".into(),
            cpu: Some("10m".into()),
            cluster: Some(if i % 100 < 50 { "member-1" } else { "member-2" }.into()),
            ..Component::default()
        }],
        ready_timeout_seconds: Some(300),
        ..DeployApp::default()
    }
}

/// Every record of a task on its task-state topic, in order, with its writer, and every
/// event read of it: which worker wrote what, and from which seq it went on.
async fn task_records(client: &ferry_runtime::Client, topics: &ferry_runtime::Topics, history: &[ferry_runtime::ProgressEvent], id: &str) -> String {
    let Ok(task) = id.parse::<TaskId>() else { return String::new() };
    let kind = client.snapshot(task).await.ok().flatten().map(|s| s.kind).unwrap_or(TaskKind::TEST);
    let records: Vec<String> = client
        .read_to_end(&topics.task_state(kind).name)
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k.as_deref() == Some(id.as_bytes()))
        .filter_map(|(_, v)| client.registry().decode::<ferry_runtime::TaskSnapshot>(&v).ok())
        .map(|s| format!("{} {:?} {:?} step {} by {}", s.seq, s.state, s.last_event, s.journal.len(), s.worker))
        .collect();
    let events: Vec<String> =
        history.iter().filter(|e| e.task_id == id).map(|e| format!("{} {:?} {:?} by {} at {}", e.seq, e.event, e.step_name, e.worker, e.at_ms)).collect();
    format!("  its records: {}\n  its events: {}", records.join(" | "), events.join(" | "))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_mixed_tasks_survive_kills_outages_and_api_faults() {
    // Controllers run: deployed apps need Deployments to make Pods. OCM's, Cluster API's
    // (every workload cluster virtual) and Liqo's emulators talk to the API servers
    // directly; the workers go through fault proxies (below).
    let capi_options = ferry_fleet::emulated_capi::CapiOptions { real_api_servers: 0, ..Default::default() };
    let Some(bed) = Bed::builder()
        .members(2, 2)
        .kubeconfigs()
        .ocm()
        .capi(capi_options)
        .liqo(HashMap::new())
        // Submariner's operator CRDs are on the members from the start: OLM leaves them
        // behind when a reverted tunnel's operator goes, as upstream's does.
        .submariner(["member-1", "member-2"].map(|m| (m.to_owned(), ferry_fleet::emulated_submariner::SubmarinerKnobs { operator_crds: true, ..Default::default() })).into())
        .offloading(HashMap::new())
        .brokers(3)
        .start()
        .await
    else {
        return;
    };
    let fleet = &bed.fleet;
    let hub = bed.hub().await;
    ferry_testkit::score::register(fleet, &["member-1", "member-2"], "campaign").await.unwrap();
    for i in (0..TASKS).filter(|i| matches!(plan(*i), Plan::Deploy | Plan::DeployThenRevert)) {
        ferry_testkit::deploy::bind(&hub, &app(i).name, "campaign").await.unwrap();
    }
    Api::<Namespace>::all(hub.clone())
        .patch(
            "campaign",
            &kube::api::PatchParams::apply("campaign"),
            &kube::api::Patch::Apply(serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "campaign"}})),
        )
        .await
        .unwrap();
    // The namespaces to offload.
    let m1 = fleet.cluster("member-1").unwrap().client().await.unwrap();
    let m2 = fleet.cluster("member-2").unwrap().client().await.unwrap();
    for i in (0..TASKS).filter(|i| matches!(plan(*i), Plan::Offload | Plan::OffloadThenRevert)) {
        let ns = offload(i).namespace;
        let obj = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        Api::<Namespace>::all(m1.clone()).patch(&ns, &kube::api::PatchParams::apply("campaign"), &kube::api::Patch::Apply(obj)).await.unwrap();
    }
    // The score workers reach the hub through the fault proxy; the members directly.
    let proxy = FaultProxy::start(hub.clone()).await.unwrap();
    let faults = proxy.handle();
    let hub_kubeconfig = fleet.dir.join("hub-through-proxy.kubeconfig");
    proxy.write_kubeconfig(&hub_kubeconfig, "hub").unwrap();
    // The workers reach member-1 through a fault proxy too: its kubeconfig Secret on the
    // hub (as Cluster API writes it) names the proxy. Liqo's and the kubelets' emulators,
    // the members' own controllers, reach it directly.
    let member_proxy = FaultProxy::start(m1.clone()).await.unwrap();
    let member_faults = member_proxy.handle();
    {
        use k8s_openapi::api::core::v1::Secret;
        let secret = ferry_fleet::fleet::kubeconfig_secret("member-1", &member_proxy.kubeconfig("member-1"));
        Api::<Secret>::namespaced(hub.clone(), ferry_fleet::fleet::KUBECONFIG_NAMESPACE)
            .patch("member-1-kubeconfig", &kube::api::PatchParams::apply("ferry-fleet").force(), &kube::api::Patch::Apply(&secret))
            .await
            .unwrap();
    }

    let topics = bed.topics.clone();
    let broker = bed.broker();
    let bootstrap = broker.bootstrap();
    let client = bed.client();
    let mut events = client.events(false).await.unwrap();
    // Every object of every cluster before Ferry touches them.
    let mut before = Vec::new();
    for c in &fleet.clusters {
        before.push((c.name.clone(), Inventory::take(&c.client().await.unwrap()).await.unwrap()));
    }
    // FERRY_CAMPAIGN_LOGS keeps the workers' logs in a directory that outlives the run.
    let logs = std::env::var_os("FERRY_CAMPAIGN_LOGS").map(std::path::PathBuf::from).unwrap_or_else(|| fleet.dir.clone());
    std::fs::create_dir_all(&logs).unwrap();
    let _ = std::fs::remove_file(logs.join("effects"));
    let mut workers = Workers { bootstrap, hub_kubeconfig, logs, started: 0, procs: Vec::new() };
    for kind in [TaskKind::TEST, TaskKind::SCORE, TaskKind::DEPLOY, TaskKind::CREATE_CLUSTER, TaskKind::PEER, TaskKind::OFFLOAD] {
        workers.spawn(kind);
        workers.spawn(kind);
    }

    let mut plans: HashMap<String, (Plan, TaskId)> = HashMap::new();
    let mut deploy_ids: HashMap<usize, TaskId> = HashMap::new();
    let mut cluster_ids: HashMap<usize, TaskId> = HashMap::new();
    for i in 0..TASKS {
        let p = plan(i);
        let id = match p {
            Plan::Score | Plan::ScoreThenRevert => {
                let spec = ScoreClusters { clusters: vec!["member-1".into(), "member-2".into()], ..ScoreClusters::default() };
                // One subject: scorings run one after another, across every fault phase.
                client.submit(TaskKind::SCORE, "campaign/score", &spec, SubmitOptions::default()).await.unwrap()
            }
            Plan::Deploy | Plan::DeployThenRevert => {
                let a = app(i);
                client.submit(TaskKind::DEPLOY, &a.subject(), &a, SubmitOptions::default()).await.unwrap()
            }
            Plan::Cluster | Plan::ClusterThenRevert => {
                let c = cluster(i);
                client.submit(TaskKind::CREATE_CLUSTER, &c.subject(), &c, SubmitOptions::default()).await.unwrap()
            }
            Plan::Peer | Plan::TunnelThenRevert => {
                let p = if p == Plan::Peer { peering() } else { tunnel() };
                client.submit(TaskKind::PEER, &p.subject(), &p, SubmitOptions::default()).await.unwrap()
            }
            // Submitted once the peering stands, as a service would.
            Plan::Offload | Plan::OffloadThenRevert => continue,
            Plan::Cancel => {
                // On a subject it shares with tasks that succeed (i + 2 is a multiple of 10):
                // those queued behind the blocked task wait for its cancel and run after
                // it, in order, across every fault.
                let spec = TestTaskSpec { block_at: Some(2), ..TestTaskSpec::steps(3) };
                client.submit(TaskKind::TEST, &format!("campaign/test/{}", (i + 2) % 50), &spec, SubmitOptions::default()).await.unwrap()
            }
            _ => {
                let spec = match p {
                    Plan::FailAndRevert => TestTaskSpec { fail_at: Some(2), step_ms: 5, ..TestTaskSpec::steps(3) },
                    Plan::Flaky => TestTaskSpec { fail_transient: 2, step_ms: 5, ..TestTaskSpec::steps(2) },
                    _ => TestTaskSpec { step_ms: 5, ..TestTaskSpec::steps(3) },
                };
                client.submit(TaskKind::TEST, &format!("campaign/test/{}", i % 50), &spec, SubmitOptions::default()).await.unwrap()
            }
        };
        plans.insert(id.to_string(), (p, id));
        if matches!(p, Plan::Deploy | Plan::DeployThenRevert) {
            deploy_ids.insert(i, id);
        }
        if matches!(p, Plan::Cluster | Plan::ClusterThenRevert) {
            cluster_ids.insert(i, id);
        }
    }

    // Chaos keyed to progress: after this many scorings have settled, do this.
    let started = std::time::Instant::now();
    let mut scored = HashSet::new();
    // Each task's final event with the highest seq read so far, as a tracker reads it: a
    // second writer's ending under a lower seq (the window the checker reports at the end)
    // read after the owner's later one does not undo it.
    let mut settled: HashMap<String, (i64, EventType)> = HashMap::new();
    let mut cancelled = HashSet::new();
    let mut reverted = HashSet::new();
    let mut revert_retries: HashMap<TaskId, u32> = HashMap::new();
    let mut step = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    let mut last_settled = tokio::time::Instant::now();
    // A scoring whose step ran out of retries under the injected faults fails and is
    // reverted automatically: a correct outcome, which must then leave nothing behind.
    let mut expected: HashMap<String, EventType> = plans.iter().map(|(id, (p, _))| (id.clone(), p.expect())).collect();
    let mut failed_by_faults = HashSet::new();
    let mut delivered: HashSet<(TaskId, i64, EventType)> = HashSet::new();
    let mut history: Vec<ferry_runtime::ProgressEvent> = Vec::new();
    let mut offload_ids: HashMap<usize, TaskId> = HashMap::new();
    // The peer and offload workers are killed once each while they hold a task mid-way.
    let (mut peer_killed, mut offload_killed) = (false, false);
    let (mut back_up, mut reported) = (None::<(std::time::Instant, usize)>, 0);
    let settled_as = |settled: &HashMap<String, (i64, EventType)>, id: &str| settled.get(id).map(|(_, e)| *e);
    while !expected.iter().all(|(id, want)| settled_as(&settled, id) == Some(*want)) {
        // No task settled for two minutes (a run settles hundreds a minute): stuck, report
        // now rather than at the overall deadline.
        let stalled = last_settled + Duration::from_secs(120);
        let Ok(ev) = tokio::time::timeout_at(deadline.min(stalled), timed("reading the next event", events.next())).await else {
            // Each late task with its plan, the last event read for it (which worker, which
            // step) and its durable state: tells a stuck owner from a stuck reader, and
            // names the worker whose log to read.
            let kafka = KafkaConfig::for_embedded(broker.bootstrap());
            let snaps: HashMap<String, ferry_runtime::TaskSnapshot> =
                client.snapshots().await.unwrap_or_default().into_iter().map(|s| (s.task_id.clone(), s)).collect();
            let missing: Vec<String> = expected
                .iter()
                .filter(|(id, want)| settled_as(&settled, id) != Some(**want))
                .take(10)
                .map(|(id, want)| {
                    let last = history.iter().rev().find(|e| &e.task_id == id);
                    // Its message too: what a waiting step last said it waits for.
                    let last = last.map(|e| format!("seq {} {:?} {:?} by {} ({})", e.seq, e.event, e.step_name, e.worker, e.message.as_deref().unwrap_or("no message")));
                    let snap = snaps.get(id).map(|s| {
                        format!("seq {} {:?} {:?} revert_requested {} partition {}", s.seq, s.state, s.last_event, s.revert_requested, s.origin_partition)
                    });
                    let commands = snaps.get(id).map(|s| {
                        let group = format!("ferry-{}", s.kind);
                        command_trace(&kafka, &topics.command(s.kind).name, &group, id)
                    });
                    // The task's whole history as read, and what the checker says of it: a
                    // second writer shows as a reused seq or a second ending.
                    let events: Vec<String> = history
                        .iter()
                        .filter(|e| &e.task_id == id)
                        .map(|e| format!("{} {:?} {:?} {} at {}", e.seq, e.event, e.step_name, e.worker, e.at_ms))
                        .collect();
                    let own: Vec<ferry_runtime::ProgressEvent> = history.iter().filter(|e| &e.task_id == id).cloned().collect();
                    format!(
                        "{id} ({:?}) wants {want:?}, settled {:?}, last event {}, snapshot {}, {}\n  events read: {}\n  checker: {:?}\n  worker log lines naming it:\n{}",
                        plans[id].0,
                        settled.get(id),
                        last.unwrap_or_else(|| "none".into()),
                        snap.unwrap_or_else(|| "none".into()),
                        commands.unwrap_or_default(),
                        events.join(" | "),
                        ferry_runtime::history::check(&own),
                        log_lines(&workers.logs, id)
                    )
                })
                .collect();
            let why = if tokio::time::Instant::now() >= deadline { "deadline" } else { "no task settled for 120 s" };
            panic!("campaign {why}: tasks not in their expected state:\n{}", missing.join("\n"));
        };
        let ev = ev.expect("event stream");
        let Some((p, id)) = plans.get(&ev.task_id).copied() else { continue };
        // Every event, repeats included, for the history checker at the end.
        history.push(ev.clone());
        // A worker that takes over a partition republishes the final events of its tasks:
        // the campaign's own bookkeeping skips an event it has seen (same task, seq and
        // event). A different event under a seen seq is not dropped: the checker below
        // reports it, and the campaign reacts to it (a Reverted written by a second owner
        // under a reused seq was once dropped here, and the campaign waited forever).
        if !delivered.insert((id, ev.seq, ev.event)) {
            continue;
        }
        if matches!(p, Plan::Score | Plan::Deploy | Plan::Cluster | Plan::Peer | Plan::Offload)
            && ev.event == EventType::StepFailed
            && ev.message.as_deref().is_some_and(|m| m.contains("gave up after"))
        {
            println!("campaign: {p:?} {id} failed under the faults ({:?}); it must revert", ev.message);
            failed_by_faults.insert(id);
            expected.insert(id.to_string(), EventType::Reverted);
        }
        if p == Plan::Cancel && ev.event == EventType::StepProgress && cancelled.insert(id) {
            timed("a cancel", client.control(ev.kind, &ev.subject, id, CommandAction::Cancel, Some("campaign".into()))).await.unwrap();
        }
        let mid_task = |kill: bool, step: &str| !kill && ev.event == EventType::StepStarted && ev.step_name.as_deref() == Some(step);
        let lag = (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64 - ev.at_ms) as f64 / 1000.0;
        // How the system comes back after the broker outage: the first event read, and
        // every 50 tasks settled since, with how old the event was when read.
        if let Some((up, n0)) = back_up
            && (reported == 0 || settled.len() >= n0 + 50 * reported)
        {
            println!(
                "campaign: {:>5.1} s after the outage: {} tasks settled since; {:?} of {} {lag:.1} s old when read",
                up.elapsed().as_secs_f64(),
                settled.len() - n0,
                ev.event,
                ev.kind
            );
            reported += 1;
            if reported > 10 {
                back_up = None;
            }
        }
        if p == Plan::Peer && mid_task(peer_killed, "network") {
            peer_killed = workers.kill_holder(&ev.worker);
            println!(
                "campaign: {:>5.1} s: SIGKILL of {} holding the peering in its network step (event {lag:.1} s old): {peer_killed}",
                started.elapsed().as_secs_f64(),
                ev.worker
            );
        }
        if matches!(p, Plan::Offload | Plan::OffloadThenRevert) && mid_task(offload_killed, "offload") {
            offload_killed = workers.kill_holder(&ev.worker);
            println!(
                "campaign: {:>5.1} s: SIGKILL of {} holding {id} in its offload step (event {lag:.1} s old): {offload_killed}",
                started.elapsed().as_secs_f64(),
                ev.worker
            );
        }
        // The offloads go out once the peering has ended; without it they are refused.
        if p == Plan::Peer && ev.event.is_final() {
            for i in (0..TASKS).filter(|i| matches!(plan(*i), Plan::Offload | Plan::OffloadThenRevert)) {
                let o = offload(i);
                let oid = client.submit(TaskKind::OFFLOAD, &o.subject(), &o, SubmitOptions::default()).await.unwrap();
                plans.insert(oid.to_string(), (plan(i), oid));
                let want = if ev.event == EventType::Succeeded { plan(i).expect() } else { EventType::Rejected };
                expected.insert(oid.to_string(), want);
                offload_ids.insert(i, oid);
            }
        }
        if ev.event.is_final() {
            last_settled = tokio::time::Instant::now();
            let newest = settled.get(&ev.task_id).is_none_or(|(seq, _)| ev.seq >= *seq);
            if newest {
                settled.insert(ev.task_id.clone(), (ev.seq, ev.event));
            } else {
                println!("campaign: {id} ({p:?}) {:?} under seq {} read after {:?}: a second writer (the checker reports it)", ev.event, ev.seq, settled.get(&ev.task_id));
            }
            if kube_heavy(p) {
                scored.insert(ev.task_id.clone());
            }
            let then_revert =
                matches!(p, Plan::ScoreThenRevert | Plan::DeployThenRevert | Plan::ClusterThenRevert | Plan::TunnelThenRevert | Plan::OffloadThenRevert);
            if then_revert && ev.event == EventType::Succeeded && reverted.insert(id) {
                timed("a revert", client.control(ev.kind, &ev.subject, id, CommandAction::Revert, Some("campaign".into()))).await.unwrap();
            }
            // An undo that met a permanent error, or failed transiently for its whole
            // patience (10 min by default), ends RevertFailed; the operator's answer is to
            // revert again, as here.
            if newest && ev.event == EventType::RevertFailed {
                let n = revert_retries.entry(id).or_insert(0);
                *n += 1;
                assert!(*n <= 3, "task {id} failed to revert three times: {:?}", ev.message);
                println!("campaign: {id} RevertFailed ({:?}); reverting again", ev.message);
                timed("a revert", client.control(ev.kind, &ev.subject, id, CommandAction::Revert, Some("campaign".into()))).await.unwrap();
            }
        }
        let n = scored.len();
        let chaos: [(usize, &str); 10] = [
            (5, "kill a test worker"),
            (15, "hub answers 500"),
            (25, "kill a score worker"),
            (35, "broker outage"),
            (40, "broker fails requests"),
            (45, "hub answers 429"),
            (55, "hub slow, member-1 answers 500"),
            (65, "hub and member-1 recover"),
            (75, "hub and member-1 black out"),
            (85, "kill one worker of each kind"),
        ];
        while step < chaos.len() && n >= chaos[step].0 {
            println!("campaign: {:>5.1} s, {} of {TASKS} settled ({n} scorings): {}", started.elapsed().as_secs_f64(), settled.len(), chaos[step].1);
            match step {
                0 => workers.kill_and_replace(TaskKind::TEST),
                1 => faults.fail_next(12, 500),
                2 => workers.kill_and_replace(TaskKind::SCORE),
                3 => {
                    broker.all_down().unwrap();
                    // The outage's length, not a synchronisation.
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    broker.all_up().unwrap();
                    back_up = Some((std::time::Instant::now(), settled.len()));
                }
                4 => broker.fail_requests(20),
                5 => faults.fail_next(12, 429),
                6 => {
                    faults.set_latency(Duration::from_millis(300));
                    member_faults.fail_next(12, 500);
                }
                7 => {
                    faults.clear();
                    member_faults.clear();
                }
                8 => {
                    faults.blackout(Duration::from_secs(5));
                    member_faults.blackout(Duration::from_secs(3));
                }
                _ => {
                    workers.kill_and_replace(TaskKind::TEST);
                    workers.kill_and_replace(TaskKind::SCORE);
                    workers.kill_and_replace(TaskKind::DEPLOY);
                    workers.kill_and_replace(TaskKind::CREATE_CLUSTER);
                    workers.kill_and_replace(TaskKind::PEER);
                    workers.kill_and_replace(TaskKind::OFFLOAD);
                }
            }
            step += 1;
        }
    }
    assert_eq!(step, 10, "every fault was injected");
    println!("campaign: every task in its expected state after {:.1} s", started.elapsed().as_secs_f64());
    let (requests, injected) = faults.counts();
    assert!(injected >= 12, "the hub's faults were hit ({injected} of {requests} requests)");
    println!("campaign: {injected} of {requests} hub requests answered with a fault");
    let (requests, injected) = member_faults.counts();
    println!("campaign: {injected} of {requests} member-1 requests answered with a fault");

    // The durable state agrees with the events: nothing lost. A task a second worker wrote
    // (the window the checker reports below: a seq with two events, or two endings) may
    // have that worker's record last; it is reported with the window, and any other
    // disagreement fails.
    let second_writer: HashSet<String> = ferry_runtime::history::check(&history)
        .into_iter()
        .filter_map(|v| match v {
            ferry_runtime::history::Violation::SeqReused { task, .. } | ferry_runtime::history::Violation::EndedTwice { task, .. } => Some(task),
            _ => None,
        })
        .collect();
    // The end state may lag the events read (a task overtaken by another worker is taken
    // up again after a pause). Each task not yet in its expected state on the live view
    // gets a bounded wait, printed with its records; what is still off then fails below.
    let live = client.live_view().await.unwrap();
    // A fresh view holds what it has read so far: read everything first (before, it was
    // read at once and reported tasks "Accepted" whose later records it had not reached).
    live.caught_up(Duration::from_secs(120)).await.unwrap();
    let want_of = |id: &str| match expected[id] {
        EventType::Succeeded => TaskState::Succeeded,
        EventType::Reverted => TaskState::Reverted,
        EventType::Rejected => TaskState::Rejected,
        _ => TaskState::Cancelled,
    };
    for id in plans.keys() {
        let want = want_of(id);
        if let Ok(task) = id.parse::<TaskId>()
            && let Some(was) = live.get(task).map(|s| s.state).filter(|st| *st != want)
        {
            let r = live.wait_for(task, Duration::from_secs(120), |s| s.state == want).await;
            println!(
                "campaign: task {id} was {was:?} on the task-state topic; waited for {want:?}: {}\n{}",
                if r.is_ok() { "reached" } else { "not reached" },
                task_records(&client, &topics, &history, id).await
            );
        }
    }
    // What compaction keeps of a task is its last record, not its highest seq: a stale
    // writer's record landing after the owner's last one would be the task's state for any
    // reader that starts after compaction. Checked on the records as written.
    let mut snaps: HashMap<String, TaskState> = HashMap::new();
    for t in topics.task_states() {
        for (key, payload) in client.read_to_end(&t.name).await.unwrap() {
            let (Some(key), Ok(snap)) = (key, client.registry().decode::<ferry_runtime::TaskSnapshot>(&payload)) else { continue };
            snaps.insert(String::from_utf8_lossy(&key).into_owned(), snap.state);
        }
    }
    for (id, (p, _)) in &plans {
        let want = want_of(id);
        if snaps.get(id) != Some(&want) && second_writer.contains(id) {
            println!("campaign: task {id} ({p:?}) is {:?} on the task-state topic, not {want:?}: written by a second worker (reported below)", snaps.get(id));
            continue;
        }
        if snaps.get(id) != Some(&want) {
            panic!("task {id} ({p:?}) is {:?} in its last record on the task-state topic, not {want:?}\n{}", snaps.get(id), task_records(&client, &topics, &history, id).await);
        }
    }

    // Reverted scorings left no placement score behind: every remaining one belongs to a
    // scoring that stands.
    // Deployed apps stand; reverted ones left nothing on the hub or their cluster.
    let mut standing = 0;
    for (i, p) in (0..TASKS).map(|i| (i, plan(i))).filter(|(_, p)| matches!(p, Plan::Deploy | Plan::DeployThenRevert)) {
        let a = app(i);
        let id = deploy_ids[&i].to_string();
        let cluster = a.components[0].cluster.clone().unwrap();
        let member = fleet.cluster(&cluster).unwrap().client().await.unwrap();
        let lp = ListParams::default().labels(&format!("ferry.io/app={}", a.name));
        let works = Api::<ManifestWork>::all(hub.clone()).list(&lp).await.unwrap().items.len();
        let deployment = Api::<Deployment>::namespaced(member, &a.name).get_opt("web").await.unwrap();
        match expected[&id] {
            EventType::Succeeded => {
                standing += 1;
                assert_eq!(works, 1, "{} ({p:?}) has its ManifestWork", a.name);
                assert_eq!(deployment.and_then(|d| d.status?.ready_replicas), Some(1), "{} ({p:?}) runs on {cluster}", a.name);
            }
            _ => {
                assert_eq!(works, 0, "reverted {} ({p:?}) left a ManifestWork", a.name);
                assert!(deployment.is_none(), "reverted {} ({p:?}) left its Deployment on {cluster}", a.name);
            }
        }
    }
    println!("campaign: {standing} deployed apps stand, the reverted ones left nothing");

    // Created clusters exist once, with their kubeconfig; reverted ones left nothing.
    let mut created = 0;
    for (i, p) in (0..TASKS).map(|i| (i, plan(i))).filter(|(_, p)| matches!(p, Plan::Cluster | Plan::ClusterThenRevert)) {
        let c = cluster(i);
        let id = cluster_ids[&i].to_string();
        let left = ferry_testkit::cluster::leftovers(&hub, &c).await.unwrap();
        match expected[&id] {
            EventType::Succeeded => {
                created += 1;
                let clusters = Api::<ferry_kube::kinds::CapiCluster>::namespaced(hub.clone(), "campaign")
                    .list(&ListParams::default().labels(&format!("{}={}", ferry_cluster::render::CLUSTER_LABEL, c.name)))
                    .await
                    .unwrap();
                assert_eq!(clusters.items.len(), 1, "{} ({p:?}) exists exactly once", c.name);
                assert!(left.iter().any(|o| o.starts_with("Secret ")), "{} ({p:?}) has its kubeconfig Secret: {left:?}", c.name);
            }
            _ => assert!(left.is_empty(), "reverted {} ({p:?}) left {left:?} on the hub", c.name),
        }
    }
    println!("campaign: {created} created clusters exist once each, the reverted ones left nothing");

    // The Liqo peering stands: member-1 has a Ready virtual node of member-2. The reverted
    // tunnels left no Submariner object on the hub, and the clusters are still in their set.
    let peer_id = plans.values().find(|(p, _)| *p == Plan::Peer).map(|(_, id)| id.to_string()).unwrap();
    if expected[&peer_id] == EventType::Succeeded {
        let lp = ListParams::default().labels(ferry_peer::liqo::REMOTE_ID_LABEL);
        let virtual_nodes = Api::<Node>::all(m1.clone()).list(&lp).await.unwrap().items;
        assert!(virtual_nodes.iter().any(ferry_kube::kinds::node_ready), "member-1 has a Ready virtual node of member-2: {virtual_nodes:?}");
    }
    let configs = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("submarineraddon.open-cluster-management.io", "v1alpha1", "SubmarinerConfig"),
        "submarinerconfigs",
    );
    for c in ["member-1", "member-2"] {
        assert!(Api::<ManagedClusterAddOn>::namespaced(hub.clone(), c).get_opt("submariner").await.unwrap().is_none(), "a reverted tunnel left {c}'s add-on");
        assert!(
            Api::<DynamicObject>::namespaced_with(hub.clone(), c, &configs).get_opt("submariner").await.unwrap().is_none(),
            "a reverted tunnel left {c}'s SubmarinerConfig"
        );
        let mc = Api::<ManagedCluster>::all(hub.clone()).get(c).await.unwrap();
        let set = mc.metadata.labels.as_ref().and_then(|l| l.get(ferry_peer::submariner::CLUSTERSET_LABEL)).cloned();
        assert_eq!(set.as_deref(), Some("campaign"), "{c} is back in its ManagedClusterSet");
    }

    // Standing offloads are Ready with their twin on member-2; reverted ones left neither.
    let offloadings = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("offloading.liqo.io", "v1beta1", "NamespaceOffloading"), "namespaceoffloadings");
    let mut offloaded = 0;
    for (i, p) in (0..TASKS).map(|i| (i, plan(i))).filter(|(_, p)| matches!(p, Plan::Offload | Plan::OffloadThenRevert)) {
        let ns = offload(i).namespace;
        let o = Api::<DynamicObject>::namespaced_with(m1.clone(), &ns, &offloadings).get_opt("offloading").await.unwrap();
        let twin = Api::<Namespace>::all(m2.clone()).get_opt(&format!("{ns}-member-1")).await.unwrap();
        match expected[&offload_ids[&i].to_string()] {
            EventType::Succeeded => {
                offloaded += 1;
                assert_eq!(o.map(|o| o.data["status"]["offloadingPhase"].clone()), Some(serde_json::json!("Ready")), "{ns} ({p:?}) is offloaded");
                assert!(twin.is_some_and(|t| t.metadata.deletion_timestamp.is_none()), "{ns} ({p:?}) has its twin on member-2");
            }
            _ => {
                assert!(o.is_none(), "reverted {ns} ({p:?}) left its NamespaceOffloading");
                assert!(twin.is_none(), "reverted {ns} ({p:?}) left its twin namespace on member-2");
            }
        }
    }
    println!("campaign: the peering stands, the reverted tunnels left nothing, {offloaded} offloads stand and the reverted ones left nothing");

    let reverted: HashSet<String> = reverted.iter().chain(&failed_by_faults).map(TaskId::to_string).collect();
    let mut remaining = 0;
    for ns in ["member-1", "member-2"] {
        for aps in Api::<AddOnPlacementScore>::namespaced(hub.clone(), ns).list(&ListParams::default()).await.unwrap() {
            let task = aps.metadata.annotations.as_ref().and_then(|a| a.get(ferry_score::handler::TASK_ANNOTATION)).cloned().unwrap_or_default();
            assert!(!reverted.contains(&task), "{ns}/{:?} belongs to reverted task {task}", aps.metadata.name);
            remaining += 1;
        }
    }
    println!("campaign: {} tasks reverted; {remaining} placement scores remain, none of a reverted scoring", reverted.len());

    // Every object that appeared belongs to something that stands; nothing that was
    // there before is gone.
    let standing: Vec<String> = (0..TASKS)
        .filter_map(|i| match plan(i) {
            Plan::Deploy if expected[&deploy_ids[&i].to_string()] == EventType::Succeeded => Some(app(i).name),
            Plan::Cluster if expected[&cluster_ids[&i].to_string()] == EventType::Succeeded => Some(cluster(i).name),
            Plan::Offload if expected[&offload_ids[&i].to_string()] == EventType::Succeeded => Some(offload(i).namespace),
            _ => None,
        })
        .collect();
    let peered = expected[&peer_id] == EventType::Succeeded;
    for (name, was) in &before {
        let cluster = fleet.cluster(name).unwrap().client().await.unwrap();
        let now = Inventory::take(&cluster).await.unwrap();
        let unexplained: Vec<&ObjectRef> = was.added(&now).into_iter().filter(|(o, labels)| !explained(name, o, labels, &standing, peered)).map(|(o, _)| o).collect();
        // One whose deletion is under way is given time to go: Submariner's cleanup deletes
        // the operator's ManifestWork and lets the add-on go without waiting for it
        // (`cleanUpSubmarinerAgent`), and the work agent removes it once the namespace it
        // applied is gone. One that stays is left behind.
        let unexplained: Vec<String> = now.wait_deleted(&cluster, unexplained, Duration::from_secs(120)).await.into_iter().map(ToString::to_string).collect();
        assert!(unexplained.is_empty(), "{name} has objects no standing task explains (left behind): {unexplained:#?}");
        let gone: Vec<String> = was.removed(&now).into_iter().map(ToString::to_string).collect();
        assert!(gone.is_empty(), "{name} lost objects it had before the campaign: {gone:#?}");
        println!("campaign: {name}: {} objects added, every one explained; none removed", was.added(&now).len());
    }

    // The runtime's guarantees held through every fault: no seq carries two events, no task
    // ended twice, no two tasks of a subject overlapped, every event has its snapshot.
    let snapshots: HashMap<String, i64> = client.snapshots().await.unwrap().into_iter().map(|s| (s.task_id, s.seq)).collect();
    let mut violations = ferry_runtime::history::check(&history);
    violations.extend(ferry_runtime::history::check_snapshots(&history, &snapshots));
    // And outside Kafka: no two test workers ran steps of one task at once.
    let effects = ferry_runtime::effects::EffectLog::read(&workers.logs.join("effects")).unwrap();
    assert!(!effects.is_empty(), "the test workers recorded their step runs");
    let starts = effects.iter().filter(|e| e.phase == ferry_runtime::effects::Phase::Start).count();
    println!("campaign: {starts} step runs recorded by the test workers, {} of them runs again", ferry_runtime::effects::reruns(&effects));
    violations.extend(ferry_runtime::history::check_effects(&effects));
    println!("campaign: the history checker read {} events: {} violations", history.len(), violations.len());
    // By pattern (event types without workers), then the first few in full.
    let mut patterns: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    for v in &violations {
        let p = match v {
            ferry_runtime::history::Violation::SeqReused { events, .. } => {
                let ty = |e: &str| e.split(' ').next().unwrap_or_default().to_owned();
                format!("SeqReused {} / {}", ty(&events[0]), ty(&events[1]))
            }
            other => format!("{other:?}").split(' ').next().unwrap_or_default().to_owned(),
        };
        *patterns.entry(p).or_default() += 1;
    }
    for (p, n) in &patterns {
        println!("campaign:   {n:>4} {p}");
    }
    for v in violations.iter().take(5) {
        println!("campaign:   {v:?}");
    }
    // Asserted: no two tasks of a subject overlapped, every event has its snapshot.
    // Reported, not asserted: two workers writing one task (a seq with two events, a task
    // ended twice, two runners in the effect log). Until the intake served rebalance
    // callbacks while a batch's writes hung, and a lost assignment purged its writes, 110
    // to 150 seqs per run carried two workers' events (hidden by a dedupe on (task, seq));
    // runs now show 0 to 30, all from one case: a worker that joined a group just before
    // the broker outage. The embedded broker evicts a member whose JoinGroup it holds
    // past the session timeout (Kafka keeps such a member), and librdkafka checks the
    // session only in a settled group, so the evicted member learns it lost its partitions
    // only when its JoinGroup is answered. docs/ARCHITECTURE.md, "Guarantees", on the
    // window that remains; tests/runtime.rs asserts none in its lost-session scenario.
    // An event past its task's snapshot is asserted too, but for a task two workers wrote:
    // there the stale writer's snapshot may be the last record of the task (seen once, in
    // session 17: the evicted member's snapshot 15 after the owner's event 16), which is
    // that window again, reported above.
    let asserted: Vec<_> = violations
        .iter()
        .filter(|v| match v {
            ferry_runtime::history::Violation::SubjectOverlap { .. } => true,
            ferry_runtime::history::Violation::EventWithoutSnapshot { task, .. } => !second_writer.contains(task),
            _ => false,
        })
        .collect();
    assert!(asserted.is_empty(), "{} violations of the runtime's guarantees:\n{asserted:#?}", asserted.len());

    // No secret material on any topic.
    let tokens: Vec<String> = fleet
        .clusters
        .iter()
        .filter_map(|c| c.kubeconfig_inline().ok())
        .filter_map(|k| k.lines().find_map(|l| l.trim().strip_prefix("token: ").map(str::to_owned)))
        .collect();
    for t in topics.all() {
        for (_, payload) in client.read_to_end(&t.name).await.unwrap() {
            assert_eq!(ferry_runtime::secrets::find_with(&payload, &tokens), None, "secret material on {}", t.name);
        }
    }
    drop(workers);
    drop(events);
    drop(client);
    bed.stop().await;
}

//! The test bed every end-to-end test, demo and the campaign assemble the same way: a
//! fleet of real API servers (a hub and named members with emulated kubelets), the
//! emulated controllers a flow needs (OCM, Cluster API, Liqo, offloading), the embedded
//! broker, and workers run as tasks of the test (or as processes the test spawns on the
//! bed's broker and hub). Built with [`Bed::builder`]; `ferry dev` builds its fleet with it
//! too ([`BedBuilder::try_start`]).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ferry_fleet::admission::AdmissionServer;
use ferry_fleet::emulated_capi::{CapiOptions, EmulatedCapi};
use ferry_fleet::emulated_liqo::{EmulatedLiqo, LiqoKnobs};
use ferry_fleet::emulated_offloading::{EmulatedOffloading, OffloadingKnobs};
use ferry_fleet::emulated_ocm::EmulatedOcm;
use ferry_fleet::emulated_submariner::{EmulatedSubmariner, SubmarinerKnobs};
use ferry_fleet::{CrdSource, Fleet, FleetOptions, Kubelet, NodeFlavor};
use ferry_kube::Clusters;
use ferry_runtime::{Client, EmbeddedBroker, KafkaConfig, TaskHandler, Topics, Worker, WorkerOptions};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A member cluster's emulated nodes (members are named `member-1`, `member-2`, ... in
/// order, as the fleet names them).
#[derive(Debug, Clone)]
struct Member {
    nodes: usize,
    flavor: NodeFlavor,
}

/// What a [`Bed`] starts; every part is off unless asked for.
#[derive(Debug)]
#[must_use]
pub struct BedBuilder {
    members: Vec<Member>,
    kubeconfigs: bool,
    ocm: bool,
    capi: Option<CapiOptions>,
    liqo: Option<HashMap<String, LiqoKnobs>>,
    offloading: Option<HashMap<String, OffloadingKnobs>>,
    submariner: Option<HashMap<String, SubmarinerKnobs>>,
    brokers: i32,
    dir: Option<PathBuf>,
    pod_start_delay: Duration,
}

impl Default for BedBuilder {
    fn default() -> Self {
        Self {
            members: Vec::new(),
            kubeconfigs: false,
            ocm: false,
            capi: None,
            liqo: None,
            offloading: None,
            submariner: None,
            brokers: 1,
            dir: None,
            pod_start_delay: Duration::from_millis(100),
        }
    }
}

/// A part of the bed that did not start.
#[derive(Debug, thiserror::Error)]
pub enum BedError {
    /// The Kubernetes control plane is not installed.
    #[error("the test bed is not installed (scripts/install-testbed.sh)")]
    NotInstalled,
    /// A part failed to start.
    #[error("{part} did not start: {source}")]
    Part {
        /// Which part.
        part: &'static str,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

fn part<E: std::error::Error + Send + Sync + 'static>(part: &'static str) -> impl FnOnce(E) -> BedError {
    move |e| BedError::Part { part, source: Box::new(e) }
}

impl BedBuilder {
    /// `n` members `member-1` .. `member-n`, each with `nodes` default nodes.
    pub fn members(mut self, n: usize, nodes: usize) -> Self {
        self.members.extend((0..n).map(|_| Member { nodes, flavor: NodeFlavor::default() }));
        self
    }

    /// One more member, named `member-<k>` in order, with `nodes` nodes of `flavor`.
    pub fn member(mut self, nodes: usize, flavor: NodeFlavor) -> Self {
        self.members.push(Member { nodes, flavor });
        self
    }

    /// Writes each member's kubeconfig Secret on the hub, as Cluster API does, so
    /// workers reach members the way they do in production.
    pub fn kubeconfigs(mut self) -> Self {
        self.kubeconfigs = true;
        self
    }

    /// Emulated OCM (registration, work agents, placement) and OCM's hub admission
    /// webhooks.
    pub fn ocm(mut self) -> Self {
        self.ocm = true;
        self
    }

    /// Emulated Cluster API with `opts`, and its Cluster webhook.
    pub fn capi(mut self, opts: CapiOptions) -> Self {
        self.capi = Some(opts);
        self
    }

    /// Emulated Liqo on every member, `knobs` per member.
    pub fn liqo(mut self, knobs: HashMap<String, LiqoKnobs>) -> Self {
        self.liqo = Some(knobs);
        self
    }

    /// Emulated Liqo namespace offloading, `knobs` per member.
    pub fn offloading(mut self, knobs: HashMap<String, OffloadingKnobs>) -> Self {
        self.offloading = Some(knobs);
        self
    }

    /// The emulated Submariner add-on on the hub, `knobs` per managed cluster.
    pub fn submariner(mut self, knobs: HashMap<String, SubmarinerKnobs>) -> Self {
        self.submariner = Some(knobs);
        self
    }

    /// `n` mock brokers in the embedded cluster (1 unless asked).
    pub fn brokers(mut self, n: i32) -> Self {
        self.brokers = n;
        self
    }

    /// Keeps the fleet's state, certificates, kubeconfigs and logs in `dir` (a temporary
    /// directory unless asked).
    pub fn dir(mut self, dir: PathBuf) -> Self {
        self.dir = Some(dir);
        self
    }

    /// How long an emulated kubelet takes to start a pod (100 ms unless asked).
    pub fn pod_start_delay(mut self, delay: Duration) -> Self {
        self.pod_start_delay = delay;
        self
    }

    /// Starts it all. None when the test bed is not installed (outside CI; in CI that
    /// fails the test, see `report::missing_prerequisite`); a part that fails to start
    /// fails the test.
    pub async fn start(self) -> Option<Bed> {
        let _ = tracing_subscriber_init();
        match self.try_start().await {
            Ok(bed) => Some(bed),
            Err(BedError::NotInstalled) => {
                ferry_runtime::report::missing_prerequisite("the test bed is not installed (scripts/install-testbed.sh)");
                None
            }
            Err(e) => panic!("the test bed: {e}"),
        }
    }

    /// Starts it all, or says which part did not start.
    pub async fn try_start(self) -> Result<Bed, BedError> {
        if !ferry_fleet::binaries::Binaries::installed() {
            return Err(BedError::NotInstalled);
        }
        let fleet = Fleet::start(FleetOptions { dir: self.dir, crds: true, ..FleetOptions::hub_and(self.members.len()) }).await.map_err(part("the fleet"))?;
        let crds = fleet.install_crds().await.map_err(part("the CRDs"))?;
        if self.kubeconfigs {
            fleet.publish_kubeconfigs().await.map_err(part("the kubeconfig Secrets"))?;
        }
        let mut kubelets = Vec::new();
        for (m, c) in self.members.iter().zip(fleet.clusters.iter().skip(1)) {
            let k = Kubelet::start(&c.name, c.client().await.map_err(part("a member's client"))?, self.pod_start_delay);
            k.add_nodes("node", m.nodes, &m.flavor).await.map_err(part("a member's nodes"))?;
            kubelets.push(k);
        }
        // The hub's webhooks as Cluster API installs them (OCM's come with the emulated
        // hub): a topology without its class's required variables is refused.
        let admin = fleet.hub().client().await.map_err(part("the hub's client"))?;
        let mut validators = Vec::new();
        if self.capi.is_some() {
            validators.extend(ferry_fleet::webhooks_capi::validators(admin.clone()));
        }
        // Every cluster's: the upstream CRDs' CEL rules, which v1.20 cannot run.
        let cel = if crds == ferry_fleet::CrdSource::Upstream { ferry_fleet::webhooks_cel::validators() } else { Vec::new() };
        let cel_registrations: Vec<_> = cel.iter().map(|(r, _)| r.clone()).collect();
        validators.extend(cel);
        let admission = if validators.is_empty() {
            None
        } else {
            let registrations: Vec<_> = validators.iter().map(|(r, _)| r.clone()).collect();
            let server = AdmissionServer::start(validators).await.map_err(part("the hub's admission webhooks"))?;
            for r in &registrations {
                server.register(&admin, r).await.map_err(part("the hub's admission webhooks"))?;
            }
            for c in fleet.clusters.iter().skip(1) {
                let client = c.client().await.map_err(part("a member's client"))?;
                for r in &cel_registrations {
                    server.register(&client, r).await.map_err(part("a member's CEL webhooks"))?;
                }
            }
            Some(server)
        };
        // Liqo's offloading webhooks on every member, as Liqo's chart installs them: the
        // NamespaceOffloading's immutable fields; pods mutated at creation in namespaces
        // labelled for scheduling (`webhooks_liqo_offloading`).
        let mut liqo_admission = Vec::new();
        if self.offloading.is_some() {
            let mut members = Vec::new();
            for c in fleet.clusters.iter().skip(1) {
                members.push((c.name.clone(), c.client().await.map_err(part("a member's client"))?));
            }
            liqo_admission.push(ferry_fleet::webhooks_liqo_offloading::start(&members).await.map_err(part("Liqo's offloading webhooks"))?);
        }
        // Liqo's Tenant webhook on every member with Liqo (`webhooks_liqo`): one server per
        // member, whose validator reads that member's namespaces and Tenants.
        if self.liqo.is_some() {
            for c in fleet.clusters.iter().skip(1) {
                let client = c.client().await.map_err(part("a member's client"))?;
                let validators = ferry_fleet::webhooks_liqo::validators(client.clone());
                let registrations: Vec<_> = validators.iter().map(|(r, _)| r.clone()).collect();
                let server = AdmissionServer::start(validators).await.map_err(part("Liqo's Tenant webhook"))?;
                for r in &registrations {
                    server.register(&client, r).await.map_err(part("Liqo's Tenant webhook"))?;
                }
                liqo_admission.push(server);
            }
        }
        let ocm = if self.ocm { Some(EmulatedOcm::start(&fleet).await.map_err(part("emulated OCM"))?) } else { None };
        let capi = match self.capi {
            Some(opts) => Some(EmulatedCapi::start(&fleet, opts).await.map_err(part("emulated Cluster API"))?),
            None => None,
        };
        let liqo = match self.liqo {
            Some(knobs) => Some(EmulatedLiqo::start(&fleet, knobs).await.map_err(part("emulated Liqo"))?),
            None => None,
        };
        let offloading = match self.offloading {
            Some(knobs) => Some(EmulatedOffloading::start(&fleet, knobs).await.map_err(part("emulated offloading"))?),
            None => None,
        };
        let submariner = match self.submariner {
            Some(knobs) => Some(EmulatedSubmariner::start(&fleet, knobs).await.map_err(part("emulated Submariner"))?),
            None => None,
        };
        let topics = Topics::standard();
        let broker = EmbeddedBroker::start(self.brokers, &topics).map_err(part("the embedded broker"))?;
        let kafka = KafkaConfig::for_embedded(broker.bootstrap());
        Ok(Bed {
            admission,
            liqo_admission,
            crds,
            clusters: Arc::new(Clusters::new(admin)),
            fleet,
            kubelets,
            ocm,
            capi,
            liqo,
            offloading,
            submariner,
            broker: Some(broker),
            kafka,
            topics,
            stop: CancellationToken::new(),
            workers: Vec::new(),
        })
    }
}

fn tracing_subscriber_init() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .with_test_writer()
        .try_init()
}

/// A running test bed; [`Bed::stop`] stops its workers, and dropping it stops the rest
/// (fields drop in order: the emulators before the API servers they watch).
pub struct Bed {
    /// The members' emulated kubelets.
    pub kubelets: Vec<Kubelet>,
    /// Emulated OCM, when asked for.
    pub ocm: Option<EmulatedOcm>,
    /// Emulated Cluster API, when asked for.
    pub capi: Option<EmulatedCapi>,
    /// Emulated Liqo, when asked for.
    pub liqo: Option<EmulatedLiqo>,
    /// Emulated offloading, when asked for.
    pub offloading: Option<EmulatedOffloading>,
    /// The emulated Submariner add-on, when asked for.
    pub submariner: Option<EmulatedSubmariner>,
    /// The hub's admission webhooks (OCM's with OCM, Cluster API's with Cluster API).
    pub admission: Option<AdmissionServer>,
    /// Liqo's webhooks on the members (the Tenant's with Liqo, the offloading ones with
    /// offloading).
    pub liqo_admission: Vec<AdmissionServer>,
    /// The hub's client and the members' through their kubeconfig Secrets.
    pub clusters: Arc<Clusters>,
    broker: Option<EmbeddedBroker>,
    /// How to reach the embedded broker.
    pub kafka: KafkaConfig,
    /// The topics.
    pub topics: Topics,
    stop: CancellationToken,
    workers: Vec<JoinHandle<()>>,
    /// Whose CRDs the API servers serve (upstream's unless `../shared` is absent).
    pub crds: CrdSource,
    /// The clusters: the hub first, then the members.
    pub fleet: Fleet,
}

impl std::fmt::Debug for Bed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bed").field("clusters", &self.fleet.clusters.len()).field("workers", &self.workers.len()).finish_non_exhaustive()
    }
}

impl Bed {
    /// A bed of a hub alone; add members and parts with the builder's methods.
    pub fn builder() -> BedBuilder {
        BedBuilder::default()
    }

    /// A Ferry client on the bed's broker.
    pub fn client(&self) -> Client {
        Client::new(self.kafka.clone(), self.topics.clone()).expect("a client of the embedded broker")
    }

    /// The embedded broker (for outages and request faults).
    pub fn broker(&self) -> &EmbeddedBroker {
        self.broker.as_ref().expect("the broker runs until the bed stops")
    }

    /// A new client of the hub.
    pub async fn hub(&self) -> kube::Client {
        self.fleet.hub().client().await.expect("hub client")
    }

    /// A new client of cluster `name`.
    pub async fn cluster(&self, name: &str) -> kube::Client {
        self.fleet.cluster(name).unwrap_or_else(|| panic!("no cluster {name} in the bed")).client().await.expect("cluster client")
    }

    /// Worker options on the bed's broker (2 s shutdown grace).
    pub fn worker_options(&self) -> WorkerOptions {
        let mut opts = WorkerOptions::new(self.kafka.clone());
        opts.topics = self.topics.clone();
        opts.shutdown_grace = Duration::from_secs(2);
        opts
    }

    /// Runs `handler` as a worker until [`Bed::stop`], with [`Bed::worker_options`].
    pub fn run_worker<H: TaskHandler>(&mut self, handler: H) {
        let handle = self.spawn_worker(self.worker_options(), handler);
        self.workers.push(handle);
    }

    /// Runs `handler` with `opts` and hands back its task, for a test that aborts it to
    /// lose the worker without a graceful stop. It stops with the bed too.
    pub fn spawn_worker<H: TaskHandler>(&self, opts: WorkerOptions, handler: H) -> JoinHandle<()> {
        let stop = self.stop.clone();
        let kind = handler.kind();
        tokio::spawn(async move { Worker::new(opts, handler).run(stop).await.unwrap_or_else(|e| panic!("the {kind} worker failed: {e}")) })
    }

    /// Stops `worker` (one [`Bed::spawn_worker`] started) with the bed: [`Bed::stop`]
    /// awaits it before the broker goes.
    pub fn adopt(&mut self, worker: JoinHandle<()>) {
        self.workers.push(worker);
    }

    /// Stops the workers it runs (each finishes or stops its task), then the broker.
    pub async fn stop(mut self) {
        self.stop.cancel();
        for w in self.workers.drain(..) {
            w.await.expect("a worker's task ends cleanly");
        }
        drop(self.broker.take());
    }
}

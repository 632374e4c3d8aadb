//! The test bed every end-to-end test, demo and the campaign assemble the same way: a
//! fleet of real API servers (a hub and named members with emulated kubelets), the
//! emulated controllers a flow needs (OCM, Cluster API, Liqo, offloading), the embedded
//! broker, and workers run as tasks of the test. Built with [`Bed::builder`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ferry_fleet::emulated_capi::{CapiOptions, EmulatedCapi};
use ferry_fleet::emulated_liqo::{EmulatedLiqo, LiqoKnobs};
use ferry_fleet::emulated_offloading::{EmulatedOffloading, OffloadingKnobs};
use ferry_fleet::emulated_ocm::EmulatedOcm;
use ferry_fleet::{Fleet, FleetOptions, Kubelet, NodeFlavor};
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
#[derive(Debug, Default)]
#[must_use]
pub struct BedBuilder {
    members: Vec<Member>,
    kubeconfigs: bool,
    ocm: bool,
    capi: Option<CapiOptions>,
    liqo: Option<HashMap<String, LiqoKnobs>>,
    offloading: Option<HashMap<String, OffloadingKnobs>>,
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

    /// Emulated OCM (registration, work agents, placement).
    pub fn ocm(mut self) -> Self {
        self.ocm = true;
        self
    }

    /// Emulated Cluster API with `opts`.
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

    /// Starts it all. None when the test bed is not installed (outside CI; in CI that
    /// fails the test, see `report::missing_prerequisite`).
    pub async fn start(self) -> Option<Bed> {
        let _ = tracing_subscriber_init();
        if !ferry_fleet::binaries::Binaries::installed() {
            ferry_runtime::report::missing_prerequisite("the test bed is not installed (scripts/install-testbed.sh)");
            return None;
        }
        let fleet = Fleet::start(FleetOptions::hub_and(self.members.len())).await.expect("the fleet starts");
        fleet.install_crds().await.expect("CRDs install");
        if self.kubeconfigs {
            fleet.publish_kubeconfigs().await.expect("kubeconfig Secrets are written");
        }
        let mut kubelets = Vec::new();
        for (m, c) in self.members.iter().zip(fleet.clusters.iter().skip(1)) {
            let k = Kubelet::start(&c.name, c.client().await.expect("member client"), Duration::from_millis(100));
            k.add_nodes("node", m.nodes, &m.flavor).await.expect("nodes are added");
            kubelets.push(k);
        }
        let ocm = if self.ocm { Some(EmulatedOcm::start(&fleet).await.expect("emulated OCM starts")) } else { None };
        let capi = match self.capi {
            Some(opts) => Some(EmulatedCapi::start(&fleet, opts).await.expect("emulated Cluster API starts")),
            None => None,
        };
        let liqo = match self.liqo {
            Some(knobs) => Some(EmulatedLiqo::start(&fleet, knobs).await.expect("emulated Liqo starts")),
            None => None,
        };
        let offloading = match self.offloading {
            Some(knobs) => Some(EmulatedOffloading::start(&fleet, knobs).await.expect("emulated offloading starts")),
            None => None,
        };
        let topics = Topics::standard();
        let broker = EmbeddedBroker::start(1, &topics).expect("the embedded broker starts");
        let kafka = KafkaConfig::for_embedded(broker.bootstrap());
        let hub = fleet.hub().client().await.expect("hub client");
        Some(Bed {
            clusters: Arc::new(Clusters::new(hub)),
            fleet,
            kubelets,
            ocm,
            capi,
            liqo,
            offloading,
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

/// A running test bed; [`Bed::stop`] stops its workers, and dropping it stops the rest.
pub struct Bed {
    /// The clusters: the hub first, then the members.
    pub fleet: Fleet,
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
    /// The hub's client and the members' through their kubeconfig Secrets.
    pub clusters: Arc<Clusters>,
    broker: Option<EmbeddedBroker>,
    /// How to reach the embedded broker.
    pub kafka: KafkaConfig,
    /// The topics.
    pub topics: Topics,
    stop: CancellationToken,
    workers: Vec<JoinHandle<()>>,
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

    /// Stops the workers it runs (each finishes or stops its task), then the broker.
    pub async fn stop(mut self) {
        self.stop.cancel();
        for w in self.workers.drain(..) {
            w.await.expect("a worker's task ends cleanly");
        }
        drop(self.broker.take());
    }
}

//! Starts one etcd and N Kubernetes control planes (hub + managed clusters) on loopback,
//! each isolated by its own etcd prefix, certificates, token and kubeconfig.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use kube::Client;

use crate::binaries::{Binaries, Missing};
use crate::process::{Managed, free_port};

/// Why a fleet could not start.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// A binary is not installed.
    #[error(transparent)]
    Missing(#[from] Missing),
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The client CA could not be made.
    #[error("making the client CA: {0}")]
    ClientCa(String),
    /// openssl could not make the service-account key pair.
    #[error("openssl failed making the service-account keys in {0}")]
    Keys(PathBuf),
    /// A cluster did not become ready: its API server never answered `/readyz` within the
    /// bound, or one of its processes exited first.
    #[error("cluster {cluster} ({server}) not ready after {waited:?}{} (log: {log}); the log's last lines:\n{tail}", if *exited { ": a process of it exited" } else { "" })]
    NotReady {
        /// The cluster.
        cluster: String,
        /// Its API server's address.
        server: String,
        /// How long we waited.
        waited: Duration,
        /// A process of the cluster exited before it was ready.
        exited: bool,
        /// Where its API server logs.
        log: String,
        /// The last lines of that log: the fleet's directory is gone once the test ends
        /// (a member once stayed unreachable for 240 s with its process alive, in CI, and
        /// nothing told why).
        tail: String,
    },
    /// The fleet has no cluster of that name.
    #[error("the fleet has no cluster {0}")]
    NoCluster(String),
    /// The fleet's etcd did not answer within the bound, or exited first.
    #[error("etcd ({url}) not ready after {waited:?}{} (log: {log}); the log's last lines:\n{tail}", if *exited { ": it exited" } else { "" })]
    EtcdNotReady {
        /// Its client URL.
        url: String,
        /// How long we waited.
        waited: Duration,
        /// It exited before it answered.
        exited: bool,
        /// Where it logs.
        log: String,
        /// The last lines of that log (the fleet's directory goes with the test).
        tail: String,
    },
    /// The CRDs could not be put into the clusters' store before they started.
    #[error("preloading the CRDs: {0}")]
    Seed(#[from] crate::crd_seed::SeedError),
    /// A kube client could not be built.
    #[error("kube client for {cluster}: {source}")]
    Client {
        /// The cluster.
        cluster: String,
        /// Cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> FleetError {
    let what = what.into();
    move |source| FleetError::Io { what, source }
}

/// What to start.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    /// Cluster names; the first is the hub.
    pub clusters: Vec<String>,
    /// Where state, certificates, kubeconfigs and logs go; a temporary directory if None.
    pub dir: Option<PathBuf>,
    /// Run kube-controller-manager and kube-scheduler per cluster.
    pub controllers: bool,
    /// Every cluster starts with the CRDs [`Fleet::install_crds`] installs already stored,
    /// as a server restarted after their install would ([`crate::crd_seed`]: an API server
    /// takes them at start for a fraction of the CPU of installing them while it runs).
    pub crds: bool,
}

impl Default for FleetOptions {
    fn default() -> Self {
        Self { clusters: vec!["hub".into(), "member-1".into(), "member-2".into()], dir: None, controllers: true, crds: false }
    }
}

impl FleetOptions {
    /// A hub and `n` managed clusters named member-1..n.
    pub fn hub_and(n: usize) -> Self {
        let mut clusters = vec!["hub".to_owned()];
        clusters.extend((1..=n).map(|i| format!("member-{i}")));
        Self { clusters, ..Self::default() }
    }
}

/// One cluster of the fleet: a real API server.
#[derive(Debug)]
pub struct Cluster {
    /// Its name.
    pub name: String,
    /// `https://127.0.0.1:PORT`.
    pub server: String,
    /// A kubeconfig file with an admin token.
    pub kubeconfig: PathBuf,
    /// The API server's log file.
    pub log: PathBuf,
    processes: Vec<Managed>,
    sa_key: PathBuf,
    ca: PathBuf,
    dir: PathBuf,
    /// The API server's arguments, to start it again ([`Fleet::revive`]).
    apiserver_args: Vec<String>,
    /// Whether its controllers run (started again with it).
    controllers: bool,
    /// While stopped: its port, bound (not listening) so that no other socket takes it
    /// before it comes back, and every connection to it is refused as to a gone cluster.
    held_port: Option<socket2::Socket>,
}

impl Cluster {
    /// The admin kubeconfig with the CA inlined, usable from anywhere on this machine.
    pub fn kubeconfig_inline(&self) -> Result<String, FleetError> {
        use base64::Engine;
        let text = std::fs::read_to_string(&self.kubeconfig).map_err(io(format!("reading {}", self.kubeconfig.display())))?;
        let ca = std::fs::read(&self.ca).map_err(io(format!("reading {}", self.ca.display())))?;
        let data = base64::engine::general_purpose::STANDARD.encode(ca);
        Ok(text.replace(&format!("certificate-authority: {}", self.ca.display()), &format!("certificate-authority-data: {data}")))
    }

    /// The CA (PEM) of the API server's serving certificate.
    pub fn ca_pem(&self) -> Result<Vec<u8>, FleetError> {
        std::fs::read(&self.ca).map_err(io(format!("reading {}", self.ca.display())))
    }

    /// A new `kube` client for this cluster (admin).
    pub async fn client(&self) -> Result<Client, FleetError> {
        client_for(&self.name, &self.kubeconfig).await
    }

    /// A client for the Eviction API, whose 429 it gets at once. kube's clients retry 429,
    /// 503 and 504 by default (`Config::default_retry`: up to 15 times, 5 ms doubling,
    /// about 164 s), and a PodDisruptionBudget's refusal of an eviction is a 429 without a
    /// Retry-After (`pkg/registry/core/pod/storage/eviction.go`), which client-go does not
    /// retry: an upstream controller's drain sees the refusal at once and requeues, where
    /// an emulator's pass would hang in the retries.
    pub async fn evicting_client(&self) -> Result<Client, FleetError> {
        self.client_with(|_| {}, |config| config.default_retry = false).await
    }

    /// A client that acts as `user` in `groups` (the admin impersonating them), so RBAC
    /// and admission webhooks see that identity, as they would a worker's service account.
    pub async fn client_as(&self, user: &str, groups: &[&str]) -> Result<Client, FleetError> {
        let impersonate = |kc: &mut kube::config::Kubeconfig| {
            for named in &mut kc.auth_infos {
                if let Some(a) = named.auth_info.as_mut() {
                    a.impersonate = Some(user.to_owned());
                    a.impersonate_groups = Some(groups.iter().map(|g| (*g).to_owned()).collect());
                }
            }
        };
        self.client_with(impersonate, |_| {}).await
    }

    /// A client from the admin kubeconfig, edited by `kubeconfig`, its `kube::Config` then
    /// edited by `config`.
    async fn client_with(&self, kubeconfig: impl FnOnce(&mut kube::config::Kubeconfig), config: impl FnOnce(&mut kube::Config)) -> Result<Client, FleetError> {
        use kube::config::{KubeConfigOptions, Kubeconfig};
        let err = |e: Box<dyn std::error::Error + Send + Sync>| FleetError::Client { cluster: self.name.clone(), source: e };
        let mut kc = Kubeconfig::read_from(&self.kubeconfig).map_err(|e| err(Box::new(e)))?;
        kubeconfig(&mut kc);
        let mut c = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await.map_err(|e| err(Box::new(e)))?;
        config(&mut c);
        Client::try_from(c).map_err(|e| err(Box::new(e)))
    }
}

/// A `kube` client from a kubeconfig file.
pub async fn client_for(cluster: &str, kubeconfig: &Path) -> Result<Client, FleetError> {
    ferry_kube::clusters::client_from_file(kubeconfig).await.map_err(|source| FleetError::Client { cluster: cluster.to_owned(), source })
}

/// Where a fleet's CRDs came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrdSource {
    /// Upstream's CRDs from `../shared/crds`: their schemas validate every write.
    Upstream,
    /// The project's open-schema subset: `../shared/crds` was absent, so nothing written
    /// to these kinds is validated.
    ProjectSubset,
}

impl std::fmt::Display for CrdSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Upstream => "upstream, from ../shared/crds",
            Self::ProjectSubset => "the project's open-schema stand-ins (../shared/crds absent)",
        })
    }
}

/// A running fleet; everything stops when it is dropped.
#[derive(Debug)]
pub struct Fleet {
    /// The clusters, hub first.
    pub clusters: Vec<Cluster>,
    /// Where its files are.
    pub dir: PathBuf,
    etcd_url: String,
    bins: Binaries,
    /// Where the CRDs stored before start came from ([`FleetOptions::crds`]).
    preloaded: Option<CrdSource>,
    _etcd: Managed,
    _tmp: Option<tempfile::TempDir>,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        // Signal every process at once; each Managed then waits for its own exit.
        for c in &mut self.clusters {
            c.processes.iter_mut().for_each(Managed::begin_stop);
        }
    }
}

impl Fleet {
    /// Starts etcd and every cluster, and waits until each API server is ready.
    pub async fn start(opts: FleetOptions) -> Result<Self, FleetError> {
        // kube's rustls needs a process-wide crypto provider.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let bins = Binaries::locate()?;
        let (tmp, dir) = match &opts.dir {
            Some(d) => {
                // A second start reuses nothing stale: a fleet's state is per run.
                let _ = std::fs::remove_dir_all(d);
                std::fs::create_dir_all(d).map_err(io(format!("creating {}", d.display())))?;
                (None, d.clone())
            }
            None => {
                let t = tempfile::Builder::new().prefix("ferry-fleet-").tempdir().map_err(io("creating a temp dir"))?;
                let d = t.path().to_owned();
                (Some(t), d)
            }
        };
        let (etcd, etcd_url) = start_etcd(&bins, &dir, None).await?;
        let preloaded = if opts.crds {
            let etcd = crate::crd_seed::Etcd::new(&etcd_url);
            let (crds, source) = fleet_crds()?;
            let seed = crd_seed(&bins, &dir, &etcd, &crds).await?;
            for name in &opts.clusters {
                seed.write(&etcd, &etcd_prefix(name)).await?;
            }
            Some(source)
        } else {
            None
        };
        let mut clusters = Vec::new();
        for name in &opts.clusters {
            clusters.push(start_cluster(&bins, &dir, name, name, &etcd_url)?);
        }
        let mut fleet = Self { clusters, dir, etcd_url, bins: bins.clone(), preloaded, _etcd: etcd, _tmp: tmp };
        for c in &mut fleet.clusters {
            ready_or_restarted(c, &fleet.bins, &fleet.etcd_url).await?;
            // They read the API server's certificate, which exists only once it serves.
            if opts.controllers {
                c.start_controllers(&bins)?;
            }
        }
        Ok(fleet)
    }

    /// What starts more clusters on this fleet's etcd (for emulated Cluster API).
    pub fn spawner(&self) -> ClusterSpawner {
        ClusterSpawner { bins: self.bins.clone(), dir: self.dir.clone(), etcd_url: self.etcd_url.clone() }
    }

    /// The hub (first cluster).
    pub fn hub(&self) -> &Cluster {
        &self.clusters[0]
    }

    /// Installs the CRDs of every kind Ferry's workers and the emulators touch on every
    /// cluster: upstream's (`../shared/crds`, adapted for v1.20 by [`crate::crds`]) when
    /// they are beside the project, so the API servers validate what is written as a real
    /// install would; else the project's open-schema subset, and the returned
    /// [`CrdSource`] says so.
    /// A fleet started with [`FleetOptions::crds`] has them already: this only says where
    /// they came from.
    pub async fn install_crds(&self) -> Result<CrdSource, FleetError> {
        if let Some(source) = self.preloaded {
            return Ok(source);
        }
        let (crds, source) = fleet_crds()?;
        self.install_everywhere(&crds).await?;
        Ok(source)
    }

    /// Installs the project's CRD subset ([`crate::kinds`]) on every cluster.
    pub async fn install_project_crds(&self) -> Result<(), FleetError> {
        self.install_everywhere(&crate::kinds::crds()).await
    }

    /// Installs `crds` on every cluster through its API.
    async fn install_everywhere(&self, crds: &[serde_json::Value]) -> Result<(), FleetError> {
        for c in &self.clusters {
            let client = c.client().await?;
            crate::crds::install(&client, crds.to_vec()).await.map_err(|e| FleetError::Client { cluster: c.name.clone(), source: Box::new(e) })?;
        }
        Ok(())
    }

    /// A cluster by name.
    pub fn cluster(&self, name: &str) -> Option<&Cluster> {
        self.clusters.iter().find(|c| c.name == name)
    }

    /// A cluster by name, to stop it ([`Cluster::stop`]).
    pub fn cluster_mut(&mut self, name: &str) -> Option<&mut Cluster> {
        self.clusters.iter_mut().find(|c| c.name == name)
    }

    /// Starts a cluster [`Cluster::stop`]ped earlier again, as a cluster that comes back:
    /// the same address, store, certificates and credentials, its controllers if it had
    /// them. Returns once its API server is ready.
    pub async fn revive(&mut self, name: &str) -> Result<(), FleetError> {
        let bins = self.bins.clone();
        let c = self.clusters.iter_mut().find(|c| c.name == name).ok_or_else(|| FleetError::NoCluster(name.to_owned()))?;
        if !c.processes.is_empty() {
            return Ok(());
        }
        c.held_port.take();
        c.processes.push(Managed::spawn(&format!("{name}/kube-apiserver"), &bins.apiserver, &c.apiserver_args, &c.log).map_err(io(format!("starting {name}'s kube-apiserver again")))?);
        wait_ready(c).await?;
        if c.controllers {
            c.start_controllers(&bins)?;
        }
        Ok(())
    }

    /// Writes each managed cluster's kubeconfig into the hub as Cluster API does: Secret
    /// `<name>-kubeconfig` (key `value`, label `cluster.x-k8s.io/cluster-name`, type
    /// `cluster.x-k8s.io/secret`) in [`KUBECONFIG_NAMESPACE`], so workers reach clusters the
    /// way they would in production. Workers use only Secrets Cluster API made
    /// (`ferry_kube::clusters::capi_secret`): each member gets the KubeadmControlPlane
    /// `<name>-control-plane` a kubeadm-made cluster has on the hub, whose controller
    /// reference owns the Secret as upstream's `reconcileKubeconfig` makes it
    /// (`controlplane/kubeadm/reconcilers/kubeadmcontrolplane/helpers.go`). Members get no
    /// `Cluster`: emulated Cluster API would provision one again. Needs the Cluster API
    /// CRDs ([`Fleet::install_crds`]).
    pub async fn publish_kubeconfigs(&self) -> Result<(), FleetError> {
        use k8s_openapi::api::core::v1::{Namespace, Secret};
        use kube::api::{Api, DynamicObject, Patch, PatchParams};
        use kube::core::{ApiResource, GroupVersionKind};
        let hub = self.hub().client().await?;
        let err = |e: kube::Error| FleetError::Client { cluster: "hub".into(), source: Box::new(e) };
        let pp = PatchParams::apply("ferry-fleet").force();
        let ns = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUBECONFIG_NAMESPACE}});
        Api::<Namespace>::all(hub.clone()).patch(KUBECONFIG_NAMESPACE, &pp, &Patch::Apply(&ns)).await.map_err(err)?;
        let secrets: Api<Secret> = Api::namespaced(hub.clone(), KUBECONFIG_NAMESPACE);
        let kcp = ApiResource::from_gvk(&GroupVersionKind::gvk("controlplane.cluster.x-k8s.io", "v1beta2", "KubeadmControlPlane"));
        let kcps: Api<DynamicObject> = Api::namespaced_with(hub, KUBECONFIG_NAMESPACE, &kcp);
        // Cluster API's own field manager: a test that re-points a Secret (applying
        // `kubeconfig_secret` as `ferry-fleet`) leaves its owner reference in place.
        let capi = PatchParams::apply(MEMBER_CAPI_MANAGER).force();
        for c in self.clusters.iter().skip(1) {
            let version = c.client().await?.apiserver_version().await.map_err(|e| FleetError::Client { cluster: c.name.clone(), source: Box::new(e) })?;
            let cp_name = format!("{}-control-plane", c.name);
            let cp = serde_json::json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta2", "kind": "KubeadmControlPlane",
                "metadata": {"name": cp_name, "labels": {"cluster.x-k8s.io/cluster-name": c.name}},
                "spec": {"version": version.git_version, "replicas": 1,
                    "machineTemplate": {"spec": {"infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachineTemplate", "name": cp_name}}}}});
            let cp = kcps.patch(&cp_name, &capi, &Patch::Apply(&cp)).await.map_err(err)?;
            let owner = serde_json::json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta2", "kind": "KubeadmControlPlane", "name": cp_name,
                "uid": cp.metadata.uid, "controller": true, "blockOwnerDeletion": true});
            let secret = kubeconfig_secret_owned(&c.name, &c.kubeconfig_inline()?, owner);
            let name = format!("{}-kubeconfig", c.name);
            secrets.patch(&name, &capi, &Patch::Apply(&secret)).await.map_err(err)?;
        }
        Ok(())
    }
}

/// Starts clusters on a fleet's etcd after the fleet started; valid while the fleet runs.
#[derive(Debug, Clone)]
pub struct ClusterSpawner {
    bins: Binaries,
    dir: PathBuf,
    etcd_url: String,
}

impl ClusterSpawner {
    /// Starts one more cluster and waits until it serves; it stops when the returned value
    /// is dropped. `controllers`: also a controller manager and a scheduler.
    pub async fn spawn(&self, name: &str, controllers: bool) -> Result<Cluster, FleetError> {
        // Its own etcd prefix and folder per incarnation: a cluster created again under
        // the same name starts empty, as a newly provisioned one would.
        let instance = format!("{name}-{:08x}", rand_u128() as u32);
        let mut c = start_cluster(&self.bins, &self.dir, name, &instance, &self.etcd_url)?;
        ready_or_restarted(&mut c, &self.bins, &self.etcd_url).await?;
        if controllers {
            c.start_controllers(&self.bins)?;
        }
        Ok(c)
    }
}

/// The CRDs [`Fleet::install_crds`] installs: upstream's when `../shared/crds` is beside
/// the project, else the project's open-schema subset (never in CI, where its absence
/// fails: a weaker test must not pass for the real one).
fn fleet_crds() -> Result<(Vec<serde_json::Value>, CrdSource), FleetError> {
    let Some(shared) = crate::crds::shared_dir() else {
        if std::env::var_os("CI").is_some() {
            return Err(FleetError::Client { cluster: "all".into(), source: "../shared/crds is missing in CI: the upstream CRDs are required".into() });
        }
        return Ok((crate::kinds::crds(), CrdSource::ProjectSubset));
    };
    let crds = crate::crds::upstream_subset(&shared).map_err(|e| FleetError::Client { cluster: "all".into(), source: Box::new(e) })?;
    Ok((crds, CrdSource::Upstream))
}

/// The stored form of `crds` ([`crate::crd_seed`]): cached, else recorded on a throwaway
/// API server of this fleet's etcd that installs them through its API, then cached.
async fn crd_seed(bins: &Binaries, dir: &Path, etcd: &crate::crd_seed::Etcd, crds: &[serde_json::Value]) -> Result<crate::crd_seed::Seed, FleetError> {
    let file = crate::crd_seed::cache_file(&crate::binaries::cache_dir(), crds, &bins.apiserver);
    if let Some(seed) = crate::crd_seed::load(&file) {
        return Ok(seed);
    }
    let instance = format!("crd-seed-{:08x}", rand_u128() as u32);
    let mut c = start_cluster(bins, dir, "crd-seed", &instance, etcd.url())?;
    ready_or_restarted(&mut c, bins, etcd.url()).await?;
    crate::crds::install(&c.client().await?, crds.to_vec()).await.map_err(|e| FleetError::Client { cluster: c.name.clone(), source: Box::new(e) })?;
    let seed = crate::crd_seed::Seed::read(etcd, &etcd_prefix(&instance)).await?;
    if seed.len() != crds.len() {
        return Err(crate::crd_seed::SeedError::Incomplete { stored: seed.len(), wanted: crds.len() }.into());
    }
    crate::crd_seed::store(&file, &seed);
    Ok(seed)
}

/// Namespace of the hub where [`Fleet::publish_kubeconfigs`] writes kubeconfig Secrets.
pub const KUBECONFIG_NAMESPACE: &str = "ferry-fleet";

/// Field manager of the members' control planes and kubeconfig Secrets.
const MEMBER_CAPI_MANAGER: &str = "ferry-fleet-capi";

/// [`kubeconfig_secret`] owned by `owner` (an owner reference), as Cluster API writes it
/// (`util/kubeconfig/kubeconfig.go` `GenerateSecretWithOwner`): the Cluster (core
/// controller) or, as controller, its control plane (the control plane provider).
pub fn kubeconfig_secret_owned(cluster: &str, kubeconfig: &str, owner: serde_json::Value) -> serde_json::Value {
    let mut s = kubeconfig_secret(cluster, kubeconfig);
    s["metadata"]["ownerReferences"] = serde_json::json!([owner]);
    s
}

/// A Cluster API kubeconfig Secret (`<cluster>-kubeconfig`, key `value`) as JSON for SSA,
/// without its owner (workers refuse it until it has one: [`kubeconfig_secret_owned`]).
pub fn kubeconfig_secret(cluster: &str, kubeconfig: &str) -> serde_json::Value {
    use base64::Engine;
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": format!("{cluster}-kubeconfig"),
            "labels": {"cluster.x-k8s.io/cluster-name": cluster},
        },
        "type": "cluster.x-k8s.io/secret",
        "data": {"value": base64::engine::general_purpose::STANDARD.encode(kubeconfig)},
    })
}

impl Cluster {
    fn start_controllers(&mut self, bins: &Binaries) -> Result<(), FleetError> {
        self.controllers = true;
        let (name, dir, sa_key, ca, kubeconfig) = (&self.name, &self.dir, &self.sa_key, &self.ca, &self.kubeconfig);
        let d = |p: &Path| p.display().to_string();
        let processes = &mut self.processes;
        processes.push(
            Managed::spawn(
                &format!("{name}/kube-controller-manager"),
                &bins.controller_manager,
                &[
                    format!("--kubeconfig={}", d(kubeconfig)),
                    // csrsigning: the signer of `kubernetes.io/kube-apiserver-client` CSRs
                    // (OCM's registration agents get their hub certificates through it).
                    // disruption: computes PodDisruptionBudgets' status, without which the
                    // API server refuses every eviction a budget covers (Liqo's drain of a
                    // virtual node evicts).
                    "--controllers=namespace,garbagecollector,deployment,replicaset,daemonset,job,serviceaccount,serviceaccount-token,csrsigning,disruption".into(),
                    format!("--service-account-private-key-file={}", d(sa_key)),
                    format!("--cluster-signing-cert-file={}", d(&dir.join(CLIENT_CA_CERT))),
                    format!("--cluster-signing-key-file={}", d(&dir.join(CLIENT_CA_KEY))),
                    format!("--root-ca-file={}", d(ca)),
                    "--leader-elect=false".into(),
                    "--use-service-account-credentials=false".into(),
                    "--secure-port=0".into(),
                    "--port=0".into(),
                ],
                &dir.join("controller-manager.log"),
            )
            .map_err(io("starting kube-controller-manager"))?,
        );
        processes.push(
            Managed::spawn(
                &format!("{name}/kube-scheduler"),
                &bins.scheduler,
                &[format!("--kubeconfig={}", d(kubeconfig)), "--leader-elect=false".into(), "--secure-port=0".into(), "--port=0".into()],
                &dir.join("scheduler.log"),
            )
            .map_err(io("starting kube-scheduler"))?,
        );
        Ok(())
    }
}

const ADMIN_TOKEN_FILE: &str = "tokens.csv";
/// The CA the API server trusts for client certificates and the controller manager signs
/// approved client CSRs with (`--client-ca-file`, `--cluster-signing-*-file`).
const CLIENT_CA_CERT: &str = "client-ca.crt";
const CLIENT_CA_KEY: &str = "client-ca.key";

/// Writes a new client CA of the cluster in `dir`.
fn client_ca(dir: &Path) -> Result<(), FleetError> {
    let ca_err = |e: rcgen::Error| FleetError::ClientCa(e.to_string());
    let key = rcgen::KeyPair::generate().map_err(ca_err)?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(ca_err)?;
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.distinguished_name.push(rcgen::DnType::CommonName, "ferry-fleet client CA");
    params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign, rcgen::KeyUsagePurpose::DigitalSignature];
    let cert = params.self_signed(&key).map_err(ca_err)?;
    std::fs::write(dir.join(CLIENT_CA_CERT), cert.pem()).map_err(io("writing the client CA"))?;
    std::fs::write(dir.join(CLIENT_CA_KEY), key.serialize_pem()).map_err(io("writing the client CA key"))?;
    Ok(())
}

/// The etcd prefix under which a cluster instance's API server keeps everything: its
/// `--etcd-prefix`, and where [`crate::crd_seed`] writes ahead of it.
fn etcd_prefix(instance: &str) -> String {
    format!("/ferry/{instance}")
}

fn start_cluster(bins: &Binaries, root: &Path, name: &str, instance: &str, etcd: &str) -> Result<Cluster, FleetError> {
    let port = free_port().map_err(io("finding a port"))?;
    start_cluster_on(bins, root, name, instance, etcd, port)
}

/// [`start_cluster`] with its API server on `port`.
fn start_cluster_on(bins: &Binaries, root: &Path, name: &str, instance: &str, etcd: &str, port: u16) -> Result<Cluster, FleetError> {
    let dir = root.join(instance);
    let certs = dir.join("certs");
    std::fs::create_dir_all(&certs).map_err(io(format!("creating {}", certs.display())))?;
    let sa_key = dir.join("sa.key");
    let sa_pub = dir.join("sa.pub");
    let ok = Command::new("openssl").args(["genrsa", "-out"]).arg(&sa_key).arg("2048").output().is_ok_and(|o| o.status.success())
        && Command::new("openssl").args(["rsa", "-pubout", "-in"]).arg(&sa_key).arg("-out").arg(&sa_pub).output().is_ok_and(|o| o.status.success());
    if !ok {
        return Err(FleetError::Keys(dir));
    }
    client_ca(&dir)?;
    // A random admin token per cluster, kept only in files of this fleet.
    let token = format!("{:032x}", rand_u128());
    std::fs::write(dir.join(ADMIN_TOKEN_FILE), format!("{token},ferry-admin,ferry-admin,\"system:masters\"\n"))
        .map_err(io("writing the token file"))?;
    let log = dir.join("apiserver.log");
    let d = |p: &Path| p.display().to_string();
    let apiserver_args = vec![
            format!("--etcd-servers={etcd}"),
            format!("--etcd-prefix={}", etcd_prefix(instance)),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            "--insecure-port=0".into(),
            format!("--cert-dir={}", d(&certs)),
            format!("--token-auth-file={}", d(&dir.join(ADMIN_TOKEN_FILE))),
            format!("--client-ca-file={}", d(&dir.join(CLIENT_CA_CERT))),
            "--authorization-mode=RBAC".into(),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            format!("--service-account-key-file={}", d(&sa_pub)),
            format!("--service-account-signing-key-file={}", d(&sa_key)),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            "--allow-privileged=true".into(),
    ];
    let processes = vec![Managed::spawn(&format!("{name}/kube-apiserver"), &bins.apiserver, &apiserver_args, &log).map_err(io(format!("starting {name}'s kube-apiserver")))?];
    let kubeconfig = dir.join("kubeconfig");
    let server = format!("https://127.0.0.1:{port}");
    let ca = certs.join("apiserver.crt");
    let kc = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n    server: {server}\n    certificate-authority: {}\nusers:\n- name: ferry-admin\n  user:\n    token: {token}\ncontexts:\n- name: {name}\n  context:\n    cluster: {name}\n    user: ferry-admin\ncurrent-context: {name}\n",
        d(&ca)
    );
    std::fs::write(&kubeconfig, kc).map_err(io("writing the kubeconfig"))?;
    Ok(Cluster { name: name.to_owned(), server, kubeconfig, log, processes, sa_key, ca, dir, apiserver_args, controllers: false, held_port: None })
}

fn rand_u128() -> u128 {
    use std::hash::{BuildHasher, Hasher};
    let mut a = std::collections::hash_map::RandomState::new().build_hasher();
    a.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    let b = std::collections::hash_map::RandomState::new().build_hasher().finish();
    (u128::from(a.finish()) << 64) | u128::from(b)
}

/// How long an API server may take to answer `/readyz`. A quiet machine needs 2-3 s; a
/// loaded 2-core one starting eight API servers at once (two e2e tests of four clusters,
/// while another test binary compiles) once needed more than 90 s. A server whose process
/// exits is reported at once, so the bound only matters for a live, slow server.
const READY_LIMIT: Duration = Duration::from_secs(240);

/// How many times a cluster is started in all when its API server finds its port taken.
const PORT_ATTEMPTS: u32 = 3;

/// [`wait_ready`], starting the cluster again on another port when its API server exited
/// because its port was taken: [`free_port`] lets the port go before the server binds it,
/// and another process's connection can take it meanwhile (a loaded machine starting
/// several fleets). The first attempt's log is kept beside the new one.
async fn ready_or_restarted(c: &mut Cluster, bins: &Binaries, etcd: &str) -> Result<(), FleetError> {
    let mut attempt = 1;
    loop {
        match wait_ready(c).await {
            Err(e @ FleetError::NotReady { exited: true, .. }) if attempt < PORT_ATTEMPTS && port_taken(&c.log) => {
                let (Some(root), Some(instance)) = (c.dir.parent(), c.dir.file_name().and_then(|n| n.to_str())) else {
                    return Err(e);
                };
                let (root, instance, name) = (root.to_owned(), instance.to_owned(), c.name.clone());
                let kept = c.dir.join(format!("apiserver.{attempt}.log"));
                std::fs::rename(&c.log, &kept).map_err(io(format!("keeping {}", c.log.display())))?;
                eprintln!("test bed: {name}'s API server found its port taken ({}); starting it again on another port (its log: {})", c.server, kept.display());
                *c = start_cluster(bins, &root, &name, &instance, etcd)?;
                attempt += 1;
            }
            r => return r,
        }
    }
}

/// How long etcd may take to answer its first request.
const ETCD_READY: Duration = Duration::from_secs(60);

/// How long one readiness probe of etcd may take.
const ETCD_PROBE: Duration = Duration::from_secs(2);

/// Starts the fleet's etcd and waits until it answers; returns it with its client URL.
/// Its two ports come from [`free_port`], which lets a port go before etcd binds it, so an
/// etcd that exits because a port was taken is started again on others (the first
/// attempt's log kept as `etcd.N.log`), as [`ready_or_restarted`] does for API servers.
/// An etcd that exits for any other reason fails the bed at once, naming its log.
/// `client_port`: the first attempt's client port (a test takes it first).
async fn start_etcd(bins: &Binaries, dir: &Path, mut client_port: Option<u16>) -> Result<(Managed, String), FleetError> {
    let log = dir.join("etcd.log");
    let mut attempt = 1;
    loop {
        let etcd_port = match client_port.take() {
            Some(p) => p,
            None => free_port().map_err(io("finding a port"))?,
        };
        let peer_port = free_port().map_err(io("finding a port"))?;
        let url = format!("http://127.0.0.1:{etcd_port}");
        let mut etcd = Managed::spawn(
            "etcd",
            &bins.etcd,
            &[
                format!("--data-dir={}", dir.join("etcd").display()),
                format!("--listen-client-urls={url}"),
                format!("--advertise-client-urls={url}"),
                format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-cluster=default=http://127.0.0.1:{peer_port}"),
                "--unsafe-no-fsync".into(),
                "--log-level=warn".into(),
            ],
            &log,
        )
        .map_err(io("starting etcd"))?;
        let client = crate::crd_seed::Etcd::new(&url);
        let mut start_up = StartUp::new(Duration::from_millis(50), ETCD_READY);
        let exited = loop {
            if !etcd.running() {
                break true;
            }
            // Bounded: whatever holds a taken port may accept and never answer.
            if matches!(tokio::time::timeout(ETCD_PROBE, client.range("/ferry-ready-probe/")).await, Ok(Ok(_))) {
                return Ok((etcd, url));
            }
            if !start_up.again().await {
                break false;
            }
        };
        if exited && attempt < PORT_ATTEMPTS && port_taken(&log) {
            drop(etcd);
            let kept = dir.join(format!("etcd.{attempt}.log"));
            std::fs::rename(&log, &kept).map_err(io(format!("keeping {}", log.display())))?;
            // etcd refuses to start on a data dir half made by the attempt that failed.
            let _ = std::fs::remove_dir_all(dir.join("etcd"));
            eprintln!("test bed: etcd found a port taken ({url}); starting it again on others (its log: {})", kept.display());
            attempt += 1;
            continue;
        }
        return Err(FleetError::EtcdNotReady { url, waited: start_up.waited(), exited, log: log.display().to_string(), tail: log_tail(&log, 25) });
    }
}

/// Whether the process logging to `log` exited because its port was taken.
fn port_taken(log: &Path) -> bool {
    std::fs::read_to_string(log).is_ok_and(|text| text.contains("address already in use"))
}

/// Waits until the API server answers `/readyz` (process start-up: a bounded retry), and
/// fails at once, naming its log, if one of the cluster's processes exits meanwhile.
async fn wait_ready(c: &mut Cluster) -> Result<(), FleetError> {
    let mut start_up = StartUp::new(Duration::from_millis(100), READY_LIMIT);
    let not_ready = |c: &Cluster, exited: bool, waited: Duration| FleetError::NotReady {
        cluster: c.name.clone(),
        server: c.server.clone(),
        waited,
        exited,
        log: c.log.display().to_string(),
        tail: log_tail(&c.log, 25),
    };
    loop {
        if !c.healthy() {
            return Err(not_ready(c, true, start_up.waited()));
        }
        if probe_ready(c).await {
            return Ok(());
        }
        if !start_up.again().await {
            return Err(not_ready(c, false, start_up.waited()));
        }
    }
}

/// The pace of probing a process that starts up (etcd, an API server): a backoff from
/// `first` doubling to 500 ms between probes, until `limit` has passed. A poll, because a
/// server announces its readiness only by answering; its exit is checked beside each probe.
struct StartUp {
    started: std::time::Instant,
    limit: Duration,
    delays: backon::ExponentialBackoff,
}

impl StartUp {
    fn new(first: Duration, limit: Duration) -> Self {
        use backon::BackoffBuilder;
        let delays = backon::ExponentialBuilder::default().with_min_delay(first).with_max_delay(Duration::from_millis(500)).without_max_times().build();
        Self { started: std::time::Instant::now(), limit, delays }
    }

    /// How long the process has been waited for.
    fn waited(&self) -> Duration {
        self.started.elapsed()
    }

    /// Waits before the next probe; false, at once, when the bound has passed.
    async fn again(&mut self) -> bool {
        if self.waited() >= self.limit {
            return false;
        }
        let delay = self.delays.next().unwrap_or(Duration::from_millis(500));
        tokio::time::sleep(delay).await;
        true
    }
}

/// Binds (without listening) the port of a stopped API server at `server`
/// (`https://127.0.0.1:PORT`), so that no other socket takes it meanwhile (an outgoing
/// connection's ephemeral port could) and connections to it are refused. None if it
/// cannot (the cluster then comes back only if the port is still free).
fn hold_port(server: &str) -> Option<socket2::Socket> {
    let addr: std::net::SocketAddr = server.strip_prefix("https://")?.parse().ok()?;
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).ok()?;
    socket.set_reuse_address(true).ok()?;
    socket.bind(&addr.into()).ok()?;
    Some(socket)
}

/// The last `n` lines of the log at `path` (or why there are none).
fn log_tail(path: &Path, n: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        }
        Err(e) => format!("(unreadable: {e})"),
    }
}

/// One `/readyz` probe: true when the server answers `ok`.
async fn probe_ready(c: &Cluster) -> bool {
    // The serving certificate (our CA) appears only once the server has started.
    let Ok(client) = c.client().await else { return false };
    let Ok(req) = http::Request::get("/readyz").body(Vec::new()) else { return false };
    matches!(client.request_text(req).await, Ok(body) if body.trim() == "ok")
}

impl Cluster {
    /// True while every process of the cluster runs.
    pub fn healthy(&mut self) -> bool {
        self.processes.iter_mut().all(Managed::running)
    }

    /// Stops the cluster, as a cluster that is gone: its API server and controllers are
    /// killed (and reaped) and every connection to it is refused. Its store stays in etcd
    /// and its port stays its own: [`Fleet::revive`] brings it back as it was.
    pub fn stop(&mut self) {
        self.processes.iter_mut().for_each(Managed::begin_stop);
        // Dropping waits for each guard, which kills and reaps its program: the port is
        // free once this returns.
        self.processes.clear();
        self.held_port = hold_port(&self.server);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An API server whose port another process took before it bound it exits at once
    /// (before, its guard looked alive and the bed waited 240 s for a server that was
    /// gone) and is started again on another port.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_api_server_whose_port_is_taken_starts_again_on_another() {
        let fleet = Fleet::start(FleetOptions { clusters: vec!["hub".into()], controllers: false, ..FleetOptions::default() }).await.unwrap();
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let mut c = start_cluster_on(&fleet.bins, &fleet.dir, "late", "late-1", &fleet.etcd_url, port).unwrap();
        ready_or_restarted(&mut c, &fleet.bins, &fleet.etcd_url).await.unwrap();
        assert_ne!(c.server, format!("https://127.0.0.1:{port}"));
        assert!(port_taken(&c.dir.join("apiserver.1.log")), "the first attempt's log is kept");
        drop(taken);
    }

    /// etcd's ports come from [`free_port`] too: an etcd that finds one taken exits, and is
    /// started again on others (before, the API servers waited on it for their whole bound).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_etcd_whose_port_is_taken_starts_again_on_another() {
        let bins = Binaries::locate().unwrap();
        let dir = tempfile::Builder::new().prefix("ferry-fleet-").tempdir().unwrap();
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let (_etcd, url) = start_etcd(&bins, dir.path(), Some(port)).await.unwrap();
        assert_ne!(url, format!("http://127.0.0.1:{port}"));
        assert!(port_taken(&dir.path().join("etcd.1.log")), "the first attempt's log is kept");
        crate::crd_seed::Etcd::new(&url).range("/").await.expect("the second etcd answers");
        drop(taken);
    }
}

//! The `create-cluster` command (`ClusterCommand`): `CreateCluster`, `ScaleCluster` and
//! `DeleteCluster` as one record, so every task of one cluster shares a kind, a topic and
//! a subject (`<namespace>/<name>`) and runs one at a time.

use std::collections::HashMap;

use apache_avro::AvroSchema;
use serde::{Deserialize, Serialize};

/// What to do with the cluster.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub enum ClusterOperation {
    /// `CreateCluster`: provision, install add-ons, register; revert deletes it all.
    #[default]
    #[serde(alias = "create")]
    #[schemars(extend("x-aliases" = ["create"]))]
    Create,
    /// `ScaleCluster`: new control-plane and/or worker counts; revert restores the old ones.
    #[serde(alias = "scale")]
    #[schemars(extend("x-aliases" = ["scale"]))]
    Scale,
    /// `DeleteCluster`: deregister from OCM, delete the Cluster, wait until it is gone.
    #[serde(alias = "delete")]
    #[schemars(extend("x-aliases" = ["delete"]))]
    Delete,
}

/// A set of machines: how many and of which flavor.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct MachinePool {
    /// Machines (control plane: at least 1; workers: 0 or more). For scale: the new count,
    /// or none to keep it.
    #[serde(default)]
    pub count: Option<i32>,
    /// Infrastructure flavor (OpenStack flavor name; ignored by Docker).
    #[serde(default)]
    pub flavor: Option<String>,
}

/// The worker machines: how many and of which flavor. (A record of its own: the Avro
/// serializer cannot encode a second use of a named record.)
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct WorkerPool {
    /// Worker machines (0 or more). For scale: the new count, or none to keep it.
    #[serde(default)]
    pub count: Option<i32>,
    /// Infrastructure flavor (OpenStack flavor name; ignored by Docker).
    #[serde(default)]
    pub flavor: Option<String>,
}

/// OpenStack settings (infrastructure `openstack`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct OpenStackSettings {
    /// Secret (in the cluster's namespace on the hub) holding `clouds.yaml`.
    pub cloud_secret: String,
    /// The cloud's name in `clouds.yaml` (default `openstack`).
    #[serde(default)]
    pub cloud: Option<String>,
    /// External network id for the router and floating IPs.
    #[serde(default)]
    pub external_network_id: Option<String>,
    /// Floating IP of the API server's load balancer or control-plane machine.
    #[serde(default)]
    pub api_server_floating_ip: Option<String>,
    /// The managed subnet's CIDR (default 10.6.0.0/24).
    #[serde(default)]
    pub node_cidr: Option<String>,
    /// DNS servers of the managed subnet.
    #[serde(default)]
    pub dns_nameservers: Vec<String>,
    /// SSH key pair name on the machines.
    #[serde(default)]
    pub ssh_key: Option<String>,
}

/// One add-on to install once the nodes are Ready.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct AddonRequest {
    /// A name of the add-on catalog (`cni`, `metallb`, `ingress-nginx`, `liqo`,
    /// `prometheus`, `strimzi`, ...).
    pub name: String,
    /// Its parameters (e.g. metallb `address_pool: 172.18.255.200-172.18.255.250`).
    #[serde(default)]
    pub params: HashMap<String, String>,
}

/// Registration with Open Cluster Management.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct OcmRegistration {
    /// Register the cluster as a ManagedCluster of the hub.
    #[serde(default)]
    pub enabled: bool,
    /// Into this ManagedClusterSet (default: OCM's `default` set).
    #[serde(default)]
    pub cluster_set: Option<String>,
}

/// `ClusterCommand`: create, scale or delete one Cluster API cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct ClusterCommand {
    /// Create (default), scale or delete.
    #[serde(default)]
    pub operation: ClusterOperation,
    /// The Cluster's name (DNS-1123 label).
    pub name: String,
    /// Namespace on the hub (default `default`).
    #[serde(default)]
    pub namespace: Option<String>,
    /// Infrastructure provider: `docker` or `openstack`.
    #[serde(default)]
    pub infrastructure: String,
    /// Bootstrap and control-plane provider: `kubeadm` (default) or `k3s`.
    #[serde(default)]
    pub control_plane_provider: Option<String>,
    /// Kubernetes version, `v1.MINOR.PATCH`.
    #[serde(default)]
    pub version: String,
    /// Control-plane machines (count at least 1; odd for kubeadm HA).
    #[serde(default)]
    pub control_plane: MachinePool,
    /// Worker machines.
    #[serde(default)]
    pub workers: WorkerPool,
    /// Machine image (OpenStack image name; Docker: a kindest/node image).
    #[serde(default)]
    pub image: Option<String>,
    /// Pod network CIDR (default 192.168.0.0/16).
    #[serde(default)]
    pub pods_cidr: Option<String>,
    /// Service network CIDR (default 10.128.0.0/12).
    #[serde(default)]
    pub services_cidr: Option<String>,
    /// OpenStack settings (required with `openstack`).
    #[serde(default)]
    pub openstack: Option<OpenStackSettings>,
    /// Use this ClusterClass (a managed topology) instead of rendering every object.
    #[serde(default)]
    pub cluster_class: Option<String>,
    /// The topology's variables (`cluster_class` only), each value as text: the `check`
    /// step reads it as the type the ClusterClass defines (a string as is; a number, a
    /// boolean, an object or a list as JSON) and refuses undefined names, bad values and
    /// missing required variables, as Cluster API's webhook would.
    #[serde(default)]
    #[avro(default = "{}")]
    pub variables: HashMap<String, String>,
    /// Add-ons to install, each its own step; the task succeeds only when all are ready.
    #[serde(default)]
    pub addons: Vec<AddonRequest>,
    /// Labels of the Cluster (and of its ManagedCluster).
    #[serde(default)]
    pub labels: HashMap<String, String>,
    /// Register with OCM.
    #[serde(default)]
    pub ocm: OcmRegistration,
    /// Time for provisioning (infrastructure, control plane, nodes), in seconds (default 1800).
    #[serde(default)]
    pub ready_timeout_seconds: Option<i32>,
    /// Time for each add-on to become ready, in seconds (default 600).
    #[serde(default)]
    pub addon_timeout_seconds: Option<i32>,
}

impl ClusterCommand {
    /// The Cluster's namespace on the hub.
    pub fn namespace(&self) -> &str {
        self.namespace.as_deref().unwrap_or("default")
    }

    /// The task subject: `<namespace>/<name>` (a cluster's tasks run one at a time).
    pub fn subject(&self) -> String {
        format!("{}/{}", self.namespace(), self.name)
    }

    /// The control-plane provider (`kubeadm` unless set).
    pub fn control_plane_provider(&self) -> &str {
        self.control_plane_provider.as_deref().unwrap_or("kubeadm")
    }

    /// Control-plane machines (1 unless set).
    pub fn control_plane_count(&self) -> i32 {
        self.control_plane.count.unwrap_or(1)
    }

    /// Worker machines (0 unless set).
    pub fn worker_count(&self) -> i32 {
        self.workers.count.unwrap_or(0)
    }
}

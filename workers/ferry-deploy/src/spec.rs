//! The `deploy` command (`DeployApp`): the application model of the prior orchestrator's
//! custom resource, typed. One record carries the three operations (deploy, update,
//! delete) so that every task of one app shares a kind, a topic and a subject.

use std::collections::HashMap;

use apache_avro::AvroSchema;
use serde::{Deserialize, Serialize};

/// What to do with the app.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub enum DeployOperation {
    /// Create the app (its ManifestWorks) and wait until every component is ready.
    #[default]
    #[serde(alias = "deploy")]
    #[schemars(extend("x-aliases" = ["deploy"]))]
    Deploy,
    /// Roll the app forward to this spec; the revert restores the previous one.
    #[serde(alias = "update")]
    #[schemars(extend("x-aliases" = ["update"]))]
    Update,
    /// Remove the app from every cluster and wait until its resources are gone.
    #[serde(alias = "delete")]
    #[schemars(extend("x-aliases" = ["delete"]))]
    Delete,
}

/// How manifests reach the clusters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub enum Delivery {
    /// One OCM ManifestWork per cluster on the hub; readiness from status feedback.
    #[default]
    #[serde(alias = "manifest-work", alias = "ocm")]
    #[schemars(extend("x-aliases" = ["manifest-work", "ocm"]))]
    ManifestWork,
    /// Server-side apply through the cluster's kubeconfig (no OCM).
    #[serde(alias = "direct")]
    #[schemars(extend("x-aliases" = ["direct"]))]
    Direct,
}

/// A reference to one key of a Secret in the app's namespace on the hub.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct SecretKeyRef {
    /// The Secret.
    pub name: String,
    /// Its key.
    pub key: String,
}

/// One environment variable: a plain value or a Secret key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct EnvVar {
    /// Variable name.
    pub name: String,
    /// A plain value.
    #[serde(default)]
    pub value: Option<String>,
    /// Or a Secret key (the Secret ships with the workload).
    #[serde(default)]
    pub secret: Option<SecretKeyRef>,
}

/// A port the component listens on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct Port {
    /// Port name (DNS-1123 label, at most 15 characters); default `p<port>`.
    #[serde(default)]
    pub name: Option<String>,
    /// Container and Service port.
    pub port: i32,
    /// TCP (default), UDP or SCTP.
    #[serde(default)]
    pub protocol: Option<String>,
}

/// Public exposure through an Ingress.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct IngressSpec {
    /// Hostname (DNS-1123 subdomain).
    pub host: String,
    /// Path prefix (default `/`).
    #[serde(default)]
    pub path: Option<String>,
    /// Which of the component's ports (default the first).
    #[serde(default)]
    pub port: Option<i32>,
    /// A TLS Secret in the app's namespace on the hub (ships with the workload).
    #[serde(default)]
    pub tls_secret: Option<String>,
}

/// Where a component goes when no cluster is named: an OCM Placement.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct PlacementSpec {
    /// ManagedClusterSets to choose from (bound to the app's namespace on the hub); empty
    /// means every bound set.
    #[serde(default)]
    pub cluster_sets: Vec<String>,
    /// Labels every chosen cluster must have.
    #[serde(default)]
    pub labels: HashMap<String, String>,
    /// How many clusters (default 1); the replicas are spread over them.
    #[serde(default)]
    pub clusters: Option<i32>,
    /// Prioritize by this AddOnPlacementScore (e.g. `ferry-resource-usage`, written by the
    /// score worker).
    #[serde(default)]
    pub score: Option<String>,
    /// The score's item (default `score`).
    #[serde(default)]
    pub score_item: Option<String>,
}

/// One component of the app: a Deployment, its Service and Ingress.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct Component {
    /// DNS-1123 label, unique in the app.
    pub name: String,
    /// Container image reference.
    pub image: String,
    /// Replicas (default 1); with several clusters, replicas per cluster.
    #[serde(default)]
    pub replicas: Option<i32>,
    /// CPU request per replica (quantity).
    #[serde(default)]
    pub cpu: Option<String>,
    /// Memory request per replica (quantity).
    #[serde(default)]
    pub memory: Option<String>,
    /// Environment.
    #[serde(default)]
    pub env: Vec<EnvVar>,
    /// Registry credentials: a `kubernetes.io/dockerconfigjson` Secret in the app's
    /// namespace on the hub (ships with the workload).
    #[serde(default)]
    pub image_pull_secret: Option<String>,
    /// Ports; a Service exposes them inside the cluster (and to peered clusters).
    #[serde(default)]
    pub ports: Vec<Port>,
    /// `ClusterIP` (default) or `LoadBalancer`.
    #[serde(default)]
    pub service_type: Option<String>,
    /// Public exposure through an Ingress.
    #[serde(default)]
    pub ingress: Option<IngressSpec>,
    /// The target cluster, or
    #[serde(default)]
    pub cluster: Option<String>,
    /// a placement.
    #[serde(default)]
    pub placement: Option<PlacementSpec>,
    /// Deploy into this namespace instead of the app's: the namespace a Liqo
    /// NamespaceOffloading offloads, for a component meant for a peered cluster.
    #[serde(default)]
    pub offloaded_namespace: Option<String>,
}

/// `DeployApp`: deploy, update or delete one application.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct DeployApp {
    /// Deploy (default), update or delete.
    #[serde(default)]
    pub operation: DeployOperation,
    /// The app's name (DNS-1123 label).
    pub name: String,
    /// Who owns it (`ferry apps list --owner`).
    #[serde(default)]
    pub owner: String,
    /// Namespace on the hub (Secrets, Placements) and on the clusters; default the name.
    #[serde(default)]
    pub namespace: Option<String>,
    /// The components (none for delete).
    #[serde(default)]
    pub components: Vec<Component>,
    /// ManifestWork (default) or direct.
    #[serde(default)]
    pub delivery: Delivery,
    /// Time for every component to become ready, in seconds (default 600).
    #[serde(default)]
    pub ready_timeout_seconds: Option<i32>,
    /// Parts of the app that run elsewhere and are not deployed (a TOSCA blueprint's
    /// external components): listed in the `check` step's output, so the task says what it
    /// left out. Version 2 of the schema (id 51); version 1 records have none.
    #[serde(default)]
    #[avro(default = "[]")]
    pub external: Vec<String>,
}

impl DeployApp {
    /// The namespace of the app.
    pub fn namespace(&self) -> &str {
        self.namespace.as_deref().unwrap_or(&self.name)
    }

    /// The task subject of the app: `<namespace>/<name>` (its tasks run one at a time).
    pub fn subject(&self) -> String {
        format!("{}/{}", self.namespace(), self.name)
    }
}

impl Component {
    /// How many clusters its Placement asks for (`numberOfClusters`; 1 when not given;
    /// 1 for a component that names its cluster).
    pub fn wanted_clusters(&self) -> usize {
        self.placement.as_ref().and_then(|p| p.clusters).unwrap_or(1) as usize
    }

    /// Replicas per cluster.
    pub fn replicas(&self) -> i32 {
        self.replicas.unwrap_or(1)
    }

    /// The namespace it runs in.
    pub fn namespace<'a>(&'a self, app: &'a DeployApp) -> &'a str {
        self.offloaded_namespace.as_deref().unwrap_or(app.namespace())
    }

    /// Names of the hub Secrets it references.
    pub fn secrets(&self) -> Vec<String> {
        let mut s: Vec<String> = self.env.iter().filter_map(|e| e.secret.as_ref().map(|r| r.name.clone())).collect();
        s.extend(self.image_pull_secret.clone());
        s.extend(self.ingress.as_ref().and_then(|i| i.tls_secret.clone()));
        s.sort();
        s.dedup();
        s
    }
}

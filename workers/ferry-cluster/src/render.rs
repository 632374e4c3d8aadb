//! `ClusterCommand` → the hub's Cluster API objects at the storage versions of the
//! upstream CRDs (v1beta2): a ClusterClass topology when the command names a class,
//! otherwise the Cluster, its infrastructure cluster, control plane, MachineDeployment and
//! the machine and bootstrap templates; and the OCM ManagedCluster. Pure functions.

use serde_json::{Value, json};

use crate::spec::ClusterCommand;

/// Field manager of the worker's server-side applies.
pub const MANAGER: &str = "ferry-cluster";
/// Label on everything the worker renders: the cluster's name.
pub const CLUSTER_LABEL: &str = "ferry.dev/cluster";
/// Label on a ManagedCluster: the namespace of its Cluster.
pub const NAMESPACE_LABEL: &str = "ferry.dev/cluster-namespace";
/// Label marking objects Ferry created (a Cluster without it is not Ferry's).
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "ferry");
/// Annotation naming the task that last applied an object.
pub const TASK_ANNOTATION: &str = "ferry.dev/task";
/// Cluster API's label naming an object's cluster.
pub const CAPI_CLUSTER_LABEL: &str = "cluster.x-k8s.io/cluster-name";
pub use ferry_kube::vocab::ocm::CLUSTERSET_LABEL;

const CAPI: &str = "cluster.x-k8s.io";
const INFRA: &str = "infrastructure.cluster.x-k8s.io";
const CONTROL_PLANE: &str = "controlplane.cluster.x-k8s.io";
const BOOTSTRAP: &str = "bootstrap.cluster.x-k8s.io";
const VERSION: &str = "v1beta2";

/// Default pod network.
pub const DEFAULT_PODS_CIDR: &str = "192.168.0.0/16";
/// Default service network.
pub const DEFAULT_SERVICES_CIDR: &str = "10.128.0.0/12";

/// Names of the rendered objects.
pub fn control_plane_name(cmd: &ClusterCommand) -> String {
    format!("{}-control-plane", cmd.name)
}

/// The worker MachineDeployment (and its templates).
pub fn workers_name(cmd: &ClusterCommand) -> String {
    format!("{}-md-0", cmd.name)
}

fn meta(cmd: &ClusterCommand, name: &str, task: &str) -> Value {
    json!({
        "name": name,
        "namespace": cmd.namespace(),
        "labels": {CLUSTER_LABEL: cmd.name, CAPI_CLUSTER_LABEL: cmd.name, MANAGED_BY.0: MANAGED_BY.1},
        "annotations": {TASK_ANNOTATION: task},
    })
}

fn obj(api_version: &str, kind: &str, meta: Value, spec: Value) -> Value {
    json!({"apiVersion": api_version, "kind": kind, "metadata": meta, "spec": spec})
}

fn gv(group: &str) -> String {
    format!("{group}/{VERSION}")
}

/// `{apiGroup, kind, name}`: the v1beta2 contract reference.
fn contract_ref(group: &str, kind: &str, name: &str) -> Value {
    json!({"apiGroup": group, "kind": kind, "name": name})
}

/// The infrastructure kinds of the command's provider: (cluster, machine template).
pub fn infra_kinds(cmd: &ClusterCommand) -> (&'static str, &'static str) {
    match cmd.infrastructure.as_str() {
        "openstack" => ("OpenStackCluster", "OpenStackMachineTemplate"),
        _ => ("DockerCluster", "DockerMachineTemplate"),
    }
}

/// The control-plane and bootstrap-template kinds of the command's provider.
pub fn control_plane_kinds(cmd: &ClusterCommand) -> (&'static str, &'static str) {
    match cmd.control_plane_provider() {
        "k3s" => ("KThreesControlPlane", "KThreesConfigTemplate"),
        _ => ("KubeadmControlPlane", "KubeadmConfigTemplate"),
    }
}

/// `(group, kind)` of every kind the command needs on the hub.
pub fn required_kinds(cmd: &ClusterCommand) -> Vec<(&'static str, &'static str)> {
    if cmd.cluster_class.is_some() {
        return vec![(CAPI, "Cluster"), (CAPI, "ClusterClass")];
    }
    let (ic, imt) = infra_kinds(cmd);
    let (cp, bt) = control_plane_kinds(cmd);
    vec![(CAPI, "Cluster"), (CAPI, "MachineDeployment"), (INFRA, ic), (INFRA, imt), (CONTROL_PLANE, cp), (BOOTSTRAP, bt)]
}

fn cluster_network(cmd: &ClusterCommand) -> Value {
    json!({
        "pods": {"cidrBlocks": [cmd.pods_cidr.as_deref().unwrap_or(DEFAULT_PODS_CIDR)]},
        "services": {"cidrBlocks": [cmd.services_cidr.as_deref().unwrap_or(DEFAULT_SERVICES_CIDR)]},
        "serviceDomain": "cluster.local",
    })
}

fn machine_template(cmd: &ClusterCommand, name: &str, flavor: Option<&str>, task: &str) -> Value {
    let (_, kind) = infra_kinds(cmd);
    let spec = match cmd.infrastructure.as_str() {
        "openstack" => {
            let os = cmd.openstack.clone().unwrap_or_default();
            // v1beta2 names flavors and images by filter (or id).
            let mut s =
                json!({"flavor": {"filter": {"name": flavor.unwrap_or_default()}}, "image": {"filter": {"name": cmd.image.clone().unwrap_or_default()}}});
            if let Some(k) = &os.ssh_key {
                s["sshKeyName"] = json!(k);
            }
            s
        }
        _ => cmd.image.as_ref().map_or_else(|| json!({}), |i| json!({"customImage": i})),
    };
    obj(&gv(INFRA), kind, meta(cmd, name, task), json!({"template": {"spec": spec}}))
}

fn infra_cluster(cmd: &ClusterCommand, task: &str) -> Value {
    let (kind, _) = infra_kinds(cmd);
    let spec = match cmd.infrastructure.as_str() {
        "openstack" => {
            let os = cmd.openstack.clone().unwrap_or_default();
            let mut subnet = json!({"cidr": os.node_cidr.as_deref().unwrap_or("10.6.0.0/24")});
            if !os.dns_nameservers.is_empty() {
                subnet["dnsNameservers"] = json!(os.dns_nameservers);
            }
            let mut s = json!({
                "identityRef": {"cloudName": os.cloud.as_deref().unwrap_or("openstack"), "name": os.cloud_secret},
                "managedSubnets": [subnet],
            });
            if let Some(id) = &os.external_network_id {
                s["externalNetwork"] = json!({"id": id});
            }
            if let Some(ip) = &os.api_server_floating_ip {
                s["apiServer"] = json!({"floatingIP": ip});
            }
            s
        }
        _ => json!({}),
    };
    obj(&gv(INFRA), kind, meta(cmd, &cmd.name, task), spec)
}

/// The kubelet flags of every node: an external cloud provider on OpenStack (CAPO's
/// quick start); on Docker, no disk-pressure evictions (CAPD's quick start: nodes share
/// the host's disk).
fn kubelet_args(cmd: &ClusterCommand) -> Value {
    match cmd.infrastructure.as_str() {
        "openstack" => json!([{"name": "cloud-provider", "value": "external"}]),
        _ => {
            json!([{"name": "eviction-hard", "value": "nodefs.available<0%,nodefs.inodesFree<0%,imagefs.available<0%"}])
        }
    }
}

/// The control plane's kubeadm settings: API server names and every node's kubelet flags.
fn kubeadm_config_spec(cmd: &ClusterCommand) -> Value {
    let mut sans = vec![json!("localhost"), json!("127.0.0.1")];
    if let Some(ip) = cmd.openstack.as_ref().and_then(|o| o.api_server_floating_ip.clone()) {
        sans.push(json!(ip));
    }
    json!({
        "clusterConfiguration": {"apiServer": {"certSANs": sans}},
        "initConfiguration": {"nodeRegistration": {"kubeletExtraArgs": kubelet_args(cmd)}},
        "joinConfiguration": {"nodeRegistration": {"kubeletExtraArgs": kubelet_args(cmd)}},
    })
}

/// A k3s control plane wants a k3s release version (`v1.33.1+k3s1`).
fn k3s_version(v: &str) -> String {
    if v.contains('+') { v.to_owned() } else { format!("{v}+k3s1") }
}

/// What a topology takes from its ClusterClass (the `check` step reads it).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Topology {
    /// The class's worker class.
    pub worker_class: Option<String>,
    /// The topology's variables (`{name, value}`), typed as the class defines them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub variables: Vec<Value>,
}

impl Topology {
    /// A topology with worker class `class` and no variables.
    pub fn worker(class: &str) -> Self {
        Self { worker_class: Some(class.to_owned()), variables: Vec::new() }
    }
}

/// The Cluster object: its labels and annotation, network, and refs or topology.
/// `topology`: what the ClusterClass gives (topology only).
pub fn cluster(cmd: &ClusterCommand, task: &str, topology: &Topology) -> Value {
    let mut m = meta(cmd, &cmd.name, task);
    for (k, v) in &cmd.labels {
        m["labels"][k] = json!(v);
    }
    let mut spec = json!({"clusterNetwork": cluster_network(cmd)});
    if let Some(class) = &cmd.cluster_class {
        let mut topo = json!({
            "classRef": {"name": class},
            "version": cmd.version,
            "controlPlane": {"replicas": cmd.control_plane_count()},
        });
        if let Some(wc) = &topology.worker_class {
            topo["workers"] = json!({"machineDeployments": [{"class": wc, "name": "md-0", "replicas": cmd.worker_count()}]});
        }
        if !topology.variables.is_empty() {
            topo["variables"] = json!(topology.variables);
        }
        spec["topology"] = topo;
    } else {
        let (ic, _) = infra_kinds(cmd);
        let (cp, _) = control_plane_kinds(cmd);
        spec["controlPlaneRef"] = contract_ref(CONTROL_PLANE, cp, &control_plane_name(cmd));
        spec["infrastructureRef"] = contract_ref(INFRA, ic, &cmd.name);
    }
    obj(&gv(CAPI), "Cluster", m, spec)
}

/// Every hub object of a create, in apply order (the Cluster last, once what it refers to
/// exists). A topology renders the Cluster only: the topology controller does the rest.
pub fn objects(cmd: &ClusterCommand, task: &str, topology: &Topology) -> Vec<Value> {
    if cmd.cluster_class.is_some() {
        return vec![cluster(cmd, task, topology)];
    }
    let (cp_name, md_name) = (control_plane_name(cmd), workers_name(cmd));
    let (_, imt) = infra_kinds(cmd);
    let (cp_kind, bt_kind) = control_plane_kinds(cmd);
    let cp_template = machine_template(cmd, &cp_name, cmd.control_plane.flavor.as_deref(), task);
    let md_template = machine_template(cmd, &md_name, cmd.workers.flavor.as_deref().or(cmd.control_plane.flavor.as_deref()), task);
    let control_plane = if cp_kind == "KThreesControlPlane" {
        // cluster-api-k3s still refers to templates by apiVersion.
        obj(
            &gv(CONTROL_PLANE),
            cp_kind,
            meta(cmd, &cp_name, task),
            json!({
                "replicas": cmd.control_plane_count(),
                "version": k3s_version(&cmd.version),
                "machineTemplate": {"infrastructureRef": {"apiVersion": gv(INFRA), "kind": imt, "name": cp_name}},
                "kthreesConfigSpec": {},
            }),
        )
    } else {
        obj(
            &gv(CONTROL_PLANE),
            cp_kind,
            meta(cmd, &cp_name, task),
            json!({
                "replicas": cmd.control_plane_count(),
                "version": cmd.version,
                "machineTemplate": {"spec": {"infrastructureRef": contract_ref(INFRA, imt, &cp_name)}},
                "kubeadmConfigSpec": kubeadm_config_spec(cmd),
            }),
        )
    };
    let bootstrap_spec = if bt_kind == "KubeadmConfigTemplate" {
        json!({"joinConfiguration": {"nodeRegistration": {"kubeletExtraArgs": kubelet_args(cmd)}}})
    } else {
        json!({})
    };
    let bootstrap = obj(&gv(BOOTSTRAP), bt_kind, meta(cmd, &md_name, task), json!({"template": {"spec": bootstrap_spec}}));
    let version = if cp_kind == "KThreesControlPlane" { k3s_version(&cmd.version) } else { cmd.version.clone() };
    let md = obj(
        &gv(CAPI),
        "MachineDeployment",
        meta(cmd, &md_name, task),
        json!({
            "clusterName": cmd.name,
            "replicas": cmd.worker_count(),
            "selector": {"matchLabels": {CAPI_CLUSTER_LABEL: cmd.name, "cluster.x-k8s.io/deployment-name": md_name}},
            "template": {
                "metadata": {"labels": {CAPI_CLUSTER_LABEL: cmd.name, "cluster.x-k8s.io/deployment-name": md_name}},
                "spec": {
                    "clusterName": cmd.name,
                    "version": version,
                    "bootstrap": {"configRef": contract_ref(BOOTSTRAP, bt_kind, &md_name)},
                    "infrastructureRef": contract_ref(INFRA, imt, &md_name),
                },
            },
        }),
    );
    vec![cp_template, md_template, bootstrap, infra_cluster(cmd, task), control_plane, md, cluster(cmd, task, topology)]
}

/// The OCM ManagedCluster of the command's cluster (accepted by the hub).
pub fn managed_cluster(cmd: &ClusterCommand) -> Value {
    let mut labels = json!({CLUSTER_LABEL: cmd.name, NAMESPACE_LABEL: cmd.namespace(), MANAGED_BY.0: MANAGED_BY.1,
                             CLUSTERSET_LABEL: cmd.ocm.cluster_set.as_deref().unwrap_or(ferry_kube::vocab::ocm::DEFAULT_CLUSTER_SET)});
    for (k, v) in &cmd.labels {
        labels[k] = json!(v);
    }
    json!({
        "apiVersion": "cluster.open-cluster-management.io/v1",
        "kind": "ManagedCluster",
        "metadata": {"name": cmd.name, "labels": labels},
        "spec": {"hubAcceptsClient": true, "leaseDurationSeconds": 60},
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{MachinePool, OpenStackSettings, WorkerPool};

    fn docker() -> ClusterCommand {
        ClusterCommand {
            name: "edge-1".into(),
            infrastructure: "docker".into(),
            version: "v1.33.1".into(),
            control_plane: MachinePool { count: Some(3), flavor: None },
            workers: WorkerPool { count: Some(2), flavor: None },
            ..ClusterCommand::default()
        }
    }

    #[test]
    fn a_docker_kubeadm_cluster_is_seven_objects_wired_by_name() {
        let objs = objects(&docker(), "t1", &Topology::default());
        let kinds: Vec<&str> = objs.iter().map(|o| o["kind"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            ["DockerMachineTemplate", "DockerMachineTemplate", "KubeadmConfigTemplate", "DockerCluster", "KubeadmControlPlane", "MachineDeployment", "Cluster"]
        );
        let c = &objs[6];
        assert_eq!(
            c["spec"]["controlPlaneRef"],
            json!({"apiGroup": "controlplane.cluster.x-k8s.io", "kind": "KubeadmControlPlane", "name": "edge-1-control-plane"})
        );
        assert_eq!(c["metadata"]["labels"]["app.kubernetes.io/managed-by"], "ferry");
        assert_eq!(objs[4]["spec"]["replicas"], 3);
        assert_eq!(objs[5]["spec"]["replicas"], 2);
        assert!(objs.iter().all(|o| o["metadata"]["namespace"] == "default" && o["apiVersion"].as_str().unwrap().ends_with("/v1beta2")));
    }

    #[test]
    fn openstack_carries_network_image_and_flavors() {
        let mut c = docker();
        c.infrastructure = "openstack".into();
        c.image = Some("ubuntu-2404-kube-v1.33.1".into());
        c.control_plane.flavor = Some("m1.medium".into());
        c.workers.flavor = Some("m1.large".into());
        c.openstack = Some(OpenStackSettings {
            cloud_secret: "cloud-config".into(),
            external_network_id: Some("6c90b532-7ba0-418a-a276-5ae55060b5b0".into()),
            api_server_floating_ip: Some("172.24.4.10".into()),
            ..OpenStackSettings::default()
        });
        let objs = objects(&c, "t1", &Topology::default());
        assert_eq!(objs[0]["spec"]["template"]["spec"]["flavor"]["filter"]["name"], "m1.medium");
        assert_eq!(objs[1]["spec"]["template"]["spec"]["flavor"]["filter"]["name"], "m1.large");
        assert_eq!(objs[3]["spec"]["externalNetwork"]["id"], "6c90b532-7ba0-418a-a276-5ae55060b5b0");
        assert_eq!(objs[3]["spec"]["apiServer"]["floatingIP"], "172.24.4.10");
        assert_eq!(objs[3]["spec"]["identityRef"], json!({"cloudName": "openstack", "name": "cloud-config"}));
    }

    #[test]
    fn a_cluster_class_renders_a_topology_only() {
        let mut c = docker();
        c.cluster_class = Some("quick-start".into());
        let objs = objects(&c, "t1", &Topology::worker("default-worker"));
        assert_eq!(objs.len(), 1);
        assert_eq!(objs[0]["spec"]["topology"]["workers"]["machineDeployments"][0], json!({"class": "default-worker", "name": "md-0", "replicas": 2}));
        assert!(objs[0]["spec"].get("controlPlaneRef").is_none());
    }
}

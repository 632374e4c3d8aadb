//! The `create-cluster` tasks' steps, one module each, in plan order. Create: [`check`],
//! [`apply`], [`initialization`] (`infrastructure`, `control-plane`), [`kubeconfig`],
//! [`nodes`], one [`addon`] step per add-on (`addon-<name>`), [`register`] (with
//! `ocm.enabled`). Scale: [`scale`] (`check`, `scale`, `wait`). Delete: [`delete`]'s
//! `check`, [`register`]'s `deregister`, [`delete`]. What they share is here: deadlines,
//! failed waits as step errors, and which Cluster and ManagedCluster are Ferry's.

pub mod addon;
pub mod apply;
pub mod check;
pub mod delete;
pub mod initialization;
pub mod kubeconfig;
pub mod nodes;
pub mod register;
pub mod scale;

use std::time::Duration;

use ferry_kube::WaitError;
use ferry_kube::kinds::{CapiCluster, ManagedCluster};
use ferry_kube::step_errors::hub_err;
use ferry_task::{StepError, StepPolicy, codes};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use serde_json::Value;

use crate::handler::Inner;
use crate::render::{MANAGED_BY, NAMESPACE_LABEL, TASK_ANNOTATION};
use crate::spec::ClusterCommand;

fn wait_err(e: WaitError) -> StepError {
    match e {
        WaitError::Timeout { .. } => StepError::permanent(codes::DEADLINE_EXCEEDED, e.to_string()),
        WaitError::Failed { .. } => StepError::permanent(codes::FAILED, e.to_string()),
    }
}

fn secs(v: Option<i32>, default: u64) -> Duration {
    Duration::from_secs(v.map_or(default, |s| s.max(1) as u64))
}

fn ready_timeout(cmd: &ClusterCommand) -> Duration {
    secs(cmd.ready_timeout_seconds, 1800)
}

fn wait_policy(t: Duration) -> StepPolicy {
    // The deadline bounds the wait; a miss is final (the task reverts).
    StepPolicy { timeout: t + Duration::from_secs(60), max_retries: 5, ..StepPolicy::default() }
}

fn clusters_api(hub: &kube::Client, ns: &str) -> Api<CapiCluster> {
    Api::namespaced(hub.clone(), ns)
}

fn is_ferrys(meta: &ObjectMeta) -> bool {
    meta.labels.as_ref().and_then(|l| l.get(MANAGED_BY.0)).map(String::as_str) == Some(MANAGED_BY.1)
}

fn task_of(meta: &ObjectMeta) -> String {
    meta.annotations.as_ref().and_then(|a| a.get(TASK_ANNOTATION)).cloned().unwrap_or_else(|| "?".into())
}

/// `kind namespace/name` of a rendered object.
fn describe(o: &Value) -> String {
    format!("{} {}/{}", o["kind"].as_str().unwrap_or("?"), o["metadata"]["namespace"].as_str().unwrap_or(""), o["metadata"]["name"].as_str().unwrap_or("?"))
}

/// The Ferry-made Cluster of `cmd`, or a rejection.
async fn own_cluster(inner: &Inner, cmd: &ClusterCommand) -> Result<CapiCluster, StepError> {
    let (ns, name) = (cmd.namespace(), cmd.name.as_str());
    let Some(c) = clusters_api(&inner.hub(), ns).get_opt(name).await.map_err(hub_err)? else {
        return Err(StepError::rejected(codes::CLUSTER_NOT_FOUND, format!("no Cluster {ns}/{name}")));
    };
    if !is_ferrys(&c.metadata) {
        return Err(StepError::rejected(
            codes::CLUSTER_NOT_FERRYS,
            format!("Cluster {ns}/{name} was not created by Ferry (no label {}={})", MANAGED_BY.0, MANAGED_BY.1),
        ));
    }
    if c.metadata.deletion_timestamp.is_some() {
        return Err(StepError::rejected(codes::CLUSTER_DELETING, format!("Cluster {ns}/{name} is being deleted")));
    }
    Ok(c)
}

/// The ManagedCluster of `cmd`'s cluster, when it is Ferry's for this namespace.
async fn own_managed_cluster(inner: &Inner, cmd: &ClusterCommand) -> Result<Option<ManagedCluster>, StepError> {
    let api: Api<ManagedCluster> = Api::all(inner.hub());
    let mc = match api.get_opt(&cmd.name).await {
        Ok(mc) => mc,
        // OCM not installed: nothing registered.
        Err(kube::Error::Api(s)) if s.code == 404 => None,
        Err(e) => return Err(hub_err(e)),
    };
    Ok(mc.filter(|m| m.metadata.labels.as_ref().and_then(|l| l.get(NAMESPACE_LABEL)).map(String::as_str) == Some(cmd.namespace())))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;

    #[test]
    fn outputs_keep_the_shape_journals_and_views_read() {
        // create
        let checked = check::CreateChecked { namespace_existed: true, cluster_namespace_existed: false, topology: crate::render::Topology::worker("default-worker") };
        assert_eq!(check::CHECK.value(&checked).unwrap(), json!({"namespace_existed": true, "cluster_namespace_existed": false, "worker_class": "default-worker"}));
        assert_eq!(check::CHECK.value(&check::CreateChecked::default()).unwrap(), json!({"namespace_existed": false, "cluster_namespace_existed": false, "worker_class": null}));
        let applied = apply::Applied { objects: vec!["Cluster fleet/c1".into()] };
        assert_eq!(apply::APPLY.value(&applied).unwrap(), json!({"objects": ["Cluster fleet/c1"]}));
        let phase = initialization::Initialized { phase: "Provisioned".into() };
        assert_eq!(initialization::INFRASTRUCTURE.value(&phase).unwrap(), json!({"phase": "Provisioned"}));
        assert_eq!(initialization::CONTROL_PLANE.value(&phase).unwrap(), json!({"phase": "Provisioned"}));
        let kc = kubeconfig::Kubeconfig { secret: "fleet/c1-kubeconfig".into(), server_version: "v1.33.0".into() };
        assert_eq!(kubeconfig::KUBECONFIG.value(&kc).unwrap(), json!({"secret": "fleet/c1-kubeconfig", "server_version": "v1.33.0"}));
        let nodes = nodes::ReadyNodes { nodes: vec!["c1-cp-0".into(), "c1-md-0".into()] };
        assert_eq!(nodes::NODES.value(&nodes).unwrap(), json!({"nodes": ["c1-cp-0", "c1-md-0"]}));
        let outputs = BTreeMap::from([(addon::step_name("cni"), apply::APPLY.value(&applied).unwrap())]);
        assert_eq!(addon::installed(&outputs, "cni").unwrap().objects, ["Cluster fleet/c1"]);
        assert!(addon::installed(&outputs, "ingress-nginx").is_none());
        let registered = register::Registered { managed_cluster: "c1".into(), cluster_set: "default".into() };
        assert_eq!(register::REGISTER.value(&registered).unwrap(), json!({"managed_cluster": "c1", "cluster_set": "default"}));
        // scale
        let counts = scale::Counts { control_plane: 1, workers: 3 };
        assert_eq!(scale::CHECK.value(&counts).unwrap(), json!({"control_plane": 1, "workers": 3}));
        assert_eq!(scale::SCALE.value(&counts).unwrap(), json!({"control_plane": 1, "workers": 3}));
        assert_eq!(scale::WAIT.value(&nodes).unwrap(), json!({"nodes": ["c1-cp-0", "c1-md-0"]}));
        // delete
        assert_eq!(delete::CHECK.value(&delete::DeleteChecked { registered: true }).unwrap(), json!({"registered": true}));
        assert_eq!(register::DEREGISTER.value(&register::Deregistered { removed: false }).unwrap(), json!({"removed": false}));
        let deleted = delete::Deleted { removed: BTreeMap::from([("MachineDeployment".to_owned(), 1), ("DockerMachineTemplate".to_owned(), 2)]) };
        assert_eq!(delete::DELETE.value(&deleted).unwrap(), json!({"removed": {"DockerMachineTemplate": 2, "MachineDeployment": 1}}));
        assert_eq!(delete::DELETE.value(&delete::Deleted::default()).unwrap(), json!({"removed": {}}));
    }

    #[test]
    fn outputs_journaled_before_the_keys_still_decode() {
        // What a worker of the previous version journaled, read through the typed keys.
        let outputs: BTreeMap<String, Value> = BTreeMap::from([
            ("check".to_owned(), json!({"namespace_existed": false, "worker_class": null})),
            ("scale".to_owned(), json!({"control_plane": 3, "workers": 2})),
        ]);
        let checked = check::CHECK.from_outputs(&outputs).unwrap();
        assert!(!checked.namespace_existed && checked.topology.worker_class.is_none());
        assert!(checked.cluster_namespace_existed, "a check recorded before the field: the cluster namespace is kept");
        let to = scale::SCALE.from_outputs(&outputs).unwrap();
        assert_eq!((to.control_plane, to.workers), (3, 2));
        let registered = BTreeMap::from([("check".to_owned(), json!({"registered": true}))]);
        assert!(delete::CHECK.from_outputs(&registered).unwrap().registered);
    }
}

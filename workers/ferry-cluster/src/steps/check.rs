//! `check` of a create: the live rules that *reject* the command before anything changes
//! (every kind it renders is served, the name is free on the hub, OCM and the
//! ManagedClusterSet are there when it registers, the ClusterClass exists, has a worker
//! class and defines the command's variables, all its required ones given), and what
//! `apply` needs (whether the namespace existed, the worker class, the typed variables). It
//! changes nothing, so its undo has nothing to put back.

use std::sync::Arc;
use std::time::Duration;

use ferry_kube::kinds::ManagedCluster;
use ferry_kube::step_errors::{hub_err, kube_err};
use ferry_kube::{ClusterError, HUB};
use ferry_task::{CheckStep, Output, StepContext, StepError, StepPolicy, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;
use kube::core::GroupVersionKind;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{clusters_api, is_ferrys, task_of};
use crate::handler::Inner;
use crate::render::{self, MANAGED_BY};
use crate::spec::ClusterCommand;

/// The `check` step's output (a create's; a scale and a delete have their own).
pub const CHECK: Output<CreateChecked> = Output::new("check");

/// Output of a create's `check`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CreateChecked {
    /// The namespace existed before (a revert keeps it).
    pub namespace_existed: bool,
    /// The hub had a namespace named as the cluster before: OCM's cluster namespace, which
    /// its registration controller makes on accept and keeps after the ManagedCluster is
    /// deleted (`pkg/registration/hub/managedcluster/controller.go`); a revert removes it
    /// only if the create caused it. Records without it: assumed, so kept.
    #[serde(default = "existed")]
    pub cluster_namespace_existed: bool,
    /// What the ClusterClass gives the topology: its worker class and the command's
    /// variables typed as it defines them (topology only).
    #[serde(flatten)]
    pub topology: render::Topology,
}

fn existed() -> bool {
    true
}

/// The class's variable definitions as Cluster API's webhook reads them: each of
/// `status.variables` with its first definition (the ClusterClass controller merges
/// `spec.variables` and external patches' variables there; cluster-api
/// `core/webhooks/admission/cluster.go`, `DefaultAndValidateVariables`, reads
/// `clusterClass.Status.Variables`), or `spec.variables` while the class has no status yet.
fn definitions(class: &Value) -> Vec<Value> {
    let status: Vec<Value> = class
        .pointer("/status/variables")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| {
            let def = v.pointer("/definitions/0")?;
            Some(serde_json::json!({"name": v["name"], "required": def["required"], "schema": def["schema"]}))
        })
        .collect();
    if !status.is_empty() {
        return status;
    }
    class.pointer("/spec/variables").and_then(Value::as_array).cloned().unwrap_or_default()
}

/// The command's `variables` typed as the class defines them (each value's text read as
/// its schema's type), or why Cluster API's webhook would refuse them (cluster-api
/// `internal/topology/variables/cluster_variable_validation.go`: undefined names, values
/// of the wrong type, required variables missing). A required variable with a top-level
/// schema default need not be given: the webhook defaults it first
/// (`cluster_variable_defaulting.go`, `defaultValue`), as CAPI's own quick-start class
/// relies on (`imageRepository: required, default: ""`).
pub fn typed_variables(class: &Value, given: &std::collections::HashMap<String, String>) -> Result<Vec<Value>, String> {
    let defs = definitions(class);
    let mut names: Vec<&String> = given.keys().collect();
    names.sort();
    let mut out = Vec::new();
    for name in names {
        let Some(def) = defs.iter().find(|d| d["name"] == name.as_str()) else {
            let known: Vec<&str> = defs.iter().filter_map(|d| d["name"].as_str()).collect();
            return Err(format!("variable {name:?} is not defined by the ClusterClass (it defines {})", known.join(", ")));
        };
        let text = &given[name];
        let ty = def.pointer("/schema/openAPIV3Schema/type").and_then(Value::as_str).unwrap_or("string");
        let value = match ty {
            "string" => Value::String(text.clone()),
            _ => {
                let v: Value = serde_json::from_str(text).map_err(|e| format!("variable {name:?}: {text:?} is not a {ty} ({e})"))?;
                let fits = match ty {
                    "integer" => v.is_i64() || v.is_u64(),
                    "number" => v.is_number(),
                    "boolean" => v.is_boolean(),
                    "object" => v.is_object(),
                    "array" => v.is_array(),
                    _ => true,
                };
                if !fits {
                    return Err(format!("variable {name:?}: {text:?} is not a {ty}"));
                }
                v
            }
        };
        out.push(serde_json::json!({"name": name, "value": value}));
    }
    let missing: Vec<&str> = defs
        .iter()
        .filter(|d| d.get("required").and_then(Value::as_bool) == Some(true) && d.pointer("/schema/openAPIV3Schema/default").is_none())
        .filter_map(|d| d["name"].as_str())
        .filter(|n| !given.contains_key(*n))
        .collect();
    if !missing.is_empty() {
        return Err(format!("the ClusterClass requires the variables {}; give them in `variables`", missing.join(", ")));
    }
    Ok(out)
}

/// The `check` step of a create.
pub struct CreateCheck(pub(crate) Arc<Inner>);

impl CreateCheck {
    async fn check(&self, cmd: &ClusterCommand) -> Result<CreateChecked, StepError> {
        let hub = self.0.hub();
        let (ns, name) = (cmd.namespace(), cmd.name.as_str());
        // Every kind the command needs is served (its provider is installed).
        for (group, kind) in render::required_kinds(cmd) {
            let gvk = GroupVersionKind::gvk(group, "v1beta2", kind);
            match self.0.cfg.clusters.api(HUB, &gvk, Some(ns)).await {
                Ok(_) => {}
                Err(ClusterError::NotServed { .. }) => {
                    return Err(StepError::rejected(
                        codes::PROVIDER_MISSING,
                        format!(
                            "the hub does not serve {group}/v1beta2 {kind}: install the provider that owns it (clusterctl init) before creating {ns}/{name}"
                        ),
                    ));
                }
                Err(e) => return Err(kube_err(codes::HUB_API, e)),
            }
        }
        if let Some(c) = clusters_api(&hub, ns).get_opt(name).await.map_err(hub_err)? {
            return Err(if is_ferrys(&c.metadata) {
                StepError::rejected(
                    codes::CLUSTER_EXISTS,
                    format!("Cluster {ns}/{name} already exists (created by Ferry task {}): scale or delete it instead", task_of(&c.metadata)),
                )
            } else {
                StepError::rejected(
                    codes::CLUSTER_NOT_FERRYS,
                    format!("a Cluster {ns}/{name} exists that Ferry did not create (no label {}={}): refusing to touch it", MANAGED_BY.0, MANAGED_BY.1),
                )
            });
        }
        // Workers read kubeconfig Secrets only in the cluster namespaces (their Roles): a
        // cluster made elsewhere would be provisioned and then unreachable.
        let clusters = &self.0.cfg.clusters;
        if !clusters.namespaces().iter().any(|n| n == ns) {
            return Err(StepError::rejected(
                codes::BAD_SPEC,
                format!("namespace {ns:?} is not a cluster namespace (the workers reach clusters in {} only: FERRY_CLUSTER_NAMESPACES)", clusters.namespaces().join(", ")),
            ));
        }
        // Workers reach clusters by name: a name in use elsewhere would be ambiguous.
        let taken = clusters.kubeconfig_secret_namespaces(name).await.map_err(|e| kube_err(codes::HUB_API, e))?;
        if let Some(other) = taken.first() {
            return Err(StepError::rejected(
                codes::NAME_TAKEN,
                format!("cluster name {name:?} is taken: Secret {other}/{name}-kubeconfig exists; cluster names must be unique across the cluster namespaces"),
            ));
        }
        if cmd.ocm.enabled {
            let api: Api<ManagedCluster> = Api::all(hub.clone());
            match api.get_opt(name).await {
                Ok(Some(_)) => {
                    return Err(StepError::rejected(codes::NAME_TAKEN, format!("a ManagedCluster {name:?} is already registered on the hub")));
                }
                Ok(None) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    return Err(StepError::rejected(
                        codes::OCM_MISSING,
                        "ocm.enabled is set but the hub does not serve ManagedClusters (OCM's cluster manager is not installed)",
                    ));
                }
                Err(e) => return Err(hub_err(e)),
            }
            if let Some(set) = &cmd.ocm.cluster_set {
                let gvk = GroupVersionKind::gvk("cluster.open-cluster-management.io", "v1beta2", "ManagedClusterSet");
                let api = self.0.cfg.clusters.api(HUB, &gvk, None).await.map_err(|e| kube_err(codes::HUB_API, e))?;
                if api.get_opt(set).await.map_err(hub_err)?.is_none() {
                    return Err(StepError::rejected(codes::CLUSTER_SET_MISSING, format!("ManagedClusterSet {set:?} does not exist on the hub")));
                }
            }
        }
        let mut topology = render::Topology::default();
        if let Some(class) = &cmd.cluster_class {
            let gvk = GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "ClusterClass");
            let api = self.0.cfg.clusters.api(HUB, &gvk, Some(ns)).await.map_err(|e| kube_err(codes::HUB_API, e))?;
            let Some(cc) = api.get_opt(class).await.map_err(hub_err)? else {
                return Err(StepError::rejected(codes::CLUSTER_CLASS_MISSING, format!("ClusterClass {ns}/{class} does not exist")));
            };
            // Cluster API's Cluster webhook refuses a topology without the variables its
            // class marks required, or with undefined or mistyped ones (cluster-api
            // core/webhooks/admission/cluster.go, validateRequiredVariables).
            topology.variables = typed_variables(&cc.data, &cmd.variables)
                .map_err(|why| StepError::rejected(codes::CLUSTER_CLASS_VARIABLES, format!("ClusterClass {ns}/{class}: {why}")))?;
            topology.worker_class = cc.data.pointer("/spec/workers/machineDeployments/0/class").and_then(Value::as_str).map(str::to_owned);
            if topology.worker_class.is_none() && cmd.worker_count() > 0 {
                return Err(StepError::rejected(
                    codes::CLUSTER_CLASS_NO_WORKERS,
                    format!("ClusterClass {ns}/{class} defines no worker class, but {} workers are requested", cmd.worker_count()),
                ));
            }
        }
        let namespaces = Api::<Namespace>::all(hub);
        let namespace_existed = namespaces.get_opt(ns).await.map_err(hub_err)?.is_some();
        let cluster_namespace_existed = namespaces.get_opt(&cmd.name).await.map_err(hub_err)?.is_some();
        Ok(CreateChecked { namespace_existed, cluster_namespace_existed, topology })
    }
}

impl CheckStep<ClusterCommand> for CreateCheck {
    fn name(&self) -> &str {
        CHECK.step()
    }

    fn policy(&self) -> StepPolicy {
        StepPolicy { timeout: Duration::from_secs(120), ..StepPolicy::default() }
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let out = self.check(cx.spec).await?;
            cx.progress(100, "the name is free and the providers are installed");
            CHECK.value(&out)
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn variables_are_typed_as_the_class_defines_them_and_refused_as_capi_would() {
        let class = json!({"spec": {"variables": [
            {"name": "region", "required": true, "schema": {"openAPIV3Schema": {"type": "string"}}},
            {"name": "replicas", "schema": {"openAPIV3Schema": {"type": "integer"}}},
            {"name": "ha", "schema": {"openAPIV3Schema": {"type": "boolean"}}},
        ]}});
        let given = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        assert_eq!(
            typed_variables(&class, &given(&[("region", "eu-1"), ("replicas", "3"), ("ha", "true")])).unwrap(),
            [json!({"name": "ha", "value": true}), json!({"name": "region", "value": "eu-1"}), json!({"name": "replicas", "value": 3})]
        );
        assert!(typed_variables(&class, &given(&[("replicas", "3")])).unwrap_err().contains("requires the variables region;"));
        assert!(typed_variables(&class, &given(&[("region", "x"), ("replicas", "three")])).unwrap_err().contains("\"three\" is not a integer"));
        assert!(typed_variables(&class, &given(&[("region", "x"), ("zone", "a")])).unwrap_err().contains("variable \"zone\" is not defined"));
    }

    /// Shaped as CAPI's quick-start class reconciled (`test/infrastructure/docker/templates/
    /// clusterclass-quick-start.yaml`): required variables with a default need not be given,
    /// and a variable only in `status.variables` (an external patch's) is defined.
    #[test]
    fn a_reconciled_class_defines_its_variables_in_its_status_and_defaults_count() {
        let def = |required: bool, schema: Value| json!([{"from": "inline", "required": required, "schema": {"openAPIV3Schema": schema}}]);
        let class = json!({
            "spec": {"variables": [{"name": "imageRepository", "required": true, "schema": {"openAPIV3Schema": {"type": "string", "default": ""}}}]},
            "status": {"variables": [
                {"name": "imageRepository", "definitions": def(true, json!({"type": "string", "default": ""}))},
                {"name": "etcdImageTag", "definitions": def(true, json!({"type": "string", "default": ""}))},
                {"name": "lbImageRepository", "definitions": def(true, json!({"type": "string"}))},
                {"name": "fromPatch", "definitions": [{"from": "external-patch", "required": false, "schema": {"openAPIV3Schema": {"type": "integer"}}}]},
            ]}});
        let given = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        assert!(typed_variables(&class, &given(&[])).unwrap_err().contains("requires the variables lbImageRepository;"));
        assert_eq!(
            typed_variables(&class, &given(&[("lbImageRepository", "kindest"), ("fromPatch", "2")])).unwrap(),
            [json!({"name": "fromPatch", "value": 2}), json!({"name": "lbImageRepository", "value": "kindest"})]
        );
    }
}

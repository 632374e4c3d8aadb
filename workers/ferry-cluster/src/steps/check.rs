//! `check` of a create: the live rules that *reject* the command before anything changes
//! (every kind it renders is served, the name is free on the hub, OCM and the
//! ManagedClusterSet are there when it registers, the ClusterClass exists, has a worker
//! class and requires no topology variable), and what `apply` needs (whether the namespace existed, the worker class). It
//! changes nothing, so its undo has nothing to put back.

use std::sync::Arc;
use std::time::Duration;

use ferry_kube::kinds::ManagedCluster;
use ferry_kube::step_errors::{hub_err, kube_err};
use ferry_kube::{ClusterError, HUB};
use ferry_task::{CheckStep, Output, StepContext, StepError, StepPolicy, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, ListParams};
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
    /// The ClusterClass's worker class (topology only).
    pub worker_class: Option<String>,
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
        // Workers reach clusters by name: a name in use elsewhere would be ambiguous.
        let secrets: Api<Secret> = Api::all(hub.clone());
        let lp = ListParams::default().labels(&format!("{}={name}", render::CAPI_CLUSTER_LABEL));
        if let Some(s) = secrets.list(&lp).await.map_err(hub_err)?.items.into_iter().find(|s| s.metadata.name.as_deref() == Some(&format!("{name}-kubeconfig")))
        {
            return Err(StepError::rejected(
                codes::NAME_TAKEN,
                format!(
                    "cluster name {name:?} is taken: Secret {}/{name}-kubeconfig exists; cluster names must be unique across namespaces",
                    s.metadata.namespace.unwrap_or_default()
                ),
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
        let mut worker_class = None;
        if let Some(class) = &cmd.cluster_class {
            let gvk = GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "ClusterClass");
            let api = self.0.cfg.clusters.api(HUB, &gvk, Some(ns)).await.map_err(|e| kube_err(codes::HUB_API, e))?;
            let Some(cc) = api.get_opt(class).await.map_err(hub_err)? else {
                return Err(StepError::rejected(codes::CLUSTER_CLASS_MISSING, format!("ClusterClass {ns}/{class} does not exist")));
            };
            // Cluster API's Cluster webhook refuses a topology without the variables its
            // class marks required (cluster-api core/webhooks/admission/cluster.go,
            // validateRequiredVariables); the command has no topology variables to give.
            let required: Vec<&str> = cc
                .data
                .pointer("/spec/variables")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter(|v| v.get("required").and_then(Value::as_bool) == Some(true))
                .filter_map(|v| v["name"].as_str())
                .collect();
            if !required.is_empty() {
                return Err(StepError::rejected(
                    codes::CLUSTER_CLASS_VARIABLES,
                    format!(
                        "ClusterClass {ns}/{class} requires the topology variables {required:?}, which a create-cluster command cannot set yet: use a ClusterClass whose variables are optional (or defaulted), or no ClusterClass"
                    ),
                ));
            }
            worker_class = cc.data.pointer("/spec/workers/machineDeployments/0/class").and_then(Value::as_str).map(str::to_owned);
            if worker_class.is_none() && cmd.worker_count() > 0 {
                return Err(StepError::rejected(
                    codes::CLUSTER_CLASS_NO_WORKERS,
                    format!("ClusterClass {ns}/{class} defines no worker class, but {} workers are requested", cmd.worker_count()),
                ));
            }
        }
        let namespace_existed = Api::<Namespace>::all(hub).get_opt(ns).await.map_err(hub_err)?.is_some();
        Ok(CreateChecked { namespace_existed, worker_class })
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

//! `check`: the live rules that *reject* the command before anything changes (the app
//! exists or not, referenced Secrets and keys on the hub, clusters registered, the
//! namespace bound to the cluster sets, room for the replicas on enough candidates), and
//! the app as it was before this task, which every undo converges back to. It changes
//! nothing, so its undo has nothing to put back.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ferry_kube::cluster_sets::{self, ClusterSetError};
use ferry_kube::kinds::ManagedCluster;
use ferry_kube::step_errors::{hub_err, kube_err};
use ferry_kube::{ClusterError, HUB};
use ferry_task::{CheckStep, Output, StepContext, StepError, StepPolicy, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams};
use kube::core::GroupVersionKind;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::record::record_name;
use crate::handler::Inner;
use crate::render::AppState;
use crate::spec::{Component, Delivery, DeployApp, DeployOperation};

use ferry_task::codes::{CLUSTERSET_NOT_BOUND, NO_CANDIDATES, SECRET_KEY_MISSING};

/// The `check` step's output.
pub const CHECK: Output<Checked> = Output::new("check");

/// Output of `check`: the app as it was before this task.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Checked {
    /// The previous state (None: not deployed).
    pub previous: Option<AppState>,
    /// The app's external parts, not deployed by this task (from the spec).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub external: Vec<String>,
}

/// The `check` step.
pub struct Check {
    inner: Arc<Inner>,
}

impl Check {
    pub(crate) fn new(inner: Arc<Inner>) -> Self {
        Self { inner }
    }

    async fn check_secrets(&self, app: &DeployApp) -> Result<(), StepError> {
        let api: Api<Secret> = Api::namespaced(self.inner.hub(), app.namespace());
        for c in &app.components {
            for name in c.secrets() {
                let Some(s) = api.get_opt(&name).await.map_err(hub_err)? else {
                    return Err(StepError::rejected(
                        codes::SECRET_MISSING,
                        format!("component {:?} references Secret {}/{name}, which does not exist on the hub", c.name, app.namespace()),
                    ));
                };
                if let Some(why) = crate::exportable::refusal(&s) {
                    return Err(StepError::rejected(codes::SECRET_NOT_EXPORTABLE, format!("component {:?}: {why}", c.name)));
                }
                let keys: BTreeSet<String> = s.data.unwrap_or_default().into_keys().chain(s.string_data.unwrap_or_default().into_keys()).collect();
                for e in c.env.iter().filter_map(|e| e.secret.as_ref()).filter(|r| r.name == name) {
                    if !keys.contains(&e.key) {
                        return Err(StepError::rejected(
                            SECRET_KEY_MISSING,
                            format!("component {:?} references key {:?} of Secret {}/{name}, which has keys {}", c.name, e.key, app.namespace(), ferry_task::report::listed(&keys)),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    async fn check_cluster(&self, app: &DeployApp, c: &Component, cluster: &str) -> Result<(), StepError> {
        match app.delivery {
            Delivery::ManifestWork => {
                let mc = Api::<ManagedCluster>::all(self.inner.hub()).get_opt(cluster).await.map_err(hub_err)?;
                let Some(mc) = mc else {
                    return Err(StepError::rejected(
                        codes::UNKNOWN_CLUSTER,
                        format!("component {:?}: cluster {cluster:?} is not registered with OCM (no ManagedCluster {cluster:?} on the hub)", c.name),
                    ));
                };
                // Its namespace on the hub, where the ManifestWork goes, exists only once the
                // hub accepted it (ocm `pkg/registration/hub/managedcluster/controller.go`).
                if !mc.accepted() {
                    return Err(StepError::rejected(
                        codes::UNKNOWN_CLUSTER,
                        format!("component {:?}: cluster {cluster:?} is registered with OCM but not accepted by the hub yet, so it has no namespace on the hub for a ManifestWork (`clusteradm accept --clusters {cluster}`)", c.name),
                    ));
                }
            }
            Delivery::Direct => match self.inner.cfg.clusters.kubeconfig_secret(cluster).await {
                Ok(_) => {}
                Err(e @ (ClusterError::Unknown { .. } | ClusterError::Ambiguous { .. })) => {
                    return Err(StepError::rejected(codes::UNKNOWN_CLUSTER, format!("component {:?}: {e}", c.name)));
                }
                Err(e) => return Err(kube_err(codes::HUB_API, e)),
            },
        }
        Ok(())
    }

    /// Rejects a placement no cluster has room for, saying what each cluster has free.
    async fn check_room(&self, c: &Component, candidates: &[String]) -> Result<(), StepError> {
        let (cpu, mem) = match (&c.cpu, &c.memory) {
            (None, None) => return Ok(()),
            (cpu, mem) => (
                cpu.as_deref().map(ferry_kube::quantity::millicores).transpose().map_err(|e| StepError::rejected(codes::BAD_SPEC, e.to_string()))?.unwrap_or(0),
                mem.as_deref().map(ferry_kube::quantity::units).transpose().map_err(|e| StepError::rejected(codes::BAD_SPEC, e.to_string()))?.unwrap_or(0),
            ),
        };
        let want = c.wanted_clusters();
        let mut fits = 0;
        let mut seen = Vec::new();
        for cl in candidates {
            match ferry_kube::capacity::measure(&self.inner.cfg.clusters, cl).await {
                Ok(load) => {
                    let n = load.replicas_that_fit(cpu.max(1), mem.max(1));
                    if n >= i64::from(c.replicas()) {
                        fits += 1;
                    }
                    let (free_cpu, free_mem) = load.nodes.iter().filter(|n| n.excluded.is_none()).map(|n| (n.cpu_free(), n.mem_free())).max().unwrap_or((0, 0));
                    seen.push(format!("{cl}: room for {n} replica(s), largest node has {}m CPU and {}Mi free", free_cpu, free_mem >> 20));
                }
                // A cluster that cannot be measured may still be chosen by OCM.
                Err(_) => fits += 1,
            }
        }
        if fits < want {
            return Err(StepError::rejected(
                codes::NO_ROOM,
                format!(
                    "component {:?}: {fits} of the {want} cluster(s) needed can run {} replica(s) of {} CPU and {} memory each ({})",
                    c.name,
                    c.replicas(),
                    c.cpu.as_deref().unwrap_or("0"),
                    c.memory.as_deref().unwrap_or("0"),
                    seen.join("; ")
                ),
            ));
        }
        Ok(())
    }
}

/// The clusters a placement may choose (its sets' members with its labels), with the reason
/// when there are none (`rejected`: `check` runs it before any effect; `place` again).
pub(super) async fn candidates(inner: &Inner, app: &DeployApp, c: &Component) -> Result<Vec<String>, StepError> {
    let p = c.placement.as_ref().expect("a placement component");
    let gvk = GroupVersionKind::gvk("cluster.open-cluster-management.io", "v1beta2", "ManagedClusterSetBinding");
    let bindings = inner.cfg.clusters.api(HUB, &gvk, Some(app.namespace())).await.map_err(|e| kube_err(codes::HUB_API, e))?;
    let bound: BTreeSet<String> = bindings.list(&ListParams::default()).await.map_err(hub_err)?.items.into_iter().filter_map(|b| b.metadata.name).collect();
    let sets: BTreeSet<String> = if p.cluster_sets.is_empty() { bound.clone() } else { p.cluster_sets.iter().cloned().collect() };
    if let Some(s) = sets.iter().find(|s| !bound.contains(*s)) {
        return Err(StepError::rejected(
            CLUSTERSET_NOT_BOUND,
            format!("component {:?}: namespace {:?} is not bound to ManagedClusterSet {s:?} (no ManagedClusterSetBinding {s:?} in it)", c.name, app.namespace()),
        ));
    }
    if sets.is_empty() {
        return Err(StepError::rejected(
            CLUSTERSET_NOT_BOUND,
            format!("component {:?}: namespace {:?} is bound to no ManagedClusterSet, so a placement has no clusters", c.name, app.namespace()),
        ));
    }
    // The sets' members as OCM's scheduler finds them, by each set's label or label
    // selector (`global` holds every cluster) (ocm
    // `pkg/placement/controllers/scheduling/helpers.go`, `GetAvailableClusters`).
    let members = cluster_sets::available_clusters(&inner.hub(), sets.iter().map(String::as_str)).await.map_err(|e| match e {
        ClusterSetError::Hub { source } => hub_err(source),
        e => StepError::rejected(NO_CANDIDATES, format!("component {:?}: {e}", c.name)),
    })?;
    let mut out = Vec::new();
    for mc in members {
        let labels = mc.metadata.labels.clone().unwrap_or_default();
        if p.labels.iter().all(|(k, v)| labels.get(k) == Some(v)) {
            out.extend(mc.metadata.name);
        }
    }
    if out.is_empty() {
        return Err(StepError::rejected(
            NO_CANDIDATES,
            {
                let mut labels: Vec<String> = p.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                labels.sort();
                format!("component {:?}: no cluster of ManagedClusterSet(s) {} has the labels {}", c.name, ferry_task::report::listed(&sets), ferry_task::report::listed(&labels))
            },
        ));
    }
    Ok(out)
}

impl CheckStep<DeployApp> for Check {
    fn name(&self) -> &str {
        CHECK.step()
    }

    fn policy(&self) -> StepPolicy {
        StepPolicy { timeout: Duration::from_secs(120), ..StepPolicy::default() }
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, DeployApp>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let app = cx.spec;
            let previous = self.inner.read_state(app).await?;
            match (app.operation, &previous) {
                (DeployOperation::Deploy, Some(_)) => {
                    return Err(StepError::rejected(codes::ALREADY_DEPLOYED, format!("app {} is already deployed; send operation update to change it", app.subject())));
                }
                (DeployOperation::Update | DeployOperation::Delete, None) => {
                    return Err(StepError::rejected(codes::NOT_DEPLOYED, format!("app {} is not deployed (no app record {} on the hub)", app.subject(), record_name(&app.name))));
                }
                (DeployOperation::Update, Some(p)) if p.spec.delivery != app.delivery => {
                    return Err(StepError::rejected(codes::DELIVERY_CHANGED, format!("app {} is delivered by {:?}; an update cannot switch to {:?} (delete and deploy)", app.subject(), p.spec.delivery, app.delivery)));
                }
                _ => {}
            }
            if app.operation != DeployOperation::Delete {
                self.check_secrets(app).await?;
                for c in &app.components {
                    if let Some(cl) = &c.cluster {
                        self.check_cluster(app, c, cl).await?;
                    } else {
                        let cands = candidates(&self.inner, app, c).await?;
                        self.check_room(c, &cands).await?;
                    }
                }
            }
            cx.progress(100, match &previous {
                Some(p) => format!("app {} runs on {} cluster(s) now", app.subject(), p.clusters().len()),
                None => format!("app {} is new", app.subject()),
            });
            if !app.external.is_empty() {
                cx.progress(100, format!("external, not deployed: {}", app.external.join(", ")));
            }
            CHECK.value(&Checked { previous, external: app.external.clone() })
        }
        .boxed()
    }
}

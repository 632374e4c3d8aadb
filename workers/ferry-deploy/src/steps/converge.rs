//! Converging the fleet from one app state to another, the one idea behind apply and every
//! undo: apply what the new state has, remove what only the old one had, record the new
//! state on the hub; then wait until the removed objects are gone and the restored
//! ManifestWorks are applied.

use std::collections::{BTreeMap, BTreeSet};

use ferry_kube::kinds::ManifestWork;
use ferry_kube::step_errors::{hub_err, kube_err};
use ferry_kube::{Check, HUB};
use ferry_task::{StepError, codes};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use super::unapplied;
use crate::handler::Inner;
use crate::render::{self, AppState, MANAGER, SecretData};
use crate::spec::{Component, Delivery, DeployApp};

impl Inner {
    pub(super) async fn ensure_hub_namespace(&self, ns: &str) -> Result<(), StepError> {
        let obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.hub());
        if api.get_opt(ns).await.map_err(hub_err)?.is_none() {
            api.patch(ns, &PatchParams::apply(MANAGER), &Patch::Apply(&obj)).await.map_err(hub_err)?;
        }
        Ok(())
    }

    /// The Secrets components reference, read from the app's namespace on the hub.
    async fn secrets(&self, app: &DeployApp, comps: &[&Component]) -> Result<BTreeMap<String, SecretData>, StepError> {
        let api: Api<Secret> = Api::namespaced(self.hub(), app.namespace());
        let mut out = BTreeMap::new();
        for name in comps.iter().flat_map(|c| c.secrets()).collect::<BTreeSet<_>>() {
            let s = api.get_opt(&name).await.map_err(hub_err)?.ok_or_else(|| {
                StepError::permanent(codes::SECRET_MISSING, format!("Secret {}/{name} on the hub is gone (it existed when the task was checked)", app.namespace()))
            })?;
            // Checked again here: the Secret may have changed since the check.
            if let Some(why) = crate::exportable::refusal(&s) {
                return Err(StepError::permanent(codes::SECRET_NOT_EXPORTABLE, why));
            }
            let data = s.data.unwrap_or_default().into_iter().map(|(k, v)| (k, base64_encode(&v.0))).collect();
            out.insert(name, SecretData { type_: s.type_.unwrap_or_else(|| "Opaque".into()), data });
        }
        Ok(out)
    }

    /// Makes the fleet hold `to` instead of `from`: applies `to`'s objects and removes
    /// those only `from` has; records `to` on the hub. Safe to repeat and to interrupt.
    pub(super) async fn converge(&self, from: Option<&AppState>, to: Option<&AppState>, app: &DeployApp, task: &str) -> Result<(), StepError> {
        let delivery = to.or(from).map(|s| s.spec.delivery).unwrap_or_default();
        if let Some(to) = to {
            self.ensure_hub_namespace(to.spec.namespace()).await?;
            for (cluster, comps) in to.by_cluster() {
                let secrets = self.secrets(&to.spec, &comps).await?;
                match delivery {
                    Delivery::ManifestWork => {
                        let work = render::manifest_work(&to.spec, &cluster, &comps, &secrets, task);
                        self.cfg.clusters.apply(HUB, &work, MANAGER).await.map_err(|e| kube_err(codes::HUB_API, e))?;
                    }
                    Delivery::Direct => {
                        for obj in render::objects(&to.spec, &comps, &secrets) {
                            self.cfg.clusters.apply(&cluster, &obj, MANAGER).await.map_err(|e| kube_err(codes::CLUSTER_API, e))?;
                        }
                    }
                }
            }
        }
        if let Some(from) = from {
            let keep = to.map(AppState::clusters).unwrap_or_default();
            match delivery {
                Delivery::ManifestWork => {
                    for cluster in from.clusters().difference(&keep) {
                        let work = json!({"apiVersion": "work.open-cluster-management.io/v1", "kind": "ManifestWork",
                            "metadata": {"name": render::work_name(&from.spec), "namespace": cluster}});
                        self.cfg.clusters.delete(HUB, &work).await.map_err(|e| kube_err(codes::HUB_API, e))?;
                    }
                }
                Delivery::Direct => {
                    let wanted: BTreeSet<(String, String)> = to
                        .map(|t| t.by_cluster().into_iter().flat_map(|(cl, comps)| identities(&cl, &t.spec, &comps)).collect())
                        .unwrap_or_default();
                    for (cluster, comps) in from.by_cluster() {
                        let mut objs = render::objects(&from.spec, &comps, &BTreeMap::new());
                        objs.reverse();
                        for obj in objs {
                            if !wanted.contains(&(cluster.clone(), identity(&obj))) {
                                self.cfg.clusters.delete(&cluster, &obj).await.map_err(|e| kube_err(codes::CLUSTER_API, e))?;
                            }
                        }
                    }
                }
            }
        }
        self.write_state(app, to, task).await
    }

    /// Waits until every ManifestWork of `state` is applied at its current generation: a
    /// revert is done when the clusters run the previous spec again, not when the hub has it.
    pub(super) async fn wait_restored(&self, state: Option<&AppState>) -> Result<(), StepError> {
        let Some(state) = state.filter(|s| s.spec.delivery == Delivery::ManifestWork) else { return Ok(()) };
        let name = render::work_name(&state.spec);
        for cluster in state.clusters() {
            self.cfg
                .watches
                .wait_object::<ManifestWork, ()>(HUB, &self.hub(), Some(&cluster), &name, self.cfg.removal_timeout, |w| match w {
                    Some(w) => unapplied(w).map_or(Check::Done(()), Check::Pending),
                    None => Check::Pending("the ManifestWork is not there".into()),
                })
                .await
                .map_err(|e| StepError::transient(codes::NOT_RESTORED, e.to_string()))?;
        }
        Ok(())
    }

    /// Waits until the objects `from` has and `to` has not are gone.
    pub(super) async fn wait_removed(&self, from: Option<&AppState>, to: Option<&AppState>) -> Result<(), StepError> {
        let Some(from) = from else { return Ok(()) };
        let keep = to.map(AppState::clusters).unwrap_or_default();
        let timeout = self.cfg.removal_timeout;
        match from.spec.delivery {
            Delivery::ManifestWork => {
                let name = render::work_name(&from.spec);
                for cluster in from.clusters().difference(&keep) {
                    self.cfg
                        .watches
                        .wait_deleted::<ManifestWork>(HUB, &self.hub(), Some(cluster), &name, timeout)
                        .await
                        .map_err(|e| StepError::transient(codes::NOT_REMOVED, e.to_string()))?;
                }
            }
            Delivery::Direct => {
                let wanted: BTreeSet<(String, String)> =
                    to.map(|t| t.by_cluster().into_iter().flat_map(|(cl, comps)| identities(&cl, &t.spec, &comps)).collect()).unwrap_or_default();
                for (cluster, comps) in from.by_cluster() {
                    let client = self.cfg.clusters.client(&cluster).await.map_err(|e| kube_err(codes::CLUSTER_API, e))?;
                    for c in comps {
                        let id = identity(&json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": c.name, "namespace": c.namespace(&from.spec)}}));
                        if wanted.contains(&(cluster.clone(), id)) {
                            continue;
                        }
                        self.cfg
                            .watches
                            .wait_deleted::<Deployment>(&cluster, &client, Some(c.namespace(&from.spec)), &c.name, timeout)
                            .await
                            .map_err(|e| StepError::transient(codes::NOT_REMOVED, e.to_string()))?;
                    }
                }
            }
        }
        Ok(())
    }
}

fn identity(obj: &Value) -> String {
    let s = |p: &str| obj.pointer(p).and_then(Value::as_str).unwrap_or("").to_owned();
    format!("{} {} {}/{}", s("/apiVersion"), s("/kind"), s("/metadata/namespace"), s("/metadata/name"))
}

fn identities(cluster: &str, app: &DeployApp, comps: &[&Component]) -> Vec<(String, String)> {
    render::objects(app, comps, &BTreeMap::new()).iter().map(|o| (cluster.to_owned(), identity(o))).collect()
}

fn base64_encode(b: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(b)
}

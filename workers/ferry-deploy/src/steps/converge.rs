//! Converging the fleet from one app state to another, the one idea behind apply and every
//! undo: apply what the new state has, remove what only the old one had (of what is
//! Ferry's, see `guard`), record the new state on the hub; then wait until the removed
//! objects are gone and the restored ManifestWorks are applied.

use std::collections::{BTreeMap, BTreeSet};

use ferry_kube::kinds::ManifestWork;
use ferry_kube::step_errors::{client_err, hub_err, kube_err};
use ferry_kube::{Check, HUB};
use ferry_task::{StepError, codes};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use super::guard::{NamespaceUse, Namespaces};
use super::unapplied;
use crate::exportable::Unshippable;
use crate::handler::Inner;
use crate::ownership::is_ferrys;
use crate::render::{self, AppState, MANAGER, Removal, SecretData};
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

    /// The namespaces of `objects` that a ManifestWork must orphan on `cluster`: those there
    /// already that Ferry did not make for `app` ([`ferry_kube::orphans::found_namespaces`]:
    /// upstream's work agent would own, and on deletion delete, a namespace it found). A
    /// cluster that cannot be read is an error: the step runs again, nothing is guessed.
    pub(crate) async fn found_namespaces(&self, cluster: &str, objects: &[Value], app: &str) -> Result<BTreeSet<String>, ferry_kube::ClusterError> {
        let ours = |m: &ObjectMeta| {
            let label = |k: &str| m.labels.as_ref().and_then(|l| l.get(k)).map(String::as_str);
            label(crate::ownership::MANAGED_BY) == Some(crate::ownership::FERRY) && label(render::APP_LABEL) == Some(app)
        };
        ferry_kube::orphans::found_namespaces(&self.cfg.clusters, cluster, objects, ours).await
    }

    /// The Secrets components reference, read from the app's namespace on the hub.
    async fn secrets(&self, app: &DeployApp, comps: &[&Component]) -> Result<BTreeMap<String, SecretData>, StepError> {
        let names = comps.iter().flat_map(|c| c.secrets()).collect::<BTreeSet<_>>();
        // Checked again here: the Secret may have changed since the check.
        let secrets = crate::exportable::read(&self.hub(), app.namespace(), names).await.map_err(hub_err)?.map_err(|e| match e {
            Unshippable::Missing(name) => {
                StepError::permanent(codes::SECRET_MISSING, format!("Secret {}/{name} on the hub is gone (it existed when the task was checked)", app.namespace()))
            }
            Unshippable::Refused(why) => StepError::permanent(codes::SECRET_NOT_EXPORTABLE, why),
        })?;
        Ok(secrets
            .into_iter()
            .map(|(name, s)| {
                let data = s.data.unwrap_or_default().into_iter().map(|(k, v)| (k, base64_encode(&v.0))).collect();
                (name, SecretData { type_: s.type_.unwrap_or_else(|| "Opaque".into()), data })
            })
            .collect())
    }

    /// Makes the fleet hold `to` instead of `from`: applies `to`'s objects and removes
    /// those only `from` has; records `to` on the hub. Safe to repeat and to interrupt.
    /// Only Ferry's objects of the app are written or deleted (`guard`); namespaces are
    /// deleted as `namespaces` says. Returns the namespaces a direct delivery put `to` in.
    pub(super) async fn converge(&self, from: Option<&AppState>, to: Option<&AppState>, app: &DeployApp, task: &str, namespaces: &Namespaces<'_>) -> Result<Vec<NamespaceUse>, StepError> {
        let delivery = to.or(from).map(|s| s.spec.delivery).unwrap_or_default();
        let mut used = Vec::new();
        if let Some(to) = to {
            self.ensure_hub_namespace(to.spec.namespace()).await?;
            for (cluster, comps) in to.by_cluster() {
                let secrets = self.secrets(&to.spec, &comps).await?;
                match delivery {
                    Delivery::ManifestWork => {
                        let found = self.found_namespaces(&cluster, &render::objects(&to.spec, &comps, &secrets), &app.name).await.map_err(client_err)?;
                        let work = render::manifest_work(&to.spec, &cluster, &comps, &secrets, task, &found);
                        self.apply_owned(HUB, &work, &app.name).await?;
                    }
                    Delivery::Direct => {
                        for obj in render::objects(&to.spec, &comps, &secrets) {
                            if obj["kind"] == "Namespace" {
                                used.push(self.ensure_namespace(&cluster, &obj, &app.name, task).await?);
                            } else {
                                self.apply_owned(&cluster, &obj, &app.name).await?;
                            }
                        }
                    }
                }
            }
        }
        if let Some(from) = from {
            for r in render::removed(from, to, &BTreeSet::new()) {
                match r.at {
                    Removal::Hub => self.delete_owned(HUB, &r.object, &app.name).await?,
                    Removal::Cluster if r.object["kind"] == "Namespace" => {
                        let name = r.object["metadata"]["name"].as_str().unwrap_or_default();
                        self.remove_namespace(&r.cluster, name, &app.name, namespaces).await?;
                    }
                    Removal::Cluster => self.delete_owned(&r.cluster, &r.object, &app.name).await?,
                }
            }
        }
        self.write_state(app, to, task).await?;
        Ok(used)
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

    /// Waits until the objects `from` has and `to` has not are gone (those that are not
    /// Ferry's for the app were left alone: not waited for).
    pub(super) async fn wait_removed(&self, from: Option<&AppState>, to: Option<&AppState>) -> Result<(), StepError> {
        let Some(from) = from else { return Ok(()) };
        let app = from.spec.name.as_str();
        let timeout = self.cfg.removal_timeout;
        // One client per cluster: each lookup reads the cluster's kubeconfig Secret.
        let mut clients: BTreeMap<String, kube::Client> = BTreeMap::new();
        for r in render::removed(from, to, &BTreeSet::new()) {
            let ns = r.object["metadata"]["namespace"].as_str();
            let name = r.object["metadata"]["name"].as_str().unwrap_or_default();
            let waited = match r.at {
                Removal::Hub => self.cfg.watches.wait_object::<ManifestWork, ()>(HUB, &self.hub(), ns, name, timeout, |w| gone(w.map(|w| &w.metadata), app)).await,
                // The Deployments stand for the rest: a direct delivery's Services and
                // Ingresses go at once; the pods are what takes time.
                Removal::Cluster if r.object["kind"] == "Deployment" => {
                    let client = match clients.get(&r.cluster) {
                        Some(c) => c.clone(),
                        None => {
                            let c = self.cfg.clusters.client(&r.cluster).await.map_err(|e| kube_err(codes::CLUSTER_API, e))?;
                            clients.insert(r.cluster.clone(), c.clone());
                            c
                        }
                    };
                    self.cfg.watches.wait_object::<Deployment, ()>(&r.cluster, &client, ns, name, timeout, |d| gone(d.map(|d| &d.metadata), app)).await
                }
                Removal::Cluster => continue,
            };
            waited.map_err(|e| StepError::transient(codes::NOT_REMOVED, e.to_string()))?;
        }
        Ok(())
    }
}

/// Whether a removal is done with the object as it is now: gone, or not Ferry's for `app`
/// (left alone).
fn gone(meta: Option<&ObjectMeta>, app: &str) -> Check<()> {
    match meta {
        None => Check::Done(()),
        Some(m) if !is_ferrys(m, app) => Check::Done(()),
        Some(m) => Check::Pending(match m.deletion_timestamp {
            Some(_) => format!("being deleted (finalizers: {})", m.finalizers.clone().unwrap_or_default().join(", ")),
            None => "still exists".to_owned(),
        }),
    }
}

fn base64_encode(b: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(b)
}

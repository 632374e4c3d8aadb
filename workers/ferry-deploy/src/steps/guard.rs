//! Writing only what is Ferry's ([`crate::ownership`]): an object is server-side applied
//! without force, and only when nothing has its name or what has it is Ferry's for the app
//! (else `OBJECT_NOT_FERRYS`, as is a conflict with another field manager); an object is
//! deleted only when it is Ferry's for the app. A direct delivery's namespaces are created
//! when missing (annotated with the task) and otherwise left as found; a removal deletes
//! one only when Ferry created it, as its [`Namespaces`] rule says.

use std::collections::BTreeSet;

use ferry_kube::clusters::gvk_of;
use ferry_kube::step_errors::kube_err;
use ferry_kube::{ClusterError, HUB};
use ferry_task::{StepError, codes};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::handler::Inner;
use crate::ownership::{CREATED_BY_ANNOTATION, NotFerrys, created_by, describe, is_ferrys, managed_by};
use crate::render::MANAGER;

/// A namespace a direct delivery put objects in on a cluster: created by this task, or
/// found there.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NamespaceUse {
    /// The cluster.
    pub cluster: String,
    /// The namespace.
    pub namespace: String,
    /// This task created it (else it was there: someone's, or Ferry's from an earlier task).
    pub created: bool,
}

/// Which namespaces a removal may delete (direct delivery: a ManifestWork's namespaces
/// are orphaned, see [`crate::render::manifest_work`]).
#[derive(Debug, Clone)]
pub(crate) enum Namespaces<'a> {
    /// A change forward (a delete, an update that leaves a cluster): one Ferry created for
    /// the app, by whichever task.
    Ferrys,
    /// An undo: one this task created (its annotation names the task) and, when the step
    /// finished, that its output lists as created (`Some`; an output of an older Ferry,
    /// without the list, is `Some` of nothing: every namespace was found).
    ThisTask { task: &'a str, created: Option<BTreeSet<(String, String)>> },
}

fn api_err(cluster: &str, source: kube::Error) -> StepError {
    kube_err(if cluster == HUB { codes::HUB_API } else { codes::CLUSTER_API }, ClusterError::Kube { cluster: cluster.to_owned(), source })
}

fn cluster_err(cluster: &str, e: ClusterError) -> StepError {
    kube_err(if cluster == HUB { codes::HUB_API } else { codes::CLUSTER_API }, e)
}

/// An object's API, kind and `Kind namespace/name`.
struct Target {
    api: Api<DynamicObject>,
    kind: String,
    name: String,
    what: String,
}

impl Inner {
    async fn target(&self, cluster: &str, obj: &Value) -> Result<Target, StepError> {
        let gvk = gvk_of(obj).map_err(|e| cluster_err(cluster, e))?;
        let name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_owned();
        let ns = obj.pointer("/metadata/namespace").and_then(Value::as_str);
        let api = self.cfg.clusters.api(cluster, &gvk, ns).await.map_err(|e| cluster_err(cluster, e))?;
        Ok(Target { api, what: describe(&gvk.kind, ns, &name), kind: gvk.kind, name })
    }

    /// Server-side applies `obj` to `cluster` as [`MANAGER`], without force, unless an
    /// object of its name is there that Ferry did not make for `app`; a field another
    /// manager owns is a conflict (HTTP 409), reported, never overridden.
    pub(super) async fn apply_owned(&self, cluster: &str, obj: &Value, app: &str) -> Result<(), StepError> {
        let t = self.target(cluster, obj).await?;
        if let Some(live) = t.api.get_opt(&t.name).await.map_err(|e| api_err(cluster, e))?
            && !is_ferrys(&live.metadata, app)
        {
            return Err(NotFerrys::Foreign { cluster: cluster.to_owned(), what: t.what, app: app.to_owned(), by: managed_by(&live.metadata) }.into());
        }
        match t.api.patch(&t.name, &PatchParams::apply(MANAGER), &Patch::Apply(obj)).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Err(NotFerrys::conflict(cluster, &t.kind, t.what, &s.message).into()),
            Err(e) => Err(api_err(cluster, e)),
        }
    }

    /// Deletes the object `obj` names from `cluster` when it is Ferry's for `app` (that very
    /// object: a UID precondition); gone already is done, and one that is not Ferry's is
    /// left alone.
    pub(super) async fn delete_owned(&self, cluster: &str, obj: &Value, app: &str) -> Result<(), StepError> {
        let t = self.target(cluster, obj).await?;
        let Some(live) = t.api.get_opt(&t.name).await.map_err(|e| api_err(cluster, e))? else { return Ok(()) };
        if !is_ferrys(&live.metadata, app) {
            tracing::info!(cluster, object = %t.what, managed_by = %managed_by(&live.metadata), "not Ferry's: left alone");
            return Ok(());
        }
        if live.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        // Gone, or replaced by another object of the name, is done.
        ferry_kube::deletes::delete_if_unchanged(&t.api, &t.name, &live.metadata, DeleteParams::background()).await.map_err(|e| api_err(cluster, e))
    }

    async fn namespaces_api(&self, cluster: &str) -> Result<(kube::Client, Api<Namespace>), StepError> {
        let client = self.cfg.clusters.client(cluster).await.map_err(|e| cluster_err(cluster, e))?;
        Ok((client.clone(), Api::all(client)))
    }

    /// The namespace `obj` (rendered) on `cluster`: created, annotated with `task`, when
    /// missing; left as it is when there.
    pub(super) async fn ensure_namespace(&self, cluster: &str, obj: &Value, app: &str, task: &str) -> Result<NamespaceUse, StepError> {
        let name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_owned();
        let (_, api) = self.namespaces_api(cluster).await?;
        let live = match api.get_opt(&name).await.map_err(|e| api_err(cluster, e))? {
            Some(live) => live,
            None => {
                let mut ns: Namespace =
                    serde_json::from_value(obj.clone()).map_err(|e| StepError::permanent(codes::INTERNAL, format!("rendered Namespace {name}: {e}")))?;
                ns.metadata.annotations.get_or_insert_default().insert(CREATED_BY_ANNOTATION.to_owned(), task.to_owned());
                let pp = PostParams { field_manager: Some(MANAGER.to_owned()), ..PostParams::default() };
                match api.create(&pp, &ns).await {
                    Ok(made) => made,
                    // Made meanwhile by someone else: found.
                    Err(kube::Error::Api(s)) if s.code == 409 => api
                        .get_opt(&name)
                        .await
                        .map_err(|e| api_err(cluster, e))?
                        .ok_or_else(|| StepError::transient(codes::CLUSTER_API, format!("cluster {cluster:?}: Namespace {name} came and went")))?,
                    Err(e) => return Err(api_err(cluster, e)),
                }
            }
        };
        let created = is_ferrys(&live.metadata, app) && created_by(&live.metadata) == Some(task);
        Ok(NamespaceUse { cluster: cluster.to_owned(), namespace: name, created })
    }

    /// Deletes namespace `name` from `cluster` when `rule` allows: Ferry created it for
    /// `app` (by this task, for an undo) and no Deployment but the app's is in it (another
    /// app or someone else moved in). Any other is left as found.
    pub(super) async fn remove_namespace(&self, cluster: &str, name: &str, app: &str, rule: &Namespaces<'_>) -> Result<(), StepError> {
        let (client, api) = self.namespaces_api(cluster).await?;
        let Some(live) = api.get_opt(name).await.map_err(|e| api_err(cluster, e))? else { return Ok(()) };
        if live.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        let by = created_by(&live.metadata).filter(|_| is_ferrys(&live.metadata, app));
        let ours = match (rule, by) {
            (_, None) => false,
            (Namespaces::Ferrys, Some(_)) => true,
            (Namespaces::ThisTask { task, created }, Some(by)) => by == *task && created.as_ref().is_none_or(|c| c.contains(&(cluster.to_owned(), name.to_owned()))),
        };
        if !ours {
            tracing::info!(cluster, namespace = name, managed_by = %managed_by(&live.metadata), "namespace not created by this Ferry task or app: kept");
            return Ok(());
        }
        let others: Vec<String> = Api::<Deployment>::namespaced(client, name)
            .list(&ListParams::default())
            .await
            .map_err(|e| api_err(cluster, e))?
            .items
            .into_iter()
            .filter(|d| !is_ferrys(&d.metadata, app))
            .filter_map(|d| d.metadata.name)
            .collect();
        if !others.is_empty() {
            tracing::info!(cluster, namespace = name, deployments = ?others, "namespace holds others' Deployments: kept");
            return Ok(());
        }
        ferry_kube::deletes::delete_if_unchanged(&api, name, &live.metadata, DeleteParams::background()).await.map_err(|e| api_err(cluster, e))
    }
}

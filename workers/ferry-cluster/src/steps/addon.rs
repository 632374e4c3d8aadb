//! `addon-<name>`, one step per add-on the command asks for: its manifests from the
//! catalog applied to the workload cluster, its Deployments, DaemonSets and StatefulSets
//! ready (raced against a detector of crash-looping Pods, deadline
//! `addon_timeout_seconds`), then its `after` objects. Its undo deletes them all, in
//! reverse (nothing to do when the cluster is gone). Its output is [`Applied`], as
//! `apply`'s; the step is named by the add-on, known only from the spec, so it is read
//! through [`installed`] rather than a declared key.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ferry_kube::step_errors::kube_err;
use ferry_kube::{Check, ClusterError};
use ferry_task::{Step, StepContext, StepError, StepPolicy, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;
use serde_json::Value;

use super::apply::Applied;
use super::{describe, secs, wait_err, wait_policy};
use crate::addons::ReadyCheck;
use crate::handler::Inner;
use crate::render::MANAGER;
use crate::spec::{AddonRequest, ClusterCommand};

/// The name of add-on `addon`'s step.
pub fn step_name(addon: &str) -> String {
    format!("addon-{addon}")
}

/// What the step of add-on `addon` installed, read from `outputs` (step name → JSON);
/// None when it left nothing.
pub fn installed(outputs: &BTreeMap<String, Value>, addon: &str) -> Option<Applied> {
    outputs.get(&step_name(addon)).and_then(|v| Applied::deserialize(v).ok())
}

/// The step of one add-on, named [`step_name`].
pub struct AddonStep {
    inner: Arc<Inner>,
    addon: AddonRequest,
    step: String,
}

impl AddonStep {
    /// The step of `addon`.
    pub(crate) fn new(inner: &Arc<Inner>, addon: &AddonRequest) -> Self {
        Self { inner: inner.clone(), step: step_name(&addon.name), addon: addon.clone() }
    }
}

/// A crash-looping container among `ns`'s Pods named `<workload>-...`.
fn crash_looping(pods: &[Arc<Pod>], workload: &str) -> Option<String> {
    for p in pods {
        let name = p.metadata.name.as_deref().unwrap_or("");
        if !name.starts_with(&format!("{workload}-")) {
            continue;
        }
        for c in p.status.as_ref().and_then(|s| s.container_statuses.as_ref()).into_iter().flatten() {
            let waiting = c.state.as_ref().and_then(|s| s.waiting.as_ref()).and_then(|w| w.reason.as_deref());
            if waiting == Some("CrashLoopBackOff") && c.restart_count >= 3 {
                return Some(format!("pod {name}: container {} is in CrashLoopBackOff after {} restarts", c.name, c.restart_count));
            }
        }
    }
    None
}

impl AddonStep {
    async fn wait_ready(&self, cluster: &str, client: &kube::Client, r: &ReadyCheck, timeout: Duration) -> Result<(), StepError> {
        let w = &self.inner.cfg.watches;
        let ns = Some(r.namespace.as_str());
        let ready = async {
            match r.kind.as_str() {
                "Deployment" => {
                    w.wait_object::<Deployment, ()>(cluster, client, ns, &r.name, timeout, |d| match d {
                        None => Check::Pending("not created yet".into()),
                        Some(d) => {
                            let want = d.spec.replicas.unwrap_or(1);
                            let st = d.status.clone().unwrap_or_default();
                            let fresh = st.observed_generation >= d.metadata.generation;
                            if fresh && st.available_replicas.unwrap_or(0) >= want && st.updated_replicas.unwrap_or(0) >= want {
                                Check::Done(())
                            } else {
                                Check::Pending(format!("{}/{want} available", st.available_replicas.unwrap_or(0)))
                            }
                        }
                    })
                    .await
                }
                "DaemonSet" => {
                    w.wait_object::<DaemonSet, ()>(cluster, client, ns, &r.name, timeout, |d| match d {
                        None => Check::Pending("not created yet".into()),
                        Some(d) => {
                            let st = d.status.clone().unwrap_or_default();
                            let fresh = st.observed_generation >= d.metadata.generation && d.status.is_some();
                            if fresh && st.number_ready >= st.desired_number_scheduled {
                                Check::Done(())
                            } else {
                                Check::Pending(format!("{}/{} ready", st.number_ready, st.desired_number_scheduled))
                            }
                        }
                    })
                    .await
                }
                _ => {
                    w.wait_object::<StatefulSet, ()>(cluster, client, ns, &r.name, timeout, |s| match s {
                        None => Check::Pending("not created yet".into()),
                        Some(s) => {
                            let want = s.spec.replicas.unwrap_or(1);
                            let ready = s.status.as_ref().and_then(|st| st.ready_replicas).unwrap_or(0);
                            if ready >= want { Check::Done(()) } else { Check::Pending(format!("{ready}/{want} ready")) }
                        }
                    })
                    .await
                }
            }
        };
        let crashing = w.wait_store::<Pod, String>(cluster, client, ns, "crash-looping pods", timeout + Duration::from_secs(5), |store| {
            crash_looping(&store.state(), &r.name).map_or_else(|| Check::Pending("none".into()), Check::Done)
        });
        tokio::select! {
            r = ready => r.map_err(wait_err),
            c = crashing => match c {
                Ok(why) => Err(StepError::permanent(codes::ADDON_FAILED, format!("add-on {} on {cluster}: {} {}/{} will not become ready: {why}", self.addon.name, r.kind, r.namespace, r.name))),
                Err(e) => Err(wait_err(e)),
            },
        }
    }

    async fn apply_all(&self, cluster: &str, objects: &[Value]) -> Result<(), StepError> {
        for o in objects {
            match self.inner.cfg.clusters.apply(cluster, o, MANAGER).await {
                Ok(_) => {}
                // A custom resource whose CRD this add-on applied a moment ago: retried.
                Err(e @ ClusterError::NotServed { .. }) => {
                    return Err(StepError::transient(codes::APPLY_FAILED, e.to_string()));
                }
                Err(e) => return Err(kube_err(codes::APPLY_FAILED, e)),
            }
        }
        Ok(())
    }
}

impl Step<ClusterCommand> for AddonStep {
    fn name(&self) -> &str {
        &self.step
    }

    fn policy(&self) -> StepPolicy {
        wait_policy(Duration::from_secs(600))
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let cmd = cx.spec;
            let cluster = cmd.name.as_str();
            let m = self.inner.cfg.catalog.manifests(&self.addon, cluster).await.map_err(|e| {
                if e.is_transient() { StepError::transient(codes::ADDON_SOURCE, e.to_string()) } else { StepError::permanent(codes::ADDON_SOURCE, e.to_string()) }
            })?;
            self.apply_all(cluster, &m.install).await?;
            cx.progress(30, format!("applied {} objects of {}", m.install.len(), self.addon.name));
            let client = self.inner.cfg.clusters.client(cluster).await.map_err(|e| kube_err(codes::KUBECONFIG, e))?;
            let timeout = secs(cmd.addon_timeout_seconds, 600);
            for r in &self.inner.cfg.catalog.ready_checks(&self.addon, cluster) {
                self.wait_ready(cluster, &client, r, timeout).await?;
                cx.progress(80, format!("{} {}/{} ready", r.kind, r.namespace, r.name));
            }
            self.apply_all(cluster, &m.after).await?;
            cx.progress(100, format!("add-on {} ready", self.addon.name));
            let applied = Applied { objects: m.install.iter().chain(&m.after).map(describe).collect() };
            serde_json::to_value(applied).map_err(|e| StepError::permanent(codes::INTERNAL, format!("the {} step's output does not serialize: {e}", self.step)))
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, ClusterCommand>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            let cluster = cx.spec.name.as_str();
            // The cluster (or its kubeconfig) is gone already: so is the add-on.
            match self.inner.cfg.clusters.client(cluster).await {
                Err(ClusterError::Unknown { .. }) => return Ok(()),
                Err(e) => return Err(kube_err(codes::KUBECONFIG, e)),
                Ok(_) => {}
            }
            let m = self.inner.cfg.catalog.manifests(&self.addon, cluster).await.map_err(|e| StepError::transient(codes::ADDON_SOURCE, e.to_string()))?;
            for o in m.after.iter().chain(&m.install).rev() {
                match self.inner.cfg.clusters.delete(cluster, o).await {
                    Ok(_) | Err(ClusterError::NotServed { .. }) => {}
                    Err(e) => return Err(kube_err(codes::WORKLOAD_API, e)),
                }
            }
            cx.progress(100, format!("add-on {} removed", self.addon.name));
            Ok(())
        }
        .boxed()
    }
}

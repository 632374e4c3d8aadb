//! `wait`: every component rolled out on each of its clusters, judged as `kubectl rollout
//! status` judges it (from the ManifestWork's status feedback once the work agent applied
//! its current generation and the feedback was read after that apply,
//! `render::feedback_is_current`, or from the Deployment itself with direct delivery; a
//! server-side apply conflict the work agent met fails it, `OBJECT_NOT_FERRYS`), and the
//! objects the app left gone; progress from ready replicas, deadline
//! `ready_timeout_seconds`. It changes nothing, so its undo has nothing to put back (the
//! undo of `apply` removes what did not become ready).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_kube::conditions::{DeploymentCounts, Rollout};
use ferry_kube::kinds::ManifestWork;
use ferry_kube::step_errors::kube_err;
use ferry_kube::{Check, HUB};
use ferry_task::{CheckStep, Output, StepContext, StepError, StepPolicy, codes};
use futures::FutureExt;
use futures::future::{BoxFuture, join_all};
use k8s_openapi::api::apps::v1::Deployment;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::check::CHECK;
use super::{desired, ssa_conflict, unapplied};
use crate::handler::Inner;
use crate::ownership::NotFerrys;
use crate::render::{self, AppState};
use crate::spec::{Component, Delivery, DeployApp};

/// The `wait` step's output.
pub const WAIT: Output<Ready> = Output::new("wait");

/// Output of `wait`: each component on each of its clusters (none after a delete).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ready {
    /// One per component and cluster.
    pub components: Vec<ComponentStatus>,
}

/// One component on one cluster, as the `wait` step left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComponentStatus {
    /// The component.
    pub component: String,
    /// The cluster.
    pub cluster: String,
    /// Ready replicas.
    pub ready: i64,
    /// Its Service's ClusterIP or load-balancer address, when it has one.
    #[serde(default)]
    pub address: Option<String>,
}

/// The `wait` step; `ready` is the task's readiness deadline.
pub struct Wait {
    inner: Arc<Inner>,
    ready: Duration,
}

impl Wait {
    pub(crate) fn new(inner: Arc<Inner>, ready: Duration) -> Self {
        Self { inner, ready }
    }

    async fn wait_work(&self, cx: &StepContext<'_, DeployApp>, state: &AppState, cluster: &str, comps: &[&Component], seen: &Mutex<BTreeMap<(String, String), Rollout>>) -> Result<Vec<ComponentStatus>, StepError> {
        let hub = self.inner.hub();
        let name = render::work_name(&state.spec);
        let total: i64 = state.by_cluster().values().flatten().map(|c| i64::from(c.replicas())).sum();
        let r = self
            .inner
            .cfg
            .watches
            .wait_object::<ManifestWork, Result<Vec<ComponentStatus>, NotFerrys>>(HUB, &hub, Some(cluster), &name, self.ready, |w| {
                let Some(w) = w else { return Check::Pending("the ManifestWork is not there".into()) };
                // A conflict stays one until someone else lets go of the fields: fail now.
                if let Some(e) = ssa_conflict(w, cluster) {
                    return Check::Done(Err(e));
                }
                if let Some(why) = unapplied(w) {
                    return Check::Pending(why);
                }
                let mut out = Vec::new();
                let mut pending = Vec::new();
                let mut changed = false;
                for c in comps {
                    let ns = c.namespace(&state.spec);
                    let values = render::feedback(w, "Deployment", ns, &c.name);
                    // Applied at this generation, yet the feedback may still be the previous
                    // object's (a separate controller refreshes it): judged only once current.
                    let current = render::feedback_is_current(w, &values, ns, &c.name);
                    let r = if current { render::readiness(&values, c.replicas()) } else { render::readiness(&BTreeMap::new(), c.replicas()) };
                    {
                        let mut s = seen.lock().expect("seen lock");
                        let key = (cluster.to_owned(), c.name.clone());
                        if s.get(&key) != Some(&r) {
                            s.insert(key, r);
                            changed = true;
                        }
                    }
                    if !current {
                        pending.push(format!("{} (feedback read before this apply)", c.name));
                    } else if !r.done {
                        pending.push(format!("{} {}", c.name, r.progress()));
                    }
                    let svc = render::feedback(w, "Service", ns, &c.name);
                    let address = svc.get("loadBalancerIP").or(svc.get("clusterIP")).cloned();
                    out.push(ComponentStatus { component: c.name.clone(), cluster: cluster.to_owned(), ready: r.ready, address });
                }
                if changed {
                    let ready: i64 = seen.lock().expect("seen lock").values().map(|r| r.ready.min(r.wanted)).sum();
                    let line: Vec<String> = out.iter().map(|s| format!("{}@{} {} ready", s.component, s.cluster, s.ready)).collect();
                    cx.progress((ready * 100 / total.max(1)).clamp(0, 100) as u8, line.join(", "));
                }
                if pending.is_empty() { Check::Done(Ok(out)) } else { Check::Pending(format!("on {cluster}: {}", pending.join(", "))) }
            })
            .await;
        Ok(r.map_err(|e| StepError::permanent(codes::NOT_READY, e.to_string()))??)
    }

    async fn wait_direct(&self, state: &AppState, cluster: &str, comps: &[&Component]) -> Result<Vec<ComponentStatus>, StepError> {
        let client = self.inner.cfg.clusters.client(cluster).await.map_err(|e| kube_err(codes::CLUSTER_API, e))?;
        let mut out = Vec::new();
        for c in comps {
            let ns = c.namespace(&state.spec);
            // The replicas this task asked for, not the object's: a lagging watch may still
            // show the previous spec.
            let wanted = i64::from(c.replicas());
            let ready = self
                .inner
                .cfg
                .watches
                .wait_object::<Deployment, i64>(cluster, &client, Some(ns), &c.name, self.ready, |d| {
                    let Some(d) = d else { return Check::Pending("the Deployment is not there".into()) };
                    let r = DeploymentCounts::of(d).rollout(wanted);
                    if r.done { Check::Done(r.ready) } else { Check::Pending(format!("{} {} on {cluster}", c.name, r.progress())) }
                })
                .await
                .map_err(|e| StepError::permanent(codes::NOT_READY, e.to_string()))?;
            out.push(ComponentStatus { component: c.name.clone(), cluster: cluster.to_owned(), ready, address: None });
        }
        Ok(out)
    }
}

impl CheckStep<DeployApp> for Wait {
    fn name(&self) -> &str {
        WAIT.step()
    }

    fn policy(&self) -> StepPolicy {
        // The readiness deadline bounds the wait; a miss is final (the task reverts).
        StepPolicy { timeout: self.ready + self.inner.cfg.removal_timeout + Duration::from_secs(60), ..StepPolicy::default() }
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, DeployApp>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let previous = CHECK.required(cx)?.previous;
            let to = desired(cx)?;
            let mut statuses = Vec::new();
            if let Some(state) = &to {
                let seen = Mutex::new(BTreeMap::new());
                let by = state.by_cluster();
                let waits = by.iter().map(|(cluster, comps)| {
                    let seen = &seen;
                    async move {
                        match state.spec.delivery {
                            Delivery::ManifestWork => self.wait_work(cx, state, cluster, comps, seen).await,
                            Delivery::Direct => self.wait_direct(state, cluster, comps).await,
                        }
                    }
                });
                for r in join_all(waits).await {
                    statuses.extend(r?);
                }
            }
            self.inner.wait_removed(previous.as_ref(), to.as_ref()).await?;
            let msg = match &to {
                Some(s) => format!("{} component(s) ready on {} cluster(s)", s.spec.components.len(), s.clusters().len()),
                None => format!("app {} removed from every cluster", cx.spec.subject()),
            };
            cx.progress(100, msg);
            WAIT.value(&Ready { components: statuses })
        }
        .boxed()
    }
}

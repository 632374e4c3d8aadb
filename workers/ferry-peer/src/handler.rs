//! The `peer` tasks. Liqo: check (both clusters reachable, Liqo's controller manager
//! available and its cluster id known, within the bound) → prepare (tenant namespaces,
//! ForeignClusters) → network (Configurations, GatewayServer, GatewayClient; waits until
//! both sides are Connected) → authentication (Tenant on the provider; waits for the
//! Identity on the consumer) → resources (ResourceSlice; waits for acceptance and the
//! virtual node) → the same two the other way when bidirectional → established (the
//! ForeignCluster's modules). Submariner: check → cluster-set → config → addon (waits
//! until Available on both). Unpeer runs the same steps inverted, in reverse order; every
//! undo deletes exactly the objects labelled for the pair and waits until they are gone.

use std::sync::Arc;
use std::time::Duration;

use ferry_kube::kinds::{ManagedCluster, ManagedClusterAddOn, node_ready};
use ferry_kube::step_errors::{api_err, client_err, hub_err, kube_err, wait_err};
use ferry_kube::{Check, ClusterError, Clusters, HUB, Watches};
use ferry_task::{Rejection, Step, StepContext, StepError, StepPolicy, TaskHandler, TaskKind};
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{Api, Patch, PatchParams};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::liqo::{self, PEERING_LABEL};
use crate::spec::{PeerClusters, PeerMethod, PeerOperation};
use crate::submariner::{self, CLUSTERSET_LABEL};

ferry_kube::resource!(
    /// Liqo Connection (a gateway's tunnel state in `status.value`).
    LiqoConnection, "Connection", "networking.liqo.io", "v1beta1", "connections", Namespaced
);
ferry_kube::resource!(
    /// Liqo Identity (the consumer's credentials toward a provider).
    LiqoIdentity, "Identity", "authentication.liqo.io", "v1beta1", "identities", Namespaced
);
ferry_kube::resource!(
    /// Liqo ResourceSlice.
    LiqoResourceSlice, "ResourceSlice", "authentication.liqo.io", "v1beta1", "resourceslices", Namespaced
);
ferry_kube::resource!(
    /// Liqo GatewayServer.
    LiqoGatewayServer, "GatewayServer", "networking.liqo.io", "v1beta1", "gatewayservers", Namespaced
);
ferry_kube::resource!(
    /// Liqo ForeignCluster.
    LiqoForeignCluster, "ForeignCluster", "core.liqo.io", "v1beta1", "foreignclusters", Cluster
);

/// Field manager of the worker's applies.
pub const MANAGER: &str = "ferry-peer";

/// What the peer worker needs.
#[derive(Clone)]
pub struct PeerConfig {
    /// The hub and the clusters.
    pub clusters: Arc<Clusters>,
    /// Shared watches.
    pub watches: Arc<Watches>,
    /// How long removed objects (namespaces above all) have to disappear.
    pub removal_timeout: Duration,
}

impl PeerConfig {
    /// A config reaching clusters through `clusters`; 300 s for removals.
    pub fn new(clusters: Arc<Clusters>) -> Self {
        Self { clusters, watches: Arc::new(Watches::new()), removal_timeout: Duration::from_secs(300) }
    }
}

struct Inner {
    cfg: PeerConfig,
}

/// The handler of `peer` tasks.
#[derive(Clone)]
pub struct PeerHandler {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for PeerHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerHandler").finish_non_exhaustive()
    }
}

impl PeerHandler {
    /// A handler.
    pub fn new(cfg: PeerConfig) -> Self {
        Self { inner: Arc::new(Inner { cfg }) }
    }
}

fn policy(p: &PeerClusters) -> StepPolicy {
    // Waits are bounded by the command's timeout, removals by the worker's (300 s default).
    StepPolicy { timeout: p.timeout() * 3 + Duration::from_secs(600), ..StepPolicy::default() }
}

/// The clusters' Liqo ids, from `check`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Ids {
    /// The consumer's id.
    pub a: String,
    /// The provider's id.
    pub b: String,
}

fn ids(cx: &StepContext<'_, PeerClusters>) -> Result<Ids, StepError> {
    cx.required("check")
}

impl Inner {
    async fn client(&self, cluster: &str) -> Result<kube::Client, StepError> {
        self.cfg.clusters.client(cluster).await.map_err(client_err)
    }

    async fn apply(&self, cluster: &str, obj: &Value) -> Result<(), StepError> {
        self.cfg.clusters.apply(cluster, obj, MANAGER).await.map(drop).map_err(|e| match e {
            e @ ClusterError::NotServed { .. } => StepError::permanent(ferry_task::codes::LIQO_MISSING, format!("{e}: are Liqo's CRDs installed?")),
            e => kube_err(ferry_task::codes::APPLY_FAILED, e),
        })
    }

    /// Deletes `obj` on `cluster` if it is labelled for this pair (never what another
    /// peering or a person made).
    async fn delete_own(&self, cluster: &str, obj: &Value, pair: &str) -> Result<(), StepError> {
        let current = match self.cfg.clusters.get(cluster, obj).await {
            Ok(c) => c,
            Err(ClusterError::Unknown { .. } | ClusterError::NotServed { .. }) => return Ok(()),
            Err(e) => return Err(kube_err(ferry_task::codes::CLUSTER_API, e)),
        };
        let ours = current.as_ref().and_then(|c| c.metadata.labels.as_ref()).and_then(|l| l.get(PEERING_LABEL)).is_some_and(|v| v == pair);
        if ours {
            self.cfg.clusters.delete(cluster, obj).await.map_err(|e| kube_err(ferry_task::codes::CLUSTER_API, e))?;
        }
        Ok(())
    }

    /// Waits until `cluster` has a Ready node of its own (not a virtual one).
    async fn cluster_ready(&self, cluster: &str, timeout: Duration) -> Result<(), StepError> {
        let client = self.client(cluster).await?;
        self.cfg
            .watches
            .wait_store::<Node, ()>(cluster, &client, None, "a Ready node", timeout, |s| {
                let real: Vec<_> =
                    s.state().into_iter().filter(|n| !n.metadata.labels.as_ref().is_some_and(|l| l.contains_key(liqo::REMOTE_ID_LABEL))).collect();
                let ready = real.iter().filter(|n| node_ready(n)).count();
                if ready > 0 { Check::Done(()) } else { Check::Pending(format!("{ready} of {} nodes Ready", real.len())) }
            })
            .await
            .map_err(|e| wait_err(ferry_task::codes::CLUSTER_NOT_READY, e))
    }

    /// Waits until `cluster` is ready and Liqo runs on it; its cluster id.
    async fn liqo_ready(&self, cluster: &str, timeout: Duration) -> Result<String, StepError> {
        self.cluster_ready(cluster, timeout).await?;
        let client = self.client(cluster).await?;
        self.cfg
            .watches
            .wait_object::<Deployment, ()>(cluster, &client, Some(liqo::LIQO_NAMESPACE), liqo::CONTROLLER_MANAGER, timeout, |d| match d {
                None => Check::Pending("Liqo is not installed (no Deployment liqo/liqo-controller-manager)".into()),
                Some(d) => {
                    let st = d.status.clone().unwrap_or_default();
                    let want = d.spec.replicas.unwrap_or(1);
                    if st.available_replicas.unwrap_or(0) >= want {
                        Check::Done(())
                    } else {
                        Check::Pending(format!("{}/{want} available", st.available_replicas.unwrap_or(0)))
                    }
                }
            })
            .await
            .map_err(|e| wait_err(ferry_task::codes::LIQO_NOT_READY, e))?;
        liqo::cluster_id(client).await.map_err(api_err(cluster))?.ok_or_else(|| {
            StepError::permanent(ferry_task::codes::LIQO_NOT_READY, format!("Liqo on {cluster} has no cluster id (ConfigMap liqo/{})", liqo::CLUSTER_ID_CONFIGMAP))
        })
    }
}

// ---------------------------------------------------------------------------------------
// Steps built from closures: what to apply, what to wait for, what must be gone.

/// A step of a peer task.
type PeerStep = Arc<dyn Step<PeerClusters>>;
type Objects = Arc<dyn Fn(&PeerClusters, &Ids) -> Vec<(String, Value)> + Send + Sync>;
type Waiter = Arc<dyn for<'a> Fn(&'a Inner, &'a PeerClusters, &'a Ids) -> BoxFuture<'a, Result<Value, StepError>> + Send + Sync>;

/// Applies `objects` in order, then waits with `ready`; undo deletes them in reverse
/// (only those labelled for the pair), then waits with `gone`.
struct ObjectsStep {
    inner: Arc<Inner>,
    name: String,
    objects: Objects,
    ready: Option<Waiter>,
    gone: Option<Waiter>,
    timeout: StepPolicy,
}

impl Step<PeerClusters> for ObjectsStep {
    fn name(&self) -> &str {
        &self.name
    }

    fn policy(&self) -> StepPolicy {
        self.timeout.clone()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, PeerClusters>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            // Liqo steps need the ids `check` found; Submariner's ignore them.
            let ids = cx.output_of::<Ids>("check").unwrap_or_default();
            let objs = (self.objects)(cx.spec, &ids);
            for (i, (cluster, o)) in objs.iter().enumerate() {
                self.inner.apply(cluster, o).await?;
                cx.progress(
                    (50 * (i + 1) / objs.len().max(1)) as u8,
                    format!("{} {} on {cluster}", o["kind"].as_str().unwrap_or("?"), o["metadata"]["name"].as_str().unwrap_or("?")),
                );
            }
            let out = match &self.ready {
                Some(w) => w(&self.inner, cx.spec, &ids).await?,
                None => json!({}),
            };
            cx.progress(100, format!("{} done", self.name));
            Ok(out)
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, PeerClusters>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            let ids = cx.output_of::<Ids>("check").unwrap_or_default();
            let pair = liqo::pair_label(&cx.spec.a, &cx.spec.b);
            for (cluster, o) in (self.objects)(cx.spec, &ids).iter().rev() {
                self.inner.delete_own(cluster, o, &pair).await?;
            }
            if let Some(w) = &self.gone {
                w(&self.inner, cx.spec, &ids).await?;
            }
            cx.progress(100, format!("{} removed", self.name));
            Ok(())
        }
        .boxed()
    }
}

/// Runs a step's undo as its run and its run as its undo: unpeer is peer inverted.
struct Inverse(Arc<dyn Step<PeerClusters>>, String);

impl Step<PeerClusters> for Inverse {
    fn name(&self) -> &str {
        &self.1
    }

    fn policy(&self) -> StepPolicy {
        self.0.policy()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, PeerClusters>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            self.0.undo(cx, None).await?;
            Ok(json!({}))
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, PeerClusters>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move { self.0.run(cx).await.map(drop) }.boxed()
    }
}

// ---------------------------------------------------------------------------------------
// Liqo

struct LiqoCheck(Arc<Inner>, StepPolicy);

impl Step<PeerClusters> for LiqoCheck {
    fn acts(&self) -> bool {
        false // reads the live state only
    }

    fn name(&self) -> &str {
        "check"
    }

    fn policy(&self) -> StepPolicy {
        self.1.clone()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, PeerClusters>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let p = cx.spec;
            // Both are known before either is waited on: an unknown cluster is a rejection.
            self.0.client(&p.a).await?;
            self.0.client(&p.b).await?;
            let a = self.0.liqo_ready(&p.a, p.timeout()).await?;
            cx.progress(50, format!("Liqo runs on {} (cluster id {a})", p.a));
            let b = self.0.liqo_ready(&p.b, p.timeout()).await?;
            cx.progress(100, format!("Liqo runs on {} (cluster id {b})", p.b));
            Ok(serde_json::to_value(Ids { a, b }).unwrap_or_default())
        }
        .boxed()
    }

    fn undo<'a>(&'a self, _: &'a StepContext<'a, PeerClusters>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async { Ok(()) }.boxed()
    }
}

/// Waits until the Connection toward `remote` in `cluster`'s tenant namespace is Connected.
async fn connected(inner: &Inner, cluster: &str, remote: &str, timeout: Duration) -> Result<(), StepError> {
    let client = inner.client(cluster).await?;
    let ns = liqo::tenant_namespace(remote);
    inner
        .cfg
        .watches
        .wait_store::<LiqoConnection, ()>(cluster, &client, Some(&ns), &format!("the gateway toward {remote}"), timeout, |s| {
            let states: Vec<String> = s.state().iter().map(|c| c.status_at("/value").and_then(Value::as_str).unwrap_or("(none)").to_owned()).collect();
            if states.iter().any(|v| v == "Connected") { Check::Done(()) } else { Check::Pending(format!("connections: {states:?}")) }
        })
        .await
        .map_err(|e| wait_err(ferry_task::codes::GATEWAY_NOT_CONNECTED, e))
}

/// Waits until nothing of `K` is left in `cluster`'s tenant namespace for `remote`.
async fn none_left<K>(inner: &Inner, cluster: &str, remote: &str, what: &str, timeout: Duration) -> Result<(), StepError>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let client = match inner.cfg.clusters.client(cluster).await {
        Ok(c) => c,
        Err(ClusterError::Unknown { .. }) => return Ok(()),
        Err(e) => return Err(kube_err(ferry_task::codes::CLUSTER_API, e)),
    };
    let ns = liqo::tenant_namespace(remote);
    inner
        .cfg
        .watches
        .wait_store::<K, ()>(cluster, &client, Some(&ns), what, timeout, |s| {
            if s.state().is_empty() { Check::Done(()) } else { Check::Pending(format!("{} left", s.state().len())) }
        })
        .await
        .map_err(|e| wait_err(ferry_task::codes::REMOVAL, e))
}

fn prepare(inner: &Arc<Inner>, p: &PeerClusters) -> ObjectsStep {
    ObjectsStep {
        inner: inner.clone(),
        name: "prepare".into(),
        objects: Arc::new(|p: &PeerClusters, ids: &Ids| {
            let pair = liqo::pair_label(&p.a, &p.b);
            vec![
                (p.a.clone(), liqo::namespace(&ids.b, &pair)),
                (p.b.clone(), liqo::namespace(&ids.a, &pair)),
                (p.a.clone(), liqo::foreign_cluster(&ids.b, &pair)),
                (p.b.clone(), liqo::foreign_cluster(&ids.a, &pair)),
            ]
        }),
        ready: None,
        gone: Some(Arc::new(|inner: &Inner, p: &PeerClusters, ids: &Ids| {
            async move {
                for (cluster, remote) in [(&p.a, &ids.b), (&p.b, &ids.a)] {
                    let Ok(client) = inner.cfg.clusters.client(cluster).await else { continue };
                    inner
                        .cfg
                        .watches
                        .wait_deleted::<Namespace>(cluster, &client, None, &liqo::tenant_namespace(remote), inner.cfg.removal_timeout)
                        .await
                        .map_err(|e| wait_err(ferry_task::codes::REMOVAL, e))?;
                }
                Ok(json!({}))
            }
            .boxed()
        })),
        timeout: policy(p),
    }
}

fn network(inner: &Arc<Inner>, p: &PeerClusters) -> Arc<dyn Step<PeerClusters>> {
    // The server first: the client needs its address, known once the server's Service has one.
    struct Network(Arc<Inner>, StepPolicy);
    impl Step<PeerClusters> for Network {
        fn name(&self) -> &str {
            "network"
        }
        fn policy(&self) -> StepPolicy {
            self.1.clone()
        }
        fn run<'a>(&'a self, cx: &'a StepContext<'a, PeerClusters>) -> BoxFuture<'a, Result<Value, StepError>> {
            async move {
                let (p, ids) = (cx.spec, ids(cx)?);
                let pair = liqo::pair_label(&p.a, &p.b);
                self.0.apply(&p.a, &liqo::configuration(&ids.a, &ids.b, &pair)).await?;
                self.0.apply(&p.b, &liqo::configuration(&ids.b, &ids.a, &pair)).await?;
                self.0.apply(&p.b, &liqo::gateway_server(&ids.a, &pair)).await?;
                cx.progress(20, format!("GatewayServer on {}", p.b));
                let client = self.0.client(&p.b).await?;
                let ns = liqo::tenant_namespace(&ids.a);
                let server = format!("server-{}", ids.a);
                let address = self
                    .0
                    .cfg
                    .watches
                    .wait_object::<LiqoGatewayServer, String>(&p.b, &client, Some(&ns), &server, p.timeout(), |s| {
                        match s.and_then(|s| s.status_at("/endpoint/addresses/0")).and_then(Value::as_str) {
                            Some(a) => Check::Done(a.to_owned()),
                            None => Check::Pending("no endpoint address yet".into()),
                        }
                    })
                    .await
                    .map_err(|e| wait_err(ferry_task::codes::GATEWAY_NOT_CONNECTED, e))?;
                self.0.apply(&p.a, &liqo::gateway_client(&ids.b, &address, &pair)).await?;
                cx.progress(50, format!("GatewayClient on {} toward {address}", p.a));
                connected(&self.0, &p.a, &ids.b, p.timeout()).await?;
                connected(&self.0, &p.b, &ids.a, p.timeout()).await?;
                cx.progress(100, "gateways connected");
                Ok(json!({"gateway": address}))
            }
            .boxed()
        }
        fn undo<'a>(&'a self, cx: &'a StepContext<'a, PeerClusters>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
            async move {
                let (p, ids) = (cx.spec, ids(cx)?);
                let pair = liqo::pair_label(&p.a, &p.b);
                // The gateway's direction is the peering's (client on the consumer), and an
                // unpeer may name the pair in either order: both orientations are removed.
                for (client_side, server_side, client_id, server_id) in [(&p.a, &p.b, &ids.a, &ids.b), (&p.b, &p.a, &ids.b, &ids.a)] {
                    self.0.delete_own(client_side, &liqo::gateway_client(server_id, "", &pair), &pair).await?;
                    self.0.delete_own(server_side, &liqo::gateway_server(client_id, &pair), &pair).await?;
                }
                self.0.delete_own(&p.b, &liqo::configuration(&ids.b, &ids.a, &pair), &pair).await?;
                self.0.delete_own(&p.a, &liqo::configuration(&ids.a, &ids.b, &pair), &pair).await?;
                none_left::<LiqoConnection>(&self.0, &p.a, &ids.b, "connections", self.0.cfg.removal_timeout).await?;
                none_left::<LiqoConnection>(&self.0, &p.b, &ids.a, "connections", self.0.cfg.removal_timeout).await?;
                cx.progress(100, "gateways removed");
                Ok(())
            }
            .boxed()
        }
    }
    Arc::new(Network(inner.clone(), policy(p)))
}

/// Authentication of `consumer` on `provider` (a Tenant there; an Identity here).
fn authentication(inner: &Arc<Inner>, p: &PeerClusters, reverse: bool) -> ObjectsStep {
    let name = if reverse { "authentication-reverse" } else { "authentication" };
    ObjectsStep {
        inner: inner.clone(),
        name: name.into(),
        objects: Arc::new(move |p: &PeerClusters, ids: &Ids| {
            let pair = liqo::pair_label(&p.a, &p.b);
            let (_, provider, consumer_id, _) = roles(p, ids, reverse);
            vec![(provider, liqo::tenant(&consumer_id, &pair))]
        }),
        ready: Some(Arc::new(move |inner: &Inner, p: &PeerClusters, ids: &Ids| {
            async move {
                let (consumer, _, _, provider_id) = roles(p, ids, reverse);
                let client = inner.client(&consumer).await?;
                inner
                    .cfg
                    .watches
                    .wait_store::<LiqoIdentity, ()>(&consumer, &client, Some(&liqo::tenant_namespace(&provider_id)), "the Identity", p.timeout(), |s| {
                        if s.state().is_empty() { Check::Pending("no Identity yet".into()) } else { Check::Done(()) }
                    })
                    .await
                    .map_err(|e| wait_err(ferry_task::codes::AUTHENTICATION, e))?;
                Ok(json!({"consumer": consumer}))
            }
            .boxed()
        })),
        gone: Some(Arc::new(move |inner: &Inner, p: &PeerClusters, ids: &Ids| {
            async move {
                let (consumer, _, _, provider_id) = roles(p, ids, reverse);
                none_left::<LiqoIdentity>(inner, &consumer, &provider_id, "identities", inner.cfg.removal_timeout).await?;
                Ok(json!({}))
            }
            .boxed()
        })),
        timeout: policy(p),
    }
}

/// (consumer, provider, consumer id, provider id) of a direction.
fn roles(p: &PeerClusters, ids: &Ids, reverse: bool) -> (String, String, String, String) {
    if reverse { (p.b.clone(), p.a.clone(), ids.b.clone(), ids.a.clone()) } else { (p.a.clone(), p.b.clone(), ids.a.clone(), ids.b.clone()) }
}

/// Resources of `provider` for `consumer`: a ResourceSlice; a Ready virtual node.
fn resources(inner: &Arc<Inner>, p: &PeerClusters, reverse: bool) -> ObjectsStep {
    let name = if reverse { "resources-reverse" } else { "resources" };
    ObjectsStep {
        inner: inner.clone(),
        name: name.into(),
        objects: Arc::new(move |p: &PeerClusters, ids: &Ids| {
            let pair = liqo::pair_label(&p.a, &p.b);
            let (consumer, _, consumer_id, provider_id) = roles(p, ids, reverse);
            vec![(consumer, liqo::resource_slice(&consumer_id, &provider_id, &pair))]
        }),
        ready: Some(Arc::new(move |inner: &Inner, p: &PeerClusters, ids: &Ids| {
            async move {
                let (consumer, _, _, provider_id) = roles(p, ids, reverse);
                let client = inner.client(&consumer).await?;
                let ns = liqo::tenant_namespace(&provider_id);
                let offered = inner
                    .cfg
                    .watches
                    .wait_object::<LiqoResourceSlice, Value>(&consumer, &client, Some(&ns), &provider_id, p.timeout(), |s| {
                        let res = s
                            .and_then(|s| s.status_at("/conditions"))
                            .and_then(Value::as_array)
                            .and_then(|cs| cs.iter().find(|c| c["type"] == "Resources"))
                            .and_then(|c| c["status"].as_str());
                        match res {
                            Some("Accepted") => Check::Done(s.and_then(|s| s.status_at("/resources")).cloned().unwrap_or_default()),
                            Some("Denied") => Check::Failed("the provider denied the ResourceSlice".into()),
                            _ => Check::Pending("not accepted yet".into()),
                        }
                    })
                    .await
                    .map_err(|e| wait_err(ferry_task::codes::RESOURCES, e))?;
                let node = format!("liqo-{provider_id}");
                inner
                    .cfg
                    .watches
                    .wait_object::<Node, ()>(&consumer, &client, None, &node, p.timeout(), |n| {
                        if n.is_some_and(node_ready) { Check::Done(()) } else { Check::Pending("the virtual node is not Ready yet".into()) }
                    })
                    .await
                    .map_err(|e| wait_err(ferry_task::codes::VIRTUAL_NODE, e))?;
                Ok(json!({"virtual_node": node, "on": consumer, "resources": offered}))
            }
            .boxed()
        })),
        gone: Some(Arc::new(move |inner: &Inner, p: &PeerClusters, ids: &Ids| {
            async move {
                let (consumer, _, _, provider_id) = roles(p, ids, reverse);
                let Ok(client) = inner.cfg.clusters.client(&consumer).await else { return Ok(json!({})) };
                inner
                    .cfg
                    .watches
                    .wait_deleted::<Node>(&consumer, &client, None, &format!("liqo-{provider_id}"), inner.cfg.removal_timeout)
                    .await
                    .map_err(|e| wait_err(ferry_task::codes::REMOVAL, e))?;
                Ok(json!({}))
            }
            .boxed()
        })),
        timeout: policy(p),
    }
}

struct Established(Arc<Inner>, StepPolicy);

impl Step<PeerClusters> for Established {
    fn name(&self) -> &str {
        "established"
    }

    fn policy(&self) -> StepPolicy {
        self.1.clone()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, PeerClusters>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let (p, ids) = (cx.spec, ids(cx)?);
            let mut sides = vec![(p.a.clone(), ids.b.clone())];
            if p.bidirectional {
                sides.push((p.b.clone(), ids.a.clone()));
            }
            let mut roles = Vec::new();
            for (cluster, remote) in sides {
                let client = self.0.client(&cluster).await?;
                let role = self
                    .0
                    .cfg
                    .watches
                    .wait_object::<LiqoForeignCluster, String>(&cluster, &client, None, &remote, p.timeout(), |fc| {
                        let Some(fc) = fc else { return Check::Pending("no ForeignCluster".into()) };
                        let status = |module: &str, type_: &str| {
                            fc.status_at(&format!("/modules/{module}/conditions"))
                                .and_then(Value::as_array)
                                .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
                                .and_then(|c| c["status"].as_str())
                                .unwrap_or("(none)")
                                .to_owned()
                        };
                        let (n, a, o) = (
                            status("networking", "NetworkConnectionStatus"),
                            status("authentication", "AuthIdentityControlPlaneStatus"),
                            status("offloading", "OffloadingVirtualNodeStatus"),
                        );
                        if n == "Established" && a == "Established" && o == "Ready" {
                            Check::Done(fc.status_at("/role").and_then(Value::as_str).unwrap_or("").to_owned())
                        } else {
                            Check::Pending(format!("networking {n}, authentication {a}, offloading {o}"))
                        }
                    })
                    .await
                    .map_err(|e| wait_err(ferry_task::codes::NOT_ESTABLISHED, e))?;
                cx.progress(100, format!("ForeignCluster {remote} on {cluster}: established ({role})"));
                roles.push(json!({"cluster": cluster, "remote": remote, "role": role}));
            }
            Ok(json!({"foreign_clusters": roles}))
        }
        .boxed()
    }

    fn undo<'a>(&'a self, _: &'a StepContext<'a, PeerClusters>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async { Ok(()) }.boxed()
    }
}

fn liqo_steps(inner: &Arc<Inner>, p: &PeerClusters) -> Vec<Arc<dyn Step<PeerClusters>>> {
    let mut steps: Vec<Arc<dyn Step<PeerClusters>>> =
        vec![Arc::new(prepare(inner, p)), network(inner, p), Arc::new(authentication(inner, p, false)), Arc::new(resources(inner, p, false))];
    if p.bidirectional {
        steps.push(Arc::new(authentication(inner, p, true)));
        steps.push(Arc::new(resources(inner, p, true)));
    }
    steps
}

// ---------------------------------------------------------------------------------------
// Submariner

/// Output of the Submariner `check`: each cluster's set before, and the set to join.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Sets {
    /// `a`'s set label before (none: no label).
    pub a: Option<String>,
    /// `b`'s.
    pub b: Option<String>,
    /// The set both join.
    pub target: String,
    /// The set existed before.
    pub existed: bool,
}

fn sets(cx: &StepContext<'_, PeerClusters>) -> Result<Sets, StepError> {
    cx.required("check")
}

struct SubmarinerCheck(Arc<Inner>);

impl Step<PeerClusters> for SubmarinerCheck {
    fn acts(&self) -> bool {
        false // reads the live state only
    }

    fn name(&self) -> &str {
        "check"
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, PeerClusters>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let p = cx.spec;
            let hub = self.0.cfg.clusters.hub().clone();
            let mcs: Api<ManagedCluster> = Api::all(hub.clone());
            let mut labels = Vec::new();
            for c in [&p.a, &p.b] {
                let Some(mc) = mcs.get_opt(c).await.map_err(hub_err)? else {
                    return Err(StepError::rejected(ferry_task::codes::UNKNOWN_CLUSTER, format!("{c} is not a ManagedCluster of the hub")));
                };
                labels.push(mc.metadata.labels.as_ref().and_then(|l| l.get(CLUSTERSET_LABEL)).cloned());
            }
            let gvk = kube::core::GroupVersionKind::gvk("addon.open-cluster-management.io", "v1alpha1", "ClusterManagementAddOn");
            let cma = self.0.cfg.clusters.api(HUB, &gvk, None).await.map_err(|e| kube_err(ferry_task::codes::HUB_API, e))?;
            if cma.get_opt("submariner").await.map_err(hub_err)?.is_none() {
                return Err(StepError::rejected(ferry_task::codes::SUBMARINER_MISSING, "the hub has no ClusterManagementAddOn submariner: install the submariner-addon first"));
            }
            for c in [&p.a, &p.b] {
                self.0
                    .cfg
                    .watches
                    .wait_object::<ManagedCluster, ()>(HUB, &hub, None, c, p.timeout(), |m| match m {
                        Some(m) if m.condition("ManagedClusterConditionAvailable") == Some("True") => Check::Done(()),
                        _ => Check::Pending("not Available".into()),
                    })
                    .await
                    .map_err(|e| wait_err(ferry_task::codes::CLUSTER_NOT_READY, e))?;
            }
            let target = match (&p.cluster_set, &labels[0], &labels[1]) {
                (Some(s), _, _) => s.clone(),
                (None, Some(x), Some(y)) if x == y => x.clone(),
                _ => "submariner".to_owned(),
            };
            let gvk = kube::core::GroupVersionKind::gvk("cluster.open-cluster-management.io", "v1beta2", "ManagedClusterSet");
            let api = self.0.cfg.clusters.api(HUB, &gvk, None).await.map_err(|e| kube_err(ferry_task::codes::HUB_API, e))?;
            let existed = api.get_opt(&target).await.map_err(hub_err)?.is_some();
            cx.progress(100, format!("both clusters available; they join ManagedClusterSet {target}"));
            Ok(serde_json::to_value(Sets { a: labels[0].clone(), b: labels[1].clone(), target, existed }).unwrap_or_default())
        }
        .boxed()
    }

    fn undo<'a>(&'a self, _: &'a StepContext<'a, PeerClusters>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async { Ok(()) }.boxed()
    }
}

struct ClusterSet(Arc<Inner>);

impl ClusterSet {
    async fn label(&self, cluster: &str, set: Option<&str>) -> Result<(), StepError> {
        let api: Api<ManagedCluster> = Api::all(self.0.cfg.clusters.hub().clone());
        let patch = json!({"metadata": {"labels": {CLUSTERSET_LABEL: set}}});
        api.patch(cluster, &PatchParams::default(), &Patch::Merge(&patch)).await.map_err(hub_err)?;
        Ok(())
    }
}

impl Step<PeerClusters> for ClusterSet {
    fn name(&self) -> &str {
        "cluster-set"
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, PeerClusters>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let (p, s) = (cx.spec, sets(cx)?);
            if !s.existed {
                self.0.apply(HUB, &submariner::cluster_set(&s.target, &liqo::pair_label(&p.a, &p.b))).await?;
            }
            self.label(&p.a, Some(&s.target)).await?;
            self.label(&p.b, Some(&s.target)).await?;
            cx.progress(100, format!("{} and {} are in ManagedClusterSet {}", p.a, p.b, s.target));
            Ok(json!({"set": s.target}))
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, PeerClusters>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            let (p, s) = (cx.spec, sets(cx)?);
            self.label(&p.a, s.a.as_deref()).await?;
            self.label(&p.b, s.b.as_deref()).await?;
            if !s.existed {
                let pair = liqo::pair_label(&p.a, &p.b);
                self.0.delete_own(HUB, &submariner::cluster_set(&s.target, &pair), &pair).await?;
            }
            Ok(())
        }
        .boxed()
    }
}

fn submariner_steps(inner: &Arc<Inner>, p: &PeerClusters) -> Vec<Arc<dyn Step<PeerClusters>>> {
    let config = ObjectsStep {
        inner: inner.clone(),
        name: "config".into(),
        objects: Arc::new(|p: &PeerClusters, _: &Ids| {
            let pair = liqo::pair_label(&p.a, &p.b);
            vec![(HUB.to_owned(), submariner::config(&p.a, &pair)), (HUB.to_owned(), submariner::config(&p.b, &pair))]
        }),
        ready: None,
        gone: None,
        timeout: policy(p),
    };
    let addon = ObjectsStep {
        inner: inner.clone(),
        name: "addon".into(),
        objects: Arc::new(|p: &PeerClusters, _: &Ids| {
            let pair = liqo::pair_label(&p.a, &p.b);
            vec![(HUB.to_owned(), submariner::addon(&p.a, &pair)), (HUB.to_owned(), submariner::addon(&p.b, &pair))]
        }),
        ready: Some(Arc::new(|inner: &Inner, p: &PeerClusters, _: &Ids| {
            async move {
                let hub = inner.cfg.clusters.hub().clone();
                for c in [&p.a, &p.b] {
                    // The shared watch may still hold an add-on an earlier peering removed:
                    // only the one there now (by uid, read fresh) counts.
                    let now = Api::<ManagedClusterAddOn>::namespaced(hub.clone(), c).get_opt("submariner").await.map_err(hub_err)?;
                    let uid = now.and_then(|a| a.metadata.uid);
                    inner
                        .cfg
                        .watches
                        .wait_object::<ManagedClusterAddOn, ()>(HUB, &hub, Some(c), "submariner", p.timeout(), |a| match a {
                            Some(a) if a.metadata.uid != uid => Check::Pending("the watch has not seen the current add-on yet".into()),
                            Some(a) if a.condition("Available") == Some("True") => Check::Done(()),
                            Some(a) => Check::Pending(
                                ferry_kube::kinds::condition_message(&a.status, "Available").unwrap_or_else(|| "no Available condition yet".into()),
                            ),
                            None => Check::Pending("not seen yet".into()),
                        })
                        .await
                        .map_err(|e| wait_err(ferry_task::codes::SUBMARINER_NOT_AVAILABLE, e))?;
                }
                Ok(json!({"available": [p.a, p.b]}))
            }
            .boxed()
        })),
        gone: Some(Arc::new(|inner: &Inner, p: &PeerClusters, _: &Ids| {
            async move {
                let hub = inner.cfg.clusters.hub().clone();
                for c in [&p.a, &p.b] {
                    inner
                        .cfg
                        .watches
                        .wait_deleted::<ManagedClusterAddOn>(HUB, &hub, Some(c), "submariner", inner.cfg.removal_timeout)
                        .await
                        .map_err(|e| wait_err(ferry_task::codes::REMOVAL, e))?;
                }
                Ok(json!({}))
            }
            .boxed()
        })),
        timeout: policy(p),
    };
    vec![Arc::new(ClusterSet(inner.clone())), Arc::new(config), Arc::new(addon)]
}

// ---------------------------------------------------------------------------------------

impl TaskHandler for PeerHandler {
    type Spec = PeerClusters;

    fn kind(&self) -> TaskKind {
        TaskKind::Peer
    }

    fn validate(&self, subject: &str, spec: &PeerClusters) -> Result<(), Rejection> {
        crate::spec::validate(subject, spec)
    }

    fn plan(&self, p: &PeerClusters) -> Vec<Arc<dyn Step<PeerClusters>>> {
        let i = &self.inner;
        let (check, steps): (PeerStep, Vec<PeerStep>) = match p.method {
            PeerMethod::Liqo => {
                // Unpeer removes both directions, whatever the peer asked.
                let all = PeerClusters { bidirectional: p.bidirectional || p.operation == PeerOperation::Unpeer, ..p.clone() };
                (Arc::new(LiqoCheck(i.clone(), policy(p))), liqo_steps(i, &all))
            }
            PeerMethod::Submariner => (Arc::new(SubmarinerCheck(i.clone())), submariner_steps(i, p)),
        };
        let mut plan = vec![check];
        match p.operation {
            PeerOperation::Peer => {
                plan.extend(steps);
                if p.method == PeerMethod::Liqo {
                    plan.push(Arc::new(Established(i.clone(), policy(p))));
                }
            }
            PeerOperation::Unpeer => {
                for s in steps.into_iter().rev() {
                    let name = format!("remove-{}", s.name());
                    plan.push(Arc::new(Inverse(s, name)));
                }
            }
        }
        plan
    }
}

//! The `peer` tasks' handler: the configuration, what every step shares (applies,
//! deletes of the pair's own objects, readiness waits), and [`PeerHandler::plan`], the
//! table of contents. Liqo: check → prepare → network → authentication → resources (→ the
//! reverse pair when bidirectional) → established; a force unpeer: check → force-unpeer
//! (`a` alone, `b` never contacted). Submariner: check → cluster-set →
//! broker → config → addon. Unpeer runs the same steps inverted, in reverse order. Each step is a
//! module of [`crate::steps`].

use std::sync::Arc;
use std::time::Duration;

use ferry_kube::kinds::node_ready;
use ferry_kube::step_errors::{api_err, client_err, kube_err, wait_err};
use ferry_kube::{Check, ClusterError, Clusters, Watches};
use ferry_task::{Rejection, Step, StepError, TaskHandler, TaskKind, codes};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Node;
use serde_json::Value;

use crate::liqo;
use crate::spec::{PeerClusters, PeerMethod, PeerOperation};
use crate::steps::authentication::Authentication;
use crate::steps::cluster_set::ClusterSet;
use crate::steps::established::EstablishedCheck;
use crate::steps::force_unpeer::{ForceCheck, ForceUnpeer};
use crate::steps::LiqoForeignCluster;
use crate::steps::liqo_check::LiqoCheck;
use crate::steps::network::Network;
use crate::steps::objects::{Applies, Inverse, UnlessReused};
use crate::steps::prepare::Prepare;
use crate::steps::resources::Resources;
use crate::steps::submariner_addon::{Addon, Config};
use crate::steps::submariner_check::SubmarinerCheck;
use crate::steps::policy;

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

/// What every step shares: the configuration and the helpers below.
pub(crate) struct Inner {
    pub(crate) cfg: PeerConfig,
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

impl Inner {
    pub(crate) async fn client(&self, cluster: &str) -> Result<kube::Client, StepError> {
        self.cfg.clusters.client(cluster).await.map_err(client_err)
    }

    pub(crate) async fn apply(&self, cluster: &str, obj: &Value) -> Result<(), StepError> {
        self.apply_obj(cluster, obj).await.map(drop)
    }

    /// Applies `obj` on `cluster`; the object as the API server stored it.
    pub(crate) async fn apply_obj(&self, cluster: &str, obj: &Value) -> Result<kube::api::DynamicObject, StepError> {
        self.cfg.clusters.apply(cluster, obj, MANAGER).await.map_err(|e| match e {
            e @ ClusterError::NotServed { .. } => StepError::permanent(codes::LIQO_MISSING, format!("{e}: are Liqo's CRDs installed?")),
            e => kube_err(codes::APPLY_FAILED, e),
        })
    }

    /// Deletes `obj` on `cluster` if it is labelled for this pair ([`liqo::is_pairs`]; never what another
    /// peering or a person made).
    pub(crate) async fn delete_own(&self, cluster: &str, obj: &Value, pair: &str) -> Result<(), StepError> {
        let current = match self.cfg.clusters.get(cluster, obj).await {
            Ok(c) => c,
            Err(ClusterError::Unknown { .. } | ClusterError::NotServed { .. }) => return Ok(()),
            Err(e) => return Err(kube_err(codes::CLUSTER_API, e)),
        };
        if current.is_some_and(|c| liqo::is_pairs(&serde_json::to_value(c).unwrap_or_default(), pair)) {
            self.cfg.clusters.delete(cluster, obj).await.map_err(|e| kube_err(codes::CLUSTER_API, e))?;
        }
        Ok(())
    }

    /// Whether `cluster` has a ForeignCluster of remote cluster id `remote` (Liqo names it
    /// by the id).
    pub(crate) async fn foreign_cluster(&self, cluster: &str, remote: &str) -> Result<bool, StepError> {
        let api: kube::Api<LiqoForeignCluster> = kube::Api::all(self.client(cluster).await?);
        match api.get_opt(remote).await {
            Ok(fc) => Ok(fc.is_some()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
            Err(e) => Err(api_err(cluster)(e)),
        }
    }

    /// Deletes `cluster`'s ForeignCluster of `remote` and waits until it is gone (Liqo's
    /// controller drops its finalizer).
    pub(crate) async fn forget_foreign_cluster(&self, cluster: &str, remote: &str) -> Result<(), StepError> {
        let Ok(client) = self.cfg.clusters.client(cluster).await else { return Ok(()) };
        let api: kube::Api<LiqoForeignCluster> = kube::Api::all(client.clone());
        match api.delete(remote, &kube::api::DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
            Err(e) => return Err(api_err(cluster)(e)),
        }
        self.cfg
            .watches
            .wait_deleted::<LiqoForeignCluster>(cluster, &client, None, remote, self.cfg.removal_timeout)
            .await
            .map_err(|e| wait_err(codes::REMOVAL, e))
    }

    /// The latest Warning event Liqo recorded on `kind` `name` (uid `uid` when given) in
    /// `ns` on `cluster`, as `reason: message`: why a controller refuses it.
    pub(crate) async fn refusal(&self, cluster: &str, ns: &str, kind: &str, name: &str, uid: Option<&str>) -> Option<String> {
        let client = self.client(cluster).await.ok()?;
        let lp = kube::api::ListParams::default().fields(&format!("involvedObject.name={name},type=Warning"));
        let events = kube::Api::<k8s_openapi::api::core::v1::Event>::namespaced(client, ns).list(&lp).await.ok()?.items;
        events
            .into_iter()
            .filter(|e| e.involved_object.kind.as_deref() == Some(kind) && uid.is_none_or(|u| e.involved_object.uid.as_deref() == Some(u)))
            .max_by_key(|e| e.last_timestamp.as_ref().map(|t| t.0))
            .map(|e| format!("{}: {}", e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
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
            .map_err(|e| wait_err(codes::CLUSTER_NOT_READY, e))
    }

    /// Waits until `cluster` is ready and Liqo runs on it; its cluster id.
    pub(crate) async fn liqo_ready(&self, cluster: &str, timeout: Duration) -> Result<String, StepError> {
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
            .map_err(|e| wait_err(codes::LIQO_NOT_READY, e))?;
        liqo::cluster_id(client).await.map_err(api_err(cluster))?.ok_or_else(|| {
            StepError::permanent(codes::LIQO_NOT_READY, format!("Liqo on {cluster} has no cluster id (ConfigMap liqo/{})", liqo::CLUSTER_ID_CONFIGMAP))
        })
    }
}

impl Inner {
    /// Waits until `cluster`'s IPAM holds its pod and external CIDRs (Networks in Liqo's
    /// namespace with `status.cidr`; [`ipam_cidrs`]); them.
    pub(crate) async fn ipam_cidrs(&self, cluster: &str, timeout: Duration) -> Result<liqo::Cidrs, StepError> {
        let client = self.client(cluster).await?;
        self.cfg
            .watches
            .wait_store::<crate::steps::LiqoNetwork, liqo::Cidrs>(cluster, &client, Some(liqo::LIQO_NAMESPACE), "the IPAM's networks", timeout, |s| {
                ipam_cidrs(&s.state())
            })
            .await
            .map_err(|e| wait_err(codes::LIQO_NOT_READY, e))
    }

    /// Waits until `cluster` (a provider) has the ClusterRoles Liqo's tenant controller
    /// binds for a consumer, found by their `app.kubernetes.io/name` as that controller
    /// finds them (liqotech/liqo `tenant-controller/tenant_controller.go`, `ensureSetup`).
    /// Without them it reconciles no Tenant and records no event, so the peering would
    /// wait out its deadline at `authentication` with no reason given.
    pub(crate) async fn tenant_roles(&self, cluster: &str, timeout: Duration) -> Result<(), StepError> {
        use ferry_kube::vocab::liqo::{APP_NAME_LABEL, TENANT_ROLE_APPS};
        let client = self.client(cluster).await?;
        self.cfg
            .watches
            .wait_store::<k8s_openapi::api::rbac::v1::ClusterRole, ()>(cluster, &client, None, "Liqo's tenant ClusterRoles", timeout, |s| {
                let roles = s.state();
                let missing: Vec<String> = TENANT_ROLE_APPS
                    .iter()
                    .filter(|app| !roles.iter().any(|r| r.metadata.labels.as_ref().and_then(|l| l.get(APP_NAME_LABEL)).is_some_and(|v| v == *app)))
                    .map(|app| format!("{APP_NAME_LABEL}={app}"))
                    .collect();
                if missing.is_empty() {
                    Check::Done(())
                } else {
                    Check::Pending(format!("no ClusterRole labelled {}: Liqo's tenant controller reconciles no Tenant without it (Liqo's chart installs it)", missing.join(" or ")))
                }
            })
            .await
            .map_err(|e| wait_err(codes::LIQO_NOT_READY, e))
    }

    /// Waits until the gateway template `name` of kind `K` exists in Liqo's namespace.
    pub(crate) async fn template<K>(&self, cluster: &str, name: &str, timeout: Duration) -> Result<(), StepError>
    where
        K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    {
        let client = self.client(cluster).await?;
        let kind = K::kind(&()).into_owned();
        self.cfg
            .watches
            .wait_object::<K, ()>(cluster, &client, Some(liqo::LIQO_NAMESPACE), name, timeout, |t| match t {
                Some(_) => Check::Done(()),
                None => Check::Pending(format!("no {kind} {}/{name}: Liqo's gateway templates are not installed", liqo::LIQO_NAMESPACE)),
            })
            .await
            .map_err(|e| wait_err(codes::LIQO_NOT_READY, e))
    }
}

/// A cluster's pod and external CIDRs from its IPAM's Networks, as liqoctl reads them
/// (liqotech/liqo `pkg/utils/ipam/networks.go`): `GetPodCIDRs` errs while any pod-cidr
/// Network has no `status.cidr` (not remapped yet), so this waits for all of them;
/// `GetExternalCIDRNetwork` takes the one external-cidr Network (`GetUniqueNetworkByLabel`,
/// `pkg/utils/getters/k8sGetters.go`, errs on more than one), so more than one fails.
fn ipam_cidrs(networks: &[Arc<crate::steps::LiqoNetwork>]) -> Check<liqo::Cidrs> {
    use ferry_kube::vocab::liqo::NETWORK_TYPE_LABEL;
    let of = |kind: &str| -> Vec<(String, Option<String>)> {
        networks
            .iter()
            .filter(|n| n.metadata.labels.as_ref().and_then(|l| l.get(NETWORK_TYPE_LABEL)).map(String::as_str) == Some(kind))
            .map(|n| (n.metadata.name.clone().unwrap_or_default(), n.status_at("/cidr").and_then(Value::as_str).filter(|c| !c.is_empty()).map(str::to_owned)))
            .collect()
    };
    let (pod, external) = (of("pod-cidr"), of("external-cidr"));
    if external.len() > 1 {
        let names: Vec<&str> = external.iter().map(|(n, _)| n.as_str()).collect();
        return Check::Failed(format!("Liqo's IPAM has {} external-cidr Networks ({}); Liqo expects exactly one", external.len(), names.join(", ")));
    }
    if pod.is_empty() {
        return Check::Pending("Liqo's IPAM has no pod-cidr Network yet".into());
    }
    if let Some((name, _)) = pod.iter().find(|(_, cidr)| cidr.is_none()) {
        return Check::Pending(format!("the pod CIDR is not yet configured: missing status on Network {name}"));
    }
    match external.first() {
        Some((_, Some(e))) => Check::Done(liqo::Cidrs { pod: pod.into_iter().filter_map(|(_, c)| c).collect(), external: e.clone() }),
        Some((name, None)) => Check::Pending(format!("the external CIDR is not yet configured: missing status on Network {name}")),
        None => Check::Pending("Liqo's IPAM has no external-cidr Network yet".into()),
    }
}

/// A step of a peer task.
type PeerStep = Arc<dyn Step<PeerClusters>>;

/// The Liqo steps between `check` and `established`, in peering order, each acting only
/// for a task that owns its peering ([`UnlessReused`]).
fn liqo_steps(i: &Arc<Inner>, p: &PeerClusters) -> Vec<PeerStep> {
    let mut steps: Vec<PeerStep> = vec![
        Arc::new(Applies::new(i, Prepare, policy(p))),
        Arc::new(Network::new(i, policy(p))),
        Arc::new(Authentication::new(i, policy(p), false)),
        Arc::new(Applies::new(i, Resources { reverse: false }, policy(p))),
    ];
    if p.bidirectional {
        steps.push(Arc::new(Authentication::new(i, policy(p), true)));
        steps.push(Arc::new(Applies::new(i, Resources { reverse: true }, policy(p))));
    }
    steps.into_iter().map(|s| Arc::new(UnlessReused(s)) as PeerStep).collect()
}

/// The Submariner steps after `check`.
fn submariner_steps(i: &Arc<Inner>, p: &PeerClusters) -> Vec<PeerStep> {
    vec![
        Arc::new(ClusterSet(i.clone())),
        Arc::new(crate::steps::submariner_broker::SubmarinerBroker(i.clone(), policy(p))),
        Arc::new(Applies::new(i, Config, policy(p))),
        Arc::new(Applies::new(i, Addon, policy(p))),
    ]
}

impl TaskHandler for PeerHandler {
    type Spec = PeerClusters;

    fn kind(&self) -> TaskKind {
        TaskKind::PEER
    }

    fn validate(&self, subject: &str, spec: &PeerClusters) -> Result<(), Rejection> {
        crate::spec::validate(subject, spec)
    }

    /// Both clusters, and the ManagedClusterSet a Submariner peering joins.
    fn targets(&self, _subject: &str, spec: &PeerClusters) -> ferry_task::Targets {
        ferry_task::Targets::clusters([spec.a.clone(), spec.b.clone()]).with_sets(spec.cluster_set.clone())
    }

    fn plan(&self, p: &PeerClusters) -> Vec<PeerStep> {
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
                    plan.push(Arc::new(EstablishedCheck(i.clone(), policy(p))));
                }
            }
            PeerOperation::Unpeer => plan.extend(steps.into_iter().rev().map(|s| Arc::new(Inverse::new(s)) as PeerStep)),
            // `a` alone: none of the steps above, which ask both clusters.
            PeerOperation::ForceUnpeer => plan = vec![Arc::new(ForceCheck(i.clone(), policy(p))), Arc::new(ForceUnpeer(i.clone(), policy(p)))],
        }
        plan
    }

    /// `ferry_cluster_watches_failing{cluster}`: the clusters this worker waits on whose
    /// API servers do not answer its watches.
    fn gauges(&self) -> Vec<ferry_task::gauges::GaugeFamily> {
        self.inner.cfg.watches.gauges()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::steps::LiqoNetwork;

    fn network(name: &str, kind: &str, cidr: Option<&str>) -> Arc<LiqoNetwork> {
        let status = cidr.map_or(json!({}), |c| json!({"cidr": c}));
        Arc::new(
            serde_json::from_value(json!({"apiVersion": "ipam.liqo.io/v1alpha1", "kind": "Network",
                "metadata": {"name": name, "namespace": "liqo", "labels": {"ipam.liqo.io/network-type": kind}},
                "spec": {"cidr": "10.0.0.0/16"}, "status": status}))
            .unwrap(),
        )
    }

    #[test]
    fn the_ipam_waits_for_every_pod_cidr_and_wants_one_external_cidr() {
        let pod = network("pod", "pod-cidr", Some("10.244.0.0/16"));
        let ext = network("external", "external-cidr", Some("10.70.0.0/16"));
        assert!(matches!(ipam_cidrs(&[pod.clone(), ext.clone()]), Check::Done(c) if c.pod == ["10.244.0.0/16"] && c.external == "10.70.0.0/16"));
        // A second pod CIDR not remapped yet: pending, not the first one alone.
        let pending = network("pod-2", "pod-cidr", None);
        assert!(matches!(ipam_cidrs(&[pod.clone(), pending, ext.clone()]), Check::Pending(why) if why.contains("pod-2")));
        assert!(matches!(ipam_cidrs(&[pod.clone(), network("external", "external-cidr", None)]), Check::Pending(_)));
        assert!(matches!(ipam_cidrs(std::slice::from_ref(&ext)), Check::Pending(_)));
        // Two external CIDRs: Liqo errs (`GetUniqueNetworkByLabel`), so does Ferry.
        let other = network("external-2", "external-cidr", Some("10.71.0.0/16"));
        assert!(matches!(ipam_cidrs(&[pod, ext, other]), Check::Failed(why) if why.contains("external-2")));
    }
}

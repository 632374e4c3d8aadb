//! What the Submariner add-on needs and runs on a member, each part after its upstream
//! file: OLM (present or not, a knob) resolving the operator's Subscription, the
//! Submariner operator's gateway (its connections in the Submariner CR's status), the
//! add-on's agent (`pkg/spoke/agent.go`: its lease and the deployment and connection
//! status controllers, writing conditions on the hub's ManagedClusterAddOn) and the
//! klusterlet's add-on lease check (`Available`).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

use super::hub::{DEPLOY_WORK, install_namespace};
use super::{ADDON, Error, MANAGER, SubmarinerKnobs, addons, ar, cluster_available, cond, condition, managed_clusters, name_of, own_crd, set_addon_conditions, works};

/// The CSV the emulated catalog installs when the Subscription names none (the head of
/// the add-on's default channel `stable-0.24`).
pub const DEFAULT_CSV: &str = "submariner.v0.24.0";
/// How often the agent renews its lease (upstream's lease updater: every 60 s; sooner here).
const LEASE_RENEWAL: Duration = Duration::from_secs(10);
/// How stale a lease may be before the add-on is unavailable (`lease_controller.go`:
/// 5 lease durations of 60 s).
const LEASE_GRACE: i64 = 300;

fn subscriptions() -> kube::api::ApiResource {
    ar("operators.coreos.com", "v1alpha1", "Subscription", "subscriptions")
}

fn operator_groups() -> kube::api::ApiResource {
    ar("operators.coreos.com", "v1", "OperatorGroup", "operatorgroups")
}

fn submariners() -> kube::api::ApiResource {
    ar("submariner.io", "v1alpha1", "Submariner", "submariners")
}

/// OLM's CRDs as installing OLM leaves them (ours: ../shared/crds has none).
fn olm_crds() -> Vec<Value> {
    vec![
        own_crd("operators.coreos.com", "v1alpha1", "Subscription", "subscriptions", true),
        own_crd("operators.coreos.com", "v1", "OperatorGroup", "operatorgroups", true),
        own_crd("operators.coreos.com", "v1alpha1", "ClusterServiceVersion", "clusterserviceversions", true),
    ]
}

/// The Submariner operator's CRD, as its CSV installs it (ours: ../shared/crds has none).
fn operator_crd() -> Value {
    own_crd("submariner.io", "v1alpha1", "Submariner", "submariners", true)
}

/// One member: its client and what the emulation has done there.
pub struct Member {
    name: String,
    client: kube::Client,
    /// Whether OLM's CRDs are installed (None: not known yet).
    olm: Mutex<Option<bool>>,
    /// When the agent last renewed its lease.
    renewed: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member").field("name", &self.name).finish_non_exhaustive()
    }
}

impl Member {
    /// Starts a pass when the kinds this member's OLM and operator read change.
    pub(super) fn watch(&self, wake: &mut crate::wake::Wake) {
        for ar in [subscriptions(), operator_groups(), submariners()] {
            wake.watch(&self.client, &ar);
        }
    }

    /// Member `name` reached through `client`.
    pub fn new(name: &str, client: kube::Client) -> Self {
        Self { name: name.to_owned(), client, olm: Mutex::new(None), renewed: Mutex::new(None) }
    }

    /// The member's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// OLM as the knob says: its CRDs installed, or removed (with every Subscription).
    pub async fn olm(&self, k: &SubmarinerKnobs) -> Result<(), Error> {
        let want = !k.no_olm;
        if *self.olm.lock().expect("olm lock") == Some(want) {
            return Ok(());
        }
        if want {
            let mut crds = olm_crds();
            if k.operator_crds {
                crds.push(operator_crd());
            }
            crate::crds::install(&self.client, crds).await?;
        } else {
            let crds: Api<DynamicObject> = Api::all_with(self.client.clone(), &ar("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions"));
            for c in olm_crds() {
                super::delete(&crds, c["metadata"]["name"].as_str().unwrap_or_default()).await?;
            }
        }
        *self.olm.lock().expect("olm lock") = Some(want);
        Ok(())
    }

    fn has_olm(&self) -> bool {
        *self.olm.lock().expect("olm lock") == Some(true)
    }

    /// OLM's catalog operator for the `submariner` package: a Subscription in a namespace
    /// with an OperatorGroup is resolved (the operator's CRDs installed, `installedCSV`
    /// set); the catalog itself is not emulated.
    async fn resolve(&self) -> Result<(), Error> {
        if !self.has_olm() {
            return Ok(());
        }
        let subs: Api<DynamicObject> = Api::all_with(self.client.clone(), &subscriptions());
        for s in subs.list(&ListParams::default()).await?.items {
            let installed = s.data.pointer("/status/installedCSV").and_then(Value::as_str).is_some_and(|c| !c.is_empty());
            if installed || s.metadata.deletion_timestamp.is_some() || s.data.pointer("/spec/name").and_then(Value::as_str) != Some("submariner") {
                continue;
            }
            let ns = s.metadata.namespace.clone().unwrap_or_default();
            if Api::<DynamicObject>::namespaced_with(self.client.clone(), &ns, &operator_groups()).list(&ListParams::default()).await?.items.is_empty() {
                continue;
            }
            crate::crds::install(&self.client, vec![operator_crd()]).await?;
            let csv = s.data.pointer("/spec/startingCSV").and_then(Value::as_str).filter(|c| !c.is_empty()).unwrap_or(DEFAULT_CSV);
            let patch = json!({"status": {"installedCSV": csv, "currentCSV": csv, "state": "AtLatestKnown"}});
            Api::<DynamicObject>::namespaced_with(self.client.clone(), &ns, &subscriptions()).patch_status(&name_of(&s), &PatchParams::default(), &Patch::Merge(&patch)).await?;
        }
        Ok(())
    }

    /// The member's Submariner CRs (none while the operator's CRD is absent).
    async fn submariners(&self) -> Result<Vec<DynamicObject>, Error> {
        match Api::<DynamicObject>::all_with(self.client.clone(), &submariners()).list(&ListParams::default()).await {
            Ok(l) => Ok(l.items),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(Vec::new()),
            Err(e) => Err(e.into()),
        }
    }

    /// The operator's gateway: a connection to every other member whose Submariner CR
    /// names the same broker namespace, `connected` unless either side never connects
    /// (then `connecting`), written in the CR's `status.gateways` as the gateway engine
    /// reports it (submariner `pkg/apis/submariner.io/v1` `GatewayStatus`).
    async fn gateway(&self, all: &[(String, DynamicObject)], knob: &impl Fn(&str) -> SubmarinerKnobs) -> Result<(), Error> {
        let broker = |o: &DynamicObject| o.data.pointer("/spec/brokerK8sRemoteNamespace").and_then(Value::as_str).unwrap_or("").to_owned();
        for (_, cr) in all.iter().filter(|(m, o)| *m == self.name && o.metadata.deletion_timestamp.is_none()) {
            let backend = cr.data.pointer("/spec/cableDriver").and_then(Value::as_str).unwrap_or("libreswan");
            let connections: Vec<Value> = all
                .iter()
                .filter(|(m, o)| *m != self.name && o.metadata.deletion_timestamp.is_none() && broker(o) == broker(cr))
                .map(|(peer, _)| {
                    let up = !knob(&self.name).never_connects && !knob(peer).never_connects;
                    json!({"status": if up { "connected" } else { "connecting" }, "statusMessage": if up { "" } else { "Connecting to the remote endpoint (emulated: it never answers)" },
                        "endpoint": {"cluster_id": peer, "hostname": format!("{peer}-gateway"), "backend": backend}})
                })
                .collect();
            let gateways = json!([{"haStatus": "active", "statusFailure": "", "localEndpoint": {"cluster_id": self.name, "hostname": format!("{}-gateway", self.name), "backend": backend}, "connections": connections}]);
            if cr.data.pointer("/status/gateways") != Some(&gateways) {
                let ns = cr.metadata.namespace.clone().unwrap_or_default();
                let patch = json!({"status": {"gateways": gateways}});
                Api::<DynamicObject>::namespaced_with(self.client.clone(), &ns, &submariners()).patch_status(&name_of(cr), &PatchParams::default(), &Patch::Merge(&patch)).await?;
            }
        }
        Ok(())
    }

    /// The add-on on this member as its `submariner` ManagedClusterAddOn sees it: the
    /// agent's reports and the add-on's `Available`.
    async fn agent(&self, hub: &kube::Client, mc: Option<&DynamicObject>) -> Result<(), Error> {
        let Some(addon) = Api::<DynamicObject>::namespaced_with(hub.clone(), &self.name, &addons()).get_opt(ADDON).await? else {
            self.agent_gone();
            return Ok(());
        };
        if addon.metadata.deletion_timestamp.is_some() {
            self.agent_gone();
            return Ok(());
        }
        // Only a klusterlet reports (Available True or False): a cluster that never had one
        // gets nothing; one whose klusterlet stopped (Unknown) gets the cluster's condition
        // from the hub (`pkg/registration/hub/addon/healthcheck_controller.go`).
        let Some((status, reason, message)) = mc.and_then(cluster_available) else { return Ok(()) };
        if status == "Unknown" {
            return Ok(set_addon_conditions(hub, &self.name, &[cond("Available", "Unknown", &reason, &message)]).await?);
        }
        let ns = install_namespace(&addon);
        // The agent runs once the work agent has applied its deployment.
        let deployed = Api::<DynamicObject>::namespaced_with(hub.clone(), &self.name, &works())
            .get_opt(DEPLOY_WORK)
            .await?
            .is_some_and(|w| condition(&w, "Applied").is_some_and(|c| c["status"] == "True"));
        if deployed {
            self.renew(&ns).await?;
            self.report(hub, &ns).await?;
        } else {
            self.agent_gone();
        }
        // The klusterlet's add-on lease check (`pkg/registration/spoke/addon/lease_controller.go`).
        let lease = Api::<Lease>::namespaced(self.client.clone(), &ns).get_opt(ADDON).await?;
        let available = match lease.and_then(|l| l.spec).and_then(|s| s.renew_time) {
            None => cond("Available", "Unknown", "ManagedClusterAddOnLeaseNotFound", &format!("The status of {ADDON} add-on is unknown.")),
            Some(t) if k8s_openapi::jiff::Timestamp::now() < t.0 + k8s_openapi::jiff::SignedDuration::from_secs(LEASE_GRACE) => {
                cond("Available", "True", "ManagedClusterAddOnLeaseUpdated", &format!("{ADDON} add-on is available."))
            }
            Some(_) => cond("Available", "False", "ManagedClusterAddOnLeaseUpdateStopped", &format!("{ADDON} add-on is not available.")),
        };
        Ok(set_addon_conditions(hub, &self.name, &[available]).await?)
    }

    /// The agent's pod is gone (its add-on or its deployment's work went): the next one
    /// renews its lease as it starts, not on the old one's schedule.
    fn agent_gone(&self) {
        *self.renewed.lock().expect("lease lock") = None;
    }

    /// The agent's lease updater (`pkg/spoke/agent.go`, `lease.NewLeaseUpdater`): Lease
    /// `submariner` in its namespace.
    async fn renew(&self, ns: &str) -> Result<(), Error> {
        if self.renewed.lock().expect("lease lock").is_some_and(|t| t.elapsed() < LEASE_RENEWAL) {
            return Ok(());
        }
        let lease = Lease {
            metadata: kube::api::ObjectMeta { name: Some(ADDON.into()), namespace: Some(ns.into()), ..Default::default() },
            spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                lease_duration_seconds: Some(60),
                renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
                ..Default::default()
            }),
        };
        let mut lease = serde_json::to_value(lease).map_err(Error::Object)?;
        lease["apiVersion"] = json!("coordination.k8s.io/v1");
        lease["kind"] = json!("Lease");
        Api::<Lease>::namespaced(self.client.clone(), ns).patch(ADDON, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&lease)).await?;
        *self.renewed.lock().expect("lease lock") = Some(Instant::now());
        Ok(())
    }

    /// The agent's status controllers on the hub's ManagedClusterAddOn:
    /// `pkg/spoke/submarineragent/deployment_controller.go` (`SubmarinerAgentDegraded` from
    /// the Subscription; its informer never syncs without OLM's CRD, so nothing is written
    /// then; the operator's Deployments and DaemonSets are not emulated and count as
    /// healthy once the CSV is installed) and `connections_controller.go`
    /// (`SubmarinerConnectionDegraded` from the gateways' connections, and
    /// `RouteAgentConnectionDegraded`, no route agents being emulated).
    async fn report(&self, hub: &kube::Client, ns: &str) -> Result<(), Error> {
        let mut conds = Vec::new();
        if let Some(sub) = served(Api::<DynamicObject>::namespaced_with(self.client.clone(), ns, &subscriptions()).get_opt("submariner").await)? {
            let s = |p: &str, d: &str| sub.data.pointer(p).and_then(Value::as_str).filter(|v| !v.is_empty()).unwrap_or(d).to_owned();
            let csv = s("/status/installedCSV", "");
            conds.push(if csv.is_empty() {
                cond(
                    "SubmarinerAgentDegraded",
                    "True",
                    "CSVNotInstalled",
                    &format!(
                        "The submariner-operator CSV ({}) is not installed from channel ({}) in catalog source ({}/{})",
                        s("/spec/startingCSV", "default"),
                        s("/spec/channel", "default"),
                        s("/spec/sourceNamespace", ""),
                        s("/spec/source", "")
                    ),
                )
            } else {
                cond("SubmarinerAgentDegraded", "False", "SubmarinerAgentDeployed", &format!("Submariner ({csv}) is deployed on managed cluster."))
            });
        }
        if let Some(cr) = served(Api::<DynamicObject>::namespaced_with(self.client.clone(), ns, &submariners()).get_opt("submariner").await)? {
            conds.push(connections(&self.name, &cr));
            conds.push(cond("RouteAgentConnectionDegraded", "False", "ConnectionsEstablished", "All RouteAgent connections to remote endpoints are established and healthy."));
        }
        if !conds.is_empty() {
            set_addon_conditions(hub, &self.name, &conds).await?;
        }
        Ok(())
    }
}

/// A read of a kind the cluster may not serve (no CRD: a plain 404 page): nothing, as an
/// informer that never syncs sees nothing.
fn served(got: Result<Option<DynamicObject>, kube::Error>) -> Result<Option<DynamicObject>, Error> {
    match got {
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        other => Ok(other?),
    }
}

/// `connections_controller.go` `checkSubmarinerConnections`: the active gateways'
/// connections, established or not.
pub fn connections(cluster: &str, cr: &DynamicObject) -> Value {
    let mut connected = Vec::new();
    let mut unconnected = Vec::new();
    for g in cr.data.pointer("/status/gateways").and_then(Value::as_array).into_iter().flatten() {
        if g["haStatus"] != "active" {
            continue;
        }
        for c in g["connections"].as_array().into_iter().flatten() {
            let peer = c.pointer("/endpoint/cluster_id").and_then(Value::as_str).unwrap_or("");
            let status = c["status"].as_str().unwrap_or("");
            if status == "connected" {
                connected.push(format!("The connection between clusters {cluster:?} and {peer:?} is established"));
            } else {
                unconnected.push(format!("The connection between clusters {cluster:?} and {peer:?} is not established (status={status})"));
            }
        }
    }
    if connected.is_empty() && unconnected.is_empty() {
        return cond("SubmarinerConnectionDegraded", "True", "ConnectionsNotEstablished", "There are no connections on gateways");
    }
    if !unconnected.is_empty() {
        connected.extend(unconnected);
        return cond("SubmarinerConnectionDegraded", "True", "ConnectionsDegraded", &connected.join("\n"));
    }
    cond("SubmarinerConnectionDegraded", "False", "ConnectionsEstablished", &connected.join("\n"))
}

/// One pass over the members: OLM, the operator's gateways, the agents.
pub async fn tick(hub: &kube::Client, members: &[Member], knob: &impl Fn(&str) -> SubmarinerKnobs) -> Result<(), Error> {
    for m in members {
        if let Err(e) = m.olm(&knob(&m.name)).await {
            tracing::debug!(cluster = %m.name, error = %e, "emulated OLM: retrying");
        }
    }
    // Only members with a `submariner` add-on have anything of Submariner running.
    let with_addon: Vec<String> =
        Api::<DynamicObject>::all_with(hub.clone(), &addons()).list(&ListParams::default()).await?.items.iter().filter(|a| name_of(a) == ADDON).filter_map(|a| a.metadata.namespace.clone()).collect();
    let members: Vec<&Member> = members.iter().filter(|m| with_addon.contains(&m.name)).collect();
    if members.is_empty() {
        return Ok(());
    }
    let mcs = Api::<DynamicObject>::all_with(hub.clone(), &managed_clusters()).list(&ListParams::default()).await?.items;
    let mut crs = Vec::new();
    for m in &members {
        if let Err(e) = m.resolve().await {
            tracing::debug!(cluster = %m.name, error = %e, "emulated OLM catalog: retrying");
        }
        match m.submariners().await {
            Ok(v) => crs.extend(v.into_iter().map(|o| (m.name.clone(), o))),
            Err(e) => tracing::debug!(cluster = %m.name, error = %e, "emulated Submariner operator: retrying"),
        }
    }
    for m in &members {
        if let Err(e) = m.gateway(&crs, knob).await {
            tracing::debug!(cluster = %m.name, error = %e, "emulated Submariner gateway: retrying");
        }
        if let Err(e) = m.agent(hub, mcs.iter().find(|c| name_of(c) == m.name)).await {
            tracing::debug!(cluster = %m.name, error = %e, "emulated Submariner agent: retrying");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cr(connections: Value) -> DynamicObject {
        serde_json::from_value(json!({"apiVersion": "submariner.io/v1alpha1", "kind": "Submariner", "metadata": {"name": "submariner"},
            "status": {"gateways": [{"haStatus": "active", "connections": connections}, {"haStatus": "passive", "connections": [{"status": "error", "endpoint": {"cluster_id": "x"}}]}]}}))
        .unwrap()
    }

    #[test]
    fn connections_read_as_the_agent_reads_them() {
        let c = connections("a", &cr(json!([])));
        assert_eq!((c["status"].as_str(), c["reason"].as_str()), (Some("True"), Some("ConnectionsNotEstablished")));
        let c = connections("a", &cr(json!([{"status": "connected", "endpoint": {"cluster_id": "b"}}])));
        assert_eq!((c["status"].as_str(), c["message"].as_str()), (Some("False"), Some("The connection between clusters \"a\" and \"b\" is established")));
        let c = connections("a", &cr(json!([{"status": "connecting", "endpoint": {"cluster_id": "b"}}])));
        assert_eq!(c["reason"], "ConnectionsDegraded");
        assert!(c["message"].as_str().unwrap().contains("is not established (status=connecting)"), "{c}");
    }
}

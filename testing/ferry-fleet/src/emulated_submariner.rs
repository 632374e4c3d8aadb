//! Emulated Submariner add-on (stolostron/submariner-addon at `12da336`), played against
//! the test bed's real API servers as upstream's controllers behave, including what they
//! refuse and the conditions they write on the `submariner` ManagedClusterAddOn:
//!
//! - [`hub`]: the add-on's hub controllers: its CRD and ClusterManagementAddOn, the broker
//!   controller (a `<set>-broker` namespace per ManagedClusterSet), the agent controller
//!   (no Broker `submariner-broker` there: `SubmarinerBrokerConfigApplied=False
//!   BrokerConfigMissing` and nothing deployed; else the operator's OLM Subscription and
//!   the Submariner CR as ManifestWorks) and the add-on framework's agent deployment.
//! - [`spoke`]: what runs on a member: OLM (when installed, a knob), the Submariner
//!   operator and gateway it installs, the add-on's agent (its lease and its status
//!   conditions) and the klusterlet's add-on lease check (`Available`). Without OLM the
//!   work agent cannot apply the Subscription and nothing ever connects; without a
//!   running klusterlet the agent never reports.
//!
//! [`SubmarinerKnobs`]: a member without OLM, a gateway that never connects, a member with
//! the operator's CRDs left from an earlier install.

pub mod hub;
pub mod spoke;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::emulate::now;
use crate::wake::Wake;
use crate::{Fleet, FleetError};

/// Field manager of the emulated add-on's writes.
pub const MANAGER: &str = "ferry-emulated-submariner";
/// The add-on's name: its ClusterManagementAddOn, every ManagedClusterAddOn, the agent's
/// lease (`pkg/constants/constants.go`, `SubmarinerAddOnName`).
pub const ADDON: &str = "submariner";
/// The Broker the agent controller needs in `<set>-broker` (`submarineragent/controller.go`, `BrokerObjectName`).
pub const BROKER: &str = "submariner-broker";

/// Why a pass of the emulated add-on failed (retried on the next pass).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API server refused or could not be reached.
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// Installing a CRD of the add-on, OLM or the operator failed.
    #[error("installing a CRD: {0}")]
    Crd(#[from] crate::crds::CrdError),
    /// An object the emulator builds does not decode (a bug of the emulator).
    #[error("an emulated object does not decode: {0}")]
    Object(#[source] serde_json::Error),
    /// The system's random source failed (the broker's IPsec key).
    #[error("no random bytes for the broker's IPsec pre-shared key")]
    Random,
}

/// Knobs of one managed cluster.
#[derive(Debug, Clone, Default)]
pub struct SubmarinerKnobs {
    /// OLM is not installed on the cluster: its CRDs are absent (removed if the emulator
    /// installed them), so the work agent cannot apply the operator's Subscription.
    pub no_olm: bool,
    /// The cluster's gateway never connects: its connections stay `connecting`.
    pub never_connects: bool,
    /// Submariner's operator ran here before: its CRDs are there from the start (OLM
    /// leaves an operator's CRDs behind when it goes), so a test that takes stock of a
    /// cluster's objects before its tunnels does not see them appear.
    pub operator_crds: bool,
}

/// Emulated Submariner add-on; stops on drop.
pub struct EmulatedSubmariner {
    knobs: Arc<Mutex<HashMap<String, SubmarinerKnobs>>>,
    wake: Arc<Wake>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for EmulatedSubmariner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmulatedSubmariner").finish_non_exhaustive()
    }
}

impl Drop for EmulatedSubmariner {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl EmulatedSubmariner {
    /// Installs the add-on on `fleet`'s hub and starts its controllers and, on every
    /// member, OLM (unless its knob says not) and the add-on's agent; `knobs` per cluster.
    pub async fn start(fleet: &Fleet, knobs: HashMap<String, SubmarinerKnobs>) -> Result<Self, FleetError> {
        let failed = |cluster: &str| {
            let cluster = cluster.to_owned();
            move |e: Error| FleetError::Client { cluster, source: Box::new(e) }
        };
        let hub = fleet.hub().client().await?;
        hub::install(&hub).await.map_err(failed("hub"))?;
        let mut members = Vec::new();
        for c in fleet.clusters.iter().skip(1) {
            let m = spoke::Member::new(&c.name, c.client().await?);
            // OLM is there (or not) before anyone looks.
            m.olm(&knobs.get(&c.name).cloned().unwrap_or_default()).await.map_err(failed(&c.name))?;
            members.push(m);
        }
        let hub_server = fleet.hub().server.clone();
        let knobs = Arc::new(Mutex::new(knobs));
        // Upstream's controllers are informer-driven (`pkg/hub/submarineragent/controller.go`,
        // `submarinerbroker/controller.go`, `pkg/spoke/agent.go`): a pass on every change of a
        // kind they read that others write, and every RESYNC: the hub's resource cache and the
        // agent's lease renewal run on it, and the cleanup's work-deletion timeout and the
        // add-on's lease grace are minutes long.
        let mut wake = Wake::with_fallback(hub::RESYNC);
        for ar in [addons(), managed_clusters(), hub::sets(), hub::brokers(), hub::configs(), hub::cluster_management_addons()] {
            wake.watch(&hub, &ar);
        }
        let controllers = Arc::new(hub::Hub::default());
        let c = controllers.clone();
        wake.watch_deletes(&hub, &works(), move |gone| c.forget_work(gone));
        members.iter().for_each(|m| m.watch(&mut wake));
        let wake = Arc::new(wake);
        let (k, w) = (knobs.clone(), wake.clone());
        let task = tokio::spawn(async move {
            loop {
                w.next().await;
                let knob = |c: &str| k.lock().expect("knobs lock").get(c).cloned().unwrap_or_default();
                if let Err(e) = controllers.tick(&hub, &hub_server).await {
                    w.after(crate::wake::RETRY);
                    tracing::debug!(error = %e, "emulated Submariner (hub): retrying");
                }
                if let Err(e) = spoke::tick(&hub, &members, &knob).await {
                    w.after(crate::wake::RETRY);
                    tracing::debug!(error = %e, "emulated Submariner (members): retrying");
                }
            }
        });
        Ok(Self { knobs, wake, task })
    }

    /// Changes the knobs of `cluster`.
    pub fn set(&self, cluster: &str, f: impl FnOnce(&mut SubmarinerKnobs)) {
        f(self.knobs.lock().expect("knobs lock").entry(cluster.to_owned()).or_default());
        self.wake.poke();
    }
}

// ---------------------------------------------------------------------------------------
// shared by the hub's and the members' parts

pub(crate) fn ar(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

pub(crate) fn addons() -> ApiResource {
    ar("addon.open-cluster-management.io", "v1alpha1", "ManagedClusterAddOn", "managedclusteraddons")
}

pub(crate) fn works() -> ApiResource {
    ar("work.open-cluster-management.io", "v1", "ManifestWork", "manifestworks")
}

pub(crate) fn managed_clusters() -> ApiResource {
    ar("cluster.open-cluster-management.io", "v1", "ManagedCluster", "managedclusters")
}

pub(crate) fn name_of(o: &DynamicObject) -> String {
    o.metadata.name.clone().unwrap_or_default()
}

/// The status of condition `type_` of `o`.
pub(crate) fn condition<'a>(o: &'a DynamicObject, type_: &str) -> Option<&'a Value> {
    o.data.pointer("/status/conditions").and_then(Value::as_array).and_then(|cs| cs.iter().find(|c| c["type"] == type_))
}

/// A ManagedCluster's `ManagedClusterConditionAvailable` (status, reason, message).
pub(crate) fn cluster_available(mc: &DynamicObject) -> Option<(String, String, String)> {
    let c = condition(mc, "ManagedClusterConditionAvailable")?;
    let s = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    Some((s("status"), s("reason"), s("message")))
}

/// A condition as `meta.SetStatusCondition` writes it (message may be empty, as the
/// agent controller leaves it for `SubmarinerBrokerConfigApplied`).
pub(crate) fn cond(type_: &str, status: &str, reason: &str, message: &str) -> Value {
    json!({"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": now()})
}

/// Sets conditions `new` on the `submariner` ManagedClusterAddOn of `cluster` as the
/// add-on's `pkg/addon/update_status.go` does (`meta.SetStatusCondition`: the transition
/// time kept while the status is unchanged; written only when something changed).
pub(crate) async fn set_addon_conditions(hub: &kube::Client, cluster: &str, new: &[Value]) -> Result<(), kube::Error> {
    let api: Api<DynamicObject> = Api::namespaced_with(hub.clone(), cluster, &addons());
    let Some(a) = api.get_opt(ADDON).await? else { return Ok(()) };
    let mut conds: Vec<Value> = a.data.pointer("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
    let mut changed = false;
    for c in new {
        match conds.iter_mut().find(|o| o["type"] == c["type"]) {
            Some(o) if o["status"] == c["status"] && o["reason"] == c["reason"] && o["message"] == c["message"] => {}
            Some(o) => {
                let mut c = c.clone();
                if o["status"] == c["status"] {
                    c["lastTransitionTime"] = o["lastTransitionTime"].clone();
                }
                *o = c;
                changed = true;
            }
            None => {
                conds.push(c.clone());
                changed = true;
            }
        }
    }
    if changed {
        let patch = json!({"metadata": {"resourceVersion": a.metadata.resource_version}, "status": {"conditions": conds}});
        api.patch_status(ADDON, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    }
    Ok(())
}

/// A CRD of the emulator's own making for a kind ../shared/crds lacks (the add-on's
/// Broker, OLM's kinds, the Submariner operator's), as installing the add-on, OLM or the
/// operator would: names, scope, one served storage version, a status subresource, an
/// open schema ([`crate::kinds::crd`]).
pub(crate) fn own_crd(group: &'static str, version: &'static str, kind: &'static str, plural: &'static str, namespaced: bool) -> Value {
    crate::kinds::crd(&(group, version, kind, plural, namespaced, true))
}

/// Server-side applies `obj` (namespaced when it names a namespace) with `ar`.
pub(crate) async fn ssa(client: &kube::Client, ar: &ApiResource, obj: &Value) -> Result<DynamicObject, kube::Error> {
    let name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    let api: Api<DynamicObject> = match obj.pointer("/metadata/namespace").and_then(Value::as_str) {
        Some(ns) => Api::namespaced_with(client.clone(), ns, ar),
        None => Api::all_with(client.clone(), ar),
    };
    api.patch(name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(obj)).await
}

/// Deletes `name` (404 is success).
pub(crate) async fn delete(api: &Api<DynamicObject>, name: &str) -> Result<(), kube::Error> {
    crate::emulate::absent(api.delete(name, &Default::default()).await)
}

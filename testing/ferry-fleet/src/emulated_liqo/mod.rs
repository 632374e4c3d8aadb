//! Emulated Liqo v1 on the fleet's managed clusters, rebuilt on how upstream's controllers
//! behave (liqotech/liqo at `557c199`; each module names the files it follows), so the
//! peer worker is held to what a real `liqoctl peer` must do:
//!
//! - install (the chart, `deployments/liqo/templates/`): namespace `liqo`, the cluster-id
//!   ConfigMap, the controller manager's Deployment, the cluster's authentication keys
//!   (`authentication-keys`, Ed25519, `authentication/keys.go` `InitClusterKeys`), the IPAM
//!   Networks ([`ipam`]) and the default gateway templates `wireguard-server` /
//!   `wireguard-client` (their CRDs are install-time objects `../shared/crds` lacks: ours,
//!   open-schema);
//! - [`network`]: Configurations remapped by the IPAM, gateways deployed only from a
//!   template, Connections Connected only after the PublicKey exchange;
//! - [`authentication`]: nonces, signatures, the Tenant's handshake verified (or refused
//!   with a Warning event), certificates issued by the provider's certificates API,
//!   Identities turned into kubeconfigs;
//! - [`resources`]: ResourceSlices completed, replicated, authorized and accepted, then
//!   VirtualNodes and Nodes named after the slice; the CRD replicator also carries the
//!   NamespaceMaps of [`crate::emulated_offloading`] (spec out, status back);
//! - ForeignCluster statuses report each module from what exists;
//! - a tenant namespace is found by its labels, as upstream's tenant namespace manager
//!   finds it (`tenant_namespace_of`; `pkg/tenantNamespace/namespaceManager.go`), never by
//!   its default name, which only a namespace the Tenant controller creates gets.
//!
//! [`LiqoKnobs`]: a cluster whose Liqo is never installed, whose gateways never connect or
//! connect late, or whose nonce signatures are forged. A pass runs whenever an object of a
//! kind the controllers read changes on any member, or a knob does ([`crate::wake`]), and
//! at least every 10 s; a failed write is logged at debug and retried.

pub mod authentication;
pub mod ipam;
pub mod keys;
pub mod network;
pub mod resources;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Secret};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

pub use crate::emulate::now;
use crate::wake::Wake;
use crate::{Fleet, FleetError};
pub use ferry_kube::vocab::liqo::{CLUSTER_ID_CONFIGMAP, CONTROLLER_MANAGER, LIQO_NAMESPACE, REMOTE_ID_LABEL, tenant_namespace};
use ferry_kube::vocab::liqo::{AUTH_KEYS_SECRET, CLIENT_TEMPLATE, CLIENT_TEMPLATE_KIND, SERVER_TEMPLATE, SERVER_TEMPLATE_KIND, TENANT_NAMESPACE_LABEL};
pub use resources::NOT_ALLOWED_TAINT;

/// Selector of the virtual nodes (label `liqo.io/type`).
pub const VIRTUAL_NODE_SELECTOR: &str = "liqo.io/type=virtual-node";
const MANAGER: &str = "ferry-emulated-liqo";
/// The kinds whose changes start a pass: every kind a pass decides on. Events are only
/// written here; nodes and pods (a slice's spare capacity) are read once per slice, when
/// it arrives.
const WATCHED: [(&str, &str, &str, &str); 15] = [
    ("networking.liqo.io", "v1beta1", "Configuration", "configurations"),
    ("networking.liqo.io", "v1beta1", "GatewayServer", "gatewayservers"),
    ("networking.liqo.io", "v1beta1", "GatewayClient", "gatewayclients"),
    ("networking.liqo.io", "v1beta1", "PublicKey", "publickeies"),
    ("networking.liqo.io", "v1beta1", "Connection", "connections"),
    ("authentication.liqo.io", "v1beta1", "Tenant", "tenants"),
    ("authentication.liqo.io", "v1beta1", "Identity", "identities"),
    ("authentication.liqo.io", "v1beta1", "ResourceSlice", "resourceslices"),
    ("offloading.liqo.io", "v1beta1", "VirtualNode", "virtualnodes"),
    // Replicated (spec out, status back) by the CRD replicator.
    ("offloading.liqo.io", "v1beta1", "NamespaceMap", "namespacemaps"),
    ("ipam.liqo.io", "v1alpha1", "Network", "networks"),
    ("", "v1", "Secret", "secrets"),
    // The ForeignClusters the passes keep, the CSRs the cluster's signer answers, and the
    // tenant namespaces.
    ("core.liqo.io", "v1beta1", "ForeignCluster", "foreignclusters"),
    ("certificates.k8s.io", "v1", "CertificateSigningRequest", "certificatesigningrequests"),
    ("", "v1", "Namespace", "namespaces"),
];

/// The longest the loop sleeps with nothing changed: it watches every kind it decides on
/// and asks for the one time it waits for (a gateway delay). Passes every second made an
/// idle member answer about 32 requests/s (docs/BENCHMARKS.md, "Session 38").
const FALLBACK: Duration = Duration::from_secs(10);

/// Knobs of one cluster.
#[derive(Debug, Clone, Default)]
pub struct LiqoKnobs {
    /// Liqo is never installed (no Deployment, keys, networks or templates).
    pub not_installed: bool,
    /// Gateways involving this cluster never connect.
    pub gateway_never_connects: bool,
    /// Gateways involving this cluster connect only once the GatewayClient is this old
    /// (seconds granularity: creation timestamps are whole seconds).
    pub gateway_delay: Duration,
    /// The cluster's nonce signer signs with a key that is not the one in its
    /// `authentication-keys` (a forged or stale proof): providers refuse its Tenants.
    pub forged_signatures: bool,
}

pub(crate) fn ar(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

/// A metav1.Condition, keeping its transition time while the status stays.
pub(crate) fn cond_v1(old: Option<&Value>, type_: &str, status: &str, reason: &str, message: &str, generation: i64) -> Value {
    let at = old.filter(|o| o["status"] == status).and_then(|o| o.get("lastTransitionTime").cloned()).unwrap_or_else(|| json!(now()));
    json!({"type": type_, "status": status, "reason": reason, "message": message, "observedGeneration": generation, "lastTransitionTime": at})
}

/// Emulated Liqo; stops on drop.
pub struct EmulatedLiqo {
    knobs: Arc<Mutex<HashMap<String, LiqoKnobs>>>,
    wake: Arc<Wake>,
    task: JoinHandle<()>,
    /// The members' ForeignCluster state controllers.
    judges: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for EmulatedLiqo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmulatedLiqo").finish_non_exhaustive()
    }
}

impl Drop for EmulatedLiqo {
    fn drop(&mut self) {
        self.task.abort();
        self.judges.iter().for_each(JoinHandle::abort);
    }
}

/// One member as the controllers see it.
pub(crate) struct Member {
    pub(crate) name: String,
    pub(crate) client: kube::Client,
    /// Its client for evictions, whose refusals (429) it gets at once
    /// ([`Cluster::evicting_client`](crate::Cluster::evicting_client)).
    pub(crate) evictor: kube::Client,
    /// Its API server's address and CA (what `status.authParams` hands to a consumer).
    pub(crate) server: String,
    pub(crate) ca_pem: Vec<u8>,
    installed: bool,
    /// Clients made from kubeconfig Secrets, by the Secret's namespace/name, with the
    /// content they were made from (a new certificate makes a new client).
    kubeconfig_clients: Mutex<HashMap<String, (Vec<u8>, kube::Client)>>,
    /// The tenant ClusterRoles' names by `TENANT_ROLE_APPS`, once found (the tenant
    /// controller's `ensureSetup` looks them up until then, and never again).
    tenant_roles: Mutex<[Vec<String>; 2]>,
    /// When the API server checker last pinged each remote cluster ([`api_server_check`]).
    api_checks: Mutex<HashMap<String, std::time::Instant>>,
    /// The remote clusters the CRD replicator's state controller judged dead
    /// ([`resources::judge`], fed by a watch of the member's ForeignClusters).
    pub(crate) unreachable: Arc<Mutex<std::collections::HashSet<String>>>,
}

impl Member {
    /// A client from kubeconfig Secret `s` (field `kubeconfig`), None when it holds none
    /// that works. Made once per content.
    pub(crate) async fn client_from(&self, s: &Secret) -> Option<kube::Client> {
        let key = format!("{}/{}", s.metadata.namespace.as_deref()?, s.metadata.name.as_deref()?);
        let text = s.data.as_ref()?.get("kubeconfig")?.0.clone();
        if let Some((t, c)) = self.kubeconfig_clients.lock().expect("kubeconfig clients lock").get(&key)
            && *t == text
        {
            return Some(c.clone());
        }
        let client = crate::emulated_registration::client_from(std::str::from_utf8(&text).ok()?).await.ok()?;
        let mut cache = self.kubeconfig_clients.lock().expect("kubeconfig clients lock");
        cache.insert(key, (text, client.clone()));
        Some(client)
    }
}

impl EmulatedLiqo {
    /// Starts on `fleet` (members: every cluster but the hub); `knobs` apply from the start
    /// (a cluster `not_installed` never gets Liqo's components).
    pub async fn start(fleet: &Fleet, knobs: HashMap<String, LiqoKnobs>) -> Result<Self, FleetError> {
        let mut members = Vec::new();
        for c in fleet.clusters.iter().skip(1) {
            let client = c.client().await?;
            // The CRDs come with the cluster (Liqo's CRD chart), before anything else.
            crate::crds::install(&client, template_crds()).await.map_err(|e| FleetError::Client { cluster: c.name.clone(), source: Box::new(e) })?;
            members.push(Member { name: c.name.clone(), client, evictor: c.evicting_client().await?, server: c.server.clone(), ca_pem: c.ca_pem()?, installed: false, kubeconfig_clients: Mutex::default(), tenant_roles: Mutex::default(), api_checks: Mutex::default(), unreachable: Arc::default() });
        }
        // Liqo's components are there when the bed is handed over, as on a cluster Liqo was
        // installed on: a check run at once must not see a half-installed member (a loaded
        // API server may refuse the first writes; retried within a bound).
        for m in members.iter_mut().filter(|m| !knobs.get(&m.name).is_some_and(|k| k.not_installed)) {
            let retry = ExponentialBuilder::default().with_min_delay(Duration::from_millis(100)).with_max_delay(Duration::from_secs(2)).with_max_times(60);
            let member: &Member = m;
            (|| install(member)).retry(retry).await.map_err(|e| FleetError::Client { cluster: member.name.clone(), source: Box::new(e) })?;
            m.installed = true;
        }
        // Each member's ForeignCluster state controller reacts to every change at once, as
        // upstream's does: a force unpeer annotates, then deletes the tenant namespace, and
        // the verdict must be in before the ForeignCluster's role turns Unknown.
        let judges = members
            .iter()
            .map(|m| {
                let (api, unreachable) = (Api::<DynamicObject>::all_with(m.client.clone(), &resources::foreign_cluster_resource()), m.unreachable.clone());
                tokio::spawn(async move {
                    use futures::StreamExt;
                    use kube::runtime::WatchStreamExt;
                    let mut changes = kube::runtime::watcher(api, kube::runtime::watcher::Config::default()).default_backoff().applied_objects().boxed();
                    while let Some(change) = changes.next().await {
                        if let Ok(fc) = change {
                            resources::judge(&unreachable, &fc);
                        }
                    }
                })
            })
            .collect();
        let knobs = Arc::new(Mutex::new(knobs));
        let mut wake = Wake::with_fallback(FALLBACK);
        for m in &members {
            for (group, version, kind, plural) in WATCHED {
                wake.watch(&m.client, &ar(group, version, kind, plural));
            }
        }
        let wake = Arc::new(wake);
        let (k, w) = (knobs.clone(), wake.clone());
        let task = tokio::spawn(async move {
            loop {
                w.next().await;
                // Knobs are read live, when each object is decided.
                if let Err(e) = tick(&mut members, &k, &w).await {
                    w.after(crate::wake::RETRY);
                    tracing::debug!(error = %e, "emulated Liqo: retrying");
                }
            }
        });
        Ok(Self { knobs, wake, task, judges })
    }

    /// Changes the knobs of `cluster`.
    pub fn set(&self, cluster: &str, f: impl FnOnce(&mut LiqoKnobs)) {
        f(self.knobs.lock().expect("knobs lock").entry(cluster.to_owned()).or_default());
        self.wake.poke();
    }
}

pub(crate) async fn apply(api: &Api<DynamicObject>, obj: &Value) -> Result<(), kube::Error> {
    let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    api.patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(obj)).await.map(drop)
}

pub(crate) async fn set_status(api: &Api<DynamicObject>, name: &str, status: Value) -> Result<(), kube::Error> {
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&json!({"status": status}))).await.map(drop)
}

pub(crate) fn name_of(o: &DynamicObject) -> String {
    o.metadata.name.clone().unwrap_or_default()
}

pub(crate) fn ns_of(o: &DynamicObject) -> String {
    o.metadata.namespace.clone().unwrap_or_default()
}

/// The label selector of a cluster's tenant namespace for `remote_id`
/// (`pkg/tenantNamespace/namespaceManager.go`, `GetNamespace`): `liqo.io/remote-cluster-id`
/// equal to the id and `liqo.io/tenant-namespace` present, whatever its value. Not the name:
/// a tenant namespace made by an older Liqo or by an admin may have any.
pub(crate) fn tenant_namespace_selector(remote_id: &str) -> String {
    format!("{REMOTE_ID_LABEL}={remote_id},{TENANT_NAMESPACE_LABEL}")
}

/// `GetNamespace`'s verdict on the namespaces its selector matched: none is NotFound
/// (`None`), one is the tenant namespace, more is an error (upstream's message).
pub(crate) fn single_tenant_namespace(remote_id: &str, mut names: Vec<String>) -> Result<Option<String>, String> {
    match names.len() {
        0 | 1 => Ok(names.pop()),
        _ => Err(format!("multiple tenant namespaces found for clusterid {remote_id}")),
    }
}

/// The tenant namespace this cluster keeps for `remote_id`, found as upstream's tenant
/// namespace manager finds it (`pkg/tenantNamespace/namespaceManager.go`, `GetNamespace`:
/// a list by [`tenant_namespace_selector`]; its fallback for a client forbidden to list
/// namespaces never applies here). The outer error is the API server's; the inner one
/// `GetNamespace`'s own (several namespaces match); `None`: there is none.
pub(crate) async fn tenant_namespace_of(client: &kube::Client, remote_id: &str) -> Result<Result<Option<String>, String>, kube::Error> {
    let lp = ListParams::default().labels(&tenant_namespace_selector(remote_id));
    let names = Api::<Namespace>::all(client.clone()).list_metadata(&lp).await?.items.into_iter().filter_map(|n| n.metadata.name).collect();
    Ok(single_tenant_namespace(remote_id, names))
}

/// Records an event on `obj` as a controller's event recorder does; one per object and
/// reason (what a later reader needs: the latest reason it was refused).
pub(crate) async fn event(client: &kube::Client, obj: &DynamicObject, type_: &str, reason: &str, message: &str) -> Result<(), kube::Error> {
    let ns = obj.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    let name = format!("{}.{}", name_of(obj), reason.to_lowercase());
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    if let Some(e) = events.get_opt(&name).await? {
        if e.message.as_deref() == Some(message) {
            return Ok(());
        }
        events.delete(&name, &Default::default()).await?;
    }
    let kind = obj.types.as_ref().map(|t| t.kind.clone()).unwrap_or_default();
    let api_version = obj.types.as_ref().map(|t| t.api_version.clone()).unwrap_or_default();
    let ev: Event = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": ns},
        "involvedObject": {"kind": kind, "apiVersion": api_version, "name": name_of(obj), "namespace": obj.metadata.namespace, "uid": obj.metadata.uid},
        "type": type_, "reason": reason, "message": message, "source": {"component": "liqo-controller-manager"},
        "firstTimestamp": now(), "lastTimestamp": now(), "count": 1}))
    .expect("an event");
    crate::emulate::present(events.create(&PostParams::default(), &ev).await)
}

/// The gateway template kinds: install-time CRDs of Liqo's chart that `../shared/crds`
/// does not carry (`deployments/liqo/charts/liqo-crds/crds/networking.liqo.io_wggateway{server,client}templates.yaml`).
fn template_crds() -> Vec<Value> {
    [(SERVER_TEMPLATE_KIND, "wggatewayservertemplates"), (CLIENT_TEMPLATE_KIND, "wggatewayclienttemplates")]
        .iter()
        .map(|(kind, plural)| crate::kinds::crd(&("networking.liqo.io", "v1beta1", kind, plural, true, false)))
        .collect()
}

/// Installs Liqo's components on a member, as the chart does.
async fn install(m: &Member) -> Result<(), kube::Error> {
    let pp = PatchParams::apply(MANAGER);
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LIQO_NAMESPACE}});
    Api::<Namespace>::all(m.client.clone()).patch(LIQO_NAMESPACE, &pp, &Patch::Apply(&ns)).await?;
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": CLUSTER_ID_CONFIGMAP, "namespace": LIQO_NAMESPACE},
        "data": {"CLUSTER_ID": m.name}});
    Api::<ConfigMap>::namespaced(m.client.clone(), LIQO_NAMESPACE).patch(CLUSTER_ID_CONFIGMAP, &pp, &Patch::Apply(&cm)).await?;
    // `InitClusterKeys`: made once, never replaced.
    let secrets: Api<Secret> = Api::namespaced(m.client.clone(), LIQO_NAMESPACE);
    if secrets.get_opt(AUTH_KEYS_SECRET).await?.is_none() {
        let (private, public) = keys::generate().map_err(|e| kube::Error::Service(e.to_string().into()))?;
        let b = |s: &str| base64::Engine::encode(&base64::engine::general_purpose::STANDARD, s);
        let s = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": AUTH_KEYS_SECRET, "namespace": LIQO_NAMESPACE},
            "data": {"privateKey": b(&private), "publicKey": b(&public)}});
        secrets.patch(AUTH_KEYS_SECRET, &pp, &Patch::Apply(&s)).await?;
    }
    // The tenant ClusterRoles the tenant controller binds (`authentication::tenant_cluster_roles`)
    // and the one the NamespaceMap controller binds in remote namespaces.
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(m.client.clone());
    for r in authentication::tenant_cluster_roles().into_iter().chain([authentication::virtual_kubelet_remote_role()]) {
        roles.patch(r.metadata.name.as_deref().unwrap_or_default(), &pp, &Patch::Apply(&r)).await?;
    }
    ipam::install(&m.client).await?;
    for (kind, plural, name, child) in [
        (SERVER_TEMPLATE_KIND, "wggatewayservertemplates", SERVER_TEMPLATE, "WgGatewayServer"),
        (CLIENT_TEMPLATE_KIND, "wggatewayclienttemplates", CLIENT_TEMPLATE, "WgGatewayClient"),
    ] {
        let api: Api<DynamicObject> = Api::namespaced_with(m.client.clone(), LIQO_NAMESPACE, &ar("networking.liqo.io", "v1beta1", kind, plural));
        let t = json!({"apiVersion": "networking.liqo.io/v1beta1", "kind": kind, "metadata": {"name": name, "namespace": LIQO_NAMESPACE},
            "spec": {"objectKind": {"apiVersion": "networking.liqo.io/v1beta1", "kind": child},
                     "template": {"metadata": {"name": "{{ .Name }}", "namespace": "{{ .Namespace }}"}, "spec": {}}}});
        apply(&api, &t).await?;
    }
    let d = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": CONTROLLER_MANAGER, "namespace": LIQO_NAMESPACE},
        "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": "controller-manager"}},
                 "template": {"metadata": {"labels": {"app.kubernetes.io/name": "controller-manager"}},
                              "spec": {"tolerations": [{"operator": "Exists"}],
                                       "containers": [{"name": "controller-manager", "image": "ghcr.io/liqotech/liqo-controller-manager:v1.2.0"}]}}}});
    Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(m.client.clone(), LIQO_NAMESPACE).patch(CONTROLLER_MANAGER, &pp, &Patch::Apply(&d)).await?;
    Ok(())
}

async fn tick(members: &mut [Member], knobs: &Mutex<HashMap<String, LiqoKnobs>>, wake: &Wake) -> Result<(), kube::Error> {
    let knob = |c: &str| knobs.lock().expect("knobs lock").get(c).cloned().unwrap_or_default();
    for m in members.iter_mut() {
        if !m.installed && !knob(&m.name).not_installed {
            install(m).await?;
            m.installed = true;
        }
    }
    let clients: BTreeMap<String, kube::Client> = members.iter().filter(|m| m.installed).map(|m| (m.name.clone(), m.client.clone())).collect();
    for m in members.iter().filter(|m| m.installed) {
        // Upstream's controllers are independent: one that fails (a remote cluster that
        // does not answer the gateway's or the replicator's requests) stalls neither the
        // others on this member nor any other member.
        let passes = [
            ("configurations", network::configurations(m).await),
            ("gateways", network::gateways(m).await),
            ("connections", network::connections(m, &clients, &knob, wake).await),
            ("nonces", authentication::nonces(m, knob(&m.name).forged_signatures).await),
            ("tenants", authentication::tenants(m).await),
            ("identities", authentication::identities(m).await),
            ("local slices", resources::local_slices(m).await),
            ("replicator", resources::replicate(m).await),
            ("remote slices", resources::remote_slices(m).await),
            ("virtual nodes", resources::virtual_nodes(m).await),
            ("foreign clusters", foreign_clusters(m, wake).await),
        ];
        for (pass, e) in passes.into_iter().filter_map(|(pass, r)| r.err().map(|e| (pass, e))) {
            wake.after(crate::wake::RETRY);
            tracing::debug!(cluster = %m.name, pass, error = %e, "emulated Liqo: retrying");
        }
    }
    Ok(())
}

fn condition(type_: &str, status: &str) -> Value {
    json!({"type": type_, "status": status, "reason": type_, "message": "", "lastTransitionTime": now()})
}

/// What the ForeignCluster controller found for one remote cluster.
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    /// Its Connection is `Connected`.
    connected: bool,
    /// Its Tenant (here it is our consumer), if any: ready or not.
    tenant: Option<bool>,
    /// Its control-plane Identity (here it is our provider), if any: its kubeconfig made or not.
    identity: Option<bool>,
    /// A VirtualNode for it exists.
    virtual_node: bool,
}

/// `status.tenantNamespace` as upstream's ForeignCluster controller writes it
/// (`core/foreigncluster-controller/status.go`, `handleAuthenticationModuleStatus`; the
/// field is cleared first, `clearStatusExceptConditions`): `local` is the Tenant's
/// `status.tenantNamespace` (when set), then the control-plane Identity's own namespace;
/// `remote` the Identity's `spec.namespace` (when set). Neither: empty. Never derived from
/// the remote's id: the namespaces may have any name.
fn tenant_namespaces(tenant: Option<&DynamicObject>, identity: Option<&DynamicObject>) -> Value {
    let mut tn = serde_json::Map::new();
    let set = |v: Option<&str>| v.filter(|n| !n.is_empty()).map(|n| json!(n));
    if let Some(local) = set(tenant.and_then(|t| t.data.pointer("/status/tenantNamespace")?.as_str())) {
        tn.insert("local".into(), local);
    }
    if let Some(i) = identity {
        tn.insert("local".into(), json!(ns_of(i)));
        if let Some(remote) = set(i.data.pointer("/spec/namespace").and_then(Value::as_str)) {
            tn.insert("remote".into(), remote);
        }
    }
    Value::Object(tn)
}

/// A ForeignCluster's status as upstream's controller writes it
/// (`pkg/liqo-controller-manager/core/foreigncluster-controller/status.go`): networking's
/// `NetworkConnectionStatus` is `Established` when the Connection is Connected
/// (`handleConnectionStatus`), but authentication's conditions are `Ready`/`NotReady`
/// (`handleAuthenticationModuleStatus`: `AuthTenantStatus` only while a Tenant exists,
/// `AuthIdentityControlPlaneStatus` only while an Identity exists; either makes the remote
/// a consumer, resp. a provider), offloading's `Ready`/`NotReady`. Never `Established` for
/// an authentication condition: a worker waiting for that would wait forever on a real
/// cluster. `tenant_namespace`: [`tenant_namespaces`].
fn foreign_cluster_status(tenant_namespace: Value, s: &Seen) -> Value {
    let st = |ok: bool, yes: &str| if ok { yes.to_owned() } else { "NotReady".to_owned() };
    let role = match (s.identity.is_some(), s.tenant.is_some()) {
        (true, true) => "ConsumerAndProvider",
        (true, false) => "Provider",
        (false, true) => "Consumer",
        _ => "Unknown",
    };
    let mut auth = Vec::new();
    if let Some(ready) = s.tenant {
        auth.push(condition("AuthTenantStatus", &st(ready, "Ready")));
    }
    if let Some(ready) = s.identity {
        auth.push(condition("AuthIdentityControlPlaneStatus", &st(ready, "Ready")));
    }
    json!({
        "role": role,
        "tenantNamespace": tenant_namespace,
        "modules": {
            "networking": {"enabled": s.connected, "conditions": [condition("NetworkConnectionStatus", &st(s.connected, "Established"))]},
            "authentication": {"enabled": !auth.is_empty(), "conditions": auth},
            "offloading": {"enabled": s.virtual_node, "conditions": [condition("OffloadingVirtualNodeStatus", &st(s.virtual_node, "Ready"))]},
        },
    })
}

/// The one object of a `getters.Get*ByClusterID` lookup (`pkg/utils/getters/k8sGetters.go`):
/// none is NotFound, more than one an error (the ForeignCluster is then not updated).
pub(super) fn at_most_one(mut items: Vec<DynamicObject>, kind: &str, remote: &str) -> Result<Option<DynamicObject>, String> {
    match items.len() {
        0 | 1 => Ok(items.pop()),
        _ => Err(format!("multiple {kind}s found for ForeignCluster {remote}")),
    }
}

/// The ForeignCluster controller: one ForeignCluster per remote cluster id a peering
/// object is labelled with (`core/foreigncluster-controller/foreigncluster_controller.go`,
/// `foreignclusterEnqueuer`: it watches these kinds and creates the missing one; it never
/// deletes one), and its status: each module established or not, from what exists.
async fn foreign_clusters(m: &Member, wake: &Wake) -> Result<(), kube::Error> {
    let fcs: Api<DynamicObject> = Api::all_with(m.client.clone(), &resources::foreign_cluster_resource());
    let mut remotes = std::collections::BTreeSet::new();
    for (group, kind, plural) in [
        ("networking.liqo.io", "Configuration", "configurations"),
        ("networking.liqo.io", "GatewayServer", "gatewayservers"),
        ("networking.liqo.io", "GatewayClient", "gatewayclients"),
        ("authentication.liqo.io", "Tenant", "tenants"),
        ("authentication.liqo.io", "Identity", "identities"),
        ("authentication.liqo.io", "ResourceSlice", "resourceslices"),
        ("offloading.liqo.io", "VirtualNode", "virtualnodes"),
    ] {
        let api: Api<DynamicObject> = Api::all_with(m.client.clone(), &ar(group, "v1beta1", kind, plural));
        for o in api.list(&ListParams::default().labels(REMOTE_ID_LABEL)).await?.items {
            if let Some(id) = o.metadata.labels.as_ref().and_then(|l| l.get(REMOTE_ID_LABEL)) {
                remotes.insert(id.clone());
            }
        }
    }
    for id in remotes {
        if fcs.get_opt(&id).await?.is_none() {
            let fc = json!({"apiVersion": "core.liqo.io/v1beta1", "kind": "ForeignCluster", "metadata": {"name": id, "labels": {REMOTE_ID_LABEL: id}},
                "spec": {"clusterID": id}});
            crate::emulate::present(fcs.create(&PostParams::default(), &serde_json::from_value(fc).expect("a ForeignCluster")).await)?;
        }
    }
    for fc in fcs.list(&ListParams::default()).await?.items {
        let Some(remote) = fc.data.pointer("/spec/clusterID").and_then(Value::as_str).map(str::to_owned) else { continue };
        // Every object is found by its `liqo.io/remote-cluster-id` label in any namespace,
        // never in a namespace named after the remote (`getters.GetConnectionByClusterID`,
        // `GetTenantByClusterID(..., corev1.NamespaceAll)`, `GetControlPlaneIdentityByClusterID`,
        // `ListVirtualNodesByClusterID`).
        let lp = ListParams::default().labels(&format!("{REMOTE_ID_LABEL}={remote}"));
        let list = |kind: &str, plural: &str, group: &str| {
            let api: Api<DynamicObject> = Api::all_with(m.client.clone(), &ar(group, "v1beta1", kind, plural));
            let lp = lp.clone();
            async move { api.list(&lp).await.map(|l| l.items) }
        };
        let connections = list("Connection", "connections", "networking.liqo.io").await?;
        let tenants = list("Tenant", "tenants", "authentication.liqo.io").await?;
        let identities = list("Identity", "identities", "authentication.liqo.io").await?;
        let identities = identities.into_iter().filter(|i| i.data.pointer("/spec/type").and_then(Value::as_str) == Some("ControlPlane")).collect();
        let (connection, tenant, identity) =
            match (at_most_one(connections, "Connection", &remote), at_most_one(tenants, "Tenant", &remote), at_most_one(identities, "Identity", &remote)) {
                (Ok(c), Ok(t), Ok(i)) => (c, t, i),
                (Err(e), ..) | (_, Err(e), _) | (.., Err(e)) => {
                    tracing::debug!(cluster = %m.name, foreign_cluster = %remote, error = %e, "emulated Liqo: ForeignCluster status not updated");
                    continue;
                }
            };
        // `handleAuthenticationModuleStatus`: a Tenant is NotReady while it expects a key
        // exchange and has no auth params, or has no tenant namespace yet.
        let tenant_ready = |t: &DynamicObject| {
            let expects_keys = t.data.pointer("/spec/authzPolicy").and_then(Value::as_str) != Some("TolerateNoHandshake");
            !(expects_keys && t.data.pointer("/status/authParams").is_none_or(Value::is_null))
                && t.data.pointer("/status/tenantNamespace").and_then(Value::as_str).is_some_and(|n| !n.is_empty())
        };
        let seen = Seen {
            connected: connection.as_ref().is_some_and(|c| c.data.pointer("/status/value").and_then(Value::as_str) == Some("Connected")),
            tenant: tenant.as_ref().map(tenant_ready),
            identity: identity.as_ref().map(|i| i.data.pointer("/status/kubeconfigSecretRef/name").and_then(Value::as_str).is_some_and(|n| !n.is_empty())),
            virtual_node: !list("VirtualNode", "virtualnodes", "offloading.liqo.io").await?.is_empty(),
        };
        let mut status = foreign_cluster_status(tenant_namespaces(tenant.as_ref(), identity.as_ref()), &seen);
        // `handleAuthenticationModuleStatus`: the control-plane Identity's API server, which
        // turns the API server checker on ([`api_server_check`]).
        if let Some(url) = identity.as_ref().and_then(|i| i.data.pointer("/spec/authParams/apiServer")?.as_str()).filter(|u| !u.is_empty()) {
            status["apiServerUrl"] = json!(url);
        }
        let strip = |v: &Value| {
            let mut v = v.clone();
            for module in ["networking", "authentication", "offloading"] {
                if let Some(cs) = v.pointer_mut(&format!("/modules/{module}/conditions")).and_then(Value::as_array_mut) {
                    cs.iter_mut().for_each(|c| {
                        c.as_object_mut().map(|o| o.remove("lastTransitionTime"));
                    });
                }
            }
            v
        };
        if strip(fc.data.get("status").unwrap_or(&Value::Null)) != strip(&status) {
            // Upstream replaces the whole status: a namespace no longer known goes (null in
            // a merge patch).
            let mut patch = status.clone();
            for key in ["local", "remote"] {
                if patch["tenantNamespace"].get(key).is_none() {
                    patch["tenantNamespace"][key] = Value::Null;
                }
            }
            if patch.get("apiServerUrl").is_none() {
                patch["apiServerUrl"] = Value::Null;
            }
            fcs.patch_status(&name_of(&fc), &PatchParams::default(), &Patch::Merge(&json!({"status": patch}))).await?;
        }
        api_server_check(m, wake, &fcs, &fc, &remote, identity.as_ref(), status.get("apiServerUrl").is_some()).await?;
    }
    Ok(())
}

/// How often the API server checker pings (the controller manager's
/// `--foreign-cluster-ping-interval` default, `pkg/liqo-controller-manager/flags.go`).
pub const API_SERVER_PING_INTERVAL: Duration = Duration::from_secs(15);
/// How long a ping may take (`--foreign-cluster-ping-timeout`).
const API_SERVER_PING_TIMEOUT: Duration = Duration::from_secs(5);

/// The ForeignCluster controller's API server checker
/// (`core/foreigncluster-controller/apiserverchecker.go`), run by [`foreign_clusters`] on
/// each ForeignCluster it reads: one with a `status.apiServerUrl` (the consumer's side of
/// a provider) gets an `APIServerStatus` condition, `Established` (`APIServerReady`) while
/// `GET /livez` with the control-plane identity's kubeconfig answers within the ping
/// timeout, else `Error` (`APIServerNotReady`), checked every [`API_SERVER_PING_INTERVAL`];
/// without the URL the condition goes. It is what `foreigncluster.IsDead` reads: an
/// annotated provider whose API server still answers is not dead. (Upstream waits 2 s
/// before its first ping; the emulation pings at once.) Reads nothing until a ping is due.
async fn api_server_check(m: &Member, wake: &Wake, fcs: &Api<DynamicObject>, fc: &DynamicObject, remote: &str, identity: Option<&DynamicObject>, url: bool) -> Result<(), kube::Error> {
    let conditions: Vec<Value> = fc.data.pointer("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
    let current = conditions.iter().find(|c| c["type"] == "APIServerStatus");
    let wanted = if !url || fc.metadata.deletion_timestamp.is_some() {
        m.api_checks.lock().expect("api checks lock").remove(remote);
        None
    } else {
        let last = m.api_checks.lock().expect("api checks lock").get(remote).copied();
        if let Some(at) = last.filter(|at| at.elapsed() < API_SERVER_PING_INTERVAL) {
            wake.after(API_SERVER_PING_INTERVAL.saturating_sub(at.elapsed()));
            return Ok(());
        }
        m.api_checks.lock().expect("api checks lock").insert(remote.to_owned(), std::time::Instant::now());
        wake.after(API_SERVER_PING_INTERVAL);
        // The identity manager's config (`GetConfig`): the Identity's kubeconfig Secret.
        let secret = match identity.and_then(|i| Some((ns_of(i), i.data.pointer("/status/kubeconfigSecretRef/name")?.as_str()?.to_owned()))) {
            Some((ns, name)) => Api::<Secret>::namespaced(m.client.clone(), &ns).get_opt(&name).await?,
            None => None,
        };
        let client = match &secret {
            Some(s) => m.client_from(s).await,
            None => None,
        };
        let answers = match client {
            Some(c) => {
                let req = http::Request::get("/livez").body(Vec::new()).expect("a request");
                matches!(tokio::time::timeout(API_SERVER_PING_TIMEOUT, c.request_text(req)).await, Ok(Ok(_)))
            }
            None => false,
        };
        Some(if answers {
            ("Established", "APIServerReady", "The foreign cluster API Server is ready")
        } else {
            ("Error", "APIServerNotReady", "The foreign cluster API Server is not ready")
        })
    };
    let unchanged = match (current, wanted) {
        (None, None) => true,
        (Some(c), Some((status, ..))) => c["status"] == status,
        _ => false,
    };
    if !unchanged {
        let mut next: Vec<Value> = conditions.iter().filter(|c| c["type"] != "APIServerStatus").cloned().collect();
        if let Some((status, reason, message)) = wanted {
            next.push(resources::cond("APIServerStatus", status, reason, message));
        }
        fcs.patch_status(&name_of(fc), &PatchParams::default(), &Patch::Merge(&json!({"status": {"conditions": next}}))).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Upstream never writes `Established` for an authentication condition (`status.go`
    /// lines ~284-288 and ~337-342 use Ready/NotReady); the emulator must not either.
    #[test]
    fn authentication_conditions_are_never_established() {
        let opts = [None, Some(false), Some(true)];
        for connected in [false, true] {
            for tenant in opts {
                for identity in opts {
                    for virtual_node in [false, true] {
                        let seen = Seen { connected, tenant, identity, virtual_node };
                        let status = foreign_cluster_status(json!({"local": "liqo-tenant-x"}), &seen);
                        let conds = status.pointer("/modules/authentication/conditions").and_then(Value::as_array).expect("conditions");
                        for c in conds {
                            assert!(c["type"].as_str().is_some_and(|t| t.starts_with("Auth")), "{c}");
                            assert!(c["status"] == "Ready" || c["status"] == "NotReady", "{seen:?}: {c}");
                        }
                        assert_eq!(conds.len(), usize::from(tenant.is_some()) + usize::from(identity.is_some()), "{seen:?}");
                    }
                }
            }
        }
        let ready = foreign_cluster_status(json!({}), &Seen { connected: true, tenant: None, identity: Some(true), virtual_node: true });
        assert_eq!(ready.pointer("/modules/authentication/conditions/0/status"), Some(&json!("Ready")));
        assert_eq!(ready.pointer("/modules/networking/conditions/0/status"), Some(&json!("Established")));
    }

    /// `GetNamespace`'s selector: the remote id label equal, the tenant label present
    /// whatever its value; never the name.
    #[test]
    fn tenant_namespace_selector_is_upstreams() {
        assert_eq!(tenant_namespace_selector("kind-b"), "liqo.io/remote-cluster-id=kind-b,liqo.io/tenant-namespace");
    }

    /// None is NotFound, one is it, several is upstream's error.
    #[test]
    fn a_single_tenant_namespace_or_an_error() {
        assert_eq!(single_tenant_namespace("b", vec![]), Ok(None));
        assert_eq!(single_tenant_namespace("b", vec!["tenant-of-b".into()]), Ok(Some("tenant-of-b".into())));
        assert_eq!(
            single_tenant_namespace("b", vec!["liqo-tenant-b".into(), "old-b".into()]),
            Err("multiple tenant namespaces found for clusterid b".to_owned())
        );
    }

    fn obj(ns: &str, data: Value) -> DynamicObject {
        let mut o: DynamicObject = serde_json::from_value(json!({"apiVersion": "authentication.liqo.io/v1beta1", "kind": "Identity", "metadata": {"name": "x"}})).expect("an object");
        o.metadata.namespace = Some(ns.to_owned());
        o.data = data;
        o
    }

    /// `status.tenantNamespace` comes from the Tenant's status and the Identity, never from
    /// the remote's id; the Identity's namespace wins for `local`.
    #[test]
    fn tenant_namespaces_come_from_the_tenant_and_the_identity() {
        assert_eq!(tenant_namespaces(None, None), json!({}));
        let tenant = obj("admin-made", json!({"status": {"tenantNamespace": "admin-made"}}));
        assert_eq!(tenant_namespaces(Some(&tenant), None), json!({"local": "admin-made"}));
        let pending = obj("admin-made", json!({"status": {"tenantNamespace": ""}}));
        assert_eq!(tenant_namespaces(Some(&pending), None), json!({}));
        let identity = obj("old-liqo-ns", json!({"spec": {"namespace": "their-ns"}}));
        assert_eq!(tenant_namespaces(Some(&tenant), Some(&identity)), json!({"local": "old-liqo-ns", "remote": "their-ns"}));
        let no_remote = obj("old-liqo-ns", json!({"spec": {}}));
        assert_eq!(tenant_namespaces(None, Some(&no_remote)), json!({"local": "old-liqo-ns"}));
    }

    /// `Get*ByClusterID`: none, one, or an error.
    #[test]
    fn at_most_one_object_per_cluster() {
        assert!(matches!(at_most_one(vec![], "Tenant", "b"), Ok(None)));
        assert!(matches!(at_most_one(vec![obj("a", json!({}))], "Tenant", "b"), Ok(Some(_))));
        let two = vec![obj("a", json!({})), obj("c", json!({}))];
        assert_eq!(at_most_one(two, "Connection", "b").err().as_deref(), Some("multiple Connections found for ForeignCluster b"));
    }
}

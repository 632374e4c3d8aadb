//! Emulated Liqo on the fleet's managed clusters and the Submariner add-on on the hub,
//! playing the controllers' part so the peer worker meets real objects that progress:
//! Liqo's components (namespace `liqo`, the cluster-id ConfigMap, the controller
//! manager's Deployment) are installed on each member; a GatewayClient with its matching
//! GatewayServer on the other cluster gets a `Connected` Connection on both sides; a
//! Tenant on a provider gets an Identity on the consumer; an accepted ResourceSlice gets a
//! VirtualNode and a virtual Node carrying the provider's capacity; ForeignCluster
//! statuses report each module. On the hub, a `submariner` ManagedClusterAddOn becomes
//! Available. [`LiqoKnobs`]: a cluster whose Liqo is never installed or whose gateway
//! never connects or connects late; a cluster whose Submariner add-on never becomes
//! available.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::emulate::now;
use crate::{Fleet, FleetError};
use ferry_kube::quantity::{millicores, units};

/// Liqo's namespace on every cluster.
pub const LIQO_NAMESPACE: &str = "liqo";
/// The ConfigMap holding a cluster's Liqo cluster id (key `CLUSTER_ID`).
pub const CLUSTER_ID_CONFIGMAP: &str = "liqo-clusterid-configmap";
/// The Deployment whose readiness says Liqo runs.
pub const CONTROLLER_MANAGER: &str = "liqo-controller-manager";
/// Label of a virtual node: the provider's cluster id.
pub const REMOTE_ID_LABEL: &str = "liqo.io/remote-cluster-id";
/// Selector of the virtual nodes (label `liqo.io/type`).
pub const VIRTUAL_NODE_SELECTOR: &str = "liqo.io/type=virtual-node";
/// Taint of every virtual node (`=true:NoExecute`), as Liqo's: only tolerating pods go there.
pub const NOT_ALLOWED_TAINT: &str = "virtual-node.liqo.io/not-allowed";
/// Per-provider taint of the emulated virtual nodes (`=<provider>:NoSchedule`): it stands
/// in for the node affinity Liqo's webhook injects (see [`crate::emulated_offloading`]).
pub const PROVIDER_TAINT: &str = "emulated.liqo.io/remote-cluster-id";
const MANAGER: &str = "ferry-emulated-liqo";
const TICK: Duration = Duration::from_millis(250);

/// Knobs of one cluster.
#[derive(Debug, Clone, Default)]
pub struct LiqoKnobs {
    /// Liqo's controller manager is never installed (its Deployment never exists).
    pub not_installed: bool,
    /// Gateways involving this cluster never connect.
    pub gateway_never_connects: bool,
    /// Gateways involving this cluster connect only once the GatewayClient is this old
    /// (seconds granularity: creation timestamps are whole seconds).
    pub gateway_delay: Duration,
    /// The cluster's Submariner add-on never becomes available.
    pub submariner_unavailable: bool,
}

/// Tenant namespace of `remote` on a cluster.
pub fn tenant_namespace(remote_id: &str) -> String {
    format!("liqo-tenant-{remote_id}")
}

fn ar(group: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, "v1beta1", kind), plural)
}

fn net(kind: &str, plural: &str) -> ApiResource {
    ar("networking.liqo.io", kind, plural)
}

fn auth(kind: &str, plural: &str) -> ApiResource {
    ar("authentication.liqo.io", kind, plural)
}

fn cond(type_: &str, status: &str) -> Value {
    json!({"type": type_, "status": status, "reason": type_, "message": "", "lastTransitionTime": now()})
}

/// Emulated Liqo and Submariner; stops on drop.
pub struct EmulatedLiqo {
    knobs: Arc<Mutex<HashMap<String, LiqoKnobs>>>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for EmulatedLiqo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmulatedLiqo").finish_non_exhaustive()
    }
}

impl Drop for EmulatedLiqo {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Member {
    name: String,
    client: kube::Client,
    installed: bool,
}

impl EmulatedLiqo {
    /// Starts on `fleet` (members: every cluster but the hub); `knobs` apply from the start
    /// (a cluster `not_installed` never gets Liqo's components).
    pub async fn start(fleet: &Fleet, knobs: HashMap<String, LiqoKnobs>) -> Result<Self, FleetError> {
        let hub = fleet.hub().client().await?;
        let mut members = Vec::new();
        for c in fleet.clusters.iter().skip(1) {
            members.push(Member { name: c.name.clone(), client: c.client().await?, installed: false });
        }
        // The Submariner add-on's registration on the hub (what installing submariner-addon does).
        let cma: Api<DynamicObject> = Api::all_with(
            hub.clone(),
            &ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("addon.open-cluster-management.io", "v1alpha1", "ClusterManagementAddOn"),
                "clustermanagementaddons",
            ),
        );
        let obj = json!({"apiVersion": "addon.open-cluster-management.io/v1alpha1", "kind": "ClusterManagementAddOn", "metadata": {"name": "submariner"},
            "spec": {"addOnMeta": {"displayName": "Submariner", "description": "cross-cluster pod and service networking"}}});
        apply(&cma, &obj).await.map_err(|e| FleetError::Client { cluster: "hub".into(), source: Box::new(e) })?;
        let knobs = Arc::new(Mutex::new(knobs));
        let k = knobs.clone();
        let task = tokio::spawn(async move {
            let mut every = tokio::time::interval(TICK);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                // Knobs are read live, when each object is decided: a knob set before an
                // object exists then always applies to it, even mid-tick.
                if let Err(e) = tick(&hub, &mut members, &k).await {
                    tracing::debug!(error = %e, "emulated Liqo: retrying on the next tick");
                }
            }
        });
        Ok(Self { knobs, task })
    }

    /// Changes the knobs of `cluster`.
    pub fn set(&self, cluster: &str, f: impl FnOnce(&mut LiqoKnobs)) {
        f(self.knobs.lock().expect("knobs lock").entry(cluster.to_owned()).or_default());
    }
}

async fn apply(api: &Api<DynamicObject>, obj: &Value) -> Result<(), kube::Error> {
    let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    api.patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(obj)).await.map(drop)
}

async fn set_status(api: &Api<DynamicObject>, name: &str, status: Value) -> Result<(), kube::Error> {
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&json!({"status": status}))).await.map(drop)
}

async fn ensure_namespace(client: &kube::Client, ns: &str) -> Result<(), kube::Error> {
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    if api.get_opt(ns).await?.is_none() {
        let obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        api.patch(ns, &PatchParams::apply(MANAGER), &Patch::Apply(&obj)).await?;
    }
    Ok(())
}

/// Installs Liqo's components on a member: namespace, cluster id, controller manager.
async fn install(m: &Member) -> Result<(), kube::Error> {
    ensure_namespace(&m.client, LIQO_NAMESPACE).await?;
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(m.client.clone(), LIQO_NAMESPACE);
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": CLUSTER_ID_CONFIGMAP, "namespace": LIQO_NAMESPACE},
        "data": {"CLUSTER_ID": m.name}});
    cms.patch(CLUSTER_ID_CONFIGMAP, &PatchParams::apply(MANAGER), &Patch::Apply(&cm)).await?;
    let deps: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(m.client.clone(), LIQO_NAMESPACE);
    let d = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": CONTROLLER_MANAGER, "namespace": LIQO_NAMESPACE},
        "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": "controller-manager"}},
                 "template": {"metadata": {"labels": {"app.kubernetes.io/name": "controller-manager"}},
                              "spec": {"tolerations": [{"operator": "Exists"}],
                                       "containers": [{"name": "controller-manager", "image": "ghcr.io/liqotech/liqo-controller-manager:v1.2.0"}]}}}});
    deps.patch(CONTROLLER_MANAGER, &PatchParams::apply(MANAGER), &Patch::Apply(&d)).await?;
    Ok(())
}

fn name_of(o: &DynamicObject) -> String {
    o.metadata.name.clone().unwrap_or_default()
}

fn ns_of(o: &DynamicObject) -> String {
    o.metadata.namespace.clone().unwrap_or_default()
}

/// The remote cluster id a tenant namespace stands for.
fn remote_of(ns: &str) -> Option<&str> {
    ns.strip_prefix("liqo-tenant-")
}

/// Spare CPU and memory of a cluster's real (not virtual) nodes: allocatable less the
/// requests of the pods bound to them.
async fn capacity(client: &kube::Client) -> Result<(String, String), kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut cpu_m: i64 = 0;
    let mut mem: i64 = 0;
    let mut real = std::collections::HashSet::new();
    for n in nodes.list(&ListParams::default()).await?.items {
        if n.metadata.labels.as_ref().is_some_and(|l| l.contains_key(REMOTE_ID_LABEL)) {
            continue;
        }
        real.insert(n.metadata.name.clone().unwrap_or_default());
        let alloc = n.status.and_then(|s| s.allocatable).unwrap_or_default();
        if let Some(q) = alloc.get("cpu") {
            cpu_m += millicores(&q.0).unwrap_or(0);
        }
        if let Some(q) = alloc.get("memory") {
            mem += units(&q.0).unwrap_or(0);
        }
    }
    // Spare: less what the pods on those nodes request.
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::all(client.clone());
    for p in pods.list(&ListParams::default().fields("status.phase!=Succeeded,status.phase!=Failed")).await?.items {
        let Some(spec) = p.spec else { continue };
        if !spec.node_name.as_ref().is_some_and(|n| real.contains(n)) {
            continue;
        }
        for c in &spec.containers {
            let req = c.resources.as_ref().and_then(|r| r.requests.as_ref());
            cpu_m -= req.and_then(|r| r.get("cpu")).map_or(0, |q| millicores(&q.0).unwrap_or(0));
            mem -= req.and_then(|r| r.get("memory")).map_or(0, |q| units(&q.0).unwrap_or(0));
        }
    }
    Ok((format!("{}m", cpu_m.max(0)), format!("{}Mi", mem.max(0) / (1024 * 1024))))
}

async fn tick(hub: &kube::Client, members: &mut [Member], knobs: &Mutex<HashMap<String, LiqoKnobs>>) -> Result<(), kube::Error> {
    let knob = |c: &str| knobs.lock().expect("knobs lock").get(c).cloned().unwrap_or_default();
    for m in members.iter_mut() {
        if !m.installed && !knob(&m.name).not_installed {
            install(m).await?;
            m.installed = true;
        }
    }
    let clients: BTreeMap<String, kube::Client> = members.iter().map(|m| (m.name.clone(), m.client.clone())).collect();
    for m in members.iter() {
        if !m.installed {
            continue;
        }
        networking(m, &clients, &knob).await?;
        authentication(m, &clients).await?;
        resources(m, &clients).await?;
        foreign_clusters(m).await?;
    }
    submariner(hub, &knob).await
}

/// GatewayServers get an endpoint address (their LoadBalancer Service's); a GatewayClient
/// here + the GatewayServer there → Connected on both sides.
async fn networking(m: &Member, clients: &BTreeMap<String, kube::Client>, knob: &impl Fn(&str) -> LiqoKnobs) -> Result<(), kube::Error> {
    let gss: Api<DynamicObject> = Api::all_with(m.client.clone(), &net("GatewayServer", "gatewayservers"));
    for gs in gss.list(&ListParams::default()).await?.items {
        if gs.data.pointer("/status/endpoint/addresses").is_none() {
            let n = m.name.bytes().fold(0u32, |a, b| a.wrapping_mul(31).wrapping_add(u32::from(b))) % 250 + 1;
            let port = gs.data.pointer("/spec/endpoint/port").cloned().unwrap_or(json!(51840));
            let api: Api<DynamicObject> = Api::namespaced_with(m.client.clone(), &ns_of(&gs), &net("GatewayServer", "gatewayservers"));
            set_status(&api, &name_of(&gs), json!({"endpoint": {"addresses": [format!("198.51.100.{n}")], "port": port, "protocol": "UDP"}})).await?;
        }
    }
    let gcs: Api<DynamicObject> = Api::all_with(m.client.clone(), &net("GatewayClient", "gatewayclients"));
    for gc in gcs.list(&ListParams::default()).await?.items {
        let ns = ns_of(&gc);
        let Some(remote) = remote_of(&ns) else { continue };
        let Some(rc) = clients.get(remote) else { continue };
        let servers: Api<DynamicObject> = Api::namespaced_with(rc.clone(), &tenant_namespace(&m.name), &net("GatewayServer", "gatewayservers"));
        let server = servers.list(&ListParams::default()).await?.items.into_iter().next();
        let (here, there) = (knob(&m.name), knob(remote));
        let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        let age_ms = gc.metadata.creation_timestamp.as_ref().map_or(0, |t| now_ms - t.0.as_millisecond());
        let old_enough = age_ms >= here.gateway_delay.max(there.gateway_delay).as_millis() as i64;
        let connected = server.is_some() && !here.gateway_never_connects && !there.gateway_never_connects && old_enough;
        let value = if connected { "Connected" } else { "Connecting" };
        // Our side always reports; the server's side once it exists.
        let mut sides = vec![(&m.client, ns.clone(), remote.to_owned())];
        if server.is_some() {
            sides.push((rc, tenant_namespace(&m.name), m.name.clone()));
        }
        for (client, ns, peer) in sides {
            let conns: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &net("Connection", "connections"));
            let name = format!("gw-{peer}");
            let obj = json!({"apiVersion": "networking.liqo.io/v1beta1", "kind": "Connection", "metadata": {"name": name, "namespace": ns,
                "labels": {REMOTE_ID_LABEL: peer}}, "spec": {"type": "Client", "gatewayRef": {"name": name}}});
            if conns.get_opt(&name).await?.is_none() {
                apply(&conns, &obj).await?;
            }
            let current = conns.get(&name).await?;
            if current.data.pointer("/status/value").and_then(Value::as_str) != Some(value) {
                set_status(&conns, &name, json!({"value": value})).await?;
            }
        }
    }
    // Connections whose gateways are gone go too.
    let conns: Api<DynamicObject> = Api::all_with(m.client.clone(), &net("Connection", "connections"));
    for c in conns.list(&ListParams::default()).await?.items {
        let ns = ns_of(&c);
        let gc =
            Api::<DynamicObject>::namespaced_with(m.client.clone(), &ns, &net("GatewayClient", "gatewayclients")).list(&ListParams::default()).await?.items;
        let gs =
            Api::<DynamicObject>::namespaced_with(m.client.clone(), &ns, &net("GatewayServer", "gatewayservers")).list(&ListParams::default()).await?.items;
        if gc.is_empty() && gs.is_empty() {
            let api: Api<DynamicObject> = Api::namespaced_with(m.client.clone(), &ns, &net("Connection", "connections"));
            let _ = api.delete(&name_of(&c), &DeleteParams::default()).await;
        }
    }
    Ok(())
}

/// A Tenant on this (provider) cluster → an Identity on the consumer; removed with it.
async fn authentication(m: &Member, clients: &BTreeMap<String, kube::Client>) -> Result<(), kube::Error> {
    let tenants: Api<DynamicObject> = Api::all_with(m.client.clone(), &auth("Tenant", "tenants"));
    let list = tenants.list(&ListParams::default()).await?.items;
    for t in &list {
        let Some(consumer) = t.data.pointer("/spec/clusterID").and_then(Value::as_str) else { continue };
        let Some(cc) = clients.get(consumer) else { continue };
        let ns = tenant_namespace(&m.name);
        ensure_namespace(cc, &ns).await?;
        let ids: Api<DynamicObject> = Api::namespaced_with(cc.clone(), &ns, &auth("Identity", "identities"));
        let name = format!("controlplane-{}", m.name);
        if ids.get_opt(&name).await?.is_none() {
            let obj = json!({"apiVersion": "authentication.liqo.io/v1beta1", "kind": "Identity", "metadata": {"name": name, "namespace": ns,
                "labels": {REMOTE_ID_LABEL: m.name}}, "spec": {"clusterID": m.name, "type": "ControlPlane"}});
            apply(&ids, &obj).await?;
        }
        if t.data.pointer("/status/tenantNamespace").is_none() {
            let api: Api<DynamicObject> = Api::namespaced_with(m.client.clone(), &ns_of(t), &auth("Tenant", "tenants"));
            set_status(&api, &name_of(t), json!({"tenantNamespace": ns_of(t)})).await?;
        }
    }
    // Identities on other clusters whose Tenant here is gone.
    for (name, cc) in clients {
        if name == &m.name {
            continue;
        }
        let ids: Api<DynamicObject> = Api::namespaced_with(cc.clone(), &tenant_namespace(&m.name), &auth("Identity", "identities"));
        let still = list.iter().any(|t| t.data.pointer("/spec/clusterID").and_then(Value::as_str) == Some(name));
        if !still {
            let _ = ids.delete(&format!("controlplane-{}", m.name), &DeleteParams::default()).await;
        }
    }
    Ok(())
}

/// ResourceSlices on this (consumer) cluster, accepted when the provider has a Tenant for
/// us: a VirtualNode and a virtual Node with the provider's capacity; both go with it.
async fn resources(m: &Member, clients: &BTreeMap<String, kube::Client>) -> Result<(), kube::Error> {
    let slices: Api<DynamicObject> = Api::all_with(m.client.clone(), &auth("ResourceSlice", "resourceslices"));
    let list = slices.list(&ListParams::default()).await?.items;
    let nodes: Api<Node> = Api::all(m.client.clone());
    let mut wanted = Vec::new();
    for s in &list {
        let Some(provider) = s.data.pointer("/spec/providerClusterID").and_then(Value::as_str) else { continue };
        let Some(pc) = clients.get(provider) else { continue };
        let tenants: Api<DynamicObject> = Api::all_with(pc.clone(), &auth("Tenant", "tenants"));
        let authed =
            tenants.list(&ListParams::default()).await?.items.iter().any(|t| t.data.pointer("/spec/clusterID").and_then(Value::as_str) == Some(&m.name));
        let api: Api<DynamicObject> = Api::namespaced_with(m.client.clone(), &ns_of(s), &auth("ResourceSlice", "resourceslices"));
        if !authed {
            set_status(&api, &name_of(s), json!({"conditions": [cond("Authentication", "Denied"), cond("Resources", "Denied")]})).await?;
            continue;
        }
        let (cpu, memory) = capacity(pc).await?;
        let accepted = s
            .data
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Resources" && c["status"] == "Accepted"));
        if !accepted {
            set_status(
                &api,
                &name_of(s),
                json!({"conditions": [cond("Authentication", "Accepted"), cond("Resources", "Accepted")],
                "resources": {"cpu": cpu, "memory": memory, "pods": "110"}}),
            )
            .await?;
        }
        let vns: Api<DynamicObject> = Api::namespaced_with(m.client.clone(), &ns_of(s), &ar("offloading.liqo.io", "VirtualNode", "virtualnodes"));
        let vn = json!({"apiVersion": "offloading.liqo.io/v1beta1", "kind": "VirtualNode", "metadata": {"name": provider, "namespace": ns_of(s),
            "labels": {REMOTE_ID_LABEL: provider}}, "spec": {"clusterID": provider, "createNode": true,
            "resourceQuota": {"hard": {"cpu": cpu, "memory": memory, "pods": "110"}}}});
        if vns.get_opt(provider).await?.is_none() {
            apply(&vns, &vn).await?;
        }
        let node_name = format!("liqo-{provider}");
        wanted.push(node_name.clone());
        let existing = nodes.get_opt(&node_name).await?;
        if existing.is_none() {
            let node: Node = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node_name,
                "labels": {REMOTE_ID_LABEL: provider, "liqo.io/type": "virtual-node", "kubernetes.io/hostname": node_name}},
                "spec": {"taints": virtual_node_taints(provider)}}))
            .expect("valid node");
            match nodes.create(&PostParams::default(), &node).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(e),
            }
        }
        // Admission adds the not-ready taint at creation: its own taints only, before it reports
        // Ready (so a Ready virtual node has its final taints); both repaired on later ticks.
        let taints = existing.as_ref().and_then(|n| n.spec.as_ref()).and_then(|s| serde_json::to_value(&s.taints).ok());
        if taints.as_ref() != Some(&virtual_node_taints(provider)) {
            nodes.patch(&node_name, &PatchParams::default(), &Patch::Merge(&json!({"spec": {"taints": virtual_node_taints(provider)}}))).await?;
        }
        let ready = existing
            .as_ref()
            .and_then(|n| n.status.as_ref()?.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        if !ready {
            let status = json!({"status": {"capacity": {"cpu": cpu, "memory": memory, "pods": "110"}, "allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "emulated Liqo virtual kubelet", "lastHeartbeatTime": now(), "lastTransitionTime": now()}]}});
            nodes.patch_status(&node_name, &PatchParams::default(), &Patch::Merge(&status)).await?;
        }
    }
    // Virtual nodes without a slice go, with their VirtualNode.
    for n in nodes.list(&ListParams::default().labels("liqo.io/type=virtual-node")).await?.items {
        let name = n.metadata.name.clone().unwrap_or_default();
        if !wanted.contains(&name) {
            nodes.delete(&name, &DeleteParams::default()).await?;
            let provider = name.trim_start_matches("liqo-").to_owned();
            let vns: Api<DynamicObject> =
                Api::namespaced_with(m.client.clone(), &tenant_namespace(&provider), &ar("offloading.liqo.io", "VirtualNode", "virtualnodes"));
            let _ = vns.delete(&provider, &DeleteParams::default()).await;
        }
    }
    Ok(())
}

/// Liqo's taint and the emulation's per-provider taint.
fn virtual_node_taints(provider: &str) -> Value {
    json!([{"key": NOT_ALLOWED_TAINT, "value": "true", "effect": "NoExecute"}, {"key": PROVIDER_TAINT, "value": provider, "effect": "NoSchedule"}])
}

/// ForeignCluster status: each module established or not, from what exists.
async fn foreign_clusters(m: &Member) -> Result<(), kube::Error> {
    let fcs: Api<DynamicObject> = Api::all_with(m.client.clone(), &ar("core.liqo.io", "ForeignCluster", "foreignclusters"));
    for fc in fcs.list(&ListParams::default()).await?.items {
        let Some(remote) = fc.data.pointer("/spec/clusterID").and_then(Value::as_str).map(str::to_owned) else { continue };
        let ns = tenant_namespace(&remote);
        let count = |kind: &str, plural: &str, group: &str| {
            let api: Api<DynamicObject> = Api::namespaced_with(m.client.clone(), &ns, &ar(group, kind, plural));
            async move { api.list(&ListParams::default()).await.map(|l| l.items) }
        };
        let connected = count("Connection", "connections", "networking.liqo.io")
            .await?
            .iter()
            .any(|c| c.data.pointer("/status/value").and_then(Value::as_str) == Some("Connected"));
        let tenant = !count("Tenant", "tenants", "authentication.liqo.io").await?.is_empty();
        let identity = !count("Identity", "identities", "authentication.liqo.io").await?.is_empty();
        let virtual_node = !count("VirtualNode", "virtualnodes", "offloading.liqo.io").await?.is_empty();
        let role = match (identity, tenant) {
            (true, true) => "ConsumerAndProvider",
            (true, false) => "Provider",
            (false, true) => "Consumer",
            _ => "Unknown",
        };
        let st = |ok: bool, yes: &str| if ok { yes.to_owned() } else { "NotReady".to_owned() };
        let status = json!({
            "role": role,
            "tenantNamespace": {"local": ns},
            "modules": {
                "networking": {"enabled": connected, "conditions": [cond("NetworkConnectionStatus", &st(connected, "Established"))]},
                "authentication": {"enabled": tenant || identity, "conditions": [cond("AuthIdentityControlPlaneStatus", &st(identity, "Established")), cond("AuthTenantStatus", &st(tenant, "Established"))]},
                "offloading": {"enabled": virtual_node, "conditions": [cond("OffloadingVirtualNodeStatus", &st(virtual_node, "Ready"))]},
            },
        });
        let same = |a: &Value, b: &Value| {
            let strip = |v: &Value| {
                let mut v = v.clone();
                for m in ["networking", "authentication", "offloading"] {
                    if let Some(cs) = v.pointer_mut(&format!("/modules/{m}/conditions")).and_then(Value::as_array_mut) {
                        cs.iter_mut().for_each(|c| {
                            c.as_object_mut().map(|o| o.remove("lastTransitionTime"));
                        });
                    }
                }
                v
            };
            strip(a) == strip(b)
        };
        if !same(fc.data.get("status").unwrap_or(&Value::Null), &status) {
            fcs.patch_status(&name_of(&fc), &PatchParams::default(), &Patch::Merge(&json!({"status": status}))).await?;
        }
    }
    Ok(())
}

/// The hub's `submariner` ManagedClusterAddOns become Available (the add-on's agent
/// deployed and its gateway connected), unless the cluster's knob says otherwise.
async fn submariner(hub: &kube::Client, knob: &impl Fn(&str) -> LiqoKnobs) -> Result<(), kube::Error> {
    let api: Api<DynamicObject> = Api::all_with(
        hub.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("addon.open-cluster-management.io", "v1alpha1", "ManagedClusterAddOn"),
            "managedclusteraddons",
        ),
    );
    for a in api.list(&ListParams::default()).await?.items {
        if name_of(&a) != "submariner" || a.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let cluster = ns_of(&a);
        let ok = !knob(&cluster).submariner_unavailable;
        let want = if ok { "True" } else { "False" };
        let have = a
            .data
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Available"))
            .and_then(|c| c["status"].as_str())
            .map(str::to_owned);
        if have.as_deref() != Some(want) {
            let ns_api: Api<DynamicObject> = Api::namespaced_with(
                hub.clone(),
                &cluster,
                &ApiResource::from_gvk_with_plural(
                    &GroupVersionKind::gvk("addon.open-cluster-management.io", "v1alpha1", "ManagedClusterAddOn"),
                    "managedclusteraddons",
                ),
            );
            let conds = json!([
                {"type": "Available", "status": want, "reason": if ok { "AddonAvailable" } else { "GatewayNotConnected" }, "message": if ok { "submariner gateway connected" } else { "the gateway never connected (emulated)" }, "lastTransitionTime": now()},
                {"type": "SubmarinerGatewayNodesLabeled", "status": "True", "reason": "Labeled", "message": "", "lastTransitionTime": now()},
            ]);
            set_status(&ns_api, "submariner", json!({"conditions": conds})).await?;
        }
    }
    Ok(())
}

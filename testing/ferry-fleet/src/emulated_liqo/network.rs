//! Emulated Liqo external network on one member (liqotech/liqo
//! `pkg/liqo-controller-manager/networking/external-network/`):
//!
//! - **Configuration** (`configuration/configuration_controller.go`): a Configuration
//!   without the `liqo.io/remote-cluster-id` label is an error; `spec.local` is defaulted
//!   from the cluster's own Networks (`defaultLocalNetwork`); each remote pod and external
//!   CIDR gets a Network `<cfg>-<pod|external>-<cidr>` owned by the Configuration
//!   (`network.go`, `EnsureNetwork`), which the IPAM may remap; the remapped CIDRs go to
//!   `status.remote.cidr` and condition `NetworkCIDRsConfigured` (with the observed
//!   generation) is True once all are allocated (`setConfigurationConditions`).
//! - **GatewayServer / GatewayClient** (`server-operator/server_controller.go`,
//!   `client-operator/client_controller.go`): the remote-cluster-id label and a template
//!   the ref names (`serverTemplateRef` / `clientTemplateRef`) are required — without them
//!   the gateway is never deployed and its status stays empty (a Warning event says why);
//!   with them the gateway runs: its WireGuard key pair lands in a Secret (field
//!   `publicKey`) named by `status.secretRef`, and the server publishes `status.endpoint`
//!   (its LoadBalancer address).
//! - **Connection** (what the WireGuard gateways report): on both sides, `Connected` only
//!   when the client points at the server's endpoint and each side holds a PublicKey for
//!   the other carrying the other gateway's key, labelled with the other's cluster id and
//!   in the gateway's own namespace (`forge/publickey.go`; liqoctl's `EnsurePublicKey`;
//!   the gateway's `publickeys_controller.go`), else `Connecting`. [`super::LiqoKnobs`] delay or prevent it.
//!
//! Not emulated: the WgGatewayServer/WgGatewayClient the templates render, the gateway
//! pods, routes and firewall rules.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

use super::{LiqoKnobs, MANAGER, Member, apply, ar, at_most_one, cond_v1, event, ipam, name_of, ns_of, set_status};
use crate::wake::Wake;
use ferry_kube::vocab::liqo::REMOTE_ID_LABEL;

pub(super) fn net(kind: &str, plural: &str) -> kube::api::ApiResource {
    ar("networking.liqo.io", "v1beta1", kind, plural)
}

fn api(client: &kube::Client, ns: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &net(kind, plural))
}

fn escape(cidr: &str) -> String {
    cidr.replace(['/', '.'], "-")
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array).map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_owned)).collect()).unwrap_or_default()
}

/// The Configuration controller.
pub(super) async fn configurations(m: &Member) -> Result<(), kube::Error> {
    let all: Api<DynamicObject> = Api::all_with(m.client.clone(), &net("Configuration", "configurations"));
    for cfg in all.list(&ListParams::default()).await?.items {
        if cfg.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let (name, ns) = (name_of(&cfg), ns_of(&cfg));
        let cfgs = api(&m.client, &ns, "Configuration", "configurations");
        let Some(remote) = cfg.metadata.labels.as_ref().and_then(|l| l.get(REMOTE_ID_LABEL)).cloned() else {
            event(&m.client, &cfg, "Warning", "Failed", &format!("missing label {REMOTE_ID_LABEL}")).await?;
            continue;
        };
        if cfg.data.pointer("/spec/local").is_none() {
            let local = json!({"cidr": {"pod": ipam::local_cidrs(&m.client, "pod-cidr").await?, "external": ipam::local_cidrs(&m.client, "external-cidr").await?}});
            cfgs.patch(&name, &PatchParams::apply(MANAGER), &Patch::Merge(&json!({"spec": {"local": local}}))).await?;
        }
        let networks = ipam::networks_api(&m.client, Some(&ns));
        let mut remapped = serde_json::Map::new();
        let mut complete = true;
        for kind in ["pod", "external"] {
            let want = strings(cfg.data.pointer(&format!("/spec/remote/cidr/{kind}")));
            // Orphans first (`DeleteOrphanNetworks`): owned Networks no longer asked for.
            let lp = ListParams::default().labels(&format!("{REMOTE_ID_LABEL}={remote},configuration.liqo.io/cidr-type={kind}"));
            for n in networks.list(&lp).await?.items {
                let owned = n.metadata.owner_references.as_ref().is_some_and(|o| o.iter().any(|r| Some(&r.uid) == cfg.metadata.uid.as_ref()));
                let cidr = n.data.pointer("/spec/cidr").and_then(Value::as_str).unwrap_or_default();
                if owned && !want.iter().any(|w| w == cidr) {
                    let _ = networks.delete(&name_of(&n), &DeleteParams::default()).await;
                }
            }
            let mut got = Vec::new();
            for c in &want {
                let nname = format!("{name}-{kind}-{}", escape(c));
                let obj = json!({"apiVersion": "ipam.liqo.io/v1alpha1", "kind": "Network",
                    "metadata": {"name": nname, "namespace": ns, "labels": {REMOTE_ID_LABEL: remote, "configuration.liqo.io/cidr-type": kind},
                        "ownerReferences": [{"apiVersion": "networking.liqo.io/v1beta1", "kind": "Configuration", "name": name,
                            "uid": cfg.metadata.uid.clone().unwrap_or_default(), "controller": true}]},
                    "spec": {"cidr": c}});
                let n = match networks.get_opt(&nname).await? {
                    Some(n) => n,
                    None => networks.patch(&nname, &PatchParams::apply(MANAGER), &Patch::Apply(&obj)).await?,
                };
                match n.data.pointer("/status/cidr").and_then(Value::as_str) {
                    Some(s) => got.push(json!(s)),
                    None => complete = false,
                }
            }
            remapped.insert(kind.to_owned(), Value::Array(got));
        }
        let generation = cfg.metadata.generation.unwrap_or(0);
        let (status, reason, message) = if complete {
            ("True", "NetworkCIDRsConfigured", "All network CIDRs are configured")
        } else {
            ("False", "WaitingForNetworks", "Waiting for all networks to be ready")
        };
        let old = cfg.data.pointer("/status/conditions").and_then(Value::as_array).and_then(|cs| cs.iter().find(|c| c["type"] == "NetworkCIDRsConfigured")).cloned();
        let same = old.as_ref().is_some_and(|c| c["status"] == status && c["observedGeneration"] == generation)
            && cfg.data.pointer("/status/remote/cidr") == Some(&Value::Object(remapped.clone()));
        if !same {
            let c = cond_v1(old.as_ref(), "NetworkCIDRsConfigured", status, reason, message, generation);
            set_status(&cfgs, &name, json!({"remote": {"cidr": remapped}, "conditions": [c]})).await?;
        }
    }
    ipam::reconcile(&m.client).await
}

/// The address a cluster's gateway servers publish (its emulated LoadBalancer's).
pub(super) fn endpoint_address(cluster: &str) -> String {
    let n = cluster.bytes().fold(0u32, |a, b| a.wrapping_mul(31).wrapping_add(u32::from(b))) % 250 + 1;
    format!("198.51.100.{n}")
}

/// A WireGuard public key: 32 random bytes (the gateway pod makes its own key pair).
fn wireguard_key() -> Vec<u8> {
    let mut k = [0u8; 32];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut k);
    k.to_vec()
}

/// Ensures the gateway's key Secret; the public key it holds.
async fn keys(m: &Member, ns: &str, gateway: &str) -> Result<Vec<u8>, kube::Error> {
    let secrets: Api<Secret> = Api::namespaced(m.client.clone(), ns);
    let name = format!("{gateway}-wg-keys");
    if let Some(s) = secrets.get_opt(&name).await?
        && let Some(k) = s.data.as_ref().and_then(|d| d.get("publicKey"))
    {
        return Ok(k.0.clone());
    }
    let key = wireguard_key();
    let obj = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": ns, "labels": {"networking.liqo.io/gateway-resource": "true"}},
        "data": {"publicKey": base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &key)}});
    secrets.patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&obj)).await?;
    Ok(key)
}

/// Whether the template a gateway's `ref_field` names exists; else why not.
async fn template(m: &Member, gw: &DynamicObject, ref_field: &str) -> Result<Result<(), String>, kube::Error> {
    let r = gw.data.pointer(&format!("/spec/{ref_field}")).cloned().unwrap_or(Value::Null);
    let (Some(api_version), Some(kind), Some(name)) = (r["apiVersion"].as_str(), r["kind"].as_str(), r["name"].as_str()) else {
        return Ok(Err(format!("unable to get the template: spec.{ref_field} names no template")));
    };
    let ns = r["namespace"].as_str().unwrap_or_default();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let plural = format!("{}s", kind.to_lowercase());
    let api: Api<DynamicObject> = Api::namespaced_with(m.client.clone(), ns, &ar(group, version, kind, &plural));
    Ok(match api.get_opt(name).await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(format!("unable to get the template: {kind} {ns}/{name} not found")),
        Err(kube::Error::Api(e)) if e.code == 404 => Err(format!("unable to get the template: {kind} is not served")),
        Err(e) => return Err(e),
    })
}

/// The gateway controllers: servers and clients with a template get their key Secret and
/// status; a server also its endpoint.
pub(super) async fn gateways(m: &Member) -> Result<(), kube::Error> {
    for (kind, plural, ref_field, server) in
        [("GatewayServer", "gatewayservers", "serverTemplateRef", true), ("GatewayClient", "gatewayclients", "clientTemplateRef", false)]
    {
        let all: Api<DynamicObject> = Api::all_with(m.client.clone(), &net(kind, plural));
        for gw in all.list(&ListParams::default()).await?.items {
            if gw.metadata.deletion_timestamp.is_some() || gw.data.pointer("/status/secretRef/name").is_some() {
                continue;
            }
            if gw.metadata.labels.as_ref().and_then(|l| l.get(REMOTE_ID_LABEL)).is_none() {
                event(&m.client, &gw, "Warning", "Failed", &format!("missing label {REMOTE_ID_LABEL} on {kind} {}", name_of(&gw))).await?;
                continue;
            }
            if let Err(why) = template(m, &gw, ref_field).await? {
                event(&m.client, &gw, "Warning", "Failed", &why).await?;
                continue;
            }
            let ns = ns_of(&gw);
            keys(m, &ns, &name_of(&gw)).await?;
            let mut status = json!({"secretRef": {"apiVersion": "v1", "kind": "Secret", "name": format!("{}-wg-keys", name_of(&gw)), "namespace": ns}});
            if server {
                let port = gw.data.pointer("/spec/endpoint/port").cloned().unwrap_or(json!(51840));
                status["endpoint"] = json!({"addresses": [endpoint_address(&m.name)], "port": port, "protocol": "UDP"});
            }
            set_status(&api(&m.client, &ns, kind, plural), &name_of(&gw), status).await?;
        }
    }
    Ok(())
}

/// The public key in a gateway's key Secret, if it has one yet.
async fn gateway_key(client: &kube::Client, gw: &DynamicObject) -> Result<Option<Vec<u8>>, kube::Error> {
    let (Some(name), Some(ns)) =
        (gw.data.pointer("/status/secretRef/name").and_then(Value::as_str), gw.data.pointer("/status/secretRef/namespace").and_then(Value::as_str))
    else {
        return Ok(None);
    };
    Ok(Api::<Secret>::namespaced(client.clone(), ns).get_opt(name).await?.and_then(|s| s.data?.get("publicKey").map(|k| k.0.clone())))
}

/// Whether a gateway in namespace `ns` toward `remote` sees a PublicKey carrying `key`: the
/// WireGuard gateway's cache holds its own namespace only (`cmd/gateway/wireguard/main.go`,
/// `DefaultNamespaces`: the gateway's, i.e. its GatewayServer's or GatewayClient's) and
/// its PublicKey controller takes the keys labelled `liqo.io/remote-cluster-id` = its
/// remote (`pkg/gateway/tunnel/wireguard/publickeys_controller.go`, `Predicates`). Not a
/// namespace named after the remote: the tenant namespace may have any name.
async fn holds_key(client: &kube::Client, ns: &str, remote: &str, key: &[u8]) -> Result<bool, kube::Error> {
    let b64 = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, key);
    let lp = ListParams::default().labels(&format!("{REMOTE_ID_LABEL}={remote}"));
    let pks = api(client, ns, "PublicKey", "publickeies").list(&lp).await?.items;
    Ok(pks.iter().any(|p| p.data.pointer("/spec/publicKey").and_then(Value::as_str) == Some(&b64)))
}

/// The GatewayServer `cluster` runs toward `remote`, the one a GatewayClient of `remote`
/// dials: found as upstream finds a cluster's gateway server, by its
/// `liqo.io/remote-cluster-id` label in any namespace (`pkg/utils/getters/k8sGetters.go`,
/// `GetGatewayServerByClusterID(..., corev1.NamespaceAll)`: more than one is an error,
/// here no server, so no connection).
async fn server_toward(cluster: &kube::Client, remote: &str) -> Result<Option<DynamicObject>, kube::Error> {
    let all: Api<DynamicObject> = Api::all_with(cluster.clone(), &net("GatewayServer", "gatewayservers"));
    let servers = all.list(&ListParams::default().labels(&format!("{REMOTE_ID_LABEL}={remote}"))).await?.items;
    Ok(at_most_one(servers, "GatewayServer", remote).unwrap_or_else(|e| {
        tracing::debug!(remote, error = %e, "emulated Liqo: no connection");
        None
    }))
}

/// Connections on both sides of each client: Connected once the keys are exchanged and
/// the client points at the server; removed with their gateways.
pub(super) async fn connections(m: &Member, clients: &BTreeMap<String, kube::Client>, knob: &impl Fn(&str) -> LiqoKnobs, wake: &Wake) -> Result<(), kube::Error> {
    let gcs: Api<DynamicObject> = Api::all_with(m.client.clone(), &net("GatewayClient", "gatewayclients"));
    for gc in gcs.list(&ListParams::default()).await?.items {
        let Some(remote) = gc.metadata.labels.as_ref().and_then(|l| l.get(REMOTE_ID_LABEL)).cloned() else { continue };
        let Some(rc) = clients.get(&remote) else { continue };
        let server = server_toward(rc, &m.name).await?;
        let (here, there) = (knob(&m.name), knob(&remote));
        let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        let age_ms = gc.metadata.creation_timestamp.as_ref().map_or(0, |t| now_ms - t.0.as_millisecond());
        let delay_ms = here.gateway_delay.max(there.gateway_delay).as_millis() as i64;
        let old_enough = age_ms >= delay_ms;
        if !old_enough {
            wake.after(std::time::Duration::from_millis((delay_ms - age_ms) as u64));
        }
        let mut connected = !here.gateway_never_connects && !there.gateway_never_connects && old_enough;
        if let Some(s) = &server {
            let published = s.data.pointer("/status/endpoint/addresses/0").and_then(Value::as_str);
            let dialled = strings(gc.data.pointer("/spec/endpoint/addresses"));
            connected &= published.is_some_and(|a| dialled.iter().any(|d| d == a));
            let (ck, sk) = (gateway_key(&m.client, &gc).await?, gateway_key(rc, s).await?);
            connected &= match (ck, sk) {
                (Some(ck), Some(sk)) => holds_key(&m.client, &ns_of(&gc), &remote, &sk).await? && holds_key(rc, &ns_of(s), &m.name, &ck).await?,
                _ => false,
            };
        } else {
            connected = false;
        }
        let value = if connected { "Connected" } else { "Connecting" };
        let mut sides = vec![(m.client.clone(), ns_of(&gc), remote.clone(), "Client", name_of(&gc))];
        if let Some(s) = &server {
            sides.push((rc.clone(), ns_of(s), m.name.clone(), "Server", name_of(s)));
        }
        for (client, ns, peer, type_, gateway) in sides {
            let conns = api(&client, &ns, "Connection", "connections");
            let name = format!("{}-{peer}", type_.to_lowercase());
            if conns.get_opt(&name).await?.is_none() {
                let obj = json!({"apiVersion": "networking.liqo.io/v1beta1", "kind": "Connection", "metadata": {"name": name, "namespace": ns,
                    "labels": {REMOTE_ID_LABEL: peer}}, "spec": {"type": type_, "gatewayRef": {"name": gateway, "namespace": ns}}});
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
        let gc = api(&m.client, &ns, "GatewayClient", "gatewayclients").list(&ListParams::default()).await?.items;
        let gs = api(&m.client, &ns, "GatewayServer", "gatewayservers").list(&ListParams::default()).await?.items;
        if gc.is_empty() && gs.is_empty() {
            let _ = api(&m.client, &ns, "Connection", "connections").delete(&name_of(&c), &DeleteParams::default()).await;
        }
    }
    Ok(())
}

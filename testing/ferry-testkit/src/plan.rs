//! `ferry dev --demo plan`: one plan across four workers (create a cluster registered with
//! OCM, peer member-1 with member-2 through Liqo, offload member-1's namespace `web` to
//! member-2, deploy an app into it), then a step fanned out over ManagedClusterSet `demo`
//! a cluster per wave whose second wave fails (a Secret that does not exist) and is put
//! back (`on_failure: revert-wave`); then the whole plan reverted, and every cluster of the
//! fleet checked to hold what it held before the plan.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use ferry_fleet::Fleet;
use ferry_runtime::{Client, EventType, ProgressEvent, SubmitOptions, TaskId, TaskKind};
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

use ferry_deploy::spec::{Component, DeployApp, EnvVar, SecretKeyRef};

/// The members the plan peers (consumer first) and fans out over (set `demo`).
pub const MEMBERS: [&str; 2] = ["member-1", "member-2"];
/// The namespace of member-1 the plan offloads to member-2 (and deploys into).
pub const OFFLOADED: &str = "web";
/// The hub namespace the apps are deployed from (bound to set `demo`).
pub const APPS: &str = "shop";

const WAIT: Duration = Duration::from_secs(900);

/// The plan's app: one web component on member-1, in the offloaded namespace.
fn shop() -> DeployApp {
    DeployApp {
        name: "shop".into(),
        namespace: Some(APPS.into()),
        owner: "team-demo".into(),
        components: vec![Component {
            name: "web".into(),
            image: "nginx:1.27".into(),
            replicas: Some(1),
            cpu: Some("100m".into()),
            memory: Some("64Mi".into()),
            cluster: Some(MEMBERS[0].into()),
            offloaded_namespace: Some(OFFLOADED.into()),
            ..Component::default()
        }],
        ready_timeout_seconds: Some(300),
        ..DeployApp::default()
    }
}

/// The fanned-out app: an agent per cluster of set `demo`; on member-2 it needs a Secret
/// nobody made, so the second wave fails at its check.
fn agent() -> (Value, Value) {
    let component = |secret: bool| Component {
        name: "agent".into(),
        image: "ghcr.io/ferry/agent:1".into(),
        cpu: Some("50m".into()),
        memory: Some("32Mi".into()),
        cluster: Some("${cluster}".into()),
        env: if secret { vec![EnvVar { name: "TOKEN".into(), value: None, secret: Some(SecretKeyRef { name: "agent-token".into(), key: "token".into() }) }] } else { vec![] },
        ..Component::default()
    };
    let app = DeployApp {
        name: "agent-${cluster}".into(),
        namespace: Some(APPS.into()),
        owner: "team-demo".into(),
        components: vec![component(false)],
        ready_timeout_seconds: Some(300),
        ..DeployApp::default()
    };
    let spec = serde_json::to_value(&app).expect("an app");
    (spec, json!({"components": [serde_json::to_value(component(true)).expect("a component")]}))
}

/// The plan: create → peer → offload → deploy, then the agent fanned out in waves.
pub fn plan() -> Value {
    let edge = crate::cluster::edge();
    let peer = ferry_peer::spec::PeerClusters { a: MEMBERS[0].into(), b: MEMBERS[1].into(), timeout_seconds: Some(300), ..Default::default() };
    let offload = ferry_offload::spec::OffloadCommand {
        cluster: MEMBERS[0].into(),
        namespace: OFFLOADED.into(),
        clusters: vec![MEMBERS[1].into()],
        timeout_seconds: Some(300),
        ..Default::default()
    };
    let (agent, on_member_2) = agent();
    json!({"steps": [
        {"name": "create", "kind": "create-cluster", "spec": serde_json::to_value(&edge).expect("a spec")},
        {"name": "peer", "kind": "peer", "spec": serde_json::to_value(&peer).expect("a spec")},
        {"name": "offload", "kind": "offload", "spec": serde_json::to_value(&offload).expect("a spec")},
        {"name": "deploy", "kind": "deploy", "spec": serde_json::to_value(shop()).expect("a spec")},
        {"name": "agents", "kind": "deploy", "spec": agent, "for_each": {
            "cluster_set": crate::deploy::SET,
            "waves": {"size": 1, "max_in_flight": 1},
            "on_failure": "revert-wave",
            "overrides": [{"clusters": [MEMBERS[1]], "spec": on_member_2}],
        }},
    ]})
}

/// The kinds an inventory lists on every cluster that serves them.
const KINDS: [(&str, &str, &str, &str); 9] = [
    ("", "v1", "Namespace", "namespaces"),
    ("apps", "v1", "Deployment", "deployments"),
    ("", "v1", "Node", "nodes"),
    ("cluster.open-cluster-management.io", "v1", "ManagedCluster", "managedclusters"),
    ("work.open-cluster-management.io", "v1", "ManifestWork", "manifestworks"),
    ("cluster.x-k8s.io", "v1beta2", "Cluster", "clusters"),
    ("core.liqo.io", "v1beta1", "ForeignCluster", "foreignclusters"),
    ("offloading.liqo.io", "v1beta1", "NamespaceOffloading", "namespaceoffloadings"),
    ("networking.liqo.io", "v1beta1", "Configuration", "configurations"),
];

/// One object of an inventory: where to watch it, and which one it is.
pub struct Held {
    api: Api<DynamicObject>,
    name: String,
    uid: Option<String>,
}

/// What every cluster of `fleet` holds of [`KINDS`], by `cluster kind ns/name` (objects
/// being deleted count as gone).
pub async fn inventory(fleet: &Fleet) -> anyhow::Result<BTreeMap<String, Held>> {
    let mut out = BTreeMap::new();
    for c in &fleet.clusters {
        let client = c.client().await?;
        for (group, version, kind, plural) in KINDS {
            let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
            let list = match Api::<DynamicObject>::all_with(client.clone(), &ar).list(&ListParams::default()).await {
                Ok(l) => l,
                Err(kube::Error::Api(e)) if e.code == 404 => continue,
                Err(e) => return Err(e).with_context(|| format!("listing {kind} on {}", c.name)),
            };
            for o in list.items.into_iter().filter(|o| o.metadata.deletion_timestamp.is_none()) {
                let name = o.metadata.name.unwrap_or_default();
                let ns = o.metadata.namespace;
                let key = format!("{} {kind} {}{name}", c.name, ns.as_ref().map(|n| format!("{n}/")).unwrap_or_default());
                let api = match &ns {
                    Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
                    None => Api::all_with(client.clone(), &ar),
                };
                out.insert(key, Held { api, name, uid: o.metadata.uid });
            }
        }
    }
    Ok(out)
}

/// Waits (until `deadline`, watching) for each object of `extra` to be deleted or marked
/// for deletion: what the clusters' own controllers finish after a revert.
async fn until_gone(extra: Vec<&Held>, deadline: tokio::time::Instant) {
    for h in extra {
        let uid = h.uid.clone();
        let gone = move |o: Option<&DynamicObject>| o.is_none_or(|o| o.metadata.uid != uid || o.metadata.deletion_timestamp.is_some());
        // A timeout or a watch error leaves the object to the inventory that follows.
        let _ = tokio::time::timeout_at(deadline, kube::runtime::wait::await_condition(h.api.clone(), &h.name, gone)).await;
    }
}

/// What `after` has that `before` had not (`+`) and the reverse (`-`).
fn diff(before: &BTreeMap<String, Held>, after: &BTreeMap<String, Held>) -> Vec<String> {
    let added = after.keys().filter(|k| !before.contains_key(*k)).map(|k| format!("+ {k}"));
    added.chain(before.keys().filter(|k| !after.contains_key(*k)).map(|k| format!("- {k}"))).collect()
}

/// Follows `id` to its final event, printing the plan's steps as they end.
async fn follow(events: &mut ferry_runtime::EventStream, id: TaskId, what: &str) -> anyhow::Result<Vec<ProgressEvent>> {
    let evs = events
        .until(id, WAIT, |e| {
            match e.event {
                EventType::StepSucceeded | EventType::StepFailed | EventType::StepReverted => {
                    println!("{what} step {:<8} {} {}", e.step_name.clone().unwrap_or_default(), e.event, e.message.clone().unwrap_or_default());
                }
                EventType::StepProgress if e.step_name.as_deref() == Some("agents") => {
                    println!("{what} agents   {}", e.message.clone().unwrap_or_default());
                }
                _ => {}
            }
            e.event.is_final()
        })
        .await?;
    Ok(evs)
}

/// Runs the demo on `fleet` (OCM, Cluster API, Liqo and offloading emulated, every worker
/// running); true when every check passed.
pub async fn run(client: &Client, fleet: &Fleet) -> anyhow::Result<bool> {
    let hub = fleet.hub().client().await?;
    crate::deploy::prepare(fleet, &MEMBERS, APPS).await?;
    crate::cluster::cluster_set(&hub, crate::cluster::SET).await?;
    let m1 = fleet.cluster(MEMBERS[0]).context("the demo needs member-1 and member-2 (--clusters 2 or more)")?;
    fleet.cluster(MEMBERS[1]).context("the demo needs member-1 and member-2 (--clusters 2 or more)")?;
    crate::offload::namespace(&m1.client().await?, OFFLOADED).await?;
    let before = inventory(fleet).await?;

    let mut ok = true;
    let mut events = client.events(false).await?;
    let plan: ferry_plan::spec::PlanSpec = serde_json::from_value(plan())?;
    let id = client.submit(TaskKind::PLAN, "demo/edge-rollout", &plan, SubmitOptions::default()).await?;
    println!("plan {id}: create edge-1, peer {} with {}, offload {}/{OFFLOADED}, deploy shop, then agents over set {} a cluster per wave", MEMBERS[0], MEMBERS[1], MEMBERS[0], crate::deploy::SET);
    let evs = follow(&mut events, id, "plan").await?;
    let last = evs.last().map(|e| e.event);
    let done: Vec<String> = evs.iter().filter(|e| e.event == EventType::StepSucceeded).filter_map(|e| e.step_name.clone()).collect();
    let failed = evs.iter().find(|e| e.event == EventType::StepFailed);
    let wave_two = failed.is_some_and(|e| e.step_name.as_deref() == Some("agents") && e.message.as_deref().unwrap_or("").contains(MEMBERS[1]));
    let good = last == Some(EventType::Failed) && done == ["create", "peer", "offload", "deploy", "agents.clusters"] && wave_two;
    ok &= good;
    println!("plan ended {}, steps done: {}; the agents' second wave failed and was put back: {}", ferry_runtime::report::ended(last), done.join(", "), if good { "ok" } else { "MISMATCH" });
    let kept = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(m1.client().await?, APPS).get_opt("agent").await?.is_some();
    ok &= kept;
    println!("plan: the first wave's agent stays on {}: {}", MEMBERS[0], if kept { "ok" } else { "MISMATCH" });

    client.revert(id).await?;
    let evs = follow(&mut events, id, "revert").await?;
    let last = evs.last().map(|e| e.event);
    ok &= last == Some(EventType::Reverted);
    println!("revert ended {}: {}", ferry_runtime::report::ended(last), if last == Some(EventType::Reverted) { "ok" } else { "MISMATCH" });
    // Deletions the revert started finish in the clusters' own controllers (work agents,
    // garbage collection): each object still there is watched until it goes, within a
    // bound; then the inventory is taken again.
    let after = inventory(fleet).await?;
    until_gone(after.iter().filter(|(k, _)| !before.contains_key(*k)).map(|(_, h)| h).collect(), tokio::time::Instant::now() + Duration::from_secs(120)).await;
    let changed = diff(&before, &inventory(fleet).await?);
    for c in &changed {
        println!("revert: left changed: {c}");
    }
    ok &= changed.is_empty();
    println!("revert: every cluster holds what it held before the plan: {}", if changed.is_empty() { "ok" } else { "MISMATCH" });
    println!("plan: {}", if ok { "four workers as one plan, a failed wave put back, the whole plan undone without a trace" } else { "FAILED" });
    Ok(ok)
}

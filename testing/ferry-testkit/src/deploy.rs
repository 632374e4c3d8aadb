//! `ferry dev --demo deploy`: a three-component app across two clusters through Kafka,
//! the deploy worker and OCM ManifestWorks; progress comes from status feedback; then the
//! app is deleted and every cluster is checked to hold nothing of it.

use std::time::Duration;

use anyhow::Context;
use ferry_fleet::Fleet;
use ferry_kube::kinds::ManifestWork;
use ferry_runtime::{Client, EventType, ProgressEvent, SubmitOptions, TaskId, TaskKind};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use ferry_deploy::steps::wait::ComponentStatus;
use ferry_deploy::spec::{Component, DeployApp, DeployOperation, EnvVar, IngressSpec, Port, SecretKeyRef};

/// The ManagedClusterSet the demo's clusters join.
pub const SET: &str = "demo";

/// Registers `clusters` with OCM in [`SET`] and binds the set to `namespace` on the hub.
pub async fn prepare(fleet: &Fleet, clusters: &[&str], namespace: &str) -> anyhow::Result<()> {
    fleet.publish_kubeconfigs().await?;
    let hub = fleet.hub().client().await?;
    crate::score::register(fleet, clusters, SET).await?;
    bind(&hub, namespace, SET).await
}

/// Creates `namespace` on the hub and binds ManagedClusterSet `set` to it (made as a set of
/// the clusters labelled with it when there is none).
pub async fn bind(hub: &kube::Client, namespace: &str, set: &str) -> anyhow::Result<()> {
    let pp = PatchParams::apply("ferry-demo").force();
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}});
    Api::<Namespace>::all(hub.clone()).patch(namespace, &pp, &Patch::Apply(&ns)).await?;
    let clusters = ferry_kube::Clusters::new(hub.clone());
    if ferry_kube::cluster_sets::get(hub, set).await?.is_none() {
        crate::cluster::cluster_set(hub, set).await?;
    }
    let binding = json!({"apiVersion": "cluster.open-cluster-management.io/v1beta2", "kind": "ManagedClusterSetBinding",
        "metadata": {"name": set, "namespace": namespace}, "spec": {"clusterSet": set}});
    clusters.apply(ferry_kube::HUB, &binding, "ferry-demo").await.with_context(|| format!("binding {set} to {namespace}"))?;
    Ok(())
}

/// Writes an Opaque Secret in `namespace` on the hub.
pub async fn secret(hub: &kube::Client, namespace: &str, name: &str, data: &[(&str, &str)]) -> anyhow::Result<()> {
    let data: serde_json::Map<String, serde_json::Value> = data.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect();
    // Marked by the operator: deploys may copy it to clusters.
    let s = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": namespace,
        "labels": {ferry_deploy::exportable::EXPORTABLE_LABEL: "true"}}, "stringData": data});
    Api::<Secret>::namespaced(hub.clone(), namespace).patch(name, &PatchParams::apply("ferry-demo").force(), &Patch::Apply(&s)).await?;
    Ok(())
}

/// The demo's app: web on member-1; api and cache on member-2.
pub fn shop() -> DeployApp {
    let port = |p| vec![Port { port: p, ..Port::default() }];
    DeployApp {
        name: "shop".into(),
        owner: "team-demo".into(),
        components: vec![
            Component {
                name: "web".into(),
                image: "nginx:1.27".into(),
                replicas: Some(2),
                cpu: Some("100m".into()),
                memory: Some("64Mi".into()),
                ports: port(80),
                ingress: Some(IngressSpec { host: "shop.example.com".into(), ..IngressSpec::default() }),
                cluster: Some("member-1".into()),
                ..Component::default()
            },
            Component {
                name: "api".into(),
                image: "ghcr.io/acme/shop-api:2.1".into(),
                replicas: Some(2),
                cpu: Some("250m".into()),
                memory: Some("256Mi".into()),
                ports: port(8080),
                env: vec![
                    EnvVar { name: "CACHE_URL".into(), value: Some("redis://cache:6379".into()), secret: None },
                    EnvVar { name: "DB_PASSWORD".into(), value: None, secret: Some(SecretKeyRef { name: "shop-db".into(), key: "password".into() }) },
                ],
                cluster: Some("member-2".into()),
                ..Component::default()
            },
            Component {
                name: "cache".into(),
                image: "redis:7".into(),
                ports: port(6379),
                cluster: Some("member-2".into()),
                ..Component::default()
            },
        ],
        ready_timeout_seconds: Some(120),
        ..DeployApp::default()
    }
}

/// Submits `app` and waits for its final event; returns the task and its events.
pub async fn submit(client: &Client, app: &DeployApp) -> anyhow::Result<(TaskId, Vec<ProgressEvent>)> {
    Ok(client.submit_and_wait(TaskKind::DEPLOY, &app.subject(), app, SubmitOptions::default(), Duration::from_secs(300)).await?)
}

/// The statuses the wait step recorded.
pub async fn statuses(client: &Client, id: TaskId) -> anyhow::Result<Vec<ComponentStatus>> {
    let snap = client.snapshot(id).await?.context("no snapshot of the task")?;
    Ok(ferry_deploy::outputs::WAIT.from_snapshot(&snap).context("the wait step left no output")?.components)
}

/// What of `app` is left on the hub and on `clusters` (ManifestWorks, Deployments).
pub async fn leftovers(fleet: &Fleet, app: &DeployApp, clusters: &[&str]) -> anyhow::Result<Vec<String>> {
    let hub = fleet.hub().client().await?;
    let mut left = Vec::new();
    let lp = ListParams::default().labels(&format!("{}={}", ferry_deploy::render::APP_LABEL, app.name));
    for w in Api::<ManifestWork>::all(hub.clone()).list(&lp).await?.items {
        left.push(format!("ManifestWork {}/{}", w.metadata.namespace.unwrap_or_default(), w.metadata.name.unwrap_or_default()));
    }
    for c in clusters {
        let client = fleet.cluster(c).with_context(|| format!("no cluster {c}"))?.client().await?;
        for d in Api::<Deployment>::all(client).list(&lp).await?.items {
            left.push(format!("Deployment {}/{} on {c}", d.metadata.namespace.unwrap_or_default(), d.metadata.name.unwrap_or_default()));
        }
    }
    Ok(left)
}

/// Runs the demo; true when every check passed.
pub async fn run(client: &Client, fleet: &Fleet) -> anyhow::Result<bool> {
    let app = shop();
    let clusters = ["member-1", "member-2"];
    prepare(fleet, &clusters, app.namespace()).await?;
    let hub = fleet.hub().client().await?;
    secret(&hub, app.namespace(), "shop-db", &[("password", "demo-only-password")]).await?;

    let (id, evs) = submit(client, &app).await?;
    let last = evs.last().map(|e| e.event);
    for e in evs.iter().filter(|e| e.event == EventType::StepProgress && e.step_name.as_deref() == Some(ferry_deploy::outputs::WAIT.step())) {
        println!("deploy progress {:>3}%  {}", e.percent.unwrap_or(0), e.message.clone().unwrap_or_default());
    }
    println!("deploy {id} ended {}", ferry_runtime::report::ended(last));
    if last != Some(EventType::Succeeded) {
        if let Some(e) = evs.iter().rev().find(|e| e.message.is_some()) {
            println!("deploy: {}", e.message.clone().unwrap_or_default());
        }
        return Ok(false);
    }
    let mut ok = true;
    let feedback_steps = evs.iter().filter(|e| e.event == EventType::StepProgress && e.step_name.as_deref() == Some(ferry_deploy::outputs::WAIT.step())).count();
    ok &= feedback_steps >= 1;
    println!("deploy progress events from ManifestWork feedback: {feedback_steps}");
    for s in statuses(client, id).await? {
        let want = app.components.iter().find(|c| c.name == s.component).map(|c| c.replicas()).unwrap_or(0);
        let good = s.ready == i64::from(want);
        ok &= good;
        println!("deploy component {:<6} on {}: {}/{} ready, address {}: {}", s.component, s.cluster, s.ready, want, s.address.as_deref().unwrap_or("none"), if good { "ok" } else { "MISMATCH" });
    }
    for c in &app.components {
        let cluster = c.cluster.as_deref().unwrap_or_default();
        let kc = fleet.cluster(cluster).with_context(|| format!("no cluster {cluster}"))?.client().await?;
        let d = Api::<Deployment>::namespaced(kc, app.namespace()).get_opt(&c.name).await?;
        let ready = d.and_then(|d| d.status?.ready_replicas).unwrap_or(0);
        let good = ready == c.replicas();
        ok &= good;
        println!("deploy Deployment {}/{} on {cluster}: {ready} ready: {}", app.namespace(), c.name, if good { "ok" } else { "MISMATCH" });
    }

    let delete = DeployApp { operation: DeployOperation::Delete, name: app.name.clone(), ..DeployApp::default() };
    let (id, evs) = submit(client, &delete).await?;
    let last = evs.last().map(|e| e.event);
    println!("delete {id} ended {}", ferry_runtime::report::ended(last));
    ok &= last == Some(EventType::Succeeded);
    let left = leftovers(fleet, &app, &clusters).await?;
    println!("delete: left behind {}: {}", crate::listing(&left), if left.is_empty() { "ok" } else { "MISMATCH" });
    ok &= left.is_empty();
    println!("deploy: {}", if ok { "every component became ready and the delete removed everything" } else { "FAILED" });
    Ok(ok)
}

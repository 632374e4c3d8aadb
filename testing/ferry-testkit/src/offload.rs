//! `ferry dev --demo peer-offload`: member-1 peers with member-2 through Liqo (peer
//! worker); namespace `demo-web` of member-1 is offloaded to member-2 (offload worker); a
//! pod pinned to the virtual node runs in member-2's twin namespace; then the namespace is
//! unoffloaded and the clusters unpeered, and both clusters checked to hold nothing of it.

use std::time::Duration;

use ferry_peer::spec::{PeerClusters, PeerOperation};
use ferry_runtime::report::print_outcome;
use ferry_runtime::{Client, SubmitOptions, TaskKind};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use ferry_offload::spec::{OffloadCommand, OffloadOperation};

/// The consumer, the provider and the namespace.
pub const CONSUMER: &str = "member-1";
/// The provider.
pub const PROVIDER: &str = "member-2";
/// The offloaded namespace.
pub const NAMESPACE: &str = "demo-web";

const WAIT: Duration = Duration::from_secs(300);

fn check(what: &str, ok: bool, detail: impl std::fmt::Display) -> bool {
    println!("{what}: {detail}: {}", if ok { "ok" } else { "MISMATCH" });
    ok
}

/// Polls `f` until it yields Some or `within` passes (the demo's own bounded wait).
async fn eventually<T, F, Fut>(within: Duration, mut f: F) -> anyhow::Result<Option<T>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(t) = f().await? {
            return Ok(Some(t));
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Creates (or keeps) namespace `name` on a cluster: what an offload acts on.
pub async fn namespace(cluster: &kube::Client, name: &str) -> anyhow::Result<()> {
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
    Api::<Namespace>::all(cluster.clone()).patch(name, &PatchParams::apply("ferry-demo"), &Patch::Apply(ns)).await?;
    Ok(())
}

/// Deployment `name` in namespace `ns` of a cluster: 2 replicas of 1.5 CPU and 256 MiB each
/// (the README's burst example scales `web/api` of member-1 to 8: `ferry dev`'s member-1,
/// two nodes of 4 CPUs, fits 4, the other 4 go to member-2 once the two are peered, and
/// both keep a CPU per node for the other examples).
pub async fn deployment(cluster: &kube::Client, ns: &str, name: &str) -> anyhow::Result<()> {
    let d = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": name, "image": "registry.k8s.io/pause:3.9",
                "resources": {"requests": {"cpu": "1500m", "memory": "256Mi"}}}]}}}});
    Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(cluster.clone(), ns).patch(name, &PatchParams::apply("ferry-demo"), &Patch::Apply(d)).await?;
    Ok(())
}

/// Waits until Deployment `ns/name` has every replica available (its pods bound and
/// running, so a score taken after counts their requests), at most `limit`.
pub async fn deployment_available(cluster: &kube::Client, ns: &str, name: &str, limit: std::time::Duration) -> anyhow::Result<()> {
    let api = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(cluster.clone(), ns);
    let available = |d: Option<&k8s_openapi::api::apps::v1::Deployment>| {
        d.is_some_and(|d| {
            let want = d.spec.replicas.unwrap_or(1);
            d.status.as_ref().and_then(|s| s.available_replicas).unwrap_or(0) >= want
        })
    };
    tokio::time::timeout(limit, kube::runtime::wait::await_condition(api, name, available))
        .await
        .map_err(|_| anyhow::anyhow!("Deployment {ns}/{name} was not available within {limit:?}"))??;
    Ok(())
}

/// Runs the demo: `consumer` and `provider` are the two clusters' clients; true when every
/// check passed.
pub async fn run(client: &Client, consumer: &kube::Client, provider: &kube::Client) -> anyhow::Result<bool> {
    let mut ok = true;
    let peer = PeerClusters { a: CONSUMER.into(), b: PROVIDER.into(), timeout_seconds: Some(120), ..PeerClusters::default() };
    let (id, evs) = client.submit_and_wait(TaskKind::PEER, &peer.subject(), &peer, SubmitOptions::default(), WAIT).await?;
    if !print_outcome("peer", id, &evs) {
        return Ok(false);
    }
    let vnode = ferry_peer::liqo::virtual_node_name(PROVIDER);
    let ready = Api::<Node>::all(consumer.clone()).get_opt(&vnode).await?.is_some_and(|n| ferry_kube::kinds::node_ready(&n));
    ok &= check("peer", ready, format!("virtual node {vnode} Ready on {CONSUMER}"));

    namespace(consumer, NAMESPACE).await?;
    let offload = OffloadCommand {
        cluster: CONSUMER.into(),
        namespace: NAMESPACE.into(),
        clusters: vec![PROVIDER.into()],
        timeout_seconds: Some(120),
        ..OffloadCommand::default()
    };
    let (id, evs) = client.submit_and_wait(TaskKind::OFFLOAD, &offload.subject(), &offload, SubmitOptions::default(), WAIT).await?;
    ok &= print_outcome("offload", id, &evs);
    let twin = format!("{NAMESPACE}-{CONSUMER}");
    ok &= check("offload", Api::<Namespace>::all(provider.clone()).get_opt(&twin).await?.is_some(), format!("twin namespace {twin} on {PROVIDER}"));

    // A pod pinned to the virtual node: it runs in the provider's twin namespace.
    let pod: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hello", "namespace": NAMESPACE},
        "spec": {"nodeSelector": {"liqo.io/type": "virtual-node"},
            "containers": [{"name": "hello", "image": "ghcr.io/ferry/hello:1", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}}))?;
    Api::<Pod>::namespaced(consumer.clone(), NAMESPACE).create(&PostParams::default(), &pod).await?;
    let running = |p: &Pod| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
    let remote = eventually(Duration::from_secs(120), || async {
        let local = Api::<Pod>::namespaced(consumer.clone(), NAMESPACE).get_opt("hello").await?;
        let remote = Api::<Pod>::namespaced(provider.clone(), &twin).list(&ListParams::default()).await?.items;
        let on_vnode = local.as_ref().and_then(|p| p.spec.as_ref()?.node_name.clone()).as_deref() == Some(vnode.as_str());
        Ok((on_vnode && local.as_ref().is_some_and(running) && remote.iter().any(running))
            .then(|| remote.iter().find(|p| running(p)).and_then(|p| p.spec.as_ref()?.node_name.clone()).unwrap_or_default()))
    })
    .await?;
    ok &= check("offload", remote.is_some(), format!("pod hello on {vnode} runs on {PROVIDER} (node {})", remote.unwrap_or_else(|| "-".into())));
    Api::<Pod>::namespaced(consumer.clone(), NAMESPACE).delete("hello", &Default::default()).await?;

    let unoffload = OffloadCommand { operation: OffloadOperation::Unoffload, clusters: vec![], ..offload.clone() };
    let (id, evs) = client.submit_and_wait(TaskKind::OFFLOAD, &unoffload.subject(), &unoffload, SubmitOptions::default(), WAIT).await?;
    ok &= print_outcome("unoffload", id, &evs);
    ok &= check("unoffload", Api::<Namespace>::all(provider.clone()).get_opt(&twin).await?.is_none(), format!("twin namespace {twin} gone"));

    let unpeer = PeerClusters { operation: PeerOperation::Unpeer, ..peer };
    let (id, evs) = client.submit_and_wait(TaskKind::PEER, &unpeer.subject(), &unpeer, SubmitOptions::default(), WAIT).await?;
    ok &= print_outcome("unpeer", id, &evs);
    let left = Api::<Node>::all(consumer.clone()).list(&ListParams::default().labels("liqo.io/type=virtual-node")).await?.items.len();
    ok &= check("unpeer", left == 0, format!("{left} virtual nodes left on {CONSUMER}"));
    println!("peer-offload: {}", if ok { "peered, offloaded, ran a pod remotely, unoffloaded, unpeered" } else { "FAILED" });
    Ok(ok)
}

//! `ferry dev --demo score`: three managed clusters under different loads are scored by
//! resource usage through Kafka and the score worker; the ranking, the AddOnPlacementScores
//! on the hub and the scores topic must all agree on the expected order.

use std::time::Duration;

use anyhow::Context;
use ferry_fleet::Fleet;
use ferry_kube::kinds::AddOnPlacementScore;
use ferry_runtime::{Client, EventType, SubmitOptions, TaskId, TaskKind};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use ferry_score::steps::{publish::placement_score_name, score::Ranked};
use ferry_score::spec::{ScoreClusters, ScorePolicy};

/// The clusters of the demo, each with the CPU (cores) and memory (GiB) its pods request,
/// in the order resource-usage must rank them.
pub const LOADS: [(&str, u32, u32); 3] = [("member-1", 0, 0), ("member-3", 2, 4), ("member-2", 5, 10)];

/// Registers `clusters` with OCM in ManagedClusterSet `set` through their klusterlets
/// ([`crate::ocm::join`]).
pub async fn register(fleet: &Fleet, clusters: &[&str], set: &str) -> anyhow::Result<()> {
    crate::ocm::join(fleet, clusters, set).await
}

/// Puts `cores` and `gib` worth of running pods on the first node of the cluster.
pub async fn load(client: &kube::Client, cores: u32, gib: u32) -> anyhow::Result<()> {
    if cores == 0 && gib == 0 {
        return Ok(());
    }
    let nodes = Api::<Node>::all(client.clone()).list(&ListParams::default()).await?;
    let node = nodes.items.first().and_then(|n| n.metadata.name.clone()).context("the cluster has no nodes")?;
    let pp = PatchParams::apply("ferry-demo").force();
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "load", "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "load", "image": "registry.k8s.io/pause:3.9",
            "resources": {"requests": {"cpu": cores.to_string(), "memory": format!("{gib}Gi")}}}]}});
    Api::<Pod>::namespaced(client.clone(), "default").patch("load", &pp, &Patch::Apply(&pod)).await?;
    Ok(())
}

/// Prepares the fleet: kubeconfig Secrets, OCM registration, loads.
pub async fn prepare(fleet: &Fleet) -> anyhow::Result<()> {
    fleet.publish_kubeconfigs().await?;
    let names: Vec<&str> = LOADS.iter().map(|(c, _, _)| *c).collect();
    register(fleet, &names, "demo").await?;
    for (c, cores, gib) in LOADS {
        let cluster = fleet.cluster(c).with_context(|| format!("the demo needs cluster {c} (ferry dev --clusters 3)"))?;
        load(&cluster.client().await?, cores, gib).await?;
    }
    Ok(())
}

/// Submits the scoring and checks every output; true when all agree with [`LOADS`].
pub async fn run(client: &Client, fleet: &Fleet) -> anyhow::Result<bool> {
    prepare(fleet).await?;
    let mut events = client.events(false).await?;
    let spec = ScoreClusters { cluster_set: Some("demo".into()), policy: ScorePolicy::ResourceUsage, ..ScoreClusters::default() };
    let id = client.submit(TaskKind::SCORE, "demo/score", &spec, SubmitOptions::default()).await?;
    let evs = events.until(id, Duration::from_secs(120), |e| e.event.is_final()).await?;
    let last = evs.last().map(|e| e.event);
    println!("score {id} ended {}", ferry_runtime::report::ended(last));
    if last != Some(EventType::Succeeded) {
        if let Some(e) = evs.iter().rev().find(|e| e.message.is_some()) {
            println!("score: {}", e.message.clone().unwrap_or_default());
        }
        return Ok(false);
    }
    let ranking = ranking(client, id).await?;
    for r in &ranking {
        println!("score rank {} {:<9} {:>4}  {}", r.rank, r.cluster, r.score, r.reason);
    }
    let want: Vec<&str> = LOADS.iter().map(|(c, _, _)| *c).collect();
    let got: Vec<&str> = ranking.iter().map(|r| r.cluster.as_str()).collect();
    let mut ok = got == want;
    println!("score ranking {}, expected {}: {}", crate::listing(&got), crate::listing(&want), if ok { "ok" } else { "MISMATCH" });

    let hub = fleet.hub().client().await?;
    for r in &ranking {
        let aps = Api::<AddOnPlacementScore>::namespaced(hub.clone(), &r.cluster).get_opt(&placement_score_name(ScorePolicy::ResourceUsage)).await?;
        let value = aps.as_ref().and_then(|a| a.status_at("/scores")?.as_array()?.iter().find(|s| s["name"] == "score")?.get("value")?.as_i64());
        let valid = aps.as_ref().and_then(|a| a.status_at("/validUntil")).is_some();
        let agree = value == Some(i64::from(r.score)) && valid;
        ok &= agree;
        println!("score AddOnPlacementScore {}/{} score={} validUntil set={valid}: {}", r.cluster, placement_score_name(ScorePolicy::ResourceUsage), value.map_or_else(|| "none".to_owned(), |v| v.to_string()), if agree { "ok" } else { "MISMATCH" });
    }
    let topic = ferry_score::scores::latest(client).await?;
    for r in &ranking {
        let rec = topic.get(&r.cluster);
        let agree = rec.is_some_and(|s| s.score == r.score && s.task_id == id.to_string() && s.rank == r.rank);
        ok &= agree;
        println!("score topic record {}: {}", r.cluster, if agree { "ok" } else { "MISMATCH" });
    }
    println!("score: {}", if ok { "every output agrees with the expected ranking" } else { "FAILED" });
    Ok(ok)
}

/// The ranking in a finished task's `score` step output.
pub async fn ranking(client: &Client, id: TaskId) -> anyhow::Result<Vec<Ranked>> {
    let snap = client.snapshot(id).await?.context("no snapshot of the task")?;
    Ok(ferry_score::outputs::SCORE.from_snapshot(&snap).context("the score step left no output")?.ranking)
}

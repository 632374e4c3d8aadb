//! The fault proxy in front of a real API server: clients through it see the injected
//! errors and latency, and a kube watcher survives a blackout window.

use std::time::{Duration, Instant};

use ferry_fleet::{FaultProxy, Fleet, FleetOptions};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(90);

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": {"probe": "yes"}}})).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_see_injected_faults_and_a_watcher_survives_a_blackout() {
    let fleet = Fleet::start(FleetOptions { clusters: vec!["edge".into()], controllers: false, ..FleetOptions::default() }).await.unwrap();
    let direct = fleet.hub().client().await.unwrap();
    let proxy = FaultProxy::start(direct.clone()).await.unwrap();
    let faults = proxy.handle();
    let through: Api<ConfigMap> = Api::namespaced(proxy.raw_client().unwrap(), "default");
    let direct_cms: Api<ConfigMap> = Api::namespaced(direct.clone(), "default");

    // Plain forwarding works.
    through.create(&PostParams::default(), &cm("a")).await.unwrap();
    assert!(direct_cms.get_opt("a").await.unwrap().is_some());

    // 500 then 429, as configured, then normal service.
    faults.fail_next(1, 500);
    let e = through.get("a").await.unwrap_err();
    assert!(matches!(e, kube::Error::Api(ref s) if s.code == 500), "{e:?}");
    faults.fail_next(1, 429);
    let e = through.get("a").await.unwrap_err();
    assert!(matches!(e, kube::Error::Api(ref s) if s.code == 429), "{e:?}");
    through.get("a").await.unwrap();
    // kube's default client retries a 429 by itself.
    let retrying: Api<ConfigMap> = Api::namespaced(proxy.client().unwrap(), "default");
    faults.fail_next(1, 429);
    retrying.get("a").await.unwrap();

    // Latency: a request takes at least the injected delay (a lower bound only).
    faults.set_latency(Duration::from_millis(300));
    let t0 = Instant::now();
    through.get("a").await.unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(300));
    faults.set_latency(Duration::ZERO);

    // A watcher through the proxy survives a blackout: an object created during the
    // blackout (directly) and one after it both arrive.
    let mut seen = watcher(through.clone(), watcher::Config::default().labels("probe=yes")).default_backoff().applied_objects().boxed();
    let first = tokio::time::timeout(WAIT, seen.next()).await.unwrap().unwrap().unwrap();
    assert_eq!(first.metadata.name.as_deref(), Some("a"));
    faults.blackout(Duration::from_secs(3));
    let e = through.get("a").await.unwrap_err();
    assert!(!matches!(e, kube::Error::Api(_)), "a reset, not an answer: {e:?}");
    direct_cms.create(&PostParams::default(), &cm("during")).await.unwrap();
    let mut names = std::collections::HashSet::new();
    tokio::time::timeout(WAIT, async {
        while let Some(ev) = seen.next().await {
            if let Ok(o) = ev {
                names.insert(o.metadata.name.unwrap_or_default());
                if names.contains("during") {
                    break;
                }
            }
        }
    })
    .await
    .expect("the object made during the blackout arrives after it");
    direct_cms.create(&PostParams::default(), &cm("after")).await.unwrap();
    tokio::time::timeout(WAIT, async {
        while let Some(ev) = seen.next().await {
            if ev.is_ok_and(|o| o.metadata.name.as_deref() == Some("after")) {
                break;
            }
        }
    })
    .await
    .expect("watching goes on after the blackout");
    let (requests, injected) = faults.counts();
    assert!(injected >= 3 && requests > injected, "{requests} requests, {injected} injected");
}

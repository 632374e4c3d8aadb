//! An emulated controller's loop wakes on its watched kinds' changes, not on a watch that
//! keeps failing: a kind not served yet (its CRD comes later) is retried on the watcher's
//! backoff, and each attempt opens with an `Init` event that carries nothing. Woken by
//! those, a loop watching such a kind passed several times a second doing nothing (the
//! emulated Submariner add-on, watching the operator's CRs on members before OLM
//! installs the operator, read the hub about 10 times a second while idle).

use std::time::Duration;

use ferry_fleet::wake::Wake;
use ferry_fleet::{Fleet, FleetOptions};
use kube::api::ApiResource;
use kube::core::GroupVersionKind;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kind_not_served_wakes_nobody_until_it_is() {
    let _ = tracing_subscriber::fmt().with_env_filter(std::env::var("RUST_LOG").unwrap_or("warn".into())).with_test_writer().try_init();
    let fleet = Fleet::start(FleetOptions { controllers: false, ..FleetOptions::hub_and(0) }).await.unwrap();
    let hub = fleet.hub().client().await.unwrap();
    let kind = ("example.ferry.dev", "v1", "Widget", "widgets", true, false);
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(kind.0, kind.1, kind.2), kind.3);
    // Nothing else wakes it: no fallback a test outlasts, nothing asked for.
    let mut wake = Wake::with_fallback(Duration::from_secs(3600));
    wake.watch(&hub, &ar);
    wake.next().await; // the first pass runs at once

    // The watch fails and is retried (about every 0.8 s: kube's `StreamBackoff` starts over
    // on the `Init` before each attempt, which ferry-kube's shared watches now drop first); before, every attempt woke the loop.
    let quiet = Duration::from_secs(5);
    assert!(tokio::time::timeout(quiet, wake.next()).await.is_err(), "the loop was woken within {quiet:?} while its only watched kind is not served");

    // The kind comes: the watch's list completes, and that is a change to look at.
    ferry_fleet::crds::install(&hub, vec![ferry_fleet::kinds::crd(&kind)]).await.unwrap();
    let deadline = Duration::from_secs(90);
    tokio::time::timeout(deadline, wake.next()).await.unwrap_or_else(|_| panic!("the loop is woken within {deadline:?} once its kind is served"));
}

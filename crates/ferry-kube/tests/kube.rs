//! `ferry-kube` against the test bed's real API servers: cluster clients from kubeconfig
//! Secrets, dynamic apply/get/delete, and shared watches with deadlines.

use std::sync::Arc;
use std::time::Duration;

use ferry_fleet::{Fleet, FleetOptions};
use ferry_kube::{Check, ClusterError, Clusters, WaitError, Watches};
use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::json;

async fn fleet() -> Option<Fleet> {
    if !ferry_fleet::binaries::Binaries::installed() {
        ferry_task::report::missing_prerequisite("the test bed is not installed (scripts/install-testbed.sh)");
        return None;
    }
    let fleet = Fleet::start(FleetOptions { controllers: false, ..FleetOptions::hub_and(1) }).await.expect("fleet starts");
    fleet.publish_kubeconfigs().await.expect("kubeconfig secrets");
    Some(fleet)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_apply_and_shared_waits() {
    let Some(fleet) = fleet().await else { return };
    let clusters = Arc::new(Clusters::new(fleet.hub().client().await.unwrap()));

    // A managed cluster is reached through its Secret on the hub; an unknown one is named.
    let member = clusters.client("member-1").await.expect("member-1 client");
    let v = member.apiserver_version().await.expect("member-1 answers");
    assert_eq!(v.major, "1");
    match clusters.client("nowhere").await {
        Err(e @ ClusterError::Unknown { .. }) => assert!(e.to_string().contains("nowhere-kubeconfig"), "{e}"),
        other => panic!("expected Unknown, got {:?}", other.err()),
    }
    assert_eq!(clusters.kubeconfig_secret("member-1").await.unwrap().1, "member-1-kubeconfig");

    // A planted kubeconfig whose user runs a command is refused before any use: the
    // command never runs.
    let marker = tempfile::tempdir().unwrap();
    let ran = marker.path().join("ran");
    let planted = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: '{}'}}\nusers:\n- name: u\n  user:\n    exec: {{apiVersion: client.authentication.k8s.io/v1, command: /bin/sh, args: [-c, 'touch {}'], interactiveMode: Never}}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n",
        fleet.cluster("member-1").unwrap().server,
        ran.display()
    );
    let secret = ferry_fleet::fleet::kubeconfig_secret("planted", &planted);
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> = kube::Api::namespaced(fleet.hub().client().await.unwrap(), "default");
    secrets.create(&Default::default(), &serde_json::from_value(secret).unwrap()).await.unwrap();
    match clusters.client("planted").await {
        Err(e @ ClusterError::BadKubeconfig { .. }) => assert!(e.to_string().contains("exec credential plugin"), "{e}"),
        other => panic!("a kubeconfig with exec was accepted: {:?}", other.err()),
    }
    assert!(!ran.exists(), "the planted command ran");

    // Apply is idempotent; delete of a missing object is success.
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "probe", "namespace": "default"}, "data": {"a": "1"}});
    clusters.apply("member-1", &cm, "ferry-test").await.unwrap();
    let again = clusters.apply("member-1", &cm, "ferry-test").await.unwrap();
    assert_eq!(again.data["data"]["a"], "1");
    assert!(clusters.get("member-1", &cm).await.unwrap().is_some());

    // 200 tasks wait on one object through one watch; a change releases all of them.
    let watches = Arc::new(Watches::new());
    let mut waiters = Vec::new();
    for _ in 0..200 {
        let (w, m) = (watches.clone(), member.clone());
        waiters.push(tokio::spawn(async move {
            w.wait_object::<ConfigMap, String>("member-1", &m, Some("default"), "probe", Duration::from_secs(60), |o| {
                match o.and_then(|c| c.data.as_ref()).and_then(|d| d.get("a")) {
                    Some(v) if v == "2" => Check::Done(v.clone()),
                    Some(v) => Check::Pending(format!("a = {v}")),
                    None => Check::Pending("absent".into()),
                }
            })
            .await
        }));
    }
    // Every waiter has seen the old value before the change (each either waits or is done).
    let seen = watches
        .wait_object::<ConfigMap, ()>("member-1", &member, Some("default"), "probe", Duration::from_secs(30), |o| match o {
            Some(_) => Check::Done(()),
            None => Check::Pending("absent".into()),
        })
        .await;
    assert_eq!(seen, Ok(()));
    clusters.apply("member-1", &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "probe", "namespace": "default"}, "data": {"a": "2"}}), "ferry-test").await.unwrap();
    for w in waiters {
        assert_eq!(w.await.unwrap(), Ok("2".to_owned()));
    }
    assert_eq!(watches.open_count(), 1, "one shared watch for every waiter");

    // A deadline ends a wait with the last reason it saw.
    let r = watches
        .wait_object::<ConfigMap, ()>("member-1", &member, Some("default"), "probe", Duration::from_millis(300), |o| {
            Check::Pending(format!("a = {}", o.and_then(|c| c.data.as_ref()).and_then(|d| d.get("a")).cloned().unwrap_or_default()))
        })
        .await;
    match r {
        Err(WaitError::Timeout { last, what, .. }) => {
            assert_eq!(last, "a = 2");
            assert_eq!(what, "ConfigMap default/probe");
        }
        other => panic!("expected a timeout, got {other:?}"),
    }

    // Failed ends at once; deletion is awaited through the same watch.
    let r = watches
        .wait_object::<ConfigMap, ()>("member-1", &member, Some("default"), "probe", Duration::from_secs(30), |_| Check::Failed("no hope".into()))
        .await;
    assert!(matches!(r, Err(WaitError::Failed { ref reason, .. }) if reason == "no hope"), "{r:?}");
    assert!(clusters.delete("member-1", &cm).await.unwrap());
    watches.wait_deleted::<ConfigMap>("member-1", &member, Some("default"), "probe", Duration::from_secs(30)).await.unwrap();
    assert!(!clusters.delete("member-1", &cm).await.unwrap(), "second delete finds nothing");
    assert_eq!(watches.open_count(), 1);

    // A kind the cluster does not serve is named.
    let bogus = json!({"apiVersion": "example.invalid/v1", "kind": "Nope", "metadata": {"name": "x"}});
    match clusters.apply("member-1", &bogus, "ferry-test").await {
        Err(e @ ClusterError::NotServed { .. }) => assert!(e.to_string().contains("Nope")),
        other => panic!("expected NotServed, got {other:?}"),
    }
}

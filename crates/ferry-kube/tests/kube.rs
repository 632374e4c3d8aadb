//! `ferry-kube` against the test bed's real API servers: cluster clients from kubeconfig
//! Secrets (only Cluster API's, only in the cluster namespaces), dynamic apply/get/delete,
//! and shared watches with deadlines.

use std::sync::Arc;
use std::time::Duration;

use ferry_fleet::fleet::KUBECONFIG_NAMESPACE;
use ferry_fleet::{Fleet, FleetOptions};
use ferry_kube::clusters::{DEFAULT_NAMESPACES, Rule};
use ferry_kube::{Check, ClusterError, Clusters, WaitError, Watches};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};

async fn fleet() -> Option<Fleet> {
    if !ferry_fleet::binaries::Binaries::installed() {
        ferry_task::report::missing_prerequisite("the test bed is not installed (scripts/install-testbed.sh)");
        return None;
    }
    let fleet = Fleet::start(FleetOptions { controllers: false, crds: true, ..FleetOptions::hub_and(1) }).await.expect("fleet starts");
    // The members' Secrets are owned by their control planes: Cluster API's kinds first.
    fleet.install_crds().await.expect("CRDs");
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
    assert_eq!(clusters.kubeconfig_secret("member-1").await.unwrap(), (KUBECONFIG_NAMESPACE.to_owned(), "member-1-kubeconfig".to_owned()));

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
    // Recheck looks again though nothing changes: without it this wait would time out.
    let mut looks = 0;
    let r = watches
        .wait_object::<ConfigMap, u32>("member-1", &member, Some("default"), "probe", Duration::from_secs(60), |_| {
            looks += 1;
            if looks < 3 { Check::Recheck(format!("look {looks}"), Duration::from_millis(20)) } else { Check::Done(looks) }
        })
        .await;
    assert_eq!(r, Ok(3));
    // ... and no later than the deadline, which names the last reason.
    let r = watches
        .wait_object::<ConfigMap, ()>("member-1", &member, Some("default"), "probe", Duration::from_millis(300), |_| {
            Check::Recheck("failing, tolerated a while".into(), Duration::from_secs(3600))
        })
        .await;
    assert!(matches!(r, Err(WaitError::Timeout { ref last, .. }) if last == "failing, tolerated a while"), "{r:?}");
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

/// A Cluster API `Cluster` named `name` in `ns` (inert: no controllers run), and the owner
/// reference Cluster API's core controller gives its kubeconfig Secret.
async fn capi_cluster(hub: &kube::Client, ns: &str, name: &str) -> Value {
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Cluster"));
    let c: DynamicObject = serde_json::from_value(json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "metadata": {"name": name}, "spec": {"paused": true}})).unwrap();
    let c = Api::<DynamicObject>::namespaced_with(hub.clone(), ns, &ar).create(&PostParams::default(), &c).await.unwrap();
    json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "name": name, "uid": c.metadata.uid.unwrap()})
}

/// Writes `secret` (JSON) as `<cluster>-kubeconfig` in `ns`.
async fn put(hub: &kube::Client, ns: &str, cluster: &str, secret: &Value) {
    let api: Api<Secret> = Api::namespaced(hub.clone(), ns);
    api.patch(&format!("{cluster}-kubeconfig"), &PatchParams::apply("ferry-test").force(), &Patch::Apply(secret)).await.unwrap();
}

/// The failures the namespace list and Cluster API's shape guard against: a kubeconfig
/// Secret planted outside the cluster namespaces is never looked at (not even to be
/// refused), and one inside them is used only as Cluster API makes it (its label, its type,
/// owned by its Cluster or controlled by its control plane); `self_contained` still holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_cluster_apis_kubeconfigs_in_cluster_namespaces_are_used() {
    let Some(fleet) = fleet().await else { return };
    assert!(DEFAULT_NAMESPACES.contains(&KUBECONFIG_NAMESPACE), "workers find the test bed's members without settings");
    let hub = fleet.hub().client().await.unwrap();
    let clusters = Clusters::with_namespaces(hub.clone(), [KUBECONFIG_NAMESPACE]);
    let member = fleet.cluster("member-1").unwrap();
    let good = member.kubeconfig_inline().unwrap();
    // The member's Secret is its control plane's, as the KubeadmControlPlane makes it.
    let s = Api::<Secret>::namespaced(hub.clone(), KUBECONFIG_NAMESPACE).get("member-1-kubeconfig").await.unwrap();
    let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!((owner.kind.as_str(), owner.controller), ("KubeadmControlPlane", Some(true)));
    assert_eq!(s.type_.as_deref(), Some("cluster.x-k8s.io/secret"));

    // Anyone who may write Secrets in another namespace (here `tenant-a`, which no worker
    // is told of) plants Cluster API-shaped kubeconfigs there:
    // one for a cluster Ferry knows (pointing elsewhere), one for a new name whose user
    // would run a command. Neither is looked at: member-1 is still the real one (not
    // ambiguous), the new name is unknown and the error says why; the command never runs.
    let marker = tempfile::tempdir().unwrap();
    let ran = marker.path().join("ran");
    let planted = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: '{}'}}\nusers:\n- name: u\n  user:\n    exec: {{apiVersion: client.authentication.k8s.io/v1, command: /bin/sh, args: [-c, 'touch {}'], interactiveMode: Never}}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n",
        member.server,
        ran.display()
    );
    let elsewhere = good.replace(&member.server, "https://127.0.0.1:1");
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tenant-a"}});
    Api::<k8s_openapi::api::core::v1::Namespace>::all(hub.clone()).patch("tenant-a", &PatchParams::apply("ferry-test"), &Patch::Apply(&ns)).await.unwrap();
    let owner = capi_cluster(&hub, "tenant-a", "member-1").await;
    put(&hub, "tenant-a", "member-1", &ferry_fleet::fleet::kubeconfig_secret_owned("member-1", &elsewhere, owner)).await;
    let owner = capi_cluster(&hub, "tenant-a", "ghost").await;
    put(&hub, "tenant-a", "ghost", &ferry_fleet::fleet::kubeconfig_secret_owned("ghost", &planted, owner)).await;
    assert_eq!(clusters.kubeconfig_secret("member-1").await.unwrap().0, KUBECONFIG_NAMESPACE);
    assert_eq!(clusters.client("member-1").await.unwrap().apiserver_version().await.unwrap().major, "1");
    match clusters.client("ghost").await {
        Err(e @ ClusterError::Unknown { .. }) => {
            let m = e.to_string();
            assert!(m.contains("ghost-kubeconfig") && m.contains(KUBECONFIG_NAMESPACE) && m.contains("other namespaces are not looked at"), "{m}");
        }
        other => panic!("a kubeconfig Secret outside the cluster namespaces was used: {:?}", other.err()),
    }
    // Only the namespace kept it out: where `tenant-a` is a cluster namespace it is found,
    // both member-1 Secrets make the name ambiguous, and the exec kubeconfig is still
    // refused before any use.
    let with_tenant = Clusters::with_namespaces(hub.clone(), [KUBECONFIG_NAMESPACE, "tenant-a"]);
    match with_tenant.client("ghost").await {
        Err(e @ ClusterError::BadKubeconfig { .. }) => assert!(e.to_string().contains("exec credential plugin"), "{e}"),
        other => panic!("a kubeconfig with exec was accepted: {:?}", other.err()),
    }
    assert!(matches!(with_tenant.client("member-1").await, Err(ClusterError::Ambiguous { .. })));
    assert!(!ran.exists(), "the planted command ran");

    // In the cluster namespace, a Secret Cluster API did not make is refused, naming the
    // rule (never the content): the wrong type (here Opaque, with the right owner)...
    let mut opaque = ferry_fleet::fleet::kubeconfig_secret_owned("opaque", &good, capi_cluster(&hub, KUBECONFIG_NAMESPACE, "opaque").await);
    opaque["type"] = json!("Opaque");
    put(&hub, KUBECONFIG_NAMESPACE, "opaque", &opaque).await;
    let refused = |r: Result<kube::Client, ClusterError>, want: Rule| match r {
        Err(e @ ClusterError::NotClusterApis { rule, .. }) if rule == want => {
            let m = e.to_string();
            assert!(m.contains(&format!("{KUBECONFIG_NAMESPACE}/")) && m.contains(&format!("{want} rule")), "{m}");
            assert!(!m.contains("certificate-authority-data") && !m.contains("token"), "the content shows: {m}");
        }
        other => panic!("expected the {want} rule, got {:?}", other.err()),
    };
    refused(clusters.client("opaque").await, Rule::Type);
    // ...no owner reference at all, or one to another cluster's Cluster...
    put(&hub, KUBECONFIG_NAMESPACE, "orphan", &ferry_fleet::fleet::kubeconfig_secret("orphan", &good)).await;
    refused(clusters.client("orphan").await, Rule::Owner);
    let someone_else = capi_cluster(&hub, KUBECONFIG_NAMESPACE, "someone-else").await;
    put(&hub, KUBECONFIG_NAMESPACE, "stray", &ferry_fleet::fleet::kubeconfig_secret_owned("stray", &good, someone_else)).await;
    refused(clusters.client("stray").await, Rule::Owner);
    refused(clusters.kubeconfig_secret("stray").await.map(|_| hub.clone()), Rule::Owner);
    // ...yet the names are taken in the cluster namespace.
    assert_eq!(clusters.kubeconfig_secret_namespaces("opaque").await.unwrap(), [KUBECONFIG_NAMESPACE]);
    assert!(clusters.kubeconfig_secret_namespaces("ghost").await.unwrap().is_empty());
    // Once the orphan is owned as Cluster API owns it, it is used.
    let owner = capi_cluster(&hub, KUBECONFIG_NAMESPACE, "orphan").await;
    put(&hub, KUBECONFIG_NAMESPACE, "orphan", &ferry_fleet::fleet::kubeconfig_secret_owned("orphan", &good, owner)).await;
    let orphan = clusters.client("orphan").await.expect("a Cluster-owned kubeconfig Secret is used");
    assert_eq!(orphan.apiserver_version().await.unwrap().major, "1");

    // `hub` stays the hub: a `hub-kubeconfig` Secret, even Cluster API-shaped, names no cluster.
    let owner = capi_cluster(&hub, KUBECONFIG_NAMESPACE, "hub").await;
    put(&hub, KUBECONFIG_NAMESPACE, "hub", &ferry_fleet::fleet::kubeconfig_secret_owned("hub", &elsewhere, owner)).await;
    assert!(matches!(clusters.kubeconfig_secret("hub").await, Err(ClusterError::Unknown { .. })));
    assert!(clusters.client("hub").await.unwrap().apiserver_version().await.is_ok(), "the hub's own client");
}

/// A TCP relay to `upstream` that can hold back what the server sends (a watch that lags).
struct Relay {
    port: u16,
    hold: tokio::sync::watch::Sender<bool>,
}

impl Relay {
    async fn to(upstream: std::net::SocketAddr) -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (hold, held) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = tokio::net::TcpStream::connect(upstream).await.unwrap();
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                tokio::spawn(async move { tokio::io::copy(&mut cr, &mut sw).await });
                let mut held = held.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n @ 1..) = sr.read(&mut buf).await {
                        if held.wait_for(|h| !h).await.is_err() || cw.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Self { port, hold }
    }

    fn hold(&self, on: bool) {
        self.hold.send_replace(on);
    }
}

/// A watch that lags the API server (its connection held back, as a slow or congested
/// link would) still holds an object that was deleted and re-created: a wait must not end
/// on it, only on what the API server has now, once the watch catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_does_not_end_on_what_a_lagging_watch_shows() {
    use kube::config::{KubeConfigOptions, Kubeconfig};
    let Some(fleet) = fleet().await else { return };
    let hub = fleet.hub();
    let direct = hub.client().await.unwrap();
    let addr: std::net::SocketAddr = hub.server.trim_start_matches("https://").parse().expect("https://127.0.0.1:PORT");
    let relay = Relay::to(addr).await;
    let mut kc = Kubeconfig::read_from(&hub.kubeconfig).unwrap();
    for c in &mut kc.clusters {
        c.cluster.as_mut().unwrap().server = Some(format!("https://127.0.0.1:{}", relay.port));
    }
    let relayed = kube::Client::try_from(kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await.unwrap()).unwrap();

    let cms: Api<ConfigMap> = Api::namespaced(direct.clone(), "default");
    let cm = |v: &str| serde_json::from_value::<ConfigMap>(json!({"metadata": {"name": "lag"}, "data": {"v": v}})).unwrap();
    cms.create(&PostParams::default(), &cm("old")).await.unwrap();
    let value = |o: Option<&ConfigMap>| match o.and_then(|c| c.data.as_ref()).and_then(|d| d.get("v")) {
        Some(v) => Check::Done(v.clone()),
        None => Check::Pending("absent".into()),
    };
    // The shared watch opens through the relay and sees "old".
    let watches = Watches::new();
    let seen = watches.wait_object::<ConfigMap, String>("hub", &relayed, Some("default"), "lag", Duration::from_secs(60), value).await;
    assert_eq!(seen, Ok("old".to_owned()));

    // The watch falls behind; meanwhile "lag" is deleted and made again with "new".
    relay.hold(true);
    cms.delete("lag", &kube::api::DeleteParams::default()).await.unwrap();
    cms.create(&PostParams::default(), &cm("new")).await.unwrap();

    // A wait now (the same shared watch) sees "old" in its cache: it must not end on it.
    let wait = watches.wait_object::<ConfigMap, String>("hub", &direct, Some("default"), "lag", Duration::from_secs(60), value);
    futures::pin_mut!(wait);
    if let std::task::Poll::Ready(r) = futures::poll!(wait.as_mut()) {
        panic!("the wait ended on the lagging watch's object: {r:?}");
    }
    relay.hold(false);
    assert_eq!(wait.await, Ok("new".to_owned()), "the wait ends on the API server's object, once the watch has caught up");
    assert_eq!(watches.open_count(), 1, "one shared watch");
}

/// A namespace a ManifestWork would carry is read on its cluster before the work is made
/// (orphaned if it was there already); a read that fails for a moment is tried again, and
/// one that keeps failing is an error, never a guess. Taking the first 500 for "there",
/// and later a cluster that stayed unreadable for "everything there", orphaned a namespace
/// the work agent then made, which the app's revert left behind (the fault campaign's
/// leftover check, twice in CI).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_read_that_fails_for_a_moment_is_tried_again_before_it_is_orphaned() {
    let Some(fleet) = fleet().await else { return };
    let hub = fleet.hub().client().await.unwrap();
    let member = fleet.cluster("member-1").unwrap();
    let proxy = ferry_fleet::FaultProxy::start(member.client().await.unwrap()).await.unwrap();
    let owner = capi_cluster(&hub, KUBECONFIG_NAMESPACE, "faulty").await;
    put(&hub, KUBECONFIG_NAMESPACE, "faulty", &ferry_fleet::fleet::kubeconfig_secret_owned("faulty", &proxy.kubeconfig("faulty"), owner)).await;
    let clusters = Clusters::with_namespaces(hub.clone(), [KUBECONFIG_NAMESPACE]);
    let manifests = [json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "made-by-the-work"}})];
    let found = || ferry_kube::orphans::found_namespaces(&clusters, "faulty", &manifests, |_| false);
    let none = std::collections::BTreeSet::new();
    assert_eq!(found().await.unwrap(), none, "a namespace that is not there is not orphaned");
    proxy.handle().fail_next(3, 500);
    assert_eq!(found().await.unwrap(), none, "three 500s in a row made a namespace that is not there count as found");
    // A cluster that stays unreadable: an error its step retries, not a set of names.
    proxy.handle().fail_next(100, 500);
    match found().await {
        Err(e) => assert!(e.is_transient(), "a cluster answering 500 is a transient error: {e}"),
        Ok(f) => panic!("an unreadable cluster gave a guess: {f:?}"),
    }
    // A cluster whose kubeconfig Secret is not found: an error too, not "every namespace there".
    let broken = Clusters::with_namespaces(hub.clone(), ["no-such-namespace-here"]);
    assert!(ferry_kube::orphans::found_namespaces(&broken, "faulty", &manifests, |_| false).await.is_err(), "an unknown cluster gave a guess");
}

/// A wait on a kind its cluster does not serve (the CRD not installed: a ManifestWork asked
/// of a cluster without OCM) backs off as client-go's reflector does, 0.8 s doubling to 30 s,
/// and ends at its deadline. Before, kube's stream backoff started over at the `Init`
/// event the watcher yields before each list attempt, so the shared watch listed the
/// missing kind every 0.8 s for as long as anyone waited (about 12 to 19 lists in 15 s,
/// where the backoff allows at most 5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_on_a_kind_not_served_backs_off_and_ends_at_its_deadline() {
    if !ferry_fleet::binaries::Binaries::installed() {
        ferry_task::report::missing_prerequisite("the test bed is not installed (scripts/install-testbed.sh)");
        return;
    }
    // No CRDs: ManifestWork is not served.
    let fleet = Fleet::start(FleetOptions { controllers: false, ..FleetOptions::hub_and(0) }).await.expect("fleet starts");
    let proxy = ferry_fleet::FaultProxy::start(fleet.hub().client().await.unwrap()).await.unwrap();
    let through = proxy.client().unwrap();
    let watches = Watches::new();
    let waited = Duration::from_secs(15);
    let before = proxy.handle().counts().0;
    let r = watches.wait_object::<ferry_kube::kinds::ManifestWork, ()>("hub", &through, Some("default"), "w", waited, |_| Check::Pending("absent".into())).await;
    let lists = proxy.handle().counts().0 - before;
    assert!(matches!(r, Err(WaitError::Timeout { .. })), "{r:?}");
    assert!(lists <= 7, "{lists} requests in {waited:?} for a kind the cluster does not serve: the watch's backoff does not grow");
}

/// A wait on one object whose watch keeps failing reads the object from the API server
/// itself. A cluster that went away and came back leaves its watches failing for their
/// backoff (up to 30 s) and then expired ("too old resource version"), their stores
/// stale; a peer's unpeer after its provider came back waited out its removal bound on
/// such a store. Here the watch fails for good: its user may list ConfigMaps but not
/// watch them. Before, the wait never saw the deletion and timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_whose_watch_fails_reads_the_object_itself() {
    use kube::config::{KubeConfigOptions, Kubeconfig};
    let Some(fleet) = fleet().await else { return };
    let hub = fleet.hub();
    let admin = hub.client().await.unwrap();
    let pp = PatchParams::apply("ferry-test");
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "list-only", "namespace": "default"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}]});
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "list-only", "namespace": "default"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "list-only"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "lister"}]});
    Api::<k8s_openapi::api::rbac::v1::Role>::namespaced(admin.clone(), "default").patch("list-only", &pp, &Patch::Apply(&role)).await.unwrap();
    Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(admin.clone(), "default").patch("list-only", &pp, &Patch::Apply(&binding)).await.unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(Kubeconfig::read_from(&hub.kubeconfig).unwrap(), &KubeConfigOptions::default()).await.unwrap();
    config.auth_info.impersonate = Some("lister".to_owned());
    let lister = kube::Client::try_from(config).unwrap();

    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "default");
    cms.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "going"}})).unwrap()).await.unwrap();
    let watches = Watches::new();
    let there = |o: Option<&ConfigMap>| if o.is_some() { Check::Done(()) } else { Check::Pending("absent".into()) };
    // The shared watch lists (its store holds "going"), then fails to watch.
    assert_eq!(watches.wait_object::<ConfigMap, ()>("hub", &lister, Some("default"), "going", Duration::from_secs(60), there).await, Ok(()));
    cms.delete("going", &kube::api::DeleteParams::default()).await.unwrap();
    let r = watches.wait_deleted::<ConfigMap>("hub", &lister, Some("default"), "going", Duration::from_secs(60)).await;
    assert_eq!(r, Ok(()), "the wait trusted its failing watch's stale store");
    // A condition over the whole store: the wait lists the namespace itself.
    let none_left = |s: &kube::runtime::reflector::Store<ConfigMap>| {
        if s.state().iter().any(|c| c.metadata.name.as_deref() == Some("going")) { Check::Pending("going is left".into()) } else { Check::Done(()) }
    };
    let r = watches.wait_store::<ConfigMap, ()>("hub", &lister, Some("default"), "no ConfigMap going", Duration::from_secs(60), none_left).await;
    assert_eq!(r, Ok(()), "the store wait trusted its failing watch's stale store");
    // Nor does a wait end on what only the stale store still shows: "going" is gone.
    let still_there = |s: &kube::runtime::reflector::Store<ConfigMap>| {
        if s.state().iter().any(|c| c.metadata.name.as_deref() == Some("going")) { Check::Done(()) } else { Check::Pending("going is gone".into()) }
    };
    let r = watches.wait_store::<ConfigMap, ()>("hub", &lister, Some("default"), "ConfigMap going", Duration::from_secs(8), still_there).await;
    match r {
        Err(WaitError::Timeout { last, .. }) => assert!(last.contains("going is gone") && last.contains("read from the API server"), "{last}"),
        other => panic!("the wait ended on its failing watch's stale store: {other:?}"),
    }

    // Many waiters on one failing watch share its reads: one LIST per interval reaches
    // the cluster, not one per waiter (a cluster that has just come back is not stormed).
    let proxy = ferry_fleet::FaultProxy::start(admin.clone()).await.unwrap();
    let mut through = kube::Config::new(proxy.url().parse().unwrap());
    through.auth_info.impersonate = Some("lister".to_owned());
    let through = kube::Client::try_from(through).unwrap();
    let waiters = 40;
    for i in 0..waiters {
        cms.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": format!("held-{i}")}})).unwrap()).await.unwrap();
    }
    let watches = Watches::new();
    let before = proxy.handle().counts().0;
    let waited = Duration::from_secs(12);
    let waits = (0..waiters).map(|i| {
        let (watches, through) = (&watches, through.clone());
        async move { watches.wait_deleted::<ConfigMap>("hub", &through, Some("default"), &format!("held-{i}"), waited).await }
    });
    let ends = futures::future::join_all(waits).await;
    let requests = proxy.handle().counts().0 - before;
    assert!(ends.iter().all(|r| matches!(r, Err(WaitError::Timeout { last, .. }) if last.contains("read from the API server"))), "{:?}", ends.first());
    assert!(requests <= 20, "{requests} requests in {waited:?} from {waiters} waiters on one failing watch: its reads are not shared");
}

/// `ferry_cluster_watches_failing{cluster}` ([`Watches::gauges`]): 0 for a cluster whose
/// watches answer; for one whose watch fails, 1 while a wait uses it and 0 once none does
/// (a cluster deleted by another worker holds no task). The failing one is the hub under
/// another name, "dark", whose watch was made through a proxy that has gone dark: a waiter
/// with a working client ends only by reading around it, so only once it is failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clusters_failing_watches_are_counted_for_the_metrics() {
    let Some(fleet) = fleet().await else { return };
    let admin = fleet.hub().client().await.unwrap();
    let proxy = ferry_fleet::FaultProxy::start(admin.clone()).await.unwrap();
    let dark = proxy.client().unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "default");
    cms.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "gauged"}})).unwrap()).await.unwrap();
    let watches = Watches::new();
    let samples = |w: &Watches| {
        let families = w.gauges();
        assert_eq!(families.len(), 1);
        assert_eq!(families[0].name, ferry_kube::watches::WATCHES_FAILING);
        families[0].samples.iter().map(|(labels, n)| (labels[0].1.clone(), *n)).collect::<Vec<_>>()
    };
    assert_eq!(samples(&watches), vec![], "no watch, no cluster");
    let there = |o: Option<&ConfigMap>| if o.is_some() { Check::Done(()) } else { Check::Pending("absent".into()) };
    assert_eq!(watches.wait_object::<ConfigMap, ()>("hub", &admin, Some("default"), "gauged", Duration::from_secs(60), there).await, Ok(()));
    assert_eq!(samples(&watches), vec![("hub".to_owned(), 0)]);

    proxy.handle().blackout(Duration::from_secs(3600));
    // The first waiter on "dark" makes its watch, through the dark proxy: it never lists.
    let mut first = Box::pin(watches.wait_object::<ConfigMap, ()>("dark", &dark, Some("default"), "gauged", Duration::from_secs(60), there));
    assert!(futures::poll!(first.as_mut()).is_pending());
    assert_eq!(watches.wait_object::<ConfigMap, ()>("dark", &admin, Some("default"), "gauged", Duration::from_secs(60), there).await, Ok(()));
    assert_eq!(samples(&watches), vec![("dark".to_owned(), 1), ("hub".to_owned(), 0)], "the failing watch a wait uses is not counted");
    assert_eq!(watches.failing("dark"), 1);
    drop(first);
    assert_eq!(samples(&watches), vec![("dark".to_owned(), 0), ("hub".to_owned(), 0)], "a failing watch nobody waits on is counted");
}

/// A failing watch that no wait holds is closed by the next wait on any watch, once it has
/// failed for [`ferry_kube::watches::CLOSE_UNUSED_AFTER`] (zero here); a failing watch a
/// wait holds, and a healthy one nobody waits on, stay. Before, the watches of a cluster
/// another worker had deleted retried every 30 s for the process's life. "dark" is the hub
/// under another name, its watch made through a proxy gone dark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_watch_nobody_waits_on_is_closed() {
    let Some(fleet) = fleet().await else { return };
    let admin = fleet.hub().client().await.unwrap();
    let proxy = ferry_fleet::FaultProxy::start(admin.clone()).await.unwrap();
    let dark = proxy.client().unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "default");
    cms.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "unused"}})).unwrap()).await.unwrap();
    let watches = Watches::closing_unused_after(Duration::ZERO);
    let there = |o: Option<&ConfigMap>| if o.is_some() { Check::Done(()) } else { Check::Pending("absent".into()) };

    proxy.handle().blackout(Duration::from_secs(3600));
    let mut first = Box::pin(watches.wait_object::<ConfigMap, ()>("dark", &dark, Some("default"), "unused", Duration::from_secs(60), there));
    // `first` makes the watch. Once it has failed, the proxy stops resetting and holds
    // every request instead, and `first` is driven until its read of the scope (with its
    // dark client) reaches the proxy, where it hangs; `first` is then never polled again,
    // as a waiter that stalls. Before, that read held a lock every other waiter's read
    // queued on: the wait below timed out after 60 s (CI of stop 65, where the watch had
    // failed before `first`'s only poll ended and its reset read was never driven on).
    assert!(futures::poll!(first.as_mut()).is_pending());
    tokio::time::timeout(Duration::from_secs(60), async {
        while watches.failing("dark") == 0 {
            tokio::task::yield_now().await;
        }
        proxy.handle().clear();
        proxy.handle().set_latency(Duration::from_secs(3600));
        let before = proxy.handle().counts().0;
        while proxy.handle().counts().0 == before {
            assert!(futures::poll!(first.as_mut()).is_pending());
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the dark watch fails, and the first waiter reads through the proxy, within 60 s");
    // Ends only by reading around the dark watch (with its own client): it has failed.
    assert_eq!(watches.wait_object::<ConfigMap, ()>("dark", &admin, Some("default"), "unused", Duration::from_secs(60), there).await, Ok(()));
    assert_eq!(watches.failing("dark"), 1);
    assert_eq!(watches.wait_object::<ConfigMap, ()>("hub", &admin, Some("default"), "unused", Duration::from_secs(60), there).await, Ok(()));
    assert_eq!(watches.open_count(), 2, "a failing watch a wait holds was closed under it");

    drop(first);
    assert_eq!(watches.wait_object::<ConfigMap, ()>("hub", &admin, Some("default"), "unused", Duration::from_secs(60), there).await, Ok(()));
    assert_eq!(watches.failing("dark"), 0, "the failing watch nobody waits on is still open");
    assert_eq!(watches.open_count(), 1, "the hub's healthy watch, unused between waits, was closed");
}

/// A watch that keeps failing is made again, with the next waiter's client, once it has
/// failed for [`ferry_kube::watches::REPLACE_AFTER`] (zero here). kube's watcher keeps the
/// client it was made with: a cluster made again under its name (another address or CA)
/// left the old watch failing for good, its store stale, every wait reading around it.
/// Here the first client reaches the hub through a proxy that then blacks out for good
/// (the old address gone); the waiters come with a direct client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_failing_for_long_is_made_again_with_the_waiters_client() {
    let Some(fleet) = fleet().await else { return };
    let admin = fleet.hub().client().await.unwrap();
    let proxy = ferry_fleet::FaultProxy::start(admin.clone()).await.unwrap();
    let old = proxy.client().unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "default");
    for name in ["moved", "kept"] {
        cms.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()).await.unwrap();
    }
    let watches = Watches::replacing_after(Duration::ZERO);
    let there = |o: Option<&ConfigMap>| if o.is_some() { Check::Done(()) } else { Check::Pending("absent".into()) };
    assert_eq!(watches.wait_object::<ConfigMap, ()>("hub", &old, Some("default"), "moved", Duration::from_secs(60), there).await, Ok(()));

    // The old address is gone; "moved" is deleted meanwhile. The wait, with the new
    // client, sees the deletion: by reading around the failing watch, or through a new
    // watch when the old one had failed already as it began. Either way the old one has
    // failed by the time it ends (its stream was cut).
    proxy.handle().blackout(Duration::from_secs(3600));
    cms.delete("moved", &kube::api::DeleteParams::default()).await.unwrap();
    assert_eq!(watches.wait_deleted::<ConfigMap>("hub", &admin, Some("default"), "moved", Duration::from_secs(60)).await, Ok(()));

    // The next wait starts a failing watch afresh with its client: it lists, and follows.
    assert_eq!(watches.wait_object::<ConfigMap, ()>("hub", &admin, Some("default"), "kept", Duration::from_secs(60), there).await, Ok(()));
    assert_eq!(watches.failing("hub"), 0, "the failing watch was kept, with the client of a gone address");
    assert_eq!(watches.open_count(), 1);
}

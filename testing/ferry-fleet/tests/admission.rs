//! The test bed's admission webhooks refuse what a real OCM hub refuses: accepting a
//! ManagedCluster or putting it into a ManagedClusterSet without the subresource
//! permissions, a bad cluster name or client URL, a binding named unlike its set or made
//! without `bind`; and allow the same writes once the identity holds those permissions.
//! Identities are impersonated users, so RBAC and the webhooks see them as a worker's
//! service account.

use std::time::Duration;

use ferry_fleet::admission::AdmissionServer;
use ferry_fleet::{Fleet, FleetOptions};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

fn api(client: &kube::Client, group: &str, version: &str, kind: &str, ns: Option<&str>) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

fn obj(v: Value) -> DynamicObject {
    serde_json::from_value(v).unwrap()
}

/// A ManagedCluster as the create-cluster worker registers one: accepted, in a set.
fn managed_cluster(name: &str, set: Option<&str>, accept: bool) -> DynamicObject {
    let mut v = json!({"apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster",
        "metadata": {"name": name}, "spec": {"hubAcceptsClient": accept}});
    if let Some(set) = set {
        v["metadata"]["labels"] = json!({ferry_kube::vocab::ocm::CLUSTERSET_LABEL: set});
    }
    obj(v)
}

/// Grants `user` the cluster-scoped `rules` (a ClusterRole and its binding, by the admin).
async fn grant(admin: &kube::Client, user: &str, rules: Value) {
    let name = format!("test-{}", user.replace(':', "-"));
    let pp = PatchParams::apply("test").force();
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name}, "rules": rules});
    api(admin, "rbac.authorization.k8s.io", "v1", "ClusterRole", None).patch(&name, &pp, &Patch::Apply(&role)).await.unwrap();
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]});
    api(admin, "rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", None).patch(&name, &pp, &Patch::Apply(&binding)).await.unwrap();
}

/// The message of a refused write; panics when it was not refused.
fn refused<T: std::fmt::Debug>(r: Result<T, kube::Error>, what: &str) -> String {
    match r {
        Err(kube::Error::Api(e)) => e.message,
        other => panic!("{what}: expected the API server to refuse it, got {other:?}"),
    }
}

/// RBAC is eventually consistent for a moment after a write (the authorizer's cache):
/// retries `f` until it succeeds, within a bound, and returns the last error otherwise.
async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) if std::time::Instant::now() < deadline => {
                tracing::debug!(error = %e, "{what}: not yet");
                // A poll while the authorizer's cache catches up; no event to wait on.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

/// The upstream CRDs' folder, when the test bed and ../shared/crds are there (in CI their
/// absence fails the test).
fn prerequisites() -> Option<std::path::PathBuf> {
    if !ferry_fleet::binaries::Binaries::installed() {
        ferry_runtime::report::missing_prerequisite("the test bed is not installed (scripts/install-testbed.sh)");
        return None;
    }
    let shared = ferry_fleet::crds::shared_dir();
    if shared.is_none() {
        ferry_runtime::report::missing_prerequisite("../shared/crds (the upstream CRDs) is missing");
    }
    shared
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ocm_webhooks_refuse_accept_join_and_bind_without_their_permissions() {
    let Some(shared) = prerequisites() else { return };
    let fleet = Fleet::start(FleetOptions::hub_and(0)).await.unwrap();
    let admin = fleet.hub().client().await.unwrap();
    ferry_fleet::crds::install_dir(&admin, &shared.join("open-cluster-management")).await.unwrap();
    let server = ferry_fleet::webhooks_ocm::serve(&admin).await.unwrap();
    let worker = "system:serviceaccount:ferry:ferry-create-cluster";
    let as_worker = fleet.hub().client_as(worker, &["system:serviceaccounts"]).await.unwrap();
    let clusters = api(&as_worker, "cluster.open-cluster-management.io", "v1", "ManagedCluster", None);
    let pp = PostParams::default();

    // What the chart granted the create-cluster worker before: ManagedClusters, not the
    // accept and join subresources.
    grant(&admin, worker, json!([
        {"apiGroups": ["cluster.open-cluster-management.io"], "resources": ["managedclusters"], "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
        {"apiGroups": ["cluster.open-cluster-management.io"], "resources": ["managedclustersets"], "verbs": ["get", "list", "watch"]},
    ]))
    .await;
    // A cluster without a set is put into `default` by the mutating webhook before the
    // validating one looks: creating any ManagedCluster needs `join` on `default`.
    // Once RBAC shows the grant (a list passes), the refusal is the webhook's.
    let lp = kube::api::ListParams::default();
    eventually("RBAC granting the worker ManagedClusters", || clusters.list(&lp)).await;
    let plain = managed_cluster("plain", None, false);
    let msg = refused(clusters.create(&pp, &plain).await, "creating a ManagedCluster without join on default");
    assert!(msg.contains("cannot add/remove a ManagedCluster to/from ManagedClusterSet \"default\""), "{msg}");
    let admin_clusters = api(&admin, "cluster.open-cluster-management.io", "v1", "ManagedCluster", None);
    let made = admin_clusters.create(&pp, &plain).await.unwrap();
    assert_eq!(made.metadata.labels.unwrap_or_default().get(ferry_kube::vocab::ocm::CLUSTERSET_LABEL).map(String::as_str), Some("default"));
    let msg = refused(clusters.create(&pp, &managed_cluster("edge-1", Some("edge"), true)).await, "accepting without managedclusters/accept");
    assert!(msg.contains("cannot update the HubAcceptsClient field"), "{msg}");
    let msg = refused(clusters.create(&pp, &managed_cluster("edge-1", Some("edge"), false)).await, "joining a set without managedclustersets/join");
    assert!(msg.contains("cannot add/remove a ManagedCluster to/from ManagedClusterSet \"edge\""), "{msg}");
    // Accepting later, by an update, is checked too; an unchanged field is not.
    let patch = Patch::Merge(json!({"spec": {"hubAcceptsClient": true}}));
    let msg = refused(clusters.patch("plain", &PatchParams::default(), &patch).await, "accepting by an update");
    assert!(msg.contains("cannot update the HubAcceptsClient field"), "{msg}");
    clusters.patch("plain", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"tier": "gold"}}}))).await.unwrap();
    // Only the webhook sets a taint's timeAdded: a new taint carrying one is refused.
    let stamped = Patch::Merge(json!({"spec": {"taints": [{"key": "example.com/drain", "effect": "NoSelect", "timeAdded": "2026-01-01T00:00:00Z"}]}}));
    let msg = refused(admin_clusters.patch("plain", &PatchParams::default(), &stamped).await, "a new taint with its own timeAdded");
    assert!(msg.contains("It is not allowed to set TimeAdded of Taint \"example.com/drain\""), "{msg}");
    let unstamped = Patch::Merge(json!({"spec": {"taints": [{"key": "example.com/drain", "effect": "NoSelect"}]}}));
    let tainted = admin_clusters.patch("plain", &PatchParams::default(), &unstamped).await.unwrap();
    assert!(tainted.data["spec"]["taints"][0]["timeAdded"].is_string(), "the webhook stamps a new taint: {}", tainted.data["spec"]);
    // Names and URLs, whoever writes them.
    let msg = refused(admin_clusters.create(&pp, &managed_cluster("edge.one", None, false)).await, "a name (a DNS subdomain) that is not a namespace name");
    assert!(msg.contains("metadata.name format is not correct"), "{msg}");
    let mut insecure = managed_cluster("edge-2", None, false);
    insecure.data["spec"]["managedClusterClientConfigs"] = json!([{"url": "http://edge-2.example:6443"}]);
    let msg = refused(admin_clusters.create(&pp, &insecure).await, "a client URL that is not https");
    assert!(msg.contains("is invalid in client configs"), "{msg}");

    // With the upstream permissions (what the chart grants now), the same writes pass.
    grant(&admin, worker, json!([
        {"apiGroups": ["cluster.open-cluster-management.io"], "resources": ["managedclusters"], "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
        {"apiGroups": ["cluster.open-cluster-management.io"], "resources": ["managedclustersets"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["register.open-cluster-management.io"], "resources": ["managedclusters/accept"], "verbs": ["update"]},
        {"apiGroups": ["cluster.open-cluster-management.io"], "resources": ["managedclustersets/join"], "verbs": ["create"]},
    ]))
    .await;
    let edge = managed_cluster("edge-1", Some("edge"), true);
    eventually("accepting into a set with accept and join", || clusters.create(&pp, &edge)).await;

    // ManagedClusterSetBinding: named as its set, and `bind` on that set to create it.
    let set = api(&admin, "cluster.open-cluster-management.io", "v1beta2", "ManagedClusterSet", None);
    set.create(&pp, &obj(json!({"apiVersion": "cluster.open-cluster-management.io/v1beta2", "kind": "ManagedClusterSet", "metadata": {"name": "edge"}, "spec": {}}))).await.unwrap();
    let binding = |name: &str| obj(json!({"apiVersion": "cluster.open-cluster-management.io/v1beta2", "kind": "ManagedClusterSetBinding",
        "metadata": {"name": name, "namespace": "default"}, "spec": {"clusterSet": "edge"}}));
    grant(&admin, "system:serviceaccount:ferry:binder", json!([
        {"apiGroups": ["cluster.open-cluster-management.io"], "resources": ["managedclustersetbindings"], "verbs": ["get", "create"]},
    ]))
    .await;
    let binder = fleet.hub().client_as("system:serviceaccount:ferry:binder", &[]).await.unwrap();
    let binder_bindings = api(&binder, "cluster.open-cluster-management.io", "v1beta2", "ManagedClusterSetBinding", Some("default"));
    let msg = refused(api(&admin, "cluster.open-cluster-management.io", "v1beta2", "ManagedClusterSetBinding", Some("default")).create(&pp, &binding("other")).await, "a binding named unlike its set");
    assert!(msg.contains("must have the same name as the target ManagedClusterSet"), "{msg}");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let msg = loop {
        // RBAC's create permission may lag a moment (RBAC refuses first, naming no set);
        // the webhook's refusal is what this waits for.
        match binder_bindings.create(&pp, &binding("edge")).await {
            Err(kube::Error::Api(e)) if e.message.contains("is not allowed to bind cluster set") => break e.message,
            Err(kube::Error::Api(e)) if e.reason == "Forbidden" && std::time::Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(200)).await,
            other => panic!("binding without managedclustersets/bind: expected the webhook's refusal, got {other:?}"),
        }
    };
    assert!(msg.contains("\"edge\""), "{msg}");
    // With `bind` on the set, the binding is made.
    grant(&admin, "system:serviceaccount:ferry:binder", json!([
        {"apiGroups": ["cluster.open-cluster-management.io"], "resources": ["managedclustersetbindings"], "verbs": ["get", "create"]},
        {"apiGroups": ["cluster.open-cluster-management.io"], "resources": ["managedclustersets/bind"], "verbs": ["create"]},
    ]))
    .await;
    let edge_binding = binding("edge");
    eventually("binding with managedclustersets/bind", || binder_bindings.create(&pp, &edge_binding)).await;
    drop(server);
}

/// The upstream CRDs' CEL rules, stripped for v1.20, are enforced by the test bed's CEL
/// webhook: an OpenStackCluster with an empty `managedRouter`, or whose identity's region
/// changes, is refused with upstream's message; a valid one and a valid update pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cel_rules_of_upstream_crds_are_enforced() {
    let Some(shared) = prerequisites() else { return };
    let rules = ferry_fleet::webhooks_cel::rules();
    let capo = rules.iter().find(|c| c.name == "openstackclusters.infrastructure.cluster.x-k8s.io").expect("OpenStackCluster's CEL rules");
    assert!(capo.rules.iter().any(|r| r.path == "spec.identityRef" && r.message == "region is immutable"), "{:?}", capo.rules);
    let fleet = Fleet::start(FleetOptions { controllers: false, ..FleetOptions::hub_and(0) }).await.unwrap();
    let admin = fleet.hub().client().await.unwrap();
    ferry_fleet::crds::install_dir(&admin, &shared.join("cluster-api-provider-openstack")).await.unwrap();
    let validators = ferry_fleet::webhooks_cel::validators();
    let registrations: Vec<_> = validators.iter().map(|(r, _)| r.clone()).filter(|r| r.groups.contains(&"infrastructure.cluster.x-k8s.io")).collect();
    let server = AdmissionServer::start(validators).await.unwrap();
    for r in &registrations {
        server.register(&admin, r).await.unwrap();
    }
    let clusters = api(&admin, "infrastructure.cluster.x-k8s.io", "v1beta2", "OpenStackCluster", Some("default"));
    let os = |name: &str, region: &str, extra: Value| {
        let mut v = json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "OpenStackCluster", "metadata": {"name": name, "namespace": "default"},
            "spec": {"identityRef": {"cloudName": "openstack", "name": "cloud-config", "region": region}}});
        v["spec"].as_object_mut().unwrap().extend(extra.as_object().cloned().unwrap_or_default());
        obj(v)
    };
    let pp = PostParams::default();
    // The webhook registration may take a moment to be seen; its answers are final.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let msg = loop {
        match clusters.create(&pp, &os("empty-router", "r1", json!({"managedRouter": {}}))).await {
            Err(kube::Error::Api(s)) if s.message.contains("admission webhook") => break s.message,
            other => {
                assert!(std::time::Instant::now() < deadline, "the CEL webhook never refused an empty managedRouter: {other:?}");
                if other.is_ok() {
                    clusters.delete("empty-router", &Default::default()).await.unwrap();
                }
                // A poll while the server's webhook informer catches up; no event to wait on.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    assert!(msg.contains("spec.managedRouter: Invalid value: \"object\": managedRouter must not be empty if set"), "{msg}");
    clusters.create(&pp, &os("edge", "r1", json!({}))).await.expect("a valid OpenStackCluster");
    let moved = Patch::Merge(json!({"spec": {"identityRef": {"region": "r2"}}}));
    let msg = refused(clusters.patch("edge", &PatchParams::default(), &moved).await, "a region change");
    assert!(msg.contains("spec.identityRef: Invalid value: \"object\": region is immutable"), "{msg}");
    let relabel = Patch::Merge(json!({"metadata": {"labels": {"tier": "edge"}}}));
    clusters.patch("edge", &PatchParams::default(), &relabel).await.expect("an update that keeps the region");
}

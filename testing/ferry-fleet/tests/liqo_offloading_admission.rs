//! The test bed's Liqo offloading webhooks refuse and ignore what real Liqo does
//! (`pkg/webhooks/namespaceoffloading/nsoff.go`, `pkg/webhooks/pod/{pod,mutations}.go`):
//! a NamespaceOffloading not named `offloading`, or whose mapping strategy or remote
//! namespace name changes (what Ferry's old undo re-applied), is refused; pods get the
//! virtual nodes' toleration and the strategy's node affinity only when created in a
//! namespace labelled for scheduling, never afterwards (the old emulator tolerated Pending
//! pods after the fact); a labelled namespace without an offloading refuses pods.

use std::time::Duration;

use ferry_fleet::webhooks_liqo_offloading::{self, SCHEDULING_LABEL, VIRTUAL_NODE_TOLERATION_KEY, WEBHOOK_SKIP_LABEL};
use ferry_fleet::{Fleet, FleetOptions};
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

fn offloadings(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("offloading.liqo.io", "v1beta1", "NamespaceOffloading"), "namespaceoffloadings");
    Api::namespaced_with(client.clone(), ns, &ar)
}

fn offloading(name: &str, ns: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({"apiVersion": "offloading.liqo.io/v1beta1", "kind": "NamespaceOffloading", "metadata": {"name": name, "namespace": ns}, "spec": spec}))
        .unwrap()
}

/// A pod that mounts no service account token (the token controller may not have made one yet).
fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"automountServiceAccountToken": false, "containers": [{"name": "app", "image": "nginx:1.25"}]}}))
    .unwrap()
}

/// A namespace labelled `labels`, once its `default` ServiceAccount (pods need it) exists.
async fn namespace(client: &kube::Client, name: &str, labels: Value) {
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}});
    Api::<Namespace>::all(client.clone()).patch(name, &PatchParams::apply("test"), &Patch::Apply(&ns)).await.unwrap();
    let sas = Api::<ServiceAccount>::namespaced(client.clone(), name);
    tokio::time::timeout(WAIT, await_condition(sas, "default", |sa: Option<&ServiceAccount>| sa.is_some()))
        .await
        .unwrap_or_else(|_| panic!("no default ServiceAccount in {name} within {WAIT:?}"))
        .unwrap();
}

fn refused<T: std::fmt::Debug>(r: Result<T, kube::Error>, what: &str) -> String {
    match r {
        Err(kube::Error::Api(e)) => e.message,
        other => panic!("{what}: expected the API server to refuse it, got {other:?}"),
    }
}

fn tolerates(p: &Pod) -> bool {
    p.spec.iter().flat_map(|s| s.tolerations.iter().flatten()).any(|t| t.key.as_deref() == Some(VIRTUAL_NODE_TOLERATION_KEY))
}

fn required_terms(p: &Pod) -> Value {
    let v = serde_json::to_value(p).unwrap();
    v.pointer("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms").cloned().unwrap_or(Value::Null)
}

fn only(provider: &str) -> Value {
    json!({"nodeSelectorTerms": [{"matchExpressions": [{"key": "liqo.io/remote-cluster-id", "operator": "In", "values": [provider]}]}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn liqo_offloading_webhooks_refuse_immutable_changes_and_mutate_pods_only_at_creation() {
    let _ = tracing_subscriber::fmt().with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into())).with_test_writer().try_init();
    if !ferry_fleet::binaries::Binaries::installed() {
        ferry_runtime::report::missing_prerequisite("the test bed is not installed (scripts/install-testbed.sh)");
        return;
    }
    let started = std::time::Instant::now();
    // The hub stands in for a member: the webhooks do not care which cluster they serve.
    let fleet = Fleet::start(FleetOptions { crds: true, ..FleetOptions::hub_and(0) }).await.unwrap();
    fleet.install_crds().await.unwrap();
    let client = fleet.hub().client().await.unwrap();
    let _server = webhooks_liqo_offloading::start(&[("hub".to_owned(), client.clone())]).await.unwrap();
    let pp = PostParams::default();
    println!("fleet and webhooks up at {:?}", started.elapsed());

    // The NamespaceOffloading webhook: the registration may take a moment to be seen; its
    // answers are final.
    namespace(&client, "web", json!({})).await;
    let web = offloadings(&client, "web");
    let deadline = std::time::Instant::now() + WAIT;
    let msg = loop {
        match web.create(&pp, &offloading("other", "web", json!({}))).await {
            Err(kube::Error::Api(s)) if s.message.contains("admission webhook") => break s.message,
            other => {
                assert!(std::time::Instant::now() < deadline, "the NamespaceOffloading webhook never refused a name other than offloading: {other:?}");
                if other.is_ok() {
                    web.delete("other", &Default::default()).await.unwrap();
                }
                // A poll while the server's webhook informer catches up; no event to wait on.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    assert!(msg.contains("NamespaceOffloading name must match offloading"), "{msg}");
    println!("the NamespaceOffloading webhook answers at {:?}", started.elapsed());
    let msg = refused(web.create(&pp, &offloading("offloading", "web", json!({"namespaceMappingStrategy": "SelectedName"}))).await, "SelectedName without a name");
    assert!(msg.contains("The RemoteNamespaceName value cannot be empty"), "{msg}");
    let spec = json!({"namespaceMappingStrategy": "DefaultName", "podOffloadingStrategy": "LocalAndRemote", "clusterSelector": only("member-2")});
    web.create(&pp, &offloading("offloading", "web", spec)).await.expect("a valid NamespaceOffloading");
    // What the offload worker's old undo sent: the previous offloading's spec re-applied.
    let msg = refused(
        web.patch("offloading", &PatchParams::default(), &Patch::Merge(json!({"spec": {"namespaceMappingStrategy": "EnforceSameName"}}))).await,
        "changing the mapping strategy",
    );
    assert!(msg.contains("The NamespaceMappingStrategy value cannot be modified after creation"), "{msg}");
    let msg = refused(
        web.patch("offloading", &PatchParams::default(), &Patch::Merge(json!({"spec": {"remoteNamespaceName": "elsewhere"}}))).await,
        "setting a remote namespace name",
    );
    assert!(msg.contains("The RemoteNamespaceName value cannot be modified after creation"), "{msg}");
    // The pod strategy and the selector may change; an object labelled to skip Liqo's
    // webhooks is not looked at (the chart's objectSelector).
    web.patch("offloading", &PatchParams::default(), &Patch::Merge(json!({"spec": {"podOffloadingStrategy": "Remote", "clusterSelector": only("member-3")}})))
        .await
        .expect("the pod strategy and the selector may change");
    web.patch("offloading", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {WEBHOOK_SKIP_LABEL: "true"}}}))).await.unwrap();
    web.patch("offloading", &PatchParams::default(), &Patch::Merge(json!({"spec": {"namespaceMappingStrategy": "EnforceSameName"}})))
        .await
        .expect("skipped by the objectSelector");
    web.patch("offloading", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {WEBHOOK_SKIP_LABEL: null}}}))).await.unwrap();
    let msg = refused(
        web.patch("offloading", &PatchParams::default(), &Patch::Merge(json!({"spec": {"namespaceMappingStrategy": "DefaultName"}}))).await,
        "changing the mapping strategy once no longer skipped",
    );
    assert!(msg.contains("The NamespaceMappingStrategy value cannot be modified after creation"), "{msg}");

    // The pod webhook: not in a namespace without the scheduling label.
    let pods = Api::<Pod>::namespaced(client.clone(), "web");
    let before = pods.create(&pp, &pod("before")).await.unwrap();
    assert!(!tolerates(&before), "no toleration without the label: {:?}", before.spec);
    // Labelled (as Liqo's controller labels an offloaded namespace): pods created from now
    // on are mutated, once the API server sees the label and the webhook.
    Api::<Namespace>::all(client.clone()).patch("web", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {SCHEDULING_LABEL: "true"}}}))).await.unwrap();
    let deadline = std::time::Instant::now() + WAIT;
    let mut n = 0;
    let created = loop {
        n += 1;
        let p = pods.create(&pp, &pod(&format!("after-{n}"))).await.unwrap();
        if tolerates(&p) {
            break p;
        }
        assert!(std::time::Instant::now() < deadline, "a pod created in the labelled namespace never got Liqo's toleration: {:?}", p.spec);
        // A poll while the API server's webhook and namespace informers catch up.
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    println!("the pod webhook answers at {:?}", started.elapsed());
    let toleration = created.spec.as_ref().unwrap().tolerations.iter().flatten().find(|t| t.key.as_deref() == Some(VIRTUAL_NODE_TOLERATION_KEY)).unwrap();
    assert_eq!((toleration.operator.as_deref(), toleration.effect.as_deref()), (Some("Exists"), Some("NoExecute")));
    // The strategy is Remote with member-3: a virtual node of member-3 only.
    assert_eq!(
        required_terms(&created),
        json!([{"matchExpressions": [
            {"key": "liqo.io/remote-cluster-id", "operator": "In", "values": ["member-3"]},
            {"key": "liqo.io/type", "operator": "In", "values": ["virtual-node"]},
        ]}])
    );
    // The pod created before the label: an update does not mutate it (CREATE only).
    let before = pods.patch("before", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}}))).await.unwrap();
    assert!(!tolerates(&before) && required_terms(&before).is_null(), "a pod that existed before the label is never mutated: {:?}", before.spec);

    // LocalAndRemote with a selector: the selected virtual nodes, or any local node.
    web.patch("offloading", &PatchParams::default(), &Patch::Merge(json!({"spec": {"podOffloadingStrategy": "LocalAndRemote", "clusterSelector": only("member-2")}})))
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + WAIT;
    let local_and_remote = loop {
        n += 1;
        let p = pods.create(&pp, &pod(&format!("after-{n}"))).await.unwrap();
        if required_terms(&p).as_array().is_some_and(|t| t.len() == 2) {
            break p;
        }
        assert!(std::time::Instant::now() < deadline, "the webhook never read the updated offloading: {:?}", p.spec);
        // The webhook reads the offloading live; the API server's cache may lag a moment.
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        required_terms(&local_and_remote),
        json!([
            {"matchExpressions": [{"key": "liqo.io/remote-cluster-id", "operator": "In", "values": ["member-2"]}]},
            {"matchExpressions": [{"key": "liqo.io/type", "operator": "NotIn", "values": ["virtual-node"]}]},
        ])
    );

    println!("LocalAndRemote at {:?}", started.elapsed());
    // A namespace labelled for scheduling without an offloading: pods are refused.
    namespace(&client, "orphan", json!({SCHEDULING_LABEL: "true"})).await;
    let msg = refused(Api::<Pod>::namespaced(client.clone(), "orphan").create(&pp, &pod("p")).await, "a pod where no offloading is");
    assert!(msg.contains("failed retrieving NamespaceOffloading"), "{msg}");
}

//! The peer worker's Liqo method end to end: commands through the embedded
//! Kafka-protocol broker, the worker, and the test bed's real API servers with the
//! rebuilt emulated Liqo on the members (IPAM remapping, gateways from templates, the
//! PublicKey exchange, the nonce handshake verified by the tenant controller, certificates
//! from the provider's certificates API, replicated ResourceSlices) and Liqo's Tenant
//! webhook on each member.

use std::collections::HashMap;
use std::time::Duration;

use base64::Engine;
use ferry_fleet::emulated_liqo::LiqoKnobs;
use ferry_kube::dry_run::Change;
use ferry_peer::liqo::PEERING_LABEL;
use ferry_peer::spec::{PeerClusters, PeerOperation};
use ferry_peer::{PeerConfig, PeerHandler};
use ferry_runtime::{Client, EventType, ProgressEvent, SubmitOptions, TaskId, TaskKind};
use ferry_testkit::Bed;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleBinding};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(240);

/// Three members with Liqo (member-3's never comes up) and a peer worker.
async fn start() -> Option<Bed> {
    let knobs = HashMap::from([("member-3".to_owned(), LiqoKnobs { not_installed: true, ..LiqoKnobs::default() })]);
    let mut bed = Bed::builder().members(3, 2).kubeconfigs().liqo(knobs).start().await?;
    bed.run_worker(PeerHandler::new(PeerConfig::new(bed.clusters.clone())));
    Some(bed)
}

async fn submit(client: &Client, p: &PeerClusters) -> (TaskId, Vec<ProgressEvent>) {
    let mut events = client.events(false).await.unwrap();
    let id = client.submit(TaskKind::PEER, &p.subject(), p, SubmitOptions::default()).await.unwrap();
    let mut evs = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let e = tokio::time::timeout_at(deadline, events.next())
            .await
            .unwrap_or_else(|_| panic!("{id} did not end within {WAIT:?}; seen: {evs:#?}"))
            .expect("the stream goes on");
        if e.task_id == id.to_string() {
            println!("{id}: {:?} {} {}", e.event, e.step_name.as_deref().unwrap_or(""), e.message.as_deref().unwrap_or(""));
            let fin = e.event.is_final();
            evs.push(e);
            if fin {
                return (id, evs);
            }
        }
    }
}

fn last(evs: &[ProgressEvent]) -> String {
    ferry_runtime::report::summary(evs)
}

fn end(evs: &[ProgressEvent]) -> EventType {
    evs.last().unwrap().event
}

/// Submits `p`, which must end Reverted after `step` failed with `code` and a message
/// containing each of `says`.
async fn reverted_at(client: &Client, p: &PeerClusters, step: &str, code: &str, says: &[&str]) {
    let (_, evs) = submit(client, p).await;
    assert_eq!(end(&evs), EventType::Reverted, "{}", last(&evs));
    let failed = evs.iter().find(|e| e.event == EventType::StepFailed).unwrap_or_else(|| panic!("{evs:#?}"));
    assert_eq!((failed.step_name.as_deref(), failed.code.as_deref()), (Some(step), Some(code)), "{failed:?}");
    let message = failed.message.as_deref().unwrap_or_default();
    for s in says {
        assert!(message.contains(s), "{s:?} is not in {failed:?}");
    }
}

fn peer(a: &str, b: &str) -> PeerClusters {
    PeerClusters { a: a.into(), b: b.into(), timeout_seconds: Some(60), ..PeerClusters::default() }
}

/// Everything labelled for a peering on `cluster`: namespaces, ForeignClusters, virtual nodes.
async fn peering_objects(c: &kube::Client) -> Vec<String> {
    let lp = ListParams::default().labels(PEERING_LABEL);
    let mut out: Vec<String> =
        Api::<Namespace>::all(c.clone()).list(&lp).await.unwrap().items.into_iter().map(|n| format!("Namespace {}", n.metadata.name.unwrap())).collect();
    let fc = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("core.liqo.io", "v1beta1", "ForeignCluster"), "foreignclusters");
    out.extend(
        Api::<DynamicObject>::all_with(c.clone(), &fc)
            .list(&lp)
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|f| format!("ForeignCluster {}", f.metadata.name.unwrap())),
    );
    out.extend(
        Api::<Node>::all(c.clone())
            .list(&ListParams::default().labels("liqo.io/type=virtual-node"))
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|n| format!("Node {}", n.metadata.name.unwrap())),
    );
    out
}

/// Every ForeignCluster on `cluster` (Liqo's controller makes them; no peering label).
async fn foreign_clusters(c: &kube::Client) -> Vec<String> {
    let fc = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("core.liqo.io", "v1beta1", "ForeignCluster"), "foreignclusters");
    Api::<DynamicObject>::all_with(c.clone(), &fc).list(&ListParams::default()).await.unwrap().items.into_iter().filter_map(|f| f.metadata.name).collect()
}

async fn virtual_node_ready(c: &kube::Client, name: &str) -> bool {
    Api::<Node>::all(c.clone()).get_opt(name).await.unwrap().is_some_and(|n| ferry_kube::kinds::node_ready(&n))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn liqo_peer_unpeer_and_revert_remove_exactly_what_was_created() {
    let Some(bed) = start().await else { return };
    let client = bed.client();
    let (m1, m2) = (bed.cluster("member-1").await, bed.cluster("member-2").await);

    // A pod of 1 CPU already runs on member-2: its spare capacity is what it offers.
    let node = Api::<Node>::all(m2.clone()).list(&ListParams::default()).await.unwrap().items[0].metadata.name.clone().unwrap();
    let pod: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "busy", "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "busy", "image": "busy:1", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}))
    .unwrap();
    Api::<Pod>::namespaced(m2.clone(), "default").create(&Default::default(), &pod).await.unwrap();

    // Its dry run first: the check runs; the tenant namespaces are judged by both members,
    // the ResourceSlice named (its namespace is made first), the exchanged objects named.
    // Nothing is written.
    let p = peer("member-1", "member-2");
    let dry = ferry_peer::preview::preview(&PeerConfig::new(bed.clusters.clone()), &p.subject(), &p).await.unwrap();
    assert_eq!(dry.checked.verdict, ferry_runtime::dry_run::Verdict::Passes, "{dry:?}");
    let judged: Vec<(&str, &str, Change)> = dry.objects.iter().map(|o| (o.cluster.as_str(), o.object.as_str(), o.change)).collect();
    assert_eq!(
        judged,
        [
            ("member-1", "Namespace liqo-tenant-member-2", Change::Create),
            ("member-2", "Namespace liqo-tenant-member-1", Change::Create),
            ("member-1", "ResourceSlice liqo-tenant-member-2/member-2", Change::NotSent),
        ],
        "{dry:?}"
    );
    assert!(dry.notes.iter().any(|n| n.contains("not previewed")), "{dry:?}");
    assert!(Api::<Namespace>::all(m1.clone()).get_opt("liqo-tenant-member-2").await.unwrap().is_none(), "the dry run made a tenant namespace");
    // A member whose Liqo never comes up: the dry run's check fails at the command's
    // deadline as the task's would, and says why.
    let mut to_3 = peer("member-1", "member-3");
    to_3.timeout_seconds = Some(3);
    let dry = ferry_peer::preview::preview(&PeerConfig::new(bed.clusters.clone()), &to_3.subject(), &to_3).await.unwrap();
    assert!(
        matches!(&dry.checked.verdict, ferry_runtime::dry_run::Verdict::Fails { step, code, reason } if step == "check" && code == "DEADLINE_EXCEEDED" && reason.contains("member-3")),
        "{dry:?}"
    );

    // Peer member-1 (consumer) with member-2 (provider).
    let (id, evs) = submit(&client, &p).await;
    assert_eq!(end(&evs), EventType::Succeeded, "{}", last(&evs));
    let steps: Vec<String> = evs.iter().filter(|e| e.event == EventType::StepSucceeded).filter_map(|e| e.step_name.clone()).collect();
    assert_eq!(steps, ["check", "prepare", "network", "authentication", "resources", "established"]);
    assert!(virtual_node_ready(&m1, "member-2").await, "member-1 has a Ready virtual node of member-2");
    assert!(!virtual_node_ready(&m2, "member-1").await, "one direction only");
    let snap = client.snapshot(id).await.unwrap().unwrap();
    let res = snap.journal.iter().find(|j| j.name == "resources").and_then(|j| j.output.clone()).unwrap();
    assert!(res.contains("7000m"), "the provider's spare capacity (2 nodes of 4 CPUs, 1 requested) is offered: {res}");
    // Nothing secret reached the journal: no key, nonce, signature or certificate.
    let journal = format!("{:?}", snap.journal);
    for secret in ["PRIVATE KEY", "signedCRT", "signature", "kubeconfig", "BEGIN"] {
        assert!(!journal.contains(secret), "the journal holds {secret:?}: {journal}");
    }
    // Both clusters have the same pod CIDR: each side's Configuration holds the other's
    // remapped by the IPAM.
    let cfg = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("networking.liqo.io", "v1beta1", "Configuration"), "configurations");
    let c = Api::<DynamicObject>::namespaced_with(m1.clone(), "liqo-tenant-member-2", &cfg).get("member-2").await.unwrap();
    assert_eq!(c.data["spec"]["remote"]["cidr"]["pod"], json!(["10.244.0.0/16"]), "the peer's own pod CIDR is sent");
    assert_ne!(c.data["status"]["remote"]["cidr"]["pod"], json!(["10.244.0.0/16"]), "and remapped: {}", c.data["status"]);
    // The key exchange was real: the Identity's kubeconfig Liqo made on member-1 (its key,
    // member-2's certificate) authenticates on member-2's API server as member-1, which the
    // tenant controller let manage ResourceSlices in its tenant namespace there and nothing
    // else (the emulated replicator writes with this credential, so the peering above
    // went through that binding).
    let ids = Api::<Secret>::namespaced(m1.clone(), "liqo-tenant-member-2");
    let kc = ids.get("kubeconfig-controlplane-member-2").await.unwrap();
    let text = String::from_utf8(kc.data.unwrap()["kubeconfig"].0.clone()).unwrap();
    let kubeconfig: kube::config::Kubeconfig = serde_json::from_str(&text).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await.unwrap();
    let as_member_1 = kube::Client::try_from(config).unwrap();
    let denied = Api::<Namespace>::all(as_member_1.clone()).list(&ListParams::default()).await.unwrap_err();
    assert!(denied.to_string().contains("User \"member-1\""), "member-2 knows the caller as member-1: {denied}");
    let slices = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("authentication.liqo.io", "v1beta1", "ResourceSlice"), "resourceslices");
    let copies = Api::<DynamicObject>::namespaced_with(as_member_1.clone(), "liqo-tenant-member-1", &slices).list(&ListParams::default()).await.unwrap();
    assert_eq!(copies.items.len(), 1, "member-1 sees its replicated slice in its tenant namespace on member-2");
    let elsewhere = Api::<DynamicObject>::namespaced_with(as_member_1, "default", &slices).list(&ListParams::default()).await.unwrap_err();
    assert!(elsewhere.to_string().contains("forbidden"), "and nothing outside it: {elsewhere}");
    let binding = Api::<RoleBinding>::namespaced(m2.clone(), "liqo-tenant-member-1").get("liqo-binding-liqo-remote-controlplane").await.unwrap();
    let subjects: Vec<(String, String)> = binding.subjects.unwrap_or_default().into_iter().map(|s| (s.kind, s.name)).collect();
    assert_eq!(subjects, [("User".to_owned(), "member-1".to_owned())]);
    assert_eq!(binding.metadata.owner_references.unwrap_or_default().first().map(|o| o.kind.clone()).as_deref(), Some("Tenant"), "owned by the Tenant");
    let cluster_wide = "liqo-binding-liqo-virtual-kubelet-remote-clusterwide-member-1";
    let cluster_bindings = Api::<ClusterRoleBinding>::all(m2.clone());
    let uid = cluster_bindings.get(cluster_wide).await.unwrap().metadata.uid.unwrap();

    // The same peering asked for again: it is an earlier Ferry task's, so this one reuses
    // it, applies nothing, and its revert leaves the pair peered (before, the second peer
    // took the objects for its own and its revert unpeered the pair under the first).
    let before = (peering_objects(&m1).await, peering_objects(&m2).await);
    let (again, evs) = submit(&client, &p).await;
    assert_eq!(end(&evs), EventType::Succeeded, "{}", last(&evs));
    assert!(evs.iter().any(|e| e.message.as_deref().is_some_and(|m| m.contains("already peered by an earlier Ferry task"))), "{evs:#?}");
    let mut events = client.events(false).await.unwrap();
    client.revert(again).await.unwrap();
    let evs = events.until(again, WAIT, |e| e.event.is_final()).await.unwrap();
    assert_eq!(end(&evs), EventType::Reverted, "{}", last(&evs));
    assert_eq!((peering_objects(&m1).await, peering_objects(&m2).await), before, "the second peer's revert changed the first's peering");
    assert!(virtual_node_ready(&m1, "member-2").await, "the first peering still works");
    // Both ways over a one-way peering: partly there, refused, and nothing changes.
    let mut both = peer("member-1", "member-2");
    both.bidirectional = true;
    let (_, evs) = submit(&client, &both).await;
    let failed = evs.iter().find(|e| e.event == EventType::StepFailed).unwrap_or_else(|| panic!("{evs:#?}"));
    assert_eq!((failed.step_name.as_deref(), failed.code.as_deref()), (Some("check"), Some("PARTLY_PEERED")), "{failed:?}");
    assert!(failed.message.as_deref().unwrap_or("").contains("missing"), "{failed:?}");
    assert_eq!((peering_objects(&m1).await, peering_objects(&m2).await), before);

    // Unpeer: everything labelled for the pair is gone on both sides.
    let mut un = peer("member-2", "member-1");
    un.operation = PeerOperation::Unpeer;
    let (_, evs) = submit(&client, &un).await;
    assert_eq!(end(&evs), EventType::Succeeded, "{}", last(&evs));
    let removed: Vec<String> = evs.iter().filter(|e| e.event == EventType::StepSucceeded).filter_map(|e| e.step_name.clone()).collect();
    assert_eq!(removed[1..4], ["remove-resources-reverse", "remove-authentication-reverse", "remove-resources"], "reverse order: {removed:?}");
    assert_eq!(peering_objects(&m1).await, Vec::<String>::new());
    assert_eq!(peering_objects(&m2).await, Vec::<String>::new());
    // An unpeer keeps the ForeignClusters, as `liqoctl unpeer` does.
    assert_eq!(foreign_clusters(&m1).await, ["member-2"], "member-1 still knows member-2");
    // The Tenant's finalizer took its cluster-wide binding with it.
    tokio::time::timeout(WAIT, kube::runtime::wait::await_condition(cluster_bindings, cluster_wide, kube::runtime::wait::conditions::is_deleted(&uid)))
        .await
        .expect("the cluster-wide binding is deleted with the Tenant")
        .unwrap();

    // Bidirectional, then revert it.
    let mut both = peer("member-1", "member-2");
    both.bidirectional = true;
    let (id, evs) = submit(&client, &both).await;
    assert_eq!(end(&evs), EventType::Succeeded, "{}", last(&evs));
    assert!(virtual_node_ready(&m1, "member-2").await && virtual_node_ready(&m2, "member-1").await);
    let mut events = client.events(false).await.unwrap();
    client.revert(id).await.unwrap();
    let evs = events.until(id, WAIT, |e| e.event.is_final()).await.unwrap();
    assert_eq!(end(&evs), EventType::Reverted, "{}", last(&evs));
    assert_eq!(peering_objects(&m1).await, Vec::<String>::new());
    assert_eq!(peering_objects(&m2).await, Vec::<String>::new());
    bed.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unready_components_fail_at_the_deadline_and_commands_of_a_pair_never_interleave() {
    let Some(bed) = start().await else { return };
    let client = bed.client();
    let (m1, m2) = (bed.cluster("member-1").await, bed.cluster("member-2").await);

    // Liqo never comes up on member-3: the check fails at its deadline, nothing created.
    let mut p = peer("member-1", "member-3");
    p.timeout_seconds = Some(3);
    reverted_at(&client, &p, "check", "DEADLINE_EXCEEDED", &["LIQO_NOT_READY", "member-3"]).await;
    assert_eq!(peering_objects(&m1).await, Vec::<String>::new());

    // member-2's Liqo lacks the ClusterRole its tenant controller binds for a consumer (a
    // broken chart install): that controller would reconcile no Tenant and say nothing,
    // so the check waits for the role and fails at its deadline saying which, before
    // anything is created.
    let roles = Api::<ClusterRole>::all(m2.clone());
    let mut role = roles.get("liqo-remote-controlplane").await.unwrap();
    roles.delete("liqo-remote-controlplane", &Default::default()).await.unwrap();
    // (10 s: the waits before it, on member-2's first watches, pass on a loaded machine.)
    let mut p = peer("member-1", "member-2");
    p.timeout_seconds = Some(10);
    reverted_at(&client, &p, "check", "DEADLINE_EXCEEDED", &["app.kubernetes.io/name=remote-controlplane"]).await;
    assert_eq!((peering_objects(&m1).await, peering_objects(&m2).await), (vec![], vec![]));
    role.metadata = kube::api::ObjectMeta { name: role.metadata.name.take(), labels: role.metadata.labels.take(), ..Default::default() };
    roles.create(&Default::default(), &role).await.unwrap();

    // member-2's gateway never connects: the network step fails at its deadline (long
    // enough for the configurations, gateways and keys before it on a loaded machine) and
    // the revert removes the namespaces, configurations, gateways and keys already made.
    bed.liqo.as_ref().unwrap().set("member-2", |k| k.gateway_never_connects = true);
    let mut p = peer("member-1", "member-2");
    p.timeout_seconds = Some(30);
    // The last state seen is in the error.
    reverted_at(&client, &p, "network", "DEADLINE_EXCEEDED", &["Connecting"]).await;
    assert_eq!(peering_objects(&m1).await, Vec::<String>::new());
    assert_eq!(peering_objects(&m2).await, Vec::<String>::new());
    // Liqo's controller made a ForeignCluster on each side for the objects naming the other
    // (and never deletes one); the revert deleted them, as neither side knew the other.
    assert_eq!((foreign_clusters(&m1).await, foreign_clusters(&m2).await), (vec![], vec![]), "the revert left ForeignClusters");
    bed.liqo.as_ref().unwrap().set("member-2", |k| k.gateway_never_connects = false);

    // A gateway that connects late: the network step waits for it (the delay bounds its
    // duration from below; creation timestamps are whole seconds) and the peering succeeds.
    bed.liqo.as_ref().unwrap().set("member-2", |k| k.gateway_delay = Duration::from_secs(2));
    let (_, evs) = submit(&client, &peer("member-1", "member-2")).await;
    assert_eq!(end(&evs), EventType::Succeeded, "{}", last(&evs));
    let at = |t: EventType| evs.iter().find(|e| e.event == t && e.step_name.as_deref() == Some("network")).unwrap().at_ms;
    assert!(at(EventType::StepSucceeded) - at(EventType::StepStarted) >= 1000, "the network step waited for the late gateway");
    bed.liqo.as_ref().unwrap().set("member-2", |k| k.gateway_delay = Duration::ZERO);

    // An unknown cluster is refused.
    let (_, evs) = submit(&client, &peer("member-1", "nowhere")).await;
    assert_eq!(end(&evs), EventType::Rejected, "{}", last(&evs));
    assert!(last(&evs).contains("nowhere"), "{}", last(&evs));

    // Two commands for one pair (either order of a and b): the second starts only after
    // the first ended.
    let mut events = client.events(false).await.unwrap();
    let first = client.submit(TaskKind::PEER, &peer("member-1", "member-2").subject(), &peer("member-1", "member-2"), SubmitOptions::default()).await.unwrap();
    let mut un = peer("member-2", "member-1");
    un.operation = PeerOperation::Unpeer;
    let second = client.submit(TaskKind::PEER, &un.subject(), &un, SubmitOptions::default()).await.unwrap();
    // Events of different tasks may sit in different partitions of the progress topic, so
    // the order is read from the events' clocks (one worker process), not arrival order.
    let mut seen: Vec<ProgressEvent> = Vec::new();
    let mut finals = 0;
    while finals < 2 {
        let e = tokio::time::timeout(WAIT, events.next()).await.expect("both end").expect("the stream goes on");
        let id: TaskId = e.task_id.parse().unwrap();
        if id == first || id == second {
            finals += usize::from(e.event.is_final());
            seen.push(e);
        }
    }
    let of = |id: TaskId| seen.iter().filter(move |e| e.task_id == id.to_string());
    let first_end = of(first).find(|e| e.event.is_final()).unwrap();
    let second_start = of(second).find(|e| e.event == EventType::StepStarted).unwrap();
    assert!(second_start.at_ms >= first_end.at_ms, "the unpeer started at {} before the peer ended at {}", second_start.at_ms, first_end.at_ms);
    assert_eq!(first_end.event, EventType::Succeeded);
    assert_eq!(of(second).next_back().unwrap().event, EventType::Succeeded);
    assert_eq!(peering_objects(&m1).await, Vec::<String>::new());
    bed.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_or_missing_handshake_is_refused_by_the_provider_and_says_why() {
    let Some(bed) = start().await else { return };
    let client = bed.client();
    let (m1, m2) = (bed.cluster("member-1").await, bed.cluster("member-2").await);

    // member-1's nonce signer signs with a key that is not its own: member-2's tenant
    // controller refuses the Tenant, and the task fails at `authentication` with Liqo's
    // reason, then removes what it made.
    bed.liqo.as_ref().unwrap().set("member-1", |k| k.forged_signatures = true);
    reverted_at(&client, &peer("member-1", "member-2"), "authentication", "AUTHENTICATION", &["SignatureVerificationFailed", "member-2 refused the Tenant of member-1"]).await;
    assert_eq!(peering_objects(&m1).await, Vec::<String>::new());
    assert_eq!(peering_objects(&m2).await, Vec::<String>::new());
    bed.liqo.as_ref().unwrap().set("member-1", |k| k.forged_signatures = false);

    // A Tenant as Ferry used to send it (no handshake, in a namespace that is not a tenant
    // namespace) is refused by Liqo's Tenant webhook.
    let tenants = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("authentication.liqo.io", "v1beta1", "Tenant"), "tenants");
    let pp = PatchParams::apply("test");
    Api::<Namespace>::all(m2.clone())
        .patch("plain", &pp, &Patch::Apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "plain"}})))
        .await
        .unwrap();
    let old = json!({"apiVersion": "authentication.liqo.io/v1beta1", "kind": "Tenant", "metadata": {"name": "member-1", "namespace": "plain"},
        "spec": {"clusterID": "member-1", "tenantCondition": "Active"}});
    let e = Api::<DynamicObject>::namespaced_with(m2.clone(), "plain", &tenants).patch("member-1", &pp, &Patch::Apply(&old)).await.unwrap_err();
    assert!(e.to_string().contains("must be created in a tenant namespace"), "{e}");

    // In a tenant namespace but with no CSR: accepted by the webhook, refused by the tenant
    // controller (the signature cannot verify either without the nonce's signer).
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "liqo-tenant-member-1",
        "labels": {"liqo.io/tenant-namespace": "true", "liqo.io/remote-cluster-id": "member-1"}}});
    Api::<Namespace>::all(m2.clone()).patch("liqo-tenant-member-1", &pp, &Patch::Apply(&ns)).await.unwrap();
    let keys = Api::<Secret>::namespaced(m1.clone(), "liqo").get("authentication-keys").await.unwrap();
    let public = base64::engine::general_purpose::STANDARD.encode(&keys.data.unwrap()["publicKey"].0);
    let bare = json!({"apiVersion": "authentication.liqo.io/v1beta1", "kind": "Tenant", "metadata": {"name": "member-1", "namespace": "liqo-tenant-member-1",
        "labels": {"liqo.io/remote-cluster-id": "member-1"}}, "spec": {"clusterID": "member-1", "publicKey": public}});
    let api = Api::<DynamicObject>::namespaced_with(m2.clone(), "liqo-tenant-member-1", &tenants);
    api.patch("member-1", &pp, &Patch::Apply(&bare)).await.unwrap();
    // The provider's verdict, as a Warning event on the Tenant; it never gets auth params.
    let verdict = ferry_kube::Watches::new()
        .wait_store::<k8s_openapi::api::core::v1::Event, String>("member-2", &m2, Some("liqo-tenant-member-1"), "the verdict", WAIT, |s| {
            match s.state().iter().find(|e| e.involved_object.name.as_deref() == Some("member-1") && e.type_.as_deref() == Some("Warning")) {
                Some(e) => ferry_kube::Check::Done(e.reason.clone().unwrap_or_default()),
                None => ferry_kube::Check::Pending("no event".into()),
            }
        })
        .await
        .unwrap();
    assert!(["NonceNotFound", "SignatureVerificationFailed", "InvalidCSR"].contains(&verdict.as_str()), "{verdict}");
    assert!(api.get("member-1").await.unwrap().data.pointer("/status/authParams").is_none(), "a refused Tenant gets no credentials");
    bed.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_that_were_there_before_are_never_taken_over_nor_deleted() {
    let Some(bed) = start().await else { return };
    let client = bed.client();
    let (m1, m2) = (bed.cluster("member-1").await, bed.cluster("member-2").await);
    let pp = PatchParams::apply("someone");

    // member-1 already has its tenant namespace for member-2, labelled as Liqo's namespace
    // manager labels it (a `liqoctl unpeer` without `--delete-namespaces` leaves it so) but
    // under a name of its own, with someone's ConfigMap in it: Liqo finds tenant
    // namespaces by their labels, and so must Ferry.
    const BY_HAND: &str = "tenant-ns-by-hand";
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": BY_HAND,
        "labels": {"liqo.io/tenant-namespace": "true", "liqo.io/remote-cluster-id": "member-2"}}});
    Api::<Namespace>::all(m1.clone()).patch(BY_HAND, &pp, &Patch::Apply(&ns)).await.unwrap();
    let marker = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "marker", "namespace": BY_HAND}, "data": {"mine": "yes"}});
    let cms = Api::<ConfigMap>::namespaced(m1.clone(), BY_HAND);
    cms.patch("marker", &pp, &Patch::Apply(&marker)).await.unwrap();

    // The dry run says it is not Ferry's and would be reused.
    let mut p = peer("member-1", "member-2");
    let dry = ferry_peer::preview::preview(&PeerConfig::new(bed.clusters.clone()), &p.subject(), &p).await.unwrap();
    let kept = dry.objects.iter().find(|o| o.cluster == "member-1" && o.object == format!("Namespace {BY_HAND}")).unwrap_or_else(|| panic!("{dry:?}"));
    assert_eq!(kept.change, Change::Unchanged, "{dry:?}");
    assert!(kept.note.as_deref().unwrap_or("").contains("not Ferry's"), "{kept:?}");

    // A peering that fails (member-2's gateway never connects) and is reverted: Ferry's
    // namespace on member-2 goes, the one that was there stays as it was.
    bed.liqo.as_ref().unwrap().set("member-2", |k| k.gateway_never_connects = true);
    p.timeout_seconds = Some(30);
    let (_, evs) = submit(&client, &p).await;
    assert_eq!(end(&evs), EventType::Reverted, "{}", last(&evs));
    let failed = evs.iter().find(|e| e.event == EventType::StepFailed).unwrap();
    assert_eq!(failed.step_name.as_deref(), Some("network"), "{failed:?}");
    let there = Api::<Namespace>::all(m1.clone()).get_opt(BY_HAND).await.unwrap().expect("the namespace that was there survives the revert");
    assert!(there.metadata.deletion_timestamp.is_none(), "it is being deleted");
    assert!(!there.metadata.labels.unwrap_or_default().contains_key(PEERING_LABEL), "Ferry labelled a namespace it did not make");
    assert_eq!(cms.get("marker").await.unwrap().data.unwrap()["mine"], "yes");
    assert!(Api::<Namespace>::all(m2.clone()).get_opt("liqo-tenant-member-1").await.unwrap().is_none(), "Ferry's own namespace is removed");
    assert_eq!(peering_objects(&m1).await, Vec::<String>::new());
    assert_eq!(peering_objects(&m2).await, Vec::<String>::new());
    bed.liqo.as_ref().unwrap().set("member-2", |k| k.gateway_never_connects = false);

    // A Configuration made outside Ferry (as `liqoctl network connect` names it): the pair
    // is already peered outside Ferry, and the peer is refused, naming it.
    let cfg = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("networking.liqo.io", "v1beta1", "Configuration"), "configurations");
    let theirs = json!({"apiVersion": "networking.liqo.io/v1beta1", "kind": "Configuration", "metadata": {"name": "member-2", "namespace": BY_HAND},
        "spec": {"remote": {"cidr": {"pod": ["10.244.0.0/16"], "external": ["10.70.0.0/16"]}}}});
    let cfgs = Api::<DynamicObject>::namespaced_with(m1.clone(), BY_HAND, &cfg);
    cfgs.patch("member-2", &pp, &Patch::Apply(&theirs)).await.unwrap();
    let theirs = format!("Configuration {BY_HAND}/member-2 on member-1");
    reverted_at(&client, &peer("member-1", "member-2"), "check", "OBJECT_NOT_FERRYS", &["already peered outside Ferry", &theirs]).await;
    assert!(!cfgs.get("member-2").await.unwrap().metadata.labels.unwrap_or_default().contains_key(PEERING_LABEL));
    cfgs.delete("member-2", &Default::default()).await.unwrap();

    // Without it, the peering succeeds inside the namespace that was there (no second
    // tenant namespace, which Liqo would refuse), and its revert leaves that namespace.
    let (id, evs) = submit(&client, &peer("member-1", "member-2")).await;
    assert_eq!(end(&evs), EventType::Succeeded, "{}", last(&evs));
    let ours = cfgs.get("member-2").await.unwrap();
    assert_eq!(ours.metadata.labels.unwrap_or_default().get(PEERING_LABEL).map(String::as_str), Some("member-1.member-2"));
    assert!(Api::<Namespace>::all(m1.clone()).get_opt("liqo-tenant-member-2").await.unwrap().is_none(), "Ferry made a second tenant namespace for member-2");
    assert!(virtual_node_ready(&m1, "member-2").await);
    let mut events = client.events(false).await.unwrap();
    client.revert(id).await.unwrap();
    let evs = events.until(id, WAIT, |e| e.event.is_final()).await.unwrap();
    assert_eq!(end(&evs), EventType::Reverted, "{}", last(&evs));
    assert!(cfgs.get_opt("member-2").await.unwrap().is_none(), "the peering's Configuration is removed");
    assert_eq!(cms.get("marker").await.unwrap().data.unwrap()["mine"], "yes", "the namespace that was there keeps what it held");

    // A namespace of that name that is not a Liqo tenant namespace: refused, left alone.
    let plain = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "liqo-tenant-member-1"}});
    Api::<Namespace>::all(m2.clone()).patch("liqo-tenant-member-1", &pp, &Patch::Apply(&plain)).await.unwrap();
    reverted_at(&client, &peer("member-1", "member-2"), "check", "OBJECT_NOT_FERRYS", &["Namespace liqo-tenant-member-1 on member-2"]).await;
    let left = Api::<Namespace>::all(m2.clone()).get("liqo-tenant-member-1").await.unwrap();
    assert!(left.metadata.deletion_timestamp.is_none() && !left.metadata.labels.unwrap_or_default().contains_key(PEERING_LABEL));

    // A second tenant namespace for member-2 on member-1: Liqo's manager refuses to choose
    // ("multiple tenant namespaces found"), and so does Ferry, naming both.
    let second = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "liqo-tenant-member-2",
        "labels": {"liqo.io/tenant-namespace": "true", "liqo.io/remote-cluster-id": "member-2"}}});
    Api::<Namespace>::all(m1.clone()).patch("liqo-tenant-member-2", &pp, &Patch::Apply(&second)).await.unwrap();
    let (_, evs) = submit(&client, &peer("member-1", "member-2")).await;
    let failed = evs.iter().find(|e| e.event == EventType::StepFailed).unwrap_or_else(|| panic!("{evs:#?}"));
    assert_eq!((failed.step_name.as_deref(), failed.code.as_deref()), (Some("check"), Some("TENANT_NAMESPACES")), "{failed:?}");
    let why = failed.message.clone().unwrap_or_default();
    assert!(why.contains(BY_HAND) && why.contains("liqo-tenant-member-2") && why.contains("member-1"), "{why}");
    bed.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_is_gone_is_force_unpeered_from_the_consumer_alone() {
    // Removals bounded at 30 s (300 s by default), so a removal held up ends the task here.
    let knobs = HashMap::from([("member-3".to_owned(), LiqoKnobs { not_installed: true, ..LiqoKnobs::default() })]);
    let Some(mut bed) = Bed::builder().members(3, 2).kubeconfigs().liqo(knobs).start().await else { return };
    let cfg = PeerConfig { removal_timeout: Duration::from_secs(30), ..PeerConfig::new(bed.clusters.clone()) };
    bed.run_worker(PeerHandler::new(cfg));
    let client = bed.client();
    let m1 = bed.cluster("member-1").await;

    // Peered both ways, so member-1's tenant namespace for member-2 holds both roles
    // (a ResourceSlice and its virtual node, a Tenant), then member-2 is gone for good.
    let mut both = peer("member-1", "member-2");
    both.bidirectional = true;
    let (_, evs) = submit(&client, &both).await;
    assert_eq!(end(&evs), EventType::Succeeded, "{}", last(&evs));
    assert!(virtual_node_ready(&m1, "member-2").await);

    // While member-2 answers, Liqo's API server checker on member-1 says so, and Liqo would
    // never count it dead: a force unpeer waits for that to change, then fails, saying to
    // unpeer instead, and changes nothing.
    let fc = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("core.liqo.io", "v1beta1", "ForeignCluster"), "foreignclusters");
    let established = |fc: Option<&DynamicObject>| {
        fc.and_then(|fc| fc.data.pointer("/status/conditions")?.as_array().cloned())
            .is_some_and(|cs| cs.iter().any(|c| c["type"] == "APIServerStatus" && c["status"] == "Established"))
    };
    let fcs = Api::<DynamicObject>::all_with(m1.clone(), &fc);
    tokio::time::timeout(WAIT, kube::runtime::wait::await_condition(fcs.clone(), "member-2", established)).await.expect("member-2's API server found answering").unwrap();
    let mut early = peer("member-1", "member-2");
    early.operation = PeerOperation::ForceUnpeer;
    early.timeout_seconds = Some(3);
    let before = peering_objects(&m1).await;
    let (_, evs) = submit(&client, &early).await;
    let failed = evs.iter().find(|e| e.event == EventType::StepFailed).unwrap_or_else(|| panic!("{evs:#?}"));
    assert_eq!(failed.step_name.as_deref(), Some("check"), "{failed:?}");
    assert!(failed.message.as_deref().unwrap_or_default().contains("PEER_ANSWERS"), "{failed:?}");
    assert!(failed.message.as_deref().unwrap_or_default().contains("unpeer the pair instead"), "{failed:?}");
    assert_eq!(peering_objects(&m1).await, before, "a refused force unpeer changed member-1");
    assert!(virtual_node_ready(&m1, "member-2").await);

    bed.fleet.cluster_mut("member-2").expect("member-2").stop();

    // A plain unpeer needs both clusters: its check fails at its deadline and names the
    // way out.
    let mut un = peer("member-1", "member-2");
    un.operation = PeerOperation::Unpeer;
    un.timeout_seconds = Some(5);
    let (_, evs) = submit(&client, &un).await;
    let failed = evs.iter().find(|e| e.event == EventType::StepFailed).unwrap_or_else(|| panic!("{evs:#?}"));
    assert_eq!(failed.step_name.as_deref(), Some("check"), "{failed:?}");
    assert!(failed.message.as_deref().unwrap_or_default().contains("If member-2 is gone for good, operation ForceUnpeer with a: member-1, b: member-2"), "{failed:?}");

    // The dry run: only member-1 is asked; its tenant namespace would go.
    let mut force = peer("member-1", "member-2");
    force.operation = PeerOperation::ForceUnpeer;
    let dry = ferry_peer::preview::preview(&PeerConfig::new(bed.clusters.clone()), &force.subject(), &force).await.unwrap();
    assert_eq!(dry.checked.verdict, ferry_runtime::dry_run::Verdict::Passes, "{dry:?}");
    let judged: Vec<(&str, &str, Change)> = dry.objects.iter().map(|o| (o.cluster.as_str(), o.object.as_str(), o.change)).collect();
    assert_eq!(judged, [("member-1", "Namespace liqo-tenant-member-2", Change::Delete)], "{dry:?}");
    assert!(dry.notes.iter().any(|n| n.contains("never contacted")), "{dry:?}");

    // Something else holds the tenant namespace up: the force unpeer fails once its removal
    // bound is out, and ends Failed, not reverted (nothing can be put back); once the hold
    // is gone the same command goes on from there.
    let holds = Api::<ConfigMap>::namespaced(m1.clone(), "liqo-tenant-member-2");
    let hold: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "hold", "finalizers": ["ferry.test/hold"]}})).unwrap();
    holds.create(&Default::default(), &hold).await.unwrap();
    let (_, evs) = submit(&client, &force).await;
    assert_eq!(end(&evs), EventType::Failed, "{}", last(&evs));
    let failed = evs.iter().find(|e| e.event == EventType::StepFailed).unwrap_or_else(|| panic!("{evs:#?}"));
    assert_eq!(failed.step_name.as_deref(), Some("force-unpeer"), "{failed:?}");
    let why = failed.message.as_deref().unwrap_or_default();
    assert!(why.contains("REMOVAL") && why.contains("ferry.test/hold"), "the namespace controller's reason is passed on: {failed:?}");
    holds.patch("hold", &PatchParams::default(), &Patch::Merge(&json!({"metadata": {"finalizers": null}}))).await.unwrap();

    // The force unpeer: Liqo on member-1 lets go of the slice's copy and the NamespaceMaps'
    // on the dead provider only because their ForeignCluster is declared unreachable; without
    // that the tenant namespace would wait on their finalizers and the step would time out.
    let (id, evs) = submit(&client, &force).await;
    assert_eq!(end(&evs), EventType::Succeeded, "{}", last(&evs));
    let steps: Vec<String> = evs.iter().filter(|e| e.event == EventType::StepSucceeded).filter_map(|e| e.step_name.clone()).collect();
    assert_eq!(steps, ["check", "force-unpeer"]);
    assert!(evs.iter().any(|e| e.message.as_deref().is_some_and(|m| m.contains("declared permanently unreachable"))), "{evs:#?}");
    assert_eq!(peering_objects(&m1).await, Vec::<String>::new(), "member-1 holds nothing of the peering");
    assert!(Api::<Namespace>::all(m1.clone()).get_opt("liqo-tenant-member-2").await.unwrap().is_none());
    assert_eq!(foreign_clusters(&m1).await, Vec::<String>::new(), "the annotated ForeignCluster goes last");
    let snap = client.snapshot(id).await.unwrap().unwrap();
    let out = snap.journal.iter().find(|j| j.name == "force-unpeer").and_then(|j| j.output.clone()).unwrap();
    assert!(out.contains("Namespace/liqo-tenant-member-2"), "{out}");

    // It cannot be undone, and says so; asked again, there is nothing left to do.
    let mut events = client.events(false).await.unwrap();
    client.revert(id).await.unwrap();
    let evs = events.until(id, WAIT, |e| e.event.is_final()).await.unwrap();
    assert_eq!(end(&evs), EventType::RevertFailed, "{}", last(&evs));
    assert!(last(&evs).contains("cannot be undone"), "{}", last(&evs));
    let (_, evs) = submit(&client, &force).await;
    assert_eq!(end(&evs), EventType::Succeeded, "{}", last(&evs));
    assert!(evs.iter().any(|e| e.message.as_deref().is_some_and(|m| m.contains("holds nothing of a Ferry peering"))), "{evs:#?}");

    // member-2 comes back after all, holding its side of the peering (member-1's Tenant,
    // its own slice toward member-1 and that slice's virtual node, its tenant namespace):
    // a plain unpeer of the pair removes it, with member-1's side already gone.
    bed.fleet.revive("member-2").await.expect("member-2 back");
    let m2 = bed.cluster("member-2").await;
    assert!(peering_objects(&m2).await.contains(&"Namespace liqo-tenant-member-1".to_owned()), "member-2 kept its side: {:?}", peering_objects(&m2).await);
    let mut un = peer("member-1", "member-2");
    un.operation = PeerOperation::Unpeer;
    let (_, evs) = submit(&client, &un).await;
    assert_eq!(end(&evs), EventType::Succeeded, "{}", last(&evs));
    assert_eq!(peering_objects(&m2).await, Vec::<String>::new(), "member-2 holds nothing of the peering");
    assert_eq!(peering_objects(&m1).await, Vec::<String>::new(), "member-1 holds nothing of the peering");
    assert!(Api::<Namespace>::all(m2.clone()).get_opt("liqo-tenant-member-1").await.unwrap().is_none());
    bed.stop().await;
}

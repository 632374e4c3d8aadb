//! What ships, checked against real parts: the Strimzi resources generated from
//! `topics/` are current and pass a real API server with the upstream Strimzi CRDs; the
//! Helm chart lints, renders, grants no more than each worker needs, passes the API
//! server's server-side dry run and installs (values schema, names, PDBs, monitoring only
//! where prometheus-operator is served, `helm test`, Kafka Secrets from Kafka's namespace);
//! the Strimzi external-listener overlay applies; docker-compose.yml runs every worker.
//!
//! `FERRY_BLESS=1 cargo test --test ship` regenerates strimzi/kafka-{topics,users,tenants}.yaml.

use std::path::{Path, PathBuf};
use std::process::Command;

// Each kind registers itself in its worker crate (ferry_task::kind): link every one Ferry
// ships, as the `ferry` binary does, so that the generated files cover them all.
use {ferry_cluster as _, ferry_deploy as _, ferry_offload as _, ferry_peer as _, ferry_plan as _, ferry_score as _};

use ferry_fleet::{Fleet, FleetOptions};
use ferry_kube::{Clusters, HUB};
use ferry_runtime::strimzi;
use ferry_runtime::tenants::Policy;
use ferry_runtime::{TaskKind, Topics};
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn docs(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .filter_map(|d| {
            let v: Option<Value> = serde::Deserialize::deserialize(d).expect("valid YAML");
            v.filter(|v| !v.is_null())
        })
        .collect()
}

#[test]
fn strimzi_files_are_generated_from_topics() {
    let topics = Topics::standard();
    let tenants = ferry_runtime::tenants::Policy::load(&root().join("examples/tenants.yaml")).unwrap();
    let generated = [
        ("kafka-topics.yaml", strimzi::to_yaml(&strimzi::kafka_topics(&topics, "ferry"), "Ferry's KafkaTopics")),
        ("kafka-users.yaml", strimzi::to_yaml(&strimzi::kafka_users(&topics, &tenants, "ferry"), "Ferry's KafkaUsers: one per worker, the tracker (operators) and the dashboard, least-privilege ACLs")),
        ("kafka-tenants.yaml", strimzi::to_yaml(&[strimzi::tenant_topics(&topics, &tenants, "ferry"), strimzi::tenant_users(&topics, &tenants, "ferry")].concat(), "The tenants of examples/tenants.yaml: their command topics and KafkaUsers")),
    ];
    for (file, text) in generated {
        let path = root().join("strimzi").join(file);
        if std::env::var_os("FERRY_BLESS").is_some() {
            std::fs::write(&path, &text).unwrap();
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(committed == text, "strimzi/{file} is out of date with topics/topics.yaml; run FERRY_BLESS=1 cargo test --test ship and commit");
    }
}

/// Kafka's `AclAuthorizer` on a user's allow-ACLs: a literal name or a prefix, the
/// operation or `All`; Read, Write, Delete and Alter imply Describe.
fn acl_allows(user: &Value, resource_type: &str, name: &str, op: &str) -> bool {
    user["spec"]["authorization"]["acls"].as_array().unwrap().iter().any(|a| {
        let r = &a["resource"];
        let rname = r["name"].as_str().unwrap();
        let matched = r["type"] == resource_type
            && match r["patternType"].as_str().unwrap() {
                "prefix" => name.starts_with(rname),
                _ => rname == name || rname == "*",
            };
        let ops: Vec<&str> = a["operations"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
        matched && (ops.contains(&op) || ops.contains(&"All") || (op == "Describe" && ops.iter().any(|o| ["Read", "Write", "Delete", "Alter"].contains(o))))
    })
}

/// Who may write what, for every principal and topic of an installation with tenants:
/// a tenant writes its own command topics only; a worker reads its own kind's tenant
/// topics; no tenant writes a kind's command topic, the task state or another tenant's.
#[test]
fn authorization_matrix_of_tenants_workers_and_tracker() {
    let topics = Topics::standard();
    let worker_kinds: Vec<TaskKind> = strimzi::worker_kinds().iter().map(|i| i.kind).collect();
    assert_eq!(worker_kinds, [TaskKind::CREATE_CLUSTER, TaskKind::PEER, TaskKind::OFFLOAD, TaskKind::DEPLOY, TaskKind::SCORE, TaskKind::PLAN]);
    // Tenants may submit plans: a plan's children are sent on the tenant's behalf.
    Policy::parse("tenants: {web: {plan: {}}}").unwrap();
    let policy = Policy::parse("tenants: {web: {deploy: {clusters: ['*']}, score: {}}, ops: {peer: {}}}").unwrap();
    let mut users = strimzi::kafka_users(&topics, &policy, "ferry");
    users.extend(strimzi::tenant_users(&topics, &policy, "ferry"));
    let by_name = |n: &str| users.iter().find(|u| u["metadata"]["name"] == n).unwrap_or_else(|| panic!("no user {n}"));
    let mut all_topics: Vec<String> = topics.all().iter().map(|t| t.name.clone()).collect();
    all_topics.extend(topics.tenant_topics(&policy).into_iter().map(|t| t.name));
    // Topics named like another tenant's that the policy does not have.
    all_topics.push(topics.tenant_command("mallory", TaskKind::DEPLOY).name);
    all_topics.push(topics.tenant_progress("mallory").name);
    for topic in &all_topics {
        let web = by_name("ferry-tenant-web");
        assert_eq!(acl_allows(web, "topic", topic, "Write"), topic.starts_with("ferry.tenants.web."), "web writes {topic}");
        let ops = by_name("ferry-tenant-ops");
        assert_eq!(acl_allows(ops, "topic", topic, "Write"), topic.starts_with("ferry.tenants.ops."), "ops writes {topic}");
        // A tenant reads its own tasks' events only: not every task's progress, not the
        // task state, not another tenant's copies.
        for (tenant, user) in [("web", web), ("ops", ops)] {
            assert_eq!(acl_allows(user, "topic", topic, "Read"), *topic == topics.tenant_progress(tenant).name, "{tenant} reads {topic}");
        }
        for kind in worker_kinds.iter().copied() {
            let w = by_name(&format!("ferry-worker-{kind}"));
            let tenant_topic = topic.starts_with("ferry.tenants.");
            if tenant_topic {
                let own = policy.tenants_of(kind).iter().any(|t| *topic == topics.tenant_command(t, kind).name);
                assert_eq!(acl_allows(w, "topic", topic, "Read"), own, "{kind} worker reads {topic}");
                assert!(!acl_allows(w, "topic", topic, "Write"), "{kind} worker writes {topic}");
            }
            if topic.starts_with("ferry.tenant-progress.") {
                // The copies of the tenants' tasks' events (any tenant's: a tenant's plan
                // may send a child of any kind); never read back.
                let its_tenant = policy.tenants().any(|t| *topic == topics.tenant_progress(t).name);
                assert_eq!(acl_allows(w, "topic", topic, "Write"), its_tenant, "{kind} worker writes {topic}");
                assert!(!acl_allows(w, "topic", topic, "Read"), "{kind} worker reads {topic}");
            }
            if topic.starts_with("ferry.task-state.") {
                let own = *topic == topics.task_state(kind).name;
                assert_eq!(acl_allows(w, "topic", topic, "Write"), own, "{kind} worker writes {topic}");
            }
            if topic.starts_with("ferry.commands.") {
                let own = *topic == topics.command(kind).name;
                assert_eq!(acl_allows(w, "topic", topic, "Read"), own, "{kind} worker reads {topic}");
                // The plan worker submits and reverts its children: it writes the
                // other production kinds' command topics (never the test kind's).
                let child = kind == TaskKind::PLAN && worker_kinds.iter().any(|k| *topic == topics.command(*k).name);
                if !own {
                    assert_eq!(acl_allows(w, "topic", topic, "Write"), child, "{kind} worker writes {topic}");
                }
            }
        }
        if topic.starts_with("ferry.task-state.") {
            for tenant in [web, ops] {
                assert!(!acl_allows(tenant, "topic", topic, "Write"), "a tenant writes {topic}");
            }
        }
        let tracker = by_name("ferry-tracker");
        assert!(!acl_allows(tracker, "topic", topic, "Write") || topic.starts_with("ferry.commands."), "the tracker writes {topic}");
        // The dashboard has its own principal: it writes commands (its actions), reads what
        // its pages show, and no dead letter (a producer's raw bytes) or tenant topic.
        let dashboard = by_name(strimzi::DASHBOARD_USER);
        assert_eq!(acl_allows(dashboard, "topic", topic, "Write"), topic.starts_with("ferry.commands.") && !topic.ends_with(".test"), "the dashboard writes {topic}");
        let shown = *topic == topics.progress().name
            || *topic == topics.scores().name
            || (topic.starts_with("ferry.task-state.") && *topic != topics.task_state(TaskKind::TEST).name);
        assert_eq!(acl_allows(dashboard, "topic", topic, "Read"), shown, "the dashboard reads {topic}");
    }
    // Each gateway's group belongs to its kind's worker only.
    assert!(acl_allows(by_name("ferry-worker-deploy"), "group", &strimzi::gateway_group(TaskKind::DEPLOY), "Read"));
    assert!(!acl_allows(by_name("ferry-worker-peer"), "group", &strimzi::gateway_group(TaskKind::DEPLOY), "Read"));
    assert!(!acl_allows(by_name("ferry-tenant-web"), "group", &strimzi::gateway_group(TaskKind::DEPLOY), "Read"));
}

#[test]
fn every_worker_reads_only_its_own_command_topic() {
    let topics = Topics::standard();
    let users = strimzi::kafka_users(&topics, &Policy::default(), "ferry");
    let worker_kinds: Vec<TaskKind> = strimzi::worker_kinds().iter().map(|i| i.kind).collect();
    assert_eq!(users.len(), worker_kinds.len() + 2);
    for (kind, u) in worker_kinds.iter().zip(&users) {
        let reads: Vec<&str> = u["spec"]["authorization"]["acls"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["resource"]["type"] == "topic" && a["operations"].as_array().unwrap().iter().any(|o| o == "Read"))
            .filter_map(|a| a["resource"]["name"].as_str())
            .filter(|n| n.contains("commands"))
            .collect();
        assert_eq!(reads, [topics.command(*kind).name.as_str()], "{kind}");
    }
    let compacted: Vec<String> = strimzi::kafka_topics(&topics, "ferry")
        .iter()
        .filter(|t| t["spec"]["config"]["cleanup.policy"] == "compact")
        .map(|t| t["spec"]["topicName"].as_str().unwrap().to_owned())
        .collect();
    let mut expected: Vec<String> = worker_kinds.iter().map(|k| format!("ferry.task-state.{k}")).collect();
    expected.push("ferry.scores".into());
    assert_eq!(compacted, expected);
}

fn helm() -> Option<PathBuf> {
    let cache = std::env::var_os("FERRY_CACHE").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/ferry"));
    // scripts/install-helm.sh puts it there.
    let bin = cache.join("helm-3.17.3/helm");
    bin.exists().then_some(bin)
}

fn render_chart(helm: &Path, extra: &[&str]) -> Vec<Value> {
    let chart = root().join("helm/ferry");
    let lint = Command::new(helm).args(["lint", "--strict"]).arg(&chart).output().unwrap();
    assert!(lint.status.success(), "helm lint: {}", String::from_utf8_lossy(&lint.stdout));
    let out = Command::new(helm)
        .args(["template", "ferry"])
        .arg(&chart)
        .args(["--namespace", "ferry", "--kube-version", "1.20.0"])
        .args(extra)
        .output()
        .unwrap();
    assert!(out.status.success(), "helm template: {}", String::from_utf8_lossy(&out.stderr));
    docs(&String::from_utf8_lossy(&out.stdout))
}

fn kinds(docs: &[Value]) -> Vec<String> {
    docs.iter().map(|d| d["kind"].as_str().unwrap_or("").to_owned()).collect()
}

/// The verbs on Secrets each namespace's Roles give worker `kind` (through RoleBindings of
/// its ServiceAccount), sorted.
fn secret_grants(docs: &[Value], kind: &str) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut out = std::collections::BTreeMap::<String, Vec<String>>::new();
    let sa = format!("ferry-{kind}");
    for b in docs.iter().filter(|d| d["kind"] == "RoleBinding") {
        if !b["subjects"].as_array().unwrap().iter().any(|s| s["kind"] == "ServiceAccount" && s["name"] == sa.as_str() && s["namespace"] == "ferry") {
            continue;
        }
        let ns = b["metadata"]["namespace"].as_str().expect("a RoleBinding's namespace");
        assert_eq!(b["roleRef"]["kind"], "Role", "{sa} is bound to a Role, not a ClusterRole, in {ns}");
        let role = docs
            .iter()
            .find(|d| d["kind"] == "Role" && d["metadata"]["name"] == b["roleRef"]["name"] && d["metadata"]["namespace"] == ns)
            .unwrap_or_else(|| panic!("Role {} in {ns}", b["roleRef"]["name"]));
        for rule in role["rules"].as_array().unwrap() {
            assert_eq!(rule["apiGroups"], serde_json::json!([""]));
            assert_eq!(rule["resources"], serde_json::json!(["secrets"]), "a worker's Roles grant Secrets only");
            let verbs = out.entry(ns.to_owned()).or_default();
            verbs.extend(rule["verbs"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_owned()));
            verbs.sort();
            verbs.dedup();
        }
    }
    out
}

/// Each worker may get kubeconfig Secrets in exactly `cluster_ns` (create-cluster also
/// list and watch them: it waits for its cluster's), deploy get app Secrets in `app_ns`,
/// nothing else on Secrets anywhere, and FERRY_CLUSTER_NAMESPACES names `cluster_ns`.
fn assert_secret_grants(docs: &[Value], cluster_ns: &[&str], app_ns: &[&str]) {
    for kind in ["create-cluster", "peer", "offload", "deploy", "score"] {
        let reads: Vec<String> = if kind == "create-cluster" { vec!["get".into(), "list".into(), "watch".into()] } else { vec!["get".into()] };
        let mut want: std::collections::BTreeMap<String, Vec<String>> = cluster_ns.iter().map(|n| ((*n).to_owned(), reads.clone())).collect();
        if kind == "deploy" {
            for n in app_ns {
                let v = want.entry((*n).to_owned()).or_default();
                v.push("get".into());
                v.sort();
                v.dedup();
            }
        }
        assert_eq!(secret_grants(docs, kind), want, "the Secrets worker {kind} may touch, by namespace");
        let dep = docs.iter().find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == format!("ferry-{kind}").as_str()).unwrap();
        let env = dep["spec"]["template"]["spec"]["containers"][0]["env"].as_array().unwrap();
        let named = env.iter().find(|e| e["name"] == "FERRY_CLUSTER_NAMESPACES").expect("FERRY_CLUSTER_NAMESPACES");
        assert_eq!(named["value"], cluster_ns.join(",").as_str(), "worker {kind} is told the namespaces its Roles are in");
        assert_eq!(named["name"], ferry_kube::clusters::NAMESPACES_ENV);
    }
}

#[test]
fn chart_grants_each_worker_only_what_it_touches() {
    let Some(helm) = helm() else {
        ferry_runtime::report::missing_prerequisite("helm is not installed (scripts/install-helm.sh)");
        return;
    };
    let docs = render_chart(&helm, &[]);
    let k = kinds(&docs);
    for kind in ["create-cluster", "peer", "offload", "deploy", "score"] {
        let name = format!("ferry-{kind}");
        for want in ["Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "PodDisruptionBudget"] {
            assert!(docs.iter().any(|d| d["kind"] == want && d["metadata"]["name"] == name.as_str()), "{want} {name} missing");
        }
        let dep = docs.iter().find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == name.as_str()).unwrap();
        let pod = &dep["spec"]["template"]["spec"];
        assert_eq!(pod["serviceAccountName"], name.as_str());
        let c = &pod["containers"][0];
        assert_eq!(c["args"], serde_json::json!(["worker", kind]));
        assert_eq!(c["securityContext"]["runAsNonRoot"], true);
        assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
        assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
        let env = c["env"].as_array().unwrap();
        let user = env.iter().find(|e| e["name"] == "FERRY_KAFKA_SASL_USERNAME").unwrap();
        assert_eq!(user["value"], format!("ferry-worker-{kind}").as_str(), "each worker has its own Kafka user");
        let pw = env.iter().find(|e| e["name"] == "FERRY_KAFKA_SASL_PASSWORD").unwrap();
        assert_eq!(pw["valueFrom"]["secretKeyRef"]["name"], format!("ferry-worker-{kind}").as_str(), "the password comes from the KafkaUser's Secret");
    }
    // The plan worker talks only to Kafka: its own Kafka user, and no RBAC, kubeconfig,
    // hub credentials or service-account token at all.
    let plan = docs.iter().find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "ferry-plan").expect("Deployment ferry-plan");
    let pod = &plan["spec"]["template"]["spec"];
    assert_eq!(pod["containers"][0]["args"], serde_json::json!(["worker", "plan"]));
    assert_eq!(pod["automountServiceAccountToken"], false, "no token in the plan worker's Pods");
    let env = pod["containers"][0]["env"].as_array().unwrap();
    assert!(env.iter().any(|e| e["name"] == "FERRY_KAFKA_SASL_USERNAME" && e["value"] == "ferry-worker-plan"));
    assert!(!env.iter().any(|e| e["name"] == "FERRY_CLUSTER_NAMESPACES" || e["name"] == "FERRY_HUB_KUBECONFIG"), "{env:?}");
    for d in docs.iter().filter(|d| ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"].contains(&d["kind"].as_str().unwrap_or_default())) {
        assert!(!d["metadata"]["name"].as_str().unwrap().starts_with("ferry-plan"), "the plan worker has no RBAC: {} {}", d["kind"], d["metadata"]["name"]);
    }
    // Least privilege: no wildcard, no cluster-admin, and only the deploy and score workers
    // may touch ManifestWorks.
    for role in docs.iter().filter(|d| d["kind"] == "ClusterRole") {
        for rule in role["rules"].as_array().unwrap() {
            for field in ["apiGroups", "resources", "verbs"] {
                assert!(!rule[field].as_array().unwrap().iter().any(|v| v == "*"), "wildcard in {}: {rule}", role["metadata"]["name"]);
            }
            let touches_works = rule["resources"].as_array().unwrap().iter().any(|r| r == "manifestworks");
            let name = role["metadata"]["name"].as_str().unwrap();
            assert!(!touches_works || name == "ferry-deploy" || name == "ferry-score", "{name} should not touch ManifestWorks");
            if name == "ferry-create-cluster" && rule["resources"].as_array().unwrap().iter().any(|r| r == "configmaps") {
                // It reads kube-public/cluster-info for joins, and writes no ConfigMap.
                assert_eq!(rule["verbs"], serde_json::json!(["get"]), "{rule}");
                assert_eq!(rule["resourceNames"], serde_json::json!(["cluster-info"]), "{rule}");
            }
            assert!(!rule["resources"].as_array().unwrap().iter().any(|r| r == "clusterresourcesets"), "{name}: no worker makes ClusterResourceSets");
        }
    }
    for b in docs.iter().filter(|d| d["kind"] == "ClusterRoleBinding") {
        assert_ne!(b["roleRef"]["name"], "cluster-admin");
    }
    // Secrets: no ClusterRole grants them (any verb); each worker reads kubeconfig Secrets
    // through a Role in each cluster namespace, with the verbs it uses, and is told those
    // namespaces. Deploy reads app Secrets only in the app namespaces that are listed.
    for role in docs.iter().filter(|d| d["kind"] == "ClusterRole") {
        for rule in role["rules"].as_array().unwrap() {
            assert!(!rule["resources"].as_array().unwrap().iter().any(|r| r == "secrets"), "ClusterRole {} grants Secrets: {rule}", role["metadata"]["name"]);
        }
    }
    let values: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(root().join("helm/ferry/values.yaml")).unwrap()).unwrap();
    let default_ns: Vec<&str> = values["clusterNamespaces"].as_array().expect("values clusterNamespaces").iter().map(|n| n.as_str().unwrap()).collect();
    assert!(!default_ns.is_empty());
    assert_secret_grants(&docs, &default_ns, &[]);
    let more = render_chart(&helm, &["--set", "clusterNamespaces={fleet,edge}", "--set", "workers.deploy.appSecretNamespaces={shop}"]);
    assert_secret_grants(&more, &["fleet", "edge"], &["shop"]);
    let bad = Command::new(&helm).args(["template", "ferry"]).arg(root().join("helm/ferry")).args(["--set", "clusterNamespaces={Bad_ns}"]).output().unwrap();
    // values.schema.json refuses it first; the template's own check stays for the values it cannot see.
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("clusterNamespaces"), "a bad namespace fails the chart, naming the value");
    assert!(!k.iter().any(|k| k == "ServiceMonitor"), "no ServiceMonitor where its CRD is not served (chart_monitoring_needs_the_prometheus_operator)");
    let dash = docs.iter().find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "ferry-dashboard").expect("dashboard");
    assert_eq!(dash["spec"]["template"]["spec"]["automountServiceAccountToken"], false, "the dashboard needs no API access");
    // Turning a worker off removes all of its objects.
    let fewer = render_chart(&helm, &["--set", "workers.peer.enabled=false"]);
    assert!(!fewer.iter().any(|d| d["metadata"]["name"] == "ferry-peer"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strimzi_resources_and_chart_pass_the_api_server() {
    if !ferry_fleet::binaries::Binaries::installed() {
        ferry_runtime::report::missing_prerequisite("the test bed is not installed (scripts/install-testbed.sh)");
        return;
    }
    let fleet = Fleet::start(FleetOptions { controllers: false, ..FleetOptions::hub_and(0) }).await.unwrap();
    let clusters = Clusters::new(fleet.hub().client().await.unwrap());
    for ns in ["kafka", "ferry", "fleet"] {
        let doc = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        clusters.apply(HUB, &doc, "ferry-test").await.unwrap();
    }
    let crds = root().join("../shared/crds/strimzi");
    if crds.is_dir() {
        ferry_fleet::crds::install_dir(&clusters.hub().clone(), &crds).await.unwrap();
        let mut checked = 0;
        for file in ["kafka.yaml", "kafka-topics.yaml", "kafka-users.yaml", "kafka-tenants.yaml"] {
            let text = std::fs::read_to_string(root().join("strimzi").join(file)).unwrap();
            for mut d in docs(&text) {
                d["metadata"]["namespace"] = "kafka".into();
                clusters.dry_run_apply(HUB, &d, "ferry-test").await.unwrap_or_else(|e| panic!("strimzi/{file} {}: {e}", d["metadata"]["name"]));
                checked += 1;
            }
        }
        assert!(checked >= 3 + 6 + 6, "every Strimzi resource was checked ({checked})");
        // The external-listener overlay is a JSON Patch of the Kafka: it applies to
        // kafka.yaml's Kafka, and the result passes the CRD.
        let kafka = docs(&std::fs::read_to_string(root().join("strimzi/kafka.yaml")).unwrap()).into_iter().find(|d| d["kind"] == "Kafka").unwrap();
        let mut kafka = kafka;
        kafka["metadata"]["namespace"] = "kafka".into();
        clusters.apply(HUB, &kafka, "ferry-test").await.unwrap();
        let overlay: ferry_fleet::admission::JsonPatch = serde_yaml_ng::from_str(&std::fs::read_to_string(root().join("strimzi/overlays/kafka-external-listener.yaml")).unwrap()).expect("the overlay is a JSON Patch");
        let ar = kube::core::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk("kafka.strimzi.io", "v1", "Kafka"));
        let api = kube::api::Api::<kube::api::DynamicObject>::namespaced_with(clusters.hub().clone(), "kafka", &ar);
        let patched = api
            .patch("ferry", &kube::api::PatchParams { dry_run: true, ..Default::default() }, &kube::api::Patch::Json::<()>(overlay))
            .await
            .unwrap_or_else(|e| panic!("strimzi/overlays/kafka-external-listener.yaml does not apply to the Kafka: {e}"));
        let listeners = patched.data["spec"]["kafka"]["listeners"].as_array().unwrap();
        let external = listeners.iter().find(|l| l["name"] == "external").expect("the external listener");
        assert_eq!((&external["tls"], &external["authentication"]["type"]), (&Value::Bool(true), &Value::from("scram-sha-512")), "SCRAM over TLS");
        assert!(["loadbalancer", "nodeport"].contains(&external["type"].as_str().unwrap()), "{external}");
        assert_eq!(listeners.len(), 3, "the internal listeners stay");
    } else {
        ferry_runtime::report::missing_prerequisite("../shared/crds/strimzi (the upstream Strimzi CRDs) is absent: Strimzi resources not validated");
    }
    let Some(helm) = helm() else {
        ferry_runtime::report::missing_prerequisite("helm is not installed (scripts/install-helm.sh): chart not validated");
        return;
    };
    // The chart's test Pod runs as the namespace's default ServiceAccount, which a cluster's
    // controller manager makes (none runs here); it mounts no token, so the account is all
    // admission looks up.
    clusters.apply(HUB, &serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": "ferry"}}), "ferry-test").await.unwrap();
    // The test bed has no prometheus-operator CRDs: the chart renders no ServiceMonitor.
    let cluster_scoped = ["ClusterRole", "ClusterRoleBinding", "Namespace"];
    for mut d in render_chart(&helm, &["--set", "serviceMonitor.enabled=false"]) {
        if !cluster_scoped.contains(&d["kind"].as_str().unwrap_or("")) && d["metadata"]["namespace"].is_null() {
            d["metadata"]["namespace"] = "ferry".into();
        }
        clusters.dry_run_apply(HUB, &d, "ferry-test").await.unwrap_or_else(|e| panic!("chart {} {}: {e}", d["kind"], d["metadata"]["name"]));
    }
    // A real `helm install` where Strimzi wrote the KafkaUser Secrets and the cluster CA in
    // Kafka's namespace: the chart copies what the pods read into its own (helm's lookup
    // against this API server), skips the ServiceMonitor and PrometheusRule whose CRDs
    // are not served here, and its notes say where the Secrets came from.
    let users = ["ferry-dashboard", "ferry-worker-create-cluster", "ferry-worker-peer", "ferry-worker-offload", "ferry-worker-deploy", "ferry-worker-score", "ferry-worker-plan"];
    let secret = |ns: &str, name: &str| serde_json::json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": ns}});
    for u in users {
        let mut s = secret("kafka", u);
        s["stringData"] = serde_json::json!({"password": format!("pw-{u}"), "sasl.jaas.config": "not copied"});
        clusters.apply(HUB, &s, "ferry-test").await.unwrap();
    }
    let mut ca = secret("kafka", "ferry-cluster-ca-cert");
    ca["stringData"] = serde_json::json!({"ca.crt": "CA", "ca.p12": "not copied"});
    clusters.apply(HUB, &ca, "ferry-test").await.unwrap();
    let home = tempfile::tempdir().unwrap();
    let kubeconfig = home.path().join("kubeconfig");
    std::fs::write(&kubeconfig, fleet.hub().kubeconfig_inline().unwrap()).unwrap();
    let install = Command::new(&helm)
        .args(["install", "ferry"])
        .arg(root().join("helm/ferry"))
        .args(["--namespace", "ferry", "--kubeconfig"])
        .arg(&kubeconfig)
        .args(["--set", "kafka.userSecretsNamespace=kafka", "--set", "kafka.caSecretNamespace=kafka"])
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&install.stdout);
    assert!(install.status.success(), "helm install: {}\n{said}", String::from_utf8_lossy(&install.stderr));
    assert!(said.contains("helm test ferry -n ferry --logs") && said.contains("copied by this release from namespace kafka"), "the notes: {said}");
    assert!(said.contains("serves no monitoring.coreos.com/v1 ServiceMonitor"), "the notes: {said}");
    let data = async |ns: &str, name: &str| clusters.get(HUB, &secret(ns, name)).await.unwrap().map(|s| s.data["data"].clone()).unwrap_or_else(|| panic!("no Secret {ns}/{name}"));
    for u in users {
        let original = data("kafka", u).await;
        assert_eq!(data("ferry", u).await, serde_json::json!({"password": original["password"]}), "{u}: the password, only");
    }
    let original = data("kafka", "ferry-cluster-ca-cert").await;
    assert_eq!(data("ferry", "ferry-cluster-ca-cert").await, serde_json::json!({"ca.crt": original["ca.crt"]}), "the CA certificate, only");
    let deployed = clusters.get(HUB, &serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "ferry-peer", "namespace": "ferry"}})).await.unwrap();
    assert!(deployed.is_some(), "the release is installed");
}

/// The dashboard's chart: read-only unless a token Secret is named (then mounted and
/// given as the token file), probes on /healthz and /readyz, a NetworkPolicy that opens
/// only the page's port.
#[test]
fn chart_dashboard_is_read_only_unless_a_token_secret_is_named() {
    let Some(helm) = helm() else {
        ferry_runtime::report::missing_prerequisite("helm is not installed (scripts/install-helm.sh)");
        return;
    };
    let deployment = |docs: &[Value]| docs.iter().find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "ferry-dashboard").cloned().unwrap();
    let plain = render_chart(&helm, &[]);
    let c = &deployment(&plain)["spec"]["template"]["spec"]["containers"][0];
    assert!(!c["env"].as_array().unwrap().iter().any(|e| e["name"] == "FERRY_DASHBOARD_TOKEN_FILE"), "read-only by default");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    let policy = plain.iter().find(|d| d["kind"] == "NetworkPolicy").expect("a NetworkPolicy");
    assert_eq!(policy["spec"]["ingress"][0]["ports"], serde_json::json!([{"port": "http", "protocol": "TCP"}]));
    let with_token = render_chart(&helm, &["--set", "dashboard.tokenSecret=dash-token", "--set", "dashboard.allowedHosts={ferry.example.com}"]);
    let d = deployment(&with_token);
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    let env = |name: &str| c["env"].as_array().unwrap().iter().find(|e| e["name"] == name).map(|e| e["value"].clone());
    assert_eq!(env("FERRY_DASHBOARD_TOKEN_FILE"), Some(serde_json::json!("/etc/ferry/dashboard-token/token")));
    assert_eq!(env("FERRY_DASHBOARD_ALLOWED_HOSTS"), Some(serde_json::json!("ferry.example.com")));
    assert!(d["spec"]["template"]["spec"]["volumes"].as_array().unwrap().iter().any(|v| v["secret"]["secretName"] == "dash-token"));
}

#[test]
fn compose_runs_kafka_the_topics_every_worker_and_the_dashboard() {
    let text = std::fs::read_to_string(root().join("docker-compose.yml")).unwrap();
    let mut v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("docker-compose.yml is YAML");
    v.apply_merge().expect("merge keys resolve");
    let v: Value = serde_json::to_value(v).unwrap();
    let services = v["services"].as_object().expect("services");
    let kafka = &services["kafka"];
    assert_eq!(kafka["environment"]["KAFKA_PROCESS_ROLES"], "broker,controller", "KRaft mode");
    let listeners = kafka["environment"]["KAFKA_ADVERTISED_LISTENERS"].as_str().unwrap();
    for kind in ["create-cluster", "peer", "offload", "deploy", "score", "plan"] {
        let s = &services[&format!("worker-{kind}")];
        assert_eq!(s["command"], serde_json::json!(["worker", kind]));
        let brokers = s["environment"]["FERRY_BROKERS"].as_str().unwrap();
        assert!(listeners.contains(brokers), "worker-{kind} uses {brokers}, which Kafka advertises");
        assert_eq!(s["depends_on"]["topics"]["condition"], "service_completed_successfully");
    }
    assert_eq!(services["dashboard"]["command"][0], "dashboard");
    assert_eq!(services["topics"]["command"][0], "topics");
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    assert!(dockerfile.lines().any(|l| l.trim() == "USER 65532:65532"), "the image runs as non-root");
}

/// Metric names as a worker's /metrics exposes them (TYPE lines; samples add suffixes).
fn exported_metrics() -> Vec<String> {
    let metrics = ferry_runtime::metrics::Metrics::with_one_sample_each();
    // What the workers that wait on clusters add (their handlers' gauges).
    metrics.report_gauges(Box::new(|| ferry_kube::Watches::new().gauges()));
    let exposition = metrics.encode();
    let exported: Vec<String> = exposition.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.split_whitespace().next()).map(str::to_owned).collect();
    assert!(exported.len() >= 5, "{exposition}");
    exported
}

/// Every `ferry_*` name in a PromQL expression is one the workers export (and there is one).
fn assert_names_exported(expr: &str, exported: &[String]) {
    let names: Vec<&str> = expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| w.starts_with("ferry_")).collect();
    assert!(!names.is_empty(), "{expr} names no Ferry metric");
    for n in names {
        let base = ["_total", "_bucket", "_sum", "_count"].iter().fold(n, |n, s| n.strip_suffix(s).unwrap_or(n));
        assert!(exported.iter().any(|e| e == base), "{expr}: {n} is not exported (exported: {exported:?})");
    }
}

/// The Grafana dashboard queries only what the workers export, and every query is scoped
/// by the dashboard's `namespace` and `job` variables (one Grafana, many installations).
#[test]
fn grafana_dashboard_queries_name_metrics_the_workers_export() {
    let text = std::fs::read_to_string(root().join("helm/ferry/dashboards/ferry.json")).unwrap();
    let dash: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let exported = exported_metrics();
    let variables: Vec<&str> = dash["templating"]["list"].as_array().unwrap().iter().filter_map(|v| v["name"].as_str()).collect();
    for v in ["datasource", "namespace", "job"] {
        assert!(variables.contains(&v), "the dashboard has a ${v} variable: {variables:?}");
    }
    let mut queries = 0;
    for panel in dash["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            queries += 1;
            assert_names_exported(expr, &exported);
            for scope in ["namespace=~\"$namespace\"", "job=~\"$job\""] {
                assert!(expr.contains(scope), "{expr} is not scoped by {scope}");
            }
        }
    }
    assert!(queries >= 8, "tasks by state, step latency, retries, dead letters, consumer lag, in flight, task duration");
    assert!(text.contains("ferry_consumer_lag_records"), "lag under its name with units");
}

#[test]
fn dockerfile_passes_the_linter() {
    let cache = std::env::var_os("FERRY_CACHE").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/ferry"));
    let lint = cache.join("dockerfilelint-1.8.0/node_modules/.bin/dockerfilelint");
    if !lint.exists() {
        ferry_runtime::report::missing_prerequisite("dockerfilelint is not installed (scripts/install-dockerfilelint.sh)");
        return;
    }
    let out = Command::new(&lint).arg(root().join("Dockerfile")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
}

/// The chart's RBAC is what OCM's hub admission asks of the flows: the create-cluster
/// worker's identity may create an accepted ManagedCluster in a set (accept and join), and
/// the peer worker's may move a cluster into a set (join), with the test bed's OCM
/// webhooks deciding as upstream's do (testing/ferry-fleet/tests/admission.rs shows them
/// refusing the chart's earlier rules).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_rbac_passes_ocm_admission() {
    if !ferry_fleet::binaries::Binaries::installed() {
        ferry_runtime::report::missing_prerequisite("the test bed is not installed (scripts/install-testbed.sh)");
        return;
    }
    let Some(helm) = helm() else {
        ferry_runtime::report::missing_prerequisite("helm is not installed (scripts/install-helm.sh)");
        return;
    };
    let Some(shared) = ferry_fleet::crds::shared_dir() else {
        ferry_runtime::report::missing_prerequisite("../shared/crds (the upstream CRDs) is missing");
        return;
    };
    use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
    let fleet = Fleet::start(FleetOptions { controllers: false, ..FleetOptions::hub_and(0) }).await.unwrap();
    let admin = fleet.hub().client().await.unwrap();
    ferry_fleet::crds::install_dir(&admin, &shared.join("open-cluster-management")).await.unwrap();
    // OCM's webhooks, the mutating one too: the cluster starts in `default`, so moving it
    // needs `join` on that set as well.
    let server = ferry_fleet::webhooks_ocm::serve(&admin).await.unwrap();
    let clusters = Clusters::new(admin.clone());
    for d in render_chart(&helm, &[]).into_iter().filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "ClusterRoleBinding") {
        clusters.apply(HUB, &d, "ferry-test").await.unwrap_or_else(|e| panic!("{} {}: {e}", d["kind"], d["metadata"]["name"]));
    }
    let sa = |kind: &str| format!("system:serviceaccount:ferry:ferry-{kind}");
    let groups = ["system:serviceaccounts", "system:serviceaccounts:ferry", "system:authenticated"];
    let ar = kube::core::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk("cluster.open-cluster-management.io", "v1", "ManagedCluster"));
    let as_create = Api::<DynamicObject>::all_with(fleet.hub().client_as(&sa("create-cluster"), &groups).await.unwrap(), &ar);
    let as_peer = Api::<DynamicObject>::all_with(fleet.hub().client_as(&sa("peer"), &groups).await.unwrap(), &ar);
    // A klusterlet made the ManagedCluster (not accepted); the create-cluster worker
    // accepts it into its set, as `clusteradm accept` does.
    let mc: DynamicObject = serde_json::from_value(serde_json::json!({"apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster",
        "metadata": {"name": "edge-1"}, "spec": {"hubAcceptsClient": false}}))
    .unwrap();
    Api::<DynamicObject>::all_with(admin.clone(), &ar).create(&PostParams::default(), &mc).await.unwrap();
    let accept = Patch::Merge(serde_json::json!({"metadata": {"labels": {ferry_kube::vocab::ocm::CLUSTERSET_LABEL: "edge"}}, "spec": {"hubAcceptsClient": true}}));
    // RBAC may take a moment to see the bindings just written; admission's answer is final.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        match as_create.patch("edge-1", &PatchParams::default(), &accept).await {
            Ok(_) => break,
            Err(kube::Error::Api(e)) if e.message.contains("admission webhook") || std::time::Instant::now() >= deadline => {
                panic!("the create-cluster worker's chart RBAC cannot accept a cluster: {}", e.message)
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(200)).await,
        }
    }
    // ...and approves its agent's CSR: listing, the approval subresource, `approve` on the signer.
    let review = |verb: &str, resource: &str, sub: &str, name: &str| {
        serde_json::json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {"user": sa("create-cluster"), "groups": groups,
            "resourceAttributes": {"group": "certificates.k8s.io", "resource": resource, "subresource": sub, "verb": verb, "name": name}}})
    };
    let sar = kube::core::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk("authorization.k8s.io", "v1", "SubjectAccessReview"));
    let reviews = Api::<DynamicObject>::all_with(admin.clone(), &sar);
    for (verb, resource, sub, name) in [("list", "certificatesigningrequests", "", ""), ("update", "certificatesigningrequests", "approval", "edge-1-x"),
        ("approve", "signers", "", "kubernetes.io/kube-apiserver-client")] {
        let r: DynamicObject = serde_json::from_value(review(verb, resource, sub, name)).unwrap();
        let got = reviews.create(&PostParams::default(), &r).await.unwrap();
        assert_eq!(got.data["status"]["allowed"], true, "create-cluster may {verb} {resource}/{sub} {name}");
    }
    // As the peer worker moves a cluster into a Submariner set.
    let patch = Patch::Merge(serde_json::json!({"metadata": {"labels": {ferry_kube::vocab::ocm::CLUSTERSET_LABEL: "tunnels"}}}));
    as_peer.patch("edge-1", &PatchParams::default(), &patch).await.unwrap_or_else(|e| panic!("the peer worker's chart RBAC cannot move a cluster into a set: {e}"));
    drop(server);
}

/// The chart's Secrets RBAC as the API server decides it: each worker's identity reads a
/// cluster's kubeconfig Secret through `ferry_kube::Clusters` in the cluster namespace
/// (its Role's `get` is all it takes), and may read no Secret elsewhere nor list or watch
/// Secrets across namespaces; only create-cluster may list and watch them there, and no
/// worker may write one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_rbac_reads_kubeconfig_secrets_only_in_cluster_namespaces() {
    if !ferry_fleet::binaries::Binaries::installed() {
        ferry_runtime::report::missing_prerequisite("the test bed is not installed (scripts/install-testbed.sh)");
        return;
    }
    let Some(helm) = helm() else {
        ferry_runtime::report::missing_prerequisite("helm is not installed (scripts/install-helm.sh)");
        return;
    };
    use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
    let fleet = Fleet::start(FleetOptions { controllers: false, ..FleetOptions::hub_and(0) }).await.unwrap();
    let admin = fleet.hub().client().await.unwrap();
    let clusters = Clusters::new(admin.clone());
    for ns in ["ferry", "fleet"] {
        clusters.apply(HUB, &serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}), "ferry-test").await.unwrap();
    }
    for d in render_chart(&helm, &[]).into_iter().filter(|d| ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"].contains(&d["kind"].as_str().unwrap_or(""))) {
        clusters.apply(HUB, &d, "ferry-test").await.unwrap_or_else(|e| panic!("{} {}: {e}", d["kind"], d["metadata"]["name"]));
    }
    // A Cluster API kubeconfig Secret in the cluster namespace (its Cluster need not exist:
    // no garbage collector runs here), and the same planted in `default`.
    let kubeconfig = fleet.hub().kubeconfig_inline().unwrap();
    let owner = serde_json::json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "name": "c1", "uid": "6f1d3c58-0c53-4a53-9d0e-1b2f3a4c5d6e"});
    for ns in ["fleet", "default"] {
        let s = ferry_fleet::fleet::kubeconfig_secret_owned("c1", &kubeconfig, owner.clone());
        Api::<k8s_openapi::api::core::v1::Secret>::namespaced(admin.clone(), ns)
            .patch("c1-kubeconfig", &PatchParams::apply("ferry-test").force(), &Patch::Apply(&s))
            .await
            .unwrap();
    }
    let sa = |kind: &str| format!("system:serviceaccount:ferry:ferry-{kind}");
    let groups = ["system:serviceaccounts", "system:serviceaccounts:ferry", "system:authenticated"];
    let sar = kube::core::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk("authorization.k8s.io", "v1", "SubjectAccessReview"));
    let reviews = Api::<DynamicObject>::all_with(admin.clone(), &sar);
    for kind in ["create-cluster", "peer", "offload", "deploy", "score"] {
        // As the worker runs: its identity, the namespaces the chart tells it.
        let as_worker = Clusters::with_namespaces(fleet.hub().client_as(&sa(kind), &groups).await.unwrap(), ["fleet"]);
        // RBAC may take a moment to see the bindings just written.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            match as_worker.kubeconfig_secret("c1").await {
                Ok(found) => break assert_eq!(found, ("fleet".to_owned(), "c1-kubeconfig".to_owned())),
                Err(e) if std::time::Instant::now() >= deadline => panic!("worker {kind} cannot read c1's kubeconfig Secret in fleet: {e}"),
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(200)).await,
            }
        }
        as_worker.client("c1").await.unwrap_or_else(|e| panic!("worker {kind}: {e}"));
        let watches = kind == "create-cluster";
        if watches {
            // Its kubeconfig wait, a shared watch of the namespace, needs the Role only (a
            // watch across namespaces with a field selector would be refused).
            let absent = || ferry_kube::Check::Pending("absent".to_owned());
            ferry_kube::Watches::new()
                .wait_object::<k8s_openapi::api::core::v1::Secret, ()>(ferry_kube::HUB, as_worker.hub(), Some("fleet"), "c1-kubeconfig", std::time::Duration::from_secs(60), |s| {
                    if s.is_some() { ferry_kube::Check::Done(()) } else { absent() }
                })
                .await
                .unwrap_or_else(|e| panic!("worker {kind} cannot watch its kubeconfig Secret: {e}"));
        }
        // (namespace, verb, allowed): "" is every namespace (a list or watch across
        // namespaces, even with a namespace field selector, is authorized as that).
        for (ns, verb, allowed) in [
            ("fleet", "get", true),
            ("fleet", "list", watches),
            ("fleet", "watch", watches),
            ("fleet", "create", false),
            ("fleet", "patch", false),
            ("fleet", "update", false),
            ("fleet", "delete", false),
            ("default", "get", false),
            ("kube-system", "get", false),
            ("ferry", "get", false),
            ("", "get", false),
            ("", "list", false),
            ("", "watch", false),
        ] {
            let r: DynamicObject = serde_json::from_value(serde_json::json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                "spec": {"user": sa(kind), "groups": groups, "resourceAttributes": {"resource": "secrets", "namespace": ns, "verb": verb, "name": if verb == "get" { "c1-kubeconfig" } else { "" }}}}))
            .unwrap();
            let got = reviews.create(&PostParams::default(), &r).await.unwrap();
            assert_eq!(got.data["status"]["allowed"].as_bool().unwrap_or(false), allowed, "worker {kind} {verb} secrets in {ns:?}");
        }
    }
}

/// The chart's `tenants` (examples/tenants.yaml as a values file) reach every worker as the
/// policy file it reads, unchanged; without tenants there is no policy at all.
#[test]
fn chart_gives_every_worker_the_tenant_policy() {
    let Some(helm) = helm() else {
        ferry_runtime::report::missing_prerequisite("helm is not installed (scripts/install-helm.sh)");
        return;
    };
    let example = root().join("examples/tenants.yaml");
    let docs = render_chart(&helm, &["-f", example.to_str().unwrap()]);
    let cm = docs.iter().find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "ferry-tenants").expect("a ConfigMap ferry-tenants");
    let text = cm["data"]["policy.yaml"].as_str().unwrap();
    assert_eq!(ferry_runtime::tenants::Policy::parse(text).unwrap(), ferry_runtime::tenants::Policy::load(&example).unwrap());
    for kind in ["create-cluster", "peer", "offload", "deploy", "score"] {
        let d = docs.iter().find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == format!("ferry-{kind}").as_str()).unwrap();
        let pod = &d["spec"]["template"]["spec"];
        let c = &pod["containers"][0];
        let env = c["env"].as_array().unwrap();
        assert!(env.iter().any(|e| e["name"] == "FERRY_POLICY" && e["value"] == "/etc/ferry/tenants/policy.yaml"), "{kind}: {env:?}");
        assert!(c["volumeMounts"].as_array().unwrap().iter().any(|m| m["name"] == "tenants" && m["mountPath"] == "/etc/ferry/tenants"), "{kind}");
        assert!(pod["volumes"].as_array().unwrap().iter().any(|v| v["name"] == "tenants" && v["configMap"]["name"] == "ferry-tenants"), "{kind}");
    }
    let plain = render_chart(&helm, &[]);
    assert!(!plain.iter().any(|d| d["metadata"]["name"] == "ferry-tenants"));
    assert!(!serde_json::to_string(&plain).unwrap().contains("FERRY_POLICY"));
}

/// `helm template RELEASE` in namespace ferry with `extra`: the objects, or helm's error.
fn template_chart(helm: &Path, release: &str, extra: &[&str]) -> Result<Vec<Value>, String> {
    let out = Command::new(helm)
        .args(["template", release])
        .arg(root().join("helm/ferry"))
        .args(["--namespace", "ferry", "--kube-version", "1.20.0"])
        .args(extra)
        .output()
        .unwrap();
    if out.status.success() { Ok(docs(&String::from_utf8_lossy(&out.stdout))) } else { Err(String::from_utf8_lossy(&out.stderr).into_owned()) }
}

/// The prometheus-operator kinds, served as a cluster with the operator serves them.
const PROMETHEUS_OPERATOR: [&str; 4] = ["--api-versions", "monitoring.coreos.com/v1/ServiceMonitor", "--api-versions", "monitoring.coreos.com/v1/PrometheusRule"];

/// Every key path of a values file ("kafka.bootstrap", "workers.peer.replicas"), down to
/// the leaves and to maps that are data (tenants, latency, resources, labels).
fn value_paths(v: &Value, prefix: &str, out: &mut Vec<String>) {
    if let Some(map) = v.as_object() {
        for (k, child) in map {
            let path = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
            out.push(path.clone());
            let data = ["tenants", "latency", "resources", "labels", "requests", "limits"].contains(&k.as_str());
            if !data {
                value_paths(child, &path, out);
            }
        }
    }
}

/// The schema node that describes `path`, following `properties` and `$ref`s.
fn schema_at<'a>(schema: &'a Value, path: &str) -> Option<&'a Value> {
    let resolve = |mut n: &'a Value| {
        while let Some(r) = n["$ref"].as_str() {
            n = schema.pointer(r.trim_start_matches('#'))?;
        }
        Some(n)
    };
    let mut node = schema;
    for key in path.split('.') {
        node = resolve(node)?.get("properties")?.get(key)?;
    }
    Some(node)
}

/// values.schema.json describes every value in values.yaml (helm checks values against it
/// on lint, template, install and upgrade): the defaults pass, a wrong type, an unknown
/// key and a bad namespace each fail both `helm lint` and `helm template`, naming the value.
#[test]
fn chart_values_schema_covers_every_value_and_refuses_wrong_ones() {
    let Some(helm) = helm() else {
        ferry_runtime::report::missing_prerequisite("helm is not installed (scripts/install-helm.sh)");
        return;
    };
    let chart = root().join("helm/ferry");
    let schema: Value = serde_json::from_str(&std::fs::read_to_string(chart.join("values.schema.json")).unwrap()).expect("values.schema.json is JSON");
    assert_eq!(schema["$schema"], "http://json-schema.org/draft-07/schema#");
    assert_eq!(schema["additionalProperties"], false, "an unknown top-level value is refused");
    let values: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(chart.join("values.yaml")).unwrap()).unwrap();
    let mut paths = Vec::new();
    value_paths(&values, "", &mut paths);
    assert!(paths.len() > 40, "{paths:?}");
    for path in &paths {
        let node = schema_at(&schema, path).unwrap_or_else(|| panic!("values.schema.json does not describe {path}"));
        assert!(node["description"].as_str().is_some_and(|d| !d.is_empty()), "values.schema.json: {path} has no description");
    }
    assert!(template_chart(&helm, "ferry", &[]).is_ok(), "the defaults pass");
    for (set, names) in [
        ("workers.peer.replicas=two", "workers.peer.replicas"),
        ("dashboard.replicas=many", "dashboard.replicas"),
        ("kafka.bootstrapp=kafka:9092", "bootstrapp"),
        ("kafka.securityProtocol=TLS", "kafka.securityProtocol"),
        ("clusterNamespaces={Bad_ns}", "clusterNamespaces"),
        ("podDisruptionBudget.minAvailable=half", "podDisruptionBudget.minAvailable"),
        ("serviceMonitor.interval=often", "serviceMonitor.interval"),
    ] {
        let lint = Command::new(&helm).arg("lint").arg(&chart).args(["--set", set]).output().unwrap();
        let said = String::from_utf8_lossy(&lint.stdout);
        assert!(!lint.status.success() && said.contains(names), "helm lint --set {set} fails naming {names}: {said}");
        let err = template_chart(&helm, "ferry", &["--set", set]).err().unwrap_or_else(|| panic!("helm template --set {set} should fail"));
        assert!(err.contains("values don't meet the specifications of the schema") && err.contains(names), "--set {set}: {err}");
    }
    // The tenants of the example pass the schema; a rule with an unknown field does not.
    assert!(template_chart(&helm, "ferry", &["-f", root().join("examples/tenants.yaml").to_str().unwrap()]).is_ok());
    assert!(template_chart(&helm, "ferry", &["--set", "tenants.web.deploy.cluster=member-1"]).is_err());
}

/// Object names follow the usual `_helpers.tpl` rules (release "ferry": ferry-peer; release
/// "prod": prod-ferry-peer; nameOverride and fullnameOverride), every object carries the
/// standard labels, and what refers to a name (ServiceAccounts, Services' selectors, the
/// test Pod's URLs) follows it.
#[test]
fn chart_names_follow_the_overrides_and_carry_the_standard_labels() {
    let Some(helm) = helm() else {
        ferry_runtime::report::missing_prerequisite("helm is not installed (scripts/install-helm.sh)");
        return;
    };
    for (release, extra, prefix, name) in [
        ("ferry", vec![], "ferry", "ferry"),
        ("prod", vec![], "prod-ferry", "ferry"),
        ("prod", vec!["--set", "nameOverride=fleet"], "prod-fleet", "fleet"),
        ("prod", vec!["--set", "fullnameOverride=acme"], "acme", "ferry"),
        ("my-ferry-2", vec![], "my-ferry-2", "ferry"),
    ] {
        let mut args = extra.clone();
        args.extend(PROMETHEUS_OPERATOR);
        let docs = template_chart(&helm, release, &args).unwrap();
        for d in &docs {
            let l = &d["metadata"]["labels"];
            let what = format!("{release} {extra:?}: {} {}", d["kind"], d["metadata"]["name"]);
            assert_eq!(l["app.kubernetes.io/name"], name, "{what}");
            assert_eq!(l["app.kubernetes.io/instance"], release, "{what}");
            assert_eq!(l["app.kubernetes.io/managed-by"], "Helm", "{what}");
            assert_eq!(l["app.kubernetes.io/version"], "0.1.0", "{what}");
            assert_eq!(l["helm.sh/chart"], "ferry-0.1.0", "{what}");
            let n = d["metadata"]["name"].as_str().unwrap();
            assert!(n.starts_with(&format!("{prefix}-")) || n.starts_with("ferry-worker-") || n == strimzi::DASHBOARD_USER, "{what}: named {n}, not {prefix}-*");
            assert!(n.len() <= 63, "{what}");
        }
        for kind in ["create-cluster", "peer", "offload", "deploy", "score"] {
            let full = format!("{prefix}-{kind}");
            let dep = docs.iter().find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == full.as_str()).unwrap_or_else(|| panic!("Deployment {full}"));
            assert_eq!(dep["spec"]["template"]["spec"]["serviceAccountName"], full.as_str());
            assert!(docs.iter().any(|d| d["kind"] == "ServiceAccount" && d["metadata"]["name"] == full.as_str()));
            let pod_labels = &dep["spec"]["template"]["metadata"]["labels"];
            let svc = docs.iter().find(|d| d["kind"] == "Service" && d["metadata"]["name"] == format!("{full}-metrics").as_str()).expect("metrics Service");
            for (k, v) in svc["spec"]["selector"].as_object().unwrap() {
                assert_eq!(&pod_labels[k], v, "{full}-metrics selects the worker's Pods");
            }
            for (k, v) in dep["spec"]["selector"]["matchLabels"].as_object().unwrap() {
                assert_eq!(&pod_labels[k], v, "{full} selects its own Pods");
            }
        }
        let sm = docs.iter().find(|d| d["kind"] == "ServiceMonitor").unwrap();
        assert_eq!(sm["metadata"]["name"], format!("{prefix}-workers").as_str());
        let test = docs.iter().find(|d| d["kind"] == "Pod").expect("the helm test Pod");
        let args = serde_json::to_string(&test["spec"]["containers"][0]["args"]).unwrap();
        assert!(args.contains(&format!("http://{prefix}-dashboard:80/readyz")), "{args}");
    }
    // Objects made only on request carry the labels too.
    let latency = template_chart(&helm, "ferry", &["--set", "workers.offload.latency.a.b=5"]).unwrap();
    let cm = latency.iter().find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "ferry-offload-latency").expect("the latency ConfigMap");
    assert_eq!(cm["metadata"]["labels"]["app.kubernetes.io/instance"], "ferry");
    // The offload worker's failure grace reaches it under the flag's environment name.
    let grace = |docs: &[Value]| {
        let dep = docs.iter().find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "ferry-offload").expect("the offload worker");
        let env = dep["spec"]["template"]["spec"]["containers"][0]["env"].as_array().unwrap().clone();
        env.into_iter().find(|e| e["name"] == "FERRY_OFFLOAD_FAILURE_GRACE").map(|e| e["value"].clone())
    };
    assert_eq!(grace(&latency), Some(serde_json::json!("60s")));
    let at_once = template_chart(&helm, "ferry", &["--set", "workers.offload.failureGrace=0s"]).unwrap();
    assert_eq!(grace(&at_once), Some(serde_json::json!("0s")));
    assert!(template_chart(&helm, "ferry", &["--set", "workers.offload.failureGrace=a minute"]).is_err(), "the schema refuses a duration the worker cannot read");
}

/// The ServiceMonitor and the alerts exist only where the cluster serves their kinds (an
/// install elsewhere would fail on the unknown kind), and only when enabled; the alerts
/// query metrics the workers export, scoped to this release's workers.
#[test]
fn chart_monitoring_needs_the_prometheus_operator() {
    let Some(helm) = helm() else {
        ferry_runtime::report::missing_prerequisite("helm is not installed (scripts/install-helm.sh)");
        return;
    };
    let count = |docs: &[Value], kind: &str| docs.iter().filter(|d| d["kind"] == kind).count();
    let bare = render_chart(&helm, &[]);
    assert_eq!((count(&bare, "ServiceMonitor"), count(&bare, "PrometheusRule")), (0, 0), "no prometheus-operator kinds served: none rendered");
    let served = render_chart(&helm, &PROMETHEUS_OPERATOR);
    assert_eq!((count(&served, "ServiceMonitor"), count(&served, "PrometheusRule")), (1, 1));
    let only_sm = render_chart(&helm, &PROMETHEUS_OPERATOR[..2]);
    assert_eq!((count(&only_sm, "ServiceMonitor"), count(&only_sm, "PrometheusRule")), (1, 0));
    let mut off = PROMETHEUS_OPERATOR.to_vec();
    off.extend(["--set", "serviceMonitor.enabled=false", "--set", "prometheusRule.enabled=false"]);
    let off = render_chart(&helm, &off);
    assert_eq!((count(&off, "ServiceMonitor"), count(&off, "PrometheusRule")), (0, 0), "disabled");

    let sm = served.iter().find(|d| d["kind"] == "ServiceMonitor").unwrap();
    let selector = sm["spec"]["selector"]["matchLabels"].as_object().unwrap();
    let scraped: Vec<&Value> = served.iter().filter(|d| d["kind"] == "Service" && selector.iter().all(|(k, v)| &d["metadata"]["labels"][k] == v)).collect();
    assert_eq!(scraped.len(), 6, "the ServiceMonitor scrapes each worker's metrics Service");
    let rule = served.iter().find(|d| d["kind"] == "PrometheusRule").unwrap();
    let exported = exported_metrics();
    let rules: Vec<&Value> = rule["spec"]["groups"].as_array().unwrap().iter().flat_map(|g| g["rules"].as_array().unwrap()).collect();
    let alerts: Vec<&str> = rules.iter().filter_map(|r| r["alert"].as_str()).collect();
    for want in ["FerryDeadLetters", "FerryRevertFailed", "FerryConsumerLagHigh", "FerryTasksStuck", "FerryTasksOvertaken", "FerryStateWritesFailing", "FerryClusterWatchesFailing"] {
        assert!(alerts.contains(&want), "alert {want} missing: {alerts:?}");
    }
    for r in &rules {
        let expr = r["expr"].as_str().unwrap();
        if r["alert"] != "FerryWorkerDown" {
            assert_names_exported(expr, &exported);
        }
        // Each selector names this release's namespace and its workers' metrics Services
        // (the job label prometheus-operator gives their targets).
        let selectors = expr.matches('{').count();
        assert_eq!(expr.matches(r#"namespace="ferry", job=~"ferry-.+-metrics""#).count(), selectors, "{expr}");
        assert!(r["labels"]["severity"].as_str().is_some(), "{r}");
        let description = r["annotations"]["description"].as_str().unwrap();
        assert!(description.contains("{{ $labels.") && !description.contains("<no value>"), "Prometheus, not helm, fills in the labels: {description}");
    }
    let revert_failed = rules.iter().find(|r| r["alert"] == "FerryRevertFailed").unwrap();
    assert!(revert_failed["expr"].as_str().unwrap().contains(r#"event="RevertFailed""#));
    let watches = rules.iter().find(|r| r["alert"] == "FerryClusterWatchesFailing").unwrap();
    assert!(watches["expr"].as_str().unwrap().contains("cluster)") && watches["for"] == "10m", "{watches}");
    let tuned = render_chart(&helm, &[&PROMETHEUS_OPERATOR[..], &["--set", "prometheusRule.consumerLagRecords=50", "--set", "prometheusRule.stuckAfter=3h"]].concat());
    let text = serde_json::to_string(tuned.iter().find(|d| d["kind"] == "PrometheusRule").unwrap()).unwrap();
    assert!(text.contains("ferry_consumer_lag_records{namespace=\\\"ferry\\\", job=~\\\"ferry-.+-metrics\\\"}) > 50") && text.contains("[3h]"), "{text}");
}

/// A PodDisruptionBudget never blocks a drain: none for a worker with one replica, and
/// minAvailable at most replicas - 1 otherwise; v1beta1 on Kubernetes before 1.21.
#[test]
fn chart_disruption_budgets_allow_drains() {
    let Some(helm) = helm() else {
        ferry_runtime::report::missing_prerequisite("helm is not installed (scripts/install-helm.sh)");
        return;
    };
    let pdb = |docs: &[Value], kind: &str| docs.iter().find(|d| d["kind"] == "PodDisruptionBudget" && d["metadata"]["name"] == format!("ferry-{kind}").as_str()).cloned();
    let two = render_chart(&helm, &[]);
    for kind in ["create-cluster", "peer", "offload", "deploy", "score"] {
        let p = pdb(&two, kind).unwrap_or_else(|| panic!("{kind}: two replicas, a PDB"));
        assert_eq!(p["spec"]["minAvailable"], 1, "{kind}");
        assert_eq!(p["apiVersion"], "policy/v1beta1", "Kubernetes 1.20");
    }
    let one = render_chart(&helm, &["--set", "workers.peer.replicas=1", "--set", "workers.score.replicas=0"]);
    assert!(pdb(&one, "peer").is_none(), "one replica: no PDB, or a drain could never evict it");
    assert!(pdb(&one, "score").is_none());
    assert!(pdb(&one, "deploy").is_some());
    let capped = render_chart(&helm, &["--set", "workers.peer.replicas=3", "--set", "podDisruptionBudget.minAvailable=5"]);
    assert_eq!(pdb(&capped, "peer").unwrap()["spec"]["minAvailable"], 2, "three replicas: at most two kept");
    assert_eq!(pdb(&capped, "deploy").unwrap()["spec"]["minAvailable"], 1, "two replicas: at most one kept");
    let percent = render_chart(&helm, &["--set", "podDisruptionBudget.minAvailable=50%"]);
    assert_eq!(pdb(&percent, "peer").unwrap()["spec"]["minAvailable"], "50%");
    let newer = template_chart(&helm, "ferry", &["--kube-version", "1.25.0"]).unwrap();
    assert_eq!(pdb(&newer, "peer").unwrap()["apiVersion"], "policy/v1");
    let none = render_chart(&helm, &["--set", "podDisruptionBudget.enabled=false"]);
    assert!(!none.iter().any(|d| d["kind"] == "PodDisruptionBudget"));
}

/// `helm test`'s Pod (a test hook) asks /readyz of the dashboard's Service and of each
/// enabled worker's metrics Service, on the ports those Services expose, as a restricted
/// Pod; with allowedHosts the dashboard is asked (and probed) under an allowed host name.
/// The test bed's emulated kubelets mark Pods Running without running them, so the Pod's
/// run is not exercised here, only what it asks.
#[test]
fn chart_test_hook_asks_every_readyz() {
    let Some(helm) = helm() else {
        ferry_runtime::report::missing_prerequisite("helm is not installed (scripts/install-helm.sh)");
        return;
    };
    let check = |docs: &[Value]| -> Vec<String> {
        let pod = docs.iter().find(|d| d["kind"] == "Pod").expect("the test Pod");
        assert_eq!(pod["metadata"]["annotations"]["helm.sh/hook"], "test");
        assert_eq!(pod["spec"]["restartPolicy"], "Never");
        let c = &pod["spec"]["containers"][0];
        assert_eq!(c["securityContext"]["runAsNonRoot"], true);
        assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
        let urls: Vec<String> = c["args"].as_array().unwrap()[2..].iter().map(|a| a.as_str().unwrap().to_owned()).collect();
        for url in &urls {
            let rest = url.strip_prefix("http://").and_then(|u| u.strip_suffix("/readyz")).unwrap_or_else(|| panic!("{url}"));
            let (svc, port) = rest.split_once(':').unwrap();
            let port: u64 = port.parse().unwrap_or_else(|_| panic!("{url}: port"));
            let s = docs.iter().find(|d| d["kind"] == "Service" && d["metadata"]["name"] == svc).unwrap_or_else(|| panic!("{url}: no Service {svc}"));
            assert!(s["spec"]["ports"].as_array().unwrap().iter().any(|p| p["port"] == port), "{url}: Service {svc} has no port {port}");
        }
        urls
    };
    let all = check(&render_chart(&helm, &[]));
    assert_eq!(all.len(), 7, "the dashboard and six workers: {all:?}");
    let fewer = check(&render_chart(&helm, &["--set", "workers.peer.enabled=false", "--set", "dashboard.enabled=false"]));
    assert_eq!(fewer.len(), 5, "{fewer:?}");
    assert!(!fewer.iter().any(|u| u.contains("peer") || u.contains("dashboard")));
    let hosts = render_chart(&helm, &["--set", "dashboard.allowedHosts={ferry.example.com:80}"]);
    let pod = hosts.iter().find(|d| d["kind"] == "Pod").unwrap();
    let env = &pod["spec"]["containers"][0]["env"];
    assert!(env.as_array().unwrap().iter().any(|e| e["name"] == "DASHBOARD_HOST" && e["value"] == "ferry.example.com:80"));
    let dash = hosts.iter().find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "ferry-dashboard").unwrap();
    let c = &dash["spec"]["template"]["spec"]["containers"][0];
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(c[probe]["httpGet"]["httpHeaders"], serde_json::json!([{"name": "Host", "value": "ferry.example.com:80"}]), "{probe}: the kubelet's Host would be refused");
    }
}

/// KafkaUser Secrets where Strimzi writes them: in the release namespace (the default)
/// the pods read them directly and the chart makes none; in another namespace the chart
/// copies them with `lookup`, which an offline render cannot do: it fails naming the Secret.
#[test]
fn chart_kafka_secrets_namespace_is_configurable() {
    let Some(helm) = helm() else {
        ferry_runtime::report::missing_prerequisite("helm is not installed (scripts/install-helm.sh)");
        return;
    };
    for same in [vec![], vec!["--set", "kafka.userSecretsNamespace=ferry", "--set", "kafka.caSecretNamespace=ferry"]] {
        let docs = render_chart(&helm, &same);
        assert!(!docs.iter().any(|d| d["kind"] == "Secret"), "{same:?}: the pods read the Secrets where they are");
    }
    let err = template_chart(&helm, "ferry", &["--set", "kafka.userSecretsNamespace=kafka"]).unwrap_err();
    assert!(err.contains("Secret kafka/ferry-") && err.contains("offline render"), "{err}");
    let err = template_chart(&helm, "ferry", &["--set", "kafka.caSecretNamespace=kafka"]).unwrap_err();
    assert!(err.contains("Secret kafka/ferry-cluster-ca-cert"), "{err}");
    // The User Operator's secretPrefix names the Secrets the pods read.
    let prefixed = render_chart(&helm, &["--set", "kafka.userSecretPrefix=kafka-"]);
    let dep = prefixed.iter().find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "ferry-peer").unwrap();
    let env = dep["spec"]["template"]["spec"]["containers"][0]["env"].as_array().unwrap();
    let pw = env.iter().find(|e| e["name"] == "FERRY_KAFKA_SASL_PASSWORD").unwrap();
    assert_eq!(pw["valueFrom"]["secretKeyRef"]["name"], "kafka-ferry-worker-peer");
    let user = env.iter().find(|e| e["name"] == "FERRY_KAFKA_SASL_USERNAME").unwrap();
    assert_eq!(user["value"], "ferry-worker-peer", "the Kafka user keeps its name");
}

/// docs/asyncapi.yaml is generated from the topics, schema ids and headers the workers
/// use (`FERRY_BLESS=1` rewrites it), names every topic, and refers only to committed
/// schema files whose ids it gives as the registry has them.
#[test]
fn asyncapi_document_is_generated_and_names_every_topic() {
    let topics = Topics::standard();
    let doc = ferry_runtime::asyncapi::document(&topics);
    let text = format!(
        "# Ferry's protocol as an AsyncAPI 3.0 document: every topic, its key, headers and schema.\n# Generated by ferry_runtime::asyncapi; do not edit. Regenerate: FERRY_BLESS=1 cargo test --test ship\n{}",
        serde_yaml_ng::to_string(&doc).unwrap()
    );
    let path = root().join("docs/asyncapi.yaml");
    if std::env::var_os("FERRY_BLESS").is_some() {
        std::fs::write(&path, &text).unwrap();
    }
    assert!(std::fs::read_to_string(&path).unwrap_or_default() == text, "docs/asyncapi.yaml is out of date; run FERRY_BLESS=1 cargo test --test ship and commit");
    let addresses: Vec<&str> = doc["channels"].as_object().unwrap().values().filter_map(|c| c["address"].as_str()).collect();
    for t in topics.all() {
        assert!(addresses.contains(&t.name.as_str()), "no channel for {}", t.name);
    }
    for (_, m) in doc["components"]["messages"].as_object().unwrap() {
        if let Some(r) = m["payload"]["schema"]["$ref"].as_str() {
            let file = r.trim_start_matches("../schemas/");
            assert!(root().join("schemas").join(file).exists(), "{r}");
            let id = ferry_runtime::wire::embedded_schemas().iter().find(|(_, f, _)| *f == file).map(|(id, _, _)| *id);
            assert_eq!(m["x-ferry-schema-id"].as_u64().map(|i| i as u32), id, "{file}");
        }
    }
    for op in doc["operations"].as_object().unwrap().values() {
        let r = op["channel"]["$ref"].as_str().unwrap().trim_start_matches("#/channels/");
        assert!(doc["channels"].get(r).is_some(), "operation on a missing channel {r}");
    }
}

//! What ships, checked against real parts: the Strimzi resources generated from
//! `topics/` are current and pass a real API server with the upstream Strimzi CRDs; the
//! Helm chart lints, renders, grants no more than each worker needs, and passes the
//! API server's server-side dry run; docker-compose.yml runs every worker.
//!
//! `FERRY_BLESS=1 cargo test --test ship` regenerates strimzi/kafka-{topics,users,tenants}.yaml.

use std::path::{Path, PathBuf};
use std::process::Command;

use ferry_fleet::{Fleet, FleetOptions};
use ferry_kube::{Clusters, HUB};
use ferry_runtime::Topics;
use ferry_runtime::strimzi;
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
        ("kafka-users.yaml", strimzi::to_yaml(&strimzi::kafka_users(&topics, &tenants, "ferry"), "Ferry's KafkaUsers: one per worker and the tracker, least-privilege ACLs")),
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

fn helm() -> Option<PathBuf> {
    let cache = std::env::var_os("FERRY_CACHE").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/ferry"));
    let bin = cache.join("helm-3.10.1/helm");
    bin.exists().then_some(bin)
}

fn render_chart(helm: &Path, extra: &[&str]) -> Vec<Value> {
    let chart = root().join("helm/ferry");
    let lint = Command::new(helm).arg("lint").arg(&chart).output().unwrap();
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
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("not a namespace name"), "a bad namespace fails the chart");
    assert!(k.iter().any(|k| k == "ServiceMonitor"));
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
    } else {
        ferry_runtime::report::missing_prerequisite("../shared/crds/strimzi (the upstream Strimzi CRDs) is absent: Strimzi resources not validated");
    }
    let Some(helm) = helm() else {
        ferry_runtime::report::missing_prerequisite("helm is not installed (scripts/install-helm.sh): chart not validated");
        return;
    };
    // The test bed has no prometheus-operator CRDs; the ServiceMonitor is checked above.
    let cluster_scoped = ["ClusterRole", "ClusterRoleBinding", "Namespace"];
    for mut d in render_chart(&helm, &["--set", "serviceMonitor.enabled=false"]) {
        if !cluster_scoped.contains(&d["kind"].as_str().unwrap_or("")) && d["metadata"]["namespace"].is_null() {
            d["metadata"]["namespace"] = "ferry".into();
        }
        clusters.dry_run_apply(HUB, &d, "ferry-test").await.unwrap_or_else(|e| panic!("chart {} {}: {e}", d["kind"], d["metadata"]["name"]));
    }
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
    for kind in ["create-cluster", "peer", "offload", "deploy", "score"] {
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

#[test]
fn grafana_dashboard_queries_name_metrics_the_workers_export() {
    let text = std::fs::read_to_string(root().join("helm/ferry/dashboards/ferry.json")).unwrap();
    let dash: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    // Names as a worker's /metrics exposes them (TYPE lines; samples add suffixes).
    let exposition = ferry_runtime::metrics::Metrics::with_one_sample_each().encode();
    let exported: Vec<&str> = exposition.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.split_whitespace().next()).collect();
    assert!(exported.len() >= 5, "{exposition}");
    let mut queries = 0;
    for panel in dash["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            queries += 1;
            let names: Vec<&str> = expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| w.starts_with("ferry_")).collect();
            assert!(!names.is_empty(), "{expr} names no Ferry metric");
            for n in names {
                let base = ["_total", "_bucket", "_sum", "_count"].iter().fold(n, |n, s| n.strip_suffix(s).unwrap_or(n));
                assert!(exported.contains(&base), "{expr}: {n} is not exported (exported: {exported:?})");
            }
        }
    }
    assert!(queries >= 6, "tasks by state, step latency, retries, dead letters, consumer lag");
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
    let server = ferry_fleet::admission::AdmissionServer::start(ferry_fleet::webhooks_ocm::validators(admin.clone())).await.unwrap();
    for r in [ferry_fleet::webhooks_ocm::MANAGED_CLUSTER, ferry_fleet::webhooks_ocm::CLUSTER_SET_BINDING] {
        server.register(&admin, &r).await.unwrap();
    }
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
            let id = ferry_runtime::wire::EMBEDDED.iter().find(|(_, f, _)| *f == file).map(|(id, _, _)| *id);
            assert_eq!(m["x-ferry-schema-id"].as_u64().map(|i| i as u32), id, "{file}");
        }
    }
    for op in doc["operations"].as_object().unwrap().values() {
        let r = op["channel"]["$ref"].as_str().unwrap().trim_start_matches("#/channels/");
        assert!(doc["channels"].get(r).is_some(), "operation on a missing channel {r}");
    }
}

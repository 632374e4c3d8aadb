//! TOSCA blueprints (`tests/tosca/`, `examples/*.tosca.yaml`): CHARITY's dialect, the
//! Simple Profile's containers and Ferry's own, converted and deployed end to end on the
//! test bed (real API servers, emulated OCM, the embedded broker), with the objects on the
//! clusters checked; and every bad blueprint under `tests/tosca/bad/` refused with the
//! message its first line (`# error: ...`) gives, naming the property's path.

use std::path::{Path, PathBuf};

use ferry_deploy::spec::{DeployApp, DeployOperation};
use ferry_deploy::tosca::component::PLACEMENT_HINT_LABEL;
use ferry_deploy::tosca::{Overrides, convert};
use ferry_deploy::{DeployConfig, DeployHandler};
use ferry_kube::kinds::ManagedCluster;
use ferry_runtime::EventType;
use ferry_testkit::Bed;
use ferry_testkit::deploy as demo;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, Patch, PatchParams};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tosca")
}

fn fixture(name: &str) -> String {
    std::fs::read_to_string(dir().join(name)).unwrap()
}

fn member_1() -> Overrides {
    Overrides { cluster: Some("member-1".into()), ..Overrides::default() }
}

#[test]
fn every_bad_blueprint_is_refused_naming_the_property() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir().join("bad")).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    assert!(files.len() >= 10, "{files:?}");
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let want = text.lines().next().and_then(|l| l.strip_prefix("# error: ")).unwrap_or_else(|| panic!("{}: no `# error:` first line", f.display()));
        let got = convert(&text, &member_1()).map(|c| c.app).expect_err(&format!("{} should be refused", f.display()));
        assert_eq!(got.to_string(), want, "{}", f.display());
    }
}

#[test]
fn the_examples_and_fixtures_convert_to_valid_commands() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&examples).unwrap().map(|e| e.unwrap().path()).filter(|p| p.to_string_lossy().ends_with(".tosca.yaml")).collect();
    files.extend([dir().join("charity.tosca.yaml"), dir().join("containers.tosca.yaml")]);
    files.sort();
    assert!(files.len() >= 5, "{files:?}");
    for f in &files {
        // The README's command: `ferry submit deploy --tosca FILE --cluster member-1`.
        let c = convert(&std::fs::read_to_string(f).unwrap(), &member_1()).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        ferry_deploy::validate::validate(&c.app.subject(), &c.app).unwrap_or_else(|e| panic!("{}: {}", f.display(), e.reason));
    }
    let blog = convert(&std::fs::read_to_string(examples.join("blog.tosca.yaml")).unwrap(), &member_1()).unwrap();
    assert_eq!(blog.skipped, ["mailer"]);
    // Without --cluster, CHARITY's placement hints place the components.
    let charity = convert(&fixture("charity.tosca.yaml"), &Overrides::default()).unwrap();
    assert_eq!(charity.skipped, ["charity-kafka"]);
    ferry_deploy::validate::validate(&charity.app.subject(), &charity.app).unwrap();
    let hints: Vec<(&str, &str)> =
        charity.app.components.iter().map(|c| (c.name.as_str(), c.placement.as_ref().unwrap().labels[PLACEMENT_HINT_LABEL].as_str())).collect();
    assert_eq!(hints, [("ingest", "edge"), ("store", "cloud"), ("dashboard", "cloud"), ("batch", "cloud")]);
}

async fn get<K>(bed: &Bed, cluster: &str, ns: &str, name: &str) -> Option<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    <K as kube::Resource>::DynamicType: Default,
{
    let c = bed.fleet.cluster(cluster).unwrap().client().await.unwrap();
    Api::<K>::namespaced(c, ns).get_opt(name).await.unwrap()
}

/// The first container's env as (name, value) and its requests in base units (cores as
/// millicores, bytes), read back from the cluster.
fn pod_of(d: &Deployment) -> (Vec<(String, String)>, Option<i64>, Option<i64>) {
    let c = d.spec.template.spec.as_ref().map(|p| p.containers[0].clone()).expect("a container");
    let env = c.env.unwrap_or_default().into_iter().map(|e| (e.name, e.value.unwrap_or_default())).collect();
    let req = c.resources.and_then(|r| r.requests).unwrap_or_default();
    let cpu = req.get("cpu").map(|q| ferry_kube::quantity::millicores(&q.0).unwrap());
    let mem = req.get("memory").map(|q| ferry_kube::quantity::units(&q.0).unwrap());
    (env, cpu, mem)
}

fn service_ports(s: &Service) -> Vec<i32> {
    s.spec.as_ref().and_then(|s| s.ports.clone()).unwrap_or_default().into_iter().map(|p| p.port).collect()
}

/// (host, backend port, TLS secret) of an Ingress.
fn ingress_of(i: &Ingress) -> (String, i32, Option<String>) {
    let spec = i.spec.clone().expect("a spec");
    let rule = spec.rules.unwrap_or_default().remove(0);
    let port = rule.http.as_ref().and_then(|h| h.paths[0].backend.service.as_ref()).and_then(|s| s.port.as_ref()?.number).unwrap_or_default();
    let tls = spec.tls.and_then(|t| t.first().and_then(|t| t.secret_name.clone()));
    (rule.host.unwrap_or_default(), port, tls)
}

async fn delete_and_check(bed: &Bed, app: &DeployApp) {
    let delete = DeployApp { operation: DeployOperation::Delete, name: app.name.clone(), ..DeployApp::default() };
    let (_, evs) = demo::submit(&bed.client(), &delete).await.unwrap();
    assert_eq!(evs.last().unwrap().event, EventType::Succeeded, "{:?}", evs.last());
    assert_eq!(demo::leftovers(&bed.fleet, app, &["member-1", "member-2"]).await.unwrap(), Vec::<String>::new());
}

async fn deploy(bed: &Bed, app: &DeployApp) -> Vec<(String, String)> {
    let client = bed.client();
    let (id, evs) = demo::submit(&client, app).await.unwrap();
    assert_eq!(evs.last().unwrap().event, EventType::Succeeded, "{:?}", evs.last());
    // The task itself says what it left out: the check step's output lists the externals.
    let snap = client.snapshot(id).await.unwrap().expect("the task's snapshot");
    let check = snap.journal.iter().find(|e| e.name == "check").and_then(|e| e.output.clone()).expect("check's output");
    let checked: serde_json::Value = serde_json::from_str(&check).unwrap();
    let external: Vec<String> = serde_json::from_value(checked["external"].clone()).unwrap_or_default();
    assert_eq!(external, app.external, "{check}");
    let mut placed: Vec<(String, String)> = demo::statuses(&client, id).await.unwrap().into_iter().map(|s| (s.component, s.cluster)).collect();
    placed.sort();
    placed
}

fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
    p.iter().map(|(a, b)| ((*a).to_owned(), (*b).to_owned())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn charity_simple_profile_and_ferry_blueprints_deploy_end_to_end() {
    let Some(mut bed) = Bed::builder().members(2, 2).ocm().start().await else { return };
    bed.run_worker(DeployHandler::new(DeployConfig::new(bed.clusters.clone())));
    demo::prepare(&bed.fleet, &["member-1", "member-2"], "charity").await.unwrap();
    let hub = bed.hub().await;

    // CHARITY: placement hints on labelled clusters (edge: member-2, cloud: member-1), the
    // TLS Secret on the hub; the external Kafka left out.
    let mcs = Api::<ManagedCluster>::all(hub.clone());
    for (cluster, hint) in [("member-1", "cloud"), ("member-2", "edge")] {
        let labels = serde_json::json!({"metadata": {"labels": {PLACEMENT_HINT_LABEL: hint}}});
        mcs.patch(cluster, &PatchParams::default(), &Patch::Merge(&labels)).await.unwrap();
    }
    demo::secret(&hub, "charity", "ingest-tls", &[("tls.crt", "cert"), ("tls.key", "key")]).await.unwrap();
    let charity = convert(&fixture("charity.tosca.yaml"), &Overrides::default()).unwrap();
    assert_eq!(charity.skipped, ["charity-kafka"]);
    assert_eq!(charity.app.external, ["charity-kafka"]);
    let placed = deploy(&bed, &charity.app).await;
    assert_eq!(placed, pairs(&[("batch", "member-1"), ("dashboard", "member-1"), ("ingest", "member-2"), ("store", "member-1")]));

    // ingest (edge): env from the inputs' defaults, requests from edge-node's filter, a
    // Service for its ports, an Ingress (its link is shared with the external Kafka) to
    // its tls_port with its TLS Secret.
    let ingest: Deployment = get(&bed, "member-2", "charity", "ingest").await.expect("ingest on member-2");
    let (env, cpu, mem) = pod_of(&ingest);
    assert_eq!(env, pairs(&[("KAFKA_BOOTSTRAP", "charity-kafka.example.com:9092"), ("LOG_LEVEL", "info")]));
    assert_eq!((cpu, mem), (Some(1000), Some(256 << 20)));
    assert_eq!(ingest.status.and_then(|s| s.ready_replicas), Some(1));
    let svc: Service = get(&bed, "member-2", "charity", "ingest").await.expect("ingest's Service");
    assert_eq!(service_ports(&svc), [8080, 8443]);
    let ing: Ingress = get(&bed, "member-2", "charity", "ingest").await.expect("ingest's Ingress");
    assert_eq!(ingress_of(&ing), ("ingest.charity.example.com".to_owned(), 8443, Some("ingest-tls".to_owned())));
    assert!(get::<Deployment>(&bed, "member-1", "charity", "ingest").await.is_none(), "ingest only where its hint says");

    // store (cloud): requests from cloud-node's in_range lower bound (0.5 GB), per-container
    // port lists flattened into one Service; its link is shared only between components:
    // no Ingress.
    let store: Deployment = get(&bed, "member-1", "charity", "store").await.expect("store on member-1");
    assert_eq!((pod_of(&store).1, pod_of(&store).2), (Some(1000), Some(500_000_000)));
    let svc: Service = get(&bed, "member-1", "charity", "store").await.expect("store's Service");
    assert_eq!(service_ports(&svc), [6379, 9121]);
    assert!(get::<Ingress>(&bed, "member-1", "charity", "store").await.is_none(), "a link between components only → no Ingress");
    // dashboard: a public link → Ingress, no TLS.
    let ing: Ingress = get(&bed, "member-1", "charity", "dashboard").await.expect("dashboard's Ingress");
    assert_eq!(ingress_of(&ing), ("dashboard.charity.example.com".to_owned(), 80, None));
    // batch: no ports → no Service; no host → no requests.
    let batch: Deployment = get(&bed, "member-1", "charity", "batch").await.expect("batch on member-1");
    assert_eq!(pod_of(&batch), (pairs(&[("LOG_LEVEL", "info")]), None, None));
    assert!(get::<Service>(&bed, "member-1", "charity", "batch").await.is_none(), "a component with no port has no Service");
    delete_and_check(&bed, &charity.app).await;

    // The Simple Profile's containers, onto member-1.
    let wiki = convert(&fixture("containers.tosca.yaml"), &member_1()).unwrap();
    assert!(wiki.skipped.is_empty());
    assert_eq!(deploy(&bed, &wiki.app).await, pairs(&[("db", "member-1"), ("wiki", "member-1")]));
    let d: Deployment = get(&bed, "member-1", "wiki", "wiki").await.expect("wiki");
    let image = d.spec.template.spec.as_ref().and_then(|p| p.containers[0].image.clone());
    assert_eq!(image.as_deref(), Some("ghcr.io/acme/wiki:3.1"), "the artifact's file on its repository");
    assert_eq!((pod_of(&d).1, pod_of(&d).2), (Some(1000), Some(128_000_000)), "the Container.Runtime host's size");
    assert_eq!(d.status.and_then(|s| s.ready_replicas), Some(2), "scalable.default_instances");
    let ing: Ingress = get(&bed, "member-1", "wiki", "wiki").await.expect("wiki's Ingress");
    assert_eq!(ingress_of(&ing), ("wiki.example.com".to_owned(), 8080, None));
    let db: Deployment = get(&bed, "member-1", "wiki", "db").await.expect("db");
    assert_eq!((pod_of(&db).1, pod_of(&db).2), (Some(1000), Some(512 << 20)), "the host requirement's inline node filter");
    let svc: Service = get(&bed, "member-1", "wiki", "db").await.expect("db's Service");
    assert_eq!(service_ports(&svc), [5432]);
    assert!(get::<Ingress>(&bed, "member-1", "wiki", "db").await.is_none());
    delete_and_check(&bed, &wiki.app).await;

    // The README's blueprint, as `--tosca examples/blog.tosca.yaml --cluster member-1` sends it.
    let blog = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/blog.tosca.yaml")).unwrap();
    let blog = convert(&blog, &member_1()).unwrap();
    assert_eq!(deploy(&bed, &blog.app).await, pairs(&[("frontend", "member-1"), ("posts", "member-1")]));
    let ing: Ingress = get(&bed, "member-1", "blog", "frontend").await.expect("frontend's Ingress");
    assert_eq!(ingress_of(&ing).0, "blog.example.com");
    assert!(get::<Service>(&bed, "member-1", "blog", "posts").await.is_some());
    assert!(get::<Ingress>(&bed, "member-1", "blog", "posts").await.is_none());
    delete_and_check(&bed, &blog.app).await;
    bed.stop().await;
}

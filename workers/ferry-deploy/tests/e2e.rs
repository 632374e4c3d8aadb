//! The deploy worker end to end: commands through a real Kafka-protocol broker (the
//! embedded mock cluster), the deploy and score workers, and the test bed's real API
//! servers with the emulated OCM (registration, work agents, placement).

use std::time::Duration;

use ferry_deploy::spec::{Component, Delivery, DeployApp, DeployOperation, EnvVar, PlacementSpec, Port, SecretKeyRef};
use ferry_deploy::{DeployConfig, DeployHandler};
use ferry_testkit::Bed;
use ferry_testkit::deploy as demo;
use ferry_kube::kinds::{ManifestWork, Placement};
use ferry_runtime::{EventType, SubmitOptions, TaskKind};
use ferry_score::spec::{ScoreClusters, ScorePolicy};
use ferry_score::{ScoreConfig, ScoreHandler};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, ListParams};

const WAIT: Duration = Duration::from_secs(180);

/// Two members of two nodes each, emulated OCM, and the deploy and score workers (the
/// test kit's bed).
async fn bed() -> Option<Bed> {
    let mut bed = Bed::builder().members(2, 2).ocm().start().await?;
    let deploy = DeployHandler::new(DeployConfig::new(bed.clusters.clone()));
    let score = ScoreHandler::new(ScoreConfig::new(bed.clusters.clone(), bed.kafka.clone(), bed.topics.clone())).unwrap();
    bed.run_worker(deploy);
    bed.run_worker(score);
    Some(bed)
}

fn last(evs: &[ferry_runtime::ProgressEvent]) -> &ferry_runtime::ProgressEvent {
    evs.last().expect("a final event")
}

async fn deployment(bed: &Bed, cluster: &str, ns: &str, name: &str) -> Option<Deployment> {
    let c = bed.fleet.cluster(cluster).unwrap().client().await.unwrap();
    Api::<Deployment>::namespaced(c, ns).get_opt(name).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apps_deploy_update_revert_and_delete_across_clusters() {
    let Some(bed) = bed().await else { return };
    let client = bed.client();

    // The `ferry dev --demo deploy` run: 3 components on 2 clusters, ready from feedback,
    // then deleted from every cluster.
    assert!(demo::run(&client, &bed.fleet).await.unwrap(), "the demo's checks failed (see its output)");

    // Deploy again, update (more web replicas, a new api image), then revert the update:
    // the previous spec comes back.
    let app = demo::shop();
    let (_, evs) = demo::submit(&client, &app).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Succeeded, "{:?}", last(&evs));
    let mut changed = app.clone();
    changed.operation = DeployOperation::Update;
    changed.components[0].replicas = Some(3);
    changed.components[1].image = "ghcr.io/acme/shop-api:2.2".into();
    let (update, evs) = demo::submit(&client, &changed).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Succeeded, "{:?}", last(&evs));
    let web = deployment(&bed, "member-1", "shop", "web").await.unwrap();
    assert_eq!(web.status.and_then(|s| s.ready_replicas), Some(3));
    let mut events = client.events(false).await.unwrap();
    client.revert(update).await.unwrap();
    let evs = events.until(update, WAIT, |e| e.event.is_final()).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Reverted, "{:?}", last(&evs));
    let web = deployment(&bed, "member-1", "shop", "web").await.unwrap();
    assert_eq!(web.spec.replicas, Some(2), "the revert restores the previous replicas");
    let api = deployment(&bed, "member-2", "shop", "api").await.unwrap();
    let image = api.spec.template.spec.map(|p| p.containers[0].image.clone().unwrap_or_default());
    assert_eq!(image.as_deref(), Some("ghcr.io/acme/shop-api:2.1"));

    // A second deploy of a deployed app is rejected; so is an update of an unknown one.
    let (_, evs) = demo::submit(&client, &app).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Rejected);
    assert!(last(&evs).message.as_deref().unwrap_or("").contains("already deployed"), "{:?}", last(&evs));

    // Delete removes everything from every cluster.
    let delete = DeployApp { operation: DeployOperation::Delete, name: "shop".into(), ..DeployApp::default() };
    let (_, evs) = demo::submit(&client, &delete).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Succeeded, "{:?}", last(&evs));
    assert_eq!(demo::leftovers(&bed.fleet, &app, &["member-1", "member-2"]).await.unwrap(), Vec::<String>::new());

    // A TOSCA blueprint with three components, one of them external, deploys.
    let blueprint = r#"
tosca_definitions_version: tosca_simple_yaml_1_3
metadata: {template_name: blog, owner: team-tosca}
topology_template:
  node_templates:
    frontend:
      type: tosca.nodes.Container.Application
      properties: {image: "nginx:1.27", replicas: 2, ports: [80]}
      requirements: [{exposure: public_net}, {backend: posts}]
    posts:
      type: tosca.nodes.Container.Application
      properties: {image: "ghcr.io/acme/posts:1.0", ports: [8080], cluster: member-2}
      requirements: [{exposure: internal_net}, {mail: mailer}]
    mailer:
      type: acme.nodes.External
    public_net:
      type: tosca.nodes.network.VirtualLink
      properties: {public: true, hostname: blog.example.com}
    internal_net:
      type: tosca.nodes.network.VirtualLink
"#;
    let overrides = ferry_deploy::tosca::Overrides { cluster: Some("member-1".into()), ..Default::default() };
    let converted = ferry_deploy::tosca::convert(blueprint, &overrides).unwrap();
    assert_eq!(converted.skipped, ["mailer"]);
    let (id, evs) = demo::submit(&client, &converted.app).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Succeeded, "{:?}", last(&evs));
    let placed: Vec<(String, String)> = demo::statuses(&client, id).await.unwrap().into_iter().map(|s| (s.component, s.cluster)).collect();
    assert_eq!(placed, [("frontend".to_owned(), "member-1".to_owned()), ("posts".to_owned(), "member-2".to_owned())]);
    let ing = bed.fleet.cluster("member-1").unwrap().client().await.unwrap();
    let ingress = Api::<k8s_openapi::api::networking::v1::Ingress>::namespaced(ing, "blog").get_opt("frontend").await.unwrap();
    assert_eq!(ingress.and_then(|i| i.spec?.rules?.first()?.host.clone()).as_deref(), Some("blog.example.com"));

    // Direct delivery (no OCM): through the cluster's kubeconfig, into the namespace a
    // Liqo NamespaceOffloading would offload; no ManifestWork; the revert removes it.
    let direct = DeployApp {
        name: "direct".into(),
        owner: "team-d".into(),
        delivery: ferry_deploy::spec::Delivery::Direct,
        components: vec![Component {
            name: "worker".into(),
            image: "busybox:1.36".into(),
            replicas: Some(2),
            cluster: Some("member-2".into()),
            offloaded_namespace: Some("offloaded-ns".into()),
            ..Component::default()
        }],
        ready_timeout_seconds: Some(120),
        ..DeployApp::default()
    };
    let (id, evs) = demo::submit(&client, &direct).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Succeeded, "{:?}", last(&evs));
    let d = deployment(&bed, "member-2", "offloaded-ns", "worker").await.expect("the Deployment in the offloaded namespace");
    assert_eq!(d.status.and_then(|s| s.ready_replicas), Some(2));
    let lp = ListParams::default().labels("ferry.io/app=direct");
    assert!(Api::<ManifestWork>::all(bed.hub().await).list(&lp).await.unwrap().items.is_empty(), "direct delivery makes no ManifestWork");
    let mut events = client.events(false).await.unwrap();
    client.revert(id).await.unwrap();
    let evs = events.until(id, WAIT, |e| e.event.is_final()).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Reverted, "{:?}", last(&evs));
    assert!(deployment(&bed, "member-2", "offloaded-ns", "worker").await.is_none(), "the revert removed the Deployment");

    bed.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placements_follow_scores_deadlines_revert_and_bad_input_is_rejected() {
    let Some(bed) = bed().await else { return };
    let client = bed.client();
    let hub = bed.hub().await;
    demo::prepare(&bed.fleet, &["member-1", "member-2"], "placed").await.unwrap();

    // member-1 is busy, so the score worker ranks member-2 first; a placement
    // prioritized by that score lands there (without scores the tie goes to member-1).
    let m1 = bed.fleet.cluster("member-1").unwrap().client().await.unwrap();
    ferry_testkit::score::load(&m1, 3, 6).await.unwrap();
    let mut events = client.events(false).await.unwrap();
    let scoring = ScoreClusters { cluster_set: Some(demo::SET.into()), policy: ScorePolicy::ResourceUsage, ..ScoreClusters::default() };
    let sid = client.submit(TaskKind::Score, "placed/score", &scoring, SubmitOptions::default()).await.unwrap();
    let evs = events.until(sid, WAIT, |e| e.event.is_final()).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Succeeded, "{:?}", last(&evs));
    let ranking = ferry_testkit::score::ranking(&client, sid).await.unwrap();
    assert_eq!(ranking[0].cluster, "member-2", "{ranking:?}");

    let placed_app = |score: Option<&str>| DeployApp {
        name: "svc".into(),
        namespace: Some("placed".into()),
        owner: "team-p".into(),
        components: vec![Component {
            name: "svc".into(),
            image: "nginx:1.27".into(),
            cpu: Some("100m".into()),
            ports: vec![Port { port: 80, ..Port::default() }],
            placement: Some(PlacementSpec { cluster_sets: vec![demo::SET.into()], score: score.map(str::to_owned), ..PlacementSpec::default() }),
            ..Component::default()
        }],
        ready_timeout_seconds: Some(120),
        ..DeployApp::default()
    };
    let (id, evs) = demo::submit(&client, &placed_app(Some("ferry-resource-usage"))).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Succeeded, "{:?}", last(&evs));
    let on: Vec<String> = demo::statuses(&client, id).await.unwrap().into_iter().map(|s| s.cluster).collect();
    assert_eq!(on, ["member-2"], "the placement follows the top score");
    assert!(Api::<ManifestWork>::namespaced(hub.clone(), "member-2").get_opt("placed-svc").await.unwrap().is_some());
    // Reverting the deploy removes its ManifestWork and its Placement.
    let mut events = client.events(false).await.unwrap();
    client.revert(id).await.unwrap();
    let evs = events.until(id, WAIT, |e| e.event.is_final()).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Reverted, "{:?}", last(&evs));
    assert!(Api::<ManifestWork>::namespaced(hub.clone(), "member-2").get_opt("placed-svc").await.unwrap().is_none());
    assert!(Api::<Placement>::namespaced(hub.clone(), "placed").get_opt("svc-svc").await.unwrap().is_none());

    // Pods that never become ready (no node has 64 CPUs): the deploy fails at its
    // deadline and reverts, leaving no ManifestWork behind.
    let mut stuck = placed_app(None);
    stuck.name = "stuck".into();
    stuck.components[0].placement = None;
    stuck.components[0].cluster = Some("member-1".into());
    stuck.components[0].cpu = Some("64".into());
    stuck.ready_timeout_seconds = Some(5);
    let (_, evs) = demo::submit(&client, &stuck).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Reverted, "{:?}", last(&evs));
    let failed = evs.iter().find(|e| e.event == EventType::StepFailed).expect("a failed step");
    assert_eq!(failed.code.as_deref(), Some("NOT_READY"));
    assert!(failed.message.as_deref().unwrap_or("").contains("svc 0/1 ready"), "{failed:?}");
    let lp = ListParams::default().labels("ferry.io/app=stuck");
    assert!(Api::<ManifestWork>::all(hub.clone()).list(&lp).await.unwrap().items.is_empty(), "no ManifestWork left");
    assert!(deployment(&bed, "member-1", "placed", "svc").await.is_none(), "nothing left on the cluster");

    // A work agent that refuses to apply (and is slow to do so): the deadline's error
    // carries OCM's reason, and the revert still removes the ManifestWork.
    bed.ocm.as_ref().expect("the bed runs OCM").set("member-1", |k| {
        k.fail_apply = true;
        k.apply_delay = Duration::from_secs(1);
    });
    let mut refused = placed_app(None);
    refused.name = "refused".into();
    refused.components[0].placement = None;
    refused.components[0].cluster = Some("member-1".into());
    refused.ready_timeout_seconds = Some(5);
    let (_, evs) = demo::submit(&client, &refused).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Reverted, "{:?}", last(&evs));
    let failed = evs.iter().find(|e| e.event == EventType::StepFailed).expect("a failed step");
    assert!(failed.message.as_deref().unwrap_or("").contains("injected failure"), "OCM's reason reaches the task: {failed:?}");
    let lp = ListParams::default().labels("ferry.io/app=refused");
    assert!(Api::<ManifestWork>::all(hub.clone()).list(&lp).await.unwrap().items.is_empty(), "no ManifestWork left");
    bed.ocm.as_ref().expect("the bed runs OCM").set("member-1", |k| *k = Default::default());

    // Bad input: each Rejected with its reason, nothing applied.
    let rejected = |mut app: DeployApp, name: &str, f: fn(&mut DeployApp)| {
        app.name = name.into();
        f(&mut app);
        app
    };
    let cases: Vec<(DeployApp, &str)> = vec![
        (rejected(placed_app(None), "badimage", |a| a.components[0].image = "nginx:".into()), "is not a valid image reference"),
        (rejected(placed_app(None), "unknown", |a| {
            a.components[0].placement = None;
            a.components[0].cluster = Some("nowhere".into());
        }), "cluster \"nowhere\" is not registered with OCM"),
        (rejected(placed_app(None), "noroom", |a| a.components[0].cpu = Some("6".into())), "0 of the 1 cluster(s) needed can run 1 replica(s) of 6 CPU"),
        (rejected(placed_app(None), "nosecret", |a| a.components[0].image_pull_secret = Some("registry-creds".into())), "Secret placed/registry-creds, which does not exist on the hub"),
        (rejected(placed_app(None), "unbound", |a| a.components[0].placement.as_mut().unwrap().cluster_sets = vec!["other".into()]), "not bound to ManagedClusterSet \"other\""),
        // An operator's Secret not marked for export stays on the hub.
        (rejected(placed_app(None), "unmarked", |a| {
            a.components[0].env = vec![EnvVar { name: "PASSWORD".into(), value: None, secret: Some(SecretKeyRef { name: "plain".into(), key: "password".into() }) }];
        }), "Secret \"plain\" is not marked for export"),
        // Exfiltration: another cluster's admin kubeconfig onto member-2, directly.
        (rejected(placed_app(None), "exfil", |a| {
            a.namespace = Some(ferry_fleet::fleet::KUBECONFIG_NAMESPACE.into());
            a.delivery = Delivery::Direct;
            a.components[0].placement = None;
            a.components[0].cluster = Some("member-2".into());
            a.components[0].env = vec![EnvVar { name: "KC".into(), value: None, secret: Some(SecretKeyRef { name: "member-1-kubeconfig".into(), key: "value".into() }) }];
        }), "Secret \"member-1-kubeconfig\" is a cluster's kubeconfig; Ferry never copies those"),
    ];
    let plain = serde_json::json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "plain", "namespace": "placed"}, "stringData": {"password": "hunter2"}});
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(hub.clone(), "placed")
        .patch("plain", &kube::api::PatchParams::apply("test"), &kube::api::Patch::Apply(&plain))
        .await
        .unwrap();
    for (app, want) in cases {
        let (_, evs) = demo::submit(&client, &app).await.unwrap();
        let e = last(&evs);
        assert_eq!(e.event, EventType::Rejected, "{} should be rejected: {e:?}", app.name);
        assert!(e.message.as_deref().unwrap_or("").contains(want), "{}: expected {want:?} in {:?}", app.name, e.message);
        let lp = ListParams::default().labels(&format!("ferry.io/app={}", app.name));
        assert!(Api::<ManifestWork>::all(hub.clone()).list(&lp).await.unwrap().items.is_empty(), "{}: nothing applied", app.name);
        assert!(Api::<Placement>::all(hub.clone()).list(&lp).await.unwrap().items.is_empty(), "{}: no Placement", app.name);
    }
    bed.stop().await;
}

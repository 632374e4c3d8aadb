//! The deploy worker end to end: commands through a real Kafka-protocol broker (the
//! embedded mock cluster), the deploy and score workers, and the test bed's real API
//! servers with the emulated OCM (registration, work agents, placement).

use std::time::Duration;

use ferry_kube::dry_run::Change;
use ferry_runtime::dry_run::Verdict;
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

    // A dry run on the server of that update again: the hub judges each ManifestWork it
    // would hold (dryRun=All) and the difference from the one there is exactly the change;
    // the same spec changes nothing; a new app's would be created. Nothing is written, and
    // no Secret value shows.
    let works: Api<ManifestWork> = Api::all(bed.hub().await);
    // What a stored apply would move: the spec's generation and the task annotation (the
    // work agent keeps writing status, so resourceVersion moves on its own).
    let versions = || async {
        works.list(&ListParams::default()).await.unwrap().items.into_iter().map(|w| (w.metadata.namespace, w.metadata.name, w.metadata.generation, w.metadata.annotations)).collect::<Vec<_>>()
    };
    let before = versions().await;
    let cfg = DeployConfig::new(bed.clusters.clone());
    let p = ferry_deploy::preview::preview(&cfg, &changed.subject(), &changed).await.unwrap();
    let shown = serde_json::to_string(&p).unwrap();
    assert!(!shown.contains("demo-only-password") && !shown.contains(&base64(b"demo-only-password")), "a Secret's value in the preview: {shown}");
    assert_eq!(p.checked.verdict, Verdict::Passes, "{shown}");
    let work = |cluster: &str, app: &DeployApp| format!("ManifestWork {cluster}/{}", ferry_deploy::render::work_name(app));
    let changes: Vec<(String, Change)> = p.objects.iter().map(|o| (o.object.clone(), o.change)).collect();
    assert_eq!(changes, [(work("member-1", &app), Change::Update), (work("member-2", &app), Change::Update)], "{shown}");
    let values = |c: usize| p.objects[c].operations.iter().map(|o| (o["op"].as_str().unwrap_or("").to_owned(), o["value"].clone())).collect::<Vec<_>>();
    assert_eq!(values(0), [("replace".to_owned(), serde_json::json!(3))], "only the web replicas change on member-1: {shown}");
    assert_eq!(values(1), [("replace".to_owned(), serde_json::json!("ghcr.io/acme/shop-api:2.2"))], "only the api image changes on member-2: {shown}");
    let same = ferry_deploy::preview::preview(&cfg, &app.subject(), &DeployApp { operation: DeployOperation::Update, ..app.clone() }).await.unwrap();
    assert!(same.objects.len() == 2 && same.objects.iter().all(|o| o.change == Change::Unchanged && o.operations.is_empty()), "{same:?}");
    // The checks run as a task's: a second deploy of the app would be rejected.
    let again = ferry_deploy::preview::preview(&cfg, &app.subject(), &app).await.unwrap();
    assert!(matches!(&again.checked.verdict, Verdict::Rejected { reason, .. } if reason.contains("already deployed")), "{again:?}");
    let mut blog = app.clone();
    blog.name = "blog".into();
    blog.components.truncate(1);
    let new = ferry_deploy::preview::preview(&cfg, &blog.subject(), &blog).await.unwrap();
    assert_eq!(new.objects.iter().map(|o| (o.object.clone(), o.change)).collect::<Vec<_>>(), [(work("member-1", &blog), Change::Create)]);
    // A delete's: every ManifestWork of the app would go.
    let delete = DeployApp { operation: DeployOperation::Delete, name: "shop".into(), ..DeployApp::default() };
    let gone = ferry_deploy::preview::preview(&cfg, &delete.subject(), &delete).await.unwrap();
    assert_eq!(gone.objects.iter().map(|o| (o.object.clone(), o.change)).collect::<Vec<_>>(), [(work("member-1", &app), Change::Delete), (work("member-2", &app), Change::Delete)], "{gone:?}");
    assert_eq!(versions().await, before, "the dry runs wrote nothing");

    // A second deploy of a deployed app is rejected; so is an update of an unknown one.
    let (_, evs) = demo::submit(&client, &app).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Rejected);
    assert!(last(&evs).message.as_deref().unwrap_or("").contains("already deployed"), "{:?}", last(&evs));

    // Delete removes everything from every cluster.
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
    // Its dry run: the namespace is judged by member-2 and what goes in it named; no
    // ManifestWork. Nothing is written.
    let dry = ferry_deploy::preview::preview(&cfg, &direct.subject(), &direct).await.unwrap();
    let judged: Vec<(&str, &str, Change)> = dry.objects.iter().map(|o| (o.cluster.as_str(), o.object.as_str(), o.change)).collect();
    assert_eq!(judged, [("member-2", "Namespace offloaded-ns", Change::Create), ("member-2", "Deployment offloaded-ns/worker", Change::NotSent)], "{dry:?}");
    assert!(Api::<k8s_openapi::api::core::v1::Namespace>::all(bed.fleet.cluster("member-2").unwrap().client().await.unwrap()).get_opt("offloaded-ns").await.unwrap().is_none());
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
    // Someone else's Deployment of that name where the app would go: the dry run says the
    // run would leave it alone (and fail), as the run's ownership guard does.
    let m2 = bed.fleet.cluster("member-2").unwrap().client().await.unwrap();
    let mut direct = direct.clone();
    direct.components[0].offloaded_namespace = Some("default".into());
    let theirs: Deployment = serde_json::from_value(serde_json::json!({"metadata": {"name": "worker", "namespace": "default"}, "spec": {
        "selector": {"matchLabels": {"app": "theirs"}}, "template": {"metadata": {"labels": {"app": "theirs"}}, "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}}}})).unwrap();
    Api::<Deployment>::namespaced(m2, "default").create(&Default::default(), &theirs).await.unwrap();
    let dry = ferry_deploy::preview::preview(&cfg, &direct.subject(), &direct).await.unwrap();
    let worker = dry.objects.iter().find(|o| o.object == "Deployment default/worker").expect("the Deployment judged");
    assert_eq!(worker.change, Change::Refused, "{dry:?}");
    assert!(worker.refused.as_deref().unwrap_or("").contains("Ferry did not make it for app \"direct\""), "{dry:?}");
    assert!(dry.refused());

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
    let sid = client.submit(TaskKind::SCORE, "placed/score", &scoring, SubmitOptions::default()).await.unwrap();
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
    // An update's dry run that keeps the Placement renders the component for the clusters
    // its decisions name now, and shows the change there (before: "chosen by OCM at run
    // time", nothing compared); one that changes the Placement cannot know them yet.
    let cfg = DeployConfig::new(bed.clusters.clone());
    let mut newer = DeployApp { operation: DeployOperation::Update, ..placed_app(Some("ferry-resource-usage")) };
    newer.components[0].image = "nginx:1.28".into();
    let p = ferry_deploy::preview::preview(&cfg, &newer.subject(), &newer).await.unwrap();
    let shown = serde_json::to_string(&p).unwrap();
    let changes: Vec<(String, Change)> = p.objects.iter().map(|o| (o.object.clone(), o.change)).collect();
    assert_eq!(changes, [("ManifestWork member-2/placed-svc".to_owned(), Change::Update)], "{shown}");
    let ops: Vec<(&str, &serde_json::Value)> = p.objects[0].operations.iter().map(|o| (o["op"].as_str().unwrap_or(""), &o["value"])).collect();
    assert_eq!(ops, [("replace", &serde_json::json!("nginx:1.28"))], "only the image changes: {shown}");
    assert!(p.notes.iter().any(|n| n.contains("on member-2, as Placement placed/svc-svc decides now")), "{shown}");
    newer.components[0].placement.as_mut().unwrap().clusters = Some(2);
    let p = ferry_deploy::preview::preview(&cfg, &newer.subject(), &newer).await.unwrap();
    assert!(p.objects.is_empty() && p.notes.iter().any(|n| n.contains("chosen by OCM at run time")), "{p:?}");
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
        // Registered by its klusterlet, not accepted: the hub has made no namespace for it.
        (rejected(placed_app(None), "unaccepted", |a| {
            a.components[0].placement = None;
            a.components[0].cluster = Some("pending-1".into());
        }), "cluster \"pending-1\" is registered with OCM but not accepted by the hub yet"),
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
    let pending = serde_json::json!({"apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster", "metadata": {"name": "pending-1"}, "spec": {"hubAcceptsClient": false}});
    let mcs: Api<kube::api::DynamicObject> = Api::all_with(hub.clone(), &kube::api::ApiResource::erase::<ferry_kube::kinds::ManagedCluster>(&()));
    mcs.create(&kube::api::PostParams::default(), &serde_json::from_value(pending).unwrap()).await.unwrap();
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

/// Sets that select by a label selector, as OCM's hub makes `global` (`LabelSelector {}`,
/// every cluster) and as an operator makes `gold` (clusters labelled `tier=gold`): the
/// clusters carry no set label, and a namespace bound to those sets only still gets its
/// apps placed and its clusters scored, as OCM's scheduler resolves a set's members.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn label_selector_sets_such_as_global_place_and_score() {
    let Some(bed) = bed().await else { return };
    let client = bed.client();
    let hub = bed.hub().await;
    bed.fleet.publish_kubeconfigs().await.unwrap();
    // Joined in no set: no ManagedCluster carries the set label.
    ferry_testkit::score::register(&bed.fleet, &["member-1", "member-2"], "").await.unwrap();
    let mcs: Api<ferry_kube::kinds::ManagedCluster> = Api::all(hub.clone());
    let gold = serde_json::json!({"metadata": {"labels": {"tier": "gold"}}});
    mcs.patch("member-2", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&gold)).await.unwrap();
    ferry_testkit::cluster::label_selector_set(&hub, "global", serde_json::json!({})).await.unwrap();
    ferry_testkit::cluster::label_selector_set(&hub, "gold", serde_json::json!({"matchLabels": {"tier": "gold"}})).await.unwrap();
    demo::bind(&hub, "everywhere", "global").await.unwrap();
    demo::bind(&hub, "everywhere", "gold").await.unwrap();

    // The score worker resolves each set's members as OCM does.
    let mut events = client.events(false).await.unwrap();
    for (set, want) in [("global", vec!["member-1", "member-2"]), ("gold", vec!["member-2"])] {
        let scoring = ScoreClusters { cluster_set: Some(set.into()), policy: ScorePolicy::ResourceUsage, ..ScoreClusters::default() };
        let sid = client.submit(TaskKind::SCORE, &format!("everywhere/{set}"), &scoring, SubmitOptions::default()).await.unwrap();
        let evs = events.until(sid, WAIT, |e| e.event.is_final()).await.unwrap();
        assert_eq!(last(&evs).event, EventType::Succeeded, "scoring set {set}: {:?}", last(&evs));
        let mut scored: Vec<String> = ferry_testkit::score::ranking(&client, sid).await.unwrap().into_iter().map(|r| r.cluster).collect();
        scored.sort();
        assert_eq!(scored, want, "the members of {set}");
    }

    // A placement over every bound set (so `global`) takes both clusters; one over `gold`
    // takes member-2.
    let app = |name: &str, sets: &[&str], clusters: i32| DeployApp {
        name: name.into(),
        namespace: Some("everywhere".into()),
        owner: "team-g".into(),
        components: vec![Component {
            name: name.into(),
            image: "nginx:1.27".into(),
            cpu: Some("100m".into()),
            placement: Some(PlacementSpec { cluster_sets: sets.iter().map(|s| (*s).to_owned()).collect(), clusters: Some(clusters), ..PlacementSpec::default() }),
            ..Component::default()
        }],
        ready_timeout_seconds: Some(120),
        ..DeployApp::default()
    };
    for (a, want) in [(app("wide", &[], 2), vec!["member-1", "member-2"]), (app("golden", &["gold"], 1), vec!["member-2"])] {
        let (id, evs) = demo::submit(&client, &a).await.unwrap();
        assert_eq!(last(&evs).event, EventType::Succeeded, "{}: {:?}", a.name, last(&evs));
        let mut on: Vec<String> = demo::statuses(&client, id).await.unwrap().into_iter().map(|s| s.cluster).collect();
        on.sort();
        assert_eq!(on, want, "{} runs on the members of its sets", a.name);
        for c in &want {
            assert!(deployment(&bed, c, "everywhere", &a.name).await.is_some(), "{}: its Deployment on {c}", a.name);
        }
    }

    // A Placement changed at the same number of clusters: the decisions there are the old
    // spec's until OCM schedules it again (they carry no generation), so the update takes
    // only decisions that meet its new labels.
    let silver = serde_json::json!({"metadata": {"labels": {"tier": "silver"}}});
    mcs.patch("member-1", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&silver)).await.unwrap();
    let mut moving = app("moving", &["global"], 1);
    let tier = |a: &mut DeployApp, t: &str| a.components[0].placement.as_mut().unwrap().labels = [("tier".to_owned(), t.to_owned())].into();
    for (t, want) in [("gold", "member-2"), ("silver", "member-1")] {
        tier(&mut moving, t);
        let (id, evs) = demo::submit(&client, &moving).await.unwrap();
        assert_eq!(last(&evs).event, EventType::Succeeded, "tier {t}: {:?}", last(&evs));
        let on: Vec<String> = demo::statuses(&client, id).await.unwrap().into_iter().map(|s| s.cluster).collect();
        assert_eq!(on, [want], "tier {t} runs on the cluster of that tier");
        moving.operation = DeployOperation::Update;
    }
    assert!(deployment(&bed, "member-2", "everywhere", "moving").await.is_none(), "the update left member-2");
    bed.stop().await;
}

/// Server-side applies `obj` on `cluster` as "someone else": a field manager that is not
/// Ferry's, no Ferry labels.
async fn someone_else_applies(bed: &Bed, cluster: &str, obj: serde_json::Value) {
    let c = bed.fleet.cluster(cluster).unwrap().client().await.unwrap();
    let gvk = ferry_kube::clusters::gvk_of(&obj).unwrap();
    let (ar, caps) = kube::discovery::pinned_kind(&c, &gvk).await.unwrap();
    let name = obj["metadata"]["name"].as_str().unwrap();
    let api: Api<kube::api::DynamicObject> = match (caps.scope, obj["metadata"]["namespace"].as_str()) {
        (kube::discovery::Scope::Namespaced, Some(ns)) => Api::namespaced_with(c, ns, &ar),
        _ => Api::all_with(c, &ar),
    };
    api.patch(name, &kube::api::PatchParams::apply(OTHER).force(), &kube::api::Patch::Apply(&obj)).await.unwrap();
}

/// The field manager of the objects the tests make as someone else.
const OTHER: &str = "someone-else";

/// Someone else's Deployment `web` in `ns`, with the selector Ferry's would have (so a
/// forced apply could take it over: a selector cannot change).
fn someones_deployment(ns: &str, image: &str) -> serde_json::Value {
    let selector = serde_json::json!({"app.kubernetes.io/name": "web", "app.kubernetes.io/instance": ns});
    serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": ns, "labels": {"team": "other"}},
        "spec": {"replicas": 1, "selector": {"matchLabels": selector},
                 "template": {"metadata": {"labels": selector}, "spec": {"containers": [{"name": "web", "image": image}]}}}})
}

fn managers(meta: &kube::api::ObjectMeta) -> std::collections::BTreeSet<String> {
    meta.managed_fields.iter().flatten().filter_map(|f| f.manager.clone()).collect()
}

async fn namespace(bed: &Bed, cluster: &str, name: &str) -> Option<k8s_openapi::api::core::v1::Namespace> {
    let c = bed.fleet.cluster(cluster).unwrap().client().await.unwrap();
    Api::<k8s_openapi::api::core::v1::Namespace>::all(c).get_opt(name).await.unwrap()
}

fn app_on(name: &str, cluster: &str, delivery: Delivery, image: &str) -> DeployApp {
    DeployApp {
        name: name.into(),
        owner: "team-t".into(),
        delivery,
        components: vec![Component { name: "web".into(), image: image.into(), replicas: Some(2), cluster: Some(cluster.into()), ..Component::default() }],
        ready_timeout_seconds: Some(60),
        ..DeployApp::default()
    }
}

/// Trust boundaries: what Ferry did not make it neither takes over nor deletes. An object
/// of the app's name made by someone else fails the deploy (`OBJECT_NOT_FERRYS`) and is
/// unchanged after the revert; a field someone else took is not forced back; a namespace
/// that was there survives the revert, one the deploy created does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_ferry_did_not_make_it_leaves_alone() {
    let Some(mut bed) = Bed::builder().members(1, 2).ocm().start().await else { return };
    bed.run_worker(DeployHandler::new(DeployConfig::new(bed.clusters.clone())));
    let client = bed.client();
    demo::prepare(&bed.fleet, &["member-1"], "guarded").await.unwrap();
    let hub = bed.hub().await;
    let not_ferrys = |evs: &[ferry_runtime::ProgressEvent]| {
        evs.iter().find(|e| e.event == EventType::StepFailed).cloned().unwrap_or_else(|| panic!("no failed step in {evs:?}"))
    };

    // 1. Someone else's Deployment (and namespace) of the app's name, direct delivery: the
    // deploy fails and reverts; the Deployment is as it was, the namespace is still there.
    someone_else_applies(&bed, "member-1", serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "taken", "labels": {"team": "other"}}})).await;
    someone_else_applies(&bed, "member-1", someones_deployment("taken", "nginx:1.25")).await;
    let before = deployment(&bed, "member-1", "taken", "web").await.unwrap();
    let (_, evs) = demo::submit(&client, &app_on("taken", "member-1", Delivery::Direct, "nginx:1.27")).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Reverted, "{:?}", last(&evs));
    let failed = not_ferrys(&evs);
    assert_eq!(failed.code.as_deref(), Some("OBJECT_NOT_FERRYS"), "{failed:?}");
    let msg = failed.message.clone().unwrap_or_default();
    assert!(msg.contains(r#"cluster "member-1": Deployment taken/web exists and Ferry did not make it for app "taken""#) && msg.contains(OTHER), "{msg}");
    let after = deployment(&bed, "member-1", "taken", "web").await.expect("someone else's Deployment is still there");
    let image = |d: &Deployment| d.spec.template.spec.as_ref().map(|p| p.containers[0].image.clone().unwrap_or_default());
    assert_eq!(image(&after).as_deref(), Some("nginx:1.25"));
    assert_eq!(after.spec.replicas, Some(1));
    assert_eq!(after.metadata.labels, before.metadata.labels);
    assert_eq!(after.metadata.uid, before.metadata.uid, "not deleted and made again");
    // Its field managers: someone else's (and the controllers' status writes), none of Ferry's.
    let by = managers(&after.metadata);
    assert!(by.contains(OTHER) && by.iter().all(|m| m == OTHER || m == "kube-controller-manager"), "{by:?}");
    let ns = namespace(&bed, "member-1", "taken").await.expect("the namespace Ferry found is kept");
    assert!(ns.metadata.deletion_timestamp.is_none());
    assert_eq!(managers(&ns.metadata), [OTHER.to_owned()].into(), "Ferry did not write the namespace either");
    let record = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(hub.clone(), "taken").get_opt("ferry-app-taken").await.unwrap();
    assert!(record.is_none(), "nothing was deployed");

    // 2. A namespace that was there and one the deploy creates: the revert removes Ferry's
    // Deployments from both, deletes the one it created and keeps the other.
    someone_else_applies(&bed, "member-1", serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "found-ns", "labels": {"team": "other"}}})).await;
    let mut homes = app_on("homes", "member-1", Delivery::Direct, "busybox:1.36");
    homes.components[0].replicas = Some(1);
    homes.components.push(Component { name: "found".into(), offloaded_namespace: Some("found-ns".into()), ..homes.components[0].clone() });
    let (id, evs) = demo::submit(&client, &homes).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Succeeded, "{:?}", last(&evs));
    let snap = client.snapshot(id).await.unwrap().expect("a snapshot");
    let used = ferry_deploy::outputs::APPLY.from_snapshot(&snap).expect("the apply output").namespaces.expect("namespaces recorded");
    let used: Vec<(String, bool)> = used.into_iter().map(|n| (n.namespace, n.created)).collect();
    assert_eq!(used, [("found-ns".to_owned(), false), ("homes".to_owned(), true)]);
    let made = namespace(&bed, "member-1", "homes").await.expect("the namespace the deploy created");
    let annotation = made.metadata.annotations.as_ref().and_then(|a| a.get(ferry_deploy::ownership::CREATED_BY_ANNOTATION)).cloned();
    assert_eq!(annotation, Some(id.to_string()));
    assert!(deployment(&bed, "member-1", "found-ns", "found").await.is_some());
    let mut events = client.events(false).await.unwrap();
    client.revert(id).await.unwrap();
    let evs = events.until(id, WAIT, |e| e.event.is_final()).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Reverted, "{:?}", last(&evs));
    assert!(deployment(&bed, "member-1", "found-ns", "found").await.is_none(), "Ferry's Deployment in the found namespace is gone");
    assert!(deployment(&bed, "member-1", "homes", "web").await.is_none());
    let kept = namespace(&bed, "member-1", "found-ns").await.expect("the found namespace is kept");
    assert!(kept.metadata.deletion_timestamp.is_none(), "the found namespace is not being deleted");
    let m1 = bed.fleet.cluster("member-1").unwrap().client().await.unwrap();
    let made_uid = made.metadata.uid.clone().unwrap();
    let gone = kube::runtime::wait::await_condition(Api::<k8s_openapi::api::core::v1::Namespace>::all(m1.clone()), "homes", kube::runtime::wait::conditions::is_deleted(&made_uid));
    tokio::time::timeout(WAIT, gone).await.expect("the namespace the deploy created is deleted by its revert").unwrap();

    // 3. A field someone else took (scaled by hand): an update does not force it back; the
    // task fails (keeping its partial work, as asked) and the replicas stay theirs.
    let held = app_on("held", "member-1", Delivery::Direct, "busybox:1.36");
    let (_, evs) = demo::submit(&client, &held).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Succeeded, "{:?}", last(&evs));
    someone_else_applies(&bed, "member-1", serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "held"}, "spec": {"replicas": 3}})).await;
    let mut update = held.clone();
    update.operation = DeployOperation::Update;
    update.components[0].replicas = Some(4);
    let opts = SubmitOptions { keep_partial: true, ..SubmitOptions::default() };
    let (_, evs) = client.submit_and_wait(TaskKind::DEPLOY, &update.subject(), &update, opts, Duration::from_secs(300)).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Failed, "{:?}", last(&evs));
    let failed = not_ferrys(&evs);
    assert_eq!(failed.code.as_deref(), Some("OBJECT_NOT_FERRYS"), "{failed:?}");
    let msg = failed.message.clone().unwrap_or_default();
    assert!(msg.contains("Deployment held/web") && msg.contains(&format!("[{OTHER:?}]")) && msg.contains(".spec.replicas"), "{msg}");
    let web = deployment(&bed, "member-1", "held", "web").await.unwrap();
    assert_eq!(web.spec.replicas, Some(3), "the replicas stay someone else's");
    assert!(managers(&web.metadata).contains(OTHER));

    // 4. With ManifestWorks: the work agent applies without force, so someone else's
    // Deployment is a conflict it reports, and the deploy fails on it at once. The revert
    // deletes the ManifestWork, and the work agent deletes only what the work owns (ocm
    // `pkg/work/helper/helpers.go`, `DeleteAppliedResources`: what carries its
    // AppliedManifestWork's owner, which a conflicting apply never adds): someone else's
    // Deployment stays as it was; the namespace, which was there and which the work's
    // `SelectivelyOrphan` rule orphans (`OwnedByTheWork`), is never owned and stays too.
    someone_else_applies(&bed, "member-1", serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ocm-taken"}})).await;
    someone_else_applies(&bed, "member-1", someones_deployment("ocm-taken", "nginx:1.25")).await;
    let before = deployment(&bed, "member-1", "ocm-taken", "web").await.unwrap();
    let ns_before = namespace(&bed, "member-1", "ocm-taken").await.unwrap();
    let ocm_taken = app_on("ocm-taken", "member-1", Delivery::ManifestWork, "nginx:1.27");
    let (_, evs) = demo::submit(&client, &ocm_taken).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Reverted, "{:?}", last(&evs));
    let failed = not_ferrys(&evs);
    assert_eq!(failed.code.as_deref(), Some("OBJECT_NOT_FERRYS"), "{failed:?}");
    let msg = failed.message.clone().unwrap_or_default();
    assert!(msg.contains(r#"cluster "member-1": Deployment ocm-taken/web"#) && msg.contains(OTHER), "{msg}");
    // The work agent has finished with the work (its finalizer is off) before anything is looked at.
    let work = ferry_deploy::render::work_name(&ocm_taken);
    ferry_kube::Watches::new()
        .wait_deleted::<ManifestWork>(ferry_kube::HUB, &hub, Some("member-1"), &work, WAIT)
        .await
        .expect("the reverted ManifestWork is gone");
    let after = deployment(&bed, "member-1", "ocm-taken", "web").await.expect("someone else's Deployment survives the ManifestWork's deletion");
    assert_eq!(after.metadata.uid, before.metadata.uid, "not deleted and made again");
    assert!(after.metadata.deletion_timestamp.is_none(), "not being deleted");
    assert_eq!(image(&after).as_deref(), Some("nginx:1.25"));
    assert_eq!(after.spec.replicas, Some(1));
    assert_eq!(after.metadata.labels, before.metadata.labels);
    assert_eq!(after.metadata.owner_references, before.metadata.owner_references, "the work never owned it");
    let by = managers(&after.metadata);
    assert!(by.contains(OTHER) && by.iter().all(|m| m == OTHER || m == "kube-controller-manager"), "{by:?}");
    let ns = namespace(&bed, "member-1", "ocm-taken").await.expect("the namespace is orphaned: it survives the ManifestWork's deletion");
    assert_eq!(ns.metadata.uid, ns_before.metadata.uid);
    assert!(ns.metadata.deletion_timestamp.is_none(), "the namespace is not being deleted");
    assert_eq!(ns.metadata.owner_references, ns_before.metadata.owner_references, "the orphaned namespace never got the work's owner");
    assert_eq!(ns.metadata.labels, ns_before.metadata.labels);
    assert_eq!(ns.metadata.managed_fields, ns_before.metadata.managed_fields, "nobody wrote the namespace");
    bed.stop().await;
}

fn base64(b: &[u8]) -> String {
    base64::Engine::encode(&base64::engine::general_purpose::STANDARD, b)
}

/// An update to an image that never becomes ready fails at its deadline and reverts. A
/// real work agent reports Applied at the work's new generation before its status
/// controller reads the Deployment again (ocm keeps the old feedback until then:
/// `pkg/work/helper/helpers.go`, `mergeManifestCondition`), and that feedback still shows
/// the previous, finished rollout: judged from it, the update would succeed with the broken
/// image. The emulated agent writes the two passes as upstream does, and here its status
/// pass comes 2 s after the apply (`OcmKnobs::status_delay`), so the worker's wait surely
/// reads Applied at the new generation beside the old feedback first; `render`'s unit test
/// `feedback_counts_only_once_read_after_this_apply` shows the judgement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_is_judged_by_feedback_read_after_its_apply() {
    let Some(mut bed) = Bed::builder().members(1, 2).ocm().start().await else { return };
    bed.run_worker(DeployHandler::new(DeployConfig::new(bed.clusters.clone())));
    let client = bed.client();
    demo::prepare(&bed.fleet, &["member-1"], "stale").await.unwrap();
    // Its Pods run and never become ready (a crash-looping release).
    bed.kubelets[0].crash_images(vec!["ferry.invalid/never-ready".into()]);
    let app = app_on("stale", "member-1", Delivery::ManifestWork, "nginx:1.27");
    let (_, evs) = demo::submit(&client, &app).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Succeeded, "{:?}", last(&evs));

    bed.ocm.as_ref().expect("the bed runs OCM").set("member-1", |k| k.status_delay = Duration::from_secs(2));
    let mut broken = app.clone();
    broken.operation = DeployOperation::Update;
    broken.components[0].image = "ferry.invalid/never-ready:2".into();
    broken.ready_timeout_seconds = Some(5);
    let (_, evs) = demo::submit(&client, &broken).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Reverted, "the broken image was judged ready: {evs:?}");
    let failed = evs.iter().find(|e| e.event == EventType::StepFailed).unwrap_or_else(|| panic!("no failed step in {evs:?}"));
    assert_eq!((failed.step_name.as_deref(), failed.code.as_deref()), (Some("wait"), Some("NOT_READY")), "{failed:?}");
    let web = deployment(&bed, "member-1", "stale", "web").await.expect("the app is still there");
    let image = web.spec.template.spec.map(|p| p.containers[0].image.clone().unwrap_or_default());
    assert_eq!(image.as_deref(), Some("nginx:1.27"), "the revert put the previous image back");

    bed.stop().await;
}

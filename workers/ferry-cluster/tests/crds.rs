//! Every manifest the worker renders passes a real API server's validation against the
//! upstream CRDs (../shared/crds: Cluster API v1.14, CAPO v0.15, OCM v1.3), by server-side
//! dry run; and the validation is real: a manifest that breaks a schema is refused.

use ferry_cluster::render;
use ferry_cluster::spec::{ClusterCommand, MachinePool, OcmRegistration, OpenStackSettings, WorkerPool};
use ferry_kube::{Clusters, HUB};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

fn commands() -> Vec<ClusterCommand> {
    let docker = ClusterCommand {
        name: "edge-1".into(),
        namespace: Some("fleet".into()),
        infrastructure: "docker".into(),
        version: "v1.33.1".into(),
        control_plane: MachinePool { count: Some(3), flavor: None },
        workers: WorkerPool { count: Some(2), flavor: None },
        image: Some("kindest/node:v1.33.1".into()),
        pods_cidr: Some("10.244.0.0/16".into()),
        labels: [("tier".to_owned(), "edge".to_owned())].into(),
        ocm: OcmRegistration { enabled: true, cluster_set: Some("edge".into()) },
        ..ClusterCommand::default()
    };
    let openstack = ClusterCommand {
        name: "cloud-1".into(),
        infrastructure: "openstack".into(),
        image: Some("ubuntu-2404-kube-v1.33.1".into()),
        control_plane: MachinePool { count: Some(1), flavor: Some("m1.medium".into()) },
        workers: WorkerPool { count: Some(3), flavor: Some("m1.large".into()) },
        openstack: Some(OpenStackSettings {
            cloud_secret: "cloud-config".into(),
            cloud: Some("mycloud".into()),
            external_network_id: Some("6c90b532-7ba0-418a-a276-5ae55060b5b0".into()),
            api_server_floating_ip: Some("172.24.4.10".into()),
            node_cidr: Some("10.6.0.0/24".into()),
            dns_nameservers: vec!["8.8.8.8".into()],
            ssh_key: Some("ops".into()),
        }),
        ..docker.clone()
    };
    let topology = ClusterCommand { name: "classy".into(), cluster_class: Some("quick-start".into()), ..docker.clone() };
    vec![docker, openstack, topology]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rendered_manifests_pass_the_upstream_schemas() {
    let Some((_fleet, hub, installed)) =
        ferry_fleet::crds::upstream_hub(&["cluster-api", "cluster-api-provider-openstack", "open-cluster-management"]).await.unwrap()
    else {
        return;
    };
    assert!(installed.len() >= 15, "{installed:?}");
    let pp = PatchParams::apply("test");
    Api::<Namespace>::all(hub.clone())
        .patch("fleet", &pp, &Patch::Apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "fleet"}})))
        .await
        .unwrap();
    let clusters = Clusters::new(hub.clone());

    let mut checked = 0;
    for cmd in commands() {
        let topology = if cmd.cluster_class.is_some() { render::Topology::worker("default-worker") } else { render::Topology::default() };
        let mut objects = render::objects(&cmd, "0f0e0d0c-0b0a-0908-0706-050403020100", &topology);
        objects.push(render::managed_cluster(&cmd));
        for o in &objects {
            let got = match clusters.dry_run_apply(HUB, o, render::MANAGER).await {
                Ok(got) => got,
                Err(e) => panic!("{} {} of {} fails the upstream schema: {e}", o["kind"], o["metadata"]["name"], cmd.name),
            };
            // The API server prunes fields a schema does not know: a misspelt field would
            // vanish silently. Everything sent must come back.
            let lost = ferry_fleet::crds::pruned(&o["spec"], &got.data["spec"]);
            assert!(lost.is_empty(), "{} {}: the schema pruned {lost:?}", o["kind"], o["metadata"]["name"]);
            checked += 1;
        }
    }
    assert_eq!(checked, 7 + 1 + 7 + 1 + 1 + 1, "every object of the three commands was checked");

    // The dry runs validate for real: schema violations are refused.
    let broken = [
        // OpenStack network ids are UUIDs.
        {
            let mut o = render::objects(&commands()[1], "t", &render::Topology::default())[3].clone();
            o["spec"]["externalNetwork"]["id"] = json!("public");
            o
        },
        // A MachineDeployment needs a clusterName.
        {
            let mut o = render::objects(&commands()[0], "t", &render::Topology::default())[5].clone();
            o["spec"].as_object_mut().unwrap().remove("clusterName");
            o
        },
        // References in v1beta2 are {apiGroup, kind, name}; the v1beta1 apiVersion is gone.
        {
            let mut o = render::objects(&commands()[0], "t", &render::Topology::default())[6].clone();
            o["spec"]["controlPlaneRef"] = json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "KubeadmControlPlane", "name": "x"});
            o
        },
    ];
    for o in &broken {
        let e = clusters.dry_run_apply(HUB, o, render::MANAGER).await.expect_err(&format!("{} must be refused", o["kind"]));
        assert!(e.to_string().contains("Invalid") || e.to_string().contains("invalid") || e.to_string().contains("Required"), "{e}");
    }
}

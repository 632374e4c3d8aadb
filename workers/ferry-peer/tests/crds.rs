//! Every object the peer worker creates passes a real API server's validation against the
//! upstream CRDs (../shared/crds: Liqo v1, OCM, the Submariner add-on), by server-side dry
//! run, and nothing it sends is pruned as unknown.

use ferry_kube::{Clusters, HUB};
use ferry_peer::{liqo, submariner};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peering_objects_pass_the_upstream_schemas() {
    let Some((_fleet, hub, installed)) = ferry_fleet::crds::upstream_hub(&["liqo", "open-cluster-management", "submariner-addon"]).await.unwrap() else {
        return;
    };
    assert!(installed.len() >= 25, "{installed:?}");
    let pp = PatchParams::apply("test");
    for ns in [liqo::tenant_namespace("member-1"), liqo::tenant_namespace("member-2"), "member-1".into(), "member-2".into()] {
        Api::<Namespace>::all(hub.clone())
            .patch(&ns, &pp, &Patch::Apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})))
            .await
            .unwrap();
    }
    let clusters = Clusters::new(hub.clone());
    let pair = liqo::pair_label("member-1", "member-2");
    let cidrs = liqo::Cidrs { pod: vec!["10.244.0.0/16".into()], external: "10.70.0.0/16".into() };
    let h = liqo::Handshake { public_key: b"-----BEGIN PUBLIC KEY-----".to_vec(), csr: b"csr".to_vec(), signature: vec![1, 2, 3] };
    let auth_params = json!({"signedCRT": "Y2VydA==", "ca": "Y2E=", "apiServer": "https://127.0.0.1:6443"});
    let (to_1, to_2) = (liqo::Toward::new("member-1", ""), liqo::Toward::new("member-2", ""));
    let objects = [
        liqo::namespace(&to_2, &pair),
        liqo::configuration(&to_2, &cidrs, &pair),
        liqo::gateway_server(&to_1, &pair),
        liqo::gateway_client(&to_2, &["198.51.100.7".into()], liqo::GATEWAY_PORT, &pair),
        liqo::public_key(&to_2, &[7; 32], ("GatewayClient", "member-2", "0b7a2c1e-0000-4000-8000-000000000000"), &pair),
        liqo::tenant(&to_1, &h, &pair),
        liqo::identity(&to_2, &auth_params, "liqo-tenant-member-1", &pair),
        liqo::resource_slice(&to_2, &pair),
        submariner::cluster_set("submariner", &pair),
        submariner::config("member-1", &pair),
        submariner::addon("member-1", &pair),
    ];
    for o in &objects {
        let got = match clusters.dry_run_apply(HUB, o, "ferry-peer").await {
            Ok(got) => got,
            Err(e) => panic!("{} {} fails the upstream schema: {e}", o["kind"], o["metadata"]["name"]),
        };
        let lost = if o.get("spec").is_some() { ferry_fleet::crds::pruned(&o["spec"], &got.data["spec"]) } else { Vec::new() };
        assert!(lost.is_empty(), "{} {}: the schema pruned {lost:?}", o["kind"], o["metadata"]["name"]);
    }

    // The validation is real: a GatewayClient's protocol is an enum.
    let mut broken = liqo::gateway_client(&to_2, &["198.51.100.7".into()], liqo::GATEWAY_PORT, &pair);
    broken["spec"]["endpoint"]["protocol"] = json!("SCTP");
    let e = clusters.dry_run_apply(HUB, &broken, "ferry-peer").await.expect_err("an invalid protocol is refused");
    assert!(e.to_string().contains("protocol"), "{e}");
}

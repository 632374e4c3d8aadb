//! Set-up the work agent's tests share: a hub and one member (`member-1`) with the
//! upstream CRDs, the emulated OCM with the member's knobs set, and the member's
//! namespace on the hub where its ManifestWorks go.

use ferry_fleet::emulated_ocm::{EmulatedOcm, OcmKnobs};
use ferry_fleet::{Fleet, FleetOptions};
use ferry_kube::kinds::ManifestWork;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

/// A hub, `member-1` and its work agent; dropping it stops them.
pub struct WorkAgentBed {
    /// The member's ManifestWorks on the hub.
    pub works: Api<ManifestWork>,
    /// ConfigMaps in the member's `default` namespace.
    pub configmaps: Api<ConfigMap>,
    /// The emulated OCM, to change a knob later.
    #[allow(dead_code, reason = "each test binary compiles this module; not every test changes a knob later")]
    pub ocm: EmulatedOcm,
    // Dropped last: the emulated controllers stop before their API servers.
    _fleet: Fleet,
}

/// Starts the bed with the member's agent set by `knobs` before its first pass.
pub async fn work_agent_bed(knobs: impl FnOnce(&mut OcmKnobs)) -> WorkAgentBed {
    let _ = tracing_subscriber::fmt().with_env_filter(std::env::var("RUST_LOG").unwrap_or("warn".into())).with_test_writer().try_init();
    let fleet = Fleet::start(FleetOptions { crds: true, ..FleetOptions::hub_and(1) }).await.unwrap();
    fleet.install_crds().await.unwrap();
    let ocm = EmulatedOcm::start(&fleet).await.unwrap();
    ocm.set("member-1", knobs);
    let hub = fleet.hub().client().await.unwrap();
    let member = fleet.cluster("member-1").unwrap().client().await.unwrap();
    let ns = serde_json::from_value(json!({"metadata": {"name": "member-1"}})).unwrap();
    Api::<Namespace>::all(hub.clone()).patch("member-1", &PatchParams::apply("test"), &Patch::Apply::<Namespace>(ns)).await.unwrap();
    WorkAgentBed { works: Api::namespaced(hub, "member-1"), configmaps: Api::namespaced(member, "default"), ocm, _fleet: fleet }
}

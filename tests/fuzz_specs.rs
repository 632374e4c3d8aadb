//! Poison input for every kind, without a broker: random datums framed with every schema id
//! the registry holds (and ids it does not), and damaged valid specs of every kind, go
//! through the real decoder and, when they decode, through the kind's own `validate()`.
//! Nothing panics, and whatever decodes re-encodes (tests/poison.rs sends such records to
//! running workers).

// Each kind registers itself in its worker crate (ferry_task::kind): link every one Ferry
// ships, as the `ferry` binary does, so that topics and schemas cover them all.
use {ferry_cluster as _, ferry_deploy as _, ferry_offload as _, ferry_peer as _, ferry_plan as _, ferry_score as _};

use ferry_cluster::addons::Catalog;
use ferry_cluster::spec::ClusterCommand;
use ferry_deploy::spec::DeployApp;
use ferry_offload::spec::OffloadCommand;
use ferry_peer::spec::PeerClusters;
use ferry_runtime::protocol::{CommandEnvelope, TaskSnapshot};
use ferry_runtime::step::TaskHandler;
use ferry_runtime::testkind::{TestHandler, TestTaskSpec};
use ferry_runtime::wire::{Registry, embedded_schemas};
use ferry_score::spec::ScoreClusters;
use proptest::prelude::*;

/// Built once: a registry parses every schema, and derives names on first use.
static REGISTRY: std::sync::LazyLock<Registry> = std::sync::LazyLock::new(Registry::embedded);
static CATALOG: std::sync::LazyLock<Catalog> = std::sync::LazyLock::new(Catalog::builtin);

/// Decodes `bytes` as every record a worker reads, and validates what decodes.
fn through_every_decoder(r: &Registry, catalog: &Catalog, bytes: &[u8]) -> Result<(), TestCaseError> {
    macro_rules! roundtrip {
        ($v:expr) => {
            prop_assert!(r.encode(&$v).is_ok(), "decoded but does not re-encode: {:?}", $v)
        };
    }
    if let Ok(e) = r.decode::<CommandEnvelope>(bytes) {
        roundtrip!(e);
    }
    if let Ok(s) = r.decode::<TaskSnapshot>(bytes) {
        roundtrip!(s);
    }
    if let Ok(s) = r.decode::<TestTaskSpec>(bytes) {
        let _ = TestHandler { min_delay: None, effects: None }.validate("fuzz", &s);
        roundtrip!(s);
    }
    if let Ok(s) = r.decode::<ScoreClusters>(bytes) {
        let _ = ferry_score::validate::validate(&s);
        roundtrip!(s);
    }
    if let Ok(s) = r.decode::<DeployApp>(bytes) {
        let _ = ferry_deploy::validate::validate(&s.subject(), &s);
        roundtrip!(s);
    }
    if let Ok(s) = r.decode::<ClusterCommand>(bytes) {
        let _ = ferry_cluster::validate::validate(&s.subject(), &s, catalog);
        roundtrip!(s);
    }
    if let Ok(s) = r.decode::<PeerClusters>(bytes) {
        let _ = ferry_peer::spec::validate(&s.subject(), &s);
        roundtrip!(s);
    }
    if let Ok(s) = r.decode::<OffloadCommand>(bytes) {
        let _ = ferry_offload::spec::validate(&s.subject(), &s);
        roundtrip!(s);
    }
    Ok(())
}

/// Every schema id the registry holds, and ids around them that it does not.
fn ids() -> impl Strategy<Value = u32> {
    let known: Vec<u32> = embedded_schemas().iter().map(|(id, _, _)| *id).collect();
    prop_oneof![proptest::sample::select(known), 0u32..64, any::<u32>()]
}

/// A valid spec of every kind, encoded.
fn valid_specs(r: &Registry) -> Vec<Vec<u8>> {
    vec![
        r.encode(&TestTaskSpec::steps(3)).unwrap(),
        r.encode(&ScoreClusters { clusters: vec!["member-1".into(), "member-2".into()], ..Default::default() }).unwrap(),
        r.encode(&DeployApp { name: "web".into(), namespace: Some("hello".into()), owner: "fuzz".into(), ..Default::default() }).unwrap(),
        r.encode(&ClusterCommand { name: "edge-1".into(), infrastructure: "docker".into(), ..Default::default() }).unwrap(),
        r.encode(&PeerClusters { a: "member-1".into(), b: "member-2".into(), ..Default::default() }).unwrap(),
        r.encode(&OffloadCommand { cluster: "member-1".into(), namespace: "web".into(), clusters: vec!["member-2".into()], ..Default::default() }).unwrap(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn every_schema_id_with_a_random_datum_decodes_or_errs(id in ids(), datum in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut bytes = vec![0];
        bytes.extend_from_slice(&id.to_be_bytes());
        bytes.extend_from_slice(&datum);
        through_every_decoder(&REGISTRY, &CATALOG, &bytes)?;
    }

    #[test]
    fn damaged_specs_of_every_kind_decode_or_err(which in 0usize..6, cut in 0usize..400, flips in proptest::collection::vec((0usize..400, any::<u8>()), 0..6)) {
        let mut bytes = valid_specs(&REGISTRY).swap_remove(which);
        for (at, b) in flips {
            let n = bytes.len();
            bytes[at % n] ^= b;
        }
        bytes.truncate(cut.min(bytes.len()));
        through_every_decoder(&REGISTRY, &CATALOG, &bytes)?;
    }
}

/// No command may name the hub as a managed cluster: each kind's own `validate()`
/// refuses it, naming the hub.
#[test]
fn no_command_names_the_hub_as_a_cluster() {
    let hub = ferry_kube::HUB;
    let score = ferry_score::spec::ScoreClusters { clusters: vec![hub.into()], ..Default::default() };
    assert!(ferry_score::validate::validate(&score).unwrap_err().to_string().contains("names the hub"));
    let deploy = ferry_deploy::spec::DeployApp {
        name: "app".into(),
        owner: "o".into(),
        components: vec![ferry_deploy::spec::Component { name: "web".into(), image: "nginx:1.27".into(), cluster: Some(hub.into()), ..Default::default() }],
        ..Default::default()
    };
    assert!(ferry_deploy::validate::validate(&deploy.subject(), &deploy).unwrap_err().to_string().contains("names the hub"));
    let create = ferry_cluster::spec::ClusterCommand { name: hub.into(), infrastructure: "docker".into(), version: "v1.33.1".into(), ..Default::default() };
    assert!(ferry_cluster::validate::validate(&create.subject(), &create, &ferry_cluster::Catalog::builtin()).unwrap_err().to_string().contains("names the hub"));
    let peer = ferry_peer::spec::PeerClusters { a: hub.into(), b: "member-1".into(), ..Default::default() };
    assert!(ferry_peer::spec::validate(&peer.subject(), &peer).unwrap_err().to_string().contains("names the hub"));
    let offload = ferry_offload::spec::OffloadCommand { cluster: hub.into(), namespace: "apps".into(), ..Default::default() };
    assert!(ferry_offload::spec::validate(&offload.subject(), &offload).unwrap_err().to_string().contains("names the hub"));
}

//! The committed `schemas/PeerClusters.v2.avsc` equals the Rust type (`FERRY_BLESS=1`
//! rewrites it) and is registered; a command written with version 1 (before
//! `ForceUnpeer`) still decodes; a command round-trips; the examples are valid.

use apache_avro::AvroSchema;
use ferry_peer::spec::{PeerClusters, PeerOperation, validate};

#[test]
fn committed_schema_equals_the_rust_type() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schemas");
    if let Err(problems) = ferry_runtime::wire::check_committed(&dir, &[("PeerClusters.v2.avsc", PeerClusters::get_schema())]) {
        panic!("{}", problems.join("\n"));
    }
}

#[test]
fn a_command_written_with_version_1_still_decodes() {
    // Version 1 (id 20) knew Peer and Unpeer; a reader of version 2 (id 21) reads them.
    let r = ferry_runtime::wire::Registry::embedded();
    assert_eq!(r.id_of::<PeerClusters>().unwrap(), 21);
    let un = PeerClusters { operation: PeerOperation::Unpeer, a: "member-1".into(), b: "member-2".into(), ..PeerClusters::default() };
    let v2 = r.encode(&un).unwrap();
    let mut datum = &v2[5..];
    let value = apache_avro::from_avro_datum(r.schema(21).unwrap(), &mut datum, None).unwrap();
    let mut bytes = vec![0, 0, 0, 0, 20];
    bytes.extend(apache_avro::to_avro_datum(r.schema(20).unwrap(), value).unwrap());
    assert_eq!(r.decode::<PeerClusters>(&bytes).unwrap(), un);
    let force = PeerClusters { operation: PeerOperation::ForceUnpeer, ..un };
    assert_eq!(r.decode::<PeerClusters>(&r.encode(&force).unwrap()).unwrap(), force);
    // Version 1 cannot carry the new operation: a writer of version 1 is refused, not misread.
    let mut datum = &r.encode(&force).unwrap()[5..];
    let value = apache_avro::from_avro_datum(r.schema(21).unwrap(), &mut datum, None).unwrap();
    assert!(apache_avro::to_avro_datum(r.schema(20).unwrap(), value).is_err());
}

#[test]
fn a_command_round_trips_and_the_examples_are_valid() {
    let r = ferry_runtime::wire::Registry::embedded();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    for f in ["peer-liqo.yaml", "peer-submariner.yaml", "peer-force-unpeer.yaml"] {
        let file: serde_yaml_ng::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(dir.join(f)).unwrap()).unwrap();
        let p: PeerClusters = serde_yaml_ng::from_value(file["spec"].clone()).unwrap_or_else(|e| panic!("{f}: {e}"));
        validate(&p.subject(), &p).unwrap_or_else(|e| panic!("{f}: {e}"));
        let bytes = r.encode(&p).unwrap();
        assert_eq!(r.decode::<PeerClusters>(&bytes).unwrap(), p);
    }
}

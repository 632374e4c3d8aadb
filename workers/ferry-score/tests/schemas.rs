//! The committed `schemas/ScoreClusters.avsc` and `schemas/ClusterScore.avsc` equal the
//! Rust types (`FERRY_BLESS=1` rewrites them) and are registered.

use apache_avro::AvroSchema;
use ferry_score::spec::{ClusterScore, ScoreClusters};

#[test]
fn committed_schemas_equal_the_rust_types() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schemas");
    let derived = [("ScoreClusters.avsc", ScoreClusters::get_schema()), ("ClusterScore.avsc", ClusterScore::get_schema())];
    if let Err(problems) = ferry_runtime::wire::check_committed(&dir, &derived) {
        panic!("{}", problems.join("\n"));
    }
}

#[test]
fn a_command_round_trips_through_the_wire_format() {
    let r = ferry_runtime::wire::Registry::embedded();
    let spec: ScoreClusters = serde_json::from_value(serde_json::json!({
        "clusters": ["a", "b"], "policy": "latency-aware", "source": "eu",
        "latency_ms": {"eu": {"a": 3, "b": 30}},
    }))
    .unwrap();
    let bytes = r.encode(&spec).unwrap();
    assert_eq!(r.decode::<ScoreClusters>(&bytes).unwrap(), spec);
}

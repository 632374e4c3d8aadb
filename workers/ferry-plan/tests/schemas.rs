//! The committed `schemas/PlanSpec.v3.avsc` equals the Rust type (`FERRY_BLESS=1` rewrites
//! it) and is registered; a plan written with version 1 (before `for_each`) still decodes;
//! a plan round-trips through the wire format.

use apache_avro::AvroSchema;
use ferry_plan::spec::PlanSpec;

#[test]
fn committed_schema_equals_the_rust_type() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schemas");
    if let Err(problems) = ferry_task::wire::check_committed(&dir, &[("PlanSpec.v3.avsc", PlanSpec::get_schema())]) {
        panic!("{}", problems.join("\n"));
    }
}

#[test]
fn a_plan_written_with_version_1_still_decodes() {
    // Version 1 (id 60) had no `for_each`; a reader of version 3 (id 62) gives each step none.
    let r = ferry_task::wire::Registry::embedded();
    let spec: PlanSpec = serde_json::from_value(serde_json::json!({"steps": [{"name": "one", "kind": "test", "subject": "s", "spec": {"steps": 2}}]})).unwrap();
    let old = apache_avro::types::Value::Record(vec![(
        "steps".into(),
        apache_avro::types::Value::Array(vec![apache_avro::types::Value::Record(vec![
            ("name".into(), "one".into()),
            ("kind".into(), "test".into()),
            ("subject".into(), apache_avro::types::Value::Union(1, Box::new("s".into()))),
            ("spec".into(), r#"{"steps":2}"#.into()),
            ("keep".into(), false.into()),
        ])]),
    )]);
    let mut bytes = vec![0, 0, 0, 0, 60];
    bytes.extend(apache_avro::to_avro_datum(r.schema(60).unwrap(), old).unwrap());
    assert_eq!(r.id_of::<PlanSpec>().unwrap(), 62);
    assert_eq!(r.decode::<PlanSpec>(&bytes).unwrap(), spec);
}

#[test]
fn a_plan_round_trips_through_the_wire_format() {
    let r = ferry_task::wire::Registry::embedded();
    let spec: PlanSpec = serde_json::from_value(serde_json::json!({"steps": [
        {"name": "one", "kind": "test", "subject": "s", "spec": {"steps": 2}},
        {"name": "two", "kind": "peer", "spec": {"a": "x", "b": "${steps.one.subject}"}, "keep": true},
        {"name": "roll", "kind": "test", "subject": "${cluster}/app", "spec": {"steps": 1}, "for_each": {
            "labels": {"env": "prod"}, "waves": {"size": 5, "max_in_flight": 2, "soak_seconds": 30,
                "gate": {"available": true, "score": {"name": "ferry-resource-usage", "item": "score", "min": 20}}}, "on_failure": "revert-wave",
            "overrides": [{"clusters": ["c3"], "spec": {"fail_at": 1}}],
        }},
    ]}))
    .unwrap();
    let bytes = r.encode(&spec).unwrap();
    assert_eq!(r.decode::<PlanSpec>(&bytes).unwrap(), spec);
}

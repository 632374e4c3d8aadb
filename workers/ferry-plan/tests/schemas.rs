//! The committed `schemas/PlanSpec.avsc` equals the Rust type (`FERRY_BLESS=1` rewrites
//! it) and is registered; a plan round-trips through the wire format.

use ferry_plan::spec::PlanSpec;

ferry_task::committed_schemas!(PlanSpec);

#[test]
fn a_plan_round_trips_through_the_wire_format() {
    let r = ferry_task::wire::Registry::embedded();
    let spec: PlanSpec = serde_json::from_value(serde_json::json!({"steps": [
        {"name": "one", "kind": "test", "subject": "s", "spec": {"steps": 2}},
        {"name": "two", "kind": "peer", "spec": {"a": "x", "b": "${steps.one.subject}"}, "keep": true},
    ]}))
    .unwrap();
    let bytes = r.encode(&spec).unwrap();
    assert_eq!(r.decode::<PlanSpec>(&bytes).unwrap(), spec);
}

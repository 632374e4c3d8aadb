//! The committed `schemas/OffloadCommand.avsc` equals the Rust type (`FERRY_BLESS=1`
//! rewrites it) and is registered; a command round-trips; the examples are valid.

use apache_avro::AvroSchema;
use ferry_offload::spec::{OffloadCommand, validate};

#[test]
fn committed_schema_equals_the_rust_type() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schemas");
    if let Err(problems) = ferry_runtime::wire::check_committed(&dir, &[("OffloadCommand.avsc", OffloadCommand::get_schema())]) {
        panic!("{}", problems.join("\n"));
    }
}

#[test]
fn a_command_round_trips_and_the_examples_are_valid() {
    let r = ferry_runtime::wire::Registry::embedded();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    for f in ["offload-namespace.yaml", "burst.yaml"] {
        let file: serde_yaml_ng::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(dir.join(f)).unwrap()).unwrap();
        let c: OffloadCommand = serde_yaml_ng::from_value(file["spec"].clone()).unwrap_or_else(|e| panic!("{f}: {e}"));
        validate(&c.subject(), &c).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert_eq!(file["subject"].as_str(), Some(c.subject().as_str()), "{f}: the subject is cluster/namespace");
        let bytes = r.encode(&c).unwrap();
        assert_eq!(r.decode::<OffloadCommand>(&bytes).unwrap(), c);
    }
}

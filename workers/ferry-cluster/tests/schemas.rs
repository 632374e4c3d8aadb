//! The committed `schemas/ClusterCommand.v2.avsc` equals the Rust type (`FERRY_BLESS=1`
//! rewrites it) and is registered; a command written with version 1 (before topology
//! variables) still decodes; a command round-trips through the wire format; the example
//! commands are valid.

use apache_avro::AvroSchema;
use ferry_cluster::Catalog;
use ferry_cluster::spec::ClusterCommand;

#[test]
fn committed_schema_equals_the_rust_type() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schemas");
    if let Err(problems) = ferry_runtime::wire::check_committed(&dir, &[("ClusterCommand.v2.avsc", ClusterCommand::get_schema())]) {
        panic!("{}", problems.join("\n"));
    }
}

#[test]
fn a_command_written_with_version_1_still_decodes() {
    // Version 1 (id 30) had no `variables`; a reader of version 2 (id 31) gives it none.
    // A version-1 record, as a worker before this change wrote it: the datum without
    // the field, framed with id 30.
    let r = ferry_runtime::wire::Registry::embedded();
    let cmd = ClusterCommand { name: "edge-1".into(), infrastructure: "docker".into(), version: "v1.33.1".into(), ..ClusterCommand::default() };
    let v2 = r.encode(&cmd).unwrap();
    let mut datum = &v2[5..];
    let apache_avro::types::Value::Record(fields) = apache_avro::from_avro_datum(r.schema(31).unwrap(), &mut datum, None).unwrap() else { panic!("a record") };
    let old: Vec<_> = fields.into_iter().filter(|(k, _)| k != "variables").collect();
    let mut bytes = vec![0, 0, 0, 0, 30];
    bytes.extend(apache_avro::to_avro_datum(r.schema(30).unwrap(), apache_avro::types::Value::Record(old)).unwrap());
    assert_eq!(r.id_of::<ClusterCommand>().unwrap(), 31);
    assert_eq!(r.decode::<ClusterCommand>(&bytes).unwrap(), cmd);
    let with_vars = ClusterCommand { cluster_class: Some("quick-start".into()), variables: [("region".to_owned(), "eu-1".to_owned())].into(), ..cmd };
    assert_eq!(r.decode::<ClusterCommand>(&r.encode(&with_vars).unwrap()).unwrap(), with_vars);
}

#[test]
fn a_command_round_trips_through_the_wire_format() {
    let r = ferry_runtime::wire::Registry::embedded();
    let cmd: ClusterCommand = serde_yaml_ng::from_str(
        r#"
name: edge-1
namespace: fleet
infrastructure: openstack
version: v1.33.1
control_plane: {count: 3, flavor: m1.medium}
workers: {count: 2, flavor: m1.large}
image: ubuntu-2404-kube-v1.33.1
openstack: {cloud_secret: cloud-config, external_network_id: 6c90b532-7ba0-418a-a276-5ae55060b5b0}
addons: [{name: cni}, {name: metallb, params: {address_pool: 10.0.0.100-10.0.0.120}}]
ocm: {enabled: true, cluster_set: edge}
"#,
    )
    .unwrap();
    let bytes = r.encode(&cmd).unwrap();
    assert_eq!(r.decode::<ClusterCommand>(&bytes).unwrap(), cmd);
}

#[test]
fn the_examples_are_valid_commands() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    for f in ["create-cluster.yaml", "create-cluster-openstack.yaml", "scale-cluster.yaml", "delete-cluster.yaml"] {
        let text = std::fs::read_to_string(dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        let file: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
        let cmd: ClusterCommand = serde_yaml_ng::from_value(file["spec"].clone()).unwrap_or_else(|e| panic!("{f}: {e}"));
        ferry_cluster::validate::validate(&cmd.subject(), &cmd, &Catalog::builtin()).unwrap_or_else(|e| panic!("{f}: {e}"));
    }
}

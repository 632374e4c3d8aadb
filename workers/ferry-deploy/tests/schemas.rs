//! The committed `schemas/DeployApp.avsc` equals the Rust type (`FERRY_BLESS=1` rewrites
//! it) and is registered; a command round-trips through the wire format.

use apache_avro::AvroSchema;
use ferry_deploy::spec::DeployApp;

#[test]
fn committed_schema_equals_the_rust_type() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schemas");
    if let Err(problems) = ferry_runtime::wire::check_committed(&dir, &[("DeployApp.avsc", DeployApp::get_schema())]) {
        panic!("{}", problems.join("\n"));
    }
}

#[test]
fn a_command_round_trips_through_the_wire_format() {
    let r = ferry_runtime::wire::Registry::embedded();
    let spec: DeployApp = serde_yaml_ng::from_str(
        r#"
operation: update
name: shop
owner: team-a
components:
  - name: web
    image: nginx:1.27
    replicas: 2
    ports: [{port: 80}]
    ingress: {host: shop.example.com}
    placement: {cluster_sets: [edge], labels: {tier: gold}, score: ferry-resource-usage}
"#,
    )
    .unwrap();
    let bytes = r.encode(&spec).unwrap();
    assert_eq!(r.decode::<DeployApp>(&bytes).unwrap(), spec);
}

#[test]
fn the_examples_are_valid_commands() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let file: serde_yaml_ng::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(dir.join("deploy.yaml")).unwrap()).unwrap();
    let app: DeployApp = serde_yaml_ng::from_value(file["spec"].clone()).unwrap();
    ferry_deploy::validate::validate(&app.subject(), &app).unwrap();
    let overrides = ferry_deploy::tosca::Overrides { cluster: Some("member-1".into()), ..Default::default() };
    let converted = ferry_deploy::tosca::convert(&std::fs::read_to_string(dir.join("blog.tosca.yaml")).unwrap(), &overrides).unwrap();
    assert_eq!(converted.skipped, ["mailer"]);
    ferry_deploy::validate::validate(&converted.app.subject(), &converted.app).unwrap();
}

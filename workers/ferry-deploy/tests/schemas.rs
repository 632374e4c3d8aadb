//! The committed `schemas/DeployApp.v2.avsc` equals the Rust type (`FERRY_BLESS=1`
//! rewrites it) and is registered; a command written with version 1 (before `external`)
//! still decodes; a command round-trips through the wire format.

use apache_avro::AvroSchema;
use ferry_deploy::spec::DeployApp;

#[test]
fn committed_schema_equals_the_rust_type() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schemas");
    if let Err(problems) = ferry_runtime::wire::check_committed(&dir, &[("DeployApp.v2.avsc", DeployApp::get_schema())]) {
        panic!("{}", problems.join("\n"));
    }
}

#[test]
fn a_command_written_with_version_1_still_decodes() {
    // Version 1 (id 50) had no `external`; a reader of version 2 (id 51) gives it none.
    let r = ferry_runtime::wire::Registry::embedded();
    let app = DeployApp { name: "shop".into(), owner: "team-a".into(), ..DeployApp::default() };
    let v2 = r.encode(&app).unwrap();
    let mut datum = &v2[5..];
    let apache_avro::types::Value::Record(fields) = apache_avro::from_avro_datum(r.schema(51).unwrap(), &mut datum, None).unwrap() else { panic!("a record") };
    let old: Vec<_> = fields.into_iter().filter(|(k, _)| k != "external").collect();
    let mut bytes = vec![0, 0, 0, 0, 50];
    bytes.extend(apache_avro::to_avro_datum(r.schema(50).unwrap(), apache_avro::types::Value::Record(old)).unwrap());
    assert_eq!(r.id_of::<DeployApp>().unwrap(), 51);
    assert_eq!(r.decode::<DeployApp>(&bytes).unwrap(), app);
    let with = DeployApp { external: vec!["charity-kafka".into()], ..app };
    assert_eq!(r.decode::<DeployApp>(&r.encode(&with).unwrap()).unwrap(), with);
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

//! JSON Schemas of the spec files `ferry submit <kind> -f FILE` reads (`subject:` and the
//! kind's `spec:`), generated from the kinds' spec types with schemars, for editors: each
//! example names its kind's schema in a yaml-language-server modeline. The committed
//! `schemas/json/<kind>.schema.json` must equal what the types give (`FERRY_BLESS=1 cargo
//! test --test spec_schemas` rewrites them); every example spec validates against its schema
//! and decodes into its kind's type, and a wrong field is refused.
//!
//! A field the spec type does not have is refused by both: the schemas say so to the
//! editor, and `ferry submit` (through the kind's `encode`, `ferry_task::kind::encode_json`)
//! names its path, so a misspelt or misplaced optional field never silently takes its
//! default.

// Each kind registers itself in its worker crate (ferry_task::kind): link every one Ferry
// ships, as the `ferry` binary does, so that topics and schemas cover them all.
use {ferry_cluster as _, ferry_deploy as _, ferry_offload as _, ferry_peer as _, ferry_plan as _, ferry_score as _};

use std::path::{Path, PathBuf};

use ferry_runtime::TaskKind;
use schemars::JsonSchema;
use schemars::generate::{SchemaGenerator, SchemaSettings};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn schema_path(kind: TaskKind) -> PathBuf {
    root().join("schemas/json").join(format!("{kind}.schema.json"))
}

/// The spec type's schema (a `$ref` into `gen`'s definitions), its record name, and how the
/// subject is derived when a file leaves it out (the kind's registration; `None`: the file
/// must give it).
fn spec_of(kind: TaskKind, generator: &mut SchemaGenerator) -> (Value, &'static str, Option<&'static str>) {
    let (schema, record) = match kind {
        TaskKind::CREATE_CLUSTER => (generator.subschema_for::<ferry_cluster::spec::ClusterCommand>(), "ClusterCommand"),
        TaskKind::PEER => (generator.subschema_for::<ferry_peer::spec::PeerClusters>(), "PeerClusters"),
        TaskKind::OFFLOAD => (generator.subschema_for::<ferry_offload::spec::OffloadCommand>(), "OffloadCommand"),
        TaskKind::DEPLOY => (generator.subschema_for::<ferry_deploy::spec::DeployApp>(), "DeployApp"),
        TaskKind::SCORE => (generator.subschema_for::<ferry_score::spec::ScoreClusters>(), "ScoreClusters"),
        TaskKind::TEST => (generator.subschema_for::<ferry_runtime::testkind::TestTaskSpec>(), "TestTaskSpec"),
        TaskKind::PLAN => (generator.subschema_for::<ferry_plan::spec::PlanSpec>(), "PlanSpec"),
        other => panic!("no JSON Schema for the {other} kind: add its spec type here"),
    };
    let derived = ferry_runtime::kind::info(kind).and_then(|i| i.derived_subject);
    (schema.to_value(), record, derived)
}

/// Makes what schemars gives say what serde takes: a variant's `x-aliases` (its
/// `#[serde(alias)]` names, beside them in the type) join its name in an `enum`; and an
/// object with named properties and nothing said of others takes no others.
fn finish(v: &mut Value) {
    match v {
        Value::Object(m) => {
            if let Some(Value::Array(aliases)) = m.remove("x-aliases") {
                let name = m.remove("const").expect("x-aliases on a unit variant (a const)");
                m.insert("enum".into(), Value::Array(std::iter::once(name).chain(aliases).collect()));
            }
            if m.contains_key("properties") && !m.contains_key("additionalProperties") {
                m.insert("additionalProperties".into(), Value::Bool(false));
            }
            m.values_mut().for_each(finish);
        }
        Value::Array(a) => a.iter_mut().for_each(finish),
        _ => {}
    }
}

/// The schema of a `kind` spec file, as committed.
fn file_schema(kind: TaskKind) -> Value {
    let mut generator = SchemaSettings::draft07().into_generator();
    let (spec, record, derived) = spec_of(kind, &mut generator);
    let definitions: Map<String, Value> = generator.take_definitions(true);
    let subject = match derived {
        Some(how) => format!("What the task acts on: tasks of one subject run one at a time, in order. Left out, it is {how}."),
        None => "What the task acts on: tasks of one subject run one at a time, in order.".to_owned(),
    };
    let mut schema = json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": format!("Ferry {kind} spec file"),
        "description": format!("A {kind} task for `ferry submit {kind} -f FILE`: its subject and its spec, the fields of the {record} record (docs/PROTOCOL.md). Generated from the spec type by tests/spec_schemas.rs; do not edit."),
        "type": "object",
        "properties": {
            "subject": {"type": "string", "minLength": 1, "description": subject},
            "spec": spec,
        },
        "required": if derived.is_some() { json!(["spec"]) } else { json!(["subject", "spec"]) },
        "definitions": definitions,
    });
    finish(&mut schema);
    schema
}

fn text(schema: &Value) -> String {
    serde_json::to_string_pretty(schema).unwrap() + "\n"
}

#[test]
fn spec_file_schemas_are_generated_from_the_spec_types() {
    for kind in ferry_runtime::kind::registered() {
        let generated = text(&file_schema(kind));
        let path = schema_path(kind);
        if std::env::var_os("FERRY_BLESS").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &generated).unwrap();
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(committed == generated, "{} is out of date with the {kind} spec type; run FERRY_BLESS=1 cargo test --test spec_schemas and commit", path.display());
        jsonschema::draft7::meta::validate(&file_schema(kind)).unwrap_or_else(|e| panic!("{kind}: not a draft-07 schema: {e}"));
    }
}

/// The example spec files: every `examples/*.yaml` but the TOSCA blueprints and the tenants' policy.
fn example_specs() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            !name.ends_with(".tosca.yaml") && name != "tenants.yaml"
        })
        .collect();
    files.sort();
    files
}

/// The kind a spec file's modeline names (its first line), checked against the
/// `# ferry submit <kind>` line that says how to run it.
fn kind_of(path: &Path, text: &str) -> TaskKind {
    let first = text.lines().next().unwrap_or_default();
    let schema = first.strip_prefix("# yaml-language-server: $schema=../schemas/json/").and_then(|s| s.strip_suffix(".schema.json"));
    let kind: TaskKind = schema.unwrap_or_else(|| panic!("{}: the first line is not the modeline `# yaml-language-server: $schema=../schemas/json/<kind>.schema.json`", path.display())).parse().unwrap();
    let submit = text.lines().find_map(|l| l.strip_prefix("# ferry submit ")).and_then(|l| l.split_whitespace().next());
    assert_eq!(submit, Some(kind.as_str()), "{}: its modeline names the {kind} schema", path.display());
    kind
}

fn validator(kind: TaskKind) -> jsonschema::Validator {
    let committed: Value = serde_json::from_str(&std::fs::read_to_string(schema_path(kind)).unwrap()).unwrap();
    jsonschema::draft7::new(&committed).unwrap()
}

fn errors(validator: &jsonschema::Validator, file: &Value) -> Vec<String> {
    validator.iter_errors(file).map(|e| format!("{}: {e}", e.instance_path())).collect()
}

/// What `ferry submit` does with the file's spec: encode it as the kind's record.
fn decodes(kind: TaskKind, spec: &Value) -> Result<(), String> {
    let info = ferry_runtime::kind::info(kind).ok_or_else(|| format!("{kind} is not registered"))?;
    (info.encode)(&ferry_runtime::wire::Registry::embedded(), spec.clone()).map(|_| ())
}

#[test]
fn every_example_spec_file_names_and_meets_its_schema() {
    let files = example_specs();
    assert!(files.len() >= 6, "{files:?}");
    let mut kinds = std::collections::BTreeSet::new();
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let kind = kind_of(&path, &text);
        kinds.insert(kind);
        let file: Value = serde_yaml_ng::from_str(&text).unwrap();
        let errors = errors(&validator(kind), &file);
        assert!(errors.is_empty(), "{} does not meet the {kind} schema: {errors:#?}", path.display());
        decodes(kind, &file["spec"]).unwrap_or_else(|e| panic!("{}: ferry submit {kind} would refuse it: {e}", path.display()));
    }
    assert_eq!(kinds.len(), ferry_runtime::kind::registered().len(), "an example of every kind: {kinds:?}");
}

#[test]
fn every_plan_example_passes_the_plan_rules_and_its_children_decode() {
    let mut plans = 0;
    for path in example_specs() {
        let text = std::fs::read_to_string(&path).unwrap();
        if kind_of(&path, &text) != TaskKind::PLAN {
            continue;
        }
        plans += 1;
        let file: Value = serde_yaml_ng::from_str(&text).unwrap();
        let plan: ferry_plan::spec::PlanSpec = serde_json::from_value(file["spec"].clone()).unwrap();
        ferry_plan::validate::validate(&plan).unwrap_or_else(|r| panic!("{}: the plan worker would reject it: {r}", path.display()));
        for step in &plan.steps {
            let kind: TaskKind = step.kind.parse().unwrap();
            // What each child's worker gets once its references are put in: the kind's fields.
            decodes(kind, &step.spec_value().unwrap()).unwrap_or_else(|e| panic!("{}: step {}: the {kind} child would be refused: {e}", path.display(), step.name));
        }
    }
    assert!(plans >= 2, "the runnable test plan and the fleet plan");
}

#[test]
fn a_wrong_field_is_refused() {
    let deploy = validator(TaskKind::DEPLOY);
    let good: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(root().join("examples/deploy.yaml")).unwrap()).unwrap();
    assert!(errors(&deploy, &good).is_empty());
    let wrong = |change: &dyn Fn(&mut Value)| {
        let mut file = good.clone();
        change(&mut file);
        errors(&deploy, &file)
    };
    let misspelt = wrong(&|f| f["spec"]["components"][0]["replica"] = json!(3));
    assert!(misspelt.iter().any(|e| e.contains("/spec/components/0") && e.contains("replica")), "{misspelt:?}");
    // `ferry submit` refuses it too, by its path, instead of dropping it.
    let mut spec = good["spec"].clone();
    spec["components"][0]["replica"] = json!(3);
    spec["components"][0]["placement"] = json!({"cluster": "member-1"});
    let refused = decodes(TaskKind::DEPLOY, &spec).unwrap_err();
    assert!(refused.contains("unknown fields `components[0].placement.cluster`, `components[0].replica`"), "{refused}");
    let typed = wrong(&|f| f["spec"]["components"][0]["replicas"] = json!("two"));
    assert!(typed.iter().any(|e| e.starts_with("/spec/components/0/replicas")), "{typed:?}");
    let unknown_operation = wrong(&|f| f["spec"]["operation"] = json!("destroy"));
    assert!(unknown_operation.iter().any(|e| e.starts_with("/spec/operation")), "{unknown_operation:?}");
    let top = wrong(&|f| f["subjects"] = json!("shop/web"));
    assert!(top.iter().any(|e| e.contains("subjects")), "{top:?}");
    let missing = wrong(&|f| {
        f["spec"].as_object_mut().unwrap().remove("name");
    });
    assert!(missing.iter().any(|e| e.contains("name")), "{missing:?}");
    // An alias serde takes is no error: `operation: delete` and `Delete` alike.
    for operation in ["delete", "Delete"] {
        assert!(wrong(&|f| f["spec"]["operation"] = json!(operation)).is_empty(), "{operation}");
    }
    // A score file must name its subject: nothing derives one.
    let score = validator(TaskKind::SCORE);
    let mut file: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(root().join("examples/score.yaml")).unwrap()).unwrap();
    file.as_object_mut().unwrap().remove("subject");
    assert!(errors(&score, &file).iter().any(|e| e.contains("subject")));
}

/// Every name an enum's schema lists, serde takes; and every name serde takes (its variants
/// and their aliases, as its error for an unknown name lists them), the schema lists.
fn enum_names_agree<T: JsonSchema + DeserializeOwned>() {
    let mut generator = SchemaSettings::draft07().into_generator();
    let mut schema = generator.root_schema_for::<T>().to_value();
    finish(&mut schema);
    let mut listed = Vec::new();
    collect_names(&schema, &mut listed);
    for name in &listed {
        serde_json::from_value::<T>(json!(name)).unwrap_or_else(|e| panic!("{}: the schema lists {name:?}, serde refuses it: {e}", T::schema_name()));
    }
    let refusal = serde_json::from_value::<T>(json!("no-such-name")).err().unwrap().to_string();
    let expected = refusal.split_once("expected one of ").map(|(_, l)| l).unwrap_or_else(|| panic!("{refusal}"));
    let mut taken: Vec<String> = expected.split(", ").map(|n| n.trim_matches('`').to_owned()).collect();
    taken.sort();
    listed.sort();
    assert_eq!(listed, taken, "{}: the names the schema lists and the names serde takes", T::schema_name());
}

fn collect_names(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            if let Some(Value::Array(names)) = m.get("enum") {
                out.extend(names.iter().filter_map(|n| n.as_str().map(str::to_owned)));
            }
            if let Some(Value::String(name)) = m.get("const") {
                out.push(name.clone());
            }
            m.values().for_each(|v| collect_names(v, out));
        }
        Value::Array(a) => a.iter().for_each(|v| collect_names(v, out)),
        _ => {}
    }
}

#[test]
fn the_schemas_list_every_name_and_alias_serde_takes() {
    enum_names_agree::<ferry_cluster::spec::ClusterOperation>();
    enum_names_agree::<ferry_deploy::spec::DeployOperation>();
    enum_names_agree::<ferry_deploy::spec::Delivery>();
    enum_names_agree::<ferry_offload::spec::OffloadOperation>();
    enum_names_agree::<ferry_offload::spec::PodOffloadingStrategy>();
    enum_names_agree::<ferry_offload::spec::NamespaceMappingStrategy>();
    enum_names_agree::<ferry_peer::spec::PeerOperation>();
    enum_names_agree::<ferry_peer::spec::PeerMethod>();
    enum_names_agree::<ferry_score::spec::ScorePolicy>();
}

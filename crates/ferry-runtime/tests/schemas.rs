//! The committed `schemas/*.avsc` equal the schemas derived from the Rust types, and each
//! stays backward-compatible with its previous committed version (new readers read old data).
//!
//! `FERRY_BLESS=1 cargo test -p ferry-runtime --test schemas` rewrites the files from the
//! types; review the diff, and add a new file and id instead when a committed schema must
//! change incompatibly.

use std::path::PathBuf;
use std::process::Command;

use apache_avro::schema_compatibility::SchemaCompatibility;
use apache_avro::{AvroSchema, Schema};
use ferry_runtime::protocol::{CommandEnvelope, ProgressEvent, TaskSnapshot};
use ferry_runtime::testkind::TestTaskSpec;
use ferry_runtime::wire::{Registry, embedded_schemas};

fn schemas_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../schemas")
}

fn derived() -> Vec<(&'static str, Schema)> {
    vec![
        ("CommandEnvelope.v3.avsc", CommandEnvelope::get_schema()),
        ("ProgressEvent.v3.avsc", ProgressEvent::get_schema()),
        ("TaskSnapshot.v3.avsc", TaskSnapshot::get_schema()),
        ("TestTaskSpec.v2.avsc", TestTaskSpec::get_schema()),
    ]
}

#[test]
fn committed_schemas_equal_the_rust_types() {
    if let Err(problems) = ferry_runtime::wire::check_committed(&schemas_dir(), &derived()) {
        panic!("{}", problems.join("\n"));
    }
}

#[test]
fn every_registered_schema_parses_and_ids_are_unique() {
    let r = Registry::embedded();
    let all = embedded_schemas();
    let mut ids: Vec<u32> = all.iter().map(|(id, _, _)| *id).collect();
    ids.dedup();
    assert_eq!(ids.len(), all.len(), "two schemas under one id: {all:?}");
    for (id, file, _) in all {
        assert!(r.schema(id).is_some(), "{file}");
    }
}

/// The version of `file` in the last commit that has it, if git and history are there.
fn previous_committed(file: &str) -> Option<String> {
    let out = Command::new("git")
        .args(["show", &format!("HEAD:schemas/{file}")])
        .current_dir(schemas_dir())
        .output()
        .ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn schemas_stay_backward_compatible_with_the_previous_commit() {
    let mut compared = 0;
    for (_, file, text) in embedded_schemas() {
        let Some(old) = previous_committed(file) else {
            println!("note: {file} has no committed version yet (or no git here); nothing to compare");
            continue;
        };
        let old = Schema::parse_str(&old).unwrap();
        let new = Schema::parse_str(text).unwrap();
        SchemaCompatibility::can_read(&old, &new)
            .unwrap_or_else(|e| panic!("{file}: the new schema cannot read data written with the committed one: {e}"));
        compared += 1;
    }
    println!("compared {compared} schemas with their committed versions");
}

#[test]
fn compatibility_check_catches_a_breaking_change() {
    // The check above must be able to fail: a new required field without default breaks.
    let old = Schema::parse_str(r#"{"type":"record","name":"R","fields":[{"name":"a","type":"int"}]}"#).unwrap();
    let new = Schema::parse_str(
        r#"{"type":"record","name":"R","fields":[{"name":"a","type":"int"},{"name":"b","type":"string"}]}"#,
    )
    .unwrap();
    assert!(SchemaCompatibility::can_read(&old, &new).is_err());
}

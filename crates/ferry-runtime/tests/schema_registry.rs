//! The Confluent schema-registry adapter against a stand-in of the registry's REST API
//! (the subset Ferry uses: register a version, list versions, read one), then a task end
//! to end with registry-assigned ids on the wire.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use ferry_runtime::protocol::{Bytes, CommandAction, CommandEnvelope};
use ferry_runtime::testkind::{TestHandler, TestTaskSpec};
use ferry_runtime::wire::WireError;
use ferry_runtime::{Client, EventType, SubmitOptions, TaskKind, Worker};
use serde_json::{Value, json};
use support::*;

#[derive(Default)]
struct Store {
    next: u32,
    subjects: HashMap<String, Vec<(u32, String)>>,
}

type Shared = Arc<Mutex<Store>>;

/// The registry's REST semantics for this subset: registering a known schema returns its
/// id; a new one gets the next global id; versions count from 1.
async fn stand_in(store: Shared) -> String {
    async fn register(State(s): State<Shared>, Path(subject): Path<String>, Json(body): Json<Value>) -> Json<Value> {
        let schema = body["schema"].as_str().unwrap().to_owned();
        let canon = apache_avro::Schema::parse_str(&schema).unwrap().canonical_form();
        let mut st = s.lock().unwrap();
        let existing = st.subjects.values().flatten().find(|(_, t)| apache_avro::Schema::parse_str(t).unwrap().canonical_form() == canon).map(|(id, _)| *id);
        let id = existing.unwrap_or_else(|| {
            st.next += 1;
            st.next
        });
        let versions = st.subjects.entry(subject).or_default();
        if !versions.iter().any(|(i, _)| *i == id) {
            versions.push((id, schema));
        }
        Json(json!({ "id": id }))
    }
    async fn versions(State(s): State<Shared>, Path(subject): Path<String>) -> Json<Value> {
        let st = s.lock().unwrap();
        let n = st.subjects.get(&subject).map_or(0, Vec::len);
        Json(json!((1..=n).collect::<Vec<_>>()))
    }
    async fn version(State(s): State<Shared>, Path((subject, v)): Path<(String, usize)>) -> Json<Value> {
        let st = s.lock().unwrap();
        let (id, schema) = st.subjects[&subject][v - 1].clone();
        Json(json!({ "subject": subject, "version": v, "id": id, "schema": schema }))
    }
    let app = Router::new()
        .route("/subjects/{subject}/versions", post(register).get(versions))
        .route("/subjects/{subject}/versions/{v}", get(version))
        .with_state(store);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemas_register_and_tasks_run_with_the_registrys_ids() {
    let store: Shared = Arc::new(Mutex::new(Store { next: 1000, ..Store::default() }));
    let url = stand_in(store.clone()).await;
    let registry = ferry_runtime::schema_registry::confluent(&url).await.unwrap();
    // Registering again is idempotent: same ids.
    let again = ferry_runtime::schema_registry::confluent(&url).await.unwrap();
    let env_id = registry.id_of::<CommandEnvelope>().unwrap();
    assert!(env_id > 1000, "the server's id, not the embedded one: {env_id}");
    assert_eq!(again.id_of::<CommandEnvelope>().unwrap(), env_id);

    // Another producer registers a newer, compatible version (a field with a default).
    let text = ferry_runtime::wire::EMBEDDED[0].2;
    let mut newer: Value = serde_json::from_str(text).unwrap();
    newer["fields"].as_array_mut().unwrap().push(json!({"name": "priority", "type": "int", "default": 0}));
    let newer_id = {
        let mut st = store.lock().unwrap();
        st.next += 1;
        let id = st.next;
        st.subjects.get_mut("io.ferry.v1.CommandEnvelope").unwrap().push((id, newer.to_string()));
        id
    };
    let registry = ferry_runtime::schema_registry::confluent(&url).await.unwrap();
    assert_eq!(registry.id_of::<CommandEnvelope>().unwrap(), env_id, "we write the version our types match");
    // A record written with the newer version decodes into our type.
    let writer = apache_avro::Schema::parse_str(&newer.to_string()).unwrap();
    let env = CommandEnvelope {
        task_id: ferry_runtime::TaskId::new().to_string(),
        kind: TaskKind::Test,
        action: CommandAction::Start,
        subject: "s".into(),
        idempotency_key: None,
        requested_by: "other".into(),
        created_at_ms: 1,
        deadline_ms: None,
        keep_partial: false,
        reason: None,
        spec: Bytes(vec![]),
    };
    let mut value = apache_avro::to_value(&env).unwrap();
    if let apache_avro::types::Value::Record(fields) = &mut value {
        fields.push(("priority".into(), apache_avro::types::Value::Int(7)));
    }
    let mut framed = vec![0];
    framed.extend_from_slice(&newer_id.to_be_bytes());
    framed.extend(apache_avro::to_avro_datum(&writer, value.resolve(&writer).unwrap()).unwrap());
    assert_eq!(registry.decode::<CommandEnvelope>(&framed).unwrap(), env);
    // An id the registry never issued is named in the error.
    framed[4] = framed[4].wrapping_add(50);
    assert!(matches!(registry.decode::<CommandEnvelope>(&framed), Err(WireError::UnknownSchemaId(_))));

    // End to end: worker and client both use the registry's ids.
    let broker = TestBroker::embedded();
    let client = Client::with_registry(broker.kafka.clone(), broker.topics.clone(), registry).unwrap();
    let mut events = client.events(true).await.unwrap();
    let mut opts = broker.worker_options();
    opts.schema_registry = Some(url.clone());
    let stop = tokio_util::sync::CancellationToken::new();
    let handler = TestHandler { min_delay: Some(std::time::Duration::from_millis(10)), effects: None };
    let worker = tokio::spawn(Worker::new(opts, handler).run(stop.clone()));
    let id = client.submit(TaskKind::Test, "registry", &TestTaskSpec::steps(2), SubmitOptions::default()).await.unwrap();
    let evs = until_final(&mut events, id).await;
    assert_eq!(evs.last().unwrap().event, EventType::Succeeded);
    stop.cancel();
    worker.await.unwrap().unwrap();
}

//! The Confluent schema-registry adapter against the registry stand-in
//! (`ferry_runtime::schema_registry::StandIn`): register and lookup modes, basic auth,
//! https, then a task end to end with registry-assigned ids on the wire.

mod support;

use ferry_runtime::protocol::{Bytes, CommandAction, CommandEnvelope};
use ferry_runtime::schema_registry::{BasicAuth, Mode, RegistryError, Settings, StandIn, StandInOptions, confluent, connect};
use ferry_runtime::testkind::{TestHandler, TestTaskSpec};
use ferry_runtime::wire::{WireError, embedded_schemas};
use ferry_runtime::{Client, EventType, SubmitOptions, TaskKind, Worker};
use serde_json::{Value, json};
use support::*;

/// The subject Ferry uses for a schema file: its record's full name.
fn subject_of(text: &str) -> String {
    let v: Value = serde_json::from_str(text).unwrap();
    format!("{}.{}", v["namespace"].as_str().unwrap(), v["name"].as_str().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemas_register_and_tasks_run_with_the_registrys_ids() {
    let stand_in = StandIn::start(StandInOptions { first_id: 1000, ..Default::default() }).await.unwrap();
    let url = stand_in.url().to_owned();
    let registry = confluent(&url).await.unwrap();
    // Registering again is idempotent: same ids.
    let again = confluent(&url).await.unwrap();
    let env_id = registry.id_of::<CommandEnvelope>().unwrap();
    assert!(env_id > 1000, "the server's id, not the embedded one: {env_id}");
    assert_eq!(again.id_of::<CommandEnvelope>().unwrap(), env_id);
    assert!(stand_in.handle().subjects().contains(&"io.ferry.v1.CommandEnvelope".to_owned()), "RecordNameStrategy: {:?}", stand_in.handle().subjects());

    // Another producer registers a newer, compatible version (a field with a default).
    let text = embedded_schemas().into_iter().find(|(_, f, _)| *f == "CommandEnvelope.v3.avsc").unwrap().2;
    let mut newer: Value = serde_json::from_str(text).unwrap();
    newer["fields"].as_array_mut().unwrap().push(json!({"name": "priority", "type": "int", "default": 0}));
    let newer_id = stand_in.handle().register("io.ferry.v1.CommandEnvelope", &newer.to_string());
    let registry = confluent(&url).await.unwrap();
    assert_eq!(registry.id_of::<CommandEnvelope>().unwrap(), env_id, "we write the version our types match");
    // A record written with the newer version decodes into our type.
    let writer = apache_avro::Schema::parse_str(&newer.to_string()).unwrap();
    let env = CommandEnvelope {
        task_id: ferry_runtime::TaskId::new().to_string(),
        kind: TaskKind::TEST,
        action: CommandAction::Start,
        subject: "s".into(),
        idempotency_key: None,
        requested_by: "other".into(),
        created_at_ms: 1,
        deadline_ms: None,
        keep_partial: false,
        reason: None,
        spec: Bytes(vec![]),
        signal: None,
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
    let id = client.submit(TaskKind::TEST, "registry", &TestTaskSpec::steps(2), SubmitOptions::default()).await.unwrap();
    let evs = until_final(&mut events, id).await;
    assert_eq!(evs.last().unwrap().event, EventType::Succeeded);
    stop.cancel();
    worker.await.unwrap().unwrap();
}

#[tokio::test]
async fn lookup_mode_finds_the_ids_of_a_locked_registry() {
    let stand_in = StandIn::start(StandInOptions { first_id: 500, read_only: true, ..Default::default() }).await.unwrap();
    let mut expected = Vec::new();
    for (_, file, text) in embedded_schemas() {
        expected.push((file, stand_in.handle().register(&subject_of(text), text)));
    }
    // Register mode cannot write to a locked registry: the refusal is the registry's own.
    let refused = confluent(stand_in.url()).await.unwrap_err();
    assert!(matches!(refused, RegistryError::Status { status: 422, .. }), "{refused}");

    let registry = confluent(&format!("{}?mode=lookup", stand_in.url())).await.unwrap();
    let env = expected.iter().find(|(f, _)| *f == "CommandEnvelope.v3.avsc").unwrap().1;
    let spec = expected.iter().find(|(f, _)| *f == "TestTaskSpec.v2.avsc").unwrap().1;
    assert_eq!(registry.id_of::<CommandEnvelope>().unwrap(), env);
    assert_eq!(registry.id_of::<TestTaskSpec>().unwrap(), spec);
    // Lookup wrote nothing: the same subjects (the protocol's three and the test kind's
    // spec: this program links no other kind), with their versions.
    assert_eq!(stand_in.handle().subjects().len(), 4);
}

#[tokio::test]
async fn lookup_of_a_missing_subject_names_it() {
    let stand_in = StandIn::start(StandInOptions { read_only: true, ..Default::default() }).await.unwrap();
    for (_, file, text) in embedded_schemas() {
        if file != "TestTaskSpec.v2.avsc" {
            stand_in.handle().register(&subject_of(text), text);
        }
    }
    let err = confluent(&format!("{}?mode=lookup", stand_in.url())).await.unwrap_err();
    match &err {
        RegistryError::NotRegistered { subject, file, .. } => {
            assert_eq!(subject, "io.ferry.v1.TestTaskSpec");
            assert_eq!(file, "TestTaskSpec.v2.avsc");
        }
        other => panic!("expected NotRegistered, got {other}"),
    }
    assert!(err.to_string().contains("io.ferry.v1.TestTaskSpec"), "{err}");

    // A subject that exists without this schema (another version only) is missing too.
    let other = StandIn::start(StandInOptions { read_only: true, ..Default::default() }).await.unwrap();
    for (_, _, text) in embedded_schemas() {
        other.handle().register(&subject_of(text), text);
    }
    other.handle().register("io.ferry.v1.TestTaskSpec", r#"{"type":"record","name":"TestTaskSpec","namespace":"io.ferry.v1","fields":[]}"#);
    let ok = confluent(&format!("{}?mode=lookup", other.url())).await;
    assert!(ok.is_ok(), "the matching version is found among several: {:?}", ok.err());
}

#[tokio::test]
async fn basic_auth_is_sent_and_required() {
    const PASSWORD: &str = "s3cr3t-pw";
    let stand_in = StandIn::start(StandInOptions { auth: Some(("ferry".into(), PASSWORD.into())), ..Default::default() }).await.unwrap();
    let base = stand_in.url().trim_start_matches("http://").to_owned();

    // Without credentials the stand-in refuses, and the error says what to set.
    let settings = Settings::parse(stand_in.url()).unwrap();
    let err = connect(&settings).await.unwrap_err();
    assert!(matches!(err, RegistryError::Unauthorized { status: 401, user: None, .. }), "{err}");
    assert!(err.to_string().contains("FERRY_SCHEMA_REGISTRY_USER"), "{err}");

    // A wrong password: refused, the user named, no password in the error.
    let wrong = Settings { auth: Some(BasicAuth { user: "ferry".into(), password: "nope-pw".into() }), ..settings.clone() };
    let err = connect(&wrong).await.unwrap_err().to_string();
    assert!(err.contains("\"ferry\"") && !err.contains("nope-pw"), "{err}");

    // The right credentials, from the settings or from the URL's user info.
    let right = Settings { auth: Some(BasicAuth { user: "ferry".into(), password: PASSWORD.into() }), ..settings };
    let registry = connect(&right).await.unwrap();
    let from_url = confluent(&format!("http://ferry:{PASSWORD}@{base}")).await.unwrap();
    assert_eq!(registry.id_of::<CommandEnvelope>().unwrap(), from_url.id_of::<CommandEnvelope>().unwrap());
    let lookup = confluent(&format!("http://ferry:{PASSWORD}@{base}?mode=lookup")).await.unwrap();
    assert_eq!(lookup.id_of::<CommandEnvelope>().unwrap(), registry.id_of::<CommandEnvelope>().unwrap());
}

#[tokio::test]
async fn https_is_verified_against_the_given_ca() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
    let tls = axum_server::tls_rustls::RustlsConfig::from_pem(cert.cert.pem().into_bytes(), cert.signing_key.serialize_pem().into_bytes()).await.unwrap();
    let (app, _handle) = StandIn::router(&StandInOptions::default());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let handle = axum_server::Handle::new();
    let server = axum_server::from_tcp_rustls(listener, tls).unwrap().handle(handle.clone());
    tokio::spawn(server.serve(app.into_make_service()));

    let settings = Settings::parse(&format!("https://{addr}")).unwrap();
    assert_eq!(settings.mode, Mode::Register);
    // The system's roots do not know this certificate: the TLS error is in the message.
    let err = connect(&settings).await.unwrap_err().to_string();
    assert!(err.contains("certificate") || err.contains("Certificate"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, cert.cert.pem()).unwrap();
    let registry = connect(&Settings { ca: Some(ca), ..settings.clone() }).await.unwrap();
    assert!(registry.id_of::<CommandEnvelope>().is_ok());

    // A CA bundle that is not there is named.
    let missing = dir.path().join("missing.pem");
    let err = connect(&Settings { ca: Some(missing.clone()), ..settings }).await.unwrap_err();
    assert!(matches!(&err, RegistryError::Ca { path, .. } if *path == missing), "{err}");
    handle.shutdown();
}

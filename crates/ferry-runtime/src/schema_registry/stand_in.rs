//! A stand-in of a Confluent-compatible schema registry's REST API, for tests and demos:
//! the subset Ferry and the usual serializers (confluent-kafka, kcat) use, with the real
//! status codes, optional basic auth and a read-only switch (a locked registry).
//!
//! No Confluent-compatible registry is installable on our machines (Confluent's and
//! Apicurio are Java, Karapace is not on PyPI), so the end-to-end tests of other
//! languages' clients run against this one.
//!
//! Subjects hold versions counted from 1; ids are global and a schema registered again,
//! under any subject, keeps its id (compared by Avro canonical form).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use serde_json::{Value, json};

/// How the stand-in behaves.
#[derive(Debug, Clone, Default)]
pub struct StandInOptions {
    /// Ids are issued after this one.
    pub first_id: u32,
    /// When set, every request must carry these basic-auth credentials (else 401).
    pub auth: Option<(String, String)>,
    /// Refuses every registration (422, as a registry in READONLY mode).
    pub read_only: bool,
}

#[derive(Debug, Default)]
struct Store {
    next: u32,
    read_only: bool,
    subjects: BTreeMap<String, Vec<(u32, String)>>,
    /// Each id's schema.
    ids: BTreeMap<u32, String>,
}

type Shared = Arc<Mutex<Store>>;

/// A running stand-in on a loopback port; stops on drop.
#[derive(Debug)]
pub struct StandIn {
    url: String,
    store: Shared,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn canonical(schema: &str) -> Option<String> {
    apache_avro::Schema::parse_str(schema).ok().map(|s| s.canonical_form())
}

fn error(status: StatusCode, code: u32, message: String) -> Response {
    (status, axum::Json(json!({ "error_code": code, "message": message }))).into_response()
}

/// The request's schema and its canonical form; `None` when it is not valid Avro.
fn schema_of(body: &Value) -> Option<(String, String)> {
    let text = body["schema"].as_str()?;
    Some((text.to_owned(), canonical(text)?))
}

fn invalid_schema() -> Response {
    error(StatusCode::UNPROCESSABLE_ENTITY, 42201, "Invalid schema".into())
}

impl Store {
    fn id_of(&self, canon: &str) -> Option<u32> {
        self.ids.iter().find(|(_, t)| canonical(t).as_deref() == Some(canon)).map(|(id, _)| *id)
    }

    fn add(&mut self, subject: &str, schema: &str, canon: &str) -> u32 {
        let id = self.id_of(canon).unwrap_or_else(|| {
            self.next += 1;
            self.ids.insert(self.next, schema.to_owned());
            self.next
        });
        let versions = self.subjects.entry(subject.to_owned()).or_default();
        if !versions.iter().any(|(i, _)| *i == id) {
            versions.push((id, schema.to_owned()));
        }
        id
    }
}

async fn register(State(s): State<Shared>, Path(subject): Path<String>, axum::Json(body): axum::Json<Value>) -> Response {
    let Some((text, canon)) = schema_of(&body) else { return invalid_schema() };
    let mut st = s.lock().expect("stand-in lock");
    // As Confluent's registry: read-only refuses every registration, even of a known schema.
    if st.read_only {
        return error(StatusCode::UNPROCESSABLE_ENTITY, 42205, format!("Subject {subject} is in read-only mode"));
    }
    let id = st.add(&subject, &text, &canon);
    axum::Json(json!({ "id": id })).into_response()
}

async fn lookup(State(s): State<Shared>, Path(subject): Path<String>, axum::Json(body): axum::Json<Value>) -> Response {
    let Some((_, canon)) = schema_of(&body) else { return invalid_schema() };
    let st = s.lock().expect("stand-in lock");
    let Some(versions) = st.subjects.get(&subject) else {
        return error(StatusCode::NOT_FOUND, 40401, format!("Subject '{subject}' not found."));
    };
    match versions.iter().enumerate().find(|(_, (_, t))| canonical(t).as_deref() == Some(&canon)) {
        Some((i, (id, schema))) => axum::Json(json!({ "subject": subject, "version": i + 1, "id": id, "schema": schema })).into_response(),
        None => error(StatusCode::NOT_FOUND, 40403, "Schema not found".into()),
    }
}

async fn versions(State(s): State<Shared>, Path(subject): Path<String>) -> Response {
    let st = s.lock().expect("stand-in lock");
    match st.subjects.get(&subject) {
        Some(vs) => axum::Json(json!((1..=vs.len()).collect::<Vec<_>>())).into_response(),
        None => error(StatusCode::NOT_FOUND, 40401, format!("Subject '{subject}' not found.")),
    }
}

async fn version(State(s): State<Shared>, Path((subject, v)): Path<(String, String)>) -> Response {
    let st = s.lock().expect("stand-in lock");
    let Some(vs) = st.subjects.get(&subject) else {
        return error(StatusCode::NOT_FOUND, 40401, format!("Subject '{subject}' not found."));
    };
    let n = if v == "latest" { Some(vs.len()) } else { v.parse::<usize>().ok() };
    match n.filter(|n| (1..=vs.len()).contains(n)) {
        Some(n) => {
            let (id, schema) = &vs[n - 1];
            axum::Json(json!({ "subject": subject, "version": n, "id": id, "schema": schema })).into_response()
        }
        None => error(StatusCode::NOT_FOUND, 40402, format!("Version {v} not found.")),
    }
}

async fn by_id(State(s): State<Shared>, Path(id): Path<u32>) -> Response {
    let st = s.lock().expect("stand-in lock");
    match st.ids.get(&id) {
        Some(schema) => axum::Json(json!({ "schema": schema })).into_response(),
        None => error(StatusCode::NOT_FOUND, 40403, format!("Schema {id} not found")),
    }
}

impl StandIn {
    /// The REST API over a fresh store (serve it over TLS with your own listener).
    pub fn router(options: &StandInOptions) -> (Router, StandInHandle) {
        let store: Shared = Arc::new(Mutex::new(Store { next: options.first_id, read_only: options.read_only, ..Store::default() }));
        let mut app = Router::new()
            .route("/subjects/{subject}", post(lookup))
            .route("/subjects/{subject}/versions", post(register).get(versions))
            .route("/subjects/{subject}/versions/{v}", get(version))
            .route("/schemas/ids/{id}", get(by_id))
            .with_state(store.clone());
        if let Some((user, password)) = &options.auth {
            let expected = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}")));
            app = app.layer(axum::middleware::from_fn(move |req: Request, next: Next| {
                let allowed = req.headers().get("authorization").is_some_and(|h| h.as_bytes() == expected.as_bytes());
                async move {
                    if allowed { next.run(req).await } else { error(StatusCode::UNAUTHORIZED, 401, "Unauthorized".into()) }
                }
            }));
        }
        (app, StandInHandle { store })
    }

    /// Serves the stand-in on a free loopback port (plain HTTP).
    pub async fn start(options: StandInOptions) -> std::io::Result<Self> {
        let (app, handle) = Self::router(&options);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let server = tokio::spawn(async move {
            // Ends only when aborted (on drop) or when the listener fails.
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "schema registry stand-in stopped");
            }
        });
        Ok(Self { url, store: handle.store, server })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// What the stand-in holds, for changing it as another producer would.
    pub fn handle(&self) -> StandInHandle {
        StandInHandle { store: self.store.clone() }
    }
}

/// Changes a stand-in's store from outside its API (another producer, an operator).
#[derive(Debug, Clone)]
pub struct StandInHandle {
    store: Shared,
}

impl StandInHandle {
    /// Registers `schema` under `subject` (ignoring read-only mode) and returns its id.
    pub fn register(&self, subject: &str, schema: &str) -> u32 {
        let canon = canonical(schema).expect("a valid Avro schema");
        self.store.lock().expect("stand-in lock").add(subject, schema, &canon)
    }

    /// Locks (or unlocks) the registry to registrations, as an operator would.
    pub fn set_read_only(&self, read_only: bool) {
        self.store.lock().expect("stand-in lock").read_only = read_only;
    }

    /// The subjects registered so far.
    pub fn subjects(&self) -> Vec<String> {
        self.store.lock().expect("stand-in lock").subjects.keys().cloned().collect()
    }
}

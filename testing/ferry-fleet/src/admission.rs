//! Admission webhooks on the test bed's API servers, as a real install has them: one HTTPS
//! server on loopback (a self-signed certificate for 127.0.0.1, its PEM given to the API
//! server as the webhook's `caBundle`) serves every webhook registered with it, and each
//! is registered on a cluster as a `ValidatingWebhookConfiguration` or a
//! `MutatingWebhookConfiguration` with the upstream project's name, rules,
//! `namespaceSelector` / `objectSelector` and failure policy. A [`Validator`] sees the
//! AdmissionReview the API server sends (the object, the old object, the requesting user)
//! and allows or denies with the upstream message; a [`Mutator`] answers with a JSON patch
//! of the object, or denies. The API server refuses the write when one denies, and applies
//! the patch otherwise.
//!
//! A webhook that reads its own cluster (Liqo's pod webhook reads the namespace's
//! NamespaceOffloading) is served once per cluster, each at its own path
//! ([`Webhook::for_cluster`]), since one server answers every cluster of the bed.
//!
//! Webhooks of one upstream project live in their own module (`webhooks_ocm`, ...).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::routing::post;
use base64::Engine;
use futures::future::BoxFuture;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use serde_json::{Value, json};

/// Why the test bed could not serve or register a webhook.
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    /// The serving certificate could not be made.
    #[error("making the webhook server's certificate: {0}")]
    Certificate(String),
    /// The HTTPS server could not start.
    #[error("starting the webhook server: {0}")]
    Serve(#[source] std::io::Error),
    /// The API server refused the webhook configuration.
    #[error("registering webhook configuration {name}: {source}")]
    Register {
        /// The configuration's name.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
}

/// A validating webhook: allows or denies one admission request. `Err` is the denial's
/// message, as the upstream webhook words it.
pub trait Validator: Send + Sync + 'static {
    /// Decides on `req`.
    fn validate<'a>(&'a self, req: &'a AdmissionRequest<DynamicObject>) -> BoxFuture<'a, Result<(), String>>;
}

/// A JSON patch (RFC 6902) of the object under admission.
pub use json_patch::Patch as JsonPatch;

/// A mutating webhook: changes the object of one admission request, or denies it. `Ok` is
/// the JSON patch to apply (empty: the object stays as it is; [`diff`] makes one from the
/// object before and after); `Err` is the denial's message, as the upstream webhook words it.
pub trait Mutator: Send + Sync + 'static {
    /// Decides on `req`, and how its object changes.
    fn mutate<'a>(&'a self, req: &'a AdmissionRequest<DynamicObject>) -> BoxFuture<'a, Result<JsonPatch, String>>;
}

/// The JSON patch turning `before` into `after` (what controller-runtime's
/// `PatchResponseFromRaw` answers with, for webhooks that mutate a decoded copy).
pub fn diff(before: &Value, after: &Value) -> JsonPatch {
    json_patch::diff(before, after)
}

/// A label selector requirement, as in a webhook's `namespaceSelector` / `objectSelector`.
#[derive(Debug, Clone, Copy)]
pub struct Requirement {
    /// The label's key.
    pub key: &'static str,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    pub operator: &'static str,
    /// The values of `In` and `NotIn`.
    pub values: &'static [&'static str],
}

/// A label selector (`matchLabels` and `matchExpressions`, all of which must hold), as
/// upstream's webhook manifests write `namespaceSelector` and `objectSelector`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Selector {
    /// Labels that must have these values.
    pub match_labels: &'static [(&'static str, &'static str)],
    /// Requirements that must hold.
    pub match_expressions: &'static [Requirement],
}

impl Selector {
    /// The selector as the API writes it.
    pub fn to_json(&self) -> Value {
        let labels: serde_json::Map<String, Value> = self.match_labels.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect();
        let exprs: Vec<Value> = self
            .match_expressions
            .iter()
            .map(|r| {
                let mut e = json!({"key": r.key, "operator": r.operator});
                if !r.values.is_empty() {
                    e["values"] = json!(r.values);
                }
                e
            })
            .collect();
        let mut out = json!({});
        if !labels.is_empty() {
            out["matchLabels"] = Value::Object(labels);
        }
        if !exprs.is_empty() {
            out["matchExpressions"] = json!(exprs);
        }
        out
    }
}

/// What a webhook configuration registers: its upstream name, the rules it matches, and
/// which namespaces and objects it applies to.
#[derive(Debug, Clone)]
pub struct Registration {
    /// The configuration's and the webhook's name, as upstream names them.
    pub name: &'static str,
    /// API groups matched.
    pub groups: &'static [&'static str],
    /// API versions matched (`*` for all).
    pub versions: &'static [&'static str],
    /// Resources matched (`managedclusters`, `pods`, ...).
    pub resources: &'static [&'static str],
    /// Operations matched (`CREATE`, `UPDATE`, ...).
    pub operations: &'static [&'static str],
    /// Only objects in namespaces with these labels (None: every namespace).
    pub namespace_selector: Option<Selector>,
    /// Only objects with these labels (None: every object).
    pub object_selector: Option<Selector>,
}

/// How a webhook answers.
#[derive(Clone)]
pub enum Handler {
    /// Allows or denies (a `ValidatingWebhookConfiguration`).
    Validate(Arc<dyn Validator>),
    /// Patches or denies (a `MutatingWebhookConfiguration`).
    Mutate(Arc<dyn Mutator>),
}

impl Handler {
    fn path_prefix(&self) -> &'static str {
        match self {
            Self::Validate(_) => "validate",
            Self::Mutate(_) => "mutate",
        }
    }
}

/// Where a cluster reaches a webhook of the server, and what it registers there.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// The upstream registration.
    pub registration: Registration,
    /// The server's path for it (`validate/<name>`, `mutate/<name>/<cluster>`, ...).
    pub path: String,
    /// A `MutatingWebhookConfiguration` (else a validating one).
    pub mutating: bool,
}

/// A webhook the server serves: its endpoint and its handler.
#[derive(Clone)]
pub struct Webhook {
    /// Where it is served and what registers it.
    pub endpoint: Endpoint,
    /// How it answers.
    pub handler: Handler,
}

impl Webhook {
    /// `v`, served at `validate/<its registration name>`.
    pub fn validating(registration: Registration, v: Arc<dyn Validator>) -> Self {
        Self::new(registration, Handler::Validate(v))
    }

    /// `m`, served at `mutate/<its registration name>`.
    pub fn mutating(registration: Registration, m: Arc<dyn Mutator>) -> Self {
        Self::new(registration, Handler::Mutate(m))
    }

    fn new(registration: Registration, handler: Handler) -> Self {
        let path = format!("{}/{}", handler.path_prefix(), registration.name);
        let mutating = matches!(handler, Handler::Mutate(_));
        Self { endpoint: Endpoint { registration, path, mutating }, handler }
    }

    /// The same webhook served at a path of its own for `cluster` (one that reads its
    /// cluster: each cluster registers its own).
    pub fn for_cluster(mut self, cluster: &str) -> Self {
        self.endpoint.path = format!("{}/{}/{cluster}", self.handler.path_prefix(), self.endpoint.registration.name);
        self
    }
}

/// The running webhook server; dropping it stops serving (the API server then refuses
/// writes its webhooks cover: `failurePolicy: Fail`, as upstream sets it).
pub struct AdmissionServer {
    addr: SocketAddr,
    ca_pem: String,
    handle: axum_server::Handle<SocketAddr>,
}

impl std::fmt::Debug for AdmissionServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdmissionServer").field("addr", &self.addr).finish_non_exhaustive()
    }
}

impl Drop for AdmissionServer {
    fn drop(&mut self) {
        self.handle.shutdown();
    }
}

type Handlers = Arc<HashMap<String, Handler>>;

impl AdmissionServer {
    /// Serves `validators`, each at `/validate/<its registration name>`.
    pub async fn start(validators: Vec<(Registration, Arc<dyn Validator>)>) -> Result<Self, AdmissionError> {
        Self::serve(validators.into_iter().map(|(r, v)| Webhook::validating(r, v)).collect()).await
    }

    /// Serves `webhooks`, each at its endpoint's path.
    pub async fn serve(webhooks: Vec<Webhook>) -> Result<Self, AdmissionError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .map_err(|e| AdmissionError::Certificate(e.to_string()))?;
        let ca_pem = cert.cert.pem();
        let key_pem = cert.signing_key.serialize_pem();
        let tls = axum_server::tls_rustls::RustlsConfig::from_pem(ca_pem.clone().into_bytes(), key_pem.into_bytes())
            .await
            .map_err(AdmissionError::Serve)?;
        let routes: Handlers = Arc::new(webhooks.into_iter().map(|w| (w.endpoint.path, w.handler)).collect());
        let app = axum::Router::new().route("/{*path}", post(review)).with_state(routes);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(AdmissionError::Serve)?;
        listener.set_nonblocking(true).map_err(AdmissionError::Serve)?;
        let addr = listener.local_addr().map_err(AdmissionError::Serve)?;
        let handle = axum_server::Handle::new();
        let server = axum_server::from_tcp_rustls(listener, tls).map_err(AdmissionError::Serve)?.handle(handle.clone());
        tokio::spawn(async move {
            if let Err(e) = server.serve(app.into_make_service()).await {
                tracing::error!(error = %e, "the test bed's webhook server stopped");
            }
        });
        Ok(Self { addr, ca_pem, handle })
    }

    /// Registers the validator `r` on the cluster `client` reaches, pointing at this server
    /// (at `validate/<r.name>`).
    pub async fn register(&self, client: &kube::Client, r: &Registration) -> Result<(), AdmissionError> {
        let path = format!("validate/{}", r.name);
        self.register_endpoint(client, &Endpoint { registration: r.clone(), path, mutating: false }).await
    }

    /// Registers `e` on the cluster `client` reaches, pointing at this server.
    pub async fn register_endpoint(&self, client: &kube::Client, e: &Endpoint) -> Result<(), AdmissionError> {
        let r = &e.registration;
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        let kind = if e.mutating { "MutatingWebhookConfiguration" } else { "ValidatingWebhookConfiguration" };
        let mut webhook = json!({
            "name": r.name,
            "failurePolicy": "Fail",
            "clientConfig": {"url": format!("https://{}/{}", self.addr, e.path), "caBundle": ca},
            "rules": [{"operations": r.operations, "apiGroups": r.groups, "apiVersions": r.versions, "resources": r.resources}],
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "timeoutSeconds": 10,
        });
        if let Some(s) = &r.namespace_selector {
            webhook["namespaceSelector"] = s.to_json();
        }
        if let Some(s) = &r.object_selector {
            webhook["objectSelector"] = s.to_json();
        }
        if e.mutating {
            webhook["reinvocationPolicy"] = json!("Never");
        }
        let config = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": kind,
            "metadata": {"name": r.name, "labels": {"app.kubernetes.io/managed-by": "ferry-testbed"}},
            "webhooks": [webhook],
        });
        let gvk = kube::api::GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind);
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &kube::api::ApiResource::from_gvk(&gvk));
        api.patch(r.name, &PatchParams::apply("ferry-testbed").force(), &Patch::Apply(&config))
            .await
            .map_err(|source| AdmissionError::Register { name: r.name.to_owned(), source })?;
        Ok(())
    }
}

async fn review(State(handlers): State<Handlers>, Path(path): Path<String>, Json(review): Json<AdmissionReview<DynamicObject>>) -> Json<Value> {
    let req: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(r) => r,
        Err(e) => return Json(json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {"uid": "", "allowed": false, "status": {"message": format!("not an AdmissionReview request: {e}")}}})),
    };
    let resp = AdmissionResponse::from(&req);
    let (resp, patch) = match handlers.get(&path) {
        None => (resp.deny(format!("no webhook at /{path} on the test bed's webhook server")), None),
        Some(Handler::Validate(v)) => match v.validate(&req).await {
            Ok(()) => (resp, None),
            Err(message) => (resp.deny(message), None),
        },
        Some(Handler::Mutate(m)) => match m.mutate(&req).await {
            Ok(p) if p.0.is_empty() => (resp, None),
            Ok(p) => match (serde_json::to_vec(&p), resp.clone().with_patch(p)) {
                (Ok(bytes), Ok(with)) => (with, Some(bytes)),
                (Err(e), _) => (resp.deny(format!("encoding the patch: {e}")), None),
                (_, Err(e)) => (resp.deny(format!("encoding the patch: {e}")), None),
            },
            Err(message) => (resp.deny(message), None),
        },
    };
    let mut out = serde_json::to_value(resp.into_review()).unwrap_or(Value::Null);
    // The API expects `patch` as base64 (Go's []byte), not as an array of numbers.
    if let Some(bytes) = patch {
        out["response"]["patch"] = json!(base64::engine::general_purpose::STANDARD.encode(bytes));
    }
    Json(out)
}

/// Asks the API server whether `req`'s user may do `verb` on `group`/`resource`/`sub`
/// named `name` (a SubjectAccessReview with the request's user, groups, uid and extra,
/// as upstream webhooks do). Errors of the review itself count as a denial.
pub async fn user_may(
    hub: &kube::Client,
    req: &AdmissionRequest<DynamicObject>,
    group: &str,
    resource: &str,
    subresource: &str,
    verb: &str,
    name: &str,
) -> Result<bool, String> {
    use k8s_openapi::api::authorization::v1::SubjectAccessReview;
    let u = &req.user_info;
    let sar: SubjectAccessReview = serde_json::from_value(json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": u.username, "uid": u.uid, "groups": u.groups, "extra": u.extra,
            "resourceAttributes": {"group": group, "resource": resource, "subresource": subresource, "verb": verb, "name": name},
        },
    }))
    .map_err(|e| e.to_string())?;
    let done = Api::<SubjectAccessReview>::all(hub.clone()).create(&Default::default(), &sar).await.map_err(|e| e.to_string())?;
    Ok(done.status.is_some_and(|s| s.allowed))
}

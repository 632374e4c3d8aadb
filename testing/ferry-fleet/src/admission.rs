//! Admission webhooks on the test bed's API servers, as a real install has them: one HTTPS
//! server on loopback (a self-signed certificate for 127.0.0.1, its PEM given to the API
//! server as the webhook's `caBundle`) serves every validator registered with it, and each
//! is registered on a cluster as a `ValidatingWebhookConfiguration` with the upstream
//! project's name, rules and failure policy. A validator sees the AdmissionReview the API
//! server sends (the object, the old object, the requesting user) and allows or denies
//! with the upstream message. The API server refuses the write when it denies.
//!
//! Validators of one upstream project live in their own module (`webhooks_ocm`, ...).

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

/// What a webhook configuration registers: its upstream name and the rules it matches.
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

type Validators = Arc<HashMap<String, Arc<dyn Validator>>>;

impl AdmissionServer {
    /// Serves `validators`, each at `/validate/<its registration name>`.
    pub async fn start(validators: Vec<(Registration, Arc<dyn Validator>)>) -> Result<Self, AdmissionError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .map_err(|e| AdmissionError::Certificate(e.to_string()))?;
        let ca_pem = cert.cert.pem();
        let key_pem = cert.signing_key.serialize_pem();
        let tls = axum_server::tls_rustls::RustlsConfig::from_pem(ca_pem.clone().into_bytes(), key_pem.into_bytes())
            .await
            .map_err(AdmissionError::Serve)?;
        let routes: Validators = Arc::new(validators.into_iter().map(|(r, v)| (r.name.to_owned(), v)).collect());
        let app = axum::Router::new().route("/validate/{name}", post(review)).with_state(routes);
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

    /// Registers `r` on the cluster `client` reaches, pointing at this server.
    pub async fn register(&self, client: &kube::Client, r: &Registration) -> Result<(), AdmissionError> {
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        let config = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": r.name, "labels": {"app.kubernetes.io/managed-by": "ferry-testbed"}},
            "webhooks": [{
                "name": r.name,
                "failurePolicy": "Fail",
                "clientConfig": {"url": format!("https://{}/validate/{}", self.addr, r.name), "caBundle": ca},
                "rules": [{"operations": r.operations, "apiGroups": r.groups, "apiVersions": r.versions, "resources": r.resources}],
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "timeoutSeconds": 10,
            }],
        });
        let gvk = kube::api::GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", "ValidatingWebhookConfiguration");
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &kube::api::ApiResource::from_gvk(&gvk));
        api.patch(r.name, &PatchParams::apply("ferry-testbed").force(), &Patch::Apply(&config))
            .await
            .map_err(|source| AdmissionError::Register { name: r.name.to_owned(), source })?;
        Ok(())
    }
}

async fn review(
    State(validators): State<Validators>,
    Path(name): Path<String>,
    Json(review): Json<AdmissionReview<DynamicObject>>,
) -> Json<Value> {
    let req: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(r) => r,
        Err(e) => return Json(json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {"uid": "", "allowed": false, "status": {"message": format!("not an AdmissionReview request: {e}")}}})),
    };
    let resp = AdmissionResponse::from(&req);
    let resp = match validators.get(&name) {
        None => resp.deny(format!("no validator {name} on the test bed's webhook server")),
        Some(v) => match v.validate(&req).await {
            Ok(()) => resp,
            Err(message) => resp.deny(message),
        },
    };
    Json(serde_json::to_value(resp.into_review()).unwrap_or(Value::Null))
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

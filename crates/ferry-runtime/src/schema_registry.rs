//! The adapter to a Confluent-compatible schema registry (REST): finds the server's id of
//! each of Ferry's schemas, registering them first or only looking them up, and loads
//! every registered version of those subjects, so records framed by other producers decode
//! too.
//!
//! # Subjects
//! Ferry names subjects by **RecordNameStrategy**: a schema's subject is its record's full
//! name (`io.ferry.v1.CommandEnvelope`, `io.ferry.v1.TestTaskSpec`, ...), not
//! `<topic>-value` (TopicNameStrategy, the Confluent default). One envelope record serves
//! every command topic (`ferry.commands.<kind>`, `ferry.tenants.<tenant>.<kind>`, topics
//! made as tenants come), and a spec is framed inside an envelope's `bytes`, where there is
//! no topic at all. Clients of other languages set their serializer's subject strategy to
//! the record name (confluent-kafka: `record_subject_name_strategy`).
//!
//! # The setting
//! One string selects and configures the registry (`--schema-registry`,
//! `FERRY_SCHEMA_REGISTRY`, a context's `schema_registry`):
//! `http[s]://[USER:PASSWORD@]HOST[:PORT][/PATH][?mode=register|lookup]`.
//! - `mode=register` (the default) registers every schema at start (idempotent: a known
//!   schema keeps its id); `mode=lookup` only asks for ids (`POST /subjects/{subject}`),
//!   for registries locked to writes, and fails naming the first subject that lacks the
//!   schema.
//! - Basic auth: the URL's user info, else `FERRY_SCHEMA_REGISTRY_USER` and
//!   `FERRY_SCHEMA_REGISTRY_PASSWORD` (prefer these: a URL may end up in a shell history).
//!   The password is never logged nor put in an error.
//! - https is verified against the system's roots, or only against the PEM bundle in
//!   `FERRY_SCHEMA_REGISTRY_CA` when set.

mod stand_in;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde::Deserialize;
use serde_json::json;

use crate::wire::{Registry, WireError, embedded_schemas};

pub use stand_in::{StandIn, StandInHandle, StandInOptions};

/// The user of basic auth, from the environment.
pub const USER_ENV: &str = "FERRY_SCHEMA_REGISTRY_USER";
/// The password of basic auth, from the environment.
pub const PASSWORD_ENV: &str = "FERRY_SCHEMA_REGISTRY_PASSWORD";
/// A PEM bundle: the only roots an https registry is verified against.
pub const CA_ENV: &str = "FERRY_SCHEMA_REGISTRY_CA";

/// Why the registry could not be used.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The setting does not parse.
    #[error("schema registry {url:?}: {reason} (expected http[s]://[USER:PASSWORD@]HOST[:PORT][?mode=register|lookup])")]
    Url {
        /// The setting, its password masked.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The CA bundle could not be read.
    #[error("reading the schema registry's CA bundle {path}: {message}")]
    Ca {
        /// The bundle.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The request failed.
    #[error("schema registry {url}: {message}")]
    Http {
        /// The request URL.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// The registry refused the credentials (or their absence).
    #[error("schema registry {url} answered {status}: {}; set {USER_ENV} and {PASSWORD_ENV} (or the URL's user info)", match user { Some(u) => format!("user {u:?} is not allowed"), None => "it wants credentials".to_owned() })]
    Unauthorized {
        /// The request URL.
        url: String,
        /// 401 or 403.
        status: u16,
        /// The user sent, if any.
        user: Option<String>,
    },
    /// In lookup mode, a schema is not registered.
    #[error("schema registry {url}: subject {subject:?} has no version matching schemas/{file} (lookup mode registers nothing: register it, e.g. by one start in mode=register)")]
    NotRegistered {
        /// The registry.
        url: String,
        /// The subject (the record's full name).
        subject: String,
        /// Ferry's schema file.
        file: String,
    },
    /// The registry refused the request.
    #[error("schema registry {url} answered {status}: {body}")]
    Status {
        /// The request URL.
        url: String,
        /// HTTP status.
        status: u16,
        /// The registry's error text.
        body: String,
    },
    /// A schema from the registry does not parse.
    #[error(transparent)]
    Wire(#[from] WireError),
}

/// What Ferry does with its schemas at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Register every schema (`POST /subjects/{subject}/versions`).
    #[default]
    Register,
    /// Only find the ids of schemas someone registered (`POST /subjects/{subject}`).
    Lookup,
}

/// Basic-auth credentials; `Debug` masks the password.
#[derive(Clone, PartialEq, Eq)]
pub struct BasicAuth {
    /// The user.
    pub user: String,
    /// The password.
    pub password: String,
}

impl std::fmt::Debug for BasicAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BasicAuth").field("user", &self.user).field("password", &"***").finish()
    }
}

/// Where the registry is and how to use it (the module docs give the string form).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `http[s]://HOST[:PORT][/PATH]`, without user info, query or trailing slash.
    pub base: String,
    /// Register or only look up.
    pub mode: Mode,
    /// Basic auth, if any.
    pub auth: Option<BasicAuth>,
    /// The only roots to verify https against (else the system's).
    pub ca: Option<PathBuf>,
}

/// `spec` with whatever could be a password masked: everything between `://` and the
/// last `@` but the user name (`USER:***`), so that even a URL that does not parse (an
/// unescaped `/`, `?` or `#` in the password) is never echoed with its secret.
fn masked(spec: &str) -> String {
    let start = spec.find("://").map_or(0, |i| i + 3);
    match spec[start..].rfind('@') {
        Some(at) => {
            let userinfo = &spec[start..start + at];
            let user = userinfo.split_once(':').map_or("***", |(u, _)| u);
            format!("{}{user}:***{}", &spec[..start], &spec[start + at..])
        }
        None => spec.to_owned(),
    }
}

impl Settings {
    /// Parses the setting's string (a URL, by the `url` crate); credentials only from the
    /// URL (see [`Self::with_env`]).
    pub fn parse(spec: &str) -> Result<Self, RegistryError> {
        let bad = |reason: &str| RegistryError::Url { url: masked(spec), reason: reason.to_owned() };
        let url = url::Url::parse(spec).map_err(|e| {
            bad(&format!("{e} (a password with '/', '?', '#' or '@' must be %-escaped, or given in {PASSWORD_ENV})"))
        })?;
        if url.scheme() != "http" && url.scheme() != "https" {
            return Err(bad("not an http:// or https:// URL"));
        }
        let host = url.host_str().filter(|h| !h.is_empty()).ok_or_else(|| bad("no host"))?;
        if url.fragment().is_some() {
            return Err(bad("a #fragment (a password with '#' must be %-escaped)"));
        }
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s).decode_utf8().map(|d| d.into_owned()).map_err(|_| bad("the user info is not UTF-8 once %-decoded"))
        };
        let auth = match (url.username(), url.password()) {
            ("", None) => None,
            (_, None) => return Err(bad("user info without a password (USER:PASSWORD@)")),
            (user, Some(password)) => Some(BasicAuth { user: decode(user)?, password: decode(password)? }),
        };
        let mut mode = Mode::default();
        for (key, value) in url.query_pairs() {
            mode = match (&*key, &*value) {
                ("mode", "register") => Mode::Register,
                ("mode", "lookup") => Mode::Lookup,
                _ => return Err(bad(&format!("unknown option {key:?} (only mode=register or mode=lookup)"))),
            };
        }
        let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
        let base = format!("{}://{host}{port}{}", url.scheme(), url.path().trim_end_matches('/'));
        Ok(Self { base, mode, auth, ca: None })
    }

    /// Takes the credentials (when the URL has none) and the CA bundle from the environment.
    pub fn with_env(mut self) -> Self {
        if self.auth.is_none()
            && let (Ok(user), Ok(password)) = (std::env::var(USER_ENV), std::env::var(PASSWORD_ENV))
        {
            self.auth = Some(BasicAuth { user, password });
        }
        if self.ca.is_none() {
            self.ca = std::env::var_os(CA_ENV).map(PathBuf::from);
        }
        self
    }
}

#[derive(Deserialize)]
struct Registered {
    id: u32,
}

#[derive(Deserialize)]
struct Version {
    id: u32,
    schema: String,
}

struct Http {
    base: String,
    authorization: Option<String>,
    user: Option<String>,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

/// Roots for https: the CA bundle alone when given, else the system's.
fn roots(ca: Option<&PathBuf>) -> Result<rustls::RootCertStore, RegistryError> {
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        Some(path) => {
            let err = |message: String| RegistryError::Ca { path: path.clone(), message };
            for cert in CertificateDer::pem_file_iter(path).map_err(|e| err(e.to_string()))? {
                roots.add(cert.map_err(|e| err(e.to_string()))?).map_err(|e| err(e.to_string()))?;
            }
            if roots.is_empty() {
                return Err(err("no certificate in it".into()));
            }
        }
        None => {
            // Unreadable system certificates are skipped, as curl and browsers do.
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
        }
    }
    Ok(roots)
}

impl Http {
    fn new(settings: &Settings) -> Result<Self, RegistryError> {
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| RegistryError::Http { url: settings.base.clone(), message: e.to_string() })?
            .with_root_certificates(roots(settings.ca.as_ref())?)
            .with_no_client_auth();
        let connector = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls).https_or_http().enable_http1().build();
        let authorization = settings.auth.as_ref().map(|a| {
            format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", a.user, a.password)))
        });
        Ok(Self {
            base: settings.base.clone(),
            authorization,
            user: settings.auth.as_ref().map(|a| a.user.clone()),
            client: Client::builder(TokioExecutor::new()).build(connector),
        })
    }

    /// One call; `Ok(None)` on 404 (the callers say what was missing).
    async fn call(&self, method: hyper::Method, path: &str, body: Option<serde_json::Value>) -> Result<Option<String>, RegistryError> {
        let url = format!("{}{path}", self.base);
        let err = |message: String| RegistryError::Http { url: url.clone(), message };
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(&url)
            .header("content-type", "application/vnd.schemaregistry.v1+json")
            .header("accept", "application/vnd.schemaregistry.v1+json");
        if let Some(a) = &self.authorization {
            req = req.header("authorization", a);
        }
        let req = req.body(Full::new(Bytes::from(body.map(|b| b.to_string()).unwrap_or_default()))).map_err(|e| err(e.to_string()))?;
        let res = tokio::time::timeout(Duration::from_secs(30), self.client.request(req))
            .await
            .map_err(|_| err("no answer within 30 s".into()))?
            .map_err(|e| {
                // The connector's cause (refused, certificate) is in the source chain.
                let mut message = e.to_string();
                let mut source = std::error::Error::source(&e);
                while let Some(s) = source {
                    message = format!("{message}: {s}");
                    source = s.source();
                }
                err(message)
            })?;
        let status = res.status().as_u16();
        let bytes = res.into_body().collect().await.map_err(|e| err(e.to_string()))?.to_bytes();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        match status {
            200..=299 => Ok(Some(text)),
            404 => Ok(None),
            401 | 403 => Err(RegistryError::Unauthorized { url, status, user: self.user.clone() }),
            _ => Err(RegistryError::Status { url, status, body: text }),
        }
    }

    /// A call whose 404 is an error, its answer parsed as `T`.
    async fn json<T: serde::de::DeserializeOwned>(&self, method: hyper::Method, path: &str, body: Option<serde_json::Value>) -> Result<Option<T>, RegistryError> {
        let Some(text) = self.call(method, path, body).await? else { return Ok(None) };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| RegistryError::Http { url: format!("{}{path}", self.base), message: format!("unexpected answer ({e}): {text}") })
    }
}

/// Connects with `spec` (the module docs give its form, credentials may come from the
/// environment) and returns a registry with the server's ids.
pub async fn confluent(spec: &str) -> Result<Registry, RegistryError> {
    connect(&Settings::parse(spec)?.with_env()).await
}

/// Registers or looks up Ferry's schemas as `settings` say, and returns a registry with
/// the server's ids.
pub async fn connect(settings: &Settings) -> Result<Registry, RegistryError> {
    let http = Http::new(settings)?;
    let gone = |path: String| RegistryError::Status { url: format!("{}{path}", settings.base), status: 404, body: "not found".into() };
    let mut entries: Vec<(u32, String, String)> = Vec::new();
    let mut subjects = Vec::new();
    let mut own = Vec::new();
    // Only the version of each record this program writes: older ones are on the server
    // already if anything was written with them (read back below), and a registry that
    // checks compatibility would refuse registering an old version after a new one.
    let mut newest: Vec<(String, &str, &str)> = Vec::new();
    for (_, file, text) in embedded_schemas() {
        let schema = apache_avro::Schema::parse_str(text).map_err(|e| WireError::BadSchema { file: file.to_owned(), source: Box::new(e) })?;
        let subject = schema.name().map(|n| n.fullname(None)).unwrap_or_else(|| file.to_owned());
        // Ids ascend, so a later version of a record replaces the earlier.
        newest.retain(|(s, _, _)| *s != subject);
        newest.push((subject, file, text));
    }
    for (subject, file, text) in newest {
        let body = Some(json!({ "schema": text }));
        let id = match settings.mode {
            Mode::Register => {
                let path = format!("/subjects/{subject}/versions");
                http.json::<Registered>(hyper::Method::POST, &path, body).await?.ok_or_else(|| gone(path))?.id
            }
            Mode::Lookup => {
                let found = http.json::<Registered>(hyper::Method::POST, &format!("/subjects/{subject}"), body).await?;
                let not_registered = || RegistryError::NotRegistered { url: settings.base.clone(), subject: subject.clone(), file: file.to_owned() };
                found.ok_or_else(not_registered)?.id
            }
        };
        tracing::debug!(%subject, id, mode = ?settings.mode, "schema id");
        own.push((subject.clone(), id));
        if !subjects.contains(&subject) {
            subjects.push(subject);
        }
    }
    for subject in &subjects {
        let path = format!("/subjects/{subject}/versions");
        let versions: Vec<i64> = http.json(hyper::Method::GET, &path, None).await?.ok_or_else(|| gone(path))?;
        for v in versions {
            let path = format!("/subjects/{subject}/versions/{v}");
            let ver: Version = http.json(hyper::Method::GET, &path, None).await?.ok_or_else(|| gone(path))?;
            entries.push((ver.id, format!("{subject} v{v}"), ver.schema));
        }
    }
    let mut registry = Registry::from_entries(entries.iter().map(|(id, f, t)| (*id, f.as_str(), t.as_str())))?;
    for (subject, id) in own {
        registry.pin(&subject, id);
    }
    Ok(registry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_mode_and_credentials() {
        let s = Settings::parse("https://ferry:p%40ss@registry.example:8081/sr/?mode=lookup").unwrap();
        assert_eq!(s.base, "https://registry.example:8081/sr");
        assert_eq!(s.mode, Mode::Lookup);
        assert_eq!(s.auth, Some(BasicAuth { user: "ferry".into(), password: "p@ss".into() }));
        assert!(!format!("{s:?}").contains("p@ss"), "Debug masks the password");
        let plain = Settings::parse("http://127.0.0.1:8081").unwrap();
        assert_eq!((plain.base.as_str(), plain.mode, plain.auth), ("http://127.0.0.1:8081", Mode::Register, None));
    }

    #[test]
    fn bad_settings_are_named_without_the_password() {
        for (spec, reason) in [
            ("registry:8081", "not an http"),
            ("ftp://u:secret@host", "not an http"),
            ("http://u:secret@host?mode=write", "unknown option"),
            ("http://?mode=lookup", "empty host"),
            // A password with an unescaped '/', '?' or '#' does not parse: still masked.
            ("https://KEY:ab/secret@registry:8081", "invalid port"),
            ("http://u:se?secret@host", "invalid port"),
            ("http://u:se#secret@host", "invalid port"),
            ("https://KEY:ab/secret@registry:8081/sr", "invalid port"),
            ("https://secret@registry:8081", "without a password"),
        ] {
            let e = Settings::parse(spec).unwrap_err().to_string();
            assert!(e.contains(reason), "{spec}: {e}");
            assert!(!e.contains("secret"), "{spec}: the password leaked: {e}");
        }
        // What parses never keeps the user info in the address it calls (errors name it).
        let s = Settings::parse("https://u:p%2Fsecret@[::1]:8081/sr/").unwrap();
        assert_eq!(s.base, "https://[::1]:8081/sr");
        assert_eq!(s.auth.as_ref().map(|a| a.password.as_str()), Some("p/secret"));
        assert!(!format!("{s:?}").contains("secret"));
    }
}

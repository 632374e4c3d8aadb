//! The adapter to a Confluent-compatible schema registry (REST): registers each of
//! Ferry's schemas under its record name (RecordNameStrategy: one envelope record serves
//! every command topic) and loads every registered version of those subjects with the
//! server's ids, so records framed by other producers decode too.
//!
//! Plain HTTP; put a TLS-terminating proxy in front of a registry that requires TLS.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use serde_json::json;

use crate::wire::{EMBEDDED, Registry, WireError};

/// Why the registry could not be used.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The URL does not parse.
    #[error("schema registry URL {0:?} is not an http:// URL")]
    Url(String),
    /// The request failed.
    #[error("schema registry {url}: {message}")]
    Http {
        /// The request URL.
        url: String,
        /// What went wrong.
        message: String,
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
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Http {
    async fn call(&self, method: hyper::Method, path: &str, body: Option<serde_json::Value>) -> Result<String, RegistryError> {
        let url = format!("{}{path}", self.base);
        let err = |message: String| RegistryError::Http { url: url.clone(), message };
        let req = hyper::Request::builder()
            .method(method)
            .uri(&url)
            .header("content-type", "application/vnd.schemaregistry.v1+json")
            .header("accept", "application/vnd.schemaregistry.v1+json")
            .body(Full::new(Bytes::from(body.map(|b| b.to_string()).unwrap_or_default())))
            .map_err(|e| err(e.to_string()))?;
        let res = tokio::time::timeout(Duration::from_secs(30), self.client.request(req))
            .await
            .map_err(|_| err("no answer within 30 s".into()))?
            .map_err(|e| err(e.to_string()))?;
        let status = res.status().as_u16();
        let bytes = res.into_body().collect().await.map_err(|e| err(e.to_string()))?.to_bytes();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        if status >= 300 {
            return Err(RegistryError::Status { url, status, body: text });
        }
        Ok(text)
    }
}

/// Registers Ferry's schemas at `url` and returns a registry with the server's ids.
pub async fn confluent(url: &str) -> Result<Registry, RegistryError> {
    if !url.starts_with("http://") {
        return Err(RegistryError::Url(url.to_owned()));
    }
    let http = Http { base: url.trim_end_matches('/').to_owned(), client: Client::builder(TokioExecutor::new()).build_http() };
    let parse = |text: &str, what: &str| -> Result<serde_json::Value, RegistryError> {
        serde_json::from_str(text).map_err(|e| RegistryError::Http { url: format!("{url} ({what})"), message: e.to_string() })
    };
    let mut entries: Vec<(u32, String, String)> = Vec::new();
    let mut subjects = Vec::new();
    let mut own = Vec::new();
    for (_, file, text) in EMBEDDED {
        let schema = apache_avro::Schema::parse_str(text).map_err(|e| WireError::BadSchema { file: (*file).to_owned(), source: Box::new(e) })?;
        let subject = schema.name().map(|n| n.fullname(None)).unwrap_or_else(|| (*file).to_owned());
        let body = json!({ "schema": text });
        let reg: Registered = serde_json::from_value(parse(&http.call(hyper::Method::POST, &format!("/subjects/{subject}/versions"), Some(body)).await?, "register")?)
            .map_err(|e| RegistryError::Http { url: url.to_owned(), message: e.to_string() })?;
        tracing::debug!(%subject, id = reg.id, "schema registered");
        own.push((subject.clone(), reg.id));
        if !subjects.contains(&subject) {
            subjects.push(subject);
        }
    }
    for subject in &subjects {
        let versions: Vec<i64> = serde_json::from_value(parse(&http.call(hyper::Method::GET, &format!("/subjects/{subject}/versions"), None).await?, "versions")?)
            .map_err(|e| RegistryError::Http { url: url.to_owned(), message: e.to_string() })?;
        for v in versions {
            let ver: Version = serde_json::from_value(parse(&http.call(hyper::Method::GET, &format!("/subjects/{subject}/versions/{v}"), None).await?, "version")?)
                .map_err(|e| RegistryError::Http { url: url.to_owned(), message: e.to_string() })?;
            entries.push((ver.id, format!("{subject} v{v}"), ver.schema));
        }
    }
    let mut registry = Registry::from_entries(entries.iter().map(|(id, f, t)| (*id, f.as_str(), t.as_str())))?;
    for (subject, id) in own {
        registry.pin(&subject, id);
    }
    Ok(registry)
}

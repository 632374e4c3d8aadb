//! Puts a fleet's CRDs into each cluster's etcd prefix before its API server starts, so
//! the server builds its OpenAPI document once for all of them instead of once per CRD.
//!
//! A v1.20 API server rebuilds and re-serializes its whole OpenAPI document (several MB)
//! for every CRD added while it runs: installing the upstream subset through the API costs
//! about 30 s of CPU per cluster, most of a test bed's start on 2 cores. CRDs it finds
//! Established at start are merged once (`apiextensions-apiserver`
//! `pkg/controller/openapi/controller.go`, `Run`: "create initial spec to avoid merging once
//! per CRD on startup"). The stored objects are what an API server of the same binary wrote
//! when they were installed through its API: recorded once per machine on a throwaway
//! server of the fleet, then cached (keyed by the CRDs' content and the binary) beside the
//! test bed's binaries. The APIServices of their groups are not seeded: the server
//! registers them itself, and the aggregator skips local ones in its OpenAPI merge
//! (`kube-aggregator` `pkg/controllers/openapi/aggregator/aggregator.go`,
//! `AddUpdateAPIService`).

use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// Where, under a cluster's etcd prefix, the API server keeps CRDs.
const CRD_FOLDER: &str = "apiextensions.k8s.io/customresourcedefinitions/";

/// Bumped when what a seed file holds changes meaning.
const FORMAT: &str = "ferry-crd-seed-1";

/// Why a seed could not be read, recorded or written.
#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    /// etcd's JSON gateway refused a request or did not answer.
    #[error("etcd at {url}: {what}: {reason}")]
    Etcd {
        /// etcd's client URL.
        url: String,
        /// The request.
        what: String,
        /// Why.
        reason: String,
    },
    /// The throwaway API server stored fewer CRDs than it was given.
    #[error("the seed API server stored {stored} of {wanted} CRDs")]
    Incomplete {
        /// CRDs found under its prefix.
        stored: usize,
        /// CRDs installed.
        wanted: usize,
    },
}

/// The stored CRDs, as (key below a cluster's prefix, value) pairs.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Seed {
    format: String,
    entries: Vec<(String, String)>,
}

impl Seed {
    /// How many CRDs it holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when it holds none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Writes every CRD through `etcd` for the API server whose `--etcd-prefix` is
    /// `prefix` (`/ferry/<instance>`).
    pub async fn write(&self, etcd: &Etcd, prefix: &str) -> Result<(), SeedError> {
        for (suffix, value) in &self.entries {
            etcd.put(&format!("{prefix}/{suffix}"), value).await?;
        }
        Ok(())
    }

    /// Reads the CRDs the API server whose `--etcd-prefix` is `prefix` stored.
    pub async fn read(etcd: &Etcd, prefix: &str) -> Result<Self, SeedError> {
        let prefix = format!("{prefix}/");
        let folder = format!("{prefix}{CRD_FOLDER}");
        let entries = etcd.range(&folder).await?.into_iter().filter_map(|(k, v)| Some((k.strip_prefix(&prefix)?.to_owned(), v))).collect();
        Ok(Self { format: FORMAT.into(), entries })
    }
}

/// The cache file of a seed of `crds` made by the API server binary at `apiserver`: its
/// name is a digest of both, so another CRD set or a rebuilt binary records anew.
pub fn cache_file(cache: &Path, crds: &[Value], apiserver: &Path) -> PathBuf {
    let mut h = Sha256::new();
    h.update(FORMAT);
    h.update(serde_json::to_vec(crds).unwrap_or_default());
    if let Ok(m) = std::fs::metadata(apiserver) {
        h.update(m.len().to_le_bytes());
        let mtime = m.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).unwrap_or_default();
        h.update(mtime.as_nanos().to_le_bytes());
    }
    let digest: String = h.finalize().iter().take(12).map(|b| format!("{b:02x}")).collect();
    cache.join("crd-seed").join(format!("{digest}.json"))
}

/// The cached seed at `file`, if there is a readable one of this format.
pub fn load(file: &Path) -> Option<Seed> {
    let seed: Seed = serde_json::from_slice(&std::fs::read(file).ok()?).ok()?;
    (seed.format == FORMAT && !seed.is_empty()).then_some(seed)
}

/// Keeps `seed` at `file` (written whole, then renamed: concurrent fleets may record the
/// same seed at once). A failure only costs the next fleet a recording.
pub fn store(file: &Path, seed: &Seed) {
    let Some(dir) = file.parent() else { return };
    let tmp = dir.join(format!(".{}.{}", std::process::id(), file.file_name().and_then(|n| n.to_str()).unwrap_or("seed")));
    let ok = std::fs::create_dir_all(dir).is_ok() && serde_json::to_vec(seed).is_ok_and(|b| std::fs::write(&tmp, b).is_ok()) && std::fs::rename(&tmp, file).is_ok();
    if !ok {
        let _ = std::fs::remove_file(&tmp);
        tracing::warn!(file = %file.display(), "could not cache the CRD seed");
    }
}

/// etcd's v3 JSON gateway (`/v3/kv/*`, keys and values base64) on loopback.
#[derive(Debug, Clone)]
pub struct Etcd {
    url: String,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Etcd {
    /// A client for the etcd at `url` (`http://127.0.0.1:PORT`).
    pub fn new(url: &str) -> Self {
        Self { url: url.to_owned(), client: Client::builder(TokioExecutor::new()).build_http() }
    }

    /// Its client URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    async fn call(&self, path: &str, body: Value) -> Result<Value, SeedError> {
        let err = |reason: String| SeedError::Etcd { url: self.url.clone(), what: path.to_owned(), reason };
        let req = http::Request::post(format!("{}{path}", self.url))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .map_err(|e| err(e.to_string()))?;
        let resp = self.client.request(req).await.map_err(|e| err(e.to_string()))?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await.map_err(|e| err(e.to_string()))?.to_bytes();
        if !status.is_success() {
            return Err(err(format!("{status}: {}", String::from_utf8_lossy(&bytes))));
        }
        serde_json::from_slice(&bytes).map_err(|e| err(e.to_string()))
    }

    /// Every key under `prefix` with its value (base64), keys decoded.
    pub async fn range(&self, prefix: &str) -> Result<Vec<(String, String)>, SeedError> {
        // The range's end is the prefix with its last byte incremented ('/' + 1 = '0').
        let mut end = prefix.as_bytes().to_vec();
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        let resp = self.call("/v3/kv/range", json!({"key": B64.encode(prefix), "range_end": B64.encode(&end)})).await?;
        let kvs = resp.get("kvs").and_then(Value::as_array).cloned().unwrap_or_default();
        Ok(kvs
            .iter()
            .filter_map(|kv| {
                let key = B64.decode(kv.get("key")?.as_str()?).ok()?;
                Some((String::from_utf8(key).ok()?, kv.get("value")?.as_str()?.to_owned()))
            })
            .collect())
    }

    /// Stores `value` (base64) at `key`.
    pub async fn put(&self, key: &str, value: &str) -> Result<(), SeedError> {
        self.call("/v3/kv/put", json!({"key": B64.encode(key), "value": value})).await.map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_file_changes_with_the_crds_and_the_binary() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("kube-apiserver");
        std::fs::write(&bin, b"one").unwrap();
        let crds = vec![json!({"metadata": {"name": "a.example.io"}})];
        let first = cache_file(dir.path(), &crds, &bin);
        assert_eq!(first, cache_file(dir.path(), &crds, &bin), "the same inputs, the same file");
        assert_ne!(first, cache_file(dir.path(), &[json!({"metadata": {"name": "b.example.io"}})], &bin), "other CRDs");
        std::fs::write(&bin, b"rebuilt").unwrap();
        assert_ne!(first, cache_file(dir.path(), &crds, &bin), "another binary");
    }

    #[test]
    fn a_stored_seed_loads_back_and_an_empty_or_foreign_one_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("crd-seed/x.json");
        let seed = Seed { format: FORMAT.into(), entries: vec![(format!("{CRD_FOLDER}a.example.io"), B64.encode("{}"))] };
        store(&file, &seed);
        assert_eq!(load(&file).map(|s| s.entries), Some(seed.entries));
        store(&file, &Seed { format: FORMAT.into(), entries: Vec::new() });
        assert!(load(&file).is_none(), "an empty seed would start clusters without CRDs");
        std::fs::write(&file, br#"{"format": "ferry-crd-seed-0", "entries": [["k", "v"]]}"#).unwrap();
        assert!(load(&file).is_none(), "another format");
    }
}

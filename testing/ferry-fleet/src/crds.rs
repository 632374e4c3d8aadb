//! Installs CustomResourceDefinitions from YAML files into a v1.20 API server: strips CEL
//! rules (`x-kubernetes-validations`, unknown to 1.20), keeps only the storage version (no
//! conversion webhooks here) and waits until each CRD is Established.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use serde_json::Value;

/// Why a CRD could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A document is not a CRD.
    #[error("{path}: not a CustomResourceDefinition: {reason}")]
    Parse {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The API server refused it.
    #[error("applying CRD {name}: {source}")]
    Apply {
        /// The CRD.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// It did not become Established in time.
    #[error("CRD {0} not established within 60s")]
    NotEstablished(String),
}

/// Adapts a schema to 1.20, recursively: removes every `x-kubernetes-validations` (CEL is
/// newer than 1.20) and every empty-string `default` (1.20 reads it as null and rejects
/// the CRD; for a string field no default and an empty one differ only on the empty value).
pub fn strip_cel(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.remove("x-kubernetes-validations");
            if m.get("default") == Some(&Value::String(String::new())) {
                m.remove("default");
            }
            m.values_mut().for_each(strip_cel);
            // A list-map key must have a default or be required: without its empty default
            // it becomes required.
            let keys: Vec<String> = m
                .get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(|k| k.as_str().map(str::to_owned)).collect())
                .unwrap_or_default();
            if let Some(items) = m.get_mut("items").and_then(Value::as_object_mut) {
                let lacking: Vec<String> =
                    keys.into_iter().filter(|k| items.get("properties").and_then(|p| p.get(k)).is_some_and(|p| p.get("default").is_none())).collect();
                if !lacking.is_empty() {
                    let req = items.entry("required").or_insert_with(|| Value::Array(Vec::new()));
                    if let Value::Array(req) = req {
                        for k in lacking {
                            if !req.iter().any(|r| r.as_str() == Some(&k)) {
                                req.push(Value::String(k));
                            }
                        }
                    }
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(strip_cel),
        _ => {}
    }
}

/// The test bed's API servers read an empty string in a custom resource as null (a
/// ManifestWork's resource identifier `group: ""`, which upstream documents as the core
/// group, was refused as "must be of type string: null", on create as on apply), where a
/// modern API server takes `""`. So every string field of `schema` is made `nullable`,
/// but list-map keys and the items of typed lists (which may not be, and are never sent
/// empty) and value validations (`anyOf` and the like, which a structural schema keeps
/// free of types).
pub fn nullable_strings(schema: &mut Value) {
    let Value::Object(m) = schema else { return };
    if m.get("type").and_then(Value::as_str) == Some("string") {
        m.insert("nullable".into(), Value::Bool(true));
    }
    if let Some(Value::Object(props)) = m.get_mut("properties") {
        props.values_mut().for_each(nullable_strings);
    }
    for k in ["items", "additionalProperties"] {
        if let Some(sub) = m.get_mut(k) {
            nullable_strings(sub);
        }
    }
    // The items of a typed list (set, map) may not be nullable.
    if m.contains_key("x-kubernetes-list-type")
        && let Some(Value::Object(items)) = m.get_mut("items")
    {
        items.remove("nullable");
    }
    let keys: Vec<String> = m
        .get("x-kubernetes-list-map-keys")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|k| k.as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    for k in keys {
        if let Some(Value::Object(p)) = m.get_mut("items").and_then(|i| i.get_mut("properties")).and_then(|p| p.get_mut(&k)) {
            p.remove("nullable");
        }
    }
}

/// Prepares one upstream CRD document for a 1.20 server without webhooks.
pub fn prepare(mut doc: Value) -> Result<Value, String> {
    if doc.get("kind").and_then(Value::as_str) != Some("CustomResourceDefinition") {
        return Err("kind is not CustomResourceDefinition".into());
    }
    strip_cel(&mut doc);
    if let Some(spec) = doc.get_mut("spec").and_then(Value::as_object_mut) {
        spec.remove("conversion");
        if let Some(Value::Array(versions)) = spec.get_mut("versions") {
            versions.retain(|v| v.get("storage").and_then(Value::as_bool) == Some(true));
            for v in versions {
                if let Some(schema) = v.get_mut("schema").and_then(|s| s.get_mut("openAPIV3Schema")) {
                    nullable_strings(schema);
                }
            }
        }
    }
    if let Some(m) = doc.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("annotations");
        m.remove("creationTimestamp");
    }
    doc.as_object_mut().map(|o| o.remove("status"));
    // Checked against the typed CRD, but applied as written: the typed round trip turns
    // some upstream `default: ""` into null, which the server rejects.
    serde_json::from_value::<CustomResourceDefinition>(doc.clone()).map_err(|e| e.to_string())?;
    Ok(doc)
}

/// Every CRD document in a YAML text, prepared for v1.20.
pub fn parse_all(text: &str, path: &str) -> Result<Vec<Value>, CrdError> {
    parse_raw(text, path)?.into_iter().map(|v| prepare(v).map_err(|reason| CrdError::Parse { path: path.to_owned(), reason })).collect()
}

/// Every document in a YAML text, as written (CEL rules and all).
pub fn parse_raw(text: &str, path: &str) -> Result<Vec<Value>, CrdError> {
    let mut out = Vec::new();
    for de in serde_yaml_ng::Deserializer::from_str(text) {
        let v: Value = serde::Deserialize::deserialize(de).map_err(|e| CrdError::Parse { path: path.to_owned(), reason: e.to_string() })?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

/// Installs CRDs and waits until all are Established.
pub async fn install(client: &kube::Client, crds: Vec<Value>) -> Result<Vec<String>, CrdError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let pp = PatchParams::apply("ferry-testbed").force();
    let mut names = Vec::new();
    for crd in crds {
        let name = crd.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_owned();
        api.patch(&name, &pp, &Patch::Apply(&crd)).await.map_err(|source| CrdError::Apply { name: name.clone(), source })?;
        names.push(name);
    }
    for name in &names {
        let established = await_condition(api.clone(), name, conditions::is_crd_established());
        match tokio::time::timeout(Duration::from_secs(60), established).await {
            Ok(Ok(_)) => {}
            _ => return Err(CrdError::NotEstablished(name.clone())),
        }
    }
    Ok(names)
}

/// The upstream CRDs beside the project (`../shared/crds`), if present: tests that read
/// them skip with a note when they are not.
pub fn shared_dir() -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/crds");
    p.is_dir().then_some(p)
}

/// The upstream CRDs (from [`shared_dir`]) of every kind the project's subset names
/// ([`crate::kinds::KINDS`]): the same kinds, with upstream's schemas. The file of a kind
/// is `<plural>.<group>.yaml` in one of the shared folders.
pub fn upstream_subset(shared: &Path) -> Result<Vec<Value>, CrdError> {
    upstream_subset_raw(shared)?.into_iter().map(|v| prepare(v).map_err(|reason| CrdError::Parse { path: shared.display().to_string(), reason })).collect()
}

/// [`upstream_subset`] as upstream wrote it (with its CEL rules).
pub fn upstream_subset_raw(shared: &Path) -> Result<Vec<Value>, CrdError> {
    let read = |p: &Path| std::fs::read_to_string(p).map_err(|source| CrdError::Read { path: p.display().to_string(), source });
    let dirs: Vec<PathBuf> = std::fs::read_dir(shared)
        .map_err(|source| CrdError::Read { path: shared.display().to_string(), source })?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    let mut out = Vec::new();
    for (group, _, kind, plural, _, _) in crate::kinds::KINDS {
        let file = format!("{plural}.{group}.yaml");
        let path = dirs.iter().map(|d| d.join(&file)).find(|p| p.is_file()).ok_or_else(|| CrdError::Parse {
            path: format!("{}/*/{file}", shared.display()),
            reason: format!("no upstream CRD of {kind} ({plural}.{group}) among the shared CRDs"),
        })?;
        out.extend(parse_raw(&read(&path)?, &path.display().to_string())?);
    }
    Ok(out)
}

/// For schema tests: a hub without controllers holding the upstream CRDs of `dirs` (under
/// [`shared_dir`]) and their names; None, with a printed note, when the CRDs or the test
/// bed are missing.
pub async fn upstream_hub(dirs: &[&str]) -> Result<Option<(crate::Fleet, kube::Client, Vec<String>)>, Box<dyn std::error::Error + Send + Sync>> {
    let Some(crds) = shared_dir() else {
        println!("note: ../shared/crds is not present beside the project; skipping");
        return Ok(None);
    };
    if !crate::binaries::Binaries::installed() {
        println!("note: the test bed is not installed (scripts/install-testbed.sh); skipping");
        return Ok(None);
    }
    let fleet = crate::Fleet::start(crate::FleetOptions { controllers: false, ..crate::FleetOptions::hub_and(0) }).await?;
    let hub = fleet.hub().client().await?;
    let mut installed = Vec::new();
    for dir in dirs {
        installed.extend(install_dir(&hub, &crds.join(dir)).await?);
    }
    Ok(Some((fleet, hub, installed)))
}

/// The paths of `sent` missing from `got`: what an API server pruned from an object
/// because its schema does not know them (a misspelt field vanishes silently).
pub fn pruned(sent: &serde_json::Value, got: &serde_json::Value) -> Vec<String> {
    fn walk(sent: &serde_json::Value, got: &serde_json::Value, path: &str, out: &mut Vec<String>) {
        match sent {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    let p = format!("{path}.{k}");
                    match got.get(k) {
                        Some(g) => walk(v, g, &p, out),
                        None => out.push(p),
                    }
                }
            }
            serde_json::Value::Array(a) => {
                for (i, v) in a.iter().enumerate() {
                    match got.get(i) {
                        Some(g) => walk(v, g, &format!("{path}[{i}]"), out),
                        None => out.push(format!("{path}[{i}]")),
                    }
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(sent, got, "", &mut out);
    out
}

/// Installs every CRD of every `.yaml` file in `dir` (sorted by name).
pub async fn install_dir(client: &kube::Client, dir: &Path) -> Result<Vec<String>, CrdError> {
    let read = |p: &Path| std::fs::read_to_string(p).map_err(|source| CrdError::Read { path: p.display().to_string(), source });
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(|source| CrdError::Read { path: dir.display().to_string(), source })?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    let mut crds = Vec::new();
    for f in files {
        crds.extend(parse_all(&read(&f)?, &f.display().to_string())?);
    }
    install(client, crds).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn string_fields_become_nullable_where_a_structural_schema_allows_it() {
        let mut schema = json!({"type": "object", "properties": {
            "group": {"type": "string"},
            "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
            "conditions": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"],
                "items": {"type": "object", "properties": {"type": {"type": "string"}, "message": {"type": "string"}}}},
            "maxFailures": {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": true},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        }});
        nullable_strings(&mut schema);
        let p = &schema["properties"];
        assert_eq!(p["group"]["nullable"], true);
        assert_eq!(p["labels"]["additionalProperties"]["nullable"], true);
        assert_eq!(p["conditions"]["items"]["properties"]["message"]["nullable"], true);
        // Forbidden by a structural schema: list-map keys, typed lists' items, value validations.
        assert!(p["conditions"]["items"]["properties"]["type"].get("nullable").is_none());
        assert!(p["tags"]["items"].get("nullable").is_none());
        assert!(p["maxFailures"]["anyOf"][1].get("nullable").is_none());
    }

    #[test]
    fn strips_cel_and_keeps_only_the_storage_version() {
        let doc = json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "things.example.io", "annotations": {"a": "b"}},
            "spec": {"group": "example.io", "scope": "Namespaced",
                "names": {"plural": "things", "kind": "Thing"},
                "conversion": {"strategy": "Webhook"},
                "versions": [
                    {"name": "v1beta1", "served": true, "storage": false, "schema": {"openAPIV3Schema": {"type": "object"}}},
                    {"name": "v1beta2", "served": true, "storage": true, "schema": {"openAPIV3Schema": {"type": "object",
                        "x-kubernetes-validations": [{"rule": "self.x > 0"}],
                        "properties": {"spec": {"type": "object", "x-kubernetes-validations": [{"rule": "true"}],
                            "properties": {"name": {"type": "string", "default": ""}}}}}}}
                ]}
        });
        let crd: CustomResourceDefinition = serde_json::from_value(prepare(doc).unwrap()).unwrap();
        assert_eq!(crd.spec.versions.len(), 1);
        assert_eq!(crd.spec.versions[0].name, "v1beta2");
        assert!(crd.spec.conversion.is_none());
        let text = serde_json::to_string(&crd).unwrap();
        assert!(!text.contains("x-kubernetes-validations"), "{text}");
        assert!(!text.contains("default"), "{text}");
        assert!(prepare(json!({"kind": "ConfigMap"})).is_err());
    }
}

//! The add-on catalog: what each add-on installs (manifests from a pinned upstream URL, a
//! file or inline text, with `${param}` substitution), what it applies once ready, and
//! which workloads must be ready. [`Catalog::builtin`] is the production catalog,
//! [`Catalog::emulated`] the emulated fleet's (same names and checks, small manifests).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ferry_task::Rejection;
use serde::Deserialize;
use serde_json::Value;

use crate::spec::AddonRequest;

/// A parameter of an add-on.
#[derive(Debug, Clone, Deserialize)]
pub struct Param {
    /// Its name, `${name}` in the manifests.
    pub name: String,
    /// What it means.
    #[serde(default)]
    pub description: String,
    /// The command must give it.
    #[serde(default)]
    pub required: bool,
    /// Its value when the command gives none.
    #[serde(default)]
    pub default: Option<String>,
}

/// A workload that must be ready.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ReadyCheck {
    /// `Deployment`, `DaemonSet` or `StatefulSet`.
    pub kind: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// One add-on.
#[derive(Debug, Clone, Deserialize)]
pub struct Addon {
    /// What it is.
    #[serde(default)]
    pub description: String,
    /// `https://...` or `file:PATH` (relative to the catalog file).
    #[serde(default)]
    pub source: Option<String>,
    /// Or the manifests inline.
    #[serde(default)]
    pub manifests: Option<String>,
    /// Its parameters.
    #[serde(default)]
    pub params: Vec<Param>,
    /// Objects applied once the workloads are ready (custom resources of the add-on).
    #[serde(default)]
    pub after: Option<String>,
    /// Workloads that must be ready.
    #[serde(default)]
    pub ready: Vec<ReadyCheck>,
    /// A pod network (CNI): installed before the nodes are waited for, since kubeadm's
    /// nodes stay NotReady until one runs.
    #[serde(default)]
    pub cni: bool,
    /// The add-on's namespace (`${param}`s substituted), for manifests made to be applied
    /// with `kubectl apply -n`: created first, and given to every namespaced object that
    /// names none.
    #[serde(default)]
    pub namespace: Option<String>,
    /// A namespace the upstream manifests hard-code in binding subjects (Strimzi's
    /// `myproject`), replaced by [`Addon::namespace`] as the project's install guide
    /// tells (`sed -i 's/namespace: .*/namespace: kafka/'`).
    #[serde(default)]
    pub placeholder_namespace: Option<String>,
    /// Values each cluster must have its own of, set in the manifests once parsed: a chart
    /// rendered once for every cluster carries one value where each needs its own (Liqo's
    /// cluster ID).
    #[serde(default)]
    pub per_cluster: Vec<PerCluster>,
}

/// A field of one rendered object set per cluster (`${cluster}`: the cluster's name;
/// `${param}`s too).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct PerCluster {
    /// The object's kind.
    pub kind: String,
    /// Its name.
    pub name: String,
    /// The field, as a JSON pointer (`/data/CLUSTER_ID`).
    pub pointer: String,
    /// Its value.
    pub value: String,
}

/// The parameter every add-on has: the name of the cluster it is installed on.
const CLUSTER_PARAM: &str = "cluster";

/// Kinds that live outside namespaces (the rest get [`Addon::namespace`] when they name
/// none).
const CLUSTER_SCOPED: &[&str] = &[
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "PriorityClass",
    "StorageClass",
    "IngressClass",
    "RuntimeClass",
    "CSIDriver",
    "PersistentVolume",
    "APIService",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
];

#[derive(Debug, Deserialize)]
struct CatalogFile {
    addons: BTreeMap<String, Addon>,
}

/// Why an add-on's manifests could not be had.
#[derive(Debug, thiserror::Error)]
pub enum AddonError {
    /// The catalog file is unreadable or malformed.
    #[error("add-on catalog {path}: {reason}")]
    Catalog {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// The manifests could not be fetched (retrying may help).
    #[error("add-on {addon}: fetching {source_url}: {reason}")]
    Fetch {
        /// The add-on.
        addon: String,
        /// Where from.
        source_url: String,
        /// What failed.
        reason: String,
    },
    /// The manifests are not YAML objects.
    #[error("add-on {addon}: manifests are not valid YAML objects: {reason}")]
    Parse {
        /// The add-on.
        addon: String,
        /// What is wrong.
        reason: String,
    },
    /// A per-cluster value's object is not in the manifests (rendered from another
    /// version, or without the option that makes it).
    #[error("add-on {addon}: the manifests have no {kind} {name} to set {pointer} in for cluster {cluster} (render them as the catalog's description says)")]
    PerCluster {
        /// The add-on.
        addon: String,
        /// The object's kind.
        kind: String,
        /// Its name.
        name: String,
        /// The field.
        pointer: String,
        /// The cluster.
        cluster: String,
    },
}

impl AddonError {
    /// Network failures may pass; a bad file or manifest does not.
    pub fn is_transient(&self) -> bool {
        matches!(self, AddonError::Fetch { source_url, .. } if source_url.starts_with("http"))
    }
}

/// The add-on catalog of a worker.
#[derive(Debug, Clone)]
pub struct Catalog {
    addons: BTreeMap<String, Addon>,
    base: PathBuf,
}

/// The manifests of one add-on for one cluster.
#[derive(Debug, Clone, Default)]
pub struct Manifests {
    /// Applied first (namespaces and CRDs ahead of the rest).
    pub install: Vec<Value>,
    /// Applied once the workloads are ready.
    pub after: Vec<Value>,
}

impl Catalog {
    /// Parses a catalog; `base` resolves relative `file:` sources.
    pub fn from_yaml(text: &str, base: &Path, origin: &str) -> Result<Self, AddonError> {
        let file: CatalogFile = serde_yaml_ng::from_str(text).map_err(|e| AddonError::Catalog { path: origin.into(), reason: e.to_string() })?;
        for (name, a) in &file.addons {
            if a.source.is_some() == a.manifests.is_some() {
                return Err(AddonError::Catalog { path: origin.into(), reason: format!("add-on {name}: give exactly one of source and manifests") });
            }
            if a.params.iter().any(|p| p.name == CLUSTER_PARAM) {
                return Err(AddonError::Catalog {
                    path: origin.into(),
                    reason: format!("add-on {name}: parameter {CLUSTER_PARAM:?} is reserved (every add-on has it: the cluster's name)"),
                });
            }
            if let Some(p) = a.per_cluster.iter().find(|p| !p.pointer.starts_with('/') || p.pointer.len() < 2) {
                return Err(AddonError::Catalog { path: origin.into(), reason: format!("add-on {name}: per_cluster pointer {:?} is not a JSON pointer to a field", p.pointer) });
            }
            if let Some(k) = a.ready.iter().find(|r| !matches!(r.kind.as_str(), "Deployment" | "DaemonSet" | "StatefulSet")) {
                return Err(AddonError::Catalog {
                    path: origin.into(),
                    reason: format!("add-on {name}: ready kind {:?} is not Deployment, DaemonSet or StatefulSet", k.kind),
                });
            }
        }
        Ok(Self { addons: file.addons, base: base.to_owned() })
    }

    /// Reads a catalog file.
    pub fn load(path: &Path) -> Result<Self, AddonError> {
        let text = std::fs::read_to_string(path).map_err(|e| AddonError::Catalog { path: path.display().to_string(), reason: e.to_string() })?;
        Self::from_yaml(&text, path.parent().unwrap_or(Path::new(".")), &path.display().to_string())
    }

    /// The production catalog (pinned upstream manifests).
    pub fn builtin() -> Self {
        Self::from_yaml(include_str!("catalog.yaml"), Path::new("/"), "built-in catalog").expect("the built-in catalog parses")
    }

    /// The emulated fleet's catalog.
    pub fn emulated() -> Self {
        Self::from_yaml(include_str!("emulated-addons.yaml"), Path::new("/"), "emulated catalog").expect("the emulated catalog parses")
    }

    /// The add-on `name`.
    pub fn get(&self, name: &str) -> Option<&Addon> {
        self.addons.get(name)
    }

    /// Checks a request against the catalog: a known add-on, its required parameters,
    /// no unknown ones, and values that cannot break out of a YAML scalar.
    pub fn check(&self, req: &AddonRequest) -> Result<(), Rejection> {
        let Some(a) = self.addons.get(&req.name) else {
            let known: Vec<&str> = self.addons.keys().map(String::as_str).collect();
            return Err(Rejection::new(format!("unknown add-on {:?}: the catalog has {}", req.name, known.join(", "))));
        };
        if let Some(p) = a.params.iter().find(|p| p.required && !req.params.contains_key(&p.name)) {
            return Err(Rejection::new(format!("add-on {} needs parameter {} ({})", req.name, p.name, p.description)));
        }
        let mut given: Vec<&String> = req.params.keys().collect();
        given.sort();
        for k in given {
            if !a.params.iter().any(|p| &p.name == k) {
                let takes: Vec<&str> = a.params.iter().map(|p| p.name.as_str()).collect();
                let takes = if takes.is_empty() { "none".to_owned() } else { takes.join(", ") };
                return Err(Rejection::new(format!("add-on {} has no parameter {k:?} (it takes: {takes})", req.name)));
            }
            let v = &req.params[k];
            if v.is_empty() || !v.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'/' | b',' | b'-')) {
                return Err(Rejection::new(format!(
                    "add-on {} parameter {k}: {v:?} is empty or has characters other than letters, digits and . _ : / , -",
                    req.name
                )));
            }
        }
        Ok(())
    }

    /// The manifests of `req` for `cluster` (fetched, substituted, parsed, its own values
    /// set).
    pub async fn manifests(&self, req: &AddonRequest, cluster: &str) -> Result<Manifests, AddonError> {
        let a = self.addons.get(&req.name).ok_or_else(|| AddonError::Catalog { path: "catalog".into(), reason: format!("no add-on {}", req.name) })?;
        let text = match (&a.manifests, &a.source) {
            (Some(t), _) => t.clone(),
            (None, Some(src)) => self.fetch(&req.name, src).await?,
            (None, None) => String::new(),
        };
        let parse = |t: &str| parse_docs(&req.name, &substitute(t, a, req, cluster));
        let mut install = parse(&text)?;
        if let Some(ns) = a.namespace.as_deref().map(|n| substitute(n, a, req, cluster)) {
            place_in(&mut install, &ns, a.placeholder_namespace.as_deref());
        }
        for p in &a.per_cluster {
            let value = substitute(&p.value, a, req, cluster);
            let target = install.iter_mut().find(|o| o["kind"] == p.kind.as_str() && o["metadata"]["name"] == p.name.as_str());
            let slot = target.and_then(|o| field_mut(o, &p.pointer));
            let Some(slot) = slot else {
                return Err(AddonError::PerCluster { addon: req.name.clone(), kind: p.kind.clone(), name: p.name.clone(), pointer: p.pointer.clone(), cluster: cluster.to_owned() });
            };
            *slot = Value::String(value);
        }
        // Namespaces and CRDs first: the rest needs them.
        install.sort_by_key(|o| match o["kind"].as_str() {
            Some("Namespace") => 0,
            Some("CustomResourceDefinition") => 1,
            _ => 2,
        });
        let after = a.after.as_deref().map(parse).transpose()?.unwrap_or_default();
        Ok(Manifests { install, after })
    }

    async fn fetch(&self, addon: &str, src: &str) -> Result<String, AddonError> {
        let err = |reason: String| AddonError::Fetch { addon: addon.into(), source_url: src.into(), reason };
        if let Some(path) = src.strip_prefix("file:") {
            let p = self.base.join(path);
            return std::fs::read_to_string(&p).map_err(|e| err(format!("{}: {e}", p.display())));
        }
        // reqwest is built without its own TLS provider: the process-wide one (ring).
        ferry_kube::init_crypto();
        let resp = reqwest::Client::new().get(src).send().await.map_err(|e| err(e.to_string()))?;
        let resp = resp.error_for_status().map_err(|e| err(e.to_string()))?;
        resp.text().await.map_err(|e| err(e.to_string()))
    }

    /// The workloads `req`'s add-on waits for, its parameters substituted.
    pub fn ready_checks(&self, req: &AddonRequest, cluster: &str) -> Vec<ReadyCheck> {
        let Some(a) = self.addons.get(&req.name) else { return Vec::new() };
        a.ready.iter().map(|r| ReadyCheck { namespace: substitute(&r.namespace, a, req, cluster), ..r.clone() }).collect()
    }
}

fn substitute(text: &str, a: &Addon, req: &AddonRequest, cluster: &str) -> String {
    let mut out = text.replace(&format!("${{{CLUSTER_PARAM}}}"), cluster);
    for p in &a.params {
        if let Some(v) = req.params.get(&p.name).or(p.default.as_ref()) {
            out = out.replace(&format!("${{{}}}", p.name), v);
        }
    }
    out
}

/// The field at `pointer` (`/a/b`) of `o`, made (with the maps above it) when missing;
/// `None` when something on the way is not a map.
fn field_mut<'v>(o: &'v mut Value, pointer: &str) -> Option<&'v mut Value> {
    let mut at = o;
    for key in pointer.split('/').skip(1) {
        let key = key.replace("~1", "/").replace("~0", "~");
        at = at.as_object_mut()?.entry(key).or_insert_with(|| Value::Object(serde_json::Map::new()));
    }
    Some(at)
}

/// Puts `objects` in namespace `ns` as `kubectl apply -n ns` would: the Namespace first,
/// every namespaced object without one in it, and binding subjects naming `placeholder`
/// pointed at it.
fn place_in(objects: &mut Vec<Value>, ns: &str, placeholder: Option<&str>) {
    for o in objects.iter_mut() {
        let kind = o["kind"].as_str().unwrap_or("").to_owned();
        if !CLUSTER_SCOPED.contains(&kind.as_str()) && o.pointer("/metadata/namespace").is_none_or(Value::is_null) {
            o["metadata"]["namespace"] = Value::String(ns.to_owned());
        }
        if let (Some(ph), Some(subjects)) = (placeholder, o.get_mut("subjects").and_then(Value::as_array_mut)) {
            for s in subjects.iter_mut().filter(|s| s["namespace"] == ph) {
                s["namespace"] = Value::String(ns.to_owned());
            }
        }
    }
    let exists = objects.iter().any(|o| o["kind"] == "Namespace" && o["metadata"]["name"] == ns);
    if !exists {
        objects.insert(0, serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
    }
}

fn parse_docs(addon: &str, text: &str) -> Result<Vec<Value>, AddonError> {
    use serde::Deserialize as _;
    let mut out = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(text) {
        let v = Value::deserialize(doc).map_err(|e| AddonError::Parse { addon: addon.into(), reason: e.to_string() })?;
        match v {
            Value::Null => {}
            Value::Object(_) if v["kind"].is_string() && v["apiVersion"].is_string() => out.push(v),
            other => {
                return Err(AddonError::Parse {
                    addon: addon.into(),
                    reason: format!("a document is not an object with apiVersion and kind: {}", truncate(&other.to_string())),
                });
            }
        }
    }
    Ok(out)
}

fn truncate(s: &str) -> String {
    if s.len() > 80 { format!("{}...", &s[..s.char_indices().nth(80).map_or(s.len(), |(i, _)| i)]) } else { s.to_owned() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(name: &str, params: &[(&str, &str)]) -> AddonRequest {
        AddonRequest { name: name.into(), params: params.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect() }
    }

    #[test]
    fn both_catalogs_parse_and_name_the_same_addons_with_the_same_checks() {
        let (b, e) = (Catalog::builtin(), Catalog::emulated());
        for (name, a) in &b.addons {
            let em = e.get(name).unwrap_or_else(|| panic!("the emulated catalog lacks {name}"));
            assert_eq!(a.ready, em.ready, "{name}: readiness checks differ");
            let p = |a: &Addon| a.params.iter().map(|p| (p.name.clone(), p.required, p.default.clone())).collect::<Vec<_>>();
            assert_eq!(p(a), p(em), "{name}: parameters differ");
            assert_eq!((a.cni, &a.namespace, &a.placeholder_namespace), (em.cni, &em.namespace, &em.placeholder_namespace), "{name}: placement differs");
            assert_eq!(a.per_cluster, em.per_cluster, "{name}: per-cluster values differ");
        }
    }

    #[test]
    fn parameters_are_checked_and_substituted() {
        let c = Catalog::emulated();
        assert!(c.check(&req("metallb", &[("address_pool", "10.0.0.100-10.0.0.120")])).is_ok());
        let e = c.check(&req("metallb", &[("address_pool", "1.2.3.4\nkind: Secret")])).unwrap_err();
        assert!(e.reason.contains("characters other than"), "{e}");
        let e = c.check(&req("metallb", &[("address_pool", "10.0.0.0/24"), ("pool", "x")])).unwrap_err();
        assert!(e.reason.contains("has no parameter \"pool\" (it takes: address_pool)"), "{e}");
        let m = futures::executor::block_on(c.manifests(&req("metallb", &[("address_pool", "10.0.0.0/24")]), "c1")).unwrap();
        assert_eq!(m.install[0]["kind"], "Namespace");
        assert_eq!(m.after[0]["data"]["addresses"], "10.0.0.0/24");
    }

    #[test]
    fn an_addon_made_for_apply_dash_n_lands_in_its_namespace_which_it_creates() {
        // Strimzi's release file names no namespace but `myproject` in its subjects.
        let c = Catalog::emulated();
        let m = futures::executor::block_on(c.manifests(&req("strimzi", &[]), "c1")).unwrap();
        assert_eq!((m.install[0]["kind"].as_str(), m.install[0]["metadata"]["name"].as_str()), (Some("Namespace"), Some("kafka")));
        for o in m.install.iter().skip(1) {
            assert_eq!(o["metadata"]["namespace"], "kafka", "{o}");
        }
        let binding = m.install.iter().find(|o| o["kind"] == "RoleBinding").unwrap();
        assert_eq!(binding["subjects"][0]["namespace"], "kafka");
        let r = req("strimzi", &[("namespace", "streams")]);
        let m = futures::executor::block_on(c.manifests(&r, "c1")).unwrap();
        assert_eq!(m.install[0]["metadata"]["name"], "streams");
        assert_eq!(c.ready_checks(&r, "c1")[0].namespace, "streams");
        // Liqo as helm template renders it: CRDs, no Namespace; the namespace is made first.
        let m = futures::executor::block_on(c.manifests(&req("liqo", &[]), "c1")).unwrap();
        let kinds: Vec<&str> = m.install.iter().filter_map(|o| o["kind"].as_str()).collect();
        assert_eq!(kinds, ["Namespace", "CustomResourceDefinition", "ConfigMap", "Deployment"]);
        assert!(m.install[1]["metadata"].get("namespace").is_none(), "a CRD stays cluster-scoped");
    }

    #[test]
    fn every_namespace_an_addon_waits_in_is_one_it_makes_or_a_clusters_own() {
        // The built-in catalog's URL sources are read at install time: their namespaces
        // are the ones the upstream files create (metallb-system, ingress-nginx) or
        // `namespace:` makes; the emulated stand-ins must make them too.
        let c = Catalog::emulated();
        for (name, a) in &c.addons {
            let r = AddonRequest { name: name.clone(), params: a.params.iter().map(|p| (p.name.clone(), p.default.clone().unwrap_or_else(|| "10.0.0.0/24".into()))).collect() };
            let m = futures::executor::block_on(c.manifests(&r, "c1")).unwrap();
            for check in c.ready_checks(&r, "c1") {
                let made = m.install.iter().any(|o| o["kind"] == "Namespace" && o["metadata"]["name"] == check.namespace.as_str());
                assert!(made || ["default", "kube-system"].contains(&check.namespace.as_str()), "{name} waits in namespace {} it does not make", check.namespace);
            }
        }
    }

    #[test]
    fn every_cluster_gets_its_own_liqo_cluster_id_from_one_rendered_file() {
        // One rendered file, two clusters: each its own ID (the file's rendered-once value
        // on both would make them one cluster to Liqo).
        let c = Catalog::emulated();
        let id = |cluster: &str| {
            let m = futures::executor::block_on(c.manifests(&req("liqo", &[]), cluster)).unwrap();
            let cm = m.install.iter().find(|o| o["kind"] == "ConfigMap").unwrap().clone();
            assert_eq!(cm["metadata"]["namespace"], "liqo");
            cm["data"]["CLUSTER_ID"].as_str().unwrap().to_owned()
        };
        assert_eq!((id("edge-1"), id("edge-2")), ("edge-1".to_owned(), "edge-2".to_owned()));
        // A file rendered without the ConfigMap: refused, naming what is missing.
        let text = include_str!("emulated-addons.yaml").replace("metadata: {name: liqo-clusterid-configmap}", "metadata: {name: liqo-config}");
        let c = Catalog::from_yaml(&text, Path::new("/"), "test").unwrap();
        let e = futures::executor::block_on(c.manifests(&req("liqo", &[]), "edge-1")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "add-on liqo: the manifests have no ConfigMap liqo-clusterid-configmap to set /data/CLUSTER_ID in for cluster edge-1 (render them as the catalog's description says)"
        );
        assert!(!e.is_transient());
        // `cluster` is every add-on's parameter: a catalog may not declare it.
        let text = "addons: {x: {manifests: '', params: [{name: cluster}]}}";
        let e = Catalog::from_yaml(text, Path::new("/"), "test").unwrap_err();
        assert!(e.to_string().contains("parameter \"cluster\" is reserved"), "{e}");
    }

    #[test]
    fn a_missing_file_source_is_a_clear_permanent_error() {
        let c = Catalog::builtin();
        let e = futures::executor::block_on(c.manifests(&req("liqo", &[]), "c1")).unwrap_err();
        assert!(e.to_string().contains("/etc/ferry/addons/liqo.yaml"), "{e}");
        assert!(!e.is_transient());
    }
}

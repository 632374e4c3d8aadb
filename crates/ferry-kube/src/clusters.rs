//! Clients of the hub and of every managed cluster. A managed cluster's client comes from
//! its Cluster API kubeconfig Secret on the hub (`<cluster>-kubeconfig`, key `value`,
//! label `cluster.x-k8s.io/cluster-name`), so kubeconfigs never travel through Kafka.
//! Only Secrets Cluster API made are used, and only in the configured namespaces
//! ([`NAMESPACES_ENV`]; [`capi_secret`] says what Cluster API's look like): a Secret
//! elsewhere is never read, so whoever may write Secrets in another namespace of the hub
//! cannot plant a cluster's credentials.
//! Also discovery-backed dynamic APIs with idempotent server-side apply and delete.

pub mod capi_secret;

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::GroupVersionKind;
use kube::discovery::{ApiCapabilities, ApiResource, Scope};
use kube::{Client, Config};
use serde_json::Value;

pub use capi_secret::Rule;

/// The name under which [`Clusters::client`] returns the hub itself.
pub const HUB: &str = "hub";

/// Label Cluster API puts on a cluster's kubeconfig Secret.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";

/// The hub namespaces (comma-separated) whose kubeconfig Secrets [`Clusters::new`] uses; a
/// `<cluster>-kubeconfig` Secret in any other namespace is never looked at. The chart sets
/// it from `clusterNamespaces`, where each worker's Role lets it read Secrets.
pub const NAMESPACES_ENV: &str = "FERRY_CLUSTER_NAMESPACES";

/// The namespaces when [`NAMESPACES_ENV`] is unset: those the test bed and `ferry dev` keep
/// clusters in today: `ferry-fleet` (the bed's members, `Fleet::publish_kubeconfigs`),
/// `fleet` (the clusters `ferry dev`, the examples and the create-cluster tests make),
/// `default` (a create-cluster command's namespace when it names none) and `campaign`
/// (the fault campaign's).
pub const DEFAULT_NAMESPACES: &[&str] = &["ferry-fleet", "fleet", "default", "campaign"];

/// The namespaces [`NAMESPACES_ENV`] names (or [`DEFAULT_NAMESPACES`] when it is unset):
/// names that are not namespace names are left out, with a warning.
pub fn configured_namespaces() -> Vec<String> {
    match std::env::var(NAMESPACES_ENV) {
        Ok(v) => parse_namespaces(&v),
        Err(_) => DEFAULT_NAMESPACES.iter().map(|n| (*n).to_owned()).collect(),
    }
}

fn parse_namespaces(v: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for n in v.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if !crate::names::is_dns1123_label(n) {
            tracing::warn!(namespace = n, "{NAMESPACES_ENV}: not a namespace name; left out");
        } else if !out.iter().any(|o| o == n) {
            out.push(n.to_owned());
        }
    }
    out
}

/// Why a cluster cannot be reached or an object not applied.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// No kubeconfig Secret of the cluster in the configured namespaces (Secrets elsewhere
    /// are not looked at).
    #[error(
        "cluster {cluster:?} is unknown: no Secret {cluster}-kubeconfig in the hub's cluster namespaces {namespaces:?} ({NAMESPACES_ENV}); kubeconfig Secrets in other namespaces are not looked at"
    )]
    Unknown {
        /// The cluster.
        cluster: String,
        /// Where it was looked for.
        namespaces: Vec<String>,
    },
    /// More than one namespace holds a kubeconfig Secret for it.
    #[error("cluster {cluster:?} is ambiguous: kubeconfig Secrets in namespaces {namespaces:?}")]
    Ambiguous {
        /// The cluster.
        cluster: String,
        /// Where the Secrets are.
        namespaces: Vec<String>,
    },
    /// The cluster's kubeconfig Secret is not one Cluster API made ([`capi_secret`]): it is
    /// not used, and its content is never read.
    #[error("cluster {cluster:?}: Secret {namespace}/{cluster}-kubeconfig is not Cluster API's and is not used ({rule} rule: {detail})")]
    NotClusterApis {
        /// The cluster.
        cluster: String,
        /// The Secret's namespace.
        namespace: String,
        /// The rule it breaks.
        rule: Rule,
        /// How (names, type and owners; never the content).
        detail: String,
    },
    /// The Secret's kubeconfig is unusable (its content is never shown).
    #[error("the kubeconfig in Secret {namespace}/{cluster}-kubeconfig is unusable: {reason}")]
    BadKubeconfig {
        /// The cluster.
        cluster: String,
        /// The Secret's namespace.
        namespace: String,
        /// What is wrong, without the content.
        reason: String,
    },
    /// The object has no apiVersion/kind, or the API server does not serve it.
    #[error("cluster {cluster:?} does not serve {what}")]
    NotServed {
        /// The cluster.
        cluster: String,
        /// The apiVersion/kind.
        what: String,
    },
    /// The object is malformed.
    #[error("object is malformed: {0}")]
    Malformed(String),
    /// The API server refused.
    #[error("cluster {cluster:?}: {}", crate::said::said(source))]
    Kube {
        /// The cluster.
        cluster: String,
        /// What kube said.
        #[source]
        source: kube::Error,
    },
}

impl ClusterError {
    /// Retrying may help (network, 5xx, 409, 429); unknown clusters and bad input do not.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Kube { source, .. } => transient(source),
            _ => false,
        }
    }
}

/// Whether trying a Kubernetes request again may help: a network error, 5xx, 409 or 429.
pub fn transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code >= 500 || s.code == 409 || s.code == 429,
        _ => true,
    }
}

struct Cached {
    resource_version: String,
    client: Client,
}

/// The hub's client and the managed clusters' clients, cached by their Secret's version.
pub struct Clusters {
    hub: Client,
    namespaces: Vec<String>,
    cache: Mutex<HashMap<String, Cached>>,
    kinds: Mutex<HashMap<(String, GroupVersionKind), (ApiResource, ApiCapabilities)>>,
}

impl std::fmt::Debug for Clusters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cached: Vec<String> = self.cache.lock().map(|c| c.keys().cloned().collect()).unwrap_or_default();
        f.debug_struct("Clusters").field("namespaces", &self.namespaces).field("cached", &cached).finish()
    }
}

impl Clusters {
    /// Clusters reached through `hub`, their kubeconfig Secrets in the namespaces
    /// [`NAMESPACES_ENV`] names ([`configured_namespaces`]).
    pub fn new(hub: Client) -> Self {
        Self::with_namespaces(hub, configured_namespaces())
    }

    /// Clusters reached through `hub`, their kubeconfig Secrets in `namespaces` only.
    pub fn with_namespaces<S: Into<String>>(hub: Client, namespaces: impl IntoIterator<Item = S>) -> Self {
        crate::init_crypto();
        let mut ns: Vec<String> = Vec::new();
        for n in namespaces.into_iter().map(Into::into) {
            if !ns.contains(&n) {
                ns.push(n);
            }
        }
        Self { hub, namespaces: ns, cache: Mutex::default(), kinds: Mutex::default() }
    }

    /// The hub namespaces whose kubeconfig Secrets are used.
    pub fn namespaces(&self) -> &[String] {
        &self.namespaces
    }

    /// From the default kubeconfig or the in-cluster config.
    pub async fn infer() -> Result<Self, kube::Error> {
        crate::init_crypto();
        Ok(Self::new(Client::try_default().await?))
    }

    /// The hub's client.
    pub fn hub(&self) -> &Client {
        &self.hub
    }

    /// Where `cluster`'s kubeconfig Secret is: `(namespace, name)`; only a Secret Cluster
    /// API made, in a configured namespace.
    pub async fn kubeconfig_secret(&self, cluster: &str) -> Result<(String, String), ClusterError> {
        let s = self.find_secret(cluster).await?;
        Ok((s.metadata.namespace.unwrap_or_default(), s.metadata.name.unwrap_or_default()))
    }

    /// The configured namespaces holding a Secret named `<cluster>-kubeconfig`, Cluster
    /// API's or not (a name in use there is taken).
    pub async fn kubeconfig_secret_namespaces(&self, cluster: &str) -> Result<Vec<String>, ClusterError> {
        Ok(self.kubeconfig_secrets(cluster).await?.into_iter().filter_map(|s| s.metadata.namespace).collect())
    }

    /// Every `<cluster>-kubeconfig` Secret in the configured namespaces: one `get` per
    /// namespace (all a worker's Role there allows), never a list of other namespaces.
    async fn kubeconfig_secrets(&self, cluster: &str) -> Result<Vec<Secret>, ClusterError> {
        let name = format!("{cluster}-kubeconfig");
        // The hub is not a cluster, and a name that is no Secret name is nobody's (nor a path).
        if cluster == HUB || !crate::names::is_dns1123_subdomain(&name) {
            return Ok(Vec::new());
        }
        let gets = self.namespaces.iter().map(|ns| {
            let api: Api<Secret> = Api::namespaced(self.hub.clone(), ns);
            let name = name.clone();
            async move { api.get_opt(&name).await }
        });
        let mut found = Vec::new();
        for got in futures::future::join_all(gets).await {
            if let Some(s) = got.map_err(|source| ClusterError::Kube { cluster: HUB.into(), source })? {
                found.push(s);
            }
        }
        Ok(found)
    }

    async fn find_secret(&self, cluster: &str) -> Result<Secret, ClusterError> {
        let mut found = self.kubeconfig_secrets(cluster).await?;
        let secret = match found.len() {
            0 => return Err(ClusterError::Unknown { cluster: cluster.to_owned(), namespaces: self.namespaces.clone() }),
            1 => found.remove(0),
            _ => {
                return Err(ClusterError::Ambiguous {
                    cluster: cluster.to_owned(),
                    namespaces: found.iter().filter_map(|s| s.metadata.namespace.clone()).collect(),
                });
            }
        };
        capi_secret::check(cluster, &secret).map_err(|(rule, detail)| ClusterError::NotClusterApis {
            cluster: cluster.to_owned(),
            namespace: secret.metadata.namespace.clone().unwrap_or_default(),
            rule,
            detail,
        })?;
        Ok(secret)
    }

    /// A client of `cluster` ([`HUB`] for the hub).
    pub async fn client(&self, cluster: &str) -> Result<Client, ClusterError> {
        if cluster == HUB {
            return Ok(self.hub.clone());
        }
        let secret = self.find_secret(cluster).await?;
        let rv = secret.metadata.resource_version.clone().unwrap_or_default();
        if let Some(c) = self.cache.lock().expect("cache lock").get(cluster)
            && c.resource_version == rv
        {
            return Ok(c.client.clone());
        }
        let namespace = secret.metadata.namespace.clone().unwrap_or_default();
        let bad = |reason: String| ClusterError::BadKubeconfig { cluster: cluster.to_owned(), namespace: namespace.clone(), reason };
        let bytes = secret.data.as_ref().and_then(|d| d.get("value")).ok_or_else(|| bad("no key `value`".into()))?;
        let text = std::str::from_utf8(&bytes.0).map_err(|_| bad("not UTF-8".into()))?;
        // Errors below name the failing part only: kubeconfig parse errors can quote content.
        let kc = Kubeconfig::from_yaml(text).map_err(|_| bad("not a kubeconfig document".into()))?;
        self_contained(&kc).map_err(bad)?;
        let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(|_| bad("no usable context, cluster or user in it".into()))?;
        let client = Client::try_from(config).map_err(|_| bad("no client can be built from it (TLS settings)".into()))?;
        self.cache
            .lock()
            .expect("cache lock")
            .insert(cluster.to_owned(), Cached { resource_version: rv, client: client.clone() });
        Ok(client)
    }

    /// The API of `gvk` on `cluster` (namespaced when the kind is and `namespace` is set),
    /// found through discovery (so irregular plurals are right) and cached.
    pub async fn api(&self, cluster: &str, gvk: &GroupVersionKind, namespace: Option<&str>) -> Result<Api<DynamicObject>, ClusterError> {
        let client = self.client(cluster).await?;
        let key = (cluster.to_owned(), gvk.clone());
        let cached = self.kinds.lock().expect("kinds lock").get(&key).cloned();
        let (ar, caps) = match cached {
            Some(v) => v,
            None => {
                let found = kube::discovery::pinned_kind(&client, gvk).await.map_err(|e| match e {
                    kube::Error::Api(s) if s.code == 404 => {
                        ClusterError::NotServed { cluster: cluster.to_owned(), what: format!("{}/{} {}", gvk.group, gvk.version, gvk.kind) }
                    }
                    kube::Error::Discovery(_) => {
                        ClusterError::NotServed { cluster: cluster.to_owned(), what: format!("{}/{} {}", gvk.group, gvk.version, gvk.kind) }
                    }
                    source => ClusterError::Kube { cluster: cluster.to_owned(), source },
                })?;
                self.kinds.lock().expect("kinds lock").insert(key, found.clone());
                found
            }
        };
        Ok(match (caps.scope, namespace) {
            (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client, ns, &ar),
            (Scope::Namespaced, None) => Api::default_namespaced_with(client, &ar),
            (Scope::Cluster, _) => Api::all_with(client, &ar),
        })
    }

    /// Server-side applies `obj` (JSON with apiVersion, kind, metadata.name and, for
    /// namespaced kinds, metadata.namespace) to `cluster` as `manager`, forcing conflicts.
    pub async fn apply(&self, cluster: &str, obj: &Value, manager: &str) -> Result<DynamicObject, ClusterError> {
        let (api, name) = self.api_of(cluster, obj).await?;
        let pp = PatchParams::apply(manager).force();
        api.patch(&name, &pp, &Patch::Apply(obj)).await.map_err(|source| ClusterError::Kube { cluster: cluster.to_owned(), source })
    }

    /// As [`Clusters::apply`], but validated and not persisted (server-side dry run).
    pub async fn dry_run_apply(&self, cluster: &str, obj: &Value, manager: &str) -> Result<DynamicObject, ClusterError> {
        self.dry_run_apply_with(cluster, obj, PatchParams::apply(manager).force()).await
    }

    /// A server-side apply dry run of `obj` with `pp` (forced or not, as the run applies).
    pub async fn dry_run_apply_with(&self, cluster: &str, obj: &Value, pp: PatchParams) -> Result<DynamicObject, ClusterError> {
        let (api, name) = self.api_of(cluster, obj).await?;
        api.patch(&name, &pp.dry_run(), &Patch::Apply(obj)).await.map_err(|source| ClusterError::Kube { cluster: cluster.to_owned(), source })
    }

    /// Deletes the object `obj` names; true when it existed (gone already is success).
    pub async fn delete(&self, cluster: &str, obj: &Value) -> Result<bool, ClusterError> {
        let (api, name) = self.api_of(cluster, obj).await?;
        match api.delete(&name, &DeleteParams::background()).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
            Err(source) => Err(ClusterError::Kube { cluster: cluster.to_owned(), source }),
        }
    }

    /// The object `obj` names, as it is now on `cluster` (None when absent).
    pub async fn get(&self, cluster: &str, obj: &Value) -> Result<Option<DynamicObject>, ClusterError> {
        let (api, name) = self.api_of(cluster, obj).await?;
        api.get_opt(&name).await.map_err(|source| ClusterError::Kube { cluster: cluster.to_owned(), source })
    }

    async fn api_of(&self, cluster: &str, obj: &Value) -> Result<(Api<DynamicObject>, String), ClusterError> {
        let gvk = gvk_of(obj)?;
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .ok_or_else(|| ClusterError::Malformed(format!("{} without metadata.name", gvk.kind)))?
            .to_owned();
        let ns = obj.pointer("/metadata/namespace").and_then(Value::as_str);
        Ok((self.api(cluster, &gvk, ns).await?, name))
    }
}

/// Refuses what a kubeconfig from a Secret must not make a worker do: run a command
/// (`exec`, which kube runs as the worker), call an auth provider plugin, or read a file
/// of the worker's machine (a CA, a client certificate or key, a token file): a
/// kubeconfig from the hub carries its credentials inline, as Cluster API writes them.
pub fn self_contained(kc: &Kubeconfig) -> Result<(), String> {
    for a in &kc.auth_infos {
        let Some(u) = &a.auth_info else { continue };
        let what = if u.exec.is_some() {
            Some("an exec credential plugin (a command the worker would run)")
        } else if u.auth_provider.is_some() {
            Some("an auth provider plugin")
        } else if u.client_certificate.is_some() || u.client_key.is_some() {
            Some("a client certificate or key file")
        } else if u.token_file.is_some() {
            Some("a token file")
        } else {
            None
        };
        if let Some(what) = what {
            return Err(format!("user {:?} uses {what}; only inline credentials are accepted", a.name));
        }
    }
    for c in &kc.clusters {
        if c.cluster.as_ref().is_some_and(|c| c.certificate_authority.is_some()) {
            return Err(format!("cluster {:?} names a CA file; only inline certificate-authority-data is accepted", c.name));
        }
    }
    Ok(())
}

/// The group, version and kind of a JSON object.
pub fn gvk_of(obj: &Value) -> Result<GroupVersionKind, ClusterError> {
    let api_version = obj.get("apiVersion").and_then(Value::as_str).ok_or_else(|| ClusterError::Malformed("no apiVersion".into()))?;
    let kind = obj.get("kind").and_then(Value::as_str).ok_or_else(|| ClusterError::Malformed("no kind".into()))?;
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    Ok(GroupVersionKind::gvk(group, version, kind))
}

/// A `kube` client from a kubeconfig file (the hub's `--kubeconfig`, or a test bed's
/// cluster).
pub async fn client_from_file(kubeconfig: &std::path::Path) -> Result<Client, Box<dyn std::error::Error + Send + Sync>> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kc(user: &str, cluster: &str) -> Kubeconfig {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://10.0.0.1:6443\n{cluster}users:\n- name: u\n  user:\n{user}contexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n"
        );
        Kubeconfig::from_yaml(&text).unwrap()
    }

    #[test]
    fn namespaces_are_namespace_names() {
        assert_eq!(parse_namespaces(" fleet, ferry-fleet ,,fleet"), ["fleet", "ferry-fleet"]);
        assert_eq!(parse_namespaces("fleet,../x,Caps,a/b"), ["fleet"], "names that are not namespaces are left out");
        assert!(parse_namespaces("").is_empty());
    }

    #[test]
    fn only_inline_credentials_are_accepted() {
        assert_eq!(self_contained(&kc("    token: abc\n", "    certificate-authority-data: Zm9v\n")), Ok(()));
        let refused = |user: &str, cluster: &str| self_contained(&kc(user, cluster)).unwrap_err();
        assert!(refused("    exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/sh, args: [-c, id]}\n", "").contains("exec credential plugin"));
        assert!(refused("    auth-provider: {name: oidc}\n", "").contains("auth provider"));
        assert!(refused("    client-certificate: /etc/passwd\n    client-key: /etc/shadow\n", "").contains("file"));
        assert!(refused("    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token\n", "").contains("token file"));
        assert!(refused("    token: abc\n", "    certificate-authority: /etc/ssl/ca.pem\n").contains("CA file"));
    }
}

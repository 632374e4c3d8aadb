//! Every object on a cluster by kind, namespace and name (with its labels), so a test can
//! compare a cluster before and after and name what was added or removed.

use std::collections::BTreeMap;

use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::discovery::{Discovery, Scope, verbs};

/// Kinds that change on their own (heartbeats, events, endpoints), left out.
const VOLATILE: &[&str] = &["Event", "Lease", "Endpoints", "EndpointSlice"];

/// One object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectRef {
    /// API group; empty for the core group.
    pub group: String,
    /// Kind, e.g. `Deployment`.
    pub kind: String,
    /// Namespace; empty for cluster-scoped objects.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.namespace.is_empty() { write!(f, "{} {}", self.kind, self.name) } else { write!(f, "{} {}/{}", self.kind, self.namespace, self.name) }
    }
}

/// A cluster's objects at one moment, with their labels.
#[derive(Debug, Clone, Default)]
pub struct Inventory {
    /// Every object but the volatile kinds'.
    pub objects: BTreeMap<ObjectRef, BTreeMap<String, String>>,
    /// Those whose deletion is under way (a deletion timestamp, finalizers pending), with
    /// their kind's resource and uid: [`Inventory::wait_deleted`] waits for them.
    pub deleting: BTreeMap<ObjectRef, (ApiResource, String)>,
}

impl Inventory {
    /// Lists every listable kind the cluster serves (its preferred version), metadata only.
    pub async fn take(client: &kube::Client) -> Result<Self, kube::Error> {
        let discovery = Discovery::new(client.clone()).run().await?;
        let mut objects = BTreeMap::new();
        let mut deleting = BTreeMap::new();
        for group in discovery.groups() {
            for (ar, caps) in group.recommended_resources() {
                if !caps.supports_operation(verbs::LIST) || VOLATILE.contains(&ar.kind.as_str()) {
                    continue;
                }
                let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
                let list = api.list_metadata(&ListParams::default()).await?;
                for o in list.items {
                    let namespace = if caps.scope == Scope::Namespaced { o.metadata.namespace.clone().unwrap_or_default() } else { String::new() };
                    let key = ObjectRef { group: ar.group.clone(), kind: ar.kind.clone(), namespace, name: o.metadata.name.clone().unwrap_or_default() };
                    if o.metadata.deletion_timestamp.is_some() {
                        deleting.insert(key.clone(), (ar.clone(), o.metadata.uid.clone().unwrap_or_default()));
                    }
                    objects.insert(key, o.metadata.labels.clone().unwrap_or_default());
                }
            }
        }
        Ok(Self { objects, deleting })
    }

    /// Waits, up to `timeout` for all, until each of `objects` that was being deleted is
    /// gone (a watch each: kube's `await_condition`); the ones still there, or not being
    /// deleted, are returned.
    pub async fn wait_deleted<'a>(&self, client: &kube::Client, objects: Vec<&'a ObjectRef>, timeout: std::time::Duration) -> Vec<&'a ObjectRef> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut left = Vec::new();
        for o in objects {
            let Some((ar, uid)) = self.deleting.get(o) else {
                left.push(o);
                continue;
            };
            let api: Api<DynamicObject> = if o.namespace.is_empty() { Api::all_with(client.clone(), ar) } else { Api::namespaced_with(client.clone(), &o.namespace, ar) };
            let gone = tokio::time::timeout_at(deadline, kube::runtime::wait::await_condition(api, &o.name, kube::runtime::wait::conditions::is_deleted(uid))).await;
            if !matches!(gone, Ok(Ok(_))) {
                left.push(o);
            }
        }
        left
    }

    /// What `later` has that this does not.
    pub fn added<'a>(&self, later: &'a Inventory) -> Vec<(&'a ObjectRef, &'a BTreeMap<String, String>)> {
        later.objects.iter().filter(|(k, _)| !self.objects.contains_key(*k)).collect()
    }

    /// What this has that `later` does not.
    pub fn removed<'a>(&'a self, later: &Inventory) -> Vec<&'a ObjectRef> {
        self.objects.keys().filter(|k| !later.objects.contains_key(*k)).collect()
    }
}

//! A small framework for the emulated controllers of the simulated fleet (Cluster API,
//! OCM, Liqo): a `kube::runtime::Controller` over one kind whose reconcile runs after a
//! configurable delay, can be held stuck (a cluster that never becomes ready), and can
//! fail its next attempts (retried with backoff by the controller).

use std::collections::HashMap;
use std::fmt::Debug;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;

/// The knobs of one emulated controller, changeable while it runs.
#[derive(Debug, Clone, Default)]
pub struct Knobs {
    /// Time between first seeing an object and acting on it.
    pub delay: Duration,
    /// Never act (the emulated component never becomes ready).
    pub stuck: bool,
    /// Fail this many next attempts.
    pub fail_next: u32,
}

/// Why an emulated reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum EmulateError {
    /// Injected through [`Knobs::fail_next`].
    #[error("injected failure")]
    Injected,
    /// The API refused.
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

struct Ctx {
    knobs: Arc<Mutex<Knobs>>,
    first_seen: Mutex<HashMap<String, Instant>>,
}

/// A running emulated controller; stops when dropped.
#[derive(Debug)]
pub struct Emulated {
    knobs: Arc<Mutex<Knobs>>,
    task: JoinHandle<()>,
}

impl Drop for Emulated {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Emulated {
    /// Changes the knobs.
    pub fn set(&self, f: impl FnOnce(&mut Knobs)) {
        f(&mut self.knobs.lock().expect("knobs lock"));
    }
}

/// Runs `act` for every object of `api` (once per change), subject to `knobs`.
pub fn run<K, F, Fut>(api: Api<K>, knobs: Knobs, act: F) -> Emulated
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    F: Fn(Arc<K>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), kube::Error>> + Send + 'static,
{
    let knobs = Arc::new(Mutex::new(knobs));
    let ctx = Arc::new(Ctx { knobs: knobs.clone(), first_seen: Mutex::default() });
    let act = Arc::new(act);
    let reconcile = move |obj: Arc<K>, ctx: Arc<Ctx>| {
        let act = act.clone();
        async move {
            let k = ctx.knobs.lock().expect("knobs lock").clone();
            if k.stuck {
                return Ok(Action::await_change());
            }
            let key = obj.uid().unwrap_or_else(|| obj.name_any());
            let seen = *ctx.first_seen.lock().expect("seen lock").entry(key).or_insert_with(Instant::now);
            let waited = seen.elapsed();
            if waited < k.delay {
                return Ok(Action::requeue(k.delay - waited));
            }
            {
                let mut kn = ctx.knobs.lock().expect("knobs lock");
                if kn.fail_next > 0 {
                    kn.fail_next -= 1;
                    return Err(EmulateError::Injected);
                }
            }
            act(obj).await?;
            Ok(Action::await_change())
        }
    };
    let error_policy = |_obj: Arc<K>, _e: &EmulateError, _ctx: Arc<Ctx>| Action::requeue(Duration::from_millis(200));
    let task = tokio::spawn(async move {
        Controller::new(api, watcher::Config::default())
            .run(reconcile, error_policy, ctx)
            .for_each(|_| async {})
            .await;
    });
    Emulated { knobs, task }
}

/// Now, as Kubernetes writes condition times (RFC 3339, whole seconds, UTC).
pub fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// A create's outcome with "already exists" (409) counted as done: the object is there.
pub fn present<T>(r: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match r {
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        r => r.map(drop),
    }
}

/// A delete's outcome with "not found" (404) counted as done: the object is gone.
pub fn absent<T>(r: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match r {
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        r => r.map(drop),
    }
}

/// The merge patch that gives `meta`'s object finalizer `name` (`wanted`) or takes it
/// away, at the read resourceVersion, so a write racing another fails (409, retried on the
/// next pass) instead of losing the other's finalizer: what upstream's controllers do with
/// `controllerutil.AddFinalizer`/`RemoveFinalizer` and an Update. None: already so.
pub fn finalizer_patch(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, name: &str, wanted: bool) -> Option<serde_json::Value> {
    let mut finalizers = meta.finalizers.clone().unwrap_or_default();
    if finalizers.iter().any(|f| f == name) == wanted {
        return None;
    }
    if wanted {
        finalizers.push(name.to_owned());
    } else {
        finalizers.retain(|f| f != name);
    }
    Some(serde_json::json!({"metadata": {"finalizers": finalizers, "resourceVersion": meta.resource_version}}))
}

/// A merge patch (RFC 7386) that turns `old` into `new`: keys `new` lacks are nulled, so
/// a status copied back loses what its source lost (a NamespaceMap's mapping removed).
pub fn merge_patch(old: &serde_json::Value, new: &serde_json::Value) -> serde_json::Value {
    match (old, new) {
        (serde_json::Value::Object(o), serde_json::Value::Object(n)) => {
            let mut patch = serde_json::Map::new();
            for (k, v) in n.iter().filter(|(k, v)| o.get(*k) != Some(*v)) {
                patch.insert(k.clone(), merge_patch(o.get(k).unwrap_or(&serde_json::Value::Null), v));
            }
            for k in o.keys().filter(|k| !n.contains_key(*k)) {
                patch.insert(k.clone(), serde_json::Value::Null);
            }
            serde_json::Value::Object(patch)
        }
        _ => new.clone(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    /// Applying the patch to `old` (RFC 7386) gives `new`: changed keys set, lost keys nulled.
    #[test]
    fn a_merge_patch_turns_old_into_new() {
        let old = json!({"currentMapping": {"web": {"remoteNamespace": "web-a", "phase": "Accepted"}, "api": {"phase": "Terminating"}}, "kept": 1});
        let new = json!({"currentMapping": {"web": {"remoteNamespace": "web-a", "phase": "Terminating"}}, "kept": 1});
        let patch = super::merge_patch(&old, &new);
        assert_eq!(patch, json!({"currentMapping": {"web": {"phase": "Terminating"}, "api": null}}));
        let mut applied = old.clone();
        json_patch::merge(&mut applied, &patch);
        assert_eq!(applied, new);
        assert_eq!(super::merge_patch(&json!(null), &json!({"a": {}})), json!({"a": {}}));
    }

    /// A finalizer is added after the others or removed from among them, at the read
    /// version; nothing is written when the object is already as wanted.
    #[test]
    fn a_finalizer_patch_keeps_the_others_and_the_version() {
        let meta = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            finalizers: Some(vec!["a".into(), "mine".into(), "b".into()]),
            resource_version: Some("42".into()),
            ..Default::default()
        };
        assert_eq!(super::finalizer_patch(&meta, "mine", true), None);
        assert_eq!(super::finalizer_patch(&meta, "mine", false), Some(json!({"metadata": {"finalizers": ["a", "b"], "resourceVersion": "42"}})));
        assert_eq!(super::finalizer_patch(&meta, "new", true), Some(json!({"metadata": {"finalizers": ["a", "mine", "b", "new"], "resourceVersion": "42"}})));
        assert_eq!(super::finalizer_patch(&meta, "new", false), None);
        let bare = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta::default();
        assert_eq!(super::finalizer_patch(&bare, "mine", true), Some(json!({"metadata": {"finalizers": ["mine"], "resourceVersion": null}})));
    }
}

//! When the emulated work agent reports a ManifestWork's availability and feedback, as
//! upstream's status controller does: on every change of the work, then again a jittered
//! status-sync interval later, and for a manifest whose config asks for
//! `feedbackScrapeType: Watch`, whenever its resource is added or updated (ocm
//! `pkg/work/spoke/controllers/statuscontroller/availablestatus_controller.go`: `sync`
//! requeues with `wait.Jitter(syncInterval, 0.9)`; `pkg/work/spoke/options.go`:
//! `--status-sync-interval` 10 s; `pkg/work/spoke/objectreader/reader.go`:
//! `RegisterInformer`, one informer per resource and namespace, at most
//! `--max-feedback-watch` 50, beyond which feedback is polled). A Poll-type manifest's
//! status (the default) is seen up to 19 s late, as on a real cluster.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, PartialObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::wake::Wake;

/// Upstream's `--status-sync-interval` default.
pub const STATUS_SYNC_INTERVAL: Duration = Duration::from_secs(10);
/// `wait.Jitter(syncInterval, 0.9)`: the next sync comes 1 to 1.9 intervals later.
const STATUS_SYNC_JITTER: f64 = 0.9;
/// Upstream's `--max-feedback-watch` default: informers beyond it are not started.
pub const MAX_FEEDBACK_WATCH: usize = 50;

/// A resource a manifest names: group, version, resource, namespace, name (the key of
/// upstream's `byWorkIndex`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceKey {
    pub group: String,
    pub version: String,
    pub resource: String,
    pub namespace: String,
    pub name: String,
}

impl ResourceKey {
    /// Its resource's API, in its namespace or cluster-scoped when it has none (as
    /// upstream's dynamic client reaches it).
    pub fn api<K>(&self, client: &kube::Client) -> Api<K>
    where
        K: kube::Resource<DynamicType = ApiResource, Scope = kube::core::DynamicResourceScope>,
    {
        let api_version = if self.group.is_empty() { self.version.clone() } else { format!("{}/{}", self.group, self.version) };
        let ar = ApiResource { group: self.group.clone(), version: self.version.clone(), api_version, kind: String::new(), plural: self.resource.clone() };
        if self.namespace.is_empty() { Api::all_with(client.clone(), &ar) } else { Api::namespaced_with(client.clone(), &self.namespace, &ar) }
    }

    /// Its informer's key: the resource and the namespace.
    fn informer(&self) -> InformerKey {
        (self.group.clone(), self.version.clone(), self.resource.clone(), self.namespace.clone())
    }
}

type InformerKey = (String, String, String, String);

/// Which works feed back from which watched resource (upstream's event handler
/// registrations), and which works a watch saw change since their last sync.
#[derive(Default)]
struct Registrations {
    works: BTreeMap<ResourceKey, BTreeSet<String>>,
    dirty: BTreeSet<String>,
}

/// One work agent's status clock and its feedback watches.
pub struct StatusSync {
    client: kube::Client,
    wake: Weak<Wake>,
    /// Per work name: the resourceVersion its last sync saw, and when the next is due (a
    /// work made again under the name has another resourceVersion, so it is synced).
    last: Mutex<HashMap<String, (String, Instant)>>,
    /// Upstream's informers, one per resource and namespace.
    informers: Mutex<HashMap<InformerKey, JoinHandle<()>>>,
    registrations: Arc<Mutex<Registrations>>,
}

impl Drop for StatusSync {
    fn drop(&mut self) {
        self.informers.lock().expect("informers lock").values().for_each(JoinHandle::abort);
    }
}

impl StatusSync {
    /// The clock of the agent acting on `client`'s cluster, whose passes `wake` starts.
    pub fn new(client: kube::Client, wake: &Arc<Wake>) -> Self {
        Self { client, wake: Arc::downgrade(wake), last: Mutex::default(), informers: Mutex::default(), registrations: Arc::default() }
    }

    /// Whether the work `name` (at `resource_version`) is due a status sync: it is new or
    /// changed since its last sync, its interval ran out, or a resource it watches was
    /// added or updated.
    pub fn due(&self, name: &str, resource_version: &str) -> bool {
        let watched = self.registrations.lock().expect("registrations lock").dirty.remove(name);
        let last = self.last.lock().expect("sync lock");
        match last.get(name) {
            None => true,
            Some((seen, next)) => watched || seen != resource_version || Instant::now() >= *next,
        }
    }

    /// A sync of the work `name` failed: it is due again on the next pass.
    pub fn again(&self, name: &str) {
        self.registrations.lock().expect("registrations lock").dirty.insert(name.to_owned());
    }

    /// Records a sync of the work `name` that saw `resource_version`, and asks for the next
    /// one `interval` later, jittered.
    pub fn synced(&self, name: &str, resource_version: &str, interval: Duration) {
        let next = crate::wake::jitter(interval, STATUS_SYNC_JITTER);
        self.last.lock().expect("sync lock").insert(name.to_owned(), (resource_version.to_owned(), Instant::now() + next));
        if let Some(wake) = self.wake.upgrade() {
            wake.after(next);
        }
    }

    /// Upstream's `RegisterInformer` (`watch`) or `UnRegisterInformer`: the work `work`
    /// feeds back from `key` by watch or by poll. An informer starts with its first
    /// registration (unless [`MAX_FEEDBACK_WATCH`] run: then the work polls) and stops
    /// with its last.
    pub fn register(&self, work: &str, key: &ResourceKey, watch: bool) {
        let mut regs = self.registrations.lock().expect("registrations lock");
        let mut informers = self.informers.lock().expect("informers lock");
        if watch {
            if !informers.contains_key(&key.informer()) {
                if informers.len() >= MAX_FEEDBACK_WATCH {
                    return;
                }
                informers.insert(key.informer(), self.informer(key));
            }
            regs.works.entry(key.clone()).or_default().insert(work.to_owned());
            return;
        }
        let Some(works) = regs.works.get_mut(key) else { return };
        works.remove(work);
        if works.is_empty() {
            regs.works.remove(key);
        }
        if !regs.works.keys().any(|k| k.informer() == key.informer())
            && let Some(informer) = informers.remove(&key.informer())
        {
            informer.abort();
        }
    }

    /// Forgets the works not in `names` (gone, or being deleted: upstream unregisters a
    /// deleted work's informers, `UnRegisterInformerFromAppliedManifestWork`).
    pub fn retain(&self, names: &BTreeSet<String>) {
        self.last.lock().expect("sync lock").retain(|name, _| names.contains(name));
        let stale: Vec<(String, ResourceKey)> = {
            let mut regs = self.registrations.lock().expect("registrations lock");
            regs.dirty.retain(|w| names.contains(w));
            regs.works.iter().flat_map(|(k, ws)| ws.iter().filter(|w| !names.contains(*w)).map(move |w| (w.clone(), k.clone()))).collect()
        };
        for (work, key) in stale {
            self.register(&work, &key, false);
        }
    }

    /// A watch of `key`'s resource in its namespace (metadata only) that marks the works
    /// registered for the object it sees added or updated, and wakes the agent.
    fn informer(&self, key: &ResourceKey) -> JoinHandle<()> {
        // Keyed by resource and namespace: the object's name is left out.
        let api: Api<PartialObjectMeta<DynamicObject>> = key.api(&self.client);
        let (regs, wake, informer) = (self.registrations.clone(), self.wake.clone(), key.clone());
        tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher::watcher(api, watcher::Config::default()).default_backoff());
            while let Some(event) = events.next().await {
                // Upstream's handler has AddFunc and UpdateFunc, no DeleteFunc.
                let Ok(Event::Apply(obj) | Event::InitApply(obj)) = event else { continue };
                let resource = ResourceKey { name: obj.metadata.name.unwrap_or_default(), ..informer.clone() };
                let marked = {
                    let mut regs = regs.lock().expect("registrations lock");
                    let works: Vec<String> = regs.works.get(&resource).into_iter().flatten().cloned().collect();
                    let any = !works.is_empty();
                    regs.dirty.extend(works);
                    any
                };
                match wake.upgrade() {
                    Some(w) if marked => w.poke(),
                    Some(_) => {}
                    None => return,
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(namespace: &str, name: &str) -> ResourceKey {
        ResourceKey { group: String::new(), version: "v1".into(), resource: "configmaps".into(), namespace: namespace.into(), name: name.into() }
    }

    /// An API server nobody answers on: the informers retry in the background.
    fn nowhere() -> kube::Client {
        kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().expect("a URL"))).expect("a client")
    }

    #[tokio::test]
    async fn a_work_is_synced_when_new_changed_failed_or_its_interval_ran_out() {
        let wake = Arc::new(Wake::default());
        let sync = StatusSync::new(nowhere(), &wake);
        assert!(sync.due("w", "1"), "a new work");
        sync.synced("w", "1", Duration::from_secs(3600));
        assert!(!sync.due("w", "1"), "nothing changed, the interval has not run out");
        assert!(sync.due("w", "2"), "the work changed");
        sync.again("w");
        assert!(sync.due("w", "1"), "its last sync failed");
        assert!(!sync.due("w", "1"), "a failure makes one more sync, not every pass");
        sync.synced("w", "1", Duration::ZERO);
        assert!(sync.due("w", "1"), "its interval ran out");
        sync.retain(&BTreeSet::new());
        assert!(sync.due("w", "1"), "a work forgotten is new again");
    }

    #[tokio::test]
    async fn an_informer_per_resource_and_namespace_lives_while_a_work_watches_through_it() {
        let wake = Arc::new(Wake::default());
        let sync = StatusSync::new(nowhere(), &wake);
        let informers = |s: &StatusSync| s.informers.lock().expect("informers lock").len();
        sync.register("a", &key("ns", "one"), true);
        sync.register("b", &key("ns", "two"), true);
        assert_eq!(informers(&sync), 1, "one informer for the resource in its namespace");
        sync.register("a", &key("ns", "one"), false);
        assert_eq!(informers(&sync), 1, "work b still watches through it");
        sync.register("b", &key("ns", "two"), false);
        assert_eq!(informers(&sync), 0, "stopped with its last registration");
        for i in 0..=MAX_FEEDBACK_WATCH {
            sync.register("a", &key(&format!("ns-{i}"), "one"), true);
        }
        assert_eq!(informers(&sync), MAX_FEEDBACK_WATCH, "beyond the limit a work polls");
        sync.retain(&BTreeSet::from(["b".to_owned()]));
        assert_eq!(informers(&sync), 0, "a gone work's watches stop");
    }
}

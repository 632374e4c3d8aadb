//! Shared watches with deadlines. One reflector per (cluster, kind, namespace) feeds a
//! store that every waiting task reads; a change wakes the waiters, which re-check their
//! condition. So 10,000 tasks waiting on clusters cost one watch per kind and cluster,
//! not one per task, and a wait ends at its deadline with the last reason it saw. While a
//! watch fails (a cluster that went away and came back), its waiters read the API server
//! themselves instead of trusting its stale store, and one failing for a minute is made
//! again with the next waiter's client (a cluster made again under its name). One that no
//! wait holds and that has failed for five minutes is closed (a cluster deleted elsewhere).

use std::any::{Any, TypeId};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_task::gauges::GaugeFamily;
use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// What a condition says of the current state.
#[derive(Debug, Clone, PartialEq)]
pub enum Check<T> {
    /// Met, with its result.
    Done(T),
    /// Not yet; why (kept for the timeout error).
    Pending(String),
    /// Never will be (e.g. a failed condition): stop waiting.
    Failed(String),
    /// Not yet (why), and look again after this long though the watch shows no change:
    /// a condition that turns with time alone, e.g. a failure tolerated for a grace period.
    Recheck(String, Duration),
}

/// Why a wait ended without its condition.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WaitError {
    /// The deadline passed.
    #[error("waited {waited:?} for {what} on cluster {cluster:?}; last seen: {last}")]
    Timeout {
        /// The cluster.
        cluster: String,
        /// What was awaited.
        what: String,
        /// How long.
        waited: Duration,
        /// The condition's last pending reason (or the watch's last error).
        last: String,
    },
    /// The condition said it cannot be met.
    #[error("{what} on cluster {cluster:?} failed: {reason}")]
    Failed {
        /// The cluster.
        cluster: String,
        /// What was awaited.
        what: String,
        /// Why.
        reason: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    cluster: String,
    kind: TypeId,
    namespace: Option<String>,
}

/// How a watch fares, as its stream reports it: shared by the watch's task, its waiters
/// and the registry (which replaces a watch that has failed too long). None once an
/// attempt went well.
#[derive(Default)]
struct Health(Mutex<Option<Failure>>);

/// A watch's current failure.
struct Failure {
    /// Its last attempt's error.
    error: String,
    /// Since when it has been failing without a good attempt in between.
    since: tokio::time::Instant,
    /// The last error said the cluster does not serve the kind (its CRD not installed):
    /// reading its scope would be refused the same way, so waits do not try.
    not_served: bool,
}

impl Health {
    fn ok(&self) {
        *self.0.lock().expect("health lock") = None;
    }

    fn failed(&self, err: &watcher::Error) {
        let not_served = matches!(err, watcher::Error::InitialListFailed(kube::Error::Api(a)) if a.code == 404);
        let mut f = self.0.lock().expect("health lock");
        let since = f.as_ref().map_or_else(tokio::time::Instant::now, |f| f.since);
        *f = Some(Failure { error: format!("watch error: {}", crate::said::watch_said(err)), since, not_served });
    }

    /// Its last error, unless the kind is not served (then there is nothing to read).
    fn failing(&self) -> Option<String> {
        self.0.lock().expect("health lock").as_ref().filter(|f| !f.not_served).map(|f| f.error.clone())
    }

    fn last_error(&self) -> Option<String> {
        self.0.lock().expect("health lock").as_ref().map(|f| f.error.clone())
    }

    /// Failing (a served kind) for at least `bound`.
    fn failing_for(&self, bound: Duration) -> bool {
        self.0.lock().expect("health lock").as_ref().is_some_and(|f| !f.not_served && f.since.elapsed() >= bound)
    }

    /// Failing, whatever the error (a kind not served too), for at least `bound`.
    fn down_for(&self, bound: Duration) -> bool {
        self.0.lock().expect("health lock").as_ref().is_some_and(|f| f.since.elapsed() >= bound)
    }
}

struct Shared<K: Resource<DynamicType = ()> + 'static> {
    store: Store<K>,
    changed: Arc<Notify>,
    health: Arc<Health>,
    /// The last read of the watch's scope from the API server while it failed (running or
    /// done), and when it began: one read per [`POLL_WHILE_FAILING`] serves every waiter.
    read: Mutex<Option<(tokio::time::Instant, Read<K>)>>,
    task: JoinHandle<()>,
}

/// A read of a watch's scope from the API server (or why it failed), driven by whichever
/// of its waiters polls it: a waiter that stops polling (a cancelled step, a dropped
/// future) does not hold it up for the others.
type Read<K> = futures::future::Shared<futures::future::BoxFuture<'static, Result<Store<K>, String>>>;

impl<K> Shared<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + 'static,
{
    /// What the watch's scope holds on the API server now, by a quorum list (the watch's
    /// own `list` right) through `api` (the waiter's client: a cluster made again under
    /// its name, at another address or with another CA, is read where it is now), made
    /// into a store as the watch's would be. A read younger than [`POLL_WHILE_FAILING`] is
    /// shared: however many tasks wait on a failing watch, its cluster gets one LIST per
    /// interval, not one per waiter (a cluster that has just come back is not stormed).
    ///
    /// A waiter joins a read another began only while it is younger than
    /// [`POLL_WHILE_FAILING`]; one still unanswered then (its client's address gone dark)
    /// is left to its own waiters and this one reads with its own client.
    async fn read_while_failing(&self, api: &Api<DynamicObject>) -> Result<Store<K>, String>
    where
        K: Send + Sync,
    {
        loop {
            let (began, read, joined) = {
                let mut slot = self.read.lock().expect("read lock");
                match slot.as_ref().filter(|(began, _)| began.elapsed() < POLL_WHILE_FAILING) {
                    Some((began, read)) => (*began, read.clone(), true),
                    None => {
                        let api = api.clone();
                        let read = futures::FutureExt::shared(futures::FutureExt::boxed(async move { list_into_store::<K>(&api).await }));
                        let began = tokio::time::Instant::now();
                        *slot = Some((began, read.clone()));
                        (began, read, false)
                    }
                }
            };
            if !joined {
                return read.await;
            }
            if let Ok(r) = tokio::time::timeout_at(began + POLL_WHILE_FAILING, read).await {
                return r;
            }
        }
    }
}

/// Every object of `api`'s scope, read by a quorum list, in a store as a watch makes one.
async fn list_into_store<K>(api: &Api<DynamicObject>) -> Result<Store<K>, String>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + 'static,
{
    let failed = |e: &dyn std::fmt::Display| format!("could not list {} from the API server: {e}", K::kind(&()));
    let listed = api.list(&ListParams::default()).await.map_err(|e| failed(&crate::said::said(&e)))?;
    let (store, mut writer) = reflector::store::<K>();
    writer.apply_watcher_event(&watcher::Event::Init);
    for o in listed.items {
        let o = serde_json::to_value(o).and_then(serde_json::from_value::<K>).map_err(|e| failed(&e))?;
        writer.apply_watcher_event(&watcher::Event::InitApply(o));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    Ok(store)
}

impl<K: Resource<DynamicType = ()>> Drop for Shared<K> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A watch in the registry: its [`Shared`] (of its kind, erased) and its health.
type Open = (Arc<dyn Any + Send + Sync>, Arc<Health>);

/// The registry of shared watches of one worker process.
pub struct Watches {
    open: Mutex<HashMap<Key, Open>>,
    /// How long a watch may fail before the next wait starts it afresh ([`REPLACE_AFTER`]).
    replace_after: Duration,
    /// How long a watch no wait holds may fail before the next wait closes it
    /// ([`CLOSE_UNUSED_AFTER`]).
    close_unused_after: Duration,
}

impl Default for Watches {
    fn default() -> Self {
        Self { open: Mutex::default(), replace_after: REPLACE_AFTER, close_unused_after: CLOSE_UNUSED_AFTER }
    }
}

/// How long a watch may fail (a served kind) before the next wait on it starts a new one
/// with that wait's client. kube's watcher keeps the client it was made with and backs off
/// to 30 s: a cluster made again under its name (another address or CA, a new kubeconfig
/// Secret) would leave the old watch failing for good, and one back from a long outage
/// waits out the backoff. Twice the longest backoff.
pub const REPLACE_AFTER: Duration = Duration::from_secs(60);

/// How long a watch that no wait holds may fail before the next wait on any watch of the
/// registry closes it. A cluster deleted by another worker (which [`Watches::forget`]s only
/// its own watches) left this worker's watches of it retrying every 30 s for the process's
/// life, and a watch of a kind the cluster does not serve the same. A wait that comes for
/// it later makes it again. Healthy watches stay open, waited on or not: their stores are
/// what the next wait reads.
pub const CLOSE_UNUSED_AFTER: Duration = Duration::from_secs(300);

/// Name of the gauge of failing watches by cluster, without the `ferry_` prefix
/// ([`Watches::gauges`]).
pub const WATCHES_FAILING: &str = "cluster_watches_failing";

impl Debug for Watches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watches").field("open", &self.open_count()).finish()
    }
}

impl Watches {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty registry whose failing watches are started afresh after `bound` (tests).
    pub fn replacing_after(bound: Duration) -> Self {
        Self { replace_after: bound, ..Self::default() }
    }

    /// An empty registry that closes a watch no wait holds once it has failed for `bound`
    /// (tests; [`CLOSE_UNUSED_AFTER`]).
    pub fn closing_unused_after(bound: Duration) -> Self {
        Self { close_unused_after: bound, ..Self::default() }
    }

    /// How many of `cluster`'s watches are failing now (a served kind; their waiters read
    /// the API server themselves meanwhile).
    pub fn failing(&self, cluster: &str) -> usize {
        self.open.lock().expect("watches lock").iter().filter(|(k, (_, h))| k.cluster == cluster && h.failing().is_some()).count()
    }

    /// The gauge `ferry_cluster_watches_failing{cluster}` ([`WATCHES_FAILING`]): for each
    /// cluster with an open watch, how many of its watches are failing ([`Self::failing`])
    /// while a wait uses them (0 included, so an alert sees the cluster come back). A watch
    /// nobody waits on is not counted: a cluster deleted since (by another worker, which
    /// [`Self::forget`]s only its own watches) leaves this worker's watches of it failing,
    /// and no task is held by them (a later wait closes them, [`CLOSE_UNUSED_AFTER`]). A
    /// handler that waits on clusters reports it
    /// ([`TaskHandler::gauges`](ferry_task::TaskHandler::gauges)).
    pub fn gauges(&self) -> Vec<GaugeFamily> {
        let mut by_cluster: BTreeMap<String, i64> = BTreeMap::new();
        for (k, (shared, h)) in self.open.lock().expect("watches lock").iter() {
            // One reference is the registry's; each wait on the watch holds another.
            let waited_on = Arc::strong_count(shared) > 1;
            *by_cluster.entry(k.cluster.clone()).or_default() += i64::from(waited_on && h.failing().is_some());
        }
        let samples = by_cluster.into_iter().map(|(cluster, n)| (vec![("cluster", cluster)], n)).collect();
        vec![GaugeFamily {
            name: WATCHES_FAILING,
            help: "Watches of a cluster that tasks wait on whose last attempt failed (a served kind): its API server does not answer them, and the waits read the API server directly meanwhile",
            samples,
        }]
    }

    /// How many watches are open (one per cluster, kind and namespace ever waited on).
    pub fn open_count(&self) -> usize {
        self.open.lock().expect("watches lock").len()
    }

    /// Closes every watch of `cluster` (e.g. once it is deleted).
    pub fn forget(&self, cluster: &str) {
        self.open.lock().expect("watches lock").retain(|k, _| k.cluster != cluster);
    }

    fn shared<K>(&self, cluster: &str, client: &Client, namespace: Option<&str>) -> Arc<Shared<K>>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        let key = Key { cluster: cluster.to_owned(), kind: TypeId::of::<K>(), namespace: namespace.map(str::to_owned) };
        let mut open = self.open.lock().expect("watches lock");
        // The registry holds one reference; each wait on the watch holds another.
        open.retain(|_, (a, health)| Arc::strong_count(a) > 1 || !health.down_for(self.close_unused_after));
        // A watch failing for long is left to its current waiters and replaced by one made
        // with this waiter's client ([`REPLACE_AFTER`]).
        if let Some((a, health)) = open.get(&key)
            && !health.failing_for(self.replace_after)
            && let Ok(s) = a.clone().downcast::<Shared<K>>()
        {
            return s;
        }
        let events = match namespace {
            // Through the namespace's own URL, so that a Role in that namespace is all the
            // watch needs (a field selector over every namespace is, to RBAC, a list at the
            // cluster scope). Any kind, whatever its scope type: watched untyped, then read
            // as `K`.
            Some(_) => watcher(untyped::<K>(client, namespace), watcher::Config::default()).map(|r| r.and_then(typed::<K>)).boxed(),
            None => watcher(Api::<K>::all(client.clone()), watcher::Config::default()).boxed(),
        };
        let (store, writer) = reflector::store();
        let changed = Arc::new(Notify::new());
        let health = Arc::new(Health::default());
        let (n, h) = (changed.clone(), health.clone());
        let task = tokio::spawn(async move {
            // The backoff goes after the reflector and past the `Init` events: kube's
            // `StreamBackoff` starts over on any Ok item (kube-runtime 5.0.0
            // `utils/stream_backoff.rs`), and the watcher yields `Init` before each list
            // attempt, so a kind the cluster does not serve (its CRD not installed) was
            // listed again every 0.8 s, never backed off to 30 s as client-go's reflector
            // does. The reflector itself still sees `Init` (it starts its new buffer).
            let stream = reflector::reflector(writer, events).filter(|ev| std::future::ready(!matches!(ev, Ok(watcher::Event::Init)))).default_backoff();
            futures::pin_mut!(stream);
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(_) => h.ok(),
                    Err(err) => h.failed(&err),
                }
                n.notify_waiters();
            }
        });
        let shared = Arc::new(Shared { store, changed, health: health.clone(), read: Mutex::new(None), task });
        open.insert(key, (shared.clone(), health));
        shared
    }

    /// Waits until `check` of the store of `K` on `cluster` (in `namespace`, or all) is
    /// [`Check::Done`], failing at [`Check::Failed`] or after `timeout`. The store can lag
    /// the API server: a condition over the whole store (a count, any of) is decided on
    /// what the watch has seen; [`Watches::wait_object`] confirms its object first. While
    /// the watch is failing, the wait lists the scope itself instead and decides on that
    /// (see [`Watches::wait_object`]).
    pub async fn wait_store<K, T>(
        &self,
        cluster: &str,
        client: &Client,
        namespace: Option<&str>,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut(&Store<K>) -> Check<T>,
    ) -> Result<T, WaitError>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        let shared = self.shared::<K>(cluster, client, namespace);
        wait_on(&shared, cluster, what, timeout, untyped::<K>(client, namespace), None, |s: &Store<K>| (check(s), None)).await
    }

    /// Waits until `check` of object `name` (None while it does not exist) is done.
    ///
    /// A watch's cache can lag the API server, e.g. still hold the object a task has just
    /// deleted and re-created. So a decision (done or failed) stands only when the object
    /// the watch shows is the one the API server has now: the same uid and resourceVersion
    /// (compared for equality only, as the API conventions allow), or absent from both, read
    /// by a quorum list of that one name (the watch's own `list` permission). Otherwise the
    /// wait goes on until the watch catches up.
    ///
    /// While the watch is failing (its last attempt ended in an error: the cluster was
    /// unreachable, or came back with a new watch cache that no longer has the watch's
    /// resourceVersion), its cache may stay stale for as long as its backoff (up to 30 s)
    /// and a relist take: the wait then reads the watch's scope itself instead, by a quorum
    /// list shared with the watch's other waiters, every [`POLL_WHILE_FAILING`], and
    /// decides on what the API server has, never on the store. Not for a kind the cluster
    /// does not serve (the list would be refused alike).
    pub async fn wait_object<K, T>(
        &self,
        cluster: &str,
        client: &Client,
        namespace: Option<&str>,
        name: &str,
        timeout: Duration,
        mut check: impl FnMut(Option<&K>) -> Check<T>,
    ) -> Result<T, WaitError>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        let kind = K::kind(&());
        let what = match namespace {
            Some(ns) => format!("{kind} {ns}/{name}"),
            None => format!("{kind} {name}"),
        };
        let mut r = ObjectRef::<K>::new(name);
        if let Some(ns) = namespace {
            r = r.within(ns);
        }
        let shared = self.shared::<K>(cluster, client, namespace);
        let confirm = Confirm { api: untyped::<K>(client, namespace), name, what: &what };
        wait_on(&shared, cluster, &what, timeout, untyped::<K>(client, namespace), Some(confirm), |s: &Store<K>| {
            let seen = s.get(&r);
            (check(seen.as_deref()), seen.as_deref().map(version))
        })
        .await
    }

    /// Waits until object `name` is gone.
    pub async fn wait_deleted<K>(&self, cluster: &str, client: &Client, namespace: Option<&str>, name: &str, timeout: Duration) -> Result<(), WaitError>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        self.wait_object::<K, ()>(cluster, client, namespace, name, timeout, |o| match o {
            None => Check::Done(()),
            Some(o) => Check::Pending(match o.meta().deletion_timestamp {
                Some(_) => format!("being deleted (finalizers: {})", o.meta().finalizers.clone().unwrap_or_default().join(", ")),
                None => "still exists".to_owned(),
            }),
        })
        .await
    }

    /// Waits until namespace `name` is gone; while it terminates, the reason of a timeout is
    /// what the namespace controller says is left in it ([`crate::kinds::namespace_terminating`]).
    pub async fn wait_namespace_deleted(&self, cluster: &str, client: &Client, name: &str, timeout: Duration) -> Result<(), WaitError> {
        self.wait_object::<k8s_openapi::api::core::v1::Namespace, ()>(cluster, client, None, name, timeout, |o| match o {
            None => Check::Done(()),
            Some(ns) => Check::Pending(crate::kinds::namespace_terminating(ns)),
        })
        .await
    }
}

/// An object's identity and version (uid, resourceVersion); None: there is none.
type Version = Option<(Option<String>, Option<String>)>;

/// How a wait on one object confirms a decision with the API server.
struct Confirm<'a> {
    api: Api<DynamicObject>,
    name: &'a str,
    what: &'a str,
}

impl Confirm<'_> {
    /// Whether the API server has now the object the watch showed (`seen`); Err: why not
    /// known, and whether to ask again soon (the API server did not answer) rather than
    /// at the watch's next change (it is behind).
    async fn stands(&self, seen: &Version) -> Result<(), (String, bool)> {
        match current_version(&self.api, self.name).await {
            Ok(now) if now == *seen => Ok(()),
            Ok(_) => Err((format!("the watch has not caught up with the API server's {} yet", self.what), false)),
            Err(e) => Err((format!("could not read {} to confirm the watch: {}", self.what, crate::said::said(&e)), true)),
        }
    }
}

/// How soon a wait asks the API server again after it could not confirm a decision.
const RECONFIRM: Duration = Duration::from_secs(1);

/// How often a wait reads what it waits on itself while its watch is failing.
pub const POLL_WHILE_FAILING: Duration = Duration::from_secs(5);

/// The wait loop of every shared watch: look whenever the watch changes (and when a
/// [`Check::Recheck`] asked to), until `look` says done or failed (confirmed, for one
/// object, by the API server) or the deadline.
async fn wait_on<K, T>(
    shared: &Shared<K>,
    cluster: &str,
    what: &str,
    timeout: Duration,
    scope: Api<DynamicObject>,
    confirm: Option<Confirm<'_>>,
    mut look: impl FnMut(&Store<K>) -> (Check<T>, Version),
) -> Result<T, WaitError>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Send + Sync + 'static,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last = "the watch has not listed yet".to_owned();
    loop {
        // Register before checking, so a change between the check and the await wakes us.
        let notified = shared.changed.notified();
        futures::pin_mut!(notified);
        notified.as_mut().enable();
        let mut until = deadline;
        let failing = shared.health.failing();
        if let Some(e) = failing {
            // The watch is failing: its store may be stale (a cluster that went away and
            // came back, or was made again under its name) until its backoff ends and it
            // lists again. Decide on what the API server has now, never on the store.
            match tokio::time::timeout_at(deadline, shared.read_while_failing(&scope)).await {
                Ok(Ok(fresh)) => match look(&fresh).0 {
                    Check::Done(t) => return Ok(t),
                    Check::Failed(reason) => return Err(WaitError::Failed { cluster: cluster.to_owned(), what: what.to_owned(), reason }),
                    Check::Pending(why) | Check::Recheck(why, _) => last = format!("{why} (read from the API server: the {e})"),
                },
                Ok(Err(why)) => last = format!("{why} (the {e})"),
                Err(_) => last = format!("the API server did not answer a list of {} before the deadline (the {e})", scope.resource_url()),
            }
            until = deadline.min(tokio::time::Instant::now() + POLL_WHILE_FAILING);
        } else if shared.store.wait_until_ready().now_or_never_ready() {
            let (check, seen) = look(&shared.store);
            let stands = match (&check, &confirm) {
                (Check::Pending(_) | Check::Recheck(..), _) | (_, None) => Ok(()),
                (_, Some(c)) => c.stands(&seen).await,
            };
            match (check, stands) {
                (Check::Pending(why), _) => last = why,
                (Check::Recheck(why, after), _) => {
                    last = why;
                    until = deadline.min(tokio::time::Instant::now() + after);
                }
                (_, Err((why, soon))) => {
                    last = why;
                    if soon {
                        until = deadline.min(tokio::time::Instant::now() + RECONFIRM);
                    }
                }
                (Check::Done(t), Ok(())) => return Ok(t),
                (Check::Failed(reason), Ok(())) => {
                    return Err(WaitError::Failed { cluster: cluster.to_owned(), what: what.to_owned(), reason });
                }
            }
        } else if let Some(e) = shared.health.last_error() {
            // A kind the cluster does not serve: the watch backs off; nothing to read.
            last = e;
        }
        if tokio::time::timeout_at(until, notified).await.is_err() && until == deadline {
            if let Some(e) = shared.health.last_error().filter(|e| !last.contains(e.as_str())) {
                last = format!("{last} ({e})");
            }
            return Err(WaitError::Timeout { cluster: cluster.to_owned(), what: what.to_owned(), waited: timeout, last });
        }
    }
}

/// An object's identity and version: its uid and resourceVersion.
fn version<K: Resource>(o: &K) -> (Option<String>, Option<String>) {
    (o.meta().uid.clone(), o.meta().resource_version.clone())
}

/// The identity and version the API server has now of object `name` in `api`'s scope
/// (None: there is none): a quorum list of that one name, metadata only.
async fn current_version(api: &Api<DynamicObject>, name: &str) -> Result<Version, kube::Error> {
    let listed = api.list_metadata(&ListParams::default().fields(&format!("metadata.name={name}"))).await?;
    Ok(listed.items.first().map(version))
}

/// `Store::wait_until_ready` as a non-blocking test.
trait NowOrNever {
    fn now_or_never_ready(self) -> bool;
}

impl<F: std::future::Future> NowOrNever for F {
    fn now_or_never_ready(self) -> bool {
        futures::FutureExt::now_or_never(self).is_some()
    }
}

/// `K`'s objects untyped, in `namespace` through its own URL (so a Role there suffices),
/// or cluster-wide: what a shared watch lists and watches, and a wait's confirmation lists.
fn untyped<K: Resource<DynamicType = ()>>(client: &Client, namespace: Option<&str>) -> Api<DynamicObject> {
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ApiResource::erase::<K>(&())),
        None => Api::all_with(client.clone(), &ApiResource::erase::<K>(&())),
    }
}

/// A watch event of an untyped object as one of `K` (the same JSON).
fn typed<K: DeserializeOwned>(ev: watcher::Event<DynamicObject>) -> Result<watcher::Event<K>, watcher::Error> {
    let read = |o: DynamicObject| {
        serde_json::to_value(o).and_then(serde_json::from_value::<K>).map_err(|e| watcher::Error::WatchFailed(kube::Error::SerdeError(e)))
    };
    Ok(match ev {
        watcher::Event::Apply(o) => watcher::Event::Apply(read(o)?),
        watcher::Event::Delete(o) => watcher::Event::Delete(read(o)?),
        watcher::Event::InitApply(o) => watcher::Event::InitApply(read(o)?),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitDone => watcher::Event::InitDone,
    })
}

//! When an emulated controller's pass runs: as soon as an object of a kind it reads
//! changes (a metadata watch per kind, as upstream's informers trigger reconciles), at a
//! time a pass asked for (a delay running out), or after a quiet fallback period (what
//! only time changes and no pass asked for: lease expiry). Before, every loop re-listed its
//! kinds every 200-250 ms: an idle fleet answered ~110 requests/s per API server
//! (docs/BENCHMARKS.md, session 32).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, PartialObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, watcher};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The shortest time between two passes: a pass's own writes wake it again, and a loop
/// whose writes always change something must not spin (the fixed ticks were 200-250 ms).
pub const MIN_GAP: Duration = Duration::from_millis(100);
/// The longest a loop sleeps with nothing changed and nothing asked for (unless it says
/// otherwise, [`Wake::with_fallback`]).
pub const FALLBACK: Duration = Duration::from_secs(1);
/// How soon a failed pass is tried again.
pub const RETRY: Duration = Duration::from_millis(250);

/// Upstream's `wait.Jitter(d, max_factor)` (k8s.io/apimachinery `pkg/util/wait`): `d` plus a
/// random part of up to `max_factor` times it.
pub fn jitter(d: Duration, max_factor: f64) -> Duration {
    d.mul_f64(1.0 + jitter_factor(max_factor))
}

/// The random part [`jitter`] adds, as a fraction of its `d` (0 to `max_factor`), for a
/// clock that keeps it and applies it to an interval that may change meanwhile.
pub fn jitter_factor(max_factor: f64) -> f64 {
    max_factor * rand::random::<f64>()
}

/// Wakes one controller loop; its watches stop when it is dropped.
pub struct Wake {
    changed: Arc<Notify>,
    /// The earliest time a pass asked to run again ([`Wake::after`]).
    due: Mutex<Option<Instant>>,
    /// When the last pass started.
    last: Mutex<Option<Instant>>,
    watches: Vec<JoinHandle<()>>,
    /// The longest sleep with nothing changed and nothing asked for.
    fallback: Duration,
}

impl Default for Wake {
    fn default() -> Self {
        Self::with_fallback(FALLBACK)
    }
}

impl std::fmt::Debug for Wake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wake").field("watches", &self.watches.len()).finish_non_exhaustive()
    }
}

impl Drop for Wake {
    fn drop(&mut self) {
        for w in &self.watches {
            w.abort();
        }
    }
}

impl Wake {
    /// A loop that sleeps at most `fallback` with nothing changed and nothing asked for:
    /// longer than [`FALLBACK`] for a loop that watches every kind it reads and asks for
    /// the times it waits for ([`Wake::after`]).
    pub fn with_fallback(fallback: Duration) -> Self {
        Self { changed: Arc::default(), due: Mutex::default(), last: Mutex::default(), watches: Vec::new(), fallback }
    }

    /// Wakes on every change of an `ar` object in `client`'s cluster (all namespaces). A
    /// kind not served yet (its CRD comes later) is retried with the watcher's backoff.
    pub fn watch(&mut self, client: &kube::Client, ar: &ApiResource) {
        self.watch_then(client, ar, || {});
    }

    /// As [`Wake::watch`], calling `seen` on every change before it wakes the loop (a
    /// cache of what the loop wrote that such a change makes stale).
    pub fn watch_then(&mut self, client: &kube::Client, ar: &ApiResource, seen: impl Fn() + Send + 'static) {
        self.watch_with(client, ar, move |_| seen());
    }

    /// As [`Wake::watch`], calling `gone` with each deleted object's metadata before it
    /// wakes the loop, and with None at the end of a relist (anything may have gone while
    /// the watch was down): a cache of what the loop applied forgets what is no longer
    /// there, as upstream's appliers compare against their informers.
    pub fn watch_deletes(&mut self, client: &kube::Client, ar: &ApiResource, gone: impl Fn(Option<&kube::api::ObjectMeta>) + Send + 'static) {
        self.watch_with(client, ar, move |e| match e {
            watcher::Event::Delete(o) => gone(Some(&o.metadata)),
            watcher::Event::InitDone => gone(None),
            _ => {}
        });
    }

    /// The one watch loop: each event that wakes the loop goes to `seen` first.
    fn watch_with(&mut self, client: &kube::Client, ar: &ApiResource, seen: impl Fn(&watcher::Event<PartialObjectMeta<DynamicObject>>) + Send + 'static) {
        let api: Api<PartialObjectMeta<DynamicObject>> = Api::all_with(client.clone(), ar);
        let changed = self.changed.clone();
        self.watches.push(tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
            while let Some(e) = events.next().await {
                // A change, or the end of a (re)list, which stands for whatever changed
                // while the watch was down. Not `Init`: it opens every list attempt, also
                // each failing one of a kind not served yet (retried on the backoff), which
                // woke a loop watching such a kind several times a second; nor each
                // object of a list (`InitApply`): `InitDone` follows them.
                if let Ok(e @ (watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone)) = e {
                    seen(&e);
                    changed.notify_one();
                }
            }
        }));
    }

    /// Asks for a pass now: something the loop reads changed outside the API (a knob).
    pub fn poke(&self) {
        self.changed.notify_one();
    }

    /// Asks for a pass within `d` (the earliest of all asks since the last pass wins).
    pub fn after(&self, d: Duration) {
        let at = Instant::now() + d;
        let mut due = self.due.lock().expect("wake lock");
        if due.is_none_or(|t| at < t) {
            *due = Some(at);
        }
    }

    /// Asks for a pass when the wall clock reaches `t` (an object's timestamp plus a period:
    /// a lease's expiry, a toleration's end); a time already past asks for one now.
    pub fn at(&self, t: k8s_openapi::jiff::Timestamp) {
        self.after(Duration::try_from(t.duration_since(k8s_openapi::jiff::Timestamp::now())).unwrap_or_default());
    }

    /// Whether `elapsed` is still short of `delay` (a pass waiting out a delay); if so,
    /// asks for a pass when the delay runs out.
    pub fn waiting(&self, delay: Duration, elapsed: Duration) -> bool {
        match delay.checked_sub(elapsed).filter(|left| !left.is_zero()) {
            Some(left) => {
                self.after(left);
                true
            }
            None => false,
        }
    }

    /// Waits until the next pass may run (the first at once): a change, the time asked
    /// for, or the fallback; never sooner than [`MIN_GAP`] after the previous pass started.
    pub async fn next(&self) {
        let last = *self.last.lock().expect("wake lock");
        if let Some(last) = last {
            let due = self.due.lock().expect("wake lock").take();
            let until = due.map_or(last + self.fallback, |t| t.min(last + self.fallback));
            tokio::select! {
                () = self.changed.notified() => {}
                () = tokio::time::sleep_until(until) => {}
            }
            tokio::time::sleep_until(last + MIN_GAP).await;
        }
        *self.last.lock().expect("wake lock") = Some(Instant::now());
    }
}

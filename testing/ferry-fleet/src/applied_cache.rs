//! What an emulated controller applied and has not seen change since: upstream's appliers
//! compare each object with their informers' caches and write only what differs; an
//! emulated loop skips an object whose content it applied last, until a watched change
//! forgets it (or, with a resync, until the entry is that old).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Applied objects by key (the caller's: kind, namespace, name), each with the content
/// written and when.
#[derive(Debug, Default)]
pub struct AppliedCache {
    inner: Mutex<Inner>,
    /// Entries older than this are written again (upstream's resource cache's resync);
    /// None: only a forget makes them stale.
    resync: Option<Duration>,
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<String, (String, Instant)>,
    /// Keys being written, each with whether a forget matched it meanwhile: such a write
    /// is not remembered (the object may have changed after the write, and the watch's
    /// news of it came before the insert). Only a forget of that key counts: a forget of
    /// others (a watch's every delete) would otherwise make a busy loop write everything
    /// on every pass.
    writing: HashMap<String, bool>,
}

impl AppliedCache {
    /// A cache whose entries stay fresh for `resync` (None: until forgotten).
    pub fn new(resync: Option<Duration>) -> Self {
        Self { inner: Mutex::default(), resync }
    }

    /// Runs `write` unless `content` is what was applied under `key` (within the resync)
    /// and nothing forgot it since; remembers it when the write succeeded and no forget
    /// came while it was under way.
    pub async fn apply<E>(&self, key: String, content: String, write: impl Future<Output = Result<(), E>>) -> Result<(), E> {
        {
            let mut inner = self.inner.lock().expect("applied cache lock");
            let fresh = |at: &Instant| self.resync.is_none_or(|r| at.elapsed() < r);
            if inner.entries.get(&key).is_some_and(|(c, at)| *c == content && fresh(at)) {
                return Ok(());
            }
            inner.writing.insert(key.clone(), false);
        }
        let written = write.await;
        let mut inner = self.inner.lock().expect("applied cache lock");
        let forgotten = inner.writing.remove(&key).unwrap_or(true);
        written?;
        if !forgotten {
            inner.entries.insert(key, (content, Instant::now()));
        }
        Ok(())
    }

    /// Forgets every entry whose key `stale` holds true for: those objects are written
    /// again on the next pass.
    pub fn forget(&self, stale: impl Fn(&str) -> bool) {
        let mut inner = self.inner.lock().expect("applied cache lock");
        inner.entries.retain(|k, _| !stale(k));
        for (k, forgotten) in &mut inner.writing {
            *forgotten |= stale(k);
        }
    }

    /// Forgets everything.
    pub fn forget_all(&self) {
        self.forget(|_| true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn apply(cache: &AppliedCache, key: &str, content: &str, writes: &mut u32) {
        cache.apply(key.to_owned(), content.to_owned(), async { *writes += 1; Ok::<_, ()>(()) }).await.unwrap();
    }

    #[tokio::test]
    async fn the_same_content_is_written_once_until_forgotten() {
        let cache = AppliedCache::new(None);
        let mut writes = 0;
        apply(&cache, "a", "1", &mut writes).await;
        apply(&cache, "a", "1", &mut writes).await;
        assert_eq!(writes, 1);
        apply(&cache, "a", "2", &mut writes).await;
        assert_eq!(writes, 2, "new content is written");
        cache.forget(|k| k == "b");
        apply(&cache, "a", "2", &mut writes).await;
        assert_eq!(writes, 2, "forgetting another key keeps this one");
        cache.forget_all();
        apply(&cache, "a", "2", &mut writes).await;
        assert_eq!(writes, 3);
    }

    #[tokio::test]
    async fn a_forget_of_the_key_during_its_write_leaves_it_unremembered() {
        let cache = AppliedCache::new(None);
        cache.apply("a".into(), "1".into(), async { cache.forget(|k| k == "a"); Ok::<_, ()>(()) }).await.unwrap();
        let mut writes = 0;
        apply(&cache, "a", "1", &mut writes).await;
        assert_eq!(writes, 1, "the change seen mid-write must not be covered by the entry");
        cache.apply("b".into(), "1".into(), async { cache.forget(|k| k == "a"); Ok::<_, ()>(()) }).await.unwrap();
        apply(&cache, "b", "1", &mut writes).await;
        assert_eq!(writes, 1, "a forget of another key leaves this write remembered");
    }

    #[tokio::test]
    async fn a_failed_write_is_not_remembered_and_entries_age_out() {
        let cache = AppliedCache::new(Some(Duration::ZERO));
        assert!(cache.apply("a".into(), "1".into(), async { Err(()) }).await.is_err());
        let mut writes = 0;
        apply(&cache, "a", "1", &mut writes).await;
        apply(&cache, "a", "1", &mut writes).await;
        assert_eq!(writes, 2, "with a zero resync every pass writes");
    }
}

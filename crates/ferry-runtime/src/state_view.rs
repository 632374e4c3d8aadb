//! The task-state table: a consumer that reads the compacted task-state topic from the
//! beginning into memory, and can tell when it has caught up with the topic's end.
//! Workers rebuild their view from it on start and on partition assignment; the local
//! publisher hands it each snapshot the broker acknowledged (never one still in flight:
//! a write that fails must not be taken for the task's state). It also
//! guards the tasks this worker runs: another writer's newer snapshot of one falls its
//! runner's fence ([`StateView::guard`]).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Message, Offset, TopicPartitionList};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::ids::TaskId;
use crate::kafka::KafkaConfig;
use crate::kind::TaskKind;
use crate::protocol::TaskSnapshot;
use crate::wire::Registry;

/// Why the view could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    /// The consumer could not be created or assigned.
    #[error("task-state reader for {topic}: {source}")]
    Consumer {
        /// The topic.
        topic: String,
        /// Cause.
        #[source]
        source: KafkaError,
    },
    /// The topic's end was not reached in time.
    #[error("task-state topic {topic} not caught up within {waited:?} (is the broker reachable?)")]
    CatchUpTimeout {
        /// The topic.
        topic: String,
        /// How long we waited.
        waited: Duration,
    },
}

#[derive(Default)]
struct Table {
    tasks: HashMap<TaskId, TaskSnapshot>,
    keys: HashMap<String, TaskId>,
    positions: HashMap<i32, i64>,
    undecodable: u64,
    /// The seq of each task's last snapshot written by this process: read back from the
    /// topic it is not decoded again (a worker reads every snapshot it writes).
    own: HashMap<TaskId, i64>,
    /// The tasks this worker runs, by run.
    guards: HashMap<TaskId, Guard>,
    /// Tasks whose last record on the topic is older than their newest snapshot (a former
    /// owner's write that was on the wire when it lost the partition, landing after the new
    /// owner's): compaction keeps a key's last record, so the owner writes the newest again
    /// ([`StateView::stale_last`]).
    stale_last: HashSet<TaskId>,
    /// The highest seq of each task read from the topic: a record below it makes the
    /// task's last record stale. Not the view's newest, which holds this process's own
    /// writes before they land (the record read just before one of them is not stale).
    landed: HashMap<TaskId, i64>,
    /// Tasks whose newest snapshot, read from the topic since the owner last asked, is
    /// unsettled ([`StateView::take_unsettled_read`]): one a former owner wrote after this
    /// worker took its partition is nobody's unless the owner takes it up.
    unsettled_read: HashSet<TaskId>,
    /// The first snapshot read in a record version newer than this program knows.
    outdated: Option<Outdated>,
}

/// A snapshot on the task-state topic in a record version newer than this program knows:
/// a newer Ferry's worker wrote it (a rolling upgrade across a protocol version). This
/// worker cannot know that task's state, and resuming it from an older snapshot would run
/// its steps again, so it stops ([`StateView::outdated`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outdated {
    /// The topic.
    pub topic: String,
    /// The task the record is of (its key), where the key is a task id.
    pub task: Option<String>,
    /// The record's schema id.
    pub schema_id: u32,
    /// The id of the newest snapshot version this program knows.
    pub newest_known: u32,
}

impl std::fmt::Display for Outdated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} holds a snapshot{} in record version (schema id) {}, newer than this program knows ({}): a newer Ferry's worker writes there; upgrade this one",
            self.topic,
            self.task.as_deref().map(|t| format!(" of task {t}")).unwrap_or_default(),
            self.schema_id,
            self.newest_known
        )
    }
}

/// A running task's guard: falls when a snapshot of the task that this process did not
/// write, past the seq it ran from and past its own writes, is read from the topic.
struct Guard {
    run: u64,
    /// This worker's name: a record it wrote, read back before its acknowledgement was
    /// handled, is not another writer's.
    me: String,
    from_seq: i64,
    fence: CancellationToken,
    overtaken: Arc<AtomicBool>,
}

/// The in-memory task-state table of one process.
pub struct StateView {
    kind: Option<TaskKind>,
    topic: String,
    table: RwLock<Table>,
    consumer: Arc<BaseConsumer>,
    partitions: Vec<i32>,
    changed: watch::Sender<u64>,
    /// Told when a record older than one read before of its task is read.
    stale_landed: tokio::sync::Notify,
    /// Told when an unsettled snapshot is read from the topic (decoded: not one this
    /// process wrote and knows already).
    unsettled_landed: tokio::sync::Notify,
    /// Falls when a snapshot in a newer record version is read ([`Outdated`]).
    outdated: CancellationToken,
    stop: AtomicBool,
}

impl std::fmt::Debug for StateView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateView").field("topic", &self.topic).field("kind", &self.kind).finish()
    }
}

impl StateView {
    /// Starts reading `topic` from the beginning on a thread of its own; keeps only tasks
    /// of `kind` (all kinds when `None`).
    pub fn start(
        kafka: &KafkaConfig,
        topic: &str,
        kind: Option<TaskKind>,
        registry: Arc<Registry>,
    ) -> Result<(Arc<Self>, JoinHandle<()>), ViewError> {
        let err = |source| ViewError::Consumer { topic: topic.to_owned(), source };
        let consumer: BaseConsumer = kafka.reader().create().map_err(err)?;
        let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(30)).map_err(err)?;
        let partitions: Vec<i32> = md
            .topics()
            .iter()
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect();
        let mut tpl = TopicPartitionList::new();
        for p in &partitions {
            tpl.add_partition_offset(topic, *p, Offset::Beginning).map_err(err)?;
        }
        consumer.assign(&tpl).map_err(err)?;
        let (changed, _) = watch::channel(0);
        let view = Arc::new(Self {
            kind,
            topic: topic.to_owned(),
            table: RwLock::new(Table::default()),
            consumer: Arc::new(consumer),
            partitions,
            changed,
            stale_landed: tokio::sync::Notify::new(),
            unsettled_landed: tokio::sync::Notify::new(),
            outdated: CancellationToken::new(),
            stop: AtomicBool::new(false),
        });
        let v = view.clone();
        let handle = std::thread::Builder::new()
            .name("ferry-state-view".into())
            .spawn(move || v.read_loop(&registry))
            .expect("spawn state-view thread");
        Ok((view, handle))
    }

    fn read_loop(&self, registry: &Registry) {
        let newest_known = registry.id_of::<TaskSnapshot>().unwrap_or(u32::MAX);
        while !self.stop.load(Ordering::Relaxed) {
            match self.consumer.poll(Duration::from_millis(100)) {
                Some(Ok(m)) => {
                    if self.held(&m) {
                        let mut t = self.table.write().expect("view lock");
                        t.positions.insert(m.partition(), m.offset() + 1);
                        drop(t);
                        self.changed.send_modify(|v| *v += 1);
                        continue;
                    }
                    let decoded = m.payload().map(|p| registry.decode::<TaskSnapshot>(p));
                    let mut t = self.table.write().expect("view lock");
                    t.positions.insert(m.partition(), m.offset() + 1);
                    match decoded {
                        Some(Ok(snap)) => {
                            Self::check_guard(&mut t, &snap);
                            if let Ok(id) = snap.task_id.parse::<TaskId>() {
                                self.landed(&mut t, id, snap.seq);
                            }
                            let unsettled = !crate::publisher::settled(&snap);
                            if let Some(id) = self.record(&mut t, snap)
                                && unsettled
                            {
                                t.unsettled_read.insert(id);
                                self.unsettled_landed.notify_one();
                            }
                        }
                        // Only snapshots are written here, and a newer version of a record
                        // gets a higher id (`docs/PROTOCOL.md`): an unknown id above the
                        // snapshot's own is a newer program's snapshot.
                        Some(Err(crate::wire::WireError::UnknownSchemaId(id))) if id > newest_known => {
                            t.undecodable += 1;
                            let task = m.key().and_then(|k| std::str::from_utf8(k).ok()).map(str::to_owned);
                            // Another writer's newer state of this task: a run of it here
                            // stops at once, as for any other writer's newer snapshot.
                            if let Some(g) = task.as_deref().and_then(|k| k.parse::<TaskId>().ok()).and_then(|id| t.guards.get(&id)) {
                                g.overtaken.store(true, Ordering::Relaxed);
                                g.fence.cancel();
                            }
                            let newer = Outdated { topic: self.topic.clone(), task, schema_id: id, newest_known };
                            tracing::error!(offset = m.offset(), "{newer}");
                            t.outdated.get_or_insert(newer);
                            self.outdated.cancel();
                        }
                        Some(Err(e)) => {
                            t.undecodable += 1;
                            tracing::error!(topic = %self.topic, offset = m.offset(), error = %e, "undecodable task snapshot skipped");
                        }
                        // A tombstone: the task is deleted (compaction removes it too).
                        None => {
                            if let Some(id) = m.key().and_then(|k| std::str::from_utf8(k).ok()).and_then(|k| k.parse::<TaskId>().ok()) {
                                t.tasks.remove(&id);
                                t.keys.retain(|_, v| *v != id);
                                t.own.remove(&id);
                                t.stale_last.remove(&id);
                                t.landed.remove(&id);
                                t.unsettled_read.remove(&id);
                            }
                        }
                    }
                    self.changed.send_modify(|v| *v += 1);
                }
                Some(Err(e)) => tracing::warn!(topic = %self.topic, error = %e, "task-state read error"),
                None => {
                    // Idle: positions of empty or compacted-away ranges come from the consumer,
                    // as they are: after a rewind (librdkafka resets a position it cannot
                    // validate to the beginning) `caught_up` waits for the re-read.
                    if let Ok(pos) = self.consumer.position() {
                        let mut t = self.table.write().expect("view lock");
                        for e in pos.elements() {
                            if let Offset::Offset(o) = e.offset() {
                                t.positions.insert(e.partition(), o);
                            }
                        }
                        drop(t);
                        self.changed.send_modify(|v| *v += 1);
                    }
                }
            }
        }
    }

    /// True when the record is a snapshot this process wrote and still holds (same task,
    /// same seq) or one older than the held snapshot: decoding it would change nothing.
    /// Known from the key and the seq header alone; records without them are decoded. One
    /// older than a record read before makes the task's last record stale
    /// ([`Self::stale_last`]).
    fn held(&self, m: &rdkafka::message::BorrowedMessage<'_>) -> bool {
        use rdkafka::message::Headers;
        let Some(id) = m.key().and_then(|k| std::str::from_utf8(k).ok()).and_then(|k| k.parse::<TaskId>().ok()) else { return false };
        let Some(seq) = m
            .headers()
            .and_then(|h| h.iter().find(|h| h.key == crate::publisher::SEQ_HEADER))
            .and_then(|h| h.value)
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|v| v.parse::<i64>().ok())
        else {
            return false;
        };
        let mut t = self.table.write().expect("view lock");
        self.landed(&mut t, id, seq) || t.own.get(&id) == Some(&seq)
    }

    /// Notes the record of `id` at `seq` just read: below the highest seq read of the task
    /// before, the task's last record is stale (and the owner is told); else it is not.
    /// Returns whether the record is older than the view's newest snapshot of the task.
    fn landed(&self, t: &mut Table, id: TaskId, seq: i64) -> bool {
        let top = t.landed.entry(id).or_insert(seq);
        if seq >= *top {
            *top = seq;
            t.stale_last.remove(&id);
        } else {
            t.stale_last.insert(id);
            self.stale_landed.notify_one();
        }
        t.tasks.get(&id).is_some_and(|s| s.seq > seq)
    }

    /// Waits until a record older than one read before of its task has been read since the
    /// last call (a permit is kept when nobody waits).
    pub async fn stale_landed(&self) {
        self.stale_landed.notified().await;
    }

    /// Waits until an unsettled snapshot has been read since the last call (a permit is
    /// kept when nobody waits).
    pub async fn unsettled_landed(&self) {
        self.unsettled_landed.notified().await;
    }

    /// The newest snapshots of the tasks an unsettled snapshot of which was read since the
    /// last call (still unsettled).
    pub fn take_unsettled_read(&self) -> Vec<TaskSnapshot> {
        let mut t = self.table.write().expect("view lock");
        let ids = std::mem::take(&mut t.unsettled_read);
        ids.iter().filter_map(|id| t.tasks.get(id)).filter(|s| !crate::publisher::settled(s)).cloned().collect()
    }

    /// The newest snapshots of the tasks of `partitions` (by their command's partition)
    /// whose last record on the topic is older than that: what to write again.
    pub fn stale_last(&self, partitions: &HashSet<i32>) -> Vec<TaskSnapshot> {
        let t = self.table.read().expect("view lock");
        t.stale_last.iter().filter_map(|id| t.tasks.get(id)).filter(|s| partitions.contains(&s.origin_partition)).cloned().collect()
    }

    /// Another writer's snapshot of a task this worker runs: only a worker that also takes
    /// itself for the task's owner writes it (one of the two lost its partition and does
    /// not know it yet: librdkafka's mock cluster evicts a member whose JoinGroup it holds
    /// past the session timeout, and the member learns it only when answered). Its runner
    /// stops before its next write and drops its step; the scheduler takes the task up
    /// again later from the newest snapshot if it still owns the partition.
    fn check_guard(t: &mut Table, snap: &TaskSnapshot) {
        let Ok(id) = snap.task_id.parse::<TaskId>() else { return };
        let Some(g) = t.guards.get(&id) else { return };
        let own = t.own.get(&id).copied().unwrap_or(i64::MIN);
        if snap.worker != g.me && snap.seq > g.from_seq.max(own) && !g.fence.is_cancelled() {
            tracing::warn!(task = %id, seq = snap.seq, writer = %snap.worker, own, "another worker wrote a task this worker runs: stopping it");
            g.overtaken.store(true, Ordering::Relaxed);
            g.fence.cancel();
        }
    }

    /// Guards run `run` of a task that started from `from_seq`: `fence` falls (and
    /// `overtaken` is set) when another writer's newer snapshot of it is read.
    pub(crate) fn guard(&self, id: TaskId, run: u64, me: &str, from_seq: i64, fence: CancellationToken, overtaken: Arc<AtomicBool>) {
        let mut t = self.table.write().expect("view lock");
        t.guards.insert(id, Guard { run, me: me.to_owned(), from_seq, fence, overtaken });
    }

    /// The first snapshot read in a record version newer than this program knows, if any:
    /// no run starts once there is one, and the worker stops.
    pub fn outdated(&self) -> Option<Outdated> {
        self.table.read().expect("view lock").outdated.clone()
    }

    /// Whether a snapshot in a newer record version was read ([`Self::outdated`]).
    pub fn is_outdated(&self) -> bool {
        self.outdated.is_cancelled()
    }

    /// Resolves once a snapshot in a newer record version is read ([`Self::outdated`]).
    pub async fn outdated_read(&self) {
        self.outdated.cancelled().await;
    }

    /// Drops the guard of run `run` of a task (a later run's stays).
    pub(crate) fn unguard(&self, id: &TaskId, run: u64) {
        let mut t = self.table.write().expect("view lock");
        if t.guards.get(id).is_some_and(|g| g.run == run) {
            t.guards.remove(id);
        }
    }

    /// The seq of the newest snapshot of a task the view holds.
    pub fn seq_of(&self, id: &TaskId) -> Option<i64> {
        self.table.read().expect("view lock").tasks.get(id).map(|s| s.seq)
    }

    /// [`Self::apply`] for a snapshot this process writes: when it is read back from the
    /// topic with the same seq, it is not decoded again.
    pub fn apply_own(&self, snap: TaskSnapshot) {
        let (Ok(id), seq) = (snap.task_id.parse::<TaskId>(), snap.seq) else { return };
        self.apply(snap);
        let mut t = self.table.write().expect("view lock");
        if t.tasks.get(&id).is_some_and(|s| s.seq == seq) {
            t.own.insert(id, seq);
        }
    }

    /// Stops the reader thread at its next poll.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Records a snapshot unless the table already has a newer one of that task.
    pub fn apply(&self, snap: TaskSnapshot) {
        let mut t = self.table.write().expect("view lock");
        self.record(&mut t, snap);
    }

    /// [`Self::apply`] under the caller's lock: the task's id when the snapshot was kept
    /// (of this view's kind, not older than the one held).
    fn record(&self, t: &mut Table, snap: TaskSnapshot) -> Option<TaskId> {
        if self.kind.is_some_and(|k| k != snap.kind) {
            return None;
        }
        let id = snap.task_id.parse::<TaskId>().ok()?;
        if t.tasks.get(&id).is_some_and(|old| old.seq > snap.seq) {
            return None;
        }
        if let Some(k) = &snap.idempotency_key {
            t.keys.entry(k.clone()).or_insert(id);
        }
        t.tasks.insert(id, snap);
        Some(id)
    }

    /// The latest snapshot of a task.
    pub fn get(&self, id: &TaskId) -> Option<TaskSnapshot> {
        self.table.read().expect("view lock").tasks.get(id).cloned()
    }

    /// The task that first used an idempotency key.
    pub fn by_key(&self, key: &str) -> Option<TaskSnapshot> {
        let t = self.table.read().expect("view lock");
        t.keys.get(key).and_then(|id| t.tasks.get(id)).cloned()
    }

    /// Every task, for listings.
    pub fn all(&self) -> Vec<TaskSnapshot> {
        self.table.read().expect("view lock").tasks.values().cloned().collect()
    }

    /// Snapshots that still need work, from the given command-topic partitions, in
    /// command order.
    pub fn unsettled(&self, partitions: &HashSet<i32>) -> Vec<TaskSnapshot> {
        let t = self.table.read().expect("view lock");
        let mut v: Vec<TaskSnapshot> = t
            .tasks
            .values()
            .filter(|s| partitions.contains(&s.origin_partition) && !crate::publisher::settled(s))
            .cloned()
            .collect();
        v.sort_by_key(|s| (s.origin_offset, s.created_at_ms));
        v
    }

    /// Settled snapshots from the given partitions written since `since_ms`.
    pub fn settled_since(&self, partitions: &HashSet<i32>, since_ms: i64) -> Vec<TaskSnapshot> {
        let t = self.table.read().expect("view lock");
        t.tasks
            .values()
            .filter(|s| partitions.contains(&s.origin_partition) && s.updated_at_ms >= since_ms && crate::publisher::settled(s))
            .cloned()
            .collect()
    }

    /// Snapshots that could not be decoded so far.
    pub fn undecodable(&self) -> u64 {
        self.table.read().expect("view lock").undecodable
    }

    /// Waits until the table holds every record that was on the topic when called.
    pub async fn caught_up(&self, limit: Duration) -> Result<(), ViewError> {
        let started = Instant::now();
        let consumer = self.consumer.clone();
        let topic = self.topic.clone();
        let partitions = self.partitions.clone();
        let ends = tokio::task::spawn_blocking(move || {
            partitions
                .iter()
                .map(|p| consumer.fetch_watermarks(&topic, *p, Duration::from_secs(30)).map(|(_, hi)| (*p, hi)))
                .collect::<Result<Vec<_>, _>>()
        })
        .await
        .expect("watermark task")
        .map_err(|source| ViewError::Consumer { topic: self.topic.clone(), source })?;
        let mut rx = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + limit.saturating_sub(started.elapsed());
        loop {
            let done = {
                let t = self.table.read().expect("view lock");
                ends.iter().all(|(p, hi)| *hi <= 0 || t.positions.get(p).is_some_and(|pos| pos >= hi))
            };
            if done {
                return Ok(());
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                _ => return Err(ViewError::CatchUpTimeout { topic: self.topic.clone(), waited: limit }),
            }
        }
    }
}

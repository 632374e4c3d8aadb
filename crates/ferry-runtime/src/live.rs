//! Long-lived readers of compacted, keyed topics: one consumer thread follows a set of
//! topics from their beginning and keeps the latest value of every key in memory, so a
//! service (the dashboard, an API) answers from it instead of reading the topics for each
//! request. [`Follower`] is the generic reader (the dashboard follows `ferry.scores` with
//! it); [`LiveState`] follows every kind's task-state topic and is the id → kind/subject
//! index that Cancel and Revert need.
//!
//! # Guarantees
//! - A key's value is the last record of it on its partition that the reader has read; a
//!   tombstone (a record without payload) removes the key, as compaction will. A
//!   versioned follower ([`Follower::start_versioned`]; [`LiveState`]: a snapshot's seq)
//!   keeps the newest version instead: a record read again after the consumer was rewound
//!   (librdkafka resets a fetch position to the beginning when it cannot validate it after
//!   a leader change or a failed fetch), or written late by a stale writer, does not put a
//!   key back to an older value.
//! - Positions are the consumer's own: after a rewind, [`Follower::caught_up`] waits for
//!   the re-read to reach the ends again.
//! - [`Follower::is_ready`] is true once the reader has read every record that was on the
//!   topics when it started; [`Follower::caught_up`] waits for the ends as of its call
//!   (read-your-writes: a caller that saw its write acknowledged, then awaits it, reads it).
//!
//! # Limits
//! Reads are eventually consistent: without [`Follower::caught_up`] an answer may miss
//! the latest records (the time a record takes from the broker to the reader's fetch).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Message, Offset, TopicPartitionList};
use tokio::sync::watch;

use crate::ids::TaskId;
use crate::kafka::KafkaConfig;
use crate::kind::TaskKind;
use crate::protocol::TaskSnapshot;
use crate::topics::Topics;
use crate::wire::{Registry, WireError};

/// How long a reader waits for the broker's metadata and watermarks.
const BROKER_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a live reader could not start or catch up.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    /// The consumer could not be created or assigned, or the topics' partitions or ends
    /// could not be read.
    #[error("following {topics}: {source}")]
    Consumer {
        /// The topics followed, comma-separated.
        topics: String,
        /// Cause.
        #[source]
        source: KafkaError,
    },
    /// The topics' ends were not reached in time.
    #[error("following {topics}: not caught up with the topics' ends within {:.1} s (is the broker reachable?)", .waited.as_secs_f64())]
    CatchUpTimeout {
        /// The topics followed, comma-separated.
        topics: String,
        /// How long we waited.
        waited: Duration,
    },
    /// The awaited value did not show up in time.
    #[error("following {topics}: what was awaited did not arrive within {:.1} s", .waited.as_secs_f64())]
    WaitTimeout {
        /// The topics followed, comma-separated.
        topics: String,
        /// How long we waited.
        waited: Duration,
    },
    /// The reader thread could not be started.
    #[error("following {topics}: could not start the reader thread: {source}")]
    Spawn {
        /// The topics followed, comma-separated.
        topics: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The reader thread has stopped (every handle of the follower was dropped).
    #[error("following {topics}: the reader has stopped")]
    Stopped {
        /// The topics followed, comma-separated.
        topics: String,
    },
}

/// Turns a record's payload, read from the topic named by the first argument, into a
/// value: `Ok(None)` leaves the record out (e.g. a snapshot on another kind's topic).
pub type Decoder<V> = Box<dyn Fn(&str, &[u8]) -> Result<Option<V>, WireError> + Send + Sync>;

/// A value's version: of two values of one key, the lower one is older.
pub type Version<V> = fn(&V) -> i64;

struct Entry<V> {
    /// Index of the topic it was read from: a tombstone removes it only from that topic.
    topic: usize,
    value: V,
}

struct Table<V> {
    entries: HashMap<String, Entry<V>>,
    /// Next offset to read, by (topic index, partition).
    positions: HashMap<(usize, i32), i64>,
    undecodable: u64,
    /// Keys whose last record has a schema id this program does not know, with that id:
    /// a newer program's record ([`Follower::unknown_schema`]), and the index of the
    /// topic it was read from.
    unknown: HashMap<String, (u32, usize)>,
}

struct Shared<V> {
    topics: Vec<String>,
    /// Set: a record older than the value held is not taken.
    version: Option<Version<V>>,
    table: RwLock<Table<V>>,
    consumer: BaseConsumer,
    partitions: Vec<(usize, i32)>,
    /// Bumped after every change of the table or the positions.
    changed: watch::Sender<u64>,
    /// Caught up once with the ends as of the start.
    ready: AtomicBool,
    stop: Arc<AtomicBool>,
    stopped: AtomicBool,
}

/// Stops the reader thread when the last handle is dropped, and waits (at most
/// [`CLOSE_WAIT`]) until it has let its consumer go: a program that stops its broker next
/// (`ferry dev`) must not have a reader still polling it.
struct Owner {
    stop: Arc<AtomicBool>,
    done: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

/// The longest a dropped follower waits for its reader: one poll (20 ms) and the
/// consumer's close, with room for a broker that no longer answers.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

impl Drop for Owner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Ok(done) = self.done.lock() {
            let _ = done.recv_timeout(CLOSE_WAIT);
        }
    }
}

/// The latest value of every key of a set of compacted topics, followed by a thread of its
/// own. Cheap to clone; the last clone's drop stops the thread and waits for its consumer
/// to close (one 20 ms poll and the consumer's close).
pub struct Follower<V> {
    shared: Arc<Shared<V>>,
    _owner: Arc<Owner>,
}

impl<V> Clone for Follower<V> {
    fn clone(&self) -> Self {
        Self { shared: self.shared.clone(), _owner: self._owner.clone() }
    }
}

impl<V> std::fmt::Debug for Follower<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Follower").field("topics", &self.shared.topics).field("ready", &self.is_ready()).finish()
    }
}

type Ends = Vec<((usize, i32), i64, i64)>;

/// The low and high watermarks of every partition. Asked as offsets for the timestamps
/// "earliest" and "latest": two requests per broker, not two per partition (on a broker
/// that answers a request in tens of milliseconds, dozens of partitions took seconds).
fn watermarks(consumer: &BaseConsumer, topics: &[String], partitions: &[(usize, i32)]) -> Result<Ends, KafkaError> {
    let offsets = |at: Offset| -> Result<HashMap<(usize, i32), i64>, KafkaError> {
        let mut tpl = TopicPartitionList::new();
        for &(t, p) in partitions {
            tpl.add_partition_offset(&topics[t], p, at)?;
        }
        let mut out = HashMap::new();
        for e in consumer.offsets_for_times(tpl, BROKER_TIMEOUT)?.elements() {
            e.error()?;
            let Some(t) = topics.iter().position(|n| n == e.topic()) else { continue };
            // No offset (a partition without records): nothing to wait for.
            let o = match e.offset() {
                Offset::Offset(o) => o,
                _ => 0,
            };
            out.insert((t, e.partition()), o);
        }
        Ok(out)
    };
    let (lo, hi) = (offsets(Offset::Beginning)?, offsets(Offset::End)?);
    Ok(partitions.iter().map(|tp| (*tp, lo.get(tp).copied().unwrap_or(0), hi.get(tp).copied().unwrap_or(0))).collect())
}

impl<V: Send + Sync + 'static> Follower<V> {
    /// Starts following `topics` from their beginning. Blocks on the broker's metadata and
    /// watermarks (call it from a blocking context, e.g. `spawn_blocking`).
    pub fn start(kafka: &KafkaConfig, topics: Vec<String>, decode: Decoder<V>) -> Result<Self, LiveError> {
        Self::follow(kafka, topics, decode, None)
    }

    /// [`Self::start`], keeping each key's newest value by `version` rather than its last
    /// record read: a record read again after a rewind, or written late, changes nothing.
    pub fn start_versioned(kafka: &KafkaConfig, topics: Vec<String>, decode: Decoder<V>, version: Version<V>) -> Result<Self, LiveError> {
        Self::follow(kafka, topics, decode, Some(version))
    }

    fn follow(kafka: &KafkaConfig, topics: Vec<String>, decode: Decoder<V>, version: Option<Version<V>>) -> Result<Self, LiveError> {
        let err = |source| LiveError::Consumer { topics: topics.join(", "), source };
        let consumer: BaseConsumer = kafka.reader().create().map_err(err)?;
        let mut partitions = Vec::new();
        let mut tpl = TopicPartitionList::new();
        for (i, topic) in topics.iter().enumerate() {
            let md = consumer.fetch_metadata(Some(topic), BROKER_TIMEOUT).map_err(err)?;
            for p in md.topics().iter().flat_map(|t| t.partitions()) {
                partitions.push((i, p.id()));
                tpl.add_partition_offset(topic, p.id(), Offset::Beginning).map_err(err)?;
            }
        }
        let ends = watermarks(&consumer, &topics, &partitions).map_err(err)?;
        consumer.assign(&tpl).map_err(err)?;
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared {
            topics,
            version,
            table: RwLock::new(Table { entries: HashMap::new(), positions: HashMap::new(), undecodable: 0, unknown: HashMap::new() }),
            consumer,
            partitions,
            changed: watch::channel(0).0,
            ready: AtomicBool::new(false),
            stop: stop.clone(),
            stopped: AtomicBool::new(false),
        });
        let s = shared.clone();
        let (done_tx, done) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("ferry-live".into())
            .spawn(move || {
                s.read_loop(&decode, ends);
                s.stopped.store(true, Ordering::Relaxed);
                s.changed.send_modify(|v| *v += 1);
                // The last holder once the followers are gone: the consumer closes here.
                drop(s);
                let _ = done_tx.send(());
            })
            .map_err(|source| LiveError::Spawn { topics: shared.topics.join(", "), source })?;
        Ok(Self { shared, _owner: Arc::new(Owner { stop, done: std::sync::Mutex::new(done) }) })
    }
}

impl<V> Shared<V> {
    fn topic_index(&self, name: &str) -> Option<usize> {
        self.topics.iter().position(|t| t == name)
    }

    fn read_loop(&self, decode: &Decoder<V>, ends: Ends) {
        let mut first = Some(ends);
        while !self.stop.load(Ordering::Relaxed) {
            // A short poll: a one-shot read (`ferry tasks list`) waits for this thread to
            // see its stop; 100 ms polls made that a tenth of a second per command.
            match self.consumer.poll(Duration::from_millis(20)) {
                Some(Ok(m)) => {
                    let Some(t) = self.topic_index(m.topic()) else { continue };
                    let key = m.key().map(|k| String::from_utf8_lossy(k).into_owned());
                    let decoded = match (&key, m.payload()) {
                        (Some(_), Some(p)) => Some(decode(m.topic(), p)),
                        _ => None,
                    };
                    let mut table = self.table.write().expect("live table lock");
                    table.positions.insert((t, m.partition()), m.offset() + 1);
                    match (key, decoded) {
                        (Some(key), Some(Ok(Some(value)))) => {
                            let older = self.version.is_some_and(|v| table.entries.get(&key).is_some_and(|held| v(&held.value) > v(&value)));
                            if !older {
                                table.unknown.remove(&key);
                                table.entries.insert(key, Entry { topic: t, value });
                            }
                        }
                        (Some(_), Some(Ok(None))) => {}
                        // A schema this program does not know: the key's value is now one
                        // it cannot read, which a reader is told rather than shown an older one.
                        (Some(key), Some(Err(WireError::UnknownSchemaId(id)))) => {
                            table.undecodable += 1;
                            tracing::warn!(topic = m.topic(), key, offset = m.offset(), schema_id = id, "record in a schema this program does not know (a newer program's?) skipped");
                            table.unknown.insert(key, (id, t));
                        }
                        (Some(key), Some(Err(e))) => {
                            table.undecodable += 1;
                            tracing::error!(topic = m.topic(), key, offset = m.offset(), error = %e, "undecodable record skipped");
                        }
                        // A tombstone: the key is deleted (compaction removes it too).
                        (Some(key), None) => {
                            table.unknown.remove(&key);
                            if table.entries.get(&key).is_some_and(|e| e.topic == t) {
                                table.entries.remove(&key);
                            }
                        }
                        (None, _) => {
                            table.undecodable += 1;
                            tracing::error!(topic = m.topic(), offset = m.offset(), "record without a key skipped");
                        }
                    }
                }
                Some(Err(e)) => tracing::warn!(topics = %self.topics.join(", "), error = %e, "live reader error"),
                None => {
                    // Idle: positions past empty or compacted-away ranges come from the consumer,
                    // as they are (lower after a rewind: the ends are not reached until the
                    // re-read reaches them).
                    if let Ok(pos) = self.consumer.position() {
                        let mut table = self.table.write().expect("live table lock");
                        for e in pos.elements() {
                            if let (Offset::Offset(o), Some(t)) = (e.offset(), self.topic_index(e.topic())) {
                                table.positions.insert((t, e.partition()), o);
                            }
                        }
                    }
                }
            }
            if first.as_ref().is_some_and(|ends| self.reached(ends)) {
                first = None;
                self.ready.store(true, Ordering::Relaxed);
            }
            self.changed.send_modify(|v| *v += 1);
        }
    }

    /// Whether every partition has been read up to its end in `ends`.
    fn reached(&self, ends: &Ends) -> bool {
        let table = self.table.read().expect("live table lock");
        ends.iter().all(|(tp, lo, hi)| hi <= lo || table.positions.get(tp).is_some_and(|pos| pos >= hi))
    }
}

impl<V> Follower<V> {
    /// The topics followed.
    pub fn topics(&self) -> &[String] {
        &self.shared.topics
    }

    fn names(&self) -> String {
        self.shared.topics.join(", ")
    }

    /// True once the reader has read everything that was on the topics when it started.
    pub fn is_ready(&self) -> bool {
        self.shared.ready.load(Ordering::Relaxed)
    }

    /// Records that could not be decoded (or had no key) so far.
    pub fn undecodable(&self) -> u64 {
        self.shared.table.read().expect("live table lock").undecodable
    }

    /// The schema id of `key`'s last record, where this program does not know it (a
    /// newer program's record; the table keeps the value before it, if any).
    pub fn unknown_schema(&self, key: &str) -> Option<u32> {
        self.shared.table.read().expect("live table lock").unknown.get(key).map(|(id, _)| *id)
    }

    /// Every key whose last record has a schema id this program does not know, with the id.
    pub fn unknown_schemas(&self) -> Vec<(String, u32)> {
        self.unknown_records().into_iter().map(|(k, id, _)| (k, id)).collect()
    }

    /// [`Self::unknown_schemas`] with the topic each record was read from.
    pub fn unknown_records(&self) -> Vec<(String, u32, String)> {
        let table = self.shared.table.read().expect("live table lock");
        let mut all: Vec<(String, u32, String)> = table.unknown.iter().map(|(k, (id, t))| (k.clone(), *id, self.shared.topics[*t].clone())).collect();
        all.sort();
        all
    }

    /// How many keys the table holds.
    pub fn len(&self) -> usize {
        self.shared.table.read().expect("live table lock").entries.len()
    }

    /// True when the table holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs `f` over every value under the table's read lock (no copy of the table; keep
    /// `f` short, the reader waits for it).
    pub fn scan<R>(&self, f: impl FnOnce(&mut dyn Iterator<Item = &V>) -> R) -> R {
        let table = self.shared.table.read().expect("live table lock");
        f(&mut table.entries.values().map(|e| &e.value))
    }

    /// Runs `f` on the value of `key`, under the table's read lock.
    pub fn with<R>(&self, key: &str, f: impl FnOnce(&V) -> R) -> Option<R> {
        let table = self.shared.table.read().expect("live table lock");
        table.entries.get(key).map(|e| f(&e.value))
    }

    /// Waits until `check` gives a value, re-checking after every record the reader takes
    /// in; fails after `limit`.
    pub async fn wait_for<R>(&self, limit: Duration, mut check: impl FnMut(&Self) -> Option<R>) -> Result<R, LiveError> {
        let deadline = tokio::time::Instant::now() + limit;
        let mut rx = self.shared.changed.subscribe();
        loop {
            rx.borrow_and_update();
            if let Some(r) = check(self) {
                return Ok(r);
            }
            if self.shared.stopped.load(Ordering::Relaxed) {
                return Err(LiveError::Stopped { topics: self.names() });
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(LiveError::Stopped { topics: self.names() }),
                Err(_) => return Err(LiveError::WaitTimeout { topics: self.names(), waited: limit }),
            }
        }
    }

    /// Waits until the reader has caught up once (see [`Self::is_ready`]).
    pub async fn ready(&self, limit: Duration) -> Result<(), LiveError> {
        self.wait_for(limit, |f| f.is_ready().then_some(())).await.map_err(|e| match e {
            LiveError::WaitTimeout { topics, waited } => LiveError::CatchUpTimeout { topics, waited },
            e => e,
        })
    }

    /// Waits until the table holds every record that was on the topics when called.
    pub async fn caught_up(&self, limit: Duration) -> Result<(), LiveError>
    where
        V: Send + Sync + 'static,
    {
        let started = tokio::time::Instant::now();
        let shared = self.shared.clone();
        let ends = tokio::task::spawn_blocking(move || watermarks(&shared.consumer, &shared.topics, &shared.partitions))
            .await
            .expect("watermark task")
            .map_err(|source| LiveError::Consumer { topics: self.names(), source })?;
        let rest = limit.saturating_sub(started.elapsed());
        self.wait_for(rest, |f| f.shared.reached(&ends).then_some(())).await.map_err(|e| match e {
            LiveError::WaitTimeout { topics, .. } => LiveError::CatchUpTimeout { topics, waited: limit },
            e => e,
        })
    }
}

impl<V: Clone> Follower<V> {
    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<V> {
        self.with(key, V::clone)
    }

    /// Every value (a copy of the table; see [`Self::scan`] to look without copying).
    pub fn values(&self) -> Vec<V> {
        self.scan(|it| it.cloned().collect())
    }
}

/// Every task's latest snapshot, followed live on every kind's task-state topic: the
/// dashboard's table, and the id → kind/subject index Cancel and Revert are sent with.
/// Cheap to clone.
#[derive(Clone, Debug)]
pub struct LiveState {
    tasks: Follower<TaskSnapshot>,
    /// The id of the newest snapshot version this program knows: a task whose last
    /// snapshot has a higher one was written by a newer Ferry ([`Self::newer`]).
    newest_known: u32,
}

impl LiveState {
    /// Starts following every kind's task-state topic of `topics`, keeping each task's
    /// highest seq. A snapshot on another
    /// kind's topic than its own is left out (no worker of that kind wrote it). Blocks on
    /// the broker (see [`Follower::start`]).
    pub fn start(kafka: &KafkaConfig, topics: &Topics, registry: Arc<Registry>) -> Result<Self, LiveError> {
        Self::start_of(kafka, topics, registry, None)
    }

    /// [`Self::start`] for one kind's tasks only (`Some`), reading only its task-state
    /// topic (an open kind's too, which `topics` does not list).
    pub fn start_of(kafka: &KafkaConfig, topics: &Topics, registry: Arc<Registry>, kind: Option<TaskKind>) -> Result<Self, LiveError> {
        let defs: Vec<crate::topics::TopicDef> = match kind {
            Some(k) => vec![topics.task_state(k).into_owned()],
            None => topics.task_states().cloned().collect(),
        };
        let kinds: HashMap<String, Option<TaskKind>> = defs.iter().map(|t| (t.name.clone(), t.kind)).collect();
        let names = defs.into_iter().map(|t| t.name).collect();
        let newest_known = registry.id_of::<TaskSnapshot>().unwrap_or(u32::MAX);
        let decode: Decoder<TaskSnapshot> = Box::new(move |topic, payload| {
            let snap = registry.decode::<TaskSnapshot>(payload)?;
            Ok(match kinds.get(topic) {
                Some(Some(kind)) if *kind != snap.kind => None,
                _ => Some(snap),
            })
        });
        // A task's newest snapshot is the one with the highest seq (seqs only grow).
        Ok(Self { tasks: Follower::start_versioned(kafka, names, decode, |s| s.seq)?, newest_known })
    }

    /// The schema id of a task's last snapshot, where it is a record version newer than
    /// this program knows (only snapshots are written to the task-state topics, and a
    /// newer version of a record gets a higher id: `docs/PROTOCOL.md`). [`Self::get`]
    /// then gives the snapshot before it, if any, which is not the task's state.
    pub fn newer(&self, id: TaskId) -> Option<u32> {
        self.tasks.unknown_schema(&id.to_string()).filter(|s| *s > self.newest_known)
    }

    /// Every task whose last snapshot is in a newer record version ([`Self::newer`]).
    pub fn newer_all(&self) -> Vec<(String, u32)> {
        self.tasks.unknown_schemas().into_iter().filter(|(_, s)| *s > self.newest_known).collect()
    }

    /// The id of the newest snapshot version this program knows.
    pub fn newest_known(&self) -> u32 {
        self.newest_known
    }

    /// Resolves once the view reads a task's snapshot in a record version newer than this
    /// program knows ([`Self::newer`]), with it: a worker that reads this view (the plan
    /// worker, its children) cannot know that task's state and stops as it does on its own
    /// topic ([`crate::worker::WorkerError::Outdated`]). Never resolves once the reader has
    /// stopped.
    pub async fn newer_read(&self) -> crate::state_view::Outdated {
        let mut rx = self.tasks.shared.changed.subscribe();
        loop {
            rx.borrow_and_update();
            let found = self.tasks.unknown_records().into_iter().find(|(_, s, _)| *s > self.newest_known);
            if let Some((task, schema_id, topic)) = found {
                return crate::state_view::Outdated { topic, task: Some(task), schema_id, newest_known: self.newest_known };
            }
            if rx.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    /// The follower underneath (readiness, waits, scans).
    pub fn follower(&self) -> &Follower<TaskSnapshot> {
        &self.tasks
    }

    /// The latest snapshot of a task.
    pub fn get(&self, id: TaskId) -> Option<TaskSnapshot> {
        self.tasks.get(&id.to_string())
    }

    /// A task's kind and subject: what a Cancel or Revert is sent with.
    pub fn locate(&self, id: TaskId) -> Option<(TaskKind, String)> {
        self.tasks.with(&id.to_string(), |s| (s.kind, s.subject.clone()))
    }

    /// Every task's latest snapshot.
    pub fn all(&self) -> Vec<TaskSnapshot> {
        self.tasks.values()
    }

    /// True once the view has caught up with the topics as they were when it started.
    pub fn is_ready(&self) -> bool {
        self.tasks.is_ready()
    }

    /// Waits until the view holds every snapshot written before this call.
    pub async fn caught_up(&self, limit: Duration) -> Result<(), LiveError> {
        self.tasks.caught_up(limit).await
    }

    /// Waits until `check` accepts the snapshot of `id` (re-checked after every record
    /// read); returns that snapshot.
    pub async fn wait_for(&self, id: TaskId, limit: Duration, mut check: impl FnMut(&TaskSnapshot) -> bool) -> Result<TaskSnapshot, LiveError> {
        let key = id.to_string();
        self.tasks.wait_for(limit, |f| f.with(&key, |s| check(s).then(|| s.clone())).flatten()).await
    }
}

//! The worker's event loop: owns the per-subject queues and the tasks of the partitions
//! this instance holds; turns accepted commands into durable tasks, routes Cancel and
//! Revert to their task, starts one runner per subject at a time, and hands tasks over on
//! rebalance and shutdown.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::fences::Fences;
use crate::holds::CommitHolds;
use crate::ids::TaskId;
use crate::protocol::{Bytes, CommandAction, CommandEnvelope, EventType, ProgressEvent, Signal, TaskSnapshot, TaskState, now_ms};
use crate::publisher::{Answered, DeadLetter, Detail, Outgoing, Pending, PublishError};
use crate::runner::{Control, ControlReply, Done, Env, Runner, Unwritten};
use crate::state_view::StateView;
use crate::step::TaskHandler;

/// A decoded command-topic record, as the intake hands it over.
#[derive(Debug)]
pub(crate) struct Incoming {
    pub partition: i32,
    pub offset: i64,
    pub trace_parent: Option<String>,
    pub what: What,
}

#[derive(Debug)]
pub(crate) enum What {
    /// Not decodable: only the dead-letter topic can take it.
    DeadLetter(DeadLetter),
    /// Decodable but invalid: Rejected (and a dead letter when the spec did not decode).
    Reject { env: CommandEnvelope, reason: String, dead: Option<DeadLetter> },
    /// A valid Start.
    Start { env: CommandEnvelope, id: TaskId },
    /// A Cancel or Revert of `id`.
    Control { env: CommandEnvelope, id: TaskId },
}

/// Messages to the event loop; each carries the reply the intake waits for.
#[derive(Debug)]
pub(crate) enum SchedMsg {
    /// Replies with the partitions whose records were skipped (given up meanwhile): their
    /// offsets must not be stored, or a partition assigned back to this worker at once
    /// would skip them for good.
    /// The reply is a std channel: the intake waits on it with a timeout, serving its
    /// consumer's rebalance callbacks while the batch's writes are slow.
    Batch { items: Vec<Incoming>, reply: std::sync::mpsc::Sender<Result<HashSet<i32>, PublishError>> },
    Assigned { partitions: Vec<i32>, reply: std::sync::mpsc::Sender<()> },
    /// `lost`: the group already gave the partitions to others (the session expired), so
    /// their tasks are fenced at once instead of after the revoke grace.
    /// The reply is a std channel: the intake waits on it with a limit.
    Revoked { partitions: Vec<i32>, lost: bool, reply: std::sync::mpsc::Sender<()> },
    Shutdown { reply: oneshot::Sender<()> },
}

/// First wait before a task whose state could not be written runs again; it doubles per
/// failure up to [`RETRY_UNWRITTEN_MAX`].
const RETRY_UNWRITTEN_FIRST: Duration = Duration::from_secs(1);
const RETRY_UNWRITTEN_MAX: Duration = Duration::from_secs(30);

/// How far back a new owner republishes final events.
const REPUBLISH_WINDOW_MS: i64 = 10 * 60 * 1000;

/// The final event a settled snapshot stands for, rebuilt from the snapshot.
fn final_event(snap: &TaskSnapshot, worker: &str) -> ProgressEvent {
    let err = snap.error.as_ref();
    let d = Detail {
        step: err.and_then(|e| e.step),
        message: err.map(|e| e.message.clone()),
        code: err.map(|e| e.code.clone()),
        transient: err.map(|e| e.transient),
        ..Detail::default()
    };
    d.into_event((&snap.task_id, snap.kind, &snap.subject), snap.seq, snap.last_event, worker, snap.updated_at_ms, snap.trace_parent.clone())
}

/// A task paused because its write failed: failures in a row, the write, and the
/// pending retry. A control that comes meanwhile makes the write itself, then its own
/// (in order), and closes the gate so that the retry writes nothing.
struct Paused {
    failures: u32,
    write: Unwritten,
    retry: Option<tokio::task::AbortHandle>,
    /// Set (under the lock) once the write was made another way: the retry skips it.
    superseded: Arc<std::sync::Mutex<bool>>,
}

/// What a batch's controls changed in this worker's memory of the tasks it holds: undone
/// if the batch's writes fail ([`Scheduler::undo_failed`]), since the intake then reads the
/// same records again and they must find the tasks as they were. Before, a control read
/// again was applied a second time on top of its own unwritten change (its first seq never
/// written), and a paused write it had taken over was lost: a task whose final write
/// paused stayed Running on its task-state topic, its Succeeded never written.
#[derive(Default)]
struct Undo {
    /// Held tasks' snapshots before the batch's first control touched them.
    snaps: HashMap<TaskId, TaskSnapshot>,
    /// Tasks the batch's controls took up (a revert of a finished task, queued).
    created: Vec<TaskId>,
    /// Paused writes the batch's controls made themselves (their retries aborted). Their
    /// replayed controls' records ([`Slot::replayed`]) are released once the batch is
    /// durable; if it is not, the pause is restored.
    superseded: Vec<(TaskId, Unwritten)>,
}

/// A paused task's write, made again after a backoff.
#[derive(Debug)]
pub(crate) struct Rewritten {
    id: TaskId,
    write: Unwritten,
    /// Why the write failed again, if it did.
    failed: Option<String>,
    /// The pause it belongs to (a later pause of the same task has another).
    gate: Arc<std::sync::Mutex<bool>>,
}

struct Slot {
    snap: TaskSnapshot,
    ctl: Option<mpsc::Sender<Control>>,
    /// The running runner's fence (see `Runner::fenced`).
    fence: Option<tokio_util::sync::CancellationToken>,
    /// The number of the last runner started for the slot (0: none yet).
    run: u64,
    /// Cancels and Reverts that came while another worker's newer write of the task
    /// stood in the view: applied to the newest snapshot when the task is taken up again.
    /// Their records are held uncommitted ([`CommitHolds`]) until then.
    deferred: Vec<Deferred>,
    /// The records of deferred controls whose writes failed when they were applied: held
    /// until the task's paused write (which carries them) is durable.
    replayed: Vec<(i32, i64)>,
}

/// A control deferred with its task, and where its command record is.
struct Deferred {
    env: CommandEnvelope,
    trace: Option<String>,
    at: (i32, i64),
}

pub(crate) struct Scheduler<H: TaskHandler> {
    env: Arc<Env<H>>,
    view: Arc<StateView>,
    revoke_grace: Duration,
    owned: HashSet<i32>,
    /// The owned partitions' fences, shared with the intake's rebalance callback.
    fences: Arc<Fences>,
    /// The records of deferred controls, which the intake may not commit past.
    holds: Arc<CommitHolds>,
    /// What the batch being handled changed, to undo if its writes fail.
    undo: Undo,
    slots: HashMap<TaskId, Slot>,
    queues: HashMap<String, VecDeque<TaskId>>,
    running: HashMap<String, TaskId>,
    done_tx: mpsc::UnboundedSender<Done>,
    done_rx: mpsc::UnboundedReceiver<Done>,
    /// Failed writes per task paused for a retry (its subject's lane held meanwhile), and
    /// the pending retry, aborted if the task's partition is given up.
    unwritten: HashMap<TaskId, Paused>,
    wake_tx: mpsc::UnboundedSender<Rewritten>,
    wake_rx: mpsc::UnboundedReceiver<Rewritten>,
    /// Runners started so far: numbers each run (see `Done::run`).
    runs: u64,
    /// How long a task overtaken by another worker's write waits, its subject's lane held,
    /// before it is taken up again from the newest snapshot (see `Done::overtaken`).
    overtaken_pause: Duration,
    overtaken_tx: mpsc::UnboundedSender<TaskId>,
    overtaken_rx: mpsc::UnboundedReceiver<TaskId>,
    /// Unsettled tasks of owned partitions that another worker wrote and this one holds
    /// not, by the seq seen: taken up if still there, and quiet, after `overtaken_pause`.
    strays: HashMap<TaskId, i64>,
    stray_tx: mpsc::UnboundedSender<TaskId>,
    stray_rx: mpsc::UnboundedReceiver<TaskId>,
    /// Idempotency keys of the tasks the current batch created: the view takes a snapshot
    /// only once it is durable, which is after the batch.
    batch_keys: HashMap<String, TaskId>,
    /// `ferry_tasks_in_flight{state="queued"}` of this worker's kind.
    queued: prometheus_client::metrics::gauge::Gauge,
}

impl<H: TaskHandler> Scheduler<H> {
    pub(crate) fn new(env: Arc<Env<H>>, view: Arc<StateView>, revoke_grace: Duration, overtaken_pause: Duration, fences: Arc<Fences>, holds: Arc<CommitHolds>) -> Self {
        let queued = env.metrics.queued(env.handler.kind());
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let (wake_tx, wake_rx) = mpsc::unbounded_channel();
        let (overtaken_tx, overtaken_rx) = mpsc::unbounded_channel();
        let (stray_tx, stray_rx) = mpsc::unbounded_channel();
        Self {
            env,
            view,
            revoke_grace,
            owned: HashSet::new(),
            fences,
            holds,
            undo: Undo::default(),
            slots: HashMap::new(),
            queues: HashMap::new(),
            running: HashMap::new(),
            done_tx,
            done_rx,
            unwritten: HashMap::new(),
            wake_tx,
            wake_rx,
            runs: 0,
            overtaken_pause,
            overtaken_tx,
            overtaken_rx,
            strays: HashMap::new(),
            stray_tx,
            stray_rx,
            batch_keys: HashMap::new(),
            queued,
        }
    }

    pub(crate) async fn run(mut self, mut rx: mpsc::Receiver<SchedMsg>) {
        let view = self.view.clone();
        loop {
            tokio::select! {
                Some(done) = self.done_rx.recv() => self.on_done(done),
                () = view.stale_landed() => self.write_newest_again(&self.owned.clone()),
                Some(r) = self.wake_rx.recv() => self.on_rewritten(r),
                Some(id) = self.overtaken_rx.recv() => self.on_overtaken_pause_over(id).await,
                () = view.unsettled_landed() => self.on_unsettled_read(),
                Some(id) = self.stray_rx.recv() => self.on_stray_pause_over(id),
                msg = rx.recv() => match msg {
                    Some(SchedMsg::Batch { items, reply }) => {
                        self.undo = Undo::default();
                        let r = self.on_batch(items).await;
                        if r.is_err() {
                            self.undo_failed();
                        }
                        let _ = reply.send(r);
                    }
                    Some(SchedMsg::Assigned { partitions, reply }) => {
                        self.on_assigned(partitions).await;
                        let _ = reply.send(());
                    }
                    Some(SchedMsg::Revoked { partitions, lost, reply }) => {
                        self.on_revoked(&partitions, lost).await;
                        let _ = reply.send(());
                    }
                    Some(SchedMsg::Shutdown { reply }) => {
                        let all: Vec<i32> = self.owned.iter().copied().collect();
                        self.on_revoked(&all, false).await;
                        let _ = reply.send(());
                        return;
                    }
                    None => return,
                }
            }
            // Accepted and held here, waiting for their subject's lane (or a pause).
            self.env.metrics.set_queued(&self.queued, self.slots.len().saturating_sub(self.running.len()) as i64);
        }
    }

    fn on_done(&mut self, done: Done) {
        let Some(slot) = self.slots.get_mut(&done.task_id) else { return };
        if slot.run != done.run {
            // A run given up with its partition (fenced, past the revoke grace) handed the
            // task back after the partition came back and the task was taken up again: the
            // slot is the new run's. Taking this hand-back would drop the new runner's
            // control channel and leave the task held by no runner, for good.
            tracing::info!(task = %done.task_id, stale = done.run, current = slot.run, "a given-up run's hand-back ignored");
            return;
        }
        self.view.unguard(&done.task_id, done.run);
        let subject = done.snapshot.subject.clone();
        slot.ctl = None;
        slot.snap = done.snapshot;
        if done.overtaken && self.owned.contains(&slot.snap.origin_partition) {
            self.hold_overtaken(done.task_id, subject);
            return;
        }
        if let Some(write) = done.unwritten
            && self.owned.contains(&slot.snap.origin_partition)
        {
            // Its state could not be written: it keeps its subject's lane (no later task of
            // the subject starts), its write is made again after a backoff, then it runs
            // again, first in its subject.
            self.env.metrics.state_write_failed();
            self.running.insert(subject.clone(), done.task_id);
            self.queues.entry(subject).or_default().push_front(done.task_id);
            self.rewrite_later(done.task_id, write);
            return;
        }
        self.unwritten.remove(&done.task_id);
        if self.running.get(&subject) == Some(&done.task_id) {
            self.running.remove(&subject);
        }
        if !done.stopped && crate::publisher::settled(&slot.snap) {
            self.slots.remove(&done.task_id);
        }
        self.pump(&subject);
    }

    /// Makes a paused task's failed write again after a backoff that doubles per failure.
    fn rewrite_later(&mut self, id: TaskId, write: Unwritten) {
        let Some(slot) = self.slots.get(&id) else { return };
        let paused = self.unwritten.entry(id).or_insert_with(|| Paused { failures: 0, write: write.clone(), retry: None, superseded: Arc::default() });
        paused.failures += 1;
        let failures = paused.failures;
        let delay = RETRY_UNWRITTEN_FIRST.saturating_mul(1 << (failures - 1).min(5)).min(RETRY_UNWRITTEN_MAX);
        tracing::warn!(task = %id, failures, delay_ms = delay.as_millis() as u64, "writing the task's state again after a backoff");
        let (publisher, snap, wake) = (self.env.publisher.clone(), slot.snap.clone(), self.wake_tx.clone());
        let fence = self.fences.child(slot.snap.origin_partition);
        let superseded = paused.superseded.clone();
        let gate = superseded.clone();
        paused.retry = Some(tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            // The partition went (lost while the scheduler was busy): another worker owns
            // the task now, and this older write must not land after its newer ones.
            if fence.is_cancelled() {
                return;
            }
            let made = async {
                // Handed to the producer under the gate's lock: a control that made this
                // write itself, then its own, closed the gate first, or waits until this
                // write is queued ahead of its own (one producer, one partition: in order).
                let pending = {
                    let gate = gate.lock().expect("gate lock");
                    if *gate {
                        return Ok(());
                    }
                    if write.events.is_empty() { publisher.enqueue_snapshot(&snap)? } else { publisher.enqueue_write_all(&snap, &write.events)? }
                };
                pending.durable().await
            };
            let failed = made.await.err().map(|e| e.to_string());
            let _ = wake.send(Rewritten { id, write, failed, gate: superseded });
        })
        .abort_handle());
    }

    /// A paused task's write was made again: run the task again (first in its subject), or
    /// back off again if the write failed. Nothing to do if its partition was given up.
    fn on_rewritten(&mut self, r: Rewritten) {
        let Some(slot) = self.slots.get_mut(&r.id) else { return };
        let subject = slot.snap.subject.clone();
        let this_pause = self.unwritten.get(&r.id).is_some_and(|p| Arc::ptr_eq(&p.superseded, &r.gate));
        if !this_pause || slot.ctl.is_some() || self.running.get(&subject) != Some(&r.id) || !self.owned.contains(&slot.snap.origin_partition) {
            return;
        }
        if let Some(e) = r.failed {
            tracing::warn!(task = %r.id, error = %e, "the task's state could not be written again");
            self.env.metrics.state_write_failed();
            self.rewrite_later(r.id, r.write);
            return;
        }
        self.unwritten.remove(&r.id);
        // Controls applied when the task was taken up again, whose writes failed then, are
        // durable with this write: their records may be committed.
        self.holds.release(slot.replayed.drain(..));
        if !slot.deferred.is_empty() {
            // Controls wait with it (deferred for another worker's newer write): applied on
            // the newest snapshot as an overtaken task's are, its lane held meanwhile.
            // Before, a settled task's slot went here, its controls with it.
            let _ = self.overtaken_tx.send(r.id);
            return;
        }
        self.running.remove(&subject);
        if crate::publisher::settled(&slot.snap) {
            // The write that failed was its last: nothing more to run.
            self.slots.remove(&r.id);
            if let Some(q) = self.queues.get_mut(&subject) {
                q.retain(|id| *id != r.id);
            }
        }
        self.pump(&subject);
    }

    /// Holds an overtaken task's subject lane (no later task of the subject starts) and
    /// takes it up again after a pause, from the newest snapshot: if this worker is the one
    /// that lost its partition without knowing, it learns within its session timeout and
    /// gives the task up; if the other writer was, its writes have stopped by then.
    fn hold_overtaken(&mut self, id: TaskId, subject: String) {
        tracing::warn!(task = %id, pause_ms = self.overtaken_pause.as_millis() as u64, "task overtaken by another worker; taking it up again after a pause");
        self.env.metrics.overtaken();
        self.running.insert(subject.clone(), id);
        self.put_first(subject, id);
        send_after(self.overtaken_tx.clone(), self.overtaken_pause, id);
    }

    /// Puts `id` first in its subject's queue.
    fn put_first(&mut self, subject: String, id: TaskId) {
        let queue = self.queues.entry(subject).or_default();
        queue.retain(|q| *q != id);
        queue.push_front(id);
    }

    /// An overtaken task's pause is over: run it again, first in its subject, from the
    /// newest snapshot (nothing to run when that one is settled). Nothing to do when its
    /// partition was given up meanwhile.
    async fn on_overtaken_pause_over(&mut self, id: TaskId) {
        let Some(slot) = self.slots.get_mut(&id) else { return };
        let subject = slot.snap.subject.clone();
        if slot.ctl.is_some() || self.running.get(&subject) != Some(&id) || !self.owned.contains(&slot.snap.origin_partition) {
            return;
        }
        if let Some(newest) = self.view.get(&id).filter(|v| v.seq > slot.snap.seq) {
            tracing::info!(task = %id, seq = newest.seq, state = ?newest.state, by = %newest.worker, "taking an overtaken task up again from the newest snapshot");
            slot.snap = newest;
        }
        // The controls that came meanwhile, on the newest snapshot. Their records are
        // released for commit once their writes are durable; a control deferred again
        // holds its record again first.
        let deferred = std::mem::take(&mut slot.deferred);
        if !deferred.is_empty() {
            let mut pending = crate::publisher::Publisher::nothing();
            let mut failed = None;
            for d in &deferred {
                if let Err(e) = self.control(&d.env, id, d.trace.clone(), d.at, &mut pending) {
                    failed = Some(e);
                }
            }
            let events = pending.events().to_vec();
            if let Err(e) = pending.durable().await {
                failed = Some(e);
            }
            match failed {
                None => {
                    self.holds.release(deferred.iter().map(|d| d.at));
                }
                Some(e) => {
                    // The task pauses on these writes as on a runner's that failed: its
                    // newest snapshot (the controls applied) and their events are written
                    // again after a backoff, its lane held, and it runs once they are
                    // durable; the records stay held until then. Before, they stayed held
                    // until the partition went, and the task ran on, its controls' events
                    // never written.
                    tracing::error!(task = %id, error = %e, "a deferred control could not be written; writing the task's state again after a backoff");
                    self.env.metrics.state_write_failed();
                    let Some(slot) = self.slots.get_mut(&id) else { return };
                    slot.replayed.extend(deferred.iter().map(|d| d.at));
                    self.put_first(subject, id);
                    self.rewrite_later(id, Unwritten { events });
                    return;
                }
            }
        }
        let Some(slot) = self.slots.get_mut(&id) else { return };
        self.running.remove(&subject);
        if crate::publisher::settled(&slot.snap) {
            self.slots.remove(&id);
            if let Some(q) = self.queues.get_mut(&subject) {
                q.retain(|q| *q != id);
            }
        }
        self.pump(&subject);
    }

    /// Unsettled snapshots read from the topic: one of an owned partition that another
    /// worker wrote and that this worker does not hold is a *stray*, written by a former
    /// owner after this worker caught up and took the partition (a revert's Reverting
    /// landing late, say). Nobody would run it until the next rebalance; it is taken up
    /// after a pause, unless it moves on meanwhile (its writer still runs it, and stops
    /// once it learns it lost the partition).
    fn on_unsettled_read(&mut self) {
        for snap in self.view.take_unsettled_read() {
            let Ok(id) = snap.task_id.parse::<TaskId>() else { continue };
            if !self.is_stray(id, &snap) || self.strays.contains_key(&id) {
                continue;
            }
            tracing::warn!(task = %id, seq = snap.seq, state = ?snap.state, writer = %snap.worker, "an unsettled task of an owned partition written by another worker: taking it up after a pause unless it moves on");
            self.strays.insert(id, snap.seq);
            send_after(self.stray_tx.clone(), self.overtaken_pause, id);
        }
    }

    /// Whether `snap` (the newest of task `id`) is unsettled, of an owned partition,
    /// written by another worker and held by no slot here.
    fn is_stray(&self, id: TaskId, snap: &TaskSnapshot) -> bool {
        !crate::publisher::settled(snap)
            && !self.slots.contains_key(&id)
            && self.owned.contains(&snap.origin_partition)
            && snap.worker != self.env.publisher.worker()
    }

    /// A stray's pause is over: taken up from the newest snapshot when it is still
    /// unsettled, unheld, of an owned partition and at the seq seen before the pause.
    fn on_stray_pause_over(&mut self, id: TaskId) {
        let Some(seen) = self.strays.remove(&id) else { return };
        let Some(snap) = self.view.get(&id).filter(|s| self.is_stray(id, s)) else { return };
        if snap.seq != seen {
            // Still written by someone: look again after another pause.
            self.strays.insert(id, snap.seq);
            send_after(self.stray_tx.clone(), self.overtaken_pause, id);
            return;
        }
        tracing::warn!(task = %id, seq = snap.seq, state = ?snap.state, writer = %snap.worker, "taking up a stray task");
        let subject = snap.subject.clone();
        self.enqueue_task(id, snap);
        // First in its subject: accepted before any task queued there now.
        self.put_first(subject.clone(), id);
        self.pump(&subject);
    }

    /// Starts the next task of `subject` when none runs.
    fn pump(&mut self, subject: &str) {
        // A newer Ferry writes this kind's state: nothing starts here (the worker stops).
        if self.running.contains_key(subject) || self.view.is_outdated() {
            return;
        }
        let Some(queue) = self.queues.get_mut(subject) else { return };
        let mut overtaken = None;
        while let Some(id) = queue.pop_front() {
            let Some(slot) = self.slots.get_mut(&id) else { continue };
            // Never start a task of a partition this worker is giving up: its next owner
            // resumes the subject in order (starting it here ran it twice, out of order).
            if !self.owned.contains(&slot.snap.origin_partition) {
                continue;
            }
            // Written meanwhile by another worker (it takes itself for the owner too): do
            // not run it alongside; wait, then go on from the newest snapshot.
            if self.view.seq_of(&id).is_some_and(|seq| seq > slot.snap.seq) {
                overtaken = Some(id);
                break;
            }
            let (tx, rx) = mpsc::channel(16);
            slot.ctl = Some(tx);
            let fence = self.fences.child(slot.snap.origin_partition);
            slot.fence = Some(fence.clone());
            self.runs += 1;
            slot.run = self.runs;
            let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
            self.view.guard(id, self.runs, self.env.publisher.worker(), slot.snap.seq, fence.clone(), flag.clone());
            let runner = Runner::new(self.env.clone(), id, slot.snap.clone(), rx, self.done_tx.clone(), (fence, flag), self.runs);
            tokio::spawn(self.env.metrics.in_flight(&slot.snap).during(runner.run()));
            self.running.insert(subject.to_owned(), id);
            break;
        }
        if queue.is_empty() {
            self.queues.remove(subject);
        }
        if let Some(id) = overtaken {
            self.hold_overtaken(id, subject.to_owned());
        }
    }

    fn enqueue_task(&mut self, id: TaskId, snap: TaskSnapshot) {
        self.queues.entry(snap.subject.clone()).or_default().push_back(id);
        self.slots.insert(id, Slot { snap, ctl: None, fence: None, run: 0, deferred: Vec::new(), replayed: Vec::new() });
    }

    async fn on_batch(&mut self, items: Vec<Incoming>) -> Result<HashSet<i32>, PublishError> {
        let mut pending = crate::publisher::Publisher::nothing();
        let mut controls = Vec::new();
        let mut subjects = HashSet::new();
        let mut skipped = HashSet::new();
        let mut batch_partitions = HashSet::new();
        self.batch_keys.clear();
        for item in items {
            batch_partitions.insert(item.partition);
            if !self.owned.contains(&item.partition) {
                // Fetched just before a revoke; the new owner reads it again.
                skipped.insert(item.partition);
                continue;
            }
            match item.what {
                What::DeadLetter(dl) => pending.extend(self.env.publisher.enqueue_dead_letter(&dl)?),
                What::Reject { env, reason, dead } => {
                    if let Some(dl) = dead {
                        pending.extend(self.env.publisher.enqueue_dead_letter(&dl)?);
                    }
                    pending.extend(self.reject(&env, item.partition, item.offset, item.trace_parent, reason)?);
                }
                What::Start { env, id } => {
                    subjects.insert(env.subject.clone());
                    pending.extend(self.start(env, id, item.partition, item.offset, item.trace_parent)?);
                }
                What::Control { env, id } => {
                    subjects.insert(env.subject.clone());
                    let at = (item.partition, item.offset);
                    if let Some(wait) = self.control_noted(&env, id, item.trace_parent.clone(), at, &mut pending)? {
                        controls.push((env, id, item.trace_parent, at, wait));
                    }
                }
            }
        }
        if let Err(e) = pending.durable().await {
            // The assignment was lost meanwhile (its unacknowledged writes purged): the new
            // owner reads these records again; store none of their offsets.
            if batch_partitions.iter().all(|p| !self.fences.is_open(*p)) {
                tracing::warn!(error = %e, "a batch's writes failed after its partitions were lost; their next owner reads them again");
                self.undo_failed();
                return Ok(batch_partitions);
            }
            self.env.metrics.state_write_failed();
            self.env.metrics.batch_failed();
            return Err(e);
        }
        self.undo_kept();
        for (env, id, trace, at, wait) in controls {
            match wait.await {
                Ok(ControlReply::Handled) => continue,
                Ok(ControlReply::Refused(why)) => {
                    let mut refused = crate::publisher::Publisher::nothing();
                    refused.extend(self.event_only(&env, at, EventType::Rejected, trace, why)?);
                    refused.durable().await?;
                    continue;
                }
                _ => {}
            }
            // The runner handed its task back before it saw the control: take the task
            // back (its Done is already queued), then handle the control here.
            while let Ok(done) = self.done_rx.try_recv() {
                self.on_done(done);
            }
            let mut again = crate::publisher::Publisher::nothing();
            if let Some(wait) = self.control_noted(&env, id, trace, at, &mut again)? {
                let _ = wait.await;
            }
            again.durable().await?;
            self.undo_kept();
        }
        for s in subjects {
            self.pump(&s);
        }
        Ok(skipped)
    }

    fn new_snapshot(&self, env: &CommandEnvelope, id: TaskId, partition: i32, offset: i64, trace: Option<String>) -> TaskSnapshot {
        TaskSnapshot {
            task_id: id.to_string(),
            kind: env.kind,
            subject: env.subject.clone(),
            state: TaskState::Accepted,
            seq: 0,
            last_event: EventType::Accepted,
            idempotency_key: env.idempotency_key.clone(),
            requested_by: env.requested_by.clone(),
            origin_partition: partition,
            origin_offset: offset,
            created_at_ms: env.created_at_ms,
            updated_at_ms: now_ms(),
            deadline_ms: env.deadline_ms,
            keep_partial: env.keep_partial,
            worker: self.env.publisher.worker().to_owned(),
            trace_parent: trace,
            spec: env.spec.clone(),
            journal: Vec::new(),
            error: None,
            cancel_requested: false,
            revert_requested: false,
            signals: Vec::new(),
        }
    }

    fn reject(&self, env: &CommandEnvelope, partition: i32, offset: i64, trace: Option<String>, reason: String) -> Result<Pending, PublishError> {
        tracing::warn!(task = %env.task_id, kind = %env.kind, %reason, "command rejected");
        let Ok(id) = env.task_id.parse::<TaskId>() else {
            unreachable!("intake sends unparseable task ids to the dead-letter topic")
        };
        // An id derived from an idempotency key belongs to whoever holds the key: a command
        // that does not may not leave a snapshot under it (the key's own submission would
        // find it and end a duplicate of this rejection).
        let owns_id = !id.is_derived() || env.idempotency_key.as_deref().is_some_and(|k| id == TaskId::for_idempotency_key(env.kind, k));
        if env.action != CommandAction::Start || !owns_id || self.view.get(&id).is_some() || self.slots.contains_key(&id) {
            // A bad Cancel/Revert, a Start that reuses a live task's id or takes another's:
            // tell the tracker without touching that task's snapshot.
            return self.event_only(env, (partition, offset), EventType::Rejected, trace, reason);
        }
        let mut snap = self.new_snapshot(env, id, partition, offset, trace);
        snap.state = TaskState::Rejected;
        snap.spec = Bytes::default();
        snap.error = Some(crate::protocol::TaskError::new("REJECTED", reason.clone(), None, false));
        self.env
            .publisher
            .enqueue_transition(&mut snap, EventType::Rejected, Detail { code: Some("REJECTED".into()), ..Detail::default() }.message(reason))
    }

    /// Publishes a task's state again for a duplicate command, unless a runner holds the
    /// task: the slot's snapshot is the one the runner started from, and publishing it
    /// would put the task's state back to an older seq while the runner goes on (a crash
    /// then resumed it from there, running steps again). The runner's own next write says
    /// where it is.
    fn republish(&self, snap: &TaskSnapshot) -> Result<Pending, PublishError> {
        let running = snap.task_id.parse::<TaskId>().ok().and_then(|id| self.slots.get(&id)).is_some_and(|s| s.ctl.is_some());
        if running {
            return Ok(crate::publisher::Publisher::nothing());
        }
        self.env.publisher.enqueue_snapshot(snap)
    }

    /// An event that answers the command at `at` and leaves its task as it was: seq 0, its
    /// id made of the command ([`crate::publisher::cloudevent_id`]), so that the command
    /// read again answers with the same event.
    fn event_only(&self, env: &CommandEnvelope, at: (i32, i64), event: EventType, trace: Option<String>, message: String) -> Result<Pending, PublishError> {
        let d = Detail { code: Some("REJECTED".into()), ..Detail::default() }.message(message);
        let ev = d.into_event((&env.task_id, env.kind, &env.subject), 0, event, self.env.publisher.worker(), now_ms(), trace);
        let answers = Answered { partition: at.0, offset: at.1, created_at_ms: env.created_at_ms };
        self.env.publisher.enqueue_event(Outgoing { event: ev, answers: Some(answers) }, &env.requested_by)
    }

    fn start(&mut self, env: CommandEnvelope, id: TaskId, partition: i32, offset: i64, trace: Option<String>) -> Result<Pending, PublishError> {
        let existing = self.known(id).or_else(|| env.idempotency_key.as_deref().and_then(|k| self.by_key(k)));
        if let Some(snap) = existing {
            if snap.task_id == env.task_id {
                let reread = snap.origin_partition == partition && snap.origin_offset == offset;
                if reread && snap.seq == 1 && snap.last_event == EventType::Accepted && self.slots.get(&id).is_some_and(|s| s.ctl.is_none()) {
                    // Its batch's writes failed and the intake reads the same record again:
                    // make the Accepted write again, whole and identical (the event as well).
                    // A second command with the same id (another record) is a duplicate and
                    // only republishes the state: it must not add a second Accepted.
                    let ev = Detail::default().into_event((&snap.task_id, snap.kind, &snap.subject), 1, EventType::Accepted, self.env.publisher.worker(), snap.updated_at_ms, snap.trace_parent.clone());
                    return self.env.publisher.enqueue_accepted(&snap, &ev);
                }
                // A redelivered or resubmitted command: publish the task's state again.
                tracing::info!(task = %id, state = ?snap.state, "duplicate command; state republished");
                return self.republish(&snap);
            }
            let reason = format!(
                "duplicate of task {} (idempotency key {:?}), which is {:?}",
                snap.task_id,
                env.idempotency_key.as_deref().unwrap_or_default(),
                snap.state
            );
            let mut p = self.republish(&snap)?;
            p.extend(self.reject(&env, partition, offset, trace, reason)?);
            return Ok(p);
        }
        let mut snap = self.new_snapshot(&env, id, partition, offset, trace);
        let ev = self.env.publisher.advance(&mut snap, EventType::Accepted, Detail::default());
        let p = self.env.publisher.enqueue_accepted(&snap, &ev)?;
        if let Some(k) = &env.idempotency_key {
            self.batch_keys.entry(k.clone()).or_insert(id);
        }
        self.enqueue_task(id, snap);
        Ok(p)
    }

    /// The newest snapshot of a task this worker knows: its slot's or the view's, whichever
    /// is further. The view holds only acknowledged writes (not yet this batch's); a slot
    /// another worker overtook is older than the view.
    fn known(&self, id: TaskId) -> Option<TaskSnapshot> {
        let held = self.slots.get(&id).map(|s| &s.snap);
        match (held, self.view.get(&id)) {
            (Some(h), Some(v)) if v.seq > h.seq => Some(v),
            (Some(h), _) => Some(h.clone()),
            (None, v) => v,
        }
    }

    /// The task that first used an idempotency key: one this batch created (not in the
    /// view until the batch is durable), or the view's.
    fn by_key(&self, key: &str) -> Option<TaskSnapshot> {
        self.batch_keys.get(key).and_then(|id| self.slots.get(id)).map(|s| s.snap.clone()).or_else(|| self.view.by_key(key))
    }

    /// Why a Cancel or Revert may not act on its task, if it may not: a tenant acts only
    /// on its own tasks (another's is as unknown to it as a missing one), and every control
    /// names its task's subject (it travels on that subject's partition: with another, a
    /// worker that does not own the task would run it).
    fn control_refusal(&self, env: &CommandEnvelope, id: TaskId) -> Option<String> {
        // Kind, subject and requester never change in a task's life: any snapshot will do.
        let snap = self.known(id)?;
        if let Some(tenant) = env.requested_by.strip_prefix("tenant:")
            && snap.requested_by != env.requested_by
        {
            return Some(format!("tenant {tenant:?} has no {} task {id}", env.kind));
        }
        if snap.kind != env.kind {
            return Some(format!("task {id} is a {} task, not {}", snap.kind, env.kind));
        }
        if snap.subject != env.subject {
            return Some(format!(
                "task {id} acts on {:?}, not {:?}: a {:?} must name its task's subject",
                snap.subject, env.subject, env.action
            ));
        }
        None
    }

    /// [`Self::control`], noting first what it may change of a task this worker holds (not
    /// a running one: its runner makes its writes), for [`Self::undo_failed`].
    fn control_noted(
        &mut self,
        env: &CommandEnvelope,
        id: TaskId,
        trace: Option<String>,
        at: (i32, i64),
        pending: &mut Pending,
    ) -> Result<Option<oneshot::Receiver<ControlReply>>, PublishError> {
        let before = self.slots.get(&id).filter(|s| s.ctl.is_none()).map(|s| s.snap.clone());
        let held = self.slots.contains_key(&id);
        let r = self.control(env, id, trace, at, pending);
        match before {
            Some(snap) => {
                self.undo.snaps.entry(id).or_insert(snap);
            }
            None if !held && self.slots.contains_key(&id) => self.undo.created.push(id),
            None => {}
        }
        r
    }

    /// The batch's writes are durable: what it changed stands, and the replayed controls
    /// carried by the paused writes it made may be committed.
    fn undo_kept(&mut self) {
        let undo = std::mem::take(&mut self.undo);
        for (id, _) in undo.superseded {
            if let Some(slot) = self.slots.get_mut(&id) {
                self.holds.release(slot.replayed.drain(..));
            }
        }
    }

    /// The batch's writes failed: the tasks it changed are put back as they were (their
    /// snapshots, the tasks it took up dropped, the paused writes it took over paused again
    /// with their lanes), so that its records, read again, are applied once.
    fn undo_failed(&mut self) {
        let undo = std::mem::take(&mut self.undo);
        for (id, snap) in undo.snaps {
            if let Some(slot) = self.slots.get_mut(&id) {
                slot.snap = snap;
            }
        }
        for id in undo.created {
            if let Some(slot) = self.slots.remove(&id)
                && let Some(q) = self.queues.get_mut(&slot.snap.subject)
            {
                q.retain(|q| *q != id);
            }
        }
        for (id, write) in undo.superseded {
            let Some(slot) = self.slots.get(&id) else { continue };
            if slot.ctl.is_some() || !self.owned.contains(&slot.snap.origin_partition) {
                continue;
            }
            let subject = slot.snap.subject.clone();
            tracing::warn!(task = %id, "the batch that made a paused write failed; the task is paused on it again");
            self.running.insert(subject.clone(), id);
            self.put_first(subject, id);
            self.rewrite_later(id, write);
        }
    }

    /// Routes a Cancel or Revert. Returns the runner's reply to wait for when a runner
    /// has the task; otherwise the writes are added to `pending`.
    fn control(
        &mut self,
        env: &CommandEnvelope,
        id: TaskId,
        trace: Option<String>,
        at: (i32, i64),
        pending: &mut Pending,
    ) -> Result<Option<oneshot::Receiver<ControlReply>>, PublishError> {
        let revert = env.action == CommandAction::Revert;
        if let Some(reason) = self.control_refusal(env, id) {
            pending.extend(self.event_only(env, at, EventType::Rejected, trace, reason)?);
            return Ok(None);
        }
        if let Some(slot) = self.slots.get(&id)
            && slot.ctl.is_none()
            && let Some(seq) = self.view.seq_of(&id).filter(|seq| *seq > slot.snap.seq)
        {
            // Another worker wrote the task after this one took it up: one of the two lost
            // the partition without knowing yet. Acting on this older snapshot would write
            // under seqs the other already used (a queued task cancelled and reverted at
            // seq 3 and 5 after its owner's Reverted at 21, in the fault campaign). The
            // control waits with the task, which is taken up again (if this worker still
            // owns it then) from the newest snapshot (`on_overtaken_pause_over`); its record
            // is held uncommitted meanwhile, so that if the partition goes first its next
            // owner reads the control again (before, it was lost).
            tracing::warn!(task = %id, action = ?env.action, seq, held = slot.snap.seq, partition = at.0, offset = at.1, "control for a task another worker wrote since: deferred");
            // The same record read again (its batch's writes failed) is deferred once.
            if let Some(slot) = self.slots.get_mut(&id)
                && !slot.deferred.iter().any(|d| d.at == at)
            {
                self.holds.hold(at.0, at.1);
                slot.deferred.push(Deferred { env: env.clone(), trace, at });
            }
            return Ok(None);
        }
        if let Some(slot) = self.slots.get_mut(&id) {
            tracing::info!(task = %id, action = ?env.action, state = ?slot.snap.state, running = slot.ctl.is_some(), "control for a task this worker holds");
            if let Some(ctl) = &slot.ctl {
                let (reply, rx) = oneshot::channel();
                let c = match signal_of(env) {
                    Some(signal) => Control::Signal { signal, reply },
                    None if revert => Control::Revert { reply },
                    None => Control::Cancel { reply },
                };
                if ctl.try_send(c).is_ok() {
                    return Ok(Some(rx));
                }
                // The runner is gone or flooded: it has handed (or will hand) the task back.
                let (tx, rx) = oneshot::channel();
                let _ = tx.send(ControlReply::Finished);
                return Ok(Some(rx));
            }
            // Paused (its last write failed and waits for a retry): make that write now,
            // then the control's, in order; the retry then writes nothing, and the task
            // runs again once this batch is durable. Before, the control's write went
            // first and the retry's older snapshot landed after it.
            if let Some(paused) = self.unwritten.get(&id) {
                tracing::info!(task = %id, action = ?env.action, "control for a paused task: its paused write goes first");
                // Under the gate: the retry cannot queue its copy meanwhile. The pause is
                // given up only once the write is queued; if the producer refuses it, the
                // batch fails with the task still paused and its retry still on.
                let made = {
                    let mut gate = paused.superseded.lock().expect("gate lock");
                    let made = if paused.write.events.is_empty() {
                        self.env.publisher.enqueue_snapshot(&slot.snap)?
                    } else {
                        self.env.publisher.enqueue_write_all(&slot.snap, &paused.write.events)?
                    };
                    *gate = true;
                    made
                };
                pending.extend(made);
                // Replayed controls that paused with this write are durable with the batch
                // (`undo_kept`); if it fails, the pause is restored (`undo_failed`).
                if let Some(p) = self.unwritten.remove(&id) {
                    if let Some(r) = p.retry {
                        r.abort();
                    }
                    self.undo.superseded.push((id, p.write));
                }
                if self.running.get(&slot.snap.subject) == Some(&id) {
                    self.running.remove(&slot.snap.subject);
                }
            }
            // A Signal to a queued task: recorded for the step that will wait for it.
            if let Some(signal) = signal_of(env) {
                let message = signal.message();
                let outcome = if slot.snap.state.is_terminal() { Err(ended(&slot.snap)) } else { slot.snap.record_signal(signal) };
                let refused = match outcome {
                    Ok(true) => {
                        pending.extend(self.env.publisher.enqueue_transition(&mut slot.snap, EventType::Signalled, Detail::default().message(message))?);
                        None
                    }
                    Ok(false) => {
                        tracing::info!(task = %id, "signal already recorded (a redelivered command)");
                        None
                    }
                    Err(why) => Some(why),
                };
                if let Some(why) = refused {
                    pending.extend(self.event_only(env, at, EventType::Rejected, trace, why)?);
                }
                return Ok(None);
            }
            // Queued, not started yet (new, or resumed behind another task of its subject).
            let snap = &mut slot.snap;
            if matches!(snap.state, TaskState::Accepted | TaskState::Running) {
                snap.cancel_requested = true;
                snap.revert_requested |= revert;
                let d = if revert { Detail::default().message("revert requested") } else { Detail::default() };
                pending.extend(self.env.publisher.enqueue_transition(snap, EventType::CancelRequested, d)?);
            } else if revert && (snap.state.is_revertible() || snap.last_event == EventType::Reverting) {
                // Finished and queued (a revert before, a resume): the revert begins here,
                // under a new seq. Reverting already (queued, its undo not begun): a new
                // Reverting event, since the first may be one a failed batch never wrote.
                pending.extend(begin_revert(&self.env.publisher, snap)?);
            } else if revert {
                tracing::info!(task = %id, state = ?snap.state, "revert has nothing to do");
                pending.extend(self.env.publisher.enqueue_snapshot(snap)?);
            }
            return Ok(None);
        }
        match self.view.get(&id) {
            Some(snap) if snap.kind != self.env.handler.kind() => {
                pending.extend(self.event_only(env, at, EventType::Rejected, trace, format!("task {id} is a {} task, not {}", snap.kind, env.kind))?);
            }
            Some(snap) if env.action == CommandAction::Signal => {
                pending.extend(self.event_only(env, at, EventType::Rejected, trace, ended(&snap))?);
            }
            Some(mut snap) => {
                if revert && snap.state.is_revertible() {
                    tracing::info!(task = %id, state = ?snap.state, "revert of a finished task: Reverting, queued");
                    pending.extend(begin_revert(&self.env.publisher, &mut snap)?);
                    self.enqueue_task(id, snap);
                } else {
                    // Nothing to cancel or revert: say so by publishing the state again.
                    tracing::info!(task = %id, state = ?snap.state, action = ?env.action, "control has nothing to do");
                    pending.extend(self.env.publisher.enqueue_snapshot(&snap)?);
                }
            }
            None => {
                let reason = match env.requested_by.strip_prefix("tenant:") {
                    // Word for word what another tenant's task gets: no telling which exist.
                    Some(tenant) => format!("tenant {tenant:?} has no {} task {id}", env.kind),
                    None => format!("no {} task {id} is known", env.kind),
                };
                pending.extend(self.event_only(env, at, EventType::Rejected, trace, reason)?);
            }
        }
        Ok(None)
    }

    async fn on_assigned(&mut self, partitions: Vec<i32>) {
        let fresh: HashSet<i32> = partitions.into_iter().filter(|p| !self.owned.contains(p)).collect();
        self.owned.extend(fresh.iter().copied());
        if fresh.is_empty() {
            return;
        }
        self.fences.open(fresh.iter().copied());
        // The previous owner's last snapshots must be in the view before we resume.
        if let Err(e) = self.view.caught_up(Duration::from_secs(60)).await {
            tracing::error!(error = %e, "resuming from a task-state view that may be behind");
        }
        // The previous owner may have died between a final snapshot and its event:
        // publish recent final events again (same seq; readers dedupe by task and seq).
        let mut pending = crate::publisher::Publisher::nothing();
        for snap in self.view.settled_since(&fresh, now_ms() - REPUBLISH_WINDOW_MS) {
            let ev = final_event(&snap, self.env.publisher.worker());
            match self.env.publisher.enqueue_event(ev.into(), &snap.requested_by) {
                Ok(p) => pending.extend(p),
                Err(e) => tracing::warn!(task = %snap.task_id, error = %e, "final event not republished"),
            }
        }
        // Not awaited: the assignment callback holds the group's rebalance until it
        // returns, and nothing below depends on these records.
        tokio::spawn(async move {
            if let Err(e) = pending.durable().await {
                tracing::warn!(error = %e, "final events not republished");
            }
        });
        // Tasks of these partitions whose last record is older than their newest snapshot
        // (read while another worker owned them).
        self.write_newest_again(&fresh);
        let mut subjects = HashSet::new();
        for snap in self.view.unsettled(&fresh) {
            let Ok(id) = snap.task_id.parse::<TaskId>() else { continue };
            if let Some(slot) = self.slots.get(&id) {
                tracing::info!(task = %id, state = ?slot.snap.state, running = slot.ctl.is_some(), "not resumed: this worker holds the task already");
                continue;
            }
            tracing::info!(task = %id, state = ?snap.state, step = snap.journal.len(), "resuming task");
            subjects.insert(snap.subject.clone());
            self.enqueue_task(id, snap);
        }
        for s in subjects {
            self.pump(&s);
        }
    }

    /// Writes again the newest snapshot of each task of `partitions` whose last record on
    /// the task-state topic is older ([`StateView::stale_last`]): a former owner's write that
    /// was on the wire when it lost the partition can land after the new owner's, and a
    /// compacted topic keeps only a key's last record, so a restart would otherwise take the
    /// task up from the older state (running finished steps again, reusing seqs). Same seq
    /// and content as the newest: readers and the task's runner see nothing new.
    fn write_newest_again(&self, partitions: &HashSet<i32>) {
        let stale = self.view.stale_last(partitions);
        if stale.is_empty() {
            return;
        }
        let mut pending = crate::publisher::Publisher::nothing();
        for snap in stale {
            tracing::warn!(task = %snap.task_id, seq = snap.seq, "an older snapshot of the task landed after its newest: writing the newest again");
            match self.env.publisher.enqueue_snapshot(&snap) {
                Ok(p) => pending.extend(p),
                Err(e) => tracing::warn!(task = %snap.task_id, error = %e, "newest snapshot not written again"),
            }
        }
        tokio::spawn(async move {
            if let Err(e) = pending.durable().await {
                tracing::warn!(error = %e, "newest snapshots not written again");
            }
        });
    }

    async fn on_revoked(&mut self, partitions: &[i32], lost: bool) {
        let gone: HashSet<i32> = partitions.iter().copied().collect();
        // Given up first, so stopping a running task starts no queued task of its subject
        // (`pump` skips partitions not owned).
        for p in &gone {
            self.owned.remove(p);
        }
        let fence_gone = |slots: &HashMap<TaskId, Slot>| {
            for slot in slots.values().filter(|s| gone.contains(&s.snap.origin_partition)) {
                if let Some(f) = &slot.fence {
                    f.cancel();
                }
            }
        };
        if lost {
            // Another worker may already run these tasks: not one more write from here.
            tracing::warn!(partitions = ?partitions, "assignment lost (session expired): fencing its tasks at once");
            self.fences.close(partitions);
            fence_gone(&self.slots);
        }
        let mut waits = Vec::new();
        for slot in self.slots.values() {
            if !gone.contains(&slot.snap.origin_partition) {
                continue;
            }
            if let Some(ctl) = &slot.ctl {
                let (reply, rx) = oneshot::channel();
                if ctl.send(Control::Stop { grace: self.revoke_grace, reply }).await.is_ok() {
                    waits.push(rx);
                }
            }
        }
        let all = futures::future::join_all(waits);
        if tokio::time::timeout(self.revoke_grace + Duration::from_secs(5), all).await.is_err() {
            // A task that did not stop may hold a write stuck in the producer (a slow or
            // failing broker); once the partitions go, its next owner may read the task
            // before that write lands, and write the same seqs. Drop every unacknowledged
            // write, as the intake does for a lost assignment: the other tasks' writes fail
            // and are made again (identical); a record already on the wire may still land.
            tracing::error!(partitions = ?partitions, "tasks did not stop within the revoke grace period; fencing them and dropping unacknowledged writes");
            self.fences.close(partitions);
            fence_gone(&self.slots);
            self.env.publisher.purge_unacknowledged();
        }
        // Whatever did not stop (a write stuck in the producer, a step past its grace) is
        // fenced before the partitions go: it writes nothing more and drops its step.
        self.fences.close(partitions);
        fence_gone(&self.slots);
        while let Ok(done) = self.done_rx.try_recv() {
            self.on_done(done);
        }
        let ids: Vec<TaskId> = self
            .slots
            .iter()
            .filter(|(_, s)| gone.contains(&s.snap.origin_partition))
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            if let Some(slot) = self.slots.remove(&id) {
                // Deferred for a task another worker wrote: their records were held
                // uncommitted, so the partition's next owner reads them again.
                for d in &slot.deferred {
                    tracing::warn!(task = %id, action = ?d.env.action, partition = d.at.0, offset = d.at.1, "a deferred control goes with its partition; its next owner reads it again");
                }
                self.view.unguard(&id, slot.run);
                if self.running.get(&slot.snap.subject) == Some(&id) {
                    self.running.remove(&slot.snap.subject);
                }
            }
        }
        // What was stored under them is committed with the revoke; no hold outlives it.
        self.holds.clear(partitions);
        for q in self.queues.values_mut() {
            q.retain(|id| self.slots.contains_key(id));
        }
        self.queues.retain(|_, q| !q.is_empty());
        // A write made again after the next owner took the task over could overwrite its
        // newer snapshot: abort the retries of the tasks given up.
        self.unwritten.retain(|id, paused| {
            let keep = self.slots.contains_key(id);
            if let (false, Some(r)) = (keep, &paused.retry) {
                r.abort();
            }
            keep
        });
    }
}

/// The [`Signal`] a Signal command carries (`None` for other actions).
fn signal_of(env: &CommandEnvelope) -> Option<Signal> {
    (env.action == CommandAction::Signal).then(|| Signal {
        name: env.signal.clone().unwrap_or_default(),
        by: env.requested_by.clone(),
        at_ms: now_ms(),
        key: env.idempotency_key.clone(),
        reason: env.reason.clone(),
    })
}

/// Sends `id` on `tx` after `pause` (a held task's or a stray's pause).
fn send_after(tx: mpsc::UnboundedSender<TaskId>, pause: Duration, id: TaskId) {
    tokio::spawn(async move {
        tokio::time::sleep(pause).await;
        let _ = tx.send(id);
    });
}

/// A Revert of a finished task (or one whose revert is queued) begins its undo: the
/// `Reverting` transition is written with the control, under a new seq, as the runner
/// would write it first. Before, the control only set `revert_requested` on a snapshot of
/// the same seq, and any other record of that seq (a final state written again) could
/// take its place on the compacted topic and in every view: a Revert read, committed and
/// lost (the fault campaign, a reverted score task left Succeeded).
fn begin_revert(publisher: &crate::publisher::Publisher, snap: &mut TaskSnapshot) -> Result<Pending, PublishError> {
    snap.state = TaskState::Reverting;
    snap.revert_requested = false;
    publisher.enqueue_transition(snap, EventType::Reverting, Detail::default().message("revert requested"))
}

/// Why a Signal cannot reach `snap`'s task: it has ended.
fn ended(snap: &TaskSnapshot) -> String {
    format!("task {} has ended ({}): a signal reaches only a queued or running task", snap.task_id, snap.state.name())
}

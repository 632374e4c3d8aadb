//! Prometheus metrics of a worker: events by kind and type, step and task durations, tasks
//! in flight, retries, dead letters, consumer lag and the build.
//!
//! # Names
//! Every name has the `ferry_` prefix; `Metrics::with_one_sample_each` shows them all:
//! - `ferry_task_events_total{kind,event}`: progress events published.
//! - `ferry_step_duration_seconds{kind,step}`: step runs, retries included (10 ms to 2 h).
//! - `ferry_task_duration_seconds{kind,outcome}`: from the command's creation (the
//!   submitter's clock) to the task's final event, by that event (`Succeeded`, `Failed`,
//!   `Cancelled`, `Reverted`, `RevertFailed`, `Rejected`); 10 ms to 6 h.
//! - `ferry_tasks_in_flight{kind,state}`: tasks a runner of this worker holds, `state`
//!   `running` or `reverting`; and, `state="queued"`, tasks it accepted that wait for
//!   their subject's lane (another task of the subject runs) or a pause.
//! - `ferry_step_retries_total{kind,step}`, `ferry_dead_letters_total{topic}`.
//! - `ferry_consumer_lag_records{topic}`: command records not yet read.
//! - `ferry_build_info{version}`: always 1.
//! - The handler's own gauges ([`TaskHandler::gauges`](crate::TaskHandler::gauges)), e.g.
//!   `ferry_cluster_watches_failing{cluster}` of the workers that wait on clusters.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::gauges::GaugeFamily;
use crate::kind::TaskKind;
use crate::protocol::{EventType, ProgressEvent, TaskSnapshot, TaskState};

/// Upper bounds of the step-duration buckets, in seconds: a step that waits for a cluster
/// may take half an hour, so they reach 2 h.
pub const STEP_BUCKETS: [f64; 17] = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0];

/// Upper bounds of the task-duration buckets, in seconds: 10 ms to 6 h.
pub const TASK_BUCKETS: [f64; 19] =
    [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 21600.0];

/// The `state` label of `ferry_tasks_in_flight` for a task a runner holds.
fn in_flight_state(state: TaskState) -> &'static str {
    match state {
        TaskState::Reverting => "reverting",
        _ => "running",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabels {
    kind: String,
    event: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepLabels {
    kind: String,
    step: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    kind: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    kind: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TopicLabels {
    topic: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabels {
    version: String,
}

/// A task some runner holds: its gauge label, and how many runners hold it (a run given up
/// with its partition may still be ending when the partition comes back and a new run
/// starts).
struct Held {
    kind: TaskKind,
    state: &'static str,
    runners: i64,
}

/// What reads a handler's gauges at a scrape.
pub type GaugeSource = Box<dyn Fn() -> Vec<GaugeFamily> + Send + Sync>;

/// The handler's gauges, as a collector the registry calls at each scrape; empty until
/// [`Metrics::report_gauges`].
#[derive(Default)]
struct HandlerGauges(Arc<OnceLock<GaugeSource>>);

impl std::fmt::Debug for HandlerGauges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HandlerGauges")
    }
}

impl Collector for HandlerGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(read) = self.0.get() else { return Ok(()) };
        for family in read() {
            let mut metric = encoder.encode_descriptor(family.name, family.help, None, prometheus_client::metrics::MetricType::Gauge)?;
            for (labels, value) in &family.samples {
                ConstGauge::new(*value).encode(metric.encode_family(labels)?)?;
            }
        }
        Ok(())
    }
}

/// The metrics of one worker process.
pub struct Metrics {
    registry: Registry,
    events: Family<EventLabels, Counter>,
    step_seconds: Family<StepLabels, Histogram>,
    task_seconds: Family<OutcomeLabels, Histogram>,
    in_flight: Family<StateLabels, Gauge>,
    retries: Family<StepLabels, Counter>,
    dead_letters: Family<TopicLabels, Counter>,
    lag: Family<TopicLabels, Gauge>,
    overtaken: Counter,
    state_write_failures: Counter,
    /// The same count, for whoever waits until a write failed.
    state_write_failures_seen: watch::Sender<u64>,
    command_batch_failures: Counter,
    /// The same count, for whoever waits until a batch failed.
    command_batch_failures_seen: watch::Sender<u64>,
    /// The tasks runners hold, by task id: where a state change moves them between labels.
    held: Mutex<HashMap<String, Held>>,
    /// The number of tasks held, for whoever waits until the runners are done.
    held_total: watch::Sender<i64>,
    /// The number of tasks queued (`state="queued"`), for whoever waits on it.
    queued_total: watch::Sender<i64>,
    /// Where the handler's gauges are read from, once set.
    handler_gauges: Arc<OnceLock<GaugeSource>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("ferry");
        let events = Family::<EventLabels, Counter>::default();
        let step_seconds = Family::<StepLabels, Histogram>::new_with_constructor(|| Histogram::new(STEP_BUCKETS));
        let task_seconds = Family::<OutcomeLabels, Histogram>::new_with_constructor(|| Histogram::new(TASK_BUCKETS));
        let in_flight = Family::<StateLabels, Gauge>::default();
        let retries = Family::<StepLabels, Counter>::default();
        let dead_letters = Family::<TopicLabels, Counter>::default();
        let lag = Family::<TopicLabels, Gauge>::default();
        let overtaken = Counter::default();
        let state_write_failures = Counter::default();
        let command_batch_failures = Counter::default();
        let build = Family::<VersionLabels, Gauge>::default();
        build.get_or_create(&VersionLabels { version: env!("CARGO_PKG_VERSION").to_owned() }).set(1);
        registry.register("task_events", "Task progress events published, by kind and event", events.clone());
        registry.register("step_duration_seconds", "Duration of step runs, retries included", step_seconds.clone());
        registry.register(
            "task_duration_seconds",
            "Time from a command's creation to its task's final event, by kind and final event",
            task_seconds.clone(),
        );
        registry.register("tasks_in_flight", "Tasks of this worker by kind and state: held by a runner (running, reverting) or waiting for their subject's lane (queued)", in_flight.clone());
        registry.register("step_retries", "Transient step failures that were retried", retries.clone());
        registry.register("dead_letters", "Records sent to the dead-letter topic, by source topic", dead_letters.clone());
        registry.register("consumer_lag_records", "Command records not yet read, by topic", lag.clone());
        registry.register(
            "tasks_overtaken",
            "Runs stopped because another worker wrote their task (two workers took themselves for its owner)",
            overtaken.clone(),
        );
        registry.register(
            "state_write_failures",
            "Task state writes (a snapshot and its events) the broker did not acknowledge while the worker owned the task; each is made again after a backoff, the task waiting meanwhile",
            state_write_failures.clone(),
        );
        registry.register(
            "command_batch_failures",
            "Batches of commands whose writes the broker did not acknowledge: undone in the worker's memory and read again after a backoff",
            command_batch_failures.clone(),
        );
        registry.register("build_info", "The worker's version (always 1)", build);
        let handler_gauges = HandlerGauges::default();
        let gauges_source = handler_gauges.0.clone();
        registry.register_collector(Box::new(handler_gauges));
        Self {
            registry,
            events,
            step_seconds,
            task_seconds,
            in_flight,
            retries,
            dead_letters,
            lag,
            overtaken,
            state_write_failures,
            state_write_failures_seen: watch::Sender::new(0),
            command_batch_failures,
            command_batch_failures_seen: watch::Sender::new(0),
            held: Mutex::default(),
            held_total: watch::Sender::new(0),
            queued_total: watch::Sender::new(0),
            handler_gauges: gauges_source,
        }
    }

    /// Exports the gauges `read` returns at each scrape (the handler's,
    /// [`TaskHandler::gauges`](crate::TaskHandler::gauges)); only the first source counts.
    pub fn report_gauges(&self, read: GaugeSource) {
        if self.handler_gauges.set(read).is_err() {
            tracing::warn!("a second source of handler gauges ignored");
        }
    }

    /// Counts a task's event as it is written with its snapshot: the event, the task's
    /// duration when the event is final, and the move of a held task between `running`
    /// and `reverting`.
    pub(crate) fn written(&self, snap: &TaskSnapshot, ev: &ProgressEvent) {
        self.events
            .get_or_create(&EventLabels { kind: snap.kind.to_string(), event: ev.event.name().to_owned() })
            .inc();
        if ev.event.is_final() {
            let took = Duration::from_millis(ev.at_ms.saturating_sub(snap.created_at_ms).max(0) as u64);
            self.task_finished(snap.kind, ev.event, took);
        }
        if snap.state.is_terminal() {
            // The run is ending: it leaves the gauge when its runner does.
            return;
        }
        let mut held = self.held.lock().expect("metrics lock");
        if let Some(h) = held.get_mut(&snap.task_id) {
            let state = in_flight_state(snap.state);
            if state != h.state {
                self.gauge(h.kind, h.state).dec_by(h.runners);
                self.gauge(h.kind, state).inc_by(h.runners);
                h.state = state;
            }
        }
    }

    /// The gauge of the tasks this worker holds without a runner (`state="queued"`).
    pub(crate) fn queued(&self, kind: TaskKind) -> Gauge {
        self.gauge(kind, "queued")
    }

    /// Sets that gauge ([`Self::queued`]) and tells whoever waits on [`Self::tasks_queued`].
    pub(crate) fn set_queued(&self, gauge: &Gauge, queued: i64) {
        gauge.set(queued);
        self.queued_total.send_if_modified(|n| std::mem::replace(n, queued) != queued);
    }

    fn gauge(&self, kind: TaskKind, state: &str) -> Gauge {
        self.in_flight.get_or_create_owned(&StateLabels { kind: kind.to_string(), state: state.to_owned() })
    }

    fn task_finished(&self, kind: TaskKind, outcome: EventType, took: Duration) {
        self.task_seconds
            .get_or_create(&OutcomeLabels { kind: kind.to_string(), outcome: format!("{outcome:?}") })
            .observe(took.as_secs_f64());
    }

    /// Counts the task in `ferry_tasks_in_flight` while the returned guard lives (the
    /// scheduler keeps it with the task's runner).
    pub(crate) fn in_flight(self: &Arc<Self>, snap: &TaskSnapshot) -> InFlight {
        let state = in_flight_state(snap.state);
        {
            let mut held = self.held.lock().expect("metrics lock");
            let h = held.entry(snap.task_id.clone()).or_insert(Held { kind: snap.kind, state, runners: 0 });
            h.runners += 1;
            self.gauge(h.kind, h.state).inc();
        }
        self.held_total.send_modify(|n| *n += 1);
        InFlight { metrics: self.clone(), task: snap.task_id.clone() }
    }

    fn release(&self, task: &str) {
        {
            let mut held = self.held.lock().expect("metrics lock");
            let Some(h) = held.get_mut(task) else { return };
            h.runners -= 1;
            self.gauge(h.kind, h.state).dec();
            if h.runners == 0 {
                held.remove(task);
            }
        }
        self.held_total.send_modify(|n| *n -= 1);
    }

    /// The number of tasks runners of this worker hold, as it changes (runners start and
    /// end): what `ferry_tasks_in_flight` adds up to.
    pub fn tasks_in_flight(&self) -> watch::Receiver<i64> {
        self.held_total.subscribe()
    }

    /// The number of tasks this worker holds without a runner, as it changes: what
    /// `ferry_tasks_in_flight{state="queued"}` says.
    pub fn tasks_queued(&self) -> watch::Receiver<i64> {
        self.queued_total.subscribe()
    }

    pub(crate) fn step_finished(&self, kind: TaskKind, step: &str, took: Duration) {
        self.step_seconds
            .get_or_create(&StepLabels { kind: kind.to_string(), step: step.to_owned() })
            .observe(took.as_secs_f64());
    }

    pub(crate) fn retry(&self, kind: TaskKind, step: &str) {
        self.retries.get_or_create(&StepLabels { kind: kind.to_string(), step: step.to_owned() }).inc();
    }

    pub(crate) fn dead_letter(&self, topic: &str) {
        self.dead_letters.get_or_create(&TopicLabels { topic: topic.to_owned() }).inc();
    }

    pub(crate) fn overtaken(&self) {
        self.overtaken.inc();
    }

    pub(crate) fn state_write_failed(&self) {
        self.state_write_failures.inc();
        self.state_write_failures_seen.send_modify(|n| *n += 1);
    }

    /// The number of task state writes that failed so far, as it changes (what
    /// `ferry_state_write_failures_total` says).
    pub fn state_write_failures(&self) -> watch::Receiver<u64> {
        self.state_write_failures_seen.subscribe()
    }

    pub(crate) fn batch_failed(&self) {
        self.command_batch_failures.inc();
        self.command_batch_failures_seen.send_modify(|n| *n += 1);
    }

    /// The number of command batches whose writes failed so far, as it changes (what
    /// `ferry_command_batch_failures_total` says).
    pub fn command_batch_failures(&self) -> watch::Receiver<u64> {
        self.command_batch_failures_seen.subscribe()
    }

    pub(crate) fn set_lag(&self, topic: &str, lag: i64) {
        self.lag.get_or_create(&TopicLabels { topic: topic.to_owned() }).set(lag);
    }

    /// Metrics with one sample in every family, so the exposition shows every name (for
    /// checking dashboards against what workers export).
    pub fn with_one_sample_each() -> Self {
        let m = Self::new();
        m.events.get_or_create(&EventLabels { kind: TaskKind::TEST.to_string(), event: format!("{:?}", EventType::Succeeded) }).inc();
        m.step_finished(TaskKind::TEST, "step", Duration::from_millis(1));
        m.task_finished(TaskKind::TEST, EventType::Succeeded, Duration::from_millis(1));
        m.gauge(TaskKind::TEST, "running").set(0);
        m.retry(TaskKind::TEST, "step");
        m.dead_letter("topic");
        m.set_lag("topic", 0);
        m.overtaken();
        m.state_write_failed();
        m.batch_failed();
        m
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String");
        out
    }
}

/// A task counted in `ferry_tasks_in_flight`; dropping it (its runner ended, or was
/// dropped) takes the task out.
pub(crate) struct InFlight {
    metrics: Arc<Metrics>,
    task: String,
}

impl InFlight {
    /// Runs `f` with the task counted, until `f` ends.
    pub(crate) async fn during<F: std::future::Future>(self, f: F) -> F::Output {
        let out = f.await;
        drop(self);
        out
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.metrics.release(&self.task);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Bytes;

    fn snapshot(id: &str, state: TaskState, created_at_ms: i64) -> TaskSnapshot {
        TaskSnapshot {
            task_id: id.to_owned(),
            kind: TaskKind::TEST,
            subject: "s".into(),
            state,
            seq: 1,
            last_event: EventType::Accepted,
            idempotency_key: None,
            requested_by: "me".into(),
            origin_partition: 0,
            origin_offset: 0,
            created_at_ms,
            updated_at_ms: created_at_ms,
            deadline_ms: None,
            keep_partial: false,
            worker: "w".into(),
            trace_parent: None,
            spec: Bytes::default(),
            journal: Vec::new(),
            error: None,
            cancel_requested: false,
            revert_requested: false,
            signals: Vec::new(),
        }
    }

    fn event(snap: &TaskSnapshot, event: EventType, at_ms: i64) -> ProgressEvent {
        crate::publisher::Detail::default().into_event((&snap.task_id, snap.kind, &snap.subject), snap.seq, event, "w", at_ms, None)
    }

    /// The `le` bounds of one histogram series in the exposition.
    fn bounds(text: &str, series: &str) -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with(&format!("{series}_bucket{{")))
            .filter_map(|l| l.split("le=\"").nth(1).and_then(|r| r.split('"').next()).map(str::to_owned))
            .collect()
    }

    #[test]
    fn every_family_is_exposed_under_its_name() {
        let text = Metrics::with_one_sample_each().encode();
        let types: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).collect();
        for t in [
            "ferry_task_events counter",
            "ferry_step_duration_seconds histogram",
            "ferry_task_duration_seconds histogram",
            "ferry_tasks_in_flight gauge",
            "ferry_step_retries counter",
            "ferry_dead_letters counter",
            "ferry_consumer_lag_records gauge",
            "ferry_state_write_failures counter",
            "ferry_command_batch_failures counter",
            "ferry_build_info gauge",
        ] {
            assert!(types.contains(&t), "{t} missing: {types:?}");
        }
        let build = format!("ferry_build_info{{version=\"{}\"}} 1", env!("CARGO_PKG_VERSION"));
        assert!(text.lines().any(|l| l == build), "{text}");
        assert!(text.contains(r#"ferry_consumer_lag_records{topic="topic"} 0"#), "{text}");
    }

    #[test]
    fn step_buckets_reach_two_hours_and_task_buckets_ten_ms_to_six_hours() {
        let text = Metrics::with_one_sample_each().encode();
        let step = bounds(&text, "ferry_step_duration_seconds");
        assert_eq!(step.first().map(String::as_str), Some("0.01"), "{step:?}");
        assert!(step.iter().any(|b| b == "7200.0"), "{step:?}");
        assert_eq!(step.last().map(String::as_str), Some("+Inf"));
        let task = bounds(&text, "ferry_task_duration_seconds");
        assert_eq!(task.first().map(String::as_str), Some("0.01"), "{task:?}");
        assert_eq!(task[task.len() - 2], "21600.0", "{task:?}");
        assert!(text.contains(r#"ferry_task_duration_seconds_bucket{le="0.01",kind="test",outcome="Succeeded"} 1"#), "{text}");
    }

    #[test]
    fn a_half_hour_step_lands_below_the_top_bucket() {
        let m = Metrics::new();
        m.step_finished(TaskKind::TEST, "wait", Duration::from_secs(30 * 60));
        let text = m.encode();
        assert!(text.contains(r#"ferry_step_duration_seconds_bucket{le="1800.0",kind="test",step="wait"} 1"#), "{text}");
        assert!(text.contains(r#"ferry_step_duration_seconds_bucket{le="600.0",kind="test",step="wait"} 0"#), "{text}");
    }

    #[test]
    fn final_events_time_the_task_by_outcome() {
        let m = Metrics::new();
        let snap = snapshot("t1", TaskState::Succeeded, 1_000);
        m.written(&snap, &event(&snap, EventType::StepSucceeded, 2_000));
        m.written(&snap, &event(&snap, EventType::Succeeded, 4_000));
        let failed = snapshot("t2", TaskState::Rejected, 1_000);
        m.written(&failed, &event(&failed, EventType::Rejected, 1_020));
        let text = m.encode();
        assert!(text.contains(r#"ferry_task_duration_seconds_sum{kind="test",outcome="Succeeded"} 3.0"#), "{text}");
        assert!(text.contains(r#"ferry_task_duration_seconds_count{kind="test",outcome="Succeeded"} 1"#), "{text}");
        assert!(text.contains(r#"ferry_task_duration_seconds_bucket{le="0.01",kind="test",outcome="Rejected"} 0"#), "{text}");
        assert!(text.contains(r#"ferry_task_duration_seconds_bucket{le="0.05",kind="test",outcome="Rejected"} 1"#), "{text}");
        assert!(text.contains(r#"ferry_task_events_total{kind="test",event="StepSucceeded"} 1"#), "{text}");
        assert!(!text.contains(r#"outcome="StepSucceeded""#), "only final events time a task: {text}");
    }

    #[test]
    fn a_held_task_moves_from_running_to_reverting_and_leaves_with_its_runner() {
        let m = Arc::new(Metrics::new());
        let total = m.tasks_in_flight();
        let mut snap = snapshot("t1", TaskState::Accepted, 0);
        let guard = m.in_flight(&snap);
        assert_eq!(*total.borrow(), 1);
        assert!(m.encode().contains(r#"ferry_tasks_in_flight{kind="test",state="running"} 1"#));
        snap.state = TaskState::Reverting;
        m.written(&snap, &event(&snap, EventType::Reverting, 1));
        let text = m.encode();
        assert!(text.contains(r#"ferry_tasks_in_flight{kind="test",state="running"} 0"#), "{text}");
        assert!(text.contains(r#"ferry_tasks_in_flight{kind="test",state="reverting"} 1"#), "{text}");
        snap.state = TaskState::Reverted;
        m.written(&snap, &event(&snap, EventType::Reverted, 2));
        assert!(m.encode().contains(r#"ferry_tasks_in_flight{kind="test",state="reverting"} 1"#), "held until the runner ends");
        drop(guard);
        let text = m.encode();
        assert!(text.contains(r#"ferry_tasks_in_flight{kind="test",state="reverting"} 0"#), "{text}");
        assert_eq!(*total.borrow(), 0);
        // A task no runner holds is not counted by its writes.
        let other = snapshot("t2", TaskState::Running, 0);
        m.written(&other, &event(&other, EventType::StepStarted, 1));
        assert!(m.encode().contains(r#"ferry_tasks_in_flight{kind="test",state="running"} 0"#));
    }

    /// A handler's gauges are read at each scrape: a family without samples still has
    /// its `# TYPE` line (alerts may name it), and each sample its labels.
    #[test]
    fn a_handlers_gauges_are_read_at_each_scrape() {
        let m = Metrics::new();
        assert!(!m.encode().contains("cluster_watches_failing"), "no source yet");
        let failing = Arc::new(std::sync::atomic::AtomicI64::new(0));
        let read = failing.clone();
        m.report_gauges(Box::new(move || {
            let n = read.load(std::sync::atomic::Ordering::SeqCst);
            let samples = if n == 0 { Vec::new() } else { vec![(vec![("cluster", "member-1".to_owned())], n)] };
            vec![GaugeFamily { name: "cluster_watches_failing", help: "Failing watches", samples }]
        }));
        let text = m.encode();
        assert!(text.contains("# TYPE ferry_cluster_watches_failing gauge\n") && !text.contains("ferry_cluster_watches_failing{"), "{text}");
        failing.store(2, std::sync::atomic::Ordering::SeqCst);
        let text = m.encode();
        assert!(text.contains("ferry_cluster_watches_failing{cluster=\"member-1\"} 2\n"), "{text}");
        assert!(text.trim_end().ends_with("# EOF"), "{text}");
    }
}

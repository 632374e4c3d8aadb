//! Prometheus metrics of a worker: events by kind and type, step durations, retries,
//! dead letters, and consumer lag.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::kind::TaskKind;
use crate::protocol::EventType;

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
struct TopicLabels {
    topic: String,
}

/// The metrics of one worker process.
pub struct Metrics {
    registry: Registry,
    events: Family<EventLabels, Counter>,
    step_seconds: Family<StepLabels, Histogram>,
    retries: Family<StepLabels, Counter>,
    dead_letters: Family<TopicLabels, Counter>,
    lag: Family<TopicLabels, Gauge>,
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
        let step_seconds =
            Family::<StepLabels, Histogram>::new_with_constructor(|| Histogram::new(exponential_buckets(0.005, 2.0, 16)));
        let retries = Family::<StepLabels, Counter>::default();
        let dead_letters = Family::<TopicLabels, Counter>::default();
        let lag = Family::<TopicLabels, Gauge>::default();
        registry.register("task_events", "Task progress events published, by kind and event", events.clone());
        registry.register("step_duration_seconds", "Duration of step runs, retries included", step_seconds.clone());
        registry.register("step_retries", "Transient step failures that were retried", retries.clone());
        registry.register("dead_letters", "Records sent to the dead-letter topic, by source topic", dead_letters.clone());
        registry.register("consumer_lag", "Command records not yet read, by topic", lag.clone());
        Self { registry, events, step_seconds, retries, dead_letters, lag }
    }

    pub(crate) fn event(&self, kind: TaskKind, event: EventType) {
        self.events
            .get_or_create(&EventLabels { kind: kind.to_string(), event: format!("{event:?}") })
            .inc();
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

    pub(crate) fn set_lag(&self, topic: &str, lag: i64) {
        self.lag.get_or_create(&TopicLabels { topic: topic.to_owned() }).set(lag);
    }

    /// Metrics with one sample in every family, so the exposition shows every name (for
    /// checking dashboards against what workers export).
    pub fn with_one_sample_each() -> Self {
        let m = Self::new();
        m.event(TaskKind::Test, EventType::Succeeded);
        m.step_finished(TaskKind::Test, "step", Duration::from_millis(1));
        m.retry(TaskKind::Test, "step");
        m.dead_letter("topic");
        m.set_lag("topic", 0);
        m
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String");
        out
    }
}

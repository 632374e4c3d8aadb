//! Test fixtures: a real Kafka-protocol broker (the embedded mock cluster or a tansu
//! process) with Ferry's topics, and workers of the `test` kind running against it.
#![allow(dead_code)]

use std::time::Duration;

use ferry_runtime::testkind::{TestHandler, TestTaskSpec};
use ferry_runtime::{Client, EmbeddedBroker, EventType, KafkaConfig, ProgressEvent, SubmitOptions, TaskId, TaskKind, Topics, Worker, WorkerOptions};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub const WAIT: Duration = Duration::from_secs(60);

/// A second kind beside `test` (no worker crate is linked here): its topics exist, and
/// records of it are another kind's for the runtime.
pub const OTHER_KIND: TaskKind = TaskKind::new("other");
ferry_runtime::register_kind!(ferry_runtime::kind::KindInfo {
    describe: "a second kind for the runtime's tests",
    encode: ferry_runtime::kind::encode_json::<TestTaskSpec>,
    ..ferry_runtime::kind::KindInfo::bare(OTHER_KIND)
});

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .with_test_writer()
        .try_init();
}

/// A broker for one test, stopped on drop.
pub struct TestBroker {
    pub kafka: KafkaConfig,
    pub topics: Topics,
    pub embedded: Option<EmbeddedBroker>,
    tansu: Option<ferry_runtime::tansu::Tansu>,
}

impl TestBroker {
    /// librdkafka's mock cluster, 3 brokers, in this process.
    pub fn embedded() -> Self {
        init_tracing();
        let topics = Topics::standard();
        let b = EmbeddedBroker::start(3, &topics).expect("embedded broker");
        Self { kafka: KafkaConfig::for_embedded(b.bootstrap()), topics, embedded: Some(b), tansu: None }
    }

    /// A tansu broker process on a free loopback port, topics created through the admin API.
    pub async fn tansu() -> Self {
        init_tracing();
        let topics = Topics::standard();
        let t = ferry_runtime::tansu::Tansu::start(&topics).await.unwrap_or_else(|e| panic!("{e}"));
        Self { kafka: t.kafka(), topics, embedded: None, tansu: Some(t) }
    }

    pub fn client(&self) -> Client {
        Client::new(self.kafka.clone(), self.topics.clone()).unwrap()
    }

    pub fn worker_options(&self) -> WorkerOptions {
        let mut o = WorkerOptions::new(self.kafka.clone());
        o.topics = self.topics.clone();
        o.revoke_grace = Duration::from_secs(2);
        o.shutdown_grace = Duration::from_secs(2);
        o
    }

    /// Starts a `test` worker; cancel the token to stop it gracefully.
    pub fn spawn_worker(&self, opts: WorkerOptions) -> (CancellationToken, JoinHandle<()>) {
        self.spawn_worker_recording(opts, None)
    }

    /// [`Self::spawn_worker`], its steps recording their runs in the effect log `effects`.
    pub fn spawn_worker_recording(&self, opts: WorkerOptions, effects: Option<&std::path::Path>) -> (CancellationToken, JoinHandle<()>) {
        let token = CancellationToken::new();
        let effects = effects.map(|p| ferry_runtime::effects::EffectLog::new(p, opts.worker_id.clone()));
        let handler = TestHandler { min_delay: Some(Duration::from_millis(10)), effects };
        let t = token.clone();
        let h = tokio::spawn(async move { Worker::new(opts, handler).run(t).await.expect("worker failed") });
        (token, h)
    }
}

pub async fn submit(client: &Client, subject: &str, spec: &TestTaskSpec) -> TaskId {
    client.submit(TaskKind::TEST, subject, spec, SubmitOptions::default()).await.unwrap()
}

/// The events of `id` until a final one, in arrival order.
pub async fn until_final(events: &mut ferry_runtime::EventStream, id: TaskId) -> Vec<ProgressEvent> {
    events.until(id, WAIT, |e| e.event.is_final()).await.unwrap_or_else(|e| panic!("{e}"))
}

pub async fn until_event(events: &mut ferry_runtime::EventStream, id: TaskId, event: EventType) -> Vec<ProgressEvent> {
    events.until(id, WAIT, |e| e.event == event).await.unwrap_or_else(|e| panic!("{e}"))
}

pub fn types(evs: &[ProgressEvent]) -> Vec<EventType> {
    evs.iter().map(|e| e.event).collect()
}

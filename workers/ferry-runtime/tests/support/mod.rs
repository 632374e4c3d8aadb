//! Test fixtures: a real Kafka-protocol broker (the embedded mock cluster or a tansu
//! process) with Ferry's topics, and workers of the `test` kind running against it.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ferry_runtime::testkind::{TestHandler, TestTaskSpec};
use ferry_runtime::{Client, EmbeddedBroker, EventType, KafkaConfig, ProgressEvent, SubmitOptions, TaskId, TaskKind, Topics, Worker, WorkerOptions};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub const WAIT: Duration = Duration::from_secs(60);

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
    tansu: Option<Child>,
}

impl Drop for TestBroker {
    fn drop(&mut self) {
        if let Some(c) = &mut self.tansu {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn tansu_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("FERRY_TANSU") {
        return Some(PathBuf::from(p));
    }
    let cache = std::env::var_os("FERRY_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/ferry"));
    let p = cache.join("tansu-0.6.0/bin/tansu");
    p.exists().then_some(p)
}

impl TestBroker {
    /// librdkafka's mock cluster, 3 brokers, in this process.
    pub fn embedded() -> Self {
        init_tracing();
        let topics = Topics::standard();
        let b = EmbeddedBroker::start(3, &topics).expect("embedded broker");
        Self { kafka: KafkaConfig::plaintext(b.bootstrap()), topics, embedded: Some(b), tansu: None }
    }

    /// A tansu broker process on a free loopback port, topics created through the admin API.
    pub async fn tansu() -> Self {
        init_tracing();
        let bin = tansu_binary().expect("tansu is not installed: run scripts/install-tansu.sh (CI does)");
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let url = format!("tcp://127.0.0.1:{port}");
        let child = Command::new(bin)
            .args(["broker", "--listener-url", &url, "--advertised-listener-url", &url, "--storage-engine", "memory://tansu/"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start tansu");
        let kafka = KafkaConfig::plaintext(format!("127.0.0.1:{port}"));
        let topics = Topics::standard();
        let broker = Self { kafka, topics, embedded: None, tansu: Some(child) };
        broker.create_topics().await;
        broker
    }

    async fn create_topics(&self) {
        let admin: AdminClient<DefaultClientContext> = self.kafka.client().create().unwrap();
        let new: Vec<NewTopic> = self
            .topics
            .all()
            .iter()
            .map(|d| NewTopic::new(&d.name, d.partitions, TopicReplication::Fixed(1)))
            .collect();
        // The broker may still be starting: the admin request retries until it answers.
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))).request_timeout(Some(Duration::from_secs(30)));
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            match admin.create_topics(&new, &opts).await {
                Ok(results) if results.iter().all(|r| r.is_ok()) => return,
                Ok(results) => panic!("creating topics on tansu: {results:?}"),
                Err(e) if tokio::time::Instant::now() < deadline => {
                    tracing::debug!(error = %e, "tansu not answering yet");
                    tokio::task::yield_now().await;
                }
                Err(e) => panic!("tansu never answered: {e}"),
            }
        }
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
        let token = CancellationToken::new();
        let handler = TestHandler { min_delay: Some(Duration::from_millis(10)) };
        let t = token.clone();
        let h = tokio::spawn(async move { Worker::new(opts, handler).run(t).await.expect("worker failed") });
        (token, h)
    }
}

pub async fn submit(client: &Client, subject: &str, spec: &TestTaskSpec) -> TaskId {
    client.submit(TaskKind::Test, subject, spec, SubmitOptions::default()).await.unwrap()
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

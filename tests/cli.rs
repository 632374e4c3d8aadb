//! The `ferry` CLI contract against the embedded broker: `submit --wait` exit codes, JSON
//! output that parses, `tasks get|list|cancel|revert`.

use std::time::Duration;

use ferry_runtime::testkind::TestHandler;
use ferry_runtime::{Client, EmbeddedBroker, EventType, KafkaConfig, TaskId, Topics, Worker, WorkerOptions};
use tokio_util::sync::CancellationToken;

struct Env {
    bootstrap: String,
    client: Client,
    dir: tempfile::TempDir,
    stop: CancellationToken,
    worker: Option<tokio::task::JoinHandle<Result<(), ferry_runtime::WorkerError>>>,
    // Dropped last: the worker must be stopped before its broker goes away.
    _broker: EmbeddedBroker,
}

async fn env() -> Env {
    let topics = Topics::standard();
    let broker = EmbeddedBroker::start(1, &topics).unwrap();
    let bootstrap = broker.bootstrap();
    let kafka = KafkaConfig::for_embedded(bootstrap.clone());
    let mut opts = WorkerOptions::new(kafka.clone());
    opts.shutdown_grace = Duration::from_secs(1);
    let stop = CancellationToken::new();
    let handler = TestHandler { min_delay: Some(Duration::from_millis(10)), effects: None };
    let worker = tokio::spawn(Worker::new(opts, handler).run(stop.clone()));
    let client = Client::new(kafka, topics).unwrap();
    Env { bootstrap, client, dir: tempfile::tempdir().unwrap(), stop, worker: Some(worker), _broker: broker }
}

impl Env {
    /// Stops the worker gracefully while its broker still runs.
    async fn shutdown(mut self) {
        self.stop.cancel();
        if let Some(w) = self.worker.take() {
            w.await.unwrap().unwrap();
        }
    }
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Env {
    async fn ferry(&self, args: &[&str]) -> Out {
        let o = tokio::process::Command::new(env!("CARGO_BIN_EXE_ferry"))
            .args(args)
            .args(["--brokers", &self.bootstrap, "--kafka-property", "fetch.wait.max.ms=5"])
            .env("RUST_LOG", "error")
            .output()
            .await
            .unwrap();
        Out {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }

    fn spec(&self, name: &str, body: &str) -> String {
        let p = self.dir.path().join(name);
        std::fs::write(&p, body).unwrap();
        p.display().to_string()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_wait_exit_codes_and_json_output() {
    let env = env().await;
    let ok = env.spec("ok.yaml", "subject: a\nspec: {steps: 3, fail_transient: 0, step_ms: 0}\n");
    let out = env.ferry(&["submit", "test", "-f", &ok, "--wait"]).await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("Succeeded"), "{}", out.stdout);
    assert_eq!(out.stdout.lines().filter(|l| l.contains("StepSucceeded")).count(), 3);

    let bad = env.spec("bad.yaml", "subject: b\nspec: {steps: 2, fail_at: 1, fail_transient: 0, step_ms: 0}\n");
    let out = env.ferry(&["submit", "test", "-f", &bad, "--wait", "--output", "json"]).await;
    assert_eq!(out.code, 1, "a reverted task is not a success: {}{}", out.stdout, out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["state"], "Reverted");
    assert_eq!(v["error"]["code"], "INJECTED_FAILURE");

    let invalid = env.spec("invalid.yaml", "subject: c\nspec: {steps: 0, fail_transient: 0, step_ms: 0}\n");
    let out = env.ferry(&["submit", "test", "-f", &invalid, "--wait"]).await;
    assert_eq!(out.code, 1);
    assert!(out.stdout.contains("Rejected: invalid test spec: steps must be 1 to 100, got 0"), "{}", out.stdout);

    let out = env.ferry(&["submit", "test", "-f", &ok, "--output", "json"]).await;
    assert_eq!(out.code, 0);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let id: TaskId = v["task_id"].as_str().unwrap().parse().unwrap();
    let mut events = env.client.events(true).await.unwrap();
    events.until(id, Duration::from_secs(60), |e| e.event == EventType::Succeeded).await.unwrap();
    let out = env.ferry(&["tasks", "get", &id.to_string(), "--output", "json"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["task"]["state"], "Succeeded");
    assert_eq!(v["task"]["steps"].as_array().unwrap().len(), 3);
    assert_eq!(v["task"]["revert_would_undo"], serde_json::json!(["step-3", "step-2", "step-1"]));
    assert_eq!(v["events"].as_array().unwrap().len(), 8);

    let out = env.ferry(&["tasks", "list", "--state", "succeeded", "--output", "json"]).await;
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert!(v.as_array().unwrap().iter().any(|t| t["task_id"] == id.to_string()));

    let missing = env.ferry(&["submit", "test", "-f", "/nonexistent.yaml"]).await;
    assert_eq!(missing.code, 2);
    assert!(missing.stderr.contains("reading /nonexistent.yaml"), "{}", missing.stderr);
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_and_revert_through_the_cli() {
    let env = env().await;
    let blocked = env.spec("blocked.yaml", "subject: d\nspec: {steps: 3, block_at: 2, fail_transient: 0, step_ms: 0}\n");
    let mut events = env.client.events(true).await.unwrap();
    let out = env.ferry(&["submit", "test", "-f", &blocked]).await;
    assert_eq!(out.code, 0);
    let id: TaskId = out.stdout.trim().parse().unwrap();
    events.until(id, Duration::from_secs(60), |e| e.event == EventType::StepProgress).await.unwrap();
    let out = env.ferry(&["tasks", "cancel", &id.to_string()]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    events.until(id, Duration::from_secs(60), |e| e.event == EventType::Cancelled).await.unwrap();
    let out = env.ferry(&["tasks", "revert", &id.to_string(), "--wait"]).await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("Reverted"));
    assert_eq!(out.stdout.lines().filter(|l| l.contains("StepReverted")).count(), 2);
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_follows_tasks_to_their_end() {
    let env = env().await;
    let slow = env.spec("slow.yaml", "subject: w1\nspec: {steps: 3, fail_transient: 0, step_ms: 400}\n");
    let failing = env.spec("failing.yaml", "subject: w2\nspec: {steps: 3, fail_at: 3, fail_transient: 0, step_ms: 300}\n");
    let ok = env.ferry(&["submit", "test", "-f", &slow]).await.stdout.trim().to_owned();
    let bad = env.ferry(&["submit", "test", "-f", &failing]).await.stdout.trim().to_owned();
    // Both are followed live; the failed one makes the exit code 1.
    let out = env.ferry(&["tasks", "watch", &ok, &bad]).await;
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains(&format!("{ok} test w1 Succeeded")), "{}", out.stdout);
    assert!(out.stdout.contains(&format!("{bad} test w2 Reverted")), "{}", out.stdout);
    // A finished task is reported at once.
    let out = env.ferry(&["tasks", "watch", &ok]).await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains(&format!("{ok} test w1 Succeeded")), "{}", out.stdout);

    // The broker settings can come from a config file instead of flags.
    let cfg = env.spec("config.yaml", &format!("brokers: {}\nkafka_properties: {{fetch.wait.max.ms: '5'}}\n", env.bootstrap));
    let o = tokio::process::Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["--config", &cfg, "tasks", "get", &ok, "--output", "json"])
        .env("RUST_LOG", "error")
        .env_remove("FERRY_BROKERS")
        .output()
        .await
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["task"]["state"], "Succeeded");
    env.shutdown().await;
}

/// With OTEL_EXPORTER_OTLP_ENDPOINT set, `ferry submit` exports its producer span over
/// OTLP/HTTP: an in-process collector receives and decodes it, and the task's events
/// carry that span as their trace parent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_exports_its_span_over_otlp() {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use prost::Message;
    let env = env().await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<ExportTraceServiceRequest>();
    let collector = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let tx = tx.clone();
            async move {
                if let Ok(req) = ExportTraceServiceRequest::decode(body) {
                    let _ = tx.send(req);
                }
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, collector).await.unwrap() });

    let spec = env.spec("traced.yaml", "subject: otlp\nspec: {steps: 1, fail_transient: 0, step_ms: 0}\n");
    let o = tokio::process::Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["submit", "test", "-f", &spec, "--wait", "--output", "json", "--brokers", &env.bootstrap, "--kafka-property", "fetch.wait.max.ms=5"])
        .env("RUST_LOG", "error")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .output()
        .await
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let task: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let req = tokio::time::timeout(Duration::from_secs(30), rx.recv()).await.expect("the collector got spans").unwrap();
    let spans: Vec<_> = req.resource_spans.iter().flat_map(|r| &r.scope_spans).flat_map(|s| &s.spans).collect();
    let submit = spans.iter().find(|s| s.name == "ferry.submit test").expect("the producer span");
    let service = req.resource_spans[0].resource.as_ref().unwrap().attributes.iter().find(|a| a.key == "service.name").unwrap();
    assert!(format!("{:?}", service.value).contains("ferry-submit"), "{service:?}");
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let tp = format!("00-{}-{}-01", hex(&submit.trace_id), hex(&submit.span_id));
    assert_eq!(task["trace_parent"], serde_json::json!(tp), "the task carries the exported span as its trace parent");
    env.shutdown().await;
}

/// `--tenant`: the CLI sends to the tenant's own topic, the worker's gateway takes it from
/// there, the task is the tenant's (whatever `$USER` says) and the policy holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_submits_on_its_own_topic_and_is_held_to_its_policy() {
    let topics = Topics::standard();
    let broker = EmbeddedBroker::start(1, &topics).unwrap();
    let policy = ferry_runtime::tenants::Policy::parse("tenants: {web: {test: {clusters: ['web-*']}}}").unwrap();
    for t in topics.tenant_commands(&policy) {
        broker.create_topic(&t.name, t.partitions, 1).unwrap();
    }
    let bootstrap = broker.bootstrap();
    let kafka = KafkaConfig::for_embedded(bootstrap.clone());
    let mut opts = WorkerOptions::new(kafka.clone());
    opts.shutdown_grace = Duration::from_secs(1);
    opts.policy = Some(std::sync::Arc::new(policy));
    let stop = CancellationToken::new();
    let handler = TestHandler { min_delay: Some(Duration::from_millis(10)), effects: None };
    let worker = tokio::spawn(Worker::new(opts, handler).run(stop.clone()));
    let client = Client::new(kafka, topics).unwrap();
    let env = Env { bootstrap, client, dir: tempfile::tempdir().unwrap(), stop, worker: Some(worker), _broker: broker };

    let ok = env.spec("ok.yaml", "subject: web-1\nspec: {steps: 1, fail_transient: 0, step_ms: 0}\n");
    let out = env.ferry(&["submit", "test", "-f", &ok, "--tenant", "web", "--wait", "--output", "json"]).await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["state"], "Succeeded");
    let id = v["task_id"].as_str().unwrap().to_owned();
    let snap = env.client.snapshots().await.unwrap().into_iter().find(|s| s.task_id == id).unwrap();
    assert_eq!(snap.requested_by, "tenant:web");

    let far = env.spec("far.yaml", "subject: db-1\nspec: {steps: 1, fail_transient: 0, step_ms: 0}\n");
    let out = env.ferry(&["submit", "test", "-f", &far, "--tenant", "web", "--wait"]).await;
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("may not target cluster \"db-1\" with test (tenants.web.test.clusters: [web-*])"), "{}", out.stdout);
    env.shutdown().await;
}

/// `submit --tosca FILE --dry-run` prints the command a blueprint becomes (a spec file `-f`
/// takes back) and sends nothing; a blueprint that does not convert says where, and fails.
#[test]
fn tosca_dry_run_prints_the_command_and_sends_nothing() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    // No broker is named or running: a dry run must not need one.
    let run = |args: &[&str]| std::process::Command::new(env!("CARGO_BIN_EXE_ferry")).args(args).env("RUST_LOG", "error").env("FERRY_BROKERS", "127.0.0.1:9").output().unwrap();
    let charity = root.join("examples/charity.tosca.yaml");
    let out = run(&["submit", "deploy", "--tosca", charity.to_str().unwrap(), "--cluster", "member-1", "--dry-run"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&stdout).expect("the dry run prints a spec file");
    let names: Vec<&str> = doc["spec"]["components"].as_sequence().unwrap().iter().filter_map(|c| c["name"].as_str()).collect();
    assert!(names.contains(&"ingest") && !names.contains(&"charity-kafka"), "externals are left out: {names:?}");
    let bad = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(bad.path(), std::fs::read_to_string(&charity).unwrap().replacen("name: ingest", "name: ingest\n        replicas: 4294967297", 1)).unwrap();
    let out = run(&["submit", "deploy", "--tosca", bad.path().to_str().unwrap(), "--cluster", "member-1", "--dry-run"]);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_ne!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("node_templates.ingest.properties.replicas") && text.contains("4294967297"), "{text}");
}

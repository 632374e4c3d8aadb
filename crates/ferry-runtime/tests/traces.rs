//! One trace per command: the producer's span, the worker's task span under it and a span
//! per step, exported through the OpenTelemetry SDK's in-memory exporter (the same spans
//! an OTLP exporter ships), and the traceparent every progress event carries.

use std::time::Duration;

use ferry_runtime::testkind::{TestHandler, TestTaskSpec};
use ferry_runtime::{Client, EmbeddedBroker, EventType, KafkaConfig, SubmitOptions, TaskKind, Topics, Worker, WorkerOptions};
use opentelemetry::trace::{SpanKind, Status};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_is_one_trace_from_producer_through_worker_and_steps() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
    opentelemetry::global::set_tracer_provider(provider.clone());

    let topics = Topics::standard();
    let broker = EmbeddedBroker::start(1, &topics).unwrap();
    let kafka = KafkaConfig::for_embedded(broker.bootstrap());
    let mut opts = WorkerOptions::new(kafka.clone());
    opts.shutdown_grace = Duration::from_secs(1);
    let stop = CancellationToken::new();
    let worker = tokio::spawn(Worker::new(opts, TestHandler::default()).run(stop.clone()));
    let client = Client::new(kafka, topics).unwrap();
    let mut events = client.events(false).await.unwrap();

    // One task that succeeds, one whose step 2 fails and is undone.
    let ok = TestTaskSpec { steps: 3, ..TestTaskSpec::default() };
    let bad = TestTaskSpec { steps: 2, fail_at: Some(2), ..TestTaskSpec::default() };
    let good_id = client.submit(TaskKind::TEST, "traced", &ok, SubmitOptions::default()).await.unwrap();
    let bad_id = client.submit(TaskKind::TEST, "traced-bad", &bad, SubmitOptions::default()).await.unwrap();
    let good_events = events.until(good_id, Duration::from_secs(60), |e| e.event.is_final()).await.unwrap();
    assert_eq!(good_events.last().unwrap().event, EventType::Succeeded);
    let bad_events = events.until(bad_id, Duration::from_secs(60), |e| e.event.is_final()).await.unwrap();
    assert_eq!(bad_events.last().unwrap().event, EventType::Reverted);
    stop.cancel();
    worker.await.unwrap().unwrap();
    provider.force_flush().unwrap();
    let spans = exporter.get_finished_spans().unwrap();

    let attr = |s: &opentelemetry_sdk::trace::SpanData, k: &str| s.attributes.iter().find(|a| a.key.as_str() == k).map(|a| a.value.to_string());
    let of_task = |id: &str| -> Vec<&opentelemetry_sdk::trace::SpanData> {
        let submit = spans.iter().find(|s| s.name == "ferry.submit test" && attr(s, "ferry.task_id").as_deref() == Some(id)).expect("a producer span");
        let trace = submit.span_context.trace_id();
        spans.iter().filter(|s| s.span_context.trace_id() == trace).collect()
    };

    let good = of_task(&good_id.to_string());
    let submit = good.iter().find(|s| s.name == "ferry.submit test").unwrap();
    assert_eq!(submit.span_kind, SpanKind::Producer);
    let task = good.iter().find(|s| s.name == "ferry.task test").expect("the worker's task span in the same trace");
    assert_eq!(task.span_kind, SpanKind::Consumer);
    assert_eq!(task.parent_span_id, submit.span_context.span_id(), "the task span is the producer span's child");
    assert!(task.parent_span_is_remote, "its parent came over Kafka");
    let steps: Vec<&str> = good.iter().filter(|s| s.name.starts_with("ferry.step")).map(|s| s.name.as_ref()).collect();
    assert_eq!(steps.len(), 3, "{steps:?}");
    assert!(good.iter().filter(|s| s.name.starts_with("ferry.step")).all(|s| s.parent_span_id == task.span_context.span_id()));
    // Every progress event of the task names the producer span as its trace parent.
    let tp = format!("00-{}-{}-01", submit.span_context.trace_id(), submit.span_context.span_id());
    assert!(good_events.iter().all(|e| e.trace_parent.as_deref() == Some(tp.as_str())), "{:?}", good_events[0].trace_parent);

    let bad = of_task(&bad_id.to_string());
    let failed = bad.iter().find(|s| s.name == "ferry.step step-2").expect("the failing step's span");
    assert!(matches!(failed.status, Status::Error { .. }), "{:?}", failed.status);
    let undos = bad.iter().filter(|s| s.name.starts_with("ferry.undo")).count();
    assert_eq!(undos, 2, "both started steps were undone, each in its span");
}

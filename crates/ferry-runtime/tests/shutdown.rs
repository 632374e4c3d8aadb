//! Every Kafka client is closed by the time a worker stops or a live view is dropped, so
//! a program that stops its broker next (`ferry dev` after a demo, a test) meets no reader
//! still polling it. Before, `ferry dev --demo smoke` often ended in librdkafka's
//! connection errors: the state view's thread and the lag reporter outlived
//! `Worker::run`, and a dropped view's reader polled on for up to 100 ms.
//!
//! The check counts this process's librdkafka client handles, so this binary holds one
//! test: `cargo test` runs a binary's tests as threads of one process.

mod support;

use ferry_runtime::testkind::TestTaskSpec;
use ferry_runtime::EventType;
use support::*;

/// The librdkafka clients alive in this process: each client handle has one main thread
/// (`rdk:main`) from its creation until it is destroyed. Count at rest only: a thread
/// librdkafka starts is named after its parent (`rdk:main`) until it names itself, so a
/// count taken while clients start can be high. The embedded broker is one handle.
fn kafka_clients() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task (Linux)")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|n| n.trim() == "rdk:main")
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_kafka_client_outlives_a_dropped_view_or_a_stopped_worker() {
    let broker = TestBroker::embedded();

    // A live view: its last handle's drop waits until the reader has let its consumer go
    // (fails without that wait: 2 handles, not 1).
    let (kafka, topics) = (broker.kafka.clone(), vec![broker.topics.progress().name.clone()]);
    let view = tokio::task::spawn_blocking(move || {
        ferry_runtime::live::Follower::<usize>::start(&kafka, topics, Box::new(|_, payload: &[u8]| Ok(Some(payload.len()))))
    })
    .await
    .unwrap()
    .unwrap();
    view.caught_up(WAIT).await.unwrap();
    drop(view);
    assert_eq!(kafka_clients(), 1, "a consumer left open after its view was dropped (beside the embedded broker's own handle)");

    // A worker that ran a task: when `run` returns, its intake, producer, state view, lag
    // reporter (and a tenants' gateway) are closed (a reader that never stops fails this).
    let (stop, worker) = broker.spawn_worker(broker.worker_options());
    {
        let client = broker.client();
        let mut events = client.events(true).await.unwrap();
        let id = submit(&client, "bye", &TestTaskSpec::steps(1)).await;
        assert_eq!(until_final(&mut events, id).await.last().unwrap().event, EventType::Succeeded);
    }
    stop.cancel();
    worker.await.unwrap();
    assert_eq!(kafka_clients(), 1, "Kafka clients left open after the worker stopped (beside the embedded broker's own handle)");
}

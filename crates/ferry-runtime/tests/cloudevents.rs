//! Every record on the progress topic is a CloudEvent in the Kafka binding's binary content
//! mode: read raw from the topic, each carries the `ce_` headers, its id unique per event.

mod support;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use ferry_runtime::protocol::{CommandAction, ProgressEvent};
use ferry_runtime::publisher::{CE_ID, CE_SOURCE, CE_SPECVERSION, CE_SUBJECT, CE_TIME, CE_TYPE, CONTENT_TYPE, cloudevent_type};
use ferry_runtime::testkind::TestTaskSpec;
use ferry_runtime::{EventType, TaskId, TaskKind};
use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Headers;
use support::*;

/// The progress topic's records from the start, decoded, each with its headers, until `n`.
fn progress_records(broker: &TestBroker, n: usize) -> Vec<(ProgressEvent, HashMap<String, String>)> {
    let reader: BaseConsumer = broker.kafka.reader().create().unwrap();
    reader.subscribe(&[&broker.topics.progress().name]).unwrap();
    let client = broker.client();
    let mut out = Vec::new();
    let deadline = Instant::now() + WAIT;
    while out.len() < n {
        assert!(Instant::now() < deadline, "{} of {n} progress records", out.len());
        if let Some(m) = reader.poll(Duration::from_millis(200)) {
            let m = m.unwrap();
            let ev: ProgressEvent = client.registry().decode(m.payload().unwrap()).unwrap();
            let headers = m.headers().map(|h| h.iter().map(|h| (h.key.to_owned(), String::from_utf8(h.value.unwrap().to_vec()).unwrap())).collect()).unwrap_or_default();
            out.push((ev, headers));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_progress_record_carries_the_cloudevents_headers_embedded() {
    every_record_carries_the_headers(TestBroker::embedded()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_progress_record_carries_the_cloudevents_headers_tansu() {
    every_record_carries_the_headers(TestBroker::tansu().await).await;
}

async fn every_record_carries_the_headers(broker: TestBroker) {
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let (stop, worker) = broker.spawn_worker(broker.worker_options());
    let id = submit(&client, "cluster-a", &TestTaskSpec::steps(3)).await;
    assert_eq!(until_final(&mut events, id).await.len(), 8);
    // Two refused Cancels of a task no one knows: two Rejected events, both with seq 0.
    let unknown = TaskId::new();
    for _ in 0..2 {
        client.control(TaskKind::TEST, "nowhere", unknown, CommandAction::Cancel, None).await.unwrap();
        until_event(&mut events, unknown, EventType::Rejected).await;
    }
    stop.cancel();
    worker.await.unwrap();

    let records = progress_records(&broker, 10);
    let mut ids = HashSet::new();
    for (ev, h) in &records {
        let at = |k: &str| h.get(k).map(String::as_str).unwrap_or_else(|| panic!("{:?} seq {} has no {k}: {h:?}", ev.event, ev.seq));
        assert_eq!(at(CE_SPECVERSION), "1.0");
        assert_eq!(at(CE_TYPE), cloudevent_type(ev.event));
        assert_eq!(at(CE_SOURCE), "/ferry/workers/test");
        assert_eq!(at(CE_SUBJECT), ev.subject);
        assert_eq!(at(CONTENT_TYPE), "application/avro");
        let time: jiff::Timestamp = at(CE_TIME).parse().unwrap_or_else(|e| panic!("ce_time {}: {e}", at(CE_TIME)));
        assert_eq!(time.as_millisecond(), ev.at_ms);
        if ev.seq > 0 {
            assert_eq!(at(CE_ID), format!("{}:{}", ev.task_id, ev.seq));
        }
        assert!(ids.insert(at(CE_ID).to_owned()), "ce_id {} twice", at(CE_ID));
    }
    let rejected: Vec<_> = records.iter().filter(|(ev, _)| ev.task_id == unknown.to_string()).collect();
    assert_eq!(rejected.len(), 2, "{rejected:?}");
    assert!(rejected.iter().all(|(ev, _)| ev.seq == 0 && ev.event == EventType::Rejected));
}

/// A refused command read again (here by a worker of another group, as after a crash
/// before its offset was committed) is answered with the same event: its seq-0 Rejected
/// has the same `ce_id`, so a consumer that dedupes by id sees one answer. Another command
/// of the same task is another answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_command_read_again_is_answered_with_the_same_id() {
    let broker = TestBroker::embedded();
    let client = broker.client();
    let mut events = client.events(true).await.unwrap();
    let unknown = TaskId::new();
    let (stop, worker) = broker.spawn_worker(broker.worker_options());
    for _ in 0..2 {
        client.control(TaskKind::TEST, "nowhere", unknown, CommandAction::Cancel, None).await.unwrap();
        until_event(&mut events, unknown, EventType::Rejected).await;
    }
    stop.cancel();
    worker.await.unwrap();
    // The same two records, read by a worker that never committed them.
    let mut again = broker.worker_options();
    again.group_id = Some("ferry-test-again".into());
    again.worker_id = "ferry-test-again-0".into();
    let (stop, worker) = broker.spawn_worker(again);
    let records = progress_records(&broker, 4);
    stop.cancel();
    worker.await.unwrap();

    let ids: Vec<(&str, &str)> = records.iter().map(|(ev, h)| (ev.worker.as_str(), h.get(CE_ID).map(String::as_str).unwrap_or_default())).collect();
    assert!(records.iter().all(|(ev, _)| ev.task_id == unknown.to_string() && ev.seq == 0 && ev.event == EventType::Rejected), "{records:?}");
    let (first, second): (Vec<&(&str, &str)>, Vec<_>) = ids.iter().partition(|(w, _)| *w != "ferry-test-again-0");
    assert_eq!((first.len(), second.len()), (2, 2), "each worker answers both commands: {ids:?}");
    let uuid = first[0].1.strip_prefix(&format!("{unknown}:0:")).unwrap_or_else(|| panic!("{ids:?}"));
    assert_eq!(uuid::Uuid::parse_str(uuid).map(|u| u.get_version_num()).ok(), Some(5), "{ids:?}");
    assert_ne!(first[0].1, first[1].1, "two commands, two answers: {ids:?}");
    let answered: Vec<&str> = first.iter().map(|(_, id)| *id).collect();
    let again: Vec<&str> = second.iter().map(|(_, id)| *id).collect();
    assert_eq!(again, answered, "each command read again is answered with its first answer's id");
}

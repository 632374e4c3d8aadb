//! The live task-state view (`Client::live_view`): it sees a task submitted after it
//! started and the task's later updates, drops a task whose snapshot was tombstoned and
//! leaves out a snapshot on another kind's topic (embedded and tansu), and answers a
//! Cancel's kind and subject from its index while reading the topics fails (embedded: the
//! failure is injected). A task whose Accepted event is out before its snapshot can be
//! cancelled. A task keeps its highest seq whatever order its snapshots are read
//! in (a rewound reader, a late write).

mod support;

use std::time::Duration;

use ferry_runtime::protocol::{Bytes, CommandEnvelope, EventType, TaskSnapshot, TaskState};
use ferry_runtime::testkind::TestTaskSpec;
use ferry_runtime::{Client, ClientError, CommandAction, TaskId, TaskKind};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use support::*;

/// A finished task's snapshot as a worker of `kind` would leave it.
fn snapshot(id: TaskId, kind: TaskKind, subject: &str) -> TaskSnapshot {
    TaskSnapshot {
        task_id: id.to_string(),
        kind,
        subject: subject.into(),
        state: TaskState::Succeeded,
        seq: 3,
        last_event: EventType::Succeeded,
        idempotency_key: None,
        requested_by: "live-test".into(),
        origin_partition: 0,
        origin_offset: 0,
        created_at_ms: 1,
        updated_at_ms: 2,
        deadline_ms: None,
        keep_partial: false,
        worker: "live-test".into(),
        trace_parent: None,
        spec: Bytes::default(),
        journal: Vec::new(),
        error: None,
        cancel_requested: false,
        revert_requested: false,
        signals: Vec::new(),
    }
}

async fn plant(client: &Client, topic: &str, snap: &TaskSnapshot) {
    let bytes = client.registry().encode(snap).unwrap();
    client.send_raw(topic, Some(snap.task_id.as_bytes()), &bytes, OwnedHeaders::new()).await.unwrap();
}

async fn sees_new_tasks_their_updates_and_tombstones(broker: TestBroker) {
    let client = broker.client();
    let live = client.live_view().await.unwrap();
    live.follower().ready(WAIT).await.unwrap();
    assert!(live.all().is_empty(), "a fresh broker has no task");
    let (stop, worker) = broker.spawn_worker(broker.worker_options());

    // A task submitted after the view started shows up; reverted once it succeeded (the
    // Revert addressed from the view's index), its update shows up too.
    let id = submit(&client, "live/a", &TestTaskSpec::steps(2)).await;
    let done = live.wait_for(id, WAIT, |s| s.state == TaskState::Succeeded).await.unwrap();
    assert_eq!((done.kind, done.subject.as_str()), (TaskKind::TEST, "live/a"));
    assert_eq!(live.locate(id), Some((TaskKind::TEST, "live/a".to_owned())));
    client.revert(id).await.unwrap();
    let reverted = live.wait_for(id, WAIT, |s| s.state == TaskState::Reverted).await.unwrap();
    assert!(reverted.seq > done.seq, "the view took in the task's update: seq {} then {}", done.seq, reverted.seq);

    // A snapshot on another kind's topic is not the task's: left out.
    let stray = TaskId::new();
    plant(&client, &broker.topics.task_state(OTHER_KIND).name, &snapshot(stray, TaskKind::TEST, "live/stray")).await;
    // A tombstone deletes the task; wait until the view has read it.
    let other = submit(&client, "live/b", &TestTaskSpec::steps(1)).await;
    live.wait_for(other, WAIT, |s| s.state == TaskState::Succeeded).await.unwrap();
    let producer: FutureProducer = broker.kafka.producer().create().unwrap();
    let topic = broker.topics.task_state(TaskKind::TEST).name.clone();
    let key = id.to_string();
    producer.send(FutureRecord::<str, [u8]>::to(&topic).key(&key), Duration::from_secs(30)).await.map_err(|(e, _)| e).unwrap();
    live.follower().wait_for(WAIT, |f| f.get(&key).is_none().then_some(())).await.unwrap();
    live.caught_up(WAIT).await.unwrap();
    let ids: Vec<String> = live.all().into_iter().map(|s| s.task_id).collect();
    assert_eq!(ids, vec![other.to_string()], "the tombstoned task and the stray snapshot are gone, the other task stays");
    assert!(matches!(client.cancel(id).await, Err(ClientError::UnknownTask(t)) if t == id), "a deleted task cannot be cancelled");

    stop.cancel();
    worker.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_view_sees_new_tasks_their_updates_and_tombstones_embedded() {
    sees_new_tasks_their_updates_and_tombstones(TestBroker::embedded()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_view_sees_new_tasks_their_updates_and_tombstones_tansu() {
    sees_new_tasks_their_updates_and_tombstones(TestBroker::tansu().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_takes_the_subject_from_the_index_without_reading_the_topics() {
    let broker = TestBroker::embedded();
    let client = broker.client();
    let live = client.live_view().await.unwrap();
    let id = TaskId::new();
    plant(&client, &broker.topics.task_state(TaskKind::TEST).name, &snapshot(id, TaskKind::TEST, "index/subject")).await;
    live.wait_for(id, WAIT, |_| true).await.unwrap();

    // From here every ListOffsets request fails: reading a topic from its beginning to its
    // end needs its watermarks, so a client without the live view cannot find the task.
    let mock = broker.embedded.as_ref().expect("embedded broker").mock();
    mock.request_errors(RDKafkaApiKey::ListOffsets, &vec![RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED; 10_000]);
    let reads_topics = broker.client().cancel(id).await;
    assert!(reads_topics.is_err(), "the failure injection stops a client that reads the topics: {reads_topics:?}");

    let snap = client.cancel(id).await.unwrap();
    assert_eq!(snap.subject, "index/subject");
    mock.clear_request_errors(RDKafkaApiKey::ListOffsets);

    // The Cancel went to the kind's command topic, keyed and addressed by the subject.
    let sent: Vec<(Option<Vec<u8>>, CommandEnvelope)> = client
        .read_to_end(&broker.topics.command(TaskKind::TEST).name)
        .await
        .unwrap()
        .into_iter()
        .map(|(k, p)| (k, client.registry().decode::<CommandEnvelope>(&p).unwrap()))
        .collect();
    assert_eq!(sent.len(), 1, "one command sent");
    let (key, env) = &sent[0];
    assert_eq!((env.task_id.as_str(), env.action, env.kind, env.subject.as_str()), (id.to_string().as_str(), CommandAction::Cancel, TaskKind::TEST, "index/subject"));
    assert_eq!(key.as_deref(), Some("index/subject".as_bytes()), "keyed by the subject, so it reaches the partition that owns the task");
}

/// A new task's Accepted event is written together with its snapshot, so a reader may see
/// it first (docs/PROTOCOL.md): a Cancel sent then finds the task by its events, with a
/// live view and without one. Past Accepted, a task with events and no snapshot was
/// deleted: it stays unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_seen_accepted_before_its_snapshot_can_be_cancelled() {
    use ferry_runtime::publisher::Detail;
    let broker = TestBroker::embedded();
    let client = broker.client();
    let progress = broker.topics.progress().name.clone();
    let event = |id: TaskId, seq: i64, event: EventType| Detail::default().into_event((&id.to_string(), TaskKind::TEST, "early/subject"), seq, event, "live-test", 1, None);
    let (early, deleted) = (TaskId::new(), TaskId::new());
    for ev in [event(early, 1, EventType::Accepted), event(deleted, 1, EventType::Accepted), event(deleted, 2, EventType::StepStarted)] {
        let bytes = client.registry().encode(&ev).unwrap();
        client.send_raw(&progress, Some(ev.task_id.as_bytes()), &bytes, OwnedHeaders::new()).await.unwrap();
    }

    let one_shot = broker.client().cancel(early).await.unwrap();
    assert_eq!((one_shot.kind, one_shot.subject.as_str(), one_shot.state), (TaskKind::TEST, "early/subject", None));
    let viewer = broker.client();
    viewer.live_view().await.unwrap();
    assert_eq!(viewer.revert(early).await.unwrap().subject, "early/subject");
    assert!(matches!(broker.client().cancel(deleted).await, Err(ClientError::UnknownTask(t)) if t == deleted), "past Accepted, events without a snapshot are a deleted task's");

    let sent: Vec<(CommandAction, String)> = client
        .read_to_end(&broker.topics.command(TaskKind::TEST).name)
        .await
        .unwrap()
        .into_iter()
        .map(|(_, p)| client.registry().decode::<CommandEnvelope>(&p).unwrap())
        .map(|env| (env.action, env.task_id))
        .collect();
    assert_eq!(sent, [(CommandAction::Cancel, early.to_string()), (CommandAction::Revert, early.to_string())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_is_ready_only_once_it_holds_everything_written_before_it_started() {
    let broker = TestBroker::embedded();
    let client = broker.client();
    let topic = broker.topics.task_state(TaskKind::TEST).name.clone();
    let ids: Vec<TaskId> = (0..50).map(|_| TaskId::new()).collect();
    for (i, id) in ids.iter().enumerate() {
        plant(&client, &topic, &snapshot(*id, TaskKind::TEST, &format!("ready/{i}"))).await;
    }
    // Every request now takes a while: a view that called itself ready before its reads
    // came back would hold fewer tasks than the topic.
    let embedded = broker.embedded.as_ref().expect("embedded broker");
    embedded.set_round_trip(Duration::from_millis(200)).unwrap();
    let live = client.live_view().await.unwrap();
    live.follower().ready(WAIT).await.unwrap();
    assert_eq!(live.follower().len(), ids.len(), "ready means every task written before the start is there");
    embedded.set_round_trip(Duration::ZERO).unwrap();
}

/// A view keeps each task's highest seq: a lower-seq snapshot read after a higher one (read
/// again after librdkafka rewound the reader, or written late by a stale writer) does not
/// put the task back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_keeps_its_highest_seq_whatever_order_its_snapshots_are_read_in() {
    let broker = TestBroker::embedded();
    let client = broker.client();
    let topic = broker.topics.task_state(TaskKind::TEST).name.clone();
    let at = |id: TaskId, seq: i64, state: TaskState| TaskSnapshot { seq, state, ..snapshot(id, TaskKind::TEST, "order/a") };
    // Written before the view starts: it reads both in its first catch-up.
    let before = TaskId::new();
    plant(&client, &topic, &at(before, 3, TaskState::Succeeded)).await;
    plant(&client, &topic, &at(before, 2, TaskState::Running)).await;
    let live = client.live_view().await.unwrap();
    live.follower().ready(WAIT).await.unwrap();
    assert_eq!(live.get(before).map(|s| (s.seq, s.state)), Some((3, TaskState::Succeeded)), "read in its first catch-up");
    // Written while it follows.
    let after = TaskId::new();
    plant(&client, &topic, &at(after, 5, TaskState::Succeeded)).await;
    plant(&client, &topic, &at(after, 4, TaskState::Running)).await;
    live.caught_up(WAIT).await.unwrap();
    assert_eq!(live.get(after).map(|s| (s.seq, s.state)), Some((5, TaskState::Succeeded)), "read while following");
    // A higher seq still replaces it.
    plant(&client, &topic, &at(after, 6, TaskState::Reverting)).await;
    let now = live.wait_for(after, WAIT, |s| s.seq == 6).await.unwrap();
    assert_eq!(now.state, TaskState::Reverting);
}

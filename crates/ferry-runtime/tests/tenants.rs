//! Tenants on a real broker with SASL (tansu, SCRAM-SHA-512): who sent a command is the
//! tenant whose topic the broker let it write, never what the record says; each tenant is
//! held to its policy, keeps its idempotency keys and task ids to itself, and cancels or
//! reverts only its own tasks, on their own subject; a stored task whose spec fails its
//! checks when a worker takes it up runs nothing.
//!
//! tansu authenticates but has no authorizer (no ACLs in 0.6.0), so the broker's refusal
//! of another tenant's topic is shown on the generated ACLs instead
//! (`strimzi::tests::authorization_matrix_of_tenants_workers_and_tracker`); everything
//! the workers decide is shown here.

use std::sync::Arc;
use std::time::Duration;

use ferry_runtime::protocol::{Bytes, CommandEnvelope, TaskSnapshot, now_ms};
use ferry_runtime::tansu::Tansu;
use ferry_runtime::tenants::{Policy, TENANT_HEADER};
use ferry_runtime::testkind::{TestHandler, TestTaskSpec};
use ferry_runtime::{Client, CommandAction, EventType, KafkaConfig, ProgressEvent, SubmitOptions, TaskId, TaskKind, TaskState, Topics, Worker, WorkerOptions};
use rdkafka::message::{Header, OwnedHeaders};
use tokio_util::sync::CancellationToken;

const LIMIT: Duration = Duration::from_secs(120);
const WORKER: (&str, &str) = ("ferry-worker-test", "worker-secret-1");
const ACME: (&str, &str) = ("ferry-tenant-acme", "acme-secret-1");
const GLOBEX: (&str, &str) = ("ferry-tenant-globex", "globex-secret-1");

fn scram(bootstrap: &str, (user, password): (&str, &str)) -> KafkaConfig {
    KafkaConfig::scram_plaintext(bootstrap, user, password)
}

fn policy() -> Policy {
    Policy::parse("tenants: {acme: {test: {clusters: ['acme-*']}}, globex: {test: {clusters: ['globex-*']}}}").unwrap()
}

/// A snapshot as a worker would have written it, but with `spec`, `subject` and
/// `requested_by` of the writer's choosing (what any holder of the task-state topic's
/// write right could plant).
fn planted(client: &Client, subject: &str, requested_by: &str, spec: &TestTaskSpec) -> TaskSnapshot {
    TaskSnapshot {
        task_id: TaskId::new().to_string(),
        kind: TaskKind::TEST,
        subject: subject.into(),
        state: TaskState::Accepted,
        seq: 1,
        last_event: EventType::Accepted,
        idempotency_key: None,
        requested_by: requested_by.into(),
        origin_partition: 0,
        origin_offset: 0,
        created_at_ms: now_ms(),
        updated_at_ms: now_ms(),
        deadline_ms: None,
        keep_partial: false,
        worker: "planted".into(),
        trace_parent: None,
        spec: Bytes(client.registry().encode(spec).unwrap()),
        journal: Vec::new(),
        error: None,
        cancel_requested: false,
        revert_requested: false,
        signals: Vec::new(),
    }
}

fn last(evs: &[ProgressEvent]) -> &ProgressEvent {
    evs.last().expect("events")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_are_who_the_broker_says_and_stay_in_their_policy_tansu() {
    if !ferry_runtime::tansu::binary().exists() {
        ferry_runtime::report::missing_prerequisite("tansu is not installed (scripts/install-tansu.sh)");
        return;
    }
    let topics = Topics::standard();
    let policy = policy();
    let broker = Tansu::start_secured_with(&topics, &topics.tenant_topics(&policy), &[WORKER, ACME, GLOBEX]).await.unwrap();
    let operator = Client::new(scram(broker.bootstrap(), WORKER), topics.clone()).unwrap();
    let acme = Client::new(scram(broker.bootstrap(), ACME), topics.clone()).unwrap().as_tenant("acme");
    let globex = Client::new(scram(broker.bootstrap(), GLOBEX), topics.clone()).unwrap().as_tenant("globex");

    // Planted before the worker starts: it resumes them when it takes its partitions.
    let invalid = planted(&operator, "acme-7", "tenant:acme", &TestTaskSpec::steps(0));
    let outside = planted(&operator, "globex-7", "tenant:acme", &TestTaskSpec::steps(1));
    for snap in [&invalid, &outside] {
        let bytes = operator.registry().encode(snap).unwrap();
        operator.send_raw(&topics.task_state(TaskKind::TEST).name, Some(snap.task_id.as_bytes()), &bytes, OwnedHeaders::new()).await.unwrap();
    }

    let mut events = operator.events(true).await.unwrap();
    // Each tenant follows its own progress topic, where the workers copy its tasks' events.
    let mut acme_events = acme.events(true).await.unwrap();
    let mut globex_events = globex.events(true).await.unwrap();
    let mut opts = WorkerOptions::new(scram(broker.bootstrap(), WORKER));
    opts.topics = topics.clone();
    opts.shutdown_grace = Duration::from_secs(2);
    opts.policy = Some(Arc::new(policy));
    let stop = CancellationToken::new();
    let s = stop.clone();
    let worker = tokio::spawn(async move { Worker::new(opts, TestHandler::default()).run(s).await });

    // A stored spec is checked again when a worker takes the task up: neither runs a step.
    for (snap, says) in [(&invalid, "steps must be 1 to 100"), (&outside, "tenants.acme.test.clusters")] {
        let id: TaskId = snap.task_id.parse().unwrap();
        let evs = events.until(id, LIMIT, |e| e.event.is_final()).await.unwrap();
        let end = last(&evs);
        assert_eq!(end.event, EventType::Failed, "{evs:?}");
        assert_eq!(end.code.as_deref(), Some(ferry_runtime::codes::SPEC_INVALID));
        assert!(end.message.as_deref().unwrap_or_default().contains(says), "{end:?}");
        assert!(evs.iter().all(|e| e.event != EventType::StepStarted), "a step ran: {evs:?}");
    }

    // acme's command, on acme's topic: the task is acme's whatever the envelope claims.
    let keyed = SubmitOptions { idempotency_key: Some("nightly".into()), ..SubmitOptions::default() };
    let mine = acme.submit(TaskKind::TEST, "acme-1", &TestTaskSpec::steps(2), keyed.clone()).await.unwrap();
    assert_eq!(mine, ferry_runtime::tenants::tenant_task_id(TaskKind::TEST, "acme", "nightly"));
    let evs = events.until(mine, LIMIT, |e| e.event.is_final()).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Succeeded, "{evs:?}");
    let own = acme_events.until(mine, LIMIT, |e| e.event.is_final()).await.unwrap();
    assert_eq!(own.iter().map(|e| (e.seq, e.event)).collect::<Vec<_>>(), evs.iter().map(|e| (e.seq, e.event)).collect::<Vec<_>>(), "acme reads its task's every event");
    let snap = operator.snapshot(mine).await.unwrap().unwrap();
    assert_eq!(snap.requested_by, "tenant:acme");
    assert_eq!(snap.idempotency_key.as_deref(), Some("acme/nightly"));

    // Outside its policy: Rejected, naming the rule.
    let far = acme.submit(TaskKind::TEST, "globex-1", &TestTaskSpec::steps(1), SubmitOptions::default()).await.unwrap();
    let evs = events.until(far, LIMIT, |e| e.event.is_final()).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Rejected);
    let why = last(&evs).message.clone().unwrap_or_default();
    assert!(why.contains("may not target cluster \"globex-1\" with test (tenants.acme.test.clusters: [acme-*])"), "{why}");
    assert_eq!(last(&acme_events.until(far, LIMIT, |e| e.event.is_final()).await.unwrap()).event, EventType::Rejected, "acme hears of its refusal");

    // The same key from another tenant is another task, not a duplicate of acme's.
    let theirs = globex.submit(TaskKind::TEST, "globex-1", &TestTaskSpec::steps(1), keyed).await.unwrap();
    assert_ne!(theirs, mine);
    let evs = events.until(theirs, LIMIT, |e| e.event.is_final()).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Succeeded, "{evs:?}");

    // globex may not revert acme's task, and hears what it would of a task that is not there.
    globex.control(TaskKind::TEST, "acme-1", mine, CommandAction::Revert, None).await.unwrap();
    let evs = events.until(mine, LIMIT, |e| e.event == EventType::Rejected).await.unwrap();
    assert_eq!(last(&evs).message.as_deref(), Some(format!("tenant \"globex\" has no test task {mine}").as_str()));
    // The refusal is told to globex, who asked, on its own topic.
    let told = globex_events.until(mine, LIMIT, |e| e.event == EventType::Rejected).await.unwrap();
    assert_eq!(told.iter().map(|e| e.seq).collect::<Vec<_>>(), [0], "globex hears only its refusal of acme's task: {told:?}");
    let absent = TaskId::new();
    globex.control(TaskKind::TEST, "acme-1", absent, CommandAction::Revert, None).await.unwrap();
    let evs = events.until(absent, LIMIT, |e| e.event == EventType::Rejected).await.unwrap();
    assert_eq!(last(&evs).message.as_deref(), Some(format!("tenant \"globex\" has no test task {absent}").as_str()));
    // A control must name its task's subject, tenant or not.
    acme.control(TaskKind::TEST, "acme-2", mine, CommandAction::Revert, None).await.unwrap();
    let evs = events.until(mine, LIMIT, |e| e.event == EventType::Rejected).await.unwrap();
    assert!(last(&evs).message.as_deref().unwrap_or_default().contains("acts on \"acme-1\", not \"acme-2\""), "{evs:?}");
    assert_eq!(operator.snapshot(mine).await.unwrap().unwrap().state, TaskState::Succeeded);
    // Its own tenant reverts it, by id: its client finds the task's kind and subject on
    // acme's own progress topic (a tenant reads no task state).
    let target = acme.revert(mine).await.unwrap();
    assert_eq!((target.kind, target.subject.as_str(), target.state), (TaskKind::TEST, "acme-1", None));
    let evs = events.until(mine, LIMIT, |e| e.event == EventType::Reverted).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Reverted);
    acme_events.until(mine, LIMIT, |e| e.event == EventType::Reverted).await.unwrap();
    // Neither tenant's topic carries the other's tasks.
    assert!(acme.history(theirs).await.unwrap().is_empty(), "globex's task on acme's topic");
    assert!(globex.history(mine).await.unwrap().iter().all(|e| e.seq == 0), "acme's task's events on globex's topic");
    assert!(matches!(globex.revert(mine).await, Err(ferry_runtime::ClientError::NotTenants { ref tenant, .. }) if tenant == "globex"), "globex cannot even find acme's task");

    // Signals are held to the same rule: globex's Signal to acme's running task is refused
    // as if the task were not there (whatever its envelope claims); acme's own is recorded,
    // as acme's.
    let blocked = acme.submit(TaskKind::TEST, "acme-5", &TestTaskSpec { block_at: Some(1), ..TestTaskSpec::steps(2) }, SubmitOptions::default()).await.unwrap();
    events.until(blocked, LIMIT, |e| e.event == EventType::StepProgress).await.unwrap();
    let forged = CommandEnvelope {
        task_id: blocked.to_string(),
        kind: TaskKind::TEST,
        action: CommandAction::Signal,
        subject: "acme-5".into(),
        idempotency_key: Some("sig/forged".into()),
        requested_by: "tenant:acme".into(),
        created_at_ms: now_ms(),
        deadline_ms: None,
        keep_partial: false,
        reason: None,
        spec: Bytes(Vec::new()),
        signal: Some("approve".into()),
    };
    globex.send(&forged, None).await.unwrap();
    let evs = events.until(blocked, LIMIT, |e| e.event == EventType::Rejected).await.unwrap();
    assert_eq!(last(&evs).message.as_deref(), Some(format!("tenant \"globex\" has no test task {blocked}").as_str()));
    acme.signal(blocked, "approve", Some("looks good".into())).await.unwrap();
    events.until(blocked, LIMIT, |e| e.event == EventType::Signalled).await.unwrap();
    let signals = operator.snapshot(blocked).await.unwrap().unwrap().signals;
    assert_eq!(signals.iter().map(|s| (s.name.as_str(), s.by.as_str())).collect::<Vec<_>>(), [("approve", "tenant:acme")], "globex's Signal was not recorded");
    acme.control_by_id(blocked, CommandAction::Cancel, None).await.unwrap();
    let evs = events.until(blocked, LIMIT, |e| e.event.is_final()).await.unwrap();
    assert_eq!(last(&evs).event, EventType::Cancelled, "{evs:?}");

    // A record on globex's topic that claims to be acme's (the tenant header, the
    // envelope's requested_by) is globex's: held to globex's policy.
    let claim = CommandEnvelope {
        task_id: TaskId::new().to_string(),
        kind: TaskKind::TEST,
        action: CommandAction::Start,
        subject: "acme-3".into(),
        idempotency_key: None,
        requested_by: "tenant:acme".into(),
        created_at_ms: now_ms(),
        deadline_ms: None,
        keep_partial: false,
        reason: None,
        spec: Bytes(globex.registry().encode(&TestTaskSpec::steps(1)).unwrap()),
        signal: None,
    };
    let headers = OwnedHeaders::new().insert(Header { key: TENANT_HEADER, value: Some("acme") });
    let topic = topics.tenant_command("globex", TaskKind::TEST).name;
    globex.send_raw(&topic, Some(b"acme-3"), &globex.registry().encode(&claim).unwrap(), headers).await.unwrap();
    let id: TaskId = claim.task_id.parse().unwrap();
    let evs = events.until(id, LIMIT, |e| e.event.is_final()).await.unwrap();
    assert!(last(&evs).message.as_deref().unwrap_or_default().contains("tenants.globex.test.clusters"), "{evs:?}");
    assert_eq!(operator.snapshot(id).await.unwrap().unwrap().requested_by, "tenant:globex");

    // A task id that acme's next key would give, taken first by globex without the key.
    let squat = ferry_runtime::tenants::tenant_task_id(TaskKind::TEST, "acme", "tomorrow");
    let env = CommandEnvelope { task_id: squat.to_string(), subject: "globex-2".into(), requested_by: "globex".into(), ..claim.clone() };
    globex.send(&env, None).await.unwrap();
    let evs = events.until(squat, LIMIT, |e| e.event.is_final()).await.unwrap();
    assert!(last(&evs).message.as_deref().unwrap_or_default().contains("derived from an idempotency key"), "{evs:?}");

    // On the kind's own topic (an operator's), a claim to be a tenant is refused.
    let env = CommandEnvelope { task_id: TaskId::new().to_string(), subject: "acme-4".into(), requested_by: "tenant:acme".into(), ..claim };
    operator.send(&env, None).await.unwrap();
    let evs = events.until(env.task_id.parse().unwrap(), LIMIT, |e| e.event.is_final()).await.unwrap();
    assert!(last(&evs).message.as_deref().unwrap_or_default().contains("only the tenant gateway names a tenant"), "{evs:?}");

    stop.cancel();
    worker.await.unwrap().unwrap();
}

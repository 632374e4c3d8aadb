//! Plans end to end on the embedded Kafka-protocol broker: a plan worker runs its children
//! as `test` tasks through real `test` workers, over `ferry_runtime::child_tasks` (no fake
//! of Kafka). Children are linked to their plan by their idempotency key
//! `plan/<plan>/<step>` (which fixes their ids) and their `requested_by` `plan/<plan>`.
//! Every wait is on events or snapshots with a deadline; nothing sleeps.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use ferry_plan::spec::PlanSpec;
use ferry_plan::{PlanConfig, PlanHandler};
use ferry_runtime::child_tasks::{KafkaChildren, encode_registered};
use ferry_runtime::protocol::{CommandEnvelope, TaskSnapshot};
use ferry_runtime::tenants::Policy;
use ferry_runtime::testkind::{TestHandler, TestTaskSpec};
use ferry_runtime::{Client, EmbeddedBroker, EventStream, EventType, KafkaConfig, ProgressEvent, SubmitOptions, TaskId, TaskKind, TaskState, Topics, Worker, WorkerOptions};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(90);

/// The embedded broker with every topic, a client, and the workers started on it.
struct Bed {
    _broker: EmbeddedBroker,
    kafka: KafkaConfig,
    topics: Topics,
    client: Client,
    /// The tenants' policy every worker gets, if any.
    policy: Option<Arc<Policy>>,
}

/// A running worker: cancel `stop` and await `handle` to stop it.
struct Running {
    stop: CancellationToken,
    handle: JoinHandle<()>,
}

impl Running {
    async fn stop(self) {
        self.stop.cancel();
        self.handle.await.expect("worker task");
    }
}

impl Bed {
    fn start() -> Self {
        let _ = tracing_subscriber::fmt().with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into())).with_test_writer().try_init();
        let topics = Topics::standard();
        let broker = EmbeddedBroker::start(3, &topics).expect("embedded broker");
        let kafka = KafkaConfig::for_embedded(broker.bootstrap());
        let client = Client::new(kafka.clone(), topics.clone()).expect("client");
        Self { _broker: broker, kafka, topics, client, policy: None }
    }

    /// Tenants: `policy`'s topics are made, and every worker started from now gets it.
    fn with_policy(mut self, policy: &str) -> Self {
        let policy = Policy::parse(policy).expect("a policy");
        for t in self.topics.tenant_topics(&policy) {
            self._broker.create_topic(&t.name, t.partitions, 1).expect("tenant topic");
        }
        self.policy = Some(Arc::new(policy));
        self
    }

    fn options(&self, name: &str) -> WorkerOptions {
        let mut o = WorkerOptions::new(self.kafka.clone());
        o.topics = self.topics.clone();
        o.worker_id = name.to_owned();
        o.revoke_grace = Duration::from_secs(2);
        o.shutdown_grace = Duration::from_secs(2);
        o.policy = self.policy.clone();
        o
    }

    fn test_worker(&self) -> Running {
        let stop = CancellationToken::new();
        let handler = TestHandler { min_delay: Some(Duration::from_millis(10)), effects: None };
        let worker = Worker::new(self.options("test-worker"), handler);
        let t = stop.clone();
        Running { stop, handle: tokio::spawn(async move { worker.run(t).await.expect("test worker") }) }
    }

    async fn plan_worker(&self, name: &str) -> Running {
        self.plan_worker_with(name, Duration::from_secs(5)).await
    }

    /// A plan worker that gives a child it has not seen `appear_grace` to appear.
    async fn plan_worker_with(&self, name: &str, appear_grace: Duration) -> Running {
        let client = Client::new(self.kafka.clone(), self.topics.clone()).expect("client");
        let children = KafkaChildren::new(client, Arc::new(encode_registered)).await.expect("children over Kafka");
        let mut cfg = PlanConfig::new(Arc::new(children));
        cfg.child_timeout = WAIT;
        cfg.appear_grace = appear_grace;
        let worker = Worker::new(self.options(name), PlanHandler::new(cfg));
        let stop = CancellationToken::new();
        let t = stop.clone();
        Running { stop, handle: tokio::spawn(async move { worker.run(t).await.expect("plan worker") }) }
    }

    async fn submit(&self, subject: &str, plan: Value, keep_partial: bool) -> TaskId {
        self.submit_with(subject, plan, SubmitOptions { keep_partial, ..SubmitOptions::default() }).await
    }

    async fn submit_with(&self, subject: &str, plan: Value, opts: SubmitOptions) -> TaskId {
        let spec: PlanSpec = serde_json::from_value(plan).expect("a plan");
        self.client.submit(TaskKind::PLAN, subject, &spec, opts).await.expect("submit")
    }

    async fn snapshot(&self, id: TaskId) -> TaskSnapshot {
        self.client.snapshot(id).await.expect("read snapshots").unwrap_or_else(|| panic!("no snapshot of {id}"))
    }

    /// Every record of `topic`, decoded as `T` (others left out).
    async fn records<T: serde::de::DeserializeOwned + apache_avro::AvroSchema + 'static>(&self, topic: &str) -> Vec<T> {
        let records = self.client.read_to_end(topic).await.expect("read topic");
        records.into_iter().filter_map(|(_, p)| self.client.registry().decode::<T>(&p).ok()).collect()
    }
}

/// The child of `plan`'s step `step` (a `test` task): its id is fixed by its key.
fn child(plan: TaskId, step: &str) -> TaskId {
    TaskId::for_idempotency_key(TaskKind::TEST, &format!("plan/{plan}/{step}"))
}

async fn until(events: &mut EventStream, id: TaskId, done: impl FnMut(&ProgressEvent) -> bool) -> Vec<ProgressEvent> {
    events.until(id, WAIT, done).await.unwrap_or_else(|e| panic!("{e}"))
}

async fn until_final(events: &mut EventStream, id: TaskId) -> Vec<ProgressEvent> {
    until(events, id, |e| e.event.is_final()).await
}

fn test_step(name: &str, subject: &str, spec: TestTaskSpec) -> Value {
    json!({"name": name, "kind": "test", "subject": subject, "spec": serde_json::to_value(spec).unwrap()})
}

/// The time of `child`'s first `event` in its history.
fn at(history: &[ProgressEvent], event: EventType) -> i64 {
    history.iter().find(|e| e.event == event).unwrap_or_else(|| panic!("no {event:?} in {history:#?}")).at_ms
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_of_three_children_succeeds_and_its_revert_reverts_them_last_first() {
    let bed = Bed::start();
    let mut events = bed.client.events(true).await.unwrap();
    let (tests, plans) = (bed.test_worker(), bed.plan_worker("plan-worker").await);
    let plan = json!({"steps": [
        test_step("one", "plan-a/one", TestTaskSpec::steps(2)),
        test_step("two", "plan-a/two", TestTaskSpec::steps(3)),
        // Its subject comes from the first child's output, resolved when it runs.
        test_step("three", "after-${steps.one.task_id}", TestTaskSpec::steps(1)),
    ]});
    // Under a deadline, which the children inherit.
    let id = bed.submit_with("plan-a", plan, SubmitOptions { deadline: Some(Duration::from_secs(600)), ..SubmitOptions::default() }).await;
    let evs = until_final(&mut events, id).await;
    assert_eq!(evs.last().unwrap().event, EventType::Succeeded, "{evs:#?}");
    // The plan's progress shows its children as they move.
    let progress: Vec<&str> = evs.iter().filter(|e| e.event == EventType::StepProgress).filter_map(|e| e.message.as_deref()).collect();
    for step in ["one", "two", "three"] {
        let c = child(id, step).to_string();
        assert!(progress.iter().any(|m| m.starts_with(&format!("child {c} (test)"))), "progress of child {step}: {progress:#?}");
    }

    let snap = bed.snapshot(id).await;
    for step in ["one", "two", "three"] {
        let c = bed.snapshot(child(id, step)).await;
        assert_eq!(c.state, TaskState::Succeeded, "child {step}");
        assert_eq!(c.kind, TaskKind::TEST);
        assert_eq!(c.idempotency_key.as_deref(), Some(format!("plan/{id}/{step}").as_str()), "child {step} is linked by its key");
        assert_eq!(c.requested_by, format!("plan/{id}"), "child {step} names its plan");
        assert!(c.deadline_ms.is_some() && c.deadline_ms == snap.deadline_ms, "child {step} has its plan's deadline: {:?} {:?}", c.deadline_ms, snap.deadline_ms);
        let trace_id = |t: &Option<String>| t.as_deref().and_then(|t| t.split('-').nth(1)).map(str::to_owned);
        assert!(trace_id(&c.trace_parent).is_some() && trace_id(&c.trace_parent) == trace_id(&snap.trace_parent), "child {step} is traced under its plan");
        let out: Value = snap.output_of(step).expect("the plan step's output");
        assert_eq!(out["task_id"], json!(c.task_id));
        assert_eq!(out["outputs"]["step-1"]["step"], json!(1), "the child's own step outputs: {out}");
    }
    assert_eq!(bed.snapshot(child(id, "three")).await.subject, format!("after-{}", child(id, "one")), "a reference resolved at run time");

    bed.client.revert(id).await.unwrap();
    let evs = until(&mut events, id, |e| matches!(e.event, EventType::Reverted | EventType::RevertFailed)).await;
    assert_eq!(evs.last().unwrap().event, EventType::Reverted, "{evs:#?}");
    let undone: Vec<i32> = evs.iter().filter(|e| e.event == EventType::StepReverted).filter_map(|e| e.step).collect();
    assert_eq!(undone, [3, 2, 1]);
    let mut history = BTreeMap::new();
    for step in ["one", "two", "three"] {
        let c = child(id, step);
        assert_eq!(bed.snapshot(c).await.state, TaskState::Reverted, "child {step}");
        history.insert(step, bed.client.history(c).await.unwrap());
    }
    // Across workers, last first: each child's revert begins after the later one's ended.
    assert!(at(&history["three"], EventType::Reverted) <= at(&history["two"], EventType::Reverting), "three reverted before two began");
    assert!(at(&history["two"], EventType::Reverted) <= at(&history["one"], EventType::Reverting), "two reverted before one began");
    plans.stop().await;
    tests.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_child_reverts_the_plan_or_with_keep_partial_leaves_the_others() {
    let bed = Bed::start();
    let mut events = bed.client.events(true).await.unwrap();
    let (tests, plans) = (bed.test_worker(), bed.plan_worker("plan-worker").await);
    let plan = |p: &str| {
        json!({"steps": [
            test_step("one", &format!("{p}/one"), TestTaskSpec::steps(2)),
            test_step("two", &format!("{p}/two"), TestTaskSpec::steps(2)),
            test_step("three", &format!("{p}/three"), TestTaskSpec { fail_at: Some(2), ..TestTaskSpec::steps(3) }),
        ]})
    };

    let id = bed.submit("plan-b", plan("plan-b"), false).await;
    let evs = until_final(&mut events, id).await;
    assert_eq!(evs.last().unwrap().event, EventType::Reverted, "{evs:#?}");
    let failed = evs.iter().find(|e| e.event == EventType::StepFailed).expect("StepFailed");
    assert_eq!((failed.step, failed.code.as_deref()), (Some(3), Some("CHILD_FAILED")));
    let message = failed.message.as_deref().unwrap_or_default();
    assert!(message.contains(&child(id, "three").to_string()) && message.contains("INJECTED_FAILURE"), "names the child and its reason: {message}");
    for step in ["one", "two", "three"] {
        assert_eq!(bed.snapshot(child(id, step)).await.state, TaskState::Reverted, "child {step}");
    }
    assert_eq!(bed.snapshot(id).await.error.map(|e| e.code), Some("CHILD_FAILED".to_owned()));

    let kept = bed.submit("plan-c", plan("plan-c"), true).await;
    let evs = until_final(&mut events, kept).await;
    assert_eq!(evs.last().unwrap().event, EventType::Failed, "{evs:#?}");
    assert!(!evs.iter().any(|e| e.event == EventType::StepReverted), "keep-partial undoes nothing");
    for step in ["one", "two"] {
        assert_eq!(bed.snapshot(child(kept, step)).await.state, TaskState::Succeeded, "child {step} kept");
    }
    // The failed child kept its own finished step too: children inherit keep-partial.
    let three = bed.snapshot(child(kept, "three")).await;
    assert_eq!((three.state, three.keep_partial), (TaskState::Failed, true));
    plans.stop().await;
    tests.stop().await;
}

/// Cancelling a plan cancels the child it waits for (before, the child ran on, blocked
/// here for good), and the plan ends Cancelled only once the child has ended; reverting the
/// plan then reverts both children.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_plan_cancels_its_running_child_and_a_revert_undoes_both() {
    let bed = Bed::start();
    let mut events = bed.client.events(true).await.unwrap();
    let (tests, plans) = (bed.test_worker(), bed.plan_worker("plan-worker").await);
    let plan = json!({"steps": [
        test_step("one", "plan-x/one", TestTaskSpec::steps(1)),
        // Blocks in its first step until cancelled.
        test_step("two", "plan-x/two", TestTaskSpec { block_at: Some(1), ..TestTaskSpec::steps(2) }),
        test_step("three", "plan-x/three", TestTaskSpec::steps(1)),
    ]});
    let id = bed.submit("plan-x", plan, false).await;
    let two = child(id, "two");
    until(&mut events, two, |e| e.event == EventType::StepProgress).await;
    bed.client.cancel(id).await.unwrap();
    let evs = until_final(&mut events, id).await;
    assert_eq!(evs.last().unwrap().event, EventType::Cancelled, "{evs:#?}");
    let child_two = bed.client.history(two).await.unwrap();
    let ended = child_two.iter().find(|e| e.event.is_final()).unwrap_or_else(|| panic!("child two never ended: {child_two:#?}"));
    assert_eq!(ended.event, EventType::Cancelled, "child two was cancelled: {child_two:#?}");
    assert!(ended.at_ms <= evs.last().unwrap().at_ms, "the plan ended after its child");
    assert!(bed.snapshot(id).await.journal.len() == 2, "step three never started");

    bed.client.revert(id).await.unwrap();
    let evs = until(&mut events, id, |e| matches!(e.event, EventType::Reverted | EventType::RevertFailed)).await;
    assert_eq!(evs.last().unwrap().event, EventType::Reverted, "{evs:#?}");
    for step in ["one", "two"] {
        assert_eq!(bed.snapshot(child(id, step)).await.state, TaskState::Reverted, "child {step}");
    }
    // The children's Cancel and Reverts are the plan's (`tasks get`'s "Cancelled by" and
    // "Reverted by" name it), not the user the plan worker runs as.
    let mut controls = Vec::new();
    for (_, payload) in bed.client.read_to_end(&bed.topics.command(TaskKind::TEST).name).await.unwrap() {
        let env: CommandEnvelope = bed.client.registry().decode(&payload).unwrap();
        if env.idempotency_key.is_none() {
            controls.push((env.task_id, env.action, env.requested_by));
        }
    }
    // (The two children's subjects may be on two partitions: compared in one order.)
    controls.sort_by_key(|(task, action, _)| (task.clone(), *action as u8));
    let by = format!("plan/{id}");
    let mut want = [(two, ferry_runtime::CommandAction::Cancel), (two, ferry_runtime::CommandAction::Revert), (child(id, "one"), ferry_runtime::CommandAction::Revert)]
        .map(|(c, a)| (c.to_string(), a, by.clone()));
    want.sort_by_key(|(task, action, _)| (task.clone(), *action as u8));
    assert_eq!(controls, want, "the children's controls");
    plans.stop().await;
    tests.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_resumed_by_another_worker_re_attaches_and_submits_no_child_twice() {
    let bed = Bed::start();
    let mut events = bed.client.events(true).await.unwrap();
    let tests = bed.test_worker();
    let first = bed.plan_worker("plan-worker-1").await;
    let plan = json!({"steps": [
        test_step("one", "plan-d/one", TestTaskSpec::steps(2)),
        // Long enough to outlive the first plan worker's stop (2 s of grace).
        test_step("two", "plan-d/two", TestTaskSpec { step_ms: 2000, ..TestTaskSpec::steps(3) }),
        test_step("three", "plan-d/three", TestTaskSpec::steps(1)),
    ]});
    let id = bed.submit("plan-d", plan, false).await;
    until(&mut events, child(id, "two"), |e| e.event == EventType::StepStarted).await;
    // The plan worker stops while child two runs: its step is dropped at the await point.
    first.stop().await;
    assert_eq!(bed.snapshot(child(id, "two")).await.state, TaskState::Running, "child two still runs");
    assert!(!bed.snapshot(id).await.state.is_terminal(), "the plan is unfinished");

    let second = bed.plan_worker("plan-worker-2").await;
    let evs = until_final(&mut events, id).await;
    assert_eq!(evs.last().unwrap().event, EventType::Succeeded, "{evs:#?}");
    assert!(evs.iter().any(|e| e.worker == "plan-worker-2"), "the second worker finished the plan");
    let started_one = evs.iter().filter(|e| e.event == EventType::StepStarted && e.step == Some(1)).count();
    assert_eq!(started_one, 1, "the finished step one is not run again");

    // Exactly one Start command, and one task, per (plan, step).
    let prefix = format!("plan/{id}/");
    let mut starts: BTreeMap<String, usize> = BTreeMap::new();
    for env in bed.records::<CommandEnvelope>(&bed.topics.command(TaskKind::TEST).name).await {
        if let Some(key) = env.idempotency_key.filter(|k| k.starts_with(&prefix)) {
            *starts.entry(key).or_default() += 1;
        }
    }
    let expected: BTreeMap<String, usize> = ["one", "two", "three"].iter().map(|s| (format!("{prefix}{s}"), 1)).collect();
    assert_eq!(starts, expected, "one Start per child");
    let tasks: BTreeSet<(String, String)> = bed
        .records::<TaskSnapshot>(&bed.topics.task_state(TaskKind::TEST).name)
        .await
        .into_iter()
        .filter_map(|s| Some((s.idempotency_key.filter(|k| k.starts_with(&prefix))?, s.task_id)))
        .collect();
    assert_eq!(tasks.len(), 3, "one task per child: {tasks:?}");
    for step in ["one", "two", "three"] {
        let history = bed.client.history(child(id, step)).await.unwrap();
        assert_eq!(history.iter().filter(|e| e.event == EventType::Accepted).count(), 1, "child {step} accepted once");
        assert_eq!(bed.snapshot(child(id, step)).await.state, TaskState::Succeeded, "child {step}");
    }
    second.stop().await;
    tests.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reference_to_an_unknown_or_later_step_is_rejected_with_the_reason() {
    let bed = Bed::start();
    let mut events = bed.client.events(true).await.unwrap();
    let plans = bed.plan_worker("plan-worker").await;
    let with_ref = |r: &str| {
        json!({"steps": [
            test_step("one", "plan-e/one", TestTaskSpec::steps(1)),
            {"name": "two", "kind": "test", "subject": r, "spec": {"steps": 1}},
            test_step("three", "plan-e/three", TestTaskSpec::steps(1)),
        ]})
    };
    for (r, reason) in [
        ("${steps.four.task_id}", "steps[1] (two).subject: ${steps.four.task_id} refers to no step named \"four\" (the steps are: one, two, three)"),
        ("${steps.three.subject}", "steps[1] (two).subject: ${steps.three.subject} refers to steps[2], which runs after it; a step may refer only to earlier steps"),
    ] {
        let id = bed.submit("plan-e", with_ref(r), false).await;
        let evs = until_final(&mut events, id).await;
        let last = evs.last().unwrap();
        assert_eq!(last.event, EventType::Rejected, "{evs:#?}");
        assert_eq!(last.message.as_deref(), Some(format!("invalid plan spec: {reason}").as_str()));
        assert!(bed.records::<CommandEnvelope>(&bed.topics.command(TaskKind::TEST).name).await.is_empty(), "no child was submitted");
    }
    // A child the test kind's own rules refuse: before, step one ran, two was Rejected by
    // the test worker, and one was reverted.
    let bad = TestTaskSpec { fail_at: Some(3), ..TestTaskSpec::steps(2) };
    let id = bed.submit("plan-e", json!({"steps": [test_step("one", "plan-e/one", TestTaskSpec::steps(1)), test_step("two", "plan-e/two", bad)]}), false).await;
    let evs = until_final(&mut events, id).await;
    let last = evs.last().unwrap();
    assert_eq!(last.event, EventType::Rejected, "{evs:#?}");
    assert_eq!(last.message.as_deref(), Some("invalid plan spec: steps[1] (two): the test kind refuses this child: fail_at must name a step from 1 to 2, got 3"));
    assert!(bed.records::<CommandEnvelope>(&bed.topics.command(TaskKind::TEST).name).await.is_empty(), "no child was submitted");
    plans.stop().await;
}

/// A tenant's plan: sent on the tenant's own topic, its children are sent on the tenant's
/// behalf (ids in its space, `requested_by` `tenant:acme`) and held to its policy by their
/// own worker: a child outside it is Rejected naming the rule, and the plan reverts the
/// child before it. The tenant follows all of it on its own progress topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_plan_runs_its_children_on_its_behalf_and_within_its_policy() {
    let bed = Bed::start().with_policy("tenants: {acme: {plan: {}, test: {clusters: ['acme-*']}}}");
    let acme = Client::new(bed.kafka.clone(), bed.topics.clone()).expect("client").as_tenant("acme");
    let mut acme_events = acme.events(true).await.unwrap();
    let (tests, plans) = (bed.test_worker(), bed.plan_worker("plan-worker").await);
    let plan: PlanSpec = serde_json::from_value(json!({"steps": [
        test_step("one", "acme-1", TestTaskSpec::steps(2)),
        test_step("two", "globex-1", TestTaskSpec::steps(1)),
    ]}))
    .unwrap();
    let id = acme.submit(TaskKind::PLAN, "acme-rollout", &plan, SubmitOptions::default()).await.expect("submit");
    let evs = until_final(&mut acme_events, id).await;
    assert_eq!(evs.last().unwrap().event, EventType::Reverted, "{evs:#?}");
    let failed = evs.iter().find(|e| e.event == EventType::StepFailed).expect("StepFailed");
    assert!(failed.message.as_deref().unwrap_or_default().contains("tenants.acme.test.clusters"), "the child's refusal names the rule: {failed:?}");

    // The children are acme's: in its key space, asked for by it, told to it.
    let tenant_child = |step: &str| ferry_runtime::tenants::tenant_task_id(TaskKind::TEST, "acme", &format!("plan/{id}/{step}"));
    let one = bed.snapshot(tenant_child("one")).await;
    assert_eq!((one.requested_by.as_str(), one.state), ("tenant:acme", TaskState::Reverted));
    assert_eq!(one.idempotency_key, Some(format!("acme/plan/{id}/one")));
    let two = bed.snapshot(tenant_child("two")).await;
    assert_eq!((two.requested_by.as_str(), two.state), ("tenant:acme", TaskState::Rejected));
    for step in ["one", "two"] {
        let told = acme.history(tenant_child(step)).await.unwrap();
        assert!(told.iter().any(|e| e.event.is_final()), "acme reads child {step}'s end on its own topic: {told:#?}");
    }
    assert!(bed.client.snapshot(child(id, "one")).await.unwrap().is_none(), "no child in the operator's key space");
    plans.stop().await;
    tests.stop().await;
}

/// The child of `plan`'s fanned-out step `step` on `cluster` (a `test` task).
fn wave_child(plan: TaskId, step: &str, cluster: &str) -> TaskId {
    TaskId::for_idempotency_key(TaskKind::TEST, &format!("plan/{plan}/{step}/{cluster}"))
}

/// A plan of one step `roll`: a `test` child of `steps` steps, subject `<cluster>/app`, per
/// cluster of `for_each`.
fn roll(steps: i32, for_each: Value) -> Value {
    json!({"steps": [{
        "name": "roll", "kind": "test", "subject": "${cluster}/app",
        "spec": serde_json::to_value(TestTaskSpec::steps(steps)).unwrap(),
        "for_each": for_each,
    }]})
}

/// A plan of one `test` step fanned out over c1..c6 in waves of two, where c3's child
/// fails (an override), under the failure policy `on_failure`.
fn rollout(on_failure: &str) -> Value {
    roll(2, json!({
        "clusters": ["c1", "c2", "c3", "c4", "c5", "c6"],
        "waves": {"size": 2},
        "on_failure": on_failure,
        "overrides": [{"clusters": ["c3"], "spec": {"fail_at": 2}}],
    }))
}

/// The state of each of `clusters`' children (`None`: never submitted).
async fn states(bed: &Bed, plan: TaskId, clusters: &[&str]) -> Vec<Option<TaskState>> {
    let mut out = Vec::new();
    for c in clusters {
        out.push(bed.client.snapshot(wave_child(plan, "roll", c)).await.expect("read snapshots").map(|s| s.state));
    }
    out
}

/// Waves run one after another: every child of a wave is accepted only after each child
/// of the wave before it ended; a failed wave under `revert-wave` has its own children
/// reverted (the failed one reverted itself) while the earlier wave stays, the later
/// waves never start, and the plan ends Failed; its Revert then undoes the first wave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_fanned_out_runs_in_waves_and_revert_wave_puts_back_only_the_failed_wave() {
    let bed = Bed::start();
    let mut events = bed.client.events(true).await.unwrap();
    let (tests, plans) = (bed.test_worker(), bed.plan_worker("plan-worker").await);
    let id = bed.submit("rollout-a", rollout("revert-wave"), false).await;
    let evs = until_final(&mut events, id).await;
    assert_eq!(evs.last().unwrap().event, EventType::Failed, "{evs:#?}");
    let failed = evs.iter().find(|e| e.event == EventType::StepFailed).expect("StepFailed");
    let message = failed.message.as_deref().unwrap_or_default();
    assert_eq!((failed.step, failed.code.as_deref()), (Some(2), Some("CHILD_FAILED")), "{message}");
    assert!(message.starts_with("step roll: wave 2/3 failed: c3: child ") && message.contains("INJECTED_FAILURE"), "{message}");
    assert!(message.contains("on_failure: revert-wave: 1 of its children reverted; the waves before it (1) stay"), "{message}");
    assert!(!evs.iter().any(|e| e.event == EventType::StepReverted), "the plan itself undid nothing");
    // Each child's end moves the step on, by the share of its children ended; it never
    // goes back (before, it stood at 0 % through the first wave).
    let progress: Vec<(i32, String)> =
        evs.iter().filter(|e| e.event == EventType::StepProgress && e.step == Some(2)).map(|e| (e.percent.unwrap_or(-1), e.message.clone().unwrap_or_default())).collect();
    assert!(progress.windows(2).all(|p| p[0].0 <= p[1].0), "{progress:#?}");
    let ended: Vec<&(i32, String)> = progress.iter().filter(|(_, m)| m.contains("'s child ")).collect();
    assert_eq!(ended.len(), 4, "c1 .. c4's ends: {progress:#?}");
    assert!(ended.iter().any(|(p, m)| *p == 16 && (m == "wave 1/3: c1's child succeeded (1 of 2 ended)" || m == "wave 1/3: c2's child succeeded (1 of 2 ended)")), "{progress:#?}");
    // c3 and c4 end in either order: c3's is the third or the fourth end of six.
    let c3 = ended.iter().find(|(_, m)| m.starts_with("wave 2/3: c3's child failed (")).expect("c3's end");
    assert!(matches!((c3.0, c3.1.ends_with("(1 of 2 ended)")), (50, true) | (66, false)), "{progress:#?}");
    // The failed step's record of what it started, kept in its journal for its undo.
    let record: Value = serde_json::from_str(bed.snapshot(id).await.journal[1].output.as_deref().expect("the failed step's record")).unwrap();
    assert_eq!(record["waves_started"], json!(2), "{record}");
    assert_eq!(record["clusters"].as_object().map(|m| m.keys().cloned().collect::<Vec<_>>()), Some(vec!["c1".into(), "c2".into(), "c3".into(), "c4".into()]), "{record}");
    let all = ["c1", "c2", "c3", "c4", "c5", "c6"];
    use TaskState::{Reverted, Succeeded};
    assert_eq!(states(&bed, id, &all).await, [Some(Succeeded), Some(Succeeded), Some(Reverted), Some(Reverted), None, None]);
    // Each child's subject is its cluster's; wave 2 began after wave 1 ended.
    let mut history = BTreeMap::new();
    for c in ["c1", "c2", "c3", "c4"] {
        assert_eq!(bed.snapshot(wave_child(id, "roll", c)).await.subject, format!("{c}/app"));
        history.insert(c, bed.client.history(wave_child(id, "roll", c)).await.unwrap());
    }
    let wave_one_ended = at(&history["c1"], EventType::Succeeded).max(at(&history["c2"], EventType::Succeeded));
    for c in ["c3", "c4"] {
        assert!(at(&history[c], EventType::Accepted) >= wave_one_ended, "{c} was accepted before wave 1 ended");
    }
    let progress: Vec<&str> = evs.iter().filter(|e| e.event == EventType::StepProgress).filter_map(|e| e.message.as_deref()).collect();
    for m in ["6 clusters: c1, c2, c3, c4, c5, c6", "wave 1/3: 2 children: c1, c2", "wave 1/3 passed", "wave 2/3: 2 children: c3, c4"] {
        assert!(progress.contains(&m), "progress {m:?} in {progress:#?}");
    }

    bed.client.revert(id).await.unwrap();
    let evs = until(&mut events, id, |e| matches!(e.event, EventType::Reverted | EventType::RevertFailed)).await;
    assert_eq!(evs.last().unwrap().event, EventType::Reverted, "{evs:#?}");
    assert_eq!(states(&bed, id, &all).await, [Some(Reverted), Some(Reverted), Some(Reverted), Some(Reverted), None, None]);
    plans.stop().await;
    tests.stop().await;
}

/// The other two policies for a failed wave: `revert-all` (the default) reverts every
/// started child and the plan; `halt` leaves every child as it is, the plan Failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_wave_under_revert_all_reverts_the_plan_and_under_halt_keeps_everything() {
    let bed = Bed::start();
    let mut events = bed.client.events(true).await.unwrap();
    let (tests, plans) = (bed.test_worker(), bed.plan_worker("plan-worker").await);
    let all = ["c1", "c2", "c3", "c4", "c5", "c6"];
    use TaskState::{Reverted, Succeeded};

    let id = bed.submit("rollout-b", rollout("revert-all"), false).await;
    let evs = until_final(&mut events, id).await;
    assert_eq!(evs.last().unwrap().event, EventType::Reverted, "{evs:#?}");
    assert_eq!(states(&bed, id, &all).await, [Some(Reverted), Some(Reverted), Some(Reverted), Some(Reverted), None, None]);

    let id = bed.submit("rollout-c", rollout("halt"), false).await;
    let evs = until_final(&mut events, id).await;
    assert_eq!(evs.last().unwrap().event, EventType::Failed, "{evs:#?}");
    let message = evs.iter().find(|e| e.event == EventType::Failed).and_then(|e| e.message.clone()).unwrap_or_default();
    assert!(message.contains("on_failure: halt"), "{message}");
    assert_eq!(states(&bed, id, &all).await, [Some(Succeeded), Some(Succeeded), Some(Reverted), Some(Succeeded), None, None]);
    plans.stop().await;
    tests.stop().await;
}

/// A fanned-out step that says nothing per cluster, or picks its clusters two ways, is
/// refused before anything runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fanned_out_step_without_cluster_or_with_two_choices_is_rejected() {
    let bed = Bed::start();
    let mut events = bed.client.events(true).await.unwrap();
    let plans = bed.plan_worker("plan-worker").await;
    for (for_each, reason) in [
        (json!({"clusters": ["c1"]}), "steps[0] (roll): neither the spec nor the subject uses ${cluster}: every cluster would get the same command"),
        (json!({"clusters": ["c1"], "labels": {"env": "prod"}}), "steps[0] (roll).for_each: choose the clusters one way: clusters (names), labels, or cluster_set (got 2)"),
        (json!({"clusters": ["c1"], "on_failure": "stop"}), "steps[0] (roll).for_each.on_failure \"stop\": one of revert-all, revert-wave, halt, pause"),
        (
            json!({"clusters": ["c1"], "waves": {"gate": {"score": {"name": "ferry-resource-usage", "item": "score", "min": 101}}}}),
            "steps[0] (roll).for_each.waves.gate.score.min: -100 to 100 (OCM's score range), got 101",
        ),
    ] {
        let subject = if reason.contains("${cluster}") { "same" } else { "${cluster}/app" };
        let plan = json!({"steps": [{"name": "roll", "kind": "test", "subject": subject, "spec": {"steps": 1}, "for_each": for_each}]});
        let id = bed.submit("rollout-d", plan, false).await;
        let evs = until_final(&mut events, id).await;
        let last = evs.last().unwrap();
        assert_eq!((last.event, last.message.as_deref()), (EventType::Rejected, Some(format!("invalid plan spec: {reason}").as_str())));
    }
    plans.stop().await;
}

/// A plan worker lost in the middle of a fanned-out step's second wave: another one
/// resumes it, re-attaches to the running wave's children, runs the last wave, and no
/// child is submitted twice (the first wave's children are not run again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_resumed_inside_a_wave_re_attaches_and_submits_no_child_twice() {
    let bed = Bed::start();
    let mut events = bed.client.events(true).await.unwrap();
    let tests = bed.test_worker();
    let first = bed.plan_worker("plan-worker-1").await;
    let clusters = ["c1", "c2", "c3", "c4", "c5", "c6"];
    let plan = roll(1, json!({
        "clusters": clusters,
        "waves": {"size": 2},
        // Wave 2's children (9 s each) outlive the first plan worker's stop (2 s of
        // grace) with room to spare on a loaded machine.
        "overrides": [{"clusters": ["c3", "c4"], "spec": {"steps": 3, "step_ms": 3000}}],
    }));
    let id = bed.submit("rollout-e", plan, false).await;
    until(&mut events, wave_child(id, "roll", "c3"), |e| e.event == EventType::StepStarted).await;
    first.stop().await;
    assert_eq!(bed.snapshot(wave_child(id, "roll", "c3")).await.state, TaskState::Running, "c3's child still runs");
    assert!(!bed.snapshot(id).await.state.is_terminal(), "the plan is unfinished");

    let second = bed.plan_worker("plan-worker-2").await;
    let evs = until_final(&mut events, id).await;
    assert_eq!(evs.last().unwrap().event, EventType::Succeeded, "{evs:#?}");
    assert!(evs.iter().any(|e| e.worker == "plan-worker-2"), "the second worker finished the plan");
    let prefix = format!("plan/{id}/roll/");
    let mut starts: BTreeMap<String, usize> = BTreeMap::new();
    for env in bed.records::<CommandEnvelope>(&bed.topics.command(TaskKind::TEST).name).await {
        if let Some(key) = env.idempotency_key.filter(|k| k.starts_with(&prefix)) {
            *starts.entry(key).or_default() += 1;
        }
    }
    let expected: BTreeMap<String, usize> = clusters.iter().map(|c| (format!("{prefix}{c}"), 1)).collect();
    assert_eq!(starts, expected, "one Start per child");
    for c in clusters {
        let history = bed.client.history(wave_child(id, "roll", c)).await.unwrap();
        assert_eq!(history.iter().filter(|e| e.event == EventType::Accepted).count(), 1, "{c}'s child accepted once");
        assert_eq!(history.iter().filter(|e| e.event == EventType::StepStarted && e.step == Some(1)).count(), 1, "{c}'s child ran once");
        assert_eq!(bed.snapshot(wave_child(id, "roll", c)).await.state, TaskState::Succeeded, "{c}'s child");
    }
    second.stop().await;
    tests.stop().await;
}

/// Cancelling a plan inside a wave cancels the wave's running children; its Revert then
/// reverts every child that ran, though the step recorded nothing (it was cancelled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_plan_inside_a_wave_cancels_its_children_and_a_revert_undoes_them() {
    let bed = Bed::start();
    let mut events = bed.client.events(true).await.unwrap();
    let (tests, plans) = (bed.test_worker(), bed.plan_worker("plan-worker").await);
    let plan = roll(2, json!({
        "clusters": ["c1", "c2", "c3", "c4", "c5"],
        "waves": {"size": 2},
        // Wave 2 blocks in its children's first step until they are cancelled.
        "overrides": [{"clusters": ["c3", "c4"], "spec": {"block_at": 1}}],
    }));
    let id = bed.submit("rollout-f", plan, false).await;
    for c in ["c3", "c4"] {
        until(&mut events, wave_child(id, "roll", c), |e| e.event == EventType::StepProgress).await;
    }
    bed.client.cancel(id).await.unwrap();
    let evs = until_final(&mut events, id).await;
    assert_eq!(evs.last().unwrap().event, EventType::Cancelled, "{evs:#?}");
    use TaskState::{Cancelled, Reverted, Succeeded};
    let all = ["c1", "c2", "c3", "c4", "c5"];
    assert_eq!(states(&bed, id, &all).await, [Some(Succeeded), Some(Succeeded), Some(Cancelled), Some(Cancelled), None]);

    bed.client.revert(id).await.unwrap();
    let evs = until(&mut events, id, |e| matches!(e.event, EventType::Reverted | EventType::RevertFailed)).await;
    assert_eq!(evs.last().unwrap().event, EventType::Reverted, "{evs:#?}");
    assert_eq!(states(&bed, id, &all).await, [Some(Reverted), Some(Reverted), Some(Reverted), Some(Reverted), None]);
    plans.stop().await;
    tests.stop().await;
}

/// The first event of `id` whose message starts with `text` (waits for it).
async fn progress_starting(events: &mut EventStream, id: TaskId, text: &str) -> ProgressEvent {
    let evs = until(events, id, |e| e.event == EventType::StepProgress && e.message.as_deref().is_some_and(|m| m.starts_with(text))).await;
    evs.last().cloned().unwrap()
}

/// A Signal as a client sends it, with `key` as its idempotency key (a redelivered
/// command has the same one).
fn signal_command(plan: TaskId, subject: &str, name: &str, key: &str) -> CommandEnvelope {
    CommandEnvelope {
        task_id: plan.to_string(),
        kind: TaskKind::PLAN,
        action: ferry_runtime::protocol::CommandAction::Signal,
        subject: subject.into(),
        idempotency_key: Some(key.into()),
        requested_by: "operator".into(),
        created_at_ms: ferry_runtime::protocol::now_ms(),
        deadline_ms: None,
        keep_partial: false,
        reason: None,
        spec: ferry_runtime::protocol::Bytes::default(),
        signal: Some(name.into()),
    }
}

/// People steer the waves with Signals: each wave after the first waits for `approve`; a
/// `pause` holds the next wave until `resume`. A Signal is recorded in the plan's snapshot
/// once per idempotency key (a redelivered command adds nothing) and told as a Signalled
/// event; one sent to a task that has ended is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waves_wait_for_approval_and_a_pause_holds_the_next_wave_until_resumed() {
    let bed = Bed::start();
    let mut events = bed.client.events(true).await.unwrap();
    let (tests, plans) = (bed.test_worker(), bed.plan_worker("plan-worker").await);
    let plan = roll(1, json!({"clusters": ["c1", "c2", "c3"], "waves": {"size": 1, "approve": true}}));
    let id = bed.submit("rollout-g", plan, false).await;
    progress_starting(&mut events, id, "wave 2/3 waits for approval").await;
    assert_eq!(states(&bed, id, &["c1", "c2"]).await, [Some(TaskState::Succeeded), None], "wave 2 waits");

    // Pause, then approve: the approval is not enough while paused. The pause is sent
    // twice with one key (a redelivery): one is recorded.
    for _ in 0..2 {
        bed.client.send(&signal_command(id, "rollout-g", "pause", "sig/pause-1"), None).await.unwrap();
    }
    bed.client.signal(id, "approve", Some("looks good".into())).await.unwrap();
    let approved = until(&mut events, id, |e| e.event == EventType::Signalled && e.message.as_deref().is_some_and(|m| m.starts_with("signal approve"))).await;
    assert_eq!(approved.iter().filter(|e| e.event == EventType::Signalled).count(), 2, "pause once, then approve: {approved:#?}");
    progress_starting(&mut events, id, "paused before wave 2/3").await;
    assert_eq!(states(&bed, id, &["c2"]).await, [None], "paused: wave 2 does not start");
    let names: Vec<String> = bed.snapshot(id).await.signals.iter().map(|s| s.name.clone()).collect();
    assert_eq!(names, ["pause", "approve"]);

    bed.client.signal(id, "resume", None).await.unwrap();
    progress_starting(&mut events, id, "wave 3/3 waits for approval").await;
    assert_eq!(states(&bed, id, &["c2", "c3"]).await, [Some(TaskState::Succeeded), None]);
    bed.client.signal(id, "approve", None).await.unwrap();
    let evs = until_final(&mut events, id).await;
    assert_eq!(evs.last().unwrap().event, EventType::Succeeded, "{evs:#?}");
    assert_eq!(states(&bed, id, &["c1", "c2", "c3"]).await, [Some(TaskState::Succeeded); 3]);

    // The plan has ended: a Signal is refused, naming why.
    bed.client.signal(id, "approve", None).await.unwrap();
    let refused = until(&mut events, id, |e| e.event == EventType::Rejected && e.seq == 0).await;
    let m = refused.last().unwrap().message.clone().unwrap_or_default();
    assert!(m.contains("has ended (succeeded): a signal reaches only a queued or running task"), "{m}");
    plans.stop().await;
    tests.stop().await;
}

/// A plan reverted while its next wave waits for an approval undoes the waves that ran
/// and does not wait for children of the unapproved wave to appear: the recorded
/// approvals say it never started (before, its revert waited out the appear grace, 30 s on
/// a real worker; here an hour, past the wait's deadline).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_reverted_while_it_waits_for_an_approval_undoes_at_once() {
    let bed = Bed::start();
    let mut events = bed.client.events(true).await.unwrap();
    let (tests, plans) = (bed.test_worker(), bed.plan_worker_with("plan-worker", Duration::from_secs(3600)).await);
    let plan = roll(1, json!({"clusters": ["c1", "c2", "c3"], "waves": {"size": 1, "approve": true}}));
    let id = bed.submit("rollout-r", plan, false).await;
    progress_starting(&mut events, id, "wave 2/3 waits for approval").await;
    bed.client.revert(id).await.unwrap();
    let evs = until(&mut events, id, |e| matches!(e.event, EventType::Reverted | EventType::RevertFailed)).await;
    assert_eq!(evs.last().unwrap().event, EventType::Reverted, "{evs:#?}");
    let undone: Vec<&str> = evs.iter().filter(|e| e.event == EventType::StepProgress).filter_map(|e| e.message.as_deref()).filter(|m| m.contains("reverted")).collect();
    assert_eq!(undone, ["wave 1/3: 1 child reverted"], "only the wave that ran is undone: {evs:#?}");
    assert_eq!(states(&bed, id, &["c1", "c2", "c3"]).await, [Some(TaskState::Reverted), None, None]);
    plans.stop().await;
    tests.stop().await;
}

/// `on_failure: pause`: a failed wave holds the plan (nothing reverted, the next wave not
/// started) until a person signals `resume`; the plan then goes on and records the wave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_wave_under_pause_waits_for_resume_then_goes_on() {
    let bed = Bed::start();
    let mut events = bed.client.events(true).await.unwrap();
    let (tests, plans) = (bed.test_worker(), bed.plan_worker("plan-worker").await);
    let plan = roll(1, json!({
        "clusters": ["c1", "c2", "c3"], "waves": {"size": 1}, "on_failure": "pause",
        "overrides": [{"clusters": ["c2"], "spec": {"fail_at": 1}}],
    }));
    let id = bed.submit("rollout-h", plan, false).await;
    let paused = progress_starting(&mut events, id, "wave 2/3 failed: c2: child ").await;
    assert!(paused.message.as_deref().unwrap_or_default().contains(&format!("`ferry tasks signal {id} resume` goes on")), "{paused:?}");
    use TaskState::{Reverted, Succeeded};
    assert_eq!(states(&bed, id, &["c1", "c2", "c3"]).await, [Some(Succeeded), Some(Reverted), None], "held after the failed wave");
    assert_eq!(bed.snapshot(id).await.state, TaskState::Running);

    bed.client.signal(id, "resume", None).await.unwrap();
    let evs = until_final(&mut events, id).await;
    assert_eq!(evs.last().unwrap().event, EventType::Succeeded, "{evs:#?}");
    assert_eq!(states(&bed, id, &["c1", "c2", "c3"]).await, [Some(Succeeded), Some(Reverted), Some(Succeeded)]);
    let out: Value = bed.snapshot(id).await.output_of("roll").unwrap();
    assert_eq!(out["failed_waves"], json!([2]), "{out}");
    plans.stop().await;
    tests.stop().await;
}

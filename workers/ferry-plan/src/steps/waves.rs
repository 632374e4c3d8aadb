//! The second half of a fanned-out step (`for_each`): one child per chosen cluster
//! ([`crate::steps::select`]), in waves.
//!
//! # Waves
//! The clusters, in the chosen order, cut into waves of `waves.size`. A wave's children
//! run at most `waves.max_in_flight` at once; the next wave starts `waves.pause_seconds`
//! after this one passed its gate. The gate: every child of the wave Succeeded, and, after
//! `waves.soak_seconds`, is still Succeeded (nobody reverted or replaced it meanwhile);
//! with `waves.gate`, the hub then also says, of each cluster of the wave, that its
//! ManagedCluster is Available and/or that its AddOnPlacementScore item reaches the
//! minimum (and is not past `validUntil`). A wave that fails its gate fails as one whose
//! child failed.
//!
//! # A wave that fails (`on_failure`)
//! - `revert-all` (the default): the step fails; the plan reverts as usual (every started
//!   child of every wave, then the earlier steps) or keeps it all with keep-partial.
//! - `revert-wave`: the failed wave's children are reverted here; the earlier waves stay;
//!   the plan ends Failed ([`StepError::keeps_done`]); its Revert undoes the rest later.
//! - `halt`: nothing is reverted; the plan ends Failed.
//! - `pause`: nothing is reverted; the plan waits for a person: Signal `resume` goes on
//!   with the next wave (the output lists the failed waves), a Revert undoes it all, a
//!   Cancel stops it.
//!
//! # People (Signals: `ferry tasks signal <plan> <name>`)
//! With `waves.approve`, each wave after the first waits for an `approve` (the n-th lets
//! wave n+1 start). A `pause` holds the next wave until a `resume` (each pause, and each
//! wave failed under `on_failure: pause`, takes one resume). Signals are durable (the
//! plan's snapshot), so a resumed run counts them again; a wave it finds started was let
//! through before and is not held again.
//!
//! # Children
//! Each child's idempotency key is `plan/<plan>/<step>/<cluster>`: a resumed run re-attaches
//! to the children it submitted (waves that passed are not run again, their children
//! already Succeeded). Its spec is the step's, with the overrides for its cluster merged in
//! (RFC 7386) and `${cluster}` replaced by the cluster's name.
//!
//! # Output
//! `{"kind", "clusters": {<cluster>: <child task id>}, "waves": [[<cluster>...]...],
//! "waves_started"}`; a failed run records the same for the waves it started
//! ([`StepError::with_output`]), so its undo reverts exactly those children.
//!
//! # Undo
//! The started waves' children, last wave first, each wave's at most `max_in_flight` at
//! once. Without a recorded output (the plan stopped inside the step, or was cancelled),
//! the waves are scanned for children that have a snapshot, and the wave after the last
//! such one is given the appear grace (its Starts may have been on their way), unless it
//! could not have started: under `approve`, a wave the recorded approvals never let
//! through.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ferry_kube::kinds::{AddOnPlacementScore, ManagedCluster};
use ferry_kube::step_errors::hub_err;
use ferry_task::protocol::TaskSnapshot;
use ferry_task::{Step, StepContext, StepError, StepPolicy, TaskId, TaskKind, TaskState, codes};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt, stream};
use kube::api::Api;
use serde_json::{Value, json};

use crate::handler::PlanConfig;
use crate::refs;
use crate::spec::{ForEach, Gate, OnFailure, PlanSpec, PlanStep};
use crate::steps::child::{Child, command, wave_child_key};
use crate::steps::select::{self, MAX_CLUSTERS};

/// How many failed children a wave's failure names before "and N more".
const NAMED_FAILURES: usize = 3;

/// A fanned-out step's children, in waves.
pub struct WaveStep {
    step: PlanStep,
    each: ForEach,
    kind: TaskKind,
    on_failure: OnFailure,
    cfg: PlanConfig,
}

/// `step`'s spec for `cluster`'s child: the overrides of `each` for it merged in,
/// `${cluster}` put in (what the run sends, and what a dry run shows).
pub fn spec_for(step: &PlanStep, each: &ForEach, cluster: &str) -> Result<Value, StepError> {
    let bad = |e: serde_json::Error| StepError::permanent(codes::INTERNAL, format!("step {}: the validated spec no longer parses: {e}", step.name));
    let mut spec = step.spec_value().map_err(bad)?;
    for o in each.overrides.iter().filter(|o| o.clusters.iter().any(|c| c == cluster)) {
        json_patch::merge(&mut spec, &serde_json::from_str(&o.spec).map_err(bad)?);
    }
    Ok(refs::put_cluster(&spec, cluster))
}

/// The subject `step` gives `cluster`'s child, `${cluster}` put in (`None`: the kind's
/// own rule derives it from the spec): what the run sends, and what a dry run checks.
pub fn subject_for(step: &PlanStep, cluster: &str) -> Option<String> {
    step.subject.as_ref().map(|s| s.replace(refs::CLUSTER, cluster))
}

/// Checks the children `step` sends to `clusters` before any is sent, as its kind will check
/// each, and that no two share a subject ([`crate::validate::fanned_children`]); `resolve`
/// puts earlier steps' outputs in a child's subject and spec. Clusters chosen on the hub
/// are known only when the step runs, so its choice of clusters checks them then.
pub fn check_children(
    step: &PlanStep,
    each: &ForEach,
    clusters: &[String],
    resolve: impl Fn(Option<String>, Value) -> Result<(Option<String>, Value), StepError>,
) -> Result<(), StepError> {
    let Some((info, children)) = resolved_children(step, each, clusters, resolve)? else { return Ok(()) };
    crate::validate::fanned_children(&format!("step {}", step.name), info, &children).map_err(|r| StepError::rejected(codes::CHILD_SPEC, r.reason))
}

/// Only that no two of the children `step` sends to `clusters` share a subject (a dry run,
/// which previews each child as its kind does, of a step that uses no earlier outputs).
pub fn check_subjects(step: &PlanStep, each: &ForEach, clusters: &[String]) -> Result<(), StepError> {
    let Some((info, children)) = resolved_children(step, each, clusters, |subject, spec| Ok((subject, spec)))? else { return Ok(()) };
    crate::validate::shared_subject(&format!("step {}", step.name), info, &children).map_err(|r| StepError::rejected(codes::CHILD_SPEC, r.reason))
}

/// A cluster's child: the cluster, the subject given (`None`: the kind derives it), the spec.
pub(crate) type ChildAt = (String, Option<String>, Value);

/// Each cluster's child of `step`, earlier outputs put in, with its
/// kind (`None`: a kind this program does not know, which the child's worker checks).
fn resolved_children(
    step: &PlanStep,
    each: &ForEach,
    clusters: &[String],
    resolve: impl Fn(Option<String>, Value) -> Result<(Option<String>, Value), StepError>,
) -> Result<Option<(&'static ferry_task::kind::KindInfo, Vec<ChildAt>)>, StepError> {
    let Some(info) = step.kind.parse().ok().and_then(ferry_task::kind::info) else { return Ok(None) };
    let mut children = Vec::with_capacity(clusters.len());
    for c in clusters {
        let (subject, spec) = resolve(subject_for(step, c), spec_for(step, each, c)?)?;
        children.push((c.clone(), subject, spec));
    }
    Ok(Some((info, children)))
}

/// What became of one child of a wave.
enum Outcome {
    /// It ended Succeeded.
    Succeeded(TaskId),
    /// It ended otherwise, or could not be started or followed: why.
    Failed(Option<TaskId>, String),
}

impl WaveStep {
    /// The waves of `step` (which has `for_each`); fails when its kind does not parse
    /// (`validate` refuses such a plan, so only a bug gets here).
    pub fn new(step: PlanStep, each: ForEach, cfg: PlanConfig) -> Result<Self, ferry_task::kind::UnknownKind> {
        let kind = step.kind.parse()?;
        let on_failure = OnFailure::parse(each.on_failure.as_deref()).unwrap_or(OnFailure::RevertAll);
        Ok(Self { step, each, kind, on_failure, cfg })
    }

    fn child(&self, plan: &TaskId, cluster: &str) -> Child<'_> {
        Child {
            kind: self.kind,
            key: wave_child_key(plan, &self.step.name, cluster),
            label: format!("{}/{cluster}", self.step.name),
            parent: *plan,
            cfg: &self.cfg,
        }
    }

    /// The clusters the select step chose.
    fn clusters(&self, cx: &StepContext<'_, PlanSpec>) -> Option<Vec<String>> {
        cx.outputs.get(&select::step_name(&self.step.name)).and_then(select::chosen)
    }

    /// `clusters` cut into waves.
    fn waves<'c>(&self, clusters: &'c [String]) -> Vec<&'c [String]> {
        let size = usize::try_from(self.each.waves.size).ok().filter(|s| *s > 0).unwrap_or(clusters.len().max(1));
        clusters.chunks(size).collect()
    }

    fn in_flight(&self, wave: usize) -> usize {
        usize::try_from(self.each.waves.max_in_flight).ok().filter(|m| *m > 0).unwrap_or(wave.max(1))
    }

    fn pause(&self) -> Duration {
        Duration::from_secs(u64::try_from(self.each.waves.pause_seconds).unwrap_or(0))
    }

    fn soak(&self) -> Duration {
        Duration::from_secs(u64::try_from(self.each.waves.soak_seconds).unwrap_or(0))
    }

    fn spec_for(&self, cluster: &str) -> Result<Value, StepError> {
        spec_for(&self.step, &self.each, cluster)
    }

    /// Starts (or re-attaches to, `known` its snapshot) `cluster`'s child and waits for its end.
    async fn run_child(&self, cx: &StepContext<'_, PlanSpec>, cluster: String, known: Option<TaskSnapshot>) -> (String, Result<Outcome, StepError>) {
        let outcome = self.child_outcome(cx, &cluster, known).await;
        (cluster, outcome)
    }

    async fn child_outcome(&self, cx: &StepContext<'_, PlanSpec>, cluster: &str, known: Option<TaskSnapshot>) -> Result<Outcome, StepError> {
        let child = self.child(cx.task_id, cluster);
        let subject = subject_for(&self.step, cluster);
        let started = match self.spec_for(cluster) {
            Ok(spec) => {
                let key = child.key.clone();
                child.start_known(cx, known, || command(cx, self.kind, &child.label, key, subject.as_deref(), &spec)).await
            }
            Err(e) => Err(e),
        };
        let id = match started {
            Ok((id, _)) => id,
            Err(e) if e.transient => return Err(e),
            Err(e) => return Ok(Outcome::Failed(None, format!("{cluster}: {}: {}", e.code, e.message))),
        };
        match child.end(id, &mut |_| {}).await {
            Ok(end) if end.state == TaskState::Succeeded => Ok(Outcome::Succeeded(id)),
            Ok(end) => Ok(Outcome::Failed(Some(id), format!("{cluster}: {}", child.failed(&end).message))),
            Err(e) if e.transient => Err(e),
            Err(e) => Ok(Outcome::Failed(Some(id), format!("{cluster}: {}: {}", e.code, e.message))),
        }
    }

    /// Cancels `cluster`'s child if it runs (a wave not started has none to stop).
    async fn cancel_child(&self, cx: &StepContext<'_, PlanSpec>, cluster: String, reason: String) -> Result<(), StepError> {
        let child = self.child(cx.task_id, &cluster);
        let id = child.id(cx.requested_by);
        match self.cfg.children.snapshot(id).await.map_err(crate::steps::child::step_error)? {
            Some(s) if !s.state.is_terminal() => child.cancel(id, Some(s), reason).await.map(|_| ()),
            _ => Ok(()),
        }
    }

    /// Reverts `cluster`'s child (see [`Child::revert`]).
    async fn revert_child(&self, cx: &StepContext<'_, PlanSpec>, cluster: String, why: &str) -> Result<bool, StepError> {
        let child = self.child(cx.task_id, &cluster);
        let id = child.id(cx.requested_by);
        child.revert(id, None, format!("plan {} {why} (step {}, cluster {cluster})", cx.task_id, self.step.name)).await
    }

    /// Whether any child of `wave` has a snapshot (the wave started, in this run or one
    /// before it).
    async fn started(&self, cx: &StepContext<'_, PlanSpec>, wave: &[String]) -> Result<bool, StepError> {
        Ok(self.known(cx, wave).await?.values().any(Option::is_some))
    }

    /// The snapshots of `wave`'s children, read at once, by cluster.
    async fn known(&self, cx: &StepContext<'_, PlanSpec>, wave: &[String]) -> Result<BTreeMap<String, Option<TaskSnapshot>>, StepError> {
        let ids: Vec<TaskId> = wave.iter().map(|c| self.child(cx.task_id, c).id(cx.requested_by)).collect();
        let snaps = self.cfg.children.snapshots(&ids).await.map_err(crate::steps::child::step_error)?;
        Ok(wave.iter().cloned().zip(snaps).collect())
    }

    /// Before wave `w` (from 0, not the first): its approval when the waves ask for one,
    /// then no pause outstanding. Each waits for the person's Signal (bounded by the step's
    /// timeout and the plan's deadline; a Cancel or Revert of the plan ends it).
    async fn await_people(&self, cx: &StepContext<'_, PlanSpec>, (w, n, at): (usize, usize, u8), failed_and_resumed: usize) {
        let plan = cx.task_id;
        if self.each.waves.approve && count(&cx.signals(), APPROVE) < w {
            cx.progress(at, format!("wave {}/{n} waits for approval: `ferry tasks signal {plan} approve`", w + 1));
            cx.wait_for_signals(|s| count(s, APPROVE) >= w).await;
            cx.progress(at, format!("wave {}/{n} approved", w + 1));
        }
        let paused = |s: &[String]| count(s, RESUME) < count(s, PAUSE) + failed_and_resumed;
        if paused(&cx.signals()) {
            cx.progress(at, format!("paused before wave {}/{n} (signal pause): `ferry tasks signal {plan} resume` goes on", w + 1));
            cx.wait_for_signals(|s| !paused(s)).await;
            cx.progress(at, format!("resumed before wave {}/{n}", w + 1));
        }
    }

    /// The gate after the soak: each of the wave's children still Succeeded.
    async fn soaked(&self, cx: &StepContext<'_, PlanSpec>, wave: &[String]) -> Result<Vec<String>, StepError> {
        let mut failed = Vec::new();
        for cluster in wave {
            let child = self.child(cx.task_id, cluster);
            let id = child.id(cx.requested_by);
            match self.cfg.children.snapshot(id).await.map_err(crate::steps::child::step_error)? {
                Some(s) if s.state == TaskState::Succeeded => {}
                Some(s) => failed.push(format!("{cluster}: child {id} was {} after the soak", s.state.name())),
                None => failed.push(format!("{cluster}: child {id} has no snapshot after the soak")),
            }
        }
        Ok(failed)
    }

    /// What the gate finds wrong with `wave`'s clusters on the hub (nothing: it passes):
    /// a ManagedCluster not Available, a score missing, expired or below the minimum.
    async fn gated(&self, gate: &Gate, wave: &[String]) -> Result<Vec<String>, StepError> {
        let Some(hub) = self.cfg.hub.clone() else {
            return Err(StepError::permanent(codes::NO_HUB, format!("step {}: its waves' gate reads the hub, and this plan worker has none", self.step.name)));
        };
        let mut failed = Vec::new();
        let now = jiff::Timestamp::now();
        for cluster in wave {
            if gate.available {
                // open-cluster-management-io/api cluster/v1/types.go: ManagedClusterConditionAvailable.
                let mc = Api::<ManagedCluster>::all(hub.clone()).get_opt(cluster).await.map_err(hub_err)?;
                match mc.as_ref().and_then(|m| m.condition("ManagedClusterConditionAvailable")) {
                    Some("True") => {}
                    other => failed.push(format!("{cluster}: the gate wants it Available on the hub; ManagedClusterConditionAvailable is {}", other.unwrap_or("not reported"))),
                }
            }
            if let Some(want) = &gate.score {
                // open-cluster-management-io/api cluster/v1alpha1/types_addonplacementscore.go:
                // status.scores [{name, value}], status.validUntil.
                let aps = Api::<AddOnPlacementScore>::namespaced(hub.clone(), cluster).get_opt(&want.name).await.map_err(hub_err)?;
                let Some(aps) = aps else {
                    failed.push(format!("{cluster}: no AddOnPlacementScore {cluster}/{} for the gate", want.name));
                    continue;
                };
                let expired = aps.status.get("validUntil").and_then(Value::as_str).and_then(|t| t.parse::<jiff::Timestamp>().ok()).is_some_and(|t| t < now);
                let value = aps.status.get("scores").and_then(Value::as_array).and_then(|s| {
                    s.iter().find(|i| i.get("name").and_then(Value::as_str) == Some(want.item.as_str())).and_then(|i| i.get("value")?.as_i64())
                });
                match value {
                    _ if expired => failed.push(format!("{cluster}: AddOnPlacementScore {cluster}/{} is past its validUntil", want.name)),
                    None => failed.push(format!("{cluster}: AddOnPlacementScore {cluster}/{} has no item {:?}", want.name, want.item)),
                    Some(v) if v < i64::from(want.min) => {
                        failed.push(format!("{cluster}: {} {} of AddOnPlacementScore {cluster}/{} is below the gate's {}", want.item, v, want.name, want.min));
                    }
                    Some(_) => {}
                }
            }
        }
        Ok(failed)
    }

    /// The output (or, for a failed run, the record of what it started).
    fn record(&self, ids: &BTreeMap<String, TaskId>, waves: &[&[String]], started: usize) -> Value {
        json!({
            "kind": self.kind.as_str(),
            "clusters": ids.iter().map(|(c, id)| (c.clone(), json!(id.to_string()))).collect::<serde_json::Map<_, _>>(),
            "waves": waves,
            "waves_started": started,
        })
    }

    /// Reverts the children of `clusters` (found by their keys), at most `max_in_flight` at
    /// once; how many were reverted.
    async fn revert_all(&self, cx: &StepContext<'_, PlanSpec>, clusters: &[String], why: &str) -> Result<usize, StepError> {
        let results: Vec<Result<bool, StepError>> =
            stream::iter(clusters.iter().cloned()).map(|cluster| self.revert_child(cx, cluster, why)).buffer_unordered(self.in_flight(clusters.len())).collect().await;
        let mut reverted = 0;
        for r in results {
            reverted += usize::from(r?);
        }
        Ok(reverted)
    }

    /// What a failed wave does ([`OnFailure`], but for `pause`); always an error, with the
    /// record of the started waves for the undo.
    async fn wave_failed(&self, cx: &StepContext<'_, PlanSpec>, w: usize, waves: &[&[String]], failed: Vec<String>, record: Value) -> StepError {
        let why = summary(failed);
        let n = waves.len();
        let head = format!("step {}: wave {}/{n} failed: {why}", self.step.name, w + 1);
        match self.on_failure {
            OnFailure::RevertAll | OnFailure::Pause => StepError::permanent(codes::CHILD_FAILED, head).with_output(&record),
            OnFailure::Halt => StepError::permanent(codes::CHILD_FAILED, format!("{head} (on_failure: halt: everything stays as it is until the plan is reverted)"))
                .keeping_done()
                .with_output(&record),
            OnFailure::RevertWave => {
                let total = waves.iter().map(|x| x.len()).sum();
                cx.progress(percent(waves[..=w].iter().map(|x| x.len()).sum(), total), format!("wave {}/{n} failed: reverting its children (on_failure: revert-wave)", w + 1));
                match self.revert_all(cx, waves[w], "reverts a failed wave").await {
                    Ok(count) => StepError::permanent(
                        codes::CHILD_FAILED,
                        format!("{head} (on_failure: revert-wave: {count} of its children reverted; the waves before it ({w}) stay until the plan is reverted)"),
                    )
                    .keeping_done()
                    .with_output(&record),
                    // The plan's undo takes over: it reverts every started child.
                    Err(e) => StepError::permanent(e.code, format!("{head}; reverting the wave failed: {}", e.message)).with_output(&record),
                }
            }
        }
    }

    /// The children the undo reverts, by wave: those the run recorded, or (none recorded)
    /// the waves up to the one after the last with a child that has a snapshot, among those
    /// the approvals let start.
    async fn started_waves(&self, cx: &StepContext<'_, PlanSpec>, waves: &[&[String]], output: Option<&Value>) -> Result<usize, StepError> {
        if let Some(n) = output.and_then(|o| o.get("waves_started")).and_then(Value::as_u64) {
            return Ok((n as usize).min(waves.len()));
        }
        // Under `approve`, wave w (from 0) starts only once the plan holds w approvals, and a
        // Signal reaches a step only after the plan's snapshot has it (`Runner::on_control`):
        // no wave past the approved ones can have started, so none waits the appear grace
        // (a plan reverted while it waits for an approval undoes at once).
        let could = if self.each.waves.approve { (1 + count(&cx.signals(), APPROVE)).min(waves.len()) } else { waves.len() };
        let mut last = None;
        for (w, wave) in waves.iter().take(could).enumerate() {
            if !self.started(cx, wave).await? {
                break;
            }
            last = Some(w);
        }
        Ok(match last {
            Some(w) => (w + 2).min(could),
            None => 1.min(could),
        })
    }
}

/// The Signals a plan's waves answer to.
const APPROVE: &str = "approve";
const PAUSE: &str = "pause";
const RESUME: &str = "resume";

/// How many of `signals` are `name`.
fn count(signals: &[String], name: &str) -> usize {
    signals.iter().filter(|s| *s == name).count()
}

/// A wave's failures, the first few named.
fn summary(failed: Vec<String>) -> String {
    let more = failed.len().saturating_sub(NAMED_FAILURES);
    let mut why = failed.into_iter().take(NAMED_FAILURES).collect::<Vec<_>>().join("; ");
    if more > 0 {
        why.push_str(&format!("; and {more} more"));
    }
    why
}

/// The share of `w` waves out of `n`.
/// `done` of `n` as a percent, below 100 until the step ends.
fn percent(done: usize, n: usize) -> u8 {
    (done * 100 / n.max(1)).min(99) as u8
}

/// `1 child`, `3 children`.
fn children(n: usize) -> String {
    if n == 1 { "1 child".to_owned() } else { format!("{n} children") }
}

impl Step<PlanSpec> for WaveStep {
    fn name(&self) -> &str {
        &self.step.name
    }

    fn policy(&self) -> StepPolicy {
        // A wave may take a child's whole time, its pause and its soak; the most waves a
        // step can have bounds the whole (the task's deadline bounds it as well).
        let per_wave = self.cfg.child_timeout + self.pause() + self.soak() + Duration::from_secs(60);
        let size = usize::try_from(self.each.waves.size).ok().filter(|s| *s > 0).unwrap_or(MAX_CLUSTERS);
        StepPolicy {
            timeout: per_wave * MAX_CLUSTERS.div_ceil(size) as u32,
            max_retries: 5,
            min_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(10),
            ..StepPolicy::default()
        }
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, PlanSpec>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let Some(clusters) = self.clusters(cx) else {
                return Err(StepError::permanent(codes::INTERNAL, format!("step {}: the chosen clusters are missing from step {}", self.step.name, select::step_name(&self.step.name))));
            };
            let waves = self.waves(&clusters);
            let n = waves.len();
            let mut ids: BTreeMap<String, TaskId> = BTreeMap::new();
            // Waves that failed under `on_failure: pause` and were resumed by a person.
            let mut failed_waves: Vec<usize> = Vec::new();
            for (w, wave) in waves.iter().enumerate() {
                // Progress is the share of the step's children ended (and their waves passed).
                let before: usize = waves[..w].iter().map(|x| x.len()).sum();
                let total = clusters.len();
                let (at, past) = (percent(before, total), percent(before + wave.len(), total));
                // The wave's children's snapshots, read once (one catch-up of the live view).
                // A wave a resumed run finds started was approved and waited for before; one
                // not started has no child while this run waits (only the task's one owner
                // submits them), so what was read holds after the wait.
                let mut known = self.known(cx, wave).await?;
                if w > 0 && known.values().all(Option::is_none) {
                    self.await_people(cx, (w, n, at), failed_waves.len()).await;
                    if !self.pause().is_zero() {
                        cx.progress(at, format!("wave {}/{n}: pausing {}s before it", w + 1, self.pause().as_secs()));
                        tokio::time::sleep(self.pause()).await;
                    }
                }
                cx.progress(at, format!("wave {}/{n}: {}: {}", w + 1, children(wave.len()), wave.join(", ")));
                let ended = AtomicUsize::new(0);
                let outcomes: Vec<(String, Result<Outcome, StepError>)> = stream::iter(wave.iter().cloned())
                    .map(|c| {
                        let snap = known.remove(&c).flatten();
                        let ended = &ended;
                        async move {
                            let (cluster, outcome) = self.run_child(cx, c, snap).await;
                            // Each child's end moves the step on (a wave of many is long).
                            let k = ended.fetch_add(1, Ordering::Relaxed) + 1;
                            let how = match &outcome {
                                Ok(Outcome::Succeeded(_)) => "succeeded",
                                Ok(Outcome::Failed(..)) => "failed",
                                Err(_) => "could not be followed",
                            };
                            cx.progress(percent(before + k, total), format!("wave {}/{n}: {cluster}'s child {how} ({k} of {} ended)", w + 1, wave.len()));
                            (cluster, outcome)
                        }
                    })
                    .buffer_unordered(self.in_flight(wave.len()))
                    .collect()
                    .await;
                let mut failed = Vec::new();
                let mut transient = None;
                for (cluster, outcome) in outcomes {
                    match outcome {
                        Ok(Outcome::Succeeded(id)) => {
                            ids.insert(cluster, id);
                        }
                        Ok(Outcome::Failed(id, why)) => {
                            if let Some(id) = id {
                                ids.insert(cluster.clone(), id);
                            }
                            failed.push(why);
                        }
                        Err(e) => transient = Some(e),
                    }
                }
                // Kafka trouble: the step is tried again, and re-attaches to every child.
                if let Some(e) = transient {
                    return Err(e);
                }
                if failed.is_empty() && !self.soak().is_zero() {
                    cx.progress(past, format!("wave {}/{n}: its children succeeded; soaking {}s", w + 1, self.soak().as_secs()));
                    tokio::time::sleep(self.soak()).await;
                    failed = self.soaked(cx, wave).await?;
                }
                if failed.is_empty()
                    && let Some(gate) = &self.each.waves.gate
                {
                    failed = self.gated(gate, wave).await?;
                    if failed.is_empty() {
                        cx.progress(past, format!("wave {}/{n}: the hub's gate passed", w + 1));
                    }
                }
                if !failed.is_empty() {
                    failed.sort();
                    if self.on_failure == OnFailure::Pause {
                        failed_waves.push(w + 1);
                        cx.progress(
                            past,
                            format!(
                                "wave {}/{n} failed: {}; paused (on_failure: pause): `ferry tasks signal {} resume` goes on, `ferry tasks revert {}` undoes it all",
                                w + 1,
                                summary(failed),
                                cx.task_id,
                                cx.task_id
                            ),
                        );
                        let next_started = match waves.get(w + 1) {
                            Some(next) => self.started(cx, next).await?,
                            None => false,
                        };
                        if !next_started {
                            let paused = failed_waves.len();
                            cx.wait_for_signals(|s| count(s, RESUME) >= count(s, PAUSE) + paused).await;
                            cx.progress(past, format!("wave {}/{n} failed and was let stand: resumed", w + 1));
                        }
                        continue;
                    }
                    let record = self.record(&ids, &waves, w + 1);
                    return Err(self.wave_failed(cx, w, &waves, failed, record).await);
                }
                cx.progress(past, format!("wave {}/{n} passed", w + 1));
            }
            let mut out = self.record(&ids, &waves, n);
            out["failed_waves"] = json!(failed_waves);
            Ok(out)
        }
        .boxed()
    }

    fn on_cancel<'a>(&'a self, cx: &'a StepContext<'a, PlanSpec>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            let Some(clusters) = self.clusters(cx) else { return Ok(()) };
            let reason = format!("plan {} was cancelled in its step {}", cx.task_id, self.step.name);
            let ended: Vec<Result<(), StepError>> =
                stream::iter(clusters.iter().cloned()).map(|cluster| self.cancel_child(cx, cluster, reason.clone())).buffer_unordered(self.in_flight(clusters.len())).collect().await;
            ended.into_iter().collect()
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, PlanSpec>, output: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            if self.step.keep {
                cx.progress(100, format!("step {}'s children kept (keep: true)", self.step.name));
                return Ok(());
            }
            let Some(clusters) = self.clusters(cx) else { return Ok(()) };
            let waves = self.waves(&clusters);
            let started = self.started_waves(cx, &waves, output).await?;
            for w in (0..started).rev() {
                let count = self.revert_all(cx, waves[w], "reverts its step").await?;
                cx.progress(percent(started - w, started), format!("wave {}/{}: {} reverted", w + 1, waves.len(), children(count)));
            }
            Ok(())
        }
        .boxed()
    }
}

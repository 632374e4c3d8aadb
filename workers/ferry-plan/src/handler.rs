//! The plan worker's configuration and handler: validate, targets, and the plan (one
//! [`ChildStep`] per child command; a [`SelectStep`] and a [`WaveStep`] per step fanned
//! out over clusters).

use std::sync::Arc;
use std::time::Duration;

use ferry_task::children::Children;
use ferry_task::{Rejection, Step, StepContext, StepError, TaskHandler, TaskKind, Targets, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::Value;

use crate::spec::PlanSpec;
use crate::steps::child::ChildStep;
use crate::steps::select::SelectStep;
use crate::steps::waves::WaveStep;

/// What the plan worker needs.
#[derive(Clone)]
pub struct PlanConfig {
    /// Submits and follows the children (over Kafka: `ferry_runtime::child_tasks`).
    pub children: Arc<dyn Children>,
    /// How long a child may take to end (and to be reverted): the plan step fails with
    /// DEADLINE_EXCEEDED after it, and the plan's revert reverts the child.
    pub child_timeout: Duration,
    /// How long an undo waits for a child it finds no snapshot of to be taken up by its
    /// worker: past it, the child's Start was never sent.
    pub appear_grace: Duration,
    /// The hub a fanned-out step chooses its clusters on (by labels or a
    /// ManagedClusterSet); without one, only steps that list their clusters run.
    pub hub: Option<kube::Client>,
}

impl std::fmt::Debug for PlanConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanConfig")
            .field("child_timeout", &self.child_timeout)
            .field("appear_grace", &self.appear_grace)
            .field("hub", &self.hub.is_some())
            .finish()
    }
}

impl PlanConfig {
    /// Defaults: a child may take an hour; a Start on its way is waited for 30 s.
    pub fn new(children: Arc<dyn Children>) -> Self {
        Self { children, child_timeout: Duration::from_secs(3600), appear_grace: Duration::from_secs(30), hub: None }
    }

    /// This configuration, choosing clusters on `hub`.
    pub fn with_hub(mut self, hub: kube::Client) -> Self {
        self.hub = Some(hub);
        self
    }
}

/// The handler of `plan` tasks.
#[derive(Debug, Clone)]
pub struct PlanHandler {
    cfg: PlanConfig,
}

impl PlanHandler {
    /// A handler with `cfg`.
    pub fn new(cfg: PlanConfig) -> Self {
        Self { cfg }
    }
}

/// The step of a child whose kind does not parse: only a bug gets here (`validate`
/// refuses such a plan), and it says so instead of running another kind.
struct Unplannable {
    name: String,
    reason: String,
}

impl Step<PlanSpec> for Unplannable {
    fn name(&self) -> &str {
        &self.name
    }

    fn run<'a>(&'a self, _: &'a StepContext<'a, PlanSpec>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move { Err(StepError::permanent(codes::INTERNAL, format!("step {}: {}", self.name, self.reason))) }.boxed()
    }

    fn undo<'a>(&'a self, _: &'a StepContext<'a, PlanSpec>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async { Ok(()) }.boxed()
    }
}

impl TaskHandler for PlanHandler {
    type Spec = PlanSpec;

    fn kind(&self) -> TaskKind {
        TaskKind::PLAN
    }

    fn validate(&self, _subject: &str, spec: &PlanSpec) -> Result<(), Rejection> {
        crate::validate::validate(spec)
    }

    /// The children's literal subjects, and clusters chosen at run time: the plan worker
    /// submits its children as the operator, on the operator's topics, so a tenant's
    /// plan must be allowed every cluster (`clusters: ["*"]`) in its policy's plan rule.
    /// A plan acts on nothing itself: each child is sent on behalf of whoever asked for the
    /// plan, and a tenant's child is held to the tenant's policy by its own kind's worker
    /// (`ChildCommand::on_behalf_of`). A tenant needs a `plan` rule to submit plans, and
    /// rules for the kinds its plans run.
    fn targets(&self, _subject: &str, _spec: &PlanSpec) -> Targets {
        Targets::default()
    }

    /// One step per child command; a step with `for_each` is two: its choice of clusters
    /// (`<name>.clusters`), then its children in waves (`<name>`).
    fn plan(&self, spec: &PlanSpec) -> Vec<Arc<dyn Step<PlanSpec>>> {
        let unplannable = |name: &str, e: ferry_task::kind::UnknownKind| Arc::new(Unplannable { name: name.to_owned(), reason: e.to_string() }) as Arc<dyn Step<PlanSpec>>;
        let mut steps: Vec<Arc<dyn Step<PlanSpec>>> = Vec::new();
        for s in &spec.steps {
            match &s.for_each {
                None => steps.push(match ChildStep::new(s.clone(), self.cfg.clone()) {
                    Ok(step) => Arc::new(step),
                    Err(e) => unplannable(&s.name, e),
                }),
                Some(each) => {
                    steps.push(Arc::new(SelectStep::new(s.clone(), each.clone(), self.cfg.clone())));
                    steps.push(match WaveStep::new(s.clone(), each.clone(), self.cfg.clone()) {
                        Ok(step) => Arc::new(step),
                        Err(e) => unplannable(&s.name, e),
                    });
                }
            }
        }
        steps
    }
}

//! A command's dry run up to its first step that acts: the spec validated, the plan named
//! step by step, and the steps before the first that acts (the live checks, which change
//! nothing: [`crate::CheckStep`]) run as a task would run them, each bounded, their
//! outputs kept for the kind's preview of what it would write. No task is made, nothing is
//! published, nothing is retried: a check that fails for a passing reason says so.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use crate::ids::TaskId;
use crate::step::{StepContext, TaskHandler};

/// How long each check of a dry run has to answer (its step's own timeout, if shorter).
pub const BOUND: Duration = Duration::from_secs(60);

/// One step of the plan a dry run names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlannedStep {
    /// Its name (its output key).
    pub name: String,
    /// Whether it may change anything ([`crate::Step::acts`]).
    pub acts: bool,
    /// Whether the dry run ran it (the checks before the first step that acts).
    pub ran: bool,
}

/// What the checks say of the command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "verdict")]
pub enum Verdict {
    /// The spec is valid and every check passed: a task would go on to the steps that act.
    Passes,
    /// The task would end Rejected: the spec's rules or a live check refuse it.
    Rejected {
        /// The step that refused it (`validate` for the spec's rules).
        step: String,
        /// The error code (`BAD_SPEC` for the spec's rules).
        code: String,
        /// Why.
        reason: String,
    },
    /// A check fails for good (not a rejection: the task would end Failed at this step).
    Fails {
        /// The step.
        step: String,
        /// The error code.
        code: String,
        /// Why.
        reason: String,
    },
    /// A check could not say (the cluster did not answer, its bound passed): a task would
    /// retry it.
    Unknown {
        /// The step.
        step: String,
        /// What went wrong.
        reason: String,
    },
}

/// A dry run's findings.
#[derive(Debug, Clone, Serialize)]
pub struct Checked {
    /// Every step of the plan, in order.
    pub steps: Vec<PlannedStep>,
    /// What the checks say.
    #[serde(flatten)]
    pub verdict: Verdict,
    /// The outputs of the checks that ran, by step name (what the kind's preview reads).
    #[serde(skip)]
    pub outputs: BTreeMap<String, Value>,
}

/// Validates `spec`, plans it and runs the steps before the first that acts, each within
/// `bound` (or its own timeout if shorter).
pub async fn checks<H: TaskHandler>(handler: &H, subject: &str, spec: &H::Spec, bound: Duration) -> Checked {
    if let Err(r) = handler.validate(subject, spec) {
        return Checked { steps: Vec::new(), verdict: Verdict::Rejected { step: "validate".into(), code: crate::codes::BAD_SPEC.into(), reason: r.reason }, outputs: BTreeMap::new() };
    }
    let plan = handler.plan(spec);
    let leading = plan.iter().take_while(|s| !s.acts()).count();
    let mut steps: Vec<PlannedStep> = plan.iter().map(|s| PlannedStep { name: s.name().to_owned(), acts: s.acts(), ran: false }).collect();
    let id = TaskId::new();
    let mut outputs = BTreeMap::new();
    // Progress reports go nowhere: there is no task to report on.
    let (reports, _) = tokio::sync::mpsc::unbounded_channel();
    for (i, step) in plan.iter().take(leading).enumerate() {
        steps[i].ran = true;
        let limit = bound.min(step.policy().timeout);
        let result = {
            let cx = StepContext::new(&id, subject, spec, &outputs, 1, reports.clone());
            tokio::time::timeout(limit, step.run(&cx)).await
        };
        let name = step.name().to_owned();
        match result {
            Ok(Ok(out)) => {
                outputs.insert(name, out);
            }
            Ok(Err(e)) if e.rejects => return Checked { steps, verdict: Verdict::Rejected { step: name, code: e.code, reason: e.message }, outputs },
            Ok(Err(e)) if !e.transient => return Checked { steps, verdict: Verdict::Fails { step: name, code: e.code, reason: e.message }, outputs },
            Ok(Err(e)) => return Checked { steps, verdict: Verdict::Unknown { step: name, reason: e.to_string() }, outputs },
            Err(_) => return Checked { steps, verdict: Verdict::Unknown { step: name, reason: format!("no answer within {} s", limit.as_secs()) }, outputs },
        }
    }
    Checked { steps, verdict: Verdict::Passes, outputs }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use apache_avro::AvroSchema;
    use futures::FutureExt;
    use futures::future::BoxFuture;
    use serde::Deserialize;

    use super::*;
    use crate::step::{CheckStep, Rejection, Step, StepError};

    #[derive(Debug, Clone, Serialize, Deserialize, AvroSchema)]
    struct Spec {
        /// What the check answers: "ok", "reject", "fail" or "hang".
        check: String,
    }

    struct Check;
    impl CheckStep<Spec> for Check {
        fn name(&self) -> &str {
            "check"
        }
        fn run<'a>(&'a self, cx: &'a StepContext<'a, Spec>) -> BoxFuture<'a, Result<Value, StepError>> {
            async move {
                match cx.spec.check.as_str() {
                    "reject" => Err(StepError::rejected("NOPE", "the live state refuses it")),
                    "fail" => Err(StepError::transient("HUB_API", "connection refused")),
                    "broken" => Err(StepError::permanent("NO_CLUSTERS", "the set has no member clusters")),
                    "hang" => std::future::pending().await,
                    _ => Ok(serde_json::json!({"found": 1})),
                }
            }
            .boxed()
        }
    }

    /// A step that acts: the dry run must never run it.
    struct Acts;
    impl Step<Spec> for Acts {
        fn name(&self) -> &str {
            "apply"
        }
        fn run<'a>(&'a self, _: &'a StepContext<'a, Spec>) -> BoxFuture<'a, Result<Value, StepError>> {
            panic!("a dry run ran a step that acts")
        }
        fn undo<'a>(&'a self, _: &'a StepContext<'a, Spec>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
            panic!("a dry run undid a step")
        }
    }

    struct Handler;
    impl TaskHandler for Handler {
        type Spec = Spec;
        fn kind(&self) -> crate::TaskKind {
            crate::TaskKind::TEST
        }
        fn validate(&self, _: &str, spec: &Spec) -> Result<(), Rejection> {
            if spec.check.is_empty() { Err(Rejection::new("check: must not be empty")) } else { Ok(()) }
        }
        fn targets(&self, _: &str, _: &Spec) -> crate::Targets {
            crate::Targets::clusters(Vec::<String>::new())
        }
        fn plan(&self, _: &Spec) -> Vec<Arc<dyn Step<Spec>>> {
            // A check after a step that acts is not run either: what it reads depends on it.
            vec![Arc::new(Check), Arc::new(Acts), Arc::new(Check)]
        }
    }

    async fn dry(check: &str) -> Checked {
        checks(&Handler, "s", &Spec { check: check.into() }, Duration::from_millis(200)).await
    }

    #[tokio::test]
    async fn the_checks_before_the_first_step_that_acts_run_and_say_what_a_task_would_meet() {
        let ok = dry("ok").await;
        assert_eq!(ok.verdict, Verdict::Passes);
        let ran: Vec<(&str, bool, bool)> = ok.steps.iter().map(|s| (s.name.as_str(), s.acts, s.ran)).collect();
        assert_eq!(ran, [("check", false, true), ("apply", true, false), ("check", false, false)]);
        assert_eq!(ok.outputs["check"], serde_json::json!({"found": 1}));
        assert_eq!(dry("reject").await.verdict, Verdict::Rejected { step: "check".into(), code: "NOPE".into(), reason: "the live state refuses it".into() });
        assert!(matches!(dry("fail").await.verdict, Verdict::Unknown { step, reason } if step == "check" && reason.contains("connection refused")));
        assert_eq!(dry("broken").await.verdict, Verdict::Fails { step: "check".into(), code: "NO_CLUSTERS".into(), reason: "the set has no member clusters".into() });
        assert!(matches!(dry("hang").await.verdict, Verdict::Unknown { reason, .. } if reason.contains("no answer")));
        let bad = dry("").await;
        assert!(matches!(bad.verdict, Verdict::Rejected { ref step, ref code, .. } if step == "validate" && code == "BAD_SPEC"), "{bad:?}");
        assert!(bad.steps.is_empty());
    }
}

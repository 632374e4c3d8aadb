//! The runtime's own task kind (`test`): numbered no-op steps with injected failures,
//! transient errors, work time and blocking waits. It drives `ferry dev --demo smoke`,
//! the runtime's tests and `ferry bench runtime`.

use std::sync::Arc;
use std::time::Duration;

use apache_avro::AvroSchema;
use futures::FutureExt;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::kind::TaskKind;
use crate::step::{Rejection, Step, StepContext, StepError, StepPolicy, TaskHandler};

crate::register_kind!(crate::kind::KindInfo {
    kind: TaskKind::TEST,
    describe: "The runtime's own no-op task, for demos, tests and benchmarks",
    order: 60,
    schemas: &[
        (4, "TestTaskSpec.avsc", include_str!("../../../schemas/TestTaskSpec.avsc")),
        (8, "TestTaskSpec.v2.avsc", include_str!("../../../schemas/TestTaskSpec.v2.avsc")),
    ],
    spec: "TestTaskSpec.v2.avsc",
    access: crate::kind::Access::NONE,
    not_for_tenants: None,
    encode: crate::kind::encode_json::<TestTaskSpec>,
    check: |subject, spec| crate::kind::check_json::<TestTaskSpec>(subject, spec, TestTaskSpec::check),
    subject_of: crate::kind::no_subject,
    derived_subject: None,
});

/// Spec of a `test` task.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct TestTaskSpec {
    /// Number of steps, 1 to 100.
    pub steps: i32,
    /// Step (from 1) that fails permanently.
    pub fail_at: Option<i32>,
    /// Transient failures of every step before it succeeds (0 when left out of a spec file).
    #[serde(default)]
    pub fail_transient: i32,
    /// Work time of each step, in milliseconds (0 when left out of a spec file).
    #[serde(default)]
    pub step_ms: i64,
    /// Step (from 1) that waits until cancelled (up to an hour).
    pub block_at: Option<i32>,
    /// Step (from 1) whose undo fails permanently.
    pub undo_fail_at: Option<i32>,
    /// Transient failures of every undo before it succeeds. Version 2 of the schema (id
    /// 8); version 1 records have none.
    #[serde(default)]
    #[avro(default = "0")]
    pub undo_fail_transient: i32,
}

impl TestTaskSpec {
    /// `n` no-op steps.
    pub fn steps(n: i32) -> Self {
        Self { steps: n, ..Self::default() }
    }

    /// The kind's rules (any subject): steps, the steps a fault names, the step time.
    pub fn check(_subject: &str, spec: &TestTaskSpec) -> Result<(), Rejection> {
        if !(1..=100).contains(&spec.steps) {
            return Err(Rejection::new(format!("steps must be 1 to 100, got {}", spec.steps)));
        }
        for (field, v) in [("fail_at", spec.fail_at), ("block_at", spec.block_at), ("undo_fail_at", spec.undo_fail_at)] {
            if let Some(v) = v
                && !(1..=spec.steps).contains(&v) {
                    return Err(Rejection::new(format!("{field} must name a step from 1 to {}, got {v}", spec.steps)));
                }
        }
        if !(0..=600_000).contains(&spec.step_ms) {
            return Err(Rejection::new(format!("step_ms must be 0 to 600000, got {}", spec.step_ms)));
        }
        if spec.fail_transient < 0 {
            return Err(Rejection::new("fail_transient must not be negative"));
        }
        if spec.undo_fail_transient < 0 {
            return Err(Rejection::new("undo_fail_transient must not be negative"));
        }
        Ok(())
    }
}

/// The handler of `test` tasks.
#[derive(Debug, Clone, Default)]
pub struct TestHandler {
    /// Backoff between transient failures (short in tests).
    pub min_delay: Option<Duration>,
    /// Where each step run records its start and end, if anywhere (the task kind's
    /// observable effect: a double run is seen there).
    pub effects: Option<crate::effects::EffectLog>,
}

struct TestStep {
    index: i32,
    name: String,
    min_delay: Duration,
    effects: Option<crate::effects::EffectLog>,
}

impl TestStep {
    fn record(&self, task: &str, phase: crate::effects::Phase) {
        if let Some(log) = &self.effects
            && let Err(e) = log.record(task, self.index, phase)
        {
            tracing::error!(error = %e, "effect not recorded");
        }
    }
}

impl Step<TestTaskSpec> for TestStep {
    fn name(&self) -> &str {
        &self.name
    }

    fn policy(&self) -> StepPolicy {
        StepPolicy {
            timeout: Duration::from_secs(3600),
            max_retries: 5,
            min_delay: self.min_delay,
            max_delay: self.min_delay * 8,
            // An undo retries for at most 100 first delays' worth of waiting (1 s in the
            // tests' 10 ms): room for `undo_fail_transient` past `max_retries`.
            undo_patience: self.min_delay * 100,
        }
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, TestTaskSpec>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let task = cx.task_id.to_string();
            self.record(&task, crate::effects::Phase::Start);
            let result = self.work(cx).await;
            self.record(&task, crate::effects::Phase::End);
            result
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, TestTaskSpec>, _output: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            if (cx.attempt as i32) <= cx.spec.undo_fail_transient {
                return Err(StepError::transient("INJECTED_TRANSIENT", format!("undo attempt {} fails on purpose", cx.attempt)));
            }
            if cx.spec.undo_fail_at == Some(self.index) {
                return Err(StepError::permanent("INJECTED_UNDO_FAILURE", format!("undo of step {} fails on purpose", self.index)));
            }
            Ok(())
        }
        .boxed()
    }
}

impl TestStep {
    async fn work(&self, cx: &StepContext<'_, TestTaskSpec>) -> Result<Value, StepError> {
        {
            let spec = cx.spec;
            if spec.step_ms > 0 {
                // Simulated work, as a real step would wait on an API.
                tokio::time::sleep(Duration::from_millis(spec.step_ms as u64)).await;
            }
            if spec.block_at == Some(self.index) {
                cx.progress(10, "waiting for a condition that never comes");
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            if (cx.attempt as i32) <= spec.fail_transient {
                return Err(StepError::transient("INJECTED_TRANSIENT", format!("attempt {} fails on purpose", cx.attempt)));
            }
            if spec.fail_at == Some(self.index) {
                return Err(StepError::permanent("INJECTED_FAILURE", format!("step {} fails on purpose", self.index)));
            }
            Ok(json!({ "step": self.index, "attempt": cx.attempt }))
        }
    }
}

impl TaskHandler for TestHandler {
    type Spec = TestTaskSpec;

    fn kind(&self) -> TaskKind {
        TaskKind::TEST
    }

    fn validate(&self, subject: &str, spec: &TestTaskSpec) -> Result<(), Rejection> {
        TestTaskSpec::check(subject, spec)
    }

    /// A test task acts on its subject, read as a cluster name.
    fn targets(&self, subject: &str, _spec: &TestTaskSpec) -> ferry_task::Targets {
        ferry_task::Targets::clusters([subject])
    }

    fn plan(&self, spec: &TestTaskSpec) -> Vec<Arc<dyn Step<TestTaskSpec>>> {
        let min_delay = self.min_delay.unwrap_or(Duration::from_millis(100));
        (1..=spec.steps)
            .map(|i| Arc::new(TestStep { index: i, name: format!("step-{i}"), min_delay, effects: self.effects.clone() }) as Arc<dyn Step<TestTaskSpec>>)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::TestTaskSpec;

    #[test]
    fn a_spec_file_names_only_what_it_sets() {
        let spec: TestTaskSpec = serde_json::from_str(r#"{"steps": 2}"#).unwrap();
        assert_eq!(spec, TestTaskSpec::steps(2));
        let err = serde_json::from_str::<TestTaskSpec>(r#"{"step_ms": 5}"#).unwrap_err();
        assert!(err.to_string().contains("missing field `steps`"), "{err}");
    }
}

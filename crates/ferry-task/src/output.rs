//! Typed step outputs: what a step returns is read by later steps, by its undo, by the
//! CLI's views and by the dashboard through one typed key that names the step, never
//! through a string. Renaming a step then renames its key everywhere it is read.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::protocol::TaskSnapshot;
use crate::step::{StepContext, StepError};

/// The output of the step named [`Output::step`], of type `T`. Declare one per step that
/// returns something others read, beside the step: `pub const PLACE: Output<Placed> =
/// Output::new("place");`, and use it for the step's name too.
pub struct Output<T> {
    step: &'static str,
    of: PhantomData<fn() -> T>,
}

impl<T> Output<T> {
    /// The key of step `step`'s output.
    pub const fn new(step: &'static str) -> Self {
        Self { step, of: PhantomData }
    }

    /// The step's name (its journal entry and its progress events carry it).
    pub const fn step(&self) -> &'static str {
        self.step
    }
}

impl<T: Serialize> Output<T> {
    /// `value` as the JSON a step returns from `run`.
    pub fn value(&self, value: &T) -> Result<Value, StepError> {
        serde_json::to_value(value)
            .map_err(|e| StepError::permanent(crate::codes::INTERNAL, format!("the {} step's output does not serialize: {e}", self.step)))
    }
}

impl<T: DeserializeOwned> Output<T> {
    /// The output in `outputs` (step name → JSON), decoded; None when the step left none
    /// or it is not a `T`.
    pub fn from_outputs(&self, outputs: &BTreeMap<String, Value>) -> Option<T> {
        outputs.get(self.step).and_then(|v| T::deserialize(v).ok())
    }

    /// The output journaled in a task's snapshot (for views that read the task state).
    pub fn from_snapshot(&self, snapshot: &TaskSnapshot) -> Option<T> {
        snapshot.output_of(self.step)
    }

    /// The output of a step the plan guarantees ran before this one; an internal error,
    /// naming the step, when it is absent.
    pub fn required<S>(&self, cx: &StepContext<'_, S>) -> Result<T, StepError> {
        self.from_outputs(cx.outputs)
            .ok_or_else(|| StepError::permanent(crate::codes::INTERNAL, format!("the {} step left no output", self.step)))
    }

    /// The output of an earlier step, if it left one.
    pub fn get<S>(&self, cx: &StepContext<'_, S>) -> Option<T> {
        self.from_outputs(cx.outputs)
    }
}

// Manual impls: a key is copyable whatever `T` is.
impl<T> Clone for Output<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Output<T> {}

impl<T> fmt::Debug for Output<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Output({})", self.step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Placed {
        clusters: Vec<String>,
    }

    const PLACE: Output<Placed> = Output::new("place");

    #[test]
    fn a_key_reads_what_its_step_wrote_and_nothing_else() {
        let placed = Placed { clusters: vec!["member-1".into()] };
        let mut outputs = BTreeMap::new();
        outputs.insert("place".to_owned(), PLACE.value(&placed).unwrap());
        outputs.insert("other".to_owned(), serde_json::json!({"clusters": ["x"]}));
        assert_eq!(PLACE.from_outputs(&outputs), Some(placed));
        let elsewhere: Output<Placed> = Output::new("missing");
        assert_eq!(elsewhere.from_outputs(&outputs), None);
        // A value of another shape is not taken for a `T`.
        outputs.insert("place".to_owned(), serde_json::json!(42));
        assert_eq!(PLACE.from_outputs(&outputs), None);
    }
}

//! The `plan` command (`PlanSpec`): child commands of the other kinds, in order.
//!
//! A child's spec rides in the Avro record as JSON text (`spec`): the plan's record cannot
//! name every kind's record type, and those evolve on their own schedules. A spec file
//! writes it as a YAML/JSON object, like any kind's spec; [`json_text`] takes either form.

use apache_avro::AvroSchema;
use serde::{Deserialize, Serialize};

/// A plan: its children, run in order, each as its own task.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct PlanSpec {
    /// The child commands, in the order they run (and the reverse order of their revert).
    pub steps: Vec<PlanStep>,
}

/// One child command of a plan.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct PlanStep {
    /// The step's name, unique in the plan (lowercase letters, digits and `-`): later
    /// steps refer to its child's output as `${steps.<name>...}`, and it is the plan's
    /// step name in progress events.
    pub name: String,
    /// The child's kind, as on the command line (`create-cluster`, `peer`, `offload`,
    /// `deploy`, `score`, `test`).
    pub kind: String,
    /// The child's subject; may be left out for kinds that derive it from their spec
    /// (create-cluster, peer, offload, deploy). May hold `${steps...}` references.
    #[serde(default)]
    pub subject: Option<String>,
    /// The child's spec: the kind's fields, as in `ferry submit <kind> -f FILE`. String
    /// values may hold references to earlier steps' children: `${steps.<name>.task_id}`,
    /// `.kind`, `.subject`, or `.outputs.<child step>.<field>...`.
    #[serde(with = "json_text")]
    #[schemars(with = "serde_json::Map<String, serde_json::Value>")]
    pub spec: String,
    /// Leave this child in place when the plan is reverted (or fails): the plan's undo
    /// skips it.
    #[serde(default)]
    pub keep: bool,
}

impl PlanStep {
    /// The child's spec as JSON (validation has checked that it parses as an object).
    pub fn spec_value(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::from_str(&self.spec)
    }
}

/// A child's spec as JSON text: serialized as a string (the Avro field), deserialized from
/// a string (the Avro record) or from any JSON value (a spec file's object).
pub mod json_text {
    use serde::{Deserialize, Deserializer, Serializer};
    use serde_json::Value;

    /// Writes the text.
    pub fn serialize<S: Serializer>(text: &str, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(text)
    }

    /// Reads a string as it is, any other value as its JSON text.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum TextOrValue {
            Text(String),
            Value(Value),
        }
        Ok(match TextOrValue::deserialize(d)? {
            TextOrValue::Text(t) => t,
            TextOrValue::Value(v) => v.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_spec_file_object_becomes_json_text_and_back() {
        let spec: PlanSpec = serde_json::from_value(json!({"steps": [{"name": "a", "kind": "test", "subject": "s", "spec": {"steps": 2}}]})).unwrap();
        assert_eq!(spec.steps[0].spec, r#"{"steps":2}"#);
        assert_eq!(spec.steps[0].spec_value().unwrap(), json!({"steps": 2}));
        assert!(!spec.steps[0].keep);
        let again: PlanSpec = serde_json::from_value(serde_json::to_value(&spec).unwrap()).unwrap();
        assert_eq!(again, spec);
    }
}

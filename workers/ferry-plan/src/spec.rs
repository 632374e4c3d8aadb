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
    /// Run the command once per cluster, in waves, instead of once: `${cluster}` in its spec
    /// and subject becomes each cluster's name ([`crate::steps::waves`]).
    /// Version 2 of the schema (id 61); version 1 records have none.
    #[serde(default)]
    #[avro(default = "null")]
    pub for_each: Option<ForEach>,
}

/// A step fanned out over clusters: which clusters, in which waves, what gates a wave and
/// what a failed wave does.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct ForEach {
    /// These clusters, in this order. Exactly one of `clusters`, `labels` and
    /// `cluster_set` chooses them.
    #[serde(default)]
    pub clusters: Vec<String>,
    /// The hub's ManagedClusters carrying every one of these labels, by name.
    #[serde(default)]
    pub labels: std::collections::HashMap<String, String>,
    /// The hub's ManagedClusters in this ManagedClusterSet (as the set selects them:
    /// its label, or its label selector), by name.
    #[serde(default)]
    pub cluster_set: Option<String>,
    /// How many at a time.
    #[serde(default)]
    pub waves: Waves,
    /// What a wave in which a child did not succeed does: `revert-all` (the default: the
    /// step fails and the plan reverts as usual), `revert-wave` (that wave's children are
    /// reverted, earlier waves stay, the plan ends Failed), `halt` (everything stays as it
    /// is, the plan ends Failed; a Revert of the plan undoes it all later) or `pause` (the
    /// plan waits for a person: signal `resume` goes on with the next wave, a Revert undoes
    /// it all, a Cancel stops it).
    #[serde(default)]
    pub on_failure: Option<String>,
    /// Changes to the spec for some clusters (a JSON merge patch each, RFC 7386), applied
    /// in order before `${cluster}` is put in.
    #[serde(default)]
    pub overrides: Vec<Override>,
}

/// The waves of a fanned-out step.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct Waves {
    /// Clusters per wave (0: all in one wave).
    #[serde(default)]
    pub size: i32,
    /// Children of a wave running at once (0: the whole wave).
    #[serde(default)]
    pub max_in_flight: i32,
    /// Seconds to wait before each wave after the first.
    #[serde(default)]
    pub pause_seconds: i64,
    /// Seconds a wave's children must stay Succeeded after the last one ended before the
    /// wave passes its gate (nobody reverted or replaced them meanwhile).
    #[serde(default)]
    pub soak_seconds: i64,
    /// Each wave after the first waits for a person's `approve` signal
    /// (`ferry tasks signal <plan> approve`): the n-th approval lets wave n+1 start.
    #[serde(default)]
    pub approve: bool,
    /// What the hub must say of each cluster of a wave after its soak, beside its child
    /// having succeeded, for the wave to pass. Version 3 of the schema (id 62).
    #[serde(default)]
    #[avro(default = "null")]
    pub gate: Option<Gate>,
}

/// A wave's health gate on the hub, read after the soak.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct Gate {
    /// Each cluster's ManagedCluster is Available (`ManagedClusterConditionAvailable`
    /// True: its agent reports to the hub).
    #[serde(default)]
    pub available: bool,
    /// Each cluster's AddOnPlacementScore reaches a minimum.
    #[serde(default)]
    pub score: Option<ScoreGate>,
}

/// A minimum score, read from the AddOnPlacementScore OCM placements read (in the
/// cluster's namespace on the hub; the score worker writes `ferry-resource-usage`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct ScoreGate {
    /// The AddOnPlacementScore's name.
    pub name: String,
    /// The item of its `status.scores` (the score worker's overall one is `score`).
    pub item: String,
    /// The lowest value that passes, -100 to 100 (OCM's score range). A score past its
    /// `validUntil`, or missing, does not pass.
    pub min: i32,
}

/// A change to a fanned-out step's spec for some of its clusters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct Override {
    /// The clusters it applies to.
    pub clusters: Vec<String>,
    /// A JSON merge patch of the spec (fields to set; `null` removes one).
    #[serde(with = "json_text")]
    #[schemars(with = "serde_json::Map<String, serde_json::Value>")]
    pub spec: String,
}

/// What a failed wave does ([`ForEach::on_failure`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFailure {
    /// The step fails; the plan reverts everything (or keeps it, with keep-partial).
    RevertAll,
    /// The failed wave's children are reverted; earlier waves stay; the plan ends Failed.
    RevertWave,
    /// Nothing is reverted; the plan ends Failed.
    Halt,
    /// Nothing is reverted; the plan waits for a person's `resume` (or Revert, or Cancel).
    Pause,
}

impl OnFailure {
    /// The names, as written in a spec.
    pub const NAMES: [&str; 4] = ["revert-all", "revert-wave", "halt", "pause"];

    /// Parses a spec's value (`None`: the default, revert-all).
    pub fn parse(v: Option<&str>) -> Option<Self> {
        match v {
            None | Some("revert-all") => Some(Self::RevertAll),
            Some("revert-wave") => Some(Self::RevertWave),
            Some("halt") => Some(Self::Halt),
            Some("pause") => Some(Self::Pause),
            Some(_) => None,
        }
    }
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

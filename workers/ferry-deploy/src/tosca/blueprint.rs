//! The blueprint as serde reads it (a TOSCA service template: metadata, repositories,
//! inputs, node templates in the author's order) and `{ get_input: NAME }` resolution.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_yaml_ng::{Mapping, Value};

use super::ToscaError;

/// The parts of a service template the conversion reads; the rest is ignored.
#[derive(Debug, Deserialize)]
pub struct Blueprint {
    /// `template_name` (or `name`), `owner` (or `template_author`).
    #[serde(default)]
    pub metadata: Mapping,
    /// Artifact repositories: `name: {url: ...}` or `name: URL`.
    #[serde(default)]
    pub repositories: Mapping,
    /// The topology.
    #[serde(default)]
    pub topology_template: Option<Topology>,
}

/// `topology_template`.
#[derive(Debug, Deserialize)]
pub struct Topology {
    /// `name: {type, default, ...}`.
    #[serde(default)]
    pub inputs: Mapping,
    /// Kept as a mapping: it preserves the blueprint's order.
    #[serde(default)]
    pub node_templates: Option<Mapping>,
}

/// One node template (after its inputs are resolved).
#[derive(Debug, Default, Deserialize)]
pub struct NodeTemplate {
    /// The node type.
    #[serde(rename = "type")]
    pub type_: String,
    /// Properties.
    #[serde(default)]
    pub properties: Mapping,
    /// `- name: target`, `- name: {node: target, node_filter: ...}`.
    #[serde(default)]
    pub requirements: Vec<Mapping>,
    /// Artifacts (the Simple Profile's container image).
    #[serde(default)]
    pub artifacts: Mapping,
    /// Capabilities (`host`, `scalable`, endpoints).
    #[serde(default)]
    pub capabilities: Mapping,
    /// A host's node filter (CHARITY puts it on `Charity.Node`).
    #[serde(default)]
    pub node_filter: Option<Value>,
}

/// One requirement: its name, its target node (if it names one) and an inline node filter.
#[derive(Debug, Clone)]
pub struct Requirement {
    /// The requirement's name (`host`, `virtual_link`, ...).
    pub name: String,
    /// The node it points at.
    pub node: Option<String>,
    /// `node_filter` given inline.
    pub node_filter: Option<Value>,
    /// `node_templates.<node>.requirements[<i>].<name>`.
    pub path: String,
}

impl NodeTemplate {
    /// The requirements in the blueprint's order.
    pub fn requirements(&self, node: &str) -> Result<Vec<Requirement>, ToscaError> {
        let mut out = Vec::new();
        for (i, m) in self.requirements.iter().enumerate() {
            for (k, v) in m {
                let name = k.as_str().unwrap_or_default().to_owned();
                let path = format!("node_templates.{node}.requirements[{i}].{name}");
                let (target, node_filter) = match v {
                    Value::String(s) => (Some(s.clone()), None),
                    Value::Mapping(r) => {
                        let target = match r.get("node") {
                            None | Some(Value::Null) => None,
                            Some(Value::String(s)) => Some(s.clone()),
                            Some(_) => return Err(ToscaError::invalid(format!("{path}.node"), "expected the name of a node template")),
                        };
                        (target, r.get("node_filter").cloned())
                    }
                    _ => return Err(ToscaError::invalid(path, "expected a node template's name or {node: NAME}")),
                };
                out.push(Requirement { name, node: target, node_filter, path });
            }
        }
        Ok(out)
    }
}

/// The values `get_input` resolves to: the inputs' defaults, overridden by the caller's.
#[derive(Debug, Default)]
pub struct Inputs {
    declared: BTreeMap<String, Option<Value>>,
}

impl Inputs {
    /// From `topology_template.inputs` and the caller's `NAME=VALUE` overrides (each
    /// value read as a YAML scalar, so `3` is a number and `web` a string).
    pub fn new(inputs: &Mapping, given: &BTreeMap<String, String>) -> Result<Self, ToscaError> {
        let mut declared = BTreeMap::new();
        for (k, v) in inputs {
            let name = k.as_str().ok_or_else(|| ToscaError::invalid("topology_template.inputs", "an input's name is not a string"))?;
            declared.insert(name.to_owned(), v.get("default").cloned());
        }
        for (name, text) in given {
            if !declared.contains_key(name) {
                return Err(ToscaError::invalid("topology_template.inputs", format!("input {name:?} was given but the blueprint declares no such input")));
            }
            let v: Value = serde_yaml_ng::from_str(text).unwrap_or_else(|_| Value::String(text.clone()));
            declared.insert(name.clone(), Some(v));
        }
        Ok(Self { declared })
    }

    /// `v` with every `{ get_input: NAME }` replaced by the input's value; `path` is `v`'s.
    pub fn resolve(&self, v: &Value, path: &str) -> Result<Value, ToscaError> {
        match v {
            Value::Mapping(m) if m.len() == 1 && m.contains_key("get_input") => {
                let name = match m.get("get_input") {
                    Some(Value::String(s)) => s.clone(),
                    _ => return Err(ToscaError::invalid(path, "get_input takes the name of an input")),
                };
                match self.declared.get(&name) {
                    None => Err(ToscaError::UnknownInput { path: path.to_owned(), input: name }),
                    Some(None) => Err(ToscaError::InputWithoutValue { path: path.to_owned(), input: name }),
                    Some(Some(value)) => Ok(value.clone()),
                }
            }
            Value::Mapping(m) => {
                let mut out = Mapping::new();
                for (k, x) in m {
                    let key = k.as_str().map(str::to_owned).unwrap_or_else(|| format!("{k:?}"));
                    out.insert(k.clone(), self.resolve(x, &format!("{path}.{key}"))?);
                }
                Ok(Value::Mapping(out))
            }
            Value::Sequence(s) => s.iter().enumerate().map(|(i, x)| self.resolve(x, &format!("{path}[{i}]"))).collect::<Result<Vec<_>, _>>().map(Value::Sequence),
            Value::Tagged(t) => self.resolve(&t.value, path),
            other => Ok(other.clone()),
        }
    }
}

/// The text of a scalar (strings, numbers, booleans).
pub fn text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A string property, refused with its path when it is not a scalar.
pub fn string_prop(props: &Mapping, key: &str, path: &str) -> Result<Option<String>, ToscaError> {
    match props.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => text(v).map(Some).ok_or_else(|| ToscaError::invalid(format!("{path}.{key}"), "expected a string")),
    }
}

/// A boolean property (`true`/`false`), refused with its path otherwise.
pub fn bool_prop(props: &Mapping, key: &str, path: &str) -> Result<Option<bool>, ToscaError> {
    match props.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ToscaError::invalid(format!("{path}.{key}"), "expected true or false")),
    }
}

//! References from a child's spec (or subject) to earlier children: `${steps.<name>.<path>}`.
//!
//! `<path>` starts with one of the fields of a plan step's output ([`crate::steps::child`]):
//! `task_id`, `kind`, `subject`, or `outputs` followed by the child's step name and the
//! fields (or list indexes) inside that step's output, e.g.
//! `${steps.create.outputs.register.cluster}`. A string that is one reference and nothing
//! else becomes the referenced value (a number stays a number); a reference inside a longer
//! string is replaced by the value's text. `${` not followed by `steps.` is left as it is
//! (a deploy's environment may hold shell-style variables), but for `${cluster}` in a
//! fanned-out step, which [`put_cluster`] replaces with each cluster's name first.

use std::collections::BTreeMap;

use serde_json::Value;

/// What opens a reference.
const OPEN: &str = "${steps.";

/// The fields of a plan step's output a reference may start with (a fanned-out step's
/// output has `kind`, `clusters` and `waves`: [`crate::steps::waves`]).
pub const FIELDS: [&str; 6] = ["task_id", "kind", "subject", "outputs", "clusters", "waves"];

/// What a fanned-out step's spec and subject hold where each cluster's name goes.
pub const CLUSTER: &str = "${cluster}";

/// Whether `v`'s strings hold [`CLUSTER`] anywhere.
pub fn uses_cluster(v: &Value) -> bool {
    match v {
        Value::String(s) => s.contains(CLUSTER),
        Value::Array(a) => a.iter().any(uses_cluster),
        Value::Object(m) => m.values().any(uses_cluster),
        _ => false,
    }
}

/// `v` with every [`CLUSTER`] in its strings replaced by `cluster`.
pub fn put_cluster(v: &Value, cluster: &str) -> Value {
    match v {
        Value::String(s) => Value::String(s.replace(CLUSTER, cluster)),
        Value::Array(a) => Value::Array(a.iter().map(|x| put_cluster(x, cluster)).collect()),
        Value::Object(m) => Value::Object(m.iter().map(|(k, x)| (k.clone(), put_cluster(x, cluster))).collect()),
        other => other.clone(),
    }
}

/// One reference: the step it names and the path inside that step's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ref {
    /// The earlier step's name.
    pub step: String,
    /// The fields (or list indexes) inside its output, at least one.
    pub path: Vec<String>,
}

impl std::fmt::Display for Ref {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "${{steps.{}.{}}}", self.step, self.path.join("."))
    }
}

/// Why a reference does not parse, or does not resolve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RefError {
    /// `${steps.` with no closing `}`.
    #[error("{text:?}: a reference opened with ${{steps. is not closed with }}")]
    Unclosed {
        /// The string.
        text: String,
    },
    /// The inside of `${steps....}` is not `<step>.<field>[.<field>...]`.
    #[error("{reference}: a reference is ${{steps.<step>.<field>...}}, with <field> one of task_id, kind, subject, outputs (clusters, waves for a step with for_each)")]
    Malformed {
        /// The reference as written.
        reference: String,
    },
    /// The path names nothing in the step's output.
    #[error("{reference}: the output of step {step:?} has no {missing:?} (it has: {has})")]
    Missing {
        /// The reference.
        reference: String,
        /// The step.
        step: String,
        /// The first field (or index) not found.
        missing: String,
        /// What is there instead.
        has: String,
    },
    /// The step has no output yet (the plan runs steps in order, so a bug).
    #[error("{reference}: step {step:?} has no output")]
    NoOutput {
        /// The reference.
        reference: String,
        /// The step.
        step: String,
    },
}

/// Every reference in `text`, with the byte range it takes, in order.
pub fn in_text(text: &str) -> Result<Vec<(std::ops::Range<usize>, Ref)>, RefError> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = text[from..].find(OPEN).map(|i| from + i) {
        let close = text[at..].find('}').map(|i| at + i).ok_or_else(|| RefError::Unclosed { text: text.to_owned() })?;
        let reference = &text[at..=close];
        let inner = &text[at + OPEN.len()..close];
        let mut parts = inner.split('.');
        let step = parts.next().unwrap_or_default();
        let path: Vec<String> = parts.map(str::to_owned).collect();
        let word = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !word(step) || path.is_empty() || !path.iter().all(|p| word(p)) || !FIELDS.contains(&path[0].as_str()) {
            return Err(RefError::Malformed { reference: reference.to_owned() });
        }
        out.push((at..close + 1, Ref { step: step.to_owned(), path }));
        from = close + 1;
    }
    Ok(out)
}

/// Every reference in the strings of `v`, with where it is (`spec.a.b[0]`, from `at`).
pub fn in_value(v: &Value, at: &str) -> Result<Vec<(String, Ref)>, RefError> {
    let mut out = Vec::new();
    walk(v, at, &mut out)?;
    Ok(out)
}

fn walk(v: &Value, at: &str, out: &mut Vec<(String, Ref)>) -> Result<(), RefError> {
    match v {
        Value::String(s) => out.extend(in_text(s)?.into_iter().map(|(_, r)| (at.to_owned(), r))),
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                walk(x, &format!("{at}[{i}]"), out)?;
            }
        }
        Value::Object(m) => {
            for (k, x) in m {
                walk(x, &format!("{at}.{k}"), out)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// The value `r` names in the earlier steps' `outputs`.
fn lookup<'a>(r: &Ref, outputs: &'a BTreeMap<String, Value>) -> Result<&'a Value, RefError> {
    let mut v = outputs.get(&r.step).ok_or_else(|| RefError::NoOutput { reference: r.to_string(), step: r.step.clone() })?;
    for field in &r.path {
        let next = match v {
            Value::Object(m) => m.get(field),
            Value::Array(a) => field.parse::<usize>().ok().and_then(|i| a.get(i)),
            _ => None,
        };
        v = next.ok_or_else(|| RefError::Missing {
            reference: r.to_string(),
            step: r.step.clone(),
            missing: field.clone(),
            has: match v {
                Value::Object(m) => m.keys().cloned().collect::<Vec<_>>().join(", "),
                Value::Array(a) => format!("a list of {}", a.len()),
                other => format!("the value {other}"),
            },
        })?;
    }
    Ok(v)
}

/// `text` with its references replaced: one reference alone gives its value as it is;
/// references inside a longer string give their text.
pub fn resolve_text(text: &str, outputs: &BTreeMap<String, Value>) -> Result<Value, RefError> {
    let refs = in_text(text)?;
    if let [(range, r)] = refs.as_slice()
        && range.start == 0
        && range.end == text.len()
    {
        return lookup(r, outputs).cloned();
    }
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for (range, r) in &refs {
        out.push_str(&text[last..range.start]);
        match lookup(r, outputs)? {
            Value::String(s) => out.push_str(s),
            other => out.push_str(&other.to_string()),
        }
        last = range.end;
    }
    out.push_str(&text[last..]);
    Ok(Value::String(out))
}

/// `v` with the references in its strings replaced ([`resolve_text`]).
pub fn resolve(v: &Value, outputs: &BTreeMap<String, Value>) -> Result<Value, RefError> {
    Ok(match v {
        Value::String(s) => resolve_text(s, outputs)?,
        Value::Array(a) => Value::Array(a.iter().map(|x| resolve(x, outputs)).collect::<Result<_, _>>()?),
        Value::Object(m) => Value::Object(m.iter().map(|(k, x)| Ok((k.clone(), resolve(x, outputs)?))).collect::<Result<_, RefError>>()?),
        other => other.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn outputs() -> BTreeMap<String, Value> {
        BTreeMap::from([(
            "create".to_owned(),
            json!({"task_id": "tsk_1", "kind": "create-cluster", "subject": "fleet/edge-1", "outputs": {"register": {"cluster": "edge-1", "nodes": 3}}}),
        )])
    }

    #[test]
    fn a_whole_string_reference_keeps_the_value_type_and_an_inner_one_gives_text() {
        let o = outputs();
        assert_eq!(resolve_text("${steps.create.outputs.register.nodes}", &o).unwrap(), json!(3));
        assert_eq!(resolve_text("${steps.create.outputs.register.cluster}", &o).unwrap(), json!("edge-1"));
        assert_eq!(resolve_text("member-1+${steps.create.outputs.register.cluster}", &o).unwrap(), json!("member-1+edge-1"));
        assert_eq!(resolve_text("${HOME} stays", &o).unwrap(), json!("${HOME} stays"));
        let spec = json!({"a": "${steps.create.subject}", "b": ["x", "${steps.create.task_id}"], "c": 1});
        assert_eq!(resolve(&spec, &o).unwrap(), json!({"a": "fleet/edge-1", "b": ["x", "tsk_1"], "c": 1}));
    }

    #[test]
    fn a_missing_field_names_what_the_output_has() {
        let e = resolve_text("${steps.create.outputs.register.name}", &outputs()).unwrap_err();
        assert_eq!(e.to_string(), r#"${steps.create.outputs.register.name}: the output of step "create" has no "name" (it has: cluster, nodes)"#);
    }

    #[test]
    fn malformed_references_are_refused() {
        for bad in ["${steps.create}", "${steps.create.output.cluster}", "${steps..task_id}", "${steps.create.task_id"] {
            assert!(in_text(bad).is_err(), "{bad}");
        }
        let found = in_value(&json!({"x": ["${steps.a.task_id} ${steps.b.outputs.s.f}"]}), "spec").unwrap();
        assert_eq!(found.len(), 2);
        assert_eq!(found[1], ("spec.x[0]".to_owned(), Ref { step: "b".into(), path: vec!["outputs".into(), "s".into(), "f".into()] }));
    }
}

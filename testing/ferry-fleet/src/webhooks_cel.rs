//! The CEL validation rules (`x-kubernetes-validations`) of the upstream CRDs the test bed
//! installs. Kubernetes v1.20 cannot run CEL, so [`crate::crds::prepare`] strips the rules;
//! this webhook enforces every one of them instead, as the API server would
//! (apiextensions-apiserver `pkg/apiserver/schema/cel/validation.go`): each rule is
//! evaluated with `self` bound to the value at its schema node (every item of a list,
//! every value of a map), transition rules (those naming `oldSelf`) only on an update
//! where the old value exists and outside lists and maps; a false rule refuses the write
//! with `<path>: Invalid value: "object": <message>`. [`rules`] lists them all.
//!
//! Evaluated by cel-interpreter, not cel-go: a rule it cannot evaluate (an unsupported
//! function, a type error) is let through and logged, never refused.

use std::sync::{Arc, OnceLock};

use futures::FutureExt;
use futures::future::BoxFuture;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, Operation};
use serde_json::Value;

use crate::admission::{Registration, Validator};

/// A step from a schema node to its children.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seg {
    /// `properties.<name>`.
    Field(String),
    /// `items`: every element of a list.
    Items,
    /// `additionalProperties`: every value of a map.
    Values,
}

/// One CEL rule of a CRD.
#[derive(Debug)]
pub struct CelRule {
    /// The schema path, e.g. `spec.identityRef` (`[*]` for list items and map values).
    pub path: String,
    /// The rule.
    pub rule: String,
    /// Its message (`failed rule: <rule>` when upstream gives none).
    pub message: String,
    segs: Vec<Seg>,
    transition: bool,
}

/// A CRD with CEL rules and the webhook registration that enforces them.
#[derive(Debug)]
pub struct CelCrd {
    /// `<plural>.<group>`.
    pub name: String,
    group: String,
    webhook: String,
    groups: Vec<&'static str>,
    versions: Vec<&'static str>,
    resources: Vec<&'static str>,
    /// Its rules.
    pub rules: Vec<CelRule>,
}

fn collect(node: &Value, segs: &mut Vec<Seg>, out: &mut Vec<CelRule>) {
    let Some(m) = node.as_object() else { return };
    for r in m.get("x-kubernetes-validations").and_then(Value::as_array).into_iter().flatten() {
        let Some(rule) = r.get("rule").and_then(Value::as_str) else { continue };
        let message = r.get("message").and_then(Value::as_str).map_or_else(|| format!("failed rule: {rule}"), str::to_owned);
        let path = segs
            .iter()
            .map(|s| match s {
                Seg::Field(f) => format!(".{f}"),
                Seg::Items | Seg::Values => "[*]".into(),
            })
            .collect::<String>()
            .trim_start_matches('.')
            .to_owned();
        out.push(CelRule { path, rule: rule.to_owned(), message, segs: segs.clone(), transition: rule.contains("oldSelf") });
    }
    for (k, v) in m.get("properties").and_then(Value::as_object).into_iter().flatten() {
        segs.push(Seg::Field(k.clone()));
        collect(v, segs, out);
        segs.pop();
    }
    if let Some(items) = m.get("items") {
        segs.push(Seg::Items);
        collect(items, segs, out);
        segs.pop();
    }
    if let Some(values) = m.get("additionalProperties").filter(|v| v.is_object()) {
        segs.push(Seg::Values);
        collect(values, segs, out);
        segs.pop();
    }
}

/// The CRDs among `docs` (as upstream wrote them) that carry CEL rules, with those rules
/// (of their storage version).
pub fn from_docs(docs: &[Value]) -> Vec<CelCrd> {
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    let mut out = Vec::new();
    for d in docs {
        let group = d.pointer("/spec/group").and_then(Value::as_str).unwrap_or_default().to_owned();
        let plural = d.pointer("/spec/names/plural").and_then(Value::as_str).unwrap_or_default().to_owned();
        let Some(v) = d.pointer("/spec/versions").and_then(Value::as_array).into_iter().flatten().find(|v| v["storage"] == true) else { continue };
        let mut rules = Vec::new();
        collect(v.pointer("/schema/openAPIV3Schema").unwrap_or(&Value::Null), &mut Vec::new(), &mut rules);
        if rules.is_empty() {
            continue;
        }
        let version = v["name"].as_str().unwrap_or_default().to_owned();
        let name = format!("{plural}.{group}");
        // Leaked once per process (see `rules`): registrations name static strings.
        out.push(CelCrd {
            webhook: format!("cel.{name}"),
            groups: vec![leak(group.clone())],
            versions: vec![leak(version)],
            resources: vec![leak(plural)],
            name,
            group,
            rules,
        });
    }
    out
}

/// The CEL rules of the upstream CRDs the test bed installs (`crds::upstream_subset`),
/// read once per process; empty without ../shared/crds.
pub fn rules() -> &'static [CelCrd] {
    static RULES: OnceLock<Vec<CelCrd>> = OnceLock::new();
    RULES.get_or_init(|| {
        let Some(shared) = crate::crds::shared_dir() else { return Vec::new() };
        match crate::crds::upstream_subset_raw(&shared) {
            Ok(docs) => from_docs(&docs),
            Err(e) => {
                tracing::warn!(error = %e, "reading the upstream CRDs' CEL rules");
                Vec::new()
            }
        }
    })
}

/// The webhook of each CRD with rules.
pub fn validators() -> Vec<(Registration, Arc<dyn Validator>)> {
    rules()
        .iter()
        .map(|c| {
            let r = Registration {
                name: &c.webhook, groups: &c.groups, versions: &c.versions, resources: &c.resources, operations: &["CREATE", "UPDATE"],
                namespace_selector: None, object_selector: None,
            };
            (r, Arc::new(CelWebhook { crd: c }) as Arc<dyn Validator>)
        })
        .collect()
}

struct CelWebhook {
    crd: &'static CelCrd,
}

/// The values at `segs` under `v`, each with its path (list indexes and map keys named).
fn nodes<'a>(v: &'a Value, segs: &[Seg], path: String, out: &mut Vec<(String, &'a Value)>) {
    let Some((first, rest)) = segs.split_first() else {
        out.push((path, v));
        return;
    };
    let join = |p: &str, s: &str| if p.is_empty() { s.to_owned() } else { format!("{p}.{s}") };
    match first {
        Seg::Field(f) => {
            if let Some(c) = v.get(f).filter(|c| !c.is_null()) {
                nodes(c, rest, join(&path, f), out);
            }
        }
        Seg::Items => {
            for (i, c) in v.as_array().into_iter().flatten().enumerate() {
                nodes(c, rest, format!("{path}[{i}]"), out);
            }
        }
        Seg::Values => {
            for (k, c) in v.as_object().into_iter().flatten() {
                nodes(c, rest, format!("{path}[{k}]"), out);
            }
        }
    }
}

/// Evaluates `rule` on `value` (and `old`): Some(false) when it fails, None when it
/// cannot be evaluated here.
fn holds(rule: &CelRule, value: &Value, old: Option<&Value>) -> Option<bool> {
    let program = cel_interpreter::Program::compile(&rule.rule).ok()?;
    let mut cx = cel_interpreter::Context::default();
    cx.add_variable("self", value).ok()?;
    if let Some(old) = old {
        cx.add_variable("oldSelf", old).ok()?;
    }
    match program.execute(&cx) {
        Ok(cel_interpreter::Value::Bool(b)) => Some(b),
        other => {
            tracing::debug!(rule = %rule.rule, result = ?other, "a CEL rule the test bed cannot evaluate: let through");
            None
        }
    }
}

/// The failures of `crd`'s rules on `new` (an update's `old` for transition rules).
pub fn failures(crd: &CelCrd, new: &Value, old: Option<&Value>) -> Vec<String> {
    let mut out = Vec::new();
    for rule in &crd.rules {
        let mut found = Vec::new();
        nodes(new, &rule.segs, String::new(), &mut found);
        for (path, value) in found {
            let previous = if rule.transition {
                // Transition rules: on updates, where the old value exists, outside lists and maps.
                if rule.segs.iter().any(|s| !matches!(s, Seg::Field(_))) {
                    continue;
                }
                let mut was = Vec::new();
                if let Some(old) = old {
                    nodes(old, &rule.segs, String::new(), &mut was);
                }
                match was.into_iter().next() {
                    Some((_, v)) => Some(v),
                    None => continue,
                }
            } else {
                None
            };
            if holds(rule, value, previous) == Some(false) {
                out.push(format!("{}: Invalid value: \"object\": {}", if path.is_empty() { "<root>" } else { &path }, rule.message));
            }
        }
    }
    out
}

impl Validator for CelWebhook {
    fn validate<'a>(&'a self, req: &'a AdmissionRequest<DynamicObject>) -> BoxFuture<'a, Result<(), String>> {
        async move {
            let Some(obj) = req.object.as_ref() else { return Ok(()) };
            let new = serde_json::to_value(obj).map_err(|e| e.to_string())?;
            let old = match req.operation {
                Operation::Update => req.old_object.as_ref().and_then(|o| serde_json::to_value(o).ok()),
                _ => None,
            };
            let failed = failures(self.crd, &new, old.as_ref());
            if failed.is_empty() {
                Ok(())
            } else {
                let kind = obj.types.as_ref().map_or("object", |t| t.kind.as_str());
                let name = obj.metadata.name.as_deref().unwrap_or("");
                Err(format!("{kind}.{} {name:?} is invalid: {}", self.crd.group, failed.join(", ")))
            }
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn crd(schema: Value) -> CelCrd {
        let doc = json!({"spec": {"group": "g.io", "names": {"plural": "things"}, "versions": [{"name": "v1", "storage": true, "schema": {"openAPIV3Schema": schema}}]}});
        from_docs(&[doc]).remove(0)
    }

    #[test]
    fn rules_apply_at_their_node_items_included_and_transitions_on_updates() {
        let c = crd(json!({"properties": {"spec": {"properties": {
            "args": {"items": {"properties": {"name": {}}}, "x-kubernetes-validations": [{"rule": "self.all(x, self.exists_one(y, x.name == y.name))", "message": "extraArgs name must be unique"}]},
            "region": {"x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "region is immutable"}]},
            "parts": {"items": {"x-kubernetes-validations": [{"rule": "has(self.layout) != has(self.diskLayout)"}]}},
        }}}}));
        assert_eq!(c.rules.iter().map(|r| r.path.as_str()).collect::<Vec<_>>(), ["spec.args", "spec.parts[*]", "spec.region"]);
        let ok = json!({"spec": {"args": [{"name": "a"}, {"name": "b"}], "region": "r1", "parts": [{"layout": true}]}});
        assert!(failures(&c, &ok, None).is_empty());
        let dup = json!({"spec": {"args": [{"name": "a"}, {"name": "a"}], "parts": [{"layout": true}, {}]}});
        assert_eq!(
            failures(&c, &dup, None),
            ["spec.args: Invalid value: \"object\": extraArgs name must be unique", "spec.parts[1]: Invalid value: \"object\": failed rule: has(self.layout) != has(self.diskLayout)"]
        );
        // A transition rule only on an update with an old value.
        let moved = json!({"spec": {"region": "r2"}});
        assert!(failures(&c, &moved, None).is_empty(), "a create has no oldSelf");
        assert_eq!(failures(&c, &moved, Some(&ok)), ["spec.region: Invalid value: \"object\": region is immutable"]);
    }
}

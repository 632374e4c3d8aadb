//! Hosts' sizes → resource requests: `num_cpus` and `mem_size` from a TOSCA node filter
//! (`node_filter: {properties: [...], capabilities: [{host: {properties: [...]}}]}`, the
//! constraint clauses of the Simple Profile 1.3, 3.6.3) or from a host's `host`
//! capability, each turned into a CPU or memory request.
//!
//! The request is the constraint's lower bound, as the CHARITY converter took it:
//! `equal`, `greater_or_equal`, a bare value → that value; `in_range: [lo, hi]` → `lo`
//! (refused when `lo > hi`); `valid_values` → the smallest; `greater_than: n` → `n + 1`
//! CPUs, or `n` itself for a size (one byte more is no different request). A property with
//! only upper bounds (`less_than`, `less_or_equal`) asks for nothing. Several clauses on one
//! property: the largest lower bound.

use serde_yaml_ng::{Mapping, Value};

use super::ToscaError;
use super::units;

/// What a host asks of each replica.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Requests {
    /// CPU quantity.
    pub cpu: Option<String>,
    /// Memory quantity.
    pub memory: Option<String>,
    /// Filtered properties that have no Kubernetes request (e.g. `disk_size`), with paths.
    pub ignored: Vec<String>,
}

impl Requests {
    /// `self`, with what it lacks taken from `other`.
    pub fn or(mut self, other: Requests) -> Requests {
        self.cpu = self.cpu.or(other.cpu);
        self.memory = self.memory.or(other.memory);
        self.ignored.extend(other.ignored);
        self
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Cpu,
    Size,
}

fn convert(kind: Kind, v: &Value, path: &str) -> Result<(String, f64), ToscaError> {
    match kind {
        Kind::Cpu => units::cpus(v, path),
        Kind::Size => units::size(v, path),
    }
}

/// The lower bound of one constraint clause (or a bare value), if it has one.
fn lower_bound(kind: Kind, clause: &Value, path: &str) -> Result<Option<(String, f64)>, ToscaError> {
    let Value::Mapping(m) = clause else { return convert(kind, clause, path).map(Some) };
    let (op, arg) = match m.iter().next() {
        Some((k, v)) if m.len() == 1 => (k.as_str().unwrap_or_default(), v),
        _ => return Err(ToscaError::invalid(path, "a constraint clause has exactly one operator, e.g. {greater_or_equal: 2}")),
    };
    let at = format!("{path}.{op}");
    match op {
        "equal" | "greater_or_equal" => convert(kind, arg, &at).map(Some),
        "greater_than" => {
            let (q, n) = convert(kind, arg, &at)?;
            match kind {
                Kind::Size => Ok(Some((q, n))),
                Kind::Cpu => {
                    let next = units::int_in(arg, &at, 1, units::MAX_CPUS - 1)? + 1;
                    Ok(Some((next.to_string(), f64::from(next))))
                }
            }
        }
        "in_range" => {
            let bounds = arg.as_sequence().filter(|s| s.len() == 2).ok_or_else(|| ToscaError::invalid(&at, "expected [lower, upper]"))?;
            let lo = convert(kind, &bounds[0], &format!("{at}[0]"))?;
            let hi = convert(kind, &bounds[1], &format!("{at}[1]"))?;
            if lo.1 > hi.1 {
                return Err(ToscaError::invalid(at, format!("the lower bound {} is above the upper bound {}", lo.0, hi.0)));
            }
            Ok(Some(lo))
        }
        "valid_values" => {
            let vals = arg.as_sequence().filter(|s| !s.is_empty()).ok_or_else(|| ToscaError::invalid(&at, "expected a non-empty list"))?;
            let mut least: Option<(String, f64)> = None;
            for (i, v) in vals.iter().enumerate() {
                let c = convert(kind, v, &format!("{at}[{i}]"))?;
                if least.as_ref().is_none_or(|l| c.1 < l.1) {
                    least = Some(c);
                }
            }
            Ok(least)
        }
        "less_than" | "less_or_equal" => {
            convert(kind, arg, &at)?;
            Ok(None)
        }
        _ => Err(ToscaError::invalid(at, "unknown constraint operator; expected equal, greater_than, greater_or_equal, less_than, less_or_equal, in_range or valid_values")),
    }
}

/// The request a property filter asks for: one clause, or a list of clauses.
fn request(kind: Kind, constraint: &Value, path: &str) -> Result<Option<String>, ToscaError> {
    let mut best: Option<(String, f64)> = None;
    let clauses: Vec<(Value, String)> = match constraint {
        Value::Sequence(s) => s.iter().enumerate().map(|(i, c)| (c.clone(), format!("{path}[{i}]"))).collect(),
        c => vec![(c.clone(), path.to_owned())],
    };
    for (c, p) in clauses {
        if let Some(b) = lower_bound(kind, &c, &p)?
            && best.as_ref().is_none_or(|x| b.1 > x.1)
        {
            best = Some(b);
        }
    }
    Ok(best.map(|b| b.0))
}

/// The property filters of a list (`[{num_cpus: ...}, {mem_size: ...}]`) or a mapping.
fn property_filters(v: &Value, path: &str) -> Result<Vec<(String, Value, String)>, ToscaError> {
    let entries = |m: &Mapping, at: &str| -> Vec<(String, Value, String)> {
        m.iter()
            .map(|(k, v)| {
                let k = k.as_str().unwrap_or_default().to_owned();
                let path = format!("{at}.{k}");
                (k, v.clone(), path)
            })
            .collect()
    };
    match v {
        Value::Mapping(m) => Ok(entries(m, path)),
        Value::Sequence(s) => {
            let mut out = Vec::new();
            for (i, item) in s.iter().enumerate() {
                let m = item.as_mapping().ok_or_else(|| ToscaError::invalid(format!("{path}[{i}]"), "expected {property: constraint}"))?;
                out.extend(entries(m, &format!("{path}[{i}]")));
            }
            Ok(out)
        }
        Value::Null => Ok(Vec::new()),
        _ => Err(ToscaError::invalid(path, "expected a list of {property: constraint}")),
    }
}

fn from_filters(filters: Vec<(String, Value, String)>) -> Result<Requests, ToscaError> {
    let mut r = Requests::default();
    for (name, constraint, path) in filters {
        match name.as_str() {
            "num_cpus" => r.cpu = request(Kind::Cpu, &constraint, &path)?.or(r.cpu),
            "mem_size" => r.memory = request(Kind::Size, &constraint, &path)?.or(r.memory),
            _ => r.ignored.push(path),
        }
    }
    Ok(r)
}

/// The requests of a `node_filter` at `path`: its `properties` and its capabilities'.
pub fn node_filter(v: &Value, path: &str) -> Result<Requests, ToscaError> {
    let Value::Mapping(m) = v else { return Err(ToscaError::invalid(path, "expected {properties: [...], capabilities: [...]}")) };
    let mut filters = match m.get("properties") {
        Some(p) => property_filters(p, &format!("{path}.properties"))?,
        None => Vec::new(),
    };
    match m.get("capabilities") {
        None | Some(Value::Null) => {}
        Some(Value::Sequence(caps)) => {
            for (i, cap) in caps.iter().enumerate() {
                let at = format!("{path}.capabilities[{i}]");
                let (name, body) = cap.as_mapping().and_then(|c| c.iter().next()).ok_or_else(|| ToscaError::invalid(&at, "expected {capability: {properties: [...]}}"))?;
                let at = format!("{at}.{}", name.as_str().unwrap_or_default());
                if let Some(p) = body.get("properties") {
                    filters.extend(property_filters(p, &format!("{at}.properties"))?);
                }
            }
        }
        Some(Value::Mapping(caps)) => {
            for (name, body) in caps {
                let at = format!("{path}.capabilities.{}", name.as_str().unwrap_or_default());
                if let Some(p) = body.get("properties") {
                    filters.extend(property_filters(p, &format!("{at}.properties"))?);
                }
            }
        }
        Some(_) => return Err(ToscaError::invalid(format!("{path}.capabilities"), "expected a list of {capability: {properties: [...]}}")),
    }
    from_filters(filters)
}

/// The requests of a host node: its own `node_filter`, then its `host` capability's
/// `num_cpus` and `mem_size` (exact values, as `tosca.nodes.Compute` and
/// `tosca.nodes.Container.Runtime` give them).
pub fn host(node: &str, filter: Option<&Value>, capabilities: &Mapping) -> Result<Requests, ToscaError> {
    let mut r = match filter {
        Some(f) => node_filter(f, &format!("node_templates.{node}.node_filter"))?,
        None => Requests::default(),
    };
    if let Some(p) = capabilities.get("host").and_then(|h| h.get("properties")) {
        let cap = from_filters(property_filters(p, &format!("node_templates.{node}.capabilities.host.properties"))?)?;
        r = r.or(cap);
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(yaml: &str) -> Result<Requests, ToscaError> {
        node_filter(&serde_yaml_ng::from_str(yaml).unwrap(), "node_templates.h.node_filter")
    }

    #[test]
    fn lower_bounds_become_requests() {
        let r = filter("properties: [{num_cpus: {in_range: [2, 4]}}, {mem_size: {greater_or_equal: 4 GB}}]").unwrap();
        assert_eq!((r.cpu.as_deref(), r.memory.as_deref()), (Some("2"), Some("4G")));
        let r = filter("properties: [{num_cpus: {greater_than: 2}}, {mem_size: [{less_than: 8 GiB}, {greater_or_equal: 512 MiB}]}]").unwrap();
        assert_eq!((r.cpu.as_deref(), r.memory.as_deref()), (Some("3"), Some("512Mi")));
        let r = filter("capabilities: [{host: {properties: [{num_cpus: {equal: 1}}, {mem_size: {valid_values: [2 GB, 1 GiB]}}, {disk_size: {greater_or_equal: 10 GB}}]}}]").unwrap();
        assert_eq!((r.cpu.as_deref(), r.memory.as_deref()), (Some("1"), Some("1Gi")));
        assert_eq!(r.ignored, ["node_templates.h.node_filter.capabilities[0].host.properties[2].disk_size"]);
        let r = filter("properties: {num_cpus: 2, mem_size: {less_or_equal: 1 GB}}").unwrap();
        assert_eq!((r.cpu.as_deref(), r.memory.as_deref()), (Some("2"), None));
    }

    #[test]
    fn bad_filters_name_the_path() {
        let e = filter("properties: [{num_cpus: {in_range: [4, 2]}}]").unwrap_err().to_string();
        assert!(e.starts_with("node_templates.h.node_filter.properties[0].num_cpus.in_range: "), "{e}");
        let e = filter("properties: [{num_cpus: {at_least: 2}}]").unwrap_err().to_string();
        assert!(e.contains("num_cpus.at_least: unknown constraint operator"), "{e}");
        let e = filter("properties: [{num_cpus: {greater_or_equal: 4294967297}}]").unwrap_err().to_string();
        assert!(e.contains("num_cpus.greater_or_equal: 4294967297 is out of range"), "{e}");
        let e = filter("properties: [{mem_size: {greater_or_equal: 4 GiBs}}]").unwrap_err().to_string();
        assert!(e.contains("mem_size.greater_or_equal: ") && e.contains("unknown or missing unit"), "{e}");
    }
}

//! One component node template → a `Component` (image, replicas, ports, environment,
//! requests, target), in both dialects: Ferry's/the Simple Profile's container properties
//! and artifacts, and CHARITY's `Charity.Component`. Exposure (Service, Ingress) is decided
//! over the whole topology in [`super`].

use std::collections::BTreeMap;

use serde_yaml_ng::{Mapping, Value};

use super::blueprint::{NodeTemplate, string_prop, text};
use super::{ToscaError, units};
use crate::spec::{Component, EnvVar, PlacementSpec, Port};
use crate::validate::MAX_REPLICAS;

/// The cluster label a `placement_hint` becomes a placement on (operators label their
/// ManagedClusters `ferry.io/placement-hint=<hint>`, e.g. `edge` or `cloud`).
pub const PLACEMENT_HINT_LABEL: &str = "ferry.io/placement-hint";

/// A component's TLS wishes, applied to its Ingress (if it gets one).
#[derive(Debug, Clone, Default)]
pub struct Tls {
    /// The TLS Secret (on the hub, in the app's namespace).
    pub secret: Option<String>,
    /// The port the Ingress sends to (`tls_port`).
    pub port: Option<i32>,
    /// Where they were given, for notes.
    pub path: String,
}

/// The image: `properties.image`, or (Simple Profile) an artifact of an image type
/// (`tosca.artifacts.Deployment.Image...`) or the node's only artifact, its `file`
/// prefixed with its repository's host (`docker_hub` or no repository: none).
pub fn image(node: &str, t: &NodeTemplate, repositories: &Mapping) -> Result<Option<String>, ToscaError> {
    let path = format!("node_templates.{node}");
    if let Some(i) = string_prop(&t.properties, "image", &format!("{path}.properties"))? {
        return Ok(Some(i));
    }
    let is_image = |a: &Value| a.get("type").and_then(Value::as_str).is_some_and(|ty| ty.contains("Image"));
    let chosen = t.artifacts.iter().find(|(_, a)| is_image(a)).or_else(|| if t.artifacts.len() == 1 { t.artifacts.iter().next() } else { None });
    let Some((name, artifact)) = chosen else { return Ok(None) };
    let at = format!("{path}.artifacts.{}", name.as_str().unwrap_or_default());
    let (file, repo) = match artifact {
        Value::String(f) => (f.clone(), None),
        Value::Mapping(m) => (
            string_prop(m, "file", &at)?.ok_or_else(|| ToscaError::invalid(&at, "the image artifact has no file (the image name)"))?,
            string_prop(m, "repository", &at)?,
        ),
        _ => return Err(ToscaError::invalid(at, "expected {file: IMAGE, type: ..., repository: ...}")),
    };
    let Some(repo) = repo.filter(|r| r != "docker_hub") else { return Ok(Some(file)) };
    let url = match repositories.get(repo.as_str()) {
        Some(Value::String(u)) => u.clone(),
        Some(r) => r.get("url").and_then(text).ok_or_else(|| ToscaError::invalid(format!("repositories.{repo}"), "the repository has no url"))?,
        None => return Err(ToscaError::invalid(format!("{at}.repository"), format!("repository {repo:?} is not defined in the blueprint's repositories"))),
    };
    let host = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest).trim_end_matches('/');
    Ok(Some(format!("{host}/{file}")))
}

fn protocol(v: Option<&Value>, path: &str) -> Result<Option<String>, ToscaError> {
    let Some(v) = v.filter(|v| !v.is_null()) else { return Ok(None) };
    let p = text(v).unwrap_or_default().to_ascii_uppercase();
    if ["TCP", "UDP", "SCTP"].contains(&p.as_str()) {
        Ok(Some(p))
    } else {
        Err(ToscaError::invalid(path, format!("protocol {v:?}; expected TCP, UDP or SCTP")))
    }
}

/// One port entry: a number, `{containerPort|port|target: N, protocol, name}`, or (CHARITY)
/// a list per container, flattened: Ferry runs one container per component.
fn ports_of(v: &Value, path: &str, out: &mut Vec<(Port, String)>) -> Result<(), ToscaError> {
    match v {
        Value::Sequence(items) => {
            for (i, item) in items.iter().enumerate() {
                ports_of(item, &format!("{path}[{i}]"), out)?;
            }
        }
        Value::Mapping(m) => {
            let key = ["containerPort", "port", "target", "source"].into_iter().find(|k| m.contains_key(*k));
            let key = key.ok_or_else(|| ToscaError::invalid(path, "a port needs containerPort (or port, or target)"))?;
            let port = units::int_in(&m[key], &format!("{path}.{key}"), 1, 65535)?;
            let name = string_prop(m, "name", path)?;
            out.push((Port { name, port, protocol: protocol(m.get("protocol"), &format!("{path}.protocol"))? }, format!("{path}.{key}")));
        }
        v => out.push((Port { port: units::int_in(v, path, 1, 65535)?, ..Port::default() }, path.to_owned())),
    }
    Ok(())
}

/// Ports from `properties.ports` and (Simple Profile) endpoint capabilities
/// (`capabilities.<endpoint>.properties.port`, or `ports: {name: {target: N}}`); a
/// port/protocol given twice is refused naming both paths.
fn ports(node: &str, t: &NodeTemplate) -> Result<Vec<Port>, ToscaError> {
    let mut found = Vec::new();
    if let Some(v) = t.properties.get("ports").filter(|v| !v.is_null()) {
        ports_of(v, &format!("node_templates.{node}.properties.ports"), &mut found)?;
    }
    for (cap, body) in &t.capabilities {
        let cap = cap.as_str().unwrap_or_default();
        let Some(props) = body.get("properties").and_then(Value::as_mapping) else { continue };
        let at = format!("node_templates.{node}.capabilities.{cap}.properties");
        if let Some(p) = props.get("port") {
            let port = units::int_in(p, &format!("{at}.port"), 1, 65535)?;
            found.push((Port { port, protocol: protocol(props.get("protocol"), &format!("{at}.protocol"))?, ..Port::default() }, format!("{at}.port")));
        }
        if let Some(Value::Mapping(specs)) = props.get("ports") {
            for (name, spec) in specs {
                ports_of(spec, &format!("{at}.ports.{}", name.as_str().unwrap_or_default()), &mut found)?;
            }
        }
    }
    let mut seen: BTreeMap<(i32, String), String> = BTreeMap::new();
    for (p, path) in &found {
        let proto = p.protocol.clone().unwrap_or_else(|| "TCP".into());
        if let Some(first) = seen.insert((p.port, proto.clone()), path.clone()) {
            return Err(ToscaError::invalid(path, format!("port {}/{proto} is already given at {first}", p.port)));
        }
    }
    Ok(found.into_iter().map(|(p, _)| p).collect())
}

/// `environment`: a map of scalars (inputs already resolved), sorted by name.
fn environment(node: &str, t: &NodeTemplate) -> Result<Vec<EnvVar>, ToscaError> {
    let path = format!("node_templates.{node}.properties.environment");
    let env = match t.properties.get("environment") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Mapping(m)) => m,
        Some(_) => return Err(ToscaError::invalid(path, "expected a map of NAME: value")),
    };
    let mut vars = Vec::new();
    for (k, v) in env {
        let name = text(k).ok_or_else(|| ToscaError::invalid(&path, "a variable's name is not a string"))?;
        let value = text(v).ok_or_else(|| ToscaError::invalid(format!("{path}.{name}"), "expected a string, number or boolean (or {get_input: NAME})"))?;
        vars.push(EnvVar { name, value: Some(value), secret: None });
    }
    vars.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(vars)
}

/// Replicas: `properties.replicas`, else (Simple Profile) the `scalable` capability's
/// `default_instances` (or `min_instances`); 1 to [`MAX_REPLICAS`].
fn replicas(node: &str, t: &NodeTemplate) -> Result<Option<i32>, ToscaError> {
    if let Some(v) = t.properties.get("replicas").filter(|v| !v.is_null()) {
        return units::int_in(v, &format!("node_templates.{node}.properties.replicas"), 1, MAX_REPLICAS).map(Some);
    }
    let Some(props) = t.capabilities.get("scalable").and_then(|s| s.get("properties")) else { return Ok(None) };
    for key in ["default_instances", "min_instances"] {
        if let Some(v) = props.get(key) {
            return units::int_in(v, &format!("node_templates.{node}.capabilities.scalable.properties.{key}"), 1, MAX_REPLICAS).map(Some);
        }
    }
    Ok(None)
}

/// TLS: `tls: true` (Secret `<component>-tls`), `tls: SECRET`, `tls: {secret: S, port: N}`,
/// `tls_secret: S`, `tls_port: N`; `tls: false` turns it off.
pub fn tls(node: &str, component: &str, t: &NodeTemplate) -> Result<Option<Tls>, ToscaError> {
    let path = format!("node_templates.{node}.properties");
    let mut out = Tls { path: path.clone(), ..Tls::default() };
    let mut wanted = false;
    match t.properties.get("tls") {
        None | Some(Value::Null) => {}
        Some(Value::Bool(false)) => return Ok(None),
        Some(Value::Bool(true)) => wanted = true,
        Some(Value::String(s)) => {
            out.secret = Some(s.clone());
            wanted = true;
        }
        Some(Value::Mapping(m)) => {
            out.secret = string_prop(m, "secret", &format!("{path}.tls"))?;
            if let Some(p) = m.get("port") {
                out.port = Some(units::int_in(p, &format!("{path}.tls.port"), 1, 65535)?);
            }
            wanted = true;
        }
        Some(_) => return Err(ToscaError::invalid(format!("{path}.tls"), "expected true, false, a Secret name or {secret, port}")),
    }
    if let Some(s) = string_prop(&t.properties, "tls_secret", &path)? {
        out.secret = Some(s);
        wanted = true;
    }
    if let Some(p) = t.properties.get("tls_port").filter(|v| !v.is_null()) {
        out.port = Some(units::int_in(p, &format!("{path}.tls_port"), 1, 65535)?);
        wanted = true;
    }
    if !wanted {
        return Ok(None);
    }
    out.secret.get_or_insert_with(|| format!("{component}-tls"));
    Ok(Some(out))
}

/// True for a Kubernetes label value.
fn is_label_value(s: &str) -> bool {
    s.len() <= 63
        && s.bytes().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && s.bytes().next().is_none_or(|c| c.is_ascii_alphanumeric())
        && s.bytes().last().is_none_or(|c| c.is_ascii_alphanumeric())
}

/// The component of node `node`, without requests from hosts and without exposure.
/// Its name is the CHARITY `name` property when given, else the node's name. Target: the
/// `cluster` or `placement` property; else the caller's cluster; else a `placement_hint`
/// becomes a placement on clusters labelled [`PLACEMENT_HINT_LABEL`]. A hint that loses to
/// a cluster is reported in `notes`.
pub fn component(node: &str, t: &NodeTemplate, image: String, default_cluster: Option<&str>, notes: &mut Vec<String>) -> Result<Component, ToscaError> {
    let path = format!("node_templates.{node}.properties");
    let name = string_prop(&t.properties, "name", &path)?.unwrap_or_else(|| node.to_owned());
    let mut c = Component { name, image, ..Component::default() };
    c.replicas = replicas(node, t)?;
    c.cpu = string_prop(&t.properties, "cpu", &path)?;
    let memory = ["memory", "mem_size"].into_iter().find_map(|k| Some((k, t.properties.get(k).filter(|v| !v.is_null())?)));
    c.memory = match memory {
        // A TOSCA size (`4 GB`: units end in B) or already a Kubernetes quantity (`256Mi`).
        Some((k, v @ Value::String(s))) if s.trim().ends_with(['B', 'b']) => Some(units::size(v, &format!("{path}.{k}"))?.0),
        Some((k, v)) => Some(text(v).ok_or_else(|| ToscaError::invalid(format!("{path}.{k}"), "expected a quantity (256Mi) or a size (4 GB)"))?),
        None => None,
    };
    if let Some(v) = t.properties.get("num_cpus").filter(|v| !v.is_null()) {
        c.cpu = Some(units::cpus(v, &format!("{path}.num_cpus"))?.0);
    }
    c.image_pull_secret = string_prop(&t.properties, "image_pull_secret", &path)?;
    c.ports = ports(node, t)?;
    c.env = environment(node, t)?;
    c.cluster = string_prop(&t.properties, "cluster", &path)?;
    if let Some(pl) = t.properties.get("placement").filter(|v| !v.is_null()) {
        let spec: PlacementSpec = serde_yaml_ng::from_value(pl.clone()).map_err(|e| ToscaError::invalid(format!("{path}.placement"), e.to_string()))?;
        c.placement = Some(spec);
    }
    let hint = string_prop(&t.properties, "placement_hint", &path)?;
    if let Some(h) = &hint
        && !is_label_value(h)
    {
        return Err(ToscaError::invalid(format!("{path}.placement_hint"), format!("{h:?} is not a label value (at most 63 letters, digits, '-', '_', '.')")));
    }
    if c.cluster.is_none() && c.placement.is_none() {
        match (default_cluster, hint) {
            (Some(cl), Some(h)) => {
                c.cluster = Some(cl.to_owned());
                notes.push(format!("{path}.placement_hint: {h:?} not applied: component {:?} goes to cluster {cl:?} as asked", c.name));
            }
            (Some(cl), None) => c.cluster = Some(cl.to_owned()),
            (None, Some(h)) => {
                c.placement = Some(PlacementSpec { labels: [(PLACEMENT_HINT_LABEL.to_owned(), h)].into(), ..PlacementSpec::default() });
            }
            (None, None) => {}
        }
    } else if let Some(h) = hint {
        notes.push(format!("{path}.placement_hint: {h:?} not applied: the component names its cluster or placement"));
    }
    Ok(c)
}

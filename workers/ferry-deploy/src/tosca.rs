//! Converts a TOSCA application blueprint into a `DeployApp` command, as the prior
//! orchestrator's converter did: every node template with an `image` property is a
//! component; external nodes (type ending in `External`, or `external: true`) are skipped;
//! a requirement on a virtual link (type containing `VirtualLink`) exposes the component:
//! a link with `public: true` through an Ingress (its `hostname`, optional `tls_secret`),
//! any other link through a Service only.
//!
//! Component properties: `image`, `replicas`, `cpu`, `memory`, `ports` (numbers),
//! `environment` (map), `image_pull_secret`, `cluster`, `placement` (the `PlacementSpec`
//! fields). Blueprint metadata `template_name` (or `name`) and `owner` name the app unless
//! given on the command line.

use std::collections::BTreeMap;

use serde_yaml_ng::Value;

use crate::spec::{Component, DeployApp, EnvVar, IngressSpec, PlacementSpec, Port};

/// Why a blueprint cannot be converted.
#[derive(Debug, thiserror::Error)]
pub enum ToscaError {
    /// Not YAML.
    #[error("the blueprint is not YAML: {0}")]
    Yaml(#[from] serde_yaml_ng::Error),
    /// A required part is missing or malformed.
    #[error("{0}")]
    Invalid(String),
}

fn invalid(msg: impl Into<String>) -> ToscaError {
    ToscaError::Invalid(msg.into())
}

/// What the conversion made.
#[derive(Debug, Clone)]
pub struct Converted {
    /// The command.
    pub app: DeployApp,
    /// External nodes left out.
    pub skipped: Vec<String>,
}

/// Overrides from the command line.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// App name.
    pub name: Option<String>,
    /// Owner.
    pub owner: Option<String>,
    /// Target cluster of components that name none and have no placement.
    pub cluster: Option<String>,
}

#[derive(Debug, PartialEq)]
enum NodeRole {
    Component,
    External,
    Link { public: bool, hostname: Option<String>, tls_secret: Option<String> },
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn role(name: &str, node: &Value) -> Result<NodeRole, ToscaError> {
    let ty = node.get("type").and_then(Value::as_str).ok_or_else(|| invalid(format!("node template {name:?} has no type")))?;
    let props = node.get("properties");
    let prop = |k: &str| props.and_then(|p| p.get(k));
    if ty.ends_with("External") || prop("external").and_then(Value::as_bool) == Some(true) {
        return Ok(NodeRole::External);
    }
    if ty.contains("VirtualLink") {
        return Ok(NodeRole::Link {
            public: prop("public").and_then(Value::as_bool).unwrap_or(false),
            hostname: prop("hostname").and_then(text),
            tls_secret: prop("tls_secret").and_then(text),
        });
    }
    if prop("image").is_none() {
        return Err(invalid(format!("node template {name:?} ({ty}) has no image property and is neither external nor a virtual link")));
    }
    Ok(NodeRole::Component)
}

/// The targets of a node's requirements (`- name: target` or `- name: {node: target}`).
fn requirements(node: &Value) -> Vec<String> {
    let Some(reqs) = node.get("requirements").and_then(Value::as_sequence) else { return Vec::new() };
    reqs.iter()
        .filter_map(Value::as_mapping)
        .flat_map(|m| m.values())
        .filter_map(|v| match v {
            Value::String(s) => Some(s.clone()),
            Value::Mapping(_) => v.get("node").and_then(Value::as_str).map(str::to_owned),
            _ => None,
        })
        .collect()
}

fn component(name: &str, node: &Value, roles: &BTreeMap<String, NodeRole>, o: &Overrides) -> Result<Component, ToscaError> {
    let p = node.get("properties").cloned().unwrap_or(Value::Null);
    let get = |k: &str| p.get(k);
    let mut c = Component { name: name.to_owned(), image: get("image").and_then(text).unwrap_or_default(), ..Component::default() };
    c.replicas = get("replicas").and_then(Value::as_i64).map(|r| r as i32);
    c.cpu = get("cpu").and_then(text);
    c.memory = get("memory").and_then(text);
    c.image_pull_secret = get("image_pull_secret").and_then(text);
    if let Some(ports) = get("ports").and_then(Value::as_sequence) {
        for port in ports {
            let n = port.as_i64().or_else(|| port.get("port").and_then(Value::as_i64)).ok_or_else(|| invalid(format!("component {name:?}: a port is not a number")))?;
            c.ports.push(Port { port: n as i32, ..Port::default() });
        }
    }
    if let Some(env) = get("environment").and_then(Value::as_mapping) {
        let mut vars: Vec<EnvVar> = env
            .iter()
            .filter_map(|(k, v)| Some(EnvVar { name: text(k)?, value: text(v), secret: None }))
            .collect();
        vars.sort_by(|a, b| a.name.cmp(&b.name));
        c.env = vars;
    }
    c.cluster = get("cluster").and_then(text);
    if let Some(pl) = get("placement") {
        let spec: PlacementSpec = serde_yaml_ng::from_value(pl.clone()).map_err(|e| invalid(format!("component {name:?}: placement: {e}")))?;
        c.placement = Some(spec);
    }
    if c.cluster.is_none() && c.placement.is_none() {
        c.cluster = o.cluster.clone();
    }
    for target in requirements(node) {
        match roles.get(&target) {
            Some(NodeRole::Link { public: true, hostname, tls_secret }) => {
                let host = hostname.clone().ok_or_else(|| invalid(format!("component {name:?}: public link {target:?} has no hostname property")))?;
                if c.ports.is_empty() {
                    return Err(invalid(format!("component {name:?} is linked to public link {target:?} but has no ports")));
                }
                c.ingress = Some(IngressSpec { host, tls_secret: tls_secret.clone(), ..IngressSpec::default() });
            }
            // An internal link: the component's ports get a Service (always rendered).
            Some(NodeRole::Link { .. }) | Some(NodeRole::Component) | Some(NodeRole::External) => {}
            None => return Err(invalid(format!("component {name:?} requires {target:?}, which is not a node template of the blueprint"))),
        }
    }
    Ok(c)
}

/// Converts a blueprint.
pub fn convert(yaml: &str, o: &Overrides) -> Result<Converted, ToscaError> {
    let doc: Value = serde_yaml_ng::from_str(yaml)?;
    let nodes = doc
        .get("topology_template")
        .and_then(|t| t.get("node_templates"))
        .and_then(Value::as_mapping)
        .ok_or_else(|| invalid("the blueprint has no topology_template.node_templates"))?;
    let mut roles = BTreeMap::new();
    for (k, v) in nodes {
        let name = text(k).ok_or_else(|| invalid("a node template name is not a string"))?;
        roles.insert(name.clone(), role(&name, v)?);
    }
    let meta = doc.get("metadata");
    let name = o
        .name
        .clone()
        .or_else(|| meta.and_then(|m| m.get("template_name").or(m.get("name"))).and_then(text))
        .ok_or_else(|| invalid("the app has no name: set metadata.template_name in the blueprint or pass --name"))?;
    let owner = o.owner.clone().or_else(|| meta.and_then(|m| m.get("owner")).and_then(text)).unwrap_or_default();
    let mut components = Vec::new();
    let mut skipped = Vec::new();
    // Blueprint order, as the author wrote it.
    for (k, v) in nodes {
        let n = text(k).unwrap_or_default();
        match roles[&n] {
            NodeRole::Component => components.push(component(&n, v, &roles, o)?),
            NodeRole::External => skipped.push(n),
            NodeRole::Link { .. } => {}
        }
    }
    Ok(Converted { app: DeployApp { name, owner, components, ..DeployApp::default() }, skipped })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHOP: &str = r#"
tosca_definitions_version: tosca_simple_yaml_1_3
metadata: {template_name: shop, owner: team-a}
topology_template:
  node_templates:
    frontend:
      type: tosca.nodes.Container.Application
      properties: {image: "nginx:1.27", replicas: 2, ports: [80], environment: {API_URL: "http://api:8080"}}
      requirements:
        - backend: api
        - exposure: public_net
    api:
      type: tosca.nodes.Container.Application
      properties: {image: "ghcr.io/acme/api:2.1", ports: [8080], cpu: 250m, memory: 256Mi}
      requirements:
        - exposure: {node: internal_net}
        - payments: payments
    payments:
      type: acme.nodes.External
      properties: {url: "https://pay.example.com"}
    public_net:
      type: tosca.nodes.network.VirtualLink
      properties: {public: true, hostname: shop.example.com}
    internal_net:
      type: tosca.nodes.network.VirtualLink
"#;

    #[test]
    fn components_links_and_externals_convert() {
        let c = convert(SHOP, &Overrides { cluster: Some("member-1".into()), ..Overrides::default() }).unwrap();
        assert_eq!(c.skipped, ["payments"]);
        let a = c.app;
        assert_eq!((a.name.as_str(), a.owner.as_str()), ("shop", "team-a"));
        let names: Vec<&str> = a.components.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["frontend", "api"]);
        let fe = &a.components[0];
        assert_eq!(fe.ingress.as_ref().unwrap().host, "shop.example.com");
        assert_eq!(fe.replicas, Some(2));
        assert_eq!(fe.env[0].value.as_deref(), Some("http://api:8080"));
        assert_eq!(fe.cluster.as_deref(), Some("member-1"));
        let api = &a.components[1];
        assert!(api.ingress.is_none(), "an internal link exposes through a Service only");
        assert_eq!(api.ports[0].port, 8080);
        crate::validate::validate("shop/shop", &a).unwrap();
    }

    #[test]
    fn broken_blueprints_say_what_is_wrong() {
        let no_image = SHOP.replace("properties: {image: \"nginx:1.27\", replicas: 2, ports: [80], environment: {API_URL: \"http://api:8080\"}}", "properties: {replicas: 2}");
        let e = convert(&no_image, &Overrides::default()).unwrap_err().to_string();
        assert!(e.contains("\"frontend\"") && e.contains("no image property"), "{e}");
        let dangling = SHOP.replace("- backend: api", "- backend: nowhere");
        let e = convert(&dangling, &Overrides::default()).unwrap_err().to_string();
        assert!(e.contains("requires \"nowhere\""), "{e}");
        let e = convert("topology_template: {}", &Overrides::default()).unwrap_err().to_string();
        assert!(e.contains("node_templates"), "{e}");
    }
}

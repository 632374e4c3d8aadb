//! Converts a TOSCA blueprint into a `DeployApp` command. Three shapes of node templates
//! are read, and may be mixed in one blueprint:
//!
//! - **Ferry's own** (the README's `examples/blog.tosca.yaml`): a node with an `image`
//!   property is a component (`replicas`, `cpu`, `memory`, `ports`, `environment`,
//!   `image_pull_secret`, `cluster`, `placement`); a type ending in `External`, or
//!   `external: true`, is left out.
//! - **TOSCA Simple Profile 1.3 containers** (`tosca.nodes.Container.Application` and its
//!   derived types): the image is an artifact (`tosca.artifacts.Deployment.Image...`, or
//!   the only one: `file`, with its repository's host unless `docker_hub`); ports from
//!   endpoint capabilities (`port`, or `ports: {name: {target: N}}`); replicas from the
//!   `scalable` capability's `default_instances`; requests from the `host` requirement's
//!   `node_filter` or from the `tosca.nodes.Container.Runtime` (or `tosca.nodes.Compute`)
//!   it names (`capabilities.host.properties.num_cpus`/`mem_size`).
//! - **CHARITY** (the orchestrator Ferry replaces): `Charity.Component` with
//!   `deployment_unit: K8S_POD` (the default when absent) is a component, `EXTERNAL` is left
//!   out; `ports` as `containerPort` lists (or a list per container, flattened: one
//!   container per component); `environment` values may be `{ get_input: NAME }`;
//!   `placement_hint` (see [`component::component`]); `tls`, `tls_secret`, `tls_port` → the
//!   Ingress's TLS (see [`component::tls`]; a link's `tls_secret` wins); `Charity.Node` hosts' `node_filter` (`num_cpus`, `mem_size` in TOSCA
//!   size units) → requests ([`filter`]).
//!
//! Exposure, over the topology: a virtual link (a type containing `VirtualLink`) marked
//! `public: true`, or shared with an external node (one of its requirements names the
//! link), exposes every component on it that has ports through an Ingress; any other link
//! leaves a Service only; a component without ports gets neither. The Ingress's host: the
//! component's `hostname`, else the link's `hostname` (`<component>.<hostname>` when the
//! link exposes several components), else `<component>.<app>.<ingress_domain>` when the
//! caller gives a domain; else the conversion is refused naming the link. A component on
//! several exposing links gets the first one's Ingress (a note says so). Where a link is
//! exposing only because it is shared with an external node, a component on it without
//! ports is not an error (it is the one calling out), only a note; on a public link it is.
//!
//! `{ get_input: NAME }` anywhere in a node template takes the input's value: the caller's
//! (`--input NAME=VALUE`), else its `default`; an input that is not declared, or has no
//! value, is refused naming it and where it was used. Every number is range-checked and
//! refused with its path (`node_templates.web.properties.replicas: 4294967297 is out of
//! range 1 to 1000`), never truncated.
//!
//! The app's name: the caller's, else `metadata.template_name` (or `name`); owner: the
//! caller's, else `metadata.owner` (or `template_author`).

pub mod blueprint;
pub mod component;
pub mod filter;
pub mod units;

use std::collections::{BTreeMap, BTreeSet};

use crate::spec::{Component, DeployApp, IngressSpec};
use blueprint::{Blueprint, Inputs, NodeTemplate, Requirement, bool_prop, string_prop, text};
use filter::Requests;

/// Why a blueprint cannot be converted; each names the property's path
/// (`node_templates.<node>.properties.<name>`...).
#[derive(Debug, thiserror::Error)]
pub enum ToscaError {
    /// Not YAML, or not a service template.
    #[error("the blueprint is not a TOSCA service template: {0}")]
    Yaml(#[source] serde_yaml_ng::Error),
    /// A required part is missing.
    #[error("{path}: missing: {what}")]
    Missing {
        /// Where it should be.
        path: String,
        /// What is missing.
        what: String,
    },
    /// A value is malformed.
    #[error("{path}: {reason}")]
    Invalid {
        /// The property's path.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// A number outside what the property allows (never truncated).
    #[error("{path}: {value} is out of range {min} to {max}")]
    OutOfRange {
        /// The property's path.
        path: String,
        /// The number as written.
        value: String,
        /// Least allowed.
        min: i128,
        /// Most allowed.
        max: i128,
    },
    /// `get_input` of an input the blueprint does not declare.
    #[error("{path}: get_input {input:?}: the blueprint declares no such input (topology_template.inputs)")]
    UnknownInput {
        /// Where it is used.
        path: String,
        /// The input.
        input: String,
    },
    /// `get_input` of an input with no default and no value given.
    #[error("{path}: input {input:?} has no default and no value was given (--input {input}=VALUE)")]
    InputWithoutValue {
        /// Where it is used.
        path: String,
        /// The input.
        input: String,
    },
    /// A node that is not a component, an external node, a host or a link.
    #[error("node_templates.{node}: {ty} has no image (properties.image, or an image artifact) and is neither external, a host nor a virtual link")]
    NoImage {
        /// The node.
        node: String,
        /// Its type.
        ty: String,
    },
    /// A requirement naming no node of the blueprint.
    #[error("{path}: requires {target:?}, which is not a node template of the blueprint")]
    Dangling {
        /// The requirement's path.
        path: String,
        /// What it names.
        target: String,
    },
}

impl ToscaError {
    /// A malformed value at `path`.
    pub fn invalid(path: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Invalid { path: path.into(), reason: reason.into() }
    }

    /// The path of the property the error is about (none for YAML errors).
    pub fn path(&self) -> Option<&str> {
        match self {
            Self::Yaml(_) => None,
            Self::NoImage { .. } => None,
            Self::Missing { path, .. } | Self::Invalid { path, .. } | Self::OutOfRange { path, .. } | Self::UnknownInput { path, .. } | Self::InputWithoutValue { path, .. } | Self::Dangling { path, .. } => Some(path),
        }
    }
}

/// What the conversion made.
#[derive(Debug, Clone)]
pub struct Converted {
    /// The command.
    pub app: DeployApp,
    /// External nodes left out (CHARITY `EXTERNAL` components, `*External` types), in
    /// blueprint order. `DeployApp` has no field for them (its schema is versioned): the
    /// CLI prints them.
    pub skipped: Vec<String>,
    /// What was read but not applied (a placement hint beaten by a cluster, TLS on a
    /// component with no Ingress, node-filter properties with no Kubernetes request...),
    /// each with its path.
    pub notes: Vec<String>,
}

/// Overrides from the command line.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// App name.
    pub name: Option<String>,
    /// Owner.
    pub owner: Option<String>,
    /// Target cluster of components that name none and have no placement (it wins over a
    /// `placement_hint`: the operator asked).
    pub cluster: Option<String>,
    /// Values of the blueprint's inputs (`NAME` → a YAML scalar), over their defaults.
    pub inputs: BTreeMap<String, String>,
    /// Domain of Ingress hosts no blueprint names: `<component>.<app>.<domain>`.
    pub ingress_domain: Option<String>,
}

/// A virtual link's properties.
#[derive(Debug, Clone, PartialEq)]
struct Link {
    public: bool,
    hostname: Option<String>,
    tls_secret: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
enum Role {
    Component { image: String },
    External,
    Host,
    Link(Link),
}

fn role(node: &str, t: &NodeTemplate, repositories: &serde_yaml_ng::Mapping) -> Result<Role, ToscaError> {
    let ty = t.type_.as_str();
    let path = format!("node_templates.{node}.properties");
    if ty.starts_with("Charity.Component") {
        match string_prop(&t.properties, "deployment_unit", &path)?.map(|u| u.to_ascii_uppercase()).as_deref() {
            None | Some("K8S_POD") => {}
            Some("EXTERNAL") => return Ok(Role::External),
            Some(other) => return Err(ToscaError::invalid(format!("{path}.deployment_unit"), format!("{other:?}; expected K8S_POD or EXTERNAL"))),
        }
    }
    if ty.ends_with("External") || bool_prop(&t.properties, "external", &path)? == Some(true) {
        return Ok(Role::External);
    }
    if ty.contains("VirtualLink") {
        return Ok(Role::Link(Link {
            public: bool_prop(&t.properties, "public", &path)?.unwrap_or(false),
            hostname: string_prop(&t.properties, "hostname", &path)?,
            tls_secret: string_prop(&t.properties, "tls_secret", &path)?,
        }));
    }
    if ty.starts_with("Charity.Node") || ty.contains("Container.Runtime") || ty == "tosca.nodes.Compute" {
        return Ok(Role::Host);
    }
    match component::image(node, t, repositories)? {
        Some(image) if !image.trim().is_empty() => Ok(Role::Component { image }),
        _ => Err(ToscaError::NoImage { node: node.to_owned(), ty: ty.to_owned() }),
    }
}

/// The Ingress of component `c` (node `node`) on exposing link `link`.
fn ingress(node: &str, c: &Component, t: &NodeTemplate, app: &str, link: (&str, &Link), shared: usize, o: &Overrides) -> Result<IngressSpec, ToscaError> {
    let (link_name, l) = link;
    let own = string_prop(&t.properties, "hostname", &format!("node_templates.{node}.properties"))?;
    let host = match (own, &l.hostname, &o.ingress_domain) {
        (Some(h), _, _) => h,
        (None, Some(h), _) if shared > 1 => format!("{}.{h}", c.name),
        (None, Some(h), _) => h.clone(),
        (None, None, Some(d)) => format!("{}.{app}.{d}", c.name),
        (None, None, None) => {
            return Err(ToscaError::Missing {
                path: format!("node_templates.{link_name}.properties.hostname"),
                what: format!("the host of the Ingress that exposes component {:?} (or a hostname property on it, or --ingress-domain)", c.name),
            });
        }
    };
    let mut spec = IngressSpec { host, tls_secret: l.tls_secret.clone(), ..IngressSpec::default() };
    if let Some(tls) = component::tls(node, &c.name, t)? {
        if let Some(p) = tls.port {
            if !c.ports.iter().any(|x| x.port == p) {
                return Err(ToscaError::invalid(format!("{}.tls_port", tls.path), format!("{p} is not one of the component's ports")));
            }
            spec.port = Some(p);
        }
        spec.tls_secret = spec.tls_secret.or(tls.secret);
    }
    Ok(spec)
}

/// Converts a blueprint.
pub fn convert(yaml: &str, o: &Overrides) -> Result<Converted, ToscaError> {
    let bp: Blueprint = serde_yaml_ng::from_str(yaml).map_err(ToscaError::Yaml)?;
    let missing = || ToscaError::Missing { path: "topology_template.node_templates".into(), what: "the node templates (the application's components)".into() };
    let topo = bp.topology_template.as_ref().ok_or_else(missing)?;
    let templates = topo.node_templates.as_ref().ok_or_else(missing)?;
    let inputs = Inputs::new(&topo.inputs, &o.inputs)?;

    // Node templates in blueprint order, inputs resolved.
    let mut nodes: Vec<(String, NodeTemplate)> = Vec::new();
    for (k, v) in templates {
        let name = k.as_str().ok_or_else(|| ToscaError::invalid("topology_template.node_templates", format!("a node template's name is not a string: {k:?}")))?;
        let path = format!("node_templates.{name}");
        let t: NodeTemplate = serde_yaml_ng::from_value(inputs.resolve(v, &path)?).map_err(|e| ToscaError::invalid(&path, e.to_string()))?;
        nodes.push((name.to_owned(), t));
    }
    let mut roles: BTreeMap<String, Role> = BTreeMap::new();
    let mut reqs: BTreeMap<String, Vec<Requirement>> = BTreeMap::new();
    for (n, t) in &nodes {
        roles.insert(n.clone(), role(n, t, &bp.repositories)?);
        reqs.insert(n.clone(), t.requirements(n)?);
    }
    // Every requirement names a node; links know who is on them.
    let mut on_link: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (n, rs) in &reqs {
        for r in rs {
            let Some(target) = &r.node else { continue };
            match roles.get(target) {
                None => return Err(ToscaError::Dangling { path: r.path.clone(), target: target.clone() }),
                Some(Role::Link(_)) => {
                    on_link.entry(target.as_str()).or_default().insert(n.as_str());
                }
                Some(_) => {}
            }
        }
    }
    let exposing = |link: &str, l: &Link| l.public || on_link.get(link).is_some_and(|m| m.iter().any(|n| roles[*n] == Role::External));

    let meta = |k: &str| bp.metadata.get(k).and_then(text);
    let name = o.name.clone().or_else(|| meta("template_name")).or_else(|| meta("name")).ok_or_else(|| ToscaError::Missing {
        path: "metadata.template_name".into(),
        what: "the app's name (or give --name)".into(),
    })?;
    let owner = o.owner.clone().or_else(|| meta("owner")).or_else(|| meta("template_author")).unwrap_or_default();

    let mut hosts: BTreeMap<&str, Requests> = BTreeMap::new();
    for (n, t) in &nodes {
        if roles[n] == Role::Host {
            hosts.insert(n, filter::host(n, t.node_filter.as_ref(), &t.capabilities)?);
        }
    }

    let mut notes = Vec::new();
    let mut skipped = Vec::new();
    let mut made: Vec<(&str, &NodeTemplate, Component)> = Vec::new();
    for (n, t) in &nodes {
        match &roles[n] {
            Role::External => skipped.push(n.clone()),
            Role::Component { image } => {
                let mut c = component::component(n, t, image.clone(), o.cluster.as_deref(), &mut notes)?;
                let mut r = Requests::default();
                for req in &reqs[n] {
                    if let Some(f) = &req.node_filter {
                        r = r.or(filter::node_filter(f, &format!("{}.node_filter", req.path))?);
                    }
                    if let Some(h) = req.node.as_deref().and_then(|t| hosts.get(t)) {
                        r = r.or(h.clone());
                    }
                }
                notes.extend(r.ignored.iter().map(|p| format!("{p}: no Kubernetes request for this property; ignored")));
                c.cpu = c.cpu.or(r.cpu);
                c.memory = c.memory.or(r.memory);
                made.push((n, t, c));
            }
            Role::Host | Role::Link(_) => {}
        }
    }

    // Exposure: an Ingress per component on an exposing link.
    let with_ports: BTreeSet<&str> = made.iter().filter(|(_, _, c)| !c.ports.is_empty()).map(|(n, _, _)| *n).collect();
    let mut components = Vec::new();
    for (n, t, mut c) in made {
        let links: Vec<(&str, &Link, &Requirement)> = reqs[n]
            .iter()
            .filter_map(|r| match roles.get(r.node.as_deref()?) {
                Some(Role::Link(l)) if exposing(r.node.as_deref()?, l) => Some((r.node.as_deref()?, l, r)),
                _ => None,
            })
            .collect();
        match links.first() {
            Some((link, l, req)) if c.ports.is_empty() => {
                if l.public {
                    return Err(ToscaError::invalid(&req.path, format!("component {:?} is on public link {link:?} but has no ports to expose", c.name)));
                }
                notes.push(format!("{}: component {:?} has no ports: nothing to expose through link {link:?}", req.path, c.name));
            }
            Some((link, l, _)) => {
                let shared = on_link.get(link).map_or(0, |m| m.iter().filter(|x| with_ports.contains(*x)).count());
                c.ingress = Some(ingress(n, &c, t, &name, (link, l), shared, o)?);
                for (other, _, r) in links.iter().skip(1) {
                    notes.push(format!("{}: component {:?} is exposed through link {link:?} already; one Ingress per component, link {other:?} adds none", r.path, c.name));
                }
            }
            None => {
                if let Some(tls) = component::tls(n, &c.name, t)? {
                    notes.push(format!("{}: TLS ignored: component {:?} is on no public link and shares none with an external node, so it has no Ingress", tls.path, c.name));
                }
            }
        }
        components.push(c);
    }
    Ok(Converted { app: DeployApp { name, owner, components, external: skipped.clone(), ..DeployApp::default() }, skipped, notes })
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
        assert!(e.starts_with("node_templates.frontend: ") && e.contains("has no image"), "{e}");
        let dangling = SHOP.replace("- backend: api", "- backend: nowhere");
        let e = convert(&dangling, &Overrides::default()).unwrap_err().to_string();
        assert!(e.contains("node_templates.frontend.requirements[0].backend: requires \"nowhere\""), "{e}");
        let e = convert("topology_template: {}", &Overrides::default()).unwrap_err().to_string();
        assert!(e.contains("node_templates"), "{e}");
        let big = SHOP.replace("replicas: 2", "replicas: 4294967297");
        let e = convert(&big, &Overrides::default()).unwrap_err().to_string();
        assert_eq!(e, "node_templates.frontend.properties.replicas: 4294967297 is out of range 1 to 1000");
        let port = SHOP.replace("ports: [8080]", "ports: [8080, 70000]");
        let e = convert(&port, &Overrides::default()).unwrap_err().to_string();
        assert_eq!(e, "node_templates.api.properties.ports[1]: 70000 is out of range 1 to 65535");
    }

    #[test]
    fn component_sizes_take_tosca_units_or_quantities() {
        let sized = SHOP.replace("memory: 256Mi", "memory: 1.5 GiB");
        assert_eq!(convert(&sized, &Overrides::default()).unwrap().app.components[1].memory.as_deref(), Some("1.5Gi"));
        let sized = SHOP.replace("cpu: 250m, memory: 256Mi", "num_cpus: 2, mem_size: 512 mb");
        let api = &convert(&sized, &Overrides::default()).unwrap().app.components[1];
        assert_eq!((api.cpu.as_deref(), api.memory.as_deref()), (Some("2"), Some("512M")));
        let bad = SHOP.replace("memory: 256Mi", "mem_size: 2 XB");
        let e = convert(&bad, &Overrides::default()).unwrap_err().to_string();
        assert!(e.starts_with("node_templates.api.properties.mem_size: \"2 XB\": unknown or missing unit"), "{e}");
        let bad = SHOP.replace("cpu: 250m,", "num_cpus: 4294967297,");
        let e = convert(&bad, &Overrides::default()).unwrap_err().to_string();
        assert_eq!(e, "node_templates.api.properties.num_cpus: 4294967297 is out of range 1 to 2147483647");
    }

    const CHARITY: &str = r#"
tosca_definitions_version: tosca_simple_yaml_1_3
metadata: {template_name: charity-app, owner: team-c}
topology_template:
  inputs:
    kafka_host: {type: string, default: "kafka.example.com:9092"}
    level: {type: string}
  node_templates:
    charity-kafka:
      type: Charity.Component
      properties: {name: charity-kafka, deployment_unit: EXTERNAL}
      requirements: [{virtual_link: edge-link}]
    ingest:
      type: Charity.Component
      properties:
        name: ingest
        image: ghcr.io/acme/ingest:1.0
        deployment_unit: K8S_POD
        environment: {KAFKA: {get_input: kafka_host}, MODE: edge}
        ports: [{containerPort: 8080}, {containerPort: 9090, protocol: udp}]
        tls_port: 8080
        placement_hint: edge
      requirements: [{host: edge-node}, {virtual_link: edge-link}, {virtual_link: inner-link}]
    store:
      type: Charity.Component
      properties:
        image: redis:7
        ports: [[{containerPort: 6379}], [{containerPort: 9121}]]
      requirements: [{host: edge-node}, {virtual_link: inner-link}]
    batch:
      type: Charity.Component
      properties: {image: busybox:1.36, deployment_unit: K8S_POD}
      requirements: [{virtual_link: inner-link}]
    edge-node:
      type: Charity.Node
      node_filter:
        properties:
          - num_cpus: {in_range: [2, 4]}
          - mem_size: {greater_or_equal: 4 GB}
    edge-link:
      type: Charity.VirtualLink
      properties: {hostname: ingest.example.com}
    inner-link:
      type: Charity.VirtualLink
"#;

    #[test]
    fn charity_blueprints_convert_as_the_thesis_describes() {
        let c = convert(CHARITY, &Overrides::default()).unwrap();
        assert_eq!(c.skipped, ["charity-kafka"]);
        let a = &c.app;
        let ingest = &a.components[0];
        assert_eq!(ingest.env.iter().map(|e| (e.name.as_str(), e.value.as_deref().unwrap())).collect::<Vec<_>>(), [("KAFKA", "kafka.example.com:9092"), ("MODE", "edge")]);
        assert_eq!(ingest.ports.iter().map(|p| (p.port, p.protocol.clone())).collect::<Vec<_>>(), [(8080, None), (9090, Some("UDP".into()))]);
        assert_eq!((ingest.cpu.as_deref(), ingest.memory.as_deref()), (Some("2"), Some("4G")));
        let ing = ingest.ingress.as_ref().expect("a link shared with an external component → Ingress");
        assert_eq!((ing.host.as_str(), ing.port, ing.tls_secret.as_deref()), ("ingest.example.com", Some(8080), Some("ingest-tls")));
        assert_eq!(ingest.placement.as_ref().unwrap().labels[component::PLACEMENT_HINT_LABEL], "edge");
        let store = &a.components[1];
        assert_eq!(store.ports.iter().map(|p| p.port).collect::<Vec<_>>(), [6379, 9121]);
        assert!(store.ingress.is_none(), "a link shared only between components → Service only");
        let batch = &a.components[2];
        assert!(batch.ports.is_empty() && batch.ingress.is_none());
        assert_eq!((batch.cpu.as_deref(), batch.memory.as_deref()), (None, None), "no host, no requests");
        // With a cluster, the hint is noted, not applied.
        let c = convert(CHARITY, &Overrides { cluster: Some("member-1".into()), ..Overrides::default() }).unwrap();
        assert!(c.app.components.iter().all(|x| x.cluster.as_deref() == Some("member-1") && x.placement.is_none()));
        assert!(c.notes.iter().any(|n| n.contains("placement_hint: \"edge\" not applied")), "{:?}", c.notes);
        crate::validate::validate(&c.app.subject(), &c.app).unwrap();
    }

    #[test]
    fn inputs_resolve_or_are_refused_by_name() {
        let o = Overrides { inputs: [("kafka_host".to_owned(), "other:9092".to_owned())].into(), ..Overrides::default() };
        let c = convert(CHARITY, &o).unwrap();
        assert_eq!(c.app.components[0].env[0].value.as_deref(), Some("other:9092"));
        let e = convert(&CHARITY.replace("{get_input: kafka_host}", "{get_input: level}"), &Overrides::default()).unwrap_err().to_string();
        assert_eq!(e, "node_templates.ingest.properties.environment.KAFKA: input \"level\" has no default and no value was given (--input level=VALUE)");
        let e = convert(&CHARITY.replace("{get_input: kafka_host}", "{get_input: nope}"), &Overrides::default()).unwrap_err().to_string();
        assert!(e.starts_with("node_templates.ingest.properties.environment.KAFKA: get_input \"nope\""), "{e}");
    }

    #[test]
    fn simple_profile_containers_convert() {
        let bp = r#"
tosca_definitions_version: tosca_simple_yaml_1_3
metadata: {template_name: wp}
repositories:
  acme: {url: "https://registry.acme.io/"}
topology_template:
  node_templates:
    wordpress:
      type: tosca.nodes.Container.Application.Docker
      artifacts:
        image: {file: "wordpress:6", type: tosca.artifacts.Deployment.Image.Container.Docker, repository: docker_hub}
      capabilities:
        web: {properties: {port: 80}}
        scalable: {properties: {default_instances: 3}}
      requirements:
        - host: runtime
        - database: db
    db:
      type: tosca.nodes.Container.Application
      artifacts:
        img: {file: "mysql:8", type: tosca.artifacts.Deployment.Image.Container.Docker, repository: acme}
      capabilities:
        endpoint: {properties: {ports: {mysql: {target: 3306, source: 3306, protocol: tcp}}}}
      requirements:
        - host:
            node_filter:
              capabilities:
                - host: {properties: [{num_cpus: {equal: 1}}, {mem_size: {greater_or_equal: 2 GiB}}]}
    runtime:
      type: tosca.nodes.Container.Runtime
      capabilities:
        host: {properties: {num_cpus: 2, mem_size: 512 MiB}}
"#;
        let c = convert(bp, &Overrides { owner: Some("team-w".into()), cluster: Some("member-1".into()), ..Overrides::default() }).unwrap();
        let a = &c.app;
        let wp = &a.components[0];
        assert_eq!((wp.image.as_str(), wp.replicas, wp.ports[0].port), ("wordpress:6", Some(3), 80));
        assert_eq!((wp.cpu.as_deref(), wp.memory.as_deref()), (Some("2"), Some("512Mi")));
        let db = &a.components[1];
        assert_eq!((db.image.as_str(), db.ports[0].port), ("registry.acme.io/mysql:8", 3306));
        assert_eq!((db.cpu.as_deref(), db.memory.as_deref()), (Some("1"), Some("2Gi")));
        crate::validate::validate(&a.subject(), a).unwrap();
    }
}

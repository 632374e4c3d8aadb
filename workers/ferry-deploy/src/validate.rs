//! Checks a `DeployApp` command before anything is read or written; each refusal names
//! the component, the field and the rule. Checks that need the live state (Secrets,
//! clusters, room for a placement) are the `check` step's ([`crate::handler`]).

use std::collections::{BTreeMap, BTreeSet};

use ferry_kube::quantity;
use ferry_task::Rejection;
use ferry_kube::names::is_dns1123_label;

use crate::spec::{Component, Delivery, DeployApp, DeployOperation};

/// Most components one app has.
pub const MAX_COMPONENTS: usize = 50;
/// Most replicas of one component per cluster.
pub const MAX_REPLICAS: i32 = 1000;
/// Most clusters one placement chooses.
pub const MAX_PLACEMENT_CLUSTERS: i32 = 100;

fn reject(msg: impl Into<String>) -> Rejection {
    Rejection::new(msg)
}

/// True for a DNS-1123 subdomain (hostnames).
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

/// True for an environment variable name as Kubernetes accepts it.
fn is_env_name(s: &str) -> bool {
    let mut b = s.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_' || c == b'-' || c == b'.')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-' || c == b'.')
}

/// An image reference as registries parse it (the distribution grammar).
pub fn check_image(component: &str, image: &str) -> Result<(), Rejection> {
    if image.trim() != image || image.is_empty() {
        return Err(reject(format!("component {component:?}: image {image:?} is not a valid image reference (empty or surrounded by spaces)")));
    }
    image
        .parse::<oci_spec::distribution::Reference>()
        .map(|_| ())
        .map_err(|e| reject(format!("component {component:?}: image {image:?} is not a valid image reference: {e}")))
}

fn check_quantity(component: &str, field: &str, v: &str, cpu: bool) -> Result<(), Rejection> {
    let r = if cpu { quantity::millicores(v) } else { quantity::units(v) };
    match r {
        Ok(n) if n > 0 => Ok(()),
        Ok(_) => Err(reject(format!("component {component:?}: {field} must be positive, got {v:?}"))),
        Err(e) => Err(reject(format!("component {component:?}: {field}: {e}"))),
    }
}

fn check_component(app: &DeployApp, c: &Component) -> Result<(), Rejection> {
    let n = &c.name;
    if !is_dns1123_label(n) || n.len() > 52 {
        return Err(reject(format!("component name {n:?} is not a DNS-1123 label of at most 52 characters")));
    }
    check_image(n, &c.image)?;
    let r = c.replicas();
    if !(1..=MAX_REPLICAS).contains(&r) {
        return Err(reject(format!("component {n:?}: replicas must be 1 to {MAX_REPLICAS}, got {r}")));
    }
    if let Some(q) = &c.cpu {
        check_quantity(n, "cpu", q, true)?;
    }
    if let Some(q) = &c.memory {
        check_quantity(n, "memory", q, false)?;
    }
    let mut env = BTreeSet::new();
    for e in &c.env {
        if !is_env_name(&e.name) {
            return Err(reject(format!("component {n:?}: environment variable name {:?} is not valid", e.name)));
        }
        if !env.insert(&e.name) {
            return Err(reject(format!("component {n:?}: environment variable {:?} is set twice", e.name)));
        }
        match (&e.value, &e.secret) {
            (Some(_), Some(_)) => return Err(reject(format!("component {n:?}: environment variable {:?} has both a value and a secret", e.name))),
            (None, Some(s)) if !is_dns1123_subdomain(&s.name) || s.key.is_empty() => {
                return Err(reject(format!("component {n:?}: environment variable {:?} references secret {:?} key {:?}: not a valid Secret name and key", e.name, s.name, s.key)));
            }
            _ => {}
        }
    }
    if let Some(s) = &c.image_pull_secret
        && !is_dns1123_subdomain(s)
    {
        return Err(reject(format!("component {n:?}: image_pull_secret {s:?} is not a valid Secret name")));
    }
    let mut ports: BTreeMap<(i32, String), usize> = BTreeMap::new();
    let mut names = BTreeSet::new();
    for (i, p) in c.ports.iter().enumerate() {
        if !(1..=65535).contains(&p.port) {
            return Err(reject(format!("component {n:?}: port {} is out of range 1-65535", p.port)));
        }
        let proto = p.protocol.clone().unwrap_or_else(|| "TCP".into());
        if !["TCP", "UDP", "SCTP"].contains(&proto.as_str()) {
            return Err(reject(format!("component {n:?}: port {} has protocol {proto:?}; expected TCP, UDP or SCTP", p.port)));
        }
        if let Some(j) = ports.insert((p.port, proto.clone()), i) {
            return Err(reject(format!("component {n:?}: port {}/{proto} is listed twice (ports {} and {})", p.port, j + 1, i + 1)));
        }
        let name = crate::render::port_name(p);
        if name.len() > 15 || !is_dns1123_label(&name) {
            return Err(reject(format!("component {n:?}: port name {name:?} is not a DNS-1123 label of at most 15 characters")));
        }
        if !names.insert(name.clone()) {
            return Err(reject(format!("component {n:?}: port name {name:?} is used twice")));
        }
    }
    match c.service_type.as_deref() {
        None | Some("ClusterIP") | Some("LoadBalancer") => {}
        Some(t) => return Err(reject(format!("component {n:?}: service_type {t:?}; expected ClusterIP or LoadBalancer"))),
    }
    if c.service_type.is_some() && c.ports.is_empty() {
        return Err(reject(format!("component {n:?}: service_type is set but the component has no ports")));
    }
    if let Some(ing) = &c.ingress {
        if !is_dns1123_subdomain(&ing.host) {
            return Err(reject(format!("component {n:?}: ingress host {:?} is not a DNS-1123 subdomain", ing.host)));
        }
        let Some(first) = c.ports.first() else {
            return Err(reject(format!("component {n:?}: an ingress needs a port; the component has none")));
        };
        let port = ing.port.unwrap_or(first.port);
        if !c.ports.iter().any(|p| p.port == port) {
            return Err(reject(format!("component {n:?}: ingress port {port} is not one of the component's ports")));
        }
        if let Some(p) = &ing.path
            && !p.starts_with('/')
        {
            return Err(reject(format!("component {n:?}: ingress path {p:?} must start with /")));
        }
        if let Some(s) = &ing.tls_secret
            && !is_dns1123_subdomain(s)
        {
            return Err(reject(format!("component {n:?}: ingress tls_secret {s:?} is not a valid Secret name")));
        }
    }
    match (&c.cluster, &c.placement) {
        (Some(_), Some(_)) => return Err(reject(format!("component {n:?}: give a cluster or a placement, not both"))),
        (None, None) => return Err(reject(format!("component {n:?}: needs a target: a cluster or a placement"))),
        (Some(cl), None) if !is_dns1123_label(cl) => return Err(reject(format!("component {n:?}: cluster {cl:?} is not a DNS-1123 label"))),
        (Some(cl), None) if ferry_kube::names::hub_named(cl).is_some() => {
            return Err(reject(format!("component {n:?}: {}", ferry_kube::names::hub_named(cl).unwrap_or_default())));
        }
        (None, Some(p)) => {
            if app.delivery == Delivery::Direct {
                return Err(reject(format!("component {n:?}: a placement needs OCM; delivery direct takes a cluster")));
            }
            let k = p.clusters.unwrap_or(1);
            if !(1..=MAX_PLACEMENT_CLUSTERS).contains(&k) {
                return Err(reject(format!("component {n:?}: placement clusters must be 1 to {MAX_PLACEMENT_CLUSTERS}, got {k}")));
            }
            if let Some(s) = p.cluster_sets.iter().find(|s| !is_dns1123_label(s)) {
                return Err(reject(format!("component {n:?}: cluster set {s:?} is not a DNS-1123 label")));
            }
            if p.score_item.is_some() && p.score.is_none() {
                return Err(reject(format!("component {n:?}: placement score_item without score")));
            }
            if let Some(s) = &p.score
                && !is_dns1123_subdomain(s)
            {
                return Err(reject(format!("component {n:?}: placement score {s:?} is not an AddOnPlacementScore name")));
            }
        }
        _ => {}
    }
    if let Some(ns) = &c.offloaded_namespace
        && !is_dns1123_label(ns)
    {
        return Err(reject(format!("component {n:?}: offloaded_namespace {ns:?} is not a DNS-1123 label")));
    }
    Ok(())
}

/// Every rule that needs no cluster.
pub fn validate(subject: &str, app: &DeployApp) -> Result<(), Rejection> {
    if !is_dns1123_label(&app.name) || app.name.len() > 40 {
        return Err(reject(format!("app name {:?} is not a DNS-1123 label of at most 40 characters", app.name)));
    }
    if app.external.len() > 100 || app.external.iter().any(|e| e.is_empty() || e.len() > 253) {
        return Err(reject("external: at most 100 names of 1 to 253 characters"));
    }
    if !is_dns1123_label(app.namespace()) {
        return Err(reject(format!("namespace {:?} is not a DNS-1123 label", app.namespace())));
    }
    if subject != app.subject() {
        return Err(reject(format!("the subject of a deploy task must be <namespace>/<name> = {:?}, got {subject:?}", app.subject())));
    }
    if let Some(t) = app.ready_timeout_seconds
        && !(1..=86_400).contains(&t)
    {
        return Err(reject(format!("ready_timeout_seconds must be 1 to 86400, got {t}")));
    }
    if app.operation == DeployOperation::Delete {
        return Ok(());
    }
    if app.owner.trim().is_empty() {
        return Err(reject("owner is required: who the app belongs to"));
    }
    if app.components.is_empty() {
        return Err(reject("an app needs at least one component"));
    }
    if app.components.len() > MAX_COMPONENTS {
        return Err(reject(format!("at most {MAX_COMPONENTS} components, got {}", app.components.len())));
    }
    let mut seen = BTreeSet::new();
    let mut hosts: BTreeMap<(String, String), String> = BTreeMap::new();
    for c in &app.components {
        if !seen.insert(&c.name) {
            return Err(reject(format!("component {:?} is listed twice", c.name)));
        }
        check_component(app, c)?;
        if let Some(i) = &c.ingress {
            let key = (i.host.clone(), i.path.clone().unwrap_or_else(|| "/".into()));
            if let Some(other) = hosts.insert(key.clone(), c.name.clone()) {
                return Err(reject(format!("components {other:?} and {:?} both claim ingress {}{}", c.name, key.0, key.1)));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{IngressSpec, PlacementSpec, Port};

    fn app() -> DeployApp {
        DeployApp {
            name: "shop".into(),
            owner: "team-a".into(),
            components: vec![Component {
                name: "web".into(),
                image: "nginx:1.27".into(),
                ports: vec![Port { port: 80, ..Port::default() }],
                cluster: Some("member-1".into()),
                ..Component::default()
            }],
            ..DeployApp::default()
        }
    }

    type Edit = Box<dyn FnOnce(&mut DeployApp)>;

    fn rejected(f: impl FnOnce(&mut DeployApp)) -> String {
        let mut a = app();
        f(&mut a);
        validate(&a.subject(), &a).expect_err("should be rejected").reason
    }

    #[test]
    fn a_good_app_passes() {
        validate("shop/shop", &app()).unwrap();
    }

    #[test]
    fn each_rule_names_what_it_refuses() {
        let cases: Vec<(Edit, &str)> = vec![
            (Box::new(|a| a.components[0].image = "UPPER/Case:tag".into()), "image \"UPPER/Case:tag\" is not a valid image reference"),
            (Box::new(|a| a.components[0].image = "nginx:".into()), "is not a valid image reference"),
            (Box::new(|a| a.components[0].image = " nginx".into()), "is not a valid image reference"),
            (Box::new(|a| a.components[0].ports.push(Port { port: 80, ..Port::default() })), "port 80/TCP is listed twice"),
            (Box::new(|a| a.components[0].ports.push(Port { port: 70000, ..Port::default() })), "port 70000 is out of range"),
            (Box::new(|a| a.components[0].cluster = None), "needs a target"),
            (Box::new(|a| a.components[0].placement = Some(PlacementSpec::default())), "not both"),
            (Box::new(|a| a.components[0].replicas = Some(0)), "replicas must be 1 to 1000"),
            (Box::new(|a| a.components[0].cpu = Some("2 cores".into())), "component \"web\": cpu"),
            (Box::new(|a| a.components[0].memory = Some("-1Gi".into())), "memory must be positive"),
            (Box::new(|a| a.components.push(a.components[0].clone())), "listed twice"),
            (Box::new(|a| a.components.clear()), "at least one component"),
            (Box::new(|a| a.owner.clear()), "owner is required"),
            (Box::new(|a| a.name = "Shop".into()), "app name \"Shop\""),
            (Box::new(|a| a.components[0].ingress = Some(IngressSpec { host: "shop.example.com".into(), port: Some(81), ..IngressSpec::default() })), "ingress port 81"),
            (Box::new(|a| a.components[0].service_type = Some("NodePort".into())), "service_type \"NodePort\""),
            (
                Box::new(|a| {
                    a.delivery = Delivery::Direct;
                    a.components[0].cluster = None;
                    a.components[0].placement = Some(PlacementSpec::default());
                }),
                "a placement needs OCM",
            ),
            (
                Box::new(|a| {
                    let mut other = a.components[0].clone();
                    other.name = "api".into();
                    a.components[0].ingress = Some(IngressSpec { host: "shop.example.com".into(), ..IngressSpec::default() });
                    other.ingress = Some(IngressSpec { host: "shop.example.com".into(), path: Some("/".into()), ..IngressSpec::default() });
                    a.components.push(other);
                }),
                "both claim ingress shop.example.com/",
            ),
        ];
        for (f, want) in cases {
            let got = rejected(f);
            assert!(got.contains(want), "expected {want:?} in {got:?}");
        }
    }

    #[test]
    fn the_subject_must_be_namespace_slash_name() {
        let r = validate("other", &app()).unwrap_err().reason;
        assert!(r.contains("<namespace>/<name> = \"shop/shop\""), "{r}");
    }

    #[test]
    fn a_delete_needs_only_the_name() {
        let a = DeployApp { operation: DeployOperation::Delete, name: "shop".into(), ..DeployApp::default() };
        validate("shop/shop", &a).unwrap();
    }
}

//! Checks a `ClusterCommand` before anything is read or written; each refusal names the
//! field and the rule. Rules that need the hub (a Cluster Ferry did not create, a missing
//! provider, ClusterClass or ManagedClusterSet) are the `check` step's.

use std::net::IpAddr;

use ferry_kube::names::{is_dns1123_label, is_label_key, is_label_value};
use ferry_task::Rejection;

use crate::addons::Catalog;
use crate::spec::{ClusterCommand, ClusterOperation};

/// Infrastructure providers Ferry renders.
pub const INFRASTRUCTURES: &[&str] = &["docker", "openstack"];
/// Bootstrap and control-plane providers Ferry renders.
pub const CONTROL_PLANE_PROVIDERS: &[&str] = &["kubeadm", "k3s"];
/// Longest cluster name: machine and node names add suffixes to it.
pub const MAX_NAME: usize = 40;
/// Most machines of one pool.
pub const MAX_MACHINES: i32 = 1000;

fn reject(msg: impl Into<String>) -> Rejection {
    Rejection::new(msg)
}

/// `v1.MINOR.PATCH` with an optional pre-release or build suffix.
fn is_version(v: &str) -> bool {
    let Some(rest) = v.strip_prefix("v1.") else {
        return false;
    };
    let core = rest.split(['-', '+']).next().unwrap_or("");
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() == 2 && parts.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// An IPv4 or IPv6 CIDR.
fn is_cidr(s: &str) -> bool {
    let Some((ip, len)) = s.split_once('/') else {
        return false;
    };
    let Ok(ip) = ip.parse::<IpAddr>() else {
        return false;
    };
    let max = if ip.is_ipv4() { 32 } else { 128 };
    len.parse::<u8>().is_ok_and(|l| l <= max)
}

/// A UUID in its 8-4-4-4-12 hex form (OpenStack ids).
fn is_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5 && groups.iter().zip([8, 4, 4, 4, 12]).all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Checks `cmd` against the rules that need no cluster; `catalog` knows the add-ons.
pub fn validate(subject: &str, cmd: &ClusterCommand, catalog: &Catalog) -> Result<(), Rejection> {
    checked(subject, cmd, Some(catalog))
}

/// [`validate`] but for the add-ons' settings, which only a worker's catalog knows: what a
/// plan checks of a child it will send ([`ferry_task::kind::KindInfo::check`]).
pub fn rules(subject: &str, cmd: &ClusterCommand) -> Result<(), Rejection> {
    checked(subject, cmd, None)
}

fn checked(subject: &str, cmd: &ClusterCommand, catalog: Option<&Catalog>) -> Result<(), Rejection> {
    if !is_dns1123_label(&cmd.name) || cmd.name.len() > MAX_NAME {
        return Err(reject(format!("name {:?} is not a DNS-1123 label of at most {MAX_NAME} characters (lowercase letters, digits, '-')", cmd.name)));
    }
    if let Some(why) = ferry_kube::names::hub_named(&cmd.name) {
        return Err(reject(why));
    }
    if !is_dns1123_label(cmd.namespace()) {
        return Err(reject(format!("namespace {:?} is not a DNS-1123 label", cmd.namespace())));
    }
    if subject != cmd.subject() {
        return Err(reject(format!("the task subject must be {:?} (namespace/name), got {subject:?}", cmd.subject())));
    }
    match cmd.operation {
        ClusterOperation::Create => validate_create(cmd, catalog),
        ClusterOperation::Scale => validate_scale(cmd),
        ClusterOperation::Delete => Ok(()),
    }
}

fn check_counts(cmd: &ClusterCommand) -> Result<(), Rejection> {
    if let Some(cp) = cmd.control_plane.count {
        if cp < 1 {
            return Err(reject(format!("control_plane.count must be at least 1, got {cp}")));
        }
        if cp > MAX_MACHINES {
            return Err(reject(format!("control_plane.count must be at most {MAX_MACHINES}, got {cp}")));
        }
        if cmd.control_plane_provider() == "kubeadm" && cp > 1 && cp % 2 == 0 {
            return Err(reject(format!(
                "control_plane.count {cp} is even: a kubeadm control plane runs stacked etcd, whose quorum needs an odd member count (1, 3, 5, ...)"
            )));
        }
    }
    if let Some(w) = cmd.workers.count
        && !(0..=MAX_MACHINES).contains(&w)
    {
        return Err(reject(format!("workers.count must be between 0 and {MAX_MACHINES}, got {w}")));
    }
    Ok(())
}

fn validate_scale(cmd: &ClusterCommand) -> Result<(), Rejection> {
    if cmd.control_plane.count.is_none() && cmd.workers.count.is_none() {
        return Err(reject("scale needs control_plane.count, workers.count or both"));
    }
    check_counts(cmd)
}

fn validate_create(cmd: &ClusterCommand, catalog: Option<&Catalog>) -> Result<(), Rejection> {
    let infra = cmd.infrastructure.as_str();
    if !INFRASTRUCTURES.contains(&infra) {
        return Err(reject(format!("infrastructure provider {infra:?} is not supported: expected one of {}", INFRASTRUCTURES.join(", "))));
    }
    let cp = cmd.control_plane_provider();
    if !CONTROL_PLANE_PROVIDERS.contains(&cp) {
        return Err(reject(format!("control_plane_provider {cp:?} is not supported: expected one of {}", CONTROL_PLANE_PROVIDERS.join(", "))));
    }
    if !is_version(&cmd.version) {
        return Err(reject(format!("version {:?} is not a Kubernetes version of the form v1.MINOR.PATCH", cmd.version)));
    }
    if cmd.control_plane.count == Some(0) {
        return Err(reject("control_plane.count is 0: a cluster needs at least one control-plane machine"));
    }
    check_counts(cmd)?;
    for (field, cidr) in [("pods_cidr", &cmd.pods_cidr), ("services_cidr", &cmd.services_cidr)] {
        if let Some(c) = cidr
            && !is_cidr(c)
        {
            return Err(reject(format!("{field} {c:?} is not a CIDR (e.g. 10.0.0.0/16)")));
        }
    }
    if let Some(img) = &cmd.image
        && (img.trim().is_empty() || img.trim() != img)
    {
        return Err(reject(format!("image {img:?} is empty or surrounded by spaces")));
    }
    if let Some(cc) = &cmd.cluster_class
        && !is_dns1123_label(cc)
    {
        return Err(reject(format!("cluster_class {cc:?} is not a DNS-1123 label")));
    }
    if !cmd.variables.is_empty() && cmd.cluster_class.is_none() {
        return Err(reject("variables are a ClusterClass topology's: set cluster_class, or leave variables out"));
    }
    if cmd.variables.len() > 64 {
        return Err(reject(format!("{} variables: at most 64", cmd.variables.len())));
    }
    for (name, value) in &cmd.variables {
        if name.is_empty() || name.len() > 256 || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            return Err(reject(format!("variable name {name:?} is not a ClusterClass variable name (letters, digits, - and _)")));
        }
        if value.len() > 32 * 1024 {
            return Err(reject(format!("variable {name:?} is {} bytes: at most 32 KiB", value.len())));
        }
    }
    match (infra, &cmd.openstack) {
        ("openstack", None) => {
            return Err(reject("infrastructure openstack needs the openstack settings (at least openstack.cloud_secret)"));
        }
        ("openstack", Some(os)) => {
            if !is_dns1123_label(&os.cloud_secret) {
                return Err(reject(format!("openstack.cloud_secret {:?} is not a Secret name (DNS-1123 label)", os.cloud_secret)));
            }
            if let Some(id) = &os.external_network_id
                && !is_uuid(id)
            {
                return Err(reject(format!("openstack.external_network_id {id:?} is not a UUID (OpenStack network ids are)")));
            }
            if let Some(ip) = &os.api_server_floating_ip
                && ip.parse::<IpAddr>().is_err()
            {
                return Err(reject(format!("openstack.api_server_floating_ip {ip:?} is not an IP address")));
            }
            if let Some(c) = &os.node_cidr
                && !is_cidr(c)
            {
                return Err(reject(format!("openstack.node_cidr {c:?} is not a CIDR")));
            }
            if let Some(d) = os.dns_nameservers.iter().find(|d| d.parse::<IpAddr>().is_err()) {
                return Err(reject(format!("openstack.dns_nameservers: {d:?} is not an IP address")));
            }
            if cmd.cluster_class.is_none() {
                if cmd.image.is_none() {
                    return Err(reject("infrastructure openstack needs image (the machines' Glance image name)"));
                }
                if cmd.control_plane.flavor.is_none() || (cmd.worker_count() > 0 && cmd.workers.flavor.is_none()) {
                    return Err(reject("infrastructure openstack needs control_plane.flavor and, with workers, workers.flavor"));
                }
            }
        }
        (_, Some(_)) => {
            return Err(reject(format!("openstack settings are given but the infrastructure is {infra:?}")));
        }
        _ => {}
    }
    for (k, v) in &cmd.labels {
        if !is_label_key(k) {
            return Err(reject(format!("label key {k:?} is not a valid label key ([prefix/]name)")));
        }
        if !is_label_value(v) {
            return Err(reject(format!("label {k}={v:?}: the value is not a valid label value")));
        }
    }
    if let Some(set) = &cmd.ocm.cluster_set {
        if !cmd.ocm.enabled {
            return Err(reject("ocm.cluster_set is set but ocm.enabled is false"));
        }
        if !is_dns1123_label(set) {
            return Err(reject(format!("ocm.cluster_set {set:?} is not a DNS-1123 label")));
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for a in &cmd.addons {
        if !seen.insert(&a.name) {
            return Err(reject(format!("add-on {:?} is listed twice", a.name)));
        }
        if let Some(catalog) = catalog {
            catalog.check(a)?;
        }
    }
    for t in [cmd.ready_timeout_seconds, cmd.addon_timeout_seconds].into_iter().flatten() {
        if t < 1 {
            return Err(reject(format!("timeouts must be at least 1 second, got {t}")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{AddonRequest, MachinePool, OcmRegistration, OpenStackSettings, WorkerPool};

    fn cmd() -> ClusterCommand {
        ClusterCommand {
            name: "edge-1".into(),
            infrastructure: "docker".into(),
            version: "v1.33.1".into(),
            control_plane: MachinePool { count: Some(1), flavor: None },
            workers: WorkerPool { count: Some(2), flavor: None },
            ..ClusterCommand::default()
        }
    }

    fn rejected(f: impl FnOnce(&mut ClusterCommand)) -> String {
        let mut c = cmd();
        f(&mut c);
        validate(&c.subject(), &c, &Catalog::builtin()).expect_err("must be rejected").reason
    }

    #[test]
    fn a_good_command_passes() {
        let c = cmd();
        validate(&c.subject(), &c, &Catalog::builtin()).unwrap();
    }

    #[test]
    fn each_rule_names_its_field() {
        type Edit = Box<dyn FnOnce(&mut ClusterCommand)>;
        let cases: Vec<(Edit, &str)> = vec![
            (Box::new(|c| c.name = "Edge_1".into()), "name \"Edge_1\" is not a DNS-1123 label"),
            (Box::new(|c| c.infrastructure = "aws".into()), "infrastructure provider \"aws\" is not supported"),
            (Box::new(|c| c.control_plane_provider = Some("rke2".into())), "control_plane_provider \"rke2\" is not supported"),
            (Box::new(|c| c.control_plane.count = Some(0)), "control_plane.count is 0"),
            (Box::new(|c| c.control_plane.count = Some(2)), "control_plane.count 2 is even"),
            (Box::new(|c| c.workers.count = Some(-1)), "workers.count must be between 0"),
            (Box::new(|c| c.version = "1.33".into()), "version \"1.33\" is not a Kubernetes version"),
            (Box::new(|c| c.pods_cidr = Some("10.0.0.0".into())), "pods_cidr \"10.0.0.0\" is not a CIDR"),
            (Box::new(|c| c.addons = vec![AddonRequest { name: "flannelx".into(), ..AddonRequest::default() }]), "unknown add-on \"flannelx\""),
            (Box::new(|c| c.addons = vec![AddonRequest { name: "metallb".into(), ..AddonRequest::default() }]), "add-on metallb needs parameter address_pool"),
            (Box::new(|c| c.labels.insert("tier".into(), "gold!".into()).map(drop).unwrap_or(())), "label tier=\"gold!\""),
            (Box::new(|c| c.ocm = OcmRegistration { enabled: false, cluster_set: Some("edge".into()) }), "ocm.cluster_set is set but ocm.enabled is false"),
            (Box::new(|c| c.infrastructure = "openstack".into()), "infrastructure openstack needs the openstack settings"),
            (
                Box::new(|c| {
                    c.infrastructure = "openstack".into();
                    c.openstack =
                        Some(OpenStackSettings { cloud_secret: "cloud".into(), external_network_id: Some("public".into()), ..OpenStackSettings::default() });
                }),
                "openstack.external_network_id \"public\" is not a UUID",
            ),
            (
                Box::new(|c| c.openstack = Some(OpenStackSettings { cloud_secret: "cloud".into(), ..OpenStackSettings::default() })),
                "openstack settings are given but the infrastructure is \"docker\"",
            ),
        ];
        for (edit, want) in cases {
            let got = rejected(edit);
            assert!(got.contains(want), "{got:?} should contain {want:?}");
        }
    }

    #[test]
    fn odd_kubeadm_and_any_k3s_control_planes_pass() {
        let mut c = cmd();
        c.control_plane.count = Some(3);
        validate(&c.subject(), &c, &Catalog::builtin()).unwrap();
        c.control_plane.count = Some(2);
        c.control_plane_provider = Some("k3s".into());
        validate(&c.subject(), &c, &Catalog::builtin()).unwrap();
    }

    #[test]
    fn scale_needs_a_count_and_delete_needs_only_a_name() {
        let mut c = ClusterCommand { operation: ClusterOperation::Scale, name: "edge-1".into(), ..ClusterCommand::default() };
        let e = validate(&c.subject(), &c, &Catalog::builtin()).unwrap_err();
        assert!(e.reason.contains("scale needs"), "{e}");
        c.workers.count = Some(5);
        validate(&c.subject(), &c, &Catalog::builtin()).unwrap();
        c.operation = ClusterOperation::Delete;
        validate(&c.subject(), &c, &Catalog::builtin()).unwrap();
    }

    #[test]
    fn the_subject_must_be_namespace_slash_name() {
        let c = cmd();
        let e = validate("other/edge-1", &c, &Catalog::builtin()).unwrap_err();
        assert!(e.reason.contains("default/edge-1"), "{e}");
    }
}

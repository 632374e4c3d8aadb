//! Tenants: who sent a command, as the broker established it, and what each may target.
//!
//! A tenant writes only its own command topics, `ferry.tenants.<tenant>.<kind>`; the
//! broker enforces that with write ACLs (the tenant's KafkaUser, `strimzi::tenant_users`).
//! The worker's gateway ([`crate::gateway`]) reads those topics and forwards each record
//! to the kind's command topic with the [`TENANT_HEADER`] naming the topic's tenant; only
//! gateways (and operators) may write command topics. Nothing the record says about its
//! sender is believed: the intake makes `requested_by` the tenant's principal, checks the
//! command against the tenant's [`Policy`], puts its idempotency key in the tenant's own
//! space, and lets it cancel or revert only the tenant's own tasks.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::ids::TaskId;
use crate::kind::TaskKind;
use crate::targets::Targets;

/// Header the gateway sets on a forwarded record: the tenant whose topic it came from.
pub const TENANT_HEADER: &str = "ferry-tenant";

/// Longest tenant name (it is part of topic, user and principal names).
pub const TENANT_NAME_MAX: usize = 40;

/// The principal recorded as a tenant's tasks' `requested_by`.
pub fn principal(tenant: &str) -> String {
    format!("tenant:{tenant}")
}

/// The tenant a principal ([`principal`]) names; `None` for an operator's.
pub fn tenant_of(principal: &str) -> Option<&str> {
    principal.strip_prefix("tenant:").filter(|t| is_tenant_name(t))
}

/// A tenant's idempotency key, in the tenant's own space: two tenants' keys never meet.
pub fn tenant_key(tenant: &str, key: &str) -> String {
    format!("{tenant}/{key}")
}

/// The task id a tenant's command with idempotency key `key` must carry.
pub fn tenant_task_id(kind: TaskKind, tenant: &str, key: &str) -> TaskId {
    TaskId::for_idempotency_key(kind, &tenant_key(tenant, key))
}

/// Why a policy could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The file could not be read.
    #[error("reading the tenant policy {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a policy.
    #[error("the tenant policy {path} is not valid: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, with its place.
        reason: String,
    },
}

/// What one tenant may target with one kind. Each entry is a name, a prefix ending in
/// `*`, or `*` (anything).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Clusters the tenant's commands may name.
    #[serde(default)]
    pub clusters: Vec<String>,
    /// ManagedClusterSets they may place into.
    #[serde(default)]
    pub cluster_sets: Vec<String>,
    /// Namespaces they may write.
    #[serde(default)]
    pub namespaces: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    tenants: BTreeMap<String, BTreeMap<String, Rule>>,
}

/// Every tenant's rules, per kind. A kind a tenant has no rule for is refused to it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    tenants: BTreeMap<String, BTreeMap<TaskKind, Rule>>,
}

fn matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

fn is_tenant_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= TENANT_NAME_MAX
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

impl Policy {
    /// Reads a policy file (YAML; see `examples/tenants.yaml`).
    pub fn load(path: &Path) -> Result<Self, PolicyError> {
        let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Read { path: path.to_owned(), source })?;
        Self::parse(&text).map_err(|reason| PolicyError::Invalid { path: path.to_owned(), reason })
    }

    /// Parses a policy's text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: File = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
        let mut tenants = BTreeMap::new();
        for (tenant, kinds) in file.tenants {
            if !is_tenant_name(&tenant) {
                return Err(format!(
                    "tenant name {tenant:?}: lower-case letters, digits and '-', at most {TENANT_NAME_MAX} characters (it names topics and users)"
                ));
            }
            let mut rules = BTreeMap::new();
            for (kind, rule) in kinds {
                let k: TaskKind = kind.parse().map_err(|e| format!("tenants.{tenant}: {e}"))?;
                if let Some(why) = crate::kind::info(k).and_then(|i| i.not_for_tenants) {
                    // E.g. the plan worker submits a plan's children under its own identity,
                    // so a tenant's plan would run every kind outside the tenant's rules.
                    return Err(format!("tenants.{tenant}.{kind}: tenants may not submit {kind} commands ({why})"));
                }
                for (what, list) in [("clusters", &rule.clusters), ("cluster_sets", &rule.cluster_sets), ("namespaces", &rule.namespaces)] {
                    if let Some(p) = list.iter().find(|p| p.is_empty() || p[..p.len() - 1].contains('*')) {
                        return Err(format!("tenants.{tenant}.{kind}.{what}: {p:?} is not a name, a prefix ending in '*' or '*'"));
                    }
                }
                rules.insert(k, rule);
            }
            tenants.insert(tenant, rules);
        }
        Ok(Self { tenants })
    }

    /// The tenants, in name order.
    pub fn tenants(&self) -> impl Iterator<Item = &str> {
        self.tenants.keys().map(String::as_str)
    }

    /// The tenants that may submit `kind` (their command topics for it exist).
    pub fn tenants_of(&self, kind: TaskKind) -> Vec<&str> {
        self.tenants.iter().filter(|(_, r)| r.contains_key(&kind)).map(|(t, _)| t.as_str()).collect()
    }

    /// The kinds `tenant` may submit.
    pub fn kinds_of(&self, tenant: &str) -> Vec<TaskKind> {
        self.tenants.get(tenant).map(|r| r.keys().copied().collect()).unwrap_or_default()
    }

    /// Whether `tenant` may send a `kind` command acting on `targets`; the refusal names
    /// the rule that refuses it.
    pub fn check(&self, tenant: &str, kind: TaskKind, targets: &Targets) -> Result<(), String> {
        let Some(rules) = self.tenants.get(tenant) else {
            return Err(format!("tenant {tenant:?} is not in the tenant policy"));
        };
        let Some(rule) = rules.get(&kind) else {
            return Err(format!("policy: tenant {tenant:?} may not submit {kind} commands (tenants.{tenant} has no {kind} rule)"));
        };
        let lists = [
            ("cluster", "clusters", &targets.clusters, &rule.clusters),
            ("cluster set", "cluster_sets", &targets.cluster_sets, &rule.cluster_sets),
            ("namespace", "namespaces", &targets.namespaces, &rule.namespaces),
        ];
        for (what, field, named, allowed) in lists {
            if let Some(n) = named.iter().find(|n| !allowed.iter().any(|p| matches(p, n))) {
                return Err(format!(
                    "policy: tenant {tenant:?} may not target {what} {n:?} with {kind} (tenants.{tenant}.{kind}.{field}: [{}])",
                    allowed.join(", ")
                ));
            }
        }
        if let Some(how) = &targets.chosen_at_run
            && !rule.clusters.iter().any(|p| p == "*")
        {
            return Err(format!(
                "policy: tenant {tenant:?} may target only the clusters in tenants.{tenant}.{kind}.clusters ([{}]); this command chooses its clusters when it runs: {how}",
                rule.clusters.join(", ")
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kind::KindInfo;

    // The kinds these tests name, registered as stand-ins (this crate links no worker
    // crate); `tests/ship.rs` checks the policy against the kinds Ferry ships.
    const fn stand_in(kind: TaskKind, not_for_tenants: Option<&'static str>) -> KindInfo {
        KindInfo { not_for_tenants, ..KindInfo::bare(kind) }
    }
    crate::register_kind!(stand_in(TaskKind::DEPLOY, None));
    crate::register_kind!(stand_in(TaskKind::SCORE, None));
    crate::register_kind!(stand_in(TaskKind::PEER, None));
    crate::register_kind!(stand_in(TaskKind::new("shell"), Some("it runs commands as the worker")));

    #[test]
    fn a_policy_granting_a_kind_tenants_may_not_submit_is_refused_with_the_reason() {
        let e = Policy::parse("tenants:\n  web:\n    shell:\n      clusters: [\"*\"]\n").unwrap_err();
        assert_eq!(e, "tenants.web.shell: tenants may not submit shell commands (it runs commands as the worker)");
    }

    const POLICY: &str = r#"
tenants:
  web:
    deploy:
      clusters: [member-1, "edge-*"]
      cluster_sets: [demo]
      namespaces: ["web-*"]
    score:
      clusters: ["*"]
      cluster_sets: ["*"]
"#;

    #[test]
    fn every_target_must_be_allowed_and_the_refusal_names_the_rule() {
        let p = Policy::parse(POLICY).unwrap();
        let ok = Targets::clusters(["member-1", "edge-7"]).with_sets(["demo"]).with_namespaces(["web-shop"]);
        p.check("web", TaskKind::DEPLOY, &ok).unwrap();
        let e = p.check("web", TaskKind::DEPLOY, &Targets::clusters(["member-2"])).unwrap_err();
        assert_eq!(e, "policy: tenant \"web\" may not target cluster \"member-2\" with deploy (tenants.web.deploy.clusters: [member-1, edge-*])");
        let e = p.check("web", TaskKind::DEPLOY, &Targets::default().with_namespaces(["kube-system"])).unwrap_err();
        assert!(e.contains("namespace \"kube-system\"") && e.contains("tenants.web.deploy.namespaces"), "{e}");
        let e = p.check("web", TaskKind::PEER, &Targets::default()).unwrap_err();
        assert!(e.contains("may not submit peer commands"), "{e}");
        let e = p.check("ops", TaskKind::DEPLOY, &ok).unwrap_err();
        assert!(e.contains("not in the tenant policy"), "{e}");
        // Clusters chosen when the task runs: only where any cluster is allowed.
        let chosen = Targets::default().chosen_at_run("a selector");
        assert!(p.check("web", TaskKind::DEPLOY, &chosen).unwrap_err().contains("chooses its clusters when it runs: a selector"));
        p.check("web", TaskKind::SCORE, &chosen).unwrap();
        assert_eq!(p.tenants_of(TaskKind::SCORE), ["web"]);
        assert!(p.tenants_of(TaskKind::PEER).is_empty());
    }

    #[test]
    fn bad_policies_are_refused_with_their_place() {
        for (text, says) in [
            ("tenants: {Web: {}}", "tenant name \"Web\""),
            ("tenants: {web: {deploi: {}}}", "unknown task kind \"deploi\""),
            ("tenants: {web: {deploy: {clusters: [\"a*b\"]}}}", "tenants.web.deploy.clusters"),
            ("tenants: {web: {deploy: {cluster: [a]}}}", "unknown field `cluster`"),
        ] {
            let e = Policy::parse(text).unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn tenants_keys_and_ids_never_meet() {
        assert_ne!(tenant_task_id(TaskKind::DEPLOY, "a", "k"), tenant_task_id(TaskKind::DEPLOY, "b", "k"));
        assert_eq!(tenant_task_id(TaskKind::DEPLOY, "a", "k"), TaskId::for_idempotency_key(TaskKind::DEPLOY, "a/k"));
    }
}

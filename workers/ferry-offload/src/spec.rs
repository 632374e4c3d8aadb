//! The `offload` command (`OffloadCommand`): offload a namespace to peered clusters with
//! Liqo, unoffload it, or burst a Deployment's overflow replicas to the nearest peered
//! clusters with room. The subject is `<cluster>/<namespace>`, so every command on one
//! namespace runs in order on one worker.

use std::collections::HashMap;

use apache_avro::AvroSchema;
use ferry_kube::names::is_dns1123_label;
use ferry_task::Rejection;
use serde::{Deserialize, Serialize};

/// What to do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub enum OffloadOperation {
    /// Offload the namespace (a NamespaceOffloading); revert unoffloads it.
    #[default]
    #[serde(alias = "offload")]
    #[schemars(extend("x-aliases" = ["offload"]))]
    Offload,
    /// Remove the namespace's offloading; revert restores it as it was.
    #[serde(alias = "unoffload")]
    #[schemars(extend("x-aliases" = ["unoffload"]))]
    Unoffload,
    /// Scale `deployment` to `replicas` and offload what the cluster cannot fit; revert
    /// restores the replicas and removes an offloading it created.
    #[serde(alias = "burst")]
    #[schemars(extend("x-aliases" = ["burst"]))]
    Burst,
}

/// Where the namespace's pods may run (Liqo's `podOffloadingStrategy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub enum PodOffloadingStrategy {
    /// Local nodes and the selected remote clusters.
    #[default]
    LocalAndRemote,
    /// Only local nodes (the namespace is mirrored, pods stay home).
    Local,
    /// Only the selected remote clusters.
    Remote,
}

/// How the twin namespaces are named (Liqo's `namespaceMappingStrategy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub enum NamespaceMappingStrategy {
    /// `<namespace>-<cluster id>`.
    #[default]
    DefaultName,
    /// The same name (fails where that name is taken).
    EnforceSameName,
    /// `remote_namespace_name`.
    SelectedName,
}

/// A requirement on the labels of the cluster's virtual nodes (one per peered provider;
/// `liqo.io/remote-cluster-id` names it), as in a node selector term.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct SelectorRequirement {
    /// The label key.
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    pub operator: String,
    /// The values of `In` and `NotIn`.
    #[serde(default)]
    pub values: Vec<String>,
}

/// `OffloadCommand`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct OffloadCommand {
    /// Offload (default), unoffload or burst.
    #[serde(default)]
    pub operation: OffloadOperation,
    /// The cluster whose namespace is offloaded (the Liqo consumer).
    pub cluster: String,
    /// The namespace.
    pub namespace: String,
    /// Where pods may run (offload).
    #[serde(default)]
    pub pod_offloading_strategy: PodOffloadingStrategy,
    /// How twin namespaces are named (offload, burst).
    #[serde(default)]
    pub namespace_mapping_strategy: NamespaceMappingStrategy,
    /// The twin namespaces' name with `SelectedName`.
    #[serde(default)]
    pub remote_namespace_name: Option<String>,
    /// Target clusters by name; each must be peered with `cluster` (it has a virtual node
    /// of each). Burst: the candidates (default: every peered cluster).
    #[serde(default)]
    pub clusters: Vec<String>,
    /// Or the targets by the labels of `cluster`'s virtual nodes (ANDed).
    #[serde(default)]
    pub cluster_selector: Vec<SelectorRequirement>,
    /// Burst: the Deployment in `namespace`.
    #[serde(default)]
    pub deployment: Option<String>,
    /// Burst: the replicas wanted.
    #[serde(default)]
    pub replicas: Option<i32>,
    /// Burst: milliseconds from `cluster` to candidates, overriding the worker's latency
    /// matrix (nearest first; unknown ones last).
    #[serde(default)]
    pub latency_ms: HashMap<String, i32>,
    /// Bound of every wait, seconds (default 300).
    #[serde(default)]
    pub timeout_seconds: Option<i32>,
}

impl OffloadCommand {
    /// The subject: `<cluster>/<namespace>`.
    pub fn subject(&self) -> String {
        format!("{}/{}", self.cluster, self.namespace)
    }

    /// The wait bound.
    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.timeout_seconds.map_or(300, |t| t.max(1) as u64))
    }
}

/// Namespaces that are never offloaded: the system's and Liqo's own.
fn reserved(ns: &str) -> bool {
    ns.starts_with("kube-") || ns == "default" || ns == "liqo" || ns.starts_with("liqo-")
}

/// Checks a command before anything is read or written.
pub fn validate(subject: &str, c: &OffloadCommand) -> Result<(), Rejection> {
    let bad = |m: String| Err(Rejection::new(m));
    if !is_dns1123_label(&c.cluster) {
        return bad(format!("cluster: {:?} is not a DNS-1123 label", c.cluster));
    }
    if let Some(why) = c.clusters.iter().chain([&c.cluster]).find_map(|n| ferry_kube::names::hub_named(n)) {
        return bad(why);
    }
    if !is_dns1123_label(&c.namespace) {
        return bad(format!("namespace: {:?} is not a DNS-1123 label", c.namespace));
    }
    if reserved(&c.namespace) {
        return bad(format!("namespace: {:?} is a system or Liqo namespace and is never offloaded", c.namespace));
    }
    if subject != c.subject() {
        return bad(format!("the task subject must be {:?} (cluster/namespace), got {subject:?}", c.subject()));
    }
    for t in &c.clusters {
        if !is_dns1123_label(t) {
            return bad(format!("clusters: {t:?} is not a DNS-1123 label"));
        }
        if *t == c.cluster {
            return bad(format!("clusters: {t:?} is the cluster itself; name the clusters to offload to"));
        }
    }
    if !c.clusters.is_empty() && !c.cluster_selector.is_empty() {
        return bad("clusters and cluster_selector are exclusive: name the targets or select them, not both".into());
    }
    for r in &c.cluster_selector {
        if !ferry_kube::names::is_label_key(&r.key) {
            return bad(format!("cluster_selector: {:?} is not a label key", r.key));
        }
        match (r.operator.as_str(), r.values.is_empty()) {
            ("In" | "NotIn", false) | ("Exists" | "DoesNotExist", true) => {}
            ("In" | "NotIn", true) => return bad(format!("cluster_selector: {} {} needs values", r.key, r.operator)),
            ("Exists" | "DoesNotExist", false) => return bad(format!("cluster_selector: {} {} takes no values", r.key, r.operator)),
            (op, _) => return bad(format!("cluster_selector: operator {op:?} of {} is not In, NotIn, Exists or DoesNotExist", r.key)),
        }
    }
    match (c.namespace_mapping_strategy, &c.remote_namespace_name) {
        (NamespaceMappingStrategy::SelectedName, None) => return bad("remote_namespace_name is required with namespace_mapping_strategy SelectedName".into()),
        (NamespaceMappingStrategy::SelectedName, Some(n)) if !is_dns1123_label(n) => {
            return bad(format!("remote_namespace_name: {n:?} is not a DNS-1123 label"));
        }
        (NamespaceMappingStrategy::SelectedName, Some(_)) => {}
        (_, Some(_)) => return bad("remote_namespace_name is only used with namespace_mapping_strategy SelectedName".into()),
        (_, None) => {}
    }
    if let Some(t) = c.timeout_seconds
        && t < 1
    {
        return bad(format!("timeout_seconds must be at least 1, got {t}"));
    }
    for (k, v) in &c.latency_ms {
        if *v < 0 {
            return bad(format!("latency_ms: {k}: {v} is negative"));
        }
    }
    match c.operation {
        OffloadOperation::Burst => {
            let Some(d) = &c.deployment else { return bad("deployment is required to burst".into()) };
            if !ferry_kube::names::is_dns1123_subdomain(d) {
                return bad(format!("deployment: {d:?} is not a valid name"));
            }
            match c.replicas {
                None => return bad("replicas is required to burst".into()),
                Some(r) if r < 1 => return bad(format!("replicas must be at least 1 to burst, got {r}")),
                Some(_) => {}
            }
            if c.pod_offloading_strategy != PodOffloadingStrategy::LocalAndRemote {
                return bad("a burst keeps what fits at home and offloads the overflow: pod_offloading_strategy must be LocalAndRemote".into());
            }
        }
        OffloadOperation::Offload | OffloadOperation::Unoffload => {
            if c.deployment.is_some() || c.replicas.is_some() {
                return bad("deployment and replicas belong to a burst".into());
            }
            if !c.latency_ms.is_empty() {
                return bad("latency_ms belongs to a burst".into());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c() -> OffloadCommand {
        OffloadCommand { cluster: "member-1".into(), namespace: "web".into(), clusters: vec!["member-2".into()], ..OffloadCommand::default() }
    }

    #[test]
    fn each_rule_names_its_field() {
        let check = |f: &dyn Fn(&mut OffloadCommand), want: &str| {
            let mut x = c();
            f(&mut x);
            let e = validate(&x.subject(), &x).expect_err(want);
            assert!(e.reason.contains(want), "{e} should contain {want}");
        };
        check(&|x| x.namespace = "Web".into(), "namespace: \"Web\"");
        check(&|x| x.namespace = "kube-system".into(), "system or Liqo namespace");
        check(&|x| x.clusters = vec!["member-1".into()], "the cluster itself");
        check(
            &|x| {
                x.clusters.clear();
                x.cluster_selector = vec![SelectorRequirement { key: "zone".into(), operator: "In".into(), values: vec![] }];
            },
            "needs values",
        );
        check(&|x| x.cluster_selector = vec![SelectorRequirement { key: "zone".into(), operator: "Exists".into(), values: vec![] }], "exclusive");
        check(
            &|x| {
                x.clusters.clear();
                x.cluster_selector = vec![SelectorRequirement { key: "zone".into(), operator: "Gt".into(), values: vec!["1".into()] }];
            },
            "operator \"Gt\"",
        );
        check(&|x| x.namespace_mapping_strategy = NamespaceMappingStrategy::SelectedName, "remote_namespace_name is required");
        check(&|x| x.remote_namespace_name = Some("x".into()), "only used with namespace_mapping_strategy SelectedName");
        check(&|x| x.replicas = Some(3), "belong to a burst");
        check(&|x| x.operation = OffloadOperation::Burst, "deployment is required");
        check(
            &|x| {
                x.operation = OffloadOperation::Burst;
                x.deployment = Some("api".into());
                x.replicas = Some(0);
            },
            "replicas must be at least 1",
        );
        check(
            &|x| {
                x.operation = OffloadOperation::Burst;
                x.deployment = Some("api".into());
                x.replicas = Some(4);
                x.pod_offloading_strategy = PodOffloadingStrategy::Remote;
            },
            "must be LocalAndRemote",
        );
        check(&|x| x.timeout_seconds = Some(0), "timeout_seconds");
        let x = c();
        assert!(validate("member-1/api", &x).unwrap_err().reason.contains("member-1/web"));
        validate(&x.subject(), &x).unwrap();
    }
}

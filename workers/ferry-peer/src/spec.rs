//! The `peer` command (`PeerClusters`): peer or unpeer two clusters with Liqo or
//! Submariner. The subject is the unordered pair, so every command of one pair runs in
//! order on one worker.

use apache_avro::AvroSchema;
use ferry_kube::names::is_dns1123_label;
use ferry_task::Rejection;
use serde::{Deserialize, Serialize};

/// Peer or unpeer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub enum PeerOperation {
    /// Establish the peering; revert removes it.
    #[default]
    #[serde(alias = "peer")]
    #[schemars(extend("x-aliases" = ["peer"]))]
    Peer,
    /// Remove what a peering created, in reverse order; revert peers again.
    #[serde(alias = "unpeer")]
    #[schemars(extend("x-aliases" = ["unpeer"]))]
    Unpeer,
    /// Liqo only, for a provider `b` that is gone for good: clean `a`'s side of the
    /// peering without ever contacting `b` (`liqoctl force unpeer`): `a`'s ForeignCluster
    /// of `b` declared permanently unreachable, then what the peering made on `a` deleted
    /// and awaited. `b` keeps whatever it held. Cannot be reverted.
    #[serde(alias = "force-unpeer")]
    #[schemars(extend("x-aliases" = ["force-unpeer"]))]
    ForceUnpeer,
}

/// How the clusters connect.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub enum PeerMethod {
    /// Liqo: `a` consumes `b`'s resources (a virtual node of `b` in `a`).
    #[default]
    #[serde(alias = "liqo")]
    #[schemars(extend("x-aliases" = ["liqo"]))]
    Liqo,
    /// Submariner through OCM: a network tunnel between the clusters' pods and services.
    #[serde(alias = "submariner")]
    #[schemars(extend("x-aliases" = ["submariner"]))]
    Submariner,
}

/// `PeerClusters`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, AvroSchema, schemars::JsonSchema)]
#[avro(namespace = "io.ferry.v1")]
pub struct PeerClusters {
    /// Peer (default), unpeer, or force-unpeer (`a` cleaned alone, `b` gone).
    #[serde(default)]
    pub operation: PeerOperation,
    /// The consumer (Liqo: gets a virtual node of `b`).
    pub a: String,
    /// The provider.
    pub b: String,
    /// Liqo (default) or Submariner.
    #[serde(default)]
    pub method: PeerMethod,
    /// Liqo: also let `b` consume `a`.
    #[serde(default)]
    pub bidirectional: bool,
    /// Submariner: the ManagedClusterSet both clusters join (default: the set they share,
    /// else `submariner`).
    #[serde(default)]
    pub cluster_set: Option<String>,
    /// Bound of every wait (components ready, connection, acceptance), seconds (default 300).
    #[serde(default)]
    pub timeout_seconds: Option<i32>,
}

impl PeerClusters {
    /// The subject: the unordered pair, `<first>+<second>` by name.
    pub fn subject(&self) -> String {
        let (x, y) = if self.a <= self.b { (&self.a, &self.b) } else { (&self.b, &self.a) };
        format!("{x}+{y}")
    }

    /// The wait bound.
    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.timeout_seconds.map_or(300, |t| t.max(1) as u64))
    }
}

/// Checks a command before anything is read or written.
pub fn validate(subject: &str, p: &PeerClusters) -> Result<(), Rejection> {
    for (field, v) in [("a", &p.a), ("b", &p.b)] {
        if !is_dns1123_label(v) {
            return Err(Rejection::new(format!("{field}: cluster name {v:?} is not a DNS-1123 label")));
        }
        if let Some(why) = ferry_kube::names::hub_named(v) {
            return Err(Rejection::new(format!("{field}: {why}")));
        }
    }
    if p.a == p.b {
        return Err(Rejection::new(format!("a and b are the same cluster ({:?}): a cluster cannot peer with itself", p.a)));
    }
    if subject != p.subject() {
        return Err(Rejection::new(format!("the task subject must be {:?} (the pair, by name), got {subject:?}", p.subject())));
    }
    if let Some(t) = p.timeout_seconds
        && t < 1
    {
        return Err(Rejection::new(format!("timeout_seconds must be at least 1, got {t}")));
    }
    if p.operation == PeerOperation::ForceUnpeer && p.method != PeerMethod::Liqo {
        return Err(Rejection::new(
            "operation ForceUnpeer is Liqo's (`liqoctl force unpeer`); a Submariner peering lives on the hub: undo it with operation Unpeer",
        ));
    }
    match (p.method, &p.cluster_set) {
        (PeerMethod::Liqo, Some(_)) => Err(Rejection::new("cluster_set is a Submariner setting; Liqo peers clusters directly")),
        (PeerMethod::Liqo, None) | (PeerMethod::Submariner, None) => Ok(()),
        (PeerMethod::Submariner, Some(s)) if is_dns1123_label(s) => {
            if p.bidirectional {
                Err(Rejection::new("bidirectional is a Liqo setting; a Submariner tunnel always goes both ways"))
            } else {
                Ok(())
            }
        }
        (PeerMethod::Submariner, Some(s)) => Err(Rejection::new(format!("cluster_set {s:?} is not a DNS-1123 label"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> PeerClusters {
        PeerClusters { a: "member-1".into(), b: "member-2".into(), ..PeerClusters::default() }
    }

    #[test]
    fn the_subject_is_the_unordered_pair() {
        let mut x = p();
        let s = x.subject();
        std::mem::swap(&mut x.a, &mut x.b);
        assert_eq!(x.subject(), s);
        assert_eq!(s, "member-1+member-2");
    }

    #[test]
    fn each_rule_names_its_field() {
        let check = |f: &dyn Fn(&mut PeerClusters), want: &str| {
            let mut x = p();
            f(&mut x);
            let e = validate(&x.subject(), &x).expect_err(want);
            assert!(e.reason.contains(want), "{e} should contain {want}");
        };
        check(&|x| x.a = "Member_1".into(), "a: cluster name \"Member_1\"");
        check(&|x| x.b = "member-1".into(), "cannot peer with itself");
        check(&|x| x.cluster_set = Some("edge".into()), "cluster_set is a Submariner setting");
        check(
            &|x| {
                x.method = PeerMethod::Submariner;
                x.cluster_set = Some("Edge".into());
            },
            "cluster_set \"Edge\"",
        );
        check(&|x| x.timeout_seconds = Some(0), "timeout_seconds must be at least 1");
        check(
            &|x| {
                x.method = PeerMethod::Submariner;
                x.operation = PeerOperation::ForceUnpeer;
            },
            "operation ForceUnpeer is Liqo's",
        );
        let x = p();
        assert!(validate("member-2+member-1", &x).unwrap_err().reason.contains("member-1+member-2"));
        validate(&x.subject(), &x).unwrap();
    }
}

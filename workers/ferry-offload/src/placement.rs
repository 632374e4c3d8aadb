//! Where a burst's overflow goes: the candidates (peered clusters, as the consumer's
//! virtual nodes) ranked nearest first, each taking as many pods as its free CPU and
//! memory fit, until the overflow is placed. Pure.

use ferry_kube::quantity;
use k8s_openapi::api::core::v1::PodSpec;
use serde::{Deserialize, Serialize};

/// CPU (millicores) and memory (bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    /// Millicores.
    pub cpu_m: i64,
    /// Bytes.
    pub memory: i64,
}

impl Resources {
    /// How many `per` fit in `self` (unbounded dimensions ignored; `u32::MAX` if none ask).
    pub fn fits(&self, per: &Resources) -> u32 {
        let dim = |free: i64, ask: i64| if ask <= 0 { u32::MAX } else { (free.max(0) / ask).min(i64::from(u32::MAX)) as u32 };
        dim(self.cpu_m, per.cpu_m).min(dim(self.memory, per.memory))
    }
}

/// What one pod of `spec` requests (the sum of its containers' requests).
pub fn pod_requests(spec: &PodSpec) -> Resources {
    let mut r = Resources::default();
    for c in &spec.containers {
        let req = c.resources.as_ref().and_then(|r| r.requests.as_ref());
        if let Some(q) = req.and_then(|m| m.get("cpu")) {
            r.cpu_m += quantity::millicores(&q.0).unwrap_or(0);
        }
        if let Some(q) = req.and_then(|m| m.get("memory")) {
            r.memory += quantity::units(&q.0).unwrap_or(0);
        }
    }
    r
}

/// A peered cluster that may take pods.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Candidate {
    /// The cluster's name.
    pub cluster: String,
    /// Its Liqo cluster id.
    pub id: String,
    /// Its virtual node on the consumer.
    pub node: String,
    /// Milliseconds from the consumer, if known.
    pub latency_ms: Option<u32>,
    /// What its virtual node has left.
    pub free: Resources,
}

/// A cluster's share of the overflow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Share {
    /// The cluster's name.
    pub cluster: String,
    /// Its Liqo cluster id.
    pub id: String,
    /// Its virtual node.
    pub node: String,
    /// Milliseconds from the consumer, if known.
    pub latency_ms: Option<u32>,
    /// Pods it takes.
    pub pods: u32,
}

/// The overflow does not fit the candidates.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{overflow} pods ({} m CPU, {} MiB each) overflow the cluster; the peered clusters fit only {fit}{}", per.cpu_m, per.memory / (1 << 20), if shares.is_empty() { String::new() } else { format!(" ({})", shares.iter().map(|(c, n)| format!("{c}: {n}")).collect::<Vec<_>>().join(", ")) })]
pub struct Shortfall {
    /// Pods to place.
    pub overflow: u32,
    /// What each pod asks.
    pub per: Resources,
    /// How many fit in all.
    pub fit: u32,
    /// What each candidate could take.
    pub shares: Vec<(String, u32)>,
}

/// Ranks `candidates` nearest first (unknown latency last, then by name) and fills them in
/// that order with `overflow` pods of `per`.
pub fn place(overflow: u32, per: Resources, mut candidates: Vec<Candidate>) -> Result<Vec<Share>, Shortfall> {
    candidates.sort_by(|a, b| (a.latency_ms.unwrap_or(u32::MAX), &a.cluster).cmp(&(b.latency_ms.unwrap_or(u32::MAX), &b.cluster)));
    let mut left = overflow;
    let mut out = Vec::new();
    let mut could = Vec::new();
    for c in candidates {
        let fit = c.free.fits(&per);
        could.push((c.cluster.clone(), fit.min(overflow)));
        let take = fit.min(left);
        if take > 0 {
            out.push(Share { cluster: c.cluster, id: c.id, node: c.node, latency_ms: c.latency_ms, pods: take });
            left -= take;
        }
    }
    if left > 0 {
        return Err(Shortfall { overflow, per, fit: overflow - left, shares: could });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(cluster: &str, latency: Option<u32>, cpu_m: i64) -> Candidate {
        Candidate {
            cluster: cluster.into(),
            id: cluster.into(),
            node: format!("liqo-{cluster}"),
            latency_ms: latency,
            free: Resources { cpu_m, memory: 64 << 30 },
        }
    }

    #[test]
    fn nearest_first_then_the_next_with_room() {
        let per = Resources { cpu_m: 1000, memory: 1 << 30 };
        let shares = place(5, per, vec![cand("far", Some(80), 8000), cand("near", Some(5), 3000), cand("unknown", None, 8000)]).unwrap();
        let got: Vec<(&str, u32)> = shares.iter().map(|s| (s.cluster.as_str(), s.pods)).collect();
        assert_eq!(got, [("near", 3), ("far", 2)]);
    }

    #[test]
    fn a_shortfall_says_what_fits_where() {
        let per = Resources { cpu_m: 2000, memory: 1 << 30 };
        let e = place(6, per, vec![cand("member-2", Some(5), 4500), cand("member-3", Some(9), 2000)]).unwrap_err();
        assert_eq!(e.fit, 3);
        let msg = e.to_string();
        assert!(msg.contains("6 pods (2000 m CPU, 1024 MiB each)") && msg.contains("fit only 3 (member-2: 2, member-3: 1)"), "{msg}");
    }

    #[test]
    fn pods_without_requests_all_go_to_the_nearest() {
        let shares = place(4, Resources::default(), vec![cand("b", Some(9), 0), cand("a", Some(9), 0)]).unwrap();
        assert_eq!(shares.len(), 1);
        assert_eq!((shares[0].cluster.as_str(), shares[0].pods), ("a", 4));
    }
}

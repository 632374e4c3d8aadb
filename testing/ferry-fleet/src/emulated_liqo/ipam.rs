//! Emulated Liqo IPAM (liqotech/liqo `pkg/ipam`, `deployments/liqo/templates/liqo-ipam-networks.yaml`):
//! the Networks the chart installs in Liqo's namespace (the cluster's pod CIDR, the
//! external and internal CIDRs, each with `status.cidr` equal to its spec), and the
//! allocation of the Networks the Configuration controller asks for a remote cluster's
//! CIDRs: the CIDR itself when it overlaps nothing the cluster already uses, else the next
//! free block of the same size in 10.0.0.0/8 (a remapping, as Liqo's IPAM does for two
//! clusters with the same pod CIDR).

use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

use super::{MANAGER, ar, name_of, ns_of, set_status};
use ferry_kube::vocab::liqo::{LIQO_NAMESPACE, NETWORK_TYPE_LABEL};

/// Every member's pod CIDR: what its emulated kubelets hand out (10.244.x.y), as kubeadm
/// with flannel would; equal on all clusters, so peers' pod CIDRs are always remapped.
pub const POD_CIDR: &str = "10.244.0.0/16";
/// The chart's default external CIDR (`ipam.externalCIDR`).
pub const EXTERNAL_CIDR: &str = "10.70.0.0/16";
/// The chart's default internal CIDR (`ipam.internalCIDR`).
pub const INTERNAL_CIDR: &str = "10.80.0.0/16";

pub(super) fn networks_api(client: &kube::Client, ns: Option<&str>) -> Api<DynamicObject> {
    let r = ar("ipam.liqo.io", "v1alpha1", "Network", "networks");
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &r),
        None => Api::all_with(client.clone(), &r),
    }
}

/// Installs the chart's Networks (status set: they are preinstalled and not remapped).
pub(super) async fn install(client: &kube::Client) -> Result<(), kube::Error> {
    let api = networks_api(client, Some(LIQO_NAMESPACE));
    for (name, kind, cidr) in [("pod-cidr", "pod-cidr", POD_CIDR), ("external-cidr", "external-cidr", EXTERNAL_CIDR), ("internal-cidr", "internal-cidr", INTERNAL_CIDR)] {
        let obj = json!({"apiVersion": "ipam.liqo.io/v1alpha1", "kind": "Network", "metadata": {"name": name, "namespace": LIQO_NAMESPACE,
            "labels": {NETWORK_TYPE_LABEL: kind, "ipam.liqo.io/network-not-remapped": "true"}, "annotations": {"liqo.io/preinstalled": "true"}},
            "spec": {"cidr": cidr}});
        api.patch(name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&obj)).await?;
        set_status(&api, name, json!({"cidr": cidr})).await?;
    }
    Ok(())
}

/// An IPv4 CIDR as (address, prefix length).
pub fn parse(cidr: &str) -> Option<(u32, u32)> {
    let (addr, len) = cidr.split_once('/')?;
    let len: u32 = len.parse().ok().filter(|l| *l <= 32)?;
    let ip: std::net::Ipv4Addr = addr.parse().ok()?;
    Some((u32::from(ip), len))
}

fn mask(len: u32) -> u32 {
    if len == 0 { 0 } else { u32::MAX << (32 - len) }
}

fn overlaps(a: (u32, u32), b: (u32, u32)) -> bool {
    let m = mask(a.1.min(b.1));
    a.0 & m == b.0 & m
}

fn format(addr: u32, len: u32) -> String {
    format!("{}/{len}", std::net::Ipv4Addr::from(addr))
}

/// The CIDR the IPAM gives a Network asking for `want`, given the CIDRs already `used`:
/// `want` when free, else the first free block of its size in 10.0.0.0/8.
pub fn allocate(want: &str, used: &[String]) -> Option<String> {
    let w = parse(want)?;
    let used: Vec<(u32, u32)> = used.iter().filter_map(|u| parse(u)).collect();
    if !used.iter().any(|u| overlaps(*u, w)) {
        return Some(format(w.0 & mask(w.1), w.1));
    }
    let size = 1u64 << (32 - w.1);
    let start = u64::from(u32::from(std::net::Ipv4Addr::new(10, 0, 0, 0)));
    let end = start + (1 << 24);
    let mut at = start;
    while at + size <= end {
        let c = (at as u32, w.1);
        if !used.iter().any(|u| overlaps(*u, c)) {
            return Some(format(c.0, c.1));
        }
        at += size;
    }
    None
}

/// Gives every Network of the cluster without `status.cidr` its allocation.
pub(super) async fn reconcile(client: &kube::Client) -> Result<(), kube::Error> {
    let all = networks_api(client, None).list(&ListParams::default()).await?.items;
    let mut used: Vec<String> = all.iter().filter_map(|n| n.data.pointer("/status/cidr").and_then(Value::as_str).map(str::to_owned)).collect();
    for n in &all {
        if n.data.pointer("/status/cidr").is_some() || n.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let Some(want) = n.data.pointer("/spec/cidr").and_then(Value::as_str) else { continue };
        let Some(got) = allocate(want, &used) else {
            tracing::debug!(network = %name_of(n), "emulated Liqo IPAM: no free block");
            continue;
        };
        set_status(&networks_api(client, Some(&ns_of(n))), &name_of(n), json!({"cidr": got})).await?;
        used.push(got);
    }
    Ok(())
}

/// The CIDRs of the cluster's own Networks of `kind` (`pod-cidr`, `external-cidr`) in
/// Liqo's namespace, from their status (`pkg/utils/ipam/networks.go`, `GetPodCIDRs`).
pub async fn local_cidrs(client: &kube::Client, kind: &str) -> Result<Vec<String>, kube::Error> {
    let lp = ListParams::default().labels(&format!("{NETWORK_TYPE_LABEL}={kind}"));
    Ok(networks_api(client, Some(LIQO_NAMESPACE))
        .list(&lp)
        .await?
        .items
        .iter()
        .filter_map(|n| n.data.pointer("/status/cidr").and_then(Value::as_str).map(str::to_owned))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_cidr_is_kept_and_a_taken_one_is_remapped() {
        assert_eq!(allocate("10.244.0.0/16", &["10.70.0.0/16".into()]).as_deref(), Some("10.244.0.0/16"));
        let used = vec!["10.244.0.0/16".to_owned(), "10.0.0.0/16".to_owned()];
        assert_eq!(allocate("10.244.0.0/16", &used).as_deref(), Some("10.1.0.0/16"));
        assert_eq!(allocate("10.244.3.0/24", &used).as_deref(), Some("10.1.0.0/24"));
        assert_eq!(allocate("nonsense", &used), None);
    }
}

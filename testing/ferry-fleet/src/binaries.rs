//! Locates etcd and the Kubernetes control-plane binaries.

use std::path::PathBuf;

/// The binaries a fleet needs.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// etcd (Debian's etcd-server).
    pub etcd: PathBuf,
    /// kube-apiserver.
    pub apiserver: PathBuf,
    /// kube-controller-manager.
    pub controller_manager: PathBuf,
    /// kube-scheduler.
    pub scheduler: PathBuf,
}

/// `${FERRY_CACHE:-~/.cache/ferry}`: where the install scripts keep what they built.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("FERRY_CACHE").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/ferry"))
}

/// A binary is missing.
#[derive(Debug, thiserror::Error)]
#[error("{0} not found: run scripts/install-testbed.sh (or `ferry testbed install`)")]
pub struct Missing(pub PathBuf);

impl Binaries {
    /// `FERRY_K8S_BIN`, else `${FERRY_CACHE:-~/.cache/ferry}/k8s/bin`; etcd from `PATH`.
    pub fn locate() -> Result<Self, Missing> {
        let dir = std::env::var_os("FERRY_K8S_BIN").map(PathBuf::from).unwrap_or_else(|| cache_dir().join("k8s/bin"));
        let etcd = ["/usr/bin/etcd", "/usr/local/bin/etcd"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
            .ok_or_else(|| Missing(PathBuf::from("etcd")))?;
        let b = Self {
            etcd,
            apiserver: dir.join("kube-apiserver"),
            controller_manager: dir.join("kube-controller-manager"),
            scheduler: dir.join("kube-scheduler"),
        };
        for p in [&b.apiserver, &b.controller_manager, &b.scheduler] {
            if !p.exists() {
                return Err(Missing(p.clone()));
            }
        }
        Ok(b)
    }

    /// True when every binary is installed.
    pub fn installed() -> bool {
        Self::locate().is_ok()
    }
}

//! Ferry's test bed: real Kubernetes control planes on one machine (one etcd, and per
//! cluster a kube-apiserver, kube-controller-manager and kube-scheduler v1.20 built offline
//! by `scripts/install-testbed.sh`), with emulated kubelets, so workers are tested through
//! `kube` against the real API: validation, watches, server-side apply, finalizers, GC.
//!
//! # Layout
//! - [`fleet`]: start and stop a fleet (hub + managed clusters); [`Cluster`] handles.
//! - [`process`]: child processes that die with the test, even on SIGKILL.
//! - [`crds`]: install CRDs from a folder (CEL rules stripped, storage version only);
//!   [`crd_seed`]: store them before an API server starts, which it takes far more cheaply.
//! - [`kubelet`]: the emulated node agent (nodes, pod status, job completion).
//! - [`binaries`]: where the control-plane binaries are.
//! - [`emulated_capi`]: Cluster API providers played for tests: workload clusters appear.
//! - [`emulated_liqo`]: Liqo peering (network, authentication, resources) played as upstream's controllers.
//! - [`emulated_submariner`]: the Submariner add-on on the hub, played for tests.
//! - [`emulated_offloading`]: Liqo namespace offloading and its virtual kubelet, played for tests.
//! - [`emulated_ocm`]: OCM registration, work agents and placement, played for tests;
//!   [`emulated_cluster_sets`]: the hub's `default` and `global` ManagedClusterSets;
//!   [`work_apply_sync`]: when a work agent applies a work's manifests (on its changes,
//!   failures and upstream's 4-6 minute resync) and in which order;
//!   [`work_status_sync`]: when a work agent reports a work's status (upstream's sync
//!   interval, watch-type feedback).
//! - [`wake`]: when an emulated controller's pass runs (a watched kind changed, a delay ran
//!   out, or a quiet second passed).
//! - [`admission`]: admission webhooks served over TLS and registered on the API servers,
//!   as upstream installs them; [`webhooks_ocm`]: OCM's hub webhooks (accept, join, bind, the
//!   default set and taint times);
//!   [`webhooks_liqo`]: Liqo's Tenant webhook; [`webhooks_liqo_offloading`]: Liqo's
//!   NamespaceOffloading and pod webhooks on members.
//! - [`inventory`]: every object on a cluster, to compare before and after.

pub mod admission;
pub mod applied_cache;
pub mod binaries;
pub mod crd_seed;
pub mod crds;
pub mod describe;
pub mod emulate;
pub mod emulated_capi;
pub mod emulated_cluster_sets;
pub mod emulated_liqo;
pub mod emulated_offloading;
pub mod emulated_ocm;
pub mod emulated_registration;
pub mod emulated_submariner;
pub mod fault_proxy;
pub mod fleet;
pub mod inventory;
pub mod kinds;
pub mod kubelet;
pub mod measure;
pub mod ocm_prioritizers;
pub mod ocm_taints;
pub mod process;
pub mod wake;
pub mod webhooks_capi;
pub mod webhooks_cel;
pub mod webhooks_liqo;
pub mod webhooks_liqo_offloading;
pub mod webhooks_ocm;
pub mod work_apply_sync;
pub mod work_status_sync;

pub use fleet::{Cluster, ClusterSpawner, CrdSource, Fleet, FleetError, FleetOptions};
pub use fault_proxy::{FaultHandle, FaultProxy};
pub use kubelet::{Kubelet, NodeFlavor};

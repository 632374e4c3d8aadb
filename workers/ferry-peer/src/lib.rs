//! Ferry's peer worker: connects two clusters with Liqo (what `liqoctl peer` does —
//! network connect, authenticate with the real key exchange, resource slice — through the
//! clusters' kubeconfigs) or Submariner (through OCM: cluster set membership, the set's
//! Broker, SubmarinerConfig, the submariner ManagedClusterAddOn), checks both
//! sides first with bounded waits, and removes exactly what it created, in reverse order,
//! on unpeer or revert. Commands for one pair share a subject, so they never interleave.
//!
//! - [`spec`]: the command (`PeerClusters`: peer, unpeer, force-unpeer).
//! - [`liqo`]: the Liqo objects (pure).
//! - [`drain`]: what holds a virtual node's drain (an unpeer's wait says it).
//! - [`handshake`]: the consumer's CSR and Tenant proof from its keys (liqoctl authenticate).
//! - [`submariner`]: the OCM objects of a Submariner peering (pure).
//! - [`handler`]: the handler, what steps share, and the plan.
//! - [`steps`]: the steps, one module each, with their typed outputs.
//! - [`preview`]: a command's dry run (its checks; a Submariner peering's hub objects judged).

mod drain;
pub mod handler;
pub mod handshake;
pub mod liqo;
pub mod preview;
pub mod spec;
pub mod steps;
pub mod submariner;

pub use handler::{PeerConfig, PeerHandler};

// The kind this crate serves, for the runtime, the CLI and the generators (ferry_task::kind).
ferry_task::register_kind!(ferry_task::kind::KindInfo {
    kind: ferry_task::TaskKind::PEER,
    describe: "Liqo or Submariner peering between two clusters",
    order: 20,
    schemas: &[
        (20, "PeerClusters.avsc", include_str!("../../../schemas/PeerClusters.avsc")),
        (21, "PeerClusters.v2.avsc", include_str!("../../../schemas/PeerClusters.v2.avsc")),
    ],
    spec: "PeerClusters.v2.avsc",
    access: ferry_task::kind::Access::NONE,
    not_for_tenants: None,
    encode: ferry_task::kind::encode_json::<spec::PeerClusters>,
    check: |subject, spec| ferry_task::kind::check_json::<spec::PeerClusters>(subject, spec, spec::validate),
    subject_of: |spec| serde_json::from_value::<spec::PeerClusters>(spec.clone()).ok().map(|c| c.subject()),
    derived_subject: Some("the pair, `<first>+<second>` by name"),
});

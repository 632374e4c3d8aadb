//! Every error code a Ferry task can end with, in one place: the `code` of a
//! [`StepError`](crate::StepError) and of a task's error. Codes are stable and greppable
//! (alerts and scripts match on them); one meaning has one code. Use these constants,
//! never a string literal.

// Runtime: set by the runtime itself, whatever the kind.
/// The command's spec failed `validate`, or a step refused it against the live state.
pub const REJECTED: &str = "REJECTED";
/// The spec stored for a resumed task no longer decodes.
pub const SPEC_UNDECODABLE: &str = "SPEC_UNDECODABLE";
/// The spec stored for a task no longer passes `validate` (or its tenant's policy) when a
/// worker takes the task up: a snapshot written by anything but an intake is not run.
pub const SPEC_INVALID: &str = "SPEC_INVALID";
/// The task's deadline passed, or a wait ran out of time.
pub const DEADLINE_EXCEEDED: &str = "DEADLINE_EXCEEDED";
/// One attempt of a step ran past its timeout (retried).
pub const STEP_TIMEOUT: &str = "STEP_TIMEOUT";
/// A resumed or reverted task's journal names other steps than its kind's plan now has
/// (a worker of another version): nothing more runs, no undo goes to the wrong step.
pub const PLAN_CHANGED: &str = "PLAN_CHANGED";
/// A step's output would take the task's step outputs past
/// [`STEP_OUTPUTS_BYTES`](crate::limits::STEP_OUTPUTS_BYTES): they ride in its snapshot,
/// which must fit in a record. A permanent failure (the task reverts).
pub const OUTPUT_TOO_LARGE: &str = "OUTPUT_TOO_LARGE";
/// A bug in Ferry: a step's input that the plan guarantees is missing or malformed.
pub const INTERNAL: &str = "INTERNAL";
/// The `test` kind's injected failures.
pub const INJECTED_FAILURE: &str = "INJECTED_FAILURE";
/// The `test` kind's injected transient failure.
pub const INJECTED_TRANSIENT: &str = "INJECTED_TRANSIENT";
/// The `test` kind's injected undo failure.
pub const INJECTED_UNDO_FAILURE: &str = "INJECTED_UNDO_FAILURE";

// Reaching clusters (ferry-kube's step errors).
/// Ferry knows no cluster of that name (no kubeconfig Secret, no ManagedCluster).
pub const UNKNOWN_CLUSTER: &str = "UNKNOWN_CLUSTER";
/// The hub's API failed.
pub const HUB_API: &str = "HUB_API";
/// A managed cluster's API failed.
pub const CLUSTER_API: &str = "CLUSTER_API";
/// A managed cluster's kubeconfig Secret is unusable.
pub const KUBECONFIG: &str = "KUBECONFIG";
/// Writing a workload's objects failed.
pub const WORKLOAD_API: &str = "WORKLOAD_API";
/// Server-side apply of rendered objects failed.
pub const APPLY_FAILED: &str = "APPLY_FAILED";
/// Something a task made was not removed within its deadline.
pub const REMOVAL: &str = "REMOVAL";

// Score.
/// A spec value the step cannot use (e.g. a benchmark without an image).
pub const BAD_SPEC: &str = "BAD_SPEC";
/// Nothing to score: the list or the cluster set is empty.
pub const NO_CLUSTERS: &str = "NO_CLUSTERS";
/// The latency-aware policy found no latency matrix.
pub const NO_LATENCY_MATRIX: &str = "NO_LATENCY_MATRIX";
/// The latency matrix does not parse.
pub const BAD_LATENCY_MATRIX: &str = "BAD_LATENCY_MATRIX";
/// The benchmark's result namespace cannot be made.
pub const RESULT_NAMESPACE: &str = "RESULT_NAMESPACE";
/// The benchmark's ManifestWorks were not cleaned up.
pub const CLEANUP: &str = "CLEANUP";
/// A score record does not encode.
pub const ENCODE: &str = "ENCODE";
/// Publishing to a Kafka topic failed.
pub const KAFKA: &str = "KAFKA";

// Deploy.
/// The app's record on the hub does not parse.
pub const BAD_APP_RECORD: &str = "BAD_APP_RECORD";
/// A referenced Secret does not exist on the hub.
pub const SECRET_MISSING: &str = "SECRET_MISSING";
/// A referenced Secret lacks the key named.
pub const SECRET_KEY_MISSING: &str = "SECRET_KEY_MISSING";
/// A referenced Secret may not leave the hub: not marked `ferry.dev/exportable=true`, or a
/// credential of the fleet (a kubeconfig, a service-account token).
pub const SECRET_NOT_EXPORTABLE: &str = "SECRET_NOT_EXPORTABLE";
/// The app's namespace is not bound to a ManagedClusterSet it places into.
pub const CLUSTERSET_NOT_BOUND: &str = "CLUSTERSET_NOT_BOUND";
/// No cluster of the bound sets has the placement's labels.
pub const NO_CANDIDATES: &str = "NO_CANDIDATES";
/// A deploy of an app that exists.
pub const ALREADY_DEPLOYED: &str = "ALREADY_DEPLOYED";
/// An update or delete of an app that does not exist.
pub const NOT_DEPLOYED: &str = "NOT_DEPLOYED";
/// An update changes the delivery (ManifestWork ↔ direct).
pub const DELIVERY_CHANGED: &str = "DELIVERY_CHANGED";
/// No placement of enough clusters satisfies the request.
pub const PLACEMENT_UNSATISFIED: &str = "PLACEMENT_UNSATISFIED";
/// Objects did not become ready (rollout, ManifestWork applied).
pub const NOT_READY: &str = "NOT_READY";
/// The previous app was not restored within the undo's deadline.
pub const NOT_RESTORED: &str = "NOT_RESTORED";
/// The app was not removed within the undo's deadline.
pub const NOT_REMOVED: &str = "NOT_REMOVED";
/// An object the deploy would write exists and Ferry did not make it for this app (not
/// labelled `app.kubernetes.io/managed-by=ferry` and `ferry.io/app=<app>` and written by
/// Ferry's field manager), or another field manager owns fields Ferry applies (a
/// server-side apply conflict): Ferry leaves it alone.
pub const OBJECT_NOT_FERRYS: &str = "OBJECT_NOT_FERRYS";

// Create-cluster.
/// The hub does not serve a kind the command renders (its Cluster API provider is not
/// installed).
pub const PROVIDER_MISSING: &str = "PROVIDER_MISSING";
/// A create of a Cluster that Ferry made already (scale or delete it instead).
pub const CLUSTER_EXISTS: &str = "CLUSTER_EXISTS";
/// The Cluster exists and Ferry did not make it (or its managed-by label changed): Ferry
/// leaves it alone.
pub const CLUSTER_NOT_FERRYS: &str = "CLUSTER_NOT_FERRYS";
/// The cluster's name is in use: a `<name>-kubeconfig` Secret on the hub (names are unique
/// across namespaces), or a registered ManagedCluster of that name.
pub const NAME_TAKEN: &str = "NAME_TAKEN";
/// Registration is asked for and the hub does not serve ManagedClusters (OCM is not
/// installed).
pub const OCM_MISSING: &str = "OCM_MISSING";
/// The ClusterClass defines no worker class, and workers are asked for.
pub const CLUSTER_CLASS_NO_WORKERS: &str = "CLUSTER_CLASS_NO_WORKERS";
/// The undo of a deletion that began: a deleted Cluster is not brought back.
pub const IRREVERSIBLE: &str = "IRREVERSIBLE";
/// The CSRs of a joining cluster come from more than one agent; none is approved (as
/// `clusteradm accept` refuses them).
pub const OCM_CSR_CONFLICT: &str = "OCM_CSR_CONFLICT";
/// The ManagedClusterSet to register into does not exist.
pub const CLUSTER_SET_MISSING: &str = "CLUSTER_SET_MISSING";
/// The ClusterClass a topology names does not exist.
pub const CLUSTER_CLASS_MISSING: &str = "CLUSTER_CLASS_MISSING";
/// The ClusterClass requires topology variables the command cannot set.
pub const CLUSTER_CLASS_VARIABLES: &str = "CLUSTER_CLASS_VARIABLES";
/// A scale or delete of a Cluster that does not exist.
pub const CLUSTER_NOT_FOUND: &str = "CLUSTER_NOT_FOUND";
/// A scale of a Cluster being deleted.
pub const CLUSTER_DELETING: &str = "CLUSTER_DELETING";
/// A cluster's control plane or nodes did not become ready.
pub const CLUSTER_NOT_READY: &str = "CLUSTER_NOT_READY";
/// Cluster API reported the cluster failed.
pub const FAILED: &str = "FAILED";
/// An add-on's manifests could not be fetched or read.
pub const ADDON_SOURCE: &str = "ADDON_SOURCE";
/// An add-on did not become ready.
pub const ADDON_FAILED: &str = "ADDON_FAILED";

// Peer.
/// Liqo is not installed on a cluster.
pub const LIQO_MISSING: &str = "LIQO_MISSING";
/// Liqo is installed but not running.
pub const LIQO_NOT_READY: &str = "LIQO_NOT_READY";
/// A peer cluster is not ready (no Ready node).
pub const PEER_NOT_READY: &str = "PEER_NOT_READY";
/// A force unpeer's provider still answers: Liqo's API server checker on the consumer
/// reports it `Established`, so Liqo would not count it dead (unpeer it instead).
pub const PEER_ANSWERS: &str = "PEER_ANSWERS";
/// The Liqo gateways never connected.
pub const GATEWAY_NOT_CONNECTED: &str = "GATEWAY_NOT_CONNECTED";
/// Liqo authentication did not complete.
pub const AUTHENTICATION: &str = "AUTHENTICATION";
/// The peering's resources (slice, virtual node) did not appear.
pub const RESOURCES: &str = "RESOURCES";
/// The virtual node did not become ready.
pub const VIRTUAL_NODE: &str = "VIRTUAL_NODE";
/// The peering was not established.
pub const NOT_ESTABLISHED: &str = "NOT_ESTABLISHED";
/// A peer finds the pair partly peered by an earlier Ferry task: some of the objects it
/// would apply exist, labelled for the pair, and some do not (an undo that did not finish,
/// or a peering of another direction). Unpeer the pair first.
pub const PARTLY_PEERED: &str = "PARTLY_PEERED";
/// A cluster has more than one Liqo tenant namespace for the same remote, which Liqo
/// refuses too (`GetNamespace`: "multiple tenant namespaces found").
pub const TENANT_NAMESPACES: &str = "TENANT_NAMESPACES";
/// The Submariner add-on is not installed on the hub or a cluster.
pub const SUBMARINER_MISSING: &str = "SUBMARINER_MISSING";
/// The Submariner add-on did not become available.
pub const SUBMARINER_NOT_AVAILABLE: &str = "SUBMARINER_NOT_AVAILABLE";

// Offload.
/// A target cluster is not peered with the offloading one.
pub const NOT_PEERED: &str = "NOT_PEERED";
/// The namespace to offload does not exist.
pub const NAMESPACE_MISSING: &str = "NAMESPACE_MISSING";
/// The Deployment to burst does not exist.
pub const DEPLOYMENT_MISSING: &str = "DEPLOYMENT_MISSING";
/// What is asked does not fit the clusters' free capacity (a burst's overflow, a
/// component's replicas).
pub const NO_ROOM: &str = "NO_ROOM";
/// The NamespaceOffloading failed.
pub const OFFLOADING_FAILED: &str = "OFFLOADING_FAILED";
/// The twin namespace did not appear on a target.
pub const TWIN_MISSING: &str = "TWIN_MISSING";
/// Overflow pods were not scheduled onto virtual nodes.
pub const SCHEDULING: &str = "SCHEDULING";
/// A burst needs to offload a namespace another task (or someone else) offloaded, and not
/// to every cluster the overflow needs.
pub const ALREADY_OFFLOADED: &str = "ALREADY_OFFLOADED";

// Plan.
/// A plan's child task ended otherwise than Succeeded (failed and reverted itself, was
/// rejected, cancelled, or its revert failed): the plan fails and undoes what it did.
pub const CHILD_FAILED: &str = "CHILD_FAILED";
/// A child's revert ended RevertFailed: the plan's undo stops there (a new Revert of the
/// plan retries it).
pub const CHILD_REVERT_FAILED: &str = "CHILD_REVERT_FAILED";
/// A `${steps...}` reference in a child's spec names nothing in the earlier child's output.
pub const REF_UNRESOLVED: &str = "REF_UNRESOLVED";
/// A child's spec does not encode as its kind's record.
pub const CHILD_SPEC: &str = "CHILD_SPEC";
/// A plan step chooses its clusters by labels or a ManagedClusterSet, and the plan worker
/// was given no hub to read them from.
pub const NO_HUB: &str = "NO_HUB";
/// A plan step's clusters could not be chosen: its ManagedClusterSet does not exist, or it
/// selects none, or too many.
pub const CLUSTERS_UNCHOSEN: &str = "CLUSTERS_UNCHOSEN";
/// Submitting a child, or following or reverting it, failed on Kafka's side (retried).
pub const CHILDREN_UNREACHABLE: &str = "CHILDREN_UNREACHABLE";

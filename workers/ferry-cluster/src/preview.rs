//! A create-cluster command's dry run on the hub (`ferry submit create-cluster --dry-run
//! --kubeconfig HUB`): its plan, its `check` run as a task runs it (the providers served,
//! the name free, the ClusterClass and its variables), then what `apply` would write:
//! the namespace when it is missing, and each Cluster API object [`render::objects`]
//! renders with the check's topology, sent to the hub as a server-side dry run, so Cluster
//! API's CRD schemas and webhooks (cluster-api `internal/webhooks/cluster.go`,
//! `machinedeployment.go`) judge them as they would the run's. Scale: the counts before
//! and after; delete: what would go. The steps after `apply` act on a cluster that does
//! not exist yet (add-ons, the OCM join): named, not previewed. Nothing is written.

use ferry_kube::dry_run::{self, ObjectPreview, Preview};
use ferry_kube::{ClusterError, HUB};
use ferry_task::dry_run::Verdict;
use serde_json::json;

use crate::handler::{ClusterConfig, ClusterHandler};
use crate::render::{self, MANAGED_BY, MANAGER};
use crate::spec::{ClusterCommand, ClusterOperation};
use crate::steps::{check, delete, scale};

/// The task id the dry run renders into the objects' annotation.
const DRY_RUN_TASK: &str = "dry-run";

/// The dry run of `cmd` against the hub of `cfg`; `Err` only when the hub could not be
/// asked about an object.
pub async fn preview(cfg: &ClusterConfig, subject: &str, cmd: &ClusterCommand) -> Result<Preview, ClusterError> {
    let handler = ClusterHandler::new(cfg.clone());
    let mut p = Preview::new(ferry_task::dry_run::checks(&handler, subject, cmd, ferry_task::dry_run::BOUND).await);
    if p.checked.verdict != Verdict::Passes {
        return Ok(p);
    }
    let (ns, name) = (cmd.namespace(), cmd.name.as_str());
    match cmd.operation {
        ClusterOperation::Create => {
            let checked = check::CHECK.from_outputs(&p.checked.outputs).unwrap_or_default();
            let objects = render::objects(cmd, DRY_RUN_TASK, &checked.topology);
            if checked.namespace_existed {
                for o in &objects {
                    p.objects.push(dry_run::apply(&cfg.clusters, HUB, o, MANAGER).await?);
                }
            } else {
                // The API server refuses objects in a namespace that does not exist (its
                // NamespaceLifecycle admission), dry run or not: the namespace is judged,
                // what goes in it is named.
                let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {MANAGED_BY.0: MANAGED_BY.1}}});
                p.objects.push(dry_run::apply(&cfg.clusters, HUB, &namespace, MANAGER).await?);
                p.objects.extend(objects.iter().map(|o| ObjectPreview::not_sent(HUB, o, format!("namespace {ns} does not exist yet: the run creates it first"))));
            }
            let addons: Vec<&str> = cmd.addons.iter().map(|a| a.name.as_str()).collect();
            if !addons.is_empty() {
                p.notes.push(format!("once {name} answers, its add-ons {} are applied on it", addons.join(", ")));
            }
            if cmd.ocm.enabled {
                p.notes.push(format!(
                    "then {name} joins the hub: its Klusterlet registers ManagedCluster {name}, accepted into ManagedClusterSet {}",
                    cmd.ocm.cluster_set.as_deref().unwrap_or("default")
                ));
            }
        }
        ClusterOperation::Scale => {
            let before = scale::CHECK.from_outputs(&p.checked.outputs).unwrap_or_default();
            p.notes.push(format!(
                "Cluster {ns}/{name}: control plane {} → {}, workers {} → {}",
                before.control_plane,
                cmd.control_plane_count(),
                before.workers,
                cmd.worker_count()
            ));
        }
        ClusterOperation::Delete => {
            let registered = delete::CHECK.from_outputs(&p.checked.outputs).is_some_and(|c| c.registered);
            if registered {
                let mc = json!({"apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster", "metadata": {"name": name}});
                p.objects.push(ObjectPreview::deleted(HUB, &mc, "deregistered first, with its Klusterlet"));
            }
            let cluster = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "metadata": {"name": name, "namespace": ns}});
            p.objects.push(ObjectPreview::deleted(HUB, &cluster, "its providers remove its machines; then the templates Ferry rendered for it go (cannot be undone)"));
        }
    }
    Ok(p)
}

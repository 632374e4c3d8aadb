//! Strimzi resources generated from `topics/topics.yaml`: one KafkaTopic per topic and one
//! KafkaUser (SCRAM-SHA-512) per worker and for the tracker/dashboard, each with
//! least-privilege ACLs derived from the same definitions, so names never drift.
//! Tenants (from a policy, `examples/tenants.yaml` for the committed files) get their own
//! command topics and a KafkaUser that may write only those.
//! `strimzi/kafka-topics.yaml`, `strimzi/kafka-users.yaml` and `strimzi/kafka-tenants.yaml`
//! are this module's output;
//! a test fails when they are out of date (`FERRY_BLESS=1` rewrites them). The kinds are
//! the registered ones ([`crate::kind::catalogue`]); what a kind's workers touch beyond
//! their own topics comes from its [`crate::kind::Access`]. `tests/ship.rs` holds the
//! authorization matrix over the kinds Ferry ships.

use serde_json::{Value, json};

use crate::kind::{KindInfo, TaskKind, catalogue};
use crate::tenants::Policy;
use crate::topics::{Purpose, Topics};

/// The registered kinds that run in production: all but the runtime's own `test` kind,
/// which is for development.
pub fn worker_kinds() -> Vec<&'static KindInfo> {
    catalogue().into_iter().filter(|i| i.kind != TaskKind::TEST).collect()
}

/// Label that ties a resource to its Strimzi `Kafka` cluster.
const CLUSTER_LABEL: &str = "strimzi.io/cluster";

fn header(kind: &str, name: &str, cluster: &str) -> Value {
    json!({
        "apiVersion": "kafka.strimzi.io/v1",
        "kind": kind,
        "metadata": {"name": name, "labels": {CLUSTER_LABEL: cluster, "app.kubernetes.io/part-of": "ferry"}},
    })
}

/// A Kubernetes name for a topic (dots are allowed; the name is kept as `topicName`).
fn resource_name(topic: &str) -> String {
    topic.replace(['.', '_'], "-")
}

/// One KafkaTopic per topic, with partitions, replicas and configs.
pub fn kafka_topics(topics: &Topics, cluster: &str) -> Vec<Value> {
    topics
        .all()
        .iter()
        .filter(|t| t.kind != Some(TaskKind::TEST))
        .map(|t| {
            let mut doc = header("KafkaTopic", &resource_name(&t.name), cluster);
            doc["spec"] = json!({
                "topicName": t.name,
                "partitions": t.partitions,
                "replicas": t.replication_factor,
                "config": t.config,
            });
            doc
        })
        .collect()
}

fn acl(resource_type: &str, name: &str, pattern: &str, ops: &[&str]) -> Value {
    json!({"resource": {"type": resource_type, "name": name, "patternType": pattern}, "operations": ops})
}

fn user(name: &str, cluster: &str, acls: Vec<Value>) -> Value {
    let mut doc = header("KafkaUser", name, cluster);
    doc["spec"] = json!({
        "authentication": {"type": "scram-sha-512"},
        "authorization": {"type": "simple", "acls": acls},
    });
    doc
}

/// The consumer group of a kind's workers (as `WorkerOptions` names it).
pub fn worker_group(kind: TaskKind) -> String {
    format!("ferry-{kind}")
}

/// Group id of assign-only readers (state views, trackers); nothing is committed.
pub const READER_GROUP: &str = "ferry-reader";

/// The consumer group of a kind's tenant gateways.
pub fn gateway_group(kind: TaskKind) -> String {
    format!("ferry-gateway-{kind}")
}

/// The KafkaUser of a tenant.
pub fn tenant_user(tenant: &str) -> String {
    format!("ferry-tenant-{tenant}")
}

/// One KafkaTopic per tenant command topic of `policy`.
pub fn tenant_topics(topics: &Topics, policy: &Policy, cluster: &str) -> Vec<Value> {
    topics
        .tenant_topics(policy)
        .iter()
        .map(|t| {
            let mut doc = header("KafkaTopic", &resource_name(&t.name), cluster);
            doc["spec"] = json!({"topicName": t.name, "partitions": t.partitions, "replicas": t.replication_factor, "config": t.config});
            doc
        })
        .collect()
}

/// One KafkaUser per tenant of `policy` (`ferry-tenant-<tenant>`): it writes its own
/// command topics (one prefixed ACL, `ferry.tenants.<tenant>.`) and nothing else, and reads
/// its own progress topic (`ferry.tenant-progress.<tenant>`, where the workers copy its
/// tasks' events) to follow, cancel and revert its tasks: not `ferry.progress` nor the
/// task state, which hold every tenant's tasks. That the broker refuses any other write is
/// what makes the topic name the sender.
pub fn tenant_users(topics: &Topics, policy: &Policy, cluster: &str) -> Vec<Value> {
    policy
        .tenants()
        .map(|tenant| {
            let acls = vec![
                acl("topic", &topics.tenant_prefix(tenant), "prefix", &["Write", "Describe"]),
                acl("topic", &topics.tenant_progress(tenant).name, "literal", &["Read", "Describe"]),
                acl("group", READER_GROUP, "literal", &["Read"]),
            ];
            user(&tenant_user(tenant), cluster, acls)
        })
        .collect()
}

/// One KafkaUser per worker kind (`ferry-worker-<kind>`), `ferry-tracker` (operators'
/// CLI) and `ferry-dashboard`: a worker reads its command topic and the task state, and
/// writes progress, state and dead letters; its gateway reads its kind's tenant topics of
/// `policy` and writes its command topic; the score worker also writes scores, the
/// deploy worker reads scores; the tracker reads progress, state, scores and dead letters
/// and writes commands (an operator's: no tenant policy applies to them); the dashboard
/// reads what its pages show (progress, state, scores: not dead letters, which carry
/// whatever bytes a producer sent) and writes commands for its actions (cancel, revert,
/// signal). Its own principal: a leaked dashboard password is not an operator's, the
/// broker's audit log tells the two apart, and either can be revoked alone.
pub fn kafka_users(topics: &Topics, policy: &Policy, cluster: &str) -> Vec<Value> {
    let name_of = |p: Purpose| topics.all().iter().find(|t| t.purpose == p).map(|t| t.name.clone()).unwrap_or_default();
    let (progress, dead, scores) = (name_of(Purpose::Progress), name_of(Purpose::DeadLetter), name_of(Purpose::Scores));
    let mut users = Vec::new();
    let kinds = worker_kinds();
    for info in &kinds {
        let kind = info.kind;
        let commands = topics.command(kind).name.clone();
        let mut acls = vec![
            acl("topic", &commands, "literal", &["Read", "Describe"]),
            acl("group", &worker_group(kind), "literal", &["Read"]),
            acl("group", READER_GROUP, "literal", &["Read"]),
            acl("topic", &progress, "literal", &["Write", "Describe"]),
            // Its own kind's task state only: no worker rewrites another kind's tasks.
            acl("topic", &topics.task_state(kind).name, "literal", &["Read", "Write", "Describe"]),
            acl("topic", &dead, "literal", &["Write", "Describe"]),
        ];
        let tenants = policy.tenants_of(kind);
        if !tenants.is_empty() {
            acls.push(acl("group", &gateway_group(kind), "literal", &["Read"]));
            for t in tenants {
                acls.push(acl("topic", &topics.tenant_command(t, kind).name, "literal", &["Read", "Describe"]));
            }
        }
        // The copies of tenants' tasks' events, and of refusals of their commands (a
        // tenant's plan may send a child of a kind the tenant has no rule for: refused, and
        // told to the tenant).
        for t in policy.tenants() {
            acls.push(acl("topic", &topics.tenant_progress(t).name, "literal", &["Write", "Describe"]));
        }
        if info.access.writes_own_commands || !policy.tenants_of(kind).is_empty() {
            // E.g. the score worker's onboarding scorings; the gateway's forwarded commands.
            acls.push(acl("topic", &commands, "literal", &["Write"]));
        }
        if info.access.writes_scores {
            acls.push(acl("topic", &scores, "literal", &["Write", "Describe"]));
        }
        if info.access.reads_scores {
            acls.push(acl("topic", &scores, "literal", &["Read", "Describe"]));
        }
        if info.access.submits_children {
            // Its children: Start and Revert commands of the other kinds, and their
            // snapshots (its live view follows every task-state topic). It reads no
            // other command topic and writes no other task state.
            for other in kinds.iter().map(|i| i.kind).filter(|k| *k != kind) {
                acls.push(acl("topic", &topics.command(other).name, "literal", &["Write", "Describe"]));
                acls.push(acl("topic", &topics.task_state(other).name, "literal", &["Read", "Describe"]));
            }
        }
        users.push(user(&format!("ferry-worker-{kind}"), cluster, acls));
    }
    // An operator's reader: progress, every kind's task state but the test kind's, scores
    // and (`dead`) dead letters; and the command topics to write.
    let reader = |dead: Option<&String>| {
        let mut acls = vec![acl("group", READER_GROUP, "literal", &["Read"])];
        for t in [Some(&progress), Some(&scores), dead].into_iter().flatten() {
            acls.push(acl("topic", t, "literal", &["Read", "Describe"]));
        }
        for t in topics.task_states().filter(|t| t.kind != Some(TaskKind::TEST)) {
            acls.push(acl("topic", &t.name, "literal", &["Read", "Describe"]));
        }
        for info in &kinds {
            acls.push(acl("topic", &topics.command(info.kind).name, "literal", &["Write", "Describe"]));
        }
        acls
    };
    users.push(user("ferry-tracker", cluster, reader(Some(&dead))));
    users.push(user(DASHBOARD_USER, cluster, reader(None)));
    users
}

/// The dashboard's KafkaUser (see [`kafka_users`]).
pub const DASHBOARD_USER: &str = "ferry-dashboard";

/// Documents as one multi-document YAML text, with a header comment.
pub fn to_yaml(docs: &[Value], what: &str) -> String {
    let mut out = format!("# {what}\n# Generated from topics/topics.yaml and examples/tenants.yaml by ferry_runtime::strimzi; do not edit.\n# Regenerate: FERRY_BLESS=1 cargo test --test ship\n");
    for d in docs {
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(d).expect("JSON values serialize"));
    }
    out
}

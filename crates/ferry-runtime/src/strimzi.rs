//! Strimzi resources generated from `topics/topics.yaml`: one KafkaTopic per topic and one
//! KafkaUser (SCRAM-SHA-512) per worker and for the tracker/dashboard, each with
//! least-privilege ACLs derived from the same definitions, so names never drift.
//! Tenants (from a policy, `examples/tenants.yaml` for the committed files) get their own
//! command topics and a KafkaUser that may write only those.
//! `strimzi/kafka-topics.yaml`, `strimzi/kafka-users.yaml` and `strimzi/kafka-tenants.yaml`
//! are this module's output;
//! a test fails when they are out of date (`FERRY_BLESS=1` rewrites them).

use serde_json::{Value, json};

use crate::kind::TaskKind;
use crate::tenants::Policy;
use crate::topics::{Purpose, Topics};

/// The worker kinds that run in production (the `test` kind is for development).
pub const WORKER_KINDS: [TaskKind; 6] = [TaskKind::CreateCluster, TaskKind::Peer, TaskKind::Offload, TaskKind::Deploy, TaskKind::Score, TaskKind::Plan];

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
        .filter(|t| t.kind != Some(TaskKind::Test))
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
        .tenant_commands(policy)
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
/// progress and task state to follow, cancel and revert its tasks. That the broker refuses
/// any other write is what makes the topic name the sender.
pub fn tenant_users(topics: &Topics, policy: &Policy, cluster: &str) -> Vec<Value> {
    policy
        .tenants()
        .map(|tenant| {
            let mut acls = vec![
                acl("topic", &topics.tenant_prefix(tenant), "prefix", &["Write", "Describe"]),
                acl("topic", &topics.progress().name, "literal", &["Read", "Describe"]),
                acl("group", READER_GROUP, "literal", &["Read"]),
            ];
            for t in topics.task_states().filter(|t| t.kind != Some(TaskKind::Test)) {
                acls.push(acl("topic", &t.name, "literal", &["Read", "Describe"]));
            }
            user(&tenant_user(tenant), cluster, acls)
        })
        .collect()
}

/// One KafkaUser per worker kind (`ferry-worker-<kind>`) and `ferry-tracker` (CLI and
/// dashboard): a worker reads its command topic and the task state, and writes
/// progress, state and dead letters; its gateway reads its kind's tenant topics of
/// `policy` and writes its command topic; the score worker also writes scores, the
/// deploy worker reads scores; the tracker reads progress, state, scores and dead letters
/// and writes commands (an operator's: no tenant policy applies to them).
pub fn kafka_users(topics: &Topics, policy: &Policy, cluster: &str) -> Vec<Value> {
    let name_of = |p: Purpose| topics.all().iter().find(|t| t.purpose == p).map(|t| t.name.clone()).unwrap_or_default();
    let (progress, dead, scores) = (name_of(Purpose::Progress), name_of(Purpose::DeadLetter), name_of(Purpose::Scores));
    let mut users = Vec::new();
    for kind in WORKER_KINDS {
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
        if kind == TaskKind::Score || !policy.tenants_of(kind).is_empty() {
            // The onboarding watcher's scorings; the gateway's forwarded commands.
            acls.push(acl("topic", &commands, "literal", &["Write"]));
        }
        match kind {
            TaskKind::Score => {
                acls.push(acl("topic", &scores, "literal", &["Write", "Describe"]));
            }
            TaskKind::Deploy => acls.push(acl("topic", &scores, "literal", &["Read", "Describe"])),
            TaskKind::Plan => {
                // Its children: Start and Revert commands of the other kinds, and their
                // snapshots (its live view follows every task-state topic). It reads no
                // other command topic and writes no other task state.
                for other in WORKER_KINDS.into_iter().filter(|k| *k != TaskKind::Plan) {
                    acls.push(acl("topic", &topics.command(other).name, "literal", &["Write", "Describe"]));
                    acls.push(acl("topic", &topics.task_state(other).name, "literal", &["Read", "Describe"]));
                }
            }
            _ => {}
        }
        users.push(user(&format!("ferry-worker-{kind}"), cluster, acls));
    }
    let mut acls = vec![acl("group", READER_GROUP, "literal", &["Read"])];
    for t in [&progress, &scores, &dead] {
        acls.push(acl("topic", t, "literal", &["Read", "Describe"]));
    }
    for t in topics.task_states().filter(|t| t.kind != Some(TaskKind::Test)) {
        acls.push(acl("topic", &t.name, "literal", &["Read", "Describe"]));
    }
    for kind in WORKER_KINDS {
        acls.push(acl("topic", &topics.command(kind).name, "literal", &["Write", "Describe"]));
    }
    users.push(user("ferry-tracker", cluster, acls));
    users
}

/// Documents as one multi-document YAML text, with a header comment.
pub fn to_yaml(docs: &[Value], what: &str) -> String {
    let mut out = format!("# {what}\n# Generated from topics/topics.yaml and examples/tenants.yaml by ferry_runtime::strimzi; do not edit.\n# Regenerate: FERRY_BLESS=1 cargo test --test ship\n");
    for d in docs {
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(d).expect("JSON values serialize"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kafka's `AclAuthorizer` on a user's allow-ACLs: a literal name or a prefix, the
    /// operation or `All`; Read, Write, Delete and Alter imply Describe.
    fn allows(user: &Value, resource_type: &str, name: &str, op: &str) -> bool {
        user["spec"]["authorization"]["acls"].as_array().unwrap().iter().any(|a| {
            let r = &a["resource"];
            let rname = r["name"].as_str().unwrap();
            let matched = r["type"] == resource_type
                && match r["patternType"].as_str().unwrap() {
                    "prefix" => name.starts_with(rname),
                    _ => rname == name || rname == "*",
                };
            let ops: Vec<&str> = a["operations"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
            matched && (ops.contains(&op) || ops.contains(&"All") || (op == "Describe" && ops.iter().any(|o| ["Read", "Write", "Delete", "Alter"].contains(o))))
        })
    }

    /// Who may write what, for every principal and topic of an installation with tenants:
    /// a tenant writes its own command topics only; a worker reads its own kind's tenant
    /// topics; no tenant writes a kind's command topic, the task state or another tenant's.
    #[test]
    fn authorization_matrix_of_tenants_workers_and_tracker() {
        let topics = Topics::standard();
        let policy = Policy::parse("tenants: {web: {deploy: {clusters: ['*']}, score: {}}, ops: {peer: {}}}").unwrap();
        let mut users = kafka_users(&topics, &policy, "ferry");
        users.extend(tenant_users(&topics, &policy, "ferry"));
        let by_name = |n: &str| users.iter().find(|u| u["metadata"]["name"] == n).unwrap_or_else(|| panic!("no user {n}"));
        let mut all_topics: Vec<String> = topics.all().iter().map(|t| t.name.clone()).collect();
        all_topics.extend(topics.tenant_commands(&policy).into_iter().map(|t| t.name));
        // A topic named like another tenant's that the policy does not have.
        all_topics.push(topics.tenant_command("mallory", TaskKind::Deploy).name);
        for topic in &all_topics {
            let web = by_name("ferry-tenant-web");
            assert_eq!(allows(web, "topic", topic, "Write"), topic.starts_with("ferry.tenants.web."), "web writes {topic}");
            let ops = by_name("ferry-tenant-ops");
            assert_eq!(allows(ops, "topic", topic, "Write"), topic.starts_with("ferry.tenants.ops."), "ops writes {topic}");
            for kind in WORKER_KINDS {
                let w = by_name(&format!("ferry-worker-{kind}"));
                let tenant_topic = topic.starts_with("ferry.tenants.");
                if tenant_topic {
                    let own = policy.tenants_of(kind).iter().any(|t| *topic == topics.tenant_command(t, kind).name);
                    assert_eq!(allows(w, "topic", topic, "Read"), own, "{kind} worker reads {topic}");
                    assert!(!allows(w, "topic", topic, "Write"), "{kind} worker writes {topic}");
                }
                if topic.starts_with("ferry.task-state.") {
                    let own = *topic == topics.task_state(kind).name;
                    assert_eq!(allows(w, "topic", topic, "Write"), own, "{kind} worker writes {topic}");
                }
                if topic.starts_with("ferry.commands.") {
                    let own = *topic == topics.command(kind).name;
                    assert_eq!(allows(w, "topic", topic, "Read"), own, "{kind} worker reads {topic}");
                    // The plan worker submits and reverts its children: it writes the
                    // other production kinds' command topics (never the test kind's).
                    let child = kind == TaskKind::Plan && WORKER_KINDS.iter().any(|k| *topic == topics.command(*k).name);
                    if !own {
                        assert_eq!(allows(w, "topic", topic, "Write"), child, "{kind} worker writes {topic}");
                    }
                }
            }
            if topic.starts_with("ferry.task-state.") {
                for tenant in [web, ops] {
                    assert!(!allows(tenant, "topic", topic, "Write"), "a tenant writes {topic}");
                }
            }
            let tracker = by_name("ferry-tracker");
            assert!(!allows(tracker, "topic", topic, "Write") || topic.starts_with("ferry.commands."), "the tracker writes {topic}");
        }
        // Each gateway's group belongs to its kind's worker only.
        assert!(allows(by_name("ferry-worker-deploy"), "group", &gateway_group(TaskKind::Deploy), "Read"));
        assert!(!allows(by_name("ferry-worker-peer"), "group", &gateway_group(TaskKind::Deploy), "Read"));
        assert!(!allows(by_name("ferry-tenant-web"), "group", &gateway_group(TaskKind::Deploy), "Read"));
    }

    #[test]
    fn every_worker_reads_only_its_own_command_topic() {
        let topics = Topics::standard();
        let users = kafka_users(&topics, &Policy::default(), "ferry");
        assert_eq!(users.len(), WORKER_KINDS.len() + 1);
        for (kind, u) in WORKER_KINDS.iter().zip(&users) {
            let reads: Vec<&str> = u["spec"]["authorization"]["acls"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|a| a["resource"]["type"] == "topic" && a["operations"].as_array().unwrap().iter().any(|o| o == "Read"))
                .filter_map(|a| a["resource"]["name"].as_str())
                .filter(|n| n.contains("commands"))
                .collect();
            assert_eq!(reads, [topics.command(*kind).name.as_str()], "{kind}");
        }
        let compacted: Vec<String> = kafka_topics(&topics, "ferry")
            .iter()
            .filter(|t| t["spec"]["config"]["cleanup.policy"] == "compact")
            .map(|t| t["spec"]["topicName"].as_str().unwrap().to_owned())
            .collect();
        let mut expected: Vec<String> = WORKER_KINDS.iter().map(|k| format!("ferry.task-state.{k}")).collect();
        expected.push("ferry.scores".into());
        assert_eq!(compacted, expected);
    }
}

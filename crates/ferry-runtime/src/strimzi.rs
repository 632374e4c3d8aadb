//! Strimzi resources generated from `topics/topics.yaml`: one KafkaTopic per topic and one
//! KafkaUser (SCRAM-SHA-512) per worker and for the tracker/dashboard, each with
//! least-privilege ACLs derived from the same definitions, so names never drift.
//! `strimzi/kafka-topics.yaml` and `strimzi/kafka-users.yaml` are this module's output;
//! a test fails when they are out of date (`FERRY_BLESS=1` rewrites them).

use serde_json::{Value, json};

use crate::kind::TaskKind;
use crate::topics::{Purpose, Topics};

/// The worker kinds that run in production (the `test` kind is for development).
pub const WORKER_KINDS: [TaskKind; 5] = [TaskKind::CreateCluster, TaskKind::Peer, TaskKind::Offload, TaskKind::Deploy, TaskKind::Score];

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

/// One KafkaUser per worker kind (`ferry-worker-<kind>`) and `ferry-tracker` (CLI and
/// dashboard): a worker reads its command topic and the task state, and writes
/// progress, state and dead letters; the score worker also writes scores and its own
/// command topic (the onboarding watcher), the deploy worker reads scores; the tracker
/// reads progress, state, scores and dead letters and writes commands.
pub fn kafka_users(topics: &Topics, cluster: &str) -> Vec<Value> {
    let name_of = |p: Purpose| topics.all().iter().find(|t| t.purpose == p).map(|t| t.name.clone()).unwrap_or_default();
    let (progress, state, dead, scores) = (name_of(Purpose::Progress), name_of(Purpose::TaskState), name_of(Purpose::DeadLetter), name_of(Purpose::Scores));
    let mut users = Vec::new();
    for kind in WORKER_KINDS {
        let commands = topics.command(kind).name.clone();
        let mut acls = vec![
            acl("topic", &commands, "literal", &["Read", "Describe"]),
            acl("group", &worker_group(kind), "literal", &["Read"]),
            acl("group", READER_GROUP, "literal", &["Read"]),
            acl("topic", &progress, "literal", &["Write", "Describe"]),
            acl("topic", &state, "literal", &["Read", "Write", "Describe"]),
            acl("topic", &dead, "literal", &["Write", "Describe"]),
        ];
        match kind {
            TaskKind::Score => {
                acls.push(acl("topic", &scores, "literal", &["Write", "Describe"]));
                acls.push(acl("topic", &commands, "literal", &["Write"]));
            }
            TaskKind::Deploy => acls.push(acl("topic", &scores, "literal", &["Read", "Describe"])),
            _ => {}
        }
        users.push(user(&format!("ferry-worker-{kind}"), cluster, acls));
    }
    let mut acls = vec![acl("group", READER_GROUP, "literal", &["Read"])];
    for t in [&progress, &state, &scores, &dead] {
        acls.push(acl("topic", t, "literal", &["Read", "Describe"]));
    }
    for kind in WORKER_KINDS {
        acls.push(acl("topic", &topics.command(kind).name, "literal", &["Write", "Describe"]));
    }
    users.push(user("ferry-tracker", cluster, acls));
    users
}

/// Documents as one multi-document YAML text, with a header comment.
pub fn to_yaml(docs: &[Value], what: &str) -> String {
    let mut out = format!("# {what}\n# Generated from topics/topics.yaml by ferry_runtime::strimzi; do not edit.\n# Regenerate: FERRY_BLESS=1 cargo test --test ship\n");
    for d in docs {
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(d).expect("JSON values serialize"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_worker_reads_only_its_own_command_topic() {
        let topics = Topics::standard();
        let users = kafka_users(&topics, "ferry");
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
        assert_eq!(compacted, ["ferry.task-state", "ferry.scores"]);
    }
}

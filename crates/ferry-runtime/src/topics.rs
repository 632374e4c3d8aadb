//! Topic names and configs, read from `topics/topics.yaml` (the single definition); the
//! per-kind topics (`{kind}` in their names) are made for every registered kind, and for
//! any other kind asked for by name.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::Deserialize;

use crate::kind::TaskKind;

const TOPICS_YAML: &str = include_str!("../../../topics/topics.yaml");

/// What a topic carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Purpose {
    /// Commands of one task kind.
    Command,
    /// Progress events of every task.
    Progress,
    /// Latest snapshot of every task (compacted).
    TaskState,
    /// Records that could not be decoded or validated.
    DeadLetter,
    /// Latest placement scores (compacted).
    Scores,
}

/// One topic as `topics/topics.yaml` defines it, defaults applied.
#[derive(Debug, Clone)]
pub struct TopicDef {
    /// Full name, prefix included.
    pub name: String,
    /// What it carries.
    pub purpose: Purpose,
    /// For command topics, the kind they carry.
    pub kind: Option<TaskKind>,
    /// Partition count.
    pub partitions: i32,
    /// Replication factor on a real cluster.
    pub replication_factor: i32,
    /// Topic-level configs (`cleanup.policy`, `retention.ms`, ...).
    pub config: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct File {
    defaults: Defaults,
    topics: Vec<RawTopic>,
}

#[derive(Deserialize)]
struct Defaults {
    partitions: i32,
    replication_factor: i32,
    #[serde(default)]
    config: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTopic {
    name: String,
    purpose: Purpose,
    partitions: Option<i32>,
    replication_factor: Option<i32>,
    #[serde(default)]
    config: BTreeMap<String, String>,
}

/// The set of topics one Ferry installation uses.
///
/// A prefix isolates installations (and tests) that share one broker.
#[derive(Debug, Clone)]
pub struct Topics {
    defs: Vec<TopicDef>,
    /// The per-kind topics' definitions, `{kind}` still in their names.
    per_kind: Vec<TopicDef>,
    prefix: String,
}

/// What stands for the kind in a per-kind topic's name.
const KIND_PLACEHOLDER: &str = "{kind}";

impl TopicDef {
    fn for_kind(&self, kind: TaskKind) -> TopicDef {
        TopicDef { name: self.name.replace(KIND_PLACEHOLDER, kind.as_str()), kind: Some(kind), ..self.clone() }
    }
}

impl Topics {
    /// The topics of `topics/topics.yaml` as they are named there.
    pub fn standard() -> Self {
        Self::with_prefix("")
    }

    /// The standard topics with `prefix` in front of every name.
    pub fn with_prefix(prefix: &str) -> Self {
        // The file is compiled in and checked by a unit test, so a parse error is a build bug.
        let file: File = serde_yaml_ng::from_str(TOPICS_YAML).expect("topics/topics.yaml is valid");
        let kinds = crate::kind::registered();
        let mut defs = Vec::new();
        let mut per_kind = Vec::new();
        for t in file.topics {
            let mut config = file.defaults.config.clone();
            config.extend(t.config);
            let def = TopicDef {
                name: format!("{prefix}{}", t.name),
                purpose: t.purpose,
                kind: None,
                partitions: t.partitions.unwrap_or(file.defaults.partitions),
                replication_factor: t.replication_factor.unwrap_or(file.defaults.replication_factor),
                config,
            };
            if def.name.contains(KIND_PLACEHOLDER) {
                defs.extend(kinds.iter().map(|k| def.for_kind(*k)));
                per_kind.push(def);
            } else {
                defs.push(def);
            }
        }
        Self { defs, per_kind, prefix: prefix.to_owned() }
    }

    /// A registered kind's topic as made at construction (no copy: workers look their
    /// task-state topic up on every snapshot they write); another kind's made from the
    /// template.
    fn of_kind(&self, purpose: Purpose, kind: TaskKind) -> Cow<'_, TopicDef> {
        if let Some(d) = self.defs.iter().find(|d| d.purpose == purpose && d.kind == Some(kind)) {
            return Cow::Borrowed(d);
        }
        Cow::Owned(self.per_kind.iter().find(|d| d.purpose == purpose).map(|d| d.for_kind(kind)).expect("topics.yaml defines the per-kind topics"))
    }

    /// Every topic.
    pub fn all(&self) -> &[TopicDef] {
        &self.defs
    }

    fn by_purpose(&self, purpose: Purpose) -> &TopicDef {
        self.defs
            .iter()
            .find(|d| d.purpose == purpose)
            .expect("topics.yaml defines every purpose")
    }

    /// The command topic of `kind`.
    pub fn command(&self, kind: TaskKind) -> Cow<'_, TopicDef> {
        self.of_kind(Purpose::Command, kind)
    }

    /// The command topic `tenant` writes `kind` commands to, `ferry.tenants.<tenant>.<kind>`
    /// (the kind's command topic's partitions and configs): one prefix per tenant, so that
    /// one prefixed write ACL gives a tenant its topics and nothing else.
    pub fn tenant_command(&self, tenant: &str, kind: TaskKind) -> TopicDef {
        TopicDef { name: format!("{}{kind}", self.tenant_prefix(tenant)), ..self.command(kind).into_owned() }
    }

    /// The prefix of every topic of `tenant`.
    pub fn tenant_prefix(&self, tenant: &str) -> String {
        format!("{}ferry.tenants.{tenant}.", self.prefix)
    }

    /// The tenants' command topics a policy calls for, tenant by tenant.
    pub fn tenant_commands(&self, policy: &crate::tenants::Policy) -> Vec<TopicDef> {
        policy.tenants().flat_map(|t| policy.kinds_of(t).into_iter().map(move |k| self.tenant_command(t, k))).collect()
    }

    /// The events of `tenant`'s tasks, `ferry.tenant-progress.<tenant>` (the progress
    /// topic's partitions and configs): the workers write each event of a tenant's task
    /// there too, and the tenant reads this topic instead of every task's
    /// `ferry.progress`. Outside the tenant's prefix, so its write ACL does not reach it.
    pub fn tenant_progress(&self, tenant: &str) -> TopicDef {
        TopicDef { name: self.tenant_progress_name(tenant), ..self.progress().clone() }
    }

    /// The name of [`Self::tenant_progress`] alone (the publisher's, for every event of a
    /// tenant's task).
    pub fn tenant_progress_name(&self, tenant: &str) -> String {
        format!("{}ferry.tenant-progress.{tenant}", self.prefix)
    }

    /// Every topic a policy's tenants need, tenant by tenant: their command topics and
    /// their progress topic.
    pub fn tenant_topics(&self, policy: &crate::tenants::Policy) -> Vec<TopicDef> {
        policy
            .tenants()
            .flat_map(|t| policy.kinds_of(t).into_iter().map(move |k| self.tenant_command(t, k)).chain(std::iter::once(self.tenant_progress(t))))
            .collect()
    }

    /// The progress topic.
    pub fn progress(&self) -> &TopicDef {
        self.by_purpose(Purpose::Progress)
    }

    /// The compacted task-state topic of `kind`'s tasks (only its workers write it).
    pub fn task_state(&self, kind: TaskKind) -> Cow<'_, TopicDef> {
        self.of_kind(Purpose::TaskState, kind)
    }

    /// Every registered kind's task-state topic.
    pub fn task_states(&self) -> impl Iterator<Item = &TopicDef> {
        self.defs.iter().filter(|d| d.purpose == Purpose::TaskState)
    }

    /// The dead-letter topic.
    pub fn dead_letter(&self) -> &TopicDef {
        self.by_purpose(Purpose::DeadLetter)
    }

    /// The compacted scores topic.
    pub fn scores(&self) -> &TopicDef {
        self.by_purpose(Purpose::Scores)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_a_command_topic_and_state_is_compacted() {
        let t = Topics::standard();
        // The runtime registers its test kind; a kind no crate here registers has its
        // topics by name all the same.
        for kind in [TaskKind::TEST, TaskKind::new("brand-new")] {
            assert_eq!(t.command(kind).name, format!("ferry.commands.{kind}"));
            assert_eq!(t.task_state(kind).name, format!("ferry.task-state.{kind}"));
            assert_eq!(t.task_state(kind).config.get("cleanup.policy").map(String::as_str), Some("compact"));
        }
        let kinds: Vec<TaskKind> = t.task_states().filter_map(|d| d.kind).collect();
        assert_eq!(kinds, crate::kind::registered());
        assert!(kinds.contains(&TaskKind::TEST));
        assert!(t.all().iter().all(|d| !d.name.contains(KIND_PLACEHOLDER)));
        assert_eq!(t.scores().config.get("cleanup.policy").map(String::as_str), Some("compact"));
        assert_eq!(t.progress().config.get("min.insync.replicas").map(String::as_str), Some("2"));
        assert_eq!(t.dead_letter().partitions, 3);
    }

    #[test]
    fn prefix_applies_to_every_name() {
        let t = Topics::with_prefix("t1.");
        assert!(t.all().iter().all(|d| d.name.starts_with("t1.ferry.")));
    }
}

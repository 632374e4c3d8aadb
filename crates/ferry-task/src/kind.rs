//! Task kinds: an open set of names, one command topic each. A worker crate registers its
//! kind with a [`KindInfo`] (`inventory::submit!`), and the runtime, the CLI, the topic and
//! ACL generators and the protocol documents learn of it from [`registered`]: adding a kind
//! changes none of them, and no record on the wire (the kind is an Avro string).
//!
//! Records written before kinds were open carried a closed Avro enum (`TaskKind`, symbols
//! such as `CreateCluster`); [`crate::wire::Registry::decode`] reads them through
//! [`from_legacy_symbol`].

use std::fmt;
use std::str::FromStr;

use std::collections::HashMap;

use apache_avro::schema::{Name, Namespace, Schema, derive::AvroSchemaComponent};
use serde::{Deserialize, Serialize};

/// The longest kind name (it names two topics and a consumer group).
pub const KIND_NAME_MAX: usize = 32;

/// What a task does; selects the command topic and the worker that owns it.
///
/// A name of at most [`KIND_NAME_MAX`] lower-case letters, digits and inner '-' (a DNS-1123
/// label, as it names topics), held inline so that a kind stays `Copy`. The kinds Ferry
/// ships are the associated constants; any other registers the same way.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TaskKind {
    len: u8,
    bytes: [u8; KIND_NAME_MAX],
}

/// A name that cannot be a task kind, or that no linked crate registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnknownKind {
    /// Not a kind name at all.
    #[error("{0:?} is not a task kind name: 1 to {KIND_NAME_MAX} lower-case letters, digits and inner '-'")]
    BadName(String),
    /// A well-formed name no worker registered in this program.
    #[error("unknown task kind {name:?}: expected one of {known}")]
    Unregistered {
        /// The name given.
        name: String,
        /// The registered kinds, comma-separated.
        known: String,
    },
}

const fn valid(b: &[u8]) -> bool {
    is_label(b, KIND_NAME_MAX)
}

/// A DNS-1123 label of at most `max` bytes: lowercase letters, digits and inner '-' (a
/// kind's name, a signal's).
pub(crate) const fn is_label(b: &[u8], max: usize) -> bool {
    if b.is_empty() || b.len() > max || b[0] == b'-' || b[b.len() - 1] == b'-' {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-') {
            return false;
        }
        i += 1;
    }
    true
}

impl TaskKind {
    /// Cluster API provisioning, scaling and deletion (`workers/ferry-cluster`).
    pub const CREATE_CLUSTER: TaskKind = TaskKind::new("create-cluster");
    /// Liqo or Submariner peering between two clusters (`workers/ferry-peer`).
    pub const PEER: TaskKind = TaskKind::new("peer");
    /// Liqo namespace offloading and bursting (`workers/ferry-offload`).
    pub const OFFLOAD: TaskKind = TaskKind::new("offload");
    /// Applications through OCM ManifestWork (`workers/ferry-deploy`).
    pub const DEPLOY: TaskKind = TaskKind::new("deploy");
    /// Cluster scoring for placement (`workers/ferry-score`).
    pub const SCORE: TaskKind = TaskKind::new("score");
    /// The runtime's own no-op task, for demos, tests and benchmarks (`ferry_runtime::testkind`).
    pub const TEST: TaskKind = TaskKind::new("test");
    /// Commands of the other kinds run as child tasks (`workers/ferry-plan`).
    pub const PLAN: TaskKind = TaskKind::new("plan");

    /// The kind named `name`; a name that is not a kind name fails to compile in a const
    /// (and panics elsewhere: use [`TaskKind::name`] for names from outside).
    pub const fn new(name: &str) -> TaskKind {
        let b = name.as_bytes();
        assert!(valid(b), "a task kind is 1 to 32 lower-case letters, digits and inner '-'");
        let mut bytes = [0u8; KIND_NAME_MAX];
        let mut i = 0;
        while i < b.len() {
            bytes[i] = b[i];
            i += 1;
        }
        TaskKind { len: b.len() as u8, bytes }
    }

    /// The kind named `name`, registered or not (a record may name a kind this program
    /// does not run; the command topic's kind decides what is accepted).
    pub fn name(name: &str) -> Result<TaskKind, UnknownKind> {
        if valid(name.as_bytes()) { Ok(TaskKind::new(name)) } else { Err(UnknownKind::BadName(name.to_owned())) }
    }

    /// The name used on the command line, in topic names and on the wire.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..self.len as usize]).expect("kind names are ASCII")
    }

    /// What the kind's registration says it does (the CLI's `--help` lists it); empty for
    /// a kind no linked crate registered.
    pub fn describe(&self) -> &'static str {
        info(*self).map(|i| i.describe).unwrap_or("")
    }
}

/// By name.
impl Ord for TaskKind {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl PartialOrd for TaskKind {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for TaskKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for TaskKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TaskKind({})", self.as_str())
    }
}

/// A registered kind by name: what the command line and configuration files accept.
impl FromStr for TaskKind {
    type Err = UnknownKind;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let kind = TaskKind::name(s)?;
        if info(kind).is_some() {
            return Ok(kind);
        }
        let known = registered().iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ");
        Err(UnknownKind::Unregistered { name: s.to_owned(), known })
    }
}

impl Serialize for TaskKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for TaskKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Name;
        impl serde::de::Visitor<'_> for Name {
            type Value = TaskKind;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a task kind name")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<TaskKind, E> {
                TaskKind::name(v).map_err(E::custom)
            }
        }
        d.deserialize_str(Name)
    }
}

/// On the wire a kind is an Avro string (no closed enum to extend).
impl AvroSchemaComponent for TaskKind {
    fn get_schema_in_ctxt(_: &mut HashMap<Name, Schema>, _: &Namespace) -> Schema {
        Schema::String
    }
}

/// The kind a symbol of the retired Avro enum `io.ferry.v1.TaskKind` named: its symbols
/// were the kind names in upper camel case (`CreateCluster` is `create-cluster`).
pub fn from_legacy_symbol(symbol: &str) -> String {
    let mut out = String::with_capacity(symbol.len() + 2);
    for (i, c) in symbol.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('-');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// Every committed version of a record: (schema id, file name under `schemas/`, text).
pub type SchemaFile = (u32, &'static str, &'static str);

/// The topics beyond its own that a kind's workers use; the ACL generator grants them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Access {
    /// Writes the compacted scores topic (the score worker).
    pub writes_scores: bool,
    /// Reads the scores topic (a deploy placed by score).
    pub reads_scores: bool,
    /// Submits child tasks of the other kinds (a plan): writes their command topics and
    /// reads their task-state topics.
    pub submits_children: bool,
    /// Writes its own command topic (the score worker's onboarding scorings).
    pub writes_own_commands: bool,
}

impl Access {
    /// Its own topics only.
    pub const NONE: Access = Access { writes_scores: false, reads_scores: false, submits_children: false, writes_own_commands: false };
}

/// What a worker crate tells the rest of Ferry about its kind.
#[derive(Debug)]
pub struct KindInfo {
    /// The kind.
    pub kind: TaskKind,
    /// One line on what it does.
    pub describe: &'static str,
    /// Where it comes in listings (`--help`, `ferry topics`, the protocol documents).
    pub order: u16,
    /// Every committed version of its spec record and of any record its workers write
    /// (the embedded registry holds them; ids are unique across all kinds).
    pub schemas: &'static [SchemaFile],
    /// The file of its spec record's newest version.
    pub spec: &'static str,
    /// The topics beyond its own its workers use.
    pub access: Access,
    /// Why tenants may not submit it, if they may not (the tenant policy refuses a rule
    /// for it with this reason).
    pub not_for_tenants: Option<&'static str>,
    /// Encodes a spec given as JSON (a spec file, a plan's child) as its record; the
    /// error names what does not fit. [`encode_json`] for a spec type.
    pub encode: fn(&crate::wire::Registry, serde_json::Value) -> Result<Vec<u8>, String>,
    /// The kind's own rules for a command given as JSON (one [`KindInfo::encode`] reads)
    /// with its subject: its worker's `validate`, less what needs the worker's
    /// configuration. A plan runs them on every child it can read when it is submitted, so
    /// a plan is refused whole instead of child by child once its first children ran.
    /// [`check_json`] of the worker's rules.
    pub check: fn(&str, &serde_json::Value) -> Result<(), crate::step::Rejection>,
    /// The subject the kind derives from a spec given as JSON, for kinds that derive one.
    pub subject_of: fn(&serde_json::Value) -> Option<String>,
    /// How the kind derives a command's subject from its spec, said for a person (`None`:
    /// every command names its subject).
    pub derived_subject: Option<&'static str>,
}

impl KindInfo {
    /// A kind with nothing of its own but its name: no schemas (its commands carry another
    /// kind's spec record, `TestTaskSpec` for the runtime's own tests), no extra topics,
    /// open to tenants, no subject derived, and no JSON encoder. For stand-ins in tests,
    /// with the fields a test is about set over it (`KindInfo { .., ..KindInfo::bare(k) }`).
    pub const fn bare(kind: TaskKind) -> KindInfo {
        KindInfo {
            kind,
            describe: "a stand-in",
            order: 1000,
            schemas: &[],
            spec: "TestTaskSpec.v2.avsc",
            access: Access::NONE,
            not_for_tenants: None,
            encode: |_, _| Err("a stand-in kind encodes no spec".to_owned()),
            check: |_, _| Ok(()),
            subject_of: no_subject,
            derived_subject: None,
        }
    }
}

/// [`KindInfo::encode`] of a spec type: the JSON read as `T`, written with its record's
/// newest schema. A field `T` does not have is refused, named by its path, as kubectl's
/// strict field validation does: serde alone would drop it without a word, and a misspelt
/// or misplaced optional field (`placement: {cluster: x}` for `cluster: x`) would silently
/// take its default.
pub fn encode_json<T>(registry: &crate::wire::Registry, spec: serde_json::Value) -> Result<Vec<u8>, String>
where
    T: Serialize + serde::de::DeserializeOwned + apache_avro::AvroSchema + 'static,
{
    let spec: T = read_spec(spec)?;
    registry.encode(&spec).map_err(|e| e.to_string())
}

/// A spec given as JSON read strictly as `T` ([`strict_json`]); the error names `T`'s
/// record. What [`encode_json`] and [`check_json`] read.
fn read_spec<T: serde::de::DeserializeOwned>(spec: serde_json::Value) -> Result<T, String> {
    let record = std::any::type_name::<T>().rsplit("::").next().unwrap_or("spec");
    strict_json(spec).map_err(|e| format!("the spec does not match the fields of {record}: {e}"))
}

/// [`KindInfo::check`] of a spec type: `spec` read as `T` (strictly, as
/// [`encode_json`] does) and given with `subject` to `rules`, the kind's worker's own.
pub fn check_json<T>(subject: &str, spec: &serde_json::Value, rules: fn(&str, &T) -> Result<(), crate::step::Rejection>) -> Result<(), crate::step::Rejection>
where
    T: serde::de::DeserializeOwned,
{
    let spec: T = read_spec(spec.clone()).map_err(crate::step::Rejection::new)?;
    rules(subject, &spec)
}

/// Why [`strict_json`] refused a value.
#[derive(Debug, thiserror::Error)]
pub enum StrictError {
    /// The value does not fit the type (serde's own words).
    #[error("{0}")]
    Shape(#[from] serde_json::Error),
    /// The value fits, but has fields the type does not (their paths, in reading order).
    #[error("unknown field{} {}: no such field at that place (the kind's JSON Schema, schemas/json, lists the fields)", if .0.len() == 1 { "" } else { "s" }, .0.iter().map(|p| format!("`{p}`")).collect::<Vec<_>>().join(", "))]
    Unknown(Vec<String>),
}

/// Reads `value` as `T`, refusing fields `T` does not have (a spec file's, a plan child's).
pub fn strict_json<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T, StrictError> {
    let mut unknown = Vec::new();
    let out = serde_ignored::deserialize(value, |path| unknown.push(field_path(&path)))?;
    if unknown.is_empty() { Ok(out) } else { Err(StrictError::Unknown(unknown)) }
}

/// `components[0].placement.cluster`: a path as a spec file's author writes it.
fn field_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", field_path(parent)),
        Path::Map { parent, key } => match field_path(parent) {
            p if p.is_empty() => key.clone(),
            p => format!("{p}.{key}"),
        },
        Path::Some { parent } | Path::NewtypeStruct { parent } | Path::NewtypeVariant { parent } => field_path(parent),
    }
}

/// [`KindInfo::subject_of`] of a kind whose commands name their subject.
pub fn no_subject(_: &serde_json::Value) -> Option<String> {
    None
}

inventory::collect!(KindInfo);

/// Registers a kind where its worker crate defines it: the runtime, the CLI, the topic
/// and ACL generators and the protocol documents of any program that links the crate then
/// know it.
///
/// ```ignore
/// ferry_task::register_kind!(ferry_task::kind::KindInfo {
///     kind: ferry_task::TaskKind::new("backup"),
///     describe: "Velero backups of a cluster",
///     order: 100,
///     schemas: &[(70, "BackupSpec.avsc", include_str!("../../../schemas/BackupSpec.avsc"))],
///     spec: "BackupSpec.avsc",
///     access: ferry_task::kind::Access::NONE,
///     not_for_tenants: None,
///     encode: ferry_task::kind::encode_json::<BackupSpec>,
///     check: |subject, spec| ferry_task::kind::check_json::<BackupSpec>(subject, spec, |_, _| Ok(())),
///     subject_of: |spec| spec["cluster"].as_str().map(str::to_owned),
///     derived_subject: Some("the cluster's name"),
/// });
/// ```
#[macro_export]
macro_rules! register_kind {
    ($info:expr) => {
        $crate::__inventory::submit! { $info }
    };
}

/// Every kind a linked crate registered, in listing order.
pub fn catalogue() -> Vec<&'static KindInfo> {
    let mut all: Vec<&'static KindInfo> = inventory::iter::<KindInfo>.into_iter().collect();
    all.sort_by_key(|i| (i.order, i.kind));
    all.dedup_by_key(|i| i.kind);
    all
}

/// Every registered kind, in listing order.
pub fn registered() -> Vec<TaskKind> {
    catalogue().into_iter().map(|i| i.kind).collect()
}

/// The registration of `kind`, if a linked crate made one.
pub fn info(kind: TaskKind) -> Option<&'static KindInfo> {
    inventory::iter::<KindInfo>.into_iter().find(|i| i.kind == kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_kept_inline() {
        assert_eq!(TaskKind::name("create-cluster").unwrap(), TaskKind::CREATE_CLUSTER);
        assert_eq!(TaskKind::CREATE_CLUSTER.as_str(), "create-cluster");
        for bad in ["", "Deploy", "-x", "x-", "a.b", &"k".repeat(KIND_NAME_MAX + 1)] {
            assert!(matches!(TaskKind::name(bad), Err(UnknownKind::BadName(_))), "{bad:?}");
        }
        assert!(TaskKind::name(&"k".repeat(KIND_NAME_MAX)).is_ok());
    }

    #[test]
    fn legacy_enum_symbols_name_the_same_kinds() {
        for (symbol, kind) in [("CreateCluster", TaskKind::CREATE_CLUSTER), ("Peer", TaskKind::PEER), ("Plan", TaskKind::PLAN)] {
            assert_eq!(TaskKind::name(&from_legacy_symbol(symbol)).unwrap(), kind);
        }
    }

    #[test]
    fn an_unregistered_kind_is_refused_by_name_and_listed_nowhere() {
        // This crate registers no kind: a well-formed name parses as a wire kind only.
        let e = "brand-new".parse::<TaskKind>().unwrap_err();
        assert!(matches!(e, UnknownKind::Unregistered { .. }), "{e}");
        assert!(TaskKind::name("brand-new").is_ok());
        assert_eq!(TaskKind::name("brand-new").unwrap().describe(), "");
    }

    #[derive(Debug, serde::Deserialize)]
    struct Spec {
        name: String,
        #[serde(default)]
        parts: Vec<Part>,
        #[serde(default)]
        place: Option<Place>,
    }

    #[derive(Debug, serde::Deserialize)]
    struct Part {
        #[allow(dead_code)]
        image: String,
    }

    #[derive(Debug, serde::Deserialize)]
    struct Place {
        #[serde(default)]
        sets: Vec<String>,
    }

    #[test]
    fn a_field_the_spec_does_not_have_is_refused_by_its_path() {
        let ok: Spec = strict_json(serde_json::json!({"name": "a", "parts": [{"image": "x"}], "place": {"sets": ["demo"]}})).unwrap();
        assert_eq!((ok.name.as_str(), ok.parts.len(), ok.place.map(|p| p.sets)), ("a", 1, Some(vec!["demo".to_owned()])));
        // Misplaced (a field of another level) and misspelt fields, each named where it is.
        let e = strict_json::<Spec>(serde_json::json!({"name": "a", "parts": [{"image": "x"}, {"image": "y", "imgae": "z"}], "place": {"cluster": "m1"}, "replica": 3}))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("unknown fields `parts[1].imgae`, `place.cluster`, `replica`: "), "{e}");
        // A value of the wrong shape is serde's error, as before.
        let e = strict_json::<Spec>(serde_json::json!({"name": 3})).unwrap_err();
        assert!(matches!(e, StrictError::Shape(_)), "{e}");
    }

    #[test]
    fn json_and_avro_carry_the_name() {
        assert_eq!(serde_json::to_string(&TaskKind::DEPLOY).unwrap(), "\"deploy\"");
        assert_eq!(serde_json::from_str::<TaskKind>("\"plan\"").unwrap(), TaskKind::PLAN);
        assert!(serde_json::from_str::<TaskKind>("\"Plan\"").is_err());
    }
}

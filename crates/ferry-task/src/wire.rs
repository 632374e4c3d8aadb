//! Avro in the Confluent wire format (magic byte 0, 4-byte big-endian schema id, datum),
//! with an embedded registry built from `schemas/*.avsc`.
//!
//! Schema ids are fixed: the protocol's records in [`PROTOCOL`], each kind's in its
//! [`crate::kind::KindInfo`] (so a new kind brings its own, and ids stay unique across
//! kinds: a test checks it). When a record evolves, its new version gets a new file and id
//! and the old one stays, so old records still decode (the compatibility test in
//! `tests/schemas.rs` checks that the newest version reads every older one).
//! [`crate::wire::Registry::from_entries`] takes a real registry's ids instead
//! (`ferry_runtime::schema_registry`).

use std::collections::HashMap;

use apache_avro::types::Value;
use apache_avro::headers::HeaderBuilder;
use apache_avro::{AvroSchema, GenericSingleObjectReader, Schema};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::kind::SchemaFile;

/// The protocol's own records, every committed version. Versions 1 of the three (ids 1-3)
/// carried the kind as a closed Avro enum; they stay so that records written then decode.
/// Versions 3 (ids 100-102: the protocol's ids are 1-9 and 100-109, the kinds' 10-99)
/// added Signals (an action, an event type, the snapshot's list).
pub const PROTOCOL: &[SchemaFile] = &[
    (1, "CommandEnvelope.avsc", include_str!("../../../schemas/CommandEnvelope.avsc")),
    (2, "ProgressEvent.avsc", include_str!("../../../schemas/ProgressEvent.avsc")),
    (3, "TaskSnapshot.avsc", include_str!("../../../schemas/TaskSnapshot.avsc")),
    (5, "CommandEnvelope.v2.avsc", include_str!("../../../schemas/CommandEnvelope.v2.avsc")),
    (6, "ProgressEvent.v2.avsc", include_str!("../../../schemas/ProgressEvent.v2.avsc")),
    (7, "TaskSnapshot.v2.avsc", include_str!("../../../schemas/TaskSnapshot.v2.avsc")),
    (100, "CommandEnvelope.v3.avsc", include_str!("../../../schemas/CommandEnvelope.v3.avsc")),
    (101, "ProgressEvent.v3.avsc", include_str!("../../../schemas/ProgressEvent.v3.avsc")),
    (102, "TaskSnapshot.v3.avsc", include_str!("../../../schemas/TaskSnapshot.v3.avsc")),
];

/// Every schema this program knows: the protocol's and each registered kind's, by id.
pub fn embedded_schemas() -> Vec<SchemaFile> {
    let mut all: Vec<SchemaFile> = PROTOCOL.to_vec();
    for info in crate::kind::catalogue() {
        all.extend_from_slice(info.schemas);
    }
    // Ids are unique across kinds (`ferry`'s schema test checks every linked kind).
    all.sort_by_key(|(id, _, _)| *id);
    all
}

/// What apache-avro says, without the value and schema it puts in a validation error
/// (their Debug text can run to kilobytes), and at most 400 characters of anything else.
fn concise(e: &apache_avro::Error) -> String {
    match e.details() {
        apache_avro::error::Details::ValidationWithReason { reason, .. } => reason.clone(),
        _ => {
            let text = e.to_string();
            match text.char_indices().nth(400) {
                Some((cut, _)) => format!("{}…", &text[..cut]),
                None => text,
            }
        }
    }
}

/// Why bytes could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// Fewer than the 5 header bytes.
    #[error("record of {len} bytes is too short for the Confluent wire format (5-byte header)")]
    TooShort {
        /// Length of the record.
        len: usize,
    },
    /// The first byte is not 0.
    #[error("unknown magic byte {0:#04x}: not Confluent-framed Avro")]
    BadMagic(u8),
    /// Two schemas were given one id (a kind took an id another kind or the protocol
    /// holds): a build mistake, refused at start.
    #[error("schema id {id} is given to {first} and to {second}: ids are unique (protocol 1-9 and 100-109, each kind its own ten)")]
    DuplicateId {
        /// The id.
        id: u32,
        /// The record that had it first.
        first: String,
        /// The record given it again.
        second: String,
    },
    /// The id is not in the registry.
    #[error("unknown schema id {0}")]
    UnknownSchemaId(u32),
    /// The id names another record than the one expected.
    #[error("schema id {id} is record {found}, expected {expected}")]
    WrongRecord {
        /// The id in the header.
        id: u32,
        /// The record it names.
        found: String,
        /// The record the reader wanted.
        expected: String,
    },
    /// No schema registered for the record being written or read.
    #[error("no schema registered for record {0}")]
    Unregistered(String),
    /// The datum does not match the schema (encoding or decoding).
    #[error("avro datum for {record} does not match its schema: {}", concise(.source))]
    Datum {
        /// The record.
        record: String,
        /// What apache-avro said.
        #[source]
        source: Box<apache_avro::Error>,
    },
    /// Longer than any record Ferry accepts.
    #[error("record of {len} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// Length of the record.
        len: usize,
        /// [`crate::limits::RECORD_BYTES`].
        limit: usize,
    },
    /// Bytes left after the datum.
    #[error("{0} trailing bytes after the avro datum")]
    Trailing(usize),
    /// A registry schema file does not parse.
    #[error("schema {file} does not parse: {source}")]
    BadSchema {
        /// The file.
        file: String,
        /// What apache-avro said.
        #[source]
        source: Box<apache_avro::Error>,
    },
}

struct Entry {
    schema: Schema,
    /// Reads a datum of `schema` with its named types resolved once, here: a plain
    /// `from_avro_datum` resolves them again for every record (apache-avro 0.21,
    /// `decode.rs`, `decode`), a quarter of an event's decode time.
    datum: GenericSingleObjectReader,
    name: String,
    /// A version written when the kind was an Avro enum (the protocol's versions 1).
    kind_enum: bool,
}

/// Whether `schema` is a record whose `kind` field is an enum.
fn has_kind_enum(schema: &Schema) -> bool {
    match schema {
        Schema::Record(r) => r.fields.iter().any(|f| f.name == "kind" && matches!(f.schema, Schema::Enum(_))),
        _ => false,
    }
}

/// Schemas by id, and the newest id of each record name.
pub struct Registry {
    by_id: HashMap<u32, Entry>,
    latest: HashMap<String, u32>,
    /// Ids of the exact versions this binary's types match (a shared registry may hold
    /// newer versions registered by newer producers).
    own: HashMap<String, u32>,
    names: std::sync::RwLock<HashMap<std::any::TypeId, String>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("records", &self.latest).finish()
    }
}

/// The Confluent framing is read before the datum: the datum reader expects no header.
struct NoHeader;

impl HeaderBuilder for NoHeader {
    fn build_header(&self) -> Vec<u8> {
        Vec::new()
    }
}

fn full_name(schema: &Schema) -> String {
    match schema.name() {
        Some(n) => n.fullname(None),
        None => format!("{schema:?}"),
    }
}

impl Registry {
    /// The registry of `schemas/` compiled into this binary.
    pub fn embedded() -> Self {
        Self::from_entries(embedded_schemas()).expect("schemas/*.avsc parse (checked by tests)")
    }

    /// A registry from (id, file, schema text) triples; higher ids of a record are newer.
    pub fn from_entries<'a>(
        entries: impl IntoIterator<Item = (u32, &'a str, &'a str)>,
    ) -> Result<Self, WireError> {
        bound_avro_allocations();
        let mut by_id = HashMap::new();
        let mut latest: HashMap<String, u32> = HashMap::new();
        for (id, file, text) in entries {
            let schema = Schema::parse_str(text).map_err(|e| WireError::BadSchema {
                file: file.to_owned(),
                source: Box::new(e),
            })?;
            let name = full_name(&schema);
            if let Some(other) = by_id.get(&id) {
                let other: &Entry = other;
                return Err(WireError::DuplicateId { id, first: other.name.clone(), second: name });
            }
            let newest = latest.entry(name.clone()).or_insert(id);
            *newest = (*newest).max(id);
            let datum = GenericSingleObjectReader::new_with_header_builder(schema.clone(), NoHeader).map_err(|e| WireError::BadSchema {
                file: file.to_owned(),
                source: Box::new(e),
            })?;
            by_id.insert(id, Entry { kind_enum: has_kind_enum(&schema), schema, datum, name });
        }
        Ok(Self { by_id, latest, own: HashMap::new(), names: Default::default() })
    }

    /// Writes (and reads into) record `name` with schema `id` rather than the newest.
    pub fn pin(&mut self, name: &str, id: u32) {
        self.own.insert(name.to_owned(), id);
    }

    fn current(&self, name: &str) -> Option<u32> {
        self.own.get(name).or_else(|| self.latest.get(name)).copied()
    }

    /// The schema registered under `id`.
    pub fn schema(&self, id: u32) -> Option<&Schema> {
        self.by_id.get(&id).map(|e| &e.schema)
    }

    /// The full record name of `T`. Derived schemas are built anew on every
    /// `get_schema()` call (costly for nested records), so names are cached per type.
    fn record_name<T: AvroSchema + 'static>(&self) -> String {
        let key = std::any::TypeId::of::<T>();
        if let Some(n) = self.names.read().expect("names lock").get(&key) {
            return n.clone();
        }
        let name = full_name(&T::get_schema());
        self.names.write().expect("names lock").insert(key, name.clone());
        name
    }

    /// The newest id of the record `T`.
    pub fn id_of<T: AvroSchema + 'static>(&self) -> Result<u32, WireError> {
        let name = self.record_name::<T>();
        self.current(&name).ok_or(WireError::Unregistered(name))
    }

    /// Encodes `value` with the newest registered schema of its record.
    pub fn encode<T: Serialize + AvroSchema + 'static>(&self, value: &T) -> Result<Vec<u8>, WireError> {
        let id = self.id_of::<T>()?;
        let entry = &self.by_id[&id];
        let mut out = Vec::with_capacity(128);
        out.push(0);
        out.extend_from_slice(&id.to_be_bytes());
        apache_avro::write_avro_datum_ref(&entry.schema, value, &mut out).map_err(|e| WireError::Datum {
            record: entry.name.clone(),
            source: Box::new(e),
        })?;
        Ok(out)
    }

    /// Decodes a Confluent-framed record into `T`, resolving the writer's schema version
    /// against the newest one.
    pub fn decode<T: DeserializeOwned + AvroSchema + 'static>(&self, bytes: &[u8]) -> Result<T, WireError> {
        if bytes.len() > crate::limits::RECORD_BYTES {
            return Err(WireError::TooLarge { len: bytes.len(), limit: crate::limits::RECORD_BYTES });
        }
        if bytes.len() < 5 {
            return Err(WireError::TooShort { len: bytes.len() });
        }
        if bytes[0] != 0 {
            return Err(WireError::BadMagic(bytes[0]));
        }
        let id = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
        let writer = self.by_id.get(&id).ok_or(WireError::UnknownSchemaId(id))?;
        let expected = self.record_name::<T>();
        if writer.name != expected {
            return Err(WireError::WrongRecord { id, found: writer.name.clone(), expected });
        }
        let reader_id = self.current(&writer.name).ok_or_else(|| WireError::Unregistered(writer.name.clone()))?;
        // Same version: no schema resolution needed.
        let reader = (reader_id != id).then(|| &self.by_id[&reader_id].schema);
        let mut datum = &bytes[5..];
        let datum_err = |e| WireError::Datum { record: expected.clone(), source: Box::new(e) };
        let value = writer.datum.read_value(&mut datum).map_err(datum_err)?;
        let value = match reader {
            // Avro resolves no enum into a string: the kind's symbol is renamed first.
            Some(reader) if writer.kind_enum => legacy_kind_as_string(value).resolve(reader).map_err(datum_err)?,
            Some(reader) => value.resolve(reader).map_err(datum_err)?,
            None => value,
        };
        if !datum.is_empty() {
            return Err(WireError::Trailing(datum.len()));
        }
        apache_avro::from_value(&value).map_err(datum_err)
    }
}

/// A record written when the kind was an Avro enum, with its `kind` as the kind's name.
fn legacy_kind_as_string(value: Value) -> Value {
    match value {
        Value::Record(fields) => Value::Record(
            fields
                .into_iter()
                .map(|(name, v)| match v {
                    Value::Enum(_, symbol) if name == "kind" => (name, Value::String(crate::kind::from_legacy_symbol(&symbol))),
                    other => (name, other),
                })
                .collect(),
        ),
        other => other,
    }
}

/// Bounds every length apache-avro reads before it allocates: a string's or bytes' length,
/// an array's or map's element count. Its default (512 MiB, compared with an element
/// count) let an 80-byte record claiming 500 million array items reserve 28 GB and abort
/// the process (apache-avro 0.21 `decode.rs` reserves `len` elements; `util::safe_len`
/// checks `len` against this setting). The setting is process-wide and the first call
/// wins, so every registry sets it before its first decode.
///
/// With the bound, an array claim costs at most [`crate::limits::AVRO_ALLOCATION_BYTES`]
/// elements of apache-avro's `Value` per nesting level before the datum runs out.
pub fn bound_avro_allocations() -> usize {
    apache_avro::util::max_allocation_bytes(crate::limits::AVRO_ALLOCATION_BYTES)
}

/// Checks that each committed `schemas/<file>` equals the schema derived from its Rust type
/// (for every crate's `tests/schemas.rs`). With `FERRY_BLESS` set in the environment it
/// first rewrites the files from the types; review the diff. Returns one message per
/// mismatch.
pub fn check_committed(schemas_dir: &std::path::Path, derived: &[(&str, Schema)]) -> Result<(), Vec<String>> {
    let bless = std::env::var_os("FERRY_BLESS").is_some();
    let mut problems = Vec::new();
    for (file, schema) in derived {
        let path = schemas_dir.join(file);
        if bless {
            let text = serde_json::to_value(schema)
                .and_then(|json| serde_json::to_string_pretty(&json))
                .map(|t| t + "\n");
            match text.map(|t| std::fs::write(&path, t)) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => problems.push(format!("{file}: writing: {e}")),
                Err(e) => problems.push(format!("{file}: serializing: {e}")),
            }
        }
        let committed = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => {
                problems.push(format!("{file}: {e} (run with FERRY_BLESS=1 to create it)"));
                continue;
            }
        };
        match Schema::parse_str(&committed) {
            Ok(c) if c.canonical_form() == schema.canonical_form() => {}
            Ok(_) => problems.push(format!("{file} differs from the Rust type; run with FERRY_BLESS=1 and review")),
            Err(e) => problems.push(format!("{file}: does not parse: {e}")),
        }
        if !embedded_schemas().iter().any(|(_, f, _)| f == file) {
            problems.push(format!("{file} is not registered: not in ferry_task::wire::PROTOCOL nor in a kind's KindInfo::schemas"));
        }
    }
    if problems.is_empty() { Ok(()) } else { Err(problems) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kind::TaskKind;
    use crate::protocol::{Bytes, CommandAction, CommandEnvelope};

    fn envelope() -> CommandEnvelope {
        CommandEnvelope {
            task_id: "tsk_0".into(),
            kind: TaskKind::TEST,
            action: CommandAction::Start,
            subject: "s".into(),
            idempotency_key: Some("k".into()),
            requested_by: "me".into(),
            created_at_ms: 1,
            deadline_ms: None,
            keep_partial: false,
            reason: None,
            spec: Bytes(vec![1, 2, 3]),
            signal: None,
        }
    }

    #[test]
    fn round_trips_an_envelope() {
        let r = Registry::embedded();
        let bytes = r.encode(&envelope()).unwrap();
        assert_eq!(&bytes[..5], &[0, 0, 0, 0, 100]);
        assert_eq!(r.decode::<CommandEnvelope>(&bytes).unwrap(), envelope());
    }

    #[test]
    fn an_envelope_written_when_the_kind_was_an_enum_still_decodes() {
        // Version 1 (id 1) carried `kind` as the enum io.ferry.v1.TaskKind; write one as a
        // producer of then did, field by field from the version 2 record.
        let r = Registry::embedded();
        for (kind, symbol, index) in [(TaskKind::CREATE_CLUSTER, "CreateCluster", 0), (TaskKind::TEST, "Test", 5), (TaskKind::PLAN, "Plan", 6)] {
            let mut e = envelope();
            e.kind = kind;
            let v2 = r.encode(&e).unwrap();
            let mut datum = &v2[5..];
            let Value::Record(fields) = apache_avro::from_avro_datum(r.schema(5).unwrap(), &mut datum, None).unwrap() else { panic!("a record") };
            let fields = fields
                .into_iter()
                .map(|(k, v)| if k == "kind" { (k, Value::Enum(index, symbol.into())) } else { (k, v) })
                .collect();
            let mut v1 = vec![0, 0, 0, 0, 1];
            v1.extend(apache_avro::to_avro_datum(r.schema(1).unwrap(), Value::Record(fields)).unwrap());
            assert_eq!(r.decode::<CommandEnvelope>(&v1).unwrap(), e, "{symbol}");
        }
    }

    #[test]
    fn names_what_is_wrong_with_bad_bytes() {
        let r = Registry::embedded();
        assert!(matches!(r.decode::<CommandEnvelope>(b"{}"), Err(WireError::TooShort { len: 2 })));
        assert!(matches!(r.decode::<CommandEnvelope>(b"garbage!"), Err(WireError::BadMagic(b'g'))));
        assert!(matches!(r.decode::<CommandEnvelope>(&[0, 0, 0, 0, 99, 1]), Err(WireError::UnknownSchemaId(99))));
        let mut ok = r.encode(&envelope()).unwrap();
        assert!(matches!(
            r.decode::<crate::protocol::TaskSnapshot>(&ok),
            Err(WireError::WrongRecord { id: 100, .. })
        ));
        ok.push(7);
        assert!(matches!(r.decode::<CommandEnvelope>(&ok), Err(WireError::Trailing(1))));
        ok.truncate(8);
        let e = r.decode::<CommandEnvelope>(&ok).unwrap_err();
        assert!(matches!(e, WireError::Datum { .. }), "{e}");
        assert!(e.to_string().starts_with("avro datum for") && e.to_string().len() < 600, "short: {e}");
        // A validation error carries the value and the whole schema: only its reason shows.
        let schema = CommandEnvelope::get_schema();
        let details = apache_avro::error::Details::ValidationWithReason { value: apache_avro::types::Value::Null, schema, reason: "field `kind` is missing".into() };
        let e = WireError::Datum { record: "CommandEnvelope".into(), source: Box::new(apache_avro::Error::new(details)) };
        assert_eq!(e.to_string(), "avro datum for CommandEnvelope does not match its schema: field `kind` is missing");
        let huge = vec![0u8; crate::limits::RECORD_BYTES + 1];
        assert!(matches!(r.decode::<CommandEnvelope>(&huge), Err(WireError::TooLarge { .. })));
    }

    /// The zig-zag varint of a non-negative Avro long.
    fn varint(n: i64) -> Vec<u8> {
        let mut z = ((n << 1) ^ (n >> 63)) as u64;
        let mut out = Vec::new();
        loop {
            let b = (z & 0x7f) as u8;
            z >>= 7;
            if z == 0 {
                out.push(b);
                return out;
            }
            out.push(b | 0x80);
        }
    }

    #[derive(Debug, serde::Deserialize, AvroSchema)]
    #[allow(dead_code)] // only decoded into
    struct Listing {
        items: Vec<String>,
    }

    #[test]
    fn a_length_bomb_is_refused_before_it_allocates() {
        let listing = r#"{"type":"record","name":"Listing","fields":[{"name":"items","type":{"type":"array","items":"string"}}]}"#;
        let r = Registry::from_entries([(1, "Listing.avsc", listing)]).unwrap();
        // Eleven bytes that claim 500 million strings: without the bound apache-avro
        // reserves 500M values (28 GB) and the process aborts.
        let bomb = [&[0, 0, 0, 0, 1][..], &varint(500_000_000)].concat();
        let err = r.decode::<Listing>(&bomb).unwrap_err();
        assert!(err.to_string().contains("500000000"), "{err}");
        // A string that claims 400 MB: refused the same way, not allocated.
        let bomb = [&[0, 0, 0, 0, 1][..], &varint(1), &varint(400_000_000)].concat();
        assert!(r.decode::<Listing>(&bomb).is_err());
        assert_eq!(bound_avro_allocations(), crate::limits::AVRO_ALLOCATION_BYTES, "the first registry set the bound");
    }
}

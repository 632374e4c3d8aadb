//! Typed task identifiers (`tsk_<uuid>`), serialized through `Display`/`FromStr`.

use std::fmt;
use std::str::FromStr;

use uuid::Uuid;

use crate::kind::TaskKind;

const PREFIX: &str = "tsk_";

/// Namespace for ids derived from idempotency keys (UUID v5), so that a producer that
/// retries a command with the same key also reuses the same task id.
const IDEMPOTENCY_NAMESPACE: Uuid = Uuid::from_u128(0x6f8c_1c7e_1d8a_4b52_9a77_52a1_f3e0_c0de);

/// The identity of one task, stable across retries, workers and restarts.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId(Uuid);

impl TaskId {
    /// A fresh, time-ordered id (UUID v7).
    pub fn new() -> Self {
        Self(Uuid::now_v7())
    }

    /// Whether the id was derived from an idempotency key ([`Self::for_idempotency_key`]).
    pub fn is_derived(&self) -> bool {
        self.0.get_version_num() == 5
    }

    /// The id every submission with this idempotency key gets, for this kind.
    pub fn for_idempotency_key(kind: TaskKind, key: &str) -> Self {
        let name = format!("{}/{}", kind.as_str(), key);
        Self(Uuid::new_v5(&IDEMPOTENCY_NAMESPACE, name.as_bytes()))
    }
}

impl Default for TaskId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PREFIX}{}", self.0.simple())
    }
}

impl fmt::Debug for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A string that is not a task id.
#[derive(Debug, thiserror::Error)]
#[error("invalid task id {input:?}: expected {PREFIX} followed by 32 hex digits")]
pub struct InvalidTaskId {
    input: String,
}

impl FromStr for TaskId {
    type Err = InvalidTaskId;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || InvalidTaskId { input: s.to_owned() };
        let hex = s.strip_prefix(PREFIX).ok_or_else(err)?;
        if hex.len() != 32 {
            return Err(err());
        }
        Uuid::parse_str(hex).map(Self).map_err(|_| err())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_display() {
        let id = TaskId::new();
        assert_eq!(id.to_string().parse::<TaskId>().unwrap(), id);
        assert!(id.to_string().starts_with("tsk_"));
    }

    #[test]
    fn rejects_foreign_strings() {
        for bad in ["", "tsk_", "task_0123", "tsk_zz", "0190b3c4e5f67a8b9c0d1e2f3a4b5c6d"] {
            assert!(bad.parse::<TaskId>().is_err(), "{bad} parsed");
        }
    }

    #[test]
    fn idempotency_keys_map_to_stable_ids_per_kind() {
        let a = TaskId::for_idempotency_key(TaskKind::TEST, "k1");
        assert_eq!(a, TaskId::for_idempotency_key(TaskKind::TEST, "k1"));
        assert_ne!(a, TaskId::for_idempotency_key(TaskKind::TEST, "k2"));
        assert_ne!(a, TaskId::for_idempotency_key(TaskKind::DEPLOY, "k1"));
    }
}

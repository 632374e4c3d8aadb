//! The latency matrix a burst ranks candidate clusters by (nearest first), as mck8s used
//! measured round-trip times: a YAML map `from: {to: milliseconds}`, read either way
//! round (a missing `a→b` uses `b→a`); a command's `latency_ms` overrides it.

use std::collections::HashMap;
use std::path::Path;

/// The matrix could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LatencyError {
    /// The file could not be read.
    #[error("latency matrix {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a `from: {to: ms}` map.
    #[error("latency matrix {path}: expected `from: {{to: milliseconds}}`: {source}")]
    Parse {
        /// The file.
        path: String,
        /// Why.
        source: serde_yaml_ng::Error,
    },
}

/// Milliseconds between clusters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LatencyMatrix(HashMap<String, HashMap<String, u32>>);

impl LatencyMatrix {
    /// From YAML text.
    pub fn parse(text: &str, path: &str) -> Result<Self, LatencyError> {
        serde_yaml_ng::from_str(text).map(Self).map_err(|source| LatencyError::Parse { path: path.into(), source })
    }

    /// From a YAML file.
    pub fn load(path: &Path) -> Result<Self, LatencyError> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| LatencyError::Read { path: p.clone(), source })?;
        Self::parse(&text, &p)
    }

    /// Milliseconds from `a` to `b`, if known (either direction).
    pub fn get(&self, a: &str, b: &str) -> Option<u32> {
        self.0.get(a).and_then(|m| m.get(b)).or_else(|| self.0.get(b).and_then(|m| m.get(a))).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn either_direction_and_clear_errors() {
        let m = LatencyMatrix::parse("member-1: {member-2: 40, member-3: 5}\nmember-3: {member-2: 12}\n", "x").unwrap();
        assert_eq!(m.get("member-1", "member-3"), Some(5));
        assert_eq!(m.get("member-2", "member-3"), Some(12));
        assert_eq!(m.get("member-2", "member-1"), Some(40));
        assert_eq!(m.get("member-1", "edge-9"), None);
        let e = LatencyMatrix::parse("member-1: [1, 2]", "lat.yaml").unwrap_err().to_string();
        assert!(e.contains("lat.yaml") && e.contains("from: {to: milliseconds}"), "{e}");
    }
}

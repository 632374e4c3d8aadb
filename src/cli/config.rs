//! The CLI's config file: broker and client settings in YAML, below flags and environment
//! variables in precedence (flags > environment > file > defaults). Looked up at `--config`
//! / `FERRY_CONFIG`, else `$XDG_CONFIG_HOME/ferry/config.yaml` (`~/.config/ferry/...`) when
//! it exists. Keys are the long flag names with `_` (e.g. `brokers`, `topic_prefix`,
//! `sasl_username`, `kafka_properties: {KEY: VALUE}`); unknown keys are an error.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Deserialize;

use super::common::Conn;

/// What the file may set.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    brokers: Option<String>,
    topic_prefix: Option<String>,
    security_protocol: Option<String>,
    sasl_mechanism: Option<String>,
    sasl_username: Option<String>,
    sasl_password: Option<String>,
    ssl_ca_location: Option<PathBuf>,
    schema_registry: Option<String>,
    tenant: Option<String>,
    #[serde(default)]
    kafka_properties: BTreeMap<String, String>,
}

/// The default location of the config file.
pub fn default_path() -> PathBuf {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| ".".into())).join(".config"));
    base.join("ferry/config.yaml")
}

/// Reads the config file: `explicit` must exist; the default one may not.
pub fn load(explicit: Option<&Path>) -> anyhow::Result<ConfigFile> {
    let (path, required) = match explicit {
        Some(p) => (p.to_owned(), true),
        None => (default_path(), false),
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => return Ok(ConfigFile::default()),
        Err(e) => return Err(e).with_context(|| format!("reading the config file {}", path.display())),
    };
    serde_yaml_ng::from_str(&text).with_context(|| format!("parsing the config file {}", path.display()))
}

impl Conn {
    /// Fills what flags and environment left unset from `file`.
    pub fn apply(&mut self, file: ConfigFile) {
        fn fill<T>(slot: &mut Option<T>, v: Option<T>) {
            if slot.is_none() {
                *slot = v;
            }
        }
        fill(&mut self.brokers, file.brokers);
        fill(&mut self.topic_prefix, file.topic_prefix);
        fill(&mut self.security_protocol, file.security_protocol);
        fill(&mut self.sasl_mechanism, file.sasl_mechanism);
        fill(&mut self.sasl_username, file.sasl_username);
        fill(&mut self.sasl_password, file.sasl_password);
        fill(&mut self.ssl_ca_location, file.ssl_ca_location);
        fill(&mut self.schema_registry, file.schema_registry);
        fill(&mut self.tenant, file.tenant);
        // Flags come last, so they override the file's properties of the same key.
        let mut props: Vec<(String, String)> = file.kafka_properties.into_iter().collect();
        props.append(&mut self.kafka_properties);
        self.kafka_properties = props;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_win_over_the_file_and_unknown_keys_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.yaml");
        std::fs::write(&p, "brokers: file:9092\ntopic_prefix: team-a.\nkafka_properties: {linger.ms: '5'}\n").unwrap();
        let mut conn = Conn { brokers: Some("flag:9092".into()), kafka_properties: vec![("linger.ms".into(), "1".into())], ..Conn::default() };
        conn.apply(load(Some(&p)).unwrap());
        assert_eq!(conn.brokers.as_deref(), Some("flag:9092"));
        assert_eq!(conn.topic_prefix.as_deref(), Some("team-a."));
        assert_eq!(conn.kafka_properties, [("linger.ms".to_owned(), "5".to_owned()), ("linger.ms".to_owned(), "1".to_owned())]);
        std::fs::write(&p, "broker: typo:9092\n").unwrap();
        let e = format!("{:#}", load(Some(&p)).unwrap_err());
        assert!(e.contains("unknown field `broker`"), "{e}");
        assert!(load(Some(&dir.path().join("missing.yaml"))).is_err(), "an explicit file must exist");
    }
}

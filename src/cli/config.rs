//! The CLI's config file: broker and client settings in YAML, with named contexts as
//! kubectl has them. Precedence: flags > environment > the selected context > the file's
//! top-level keys > defaults. Looked up at `--config` / `FERRY_CONFIG`, else
//! `$XDG_CONFIG_HOME/ferry/config.yaml` (`~/.config/ferry/...`) when it exists. Keys are
//! the long flag names with `_` (e.g. `brokers`, `topic_prefix`, `sasl_username`,
//! `connect_timeout: 10s`, `kafka_properties: {KEY: VALUE}`); unknown keys are an error.
//!
//! ```yaml
//! brokers: localhost:9092            # used when no context is selected, or the context leaves it unset
//! current_context: prod              # `ferry config use-context NAME` writes this
//! contexts:
//!   prod: {brokers: kafka-1:9094, security_protocol: SASL_SSL, tenant: web}
//!   staging: {brokers: kafka-staging:9094, topic_prefix: staging.}
//! ```
//! `--context NAME` (or `FERRY_CONTEXT`) selects a context over `current_context:`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;
use serde::{Deserialize, Serialize};

use super::common::{Conn, Output};

/// What the file may set, at its top level and in each context.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    brokers: Option<String>,
    topic_prefix: Option<String>,
    security_protocol: Option<String>,
    sasl_mechanism: Option<String>,
    sasl_username: Option<String>,
    sasl_password: Option<String>,
    ssl_ca_location: Option<PathBuf>,
    schema_registry: Option<String>,
    tenant: Option<String>,
    /// As `--connect-timeout`: `5s`, `1m`, `0s`.
    #[serde(default, deserialize_with = "duration")]
    connect_timeout: Option<std::time::Duration>,
    #[serde(default)]
    kafka_properties: BTreeMap<String, String>,
}

/// `connect_timeout:` as the flag takes it (`90s`, `1m30s`), through humantime; a bad one
/// is a parse error of the file naming the key.
fn duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<std::time::Duration>, D::Error> {
    let s = String::deserialize(d)?;
    super::common::parse_duration(&s).map(Some).map_err(|e| serde::de::Error::custom(format!("connect_timeout: {e}")))
}

/// The config file as read.
#[derive(Debug, Default)]
pub struct ConfigFile {
    /// Where it was looked for.
    pub path: PathBuf,
    /// The top-level settings (below any context).
    settings: Settings,
    /// The named contexts.
    contexts: BTreeMap<String, Settings>,
    /// The context used when `--context` / `FERRY_CONTEXT` names none.
    current_context: Option<String>,
}

/// What went wrong with the config file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file exists but could not be read (or was named and does not exist).
    #[error("reading the config file {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not YAML of the expected shape.
    #[error("parsing the config file {}{where_}", path.display())]
    Parse {
        path: PathBuf,
        /// ` (context "NAME")`, or empty for the top level.
        where_: String,
        #[source]
        source: serde_yaml_ng::Error,
    },
    /// `--context`, `FERRY_CONTEXT` or `current_context:` names a context the file lacks.
    #[error("no context \"{name}\" in the config file {} (contexts: {known})", path.display())]
    UnknownContext { name: String, path: PathBuf, known: String },
    /// The file could not be written back (`use-context`).
    #[error("writing the config file {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// `ferry config ...`: the config file's contexts, as `kubectl config` has them.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// The contexts of the config file; `*` marks the one in use.
    GetContexts {
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Make NAME the current context (writes `current_context:` to the config file; its
    /// comments are not kept).
    UseContext { name: String },
    /// The name of the context in use.
    CurrentContext,
}

/// The default location of the config file.
pub fn default_path() -> PathBuf {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| ".".into())).join(".config"));
    base.join("ferry/config.yaml")
}

/// The file `explicit` names, else the default one.
fn path_of(explicit: Option<&Path>) -> PathBuf {
    explicit.map(Path::to_owned).unwrap_or_else(default_path)
}

/// The file's text: `explicit` must exist; the default one may not (`None` then).
fn read(explicit: Option<&Path>) -> Result<Option<String>, ConfigError> {
    let path = path_of(explicit);
    match std::fs::read_to_string(&path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && explicit.is_none() => Ok(None),
        Err(source) => Err(ConfigError::Read { path, source }),
    }
}

/// Reads the config file: `explicit` must exist; the default one may not.
pub fn load(explicit: Option<&Path>) -> Result<ConfigFile, ConfigError> {
    let path = path_of(explicit);
    let Some(text) = read(explicit)? else { return Ok(ConfigFile { path, ..ConfigFile::default() }) };
    parse(path, &text)
}

fn parse(path: PathBuf, text: &str) -> Result<ConfigFile, ConfigError> {
    let err = |where_: String| {
        let path = path.clone();
        move |source: serde_yaml_ng::Error| ConfigError::Parse { path, where_, source }
    };
    let mut top: serde_yaml_ng::Mapping = match serde_yaml_ng::from_str::<Option<serde_yaml_ng::Mapping>>(text).map_err(err(String::new()))? {
        Some(m) => m,
        None => serde_yaml_ng::Mapping::new(),
    };
    let current_context = match top.remove("current_context") {
        Some(v) => serde_yaml_ng::from_value::<Option<String>>(v).map_err(err(" (current_context)".into()))?,
        None => None,
    };
    let mut contexts = BTreeMap::new();
    if let Some(v) = top.remove("contexts") {
        let raw: BTreeMap<String, serde_yaml_ng::Value> = serde_yaml_ng::from_value::<Option<_>>(v).map_err(err(" (contexts)".into()))?.unwrap_or_default();
        for (name, v) in raw {
            let s = if v.is_null() { Settings::default() } else { serde_yaml_ng::from_value(v).map_err(err(format!(" (context \"{name}\")")))? };
            contexts.insert(name, s);
        }
    }
    let settings = serde_yaml_ng::from_value(serde_yaml_ng::Value::Mapping(top)).map_err(err(String::new()))?;
    Ok(ConfigFile { path, settings, contexts, current_context })
}

impl ConfigFile {
    /// The context in use: `selected` (the flag or environment variable), else the file's
    /// `current_context:`; an error when the file has no such context.
    fn context(&self, selected: Option<&str>) -> Result<Option<(&str, &Settings)>, ConfigError> {
        let Some(name) = selected.or(self.current_context.as_deref()) else { return Ok(None) };
        match self.contexts.get_key_value(name) {
            Some((n, s)) => Ok(Some((n.as_str(), s))),
            None => Err(ConfigError::UnknownContext {
                name: name.to_owned(),
                path: self.path.clone(),
                known: if self.contexts.is_empty() { "none".into() } else { self.contexts.keys().cloned().collect::<Vec<_>>().join(", ") },
            }),
        }
    }
}

impl Conn {
    /// Fills what flags and environment left unset from the selected context of `file`,
    /// then from its top-level keys.
    pub fn apply(&mut self, file: ConfigFile) -> Result<(), ConfigError> {
        fn fill<T: Clone>(slot: &mut Option<T>, v: &Option<T>) {
            if slot.is_none() {
                slot.clone_from(v);
            }
        }
        let context = file.context(self.context.as_deref())?.map(|(_, s)| s.clone());
        // Lowest precedence first for the properties: later ones override earlier ones of
        // the same key in librdkafka, and flags come last.
        let mut props: Vec<(String, String)> = file.settings.kafka_properties.clone().into_iter().collect();
        for layer in context.iter().chain(std::iter::once(&file.settings)) {
            fill(&mut self.brokers, &layer.brokers);
            fill(&mut self.topic_prefix, &layer.topic_prefix);
            fill(&mut self.security_protocol, &layer.security_protocol);
            fill(&mut self.sasl_mechanism, &layer.sasl_mechanism);
            fill(&mut self.sasl_username, &layer.sasl_username);
            fill(&mut self.sasl_password, &layer.sasl_password);
            fill(&mut self.ssl_ca_location, &layer.ssl_ca_location);
            fill(&mut self.schema_registry, &layer.schema_registry);
            fill(&mut self.tenant, &layer.tenant);
            fill(&mut self.connect_timeout, &layer.connect_timeout);
        }
        if let Some(c) = &context {
            props.extend(c.kafka_properties.clone());
        }
        props.append(&mut self.kafka_properties);
        self.kafka_properties = props;
        Ok(())
    }
}

/// Reads the config file `conn` names (or the default one) and fills `conn` from it.
pub fn resolve(conn: &mut Conn) -> Result<(), ConfigError> {
    let file = load(conn.config.as_deref())?;
    conn.apply(file)
}

/// One context as `get-contexts -o json|yaml` prints it (no secrets).
#[derive(Debug, Serialize)]
struct ContextView<'a> {
    name: &'a str,
    current: bool,
    brokers: Option<&'a str>,
    topic_prefix: Option<&'a str>,
    tenant: Option<&'a str>,
    sasl_username: Option<&'a str>,
}

pub fn run(conn: &Conn, cmd: ConfigCommand) -> anyhow::Result<ExitCode> {
    let file = load(conn.config.as_deref())?;
    match cmd {
        ConfigCommand::GetContexts { output } => {
            let current = file.context(conn.context.as_deref())?.map(|(n, _)| n);
            let views: Vec<ContextView> = file
                .contexts
                .iter()
                .map(|(name, s)| ContextView {
                    name,
                    current: Some(name.as_str()) == current,
                    brokers: s.brokers.as_deref(),
                    topic_prefix: s.topic_prefix.as_deref(),
                    tenant: s.tenant.as_deref(),
                    sasl_username: s.sasl_username.as_deref(),
                })
                .collect();
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&views)?),
                Output::Yaml => print!("{}", serde_yaml_ng::to_string(&views)?),
                Output::Table => {
                    let mut t = super::table::table(["CURRENT", "NAME", "BROKERS", "TOPIC-PREFIX", "TENANT"]);
                    for v in &views {
                        t.add_row([
                            if v.current { "*" } else { "" },
                            v.name,
                            v.brokers.unwrap_or_default(),
                            v.topic_prefix.unwrap_or_default(),
                            v.tenant.unwrap_or_default(),
                        ]);
                    }
                    super::table::print(t);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        ConfigCommand::CurrentContext => match file.context(conn.context.as_deref())? {
            Some((name, _)) => {
                println!("{name}");
                Ok(ExitCode::SUCCESS)
            }
            None => {
                eprintln!("error: no current context is set in {}", file.path.display());
                Ok(ExitCode::from(1))
            }
        },
        ConfigCommand::UseContext { name } => {
            file.context(Some(&name))?;
            use_context(&file.path, &name)?;
            println!("Switched to context \"{name}\".");
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Sets `current_context: name` in the file at `path`, other keys kept in their order; the
/// file is replaced whole (written beside it, then renamed), its permissions kept.
fn use_context(path: &Path, name: &str) -> Result<(), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
    let parse_err = |source| ConfigError::Parse { path: path.to_owned(), where_: String::new(), source };
    let mut doc: serde_yaml_ng::Mapping = serde_yaml_ng::from_str::<Option<_>>(&text).map_err(parse_err)?.unwrap_or_default();
    doc.insert("current_context".into(), name.into());
    let out = serde_yaml_ng::to_string(&doc).map_err(parse_err)?;
    let write_err = |source| ConfigError::Write { path: path.to_owned(), source };
    let tmp = path.with_extension("yaml.tmp");
    std::fs::write(&tmp, out).map_err(write_err)?;
    let perms = std::fs::metadata(path).map_err(write_err)?.permissions();
    std::fs::set_permissions(&tmp, perms).map_err(write_err)?;
    std::fs::rename(&tmp, path).map_err(write_err)
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
        conn.apply(load(Some(&p)).unwrap()).unwrap();
        assert_eq!(conn.brokers.as_deref(), Some("flag:9092"));
        assert_eq!(conn.topic_prefix.as_deref(), Some("team-a."));
        assert_eq!(conn.kafka_properties, [("linger.ms".to_owned(), "5".to_owned()), ("linger.ms".to_owned(), "1".to_owned())]);
        std::fs::write(&p, "broker: typo:9092\n").unwrap();
        let e = format!("{:#}", anyhow::Error::from(load(Some(&p)).unwrap_err()));
        assert!(e.contains("unknown field `broker`"), "{e}");
        assert!(load(Some(&dir.path().join("missing.yaml"))).is_err(), "an explicit file must exist");
    }

    const CONTEXTS: &str = "brokers: top:9092\ntopic_prefix: top.\ntenant: top-tenant\nschema_registry: http://top\nkafka_properties: {linger.ms: '5'}\ncurrent_context: prod\ncontexts:\n  prod: {brokers: prod:9094, topic_prefix: prod., kafka_properties: {linger.ms: '7'}}\n  staging: {brokers: staging:9094, tenant: web}\n";

    fn file(text: &str) -> ConfigFile {
        parse(PathBuf::from("/etc/ferry.yaml"), text).unwrap()
    }

    #[test]
    fn flags_and_environment_over_the_context_over_the_top_level() {
        // Flags and environment variables both reach `Conn` through clap: a field already set.
        let mut conn = Conn { brokers: Some("flag:9092".into()), ..Conn::default() };
        conn.apply(file(CONTEXTS)).unwrap();
        assert_eq!(conn.brokers.as_deref(), Some("flag:9092"), "a flag beats the context");
        assert_eq!(conn.topic_prefix.as_deref(), Some("prod."), "the current context beats the top level");
        assert_eq!(conn.tenant.as_deref(), Some("top-tenant"), "the top level fills what the context leaves unset");
        assert_eq!(conn.schema_registry.as_deref(), Some("http://top"));
        assert_eq!(conn.security_protocol, None, "nothing sets it: the default");
        let props: Vec<&str> = conn.kafka_properties.iter().map(|(_, v)| v.as_str()).collect();
        assert_eq!(props, ["5", "7"], "the context's properties come after (override) the top level's");

        // `--context` / FERRY_CONTEXT beats `current_context:`.
        let mut conn = Conn { context: Some("staging".into()), ..Conn::default() };
        conn.apply(file(CONTEXTS)).unwrap();
        assert_eq!((conn.brokers.as_deref(), conn.tenant.as_deref(), conn.topic_prefix.as_deref()), (Some("staging:9094"), Some("web"), Some("top.")));

        // connect_timeout as the flag takes it; a bad one names the key.
        let mut conn = Conn::default();
        conn.apply(file("connect_timeout: 1m30s\ncontexts: {fast: {connect_timeout: 2s}}\n")).unwrap();
        assert_eq!(conn.connect_timeout, Some(std::time::Duration::from_secs(90)));
        let mut conn = Conn { context: Some("fast".into()), ..Conn::default() };
        conn.apply(file("connect_timeout: 1m30s\ncontexts: {fast: {connect_timeout: 2s}}\n")).unwrap();
        assert_eq!(conn.connect_timeout, Some(std::time::Duration::from_secs(2)), "the context beats the top level");
        let e = format!("{:#}", anyhow::Error::from(parse(PathBuf::from("/etc/ferry.yaml"), "connect_timeout: soon\n").unwrap_err()));
        assert!(e.contains("connect_timeout") && e.contains("'soon'"), "{e}");

        // No context at all: the top level alone.
        let mut conn = Conn::default();
        conn.apply(file("brokers: top:9092\ncontexts: {prod: {brokers: prod:9094}}\n")).unwrap();
        assert_eq!(conn.brokers.as_deref(), Some("top:9092"));
    }

    #[test]
    fn an_unknown_context_is_an_error_naming_the_known_ones() {
        let mut conn = Conn { context: Some("prdo".into()), ..Conn::default() };
        let e = conn.apply(file(CONTEXTS)).unwrap_err().to_string();
        assert_eq!(e, "no context \"prdo\" in the config file /etc/ferry.yaml (contexts: prod, staging)");
        let e = Conn::default().apply(file("current_context: gone\n")).unwrap_err().to_string();
        assert_eq!(e, "no context \"gone\" in the config file /etc/ferry.yaml (contexts: none)");
        let e = parse(PathBuf::from("/x.yaml"), "contexts: {prod: {broker: a}}\n").unwrap_err();
        assert!(e.to_string().contains("(context \"prod\")"), "{e}");
        assert!(format!("{:#}", anyhow::Error::from(e)).contains("unknown field `broker`"));
    }

    #[test]
    fn use_context_writes_current_context_and_keeps_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.yaml");
        std::fs::write(&p, CONTEXTS).unwrap();
        use_context(&p, "staging").unwrap();
        let f = load(Some(&p)).unwrap();
        assert_eq!(f.current_context.as_deref(), Some("staging"));
        assert_eq!(f.contexts.len(), 2);
        assert_eq!(f.settings.brokers.as_deref(), Some("top:9092"));
        assert!(!dir.path().join("config.yaml.tmp").exists());
    }
}

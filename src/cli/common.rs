//! Shared CLI pieces: broker connection flags, spec files, output formats, signals.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, ValueEnum};
use ferry_runtime::{KafkaConfig, Topics};
use tokio_util::sync::CancellationToken;

/// How to reach Kafka; every flag also reads an environment variable.
#[derive(Debug, Args, Clone, Default)]
pub struct Conn {
    /// A YAML config file of these settings (default ~/.config/ferry/config.yaml when it exists).
    #[arg(long, global = true, env = "FERRY_CONFIG")]
    pub config: Option<PathBuf>,
    /// Bootstrap servers; defaults to the running `ferry dev` broker.
    #[arg(long, global = true, env = "FERRY_BROKERS")]
    pub brokers: Option<String>,
    /// Prefix of every topic name (isolates installations sharing a cluster).
    #[arg(long, global = true, env = "FERRY_TOPIC_PREFIX")]
    pub topic_prefix: Option<String>,
    /// PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.
    #[arg(long, global = true, env = "FERRY_KAFKA_SECURITY_PROTOCOL")]
    pub security_protocol: Option<String>,
    /// SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN.
    #[arg(long, global = true, env = "FERRY_KAFKA_SASL_MECHANISM")]
    pub sasl_mechanism: Option<String>,
    /// SASL user.
    #[arg(long, global = true, env = "FERRY_KAFKA_SASL_USERNAME")]
    pub sasl_username: Option<String>,
    /// SASL password (prefer the environment variable).
    #[arg(long, global = true, env = "FERRY_KAFKA_SASL_PASSWORD", hide_env_values = true)]
    pub sasl_password: Option<String>,
    /// CA bundle for TLS.
    #[arg(long, global = true, env = "FERRY_KAFKA_SSL_CA_LOCATION")]
    pub ssl_ca_location: Option<PathBuf>,
    /// A Confluent-compatible schema registry (http://HOST:PORT); the embedded one if unset.
    #[arg(long, global = true, env = "FERRY_SCHEMA_REGISTRY")]
    pub schema_registry: Option<String>,
    /// Send commands as this tenant, to its own topics (`ferry.tenants.<tenant>.<kind>`):
    /// the workers record the tenant as who asked, and hold its commands to its policy.
    #[arg(long, global = true, env = "FERRY_TENANT")]
    pub tenant: Option<String>,
    /// Any librdkafka property, KEY=VALUE (repeatable), e.g. session.timeout.ms=6000.
    #[arg(long = "kafka-property", global = true, value_parser = parse_property)]
    pub kafka_properties: Vec<(String, String)>,
}

fn parse_property(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("{s:?}: expected KEY=VALUE"))
}

impl Conn {
    pub fn kafka(&self) -> anyhow::Result<KafkaConfig> {
        let (bootstrap, embedded) = match &self.brokers {
            Some(b) => (b.clone(), false),
            None => {
                let f = super::state_dir().join("dev/bootstrap");
                let b = std::fs::read_to_string(&f)
                    .map(|s| s.trim().to_owned())
                    .with_context(|| format!("no --brokers given and no running `ferry dev` ({} not readable)", f.display()))?;
                (b, true)
            }
        };
        Ok(KafkaConfig {
            bootstrap,
            security_protocol: self.security_protocol.clone(),
            sasl_mechanism: self.sasl_mechanism.clone(),
            sasl_username: self.sasl_username.clone(),
            sasl_password: self.sasl_password.clone(),
            ssl_ca_location: self.ssl_ca_location.as_ref().map(|p| p.display().to_string()),
            extra: self.kafka_properties.clone(),
            // The embedded broker holds every fetch for the full wait (see KafkaConfig::for_embedded).
            fetch_wait_max_ms: embedded.then_some(5),
        })
    }

    pub fn topics(&self) -> Topics {
        Topics::with_prefix(self.topic_prefix.as_deref().unwrap_or_default())
    }

    pub async fn client(&self) -> anyhow::Result<ferry_runtime::Client> {
        let registry = match &self.schema_registry {
            Some(url) => ferry_runtime::schema_registry::confluent(url).await?,
            None => ferry_runtime::wire::Registry::embedded(),
        };
        let client = ferry_runtime::Client::with_registry(self.kafka()?, self.topics(), registry)?;
        Ok(match &self.tenant {
            Some(t) => client.as_tenant(t),
            None => client,
        })
    }
}

/// How results are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum Output {
    /// Aligned columns for people.
    #[default]
    Table,
    /// One JSON document, for scripts.
    Json,
    /// YAML.
    Yaml,
}

/// Cancels `token` on SIGINT or SIGTERM.
pub fn cancel_on_signal(token: CancellationToken) {
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        eprintln!("shutting down: finishing running steps (a second signal does not hurry it)");
        token.cancel();
    });
}

//! Shared CLI pieces: broker connection flags, task kinds and states as command-line
//! values, durations, output formats, signals.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::{Args, ValueEnum};
use ferry_runtime::{KafkaConfig, TaskKind, TaskState, Topics};
use rdkafka::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::producer::{BaseProducer, Producer, ProducerContext};
use tokio_util::sync::CancellationToken;

/// How to reach Kafka; every flag also reads an environment variable.
#[derive(Debug, Args, Clone, Default)]
pub struct Conn {
    /// A YAML config file of these settings (default ~/.config/ferry/config.yaml when it exists).
    #[arg(long, global = true, env = "FERRY_CONFIG")]
    pub config: Option<PathBuf>,
    /// The config file's context to use (default: its `current_context:`).
    #[arg(long, global = true, env = "FERRY_CONTEXT")]
    pub context: Option<String>,
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
    /// A Confluent-compatible schema registry, http[s]://HOST:PORT[?mode=register|lookup]
    /// (lookup: a locked registry; basic auth from FERRY_SCHEMA_REGISTRY_USER and
    /// FERRY_SCHEMA_REGISTRY_PASSWORD); the embedded ids if unset.
    #[arg(long, global = true, env = "FERRY_SCHEMA_REGISTRY", hide_env_values = true)]
    pub schema_registry: Option<String>,
    /// Send commands as this tenant, to its own topics (`ferry.tenants.<tenant>.<kind>`):
    /// the workers record the tenant as who asked, and hold its commands to its policy.
    #[arg(long, global = true, env = "FERRY_TENANT")]
    pub tenant: Option<String>,
    /// Any librdkafka property, KEY=VALUE (repeatable), e.g. session.timeout.ms=6000.
    #[arg(long = "kafka-property", global = true, value_parser = parse_property)]
    pub kafka_properties: Vec<(String, String)>,
    /// How long to try reaching Kafka before giving up, e.g. 5s, 1m (0s: do not check;
    /// default 5s, or `connect_timeout:` in the config file).
    #[arg(long, global = true, env = "FERRY_CONNECT_TIMEOUT", value_parser = parse_duration)]
    pub connect_timeout: Option<Duration>,
}

fn parse_property(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("'{s}': expected KEY=VALUE"))
}

/// How long a command tries to reach Kafka when neither a flag, the environment nor the
/// config file says.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A duration as people write it (`90s`, `10m`, `1h30m`, `500ms`), through `humantime`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("'{s}': {e} (e.g. 90s, 10m, 1h30m)"))
}

/// The value parser of a task-kind argument: `--help` lists the kinds (the registered
/// ones, `ferry_task::kind::catalogue`, so a new kind reaches the CLI by itself), and a
/// typo is refused with the valid names and the nearest one.
pub fn kind_parser() -> impl TypedValueParser<Value = TaskKind> {
    let values = ferry_runtime::kind::catalogue().into_iter().map(|i: &'static ferry_runtime::kind::KindInfo| PossibleValue::new(i.kind.as_str()).help(i.describe));
    PossibleValuesParser::new(values).map(|s| s.parse::<TaskKind>().expect("clap admits only the kinds' names"))
}

/// The value parser of a task-state argument (any case with `ignore_case`: `running`,
/// `Running`, `revert-failed`, `RevertFailed`), from `TaskState::ALL`.
pub fn state_parser() -> impl TypedValueParser<Value = TaskState> {
    let value = |s: TaskState| {
        let v = PossibleValue::new(s.name()).help(s.describe());
        if s == TaskState::RevertFailed { v.alias("revertfailed") } else { v }
    };
    PossibleValuesParser::new(TaskState::ALL.map(value)).map(move |s| {
        TaskState::ALL.into_iter().find(|st| value(*st).matches(&s, true)).expect("clap admits only the states' names")
    })
}

/// Kafka could not be reached before the connect timeout.
#[derive(Debug, thiserror::Error)]
#[error("cannot reach Kafka at {bootstrap}: {detail} (tried for {waited}; check --brokers and the TLS/SASL settings, or raise --connect-timeout)")]
pub struct Unreachable {
    /// The bootstrap servers tried.
    pub bootstrap: String,
    /// librdkafka's last word on the connection (refused, TLS handshake, SASL), else the
    /// metadata request's error.
    pub detail: String,
    /// How long it was tried, as people write it.
    pub waited: String,
}

/// A tenant's client would write or read a topic the broker does not have: no worker takes
/// those commands, so a submit would wait for an answer that never comes.
#[derive(Debug, thiserror::Error)]
pub enum NoTenantTopic {
    /// None of the tenant's topics: the workers were given no policy naming it.
    #[error(
        "tenant {tenant:?} has no topics at {bootstrap} (no {topic}): a tenant's commands reach the workers only through its own topics, which `ferry topics apply --policy FILE` makes (`ferry dev --policy FILE` on the embedded broker), and only workers given that policy read them (`ferry worker KIND --policy FILE`)"
    )]
    Tenant {
        /// The tenant (`--tenant`).
        tenant: String,
        /// Its progress topic, missing.
        topic: String,
        /// The bootstrap servers asked.
        bootstrap: String,
    },
    /// The tenant's topics, but not this kind's: its policy gives it no rule for the kind.
    #[error("tenant {tenant:?} may not submit {kind} tasks at {bootstrap}: it has no topic {topic} (the policy gives it no {kind} rule; `ferry topics apply --policy FILE` makes the topics of the kinds it does)")]
    Kind {
        /// The tenant (`--tenant`).
        tenant: String,
        /// The kind submitted.
        kind: TaskKind,
        /// Its command topic for the kind, missing.
        topic: String,
        /// The bootstrap servers asked.
        bootstrap: String,
    },
}

/// The probe's client context: keeps librdkafka's last error log line (connection
/// refused, TLS handshake, SASL authentication) instead of logging each retry (an
/// unreachable broker would print dozens of lines before the one that matters).
#[derive(Default)]
struct Probe {
    last_error: std::sync::Mutex<Option<String>>,
}

impl ClientContext for Probe {
    fn log(&self, level: RDKafkaLogLevel, _fac: &str, message: &str) {
        if (level as i32) <= RDKafkaLogLevel::Warning as i32 {
            // `[thrd:HOST:PORT/bootstrap]: HOST:PORT/bootstrap: Connect to ... failed: ...`
            let message = message.strip_prefix("[thrd:").and_then(|m| m.split_once("]: ")).map_or(message, |(_, m)| m);
            *self.last_error.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(message.to_owned());
        }
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        // AllBrokersDown follows every connection failure and says less than it.
        if error.rdkafka_error_code() != Some(rdkafka::types::RDKafkaErrorCode::AllBrokersDown) {
            *self.last_error.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(reason.to_owned());
        }
    }
}

impl ProducerContext for Probe {
    type DeliveryOpaque = ();

    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, (): ()) {}
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
            fetch_wait_max_ms: embedded.then_some(ferry_runtime::kafka::EMBEDDED_FETCH_WAIT_MS),
        })
    }

    pub fn topics(&self) -> Topics {
        Topics::with_prefix(self.topic_prefix.as_deref().unwrap_or_default())
    }

    /// Fails fast, with the address, when no broker answers a metadata request within the
    /// connect timeout (instead of each later read waiting out its own long timeout).
    /// Answers the topics the broker has (None: `--connect-timeout 0` skips the probe).
    pub async fn check_reachable(&self) -> anyhow::Result<Option<Vec<String>>> {
        let kafka = self.kafka()?;
        let timeout = self.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        if timeout.is_zero() {
            return Ok(None);
        }
        let bootstrap = kafka.bootstrap.clone();
        let probe = tokio::task::spawn_blocking(move || -> Result<Vec<String>, String> {
            // A bare producer handle that sends nothing: a consumer's group machinery made
            // the probe's own shutdown cost about 100 ms.
            let c: BaseProducer<Probe> = kafka.client().create_with_context(Probe::default()).map_err(|e| e.to_string())?;
            c.client().fetch_metadata(None, timeout).map(|md| md.topics().iter().map(|t| t.name().to_owned()).collect()).map_err(|e| {
                // Logs and errors wait on the client's queue (`log.queue`) until a poll serves them.
                c.poll(Duration::ZERO);
                let last = c.context().last_error.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
                last.unwrap_or_else(|| e.to_string())
            })
        });
        match probe.await.context("the Kafka probe panicked")? {
            Ok(topics) => Ok(Some(topics)),
            Err(detail) => Err(Unreachable { bootstrap, detail, waited: humantime::format_duration(timeout).to_string() }.into()),
        }
    }

    /// A client for a process that runs on (a worker's onboarding, the dashboard).
    pub async fn client(&self) -> anyhow::Result<ferry_runtime::Client> {
        self.make_client(ferry_runtime::Client::with_registry, None).await
    }

    /// The client of a command that prints and exits (submit, tasks, apps, watch): its
    /// producer sends at once ([`ferry_runtime::Client::short_lived`]).
    pub async fn command_client(&self) -> anyhow::Result<ferry_runtime::Client> {
        self.make_client(ferry_runtime::Client::short_lived, None).await
    }

    /// [`Self::command_client`] of a command that submits a `kind` task: as a tenant, its
    /// command topic for `kind` must exist too.
    pub async fn submit_client(&self, kind: TaskKind) -> anyhow::Result<ferry_runtime::Client> {
        self.make_client(ferry_runtime::Client::short_lived, Some(kind)).await
    }

    async fn make_client(
        &self,
        make: fn(KafkaConfig, Topics, ferry_runtime::wire::Registry) -> Result<ferry_runtime::Client, ferry_runtime::ClientError>,
        submits: Option<TaskKind>,
    ) -> anyhow::Result<ferry_runtime::Client> {
        let present = self.check_reachable().await?;
        // A tenant reads its own progress topic and writes its own command topics: without
        // them no worker answers it (the workers were given no policy naming it).
        if let (Some(tenant), Some(present)) = (&self.tenant, &present) {
            let (topics, tenant, bootstrap) = (self.topics(), tenant.clone(), self.kafka()?.bootstrap);
            let topic = topics.tenant_progress(&tenant).name;
            if !present.contains(&topic) {
                return Err(NoTenantTopic::Tenant { tenant, topic, bootstrap }.into());
            }
            if let Some(kind) = submits
                && let topic = topics.tenant_command(&tenant, kind).name
                && !present.contains(&topic)
            {
                return Err(NoTenantTopic::Kind { tenant, kind, topic, bootstrap }.into());
            }
        }
        let registry = match &self.schema_registry {
            Some(url) => ferry_runtime::schema_registry::confluent(url).await?,
            None => ferry_runtime::wire::Registry::embedded(),
        };
        let client = make(self.kafka()?, self.topics(), registry)?;
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

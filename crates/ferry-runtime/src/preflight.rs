//! A worker's first contact with Kafka: fetch the metadata of the topics it needs, so
//! wrong credentials, a missing topic or an unreachable broker end the start with one
//! clear error instead of endless retries in the background.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::kafka::KafkaConfig;

/// Why Kafka cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PreflightError {
    /// The brokers refused the credentials.
    #[error("Kafka at {bootstrap} refused the credentials of user {user:?} ({mechanism}): {reason}")]
    Authentication {
        /// Bootstrap servers.
        bootstrap: String,
        /// The SASL user (never the password).
        user: String,
        /// The mechanism.
        mechanism: String,
        /// What librdkafka said.
        reason: String,
    },
    /// No broker answered in time.
    #[error("no Kafka broker at {bootstrap} answered within {waited:?}: {reason}")]
    Unreachable {
        /// Bootstrap servers.
        bootstrap: String,
        /// How long we tried.
        waited: Duration,
        /// The last error.
        reason: String,
    },
    /// A topic the worker needs does not exist.
    #[error("topic {topic} does not exist at {bootstrap}: create the topics of topics/topics.yaml (ferry topics apply)")]
    MissingTopic {
        /// Bootstrap servers.
        bootstrap: String,
        /// The topic.
        topic: String,
    },
}

/// Keeps the errors librdkafka reports through its callback (authentication failures
/// arrive there, not as a request's result).
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<(KafkaError, String)>>>);

impl ClientContext for Capture {
    fn error(&self, error: KafkaError, reason: &str) {
        self.0.lock().expect("capture lock").push((error, reason.to_owned()));
    }
}

impl ConsumerContext for Capture {}

fn is_auth(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SaslAuthenticationFailed | RDKafkaErrorCode::TopicAuthorizationFailed)
    )
}

/// Checks that Kafka answers with these settings and that `topics` exist, within `limit`.
pub async fn check(kafka: &KafkaConfig, topics: &[String], limit: Duration) -> Result<(), PreflightError> {
    let kafka = kafka.clone();
    let topics = topics.to_vec();
    tokio::task::spawn_blocking(move || check_blocking(&kafka, &topics, limit)).await.expect("preflight task")
}

fn check_blocking(kafka: &KafkaConfig, topics: &[String], limit: Duration) -> Result<(), PreflightError> {
    let capture = Capture::default();
    let bootstrap = kafka.bootstrap.clone();
    let auth = |reason: String| PreflightError::Authentication {
        bootstrap: bootstrap.clone(),
        user: kafka.sasl_username.clone().unwrap_or_default(),
        mechanism: kafka.sasl_mechanism.clone().unwrap_or_else(|| "no SASL".into()),
        reason,
    };
    let consumer: BaseConsumer<Capture> = match kafka.reader().create_with_context(capture.clone()) {
        Ok(c) => c,
        Err(e) => return Err(PreflightError::Unreachable { bootstrap, waited: Duration::ZERO, reason: e.to_string() }),
    };
    let start = Instant::now();
    let mut last = String::from("no answer");
    while start.elapsed() < limit {
        // Serves the queue, where librdkafka's error callbacks (authentication) arrive.
        let _ = consumer.poll(Duration::ZERO);
        if let Some((e, reason)) = capture.0.lock().expect("capture lock").iter().find(|(e, _)| is_auth(e)) {
            return Err(auth(format!("{e}: {reason}")));
        }
        match consumer.fetch_metadata(None, Duration::from_secs(1)) {
            Ok(md) => {
                for t in topics {
                    let found = md.topics().iter().any(|m| m.name() == t && m.error().is_none() && !m.partitions().is_empty());
                    if !found {
                        return Err(PreflightError::MissingTopic { bootstrap, topic: t.clone() });
                    }
                }
                return Ok(());
            }
            Err(e) if is_auth(&e) => return Err(auth(e.to_string())),
            Err(e) => last = e.to_string(),
        }
    }
    if let Some((e, reason)) = capture.0.lock().expect("capture lock").last() {
        last = format!("{e}: {reason}");
    }
    Err(PreflightError::Unreachable { bootstrap, waited: limit, reason: last })
}

//! The embedded broker: librdkafka's in-process mock cluster on loopback ports, with
//! Ferry's topics created and fault injection (broker down/up, request errors, latency).
//!
//! Limits (../shared/TESTBED.md): no CreateTopics admin request, no compaction,
//! transaction markers ignored, and a fixed retention: each partition keeps at most 5 MB
//! or 100,000 batches and drops its oldest beyond (librdkafka `src/rdkafka_mock.c`,
//! `rd_kafka_mock_partition_init` and `rd_kafka_mock_msgset_new`), so a reader
//! further behind skips records. An empty fetch is answered only when its wait is over (no
//! wake on produce, `rdkafka_mock_handlers.c`), hence the short `fetch.wait.max.ms` of
//! [`crate::KafkaConfig::for_embedded`].
#![allow(unsafe_code)]

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::mocking::MockCluster;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer, ProducerContext};

use crate::topics::Topics;

/// Why the embedded broker could not start or change.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    /// librdkafka refused to create the mock cluster.
    #[error("could not start the embedded mock cluster: {0}")]
    Start(#[source] KafkaError),
    /// A topic could not be created.
    #[error("could not create topic {topic} on the embedded broker: {source}")]
    CreateTopic {
        /// The topic.
        topic: String,
        /// librdkafka's error.
        #[source]
        source: KafkaError,
    },
    /// A fault could not be injected.
    #[error("fault injection on the embedded broker failed: {0}")]
    Fault(#[source] KafkaError),
}

/// The context of the handle that owns the mock cluster. That handle is no client of
/// Ferry's: it produces nothing, yet keeps connections to its own mock brokers, and logs
/// their failures as errors whenever the brokers go (while [`EmbeddedBroker::all_down`]
/// holds, and as the cluster is destroyed with the handle), beside the clients' own
/// reports of the same outage. Its log goes to debug.
pub struct BrokerContext;

impl ClientContext for BrokerContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        tracing::debug!(?level, fac, "embedded broker's handle: {log_message}");
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::debug!(%error, "embedded broker's handle: {reason}");
    }
}

impl ProducerContext for BrokerContext {
    type DeliveryOpaque = ();

    fn delivery(&self, _: &DeliveryResult<'_>, (): ()) {}
}

/// An in-process Kafka-protocol cluster that lives as long as this value.
pub struct EmbeddedBroker {
    // The mock cluster belongs to this client's handle and dies with it.
    handle: BaseProducer<BrokerContext>,
    brokers: i32,
}

impl std::fmt::Debug for EmbeddedBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedBroker").field("bootstrap", &self.bootstrap()).finish()
    }
}

impl EmbeddedBroker {
    /// Starts `brokers` mock brokers and creates every topic of `topics`.
    pub fn start(brokers: i32, topics: &Topics) -> Result<Self, EmbeddedError> {
        let handle: BaseProducer<BrokerContext> = ClientConfig::new()
            .set("test.mock.num.brokers", brokers.to_string())
            .set("log_level", "3")
            .create_with_context(BrokerContext)
            .map_err(EmbeddedError::Start)?;
        let broker = Self { handle, brokers };
        // A new consumer group waits 3 s for more members by default; workers join at once.
        // SAFETY: the handle is a live producer created above with a mock cluster attached;
        // librdkafka returns that cluster's pointer, which stays valid while `handle` lives.
        unsafe {
            let mc = rdkafka_sys::rd_kafka_handle_mock_cluster(broker.handle.client().native_ptr());
            if !mc.is_null() {
                rdkafka_sys::rd_kafka_mock_group_initial_rebalance_delay_ms(mc, 0);
            }
        }
        let rf = brokers.min(3);
        for def in topics.all() {
            broker.create_topic(&def.name, def.partitions, rf)?;
        }
        Ok(broker)
    }

    fn cluster(&self) -> MockCluster<'_, BrokerContext> {
        self.handle.client().mock_cluster().expect("created with test.mock.num.brokers")
    }

    /// The bootstrap list clients connect to.
    pub fn bootstrap(&self) -> String {
        self.cluster().bootstrap_servers()
    }

    /// Creates a topic (the mock cluster has no admin API).
    pub fn create_topic(&self, name: &str, partitions: i32, replication: i32) -> Result<(), EmbeddedError> {
        self.cluster()
            .create_topic(name, partitions, replication)
            .map_err(|source| EmbeddedError::CreateTopic { topic: name.to_owned(), source })
    }

    /// Takes every broker down (connections refused until [`Self::all_up`]).
    pub fn all_down(&self) -> Result<(), EmbeddedError> {
        for id in 1..=self.brokers {
            self.cluster().broker_down(id).map_err(EmbeddedError::Fault)?;
        }
        Ok(())
    }

    /// Brings every broker back.
    pub fn all_up(&self) -> Result<(), EmbeddedError> {
        for id in 1..=self.brokers {
            self.cluster().broker_up(id).map_err(EmbeddedError::Fault)?;
        }
        Ok(())
    }

    /// Adds `rtt` to every request of every broker.
    pub fn set_round_trip(&self, rtt: Duration) -> Result<(), EmbeddedError> {
        for id in 1..=self.brokers {
            self.cluster().broker_round_trip_time(id, rtt).map_err(EmbeddedError::Fault)?;
        }
        Ok(())
    }

    /// Fails the next `n` produce, fetch, offset-commit and heartbeat requests (whichever
    /// client sends them) with the retriable errors a real cluster gives while a leader or
    /// coordinator moves: NOT_ENOUGH_REPLICAS, NOT_LEADER_FOR_PARTITION,
    /// COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE.
    pub fn fail_requests(&self, n: usize) {
        use rdkafka::types::{RDKafkaApiKey as Api, RDKafkaRespErr as Err};
        let c = self.cluster();
        c.request_errors(Api::Produce, &vec![Err::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS; n]);
        c.request_errors(Api::Fetch, &vec![Err::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION; n]);
        c.request_errors(Api::OffsetCommit, &vec![Err::RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS; n]);
        c.request_errors(Api::Heartbeat, &vec![Err::RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE; n]);
    }

    /// The raw mock cluster, for other fault injection (request errors).
    pub fn mock(&self) -> MockCluster<'_, BrokerContext> {
        self.cluster()
    }

    /// Flushes nothing; present so callers can hold the broker explicitly.
    pub fn flush(&self) {
        let _ = self.handle.flush(Duration::from_millis(0));
    }
}

//! Kafka client settings shared by workers, the CLI and the dashboard: bootstrap list,
//! TLS and SASL, and the producer/consumer configs Ferry's guarantees rely on.

use std::fmt;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};

/// `fetch.wait.max.ms` on the embedded broker: how long an empty fetch is held, so the
/// most a hop waits for a record already there. Every consumer sends one fetch per broker
/// per wait while idle: at 5 ms the idle fetches of `ferry dev`'s workers kept most of a
/// core busy (docs/BENCHMARKS.md, "CI").
pub const EMBEDDED_FETCH_WAIT_MS: u32 = 20;

/// How to reach a Kafka cluster. Secrets are never printed (see the `Debug` impl).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct KafkaConfig {
    /// `host:port,host:port`.
    pub bootstrap: String,
    /// `PLAINTEXT`, `SSL`, `SASL_PLAINTEXT` or `SASL_SSL`; empty means PLAINTEXT.
    pub security_protocol: Option<String>,
    /// `SCRAM-SHA-512`, `SCRAM-SHA-256` or `PLAIN`.
    pub sasl_mechanism: Option<String>,
    /// SASL user.
    pub sasl_username: Option<String>,
    /// SASL password (never logged).
    pub sasl_password: Option<String>,
    /// PEM file of the CA that signed the brokers' certificates.
    pub ssl_ca_location: Option<String>,
    /// Extra librdkafka properties (`key=value`), applied last.
    pub extra: Vec<(String, String)>,
    /// `fetch.wait.max.ms` of consumers (librdkafka's default when `None`).
    pub fetch_wait_max_ms: Option<u32>,
}

impl fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaConfig")
            .field("bootstrap", &self.bootstrap)
            .field("security_protocol", &self.security_protocol)
            .field("sasl_mechanism", &self.sasl_mechanism)
            .field("sasl_username", &self.sasl_username)
            .field("sasl_password", &self.sasl_password.as_ref().map(|_| "<redacted>"))
            .field("ssl_ca_location", &self.ssl_ca_location)
            .finish()
    }
}

impl KafkaConfig {
    /// PLAINTEXT to `bootstrap`.
    pub fn plaintext(bootstrap: impl Into<String>) -> Self {
        Self { bootstrap: bootstrap.into(), ..Self::default() }
    }

    /// SASL/SCRAM-SHA-512 over plaintext (a loopback broker such as tansu) as `user`.
    pub fn scram_plaintext(bootstrap: impl Into<String>, user: &str, password: &str) -> Self {
        Self {
            security_protocol: Some("SASL_PLAINTEXT".into()),
            sasl_mechanism: Some("SCRAM-SHA-512".into()),
            sasl_username: Some(user.into()),
            sasl_password: Some(password.into()),
            ..Self::plaintext(bootstrap)
        }
    }

    /// For the embedded mock cluster, which does not answer a fetch early when data
    /// arrives: short fetch waits ([`EMBEDDED_FETCH_WAIT_MS`]), or every hop costs
    /// `fetch.wait.max.ms` (500 ms).
    pub fn for_embedded(bootstrap: impl Into<String>) -> Self {
        Self { fetch_wait_max_ms: Some(EMBEDDED_FETCH_WAIT_MS), ..Self::plaintext(bootstrap) }
    }

    /// Settings from `FERRY_KAFKA_*` environment variables, with `bootstrap` as given.
    pub fn from_env(bootstrap: impl Into<String>) -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Self {
            bootstrap: bootstrap.into(),
            security_protocol: var("FERRY_KAFKA_SECURITY_PROTOCOL"),
            sasl_mechanism: var("FERRY_KAFKA_SASL_MECHANISM"),
            sasl_username: var("FERRY_KAFKA_SASL_USERNAME"),
            sasl_password: var("FERRY_KAFKA_SASL_PASSWORD"),
            ssl_ca_location: var("FERRY_KAFKA_SSL_CA_LOCATION"),
            extra: Vec::new(),
            fetch_wait_max_ms: None,
        }
    }

    /// The common client config: bootstrap and security.
    pub fn client(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.bootstrap);
        // Loopback brokers advertise 127.0.0.1; IPv4 avoids `localhost` resolving to ::1.
        c.set("broker.address.family", "v4");
        // A request on a connection that went dead without a reset (a frozen broker, a
        // partition, the embedded broker's outage) blocks its producer or reader until
        // this timeout: librdkafka's 60 s cost the fault campaign 60 s stalls after a 5 s
        // outage. Ferry's records are small; 10 s (the Java clients' connection-setup
        // default) is ample. `--kafka-property` overrides both.
        c.set("socket.timeout.ms", "10000");
        c.set("socket.connection.setup.timeout.ms", "10000");
        let opt = [
            ("security.protocol", &self.security_protocol),
            ("sasl.mechanism", &self.sasl_mechanism),
            ("sasl.username", &self.sasl_username),
            ("sasl.password", &self.sasl_password),
            ("ssl.ca.location", &self.ssl_ca_location),
        ];
        for (k, v) in opt {
            if let Some(v) = v {
                c.set(k, v);
            }
        }
        for (k, v) in &self.extra {
            c.set(k, v);
        }
        c
    }

    /// A producer for durable records: idempotent, acks=all, ordered per partition.
    pub fn producer(&self) -> ClientConfig {
        let mut c = self.client();
        c.set("enable.idempotence", "true")
            .set("acks", "all")
            // 1 ms: 0 costs about 40 % of `ferry bench runtime`'s tasks/s (smaller
            // requests, more of them); 1 ms keeps 2 ms's throughput and cuts Succeeded p50
            // at 100 tasks/s from 23-25 to 16 ms (docs/BENCHMARKS.md, sessions 16, 23, 24).
            .set("linger.ms", "1")
            .set("message.timeout.ms", "300000")
            // Explicit: the limits in ferry_task::limits are derived from it.
            .set("message.max.bytes", crate::limits::RECORD_BYTES.to_string());
        for (k, v) in &self.extra {
            c.set(k, v);
        }
        c
    }

    /// A producer for a process that sends a few commands and exits (the CLI): acks=all
    /// and ordered (one request in flight), but not idempotent. An idempotent producer
    /// cannot send before it holds a producer id, and librdkafka asks for one on a 500 ms
    /// timer when no broker is up at the first try (`rd_kafka_idemp_init` and
    /// `rd_kafka_idemp_pid_timer_restart`, librdkafka `src/rdkafka_idempotence.c`): the
    /// bootstrap connection is dropped once the brokers are known, so a fresh CLI waited
    /// 0.5-1 s before its one record left. Idempotence only dedupes a retried batch,
    /// and the workers take a command twice safely: a second Start of a task id only
    /// republishes its state, a signal is recorded once, and a Cancel or Revert acts on
    /// the state the first one left (`scheduler.rs`).
    pub fn command_producer(&self) -> ClientConfig {
        let mut c = self.producer();
        c.set("enable.idempotence", "false").set("max.in.flight.requests.per.connection", "1");
        for (k, v) in &self.extra {
            c.set(k, v);
        }
        c
    }

    /// A group consumer that stores offsets only when told (after the work is durable).
    pub fn group_consumer(&self, group: &str) -> ClientConfig {
        let mut c = self.client();
        c.set("group.id", group)
            .set("enable.auto.commit", "true")
            .set("enable.auto.offset.store", "false")
            .set("auto.commit.interval.ms", "1000")
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", "10000")
            .set("heartbeat.interval.ms", "1000")
            // The intake polls every 100 ms; only rebalance callbacks hold it longer, each
            // bounded: a revoke by the revoke grace plus 5 s, an assignment by the task-state
            // view's catch-up limit (60 s). This is also the rebalance timeout and the limit
            // of a JoinGroup request: librdkafka's 300 s default let one lost JoinGroup
            // response stall every worker of the fault campaign for 270 s.
            .set("max.poll.interval.ms", "90000")
            // Incremental rebalancing: a worker joining or leaving moves only the partitions
            // that change owner; the others' tasks keep running (rdkafka's default
            // rebalance handler assigns and unassigns incrementally for this protocol).
            .set("partition.assignment.strategy", "cooperative-sticky");
        self.finish_consumer(c)
    }

    /// Consumer-only settings, then the caller's extras (which win).
    fn finish_consumer(&self, mut c: ClientConfig) -> ClientConfig {
        if let Some(ms) = self.fetch_wait_max_ms {
            c.set("fetch.wait.max.ms", ms.to_string());
        }
        for (k, v) in &self.extra {
            c.set(k, v);
        }
        c
    }

    /// A consumer with no group, for reading whole topics (task state, progress).
    pub fn reader(&self) -> ClientConfig {
        let mut c = self.client();
        // librdkafka wants a group.id even for assign()-only consumers; nothing is committed.
        c.set("group.id", "ferry-reader")
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false");
        self.finish_consumer(c)
    }

    /// A [`Self::reader`] assigned every partition of `topic`, from its beginning
    /// (`from_start`) or from its end as of this call, so that nothing written after the
    /// call is missed. Blocking (metadata and watermark requests, each up to 30 s).
    pub fn topic_reader(&self, topic: &str, from_start: bool) -> Result<StreamConsumer, KafkaError> {
        // The reader asks for the topic's metadata itself before its assignment: a reader
        // assigned partitions of a topic it has no metadata for fetches nothing until
        // librdkafka's 1 s timer refreshes "unavailable topics", which made `ferry submit
        // --wait` see a task's first event up to 1 s late.
        let consumer: StreamConsumer = self.reader().create()?;
        let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(30))?;
        let mut tpl = TopicPartitionList::new();
        for p in md.topics().iter().flat_map(|t| t.partitions()) {
            // An explicit end offset: `Offset::End` resolves lazily and could skip records
            // produced right after this call.
            let start = if from_start {
                Offset::Beginning
            } else {
                Offset::Offset(consumer.fetch_watermarks(topic, p.id(), Duration::from_secs(30))?.1)
            };
            tpl.add_partition_offset(topic, p.id(), start)?;
        }
        consumer.assign(&tpl)?;
        Ok(consumer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_password() {
        let c = KafkaConfig {
            sasl_password: Some("hunter2".into()),
            ..KafkaConfig::plaintext("127.0.0.1:9092")
        };
        let shown = format!("{c:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("<redacted>"));
    }
}

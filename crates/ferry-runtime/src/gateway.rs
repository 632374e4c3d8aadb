//! The tenants' gateway, a thread of every worker whose kind some tenant may submit: it
//! reads the tenants' command topics of the kind (`ferry.tenants.<tenant>.<kind>`, which
//! only that tenant may write) and forwards each record to the kind's command topic
//! unchanged, but for the [`TENANT_HEADER`]: set to the tenant whose topic it came from,
//! any such header the sender put on dropped. The intake then treats it as that tenant's.
//!
//! At-least-once: an offset is stored only after its record's copy is acknowledged
//! (acks=all, idempotent producer); a copy made twice after a crash is the same command
//! twice, which the scheduler dedupes by task id. Records keep their key (the subject), so
//! a tenant's commands on one subject stay in order.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::kafka::KafkaConfig;
use crate::tenants::TENANT_HEADER;

/// Most records forwarded per round.
const MAX_BATCH: usize = 500;

/// Pause before a round whose copies failed is read again.
const RETRY_PAUSE: Duration = Duration::from_secs(2);

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
#[error("tenant gateway to {target}: {source}")]
pub struct GatewayError {
    /// The command topic it forwards to.
    target: String,
    /// Cause.
    #[source]
    source: Box<KafkaError>,
}

pub(crate) struct Gateway {
    consumer: BaseConsumer,
    producer: FutureProducer,
    /// Tenant topic → tenant.
    tenants: HashMap<String, String>,
    target: String,
    stop: Arc<AtomicBool>,
}

impl Gateway {
    /// A gateway in consumer group `group` from `tenants` (topic, tenant) to `target`.
    pub(crate) fn new(kafka: &KafkaConfig, group: &str, tenants: Vec<(String, String)>, target: &str, stop: Arc<AtomicBool>) -> Result<Self, GatewayError> {
        let err = |source| GatewayError { target: target.to_owned(), source: Box::new(source) };
        let consumer: BaseConsumer = kafka.group_consumer(group).create().map_err(err)?;
        let topics: Vec<&str> = tenants.iter().map(|(t, _)| t.as_str()).collect();
        consumer.subscribe(&topics).map_err(err)?;
        let producer: FutureProducer = kafka.producer().create().map_err(err)?;
        Ok(Self { consumer, producer, tenants: tenants.into_iter().collect(), target: target.to_owned(), stop })
    }

    /// Forwards until told to stop, then commits what was forwarded.
    pub(crate) fn run(self) {
        tracing::info!(target_topic = %self.target, tenants = self.tenants.len(), "tenant gateway started");
        while !self.stop.load(Ordering::Relaxed) {
            if let Err(e) = self.round() {
                tracing::error!(target_topic = %self.target, error = %e, pause_ms = RETRY_PAUSE.as_millis() as u64, "tenant commands not forwarded; reading them again");
                std::thread::sleep(RETRY_PAUSE);
            }
        }
        self.consumer.unsubscribe();
        let _ = self.consumer.commit_consumer_state(CommitMode::Sync);
    }

    /// One batch: copies made and acknowledged, then their offsets stored. On a failed
    /// copy, every partition of the batch is rewound to its first record.
    fn round(&self) -> Result<(), KafkaError> {
        let Some(first) = self.consumer.poll(Duration::from_millis(100)) else { return Ok(()) };
        let mut deliveries = Vec::new();
        let mut offsets: BTreeMap<(String, i32), (i64, i64)> = BTreeMap::new();
        let mut next = Some(first);
        while let Some(r) = next.take() {
            let m = match r {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(error = %e, "tenant command consumer error");
                    break;
                }
            };
            let Some(tenant) = self.tenants.get(m.topic()) else { continue };
            let mut headers = OwnedHeaders::new();
            if let Some(hs) = m.headers() {
                for h in hs.iter().filter(|h| h.key != TENANT_HEADER) {
                    headers = headers.insert(Header { key: h.key, value: h.value });
                }
            }
            headers = headers.insert(Header { key: TENANT_HEADER, value: Some(tenant.as_bytes()) });
            let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&self.target).payload(m.payload().unwrap_or_default()).headers(headers);
            if let Some(k) = m.key() {
                record = record.key(k);
            }
            let delivery = loop {
                match self.producer.send_result(record) {
                    Ok(d) => break d,
                    Err((KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull), r)) => {
                        record = r;
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err((e, _)) => return Err(self.rewind(&offsets, e)),
                }
            };
            deliveries.push(delivery);
            offsets.entry((m.topic().to_owned(), m.partition())).and_modify(|(_, last)| *last = m.offset()).or_insert((m.offset(), m.offset()));
            if deliveries.len() < MAX_BATCH {
                next = self.consumer.poll(Duration::ZERO);
            }
        }
        for d in futures::executor::block_on(futures::future::join_all(deliveries)) {
            match d {
                Ok(Ok(_)) => {}
                Ok(Err((e, _))) => return Err(self.rewind(&offsets, e)),
                Err(_) => return Err(self.rewind(&offsets, KafkaError::Canceled)),
            }
        }
        for ((topic, partition), (_, last)) in offsets {
            // Fails only for a partition revoked meanwhile; its next owner forwards again.
            if let Err(e) = self.consumer.store_offset(&topic, partition, last) {
                tracing::debug!(%topic, partition, error = %e, "offset not stored");
            }
        }
        Ok(())
    }

    /// Rewinds each partition of a failed batch to its first record; returns `e`.
    fn rewind(&self, offsets: &BTreeMap<(String, i32), (i64, i64)>, e: KafkaError) -> KafkaError {
        for ((topic, partition), (first, _)) in offsets {
            if let Err(e) = self.consumer.seek(topic, *partition, rdkafka::Offset::Offset(*first), Duration::from_secs(10)) {
                tracing::warn!(%topic, partition, error = %e, "could not rewind the tenant topic");
            }
        }
        e
    }
}

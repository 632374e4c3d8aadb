//! Reports the consumer group's lag on its command topic as a gauge, every few seconds.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

use crate::kafka::KafkaConfig;
use crate::metrics::Metrics;

pub(crate) async fn report(kafka: KafkaConfig, group: String, topic: String, metrics: Arc<Metrics>, stop: CancellationToken) {
    let Ok(consumer) = kafka.group_consumer(&group).create::<BaseConsumer>() else { return };
    let consumer = Arc::new(consumer);
    let mut ticks = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let c = consumer.clone();
        let t = topic.clone();
        let lag = tokio::task::spawn_blocking(move || -> Option<i64> {
            let md = c.fetch_metadata(Some(&t), Duration::from_secs(5)).ok()?;
            let mut tpl = TopicPartitionList::new();
            for p in md.topics().first()?.partitions() {
                tpl.add_partition(&t, p.id());
            }
            let committed = c.committed_offsets(tpl, Duration::from_secs(5)).ok()?;
            let mut lag = 0;
            for e in committed.elements() {
                let (lo, hi) = c.fetch_watermarks(&t, e.partition(), Duration::from_secs(5)).ok()?;
                let at = match e.offset() {
                    Offset::Offset(o) => o,
                    _ => lo,
                };
                lag += (hi - at).max(0);
            }
            Some(lag)
        })
        .await
        .ok()
        .flatten();
        if let Some(lag) = lag {
            metrics.set_lag(&topic, lag);
        }
    }
}

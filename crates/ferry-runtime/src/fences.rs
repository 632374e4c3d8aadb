//! Partition fences: one cancellation token per command partition this worker owns,
//! shared by the scheduler (each runner holds a child of its partition's token) and the
//! intake's rebalance callback, which cancels them the moment librdkafka reports the
//! assignment lost, even while the scheduler is busy waiting on the broker.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio_util::sync::CancellationToken;

/// The fences of the partitions a worker owns.
#[derive(Debug, Default)]
pub(crate) struct Fences(Mutex<HashMap<i32, CancellationToken>>);

impl Fences {
    /// Opens a fresh fence for each partition just assigned (one of an earlier ownership
    /// stays cancelled).
    pub(crate) fn open(&self, partitions: impl IntoIterator<Item = i32>) {
        let mut map = self.0.lock().expect("fences lock");
        for p in partitions {
            map.insert(p, CancellationToken::new());
        }
    }

    /// A fence for one task of `partition`: cancelled with the partition's, or on its own.
    /// Already cancelled when the partition is not owned (given up or lost meanwhile).
    pub(crate) fn child(&self, partition: i32) -> CancellationToken {
        match self.0.lock().expect("fences lock").get(&partition) {
            Some(t) => t.child_token(),
            None => {
                let t = CancellationToken::new();
                t.cancel();
                t
            }
        }
    }

    /// Whether `partition` is owned and not fenced.
    pub(crate) fn is_open(&self, partition: i32) -> bool {
        self.0.lock().expect("fences lock").get(&partition).is_some_and(|t| !t.is_cancelled())
    }

    /// Cancels and forgets the fences of `partitions`: their tasks write nothing more.
    pub(crate) fn close(&self, partitions: &[i32]) {
        let mut map = self.0.lock().expect("fences lock");
        for p in partitions {
            if let Some(t) = map.remove(p) {
                t.cancel();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_partition_fences_its_tasks_and_new_ones() {
        let f = Fences::default();
        f.open([1, 2]);
        let (a, b) = (f.child(1), f.child(2));
        f.close(&[1]);
        assert!(a.is_cancelled());
        assert!(!b.is_cancelled());
        assert!(f.child(1).is_cancelled(), "a task started after the loss is fenced from the start");
        f.open([1]);
        assert!(!f.child(1).is_cancelled(), "owned again: a fresh fence");
        assert!(a.is_cancelled(), "the old ownership's tasks stay fenced");
    }
}

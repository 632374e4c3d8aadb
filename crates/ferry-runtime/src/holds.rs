//! Commit holds: command offsets the intake may not commit past. A control deferred with
//! its task (another worker's newer write of it stood in the view) lives only in this
//! worker's memory until it is applied; if the partition goes first, its next owner must
//! read the control's record again, so no offset past it is stored meanwhile.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

/// The held offsets of each command partition, shared by the scheduler (which holds and
/// releases them) and the intake (which stores offsets under them).
#[derive(Debug, Default)]
pub(crate) struct CommitHolds(Mutex<Holds>);

#[derive(Debug, Default)]
struct Holds {
    /// Held offsets per partition, with how many controls hold each.
    held: HashMap<i32, BTreeMap<i64, usize>>,
    /// Per held partition, the newest record offset the intake wanted to store: stored once
    /// the partition's holds are gone ([`CommitHolds::take_released`]).
    wanted: HashMap<i32, i64>,
}

impl CommitHolds {
    /// Holds the record at `offset` of `partition` (and every later one) uncommitted.
    pub(crate) fn hold(&self, partition: i32, offset: i64) {
        let mut h = self.0.lock().expect("holds lock");
        *h.held.entry(partition).or_default().entry(offset).or_default() += 1;
    }

    /// Releases one hold of each (partition, offset) of `records`.
    pub(crate) fn release(&self, records: impl IntoIterator<Item = (i32, i64)>) {
        let mut h = self.0.lock().expect("holds lock");
        for (partition, offset) in records {
            let Some(offsets) = h.held.get_mut(&partition) else { continue };
            if let Some(n) = offsets.get_mut(&offset) {
                *n -= 1;
                if *n == 0 {
                    offsets.remove(&offset);
                }
            }
            if offsets.is_empty() {
                h.held.remove(&partition);
            }
        }
    }

    /// Drops every hold of `partitions` (given up: their next owner reads from the offsets
    /// committed under the holds, the held records included).
    pub(crate) fn clear(&self, partitions: &[i32]) {
        let mut h = self.0.lock().expect("holds lock");
        for p in partitions {
            h.held.remove(p);
            h.wanted.remove(p);
        }
    }

    /// The offset to store for the record at `offset` of `partition` (librdkafka commits
    /// the one after it): `offset` itself, or the one before the partition's lowest hold
    /// (`None`: a hold at 0 leaves nothing to store).
    pub(crate) fn storable(&self, partition: i32, offset: i64) -> Option<i64> {
        let mut h = self.0.lock().expect("holds lock");
        let Some(lowest) = h.held.get(&partition).and_then(|o| o.keys().next().copied()) else { return Some(offset) };
        if offset < lowest {
            return Some(offset);
        }
        let wanted = h.wanted.entry(partition).or_insert(offset);
        *wanted = (*wanted).max(offset);
        (lowest > 0).then_some(lowest - 1)
    }

    /// The offsets held back from partitions that no hold stops any more: to store now.
    pub(crate) fn take_released(&self) -> Vec<(i32, i64)> {
        let mut h = self.0.lock().expect("holds lock");
        let Holds { held, wanted } = &mut *h;
        let released: Vec<(i32, i64)> = wanted.iter().filter(|(p, _)| !held.contains_key(p)).map(|(p, o)| (*p, *o)).collect();
        for (p, _) in &released {
            wanted.remove(p);
        }
        released
    }
}

#[cfg(test)]
mod tests {
    use super::CommitHolds;

    #[test]
    fn a_held_offset_caps_what_is_stored_until_released() {
        let holds = CommitHolds::default();
        assert_eq!(holds.storable(0, 7), Some(7), "nothing held");
        holds.hold(0, 10);
        assert_eq!(holds.storable(0, 9), Some(9), "before the hold");
        assert_eq!(holds.storable(0, 10), Some(9), "the held record itself stays uncommitted");
        assert_eq!(holds.storable(0, 15), Some(9));
        assert_eq!(holds.storable(1, 15), Some(15), "another partition");
        assert!(holds.take_released().is_empty(), "still held");
        holds.release([(0, 10)]);
        assert_eq!(holds.take_released(), vec![(0, 15)], "the newest wanted offset, once");
        assert!(holds.take_released().is_empty());
        assert_eq!(holds.storable(0, 16), Some(16));
    }

    #[test]
    fn holds_count_and_the_lowest_decides() {
        let holds = CommitHolds::default();
        holds.hold(2, 5);
        holds.hold(2, 5);
        holds.hold(2, 8);
        assert_eq!(holds.storable(2, 9), Some(4));
        holds.release([(2, 5)]);
        assert_eq!(holds.storable(2, 9), Some(4), "one control still holds 5");
        holds.release([(2, 5)]);
        assert_eq!(holds.storable(2, 9), Some(7), "8 holds now");
        holds.release([(2, 8)]);
        assert_eq!(holds.take_released(), vec![(2, 9)]);
    }

    #[test]
    fn a_hold_at_the_first_record_stores_nothing_and_clear_forgets() {
        let holds = CommitHolds::default();
        holds.hold(3, 0);
        assert_eq!(holds.storable(3, 4), None);
        holds.clear(&[3]);
        assert!(holds.take_released().is_empty(), "a partition given up stores nothing later");
        assert_eq!(holds.storable(3, 5), Some(5));
    }
}

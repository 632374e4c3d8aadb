//! Size limits of Ferry's records and of a command's fields, in one place: what the
//! producer may send, what a command may weigh, and how much of a bad record a dead letter
//! keeps. `topics/topics.yaml` sets the topics' `max.message.bytes` above [`RECORD_BYTES`].

/// Largest record Ferry produces (librdkafka's `message.max.bytes`, set explicitly).
pub const RECORD_BYTES: usize = 1_000_000;

/// Largest command record a worker accepts. A task's snapshot carries its command's spec
/// beside its journal and step outputs, and must stay under [`RECORD_BYTES`]; a bigger
/// command is Rejected with the reason, before it becomes a task.
pub const COMMAND_BYTES: usize = 256 * 1024;

/// Most bytes a task's step outputs (JSON) may take together. With the command (at most
/// [`COMMAND_BYTES`]) and the journal they make its snapshot, which must fit in
/// [`RECORD_BYTES`]; a step whose output would pass this fails with `OUTPUT_TOO_LARGE`.
pub const STEP_OUTPUTS_BYTES: usize = 512 * 1024;

/// Longest subject (the record key: `<namespace>/<name>`, `<cluster>`, a pair of them).
pub const SUBJECT_BYTES: usize = 512;

/// Longest `requested_by` or idempotency key.
pub const NAME_BYTES: usize = 256;

/// Longest free-text reason of a cancel or revert, or of a dead letter.
pub const REASON_BYTES: usize = 4096;

/// How much of a bad record's value a dead letter keeps (with the original size and a
/// SHA-256 of the whole when it keeps less).
pub const DEAD_LETTER_HEAD_BYTES: usize = 64 * 1024;

/// How much of a bad record's key a dead letter keeps.
pub const DEAD_LETTER_KEY_BYTES: usize = 1024;

/// How many bytes of a bad record's headers a dead letter keeps (whole headers, in order).
pub const DEAD_LETTER_HEADERS_BYTES: usize = 16 * 1024;

/// Most bytes the Avro decoder may allocate for one length it reads (a string, a byte
/// array, or an array's or map's element count). No legitimate length exceeds a record.
pub const AVRO_ALLOCATION_BYTES: usize = RECORD_BYTES;

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
pub fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncates_on_a_character_boundary() {
        assert_eq!(truncate("abc", 5), "abc");
        assert_eq!(truncate("abc", 2), "ab");
        // "é" is two bytes: cutting inside it keeps what comes before.
        assert_eq!(truncate("aé", 2), "a");
        assert_eq!(truncate("", 0), "");
    }

    #[test]
    fn the_limits_nest() {
        const { assert!(COMMAND_BYTES < RECORD_BYTES / 2) };
        const { assert!(DEAD_LETTER_HEAD_BYTES + DEAD_LETTER_KEY_BYTES + DEAD_LETTER_HEADERS_BYTES + REASON_BYTES < RECORD_BYTES / 4) };
    }
}

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

/// Longest message a task's snapshot or event keeps (a step's error, a progress report, a
/// retry's reason): a step may say anything (a Kubernetes error can echo a whole object),
/// and the rest is cut with a note of how much ([`bounded`]). Before, a step's
/// megabyte-long error made a snapshot the producer refused, retried for ever.
pub const MESSAGE_BYTES: usize = 4096;

/// Longest reason of a Signal a task keeps in its snapshot (its Signalled event carries up
/// to [`REASON_BYTES`]): a task keeps up to 100 Signals, and they must fit beside the
/// command and the step outputs.
pub const SIGNAL_REASON_BYTES: usize = 512;

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

/// `s`, cut to at most `max` bytes (on a character boundary) with a note of what was cut.
pub fn bounded(s: String, max: usize) -> String {
    if s.len() <= max {
        return s;
    }
    let note = format!(" … ({} bytes cut)", s.len());
    let keep = truncate(&s, max.saturating_sub(note.len()));
    format!("{keep}{note}")
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
    fn bounded_keeps_short_text_and_says_how_much_it_cut() {
        assert_eq!(bounded("short".into(), 100), "short");
        let long = bounded("é".repeat(10_000), MESSAGE_BYTES);
        assert!(long.len() <= MESSAGE_BYTES, "{}", long.len());
        assert!(long.ends_with(" … (20000 bytes cut)"), "{}", &long[long.len() - 40..]);
    }

    #[test]
    fn the_limits_nest() {
        const { assert!(COMMAND_BYTES < RECORD_BYTES / 2) };
        // A snapshot at its largest: the command, the step outputs, every Signal at its
        // longest, the error, a cancel and a revert reason, with room for the journal.
        let signal = SIGNAL_REASON_BYTES + 2 * NAME_BYTES + crate::protocol::Signal::NAME_LEN + 16;
        let snapshot = COMMAND_BYTES + STEP_OUTPUTS_BYTES + crate::protocol::TaskSnapshot::MAX_SIGNALS * signal + MESSAGE_BYTES + 2 * REASON_BYTES;
        assert!(snapshot + 64 * 1024 < RECORD_BYTES, "a full snapshot ({snapshot} bytes) leaves under 64 KiB for its journal");
        const { assert!(DEAD_LETTER_HEAD_BYTES + DEAD_LETTER_KEY_BYTES + DEAD_LETTER_HEADERS_BYTES + REASON_BYTES < RECORD_BYTES / 4) };
    }
}

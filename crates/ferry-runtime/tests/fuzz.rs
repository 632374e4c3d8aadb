//! Poison input: the decoders a worker runs on every record never panic, whatever the
//! bytes: random bytes, and valid records truncated or with bytes flipped. A record that
//! does not decode becomes a dead letter (tests/runtime.rs shows that path end to end).

use ferry_runtime::protocol::{Bytes, CommandAction, CommandEnvelope};
use ferry_runtime::testkind::TestTaskSpec;
use ferry_runtime::wire::Registry;
use ferry_runtime::{TaskId, TaskKind};
use proptest::prelude::*;

/// Built once: a registry parses every schema.
static REGISTRY: std::sync::LazyLock<Registry> = std::sync::LazyLock::new(Registry::embedded);

fn valid_envelope(r: &Registry) -> Vec<u8> {
    let spec = r.encode(&TestTaskSpec::steps(3)).unwrap();
    let env = CommandEnvelope {
        task_id: TaskId::new().to_string(),
        kind: TaskKind::TEST,
        action: CommandAction::Start,
        subject: "fuzz".into(),
        idempotency_key: Some("k".into()),
        requested_by: "fuzz".into(),
        created_at_ms: 1,
        deadline_ms: Some(2),
        keep_partial: false,
        reason: None,
        spec: Bytes(spec),
        signal: None,
    };
    r.encode(&env).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let r: &Registry = &REGISTRY;
        let _ = r.decode::<CommandEnvelope>(&bytes);
        let _ = r.decode::<TestTaskSpec>(&bytes);
    }

    #[test]
    fn framed_random_datums_never_panic(id in prop_oneof![proptest::sample::select(ferry_runtime::wire::embedded_schemas().iter().map(|e| e.0).collect::<Vec<_>>()), 0u32..64], datum in proptest::collection::vec(any::<u8>(), 0..256)) {
        let r: &Registry = &REGISTRY;
        let mut bytes = vec![0];
        bytes.extend_from_slice(&id.to_be_bytes());
        bytes.extend_from_slice(&datum);
        let _ = r.decode::<CommandEnvelope>(&bytes);
    }

    #[test]
    fn damaged_valid_records_never_panic(cut in 0usize..200, flips in proptest::collection::vec((0usize..200, any::<u8>()), 0..4)) {
        let r: &Registry = &REGISTRY;
        let mut bytes = valid_envelope(r);
        for (at, b) in flips {
            let n = bytes.len();
            bytes[at % n] ^= b;
        }
        bytes.truncate(cut.min(bytes.len()));
        if let Ok(env) = r.decode::<CommandEnvelope>(&bytes) {
            // Whatever decodes re-encodes: no half-built value escapes.
            prop_assert!(r.encode(&env).is_ok());
        }
    }
}

//! The runtime's hot paths: what every command and every task transition costs in CPU.
//! `cargo bench -p ferry-runtime --bench hot_paths`

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use ferry_runtime::protocol::{Bytes, CommandAction, CommandEnvelope, EventType, JournalEntry, ProgressEvent, StepStatus, TaskSnapshot, TaskState};
use ferry_runtime::testkind::TestTaskSpec;
use ferry_runtime::wire::Registry;
use ferry_runtime::{TaskId, TaskKind};

fn envelope(r: &Registry) -> CommandEnvelope {
    CommandEnvelope {
        task_id: TaskId::new().to_string(),
        kind: TaskKind::TEST,
        action: CommandAction::Start,
        subject: "bench/subject".into(),
        idempotency_key: Some("bench-key".into()),
        requested_by: "bench".into(),
        created_at_ms: 1,
        deadline_ms: Some(2),
        keep_partial: false,
        reason: None,
        spec: Bytes(r.encode(&TestTaskSpec::steps(3)).unwrap()),
        signal: None,
    }
}

fn snapshot(r: &Registry, steps: usize) -> TaskSnapshot {
    let env = envelope(r);
    TaskSnapshot {
        task_id: env.task_id.clone(),
        kind: env.kind,
        subject: env.subject.clone(),
        state: TaskState::Running,
        seq: 7,
        last_event: EventType::StepSucceeded,
        idempotency_key: None,
        requested_by: "bench".into(),
        origin_partition: 3,
        origin_offset: 12345,
        created_at_ms: 1,
        updated_at_ms: 2,
        deadline_ms: None,
        keep_partial: false,
        worker: "bench-worker".into(),
        trace_parent: Some("00-0123456789abcdef0123456789abcdef-0123456789abcdef-01".into()),
        spec: env.spec,
        journal: (0..steps)
            .map(|i| JournalEntry {
                step: i as i32,
                name: format!("step-{i}"),
                status: StepStatus::Succeeded,
                output: Some(r#"{"cluster":"member-1","objects":["a","b","c"]}"#.into()),
                attempts: 1,
                started_at_ms: 1,
                finished_at_ms: Some(2),
            })
            .collect(),
        error: None,
        cancel_requested: false,
        revert_requested: false,
        signals: Vec::new(),
    }
}

fn hot_paths(c: &mut Criterion) {
    let r = Registry::embedded();
    let env = envelope(&r);
    let bytes = r.encode(&env).unwrap();
    c.bench_function("envelope encode", |b| b.iter(|| r.encode(black_box(&env)).unwrap()));
    c.bench_function("envelope decode", |b| b.iter(|| r.decode::<CommandEnvelope>(black_box(&bytes)).unwrap()));
    let mut snap = snapshot(&r, 10);
    c.bench_function("journal update + snapshot encode (10 steps)", |b| {
        b.iter(|| {
            snap.seq += 1;
            snap.journal[9].attempts += 1;
            r.encode(black_box(&snap)).unwrap()
        })
    });
    let snap_bytes = r.encode(&snapshot(&r, 10)).unwrap();
    c.bench_function("snapshot decode (10 steps)", |b| b.iter(|| r.decode::<TaskSnapshot>(black_box(&snap_bytes)).unwrap()));
    // The most read record: every tracker, dashboard and `--wait` decodes each event.
    let ev = ferry_runtime::publisher::Detail::step(2, "install").into_event(("tsk_0190f1a2b3c4d5e6f708192a3b4c5d6e", TaskKind::DEPLOY, "shop/web"), 7, EventType::StepSucceeded, "ferry-deploy-0", 1_767_323_045_678, None);
    let ev_bytes = r.encode(&ev).unwrap();
    c.bench_function("event encode", |b| b.iter(|| r.encode(black_box(&ev)).unwrap()));
    c.bench_function("event decode", |b| b.iter(|| r.decode::<ProgressEvent>(black_box(&ev_bytes)).unwrap()));
}

criterion_group!(benches, hot_paths);
criterion_main!(benches);

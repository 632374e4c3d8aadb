//! Poison input through the broker: a corpus of malformed commands on every worker kind's
//! command topic, read by real `ferry worker` processes of all six kinds. Records that do
//! not decode (garbage, an unknown schema id, an empty payload, a cut envelope) each come
//! back as a dead-letter record with their original bytes; envelopes whose spec does not
//! decode, is another kind's, or fails validation each end Rejected with a reason. No
//! worker crashes, and each goes past the poison: the last record of each kind, on the
//! same partition as the rest, is answered too. Records of any size and Avro length bombs
//! are in the corpus: a record just under the producer's limit becomes a letter of its
//! head, and an 80-byte spec claiming 500 million array items is Rejected.

// Each kind registers itself in its worker crate (ferry_task::kind): link every one Ferry
// ships, as the `ferry` binary does, so that topics and schemas cover them all.
use {ferry_cluster as _, ferry_deploy as _, ferry_offload as _, ferry_peer as _, ferry_plan as _, ferry_score as _};

use std::collections::HashMap;
use std::time::Duration;

use ferry_fleet::process::Managed;
use ferry_runtime::protocol::{Bytes, CommandEnvelope};
use ferry_runtime::publisher::DLQ_REASON;
use ferry_runtime::testkind::TestTaskSpec;
use ferry_runtime::{Client, CommandAction, EventType, KafkaConfig, SubmitOptions, TaskId, TaskKind};
use ferry_testkit::Bed;
use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, OwnedHeaders};

const WAIT: Duration = Duration::from_secs(120);

/// A command of `kind` that decodes but fails validation, and its subject.
fn invalid(client: &Client, kind: TaskKind) -> (String, Vec<u8>) {
    let r = client.registry();
    match kind {
        TaskKind::TEST => ("poison/test".into(), r.encode(&TestTaskSpec::steps(0)).unwrap()),
        // A plan of no steps.
        TaskKind::PLAN => ("poison/plan".into(), r.encode(&ferry_plan::spec::PlanSpec::default()).unwrap()),
        TaskKind::SCORE => ("poison/score".into(), r.encode(&ferry_score::spec::ScoreClusters::default()).unwrap()),
        TaskKind::DEPLOY => {
            let a = ferry_deploy::spec::DeployApp { name: "web".into(), owner: "poison".into(), ..Default::default() };
            (a.subject(), r.encode(&a).unwrap())
        }
        TaskKind::CREATE_CLUSTER => {
            let c = ferry_cluster::spec::ClusterCommand { name: "Not_A_Name".into(), infrastructure: "docker".into(), ..Default::default() };
            (c.subject(), r.encode(&c).unwrap())
        }
        TaskKind::PEER => {
            let p = ferry_peer::spec::PeerClusters { a: "member-1".into(), b: "member-1".into(), ..Default::default() };
            (p.subject(), r.encode(&p).unwrap())
        }
        TaskKind::OFFLOAD => {
            let o = ferry_offload::spec::OffloadCommand { cluster: "member-1".into(), namespace: "kube-system".into(), ..Default::default() };
            (o.subject(), r.encode(&o).unwrap())
        }
        other => panic!("no invalid {other} command here: add one"),
    }
}

/// An envelope of a valid-looking command, encoded.
fn envelope(client: &Client, kind: TaskKind, subject: &str, spec: Vec<u8>) -> Vec<u8> {
    let env = CommandEnvelope {
        task_id: TaskId::new().to_string(),
        kind,
        action: CommandAction::Start,
        subject: subject.into(),
        idempotency_key: None,
        requested_by: "poison".into(),
        created_at_ms: 1,
        deadline_ms: None,
        keep_partial: false,
        reason: None,
        spec: Bytes(spec),
        signal: None,
    };
    client.registry().encode(&env).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_commands_are_rejected_or_dead_lettered_and_no_worker_crashes() {
    // The Kubernetes workers start against a real hub; the poison never reaches it.
    let Some(bed) = Bed::builder().start().await else { return };
    let (fleet, broker, topics) = (&bed.fleet, bed.broker(), bed.topics.clone());
    let client = bed.client();
    let mut events = client.events(false).await.unwrap();
    let kinds = [TaskKind::TEST, TaskKind::SCORE, TaskKind::DEPLOY, TaskKind::CREATE_CLUSTER, TaskKind::PEER, TaskKind::OFFLOAD];
    // Each under the test bed's guard: they die with the test, even on SIGKILL.
    let mut workers: Vec<(TaskKind, u16, Managed)> = Vec::new();
    for kind in kinds {
        let port = ferry_fleet::process::free_port().unwrap();
        let mut args: Vec<String> = vec!["RUST_LOG=error".into(), env!("CARGO_BIN_EXE_ferry").into()];
        args.extend(["worker", &kind.to_string(), "--brokers", &broker.bootstrap(), "--kafka-property", "fetch.wait.max.ms=5"].map(String::from));
        args.extend(["--http".to_owned(), format!("127.0.0.1:{port}")]);
        if kind != TaskKind::TEST {
            args.extend(["--kubeconfig".to_owned(), fleet.hub().kubeconfig.display().to_string()]);
        }
        if kind == TaskKind::SCORE {
            args.push("--no-onboarding".into());
        }
        let log = fleet.dir.join(format!("{kind}-worker.log"));
        workers.push((kind, port, Managed::spawn(&kind.to_string(), std::path::Path::new("/usr/bin/env"), &args, &log).expect("spawn ferry worker")));
    }

    // Per kind: four records that do not decode, then three envelopes to reject, all keyed
    // by one subject (one partition, in order).
    // Some bytes repeat across kinds (the empty payload): count them.
    let mut dead: HashMap<Vec<u8>, Vec<String>> = HashMap::new();
    let mut rejected: HashMap<String, String> = HashMap::new();
    for kind in kinds {
        let (subject, spec) = invalid(&client, kind);
        let topic = topics.command(kind).name.clone();
        let cut = envelope(&client, kind, &subject, spec.clone());
        // Just under the producer's limit: its letter keeps the head (a letter of the whole
        // record and its reason once exceeded the limit, and every worker exited).
        let oversized: Vec<u8> = kind.to_string().bytes().cycle().take(999_900).collect();
        let garbage: [(Vec<u8>, &str); 6] = [
            (format!("poison for {kind}: not a record").into_bytes(), "garbage"),
            ([&[0, 0, 0, 0x7f, 0xff][..], kind.to_string().as_bytes()].concat(), "an unknown schema id"),
            (Vec::new(), "an empty payload"),
            (cut[..cut.len() / 2].to_vec(), "a cut envelope"),
            // An envelope whose task id claims 500 million bytes.
            ([&[0, 0, 0, 0, 1][..], &varint(500_000_000), kind.to_string().as_bytes()].concat(), "a length bomb"),
            (oversized, "a 999,900-byte record"),
        ];
        for (bytes, what) in garbage {
            client.send_raw(&topic, Some(subject.as_bytes()), &bytes, OwnedHeaders::new()).await.unwrap();
            let head = bytes[..bytes.len().min(ferry_runtime::limits::DEAD_LETTER_HEAD_BYTES)].to_vec();
            dead.entry(head).or_default().push(format!("{kind}: {what}"));
        }
        if kind == TaskKind::OFFLOAD {
            // The 80-byte spec that aborted `ferry dev`: its `clusters` array claims 500
            // million items (apache-avro reserved 28 GB for them). Fields in schema order:
            // operation, cluster, namespace, two strategies, remote_namespace_name (null).
            let bomb = [&[0, 0, 0, 0, 40, 0][..], &varint(8), b"member-1", &varint(3), b"web", &[0, 0, 0], &varint(500_000_000)].concat();
            let id = client.submit_encoded(kind, &subject, bomb, SubmitOptions::default()).await.unwrap();
            rejected.insert(id.to_string(), format!("{kind}: a spec whose array claims 500 million items"));
        }
        let other = if kind == TaskKind::TEST { invalid(&client, TaskKind::PEER).1 } else { invalid(&client, TaskKind::TEST).1 };
        // The kind's own schema id with a datum that ends too soon.
        let broken = [&spec[..5], &[0xff][..]].concat();
        for (bytes, what) in [(broken, "a spec that does not decode"), (other, "another kind's spec"), (spec, "an invalid spec")] {
            let id = client.submit_encoded(kind, &subject, bytes, SubmitOptions::default()).await.unwrap();
            rejected.insert(id.to_string(), format!("{kind}: {what}"));
        }
    }

    // Every envelope ends Rejected with a reason.
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut reasons: HashMap<String, String> = HashMap::new();
    while reasons.len() < rejected.len() {
        let ev = tokio::time::timeout_at(deadline, events.next())
            .await
            .unwrap_or_else(|_| panic!("not answered: {:?}", rejected.iter().filter(|(id, _)| !reasons.contains_key(*id)).map(|(_, w)| w).collect::<Vec<_>>()))
            .expect("event stream");
        let Some(what) = rejected.get(&ev.task_id) else { continue };
        if ev.event.is_final() {
            assert_eq!(ev.event, EventType::Rejected, "{what}: {:?}", ev.message);
            let reason = ev.message.clone().unwrap_or_default();
            assert!(!reason.is_empty(), "{what} was rejected without a reason");
            println!("poison: {what}: Rejected: {reason}");
            reasons.insert(ev.task_id.clone(), reason);
        }
    }

    // Every record that does not decode is a dead letter with its bytes and a reason.
    let reader: BaseConsumer = KafkaConfig::for_embedded(broker.bootstrap()).reader().create().unwrap();
    reader.subscribe(&[&topics.dead_letter().name]).unwrap();
    let mut lettered: HashMap<Vec<u8>, Vec<String>> = HashMap::new();
    let missing = |lettered: &HashMap<Vec<u8>, Vec<String>>| -> Vec<String> {
        dead.iter().filter(|(k, w)| lettered.get(*k).map_or(0, Vec::len) < w.len()).flat_map(|(_, w)| w.clone()).collect()
    };
    let deadline = std::time::Instant::now() + WAIT;
    while !missing(&lettered).is_empty() {
        assert!(std::time::Instant::now() < deadline, "no dead letter for {:?}", missing(&lettered));
        if let Some(Ok(m)) = reader.poll(Duration::from_millis(200)) {
            let reason =
                m.headers().and_then(|h| h.iter().find(|h| h.key == DLQ_REASON).and_then(|h| h.value)).map(|v| String::from_utf8_lossy(v).into_owned());
            let payload = m.payload().unwrap_or_default().to_vec();
            let reason = reason.unwrap_or_default();
            assert!(!reason.is_empty(), "a dead letter without a reason: {payload:?}");
            let n = lettered.get(&payload).map_or(0, Vec::len);
            if let Some(what) = dead.get(&payload).and_then(|w| w.get(n)) {
                println!("poison: {what}: dead letter: {reason}");
            }
            lettered.entry(payload).or_default().push(reason);
        }
    }

    // No worker crashed: each still answers its liveness probe.
    for (kind, port, _) in &workers {
        let answer = healthz(*port).await;
        assert!(answer.starts_with("HTTP/1.0 200"), "the {kind} worker's /healthz: {answer:?}");
    }
}

/// The zig-zag varint of a non-negative Avro long.
fn varint(n: i64) -> Vec<u8> {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    let mut out = Vec::new();
    loop {
        let b = (z & 0x7f) as u8;
        z >>= 7;
        if z == 0 {
            out.push(b);
            return out;
        }
        out.push(b | 0x80);
    }
}

/// The first line of `GET /healthz` on a worker's probe port, or why there is none.
async fn healthz(port: u16) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
        Ok(s) => s,
        Err(e) => return format!("no answer: {e}"),
    };
    s.write_all(b"GET /healthz HTTP/1.0\r\nHost: x\r\n\r\n").await.unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out).await;
    out.lines().next().unwrap_or_default().to_owned()
}

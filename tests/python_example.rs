//! The Python example (`examples/python/ferry_example.py`) against a real broker (tansu),
//! a `ferry worker test` process and the schema-registry stand-in: Ferry's protocol from
//! another language, with confluent-kafka's registry-aware Avro serializer.
//!
//! The registry is locked and wants basic auth, as a production one may: the schemas are
//! registered first (as an operator would), the worker only looks them up
//! (`--schema-registry URL?mode=lookup`, credentials from the environment), and so does
//! the example.

// Each kind registers itself in its worker crate (ferry_task::kind): link every one Ferry
// ships, as the `ferry` binary does, so that topics and schemas cover them all.
use {ferry_cluster as _, ferry_deploy as _, ferry_offload as _, ferry_peer as _, ferry_plan as _, ferry_score as _};

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use ferry_runtime::protocol::{CommandAction, CommandEnvelope};
use ferry_runtime::schema_registry::{BasicAuth, Settings, StandIn, StandInOptions, connect};
use ferry_runtime::testkind::TestTaskSpec;
use ferry_runtime::{TaskId, TaskKind};

const USER: &str = "ferry-example";
const PASSWORD: &str = "example-pw";

/// The venv `scripts/install-python-example.sh` makes, if it matches the requirements.
fn venv_python() -> Result<PathBuf, String> {
    let cache = std::env::var_os("FERRY_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/ferry"));
    let venv = cache.join("python-example-venv");
    let wanted = std::fs::read(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/python/requirements.txt")).map_err(|e| e.to_string())?;
    match std::fs::read(venv.join("requirements.txt")) {
        Ok(have) if have == wanted => Ok(venv.join("bin/python")),
        Ok(_) => Err(format!("the example's venv {} is stale (scripts/install-python-example.sh)", venv.display())),
        Err(_) => Err(format!("the example's venv {} is not installed (scripts/install-python-example.sh)", venv.display())),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_example_submits_follows_and_reverts_tansu() {
    if !ferry_runtime::tansu::binary().exists() {
        ferry_runtime::report::missing_prerequisite("tansu is not installed (scripts/install-tansu.sh)");
        return;
    }
    let python = match venv_python() {
        Ok(p) => p,
        Err(what) => {
            ferry_runtime::report::missing_prerequisite(&what);
            return;
        }
    };
    let broker = ferry_runtime::tansu::Tansu::start(&ferry_runtime::Topics::standard()).await.unwrap_or_else(|e| panic!("{e}"));
    let registry = StandIn::start(StandInOptions { first_id: 1000, auth: Some((USER.into(), PASSWORD.into())), read_only: false }).await.unwrap();
    let auth = Some(BasicAuth { user: USER.into(), password: PASSWORD.into() });
    connect(&Settings { auth, ..Settings::parse(registry.url()).unwrap() }).await.unwrap();
    registry.handle().set_read_only(true);
    let creds = [("FERRY_SCHEMA_REGISTRY_USER", USER), ("FERRY_SCHEMA_REGISTRY_PASSWORD", PASSWORD)];
    let example = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/python/ferry_example.py");

    // The bytes the example writes decode with Ferry's own reader: the envelope, its
    // nested spec frame, and the task id an idempotency key gives.
    let logs = tempfile::tempdir().unwrap();
    let emitted = logs.path().join("start.bin");
    let emit = tokio::process::Command::new(&python)
        .arg(&example)
        .args(["--registry", registry.url(), "--steps", "2", "--subject", "emitted", "--idempotency-key", "k1", "--emit-command"])
        .arg(&emitted)
        .envs(creds)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let emit = tokio::time::timeout(Duration::from_secs(120), emit).await.expect("the example ended").unwrap();
    assert!(emit.status.success(), "{}", String::from_utf8_lossy(&emit.stderr));
    let reader = connect(&Settings { auth: Some(BasicAuth { user: USER.into(), password: PASSWORD.into() }), ..Settings::parse(&format!("{}?mode=lookup", registry.url())).unwrap() }).await.unwrap();
    let env: CommandEnvelope = reader.decode(&std::fs::read(&emitted).unwrap()).unwrap();
    assert_eq!((env.kind, env.action, env.subject.as_str()), (TaskKind::TEST, CommandAction::Start, "emitted"));
    assert_eq!(env.task_id, TaskId::for_idempotency_key(TaskKind::TEST, "k1").to_string());
    assert!(env.spec.0.len() > 5 && env.spec.0[0] == 0, "the spec is a Confluent frame of its own");
    let spec: TestTaskSpec = reader.decode(&env.spec.0).unwrap();
    assert_eq!(spec.steps, 2);

    let worker_log = logs.path().join("worker.log");
    let mut worker = tokio::process::Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["worker", "test", "--brokers", broker.bootstrap(), "--kafka-property", "fetch.wait.max.ms=5"])
        .args(["--schema-registry", &format!("{}?mode=lookup", registry.url())])
        .envs(creds)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&worker_log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();

    let run = tokio::process::Command::new(&python)
        .arg(&example)
        .args(["--bootstrap", broker.bootstrap(), "--registry", registry.url(), "--steps", "3", "--timeout", "60"])
        .envs(creds)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    // The example bounds each phase itself (--timeout); this bound only keeps a hung
    // interpreter from hanging the suite.
    let out = tokio::time::timeout(Duration::from_secs(300), run).await.expect("the example ended").unwrap();
    let _ = worker.start_kill();
    let _ = worker.wait().await;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let report = format!(
        "exit {:?}\n--- stdout\n{stdout}\n--- stderr\n{}\n--- worker\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(&worker_log).unwrap_or_default()
    );
    assert!(out.status.success(), "{report}");
    println!("{stdout}");

    let events: Vec<&str> = stdout.lines().filter_map(|l| l.split(" event=").nth(1)).map(|r| r.split(' ').next().unwrap_or(r)).collect();
    let at = |e: &str| events.iter().position(|x| *x == e).unwrap_or_else(|| panic!("no {e} event:\n{report}"));
    assert_eq!(events.first(), Some(&"Accepted"), "{report}");
    assert!(at("Succeeded") < at("Reverting") && at("Reverting") < at("Reverted"), "{report}");
    assert_eq!(events.iter().filter(|e| **e == "StepReverted").count(), 3, "each of the 3 steps undone:\n{report}");
    assert!(stdout.contains("Succeeded, then Reverted"), "{report}");
    // Lookup mode on both sides: the locked registry holds only what the test registered.
    // One subject per record name of the embedded schemas (a new kind adds one).
    let names: std::collections::BTreeSet<String> = ferry_runtime::wire::embedded_schemas()
        .iter()
        .map(|(_, _, text)| {
            let v: serde_json::Value = serde_json::from_str(text).unwrap();
            format!("{}.{}", v["namespace"].as_str().unwrap_or_default(), v["name"].as_str().unwrap_or_default())
        })
        .collect();
    assert_eq!(registry.handle().subjects().len(), names.len(), "{:?} against {names:?}", registry.handle().subjects());
}

//! Kafka security: a worker and a client authenticate with SASL/SCRAM-SHA-512 to a broker
//! that requires it (tansu), and wrong credentials stop a worker at its start with one
//! clear error that names the user and never shows the password.

use std::time::Duration;

use ferry_runtime::preflight::{self, PreflightError};
use ferry_runtime::tansu::Tansu;
use ferry_runtime::testkind::{TestHandler, TestTaskSpec};
use ferry_runtime::{Client, EventType, KafkaConfig, SubmitOptions, TaskKind, Topics, Worker, WorkerError, WorkerOptions};
use tokio_util::sync::CancellationToken;

const USER: &str = "ferry-worker-test";
const PASSWORD: &str = "correct-horse-battery";

fn scram(bootstrap: &str, user: &str, password: &str) -> KafkaConfig {
    KafkaConfig::scram_plaintext(bootstrap, user, password)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_credentials_work_and_wrong_ones_fail_clearly_tansu() {
    if !ferry_runtime::tansu::binary().exists() {
        ferry_runtime::report::missing_prerequisite("tansu is not installed (scripts/install-tansu.sh)");
        return;
    }
    let topics = Topics::standard();
    let broker = Tansu::start_secured(&topics, &[(USER, PASSWORD)]).await.unwrap();
    let good = scram(broker.bootstrap(), USER, PASSWORD);

    // Wrong password and unknown user: the preflight says so, naming the user only.
    let needed = vec![topics.command(TaskKind::TEST).name.clone()];
    preflight::check(&good, &needed, Duration::from_secs(30)).await.expect("the right credentials pass");
    for (user, password) in [(USER, "wrong-password"), ("nobody", PASSWORD)] {
        let err = preflight::check(&scram(broker.bootstrap(), user, password), &needed, Duration::from_secs(30)).await.unwrap_err();
        assert!(matches!(err, PreflightError::Authentication { .. }), "{err}");
        let text = err.to_string();
        println!("{text}");
        assert!(text.contains(&format!("refused the credentials of user \"{user}\"")), "{text}");
        assert!(!text.contains(password), "the password must not appear: {text}");
    }
    // A worker with wrong credentials ends its start with that error.
    let mut opts = WorkerOptions::new(scram(broker.bootstrap(), USER, "wrong-password"));
    opts.topics = topics.clone();
    let r = Worker::new(opts, TestHandler::default()).run(CancellationToken::new()).await;
    assert!(matches!(r, Err(WorkerError::Preflight(PreflightError::Authentication { .. }))), "{r:?}");

    // With the right ones, a task runs end to end.
    let mut opts = WorkerOptions::new(good.clone());
    opts.topics = topics.clone();
    opts.shutdown_grace = Duration::from_secs(2);
    let stop = CancellationToken::new();
    let s = stop.clone();
    let worker = tokio::spawn(async move { Worker::new(opts, TestHandler::default()).run(s).await });
    let client = Client::new(good, topics).unwrap();
    let mut events = client.events(false).await.unwrap();
    let id = client.submit(TaskKind::TEST, "sasl", &TestTaskSpec::steps(3), SubmitOptions::default()).await.unwrap();
    let evs = events.until(id, Duration::from_secs(120), |e| e.event.is_final()).await.unwrap();
    assert_eq!(evs.last().unwrap().event, EventType::Succeeded);
    stop.cancel();
    worker.await.unwrap().unwrap();
    drop(events);
    drop(client);
}

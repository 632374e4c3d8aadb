//! The dashboard in a real browser (Debian's headless Chromium through chromedriver): a
//! task submitted with the CLI appears and progresses without a reload, and its Revert
//! button reverts it through Kafka. Screenshots go to the test's target directory, or to
//! `FERRY_SCREENSHOTS` when set (docs/screenshots holds the committed ones). Its API
//! answers from live views: every task written before it started, none that was deleted.

// Each kind registers itself in its worker crate (ferry_task::kind): link every one Ferry
// ships, as the `ferry` binary does, so that topics and schemas cover them all.
use {ferry_cluster as _, ferry_deploy as _, ferry_offload as _, ferry_peer as _, ferry_plan as _, ferry_score as _};

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{ClientBuilder, Locator};
use ferry_runtime::testkind::TestHandler;
use ferry_runtime::{Client, EmbeddedBroker, KafkaConfig, TaskState, Topics, Worker, WorkerOptions};
use tokio_util::sync::CancellationToken;

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";
const WAIT: Duration = Duration::from_secs(60);

/// A child process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Starts `ferry dashboard` with operator token file `token` and returns it with the URL
/// it printed.
fn dashboard(bootstrap: &str, token: &std::path::Path) -> (Proc, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["dashboard", "--listen", "127.0.0.1:0", "--brokers", bootstrap, "--kafka-property", "fetch.wait.max.ms=5", "--token-file"])
        .arg(token)
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .spawn()
        .expect("ferry dashboard starts");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(url) = line.strip_prefix("dashboard: ") {
                let _ = tx.send(url.to_owned());
            }
        }
    });
    let url = rx.recv_timeout(WAIT).expect("the dashboard prints its URL");
    (Proc(child), url)
}

/// Starts chromedriver on a free port and waits for its "started successfully" line.
fn chromedriver() -> (Proc, u16) {
    let port = free_port();
    let mut child = Command::new(CHROMEDRIVER).arg(format!("--port={port}")).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("started successfully") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(WAIT).expect("chromedriver starts");
    (Proc(child), port)
}

/// A headless Chromium session through a chromedriver of its own (dropped last: the
/// profile directory).
async fn browser() -> (Proc, fantoccini::Client, tempfile::TempDir) {
    let (driver, port) = chromedriver();
    let profile = tempfile::tempdir().unwrap();
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({"binary": CHROMIUM, "args": [
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--window-size=1400,800", format!("--user-data-dir={}", profile.path().display()),
        ]}),
    );
    let browser = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{port}"))
        .await
        .expect("a chromium session");
    (driver, browser, profile)
}

/// Clicks the element `css` names as a person would: once it is shown and enabled, finding
/// it again if the page replaced it between the find and the click (a stale handle is
/// retried, never clicked), within `WAIT`.
async fn click(browser: &fantoccini::Client, css: &str) {
    let deadline = std::time::Instant::now() + WAIT;
    let mut last = String::from("never found");
    while std::time::Instant::now() < deadline {
        let found = browser.wait().at_most(deadline - std::time::Instant::now()).for_element(Locator::Css(css)).await;
        let outcome = match found {
            Ok(e) => match (e.is_displayed().await, e.is_enabled().await) {
                (Ok(true), Ok(true)) => match e.click().await {
                    Ok(_) => return,
                    Err(err) => format!("click: {err}"),
                },
                (shown, enabled) => format!("shown {shown:?}, enabled {enabled:?}"),
            },
            Err(err) => format!("find: {err}"),
        };
        last = outcome;
        // Let the page run its pending updates before looking again (a browser round trip, not a sleep).
        let _ = browser.execute("return await new Promise(r => requestAnimationFrame(() => r(null)));", vec![]).await;
    }
    panic!("{css} was not clickable within {WAIT:?}: {last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_from_the_cli_appears_progresses_and_reverts_in_the_browser() {
    if !std::path::Path::new(CHROMEDRIVER).exists() || !std::path::Path::new(CHROMIUM).exists() {
        ferry_runtime::report::missing_prerequisite(&format!("{CHROMIUM} or {CHROMEDRIVER} is missing (scripts/install-chromium.sh)"));
        return;
    }
    let topics = Topics::standard();
    let broker = EmbeddedBroker::start(1, &topics).unwrap();
    let bootstrap = broker.bootstrap();
    let kafka = KafkaConfig::for_embedded(bootstrap.clone());
    let mut opts = WorkerOptions::new(kafka.clone());
    opts.shutdown_grace = Duration::from_secs(1);
    let stop = CancellationToken::new();
    let worker = tokio::spawn(Worker::new(opts, TestHandler::default()).run(stop.clone()));
    let client = Client::new(kafka, topics.clone()).unwrap();

    let token_file = tempfile::NamedTempFile::new().unwrap();
    let token = format!("{:032x}", std::process::id() as u128 * 7919 + 0x5eed);
    std::fs::write(token_file.path(), &token).unwrap();
    let (_dash, url) = dashboard(&bootstrap, token_file.path());
    let (_driver, browser, _profile) = browser().await;
    browser.goto(&url).await.unwrap();
    browser.wait().at_most(WAIT).for_element(Locator::Css("#live.on")).await.expect("the page follows the event stream");
    // Marks this page load: still there at the end means nothing reloaded the page.
    browser.execute("window.ferryMarker = 42; return null;", vec![]).await.unwrap();

    // A task submitted with the CLI.
    let spec = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(spec.path(), "subject: browser\nspec: {steps: 4, fail_at: null, fail_transient: 0, step_ms: 1500, block_at: null, undo_fail_at: null}\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["submit", "test", "-f"])
        .arg(spec.path())
        .args(["--brokers", &bootstrap])
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let row = format!("#task-{id}");

    browser.wait().at_most(WAIT).for_element(Locator::Css(&format!("{row}[data-state=Running]"))).await.expect("the task appears running");
    // It moves on without a reload: step 3 of 4 shows, with a partly filled bar.
    let step3 = format!("//tr[@id='task-{id}' and @data-state='Running']/td[6][starts-with(normalize-space(.), '3 ')]");
    browser.wait().at_most(WAIT).for_element(Locator::XPath(&step3)).await.expect("the task progresses to step 3");
    let shots = std::env::var_os("FERRY_SCREENSHOTS").map(std::path::PathBuf::from).unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
    std::fs::create_dir_all(&shots).unwrap();
    std::fs::write(shots.join("dashboard-running.png"), browser.screenshot().await.unwrap()).unwrap();
    browser.wait().at_most(WAIT).for_element(Locator::Css(&format!("{row}[data-state=Succeeded]"))).await.expect("the task succeeds on the page");
    let width: String = browser.find(Locator::Css(&format!("{row} .bar > span"))).await.unwrap().attr("style").await.unwrap().unwrap_or_default();
    assert!(width.contains("100%"), "a finished task's bar is full: {width}");

    // A cross-site form post (another origin's page, no token) is refused, in a tab of
    // its own, and the task stays as it was.
    let dashboard_tab = browser.window().await.unwrap();
    let evil = browser.new_window(true).await.unwrap();
    browser.switch_to_window(evil.handle).await.unwrap();
    let form = format!("data:text/html,<form method=post action='{url}api/tasks/{id}/revert'></form><script>document.forms[0].submit()</script>");
    browser.goto(&form).await.unwrap();
    let refused = browser
        .wait()
        .at_most(WAIT)
        .for_element(Locator::XPath("//body[contains(., 'an action needs the operator token')]"))
        .await
        .expect("the dashboard refuses the cross-site post");
    assert!(!refused.text().await.unwrap_or_default().is_empty());
    browser.close_window().await.unwrap();
    browser.switch_to_window(dashboard_tab).await.unwrap();
    assert_eq!(client.snapshot(id.parse().unwrap()).await.unwrap().unwrap().state, TaskState::Succeeded, "the cross-site post reverted the task");

    // Without the operator token the page's own Revert is refused and says why (the
    // reason typed for it stays for the next try).
    browser.find(Locator::Css("#reason")).await.unwrap().send_keys("bad rollout").await.unwrap();
    click(&browser, &format!("{row} button.revert")).await;
    let said = format!("//tr[@id='task-{id}']//*[contains(., 'operator token')]");
    browser.wait().at_most(WAIT).for_element(Locator::XPath(&said)).await.expect("the refusal shows on the page");
    // With it, the revert goes through Kafka.
    let input = browser.find(Locator::Css("#token")).await.unwrap();
    input.send_keys(&token).await.unwrap();
    browser.execute("document.getElementById('token').dispatchEvent(new Event('change')); return null;", vec![]).await.unwrap();
    click(&browser, &format!("{row} button.revert")).await;
    browser.wait().at_most(WAIT).for_element(Locator::Css(&format!("{row}[data-state=Reverted]"))).await.expect("the revert shows on the page");
    std::fs::write(shots.join("dashboard-reverted.png"), browser.screenshot().await.unwrap()).unwrap();
    let marker = browser.execute("return window.ferryMarker || 0;", vec![]).await.unwrap();
    assert_eq!(marker, serde_json::json!(42), "the page was never reloaded");
    let snap = client.snapshot(id.parse().unwrap()).await.unwrap().expect("the task's snapshot");
    assert_eq!(snap.state, TaskState::Reverted, "the Revert button sent the Revert command through Kafka");
    // Sent once, as the dashboard, with the reason the field held; the field is then empty.
    let commands = client.read_to_end(&topics.command(ferry_runtime::TaskKind::TEST).name).await.unwrap();
    let reverts: Vec<(String, Option<String>)> = commands
        .iter()
        .filter_map(|(_, p)| client.registry().decode::<ferry_runtime::protocol::CommandEnvelope>(p).ok())
        .filter(|c| c.task_id == id && c.action == ferry_runtime::CommandAction::Revert)
        .map(|c| (c.requested_by, c.reason))
        .collect();
    assert_eq!(reverts, [("ferry-dashboard".to_owned(), Some("bad rollout".to_owned()))]);
    let left = browser.execute("return document.getElementById('reason').value;", vec![]).await.unwrap();
    assert_eq!(left, serde_json::json!(""), "the reason goes with one action");
    println!("screenshots in {}", shots.display());

    browser.close().await.unwrap();
    stop.cancel();
    worker.await.unwrap().unwrap();
}

/// Rows are newest first, and a plan's children sit right under their plan, oldest first,
/// marked as its children: for the tasks there when the page loaded, and for those that
/// came while it was open (whose rows first appear from their events, before the task
/// state says whose children they are). Before, a load put the oldest task on top and
/// later tasks went on top, and a plan's children were rows like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_are_newest_first_with_a_plans_children_under_it() {
    use ferry_runtime::{TaskId, TaskKind};
    if !std::path::Path::new(CHROMEDRIVER).exists() || !std::path::Path::new(CHROMIUM).exists() {
        ferry_runtime::report::missing_prerequisite(&format!("{CHROMIUM} or {CHROMEDRIVER} is missing (scripts/install-chromium.sh)"));
        return;
    }
    let Bed { broker, stop, worker, .. } = bed();
    let bootstrap = broker.bootstrap();
    let _plans = Proc(
        Command::new(env!("CARGO_BIN_EXE_ferry"))
            .args(["worker", "plan", "--brokers", &bootstrap, "--kafka-property", "fetch.wait.max.ms=5", "--http", "127.0.0.1:0"])
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let dir = tempfile::tempdir().unwrap();
    // Sends a spec with an idempotency key and waits for its end; its id follows from the key.
    let submit = |kind: TaskKind, key: &str, spec: &str| {
        let file = dir.path().join(format!("{key}.yaml"));
        std::fs::write(&file, spec).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
            .args(["submit", kind.as_str(), "--idempotency-key", key, "--wait", "-f"])
            .arg(&file)
            .args(["--brokers", &bootstrap, "--kafka-property", "fetch.wait.max.ms=5"])
            .env("RUST_LOG", "error")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        TaskId::for_idempotency_key(kind, key).to_string()
    };
    let test = |subject: &str| format!("subject: {subject}\nspec: {{steps: 1, fail_transient: 0, step_ms: 0}}\n");
    let plan = |subject: &str| {
        format!("subject: {subject}\nspec:\n  steps:\n    - {{name: one, kind: test, subject: {subject}/one, spec: {{steps: 1, fail_transient: 0, step_ms: 0}}}}\n    - {{name: two, kind: test, subject: {subject}/two, spec: {{steps: 1, fail_transient: 0, step_ms: 0}}}}\n")
    };
    let children = |plan: &str| ["one", "two"].map(|step| TaskId::for_idempotency_key(TaskKind::TEST, &format!("plan/{plan}/{step}")).to_string());
    // The page shows `ids`, in this order, and nothing else.
    let shows = |ids: &[&str]| {
        let rows: Vec<String> = ids.iter().enumerate().map(|(i, id)| format!("tr[{}]/@id='task-{id}'", i + 1)).collect();
        format!("//table[@id='tasks']/tbody[count(tr)={} and {}]", ids.len(), rows.join(" and "))
    };

    let old = tokio::task::block_in_place(|| submit(TaskKind::TEST, "old", &test("old")));
    let first = tokio::task::block_in_place(|| submit(TaskKind::PLAN, "first", &plan("first")));
    let [a1, a2] = children(&first);
    let token_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(token_file.path(), "an-operator-token-of-32-characters").unwrap();
    let (_dash, url) = dashboard(&bootstrap, token_file.path());
    let (_driver, browser, _profile) = browser().await;
    browser.goto(&url).await.unwrap();
    browser.wait().at_most(WAIT).for_element(Locator::Css("#live.on")).await.expect("the page follows the event stream");
    let loaded = [first.as_str(), &a1, &a2, &old];
    browser.wait().at_most(WAIT).for_element(Locator::XPath(&shows(&loaded))).await.unwrap_or_else(|e| panic!("the loaded rows in order {loaded:?}: {e}"));

    // Tasks that come while the page is open.
    let new = tokio::task::block_in_place(|| submit(TaskKind::TEST, "new", &test("new")));
    let second = tokio::task::block_in_place(|| submit(TaskKind::PLAN, "second", &plan("second")));
    let [b1, b2] = children(&second);
    let all = [second.as_str(), &b1, &b2, &new, &first, &a1, &a2, &old];
    browser.wait().at_most(WAIT).for_element(Locator::XPath(&shows(&all))).await.unwrap_or_else(|e| panic!("every row in order {all:?}: {e}"));
    let child = browser.find(Locator::Css(&format!("#task-{b1}"))).await.unwrap();
    assert_eq!(child.attr("class").await.unwrap().as_deref(), Some("child"));
    assert_eq!(child.attr("title").await.unwrap(), Some(format!("plan {second}, step one")));
    assert!(browser.find(Locator::Css(&format!("#task-{b1} td:nth-child(3)"))).await.unwrap().text().await.unwrap().starts_with("└ second/one"));
    assert_eq!(browser.find(Locator::Css(&format!("#task-{second}"))).await.unwrap().attr("class").await.unwrap().unwrap_or_default(), "", "a plan is no child");
    let shots = std::env::var_os("FERRY_SCREENSHOTS").map(std::path::PathBuf::from).unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
    std::fs::create_dir_all(&shots).unwrap();
    std::fs::write(shots.join("dashboard-plans.png"), browser.screenshot().await.unwrap()).unwrap();

    browser.close().await.unwrap();
    stop.cancel();
    worker.await.unwrap().unwrap();
}

/// GETs `url`; returns the status and the body.
async fn get(url: &str) -> (u16, String) {
    request(axum::http::Method::GET, url, &[]).await
}

/// POSTs to `url` with `headers`; returns the status and the body.
async fn post(url: &str, headers: &[(&str, &str)]) -> (u16, String) {
    request(axum::http::Method::POST, url, headers).await
}

/// POSTs `body` to `url` with `headers`.
async fn post_body(url: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    send(axum::http::Method::POST, url, headers, axum::body::Body::from(body.to_owned())).await
}

async fn request(method: axum::http::Method, url: &str, headers: &[(&str, &str)]) -> (u16, String) {
    send(method, url, headers, axum::body::Body::empty()).await
}

async fn send(method: axum::http::Method, url: &str, headers: &[(&str, &str)], body: axum::body::Body) -> (u16, String) {
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http::<axum::body::Body>();
    let mut req = axum::http::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = http.request(req.body(body).unwrap()).await.unwrap();
    let status = resp.status().as_u16();
    let body = axum::body::to_bytes(axum::body::Body::new(resp.into_body()), usize::MAX).await.unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// The embedded broker with a `test` worker on it: cancel `stop` and await `worker` to
/// stop it (before the broker is dropped).
struct Bed {
    broker: EmbeddedBroker,
    kafka: KafkaConfig,
    topics: Topics,
    stop: CancellationToken,
    worker: tokio::task::JoinHandle<Result<(), ferry_runtime::WorkerError>>,
}

fn bed() -> Bed {
    let topics = Topics::standard();
    let broker = EmbeddedBroker::start(1, &topics).unwrap();
    let kafka = KafkaConfig::for_embedded(broker.bootstrap());
    let mut opts = WorkerOptions::new(kafka.clone());
    opts.shutdown_grace = Duration::from_secs(1);
    let stop = CancellationToken::new();
    let worker = tokio::spawn(Worker::new(opts, TestHandler::default()).run(stop.clone()));
    Bed { broker, kafka, topics, stop, worker }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_answers_every_task_written_before_it_started_and_none_deleted() {
    use ferry_runtime::testkind::TestTaskSpec;
    use rdkafka::producer::{FutureProducer, FutureRecord};

    let Bed { broker, kafka, topics, stop, worker } = bed();
    let bootstrap = broker.bootstrap();
    let client = Client::new(kafka.clone(), topics.clone()).unwrap();
    let mut ids = Vec::new();
    for i in 0..4 {
        let (id, _) = client.submit_and_wait(ferry_runtime::TaskKind::TEST, &format!("api/{i}"), &TestTaskSpec::steps(1), Default::default(), WAIT).await.unwrap();
        ids.push(id.to_string());
    }
    // A worker stops on a newer Ferry's record (below): this one first.
    stop.cancel();
    worker.await.unwrap().unwrap();
    // The first task is deleted (a tombstone on its kind's task-state topic); a newer
    // Ferry's worker wrote the second last (a schema id this program does not know): not
    // shown at its older state.
    let producer: FutureProducer = kafka.producer().create().unwrap();
    let topic = topics.task_state(ferry_runtime::TaskKind::TEST).name.clone();
    producer.send(FutureRecord::<str, [u8]>::to(&topic).key(&ids[0]), Duration::from_secs(30)).await.map_err(|(e, _)| e).unwrap();
    let newer = client.registry().id_of::<ferry_runtime::TaskSnapshot>().unwrap() + 1;
    let mut record = vec![0];
    record.extend_from_slice(&newer.to_be_bytes());
    record.extend_from_slice(&[2, 4, 6, 8]);
    producer.send(FutureRecord::to(&topic).key(&ids[1]).payload(&record), Duration::from_secs(30)).await.map_err(|(e, _)| e).unwrap();
    let kept: std::collections::BTreeSet<String> = ids[2..].iter().cloned().collect();

    let token_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(token_file.path(), "an-operator-token-of-32-characters").unwrap();
    let (_dash, url) = dashboard(&bootstrap, token_file.path());
    // The API waits for its view's first catch-up: the first answer has every task.
    let (status, body) = get(&format!("{url}api/tasks")).await;
    assert_eq!(status, 200, "{body}");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    let shown: std::collections::BTreeSet<String> = rows.iter().map(|r| r["task_id"].as_str().unwrap().to_owned()).collect();
    assert_eq!(shown, kept, "every task written before the dashboard started, and not the deleted one nor the newer Ferry's");
    let (status, body) = get(&format!("{url}api/fleet")).await;
    assert_eq!(status, 200, "{body}");
    // Both views have caught up once (the two answers above waited for it): ready.
    assert_eq!(get(&format!("{url}readyz")).await, (200, "ok".to_owned()));
}

/// The API's Signal (a running plan's Approve, Pause and Resume buttons): guarded as
/// Revert and Cancel are, it reaches the running task, which records it as the
/// dashboard's; actions that would do nothing are refused with the reason, unsent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_through_the_api_is_guarded_and_reaches_the_running_task() {
    use ferry_runtime::testkind::TestTaskSpec;
    use ferry_runtime::{EventType, SubmitOptions, TaskKind};

    let Bed { broker, kafka, topics, stop, worker } = bed();
    let bootstrap = broker.bootstrap();
    let client = Client::new(kafka.clone(), topics.clone()).unwrap();
    let mut events = client.events(true).await.unwrap();
    // Blocks in its first step until cancelled.
    let id = client.submit(TaskKind::TEST, "api/signal", &TestTaskSpec { block_at: Some(1), ..TestTaskSpec::steps(1) }, SubmitOptions::default()).await.unwrap();
    events.until(id, WAIT, |e| e.event == EventType::StepProgress).await.unwrap();

    let token_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(token_file.path(), "an-operator-token-of-32-characters").unwrap();
    let (_dash, url) = dashboard(&bootstrap, token_file.path());
    let (_, page) = get(&url).await;
    let csrf = page.split("name=\"ferry-csrf\" content=\"").nth(1).and_then(|s| s.split('"').next()).expect("the page's CSRF token").to_owned();
    let origin = url.trim_end_matches('/').to_owned();
    let action = format!("{url}api/tasks/{id}/signal/approve");
    let good = [("authorization", "Bearer an-operator-token-of-32-characters"), ("x-csrf-token", csrf.as_str()), ("origin", origin.as_str())];

    assert_eq!(post(&action, &good[1..]).await.0, 401, "no operator token");
    assert_eq!(post(&action, &[good[0], ("origin", "http://evil.example")]).await.0, 403, "cross-site");
    let (status, body) = post(&format!("{url}api/tasks/{id}/signal/Not%20A%20Name"), &good).await;
    assert_eq!(status, 400, "{body}");
    // A body that is not `{"reason": ...}`, or a reason over the worker's limit: 400, unsent.
    let (status, body) = post_body(&action, &good, r#"{"why": "typo"}"#).await;
    let said = serde_json::from_str::<serde_json::Value>(&body).unwrap()["error"].as_str().unwrap_or_default().to_owned();
    assert_eq!((status, said.starts_with(r#"the body is not {"reason": "..."}: unknown field `why`"#)), (400, true), "{body}");
    let long = format!(r#"{{"reason": "{}"}}"#, "x".repeat(ferry_runtime::limits::REASON_BYTES + 1));
    let (status, body) = post_body(&action, &good, &long).await;
    assert_eq!((status, body.contains(&format!("reason is {} bytes; the limit is {}", ferry_runtime::limits::REASON_BYTES + 1, ferry_runtime::limits::REASON_BYTES))), (400, true), "{body}");
    let (status, body) = post_body(&action, &good, r#"{"reason": "canary looks good"}"#).await;
    assert_eq!(status, 202, "{body}");
    let evs = events.until(id, WAIT, |e| e.event == EventType::Signalled).await.unwrap();
    let told = evs.last().unwrap().message.clone().unwrap_or_default();
    // Sent as the dashboard, not as whoever started it.
    assert_eq!(told, "signal approve from ferry-dashboard: canary looks good");
    let snap = client.snapshot(id).await.unwrap().unwrap();
    let signals: Vec<_> = snap.signals.iter().map(|s| (s.name.as_str(), s.by.as_str(), s.reason.as_deref())).collect();
    assert_eq!(signals, [("approve", "ferry-dashboard", Some("canary looks good"))], "one Signal, with the body's reason");
    assert_eq!(snap.state, TaskState::Running, "a Signal leaves the task running");

    client.cancel(id).await.unwrap();
    events.until(id, WAIT, |e| e.event.is_final()).await.unwrap();

    // What would do nothing is answered 409 with the reason and not sent (as `ferry
    // tasks` does): a cancel or a signal of the ended task, a revert of it once Reverted.
    let commands = topics.command(TaskKind::TEST).name.clone();
    let sent = || async { client.read_to_end(&commands).await.unwrap().len() };
    let before = sent().await;
    let (status, body) = post(&format!("{url}api/tasks/{id}/cancel"), &good).await;
    assert_eq!((status, body.contains(&format!("task {id} has ended (Cancelled): there is nothing to cancel; nothing sent"))), (409, true), "{body}");
    let (status, body) = post(&action, &good).await;
    assert_eq!((status, body.contains("a signal reaches only a queued or running task")), (409, true), "{body}");
    assert_eq!(sent().await, before, "a pointless action was sent");
    // A revert of the Cancelled task is sent, as the dashboard, with its reason; then it
    // is pointless.
    let (status, body) = post_body(&format!("{url}api/tasks/{id}/revert"), &good, r#"{"reason": "rolled back by the on-call"}"#).await;
    assert_eq!(status, 202, "{body}");
    events.until(id, WAIT, |e| e.event == EventType::Reverted).await.unwrap();
    let records = client.read_to_end(&commands).await.unwrap();
    assert_eq!(records.len(), before + 1);
    let revert: ferry_runtime::protocol::CommandEnvelope = client.registry().decode(&records.last().unwrap().1).unwrap();
    assert_eq!((revert.action, revert.requested_by.as_str(), revert.reason.as_deref()), (ferry_runtime::CommandAction::Revert, "ferry-dashboard", Some("rolled back by the on-call")));
    let (status, body) = post(&format!("{url}api/tasks/{id}/revert"), &good).await;
    assert_eq!((status, body.contains("is Reverted: there is nothing to revert")), (409, true), "{body}");
    let (status, body) = post(&format!("{url}api/tasks/tsk_00000000000000000000000000000000/revert"), &good).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(sent().await, before + 1, "a pointless action was sent");
    stop.cancel();
    worker.await.unwrap().unwrap();
}

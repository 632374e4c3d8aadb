//! `ferry dashboard --listen ADDR`: a live web page of Ferry's tasks and fleet, served by
//! axum with no external CDN or fonts. The page reads `/api/tasks` once, then follows
//! `/api/events` (server-sent events: every progress event, from one shared consumer of
//! the progress topic) and updates rows in place; its Revert and Cancel buttons POST to
//! `/api/tasks/{id}/revert|cancel`, and a running plan's Approve, Pause and Resume to
//! `/api/tasks/{id}/signal/{name}`, which send the commands through Kafka as
//! `ferry-dashboard`, with the reason a JSON body `{"reason": "..."}` gives (an action that
//! would do nothing is answered 409, unsent). `/api/fleet`
//! has the latest score of each cluster, the apps the deploy worker runs, and the
//! clusters, peerings and offloaded namespaces the other workers made (`fleet_view`).
//! Tasks and scores are answered from live views (`ferry_runtime::live`): one reader of
//! the task-state topics and one of `ferry.scores`, started with the router, so a request
//! reads memory, not Kafka; `/readyz` is unready until both have caught up once.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Args;
use ferry_runtime::live::{Follower, LiveState};
use ferry_runtime::protocol::TaskSnapshot;
use ferry_runtime::{Client, CommandAction, TaskId, TaskKind};
use ferry_score::spec::ClusterScore;
use futures::Stream;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use std::sync::atomic::{AtomicBool, Ordering};

use super::common::Conn;
use super::dashboard_access::Access;
use super::tasks::TaskView;

const PAGE: &str = include_str!("dashboard/index.html");

#[derive(Debug, Args)]
pub struct DashboardArgs {
    /// Where to serve the page.
    #[arg(long, env = "FERRY_DASHBOARD_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// A file holding the operator token that Revert and Cancel need (e.g. a mounted
    /// Secret); without it the dashboard is read-only.
    #[arg(long, env = "FERRY_DASHBOARD_TOKEN_FILE")]
    pub token_file: Option<std::path::PathBuf>,
    /// A `Host` (name:port) the dashboard answers to; repeat for more. Default: its
    /// loopback names when it listens on loopback, any otherwise (put it behind a proxy
    /// that checks the host, or name them).
    #[arg(long = "allowed-host", env = "FERRY_DASHBOARD_ALLOWED_HOSTS", value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,
}

/// Rows `/api/tasks` returns: the newest tasks.
const TASK_ROWS: usize = 500;
/// How long a request waits for a view that has not caught up yet (just started).
const READY_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
/// The kinds whose tasks `/api/fleet` replays (`apps`, `fleet_view`).
const FLEET_KINDS: [TaskKind; 4] = [TaskKind::DEPLOY, TaskKind::CREATE_CLUSTER, TaskKind::PEER, TaskKind::OFFLOAD];

struct App {
    client: Client,
    /// Every task's latest snapshot (also the index the client's Cancel and Revert use).
    state: LiveState,
    /// The latest score of every cluster.
    scores: Follower<ClusterScore>,
    events: broadcast::Sender<String>,
    access: Arc<Access>,
    /// The event fan-out follows the progress topic (`/readyz`).
    following: Arc<AtomicBool>,
    /// Ends the event fan-out (and its consumer) when the routes are dropped.
    _fan_out: tokio_util::sync::DropGuard,
}

type Shared = Arc<App>;

/// Who the dashboard's actions are from (`requested_by`; `tasks get`'s "Reverted by").
pub const DASHBOARD: &str = "ferry-dashboard";

fn error(status: StatusCode, e: impl std::fmt::Display) -> Response {
    (status, Json(serde_json::json!({ "error": e.to_string() }))).into_response()
}

async fn page(State(app): State<Shared>) -> impl IntoResponse {
    let actions = if app.access.token.is_some() { "" } else { "hidden" };
    let page = PAGE.replace("{{csrf}}", &app.access.csrf).replace("{{actions}}", actions);
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8"), (header::CACHE_CONTROL, "no-store")], page)
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(app): State<Shared>) -> Response {
    if !app.following.load(Ordering::Relaxed) {
        error(StatusCode::SERVICE_UNAVAILABLE, "not following the progress topic")
    } else if !app.state.is_ready() {
        error(StatusCode::SERVICE_UNAVAILABLE, "not caught up with the task-state topics yet")
    } else if !app.scores.is_ready() {
        error(StatusCode::SERVICE_UNAVAILABLE, "not caught up with the scores topic yet")
    } else {
        "ok".into_response()
    }
}

async fn metrics(State(app): State<Shared>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], app.access.metrics())
}

/// Waits (bounded) for a view that has not caught up once: a page opened right after
/// start-up gets the whole table, not the part read so far.
async fn caught_up<V>(view: &Follower<V>) -> Result<(), Response> {
    if view.is_ready() {
        return Ok(());
    }
    view.ready(READY_WAIT).await.map_err(|e| error(StatusCode::SERVICE_UNAVAILABLE, e))
}

/// The newest `n` of `tasks`, newest first, as the page shows them. A task's plan is
/// kept only where its claim holds (`plan_children::claim_holds`): the page puts a plan's
/// children under it.
fn newest(tasks: &mut dyn Iterator<Item = &TaskSnapshot>, n: usize) -> Vec<TaskView> {
    let newest_first = |a: &&TaskSnapshot, b: &&TaskSnapshot| b.created_at_ms.cmp(&a.created_at_ms).then_with(|| b.task_id.cmp(&a.task_id));
    let mut v: Vec<&TaskSnapshot> = tasks.collect();
    let plans: std::collections::HashMap<String, String> = v.iter().filter(|s| s.kind == TaskKind::PLAN).map(|s| (s.task_id.clone(), s.requested_by.clone())).collect();
    if v.len() > n && n > 0 {
        v.select_nth_unstable_by(n - 1, newest_first);
    }
    v.truncate(n);
    v.sort_by(newest_first);
    let mut views: Vec<TaskView> = v.into_iter().map(TaskView::from).collect();
    super::plan_children::check_claims(&mut views, &plans);
    views
}

async fn tasks(State(app): State<Shared>) -> Response {
    if let Err(r) = caught_up(app.state.follower()).await {
        return r;
    }
    // A task a newer Ferry wrote last is left out, not shown at an older state (the
    // reader logs it: upgrade the dashboard with the workers).
    let newer: std::collections::HashSet<String> = app.state.newer_all().into_iter().map(|(t, _)| t).collect();
    Json(app.state.follower().scan(|all| newest(&mut all.filter(|s| !newer.contains(&s.task_id)), TASK_ROWS))).into_response()
}

#[derive(Serialize)]
struct Fleet {
    scores: Vec<ferry_score::spec::ClusterScore>,
    apps: Vec<super::apps::AppView>,
    clusters: Vec<super::fleet_view::ClusterView>,
    peerings: Vec<super::fleet_view::PeeringView>,
    offloads: Vec<super::fleet_view::OffloadView>,
}

async fn fleet(State(app): State<Shared>) -> Response {
    for r in [caught_up(&app.scores).await, caught_up(app.state.follower()).await] {
        if let Err(r) = r {
            return r;
        }
    }
    let mut scores = app.scores.values();
    scores.sort_by(|a, b| b.score.cmp(&a.score).then(a.cluster.cmp(&b.cluster)));
    // Only the kinds the fleet is made of: the table may hold many more `test` tasks.
    let newer: std::collections::HashSet<String> = app.state.newer_all().into_iter().map(|(t, _)| t).collect();
    let snapshots: Vec<TaskSnapshot> = app.state.follower().scan(|all| all.filter(|s| FLEET_KINDS.contains(&s.kind) && !newer.contains(&s.task_id)).cloned().collect());
    let r = app.client.registry();
    Json(Fleet {
        scores,
        apps: super::apps::apps(r, &snapshots),
        clusters: super::fleet_view::clusters(r, &snapshots),
        peerings: super::fleet_view::peerings(r, &snapshots),
        offloads: super::fleet_view::offloads(r, &snapshots),
    })
    .into_response()
}

/// The answer to a client error: 404 for a task not found, 400 for a bad request, 502 when
/// Kafka did not answer (the dashboard is a gateway to it).
fn client_error(e: ferry_runtime::ClientError) -> Response {
    use ferry_runtime::ClientError as E;
    let status = match e {
        E::UnknownTask(_) | E::NotTenants { .. } => StatusCode::NOT_FOUND,
        E::Invalid(_) => StatusCode::BAD_REQUEST,
        _ => StatusCode::BAD_GATEWAY,
    };
    error(status, e)
}

/// What an action's POST may carry: why it is asked (`ferry tasks ... --reason`), kept
/// with the command and shown by `ferry tasks get`. No body is no reason.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ActBody {
    reason: Option<String>,
}

/// The reason in an action's `body`: `Ok(None)` for no body or an empty reason; a body
/// that is not `{"reason": "..."}`, or a reason over the limit the worker takes
/// (`limits::REASON_BYTES`), is refused with what is wrong (a 400, before anything is
/// sent).
fn reason_of(body: &[u8]) -> Result<Option<String>, String> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let body: ActBody = serde_json::from_slice(body).map_err(|e| format!("the body is not {{\"reason\": \"...\"}}: {e}"))?;
    let max = ferry_runtime::limits::REASON_BYTES;
    match body.reason.filter(|r| !r.trim().is_empty()) {
        Some(r) if r.len() > max => Err(format!("reason is {} bytes; the limit is {max}", r.len())),
        r => Ok(r),
    }
}

/// Cancel, Revert or Signal `name` of task `id`, with the reason `body` gives: the task is
/// located first, and an action that would do nothing (a cancel or signal of an ended
/// task, a revert of a Rejected or Reverted one) is answered 409 with the reason and not
/// sent, as `ferry tasks` does.
async fn act(app: Shared, id: String, action: CommandAction, signal: Option<&str>, body: &[u8]) -> Response {
    let id: TaskId = match id.parse() {
        Ok(id) => id,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    if let Some(why) = signal.and_then(ferry_runtime::protocol::Signal::invalid_name) {
        return error(StatusCode::BAD_REQUEST, why);
    }
    let reason = match reason_of(body) {
        Ok(reason) => reason,
        Err(why) => return error(StatusCode::BAD_REQUEST, why),
    };
    let target = match app.client.locate(id).await {
        Ok(target) => target,
        Err(e) => return client_error(e),
    };
    if let Some(why) = target.pointless(action) {
        return error(StatusCode::CONFLICT, format!("{why}; nothing sent"));
    }
    let sent = match signal {
        Some(name) => app.client.signal_target(id, &target, name, reason).await,
        None => app.client.control(target.kind, &target.subject, id, action, reason).await,
    };
    match sent {
        Ok(()) => (StatusCode::ACCEPTED, Json(target)).into_response(),
        Err(e) => client_error(e),
    }
}

async fn revert(State(app): State<Shared>, Path(id): Path<String>, body: Bytes) -> Response {
    act(app, id, CommandAction::Revert, None, &body).await
}

async fn cancel(State(app): State<Shared>, Path(id): Path<String>, body: Bytes) -> Response {
    act(app, id, CommandAction::Cancel, None, &body).await
}

/// A Signal (`approve`, `pause`, `resume` for a plan's waves) to a task, as
/// `ferry tasks signal` sends it; guarded as Revert and Cancel are.
async fn signal(State(app): State<Shared>, Path((id, name)): Path<(String, String)>, body: Bytes) -> Response {
    act(app, id, CommandAction::Signal, Some(&name), &body).await
}

async fn events(State(app): State<Shared>) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let mut rx = app.events.subscribe();
    let stream = async_stream(move |tx| async move {
        loop {
            match rx.recv().await {
                Ok(json) => {
                    if tx.send(Ok(Event::default().event("progress").data(json))).await.is_err() {
                        return;
                    }
                }
                // A slow page missed events: tell it to reload the table.
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    if tx.send(Ok(Event::default().event("resync").data("{}"))).await.is_err() {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

/// A stream fed by a task through a channel.
fn async_stream<T: Send + 'static, F, Fut>(f: F) -> impl Stream<Item = T>
where
    F: FnOnce(tokio::sync::mpsc::Sender<T>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(f(tx));
    tokio_stream_from(rx)
}

fn tokio_stream_from<T>(mut rx: tokio::sync::mpsc::Receiver<T>) -> impl Stream<Item = T> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// The page's routes over `client` under `access`; progress events are read once and
/// fanned out, tasks and scores followed by live views started here (the client's own
/// live view: its Cancel and Revert then take a task's subject from it).
pub async fn router(client: Client, access: Arc<Access>) -> anyhow::Result<Router> {
    let state = client.live_view().await?;
    let scores = client.follow(vec![client.topics().scores().name.clone()], |_, r, p| r.decode::<ClusterScore>(p).map(Some)).await?;
    let (tx, _) = broadcast::channel(1024);
    let mut stream = client.events(false).await?;
    let fan = tx.clone();
    let following = Arc::new(AtomicBool::new(true));
    let alive = following.clone();
    let ended = tokio_util::sync::CancellationToken::new();
    let end = ended.clone();
    tokio::spawn(async move {
        while let Some(Some(e)) = end.run_until_cancelled(stream.next()).await {
            if let Ok(json) = serde_json::to_string(&e) {
                let _ = fan.send(json);
            }
        }
        alive.store(false, Ordering::Relaxed);
    });
    let app = Arc::new(App { client, state, scores, events: tx, access: access.clone(), following, _fan_out: ended.drop_guard() });
    Ok(Router::new()
        .route("/", get(page))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/api/tasks", get(tasks))
        .route("/api/fleet", get(fleet))
        .route("/api/events", get(events))
        .route("/api/tasks/{id}/revert", post(revert))
        .route("/api/tasks/{id}/cancel", post(cancel))
        .route("/api/tasks/{id}/signal/{name}", post(signal))
        .with_state(app)
        .layer(axum::middleware::from_fn_with_state(access, super::dashboard_access::guard)))
}

pub async fn run(conn: &Conn, a: DashboardArgs) -> anyhow::Result<ExitCode> {
    // Its Cancels, Reverts and Signals are the dashboard's (an operator token's holder's),
    // not those of whoever started it.
    let client = conn.client().await?.sent_by(DASHBOARD);
    let token = match &a.token_file {
        Some(p) => {
            let t = std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("reading the token file {}: {e}", p.display()))?.trim().to_owned();
            anyhow::ensure!(t.len() >= 16, "the token in {} is shorter than 16 characters", p.display());
            Some(t)
        }
        None => None,
    };
    let listener = tokio::net::TcpListener::bind(a.listen).await?;
    let bound = listener.local_addr()?;
    let hosts = if a.allowed_hosts.is_empty() { Access::default_hosts(bound) } else { a.allowed_hosts.clone() };
    if token.is_none() {
        eprintln!("dashboard: read-only (no --token-file): Revert and Cancel are refused");
    }
    let app = router(client, Arc::new(Access::new(hosts, token))).await?;
    println!("dashboard: http://{bound}/");
    let shutdown = tokio_util::sync::CancellationToken::new();
    super::common::cancel_on_signal(shutdown.clone());
    axum::serve(listener, app).with_graceful_shutdown(async move { shutdown.cancelled().await }).await?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_runtime::TaskState;
    use ferry_runtime::testkind::TestTaskSpec;

    #[test]
    fn the_table_has_the_newest_tasks_newest_first() {
        let r = ferry_runtime::wire::Registry::embedded();
        let order = [5, 1, 9, 3, 7, 2];
        let all: Vec<TaskSnapshot> = order.iter().map(|&n| super::super::fleet_view::tests::snap(&r, n, TaskKind::TEST, "s", &TestTaskSpec::steps(1), TaskState::Succeeded, vec![])).collect();
        let ids = |n| newest(&mut all.iter(), n).into_iter().map(|v| v.task_id).collect::<Vec<_>>();
        assert_eq!(ids(3), ["tsk_9", "tsk_7", "tsk_5"]);
        assert_eq!(ids(10), ["tsk_9", "tsk_7", "tsk_5", "tsk_3", "tsk_2", "tsk_1"]);
        assert!(ids(0).is_empty());
    }
}

//! `ferry dashboard --listen ADDR`: a live web page of Ferry's tasks and fleet, served by
//! axum with no external CDN or fonts. The page reads `/api/tasks` once, then follows
//! `/api/events` (server-sent events: every progress event, from one shared consumer of
//! the progress topic) and updates rows in place; its Revert and Cancel buttons POST to
//! `/api/tasks/{id}/revert|cancel`, which send the commands through Kafka. `/api/fleet`
//! has the latest score of each cluster, the apps the deploy worker runs, and the
//! clusters, peerings and offloaded namespaces the other workers made (`fleet_view`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Args;
use ferry_runtime::{Client, TaskId};
use futures::Stream;
use serde::Serialize;
use tokio::sync::broadcast;

use super::common::Conn;
use super::tasks::TaskView;

const PAGE: &str = include_str!("dashboard/index.html");

#[derive(Debug, Args)]
pub struct DashboardArgs {
    /// Where to serve the page.
    #[arg(long, env = "FERRY_DASHBOARD_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
}

struct App {
    client: Client,
    events: broadcast::Sender<String>,
}

type Shared = Arc<App>;

fn error(status: StatusCode, e: impl std::fmt::Display) -> Response {
    (status, Json(serde_json::json!({ "error": e.to_string() }))).into_response()
}

async fn page() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8"), (header::CACHE_CONTROL, "no-store")], PAGE)
}

async fn tasks(State(app): State<Shared>) -> Response {
    match app.client.snapshots().await {
        Ok(mut all) => {
            all.sort_by_key(|s| std::cmp::Reverse(s.created_at_ms));
            all.truncate(500);
            Json(all.iter().map(TaskView::from).collect::<Vec<_>>()).into_response()
        }
        Err(e) => error(StatusCode::BAD_GATEWAY, e),
    }
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
    let scores = match ferry_score::scores::latest(&app.client).await {
        Ok(s) => {
            let mut v: Vec<_> = s.into_values().collect();
            v.sort_by(|a, b| b.score.cmp(&a.score).then(a.cluster.cmp(&b.cluster)));
            v
        }
        Err(e) => return error(StatusCode::BAD_GATEWAY, e),
    };
    let snapshots = match app.client.snapshots().await {
        Ok(s) => s,
        Err(e) => return error(StatusCode::BAD_GATEWAY, e),
    };
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

async fn control(app: Shared, id: String, revert: bool) -> Response {
    let id: TaskId = match id.parse() {
        Ok(id) => id,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let r = if revert { app.client.revert(id).await } else { app.client.cancel(id).await };
    match r {
        Ok(s) => (StatusCode::ACCEPTED, Json(TaskView::from(&s))).into_response(),
        Err(e) => error(StatusCode::CONFLICT, e),
    }
}

async fn revert(State(app): State<Shared>, Path(id): Path<String>) -> Response {
    control(app, id, true).await
}

async fn cancel(State(app): State<Shared>, Path(id): Path<String>) -> Response {
    control(app, id, false).await
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

/// The page's routes over `client`; progress events are read once and fanned out.
pub async fn router(client: Client) -> anyhow::Result<Router> {
    let (tx, _) = broadcast::channel(1024);
    let mut stream = client.events(false).await?;
    let fan = tx.clone();
    tokio::spawn(async move {
        while let Some(e) = stream.next().await {
            if let Ok(json) = serde_json::to_string(&e) {
                let _ = fan.send(json);
            }
        }
    });
    let app = Arc::new(App { client, events: tx });
    Ok(Router::new()
        .route("/", get(page))
        .route("/api/tasks", get(tasks))
        .route("/api/fleet", get(fleet))
        .route("/api/events", get(events))
        .route("/api/tasks/{id}/revert", post(revert))
        .route("/api/tasks/{id}/cancel", post(cancel))
        .with_state(app))
}

pub async fn run(conn: &Conn, a: DashboardArgs) -> anyhow::Result<ExitCode> {
    let client = conn.client().await?;
    let app = router(client).await?;
    let listener = tokio::net::TcpListener::bind(a.listen).await?;
    println!("dashboard: http://{}/", listener.local_addr()?);
    let shutdown = tokio_util::sync::CancellationToken::new();
    super::common::cancel_on_signal(shutdown.clone());
    axum::serve(listener, app).with_graceful_shutdown(async move { shutdown.cancelled().await }).await?;
    Ok(ExitCode::SUCCESS)
}

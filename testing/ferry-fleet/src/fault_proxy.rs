//! A loopback proxy in front of one API server that injects faults on command: added
//! latency, 500 or 429 answers, and blackouts that reset new connections and cut running
//! watches. Workers reach a cluster through it in fault tests.
//!
//! It serves plain HTTP on 127.0.0.1 and forwards through a `kube::Client`, which holds
//! the TLS and the credentials to the real server; clients of the proxy need neither
//! (the kubeconfig it writes has no token, so no secret leaves the test's files).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use http_body_util::BodyExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;

#[derive(Debug, Default)]
struct Faults {
    latency: Duration,
    fail_next: u32,
    fail_status: u16,
    blackout_until: Option<Instant>,
    requests: u64,
    injected: u64,
}

/// Changes the faults of one proxy while it runs.
#[derive(Debug, Clone)]
pub struct FaultHandle {
    faults: Arc<Mutex<Faults>>,
    // Bumped when a blackout starts, so running streams are cut.
    blackouts: watch::Sender<u64>,
}

impl FaultHandle {
    /// Delays every request by `latency` (zero to stop).
    pub fn set_latency(&self, latency: Duration) {
        self.faults.lock().expect("faults lock").latency = latency;
    }

    /// Answers the next `count` requests with `status` (500 or 429) instead of forwarding.
    pub fn fail_next(&self, count: u32, status: u16) {
        let mut f = self.faults.lock().expect("faults lock");
        f.fail_next = count;
        f.fail_status = status;
    }

    /// For `window`, resets every new connection and cuts every running stream.
    pub fn blackout(&self, window: Duration) {
        self.faults.lock().expect("faults lock").blackout_until = Some(Instant::now() + window);
        self.blackouts.send_modify(|g| *g += 1);
    }

    /// Ends a blackout early and removes every fault.
    pub fn clear(&self) {
        let mut f = self.faults.lock().expect("faults lock");
        f.latency = Duration::ZERO;
        f.fail_next = 0;
        f.blackout_until = None;
    }

    /// Requests seen, and how many of them got an injected fault.
    pub fn counts(&self) -> (u64, u64) {
        let f = self.faults.lock().expect("faults lock");
        (f.requests, f.injected)
    }
}

#[derive(Clone)]
struct Proxy {
    upstream: kube::Client,
    handle: FaultHandle,
}

/// A running fault proxy; stops when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    handle: FaultHandle,
    task: JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FaultProxy {
    /// Serves on a free loopback port, forwarding to `upstream`'s cluster.
    pub async fn start(upstream: kube::Client) -> std::io::Result<Self> {
        let (blackouts, _) = watch::channel(0);
        let handle = FaultHandle { faults: Arc::default(), blackouts };
        let app = Router::new().fallback(forward).with_state(Proxy { upstream, handle: handle.clone() });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "fault proxy stopped");
            }
        });
        Ok(Self { addr, handle, task })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The fault controls.
    pub fn handle(&self) -> FaultHandle {
        self.handle.clone()
    }

    /// A kubeconfig that reaches the cluster through this proxy (no credentials: the
    /// proxy forwards with its upstream client's).
    pub fn kubeconfig(&self, name: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n    server: {}\nusers:\n- name: anonymous\n  user: {{}}\ncontexts:\n- name: {name}\n  context:\n    cluster: {name}\n    user: anonymous\ncurrent-context: {name}\n",
            self.url()
        )
    }

    /// Writes [`Self::kubeconfig`] to `path`.
    pub fn write_kubeconfig(&self, path: &Path, name: &str) -> std::io::Result<()> {
        std::fs::write(path, self.kubeconfig(name))
    }

    /// A `kube` client through this proxy (kube's default retry of 429/503/504 on).
    pub fn client(&self) -> Result<kube::Client, kube::Error> {
        kube::Client::try_from(kube::Config::new(self.url().parse().expect("valid proxy url")))
    }

    /// A client that sees every injected answer (kube's default retry off).
    pub fn raw_client(&self) -> Result<kube::Client, kube::Error> {
        let mut config = kube::Config::new(self.url().parse().expect("valid proxy url"));
        config.default_retry = false;
        kube::Client::try_from(config)
    }
}

/// A response whose body fails at once: hyper then drops the connection (a reset, as
/// the client sees it).
fn reset() -> Response {
    let failing = futures::stream::once(async { Err::<bytes::Bytes, std::io::Error>(std::io::Error::other("blackout")) });
    Response::new(Body::from_stream(failing))
}

async fn forward(State(p): State<Proxy>, req: Request) -> Response {
    let (latency, fail) = {
        let mut f = p.handle.faults.lock().expect("faults lock");
        f.requests += 1;
        if f.blackout_until.is_some_and(|t| Instant::now() < t) {
            f.injected += 1;
            return reset();
        }
        let fail = (f.fail_next > 0).then(|| {
            f.fail_next -= 1;
            f.injected += 1;
            f.fail_status
        });
        (f.latency, fail)
    };
    if !latency.is_zero() {
        // The injected delay itself.
        tokio::time::sleep(latency).await;
    }
    if let Some(code) = fail {
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let reason = if code == 429 { "TooManyRequests" } else { "InternalError" };
        let body = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": format!("injected by the ferry fault proxy ({code})"), "reason": reason, "code": code});
        let mut res = (status, axum::Json(body)).into_response();
        if code == 429 {
            res.headers_mut().insert("retry-after", axum::http::HeaderValue::from_static("1"));
        }
        return res;
    }
    let (parts, body) = req.into_parts();
    let Ok(bytes) = body.collect().await.map(|b| b.to_bytes()) else { return reset() };
    let mut up = http::Request::builder().method(parts.method).uri(parts.uri.path_and_query().map_or("/", |pq| pq.as_str()));
    for (k, v) in &parts.headers {
        if k != http::header::HOST && k != http::header::AUTHORIZATION && k != http::header::CONTENT_LENGTH {
            up = up.header(k, v);
        }
    }
    let Ok(up) = up.body(kube::client::Body::from(bytes.to_vec())) else { return reset() };
    match p.upstream.send(up).await {
        Ok(res) => {
            let (parts, body) = res.into_parts();
            // Running streams (watches) end with an error when a blackout begins.
            let mut blackouts = p.handle.blackouts.subscribe();
            let was_cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let flag = was_cut.clone();
            let cut = async move {
                if blackouts.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
                flag.store(true, std::sync::atomic::Ordering::Relaxed);
            };
            let stream = http_body_util::BodyStream::new(body)
                .filter_map(|frame| async move {
                    match frame {
                        Ok(f) => f.into_data().ok().map(Ok),
                        Err(e) => Some(Err(std::io::Error::other(e.to_string()))),
                    }
                })
                .take_until(Box::pin(cut))
                .chain(
                    futures::stream::once(async move { was_cut.load(std::sync::atomic::Ordering::Relaxed) })
                        .filter_map(|cut| async move { cut.then(|| Err(std::io::Error::other("cut by blackout"))) }),
                );
            Response::from_parts(parts, Body::from_stream(stream))
        }
        Err(kube::Error::Api(s)) => {
            let code = StatusCode::from_u16(s.code).unwrap_or(StatusCode::BAD_GATEWAY);
            (code, axum::Json(serde_json::to_value(&s).unwrap_or_default())).into_response()
        }
        Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    }
}

//! `/healthz`, `/readyz` and `/metrics` of a worker process.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

#[derive(Clone)]
struct Probe {
    ready: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
}

/// Serves the probes on `addr` until `shutdown`; returns the bound address.
pub async fn serve(
    addr: SocketAddr,
    ready: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(p): State<Probe>| async move {
                if p.ready.load(Ordering::Relaxed) {
                    (StatusCode::OK, "ready")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "joining the consumer group")
                }
            }),
        )
        .route(
            "/metrics",
            get(|State(p): State<Probe>| async move {
                ([("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")], p.metrics.encode())
            }),
        )
        .with_state(Probe { ready, metrics });
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        let r = axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await;
        if let Err(e) = r {
            tracing::error!(error = %e, "probe server stopped");
        }
    });
    Ok(bound)
}

//! The admin HTTP server, on its own port (loopback by default): `/metrics` for Prometheus,
//! `/healthz` (the process is up) and `/readyz` (it serves with the cluster: 503 with the reason
//! while shutting down, refused by the cluster, or started with seeds and not joined yet).

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::sync::watch;

use crate::metrics::recorder;
use crate::state::Shared;

pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    let app = Router::new()
        .route("/metrics", get(|| async { recorder().render() }))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(shared);
    let stop = async move {
        let _ = shutdown.changed().await;
    };
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(stop)
        .await
    {
        tracing::warn!("admin server stopped: {e}");
    }
}

async fn readyz(State(shared): State<Arc<Shared>>) -> (StatusCode, String) {
    match crate::state::not_ready_reason(&shared) {
        None => (StatusCode::OK, "ready\n".to_owned()),
        Some(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
    }
}

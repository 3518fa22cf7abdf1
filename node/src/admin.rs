//! The admin HTTP server, on its own port (loopback by default): `/metrics` for Prometheus,
//! `/healthz` (the process is up) and `/readyz` (it serves with the cluster: 503 with the reason
//! while shutting down, refused by the cluster, or started with seeds and not joined yet).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::sync::watch;

use crate::cluster::Cluster;
use crate::metrics::recorder;

/// Whether the node serves with the cluster: `/readyz`'s answer.
#[derive(Debug)]
pub(crate) struct Readiness {
    /// False once the node began shutting down.
    ready: AtomicBool,
    /// Whether the cluster refused this node, and whether it has joined.
    cluster: Arc<Cluster>,
}

impl Readiness {
    pub(crate) fn new(cluster: Arc<Cluster>) -> Self {
        Readiness {
            ready: AtomicBool::new(true),
            cluster,
        }
    }

    /// The node is shutting down: not ready from now on.
    pub(crate) fn shutting_down(&self) {
        self.ready.store(false, Ordering::Relaxed);
    }

    /// Why the node is not ready, or `None` when it serves with the cluster.
    pub(crate) fn not_ready_reason(&self) -> Option<String> {
        if !self.ready.load(Ordering::Relaxed) {
            return Some("shutting down".to_owned());
        }
        self.cluster.not_ready_reason()
    }
}

pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    readiness: Arc<Readiness>,
    mut shutdown: watch::Receiver<bool>,
) {
    let app = Router::new()
        .route("/metrics", get(|| async { recorder().render() }))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(readiness);
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

async fn readyz(State(readiness): State<Arc<Readiness>>) -> (StatusCode, String) {
    match readiness.not_ready_reason() {
        None => (StatusCode::OK, "ready\n".to_owned()),
        Some(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
    }
}

//! The admin HTTP server, on its own port (loopback by default): `/metrics` for Prometheus,
//! `/healthz` (the process is up) and `/readyz` (it serves with the cluster: 503 with the reason
//! while shutting down, refused by the cluster, or started with seeds and not joined yet).
//!
//! Bounded like every front: at most [`MAX_CONNECTIONS`] connections at once (more wait in the
//! kernel's backlog), each closed after [`CONNECTION_LIFETIME`]. The HTTP server runs without a
//! timer, so without a timeout for a request's head; the lifetime gives a place back from a
//! caller that never finishes one, and the bound keeps such callers from pinning the memory
//! and descriptors the other fronts need.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

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

/// Admin connections open at once: Prometheus and an orchestrator's probes need a few.
pub const MAX_CONNECTIONS: usize = 64;
/// How long an admin connection lives: scrapes and probes take milliseconds, and one that
/// stays (keep-alive) is dialed again after.
pub(crate) const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);

pub(crate) async fn serve(
    listener: TcpListener,
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
    let listener = Bounded {
        listener,
        places: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
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

/// The admin listener: accepts while a place is free.
struct Bounded {
    listener: TcpListener,
    places: Arc<Semaphore>,
}

impl axum::serve::Listener for Bounded {
    type Io = Held;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Held, SocketAddr) {
        let place = Arc::clone(&self.places)
            .acquire_owned()
            .await
            .expect("the admin listener's places are never closed");
        loop {
            match self.listener.accept().await {
                Ok((stream, addr)) => {
                    let held = Held {
                        stream,
                        ends: Box::pin(tokio::time::sleep(CONNECTION_LIFETIME)),
                        _place: place,
                    };
                    return (held, addr);
                }
                // Out of descriptors, or a connection reset before it was accepted: wait a
                // little rather than spin.
                Err(e) => {
                    tracing::debug!(error = %e, "admin listener could not accept");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// An admin connection holding its place; reads and writes fail once its lifetime is over,
/// which closes it.
struct Held {
    stream: TcpStream,
    ends: Pin<Box<tokio::time::Sleep>>,
    _place: OwnedSemaphorePermit,
}

impl Held {
    fn ended(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        self.ends.as_mut().poll(cx).is_ready().then(|| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                "admin connection past its lifetime",
            )
        })
    }
}

impl AsyncRead for Held {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(e) = self.ended(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Held {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Some(e) = self.ended(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

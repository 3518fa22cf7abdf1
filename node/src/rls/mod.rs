//! Envoy's rate limit service (RLS v3) on the node: `--rls-listen` serves
//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` and gRPC health v1 over
//! plaintext HTTP/2 (or TLS with the node's certificate, `--rls-tls`, requiring client
//! certificates of the client CA with `--rls-client-auth`), deciding through the cluster like
//! any client's checks. Negative hits are honoured only with `--rls-allow-negative-hits`.
//!
//! - `config_file`: `--rls-config` (envoyproxy/ratelimit's files), validated and hot-reloaded.
//! - `incoming`: the listener's connections, at most `max_connections` open at once.
//! - `decide`: a request's checks through `front_batch::run_batch`, refunds when denied.
//! - `http2`: gRPC over HTTP/2, a connection's calls answered together.
//! - `reads_as_prost` (tests): the core's request reader held to prost's decoding.
//! - `service`: the request in, the proto response out.
//! - `counts`: its metrics, their handles registered once.

mod config_file;
mod counts;
mod decide;
mod http2;
mod incoming;
#[cfg(test)]
mod reads_as_prost;
mod service;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::sync::watch;
use tokio::task::JoinSet;

pub use config_file::RlsConfigHandle;
/// The bounded accept loop, shared with the RLQS listener.
pub(crate) use incoming::{HeldConnection, bounded as bounded_incoming};

use crate::front_batch::FrontContext;

/// Where envoyproxy/ratelimit serves gRPC, so an Envoy config moved over needs no port change.
pub const DEFAULT_RLS_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8081);

pub use crate::config::RlsSettings;

/// Loads the configuration, binds the listener and spawns the server and the reload poller.
pub(crate) async fn start(
    front: Arc<FrontContext>,
    settings: &RlsSettings,
    shutdown: watch::Receiver<bool>,
    tasks: &mut JoinSet<()>,
) -> anyhow::Result<(SocketAddr, Arc<RlsConfigHandle>)> {
    settings.validate(&front.config.tls)?;
    let handle = RlsConfigHandle::load(&settings.config)?;
    let tls = if settings.tls {
        let config = crate::tls::http2_server_config(
            &front.config.tls,
            settings.client_auth,
            "--rls-client-auth",
        )
        .context("the RLS listener's TLS configuration")?;
        Some(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
    } else {
        None
    };
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("binding the RLS listener on {}", settings.listen))?;
    let addr = listener.local_addr()?;
    let limits = front.config.limits;
    // HTTP/2 windows from the node's limits, as the QUIC endpoint's: they bound what a caller
    // may send before the node reads it.
    let windows = limits.http2_windows();
    let http2 = http2::Http2Limits {
        stream_window: windows.stream,
        connection_window: windows.connection,
        max_message: limits.max_frame_bytes,
    };
    // The same allowance as the QUIC endpoint's clients, counted apart.
    // Its own handshake and idle timeouts bound a quiet caller (`http2`).
    let incoming = incoming::bounded(listener, limits.max_connections, shutdown.clone());
    let service = Arc::new(service::RlsService {
        front,
        config: handle.clone(),
        rate_limit_headers: settings.rate_limit_headers,
        plan: floodgate::rls::PlanOptions {
            allow_negative_hits: settings.allow_negative_hits,
        },
        metrics: counts::RlsMetrics::new(),
    });
    tasks.spawn(http2::serve(
        incoming.into_inner(),
        tls,
        service,
        http2,
        shutdown.clone(),
    ));
    tasks.spawn(config_file::watch_config(handle.clone(), shutdown));
    tracing::info!(
        %addr,
        tls = settings.tls,
        client_auth = settings.client_auth,
        negative_hits = settings.allow_negative_hits,
        config = %settings.config.display(),
        "RLS (Envoy rate limit service) listening"
    );
    Ok((addr, handle))
}

//! The RLQS listener (`--rlqs-listen`): tonic's server around the node's RLQS hub, behind the
//! RLS front's bounded accept loop and TLS set-up, with deadlines for the handshake
//! (`rlqs_handshake`).

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::config::{HTTP2_KEEPALIVE_INTERVAL, HTTP2_KEEPALIVE_TIMEOUT, NodeConfig};
use crate::rlqs::{Hub, RlqsService, RlqsSettings};
use crate::rls::RlsConfigHandle;

/// Most concurrent streams per HTTP/2 connection (an Envoy opens one per domain).
const MAX_STREAMS_PER_CONNECTION: u32 = 1_024;
/// Binds the listener and spawns the server around `hub` (the node's, given `node`'s TLS and
/// limits).
pub(super) async fn start(
    hub: Arc<Hub>,
    node: &NodeConfig,
    settings: &RlqsSettings,
    config: Arc<RlsConfigHandle>,
    shutdown: watch::Receiver<bool>,
    tasks: &mut JoinSet<()>,
) -> anyhow::Result<SocketAddr> {
    settings.validate(&node.tls)?;
    let tls = if settings.tls {
        let config =
            crate::tls::http2_server_config(&node.tls, settings.client_auth, "--rlqs-client-auth")
                .context("the RLQS listener's TLS configuration")?;
        Some(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
    } else {
        None
    };
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("binding the RLQS listener on {}", settings.listen))?;
    let addr = listener.local_addr()?;
    let limits = node.limits;
    hub.set_config(move || config.current());
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<RateLimitQuotaServiceServer<RlqsService>>()
        .await;
    let rlqs = RateLimitQuotaServiceServer::new(RlqsService { hub: hub.clone() })
        .max_decoding_message_size(limits.max_frame_bytes)
        .max_encoding_message_size(limits.max_frame_bytes);
    let windows = limits.http2_windows();
    // The handshake, the preface and every read after them have their deadlines there.
    let accepted = crate::rls::bounded_incoming(listener, limits.max_connections, shutdown.clone());
    let incoming = super::rlqs_handshake::ready_connections(accepted, tls, shutdown.clone());
    let mut stop = shutdown.clone();
    tasks.spawn(async move {
        let served = tonic::transport::Server::builder()
            .initial_stream_window_size(windows.stream)
            .initial_connection_window_size(windows.connection)
            .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
            .http2_keepalive_interval(Some(HTTP2_KEEPALIVE_INTERVAL))
            .http2_keepalive_timeout(Some(HTTP2_KEEPALIVE_TIMEOUT))
            .add_service(health_service)
            .add_service(rlqs)
            .serve_with_incoming_shutdown(incoming, async move {
                let _ = stop.wait_for(|stopping| *stopping).await;
            })
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "the RLQS server stopped");
        }
    });
    tracing::info!(
        %addr,
        ttl_s = settings.assignment_ttl_s,
        tls = settings.tls,
        client_auth = settings.client_auth,
        "RLQS (Envoy rate limit quota service) listening"
    );
    Ok(addr)
}

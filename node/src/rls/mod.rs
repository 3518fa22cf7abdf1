//! Envoy's rate limit service (RLS v3) on the node: `--rls-listen` serves
//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` and gRPC health v1 over
//! plaintext HTTP/2 (or TLS with the node's certificate, `--rls-tls`, requiring client
//! certificates of the client CA with `--rls-client-auth`), deciding through the cluster like
//! any client's checks. Negative hits are honoured only with `--rls-allow-negative-hits`.
//!
//! - `config_file`: `--rls-config` (envoyproxy/ratelimit's files), validated and hot-reloaded.
//! - `incoming`: the listener's connections, at most `max_connections` open at once.
//! - `decide`: a request's checks through `forward::answer_check_batch`, refunds when denied.
//! - `service`: the proto in and out, metrics.

mod config_file;
mod decide;
mod incoming;
mod service;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use tokio::sync::watch;
use tokio::task::JoinSet;

pub use config_file::RlsConfigHandle;
/// The bounded accept loop, shared with the RLQS listener.
pub(crate) use incoming::bounded as bounded_incoming;

use crate::front_batch::FrontContext;

/// Where envoyproxy/ratelimit serves gRPC, so an Envoy config moved over needs no port change.
pub const DEFAULT_RLS_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8081);
/// Most concurrent calls per HTTP/2 connection (Envoy multiplexes its calls over few).
const MAX_STREAMS_PER_CONNECTION: u32 = 1_024;
/// A call not answered in this time is cancelled (Envoy's own timeout is usually 20 ms to 1 s).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

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
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("binding the RLS listener on {}", settings.listen))?;
    let addr = listener.local_addr()?;
    let max_message = front.config.limits.max_frame_bytes;
    let shared_tls = front.config.tls.clone();
    let shared_limits = front.config.limits;
    // The same allowance as the QUIC endpoint's clients, counted apart.
    let max_connections = front.config.limits.max_connections;
    let shutdown_incoming = shutdown.clone();
    let service = service::RlsService {
        front,
        config: handle.clone(),
        rate_limit_headers: settings.rate_limit_headers,
        plan: floodgate::rls::PlanOptions {
            allow_negative_hits: settings.allow_negative_hits,
        },
    };
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<RateLimitServiceServer<service::RlsService>>()
        .await;
    let rls = RateLimitServiceServer::new(service)
        .max_decoding_message_size(max_message)
        .max_encoding_message_size(max_message);
    let mut builder = tonic::transport::Server::builder();
    if settings.tls {
        builder = builder
            .tls_config(tls_config(&shared_tls, settings.client_auth)?)
            .context("the RLS listener's TLS configuration")?;
    }
    // HTTP/2 windows from the node's limits, as the QUIC endpoint's: hyper's defaults (1 MiB a
    // stream and a connection) are not bounded by what the node was given.
    let windows = shared_limits.quic_windows();
    let stream_window = u32::try_from(windows.stream_receive).unwrap_or(u32::MAX);
    let connection_window = u32::try_from(windows.connection_receive).unwrap_or(u32::MAX);
    let mut stop = shutdown.clone();
    tasks.spawn(async move {
        let served = builder
            .initial_stream_window_size(stream_window)
            .initial_connection_window_size(connection_window)
            .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
            .timeout(CALL_TIMEOUT)
            .add_service(health_service)
            .add_service(rls)
            .serve_with_incoming_shutdown(
                incoming::bounded(listener, max_connections, shutdown_incoming),
                async move {
                    let _ = stop.wait_for(|stopping| *stopping).await;
                },
            )
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "the RLS server stopped");
        }
    });
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

/// The node's own certificate and key, as the QUIC endpoint presents them; with `client_auth`,
/// a client certificate signed by the client CA is required (no certificate, or another CA's:
/// the handshake fails and nothing is served).
pub(crate) fn tls_config(
    tls: &crate::config::TlsConfig,
    client_auth: bool,
) -> anyhow::Result<tonic::transport::ServerTlsConfig> {
    let cert = std::fs::read(&tls.cert)
        .with_context(|| format!("reading the certificate {}", tls.cert.display()))?;
    let key = std::fs::read(&tls.key)
        .with_context(|| format!("reading the key {}", tls.key.display()))?;
    let mut config = tonic::transport::ServerTlsConfig::new()
        .identity(tonic::transport::Identity::from_pem(cert, key));
    if client_auth {
        let Some(client_ca) = &tls.client_ca else {
            anyhow::bail!("--rls-client-auth needs --client-ca PEM");
        };
        let ca = std::fs::read(client_ca)
            .with_context(|| format!("reading the client CA {}", client_ca.display()))?;
        config = config
            .client_ca_root(tonic::transport::Certificate::from_pem(ca))
            .client_auth_optional(false);
    }
    Ok(config)
}

//! Envoy's rate limit quota service (RLQS) on the node: `--rlqs-listen` serves
//! `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas` and gRPC
//! health over plaintext HTTP/2 (or TLS with the node's certificate, `--rlqs-tls`, requiring
//! client certificates of the client CA with `--rlqs-client-auth`). Each Envoy streams its usage of every bucket; the node answers
//! with a token bucket for each, a share of the limit the RLS configuration (`--rls-config`)
//! gives the bucket's `BucketId`, so that all Envoys together stay within it. Buckets that no
//! rule limits are answered ALLOW_ALL.
//!
//! - `shares`: the fair-share allocator, pure (the clock passed in).
//! - `service`: the gRPC stream around it, the pushes to other streams, metrics.
//!
//! The shares are kept by the node the Envoys stream to: with several nodes, Envoys of one
//! bucket must stream to the same node (one RLQS address), or each node splits the whole limit.

mod service;
pub mod shares;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use tokio::sync::watch;
use tokio::task::JoinSet;

pub use crate::config::RlqsSettings;
use crate::rls::RlsConfigHandle;
use crate::state::Shared;

/// Most concurrent streams per HTTP/2 connection (an Envoy opens one per domain).
const MAX_STREAMS_PER_CONNECTION: u32 = 1_024;
/// How often expired shares are dropped (they are also dropped on their bucket's next report).
const EXPIRE_EVERY: Duration = Duration::from_secs(1);

/// Binds the listener and spawns the server and the expiry task.
pub(crate) async fn start(
    shared: Arc<Shared>,
    settings: &RlqsSettings,
    config: Arc<RlsConfigHandle>,
    shutdown: watch::Receiver<bool>,
    tasks: &mut JoinSet<()>,
) -> anyhow::Result<SocketAddr> {
    settings.validate(&shared.config.tls)?;
    let tls = if settings.tls {
        Some(crate::rls::tls_config(
            &shared.config.tls,
            settings.client_auth,
        )?)
    } else {
        None
    };
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("binding the RLQS listener on {}", settings.listen))?;
    let addr = listener.local_addr()?;
    let limits = shared.config.limits;
    let hub = Arc::new(service::Hub::new(config, settings.clone()));
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<RateLimitQuotaServiceServer<service::RlqsService>>()
        .await;
    let rlqs = RateLimitQuotaServiceServer::new(service::RlqsService { hub: hub.clone() })
        .max_decoding_message_size(limits.max_frame_bytes)
        .max_encoding_message_size(limits.max_frame_bytes);
    let windows = limits.quic_windows();
    let stream_window = u32::try_from(windows.stream_receive).unwrap_or(u32::MAX);
    let connection_window = u32::try_from(windows.connection_receive).unwrap_or(u32::MAX);
    let incoming = crate::rls::bounded_incoming(listener, limits.max_connections, shutdown.clone());
    let mut stop = shutdown.clone();
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        builder = builder
            .tls_config(tls)
            .context("the RLQS listener's TLS configuration")?;
    }
    tasks.spawn(async move {
        let served = builder
            .initial_stream_window_size(stream_window)
            .initial_connection_window_size(connection_window)
            .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
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
    let mut stop = shutdown;
    tasks.spawn(async move {
        let mut tick = tokio::time::interval(EXPIRE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => hub.expire(),
                _ = stop.wait_for(|stopping| *stopping) => return,
            }
        }
    });
    if !shared.config.cluster.seeds.is_empty() {
        tracing::warn!(
            "RLQS shares are kept by the node each Envoy streams to: point every Envoy of a bucket at the same node"
        );
    }
    tracing::info!(
        %addr,
        ttl_s = settings.assignment_ttl_s,
        tls = settings.tls,
        client_auth = settings.client_auth,
        "RLQS (Envoy rate limit quota service) listening"
    );
    Ok(addr)
}

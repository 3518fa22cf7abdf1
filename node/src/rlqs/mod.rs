//! Envoy's rate limit quota service (RLQS) on the node: `--rlqs-listen` serves
//! `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas` and gRPC
//! health over plaintext HTTP/2 (or TLS with the node's certificate, `--rlqs-tls`, requiring
//! client certificates of the client CA with `--rlqs-client-auth`). Each Envoy streams its usage of every bucket; the node answers
//! with a token bucket for each, a share of the limit the RLS configuration (`--rls-config`)
//! gives the bucket's `BucketId`, so that all Envoys together stay within it. Buckets that no
//! rule limits are answered ALLOW_ALL.
//!
//! In a cluster any node accepts a stream; each bucket's shares are computed by the bucket's
//! owner (its slot's, by the slot table, as any key's), which counts the Envoys of every node
//! that reports it. The accepting node relays the reports of buckets it does not own (kind 21)
//! and passes the owner's assignments to its streams (kind 22).
//!
//! - `shares`: the fair-share allocator, pure (the clock passed in).
//! - `service`: the gRPC stream around it, the pushes to other streams, metrics.
//! - `relay`: the accepting node's queue of reports for other owners, and its sender.
//! - `remote`: the owner's numbering of other nodes' Envoys, and the relay messages.

mod relay;
mod remote;
mod service;
pub mod shares;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use tokio::sync::watch;
use tokio::task::JoinSet;

use floodgate::wire::{ErrorCode, Frame, decode_rlqs_assignments, decode_rlqs_reports};

pub use crate::config::RlqsSettings;
use crate::rls::RlsConfigHandle;
use crate::state::Shared;
pub(crate) use service::Hub;

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
    let hub = shared.rlqs.clone();
    hub.set_config(config);
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
    tracing::info!(
        %addr,
        ttl_s = settings.assignment_ttl_s,
        tls = settings.tls,
        client_auth = settings.client_auth,
        "RLQS (Envoy rate limit quota service) listening"
    );
    Ok(addr)
}

/// The node's RLQS upkeep, with or without `--rlqs-listen` (a node may own buckets other
/// nodes' Envoys report): expired shares dropped every second, and reports for other owners
/// relayed as they come.
pub(crate) async fn upkeep(hub: Arc<Hub>, max_frame_bytes: usize, shutdown: watch::Receiver<bool>) {
    let relay = tokio::spawn(relay::run(hub.clone(), max_frame_bytes, shutdown.clone()));
    expire_every_second(hub, shutdown).await;
    relay.abort();
}

/// Drops expired shares every [`EXPIRE_EVERY`] until shutdown.
pub(crate) async fn expire_every_second(hub: Arc<Hub>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(EXPIRE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => hub.expire(),
            _ = stop.wait_for(|stopping| *stopping) => return,
        }
    }
}

/// Kind 21: a peer's reports for buckets this node owns, answered with the assignments of
/// that peer's Envoys (kind 22). A peer speaks only as itself (`certified`).
pub(crate) fn answer_reports(
    shared: &Shared,
    certified: impl Fn(&str) -> bool,
    frame: &Frame,
    out: &mut Vec<u8>,
) -> Option<ErrorCode> {
    let (code, message) = match decode_rlqs_reports(&frame.payload) {
        Ok(batch) if certified(&batch.from) => {
            let from = batch.from.clone();
            let assignments = shared.rlqs.take_relayed(&from, batch);
            out.extend(remote::assignments_frame(
                &shared.cluster.me.id,
                assignments,
                frame.request_id,
            ));
            return None;
        }
        Ok(batch) => (
            ErrorCode::Forbidden,
            format!(
                "RLQS reports from `{}`: the connection's certificate names another node",
                batch.from
            ),
        ),
        Err(refusal) => refusal,
    };
    crate::service::encode_error(out, frame.request_id, code, message);
    Some(code)
}

/// Kind 22 sent one-way: a bucket owner's new assignments for this node's Envoys.
pub(crate) fn take_assignments(
    shared: &Shared,
    certified: impl Fn(&str) -> bool,
    payload: &[u8],
) -> Result<(), ErrorCode> {
    let batch = decode_rlqs_assignments(payload).map_err(|(code, _)| code)?;
    if !certified(&batch.from) {
        return Err(ErrorCode::Forbidden);
    }
    shared.rlqs.deliver(&batch.from, batch.assignments);
    Ok(())
}

/// The slot that places an RLQS bucket (its domain and `BucketId` entries, in any order): the
/// slot's owner computes the bucket's shares.
pub fn bucket_slot(domain: &str, entries: &[(&str, &str)]) -> u16 {
    let mut entries: Vec<(String, String)> = entries
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    entries.sort_unstable();
    let key = shares::BucketKey {
        domain: domain.to_owned(),
        entries,
    };
    floodgate::cluster::slot_of(&remote::slot_key(&key))
}

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
//! - `regions`: how a `scope: global` bucket's limit is split among regions, pure.
//! - `global`: the node's side of it: each region's part, the claims to the deciding owner
//!   (kind 23) and its parts back (kind 24).
//!
//! The listener itself is started by the server (`server/rlqs_listener.rs`), which also owns
//! the RLS front whose TLS and accept loop it shares: this module reads no node state.

mod global;
mod global_state;
pub mod regions;
mod relay;
mod remote;
mod service;
pub mod shares;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;

use floodgate::wire::{
    ErrorCode, Frame, FrameKind, RlqsReportBatch, WireRlqsReport, decode_rlqs_assignments,
    decode_rlqs_reports, encode_message,
};
use metrics::counter;

pub use crate::config::RlqsSettings;
pub(crate) use global::answer_region_claims;
pub(crate) use service::{ClusterView, Hub, RlqsService};

/// How often expired shares are dropped (they are also dropped on their bucket's next report).
const EXPIRE_EVERY: Duration = Duration::from_secs(1);

/// The node's RLQS upkeep, with or without `--rlqs-listen` (a node may own buckets other
/// nodes' Envoys report): expired shares dropped every second, reports for other owners
/// relayed as they come, and global buckets' parts asked for every second.
pub(crate) async fn upkeep(hub: Arc<Hub>, max_frame_bytes: usize, shutdown: watch::Receiver<bool>) {
    let relay = tokio::spawn(relay_reports(
        hub.clone(),
        max_frame_bytes,
        shutdown.clone(),
    ));
    let regions = tokio::spawn(global::exchange_parts(
        hub.clone(),
        max_frame_bytes,
        shutdown.clone(),
    ));
    expire_every_second(hub, shutdown).await;
    relay.abort();
    regions.abort();
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
    hub: &Hub,
    me: &str,
    certified: impl Fn(&str) -> bool,
    frame: &Frame,
    out: &mut Vec<u8>,
) -> Option<ErrorCode> {
    let (code, message) = match decode_rlqs_reports(&frame.payload) {
        Ok(batch) if certified(&batch.from) => {
            let from = batch.from.clone();
            let assignments = hub.take_relayed(&from, batch);
            out.extend(remote::assignments_frame(me, assignments, frame.request_id));
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
    hub: &Hub,
    certified: impl Fn(&str) -> bool,
    payload: &[u8],
) -> Result<(), ErrorCode> {
    let batch = decode_rlqs_assignments(payload).map_err(|(code, _)| code)?;
    if !certified(&batch.from) {
        return Err(ErrorCode::Forbidden);
    }
    hub.deliver(&batch.from, batch.assignments);
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

/// Sends what is queued for other owners whenever something is, until shutdown: one message per
/// owner (more for a large queue), all owners at once, each answer's assignments to the streams.
/// Reports no owner took are tried once more, each to its bucket's owner by the table then (the
/// owner may have moved, to this node too); past that they are lost (counted), and their Envoys
/// keep their assignments until their next reports.
async fn relay_reports(hub: Arc<Hub>, max_frame_bytes: usize, mut shutdown: watch::Receiver<bool>) {
    let Some(cluster) = hub.cluster.clone() else {
        return;
    };
    loop {
        tokio::select! {
            _ = hub.relay.queued() => {}
            _ = shutdown.wait_for(|stopping| *stopping) => return,
        }
        let batches = hub
            .relay
            .take(&cluster.members.me().id, max_frame_bytes / 2);
        let unanswered = relay_round(&hub, &cluster, batches, max_frame_bytes).await;
        if unanswered.is_empty() {
            continue;
        }
        counter!("floodgate_rlqs_relay_retries_total").increment(unanswered.len() as u64);
        let again = hub.reroute(unanswered, max_frame_bytes / 2);
        let lost = relay_round(&hub, &cluster, again, max_frame_bytes).await;
        counter!("floodgate_rlqs_relay_failures_total").increment(lost.len() as u64);
    }
}

/// Sends each batch to its owner, all at once, and each answer's assignments to the streams;
/// returns the reports no owner took (owner unknown, silent for the relay timeout, its answer
/// refused, or left out of its answer).
async fn relay_round(
    hub: &Hub,
    cluster: &Arc<ClusterView>,
    batches: Vec<(String, RlqsReportBatch)>,
    max_frame_bytes: usize,
) -> Vec<WireRlqsReport> {
    let mut unanswered = Vec::new();
    let mut sends = JoinSet::new();
    for (owner, batch) in batches {
        let Some(addr) = cluster.members.addr_of(&owner) else {
            unanswered.extend(batch.reports);
            continue;
        };
        let mut frame = Vec::new();
        encode_message(&mut frame, FrameKind::RlqsReports, 0, &batch);
        counter!("floodgate_rlqs_relayed_reports_total", "direction" => "sent")
            .increment(batch.reports.len() as u64);
        let peers = cluster.peers.clone();
        sends.spawn(async move {
            let answer = peers
                .request_within(
                    relay::RELAY_TIMEOUT,
                    &addr,
                    &frame,
                    max_frame_bytes + 64,
                    FrameKind::RlqsAssignments,
                )
                .await;
            (owner, batch.reports, answer)
        });
    }
    while let Some(joined) = sends.join_next().await {
        let Ok((owner, reports, answer)) = joined else {
            continue;
        };
        match answer.map(|frame| decode_rlqs_assignments(&frame.payload)) {
            Ok(Ok(batch)) => {
                counter!("floodgate_rlqs_relayed_assignments_total", "way" => "answered")
                    .increment(batch.assignments.len() as u64);
                unanswered.extend(relay::unanswered(reports, &batch.assignments));
                hub.deliver(&owner, batch.assignments);
            }
            Ok(Err((code, why))) => {
                tracing::warn!(%owner, %code, "an RLQS relay's answer was refused: {why}");
                unanswered.extend(reports);
            }
            Err(e) => {
                tracing::debug!(%owner, error = %e, "an RLQS relay got no answer");
                unanswered.extend(reports);
            }
        }
    }
    unanswered
}

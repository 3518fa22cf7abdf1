//! One-way streams: a peer's gossip, id conflicts, replicas and hand-offs in; a subscriber's
//! slot-table pushes out.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use floodgate::Clock;
use floodgate::wire::{
    ErrorCode, FrameKind, HEADER_BYTES, Replicated, decode_gossip, decode_id_conflict,
    decode_lease_sync, decode_replicate,
};
use tokio::sync::watch;

use crate::cluster::{
    Cluster, LeaseReplication, Members, Replication, SlotOwnership, TableMessages,
};
use crate::metrics::NodeMetrics;

use super::Connections;
use super::remote::Remote;

/// What takes in one-way messages: the cluster's driver (gossip) and parts (id conflicts,
/// replicas and hand-offs, lease sets, table pushes), the region exchange and the RLQS hub.
#[derive(Debug)]
pub(super) struct PeerMessages {
    pub(super) cluster: Arc<Cluster>,
    pub(super) members: Arc<Members>,
    pub(super) slots: Arc<SlotOwnership>,
    pub(super) tables: Arc<TableMessages>,
    pub(super) replication: Arc<Replication>,
    pub(super) lease_replication: Arc<LeaseReplication>,
    pub(super) region_sync: Arc<crate::region_sync::RegionSync<floodgate::EpochClock>>,
    pub(super) rlqs: Arc<crate::rlqs::Hub>,
    pub(super) clock: floodgate::EpochClock,
    pub(super) metrics: Arc<NodeMetrics>,
}

/// Longest one slot-table push to a client may take.
pub(super) const PUSH_TIMEOUT: Duration = Duration::from_secs(1);

/// Who sent a message on a unidirectional stream.
pub(super) struct UniSender {
    pub(super) remote: Remote,
    /// The connection already receives table pushes.
    pub(super) subscribed: Arc<AtomicBool>,
}

/// Handles one message sent on a unidirectional stream: from peers, gossip or buckets; from
/// anyone, a `TableRequest`, which subscribes the connection to table pushes (this task then
/// pushes until the connection or the node ends).
pub(super) async fn serve_uni_message(
    mut recv: quinn::RecvStream,
    from: UniSender,
    connections: Arc<Connections>,
    messages: Arc<PeerMessages>,
    shutdown: watch::Receiver<bool>,
) {
    let is_peer = from.remote.is_peer();
    let Some((mut reader, _reserved)) =
        read_message(&mut recv, &from.remote, &connections, is_peer).await
    else {
        return;
    };
    loop {
        let frame = match reader.next_frame() {
            Ok(Some(frame)) => frame,
            Ok(None) => return,
            Err(e) => {
                refused_message(&messages.metrics, &from.remote, &e);
                return;
            }
        };
        let now_ns = messages.clock.now_ns();
        match frame.kind {
            FrameKind::TableRequest => {
                if !from.subscribed.swap(true, Ordering::Relaxed) {
                    push_tables(&from.remote, &messages, shutdown.clone()).await;
                }
                return;
            }
            // A peer pushing its table to this node as to any client: nodes keep their own.
            FrameKind::SlotTable if is_peer => {}
            kind if kind.peer_only() && !is_peer => {
                from.remote.forbid(&messages.metrics, kind);
                return;
            }
            _ if !is_peer => messages.metrics.frame_error(ErrorCode::UnknownKind),
            FrameKind::Gossip => match decode_gossip(frame.version, &frame.payload) {
                Ok(gossip) => {
                    // A peer speaks for the members its certificate names; the rest it relays.
                    let names = crate::tls::NodeNames::of(from.remote.connection.peer_identity());
                    messages
                        .cluster
                        .handle_gossip(now_ns, &names.checker(), &gossip);
                }
                Err((code, _)) => messages.metrics.frame_error(code),
            },
            FrameKind::IdConflict => match decode_id_conflict(&frame.payload) {
                Ok(conflict) => messages.members.handle_conflict(&conflict, now_ns).await,
                Err((code, _)) => messages.metrics.frame_error(code),
            },
            FrameKind::Replicate => {
                on_replicate(&messages, &from.remote, &frame, now_ns).await;
            }
            FrameKind::LeaseSync => on_lease_sync(&messages, &from.remote, &frame, now_ns),
            FrameKind::RegionDeltas | FrameKind::RegionAck => {
                on_region_frame(&messages, &from.remote, &frame);
            }
            FrameKind::RlqsAssignments => {
                let certified = |id: &str| from.remote.certified_as(id);
                if let Err(code) =
                    crate::rlqs::take_assignments(&messages.rlqs, certified, &frame.payload)
                {
                    messages.metrics.frame_error(code);
                }
            }
            _ => messages.metrics.frame_error(ErrorCode::UnknownKind),
        }
    }
}

/// Reads a one-way message whole, within the node's buffer budget. The header comes first: a
/// peer-only kind from a non-peer closes the stream unread, and a client may only subscribe
/// (an empty frame), so it gets no room for more. `None`: nothing to handle.
async fn read_message<'s>(
    recv: &mut quinn::RecvStream,
    remote: &Remote,
    connections: &'s Connections,
    is_peer: bool,
) -> Option<(floodgate::wire::FrameReader, crate::budget::Reservation<'s>)> {
    let max = connections.limits.max_frame_bytes;
    let mut header = [0u8; HEADER_BYTES];
    if recv.read_exact(&mut header).await.is_err() {
        return None;
    }
    if let Some(kind) = FrameKind::from_u8(header[3]).filter(|k| k.peer_only())
        && !is_peer
    {
        remote.forbid(&connections.metrics, kind);
        return None;
    }
    let readable = if is_peer { max + HEADER_BYTES } else { 64 };
    match crate::budget::read_message(recv, &header, max, readable, &connections.budget, is_peer)
        .await
    {
        Ok(read) => Some(read),
        Err(over_budget) => {
            if over_budget.is_some() {
                connections.metrics.over_buffer_budget.increment(1);
                let _ = recv.stop(quinn::VarInt::from_u32(ErrorCode::Overloaded as u32));
            }
            None
        }
    }
}

/// Replicas, or a part of a hand-off: merged into the store (only ever stricter); a hand-off
/// part also counts toward its hand-off, and its buckets for slots this node's table gives to
/// a third member go on to that owner.
async fn on_replicate(
    messages: &PeerMessages,
    remote: &Remote,
    frame: &floodgate::wire::Frame,
    now_ns: u64,
) {
    let Replicated {
        from: sender_id,
        handoff,
        buckets,
    } = match decode_replicate(frame.version, &frame.payload) {
        Ok(replicated) => replicated,
        Err((code, _)) => return messages.metrics.frame_error(code),
    };
    // A node speaks only as itself: its hand-offs count as the named node's.
    if !remote.certified_as(&sender_id) {
        messages.metrics.frame_error(ErrorCode::Forbidden);
        tracing::warn!(
            remote = %remote.connection.remote_address(),
            "dropped a replicate from `{sender_id}`: its certificate names another node"
        );
        return;
    }
    // The layout the frame was written in: for replicas the sender's region version, for a
    // hand-off its link's. During an upgrade region by region, an operator (and the upgrade
    // test) sees a region's replicas move to the newest layout once its own members all run
    // the new build.
    metrics::counter!("floodgate_replicate_frames_received_total",
        "of" => if handoff.is_some() { "handoff" } else { "replicas" },
        "version" => frame.version.to_string())
    .increment(1);
    let replication = &messages.replication;
    // Only a panic or the runtime shutting down: nothing merged, nothing counted.
    let Some((buckets, refused)) = replication.merge(buckets, now_ns).await else {
        return;
    };
    if let Some(part) = &handoff {
        tracing::info!(
            from = %sender_id,
            part = part.part,
            parts = part.parts,
            slots = part.slots.len(),
            buckets = buckets.len(),
            "hand-off part received"
        );
        messages.slots.handoff_received(&sender_id, part, now_ns);
        let passed = replication.pass_on_stranded(&messages.slots.table(), &sender_id, &buckets);
        if passed > 0 {
            metrics::counter!("floodgate_handoff_buckets_passed_on_total").increment(passed as u64);
        }
    }
    let counter = if handoff.is_some() {
        &messages.metrics.received_handoff
    } else {
        &messages.metrics.received_replicas
    };
    counter.increment((buckets.len() - refused) as u64);
    replication.count_received((buckets.len() - refused) as u64);
}

/// A peer's lease sets (replicated, or handed off with their slots), merged.
fn on_lease_sync(
    messages: &PeerMessages,
    remote: &Remote,
    frame: &floodgate::wire::Frame,
    now_ns: u64,
) {
    match decode_lease_sync(frame.version, &frame.payload) {
        // A node speaks only as itself, as for replicas.
        Ok(sync) if !remote.certified_as(&sync.from) => {
            messages.metrics.frame_error(ErrorCode::Forbidden);
        }
        Ok(sync) => {
            messages
                .lease_replication
                .merge_from_peer(sync.sets, sync.handoff, now_ns);
        }
        Err((code, _)) => messages.metrics.frame_error(code),
    }
}

/// Region deltas or an acknowledgement (kinds 13 and 14), handled by the region exchange.
fn on_region_frame(messages: &PeerMessages, remote: &Remote, frame: &floodgate::wire::Frame) {
    // A node speaks only as itself: the message must name the certified node, in the region
    // the membership knows it in.
    let certified = |node: &str| remote.certified_as(node);
    let region_of = |node: &str| messages.members.region_of(node);
    // Under the gate: the table the units are routed by stays in force until they landed, so
    // a table switch's hand-off carries them.
    let _deciding = messages.slots.deciding();
    let route = messages
        .slots
        .delta_router(messages.region_sync.me().region, messages.clock.now_ns());
    match messages.region_sync.receive_from(
        frame.kind,
        frame.version,
        &frame.payload,
        &certified,
        &region_of,
        &route,
    ) {
        // The layout the frame was written in, which for deltas follows the version the link
        // agreed on: during an upgrade across regions an operator (and the upgrade test) sees
        // a link move to the newest one.
        Ok(()) => metrics::counter!("floodgate_region_frames_received_total",
            "kind" => if frame.kind == FrameKind::RegionDeltas { "deltas" } else { "ack" },
            "version" => frame.version.to_string())
        .increment(1),
        Err(code) => messages.metrics.frame_error(code),
    }
}

/// A one-way message that could not be cut into a frame: counted, and logged (a frame of a
/// protocol version this node does not read at ERROR, with both versions: a peer or client of
/// another build sent it, and nothing it said was read).
fn refused_message(metrics: &NodeMetrics, remote: &Remote, error: &floodgate::wire::FrameError) {
    metrics.frame_error(error.code);
    let from = remote.connection.remote_address();
    if error.code == ErrorCode::UnsupportedVersion {
        tracing::error!(%from, "dropped a one-way message: {}", error.message);
    } else {
        tracing::debug!(%from, "dropped a one-way message: {error}");
    }
}

/// Sends the slot table on a new unidirectional stream each time it changes, in the version
/// the connection agreed on, until the connection closes or the node shuts down: clients route
/// by the new table without waiting for an answer to hint at it.
pub(super) async fn push_tables(
    remote: &Remote,
    messages: &PeerMessages,
    mut shutdown: watch::Receiver<bool>,
) {
    let connection = &remote.connection;
    let version = remote.version();
    let mut tables = messages.slots.watch_table();
    tables.borrow_and_update();
    loop {
        tokio::select! {
            changed = tables.changed() => if changed.is_err() { return },
            _ = connection.closed() => return,
            _ = shutdown.changed() => return,
        }
        let mut frame = Vec::new();
        messages.tables.encode_table(&mut frame, version, 0);
        let pushed = tokio::time::timeout(PUSH_TIMEOUT, async {
            let mut stream = connection.open_uni().await?;
            stream.write_all(&frame).await?;
            stream.finish()?;
            anyhow::Ok(())
        })
        .await;
        if !matches!(pushed, Ok(Ok(()))) {
            tracing::debug!(peer = %connection.remote_address(), "slot table push failed");
        }
    }
}

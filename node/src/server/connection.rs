//! QUIC connections: the accept loop, admission after the handshake, one task per stream.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use floodgate::wire::ErrorCode;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::admission::{Admitted, Handshake};

use super::Connections;
use super::peer_messages::{PeerMessages, UniSender, serve_uni_message};
use super::remote::Remote;
use super::streams::{Answering, serve_stream};

/// What a connection's tasks are handed: admission and reading, what answers its streams'
/// frames, and what takes its one-way messages in.
#[derive(Debug, Clone)]
pub(super) struct Serving {
    pub(super) connections: Arc<Connections>,
    pub(super) answering: Arc<Answering>,
    pub(super) messages: Arc<PeerMessages>,
}

pub(super) async fn accept_loop(
    endpoint: quinn::Endpoint,
    serving: Serving,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut connections = JoinSet::new();
    loop {
        let incoming = tokio::select! {
            incoming = endpoint.accept() => incoming,
            _ = shutdown.changed() => break,
        };
        let Some(incoming) = incoming else { break };
        let Some(handshake) = serving.connections.allowance.start_handshake() else {
            serving.connections.metrics.connections_refused.increment(1);
            incoming.refuse();
            continue;
        };
        // Reap finished connection tasks so the set stays bounded by live connections.
        while connections.try_join_next().is_some() {}
        connections.spawn(serve_connection(
            incoming,
            handshake,
            serving.clone(),
            shutdown.clone(),
        ));
    }
    while connections.join_next().await.is_some() {}
}

pub(super) async fn serve_connection(
    incoming: quinn::Incoming,
    handshake: Handshake,
    serving: Serving,
    mut shutdown: watch::Receiver<bool>,
) {
    let connection = match incoming.await {
        Ok(connection) => connection,
        Err(e) => {
            tracing::debug!("handshake failed: {e}");
            return;
        }
    };
    let Serving {
        connections,
        answering,
        messages,
    } = serving;
    let remote = Remote::new(connection.clone(), connections.peer_trust.clone());
    let Some(_admitted) = admit(&connections, &remote, handshake) else {
        return;
    };
    let mut streams = JoinSet::new();
    let subscribed = Arc::new(AtomicBool::new(false));
    let stop_messages = shutdown.clone();
    let take_one_way = |streams: &mut JoinSet<()>, recv: quinn::RecvStream| {
        // Finished tasks count until joined: gossip and replication use one stream per
        // message, so without this a quiet connection would drop every message after 256.
        while streams.try_join_next().is_some() {}
        if streams.len() < 256 {
            let from = UniSender {
                remote: remote.clone(),
                subscribed: subscribed.clone(),
            };
            streams.spawn(serve_uni_message(
                recv,
                from,
                connections.clone(),
                messages.clone(),
                stop_messages.clone(),
            ));
        }
    };
    loop {
        let accepted = tokio::select! {
            accepted = connection.accept_bi() => accepted.map(Some),
            accepted = connection.accept_uni() => accepted.map(|recv| {
                take_one_way(&mut streams, recv);
                None
            }),
            _ = shutdown.changed() => break,
        };
        match accepted {
            Ok(Some((send, recv))) => {
                while streams.try_join_next().is_some() {}
                let remote = remote.clone();
                streams.spawn(serve_stream(
                    send,
                    recv,
                    remote,
                    connections.clone(),
                    answering.clone(),
                    shutdown.clone(),
                ));
            }
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(peer = %connection.remote_address(), "connection ended: {e}");
                // One-way messages received whole before the close are still handed out (a
                // closed connection's accept yields them before its error): a sender that
                // closed right after its message was acknowledged must not lose it because
                // `select!` happened to poll `accept_bi` first.
                while let Ok(recv) = connection.accept_uni().await {
                    take_one_way(&mut streams, recv);
                }
                break;
            }
        }
    }
    // Let every stream answer what it has received, then tell the peer why we are closing.
    while streams.join_next().await.is_some() {}
    if *shutdown.borrow() {
        connection.close(
            quinn::VarInt::from_u32(ErrorCode::ShuttingDown as u32),
            b"node shutting down",
        );
    }
}

/// Admits the connection of `remote`, or closes it with `overloaded`. Peers are counted apart
/// from clients: only a node certificate of the peer CA is one.
fn admit(connections: &Connections, remote: &Remote, handshake: Handshake) -> Option<Admitted> {
    let connection = &remote.connection;
    let peer = remote.is_peer();
    let Some(admitted) = connections.allowance.admit(handshake, peer) else {
        connections.metrics.connections_refused.increment(1);
        let side = if peer { "peer" } else { "client" };
        connection.close(
            quinn::VarInt::from_u32(ErrorCode::Overloaded as u32),
            format!("too many {side} connections: retry later").as_bytes(),
        );
        return None;
    };
    if peer {
        // A peer's hand-off sends all its parts at once, each bounded by a short timeout: a
        // connection window of a client's share would queue them past it. A peer is bounded
        // by its streams instead (80 at once, each one frame's window).
        connection.set_receive_window(quinn::VarInt::MAX);
    }
    Some(admitted)
}

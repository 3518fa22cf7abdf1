//! QUIC connections: the accept loop, admission after the handshake, one task per stream, and
//! whether the other end is a peer (a node certificate of the peer CA).

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};

use floodgate::wire::{ErrorCode, FrameKind};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::admission::Handshake;
use crate::state::Shared;

use super::peer_messages::{UniSender, serve_uni_message};
use super::streams::serve_stream;

pub(super) async fn accept_loop(
    endpoint: quinn::Endpoint,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut connections = JoinSet::new();
    loop {
        let incoming = tokio::select! {
            incoming = endpoint.accept() => incoming,
            _ = shutdown.changed() => break,
        };
        let Some(incoming) = incoming else { break };
        let Some(handshake) = shared.allowance.start_handshake() else {
            shared.metrics.connections_refused.increment(1);
            incoming.refuse();
            continue;
        };
        // Reap finished connection tasks so the set stays bounded by live connections.
        while connections.try_join_next().is_some() {}
        connections.spawn(serve_connection(
            incoming,
            handshake,
            shared.clone(),
            shutdown.clone(),
        ));
    }
    while connections.join_next().await.is_some() {}
}

pub(super) async fn serve_connection(
    incoming: quinn::Incoming,
    handshake: Handshake,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    let connection = match incoming.await {
        Ok(connection) => connection,
        Err(e) => {
            tracing::debug!("handshake failed: {e}");
            return;
        }
    };
    let remote = Remote {
        connection: connection.clone(),
        peer: Arc::new(OnceLock::new()),
        certified: Arc::default(),
    };
    // Peers are counted apart from clients: only a node certificate of the peer CA is one.
    let peer = remote.is_peer(&shared);
    let Some(_admitted) = shared.allowance.admit(handshake, peer) else {
        shared.metrics.connections_refused.increment(1);
        let side = if peer { "peer" } else { "client" };
        connection.close(
            quinn::VarInt::from_u32(ErrorCode::Overloaded as u32),
            format!("too many {side} connections: retry later").as_bytes(),
        );
        return;
    };
    let mut streams = JoinSet::new();
    let subscribed = Arc::new(AtomicBool::new(false));
    loop {
        let accepted = tokio::select! {
            accepted = connection.accept_bi() => accepted.map(Some),
            accepted = connection.accept_uni() => accepted.map(|recv| {
                // Finished tasks count until joined: gossip and replication use one stream per
                // message, so without this a quiet connection would drop every message after 256.
                while streams.try_join_next().is_some() {}
                if streams.len() < 256 {
                    let from = UniSender {
                        remote: remote.clone(),
                        subscribed: subscribed.clone(),
                    };
                    streams.spawn(serve_uni_message(recv, from, shared.clone(), shutdown.clone()));
                }
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
                    shared.clone(),
                    shutdown.clone(),
                ));
            }
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(peer = %connection.remote_address(), "connection ended: {e}");
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

/// The other end of a connection, and whether it is a peer.
#[derive(Clone)]
pub(super) struct Remote {
    pub(super) connection: quinn::Connection,
    /// Decided on first need, not at accept: a server's connection is up before the client's
    /// certificate has arrived, but not before a stream from it has.
    peer: Arc<OnceLock<bool>>,
    /// The last node id its certificate was verified to carry.
    certified: Arc<parking_lot::Mutex<Option<String>>>,
}

impl Remote {
    /// True when the connection's certificate is a node's from the peer CA.
    pub(super) fn is_peer(&self, shared: &Shared) -> bool {
        *self.peer.get_or_init(|| {
            let identity = self.connection.peer_identity();
            shared.peer_trust.read().is_peer(identity)
        })
    }

    /// True when the connection's certificate is a node certificate for node `id`.
    pub(super) fn certified_as(&self, shared: &Shared, id: &str) -> bool {
        let mut certified = self.certified.lock();
        if certified.as_deref() == Some(id) {
            return true;
        }
        let identity = self.connection.peer_identity();
        let names = shared.peer_trust.read().names(identity, id);
        if names {
            *certified = Some(id.to_owned());
        }
        names
    }

    /// Refuses a peer-only frame from a non-peer: closes the connection with `forbidden`, the
    /// payload unread.
    pub(super) fn forbid(&self, shared: &Shared, kind: FrameKind) {
        shared.metrics.frame_error(ErrorCode::Forbidden);
        tracing::warn!(
            remote = %self.connection.remote_address(),
            "closing a connection that sent {kind:?} frames without a peer certificate"
        );
        self.connection.close(
            quinn::VarInt::from_u32(ErrorCode::Forbidden as u32),
            format!("forbidden: {kind:?} frames are for peers with a certificate from the peer CA")
                .as_bytes(),
        );
    }
}

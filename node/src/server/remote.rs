//! The other end of a connection: whether it is a peer (a node certificate of the peer CA),
//! which node id its certificate carries, and how it is refused a peer-only frame.

use std::sync::{Arc, OnceLock};

use floodgate::protocol::Feature;
use floodgate::wire::{ErrorCode, FrameKind};

use crate::caller::{Caller, RefundCredit};
use crate::metrics::NodeMetrics;
use crate::tls::PeerTrust;

/// The other end of a connection, and whether it is a peer.
#[derive(Clone)]
pub(super) struct Remote {
    pub(super) connection: quinn::Connection,
    /// Decided on first need, not at accept: a server's connection is up before the client's
    /// certificate has arrived, but not before a stream from it has.
    peer: Arc<OnceLock<bool>>,
    /// The last node id its certificate was verified to carry.
    certified: Arc<parking_lot::Mutex<Option<String>>>,
    /// The protocol version the handshake agreed on.
    version: u8,
    /// What a gateway may refund on this connection (unused for a peer).
    credit: Arc<RefundCredit>,
    /// Who counts as a peer, and which node ids a certificate carries.
    trust: Arc<parking_lot::RwLock<PeerTrust>>,
}

impl Remote {
    pub(super) fn new(
        connection: quinn::Connection,
        trust: Arc<parking_lot::RwLock<PeerTrust>>,
    ) -> Self {
        Remote {
            version: crate::tls::agreed_version(&connection),
            connection,
            peer: Arc::new(OnceLock::new()),
            certified: Arc::default(),
            credit: Arc::default(),
            trust,
        }
    }

    /// How a check batch from this connection is answered: what its version understands, and
    /// what a gateway may refund (a peer's forwarded refunds were checked where they entered).
    pub(super) fn caller(&self) -> Caller<'_> {
        Caller {
            try_again: Feature::TryAgain.readable_at(self.version),
            credit: (!self.is_peer()).then_some(&*self.credit),
        }
    }

    /// The protocol version the connection speaks: what is written to it is in this version's
    /// layouts.
    pub(super) fn version(&self) -> u8 {
        self.version
    }

    /// True when the connection's certificate is a node's from the peer CA.
    pub(super) fn is_peer(&self) -> bool {
        *self.peer.get_or_init(|| {
            let identity = self.connection.peer_identity();
            self.trust.read().is_peer(identity)
        })
    }

    /// True when the connection's certificate is a node certificate for node `id`.
    pub(super) fn certified_as(&self, id: &str) -> bool {
        let mut certified = self.certified.lock();
        if certified.as_deref() == Some(id) {
            return true;
        }
        let identity = self.connection.peer_identity();
        let names = self.trust.read().names(identity, id);
        if names {
            *certified = Some(id.to_owned());
        }
        names
    }

    /// Refuses a peer-only frame from a non-peer: closes the connection with `forbidden`, the
    /// payload unread (counted in `metrics`).
    pub(super) fn forbid(&self, metrics: &NodeMetrics, kind: FrameKind) {
        metrics.frame_error(ErrorCode::Forbidden);
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

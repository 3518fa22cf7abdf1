//! What a caller can see of a node's link: [`LinkState`], [`NodeStatus`] and its
//! [`TransportStats`].

use std::net::SocketAddr;
use std::time::Duration;

/// Where a node's connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkState {
    /// The first connection attempt is under way.
    Connecting,
    /// Connected (the handshake completed; with mutual TLS the node may still refuse us).
    Connected,
    /// No connection; reconnecting in the background with backoff.
    Disconnected,
}

/// A snapshot of one node's link, for health checks and error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    pub addr: SocketAddr,
    pub state: LinkState,
    /// Why the last connection attempt failed or the last connection ended.
    pub last_error: Option<String>,
    /// The current connection's transport figures (`None` while there is no connection).
    pub transport: Option<TransportStats>,
}

/// What QUIC saw on a node's current connection since it was made: whether datagrams are lost
/// (each loss costs a call at least a retransmission timeout) and how the round trip stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransportStats {
    /// Smoothed round-trip time.
    pub rtt: Duration,
    /// Packets sent, and of those declared lost.
    pub sent_packets: u64,
    pub lost_packets: u64,
    /// Times the congestion window was cut for a loss.
    pub congestion_events: u64,
    /// The datagram size in use, and how often probing for a larger one found a black hole.
    pub mtu: u16,
    pub black_holes: u64,
}

impl TransportStats {
    pub(crate) fn of(conn: &quinn::Connection) -> Self {
        let path = conn.stats().path;
        TransportStats {
            rtt: path.rtt,
            sent_packets: path.sent_packets,
            lost_packets: path.lost_packets,
            congestion_events: path.congestion_events,
            mtu: path.current_mtu,
            black_holes: path.black_holes_detected,
        }
    }
}

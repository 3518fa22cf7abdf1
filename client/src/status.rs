//! What a caller can see of a node's link: [`LinkState`] and [`NodeStatus`].

use std::net::SocketAddr;

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
}

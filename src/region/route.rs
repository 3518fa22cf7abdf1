//! [`Route`]: where a received delta goes. A region's deltas are addressed by the sender's view
//! of this region's ring, which lags an ownership move: units applied by a node that no longer
//! owns the key (or that has not yet received the slot's hand-off) would never reach the bucket
//! that decides it.

use super::delta::Peer;

/// Where the units of one received delta go, as the receiving node's table says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// This node decides the key: the units go into its bucket now.
    Here,
    /// This node decides the key but still waits for the slot's hand-off, whose state would
    /// replace units applied now: they wait with the key's backlog and go into the bucket at
    /// the key's next global check.
    Hold,
    /// Another node of this region decides the key: the units are passed on to it, numbered
    /// and sent again until acknowledged like any delta.
    PassOn(Peer),
}

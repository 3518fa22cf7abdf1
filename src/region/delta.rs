//! The exchange's messages as core types: deltas, their acknowledgements, and who sends them.

use std::sync::Arc;

use super::scope::RegionName;
use crate::{BucketKey, Limit};

/// One node of one region: the source or destination of deltas.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Peer {
    pub region: RegionName,
    pub node: Arc<str>,
}

impl Peer {
    pub fn new(region: RegionName, node: &str) -> Self {
        Peer {
            region,
            node: Arc::from(node),
        }
    }
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.region, self.node)
    }
}

/// Units of a global key admitted in the sender's region since its last message to this
/// destination (aggregated: `at_ns` is the latest admission).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delta {
    pub key: BucketKey,
    pub limit: Limit,
    pub units: u64,
    pub at_ns: u64,
}

/// Sender → receiver: deltas under one sequence number of the sender's session. Applied once,
/// acknowledged every time it arrives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeltaBatch {
    pub from: Peer,
    /// The sender's incarnation (e.g. its start time): sequence numbers restart with it, and a
    /// receiver forgets what it knew of an older one.
    pub session: u64,
    /// 1, 2, 3, ... per (session, destination).
    pub seq: u64,
    /// Every sequence number below this was acknowledged by the destination (at most `seq`): a
    /// receiver that knows nothing of this session starts its inbox here, one that knows less
    /// moves up to it. `None` from a sender that does not say (protocol version 2's layout).
    pub settled_below: Option<u64>,
    pub deltas: Vec<Delta>,
}

/// Receiver → sender: which of the sender's messages were applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeltaAck {
    pub from: Peer,
    /// The session of the messages acknowledged.
    pub session: u64,
    /// Every sequence number below this was applied.
    pub below: u64,
    /// Sequence numbers above `below` that were applied too (at most [`MAX_ACK_RANGES`]).
    pub also: Vec<u64>,
    /// The acknowledging node's own session: when it changes, the receiver restarted and has
    /// not seen what is in flight, so the sender sends it again at once. `None` from a receiver
    /// that does not say (protocol version 2's layout).
    pub receiver_session: Option<u64>,
}

/// Most out-of-order sequence numbers one acknowledgement lists.
pub const MAX_ACK_RANGES: usize = 256;

/// A message the exchange wants sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outgoing {
    Deltas(DeltaBatch),
    Ack(DeltaAck),
}

/// What `poll_transmit` returns: a message and its destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    pub to: Peer,
    pub message: Outgoing,
}

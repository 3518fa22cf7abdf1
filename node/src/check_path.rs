//! [`CheckPath`]: what deciding a request on this node's state takes. The paths that place,
//! decide and forward checks, leases and token leases (`forward`, `scoped`, `reach`,
//! `owner_batches`, `lease`, `token_leases`) receive it, and nothing else of the node.

use std::sync::Arc;
use std::time::Duration;

use floodgate::lease::LeaseStore;
use floodgate::{BucketStore, EpochClock};

use crate::cluster::{Members, OtherRegions, Peers, SlotOwnership};
use crate::config::NodeLimits;
use crate::metrics::NodeMetrics;
use crate::region_sync::RegionSync;

/// The node's state requests decide on, who decides which slot, and the means to send a group
/// to the node that decides it.
#[derive(Debug)]
pub(crate) struct CheckPath {
    /// The limits callers' input is held to (frame and batch sizes, keys, limits).
    pub(crate) limits: NodeLimits,
    /// How long a forwarded takeover waits for the owner's answer.
    pub(crate) takeover_forward_timeout: Duration,
    /// The buckets checks and token leases decide on.
    pub(crate) store: Arc<BucketStore>,
    /// The concurrency leases lease requests decide on.
    pub(crate) leases: Arc<LeaseStore>,
    pub(crate) clock: EpochClock,
    pub(crate) metrics: Arc<NodeMetrics>,
    /// Who decides which slot: the table in force, the deciding gate, the hand-off waits.
    pub(crate) slots: Arc<SlotOwnership>,
    /// This node, where the other members are, who is suspected, the cluster version.
    pub(crate) members: Arc<Members>,
    /// Connections to the nodes groups are forwarded to.
    pub(crate) peers: Arc<Peers>,
    /// Groups waiting to be forwarded to an owner in this region, sent together.
    pub(crate) forwards: Arc<crate::forward_queue::ForwardQueues>,
    /// The other regions' rings: where a global group's units and a home group go.
    pub(crate) regions: Arc<OtherRegions>,
    /// The inter-region exchange global groups are decided through.
    pub(crate) region_sync: Arc<RegionSync<EpochClock>>,
}

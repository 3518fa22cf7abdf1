//! What every connection and stream task shares: the node's store, clock, metrics, limits,
//! cluster, rules and peer trust, and whether it is ready.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use floodgate::{BucketStore, EpochClock};

use crate::admission::ConnectionAllowance;
use crate::budget::BufferBudget;
use crate::cluster::Cluster;
use crate::config::NodeConfig;
use crate::metrics::NodeMetrics;
use crate::tls;

/// What every connection and stream task shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: NodeConfig,
    pub(crate) store: Arc<BucketStore>,
    pub(crate) clock: EpochClock,
    pub(crate) metrics: Arc<NodeMetrics>,
    /// Client and peer connections, counted apart.
    pub(crate) allowance: Arc<ConnectionAllowance>,
    /// Bytes buffered from all streams, against `max_buffered_bytes`.
    pub(crate) budget: BufferBudget,
    pub(crate) ready: AtomicBool,
    /// Membership, slot table and peers (a node alone is a cluster of one).
    pub(crate) cluster: Arc<Cluster>,
    /// The inter-region exchange of global keys.
    pub(crate) region_sync: Arc<crate::region_sync::RegionSync<EpochClock>>,
    /// The rules file in force (`--rules`), served to clients and hot-reloaded.
    pub(crate) rules: Option<Arc<crate::rules::RulesHandle>>,
    /// RLQS shares: of the buckets this node owns, whoever's Envoys report them, and the
    /// reports of this node's Envoys for other owners (with or without `--rlqs-listen`).
    pub(crate) rlqs: Arc<crate::rlqs::Hub>,
    /// Who may send peer-only frames (gossip, replicate, forwarded checks); replaced when the
    /// certificates are reloaded.
    pub(crate) peer_trust: parking_lot::RwLock<tls::PeerTrust>,
    /// What deciding a request on this node's state takes.
    pub(crate) checks: Arc<crate::check_path::CheckPath>,
}

pub(crate) fn not_ready_reason(shared: &Shared) -> Option<String> {
    if !shared.ready.load(Ordering::Relaxed) {
        return Some("shutting down".to_owned());
    }
    shared.cluster.not_ready_reason()
}

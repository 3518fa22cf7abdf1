//! What the hub keeps of `scope: global` buckets (`--rlqs-global-domain`): this region's part of
//! each, and the splits this node decides for every region. How they are used is `global`.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::AtomicBool;

use parking_lot::Mutex;

use super::regions::{RegionShare, RegionSplits, SplitConfig};
use super::shares::BucketKey;

/// The global buckets this node computes shares of, and the splits it decides.
#[derive(Debug)]
pub(crate) struct Global {
    pub(super) domains: BTreeSet<String>,
    pub(super) parts: Mutex<HashMap<BucketKey, RegionShare>>,
    pub(super) splits: Mutex<RegionSplits>,
    pub(super) max_buckets: usize,
    /// Set once the lack of a member speaking version 8 was logged.
    pub(super) warned_old: AtomicBool,
}

impl Global {
    pub(crate) fn new(domains: BTreeSet<String>, ttl_ns: u64, max_buckets: usize) -> Global {
        Global {
            domains,
            parts: Mutex::new(HashMap::new()),
            splits: Mutex::new(RegionSplits::new(SplitConfig {
                ttl_ns,
                max_buckets,
            })),
            max_buckets,
            warned_old: AtomicBool::new(false),
        }
    }
}

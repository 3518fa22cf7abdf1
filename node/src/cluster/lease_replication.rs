//! [`LeaseReplication`]: leases between nodes (kind 17). The lease sets changed since the last
//! round go to each slot's successor with the buckets' replication, a hand-off sends the lease
//! sets of the slots it carries before their buckets, so a new owner has them when it starts
//! deciding, and a peer's lease sets are merged here.

use std::collections::HashMap;
use std::sync::Arc;

use floodgate::cluster::SlotTable;
use floodgate::lease::{LeaseSetState, LeaseStore};
use floodgate::wire::{LeaseSyncMessage, WireLeaseSet, encode_lease_sync, lease_set_wire_bytes};
use tokio::sync::watch;

use super::Members;

/// Concurrency leases between nodes: replicated, handed off with their slots, merged in.
#[derive(Debug)]
pub(crate) struct LeaseReplication {
    /// This node's id: the sender of its lease frames.
    me: String,
    /// The node's leases, replicated and handed off with the buckets of their slots.
    leases: Arc<LeaseStore>,
    /// Encoded bytes per frame (the replication frame budget).
    bucket_bytes_per_frame: usize,
    /// Where successors and owners are, and the cluster version frames are written in.
    members: Arc<Members>,
    /// Lease sets merged from peers since start (for tests and tools to await).
    received: watch::Sender<u64>,
}

impl LeaseReplication {
    pub(super) fn new(
        me: String,
        leases: Arc<LeaseStore>,
        bucket_bytes_per_frame: usize,
        members: Arc<Members>,
    ) -> Self {
        LeaseReplication {
            me,
            leases,
            bucket_bytes_per_frame,
            members,
            received: watch::Sender::new(0),
        }
    }

    /// Kind 17 frames carrying `sets` in the layout of protocol `version`, each within the
    /// replication frame budget (at least one set per frame); none when there is nothing to
    /// send. A round's replicas are written for the region's version (every member of the
    /// ring reads them: 128-bit ids once it has them), a hand-off's for its link's.
    pub(super) fn lease_frames(
        &self,
        version: u8,
        handoff: bool,
        sets: &[LeaseSetState],
    ) -> Vec<Vec<u8>> {
        let mut frames = Vec::new();
        let mut start = 0;
        while start < sets.len() {
            let mut end = start;
            let mut bytes = 0;
            while end < sets.len()
                && end - start < floodgate::wire::MAX_WIRE_LEASE_SETS
                && (end == start
                    || bytes + lease_set_wire_bytes(&sets[end]) <= self.bucket_bytes_per_frame)
            {
                bytes += lease_set_wire_bytes(&sets[end]);
                end += 1;
            }
            let message = LeaseSyncMessage {
                from: self.me.clone(),
                handoff,
                sets: sets[start..end].iter().map(WireLeaseSet::from).collect(),
            };
            let mut frame = Vec::new();
            let left_out = encode_lease_sync(&mut frame, version, &message);
            if left_out > 0 {
                metrics::counter!("floodgate_lease_sync_left_out_total").increment(left_out as u64);
            }
            frames.push(frame);
            start = end;
        }
        frames
    }

    /// The lease sets changed since the last round (and the releases) as frames for their
    /// slots' successors, or for the owner of a set decided here for another owner (a
    /// takeover), by peer address: part of a replication round's frames.
    pub(super) fn round_frames(&self, now_ns: u64, table: &SlotTable) -> Vec<(String, Vec<u8>)> {
        let mut changed = Vec::new();
        self.leases.take_changed(now_ns, &mut changed);
        if changed.is_empty() {
            return Vec::new();
        }
        let me = self.me.as_str();
        let mut by_target: HashMap<&str, Vec<LeaseSetState>> = HashMap::new();
        for set in changed {
            let slot = set.key.slot();
            let target = match table.owner(slot) {
                Some(owner) if owner == me => table.successor(slot),
                other => other,
            };
            if let Some(target) = target {
                by_target.entry(target).or_default().push(set);
            }
        }
        let mut frames = Vec::new();
        for (target, sets) in by_target {
            let Some(addr) = self.members.addr_of(target) else {
                continue;
            };
            metrics::counter!("floodgate_replicated_lease_sets_total", "direction" => "sent")
                .increment(sets.len() as u64);
            for frame in self.lease_frames(self.members.region_version(), false, &sets) {
                frames.push((addr.clone(), frame));
            }
        }
        frames
    }

    /// The lease sets of the slots each hand-off carries (by `carrier`, the hand-off index per
    /// slot), exported after the table switch like the buckets.
    pub(super) fn leases_to_hand_off(
        &self,
        carrier: &[Option<usize>],
        handoffs: usize,
        now_ns: u64,
    ) -> Vec<Vec<LeaseSetState>> {
        let mut moved = vec![Vec::new(); handoffs];
        let mut sets = Vec::new();
        self.leases.export(
            now_ns,
            &|key| carrier[usize::from(key.slot())].is_some(),
            &mut sets,
        );
        for set in sets {
            if let Some(i) = carrier[usize::from(set.key.slot())] {
                moved[i].push(set);
            }
        }
        moved
    }

    /// Merges a peer's lease sets (replicas or a hand-off), expiries clamped to at most the
    /// longest TTL from now: a peer's clock or bytes cannot pin a lease for longer than a day.
    pub(crate) fn merge_from_peer(&self, mut sets: Vec<LeaseSetState>, handoff: bool, now_ns: u64) {
        let latest = now_ns.saturating_add(floodgate::lease::MAX_LEASE_TTL_NS);
        for set in &mut sets {
            for lease in &mut set.leases {
                lease.expires_at_ns = lease.expires_at_ns.min(latest);
            }
        }
        let dropped = self.leases.merge(&sets, now_ns);
        self.received.send_modify(|n| *n += sets.len() as u64);
        let direction = if handoff { "handoff" } else { "replica" };
        metrics::counter!("floodgate_received_lease_sets_total", "kind" => direction)
            .increment(sets.len() as u64);
        if dropped > 0 {
            metrics::counter!("floodgate_lease_merge_dropped_total").increment(dropped as u64);
        }
    }

    /// Counts lease sets merged from peers (replicas and hand-offs); await a change instead of
    /// polling.
    pub(crate) fn watch_received(&self) -> watch::Receiver<u64> {
        self.received.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use floodgate::BucketKey;

    use super::*;

    const SEC: u64 = 1_000_000_000;

    #[tokio::test]
    async fn merged_expiries_are_clamped_to_a_day_from_now() {
        let key = BucketKey::for_key(b"k");
        let far = LeaseSetState {
            key,
            max: 1,
            leases: vec![floodgate::lease::Lease {
                id: 9,
                expires_at_ns: u64::MAX / 2,
            }],
            released: Vec::new(),
        };
        let cluster = crate::cluster::tests::cluster_alone();
        let replication = &cluster.lease_replication;
        replication.merge_from_peer(vec![far], false, SEC);
        let leases = &replication.leases;
        let day = floodgate::lease::MAX_LEASE_TTL_NS;
        assert_eq!(leases.in_use(key, SEC + day - 1), 1);
        assert_eq!(leases.in_use(key, SEC + day), 0);
    }
}

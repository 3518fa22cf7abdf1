//! Leases between nodes (kind 17): the lease sets changed since the last round go to each
//! slot's successor with the buckets' replication, and a hand-off sends the lease sets of the
//! slots it carries before their buckets, so a new owner has them when it starts deciding.

use floodgate::cluster::SlotTable;
use floodgate::lease::LeaseSetState;
use floodgate::wire::{LeaseSyncMessage, WireLeaseSet, encode_lease_sync, lease_set_wire_bytes};
use std::collections::HashMap;

use super::Cluster;

impl Cluster {
    /// Kind 17 frames carrying `sets`, each within the replication frame budget (at least one
    /// set per frame); none when there is nothing to send.
    pub(super) fn lease_frames(&self, handoff: bool, sets: &[LeaseSetState]) -> Vec<Vec<u8>> {
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
                from: self.me.id.clone(),
                handoff,
                sets: sets[start..end].iter().map(WireLeaseSet::from).collect(),
            };
            let mut frame = Vec::new();
            // In the layout every member reads: 128-bit ids once the cluster version has them.
            let left_out = encode_lease_sync(&mut frame, self.members.cluster_version(), &message);
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
    /// takeover), by peer address: part of [`Cluster::replication_frames`].
    pub(super) fn lease_replication_frames(
        &self,
        now_ns: u64,
        table: &SlotTable,
    ) -> Vec<(String, Vec<u8>)> {
        let mut changed = Vec::new();
        self.leases.take_changed(now_ns, &mut changed);
        if changed.is_empty() {
            return Vec::new();
        }
        let me = self.me.id.as_str();
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
            for frame in self.lease_frames(false, &sets) {
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
}

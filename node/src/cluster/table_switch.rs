//! The driver's table switches: a change of owners becomes a new slot table, switched under
//! the deciding gate through the ownership machine (`SlotOwnership::switch`); the hand-offs it
//! owes go out, the leases of their slots before the buckets.

use std::sync::Arc;

use floodgate::BucketState;
use floodgate::cluster::Membership;
use floodgate::cluster::ownership::{Action, HandOff};
use floodgate::lease::LeaseSetState;
use floodgate::protocol::Feature;

use super::Cluster;
use super::members::OwnersNow;
use super::slot_ownership::{Switched, compute_table, off_the_worker};

impl Cluster {
    /// Applies `change` to the membership; when the owners changed, switches to the new slot
    /// table and hands the buckets of every slot this node no longer owns to its new owner;
    /// releases to an owner heard from in a new life what it owns. Returns the hand-off sends
    /// (already running).
    pub(super) fn update_table(
        &self,
        now_ns: u64,
        change: impl FnOnce(&mut Membership),
    ) -> Vec<tokio::task::JoinHandle<bool>> {
        // Another update may be computing a big table: wait without holding up this worker's
        // other tasks.
        let _one_at_a_time = self
            .updating
            .try_lock()
            .unwrap_or_else(|| off_the_worker(true, || self.updating.lock()));
        let OwnersNow {
            epoch,
            owners,
            departed,
            first_of_region,
            region_version,
            restarted_owners,
        } = self.members.change(change, &self.regions);
        let old = self.slots.table();
        let mut sends = self.release_to_restarted(&restarted_owners, &old, now_ns);
        if old.epoch() == epoch {
            return sends;
        }
        if first_of_region && self.slots.ownership().is_joining() {
            let actions = self.slots.no_one_to_join(now_ns);
            drop(self.carry_out(actions, now_ns));
        }
        let new = Arc::new(compute_table(epoch, &owners));
        let join_base = self.slots.join_base(&owners, &new);
        let Switched {
            actions,
            gained,
            waiting,
        } = self
            .slots
            .switch(now_ns, new, join_base, &departed, region_version);
        self.metrics.table_epoch.set(epoch as f64);
        self.members.publish_members();
        tracing::info!(epoch, owners = ?owners, gained, waiting, "slot table changed");
        sends.extend(self.carry_out(actions, now_ns));
        sends
    }

    /// Owners of this node's table heard from in a new life that was already joined: their
    /// new lives wait for this node's release of their slots, which no switch here sends (the
    /// table never lost them; see `Ownership::handle_restarted`). An owner new to the table is
    /// released by the switch that takes it in.
    fn release_to_restarted(
        &self,
        restarted: &[String],
        table: &floodgate::cluster::SlotTable,
        now_ns: u64,
    ) -> Vec<tokio::task::JoinHandle<bool>> {
        let mut sends = Vec::new();
        for member in restarted.iter().filter(|m| table.contains(m)) {
            tracing::info!(%member, "an owner restarted unseen: releasing its slots to its new life");
            let actions = self.slots.release_to_restarted(member);
            sends.extend(self.carry_out(actions, now_ns));
        }
        sends
    }

    /// Carries out the machine's actions: wakes checks waiting for the join, exports (once)
    /// and sends the hand-offs. Returns the sends (already running).
    pub(super) fn carry_out(
        &self,
        actions: Vec<Action>,
        now_ns: u64,
    ) -> Vec<tokio::task::JoinHandle<bool>> {
        let mut handoffs = Vec::new();
        for action in actions {
            match action {
                Action::Joined => self.slots.mark_joined(),
                Action::HandOff(handoff) => handoffs.push(handoff),
            }
        }
        if handoffs.is_empty() {
            return Vec::new();
        }
        self.hand_off(&handoffs, now_ns)
    }

    /// Sends the hand-offs the machine queued: the buckets of their slots, exported once (after
    /// the switch), each slot's to its owner in the table in force (a joined node's
    /// announcements list every slot to every member).
    pub(super) fn hand_off(
        &self,
        handoffs: &[HandOff],
        now_ns: u64,
    ) -> Vec<tokio::task::JoinHandle<bool>> {
        // Which hand-off carries each slot's buckets: the one to its owner.
        let table = self.slots.table();
        let mut carrier = vec![None; floodgate::cluster::SLOTS];
        for (i, handoff) in handoffs.iter().enumerate() {
            for &slot in &handoff.slots {
                if table.owner(slot) == Some(handoff.to.as_str())
                    && let Some(c) = carrier.get_mut(usize::from(slot))
                {
                    *c = Some(i);
                }
            }
        }
        let moved = self
            .replication
            .buckets_to_hand_off(&carrier, handoffs.len(), now_ns);
        let leases = self
            .lease_replication
            .leases_to_hand_off(&carrier, handoffs.len(), now_ns);
        let units = self.unconfirmed_frames(&carrier, handoffs.len());
        // Every node that gains slots from us hears from us, even with no buckets: it holds
        // checks on those slots until then.
        let mut sends = Vec::new();
        for (((handoff, buckets), lease_sets), unit_frames) in
            handoffs.iter().zip(moved).zip(leases).zip(units)
        {
            self.metrics.handed_off.increment(buckets.len() as u64);
            tracing::info!(
                to = %handoff.to,
                slots = handoff.slots.len(),
                buckets = buckets.len(),
                "handing off"
            );
            let Some(addr) = self.members.addr_of(&handoff.to) else {
                continue;
            };
            if !lease_sets.is_empty() {
                metrics::counter!("floodgate_handoff_lease_sets_total", "direction" => "sent")
                    .increment(lease_sets.len() as u64);
            }
            let pending = PendingHandOff {
                units: unit_frames,
                lease_sets,
                carried: (handoff.id, handoff.slots.clone()),
                buckets,
            };
            let senders = HandOffSenders {
                peers: self.peers.clone(),
                replication: self.replication.clone(),
                leases: self.lease_replication.clone(),
            };
            sends.push(tokio::spawn(send_in_order(senders, addr, pending)));
        }
        sends
    }
}

/// One hand-off to send: its region units (kind 25 requests) and lease sets, which go first,
/// then its id and slots with their buckets.
struct PendingHandOff {
    units: Vec<Vec<u8>>,
    lease_sets: Vec<LeaseSetState>,
    carried: (u64, Vec<u16>),
    buckets: Vec<BucketState>,
}

/// What a hand-off's task writes and sends its frames with.
struct HandOffSenders {
    peers: Arc<super::Peers>,
    replication: Arc<super::Replication>,
    leases: Arc<super::LeaseReplication>,
}

/// Sends one hand-off to `addr`: the region units answered and the leases delivered first
/// (the bucket hand-off is what lets the new owner decide the slots, and it must find them
/// there), then the buckets. True when every bucket frame was delivered.
///
/// The units, and the layouts of the lease sets and the buckets, follow the version the link
/// to the new owner agreed on: what it reads, where gossip may not have said yet (a restart
/// heard of first through an older build's relay has no versions, and would count as version
/// 2 for a while: its lease sets would lose their 128-bit ids). None is passed on as sent: a
/// member handing the buckets on writes them again for its own link, and sends its own units.
/// Without a link yet, what gossip says of the region (the units and the frames are tried
/// again, and may reach the owner then).
async fn send_in_order(senders: HandOffSenders, addr: String, pending: PendingHandOff) -> bool {
    let HandOffSenders {
        peers,
        replication,
        leases,
    } = senders;
    let link = peers.agreed_version(&addr).await;
    let version = link.unwrap_or_else(|| replication.region_version());
    if !pending.units.is_empty() {
        if !Feature::UnconfirmedHandoff.readable_at(version) {
            tracing::debug!(
                peer = %addr,
                version,
                "the new owner does not read a hand-off's region units"
            );
        } else if !super::unconfirmed_handoff::deliver_unconfirmed(&peers, &addr, pending.units)
            .await
        {
            metrics::counter!("floodgate_handoff_unconfirmed_undelivered_total").increment(1);
        }
    }
    // All at once, each within the peer timeout, and all done before the buckets go: one
    // after another, an unreachable owner held the buckets back a timeout per frame.
    let lease_sends: Vec<_> = leases
        .lease_frames(version, true, &pending.lease_sets)
        .into_iter()
        .map(|frame| peers.send(addr.clone(), frame))
        .collect();
    for send in lease_sends {
        let _ = send.await;
    }
    let frames = replication.bucket_frames(version, Some(pending.carried), &pending.buckets);
    let sent: Vec<_> = frames
        .into_iter()
        .map(|frame| peers.send_handoff(addr.clone(), frame))
        .collect();
    let mut delivered = true;
    for send in sent {
        delivered &= matches!(send.await, Ok(true));
    }
    delivered
}

//! Table switches: a change of owners becomes a new slot table, switched under the deciding
//! gate through the ownership machine; the hand-offs it owes go out, and checks on gained slots
//! wait for theirs.

use std::sync::Arc;

use floodgate::BucketState;
use floodgate::Clock;
use floodgate::cluster::ownership::{Action, Arrival, HandOff, Ownership, Placement, ReceivedPart};
use floodgate::cluster::{Membership, SlotTable};
use floodgate::wire::HandoffPart;

use super::members::OwnersNow;
use super::{Cluster, OLD_CALLER_HANDOFF_WAIT};

/// From this many owners a table takes milliseconds to compute (about 3 ms for 100, 25 ms for
/// 1,000, measured by the `slots` benchmark).
pub(super) const BIG_TABLE: usize = 64;

/// Computes a slot table. A big one is computed with the runtime told that this worker blocks,
/// so the worker's other tasks move to another thread meanwhile (a current-thread runtime, as
/// in some tests, has nowhere to move them and computes inline).
pub(super) fn compute_table(epoch: u64, owners: &[String]) -> SlotTable {
    off_the_worker(owners.len() >= BIG_TABLE, || {
        SlotTable::compute(epoch, owners)
    })
}

/// Runs `work`, when `blocks`, with the runtime told this worker blocks (on a multi-thread
/// runtime; elsewhere inline).
pub(super) fn off_the_worker<T>(blocks: bool, work: impl FnOnce() -> T) -> T {
    let multi_thread = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if blocks && multi_thread {
        tokio::task::block_in_place(work)
    } else {
        work()
    }
}

impl Cluster {
    /// Applies `change` to the membership; when the owners changed, switches to the new slot
    /// table and hands the buckets of every slot this node no longer owns to its new owner.
    /// Returns the hand-off sends (already running).
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
            cluster_version,
        } = self.members.change(change, &self.regions);
        let old = self.table();
        if old.epoch() == epoch {
            return Vec::new();
        }
        if first_of_region && self.ownership.lock().is_joining() {
            let actions: Vec<Action> = {
                let mut ownership = self.ownership.lock();
                ownership.handle_no_one_to_join(now_ns);
                std::iter::from_fn(|| ownership.poll_action()).collect()
            };
            drop(self.carry_out(actions, now_ns));
        }
        let new = Arc::new(compute_table(epoch, &owners));
        // A join's base table is computed before decisions stop, as the new table is (the
        // phase cannot change meanwhile: this is the one update running).
        let joining = self.ownership.lock().is_joining();
        let join_base = (joining && owners.len() > 1).then(|| {
            off_the_worker(owners.len() >= BIG_TABLE, || {
                Arc::new(Ownership::table_without(&self.me.id, &new))
            })
        });
        let (actions, gained, waiting) = {
            // Once the gate is ours, no decision under the old table is in flight: the
            // hand-offs exported below hold them all.
            let _no_decisions = self.deciding.write();
            let mut ownership = self.ownership.lock();
            // Whether this switch sends releases to newcomers, and a join waits for every
            // member's, follows what every member speaks.
            ownership.handle_cluster_version(cluster_version);
            let old = ownership.handle_table_with(now_ns, new.clone(), join_base, |id| {
                departed.iter().any(|d| d == id)
            });
            // What this switch gave this node, and how much of it waits for a hand-off: an
            // operator (and a chaos run) reads from the log whether a slot was decided blind.
            let me = Some(self.me.id.as_str());
            let gained: Vec<u16> = (0..floodgate::cluster::SLOTS as u16)
                .filter(|&s| new.owner(s) == me && old.owner(s) != me)
                .collect();
            let waiting = gained
                .iter()
                .filter(|&&s| ownership.awaits_handoff(std::iter::once(s), now_ns))
                .count();
            self.table.send_replace(new);
            let actions = std::iter::from_fn(|| ownership.poll_action()).collect::<Vec<_>>();
            (actions, gained.len(), waiting)
        };
        self.metrics.table_epoch.set(epoch as f64);
        self.members.publish_members();
        tracing::info!(epoch, owners = ?owners, gained, waiting, "slot table changed");
        self.carry_out(actions, now_ns)
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
                Action::Joined => {
                    // Only now: a check that sees the node joined must also see its real table.
                    self.joining
                        .store(false, std::sync::atomic::Ordering::Relaxed);
                    self.joined.notify_waiters();
                }
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
        let table = self.table();
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
        let mut buckets = Vec::new();
        if carrier.iter().any(Option::is_some) {
            self.store.export(
                now_ns,
                &|key| carrier[usize::from(key.slot())].is_some(),
                &mut buckets,
            );
        }
        let mut moved: Vec<Vec<BucketState>> = vec![Vec::new(); handoffs.len()];
        for bucket in buckets {
            if let Some(i) = carrier[usize::from(bucket.key.slot())] {
                moved[i].push(bucket);
            }
        }
        let leases = self.leases_to_hand_off(&carrier, handoffs.len(), now_ns);
        // Every node that gains slots from us hears from us, even with no buckets: it holds
        // checks on those slots until then.
        let mut sends = Vec::new();
        for ((handoff, buckets), lease_sets) in handoffs.iter().zip(moved).zip(leases) {
            self.metrics.handed_off.increment(buckets.len() as u64);
            tracing::info!(
                to = %handoff.to,
                slots = handoff.slots.len(),
                buckets = buckets.len(),
                "handing off"
            );
            let carried = Some((handoff.id, handoff.slots.clone()));
            if lease_sets.is_empty() {
                sends.extend(self.send_buckets(&handoff.to, carried, &buckets));
                continue;
            }
            let Some(addr) = self.members.addr_of(&handoff.to) else {
                continue;
            };
            metrics::counter!("floodgate_handoff_lease_sets_total", "direction" => "sent")
                .increment(lease_sets.len() as u64);
            // The leases first, delivered before the buckets go: the bucket hand-off is what
            // lets the new owner decide the slots, and it must find their leases there.
            let lease_frames = self.lease_frames(true, &lease_sets);
            let bucket_frames = self.bucket_frames(carried, &buckets);
            let peers = self.peers.clone();
            sends.push(tokio::spawn(async move {
                for frame in lease_frames {
                    let _ = peers.send(addr.clone(), frame).await;
                }
                let sent: Vec<_> = bucket_frames
                    .into_iter()
                    .map(|frame| peers.send_handoff(addr.clone(), frame))
                    .collect();
                let mut delivered = true;
                for send in sent {
                    delivered &= matches!(send.await, Ok(true));
                }
                delivered
            }));
        }
        sends
    }

    /// Waits until none of `slots` awaits a hand-off, or until `give_up_ns` (on the node's
    /// clock) if that comes first. A wait that reaches the machine's own deadline ends in the
    /// machine too; one cut short by `give_up_ns` leaves it to the next gossip round.
    pub(crate) async fn wait_for_handoffs(
        &self,
        slots: impl Iterator<Item = u16> + Clone,
        give_up_ns: u64,
    ) {
        loop {
            // Created before the look, so a hand-off arriving in between still wakes it.
            let notified = self.handoff_arrived.notified();
            let now_ns = self.clock.now_ns();
            let latest = self
                .ownership
                .lock()
                .handoff_deadline(slots.clone(), now_ns);
            let Some(until) = latest else { return };
            let stop = until.min(give_up_ns);
            if stop <= now_ns {
                return;
            }
            let left = std::time::Duration::from_nanos(stop - now_ns);
            if tokio::time::timeout(left, notified).await.is_err() {
                if stop == until {
                    self.ownership.lock().handle_timeout(until);
                }
                return;
            }
        }
    }

    /// Takes the deciding gate ([`Cluster::deciding`]) once none of `slots` this node just
    /// gained awaits its hand-off, waiting for them (at most [`OLD_CALLER_HANDOFF_WAIT`] from
    /// `read_ns`, when the request was read) outside the gate, at most three times, as the
    /// table may switch between a wait and the gate. Looked at under the gate first, so the
    /// usual frame, with nothing awaited, takes the ownership lock once here. For callers that
    /// cannot be told `try_again` (older clients, Envoy, leases): a slot still waiting after
    /// that is refused by the machine's placement. Every request that decides on this node's
    /// state (checks and leases) enters the gate, so a table switch's hand-off carries what
    /// they decided.
    pub(crate) async fn enter_deciding(
        &self,
        slots: impl Iterator<Item = u16> + Clone,
        read_ns: u64,
    ) -> parking_lot::RwLockReadGuard<'_, ()> {
        let give_up_ns = read_ns.saturating_add(OLD_CALLER_HANDOFF_WAIT.as_nanos() as u64);
        let mut waits = 0;
        loop {
            let deciding = self.deciding();
            if waits == 3 || !self.awaits_handoff(slots.clone(), self.clock.now_ns()) {
                return deciding;
            }
            drop(deciding);
            self.wait_for_handoffs(slots.clone(), give_up_ns).await;
            waits += 1;
        }
    }

    /// Places each `(slot, arrival)` by the table in force at `now_ns`, with that table's
    /// version. Call it under the deciding gate ([`Cluster::deciding`]), so the table is the
    /// one decisions are made by.
    pub(crate) fn place_each(
        &self,
        arrivals: impl Iterator<Item = (u16, Arrival)> + Clone,
        now_ns: u64,
    ) -> (Vec<Placement>, u64) {
        let mut placements = Vec::new();
        let version = self.place_each_into(arrivals, now_ns, &mut placements);
        (placements, version)
    }

    /// [`Cluster::place_each`] into `placements` (cleared first, its room reused).
    pub(crate) fn place_each_into(
        &self,
        arrivals: impl Iterator<Item = (u16, Arrival)> + Clone,
        now_ns: u64,
        placements: &mut Vec<Placement>,
    ) -> u64 {
        // Only a takeover asks; read before the ownership lock (the membership lock is never
        // taken inside it).
        let suspected = if arrivals.clone().any(|(_, a)| a == Arrival::Takeover) {
            self.members.suspected_members()
        } else {
            Vec::new()
        };
        let ownership = self.ownership();
        placements.clear();
        placements.extend(arrivals.map(|(slot, arrival)| {
            ownership.place(slot, arrival, now_ns, |id| {
                suspected.iter().any(|s| s == id)
            })
        }));
        ownership.table().version()
    }

    /// True when one of `slots` still waits for a hand-off at `now_ns`.
    pub(crate) fn awaits_handoff(&self, slots: impl Iterator<Item = u16>, now_ns: u64) -> bool {
        self.ownership.lock().awaits_handoff(slots, now_ns)
    }

    /// A part of a hand-off from `from` arrived (its buckets already merged).
    pub(crate) fn handoff_received(&self, from: &str, part: &HandoffPart, now_ns: u64) {
        let part = ReceivedPart {
            id: part.id,
            part: part.part,
            parts: part.parts,
            slots: &part.slots,
        };
        if self.ownership.lock().handle_handoff(now_ns, from, part) {
            self.handoff_arrived.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owners(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("node-{i}")).collect()
    }

    /// A big table is computed off the worker on a multi-thread runtime, inline on a
    /// current-thread one (where `block_in_place` would panic), the same either way.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_big_table_computed_off_the_worker_is_the_same() {
        let owners = owners(BIG_TABLE);
        assert_eq!(compute_table(3, &owners), SlotTable::compute(3, &owners));
    }

    #[tokio::test]
    async fn a_big_table_on_a_current_thread_runtime_is_computed_without_panicking() {
        let owners = owners(BIG_TABLE);
        assert_eq!(compute_table(3, &owners), SlotTable::compute(3, &owners));
    }
}

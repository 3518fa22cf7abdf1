//! [`SlotOwnership`]: who decides which slot while slots move. The core's sans-I/O `Ownership`
//! machine behind its lock, the table in force (published), the deciding gate a table switch
//! takes, the join, the waits for gained slots' hand-offs, and where a received region delta
//! goes inside this region (the table in force decides, see `floodgate::region::Route`). Big
//! slot tables are computed with the runtime told the worker blocks.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use floodgate::BucketKey;
use floodgate::cluster::SlotTable;
use floodgate::cluster::ownership::{
    Action, Arrival, Ownership, OwnershipConfig, Placement, ReceivedPart,
};
use floodgate::protocol::Feature;
use floodgate::region::{Peer, RegionName, Route};
use floodgate::wire::HandoffPart;
use floodgate::{Clock, EpochClock};
use parking_lot::{Mutex, MutexGuard, RwLock, RwLockReadGuard};
use tokio::sync::{Notify, watch};

use super::{JOIN_WAIT, Members, OLD_CALLER_HANDOFF_WAIT};

/// From this many owners a table takes milliseconds to compute (about 3 ms for 100, 25 ms for
/// 1,000, measured by the `slots` benchmark).
const BIG_TABLE: usize = 64;

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

/// Who decides which slot, and when a slot may be decided here.
#[derive(Debug)]
pub(crate) struct SlotOwnership {
    /// This node's id.
    me: String,
    /// Asked who is suspected when a takeover is placed.
    members: Arc<Members>,
    clock: EpochClock,
    /// Who decides which slot while slots move: the table in force and the ones before it,
    /// the slots given away, gained slots waiting for their hand-off, the join phase. The core's
    /// sans-I/O machine; this driver feeds it and carries out its actions.
    ownership: Mutex<Ownership>,
    /// The machine's table, published: a watch so tests and tools can await changes instead of
    /// polling, and checks read it without the machine's lock.
    table: watch::Sender<Arc<SlotTable>>,
    /// Rung when a hand-off completes: checks waiting on gained slots look again.
    handoff_arrived: Notify,
    /// The machine's join phase, mirrored for the per-check look (set false only after the real
    /// table is published, so a check that sees the node joined also sees that table).
    joining: AtomicBool,
    /// Rung when a joining node has its first real table.
    joined: Notify,
    /// Held shared while a batch reads the table and decides its groups, exclusively while the
    /// table is switched: once a switch returns, no decision made under the old table is still
    /// in flight, so the hand-off exported after it holds every decision made here.
    deciding: RwLock<()>,
}

/// What a table switch did: the machine's actions to carry out, how many slots it gave this
/// node, and how many of those wait for a hand-off.
#[derive(Debug)]
pub(super) struct Switched {
    pub(super) actions: Vec<Action>,
    pub(super) gained: usize,
    pub(super) waiting: usize,
}

impl SlotOwnership {
    /// Starts with `table` (this node alone); `has_other_seeds`: it joins a cluster first.
    pub(super) fn new(
        me: String,
        members: Arc<Members>,
        clock: EpochClock,
        table: Arc<SlotTable>,
        has_other_seeds: bool,
        now_ns: u64,
    ) -> Self {
        // Hand-off ids start from the start time, so a restart does not reuse its last life's.
        let ownership = Ownership::new(
            me.clone(),
            table.clone(),
            has_other_seeds,
            now_ns,
            OwnershipConfig::default(),
        );
        SlotOwnership {
            me,
            members,
            clock,
            ownership: Mutex::new(ownership),
            table: watch::Sender::new(table),
            handoff_arrived: Notify::new(),
            joining: AtomicBool::new(has_other_seeds),
            joined: Notify::new(),
            deciding: RwLock::new(()),
        }
    }

    pub(crate) fn table(&self) -> Arc<SlotTable> {
        self.table.borrow().clone()
    }

    pub(crate) fn watch_table(&self) -> watch::Receiver<Arc<SlotTable>> {
        self.table.subscribe()
    }

    /// Waits until `done` holds for this node's table, or `limit` passes.
    pub(crate) async fn wait_for_table(&self, limit: Duration, done: impl Fn(&SlotTable) -> bool) {
        let mut tables = self.watch_table();
        let _ = tokio::time::timeout(limit, async {
            while !done(&tables.borrow_and_update()) {
                if tables.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
    }

    /// True when `version` is that of a table this node had before its current one.
    pub(crate) fn had_version(&self, version: u64) -> bool {
        self.ownership.lock().had_version(version)
    }

    /// Held while deciding: the table read under it stays this node's table until it is
    /// dropped. Never held across an await.
    pub(crate) fn deciding(&self) -> RwLockReadGuard<'_, ()> {
        self.deciding.read()
    }

    /// The ownership machine, to place checks (under [`SlotOwnership::deciding`], so its table
    /// is the one decisions are made under). Never held across an await.
    pub(crate) fn ownership(&self) -> MutexGuard<'_, Ownership> {
        self.ownership.lock()
    }

    /// Takes the deciding gate ([`SlotOwnership::deciding`]) once none of `slots` this node
    /// just gained awaits its hand-off, waiting for them (at most [`OLD_CALLER_HANDOFF_WAIT`]
    /// from `read_ns`, when the request was read) outside the gate, at most three times, as the
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
    ) -> RwLockReadGuard<'_, ()> {
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
    /// version. Call it under the deciding gate ([`SlotOwnership::deciding`]), so the table is
    /// the one decisions are made by.
    pub(crate) fn place_each(
        &self,
        arrivals: impl Iterator<Item = (u16, Arrival)> + Clone,
        now_ns: u64,
    ) -> (Vec<Placement>, u64) {
        let mut placements = Vec::new();
        let version = self.place_each_into(arrivals, now_ns, &mut placements);
        (placements, version)
    }

    /// [`SlotOwnership::place_each`] into `placements` (cleared first, its room reused).
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
            let left = Duration::from_nanos(stop - now_ns);
            if tokio::time::timeout(left, notified).await.is_err() {
                if stop == until {
                    self.ownership.lock().handle_timeout(until);
                }
                return;
            }
        }
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

    /// True while a node started with seeds has not heard from the cluster (its table of one
    /// is not real ownership).
    pub(crate) fn is_joining(&self) -> bool {
        self.joining.load(Ordering::Relaxed)
    }

    /// While a node started with seeds has not heard from the cluster, its table of one is not
    /// real ownership: checks wait (bounded) until it has joined, or decide alone after that.
    pub(crate) async fn wait_until_joined(&self) {
        if !self.is_joining() {
            return;
        }
        let _ = tokio::time::timeout(JOIN_WAIT, self.joined()).await;
        if self.is_joining() {
            self.ownership.lock().handle_join_wait_expired();
        }
    }

    /// Resolves once this node has its first real table (at once for a node without seeds).
    pub(crate) async fn joined(&self) {
        loop {
            // Registered before the look, so a join in between still wakes it.
            let joined = self.joined.notified();
            tokio::pin!(joined);
            joined.as_mut().enable();
            if !self.is_joining() {
                return;
            }
            joined.await;
        }
    }

    /// The machine's join is over: wakes the checks waiting for it. Only once the real table
    /// is published: a check that sees the node joined must also see that table.
    pub(super) fn mark_joined(&self) {
        self.joining.store(false, Ordering::Relaxed);
        self.joined.notify_waiters();
    }

    /// Nobody to join (every seed is this node, or it is the first of its region): the
    /// machine's actions that follow.
    pub(super) fn no_one_to_join(&self, now_ns: u64) -> Vec<Action> {
        let mut ownership = self.ownership.lock();
        ownership.handle_no_one_to_join(now_ns);
        std::iter::from_fn(|| ownership.poll_action()).collect()
    }

    /// Waits for members newly `suspected` shorten (those alive again lengthen); waits that ran
    /// out by `now_ns` end in the machine too (checks already look lazily).
    pub(super) fn follow_suspicion(&self, suspected: Vec<String>, now_ns: u64) {
        let mut ownership = self.ownership.lock();
        ownership.handle_suspicion(suspected);
        if ownership.poll_timeout().is_some_and(|at| at <= now_ns) {
            ownership.handle_timeout(now_ns);
        }
    }

    /// A join's base table for `new` (computed from `owners`): the cluster as it was without
    /// this node. Computed before decisions stop, as the new table is (the phase cannot change
    /// meanwhile: the caller runs the one table update).
    pub(super) fn join_base(&self, owners: &[String], new: &SlotTable) -> Option<Arc<SlotTable>> {
        let joining = self.ownership.lock().is_joining();
        (joining && owners.len() > 1).then(|| {
            off_the_worker(owners.len() >= BIG_TABLE, || {
                Arc::new(Ownership::table_without(&self.me, new))
            })
        })
    }

    /// Switches to `new` under the deciding gate, once no decision under the old table is in
    /// flight (the hand-offs exported after it hold them all); `departed` are the members that
    /// announced their leave, `region_version` what every member of this region speaks.
    pub(super) fn switch(
        &self,
        now_ns: u64,
        new: Arc<SlotTable>,
        join_base: Option<Arc<SlotTable>>,
        departed: &[String],
        region_version: u8,
    ) -> Switched {
        let _no_decisions = self.deciding.write();
        let mut ownership = self.ownership.lock();
        // Whether this switch sends releases to newcomers, and a join waits for every member's,
        // follows what every member of this region's table speaks: members of other regions
        // never send or receive them, so an older build there holds nothing back here.
        ownership.handle_region_version(region_version);
        let old = ownership.handle_table_with(now_ns, new.clone(), join_base, |id| {
            departed.iter().any(|d| d == id)
        });
        // What this switch gave this node, and how much of it waits for a hand-off: an
        // operator (and a chaos run) reads from the log whether a slot was decided blind.
        let me = Some(self.me.as_str());
        let gained: Vec<u16> = (0..floodgate::cluster::SLOTS as u16)
            .filter(|&s| new.owner(s) == me && old.owner(s) != me)
            .collect();
        let waiting = gained
            .iter()
            .filter(|&&s| ownership.awaits_handoff(std::iter::once(s), now_ns))
            .count();
        self.table.send_replace(new);
        let actions = std::iter::from_fn(|| ownership.poll_action()).collect::<Vec<_>>();
        Switched {
            actions,
            gained: gained.len(),
            waiting,
        }
    }

    /// The release an owner's new life waits for (`Ownership::handle_restarted`), queued under
    /// the deciding gate: the buckets exported after hold every decision made here on its
    /// slots before (takeovers while it was silent).
    pub(super) fn release_to_restarted(&self, member: &str) -> Vec<Action> {
        let _no_decisions = self.deciding.write();
        let mut ownership = self.ownership.lock();
        ownership.handle_restarted(member);
        std::iter::from_fn(|| ownership.poll_action()).collect()
    }

    /// A router for received region deltas, by the table in force at `now_ns` (their sender
    /// addressed them by its view of this region's ring, which lags an ownership move here):
    /// call it, and apply what it says, under the deciding gate ([`SlotOwnership::deciding`]),
    /// so the table cannot switch (and a hand-off leave) between the route and the units
    /// landing. Units of a key another member decides are passed on only once every member of
    /// this region takes them (an older build refuses deltas from its own region); until then
    /// they land here, as before.
    pub(crate) fn delta_router(
        &self,
        region: RegionName,
        now_ns: u64,
    ) -> impl Fn(BucketKey) -> Route + '_ {
        let pass_on = Feature::RegionPassOn.readable_at(self.members.region_version());
        move |key: BucketKey| {
            let slot = key.slot();
            let ownership = self.ownership();
            match ownership.table().owner(slot) {
                Some(owner) if owner == self.me => {
                    if ownership.awaits_handoff(std::iter::once(slot), now_ns) {
                        Route::Hold
                    } else {
                        Route::Here
                    }
                }
                Some(owner) if pass_on => Route::PassOn(Peer::new(region.clone(), owner)),
                _ => Route::Here,
            }
        }
    }

    /// Whether `peer`, a node of this region, still owns slots in the table in force (deltas
    /// passed on to one that does not are routed again).
    pub(crate) fn owns_slots(&self, peer: &Peer) -> bool {
        self.table().nodes().iter().any(|n| **n == *peer.node)
    }

    /// Publishes `table` without the machine, for tests of what reads the published table.
    #[cfg(test)]
    pub(super) fn publish(&self, table: Arc<SlotTable>) {
        self.table.send_replace(table);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::tests::{cluster_alone, joined_by_b};

    /// Once b has joined, a routes a delta for a key of b's to b and keeps one of its own;
    /// a member that owns nothing is no destination any more.
    #[tokio::test]
    async fn received_deltas_go_to_the_member_whose_table_decides_their_key() {
        let a = cluster_alone();
        let now = a.clock.now_ns();
        drop(joined_by_b(&a, now));
        assert_eq!(a.members.cluster_version(), floodgate::protocol::NEWEST);
        let table = a.slots.table();
        let key_of = |owner: &str| {
            (0..100_000u32)
                .map(|i| BucketKey::for_key(format!("tenant:{i}").as_bytes()))
                .find(|k| table.owner(k.slot()) == Some(owner))
                .expect("a key of that owner")
        };
        let region = RegionName::new("local").unwrap();
        let route = a.slots.delta_router(region.clone(), now);
        let b = Peer::new(region.clone(), "node-b");
        assert_eq!(route(key_of("node-b")), Route::PassOn(b.clone()));
        assert_eq!(route(key_of("node-a")), Route::Here);
        assert!(a.slots.owns_slots(&b));
        assert!(!a.slots.owns_slots(&Peer::new(region, "node-c")));
    }

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

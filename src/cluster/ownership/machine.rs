//! The ownership state machine of one node: the table in force and the versions before it,
//! the slots given away, the gained slots waiting for a hand-off, and the join phase.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use super::handoffs::{Handoffs, ReceivedPart};
use super::placement::{Arrival, Failed, Placement, Refusal, first_place, next_place};
use crate::cluster::{SLOTS, SlotTable};
use crate::protocol::Feature;

/// Timings and bounds of the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnershipConfig {
    /// Longest a gained slot waits for its previous owner's hand-off once the failure
    /// detector holds that owner suspect (it may be gone, with its hand-off).
    pub handoff_wait_ns: u64,
    /// Longest it waits while that owner is held alive: it is slow or has not switched
    /// tables yet, and may still decide the slot, so deciding beside it would make a second
    /// decider. Callers hear `try_again` meanwhile; the wait is bounded so a hand-off lost
    /// between two live nodes costs seconds of that slot, not the slot.
    pub handoff_wait_alive_ns: u64,
    /// How many earlier table versions are remembered (to tell a sender that is behind).
    pub past_versions: usize,
}

impl Default for OwnershipConfig {
    fn default() -> Self {
        OwnershipConfig {
            handoff_wait_ns: 500_000_000,
            handoff_wait_alive_ns: 5_000_000_000,
            past_versions: 32,
        }
    }
}

/// Something the driver must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send a hand-off: the buckets of `slots` (exported now, after the switch) or none.
    HandOff(HandOff),
    /// The node has its first real table: checks waiting for the join go on.
    Joined,
}

/// One hand-off to send (split into parts by the driver, each part listing every slot). It
/// carries this node's buckets of the slots its recipient owns in the table in force: every
/// slot of a hand-off after a switch, and, in a just-joined node's announcement (which lists
/// every slot it does not own, to every member), what it received while joining.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandOff {
    pub to: String,
    /// This node's id for the hand-off (fresh for every hand-off of this life).
    pub id: u64,
    pub slots: Vec<u16>,
}

/// Where the node stands in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Started with seeds and not heard from the cluster: its table of one is not ownership,
    /// and checks wait (bounded) for the join.
    Joining,
    /// Gave up waiting for the join and decides alone with its table of one.
    Alone,
    /// In the cluster.
    Member,
    /// Not in its own table (left gracefully, or the last one left): decides nothing.
    Left,
}

/// Why a node decides a slot whose previous owner's state it does not have: the windows in
/// which two nodes may decide one slot (see the module's documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Window {
    /// A joining node gave up waiting for the cluster and decides with its table of one.
    Alone,
    /// The slot's waits for the hand-offs of `from` (its previous owner; at a join, members
    /// that had not sent theirs) expired before the hand-offs arrived. Sorted.
    WaitExpired { from: Vec<String> },
    /// The slot was gained from `from`, which this node's membership holds dead (not departed):
    /// no hand-off comes; the successor decides from its replicas.
    OwnerDeclaredDead { from: String },
    /// The slot was gained at this node's join from `from`, its owner in the cluster as this
    /// node first heard of it (a guess: the others' tables may differ). A member whose table
    /// disagrees may still decide the slot until it hears of this node and hands it over;
    /// marked while this node keeps the slot.
    JoinedGuessing { from: String },
    /// Never marked by the machine: the driver decided a check for `owner` (a takeover, or a
    /// forward `owner` did not answer in time) while this node's failure detector held `owner`
    /// suspect or dead. Named here so checkers of the driver's decisions can excuse that pair.
    OwnerSuspected { owner: String },
}

/// The ownership state of one node. Sans I/O: every input carries `now_ns`, every output is
/// an [`Action`] polled by the driver.
#[derive(Debug, Clone)]
pub struct Ownership {
    me: String,
    config: OwnershipConfig,
    table: Arc<SlotTable>,
    /// Versions of the tables before the current one (the latest few).
    past_versions: VecDeque<u64>,
    /// Slots handed to another owner and not owned again since: their state is with the new
    /// owner, so this node never decides them (a forwarder with an older table is told
    /// `not_owner`).
    given_away: Vec<bool>,
    /// Slots this node let go of while no member could take them (its table emptied as it
    /// left, knowing nobody): their buckets are still here, and go to the first owner a later
    /// table names.
    orphaned: BTreeSet<u16>,
    handoffs: Handoffs,
    /// Owned slots decided without their previous owner's state, and why.
    unconfirmed: BTreeMap<u16, Window>,
    joining: bool,
    decided_alone: bool,
    /// Every member speaks releases ([`Ownership::handle_region_version`]): a member tells
    /// each newcomer in its table which slots it does not decide, and a newcomer decides a
    /// gained slot only once every member has.
    releases: bool,
    /// Members of this node's table that have not taken it in yet, as far as it knows (no
    /// release or hand-off from them since it joined): they may still decide slots their own
    /// table gives them, so every slot this node gains waits for them too.
    unreleased: BTreeSet<String>,
    /// When this node joined (or founded its cluster): for a while after, members may not
    /// know it yet, so a member that appears in its table may have decided slots this node's
    /// table gives it, and this node waits for that member's release of them.
    joined_at_ns: Option<u64>,
    next_handoff_id: u64,
    actions: VecDeque<Action>,
    /// Counts every change of what this machine would decide (for checkers).
    changes: u64,
    /// Members the failure detector holds suspect or dead, as the driver last said: a wait
    /// for one of them is the shorter one.
    suspected: BTreeSet<String>,
}

impl Ownership {
    /// A node's machine with its first table (of one: itself). `joining`: it was started with
    /// seeds to hear from. `first_handoff_id` must not repeat an id of an earlier life (the
    /// node uses its start time).
    pub fn new(
        me: String,
        table: Arc<SlotTable>,
        joining: bool,
        first_handoff_id: u64,
        config: OwnershipConfig,
    ) -> Self {
        Ownership {
            me,
            config,
            table,
            past_versions: VecDeque::new(),
            given_away: vec![false; SLOTS],
            orphaned: BTreeSet::new(),
            handoffs: Handoffs::default(),
            unconfirmed: BTreeMap::new(),
            joining,
            decided_alone: false,
            releases: false,
            unreleased: BTreeSet::new(),
            joined_at_ns: None,
            next_handoff_id: first_handoff_id,
            actions: VecDeque::new(),
            changes: 0,
            suspected: BTreeSet::new(),
        }
    }

    /// The failure detector's verdicts changed: `suspected` are the members it holds suspect
    /// or dead. Waits for their hand-offs shorten to `handoff_wait_ns` from their start;
    /// waits for members alive again lengthen to `handoff_wait_alive_ns`. Call
    /// [`Ownership::handle_timeout`] after, for waits that ran out by this.
    pub fn handle_suspicion(&mut self, suspected: impl IntoIterator<Item = String>) {
        let suspected: BTreeSet<String> = suspected.into_iter().collect();
        if suspected == self.suspected {
            return;
        }
        self.suspected = suspected;
        let config = self.config;
        let suspected = &self.suspected;
        self.handoffs
            .set_waits(|from| wait_for(&config, suspected.contains(from)));
    }

    /// The highest protocol version every member of this node's region speaks (the members its
    /// tables name), as membership last said: from [`Feature::SettledJoins`]'s version on,
    /// newcomers hear from every member (see [`Ownership::handle_table`]).
    pub fn handle_region_version(&mut self, version: u8) {
        self.releases = Feature::SettledJoins.readable_at(version);
    }

    pub fn me(&self) -> &str {
        &self.me
    }

    /// The table in force.
    pub fn table(&self) -> &Arc<SlotTable> {
        &self.table
    }

    pub fn phase(&self) -> Phase {
        if self.joining {
            if self.decided_alone {
                Phase::Alone
            } else {
                Phase::Joining
            }
        } else if self.table.contains(&self.me) {
            Phase::Member
        } else {
            Phase::Left
        }
    }

    /// Started with seeds and not yet with its first real table.
    pub fn is_joining(&self) -> bool {
        self.joining
    }

    /// True when `version` is that of a table this node had before its current one (a sender
    /// under it is behind).
    pub fn had_version(&self, version: u64) -> bool {
        version != self.table.version() && self.past_versions.contains(&version)
    }

    /// True when this node handed `slot` to another owner and has not owned it again since.
    pub fn gave_away(&self, slot: u16) -> bool {
        self.given_away
            .get(usize::from(slot))
            .copied()
            .unwrap_or(false)
    }

    /// A new table from membership. `announced_leave(id)`: the member announced a graceful
    /// leave (it hands its slots over, as every member in `new` does; a dead one does not).
    /// Switches to `new`, records what was given away, makes gained slots wait for their hand-off,
    /// and queues the hand-offs this node owes. The driver must call this with no decision under
    /// the old table in flight, and export the hand-offs' buckets after it. Returns the old table.
    pub fn handle_table(
        &mut self,
        now_ns: u64,
        new: Arc<SlotTable>,
        announced_leave: impl Fn(&str) -> bool,
    ) -> Arc<SlotTable> {
        let join_base = self.join_base(&new);
        self.handle_table_with(now_ns, new, join_base, announced_leave)
    }

    /// When `new` would be this node's first real table (it is joining and `new` names others),
    /// the cluster as it was without it: what its gained slots come from. Computing it takes
    /// milliseconds for a big cluster, so a driver computes it before it stops decisions for the
    /// switch, and passes it to [`Ownership::handle_table_with`].
    pub fn join_base(&self, new: &SlotTable) -> Option<Arc<SlotTable>> {
        if !self.joining || new.nodes().len() < 2 {
            return None;
        }
        Some(Arc::new(Self::table_without(&self.me, new)))
    }

    /// `table`'s owners but `me`, as a table (epoch 0): a join's base.
    pub fn table_without(me: &str, table: &SlotTable) -> SlotTable {
        let others: Vec<String> = table
            .nodes()
            .iter()
            .filter(|o| o.as_str() != me)
            .cloned()
            .collect();
        SlotTable::compute(0, &others)
    }

    /// [`Ownership::handle_table`] with the join base computed beforehand (`None` when
    /// [`Ownership::join_base`] gave none; a base given when the switch is no join is ignored).
    pub fn handle_table_with(
        &mut self,
        now_ns: u64,
        new: Arc<SlotTable>,
        join_base: Option<Arc<SlotTable>>,
        announced_leave: impl Fn(&str) -> bool,
    ) -> Arc<SlotTable> {
        // A node that just joined owned nothing before: its table of one was not ownership.
        // What it gains comes from the cluster as it was without it.
        let joined_now = new.nodes().len() > 1 && self.joining;
        self.unreleased.retain(|m| new.contains(m));
        if !joined_now && self.releases && self.young(now_ns) && new.contains(&self.me) {
            self.expect_releases_of_newcomers(&new, now_ns);
        }
        if joined_now && self.releases {
            self.unreleased = new
                .nodes()
                .iter()
                .filter(|m| **m != self.me && !self.released_already(m, now_ns))
                .cloned()
                .collect();
        }
        let before = match join_base {
            Some(base) if joined_now => base,
            _ if joined_now => self.join_base(&new).unwrap_or_else(|| self.table.clone()),
            _ => self.table.clone(),
        };
        self.expect_handoffs(&before, &new, now_ns, &announced_leave);
        if joined_now && self.releases {
            self.expect_releases(&new, now_ns);
        } else if joined_now {
            for slot in 0..SLOTS as u16 {
                if new.owner(slot) == Some(self.me.as_str())
                    && !self.unconfirmed.contains_key(&slot)
                    && let Some(from) = before.owner(slot)
                {
                    let from = from.to_owned();
                    self.unconfirmed
                        .insert(slot, Window::JoinedGuessing { from });
                }
            }
        }
        let old = self.switch(new.clone());
        if joined_now {
            self.joining = false;
            self.joined_at_ns = Some(now_ns);
            self.actions.push_back(Action::Joined);
        }
        self.queue_handoffs(&before, &new, !joined_now && self.releases);
        if joined_now && !self.decided_alone {
            self.announce_joined(&new);
        }
        self.changes += 1;
        old
    }

    /// `member` of this node's table restarted, and its new life was first heard of already
    /// joined (it learned the cluster from other members before its word reached this node):
    /// the new life waits for this node's release of the slots it owns (a join expects one
    /// from every member, or from their previous owner), and no switch here sends one, as
    /// this table never lost the member. Queues that hand-off: the slots the table gives
    /// `member`, with what this node holds of them (the replicas it keeps as their successor,
    /// takeovers while the member was silent), which its new life would otherwise start
    /// without. Nothing for this node, a member not in the table (a switch that takes it in
    /// releases it), or while joining (this node owns nothing yet).
    pub fn handle_restarted(&mut self, member: &str) {
        if member == self.me || self.joining || !self.table.contains(member) {
            return;
        }
        let slots = Self::owned_by(&self.table, member);
        let id = self.fresh_handoff_id();
        self.actions.push_back(Action::HandOff(HandOff {
            to: member.to_owned(),
            id,
            slots,
        }));
        self.changes += 1;
    }

    /// Every seed turned out to be this node: it is the first of its cluster, with nobody to
    /// wait for.
    pub fn handle_no_one_to_join(&mut self, now_ns: u64) {
        if self.joining {
            self.joining = false;
            self.joined_at_ns = Some(now_ns);
            self.actions.push_back(Action::Joined);
            self.changes += 1;
        }
    }

    /// A check waited its longest for the join: from now on this node decides alone (and, once
    /// joined, does not claim to hold nothing).
    pub fn handle_join_wait_expired(&mut self) {
        if self.joining && !self.decided_alone {
            self.decided_alone = true;
            self.changes += 1;
        }
    }

    /// One part of a hand-off from `from` arrived (its buckets already merged). Returns true
    /// when it completed the hand-off (waiting checks may go on).
    pub fn handle_handoff(&mut self, now_ns: u64, from: &str, part: ReceivedPart<'_>) -> bool {
        let Some(slots) = self.handoffs.received(from, part, now_ns) else {
            return false;
        };
        // Whatever it carries, a hand-off from a member says its table names this node.
        self.unreleased.remove(from);
        for slot in slots {
            let confirmed = match self.unconfirmed.get_mut(&slot) {
                Some(Window::WaitExpired { from: by }) => {
                    by.retain(|b| b != from);
                    by.is_empty()
                }
                Some(Window::OwnerDeclaredDead { from: by }) => by == from,
                _ => false,
            };
            if confirmed {
                self.unconfirmed.remove(&slot);
            }
        }
        self.changes += 1;
        true
    }

    /// Time passed: waits whose deadline passed end (those slots are decided from what is here).
    pub fn handle_timeout(&mut self, now_ns: u64) {
        let expired = self.handoffs.expire(now_ns);
        if !expired.is_empty() {
            self.changes += 1;
        }
        for (slot, from) in expired {
            match self.unconfirmed.get_mut(&slot) {
                Some(Window::WaitExpired { from: by }) => {
                    if let Err(at) = by.binary_search(&from) {
                        by.insert(at, from);
                    }
                }
                _ => {
                    let from = vec![from];
                    self.unconfirmed.insert(slot, Window::WaitExpired { from });
                }
            }
        }
    }

    /// When [`Ownership::handle_timeout`] has something to do next.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.handoffs.next_deadline()
    }

    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Where a check on `slot` arriving as `arrival` at `now_ns` goes first; `suspected` says
    /// which members the failure detector holds suspect (or worse). A check this node would
    /// decide while the slot still waits for its previous owner's hand-off is refused
    /// [`Refusal::TryAgain`]: no frame waits on one slot's hand-off.
    pub fn place(
        &self,
        slot: u16,
        arrival: Arrival,
        now_ns: u64,
        suspected: impl Fn(&str) -> bool,
    ) -> Placement {
        let placement = first_place(
            &self.table,
            &self.me,
            slot,
            arrival,
            |s| self.gave_away(s),
            suspected,
        );
        self.unless_awaited(slot, now_ns, placement)
    }

    /// Where a check goes after its forward failed (`last_round`: the second forward); as
    /// [`Ownership::place`] for a slot awaiting its hand-off.
    pub fn place_again(
        &self,
        slot: u16,
        failed: &Failed,
        last_round: bool,
        now_ns: u64,
        suspected: impl Fn(&str) -> bool,
    ) -> Placement {
        let placement = next_place(
            &self.table,
            &self.me,
            slot,
            failed,
            last_round,
            |s| self.gave_away(s),
            suspected,
        );
        self.unless_awaited(slot, now_ns, placement)
    }

    fn unless_awaited(&self, slot: u16, now_ns: u64, placement: Placement) -> Placement {
        match placement {
            Placement::Decide | Placement::Takeover
                if self.awaits_handoff(std::iter::once(slot), now_ns) =>
            {
                Placement::Refuse(Refusal::TryAgain)
            }
            placement => placement,
        }
    }

    /// The latest deadline among `slots` still waiting for a hand-off at `now_ns`, if any.
    pub fn handoff_deadline(&self, slots: impl Iterator<Item = u16>, now_ns: u64) -> Option<u64> {
        self.handoffs.deadline(slots, now_ns)
    }

    /// True when one of `slots` still waits for a hand-off at `now_ns`.
    pub fn awaits_handoff(&self, slots: impl Iterator<Item = u16>, now_ns: u64) -> bool {
        self.handoff_deadline(slots, now_ns).is_some()
    }

    /// True while any gained slot waits for a hand-off (or a wait that ran out has not been
    /// marked yet by [`Ownership::handle_timeout`]): a driver's shortcut that decides every
    /// slot at once must not be taken then.
    pub fn awaits_any_handoff(&self) -> bool {
        !self.handoffs.is_empty()
    }

    /// True when every check may be decided here at once, without placing each (a driver's
    /// shortcut for whole frames): this node is alone in its table (or the last to leave), so
    /// nobody else owns anything; it is not waiting for its join; and no slot it gained waits
    /// for a hand-off. A member that just left is still handing its slots over: decided here
    /// before that lands, they would miss the leaver's last decisions.
    pub fn decides_every_slot(&self) -> bool {
        self.table.nodes().iter().all(|n| *n == self.me)
            && self.phase() != Phase::Joining
            && !self.awaits_any_handoff()
    }

    /// True when a client's check on `slot` would be decided here at `now_ns`, without waiting:
    /// the node is not waiting for its join, owns the slot, and the slot waits for no hand-off.
    pub fn decides(&self, slot: u16, now_ns: u64) -> bool {
        // What `place(slot, Arrival::Client)` answers `Decide` to, without building the rest.
        self.table.owner(slot) == Some(self.me.as_str())
            && self.phase() != Phase::Joining
            && !self.awaits_handoff(std::iter::once(slot), now_ns)
    }

    /// [`Ownership::decides`] for every slot at once (by slot number), for checkers.
    pub fn decided_slots(&self, now_ns: u64) -> Vec<bool> {
        let mine = self.table.nodes().iter().position(|n| *n == self.me);
        if self.phase() == Phase::Joining || mine.is_none() {
            return vec![false; SLOTS];
        }
        (0..SLOTS as u16)
            .map(|slot| {
                self.table.owner_index(slot) == mine
                    && !self.awaits_handoff(std::iter::once(slot), now_ns)
            })
            .collect()
    }

    /// Why this node decides `slot` at `now_ns` without its previous owner's state, if it
    /// does. A wait whose deadline passed is read as expired at once, as [`Ownership::decides`]
    /// reads it, even before [`Ownership::handle_timeout`] marks it.
    pub fn window(&self, slot: u16, now_ns: u64) -> Option<Window> {
        if self.phase() == Phase::Alone {
            return Some(Window::Alone);
        }
        let mut from = self.handoffs.expired_waits(slot, now_ns);
        if !from.is_empty() {
            if let Some(Window::WaitExpired { from: before }) = self.unconfirmed.get(&slot) {
                from.extend(before.iter().cloned());
            }
            from.sort();
            from.dedup();
            return Some(Window::WaitExpired { from });
        }
        self.unconfirmed.get(&slot).cloned()
    }

    /// Counts changes of what this machine decides: unchanged, nothing to check again.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// Marks the slots this node gains from a live or departed previous owner as waiting until
    /// that owner's hand-off arrives (every node that loses slots to a live node sends one,
    /// empty or not). Slots of a dead node do not wait: the successor holds the replicas.
    fn expect_handoffs(
        &mut self,
        before: &SlotTable,
        new: &SlotTable,
        now_ns: u64,
        announced_leave: &impl Fn(&str) -> bool,
    ) {
        self.handle_timeout(now_ns);
        let me = self.me.as_str();
        let unreleased: Vec<String> = self.unreleased.iter().cloned().collect();
        for slot in 0..SLOTS as u16 {
            if let (Some(was), Some(now_owner)) = (before.owner(slot), new.owner(slot))
                && now_owner == me
                && was != me
            {
                for member in &unreleased {
                    let wait = wait_for(&self.config, self.suspected.contains(member));
                    self.handoffs.expect(slot, member, now_ns, wait);
                }
                if new.contains(was) || announced_leave(was) {
                    // Waiting, or its hand-off already here: either way not decided blind.
                    let wait = wait_for(&self.config, self.suspected.contains(was));
                    self.handoffs.expect(slot, was, now_ns, wait);
                    self.unconfirmed.remove(&slot);
                } else {
                    let from = was.to_owned();
                    self.unconfirmed
                        .insert(slot, Window::OwnerDeclaredDead { from });
                }
            }
        }
    }

    /// A newcomer's gained slots wait for every other member of its first table: each tells it
    /// the slots it does not decide when its own table takes the newcomer in (a release), and
    /// one that decides such a slot by its own view hands it over when that view gives it to
    /// the newcomer. So no member's view of who owned a slot before has to be guessed.
    fn expect_releases(&mut self, new: &SlotTable, now_ns: u64) {
        let me = self.me.as_str();
        let others: Vec<&String> = new.nodes().iter().filter(|n| *n != me).collect();
        for slot in 0..SLOTS as u16 {
            if new.owner(slot) != Some(me) {
                continue;
            }
            for &other in &others {
                let wait = wait_for(&self.config, self.suspected.contains(other));
                self.handoffs.expect(slot, other, now_ns, wait);
            }
            self.unconfirmed.remove(&slot);
        }
    }

    /// True for a while after this node joined: members that did not know it then may not yet.
    fn young(&self, now_ns: u64) -> bool {
        self.joined_at_ns
            .is_some_and(|at| now_ns.saturating_sub(at) < wait_for(&self.config, false))
    }

    /// A young node's table takes in members it did not name before: one may have joined (or
    /// heard of this node) without this node's news and decided slots that this node's table
    /// gives it. Those slots wait for its release, as a newcomer's wait for every member's.
    fn expect_releases_of_newcomers(&mut self, new: &SlotTable, now_ns: u64) {
        let me = self.me.as_str();
        let newcomers: Vec<String> = new
            .nodes()
            .iter()
            .filter(|n| *n != me && !self.table.contains(n))
            .cloned()
            .collect();
        for newcomer in newcomers {
            let wait = wait_for(&self.config, self.suspected.contains(&newcomer));
            for slot in 0..SLOTS as u16 {
                if new.owner(slot) == Some(me) {
                    self.handoffs.expect(slot, &newcomer, now_ns, wait);
                }
            }
            if !self.released_already(&newcomer, now_ns) {
                self.unreleased.insert(newcomer);
            }
        }
    }

    /// True when `member`'s release came already: a complete hand-off from it arrived within
    /// its wait (its table took this node in before this node's took it in). It then has
    /// nothing more to say of slots this node gains later, and they must not wait for it.
    fn released_already(&self, member: &str, now_ns: u64) -> bool {
        let wait = wait_for(&self.config, self.suspected.contains(member));
        self.handoffs.heard_from(member, now_ns, wait)
    }

    /// Makes `new` the table in force and records the slots it gives away. Returns the old one.
    fn switch(&mut self, new: Arc<SlotTable>) -> Arc<SlotTable> {
        let old = std::mem::replace(&mut self.table, new);
        let new = &self.table;
        if old.version() != new.version() {
            self.past_versions.retain(|v| *v != old.version());
            self.past_versions.push_back(old.version());
            if self.past_versions.len() > self.config.past_versions {
                self.past_versions.pop_front();
            }
        }
        let me = Some(self.me.as_str());
        let mut lost = Vec::new();
        for (slot, given) in self.given_away.iter_mut().enumerate() {
            let slot = slot as u16;
            if new.owner(slot) == me {
                *given = false;
            } else if old.owner(slot) == me {
                *given = true;
                lost.push(slot);
                self.unconfirmed.remove(&slot);
                if new.owner(slot).is_none() {
                    self.orphaned.insert(slot);
                }
            }
        }
        self.handoffs.gave_away(&lost);
        old
    }

    /// Queues a hand-off to every node that gains slots from this one (even with no buckets:
    /// it holds checks on those slots until it hears from this node). With `releases`, every
    /// member `new` names that `before` did not gets a release instead: every slot `new` gives
    /// it (with this node's buckets of them). A slot this node's view gives to a third member
    /// is not listed, so a newcomer whose view differs (it has not heard of that member) waits
    /// until the views agree.
    fn queue_handoffs(&mut self, before: &SlotTable, new: &SlotTable, releases: bool) {
        let me = Some(self.me.as_str());
        let mut slots: BTreeMap<&str, Vec<u16>> = BTreeMap::new();
        for slot in 0..SLOTS as u16 {
            let last_held_here = before.owner(slot) == me
                || (before.owner(slot).is_none() && self.orphaned.contains(&slot));
            if last_held_here
                && let Some(owner) = new.owner(slot)
                && Some(owner) != me
            {
                slots.entry(owner).or_default().push(slot);
                self.orphaned.remove(&slot);
            }
        }
        if releases && new.contains(&self.me) {
            for newcomer in new.nodes() {
                if Some(newcomer.as_str()) != me && !before.contains(newcomer) {
                    slots.insert(newcomer, Self::owned_by(new, newcomer));
                }
            }
        }
        for (to, slots) in slots {
            let id = self.fresh_handoff_id();
            self.actions.push_back(Action::HandOff(HandOff {
                to: to.to_owned(),
                id,
                slots,
            }));
        }
    }

    /// Tells every other member that this node, just joined, decided none of the slots it
    /// does not own: a member that expects a hand-off from it for one of them (because its
    /// view had this node owning the slot before this node knew the cluster) need not wait.
    /// What it does hold for them (a hand-off a member sent it while it was joining) goes to
    /// their owners with it, or it would be lost.
    fn announce_joined(&mut self, table: &SlotTable) {
        let me = Some(self.me.as_str());
        let slots: Vec<u16> = (0..SLOTS as u16)
            .filter(|&s| table.owner(s) != me)
            .collect();
        let releases = self.releases;
        let others: Vec<String> = table
            .nodes()
            .iter()
            .filter(|n| Some(n.as_str()) != me)
            .cloned()
            .collect();
        for to in others {
            let id = self.fresh_handoff_id();
            // With releases, an announcement is one: only the slots its table gives `to`.
            let slots = if releases {
                Self::owned_by(table, &to)
            } else {
                slots.clone()
            };
            self.actions
                .push_back(Action::HandOff(HandOff { to, id, slots }));
        }
    }

    /// The slots `table` gives `owner`.
    fn owned_by(table: &SlotTable, owner: &str) -> Vec<u16> {
        (0..SLOTS as u16)
            .filter(|&s| table.owner(s) == Some(owner))
            .collect()
    }

    fn fresh_handoff_id(&mut self) -> u64 {
        let id = self.next_handoff_id;
        self.next_handoff_id = self.next_handoff_id.wrapping_add(1);
        id
    }
}

/// How long a gained slot waits for a previous owner held `suspected` or alive.
fn wait_for(config: &OwnershipConfig, suspected: bool) -> u64 {
    if suspected {
        config.handoff_wait_ns
    } else {
        config.handoff_wait_alive_ns.max(config.handoff_wait_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::ownership::placement::Arrival;

    const WAIT: u64 = 500_000_000;
    const ALIVE_WAIT: u64 = 5_000_000_000;

    fn table(epoch: u64, nodes: &[&str]) -> Arc<SlotTable> {
        let nodes: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
        Arc::new(SlotTable::compute(epoch, &nodes))
    }

    fn machine(me: &str, first: Arc<SlotTable>, joining: bool) -> Ownership {
        Ownership::new(me.into(), first, joining, 1_000, OwnershipConfig::default())
    }

    fn actions(m: &mut Ownership) -> Vec<Action> {
        std::iter::from_fn(|| m.poll_action()).collect()
    }

    fn part(id: u64, slots: &[u16]) -> ReceivedPart<'_> {
        ReceivedPart {
            id,
            part: 0,
            parts: 1,
            slots,
        }
    }

    const NO_ONE_LEFT: fn(&str) -> bool = |_| false;

    /// The last member left after a graceful leave waits for the leaver's hand-off before it
    /// decides every check at once: until then each is placed (and a gained slot answered
    /// `try_again`). A rolling restart of a two-node region decided the leaver's keys blind
    /// through that shortcut, a burst over the limit per key.
    #[test]
    fn the_last_member_decides_every_slot_only_once_the_leavers_hand_off_is_here() {
        let pair = table(1, &["a", "b"]);
        let mut a = machine("a", pair.clone(), false);
        assert!(!a.decides_every_slot(), "b owns slots");
        a.handle_table(1_000, table(2, &["a"]), |id| id == "b");
        assert!(a.awaits_any_handoff());
        assert!(!a.decides_every_slot(), "b's hand-off is on its way");
        let gained: Vec<u16> = (0..SLOTS as u16)
            .filter(|&s| pair.owner(s) == Some("b"))
            .collect();
        assert!(a.handle_handoff(2_000, "b", part(7, &gained)));
        assert!(a.decides_every_slot(), "b's state is here");

        // A node waiting for its join decides nothing at once, table of one or not.
        let joining = machine("c", table(1, &["c"]), true);
        assert!(!joining.decides_every_slot());
    }

    /// Two nodes that joined through one founder, each before hearing of the other: when n2's
    /// release reaches n1 before n1's table takes n2 in, n2 has told n1 all it will, so the
    /// slots n1 gains later from the founder's leave wait for the founder alone. (They once
    /// waited for n2 too, out to the 5 s wait, in every rolling restart of a young cluster.)
    #[test]
    fn a_young_node_waits_for_no_newcomer_whose_release_came_first() {
        const MS: u64 = 1_000_000;
        let mut n1 = machine("n1", table(0, &["n1"]), true);
        n1.handle_region_version(Feature::SettledJoins.since());
        let first = table(1, &["p", "n1"]);
        n1.handle_table(0, first.clone(), NO_ONE_LEFT);
        let mine = |t: &SlotTable| -> Vec<u16> {
            (0..SLOTS as u16)
                .filter(|&s| t.owner(s) == Some("n1"))
                .collect()
        };
        assert!(n1.handle_handoff(MS, "p", part(1, &mine(&first))));
        assert!(!n1.awaits_any_handoff(), "the founder released n1's slots");

        let three = table(2, &["p", "n1", "n2"]);
        assert!(n1.handle_handoff(10 * MS, "n2", part(2, &mine(&three))));
        n1.handle_table(20 * MS, three.clone(), NO_ONE_LEFT);
        assert!(!n1.awaits_any_handoff(), "n2's release is here");

        let pair = table(3, &["n1", "n2"]);
        n1.handle_table(30 * MS, pair.clone(), |id| id == "p");
        let gained: Vec<u16> = (0..SLOTS as u16)
            .filter(|&s| pair.owner(s) == Some("n1") && three.owner(s) == Some("p"))
            .collect();
        assert!(!gained.is_empty());
        assert!(
            n1.awaits_any_handoff(),
            "the founder's hand-off is on its way"
        );
        assert!(n1.handle_handoff(40 * MS, "p", part(3, &gained)));
        assert!(
            gained.iter().all(|&s| n1.decides(s, 40 * MS)),
            "the gained slots wait for n2, who has nothing to send"
        );
    }

    /// A member restarts and its new life joins before the other member hears of it: the
    /// other's table never loses it, so no switch releases its slots, and the new life, whose
    /// join waits for every member, answered `try_again` for all of them for the 5 s wait
    /// (seen in `crash-restart` when the restart beat the other's news of it). The release
    /// [`Ownership::handle_restarted`] queues ends that wait at once, with both versions of the
    /// join protocol.
    #[test]
    fn a_member_restarted_and_joined_unseen_is_released_at_once() {
        const MS: u64 = 1_000_000;
        for releases in [true, false] {
            let pair = table(5, &["a", "b"]);
            let mut a = machine("a", pair.clone(), false);
            let mut b = machine("b", table(0, &["b"]), true);
            if releases {
                a.handle_region_version(Feature::SettledJoins.since());
                b.handle_region_version(Feature::SettledJoins.since());
            }
            // b's new life joins with the table a has had all along.
            b.handle_table(0, table(3, &["a", "b"]), NO_ONE_LEFT);
            let announced = actions(&mut b);
            assert!(announced.contains(&Action::Joined));
            let mine: Vec<u16> = (0..SLOTS as u16)
                .filter(|&s| pair.owner(s) == Some("b"))
                .collect();
            assert!(
                mine.iter().all(|&s| !b.decides(s, MS)),
                "b waits for a (releases: {releases})"
            );
            assert!(
                !mine.iter().any(|&s| b.decides(s, ALIVE_WAIT - MS)),
                "for the alive wait, without a's release"
            );

            a.handle_restarted("b");
            let released = actions(&mut a);
            let [Action::HandOff(handoff)] = released.as_slice() else {
                panic!("one release, not {released:?}");
            };
            assert_eq!((handoff.to.as_str(), &handoff.slots), ("b", &mine));
            assert!(b.handle_handoff(2 * MS, "a", part(handoff.id, &handoff.slots)));
            assert!(
                mine.iter().all(|&s| b.decides(s, 2 * MS)),
                "a's release ends b's wait (releases: {releases})"
            );
        }

        // Nothing for a member the table does not name, for itself, or while joining.
        let mut a = machine("a", table(1, &["a", "b"]), false);
        a.handle_restarted("c");
        a.handle_restarted("a");
        assert!(actions(&mut a).is_empty());
        let mut joining = machine("j", table(0, &["j"]), true);
        joining.handle_restarted("b");
        assert!(actions(&mut joining).is_empty());
    }

    /// A lone node that leaves knowing nobody keeps its buckets; when members turn up before
    /// it stops, each gets the slots the new table gives it (they would start blind).
    #[test]
    fn a_leaver_that_knew_nobody_hands_its_slots_to_the_members_it_learns_of() {
        let mut a = machine("a", table(1, &["a"]), false);
        a.handle_table(0, table(2, &[]), NO_ONE_LEFT);
        assert!(actions(&mut a).is_empty(), "nobody to hand anything to");
        let later = table(3, &["b", "c"]);
        a.handle_table(1_000, later.clone(), NO_ONE_LEFT);
        let mut handed: Vec<(String, usize)> = actions(&mut a)
            .into_iter()
            .filter_map(|action| match action {
                Action::HandOff(h) => Some((h.to, h.slots.len())),
                Action::Joined => None,
            })
            .collect();
        handed.sort();
        assert_eq!(
            handed,
            vec![
                ("b".to_owned(), later.slots_owned("b")),
                ("c".to_owned(), later.slots_owned("c")),
            ]
        );
        a.handle_table(2_000, table(4, &["b", "c", "d"]), NO_ONE_LEFT);
        assert!(actions(&mut a).is_empty(), "handed once");
    }

    #[test]
    fn a_switch_hands_each_lost_slot_to_its_new_owner_once_and_never_decides_it_again() {
        let before = table(1, &["a", "b"]);
        let after = table(2, &["a", "b", "c"]);
        let mut a = machine("a", before.clone(), false);
        a.handle_table(0, after.clone(), NO_ONE_LEFT);
        let handoffs: Vec<HandOff> = actions(&mut a)
            .into_iter()
            .map(|action| match action {
                Action::HandOff(h) => h,
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        // Consistent hashing: a joiner takes slots only; a keeps the rest.
        assert_eq!(handoffs.len(), 1);
        assert_eq!(handoffs[0].to, "c");
        let lost: Vec<u16> = (0..SLOTS as u16)
            .filter(|&s| before.owner(s) == Some("a") && after.owner(s) == Some("c"))
            .collect();
        assert_eq!(handoffs[0].slots, lost);
        for &slot in &lost {
            assert!(a.gave_away(slot));
            assert!(!a.decides(slot, 0));
            assert_eq!(
                a.place(slot, Arrival::Forwarded, 0, |_| false),
                Placement::Refuse(Refusal::NotOwner)
            );
        }
        assert!(a.had_version(before.version()));
        assert!(!a.had_version(after.version()));
    }

    #[test]
    fn a_slot_gained_from_a_live_owner_waits_for_its_hand_off_and_one_from_a_dead_owner_does_not() {
        let before = table(1, &["a", "b", "c"]);
        let after = table(2, &["a", "b"]);
        let gained: Vec<u16> = (0..SLOTS as u16)
            .filter(|&s| before.owner(s) == Some("c") && after.owner(s) == Some("a"))
            .collect();
        let slot = gained[0];

        // c left gracefully: its hand-off is awaited, until it arrives (as long as c is held
        // alive, the longer wait: c may still be deciding).
        let mut a = machine("a", before.clone(), false);
        a.handle_table(10, after.clone(), |id| id == "c");
        assert!(!a.decides(slot, 10));
        assert_eq!(a.poll_timeout(), Some(10 + ALIVE_WAIT));
        // Meanwhile a check for it is told to try again, at once: no frame waits on it.
        let try_again = Placement::Refuse(Refusal::TryAgain);
        assert_eq!(a.place(slot, Arrival::Client, 15, |_| false), try_again);
        assert_eq!(a.place(slot, Arrival::Forwarded, 15, |_| false), try_again);
        assert!(a.handle_handoff(20, "c", part(7, &gained)));
        assert!(a.decides(slot, 20));
        assert_eq!(
            a.place(slot, Arrival::Client, 20, |_| false),
            Placement::Decide
        );
        assert_eq!(a.window(slot, 20), None);

        // Its wait runs out: decided from what is here, inside a named window. While c is
        // held alive that is the longer wait; once it is suspected, the shorter one from the
        // wait's start, and alive again, the longer one.
        let mut late = machine("a", before.clone(), false);
        late.handle_table(10, after.clone(), |id| id == "c");
        late.handle_timeout(10 + WAIT);
        assert!(!late.decides(slot, 10 + WAIT), "c is held alive");
        late.handle_suspicion(["c".to_owned()]);
        assert_eq!(late.poll_timeout(), Some(10 + WAIT));
        late.handle_suspicion([]);
        assert_eq!(late.poll_timeout(), Some(10 + ALIVE_WAIT));
        late.handle_suspicion(["c".to_owned()]);
        late.handle_timeout(10 + WAIT);
        assert!(late.decides(slot, 10 + WAIT));
        assert_eq!(
            late.window(slot, 10 + WAIT),
            Some(Window::WaitExpired {
                from: vec!["c".into()]
            })
        );

        // c is dead: nothing comes, nothing is awaited.
        let mut dead = machine("a", before, false);
        dead.handle_table(10, after, NO_ONE_LEFT);
        assert!(dead.decides(slot, 10));
        assert_eq!(
            dead.window(slot, 10),
            Some(Window::OwnerDeclaredDead { from: "c".into() })
        );
    }

    #[test]
    fn a_joining_node_waits_then_decides_alone_and_a_joined_one_announces_it_holds_nothing() {
        let alone = table(1, &["n"]);
        let cluster = table(2, &["m", "n"]);

        let mut n = machine("n", alone.clone(), true);
        assert_eq!(n.phase(), Phase::Joining);
        assert!(!n.decides(0, 0));
        n.handle_table(5, cluster.clone(), NO_ONE_LEFT);
        assert_eq!(n.phase(), Phase::Member);
        let after_join = actions(&mut n);
        assert_eq!(after_join[0], Action::Joined);
        // Its table of one was not ownership: it owes no buckets, and tells m it holds none.
        assert!(matches!(
            &after_join[1..],
            [Action::HandOff(HandOff { to, .. })] if to == "m"
        ));
        // What it gained waits for m's hand-off.
        let gained = (0..SLOTS as u16)
            .find(|&s| cluster.owner(s) == Some("n"))
            .unwrap();
        assert!(!n.decides(gained, 5));

        let mut gave_up = machine("n", alone, true);
        gave_up.handle_join_wait_expired();
        assert_eq!(gave_up.phase(), Phase::Alone);
        assert!(gave_up.decides(0, 0));
        assert_eq!(gave_up.window(0, 0), Some(Window::Alone));
        gave_up.handle_table(5, cluster, NO_ONE_LEFT);
        // It may hold state for slots others own: no announcement that it holds none.
        assert_eq!(actions(&mut gave_up), vec![Action::Joined]);
    }

    #[test]
    fn a_node_that_leaves_decides_nothing_and_hands_everything_over() {
        let before = table(1, &["a", "b"]);
        let mut a = machine("a", before.clone(), false);
        a.handle_table(0, table(2, &["b"]), NO_ONE_LEFT);
        assert_eq!(a.phase(), Phase::Left);
        let handed: usize = actions(&mut a)
            .iter()
            .map(|action| match action {
                Action::HandOff(h) => h.slots.len(),
                Action::Joined => 0,
            })
            .sum();
        assert_eq!(handed, before.slots_owned("a"));
        assert!((0..SLOTS as u16).all(|s| !a.decides(s, 0)));
    }
}

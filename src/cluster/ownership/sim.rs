//! A seeded simulation of ownership machines over a faulty network, with the invariant checked
//! at every virtual instant something changes. Everything is a function of the seed (a
//! splitmix64 generator, ordered maps, virtual time): one seed replays byte for byte.
//!
//! Each simulated node is a [`Membership`] (real gossip, suspicion and death by silence) and an
//! [`Ownership`] machine, driven as the node drives them: every membership change that moves
//! owners becomes a table switch, every [`Action::HandOff`] becomes one to three parts sent
//! over the network. The network delays (uniformly in a range), loses, duplicates and so
//! reorders messages. Nodes crash and restart (a new life with a later incarnation, joining
//! through its seeds), leave gracefully (and stop after a linger), new nodes join, and running
//! nodes stall: they handle nothing (messages wait, no timer, no gossip) for a while shorter
//! than the suspicion timeout.
//!
//! Clients (simulated gateways) send checks for random slots to the owner their copy of some
//! node's table names (refreshed now and then, so possibly stale), with a breaker per node
//! that opens after consecutive timeouts; while it is open, the slot's successor gets the check
//! marked as a takeover. A node places each check as the driver does: [`Ownership::place`] with
//! `suspected` from its own membership; `Decide` and `Takeover` are decisions, `Forward` goes
//! to the owner over the network and, refused `not_owner` or unanswered within the forward
//! timeout, is placed again ([`Ownership::place_again`]); `TryAgain` decides nothing, and the
//! client sends the call again after a pause that doubles from one tick while its deadline
//! allows, routed afresh by its view (as the client crate does). A
//! forwarded check waits (bounded) for the receiver's table to name it unless the sender is
//! behind, as the driver does.
//!
//! Three checkers: at every change, the machines' deciding slots ([`check_instant`]); at every
//! decision, every other node deciding the slot then (its machine's owner, stalled or not, or a
//! decision outside its table at the same instant) must be excused by a window of the machine
//! or by [`Window::OwnerSuspected`]: a takeover or an unanswered forward decided while the
//! decider's membership held that other node suspect or dead. Beside a stalled owner nothing
//! but the machine's windows excuses a second decider ([`SimReport::stall_second_deciders`]).
//! And at every decision outside a window, the decider's state must hold every earlier
//! decision of the slot made outside a window: each node counts the decisions its buckets
//! reflect (its own, and what hand-offs brought), so a node deciding from state that misses
//! some (a takeover from replicas beside a leaver's hand-off, a state handed to a node that
//! passes nothing on) is caught. Only a crash, a stop for an upgrade, or a hand-off (or what a
//! receiver sends on) that is lost loses state, and the count follows.
//!
//! With `rolling_upgrade`, the first nodes start as the build before protocol negotiation
//! (they speak version 2 alone) and are restarted into this build one after another; gossip
//! between two nodes goes in the layout of the version they share (ranges left out in version
//! 2's), and at every tick each node's cluster version must be one that every member it knows
//! in its current life speaks.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use super::handoffs::ReceivedPart;
use super::machine::{Action, Ownership, OwnershipConfig, Phase, Window};
use super::placement::{Arrival, Failed, Placement, Refusal, first_place, next_place};
use crate::cluster::{
    Gossip, MemberInfo, MemberState, Membership, MembershipConfig, SLOTS, SlotTable,
};
use crate::protocol::{self, Feature, VersionRange};
use crate::simulation::{SplitMix64, TraceDigest};

/// What a simulation run does. Rates are per mille; fault rates are per tick.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Nodes at the start (the first has no seeds; the others join through it, started one after another).
    pub nodes: usize,
    /// Most nodes ever (joins stop there).
    pub max_nodes: usize,
    /// Virtual time simulated.
    pub duration_ns: u64,
    /// Step of the driver loop (gossip, timers, faults).
    pub tick_ns: u64,
    pub min_delay_ns: u64,
    pub max_delay_ns: u64,
    pub loss_per_mille: u64,
    pub duplicate_per_mille: u64,
    pub crash_per_mille: u64,
    pub restart_per_mille: u64,
    pub leave_per_mille: u64,
    pub join_per_mille: u64,
    /// How long a leaving node keeps running after its leave.
    pub linger_ns: u64,
    /// How long a check waits for a joining node's join before it decides alone.
    pub join_wait_ns: u64,
    pub membership: MembershipConfig,
    pub ownership: OwnershipConfig,
    /// When false, the checker excuses no window: every double decider fails (to show the
    /// windows happen and the checker sees them).
    pub excuse_windows: bool,
    /// A deliberately wrong driver, to show the checker catches it: hand-offs are sent at once
    /// but the node keeps deciding under its old table for 50 ms more (an export before the
    /// switch, as if the deciding gate were missing).
    pub send_before_switch: bool,
    /// The first nodes' first lives speak version 2 alone; from 40% of the run each is
    /// restarted into this build, one every [`UPGRADE_STEP_NS`] (see the module doc).
    pub rolling_upgrade: bool,
    /// With `rolling_upgrade`, a deliberately wrong old build, to show the version check can
    /// fail: it claims this build's range while it speaks version 2 alone.
    pub old_build_claims_newest: bool,
    /// Simulated gateways sending checks (each with a breaker per node, as the client has).
    pub clients: usize,
    /// Chance per tick that each client sends a check for a random slot.
    pub check_per_mille: u64,
    /// Chance per tick that a running node stalls: it handles nothing (no message, no timer, no
    /// gossip) for a random time up to `max_stall_ns`, then goes on.
    pub stall_per_mille: u64,
    /// Longest stall: shorter than the membership's suspicion timeout.
    pub max_stall_ns: u64,
    /// How long a node waits for an owner's answer to a forward.
    pub forward_timeout_ns: u64,
    /// How long a client waits for a node's answer; a timeout counts against its breaker.
    pub client_timeout_ns: u64,
    /// Consecutive timeouts that open a client's breaker for a node.
    pub breaker_failures: u32,
    /// How long an open breaker sends nothing to its node (then one check probes it).
    pub breaker_cooldown_ns: u64,
    /// A deliberately wrong driver: the successor takes over whenever a takeover reaches it,
    /// whatever its failure detector says of the owner (the rule before suspicion counted).
    pub takeover_without_suspicion: bool,
    /// A deliberately wrong driver: a forward the owner did not answer in time is decided by
    /// the forwarder, whatever its failure detector says of the owner (and whatever it handed
    /// off: every joined node counts each slot it does not own as handed off).
    pub decide_unanswered_without_suspicion: bool,
    /// A deliberately wrong driver: a slot still waiting for its hand-off is decided anyway
    /// (the machine's `TryAgain` ignored).
    pub decide_awaited_slots: bool,
    /// A deliberately wrong driver: a node alone in its table decides every check at once,
    /// whatever its gained slots still wait for (the node's whole-frame shortcut as it was
    /// before it asked [`Ownership::decides_every_slot`]).
    pub shortcut_ignores_handoffs: bool,
    /// How long after gossip's news a node switches tables (0: at once), as the node's driver
    /// does once the deciding gate is its own: meanwhile checks are placed by the old table
    /// with the membership's new verdicts.
    pub switch_lag_ns: u64,
    /// A deliberately wrong driver: buckets a hand-off brought for a slot the receiver's
    /// table gives to a third member stay with the receiver, not sent on.
    pub keep_stranded: bool,
    /// A deliberately wrong driver: a just-joined node's announcements carry nothing, not
    /// even what a member handed it while it was joining.
    pub joined_hands_nothing: bool,
    /// A deliberately wrong driver: a member that announced its leave counts as suspected
    /// when a check is placed, so its slots are taken over from replicas before its
    /// hand-off lands.
    pub take_over_from_departed: bool,
    /// A deliberately wrong driver: newcomers guess each gained slot's previous owner (the
    /// table without them) and wait for that one alone, as before releases, in a cluster
    /// whose members all speak them; the checker then excuses no guess.
    pub guessing_newcomers: bool,
    /// The first nodes start at one instant, each with all of them as seeds (itself too), as
    /// a fleet's first rollout does: none is settled, so one must found the cluster.
    pub started_together: bool,
    /// With `started_together`: each node's seeds are the others, not itself (as when each is
    /// given its peers' addresses), so the founder is chosen after the failure timeout.
    pub seeds_omit_self: bool,
}

impl SimConfig {
    /// A run drawn from `seed`: 3 to 5 nodes, up to 10% loss, some duplication, and faults.
    pub fn from_seed(seed: u64) -> Self {
        let mut rng = SplitMix64::new(seed ^ 0x5EED_C0F1_6000_0000);
        let nodes = rng.range(2, 4) as usize;
        SimConfig {
            nodes,
            max_nodes: nodes + 2,
            duration_ns: 6_000_000_000,
            tick_ns: 10_000_000,
            min_delay_ns: 1_000_000,
            max_delay_ns: rng.range(2, 40) * 1_000_000,
            loss_per_mille: rng.range(0, 100),
            duplicate_per_mille: rng.range(0, 50),
            crash_per_mille: rng.range(0, 6),
            restart_per_mille: 20,
            leave_per_mille: rng.range(0, 4),
            join_per_mille: rng.range(0, 6),
            linger_ns: 300_000_000,
            join_wait_ns: 1_000_000_000,
            membership: MembershipConfig::default(),
            ownership: OwnershipConfig::default(),
            excuse_windows: true,
            send_before_switch: false,
            rolling_upgrade: false,
            old_build_claims_newest: false,
            clients: 3,
            check_per_mille: 700,
            stall_per_mille: rng.range(0, 8),
            max_stall_ns: MAX_STALL_NS,
            forward_timeout_ns: 0,
            client_timeout_ns: 0,
            breaker_failures: 2,
            breaker_cooldown_ns: 500_000_000,
            takeover_without_suspicion: false,
            decide_unanswered_without_suspicion: false,
            decide_awaited_slots: false,
            shortcut_ignores_handoffs: false,
            // Drawn apart from the generator above, so the faults a seed draws stay as they were.
            switch_lag_ns: if seed.is_multiple_of(2) {
                10_000_000
            } else {
                0
            },
            take_over_from_departed: false,
            joined_hands_nothing: false,
            keep_stranded: false,
            guessing_newcomers: false,
            started_together: seed % 4 == 3,
            seeds_omit_self: seed % 8 == 7,
        }
        .with_timeouts()
    }

    /// Forward and client timeouts that fit the network's delays: a forward is answered within
    /// its timeout unless lost or its owner stalled or gone, and so is a client's check.
    pub fn with_timeouts(mut self) -> Self {
        self.forward_timeout_ns = 2 * self.max_delay_ns + 2 * self.tick_ns;
        self.client_timeout_ns = self.forward_timeout_ns + 2 * self.max_delay_ns + 2 * self.tick_ns;
        self
    }
}

/// The longest stall drawn by [`SimConfig::from_seed`]: the default suspicion timeout less a
/// gossip interval, so an owner's silence as its peers see it stays short of suspicion.
pub const MAX_STALL_NS: u64 = 400_000_000;

/// What the other deciders of a slot at one decision came to.
#[derive(Default)]
struct Pairs {
    /// Pairs a window excused.
    excused: u32,
    /// Of those, pairs excused by the driver's suspicion alone.
    suspected: u64,
    /// Pairs beside a stalled owner that no machine window excused.
    stalled: u64,
    failure: Option<String>,
}

/// Whether a decision saw every earlier decision of its slot.
struct Blind {
    /// The decision falls in a window (its over-admission is allowed).
    windowed: bool,
    /// Decisions of the slot made outside windows so far.
    made: u64,
    /// Of those, what the deciding node's state holds.
    known: u64,
    failure: Option<String>,
}

/// The window a driver's decision is in: for a takeover or an unanswered forward, `other` when
/// the decider's failure detector holds it suspect or dead.
fn suspected_by(life: &Running, how: How, other: &str) -> Option<Window> {
    let suspect = matches!(
        life.membership.state_of(other),
        Some(MemberState::Suspect | MemberState::Dead)
    );
    (matches!(how, How::Takeover | How::Unanswered) && suspect).then(|| Window::OwnerSuspected {
        owner: other.to_owned(),
    })
}

/// One part of a hand-off on its way.
#[derive(Debug, Clone)]
struct HandoffDelivery {
    from: String,
    id: u64,
    part: u32,
    parts: u32,
    slots: Vec<u16>,
    /// The state it carries: per slot, how many of the slot's decisions its sender knew of
    /// (see [`Sim::made`]); empty for an announcement.
    known: Vec<(u16, u64)>,
}

/// A message on its way.
#[derive(Debug, Clone)]
enum Payload {
    /// Gossip, with its sender's id (its certificate's name: only its own digest is its word,
    /// the others are relays) and the versions it speaks (the layout follows what both share).
    Gossip(String, VersionRange, Gossip),
    HandoffPart(HandoffDelivery),
    /// A client's check; `takeover` marks it for the slot's successor.
    Check {
        client: usize,
        id: u64,
        slot: u16,
        takeover: bool,
    },
    /// Buckets a hand-off brought to a node whose table gives their slots to this one, sent
    /// on as replicas (merged, so `known` only ever rises).
    PassedOn {
        known: Vec<(u16, u64)>,
    },
    /// A check forwarded by `from` under its table of `version`.
    Forward {
        from: String,
        id: u64,
        slot: u16,
        version: u64,
    },
    ForwardAnswer {
        id: u64,
        answer: Answer,
    },
    ClientAnswer {
        client: usize,
        id: u64,
        answer: Answer,
    },
}

/// A node's answer to a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Decided,
    Refused(Refusal),
}

/// How a node came to decide a check (for the checker and the trace).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum How {
    /// Its own table names it the owner.
    Owner,
    /// A forwarded check its table does not give it (the sender's table is newer, or older for a
    /// slot this node never held).
    Forwarded,
    /// A takeover, as the slot's successor.
    Takeover,
    /// A forward its owner did not answer in time.
    Unanswered,
}

/// A forward awaiting its owner's answer, for a client's check.
#[derive(Debug, Clone)]
struct PendingForward {
    client: usize,
    check: u64,
    slot: u16,
    owner: String,
    deadline: u64,
    /// The second forward of this check: not sent on again.
    last_round: bool,
}

/// A forwarded check waiting (bounded) for this node's table to name it, as the driver waits.
#[derive(Debug, Clone)]
struct CatchingUp {
    deadline: u64,
    from: String,
    id: u64,
    slot: u16,
}

/// One simulated gateway: a (possibly stale) copy of some node's table, and a breaker per node.
#[derive(Debug, Default)]
struct SimClient {
    view: Option<Arc<SlotTable>>,
    refresh_at: u64,
    breakers: BTreeMap<String, Breaker>,
    /// Checks sent and not answered: to which node, for which call.
    pending: BTreeMap<u64, (String, Call)>,
    /// Calls answered `TryAgain`, sent again at the instant given.
    retries: Vec<(u64, Call)>,
}

/// One call of a client: its slot, until when it may be answered (every attempt's timeout),
/// and the pause before it is sent again after a `TryAgain` (doubling, as the client does).
#[derive(Debug, Clone, Copy)]
struct Call {
    slot: u16,
    deadline_ns: u64,
    pause_ns: u64,
}

/// A client's breaker for one node: consecutive timeouts, and until when it is open.
#[derive(Debug, Default, Clone, Copy)]
struct Breaker {
    failures: u32,
    open_until: Option<u64>,
}

#[derive(Debug)]
struct Running {
    membership: Membership,
    ownership: Ownership,
    started_ns: u64,
    /// Set once the node left gracefully: it stops at this instant.
    stops_at: Option<u64>,
    /// With `send_before_switch`: the switched machine, and when the node takes it on.
    switched_later: Option<(u64, Ownership)>,
    /// Stalled: handles nothing before this instant.
    stalled_until: Option<u64>,
    /// During the current stall: a client opened its breaker for this node, and a client sent
    /// a takeover for one of its slots.
    stall_opened_breaker: bool,
    stall_takeover_sent: bool,
    /// Forwards awaiting an answer, by id.
    forwards: BTreeMap<u64, PendingForward>,
    catching_up: Vec<CatchingUp>,
    /// Per slot, how many of its decisions this node's buckets reflect (see [`Sim::made`]):
    /// its own, and those a hand-off brought.
    known: BTreeMap<u16, u64>,
    /// With `switch_lag_ns`: when the membership's news reaches the table.
    switch_due: Option<u64>,
    /// The incarnation each member was last seen in, as the node's driver keeps them: an owner
    /// seen in a later one restarted, and is owed a release.
    lives: BTreeMap<String, u64>,
}

impl Running {
    fn stalled(&self, now_ns: u64) -> bool {
        self.stalled_until.is_some_and(|until| until > now_ns)
    }

    /// What the driver passes as `suspected` when it places a check: members its failure
    /// detector holds suspect or dead. A departed member is not taken over from: its hand-off
    /// carries its last decisions.
    fn suspects(&self, id: &str, departed_too: bool) -> bool {
        match self.membership.state_of(id) {
            Some(MemberState::Suspect | MemberState::Dead) => true,
            Some(MemberState::Left) => departed_too,
            _ => false,
        }
    }

    fn known(&self, slot: u16) -> u64 {
        self.known.get(&slot).copied().unwrap_or(0)
    }
}

#[derive(Debug)]
struct SimNode {
    id: String,
    /// The node's current life, when it runs.
    life: Option<Running>,
    /// Lives started so far (each restart is a later incarnation).
    lives: u64,
    /// Left for good: never restarted.
    gone: bool,
    /// What its current (or last) life speaks, and what it says it speaks (the same, but for
    /// `old_build_claims_newest`).
    versions: VersionRange,
    claimed: VersionRange,
}

/// How a run ended well.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimReport {
    /// Instants the invariant was checked at (every slot, every running node).
    pub checks: u64,
    /// Instants where two nodes decided a slot inside a named window.
    pub windows_seen: u64,
    pub table_switches: u64,
    pub handoffs_completed: u64,
    /// Releases sent to an owner seen in a new life it joined before the sender heard of it.
    pub restart_releases: u64,
    pub messages: u64,
    /// Every event of the run, in order, in one number (see [`TraceDigest`]).
    pub digest: u64,
    /// The highest cluster version any node computed, and each running node's at the end (0:
    /// its members shared none).
    pub newest_cluster_version: u8,
    pub cluster_versions_at_end: Vec<u8>,
    /// Checks clients sent, and how many were marked as takeovers (their owner's breaker open).
    pub client_checks: u64,
    pub takeovers_sent: u64,
    /// Decisions nodes made, and of those: takeovers, forwarded checks decided by a node its own
    /// table does not name, and forwards decided by their forwarder when unanswered.
    pub decisions: u64,
    pub takeovers: u64,
    pub forwarded_decided: u64,
    pub unanswered_decided: u64,
    /// Forwards sent, and those whose owner did not answer in time.
    pub forwards: u64,
    pub forwards_unanswered: u64,
    /// Checks answered `TryAgain` (no decision), and the attempts clients sent again for them.
    pub try_again: u64,
    pub try_again_retries: u64,
    /// Stalls, and those during which a client opened its breaker for the stalled node and
    /// sent a takeover for one of its slots.
    pub stalls: u64,
    pub stalls_with_takeovers: u64,
    /// Decisions made while another node that decides the slot was stalled (a stall shorter
    /// than the suspicion timeout must leave none).
    pub stall_second_deciders: u64,
    /// Pairs of deciders excused by [`Window::OwnerSuspected`].
    pub owner_suspected_pairs: u64,
    /// Slots whose state a hand-off brought to a node whose table gives them to a third
    /// member (its view differed from the sender's, window 4): sent on to that owner, or, when
    /// that message was lost or the table names the sender, counted as lost.
    pub passed_on_slots: u64,
    pub stranded_handoff_slots: u64,
    /// Checks decided through the driver's shortcut for a node alone in its table.
    pub shortcut_decisions: u64,
    /// Nodes that founded a cluster (started with seeds, none settled, the seed chosen to).
    pub foundings: u64,
}

/// How a run failed: the seed, what broke, and the last events before it.
#[derive(Debug, Clone)]
pub struct SimFailure {
    pub seed: u64,
    pub message: String,
    pub trace: Vec<String>,
}

impl std::fmt::Display for SimFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "seed {}: {} (replay: FLOODGATE_SIM_SEED={})",
            self.seed, self.message, self.seed
        )?;
        for line in &self.trace {
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}

/// Time between the starts of the first nodes.
const STAGGER_NS: u64 = 400_000_000;

/// How late a sabotaged node (`send_before_switch`) switches after sending its hand-offs.
const LATE_SWITCH_NS: u64 = 50_000_000;

/// Longest a forwarded check waits for this node's table to name it (as the driver does).
const TABLE_CATCH_UP_NS: u64 = 300_000_000;

/// Lines of trace kept for a failure report.
const TRACE_LINES: usize = 60;

/// The one region every simulated node is a member of.
const SIM_REGION: &str = "sim";

/// With `rolling_upgrade`: time between two nodes' upgrades.
pub const UPGRADE_STEP_NS: u64 = 400_000_000;

/// One simulation run.
#[derive(Debug)]
pub struct Sim {
    seed: u64,
    config: SimConfig,
    rng: SplitMix64,
    now_ns: u64,
    nodes: Vec<SimNode>,
    /// Messages by delivery instant, then send order (ties keep their order).
    network: BTreeMap<(u64, u64), (String, Payload)>,
    sent: u64,
    trace: VecDeque<String>,
    digest: TraceDigest,
    report: SimReport,
    /// Each machine's change count at the last check (by node index).
    checked: Vec<u64>,
    /// Tables by owner set (sorted ids).
    tables: BTreeMap<Vec<String>, SlotTable>,
    clients: Vec<SimClient>,
    /// Ids of checks and forwards.
    next_id: u64,
    /// Decisions by nodes their table does not name (takeovers, forwards) at this instant:
    /// (slot, node index, how).
    instant_decisions: Vec<(u16, usize, How)>,
    instant_of_decisions: u64,
    /// Per slot, its decisions made outside every window: each must be in the state of the
    /// next node to decide the slot outside a window (through a hand-off), or that decision
    /// is made blind to them, and a limit admits them twice.
    made: BTreeMap<u16, u64>,
}

impl Sim {
    pub fn new(seed: u64, config: SimConfig) -> Self {
        let mut sim = Sim {
            seed,
            rng: SplitMix64::new(seed),
            now_ns: 1_000_000_000,
            nodes: Vec::new(),
            network: BTreeMap::new(),
            sent: 0,
            trace: VecDeque::new(),
            digest: TraceDigest::default(),
            report: SimReport {
                checks: 0,
                windows_seen: 0,
                table_switches: 0,
                handoffs_completed: 0,
                restart_releases: 0,
                messages: 0,
                digest: 0,
                newest_cluster_version: 0,
                cluster_versions_at_end: Vec::new(),
                client_checks: 0,
                takeovers_sent: 0,
                decisions: 0,
                takeovers: 0,
                forwarded_decided: 0,
                unanswered_decided: 0,
                forwards: 0,
                forwards_unanswered: 0,
                try_again: 0,
                try_again_retries: 0,
                stalls: 0,
                stalls_with_takeovers: 0,
                stall_second_deciders: 0,
                owner_suspected_pairs: 0,
                passed_on_slots: 0,
                stranded_handoff_slots: 0,
                shortcut_decisions: 0,
                foundings: 0,
            },
            checked: Vec::new(),
            tables: BTreeMap::new(),
            clients: (0..config.clients).map(|_| SimClient::default()).collect(),
            next_id: 0,
            instant_decisions: Vec::new(),
            instant_of_decisions: 0,
            made: BTreeMap::new(),
            config,
        };
        sim.add_node();
        sim
    }

    /// A crash loses the decisions only the crashed life knew of (the failure model's loss,
    /// bounded by replication, which this simulation leaves out): nobody who decides the slot
    /// later can hold them.
    fn lose_state_of(&mut self, index: usize) {
        let Some(life) = self.nodes[index].life.as_ref() else {
            return;
        };
        let slots: Vec<u16> = life.known.keys().copied().collect();
        self.lose(slots.into_iter(), Some(index));
    }

    /// The state of `slots` held by a crashed life (`crashed`) or a hand-off lost or sent to
    /// a node that is down is gone: each slot's decisions to account for fall to what some
    /// other living node that has not handed the slot off, or a hand-off still on its way,
    /// holds.
    fn lose(&mut self, slots: impl Iterator<Item = u16>, crashed: Option<usize>) {
        let mut kept: BTreeMap<u16, u64> = BTreeMap::new();
        let mut keep = |slot: u16, n: u64| {
            let k = kept.entry(slot).or_insert(0);
            *k = (*k).max(n);
        };
        for (j, node) in self.nodes.iter().enumerate() {
            if let Some(other) = node.life.as_ref().filter(|_| Some(j) != crashed) {
                other
                    .known
                    .iter()
                    .filter(|(slot, _)| !other.ownership.gave_away(**slot))
                    .for_each(|(&slot, &n)| keep(slot, n));
            }
        }
        for (_, payload) in self.network.values() {
            if let Payload::HandoffPart(HandoffDelivery { known, .. })
            | Payload::PassedOn { known } = payload
            {
                known.iter().for_each(|&(slot, n)| keep(slot, n));
            }
        }
        for slot in slots {
            let kept = kept.get(&slot).copied().unwrap_or(0);
            if let Some(made) = self.made.get_mut(&slot) {
                *made = (*made).min(kept);
            }
        }
    }

    /// Runs to the end, checking the invariant at every change.
    pub fn run(mut self) -> Result<SimReport, SimFailure> {
        let start = self.now_ns;
        let end = start + self.config.duration_ns;
        while self.now_ns < end {
            // The first nodes start one after another, as a rollout does (each has joined
            // before the next starts), or all at once; later joins and restarts come at any
            // time.
            if self.nodes.len() < self.config.nodes
                && (self.config.started_together
                    || self.now_ns >= start + self.nodes.len() as u64 * STAGGER_NS)
            {
                self.add_node();
            }
            self.deliver_due()?;
            self.step_nodes()?;
            self.step_clients();
            self.inject_faults()?;
            self.upgrade_due(start);
            self.check()?;
            self.check_versions()?;
            self.now_ns += self.config.tick_ns;
        }
        self.report.digest = self.digest.value();
        self.report.cluster_versions_at_end = self
            .running()
            .iter()
            .filter_map(|&i| self.nodes[i].life.as_ref())
            .map(|l| l.membership.cluster_version().unwrap_or(0))
            .collect();
        Ok(self.report)
    }

    /// With `rolling_upgrade`: restarts the next first-node still in its first life into this
    /// build, once its turn has come.
    fn upgrade_due(&mut self, start: u64) {
        if !self.config.rolling_upgrade {
            return;
        }
        let first = start + self.config.duration_ns * 2 / 5;
        for index in 0..self.config.nodes.min(self.nodes.len()) {
            let due = first + index as u64 * UPGRADE_STEP_NS;
            let node = &self.nodes[index];
            let running = node.life.as_ref().is_some_and(|l| l.stops_at.is_none());
            if self.now_ns >= due && running && node.lives == 1 {
                let id = node.id.clone();
                // Stopped without a leave, as a crash: what only it held is lost.
                self.lose_state_of(index);
                self.nodes[index].life = None;
                self.log(format!("{id} stops to be upgraded"));
                self.start(index);
            }
        }
    }

    /// Each running node's cluster version is spoken by every member it knows in that member's
    /// current life (a member it knows only in an older life may have restarted as another
    /// build; gossip of the new life corrects that within rounds, and the connections between
    /// two nodes agree on their own version whatever either believes).
    fn check_versions(&mut self) -> Result<(), SimFailure> {
        for a in self.running() {
            let Some(life) = self.nodes[a].life.as_ref() else {
                continue;
            };
            let version = life.membership.cluster_version();
            for b in self.running() {
                let Some(other) = self.nodes[b].life.as_ref() else {
                    continue;
                };
                let id = &self.nodes[b].id;
                let current = life.membership.incarnation_of(id)
                    == Some(other.membership.incarnation())
                    && life
                        .membership
                        .state_of(id)
                        .is_some_and(MemberState::owns_slots);
                if current && !version.is_some_and(|v| self.nodes[b].versions.contains(v)) {
                    return Err(self.fail(format!(
                        "{} speaks cluster version {version:?}, which {id} ({}) does not",
                        self.nodes[a].id, self.nodes[b].versions
                    )));
                }
            }
            let newest = &mut self.report.newest_cluster_version;
            *newest = (*newest).max(version.unwrap_or(0));
        }
        Ok(())
    }

    fn log(&mut self, line: String) {
        if self.trace.len() == TRACE_LINES {
            self.trace.pop_front();
        }
        let line = format!("{:>6} ms  {line}", self.now_ns / 1_000_000);
        self.digest.add(&line);
        self.trace.push_back(line);
    }

    fn fail(&self, message: String) -> SimFailure {
        SimFailure {
            seed: self.seed,
            message,
            trace: self.trace.iter().cloned().collect(),
        }
    }

    fn id_of(index: usize) -> String {
        format!("n{index}")
    }

    /// A new node (the first has no seeds; the others seed with the first two).
    fn add_node(&mut self) {
        let index = self.nodes.len();
        self.nodes.push(SimNode {
            id: Self::id_of(index),
            life: None,
            lives: 0,
            gone: false,
            versions: protocol::SUPPORTED,
            claimed: protocol::SUPPORTED,
        });
        self.checked.push(u64::MAX);
        self.start(index);
    }

    fn start(&mut self, index: usize) {
        let id = self.nodes[index].id.clone();
        let first_life = self.nodes[index].lives == 0;
        let seeds: Vec<String> =
            if self.config.started_together && first_life && index < self.config.nodes {
                (0..self.config.nodes)
                    .filter(|&i| !self.config.seeds_omit_self || i != index)
                    .map(Self::id_of)
                    .collect()
            } else if index == 0 && first_life {
                Vec::new()
            } else {
                (0..self.nodes.len().min(2))
                    .filter(|&i| i != index)
                    .map(Self::id_of)
                    .collect()
            };
        let info = MemberInfo {
            id: id.clone(),
            addr: id.clone(),
            region: SIM_REGION.to_owned(),
        };
        self.nodes[index].lives += 1;
        // A later life has a later incarnation, as a restart's start time is.
        let incarnation = self.now_ns / 1_000_000;
        let old_build = self.config.rolling_upgrade
            && index < self.config.nodes
            && self.nodes[index].lives == 1;
        let versions = if old_build {
            protocol::UNKNOWN_MEMBER
        } else {
            protocol::SUPPORTED
        };
        self.nodes[index].versions = versions;
        let claimed = if old_build && !self.config.old_build_claims_newest {
            versions
        } else {
            protocol::SUPPORTED
        };
        self.nodes[index].claimed = claimed;
        let membership = Membership::new(
            info,
            incarnation,
            seeds.clone(),
            self.config.membership,
            self.now_ns,
            self.rng.next_u64(),
        )
        .with_versions(claimed);
        let table = self.table(membership.epoch(), &membership.owners());
        let ownership = Ownership::new(
            id.clone(),
            table,
            !seeds.is_empty(),
            self.now_ns,
            self.config.ownership,
        );
        self.nodes[index].life = Some(Running {
            membership,
            ownership,
            started_ns: self.now_ns,
            stops_at: None,
            switched_later: None,
            stalled_until: None,
            stall_opened_breaker: false,
            stall_takeover_sent: false,
            forwards: BTreeMap::new(),
            catching_up: Vec::new(),
            known: BTreeMap::new(),
            switch_due: None,
            lives: BTreeMap::new(),
        });
        self.log(format!(
            "{id} starts (life {}, seeds {seeds:?})",
            self.nodes[index].lives
        ));
    }

    /// The table of `owners` at `epoch`, computed once per owner set.
    fn table(&mut self, epoch: u64, owners: &[String]) -> Arc<SlotTable> {
        let mut key = owners.to_vec();
        key.sort();
        let base = self
            .tables
            .entry(key)
            .or_insert_with(|| SlotTable::compute(0, owners));
        Arc::new(base.with_epoch(epoch))
    }

    /// Puts `payload` on the network, or loses it (returns whether it went).
    fn send(&mut self, to: String, payload: Payload) -> bool {
        if self.rng.chance(self.config.loss_per_mille * 1_000) {
            return false;
        }
        let copies = if self.rng.chance(self.config.duplicate_per_mille * 1_000) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let delay = self
                .rng
                .range(self.config.min_delay_ns, self.config.max_delay_ns);
            self.sent += 1;
            self.report.messages += 1;
            self.network.insert(
                (self.now_ns + delay, self.sent),
                (to.clone(), payload.clone()),
            );
        }
        true
    }

    fn index_of(&self, id: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.id == id)
    }

    fn deliver_due(&mut self) -> Result<(), SimFailure> {
        while let Some(entry) = self.network.first_entry() {
            if entry.key().0 > self.now_ns {
                break;
            }
            let (to, payload) = entry.remove();
            if let Payload::ClientAnswer { client, id, answer } = payload {
                self.client_answered(client, id, answer);
                continue;
            }
            let Some(index) = self.index_of(&to) else {
                continue;
            };
            let now = self.now_ns;
            let Some(life) = self.nodes[index].life.as_mut() else {
                if let Payload::HandoffPart(HandoffDelivery { known, .. })
                | Payload::PassedOn { known } = payload
                {
                    // Sent to a node that is down: the state it carried is lost with it.
                    self.lose(known.into_iter().map(|(slot, _)| slot), None);
                }
                continue;
            };
            if let Some(until) = life.stalled_until.filter(|&until| until > now) {
                // A stalled node reads nothing: the message waits in its buffers.
                self.sent += 1;
                self.network.insert((until, self.sent), (to, payload));
                continue;
            }
            match payload {
                Payload::Check {
                    client,
                    id,
                    slot,
                    takeover,
                } => self.handle_check(index, client, id, slot, takeover)?,
                Payload::Forward {
                    from,
                    id,
                    slot,
                    version,
                } => self.handle_forward(index, from, id, slot, version)?,
                Payload::ForwardAnswer { id, answer } => {
                    self.handle_forward_answer(index, id, answer)?
                }
                Payload::ClientAnswer { .. } => {}
                Payload::Gossip(sender, from, gossip) => {
                    self.deliver_gossip(index, &sender, from, gossip)
                }
                Payload::HandoffPart(part) => self.deliver_handoff_part(index, part),
                Payload::PassedOn { known } => {
                    for (slot, n) in known {
                        let mine = life.known.entry(slot).or_insert(0);
                        *mine = (*mine).max(n);
                    }
                }
            }
            self.check()?;
        }
        Ok(())
    }

    /// A gossip message reaches a running node: read as over QUIC (no shared version, no
    /// connection; version 2's layout has no ranges, and layouts before 8 do not say who is
    /// joining; only the sender's own digest is its word), then the node's table follows, at
    /// once or after the switch lag.
    fn deliver_gossip(
        &mut self,
        index: usize,
        sender: &str,
        from: VersionRange,
        mut gossip: Gossip,
    ) {
        let now = self.now_ns;
        let receiver = self.nodes[index].versions;
        let Some(agreed) = from.highest_shared(receiver) else {
            return;
        };
        if !Feature::MemberVersions.readable_at(agreed) {
            gossip.members.iter_mut().for_each(|d| d.versions = None);
        }
        if !Feature::SettledJoins.readable_at(agreed) {
            gossip.members.iter_mut().for_each(|d| d.joining = false);
        }
        let life = self.nodes[index]
            .life
            .as_mut()
            .expect("delivered to a running node");
        let own = |member: &str| member == sender;
        drop(life.membership.handle_gossip_from(now, &own, &gossip));
        if self.config.switch_lag_ns == 0 {
            self.update_table(index);
        } else {
            life.switch_due
                .get_or_insert(now + self.config.switch_lag_ns);
        }
    }

    /// A hand-off part reaches a running node. The driver merges a part's buckets whether or
    /// not the machine counts it, and sends on those of slots its table gives to a third
    /// member (the sender's view was not its own, window 4) to that owner.
    fn deliver_handoff_part(&mut self, index: usize, delivery: HandoffDelivery) {
        let now = self.now_ns;
        let to = self.nodes[index].id.clone();
        let HandoffDelivery {
            from,
            id,
            part,
            parts,
            slots,
            known,
        } = delivery;
        let life = self.nodes[index]
            .life
            .as_mut()
            .expect("delivered to a running node");
        let mut passed: BTreeMap<String, Vec<(u16, u64)>> = BTreeMap::new();
        let mut stranded = Vec::new();
        for (slot, n) in known {
            let mine = life.known.entry(slot).or_insert(0);
            *mine = (*mine).max(n);
            match life.ownership.table().owner(slot) {
                _ if n == 0 => {}
                Some(owner) if owner == to => {}
                Some(owner) if owner != from => {
                    passed.entry(owner.to_owned()).or_default().push((slot, n));
                }
                // Ours once our table catches up with the sender's; until then counted as
                // lost, should it never.
                _ => stranded.push(slot),
            }
        }
        let received = ReceivedPart {
            id,
            part,
            parts,
            slots: &slots,
        };
        if life.ownership.handle_handoff(now, &from, received) {
            self.report.handoffs_completed += 1;
            self.log(format!(
                "{to} completed hand-off {id} from {from} ({} slots)",
                slots.len()
            ));
        }
        if self.config.keep_stranded {
            passed.clear();
        }
        for (owner, known) in passed {
            self.report.passed_on_slots += known.len() as u64;
            let slots: Vec<u16> = known.iter().map(|&(slot, _)| slot).collect();
            if !self.send(owner, Payload::PassedOn { known }) {
                stranded.extend(slots);
            }
        }
        if !stranded.is_empty() {
            self.report.stranded_handoff_slots += stranded.len() as u64;
            self.lose(stranded.into_iter(), None);
        }
    }

    /// As the node's driver does at every membership change: owners of the node's table seen
    /// in a later life (already joined, so still owners) get the release their new life waits
    /// for ([`Ownership::handle_restarted`]).
    fn release_to_restarted(&mut self, index: usize) {
        let Some(life) = self.nodes[index].life.as_mut() else {
            return;
        };
        let owners = life.membership.owners();
        let mut restarted = Vec::new();
        for (info, _) in life.membership.members() {
            let Some(incarnation) = life.membership.incarnation_of(&info.id) else {
                continue;
            };
            let before = life.lives.insert(info.id.clone(), incarnation);
            if before.is_some_and(|b| b < incarnation)
                && owners.contains(&info.id)
                && life.ownership.table().contains(&info.id)
            {
                restarted.push(info.id.clone());
            }
        }
        if restarted.is_empty() {
            return;
        }
        for member in &restarted {
            life.ownership.handle_restarted(member);
        }
        self.report.restart_releases += restarted.len() as u64;
        let id = self.nodes[index].id.clone();
        self.log(format!("{id} releases to restarted owners {restarted:?}"));
        self.carry_out(index);
    }

    /// Switches a node's table when its membership moved owners, and carries out its actions.
    fn update_table(&mut self, index: usize) {
        self.release_to_restarted(index);
        let now = self.now_ns;
        let (epoch, owners) = {
            let Some(life) = self.nodes[index].life.as_ref() else {
                return;
            };
            (life.membership.epoch(), life.membership.owners())
        };
        let Some(current) = self.nodes[index]
            .life
            .as_ref()
            .filter(|l| l.switched_later.is_none())
            .map(|l| l.ownership.table().epoch())
        else {
            return;
        };
        if current == epoch {
            return;
        }
        let new = self.table(epoch, &owners);
        let id = self.nodes[index].id.clone();
        let life = self.nodes[index].life.as_mut().expect("running");
        // As the node's driver does: a node that founded the cluster (its membership joined
        // with nobody else) joins nothing, and the machine hears its region's version before
        // each switch (every simulated node is of one region).
        if owners.len() == 1 && !life.membership.is_joining() && life.ownership.is_joining() {
            life.ownership.handle_no_one_to_join(now);
            self.report.foundings += 1;
        }
        if !self.config.guessing_newcomers {
            let version = life.membership.region_version(SIM_REGION).unwrap_or(0);
            life.ownership.handle_region_version(version);
        }
        let membership = &life.membership;
        let announced_leave = |member: &str| membership.state_of(member) == Some(MemberState::Left);
        if self.config.send_before_switch {
            let mut switched = life.ownership.clone();
            switched.handle_table(now, new, announced_leave);
            let actions: Vec<Action> = std::iter::from_fn(|| switched.poll_action()).collect();
            life.switched_later = Some((now + LATE_SWITCH_NS, switched));
            self.carry_out_actions(index, actions);
            return;
        }
        life.ownership.handle_table(now, new, announced_leave);
        self.report.table_switches += 1;
        self.log(format!("{id} switches to epoch {epoch}: owners {owners:?}"));
        self.carry_out(index);
    }

    fn carry_out(&mut self, index: usize) {
        let actions: Vec<Action> = match self.nodes[index].life.as_mut() {
            Some(life) => std::iter::from_fn(|| life.ownership.poll_action()).collect(),
            None => return,
        };
        self.carry_out_actions(index, actions);
    }

    fn carry_out_actions(&mut self, index: usize, actions: Vec<Action>) {
        let id = self.nodes[index].id.clone();
        // Hand-offs after `Joined` in one batch are the join's announcements.
        let mut announcing = false;
        for action in actions {
            match action {
                Action::Joined => {
                    announcing = true;
                    self.log(format!("{id} joined"));
                }
                Action::HandOff(handoff) => {
                    let parts = self.rng.range(1, 3) as u32;
                    self.log(format!(
                        "{id} hands {} slots to {} (hand-off {}, {parts} parts)",
                        handoff.slots.len(),
                        handoff.to,
                        handoff.id,
                    ));
                    // Exported after the switch, as the driver does: every decision made here
                    // of the slots the recipient owns in the switched table.
                    let known: Vec<(u16, u64)> = match &self.nodes[index].life {
                        _ if announcing && self.config.joined_hands_nothing => Vec::new(),
                        Some(life) => {
                            let table = life
                                .switched_later
                                .as_ref()
                                .map_or(life.ownership.table(), |(_, m)| m.table());
                            handoff
                                .slots
                                .iter()
                                .filter(|&&slot| table.owner(slot) == Some(handoff.to.as_str()))
                                .map(|&slot| (slot, life.known(slot)))
                                .collect()
                        }
                        None => Vec::new(),
                    };
                    let mut lost = false;
                    for part in 0..parts {
                        let payload = Payload::HandoffPart(HandoffDelivery {
                            from: id.clone(),
                            id: handoff.id,
                            part,
                            parts,
                            slots: handoff.slots.clone(),
                            known: known.clone(),
                        });
                        lost |= !self.send(handoff.to.clone(), payload);
                    }
                    if lost {
                        // What the lost part carried (each carries it all here) is gone unless
                        // another part, or its sender, still holds it.
                        self.lose(known.iter().map(|&(slot, _)| slot), None);
                    }
                }
            }
        }
    }

    /// Gossip rounds, timers, the join wait, and stops after a leave's linger.
    fn step_nodes(&mut self) -> Result<(), SimFailure> {
        let now = self.now_ns;
        for index in 0..self.nodes.len() {
            let Some(life) = self.nodes[index].life.as_mut() else {
                continue;
            };
            if life.stalled(now) {
                continue;
            }
            if life.stalled_until.take().is_some() {
                let both = life.stall_opened_breaker && life.stall_takeover_sent;
                self.report.stalls_with_takeovers += u64::from(both);
                let id = self.nodes[index].id.clone();
                self.log(format!("{id} resumes"));
            }
            let Some(life) = self.nodes[index].life.as_mut() else {
                continue;
            };
            if life.stops_at.is_some_and(|at| at <= now) {
                let id = self.nodes[index].id.clone();
                self.nodes[index].life = None;
                self.nodes[index].gone = true;
                self.log(format!("{id} stops after its leave"));
                continue;
            }
            if life
                .switched_later
                .as_ref()
                .is_some_and(|(at, _)| *at <= now)
                && let Some((_, switched)) = life.switched_later.take()
            {
                life.ownership = switched;
            }
            // As the node's gossip tick does: the failure detector's verdicts (a departed
            // member's hand-off is on its way: waited for as an alive one's), then timers.
            let suspected: Vec<String> = life
                .membership
                .members()
                .filter(|(_, state)| matches!(state, MemberState::Suspect | MemberState::Dead))
                .map(|(info, _)| info.id.clone())
                .collect();
            life.ownership.handle_suspicion(suspected);
            if life.ownership.poll_timeout().is_some_and(|at| at <= now) {
                life.ownership.handle_timeout(now);
            }
            if life.ownership.phase() == Phase::Joining
                && now >= life.started_ns + self.config.join_wait_ns
            {
                life.ownership.handle_join_wait_expired();
                let id = self.nodes[index].id.clone();
                self.log(format!("{id} gave up waiting for the join: decides alone"));
            }
            let Some(life) = self.nodes[index].life.as_mut() else {
                continue;
            };
            let outgoing = life.membership.poll(now);
            let versions = self.nodes[index].claimed;
            let sender = self.nodes[index].id.clone();
            for message in outgoing {
                let gossip = Payload::Gossip(sender.clone(), versions, message.gossip);
                self.send(message.to, gossip);
            }
            let due = match self.nodes[index].life.as_mut() {
                Some(life) if life.switch_due.is_none_or(|at| at <= now) => {
                    life.switch_due = None;
                    true
                }
                _ => false,
            };
            if due {
                self.update_table(index);
            }
            self.step_driver(index)?;
        }
        self.check()
    }

    /// The driver's timers: forwards unanswered in time are placed again, and forwarded checks
    /// whose table caught up (or whose wait ran out) are placed.
    fn step_driver(&mut self, index: usize) -> Result<(), SimFailure> {
        let now = self.now_ns;
        let me = self.nodes[index].id.clone();
        let Some(life) = self.nodes[index].life.as_mut() else {
            return Ok(());
        };
        let expired: Vec<u64> = life
            .forwards
            .iter()
            .filter(|(_, f)| f.deadline <= now)
            .map(|(&id, _)| id)
            .collect();
        let table = life.ownership.table().clone();
        let (ready, waiting): (Vec<CatchingUp>, Vec<CatchingUp>) =
            std::mem::take(&mut life.catching_up)
                .into_iter()
                .partition(|c| {
                    c.deadline <= now
                        || !table.contains(&me)
                        || table.owner(c.slot) == Some(me.as_str())
                });
        life.catching_up = waiting;
        for id in expired {
            let Some(forward) = self.nodes[index]
                .life
                .as_mut()
                .and_then(|l| l.forwards.remove(&id))
            else {
                continue;
            };
            self.report.forwards_unanswered += 1;
            self.place_forward_again(index, forward, Failed::Unanswered)?;
        }
        for waited in ready {
            self.answer_forward(index, waited.from, waited.id, waited.slot)?;
        }
        Ok(())
    }

    /// Where `index`'s driver places a check: the machine's answer, with `suspected` from its
    /// own membership (wrapped by the deliberately wrong drivers of the config).
    fn place(&self, index: usize, slot: u16, arrival: Arrival) -> Placement {
        let life = self.nodes[index].life.as_ref().expect("running");
        let machine = &life.ownership;
        let departed_too = self.config.take_over_from_departed;
        let suspects = |id: &str| life.suspects(id, departed_too);
        let always = |_: &str| true;
        let suspected: &dyn Fn(&str) -> bool =
            if self.config.takeover_without_suspicion && arrival == Arrival::Takeover {
                &always
            } else {
                &suspects
            };
        if self.config.decide_awaited_slots {
            let gave_away = |s| machine.gave_away(s);
            return first_place(
                machine.table(),
                machine.me(),
                slot,
                arrival,
                gave_away,
                suspected,
            );
        }
        machine.place(slot, arrival, self.now_ns, suspected)
    }

    /// As [`Sim::place`], after a forward failed.
    fn place_again(&self, index: usize, slot: u16, failed: &Failed, last_round: bool) -> Placement {
        let life = self.nodes[index].life.as_ref().expect("running");
        let machine = &life.ownership;
        let departed_too = self.config.take_over_from_departed;
        let suspects = |id: &str| life.suspects(id, departed_too);
        if self.config.decide_unanswered_without_suspicion && *failed == Failed::Unanswered {
            // Every joined node has given away each slot it does not own (its table of one
            // owned them all), so the hand-off record is ignored too, or the rule never applies.
            let placement = next_place(
                machine.table(),
                machine.me(),
                slot,
                failed,
                last_round,
                |_| false,
                |_| true,
            );
            let awaited = machine.awaits_handoff(std::iter::once(slot), self.now_ns);
            return match placement {
                Placement::Decide if awaited && !self.config.decide_awaited_slots => {
                    Placement::Refuse(Refusal::TryAgain)
                }
                placement => placement,
            };
        }
        if self.config.decide_awaited_slots {
            let gave_away = |s| machine.gave_away(s);
            return next_place(
                machine.table(),
                machine.me(),
                slot,
                failed,
                last_round,
                gave_away,
                suspects,
            );
        }
        machine.place_again(slot, failed, last_round, self.now_ns, suspects)
    }

    /// True when node `index` takes the driver's shortcut for a node alone in its table.
    fn decides_every_slot(&self, index: usize) -> bool {
        let machine = &self.nodes[index].life.as_ref().expect("running").ownership;
        if self.config.shortcut_ignores_handoffs {
            let me = machine.me();
            return machine.table().nodes().iter().all(|n| n == me);
        }
        machine.decides_every_slot()
    }

    /// A client's check reaches node `index`.
    fn handle_check(
        &mut self,
        index: usize,
        client: usize,
        id: u64,
        slot: u16,
        takeover: bool,
    ) -> Result<(), SimFailure> {
        let life = self.nodes[index].life.as_ref().expect("running");
        // The driver holds a check (bounded) until the join; not modelled: refused at once.
        if life.ownership.phase() == Phase::Joining {
            self.report.try_again += 1;
            self.answer_client(client, id, Answer::Refused(Refusal::TryAgain));
            return Ok(());
        }
        if self.decides_every_slot(index) {
            // The driver's shortcut: a whole frame decided here without placing its checks.
            self.report.shortcut_decisions += 1;
            self.decided(index, slot, How::Owner)?;
            self.answer_client(client, id, Answer::Decided);
            return Ok(());
        }
        let placement = self.place(index, slot, Arrival::from_client(takeover));
        let answer = match placement {
            Placement::Decide => {
                self.decided(index, slot, How::Forwarded)?;
                Answer::Decided
            }
            Placement::Takeover => {
                self.decided(index, slot, How::Takeover)?;
                Answer::Decided
            }
            Placement::Forward(owner) => {
                self.forward(index, client, id, slot, owner, false);
                return Ok(());
            }
            Placement::Refuse(refusal) => self.refused(refusal),
        };
        self.answer_client(client, id, answer);
        Ok(())
    }

    fn refused(&mut self, refusal: Refusal) -> Answer {
        if refusal == Refusal::TryAgain {
            self.report.try_again += 1;
        }
        Answer::Refused(refusal)
    }

    fn answer_client(&mut self, client: usize, id: u64, answer: Answer) {
        self.send(String::new(), Payload::ClientAnswer { client, id, answer });
    }

    /// Node `index` forwards a client's check to `owner`.
    fn forward(
        &mut self,
        index: usize,
        client: usize,
        check: u64,
        slot: u16,
        owner: String,
        last_round: bool,
    ) {
        self.next_id += 1;
        let id = self.next_id;
        let deadline = self.now_ns + self.config.forward_timeout_ns;
        let from = self.nodes[index].id.clone();
        let life = self.nodes[index].life.as_mut().expect("running");
        let version = life.ownership.table().version();
        life.forwards.insert(
            id,
            PendingForward {
                client,
                check,
                slot,
                owner: owner.clone(),
                deadline,
                last_round,
            },
        );
        self.report.forwards += 1;
        self.send(
            owner,
            Payload::Forward {
                from,
                id,
                slot,
                version,
            },
        );
    }

    /// A forwarded check reaches node `index`: unless the sender is behind, it waits (bounded)
    /// for this node's table to name it, as the driver does.
    fn handle_forward(
        &mut self,
        index: usize,
        from: String,
        id: u64,
        slot: u16,
        version: u64,
    ) -> Result<(), SimFailure> {
        let now = self.now_ns;
        let me = self.nodes[index].id.clone();
        let life = self.nodes[index].life.as_mut().expect("running");
        let table = life.ownership.table();
        let caught_up = life.ownership.had_version(version)
            || !table.contains(&me)
            || table.owner(slot) == Some(me.as_str());
        if !caught_up {
            life.catching_up.push(CatchingUp {
                deadline: now + TABLE_CATCH_UP_NS,
                from,
                id,
                slot,
            });
            return Ok(());
        }
        self.answer_forward(index, from, id, slot)
    }

    /// Node `index` places a forwarded check and answers its forwarder.
    fn answer_forward(
        &mut self,
        index: usize,
        from: String,
        id: u64,
        slot: u16,
    ) -> Result<(), SimFailure> {
        let life = self.nodes[index].life.as_ref().expect("running");
        let answer = if life.ownership.phase() == Phase::Joining {
            self.refused(Refusal::TryAgain)
        } else {
            match self.place(index, slot, Arrival::Forwarded) {
                Placement::Decide | Placement::Takeover => {
                    self.decided(index, slot, How::Forwarded)?;
                    Answer::Decided
                }
                // A forwarded check is never sent on.
                Placement::Forward(_) => Answer::Refused(Refusal::ShuttingDown),
                Placement::Refuse(refusal) => self.refused(refusal),
            }
        };
        self.send(from, Payload::ForwardAnswer { id, answer });
        Ok(())
    }

    /// The owner's answer to a forward of node `index` (ignored after its timeout).
    fn handle_forward_answer(
        &mut self,
        index: usize,
        id: u64,
        answer: Answer,
    ) -> Result<(), SimFailure> {
        let life = self.nodes[index].life.as_mut().expect("running");
        let Some(forward) = life.forwards.remove(&id) else {
            return Ok(());
        };
        if answer == Answer::Refused(Refusal::NotOwner) {
            let refuser = Failed::NotOwner(forward.owner.clone());
            return self.place_forward_again(index, forward, refuser);
        }
        self.answer_client(forward.client, forward.check, answer);
        Ok(())
    }

    /// A forward of node `index` failed: placed again by the machine, once more at most.
    fn place_forward_again(
        &mut self,
        index: usize,
        forward: PendingForward,
        failed: Failed,
    ) -> Result<(), SimFailure> {
        let placement = self.place_again(index, forward.slot, &failed, forward.last_round);
        let answer = match placement {
            Placement::Decide | Placement::Takeover => {
                let how = if failed == Failed::Unanswered {
                    How::Unanswered
                } else {
                    How::Forwarded
                };
                self.decided(index, forward.slot, how)?;
                Answer::Decided
            }
            Placement::Forward(owner) if !forward.last_round => {
                self.forward(
                    index,
                    forward.client,
                    forward.check,
                    forward.slot,
                    owner,
                    true,
                );
                return Ok(());
            }
            Placement::Forward(_) => Answer::Refused(Refusal::ShuttingDown),
            Placement::Refuse(refusal) => self.refused(refusal),
        };
        self.answer_client(forward.client, forward.check, answer);
        Ok(())
    }

    /// Node `index` decided `slot` now, as `how`: every other node deciding the slot at this
    /// instant (its machine names it the deciding owner, stalled or not, or it decided the slot
    /// outside its table at this same instant) must be excused by a named window, and a
    /// decision outside every window must see every earlier one of the slot.
    fn decided(&mut self, index: usize, slot: u16, how: How) -> Result<(), SimFailure> {
        let how = self.count_decision(index, slot, how);
        let pairs = self.other_deciders(index, slot, how);
        let blind = self.blind_decision(index, slot, how, pairs.excused);
        let life = self.nodes[index].life.as_mut().expect("running");
        if blind.windowed {
            // A window's decisions are the over-admission it allows; from here this node's
            // state stands for the slot.
            life.known.insert(slot, blind.known.max(blind.made));
        } else {
            self.made.insert(slot, blind.made + 1);
            life.known.insert(slot, blind.made + 1);
        }
        self.report.stall_second_deciders += pairs.stalled;
        self.report.owner_suspected_pairs += pairs.suspected;
        if how != How::Owner {
            let id = self.nodes[index].id.clone();
            self.log(format!("{id} decides slot {slot} ({how:?})"));
            self.instant_decisions.push((slot, index, how));
        }
        match pairs.failure.or(blind.failure) {
            Some(message) => Err(self.fail(message)),
            None => Ok(()),
        }
    }

    /// Counts a decision in the report and says how it was made: the owner by its own table
    /// decides as the machine check sees it; anything else is a decision outside the
    /// machine's view.
    fn count_decision(&mut self, index: usize, slot: u16, how: How) -> How {
        let now = self.now_ns;
        let machine = &self.nodes[index].life.as_ref().expect("running").ownership;
        let how = if machine.table().owner(slot) == Some(machine.me()) && how != How::Takeover {
            How::Owner
        } else {
            how
        };
        self.report.decisions += 1;
        match how {
            How::Owner => {}
            How::Takeover => self.report.takeovers += 1,
            How::Forwarded => self.report.forwarded_decided += 1,
            How::Unanswered => self.report.unanswered_decided += 1,
        }
        if self.instant_of_decisions != now {
            self.instant_of_decisions = now;
            self.instant_decisions.clear();
        }
        how
    }

    /// Every other node deciding `slot` now beside node `index`'s decision, each pair
    /// excused or not.
    fn other_deciders(&self, index: usize, slot: u16, how: How) -> Pairs {
        let now = self.now_ns;
        let life = self.nodes[index].life.as_ref().expect("running");
        let machine = &life.ownership;
        let mut pairs = Pairs::default();
        for (j, node) in self.nodes.iter().enumerate() {
            let Some(other) = node.life.as_ref().filter(|_| j != index) else {
                continue;
            };
            let tenure = other.ownership.decides(slot, now);
            let at_once = self
                .instant_decisions
                .iter()
                .find(|(s, k, _)| *s == slot && *k == j)
                .cloned();
            if !tenure && at_once.is_none() {
                continue;
            }
            let mine = suspected_by(life, how, other.ownership.me());
            let theirs = at_once
                .as_ref()
                .and_then(|(_, _, h)| suspected_by(other, *h, machine.me()));
            let a = machine;
            let b = &other.ownership;
            let split = !a.table().contains(b.me()) && !b.table().contains(a.me());
            let guesses = !self.config.guessing_newcomers;
            let by_machine =
                split || excuses(a, b, slot, now, guesses) || excuses(b, a, slot, now, guesses);
            let by_suspicion = mine.is_some() || theirs.is_some();
            let excused = self.config.excuse_windows && (by_machine || by_suspicion);
            pairs.excused += u32::from(excused);
            if excused && !by_machine {
                pairs.suspected += 1;
            }
            // Beside a stalled owner, only the machine's windows (a table switch meanwhile)
            // may excuse a second decider: a stall is too short for suspicion.
            if tenure && other.stalled(now) && !by_machine {
                pairs.stalled += 1;
            }
            if !excused && pairs.failure.is_none() {
                pairs.failure = Some(format!(
                    "slot {slot} decided by {} ({how:?}, window {:?}) while {} decides it \
                     ({}{}, window {:?}); {} holds {} {:?}; tables of epochs {} {:?} and {} {:?}",
                    a.me(),
                    mine.or(a.window(slot, now)),
                    b.me(),
                    if tenure {
                        "its owner"
                    } else {
                        "at this instant"
                    },
                    if other.stalled(now) { ", stalled" } else { "" },
                    theirs.or(b.window(slot, now)),
                    a.me(),
                    b.me(),
                    life.membership.state_of(b.me()),
                    a.table().epoch(),
                    a.table().nodes(),
                    b.table().epoch(),
                    b.table().nodes(),
                ));
            }
        }
        pairs
    }

    /// Blind decisions: outside every window, node `index`'s state must hold every decision
    /// of the slot made outside a window (its own, or brought by a hand-off).
    fn blind_decision(&self, index: usize, slot: u16, how: How, excused_pairs: u32) -> Blind {
        let now = self.now_ns;
        let life = self.nodes[index].life.as_ref().expect("running");
        let machine = &life.ownership;
        let owner_suspected = matches!(how, How::Takeover | How::Unanswered)
            && machine
                .table()
                .owner(slot)
                .is_some_and(|owner| suspected_by(life, how, owner).is_some());
        let windowed = self.config.excuse_windows
            && (machine.window(slot, now).is_some() || owner_suspected || excused_pairs > 0);
        let made = self.made.get(&slot).copied().unwrap_or(0);
        let known = life.known(slot);
        let failure = (!windowed && known < made).then(|| {
            format!(
                "slot {slot} decided by {} ({how:?}) blind to {} of its {made} decisions: its \
                 state holds {known}; {} holds its owner {:?} {:?}; table of epoch {} {:?}",
                machine.me(),
                made - known,
                machine.me(),
                machine.table().owner(slot),
                machine
                    .table()
                    .owner(slot)
                    .and_then(|o| life.membership.state_of(o)),
                machine.table().epoch(),
                machine.table().nodes(),
            )
        });
        Blind {
            windowed,
            made,
            known,
            failure,
        }
    }

    /// Clients: refresh their view, count timeouts against breakers, send checks.
    fn step_clients(&mut self) {
        let now = self.now_ns;
        for c in 0..self.clients.len() {
            if self.clients[c].view.is_none() || now >= self.clients[c].refresh_at {
                // Routes from any node that answers: possibly behind the others.
                let reachable: Vec<usize> = self
                    .running()
                    .into_iter()
                    .filter(|&i| self.nodes[i].life.as_ref().is_some_and(|l| !l.stalled(now)))
                    .collect();
                if !reachable.is_empty() {
                    let i = reachable[self.rng.range(0, reachable.len() as u64 - 1) as usize];
                    let table = self.nodes[i]
                        .life
                        .as_ref()
                        .map(|l| l.ownership.table().clone());
                    self.clients[c].view = table;
                    self.clients[c].refresh_at = now + self.rng.range(200, 600) * 1_000_000;
                }
            }
            let expired: Vec<(u64, String)> = self.clients[c]
                .pending
                .iter()
                .filter(|(_, (_, call))| call.deadline_ns <= now)
                .map(|(&id, (node, _))| (id, node.clone()))
                .collect();
            for (id, node) in expired {
                self.clients[c].pending.remove(&id);
                let breaker = self.clients[c].breakers.entry(node.clone()).or_default();
                breaker.failures += 1;
                if breaker.failures >= self.config.breaker_failures {
                    let newly = breaker.open_until.is_none_or(|until| until <= now);
                    breaker.open_until = Some(now + self.config.breaker_cooldown_ns);
                    if newly {
                        self.log(format!("client{c} opens its breaker for {node}"));
                        if let Some(life) = self
                            .index_of(&node)
                            .and_then(|i| self.nodes[i].life.as_mut())
                            .filter(|l| l.stalled(now))
                        {
                            life.stall_opened_breaker = true;
                        }
                    }
                }
            }
            let due: Vec<Call> = self.clients[c]
                .retries
                .iter()
                .filter(|(at, _)| *at <= now)
                .map(|&(_, call)| call)
                .collect();
            self.clients[c].retries.retain(|(at, _)| *at > now);
            for call in due {
                self.report.try_again_retries += 1;
                self.send_call(c, call);
            }
            if self.rng.chance(self.config.check_per_mille * 1_000) {
                self.send_check(c);
            }
        }
    }

    /// Client `c` starts a call for a random slot.
    fn send_check(&mut self, c: usize) {
        let call = Call {
            slot: self.rng.range(0, SLOTS as u64 - 1) as u16,
            deadline_ns: self.now_ns + self.config.client_timeout_ns,
            pause_ns: self.config.tick_ns,
        };
        self.send_call(c, call);
    }

    /// Client `c` sends `call` to its slot's owner by its view, or, while its breaker for the
    /// owner is open, to the slot's successor marked as a takeover.
    fn send_call(&mut self, c: usize, call: Call) {
        let now = self.now_ns;
        let slot = call.slot;
        let Some(view) = self.clients[c].view.clone() else {
            return;
        };
        let Some(owner) = view.owner(slot) else {
            return;
        };
        let open = |client: &SimClient, node: &str| {
            client
                .breakers
                .get(node)
                .and_then(|b| b.open_until)
                .is_some_and(|until| until > now)
        };
        let (to, takeover) = if open(&self.clients[c], owner) {
            match view.successor(slot) {
                Some(successor) if successor != owner && !open(&self.clients[c], successor) => {
                    (successor.to_owned(), true)
                }
                // The client's fallback decides: no node does.
                _ => return,
            }
        } else {
            (owner.to_owned(), false)
        };
        self.next_id += 1;
        let id = self.next_id;
        self.report.client_checks += 1;
        if takeover {
            self.report.takeovers_sent += 1;
            if let Some(life) = self
                .index_of(owner)
                .and_then(|i| self.nodes[i].life.as_mut())
                .filter(|l| l.stalled(now))
            {
                life.stall_takeover_sent = true;
            }
        }
        self.clients[c].pending.insert(id, (to.clone(), call));
        self.send(
            to,
            Payload::Check {
                client: c,
                id,
                slot,
                takeover,
            },
        );
    }

    /// A node answered client `c`'s check: its breaker for that node closes (`TryAgain` is no
    /// failure, and the call is sent again after its pause if that ends before its deadline).
    /// An answer after the timeout counts for nothing.
    fn client_answered(&mut self, c: usize, id: u64, answer: Answer) {
        let now = self.now_ns;
        let Some(client) = self.clients.get_mut(c) else {
            return;
        };
        if let Some((node, call)) = client.pending.remove(&id) {
            client.breakers.insert(node, Breaker::default());
            let again_at = now + call.pause_ns;
            if matches!(answer, Answer::Refused(Refusal::TryAgain)) && again_at < call.deadline_ns {
                let pause_ns = call.pause_ns.saturating_mul(2);
                client.retries.push((again_at, Call { pause_ns, ..call }));
            }
        }
    }

    fn running(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| {
                self.nodes[i]
                    .life
                    .as_ref()
                    .is_some_and(|l| l.stops_at.is_none())
            })
            .collect()
    }

    fn inject_faults(&mut self) -> Result<(), SimFailure> {
        let running = self.running();
        // Crash: never the last running node.
        if running.len() > 1 && self.rng.chance(self.config.crash_per_mille * 1_000) {
            let index = running[self.rng.range(0, running.len() as u64 - 1) as usize];
            self.lose_state_of(index);
            self.nodes[index].life = None;
            let id = self.nodes[index].id.clone();
            self.log(format!("{id} crashes"));
        }
        let down: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| self.nodes[i].life.is_none() && !self.nodes[i].gone)
            .collect();
        if !down.is_empty() && self.rng.chance(self.config.restart_per_mille * 1_000) {
            let index = down[self.rng.range(0, down.len() as u64 - 1) as usize];
            self.start(index);
        }
        let running = self.running();
        if running.len() > 2 && self.rng.chance(self.config.leave_per_mille * 1_000) {
            let index = running[self.rng.range(0, running.len() as u64 - 1) as usize];
            self.leave(index);
        }
        if self.nodes.len() < self.config.max_nodes
            && self.rng.chance(self.config.join_per_mille * 1_000)
        {
            self.add_node();
        }
        self.stall_one();
        self.check()
    }

    /// A stall: a running node handles nothing for a while (a long pause, an overloaded host).
    fn stall_one(&mut self) {
        if !self.rng.chance(self.config.stall_per_mille * 1_000) {
            return;
        }
        let now = self.now_ns;
        let candidates: Vec<usize> = self
            .running()
            .into_iter()
            .filter(|&i| self.nodes[i].life.as_ref().is_some_and(|l| !l.stalled(now)))
            .collect();
        if candidates.is_empty() {
            return;
        }
        let index = candidates[self.rng.range(0, candidates.len() as u64 - 1) as usize];
        let length = self
            .rng
            .range(self.config.tick_ns, self.config.max_stall_ns);
        let life = self.nodes[index].life.as_mut().expect("running");
        life.stalled_until = Some(now + length);
        life.stall_opened_breaker = false;
        life.stall_takeover_sent = false;
        self.report.stalls += 1;
        let id = self.nodes[index].id.clone();
        self.log(format!("{id} stalls for {} ms", length / 1_000_000));
    }

    fn leave(&mut self, index: usize) {
        let now = self.now_ns;
        let linger = self.config.linger_ns;
        let Some(life) = self.nodes[index].life.as_mut() else {
            return;
        };
        let outgoing = life.membership.leave(now);
        life.stops_at = Some(now + linger);
        let id = self.nodes[index].id.clone();
        self.log(format!("{id} leaves"));
        self.update_table(index);
        let versions = self.nodes[index].claimed;
        for message in outgoing {
            self.send(
                message.to,
                Payload::Gossip(id.clone(), versions, message.gossip),
            );
        }
    }

    /// The invariant: for every slot, at most one running node decides it, unless every other
    /// decider is inside a named window for that slot.
    fn check(&mut self) -> Result<(), SimFailure> {
        let changed = self.nodes.iter().enumerate().any(|(i, n)| {
            n.life
                .as_ref()
                .is_some_and(|l| l.ownership.changes() != self.checked[i])
        });
        if !changed {
            return Ok(());
        }
        self.report.checks += 1;
        let machines: Vec<&Ownership> = self
            .nodes
            .iter()
            .filter_map(|n| n.life.as_ref().map(|l| &l.ownership))
            .collect();
        let excuse_guesses = !self.config.guessing_newcomers;
        match check_instant(
            &machines,
            self.now_ns,
            self.config.excuse_windows,
            excuse_guesses,
        ) {
            Ok(true) => self.report.windows_seen += 1,
            Ok(false) => {}
            Err(message) => return Err(self.fail(message)),
        }
        for (i, node) in self.nodes.iter().enumerate() {
            self.checked[i] = node
                .life
                .as_ref()
                .map_or(u64::MAX, |l| l.ownership.changes());
        }
        Ok(())
    }
}

/// The invariant at one instant: every two machines that both decide a slot are excused by a
/// named window (with `excuse_windows` false: no two may; with `excuse_guesses` false, a
/// newcomer's guess of a previous owner excuses nothing). Returns whether any slot had two
/// deciders (inside windows).
///
/// A pair is excused when one of them decides inside a window the machine marks for that slot
/// ([`Ownership::window`]) and that window names the other (see `excuses`), or when neither
/// table names the other node at all (window 5 of the module documentation).
pub fn check_instant(
    machines: &[&Ownership],
    now_ns: u64,
    excuse_windows: bool,
    excuse_guesses: bool,
) -> Result<bool, String> {
    let decided: Vec<Vec<bool>> = machines.iter().map(|m| m.decided_slots(now_ns)).collect();
    let mut doubled = false;
    for slot in 0..SLOTS {
        let deciders: Vec<&Ownership> = machines
            .iter()
            .zip(&decided)
            .filter(|(_, slots)| slots[slot])
            .map(|(machine, _)| *machine)
            .collect();
        if deciders.len() < 2 {
            continue;
        }
        doubled = true;
        check_pairs(
            &deciders,
            slot as u16,
            now_ns,
            excuse_windows,
            excuse_guesses,
        )?;
    }
    Ok(doubled)
}

/// True when `a` decides `slot` beside `other` inside a window that names `other`: the wait for
/// `other`'s hand-off expired, or `a` holds `other` dead; `a` decides alone; or (with
/// `guesses`: a cluster below releases) `a` joined guessing the slot's previous owner was a
/// node other than `other` (had it been `other`, `a` got the state from it, so `other`
/// deciding still would be a fault).
fn excuses(a: &Ownership, other: &Ownership, slot: u16, now_ns: u64, guesses: bool) -> bool {
    match a.window(slot, now_ns) {
        None => false,
        Some(Window::Alone) => true,
        Some(Window::WaitExpired { from }) => from.iter().any(|f| f == other.me()),
        Some(Window::OwnerDeclaredDead { from }) => from == other.me(),
        Some(Window::JoinedGuessing { from }) => guesses && from != other.me(),
        // The driver's window, never the machine's: it names the owner held suspect.
        Some(Window::OwnerSuspected { owner }) => owner == other.me(),
    }
}

/// Every pair among `deciders` of `slot` is excused (see [`check_instant`]).
fn check_pairs(
    deciders: &[&Ownership],
    slot: u16,
    now_ns: u64,
    excuse_windows: bool,
    excuse_guesses: bool,
) -> Result<(), String> {
    for (i, a) in deciders.iter().enumerate() {
        for b in &deciders[i + 1..] {
            // Window 5: views split so neither table names the other (a partition, or each
            // holding the other dead): each side decides its own table's slots.
            let split = !a.table().contains(b.me()) && !b.table().contains(a.me());
            let excused = excuse_windows
                && (split
                    || excuses(a, b, slot, now_ns, excuse_guesses)
                    || excuses(b, a, slot, now_ns, excuse_guesses));
            if !excused {
                return Err(format!(
                    "slot {slot} decided by {} and {} at once (windows {:?} and {:?}; tables of \
                     epochs {} {:?} and {} {:?})",
                    a.me(),
                    b.me(),
                    a.window(slot, now_ns),
                    b.window(slot, now_ns),
                    a.table().epoch(),
                    a.table().nodes(),
                    b.table().epoch(),
                    b.table().nodes(),
                ));
            }
        }
    }
    Ok(())
}

/// Runs one seed with its drawn configuration.
pub fn run_seed(seed: u64) -> Result<SimReport, SimFailure> {
    Sim::new(seed, SimConfig::from_seed(seed)).run()
}

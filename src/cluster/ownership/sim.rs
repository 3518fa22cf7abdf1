//! A seeded simulation of ownership machines over a faulty network, with the invariant checked
//! at every virtual instant something changes. Everything is a function of the seed (a
//! splitmix64 generator, ordered maps, virtual time): one seed replays byte for byte.
//!
//! Each simulated node is a [`Membership`] (real gossip, suspicion and death by silence) and an
//! [`Ownership`] machine, driven as the node drives them: every membership change that moves
//! owners becomes a table switch, every [`Action::HandOff`] becomes one to three parts sent
//! over the network. The network delays (uniformly in a range), loses, duplicates and so
//! reorders messages. Nodes crash and restart (a new life with a later incarnation, joining
//! through its seeds), leave gracefully (and stop after a linger), and new nodes join.
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
        }
    }
}

/// A message on its way.
#[derive(Debug, Clone)]
enum Payload {
    /// Gossip, with the versions its sender speaks (the layout follows what both share).
    Gossip(VersionRange, Gossip),
    HandoffPart {
        from: String,
        id: u64,
        part: u32,
        parts: u32,
        slots: Vec<u16>,
    },
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
    pub messages: u64,
    /// Every event of the run, in order, in one number (see [`TraceDigest`]).
    pub digest: u64,
    /// The highest cluster version any node computed, and each running node's at the end (0:
    /// its members shared none).
    pub newest_cluster_version: u8,
    pub cluster_versions_at_end: Vec<u8>,
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

/// Lines of trace kept for a failure report.
const TRACE_LINES: usize = 60;

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
                messages: 0,
                digest: 0,
                newest_cluster_version: 0,
                cluster_versions_at_end: Vec::new(),
            },
            checked: Vec::new(),
            tables: BTreeMap::new(),
            config,
        };
        sim.add_node();
        sim
    }

    /// Runs to the end, checking the invariant at every change.
    pub fn run(mut self) -> Result<SimReport, SimFailure> {
        let start = self.now_ns;
        let end = start + self.config.duration_ns;
        while self.now_ns < end {
            // The first nodes start one after another, as a rollout does (each has joined
            // before the next starts); later joins and restarts come at any time.
            if self.nodes.len() < self.config.nodes
                && self.now_ns >= start + self.nodes.len() as u64 * STAGGER_NS
            {
                self.add_node();
            }
            self.deliver_due()?;
            self.step_nodes()?;
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
        let seeds: Vec<String> = if index == 0 && self.nodes[index].lives == 0 {
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
            region: "sim".to_owned(),
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

    fn send(&mut self, to: String, payload: Payload) {
        if self.rng.chance(self.config.loss_per_mille * 1_000) {
            return;
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
            let Some(index) = self.index_of(&to) else {
                continue;
            };
            let now = self.now_ns;
            let receiver = self.nodes[index].versions;
            let Some(life) = self.nodes[index].life.as_mut() else {
                continue;
            };
            match payload {
                Payload::Gossip(from, mut gossip) => {
                    // As over QUIC: no shared version, no connection; version 2's layout has
                    // no ranges.
                    let Some(agreed) = from.highest_shared(receiver) else {
                        continue;
                    };
                    if !Feature::MemberVersions.readable_at(agreed) {
                        gossip.members.iter_mut().for_each(|d| d.versions = None);
                    }
                    drop(life.membership.handle_gossip(now, &gossip));
                    self.update_table(index);
                }
                Payload::HandoffPart {
                    from,
                    id,
                    part,
                    parts,
                    slots,
                } => {
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
                }
            }
            self.check()?;
        }
        Ok(())
    }

    /// Switches a node's table when its membership moved owners, and carries out its actions.
    fn update_table(&mut self, index: usize) {
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
        for action in actions {
            match action {
                Action::Joined => self.log(format!("{id} joined")),
                Action::HandOff(handoff) => {
                    let parts = self.rng.range(1, 3) as u32;
                    self.log(format!(
                        "{id} hands {} slots to {} (hand-off {}, {parts} parts{})",
                        handoff.slots.len(),
                        handoff.to,
                        handoff.id,
                        if handoff.with_buckets {
                            ""
                        } else {
                            ", holds nothing"
                        }
                    ));
                    for part in 0..parts {
                        let payload = Payload::HandoffPart {
                            from: id.clone(),
                            id: handoff.id,
                            part,
                            parts,
                            slots: handoff.slots.clone(),
                        };
                        self.send(handoff.to.clone(), payload);
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
            for message in outgoing {
                self.send(message.to, Payload::Gossip(versions, message.gossip));
            }
            self.update_table(index);
        }
        self.check()
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
        self.check()
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
            self.send(message.to, Payload::Gossip(versions, message.gossip));
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
        match check_instant(&machines, self.now_ns, self.config.excuse_windows) {
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
/// named window (with `excuse_windows` false: no two may). Returns whether any slot had two
/// deciders (inside windows).
///
/// A pair is excused when one of them decides inside a window the machine marks for that slot
/// ([`Ownership::window`]) and that window names the other (see `excuses`), or when neither
/// table names the other node at all (window 5 of the module documentation).
pub fn check_instant(
    machines: &[&Ownership],
    now_ns: u64,
    excuse_windows: bool,
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
        check_pairs(&deciders, slot as u16, excuse_windows)?;
    }
    Ok(doubled)
}

/// True when `a` decides `slot` beside `other` inside a window that names `other`: the wait for
/// `other`'s hand-off expired, or `a` holds `other` dead; `a` decides alone; or `a` joined
/// guessing the slot's previous owner was a node other than `other` (had it been `other`, `a`
/// got the state from it, so `other` deciding still would be a fault).
fn excuses(a: &Ownership, other: &Ownership, slot: u16) -> bool {
    match a.window(slot) {
        None => false,
        Some(Window::Alone) => true,
        Some(Window::WaitExpired { from } | Window::OwnerDeclaredDead { from }) => {
            from == other.me()
        }
        Some(Window::JoinedGuessing { from }) => from != other.me(),
    }
}

/// Every pair among `deciders` of `slot` is excused (see [`check_instant`]).
fn check_pairs(deciders: &[&Ownership], slot: u16, excuse_windows: bool) -> Result<(), String> {
    for (i, a) in deciders.iter().enumerate() {
        for b in &deciders[i + 1..] {
            // Window 5: views split so neither table names the other (a partition, or each
            // holding the other dead): each side decides its own table's slots.
            let split = !a.table().contains(b.me()) && !b.table().contains(a.me());
            let excused = excuse_windows && (split || excuses(a, b, slot) || excuses(b, a, slot));
            if !excused {
                return Err(format!(
                    "slot {slot} decided by {} and {} at once (windows {:?} and {:?}; tables of \
                     epochs {} {:?} and {} {:?})",
                    a.me(),
                    b.me(),
                    a.window(slot),
                    b.window(slot),
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

//! Membership without consensus: a gossip-style failure detector (van Renesse et al.).
//!
//! Every node bumps its own heartbeat each gossip round and sends its view (every member's
//! incarnation and heartbeat) to a few random peers. A member whose heartbeat has not advanced
//! for `suspect_after` is suspect; after `dead_after`, dead, and its slots move. A restarted node
//! comes back with a larger incarnation (its start time), so it is never mistaken for its old
//! self. A graceful leave is gossiped as `Left`. Sans I/O: `handle_gossip(now, msg)` and
//! `poll(now)` return what to send; the node owns sockets and timers.
//!
//! An id belongs to one address at a time. While a member is alive or suspect at address A,
//! gossip naming its id at another address B is refused (A keeps the id and its slots) and
//! answered with an [`IdConflict`] sent to B; the node that started later yields (it stops
//! gossiping and its process exits). A restart at the same address with a larger incarnation is
//! readmitted as before; a move to another address is taken once the member at the old address
//! is dead or has left.
//!
//! Gossip names no sender and is relayed, so what one peer can claim about another is bounded:
//! no incarnation more than [`MAX_INCARNATION_AHEAD_MS`] ahead of the receiver's clock, a
//! departure only at the incarnation the member is known in and at most
//! [`MAX_DEPARTURE_HEARTBEAT_LEAD`] heartbeats past the last one heard (the member's own later
//! heartbeats undo a forged one), and a departure of a member never seen alive is not relayed.
//! A node's driver says which digests are the sender's own word (its certificate names the
//! member); the others are relays, which take only what gossip needs passed on
//! ([`Membership::handle_gossip_from`]).
//!
//! A node started with seeds is **joining** until it knows a member that is not, and its digest
//! says so. No node counts a joining member among the owners, so a newcomer's first table is
//! always made from settled members' views, never from another newcomer's (which names nobody
//! yet). Nodes started together, each joining through the others, have no settled member to
//! find: the seed with the smallest id founds the cluster once it knows every other seed as a
//! joining member (for [`FOUNDING_ROUNDS`] gossip rounds), and the others join it; nodes that
//! do not list themselves fall back, after the failure detector's timeout, to the smallest id
//! among the joining members each knows.

use std::collections::BTreeMap;

use rkyv::{Archive, Deserialize, Serialize};

use crate::protocol::{self, VersionRange};

/// The most members a node tracks, whatever its configuration: gossip names at most this
/// many (the wire refuses more, `wire::MAX_GOSSIP_DIGESTS`).
pub const MAX_MEMBERS: usize = 1_024;

/// Gossip rounds a joining node waits, knowing only other joining members, before the one with
/// the smallest id among them founds the cluster.
pub const FOUNDING_ROUNDS: u64 = 3;

/// Timings and bounds. Defaults: a silent node is suspect after 500 ms and dead after 1 s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MembershipConfig {
    pub gossip_interval_ns: u64,
    /// Peers each round's gossip goes to.
    pub fanout: usize,
    pub suspect_after_ns: u64,
    pub dead_after_ns: u64,
    /// How long a dead or departed member is remembered (so stale gossip cannot revive it).
    pub forget_after_ns: u64,
    /// Most members tracked; gossip naming more is ignored. At most
    /// [`wire::MAX_GOSSIP_DIGESTS`](crate::wire::MAX_GOSSIP_DIGESTS), the most digests a
    /// receiver reads in one message (a larger value is taken as that).
    pub max_members: usize,
}

impl Default for MembershipConfig {
    fn default() -> Self {
        MembershipConfig {
            gossip_interval_ns: 100_000_000,
            fanout: 3,
            suspect_after_ns: 500_000_000,
            dead_after_ns: 1_000_000_000,
            forget_after_ns: 30_000_000_000,
            max_members: MAX_MEMBERS,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemberState {
    Alive,
    /// Silent for `suspect_after`: still owns its slots.
    Suspect,
    /// Silent for `dead_after`: its slots have moved.
    Dead,
    /// Announced a graceful leave.
    Left,
}

impl MemberState {
    pub fn name(self) -> &'static str {
        match self {
            MemberState::Alive => "alive",
            MemberState::Suspect => "suspect",
            MemberState::Dead => "dead",
            MemberState::Left => "left",
        }
    }

    /// Alive and suspect members own slots; dead and departed ones do not.
    pub fn owns_slots(self) -> bool {
        matches!(self, MemberState::Alive | MemberState::Suspect)
    }
}

/// Who a member is: a stable id, the address peers and clients reach it at, and its region.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemberInfo {
    pub id: String,
    pub addr: String,
    pub region: String,
}

/// One member as gossiped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberDigest {
    pub info: MemberInfo,
    pub incarnation: u64,
    pub heartbeat: u64,
    /// `true` once the member announced a graceful leave.
    pub left: bool,
    /// The protocol versions the member speaks in this incarnation; `None` when the sender did
    /// not say (version 2's gossip has no ranges).
    pub versions: Option<VersionRange>,
    /// The member has not joined yet (it owns nothing); false when the sender did not say
    /// (gossip before version 9).
    pub joining: bool,
}

/// A gossip message: the sender's view of every member it considers alive, suspect or departed.
/// Its layouts on the wire: `wire::encode_gossip`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Gossip {
    pub members: Vec<MemberDigest>,
}

/// Furthest a gossiped incarnation may be ahead of the receiver's clock, in ms: an incarnation
/// is a start time, so only a clock a day off or a hostile peer goes further. Without a bound,
/// one digest at `u64::MAX` would pin a member at an incarnation no restart of it can pass.
pub const MAX_INCARNATION_AHEAD_MS: u64 = 24 * 3_600 * 1_000;

/// Most heartbeats a departure may be ahead of the last one heard from its member. A member is
/// dead after `dead_after` of silence (10 gossip rounds by default), so its own departure is
/// never far ahead of what the others heard; a forged one at most this far ahead is overtaken
/// by the member's own heartbeats within as many rounds, which bring it back.
pub const MAX_DEPARTURE_HEARTBEAT_LEAD: u64 = 64;

/// Most conflicts one gossip message can produce (a message names each id at most once in
/// practice; this bounds what a hostile one can make us send).
pub const MAX_CONFLICTS_PER_GOSSIP: usize = 8;

/// Member → claimant: "the id you gossip is held by another live node". Sent to
/// `claimant_addr` by any member that holds `id` alive at `holder_addr` (or is that node).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct IdConflict {
    pub id: String,
    /// Where the sender knows `id` to be alive.
    pub holder_addr: String,
    pub holder_incarnation: u64,
    /// The address whose claim was refused (where this message goes).
    pub claimant_addr: String,
    pub claimant_incarnation: u64,
}

/// What a node makes of an [`IdConflict`] it receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConflictVerdict {
    /// Not about this node (another id, or another claimant address): nothing to do.
    Ignored,
    /// Another node held this id first: this node must not take part. From now on it sends no
    /// gossip; its process should stop.
    Refused,
    /// Another node claims this node's id, but this node started first: it keeps the id (the
    /// other one receives the same conflict and yields).
    Kept,
}

/// A message to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// Peer address (a member's `addr`, or a seed).
    pub to: String,
    pub gossip: Gossip,
}

#[derive(Debug, Clone)]
struct Member {
    info: MemberInfo,
    incarnation: u64,
    heartbeat: u64,
    state: MemberState,
    /// When the heartbeat last advanced (or the state last changed).
    since_ns: u64,
    /// What it speaks in this incarnation, once a digest said; a later incarnation forgets it.
    versions: Option<VersionRange>,
    /// False for a member known only from a departure relayed to this node: it is not passed
    /// on, so a forged one is forgotten here after `forget_after` instead of going round.
    relay: bool,
    /// Not joined yet, as its latest digest said: no table names it.
    joining: bool,
    /// What bounds a heartbeat relayed by another peer ([`Membership::handle_gossip_from`]):
    /// the heartbeat heard in the member's own word (or when its life was first heard of) and
    /// when; a relay may be ahead of it by the gossip rounds since, and a few more.
    anchor: Anchor,
    /// The incarnation was taken from a relay, not the member's own word: the member's own
    /// digest of an earlier life overrides it (a relay may have been forged).
    relayed_incarnation: bool,
}

/// A heartbeat and when it was heard.
#[derive(Debug, Clone, Copy)]
struct Anchor {
    heartbeat: u64,
    at_ns: u64,
}

/// One node's view of the cluster.
#[derive(Debug)]
pub struct Membership {
    me: String,
    members: BTreeMap<String, Member>,
    seeds: Vec<String>,
    /// This node's own address was among its seeds: nodes started together with one list of
    /// seeds are each among them, and the one with the smallest id founds the cluster.
    seeded_self: bool,
    config: MembershipConfig,
    next_round_ns: u64,
    rng: u64,
    epoch: u64,
    /// Set once an [`IdConflict`] told us another node holds our id: we stay silent.
    refused: bool,
    /// When this node started (its founding wait counts from there).
    started_ns: u64,
}

/// True when `seed` (HOST:PORT as configured) names `member`: its advertised address, or its
/// node id as the host (a seed list of DNS names beside advertised IPs, as in Kubernetes).
fn names(seed: &str, member: &MemberInfo) -> bool {
    if seed == member.addr {
        return true;
    }
    let host = seed.rsplit_once(':').map_or(seed, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']') == member.id
}

impl Membership {
    /// A node's membership, starting alone. `incarnation` must grow across restarts of the same
    /// id (the start time in ms does); `seed` makes peer choice reproducible.
    pub fn new(
        me: MemberInfo,
        incarnation: u64,
        seeds: Vec<String>,
        config: MembershipConfig,
        now_ns: u64,
        seed: u64,
    ) -> Self {
        let config = MembershipConfig {
            max_members: config.max_members.min(MAX_MEMBERS),
            ..config
        };
        let id = me.id.clone();
        let member = Member {
            info: me,
            incarnation,
            heartbeat: 0,
            state: MemberState::Alive,
            since_ns: now_ns,
            versions: Some(protocol::SUPPORTED),
            relay: true,
            joining: false,
            anchor: Anchor {
                heartbeat: 0,
                at_ns: now_ns,
            },
            relayed_incarnation: false,
        };
        let seeded_self = seeds.iter().any(|seed| names(seed, &member.info));
        let seeds: Vec<String> = seeds
            .into_iter()
            .filter(|s| !names(s, &member.info))
            .collect();
        let member = Member {
            joining: !seeds.is_empty(),
            ..member
        };
        Membership {
            me: id.clone(),
            members: BTreeMap::from([(id, member)]),
            seeds,
            seeded_self,
            config,
            next_round_ns: now_ns,
            rng: seed | 1,
            epoch: 1,
            refused: false,
            started_ns: now_ns,
        }
    }

    /// True while this node has not joined: started with seeds, it knows no settled member
    /// yet and has not founded the cluster.
    pub fn is_joining(&self) -> bool {
        self.members.get(&self.me).is_some_and(|m| m.joining)
    }

    /// This node is the first of its cluster (every seed turned out to be itself): it joins
    /// nothing and owns its slots from now on.
    pub fn found(&mut self) {
        if let Some(me) = self.members.get_mut(&self.me)
            && me.joining
        {
            me.joining = false;
            self.epoch += 1;
        }
    }

    /// Ends the join when this node knows a settled member (alive, not joining), or founds the
    /// cluster (see [`Membership::founds`]). A change moves the epoch (the table is made again).
    fn settle(&mut self, now_ns: u64) {
        if !self.is_joining() {
            return;
        }
        let settled_known = self
            .members
            .values()
            .any(|m| m.info.id != self.me && !m.joining && m.state == MemberState::Alive);
        let founder = self.founds(now_ns);
        if settled_known || founder {
            self.found();
        }
    }

    /// Nodes started together, each joining through the others, have no settled member to
    /// find, so one of them founds the cluster. Any settled member it knows, even suspect (it
    /// may be stalled), bars founding. Two ways, the first exact:
    /// - **Among the seeds:** the seed with the smallest id founds once it has waited
    ///   [`FOUNDING_ROUNDS`] gossip rounds, is itself a seed, and knows every other seed as an
    ///   alive member still joining (a seed names a member by its advertised address or by its
    ///   node id as the host). Nodes given one seed list agree on that one.
    /// - **Otherwise**, when no node lists itself (each given only its peers), after the
    ///   failure detector's `dead_after`: the node with the smallest id among the alive joining
    ///   members it knows, when it knows at least one. By then every node started together has
    ///   heard of the others through its seeds, so they pick the same one; views that still
    ///   differ could found twice, which the tables then merge as any two settled members do.
    ///
    /// A node that knows no other member (its seeds unreachable) never founds: it keeps
    /// waiting for the cluster, deciding alone meanwhile as the ownership machine allows.
    fn founds(&self, now_ns: u64) -> bool {
        let waited = now_ns.saturating_sub(self.started_ns);
        if waited < FOUNDING_ROUNDS.saturating_mul(self.config.gossip_interval_ns) {
            return false;
        }
        let others = || self.members.values().filter(|m| m.info.id != self.me);
        if others().any(|m| m.state.owns_slots() && !m.joining) {
            return false;
        }
        let joining_above = |m: &&Member| m.joining && m.state == MemberState::Alive;
        if self.seeded_self {
            let every_seed_known = self.seeds.iter().all(|seed| {
                others().any(|m| names(seed, &m.info) && joining_above(&m) && m.info.id > self.me)
            });
            if every_seed_known {
                return true;
            }
        }
        waited >= self.config.dead_after_ns
            && others().any(|m| joining_above(&m))
            && others().filter(joining_above).all(|m| m.info.id > self.me)
    }

    pub fn me(&self) -> &str {
        &self.me
    }

    /// Speaks `versions` instead of this build's range (simulations of mixed clusters, and a
    /// node held at an older version).
    pub fn with_versions(mut self, versions: VersionRange) -> Self {
        if let Some(me) = self.members.get_mut(&self.me) {
            me.versions = Some(versions);
        }
        self
    }

    /// The versions `id` speaks, as far as this node knows: a member no digest has given a
    /// range for is taken to speak version 2 alone ([`protocol::UNKNOWN_MEMBER`]).
    pub fn versions_of(&self, id: &str) -> Option<VersionRange> {
        self.members
            .get(id)
            .map(|m| m.versions.unwrap_or(protocol::UNKNOWN_MEMBER))
    }

    /// The highest version every slot-owning member speaks (this node among them): what
    /// behaviour that needs every member waits for. `None` when their ranges share none.
    pub fn cluster_version(&self) -> Option<u8> {
        protocol::cluster_version(
            self.members
                .values()
                .filter(|m| m.state.owns_slots())
                .map(|m| m.versions.unwrap_or(protocol::UNKNOWN_MEMBER)),
        )
    }

    /// The highest protocol version every slot-owning member of `region` speaks (as
    /// [`Membership::cluster_version`], counting that region's members alone). What only that
    /// region's members exchange (replicas, a join's releases, lease syncs, deltas passed on
    /// between them, RLQS relays) may use it while another region still runs an older build.
    /// `None` also for a region with no such member.
    pub fn region_version(&self, region: &str) -> Option<u8> {
        let mut ranges = self
            .members
            .values()
            .filter(|m| m.state.owns_slots() && m.info.region == region)
            .map(|m| m.versions.unwrap_or(protocol::UNKNOWN_MEMBER))
            .peekable();
        ranges.peek()?;
        protocol::cluster_version(ranges)
    }

    /// Increments whenever the set of slot-owning members changes.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Every known member with its state, sorted by id.
    pub fn members(&self) -> impl Iterator<Item = (&MemberInfo, MemberState)> {
        self.members.values().map(|m| (&m.info, m.state))
    }

    /// Ids of the members that own slots (alive or suspect, and joined; this node always),
    /// sorted.
    pub fn owners(&self) -> Vec<String> {
        self.members
            .values()
            .filter(|m| self.owns(m))
            .map(|m| m.info.id.clone())
            .collect()
    }

    /// Ids of the members of `region` that own slots (as [`Membership::owners`]), sorted: that
    /// region's ring. Every region has its own owners, so a key has one owner per region.
    pub fn owners_in(&self, region: &str) -> Vec<String> {
        self.members
            .values()
            .filter(|m| self.owns(m) && m.info.region == region)
            .map(|m| m.info.id.clone())
            .collect()
    }

    /// A member owns slots while alive or suspect, once joined. This node's own table names it
    /// while it joins (a table of one, which the ownership machine does not count as owning).
    /// Once this node has left, joining members count too: its last table says where its
    /// buckets go, and a member that joined meanwhile (its news not here yet) is a better
    /// heir than nobody.
    fn owns(&self, m: &Member) -> bool {
        let left = || {
            self.members
                .get(&self.me)
                .is_some_and(|me| me.state == MemberState::Left)
        };
        m.state.owns_slots() && (!m.joining || m.info.id == self.me || left())
    }

    /// The regions of every known member (each once, sorted).
    pub fn regions(&self) -> Vec<String> {
        let mut regions: Vec<String> = self
            .members
            .values()
            .map(|m| m.info.region.clone())
            .collect();
        regions.sort();
        regions.dedup();
        regions
    }

    /// The incarnation `id` is known in.
    pub fn incarnation_of(&self, id: &str) -> Option<u64> {
        self.members.get(id).map(|m| m.incarnation)
    }

    /// The last heartbeat heard from `id` (a departed member: its departure's).
    pub fn heartbeat_of(&self, id: &str) -> Option<u64> {
        self.members.get(id).map(|m| m.heartbeat)
    }

    pub fn state_of(&self, id: &str) -> Option<MemberState> {
        self.members.get(id).map(|m| m.state)
    }

    pub fn info(&self, id: &str) -> Option<&MemberInfo> {
        self.members.get(id).map(|m| &m.info)
    }

    /// True once a conflict told us another node holds our id (see [`ConflictVerdict::Refused`]).
    pub fn is_refused(&self) -> bool {
        self.refused
    }

    /// Merges a peer's view. Heartbeats only move forward; a larger incarnation is a restart.
    /// A digest whose incarnation is more than [`MAX_INCARNATION_AHEAD_MS`] ahead of `now_ns`
    /// is skipped, and a departure counts only at the incarnation the member is known in (its
    /// own leave, or a relay of it), at most [`MAX_DEPARTURE_HEARTBEAT_LEAD`] heartbeats past
    /// the last one heard. Returns the conflicts to send (each to its `claimant_addr`): digests
    /// that name a live member's id at another address, which are refused.
    ///
    /// Every digest is taken as its member's own word: for simulations and drivers whose
    /// gossip comes from trusted senders. A node takes a peer's gossip with
    /// [`Membership::handle_gossip_from`].
    pub fn handle_gossip(&mut self, now_ns: u64, gossip: &Gossip) -> Vec<IdConflict> {
        self.handle_gossip_from(now_ns, &|_| true, gossip)
    }

    /// As [`Membership::handle_gossip`], for gossip from a peer that speaks only for the members
    /// `own` says (those its certificate names). Another member's digest is a relay, and takes
    /// only what gossip needs relayed ([`Membership::take_relayed`]): new members, the end of a
    /// join, and heartbeats (at most [`MAX_RELAYED_HEARTBEAT_LEAD`] rounds ahead of what was
    /// heard); a departure, a joining flag, a new region or versions, and a restart of a member
    /// still heard are the member's own word. A member's own digest of an earlier life
    /// overrides a life only a relay told of.
    pub fn handle_gossip_from(
        &mut self,
        now_ns: u64,
        own: &dyn Fn(&str) -> bool,
        gossip: &Gossip,
    ) -> Vec<IdConflict> {
        let owners_before = self.owners();
        let mut conflicts = Vec::new();
        if self.refused {
            return conflicts; // Out of the cluster for good: its view stays its own.
        }
        let latest_incarnation = (now_ns / 1_000_000).saturating_add(MAX_INCARNATION_AHEAD_MS);
        for digest in &gossip.members {
            if digest.incarnation <= latest_incarnation {
                self.take_digest(now_ns, own, digest, &mut conflicts);
            }
        }
        self.bump_epoch_if_changed(&owners_before);
        self.settle(now_ns);
        conflicts
    }

    /// One digest of a peer's gossip (see [`Membership::handle_gossip_from`]); a conflict it
    /// reveals goes to `conflicts`.
    fn take_digest(
        &mut self,
        now_ns: u64,
        own: &dyn Fn(&str) -> bool,
        digest: &MemberDigest,
        conflicts: &mut Vec<IdConflict>,
    ) {
        let id = &digest.info.id;
        if *id == self.me {
            // Nobody else speaks for us; another address claiming our id is told so.
            if let Some(me) = self.members.get(id)
                && me.info.addr != digest.info.addr
                && !digest.left
                && me.state.owns_slots()
                && conflicts.len() < MAX_CONFLICTS_PER_GOSSIP
            {
                conflicts.push(conflict(me, digest));
            }
            return;
        }
        let room = self.members.len() < self.config.max_members;
        match self.members.get_mut(id) {
            Some(member) if member.info.addr != digest.info.addr => {
                if member.state.owns_slots() {
                    // Alive (or suspect) elsewhere: the id is taken. A departure gossiped
                    // from the other address is not this member's and is dropped.
                    if !digest.left && conflicts.len() < MAX_CONFLICTS_PER_GOSSIP {
                        conflicts.push(conflict(member, digest));
                    }
                } else if !digest.left {
                    // The old address is dead or gone: the id has moved (whatever the
                    // incarnation, which compares only lives at one address).
                    take_life(member, digest, now_ns, !own(id));
                }
            }
            Some(member) if !own(id) => {
                take_relayed(member, digest, now_ns, self.config.gossip_interval_ns);
            }
            Some(member) => take_own_word(member, digest, now_ns),
            None if room => {
                self.members
                    .insert(id.clone(), new_member(digest, now_ns, !own(id)));
            }
            None => {}
        }
    }

    /// Judges a conflict sent to us. The node that started first keeps the id: the larger
    /// (incarnation, address) yields, so both sides of a conflict agree on who stays.
    pub fn handle_conflict(&mut self, conflict: &IdConflict) -> ConflictVerdict {
        let verdict = self.judge_conflict(conflict);
        if verdict == ConflictVerdict::Refused {
            self.refused = true;
        }
        verdict
    }

    /// What [`Membership::handle_conflict`] would decide, changing nothing: a driver that
    /// checks the claim first (any peer can send a conflict; only the holder can prove it)
    /// judges, proves, then handles.
    pub fn judge_conflict(&self, conflict: &IdConflict) -> ConflictVerdict {
        let Some(me) = self.members.get(&self.me) else {
            return ConflictVerdict::Ignored;
        };
        if conflict.id != self.me
            || conflict.claimant_addr != me.info.addr
            || conflict.holder_addr == me.info.addr
        {
            return ConflictVerdict::Ignored;
        }
        let holder = (conflict.holder_incarnation, conflict.holder_addr.as_str());
        if holder < (me.incarnation, me.info.addr.as_str()) {
            ConflictVerdict::Refused
        } else {
            ConflictVerdict::Kept
        }
    }

    /// Advances timers: bumps our heartbeat, ages silent members, and when a gossip round is
    /// due returns the messages to send.
    pub fn poll(&mut self, now_ns: u64) -> Vec<Outgoing> {
        let owners_before = self.owners();
        let config = self.config;
        for member in self.members.values_mut().filter(|m| m.info.id != self.me) {
            let silent = now_ns.saturating_sub(member.since_ns);
            match member.state {
                MemberState::Alive if silent >= config.suspect_after_ns => {
                    member.state = MemberState::Suspect
                }
                MemberState::Suspect if silent >= config.dead_after_ns => {
                    member.state = MemberState::Dead
                }
                _ => {}
            }
        }
        self.members.retain(|_, m| {
            m.state.owns_slots() || now_ns.saturating_sub(m.since_ns) < config.forget_after_ns
        });
        self.bump_epoch_if_changed(&owners_before);
        self.settle(now_ns);
        // A refused node must not spread its claim any further.
        if now_ns < self.next_round_ns || self.refused {
            return Vec::new();
        }
        self.next_round_ns = now_ns + config.gossip_interval_ns;
        if let Some(me) = self.members.get_mut(&self.me) {
            me.heartbeat += 1;
            me.since_ns = now_ns;
        }
        let gossip = self.digest();
        self.targets()
            .into_iter()
            .map(|to| Outgoing {
                to,
                gossip: gossip.clone(),
            })
            .collect()
    }

    /// Announces a graceful leave: returns the message for every other known member.
    pub fn leave(&mut self, now_ns: u64) -> Vec<Outgoing> {
        if self.refused {
            // The id is another node's: announcing its departure is not ours to do.
            return Vec::new();
        }
        let owners_before = self.owners();
        if let Some(me) = self.members.get_mut(&self.me) {
            me.state = MemberState::Left;
            me.since_ns = now_ns;
        }
        self.bump_epoch_if_changed(&owners_before);
        let gossip = self.digest();
        self.members
            .values()
            .filter(|m| m.info.id != self.me && m.state.owns_slots())
            .map(|m| Outgoing {
                to: m.info.addr.clone(),
                gossip: gossip.clone(),
            })
            .collect()
    }

    fn digest(&self) -> Gossip {
        let members = self
            .members
            .values()
            .filter(|m| m.state != MemberState::Dead && m.relay)
            .map(|m| MemberDigest {
                info: m.info.clone(),
                incarnation: m.incarnation,
                heartbeat: m.heartbeat,
                left: m.state == MemberState::Left,
                versions: m.versions,
                joining: m.joining,
            })
            .collect();
        Gossip { members }
    }

    /// `fanout` random live peers; plus one dead member or unknown seed per round, so
    /// partitions heal and a lone node keeps knocking on its seeds.
    fn targets(&mut self) -> Vec<String> {
        let mut live: Vec<String> = self
            .members
            .values()
            .filter(|m| m.info.id != self.me && m.state.owns_slots())
            .map(|m| m.info.addr.clone())
            .collect();
        let mut targets = Vec::with_capacity(self.config.fanout + 1);
        while targets.len() < self.config.fanout && !live.is_empty() {
            let i = self.next_random() as usize % live.len();
            targets.push(live.swap_remove(i));
        }
        let known: Vec<&str> = self
            .members
            .values()
            .filter(|m| m.state.owns_slots())
            .map(|m| m.info.addr.as_str())
            .collect();
        let mut outside: Vec<String> = self
            .members
            .values()
            .filter(|m| m.state == MemberState::Dead)
            .map(|m| m.info.addr.clone())
            .collect();
        outside.extend(
            self.seeds
                .iter()
                .filter(|s| !known.contains(&s.as_str()))
                .cloned(),
        );
        if !outside.is_empty() {
            let i = self.next_random() as usize % outside.len();
            targets.push(outside.swap_remove(i));
        }
        targets
    }

    /// Our incarnation (the start time in ms for a node).
    pub fn incarnation(&self) -> u64 {
        self.members.get(&self.me).map_or(0, |m| m.incarnation)
    }

    fn bump_epoch_if_changed(&mut self, owners_before: &[String]) {
        if self.owners() != owners_before {
            self.epoch += 1;
        }
    }

    fn next_random(&mut self) -> u64 {
        // xorshift64: reproducible from the seed, good enough to spread gossip.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }
}

/// Most gossip rounds a heartbeat relayed by another peer may be ahead of the member's anchor
/// (the heartbeat last heard in its own word, plus one a round since): a member gossips once a
/// round, so only a forged relay goes further. Past it a relayed heartbeat is taken as this
/// far ahead: still news that the member lives, but a forged one cannot pin the member at a
/// heartbeat its own gossip would take long to pass (each silent round of it a step towards
/// its death at every node).
pub const MAX_RELAYED_HEARTBEAT_LEAD: u64 = 2;

/// Starts `member`'s life of `digest`: a restart, a move to another address, or the life its own
/// word names.
fn take_life(member: &mut Member, digest: &MemberDigest, now_ns: u64, relayed: bool) {
    member.incarnation = digest.incarnation;
    member.heartbeat = digest.heartbeat;
    member.info = digest.info.clone();
    member.state = MemberState::Alive;
    member.since_ns = now_ns;
    member.versions = digest.versions;
    member.relay = true;
    member.joining = digest.joining;
    member.anchor = Anchor {
        heartbeat: digest.heartbeat,
        at_ns: now_ns,
    };
    member.relayed_incarnation = relayed;
}

/// A member's own digest: a life of its own, a heartbeat, a departure at the life it is known
/// in, or progress (a new incarnation, a heartbeat past the last one heard).
fn take_own_word(member: &mut Member, digest: &MemberDigest, now_ns: u64) {
    if digest.incarnation < member.incarnation && member.relayed_incarnation && !digest.left {
        // The member speaks of its life: a later one only a relay told of was not its own.
        take_life(member, digest, now_ns, false);
        return;
    }
    if digest.incarnation == member.incarnation {
        member.anchor = Anchor {
            heartbeat: digest.heartbeat,
            at_ns: now_ns,
        };
    }
    // A range belongs to one incarnation: a digest of the same life that says it fills in
    // what a version 2 digest left out.
    if digest.incarnation == member.incarnation && digest.versions.is_some() {
        member.versions = digest.versions;
    }
    let version = (digest.incarnation, digest.heartbeat);
    if digest.left {
        // A leaver announces its life's end with its latest heartbeat, and others relay that
        // as is. At another incarnation it is a claim about a life this node does not know (a
        // restart it has not heard of leaves by going silent); below a heartbeat heard alive it
        // is not the leaver's; far ahead it would outlast the member's own heartbeats.
        let lead = digest.heartbeat.checked_sub(member.heartbeat);
        if digest.incarnation == member.incarnation
            && member.state != MemberState::Left
            && lead.is_some_and(|lead| lead <= MAX_DEPARTURE_HEARTBEAT_LEAD)
        {
            member.state = MemberState::Left;
            member.heartbeat = digest.heartbeat;
            member.since_ns = now_ns;
        }
    } else if version > (member.incarnation, member.heartbeat) {
        // Progress: a new incarnation, or a heartbeat past the last one heard (for a departed
        // member, past its departure's, which its own digests never are: the departure was
        // forged).
        if digest.incarnation > member.incarnation {
            // Perhaps another build: only its new digests say what it speaks.
            member.versions = digest.versions;
            member.anchor = Anchor {
                heartbeat: digest.heartbeat,
                at_ns: now_ns,
            };
            member.relayed_incarnation = false;
        }
        member.incarnation = digest.incarnation;
        member.heartbeat = digest.heartbeat;
        member.info = digest.info.clone();
        member.state = MemberState::Alive;
        member.since_ns = now_ns;
        member.relay = true;
        member.joining = digest.joining;
    }
}

/// A member first heard of in `digest` (`relayed`: from another member's gossip).
fn new_member(digest: &MemberDigest, now_ns: u64, relayed: bool) -> Member {
    let state = if digest.left {
        MemberState::Left
    } else {
        MemberState::Alive
    };
    Member {
        info: digest.info.clone(),
        incarnation: digest.incarnation,
        heartbeat: digest.heartbeat,
        state,
        since_ns: now_ns,
        versions: digest.versions,
        relay: !digest.left,
        joining: digest.joining,
        anchor: Anchor {
            heartbeat: digest.heartbeat,
            at_ns: now_ns,
        },
        relayed_incarnation: relayed,
    }
}

/// A digest of a known `member` at the same address, relayed by a peer that is not that member:
/// what gossip needs from it, and no more.
/// - A departure is not taken: a leaver tells every member it knows itself, and one it missed
///   finds it dead when it falls silent.
/// - A new life (a restart) is taken only once the member's old one is no longer heard
///   (suspect or dead): a forged restart cannot silence a live member, whose own heartbeats
///   would no longer count.
/// - In the same life: versions only where none were known, a departed member stays departed,
///   a heartbeat at most [`MAX_RELAYED_HEARTBEAT_LEAD`] rounds ahead of the anchor, and a
///   joining member may be said to have joined, never a joined one to be joining again.
fn take_relayed(member: &mut Member, digest: &MemberDigest, now_ns: u64, interval_ns: u64) {
    if digest.left {
        return;
    }
    if digest.incarnation > member.incarnation {
        if member.state != MemberState::Alive {
            take_life(member, digest, now_ns, true);
        }
        return;
    }
    if digest.incarnation < member.incarnation || member.state == MemberState::Left {
        return;
    }
    if member.versions.is_none() {
        member.versions = digest.versions;
    }
    let rounds = now_ns.saturating_sub(member.anchor.at_ns) / interval_ns.max(1);
    let latest = member
        .anchor
        .heartbeat
        .saturating_add(rounds)
        .saturating_add(MAX_RELAYED_HEARTBEAT_LEAD);
    let heartbeat = digest.heartbeat.min(latest);
    if heartbeat <= member.heartbeat {
        return;
    }
    member.heartbeat = heartbeat;
    member.state = MemberState::Alive;
    member.since_ns = now_ns;
    member.relay = true;
    member.joining &= digest.joining;
}

/// The conflict `holder` (alive at its address) answers to a digest claiming its id elsewhere.
fn conflict(holder: &Member, claim: &MemberDigest) -> IdConflict {
    IdConflict {
        id: holder.info.id.clone(),
        holder_addr: holder.info.addr.clone(),
        holder_incarnation: holder.incarnation,
        claimant_addr: claim.info.addr.clone(),
        claimant_incarnation: claim.incarnation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    /// The receiver's clock: a Unix time in ns, as a node's is.
    const NOW: u64 = 1_700_000_000_000 * MS;
    const DAY_MS: u64 = 24 * 3_600 * 1_000;

    fn info(id: &str) -> MemberInfo {
        MemberInfo {
            id: id.into(),
            addr: format!("10.0.0.{}:7100", id.len()),
            region: "eu".into(),
        }
    }

    fn digest(id: &str, incarnation: u64, heartbeat: u64, left: bool) -> Gossip {
        Gossip {
            members: vec![MemberDigest {
                info: info(id),
                incarnation,
                heartbeat,
                left,
                versions: None,
                joining: false,
            }],
        }
    }

    /// A node that knows `victim` alive in incarnation `incarnation`.
    fn knowing_victim(incarnation: u64) -> Membership {
        let mut me = Membership::new(
            info("me"),
            NOW / MS,
            Vec::new(),
            MembershipConfig::default(),
            NOW,
            7,
        );
        drop(me.handle_gossip(NOW, &digest("victim", incarnation, 3, false)));
        assert_eq!(me.state_of("victim"), Some(MemberState::Alive));
        me
    }

    #[test]
    fn a_regions_version_counts_its_own_members_only() {
        let mut me = knowing_victim(NOW / MS);
        let old_elsewhere = MemberDigest {
            info: MemberInfo {
                region: "us".into(),
                ..info("old")
            },
            versions: Some(VersionRange::new(2, 2).unwrap()),
            ..digest("old", NOW / MS, 1, false).members[0].clone()
        };
        drop(me.handle_gossip(
            NOW,
            &Gossip {
                members: vec![old_elsewhere],
            },
        ));
        // `victim` gossiped no range: version 2 alone, as far as anyone can tell.
        assert_eq!(me.region_version("eu"), Some(2));
        drop(me.handle_gossip(
            NOW + MS,
            &Gossip {
                members: vec![MemberDigest {
                    versions: Some(protocol::SUPPORTED),
                    ..digest("victim", NOW / MS, 4, false).members[0].clone()
                }],
            },
        ));
        assert_eq!(
            me.cluster_version(),
            Some(2),
            "the old member of `us` counts"
        );
        assert_eq!(me.region_version("eu"), Some(protocol::NEWEST));
        assert_eq!(me.region_version("us"), Some(2));
        assert_eq!(me.region_version("nowhere"), None);
    }

    #[test]
    fn a_departure_claimed_at_another_incarnation_than_the_known_one_is_refused() {
        let known = NOW / MS - 60_000;
        let mut me = knowing_victim(known);
        for forged in [u64::MAX, known + DAY_MS, known + 1, known - 1, 0] {
            drop(me.handle_gossip(NOW, &digest("victim", forged, u64::MAX, true)));
            assert_eq!(
                me.state_of("victim"),
                Some(MemberState::Alive),
                "a leave at incarnation {forged}"
            );
            assert_eq!(me.incarnation_of("victim"), Some(known));
        }
        // At the known incarnation: not with a heartbeat below one heard alive, nor further
        // ahead than the member's own heartbeats soon reach.
        for forged in [2, 3 + MAX_DEPARTURE_HEARTBEAT_LEAD + 1, u64::MAX] {
            drop(me.handle_gossip(NOW, &digest("victim", known, forged, true)));
            assert_eq!(
                me.state_of("victim"),
                Some(MemberState::Alive),
                "a leave at heartbeat {forged}"
            );
        }
        // The victim's own heartbeats still count.
        drop(me.handle_gossip(NOW + MS, &digest("victim", known, 4, false)));
        assert_eq!(me.state_of("victim"), Some(MemberState::Alive));
        // Its own leave (or a relay of it) is at the incarnation it is known in.
        drop(me.handle_gossip(NOW + 2 * MS, &digest("victim", known, 5, true)));
        assert_eq!(me.state_of("victim"), Some(MemberState::Left));
    }

    #[test]
    fn an_incarnation_more_than_a_day_ahead_of_the_clock_is_refused() {
        let known = NOW / MS - 60_000;
        let mut me = knowing_victim(known);
        let too_far = NOW / MS + MAX_INCARNATION_AHEAD_MS + 1;
        // Pinning a known member at an incarnation its restarts cannot pass...
        drop(me.handle_gossip(NOW, &digest("victim", too_far, 0, false)));
        assert_eq!(me.incarnation_of("victim"), Some(known));
        drop(me.handle_gossip(NOW, &digest("victim", u64::MAX, 0, false)));
        assert_eq!(me.incarnation_of("victim"), Some(known));
        // ...or a member not known yet, alive or departed.
        for left in [false, true] {
            drop(me.handle_gossip(NOW, &digest("newcomer", too_far, 0, left)));
            assert_eq!(me.state_of("newcomer"), None, "left: {left}");
        }
        // A restart is a start time, at most a day ahead of this clock: readmitted.
        let restart = NOW / MS + MAX_INCARNATION_AHEAD_MS;
        drop(me.handle_gossip(NOW, &digest("victim", restart, 0, false)));
        assert_eq!(me.incarnation_of("victim"), Some(restart));
        assert_eq!(me.state_of("victim"), Some(MemberState::Alive));
    }

    /// The worst a forged departure at the known incarnation can now be: it holds until the
    /// member's own heartbeats pass it, and then relaying it again changes nothing.
    #[test]
    fn a_forged_departure_is_undone_by_the_members_own_heartbeats() {
        let known = NOW / MS - 60_000;
        let mut me = knowing_victim(known);
        let forged = 3 + MAX_DEPARTURE_HEARTBEAT_LEAD;
        drop(me.handle_gossip(NOW, &digest("victim", known, forged, true)));
        assert_eq!(me.state_of("victim"), Some(MemberState::Left));
        // Stale or relayed heartbeats up to the departure's do not bring it back...
        drop(me.handle_gossip(NOW + MS, &digest("victim", known, forged, false)));
        assert_eq!(me.state_of("victim"), Some(MemberState::Left));
        // ...the member's own next one does: a leaver never gossips alive past its departure.
        drop(me.handle_gossip(NOW + 2 * MS, &digest("victim", known, forged + 1, false)));
        assert_eq!(me.state_of("victim"), Some(MemberState::Alive));
        drop(me.handle_gossip(NOW + 3 * MS, &digest("victim", known, forged, true)));
        assert_eq!(me.state_of("victim"), Some(MemberState::Alive));
    }

    /// A departure of a member this node never heard of alive is kept (stale gossip does not
    /// revive it) but not passed on: a forged one is not relayed from node to node for ever.
    #[test]
    fn a_departure_of_a_member_never_seen_alive_is_not_passed_on() {
        let mut me = knowing_victim(NOW / MS - 60_000);
        drop(me.handle_gossip(NOW, &digest("other", NOW / MS, 1, false)));
        drop(me.handle_gossip(NOW, &digest("ghost", NOW / MS, 9, true)));
        assert_eq!(me.state_of("ghost"), Some(MemberState::Left));
        drop(me.handle_gossip(NOW, &digest("ghost", NOW / MS, 8, false)));
        assert_eq!(me.state_of("ghost"), Some(MemberState::Left));
        let sent = me.poll(NOW + MS);
        assert!(!sent.is_empty());
        for message in sent {
            let ids: Vec<&str> = message
                .gossip
                .members
                .iter()
                .map(|d| d.info.id.as_str())
                .collect();
            assert_eq!(ids, ["me", "other", "victim"]);
        }
        // A departure of a member it knew is passed on.
        drop(me.handle_gossip(NOW + 2 * MS, &digest("victim", NOW / MS - 60_000, 3, true)));
        let sent = me.poll(NOW + 200 * MS);
        assert!(!sent.is_empty());
        for message in sent {
            assert!(
                message
                    .gossip
                    .members
                    .iter()
                    .any(|d| d.info.id == "victim" && d.left)
            );
        }
    }

    #[test]
    fn a_departed_member_is_readmitted_by_a_restart_not_by_a_forged_incarnation() {
        let known = NOW / MS - 60_000;
        let mut me = knowing_victim(known);
        drop(me.handle_gossip(NOW, &digest("victim", known, 4, true)));
        assert_eq!(me.state_of("victim"), Some(MemberState::Left));
        drop(me.handle_gossip(NOW, &digest("victim", u64::MAX, 0, false)));
        assert_eq!(me.state_of("victim"), Some(MemberState::Left));
        drop(me.handle_gossip(NOW, &digest("victim", NOW / MS, 0, false)));
        assert_eq!(me.state_of("victim"), Some(MemberState::Alive));
    }

    fn seed_member(id: &str, host: u8) -> MemberInfo {
        MemberInfo {
            id: id.into(),
            addr: format!("10.0.1.{host}:7100"),
            region: "eu".into(),
        }
    }

    /// Gossip between every pair at rounds `rounds` (of the default interval, from `NOW`).
    fn gossip_rounds(nodes: &mut [Membership], rounds: std::ops::RangeInclusive<u64>) {
        let interval = MembershipConfig::default().gossip_interval_ns;
        for round in rounds {
            let now = NOW + round * interval;
            // Each node's round (its heartbeat moves on), then every view to every other.
            nodes.iter_mut().for_each(|node| drop(node.poll(now)));
            let views: Vec<Gossip> = nodes.iter().map(Membership::digest).collect();
            for (i, node) in nodes.iter_mut().enumerate() {
                for (j, view) in views.iter().enumerate() {
                    if i != j {
                        node.handle_gossip(now, view);
                    }
                }
            }
        }
    }

    /// Nodes started together with one seed list naming them all (by node id, beside
    /// advertised IPs): the smallest id founds once the founding rounds have passed, and the
    /// others settle by it; no other one founds a cluster of its own.
    #[test]
    fn nodes_started_together_are_founded_by_the_smallest_seed() {
        let seeds = vec![
            "a.internal:7100".to_owned(),
            "b.internal:7100".to_owned(),
            "c.internal:7100".to_owned(),
        ];
        let mut nodes: Vec<Membership> = ["a.internal", "b.internal", "c.internal"]
            .iter()
            .zip(1..)
            .map(|(id, host)| {
                let config = MembershipConfig::default();
                Membership::new(
                    seed_member(id, host),
                    1,
                    seeds.clone(),
                    config,
                    NOW,
                    host.into(),
                )
            })
            .collect();
        assert!(nodes.iter().all(Membership::is_joining));
        gossip_rounds(&mut nodes, 1..=FOUNDING_ROUNDS - 1);
        assert!(
            nodes.iter().all(Membership::is_joining),
            "too early to found"
        );
        gossip_rounds(&mut nodes, FOUNDING_ROUNDS..=FOUNDING_ROUNDS);
        assert!(!nodes[0].is_joining(), "the smallest seed founds");
        // One round to hear the founder settled, one more for the others to hear that.
        gossip_rounds(&mut nodes, FOUNDING_ROUNDS + 1..=FOUNDING_ROUNDS + 2);
        for node in &nodes {
            assert!(!node.is_joining());
            assert_eq!(
                node.owners(),
                vec!["a.internal", "b.internal", "c.internal"]
            );
        }
    }

    /// Nodes whose seeds do not name themselves (each seeded with the other) wait out the
    /// failure detector's timeout, then the smaller id founds and the other joins it.
    #[test]
    fn nodes_outside_their_own_seeds_found_after_the_failure_timeout() {
        let config = MembershipConfig::default();
        let mut nodes = vec![
            Membership::new(
                seed_member("a", 1),
                1,
                vec!["10.0.1.2:7100".into()],
                config,
                NOW,
                1,
            ),
            Membership::new(
                seed_member("b", 2),
                1,
                vec!["10.0.1.1:7100".into()],
                config,
                NOW,
                2,
            ),
        ];
        let timeout_rounds = config.dead_after_ns / config.gossip_interval_ns;
        gossip_rounds(&mut nodes, 1..=timeout_rounds - 1);
        assert!(
            nodes.iter().all(Membership::is_joining),
            "neither is among its seeds: they wait for a settled member first"
        );
        gossip_rounds(&mut nodes, timeout_rounds..=timeout_rounds);
        // The smaller id founds in its round; the other hears it in the same exchange.
        assert!(!nodes[0].is_joining(), "the smaller id founds");
        gossip_rounds(&mut nodes, timeout_rounds + 1..=timeout_rounds + 2);
        for node in &nodes {
            assert!(!node.is_joining());
            assert_eq!(node.owners(), vec!["a", "b"]);
        }
    }

    /// A node whose seeds never answer knows nobody and never founds: a cluster may be there
    /// beyond them.
    #[test]
    fn a_node_that_knows_no_member_never_founds() {
        let config = MembershipConfig::default();
        let mut nodes = vec![Membership::new(
            seed_member("a", 1),
            1,
            vec!["10.0.1.2:7100".into()],
            config,
            NOW,
            1,
        )];
        gossip_rounds(&mut nodes, 1..=10 * FOUNDING_ROUNDS);
        assert!(nodes[0].is_joining());
    }

    /// Gossip from "mallory", whose certificate names only itself.
    fn from_mallory(me: &mut Membership, now: u64, members: Vec<MemberDigest>) {
        drop(me.handle_gossip_from(now, &|id| id == "mallory", &Gossip { members }));
    }

    fn claim(id: &str, incarnation: u64, heartbeat: u64) -> MemberDigest {
        let Gossip { mut members } = digest(id, incarnation, heartbeat, false);
        members.remove(0)
    }

    /// A node that heard `victim` itself, alive at heartbeat 3 of `incarnation`, at `NOW`.
    fn heard_victim(incarnation: u64) -> Membership {
        let mut me = Membership::new(
            info("me"),
            NOW / MS,
            Vec::new(),
            MembershipConfig::default(),
            NOW,
            7,
        );
        let own = claim("victim", incarnation, 3);
        let own = MemberDigest {
            versions: Some(protocol::SUPPORTED),
            ..own
        };
        drop(me.handle_gossip_from(NOW, &|id| id == "victim", &Gossip { members: vec![own] }));
        me
    }

    /// One peer's relayed claims about a live member cannot retire it, restart it, make it
    /// joining again, move it to another region or say it speaks other versions: it keeps its
    /// slots, in the life and region it gossips itself.
    #[test]
    fn a_peer_cannot_speak_for_another_live_member() {
        let known = NOW / MS - 60_000;
        let mut me = heard_victim(known);
        let elsewhere = MemberInfo {
            region: "us".into(),
            ..info("victim")
        };
        let forged = [
            MemberDigest {
                left: true,
                ..claim("victim", known, 4)
            },
            claim("victim", NOW / MS, 1),
            MemberDigest {
                joining: true,
                ..claim("victim", known, 4)
            },
            MemberDigest {
                info: elsewhere,
                ..claim("victim", known, 4)
            },
            MemberDigest {
                versions: Some(VersionRange::new(2, 2).unwrap()),
                ..claim("victim", known, 4)
            },
        ];
        for claim in forged {
            from_mallory(&mut me, NOW, vec![claim.clone()]);
            assert_eq!(me.state_of("victim"), Some(MemberState::Alive), "{claim:?}");
            assert_eq!(me.incarnation_of("victim"), Some(known), "{claim:?}");
            assert_eq!(me.info("victim").unwrap().region, "eu", "{claim:?}");
            assert_eq!(me.owners(), vec!["me", "victim"], "{claim:?}");
            assert_eq!(me.versions_of("victim"), Some(protocol::SUPPORTED));
        }
        // The member's own word still counts: its leave is taken.
        let leave = MemberDigest {
            left: true,
            ..claim("victim", known, 5)
        };
        drop(me.handle_gossip_from(
            NOW,
            &|id| id == "victim",
            &Gossip {
                members: vec![leave],
            },
        ));
        assert_eq!(me.state_of("victim"), Some(MemberState::Left));
    }

    /// A relayed heartbeat far ahead of the member's own cannot pin it: the member's own
    /// heartbeats, one a round, keep counting, and it is never suspected while it gossips.
    #[test]
    fn a_relayed_heartbeat_cannot_outrun_the_members_own() {
        let known = NOW / MS - 60_000;
        let mut me = heard_victim(known);
        let interval = MembershipConfig::default().gossip_interval_ns;
        let dead_after = MembershipConfig::default().dead_after_ns;
        from_mallory(&mut me, NOW, vec![claim("victim", known, u64::MAX - 1)]);
        assert!(me.heartbeat_of("victim").unwrap() <= 3 + MAX_RELAYED_HEARTBEAT_LEAD);
        for round in 1..=3 * dead_after / interval {
            let now = NOW + round * interval;
            drop(me.poll(now));
            let own = claim("victim", known, 3 + round);
            drop(me.handle_gossip_from(now, &|id| id == "victim", &Gossip { members: vec![own] }));
            // The forger keeps relaying its pin every round.
            from_mallory(&mut me, now, vec![claim("victim", known, u64::MAX - 1)]);
            assert_eq!(
                me.state_of("victim"),
                Some(MemberState::Alive),
                "round {round}"
            );
        }
        // Once the forger stops, the member's own heartbeats pass what it left behind within
        // the lead: never long enough to be suspected.
        let pinned = me.heartbeat_of("victim").unwrap();
        let last_own = 3 + 3 * dead_after / interval;
        assert!(pinned <= last_own + MAX_RELAYED_HEARTBEAT_LEAD, "{pinned}");
    }

    /// A relayed restart is taken once the member's old life is no longer heard (that is how a
    /// restart looks from afar); the member's own word of its earlier life overrides a later
    /// life only a relay told of.
    #[test]
    fn a_relayed_restart_waits_for_silence_and_yields_to_the_members_own_word() {
        let known = NOW / MS - 60_000;
        let mut me = heard_victim(known);
        let config = MembershipConfig::default();
        let silent = NOW + config.suspect_after_ns;
        drop(me.poll(silent));
        assert_eq!(me.state_of("victim"), Some(MemberState::Suspect));
        from_mallory(&mut me, silent, vec![claim("victim", NOW / MS, 1)]);
        assert_eq!(me.incarnation_of("victim"), Some(NOW / MS));
        assert_eq!(me.state_of("victim"), Some(MemberState::Alive));
        let own = claim("victim", known, 9);
        drop(me.handle_gossip_from(silent, &|id| id == "victim", &Gossip { members: vec![own] }));
        assert_eq!(me.incarnation_of("victim"), Some(known));
        assert_eq!(me.heartbeat_of("victim"), Some(9));
    }
}

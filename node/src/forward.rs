//! Answers a check batch in a cluster: decides this node's groups, forwards the others (one
//! frame per owner, all at once), and places again what an owner refused as `not_owner`. Where
//! each group goes is the ownership machine's answer (`floodgate::cluster::ownership`); this
//! file waits, decides and sends.
//!
//! What keeps each key decided by one bucket while slots move or a node is slow:
//! - groups are placed and decided under `SlotOwnership::deciding`: a table switch waits for them,
//!   so the hand-off exported after a switch holds every decision made here;
//! - a group whose gained slot still waits for its previous owner's hand-off is answered
//!   `try_again` at once, so no frame waits on another group's hand-off (a caller of an older
//!   version, which knows no `try_again`, waits for the hand-off, bounded, as before);
//! - a slot this node handed off is not decided here again: a forwarded check for it is
//!   answered `not_owner`; the forwarder waits (bounded) for its own table to catch up and
//!   places the check again, here or with the owner its table now names. A check travels at
//!   most two forwards, and a forwarded check is never forwarded on;
//! - an owner that does not answer a forward within `FORWARD_TIMEOUT`, or that a client
//!   lost (a takeover), stays the one decider while the failure detector holds it alive: the
//!   check is answered `try_again`. Only once it is suspected does this node decide: as the
//!   slot's successor it holds the owner's replicas.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ops::Range;
use std::time::Duration;

use floodgate::cluster::ownership::{Arrival, Failed, Placement, Refusal};
use floodgate::protocol::Feature;
use floodgate::region::Scope;
use floodgate::wire::{
    ArchivedCheckBatch, CheckGroups, ErrorCode, Frame, FrameKind, ScopedCheckBatch, ValidCheck,
    WireDecision, encode_message,
};
use floodgate::{Clock, EpochClock};
use rkyv::rancor;

use crate::caller::{Caller, REFUND_REFUSED};
use crate::check_path::CheckPath;
use crate::cluster::RegionRings;
use crate::metrics::DecisionTally;
use crate::owner_batches::{self, Outgoing, Received};
use crate::reach::Reach;
use crate::region_sync::GlobalChecks;
use crate::service::{decide_group, decode_frame_into, finish_batch, prefetch_before};
use std::sync::Arc;

/// Longest a node waits for its slot table to catch up with a peer's.
const TABLE_CATCH_UP: Duration = Duration::from_millis(300);

/// How many global groups ahead of the one being decided have their exchange entries
/// prefetched (as the store's buckets are, a burst ahead).
const PREFETCH_AHEAD: usize = 8;

/// Longest a forwarded group waits for its owner's answer. Peers answer in well under a
/// millisecond; one silent this long is stalled or gone, and the frame behind it (a stream
/// answers in order) should not wait longer. An unanswered group decides nothing twice: it is
/// answered `try_again` while the owner is held alive.
const FORWARD_TIMEOUT: Duration = Duration::from_millis(100);

/// Where a group's decisions come from.
#[derive(Debug, Clone, PartialEq)]
enum GroupState {
    /// Decided here: a range of the local decisions.
    Here(Range<usize>),
    /// To be sent to this owner.
    Remote(String),
    /// The owner's answer.
    Answered(Vec<WireDecision>),
    /// The owner it was sent to answered `not_owner` (it had handed the slot off).
    NotOwner(String),
    /// Sent, but no answer came in time.
    Unanswered,
    /// Not decided: every check of the group answers this code.
    Refused(ErrorCode),
    /// A group with a `home` check of another region: decided by the owner in that region.
    Home,
}

/// A refusal of the ownership machine as the code a check is answered with.
fn refusal_code(refusal: Refusal) -> ErrorCode {
    match refusal {
        Refusal::NotOwner => ErrorCode::NotOwner,
        Refusal::ShuttingDown => ErrorCode::ShuttingDown,
        Refusal::TryAgain => ErrorCode::TryAgain,
    }
}

/// Buffers one batch on the cluster path uses from start to answer, reused from batch to
/// batch: fresh ones cost an allocation each per frame (several for the decoded groups). A
/// batch may wait (for hand-offs, for forwards) and another batch run on the thread meanwhile,
/// so each batch takes a set of its own from the thread's spares and gives it back when done.
#[derive(Default)]
pub(crate) struct BatchBuffers {
    pub(crate) groups: CheckGroups,
    placements: Vec<Placement>,
    placed: Vec<GroupState>,
    decisions: Vec<WireDecision>,
}

/// Spare sets kept per thread: about as many as batches wait at once on one thread; a set given
/// back beyond it is freed.
const SPARE_BUFFERS: usize = 16;

thread_local! {
    static SPARE_BUFFERS_HERE: std::cell::RefCell<Vec<BatchBuffers>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

impl BatchBuffers {
    /// A spare set of this thread's, or a fresh one.
    pub(crate) fn take() -> Self {
        SPARE_BUFFERS_HERE
            .try_with(|spares| spares.try_borrow_mut().ok()?.pop())
            .ok()
            .flatten()
            .unwrap_or_default()
    }

    /// Keeps the set for this thread's next batch (its contents are dropped, its room kept).
    pub(crate) fn give_back(mut self) {
        self.placements.clear();
        self.placed.clear();
        self.decisions.clear();
        let _ = SPARE_BUFFERS_HERE.try_with(|spares| {
            if let Ok(mut spares) = spares.try_borrow_mut()
                && spares.len() < SPARE_BUFFERS
            {
                spares.push(self);
            }
        });
    }
}

/// Answers a check batch from a caller (client or peer).
pub(crate) async fn answer_check_batch(
    checks: &CheckPath,
    caller: Caller<'_>,
    frame: &Frame,
    now_ns: u64,
    out: &mut Vec<u8>,
) -> Option<ErrorCode> {
    let limits = checks.limits;
    let mut buffers = BatchBuffers::take();
    let mut groups = std::mem::take(&mut buffers.groups);
    if let Err(code) = decode_frame_into(frame, &limits.wire(), &mut groups, out) {
        buffers.groups = groups;
        buffers.give_back();
        return Some(code);
    }
    // Already validated by decode_frame_into, so this access succeeds.
    let received = || {
        rkyv::access::<ArchivedCheckBatch, rancor::Error>(&frame.payload)
            .ok()
            .map(Received::Archived)
    };
    let refused = answer_groups(
        checks,
        caller,
        frame,
        &groups,
        &[],
        received,
        now_ns,
        &mut buffers,
        out,
    )
    .await;
    buffers.groups = groups;
    buffers.give_back();
    refused
}

/// Answers a validated batch's `groups` (kinds 1, 10, 12 and 20) whose checks have `scopes`
/// (one per check in flattened order; none: every check `region`): every scope takes the
/// same path through the gate, hand-off, forwarding and takeover. `received` gives the
/// validated batch again, for what is forwarded. A refund group the caller may not make is
/// refused before it is placed.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn answer_groups<'f>(
    checks: &CheckPath,
    caller: Caller<'_>,
    frame: &Frame,
    groups: &CheckGroups,
    scopes: &[Scope],
    received: impl FnOnce() -> Option<Received<'f>>,
    now_ns: u64,
    buffers: &mut BatchBuffers,
    out: &mut Vec<u8>,
) -> Option<ErrorCode> {
    let forwarded_by = matches!(
        frame.kind,
        FrameKind::ForwardedCheckBatch | FrameKind::ForwardedScopedCheckBatch
    )
    .then_some(frame.request_id);
    let mut decided = decide_groups(
        checks,
        caller,
        forwarded_by,
        groups,
        scopes,
        received,
        now_ns,
        buffers,
    )
    .await;
    finish_batch(
        &checks.metrics,
        &decided.tally,
        frame.request_id,
        &mut decided.decisions,
        decided.table_version,
        out,
    );
    buffers.decisions = decided.decisions;
    None
}

/// A batch's decisions (one per check, in order), the version of the table they were made by,
/// and what they were, for the metrics.
pub(crate) struct Decided {
    pub(crate) decisions: Vec<WireDecision>,
    pub(crate) table_version: u64,
    pub(crate) tally: DecisionTally,
}

/// Decides a validated batch's `groups` as [`answer_groups`] does, without a frame: the fronts
/// that are not QUIC (`front_batch`) take the decisions as they are. `forwarded_by` is the
/// sender's table version when a peer forwarded the batch.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn decide_groups<'f>(
    checks: &CheckPath,
    caller: Caller<'_>,
    forwarded_by: Option<u64>,
    groups: &CheckGroups,
    scopes: &[Scope],
    received: impl FnOnce() -> Option<Received<'f>>,
    now_ns: u64,
    buffers: &mut BatchBuffers,
) -> Decided {
    let each = || groups.iter();
    let refused = caller.take_refunds(each());
    let mut batch = Batch::new(checks, groups, scopes, now_ns);
    batch.local = std::mem::take(&mut buffers.decisions);
    batch.local.clear();
    batch.local.reserve(groups.check_count());
    batch.refused = &refused;
    let forwarded = forwarded_by.is_some();
    if let Some(sender_version) = forwarded_by {
        batch.catch_up(sender_version).await;
    }
    let mut placed = std::mem::take(&mut buffers.placed);
    let table_version = batch
        .place_first(
            forwarded,
            caller.try_again,
            &mut buffers.placements,
            &mut placed,
        )
        .await;
    if placed
        .iter()
        .any(|p| matches!(p, GroupState::Remote(_) | GroupState::Home))
    {
        let received = received();
        batch.refuse_unreadable_metered(&mut placed);
        let homes: Vec<usize> = (0..placed.len())
            .filter(|&i| placed[i] == GroupState::Home)
            .collect();
        if !homes.is_empty() {
            let answers =
                crate::reach::forward_home(checks, received, &batch.reach, groups, &homes).await;
            for (i, answer) in answers {
                placed[i] = GroupState::Answered(answer);
            }
        }
        batch
            .forward_rounds(received, &mut placed, table_version)
            .await;
    }
    let Batch { tally, local, .. } = batch;
    let (mut decisions, held) = assemble(groups, &mut placed, local);
    buffers.placed = placed;
    checks.metrics.try_again.increment(held as u64);
    caller.settle(each(), &decisions, &refused);
    if held > 0 && !caller.try_again {
        // An older caller knows no `try_again`: it fails over as for a node going away.
        let shutting_down = WireDecision::error(ErrorCode::ShuttingDown);
        for decision in &mut decisions {
            if decision.to_decision() == Err(ErrorCode::TryAgain) {
                *decision = shutting_down;
            }
        }
    }
    Decided {
        decisions,
        table_version,
        tally,
    }
}

/// How group `i` of a batch whose groups reach `reach` is decided (`Region` for a batch
/// without scopes, whose `reach` is empty).
fn reach_of(reach: &[Reach], i: usize) -> &Reach {
    reach.get(i).unwrap_or(&Reach::Region)
}

/// One batch's groups, and the decisions made here so far.
struct Batch<'a> {
    checks: &'a CheckPath,
    groups: &'a CheckGroups,
    /// One per check in flattened order, or none (every check `region`).
    scopes: &'a [Scope],
    /// Where each group's scopes start in `scopes` (empty with it).
    starts: Vec<usize>,
    /// How each group is decided, from its scopes.
    reach: Vec<Reach>,
    /// The other regions' owners, read once a global group is decided here.
    rings: Option<Arc<RegionRings>>,
    /// Groups before this one have had their exchange entries prefetched (if global).
    prefetched_to: usize,
    now_ns: u64,
    tally: DecisionTally,
    /// Decisions made here, in the order made; `GroupState::Here` holds ranges of it.
    local: Vec<WireDecision>,
    /// Refund groups the caller may not make, by group (empty: none).
    refused: &'a [bool],
}

impl<'a> Batch<'a> {
    fn new(
        checks: &'a CheckPath,
        groups: &'a CheckGroups,
        scopes: &'a [Scope],
        now_ns: u64,
    ) -> Self {
        let mut starts = Vec::new();
        let mut reach = Vec::new();
        if !scopes.is_empty() {
            let mine = checks.members.me().region.as_str();
            let mut start = 0;
            for group in groups.iter() {
                starts.push(start);
                let end = (start + group.len()).min(scopes.len());
                reach.push(Reach::of(group, &scopes[start..end], mine));
                start = end;
            }
        }
        Batch {
            checks,
            groups,
            scopes,
            starts,
            reach,
            rings: None,
            prefetched_to: 0,
            now_ns,
            tally: DecisionTally::default(),
            local: Vec::new(),
            refused: &[],
        }
    }

    /// How group `i` is decided (`Region` for a batch without scopes).
    fn reach(&self, i: usize) -> &Reach {
        reach_of(&self.reach, i)
    }

    /// The scopes of group `i`'s checks (empty for a batch without scopes).
    fn scopes_of(&self, i: usize) -> &'a [Scope] {
        match self.starts.get(i) {
            Some(&start) => &self.scopes[start..start + self.groups[i].len()],
            None => &[],
        }
    }

    /// The slot of group `i` (where its first key lives: a client groups keys of one owner).
    fn slot(&self, i: usize) -> u16 {
        self.groups[i].first().map_or(0, |c| c.key.slot())
    }

    fn slots(&self) -> impl Iterator<Item = u16> + Clone + '_ {
        (0..self.groups.len()).map(|i| self.slot(i))
    }

    fn arrival(&self, i: usize, forwarded: bool) -> Arrival {
        if forwarded {
            return Arrival::Forwarded;
        }
        Arrival::from_client(self.groups[i].first().is_some_and(|check| check.takeover))
    }

    /// Decides group `i` here: a group with `global` checks through the region exchange
    /// (the admission rule, then queued for the key's owner in every other region) in the
    /// `global` session, opened by the first such group, any other from the bucket alone.
    fn decide(
        &mut self,
        i: usize,
        global: &mut Option<GlobalChecks<'a, EpochClock>>,
    ) -> GroupState {
        let start = self.local.len();
        if *self.reach(i) == Reach::Global {
            let checks = self.checks;
            // The exchange's entries of the global groups up to PREFETCH_AHEAD ahead, each once.
            let ahead = self.prefetched_to.max(i + 1)..i + 1 + PREFETCH_AHEAD;
            self.prefetched_to = ahead.end;
            let scopes = self.scopes_of(i);
            // The rings are read once a batch, before the exchange's lock is taken (as
            // everywhere else), and borrowed after: not a reference count taken and given back
            // per group (a locked instruction each, which waits for the group's stores to land).
            let fresh = self.rings.is_none();
            let rings: &RegionRings = self.rings.get_or_insert_with(|| checks.regions.rings());
            let session = global.get_or_insert_with(|| checks.region_sync.global_checks());
            if fresh {
                session.set_regions(rings.regions());
            }
            for j in ahead {
                if *reach_of(&self.reach, j) == Reach::Global
                    && let Some(check) = self.groups.group(j).and_then(<[_]>::first)
                {
                    session.prefetch(check.key, rings.owners_elsewhere(check.key.slot()));
                }
            }
            // A group of one global check (the usual one) needs no list of its own.
            let global: Cow<'_, [bool]> = match scopes {
                [Scope::Global] => Cow::Borrowed(&[true]),
                _ => scopes.iter().map(|s| *s == Scope::Global).collect(),
            };
            crate::reach::decide_global_group(
                session,
                rings,
                &self.groups[i],
                &global,
                &mut self.local,
            );
        } else {
            decide_group(
                &self.checks.store,
                &mut self.tally,
                self.now_ns,
                &self.groups[i],
                &mut self.local,
            );
        }
        GroupState::Here(start..self.local.len())
    }

    /// A forwarded batch's request id is the version of the sender's table, which names this
    /// node as the owner. Unless that is a table this node had before (the sender is behind),
    /// ours may be the older one: wait (bounded) for it to name this node, so the hand-off wait
    /// that follows sees the change.
    async fn catch_up(&self, sender_version: u64) {
        let checks = self.checks;
        if checks.slots.had_version(sender_version) {
            return;
        }
        let me = checks.members.me().id.as_str();
        checks
            .slots
            .wait_for_table(TABLE_CATCH_UP, |table| {
                !table.contains(me) || self.slots().all(|s| table.owner(s) == Some(me))
            })
            .await;
    }

    /// Refuses (`not_owner`: the client's failure mode decides) the groups to be sent to
    /// another node that carry a peek or a charge when the receiver may read neither: an older
    /// receiver would refuse the whole frame, with the other groups in it. An owner in this
    /// region is asked for by its own version; a home region's owner is not known here, so
    /// there every member must read them.
    fn refuse_unreadable_metered(&self, placed: &mut [GroupState]) {
        let members = &self.checks.members;
        if Feature::MeteredCosts.readable_at(members.cluster_version()) {
            return;
        }
        for (i, place) in placed.iter_mut().enumerate() {
            let unreadable = match place {
                GroupState::Remote(owner) => {
                    !Feature::MeteredCosts.readable_at(members.version_with(owner))
                }
                GroupState::Home => true,
                _ => false,
            };
            if unreadable && is_metered(&self.groups[i]) {
                *place = GroupState::Refused(ErrorCode::NotOwner);
            }
        }
    }

    /// Decides what is this node's, and marks the rest for forwarding or refusal, into
    /// `placed` (one per group; `placements` is scratch). Returns the version of the table
    /// they were made by. With `try_again` (the caller knows that answer) nothing waits: a
    /// group whose slot awaits its hand-off is answered `try_again`; otherwise gained slots
    /// wait (bounded) for their hand-off first.
    async fn place_first(
        &mut self,
        forwarded: bool,
        try_again: bool,
        placements: &mut Vec<Placement>,
        placed: &mut Vec<GroupState>,
    ) -> u64 {
        let checks = self.checks;
        // The machine places every group by the table in force (stable under the gate); slots
        // this node gave away are refused to a forwarder.
        let deciding = if try_again {
            checks.slots.deciding()
        } else {
            checks.slots.enter_deciding(self.slots(), self.now_ns).await
        };
        let version = checks.slots.place_each_into(
            (0..self.groups.len()).map(|i| (self.slot(i), self.arrival(i, forwarded))),
            checks.clock.now_ns(),
            placements,
        );
        let mut taken_over = 0;
        // Taken by the first global group, given back after the last.
        let mut global = None;
        placed.clear();
        placed.reserve(self.groups.len());
        for (i, placement) in placements.drain(..).enumerate() {
            prefetch_before(&checks.store, i, |j| self.groups.group(j));
            placed.push(match placement {
                _ if self.refused.get(i).copied().unwrap_or(false) => {
                    GroupState::Refused(REFUND_REFUSED)
                }
                // Decided in its home region, never here; a forwarded one is not sent on.
                _ if matches!(self.reach(i), Reach::Home(_)) && forwarded => {
                    GroupState::Refused(ErrorCode::NotOwner)
                }
                _ if matches!(self.reach(i), Reach::Home(_)) => GroupState::Home,
                Placement::Decide => self.decide(i, &mut global),
                Placement::Takeover => {
                    taken_over += self.groups[i].len() as u64;
                    self.decide(i, &mut global)
                }
                Placement::Forward(owner) => GroupState::Remote(owner),
                Placement::Refuse(refusal) => GroupState::Refused(refusal_code(refusal)),
            });
        }
        drop(global);
        drop(deciding);
        checks.metrics.taken_over.increment(taken_over);
        version
    }

    /// Forwards the `Remote` groups; those refused (`not_owner`) or unanswered are placed again
    /// once (the machine's `place_again`) and, if sent on, their answers taken as they come.
    async fn forward_rounds(
        &mut self,
        received: Option<Received<'_>>,
        placed: &mut [GroupState],
        table_version: u64,
    ) {
        let checks = self.checks;
        let mut version = table_version;
        for last_round in [false, true] {
            if !placed.iter().any(|p| matches!(p, GroupState::Remote(_))) {
                return;
            }
            self.forward(received, placed, version).await;
            for (i, place) in placed.iter_mut().enumerate() {
                // The owner may have taken it: sending it again could count it twice.
                if *place == GroupState::Unanswered && is_charge(&self.groups[i]) {
                    *place = GroupState::Refused(ErrorCode::OutcomeUnknown);
                }
            }
            let failed: Vec<usize> = (0..placed.len())
                .filter(|&i| matches!(placed[i], GroupState::NotOwner(_) | GroupState::Unanswered))
                .collect();
            if failed.is_empty() {
                return;
            }
            if !last_round {
                // A refuser handed the slot off after our table was read: wait for ours to
                // name someone else, then for that hand-off if the slot is now ours.
                self.catch_up_with_refusers(&failed, placed).await;
            }
            // Only an unanswered forward asks; read before the ownership lock.
            let suspected = if failed
                .iter()
                .any(|&i| matches!(placed[i], GroupState::Unanswered))
            {
                checks.members.suspected_members()
            } else {
                Vec::new()
            };
            let _deciding = checks.slots.deciding();
            let now = checks.clock.now_ns();
            let placements: Vec<(usize, Placement)> = {
                let ownership = checks.slots.ownership();
                version = ownership.table().version();
                failed
                    .into_iter()
                    .map(|i| {
                        let slot = self.slot(i);
                        let how = match &placed[i] {
                            GroupState::NotOwner(by) => Failed::NotOwner(by.clone()),
                            _ => Failed::Unanswered,
                        };
                        // Gained meanwhile with its state not here yet: `try_again`, not
                        // decided fresh.
                        let placement = ownership.place_again(slot, &how, last_round, now, |id| {
                            suspected.iter().any(|s| s == id)
                        });
                        (i, placement)
                    })
                    .collect()
            };
            let mut global = None;
            for (i, placement) in placements {
                placed[i] = match placement {
                    Placement::Decide | Placement::Takeover => self.decide(i, &mut global),
                    Placement::Forward(owner) => GroupState::Remote(owner),
                    Placement::Refuse(refusal) => GroupState::Refused(refusal_code(refusal)),
                };
            }
        }
    }

    /// Waits (at most [`TABLE_CATCH_UP`]) until this node's table no longer names, as the owner
    /// of each `failed` group refused `not_owner`, the node that refused it.
    async fn catch_up_with_refusers(&self, failed: &[usize], placed: &[GroupState]) {
        let refused: Vec<(u16, String)> = failed
            .iter()
            .filter_map(|&i| match &placed[i] {
                GroupState::NotOwner(by) => Some((self.slot(i), by.clone())),
                _ => None,
            })
            .collect();
        if !refused.is_empty() {
            self.checks
                .slots
                .wait_for_table(TABLE_CATCH_UP, |table| {
                    refused.iter().all(|(s, by)| table.owner(*s) != Some(by))
                })
                .await;
        }
    }
}

/// True for a group of charges (a group is all charges or none).
fn is_charge(group: &[ValidCheck]) -> bool {
    group.first().is_some_and(|c| c.charge)
}

/// True for a group with a peek or a charge, which a node before protocol version 6 refuses.
fn is_metered(group: &[ValidCheck]) -> bool {
    group.iter().any(|c| c.peek || c.charge)
}

/// The batch's decisions in request order, from where each group was placed, and how many
/// of them are `try_again`.
/// `placed` is left empty.
fn assemble(
    groups: &CheckGroups,
    placed: &mut Vec<GroupState>,
    local: Vec<WireDecision>,
) -> (Vec<WireDecision>, usize) {
    if placed.iter().all(|p| matches!(p, GroupState::Here(_))) {
        // Decided here in order: nothing to rearrange.
        placed.clear();
        return (local, 0);
    }
    let mut decisions = Vec::with_capacity(local.capacity());
    let mut held = 0;
    for (group, place) in groups.iter().zip(placed.drain(..)) {
        let refused = |code| std::iter::repeat_n(WireDecision::error(code), group.len());
        // Sent on with no answer: a charge may have been taken there.
        let unresolved = |code| {
            refused(if is_charge(group) {
                ErrorCode::OutcomeUnknown
            } else {
                code
            })
        };
        match place {
            GroupState::Here(range) => decisions.extend_from_slice(&local[range]),
            GroupState::Answered(answer) => {
                held += answer
                    .iter()
                    .filter(|d| d.to_decision() == Err(ErrorCode::TryAgain))
                    .count();
                decisions.extend(answer);
            }
            GroupState::Refused(code) => {
                if code == ErrorCode::TryAgain {
                    held += group.len();
                }
                decisions.extend(refused(code));
            }
            // Every forward was resolved before; answer as a node that could not decide.
            GroupState::Remote(_) | GroupState::NotOwner(_) | GroupState::Unanswered => {
                decisions.extend(unresolved(ErrorCode::ShuttingDown))
            }
            // Its home region did not answer: the check's failure mode decides at the client.
            GroupState::Home => decisions.extend(unresolved(ErrorCode::NotOwner)),
        }
    }
    (decisions, held)
}

impl Batch<'_> {
    /// Sends each owner its `Remote` groups (re-encoded from the batch received) as one
    /// forwarded frame, all owners at once, and records what comes back in time. The frames
    /// carry `table_version` (the table that placed them) as their request id. Groups with
    /// `global` checks travel with their scopes (kind 20) to an owner that reads that kind; to
    /// an older one they are answered `not_owner` (the client's failure mode decides).
    async fn forward(
        &self,
        received: Option<Received<'_>>,
        placed: &mut [GroupState],
        table_version: u64,
    ) {
        let checks = self.checks;
        let groups = self.groups;
        let mut remote: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, place) in placed.iter_mut().enumerate() {
            if let GroupState::Remote(owner) = place {
                remote.entry(std::mem::take(owner)).or_default().push(i);
                *place = GroupState::Unanswered;
            }
        }
        // A forwarded batch is decided by its owner and never sent on, so the owner's version
        // says whether it reads scopes: other regions' members (on another build while regions
        // are upgraded one after the other) do not count.
        for (owner, indices) in &mut remote {
            if Feature::ForwardedScopes.readable_at(checks.members.version_with(owner)) {
                continue;
            }
            indices.retain(|&i| {
                let global = *self.reach(i) == Reach::Global;
                if global {
                    placed[i] = GroupState::Refused(ErrorCode::NotOwner);
                }
                !global
            });
        }
        remote.retain(|_, indices| !indices.is_empty());
        let batches = owner_batches::batches(received, remote, |indices, batch| {
            let outgoing = if indices.iter().any(|&i| *self.reach(i) == Reach::Global) {
                let mut frame = Vec::new();
                let scopes: Vec<Scope> = indices
                    .iter()
                    .flat_map(|&i| self.scopes_of(i).iter().cloned())
                    .collect();
                encode_message(
                    &mut frame,
                    FrameKind::ForwardedScopedCheckBatch,
                    table_version,
                    &ScopedCheckBatch::new(batch, &scopes),
                );
                Outgoing::Frame(frame)
            } else {
                Outgoing::Coalesced {
                    groups: batch.groups,
                    table_version,
                }
            };
            checks
                .metrics
                .forwarded
                .increment(indices.iter().map(|&i| groups[i].len() as u64).sum());
            let takeover = indices
                .iter()
                .any(|&i| groups[i].first().is_some_and(|c| c.takeover));
            // A takeover's client lost the owner already and waits for this answer within its
            // own deadline (5 ms by default): it hears `try_again` before that deadline rather
            // than timing out on this node too (and opening its breaker to it), and the stream
            // behind this frame waits no longer.
            let within = if takeover {
                checks.takeover_forward_timeout
            } else {
                FORWARD_TIMEOUT
            };
            (outgoing, within)
        });
        for answer in owner_batches::send(checks, batches, groups).await {
            placed[answer.group] = if answer
                .decisions
                .first()
                .is_some_and(|d| d.to_decision() == Err(ErrorCode::NotOwner))
            {
                checks
                    .metrics
                    .forward_refused
                    .increment(answer.decisions.len() as u64);
                GroupState::NotOwner(answer.owner)
            } else {
                GroupState::Answered(answer.decisions)
            };
        }
    }
}

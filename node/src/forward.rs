//! Answers a check batch in a cluster: decides this node's groups, forwards the others (one
//! frame per owner, all at once), and places again what an owner refused as `not_owner`.
//!
//! What keeps each key decided by one bucket while slots move:
//! - groups are decided under `Cluster::deciding`, with the table read under it: a table switch
//!   waits for them, so the hand-off exported after a switch holds every decision made here;
//! - a gained slot waits (bounded) for its previous owner's hand-off before it is decided, and
//!   is looked at again under the gate (the table may switch after the wait);
//! - a slot this node handed off is not decided here again: a forwarded check for it is
//!   answered `not_owner`; the forwarder waits (bounded) for its own table to catch up and
//!   places the check again, here or with the owner its table now names. A check travels at
//!   most two forwards, and a forwarded check is never forwarded on. The one exception is a
//!   takeover: as the slot's successor this node receives the owner's replicas, so it decides
//!   for a client that lost the owner.

use std::collections::BTreeMap;
use std::ops::Range;
use std::time::Duration;

use floodgate::Clock;
use floodgate::cluster::SlotTable;
use floodgate::wire::{
    ArchivedCheckBatch, CheckBatch, ErrorCode, Frame, FrameKind, FrameReader, ValidCheck,
    WireCheck, WireDecision, decode_decisions, encode_message,
};
use rkyv::rancor;

use crate::metrics::DecisionTally;
use crate::server::Shared;
use crate::service::{decide_group, decode_frame, finish_batch, prefetch_ahead};

/// Longest a node waits for its slot table to catch up with a peer's.
const TABLE_CATCH_UP: Duration = Duration::from_millis(300);

/// Where a group's decisions come from.
#[derive(Debug, Clone, PartialEq)]
enum Placed {
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
}

/// How a group reached this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arrival {
    /// From a client that routes it to the owner (or does not know the owner).
    Client,
    /// From a client that cannot reach the owner, to the slot's successor.
    Takeover,
    /// From a node that does not own it.
    Forwarded,
}

/// Where a group on a slot goes first, by this node's table (`None` means decide here).
fn first_place(
    table: &SlotTable,
    me: &str,
    slot: u16,
    arrival: Arrival,
    gave_away: impl Fn(u16) -> bool,
) -> Option<Placed> {
    let owner = table.owner(slot);
    if owner == Some(me) {
        return None;
    }
    let left = !table.contains(me);
    if arrival == Arrival::Takeover && table.successor(slot) == Some(me) && !left {
        // The client lost its link to the owner. This node holds the owner's replicas (at most
        // one sync interval old) and decides from them, as it will once the owner is declared
        // dead: one shared decider, where otherwise every client's fallback bucket would decide
        // alone. Its decisions replicate to the owner, should the owner be alive after all.
        return None;
    }
    if arrival == Arrival::Forwarded {
        // The sender's table names this node. A slot handed off (or a node that left) is
        // never decided here; a slot never held is decided once, here (our table did not catch
        // up in time; forwarding on could loop).
        return (left || gave_away(slot)).then_some(Placed::Refused(ErrorCode::NotOwner));
    }
    Some(match owner {
        Some(owner) => Placed::Remote(owner.to_owned()),
        // A node that has left, and was the last: nobody owns anything.
        None => Placed::Refused(ErrorCode::ShuttingDown),
    })
}

/// Where a group goes after its first forward failed.
fn next_place(
    table: &SlotTable,
    me: &str,
    slot: u16,
    failed: &Placed,
    last_round: bool,
    gave_away: impl Fn(u16) -> bool,
) -> Option<Placed> {
    let owner = table.owner(slot);
    match failed {
        Placed::NotOwner(refuser) => match owner {
            Some(owner) if owner == me => None,
            Some(owner) if owner != refuser && !last_round => {
                Some(Placed::Remote(owner.to_owned()))
            }
            _ => Some(Placed::Refused(ErrorCode::ShuttingDown)),
        },
        // An owner that does not answer (slow, or crashed and not yet declared dead): decide
        // here rather than fail (availability over exactness; the bucket replicates to the
        // owner like any other), unless this node has left or handed the slot off.
        _ => {
            let left = !table.contains(me);
            if owner.is_none() || left || gave_away(slot) {
                Some(Placed::Refused(ErrorCode::ShuttingDown))
            } else {
                None
            }
        }
    }
}

pub(crate) async fn answer_check_batch(
    shared: &Shared,
    frame: &Frame,
    now_ns: u64,
    out: &mut Vec<u8>,
) -> Option<ErrorCode> {
    let limits = shared.config.limits;
    let groups = match decode_frame(frame, &limits.wire(), out) {
        Ok(groups) => groups,
        Err(code) => return Some(code),
    };
    let mut batch = Batch::new(shared, &groups, now_ns);
    let forwarded = frame.kind == FrameKind::ForwardedCheckBatch;
    if forwarded {
        batch.catch_up(frame.request_id).await;
    }
    let (mut placed, table_version) = batch.place_first(forwarded).await;
    if placed.iter().any(|p| matches!(p, Placed::Remote(_))) {
        // Already validated by decode_frame, so this access succeeds.
        let archived = rkyv::access::<ArchivedCheckBatch, rancor::Error>(&frame.payload).ok();
        batch
            .forward_rounds(archived, &mut placed, table_version)
            .await;
    }
    let Batch { tally, local, .. } = batch;
    let decisions = assemble(&groups, placed, local);
    finish_batch(
        &shared.metrics,
        &tally,
        frame.request_id,
        decisions,
        table_version,
        out,
    );
    None
}

/// One batch's groups, and the decisions made here so far.
struct Batch<'a> {
    shared: &'a Shared,
    groups: &'a [Vec<ValidCheck>],
    now_ns: u64,
    tally: DecisionTally,
    /// Decisions made here, in the order made; `Placed::Here` holds ranges of it.
    local: Vec<WireDecision>,
}

impl<'a> Batch<'a> {
    fn new(shared: &'a Shared, groups: &'a [Vec<ValidCheck>], now_ns: u64) -> Self {
        Batch {
            shared,
            groups,
            now_ns,
            tally: DecisionTally::default(),
            local: Vec::with_capacity(groups.iter().map(Vec::len).sum()),
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
        match self.groups[i].first() {
            _ if forwarded => Arrival::Forwarded,
            Some(check) if check.takeover => Arrival::Takeover,
            _ => Arrival::Client,
        }
    }

    /// Decides group `i` here.
    fn decide(&mut self, i: usize) -> Placed {
        let start = self.local.len();
        let store = &self.shared.store;
        decide_group(
            store,
            &mut self.tally,
            self.now_ns,
            &self.groups[i],
            &mut self.local,
        );
        Placed::Here(start..self.local.len())
    }

    /// A forwarded batch's request id is the version of the sender's table, which names this
    /// node as the owner. Unless that is a table this node had before (the sender is behind),
    /// ours may be the older one: wait (bounded) for it to name this node, so the hand-off wait
    /// that follows sees the change.
    async fn catch_up(&self, sender_version: u64) {
        let cluster = &self.shared.cluster;
        if cluster.had_version(sender_version) {
            return;
        }
        let me = cluster.me.id.as_str();
        cluster
            .wait_for_table(TABLE_CATCH_UP, |table| {
                !table.contains(me) || self.slots().all(|s| table.owner(s) == Some(me))
            })
            .await;
    }

    /// Decides what is this node's, and marks the rest for forwarding or refusal. Returns the
    /// placements and the version of the table they were made by.
    async fn place_first(&mut self, forwarded: bool) -> (Vec<Placed>, u64) {
        let shared = self.shared;
        let cluster = &shared.cluster;
        // Gained slots wait for their previous owner's hand-off (a no-op almost always). Looked
        // at again under the gate: the table may have switched after the wait.
        let mut attempts = 0;
        let deciding = loop {
            cluster.wait_for_handoffs(self.slots(), self.now_ns).await;
            let deciding = cluster.deciding();
            attempts += 1;
            if attempts == 3 || !cluster.awaits_handoff(self.slots(), shared.clock.now_ns()) {
                break deciding;
            }
        };
        let table = cluster.table();
        let me = cluster.me.id.as_str();
        let mut taken_over = 0;
        let mut placed = Vec::with_capacity(self.groups.len());
        for i in 0..self.groups.len() {
            prefetch_ahead(&shared.store, self.groups, i);
            let (slot, arrival) = (self.slot(i), self.arrival(i, forwarded));
            // Slots this node gave away are refused to a forwarder (`first_place`).
            let place = first_place(&table, me, slot, arrival, |s| cluster.gave_away(s));
            placed.push(place.unwrap_or_else(|| {
                if table.owner(slot) != Some(me) && arrival == Arrival::Takeover {
                    taken_over += self.groups[i].len() as u64;
                }
                self.decide(i)
            }));
        }
        drop(deciding);
        shared.metrics.taken_over.increment(taken_over);
        (placed, table.version())
    }

    /// Forwards the `Remote` groups; those refused (`not_owner`) or unanswered are placed again
    /// once (see `next_place`) and, if sent on, their answers taken as they come.
    async fn forward_rounds(
        &mut self,
        archived: Option<&ArchivedCheckBatch>,
        placed: &mut [Placed],
        table_version: u64,
    ) {
        let shared = self.shared;
        let cluster = &shared.cluster;
        let me = cluster.me.id.as_str();
        let mut version = table_version;
        for last_round in [false, true] {
            if !placed.iter().any(|p| matches!(p, Placed::Remote(_))) {
                return;
            }
            forward(shared, archived, self.groups, placed, version).await;
            let failed: Vec<usize> = (0..placed.len())
                .filter(|&i| matches!(placed[i], Placed::NotOwner(_) | Placed::Unanswered))
                .collect();
            if failed.is_empty() {
                return;
            }
            if !last_round {
                // A refuser handed the slot off after our table was read: wait for ours to
                // name someone else, then for that hand-off if the slot is now ours.
                let refused: Vec<(u16, String)> = failed
                    .iter()
                    .filter_map(|&i| match &placed[i] {
                        Placed::NotOwner(by) => Some((self.slot(i), by.clone())),
                        _ => None,
                    })
                    .collect();
                if !refused.is_empty() {
                    cluster
                        .wait_for_table(TABLE_CATCH_UP, |table| {
                            refused.iter().all(|(s, by)| table.owner(*s) != Some(by))
                        })
                        .await;
                    let slots = refused.iter().map(|(s, _)| *s);
                    cluster
                        .wait_for_handoffs(slots, shared.clock.now_ns())
                        .await;
                }
            }
            let _deciding = cluster.deciding();
            let table = cluster.table();
            version = table.version();
            let now = shared.clock.now_ns();
            for i in failed {
                let slot = self.slot(i);
                let gave_away = |s| cluster.gave_away(s);
                placed[i] = match next_place(&table, me, slot, &placed[i], last_round, gave_away) {
                    Some(place) => place,
                    // Gained meanwhile, and its state not here yet: not decided fresh.
                    None if cluster.awaits_handoff(std::iter::once(slot), now) => {
                        Placed::Refused(ErrorCode::ShuttingDown)
                    }
                    None => self.decide(i),
                };
            }
        }
    }
}

/// The batch's decisions in request order, from where each group was placed.
fn assemble(
    groups: &[Vec<ValidCheck>],
    placed: Vec<Placed>,
    local: Vec<WireDecision>,
) -> Vec<WireDecision> {
    if placed.iter().all(|p| matches!(p, Placed::Here(_))) {
        // Decided here in order: nothing to rearrange.
        return local;
    }
    let mut decisions = Vec::with_capacity(local.capacity());
    for (group, place) in groups.iter().zip(placed) {
        let refused = |code| std::iter::repeat_n(WireDecision::error(code), group.len());
        match place {
            Placed::Here(range) => decisions.extend_from_slice(&local[range]),
            Placed::Answered(answer) => decisions.extend(answer),
            Placed::Refused(code) => decisions.extend(refused(code)),
            // Every forward was resolved before; answer as a node that could not decide.
            Placed::Remote(_) | Placed::NotOwner(_) | Placed::Unanswered => {
                decisions.extend(refused(ErrorCode::ShuttingDown))
            }
        }
    }
    decisions
}

/// Sends each owner its `Remote` groups (re-encoded from the validated archive) as one
/// forwarded frame, all owners at once, and records what comes back in time. The frames carry
/// `table_version` (the table that placed them) as their request id.
async fn forward(
    shared: &Shared,
    archived: Option<&ArchivedCheckBatch>,
    groups: &[Vec<ValidCheck>],
    placed: &mut [Placed],
    table_version: u64,
) {
    let mut remote: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, place) in placed.iter_mut().enumerate() {
        if let Placed::Remote(owner) = place {
            remote.entry(std::mem::take(owner)).or_default().push(i);
            *place = Placed::Unanswered;
        }
    }
    let Some(archived) = archived else {
        return;
    };
    let cluster = &shared.cluster;
    let max = shared.config.limits.max_frame_bytes;
    let mut forwards = tokio::task::JoinSet::new();
    for (owner, indices) in remote {
        let Some(addr) = cluster.addr_of(&owner) else {
            continue;
        };
        let batch = CheckBatch {
            groups: indices
                .iter()
                .filter_map(|&i| {
                    rkyv::deserialize::<Vec<WireCheck>, rancor::Error>(&archived.groups[i]).ok()
                })
                .collect(),
        };
        let mut bytes = Vec::new();
        encode_message(
            &mut bytes,
            FrameKind::ForwardedCheckBatch,
            table_version,
            &batch,
        );
        shared
            .metrics
            .forwarded
            .increment(indices.iter().map(|&i| groups[i].len() as u64).sum());
        let peers = cluster.peers.clone();
        forwards.spawn(async move {
            let answer = peers.request(&addr, &bytes, max + 64).await;
            (owner, indices, answer)
        });
    }
    while let Some(Ok((owner, indices, answer))) = forwards.join_next().await {
        let Ok(decisions) = answer
            .map_err(|e| e.to_string())
            .and_then(|bytes| decisions_of(&bytes))
        else {
            continue;
        };
        let sizes: Vec<usize> = indices.iter().map(|&i| groups[i].len()).collect();
        if decisions.len() != sizes.iter().sum::<usize>() {
            continue;
        }
        let mut rest = decisions.as_slice();
        for (&i, size) in indices.iter().zip(sizes) {
            let answer = &rest[..size];
            placed[i] = if answer
                .first()
                .is_some_and(|d| d.to_decision() == Err(ErrorCode::NotOwner))
            {
                shared.metrics.forward_refused.increment(size as u64);
                Placed::NotOwner(owner.clone())
            } else {
                Placed::Answered(answer.to_vec())
            };
            rest = &rest[size..];
        }
    }
}

fn decisions_of(bytes: &[u8]) -> Result<Vec<WireDecision>, String> {
    let mut reader = FrameReader::new(bytes.len().max(16));
    reader.extend(bytes);
    match reader.next_frame() {
        Ok(Some(frame)) if frame.kind == FrameKind::DecisionBatch => {
            decode_decisions(&frame.payload)
                .map(|(d, _)| d)
                .map_err(|(_, m)| m)
        }
        other => Err(format!("unexpected answer to a forwarded batch: {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(nodes: &[&str]) -> SlotTable {
        let nodes: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
        SlotTable::compute(1, &nodes)
    }

    fn slot_owned_by(table: &SlotTable, node: &str) -> u16 {
        (0..floodgate::cluster::SLOTS as u16)
            .find(|&s| table.owner(s) == Some(node))
            .unwrap()
    }

    const NEVER: fn(u16) -> bool = |_| false;
    const ALWAYS: fn(u16) -> bool = |_| true;

    #[test]
    fn a_client_check_is_decided_by_its_owner_and_forwarded_otherwise() {
        let t = table(&["a", "b", "c"]);
        let mine = slot_owned_by(&t, "a");
        let theirs = slot_owned_by(&t, "b");
        assert_eq!(first_place(&t, "a", mine, Arrival::Client, NEVER), None);
        assert_eq!(
            first_place(&t, "a", theirs, Arrival::Client, NEVER),
            Some(Placed::Remote("b".into()))
        );
    }

    #[test]
    fn a_forwarded_check_for_a_slot_handed_off_or_after_leaving_is_refused() {
        let t = table(&["a", "b", "c"]);
        let theirs = slot_owned_by(&t, "b");
        let refused = Some(Placed::Refused(ErrorCode::NotOwner));
        assert_eq!(
            first_place(&t, "a", theirs, Arrival::Forwarded, ALWAYS),
            refused
        );
        // Never held: the sender's table is newer; decided here, never forwarded on.
        assert_eq!(
            first_place(&t, "a", theirs, Arrival::Forwarded, NEVER),
            None
        );
        // A node that left is in nobody's table, its own included.
        let after_leave = table(&["b", "c"]);
        let slot = slot_owned_by(&after_leave, "b");
        assert_eq!(
            first_place(&after_leave, "a", slot, Arrival::Forwarded, NEVER),
            refused
        );
        assert_eq!(
            first_place(&after_leave, "a", slot, Arrival::Client, NEVER),
            Some(Placed::Remote("b".into()))
        );
        assert_eq!(
            first_place(&table(&[]), "a", 7, Arrival::Client, NEVER),
            Some(Placed::Refused(ErrorCode::ShuttingDown))
        );
    }

    #[test]
    fn a_takeover_is_decided_by_its_successor_and_forwarded_by_anyone_else() {
        let t = table(&["a", "b", "c"]);
        let slot = (0..floodgate::cluster::SLOTS as u16)
            .find(|&s| t.owner(s) == Some("b") && t.successor(s) == Some("a"))
            .unwrap();
        assert_eq!(first_place(&t, "a", slot, Arrival::Takeover, NEVER), None);
        assert_eq!(
            first_place(&t, "c", slot, Arrival::Takeover, NEVER),
            Some(Placed::Remote("b".into())),
            "not the successor: to the owner"
        );
        let after_leave = table(&["b", "c"]);
        assert_eq!(
            first_place(&after_leave, "a", slot, Arrival::Takeover, NEVER),
            Some(Placed::Remote("b".into())),
            "a node that left takes nothing over"
        );
    }

    #[test]
    fn a_refused_check_goes_to_the_owner_the_table_names_now_at_most_once_more() {
        let t = table(&["a", "b", "c"]);
        let mine = slot_owned_by(&t, "a");
        let cs = slot_owned_by(&t, "c");
        let by_b = Placed::NotOwner("b".into());
        assert_eq!(next_place(&t, "a", mine, &by_b, false, NEVER), None);
        assert_eq!(
            next_place(&t, "a", cs, &by_b, false, NEVER),
            Some(Placed::Remote("c".into()))
        );
        let shutting_down = Some(Placed::Refused(ErrorCode::ShuttingDown));
        assert_eq!(next_place(&t, "a", cs, &by_b, true, NEVER), shutting_down);
        // Our table still names the refuser: it did not catch up in time.
        let bs = slot_owned_by(&t, "b");
        assert_eq!(next_place(&t, "a", bs, &by_b, false, NEVER), shutting_down);
    }

    #[test]
    fn an_unanswered_check_is_decided_here_unless_the_slot_was_handed_off() {
        let t = table(&["a", "b"]);
        let bs = slot_owned_by(&t, "b");
        assert_eq!(
            next_place(&t, "a", bs, &Placed::Unanswered, false, NEVER),
            None
        );
        let shutting_down = Some(Placed::Refused(ErrorCode::ShuttingDown));
        assert_eq!(
            next_place(&t, "a", bs, &Placed::Unanswered, false, ALWAYS),
            shutting_down
        );
        let after_leave = table(&["b"]);
        assert_eq!(
            next_place(&after_leave, "a", bs, &Placed::Unanswered, true, NEVER),
            shutting_down
        );
    }
}

//! Hand-off bookkeeping: which gained slots wait for whose hand-off, which hand-offs arrived,
//! and the parts of those still incomplete.
//!
//! Every hand-off names the slots it carries. A gained slot waits for one or more senders (its
//! previous owner; at a join, every member): for each, until a complete hand-off from that
//! sender carrying that slot has been merged (every part of it: parts arrive in any order, and
//! a part sent twice counts once), or until that wait's deadline. A hand-off that arrived
//! shortly before this node switched tables counts; one for a slot this node has since given
//! away does not (the slot's state moved on after it).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::cluster::SLOTS;

/// Most hand-offs being received at once (each holds the list of its slots).
pub const MAX_PARTIAL: usize = 256;
/// A hand-off whose parts have not all arrived after this long is forgotten, and so is a
/// complete one: a wait that starts later does not count it.
pub const PARTIAL_TTL_NS: u64 = 10_000_000_000;
/// Complete hand-offs remembered per sender (each is a bit per slot, 512 bytes).
const ARRIVED_PER_SENDER: usize = 8;

/// One received part of a hand-off, as the wire's `HandoffPart` carries it (borrowed, so this
/// module needs nothing from the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceivedPart<'a> {
    /// The sender's id for this hand-off.
    pub id: u64,
    /// This part's number, from 0.
    pub part: u32,
    /// How many parts the hand-off has.
    pub parts: u32,
    /// Every slot the hand-off carries (each part lists them all).
    pub slots: &'a [u16],
}

/// The hand-off state of one node. Ordered maps, so a simulation replays byte for byte.
#[derive(Debug, Default, Clone)]
pub struct Handoffs {
    /// Gained slots whose state (or word that the sender holds none) is on its way, by slot
    /// and sender.
    pending: BTreeMap<(u16, String), Pending>,
    /// Complete hand-offs by sender, latest last: when, and the slots they carried.
    arrived: BTreeMap<String, VecDeque<(u64, SlotSet)>>,
    /// Hand-offs still missing parts, by sender and hand-off id.
    partial: BTreeMap<(String, u64), Partial>,
}

/// One wait of a gained slot for one sender: since when, and until when.
#[derive(Debug, Clone)]
struct Pending {
    since_ns: u64,
    until_ns: u64,
}

/// A set of slots, a bit each.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SlotSet(Box<[u64; SLOTS / 64]>);

impl SlotSet {
    fn of(slots: &[u16]) -> Self {
        let mut set = SlotSet(Box::new([0; SLOTS / 64]));
        for &slot in slots {
            if let Some(word) = set.0.get_mut(usize::from(slot) / 64) {
                *word |= 1 << (slot % 64);
            }
        }
        set
    }

    fn contains(&self, slot: u16) -> bool {
        self.0
            .get(usize::from(slot) / 64)
            .is_some_and(|word| word & (1 << (slot % 64)) != 0)
    }

    fn remove_all(&mut self, other: &SlotSet) {
        for (word, gone) in self.0.iter_mut().zip(other.0.iter()) {
            *word &= !gone;
        }
    }
}

#[derive(Debug, Default, Clone)]
struct Partial {
    /// How many parts the hand-off has, as its first part said.
    parts: u32,
    /// The part numbers received: a part sent twice (a retry, or a hostile peer) counts once.
    /// At most `parts` entries, itself bounded on the wire (`MAX_HANDOFF_PARTS`).
    seen: BTreeSet<u32>,
    slots: Vec<u16>,
    first_ns: u64,
}

impl Handoffs {
    /// `slot` was gained and waits (until `now_ns + wait_ns`) for `from`'s hand-off, unless one
    /// from `from` carrying it arrived within the last `wait_ns`. Returns true when it waits.
    pub fn expect(&mut self, slot: u16, from: &str, now_ns: u64, wait_ns: u64) -> bool {
        let arrived = self.arrived.get(from).is_some_and(|hand_offs| {
            hand_offs
                .iter()
                .any(|(at, slots)| now_ns.saturating_sub(*at) < wait_ns && slots.contains(slot))
        });
        if !arrived {
            let pending = Pending {
                since_ns: now_ns,
                until_ns: now_ns.saturating_add(wait_ns),
            };
            self.pending.insert((slot, from.to_owned()), pending);
        }
        !arrived
    }

    /// True when a complete hand-off from `from` arrived within the last `within_ns`.
    pub fn heard_from(&self, from: &str, now_ns: u64, within_ns: u64) -> bool {
        self.arrived.get(from).is_some_and(|hand_offs| {
            hand_offs
                .iter()
                .any(|(at, _)| now_ns.saturating_sub(*at) < within_ns)
        })
    }

    /// Every wait's deadline becomes its start plus `wait_of(from)` (a sender's standing in
    /// the failure detector changed).
    pub fn set_waits(&mut self, wait_of: impl Fn(&str) -> u64) {
        for ((_, from), pending) in &mut self.pending {
            pending.until_ns = pending.since_ns.saturating_add(wait_of(from));
        }
    }

    /// Records one part of a hand-off (its buckets already merged); when that completed the
    /// hand-off, returns the slots it carried (their waits on `from` end).
    pub fn received(
        &mut self,
        from: &str,
        part: ReceivedPart<'_>,
        now_ns: u64,
    ) -> Option<Vec<u16>> {
        let slots = if part.parts <= 1 {
            part.slots.to_vec()
        } else {
            self.partial
                .retain(|_, p| now_ns.saturating_sub(p.first_ns) < PARTIAL_TTL_NS);
            let key = (from.to_owned(), part.id);
            if !self.partial.contains_key(&key) && self.partial.len() >= MAX_PARTIAL {
                // Too many unfinished hand-offs: this one's slots simply wait their deadline.
                return None;
            }
            let partial = self.partial.entry(key.clone()).or_insert(Partial {
                parts: part.parts,
                first_ns: now_ns,
                ..Partial::default()
            });
            // A part that disagrees with the first on the count, or numbered past it, is not
            // part of this hand-off: it completes nothing.
            if part.parts != partial.parts || part.part >= partial.parts {
                return None;
            }
            partial.seen.insert(part.part);
            if partial.slots.is_empty() {
                partial.slots = part.slots.to_vec();
            }
            if (partial.seen.len() as u64) < u64::from(partial.parts) {
                return None;
            }
            self.partial
                .remove(&key)
                .map(|p| p.slots)
                .unwrap_or_default()
        };
        for &slot in &slots {
            self.pending.remove(&(slot, from.to_owned()));
        }
        // Remembered for a wait that starts later (this hand-off beat the switch), while
        // recent: a sender's oldest past the count, and every sender's past their time, go.
        for hand_offs in self.arrived.values_mut() {
            hand_offs.retain(|(at, _)| now_ns.saturating_sub(*at) < PARTIAL_TTL_NS);
        }
        self.arrived.retain(|_, hand_offs| !hand_offs.is_empty());
        let hand_offs = self.arrived.entry(from.to_owned()).or_default();
        if hand_offs.len() >= ARRIVED_PER_SENDER {
            hand_offs.pop_front();
        }
        hand_offs.push_back((now_ns, SlotSet::of(&slots)));
        Some(slots)
    }

    /// This node gave `slots` away: what arrived for them before is stale from now on. One
    /// pass over the waits for all of them: a switch gives away thousands of slots while
    /// thousands of waits run, and the table switch holds the deciding gate meanwhile.
    pub fn gave_away(&mut self, slots: &[u16]) {
        if slots.is_empty() {
            return;
        }
        let given = SlotSet::of(slots);
        for hand_offs in self.arrived.values_mut() {
            for (_, arrived) in hand_offs.iter_mut() {
                arrived.remove_all(&given);
            }
        }
        self.pending.retain(|(s, _), _| !given.contains(*s));
    }

    /// Forgets waits whose deadline passed (those slots are decided from what is here, unless
    /// they still wait for another sender); returns their slots and whom they waited for.
    pub fn expire(&mut self, now_ns: u64) -> Vec<(u16, String)> {
        let expired: Vec<(u16, String)> = self
            .pending
            .iter()
            .filter(|(_, p)| p.until_ns <= now_ns)
            .map(|(key, _)| key.clone())
            .collect();
        for key in &expired {
            self.pending.remove(key);
        }
        expired
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// The latest deadline among the waits of `slots` that still run at `now_ns`, if any does.
    pub fn deadline(&self, slots: impl Iterator<Item = u16>, now_ns: u64) -> Option<u64> {
        if self.pending.is_empty() {
            return None;
        }
        slots
            .flat_map(|s| self.waits_of(s))
            .map(|(_, p)| p.until_ns)
            .filter(|until| *until > now_ns)
            .max()
    }

    /// The earliest deadline of any wait.
    pub fn next_deadline(&self) -> Option<u64> {
        self.pending.values().map(|p| p.until_ns).min()
    }

    /// Whom `slot` waited for in waits that ran out by `now_ns` and were not yet forgotten
    /// ([`Handoffs::expire`]); empty when none did.
    pub fn expired_waits(&self, slot: u16, now_ns: u64) -> Vec<String> {
        self.waits_of(slot)
            .filter(|(_, p)| p.until_ns <= now_ns)
            .map(|(from, _)| from.to_owned())
            .collect()
    }

    /// Whom `slot` waits for.
    pub fn awaited_from(&self, slot: u16) -> Vec<String> {
        self.waits_of(slot)
            .map(|(from, _)| from.to_owned())
            .collect()
    }

    fn waits_of(&self, slot: u16) -> impl Iterator<Item = (&str, &Pending)> {
        self.pending
            .range((slot, String::new())..)
            .take_while(move |((s, _), _)| *s == slot)
            .map(|((_, from), pending)| (from.as_str(), pending))
    }

    /// Hand-offs still missing parts (bounded by `MAX_PARTIAL`).
    pub fn partial_count(&self) -> usize {
        self.partial.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: u64 = 500;

    fn part(id: u64, part: u32, parts: u32, slots: &[u16]) -> ReceivedPart<'_> {
        ReceivedPart {
            id,
            part,
            parts,
            slots,
        }
    }

    #[test]
    fn a_gained_slot_waits_for_every_part_of_a_hand_off_carrying_it() {
        let mut h = Handoffs::default();
        h.expect(7, "x", 0, WAIT);
        assert!(h.deadline([7u16].into_iter(), 0).is_some());
        // A hand-off from x that does not carry slot 7, and one from y that does.
        assert_eq!(h.received("x", part(1, 0, 1, &[8]), 1), Some(vec![8]));
        assert_eq!(h.received("y", part(2, 0, 1, &[7]), 1), Some(vec![7]));
        assert!(h.deadline([7u16].into_iter(), 1).is_some());
        assert_eq!(h.received("x", part(3, 1, 2, &[7, 8]), 2), None);
        assert!(h.deadline([7u16].into_iter(), 2).is_some());
        assert_eq!(h.received("x", part(3, 0, 2, &[7, 8]), 3), Some(vec![7, 8]));
        assert!(h.deadline([7u16].into_iter(), 3).is_none());
        assert!(h.is_empty());
    }

    #[test]
    fn a_part_sent_twice_counts_once() {
        let mut h = Handoffs::default();
        h.expect(7, "x", 0, WAIT);
        assert!(h.received("x", part(1, 0, 3, &[7]), 1).is_none());
        // Part 0 again, twice: still two parts missing.
        assert!(h.received("x", part(1, 0, 3, &[7]), 2).is_none());
        assert!(h.received("x", part(1, 0, 3, &[7]), 3).is_none());
        assert!(h.deadline([7u16].into_iter(), 3).is_some());
        // Parts that do not belong (another count, a number past the count) complete nothing.
        assert!(h.received("x", part(1, 1, 2, &[7]), 4).is_none());
        assert!(h.received("x", part(1, 5, 3, &[7]), 4).is_none());
        assert!(h.received("x", part(1, 2, 3, &[7]), 5).is_none());
        assert!(h.deadline([7u16].into_iter(), 5).is_some());
        assert!(h.received("x", part(1, 1, 3, &[7]), 6).is_some());
        assert!(h.is_empty());
    }

    #[test]
    fn a_hand_off_that_came_first_counts_while_recent_and_until_the_slot_is_given_away() {
        let mut h = Handoffs::default();
        h.received("x", part(1, 0, 1, &[1, 2, 3]), 100);
        assert!(!h.expect(1, "x", 100 + WAIT - 1, WAIT));
        assert!(h.is_empty());
        assert!(h.expect(2, "x", 100 + WAIT, WAIT));
        assert!(h.deadline([2u16].into_iter(), 100 + WAIT).is_some());
        h.gave_away(&[3]);
        h.expect(3, "x", 101, WAIT);
        assert!(h.deadline([3u16].into_iter(), 101).is_some());
    }

    #[test]
    fn expectations_end_at_their_deadline_and_unfinished_hand_offs_stay_bounded() {
        let mut h = Handoffs::default();
        h.expect(1, "x", 0, WAIT);
        assert_eq!(h.deadline([1u16, 2].into_iter(), 0), Some(WAIT));
        assert_eq!(h.next_deadline(), Some(WAIT));
        assert_eq!(h.expire(WAIT), vec![(1, "x".to_owned())]);
        assert!(h.is_empty());
        // A wait lengthened (its sender held alive) and shortened again counts from its start.
        h.expect(1, "x", 10, WAIT);
        h.set_waits(|_| 10 * WAIT);
        assert_eq!(h.next_deadline(), Some(10 + 10 * WAIT));
        assert!(h.expire(10 + WAIT).is_empty());
        h.set_waits(|_| WAIT);
        assert_eq!(h.expire(10 + WAIT), vec![(1, "x".to_owned())]);
        for id in 0..(MAX_PARTIAL as u64 + 10) {
            h.received("x", part(id, 0, 2, &[1]), 0);
        }
        assert!(h.partial_count() <= MAX_PARTIAL);
        // Forgotten after their time to live.
        h.received("x", part(9_999, 0, 2, &[1]), PARTIAL_TTL_NS);
        assert_eq!(h.partial_count(), 1);
    }
}

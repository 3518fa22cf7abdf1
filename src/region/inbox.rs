//! One sender's inbox: which of its sequence numbers were applied, so each message is applied
//! exactly once however often it arrives, in bounded memory.

use std::collections::BTreeSet;

use super::delta::MAX_ACK_RANGES;

/// How far above the first missing sequence number a message may be: an honest sender has at
/// most its in-flight limit outstanding, so anything further is refused (and not acknowledged).
pub const DEDUPE_WINDOW: u64 = 4_096;

/// What to do with an arriving message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Arrival {
    /// New: apply it, then acknowledge.
    Apply,
    /// Applied before: acknowledge again only (the first acknowledgement may have been lost).
    Duplicate,
    /// From an older session of the sender (before it restarted): ignored.
    Stale,
    /// A sequence number of 0, or beyond the window: refused, not acknowledged.
    OutOfWindow,
}

#[derive(Debug)]
pub(super) struct Inbox {
    pub(super) session: u64,
    /// Every sequence number below this was applied.
    pub(super) below: u64,
    /// Applied sequence numbers above `below` (at most `DEDUPE_WINDOW`).
    above: BTreeSet<u64>,
    /// Units applied from this sender (for stats and the simulation's exactly-once check).
    pub(super) applied_units: u64,
}

impl Inbox {
    pub(super) fn new(session: u64) -> Self {
        Inbox {
            session,
            below: 1,
            above: BTreeSet::new(),
            applied_units: 0,
        }
    }

    pub(super) fn arrive(&mut self, session: u64, seq: u64) -> Arrival {
        if session < self.session {
            return Arrival::Stale;
        }
        if session > self.session {
            // The sender restarted: its numbering starts again.
            *self = Inbox {
                applied_units: self.applied_units,
                ..Inbox::new(session)
            };
        }
        if seq == 0 || seq >= self.below.saturating_add(DEDUPE_WINDOW) {
            return Arrival::OutOfWindow;
        }
        if seq < self.below || !self.above.insert(seq) {
            return Arrival::Duplicate;
        }
        while self.above.remove(&self.below) {
            self.below += 1;
        }
        Arrival::Apply
    }

    /// The sequence numbers above `below` to acknowledge (the lowest ones, bounded).
    pub(super) fn also(&self) -> Vec<u64> {
        self.above.iter().take(MAX_ACK_RANGES).copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_sequence_number_applies_once_in_any_order() {
        let mut inbox = Inbox::new(7);
        assert_eq!(inbox.arrive(7, 2), Arrival::Apply);
        assert_eq!(inbox.arrive(7, 2), Arrival::Duplicate);
        assert_eq!(inbox.also(), vec![2]);
        assert_eq!(inbox.arrive(7, 1), Arrival::Apply);
        assert_eq!((inbox.below, inbox.also()), (3, vec![]));
        assert_eq!(inbox.arrive(7, 1), Arrival::Duplicate);
        assert_eq!(inbox.arrive(7, 0), Arrival::OutOfWindow);
        assert_eq!(inbox.arrive(7, 3 + DEDUPE_WINDOW), Arrival::OutOfWindow);
    }

    #[test]
    fn a_restarted_sender_starts_again_and_its_old_session_is_ignored() {
        let mut inbox = Inbox::new(7);
        assert_eq!(inbox.arrive(7, 1), Arrival::Apply);
        assert_eq!(inbox.arrive(9, 1), Arrival::Apply);
        assert_eq!(inbox.arrive(7, 2), Arrival::Stale);
        assert_eq!(inbox.session, 9);
    }
}

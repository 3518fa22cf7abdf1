//! One sender's inbox: which of its sequence numbers were applied, so each message is applied
//! exactly once however often it arrives, in bounded memory.
//!
//! A receiver keeps inboxes only while it runs, and a sender keeps its session and numbering
//! across the receiver's restarts: so every message carries the sender's settled point (every
//! number below it was acknowledged by this destination), and an inbox made for a sender it
//! knows nothing of starts there, not at 1. Without it, a sender past the window when the
//! receiver restarted would be refused forever.

use std::collections::BTreeSet;

use super::delta::MAX_ACK_RANGES;

/// How far above the first missing sequence number a message may be: an honest sender has at
/// most its in-flight limit outstanding, so anything further is refused (and not acknowledged).
/// The default of [`super::ExchangeConfig::dedupe_window`].
pub const DEDUPE_WINDOW: u64 = 4_096;

/// What to do with an arriving message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Receipt {
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
    /// When a message last arrived (for evicting idle inboxes).
    pub(super) last_arrival_ns: u64,
}

impl Inbox {
    /// An inbox for `session`, starting at the sender's settled point (1 when it gave none).
    pub(super) fn new(session: u64, settled_below: Option<u64>, now_ns: u64) -> Self {
        Inbox {
            session,
            below: settled_below.unwrap_or(1).max(1),
            above: BTreeSet::new(),
            applied_units: 0,
            last_arrival_ns: now_ns,
        }
    }

    /// What to do with message `seq` of `session`, which says every number below
    /// `settled_below` was acknowledged. `window`: how far above `below` a message may be.
    pub(super) fn arrive(
        &mut self,
        session: u64,
        seq: u64,
        settled_below: Option<u64>,
        window: u64,
        now_ns: u64,
    ) -> Receipt {
        if session < self.session {
            return Receipt::Stale;
        }
        self.last_arrival_ns = self.last_arrival_ns.max(now_ns);
        if session > self.session {
            // The sender restarted: its numbering starts again.
            *self = Inbox {
                applied_units: self.applied_units,
                ..Inbox::new(session, settled_below, now_ns)
            };
        }
        if let Some(settled) = settled_below
            && settled > self.below
        {
            // Acknowledged, so applied by an earlier incarnation of this node (this one would
            // have them below `below` already): skip them.
            self.above = self.above.split_off(&settled);
            self.below = settled;
            while self.above.remove(&self.below) {
                self.below += 1;
            }
        }
        if seq == 0 || seq >= self.below.saturating_add(window) {
            return Receipt::OutOfWindow;
        }
        if seq < self.below || !self.above.insert(seq) {
            return Receipt::Duplicate;
        }
        while self.above.remove(&self.below) {
            self.below += 1;
        }
        Receipt::Apply
    }

    /// The sequence numbers above `below` to acknowledge (the lowest ones, bounded).
    pub(super) fn also(&self) -> Vec<u64> {
        self.above.iter().take(MAX_ACK_RANGES).copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Version 2's messages: no settled point.
    fn arrive(inbox: &mut Inbox, session: u64, seq: u64) -> Receipt {
        inbox.arrive(session, seq, None, DEDUPE_WINDOW, 0)
    }

    #[test]
    fn each_sequence_number_applies_once_in_any_order() {
        let mut inbox = Inbox::new(7, None, 0);
        assert_eq!(arrive(&mut inbox, 7, 2), Receipt::Apply);
        assert_eq!(arrive(&mut inbox, 7, 2), Receipt::Duplicate);
        assert_eq!(inbox.also(), vec![2]);
        assert_eq!(arrive(&mut inbox, 7, 1), Receipt::Apply);
        assert_eq!((inbox.below, inbox.also()), (3, vec![]));
        assert_eq!(arrive(&mut inbox, 7, 1), Receipt::Duplicate);
        assert_eq!(arrive(&mut inbox, 7, 0), Receipt::OutOfWindow);
        assert_eq!(
            arrive(&mut inbox, 7, 3 + DEDUPE_WINDOW),
            Receipt::OutOfWindow
        );
    }

    #[test]
    fn a_restarted_sender_starts_again_and_its_old_session_is_ignored() {
        let mut inbox = Inbox::new(7, None, 0);
        assert_eq!(arrive(&mut inbox, 7, 1), Receipt::Apply);
        assert_eq!(arrive(&mut inbox, 9, 1), Receipt::Apply);
        assert_eq!(arrive(&mut inbox, 7, 2), Receipt::Stale);
        assert_eq!(inbox.session, 9);
    }

    /// A receiver that restarted meets a sender far past the window: its new inbox starts at
    /// the settled point, so the sender's next messages apply at once.
    #[test]
    fn a_new_inbox_starts_at_the_senders_settled_point() {
        let settled = 3 * DEDUPE_WINDOW;
        let mut inbox = Inbox::new(7, Some(settled), 0);
        let arrive = |inbox: &mut Inbox, seq| inbox.arrive(7, seq, Some(settled), DEDUPE_WINDOW, 0);
        assert_eq!(arrive(&mut inbox, settled + 1), Receipt::Apply);
        assert_eq!(arrive(&mut inbox, settled), Receipt::Apply);
        assert_eq!((inbox.below, inbox.also()), (settled + 2, vec![]));
        // Below the settled point: acknowledged before, so a duplicate.
        assert_eq!(arrive(&mut inbox, settled - 1), Receipt::Duplicate);
    }

    /// An inbox that learns a higher settled point moves up to it, dropping what it held below.
    #[test]
    fn a_higher_settled_point_moves_the_inbox_up() {
        let mut inbox = Inbox::new(7, None, 0);
        assert_eq!(arrive(&mut inbox, 7, 3), Receipt::Apply);
        assert_eq!(arrive(&mut inbox, 7, 6), Receipt::Apply);
        assert_eq!(
            inbox.arrive(7, 7, Some(5), DEDUPE_WINDOW, 0),
            Receipt::Apply
        );
        assert_eq!((inbox.below, inbox.also()), (5, vec![6, 7]));
        assert_eq!(
            inbox.arrive(7, 5, Some(5), DEDUPE_WINDOW, 0),
            Receipt::Apply
        );
        assert_eq!((inbox.below, inbox.also()), (8, vec![]));
        // A lower settled point (an old copy) moves nothing back.
        assert_eq!(
            inbox.arrive(7, 4, Some(2), DEDUPE_WINDOW, 0),
            Receipt::Duplicate
        );
        assert_eq!(inbox.below, 8);
    }
}

//! One destination's outbox: deltas pending (aggregated per key), messages in flight until
//! acknowledged (sent again with a doubling wait), and per key the units the destination has
//! not confirmed yet (what the admission rule limits).
//!
//! Every global check finds its key in one table (`keys`: see `key_table.rs`; read by the
//! admission rule, then again, in the same cache line, by the record), which also says where
//! the key's pending delta sits; the delta itself is appended to a vector. A table of pending
//! deltas beside it cost a second search per check and, to send them in a reproducible order,
//! a sort of every round.

use std::collections::VecDeque;

use super::config::ExchangeConfig;
use super::delta::Delta;
use super::key_table::{KeyState, KeyTable};
use crate::{BucketKey, Limit};

/// A message sent and not yet acknowledged.
#[derive(Debug, Clone)]
struct InFlight {
    seq: u64,
    deltas: Vec<Delta>,
    resend_at_ns: u64,
    wait_ns: u64,
}

impl KeyState {
    /// Where `key` (this state's) has its delta in `pending` of round `round`, if it has one
    /// there. The key is compared too, so a stale place can never add to another key's delta.
    fn pending_in(&self, pending: &[Delta], round: u32, key: BucketKey) -> Option<usize> {
        let index = self.index as usize;
        (self.round == round && pending.get(index).is_some_and(|d| d.key == key)).then_some(index)
    }
}

#[derive(Debug)]
pub(super) struct Outbox {
    next_seq: u64,
    /// Deltas admitted since the last round fell due, one per key, in the order their keys
    /// were first admitted (so a seeded simulation replays exactly).
    pending: Vec<Delta>,
    /// Counts the rounds that fell due: a key's place in `pending` is current only if it was
    /// taken in this round.
    round: u32,
    /// The round that fell due, leaving a message at a time: `staged[staged_sent..]` is still
    /// to go. Its room is reused by the next round (the two vectors swap).
    staged: Vec<Delta>,
    staged_sent: usize,
    in_flight: VecDeque<InFlight>,
    /// Per key with units not confirmed (pending or in flight): how many, and its pending
    /// delta.
    keys: KeyTable,
    /// When the destination last confirmed something, or when deltas became outstanding after
    /// none were.
    progress_ns: u64,
    next_flush_ns: u64,
    /// Messages sent again (for stats).
    pub(super) retransmissions: u64,
    /// The destination's own session, as its acknowledgements last said.
    pub(super) receiver_session: Option<u64>,
}

impl Outbox {
    pub(super) fn new() -> Self {
        Self::starting_at(1)
    }

    /// An outbox whose first message gets `next_seq`: a destination forgotten and found again
    /// in the same session must not reuse numbers its inbox has applied (it would take the
    /// new messages for replays, acknowledge them and apply nothing).
    pub(super) fn starting_at(next_seq: u64) -> Self {
        Outbox {
            next_seq: next_seq.max(1),
            pending: Vec::new(),
            round: 0,
            staged: Vec::new(),
            staged_sent: 0,
            in_flight: VecDeque::new(),
            keys: KeyTable::default(),
            progress_ns: 0,
            next_flush_ns: 0,
            retransmissions: 0,
            receiver_session: None,
        }
    }

    /// The sequence number the next message will get.
    pub(super) fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The settled point: every sequence number below it was acknowledged (the lowest one in
    /// flight, or the next one when none is).
    pub(super) fn settled_below(&self) -> u64 {
        self.in_flight
            .iter()
            .map(|m| m.seq)
            .min()
            .unwrap_or(self.next_seq)
    }

    /// Whether new units of `key` have room (the table is not full, or its key is pending
    /// already). The length first: looking the key up is needed only once the table is full.
    pub(super) fn can_hold(&self, key: BucketKey, config: &ExchangeConfig) -> bool {
        self.pending_keys() < config.max_pending_keys
            || self
                .keys
                .get(key)
                .is_some_and(|state| state.pending_in(&self.pending, self.round, key).is_some())
    }

    /// Queues `units` of `key` admitted at `now_ns` (the caller checked `can_hold`).
    pub(super) fn record(&mut self, key: BucketKey, limit: &Limit, units: u64, now_ns: u64) {
        self.record_at(key, limit, units, now_ns, now_ns);
    }

    /// Queues `units` of `key` admitted at `at_ns`, as of `now_ns`: units passed on keep the
    /// time they were admitted in their own region.
    pub(super) fn record_at(
        &mut self,
        key: BucketKey,
        limit: &Limit,
        units: u64,
        at_ns: u64,
        now_ns: u64,
    ) {
        if self.keys.is_empty() {
            self.progress_ns = now_ns;
        }
        let round = self.round;
        let state = self.keys.entry_or_insert(
            key,
            KeyState {
                unconfirmed: 0,
                round: round.wrapping_sub(1),
                index: 0,
            },
        );
        state.unconfirmed = state.unconfirmed.saturating_add(units);
        if let Some(index) = state.pending_in(&self.pending, round, key) {
            let delta = &mut self.pending[index];
            delta.units = delta.units.saturating_add(units);
            delta.at_ns = delta.at_ns.max(at_ns);
            delta.limit = *limit;
        } else {
            // Past u32::MAX deltas a place cannot be kept: the key's next units get a delta
            // of their own (sent apart, counted the same).
            state.round = round;
            state.index = u32::try_from(self.pending.len()).unwrap_or(u32::MAX);
            self.pending.push(Delta {
                key,
                limit: *limit,
                units,
                at_ns,
            });
        }
    }

    /// Starts loading `key`'s entry, for a check decided shortly (a hint: nothing is read).
    pub(super) fn prefetch(&self, key: BucketKey) {
        self.keys.prefetch(key);
    }

    /// Units of `key` the destination has not confirmed.
    pub(super) fn unconfirmed(&self, key: BucketKey) -> u64 {
        self.keys.get(key).map_or(0, |state| state.unconfirmed)
    }

    /// Every key with units not confirmed, and how many.
    pub(super) fn unconfirmed_keys(&self) -> impl Iterator<Item = (BucketKey, u64)> + '_ {
        self.keys
            .iter()
            .map(|(key, state)| (key, state.unconfirmed))
    }

    /// Nothing pending or in flight.
    pub(super) fn is_idle(&self) -> bool {
        self.keys.is_empty()
    }

    /// Units not confirmed, over every key.
    pub(super) fn total_unconfirmed(&self) -> u64 {
        self.keys
            .iter()
            .fold(0, |a, (_, state)| a.saturating_add(state.unconfirmed))
    }

    /// Deltas not sent yet (a key staged and pending again counts twice: both are held).
    pub(super) fn pending_keys(&self) -> usize {
        self.pending.len() + self.staged_left()
    }

    /// Deltas of the round that fell due still to go.
    fn staged_left(&self) -> usize {
        self.staged.len() - self.staged_sent
    }

    pub(super) fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// How long the destination has confirmed nothing while deltas were outstanding (0 idle).
    pub(super) fn lag_ns(&self, now_ns: u64) -> u64 {
        if self.is_idle() {
            0
        } else {
            now_ns.saturating_sub(self.progress_ns)
        }
    }

    /// False once the destination has confirmed nothing for `unreachable_after_ns` while
    /// deltas were outstanding.
    pub(super) fn is_reachable(&self, now_ns: u64, config: &ExchangeConfig) -> bool {
        self.is_idle() || now_ns.saturating_sub(self.progress_ns) < config.unreachable_after_ns
    }

    /// The next message for this destination, if one is due: a message whose wait ran out
    /// (sent again, its wait doubled), else new deltas once the sync interval has passed and a
    /// slot in flight is free.
    pub(super) fn next_message(
        &mut self,
        now_ns: u64,
        config: &ExchangeConfig,
    ) -> Option<(u64, Vec<Delta>)> {
        if let Some(due) = self.in_flight.iter_mut().find(|m| m.resend_at_ns <= now_ns) {
            due.wait_ns = due.wait_ns.saturating_mul(2).min(config.max_retransmit_ns);
            due.resend_at_ns = now_ns.saturating_add(due.wait_ns);
            self.retransmissions += 1;
            return Some((due.seq, due.deltas.clone()));
        }
        if self.pending_keys() == 0
            || now_ns < self.pending_due_ns(config)
            || self.in_flight.len() >= config.max_in_flight
        {
            return None;
        }
        if self.staged_left() == 0 {
            self.stage_pending();
        }
        let most = config.max_deltas_per_message.clamp(1, self.staged_left());
        let from = self.staged_sent;
        let deltas = self.staged[from..from + most].to_vec();
        self.staged_sent += most;
        if self.pending_keys() == 0 {
            self.next_flush_ns = now_ns.saturating_add(config.sync_interval_ns);
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.in_flight.push_back(InFlight {
            seq,
            deltas: deltas.clone(),
            resend_at_ns: now_ns.saturating_add(config.retransmit_ns),
            wait_ns: config.retransmit_ns,
        });
        Some((seq, deltas))
    }

    /// The pending round falls due (the staged one has gone): its deltas become `staged`, and
    /// the next round starts in the staged one's room.
    fn stage_pending(&mut self) {
        std::mem::swap(&mut self.pending, &mut self.staged);
        self.pending.clear();
        // Room for about twice this round, so a burst's room is not kept once it has passed.
        let room = 2 * self.staged.len().max(1_024);
        if self.pending.capacity() > 2 * room {
            self.pending.shrink_to(room);
        }
        self.keys.shrink_to_fit_keys();
        self.staged_sent = 0;
        self.round = self.round.wrapping_add(1);
    }

    /// Takes the acknowledged messages out of flight: every sequence number below `below`, and
    /// those in `also`. Their units are confirmed.
    pub(super) fn acknowledge(&mut self, below: u64, also: &[u64], now_ns: u64) {
        let before = self.in_flight.len();
        let keys = &mut self.keys;
        self.in_flight.retain(|m| {
            let acked = m.seq < below || also.contains(&m.seq);
            if acked {
                for (i, delta) in m.deltas.iter().enumerate() {
                    // Each key's entry is cold by now (its check was a round trip ago).
                    for ahead in &m.deltas[crate::prefetch::burst_ahead(i, m.deltas.len())] {
                        keys.prefetch(ahead.key);
                    }
                    if let Some(state) = keys.get_mut(delta.key) {
                        state.unconfirmed = state.unconfirmed.saturating_sub(delta.units);
                        if state.unconfirmed == 0 {
                            keys.remove(delta.key);
                        }
                    }
                }
            }
            !acked
        });
        if self.keys.is_empty() {
            // Idle after a burst: its room is given back now, not at the next round.
            self.keys.shrink_to_fit_keys();
        }
        if self.in_flight.len() < before {
            self.progress_ns = now_ns;
        }
    }

    /// Every delta not confirmed, pending or in flight (a message in flight may have been
    /// applied already: its acknowledgement was not seen), emptying the outbox.
    pub(super) fn take_unconfirmed(&mut self) -> Vec<Delta> {
        let mut deltas: Vec<Delta> = self.staged.drain(self.staged_sent..).collect();
        self.staged.clear();
        self.staged_sent = 0;
        deltas.append(&mut self.pending);
        for message in self.in_flight.drain(..) {
            deltas.extend(message.deltas);
        }
        self.keys.clear();
        deltas
    }

    /// Pending deltas go at `now_ns` (or at once, if due already), not at the next interval.
    pub(super) fn flush_at(&mut self, now_ns: u64) {
        self.next_flush_ns = self.next_flush_ns.min(now_ns);
    }

    /// The destination restarted: what is in flight has not reached its new incarnation (or
    /// was applied by the old one and its acknowledgement lost), so it is due again now, its
    /// wait back to the first one, rather than after a doubled wait.
    pub(super) fn resend_now(&mut self, now_ns: u64, config: &ExchangeConfig) {
        for message in &mut self.in_flight {
            message.resend_at_ns = now_ns;
            message.wait_ns = config.retransmit_ns / 2;
        }
    }

    /// When the pending deltas are due: at the interval, or at once (0) when some are staged
    /// already or the table is half full. Waiting only aggregates repeated keys, and on many
    /// distinct keys (a global limit per user, at hundreds of thousands of users a second) a
    /// table filled within one interval would deny the next key's checks
    /// (`refused_outbox_full`) while slots in flight sat free.
    fn pending_due_ns(&self, config: &ExchangeConfig) -> u64 {
        if self.staged_left() > 0 || self.pending_keys() >= config.max_pending_keys.div_ceil(2) {
            0
        } else {
            self.next_flush_ns
        }
    }

    /// When this outbox next has something to send, if it is waiting for time to pass (0: due
    /// already).
    pub(super) fn next_timeout(&self, config: &ExchangeConfig) -> Option<u64> {
        let resend = self.in_flight.iter().map(|m| m.resend_at_ns).min();
        let flush = (self.pending_keys() > 0 && self.in_flight.len() < config.max_in_flight)
            .then(|| self.pending_due_ns(config));
        resend.into_iter().chain(flush).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NANOS_PER_SEC as S;

    const MS: u64 = 1_000_000;

    fn key(n: u8) -> BucketKey {
        BucketKey::for_key(&[n])
    }

    fn limit() -> Limit {
        Limit::gcra(10, S, 10).unwrap()
    }

    #[test]
    fn pending_deltas_leave_in_the_order_first_admitted_a_message_at_a_time() {
        let config = ExchangeConfig {
            max_deltas_per_message: 3,
            max_in_flight: 16,
            ..ExchangeConfig::default()
        };
        let mut out = Outbox::new();
        for n in [3, 0, 7, 1, 3, 6, 2, 5, 4, 0] {
            out.record(key(n), &limit(), 1, MS);
        }
        let mut sent = Vec::new();
        for expected in [3, 3, 2] {
            let (_, deltas) = out.next_message(MS, &config).unwrap();
            assert_eq!(deltas.len(), expected);
            sent.extend(deltas.iter().map(|d| d.key.to_u128()));
        }
        assert_eq!(out.pending_keys(), 0);
        let first_admitted: Vec<u128> = [3, 0, 7, 1, 6, 2, 5, 4]
            .into_iter()
            .map(|n| key(n).to_u128())
            .collect();
        assert_eq!(
            sent, first_admitted,
            "every key once, in the order first admitted"
        );
        // What is taken back unconfirmed: what was pending first, in that order, then what is
        // in flight.
        out.record(key(10), &limit(), 1, MS);
        out.record(key(9), &limit(), 1, MS);
        let taken: Vec<u128> = out
            .take_unconfirmed()
            .iter()
            .map(|d| d.key.to_u128())
            .collect();
        assert_eq!(taken[..2], [key(10).to_u128(), key(9).to_u128()]);
        assert_eq!(taken[2..], first_admitted[..]);
        assert!(out.is_idle());
    }

    #[test]
    fn keys_recorded_while_a_round_leaves_follow_it_and_count_against_the_table() {
        let config = ExchangeConfig {
            max_deltas_per_message: 2,
            max_pending_keys: 6,
            ..ExchangeConfig::default()
        };
        let mut out = Outbox::new();
        for n in [5, 1, 3] {
            out.record(key(n), &limit(), 1, 0);
        }
        let first = out.next_message(0, &config).unwrap().1;
        assert_eq!(first.len(), 2);
        // A new key, and a staged key again: both wait for the round.
        out.record(key(0), &limit(), 1, MS);
        out.record(key(5), &limit(), 2, MS);
        assert_eq!(out.pending_keys(), 3, "one staged, two pending");
        let staged_key = [1u8, 3, 5]
            .into_iter()
            .map(key)
            .find(|k| !first.iter().any(|d| d.key == *k))
            .unwrap();
        let second = out.next_message(MS, &config).unwrap().1;
        assert_eq!(second.len(), 1);
        assert_eq!(
            second[0].key, staged_key,
            "the round ends before new keys go"
        );
        let third = out.next_message(MS, &config).unwrap().1;
        let third_keys: Vec<BucketKey> = third.iter().map(|d| d.key).collect();
        assert_eq!(third_keys, [key(0), key(5)]);
        assert_eq!(out.unconfirmed(key(5)), 3);
        // Staged deltas hold places of the table until they leave.
        for n in 10..14 {
            out.record(key(n), &limit(), 1, 2 * MS);
        }
        out.next_message(2 * MS, &config).unwrap();
        out.record(key(20), &limit(), 1, 2 * MS);
        out.record(key(21), &limit(), 1, 2 * MS);
        assert_eq!(out.pending_keys(), 4);
        assert!(out.can_hold(key(22), &config));
        out.record(key(22), &limit(), 1, 2 * MS);
        out.record(key(23), &limit(), 1, 2 * MS);
        assert!(
            !out.can_hold(key(24), &config),
            "two staged and four pending fill six"
        );
        assert!(
            out.can_hold(key(23), &config),
            "a pending key takes more units"
        );
    }

    #[test]
    fn deltas_aggregate_per_key_and_wait_for_the_interval() {
        let config = ExchangeConfig::default();
        let mut out = Outbox::new();
        out.record(key(1), &limit(), 2, 10 * MS);
        out.record(key(1), &limit(), 3, 20 * MS);
        out.record(key(2), &limit(), 1, 30 * MS);
        let (seq, deltas) = out.next_message(30 * MS, &config).unwrap();
        assert_eq!(seq, 1);
        let total: u64 = deltas.iter().map(|d| d.units).sum();
        assert_eq!((deltas.len(), total), (2, 6));
        let k1 = deltas.iter().find(|d| d.key == key(1)).unwrap();
        assert_eq!((k1.units, k1.at_ns), (5, 20 * MS));
        // New units wait for the next interval.
        out.record(key(1), &limit(), 1, 40 * MS);
        assert_eq!(out.next_message(40 * MS, &config), None);
        assert_eq!(out.next_timeout(&config), Some(130 * MS));
        assert_eq!(out.next_message(130 * MS, &config).unwrap().0, 2);
        assert_eq!(out.unconfirmed(key(1)), 6);
    }

    #[test]
    fn unacknowledged_messages_are_sent_again_with_a_doubling_wait() {
        let config = ExchangeConfig::default();
        let mut out = Outbox::new();
        out.record(key(1), &limit(), 4, 0);
        let first = out.next_message(0, &config).unwrap();
        assert_eq!(out.next_message(399 * MS, &config), None);
        assert_eq!(out.next_message(400 * MS, &config), Some(first.clone()));
        assert_eq!(out.next_timeout(&config), Some(1_200 * MS));
        assert_eq!(out.next_message(1_200 * MS, &config), Some(first));
        out.acknowledge(2, &[], 1_300 * MS);
        assert!(out.is_idle());
        assert_eq!(out.next_timeout(&config), None);
        assert_eq!(out.retransmissions, 2);
    }

    #[test]
    fn a_silent_destination_becomes_unreachable_and_deltas_aggregate_meanwhile() {
        let config = ExchangeConfig {
            max_in_flight: 2,
            ..ExchangeConfig::default()
        };
        let mut out = Outbox::new();
        let mut now = 0;
        for _ in 0..50 {
            out.record(key(1), &limit(), 1, now);
            while out.next_message(now, &config).is_some() {}
            now += 100 * MS;
        }
        assert_eq!(out.in_flight(), 2, "in flight stays bounded");
        assert_eq!(out.pending_keys(), 1, "the rest aggregates into one delta");
        assert_eq!(out.unconfirmed(key(1)), 50);
        assert!(!out.is_reachable(now, &config));
        // One acknowledgement makes it reachable again.
        out.acknowledge(3, &[], now);
        assert!(out.is_reachable(now, &config));
        assert_eq!(out.unconfirmed(key(1)), 48);
    }

    #[test]
    fn out_of_order_acknowledgements_confirm_only_what_they_name() {
        let config = ExchangeConfig::default();
        let mut out = Outbox::new();
        for (i, now) in [0, 100 * MS, 200 * MS].into_iter().enumerate() {
            out.record(key(1), &limit(), i as u64 + 1, now);
            out.next_message(now, &config).unwrap();
        }
        // Messages of 1, 2 and 3 units: the third acknowledged first.
        out.acknowledge(1, &[3], 250 * MS);
        assert_eq!(out.unconfirmed(key(1)), 3);
        out.acknowledge(1, &[3], 260 * MS);
        assert_eq!(
            out.unconfirmed(key(1)),
            3,
            "a repeated acknowledgement changes nothing"
        );
        out.acknowledge(4, &[], 270 * MS);
        assert!(out.is_idle());
    }

    #[test]
    fn a_half_full_pending_table_goes_before_the_interval() {
        let config = ExchangeConfig {
            max_pending_keys: 4,
            ..ExchangeConfig::default()
        };
        let mut out = Outbox::new();
        out.record(key(1), &limit(), 1, 0);
        out.next_message(0, &config).unwrap();
        out.record(key(2), &limit(), 1, MS);
        assert_eq!(out.next_message(MS, &config), None, "one key waits");
        assert_eq!(out.next_timeout(&config), Some(100 * MS));
        out.record(key(3), &limit(), 1, 2 * MS);
        assert_eq!(out.next_timeout(&config), Some(0), "two of four: due now");
        let (_, deltas) = out.next_message(2 * MS, &config).unwrap();
        assert_eq!(deltas.len(), 2);
        // Emptied, the table waits for the interval again.
        out.record(key(4), &limit(), 1, 3 * MS);
        assert_eq!(out.next_timeout(&config), Some(102 * MS));
    }

    #[test]
    fn the_pending_table_is_bounded() {
        let config = ExchangeConfig {
            max_pending_keys: 2,
            ..ExchangeConfig::default()
        };
        let mut out = Outbox::new();
        out.record(key(1), &limit(), 1, 0);
        out.record(key(2), &limit(), 1, 0);
        assert!(out.can_hold(key(1), &config));
        assert!(!out.can_hold(key(3), &config));
    }
}

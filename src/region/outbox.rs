//! One destination's outbox: deltas pending (aggregated per key), messages in flight until
//! acknowledged (sent again with a doubling wait), and per key the units the destination has
//! not confirmed yet (what the admission rule limits).
//!
//! Every global check touches two of its tables, so they are hashbrown's (foldhash, seeded per
//! process) rather than std's SipHash, which cost about a tenth of a global check.

use std::collections::VecDeque;

use hashbrown::HashMap;

use super::config::ExchangeConfig;
use super::delta::Delta;
use crate::{BucketKey, Limit};

/// A message sent and not yet acknowledged.
#[derive(Debug, Clone)]
struct InFlight {
    seq: u64,
    deltas: Vec<Delta>,
    resend_at_ns: u64,
    wait_ns: u64,
}

#[derive(Debug)]
pub(super) struct Outbox {
    next_seq: u64,
    /// Keyed by the key's bits. A hash table: a global check adds to it, and an ordered map
    /// shifted entries within its nodes at every insertion of a new key.
    pending: HashMap<u128, Delta>,
    /// Deltas taken out of `pending` when it fell due, in the keys' order (so a seeded
    /// simulation replays exactly), leaving a message at a time. Taken out whole: picking each
    /// message's keys from `pending` read the whole table once per message.
    staged: VecDeque<Delta>,
    in_flight: VecDeque<InFlight>,
    /// Units per key in `pending` and `in_flight` together (kept equal to their sum).
    unconfirmed: HashMap<BucketKey, u64>,
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
            pending: HashMap::new(),
            staged: VecDeque::new(),
            in_flight: VecDeque::new(),
            unconfirmed: HashMap::new(),
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
    /// already). The length first: looking the key up costs a search of the table on every
    /// global check, and is needed only once the table is full.
    pub(super) fn can_hold(&self, key: BucketKey, config: &ExchangeConfig) -> bool {
        self.pending_keys() < config.max_pending_keys || self.pending.contains_key(&key.to_u128())
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
        if self.unconfirmed.is_empty() {
            self.progress_ns = now_ns;
        }
        let delta = self.pending.entry(key.to_u128()).or_insert(Delta {
            key,
            limit: *limit,
            units: 0,
            at_ns,
        });
        delta.units = delta.units.saturating_add(units);
        delta.at_ns = delta.at_ns.max(at_ns);
        delta.limit = *limit;
        let unconfirmed = self.unconfirmed.entry(key).or_insert(0);
        *unconfirmed = unconfirmed.saturating_add(units);
    }

    /// Units of `key` the destination has not confirmed.
    pub(super) fn unconfirmed(&self, key: BucketKey) -> u64 {
        self.unconfirmed.get(&key).copied().unwrap_or(0)
    }

    /// Every key with units not confirmed, and how many.
    pub(super) fn unconfirmed_keys(&self) -> impl Iterator<Item = (BucketKey, u64)> + '_ {
        self.unconfirmed.iter().map(|(&key, &units)| (key, units))
    }

    /// Nothing pending or in flight.
    pub(super) fn is_idle(&self) -> bool {
        self.unconfirmed.is_empty()
    }

    /// Units not confirmed, over every key.
    pub(super) fn total_unconfirmed(&self) -> u64 {
        self.unconfirmed
            .values()
            .fold(0, |a, &b| a.saturating_add(b))
    }

    /// Deltas not sent yet (a key staged and pending again counts twice: both are held).
    pub(super) fn pending_keys(&self) -> usize {
        self.pending.len() + self.staged.len()
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
        if self.staged.is_empty() {
            self.stage_pending();
        }
        let most = config.max_deltas_per_message.clamp(1, self.staged.len());
        let deltas: Vec<Delta> = self.staged.drain(..most).collect();
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

    /// Moves every pending delta to `staged`.
    fn stage_pending(&mut self) {
        self.staged = self.take_pending().into();
    }

    /// Every pending delta, in the keys' order, emptying the table.
    fn take_pending(&mut self) -> Vec<Delta> {
        let mut deltas: Vec<Delta> = self.pending.drain().map(|(_, d)| d).collect();
        deltas.sort_unstable_by_key(|d| d.key.to_u128());
        deltas
    }

    /// Takes the acknowledged messages out of flight: every sequence number below `below`, and
    /// those in `also`. Their units are confirmed.
    pub(super) fn acknowledge(&mut self, below: u64, also: &[u64], now_ns: u64) {
        let before = self.in_flight.len();
        let unconfirmed = &mut self.unconfirmed;
        self.in_flight.retain(|m| {
            let acked = m.seq < below || also.contains(&m.seq);
            if acked {
                for delta in &m.deltas {
                    if let Some(left) = unconfirmed.get_mut(&delta.key) {
                        *left = left.saturating_sub(delta.units);
                        if *left == 0 {
                            unconfirmed.remove(&delta.key);
                        }
                    }
                }
            }
            !acked
        });
        if self.in_flight.len() < before {
            self.progress_ns = now_ns;
        }
    }

    /// Every delta not confirmed, pending or in flight (a message in flight may have been
    /// applied already: its acknowledgement was not seen), emptying the outbox.
    pub(super) fn take_unconfirmed(&mut self) -> Vec<Delta> {
        let mut deltas: Vec<Delta> = self.staged.drain(..).collect();
        deltas.extend(self.take_pending());
        for message in self.in_flight.drain(..) {
            deltas.extend(message.deltas);
        }
        self.unconfirmed.clear();
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
        if !self.staged.is_empty() || self.pending_keys() >= config.max_pending_keys.div_ceil(2) {
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
    fn pending_deltas_leave_in_the_keys_order_a_message_at_a_time() {
        let config = ExchangeConfig {
            max_deltas_per_message: 3,
            max_in_flight: 16,
            ..ExchangeConfig::default()
        };
        let mut out = Outbox::new();
        for n in 0..8 {
            out.record(key(n), &limit(), 1, MS);
        }
        let mut sent = Vec::new();
        for expected in [3, 3, 2] {
            let (_, deltas) = out.next_message(MS, &config).unwrap();
            assert_eq!(deltas.len(), expected);
            sent.extend(deltas.iter().map(|d| d.key.to_u128()));
        }
        assert_eq!(out.pending_keys(), 0);
        let mut ordered = sent.clone();
        ordered.sort_unstable();
        ordered.dedup();
        assert_eq!(sent, ordered, "every key once, the smallest first");
        assert_eq!(sent.len(), 8);
        // What is taken back unconfirmed is in the keys' order too.
        out.record(key(9), &limit(), 1, MS);
        out.record(key(10), &limit(), 1, MS);
        let taken: Vec<u128> = out
            .take_unconfirmed()
            .iter()
            .map(|d| d.key.to_u128())
            .collect();
        let mut pending_first = taken[..2].to_vec();
        pending_first.sort_unstable();
        assert_eq!(taken[..2], pending_first[..]);
        assert_eq!(taken.len(), 10);
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
        // A key smaller than every staged one, and a staged key again: both wait for the round.
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
        let mut expected = vec![key(0).to_u128(), key(5).to_u128()];
        expected.sort_unstable();
        let third_keys: Vec<u128> = third.iter().map(|d| d.key.to_u128()).collect();
        assert_eq!(third_keys, expected);
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

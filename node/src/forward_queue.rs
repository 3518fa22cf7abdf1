//! Groups forwarded to an owner in this region, coalesced. Any batch with groups another node
//! owns forwards them as a kind 10 frame: a client's call on a stale route, and most calls of
//! the RLS and Redis fronts, which reach whichever node the load balancer picked. One frame
//! per batch made every such call a stream of its own to the owner, with its wake-ups at both
//! ends. Here, while a frame to an owner is out, what other batches forward to it waits and
//! leaves together in the next frame, as a client's calls do on its link: an idle owner is
//! sent at once, a busy one in rounds, and a forward after a light round (a few checks:
//! forwards come slower than round trips) goes at once beside it.
//!
//! Only batches placed by the same table travel together (the frame's request id is that
//! table's version, which the owner may wait to catch up with). Bounded: a round carries at
//! most the node's `max_batch` checks and half its `max_frame_bytes`, counted generously;
//! at most [`WAITING_ROUNDS`] rounds' worth (checks and bytes) waits for one owner, beyond
//! which a forward is refused at once (its groups unanswered, as when the owner does not
//! answer); a batch whose wait ended is dropped before its groups are sent.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use floodgate::wire::{
    CheckBatch, FrameKind, WireCheck, WireDecision, decode_decisions, encode_message,
};
use parking_lot::Mutex;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::cluster::Peers;

/// How many rounds' worth of checks and bytes may wait for one owner.
const WAITING_ROUNDS: usize = 4;

/// A round of fewer checks is light: forwards come slower than round trips, so the next one
/// does not wait for it but goes at once beside it (as a client's call after a light frame).
const LIGHT_ROUND: usize = 8;

/// Most rounds out to one owner at once, light ones beside each other.
const MAX_SENDERS: usize = 4;

/// Bytes a check is counted as beyond its key when a round is sized: more than a check takes
/// in a packed frame (its limit, at most once, its cost and flags).
const CHECK_OVERHEAD_BYTES: usize = 64;

/// How large a round may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RoundLimits {
    pub(crate) checks: usize,
    pub(crate) bytes: usize,
}

impl RoundLimits {
    /// From the node's own limits, which its peers share.
    pub(crate) fn of(limits: &crate::config::NodeLimits) -> Self {
        RoundLimits {
            checks: limits.max_batch.max(1),
            bytes: limits.max_frame_bytes / 2,
        }
    }
}

/// The waiting groups of every owner forwarded to, by address.
#[derive(Default)]
pub(crate) struct ForwardQueues {
    owners: Mutex<HashMap<String, Queue>>,
}

impl std::fmt::Debug for ForwardQueues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ForwardQueues({} owners)", self.owners.lock().len())
    }
}

impl ForwardQueues {
    /// Forwards `groups` (placed by the table of `table_version`) to the owner at `addr`, with
    /// those of other batches waiting for it, and returns their decisions in order, or `None`
    /// when none came by `within` (the owner silent, its answer unreadable, or too much
    /// already waiting for it).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn forward(
        self: &Arc<Self>,
        peers: &Arc<Peers>,
        addr: &str,
        groups: Vec<Vec<WireCheck>>,
        table_version: u64,
        within: Duration,
        limits: RoundLimits,
        max_answer_bytes: usize,
    ) -> Option<Vec<WireDecision>> {
        let deadline = Instant::now() + within;
        let (waiter, answer) = Waiter::new(groups, table_version, deadline);
        let start = {
            let mut owners = self.owners.lock();
            owners
                .entry(addr.to_owned())
                .or_default()
                .push(waiter, limits)
                .ok()?
        };
        if start {
            let (queues, peers, addr) = (self.clone(), peers.clone(), addr.to_owned());
            tokio::spawn(queues.send_rounds(peers, addr, limits, max_answer_bytes));
        }
        tokio::time::timeout_at(deadline, answer).await.ok()?.ok()
    }

    /// Sends the owner's rounds one after the other until nothing waits.
    async fn send_rounds(
        self: Arc<Self>,
        peers: Arc<Peers>,
        addr: String,
        limits: RoundLimits,
        max_answer_bytes: usize,
    ) {
        while let Some(round) = self.next_round(&addr, limits) {
            let mut frame = Vec::new();
            let kind = FrameKind::ForwardedCheckBatch;
            encode_message(&mut frame, kind, round.table_version, &round.batch);
            let within = round.deadline.saturating_duration_since(Instant::now());
            let answer = peers
                .request_within(
                    within,
                    &addr,
                    &frame,
                    max_answer_bytes,
                    FrameKind::DecisionBatch,
                )
                .await;
            let decisions = answer
                .ok()
                .and_then(|f| decode_decisions(&f.payload).ok())
                .map(|(decisions, _)| decisions);
            round.answer(decisions);
        }
    }

    /// The owner's next round, or `None` when nothing waits for it (the owner forgotten once no
    /// task sends to it).
    fn next_round(&self, addr: &str, limits: RoundLimits) -> Option<Round> {
        let mut owners = self.owners.lock();
        let queue = owners.get_mut(addr)?;
        let round = queue.take_round(limits);
        if queue.senders == 0 {
            owners.remove(addr);
        }
        round
    }
}

/// One batch's groups for an owner, and where their decisions go.
struct Waiter {
    groups: Vec<Vec<WireCheck>>,
    checks: usize,
    bytes: usize,
    table_version: u64,
    deadline: Instant,
    answer: oneshot::Sender<Vec<WireDecision>>,
}

impl Waiter {
    fn new(
        groups: Vec<Vec<WireCheck>>,
        table_version: u64,
        deadline: Instant,
    ) -> (Self, oneshot::Receiver<Vec<WireDecision>>) {
        let checks = groups.iter().map(Vec::len).sum();
        let bytes = groups
            .iter()
            .flatten()
            .map(|check| check.key.len() + CHECK_OVERHEAD_BYTES)
            .sum();
        let (answer, receiver) = oneshot::channel();
        let waiter = Waiter {
            groups,
            checks,
            bytes,
            table_version,
            deadline,
            answer,
        };
        (waiter, receiver)
    }
}

/// One owner's waiting batches.
#[derive(Default)]
struct Queue {
    waiting: VecDeque<Waiter>,
    /// The waiting batches' checks and bytes (counted as a round's are).
    waiting_checks: usize,
    waiting_bytes: usize,
    /// Tasks sending this owner's rounds, each one round at a time.
    senders: usize,
    /// The last round sent was light.
    light: bool,
}

/// Too much already waits for the owner.
#[derive(Debug, PartialEq, Eq)]
struct Full;

impl Queue {
    /// Queues `waiter`; true when the caller is to start a task sending this owner's rounds:
    /// none does yet, or the rounds out are light and another may go beside them.
    fn push(&mut self, waiter: Waiter, limits: RoundLimits) -> Result<bool, Full> {
        let over = self.waiting_checks + waiter.checks > limits.checks * WAITING_ROUNDS
            || self.waiting_bytes + waiter.bytes > limits.bytes * WAITING_ROUNDS;
        if !self.waiting.is_empty() && over {
            return Err(Full);
        }
        self.waiting_checks += waiter.checks;
        self.waiting_bytes += waiter.bytes;
        self.waiting.push_back(waiter);
        let start = self.senders == 0 || (self.light && self.senders < MAX_SENDERS);
        self.senders += usize::from(start);
        Ok(start)
    }

    /// The next round: the first batch still waited for and those after it placed by the same
    /// table, as many as fit. `None` (and the asking task no longer counted as sending) when
    /// nothing waits.
    fn take_round(&mut self, limits: RoundLimits) -> Option<Round> {
        self.waiting.retain(|w| !w.answer.is_closed());
        self.waiting_checks = self.waiting.iter().map(|w| w.checks).sum();
        self.waiting_bytes = self.waiting.iter().map(|w| w.bytes).sum();
        let Some(first) = self.waiting.front() else {
            self.senders = self.senders.saturating_sub(1);
            return None;
        };
        let table_version = first.table_version;
        let mut round = Round {
            batch: CheckBatch { groups: Vec::new() },
            table_version,
            deadline: first.deadline,
            answers: Vec::new(),
        };
        let (mut checks, mut bytes) = (0, 0);
        while let Some(next) = self.waiting.front() {
            let fits = checks + next.checks <= limits.checks && bytes + next.bytes <= limits.bytes;
            if !round.answers.is_empty() && (next.table_version != table_version || !fits) {
                break;
            }
            let Some(waiter) = self.waiting.pop_front() else {
                break;
            };
            checks += waiter.checks;
            bytes += waiter.bytes;
            self.waiting_checks -= waiter.checks;
            self.waiting_bytes -= waiter.bytes;
            round.deadline = round.deadline.max(waiter.deadline);
            round.batch.groups.extend(waiter.groups);
            round.answers.push((waiter.checks, waiter.answer));
        }
        self.light = checks < LIGHT_ROUND;
        Some(round)
    }
}

/// A frame's worth of waiting batches.
struct Round {
    batch: CheckBatch,
    table_version: u64,
    /// The latest of its batches' deadlines.
    deadline: Instant,
    /// Each batch's number of checks and where its decisions go, in the frame's order.
    answers: Vec<(usize, oneshot::Sender<Vec<WireDecision>>)>,
}

impl Round {
    /// Hands each batch its decisions; none when the owner's answer did not come or does not
    /// match the frame.
    fn answer(self, decisions: Option<Vec<WireDecision>>) {
        let total: usize = self.answers.iter().map(|(checks, _)| checks).sum();
        let Some(decisions) = decisions.filter(|d| d.len() == total) else {
            return;
        };
        let mut rest = decisions.as_slice();
        for (checks, answer) in self.answers {
            let (theirs, after) = rest.split_at(checks);
            let _ = answer.send(theirs.to_vec());
            rest = after;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: RoundLimits = RoundLimits {
        checks: 4,
        bytes: 1 << 20,
    };

    fn check(key: &str) -> WireCheck {
        WireCheck {
            key: key.as_bytes().to_vec(),
            algorithm: 0,
            rate: 10,
            period_ns: 1_000_000_000,
            burst: 10,
            cost: 1,
            refund: false,
            takeover: false,
            peek: false,
            charge: false,
        }
    }

    fn waiter(
        keys: &[&[&str]],
        version: u64,
        deadline: Instant,
    ) -> (Waiter, oneshot::Receiver<Vec<WireDecision>>) {
        let groups = keys
            .iter()
            .map(|group| group.iter().map(|k| check(k)).collect())
            .collect();
        Waiter::new(groups, version, deadline)
    }

    fn keys_of(round: &Round) -> Vec<Vec<String>> {
        round
            .batch
            .groups
            .iter()
            .map(|g| {
                g.iter()
                    .map(|c| String::from_utf8_lossy(&c.key).into_owned())
                    .collect()
            })
            .collect()
    }

    /// Decisions the tests tell apart.
    fn decision(n: u64) -> WireDecision {
        let code = match n {
            1 => floodgate::wire::ErrorCode::NotOwner,
            2 => floodgate::wire::ErrorCode::TryAgain,
            _ => floodgate::wire::ErrorCode::ShuttingDown,
        };
        WireDecision::error(code)
    }

    #[test]
    fn batches_waiting_together_leave_in_one_round_and_get_their_own_decisions() {
        let now = Instant::now();
        let mut queue = Queue::default();
        let (a, mut a_rx) = waiter(&[&["a1"], &["a2"]], 7, now);
        let (b, mut b_rx) = waiter(&[&["b1"]], 7, now + Duration::from_millis(5));
        assert_eq!(
            queue.push(a, LIMITS),
            Ok(true),
            "the first starts the sender"
        );
        assert_eq!(queue.push(b, LIMITS), Ok(false), "the rest wait for it");
        let round = queue.take_round(LIMITS).unwrap();
        assert_eq!(keys_of(&round), [["a1"], ["a2"], ["b1"]]);
        assert_eq!(round.table_version, 7);
        assert_eq!(round.deadline, now + Duration::from_millis(5));
        round.answer(Some(vec![decision(1), decision(2), decision(3)]));
        assert_eq!(a_rx.try_recv().unwrap(), [decision(1), decision(2)]);
        assert_eq!(b_rx.try_recv().unwrap(), [decision(3)]);
        assert!(queue.take_round(LIMITS).is_none());
        assert_eq!(
            queue.senders, 0,
            "idle again: the next forward starts a sender"
        );
    }

    #[test]
    fn after_a_light_round_a_forward_goes_at_once_beside_it() {
        let now = Instant::now();
        let mut queue = Queue::default();
        let (a, _a_rx) = waiter(&[&["a"]], 1, now);
        assert_eq!(queue.push(a, LIMITS), Ok(true));
        assert!(queue.take_round(LIMITS).is_some(), "a light round out");
        let mut receivers = Vec::new();
        for i in 1..MAX_SENDERS {
            let key = i.to_string();
            let (w, rx) = waiter(&[&[key.as_str()]], 1, now);
            assert_eq!(queue.push(w, LIMITS), Ok(true), "another sender for {key}");
            receivers.push(rx);
        }
        let (w, _rx) = waiter(&[&["last"]], 1, now);
        assert_eq!(
            queue.push(w, LIMITS),
            Ok(false),
            "at most {MAX_SENDERS} at once"
        );
        // After a round that is not light, forwards wait for it.
        let heavy = RoundLimits {
            checks: LIGHT_ROUND,
            bytes: 1 << 20,
        };
        let mut queue = Queue::default();
        let keys: Vec<String> = (0..LIGHT_ROUND).map(|i| i.to_string()).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let (w, _rx) = waiter(&[&keys], 1, now);
        assert_eq!(queue.push(w, heavy), Ok(true));
        assert!(queue.take_round(heavy).is_some());
        let (w, _rx2) = waiter(&[&["next"]], 1, now);
        assert_eq!(queue.push(w, heavy), Ok(false));
    }

    #[test]
    fn a_round_holds_one_table_and_fits_the_limits() {
        let now = Instant::now();
        let mut queue = Queue::default();
        let mut receivers = Vec::new();
        for (keys, version) in [
            (&[&["a", "b", "c"][..]][..], 3),
            (&[&["d", "e"][..]][..], 3), // over 4 checks with the first
            (&[&["f"][..]][..], 3),
            (&[&["g"][..]][..], 4), // another table
        ] {
            let (w, rx) = waiter(keys, version, now);
            queue.push(w, LIMITS).unwrap();
            receivers.push(rx);
        }
        let rounds: Vec<Vec<Vec<String>>> = std::iter::from_fn(|| queue.take_round(LIMITS))
            .map(|r| keys_of(&r))
            .collect();
        assert_eq!(
            rounds,
            [
                vec![vec!["a", "b", "c"]],
                vec![vec!["d", "e"], vec!["f"]],
                vec![vec!["g"]],
            ]
        );
        // A batch larger than a round still goes, alone.
        let (big, _rx) = waiter(&[&["1", "2", "3", "4", "5"]], 5, now);
        queue.push(big, LIMITS).unwrap();
        assert_eq!(keys_of(&queue.take_round(LIMITS).unwrap())[0].len(), 5);
        // Bytes bound a round as checks do.
        let narrow = RoundLimits {
            checks: 100,
            bytes: 2 * (CHECK_OVERHEAD_BYTES + 1),
        };
        for key in ["x", "y", "z"] {
            let (w, rx) = waiter(&[&[key]], 6, now);
            queue.push(w, narrow).unwrap();
            receivers.push(rx);
        }
        assert_eq!(keys_of(&queue.take_round(narrow).unwrap()).len(), 2);
        assert_eq!(keys_of(&queue.take_round(narrow).unwrap()).len(), 1);
    }

    #[test]
    fn what_waits_is_bounded_and_batches_no_longer_waited_for_are_dropped() {
        let now = Instant::now();
        let mut queue = Queue::default();
        let mut receivers = Vec::new();
        for i in 0..WAITING_ROUNDS * LIMITS.checks {
            let key = i.to_string();
            let (w, rx) = waiter(&[&[key.as_str()]], 1, now);
            queue.push(w, LIMITS).unwrap();
            receivers.push(rx);
        }
        let (over, _rx) = waiter(&[&["over"]], 1, now);
        assert_eq!(queue.push(over, LIMITS), Err(Full));
        // Bytes bound what waits as checks do: rounds of 2 one-byte keys' worth here.
        let narrow = RoundLimits {
            checks: 100,
            bytes: 2 * (CHECK_OVERHEAD_BYTES + 1),
        };
        let mut bytes_queue = Queue::default();
        let mut kept = Vec::new();
        for i in 0..2 * WAITING_ROUNDS {
            let key = (i % 10).to_string();
            let (w, rx) = waiter(&[&[key.as_str()]], 1, now);
            assert!(bytes_queue.push(w, narrow).is_ok(), "{i}");
            kept.push(rx);
        }
        let (w, _rx) = waiter(&[&["x"]], 1, now);
        assert_eq!(bytes_queue.push(w, narrow), Err(Full));
        // Every caller but the last stops waiting: only its batch is sent.
        let last = receivers.pop().unwrap();
        drop(receivers);
        let round = queue.take_round(LIMITS).unwrap();
        assert_eq!(
            keys_of(&round),
            [[(WAITING_ROUNDS * LIMITS.checks - 1).to_string()]]
        );
        assert_eq!(queue.waiting_checks, 0);
        drop(last);
        // A wrong count of decisions answers nobody (their waits end unanswered).
        let (w, mut rx) = waiter(&[&["a", "b"]], 1, now);
        queue.push(w, LIMITS).unwrap();
        queue
            .take_round(LIMITS)
            .unwrap()
            .answer(Some(vec![decision(1)]));
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn an_owner_nothing_waits_for_is_forgotten() {
        let queues = ForwardQueues::default();
        let (w, _rx) = waiter(&[&["a"]], 1, Instant::now());
        let addr = "127.0.0.1:1";
        let start = queues
            .owners
            .lock()
            .entry(addr.to_owned())
            .or_default()
            .push(w, LIMITS);
        assert_eq!(start, Ok(true));
        assert!(queues.next_round(addr, LIMITS).is_some());
        assert_eq!(queues.owners.lock().len(), 1, "kept while its round is out");
        assert!(queues.next_round(addr, LIMITS).is_none());
        assert!(queues.owners.lock().is_empty());
    }
}

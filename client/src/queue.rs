//! The per-node call queue: callers push their check groups, stream tasks drain them into frames.
//!
//! Adaptive batching: when no frame is in flight, an idle stream task is woken by the first call
//! and sends it alone at once (an idle gateway pays one round trip, nothing more). While a frame
//! is in flight, calls wait here, and the next frame leaves when that frame is answered, or
//! earlier, on another stream, once half a frame's worth of checks is waiting or the frame in
//! flight has been out over a millisecond (stalled). Every frame costs both ends a datagram, a
//! wake-up and a stream turn: letting free streams each carry a few calls under load cut the
//! checks per frame (and the throughput) by a third on a closed loop. Waiting pays only under
//! load, though: when the frame sent last was light (a call or two), calls arrive slower than
//! round trips, and the next one goes at once beside it instead of waiting up to a round trip.
//!
//! Timeouts are deadlines carried by each call, enforced by whoever holds the call: here by the
//! reaper ([`CallQueue::reap_expired`]: one timer for the whole queue, set for its oldest call),
//! in flight by the stream task (one timer per frame). A tokio timer per call cost about a fifth
//! of the client's throughput (registering and clearing it takes the timer driver's lock).

use std::collections::VecDeque;
use std::time::Duration;

use floodgate::check::DegradedReason;
use floodgate::wire::{WireCheck, WireScope};
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::check_group::SpareKeys;
use crate::reply_slot::{Reply, ReplySender};
use crate::status::LinkState;

/// One `check` call waiting for its answer.
#[derive(Debug)]
pub(crate) struct Call {
    /// Written over the caller's last group; handed back to it with the answer.
    pub(crate) checks: Vec<WireCheck>,
    /// One scope per check, or none when every check is `region` (sent as kind 1 then).
    pub(crate) scopes: Vec<WireScope>,
    pub(crate) reply: ReplySender,
    /// When the caller stops waiting: whoever holds the call then answers `Timeout`.
    pub(crate) deadline: Instant,
}

impl Call {
    /// The caller gave up, or its deadline passed: it decides through its failure mode.
    fn is_due(&self, now: Instant) -> bool {
        self.reply.is_closed() || self.deadline <= now
    }

    fn time_out(self) {
        self.answer(Reply::Failed(DegradedReason::Timeout));
    }

    /// Answers the caller, handing its check group back with the answer for its next call. A
    /// caller that gave up has nobody to tell: its group is freed.
    pub(crate) fn answer(self, reply: Reply) {
        let _ = self.reply.send_with_group(reply, self.checks);
    }
}

#[derive(Debug)]
struct Inner {
    /// `Connecting`: calls wait for the first connection (bounded by their timeout).
    /// `Connected`: only stream tasks of connection `generation` may take calls. `Disconnected`:
    /// calls fail over at once instead of waiting out their timeout.
    link: LinkState,
    generation: u64,
    calls: VecDeque<Call>,
    queued_checks: usize,
    /// Frames of connection `generation` sent and not yet answered.
    frames_in_flight: usize,
    /// The frame sent last (read only while frames are in flight). The newest frame, not the
    /// oldest: under load a frame leaves as soon as the one before is answered, so only a link
    /// where nothing moved for [`STALLED_FRAME`] is stalled, and only the newest frame says how
    /// busy the link is now.
    last_frame: Option<SentFrame>,
    /// The latest deadline of any call pushed: calls of a client share one timeout, so a call
    /// pushed later is mostly due no sooner, and the reaper need not hear of it before then.
    latest_deadline: Option<Instant>,
    /// When the reaper looks next; `None`: it waits for a push to wake it. A call pushed due
    /// before then wakes it early (a call sent again after `try_again` keeps its deadline).
    reaper_wakes_at: Option<Instant>,
}

/// Calls' room a drained queue keeps: a few full frames of single-check calls. A burst can
/// grow the ring to `max_queued_checks` calls (megabytes); kept, every later call would be
/// written to the next slot round that ring, a line long out of cache: a closed loop after an
/// overload spent 5-10% more of its gateway's CPU for it.
const KEPT_CALL_ROOM: usize = 4 * 1_024;

impl Inner {
    /// Once the queue is empty, the next call goes to the ring's first slot (still in cache,
    /// where `pop_front` would leave it after the last one taken), and room past
    /// [`KEPT_CALL_ROOM`] left by a burst is freed.
    fn rewind_if_empty(&mut self) {
        if !self.calls.is_empty() {
            return;
        }
        self.calls.clear();
        if self.calls.capacity() > KEPT_CALL_ROOM {
            self.calls.shrink_to(KEPT_CALL_ROOM);
        }
    }
}

/// What the gate remembers of the frame sent last.
#[derive(Debug, Clone, Copy)]
struct SentFrame {
    /// The deadline of its first call. Calls of a client share one timeout, so a queued call
    /// whose deadline is later by [`STALLED_FRAME`] was queued that long after that call.
    first_deadline: Instant,
    /// Its checks: fewer than [`LIGHT_FRAME_CHECKS`] and the link is not busy.
    checks: usize,
}

/// How long a frame may stay unanswered before calls stop waiting for it and go on another
/// stream: an answer on a warm link takes well under a millisecond, so a frame out this long is
/// stalled (a lost packet being recovered, a slow node), and the calls behind it must not share
/// its fate.
const STALLED_FRAME: Duration = Duration::from_millis(1);

/// A frame of fewer checks than this is light: its calls arrived fewer than a few per round
/// trip, so the next call goes at once beside it (at that rate an extra frame costs little)
/// rather than wait for its answer, up to a round trip added to the call. Under load, frames
/// carry hundreds of checks and calls wait to fill the next one.
const LIGHT_FRAME_CHECKS: usize = 8;

impl Inner {
    /// A stream may take calls now: nothing is in flight, enough waits to fill a frame well, or
    /// the frame sent last was light or looks stalled.
    fn may_send(&self, busy_batch_checks: usize) -> bool {
        let Some(newest) = self.calls.back() else {
            return false;
        };
        self.frames_in_flight == 0
            || self.queued_checks >= busy_batch_checks
            || self.last_frame.is_some_and(|last| {
                last.checks < LIGHT_FRAME_CHECKS
                    || newest.deadline >= last.first_deadline + STALLED_FRAME
            })
    }
}

/// What `drain` found.
#[derive(Debug, PartialEq, Eq)]
enum Drained {
    Taken,
    Empty,
    /// This stream task's connection is gone: it must stop.
    Stale,
}

/// A multi-producer, multi-consumer queue of calls for one node. A `parking_lot` mutex around a
/// `VecDeque` is held for a few pointer moves per call; `Notify` wakes one idle stream task when
/// calls become ready to go (or stores a single permit when all are busy). Calls that queue
/// after that ride with them and wake nobody: under load, a wake-up per call (one more write to
/// a line both cores use) cost 2-3% of a closed loop's rate.
#[derive(Debug)]
pub(crate) struct CallQueue {
    inner: Mutex<Inner>,
    /// Key buffers cut from check groups, for the next calls' longer groups.
    pub(crate) spare_keys: SpareKeys,
    ready: Notify,
    /// Checks that must be waiting before a second frame goes out while one is in flight.
    busy_batch_checks: usize,
    /// Wakes the reaper when a call arrives while it has no timer set.
    first_call: Notify,
    max_queued_checks: usize,
    /// Turns of the reaper's loop, for tests.
    #[cfg(test)]
    reaper_wakes: std::sync::atomic::AtomicUsize,
}

impl CallQueue {
    /// `busy_batch_checks`: see [`CallQueue::next_batch`] (1 sends every call as soon as a
    /// stream is free).
    pub(crate) fn new(max_queued_checks: usize, busy_batch_checks: usize) -> Self {
        CallQueue {
            inner: Mutex::new(Inner {
                link: LinkState::Connecting,
                generation: 0,
                calls: VecDeque::new(),
                queued_checks: 0,
                frames_in_flight: 0,
                last_frame: None,
                latest_deadline: None,
                reaper_wakes_at: None,
            }),
            spare_keys: SpareKeys::default(),
            ready: Notify::new(),
            busy_batch_checks: busy_batch_checks.max(1),
            first_call: Notify::new(),
            max_queued_checks,
            #[cfg(test)]
            reaper_wakes: Default::default(),
        }
    }

    /// Queues a call, or gives it back with the reason it cannot be served now.
    // The error carries the call back so the caller still owns its data; it is not an error type
    // worth boxing.
    #[allow(clippy::result_large_err)]
    pub(crate) fn push(&self, call: Call) -> Result<(), (Call, DegradedReason)> {
        let mut inner = self.inner.lock();
        if inner.link == LinkState::Disconnected {
            return Err((call, DegradedReason::Unreachable));
        }
        if inner.queued_checks + call.checks.len() > self.max_queued_checks {
            return Err((call, DegradedReason::Backlog));
        }
        // When calls could already go, a stream was woken for them (by the push, drain or
        // answer that made it so) and takes this call with them: no second wake-up needed.
        let could_send = inner.may_send(self.busy_batch_checks);
        inner.queued_checks += call.checks.len();
        inner.latest_deadline = inner.latest_deadline.max(Some(call.deadline));
        let wake_reaper = inner.reaper_wakes_at.is_none_or(|at| call.deadline < at);
        if wake_reaper {
            inner.reaper_wakes_at = Some(call.deadline);
        }
        // Calls stay in deadline order, which the reaper relies on: a call sent again after
        // `try_again` keeps its first deadline and goes ahead of the calls due after it.
        if inner
            .calls
            .back()
            .is_none_or(|last| last.deadline <= call.deadline)
        {
            inner.calls.push_back(call);
        } else {
            let at = inner.calls.partition_point(|c| c.deadline <= call.deadline);
            inner.calls.insert(at, call);
        }
        // A stream woken while the call must wait would only go back to sleep.
        let wake_stream = !could_send && inner.may_send(self.busy_batch_checks);
        drop(inner);
        if wake_stream {
            self.ready.notify_one();
        }
        if wake_reaper {
            self.first_call.notify_one();
        }
        Ok(())
    }

    /// Waits for calls and moves them into `out`: at least one, and then as many as fit in
    /// `max_checks`. Calls are taken when no frame of this connection is in flight, when
    /// `busy_batch_checks` are waiting, or when the frame sent last looks stalled
    /// ([`STALLED_FRAME`]). The frame counts as in flight until the returned guard is dropped. Returns `None`, taking nothing, once connection `generation` is gone.
    pub(crate) async fn next_batch(
        &self,
        generation: u64,
        max_checks: usize,
        out: &mut Vec<Call>,
    ) -> Option<FrameInFlight<'_>> {
        loop {
            // Registered before looking, so a push between the look and the wait still wakes us.
            let notified = self.ready.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            match self.drain(generation, max_checks, out) {
                Drained::Taken => {
                    return Some(FrameInFlight {
                        queue: self,
                        generation,
                    });
                }
                Drained::Stale => return None,
                Drained::Empty => notified.await,
            }
        }
    }

    /// A frame of connection `generation` was answered (or given up).
    fn frame_done(&self, generation: u64) {
        let mut inner = self.inner.lock();
        if inner.generation != generation {
            return;
        }
        inner.frames_in_flight = inner.frames_in_flight.saturating_sub(1);
        let wake_stream = inner.may_send(self.busy_batch_checks);
        drop(inner);
        if wake_stream {
            self.ready.notify_one();
        }
    }

    fn drain(&self, generation: u64, max_checks: usize, out: &mut Vec<Call>) -> Drained {
        let now = Instant::now();
        let mut expired = Vec::new();
        let mut inner = self.inner.lock();
        if (inner.link, inner.generation) != (LinkState::Connected, generation) {
            return Drained::Stale;
        }
        if !inner.may_send(self.busy_batch_checks) {
            // Calls past their deadline are the reaper's to answer meanwhile.
            return Drained::Empty;
        }
        let mut taken = 0;
        let mut dropped = 0;
        let mut first_deadline = None;
        while let Some(front) = inner.calls.front() {
            let len = front.checks.len();
            // A caller that gave up, or whose deadline passed, decides through its failure mode:
            // sending its checks now would consume tokens for a request answered without them.
            if front.is_due(now) {
                dropped += len;
                expired.extend(inner.calls.pop_front());
                continue;
            }
            if taken > 0 && taken + len > max_checks {
                break;
            }
            taken += len;
            first_deadline = first_deadline.or(Some(front.deadline));
            out.extend(inner.calls.pop_front());
        }
        inner.queued_checks -= taken + dropped;
        inner.rewind_if_empty();
        if let Some(first_deadline) = first_deadline {
            inner.last_frame = Some(SentFrame {
                first_deadline,
                checks: taken,
            });
            inner.frames_in_flight += 1;
        }
        let more = inner.may_send(self.busy_batch_checks);
        drop(inner);
        expired.into_iter().for_each(Call::time_out);
        if more {
            // Hand the rest to another idle stream rather than leaving it for our next turn.
            self.ready.notify_one();
        }
        if taken == 0 {
            Drained::Empty
        } else {
            Drained::Taken
        }
    }

    /// Answers `Timeout` to the queued calls whose deadline has passed; returns when to look
    /// again: the deadline of the oldest call left or, with none left, the latest deadline
    /// pushed (calls pushed until then are due no sooner), or `None` once that has passed (the
    /// reaper then waits for the next push). Calls queue in deadline order (`push` keeps it),
    /// so only the head is ever due.
    fn expire(&self, now: Instant) -> Option<Instant> {
        let mut expired = Vec::new();
        let mut inner = self.inner.lock();
        while let Some(front) = inner.calls.front() {
            if !front.is_due(now) {
                break;
            }
            inner.queued_checks -= front.checks.len();
            expired.extend(inner.calls.pop_front());
        }
        inner.rewind_if_empty();
        let next = match inner.calls.front() {
            Some(oldest) => Some(oldest.deadline),
            None => inner.latest_deadline.filter(|&latest| latest > now),
        };
        inner.reaper_wakes_at = next;
        drop(inner);
        expired.into_iter().for_each(Call::time_out);
        next
    }

    /// Runs forever, timing out queued calls when no stream task takes them in time (all busy,
    /// or the first connection attempt still under way). Sleeps on one timer, for the oldest
    /// call, or, when calls keep leaving on streams, for the latest deadline pushed: at 10,000
    /// calls a second it wakes every timeout instead of once a call (each call found the
    /// queue empty and woke it). Only a push to an idle reaper, or of a call due before the
    /// reaper's timer, wakes it.
    pub(crate) async fn reap_expired(&self) {
        loop {
            #[cfg(test)]
            self.reaper_wakes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let first_call = self.first_call.notified();
            let mut first_call = std::pin::pin!(first_call);
            first_call.as_mut().enable();
            match self.expire(Instant::now()) {
                // Woken early by a call due sooner.
                Some(deadline) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(deadline) => {}
                        () = first_call => {}
                    }
                }
                None => first_call.await,
            }
        }
    }

    /// A connection of `generation` is up: its stream tasks may take calls.
    pub(crate) fn set_up(&self, generation: u64) {
        {
            let mut inner = self.inner.lock();
            inner.link = LinkState::Connected;
            if inner.generation != generation {
                inner.frames_in_flight = 0;
            }
            inner.generation = generation;
        }
        self.ready.notify_waiters();
    }

    /// No connection: fail every queued call and refuse new ones until `set_up`.
    pub(crate) fn set_down(&self) {
        let calls = {
            let mut inner = self.inner.lock();
            inner.link = LinkState::Disconnected;
            inner.queued_checks = 0;
            std::mem::take(&mut inner.calls)
        };
        // Wake every waiting stream task of the old connection so it sees `Stale` and ends.
        self.ready.notify_waiters();
        for call in calls {
            call.answer(Reply::Failed(DegradedReason::Unreachable));
        }
    }

    #[cfg(test)]
    fn queued_checks(&self) -> usize {
        self.inner.lock().queued_checks
    }

    /// The call ring's capacity, and whether its calls sit in one run from its first slot on
    /// (none wrapped round the end).
    #[cfg(test)]
    fn ring(&self) -> (usize, bool) {
        let inner = self.inner.lock();
        (inner.calls.capacity(), inner.calls.as_slices().1.is_empty())
    }
}

/// A frame taken by [`CallQueue::next_batch`], in flight until dropped: its stream task holds
/// it until the frame's callers are answered, so the next frame can carry what queued meanwhile.
#[derive(Debug)]
pub(crate) struct FrameInFlight<'a> {
    queue: &'a CallQueue,
    generation: u64,
}

impl Drop for FrameInFlight<'_> {
    fn drop(&mut self) {
        self.queue.frame_done(self.generation);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use std::sync::Arc;

    use floodgate::Limit;

    use super::*;
    use crate::counting_waker::CountingWaker;
    use crate::reply_slot::{ReplyReceiver, reply_pair};

    fn call(checks: usize) -> (Call, ReplyReceiver) {
        call_due(checks, Duration::from_secs(3_600))
    }

    fn call_due(checks: usize, after: Duration) -> (Call, ReplyReceiver) {
        let limit = Limit::gcra(10, 1_000_000_000, 10).unwrap();
        let (reply, rx) = reply_pair();
        let checks = (0..checks)
            .map(|i| WireCheck::new(format!("k{i}"), &limit, 1))
            .collect();
        let deadline = Instant::now() + after;
        (
            Call {
                checks,
                scopes: Vec::new(),
                reply,
                deadline,
            },
            rx,
        )
    }

    fn spawn_reaper(queue: &Arc<CallQueue>) -> tokio::task::JoinHandle<()> {
        let queue = queue.clone();
        tokio::spawn(async move { queue.reap_expired().await })
    }

    fn timed_out(reply: Reply) -> bool {
        matches!(reply, Reply::Failed(DegradedReason::Timeout))
    }

    /// No stream may take calls now. Polled once, without letting the paused clock move (a
    /// timer would round up to a millisecond, and the stalled-frame rule would open the gate).
    fn nothing_leaves_yet(queue: &CallQueue, out: &mut Vec<Call>) -> bool {
        let pending = {
            let mut next = std::pin::pin!(queue.next_batch(1, 10, out));
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            next.as_mut().poll(&mut cx).is_pending()
        };
        pending && out.is_empty()
    }

    fn sizes(calls: &[Call]) -> Vec<usize> {
        calls.iter().map(|c| c.checks.len()).collect()
    }

    #[tokio::test]
    async fn calls_queued_while_busy_are_coalesced_up_to_the_bound() {
        let queue = CallQueue::new(1_000, 1);
        queue.set_up(1);
        let mut receivers = Vec::new();
        for n in [3, 4, 2, 5] {
            let (c, rx) = call(n);
            queue.push(c).unwrap();
            receivers.push(rx);
        }
        let mut out = Vec::new();
        assert!(queue.next_batch(1, 10, &mut out).await.is_some());
        // 3 + 4 + 2 = 9 fit in 10; the call of 5 would overflow and waits for the next frame.
        assert_eq!(sizes(&out), [3, 4, 2]);
        out.clear();
        assert!(queue.next_batch(1, 10, &mut out).await.is_some());
        assert_eq!(sizes(&out), [5]);
        assert_eq!(queue.queued_checks(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_leaves_no_large_ring_and_calls_after_it_start_at_the_first_slot() {
        let burst = 8 * KEPT_CALL_ROOM;
        let queue = Arc::new(CallQueue::new(burst, 1));
        queue.set_up(1);
        let mut receivers = Vec::new();
        let mut push = |count: usize, after: Duration| {
            for _ in 0..count {
                let (c, rx) = call_due(1, after);
                queue.push(c).unwrap();
                receivers.push(rx);
            }
        };
        // A burst taken by streams: the ring grew past the room kept, then emptied.
        push(burst, Duration::from_secs(3_600));
        assert!(queue.ring().0 >= burst);
        let mut out = Vec::new();
        while queue.queued_checks() > 0 {
            out.clear();
            drop(queue.next_batch(1, 1_024, &mut out).await);
        }
        assert!(queue.ring().0 <= KEPT_CALL_ROOM, "{:?}", queue.ring());
        // The next calls fill the ring from its first slot: none wrap round its end, as they
        // would from where the burst's last call was taken.
        push(KEPT_CALL_ROOM / 2, Duration::from_secs(3_600));
        out.clear();
        drop(queue.next_batch(1, 1, &mut out).await);
        push(KEPT_CALL_ROOM / 2, Duration::from_secs(3_600));
        assert_eq!(queue.ring(), (KEPT_CALL_ROOM, true));
        while queue.queued_checks() > 0 {
            out.clear();
            drop(queue.next_batch(1, 1_024, &mut out).await);
        }
        // A burst answered by the reaper instead (its deadline passed) leaves no large ring
        // either.
        push(burst, Duration::from_millis(5));
        tokio::time::advance(Duration::from_millis(10)).await;
        queue.expire(Instant::now());
        assert_eq!(queue.queued_checks(), 0);
        assert!(queue.ring().0 <= KEPT_CALL_ROOM, "{:?}", queue.ring());
    }

    #[tokio::test(start_paused = true)]
    async fn while_a_frame_is_in_flight_calls_wait_for_it_or_for_half_a_frame() {
        let queue = CallQueue::new(1_000, 4);
        queue.set_up(1);
        let (first, _rx1) = call(LIGHT_FRAME_CHECKS);
        queue.push(first).unwrap();
        let mut out = Vec::new();
        let in_flight = queue.next_batch(1, 10, &mut out).await.unwrap();
        assert_eq!(sizes(&out), [LIGHT_FRAME_CHECKS]);
        out.clear();
        // One check waits: too few to send beside the frame in flight.
        let (second, _rx2) = call(1);
        queue.push(second).unwrap();
        assert!(
            nothing_leaves_yet(&queue, &mut out),
            "a lone call went out beside a frame in flight"
        );
        // Four checks waiting are worth a second frame at once.
        let (third, _rx3) = call(3);
        queue.push(third).unwrap();
        let second_frame = tokio::time::timeout(
            Duration::from_micros(100),
            queue.next_batch(1, 10, &mut out),
        )
        .await
        .expect("four checks waited behind a frame in flight")
        .unwrap();
        assert_eq!(sizes(&out), [1, 3]);
        drop((in_flight, second_frame));
        // Nothing in flight again: a single call goes at once.
        out.clear();
        let (fourth, _rx4) = call(1);
        queue.push(fourth).unwrap();
        assert!(queue.next_batch(1, 10, &mut out).await.is_some());
        assert_eq!(sizes(&out), [1]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_goes_at_once_beside_a_light_frame_but_waits_behind_a_full_one() {
        let queue = CallQueue::new(1_000, 100);
        queue.set_up(1);
        let mut out = Vec::new();
        // A lone call in flight: the link is not busy, so the next call does not wait for it.
        let (lone, _rx1) = call(1);
        queue.push(lone).unwrap();
        let _light = queue.next_batch(1, 10, &mut out).await.unwrap();
        out.clear();
        let (next, _rx2) = call(1);
        queue.push(next).unwrap();
        assert!(
            !nothing_leaves_yet(&queue, &mut out),
            "a call waited behind a light frame"
        );
        assert_eq!(sizes(&out), [1]);
        out.clear();
        // A frame that was not light is in flight now: calls wait for it again.
        let (busy, _rx3) = call(LIGHT_FRAME_CHECKS);
        queue.push(busy).unwrap();
        let _full = queue.next_batch(1, 10, &mut out).await.unwrap();
        out.clear();
        let (after, _rx4) = call(1);
        queue.push(after).unwrap();
        assert!(
            nothing_leaves_yet(&queue, &mut out),
            "a call went out beside a frame that was not light"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn calls_behind_a_stalled_frame_go_on_another_stream() {
        let queue = CallQueue::new(1_000, 100);
        queue.set_up(1);
        let (first, _rx1) = call(LIGHT_FRAME_CHECKS);
        queue.push(first).unwrap();
        let mut out = Vec::new();
        let _stalled = queue.next_batch(1, 10, &mut out).await.unwrap();
        out.clear();
        // Queued just after the frame left: it waits for the answer.
        let (early, _rx2) = call(1);
        queue.push(early).unwrap();
        assert!(nothing_leaves_yet(&queue, &mut out));
        // The frame is still out a millisecond after it left: the next call takes both along.
        tokio::time::advance(STALLED_FRAME).await;
        let (late, _rx3) = call(1);
        queue.push(late).unwrap();
        let taken =
            tokio::time::timeout(Duration::from_millis(1), queue.next_batch(1, 10, &mut out));
        assert!(
            taken
                .await
                .expect("calls waited behind a stalled frame")
                .is_some()
        );
        assert_eq!(sizes(&out), [1, 1]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_answered_frame_releases_the_calls_that_waited_for_it() {
        let queue = Arc::new(CallQueue::new(1_000, 100));
        queue.set_up(1);
        let (first, _rx1) = call(LIGHT_FRAME_CHECKS);
        queue.push(first).unwrap();
        let mut out = Vec::new();
        let in_flight = queue.next_batch(1, 10, &mut out).await.unwrap();
        let (second, _rx2) = call(2);
        queue.push(second).unwrap();
        let waiting = tokio::spawn({
            let queue = queue.clone();
            async move {
                let mut out = Vec::new();
                let _frame = queue.next_batch(1, 10, &mut out).await;
                sizes(&out)
            }
        });
        tokio::task::yield_now().await; // the other stream waits behind the frame in flight
        assert!(!waiting.is_finished());
        drop(in_flight);
        assert_eq!(waiting.await.unwrap(), [2]);
    }

    #[tokio::test]
    async fn frames_of_an_old_connection_do_not_hold_back_the_new_one() {
        let queue = CallQueue::new(1_000, 100);
        queue.set_up(1);
        let (first, _rx1) = call(1);
        queue.push(first).unwrap();
        let mut out = Vec::new();
        let old_frame = queue.next_batch(1, 10, &mut out).await.unwrap();
        queue.set_down();
        queue.set_up(2);
        let (second, _rx2) = call(1);
        queue.push(second).unwrap();
        out.clear();
        let new_frame = queue.next_batch(2, 10, &mut out).await.unwrap();
        assert_eq!(sizes(&out), [1]);
        // The old frame ending later must not count against the new connection's frames.
        drop(old_frame);
        drop(new_frame);
        let (third, _rx3) = call(1);
        queue.push(third).unwrap();
        out.clear();
        assert!(queue.next_batch(2, 10, &mut out).await.is_some());
    }

    #[tokio::test]
    async fn a_call_is_never_split_and_always_taken_when_first() {
        let queue = CallQueue::new(1_000, 1);
        queue.set_up(1);
        let (c, _rx) = call(8);
        queue.push(c).unwrap();
        let mut out = Vec::new();
        assert!(queue.next_batch(1, 4, &mut out).await.is_some());
        assert_eq!(sizes(&out), [8]);
    }

    #[tokio::test]
    async fn calls_whose_caller_gave_up_are_not_sent() {
        let queue = CallQueue::new(1_000, 1);
        queue.set_up(1);
        let (gone, rx) = call(2);
        drop(rx);
        let (kept, _rx) = call(1);
        queue.push(gone).unwrap();
        queue.push(kept).unwrap();
        let mut out = Vec::new();
        assert!(queue.next_batch(1, 10, &mut out).await.is_some());
        assert_eq!(sizes(&out), [1]);
        assert_eq!(queue.queued_checks(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_stream_is_woken_by_the_first_call() {
        let queue = Arc::new(CallQueue::new(1_000, 1));
        queue.set_up(7);
        let consumer = tokio::spawn({
            let queue = queue.clone();
            async move {
                let mut out = Vec::new();
                assert!(queue.next_batch(7, 10, &mut out).await.is_some());
                sizes(&out)
            }
        });
        tokio::task::yield_now().await; // the consumer is now waiting on an empty queue
        let (c, _rx) = call(1);
        queue.push(c).unwrap();
        assert_eq!(consumer.await.unwrap(), [1]);
    }

    #[test]
    fn calls_queued_while_a_stream_is_already_woken_wake_no_other() {
        let queue = CallQueue::new(1_000, 1);
        queue.set_up(1);
        let (mut out_a, mut out_b) = (Vec::new(), Vec::new());
        let mut a = Box::pin(queue.next_batch(1, 10, &mut out_a));
        let mut b = Box::pin(queue.next_batch(1, 10, &mut out_b));
        let (wakes_a, wakes_b) = (CountingWaker::new(), CountingWaker::new());
        let (waker_a, waker_b) = (wakes_a.waker(), wakes_b.waker());
        let mut cx_a = std::task::Context::from_waker(&waker_a);
        let mut cx_b = std::task::Context::from_waker(&waker_b);
        // Both streams idle on an empty queue.
        assert!(a.as_mut().poll(&mut cx_a).is_pending());
        assert!(b.as_mut().poll(&mut cx_b).is_pending());
        let (first, _rx1) = call(1);
        queue.push(first).unwrap();
        assert_eq!((wakes_a.count(), wakes_b.count()), (1, 0));
        // Stream A is woken and has not run yet: the next call rides with the first.
        let (second, _rx2) = call(1);
        queue.push(second).unwrap();
        assert_eq!(
            wakes_b.count(),
            0,
            "a second stream was woken for a call the first takes"
        );
        assert!(a.as_mut().poll(&mut cx_a).is_ready());
        assert!(b.as_mut().poll(&mut cx_b).is_pending());
        drop((a, b));
        assert_eq!(sizes(&out_a), [1, 1]);
    }

    #[tokio::test]
    async fn going_down_fails_queued_calls_refuses_new_ones_and_stops_streams() {
        let queue = Arc::new(CallQueue::new(1_000, 1));
        queue.set_up(1);
        let (c, rx) = call(1);
        queue.push(c).unwrap();
        let waiting = tokio::spawn({
            let queue = queue.clone();
            async move {
                let mut out = Vec::new();
                // Takes the queued call, then waits for more until the link goes down.
                assert!(queue.next_batch(1, 1, &mut out).await.is_some());
                out.clear();
                queue.next_batch(1, 1, &mut out).await.is_some()
            }
        });
        // Wait until the consumer has taken the call (its caller sees nothing yet).
        while queue.queued_checks() != 0 {
            tokio::task::yield_now().await;
        }
        let (c2, rx2) = call(1);
        queue.push(c2).unwrap();
        queue.set_down();
        assert!(matches!(
            rx2.await,
            Reply::Failed(DegradedReason::Unreachable)
        ));
        assert!(!waiting.await.unwrap());
        drop(rx);
        let (c3, _rx3) = call(1);
        assert!(matches!(
            queue.push(c3),
            Err((_, DegradedReason::Unreachable))
        ));
    }

    #[tokio::test]
    async fn streams_of_an_old_connection_take_nothing() {
        let queue = CallQueue::new(1_000, 1);
        queue.set_up(2);
        let (c, _rx) = call(1);
        queue.push(c).unwrap();
        let mut out = Vec::new();
        assert!(queue.next_batch(1, 10, &mut out).await.is_none());
        assert!(out.is_empty());
        assert!(queue.next_batch(2, 10, &mut out).await.is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn the_reaper_times_out_calls_nobody_takes_at_their_deadline() {
        let queue = Arc::new(CallQueue::new(1_000, 1));
        let reaper = spawn_reaper(&queue);
        let start = Instant::now();
        let (a, rx_a) = call_due(1, Duration::from_millis(5));
        let (b, rx_b) = call_due(2, Duration::from_millis(8));
        queue.push(a).unwrap();
        queue.push(b).unwrap();
        assert!(timed_out(rx_a.await));
        assert_eq!(Instant::now() - start, Duration::from_millis(5));
        assert!(timed_out(rx_b.await));
        assert_eq!(Instant::now() - start, Duration::from_millis(8));
        assert_eq!(queue.queued_checks(), 0);
        // Idle again, the reaper waits for the next first call, then its deadline.
        let (c, rx_c) = call_due(1, Duration::from_millis(3));
        queue.push(c).unwrap();
        assert!(timed_out(rx_c.await));
        assert_eq!(Instant::now() - start, Duration::from_millis(11));
        reaper.abort();
    }

    /// A call sent again after `try_again` keeps its first deadline, earlier than those of
    /// calls pushed since: it goes ahead of them and is timed out at its own deadline, not
    /// theirs.
    #[tokio::test(start_paused = true)]
    async fn a_call_due_before_those_queued_is_timed_out_at_its_deadline() {
        let queue = Arc::new(CallQueue::new(1_000, 1));
        let reaper = spawn_reaper(&queue);
        let start = Instant::now();
        let (fresh, rx_fresh) = call_due(1, Duration::from_millis(50));
        let (retried, rx_retried) = call_due(2, Duration::from_millis(5));
        queue.push(fresh).unwrap();
        // Let the reaper set its timer for the fresh call first.
        tokio::task::yield_now().await;
        queue.push(retried).unwrap();
        assert!(timed_out(rx_retried.await));
        assert_eq!(Instant::now() - start, Duration::from_millis(5));
        assert_eq!(queue.queued_checks(), 1);
        assert!(timed_out(rx_fresh.await));
        assert_eq!(Instant::now() - start, Duration::from_millis(50));
        // Taken in deadline order too.
        let (later, _rx_later) = call_due(1, Duration::from_millis(30));
        let (sooner, _rx_sooner) = call_due(3, Duration::from_millis(20));
        queue.push(later).unwrap();
        queue.push(sooner).unwrap();
        queue.set_up(1);
        let mut out = Vec::new();
        assert!(queue.next_batch(1, 10, &mut out).await.is_some());
        assert_eq!(sizes(&out), [3, 1]);
        reaper.abort();
    }

    /// Calls that leave on a stream as they come do not wake the reaper each: it wakes about
    /// once per timeout, and still times out at its deadline a call nobody takes.
    #[tokio::test(start_paused = true)]
    async fn calls_taken_at_once_wake_the_reaper_about_once_per_timeout() {
        let queue = Arc::new(CallQueue::new(1_000, 1));
        queue.set_up(1);
        let reaper = spawn_reaper(&queue);
        let timeout = Duration::from_millis(5);
        let mut out = Vec::new();
        for _ in 0..100 {
            let (c, rx) = call_due(1, timeout);
            queue.push(c).unwrap();
            let frame = queue.next_batch(1, 10, &mut out).await.unwrap();
            out.drain(..)
                .for_each(|c| c.answer(Reply::Failed(DegradedReason::Backlog)));
            drop(frame);
            assert!(!timed_out(rx.await));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // 100 ms of calls, a deadline of 5 ms: about 20 turns (it was 100 or more, one a call).
        let wakes = queue
            .reaper_wakes
            .load(std::sync::atomic::Ordering::Relaxed);
        assert!((15..=30).contains(&wakes), "{wakes} turns of the reaper");
        let start = Instant::now();
        let (late, rx_late) = call_due(1, timeout);
        queue.push(late).unwrap();
        assert!(timed_out(rx_late.await));
        assert_eq!(Instant::now() - start, timeout);
        reaper.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn expired_calls_are_answered_not_sent() {
        let queue = CallQueue::new(1_000, 1);
        queue.set_up(1);
        let (late, rx_late) = call_due(1, Duration::from_millis(1));
        let (fresh, _rx) = call(1);
        queue.push(late).unwrap();
        queue.push(fresh).unwrap();
        tokio::time::advance(Duration::from_millis(1)).await;
        let mut out = Vec::new();
        assert!(queue.next_batch(1, 10, &mut out).await.is_some());
        assert_eq!(sizes(&out), [1]);
        assert!(timed_out(rx_late.await));
    }

    #[test]
    fn the_backlog_is_bounded() {
        let queue = CallQueue::new(5, 1);
        let (a, _ra) = call(3);
        let (b, _rb) = call(3);
        queue.push(a).unwrap();
        assert!(matches!(queue.push(b), Err((_, DegradedReason::Backlog))));
    }
}

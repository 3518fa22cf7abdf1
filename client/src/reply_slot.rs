//! What a stream task hands back to a caller ([`Reply`]), and the caller's reply slot it is left
//! in, with the call's check group for the caller's next call. A slot is reused from call to
//! call (a `oneshot` channel allocates its shared state on every call); each use is one "turn",
//! so a sender of an old turn never answers a later call.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};

use floodgate::check::DegradedReason;
use floodgate::wire::{ErrorCode, WireCheck, WireDecision};
use parking_lot::Mutex;

/// What a stream task hands back to a caller.
#[derive(Debug)]
pub(crate) enum Reply {
    /// The node decided: this call's decisions are `decisions[start..start + checks]`. The
    /// frame's decisions are shared by all its calls, so answering costs no allocation per call.
    Decided {
        decisions: Arc<Vec<WireDecision>>,
        start: usize,
    },
    /// The node refused the call itself as invalid (a bad-request code).
    Refused { code: ErrorCode, message: String },
    /// No answer from the node.
    Failed(DegradedReason),
}

/// One reusable reply slot. `turn` moves on when the receiver of the current turn is dropped
/// (answered or given up), which closes that turn for its sender.
#[derive(Debug, Default)]
pub(crate) struct ReplySlot {
    turn: AtomicU64,
    state: Mutex<SlotState>,
}

#[derive(Debug, Default)]
struct SlotState {
    reply: Option<Reply>,
    waker: Option<Waker>,
    /// The check group of the last answered call, handed back for the next one to fill.
    group: Vec<WireCheck>,
}

impl ReplySlot {
    /// The group the last answer handed back (empty for a new slot), for this call to fill.
    /// Taken before the slot is armed, while no sender may write to it.
    pub(crate) fn take_group(&self) -> Vec<WireCheck> {
        std::mem::take(&mut self.state.lock().group)
    }

    /// The sender and receiver of this slot's current turn. The slot must not be armed again
    /// before the receiver returned here is dropped (each caller owns its slot meanwhile).
    pub(crate) fn arm(self: &Arc<Self>) -> (ReplySender, ReplyReceiver) {
        let turn = self.turn.load(Ordering::Acquire);
        (
            ReplySender {
                slot: Some(self.clone()),
                turn,
            },
            ReplyReceiver {
                slot: self.clone(),
                turn,
                answered: false,
            },
        )
    }
}

/// Most reply slots kept per thread: enough for a few thousand concurrent callers; a caller
/// beyond them allocates one.
const POOLED_PER_THREAD: usize = 4_096;

thread_local! {
    /// Slots of finished calls, for the next calls on the same thread: per thread, so callers on
    /// different cores share no pool (a shared queue's head and tail moved between the cores on
    /// every call). Any client's calls may use any slot: a slot belongs to no client.
    static POOL: std::cell::RefCell<Vec<Arc<ReplySlot>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// A slot for one call: a finished call's from this thread, or a new one.
pub(crate) fn take() -> Arc<ReplySlot> {
    // `try_with`: while the thread's locals are torn down, a call still gets a fresh slot.
    POOL.try_with(|pool| pool.borrow_mut().pop())
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Gives a slot back once its call finished (its receiver dropped): the next call's.
pub(crate) fn give_back(slot: Arc<ReplySlot>) {
    let _ = POOL.try_with(|pool| {
        let mut pool = pool.borrow_mut();
        if pool.len() < POOLED_PER_THREAD {
            pool.push(slot);
        }
    });
}

/// A fresh slot's sender and receiver (calls outside the hot path, and tests).
pub(crate) fn reply_pair() -> (ReplySender, ReplyReceiver) {
    Arc::new(ReplySlot::default()).arm()
}

/// The stream task's end: answers once. Dropped unanswered (the runtime shutting down), it
/// answers `Unreachable`, as every holder of a call must answer it or let it read as lost.
#[derive(Debug)]
pub(crate) struct ReplySender {
    /// `None` once answered.
    slot: Option<Arc<ReplySlot>>,
    turn: u64,
}

impl ReplySender {
    /// Leaves `reply` for the caller; gives it back when the caller stopped waiting.
    #[cfg(test)]
    pub(crate) fn send(self, reply: Reply) -> Result<(), Reply> {
        self.send_with_group(reply, Vec::new())
    }

    /// [`ReplySender::send`], handing the call's check group back for the caller's next call
    /// (freed when the caller stopped waiting).
    pub(crate) fn send_with_group(
        mut self,
        reply: Reply,
        group: Vec<WireCheck>,
    ) -> Result<(), Reply> {
        match self.slot.take() {
            Some(slot) => deliver(&slot, self.turn, reply, group),
            None => Err(reply),
        }
    }

    /// The caller gave up waiting (its future was dropped).
    pub(crate) fn is_closed(&self) -> bool {
        self.slot
            .as_ref()
            .is_none_or(|slot| slot.turn.load(Ordering::Acquire) != self.turn)
    }
}

impl Drop for ReplySender {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            let reply = Reply::Failed(DegradedReason::Unreachable);
            let _ = deliver(&slot, self.turn, reply, Vec::new());
        }
    }
}

fn deliver(slot: &ReplySlot, turn: u64, reply: Reply, group: Vec<WireCheck>) -> Result<(), Reply> {
    let waker = {
        let mut state = slot.state.lock();
        // Checked under the lock the receiver closes its turn under: no answer lands after.
        if slot.turn.load(Ordering::Acquire) != turn {
            return Err(reply);
        }
        state.reply = Some(reply);
        state.group = group;
        state.waker.take()
    };
    if let Some(waker) = waker {
        waker.wake();
    }
    Ok(())
}

/// The caller's end: resolves to the reply of its turn.
#[derive(Debug)]
pub(crate) struct ReplyReceiver {
    slot: Arc<ReplySlot>,
    turn: u64,
    /// The reply was taken, and the turn closed with it: dropping has nothing left to do.
    answered: bool,
}

impl Future for ReplyReceiver {
    type Output = Reply;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Reply> {
        let this = &mut *self;
        let mut state = this.slot.state.lock();
        if let Some(reply) = state.reply.take() {
            // Closes the turn now, under the lock already held, so that dropping the receiver
            // (right after, on every call) takes no second lock.
            this.slot.turn.fetch_add(1, Ordering::AcqRel);
            let waker = state.waker.take();
            drop(state);
            drop(waker);
            this.answered = true;
            return Poll::Ready(reply);
        }
        // Cloning a runtime waker is a reference count; skip it when the same task polls again.
        if !state
            .waker
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            state.waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

impl Drop for ReplyReceiver {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        let mut state = self.slot.state.lock();
        if self.slot.turn.load(Ordering::Acquire) == self.turn {
            self.slot.turn.fetch_add(1, Ordering::AcqRel);
        }
        state.reply = None;
        state.waker = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counting_waker::CountingWaker;

    fn poll(receiver: &mut ReplyReceiver, waker: &Arc<CountingWaker>) -> Poll<Reply> {
        Pin::new(receiver).poll(&mut Context::from_waker(&waker.waker()))
    }

    fn is_failed(reply: Poll<Reply>, reason: DegradedReason) -> bool {
        matches!(reply, Poll::Ready(Reply::Failed(r)) if r == reason)
    }

    #[test]
    fn an_answer_wakes_the_waiting_caller_once() {
        let waker = CountingWaker::new();
        let (sender, mut receiver) = reply_pair();
        assert!(poll(&mut receiver, &waker).is_pending());
        assert!(!sender.is_closed());
        sender.send(Reply::Failed(DegradedReason::Timeout)).unwrap();
        assert_eq!(waker.count(), 1);
        assert!(is_failed(
            poll(&mut receiver, &waker),
            DegradedReason::Timeout
        ));
    }

    #[test]
    fn an_answered_turn_closes_once_and_the_slot_serves_the_next_call() {
        let slot = Arc::new(ReplySlot::default());
        let waker = CountingWaker::new();
        let (sender, mut receiver) = slot.arm();
        sender
            .send_with_group(Reply::Failed(DegradedReason::Timeout), Vec::new())
            .unwrap();
        assert!(is_failed(
            poll(&mut receiver, &waker),
            DegradedReason::Timeout
        ));
        // Closed by the answer itself; dropping the receiver must not move the turn again.
        assert_eq!(slot.turn.load(Ordering::Acquire), 1);
        drop(receiver);
        assert_eq!(slot.turn.load(Ordering::Acquire), 1);
        let (sender, mut receiver) = slot.arm();
        assert!(poll(&mut receiver, &waker).is_pending());
        sender.send(Reply::Failed(DegradedReason::Backlog)).unwrap();
        assert!(is_failed(
            poll(&mut receiver, &waker),
            DegradedReason::Backlog
        ));
    }

    #[test]
    fn a_dropped_sender_reads_as_unreachable() {
        let waker = CountingWaker::new();
        let (sender, mut receiver) = reply_pair();
        drop(sender);
        assert!(is_failed(
            poll(&mut receiver, &waker),
            DegradedReason::Unreachable
        ));
    }

    #[test]
    fn a_caller_that_gave_up_closes_its_turn_and_a_reused_slot_ignores_old_senders() {
        let slot = Arc::new(ReplySlot::default());
        let (old_sender, old_receiver) = slot.arm();
        drop(old_receiver);
        assert!(old_sender.is_closed());
        let (sender, mut receiver) = slot.arm();
        // The first turn's late answer must not reach the second turn's caller.
        assert!(
            old_sender
                .send(Reply::Failed(DegradedReason::Timeout))
                .is_err()
        );
        let waker = CountingWaker::new();
        assert!(poll(&mut receiver, &waker).is_pending());
        sender.send(Reply::Failed(DegradedReason::Backlog)).unwrap();
        assert!(is_failed(
            poll(&mut receiver, &waker),
            DegradedReason::Backlog
        ));
    }
}

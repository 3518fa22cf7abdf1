//! `WaitBound`: at most `max_waiting` requests wait (`max_wait`) at once; the others are denied.
//!
//! Waiting holds a request (and its connection) open, so an unbounded number of waiters would
//! turn a rate limit into a memory and connection leak. The bound is a counter, not a timer: the
//! caller sleeps however its runtime sleeps, holding a [`WaitPermit`].

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts requests currently waiting, up to a maximum. Share it behind an `Arc`.
#[derive(Debug)]
pub struct WaitBound {
    waiting: AtomicUsize,
    max: usize,
}

impl WaitBound {
    pub fn new(max_waiting: usize) -> Arc<Self> {
        Arc::new(WaitBound {
            waiting: AtomicUsize::new(0),
            max: max_waiting,
        })
    }

    /// A permit to wait, or `None` when `max_waiting` requests already wait (deny instead:
    /// [`super::RequestVerdict::into_denial`]).
    pub fn try_enter(self: &Arc<Self>) -> Option<WaitPermit> {
        self.waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()?;
        Some(WaitPermit {
            bound: Arc::clone(self),
        })
    }

    /// Requests waiting now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    pub fn max_waiting(&self) -> usize {
        self.max
    }
}

/// One waiting request; dropping it frees its place.
#[derive(Debug)]
pub struct WaitPermit {
    bound: Arc<WaitBound>,
}

impl Drop for WaitPermit {
    fn drop(&mut self) {
        self.bound.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

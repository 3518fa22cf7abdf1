//! A waker that counts its wake-ups, for tests that poll futures by hand and check who was woken.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Wake, Waker};

#[derive(Debug, Default)]
pub(crate) struct CountingWaker(AtomicUsize);

impl CountingWaker {
    pub(crate) fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Wake-ups so far.
    pub(crate) fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }

    pub(crate) fn waker(self: &Arc<Self>) -> Waker {
        Waker::from(self.clone())
    }
}

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

//! Time as the core sees it: nanoseconds from an origin, passed in as `now`. The core never reads
//! a clock itself; callers own the clock, and tests use [`FakeClock`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A source of `now` in nanoseconds. It must never go backwards for a given store.
pub trait Clock: Send + Sync {
    fn now_ns(&self) -> u64;
}

/// A clock that moves only when told. Clones share the same time, so a test can hold one handle
/// and give another to the code under test.
#[derive(Debug, Clone, Default)]
pub struct FakeClock {
    now_ns: Arc<AtomicU64>,
}

impl FakeClock {
    pub fn new(start_ns: u64) -> Self {
        FakeClock {
            now_ns: Arc::new(AtomicU64::new(start_ns)),
        }
    }

    /// Moves time forward by `delta_ns`.
    pub fn advance(&self, delta_ns: u64) {
        self.now_ns.fetch_add(delta_ns, Ordering::Relaxed);
    }

    /// Sets the time; panics if that would move it backwards (a test bug).
    pub fn set(&self, now_ns: u64) {
        let before = self.now_ns.swap(now_ns, Ordering::Relaxed);
        assert!(
            now_ns >= before,
            "FakeClock moved backwards: {before} -> {now_ns}"
        );
    }
}

impl Clock for FakeClock {
    fn now_ns(&self) -> u64 {
        self.now_ns.load(Ordering::Relaxed)
    }
}

//! The node's clock: nanoseconds since the Unix epoch that never go backwards.
//!
//! Read once at start from the system clock, then advanced by the monotonic clock, so window
//! algorithms align to wall-clock periods while a system clock step can never move `now` back.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use floodgate::Clock;

/// TEST ONLY (`--test-only-clock-skew-ms`): an offset added to every clock built after it is
/// set, so the chaos harness can run one node with a clock off by a known amount. Zero
/// (untouched) in every real deployment.
static TEST_ONLY_SKEW_NS: AtomicI64 = AtomicI64::new(0);

/// TEST ONLY: makes every `NodeClock` built from now on read `skew_ns` ahead (negative: behind).
pub fn set_test_only_skew_ns(skew_ns: i64) {
    TEST_ONLY_SKEW_NS.store(skew_ns, Ordering::Relaxed);
}

#[derive(Debug, Clone, Copy)]
pub struct NodeClock {
    origin: Instant,
    origin_epoch_ns: u64,
}

impl NodeClock {
    pub fn new() -> Self {
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let epoch_ns = u64::try_from(since_epoch.as_nanos()).unwrap_or(0);
        NodeClock {
            origin: Instant::now(),
            origin_epoch_ns: epoch_ns
                .saturating_add_signed(TEST_ONLY_SKEW_NS.load(Ordering::Relaxed)),
        }
    }
}

impl Default for NodeClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for NodeClock {
    fn now_ns(&self) -> u64 {
        // 584 years of uptime before this saturates.
        self.origin_epoch_ns
            + u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX / 2)
    }
}

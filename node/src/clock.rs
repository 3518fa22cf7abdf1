//! The node's clock: nanoseconds since the Unix epoch that never go backwards.
//!
//! Read once at start from the system clock, then advanced by the monotonic clock, so window
//! algorithms align to wall-clock periods while a system clock step can never move `now` back.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use floodgate::Clock;

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
        NodeClock {
            origin: Instant::now(),
            origin_epoch_ns: u64::try_from(since_epoch.as_nanos()).unwrap_or(0),
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

//! The fallback's clock: nanoseconds since the Unix epoch that never go backwards.

use std::time::{SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// Unix time read once at start, then advanced by a monotonic clock: the core's `now_ns` must
/// never go backwards, and the wall clock can (NTP steps). Uses tokio's `Instant` so tests with
/// paused time move the fallback's buckets too.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EpochClock {
    origin_unix_ns: u64,
    origin: Instant,
}

impl EpochClock {
    pub(crate) fn new() -> Self {
        // A clock set before 1970 gives 0: only the origin moves, time still never goes back.
        let origin_unix_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX / 2));
        EpochClock {
            origin_unix_ns,
            origin: Instant::now(),
        }
    }

    pub(crate) fn now_ns(&self) -> u64 {
        // u64 nanoseconds from 1970 last until 2554; saturate rather than wrap past that.
        let elapsed = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.origin_unix_ns.saturating_add(elapsed)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn follows_the_monotonic_clock_from_unix_time() {
        let clock = EpochClock::new();
        let unix_now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let start = clock.now_ns();
        // Within a minute of the wall clock: it is Unix time, not time since boot.
        assert!(start.abs_diff(unix_now.as_nanos() as u64) < 60_000_000_000);
        tokio::time::advance(Duration::from_millis(250)).await;
        assert_eq!(clock.now_ns() - start, 250_000_000);
    }
}

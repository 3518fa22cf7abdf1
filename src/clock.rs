//! Time as the core sees it: nanoseconds from an origin, passed in as `now`. The decision code
//! never reads a clock itself; callers own the clock ([`EpochClock`], the one the node and the
//! client share), and tests use [`FakeClock`].

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

/// Monotonic time elapsed since a fixed start, as a shell reads it: `std::time::Instant` in the
/// node; the client passes tokio's, so tests with paused time move its fallback buckets too.
pub trait Elapsed: Send + Sync {
    fn elapsed_ns(&self) -> u64;
}

impl Elapsed for std::time::Instant {
    fn elapsed_ns(&self) -> u64 {
        u64::try_from(self.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// The shells' clock: nanoseconds since the Unix epoch that never go backwards. Unix time is read
/// once at start, then advanced by a monotonic clock, so window algorithms align to wall-clock
/// periods while a system clock step (NTP) can never move `now` back. The decision code never
/// reads it: the node and the client do, and pass `now` in.
#[derive(Debug, Clone, Copy)]
pub struct EpochClock<E = std::time::Instant> {
    origin_unix_ns: u64,
    since: E,
}

impl EpochClock {
    /// Unix time now, advanced by the standard monotonic clock from here on.
    pub fn start() -> Self {
        EpochClock::starting(std::time::Instant::now())
    }
}

impl<E: Elapsed> EpochClock<E> {
    /// Unix time now, advanced by `since` (which starts now) from here on.
    pub fn starting(since: E) -> Self {
        EpochClock::with_origin(unix_now_ns(), since)
    }

    /// `origin_unix_ns` advanced by `since`.
    pub fn with_origin(origin_unix_ns: u64, since: E) -> Self {
        EpochClock {
            origin_unix_ns,
            since,
        }
    }
}

impl<E: Elapsed> Clock for EpochClock<E> {
    fn now_ns(&self) -> u64 {
        // u64 nanoseconds from 1970 last until 2554; saturate rather than wrap past that.
        self.origin_unix_ns.saturating_add(self.since.elapsed_ns())
    }
}

/// The system clock's Unix time in nanoseconds. A clock set before 1970 gives 0: only the origin
/// moves, time still never goes back.
fn unix_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX / 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A monotonic clock that moves only when told, like `FakeClock`.
    struct Ticks(FakeClock);

    impl Elapsed for Ticks {
        fn elapsed_ns(&self) -> u64 {
            self.0.now_ns()
        }
    }

    #[test]
    fn an_epoch_clock_is_its_origin_advanced_by_the_monotonic_clock() {
        let ticks = FakeClock::new(0);
        let clock = EpochClock::with_origin(1_000, Ticks(ticks.clone()));
        assert_eq!(clock.now_ns(), 1_000);
        ticks.advance(250);
        assert_eq!(clock.now_ns(), 1_250);
        let late = EpochClock::with_origin(u64::MAX - 1, Ticks(FakeClock::new(5)));
        assert_eq!(late.now_ns(), u64::MAX, "saturates instead of wrapping");
    }

    #[test]
    fn a_started_clock_reads_unix_time() {
        let unix = unix_now_ns();
        let now = EpochClock::start().now_ns();
        // Unix time, not time since boot: within a minute of the system clock.
        assert!(now.abs_diff(unix) < 60_000_000_000);
    }
}

//! Reconnect delays: exponential, bounded, with jitter.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use crate::config::BackoffConfig;

/// Delays between reconnect attempts. The base doubles from `initial` up to `max`; each delay is
/// drawn uniformly from [base / 2, base] ("equal jitter"): never less than half the base, so a
/// down node is not hammered, and spread out, so many gateways do not retry in lockstep.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    config: BackoffConfig,
    base: Duration,
}

impl Backoff {
    pub(crate) fn new(config: BackoffConfig) -> Self {
        Backoff {
            config,
            base: config.initial,
        }
    }

    /// The next delay, given a uniformly random `random` (tests pass fixed values).
    pub(crate) fn next_with(&mut self, random: u64) -> Duration {
        let base = self.base;
        self.base = (base * 2).min(self.config.max);
        let half = base / 2;
        // `random % (span + 1)` is uniform enough for jitter; the span is at most a few seconds
        // of nanoseconds, far below 2^64.
        let span = u64::try_from((base - half).as_nanos()).unwrap_or(u64::MAX - 1);
        half + Duration::from_nanos(random % (span + 1))
    }

    /// The next delay with fresh randomness.
    pub(crate) fn next(&mut self) -> Duration {
        self.next_with(random_u64())
    }

    /// After a healthy connection: start again from `initial`.
    pub(crate) fn reset(&mut self) {
        self.base = self.config.initial;
    }
}

/// A random u64 from the standard library's per-hasher random keys (no extra dependency; the
/// quality needed for jitter is low).
fn random_u64() -> u64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(0);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backoff() -> Backoff {
        Backoff::new(BackoffConfig {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(100),
        })
    }

    #[test]
    fn doubles_up_to_the_bound_and_resets() {
        let mut b = backoff();
        // `random = u64::MAX` may land anywhere; 0 gives the lower edge, half the base.
        let lows: Vec<u64> = (0..6).map(|_| b.next_with(0).as_millis() as u64).collect();
        assert_eq!(lows, [5, 10, 20, 40, 50, 50]);
        b.reset();
        assert_eq!(b.next_with(0), Duration::from_millis(5));
    }

    #[test]
    fn jitter_stays_within_half_to_full_base() {
        let mut b = backoff();
        for i in 0..1_000u64 {
            let random = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let delay = b.next_with(random);
            assert!(delay >= Duration::from_millis(5), "{delay:?}");
            assert!(delay <= Duration::from_millis(100), "{delay:?}");
        }
        // The top of the range is reachable.
        let mut b = backoff();
        assert_eq!(b.next_with(5_000_000), Duration::from_millis(10));
    }

    #[test]
    fn fresh_randomness_varies() {
        let mut b = backoff();
        let delays: std::collections::HashSet<_> = (0..20)
            .map(|_| {
                b.reset();
                b.next()
            })
            .collect();
        assert!(delays.len() > 1);
    }
}

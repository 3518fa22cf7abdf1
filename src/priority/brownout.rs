//! The fleet's brownout level for a backend: every gateway reports its own shedding level
//! into the cluster and reads back the fleet's, so the whole fleet sheds the same class at the
//! same time.
//!
//! The cluster needs nothing new for it: level `L` of a backend is one key, counted with a
//! sliding-window counter whose period is [`REPORT_PERIODS`] report intervals. Each round, a
//! gateway at level `l` takes one unit from the keys of levels `0..=l` and peeks (cost 0) at
//! the others, all in one call; each answer's `remaining` tells how many reports that key
//! holds over the last period. The key's owner does the adding, so every gateway reads the
//! same counts. A gateway reports about `REPORT_PERIODS` times per period, so counts are in
//! reports, not gateways; [`fleet_level`] only compares them with each other.

use std::fmt::Write as _;

use crate::limit::{Algorithm, Limit, LimitError};

/// The highest level: 0 sheds nothing, 1 `sheddable`, 2 `default` too (`critical` never).
pub const MAX_LEVEL: u8 = 2;
/// The counting period, in report intervals: long enough that a gateway reporting every
/// interval (give or take some jitter) always has at least one report counted.
pub const REPORT_PERIODS: u64 = 3;
/// Most reports one key counts per period (a fleet of up to about 30,000 gateways).
pub const MAX_REPORTS: u64 = 100_000;
/// Longest backend name.
pub const MAX_BACKEND_BYTES: usize = 64;

/// Reports counted per level: `at_least[l]` reports said level `l` or above (`at_least[0]`:
/// every report).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BrownoutReading {
    pub at_least: [u64; MAX_LEVEL as usize + 1],
}

/// The key level `level` of `backend` is counted in. `None` for a backend name that is empty,
/// longer than [`MAX_BACKEND_BYTES`] or not made of `A-Z a-z 0-9 . _ -`.
pub fn report_key(backend: &str, level: u8) -> Option<Vec<u8>> {
    let valid = !backend.is_empty()
        && backend.len() <= MAX_BACKEND_BYTES
        && backend
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if !valid || level > MAX_LEVEL {
        return None;
    }
    // A rule's key starts with its name, which has no spaces: this one is no rule's.
    let mut key = String::from("floodgate brownout/");
    let _ = write!(key, "{backend}/{level}");
    Some(key.into_bytes())
}

/// The limit every report key is counted under, for reports every `interval_ns`.
pub fn report_limit(interval_ns: u64) -> Result<Limit, LimitError> {
    Limit::window(
        Algorithm::SlidingWindow,
        MAX_REPORTS,
        interval_ns.saturating_mul(REPORT_PERIODS),
    )
}

/// The fleet's level: the highest level that at least `quorum_bp` (basis points) of the
/// reports are at or above; 0 when nobody reports.
pub fn fleet_level(reading: &BrownoutReading, quorum_bp: u32) -> u8 {
    let all = u128::from(reading.at_least[0]);
    (1..=MAX_LEVEL)
        .rev()
        .find(|&level| {
            let at = u128::from(reading.at_least[usize::from(level)]);
            at > 0 && at * 10_000 >= all * u128::from(quorum_bp)
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Half the reports at level 2 or above bring the fleet to level 2; fewer do not, but may
    /// be enough for level 1.
    #[test]
    fn the_fleet_follows_the_quorum_of_reports() {
        let reading = |at_least| BrownoutReading { at_least };
        assert_eq!(fleet_level(&reading([0, 0, 0]), 5_000), 0);
        assert_eq!(fleet_level(&reading([6, 3, 3]), 5_000), 2);
        assert_eq!(fleet_level(&reading([6, 3, 2]), 5_000), 1);
        assert_eq!(fleet_level(&reading([6, 2, 1]), 5_000), 0);
        // A quorum of nothing: any report of a level brings the fleet to it.
        assert_eq!(fleet_level(&reading([600, 0, 1]), 0), 2);
    }

    /// Keys are per backend and level, apart from every rule's, and refuse odd names.
    #[test]
    fn report_keys_name_backend_and_level() {
        let key = report_key("demo", 1).unwrap();
        assert_eq!(key, b"floodgate brownout/demo/1");
        assert_ne!(report_key("demo", 0), report_key("demo", 1));
        assert_eq!(report_key("demo", 3), None);
        assert_eq!(report_key("", 0), None);
        assert_eq!(report_key("a b", 0), None);
        assert_eq!(report_key(&"x".repeat(65), 0), None);
    }

    /// One gateway reporting every interval always has a report counted, through the window
    /// boundaries of the sliding counter (at any phase and a jitter of up to half an
    /// interval).
    #[test]
    fn a_steady_reporter_is_always_counted() {
        let interval = 100_000_000;
        let limit = report_limit(interval).unwrap();
        for phase in [0, 1, interval / 3, interval - 1] {
            let mut state = crate::algorithm::WindowState::default();
            let mut at = phase;
            for round in 0..40u64 {
                let jitter = if round % 3 == 0 { interval / 2 } else { 0 };
                let next = at + interval + jitter;
                if round > 2 {
                    // Just before the next report: the earlier ones still count.
                    let (peek, _) =
                        crate::algorithm::sliding_window::decide(&limit, &state, next - 1, 0);
                    let counted = MAX_REPORTS - peek.remaining();
                    assert!(counted >= 1, "phase {phase} round {round}");
                }
                at = next;
                let (decision, new) =
                    crate::algorithm::sliding_window::decide(&limit, &state, at, 1);
                state = new.unwrap();
                assert!(decision.is_allowed());
            }
        }
    }
}

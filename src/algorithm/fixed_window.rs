//! Fixed window: at most `limit` units in each window `[k * period, (k + 1) * period)`.
//!
//! Windows are aligned to multiples of the period from the time origin, so with wall-clock-based
//! time a per-minute window is a calendar minute. Twice the limit can pass around a boundary.

use super::WindowState;
use crate::{Decision, Limit};

/// Decides `cost` against `state`; returns the new state to store when something was consumed.
pub fn decide(
    limit: &Limit,
    state: &WindowState,
    now_ns: u64,
    cost: u64,
) -> (Decision, Option<WindowState>) {
    let cap = limit.burst();
    if cost > cap {
        return (Decision::CostExceedsBurst { burst: cap }, None);
    }
    let period = limit.period_ns();
    // Normalised to now's window; a stored window ahead of `now` (state rebased from another
    // period, or a clock that stepped back) keeps counting in now's window: conservative, and
    // no wait exceeds one period.
    let WindowState { window, count, .. } = state.rebase(period, period, now_ns);
    // window * period <= now_ns < (window + 1) * period; the end fits as periods are bounded.
    let until_end = (window * period).saturating_add(period) - now_ns;
    if count.saturating_add(cost) <= cap {
        let used = count + cost;
        let decision = Decision::Allowed {
            remaining: cap - used,
            reset_after_ns: if used > 0 { until_end } else { 0 },
        };
        let new = (cost > 0).then_some(WindowState {
            window,
            count: used,
            previous: 0,
        });
        (decision, new)
    } else {
        let decision = Decision::Denied {
            // A count over the limit (the limit was lowered) denies; nothing remains.
            remaining: cap.saturating_sub(count),
            retry_after_ns: until_end,
            reset_after_ns: until_end,
        };
        (decision, None)
    }
}

/// True once the stored window has ended: a new window starts empty anyway.
pub fn is_expired(limit: &Limit, state: &WindowState, now_ns: u64) -> bool {
    now_ns / limit.period_ns() > state.window
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Algorithm, NANOS_PER_SEC as S};

    /// A window counted at `3/s` and then read at `3/min` is rebased, not misread as a window
    /// far ahead: the wait stays within the new period.
    #[test]
    fn a_window_from_a_shorter_period_is_rebased_not_misread() {
        let per_second = Limit::window(Algorithm::FixedWindow, 3, S).unwrap();
        let per_minute = Limit::window(Algorithm::FixedWindow, 3, 60 * S).unwrap();
        let now = 1_700_000_000 * S + 123;
        let mut state = WindowState::default();
        for _ in 0..3 {
            state = decide(&per_second, &state, now, 1).1.unwrap();
        }
        let rebased = state.rebase(S, 60 * S, now);
        let (decision, _) = decide(&per_minute, &rebased, now, 1);
        let retry = decision.retry_after_ns().unwrap();
        assert!(!decision.is_allowed());
        assert!(retry <= 60 * S, "{decision:?}");
        // Even unrebased, a stored window ahead of now never waits past the period.
        let (decision, _) = decide(&per_minute, &state, now, 1);
        assert!(decision.retry_after_ns().unwrap() <= 60 * S, "{decision:?}");
        assert!(decide(&per_minute, &rebased, now + retry, 1).0.is_allowed());
    }
}

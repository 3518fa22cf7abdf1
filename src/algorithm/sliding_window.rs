//! Sliding-window counter (as Cloudflare describes it): the count of the current window plus the
//! previous window's count weighted by how much of it still overlaps the trailing period.
//!
//! `used = floor(previous * (period - elapsed) / period) + current`; a cost `c` passes when
//! `used + c <= limit`. Flooring the weighted part keeps the arithmetic exact in integers.

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
    // period, or a clock that stepped back) counts as now's: conservative, and no wait exceeds
    // two periods (the current window's count weighs until the end of the next one).
    let rebased = state.rebase(period, period, now_ns);
    let (window, previous, current) = (rebased.window, rebased.previous, rebased.count);
    // window * period <= now_ns < (window + 1) * period.
    let elapsed = now_ns - window * period;
    let used = weighted(previous, elapsed, period).saturating_add(current);
    if used.saturating_add(cost) <= cap {
        let new_current = current + cost; // <= used + cost <= cap
        let reset_after_ns = if new_current > 0 {
            2 * period - elapsed
        } else if previous > 0 {
            period - elapsed
        } else {
            0
        };
        let decision = Decision::Allowed {
            remaining: cap - used - cost,
            reset_after_ns,
        };
        let new = (cost > 0).then_some(WindowState {
            window,
            count: new_current,
            previous,
        });
        (decision, new)
    } else {
        // Offsets from the window's start, each at most two periods (cannot overflow: periods
        // are bounded far below u64::MAX / 4).
        let retry_offset = if current.saturating_add(cost) <= cap {
            // Still in this window: wait until the previous window's weight has fallen enough.
            first_offset_at_most(previous, cap - current - cost, period)
        } else {
            // Only the next window can help: the current count becomes the weighted part.
            period + first_offset_at_most(current, cap - cost, period)
        };
        let reset_offset = if current > 0 { 2 * period } else { period };
        let decision = Decision::Denied {
            remaining: cap.saturating_sub(used),
            retry_after_ns: retry_offset - elapsed,
            reset_after_ns: reset_offset - elapsed,
        };
        (decision, None)
    }
}

/// `floor(count * (period - elapsed) / period)`, the previous window's weighted share.
pub(crate) fn weighted(count: u64, elapsed: u64, period: u64) -> u64 {
    let share = u128::from(count) * u128::from(period - elapsed) / u128::from(period);
    // share <= count, so it fits.
    share as u64
}

/// The smallest elapsed time `e` in `[0, period]` with `weighted(count, e, period) <= target`.
fn first_offset_at_most(count: u64, target: u64, period: u64) -> u64 {
    if count == 0 {
        return 0;
    }
    // weighted <= target  <=>  count * (period - e) <= (target + 1) * period - 1
    let most_overlap = (u128::from(target) + 1) * u128::from(period) - 1;
    let overlap = (most_overlap / u128::from(count)).min(u128::from(period));
    // overlap <= period, so it fits.
    period - overlap as u64
}

/// True once neither the stored window nor the one before it can weigh anything.
pub fn is_expired(limit: &Limit, state: &WindowState, now_ns: u64) -> bool {
    now_ns / limit.period_ns() >= state.window.saturating_add(2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Algorithm, NANOS_PER_SEC as S};

    /// Retry times are exact: checked against a brute-force scan at nanosecond precision.
    #[test]
    fn retry_after_matches_a_scan() {
        let l = Limit::window(Algorithm::SlidingWindow, 10, 1_000_000).unwrap();
        let state = WindowState {
            window: 5,
            count: 7,
            previous: 6,
        };
        for now in [5_000_000, 5_300_000, 5_999_999] {
            for cost in 1..=10 {
                let (d, _) = decide(&l, &state, now, cost);
                if let Decision::Denied { retry_after_ns, .. } = d {
                    assert!(
                        decide(&l, &state, now + retry_after_ns, cost)
                            .0
                            .is_allowed()
                    );
                    assert!(
                        !decide(&l, &state, now + retry_after_ns - 1, cost)
                            .0
                            .is_allowed()
                    );
                }
            }
        }
        let _ = S;
    }
}

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
    // A stored window ahead of `now` (a clock that stepped back): decide as at its start.
    let now = now_ns.max(state.window * period);
    let skew = now - now_ns;
    let window = now / period;
    let start = window * period;
    let (previous, current) = match window - state.window {
        0 => (state.previous, state.count),
        1 => (state.count, 0),
        _ => (0, 0),
    };
    let used = weighted(previous, now - start, period) + current;
    if used + cost <= cap {
        let new_current = current + cost;
        let reset_at = if new_current > 0 {
            start + 2 * period
        } else if previous > 0 {
            start + period
        } else {
            now
        };
        let decision = Decision::Allowed {
            remaining: cap - used - cost,
            reset_after_ns: reset_at - now + skew,
        };
        let new = (cost > 0).then_some(WindowState {
            window,
            count: new_current,
            previous,
        });
        (decision, new)
    } else {
        let retry_at = if current + cost <= cap {
            // Still in this window: wait until the previous window's weight has fallen enough.
            start + first_offset_at_most(previous, cap - current - cost, period)
        } else {
            // Only the next window can help: the current count becomes the weighted part.
            start + period + first_offset_at_most(current, cap - cost, period)
        };
        let reset_at = if current > 0 {
            start + 2 * period
        } else {
            start + period
        };
        let decision = Decision::Denied {
            remaining: cap.saturating_sub(used),
            retry_after_ns: retry_at - now + skew,
            reset_after_ns: reset_at - now + skew,
        };
        (decision, None)
    }
}

/// `floor(count * (period - elapsed) / period)`, the previous window's weighted share.
fn weighted(count: u64, elapsed: u64, period: u64) -> u64 {
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
    now_ns / limit.period_ns() >= state.window + 2
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

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
    // A stored window ahead of `now` (a clock that stepped back) keeps counting: conservative.
    let window = (now_ns / period).max(state.window);
    let count = if state.window == window {
        state.count
    } else {
        0
    };
    let until_end = (window + 1) * period - now_ns.min((window + 1) * period);
    if count + cost <= cap {
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

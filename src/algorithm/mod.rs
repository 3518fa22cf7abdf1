//! The four algorithms, each a pure function of `(limit, state, now, cost)`.
//!
//! None of them reads a clock or touches shared memory; the bucket store owns the state and
//! decides how it is updated concurrently.

pub mod fixed_window;
pub mod gcra;
mod log_times;
pub mod sliding_log;
pub mod sliding_window;

pub use sliding_log::SlidingLog;

/// State of a window algorithm (fixed or sliding counter): the index of the current window
/// (`now / period`) and the units admitted in it and in the window before.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowState {
    pub window: u64,
    pub count: u64,
    pub previous: u64,
}

impl WindowState {
    /// Combines two copies of one bucket (a replica and the owner's state), both counted in
    /// windows of the same period: per window, the larger count, so merging never loosens the
    /// limit.
    pub fn merge(self, other: WindowState) -> WindowState {
        let (older, newer) = if self.window <= other.window {
            (self, other)
        } else {
            (other, self)
        };
        // `older.window <= newer.window`, so the difference cannot underflow.
        match newer.window - older.window {
            0 => WindowState {
                window: newer.window,
                count: older.count.max(newer.count),
                previous: older.previous.max(newer.previous),
            },
            1 => WindowState {
                previous: newer.previous.max(older.count),
                ..newer
            },
            _ => newer,
        }
    }

    /// Takes `cost` units after the fact (a metered charge) into now's window, never refused:
    /// the count may pass the limit, which denies until the window's units stop weighing (the
    /// window's end for a fixed window; as the window slides out of the trailing period for a
    /// sliding one). What a window counts (a sliding window: with the previous window's
    /// weighted share) is at most twice its limit (one limit owed); units beyond that are
    /// forgiven. Returns the new state and the units forgiven.
    pub fn charge(self, limit: &crate::Limit, now_ns: u64, cost: u64) -> (WindowState, u64) {
        let period = limit.period_ns();
        let mut state = self.rebase(period, period, now_ns);
        let most = limit.burst().saturating_mul(2);
        let weighing = match limit.algorithm() {
            // window * period <= now < (window + 1) * period after the rebase.
            crate::Algorithm::SlidingWindow => {
                sliding_window::weighted(state.previous, now_ns - state.window * period, period)
            }
            _ => 0,
        };
        let counted = state.count.saturating_add(weighing);
        let taken = cost.min(most.saturating_sub(counted));
        state.count = state.count.saturating_add(taken);
        (state, cost - taken)
    }

    /// This state, counted in windows of `stored_period`, as the current and previous windows
    /// at `now_ns` in windows of `period`.
    ///
    /// Window indices count periods from the time origin, so an index read under another period
    /// names another span of time (a key used at `3/s` then checked at `3/min` would otherwise
    /// look like a window far in the future). Each stored count is moved, by absolute time, to
    /// the newest window now that its old window overlaps: the current one (also when the old
    /// window lies ahead of `now`), else the previous one; a count whose window overlaps
    /// neither is dropped, as it can no longer weigh in. So no admission that may still lie in
    /// the trailing period is forgotten, and the result always has `window == now / period`,
    /// which bounds every wait computed from it by the new period. With equal periods this is
    /// the usual roll-over. Saturating throughout: stored or received state cannot overflow it.
    pub fn rebase(self, stored_period: u64, period: u64, now_ns: u64) -> WindowState {
        let window = now_ns / period;
        // window * period <= now_ns: no overflow.
        let current_start = window * period;
        let previous_start = current_start.checked_sub(period);
        let mut rebased = WindowState {
            window,
            count: 0,
            previous: 0,
        };
        let stored = [
            (Some(self.window), self.count),
            (self.window.checked_sub(1), self.previous),
        ];
        for (index, count) in stored {
            let Some(index) = index else { continue };
            if count == 0 {
                continue;
            }
            let end = index.saturating_add(1).saturating_mul(stored_period.max(1));
            if end > current_start {
                rebased.count = rebased.count.saturating_add(count);
            } else if previous_start.is_some_and(|start| end > start) {
                rebased.previous = rebased.previous.saturating_add(count);
            }
        }
        rebased
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn state(window: u64, count: u64, previous: u64) -> WindowState {
        WindowState {
            window,
            count,
            previous,
        }
    }

    #[test]
    fn rebase_within_one_period_is_the_usual_roll_over() {
        let stored = state(10, 3, 2);
        assert_eq!(stored.rebase(S, S, 10 * S + 5), stored);
        assert_eq!(stored.rebase(S, S, 11 * S), state(11, 0, 3));
        assert_eq!(stored.rebase(S, S, 12 * S), state(12, 0, 0));
        // A window ahead of now (a clock that stepped back) counts in now's window.
        assert_eq!(stored.rebase(S, S, 9 * S), state(9, 5, 0));
        assert_eq!(state(0, 1, 7).rebase(S, S, 0), state(0, 1, 0));
    }

    #[test]
    fn rebase_to_another_period_moves_counts_by_absolute_time() {
        let now = 1_700_000_000 * S + 30 * S;
        // Per second, this second and the one before: both inside the current minute.
        let per_second = state(now / S, 3, 2);
        assert_eq!(
            per_second.rebase(S, 60 * S, now),
            state(now / (60 * S), 5, 0)
        );
        // Per minute, the minute before: inside neither this second nor the one before.
        let per_minute = state(now / (60 * S) - 1, 3, 0);
        assert_eq!(per_minute.rebase(60 * S, S, now), state(now / S, 0, 0));
        // Per minute, this minute: counts in the current second (its admissions may be that
        // recent), and one minute's window ending right at this second's start goes to previous.
        let this_minute = state(now / (60 * S), 3, 4);
        assert_eq!(this_minute.rebase(60 * S, S, now), state(now / S, 3, 0));
        let minute_start = now / (60 * S) * 60 * S;
        assert_eq!(
            this_minute.rebase(60 * S, S, minute_start),
            state(minute_start / S, 3, 4)
        );
    }

    /// A charge lands in now's window past the limit, up to twice it; a fixed window denies
    /// until its end, a sliding one until the owed units have slid far enough out.
    #[test]
    fn a_window_charge_owes_up_to_one_limit() {
        use crate::{Algorithm, Limit};
        let fixed = Limit::window(Algorithm::FixedWindow, 10, S).unwrap();
        let sliding = Limit::window(Algorithm::SlidingWindow, 10, S).unwrap();
        let now = 7 * S + S / 4;
        let (state, forgiven) = state(7, 6, 0).charge(&fixed, now, 9);
        assert_eq!((state, forgiven), (self::state(7, 15, 0), 0));
        let (d, _) = fixed_window::decide(&fixed, &state, now, 0);
        assert_eq!(d.retry_after_ns(), Some(3 * S / 4));
        assert!(
            fixed_window::decide(&fixed, &state, 8 * S, 1)
                .0
                .is_allowed()
        );
        let (full, forgiven) = state.charge(&fixed, now, 9);
        assert_eq!((full, forgiven), (self::state(7, 20, 0), 4));
        // Sliding: 15 in window 7 still weigh floor(15 * (1 - e)) in window 8; one unit passes
        // once that is at most 9, a third of the way into it.
        let (state, _) = WindowState::default().charge(&sliding, now, 15);
        let (d, _) = sliding_window::decide(&sliding, &state, now, 1);
        let wait = d.retry_after_ns().unwrap();
        assert_eq!(now + wait, 8 * S + S / 3 + 1);
        assert!(
            !sliding_window::decide(&sliding, &state, now + wait - 1, 1)
                .0
                .is_allowed()
        );
        assert!(
            sliding_window::decide(&sliding, &state, now + wait, 1)
                .0
                .is_allowed()
        );
        // A quarter into the next window, 15 still weigh 11: a charge takes at most 9 more.
        let next = 8 * S + S / 4;
        let (owing, forgiven) = state.charge(&sliding, next, 30);
        assert_eq!((owing.count, owing.previous, forgiven), (9, 15, 21));
    }

    #[test]
    fn rebase_saturates_on_any_stored_state() {
        let hostile = state(u64::MAX, u64::MAX, u64::MAX);
        let rebased = hostile.rebase(u64::MAX, S, 5 * S);
        assert_eq!(rebased, state(5, u64::MAX, 0));
        let merged = hostile.merge(state(0, 1, 1));
        assert_eq!(merged, hostile);
    }
}

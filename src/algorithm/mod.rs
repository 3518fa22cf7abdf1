//! The four algorithms, each a pure function of `(limit, state, now, cost)`.
//!
//! None of them reads a clock or touches shared memory; the bucket store owns the state and
//! decides how it is updated concurrently.

pub mod fixed_window;
pub mod gcra;
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

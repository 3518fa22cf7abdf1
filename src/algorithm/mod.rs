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
    /// Combines two copies of one bucket (a replica and the owner's state): per window, the
    /// larger count, so merging never loosens the limit.
    pub fn merge(self, other: WindowState) -> WindowState {
        let (older, newer) = if self.window <= other.window {
            (self, other)
        } else {
            (other, self)
        };
        if older.window == newer.window {
            WindowState {
                window: newer.window,
                count: older.count.max(newer.count),
                previous: older.previous.max(newer.previous),
            }
        } else if older.window + 1 == newer.window {
            WindowState {
                previous: newer.previous.max(older.count),
                ..newer
            }
        } else {
            newer
        }
    }
}

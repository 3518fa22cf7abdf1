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

//! A bucket as replicated, handed over or snapshotted ([`BucketState`]): read from a live entry,
//! and, when received, made safe to decide with.

use std::sync::atomic::Ordering;

use super::entries::{LogEntry, WindowEntry, window_is_expired};
use super::table::{GcraEntry, MAX_MARGIN_MS};
use crate::algorithm::WindowState;
use crate::limit::MAX_CAPACITY_NS;
use crate::{Algorithm, BucketKey, Limit, MAX_PERIOD_NS};

/// A bucket as replicated or handed over between nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketState {
    pub key: BucketKey,
    pub value: BucketValue,
}

/// The state of one bucket, by algorithm family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BucketValue {
    Gcra {
        tat_ns: u64,
        /// See `GcraEntry::meta`: how far the TAT may run ahead while a cost of 1 still passes.
        margin_ms: u32,
    },
    /// A fixed or sliding window (the limit says which).
    Window { limit: Limit, state: WindowState },
    /// A sliding log: its admission times, oldest first.
    Log { limit: Limit, times_ns: Vec<u64> },
}

impl BucketValue {
    /// The algorithm whose table holds the bucket (a log's or window's own; GCRA's).
    pub fn algorithm(&self) -> Algorithm {
        match self {
            BucketValue::Gcra { .. } => Algorithm::Gcra,
            BucketValue::Window { limit, .. } | BucketValue::Log { limit, .. } => limit.algorithm(),
        }
    }
}

/// A received window state made safe to decide with under `limit` (the limit it was sent
/// with): no window after `now`'s and no count above the limit (a peer with other rules, or a
/// hostile one, cannot make the arithmetic overflow; a count clamped to the limit only denies).
pub(super) fn plausible_window(limit: &Limit, state: &WindowState, now_ns: u64) -> WindowState {
    // A window may hold up to twice its limit: a metered charge's debt.
    let cap = limit.burst().saturating_mul(2);
    WindowState {
        window: state.window.min(now_ns / limit.period_ns()),
        count: state.count.min(cap),
        previous: state.previous.min(cap),
    }
}

/// A received GCRA TAT bounded by what any limit with the claimed eviction margin allows. The
/// store keeps no limit with a GCRA bucket, so this is the tightest bound available here:
/// `margin = (burst - 1) * interval` rounded down to whole ms and `interval <= period <=
/// MAX_PERIOD_NS`, so a genuine TAT is less than `now + margin + 1 ms + MAX_PERIOD_NS` ahead (a
/// margin that saturated its field bounds nothing: then only the largest capacity a limit can
/// have), and a bucket may owe one more capacity (a metered charge's debt), so twice that.
/// The next check clamps it further, to what that key's own limit may owe (`gcra::decide`).
pub(super) fn plausible_tat(tat_ns: u64, margin_ms: u32, now_ns: u64) -> u64 {
    let most_ahead = if margin_ms < MAX_MARGIN_MS {
        2 * ((u64::from(margin_ms) + 1) * 1_000_000 + MAX_PERIOD_NS)
    } else {
        2 * MAX_CAPACITY_NS
    };
    tat_ns.min(now_ns.saturating_add(most_ahead))
}

/// A GCRA bucket's state, if it is still in use at `now`.
pub(super) fn gcra_state(entry: &GcraEntry, now_ns: u64) -> Option<BucketState> {
    let tat_ns = entry.tat_ns.load(Ordering::Relaxed);
    (tat_ns > now_ns).then(|| BucketState {
        key: entry.key(),
        value: BucketValue::Gcra {
            tat_ns,
            margin_ms: entry.margin_ms(),
        },
    })
}

impl WindowEntry {
    /// The bucket's state, if it is still in use at `now`.
    pub(super) fn state(&self, now_ns: u64) -> Option<BucketState> {
        let (limit, state) = *self.slot.lock();
        let limit = limit.limit();
        (!window_is_expired(&limit, &state, now_ns)).then(|| BucketState {
            key: BucketKey::of(self),
            value: BucketValue::Window { limit, state },
        })
    }
}

impl LogEntry {
    /// The bucket's state, if it is still in use at `now`.
    pub(super) fn state(&self, now_ns: u64) -> Option<BucketState> {
        let slot = self.slot.lock();
        let (limit, log) = (slot.0.limit(), &slot.1);
        (!log.is_expired(&limit, now_ns)).then(|| BucketState {
            key: BucketKey::of(self),
            value: BucketValue::Log {
                limit,
                times_ns: log.times().collect(),
            },
        })
    }
}

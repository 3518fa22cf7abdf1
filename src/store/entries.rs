//! The window and log buckets as a shard's tables hold them, what expiry and eviction read of
//! any bucket, whatever its family ([`Identified`]), and its changed mark ([`Dirty`]).

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use super::table::{GcraEntry, Keyed, KeyedTable, Standing, Use, margin_ms_of};
use crate::algorithm::{SlidingLog, WindowState, fixed_window, sliding_window};
use crate::limit::PackedLimit;
use crate::{Algorithm, BucketKey, Decision, Limit};

/// A fixed- or sliding-window bucket: 64 bytes. The small mutex is uncontended except on one hot
/// key.
#[derive(Debug)]
pub(super) struct WindowEntry {
    pub(super) hash: u64,
    pub(super) check: u32,
    pub(super) slot: Mutex<(PackedLimit, WindowState)>,
    /// Changed since the last replication round; set only through [`Dirty`] (see `changed.rs`).
    dirty: AtomicBool,
    /// Consumed from since eviction last looked at the shard.
    pub(super) used: AtomicBool,
    /// Where it stands with eviction passes (changed only under the exclusive lock).
    pub(super) standing: Standing,
}

/// A sliding-log bucket (at most `SLIDING_LOG_MAX_LIMIT` timestamps).
#[derive(Debug)]
pub(super) struct LogEntry {
    pub(super) hash: u64,
    pub(super) check: u32,
    pub(super) slot: Mutex<(PackedLimit, SlidingLog)>,
    /// Changed since the last replication round; set only through [`Dirty`] (see `changed.rs`).
    dirty: AtomicBool,
    /// Consumed from since eviction last looked at the shard.
    pub(super) used: AtomicBool,
    /// Where it stands with eviction passes (changed only under the exclusive lock).
    pub(super) standing: Standing,
}

impl WindowEntry {
    pub(super) fn new(key: BucketKey, limit: PackedLimit, state: WindowState, dirty: bool) -> Self {
        WindowEntry {
            hash: key.hash,
            check: key.check,
            slot: Mutex::new((limit, state)),
            dirty: AtomicBool::new(dirty),
            used: AtomicBool::new(false),
            standing: Standing::Unseen,
        }
    }

    /// Its limit and state, for expiry and eviction (under the shard's exclusive lock).
    fn window(&mut self) -> (Limit, &WindowState) {
        let (limit, state) = self.slot.get_mut();
        (limit.limit(), state)
    }
}

impl Default for WindowEntry {
    /// The empty slot of a window table (hash 0: no bucket).
    fn default() -> Self {
        WindowEntry::new(
            BucketKey { hash: 0, check: 0 },
            PackedLimit::EMPTY_SLOT,
            WindowState::default(),
            false,
        )
    }
}

/// The fixed- and sliding-window buckets of a shard, in their slots as GCRA buckets are (one
/// cache miss a cold key, prefetched a burst ahead like them).
pub(super) type WindowTable = KeyedTable<WindowEntry>;

impl Default for LogEntry {
    /// The empty slot of a log table (hash 0: no bucket); its empty log holds no allocation.
    fn default() -> Self {
        LogEntry::new(
            BucketKey { hash: 0, check: 0 },
            PackedLimit::EMPTY_SLOT,
            SlidingLog::default(),
            false,
        )
    }
}

/// The sliding-log buckets of a shard, in their slots as the others are: the entry, with its first
/// few times, is found in one cache miss and prefetched a burst ahead; more times lie behind it on
/// the heap.
pub(super) type LogTable = KeyedTable<LogEntry>;

impl LogEntry {
    pub(super) fn new(key: BucketKey, limit: PackedLimit, log: SlidingLog, dirty: bool) -> Self {
        LogEntry {
            hash: key.hash,
            check: key.check,
            slot: Mutex::new((limit, log)),
            dirty: AtomicBool::new(dirty),
            used: AtomicBool::new(false),
            standing: Standing::Unseen,
        }
    }

    /// Its limit and log, for expiry and eviction (under the shard's exclusive lock).
    fn log(&mut self) -> (Limit, &SlidingLog) {
        let (limit, log) = self.slot.get_mut();
        (limit.limit(), log)
    }
}

/// Which of a shard's tables holds a bucket: one key may have a bucket in each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Family {
    Gcra,
    Window,
    Log,
}

/// A bucket with a changed mark, of any family.
pub(super) trait Dirty: Identified {
    const FAMILY: Family;
    /// Sets the mark; true when it was clear (the key must then be listed).
    #[must_use = "a bucket newly marked must be listed: use Shard::mark_dirty"]
    fn set_dirty(&self) -> bool;
    /// Clears the mark; true if it was set.
    fn take_dirty(&self) -> bool;
    fn is_dirty(&self) -> bool;
}

impl Dirty for GcraEntry {
    const FAMILY: Family = Family::Gcra;
    fn set_dirty(&self) -> bool {
        self.mark_dirty()
    }
    fn take_dirty(&self) -> bool {
        GcraEntry::take_dirty(self)
    }
    fn is_dirty(&self) -> bool {
        GcraEntry::is_dirty(self)
    }
}

/// [`Dirty::set_dirty`] of a mark kept as an `AtomicBool`. The load first keeps an
/// already-marked hot bucket's cache line shared.
fn set_flag(flag: &AtomicBool) -> bool {
    !flag.load(Ordering::Relaxed) && !flag.swap(true, Ordering::Relaxed)
}

/// [`Dirty::take_dirty`] of a mark kept as an `AtomicBool`.
fn take_flag(flag: &AtomicBool) -> bool {
    flag.load(Ordering::Relaxed) && flag.swap(false, Ordering::Relaxed)
}

impl Dirty for WindowEntry {
    const FAMILY: Family = Family::Window;
    fn set_dirty(&self) -> bool {
        set_flag(&self.dirty)
    }
    fn take_dirty(&self) -> bool {
        take_flag(&self.dirty)
    }
    fn is_dirty(&self) -> bool {
        self.dirty.load(Ordering::Relaxed)
    }
}

impl Dirty for LogEntry {
    const FAMILY: Family = Family::Log;
    fn set_dirty(&self) -> bool {
        set_flag(&self.dirty)
    }
    fn take_dirty(&self) -> bool {
        take_flag(&self.dirty)
    }
    fn is_dirty(&self) -> bool {
        self.dirty.load(Ordering::Relaxed)
    }
}

impl BucketKey {
    pub(super) fn of(entry: &impl Identified) -> BucketKey {
        BucketKey {
            hash: entry.hash(),
            check: entry.check(),
        }
    }
}

pub(super) fn margin_ns(limit: &Limit) -> u64 {
    (limit.burst() - 1) * limit.interval_ns()
}

#[inline]
pub(super) fn margin_ms(limit: &Limit) -> u32 {
    margin_ms_of(margin_ns(limit))
}

/// True when a window bucket is full again (expiry, not a decision).
pub(super) fn window_is_expired(limit: &Limit, state: &WindowState, now_ns: u64) -> bool {
    match limit.algorithm() {
        Algorithm::SlidingWindow => sliding_window::is_expired(limit, state, now_ns),
        _ => fixed_window::is_expired(limit, state, now_ns),
    }
}

pub(super) fn decide_window(
    limit: &Limit,
    state: &WindowState,
    now_ns: u64,
    cost: u64,
) -> (Decision, Option<WindowState>) {
    match limit.algorithm() {
        Algorithm::SlidingWindow => sliding_window::decide(limit, state, now_ns, cost),
        _ => fixed_window::decide(limit, state, now_ns, cost),
    }
}

/// What expiry and eviction need to know of any bucket.
pub(super) trait Identified: Keyed {
    /// Time until the bucket is full again (0 = expired).
    fn expires_in(&mut self, now_ns: u64) -> u64;
    /// True when a cost of 1 would be denied now: such a bucket must not be evicted.
    fn is_denying(&mut self, now_ns: u64) -> bool;
    /// The share of the bucket's capacity consumed now, in millionths.
    fn consumed_ppm(&mut self, now_ns: u64) -> u32;
    fn is_expired(&mut self, now_ns: u64) -> bool {
        self.expires_in(now_ns) == 0
    }
    /// How the bucket was used since eviction last looked, moving it on ([`Use`]).
    fn take_use(&mut self, first_pass: bool) -> Use;
}

/// [`Identified::take_use`] for an entry with a `used` mark and a [`Standing`].
fn take_use(used: &mut AtomicBool, standing: &mut Standing, first_pass: bool) -> Use {
    let seen;
    (seen, *standing) = Use::at_pass(std::mem::take(used.get_mut()), *standing, first_pass);
    seen
}

impl Identified for GcraEntry {
    fn expires_in(&mut self, now_ns: u64) -> u64 {
        self.tat_ns.get_mut().saturating_sub(now_ns)
    }
    fn is_denying(&mut self, now_ns: u64) -> bool {
        self.expires_in(now_ns) > u64::from(self.margin_ms()) * 1_000_000
    }
    fn consumed_ppm(&mut self, now_ns: u64) -> u32 {
        // The entry keeps no limit, only its margin ((burst - 1) intervals): the TAT's lead over
        // it is the consumed share, slightly high by one interval (a non-denying bucket's lead
        // is within its margin).
        let margin_ns = u64::from(self.margin_ms()) * 1_000_000;
        ppm(self.expires_in(now_ns), margin_ns)
    }
    fn take_use(&mut self, first_pass: bool) -> Use {
        GcraEntry::take_use(self, first_pass)
    }
}

impl Keyed for WindowEntry {
    fn hash(&self) -> u64 {
        self.hash
    }
    fn check(&self) -> u32 {
        self.check
    }
}

impl Identified for WindowEntry {
    fn expires_in(&mut self, now_ns: u64) -> u64 {
        let (limit, state) = self.window();
        if window_is_expired(&limit, state, now_ns) {
            0
        } else {
            decide_window(&limit, state, now_ns, 0)
                .0
                .reset_after_ns()
                .max(1)
        }
    }
    fn is_expired(&mut self, now_ns: u64) -> bool {
        let (limit, state) = self.window();
        window_is_expired(&limit, state, now_ns)
    }
    fn is_denying(&mut self, now_ns: u64) -> bool {
        let (limit, state) = self.window();
        !decide_window(&limit, state, now_ns, 1).0.is_allowed()
    }
    fn consumed_ppm(&mut self, now_ns: u64) -> u32 {
        let (limit, state) = self.window();
        let remaining = decide_window(&limit, state, now_ns, 0).0.remaining();
        ppm(limit.burst().saturating_sub(remaining), limit.burst())
    }
    fn take_use(&mut self, first_pass: bool) -> Use {
        take_use(&mut self.used, &mut self.standing, first_pass)
    }
}

impl Keyed for LogEntry {
    fn hash(&self) -> u64 {
        self.hash
    }
    fn check(&self) -> u32 {
        self.check
    }
}

impl Identified for LogEntry {
    fn expires_in(&mut self, now_ns: u64) -> u64 {
        let (limit, log) = self.log();
        if log.is_expired(&limit, now_ns) {
            0
        } else {
            log.clone()
                .decide(&limit, now_ns, 0)
                .reset_after_ns()
                .max(1)
        }
    }
    fn is_expired(&mut self, now_ns: u64) -> bool {
        let (limit, log) = self.log();
        log.is_expired(&limit, now_ns)
    }
    fn is_denying(&mut self, now_ns: u64) -> bool {
        let (limit, log) = self.log();
        !log.clone().decide(&limit, now_ns, 1).is_allowed()
    }
    fn consumed_ppm(&mut self, now_ns: u64) -> u32 {
        let (limit, log) = self.log();
        let remaining = log.clone().decide(&limit, now_ns, 0).remaining();
        ppm(limit.burst().saturating_sub(remaining), limit.burst())
    }
    fn take_use(&mut self, first_pass: bool) -> Use {
        take_use(&mut self.used, &mut self.standing, first_pass)
    }
}

/// `used / capacity` in millionths, at most a million.
pub(super) fn ppm(used: u64, capacity: u64) -> u32 {
    let share = u128::from(used.min(capacity)) * 1_000_000 / u128::from(capacity.max(1));
    u32::try_from(share).unwrap_or(1_000_000)
}

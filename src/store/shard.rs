//! One shard of the bucket store: a table of buckets per algorithm family, plus the expiry and
//! eviction that keep the shard within its share of `max_keys`.

use std::sync::atomic::{AtomicBool, Ordering};

use hashbrown::HashTable;
use parking_lot::Mutex;

use super::table::{GcraEntry, GcraTable, MAX_MARGIN_MS, margin_ms_of};
use super::{StoreError, StoreStats};
use crate::algorithm::{SlidingLog, WindowState, fixed_window, gcra, sliding_window};
use crate::limit::MAX_CAPACITY_NS;
use crate::{Algorithm, BucketKey, Decision, Limit, MAX_PERIOD_NS};

/// A fixed- or sliding-window bucket. The small mutex is uncontended except on one hot key.
#[derive(Debug)]
pub(super) struct WindowEntry {
    pub(super) hash: u64,
    pub(super) check: u32,
    pub(super) slot: Mutex<(Limit, WindowState)>,
    /// Changed since the last replication round.
    pub(super) dirty: AtomicBool,
}

/// A sliding-log bucket (at most `SLIDING_LOG_MAX_LIMIT` timestamps).
#[derive(Debug)]
pub(super) struct LogEntry {
    pub(super) hash: u64,
    pub(super) check: u32,
    pub(super) slot: Mutex<(Limit, SlidingLog)>,
    /// Changed since the last replication round.
    pub(super) dirty: AtomicBool,
}

/// What to restore to take back an admission (multi-checks that end up denied).
#[derive(Debug, Clone, Copy)]
pub(super) enum Undo {
    Nothing,
    Gcra { tat_ns: u64 },
    Window { state: WindowState },
    Log { cost: u64 },
}

/// One table per algorithm family. A key checked under a limit of another family than before (a
/// rules edit that switches algorithm) restarts: its bucket in the new family's table starts
/// fresh, and the old one is left to expire like any idle bucket. Should the key come back to
/// the old family before that, the old state is still right to read: a GCRA TAT, window counts
/// (rebased to the limit then in force) and log times are all absolute time.
#[derive(Debug, Default)]
pub(super) struct Shard {
    pub(super) gcra: GcraTable,
    pub(super) windows: HashTable<WindowEntry>,
    pub(super) logs: HashTable<LogEntry>,
}

pub(super) fn same<'a, E: Identified>(key: BucketKey) -> impl Fn(&E) -> bool + 'a {
    move |e| e.hash() == key.hash && e.check() == key.check
}

impl Shard {
    pub(super) fn len(&self) -> usize {
        self.gcra.len() + self.windows.len() + self.logs.len()
    }

    /// Decides against the key's existing bucket; `None` if it has none. Callable under a shared
    /// lock: GCRA updates by CAS, windows and logs under their entry mutex.
    pub(super) fn decide_existing(
        &self,
        key: BucketKey,
        limit: &Limit,
        cost: u64,
        now_ns: u64,
    ) -> Option<(Decision, Undo)> {
        match limit.algorithm() {
            Algorithm::Gcra => {
                let entry = self.gcra.find(key)?;
                // Compare-and-swap, retried on a race; the closure runs at least once, so
                // `decision` is always set. Relaxed suffices: the TAT is the whole state.
                let mut decision = Decision::CostExceedsBurst { burst: 0 };
                let stored =
                    entry
                        .tat_ns
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tat| {
                            let (decided, new_tat) = gcra::decide(limit, tat, now_ns, cost);
                            decision = decided;
                            new_tat
                        });
                match stored {
                    Ok(tat_ns) => {
                        // Consumed (or clamped): also keeps the eviction margin that of the
                        // limit in force, should it have changed.
                        entry.mark_changed(margin_ms(limit));
                        Some((decision, Undo::Gcra { tat_ns }))
                    }
                    Err(_) => Some((decision, Undo::Nothing)),
                }
            }
            Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                let entry = self.windows.find(key.hash, same(key))?;
                let mut slot = entry.slot.lock();
                if adopt_limit(&mut slot, limit, now_ns) {
                    entry.dirty.store(true, Ordering::Relaxed);
                }
                let (decision, new_state) = decide_window(limit, &slot.1, now_ns, cost);
                let undo = match new_state {
                    Some(new_state) => {
                        entry.dirty.store(true, Ordering::Relaxed);
                        Undo::Window {
                            state: std::mem::replace(&mut slot.1, new_state),
                        }
                    }
                    None => Undo::Nothing,
                };
                Some((decision, undo))
            }
            Algorithm::SlidingLog => {
                let entry = self.logs.find(key.hash, same(key))?;
                let mut slot = entry.slot.lock();
                let decision = slot.1.decide(limit, now_ns, cost);
                slot.0 = *limit;
                let undo = if decision.is_allowed() && cost > 0 {
                    entry.dirty.store(true, Ordering::Relaxed);
                    Undo::Log { cost }
                } else {
                    Undo::Nothing
                };
                Some((decision, undo))
            }
        }
    }

    /// Decides, creating the bucket when the check consumes from a key not seen before (peeks
    /// and denials of unknown keys leave no entry). Makes room first when the shard is full.
    pub(super) fn decide_or_insert(
        &mut self,
        key: BucketKey,
        limit: &Limit,
        cost: u64,
        now_ns: u64,
        max_len: usize,
        stats: &StoreStats,
    ) -> Result<(Decision, Undo), StoreError> {
        if let Some(found) = self.decide_existing(key, limit, cost, now_ns) {
            return Ok(found);
        }
        let (decision, consumed) = decide_fresh(limit, now_ns, cost);
        if !consumed {
            return Ok((decision, Undo::Nothing));
        }
        if self.len() >= max_len {
            self.make_room(now_ns, stats)?;
        }
        match limit.algorithm() {
            Algorithm::Gcra => {
                let (_, new_tat) = gcra::decide(limit, 0, now_ns, cost);
                // `consumed` means decide returned a new TAT.
                self.gcra
                    .insert(GcraEntry::new(key, margin_ns(limit), new_tat.unwrap_or(0)));
                Ok((decision, Undo::Gcra { tat_ns: 0 }))
            }
            Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                let (_, state) = decide_window(limit, &WindowState::default(), now_ns, cost);
                let slot = Mutex::new((*limit, state.unwrap_or_default()));
                self.windows.insert_unique(
                    key.hash,
                    WindowEntry {
                        hash: key.hash,
                        check: key.check,
                        slot,
                        dirty: AtomicBool::new(true),
                    },
                    |e| e.hash,
                );
                Ok((
                    decision,
                    Undo::Window {
                        state: WindowState::default(),
                    },
                ))
            }
            Algorithm::SlidingLog => {
                let mut log = SlidingLog::default();
                log.decide(limit, now_ns, cost);
                let slot = Mutex::new((*limit, log));
                self.logs.insert_unique(
                    key.hash,
                    LogEntry {
                        hash: key.hash,
                        check: key.check,
                        slot,
                        dirty: AtomicBool::new(true),
                    },
                    |e| e.hash,
                );
                Ok((decision, Undo::Log { cost }))
            }
        }
    }

    /// Gives back `cost` units a request took but did not use (its other checks were denied on
    /// another node). Never makes a bucket fuller than it would be had the units not been taken:
    /// GCRA moves the TAT back by `cost` intervals, not before `now`; a window lowers its count
    /// only within the same window; a log drops its newest entries.
    pub(super) fn refund(&self, key: BucketKey, limit: &Limit, cost: u64, now_ns: u64) {
        match limit.algorithm() {
            Algorithm::Gcra => {
                let Some(entry) = self.gcra.find(key) else {
                    return;
                };
                let back = cost.min(limit.burst()) * limit.interval_ns();
                let refunded =
                    entry
                        .tat_ns
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tat| {
                            (tat > now_ns).then(|| tat.saturating_sub(back).max(now_ns))
                        });
                if refunded.is_ok() {
                    entry.mark_dirty();
                }
            }
            Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                let Some(entry) = self.windows.find(key.hash, same(key)) else {
                    return;
                };
                let mut slot = entry.slot.lock();
                adopt_limit(&mut slot, limit, now_ns);
                if slot.1.window == now_ns / limit.period_ns() {
                    slot.1.count = slot.1.count.saturating_sub(cost);
                    entry.dirty.store(true, Ordering::Relaxed);
                }
            }
            Algorithm::SlidingLog => {
                if let Some(entry) = self.logs.find(key.hash, same(key)) {
                    entry.slot.lock().1.undo(cost);
                    entry.dirty.store(true, Ordering::Relaxed);
                }
            }
        }
    }

    /// Appends the buckets changed since the last call (clearing their mark) that are still
    /// in use at `now`.
    pub(super) fn take_changed(&self, now_ns: u64, out: &mut Vec<BucketState>) {
        for entry in self.gcra.iter() {
            if entry.take_dirty()
                && let Some(state) = gcra_state(entry, now_ns)
            {
                out.push(state);
            }
        }
        for entry in self.windows.iter() {
            if entry.dirty.swap(false, Ordering::Relaxed)
                && let Some(state) = entry.state(now_ns)
            {
                out.push(state);
            }
        }
        for entry in self.logs.iter() {
            if entry.dirty.swap(false, Ordering::Relaxed)
                && let Some(state) = entry.state(now_ns)
            {
                out.push(state);
            }
        }
    }

    /// Appends every bucket in use at `now` whose key passes `filter`.
    pub(super) fn export(
        &self,
        now_ns: u64,
        filter: &dyn Fn(BucketKey) -> bool,
        out: &mut Vec<BucketState>,
    ) {
        let wanted = |key| filter(key);
        out.extend(
            self.gcra
                .iter()
                .filter(|e| wanted(e.key()))
                .filter_map(|e| gcra_state(e, now_ns)),
        );
        out.extend(
            self.windows
                .iter()
                .filter(|e| wanted(BucketKey::of(*e)))
                .filter_map(|e| e.state(now_ns)),
        );
        out.extend(
            self.logs
                .iter()
                .filter(|e| wanted(BucketKey::of(*e)))
                .filter_map(|e| e.state(now_ns)),
        );
    }

    /// Merges a bucket received from a peer so that a merge can only make a decision stricter:
    /// GCRA keeps the later TAT (it has admitted more), a window the larger count per window, a
    /// log the strictest view of both copies (`SlidingLog::merge`). Returns false when there was no room.
    pub(super) fn merge(
        &mut self,
        state: &BucketState,
        now_ns: u64,
        max_len: usize,
        stats: &StoreStats,
    ) -> bool {
        let key = state.key;
        match &state.value {
            BucketValue::Gcra { tat_ns, margin_ms } => {
                let margin_ms = (*margin_ms).min(MAX_MARGIN_MS);
                let tat_ns = plausible_tat(*tat_ns, margin_ms, now_ns);
                if tat_ns <= now_ns {
                    return true;
                }
                if let Some(entry) = self.gcra.find(key) {
                    entry.tat_ns.fetch_max(tat_ns, Ordering::Relaxed);
                    return true;
                }
                if self.len() >= max_len && self.make_room(now_ns, stats).is_err() {
                    return false;
                }
                let entry = GcraEntry::new(key, u64::from(margin_ms) * 1_000_000, tat_ns);
                // Received state is not ours to replicate onward until it changes here.
                entry.take_dirty();
                self.gcra.insert(entry);
            }
            BucketValue::Window { limit, state } => {
                let received = plausible_window(limit, state, now_ns);
                if let Some(entry) = self.windows.find(key.hash, same(key)) {
                    let mut slot = entry.slot.lock();
                    // Both copies counted in windows of the local limit's period before they
                    // are compared window by window.
                    let local_period = slot.0.period_ns();
                    let received = received.rebase(limit.period_ns(), local_period, now_ns);
                    let local = slot.1.rebase(local_period, local_period, now_ns);
                    slot.1 = local.merge(received);
                    return true;
                }
                if self.len() >= max_len && self.make_room(now_ns, stats).is_err() {
                    return false;
                }
                let entry = WindowEntry {
                    hash: key.hash,
                    check: key.check,
                    slot: Mutex::new((*limit, received)),
                    dirty: AtomicBool::new(false),
                };
                self.windows.insert_unique(key.hash, entry, |e| e.hash);
            }
            BucketValue::Log { limit, times_ns } => {
                // Admissions are never in the future: later times are taken as now.
                let times: Vec<u64> = times_ns.iter().map(|t| (*t).min(now_ns)).collect();
                if let Some(entry) = self.logs.find(key.hash, same(key)) {
                    let mut slot = entry.slot.lock();
                    let limit = slot.0;
                    let log = SlidingLog::from_times(&limit, &times);
                    slot.1.merge(&limit, log, now_ns);
                    return true;
                }
                let log = SlidingLog::from_times(limit, &times);
                if self.len() >= max_len && self.make_room(now_ns, stats).is_err() {
                    return false;
                }
                let entry = LogEntry {
                    hash: key.hash,
                    check: key.check,
                    slot: Mutex::new((*limit, log)),
                    dirty: AtomicBool::new(false),
                };
                self.logs.insert_unique(key.hash, entry, |e| e.hash);
            }
        }
        true
    }

    /// Takes back an admission recorded by `decide_*` (the caller holds the shard exclusively, so
    /// nothing else changed the bucket in between).
    pub(super) fn undo(&mut self, key: BucketKey, undo: Undo) {
        match undo {
            Undo::Nothing => {}
            Undo::Gcra { tat_ns } => {
                if let Some(e) = self.gcra.find_mut(key) {
                    *e.tat_ns.get_mut() = tat_ns;
                }
            }
            Undo::Window { state } => {
                if let Some(e) = self.windows.find_mut(key.hash, same(key)) {
                    e.slot.get_mut().1 = state;
                }
            }
            Undo::Log { cost } => {
                if let Some(e) = self.logs.find_mut(key.hash, same(key)) {
                    e.slot.get_mut().1.undo(cost);
                }
            }
        }
    }

    /// Drops every bucket that is full again; returns how many. Changes no decision.
    pub(super) fn forget_expired(&mut self, now_ns: u64) -> usize {
        let before = self.len();
        self.gcra
            .retain(|e| !gcra::is_expired(*e.tat_ns.get_mut(), now_ns));
        self.windows.retain(|e| !e.is_expired(now_ns));
        self.logs.retain(|e| !e.is_expired(now_ns));
        before - self.len()
    }

    /// Frees space in a full shard: first by forgetting expired buckets, then by evicting the
    /// non-denying buckets that hold the smallest share of their capacity consumed (about 1/16
    /// of the shard at once, so the scan is amortised). An evicted key that returns starts full,
    /// so it regains what it had consumed: ranking by that share keeps the cost of an eviction
    /// at a small fraction of each evicted key's limit. Ranking by time until full instead would
    /// evict a busy key with a short period first, over and over, under a flood of new keys. A
    /// bucket that is denying is never evicted: when every bucket is denying, the new key is
    /// refused with [`StoreError::Full`] instead of silently resetting someone.
    pub(super) fn make_room(&mut self, now_ns: u64, stats: &StoreStats) -> Result<(), StoreError> {
        let expired = self.forget_expired(now_ns);
        stats.expired.fetch_add(expired as u64, Ordering::Relaxed);
        if expired > 0 {
            return Ok(());
        }
        let mut candidates: Vec<(Cost, Family, BucketKey)> = Vec::new();
        for entry in self.gcra.iter_mut() {
            if !entry.is_denying(now_ns) {
                candidates.push((Cost::of(entry, now_ns), Family::Gcra, entry.key()));
            }
        }
        collect_evictable(&mut self.windows, Family::Window, now_ns, &mut candidates);
        collect_evictable(&mut self.logs, Family::Log, now_ns, &mut candidates);
        if candidates.is_empty() {
            stats.refused.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::Full);
        }
        let evict = (self.len() / 16).clamp(1, candidates.len());
        candidates.select_nth_unstable_by_key(evict - 1, |c| c.0);
        for &(_, family, key) in &candidates[..evict] {
            match family {
                Family::Gcra => self.gcra.remove(key),
                Family::Window => remove(&mut self.windows, key),
                Family::Log => remove(&mut self.logs, key),
            }
        }
        stats.evicted.fetch_add(evict as u64, Ordering::Relaxed);
        Ok(())
    }
}

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

/// A received window state made safe to decide with under `limit` (the limit it was sent
/// with): no window after `now`'s and no count above the limit (a peer with other rules, or a
/// hostile one, cannot make the arithmetic overflow; a count clamped to the limit only denies).
fn plausible_window(limit: &Limit, state: &WindowState, now_ns: u64) -> WindowState {
    let cap = limit.burst();
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
/// have). The next check clamps it further, to that key's own capacity (`gcra::decide`).
fn plausible_tat(tat_ns: u64, margin_ms: u32, now_ns: u64) -> u64 {
    let most_ahead = if margin_ms < MAX_MARGIN_MS {
        (u64::from(margin_ms) + 1) * 1_000_000 + MAX_PERIOD_NS
    } else {
        MAX_CAPACITY_NS
    };
    tat_ns.min(now_ns.saturating_add(most_ahead))
}

/// Brings a window bucket to the limit of this check, when it differs from the one the bucket
/// was counted under (a rules edit, or a client sending another limit for the same key): the
/// counts are rebased to windows of the new period by absolute time (see
/// [`WindowState::rebase`]), never read as indices of another period. Fixed and sliding windows
/// share their counts (a count per window means the same in both). True when it changed.
pub(super) fn adopt_limit(slot: &mut (Limit, WindowState), limit: &Limit, now_ns: u64) -> bool {
    if slot.0 == *limit {
        return false;
    }
    slot.1 = slot.1.rebase(slot.0.period_ns(), limit.period_ns(), now_ns);
    slot.0 = *limit;
    true
}

/// A GCRA bucket's state, if it is still in use at `now`.
fn gcra_state(entry: &GcraEntry, now_ns: u64) -> Option<BucketState> {
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
    fn state(&self, now_ns: u64) -> Option<BucketState> {
        let (limit, state) = *self.slot.lock();
        (!window_is_expired(&limit, &state, now_ns)).then(|| BucketState {
            key: BucketKey::of(self),
            value: BucketValue::Window { limit, state },
        })
    }
}

impl LogEntry {
    /// The bucket's state, if it is still in use at `now`.
    fn state(&self, now_ns: u64) -> Option<BucketState> {
        let slot = self.slot.lock();
        let (limit, log) = (&slot.0, &slot.1);
        (!log.is_expired(limit, now_ns)).then(|| BucketState {
            key: BucketKey::of(self),
            value: BucketValue::Log {
                limit: *limit,
                times_ns: log.times().collect(),
            },
        })
    }
}

impl BucketKey {
    fn of(entry: &impl Identified) -> BucketKey {
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
fn margin_ms(limit: &Limit) -> u32 {
    margin_ms_of(margin_ns(limit))
}

/// True when a window bucket is full again (expiry, not a decision).
fn window_is_expired(limit: &Limit, state: &WindowState, now_ns: u64) -> bool {
    match limit.algorithm() {
        Algorithm::SlidingWindow => sliding_window::is_expired(limit, state, now_ns),
        _ => fixed_window::is_expired(limit, state, now_ns),
    }
}

fn decide_window(
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

/// The decision for a key with no bucket, and whether it consumed (so a bucket must be made).
pub(super) fn decide_fresh(limit: &Limit, now_ns: u64, cost: u64) -> (Decision, bool) {
    match limit.algorithm() {
        Algorithm::Gcra => {
            let (d, new) = gcra::decide(limit, 0, now_ns, cost);
            (d, new.is_some())
        }
        Algorithm::FixedWindow | Algorithm::SlidingWindow => {
            let (d, new) = decide_window(limit, &WindowState::default(), now_ns, cost);
            (d, new.is_some())
        }
        Algorithm::SlidingLog => {
            let d = SlidingLog::default().decide(limit, now_ns, cost);
            (d, d.is_allowed() && cost > 0)
        }
    }
}

/// What evicting a bucket gives away, compared first by the share of its capacity consumed
/// (millionths: what the key would regain if it returned) and then by the time until it is full
/// again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Cost {
    consumed_ppm: u32,
    expires_in_ns: u64,
}

impl Cost {
    fn of(entry: &mut impl Identified, now_ns: u64) -> Cost {
        Cost {
            consumed_ppm: entry.consumed_ppm(now_ns),
            expires_in_ns: entry.expires_in(now_ns),
        }
    }
}

/// `used / capacity` in millionths, at most a million.
fn ppm(used: u64, capacity: u64) -> u32 {
    let share = u128::from(used.min(capacity)) * 1_000_000 / u128::from(capacity.max(1));
    u32::try_from(share).unwrap_or(1_000_000)
}

#[derive(Debug, Clone, Copy)]
enum Family {
    Gcra,
    Window,
    Log,
}

/// What expiry and eviction need to know of any bucket.
pub(super) trait Identified {
    fn hash(&self) -> u64;
    fn check(&self) -> u32;
    /// Time until the bucket is full again (0 = expired).
    fn expires_in(&mut self, now_ns: u64) -> u64;
    /// True when a cost of 1 would be denied now: such a bucket must not be evicted.
    fn is_denying(&mut self, now_ns: u64) -> bool;
    /// The share of the bucket's capacity consumed now, in millionths.
    fn consumed_ppm(&mut self, now_ns: u64) -> u32;
    fn is_expired(&mut self, now_ns: u64) -> bool {
        self.expires_in(now_ns) == 0
    }
}

impl Identified for GcraEntry {
    fn hash(&self) -> u64 {
        self.hash
    }
    fn check(&self) -> u32 {
        self.check
    }
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
}

impl Identified for WindowEntry {
    fn hash(&self) -> u64 {
        self.hash
    }
    fn check(&self) -> u32 {
        self.check
    }
    fn expires_in(&mut self, now_ns: u64) -> u64 {
        let (limit, state) = self.slot.get_mut();
        if window_is_expired(limit, state, now_ns) {
            0
        } else {
            decide_window(limit, state, now_ns, 0)
                .0
                .reset_after_ns()
                .max(1)
        }
    }
    fn is_expired(&mut self, now_ns: u64) -> bool {
        let (limit, state) = self.slot.get_mut();
        window_is_expired(limit, state, now_ns)
    }
    fn is_denying(&mut self, now_ns: u64) -> bool {
        let (limit, state) = self.slot.get_mut();
        !decide_window(limit, state, now_ns, 1).0.is_allowed()
    }
    fn consumed_ppm(&mut self, now_ns: u64) -> u32 {
        let (limit, state) = self.slot.get_mut();
        let remaining = decide_window(limit, state, now_ns, 0).0.remaining();
        ppm(limit.burst().saturating_sub(remaining), limit.burst())
    }
}

impl Identified for LogEntry {
    fn hash(&self) -> u64 {
        self.hash
    }
    fn check(&self) -> u32 {
        self.check
    }
    fn expires_in(&mut self, now_ns: u64) -> u64 {
        let (limit, log) = self.slot.get_mut();
        if log.is_expired(limit, now_ns) {
            0
        } else {
            log.clone().decide(limit, now_ns, 0).reset_after_ns().max(1)
        }
    }
    fn is_expired(&mut self, now_ns: u64) -> bool {
        let (limit, log) = self.slot.get_mut();
        log.is_expired(limit, now_ns)
    }
    fn is_denying(&mut self, now_ns: u64) -> bool {
        let (limit, log) = self.slot.get_mut();
        !log.clone().decide(limit, now_ns, 1).is_allowed()
    }
    fn consumed_ppm(&mut self, now_ns: u64) -> u32 {
        let (limit, log) = self.slot.get_mut();
        let remaining = log.clone().decide(limit, now_ns, 0).remaining();
        ppm(limit.burst().saturating_sub(remaining), limit.burst())
    }
}

fn collect_evictable<E: Identified>(
    table: &mut HashTable<E>,
    family: Family,
    now_ns: u64,
    out: &mut Vec<(Cost, Family, BucketKey)>,
) {
    for entry in table.iter_mut() {
        if !entry.is_denying(now_ns) {
            let key = BucketKey {
                hash: entry.hash(),
                check: entry.check(),
            };
            out.push((Cost::of(entry, now_ns), family, key));
        }
    }
}

fn remove<E: Identified>(table: &mut HashTable<E>, key: BucketKey) {
    if let Ok(entry) = table.find_entry(key.hash, same(key)) {
        entry.remove();
    }
}

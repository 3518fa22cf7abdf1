//! One shard of the bucket store: a table of buckets per algorithm family, and the decisions,
//! refunds, exports and merges on them (eviction: `eviction.rs`; received consumption:
//! `remote.rs`; the list of changed keys a replication round reads: `changed.rs`).

use std::sync::atomic::Ordering;

use super::bucket_state::{BucketState, BucketValue, gcra_state, plausible_tat, plausible_window};
use super::budget::{
    Account, Bounds, GCRA_BUCKET_BYTES, LOG_TIME_BYTES, WINDOW_BUCKET_BYTES, bucket_bytes,
    log_bytes,
};
use super::changed::{
    ChangedKeys, count_worth_replicating, gcra_worth_replicating, log_worth_replicating,
    window_worth_replicating,
};
use super::entries::{
    Dirty, Family, Identified, LogEntry, LogTable, WindowEntry, WindowTable, decide_window,
    margin_ms, margin_ns,
};
use super::table::{GcraEntry, GcraTable, MAX_MARGIN_MS};
use super::{StoreError, StoreStats};
use crate::algorithm::{SlidingLog, WindowState, gcra};
use crate::limit::PackedLimit;
use crate::prefetch::PREFETCH_BURST;
use crate::{Algorithm, BucketKey, Decision, Limit};

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
#[derive(Debug)]
pub(super) struct Shard {
    pub(super) gcra: GcraTable,
    pub(super) windows: WindowTable,
    pub(super) logs: LogTable,
    /// What the buckets above cost, in bytes (`budget.rs`).
    pub(super) bytes: Account,
    /// The keys of the buckets marked changed since the last round (`changed.rs`).
    pub(super) changed: ChangedKeys,
    /// An eviction pass has run here (`eviction.rs`: the first one tells returns apart alone).
    pub(super) passed: bool,
}

/// A log bucket's next admission needs this many more bytes than the shard may still charge:
/// decided again under the exclusive lock, after making room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct NeedsRoom(pub(super) usize);

impl Shard {
    /// An empty shard listing at most `listed` changed keys between two rounds.
    pub(super) fn new(listed: usize) -> Self {
        Shard {
            gcra: GcraTable::default(),
            windows: WindowTable::default(),
            logs: LogTable::default(),
            bytes: Account::default(),
            changed: ChangedKeys::new(listed),
            passed: false,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.gcra.len() + self.windows.len() + self.logs.len()
    }

    /// Decides against the key's existing bucket; `None` if it has none. Callable under a shared
    /// lock: GCRA updates by CAS, windows and logs under their entry mutex. A log that must grow
    /// past `max_bytes` to admit is left as it was ([`NeedsRoom`]).
    pub(super) fn decide_existing(
        &self,
        key: BucketKey,
        limit: &Limit,
        cost: u64,
        now_ns: u64,
        max_bytes: usize,
    ) -> Result<Option<(Decision, Undo)>, NeedsRoom> {
        match limit.algorithm() {
            Algorithm::Gcra => Ok(self.existing_gcra(key, limit, cost, now_ns)),
            Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                Ok(self.existing_window(key, limit, cost, now_ns))
            }
            Algorithm::SlidingLog => self.existing_log(key, limit, cost, now_ns, max_bytes),
        }
    }

    fn existing_gcra(
        &self,
        key: BucketKey,
        limit: &Limit,
        cost: u64,
        now_ns: u64,
    ) -> Option<(Decision, Undo)> {
        let entry = self.gcra.find(key)?;
        // Compare-and-swap, retried on a race; the closure runs at least once, so
        // `decision` is always set. Relaxed suffices: the TAT is the whole state.
        let mut decision = Decision::CostExceedsBurst { burst: 0 };
        let mut tat_after = 0;
        let stored = entry
            .tat_ns
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tat| {
                let (decided, new_tat) = gcra::decide(limit, tat, now_ns, cost);
                decision = decided;
                tat_after = new_tat.unwrap_or(tat);
                new_tat
            });
        Some(match stored {
            Ok(tat_ns) => {
                // Consumed (or clamped): also keeps the eviction margin that of the
                // limit in force, should it have changed.
                self.mark_gcra_changed(entry, limit, tat_after, now_ns);
                (decision, Undo::Gcra { tat_ns })
            }
            Err(_) => (decision, Undo::Nothing),
        })
    }

    fn existing_window(
        &self,
        key: BucketKey,
        limit: &Limit,
        cost: u64,
        now_ns: u64,
    ) -> Option<(Decision, Undo)> {
        let entry = self.windows.find(key)?;
        let mut slot = entry.slot.lock();
        if adopt_limit(&mut slot, limit, now_ns) {
            self.mark_dirty(entry);
        }
        let (decision, new_state) = decide_window(limit, &slot.1, now_ns, cost);
        let undo = match new_state {
            Some(new_state) => {
                if count_worth_replicating(limit, decision.remaining()) {
                    self.mark_dirty(entry);
                }
                entry.used.store(true, Ordering::Relaxed);
                Undo::Window {
                    state: std::mem::replace(&mut slot.1, new_state),
                }
            }
            None => Undo::Nothing,
        };
        Some((decision, undo))
    }

    fn existing_log(
        &self,
        key: BucketKey,
        limit: &Limit,
        cost: u64,
        now_ns: u64,
        max_bytes: usize,
    ) -> Result<Option<(Decision, Undo)>, NeedsRoom> {
        let Some(entry) = self.logs.find(key) else {
            return Ok(None);
        };
        let mut slot = entry.slot.lock();
        let log = &mut slot.1;
        let growth = log.growth_for(limit, now_ns, cost);
        if growth > 0 {
            // Charged before it grows, so concurrent growths cannot pass the bound.
            let bytes = log.heap_growth(growth) * LOG_TIME_BYTES;
            if !self.bytes.try_charge(bytes, max_bytes) {
                return Err(NeedsRoom(bytes));
            }
            self.bytes.tracking(log, |log| log.grow(growth));
            self.bytes.release(bytes);
        }
        let decision = log.decide(limit, now_ns, cost);
        slot.0 = limit.packed();
        let undo = if decision.is_allowed() && cost > 0 {
            if count_worth_replicating(limit, decision.remaining()) {
                self.mark_dirty(entry);
            }
            entry.used.store(true, Ordering::Relaxed);
            Undo::Log { cost }
        } else {
            Undo::Nothing
        };
        Ok(Some((decision, undo)))
    }

    /// Decides, creating the bucket when the check consumes from a key not seen before (peeks
    /// and denials of unknown keys leave no entry). Makes room first when the shard is full
    /// (in keys or in bytes), or when the key's log must grow past the bytes left.
    pub(super) fn decide_or_insert(
        &mut self,
        key: BucketKey,
        limit: &Limit,
        cost: u64,
        now_ns: u64,
        bounds: Bounds,
        stats: &StoreStats,
    ) -> Result<(Decision, Undo), StoreError> {
        match self.decide_existing(key, limit, cost, now_ns, bounds.bytes) {
            Ok(Some(found)) => return Ok(found),
            Ok(None) => {}
            Err(NeedsRoom(bytes)) => {
                // The key's own bucket is kept: the room is for it to grow.
                let grown = Bounds {
                    keys: usize::MAX,
                    ..bounds
                };
                self.make_room(now_ns, bytes, grown, Some(key), stats)?;
                return match self.decide_existing(key, limit, cost, now_ns, bounds.bytes) {
                    Ok(Some(found)) => Ok(found),
                    _ => Err(StoreError::Full),
                };
            }
        }
        let (decision, consumed) = decide_fresh(limit, now_ns, cost);
        if !consumed {
            return Ok((decision, Undo::Nothing));
        }
        let bytes = bucket_bytes(limit, cost);
        if !self.fits(bytes, bounds) {
            self.make_room(now_ns, bytes, bounds, None, stats)?;
        }
        match limit.algorithm() {
            Algorithm::Gcra => {
                let (_, new_tat) = gcra::decide(limit, 0, now_ns, cost);
                // `consumed` means decide returned a new TAT.
                self.insert_changed_gcra(key, limit, new_tat.unwrap_or(0), now_ns);
                Ok((decision, Undo::Gcra { tat_ns: 0 }))
            }
            Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                let (_, state) = decide_window(limit, &WindowState::default(), now_ns, cost);
                // What the admission left is what the decision says remains: no second look.
                let replicate = count_worth_replicating(limit, decision.remaining());
                self.insert_window_marked(key, limit, state.unwrap_or_default(), replicate);
                Ok((
                    decision,
                    Undo::Window {
                        state: WindowState::default(),
                    },
                ))
            }
            Algorithm::SlidingLog => {
                let mut log = SlidingLog::first_for(limit, cost);
                log.decide(limit, now_ns, cost);
                let replicate = count_worth_replicating(limit, decision.remaining());
                self.insert_log_marked(key, limit, log, replicate);
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
                    self.mark_dirty(entry);
                }
            }
            Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                let Some(entry) = self.windows.find(key) else {
                    return;
                };
                let mut slot = entry.slot.lock();
                adopt_limit(&mut slot, limit, now_ns);
                if slot.1.window == now_ns / limit.period_ns() {
                    slot.1.count = slot.1.count.saturating_sub(cost);
                    self.mark_dirty(entry);
                }
            }
            Algorithm::SlidingLog => {
                if let Some(entry) = self.logs.find(key) {
                    let mut slot = entry.slot.lock();
                    self.bytes.tracking(&mut slot.1, |log| log.undo(cost));
                    self.mark_dirty(entry);
                }
            }
        }
    }

    /// Marks `entry` changed since the last round and, when it was not, lists its key: the
    /// one way a bucket already in a table becomes changed (except [`Shard::mark_gcra_changed`]).
    #[inline]
    pub(super) fn mark_dirty<E: Dirty>(&self, entry: &E) {
        if entry.set_dirty() {
            self.changed.push(E::FAMILY, BucketKey::of(entry));
        }
    }

    /// [`GcraEntry::mark_changed`] after a change under `limit` left the bucket's TAT at
    /// `tat_ns`: marked (and its key listed) only when worth replicating.
    #[inline]
    pub(super) fn mark_gcra_changed(
        &self,
        entry: &GcraEntry,
        limit: &Limit,
        tat_ns: u64,
        now_ns: u64,
    ) {
        let replicate = gcra_worth_replicating(limit, tat_ns, now_ns);
        if entry.mark_changed(margin_ms(limit), replicate) {
            self.changed.push(Family::Gcra, entry.key());
        }
    }

    /// Marks a window bucket changed (and lists its key) after a change left it at `state`
    /// under `limit`, when worth replicating.
    pub(super) fn mark_window_changed(
        &self,
        entry: &WindowEntry,
        limit: &Limit,
        state: &WindowState,
        now_ns: u64,
    ) {
        if window_worth_replicating(limit, state, now_ns) {
            self.mark_dirty(entry);
        }
    }

    /// Marks a log bucket changed (and lists its key) after a change left it at `log` under
    /// `limit`, when worth replicating.
    pub(super) fn mark_log_changed(
        &self,
        entry: &LogEntry,
        limit: &Limit,
        log: &SlidingLog,
        now_ns: u64,
    ) {
        if log_worth_replicating(limit, log, now_ns) {
            self.mark_dirty(entry);
        }
    }

    /// Inserts a GCRA bucket whose key has none here, listing it if it is made changed.
    pub(super) fn insert_gcra(&mut self, entry: GcraEntry) {
        self.list_if_dirty(&entry);
        self.gcra.insert(entry);
    }

    /// Makes `key`'s GCRA bucket under `limit`, left at `tat_ns` by a change here (marked only
    /// when worth replicating), and charges its bytes. The caller made room.
    pub(super) fn insert_changed_gcra(
        &mut self,
        key: BucketKey,
        limit: &Limit,
        tat_ns: u64,
        now_ns: u64,
    ) {
        let replicate = gcra_worth_replicating(limit, tat_ns, now_ns);
        self.insert_gcra(GcraEntry::new(key, margin_ns(limit), tat_ns, replicate));
        self.bytes.charge(GCRA_BUCKET_BYTES);
    }

    /// Makes `key`'s window bucket under `limit`, left at `state` by a change here (marked
    /// only when worth replicating), and charges its bytes. The caller made room.
    pub(super) fn insert_changed_window(
        &mut self,
        key: BucketKey,
        limit: &Limit,
        state: WindowState,
        now_ns: u64,
    ) {
        let replicate = window_worth_replicating(limit, &state, now_ns);
        self.insert_window_marked(key, limit, state, replicate);
    }

    /// [`Shard::insert_changed_window`] when the caller already knows whether the bucket is
    /// worth replicating (a check's decision says what it left).
    fn insert_window_marked(
        &mut self,
        key: BucketKey,
        limit: &Limit,
        state: WindowState,
        replicate: bool,
    ) {
        self.insert_window(WindowEntry::new(key, limit.packed(), state, replicate));
        self.bytes.charge(WINDOW_BUCKET_BYTES);
    }

    /// Makes `key`'s log bucket under `limit`, left as `log` by a change here (marked only
    /// when worth replicating), and charges its bytes. The caller made room.
    pub(super) fn insert_changed_log(
        &mut self,
        key: BucketKey,
        limit: &Limit,
        log: SlidingLog,
        now_ns: u64,
    ) {
        let replicate = log_worth_replicating(limit, &log, now_ns);
        self.insert_log_marked(key, limit, log, replicate);
    }

    /// [`Shard::insert_changed_log`] when the caller already knows whether the bucket is
    /// worth replicating (a check's decision says what it left).
    fn insert_log_marked(
        &mut self,
        key: BucketKey,
        limit: &Limit,
        log: SlidingLog,
        replicate: bool,
    ) {
        self.bytes.charge(log_bytes(&log));
        self.insert_log(LogEntry::new(key, limit.packed(), log, replicate));
    }

    /// Inserts a window bucket whose key has none here, listing it if it is made changed.
    pub(super) fn insert_window(&mut self, entry: WindowEntry) {
        self.list_if_dirty(&entry);
        self.windows.insert(entry);
    }

    /// Inserts a log bucket whose key has none here, listing it if it is made changed.
    pub(super) fn insert_log(&mut self, entry: LogEntry) {
        self.list_if_dirty(&entry);
        self.logs.insert(entry);
    }

    fn list_if_dirty<E: Dirty>(&self, entry: &E) {
        if entry.is_dirty() {
            self.changed.push(E::FAMILY, BucketKey::of(entry));
        }
    }

    /// Appends the buckets changed since the last call (clearing their mark) that are still
    /// in use at `now`: those whose keys were listed as they changed, or every bucket's mark
    /// when the list overflowed.
    pub(super) fn take_changed(&self, now_ns: u64, out: &mut Vec<BucketState>) {
        if self.changed.take_overflowed() {
            self.scan_changed(now_ns, out);
            return;
        }
        // Listed keys are as cold as a check's: taken a burst at a time, the burst's buckets
        // prefetched before any is read, so their misses overlap (one after another, they were
        // most of a round's cost).
        let mut drained = self.changed.drain();
        let mut burst = [(Family::Gcra, BucketKey { hash: 0, check: 0 }); 2 * PREFETCH_BURST];
        loop {
            let taken = burst
                .iter_mut()
                .zip(drained.by_ref())
                .map(|(place, listed)| *place = listed)
                .count();
            if taken == 0 {
                return;
            }
            let layouts = (
                self.gcra.layout(),
                self.windows.layout(),
                self.logs.layout(),
            );
            for &(family, key) in &burst[..taken] {
                match family {
                    Family::Gcra => super::table::prefetch::<GcraEntry>(layouts.0, key),
                    Family::Window => super::table::prefetch::<WindowEntry>(layouts.1, key),
                    Family::Log => super::table::prefetch::<LogEntry>(layouts.2, key),
                }
            }
            for &(family, key) in &burst[..taken] {
                out.extend(self.changed_state(family, key, now_ns));
            }
        }
    }

    /// The state of `key`'s bucket of `family` if it is marked changed, taking the mark. None
    /// when not found (evicted or expired since it was listed) or found unmarked (listed
    /// twice, or already taken by an earlier round's scan).
    fn changed_state(&self, family: Family, key: BucketKey, now_ns: u64) -> Option<BucketState> {
        match family {
            Family::Gcra => self
                .gcra
                .find(key)
                .filter(|e| e.take_dirty())
                .and_then(|e| gcra_state(e, now_ns)),
            Family::Window => self
                .windows
                .find(key)
                .filter(|e| Dirty::take_dirty(*e))
                .and_then(|e| e.state(now_ns)),
            Family::Log => self
                .logs
                .find(key)
                .filter(|e| Dirty::take_dirty(*e))
                .and_then(|e| e.state(now_ns)),
        }
    }

    /// [`Shard::take_changed`] by reading every bucket's mark: after the list overflowed.
    pub(super) fn scan_changed(&self, now_ns: u64, out: &mut Vec<BucketState>) {
        for entry in self.gcra.iter() {
            if entry.take_dirty()
                && let Some(state) = gcra_state(entry, now_ns)
            {
                out.push(state);
            }
        }
        for entry in self.windows.iter() {
            if Dirty::take_dirty(entry)
                && let Some(state) = entry.state(now_ns)
            {
                out.push(state);
            }
        }
        for entry in self.logs.iter() {
            if Dirty::take_dirty(entry)
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

    /// Merges a bucket received from a peer into this key's existing bucket, if it has one, so
    /// that a merge can only make a decision stricter: GCRA keeps the later TAT (it has
    /// admitted more), a window the larger count per window, a log the strictest view of both
    /// copies (`SlidingLog::merge`). Callable under a shared lock (GCRA by `fetch_max`, windows and logs under their entry mutex), so the
    /// replicas a successor receives all the time never stop its decisions. Returns false when
    /// the key has no bucket of that family (a new one needs [`Shard::merge`]); a received
    /// TAT already past counts as merged, as it changes nothing.
    pub(super) fn merge_existing(&self, state: &BucketState, now_ns: u64) -> bool {
        let key = state.key;
        match &state.value {
            BucketValue::Gcra { tat_ns, margin_ms } => {
                let margin_ms = (*margin_ms).min(MAX_MARGIN_MS);
                let tat_ns = plausible_tat(*tat_ns, margin_ms, now_ns);
                if tat_ns <= now_ns {
                    return true;
                }
                let Some(entry) = self.gcra.find(key) else {
                    return false;
                };
                entry.tat_ns.fetch_max(tat_ns, Ordering::Relaxed);
            }
            BucketValue::Window { limit, state } => {
                let Some(entry) = self.windows.find(key) else {
                    return false;
                };
                let received = plausible_window(limit, state, now_ns);
                let mut slot = entry.slot.lock();
                // Both copies counted in windows of the local limit's period before they are
                // compared window by window.
                let local_period = slot.0.period_ns();
                let received = received.rebase(limit.period_ns(), local_period, now_ns);
                let local = slot.1.rebase(local_period, local_period, now_ns);
                slot.1 = local.merge(received);
            }
            BucketValue::Log { times_ns, .. } => {
                let Some(entry) = self.logs.find(key) else {
                    return false;
                };
                // Admissions are never in the future: later times are taken as now.
                let times: Vec<u64> = times_ns.iter().map(|t| (*t).min(now_ns)).collect();
                let mut slot = entry.slot.lock();
                let limit = slot.0.limit();
                let log = SlidingLog::from_times(&limit, &times);
                self.bytes
                    .tracking(&mut slot.1, |mine| mine.merge(&limit, log, now_ns));
            }
        }
        true
    }

    /// [`Shard::merge_existing`], or a new bucket for the key when it has none and there is
    /// room (false: refused for lack of room).
    pub(super) fn merge(
        &mut self,
        state: &BucketState,
        now_ns: u64,
        bounds: Bounds,
        stats: &StoreStats,
    ) -> bool {
        if self.merge_existing(state, now_ns) {
            return true;
        }
        let key = state.key;
        match &state.value {
            BucketValue::Gcra { tat_ns, margin_ms } => {
                let margin_ms = (*margin_ms).min(MAX_MARGIN_MS);
                let tat_ns = plausible_tat(*tat_ns, margin_ms, now_ns);
                if !self.room_for(GCRA_BUCKET_BYTES, now_ns, bounds, stats) {
                    return false;
                }
                // Received state is not ours to replicate onward until it changes here.
                let entry = GcraEntry::new(key, u64::from(margin_ms) * 1_000_000, tat_ns, false);
                self.insert_gcra(entry);
                self.bytes.charge(GCRA_BUCKET_BYTES);
            }
            BucketValue::Window { limit, state } => {
                let received = plausible_window(limit, state, now_ns);
                if !self.room_for(WINDOW_BUCKET_BYTES, now_ns, bounds, stats) {
                    return false;
                }
                let entry = WindowEntry::new(key, limit.packed(), received, false);
                self.insert_window(entry);
                self.bytes.charge(WINDOW_BUCKET_BYTES);
            }
            BucketValue::Log { limit, times_ns } => {
                // Admissions are never in the future: later times are taken as now.
                let times: Vec<u64> = times_ns.iter().map(|t| (*t).min(now_ns)).collect();
                let log = SlidingLog::from_times(limit, &times);
                if !self.room_for(log_bytes(&log), now_ns, bounds, stats) {
                    return false;
                }
                self.bytes.charge(log_bytes(&log));
                let entry = LogEntry::new(key, limit.packed(), log, false);
                self.insert_log(entry);
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
                if let Some(e) = self.windows.find_mut(key) {
                    e.slot.get_mut().1 = state;
                }
            }
            Undo::Log { cost } => {
                if let Some(e) = self.logs.find_mut(key) {
                    self.bytes
                        .tracking(&mut e.slot.get_mut().1, |log| log.undo(cost));
                }
            }
        }
    }

    /// Drops every bucket that is full again; returns how many. Changes no decision.
    pub(super) fn forget_expired(&mut self, now_ns: u64) -> usize {
        self.forget_expired_from(now_ns, 0, usize::MAX).0
    }

    /// [`Shard::forget_expired`] over at most `max_slots` GCRA slots from slot `from`; the
    /// window and log buckets (few, in maps of their own) go when the GCRA walk completes.
    /// Returns how many were dropped and the slot to go on from (`None`: this shard is done).
    pub(super) fn forget_expired_from(
        &mut self,
        now_ns: u64,
        from: usize,
        max_slots: usize,
    ) -> (usize, Option<usize>) {
        let before = self.len();
        let (gcra, next) = self.gcra.retain_slots(from, max_slots, |e| {
            !gcra::is_expired(*e.tat_ns.get_mut(), now_ns)
        });
        self.bytes.release(gcra * GCRA_BUCKET_BYTES);
        if next.is_none() {
            let windows = self.windows.len();
            self.windows
                .retain_slots(0, usize::MAX, |e| !e.is_expired(now_ns));
            self.bytes
                .release((windows - self.windows.len()) * WINDOW_BUCKET_BYTES);
            let mut freed = 0;
            self.logs.retain_slots(0, usize::MAX, |e| {
                let expired = e.is_expired(now_ns);
                if expired {
                    freed += log_bytes(&e.slot.get_mut().1);
                }
                !expired
            });
            self.bytes.release(freed);
        }
        if next.is_none() {
            // Once the walk is done: a table rebuilt midway would end the walk early.
            self.give_back_slack();
        }
        (before - self.len(), next)
    }

    #[cfg(test)]
    pub(super) fn recount_bytes(&self) -> usize {
        self.gcra.len() * GCRA_BUCKET_BYTES
            + self.windows.len() * WINDOW_BUCKET_BYTES
            + self
                .logs
                .iter()
                .map(|e| log_bytes(&e.slot.lock().1))
                .sum::<usize>()
    }

    /// Makes room for a received bucket of `bytes` if it does not fit; false when there is none.
    fn room_for(&mut self, bytes: usize, now_ns: u64, bounds: Bounds, stats: &StoreStats) -> bool {
        self.fits(bytes, bounds) || self.make_room(now_ns, bytes, bounds, None, stats).is_ok()
    }
}

/// Brings a window bucket to the limit of this check, when it differs from the one the bucket
/// was counted under (a rules edit, or a client sending another limit for the same key): the
/// counts are rebased to windows of the new period by absolute time (see
/// [`WindowState::rebase`]), never read as indices of another period. Fixed and sliding windows
/// share their counts (a count per window means the same in both). True when it changed.
pub(super) fn adopt_limit(
    slot: &mut (PackedLimit, WindowState),
    limit: &Limit,
    now_ns: u64,
) -> bool {
    let kept = limit.packed();
    if slot.0 == kept {
        return false;
    }
    slot.1 = slot.1.rebase(slot.0.period_ns(), limit.period_ns(), now_ns);
    slot.0 = kept;
    true
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

//! The bucket store: a sharded concurrent map from [`BucketKey`] to bucket state.
//!
//! Each shard is a `parking_lot::RwLock` over an open-addressing table per algorithm family
//! (GCRA buckets, window buckets, sliding logs: `table.rs`). A check on a known key takes the
//! shard's lock *shared* and updates the bucket in place (GCRA by compare-and-swap on one
//! `AtomicU64`, so concurrent checks on the same or different keys never wait for each other).
//! Only the first consuming check of a new key, expiry sweeps and multi-checks take a shard
//! exclusively.
//!
//! Bounds: at most `max_keys` buckets and `max_bytes` bytes of them (each split evenly over the
//! shards; what a bucket costs: `budget.rs`, a sliding log by the room it keeps, doubled as it
//! fills up to its limit). A full shard first forgets buckets that are full again (which changes no
//! decision), then evicts in order of what forgetting gives away (`eviction.rs`): buckets not
//! consumed from again after an eviction pass first saw them (a flood's one-off keys, or keys
//! checked twice in a row; the longest to be full again first), then those idle since the shard's
//! last eviction, then those in use; within each, non-denying before denying and the smallest share
//! of capacity consumed first. An evicted key that returns starts full, so it regains at most what
//! it had consumed. A check fails with [`StoreError::Full`] (counted) only when nothing but its own
//! bucket is left to evict.
//!
//! Replication reads what changed from a bounded list of changed keys per shard, filled as
//! buckets become changed (`changed.rs`), so a round costs what changed, not what is held.
//! Besides the buckets' bytes, each shard's list costs at most an eighth of its byte share and
//! at most 96 KiB (64 shards: at most 6 MiB).

mod bucket_state;
mod budget;
mod changed;
mod entries;
mod eviction;
mod metered;
mod remote;
mod shard;
mod slack;
pub mod snapshot;
mod table;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::{RwLock, RwLockWriteGuard};

pub use self::bucket_state::{BucketState, BucketValue};
use self::budget::Bounds;
pub use self::budget::{
    GCRA_BUCKET_BYTES, LOG_BUCKET_BYTES, LOG_TIME_BYTES, WINDOW_BUCKET_BYTES, bucket_bytes,
};
use self::entries::{LogEntry, WindowEntry};
pub use self::metered::Charged;
pub use self::remote::RemoteUse;
use self::shard::{NeedsRoom, Shard, Undo};
use self::table::GcraEntry;
use crate::{Algorithm, BucketKey, Decision, Limit};

/// Sizing of a [`BucketStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreConfig {
    /// Most buckets kept at once, over all shards.
    pub max_keys: usize,
    /// Number of shards (a power of two); more shards, less contention on inserts.
    pub shards: usize,
}

/// The default byte budget of a store ([`BucketStore::with_max_bytes`]): 1 GiB.
pub const DEFAULT_MAX_STORE_BYTES: usize = 1 << 30;
/// Least bytes per shard a budget may give: room for a few logs of the largest limit.
pub const MIN_SHARD_BYTES: usize = 64 << 10;

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            max_keys: 4 << 20,
            shards: 64,
        }
    }
}

/// Why a store could not be built or a check could not be recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("the bucket store has nothing left to evict; the key was not tracked")]
    Full,
    #[error("shards must be a power of two between 1 and 65536, got {0}")]
    BadShardCount(usize),
    #[error("max_keys must be at least the number of shards ({shards}), got {max_keys}")]
    TooFewKeys { max_keys: usize, shards: usize },
    #[error("max_bytes must be at least {least} ({per_shard} per shard), got {max_bytes}")]
    TooFewBytes {
        max_bytes: usize,
        least: usize,
        per_shard: usize,
    },
}

/// One check of a multi-check.
#[derive(Debug, Clone, Copy)]
pub struct BucketCheck {
    pub key: BucketKey,
    pub limit: Limit,
    pub cost: u64,
    /// Decide `cost` but take nothing ([`BucketStore::peek`]): a metered request's check of
    /// the budget it may spend.
    pub peek: bool,
}

/// Counters the store keeps about itself, readable at any time.
#[derive(Debug, Default)]
pub struct StoreStats {
    /// Buckets dropped to make room, whatever their state: the three below together.
    pub evicted: AtomicU64,
    /// Evicted not having been consumed from again after a pass first saw them, not denying.
    pub evicted_new: AtomicU64,
    /// Evicted after they had been consumed from again across a pass (keys that come back),
    /// not denying.
    pub evicted_used: AtomicU64,
    /// Evicted while denying: nothing else was left in their shard.
    pub evicted_denying: AtomicU64,
    /// Buckets forgotten because they were full again (no decision changed).
    pub expired: AtomicU64,
    /// Checks refused because nothing in their shard could be evicted.
    pub refused: AtomicU64,
}

/// A shard and, beside its lock, where its tables' slots live: read without the lock to
/// prefetch a key's slot ahead of time. Updated after every exclusive access; a stale value only
/// makes a prefetch useless, never wrong.
#[repr(align(128))] // one shard per cache line pair: no false sharing between shards
#[derive(Debug)]
struct PaddedShard {
    lock: RwLock<Shard>,
    gcra_slots: SlotsHint,
    window_slots: SlotsHint,
    log_slots: SlotsHint,
}

/// A table's layout (`KeyedTable::layout`) as last published.
#[derive(Debug, Default)]
struct SlotsHint {
    addr: AtomicUsize,
    mask: AtomicUsize,
}

impl SlotsHint {
    fn get(&self) -> (usize, usize) {
        (
            self.addr.load(Ordering::Relaxed),
            self.mask.load(Ordering::Relaxed),
        )
    }

    fn set(&self, (addr, mask): (usize, usize)) {
        self.addr.store(addr, Ordering::Relaxed);
        self.mask.store(mask, Ordering::Relaxed);
    }
}

impl PaddedShard {
    fn new(bounds: Bounds) -> Self {
        PaddedShard {
            lock: RwLock::new(Shard::new(changed::listed_capacity(bounds))),
            gcra_slots: SlotsHint::default(),
            window_slots: SlotsHint::default(),
            log_slots: SlotsHint::default(),
        }
    }

    fn write(&self) -> ShardWriteGuard<'_> {
        ShardWriteGuard {
            guard: self.lock.write(),
            shard: self,
        }
    }
}

/// Exclusive access to a shard that refreshes the prefetch hint when released.
struct ShardWriteGuard<'a> {
    guard: RwLockWriteGuard<'a, Shard>,
    shard: &'a PaddedShard,
}

impl std::ops::Deref for ShardWriteGuard<'_> {
    type Target = Shard;
    fn deref(&self) -> &Shard {
        &self.guard
    }
}

impl std::ops::DerefMut for ShardWriteGuard<'_> {
    fn deref_mut(&mut self) -> &mut Shard {
        &mut self.guard
    }
}

impl Drop for ShardWriteGuard<'_> {
    fn drop(&mut self) {
        self.shard.gcra_slots.set(self.guard.gcra.layout());
        self.shard.window_slots.set(self.guard.windows.layout());
        self.shard.log_slots.set(self.guard.logs.layout());
    }
}

/// Where a bounded expiry sweep ([`BucketStore::sweep_step`]) goes on from: a shard, and a
/// slot in its GCRA table. Held by the one task that sweeps.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SweepCursor {
    shard: usize,
    slot: usize,
}

/// The sharded concurrent bucket map. Share it behind an `Arc`; every method takes `&self`.
#[derive(Debug)]
pub struct BucketStore {
    shards: Box<[PaddedShard]>,
    shard_mask: usize,
    bounds: Bounds,
    stats: StoreStats,
    sweep_cursor: AtomicUsize,
}

impl BucketStore {
    pub fn new(config: StoreConfig) -> Result<Self, StoreError> {
        let StoreConfig { max_keys, shards } = config;
        if !shards.is_power_of_two() || shards > 65_536 {
            return Err(StoreError::BadShardCount(shards));
        }
        if max_keys < shards {
            return Err(StoreError::TooFewKeys { max_keys, shards });
        }
        let bounds = Bounds {
            keys: max_keys / shards,
            bytes: DEFAULT_MAX_STORE_BYTES / shards,
        };
        Ok(BucketStore {
            shards: (0..shards).map(|_| PaddedShard::new(bounds)).collect(),
            shard_mask: shards - 1,
            bounds,
            stats: StoreStats::default(),
            sweep_cursor: AtomicUsize::new(0),
        })
    }

    /// The same store bounded at `max_bytes` of buckets (split evenly over the shards, each of
    /// which must get at least [`MIN_SHARD_BYTES`]).
    pub fn with_max_bytes(mut self, max_bytes: usize) -> Result<Self, StoreError> {
        let shards = self.shards.len();
        let least = MIN_SHARD_BYTES * shards;
        if max_bytes < least {
            return Err(StoreError::TooFewBytes {
                max_bytes,
                least,
                per_shard: MIN_SHARD_BYTES,
            });
        }
        self.bounds.bytes = max_bytes / shards;
        let listed = changed::listed_capacity(self.bounds);
        for shard in self.shards.iter_mut() {
            let shard = shard.lock.get_mut();
            shard.changed = shard.changed.resized(listed);
        }
        Ok(self)
    }

    fn shard_index(&self, key: BucketKey) -> usize {
        key.check as usize & self.shard_mask
    }

    /// Decides one check and records what it consumed.
    pub fn check(
        &self,
        key: BucketKey,
        limit: &Limit,
        cost: u64,
        now_ns: u64,
    ) -> Result<Decision, StoreError> {
        let shard = &self.shards[self.shard_index(key)];
        let existing =
            shard
                .lock
                .read()
                .decide_existing(key, limit, cost, now_ns, self.bounds.bytes);
        match existing {
            Ok(Some((decision, _))) => return Ok(decision),
            Ok(None) => {
                let (decision, consumes) = shard::decide_fresh(limit, now_ns, cost);
                if !consumes {
                    return Ok(decision);
                }
            }
            Err(NeedsRoom(_)) => {}
        }
        let mut shard = shard.write();
        let (decision, _) =
            shard.decide_or_insert(key, limit, cost, now_ns, self.bounds, &self.stats)?;
        Ok(decision)
    }

    /// Starts loading `key`'s bucket under `algorithm` into the cache without waiting for it.
    /// Callers that decide a batch prefetch a few keys ahead, so cache misses on cold keys
    /// overlap instead of adding up. Purely a hint: it reads no bucket and takes no lock. Of a
    /// log, its slot, which holds its first few times; more lie behind it on the heap, a miss no
    /// hint here can start.
    #[inline]
    pub fn prefetch(&self, key: BucketKey, algorithm: Algorithm) {
        let shard = &self.shards[self.shard_index(key)];
        match algorithm {
            Algorithm::Gcra => table::prefetch::<GcraEntry>(shard.gcra_slots.get(), key),
            Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                table::prefetch::<WindowEntry>(shard.window_slots.get(), key);
            }
            Algorithm::SlidingLog => table::prefetch::<LogEntry>(shard.log_slots.get(), key),
        }
    }

    /// For a pass over `items` whose buckets are cold (replicas merged, other regions' deltas
    /// applied): prefetches the buckets [`crate::prefetch::burst_ahead`] names at item `i`.
    #[inline]
    pub fn prefetch_ahead<T>(
        &self,
        items: &[T],
        i: usize,
        bucket: impl Fn(&T) -> (BucketKey, Algorithm),
    ) {
        for next in &items[crate::prefetch::burst_ahead(i, items.len())] {
            let (key, algorithm) = bucket(next);
            self.prefetch(key, algorithm);
        }
    }

    /// Decides several checks all-or-nothing: if any is denied (or can never pass), none of them
    /// consumes. Returns one decision per check, in order; the checks that would have passed
    /// report the bucket as it stays (their cost-0 view). Holds every shard involved exclusively
    /// while deciding, so no other check sees a consumption that is then taken back.
    pub fn check_all(
        &self,
        checks: &[BucketCheck],
        now_ns: u64,
        decisions: &mut Vec<Decision>,
    ) -> Result<bool, StoreError> {
        decisions.clear();
        if let [check] = checks
            && !check.peek
        {
            // A group of one (every global check's, the usual kind 12 group): what the loop
            // below does for it, without its three vectors.
            let mut shard = self.shards[self.shard_index(check.key)].write();
            let (decision, undo) = self.take(&mut shard, check, now_ns)?;
            let allowed = decision.is_allowed();
            if !allowed {
                shard.undo(check.key, undo);
            }
            decisions.push(decision);
            return Ok(allowed);
        }
        let mut indices: Vec<usize> = checks.iter().map(|c| self.shard_index(c.key)).collect();
        indices.sort_unstable();
        indices.dedup();
        // Lock in ascending shard order: two multi-checks can never wait on each other in a cycle.
        let mut guards: Vec<ShardWriteGuard<'_>> =
            indices.iter().map(|&i| self.shards[i].write()).collect();
        let mut undos: Vec<(usize, BucketKey, Undo)> = Vec::with_capacity(checks.len());
        let mut all_allowed = true;
        let mut failure = None;
        for check in checks {
            // The index is present: `indices` holds every check's shard.
            let at = indices
                .binary_search(&self.shard_index(check.key))
                .unwrap_or(0);
            if check.peek {
                let decision = guards[at].peek(check.key, &check.limit, check.cost, now_ns);
                all_allowed &= decision.is_allowed();
                decisions.push(decision);
                continue;
            }
            match self.take(&mut guards[at], check, now_ns) {
                Ok((decision, undo)) => {
                    all_allowed &= decision.is_allowed();
                    decisions.push(decision);
                    undos.push((at, check.key, undo));
                }
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        if all_allowed && failure.is_none() {
            return Ok(true);
        }
        for &(at, key, undo) in undos.iter().rev() {
            guards[at].undo(key, undo);
        }
        if let Some(e) = failure {
            decisions.clear();
            return Err(e);
        }
        for (i, check) in checks.iter().enumerate() {
            if decisions[i].is_allowed() {
                let at = indices
                    .binary_search(&self.shard_index(check.key))
                    .unwrap_or(0);
                // A peek consumes nothing, so it cannot need room and cannot fail.
                if let Ok((peek, _)) = guards[at].decide_or_insert(
                    check.key,
                    &check.limit,
                    0,
                    now_ns,
                    Bounds::NONE,
                    &self.stats,
                ) {
                    decisions[i] = peek;
                }
            }
        }
        Ok(false)
    }

    /// Decides `check` in its shard (held exclusively), inserting its bucket if needed: what
    /// an all-or-nothing group takes, with how to undo it.
    fn take(
        &self,
        shard: &mut Shard,
        check: &BucketCheck,
        now_ns: u64,
    ) -> Result<(Decision, Undo), StoreError> {
        shard.decide_or_insert(
            check.key,
            &check.limit,
            check.cost,
            now_ns,
            self.bounds,
            &self.stats,
        )
    }

    /// Gives back units a request took but did not use (see `Shard::refund`): for requests whose
    /// checks span nodes, where one node denied after another had admitted.
    pub fn refund(&self, key: BucketKey, limit: &Limit, cost: u64, now_ns: u64) {
        self.shards[self.shard_index(key)]
            .lock
            .read()
            .refund(key, limit, cost, now_ns);
    }

    /// The buckets (of every family) changed since the last call and still in use: what an
    /// owner replicates to its successor each round. Costs what changed since the last call,
    /// not what the store holds, unless a shard's list of changed keys overflowed: that shard
    /// is then scanned whole, once. A bucket changed again while this runs may be reported
    /// twice, each time as it then stood.
    pub fn take_changed(&self, now_ns: u64, out: &mut Vec<BucketState>) {
        for shard in self.shards.iter() {
            shard.lock.read().take_changed(now_ns, out);
        }
    }

    /// Every bucket in use whose key passes `filter`: what a node hands over.
    pub fn export(
        &self,
        now_ns: u64,
        filter: &dyn Fn(BucketKey) -> bool,
        out: &mut Vec<BucketState>,
    ) {
        for shard in self.shards.iter() {
            shard.lock.read().export(now_ns, filter, out);
        }
    }

    /// Every bucket in use that `keep` accepts (what a snapshot holds), filtered one shard at a
    /// time so the scratch space is one shard's buckets, not the whole store's.
    pub fn export_matching(
        &self,
        now_ns: u64,
        keep: &dyn Fn(&BucketState) -> bool,
        out: &mut Vec<BucketState>,
    ) {
        let mut scratch = Vec::new();
        for shard in self.shards.iter() {
            shard.lock.read().export(now_ns, &|_| true, &mut scratch);
            out.extend(scratch.drain(..).filter(|state| keep(state)));
        }
    }

    /// Merges buckets received from a peer (the later TAT wins). Returns how many could not be
    /// stored for lack of room.
    pub fn merge(&self, states: &[BucketState], now_ns: u64) -> usize {
        let mut refused = 0;
        for (i, state) in states.iter().enumerate() {
            // A replica's bucket is as cold as a check's (see `prefetch`).
            self.prefetch_ahead(states, i, |s| (s.key, s.value.algorithm()));
            let shard = &self.shards[self.shard_index(state.key)];
            // Most replicas land on a bucket the successor already holds: merged under the
            // shared lock, beside the decisions; only a new bucket takes the shard exclusively.
            if shard.lock.read().merge_existing(state, now_ns) {
                continue;
            }
            let mut shard = shard.write();
            refused += usize::from(!shard.merge(state, now_ns, self.bounds, &self.stats));
        }
        refused
    }

    /// Forgets expired buckets in the next `shard_count` shards (round robin), bounding the work
    /// of one call. Returns how many were forgotten. Changes no decision.
    pub fn sweep_expired(&self, now_ns: u64, shard_count: usize) -> usize {
        let mut forgotten = 0;
        for _ in 0..shard_count.min(self.shards.len()) {
            let i = self.sweep_cursor.fetch_add(1, Ordering::Relaxed) & self.shard_mask;
            forgotten += self.shards[i].write().forget_expired(now_ns);
        }
        self.stats
            .expired
            .fetch_add(forgotten as u64, Ordering::Relaxed);
        forgotten
    }

    /// One bounded step of the expiry sweep: forgets the expired buckets among at most
    /// `max_slots` GCRA slots from `cursor`, then moves `cursor` on (to the next shard once
    /// this one's walk is done). The shard's lock is held for this step only, so a sweep of a
    /// large store pauses each shard briefly, however many keys it holds. Returns how many
    /// were forgotten. Changes no decision.
    pub fn sweep_step(&self, now_ns: u64, cursor: &mut SweepCursor, max_slots: usize) -> usize {
        let shard = cursor.shard & self.shard_mask;
        let (forgotten, next) =
            self.shards[shard]
                .write()
                .forget_expired_from(now_ns, cursor.slot, max_slots.max(1));
        *cursor = match next {
            Some(slot) => SweepCursor { shard, slot },
            None => SweepCursor {
                shard: (shard + 1) & self.shard_mask,
                slot: 0,
            },
        };
        self.stats
            .expired
            .fetch_add(forgotten as u64, Ordering::Relaxed);
        forgotten
    }

    /// How many [`sweep_step`](Self::sweep_step)s of `max_slots` walk the whole store once, as
    /// its tables are sized now (at least one per shard). Read without locks, from the prefetch
    /// hints, so a table resized meanwhile may be counted at its old size.
    pub fn sweep_steps_per_pass(&self, max_slots: usize) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let slots = s.gcra_slots.get().1.saturating_add(1);
                slots.div_ceil(max_slots.max(1))
            })
            .sum()
    }

    /// Buckets currently kept (a snapshot: shards are read one at a time).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock.read().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Most buckets this store keeps.
    pub fn max_keys(&self) -> usize {
        self.bounds.keys * self.shards.len()
    }

    /// Most bytes of buckets this store keeps.
    pub fn max_bytes(&self) -> usize {
        self.bounds.bytes * self.shards.len()
    }

    /// Bytes of buckets held now, as accounted (`budget.rs`; shards are read one at a time).
    pub fn bytes_used(&self) -> usize {
        self.shards.iter().map(|s| s.lock.read().bytes.used()).sum()
    }

    pub fn stats(&self) -> &StoreStats {
        &self.stats
    }
}

#[cfg(test)]
impl BucketStore {
    /// The same store listing at most `listed` changed keys per shard: to make the list
    /// overflow in tests.
    pub(crate) fn with_listed_capacity(mut self, listed: usize) -> Self {
        for shard in self.shards.iter_mut() {
            let shard = shard.lock.get_mut();
            shard.changed = shard.changed.resized(listed);
        }
        self
    }

    /// [`BucketStore::take_changed`] by scanning every bucket's mark, as it was done before the
    /// changed keys were listed: what the list must reproduce.
    pub(crate) fn take_changed_by_scan(&self, now_ns: u64, out: &mut Vec<BucketState>) {
        for shard in self.shards.iter() {
            let shard = shard.lock.read();
            // The list is dropped with the marks: the scan reports them all.
            for _ in shard.changed.drain() {}
            shard.scan_changed(now_ns, out);
        }
    }

    /// What every bucket costs, counted afresh: the running account must equal it.
    pub(crate) fn recount_bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock.read().recount_bytes())
            .sum()
    }
}

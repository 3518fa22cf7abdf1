//! Consumption admitted in another region, applied to this region's bucket of a global key.
//!
//! A global limit is one limit shared by every region: each region's owner of the key decides
//! from its own bucket, and the consumption the other regions admitted reaches it later as
//! deltas (`crate::region`). Applying a delta never refuses (the units were admitted already)
//! and only ever makes the bucket stricter:
//!
//! - GCRA: the TAT moves forward by `units * interval` from `max(tat, now)`, as if the units were
//!   admitted now (they were admitted earlier, so the bucket is charged at least what it would
//!   have been). A TAT is never pushed past one capacity ahead of `now` (the next check would
//!   clamp it back and forget the rest): the units that do not fit are returned, and the caller
//!   keeps them and applies them again as the bucket drains (`apply_remote` once more).
//! - Fixed and sliding windows: the units are added to the window they were admitted in (`at_ns`
//!   of the sender's clock): the current window or the one before; an older window can no
//!   longer weigh and is skipped. Counts may exceed the limit: that only denies.
//! - Sliding log: the units are inserted at their admission time (the log may then hold more
//!   entries than the limit, up to the caller's `max_entries`, newest kept).

use std::sync::atomic::Ordering;

use super::budget::{LOG_BUCKET_BYTES, LOG_TIME_BYTES, bucket_bytes};
use super::changed::gcra_worth_replicating;
use super::shard::{Shard, adopt_limit};
use super::{BucketStore, StoreError};
use crate::algorithm::{SlidingLog, WindowState};
use crate::{Algorithm, BucketKey, Limit};

/// Units admitted in another region for one key, as applied to this region's bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteUse {
    pub units: u64,
    /// When the sender admitted them (its clock; the latest admission when several were
    /// aggregated, which can only make the bucket stricter). Later than `now` is read as `now`.
    pub at_ns: u64,
    /// Most log entries a sliding-log bucket may hold after this (at least the limit).
    pub max_log_entries: usize,
}

impl BucketStore {
    /// Applies consumption admitted in another region to `key`'s bucket under `limit`, creating
    /// the bucket if needed. Returns the units a GCRA bucket could not take without running
    /// more than one capacity ahead (the caller applies them again later); 0 for windows and
    /// logs, which always take everything. Fails only when the bucket is new and the store is
    /// full of denying keys.
    pub fn apply_remote(
        &self,
        key: BucketKey,
        limit: &Limit,
        used: RemoteUse,
        now_ns: u64,
    ) -> Result<u64, StoreError> {
        if used.units == 0 {
            return Ok(0);
        }
        let shard = &self.shards[self.shard_index(key)];
        if let Some(left) = shard
            .lock
            .read()
            .apply_remote_existing(key, limit, used, now_ns)
        {
            return Ok(left);
        }
        let mut shard = shard.write();
        if let Some(left) = shard.apply_remote_existing(key, limit, used, now_ns) {
            return Ok(left);
        }
        let bytes = remote_bucket_bytes(limit, used);
        if !shard.fits(bytes, self.bounds) {
            shard.make_room(now_ns, bytes, self.bounds, None, &self.stats)?;
        }
        Ok(shard.insert_remote(key, limit, used, now_ns))
    }

    /// The units `key`'s GCRA bucket can take now before running one capacity ahead (what
    /// `apply_remote` would absorb); the burst for a key without a bucket. Windows and logs:
    /// unbounded (`u64::MAX`).
    pub fn remote_room(&self, key: BucketKey, limit: &Limit, now_ns: u64) -> u64 {
        if limit.algorithm() != Algorithm::Gcra {
            return u64::MAX;
        }
        let shard = self.shards[self.shard_index(key)].lock.read();
        match shard.gcra.find(key) {
            Some(entry) => gcra_room(limit, entry.tat_ns.load(Ordering::Relaxed), now_ns),
            None => limit.burst(),
        }
    }
}

/// Whole units a GCRA bucket at `tat_ns` can take before its debt passes one capacity.
fn gcra_room(limit: &Limit, tat_ns: u64, now_ns: u64) -> u64 {
    let debt = tat_ns.saturating_sub(now_ns);
    limit.capacity_ns().saturating_sub(debt) / limit.interval_ns()
}

/// The TAT after taking as many of `units` as fit, and the units left over.
fn gcra_take(limit: &Limit, tat_ns: u64, units: u64, now_ns: u64) -> (u64, u64) {
    let taken = units.min(gcra_room(limit, tat_ns, now_ns));
    // taken <= burst, so taken * interval <= capacity <= u64::MAX / 4.
    let tat = tat_ns
        .max(now_ns)
        .saturating_add(taken * limit.interval_ns());
    (tat, units - taken)
}

/// A window state with `units` added to the window `at_ns` falls in, if it still weighs.
fn window_take(state: WindowState, period: u64, at_ns: u64, units: u64) -> WindowState {
    let window = at_ns / period;
    let mut state = state;
    if window == state.window {
        state.count = state.count.saturating_add(units);
    } else if window.saturating_add(1) == state.window {
        state.previous = state.previous.saturating_add(units);
    }
    state
}

/// About what a bucket made from `used` costs: a log holds the units, at most its bound.
fn remote_bucket_bytes(limit: &Limit, used: RemoteUse) -> usize {
    match limit.algorithm() {
        Algorithm::SlidingLog => {
            let most = used.max_log_entries.max(limit.burst() as usize) as u64;
            LOG_BUCKET_BYTES + LOG_TIME_BYTES * used.units.min(most) as usize
        }
        _ => bucket_bytes(limit, 0),
    }
}

impl Shard {
    /// Applies to the key's existing bucket; `None` when it has none. Callable under a shared
    /// lock, like `decide_existing`.
    fn apply_remote_existing(
        &self,
        key: BucketKey,
        limit: &Limit,
        used: RemoteUse,
        now_ns: u64,
    ) -> Option<u64> {
        let at_ns = used.at_ns.min(now_ns);
        match limit.algorithm() {
            Algorithm::Gcra => {
                let entry = self.gcra.find(key)?;
                let mut left = used.units;
                let mut tat_after = 0;
                let _ = entry
                    .tat_ns
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tat| {
                        let (new_tat, rest) = gcra_take(limit, tat, used.units, now_ns);
                        left = rest;
                        tat_after = new_tat;
                        (new_tat != tat).then_some(new_tat)
                    });
                if gcra_worth_replicating(limit, tat_after, now_ns) {
                    self.mark_dirty(entry);
                }
                Some(left)
            }
            Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                let entry = self.windows.find(key)?;
                let mut slot = entry.slot.lock();
                adopt_limit(&mut slot, limit, now_ns);
                let period = limit.period_ns();
                let current = slot.1.rebase(period, period, now_ns);
                slot.1 = window_take(current, period, at_ns, used.units);
                self.mark_window_changed(entry, limit, &slot.1, now_ns);
                Some(0)
            }
            Algorithm::SlidingLog => {
                let entry = self.logs.find(key)?;
                let mut slot = entry.slot.lock();
                slot.0 = limit.packed();
                let most = used.max_log_entries.max(limit.burst() as usize);
                // Admitted elsewhere already: recorded even past the budget, which the next
                // new key's eviction restores.
                self.bytes.tracking(&mut slot.1, |log| {
                    log.record_elsewhere(limit, at_ns, used.units, most, now_ns)
                });
                self.mark_log_changed(entry, limit, &slot.1, now_ns);
                Some(0)
            }
        }
    }

    /// Creates the key's bucket holding only the remote units (the caller made room).
    fn insert_remote(
        &mut self,
        key: BucketKey,
        limit: &Limit,
        used: RemoteUse,
        now_ns: u64,
    ) -> u64 {
        let at_ns = used.at_ns.min(now_ns);
        match limit.algorithm() {
            Algorithm::Gcra => {
                let (tat, left) = gcra_take(limit, 0, used.units, now_ns);
                self.insert_changed_gcra(key, limit, tat, now_ns);
                left
            }
            Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                let period = limit.period_ns();
                let empty = WindowState {
                    window: now_ns / period,
                    count: 0,
                    previous: 0,
                };
                let state = window_take(empty, period, at_ns, used.units);
                self.insert_changed_window(key, limit, state, now_ns);
                0
            }
            Algorithm::SlidingLog => {
                let mut log = SlidingLog::default();
                let most = used.max_log_entries.max(limit.burst() as usize);
                log.record_elsewhere(limit, at_ns, used.units, most, now_ns);
                self.insert_changed_log(key, limit, log, now_ns);
                0
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Clock, FakeClock, NANOS_PER_SEC as S, StoreConfig};

    fn store() -> BucketStore {
        BucketStore::new(StoreConfig {
            max_keys: 64,
            shards: 4,
        })
        .unwrap()
    }

    fn used(units: u64, at_ns: u64) -> RemoteUse {
        RemoteUse {
            units,
            at_ns,
            max_log_entries: 0,
        }
    }

    /// Admits cost-1 checks until one is denied; returns how many passed.
    fn admit_all(store: &BucketStore, key: BucketKey, limit: &Limit, now: u64) -> u64 {
        let mut n = 0;
        while store.check(key, limit, 1, now).unwrap().is_allowed() {
            n += 1;
            assert!(n <= limit.burst(), "more than the burst passed");
        }
        n
    }

    #[test]
    fn gcra_remote_units_push_the_tat_and_the_rest_comes_back() {
        let clock = FakeClock::new(100 * S);
        let store = store();
        let key = BucketKey::for_key(b"g");
        let limit = Limit::gcra(10, S, 10).unwrap();
        // 4 units used elsewhere: 6 remain here.
        assert_eq!(
            store.apply_remote(key, &limit, used(4, 0), clock.now_ns()),
            Ok(0)
        );
        assert_eq!(store.remote_room(key, &limit, clock.now_ns()), 6);
        assert_eq!(admit_all(&store, key, &limit, clock.now_ns()), 6);
        // A full bucket takes nothing more: every unit comes back to the caller.
        assert_eq!(
            store.apply_remote(key, &limit, used(3, 0), clock.now_ns()),
            Ok(3)
        );
        // A second later it has drained 10 units: it takes the 3, and 7 remain.
        clock.advance(S);
        assert_eq!(
            store.apply_remote(key, &limit, used(3, 0), clock.now_ns()),
            Ok(0)
        );
        assert_eq!(admit_all(&store, key, &limit, clock.now_ns()), 7);
    }

    #[test]
    fn gcra_never_runs_more_than_one_capacity_ahead() {
        let clock = FakeClock::new(5 * S);
        let store = store();
        let key = BucketKey::for_key(b"g");
        let limit = Limit::gcra(10, S, 5).unwrap();
        assert_eq!(
            store.apply_remote(key, &limit, used(u64::MAX, 0), clock.now_ns()),
            Ok(u64::MAX - 5)
        );
        let d = store.check(key, &limit, 1, clock.now_ns()).unwrap();
        assert!(!d.is_allowed());
        assert!(d.retry_after_ns().unwrap() <= limit.capacity_ns());
    }

    #[test]
    fn windows_count_remote_units_in_the_window_they_were_admitted_in() {
        let clock = FakeClock::new(10 * S + S / 2);
        let store = store();
        let key = BucketKey::for_key(b"w");
        let fixed = Limit::window(Algorithm::FixedWindow, 10, S).unwrap();
        let now = clock.now_ns();
        // 3 admitted this window elsewhere, 4 in the window before (a fixed window ignores it),
        // 100 two windows ago (weighs nothing).
        store
            .apply_remote(key, &fixed, used(3, 10 * S + 1), now)
            .unwrap();
        store
            .apply_remote(key, &fixed, used(4, 9 * S), now)
            .unwrap();
        store
            .apply_remote(key, &fixed, used(100, 8 * S), now)
            .unwrap();
        assert_eq!(admit_all(&store, key, &fixed, now), 7);

        let sliding = Limit::window(Algorithm::SlidingWindow, 10, S).unwrap();
        let key = BucketKey::for_key(b"s");
        // Half-way through window 10: the 4 units of window 9 weigh 2.
        store
            .apply_remote(key, &sliding, used(4, 9 * S), now)
            .unwrap();
        store
            .apply_remote(key, &sliding, used(3, now), now)
            .unwrap();
        assert_eq!(admit_all(&store, key, &sliding, now), 5);
    }

    #[test]
    fn a_window_count_above_the_limit_only_denies() {
        let clock = FakeClock::new(3 * S);
        let store = store();
        let key = BucketKey::for_key(b"w");
        let limit = Limit::window(Algorithm::FixedWindow, 5, S).unwrap();
        store
            .apply_remote(key, &limit, used(50, 3 * S), clock.now_ns())
            .unwrap();
        assert_eq!(admit_all(&store, key, &limit, clock.now_ns()), 0);
        clock.advance(S);
        assert_eq!(admit_all(&store, key, &limit, clock.now_ns()), 5);
    }

    #[test]
    fn a_log_holds_remote_times_and_lets_them_leave_in_order() {
        let clock = FakeClock::new(20 * S);
        let store = store();
        let key = BucketKey::for_key(b"l");
        let limit = Limit::window(Algorithm::SlidingLog, 4, S).unwrap();
        let now = clock.now_ns();
        let at = |units, at_ns| RemoteUse {
            units,
            at_ns,
            max_log_entries: 8,
        };
        store
            .apply_remote(key, &limit, at(3, now - S / 2), now)
            .unwrap();
        store
            .apply_remote(key, &limit, at(3, now - S / 4), now)
            .unwrap();
        // Six in the period, the limit four: denied until four of them have left.
        assert_eq!(admit_all(&store, key, &limit, now), 0);
        clock.set(now + S / 2);
        assert_eq!(admit_all(&store, key, &limit, clock.now_ns()), 1);
        clock.set(now + 3 * S / 4);
        assert_eq!(admit_all(&store, key, &limit, clock.now_ns()), 3);
        // A time older than the period is skipped; one in the future counts as now.
        let key = BucketKey::for_key(b"l2");
        store
            .apply_remote(key, &limit, at(2, 0), clock.now_ns())
            .unwrap();
        store
            .apply_remote(key, &limit, at(2, u64::MAX), clock.now_ns())
            .unwrap();
        assert_eq!(admit_all(&store, key, &limit, clock.now_ns()), 2);
    }

    #[test]
    fn a_log_keeps_at_most_its_entry_cap() {
        let clock = FakeClock::new(20 * S);
        let store = store();
        let key = BucketKey::for_key(b"l");
        let limit = Limit::window(Algorithm::SlidingLog, 4, S).unwrap();
        let now = clock.now_ns();
        let used = RemoteUse {
            units: 1_000_000,
            at_ns: now,
            max_log_entries: 6,
        };
        store.apply_remote(key, &limit, used, now).unwrap();
        let mut states = Vec::new();
        store.export(now, &|_| true, &mut states);
        match &states[0].value {
            crate::BucketValue::Log { times_ns, .. } => assert_eq!(times_ns.len(), 6),
            other => panic!("not a log: {other:?}"),
        }
    }

    #[test]
    fn a_full_store_of_denying_keys_evicts_one_for_a_new_remote_key() {
        let store = BucketStore::new(StoreConfig {
            max_keys: 1,
            shards: 1,
        })
        .unwrap();
        let limit = Limit::gcra(1, S, 1).unwrap();
        let now = 7 * S;
        store
            .check(BucketKey::for_key(b"a"), &limit, 1, now)
            .unwrap();
        assert_eq!(
            store.apply_remote(BucketKey::for_key(b"b"), &limit, used(1, now), now),
            Ok(0)
        );
        assert_eq!(store.len(), 1);
        assert_eq!(store.stats().evicted_denying.load(Ordering::Relaxed), 1);
    }
}

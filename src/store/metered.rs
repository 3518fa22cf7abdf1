//! Metered costs: a cost known only after the response, charged after the fact, and the check
//! that asks before the request whether a key has budget left for it.
//!
//! - [`BucketStore::peek`] decides a cost without taking it: the check made before a metered
//!   request (is there at least the estimate left?), with the wait the answer would have.
//! - [`BucketStore::charge`] takes a cost that was already spent, never refusing, so a bucket
//!   may end up owing (a GCRA TAT past one capacity, a window over its limit, a log over its
//!   limit). Every check is denied until the debt is repaid; `retry_after` says when. A bucket
//!   owes at most one capacity (one limit), so no wait exceeds two; what a charge would add
//!   beyond that is forgiven and reported.

use std::sync::atomic::Ordering;

use super::entries::decide_window;
use super::shard::{Shard, adopt_limit, decide_fresh};
use super::{BucketStore, StoreError};
use crate::algorithm::{SlidingLog, WindowState, gcra};
use crate::{Algorithm, BucketKey, Decision, Limit};

/// What a charge did: the bucket as it now stands (a cost-0 check: denied while it owes), and
/// the units forgiven past the most a bucket may owe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charged {
    pub decision: Decision,
    pub forgiven: u64,
}

impl BucketStore {
    /// What a check of `cost` would answer now, taking nothing (and making no bucket).
    pub fn peek(&self, key: BucketKey, limit: &Limit, cost: u64, now_ns: u64) -> Decision {
        self.shards[self.shard_index(key)]
            .lock
            .read()
            .peek(key, limit, cost, now_ns)
    }

    /// Takes `cost` units from `key`'s bucket after the fact (see the module doc), creating the
    /// bucket if needed. Fails only when the bucket is new and the store is full of denying
    /// keys.
    pub fn charge(
        &self,
        key: BucketKey,
        limit: &Limit,
        cost: u64,
        now_ns: u64,
    ) -> Result<Charged, StoreError> {
        let shard = &self.shards[self.shard_index(key)];
        let existing = shard.lock.read().charge_existing(key, limit, cost, now_ns);
        let forgiven = match existing {
            Some(forgiven) => forgiven,
            None if cost == 0 => 0,
            None => {
                let mut shard = shard.write();
                match shard.charge_existing(key, limit, cost, now_ns) {
                    Some(forgiven) => forgiven,
                    None => {
                        let bytes = charged_bucket_bytes(limit, cost);
                        if !shard.fits(bytes, self.bounds) {
                            shard.make_room(now_ns, bytes, self.bounds, None, &self.stats)?;
                        }
                        shard.insert_charged(key, limit, cost, now_ns)
                    }
                }
            }
        };
        Ok(Charged {
            decision: self.peek(key, limit, 0, now_ns),
            forgiven,
        })
    }
}

/// About what a bucket made by a charge of `cost` costs: a log holds the units, at most twice
/// its limit.
fn charged_bucket_bytes(limit: &Limit, cost: u64) -> usize {
    match limit.algorithm() {
        Algorithm::SlidingLog => {
            let most = limit.burst().saturating_mul(2);
            super::budget::LOG_BUCKET_BYTES
                + super::budget::LOG_TIME_BYTES * cost.min(most) as usize
        }
        _ => super::budget::bucket_bytes(limit, 0),
    }
}

impl Shard {
    /// [`BucketStore::peek`] on this shard. Callable under a shared lock.
    pub(super) fn peek(&self, key: BucketKey, limit: &Limit, cost: u64, now_ns: u64) -> Decision {
        let found = match limit.algorithm() {
            Algorithm::Gcra => self.gcra.find(key).map(|entry| {
                let tat = entry.tat_ns.load(Ordering::Relaxed);
                gcra::decide(limit, tat, now_ns, cost).0
            }),
            Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                self.windows.find(key).map(|entry| {
                    // A copy: a peek changes nothing, not even the limit a bucket was kept under.
                    let mut slot = *entry.slot.lock();
                    adopt_limit(&mut slot, limit, now_ns);
                    decide_window(limit, &slot.1, now_ns, cost).0
                })
            }
            Algorithm::SlidingLog => self
                .logs
                .find(key)
                .map(|entry| entry.slot.lock().1.peek(limit, now_ns, cost)),
        };
        found.unwrap_or_else(|| decide_fresh(limit, now_ns, cost).0)
    }

    /// Charges the key's existing bucket; `None` when it has none. Returns the units forgiven.
    /// Callable under a shared lock, like `decide_existing`.
    fn charge_existing(
        &self,
        key: BucketKey,
        limit: &Limit,
        cost: u64,
        now_ns: u64,
    ) -> Option<u64> {
        match limit.algorithm() {
            Algorithm::Gcra => {
                let entry = self.gcra.find(key)?;
                let mut forgiven = 0;
                let mut tat_after = 0;
                let _ = entry
                    .tat_ns
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tat| {
                        let (new_tat, rest) = gcra::charge(limit, tat, now_ns, cost);
                        forgiven = rest;
                        tat_after = new_tat;
                        (new_tat != tat).then_some(new_tat)
                    });
                self.mark_gcra_changed(entry, limit, tat_after, now_ns);
                Some(forgiven)
            }
            Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                let entry = self.windows.find(key)?;
                let mut slot = entry.slot.lock();
                adopt_limit(&mut slot, limit, now_ns);
                let (state, forgiven) = slot.1.charge(limit, now_ns, cost);
                slot.1 = state;
                self.mark_window_changed(entry, limit, &state, now_ns);
                entry.used.store(true, Ordering::Relaxed);
                Some(forgiven)
            }
            Algorithm::SlidingLog => {
                let entry = self.logs.find(key)?;
                let mut slot = entry.slot.lock();
                slot.0 = limit.packed();
                // Spent already: recorded even past the budget, which the next new key's
                // eviction restores (as for units admitted in another region).
                let forgiven = self
                    .bytes
                    .tracking(&mut slot.1, |log| log.charge(limit, now_ns, cost));
                self.mark_log_changed(entry, limit, &slot.1, now_ns);
                entry.used.store(true, Ordering::Relaxed);
                Some(forgiven)
            }
        }
    }

    /// Creates the key's bucket holding only the charge (the caller made room). Returns the
    /// units forgiven.
    fn insert_charged(&mut self, key: BucketKey, limit: &Limit, cost: u64, now_ns: u64) -> u64 {
        match limit.algorithm() {
            Algorithm::Gcra => {
                let (tat, forgiven) = gcra::charge(limit, 0, now_ns, cost);
                self.insert_changed_gcra(key, limit, tat, now_ns);
                forgiven
            }
            Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                let (state, forgiven) = WindowState::default().charge(limit, now_ns, cost);
                self.insert_changed_window(key, limit, state, now_ns);
                forgiven
            }
            Algorithm::SlidingLog => {
                let mut log = SlidingLog::default();
                let forgiven = log.charge(limit, now_ns, cost);
                self.insert_changed_log(key, limit, log, now_ns);
                forgiven
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{NANOS_PER_SEC as S, StoreConfig};

    const NOW: u64 = 1_000 * S;

    fn store() -> BucketStore {
        BucketStore::new(StoreConfig {
            max_keys: 1 << 10,
            shards: 4,
        })
        .unwrap()
    }

    fn limits() -> [Limit; 4] {
        [
            Limit::gcra(10, S, 10).unwrap(),
            Limit::window(Algorithm::FixedWindow, 10, S).unwrap(),
            Limit::window(Algorithm::SlidingWindow, 10, S).unwrap(),
            Limit::window(Algorithm::SlidingLog, 10, S).unwrap(),
        ]
    }

    /// Every algorithm: a peek takes nothing, a charge past what is left is taken whole and
    /// denies (peeks too) until repaid, and at most one limit is owed.
    #[test]
    fn a_charge_is_taken_whole_and_denies_until_repaid() {
        for limit in limits() {
            let store = store();
            let key = BucketKey::for_key(limit.algorithm().name().as_bytes());
            for _ in 0..3 {
                assert!(store.peek(key, &limit, 10, NOW).is_allowed(), "{limit}");
            }
            assert!(store.is_empty(), "a peek makes no bucket");
            assert!(store.check(key, &limit, 4, NOW).unwrap().is_allowed());
            assert!(!store.peek(key, &limit, 7, NOW).is_allowed(), "{limit}");
            assert!(store.peek(key, &limit, 6, NOW).is_allowed(), "{limit}");
            // 4 taken, 9 charged: 3 owed.
            let charged = store.charge(key, &limit, 9, NOW).unwrap();
            assert_eq!(charged.forgiven, 0, "{limit}");
            let wait = charged.decision.retry_after_ns().expect("owing denies");
            assert!(wait > 0 && wait <= 2 * S, "{limit}: {wait}");
            assert!(!store.check(key, &limit, 1, NOW).unwrap().is_allowed());
            // Owing at most one limit: 20 in all, the rest forgiven.
            let charged = store.charge(key, &limit, 15, NOW).unwrap();
            assert_eq!(charged.forgiven, 8, "{limit}");
            // Two periods on, every debt is repaid.
            assert!(
                store
                    .check(key, &limit, 10, NOW + 2 * S)
                    .unwrap()
                    .is_allowed()
            );
        }
    }

    /// A charge to a key without a bucket makes one; a charge of 0 makes none.
    #[test]
    fn a_charge_makes_the_bucket_it_needs() {
        for limit in limits() {
            let store = store();
            let key = BucketKey::for_key(b"new");
            let charged = store.charge(key, &limit, 0, NOW).unwrap();
            assert!(charged.decision.is_allowed());
            assert!(store.is_empty());
            let charged = store.charge(key, &limit, 12, NOW).unwrap();
            assert!(!charged.decision.is_allowed(), "{limit}");
            assert_eq!(store.len(), 1);
            assert_eq!(store.bytes_used(), store.recount_bytes(), "{limit}");
        }
    }
}

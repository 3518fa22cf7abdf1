//! What each bucket costs in bytes, and a shard's account of them against its share of the budget.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::entries::{LogEntry, WindowEntry};
use super::table::GcraEntry;
use crate::algorithm::SlidingLog;
use crate::{Algorithm, Limit};

/// A GCRA bucket: its slot at the lowest load a table has after it grew (3/8), so the charge
/// also covers the empty slots open addressing keeps.
pub const GCRA_BUCKET_BYTES: usize = size_of::<GcraEntry>() * 8 / 3;
/// A window bucket: its slot at the lowest load its table has after it grew (3/8), as a GCRA
/// bucket's.
pub const WINDOW_BUCKET_BYTES: usize = size_of::<WindowEntry>() * 8 / 3;
/// A sliding-log bucket before the times it keeps on the heap: its slot (with the first few
/// times in place) at the lowest load its table has after it grew (3/8), as the others'.
pub const LOG_BUCKET_BYTES: usize = size_of::<LogEntry>() * 8 / 3;
/// Each admission time a log has room for.
pub const LOG_TIME_BYTES: usize = size_of::<u64>();

/// What a log bucket costs as it is now: its entry (with the few times it keeps in place) and
/// every time it has room for on the heap.
pub(super) fn log_bytes(log: &SlidingLog) -> usize {
    LOG_BUCKET_BYTES + LOG_TIME_BYTES * log.heap_room()
}

/// What a new bucket of `limit` made by an admission of `cost` costs (a log is made with the
/// room [`SlidingLog::first_for`] gives, and grows as it fills).
pub fn bucket_bytes(limit: &Limit, cost: u64) -> usize {
    match limit.algorithm() {
        Algorithm::Gcra => GCRA_BUCKET_BYTES,
        Algorithm::FixedWindow | Algorithm::SlidingWindow => WINDOW_BUCKET_BYTES,
        Algorithm::SlidingLog => {
            LOG_BUCKET_BYTES + LOG_TIME_BYTES * SlidingLog::first_heap_room(limit, cost)
        }
    }
}

/// The bytes one shard's buckets cost. Changed under the shard's exclusive lock, or by a log
/// growing under the shared one ([`Account::try_charge`]): one atomic add, never a lock.
#[derive(Debug, Default)]
pub(super) struct Account {
    used: AtomicUsize,
}

impl Account {
    pub(super) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    pub(super) fn charge(&self, bytes: usize) {
        self.used.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(super) fn release(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Charges `bytes` if the account stays within `max`; false (nothing charged) otherwise.
    pub(super) fn try_charge(&self, bytes: usize, max: usize) -> bool {
        let before = self.used.fetch_add(bytes, Ordering::Relaxed);
        if before.saturating_add(bytes) <= max {
            return true;
        }
        self.used.fetch_sub(bytes, Ordering::Relaxed);
        false
    }

    /// Runs `f` on a log and charges (or releases) what its heap room for times changed by.
    pub(super) fn tracking<R>(
        &self,
        log: &mut SlidingLog,
        f: impl FnOnce(&mut SlidingLog) -> R,
    ) -> R {
        let before = log.heap_room();
        let result = f(log);
        let after = log.heap_room();
        if after > before {
            self.charge((after - before) * LOG_TIME_BYTES);
        } else {
            self.release((before - after) * LOG_TIME_BYTES);
        }
        result
    }
}

/// A shard's bounds: most buckets and most bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Bounds {
    pub(super) keys: usize,
    pub(super) bytes: usize,
}

impl Bounds {
    /// No bound: for peeks, which never make a bucket.
    pub(super) const NONE: Bounds = Bounds {
        keys: usize::MAX,
        bytes: usize::MAX,
    };
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::algorithm::sliding_log;
    use crate::store::MIN_SHARD_BYTES;
    use crate::{BucketKey, BucketStore, NANOS_PER_SEC as S, StoreConfig};

    const HOUR: u64 = 3_600 * S;
    const NOW: u64 = 1_000 * S;

    fn key(name: &str) -> BucketKey {
        BucketKey::for_key(name.as_bytes())
    }

    fn one_shard(max_keys: usize, max_bytes: usize) -> BucketStore {
        BucketStore::new(StoreConfig {
            max_keys,
            shards: 1,
        })
        .unwrap()
        .with_max_bytes(max_bytes)
        .unwrap()
    }

    fn log(burst: u64) -> Limit {
        Limit::new(Algorithm::SlidingLog, burst, HOUR, burst).unwrap()
    }

    /// The account moves by exactly what each bucket costs: up with every insert and with a
    /// log's growth, down with expiry, and always equal to a recount.
    #[test]
    fn bytes_follow_inserts_growth_and_expiry() {
        let store = one_shard(1 << 10, 1 << 20);
        assert_eq!(store.bytes_used(), 0);
        store
            .check(key("g"), &Limit::gcra(10, HOUR, 10).unwrap(), 1, NOW)
            .unwrap();
        assert_eq!(store.bytes_used(), GCRA_BUCKET_BYTES);
        let window = Limit::new(Algorithm::FixedWindow, 10, HOUR, 10).unwrap();
        store.check(key("w"), &window, 1, NOW).unwrap();
        assert_eq!(store.bytes_used(), GCRA_BUCKET_BYTES + WINDOW_BUCKET_BYTES);
        // A log keeps its first few times in place, then has room for them on the heap, doubled
        // as it fills: at least to what an admission needs, at most to its limit (a raised limit
        // lets it grow on).
        store.check(key("l"), &log(10), 1, NOW).unwrap();
        let base = GCRA_BUCKET_BYTES + WINDOW_BUCKET_BYTES + LOG_BUCKET_BYTES;
        let room = |times: usize| base + times * LOG_TIME_BYTES;
        assert_eq!(store.bytes_used(), room(0));
        for (cost, after) in [(3, 0), (1, 2 * sliding_log::FIRST_ROOM), (5, 10)] {
            assert!(
                store
                    .check(key("l"), &log(10), cost, NOW)
                    .unwrap()
                    .is_allowed()
            );
            assert_eq!(store.bytes_used(), room(after), "after a cost of {cost}");
        }
        assert!(
            store
                .check(key("l"), &log(100), 50, NOW)
                .unwrap()
                .is_allowed()
        );
        assert_eq!(store.bytes_used(), room(60));
        assert_eq!(store.bytes_used(), store.recount_bytes());
        // A denied admission needs no room.
        assert!(
            !store
                .check(key("l"), &log(100), 41, NOW)
                .unwrap()
                .is_allowed()
        );
        assert_eq!(store.bytes_used(), room(60));
        assert_eq!(store.bytes_used(), store.recount_bytes());
        store.sweep_expired(NOW + 2 * HOUR, 1);
        assert_eq!(store.len(), 0);
        assert_eq!(store.bytes_used(), 0);
    }

    /// A caller filling a small budget with logs of the largest limit: every check is decided,
    /// the account never passes the budget, and it matches a recount after every eviction.
    #[test]
    fn expensive_logs_evict_each_other_within_the_budget() {
        let store = one_shard(1 << 20, MIN_SHARD_BYTES);
        let expensive = log(1_000);
        for i in 0..100 {
            let decision = store.check(key(&format!("log{i}")), &expensive, 1_000, NOW);
            assert!(decision.unwrap().is_allowed(), "log{i} was not decided");
            assert!(store.bytes_used() <= store.max_bytes());
            assert_eq!(store.bytes_used(), store.recount_bytes());
        }
        let stats = store.stats();
        assert!(stats.evicted.load(Ordering::Relaxed) > 0);
        assert_eq!(stats.refused.load(Ordering::Relaxed), 0);
    }

    /// A log that must grow past the bytes left makes room under the exclusive lock (evicting
    /// other buckets, never its own) and is then decided.
    #[test]
    fn a_log_growing_past_the_budget_evicts_others() {
        let store = one_shard(1 << 20, MIN_SHARD_BYTES);
        store.check(key("grows"), &log(1), 1, NOW).unwrap();
        let gcra = Limit::gcra(10, HOUR, 10).unwrap();
        let mut i = 0;
        while store.bytes_used() + GCRA_BUCKET_BYTES <= store.max_bytes() {
            store.check(key(&format!("g{i}")), &gcra, 1, NOW).unwrap();
            i += 1;
        }
        assert_eq!(store.stats().evicted.load(Ordering::Relaxed), 0);
        let grown = store.check(key("grows"), &log(1_000), 999, NOW).unwrap();
        assert!(grown.is_allowed());
        assert_eq!(grown.remaining(), 0);
        assert!(store.bytes_used() <= store.max_bytes());
        assert_eq!(store.bytes_used(), store.recount_bytes());
        assert!(store.stats().evicted.load(Ordering::Relaxed) > 0);
    }

    /// Eviction order: expired buckets go without evicting anything; then keys not consumed
    /// from again across a pass, the longest to be full again first and denying ones after the
    /// rest; a key that came back (in use or idle since) stays while new ones are left, even
    /// with a smaller share consumed.
    #[test]
    fn eviction_takes_expired_then_new_keys_and_spares_returning_ones() {
        let store = one_shard(4, 1 << 20);
        let tenth = Limit::gcra(10, HOUR, 10).unwrap();
        let short = Limit::gcra(1, S, 1).unwrap();
        let strict = Limit::gcra(1, HOUR, 1).unwrap();
        let remaining = |name: &str, limit: &Limit, now| {
            store.check(key(name), limit, 0, now).unwrap().remaining()
        };
        store.check(key("expires"), &short, 1, NOW).unwrap();
        store.check(key("new"), &tenth, 5, NOW).unwrap();
        store.check(key("returning"), &tenth, 1, NOW).unwrap();
        store.check(key("denying"), &strict, 1, NOW).unwrap();
        let later = NOW + 2 * S;
        store.check(key("f"), &tenth, 9, later).unwrap();
        assert_eq!(store.stats().evicted.load(Ordering::Relaxed), 0);
        assert_eq!(store.stats().expired.load(Ordering::Relaxed), 1);
        // `f` holds its room longest (9 of 10 taken): it goes before `new` (5 of 10).
        store.check(key("g"), &tenth, 1, later).unwrap();
        // `returning` comes back after the pass that saw it.
        store.check(key("returning"), &tenth, 1, later).unwrap();
        assert_eq!(remaining("f", &tenth, later), 10, "f was kept");
        assert_eq!(remaining("new", &tenth, later), 5);
        assert_eq!(remaining("returning", &tenth, later), 8);
        // Idle since that pass, `returning` still outlasts every new key, denying or not.
        for name in ["h", "i", "j", "k"] {
            store.check(key(name), &tenth, 9, later).unwrap();
            assert_eq!(
                remaining("returning", &tenth, later),
                8,
                "evicted for {name}"
            );
        }
        assert_eq!(
            remaining("denying", &strict, later),
            0,
            "denying went before new ones"
        );
        let stats = store.stats();
        assert_eq!(stats.evicted.load(Ordering::Relaxed), 5);
        assert_eq!(stats.evicted_new.load(Ordering::Relaxed), 5);
        assert_eq!(stats.evicted_used.load(Ordering::Relaxed), 0);
        assert_eq!(stats.evicted_denying.load(Ordering::Relaxed), 0);
    }

    /// An attacker checks each junk key twice in a row, as a returning key is checked, beside a
    /// key that came back across passes and is idle now. The junk stays on probation and goes
    /// first: the returning key keeps its count. Ranking a second check as a return evicted it
    /// as soon as the flood's one-off keys were gone.
    #[test]
    fn junk_checked_twice_does_not_outrank_a_returning_key() {
        let store = one_shard(64, 1 << 20);
        let limit = Limit::gcra(10, HOUR, 10).unwrap();
        let remaining = |now| {
            store
                .check(key("returning"), &limit, 0, now)
                .unwrap()
                .remaining()
        };
        // One-off keys checked later than `returning` hold their room longer: they go first.
        let mut one_off = 0;
        let mut flood = |now, store: &BucketStore| {
            for _ in 0..64 {
                store
                    .check(key(&format!("one-off{one_off}")), &limit, 1, now)
                    .unwrap();
                one_off += 1;
            }
        };
        store.check(key("returning"), &limit, 1, NOW).unwrap();
        flood(NOW + S, &store);
        store
            .check(key("returning"), &limit, 1, NOW + 2 * S)
            .unwrap();
        flood(NOW + 3 * S, &store);
        assert_eq!(remaining(NOW + 3 * S), 8, "evicted before it came back");
        let later = NOW + 4 * S;
        for i in 0..1_000 {
            let junk = key(&format!("junk{i}"));
            store.check(junk, &limit, 1, later).unwrap();
            store.check(junk, &limit, 1, later).unwrap();
            assert_eq!(
                remaining(later),
                8,
                "the returning key was evicted for junk{i}"
            );
        }
    }

    /// A flood of one-off keys beside a key in use, whose fixed window is partly used when room
    /// is made: the flood evicts its own keys, so the live key never admits more than its limit
    /// in a window. Ranking by share alone evicted the live window (a fifth used) before the
    /// flood's keys (a quarter each), and the window started again from zero.
    #[test]
    fn a_flood_evicts_its_own_keys_not_a_live_partly_used_window() {
        let store = one_shard(64, 1 << 20);
        let window = Limit::new(Algorithm::FixedWindow, 25, S, 25).unwrap();
        let junk = Limit::gcra(5, HOUR, 5).unwrap();
        let tick = S / 100;
        let (mut current, mut admitted, mut worst) = (u64::MAX, 0, 0);
        for step in 0..1_000u64 {
            let now = NOW + step * tick;
            if now / S != current {
                (current, admitted) = (now / S, 0);
            }
            // Faster than the live key is checked, and first: passes also come between its
            // checks, and forget its window once it ended, so it starts new every second.
            for j in 0..8 {
                store
                    .check(key(&format!("junk{step}-{j}")), &junk, 1, now)
                    .unwrap();
            }
            if store
                .check(key("live"), &window, 1, now)
                .unwrap()
                .is_allowed()
            {
                admitted += 1;
                worst = worst.max(admitted);
            }
        }
        assert!(store.stats().evicted.load(Ordering::Relaxed) > 5_000);
        assert_eq!(worst, 25, "the live window admitted {worst} of 25");
    }

    /// State loaded from a snapshot or received from a peer goes through the same budget: a
    /// store of many full logs merged into a small one stays within the small one's bytes.
    #[test]
    fn merged_state_stays_within_the_budget() {
        let big = one_shard(1 << 20, 64 << 20);
        let expensive = log(1_000);
        for i in 0..200 {
            big.check(key(&format!("log{i}")), &expensive, 1_000, NOW)
                .unwrap();
        }
        let mut states = Vec::new();
        big.export(NOW, &|_| true, &mut states);
        assert_eq!(states.len(), 200);
        let small = one_shard(1 << 20, MIN_SHARD_BYTES);
        assert_eq!(small.merge(&states, NOW), 0);
        assert!(!small.is_empty());
        assert!(small.bytes_used() <= small.max_bytes());
        assert_eq!(small.bytes_used(), small.recount_bytes());
    }

    /// The charges docs/OPERATIONS.md quotes for sizing a node: a GCRA bucket 64 bytes, a
    /// window bucket 170 (its 64-byte slot at 3/8 load), a log 213 (its 80-byte slot at 3/8
    /// load, up to 4 times in place) before the times it has room for on the heap.
    #[test]
    fn charges_are_the_documented_ones() {
        assert_eq!(GCRA_BUCKET_BYTES, 64);
        assert_eq!(WINDOW_BUCKET_BYTES, 170);
        assert_eq!(LOG_BUCKET_BYTES, 213);
    }
}

//! The keys whose buckets became changed since the last replication round, listed as they
//! change, so that a round costs what changed rather than what the shard holds.
//!
//! A bucket's changed mark (`dirty`) is set through [`Shard::mark_dirty`] (or
//! [`Shard::mark_gcra_changed`]), or by inserting it changed ([`Shard::insert_gcra`] and its
//! siblings): each lists the key when the mark goes from clear to set, so every marked bucket
//! is listed, or its shard overflowed. The entries' own setters (`entries::Dirty`) are
//! `#[must_use]`, so the listing cannot be dropped by accident. A key may be listed twice
//! (evicted and made again while marked, or two racing markers): the second lookup finds its
//! mark clear and skips it. A listed bucket since evicted or expired is not found and skipped.
//!
//! A bucket is marked only once it is worth replicating: more than a sixteenth of its capacity
//! used ([`gcra_worth_replicating`]: its TAT's lead; [`count_worth_replicating`]: a window's or
//! log's units counted now). One within that of full is left out of the rounds (most keys of a
//! large, evenly used key space, each far from its limit): whatever copy a successor taking
//! over holds of it (none, or an older one), a fresh bucket is at most that sixteenth more
//! permissive, so the successor grants the key at most the sixteenth again. A change of limit
//! and a refund mark a bucket whatever it holds.
//!
//! [`Shard::mark_dirty`]: super::shard::Shard::mark_dirty
//! [`Shard::mark_gcra_changed`]: super::shard::Shard::mark_gcra_changed
//! [`Shard::insert_gcra`]: super::shard::Shard::insert_gcra

use std::sync::atomic::{AtomicBool, Ordering};

use crossbeam_queue::ArrayQueue;

use super::budget::Bounds;
use super::entries::{Family, decide_window};
use crate::algorithm::{SlidingLog, WindowState};
use crate::{BucketKey, Limit};

/// A GCRA bucket is replicated once more than `1 / REPLICATED_ABOVE` of its capacity is used.
const REPLICATED_ABOVE: u64 = 16;

/// Whether a GCRA bucket under `limit` whose TAT is `tat_ns` is worth replicating at `now_ns`:
/// it runs more than a sixteenth of its capacity (burst × emission interval) ahead of now. A
/// limit of a burst under 16 is replicated at every admission (one unit is more than that).
pub(super) fn gcra_worth_replicating(limit: &Limit, tat_ns: u64, now_ns: u64) -> bool {
    let capacity_ns = limit.burst().saturating_mul(limit.interval_ns());
    tat_ns.saturating_sub(now_ns) > capacity_ns / REPLICATED_ABOVE
}

/// Whether a window or log bucket under `limit` that has `remaining` units left now (what a
/// check of cost 0 would be told) is worth replicating: it counts more than a sixteenth of its
/// limit. For a sliding window the previous window's weighted share counts too: a successor
/// holding none of it could grant that much again. A limit under 16 is replicated at every
/// admission, as for GCRA.
pub(super) fn count_worth_replicating(limit: &Limit, remaining: u64) -> bool {
    let capacity = limit.burst();
    capacity
        .saturating_sub(remaining)
        .saturating_mul(REPLICATED_ABOVE)
        > capacity
}

/// [`count_worth_replicating`] for a window bucket holding `state` at `now_ns`.
pub(super) fn window_worth_replicating(limit: &Limit, state: &WindowState, now_ns: u64) -> bool {
    let remaining = decide_window(limit, state, now_ns, 0).0.remaining();
    count_worth_replicating(limit, remaining)
}

/// [`count_worth_replicating`] for a log bucket holding `log` at `now_ns`.
pub(super) fn log_worth_replicating(limit: &Limit, log: &SlidingLog, now_ns: u64) -> bool {
    count_worth_replicating(limit, log.peek(limit, now_ns, 0).remaining())
}

/// A listed key and the table its changed bucket is in (16 bytes).
#[derive(Debug, Clone, Copy)]
struct Listed {
    hash: u64,
    check: u32,
    family: Family,
}

/// What one place in a shard's list costs: the key and its family, and the stamp the queue
/// keeps beside each value.
pub(super) const LISTED_BYTES: usize = size_of::<Listed>() + size_of::<u64>();
/// Most keys a shard lists between two rounds (96 KiB at most per shard). A shard that had
/// more changed in one round is scanned whole once instead, as every round did before: with
/// rounds every 100 ms, that takes over 40,000 changed keys a second in one shard.
pub(super) const MAX_LISTED: usize = 4_096;
// The 96 KiB the store's documentation promises.
const _: () = assert!(MAX_LISTED * LISTED_BYTES <= 96 << 10);

/// How many keys a shard with `bounds` lists: at most [`MAX_LISTED`], its key bound, and an
/// eighth of its byte bound (the list is allocated once, outside the buckets' account).
pub(super) fn listed_capacity(bounds: Bounds) -> usize {
    MAX_LISTED
        .min(bounds.keys)
        .min(bounds.bytes / 8 / LISTED_BYTES)
        .max(1)
}

/// A shard's list of changed keys: pushed to under the shard's shared lock by whichever check
/// marked a bucket, drained by the replication round (also under the shared lock).
#[derive(Debug)]
pub(super) struct ChangedKeys {
    listed: ArrayQueue<Listed>,
    /// A key could not be listed (the list was full): the next round scans every bucket.
    overflowed: AtomicBool,
}

impl ChangedKeys {
    /// A list of `capacity` keys (at least one).
    pub(super) fn new(capacity: usize) -> Self {
        ChangedKeys {
            // Never zero, the one capacity `ArrayQueue::new` refuses.
            listed: ArrayQueue::new(capacity.max(1)),
            overflowed: AtomicBool::new(false),
        }
    }

    /// The same keys in a list of `capacity`; overflowed if they do not all fit.
    pub(super) fn resized(&self, capacity: usize) -> Self {
        let resized = ChangedKeys::new(capacity);
        let mut overflowed = self.overflowed.load(Ordering::Relaxed);
        while let Some(listed) = self.listed.pop() {
            overflowed |= resized.listed.push(listed).is_err();
        }
        resized.overflowed.store(overflowed, Ordering::Relaxed);
        resized
    }

    #[cfg(test)]
    pub(super) fn capacity(&self) -> usize {
        self.listed.capacity()
    }

    /// Lists `key`'s bucket of `family`, whose mark just went from clear to set.
    pub(super) fn push(&self, family: Family, key: BucketKey) {
        let listed = Listed {
            hash: key.hash,
            check: key.check,
            family,
        };
        if self.listed.push(listed).is_err() {
            self.overflowed.store(true, Ordering::Relaxed);
        }
    }

    /// True when a key was lost since the last call: the caller must scan every bucket. What
    /// was listed is dropped (the scan finds it; a key listed after this is looked up next
    /// round, its mark perhaps already taken by the scan, which is harmless).
    pub(super) fn take_overflowed(&self) -> bool {
        if !self.overflowed.load(Ordering::Relaxed)
            || !self.overflowed.swap(false, Ordering::Relaxed)
        {
            return false;
        }
        for _ in self.drain() {}
        true
    }

    /// The keys listed now, taken off the list. Keys listed while this runs are left for the
    /// next round: the work of one call is bounded by the list's size.
    pub(super) fn drain(&self) -> impl Iterator<Item = (Family, BucketKey)> + '_ {
        (0..self.listed.len()).map_while(|_| {
            let Listed {
                hash,
                check,
                family,
            } = self.listed.pop()?;
            Some((family, BucketKey { hash, check }))
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::algorithm::WindowState;
    use crate::store::{BucketCheck, BucketState, BucketValue, RemoteUse};
    use crate::{Algorithm, BucketStore, Limit, NANOS_PER_SEC as S, StoreConfig};

    const NOW: u64 = 1_000 * S;

    fn key(name: &str) -> BucketKey {
        BucketKey::for_key(name.as_bytes())
    }

    fn store(max_keys: usize, shards: usize) -> BucketStore {
        BucketStore::new(StoreConfig { max_keys, shards }).unwrap()
    }

    fn limits(period_ns: u64) -> [Limit; 4] {
        [
            Limit::gcra(5, period_ns, 5).unwrap(),
            Limit::window(Algorithm::FixedWindow, 5, period_ns).unwrap(),
            Limit::window(Algorithm::SlidingWindow, 5, period_ns).unwrap(),
            Limit::window(Algorithm::SlidingLog, 5, period_ns).unwrap(),
        ]
    }

    /// [`limits`] and a GCRA limit of a burst of 48, whose bucket is marked only once more than
    /// 3 units are used.
    fn limits_and_a_wide_burst(period_ns: u64) -> [Limit; 5] {
        let [gcra, fixed, sliding, log] = limits(period_ns);
        [
            gcra,
            fixed,
            sliding,
            log,
            Limit::gcra(48, period_ns, 48).unwrap(),
        ]
    }

    fn taken(store: &BucketStore, now_ns: u64) -> Vec<BucketState> {
        let mut out = Vec::new();
        store.take_changed(now_ns, &mut out);
        sorted(out)
    }

    /// In an order that does not depend on the tables' or the list's.
    fn sorted(mut states: Vec<BucketState>) -> Vec<BucketState> {
        let family = |s: &BucketState| match s.value {
            BucketValue::Gcra { .. } => 0,
            BucketValue::Window { .. } => 1,
            BucketValue::Log { .. } => 2,
        };
        states.sort_by_key(|s| (s.key.hash, s.key.check, family(s)));
        states
    }

    fn exported(store: &BucketStore, now_ns: u64, only: BucketKey) -> Vec<BucketState> {
        let mut out = Vec::new();
        store.export(now_ns, &|k| k == only, &mut out);
        sorted(out)
    }

    #[test]
    fn the_list_is_bounded_by_the_shards_keys_and_bytes() {
        use crate::store::budget::Bounds;
        let bounds = |keys, bytes| Bounds { keys, bytes };
        assert_eq!(listed_capacity(bounds(1 << 20, 1 << 30)), MAX_LISTED);
        assert_eq!(listed_capacity(bounds(10, 1 << 30)), 10);
        assert_eq!(
            listed_capacity(bounds(1 << 20, 64 << 10)),
            (64 << 10) / 8 / LISTED_BYTES
        );
        assert_eq!(listed_capacity(bounds(0, 0)), 1);
        assert_eq!(LISTED_BYTES, 24);
        assert_eq!(ChangedKeys::new(0).capacity(), 1);
    }

    /// Decisions on keys of every family are reported once each, as the buckets stand, and
    /// not again the next round; a key with buckets in two families is reported in both.
    #[test]
    fn changed_keys_of_every_family_are_reported_once() {
        let store = store(1 << 10, 4);
        let names = ["g", "f", "s", "l"];
        for (name, limit) in names.iter().zip(limits(3_600 * S)) {
            for cost in [1, 2] {
                assert!(
                    store
                        .check(key(name), &limit, cost, NOW)
                        .unwrap()
                        .is_allowed()
                );
            }
        }
        // "g" also under a window limit (a rules edit that switched its algorithm).
        let fixed = limits(3_600 * S)[1];
        store.check(key("g"), &fixed, 1, NOW).unwrap();
        let later = NOW + 10;
        let changed = taken(&store, later);
        assert_eq!(changed.len(), 5, "{changed:?}");
        let mut everything = Vec::new();
        store.export(later, &|_| true, &mut everything);
        assert_eq!(changed, sorted(everything));
        assert!(taken(&store, later).is_empty(), "reported once per change");
        // A peek and a denial change nothing; a consuming check lists the key again.
        store.peek(key("l"), &limits(3_600 * S)[3], 1, later);
        assert!(
            !store
                .check(key("f"), &fixed, 5, later)
                .unwrap()
                .is_allowed()
        );
        assert!(taken(&store, later).is_empty());
        store
            .check(key("s"), &limits(3_600 * S)[2], 1, later)
            .unwrap();
        assert_eq!(taken(&store, later), exported(&store, later, key("s")));
    }

    /// Refunds, charges, units from another region and multi-checks list what they change;
    /// received buckets are not ours to replicate onward.
    #[test]
    fn every_way_to_change_a_bucket_lists_it() {
        let store = store(1 << 10, 4);
        let hour = 3_600 * S;
        for (i, limit) in limits(hour).iter().enumerate() {
            let name = format!("k{i}");
            store.check(key(&name), limit, 3, NOW).unwrap();
            assert_eq!(taken(&store, NOW).len(), 1);
            store.refund(key(&name), limit, 1, NOW);
            assert_eq!(
                taken(&store, NOW),
                exported(&store, NOW, key(&name)),
                "{limit}"
            );
            store.charge(key(&name), limit, 1, NOW).unwrap();
            assert_eq!(
                taken(&store, NOW),
                exported(&store, NOW, key(&name)),
                "{limit}"
            );
            let used = RemoteUse {
                units: 1,
                at_ns: NOW,
                max_log_entries: 10,
            };
            store.apply_remote(key(&name), limit, used, NOW).unwrap();
            assert_eq!(
                taken(&store, NOW),
                exported(&store, NOW, key(&name)),
                "{limit}"
            );
            // Made by a charge or by remote units: listed too.
            let fresh = format!("c{i}");
            store.charge(key(&fresh), limit, 1, NOW).unwrap();
            assert_eq!(
                taken(&store, NOW),
                exported(&store, NOW, key(&fresh)),
                "{limit}"
            );
            let fresh = format!("r{i}");
            store.apply_remote(key(&fresh), limit, used, NOW).unwrap();
            assert_eq!(
                taken(&store, NOW),
                exported(&store, NOW, key(&fresh)),
                "{limit}"
            );
        }
        let checks: Vec<BucketCheck> = limits(hour)
            .iter()
            .enumerate()
            .map(|(i, limit)| BucketCheck {
                key: key(&format!("m{i}")),
                limit: *limit,
                cost: 1,
                peek: false,
            })
            .collect();
        let mut decisions = Vec::new();
        assert!(store.check_all(&checks, NOW, &mut decisions).unwrap());
        assert_eq!(taken(&store, NOW).len(), checks.len());
        // Merged from a peer: made here, or merged into a bucket, and not listed.
        let peer = self::store(1 << 10, 4);
        for (i, limit) in limits(hour).iter().enumerate() {
            peer.check(key(&format!("m{i}")), limit, 2, NOW).unwrap();
            peer.check(key(&format!("p{i}")), limit, 2, NOW).unwrap();
        }
        let mut states = Vec::new();
        peer.take_changed(NOW, &mut states);
        assert_eq!(store.merge(&states, NOW), 0);
        assert!(taken(&store, NOW).is_empty());
    }

    /// A shard whose list overflowed is scanned instead: the round still returns every
    /// changed bucket, once, and the list works again after.
    #[test]
    fn an_overflowed_list_falls_back_to_the_scan() {
        let store = store(1 << 10, 1).with_listed_capacity(3);
        let limits = limits(3_600 * S);
        let mut expected = Vec::new();
        for i in 0..12 {
            let name = format!("k{i}");
            store.check(key(&name), &limits[i % 4], 1, NOW).unwrap();
            expected.extend(exported(&store, NOW, key(&name)));
        }
        assert!(
            store.shards[0]
                .lock
                .read()
                .changed
                .overflowed
                .load(Ordering::Relaxed)
        );
        assert_eq!(taken(&store, NOW), sorted(expected));
        assert!(taken(&store, NOW).is_empty());
        assert!(
            !store.shards[0]
                .lock
                .read()
                .changed
                .overflowed
                .load(Ordering::Relaxed)
        );
        // Within the list's room again: found through it.
        store.check(key("k1"), &limits[1], 1, NOW).unwrap();
        store.check(key("k2"), &limits[2], 1, NOW).unwrap();
        let mut expected = exported(&store, NOW, key("k1"));
        expected.extend(exported(&store, NOW, key("k2")));
        assert_eq!(taken(&store, NOW), sorted(expected));
    }

    /// A key marked, evicted, and made again while still listed is listed twice: it is
    /// reported once, as it stands now; an evicted key not made again is not reported.
    #[test]
    fn a_key_evicted_and_made_again_is_reported_once() {
        for limit in limits(3_600 * S) {
            let store = store(1, 1);
            store.check(key("a"), &limit, 1, NOW).unwrap();
            // "b" takes the only place: "a" is evicted, still listed.
            store.check(key("b"), &limit, 1, NOW + 1).unwrap();
            assert_eq!(store.len(), 1);
            // "a" comes back (evicting "b") and is listed again.
            store.check(key("a"), &limit, 2, NOW + 2).unwrap();
            assert_eq!(store.stats().evicted.load(Ordering::Relaxed), 2, "{limit}");
            let now = NOW + 3;
            let changed = taken(&store, now);
            assert_eq!(changed, exported(&store, now, key("a")), "{limit}");
            assert_eq!(changed.len(), 1, "{limit}");
            assert!(taken(&store, now).is_empty(), "{limit}");
        }
    }

    /// Keys listed before the store's byte bound is set are kept (or the shard scanned).
    #[test]
    fn a_resized_list_keeps_what_was_listed() {
        let store = store(1 << 10, 1);
        let limit = limits(3_600 * S)[0];
        for i in 0..5 {
            store.check(key(&format!("k{i}")), &limit, 1, NOW).unwrap();
        }
        let store = store.with_max_bytes(1 << 20).unwrap();
        assert_eq!(taken(&store, NOW).len(), 5);
        for i in 0..5 {
            store.check(key(&format!("k{i}")), &limit, 1, NOW).unwrap();
        }
        let store = store.with_listed_capacity(2);
        assert_eq!(taken(&store, NOW).len(), 5);
    }

    /// A GCRA bucket is listed only once more than a sixteenth of its capacity is used, then
    /// at every change while it stays so; one that fell back within the sixteenth is not.
    #[test]
    fn a_gcra_bucket_is_listed_once_over_a_sixteenth_of_its_capacity() {
        let store = store(1 << 10, 1);
        let period = 3_600 * S;
        // 32 units: a sixteenth is 2.
        let limit = Limit::gcra(32, period, 32).unwrap();
        let interval = limit.interval_ns();
        let k = key("k");
        let tat_of = |states: &[BucketState]| match states {
            [
                BucketState {
                    value: BucketValue::Gcra { tat_ns, .. },
                    ..
                },
            ] => *tat_ns,
            other => panic!("one GCRA bucket expected, got {other:?}"),
        };
        for _ in 0..2 {
            assert!(store.check(k, &limit, 1, NOW).unwrap().is_allowed());
            assert!(taken(&store, NOW).is_empty(), "2 of 32 used: not listed");
        }
        assert!(store.check(k, &limit, 1, NOW).unwrap().is_allowed());
        assert_eq!(tat_of(&taken(&store, NOW)), NOW + 3 * interval);
        assert!(store.check(k, &limit, 1, NOW).unwrap().is_allowed());
        assert_eq!(tat_of(&taken(&store, NOW)), NOW + 4 * interval);
        // Three intervals later one unit is used again: 2 of 32, not listed.
        let later = NOW + 3 * interval;
        assert!(store.check(k, &limit, 1, later).unwrap().is_allowed());
        assert!(taken(&store, later).is_empty());
        let mut scanned = Vec::new();
        store.take_changed_by_scan(later, &mut scanned);
        assert!(scanned.is_empty(), "and not marked either");
        // A bucket made by its first check is marked by the same rule: a cost of 3 is listed.
        let other = key("other");
        assert!(store.check(other, &limit, 3, NOW).unwrap().is_allowed());
        assert_eq!(tat_of(&taken(&store, NOW)), NOW + 3 * interval);
    }

    /// A window or log bucket is listed only once it counts more than a sixteenth of its
    /// limit, then at every change while it does; a sliding window counts the window before's
    /// weighted share too.
    #[test]
    fn a_window_or_log_bucket_is_listed_once_over_a_sixteenth_of_its_limit() {
        let hour = 3_600 * S;
        // 32 units: a sixteenth is 2.
        for algorithm in [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::SlidingLog,
        ] {
            let store = store(1 << 10, 1);
            let limit = Limit::window(algorithm, 32, hour).unwrap();
            let start = (NOW / hour + 1) * hour;
            let k = key("k");
            for _ in 0..2 {
                assert!(store.check(k, &limit, 1, start).unwrap().is_allowed());
                assert!(
                    taken(&store, start).is_empty(),
                    "{limit}: 2 of 32, not listed"
                );
            }
            assert!(store.check(k, &limit, 1, start).unwrap().is_allowed());
            assert_eq!(taken(&store, start), exported(&store, start, k), "{limit}");
            assert!(store.check(k, &limit, 1, start).unwrap().is_allowed());
            assert_eq!(taken(&store, start), exported(&store, start, k), "{limit}");
            // A tenth into the next hour the 4 units count no more in a fixed window nor in the
            // log (over an hour old), and weigh 3 in a sliding window: with 1 more, 4 of 32.
            let next = start + hour + hour / 10;
            assert!(store.check(k, &limit, 1, next).unwrap().is_allowed());
            let listed = !taken(&store, next).is_empty();
            assert_eq!(listed, algorithm == Algorithm::SlidingWindow, "{limit}");
            let mut scanned = Vec::new();
            store.take_changed_by_scan(next, &mut scanned);
            assert!(scanned.is_empty(), "{limit}: nothing else marked");
            // A bucket made by its first check follows the same rule; so does one made by a
            // charge or by another region's units.
            let (made, charged, remote) = (key("made"), key("charged"), key("remote"));
            store.check(made, &limit, 2, next).unwrap();
            store.charge(charged, &limit, 2, next).unwrap();
            let two = RemoteUse {
                units: 2,
                at_ns: next,
                max_log_entries: 10,
            };
            store.apply_remote(remote, &limit, two, next).unwrap();
            assert!(taken(&store, next).is_empty(), "{limit}");
            store.check(made, &limit, 1, next).unwrap();
            store.charge(charged, &limit, 1, next).unwrap();
            store
                .apply_remote(remote, &limit, RemoteUse { units: 1, ..two }, next)
                .unwrap();
            let mut expected = exported(&store, next, made);
            expected.extend(exported(&store, next, charged));
            expected.extend(exported(&store, next, remote));
            assert_eq!(taken(&store, next), sorted(expected), "{limit}");
        }
    }

    /// Checks on many threads mark buckets while rounds take them: every change is reported
    /// by some round, none is lost between a mark and its listing.
    #[test]
    fn no_change_is_lost_to_concurrent_rounds() {
        let store = store(1 << 14, 4).with_listed_capacity(64);
        // A burst under 16: every admission marks the bucket.
        let limit = Limit::gcra(1_000, S, 4).unwrap();
        // A limit under 16 (each key takes its 4 units): every admission marks the bucket.
        let window = Limit::window(Algorithm::FixedWindow, 4, S).unwrap();
        let threads = 4;
        let per_thread = 2_000;
        let done = AtomicBool::new(false);
        let mut seen = std::collections::HashSet::new();
        std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads)
                .map(|t| {
                    let store = &store;
                    scope.spawn(move || {
                        for i in 0..per_thread {
                            // Each key changed twice, under both families: marks race rounds.
                            let k = key(&format!("{t}-{}", i % 500));
                            let limit = if i % 2 == 0 { &limit } else { &window };
                            store.check(k, limit, 1, NOW).unwrap();
                        }
                    })
                })
                .collect();
            let rounds = scope.spawn(|| {
                let mut seen = Vec::new();
                while !done.load(Ordering::Relaxed) {
                    store.take_changed(NOW, &mut seen);
                }
                seen
            });
            for worker in workers {
                worker.join().unwrap();
            }
            done.store(true, Ordering::Relaxed);
            for state in rounds.join().unwrap() {
                seen.insert(state.key);
            }
        });
        let mut last = Vec::new();
        store.take_changed(NOW, &mut last);
        seen.extend(last.iter().map(|s| s.key));
        assert_eq!(seen.len(), threads * 500);
        // Every bucket's mark is clear: the scan finds nothing left.
        let mut left = Vec::new();
        store.take_changed_by_scan(NOW, &mut left);
        assert!(left.is_empty(), "{} marked buckets left", left.len());
    }

    #[derive(Debug, Clone)]
    enum Op {
        Check { key: u8, family: usize, cost: u64 },
        Charge { key: u8, family: usize, cost: u64 },
        Refund { key: u8, family: usize, cost: u64 },
        Remote { key: u8, family: usize, units: u64 },
        Merge { key: u8, family: usize, units: u64 },
        CheckAll { keys: [u8; 2], family: usize },
        Advance { ms: u64 },
        Sweep,
        Round,
    }

    fn op() -> impl Strategy<Value = Op> {
        let k = 0u8..24;
        let f = 0usize..5;
        prop_oneof![
            6 => (k.clone(), f.clone(), 0u64..4).prop_map(|(key, family, cost)| Op::Check { key, family, cost }),
            1 => (k.clone(), f.clone(), 0u64..8).prop_map(|(key, family, cost)| Op::Charge { key, family, cost }),
            1 => (k.clone(), f.clone(), 1u64..3).prop_map(|(key, family, cost)| Op::Refund { key, family, cost }),
            1 => (k.clone(), f.clone(), 1u64..4).prop_map(|(key, family, units)| Op::Remote { key, family, units }),
            1 => (k.clone(), f.clone(), 1u64..4).prop_map(|(key, family, units)| Op::Merge { key, family, units }),
            1 => (k.clone(), k.clone(), f).prop_map(|(a, b, family)| Op::CheckAll { keys: [a, b], family }),
            2 => (0u64..1_500).prop_map(|ms| Op::Advance { ms }),
            1 => Just(Op::Sweep),
            2 => Just(Op::Round),
        ]
    }

    /// A bucket as a peer might send it for `key` under `limit`.
    fn received(key: BucketKey, limit: &Limit, units: u64, now_ns: u64) -> BucketState {
        let value = match limit.algorithm() {
            Algorithm::Gcra => BucketValue::Gcra {
                tat_ns: now_ns + units * limit.interval_ns(),
                margin_ms: 100,
            },
            Algorithm::SlidingLog => BucketValue::Log {
                limit: *limit,
                times_ns: vec![now_ns; units as usize],
            },
            _ => BucketValue::Window {
                limit: *limit,
                state: WindowState {
                    window: now_ns / limit.period_ns(),
                    count: units,
                    previous: 0,
                },
            },
        };
        BucketState { key, value }
    }

    fn apply(store: &BucketStore, op: &Op, now_ns: u64) {
        let limits = limits_and_a_wide_burst(S);
        let name = |k: u8| BucketKey::for_key(&[k]);
        // Refusals (a shard full of denying keys) happen alike in both stores.
        match *op {
            Op::Check { key, family, cost } => {
                let _ = store.check(name(key), &limits[family], cost, now_ns);
            }
            Op::Charge { key, family, cost } => {
                let _ = store.charge(name(key), &limits[family], cost, now_ns);
            }
            Op::Refund { key, family, cost } => {
                store.refund(name(key), &limits[family], cost, now_ns);
            }
            Op::Remote { key, family, units } => {
                let used = RemoteUse {
                    units,
                    at_ns: now_ns,
                    max_log_entries: 10,
                };
                let _ = store.apply_remote(name(key), &limits[family], used, now_ns);
            }
            Op::Merge { key, family, units } => {
                let state = received(name(key), &limits[family], units, now_ns);
                store.merge(&[state], now_ns);
            }
            Op::CheckAll { keys, family } => {
                let checks: Vec<BucketCheck> = keys
                    .iter()
                    .map(|&k| BucketCheck {
                        key: name(k),
                        limit: limits[family],
                        cost: 2,
                        peek: false,
                    })
                    .collect();
                let _ = store.check_all(&checks, now_ns, &mut Vec::new());
            }
            Op::Sweep => {
                store.sweep_expired(now_ns, 1);
            }
            Op::Advance { .. } | Op::Round => {}
        }
    }

    /// An owner's checks under `limit` (or charges), `ops` each (key, cost, milliseconds to
    /// advance first, a charge, a round after it), with a successor that merges every round's
    /// buckets; the last op is followed by a round. `each_round` is given the owner, the
    /// successor and the time after every round.
    fn rounds_to_a_successor(
        limit: &Limit,
        ops: &[(u8, u64, u64, bool, bool)],
        mut each_round: impl FnMut(&BucketStore, &BucketStore, u64) -> Result<(), TestCaseError>,
    ) -> Result<(), TestCaseError> {
        let owner = store(1 << 10, 2);
        let successor = store(1 << 10, 2);
        let mut now = NOW;
        for (i, &(k, cost, advance_ms, charge, then_round)) in ops.iter().enumerate() {
            now += advance_ms * 1_000_000;
            let k = BucketKey::for_key(&[k]);
            if charge {
                owner.charge(k, limit, cost, now).unwrap();
            } else {
                owner.check(k, limit, cost, now).unwrap();
            }
            if then_round || i + 1 == ops.len() {
                let mut states = Vec::new();
                owner.take_changed(now, &mut states);
                prop_assert_eq!(successor.merge(&states, now), 0, "room for every bucket");
                each_round(&owner, &successor, now)?;
            }
        }
        Ok(())
    }

    proptest! {
        /// On any sequence of decisions, charges, refunds, remote units, merges, evictions and
        /// expiry, the list reports the same buckets as a scan of every bucket's mark, round
        /// after round, whether or not it overflowed.
        #[test]
        fn the_list_reports_what_a_scan_would(
            ops in prop::collection::vec(op(), 1..300),
            listed in 1usize..40,
        ) {
            // Few places for 24 keys in 4 families: evictions and re-insertions are common.
            // Lists longer than a round's prefetch burst (16) are read in several bursts.
            let listing = store(16, 2).with_listed_capacity(listed);
            let scanning = store(16, 2);
            let mut now = NOW;
            for op in ops.iter().chain([&Op::Round]) {
                if let Op::Advance { ms } = op {
                    now += ms * 1_000_000;
                }
                if let Op::Round = op {
                    let mut scanned = Vec::new();
                    scanning.take_changed_by_scan(now, &mut scanned);
                    prop_assert_eq!(taken(&listing, now), sorted(scanned));
                    continue;
                }
                apply(&listing, op, now);
                apply(&scanning, op, now);
            }
            prop_assert_eq!(listing.len(), scanning.len());
        }

        /// A successor that merged every round's buckets holds each key's GCRA bucket at most a
        /// sixteenth of its capacity more permissive than the owner's, right after every round:
        /// the most a takeover then grants a key again. Checks and charges of any cost, at any
        /// pace, with rounds at any point.
        #[test]
        fn a_successor_is_at_most_a_sixteenth_behind_after_a_round(
            ops in prop::collection::vec((0u8..12, 0u64..6, 0u64..3_000, any::<bool>(), any::<bool>()), 1..200),
        ) {
            // A unit a second, 64 at most: a sixteenth is 4 s.
            let limit = Limit::gcra(64, 64 * S, 64).unwrap();
            let sixteenth = 64 * limit.interval_ns() / 16;
            rounds_to_a_successor(&limit, &ops, |owner, successor, now| {
                let tat = |store: &BucketStore, k| match exported(store, now, k).as_slice() {
                    [BucketState { value: BucketValue::Gcra { tat_ns, .. }, .. }] => (*tat_ns).max(now),
                    // Expired (or never made): as a full bucket.
                    _ => now,
                };
                for k in 0..12u8 {
                    let k = BucketKey::for_key(&[k]);
                    let behind = tat(owner, k).saturating_sub(tat(successor, k));
                    prop_assert!(behind <= sixteenth, "{} ns behind", behind);
                }
                Ok(())
            })?;
        }

        /// The same for window and log buckets: after every round, a successor that merged
        /// every round counts each key at most a sixteenth of its limit fewer units than the
        /// owner (a sliding window's window before weighing in), read as a check would.
        #[test]
        fn a_successor_counts_at_most_a_sixteenth_fewer_after_a_round(
            algorithm in 0usize..3,
            ops in prop::collection::vec((0u8..12, 0u64..6, 0u64..20_000, any::<bool>(), any::<bool>()), 1..200),
        ) {
            let algorithm = [
                Algorithm::FixedWindow,
                Algorithm::SlidingWindow,
                Algorithm::SlidingLog,
            ][algorithm];
            // 64 units a minute: a sixteenth is 4.
            let limit = Limit::window(algorithm, 64, 60 * S).unwrap();
            let used = |store: &BucketStore, k, now| 64 - store.peek(k, &limit, 0, now).remaining();
            rounds_to_a_successor(&limit, &ops, |owner, successor, now| {
                for k in 0..12u8 {
                    let k = BucketKey::for_key(&[k]);
                    let (ours, theirs) = (used(owner, k, now), used(successor, k, now));
                    prop_assert!(ours <= theirs + 4, "{}: {} used, the successor {}", limit, ours, theirs);
                }
                Ok(())
            })?;
        }
    }
}

//! The bucket store under concurrency, expiry and eviction, and multi-check
//! all-or-nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;

use floodgate::{
    Algorithm, BucketCheck, BucketKey, BucketStore, Decision, Limit, NANOS_PER_SEC, StoreConfig,
    StoreError, SweepCursor,
};
use proptest::prelude::*;

const HOUR: u64 = 3_600 * NANOS_PER_SEC;
const NOW: u64 = 1_000 * NANOS_PER_SEC;

fn key(name: &str) -> BucketKey {
    BucketKey::new(b"test-rule", name.as_bytes())
}

fn store(max_keys: usize, shards: usize) -> Arc<BucketStore> {
    Arc::new(BucketStore::new(StoreConfig { max_keys, shards }).unwrap())
}

/// Threads hammering one key with a frozen clock admit exactly the burst: no lost update.
#[test]
fn hammering_one_key_admits_exactly_the_burst_for_every_algorithm() {
    for algorithm in Algorithm::ALL {
        let limit = Limit::new(algorithm, 1_000, HOUR, 1_000).unwrap();
        let store = store(1 << 16, 64);
        let allowed = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (store, allowed) = (store.clone(), allowed.clone());
                thread::spawn(move || {
                    for _ in 0..5_000 {
                        if store
                            .check(key("hot"), &limit, 1, NOW)
                            .unwrap()
                            .is_allowed()
                        {
                            allowed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(allowed.load(Ordering::Relaxed), 1_000, "{algorithm}");
    }
}

/// Multi-checks and single checks racing on shared keys: a group that is denied consumes
/// nothing, so the first key's tokens go exactly to admitted singles and admitted groups, and the
/// second key's tokens only to admitted groups.
#[test]
fn multi_check_is_all_or_nothing_under_hammering() {
    let wide = Limit::gcra(1_000, HOUR, 1_000).unwrap();
    let narrow = Limit::gcra(300, HOUR, 300).unwrap();
    let store = store(1 << 16, 64);
    let group = [
        BucketCheck {
            key: key("a"),
            limit: wide,
            cost: 1,
            peek: false,
        },
        BucketCheck {
            key: key("b"),
            limit: narrow,
            cost: 1,
            peek: false,
        },
    ];
    let (groups_ok, singles_ok) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (store, groups_ok, singles_ok) =
                (store.clone(), groups_ok.clone(), singles_ok.clone());
            thread::spawn(move || {
                let mut decisions = Vec::new();
                for _ in 0..2_000 {
                    if t % 2 == 0 {
                        if store.check_all(&group, NOW, &mut decisions).unwrap() {
                            groups_ok.fetch_add(1, Ordering::Relaxed);
                        }
                        assert_eq!(decisions.len(), 2);
                    } else if store.check(key("a"), &wide, 1, NOW).unwrap().is_allowed() {
                        singles_ok.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    let (groups, singles) = (
        groups_ok.load(Ordering::Relaxed),
        singles_ok.load(Ordering::Relaxed),
    );
    let a_left = store.check(key("a"), &wide, 0, NOW).unwrap().remaining();
    let b_left = store.check(key("b"), &narrow, 0, NOW).unwrap().remaining();
    assert_eq!(
        groups + singles + a_left,
        1_000,
        "a's tokens went to admitted checks only"
    );
    assert_eq!(
        groups + b_left,
        300,
        "b's tokens went to admitted groups only"
    );
    assert!(groups <= 300);
}

/// A denied group reports the others' buckets as they stay, and a cost that can never pass
/// denies the whole group too.
#[test]
fn a_denied_group_leaves_the_other_buckets_untouched() {
    let store = store(1 << 10, 4);
    let five = Limit::gcra(5, HOUR, 5).unwrap();
    let one = Limit::gcra(1, HOUR, 1).unwrap();
    let mut out = Vec::new();
    assert!(store.check(key("one"), &one, 1, NOW).unwrap().is_allowed());
    let group = [
        BucketCheck {
            key: key("five"),
            limit: five,
            cost: 2,
            peek: false,
        },
        BucketCheck {
            key: key("one"),
            limit: one,
            cost: 1,
            peek: false,
        },
    ];
    assert!(!store.check_all(&group, NOW, &mut out).unwrap());
    assert_eq!(
        out[0],
        Decision::Allowed {
            remaining: 5,
            reset_after_ns: 0
        }
    );
    assert!(matches!(out[1], Decision::Denied { remaining: 0, .. }));
    let never = [
        BucketCheck {
            key: key("five"),
            limit: five,
            cost: 1,
            peek: false,
        },
        BucketCheck {
            key: key("x"),
            limit: five,
            cost: 6,
            peek: false,
        },
    ];
    assert!(!store.check_all(&never, NOW, &mut out).unwrap());
    assert_eq!(out[1], Decision::CostExceedsBurst { burst: 5 });
    assert_eq!(
        store.check(key("five"), &five, 0, NOW).unwrap().remaining(),
        5
    );
    // The same key twice in one group counts both costs.
    let twice = [
        BucketCheck {
            key: key("five"),
            limit: five,
            cost: 3,
            peek: false,
        },
        BucketCheck {
            key: key("five"),
            limit: five,
            cost: 3,
            peek: false,
        },
    ];
    assert!(!store.check_all(&twice, NOW, &mut out).unwrap());
    assert_eq!(
        store.check(key("five"), &five, 0, NOW).unwrap().remaining(),
        5
    );
}

proptest! {
    /// A group of one through `check_all` (its shortcut) decides exactly as `check` does, and
    /// leaves the bucket as `check` leaves it: allowed, denied, too costly, or the store full.
    #[test]
    fn a_group_of_one_decides_as_a_single_check(
        algorithm in prop::sample::select(Algorithm::ALL.to_vec()),
        steps in prop::collection::vec((0u8..6, 0u64..300_000_000, 0u64..5), 1..200),
    ) {
        let limit = Limit::new(algorithm, 3, NANOS_PER_SEC / 2, 3).unwrap();
        // Room for 4 keys of 6: some first checks find the store full.
        let (single, grouped) = (store(4, 1), store(4, 1));
        let mut now = NOW;
        let mut decisions = Vec::new();
        for (k, advance, cost) in steps {
            now += advance;
            let name = format!("k{k}");
            let alone = single.check(key(&name), &limit, cost, now);
            let check = BucketCheck { key: key(&name), limit, cost, peek: false };
            let group = grouped
                .check_all(&[check], now, &mut decisions)
                .map(|allowed| (allowed, decisions.clone()));
            match (alone, group) {
                (Ok(decision), Ok((allowed, out))) => {
                    prop_assert_eq!(&out, &vec![decision]);
                    prop_assert_eq!(allowed, decision.is_allowed());
                }
                (Err(a), Err(b)) => prop_assert_eq!(a, b),
                (a, b) => prop_assert!(false, "check {:?}, check_all {:?}", a, b),
            }
        }
        for k in 0..6u8 {
            let name = format!("k{k}");
            prop_assert_eq!(
                single.check(key(&name), &limit, 0, now).ok(),
                grouped.check(key(&name), &limit, 0, now).ok()
            );
        }
    }
}

proptest! {
    /// Forgetting expired buckets at any moment changes no decision.
    #[test]
    fn expiry_never_changes_a_decision(
        algorithm in prop::sample::select(Algorithm::ALL.to_vec()),
        steps in prop::collection::vec((0u8..6, 0u64..400_000_000, 0u64..4, any::<bool>()), 1..300),
    ) {
        let limit = Limit::new(algorithm, 3, NANOS_PER_SEC / 2, 3).unwrap();
        let (plain, swept) = (store(1 << 10, 4), store(1 << 10, 4));
        // The node's sweeper: bounded steps of a few slots, wherever they fall.
        let (stepped, mut cursor) = (store(1 << 10, 4), SweepCursor::default());
        let mut now = NOW;
        for (k, gap, cost, sweep) in steps {
            now += gap;
            if sweep {
                swept.sweep_expired(now, 4);
                stepped.sweep_step(now, &mut cursor, 3);
            }
            let k = key(&k.to_string());
            let decided = plain.check(k, &limit, cost, now);
            prop_assert_eq!(&decided, &swept.check(k, &limit, cost, now));
            prop_assert_eq!(&decided, &stepped.check(k, &limit, cost, now));
        }
    }
}

/// Idle buckets are forgotten; the count of keys stays bounded by `max_keys` under a flood of new
/// keys, with evictions counted.
#[test]
fn a_flood_of_new_keys_stays_within_max_keys() {
    let store = store(256, 4);
    let limit = Limit::gcra(10, HOUR, 10).unwrap();
    for i in 0..10_000 {
        assert!(
            store
                .check(key(&format!("k{i}")), &limit, 1, NOW)
                .unwrap()
                .is_allowed()
        );
        assert!(store.len() <= 256);
    }
    assert!(store.stats().evicted.load(Ordering::Relaxed) > 0);
    // After the buckets refill, a sweep forgets them all.
    let kept = store.len();
    assert_eq!(store.sweep_expired(NOW + HOUR, 4), kept);
    assert!(store.is_empty());
}

/// The node's bounded sweep steps forget what a whole sweep forgets, and nothing before it
/// expired, however the steps' slices fall across shards.
#[test]
fn bounded_sweep_steps_forget_every_expired_bucket_and_nothing_else() {
    let store = store(1 << 12, 4);
    let limit = Limit::gcra(10, HOUR, 10).unwrap();
    for i in 0..2_000 {
        store.check(key(&format!("k{i}")), &limit, 1, NOW).unwrap();
    }
    let kept = store.len();
    let mut cursor = SweepCursor::default();
    // Several rounds of every shard before the buckets refill: nothing goes.
    for _ in 0..4_000 {
        assert_eq!(store.sweep_step(NOW + 1, &mut cursor, 7), 0);
    }
    assert_eq!(store.len(), kept);
    let mut forgotten = 0;
    let mut steps = 0;
    while !store.is_empty() {
        steps += 1;
        assert!(steps <= 10_000, "the steps never reached every bucket");
        forgotten += store.sweep_step(NOW + HOUR, &mut cursor, 7);
    }
    assert_eq!(forgotten, kept);
    assert_eq!(store.stats().expired.load(Ordering::Relaxed), kept as u64);
}

/// The sweeper paces itself by `sweep_steps_per_pass`: that many steps, from where a pass
/// starts, walk every slot of every shard once and come back to the start.
#[test]
fn a_pass_of_sweep_steps_reaches_every_bucket_once() {
    let store = store(1 << 12, 4);
    assert_eq!(
        store.sweep_steps_per_pass(7),
        4,
        "empty shards: one step each"
    );
    let limit = Limit::gcra(10, HOUR, 10).unwrap();
    for i in 0..2_000 {
        store.check(key(&format!("k{i}")), &limit, 1, NOW).unwrap();
    }
    // About 500 keys a shard, at most 3/4 full: tables of 1,024 slots, walked 7 at a time.
    let steps = store.sweep_steps_per_pass(7);
    assert_eq!(steps, 4 * 1_024_usize.div_ceil(7));
    let mut cursor = SweepCursor::default();
    let mut forgotten = 0;
    for _ in 0..steps {
        forgotten += store.sweep_step(NOW + HOUR, &mut cursor, 7);
    }
    assert_eq!((forgotten, store.len()), (2_000, 0));
    assert_eq!(
        cursor,
        SweepCursor::default(),
        "the pass ended where it began"
    );
    assert_eq!(store.sweep_steps_per_pass(usize::MAX), 4, "whole shards");
}

/// A flood of new keys evicts the emptiest buckets, not busy ones: keys with a short period
/// that are near (but not at) their limit keep their counts while thousands of one-off keys
/// with a long period pass through. Found by the chaos harness: ranking by time until full
/// evicted exactly the busy keys (their windows end soonest), so each came back full and its
/// window admitted up to three times its limit.
#[test]
fn a_flood_of_new_keys_evicts_the_emptiest_buckets_not_busy_ones() {
    let store = store(64, 1);
    let busy = [
        Limit::window(Algorithm::FixedWindow, 25, NANOS_PER_SEC).unwrap(),
        Limit::window(Algorithm::SlidingWindow, 25, NANOS_PER_SEC).unwrap(),
        Limit::new(Algorithm::SlidingLog, 25, NANOS_PER_SEC, 25).unwrap(),
        Limit::gcra(25, NANOS_PER_SEC, 25).unwrap(),
    ];
    let flood = Limit::gcra(100, HOUR, 100).unwrap();
    for (i, limit) in busy.iter().enumerate() {
        for _ in 0..20 {
            let decision = store
                .check(key(&format!("busy{i}")), limit, 1, NOW)
                .unwrap();
            assert!(decision.is_allowed());
        }
    }
    for i in 0..5_000 {
        store
            .check(key(&format!("flood{i}")), &flood, 1, NOW)
            .unwrap();
    }
    assert!(store.stats().evicted.load(Ordering::Relaxed) > 0);
    for (i, limit) in busy.iter().enumerate() {
        let remaining = store
            .check(key(&format!("busy{i}")), limit, 0, NOW)
            .unwrap()
            .remaining();
        assert!(
            remaining <= 5,
            "busy{i} was evicted: {remaining} left of 25"
        );
    }
}

/// Eviction forgets a denying key only when nothing else is left: with half the store denying, a
/// flood of new keys leaves every denying key denied; when every key is denying, a new key
/// evicts one of them (counted) and is decided, not refused.
#[test]
fn eviction_spares_denying_keys_until_only_denying_ones_are_left() {
    let store = store(64, 1);
    let strict = Limit::gcra(1, HOUR, 1).unwrap();
    let loose = Limit::gcra(10, HOUR, 10).unwrap();
    for i in 0..32 {
        assert!(
            store
                .check(key(&format!("denied{i}")), &strict, 1, NOW)
                .unwrap()
                .is_allowed()
        );
    }
    for i in 0..1_000 {
        store
            .check(key(&format!("new{i}")), &loose, 1, NOW)
            .unwrap();
    }
    for i in 0..32 {
        assert!(
            !store
                .check(key(&format!("denied{i}")), &strict, 1, NOW)
                .unwrap()
                .is_allowed(),
            "denied{i} was forgotten"
        );
    }
    assert_eq!(store.stats().evicted_denying.load(Ordering::Relaxed), 0);
    for i in 32..64 {
        store
            .check(key(&format!("denied{i}")), &strict, 1, NOW)
            .unwrap();
    }
    for i in 0..100 {
        let late = store.check(key(&format!("late{i}")), &loose, 1, NOW);
        assert!(late.unwrap().is_allowed(), "late{i} was not decided");
    }
    assert_eq!(store.stats().refused.load(Ordering::Relaxed), 0);
    assert!(store.stats().evicted_denying.load(Ordering::Relaxed) > 0);
    assert!(store.len() <= 64);
}

#[test]
fn bad_store_configs_are_refused() {
    assert_eq!(
        BucketStore::new(StoreConfig {
            max_keys: 100,
            shards: 3
        })
        .unwrap_err(),
        StoreError::BadShardCount(3)
    );
    assert!(matches!(
        BucketStore::new(StoreConfig {
            max_keys: 2,
            shards: 4
        }),
        Err(StoreError::TooFewKeys { .. })
    ));
}

/// A refund gives back what a request took, never more than a fresh bucket holds; windows only
/// within the same window.
#[test]
fn refunds_give_back_what_was_taken_and_no_more() {
    let store = store(1 << 10, 4);
    let limit = Limit::gcra(10, HOUR, 10).unwrap();
    for _ in 0..4 {
        store.check(key("r"), &limit, 1, NOW).unwrap();
    }
    store.refund(key("r"), &limit, 3, NOW);
    assert_eq!(
        store.check(key("r"), &limit, 0, NOW).unwrap().remaining(),
        9
    );
    store.refund(key("r"), &limit, 50, NOW);
    assert_eq!(
        store.check(key("r"), &limit, 0, NOW).unwrap().remaining(),
        10,
        "never past full"
    );
    let window = Limit::window(Algorithm::FixedWindow, 5, HOUR).unwrap();
    for _ in 0..5 {
        store.check(key("w"), &window, 1, NOW).unwrap();
    }
    store.refund(key("w"), &window, 2, NOW);
    assert_eq!(
        store.check(key("w"), &window, 0, NOW).unwrap().remaining(),
        2
    );
    store.refund(key("w"), &window, 2, NOW + HOUR);
    assert_eq!(
        store
            .check(key("w"), &window, 0, NOW + HOUR)
            .unwrap()
            .remaining(),
        5
    );
}

/// Replication: changed buckets are reported once per change; merging them into another store
/// reproduces the same decisions, and a merge never loosens a bucket (the later TAT wins).
#[test]
fn changed_buckets_replicate_and_merge_conservatively() {
    let (owner, successor) = (store(1 << 10, 4), store(1 << 10, 4));
    let limit = Limit::gcra(5, HOUR, 5).unwrap();
    for i in 0..20 {
        owner
            .check(key(&format!("k{i}")), &limit, 1 + i % 3, NOW)
            .unwrap();
    }
    let mut changed = Vec::new();
    owner.take_changed(NOW, &mut changed);
    assert_eq!(changed.len(), 20);
    let mut again = Vec::new();
    owner.take_changed(NOW, &mut again);
    assert!(again.is_empty(), "a bucket is reported once per change");
    assert_eq!(successor.merge(&changed, NOW), 0);
    for i in 0..20 {
        let k = key(&format!("k{i}"));
        assert_eq!(
            owner.check(k, &limit, 0, NOW),
            successor.check(k, &limit, 0, NOW)
        );
    }
    // The successor's own (later) consumption is kept when older state arrives.
    successor.check(key("k0"), &limit, 2, NOW).unwrap();
    successor.merge(&changed, NOW);
    assert_eq!(
        successor
            .check(key("k0"), &limit, 0, NOW)
            .unwrap()
            .remaining(),
        2
    );
    let mut exported = Vec::new();
    successor.export(NOW, &|k| k == key("k0"), &mut exported);
    assert_eq!(exported.len(), 1);
}

/// Every algorithm's buckets replicate and hand over: a store that merges what another exported
/// decides exactly as the other would, a bucket is reported once per change, and merging an
/// older copy over later consumption keeps the consumption.
#[test]
fn buckets_of_every_algorithm_replicate_and_merge_conservatively() {
    for algorithm in Algorithm::ALL {
        let (owner, successor) = (store(1 << 10, 4), store(1 << 10, 4));
        let limit = Limit::new(algorithm, 5, HOUR, 5).unwrap();
        for i in 0..20u64 {
            owner
                .check(key(&format!("k{i}")), &limit, 1 + i % 3, NOW + i)
                .unwrap();
        }
        let later = NOW + 100;
        let mut changed = Vec::new();
        owner.take_changed(later, &mut changed);
        assert_eq!(changed.len(), 20, "{algorithm:?}");
        let mut again = Vec::new();
        owner.take_changed(later, &mut again);
        assert!(again.is_empty(), "{algorithm:?}: reported once per change");
        assert_eq!(successor.merge(&changed, later), 0);
        for i in 0..20 {
            let k = key(&format!("k{i}"));
            assert_eq!(
                owner.check(k, &limit, 0, later),
                successor.check(k, &limit, 0, later),
                "{algorithm:?} k{i}"
            );
        }
        // The successor consumes 2 more of k0 (3 left of 5 after the first unit), then the
        // owner's older copy arrives again: the consumption stays.
        successor.check(key("k0"), &limit, 2, later).unwrap();
        successor.merge(&changed, later);
        let remaining = successor
            .check(key("k0"), &limit, 0, later)
            .unwrap()
            .remaining();
        assert_eq!(remaining, 2, "{algorithm:?}");
        // What the successor exports carries that consumption to a third store.
        let third = store(1 << 10, 4);
        let mut exported = Vec::new();
        successor.export(later, &|k| k == key("k0"), &mut exported);
        assert_eq!(exported.len(), 1, "{algorithm:?}");
        third.merge(&exported, later);
        let remaining = third
            .check(key("k0"), &limit, 0, later)
            .unwrap()
            .remaining();
        assert_eq!(remaining, 2, "{algorithm:?}");
    }
}

/// Received state is made safe before it is used: a window from the future or a count past the
/// limit (a peer with other rules, or a hostile one) only denies, and log times in the future
/// count as now; a limit lowered under a bucket's count denies too. Nothing overflows.
#[test]
fn implausible_received_state_and_lowered_limits_only_deny() {
    use floodgate::algorithm::WindowState;
    use floodgate::{BucketState, BucketValue};

    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let store = store(1 << 10, 4);
        let limit = Limit::new(algorithm, 5, HOUR, 5).unwrap();
        let hostile = BucketState {
            key: key("w"),
            value: BucketValue::Window {
                limit,
                state: WindowState {
                    window: u64::MAX,
                    count: u64::MAX,
                    previous: u64::MAX,
                },
            },
        };
        assert_eq!(store.merge(std::slice::from_ref(&hostile), NOW), 0);
        let decision = store.check(key("w"), &limit, 1, NOW).unwrap();
        assert!(!decision.is_allowed(), "{algorithm:?}: {decision:?}");
        // Lowered from 5 to 3 with 5 taken: denied, nothing remains.
        let lowered = Limit::new(algorithm, 3, HOUR, 3).unwrap();
        for _ in 0..5 {
            store.check(key("x"), &limit, 1, NOW).unwrap();
        }
        let decision = store.check(key("x"), &lowered, 1, NOW).unwrap();
        assert!(!decision.is_allowed(), "{algorithm:?}: {decision:?}");
        assert_eq!(decision.remaining(), 0);
    }
    let store = store(1 << 10, 4);
    let limit = Limit::new(Algorithm::SlidingLog, 3, HOUR, 3).unwrap();
    let future = BucketState {
        key: key("l"),
        value: BucketValue::Log {
            limit,
            times_ns: vec![u64::MAX; 3],
        },
    };
    store.merge(std::slice::from_ref(&future), NOW);
    let decision = store.check(key("l"), &limit, 1, NOW).unwrap();
    assert!(!decision.is_allowed());
    // Taken as admitted now: free again one period later.
    assert!(
        store
            .check(key("l"), &limit, 1, NOW + HOUR)
            .unwrap()
            .is_allowed()
    );
}

/// A received GCRA TAT at the far end of time, whatever margin it claims, cannot lock a key:
/// the merge bounds it, and the key's next check clamps it to what that key's limit may owe,
/// waits at most two capacities and passes after it. Nothing overflows.
#[test]
fn a_hostile_gcra_tat_is_clamped_to_what_the_limit_allows() {
    use floodgate::{BucketState, BucketValue};

    let limit = Limit::gcra(3, NANOS_PER_SEC, 3).unwrap();
    for margin_ms in [0, 1_000, u32::MAX] {
        let store = store(1 << 10, 4);
        let hostile = BucketState {
            key: key("g"),
            value: BucketValue::Gcra {
                tat_ns: u64::MAX,
                margin_ms,
            },
        };
        assert_eq!(store.merge(std::slice::from_ref(&hostile), NOW), 0);
        // What the merge kept is bounded (exported as it is stored).
        let mut kept = Vec::new();
        store.export(NOW, &|_| true, &mut kept);
        let BucketValue::Gcra { tat_ns, .. } = kept[0].value else {
            panic!("{kept:?}")
        };
        assert!(tat_ns <= NOW + u64::MAX / 2, "margin {margin_ms}: {tat_ns}");
        let decision = store.check(key("g"), &limit, 1, NOW).unwrap();
        let wait = decision.retry_after_ns().unwrap();
        assert!(!decision.is_allowed());
        let most = floodgate::algorithm::gcra::most_ahead_ns(&limit);
        assert!(wait <= most, "margin {margin_ms}: {decision:?}");
        assert!(decision.reset_after_ns() <= most);
        assert!(
            store
                .check(key("g"), &limit, 1, NOW + wait)
                .unwrap()
                .is_allowed()
        );
    }
    // An honest margin bounds the merge itself: at most twice the margin plus the longest
    // period (one capacity owed).
    let store = store(1 << 10, 4);
    let hostile = BucketState {
        key: key("h"),
        value: BucketValue::Gcra {
            tat_ns: u64::MAX,
            margin_ms: 5,
        },
    };
    store.merge(std::slice::from_ref(&hostile), NOW);
    let mut kept = Vec::new();
    store.export(NOW, &|_| true, &mut kept);
    assert_eq!(
        kept[0].value,
        BucketValue::Gcra {
            tat_ns: NOW + 2 * (6_000_000 + floodgate::MAX_PERIOD_NS),
            margin_ms: 5
        }
    );
}

/// Keys whose hash has a zero low half (the GCRA table's empty-slot marker) are still kept,
/// found, told apart, replicated and forgotten like any other: received ones too.
#[test]
fn keys_with_a_zero_low_hash_are_kept_like_any_other() {
    use floodgate::{BucketState, BucketValue};

    let store = store(1 << 10, 1);
    let limit = Limit::gcra(1, HOUR, 1).unwrap();
    let zero_low = |check: u32| BucketKey::from_u128(u128::from(check) << 64);
    let received: Vec<BucketState> = (0..40)
        .map(|check| BucketState {
            key: zero_low(check),
            value: BucketValue::Gcra {
                tat_ns: NOW + HOUR,
                margin_ms: 0,
            },
        })
        .collect();
    assert_eq!(store.merge(&received, NOW), 0);
    assert_eq!(store.len(), 40);
    for check in 0..40 {
        assert!(
            !store
                .check(zero_low(check), &limit, 1, NOW)
                .unwrap()
                .is_allowed(),
            "key {check} lost"
        );
    }
    // Local checks of such keys consume their own buckets.
    for check in 100..120 {
        assert!(
            store
                .check(zero_low(check), &limit, 1, NOW)
                .unwrap()
                .is_allowed()
        );
        assert!(
            !store
                .check(zero_low(check), &limit, 1, NOW)
                .unwrap()
                .is_allowed()
        );
    }
    let mut exported = Vec::new();
    store.export(NOW, &|_| true, &mut exported);
    assert_eq!(exported.len(), 60);
    assert_eq!(store.sweep_expired(NOW + 2 * HOUR, 1), 60);
    assert!(store.is_empty());
}

/// A window received under another period than the one the key is checked at (a peer with
/// other rules) is rebased by absolute time, not read as a window index of the local period:
/// the admissions count and no wait exceeds the local period.
#[test]
fn a_window_received_under_another_period_is_rebased() {
    use floodgate::algorithm::WindowState;
    use floodgate::{BucketState, BucketValue};

    let now = 1_700_000_000 * NANOS_PER_SEC;
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let per_second = Limit::window(algorithm, 3, NANOS_PER_SEC).unwrap();
        let per_minute = Limit::window(algorithm, 3, 60 * NANOS_PER_SEC).unwrap();
        let received = BucketState {
            key: key("w"),
            value: BucketValue::Window {
                limit: per_second,
                state: WindowState {
                    window: now / NANOS_PER_SEC,
                    count: 3,
                    previous: 0,
                },
            },
        };
        // Into a store that has no bucket for the key, and into one that counts it per minute.
        let (empty, counting) = (store(1 << 10, 4), store(1 << 10, 4));
        counting.check(key("w"), &per_minute, 1, now).unwrap();
        for store in [&empty, &counting] {
            store.merge(std::slice::from_ref(&received), now);
            let decision = store.check(key("w"), &per_minute, 1, now).unwrap();
            assert!(!decision.is_allowed(), "{algorithm}: {decision:?}");
            let wait = decision.retry_after_ns().unwrap();
            assert!(wait <= 2 * 60 * NANOS_PER_SEC, "{algorithm}: {decision:?}");
            assert!(
                store
                    .check(key("w"), &per_minute, 1, now + wait)
                    .unwrap()
                    .is_allowed()
            );
        }
    }
}

/// Eviction tells a denying GCRA bucket by the margin of the limit it is checked at now, not
/// the one it was created with: a key whose limit was tightened, and that is being denied under
/// it, is not evicted to make room.
#[test]
fn a_bucket_denying_under_a_changed_limit_is_still_spared() {
    let store = store(2, 1);
    // Created at 1/h with a burst of 2 (one hour of margin), then idle past its TAT.
    let roomy = Limit::gcra(1, HOUR, 2).unwrap();
    let tight = Limit::gcra(1, 60 * NANOS_PER_SEC, 1).unwrap();
    store.check(key("tightened"), &roomy, 1, NOW).unwrap();
    let later = NOW + 2 * HOUR;
    // Now 1/min: one admitted, the next denied for a minute.
    assert!(
        store
            .check(key("tightened"), &tight, 1, later)
            .unwrap()
            .is_allowed()
    );
    assert!(
        !store
            .check(key("tightened"), &tight, 1, later)
            .unwrap()
            .is_allowed()
    );
    // The shard is full with a second, non-denying key; a third needs room.
    let loose = Limit::gcra(10, HOUR, 10).unwrap();
    store.check(key("loose"), &loose, 1, later).unwrap();
    store.check(key("newcomer"), &loose, 1, later).unwrap();
    assert!(
        !store
            .check(key("tightened"), &tight, 1, later)
            .unwrap()
            .is_allowed(),
        "the denying key was evicted"
    );
}

/// A partition heal merges two copies of a sliding log: the node's own (few admissions, late in
/// the period) and the other side's (more, but earlier). The merged log must stay at least as
/// strict as the node's own at every later moment, so the node never admits more than the limit
/// in one period on its own. Keeping the copy with more admissions broke that: once the other
/// side's early entries left the period, the node admitted again beside its own late ones.
#[test]
fn a_merged_sliding_log_never_lets_its_own_node_over_its_limit() {
    const MS: u64 = 1_000_000;
    let limit = Limit::new(Algorithm::SlidingLog, 4, NANOS_PER_SEC, 4).unwrap();
    let (node, other_side) = (store(1 << 10, 4), store(1 << 10, 4));
    let k = key("healed");
    // The other side's owner admits the whole limit early in the period...
    for i in 0..4 {
        assert!(
            other_side
                .check(k, &limit, 1, NOW + (100 + i) * MS)
                .unwrap()
                .is_allowed()
        );
    }
    // ...and this node, cut off from it, admits 3 late in the same period.
    let mut own_admissions = Vec::new();
    for i in 0..3 {
        let at = NOW + (900 + i) * MS;
        assert!(node.check(k, &limit, 1, at).unwrap().is_allowed());
        own_admissions.push(at);
    }
    let heal = NOW + 950 * MS;
    let mut received = Vec::new();
    other_side.export(heal, &|_| true, &mut received);
    assert_eq!(node.merge(&received, heal), 0);
    // After the heal the node goes on deciding every 10 ms for a period.
    for step in 0..100 {
        let at = heal + step * 10 * MS;
        if node.check(k, &limit, 1, at).unwrap().is_allowed() {
            own_admissions.push(at);
        }
    }
    for &start in &own_admissions {
        let in_period = own_admissions
            .iter()
            .filter(|&&t| t >= start && t < start + NANOS_PER_SEC)
            .count();
        assert!(
            in_period <= 4,
            "the node alone admitted {in_period} of 4 in the period from {start}: {own_admissions:?}"
        );
    }
    // The merge is no stricter than the two copies together: the node admits again once the
    // later of the two copies' entries have left the period.
    assert!(own_admissions.len() > 3, "{own_admissions:?}");
}

/// A sliding log a metered charge left owing (twice its limit) travels whole: replicated or
/// handed off to a peer, and written to a snapshot and read back, the copy denies as long as
/// the original.
#[test]
fn a_log_left_owing_replicates_and_snapshots_whole() {
    use floodgate::store::snapshot::{decode_snapshot, encode_snapshot};
    use floodgate::wire::{
        FrameKind, FrameReader, ReplicateMessage, WireBucket, decode_replicate, encode_message,
    };
    const S: u64 = 1_000_000_000;
    let now = 1_000 * S;
    let limit = Limit::new(Algorithm::SlidingLog, 10, 60 * S, 10).unwrap();
    let key = BucketKey::for_key(b"tokens:k");
    let owing = BucketStore::new(StoreConfig {
        max_keys: 16,
        shards: 1,
    })
    .unwrap();
    assert_eq!(owing.charge(key, &limit, 25, now).unwrap().forgiven, 5);
    let mut states = Vec::new();
    owing.export(now, &|_| true, &mut states);
    assert_eq!(states.len(), 1);

    let mut frame = Vec::new();
    let message = ReplicateMessage {
        from: "a".into(),
        handoff: None,
        buckets: states.iter().map(WireBucket::from).collect(),
    };
    encode_message(&mut frame, FrameKind::Replicate, 1, &message);
    let mut reader = FrameReader::new(1 << 20);
    reader.extend(&frame);
    let replicated = {
        let frame = reader.next_frame().unwrap().unwrap();
        decode_replicate(frame.version, &frame.payload)
    }
    .unwrap();
    let mut snapshot = Vec::new();
    encode_snapshot(&states, now, &mut snapshot);
    let restored = decode_snapshot(&snapshot).unwrap();

    for received in [replicated.buckets, restored.buckets] {
        let copy = BucketStore::new(StoreConfig {
            max_keys: 16,
            shards: 1,
        })
        .unwrap();
        assert_eq!(copy.merge(&received, now), 0);
        // 20 in the last minute: a unit passes only once 11 of them have left it.
        for at in [now, now + 30 * S, now + 60 * S - 1] {
            assert_eq!(
                copy.peek(key, &limit, 1, at),
                owing.peek(key, &limit, 1, at),
                "at {at}"
            );
            assert!(!copy.peek(key, &limit, 1, at).is_allowed());
        }
        assert!(copy.peek(key, &limit, 1, now + 60 * S).is_allowed());
    }
}

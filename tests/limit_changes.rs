//! A key whose limit changes (a rules edit, or a client sending another limit for the same key)
//! is decided right under the new limit, through the `BucketStore`: no wait past what the new
//! limit allows, and a denied check passes again after its `retry_after`.
//!
//! The bound on a wait: one period for fixed windows and sliding logs, two capacities
//! (`2 * burst * interval`: an empty bucket and one capacity a metered charge may leave owed,
//! which a larger limit's debt is read as) for GCRA, and two periods for the sliding-window
//! counter, whose current window's count weighs until the end of the next window (so even a
//! key that never changed limit can wait up to two periods there).

use floodgate::{
    Algorithm, BucketKey, BucketStore, Clock, Decision, FakeClock, Limit, NANOS_PER_SEC,
    StoreConfig,
};
use proptest::prelude::*;

const SECOND: u64 = NANOS_PER_SEC;
const MINUTE: u64 = 60 * SECOND;
const DAY: u64 = 86_400 * SECOND;
/// Clocks start at a realistic Unix time, where window indices of short periods are large: the
/// case a window index misread under a longer period used to turn into a wait of centuries.
const EPOCH_2024: u64 = 1_700_000_000 * SECOND;

/// Periods from 1 ms to a day, as rules use them.
const PERIODS: [u64; 7] = [
    1_000_000,
    7_000_000,
    SECOND,
    10 * SECOND,
    MINUTE,
    3_600 * SECOND,
    DAY,
];

fn store() -> BucketStore {
    BucketStore::new(StoreConfig {
        max_keys: 1 << 10,
        shards: 4,
    })
    .unwrap()
}

fn key() -> BucketKey {
    BucketKey::new(b"limit-changes", b"user:42")
}

/// The longest wait `limit` may ever report.
fn longest_wait(limit: &Limit) -> u64 {
    match limit.algorithm() {
        Algorithm::Gcra => floodgate::algorithm::gcra::most_ahead_ns(limit),
        Algorithm::SlidingWindow => 2 * limit.period_ns(),
        Algorithm::FixedWindow | Algorithm::SlidingLog => limit.period_ns(),
    }
}

/// A limit of `algorithm` from the generated parts (burst only matters to GCRA).
fn limit(algorithm: Algorithm, rate: u64, period_index: usize, burst: u64) -> Limit {
    let period = PERIODS[period_index % PERIODS.len()];
    let burst = if algorithm == Algorithm::Gcra {
        burst
    } else {
        rate
    };
    Limit::new(algorithm, rate, period, burst).unwrap()
}

/// The wait and reset of `decision` are within what `limit` allows.
fn assert_bounded(decision: &Decision, limit: &Limit) -> Result<(), TestCaseError> {
    let most = longest_wait(limit);
    if let Some(retry) = decision.retry_after_ns() {
        prop_assert!(
            retry <= most,
            "{decision:?} under {limit}: retry past {most}"
        );
    }
    prop_assert!(
        decision.reset_after_ns() <= most,
        "{decision:?} under {limit}: reset past {most}"
    );
    Ok(())
}

/// One step: the algorithm (or the key's current one), the limit's rate, period and burst, how
/// long to wait before it (per mille of the new limit's longest wait), and the cost.
type Step = (usize, u64, usize, u64, u64, u64);

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (
            0usize..8,
            1u64..6,
            0usize..PERIODS.len(),
            1u64..6,
            0u64..1_500,
            0u64..4,
        ),
        1..80,
    )
}

/// Drives one key through `steps`; `algorithm_of` picks each step's algorithm from the step's
/// first field.
fn drive(steps: Vec<Step>, algorithm_of: impl Fn(usize) -> Algorithm) -> Result<(), TestCaseError> {
    let store = store();
    let clock = FakeClock::new(EPOCH_2024 + 123_456_789);
    for (which, rate, period, burst, wait_permille, cost) in steps {
        let limit = limit(algorithm_of(which), rate, period, burst);
        // Mostly short waits (a change while the old limit's state is fresh: up to 1 % of the
        // new limit's longest wait), else up to one whole longest wait.
        let most = longest_wait(&limit);
        clock.advance(if wait_permille < 1_000 {
            most / 100_000 * wait_permille
        } else {
            most / 500 * (wait_permille - 1_000)
        });
        let now = clock.now_ns();
        let decision = store.check(key(), &limit, cost, now).unwrap();
        assert_bounded(&decision, &limit)?;
        if let Decision::Denied { retry_after_ns, .. } = decision {
            // Not denied for ever: the same check passes once the wait is over.
            prop_assert!(retry_after_ns > 0);
            clock.advance(retry_after_ns);
            let again = store.check(key(), &limit, cost, clock.now_ns()).unwrap();
            prop_assert!(
                again.is_allowed(),
                "{decision:?} under {limit}, then {again:?} after the wait"
            );
            assert_bounded(&again, &limit)?;
        }
    }
    Ok(())
}

proptest! {
    /// For each algorithm, the key's rate, period and burst change at random times: every
    /// decision stays within the new limit's bounds and a denied check passes after its wait.
    #[test]
    fn a_changed_limit_never_waits_past_what_it_allows(
        algorithm in prop::sample::select(Algorithm::ALL.to_vec()),
        steps in steps(),
    ) {
        drive(steps, |_| algorithm)?;
    }

    /// The same when the algorithm changes too (a rules edit that switches it), among all four.
    #[test]
    fn a_changed_algorithm_never_waits_past_what_it_allows(steps in steps()) {
        drive(steps, |which| Algorithm::ALL[which % Algorithm::ALL.len()])?;
    }

    /// After a change, waiting one longest wait of the new limit gives a key that decides as a
    /// fresh key would for a first check: the old state is rebased, not misread.
    #[test]
    fn one_new_period_after_a_change_the_key_allows_as_a_fresh_one(
        algorithm in prop::sample::select(Algorithm::ALL.to_vec()),
        (old_rate, old_period) in (1u64..6, 0usize..PERIODS.len()),
        (new_rate, new_period) in (1u64..6, 0usize..PERIODS.len()),
        used in 1u64..6,
    ) {
        let (store, fresh) = (store(), store());
        let old = limit(algorithm, old_rate, old_period, old_rate);
        let new = limit(algorithm, new_rate, new_period, new_rate);
        let now = EPOCH_2024 + 987_654_321;
        for _ in 0..used {
            store.check(key(), &old, 1, now).unwrap();
        }
        let first = store.check(key(), &new, 1, now).unwrap();
        assert_bounded(&first, &new)?;
        let later = now + longest_wait(&new);
        prop_assert_eq!(
            store.check(key(), &new, 1, later).unwrap(),
            fresh.check(key(), &new, 1, later).unwrap()
        );
    }
}

/// The case that used to lock a key for centuries: `3/s`, then `3/min`, `3/d` and `3/s` again
/// on one key, checked back to back, for every algorithm.
#[test]
fn three_per_second_then_minute_then_day_then_second() {
    for algorithm in Algorithm::ALL {
        let store = store();
        let clock = FakeClock::new(EPOCH_2024 + 42);
        for period in [SECOND, MINUTE, DAY, SECOND] {
            let limit = Limit::new(algorithm, 3, period, 3).unwrap();
            for _ in 0..4 {
                clock.advance(1_000);
                let decision = store.check(key(), &limit, 1, clock.now_ns()).unwrap();
                let retry = decision.retry_after_ns().unwrap();
                assert!(
                    retry <= longest_wait(&limit),
                    "{algorithm} at {limit}: {decision:?}"
                );
                assert!(decision.reset_after_ns() <= longest_wait(&limit));
            }
        }
    }
}

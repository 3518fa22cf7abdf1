//! GCRA (generic cell rate algorithm), the token bucket stored as one number.
//!
//! The state is the theoretical arrival time (TAT): the instant at which the bucket would be full
//! again. `debt = max(tat, now) - now` is the time the tokens in use take to refill; a cost `c`
//! passes when `debt + c * interval <= burst * interval`. A TAT in the past equals a fresh, full
//! bucket, so forgetting an expired state never changes a decision.
//!
//! A metered charge ([`charge`]) takes units after the fact, never refused, so it may leave the
//! bucket owing: a debt beyond one capacity, repaid at the refill rate before anything passes
//! again. A bucket owes at most one more capacity (its TAT at most two capacities ahead); what
//! a charge would add beyond that is forgiven.

use crate::{Decision, Limit};

/// Decides `cost` against a bucket whose TAT is `tat_ns`. Returns the decision and the new TAT
/// to store: when it consumed something, or when the TAT had to be brought back within what
/// this limit lets a bucket owe (see below); `None` otherwise (plain denials and peeks).
///
/// A TAT is absolute time, so debt carries over a change of limit (a rules edit, or a client
/// sending another limit for the same key) as it should. But a TAT further ahead than this
/// limit allows a bucket to owe (two capacities: an empty bucket and one capacity of a metered
/// charge's debt), left by a larger limit or received from a peer, is read as owing exactly
/// that, and stored so: no wait ever exceeds two capacities (`2 * burst * interval`), and
/// waiting `retry_after` passes exactly.
#[inline]
pub fn decide(limit: &Limit, tat_ns: u64, now_ns: u64, cost: u64) -> (Decision, Option<u64>) {
    let burst = limit.burst();
    if cost > burst {
        return (Decision::CostExceedsBurst { burst }, None);
    }
    let interval = limit.interval_ns();
    let capacity = limit.capacity_ns();
    let most_owed = most_ahead_ns(limit);
    let debt = tat_ns.saturating_sub(now_ns);
    let clamped = debt > most_owed;
    let debt = debt.min(most_owed);
    // Cannot overflow: cost <= burst, so the sum is at most three capacities, and a capacity is
    // at most u64::MAX / 4.
    let new_debt = debt + cost * interval;
    if new_debt <= capacity {
        let decision = Decision::Allowed {
            remaining: (capacity - new_debt) / interval,
            reset_after_ns: new_debt,
        };
        let new_tat = (cost > 0 || clamped).then(|| now_ns.saturating_add(new_debt));
        debug_assert!(new_tat.is_none_or(|t| t - now_ns <= capacity));
        (decision, new_tat)
    } else {
        // Debt falls by one nanosecond per nanosecond; cost <= burst guarantees the wait is at
        // most `debt`, so the TAT stays ahead of the retry time and the wait is exact.
        let retry_after_ns = new_debt - capacity;
        debug_assert!(retry_after_ns <= debt);
        let decision = Decision::Denied {
            // Owing past an empty bucket: nothing remains.
            remaining: capacity.saturating_sub(debt) / interval,
            retry_after_ns,
            reset_after_ns: debt,
        };
        (decision, clamped.then(|| now_ns.saturating_add(debt)))
    }
}

/// How far ahead of `now` a TAT may lie: an empty bucket (one capacity) and one capacity owed.
#[inline]
pub fn most_ahead_ns(limit: &Limit) -> u64 {
    // A capacity is at most u64::MAX / 4, so twice one fits.
    2 * limit.capacity_ns()
}

/// Takes `cost` units after the fact (a metered charge), never refused: the TAT moves
/// `cost * interval` past `max(tat, now)`, at most [`most_ahead_ns`] ahead of `now`. Returns
/// the new TAT and the units forgiven beyond that bound.
#[inline]
pub fn charge(limit: &Limit, tat_ns: u64, now_ns: u64, cost: u64) -> (u64, u64) {
    let interval = limit.interval_ns();
    let debt = tat_ns.saturating_sub(now_ns).min(most_ahead_ns(limit));
    let room = (most_ahead_ns(limit) - debt) / interval;
    let taken = cost.min(room);
    // taken * interval <= most_ahead - debt, so the sum stays within two capacities of now.
    let new_tat = now_ns.saturating_add(debt + taken * interval);
    (new_tat, cost - taken)
}

/// True when the bucket is full again: forgetting it changes no decision.
#[inline]
pub fn is_expired(tat_ns: u64, now_ns: u64) -> bool {
    tat_ns <= now_ns
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NANOS_PER_SEC as S;

    fn limit(rate: u64, burst: u64) -> Limit {
        Limit::gcra(rate, S, burst).unwrap()
    }

    #[test]
    fn a_full_bucket_admits_exactly_its_burst_at_once() {
        let l = limit(10, 4);
        let mut tat = 0;
        let now = 5 * S;
        for expected_remaining in [3, 2, 1, 0] {
            let (d, new) = decide(&l, tat, now, 1);
            assert_eq!(
                d,
                Decision::Allowed {
                    remaining: expected_remaining,
                    reset_after_ns: (4 - expected_remaining) * S / 10
                }
            );
            tat = new.unwrap();
        }
        let (d, new) = decide(&l, tat, now, 1);
        assert_eq!(
            d,
            Decision::Denied {
                remaining: 0,
                retry_after_ns: S / 10,
                reset_after_ns: 4 * S / 10
            }
        );
        assert_eq!(new, None);
    }

    #[test]
    fn cost_zero_peeks_and_cost_above_burst_never_passes() {
        let l = limit(10, 4);
        assert_eq!(
            decide(&l, 0, S, 0),
            (
                Decision::Allowed {
                    remaining: 4,
                    reset_after_ns: 0
                },
                None
            )
        );
        assert_eq!(
            decide(&l, 0, S, 5),
            (Decision::CostExceedsBurst { burst: 4 }, None)
        );
    }

    #[test]
    fn retry_after_is_exact_for_a_large_cost() {
        let l = limit(10, 10);
        let (_, tat) = decide(&l, 0, S, 8);
        let (d, _) = decide(&l, tat.unwrap(), S, 5);
        let wait = d.retry_after_ns().unwrap();
        assert_eq!(wait, 3 * S / 10);
        assert!(!decide(&l, tat.unwrap(), S + wait - 1, 5).0.is_allowed());
        assert!(decide(&l, tat.unwrap(), S + wait, 5).0.is_allowed());
    }

    /// Debt left by a larger limit (`3/min` before `3/s`) carries over but is clamped to what
    /// the new limit lets a bucket owe, and the clamp is stored so the wait it reports is exact.
    #[test]
    fn debt_from_a_larger_limit_is_clamped_to_what_the_new_limit_may_owe() {
        let per_minute = Limit::gcra(3, 60 * S, 3).unwrap();
        let per_second = limit(3, 3);
        let mut tat = 0;
        for _ in 0..3 {
            tat = decide(&per_minute, tat, S, 1).1.unwrap();
        }
        assert_eq!(tat, S + 60 * S);
        let (d, stored) = decide(&per_second, tat, S, 1);
        let wait = d.retry_after_ns().unwrap();
        assert!(!d.is_allowed());
        assert!(wait <= most_ahead_ns(&per_second), "{d:?}");
        assert!(d.reset_after_ns() <= most_ahead_ns(&per_second), "{d:?}");
        let stored = stored.expect("the clamp is stored");
        assert!(!decide(&per_second, stored, S + wait - 1, 1).0.is_allowed());
        assert!(decide(&per_second, stored, S + wait, 1).0.is_allowed());
        // A TAT at the far end of time (a hostile peer) is clamped just the same.
        let (d, stored) = decide(&per_second, u64::MAX, S, 3);
        assert_eq!(d.retry_after_ns(), Some(2 * per_second.capacity_ns()));
        assert_eq!(stored, Some(S + 2 * per_second.capacity_ns()));
    }

    /// A charge past what is left puts the bucket in debt: every check (a peek too) is denied
    /// until the debt is repaid at the refill rate, and `retry_after` says exactly when.
    #[test]
    fn a_charge_into_debt_is_repaid_at_the_refill_rate() {
        let l = limit(10, 10); // one unit per 100 ms, ten at once
        let now = 5 * S;
        let (tat, forgiven) = charge(&l, 0, now, 15);
        assert_eq!((tat, forgiven), (now + 15 * S / 10, 0));
        // Owing five units past empty: a peek is denied until they are repaid, a unit needs
        // 100 ms more.
        let (d, stored) = decide(&l, tat, now, 0);
        assert_eq!(
            d,
            Decision::Denied {
                remaining: 0,
                retry_after_ns: S / 2,
                reset_after_ns: 15 * S / 10
            }
        );
        assert_eq!(stored, None, "a denial leaves the debt as it was");
        assert_eq!(decide(&l, tat, now, 1).0.retry_after_ns(), Some(6 * S / 10));
        assert!(!decide(&l, tat, now + 6 * S / 10 - 1, 1).0.is_allowed());
        assert!(decide(&l, tat, now + 6 * S / 10, 1).0.is_allowed());
    }

    /// A bucket owes at most one capacity: a charge beyond it is forgiven, and reported.
    #[test]
    fn a_charge_beyond_one_capacity_of_debt_is_forgiven() {
        let l = limit(10, 10);
        let now = 5 * S;
        let (tat, forgiven) = charge(&l, 0, now, 50);
        assert_eq!((tat, forgiven), (now + 2 * S, 30));
        let (tat, forgiven) = charge(&l, tat, now, 1);
        assert_eq!((tat, forgiven), (now + 2 * S, 1));
        // A stale TAT counts from now; zero charges nothing.
        assert_eq!(charge(&l, 1, now, 0), (now, 0));
        assert_eq!(charge(&l, 1, now, 3), (now + 3 * S / 10, 0));
    }
}

//! GCRA (generic cell rate algorithm), the token bucket stored as one number.
//!
//! The state is the theoretical arrival time (TAT): the instant at which the bucket would be full
//! again. `debt = max(tat, now) - now` is the time the tokens in use take to refill; a cost `c`
//! passes when `debt + c * interval <= burst * interval`. A TAT in the past equals a fresh, full
//! bucket, so forgetting an expired state never changes a decision.

use crate::{Decision, Limit};

/// Decides `cost` against a bucket whose TAT is `tat_ns`. Returns the decision and, when it
/// consumed something, the new TAT to store (`None` for denials and peeks).
#[inline]
pub fn decide(limit: &Limit, tat_ns: u64, now_ns: u64, cost: u64) -> (Decision, Option<u64>) {
    let burst = limit.burst();
    if cost > burst {
        return (Decision::CostExceedsBurst { burst }, None);
    }
    let interval = limit.interval_ns();
    let capacity = limit.capacity_ns();
    // A TAT left by a larger limit (before a rule change) can exceed this capacity; the sums
    // below still cannot overflow because every capacity is at most u64::MAX / 4.
    let debt = tat_ns.saturating_sub(now_ns);
    let new_debt = debt + cost * interval;
    if new_debt <= capacity {
        let decision = Decision::Allowed {
            remaining: (capacity - new_debt) / interval,
            reset_after_ns: new_debt,
        };
        let new_tat = (cost > 0).then(|| now_ns + new_debt);
        debug_assert!(new_tat.is_none_or(|t| t > now_ns && t - now_ns <= capacity));
        (decision, new_tat)
    } else {
        // Debt falls by one nanosecond per nanosecond; cost <= burst guarantees the wait is at
        // most `debt`, so the TAT stays ahead of the retry time and the wait is exact.
        let retry_after_ns = new_debt - capacity;
        debug_assert!(retry_after_ns <= debt);
        let decision = Decision::Denied {
            remaining: capacity.saturating_sub(debt) / interval,
            retry_after_ns,
            reset_after_ns: debt,
        };
        (decision, None)
    }
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
}

//! "Take up to N tokens" from a bucket: the owner's answer to a token-lease request.
//!
//! Composed from the store's own atomic checks, so it holds for every algorithm the store has
//! (GCRA, fixed window, sliding-window counter, sliding log) and can never grant a token the
//! bucket does not hold: each grant is one check of cost `granted` that the bucket admitted.

use crate::store::StoreError;
use crate::{BucketKey, BucketStore, Decision, Limit};

/// What the owner granted from a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// Tokens taken from the bucket for the asker: `0..=want`, never more than the burst.
    pub granted: u64,
    /// Whole tokens still in the bucket after the grant.
    pub remaining: u64,
    /// When nothing was granted: the exact wait until one token is due (no token exists
    /// before it). 0 when something was granted.
    pub retry_after_ns: u64,
}

/// How many times a grant is retried with a smaller amount when other checks took tokens
/// between the look and the take. Each retry asks for what the bucket reported it holds, so
/// one normally suffices; the bound keeps a hot, contended key from looping.
const ATTEMPTS: usize = 4;

/// Takes up to `want` tokens from `key`'s bucket at `now_ns` (at most the limit's burst).
/// `want == 0` only reads the bucket.
pub fn take_up_to(
    store: &BucketStore,
    key: BucketKey,
    limit: &Limit,
    want: u64,
    now_ns: u64,
) -> Result<Grant, StoreError> {
    let mut ask = want.min(limit.burst());
    if ask == 0 {
        let peek = store.check(key, limit, 0, now_ns)?;
        return Ok(Grant {
            granted: 0,
            remaining: peek.remaining(),
            retry_after_ns: 0,
        });
    }
    let mut last_wait = 0;
    for _ in 0..ATTEMPTS {
        match store.check(key, limit, ask, now_ns)? {
            Decision::Allowed { remaining, .. } => {
                return Ok(Grant {
                    granted: ask,
                    remaining,
                    retry_after_ns: 0,
                });
            }
            Decision::Denied {
                remaining,
                retry_after_ns,
                ..
            } => {
                last_wait = retry_after_ns;
                if ask == 1 {
                    // Not even one token: its wait is the exact time the next one is due.
                    break;
                }
                // Fewer than asked are there: take those, or ask for one to learn its wait.
                ask = remaining.clamp(1, ask - 1);
            }
            // `ask <= burst`, so this cannot happen; answer "none" rather than guess.
            Decision::CostExceedsBurst { .. } => break,
        }
    }
    Ok(Grant {
        granted: 0,
        remaining: 0,
        retry_after_ns: last_wait.max(1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Algorithm, NANOS_PER_SEC as S, StoreConfig};

    fn store() -> BucketStore {
        BucketStore::new(StoreConfig {
            max_keys: 64,
            shards: 1,
        })
        .unwrap()
    }

    fn every_algorithm() -> Vec<Limit> {
        vec![
            Limit::gcra(10, S, 10).unwrap(),
            Limit::window(Algorithm::FixedWindow, 10, S).unwrap(),
            Limit::window(Algorithm::SlidingWindow, 10, S).unwrap(),
            Limit::window(Algorithm::SlidingLog, 10, S).unwrap(),
        ]
    }

    /// Grants add up to exactly what the bucket holds, whatever is asked, for every algorithm;
    /// then nothing more is granted and the wait given is exact.
    #[test]
    fn grants_never_exceed_the_bucket_and_the_wait_is_exact() {
        for limit in every_algorithm() {
            let store = store();
            let key = BucketKey::for_key(b"hot");
            let now = 100 * S;
            let mut total = 0;
            for want in [3, 4, 5, 6, 1] {
                total += take_up_to(&store, key, &limit, want, now).unwrap().granted;
            }
            assert_eq!(total, 10, "{limit:?}: the whole burst, no more");
            let none = take_up_to(&store, key, &limit, 4, now).unwrap();
            assert_eq!(none.granted, 0, "{limit:?}");
            let wait = none.retry_after_ns;
            assert!(wait > 0, "{limit:?}");
            assert!(
                !store
                    .check(key, &limit, 1, now + wait - 1)
                    .unwrap()
                    .is_allowed(),
                "{limit:?}: a token before the wait"
            );
            let later = take_up_to(&store, key, &limit, 1, now + wait).unwrap();
            assert_eq!(later.granted, 1, "{limit:?}: the token due at the wait");
        }
    }

    #[test]
    fn a_want_above_the_burst_is_clamped_and_zero_only_reads() {
        let store = store();
        let key = BucketKey::for_key(b"k");
        let limit = Limit::gcra(10, S, 4).unwrap();
        let peek = take_up_to(&store, key, &limit, 0, S).unwrap();
        assert_eq!((peek.granted, peek.remaining), (0, 4));
        let grant = take_up_to(&store, key, &limit, 1_000, S).unwrap();
        assert_eq!((grant.granted, grant.remaining), (4, 0));
    }

    /// Returned tokens are refunded to the bucket: they can be granted again.
    #[test]
    fn returned_tokens_can_be_granted_again() {
        let store = store();
        let key = BucketKey::for_key(b"k");
        let limit = Limit::gcra(10, S, 10).unwrap();
        assert_eq!(take_up_to(&store, key, &limit, 10, S).unwrap().granted, 10);
        store.refund(key, &limit, 4, S);
        assert_eq!(take_up_to(&store, key, &limit, 10, S).unwrap().granted, 4);
    }
}

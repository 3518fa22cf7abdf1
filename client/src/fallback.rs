//! Failure modes: deciding checks a node did not decide, with a local fallback store.

use floodgate::clock::{Elapsed, EpochClock};
use floodgate::{BucketKey, BucketStore, Clock, Decision, StoreConfig, StoreError};

use floodgate::check::{Check, DegradedReason, FailureMode, Source, Verdict};

/// The fallback store's monotonic clock: tokio's, so tests with paused time move its buckets.
#[derive(Debug, Clone, Copy)]
struct TokioElapsed(tokio::time::Instant);

impl Elapsed for TokioElapsed {
    fn elapsed_ns(&self) -> u64 {
        u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// Decides what nodes could not: `Open` checks through a local [`BucketStore`] with the same
/// limits (degraded, not gone), `Closed` checks denied.
#[derive(Debug)]
pub(crate) struct Fallback {
    store: BucketStore,
    clock: EpochClock<TokioElapsed>,
    /// `retry_after` of a fail-closed denial: the breaker cooldown, the soonest a node may be
    /// asked again.
    closed_retry_after_ns: u64,
}

impl Fallback {
    pub(crate) fn new(store: StoreConfig, closed_retry_after_ns: u64) -> Result<Self, StoreError> {
        Ok(Fallback {
            store: BucketStore::new(store)?,
            clock: EpochClock::starting(TokioElapsed(tokio::time::Instant::now())),
            closed_retry_after_ns,
        })
    }

    /// Verdicts for one group (one `check` call) where `answers[i]` is the node's decision for
    /// `checks[i]`, or why there is none.
    ///
    /// The group stays all-or-nothing: if the node denied any check, or a `Closed` check must be
    /// denied, the `Open` checks only peek at the fallback (consuming nothing); otherwise the
    /// `Open` checks are decided together with `check_all`, so a fallback denial of one consumes
    /// none of the others. (Node decisions already made cannot be taken back: a node that
    /// admitted part of a group and failed another part has consumed that part.)
    pub(crate) fn resolve(
        &self,
        checks: &[Check],
        answers: &[Result<Decision, DegradedReason>],
    ) -> Vec<Verdict> {
        debug_assert_eq!(checks.len(), answers.len());
        let node_denied = answers
            .iter()
            .any(|a| matches!(a, Ok(d) if !d.is_allowed()));
        let must_deny = checks
            .iter()
            .zip(answers)
            .any(|(c, a)| a.is_err() && c.failure_mode == FailureMode::Closed);
        let now_ns = self.clock.now_ns();
        let mut verdicts: Vec<Verdict> = checks
            .iter()
            .zip(answers)
            .map(|(check, answer)| match *answer {
                Ok(decision) => Verdict {
                    decision,
                    source: Source::Node,
                },
                Err(reason) => match check.failure_mode {
                    FailureMode::Closed => Verdict {
                        decision: self.fail_closed(),
                        source: Source::FailClosed(reason),
                    },
                    // Placeholder when the group passes: replaced by `check_all` below.
                    FailureMode::Open => Verdict {
                        decision: self.peek(check, now_ns),
                        source: Source::Fallback(reason),
                    },
                },
            })
            .collect();
        if node_denied || must_deny {
            return verdicts;
        }
        let open: Vec<usize> = (0..checks.len()).filter(|&i| answers[i].is_err()).collect();
        let fallback_checks: Vec<floodgate::BucketCheck> = open
            .iter()
            .map(|&i| floodgate::BucketCheck {
                key: bucket_key(&checks[i].key),
                limit: checks[i].limit,
                cost: checks[i].cost,
                peek: checks[i].peek,
            })
            .collect();
        let mut decisions = Vec::with_capacity(open.len());
        match self
            .store
            .check_all(&fallback_checks, now_ns, &mut decisions)
        {
            Ok(_) => {
                for (&i, decision) in open.iter().zip(decisions) {
                    verdicts[i].decision = decision;
                }
            }
            // `StoreError::Full`: the fallback is full of keys it is denying and cannot track
            // these. Failing open means letting them through untracked rather than denying.
            Err(_) => {
                for &i in &open {
                    verdicts[i].decision = Decision::Allowed {
                        remaining: 0,
                        reset_after_ns: 0,
                    };
                }
            }
        }
        verdicts
    }

    /// Every check of a group undecided for the same reason (the common degraded case).
    pub(crate) fn resolve_all(&self, checks: &[Check], reason: DegradedReason) -> Vec<Verdict> {
        let answers = vec![Err(reason); checks.len()];
        self.resolve(checks, &answers)
    }

    fn fail_closed(&self) -> Decision {
        Decision::Denied {
            remaining: 0,
            retry_after_ns: self.closed_retry_after_ns,
            reset_after_ns: self.closed_retry_after_ns,
        }
    }

    /// Takes a metered charge no node took from the local bucket (into debt if need be), so
    /// this client holds the key back as its nodes would. A full fallback store drops it.
    pub(crate) fn charge(&self, charge: &Check) {
        let now_ns = self.clock.now_ns();
        let _ = self
            .store
            .charge(bucket_key(&charge.key), &charge.limit, charge.cost, now_ns);
    }

    /// The bucket's state without consuming (a cost-0 check never inserts, so it cannot fail).
    fn peek(&self, check: &Check, now_ns: u64) -> Decision {
        self.store
            .check(bucket_key(&check.key), &check.limit, 0, now_ns)
            .unwrap_or(Decision::Allowed {
                remaining: check.limit.burst(),
                reset_after_ns: 0,
            })
    }
}

/// The same identity the node gives a key: the key bytes alone, under the empty rule.
fn bucket_key(key: &[u8]) -> BucketKey {
    BucketKey::for_key(key)
}

#[cfg(test)]
mod tests {
    use floodgate::Limit;

    use super::*;

    const COOLDOWN_NS: u64 = 1_000_000_000;

    #[tokio::test(start_paused = true)]
    async fn the_fallback_clock_follows_tokio_time_from_unix_time() {
        let clock = EpochClock::starting(TokioElapsed(tokio::time::Instant::now()));
        let start = clock.now_ns();
        tokio::time::advance(std::time::Duration::from_millis(250)).await;
        assert_eq!(clock.now_ns() - start, 250_000_000);
    }

    fn fallback() -> Fallback {
        Fallback::new(
            StoreConfig {
                max_keys: 1_024,
                shards: 4,
            },
            COOLDOWN_NS,
        )
        .unwrap()
    }

    fn limit(n: u64) -> Limit {
        Limit::gcra(n, 3_600_000_000_000, n).unwrap()
    }

    fn open(key: &str, n: u64) -> Check {
        Check::new(key, limit(n))
    }

    fn closed(key: &str, n: u64) -> Check {
        Check::new(key, limit(n)).failure_mode(FailureMode::Closed)
    }

    #[test]
    fn open_checks_are_decided_by_the_fallback_with_their_limit() {
        let f = fallback();
        let checks = [open("a", 2)];
        let verdicts: Vec<_> = (0..3)
            .map(|_| f.resolve_all(&checks, DegradedReason::Timeout)[0])
            .collect();
        assert!(verdicts[0].is_allowed() && verdicts[1].is_allowed());
        assert!(!verdicts[2].is_allowed());
        assert!(
            verdicts
                .iter()
                .all(|v| v.source == Source::Fallback(DegradedReason::Timeout))
        );
    }

    #[test]
    fn closed_checks_are_denied_with_the_cooldown_as_retry_after() {
        let f = fallback();
        let v = f.resolve_all(&[closed("a", 5)], DegradedReason::Unreachable)[0];
        assert_eq!(v.source, Source::FailClosed(DegradedReason::Unreachable));
        assert_eq!(v.decision.retry_after_ns(), Some(COOLDOWN_NS));
        assert!(!v.is_allowed());
    }

    #[test]
    fn a_closed_denial_keeps_open_checks_of_its_group_from_consuming() {
        let f = fallback();
        let group = [open("shared", 1), closed("login", 5)];
        let verdicts = f.resolve_all(&group, DegradedReason::CircuitOpen);
        assert!(!floodgate::check::all_allowed(&verdicts));
        // The open check only peeked: its single token is still there for a later group.
        assert!(verdicts[0].is_allowed());
        let alone = f.resolve_all(&[open("shared", 1)], DegradedReason::CircuitOpen);
        assert!(alone[0].is_allowed());
        let again = f.resolve_all(&[open("shared", 1)], DegradedReason::CircuitOpen);
        assert!(!again[0].is_allowed());
    }

    #[test]
    fn open_checks_of_a_group_are_all_or_nothing_in_the_fallback() {
        let f = fallback();
        // "b" allows one; the second group is denied by "b" and must not consume "a".
        assert!(floodgate::check::all_allowed(&f.resolve_all(
            &[open("a", 2), open("b", 1)],
            DegradedReason::Timeout
        )));
        assert!(!floodgate::check::all_allowed(&f.resolve_all(
            &[open("a", 2), open("b", 1)],
            DegradedReason::Timeout
        )));
        let a = f.resolve_all(&[open("a", 2)], DegradedReason::Timeout);
        assert!(a[0].is_allowed(), "the denied group consumed from `a`");
    }

    #[test]
    fn a_store_full_answer_follows_the_failure_mode_of_that_check_only() {
        let f = fallback();
        let node_allowed = Decision::Allowed {
            remaining: 4,
            reset_after_ns: 1,
        };
        let full = DegradedReason::Refused(floodgate::wire::ErrorCode::StoreFull);
        let verdicts = f.resolve(
            &[closed("x", 5), open("y", 5)],
            &[Ok(node_allowed), Err(full)],
        );
        assert_eq!(verdicts[0].source, Source::Node);
        assert_eq!(verdicts[0].decision, node_allowed);
        assert_eq!(verdicts[1].source, Source::Fallback(full));
        assert!(verdicts[1].is_allowed());

        let verdicts = f.resolve(
            &[open("x", 5), closed("y", 5)],
            &[Ok(node_allowed), Err(full)],
        );
        assert_eq!(verdicts[1].source, Source::FailClosed(full));
        assert!(!floodgate::check::all_allowed(&verdicts));
    }

    #[test]
    fn a_node_denial_keeps_degraded_open_checks_from_consuming() {
        let f = fallback();
        let node_denied = Decision::Denied {
            remaining: 0,
            retry_after_ns: 5,
            reset_after_ns: 5,
        };
        let full = DegradedReason::Refused(floodgate::wire::ErrorCode::StoreFull);
        let verdicts = f.resolve(&[open("x", 1), open("y", 1)], &[Ok(node_denied), Err(full)]);
        assert!(!floodgate::check::all_allowed(&verdicts));
        // "y" peeked only: its one token is still there.
        assert!(f.resolve_all(&[open("y", 1)], full)[0].is_allowed());
    }
}

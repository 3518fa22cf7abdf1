//! The verdict: a request's check outcomes → allow, wait, deny or unavailable, and what to refund.
//!
//! - A shadow rule never changes the verdict; its would-be denial is reported for metrics.
//! - Any enforced denial denies the request, unless every denying rule allows waiting at least as
//!   long as the longest retry: then the request waits (and is checked again).
//! - An enforced fail-closed rule the limiter could not decide makes the request unavailable
//!   (`503`), unless a rule already denied it (a known denial is the more useful answer).
//! - When the request does not pass, every check a node consumed is listed for refund, so a
//!   request denied by one rule costs the other rules nothing, also across nodes.

use std::sync::Arc;

use super::engine::PlannedCheck;
use super::rules::{FailureMode, Policy};
pub use crate::check::Source;
use crate::check::{DegradedReason, Verdict};
use crate::{Algorithm, Decision, Limit, NANOS_PER_SEC};

/// `Retry-After` of a `503` when the limiter was unreachable: long enough to not hammer it, short
/// enough that clients come back soon after it recovers.
pub const UNAVAILABLE_RETRY_AFTER_NS: u64 = NANOS_PER_SEC;

/// What became of one planned check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckOutcome {
    Decided {
        decision: Decision,
        /// `Node`, or `Fallback` (a fail-closed check nobody decided is `Unreachable`).
        source: Source,
        /// Whether the bucket kept the cost. False for a denial, and for an allowed check whose
        /// all-or-nothing group was denied on the same node (nothing to refund).
        consumed: bool,
    },
    /// Nobody decided it: no node answered and no fallback was used.
    Unreachable,
}

impl CheckOutcome {
    /// A node's decision; an allowed one consumed.
    pub fn node(decision: Decision) -> Self {
        CheckOutcome::Decided {
            decision,
            source: Source::Node,
            consumed: decision.is_allowed(),
        }
    }

    /// A local fallback bucket's decision, taken because of `reason`; an allowed one consumed
    /// (locally).
    pub fn fallback(decision: Decision, reason: DegradedReason) -> Self {
        CheckOutcome::Decided {
            decision,
            source: Source::Fallback(reason),
            consumed: decision.is_allowed(),
        }
    }

    /// The outcome of a check the client decided as part of an all-or-nothing group:
    /// `group_passed` when every check of the group was allowed. A group that did not pass
    /// consumed nothing (the node undid it; the fallback only peeked). A fail-closed check
    /// nobody decided is `Unreachable`: the verdict turns an enforced one into a `503`.
    pub fn of_group_member(verdict: Verdict, group_passed: bool) -> Self {
        let outcome = match verdict.source {
            Source::Node => CheckOutcome::node(verdict.decision),
            Source::Fallback(reason) => CheckOutcome::fallback(verdict.decision, reason),
            Source::FailClosed(_) => return CheckOutcome::Unreachable,
        };
        if group_passed {
            outcome
        } else {
            outcome.rolled_back()
        }
    }

    /// The same outcome, but nothing was kept: its group was undone on the node.
    pub fn rolled_back(self) -> Self {
        match self {
            CheckOutcome::Decided {
                decision, source, ..
            } => CheckOutcome::Decided {
                decision,
                source,
                consumed: false,
            },
            CheckOutcome::Unreachable => CheckOutcome::Unreachable,
        }
    }
}

/// What the gateway does with the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Allow,
    /// Wait this long, then check again (instead of a `429`); bounded by [`super::WaitBound`].
    Wait {
        wait_ns: u64,
    },
    /// `429`. `None`: some denying check can never pass (its cost exceeds the burst).
    Deny {
        retry_after_ns: Option<u64>,
    },
    /// `503`: a fail-closed rule could not be decided.
    Unavailable {
        retry_after_ns: u64,
    },
}

/// How one rule's check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleState {
    Allowed,
    /// `None` when the cost can never pass.
    Denied {
        retry_after_ns: Option<u64>,
    },
    Unreachable,
}

/// One rule's part in a verdict: enough for metrics and the `RateLimit` fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleReport {
    pub rule: Arc<str>,
    pub shadow: bool,
    pub failure_mode: FailureMode,
    pub limit: Limit,
    pub state: RuleState,
    pub source: Option<Source>,
    /// Units that could pass now; `None` when unreachable.
    pub remaining: Option<u64>,
    /// Time until more quota is available: the retry time for a denial, the next unit's refill
    /// for an allowed GCRA check, the window's reset for the window algorithms.
    pub more_after_ns: Option<u64>,
    /// A node kept the check's cost but the request does not pass: give it back. What a local
    /// fallback bucket took is not refunded: it is local, approximate and short-lived.
    pub refund: bool,
    /// The request's plan is not declared: this rule's limit came from its default (see
    /// [`super::Rule::limit_for_unknown_plan`]).
    pub unknown_plan: bool,
}

impl RuleReport {
    pub fn is_denied(&self) -> bool {
        matches!(self.state, RuleState::Denied { .. })
    }
}

/// The answer for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestVerdict {
    pub action: Action,
    /// One per planned check, in the same order.
    pub rules: Vec<RuleReport>,
}

impl Policy {
    /// The verdict for the planned checks' outcomes (see [`verdict`]).
    pub fn verdict(&self, planned: &[PlannedCheck], outcomes: &[CheckOutcome]) -> RequestVerdict {
        verdict(planned, outcomes)
    }
}

/// Combines one outcome per planned check into the request's verdict. A missing outcome counts
/// as unreachable.
pub fn verdict(planned: &[PlannedCheck], outcomes: &[CheckOutcome]) -> RequestVerdict {
    let mut rules = Vec::with_capacity(planned.len());
    let mut denied = false;
    let mut longest_retry = Some(0u64);
    let mut shortest_max_wait = u64::MAX;
    let mut unavailable = false;
    for (i, check) in planned.iter().enumerate() {
        let outcome = outcomes
            .get(i)
            .copied()
            .unwrap_or(CheckOutcome::Unreachable);
        let report = report(check, outcome);
        if !check.shadow {
            match report.state {
                RuleState::Denied { retry_after_ns } => {
                    denied = true;
                    longest_retry = longest_retry.zip(retry_after_ns).map(|(a, b)| a.max(b));
                    shortest_max_wait = shortest_max_wait.min(check.max_wait_ns);
                }
                RuleState::Unreachable => {
                    unavailable |= check.failure_mode == FailureMode::Closed;
                }
                RuleState::Allowed => {}
            }
        }
        rules.push(report);
    }
    let action = match longest_retry {
        _ if !denied && !unavailable => Action::Allow,
        Some(wait_ns) if denied && wait_ns <= shortest_max_wait && !unavailable => {
            Action::Wait { wait_ns }
        }
        retry_after_ns if denied => Action::Deny { retry_after_ns },
        _ => Action::Unavailable {
            retry_after_ns: UNAVAILABLE_RETRY_AFTER_NS,
        },
    };
    if action != Action::Allow {
        for (report, outcome) in rules.iter_mut().zip(outcomes) {
            report.refund = matches!(
                outcome,
                CheckOutcome::Decided {
                    consumed: true,
                    source: Source::Node,
                    ..
                }
            );
        }
    }
    RequestVerdict { action, rules }
}

fn report(check: &PlannedCheck, outcome: CheckOutcome) -> RuleReport {
    let mut report = RuleReport {
        rule: Arc::clone(&check.rule),
        shadow: check.shadow,
        failure_mode: check.failure_mode,
        limit: check.limit,
        state: RuleState::Unreachable,
        source: None,
        remaining: None,
        more_after_ns: None,
        refund: false,
        unknown_plan: check.unknown_plan,
    };
    if let CheckOutcome::Decided {
        decision, source, ..
    } = outcome
    {
        report.source = Some(source);
        report.remaining = Some(decision.remaining());
        report.state = match decision {
            Decision::Allowed { .. } => RuleState::Allowed,
            _ => RuleState::Denied {
                retry_after_ns: decision.retry_after_ns(),
            },
        };
        report.more_after_ns = Some(more_after_ns(&check.limit, &decision));
    }
    report
}

/// Time until the bucket can admit more than it reports as remaining now.
fn more_after_ns(limit: &Limit, decision: &Decision) -> u64 {
    match *decision {
        Decision::Denied { retry_after_ns, .. } => retry_after_ns,
        // GCRA: `remaining` grows by one when the debt falls to `capacity - (remaining + 1) *
        // interval`; the debt is `reset_after`.
        Decision::Allowed {
            remaining,
            reset_after_ns,
        } if limit.algorithm() == Algorithm::Gcra => {
            if remaining >= limit.burst() {
                0
            } else {
                // `reset_after_ns` comes from a node: saturate rather than trust its size.
                reset_after_ns
                    .saturating_add((remaining + 1) * limit.interval_ns())
                    .saturating_sub(limit.capacity_ns())
            }
        }
        Decision::Allowed { reset_after_ns, .. } => reset_after_ns,
        Decision::CostExceedsBurst { .. } => 0,
    }
}

impl RequestVerdict {
    pub fn is_allowed(&self) -> bool {
        self.action == Action::Allow
    }

    /// Enforced rules that denied the request.
    pub fn violated(&self) -> impl Iterator<Item = &RuleReport> {
        self.rules.iter().filter(|r| !r.shadow && r.is_denied())
    }

    /// Shadow rules that would have denied the request (for metrics; they did not deny it).
    pub fn shadow_denied(&self) -> impl Iterator<Item = &RuleReport> {
        self.rules.iter().filter(|r| r.shadow && r.is_denied())
    }

    /// Enforced fail-closed rules the limiter could not decide.
    pub fn undecided_closed(&self) -> impl Iterator<Item = &RuleReport> {
        self.rules.iter().filter(|r| {
            !r.shadow && r.state == RuleState::Unreachable && r.failure_mode == FailureMode::Closed
        })
    }

    /// The planned checks whose consumption a node must give back because the request does not
    /// pass (empty when it does; see [`RuleReport::refund`]). `planned` is the slice the verdict
    /// was computed from.
    pub fn refunds<'p>(&self, planned: &'p [PlannedCheck]) -> Vec<&'p PlannedCheck> {
        planned
            .iter()
            .zip(&self.rules)
            // A metered rule's peek took nothing.
            .filter(|(p, r)| r.refund && p.charge_after.is_none())
            .map(|(p, _)| p)
            .collect()
    }

    /// Reports rule `rule`'s bucket as a metered charge left it (`decision`, after the
    /// response): what the response's `RateLimit` field then says. The action stays: the
    /// request has passed.
    pub fn after_charge(&mut self, rule: &str, decision: &Decision) {
        for report in self.rules.iter_mut().filter(|r| &*r.rule == rule) {
            report.remaining = Some(decision.remaining());
            report.more_after_ns = Some(more_after_ns(&report.limit, decision));
        }
    }

    /// A `Wait` turned into the denial it stood for: when too many requests already wait.
    pub fn into_denial(mut self) -> RequestVerdict {
        if let Action::Wait { wait_ns } = self.action {
            self.action = Action::Deny {
                retry_after_ns: Some(wait_ns),
            };
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node's answer is outside input: a GCRA decision whose reset time no bucket could have
    /// gives the longest wait, not an overflow.
    #[test]
    fn a_reset_time_no_bucket_could_have_saturates() {
        let limit = Limit::gcra(10, NANOS_PER_SEC, 10).unwrap();
        let decision = Decision::Allowed {
            remaining: 0,
            reset_after_ns: u64::MAX,
        };
        assert_eq!(
            more_after_ns(&limit, &decision),
            u64::MAX - limit.capacity_ns()
        );
        // An ordinary one: one token back after an interval from empty.
        let decision = Decision::Allowed {
            remaining: 0,
            reset_after_ns: limit.capacity_ns(),
        };
        assert_eq!(more_after_ns(&limit, &decision), limit.interval_ns());
    }
}

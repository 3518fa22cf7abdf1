//! A request's planned checks as calls to the nodes, and the calls' verdicts back as outcomes.
//!
//! All-or-nothing across rules: the enforced checks are one group per owning node (one group
//! when every key lives on one node, which that node decides atomically); shadow checks are
//! each a group of their own, so a shadow denial never undoes an enforced check. When the groups
//! span nodes and the request does not pass, what the other nodes took is refunded
//! ([`super::RequestVerdict::refunds`]).

use super::engine::PlannedCheck;
use super::verdict::CheckOutcome;
use crate::check::{Check, Source, Verdict, all_allowed};

/// One call: checks decided all-or-nothing on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckGroup {
    /// The planned checks it carries: indices into the plan, in plan order.
    pub members: Vec<usize>,
    /// Those checks as the client sends them, in the same order.
    pub checks: Vec<Check>,
}

/// Groups `planned` into calls: the enforced checks by `owner_of(key)` (the node that decides
/// the key, as an index), each shadow check alone. Groups come in the order of their first
/// member.
pub fn group_by_owner(
    planned: &[PlannedCheck],
    mut owner_of: impl FnMut(&[u8]) -> usize,
) -> Vec<CheckGroup> {
    let mut owners: Vec<Option<usize>> = Vec::new();
    let mut groups: Vec<CheckGroup> = Vec::new();
    for (i, check) in planned.iter().enumerate() {
        let owner = (!check.shadow).then(|| owner_of(&check.key));
        let found = owner.and_then(|o| owners.iter().position(|&g| g == Some(o)));
        match found {
            Some(g) => {
                groups[g].members.push(i);
                groups[g].checks.push(check.check());
            }
            None => {
                owners.push(owner);
                groups.push(CheckGroup {
                    members: vec![i],
                    checks: vec![check.check()],
                });
            }
        }
    }
    groups
}

/// The outcomes of one decision round, one per planned check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundOutcomes {
    /// In plan order; a check whose call got no verdicts stays `Unreachable`.
    pub outcomes: Vec<CheckOutcome>,
    /// Checks not decided by their node (a fallback bucket, fail-closed, or a refused call).
    pub not_by_node: usize,
}

impl RoundOutcomes {
    /// Every check of a plan of `len` checks unreachable, until its group's verdicts are added.
    pub fn new(len: usize) -> Self {
        RoundOutcomes {
            outcomes: vec![CheckOutcome::Unreachable; len],
            not_by_node: 0,
        }
    }

    /// Records a group's verdicts (`None`: the call was refused as a whole). A group that did
    /// not pass as a whole consumed nothing (see [`CheckOutcome::of_group_member`]).
    pub fn add(&mut self, group: &CheckGroup, verdicts: Option<&[Verdict]>) {
        let Some(verdicts) = verdicts else {
            self.not_by_node += group.members.len();
            return;
        };
        let group_passed = all_allowed(verdicts);
        for (&i, verdict) in group.members.iter().zip(verdicts) {
            self.not_by_node += usize::from(verdict.source != Source::Node);
            if let Some(outcome) = self.outcomes.get_mut(i) {
                *outcome = CheckOutcome::of_group_member(*verdict, group_passed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Decision;
    use crate::check::DegradedReason;
    use crate::policy::Policy;
    use crate::policy::RequestAttributes;

    const RULES: &str = "\
rules:
  - name: a
    path: /**
    key: user
    limit: 5/min
  - name: b
    path: /**
    key: ip
    limit: 5/min
  - name: s1
    path: /**
    key: user
    limit: 1/min
    mode: shadow
  - name: s2
    path: /**
    key: ip
    limit: 1/min
    mode: shadow
";

    fn planned() -> Vec<PlannedCheck> {
        let policy = Policy::from_yaml(RULES).unwrap();
        policy.checks_for(&RequestAttributes {
            method: "GET",
            path: "/",
            user: Some("u"),
            client_ip: Some("203.0.113.9".parse().unwrap()),
            ..Default::default()
        })
    }

    fn shadow(planned: &[PlannedCheck]) -> Vec<usize> {
        (0..planned.len()).filter(|&i| planned[i].shadow).collect()
    }

    #[test]
    fn enforced_checks_group_by_owner_and_each_shadow_check_is_alone() {
        let planned = planned();
        assert_eq!(planned.len(), 4);
        let shadows = shadow(&planned);
        assert_eq!(shadows.len(), 2);
        // One node: the enforced checks are one group, each shadow check another.
        let groups = group_by_owner(&planned, |_| 0);
        assert_eq!(groups.len(), 3);
        let enforced: Vec<usize> = (0..4).filter(|i| !shadows.contains(i)).collect();
        assert_eq!(groups[0].members, enforced);
        assert_eq!(groups[0].checks[1], planned[enforced[1]].check());
        for (group, &s) in groups[1..].iter().zip(&shadows) {
            assert_eq!(group.members, [s]);
        }
        // A node per key: every check alone.
        let groups = group_by_owner(&planned, |key| usize::from(key[key.len() - 1]));
        assert!(groups.iter().all(|g| g.members.len() == 1));
    }

    #[test]
    fn a_group_that_did_not_pass_consumed_nothing_and_fail_closed_is_unreachable() {
        let group = CheckGroup {
            members: vec![0, 2],
            checks: Vec::new(),
        };
        let allowed = Verdict {
            decision: Decision::Allowed {
                remaining: 0,
                reset_after_ns: 1,
            },
            source: Source::Node,
        };
        let denied = Verdict {
            decision: Decision::Denied {
                remaining: 0,
                retry_after_ns: 1,
                reset_after_ns: 1,
            },
            source: Source::Fallback(DegradedReason::Timeout),
        };
        let mut round = RoundOutcomes::new(3);
        round.add(&group, Some(&[allowed, denied]));
        assert_eq!(
            round.outcomes[0],
            CheckOutcome::node(allowed.decision).rolled_back()
        );
        assert_eq!(
            round.outcomes[2],
            CheckOutcome::fallback(denied.decision, DegradedReason::Timeout).rolled_back()
        );
        assert_eq!(round.outcomes[1], CheckOutcome::Unreachable);
        assert_eq!(round.not_by_node, 1);

        let closed = Verdict {
            source: Source::FailClosed(DegradedReason::Unreachable),
            ..denied
        };
        let mut round = RoundOutcomes::new(3);
        round.add(&group, Some(&[allowed, closed]));
        assert_eq!(round.outcomes[2], CheckOutcome::Unreachable);
        round.add(
            &CheckGroup {
                members: vec![1],
                checks: Vec::new(),
            },
            None,
        );
        assert_eq!(round.not_by_node, 2);
    }
}

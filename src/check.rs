//! A check as a caller asks it ([`Check`]) and the answer it gets ([`Verdict`]): the decision and
//! who made it ([`Source`]), with the reason when no node did ([`DegradedReason`]).
//!
//! The client sends these; the policy turns verdicts into its [`crate::policy::CheckOutcome`]s.
//! [`crate::BucketCheck`] is the store's form of a check (a hashed [`crate::BucketKey`], no failure
//! mode), what a node or a fallback store decides in the end.

use crate::region::Scope;
use crate::wire::ErrorCode;
use crate::{Decision, Limit};

/// What to do with a check when no node can decide it (a rule's `failure_mode:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FailureMode {
    /// Decide through the client's local fallback bucket: degraded, not gone. The default.
    #[default]
    Open,
    /// Refuse: for limits that protect something, like logins (a gateway answers `503`).
    Closed,
}

/// One rate-limit check: consume `cost` from the bucket of `key` under `limit`.
///
/// The key bytes are the bucket's whole identity on the node, so callers put the rule's name in
/// them (e.g. `b"login:ip:203.0.113.9"`); at most [`crate::policy::MAX_KEY_BYTES`] bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub key: Vec<u8>,
    pub limit: Limit,
    /// Units to consume; 0 peeks without consuming.
    pub cost: u64,
    /// What to do when no node can decide it.
    pub failure_mode: FailureMode,
    /// Where it is decided across regions (`region` by default: in the gateway's region).
    pub scope: Scope,
    /// Decide this key at the gateway against token leases once the gateway checks it this many
    /// times a second (a rule's `lease_above`); `None`: as the client's config says.
    pub lease_above_per_sec: Option<u64>,
    /// Decide `cost` but take nothing: the check a metered request makes before it goes on
    /// (does its key have the estimate left?); the cost itself is charged after the response
    /// (`Client::charge`).
    pub peek: bool,
}

impl Check {
    /// A check of cost 1, failing open.
    pub fn new(key: impl Into<Vec<u8>>, limit: Limit) -> Self {
        Check {
            key: key.into(),
            limit,
            cost: 1,
            failure_mode: FailureMode::Open,
            scope: Scope::Region,
            lease_above_per_sec: None,
            peek: false,
        }
    }

    /// Asks whether the bucket has `cost` left without taking it.
    pub fn peek(mut self) -> Self {
        self.peek = true;
        self
    }

    pub fn cost(mut self, cost: u64) -> Self {
        self.cost = cost;
        self
    }

    pub fn failure_mode(mut self, mode: FailureMode) -> Self {
        self.failure_mode = mode;
        self
    }

    pub fn scope(mut self, scope: Scope) -> Self {
        self.scope = scope;
        self
    }

    /// Leases this key's tokens at a gateway checking it at least `per_sec` times a second.
    pub fn lease_above(mut self, per_sec: u64) -> Self {
        self.lease_above_per_sec = Some(per_sec);
        self
    }
}

/// Why a check was not decided by a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DegradedReason {
    /// The node did not answer within the call's timeout.
    Timeout,
    /// No connection to the node, or it was lost with the call in flight.
    Unreachable,
    /// The node's circuit breaker is open after repeated failures: the call was not sent.
    CircuitOpen,
    /// Too many checks already queued for the node: it is not keeping up.
    Backlog,
    /// The node could not decide (e.g. `StoreFull`, `Overloaded`, `ShuttingDown`).
    Refused(ErrorCode),
    /// The node's answer broke the protocol (wrong count, bad frame); the stream was dropped.
    Protocol,
}

impl std::fmt::Display for DegradedReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DegradedReason::Timeout => f.write_str("timeout"),
            DegradedReason::Unreachable => f.write_str("unreachable"),
            DegradedReason::CircuitOpen => f.write_str("circuit open"),
            DegradedReason::Backlog => f.write_str("backlog full"),
            DegradedReason::Refused(code) => write!(f, "refused: {code}"),
            DegradedReason::Protocol => f.write_str("protocol error"),
        }
    }
}

/// Who decided a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// The node that owns the key: the normal, exact path.
    Node,
    /// The client's local fallback bucket (failure mode `Open`), because of the reason given.
    Fallback(DegradedReason),
    /// Denied without asking anyone (failure mode `Closed`), because of the reason given.
    FailClosed(DegradedReason),
}

impl Source {
    /// Why the node did not decide, if it did not.
    pub fn degraded(self) -> Option<DegradedReason> {
        match self {
            Source::Node => None,
            Source::Fallback(reason) | Source::FailClosed(reason) => Some(reason),
        }
    }
}

/// The answer to one check: the decision and where it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub decision: Decision,
    pub source: Source,
}

impl Verdict {
    pub fn is_allowed(&self) -> bool {
        self.decision.is_allowed()
    }
}

/// True when a group's request may proceed: every check allowed. A denied group may contain
/// `Allowed` decisions (the other buckets' unchanged state), which consumed nothing.
pub fn all_allowed(verdicts: &[Verdict]) -> bool {
    verdicts.iter().all(Verdict::is_allowed)
}

//! One call to one node: through the node's breaker and queue, its reply turned into verdicts
//! (checks it could not decide follow their failure modes).

use floodgate::check::{Check, DegradedReason, Source, Verdict};
use floodgate::region::Scope;
use floodgate::wire::{WireCheck, WireDecision, WireScope};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::breaker::Admit;
use crate::error::ClientError;
use crate::fallback::Fallback;
use crate::link::NodeLink;
use crate::queue::{Call, Reply};

/// What one node made of a call: an answer for the caller, or why it gave none.
pub(crate) enum Attempt {
    Answered(Result<Vec<Verdict>, ClientError>),
    /// Sent, but no answer came (it may have been decided).
    Failed(DegradedReason),
    /// Never sent (breaker open, link down, queue full).
    NotSent(DegradedReason),
}

/// Sends `checks` to one node (marked as a takeover when it is the owner's successor) and
/// waits for its answer, at most until `deadline`.
pub(crate) async fn send(
    link: &NodeLink,
    fallback: &Fallback,
    checks: &[Check],
    takeover: bool,
    deadline: Instant,
) -> Attempt {
    if let Admit::Reject { .. } = link.breaker.admit() {
        return Attempt::NotSent(DegradedReason::CircuitOpen);
    }
    let (reply, answer) = oneshot::channel();
    let wire = checks
        .iter()
        .map(|c| WireCheck {
            takeover,
            ..WireCheck::new(c.key.as_slice(), &c.limit, c.cost)
        })
        .collect();
    // Scopes go on the wire only when one is not `region`: kind 1 is unchanged otherwise.
    let scopes = if checks.iter().any(|c| c.scope != Scope::Region) {
        checks.iter().map(|c| WireScope::of(&c.scope)).collect()
    } else {
        Vec::new()
    };
    if let Err((_, reason)) = link.queue.push(Call {
        checks: wire,
        scopes,
        reply,
        deadline,
    }) {
        return Attempt::NotSent(reason);
    }
    // Every holder of a call answers it by its deadline or drops it; a dropped call (the
    // runtime shutting down) reads as unreachable.
    let reply = answer
        .await
        .unwrap_or(Reply::Failed(DegradedReason::Unreachable));
    match reply {
        Reply::Decided { decisions, start } => {
            link.breaker.on_success();
            Attempt::Answered(Ok(verdicts_from_node(
                fallback,
                checks,
                decisions.get(start..start + checks.len()),
            )))
        }
        Reply::Refused { code, message } => {
            link.breaker.on_success();
            Attempt::Answered(Err(ClientError::Rejected {
                node: link.addr,
                code,
                message,
            }))
        }
        Reply::Failed(reason) => {
            link.breaker.on_failure();
            Attempt::Failed(reason)
        }
    }
}

/// Verdicts from the node's decisions; checks it could not decide (e.g. `StoreFull`) follow
/// their failure mode.
pub(crate) fn verdicts_from_node(
    fallback: &Fallback,
    checks: &[Check],
    decisions: Option<&[WireDecision]>,
) -> Vec<Verdict> {
    let Some(decisions) = decisions else {
        // The stream task checked the count, so this cannot happen; fail over if it does.
        return fallback.resolve_all(checks, DegradedReason::Protocol);
    };
    let mut verdicts = Vec::with_capacity(checks.len());
    for wire in decisions {
        match wire.to_decision() {
            Ok(decision) => verdicts.push(Verdict {
                decision,
                source: Source::Node,
            }),
            Err(_) => break,
        }
    }
    if verdicts.len() == checks.len() {
        return verdicts;
    }
    let answers: Vec<_> = decisions
        .iter()
        .map(|d| d.to_decision().map_err(DegradedReason::Refused))
        .collect();
    fallback.resolve(checks, &answers)
}

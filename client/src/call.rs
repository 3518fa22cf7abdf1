//! One call to one node: through the node's breaker and queue, its reply turned into verdicts
//! (checks it could not decide follow their failure modes).

use std::sync::Arc;

use floodgate::check::{Check, DegradedReason, Source, Verdict};
use floodgate::region::Scope;
use floodgate::wire::{ErrorCode, WireDecision, WireScope};
use tokio::time::Instant;

use crate::breaker::Admit;
use crate::error::ClientError;
use crate::fallback::Fallback;
use crate::link::NodeLink;
use crate::queue::Call;
use crate::reply_slot::{Reply, ReplySlot};

/// What one node made of a call: an answer for the caller (its verdicts written to the
/// caller's buffer), or why it gave none.
pub(crate) enum Attempt {
    Answered(Result<(), ClientError>),
    /// Sent, but no answer came (it may have been decided).
    Failed(DegradedReason),
    /// Never sent (breaker open, link down, queue full).
    NotSent(DegradedReason),
    /// Nothing was decided and the call may be sent again shortly: the node answered
    /// `try_again` (nobody could decide it at once without a second decider: its slot's state
    /// on the way, or its owner slow) or `shutting_down` (it is leaving; the table will name
    /// the slot's next owner). The code says which.
    Again(ErrorCode),
}

/// Which node a call goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// The node the table names the owner (or, without a table, any node).
    Owner,
    /// The owner's successor, for an owner this client cannot reach; `takeover` marks the
    /// checks so the successor may decide them once it suspects the owner too. The successor
    /// passes them on to the owner while it hears from it, so a call that times out there
    /// waited on the owner behind it: it does not count against the successor's breaker.
    Successor { takeover: bool },
}

/// Sends `checks` to one node by `route` and waits for its answer, at most until `deadline`;
/// the verdicts go to `out` (cleared first). `slot` is the caller's reply slot, reused across
/// its calls with the check group it sent last, so a warm call allocates nothing.
pub(crate) async fn send(
    link: &NodeLink,
    fallback: &Fallback,
    checks: &[Check],
    route: Route,
    deadline: Instant,
    slot: &Arc<ReplySlot>,
    out: &mut Vec<Verdict>,
) -> Attempt {
    let takeover = route == Route::Successor { takeover: true };
    if let Admit::Reject { .. } = link.breaker.admit() {
        return Attempt::NotSent(DegradedReason::CircuitOpen);
    }
    let wire = link
        .queue
        .spare_keys
        .fill(slot.take_group(), checks, takeover);
    // Scopes go on the wire only when one is not `region`: kind 1 is unchanged otherwise.
    let scopes = if checks.iter().any(|c| c.scope != Scope::Region) {
        checks.iter().map(|c| WireScope::of(&c.scope)).collect()
    } else {
        Vec::new()
    };
    let (reply, answer) = slot.arm();
    if let Err((call, reason)) = link.queue.push(Call {
        checks: wire,
        scopes,
        reply,
        deadline,
    }) {
        // Keeps the group in the slot for the caller's next call.
        call.answer(Reply::Failed(reason));
        return Attempt::NotSent(reason);
    }
    // Every holder of a call answers it by its deadline or drops it; a dropped call (the
    // runtime shutting down) reads as unreachable.
    let reply = answer.await;
    match reply {
        Reply::Decided { decisions, start } => {
            link.breaker.on_success();
            let answer = decisions.get(start..start + checks.len());
            let again = answer
                .into_iter()
                .flatten()
                .find_map(|d| match d.to_decision() {
                    Err(code @ (ErrorCode::TryAgain | ErrorCode::ShuttingDown)) => Some(code),
                    _ => None,
                });
            if let Some(code) = again {
                return Attempt::Again(code);
            }
            verdicts_from_node(
                fallback,
                checks,
                decisions.get(start..start + checks.len()),
                out,
            );
            Attempt::Answered(Ok(()))
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
            if route == Route::Owner {
                link.breaker.on_failure();
            }
            Attempt::Failed(reason)
        }
    }
}

/// Verdicts from the node's decisions into `out` (cleared first); checks it could not decide
/// (e.g. `StoreFull`) follow their failure mode.
pub(crate) fn verdicts_from_node(
    fallback: &Fallback,
    checks: &[Check],
    decisions: Option<&[WireDecision]>,
    out: &mut Vec<Verdict>,
) {
    out.clear();
    let Some(decisions) = decisions else {
        // The stream task checked the count, so this cannot happen; fail over if it does.
        out.extend(fallback.resolve_all(checks, DegradedReason::Protocol));
        return;
    };
    for wire in decisions {
        match wire.to_decision() {
            Ok(decision) => out.push(Verdict {
                decision,
                source: Source::Node,
            }),
            Err(_) => break,
        }
    }
    if out.len() == checks.len() {
        return;
    }
    out.clear();
    let answers: Vec<_> = decisions
        .iter()
        .map(|d| d.to_decision().map_err(DegradedReason::Refused))
        .collect();
    out.extend(fallback.resolve(checks, &answers));
}

//! Metered charges: costs known only once a response is done (tokens, bytes, compute units),
//! taken from their buckets after the fact ([`crate::Client::charge`]).
//!
//! A charge is never refused: its bucket may be left owing, which denies the key's next requests
//! until the debt is repaid. It is sent to the key's owner and never twice: the client sends a
//! charge again only when the node answered that it took nothing (`try_again`, `shutting_down`),
//! never after a timeout or an `outcome_unknown` (a node that forwarded it and heard nothing
//! back), so no retry, forward or takeover counts it twice; what may be lost is one in-flight
//! charge per failure, an undercount. A charge no node took is charged to the client's fallback
//! bucket, so this gateway still holds the key back while its nodes are away.

use std::time::Duration;

use floodgate::check::{Check, DegradedReason};
use floodgate::protocol::Feature;
use floodgate::region::Scope;
use floodgate::wire::{ErrorCode, WireCheck, WireScope};
use floodgate::{Decision, Limit};
use tokio::time::Instant;

use crate::fallback::Fallback;
use crate::queue::Call;
use crate::reply_slot::{Reply, reply_pair};
use crate::routing::Routing;

/// Pause before sending again a charge a node took nothing of, doubled each time.
const AGAIN_PAUSE: Duration = Duration::from_millis(1);

/// What became of one charge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChargeOutcome {
    /// Its key's owner took it: the bucket as it now stands (denied while it owes).
    Taken(Decision),
    /// The cluster has a member from before metered charges (protocol version 6): it was sent
    /// as a check of its cost, taken only if that was allowed.
    Checked(Decision),
    /// Sent, and no answer came: it may or may not have been taken. Not sent again (it would
    /// count twice), nor charged to the fallback.
    Unknown(DegradedReason),
    /// No node took it (none reachable, or each answered that it took nothing until the
    /// deadline): charged to this client's fallback bucket instead.
    Fallback(DegradedReason),
}

impl ChargeOutcome {
    /// True when a node took it (or, in an older cluster, admitted it as a check).
    pub fn is_taken(&self) -> bool {
        match self {
            ChargeOutcome::Taken(_) => true,
            ChargeOutcome::Checked(decision) => decision.is_allowed(),
            ChargeOutcome::Unknown(_) | ChargeOutcome::Fallback(_) => false,
        }
    }
}

/// Sends each charge to its key's owner (one group per owner, all at once) and waits for the
/// answers, sending again what a node took nothing of until `timeout`.
pub(crate) async fn charge(
    routing: &Routing,
    fallback: &Fallback,
    timeout: Duration,
    charges: &[Check],
) -> Vec<ChargeOutcome> {
    let deadline = Instant::now() + timeout;
    let mut outcomes: Vec<Option<ChargeOutcome>> = vec![None; charges.len()];
    let mut pause = AGAIN_PAUSE;
    loop {
        let pending: Vec<usize> = (0..charges.len())
            .filter(|&i| outcomes[i].is_none())
            .collect();
        if pending.is_empty() {
            break;
        }
        let again = send_round(routing, charges, &pending, deadline, &mut outcomes).await;
        if again.is_empty() {
            continue;
        }
        let resume = Instant::now() + pause;
        if resume >= deadline {
            for (i, code) in again {
                outcomes[i] = Some(to_fallback(
                    fallback,
                    &charges[i],
                    DegradedReason::Refused(code),
                ));
            }
            break;
        }
        tokio::time::sleep_until(resume).await;
        pause = pause.saturating_mul(2);
    }
    charges
        .iter()
        .zip(outcomes)
        .map(|(charge, outcome)| {
            outcome.unwrap_or_else(|| to_fallback(fallback, charge, DegradedReason::Unreachable))
        })
        .collect()
}

/// One round: each pending charge sent to its owner. Records the outcomes it settles; returns
/// the charges a node took nothing of, with its code, to be sent again.
async fn send_round(
    routing: &Routing,
    charges: &[Check],
    pending: &[usize],
    deadline: Instant,
    outcomes: &mut [Option<ChargeOutcome>],
) -> Vec<(usize, ErrorCode)> {
    let routes = routing.routes();
    let metered = routes
        .table
        .as_ref()
        .is_some_and(|t| Feature::MeteredCosts.readable_at(t.cluster_version()));
    let mut by_node: Vec<Vec<usize>> = vec![Vec::new(); routes.links.len()];
    for &i in pending {
        by_node[routes.route(&charges[i].key)].push(i);
    }
    let mut answers = Vec::new();
    for (node, indices) in by_node.into_iter().enumerate() {
        if indices.is_empty() {
            continue;
        }
        let (reply, answer) = reply_pair();
        let call = Call {
            checks: indices
                .iter()
                .map(|&i| to_wire(&charges[i], metered))
                .collect(),
            scopes: wire_scopes(charges, &indices),
            reply,
            deadline,
        };
        match routes.links[node].queue.push(call) {
            Ok(()) => answers.push((indices, answer)),
            Err((_, reason)) => {
                for &i in &indices {
                    outcomes[i] = Some(ChargeOutcome::Fallback(reason));
                }
            }
        }
    }
    let mut again = Vec::new();
    for (indices, answer) in answers {
        settle(answer.await, &indices, metered, outcomes, &mut again);
    }
    again
}

/// Scopes go on the wire only when one is not `region` (as for checks): a `global` charge is
/// sent on to the other regions, a `home` one taken in its home region.
fn wire_scopes(charges: &[Check], indices: &[usize]) -> Vec<WireScope> {
    if indices.iter().any(|&i| charges[i].scope != Scope::Region) {
        indices
            .iter()
            .map(|&i| WireScope::of(&charges[i].scope))
            .collect()
    } else {
        Vec::new()
    }
}

/// The outcome of each charge of one call from the node's reply; those the node took nothing
/// of go to `again`.
fn settle(
    reply: Reply,
    indices: &[usize],
    metered: bool,
    outcomes: &mut [Option<ChargeOutcome>],
    again: &mut Vec<(usize, ErrorCode)>,
) {
    match reply {
        Reply::Decided { decisions, start } => {
            for (n, &i) in indices.iter().enumerate() {
                let decision = decisions.get(start + n).map(|d| d.to_decision());
                outcomes[i] = match decision {
                    Some(Ok(decision)) if metered => Some(ChargeOutcome::Taken(decision)),
                    Some(Ok(decision)) => Some(ChargeOutcome::Checked(decision)),
                    Some(Err(code @ (ErrorCode::TryAgain | ErrorCode::ShuttingDown))) => {
                        again.push((i, code));
                        None
                    }
                    // `outcome_unknown`: a node sent it on and heard nothing back.
                    Some(Err(ErrorCode::OutcomeUnknown)) => {
                        Some(ChargeOutcome::Unknown(DegradedReason::Timeout))
                    }
                    // Answered, nothing taken (`store_full`, `not_owner`, ...).
                    Some(Err(code)) => Some(ChargeOutcome::Fallback(DegradedReason::Refused(code))),
                    None => Some(ChargeOutcome::Unknown(DegradedReason::Protocol)),
                };
            }
        }
        // The whole frame refused as invalid: nothing in it was taken.
        Reply::Refused { code, .. } => {
            for &i in indices {
                outcomes[i] = Some(ChargeOutcome::Fallback(DegradedReason::Refused(code)));
            }
        }
        Reply::Failed(reason) => {
            for &i in indices {
                outcomes[i] = Some(ChargeOutcome::Unknown(reason));
            }
        }
    }
}

/// The charge as sent: a charge flag where every member reads it, else a check of its cost.
fn to_wire(charge: &Check, metered: bool) -> WireCheck {
    let limit: &Limit = &charge.limit;
    if metered {
        WireCheck::charge(charge.key.as_slice(), limit, charge.cost)
    } else {
        WireCheck::new(charge.key.as_slice(), limit, charge.cost.min(limit.burst()))
    }
}

fn to_fallback(fallback: &Fallback, charge: &Check, reason: DegradedReason) -> ChargeOutcome {
    fallback.charge(charge);
    ChargeOutcome::Fallback(reason)
}

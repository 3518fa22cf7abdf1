//! Decides an RLS request's checks through the cluster, the way a client's batch is: one check
//! batch through `forward::answer_check_batch` (decided here or forwarded to each owner), then,
//! when any descriptor is over its limit, a refund batch for what the others took: a denied
//! request consumes nothing, across nodes.

use floodgate::rls::Planned;
use floodgate::wire::{
    CheckBatch, FrameKind, FrameReader, WireCheck, WireDecision, decode_decisions,
    decode_error_frame, encode_message,
};
use floodgate::{Clock, Decision};

use crate::caller::Caller;
use crate::state::Shared;

/// Why a request could not be decided (answered `UNAVAILABLE`, so Envoy's own
/// `failure_mode_deny` chooses what happens).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Undecided(pub String);

/// One decision per plan (`None` where nothing is counted), with the over-limit descriptors'
/// partners refunded.
pub(crate) async fn decide(
    shared: &Shared,
    plans: &[Planned],
) -> Result<Vec<Option<Decision>>, Undecided> {
    let checks: Vec<(usize, WireCheck)> = plans
        .iter()
        .enumerate()
        .filter_map(|(i, plan)| match plan {
            Planned::Check {
                key,
                counted,
                cost,
                refund,
                ..
            } => {
                let mut check = WireCheck::new(key.clone(), &counted.limit, *cost);
                check.refund = *refund;
                Some((i, check))
            }
            _ => None,
        })
        .collect();
    let mut decisions = vec![None; plans.len()];
    if checks.is_empty() {
        return Ok(decisions);
    }
    // One group per descriptor: each goes to the owner of its own key (and a group is all
    // refunds or none).
    let groups = checks.iter().map(|(_, c)| vec![c.clone()]).collect();
    let answers = run_batch(shared, groups).await?;
    for ((i, _), answer) in checks.iter().zip(&answers) {
        let decision = answer
            .to_decision()
            .map_err(|code| Undecided(format!("a check could not be decided: {code}")))?;
        decisions[*i] = Some(decision);
    }
    let over_limit = checks.iter().any(|(i, _)| {
        let shadow = matches!(&plans[*i], Planned::Check { rule, .. } if rule.shadow_mode);
        !shadow && decisions[*i].is_some_and(|d| !d.is_allowed())
    });
    if over_limit {
        refund_allowed(shared, &checks, &mut decisions).await;
    }
    Ok(decisions)
}

/// Gives back what the allowed checks took; their answers become the buckets as they now stand.
async fn refund_allowed(
    shared: &Shared,
    checks: &[(usize, WireCheck)],
    decisions: &mut [Option<Decision>],
) {
    let refunds: Vec<(usize, WireCheck)> = checks
        .iter()
        .filter(|(i, c)| !c.refund && c.cost > 0 && decisions[*i].is_some_and(|d| d.is_allowed()))
        .map(|(i, c)| {
            let mut refund = c.clone();
            refund.refund = true;
            (*i, refund)
        })
        .collect();
    if refunds.is_empty() {
        return;
    }
    let groups = refunds.iter().map(|(_, c)| vec![c.clone()]).collect();
    match run_batch(shared, groups).await {
        Ok(answers) => {
            for ((i, _), answer) in refunds.iter().zip(answers) {
                if let Ok(decision) = answer.to_decision() {
                    decisions[*i] = Some(decision);
                }
            }
        }
        // The request is denied either way; a lost refund only makes the others stricter.
        Err(Undecided(e)) => tracing::warn!(error = %e, "RLS refund failed"),
    }
}

/// Sends one check batch through the path QUIC clients' batches take.
async fn run_batch(
    shared: &Shared,
    groups: Vec<Vec<WireCheck>>,
) -> Result<Vec<WireDecision>, Undecided> {
    let expected = groups.len();
    let mut bytes = Vec::new();
    encode_message(&mut bytes, FrameKind::CheckBatch, 1, &CheckBatch { groups });
    let max = shared.config.limits.max_frame_bytes;
    let mut reader = FrameReader::new(max);
    reader.extend(&bytes);
    let frame = match reader.next_frame() {
        Ok(Some(frame)) => frame,
        other => {
            return Err(Undecided(format!(
                "the checks do not fit one frame: {other:?}"
            )));
        }
    };
    let mut out = Vec::new();
    let now_ns = shared.clock.now_ns();
    // An Envoy cannot be told to try again: the call waits (bounded) for a moving slot's
    // hand-off instead, as for a client of an older version. Its negative hits (refunds) are
    // refused unless the operator allowed them, so it is trusted with what gets here.
    crate::forward::answer_check_batch(shared, Caller::trusted(false), &frame, now_ns, &mut out)
        .await;
    let mut reader = FrameReader::new(out.len().max(16));
    reader.extend(&out);
    let answer = match reader.next_frame() {
        Ok(Some(answer)) => answer,
        other => return Err(Undecided(format!("no answer to the checks: {other:?}"))),
    };
    match answer.kind {
        FrameKind::DecisionBatch => {
            let (decisions, _) =
                decode_decisions(&answer.payload).map_err(|(_, m)| Undecided(m))?;
            if decisions.len() != expected {
                return Err(Undecided(
                    "the answer has the wrong number of decisions".into(),
                ));
            }
            Ok(decisions)
        }
        _ => Err(Undecided(match decode_error_frame(&answer.payload) {
            Ok(error) => error.message,
            Err((_, m)) => m,
        })),
    }
}

//! Decides an RLS request's checks through the cluster, the way a client's batch is: one check
//! batch through `forward::answer_check_batch` (decided here or forwarded to each owner), then,
//! when any descriptor is over its limit, a refund batch for what the others took: a denied
//! request consumes nothing, across nodes. A metered rule's descriptors are peeks (taking
//! nothing) or charges (spent: never refunded, never over the limit).

use floodgate::Decision;
use floodgate::rls::Planned;
use floodgate::wire::WireCheck;

use crate::front_batch::FrontContext;
pub(crate) use crate::front_batch::Undecided;
use crate::front_batch::run_batch;

/// One decision per plan (`None` where nothing is counted), with the over-limit descriptors'
/// partners refunded.
pub(crate) async fn decide(
    front: &FrontContext,
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
                peek,
                charge,
                ..
            } => {
                let mut check = WireCheck::new(key.clone(), &counted.limit, *cost);
                check.refund = *refund;
                check.peek = *peek;
                check.charge = *charge;
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
    let answers = run_batch(front, groups).await?;
    for ((i, _), answer) in checks.iter().zip(&answers) {
        let decision = answer
            .to_decision()
            .map_err(|code| Undecided(format!("a check could not be decided: {code}")))?;
        decisions[*i] = Some(decision);
    }
    // A charge is never refused (a bucket it left owing answers denied): it makes no request
    // over the limit.
    let over_limit = checks.iter().any(|(i, check)| {
        let shadow = matches!(&plans[*i], Planned::Check { rule, .. } if rule.shadow_mode);
        !shadow && !check.charge && decisions[*i].is_some_and(|d| !d.is_allowed())
    });
    if over_limit {
        refund_allowed(front, &checks, &mut decisions).await;
    }
    Ok(decisions)
}

/// Gives back what the allowed checks took; their answers become the buckets as they now stand.
async fn refund_allowed(
    front: &FrontContext,
    checks: &[(usize, WireCheck)],
    decisions: &mut [Option<Decision>],
) {
    let refunds: Vec<(usize, WireCheck)> = checks
        .iter()
        // A peek took nothing; a charge is spent whatever the request's answer.
        .filter(|(i, c)| {
            !c.refund
                && !c.peek
                && !c.charge
                && c.cost > 0
                && decisions[*i].is_some_and(|d| d.is_allowed())
        })
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
    match run_batch(front, groups).await {
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

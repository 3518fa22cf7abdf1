//! Decides an RLS request's checks through the cluster, the way a client's batch is: one check
//! batch through `front_batch::run_batch` (decided here or forwarded to each owner), then,
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
    // One group per descriptor: each goes to the owner of its own key (and a group is all
    // refunds or none). `places`: each group's plan.
    let (places, groups): (Vec<usize>, Vec<Vec<WireCheck>>) = plans
        .iter()
        .enumerate()
        .filter_map(|(i, plan)| Some((i, vec![wire_check(plan)?])))
        .unzip();
    let mut decisions = vec![None; plans.len()];
    if groups.is_empty() {
        return Ok(decisions);
    }
    let answers = run_batch(front, groups).await?;
    for (&i, answer) in places.iter().zip(&answers) {
        let decision = answer
            .to_decision()
            .map_err(|code| Undecided(format!("a check could not be decided: {code}")))?;
        decisions[i] = Some(decision);
    }
    // A charge is never refused (a bucket it left owing answers denied): it makes no request
    // over the limit.
    let over_limit = places.iter().any(|&i| match &plans[i] {
        Planned::Check {
            rule,
            charge: false,
            ..
        } => !rule.shadow_mode && decisions[i].is_some_and(|d| !d.is_allowed()),
        _ => false,
    });
    if over_limit {
        refund_allowed(front, plans, &places, &mut decisions).await;
    }
    Ok(decisions)
}

/// The check a plan asks for, if it counts one.
fn wire_check(plan: &Planned) -> Option<WireCheck> {
    let Planned::Check {
        key,
        counted,
        cost,
        refund,
        peek,
        charge,
        ..
    } = plan
    else {
        return None;
    };
    let mut check = WireCheck::new(key.clone(), &counted.limit, *cost);
    check.refund = *refund;
    check.peek = *peek;
    check.charge = *charge;
    Some(check)
}

/// Gives back what the allowed checks (at `places` of `plans`) took; their answers become the
/// buckets as they now stand.
async fn refund_allowed(
    front: &FrontContext,
    plans: &[Planned],
    places: &[usize],
    decisions: &mut [Option<Decision>],
) {
    let (refunded, groups): (Vec<usize>, Vec<Vec<WireCheck>>) = places
        .iter()
        .filter_map(|&i| Some((i, wire_check(&plans[i])?)))
        // A peek took nothing; a charge is spent whatever the request's answer.
        .filter(|(i, c)| {
            !c.refund
                && !c.peek
                && !c.charge
                && c.cost > 0
                && decisions[*i].is_some_and(|d| d.is_allowed())
        })
        .map(|(i, mut refund)| {
            refund.refund = true;
            (i, vec![refund])
        })
        .unzip();
    if groups.is_empty() {
        return;
    }
    match run_batch(front, groups).await {
        Ok(answers) => {
            for (i, answer) in refunded.into_iter().zip(answers) {
                if let Ok(decision) = answer.to_decision() {
                    decisions[i] = Some(decision);
                }
            }
        }
        // The request is denied either way; a lost refund only makes the others stricter.
        Err(Undecided(e)) => tracing::warn!(error = %e, "RLS refund failed"),
    }
}

//! One check batch through the path QUIC clients' batches take (`forward::decide_groups`:
//! decided here or forwarded to each owner), for the fronts that are not QUIC: the RLS and RESP,
//! and [`FrontContext`], what those fronts are handed.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use floodgate::Clock;
use floodgate::wire::{
    CheckBatch, CheckGroups, ErrorCode, HEADER_BYTES, WireCheck, WireDecision,
    decode_check_batch_into, validate_check_batch_into,
};
use rkyv::rancor;

use crate::budget::BufferBudget;
use crate::caller::Caller;
use crate::check_path::CheckPath;
use crate::config::NodeConfig;
use crate::owner_batches::Received;
use crate::service::record_batch;

/// What the fronts beside QUIC (the RLS and RESP) share: the node's configuration (their TLS
/// and limits), the node-wide budget of buffered bytes (their calls count in it beside the QUIC
/// streams'), and the check path their batches take.
#[derive(Debug)]
pub(crate) struct FrontContext {
    pub(crate) config: NodeConfig,
    pub(crate) budget: Arc<BufferBudget>,
    pub(crate) checks: Arc<CheckPath>,
}

/// Why a batch could not be decided (each front answers it its own way: the RLS with
/// `UNAVAILABLE`, the RESP front by its failure mode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Undecided(pub String);

/// The waits before a front tries again the groups an owner could not decide yet: answered
/// `try_again` (a slot awaiting its hand-off on another node) or `shutting_down` (an owner
/// leaving). A gateway's client retries those itself; an Envoy or a Redis client cannot be told
/// to, and would see an error for a move that settles within milliseconds.
const RETRY_WAITS: [Duration; 3] = [
    Duration::from_millis(10),
    Duration::from_millis(20),
    Duration::from_millis(40),
];

/// Decides one check batch as a QUIC client's would be, one decision per check in order, its
/// groups that an owner could not decide yet tried again after each of [`RETRY_WAITS`].
pub(crate) async fn run_batch(
    front: &FrontContext,
    groups: Vec<Vec<WireCheck>>,
) -> Result<Vec<WireDecision>, Undecided> {
    until_decided(groups, |groups| decide_once(front, groups)).await
}

/// Whether an owner left this check undecided for now (see [`RETRY_WAITS`]).
fn not_decided_yet(decision: &WireDecision) -> bool {
    matches!(
        decision.to_decision(),
        Err(ErrorCode::TryAgain | ErrorCode::ShuttingDown)
    )
}

/// `decide`s `groups` (which hands them back with one decision per check), then again the
/// groups not decided yet, after each of [`RETRY_WAITS`]; what is still undecided after the
/// last is answered as it came.
async fn until_decided<F, Fut>(
    groups: Vec<Vec<WireCheck>>,
    mut decide: F,
) -> Result<Vec<WireDecision>, Undecided>
where
    F: FnMut(Vec<Vec<WireCheck>>) -> Fut,
    Fut: Future<Output = (Vec<Vec<WireCheck>>, Result<Vec<WireDecision>, Undecided>)>,
{
    let (mut groups, decided) = decide(groups).await;
    let mut decisions = decided?;
    for wait in RETRY_WAITS {
        // Each group's first decision's place; a group is decided or refused as a whole.
        let mut again = Vec::new();
        let mut start = 0;
        for (i, group) in groups.iter().enumerate() {
            if decisions[start..start + group.len()]
                .iter()
                .any(not_decided_yet)
            {
                again.push((i, start));
            }
            start += group.len();
        }
        if again.is_empty() {
            break;
        }
        tokio::time::sleep(wait).await;
        let retried = again
            .iter()
            .map(|&(i, _)| std::mem::take(&mut groups[i]))
            .collect();
        let (retried, decided) = decide(retried).await;
        let Ok(redecided) = decided else {
            break;
        };
        let mut redecided = redecided.into_iter();
        for (&(i, start), group) in again.iter().zip(retried) {
            for (place, decision) in decisions[start..start + group.len()]
                .iter_mut()
                .zip(redecided.by_ref())
            {
                *place = decision;
            }
            groups[i] = group;
        }
    }
    Ok(decisions)
}

/// One round of [`run_batch`], handing the groups back. The batch is held to the limits a
/// client's is: validated as the decoder validates it archived
/// (`validate_check_batch_into`, without archiving it, when it surely fits a frame; archived,
/// sized and decoded otherwise). What is forwarded to another owner is copied from the groups
/// themselves. No frame is built or read around it, and the decisions are taken as they are.
async fn decide_once(
    front: &FrontContext,
    groups: Vec<Vec<WireCheck>>,
) -> (Vec<Vec<WireCheck>>, Result<Vec<WireDecision>, Undecided>) {
    let batch = CheckBatch { groups };
    let decided = decide_batch(front, &batch).await;
    (batch.groups, decided)
}

async fn decide_batch(
    front: &FrontContext,
    batch: &CheckBatch,
) -> Result<Vec<WireDecision>, Undecided> {
    let expected: usize = batch.groups.iter().map(Vec::len).sum();
    let path = &front.checks;
    let limits = path.limits;
    let mut buffers = crate::forward::BatchBuffers::take();
    let mut checks = std::mem::take(&mut buffers.groups);
    let validated = if batch.fits_packed(limits.max_frame_bytes.saturating_sub(HEADER_BYTES)) {
        validate_check_batch_into(batch, &limits.wire(), &mut checks).map_err(|(_, m)| Undecided(m))
    } else {
        archive_and_decode(batch, &limits, &mut checks)
    };
    if let Err(why) = validated {
        buffers.groups = checks;
        buffers.give_back();
        return Err(why);
    }
    let received = || Some(Received::Groups(&batch.groups));
    let now_ns = path.clock.now_ns();
    // Neither an Envoy nor a Redis client can be told to try again: the call waits (at most
    // 500 ms) for a moving slot's hand-off instead, as for a client of an older version. The
    // RLS front's negative hits (its only refunds) are refused unless the operator allowed
    // them, and the RESP front sends none, so both are trusted with what gets here.
    let decided = crate::forward::decide_groups(
        path,
        Caller::trusted(false),
        None,
        &checks,
        &[],
        received,
        now_ns,
        &mut buffers,
    )
    .await;
    buffers.groups = checks;
    buffers.give_back();
    record_batch(&path.metrics, &decided.tally, decided.decisions.len());
    if decided.decisions.len() != expected {
        return Err(Undecided(
            "the answer has the wrong number of decisions".into(),
        ));
    }
    Ok(decided.decisions)
}

/// A batch that may not fit a frame: archived, refused if it does not fit, and decoded as a
/// client's frame would be.
fn archive_and_decode(
    batch: &CheckBatch,
    limits: &crate::config::NodeLimits,
    checks: &mut CheckGroups,
) -> Result<(), Undecided> {
    let archived = rkyv::to_bytes::<rancor::Error>(batch)
        .map_err(|e| Undecided(format!("the checks could not be encoded: {e}")))?;
    if HEADER_BYTES + archived.len() > limits.max_frame_bytes {
        return Err(Undecided(format!(
            "the checks do not fit one frame: {} bytes, at most {}",
            HEADER_BYTES + archived.len(),
            limits.max_frame_bytes
        )));
    }
    decode_check_batch_into(&archived, &limits.wire(), checks).map_err(|(_, m)| Undecided(m))
}

#[cfg(test)]
mod tests {
    use floodgate::{Decision, Limit, NANOS_PER_SEC};

    use super::*;

    fn check(key: &str) -> WireCheck {
        WireCheck::new(key, &Limit::gcra(10, NANOS_PER_SEC, 10).unwrap(), 1)
    }

    fn allowed() -> WireDecision {
        WireDecision::from(Decision::Allowed {
            remaining: 9,
            reset_after_ns: 0,
        })
    }

    /// A decider whose owners answer each key's first `undecided` rounds with `code`, and
    /// records the keys of each round.
    async fn run(
        groups: Vec<Vec<WireCheck>>,
        undecided: &[(&str, usize, ErrorCode)],
    ) -> (Vec<WireDecision>, Vec<Vec<String>>, Duration) {
        let rounds = std::cell::RefCell::new(Vec::<Vec<String>>::new());
        let started = tokio::time::Instant::now();
        let decided = until_decided(groups, |groups| {
            let round = rounds.borrow().len();
            let keys: Vec<String> = groups
                .iter()
                .flatten()
                .map(|c| String::from_utf8(c.key.clone()).unwrap())
                .collect();
            let decisions = keys
                .iter()
                .map(|key| match undecided.iter().find(|(k, _, _)| k == key) {
                    Some(&(_, rounds, code)) if round < rounds => WireDecision::error(code),
                    _ => allowed(),
                })
                .collect();
            rounds.borrow_mut().push(keys);
            async move { (groups, Ok(decisions)) }
        })
        .await
        .unwrap();
        (decided, rounds.into_inner(), started.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn groups_an_owner_could_not_decide_yet_are_tried_again_alone() {
        let groups = vec![
            vec![check("a")],
            vec![check("b"), check("c")],
            vec![check("d")],
        ];
        let (decided, rounds, took) = run(
            groups,
            &[
                ("c", 1, ErrorCode::TryAgain),
                ("d", 2, ErrorCode::ShuttingDown),
            ],
        )
        .await;
        assert!(
            decided.iter().all(|d| d.to_decision().is_ok()),
            "{decided:?}"
        );
        assert_eq!(
            rounds,
            [vec!["a", "b", "c", "d"], vec!["b", "c", "d"], vec!["d"]],
            "a group goes again whole, the decided ones not at all"
        );
        assert_eq!(took, RETRY_WAITS[0] + RETRY_WAITS[1]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_owner_that_stays_undecided_is_answered_as_it_came_after_the_last_wait() {
        let (decided, rounds, took) = run(
            vec![vec![check("a")], vec![check("b")]],
            &[("b", 9, ErrorCode::TryAgain)],
        )
        .await;
        assert_eq!(rounds.len(), 1 + RETRY_WAITS.len());
        assert_eq!(took, RETRY_WAITS.iter().sum::<Duration>());
        assert!(decided[0].to_decision().is_ok());
        assert_eq!(decided[1].to_decision(), Err(ErrorCode::TryAgain));
        // Anything else is an answer: not tried again.
        let (_, rounds, _) = run(vec![vec![check("a")]], &[("a", 9, ErrorCode::StoreFull)]).await;
        assert_eq!(rounds.len(), 1);
    }
}

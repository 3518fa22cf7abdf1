//! One check batch through the path QUIC clients' batches take (`forward::decide_groups`:
//! decided here or forwarded to each owner), for the fronts that are not QUIC: the RLS and RESP,
//! and [`FrontContext`], what those fronts are handed.

use std::sync::Arc;

use floodgate::Clock;
use floodgate::wire::{
    ArchivedCheckBatch, CheckBatch, CheckGroups, HEADER_BYTES, WireCheck, WireDecision,
    decode_check_batch_into,
};
use rkyv::rancor;

use crate::budget::BufferBudget;
use crate::caller::Caller;
use crate::check_path::CheckPath;
use crate::config::NodeConfig;
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

/// Decides one check batch as a QUIC client's would be, one decision per check in order. The
/// batch is archived once, as a client would send it, and validated by the same decoder, so the
/// fronts are held to the same limits; the archive is what a forward to another owner carries.
/// No frame is built or read around it, and the decisions are taken as they are.
pub(crate) async fn run_batch(
    front: &FrontContext,
    groups: Vec<Vec<WireCheck>>,
) -> Result<Vec<WireDecision>, Undecided> {
    let expected: usize = groups.iter().map(Vec::len).sum();
    let payload = rkyv::to_bytes::<rancor::Error>(&CheckBatch { groups })
        .map_err(|e| Undecided(format!("the checks could not be encoded: {e}")))?;
    let checks = &front.checks;
    let limits = checks.limits;
    if HEADER_BYTES + payload.len() > limits.max_frame_bytes {
        return Err(Undecided(format!(
            "the checks do not fit one frame: {} bytes, at most {}",
            HEADER_BYTES + payload.len(),
            limits.max_frame_bytes
        )));
    }
    let mut groups = CheckGroups::default();
    decode_check_batch_into(&payload, &limits.wire(), &mut groups)
        .map_err(|(_, m)| Undecided(m))?;
    // Validated just above, so this access succeeds.
    let archived = || rkyv::access::<ArchivedCheckBatch, rancor::Error>(&payload).ok();
    let now_ns = checks.clock.now_ns();
    // Neither an Envoy nor a Redis client can be told to try again: the call waits (at most
    // 500 ms) for a moving slot's hand-off instead, as for a client of an older version. The
    // RLS front's negative hits (its only refunds) are refused unless the operator allowed
    // them, and the RESP front sends none, so both are trusted with what gets here.
    let mut buffers = crate::forward::BatchBuffers::take();
    let decided = crate::forward::decide_groups(
        checks,
        Caller::trusted(false),
        None,
        &groups,
        &[],
        archived,
        now_ns,
        &mut buffers,
    )
    .await;
    buffers.give_back();
    record_batch(&checks.metrics, &decided.tally, decided.decisions.len());
    if decided.decisions.len() != expected {
        return Err(Undecided(
            "the answer has the wrong number of decisions".into(),
        ));
    }
    Ok(decided.decisions)
}

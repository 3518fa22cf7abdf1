//! One check batch through the path QUIC clients' batches take (`forward::decide_groups`:
//! decided here or forwarded to each owner), for the fronts that are not QUIC: the RLS and RESP,
//! and [`FrontContext`], what those fronts are handed.

use std::sync::{Arc, OnceLock};

use floodgate::Clock;
use floodgate::wire::{
    ArchivedCheckBatch, CheckBatch, CheckGroups, HEADER_BYTES, WireCheck, WireDecision,
    decode_check_batch_into, validate_check_batch_into,
};
use rkyv::rancor;
use rkyv::util::AlignedVec;

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
/// batch is held to the limits a client's is: validated as the decoder validates it archived
/// (`validate_check_batch_into`, without archiving it, when it surely fits a frame; archived,
/// sized and decoded otherwise). It is archived, as a client would send it, only when a group
/// is forwarded: the archive is what a forward to another owner carries. No frame is built or
/// read around it, and the decisions are taken as they are.
pub(crate) async fn run_batch(
    front: &FrontContext,
    groups: Vec<Vec<WireCheck>>,
) -> Result<Vec<WireDecision>, Undecided> {
    let expected: usize = groups.iter().map(Vec::len).sum();
    let batch = CheckBatch { groups };
    let path = &front.checks;
    let limits = path.limits;
    let payload: OnceLock<Option<AlignedVec>> = OnceLock::new();
    let mut buffers = crate::forward::BatchBuffers::take();
    let mut checks = std::mem::take(&mut buffers.groups);
    let validated = if batch.fits_packed(limits.max_frame_bytes.saturating_sub(HEADER_BYTES)) {
        validate_check_batch_into(&batch, &limits.wire(), &mut checks)
            .map_err(|(_, m)| Undecided(m))
    } else {
        archive_and_decode(&batch, &limits, &payload, &mut checks)
    };
    if let Err(why) = validated {
        buffers.groups = checks;
        buffers.give_back();
        return Err(why);
    }
    // Packed on the first forward; it packed before (`fits_packed`) or already.
    let archived = || {
        let payload = payload
            .get_or_init(|| rkyv::to_bytes::<rancor::Error>(&batch).ok())
            .as_ref()?;
        rkyv::access::<ArchivedCheckBatch, rancor::Error>(payload).ok()
    };
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
        archived,
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

/// A batch that may not fit a frame: archived into `payload`, refused if it does not fit, and
/// decoded as a client's frame would be.
fn archive_and_decode(
    batch: &CheckBatch,
    limits: &crate::config::NodeLimits,
    payload: &OnceLock<Option<AlignedVec>>,
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
    decode_check_batch_into(&archived, &limits.wire(), checks).map_err(|(_, m)| Undecided(m))?;
    let _ = payload.set(Some(archived));
    Ok(())
}

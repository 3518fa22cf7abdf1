//! One check batch through the path QUIC clients' batches take (`forward::answer_check_batch`:
//! decided here or forwarded to each owner), for the fronts that are not QUIC: the RLS and RESP.

use floodgate::Clock;
use floodgate::wire::{
    CheckBatch, FrameKind, FrameReader, WireCheck, WireDecision, decode_decisions,
    decode_error_frame, encode_message,
};

use crate::caller::Caller;
use crate::state::Shared;

/// Why a batch could not be decided (each front answers it its own way: the RLS with
/// `UNAVAILABLE`, the RESP front by its failure mode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Undecided(pub String);

/// Sends one check batch through the path QUIC clients' batches take.
pub(crate) async fn run_batch(
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
    // Neither an Envoy nor a Redis client can be told to try again: the call waits (at most
    // 500 ms) for a moving slot's hand-off instead, as for a client of an older version. The
    // RLS front's negative hits (its only refunds) are refused unless the operator allowed
    // them, and the RESP front sends none, so both are trusted with what gets here.
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

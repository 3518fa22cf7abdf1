//! Answers frames: the pure part of serving a stream, from a received frame to the bytes of the
//! answer. No I/O here, so it is tested directly.

use floodgate::wire::{
    DecisionBatch, ErrorCode, ErrorFrame, Frame, FrameKind, ValidCheck, WireDecision, WireLimits,
    decode_check_batch, encode_message,
};
use floodgate::{BucketStore, Check, Decision};

use crate::metrics::{DecisionTally, NodeMetrics};

/// How many groups ahead of the one being decided to prefetch (measured in `bench/benches/core.rs`).
const PREFETCH_AHEAD: usize = 8;

/// Appends to `out` the answer to `frame`: a decision batch, or an error frame for a refused
/// request. Returns the error code when the frame was refused.
pub fn answer_frame(
    store: &BucketStore,
    limits: &WireLimits,
    metrics: &NodeMetrics,
    now_ns: u64,
    frame: &Frame,
    out: &mut Vec<u8>,
) -> Option<ErrorCode> {
    if frame.kind != FrameKind::CheckBatch {
        let message = format!("a node accepts only check batches, not {:?}", frame.kind);
        encode_error(out, frame.request_id, ErrorCode::UnknownKind, message);
        return Some(ErrorCode::UnknownKind);
    }
    let groups = match decode_check_batch(&frame.payload, limits) {
        Ok(groups) => groups,
        Err((code, message)) => {
            encode_error(out, frame.request_id, code, message);
            return Some(code);
        }
    };
    let checks: usize = groups.iter().map(Vec::len).sum();
    let mut answer = DecisionBatch {
        decisions: Vec::with_capacity(checks),
    };
    let mut tally = DecisionTally::default();
    let mut group_decisions = Vec::new();
    let mut group_checks = Vec::new();
    for (i, group) in groups.iter().enumerate() {
        // Start loading a bucket a few groups ahead so cold keys' cache misses overlap.
        if let Some(ahead) = groups.get(i + PREFETCH_AHEAD) {
            store.prefetch(ahead[0].key);
        }
        if group[0].refund {
            // Refunds are never denied; each answers with the bucket as it now stands.
            for refund in group {
                store.refund(refund.key, &refund.limit, refund.cost, now_ns);
                let result = store
                    .check(refund.key, &refund.limit, 0, now_ns)
                    .map_err(|_| ErrorCode::StoreFull);
                push_decision(
                    &mut answer,
                    &mut tally,
                    refund,
                    result.as_ref().map_err(|c| *c),
                );
            }
            continue;
        }
        if let [single] = group.as_slice() {
            let result = store
                .check(single.key, &single.limit, single.cost, now_ns)
                .map_err(|_| ErrorCode::StoreFull);
            push_decision(
                &mut answer,
                &mut tally,
                single,
                result.as_ref().map_err(|c| *c),
            );
            continue;
        }
        group_checks.clear();
        group_checks.extend(group.iter().map(|c| Check {
            key: c.key,
            limit: c.limit,
            cost: c.cost,
        }));
        match store.check_all(&group_checks, now_ns, &mut group_decisions) {
            Ok(_) => {
                for (check, decision) in group.iter().zip(&group_decisions) {
                    push_decision(&mut answer, &mut tally, check, Ok(decision));
                }
            }
            Err(_) => {
                for check in group {
                    push_decision(&mut answer, &mut tally, check, Err(ErrorCode::StoreFull));
                }
            }
        }
    }
    metrics.add_decisions(&tally);
    metrics.batch_checks.record(checks as f64);
    encode_message(out, FrameKind::DecisionBatch, frame.request_id, &answer);
    None
}

fn push_decision(
    answer: &mut DecisionBatch,
    tally: &mut DecisionTally,
    check: &ValidCheck,
    result: Result<&Decision, ErrorCode>,
) {
    tally.record(check.limit.algorithm(), result);
    answer.decisions.push(match result {
        Ok(decision) => WireDecision::from(*decision),
        Err(code) => WireDecision::error(code),
    });
}

/// Appends an error frame.
pub fn encode_error(out: &mut Vec<u8>, request_id: u64, code: ErrorCode, message: String) {
    encode_message(
        out,
        FrameKind::Error,
        request_id,
        &ErrorFrame {
            code: code as u16,
            message,
        },
    );
}

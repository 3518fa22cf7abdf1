//! Answers frames: the pure part of serving a stream, from a received frame to the bytes of the
//! answer. No I/O here, so it is tested directly; forwarding to other nodes is in `forward.rs`.

use floodgate::wire::{
    DecisionBatch, ErrorCode, ErrorFrame, Frame, FrameKind, ValidCheck, WireDecision, WireLimits,
    decode_check_batch, encode_message,
};
use floodgate::{BucketStore, Check, Decision};

use crate::metrics::{DecisionTally, NodeMetrics};

/// How many groups ahead of the one being decided to prefetch (measured in `bench/benches/core.rs`).
const PREFETCH_AHEAD: usize = 8;

/// Appends to `out` the answer to a check batch decided entirely here: a decision batch, or an
/// error frame for a refused request. Returns the error code when the frame was refused.
pub fn answer_frame(
    store: &BucketStore,
    limits: &WireLimits,
    metrics: &NodeMetrics,
    now_ns: u64,
    table_version: u64,
    frame: &Frame,
    out: &mut Vec<u8>,
) -> Option<ErrorCode> {
    let groups = match decode_frame(frame, limits, out) {
        Ok(groups) => groups,
        Err(code) => return Some(code),
    };
    let mut decisions = Vec::with_capacity(groups.iter().map(Vec::len).sum());
    let mut tally = DecisionTally::default();
    for (i, group) in groups.iter().enumerate() {
        prefetch_ahead(store, &groups, i);
        decide_group(store, &mut tally, now_ns, group, &mut decisions);
    }
    finish_batch(
        metrics,
        &tally,
        frame.request_id,
        decisions,
        table_version,
        out,
    );
    None
}

/// Called before deciding group `i`: starts loading the bucket of the group a few ahead, so cold
/// keys' cache misses overlap instead of adding up.
pub fn prefetch_ahead(store: &BucketStore, groups: &[Vec<ValidCheck>], i: usize) {
    if let Some(check) = groups.get(i + PREFETCH_AHEAD).and_then(|g| g.first()) {
        store.prefetch(check.key);
    }
}

/// Validates a check batch frame; on refusal appends the error frame and returns its code.
pub fn decode_frame(
    frame: &Frame,
    limits: &WireLimits,
    out: &mut Vec<u8>,
) -> Result<Vec<Vec<ValidCheck>>, ErrorCode> {
    if !matches!(
        frame.kind,
        FrameKind::CheckBatch | FrameKind::ForwardedCheckBatch
    ) {
        let message = format!("a node does not accept {:?} frames here", frame.kind);
        encode_error(out, frame.request_id, ErrorCode::UnknownKind, message);
        return Err(ErrorCode::UnknownKind);
    }
    decode_check_batch(&frame.payload, limits).map_err(|(code, message)| {
        encode_error(out, frame.request_id, code, message);
        code
    })
}

/// Decides one group here (all-or-nothing when it has several checks; refunds one by one),
/// appending one decision per check.
pub fn decide_group(
    store: &BucketStore,
    tally: &mut DecisionTally,
    now_ns: u64,
    group: &[ValidCheck],
    out: &mut Vec<WireDecision>,
) {
    if group[0].refund {
        // Refunds are never denied; each answers with the bucket as it now stands.
        for refund in group {
            store.refund(refund.key, &refund.limit, refund.cost, now_ns);
            let result = store
                .check(refund.key, &refund.limit, 0, now_ns)
                .map_err(|_| ErrorCode::StoreFull);
            push_decision(out, tally, refund, result.as_ref().map_err(|c| *c));
        }
        return;
    }
    if let [single] = group {
        let result = store
            .check(single.key, &single.limit, single.cost, now_ns)
            .map_err(|_| ErrorCode::StoreFull);
        push_decision(out, tally, single, result.as_ref().map_err(|c| *c));
        return;
    }
    let checks: Vec<Check> = group
        .iter()
        .map(|c| Check {
            key: c.key,
            limit: c.limit,
            cost: c.cost,
        })
        .collect();
    let mut decisions = Vec::with_capacity(group.len());
    match store.check_all(&checks, now_ns, &mut decisions) {
        Ok(_) => {
            for (check, decision) in group.iter().zip(&decisions) {
                push_decision(out, tally, check, Ok(decision));
            }
        }
        Err(_) => {
            for check in group {
                push_decision(out, tally, check, Err(ErrorCode::StoreFull));
            }
        }
    }
}

/// Records the batch's metrics and appends its decision batch frame.
pub fn finish_batch(
    metrics: &NodeMetrics,
    tally: &DecisionTally,
    request_id: u64,
    decisions: Vec<WireDecision>,
    table_version: u64,
    out: &mut Vec<u8>,
) {
    metrics.add_decisions(tally);
    metrics.batch_checks.record(decisions.len() as f64);
    encode_message(
        out,
        FrameKind::DecisionBatch,
        request_id,
        &DecisionBatch {
            decisions,
            table_version,
        },
    );
}

fn push_decision(
    out: &mut Vec<WireDecision>,
    tally: &mut DecisionTally,
    check: &ValidCheck,
    result: Result<&Decision, ErrorCode>,
) {
    tally.record(check.limit.algorithm(), result);
    out.push(match result {
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

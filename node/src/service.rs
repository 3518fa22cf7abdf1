//! Answers frames: the pure part of serving a stream, from a received frame to the bytes of the
//! answer. No I/O here, so it is tested directly; forwarding to other nodes is in `forward.rs`.

use std::cell::RefCell;

use floodgate::wire::{
    CheckGroups, DecisionBatch, ErrorCode, ErrorFrame, Frame, FrameKind, ValidCheck, WireDecision,
    WireLimits, decode_check_batch_into, encode_frame, encode_message,
};
use floodgate::{BucketCheck, BucketStore, Decision};
use rkyv::util::AlignedVec;

use crate::caller::{Caller, REFUND_REFUSED};
use crate::metrics::{DecisionTally, NodeMetrics};

/// Buffers the check path reuses from frame to frame on each runtime thread: the decoded
/// groups, the decisions, and the archive of the answer. Fresh ones cost several allocations
/// per frame and one per group; the functions that use them never await, so a thread's
/// buffers serve one frame at a time.
#[derive(Default)]
struct Scratch {
    groups: CheckGroups,
    decisions: Vec<WireDecision>,
    archive: AlignedVec,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::default();
}

/// Runs `f` with this thread's scratch buffers, or fresh ones if they are in use (a nested call
/// never happens on the check path, but must not panic).
fn with_scratch<T>(f: impl FnOnce(&mut Scratch) -> T) -> T {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut scratch) => f(&mut scratch),
        Err(_) => f(&mut Scratch::default()),
    })
}

/// Appends to `out` the answer to a check batch decided entirely here: a decision batch, or an
/// error frame for a refused request. Returns the error code when the frame was refused.
#[allow(clippy::too_many_arguments)]
pub(crate) fn answer_frame(
    caller: Caller<'_>,
    store: &BucketStore,
    limits: &WireLimits,
    metrics: &NodeMetrics,
    now_ns: u64,
    table_version: u64,
    frame: &Frame,
    out: &mut Vec<u8>,
) -> Option<ErrorCode> {
    if let Some(code) = refuse_kind(frame, out) {
        return Some(code);
    }
    with_scratch(|scratch| {
        let Scratch {
            groups,
            decisions,
            archive,
            ..
        } = scratch;
        if let Err((code, message)) = decode_check_batch_into(&frame.payload, limits, groups) {
            encode_error(out, frame.request_id, code, message);
            return Some(code);
        }
        decisions.clear();
        decisions.reserve(groups.check_count());
        let mut tally = DecisionTally::default();
        let each = || (0..groups.len()).filter_map(|i| groups.group(i));
        let refused = caller.take_refunds(each());
        for i in 0..groups.len() {
            prefetch_before(store, i, |j| groups.group(j));
            let Some(group) = groups.group(i) else {
                continue;
            };
            if refused.get(i).copied().unwrap_or(false) {
                let refusal = WireDecision::error(REFUND_REFUSED);
                decisions.extend(std::iter::repeat_n(refusal, group.len()));
            } else {
                decide_group(store, &mut tally, now_ns, group, decisions);
            }
        }
        caller.settle(each(), decisions, &refused);
        metrics.add_decisions(&tally);
        metrics.batch_checks.record(decisions.len() as f64);
        encode_decisions(out, frame.request_id, decisions, table_version, archive);
        None
    })
}

/// Appends a decision batch frame of `decisions` to `out`, archiving into `archive` (reused)
/// and handing `decisions` back as it was.
fn encode_decisions(
    out: &mut Vec<u8>,
    request_id: u64,
    decisions: &mut Vec<WireDecision>,
    table_version: u64,
    archive: &mut AlignedVec,
) {
    let batch = DecisionBatch {
        decisions: std::mem::take(decisions),
        table_version,
    };
    let mut buffer = std::mem::take(archive);
    buffer.clear();
    // Serializing plain structs into memory cannot fail; an empty payload would be refused by
    // the receiver's validation, never misread.
    let buffer =
        rkyv::api::high::to_bytes_in::<_, rkyv::rancor::Error>(&batch, buffer).unwrap_or_default();
    encode_frame(out, FrameKind::DecisionBatch, request_id, &buffer);
    *archive = buffer;
    *decisions = batch.decisions;
}

/// Refuses a frame that is no check batch (kind 1 or 10): appends the error and returns its code.
fn refuse_kind(frame: &Frame, out: &mut Vec<u8>) -> Option<ErrorCode> {
    if matches!(
        frame.kind,
        FrameKind::CheckBatch | FrameKind::ForwardedCheckBatch
    ) {
        return None;
    }
    let message = format!("a node does not accept {:?} frames here", frame.kind);
    encode_error(out, frame.request_id, ErrorCode::UnknownKind, message);
    Some(ErrorCode::UnknownKind)
}

/// Called before deciding group `i` of a frame (`group(j)` is group `j`, `None` past the end):
/// starts loading the buckets of groups to come, so cold keys' cache misses overlap instead of
/// adding up. The prefetches go out in bursts ([`floodgate::prefetch::burst_ahead`]: the next
/// [`floodgate::prefetch::PREFETCH_BURST`] groups' at the start of each burst, measured in
/// `bench/benches/core.rs`, `cold_frame_256`), not one group's between two decisions: a key's
/// bucket usually lies on a page whose translation is not cached either, and a prefetch waits
/// for its page walk before the instructions after it can retire, so only prefetches issued
/// back to back walk in parallel.
/// With caches emptied between frames (as the processes sharing a vCPU empty them), a frame of
/// 256 checks took about half the time it took with one group prefetched 8 ahead
/// (bench/RESULTS.md).
pub fn prefetch_before<'g>(
    store: &BucketStore,
    i: usize,
    group: impl Fn(usize) -> Option<&'g [ValidCheck]>,
) {
    // The groups past the end answer `None`: no length is needed.
    for j in floodgate::prefetch::burst_ahead(i, usize::MAX) {
        prefetch_group(store, group(j));
    }
}

/// Starts loading the bucket of every key of `group`. All of them, not only the first: a
/// multi-check group decides every key, and with the first alone 40% of the node's samples in
/// a 3-check closed loop waited on keys 2 and 3 (bench/RESULTS.md).
fn prefetch_group(store: &BucketStore, group: Option<&[ValidCheck]>) {
    for check in group.unwrap_or_default() {
        store.prefetch(check.key, check.limit.algorithm());
    }
}

/// Validates a check batch frame into `groups` (their room reused); on refusal appends the
/// error frame and returns its code.
pub fn decode_frame_into(
    frame: &Frame,
    limits: &WireLimits,
    groups: &mut CheckGroups,
    out: &mut Vec<u8>,
) -> Result<(), ErrorCode> {
    if let Some(code) = refuse_kind(frame, out) {
        return Err(code);
    }
    decode_check_batch_into(&frame.payload, limits, groups).map_err(|(code, message)| {
        encode_error(out, frame.request_id, code, message);
        code
    })
}

/// Decides one group here (all-or-nothing when it has several checks; refunds and charges one
/// by one), appending one decision per check.
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
    if group[0].charge {
        // Charges are never denied: each is taken, into debt if need be, and answers with the
        // bucket as it now stands (denied while it owes).
        for charge in group {
            let result = store
                .charge(charge.key, &charge.limit, charge.cost, now_ns)
                .map(|charged| {
                    tally.record_charge(charge.cost, charged.forgiven);
                    charged.decision
                })
                .map_err(|_| ErrorCode::StoreFull);
            push_decision(out, tally, charge, result.as_ref().map_err(|c| *c));
        }
        return;
    }
    if let [single] = group {
        let result = if single.peek {
            Ok(store.peek(single.key, &single.limit, single.cost, now_ns))
        } else {
            store.check(single.key, &single.limit, single.cost, now_ns)
        }
        .map_err(|_| ErrorCode::StoreFull);
        push_decision(out, tally, single, result.as_ref().map_err(|c| *c));
        return;
    }
    // This thread's buffers when free (the check path), fresh ones otherwise.
    let mut decide = |checks: &mut Vec<BucketCheck>, decisions: &mut Vec<Decision>| {
        checks.clear();
        checks.extend(group.iter().map(ValidCheck::check));
        decisions.clear();
        match store.check_all(checks, now_ns, decisions) {
            Ok(_) => {
                for (check, decision) in group.iter().zip(decisions.iter()) {
                    push_decision(out, tally, check, Ok(decision));
                }
            }
            Err(_) => {
                for check in group {
                    push_decision(out, tally, check, Err(ErrorCode::StoreFull));
                }
            }
        }
    };
    GROUP_SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut scratch) => {
            let (checks, decisions) = &mut *scratch;
            decide(checks, decisions);
        }
        Err(_) => decide(&mut Vec::new(), &mut Vec::new()),
    });
}

thread_local! {
    /// A multi-check group's checks and decisions for `BucketStore::check_all`, reused (two
    /// allocations per gateway request otherwise).
    static GROUP_SCRATCH: RefCell<(Vec<BucketCheck>, Vec<Decision>)> = RefCell::default();
}

/// Counts a decided batch of `checks` checks in the node's metrics.
pub fn record_batch(metrics: &NodeMetrics, tally: &DecisionTally, checks: usize) {
    metrics.add_decisions(tally);
    metrics.batch_checks.record(checks as f64);
}

/// Records the batch's metrics and appends its decision batch frame (`decisions` are left as
/// they were, for their room to be reused).
pub fn finish_batch(
    metrics: &NodeMetrics,
    tally: &DecisionTally,
    request_id: u64,
    decisions: &mut Vec<WireDecision>,
    table_version: u64,
    out: &mut Vec<u8>,
) {
    record_batch(metrics, tally, decisions.len());
    with_scratch(|scratch| {
        encode_decisions(
            out,
            request_id,
            decisions,
            table_version,
            &mut scratch.archive,
        );
    });
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

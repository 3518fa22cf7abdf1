//! Kinds 12 and 20: a check batch with a scope per check. A batch of `region` checks only (or
//! `home` checks whose home is this node's region) is answered exactly as kind 1 (kind 10 when
//! forwarded). Otherwise every group takes the path a kind 1 group takes (`forward.rs`: the
//! deciding gate, `try_again` while its slot's hand-off is awaited, forwarding to the owner,
//! takeover once the owner is suspected), and only how a group is decided differs
//! (`reach.rs`):
//! - a group with `global` checks is decided by its owner in this region through the region
//!   exchange (the admission rule, then queued for the key's owner in every other region), and
//!   forwarded to that owner with its scopes (kind 20);
//! - a group with a `home` check of another region goes to the owner of its slot in that
//!   region (a forwarded batch, kind 10, decided there); unanswered (the region unreachable),
//!   it answers `not_owner` and the check's failure mode decides at the client.

use floodgate::region::Scope;
use floodgate::wire::{
    ArchivedScopedCheckBatch, CheckBatch, CheckGroups, ErrorCode, Frame, FrameKind,
    decode_scoped_check_batch,
};
use rkyv::rancor;

use crate::caller::Caller;
use crate::check_path::CheckPath;
use crate::service::encode_error;

/// Answers a kind 12 frame (or kind 20 from a peer) into `out`, or gives back the plain kind
/// 1 (or 10) frame it amounts to (every check `region` here), for the caller to answer as any
/// check batch.
pub(crate) async fn answer_scoped_batch(
    checks: &CheckPath,
    caller: Caller<'_>,
    frame: &Frame,
    now_ns: u64,
    out: &mut Vec<u8>,
) -> Result<Option<ErrorCode>, Frame> {
    let mut buffers = crate::forward::BatchBuffers::take();
    let mut groups = std::mem::take(&mut buffers.groups);
    let decoded = decode_scoped_check_batch(&frame.payload, &checks.limits.wire(), &mut groups);
    let refused = match decoded {
        Ok(scopes) => {
            answer_scopes(
                checks,
                caller,
                frame,
                &groups,
                &scopes,
                now_ns,
                &mut buffers,
                out,
            )
            .await
        }
        Err((code, message)) => {
            encode_error(out, frame.request_id, code, message);
            Ok(Some(code))
        }
    };
    buffers.groups = groups;
    buffers.give_back();
    refused
}

/// Answers a decoded kind 12 (or 20) frame's `groups` with their `scopes`, as
/// [`answer_scoped_batch`] says.
#[allow(clippy::too_many_arguments)]
async fn answer_scopes(
    checks: &CheckPath,
    caller: Caller<'_>,
    frame: &Frame,
    groups: &CheckGroups,
    scopes: &[Scope],
    now_ns: u64,
    buffers: &mut crate::forward::BatchBuffers,
    out: &mut Vec<u8>,
) -> Result<Option<ErrorCode>, Frame> {
    let mine = checks.members.me().region.as_str();
    let here = |scope: &Scope| match scope {
        Scope::Region => true,
        Scope::Global => false,
        Scope::Home(region) => region.as_str() == mine,
    };
    if scopes.iter().all(here) {
        return match plain_frame(frame) {
            Some(plain) => Err(plain),
            None => {
                let code = ErrorCode::MalformedPayload;
                encode_error(out, frame.request_id, code, "unreadable batch".to_owned());
                Ok(Some(code))
            }
        };
    }
    // Already validated by the decoder, so this access succeeds.
    let received = || {
        rkyv::access::<ArchivedScopedCheckBatch, rancor::Error>(&frame.payload)
            .ok()
            .map(|scoped| crate::owner_batches::Received::Archived(&scoped.batch))
    };
    Ok(crate::forward::answer_groups(
        checks, caller, frame, groups, scopes, received, now_ns, buffers, out,
    )
    .await)
}

/// The kind 1 frame inside a kind 12 one, or the kind 10 inside a kind 20 (already validated).
fn plain_frame(frame: &Frame) -> Option<Frame> {
    let scoped = rkyv::access::<ArchivedScopedCheckBatch, rancor::Error>(&frame.payload).ok()?;
    let batch: CheckBatch = rkyv::deserialize::<CheckBatch, rancor::Error>(&scoped.batch).ok()?;
    let payload = rkyv::to_bytes::<rancor::Error>(&batch).ok()?;
    let kind = if frame.kind == FrameKind::ForwardedScopedCheckBatch {
        FrameKind::ForwardedCheckBatch
    } else {
        FrameKind::CheckBatch
    };
    Some(Frame {
        version: floodgate::wire::BASE_LAYOUT,
        kind,
        request_id: frame.request_id,
        payload,
    })
}

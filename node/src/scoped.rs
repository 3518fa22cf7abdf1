//! Kind 12: a check batch with a scope per check. A batch of `region` checks only (or `home`
//! checks whose home is this node's region) is answered exactly as kind 1. Otherwise each
//! group is placed by this node's region ring: a group this node decides is decided here, its
//! `global` checks through the region exchange (the admission rule, then queued for the key's
//! owner in every other region); a group another node of the region owns answers `not_owner`
//! (a gateway routes by the slot table, so it reaches the owner; it is not forwarded); a check
//! whose home is another region answers `not_owner` too (home forwarding is not built).

use floodgate::Check;
use floodgate::cluster::ownership::{Arrival, Placement};
use floodgate::region::Scope;
use floodgate::wire::{
    ArchivedScopedCheckBatch, CheckBatch, ErrorCode, Frame, FrameKind, ValidCheck, WireDecision,
    decode_scoped_check_batch,
};
use rkyv::rancor;

use crate::metrics::DecisionTally;
use crate::service::{decide_group, encode_error, finish_batch};
use crate::state::Shared;

/// Answers a kind 12 frame into `out`, or gives back the plain kind 1 frame it amounts to (every
/// check `region` here), for the caller to answer as any check batch.
pub(crate) fn answer_scoped_batch(
    shared: &Shared,
    frame: &Frame,
    now_ns: u64,
    out: &mut Vec<u8>,
) -> Result<Option<ErrorCode>, Frame> {
    let (groups, scopes) =
        match decode_scoped_check_batch(&frame.payload, &shared.config.limits.wire()) {
            Ok(decoded) => decoded,
            Err((code, message)) => {
                encode_error(out, frame.request_id, code, message);
                return Ok(Some(code));
            }
        };
    let mine = shared.cluster.me.region.as_str();
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
    let cluster = &shared.cluster;
    let rings = cluster.region_rings();
    shared.region_sync.set_regions(rings.regions());
    let mut tally = DecisionTally::default();
    let mut decisions = Vec::with_capacity(scopes.len());
    let mut first = 0;
    // Under the deciding gate, as every decision: a table switch waits for these.
    let _deciding = cluster.deciding();
    let (placements, version) = {
        let ownership = cluster.ownership();
        let placements: Vec<Placement> = groups
            .iter()
            .map(|g| ownership.place(g.first().map_or(0, |c| c.key.slot()), Arrival::Client))
            .collect();
        (placements, ownership.table().version())
    };
    for (group, placement) in groups.iter().zip(placements) {
        let group_scopes = &scopes[first..first + group.len()];
        first += group.len();
        if group_scopes
            .iter()
            .any(|s| matches!(s, Scope::Home(_)) && !here(s))
        {
            refuse(&mut decisions, group.len(), ErrorCode::NotOwner);
            continue;
        }
        match placement {
            Placement::Decide => {}
            Placement::Refuse(_) | Placement::Forward(_) | Placement::Takeover => {
                refuse(&mut decisions, group.len(), ErrorCode::NotOwner);
                continue;
            }
        }
        let global: Vec<bool> = group_scopes.iter().map(|s| *s == Scope::Global).collect();
        if group[0].refund || !global.contains(&true) {
            // Refunds of global checks are local only (the other regions keep the units).
            decide_group(&shared.store, &mut tally, now_ns, group, &mut decisions);
            continue;
        }
        decide_global_group(shared, &rings, group, &global, &mut decisions);
    }
    finish_batch(
        &shared.metrics,
        &tally,
        frame.request_id,
        decisions,
        version,
        out,
    );
    Ok(None)
}

/// Decides a group with global checks here, all or nothing.
fn decide_global_group(
    shared: &Shared,
    rings: &crate::cluster::RegionRings,
    group: &[ValidCheck],
    global: &[bool],
    out: &mut Vec<WireDecision>,
) {
    let checks: Vec<Check> = group
        .iter()
        .map(|c| Check {
            key: c.key,
            limit: c.limit,
            cost: c.cost,
        })
        .collect();
    let others: Vec<_> = group
        .iter()
        .map(|c| rings.owners_elsewhere(c.key.slot()))
        .collect();
    match shared.region_sync.check_group(&checks, global, &others) {
        Ok(decided) => out.extend(decided.into_iter().map(WireDecision::from)),
        Err(_) => refuse(out, group.len(), ErrorCode::StoreFull),
    }
}

fn refuse(out: &mut Vec<WireDecision>, n: usize, code: ErrorCode) {
    out.extend((0..n).map(|_| WireDecision::error(code)));
}

/// The kind 1 frame inside a kind 12 one (already validated).
fn plain_frame(frame: &Frame) -> Option<Frame> {
    let scoped = rkyv::access::<ArchivedScopedCheckBatch, rancor::Error>(&frame.payload).ok()?;
    let batch: CheckBatch = rkyv::deserialize::<CheckBatch, rancor::Error>(&scoped.batch).ok()?;
    let payload = rkyv::to_bytes::<rancor::Error>(&batch).ok()?;
    Some(Frame {
        kind: FrameKind::CheckBatch,
        request_id: frame.request_id,
        payload,
    })
}

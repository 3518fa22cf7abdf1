//! Kind 12: a check batch with a scope per check. A batch of `region` checks only (or `home`
//! checks whose home is this node's region) is answered exactly as kind 1. Otherwise:
//! - a group with a `home` check of another region goes to the owner of its slot in that
//!   region (a forwarded batch, kind 10, decided there); unanswered (the region unreachable),
//!   it answers `not_owner` and the check's failure mode decides at the client;
//! - the other groups are placed by this node's region ring: a group this node decides is
//!   decided here, its `global` checks through the region exchange (the admission rule, then
//!   queued for the key's owner in every other region); a group another node of the region
//!   owns answers `not_owner` (a gateway routes by the slot table, so it reaches the owner).

use std::collections::BTreeMap;

use floodgate::Check;
use floodgate::cluster::ownership::{Arrival, Placement};
use floodgate::region::Scope;
use floodgate::wire::{
    ArchivedScopedCheckBatch, CheckBatch, ErrorCode, Frame, FrameKind, ValidCheck, WireDecision,
    decode_decisions, decode_scoped_check_batch, encode_message,
};
use rkyv::rancor;

use crate::metrics::DecisionTally;
use crate::service::{decide_group, encode_error, finish_batch};
use crate::state::Shared;

/// Answers a kind 12 frame into `out`, or gives back the plain kind 1 frame it amounts to (every
/// check `region` here), for the caller to answer as any check batch.
pub(crate) async fn answer_scoped_batch(
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
    // Per group: its decisions once known; home groups of another region wait for their home.
    let mut answered: Vec<Option<Vec<WireDecision>>> = Vec::with_capacity(groups.len());
    let mut homes: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    let version = {
        // Under the deciding gate, as every decision: a table switch waits for these.
        let _deciding = cluster.deciding();
        let ownership = cluster.ownership();
        let version = ownership.table().version();
        let mut first = 0;
        for (i, group) in groups.iter().enumerate() {
            let group_scopes = &scopes[first..first + group.len()];
            first += group.len();
            let slot = group.first().map_or(0, |c| c.key.slot());
            let home = group_scopes.iter().find_map(|s| match s {
                Scope::Home(home) if home.as_str() != mine => Some(home),
                _ => None,
            });
            if let Some(home) = home {
                // Decided by the owner in its home region (the whole group goes there).
                if let Some(owner) = rings.owner_in(home, slot) {
                    homes.entry(owner.to_owned()).or_default().push(i);
                }
                answered.push(None);
                continue;
            }
            if ownership.place(slot, Arrival::Client, now_ns, |_| false) != Placement::Decide {
                answered.push(Some(refused(group.len(), ErrorCode::NotOwner)));
                continue;
            }
            let mut decisions = Vec::with_capacity(group.len());
            let global: Vec<bool> = group_scopes.iter().map(|s| *s == Scope::Global).collect();
            if group[0].refund || !global.contains(&true) {
                // Refunds of global checks are local only (the other regions keep the units).
                decide_group(&shared.store, &mut tally, now_ns, group, &mut decisions);
            } else {
                decide_global_group(shared, &rings, group, &global, &mut decisions);
            }
            answered.push(Some(decisions));
        }
        version
    };
    if !homes.is_empty() {
        forward_home(shared, frame, &groups, homes, &mut answered).await;
    }
    // A home group no answer came for: its home region is unreachable (or has no owner), and
    // the check's failure mode decides at the client (closed: denied, `503` at a gateway).
    let decisions = groups
        .iter()
        .zip(answered)
        .flat_map(|(group, answer)| {
            answer.unwrap_or_else(|| refused(group.len(), ErrorCode::NotOwner))
        })
        .collect();
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

/// Sends each home group to its home region's owner (one forwarded batch per owner, all at
/// once) and records the answers; what is not answered stays `None`.
async fn forward_home(
    shared: &Shared,
    frame: &Frame,
    groups: &[Vec<ValidCheck>],
    homes: BTreeMap<String, Vec<usize>>,
    answered: &mut [Option<Vec<WireDecision>>],
) {
    let Ok(scoped) = rkyv::access::<ArchivedScopedCheckBatch, rancor::Error>(&frame.payload) else {
        return;
    };
    // Already validated, so it unpacks; re-encoded below, group by group (each group goes to
    // one owner, so it is moved, not copied).
    let Ok(mut sent) = scoped.batch.unpack() else {
        return;
    };
    let max = shared.config.limits.max_frame_bytes;
    let mut forwards = tokio::task::JoinSet::new();
    for (owner, indices) in homes {
        let Some(addr) = shared.cluster.addr_of(&owner) else {
            continue;
        };
        let batch = CheckBatch {
            groups: indices
                .iter()
                .filter_map(|&i| sent.groups.get_mut(i).map(std::mem::take))
                .collect(),
        };
        let mut bytes = Vec::new();
        // Request id 0: no table of this region orders the home region's tables.
        encode_message(&mut bytes, FrameKind::ForwardedCheckBatch, 0, &batch);
        let peers = shared.cluster.peers.clone();
        forwards.spawn(async move {
            let answer = peers
                .request(&addr, &bytes, max + 64, FrameKind::DecisionBatch)
                .await;
            (indices, answer)
        });
    }
    while let Some(Ok((indices, answer))) = forwards.join_next().await {
        let Ok(Ok((decisions, _))) = answer.map(|f| decode_decisions(&f.payload)) else {
            continue;
        };
        let sizes: Vec<usize> = indices.iter().map(|&i| groups[i].len()).collect();
        if decisions.len() != sizes.iter().sum::<usize>() {
            continue;
        }
        let mut rest = decisions.as_slice();
        for (&i, size) in indices.iter().zip(sizes) {
            let answer = &rest[..size];
            rest = &rest[size..];
            // `not_owner` from the home: its ring disagrees with ours for now; unanswered.
            if answer
                .first()
                .is_some_and(|d| d.to_decision() != Err(ErrorCode::NotOwner))
            {
                answered[i] = Some(answer.to_vec());
            }
        }
    }
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
        Err(_) => out.extend(refused(group.len(), ErrorCode::StoreFull)),
    }
}

fn refused(n: usize, code: ErrorCode) -> Vec<WireDecision> {
    (0..n).map(|_| WireDecision::error(code)).collect()
}

/// The kind 1 frame inside a kind 12 one (already validated).
fn plain_frame(frame: &Frame) -> Option<Frame> {
    let scoped = rkyv::access::<ArchivedScopedCheckBatch, rancor::Error>(&frame.payload).ok()?;
    let batch: CheckBatch = rkyv::deserialize::<CheckBatch, rancor::Error>(&scoped.batch).ok()?;
    let payload = rkyv::to_bytes::<rancor::Error>(&batch).ok()?;
    Some(Frame {
        version: floodgate::wire::BASE_LAYOUT,
        kind: FrameKind::CheckBatch,
        request_id: frame.request_id,
        payload,
    })
}

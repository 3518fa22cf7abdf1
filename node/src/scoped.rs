//! Kinds 12 and 20: a check batch with a scope per check. A batch of `region` checks only (or
//! `home` checks whose home is this node's region) is answered exactly as kind 1 (kind 10 when
//! forwarded). Otherwise every group takes the path a kind 1 group takes (`forward.rs`: the
//! deciding gate, `try_again` while its slot's hand-off is awaited, forwarding to the owner,
//! takeover once the owner is suspected), and only how a group is decided differs ([`Reach`]):
//! - a group with `global` checks is decided by its owner in this region through the region
//!   exchange (the admission rule, then queued for the key's owner in every other region), and
//!   forwarded to that owner with its scopes (kind 20);
//! - a group with a `home` check of another region goes to the owner of its slot in that
//!   region (a forwarded batch, kind 10, decided there); unanswered (the region unreachable),
//!   it answers `not_owner` and the check's failure mode decides at the client.

use std::collections::BTreeMap;

use floodgate::Check;
use floodgate::region::{RegionName, Scope};
use floodgate::wire::{
    ArchivedCheckBatch, ArchivedScopedCheckBatch, CheckBatch, ErrorCode, Frame, FrameKind,
    ValidCheck, WireDecision, decode_decisions, decode_scoped_check_batch, encode_message,
};
use rkyv::rancor;

use crate::cluster::RegionRings;
use crate::forward::Placed;
use crate::service::encode_error;
use crate::state::Shared;

/// How a group is decided, from its checks' scopes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reach {
    /// Every check `region` (or `home` here): by this region's owner, from its bucket.
    Region,
    /// A `global` check, in a group that is not a refund (a refund of a global check is local:
    /// the other regions keep the units): by this region's owner, through the exchange.
    Global,
    /// A `home` check of another region: the whole group, by the owner in that region.
    Home(RegionName),
}

impl Reach {
    /// How `group`, whose checks have `scopes`, is decided on a node of region `mine`.
    pub(crate) fn of(group: &[ValidCheck], scopes: &[Scope], mine: &str) -> Reach {
        let home = scopes.iter().find_map(|s| match s {
            Scope::Home(home) if home.as_str() != mine => Some(home),
            _ => None,
        });
        if let Some(home) = home {
            return Reach::Home(home.clone());
        }
        let refund = group.first().is_some_and(|c| c.refund);
        if !refund && scopes.contains(&Scope::Global) {
            Reach::Global
        } else {
            Reach::Region
        }
    }
}

/// Answers a kind 12 frame (or kind 20 from a peer) into `out`, or gives back the plain kind
/// 1 (or 10) frame it amounts to (every check `region` here), for the caller to answer as any
/// check batch. `try_again`: the caller knows that answer.
pub(crate) async fn answer_scoped_batch(
    shared: &Shared,
    try_again: bool,
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
    // Already validated by the decoder, so this access succeeds.
    let archived = || {
        rkyv::access::<ArchivedScopedCheckBatch, rancor::Error>(&frame.payload)
            .ok()
            .map(|scoped| &scoped.batch)
    };
    Ok(crate::forward::answer_groups(
        shared, try_again, frame, &groups, &scopes, archived, now_ns, out,
    )
    .await)
}

/// Sends each `Home` group to its home region's owner (one forwarded batch per owner, all at
/// once) and records the answers; a group no answer came for stays `Home`.
pub(crate) async fn forward_home(
    shared: &Shared,
    archived: Option<&ArchivedCheckBatch>,
    reach: &[Reach],
    groups: &[Vec<ValidCheck>],
    placed: &mut [Placed],
) {
    let rings = shared.cluster.region_rings();
    let mut homes: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, place) in placed.iter().enumerate() {
        if let (Placed::Home, Some(Reach::Home(home))) = (place, reach.get(i)) {
            let slot = groups[i].first().map_or(0, |c| c.key.slot());
            if let Some(owner) = rings.owner_in(home, slot) {
                homes.entry(owner.to_owned()).or_default().push(i);
            }
        }
    }
    if homes.is_empty() {
        return;
    }
    // Already validated, so it unpacks; re-encoded below, group by group (each group goes to
    // one owner, so it is moved, not copied).
    let Some(Ok(mut sent)) = archived.map(ArchivedCheckBatch::unpack) else {
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
                placed[i] = Placed::Answered(answer.to_vec());
            }
        }
    }
}

/// Decides a group with global checks here, all or nothing.
pub(crate) fn decide_global_group(
    shared: &Shared,
    rings: &RegionRings,
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

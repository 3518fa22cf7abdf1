//! How a group of a scoped batch (kinds 12 and 20) is decided, by its checks' scopes: from the
//! bucket alone (`region`), through the region exchange (`global`), or by the owner in its home
//! region (`home` of another region). Where it is decided is `forward.rs`'s placement, as for
//! any group.

use std::collections::BTreeMap;

use floodgate::region::{Peer, RegionName, Scope};
use floodgate::wire::{
    CheckGroups, ErrorCode, FrameKind, ValidCheck, WireDecision, encode_message,
};
use floodgate::{BucketCheck, EpochClock};

use crate::check_path::CheckPath;
use crate::cluster::{PEER_TIMEOUT, RegionRings};
use crate::owner_batches;
use crate::region_sync::GlobalChecks;

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

/// Sends the groups `wanted` (indices of `Home` groups) to their home region's owner (one
/// forwarded batch per owner, all at once); returns the answers that came, by group index
/// (a group no answer came for is left out).
pub(crate) async fn forward_home(
    checks: &CheckPath,
    received: Option<owner_batches::Received<'_>>,
    reach: &[Reach],
    groups: &CheckGroups,
    wanted: &[usize],
) -> Vec<(usize, Vec<WireDecision>)> {
    let rings = checks.regions.rings();
    let mut homes: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for &i in wanted {
        if let Some(Reach::Home(home)) = reach.get(i) {
            let slot = groups[i].first().map_or(0, |c| c.key.slot());
            if let Some(owner) = rings.owner_in(home, slot) {
                homes.entry(owner.to_owned()).or_default().push(i);
            }
        }
    }
    if homes.is_empty() {
        return Vec::new();
    }
    let batches = owner_batches::batches(received, homes, |_, batch| {
        let mut frame = Vec::new();
        // Request id 0: no table of this region orders the home region's tables.
        encode_message(&mut frame, FrameKind::ForwardedCheckBatch, 0, &batch);
        (owner_batches::Outgoing::Frame(frame), PEER_TIMEOUT)
    });
    owner_batches::send(checks, batches, groups)
        .await
        .into_iter()
        // `not_owner` from the home: its ring disagrees with ours for now; unanswered.
        .filter(|a| {
            a.decisions
                .first()
                .is_some_and(|d| d.to_decision() != Err(ErrorCode::NotOwner))
        })
        .map(|a| (a.group, a.decisions))
        .collect()
}

/// Decides a group with global checks here, all or nothing (a group of charges: each taken).
/// `global` says which are global (one per check; of a group of one, true).
pub(crate) fn decide_global_group(
    region_sync: &mut GlobalChecks<'_, EpochClock>,
    rings: &RegionRings,
    group: &[ValidCheck],
    global: &[bool],
    out: &mut Vec<WireDecision>,
) {
    if let [check] = group {
        // The usual group, one check: its lists on the stack, not three allocations a check.
        let others = [rings.owners_elsewhere(check.key.slot())];
        decide_with(region_sync, group, &[check.check()], global, &others, out);
        return;
    }
    let checks: Vec<BucketCheck> = group.iter().map(ValidCheck::check).collect();
    let others: Vec<&[Peer]> = group
        .iter()
        .map(|c| rings.owners_elsewhere(c.key.slot()))
        .collect();
    decide_with(region_sync, group, &checks, global, &others, out);
}

/// [`decide_global_group`] with the group's store checks and each one's owners elsewhere.
fn decide_with(
    region_sync: &mut GlobalChecks<'_, EpochClock>,
    group: &[ValidCheck],
    checks: &[BucketCheck],
    global: &[bool],
    others: &[&[Peer]],
    out: &mut Vec<WireDecision>,
) {
    if group[0].charge {
        let charged = region_sync.charge_group(checks, global, others);
        out.extend(charged.into_iter().map(|charged| match charged {
            Ok(charged) => WireDecision::from(charged.decision),
            Err(_) => WireDecision::error(ErrorCode::StoreFull),
        }));
        return;
    }
    if region_sync
        .check_group(checks, global, others, out)
        .is_err()
    {
        out.extend(refused(group.len(), ErrorCode::StoreFull));
    }
}

fn refused(n: usize, code: ErrorCode) -> Vec<WireDecision> {
    (0..n).map(|_| WireDecision::error(code)).collect()
}

//! `scope: global` buckets on the node (`--rlqs-global-domain`): the limit a global bucket's
//! Envoys split here (this region's part, see `regions`), the claims sent every second to each
//! bucket's owner in the deciding region, the parts it answers, and, on that owner, the answers.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use floodgate::cluster::slot_of;
use floodgate::protocol::Feature;
use floodgate::region::RegionName;
use floodgate::wire::{
    ErrorCode, Frame, FrameKind, RlqsRegionClaims, RlqsRegionParts, WireRegionClaim,
    WireRegionPart, decode_rlqs_region_claims, decode_rlqs_region_parts, encode_message,
};
use metrics::counter;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::regions::{RegionClaim, RegionShare, floor};
use super::remote::{Stamped, key_of_wire, slot_key, wire_bucket};
use super::service::Hub;
use super::shares::{BucketKey, Limit};

/// Whether global buckets are split among regions now.
enum Split {
    /// One region (or no cluster): a global bucket is an ordinary one.
    Off,
    /// A member does not speak version 8: each region splits the whole limit.
    OldMembers,
    /// The regions the membership knows, sorted, this node's among them; the first decides.
    On(Vec<String>),
}

/// One round's claims: to each deciding owner, and those this node decides itself.
#[derive(Debug, Default)]
pub(crate) struct Round {
    pub(crate) asked_ns: u64,
    pub(crate) by_node: BTreeMap<String, Vec<WireRegionClaim>>,
    pub(crate) here: Vec<WireRegionClaim>,
}

impl Hub {
    fn split(&self) -> Split {
        let Some(cluster) = &self.cluster else {
            return Split::Off;
        };
        let rings = cluster.regions.rings();
        let mut known: Vec<String> = rings.names().map(|r| r.as_str().to_owned()).collect();
        if known.is_empty() {
            return Split::Off;
        }
        if !Feature::RlqsGlobal.readable_at(cluster.members.cluster_version()) {
            return Split::OldMembers;
        }
        known.push(cluster.members.me().region.clone());
        known.sort_unstable();
        known.dedup();
        Split::On(known)
    }

    /// The limit `key`'s Envoys split here: the whole `limit`, or for a global bucket this
    /// region's part of it (its floor until the deciding owner says more).
    pub(super) fn regional_limit(&self, now_ns: u64, key: &BucketKey, limit: Limit) -> Limit {
        if !self.global.domains.contains(&key.domain) {
            return limit;
        }
        let known = match self.split() {
            Split::Off => return limit,
            Split::OldMembers => {
                counter!("floodgate_rlqs_global_unsplit_total").increment(1);
                if !self.global.warned_old.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        domain = %key.domain,
                        "a member speaks a protocol version below 8: each region shares the \
                         whole limit of a global RLQS bucket among its own Envoys (further \
                         ones are counted, not logged)"
                    );
                }
                return limit;
            }
            Split::On(known) => known,
        };
        let mut parts = self.global.parts.lock();
        let part = match parts.get_mut(key) {
            Some(share) => {
                share.limit = limit.requests;
                share.period_s = limit.period_s;
                share.part(now_ns, self.ttl_ns(), known.len())
            }
            None => {
                if parts.len() < self.global.max_buckets {
                    parts.insert(
                        key.clone(),
                        RegionShare::new(limit.requests, limit.period_s),
                    );
                }
                floor(limit.requests, known.len())
            }
        };
        Limit {
            requests: part.min(limit.requests),
            period_s: limit.period_s,
        }
    }

    /// This second's claims of the global buckets this node computes shares of; each
    /// bucket's part is applied again first (a part held past its time falls to the floor).
    pub(crate) fn claims(&self) -> Round {
        let now = self.now_ns();
        let Split::On(known) = self.split() else {
            self.global.parts.lock().clear();
            return Round::default();
        };
        self.global.splits.lock().expire(now);
        let Some(cluster) = &self.cluster else {
            return Round::default();
        };
        let decider = &known[0];
        let decider_name = RegionName::new(decider).ok();
        let rings = cluster.regions.rings();
        let mut round = Round {
            asked_ns: now,
            ..Round::default()
        };
        let mut pushes = Vec::new();
        {
            let mut parts = self.global.parts.lock();
            let mut shares = self.shares.lock();
            parts.retain(|key, _| shares.envoys(key) > 0);
            for (key, share) in parts.iter() {
                let part = share.part(now, self.ttl_ns(), known.len()).min(share.limit);
                let limit = Limit {
                    requests: part,
                    period_s: share.period_s,
                };
                let moved = shares.set_limit(now, key, limit);
                if !moved.is_empty() {
                    let seq = self.next_seq();
                    pushes.extend(moved.into_iter().map(|push| Stamped { seq, push }));
                }
                let claim = WireRegionClaim {
                    bucket: wire_bucket(key),
                    requests: share.limit,
                    period_s: share.period_s,
                    demand: shares.demand(key),
                    claim: part.max(shares.committed(key)),
                };
                if *decider == cluster.members.me().region {
                    round.here.push(claim);
                    continue;
                }
                let slot = slot_of(&slot_key(key));
                match decider_name.as_ref().and_then(|r| rings.owner_in(r, slot)) {
                    Some(owner) => round
                        .by_node
                        .entry(owner.to_owned())
                        .or_default()
                        .push(claim),
                    None => counter!("floodgate_rlqs_region_failures_total").increment(1),
                }
            }
        }
        let elsewhere = self.send(None, pushes);
        self.push_to_nodes(elsewhere);
        round
    }

    /// As the deciding owner: `region`'s claims answered with its parts (a bucket past the
    /// bound is left out: that region keeps its floor).
    pub(crate) fn decide(&self, region: &str, claims: Vec<WireRegionClaim>) -> Vec<WireRegionPart> {
        let Split::On(known) = self.split() else {
            return Vec::new();
        };
        counter!("floodgate_rlqs_region_claims_total", "direction" => "received")
            .increment(claims.len() as u64);
        let now = self.now_ns();
        let mut splits = self.global.splits.lock();
        claims
            .into_iter()
            .filter_map(|c| {
                let key = key_of_wire(&c.bucket);
                let word = RegionClaim {
                    demand: c.demand,
                    claim: c.claim,
                };
                let part = splits.report(now, &key, c.requests, &known, region, word)?;
                Some(WireRegionPart {
                    bucket: c.bucket,
                    part,
                })
            })
            .collect()
    }

    /// The deciding owner's parts, in answer to claims sent at `asked_ns`: each bucket's
    /// Envoys are rebalanced to its new part at once.
    pub(crate) fn take_parts(&self, asked_ns: u64, given: Vec<WireRegionPart>) {
        let Split::On(known) = self.split() else {
            return;
        };
        let now = self.now_ns();
        let mut pushes = Vec::new();
        {
            let mut parts = self.global.parts.lock();
            let mut shares = self.shares.lock();
            for given in given {
                let key = key_of_wire(&given.bucket);
                let Some(share) = parts.get_mut(&key) else {
                    continue;
                };
                share.give(asked_ns, given.part.min(share.limit));
                let limit = Limit {
                    requests: share.part(now, self.ttl_ns(), known.len()),
                    period_s: share.period_s,
                };
                let moved = shares.set_limit(now, &key, limit);
                if !moved.is_empty() {
                    let seq = self.next_seq();
                    pushes.extend(moved.into_iter().map(|push| Stamped { seq, push }));
                }
            }
        }
        let elsewhere = self.send(None, pushes);
        self.push_to_nodes(elsewhere);
    }
}

/// Every second until shutdown: the claims of this node's global buckets to their deciding
/// owners (one message per owner, more for many buckets), their parts applied as they come.
/// A round waits for its answers (at most the relay timeout) before the next starts.
pub(super) async fn exchange_parts(
    hub: Arc<Hub>,
    max_frame_bytes: usize,
    mut shutdown: watch::Receiver<bool>,
) {
    let Some(cluster) = hub.cluster.clone() else {
        return;
    };
    let mut tick = tokio::time::interval(super::EXPIRE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.wait_for(|stopping| *stopping) => return,
        }
        let round = hub.claims();
        if !round.here.is_empty() {
            let parts = hub.decide(&cluster.members.me().region, round.here);
            hub.take_parts(round.asked_ns, parts);
        }
        let mut sends = JoinSet::new();
        for (owner, claims) in round.by_node {
            let Some(addr) = cluster.members.addr_of(&owner) else {
                counter!("floodgate_rlqs_region_failures_total").increment(claims.len() as u64);
                continue;
            };
            for claims in in_messages(claims, max_frame_bytes / 2) {
                counter!("floodgate_rlqs_region_claims_total", "direction" => "sent")
                    .increment(claims.len() as u64);
                let count = claims.len() as u64;
                let message = RlqsRegionClaims {
                    from: cluster.members.me().id.clone(),
                    region: cluster.members.me().region.clone(),
                    claims,
                };
                let mut frame = Vec::new();
                encode_message(&mut frame, FrameKind::RlqsRegionClaims, 0, &message);
                let (peers, addr, owner) = (cluster.peers.clone(), addr.clone(), owner.clone());
                sends.spawn(async move {
                    let answer = peers
                        .request_within(
                            super::relay::RELAY_TIMEOUT,
                            &addr,
                            &frame,
                            max_frame_bytes + 64,
                            FrameKind::RlqsRegionParts,
                        )
                        .await;
                    (owner, count, answer)
                });
            }
        }
        while let Some(Ok((owner, count, answer))) = sends.join_next().await {
            match answer.map(|frame| decode_rlqs_region_parts(&frame.payload)) {
                Ok(Ok(parts)) if parts.from == owner => hub.take_parts(round.asked_ns, parts.parts),
                Ok(Ok(_)) => {
                    counter!("floodgate_rlqs_region_failures_total").increment(count);
                    tracing::warn!(%owner, "RLQS region parts answered in another node's name");
                }
                Ok(Err((code, why))) => {
                    counter!("floodgate_rlqs_region_failures_total").increment(count);
                    tracing::warn!(%owner, %code, "RLQS region parts were refused: {why}");
                }
                Err(e) => {
                    // The region keeps its part for the hold time, then its floor.
                    counter!("floodgate_rlqs_region_failures_total").increment(count);
                    tracing::debug!(%owner, error = %e, "RLQS region claims got no answer");
                }
            }
        }
    }
}

/// `claims` cut into messages of at most [`floodgate::wire::MAX_WIRE_RLQS_ITEMS`] claims and
/// about `max_bytes` each (each claim counted as its strings plus 64 bytes).
fn in_messages(claims: Vec<WireRegionClaim>, max_bytes: usize) -> Vec<Vec<WireRegionClaim>> {
    let size = |c: &WireRegionClaim| {
        64 + c.bucket.domain.len()
            + c.bucket
                .entries
                .iter()
                .map(|e| e.key.len() + e.value.len() + 16)
                .sum::<usize>()
    };
    let mut messages: Vec<Vec<WireRegionClaim>> = Vec::new();
    let mut bytes = 0;
    for claim in claims {
        let n = size(&claim);
        match messages.last_mut() {
            Some(last)
                if last.len() < floodgate::wire::MAX_WIRE_RLQS_ITEMS && bytes + n <= max_bytes =>
            {
                bytes += n;
                last.push(claim);
            }
            _ => {
                bytes = n;
                messages.push(vec![claim]);
            }
        }
    }
    messages
}

/// Kind 23: another region's claims for global buckets this node decides, answered with
/// their parts (kind 24). A peer speaks only as itself, from the region the membership knows
/// it in.
pub(crate) fn answer_region_claims(
    hub: &Hub,
    me: &str,
    certified: impl Fn(&str) -> bool,
    region_of: impl Fn(&str) -> Option<String>,
    frame: &Frame,
    out: &mut Vec<u8>,
) -> Option<ErrorCode> {
    let (code, message) = match decode_rlqs_region_claims(&frame.payload) {
        Ok(claims)
            if certified(&claims.from)
                && region_of(&claims.from).as_deref() == Some(claims.region.as_str()) =>
        {
            let parts = RlqsRegionParts {
                from: me.to_owned(),
                parts: hub.decide(&claims.region, claims.claims),
            };
            encode_message(out, FrameKind::RlqsRegionParts, frame.request_id, &parts);
            return None;
        }
        Ok(claims) => (
            ErrorCode::Forbidden,
            format!(
                "RLQS region claims from `{}` of region `{}`: the connection's certificate names                  another node, or the membership knows it in another region",
                claims.from, claims.region
            ),
        ),
        Err(refusal) => refusal,
    };
    crate::service::encode_error(out, frame.request_id, code, message);
    Some(code)
}

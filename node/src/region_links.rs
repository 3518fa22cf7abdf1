//! [`PeerLinks`]: the region exchange's frames to the owners in other regions, each on its own
//! unidirectional stream over the node's peer connections (best effort: the exchange sends
//! again what is not acknowledged), and [`follow_rings`]: destinations that left their ring
//! are dropped, and the exchange's metrics per peer region are published.

use std::sync::Arc;

use floodgate::BucketKey;
use floodgate::Clock;
use floodgate::EpochClock;
use floodgate::region::{Outgoing, Peer, RegionName};

use tokio::sync::watch;

use crate::cluster::{Members, OtherRegions, Peers, SlotOwnership};
use crate::region_sync::{RegionLinks, RegionSync, encode_region_frame};

/// How often the exchange's per-region metrics are published.
const METRICS_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

pub(crate) struct PeerLinks {
    /// Where the owners are.
    pub(crate) members: Arc<Members>,
    pub(crate) peers: Arc<Peers>,
}

impl RegionLinks for PeerLinks {
    fn send(&self, to: &Peer, message: Outgoing) {
        // A peer the membership no longer knows: dropped, sent again once its region's ring
        // names an owner the membership knows.
        let Some(addr) = self.members.addr_of(&to.node) else {
            return;
        };
        let kind = match message {
            Outgoing::Deltas(_) => "deltas",
            Outgoing::Ack(_) => "ack",
        };
        metrics::counter!(
            "floodgate_region_frames_sent_total",
            "region" => to.region.as_str().to_owned(),
            "kind" => kind,
        )
        .increment(1);
        // Encoded for the version the connection to the peer agreed on: version 4's layout
        // only to a peer that reads it.
        drop(
            self.peers
                .send_with(addr, move |version| encode_region_frame(version, &message)),
        );
    }
}

/// Until shutdown: when the owners change, drops the destinations whose region's ring goes on
/// without them, their unconfirmed units queued for each key's new owner there (lost only when
/// none is in sight; a region with no owner in sight at all keeps its deltas waiting), and every second forgets the inboxes of senders idle past
/// the exchange's `inbox_idle_ns` (every restarted node in another region is a new sender) and
/// publishes per peer region: keys with deltas waiting, unconfirmed units, retransmissions, the
/// delta lag.
pub(crate) async fn follow_rings(
    region_sync: Arc<RegionSync<EpochClock>>,
    slots: Arc<SlotOwnership>,
    regions: Arc<OtherRegions>,
    clock: EpochClock,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut tables = slots.watch_table();
    let mut ticker = tokio::time::interval(METRICS_INTERVAL);
    loop {
        tokio::select! {
            changed = tables.changed() => {
                if changed.is_err() {
                    return;
                }
                let rings = regions.rings();
                let new_owner = |region: &RegionName, key: BucketKey| {
                    let owner = rings.owner_in(region, key.slot())?;
                    Some(Peer::new(region.clone(), owner))
                };
                let (moved, lost) =
                    region_sync.forget_gone(|peer| rings.keeps(peer), &new_owner);
                if moved > 0 {
                    tracing::info!(units = moved, "region deltas of owners that left their ring go to the keys' new owners");
                    metrics::counter!("floodgate_region_units_rerouted_total").increment(moved);
                }
                if lost > 0 {
                    tracing::info!(units = lost, "dropped region deltas of owners that left their ring (no new owner in sight)");
                    metrics::counter!("floodgate_region_units_dropped_total").increment(lost);
                }
                follow_ownership(&region_sync, &slots, clock);
            }
            _ = ticker.tick() => {
                region_sync.evict_idle_inboxes();
                region_sync.prune_inherited();
                publish(&region_sync);
            }
            _ = shutdown.changed() => return,
        }
    }
}

/// This region's table changed: remote units held or passed on follow the keys' new owners.
fn follow_ownership(
    region_sync: &RegionSync<EpochClock>,
    slots: &SlotOwnership,
    clock: EpochClock,
) {
    let me = region_sync.me();
    let _deciding = slots.deciding();
    let route = slots.delta_router(me.region.clone(), clock.now_ns());
    let still_member = |peer: &Peer| slots.owns_slots(peer);
    let passed = region_sync.follow_ownership(&route, &still_member);
    if passed > 0 {
        tracing::debug!(
            units = passed,
            "passed held region units on to their keys' new owners"
        );
    }
}

fn publish(region_sync: &RegionSync<EpochClock>) {
    let mut per_region: std::collections::BTreeMap<String, (usize, u64, u64, u64)> =
        Default::default();
    for d in region_sync.destinations() {
        let entry = per_region
            .entry(d.peer.region.as_str().to_owned())
            .or_default();
        entry.0 += d.pending_keys;
        entry.1 += d.unconfirmed_units;
        entry.2 += d.retransmissions;
        entry.3 = entry.3.max(d.lag_ns);
    }
    for (region, (keys, units, retransmissions, lag_ns)) in per_region {
        metrics::gauge!("floodgate_region_pending_keys", "region" => region.clone())
            .set(keys as f64);
        metrics::gauge!("floodgate_region_unconfirmed_units", "region" => region.clone())
            .set(units as f64);
        metrics::gauge!("floodgate_region_retransmissions", "region" => region.clone())
            .set(retransmissions as f64);
        metrics::gauge!("floodgate_region_delta_lag_seconds", "region" => region)
            .set(lag_ns as f64 / 1e9);
    }
    let stats = region_sync.stats();
    metrics::gauge!("floodgate_region_denied_by_share").set(stats.denied_by_share as f64);
    metrics::gauge!("floodgate_region_refused_outbox_full").set(stats.refused_outbox_full as f64);
    metrics::gauge!("floodgate_region_applied_messages").set(stats.applied_messages as f64);
    metrics::gauge!("floodgate_region_refused_messages").set(stats.refused_messages as f64);
    metrics::gauge!("floodgate_region_passed_on_units").set(stats.passed_on_units as f64);
    metrics::gauge!("floodgate_region_held_units").set(stats.held_units as f64);
    metrics::gauge!("floodgate_region_inherited_units").set(stats.inherited_units as f64);
    metrics::gauge!("floodgate_region_inherited_units_dropped")
        .set(stats.inherited_units_dropped as f64);
}
